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
  * against JAX (jax.jit of the same computation written in JAX, float64), at n = 8 and n = 1e5,
    on the NumPy and JAX backends: vmap(jacfwd(f)) over n instances of a 3-sample f (a sample
    mean, then 10 turns of a * x + 0.1 tanh x: a dense 3 x 3 Jacobian each), and hessian(f) of a
    loss in a Param through a 50-turn counted loop over n samples.
Medians over repeats; the machine is shared, so read the ratios, not the times.

    python bench/bench_compose.py --jax       # only the comparisons with JAX
"""
import sys

import numpy as np

import eagle_fx as eagle
import hawk_fx as hawk
from hawk_fx import Param, Scalar
from hawk_fx import math as hm

from timing import median_ratio, median_time
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

@hawk.kernel
def _centre(x: Scalar) -> Scalar:
    return x - hawk.mean(x)


@hawk.kernel
def _turn(x: Scalar, a: Param) -> Scalar:
    return a * x + 0.1 * hm.tanh(x)


@hawk.kernel
def _two(x: Scalar, a: Param) -> Scalar:
    return a * x + 0.05 * hm.tanh(x)


@hawk.kernel
def _mse(x: Scalar) -> Scalar:
    return hawk.sum(x * x)


@eagle.Graph.builder
def _small(x):
    g = eagle.Graph()
    x = _centre(x)
    for _ in range(10):
        x = _turn(x, 0.9)
    g.result = x
    return g


@eagle.Graph.builder
def _fit(a, x, n):
    g = eagle.Graph()
    for _ in range(n):                   # a counted loop: 50 turns
        x = _two(x, a)
    g.result = _mse(x)
    return g


def against_jax():
    import jax
    jax.config.update("jax_enable_x64", True)
    jnp, lax = jax.numpy, jax.lax
    from eagle_fx.backends.select import use_backend

    def j_small(x):
        x = x - jnp.mean(x)
        return lax.fori_loop(0, 10, lambda i, v: 0.9 * v + 0.1 * jnp.tanh(v), x)

    def j_fit(a, x):
        return jnp.sum(lax.fori_loop(0, 50, lambda i, v: a * v + 0.05 * jnp.tanh(v), x) ** 2)
    j_vjac = jax.jit(jax.vmap(jax.jacfwd(j_small)))
    j_hess = jax.jit(jax.hessian(j_fit))
    rng = np.random.default_rng(0)
    a, n50 = np.array([0.9]), np.array([50], np.uint32)
    for n in (8, 100_000):
        xs = rng.normal(size=(n, 3))
        x = rng.normal(size=n) * 0.1
        want_j = np.asarray(j_vjac(xs))
        want_h = np.asarray(j_hess(a[0], x))
        for backend in ("numpy", "jax"):
            with use_backend(backend):
                vj, hs = eagle.vmap(eagle.jacfwd(_small)), eagle.hessian(_fit)
                assert np.allclose(vj(xs), want_j, rtol=1e-9, atol=1e-12)
                assert np.allclose(np.asarray(hs(a, x, n50)).reshape(()), want_h, rtol=1e-8)
                r_j = median_ratio(lambda: vj(xs), lambda: j_vjac(xs).block_until_ready(), 3, 5)
                r_h = median_ratio(lambda: hs(a, x, n50), lambda: j_hess(a[0], x).block_until_ready(), 3, 5)
            print(f"n={n:<7} {backend:<5} backend: vmap(jacfwd(f)) / jax.jit = {r_j:6.2f}; "
                  f"hessian(f) through 50 turns / jax.jit = {r_h:6.2f}", flush=True)


if __name__ == "__main__":
    if "--jax" not in sys.argv:
        main()
    against_jax()
