"""Tables: a gather-heavy spline evaluation and its gradient by the coefficient table, against
jax.jit of the same model written with jnp.take (and hand-written NumPy), in one process.

    python bench/bench_vocabulary_tables.py            # n = 1e5 and 1e6; --quick: fewer repeats

The model is the uniform cubic B-spline of docs/tables.md on K = 1024 coefficients: four gathers per
sample. Rows (median time ratios over interleaved repeats):
    eval      hawk kernel on NumPy arrays / jax.jit(model)         (and / hand-written NumPy)
    eval jax  hawk kernel on jax.Arrays (the JAX emitter, jitted) / jax.jit(model)
    grad      eagle.value_and_grad(mean squared error) / jax.jit(jax.value_and_grad(...))
              (and / the same by hand in NumPy, np.bincount as each gather's transpose)
"""
import sys

import numpy as np

import jax

jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402

import eagle_fx as eagle  # noqa: E402
import hawk_fx as hawk  # noqa: E402
from hawk_fx import Scalar, Table  # noqa: E402
from hawk_fx import math as hm  # noqa: E402
from timing import median_ratio  # noqa: E402

K = 1024


def _weights(u, cube):
    return ((1.0 - u) * (1.0 - u) * (1.0 - u) / 6.0, (3.0 * cube - 6.0 * u * u + 4.0) / 6.0,
            (-3.0 * cube + 3.0 * u * u + 3.0 * u + 1.0) / 6.0, cube / 6.0)


@hawk.kernel
def spline(c: Table, x: Scalar):
    k = hm.int32(hm.floor(x))
    u = x - hm.floor(x)
    b0, b1, b2, b3 = _weights(u, u * u * u)
    return b0 * c[k] + b1 * c[k + 1] + b2 * c[k + 2] + b3 * c[k + 3]


@hawk.kernel
def spline_loss(c: Table, x: Scalar, y: Scalar):
    k = hm.int32(hm.floor(x))
    u = x - hm.floor(x)
    b0, b1, b2, b3 = _weights(u, u * u * u)
    f = b0 * c[k] + b1 * c[k + 1] + b2 * c[k + 2] + b3 * c[k + 3]
    return hawk.mean((f - y) ** 2)


@eagle.Graph.builder
def fit(c, x, y):
    g = eagle.Graph()
    g.result = spline_loss(c, x, y)
    return g


def jax_model(c, x):
    k = jnp.floor(x).astype(jnp.int32)
    u = x - jnp.floor(x)
    w = _weights(u, u * u * u)
    return sum(wm * c.at[k + m].get(mode="clip") for m, wm in enumerate(w))


def jax_loss(c, x, y):
    return jnp.mean((jax_model(c, x) - y) ** 2)


def numpy_model(c, x):
    k = np.floor(x).astype(np.int32)
    u = x - k
    w = _weights(u, u * u * u)
    return sum(wm * np.take(c, k + m, mode="clip") for m, wm in enumerate(w))


def numpy_value_and_grad(c, x, y):
    """The loss and its gradient by c, by hand: the transpose of each gather is a bincount."""
    k = np.floor(x).astype(np.int32)
    u = x - k
    w = _weights(u, u * u * u)
    r = sum(wm * np.take(c, k + m, mode="clip") for m, wm in enumerate(w)) - y
    df = (2.0 / x.size) * r
    grad = sum(np.bincount(k + m, weights=wm * df, minlength=c.size) for m, wm in enumerate(w))
    return np.mean(r * r), grad


def main(quick=False):
    repeat = 3 if quick else 7
    rng = np.random.default_rng(0)
    print(f"cubic B-spline on K = {K} coefficients (4 gathers per sample); ratios of median times")
    print(f"{'n':>9} {'eval/jit':>9} {'eval/numpy':>11} {'eval jax/jit':>13} {'grad/jit':>9} {'grad/numpy':>11}")
    for n in (100_000, 1_000_000):
        c = rng.normal(size=(K, 1))
        x = rng.uniform(0.0, K - 3.0, n)
        y = rng.normal(size=n)
        cj, xj, yj = jnp.asarray(c[:, 0]), jnp.asarray(x), jnp.asarray(y)
        ct, xt = jnp.asarray(c), jnp.asarray(x)
        model = jax.jit(jax_model)
        vg = jax.jit(jax.value_and_grad(jax_loss))
        step = eagle.value_and_grad(fit)
        assert np.allclose(spline(c, x), np.asarray(model(cj, xj)), rtol=1e-12, atol=1e-12)
        got_l, got_g = step(c, x, y)
        want_l, want_g = vg(cj, xj, yj)
        assert np.allclose(got_l[0], float(want_l), rtol=1e-12)
        assert np.allclose(got_g[:, 0], np.asarray(want_g), rtol=1e-9, atol=1e-15)
        number = 10 if n <= 100_000 else 2
        r_eval = median_ratio(lambda: spline(c, x), lambda: model(cj, xj).block_until_ready(), number, repeat)
        r_np = median_ratio(lambda: spline(c, x), lambda: numpy_model(c[:, 0], x), number, repeat)
        r_jax = median_ratio(lambda: spline(ct, xt).block_until_ready(), lambda: model(cj, xj).block_until_ready(),
                             number, repeat)
        assert np.allclose(numpy_value_and_grad(c[:, 0], x, y)[1], got_g[:, 0], rtol=1e-9, atol=1e-15)
        r_grad = median_ratio(lambda: step(c, x, y), lambda: vg(cj, xj, yj)[1].block_until_ready(), number, repeat)
        r_gnp = median_ratio(lambda: step(c, x, y), lambda: numpy_value_and_grad(c[:, 0], x, y), number, repeat)
        print(f"{n:>9} {r_eval:>9.2f} {r_np:>11.2f} {r_jax:>13.2f} {r_grad:>9.2f} {r_gnp:>11.2f}")


if __name__ == "__main__":
    main(quick="--quick" in sys.argv)
