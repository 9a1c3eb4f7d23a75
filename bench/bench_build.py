"""Build time against program size: a builder whose Python loop stages N kernel calls.

    python bench/bench_build.py              # N = 250 ... 8000, three repeats each
    python bench/bench_build.py --quick      # N = 250 ... 2000, two repeats
    python bench/bench_build.py --no-jax     # without the jax.jit column

Per N: the build timed apart (stage: running the builder into a Program; fuse: the NumPy backend's
fusion pass; lower: the rest of lowering, the fused kernel's generated code included; replay: the
first launch), the memo of fused bodies cleared before each build, as a new program finds it. Beside
it `jax.jit` of the same unrolled loop (y * 1.01 + 0.5, N times): trace + compile, a new function per
repeat so nothing is cached. Prints the medians' ratios: build time per call against the smallest N
(flat when every pass is linear) and eagle build / jax.jit trace+compile at the same N.
Targets: per-call time within 1.5x of the smallest N's; N = 3000 builds in <= 1.5 s and faster
than jax.jit's trace + compile.
"""
import sys
import time

import numpy as np

import eagle_fx as eagle
import hawk_fx as hawk
from eagle_fx.backends import fusion
from eagle_fx.backends import numpy as np_backend
from hawk_fx import Scalar

QUICK = "--quick" in sys.argv
SIZES = (250, 500, 1000, 2000) if QUICK else (250, 500, 1000, 2000, 3000, 4000, 8000)
REPEAT = 2 if QUICK else 3
TARGET_N, TARGET_S = 3000, 1.5


@hawk.kernel
def step(y: Scalar) -> Scalar:
    return y * 1.01 + 0.5


def chain(N):
    """A new builder staging N calls of `step` (a new one each time: nothing cached at the builder)."""
    @eagle.Graph.builder
    def build(y):
        g = eagle.Graph()
        for _ in range(N):
            y = step(y)
        g.result = y
        return g
    return build


class _Phases:
    """Times the NumPy backend's lowering and its fusion pass while a builder runs."""

    def __init__(self):
        self.fuse = self.lower = 0.0

    def __enter__(self):
        self._fuse, self._init = np_backend.fused, np_backend.NumpyExecutable.__init__
        phases = self

        def fuse(*a, **k):
            t = time.perf_counter()
            try:
                return phases._fuse(*a, **k)
            finally:
                phases.fuse += time.perf_counter() - t

        def init(exe, *a, **k):
            t = time.perf_counter()
            try:
                phases._init(exe, *a, **k)
            finally:
                phases.lower += time.perf_counter() - t
        np_backend.fused, np_backend.NumpyExecutable.__init__ = fuse, init
        return self

    def __exit__(self, *exc):
        np_backend.fused, np_backend.NumpyExecutable.__init__ = self._fuse, self._init


def eagle_build(N, x):
    """(stage, fuse, lower, replay) seconds of one cold build of the N-call chain."""
    builder = chain(N)
    fusion._FUSED.clear()
    fusion._BY_PROGRAM.clear()
    with _Phases() as ph:
        t0 = time.perf_counter()
        g = builder(x)
        t1 = time.perf_counter()
    g.launch()
    t2 = time.perf_counter()
    want = x.copy()
    for _ in range(N):
        want = want * 1.01 + 0.5
    np.testing.assert_allclose(g.result, want, rtol=1e-12)
    return (t1 - t0 - ph.lower, ph.fuse, ph.lower - ph.fuse, t2 - t1)


def jax_build(N, x):
    """Seconds of jax.jit trace + compile of the same unrolled loop (None without JAX)."""
    try:
        import jax
    except ImportError:
        return None
    jax.config.update("jax_enable_x64", True)

    def f(y):
        for _ in range(N):
            y = y * 1.01 + 0.5
        return y
    t = time.perf_counter()
    jax.jit(f).lower(x).compile()
    return time.perf_counter() - t


def main():
    x = np.linspace(-1.0, 1.0, 64)
    eagle_build(10, x)                       # imports and first-use costs outside the series
    use_jax = "--no-jax" not in sys.argv and jax_build(10, x) is not None
    print(f"{'N':>6} {'stage':>8} {'fuse':>8} {'lower':>8} {'replay':>8} {'build':>8} {'us/call':>8} "
          f"{'vs N0':>6} {'jax.jit':>8} {'eagle/jax':>9}")
    base = None
    met = {}
    for N in SIZES:
        runs = [eagle_build(N, x) for _ in range(REPEAT)]
        phases = np.median(np.array(runs), axis=0)
        total = float(np.median([sum(r) for r in runs]))
        per_call = total / N
        base = base or per_call
        jt = float(np.median([jax_build(N, x) for _ in range(REPEAT)])) if use_jax else None
        ratio = f"{total / jt:9.2f}" if jt else f"{'-':>9}"
        print(f"{N:>6} " + " ".join(f"{p:8.3f}" for p in phases) + f" {total:8.3f} {per_call * 1e6:8.1f} "
              f"{per_call / base:6.2f} " + (f"{jt:8.3f}" if jt else f"{'-':>8}") + f" {ratio}")
        if N == TARGET_N:
            met = {"time": total <= TARGET_S, "jax": jt is None or total < jt}
    if met:
        print(f"N = {TARGET_N}: build {'<=' if met['time'] else '>'} {TARGET_S} s ("
              f"{'met' if met['time'] else 'missed'}); "
              + ("faster than jax.jit trace+compile (met)" if met["jax"] else "slower than jax.jit (missed)"))


if __name__ == "__main__":
    main()
