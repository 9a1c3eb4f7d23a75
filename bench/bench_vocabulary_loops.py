"""Per-sample Newton for sqrt(a) at 1e6 samples: a kernel loop that stops per sample.

    python bench/bench_vocabulary_loops.py            # n = 1e6
    python bench/bench_vocabulary_loops.py --quick    # fewer repeats

1. NumPy backend: the kernel called on a NumPy array, against a hand-written vectorised NumPy
   masked loop (every sample updated each turn under a mask, `np.where`, until none is active).
2. JAX: the kernel called on a jax.Array (a jitted lax.while_loop over the planes), against
   `jax.jit(jax.vmap(f))` where f is one sample's `lax.while_loop` (skipped without JAX).
3. Reverse mode: the kernel's gradient (hawk_fx.diff.vjp: a loop run backwards per sample)
   against one forward call, as a cost ratio (no target).
The inputs spread over 24 orders of magnitude, so samples leave after 4 to 40 turns. Every figure
is a ratio of medians of interleaved timeit repeats taken in one process.
"""
import sys

import numpy as np

import hawk_fx as hawk
import hawk_fx.diff as hd
from hawk_fx import Scalar
from timing import median_ratio

QUICK = "--quick" in sys.argv
REPEAT = 3 if QUICK else 9
N = 1_000_000
CAP, TOL = 60, 1e-15


@hawk.kernel
def newton(a: Scalar) -> Scalar:
    x = a
    for _ in range(CAP):
        dx = (x * x - a) / (2.0 * x)
        x = x - dx
        if abs(dx) <= TOL * x:
            break
    return x


def numpy_masked(a):
    """The vectorised NumPy loop one would write by hand: masked updates until no sample is active."""
    x = a.copy()
    active = np.ones(a.shape, bool)
    for _ in range(CAP):
        dx = (x * x - a) / (2.0 * x)
        x_new = x - dx
        x = np.where(active, x_new, x)
        active &= ~(np.abs(dx) <= TOL * x_new)
        if not active.any():
            break
    return x


def main():
    rng = np.random.default_rng(0)
    a = np.exp(rng.uniform(-27.0, 27.0, N))
    want = np.sqrt(a)
    np.testing.assert_allclose(newton(a), want, rtol=4e-16)
    np.testing.assert_allclose(numpy_masked(a), want, rtol=4e-16)
    r = median_ratio(lambda: newton(a), lambda: numpy_masked(a), 1, REPEAT)
    print(f"numpy: newton sqrt at n={N:.0e}: kernel / vectorised NumPy masked loop = {r:.2f}")

    try:
        import jax
        import jax.numpy as jnp
        from jax import lax
    except ImportError:
        print("jax: skipped (no jax)")
    else:
        jax.config.update("jax_enable_x64", True)

        def one(av):
            def cond(s):
                i, _, done = s
                return (i < CAP) & ~done

            def body(s):
                i, x, _ = s
                dx = (x * x - av) / (2.0 * x)
                x = x - dx
                return i + 1, x, jnp.abs(dx) <= TOL * x
            return lax.while_loop(cond, body, (0, av, False))[1]
        ref = jax.jit(jax.vmap(one))
        aj = jnp.asarray(a)
        np.testing.assert_allclose(np.asarray(newton(aj)), want, rtol=4e-16)
        np.testing.assert_allclose(np.asarray(ref(aj)), want, rtol=4e-16)
        r = median_ratio(lambda: newton(aj).block_until_ready(), lambda: ref(aj).block_until_ready(), 1, REPEAT)
        print(f"jax:   newton sqrt at n={N:.0e}: kernel / jax.jit(jax.vmap(lax.while_loop)) = {r:.2f}")

    vjp = hd.vjp(newton, wrt="a")
    ones = np.ones(N)
    np.testing.assert_allclose(vjp(a, cotangent=ones)["a"], 0.5 / want, rtol=1e-12)
    r = median_ratio(lambda: vjp(a, cotangent=ones), lambda: newton(a), 1, REPEAT)
    print(f"numpy: reverse mode / forward call at n={N:.0e} = {r:.2f}")


if __name__ == "__main__":
    main()
