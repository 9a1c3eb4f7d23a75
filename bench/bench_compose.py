"""Composed transforms against hand-written NumPy (vectorised, in this process) and against the
recorded-run gradient of the same graph.

    python bench/bench_compose.py

L-chain: W-chain (10 x (dbl, inc)) then sum(y * y). Its gradient is 2 * y * 2**10 and its
Hessian-vector product 2 * 2**20 * v, which NumPy computes in a few array operations.
  * vmap(grad(L-chain)) over B = 1000 instances of n = 8, replayed, / the NumPy gradient of all
    instances at once, and / 1000 replays of one prebuilt grad graph per instance;
  * the grad graph (a Program transform, replayed) / a record=True forward + diff.reverse of the
    same graph, n = 1e5, for L-chain and for L-loop (50 turns of sin(x) * x, whose backward reads
    every turn's x: a stack of saved turns);
  * jvp(grad(L-chain)) (a Hessian-vector product graph from make_graph, replayed) / the NumPy
    gradient and HVP, n = 1e5.
Medians over repeats; the machine is shared, so read the ratios, not the times.
"""

import numpy as np

import eagle_fx as eagle

from timing import median_time
from workloads import l_chain, l_loop


def numpy_grad(x):
    y = x
    for _ in range(10):
        y = 2.0 * y + 1.0
    return 2.0 * y * 2.0 ** 10


def main():
    B, n = 1000, 8
    xs = np.random.rand(B, n)
    gb = eagle.vmap(eagle.grad(l_chain)).graph(xs)
    want = numpy_grad(xs)
    assert np.allclose(gb(), want)
    per = [eagle.grad(l_chain).graph(xs[b].copy()) for b in range(B)]

    def loop():
        for g in per:
            g.launch()
    t_v, t_np, t_loop = median_time(gb.launch, 20), median_time(lambda: numpy_grad(xs), 20), median_time(loop, 1, 3)
    print(f"vmap(grad(L-chain)) B={B} n={n}: / NumPy gradient = {t_v / t_np:5.2f}; "
          f"{t_loop / t_v:6.1f}x faster than {B} replays of prebuilt grad graphs")

    n = 100_000
    x = np.random.rand(n)
    gg = eagle.grad(l_chain).graph(x)
    assert np.allclose(gg(), numpy_grad(x))
    gr = l_chain(x, record=True)
    ones = np.ones(1)

    def recorded():
        gr.launch()
        eagle.diff.reverse(gr.record, {"result": ones}, wrt=("x",))
    t_g, t_r, t_np = median_time(gg.launch, 20), median_time(recorded, 20), median_time(lambda: numpy_grad(x), 20)
    print(f"grad(L-chain) n={n}: Program-transform graph / recorded forward + reverse = {t_g / t_r:5.2f}; "
          f"/ NumPy gradient = {t_g / t_np:5.2f}")

    flag = np.ones(1, np.uint32)
    xl = np.random.rand(n) * 0.5
    gl = eagle.grad(l_loop).graph(xl, flag)
    grl = l_loop(xl, flag, record=True)

    def recorded_loop():
        flag[0] = 1
        grl.launch()
        eagle.diff.reverse(grl.record, {"result": ones}, wrt=("x",))

    def program_loop():
        flag[0] = 1
        gl.launch()
    recorded_loop()
    program_loop()
    assert np.allclose(gl.result, eagle.diff.reverse(grl.record, {"result": ones}, wrt=("x",))["x"])
    t_pl, t_rl = median_time(program_loop, 5), median_time(recorded_loop, 5)
    print(f"grad(L-loop: 50 turns of sin(x) * x) n={n}: Program-transform graph / recorded forward + reverse = "
          f"{t_pl / t_rl:5.2f}")

    v = np.random.rand(n)
    gh = eagle.make_graph(lambda x, v: eagle.jvp(eagle.grad(l_chain), (x,), (v,)))(x, v)
    assert np.allclose(gh()[1], 2.0 * 2.0 ** 20 * v)

    def numpy_hvp():
        return numpy_grad(x), 2.0 * 2.0 ** 20 * v
    t_h, t_hn = median_time(gh.launch, 20), median_time(numpy_hvp, 20)
    print(f"jvp(grad(L-chain)) n={n}, the HVP graph replayed: / NumPy (gradient, HVP) = {t_h / t_hn:5.2f}")

if __name__ == "__main__":
    main()
