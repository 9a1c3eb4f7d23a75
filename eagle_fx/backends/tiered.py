"""backend="auto": a graph starts on the NumPy backend and tiers up to XLA when it runs hot.

The NumPy backend has no compile latency; the JAX backend compiles once and then replays fast,
above all at small n, where the NumPy backend pays the interpreter. `TieredExecutable` gets both:

1. it lowers the Program for NumPy (numpy.py) and replays there, timing each replay;
2. once the graph has been replayed `replays` times AND those replays took `seconds` in all (the
   replays x their measured cost: a graph replayed often, or slowly), its Program is compiled for
   XLA (jax.py, NumPy-argument mode) on one background worker thread, while replays go on;
3. the next replay that starts after the compile finishes swaps the JAX executable in, between
   two replays (replays hold the executable's lock, so a swap never lands inside one);
4. it then times `trial` replays on XLA and keeps whichever backend's fastest replay was faster
   (XLA's dispatch costs more than a tiny NumPy replay; the fastest, not the median, so that other
   work on the machine during either series does not decide); after that it times nothing.

Both executables share the caller's arrays (cells, Mutable arguments, buffer= arrays: written in
place by either) and the result arrays: the JAX executable copies its results into the NumPy
executable's result buffers, so `g.result` is the same arrays before and after the swap, and a
swap changes no value beyond the documented ulps of XLA's transcendentals. `bind` rebinds both.

What never tiers (it stays on NumPy): jax not installed (silently); graphs with host nodes
(opaque: they would run through a host callback); and, with one warning naming the graph, a
Program XLA cannot take (a lowering or compile error in the background) or whose planes the two
backends would hold in different arrays. Nothing is lost: the NumPy executable never stopped.
"""
from __future__ import annotations

import atexit
import importlib.util
import queue
import threading
import time
import warnings

import numpy as np

from hawk_fx.core import Var

from ..ir import primitives as ir
from . import registry

__all__ = ["TierPolicy", "TieredExecutable", "tier_policy", "policy"]


class TierPolicy:
    """When a graph tiers up: after `replays` replays that took `seconds` in all on NumPy;
    `background`: compile on the worker thread (False: at the replay that crosses the threshold,
    in the caller's thread; for tests); `trial`: replays timed on XLA before the faster backend is
    kept (0: keep XLA without a trial)."""

    def __init__(self, seconds=0.02, replays=8, background=True, trial=8):
        self.seconds, self.replays, self.background, self.trial = float(seconds), int(replays), background, int(trial)

    def __repr__(self):
        return (f"TierPolicy(seconds={self.seconds}, replays={self.replays}, background={self.background}, "
                f"trial={self.trial})")


_POLICIES = [TierPolicy()]


def policy() -> TierPolicy:
    """The policy graphs built now take (the innermost `tier_policy`)."""
    return _POLICIES[-1]


class tier_policy:
    """`with tier_policy(seconds=0, replays=1):` graphs built inside (backend="auto") tier up with
    these settings; the others keep the defaults (TierPolicy)."""

    def __init__(self, **settings):
        base = vars(policy()).copy()
        unknown = set(settings) - set(base)
        if unknown:
            raise TypeError(f"eagle_fx tier_policy: unknown setting(s) {', '.join(sorted(unknown))}; it takes "
                            f"{', '.join(base)}")
        base.update(settings)
        self.policy = TierPolicy(**base)

    def __enter__(self):
        _POLICIES.append(self.policy)
        return self.policy

    def __exit__(self, *exc):
        _POLICIES.remove(self.policy)
        return False


_JAX = None


def jax_available() -> bool:
    global _JAX
    if _JAX is None:
        _JAX = importlib.util.find_spec("jax") is not None
    return _JAX


# -- the one background worker: compiles run one at a time, off the replaying threads -------------

_JOBS: queue.Queue = queue.Queue()
_WORKER: list = []


def _work():
    while True:
        job = _JOBS.get()
        try:
            job()
        finally:
            _JOBS.task_done()


