"""Reverse mode of a recorded graph against its plain forward, with JAX beside it.

    python bench/bench_reverse.py              # n = 1e6
    python bench/bench_reverse.py 1e5          # another n

Per function (sin(x)·x and exp(-x²), one kernel each): the median over repeats of the plain
forward `g.launch()`, of the recorded forward `gr.launch()` plus `eagle_fx.diff.reverse(gr.record,
...)`, and the ratio (recorded forward + reverse) / forward (target <= 2.5). Beside it, in the same
process: jax.jit(jax.value_and_grad(sum of f)) / jax.jit(f).
"""
import sys
import timeit

import numpy as np

import eagle_fx as eagle
from workloads import k1, k2

TARGET = 2.5


@eagle.Graph.builder
def wave(x, record=False):
    g = eagle.Graph(record=record)
    g.result = k1(x)
    return g


@eagle.Graph.builder
def bell(x, record=False):
    g = eagle.Graph(record=record)
    g.result = k2(x)
    return g


def median_time(fn, number, repeat):
    fn()
    return float(np.median(timeit.repeat(fn, number=number, repeat=repeat))) / number


def jax_ratio(f, x, number, repeat):
    try:
        import jax
        import jax.numpy as jnp
    except ImportError:
        return None
    jax.config.update("jax_enable_x64", True)
    xj = jnp.asarray(x)
    fwd = jax.jit(f)
    vg = jax.jit(jax.value_and_grad(lambda v: jnp.sum(f(v))))
    tf = median_time(lambda: fwd(xj).block_until_ready(), number, repeat)
    tv = median_time(lambda: jax.block_until_ready(vg(xj)), number, repeat)
    return tv / tf


def main(n, number=5, repeat=11):
    import jax.numpy as jnp
    x = np.linspace(-2.0, 2.0, n)
    ones = np.ones(n)
    for label, builder, jf in (("sin(x)*x", wave, lambda v: jnp.sin(v) * v),
                               ("exp(-x^2)", bell, lambda v: jnp.exp(-v * v))):
        g = builder(x)
        gr = builder(x, record=True)
        tf = median_time(g.launch, number, repeat)

        def recorded():
            gr.launch()
            eagle.diff.reverse(gr.record, {"result": ones}, wrt=("x",))
        tr = median_time(recorded, number, repeat)
        ratio = tr / tf
        jr = jax_ratio(jf, x, number, repeat)
        jtxt = f"jax.jit(value_and_grad) / jax.jit(f) {jr:5.2f}" if jr is not None else "jax not installed"
        print(f"{label:<10} n={n:<7.0e} (recorded forward + reverse) / forward {ratio:5.2f} "
              f"({'ok' if ratio <= TARGET else 'MISSES'} <= {TARGET:g}) | {jtxt}")


if __name__ == "__main__":
    main(int(float(sys.argv[1])) if len(sys.argv) > 1 else 1_000_000)
