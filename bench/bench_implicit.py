"""eagle_fx.fixed_point's implicit gradient against the gradient through the loop as run, and
against jax.lax.custom_root, in one process.

    python bench/bench_implicit.py            # n = 1e5 samples; --quick: n = 1e4, fewer repeats

The workload: Kepler's equation E = M + e sin E per sample, solved by fixed-point iteration
(e = 0.9: a slow contraction, ~200-300 turns to 1e-12), and the gradient of sum(E) with
respect to M and e. Prints, on the NumPy backend, the median time of a replay and the peak host
memory (tracemalloc: building a fresh graph and its first run) of
  * the implicit gradient (eagle_fx.fixed_point: a forward loop, then a Neumann series per
    sample; nothing stored per turn) and
  * the unrolled gradient (eagle_fx.grad through the same iteration run by eagle_fx.simulate:
    every turn stored);
and the implicit gradient on the JAX backend against jax.jit(jax.grad) of a vmapped
jax.lax.custom_root with the same iteration (a lax.while_loop) and a scalar tangent solve.
"""
import sys
import tracemalloc

import numpy as np

import jax

jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402

import eagle_fx as eagle  # noqa: E402
import hawk_fx as hawk  # noqa: E402
import hawk_fx.math as hm  # noqa: E402
from eagle_fx.backends.select import use_backend  # noqa: E402
from hawk_fx import Mutable, Param, Scalar, Terminated  # noqa: E402
from timing import median_ratio  # noqa: E402

TOL, CAP, ECC = 1e-12, 400, 0.9


@hawk.kernel
def kepler(E: Scalar, M: Scalar, e: Param):
    return M + e * hm.sin(E)


@hawk.kernel
def kepler_turn(E: Mutable[Scalar], done: Terminated, M: Scalar, e: Param):
    F = M + e * hm.sin(E)
    done = hm.abs(F - E) <= 1e-12
    E = F


@hawk.kernel
def total(x: Scalar) -> Scalar:
    return hawk.sum(x)


@eagle.Graph.builder
def implicit(M, e):
    g = eagle.Graph()
    g.result = total(eagle.fixed_point(kepler, M, M, e, tol=TOL, max_steps=CAP))
    return g


@eagle.Graph.builder
def unrolled(M, e):
    g = eagle.Graph()
    r = eagle.simulate(lambda s, done: kepler_turn(s, done, M, e), M, max_steps=CAP)
    g.result = total(r.state)
    return g


def jax_grad():
    def one(M, e):
        def residual(E):
            return M + e * jnp.sin(E) - E

        def solve(_, E):
            def body(c):
                E, _, k = c
                F = M + e * jnp.sin(E)
                return F, jnp.abs(F - E), k + 1
            return jax.lax.while_loop(lambda c: (c[1] > TOL) & (c[2] < CAP), body, (E, jnp.inf, 0))[0]
        return jax.lax.custom_root(residual, M, solve, lambda g, y: y / g(1.0))

    def loss(M, e):
        return jnp.sum(jax.vmap(one, in_axes=(0, None))(M, e))
    return jax.jit(jax.grad(loss, argnums=(0, 1)))


def first_run_peak(make):
    """Peak host memory of building a fresh graph and running it once (its buffers, the stacks
    its first run grows)."""
    tracemalloc.start()
    try:
        make()()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def main():
    quick = "--quick" in sys.argv
    n = 10_000 if quick else 100_000
    number, repeat = (1, 3) if quick else (1, 5)
    rng = np.random.default_rng(0)
    M, e = rng.uniform(0.0, 2 * np.pi, n), np.array([ECC])

    gi = eagle.grad(implicit, argnums=(0, 1)).graph(M, e)
    gu = eagle.grad(unrolled, argnums=(0, 1)).graph(M, e)
    (im, ie), (um, ue) = gi(), gu()
    jm, je = (np.asarray(a) for a in jax_grad()(M, ECC))
    E = eagle.fixed_point(kepler, M, M, e, tol=TOL, max_steps=CAP)
    exact = 1 / (1 - ECC * np.cos(E))
    print(f"n = {n}, Kepler e = {ECC}: dE/dM max relative error, implicit {np.max(np.abs(im / exact - 1)):.1e}, "
          f"unrolled {np.max(np.abs(um / exact - 1)):.1e}, jax custom_root {np.max(np.abs(jm / exact - 1)):.1e}; "
          f"d sum(E)/de implicit {ie[0]:.10g}, unrolled {ue[0]:.10g}, jax {float(je):.10g}")
    r = median_ratio(gi, gu, number, repeat)
    pi = first_run_peak(lambda: eagle.grad(implicit, argnums=(0, 1)).graph(M, e))
    pu = first_run_peak(lambda: eagle.grad(unrolled, argnums=(0, 1)).graph(M, e))
    print(f"numpy backend: implicit / unrolled gradient time {r:.2f}; peak memory implicit {pi / 2**20:.1f} MiB, "
          f"unrolled {pu / 2**20:.1f} MiB (ratio {pi / pu:.3f})")

    with use_backend("jax"):
        gj = eagle.grad(implicit, argnums=(0, 1)).graph(M, e)
    out = gj()
    assert np.allclose(np.asarray(out[0]), jm, rtol=1e-9)
    jg, Mj = jax_grad(), jnp.asarray(M)
    r = median_ratio(lambda: jax.block_until_ready(gj()), lambda: jax.block_until_ready(jg(Mj, ECC)), number, repeat)
    print(f"jax backend (NumPy arrays in and out): implicit gradient / jax.jit(grad(custom_root)) = {r:.2f}")


if __name__ == "__main__":
    main()
