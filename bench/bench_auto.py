"""backend="auto" beside the NumPy and JAX backends, as ratios to hand-written jax.jit, in one process.

    python bench/bench_auto.py            # every workload at n = 8 and 1e6; --quick: fewer repeats
    python bench/bench_auto.py --best     # the fastest batch of calls, not the median (a loaded machine)

Per workload and n: the steady-state median time per call of each backend over hand-written
jax.jit on jax.Arrays (auto after it settled: the backend it kept is printed), the backend auto
settled on and how long it took to get there (replays, seconds, compiling in the background while
it replays), and auto's first call (stage + lower + first replay) over the NumPy backend's first
call. `copy` is what the JAX backend's NumPy semantics cost per replay: its replay over the bare
compiled call on the same arrays (results and written arguments copied back into NumPy arrays).
Targets: auto <= 1.2x jax.jit steady state on every workload, its first call <= 1.5x the NumPy
backend's, and the geometric mean of auto's ratios <= 1.0x jax.jit.
"""
import sys
import time
import timeit

import numpy as np

import jax

jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402

import eagle_fx as eagle  # noqa: E402
from eagle_fx.backends.select import use_backend  # noqa: E402
from eagle_fx.frontend.cache import clear_caches  # noqa: E402
from eagle_fx.backends import tiered  # noqa: E402
from bench_jax import hand_chain, hand_fork, hand_loop  # noqa: E402  (the hand-written jax.jit workloads)
from workloads import l_chain, w_chain, w_fork, w_loop, w_trans  # noqa: E402


@jax.jit
def hand_trans(x):
    return jnp.exp(-(jnp.sin(x) * x) ** 2)


def _l_chain(x):
    for _ in range(10):
        x = 2.0 * x + 1.0
    return jnp.sum(x * x)


hand_grad = jax.jit(jax.grad(_l_chain))

FLAG = np.array([1], np.uint32)
FLAG_J = jnp.asarray(FLAG)
WORKLOADS = [   # name, builder (None: the gradient), its extra arguments, the hand-written call
    ("chain", w_chain, (), lambda xj: hand_chain(xj)),
    ("trans", w_trans, (), lambda xj: hand_trans(xj)),
    ("loop", w_loop, (FLAG,), lambda xj: hand_loop(xj, FLAG_J)),
    ("fork", w_fork, (), lambda xj: hand_fork(xj)),
    ("gradient", None, (), lambda xj: hand_grad(xj)),
]


MADE = []      # the tiered executables made, newest last (to read which backend auto kept)
_init = tiered.TieredExecutable.__init__


def _record(self, *args, **kw):
    _init(self, *args, **kw)
    MADE[:] = [self]


tiered.TieredExecutable.__init__ = _record


def build(builder, x, extra, backend):
    """A workload's first call (stage, lower, first replay): (a call of it, its graph or None)."""
    if builder is None:             # the gradient: a transformed function, its graph cached per backend
        f = eagle.grad(l_chain)

        def call():
            with use_backend(backend):
                return f(x)
        call()
        return call, None
    with use_backend(backend):
        g = builder(x, *[np.array(a) for a in extra])
    g()
    return g, g


def first_calls(builder, x, extra, reps):
    t = {"numpy": [], "auto": []}
    for _ in range(reps):
        for b in t:
            clear_caches()
            t0 = time.perf_counter()
            build(builder, x.copy(), extra, b)
            t[b].append(time.perf_counter() - t0)
    return float(np.median(t["auto"]) / np.median(t["numpy"]))


def settle(fn, exe, limit=60.0):
    """Replay until auto has settled on a backend: (replays, seconds)."""
    t0, k = time.perf_counter(), 0
    while not exe.settled and time.perf_counter() - t0 < limit:
        fn()
        k += 1
    return k, time.perf_counter() - t0


BEST = "--best" in sys.argv     # the fastest batch instead of the median (a machine under load)


