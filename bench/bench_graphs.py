"""Graph replay against the same computation hand-written in NumPy with preallocated `out=` buffers.

    python bench/bench_graphs.py            # W-chain, W-loop (n = 8 and 1e6), W-fork (n = 1e6)

Prints, per workload, the median time ratio graph / NumPy over repeats (both run in this process).
Targets: <= 1.5 at n = 8; <= 1.0 at n = 1e6.
"""
import sys

import numpy as np



from timing import median_time
from workloads import w_chain, w_fork, w_loop


def numpy_chain(x, out, tmp):
    src = x
    for _ in range(10):
        np.multiply(src, 2.0, out=tmp)
        np.add(tmp, 1.0, out=out)
        src = out


def numpy_loop(x, flag, out, tmp, mask):
    np.copyto(out, x)
    for _ in range(50):
        if not flag[0]:
            break
        np.multiply(out, 0.5, out=tmp)
        np.add(tmp, 1.0, out=out)
        np.less(out, 1e9, out=mask)
        flag[0] = np.count_nonzero(mask)


def numpy_fork(x, a, b, c, t):
    np.multiply(x, 2.0, out=t); np.add(t, 1.0, out=t); np.multiply(t, 2.0, out=t); np.add(t, 1.0, out=a)
    np.add(x, 1.0, out=t); np.multiply(t, 2.0, out=t); np.add(t, 1.0, out=t); np.multiply(t, 2.0, out=b)
    np.multiply(x, 0.5, out=t); np.add(t, 1.0, out=t)
    for _ in range(3):
        np.multiply(t, 0.5, out=t); np.add(t, 1.0, out=t)
    np.copyto(c, t)


def compare(label, graph_fn, numpy_fn, n):
    number, repeat = (2000, 15) if n <= 1000 else (5, 11)
    graph_fn(); numpy_fn()
    tg = median_time(graph_fn, number, repeat)
    tn = median_time(numpy_fn, number, repeat)
    print(f"{label:<10} n={n:<8} graph/numpy = {tg / tn:5.2f}")
    return tg / tn


def main(sizes=(8, 1_000_000)):
    for n in sizes:
        x = np.random.rand(n)
        g = w_chain(x)
        out, tmp = np.empty(n), np.empty(n)
        compare("W-chain", g.launch, lambda: numpy_chain(x, out, tmp), n)
        assert np.allclose(g(), (numpy_chain(x, out, tmp), out)[1])

        flag = np.array([1], np.uint32)
        gl = w_loop(x, flag)
        flag2 = np.array([1], np.uint32)
        out, tmp, mask = np.empty(n), np.empty(n), np.empty(n, bool)

        def run_graph():
            flag[0] = 1
            gl.launch()

        def run_numpy():
            flag2[0] = 1
            numpy_loop(x, flag2, out, tmp, mask)
        compare("W-loop", run_graph, run_numpy, n)
        assert np.allclose(gl.result, out)
    n = 1_000_000
    x = np.random.rand(n)
    gf = w_fork(x)
    a, b, c, t = (np.empty(n) for _ in range(4))
    compare("W-fork", gf.launch, lambda: numpy_fork(x, a, b, c, t), n)
    ra, rb, rc = gf()
    assert np.allclose(ra, a) and np.allclose(rb, b) and np.allclose(rc, c)


if __name__ == "__main__":
    main(tuple(int(float(s)) for s in sys.argv[1:]) or (8, 1_000_000))
