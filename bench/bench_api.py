"""The cost of calling a transformed function, against replaying its graph.

    python bench/bench_api.py              # grad(f)(x) at n = 16 and n = 1e5; the oscillator fit
    python bench/bench_api.py --quick      # fewer repeats
    python bench/bench_api.py --cpu        # process CPU time, not wall time: steadier on a loaded machine

1. `eagle_fx.grad(l_chain)(x)` called in a loop (the transform made at each call, as a script
   writes it), per call, against one replay of its prebuilt graph plus a copy of the gradient:
   the cost of the staging cache's lookup and binding. Target <= 1.3 at n = 16 and n = 1e5.
2. An optimisation script: 200 gradient steps fitting the stiffness and damping of 16 damped
   oscillators (a counted device loop of 25 steps), `eagle_fx.grad(loss, argnums=(0, 1))` per step,
   against `jax.jit(jax.grad(...))` of the same loss in this process (skipped without JAX).
3. Building W-chain (20 kernel calls) afresh (the builder's cache of direct calls off), against the
   same build with the memos of fused kernel bodies and of plans fused per Program cleared before
   each (as every build ran before the memos).
4. A cached call per entry point at n = 8 (L-chain: a builder, vmap of it over 4 instances, jvp,
   grad, grad of a plain function calling it), new values at every call, against one replay of
   its prebuilt graph plus a copy of the result, and against jax.jit of the same function in JAX
   (skipped without JAX). A call of a graph-returning function (the builder, vmap) is timed with
   its replay and copy. "float lr": grad of a builder called with a new Python float each call
   (a learning-rate schedule; traced, so it replays one graph: the graph it is compared with).
Every figure is a ratio of medians of timeit repeats taken in one process.
"""
import sys

import numpy as np

import eagle_fx as eagle
import hawk_fx as hawk
from hawk_fx import Param, Scalar
from eagle_fx.backends import fusion
from timing import median_ratio
from workloads import l_chain, w_chain

if "--cpu" in sys.argv:
    import time
    import timeit

    def median_ratio(num, den, number, repeat):        # noqa: F811  (timing.median_ratio on process time)
        num(), den()
        tn = [0.0] * repeat
        td = [0.0] * repeat
        for k in range(repeat):
            tn[k] = timeit.Timer(num, timer=time.process_time).timeit(number)
            td[k] = timeit.Timer(den, timer=time.process_time).timeit(number)
        return float(np.median(tn) / np.median(td))

TARGET = 1.3
QUICK = "--quick" in sys.argv
REPEAT = 5 if QUICK else 15


