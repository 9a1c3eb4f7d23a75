"""A batched 4 x 4 solve: hm.linalg.solve in a kernel (NumPy emitter, and the kernel called on
jax.Arrays) against np.linalg.solve on the stacked (n, 4, 4) array and
jax.jit(jax.vmap(jnp.linalg.solve)), at n = 1e5 and 1e6, as ratios of medians in one process.
Then the time to trace and build an unrolled solve of k = 4, 8, 16 (first call, a fresh kernel).

    python bench/bench_vocabulary_linalg.py [--quick]
"""

import sys
import time

import numpy as np

import hawk_fx as hawk
import hawk_fx.math as hm
from hawk_fx import Matrix, Vector

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from timing import median_ratio, median_time  # noqa: E402

K = 4


@hawk.kernel
def solve4(a: Matrix[K, K], b: Vector[K]):
    return hm.linalg.solve(a, b)


def data(n, k=K, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(n, k, k)) + k * np.eye(k)
    b = rng.normal(size=(n, k))
    return a, b


def build_time(k):
    @hawk.kernel
    def solve_k(a: Matrix[k, k], b: Vector[k]):
        return hm.linalg.solve(a, b)
    a, b = data(8, k)
    pa, pb = np.ascontiguousarray(np.moveaxis(a, 0, -1)), np.ascontiguousarray(b.T)
    t = time.perf_counter()
    solve_k(pa, pb)
    return time.perf_counter() - t


def main(quick=False):
    import jax
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp

    sizes = [100_000] if quick else [100_000, 1_000_000]
    jsolve = jax.jit(jax.vmap(jnp.linalg.solve))
    print(f"batched {K}x{K} solve, float64; ratios of median times (lower is faster for hawk)")
    print(f"{'n':>9} {'hawk/np.linalg':>15} {'hawk/jax.jit(vmap)':>19} {'hawk-on-jax/jax':>16} {'hawk ms':>8}")
    for n in sizes:
        a, b = data(n)
        pa, pb = np.ascontiguousarray(np.moveaxis(a, 0, -1)), np.ascontiguousarray(b.T)     # planes: sample axis last
        ja, jb = jnp.asarray(a), jnp.asarray(b)
        jpa, jpb = jnp.asarray(pa), jnp.asarray(pb)
        x = solve4(pa, pb)
        assert np.allclose(x.T, np.linalg.solve(a, b[..., None])[..., 0], rtol=1e-10, atol=1e-12)
        number, repeat = (3, 5) if n <= 100_000 else (1, 5)

        def hawk_np():
            solve4(pa, pb)

        def numpy_solve():
            np.linalg.solve(a, b[..., None])

        def jax_solve():
            jsolve(ja, jb).block_until_ready()

        def hawk_jax():
            solve4(jpa, jpb).block_until_ready()

        r_np = median_ratio(hawk_np, numpy_solve, number, repeat)
        r_jax = median_ratio(hawk_np, jax_solve, number, repeat)
        r_hj = median_ratio(hawk_jax, jax_solve, number, repeat)
        ms = 1e3 * median_time(hawk_np, number, repeat)
        print(f"{n:>9} {r_np:>15.2f} {r_jax:>19.2f} {r_hj:>16.2f} {ms:>8.1f}")
    print("trace + build of an unrolled solve (first call):")
    for k in ([4, 16] if quick else [4, 8, 16]):
        print(f"  k = {k:>2}: {build_time(k):.2f} s")


if __name__ == "__main__":
    main(quick="--quick" in sys.argv)
