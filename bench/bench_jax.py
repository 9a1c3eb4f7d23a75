"""The jax backend against the same computations hand-written with jax.jit, in one process.

    python bench/bench_jax.py            # all workloads; --quick: fewer repeats

Prints, per workload, the median time ratio (eagle / hand-written jax.jit) over repeats, for the
jax backend on jax.Array arguments (results stay on the device), on NumPy arguments (the NumPy
semantics: arrays in, written arrays and results copied back), and the NumPy backend beside them.
Targets (jax backend, jax.Arrays): W-chain (20 kernels) n = 1e6 <= 1.3; W-loop (50 capped turns)
n = 8 <= 1.5 and n = 1e6 <= 1.2; W-fork (3 branches x 4 kernels) n = 1e6 <= 1.2; forward + reverse
of sum(exp(-(sin(x) x)^2)) n = 1e6 via to_jax <= 1.3 of jax.jit(jax.value_and_grad); and the build
(trace + compile) time of W-chain against jax.jit(...).lower(x).compile(). The `donation` row is
the NumPy-argument path's replay with its written argument donated, over the same replay without.
"""
import sys
import time
import timeit

import numpy as np

import jax

jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402
from jax import lax  # noqa: E402

import eagle_fx as eagle  # noqa: E402
import hawk_fx as hawk  # noqa: E402
from eagle_fx.backends.select import use_backend  # noqa: E402
from hawk_fx import Mutable, Scalar  # noqa: E402
from workloads import k1, k2, w_chain, w_fork, w_loop  # noqa: E402


@hawk.kernel
def total(y: Scalar) -> Scalar:
    return hawk.sum(y)


@hawk.kernel
def bump(x: Scalar, y: Mutable[Scalar]):
    y = y + 0.5 * x


@eagle.Graph.builder
def w_mutable(x, y):
    """The chain, then a Mutable argument written in place: what donation could save is y's buffer."""
    g = eagle.Graph()
    bump(w_chain_body(g, x), y)
    return g


@eagle.Graph.builder
def w_chain_body(g: eagle.Graph, x):
    for _ in range(10):
        x = k2(k1(x))
    return x


@eagle.Graph.builder
def l_trans(x):
    g = eagle.Graph()
    g.result = total(k2(k1(x)))
    return g


# -- the same computations, hand-written --------------------------------------------------------------

@jax.jit
def hand_chain(x):
    for _ in range(10):
        x = 2.0 * x + 1.0
    return x


@jax.jit
def hand_loop(x, flag):
    def test(s):
        t, x, f = s
        return (t < 50) & (f[0] != 0)

    def step(s):
        t, x, f = s
        x = 0.5 * x + 1.0
        return t + 1, x, jnp.sum(x < 1e9).astype(jnp.uint32).reshape(1)
    _, x, f = lax.while_loop(test, step, (0, x, flag))
    return x, f


@jax.jit
def hand_fork(x):
    a = 2.0 * (2.0 * x + 1.0) + 1.0               # inc(dbl(inc(dbl(x))))
    b = 2.0 * (2.0 * (x + 1.0) + 1.0)             # dbl(inc(dbl(inc(x))))
    c = x
    for _ in range(4):
        c = 0.5 * c + 1.0
    return a, b, c


def hand_loss(x):
    return jnp.sum(jnp.exp(-(jnp.sin(x) * x) ** 2))


hand_vg = jax.jit(jax.value_and_grad(hand_loss))


# -- timing -------------------------------------------------------------------------------------------

def blocking(fn):
    return lambda: jax.block_until_ready(fn())


def row(label, n, hand, eagle_fns, quick):
    """Repeats interleave the hand-written function and each eagle one, so that load from other
    processes falls on all of them alike; the ratio is of the medians. At small n a repeat is a few
    hundred microseconds, at n = 1e6 two calls (many short repeats), so that a change of load falls
    on both sides."""
    number, repeat = ((20, 101) if quick else (20, 301)) if n <= 1000 else ((2, 15) if quick else (2, 61))
    fns = [blocking(hand)] + [blocking(fn) for _, fn in eagle_fns if fn is not None]
    times = [[] for _ in fns]
    for fn in fns:
        fn()
    for _ in range(repeat):
        for k, fn in enumerate(fns):
            times[k].append(timeit.timeit(fn, number=number) / number)
    med = [float(np.median(t)) for t in times]
    cells, k = [], 1
    for name, fn in eagle_fns:
        if fn is None:
            cells.append(f"{name} {'-':>6}")
            continue
        cells.append(f"{name} {med[k] / med[0]:6.2f}")
        k += 1
    print(f"{label:<12} n={n:<8} " + "   ".join(cells), flush=True)