def grad_call_vs_replay(n):
    x = np.linspace(-1.0, 1.0, n)
    want = 2 * 2.0 ** 10 * (2.0 ** 10 * x + 1023.0)          # d/dx sum(y^2), y = 1024 x + 1023
    np.testing.assert_allclose(eagle.grad(l_chain)(x), want, rtol=1e-12)
    g = eagle.grad(l_chain).graph(x)

    def replay():
        g.launch()
        np.array(g.result)
    number = max(1, int(2e5 // n)) if n < 1e4 else 20
    return median_ratio(lambda: eagle.grad(l_chain)(x), replay, number, REPEAT)


DT, STEPS, TURNS, B, LR = 0.1, 200, 25, 16, 0.05


@hawk.kernel
def osc_step(x: Scalar, v: Scalar, k: Param, c: Param):
    v2 = v + DT * (-k * x - c * v)
    return x + DT * v2, v2


@hawk.kernel
def misfit(x: Scalar, target: Scalar) -> Scalar:
    return hawk.sum((x - target) * (x - target))


@eagle.Graph.builder
def osc_loss(k, c, x0, v0, target, turns):
    g = eagle.Graph()
    x, v = x0, v0
    for _ in range(turns):                   # a cell: a counted device loop
        x, v = osc_step(x, v, k, c)
    g.result = misfit(x, target)
    return g


def _osc_data():
    rng = np.random.default_rng(0)
    x0, v0 = rng.normal(size=B), rng.normal(size=B)
    x, v = x0.copy(), v0.copy()
    for _ in range(TURNS):                   # the truth: k = 2, c = 0.3
        v = v + DT * (-2.0 * x - 0.3 * v)
        x = x + DT * v
    return x0, v0, x


def oscillator_fit():
    x0, v0, target = _osc_data()
    turns = np.array([TURNS], dtype=np.uint32)
    dloss = eagle.grad(osc_loss, argnums=(0, 1))

    def fit_eagle():
        k, c = np.array([1.0]), np.array([0.1])
        for _ in range(STEPS):
            gk, gc = dloss(k, c, x0, v0, target, turns)
            k, c = k - LR * gk, c - LR * gc
        return k, c

    try:
        import jax
    except ImportError:
        return fit_eagle(), None, None
    jax.config.update("jax_enable_x64", True)
    jnp, lax = jax.numpy, jax.lax

    def jloss(k, c, x0, v0, target):
        def body(i, s):
            x, v = s
            v = v + DT * (-k * x - c * v)
            return x + DT * v, v
        x, _ = lax.fori_loop(0, TURNS, body, (x0, v0))
        return jnp.sum((x - target) ** 2)
    jg = jax.jit(jax.grad(jloss, argnums=(0, 1)))
    jx0, jv0, jt = map(jnp.asarray, (x0, v0, target))

    def fit_jax():
        k, c = jnp.array([1.0]), jnp.array([0.1])
        for _ in range(STEPS):
            gk, gc = jg(k, c, jx0, jv0, jt)
            k, c = k - LR * gk, c - LR * gc
        return np.asarray(k), np.asarray(c)
    ke, ce = fit_eagle()
    kj, cj = fit_jax()
    np.testing.assert_allclose([ke, ce], [kj, cj], rtol=1e-9)
    return (ke, ce), median_ratio(fit_eagle, fit_jax, 1, REPEAT), None


def rebuild_speedup():
    """Builds staged afresh (the direct-call cache off: a cached call copies a template instead)."""
    from eagle_fx.frontend import builder_cache
    x = np.linspace(-1.0, 1.0, 16)
    w_chain(x)

    def cold():
        fusion._FUSED.clear()           # the fused bodies and the plans fused per Program
        fusion._BY_PROGRAM.clear()
        w_chain(x)
    builder_cache.ENABLED = False
    try:
        return median_ratio(cold, lambda: w_chain(x), 5, REPEAT)
    finally:
        builder_cache.ENABLED = True


@hawk.kernel
def scaled_sq(x: Scalar, a: Param) -> Scalar:
    return hawk.sum(a * x * x)


@eagle.Graph.builder
def scaled_loss(x, a):
    g = eagle.Graph()
    g.result = scaled_sq(x, a)
    return g


def _prebuilt(kind, f=None):
    """The graph a cached call replays (the one entry of its staging cache): of jvp(f), or of a
    transformed function `kind` (grad of a builder called with a traced Python float: its graph
    reads the float from a cell, where `.graph(x, lr)` would bake it in)."""
    from eagle_fx.api import sig
    from eagle_fx.frontend import cache
    name = kind._sig if f is None else sig(kind, f)
    return next(iter(cache.cache_for(name).entries.values())).graph


def entry_point_costs(n=8, B=4):
    """{entry point: (cached call / replay + copy, cached call / jax.jit call or None)}."""
    rng = np.random.default_rng(0)
    xs = [rng.normal(size=n) for _ in range(8)]
    xbs = [rng.normal(size=(B, n)) for _ in range(8)]
    t = np.ones(n)
    k = [0]

    def pick(seq):
        k[0] = (k[0] + 1) % len(seq)
        return seq[k[0]]

    def copy_of(g):
        return np.array(g.result)

    def call_builder():
        g = l_chain(pick(xs))
        g()
        return copy_of(g)

    vm = eagle.vmap(l_chain)

    def call_vmap():
        g = vm(pick(xbs))
        g()
        return copy_of(g)

    def call_jvp():
        return eagle.jvp(l_chain, (pick(xs),), (t,))

    gr = eagle.grad(l_chain)
    plain = eagle.grad(lambda u: l_chain(u))
    lr = eagle.grad(scaled_loss)
    lrs = [0.01 * (j + 1) for j in range(8)]       # a schedule: a new Python float at every call (traced)
    eagle.jvp(l_chain, (xs[0],), (t,))
    lr(xs[0], lrs[0])
    graphs = {"builder": l_chain(xs[0]), "vmap": vm.graph(xbs[0]), "jvp": _prebuilt("jvp", l_chain),
              "grad": gr.graph(xs[0]), "plain": plain.graph(xs[0]), "float lr": _prebuilt(lr)}
    calls = {"builder": call_builder, "vmap": call_vmap, "jvp": call_jvp,
             "grad": lambda: gr(pick(xs)), "plain": lambda: plain(pick(xs)),
             "float lr": lambda: lr(pick(xs), lrs[k[0]])}
    jitted = _jax_entry_points(n)
    out = {}
    for name, call in calls.items():
        g = graphs[name]

        def replay(g=g):
            g.launch()
            g.result_copy()
        number = 200 if name not in ("builder", "vmap") else 20
        r = median_ratio(call, replay, number, REPEAT)
        j = None
        if jitted is not None:
            jf, jargs = jitted[name]
            j = median_ratio(call, lambda: jax_block(jf(*jargs)), number, REPEAT)
        out[name] = (r, j)
    return out


def jax_block(out):
    import jax
    return jax.block_until_ready(out)


def _jax_entry_points(n, B=4):
    """The same entry points as JAX functions, jitted (None without JAX)."""
    try:
        import jax
        import jax.numpy as jnp
    except ImportError:
        return None
    jax.config.update("jax_enable_x64", True)

    def chain(x):
        for _ in range(10):
            x = 2.0 * x + 1.0
        return jnp.sum(x * x)
    x, xb = jnp.linspace(-1.0, 1.0, n), jnp.ones((B, n))
    return {"builder": (jax.jit(chain), (x,)), "vmap": (jax.jit(jax.vmap(chain)), (xb,)),
            "jvp": (jax.jit(lambda u, t: jax.jvp(chain, (u,), (t,))), (x, jnp.ones(n))),
            "grad": (jax.jit(jax.grad(chain)), (x,)), "plain": (jax.jit(jax.grad(lambda u: chain(u))), (x,)),
            "float lr": (jax.jit(jax.grad(lambda u, a: jnp.sum(a * u * u))), (x, 0.5))}


def main():
    print("grad(f)(x) per call / (one replay of its graph + copy of the result), target <= 1.3:")
    for n in (16, 100_000):
        r = grad_call_vs_replay(n)
        print(f"  n = {n:>7}: {r:.2f}x  {'ok' if r <= TARGET else 'OVER'}")
    print(f"W-chain (20 calls) rebuilt with the same layout: {rebuild_speedup():.1f}x faster than fusing anew")
    print("a cached call at n = 8, new values each call: / (replay of the prebuilt graph + copy), / jax.jit")
    for name, (r, j) in entry_point_costs().items():
        jt = f"{j:.2f}x" if j is not None else "no JAX"
        print(f"  {name:>8}: {r:6.2f}x  {'ok' if r <= TARGET else 'OVER'}   vs jax.jit {jt}")
    (k, c), ratio, _ = oscillator_fit()
    print(f"oscillator fit ({STEPS} steps, {B} trajectories, {TURNS}-turn counted loop): k = {k[0]:.4f}, "
          f"c = {c[0]:.4f}")
    if ratio is not None:
        print(f"  eagle_fx.grad per step / jax.jit(jax.grad) per step: {ratio:.1f}x")


if __name__ == "__main__":
    main()
