"""CUDA-graph replay on a GPU (needs CuPy, cuda.core and a device; bench/gpu_check.sh runs it).

    python bench/bench_gpu.py            # everything below, about a minute
    python bench/bench_gpu.py --quick    # fewer repeats

1. W-chain (10 x inc(dbl(x))) and W-loop (a capped device loop, 50 turns, guard cell written by a
   reduction) at n = 8 and 1e6: one replay of the built CUDA graph (g.launch(): launch + stream sync)
   against the SAME kernels launched one by one from Python on CuPy arrays:
     eager     hawk kernels called on CuPy arrays (what user code does; the loop reads its guard
               cell on the host every turn)
     prebound  W-chain only: the graph's own kernel nodes launched with cuda.core.launch, arguments
               bound beforehand (the least Python a one-by-one launch can cost)
     cupy      the same arithmetic as CuPy ufuncs with out= (a reference)
2. Per-node replay cost: chains of K inc kernels at n = 8, K in (1, 16, 64, 256): replay time per K,
   the slope (cost per node) and the intercept, against K prebound launches.
3. Device loops vs host-driven loops: a capped loop of 1000 turns whose guard cell a reduction writes,
   at n = 8 and 1e6: one graph launch against a Python loop launching the body and reading the guard
   every turn (eager), i.e. the speedup of keeping the loop on the device.
4. bind: swapping an input array of a built graph (per-node update or whole-graph update).

Every timing is the median over repeats of a loop sized to run about 50 ms; results are checked
against each other before they are timed. Lines starting with RESULT are the machine-readable ones.
"""
from __future__ import annotations

import sys
import time

import numpy as np

import eagle_fx as eagle

try:
    import cupy as cp
    from eagle_fx.backends import cuda as ecuda
    ecuda.require_gpu()
except Exception as exc:                       # noqa: BLE001
    print(f"bench_gpu: no GPU to run on: {exc}")
    sys.exit(2)

QUICK = "--quick" in sys.argv
REPEAT = 3 if QUICK else 7
TARGET = 0.02 if QUICK else 0.05


from workloads import below, dbl, halve, inc, w_chain, w_loop  # noqa: F401


@eagle.Graph.builder
def long_loop(x, flag):
    g = eagle.Graph()
    for _ in range(1000):
        if not flag:
            break
        x = halve(x)
        below(x, 1e9, flag)
    g.result = x
    return g


def k_chain(k):
    @eagle.Graph.builder
    def chain_k(x):
        g = eagle.Graph()
        for _ in range(k):
            x = inc(x)
        g.result = x
        return g
    return chain_k


def sync():
    cp.cuda.get_current_stream().synchronize()


def median_time(fn) -> float:
    """Seconds per call: the median over REPEAT loops, each about TARGET seconds long."""
    fn()
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    one = max(time.perf_counter() - t0, 1e-7)
    number = max(1, int(TARGET / one))
    times = []
    for _ in range(REPEAT):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        sync()
        times.append((time.perf_counter() - t0) / number)
    return float(np.median(times))


def us(t):
    return f"{t * 1e6:9.1f} us"


def prebound(g):
    """The graph's top-level kernel nodes as cuda.core launches with their arguments bound."""
    from cuda.core import launch

    from hawk_fx.cuda_runtime import core_arg
    exe = g._exe
    rt = exe.runtime
    nodes = [nd for nd in exe.plan.tree if nd.kind == "kernel"]
    assert all(nd.kind in ("kernel", "join") for nd in exe.plan.tree), "prebound: a straight chain only"
    calls = [(rt.config(nd.grid, nd.block), rt.function(nd.module, nd.entry),
              tuple(core_arg(a) for a in nd.args)) for nd in nodes]

    def run():
        stream = rt.stream()
        for cfg, fn, args in calls:
            launch(stream, cfg, fn, *args)
    return run, len(calls)


def bench_chain(n):
    x = cp.asarray(np.random.default_rng(1).random(n))
    g = w_chain(x)
    pre, nk = prebound(g)

    def eager():
        y = x
        for _ in range(10):
            y = inc(dbl(y))
        return y

    out, tmp = cp.empty(n), cp.empty(n)

    def cupy_ops():
        src = x
        for _ in range(10):
            cp.multiply(src, 2.0, out=tmp)
            cp.add(tmp, 1.0, out=out)
            src = out
        return out

    ref = cp.asnumpy(eager())
    np.testing.assert_allclose(cp.asnumpy(g()), ref, rtol=1e-12)
    np.testing.assert_allclose(cp.asnumpy(cupy_ops()), ref, rtol=1e-12)
    pre()
    sync()
    np.testing.assert_allclose(cp.asnumpy(g.result), ref, rtol=1e-12)
    tg, te, tp, tc = median_time(g.launch), median_time(eager), median_time(pre), median_time(cupy_ops)
    print(f"W-chain  n={n:<8} graph {us(tg)}   eager {us(te)} ({te / tg:5.1f}x)   prebound {us(tp)} "
          f"({tp / tg:5.1f}x)   cupy {us(tc)} ({tc / tg:5.1f}x)   [{nk} kernels]")
    print(f"RESULT w_chain n={n} graph_us={tg * 1e6:.2f} eager_us={te * 1e6:.2f} prebound_us={tp * 1e6:.2f} "
          f"cupy_us={tc * 1e6:.2f} speedup_vs_eager={te / tg:.2f} speedup_vs_prebound={tp / tg:.2f}")