def graphs(builder, *args):
    """The graph on the jax backend with jax.Arrays, with NumPy arrays, and on the NumPy backend."""
    on_jax = builder(*[jnp.asarray(a) for a in args])
    with use_backend("jax"):
        jax_np = builder(*[np.array(a) for a in args])
    numpy = builder(*[np.array(a) for a in args])
    return [("jax/jax.Array", on_jax), ("jax/NumPy", jax_np), ("numpy", numpy)]


def main(quick=False):
    rng = np.random.default_rng(0)
    print("eagle / hand-written jax.jit (medians of repeats; one process)")
    for n in (1_000_000,):
        x = rng.uniform(0, 1, n)
        gs = graphs(w_chain, x)
        xj = jnp.asarray(x)
        row("W-chain", n, lambda: hand_chain(xj), [(k, g) for k, g in gs], quick)
    for n in (8, 1_000_000):
        x = rng.uniform(0, 1, n)
        gs = graphs(w_loop, x, np.array([1], np.uint32))
        xj, fj = jnp.asarray(x), jnp.asarray(np.array([1], np.uint32))
        row("W-loop", n, lambda: hand_loop(xj, fj), [(k, g) for k, g in gs], quick)
    for n in (1_000_000,):
        x = rng.uniform(0, 1, n)
        gs = graphs(w_fork, x)
        xj = jnp.asarray(x)
        row("W-fork", n, lambda: hand_fork(xj), [(k, g) for k, g in gs], quick)
    for n in (1_000_000,):
        x = rng.uniform(0, 1, n)
        xj = jnp.asarray(x)
        ours = jax.jit(jax.value_and_grad(lambda u: eagle.to_jax(l_trans)(u)[0]))
        vg = eagle.make_graph(eagle.grad(l_trans))(x)             # the NumPy backend's gradient graph
        row("fwd+rev", n, lambda: hand_vg(xj), [("to_jax", lambda: ours(xj)), ("jax/NumPy", None),
                                                  ("numpy", lambda: (vg(), l_trans(x)()))], quick)
    donation(rng, quick)
    # build: stage + lower + compile the 20-kernel chain, against lowering + compiling the hand-written
    # one; each repeat has another n, so that no compile is served from JAX's cache
    reps = 3 if quick else 7
    th, tj, tn = [], [], []
    for k in range(reps):
        x = rng.uniform(0, 1, 1_000_000 + k + 1)
        xj = jnp.asarray(x)
        th.append(_once(lambda: jax.jit(hand_chain.__wrapped__).lower(xj).compile()))
        tj.append(_once(lambda: w_chain(xj)))
        tn.append(_once(lambda: w_chain(x)))
    th, tj, tn = (float(np.median(t)) for t in (th, tj, tn))
    print(f"{'build W-chain':<12} n=1e6      jax/jax.Array {tj / th:6.2f}   numpy {tn / th:6.2f}   "
          "(stage + lower + compile, against jax.jit(f).lower(x).compile())", flush=True)


def donation(rng, quick):
    """Buffer donation on the NumPy-argument path: the graph's replays as built (its written
    argument donated: the device copy a replay makes of it is its own) over the same replays with
    the executable compiled without donation. Printed as donated / not donated."""
    n = 1_000_000
    with use_backend("jax"):
        g = w_mutable(rng.uniform(0, 1, n), np.zeros(n))
    exe = g._exe
    donated = exe.compile()
    assert exe.donated, "the written argument is not donated"
    structs = [jax.ShapeDtypeStruct(np.shape(a), np.dtype(a.dtype)) for a in exe.arrays]
    plain = jax.jit(exe.wrapped).lower(*exe.as_passed(structs)).compile()

    def with_(compiled):
        def replay():
            exe._compiled = compiled
            exe.replay(1)
        return replay
    number, repeat = (2, 15) if quick else (2, 61)
    fns = [with_(plain), with_(donated)]
    times = [[], []]
    for fn in fns:
        fn()
    for _ in range(repeat):
        for k, fn in enumerate(fns):
            times[k].append(timeit.timeit(fn, number=number) / number)
    exe._compiled = donated
    ratio = float(np.median(times[1]) / np.median(times[0]))
    print(f"{'donation':<12} n={n:<8} jax/NumPy, written argument donated / not donated {ratio:6.2f}", flush=True)


def _once(fn):
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


if __name__ == "__main__":
    main(quick="--quick" in sys.argv)
