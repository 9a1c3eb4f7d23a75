"""Reverse mode of a recorded graph against its plain forward, with JAX beside it; and the
time/memory trade of checkpointed reverse mode through a long loop.

    python bench/bench_reverse.py                    # n = 1e6, then the checkpointing table
    python bench/bench_reverse.py 1e5                # another n
    python bench/bench_reverse.py --only ratio       # one part: ratio or checkpoints
    python bench/bench_reverse.py --turns 2000       # a shorter loop for the checkpointing table
    python bench/bench_reverse.py 1e6 --cuda         # on CuPy arrays: CUDA graphs (a GPU; memory: device bytes)

Per function (sin(x)·x and exp(-x²), one kernel each): the ratio of the median over repeats of
the recorded forward `gr.launch()` plus `eagle_fx.diff.reverse(gr.record, ...)` to that of the
plain forward `g.launch()`, their repeats interleaved: (recorded forward + reverse) / forward
(target <= 2.5). Beside it, in the same
process: jax.jit(jax.value_and_grad(sum of f)) / jax.jit(f).

Checkpointing: grad of T turns of x + 0.001 sin(x) at n = 1000 (T = 20 000), with
checkpoints = 8, 32, 128 and without (every turn stored): the peak memory of a first run
(tracemalloc) and the median time of a replay, each as a ratio to the stored reverse, and the
turns the schedule runs again per turn of the loop.
"""
import argparse
import tracemalloc

import numpy as np

import eagle_fx as eagle
import hawk_fx as hawk
from eagle_fx.transforms import checkpoint
from hawk_fx import Scalar
from hawk_fx import math as hm
from timing import median_ratio, median_time
from workloads import k1, k2

TARGET = 2.5
XP = np                               # the array module: cupy with --cuda


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
    return median_ratio(lambda: jax.block_until_ready(vg(xj)), lambda: fwd(xj).block_until_ready(), number, repeat)


@hawk.kernel
def relax(x: Scalar) -> Scalar:
    return x + 0.001 * hm.sin(x)


@hawk.kernel
def total(x: Scalar) -> Scalar:
    return hawk.sum(x * x)


@eagle.Graph.builder
def long_loop(x, n):
    g = eagle.Graph()
    for i in range(n):
        x = relax(x)
    g.result = total(x)
    return g


def first_run_peak(g):
    if XP is not np:                  # the graph's device buffers (stacks and kept states included)
        g()
        exe = getattr(g._exe, "exe", g._exe)
        return sum(a.nbytes for a in exe._memory)
    tracemalloc.start()
    try:
        g()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def checkpoints_table(turns=20_000, n=1000, repeat=3):
    x = XP.linspace(0.1, 3.0, n)
    trip = XP.array([turns], np.uint32)
    rows = []
    for K in (None, 8, 32, 128):
        peak = first_run_peak(eagle.grad(long_loop, checkpoints=K).graph(x, trip))   # a fresh graph
        g = eagle.grad(long_loop, checkpoints=K).graph(x, trip)
        t = median_time(g, 1, repeat)
        rows.append((K, peak, t))
    _, peak0, t0 = rows[0]
    print(f"checkpointed reverse through T = {turns} turns at n = {n} (stored: every turn; peak {peak0 / 1e6:.1f} MB)")
    print("  checkpoints   peak / stored   time / stored   turns run again per turn (most per turn)")
    for K, peak, t in rows[1:]:
        again = checkpoint.cost(turns, K) / turns
        print(f"  {K:>11}   {peak / peak0:13.4f}   {t / t0:13.2f}   {again:6.2f} ({checkpoint.repetitions(turns, K)})"
              f"   peak {peak / 1e6:.2f} MB")


def ratio_table(n, number=5, repeat=11):
    import jax.numpy as jnp
    x = XP.linspace(-2.0, 2.0, n)
    ones = XP.ones(n)
    for label, builder, jf in (("sin(x)*x", wave, lambda v: jnp.sin(v) * v),
                               ("exp(-x^2)", bell, lambda v: jnp.exp(-v * v))):
        g = builder(x)
        gr = builder(x, record=True)
        def recorded():
            gr.launch()
            eagle.diff.reverse(gr.record, {"result": ones}, wrt=("x",))
        ratio = median_ratio(recorded, g.launch, number, repeat)
        jr = jax_ratio(jf, np.asarray(x) if XP is np else XP.asnumpy(x), number, repeat)
        jtxt = f"jax.jit(value_and_grad) / jax.jit(f) {jr:5.2f}" if jr is not None else "jax not installed"
        print(f"{label:<10} n={n:<7.0e} (recorded forward + reverse) / forward {ratio:5.2f} "
              f"({'ok' if ratio <= TARGET else 'MISSES'} <= {TARGET:g}) | {jtxt}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("n", nargs="?", default="1e6", help="samples for the ratio table")
    ap.add_argument("--only", choices=("ratio", "checkpoints"))
    ap.add_argument("--turns", type=int, default=20_000, help="loop turns for the checkpointing table")
    ap.add_argument("--cuda", action="store_true", help="CuPy arrays: the graphs are CUDA graphs")
    a = ap.parse_args()
    if a.cuda:
        import cupy
        XP = cupy
    if a.only != "checkpoints":
        ratio_table(int(float(a.n)))
    if a.only != "ratio":
        checkpoints_table(a.turns)