def _submit(job):
    if not _WORKER or not _WORKER[0].is_alive():
        t = threading.Thread(target=_work, name="eagle_fx-tier-up", daemon=True)
        t.start()
        _WORKER[:] = [t]
    _JOBS.put(job)


def wait_for_compiles():
    """Block until every background compile queued so far has finished (tests, benchmarks; and at
    exit, so that the interpreter never stops inside XLA's compiler)."""
    if _WORKER and _WORKER[0].is_alive():
        _JOBS.join()


atexit.register(wait_for_compiles)


def _has_host_nodes(prog) -> bool:
    for e in prog.eqns:
        if e.prim is ir.opaque_p:
            return True
    return any(_has_host_nodes(p) for p in prog.subprograms())


def describe(prog, names) -> str:
    """How a warning names a graph: its arguments and where its first kernel call was staged."""
    args = ", ".join(x for x in names or () if x) or "no named arguments"
    where = next((e.info.where for e in prog.eqns if e.info.where), None)
    return f"over ({args})" + (f" staged at {where}" if where else "")


class TieredExecutable:
    """The executable of backend="auto" (protocol.py): NumPy first, XLA once hot (module docstring)."""

    def __init__(self, prog, input_arrays, keep, n, names=None):
        self.prog, self.n, self.names = prog, n, list(names or [])
        self.keep = set(keep)
        self.numpy = registry.make(registry.get("numpy"), prog, input_arrays, keep, n)
        self.jax = None                 # the JAX executable, once compiled and swapped in
        self.current = self.numpy
        self.arrays = list(input_arrays)
        self.policy = policy()
        self.state = "numpy"            # numpy -> compiling -> trial -> jax | numpy (settled)
        self.reason = None              # why it settled on NumPy (None: it did not, or it was faster)
        self._lock = threading.Lock()
        self._ready = None              # the compiled JAX executable, waiting for a replay boundary
        self._failure = None            # the exception the background compile raised
        self._spent = 0.0               # seconds of NumPy replays so far
        self._replays = 0
        self._np_costs: list = []       # seconds per replay of recent NumPy replays
        self._jax_costs: list = []      # the same on XLA, during the trial
        self._shown: set = set()        # the planes array_of handed out while on NumPy
        self.settled = not jax_available() or _has_host_nodes(prog)
        if self.settled:
            self.reason = "jax is not installed" if not jax_available() else "the graph has host nodes"

    @property
    def backend_name(self) -> str:
        return "auto/jax" if self.current is self.jax else "auto/cpu"

    @property
    def source(self) -> str:
        """The NumPy backend's generated replay function (what `Lowered.as_text()` shows)."""
        return self.numpy.source

    # -- the protocol ---------------------------------------------------------------------------
    def replay(self, times: int = 1):
        with self._lock:
            if not self.settled and (self._ready is not None or self._failure is not None):
                self._swap()
            if self.settled:
                return self.current.replay(times)
            exe = self.current
            t = time.perf_counter()
            exe.replay(times)
            cost = (time.perf_counter() - t) / max(times, 1)
            if times:
                self._observe(exe, cost, times)

    def rebind(self, input_index: int, arr):
        with self._lock:
            self.numpy.rebind(input_index, arr)
            self.arrays[input_index] = arr
            if self.jax is not None:
                try:
                    self.jax.rebind(input_index, arr)
                except ValueError as e:       # e.g. written arguments that now share memory: NumPy's semantics
                    self._settle_numpy(f"bind: {e}", warn=False)

    def array_of(self, var):
        if not self.settled:
            self._shown.add(var)        # held by someone now: XLA must keep it current from its first replay
        return self.current.array_of(var)

    @property
    def take(self):
        """What gives a result of the last replay away (Graph.result_copy): on XLA, with no copy
        where it can (JaxExecutable.take); on NumPy before it settled, a copy that hands nothing out
        (so XLA need not keep the plane's array current once swapped in); None once settled on NumPy."""
        if self.current is not self.numpy:
            return self.current.take
        return None if self.settled else self._copy_of

    def _copy_of(self, var):
        arr = self.numpy.array_of(var)
        return None if arr is None else np.array(arr)

    def release(self, min_bytes: int) -> None:
        self.numpy.release(min_bytes)

    @property
    def release_needed(self) -> bool:
        """Whether `release` has anything to drop (the staging cache asks after every call)."""
        return getattr(self.numpy, "release_needed", True)

    # -- tiering --------------------------------------------------------------------------------
    def _observe(self, exe, cost, times):
        if exe is self.numpy:
            self._spent += cost * times
            self._replays += times
            self._np_costs = (self._np_costs + [cost])[-16:]
            p = self.policy
            if self.state == "numpy" and self._replays >= p.replays and self._spent >= p.seconds:
                self.state = "compiling"
                if p.background:
                    _submit(self._compile)
                else:
                    self._compile()
            return
        self._jax_costs.append(cost)
        if len(self._jax_costs) > self.policy.trial:  # the first XLA replay warms up: not counted
            # the fastest replay of each: what a replay costs when nothing else holds the CPU
            if min(self._jax_costs[1:]) > min(self._np_costs):
                self._settle_numpy("NumPy replays were faster", warn=False)
            else:
                self.state, self.settled = "jax", True

    def _compile(self):
        """Lower and compile for XLA over a snapshot of the bound arrays (the worker thread)."""
        try:        # made in this worker thread: CONTEXT.lazy_compile is unset here, so it compiles now
            exe = registry.make(registry.get("jax"), self.prog, list(self.arrays), self.keep, self.n, self.names)
        except Exception as e:           # noqa: BLE001  (any failure keeps the graph on NumPy)
            self._failure = e
            return
        self._ready = exe

    def _swap(self):
        """At a replay boundary (the lock is held): take the compiled executable, or settle on NumPy."""
        exe, failure = self._ready, self._failure
        self._ready = self._failure = None
        if failure is not None:
            self._settle_numpy(f"XLA could not compile it ({type(failure).__name__}: {failure})")
            return
        try:
            for i, a in enumerate(self.arrays):           # binds made while it compiled
                if exe.arrays[i] is not a:
                    exe.rebind(i, a)
        except ValueError as e:
            self._settle_numpy(f"its arguments: {e}")
            return
        why = self._share_arrays(exe)
        exe.show(self._shown)
        if why is not None:
            self._settle_numpy(why)
            return
        self.jax = self.current = exe
        if self.policy.trial <= 0:
            self.state, self.settled = "jax", True
        else:
            self.state = "trial"

    def _share_arrays(self, exe):
        """Make the JAX executable write its results into the NumPy executable's result arrays, so a
        plane reads as the same array on either; the reason it cannot, or None."""
        for v, dst in list(exe.stable.items()):
            mine = self.numpy.array_of(v)
            if mine is not None and mine.shape == dst.shape and mine.dtype == dst.dtype:
                exe.stable[v] = mine
        exe.results_moved()
        if len({id(a) for a in exe.stable.values()}) != len(exe.stable):
            return "two of its planes share one NumPy buffer"
        for v in [*self.prog.outputs, *self.keep]:
            if isinstance(v, Var) and self.numpy.array_of(v) is not exe.array_of(v, show=False):
                return f"the plane {v} would live in another array on XLA"
        return None

    def _settle_numpy(self, why, warn=True):
        if self.jax is not None:          # the result arrays are the NumPy executable's too: make them current
            self.jax.catch_up()
        self.current, self.jax, self.state, self.settled, self.reason = self.numpy, None, "numpy", True, why
        if warn:
            warnings.warn(f"eagle_fx backend='auto': the graph {describe(self.prog, self.names)} stays on the NumPy "
                          f"backend: {why}. Its results are the NumPy backend's; pass backend='numpy' to pin it "
                          "there and not try again", RuntimeWarning, stacklevel=4)