def interleaved(fns, number, repeat):
    """Per function, the median (--best: the fastest) of `repeat` batches of `number` calls, the
    functions taking turns batch by batch. On a loaded machine a batch that the scheduler
    preempts pays milliseconds, and a longer batch is preempted more often: the median then
    inflates the slower functions most; the fastest batch is what a call costs."""
    times = [[] for _ in fns]
    for fn in fns:
        fn()
    for _ in range(repeat):
        for k, fn in enumerate(fns):
            times[k].append(timeit.timeit(fn, number=number) / number)
    return [float(np.min(t) if BEST else np.median(t)) for t in times]


def main(quick=False):
    rng = np.random.default_rng(0)
    ratios = []
    print(f"steady state: {'fastest batch' if BEST else 'median'} per call / hand-written jax.jit on jax.Arrays (one "
          "process); first: auto's first call / numpy's")
    for n in (8, 1_000_000):
        number, repeat = ((50, 31) if quick else (100, 101)) if n <= 1000 else ((2, 7) if quick else (2, 21))
        for name, builder, extra, hand in WORKLOADS:
            x = rng.uniform(0, 1, n)
            xj = jnp.asarray(x)
            first = first_calls(builder, x, extra, 3 if quick else 5)
            clear_caches()
            fns = {b: build(builder, x.copy(), extra, b) for b in ("numpy", "jax", "auto")}
            exe = MADE[0]
            k, secs = settle(fns["auto"][0], exe)
            kept = {"auto/cpu": "numpy", "auto/jax": "XLA"}[exe.backend_name]
            calls = [fns[b][0] for b in ("numpy", "jax", "auto")]
            med = interleaved([lambda: jax.block_until_ready(hand(xj))] + calls, number, repeat)
            r = [m / med[0] for m in med[1:]]
            ratios.append(r[2])
            copy = copy_cost(fns["jax"][1])
            print(f"{name:<9} n={n:<8} numpy {r[0]:6.2f}   jax {r[1]:6.2f}   auto {r[2]:6.2f} (on {kept}, settled after "
                  f"{k} replays, {secs:.2f} s)   first auto/numpy {first:5.2f}   jax copy-back {copy}", flush=True)
    geo = float(np.exp(np.mean(np.log(ratios))))
    print(f"geomean auto / jax.jit over the workloads above: {geo:.2f}")
    build_row(rng, 3 if quick else 7)


def copy_cost(g):
    """jax backend (NumPy arguments): its replay over the bare compiled call on the same arrays."""
    if g is None:
        return "   -"
    exe = g._exe
    run = exe._compiled
    ins = list(exe._aligned_inputs())       # the arguments as a replay passes them (aligned spans)

    def bare():
        jax.block_until_ready(run(*ins))
    a, b = interleaved([lambda: exe.replay(1), bare], 20, 21)
    return f"{a / b:5.2f}"


def build_row(rng, reps):
    """build: stage + lower (+ compile) of W-chain, against jax.jit(f).lower(x).compile()."""
    th, tn, ta, tj = [], [], [], []
    for k in range(reps):
        x = rng.uniform(0, 1, 1_000_000 + k + 1)
        xj = jnp.asarray(x)
        t0 = time.perf_counter()
        jax.jit(hand_chain.__wrapped__).lower(xj).compile()
        th.append(time.perf_counter() - t0)
        for b, t in (("numpy", tn), ("auto", ta), ("jax", tj)):
            clear_caches()
            t0 = time.perf_counter()
            with use_backend(b):
                w_chain(x)
            t.append(time.perf_counter() - t0)
    h = float(np.median(th))
    print(f"{'build':<9} n=1e6      numpy {np.median(tn) / h:6.2f}   jax {np.median(tj) / h:6.2f}   auto "
          f"{np.median(ta) / h:6.2f}   (stage + lower (+ compile), against jax.jit(f).lower(x).compile())", flush=True)


if __name__ == "__main__":
    main(quick="--quick" in sys.argv)
