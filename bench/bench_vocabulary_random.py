"""Normals per second from a kernel, against NumPy's and JAX's generators, at n = 1e6.

    python bench/bench_vocabulary_random.py            # float64 and float32
    python bench/bench_vocabulary_random.py --quick    # fewer repeats

1. NumPy backend: a kernel returning `hm.random.normal(key)` (one-cell key), against
   `numpy.random.Generator.normal` (PCG64, ziggurat) and `jax.random.normal` under `jax.jit`,
   both into new arrays of the same dtype. Target: <= 1.5x the faster of the two.
2. JAX backend: the same kernel called on a jax.Array key (jitted by the kernel call), against
   `jax.jit(jax.random.normal)`. Target: <= 1.2x.
Every figure is a ratio of medians of timeit repeats taken in this process; normals per second
are printed for orientation.
"""
import sys

import numpy as np

import hawk_fx as hawk
import hawk_fx.math as hm
from hawk_fx import Key, Scalar
from timing import median_ratio, median_time

QUICK = "--quick" in sys.argv
REPEAT = 3 if QUICK else 7
N = 1_000_000


@hawk.kernel
def normal64(key: Key, like: Scalar):
    return hm.random.normal(key)


@hawk.kernel
def normal32(key: Key, like: Scalar):
    return hm.random.normal(key, dtype=np.float32)


def main():
    import jax
    import jax.numpy as jnp
    jax.config.update("jax_enable_x64", True)
    key = hawk.random.key(0)
    jkey = jax.random.PRNGKey(0)
    gen = np.random.default_rng(0)
    print(f"normals at n = {N:,}")
    for dt, kern in ((np.float64, normal64), (np.float32, normal32)):
        like = np.zeros(N, dt)
        jlike = jnp.zeros(N, dt)
        jkey_arr = jnp.asarray(key)

        def ours():
            kern(key, like)

        def numpy_gen():
            gen.standard_normal(N, dtype=dt)

        jnormal = jax.jit(lambda k: jax.random.normal(k, (N,), dt))

        def jax_gen():
            jnormal(jkey).block_until_ready()

        def ours_jax():
            kern(jkey_arr, jlike).block_until_ready()

        t_ours, t_np, t_jax, t_ours_jax = (median_time(f, 3, REPEAT) for f in (ours, numpy_gen, jax_gen, ours_jax))
        name = np.dtype(dt).name
        for label, t in (("hawk (NumPy backend)", t_ours), ("numpy Generator.normal", t_np),
                         ("jax.random.normal (jit)", t_jax), ("hawk (JAX backend)", t_ours_jax)):
            print(f"  {name} {label:26s} {N / t / 1e6:8.1f} M normals/s")
        faster = numpy_gen if t_np <= t_jax else jax_gen
        r_np = median_ratio(ours, faster, 3, REPEAT)
        r_jax = median_ratio(ours_jax, jax_gen, 3, REPEAT)
        print(f"  {name} NumPy backend / faster of numpy, jax: {r_np:.2f}  (target <= 1.5)")
        print(f"  {name} JAX backend / jax.random.normal:      {r_jax:.2f}  (target <= 1.2)")


if __name__ == "__main__":
    main()