def host_loop(x, flag, turns):
    """The loop body launched from Python, its guard cell read on the host every turn."""
    def run():
        flag[0] = 1
        y = x
        for _ in range(turns):
            if not int(flag[0]):                 # a device -> host read: one synchronisation per turn
                break
            y = halve(y)
            below(y, 1e9, flag)
        return y
    return run


def bench_loop(label, builder, turns, n):
    x = cp.asarray(np.random.default_rng(2).random(n))
    flag = cp.ones(1, cp.uint32)
    g = builder(x, flag)

    def graph():
        flag[0] = 1
        g.launch()

    eager = host_loop(x, cp.ones(1, cp.uint32), turns)
    out, tmp, mask = cp.empty(n), cp.empty(n), cp.empty(n, bool)
    cflag = np.ones(1, np.uint32)

    def cupy_ops():
        cflag[0] = 1
        cp.copyto(out, x)
        for _ in range(turns):
            if not cflag[0]:
                break
            cp.multiply(out, 0.5, out=tmp)
            cp.add(tmp, 1.0, out=out)
            cp.less(out, 1e9, out=mask)
            cflag[0] = int(cp.count_nonzero(mask))
        return out

    graph()
    ref = cp.asnumpy(eager())
    np.testing.assert_allclose(cp.asnumpy(g.result), ref, rtol=1e-12)
    np.testing.assert_allclose(cp.asnumpy(cupy_ops()), ref, rtol=1e-12)
    tg, te, tc = median_time(graph), median_time(eager), median_time(cupy_ops)
    print(f"{label:<8} n={n:<8} graph {us(tg)}   host loop {us(te)} ({te / tg:5.1f}x)   cupy host loop {us(tc)} "
          f"({tc / tg:5.1f}x)   [{turns} turns: {tg / turns * 1e6:.2f} us/turn on the device, "
          f"{te / turns * 1e6:.2f} us/turn host-driven]")
    print(f"RESULT {label.lower().replace('-', '_')} n={n} turns={turns} graph_us={tg * 1e6:.2f} "
          f"host_loop_us={te * 1e6:.2f} cupy_host_loop_us={tc * 1e6:.2f} speedup_vs_host_loop={te / tg:.2f}")


def bench_per_node():
    x = cp.zeros(8)
    ks, tg, tp = (1, 16, 64, 256), [], []
    for k in ks:
        g = k_chain(k)(x)
        pre, nk = prebound(g)
        assert nk == k
        np.testing.assert_array_equal(cp.asnumpy(g()), np.full(8, float(k)))
        tg.append(median_time(g.launch))
        tp.append(median_time(pre))
        print(f"per-node K={k:<4} graph {us(tg[-1])} ({tg[-1] / k * 1e6:7.2f} us/node)   prebound {us(tp[-1])} "
              f"({tp[-1] / k * 1e6:7.2f} us/launch)")
    slope, icpt = np.polyfit(np.array(ks, float), np.array(tg), 1)
    pslope, picpt = np.polyfit(np.array(ks, float), np.array(tp), 1)
    print(f"per-node fit: graph replay {icpt * 1e6:.2f} us + {slope * 1e6:.3f} us/node; "
          f"one-by-one launches {picpt * 1e6:.2f} us + {pslope * 1e6:.3f} us/kernel")
    print(f"RESULT per_node graph_fixed_us={icpt * 1e6:.2f} graph_per_node_us={slope * 1e6:.3f} "
          f"launch_fixed_us={picpt * 1e6:.2f} launch_per_kernel_us={pslope * 1e6:.3f}")


def bench_bind():
    x0, x1 = cp.arange(8.0), cp.arange(8.0) + 1
    flag = cp.ones(1, cp.uint32)
    g = w_loop(x0, flag)
    arrays = [x0, x1]
    k = [0]

    def swap():
        k[0] ^= 1
        g.bind(x=arrays[k[0]])
    swap()
    mode = g._exe.last_bind
    t = median_time(swap)
    flag[0] = 1
    res = cp.asnumpy(g())
    ref_flag = cp.ones(1, cp.uint32)
    ref = cp.asnumpy(host_loop(arrays[k[0]], ref_flag, 50)())
    np.testing.assert_allclose(res, ref, rtol=1e-12)
    print(f"bind     W-loop x: {us(t)} per bind ({mode}"
          f"{'; ' + g._exe.last_bind_reason[:120] if mode == 'graph' else ''})")
    print(f"RESULT bind mode={mode} bind_us={t * 1e6:.2f}")


def main():
    import cuda.core
    dev = cp.cuda.runtime.getDeviceProperties(cp.cuda.runtime.getDevice())
    print(f"device: {dev['name'].decode() if isinstance(dev['name'], bytes) else dev['name']}, "
          f"driver {cp.cuda.runtime.driverGetVersion()}, cupy {cp.__version__}, cuda.core {cuda.core.__version__}")
    t0 = time.perf_counter()
    for n in (8, 1_000_000):
        bench_chain(n)
    for n in (8, 1_000_000):
        bench_loop("W-loop", w_loop, 50, n)
    bench_per_node()
    for n in (8, 1_000_000):
        bench_loop("Long-loop", long_loop, 1000, n)
    bench_bind()
    print(f"bench_gpu: done in {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
