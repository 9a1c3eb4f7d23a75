"""eagle_fx.simulate: run per-sample dynamics until every sample is done, as one staged graph.

Device loops run exactly the bound's steps (turns of `every` steps, then the rest), each leaving
once every sample's done mark is set (`hawk_fx.all_done`). A step advances the samples whose mark
is clear: the user's step (a kernel or a function staging kernels) may set the mark, `until` or
an event may set it after the step, and a counting kernel counts the step for the samples still
running. At the end a sample whose mark is set is finished, its last step counted; the others ran
into the bound. Everything is kernels on planes, so the loops compose with the derivative and
batching transforms and every backend like any builder's loop.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

import hawk_fx as hawk
import hawk_fx.math as hm
from hawk_fx.caches import LRU
from hawk_fx.kernel import Kernel
from hawk_fx.roles import Int32, Mutable, Param, Role, Scalar, Terminated, TerminatedRole
from hawk_fx.tree import tree_flatten, tree_unflatten

from .collect import collect
from .frontend import staging
from .frontend.building import Builder
from .graph import Graph

API = "eagle_fx.simulate"
FINISHED, BUDGET, T_END = 1, 2, 3
_Bool = Role("Bool", dtype=np.bool_)          # a plain bool plane a kernel writes (the event watch)
MAX_RECORDS = 512                             # recorded states: the trajectory's buffer holds them all


@dataclasses.dataclass
class SimResult:
    """What `eagle_fx.simulate` returns, per sample (the sample axis last).

    state: the final state, a tree like the one given. steps: the steps each sample took (int32).
    status: why it stopped (int32): `SimResult.FINISHED` (1: its step set the mark, or `until`
    held), `SimResult.BUDGET` (2: `max_steps` reached), `SimResult.T_END` (3: `t_end` reached).
    finished: status == FINISHED. t: steps * dt (None without `dt`). trajectory: with `record=K`,
    the state after every K steps, each leaf stacked on a new first axis, (rows, ..., n) as
    lax.scan stacks (a sample that stopped reads its final state in the later rows); else None.
    t_event: with `event=`, the time its event function crossed zero (NaN where it did not); the
    state of such a sample is the state at that time."""

    state: object
    steps: object
    status: object
    finished: object
    t: object = None
    trajectory: object = None
    t_event: object = None

    FINISHED = FINISHED
    BUDGET = BUDGET
    T_END = T_END


@hawk.kernel
def _fresh(x: Scalar):
    """A clear mark per sample, made anew at every replay."""
    return False


@hawk.kernel
def _along(done: Scalar, x: Scalar):
    return done


@hawk.kernel
def _counters(done: Scalar):
    """Zero steps per sample."""
    return np.int32(0)


def _samples_of(x):
    """A (n,) slice of a plane: what the mark is made along."""
    while x.ndim > 1:
        x = x[0]
    return x


@hawk.kernel
def _count(steps: Mutable[Int32], done: Scalar):
    """A step, counted for the samples still running after it (one that finished in it is counted
    at the end: its mark is set). The mark is added as a number, not a Terminated gate: no select."""
    steps = steps + hm.logical_not(done)


@hawk.kernel
def _count_hit(steps: Mutable[Int32], hit: Scalar, done: Mutable[_Bool]):
    """As _count, and a sample where `hit` holds (until, an event) is marked finished; the mark
    is read as a number here too, not a Terminated gate."""
    stops = done | hit
    steps = steps + hm.logical_not(stops)
    done = stops


@hawk.kernel
def _final(steps: Scalar, done: Scalar, code: Param):
    """The step counts (a finished sample's last step counted) and the status: finished where the
    mark is set, else the bound's code (the loops ran exactly the bound's steps)."""
    return hm.where(done, steps + 1, steps), hm.int32(hm.where(done, FINISHED, code))


_ALWAYS = np.ones(1, np.uint32)               # the guard of the recording loop: it runs all its rows


@Builder
def _recorded(g: Graph, run, record, rows, planes, always):
    """`rows` turns of `record` steps, each turn's state collected: (rows, ..., n) per plane. Every
    row runs (a finished sample is left untouched), so a finished sample's later rows read its
    final state."""
    for _ in range(rows):
        if not always:
            break
        run(record)
        kept = [collect(x) for x in planes]
    return kept


@hawk.kernel
def _few_active(done: Scalar, most: Param):
    """The guard of a compacted run's segment: 1 once at most `most` samples are still running."""
    return hm.uint32(hawk.sum(hm.logical_not(done)) <= most)


@Builder
def _loop(g: Graph, advance, done, steps, count, cap, every, stop_active=0):
    guard = hawk.all_done if not stop_active else lambda mark: _few_active(mark, stop_active)
    for _ in range(cap):
        for _k in range(every):
            advance(done)
            count(steps, done)
        if guard(done):
            break


def simulate(step, state, *, until=None, max_steps=None, t_end=None, dt=None, every=1, record=None, key=None,
             event=None, compact=False):
    """Run `step` on every sample until it marks the sample done, `until` holds, or the sample
    reaches `max_steps` steps (or `t_end`, counting `dt` per step); returns a `SimResult`.

    `state` is a tree (dict, tuple, list, ...) of planes, the sample axis last. `step` is either a
    hawk kernel with one `Terminated` parameter whose other parameters take the state's leaves
    (by name for a dict state, in order otherwise), or a function `step(state, done)` (with `key`:
    `step(state, done, key)`) that calls kernels, passing `done` as their `Terminated` argument,
    and returns the new state (a tree like `state`) or None when its kernels wrote the state's
    planes in place. `until(state)`, optional, returns a per-sample bool plane: a sample where it
    holds after a step is finished. The loop checks "every sample done" after each `every` steps
    (default 1: a turn of the device loop is a few kernel launches; a larger `every` saves the
    check, and a finished sample is left untouched either way). Samples stop exactly at their
    own step: `every` changes no value.

    `record=K` records the state after every K steps into `SimResult.trajectory`: ceil(bound / K)
    rows, at most 512, collected by one device loop (`eagle_fx.collect`).

    `event(state)` returns one float per sample: a sample whose value changes sign inside a step is
    finished there. The crossing is then refined by partial steps from the state before that step
    (the step is passed its length, `dt=`: a kernel parameter `dt: Scalar`, or the keyword `dt` of
    a step function), secant iterations and a last Newton step, so the event time
    (`SimResult.t_event`) and the state at it carry the event-time sensitivity in their
    derivatives (dt*/dp = -(dg/dp) / (dg/dt), by the implicit function theorem).

    `compact=True` (outside a builder, NumPy planes): once at most half the samples still run, the
    running ones are packed into smaller planes and the run goes on over those, so the work falls
    with the count still running (eagle_fx/compaction.py). It gives the same values, provided each
    sample's step reads only that sample's state (every per-sample plane the step reads is in the
    state; no sum over the samples).

    Called outside a builder, it builds the graph, runs it once and returns arrays; the arrays in
    `state` are not written. Inside a builder (or a function a transform stages) it stages the
    loop into that graph and returns staged planes, so `grad`, `vjp`, `jvp`, `vmap` and
    `checkpoints=K` apply to it as to any builder loop.
    """
    cfg = _config(step, state, until, max_steps, t_end, dt, every, record, key, event)
    if compact is not False:
        from .compaction import run_compacted
        return run_compacted(cfg, state, compact, staging.active_trace() is not None)
    if staging.active_trace() is not None:
        return _stage(cfg, state, staging.active_trace().graph)
    return _run(cfg, state)


@dataclasses.dataclass(frozen=True)
class _Config:
    step: object
    until: object
    every: int
    limit: int
    code: int
    dt: object
    key: object
    record: object = None
    event: object = None
    stop_active: int = 0      # a compacted run's segment stops once at most this many samples run


def _config(step, state, until, max_steps, t_end, dt, every, record, key, event) -> _Config:
    if not callable(step):
        raise TypeError(f"{API}: step is {type(step).__name__} {step!r:.60}; give a hawk kernel with a Terminated "
                        "parameter, or a function step(state, done) that calls kernels")
    if until is not None and not callable(until):
        raise TypeError(f"{API}: until is {type(until).__name__}; give a function until(state) -> a bool plane")
    if event is not None:
        if not callable(event):
            raise TypeError(f"{API}: event is {type(event).__name__}; give a function event(state) -> a float plane, "
                            "one value per sample whose zero crossing stops the sample")
        if dt is None:
            raise ValueError(f"{API}: event= without dt; give dt, the step length: the crossing is refined by partial "
                             "steps, which pass the step its length (`dt=`)")
    if type(every) is not int or every < 1:
        raise ValueError(f"{API}: every={every!r}; give the number of steps between checks, an int >= 1")
    if t_end is not None and dt is None:
        raise ValueError(f"{API}: t_end={t_end!r} without dt; give dt, the time one step advances, so the run "
                         "counts time (t = steps * dt)")
    if dt is not None and not (isinstance(dt, (int, float)) and math.isfinite(dt) and dt > 0):
        raise ValueError(f"{API}: dt={dt!r}; give a positive finite Python number")
    limits = []
    if max_steps is not None:
        if not isinstance(max_steps, (int, np.integer)) or isinstance(max_steps, bool) or max_steps < 0:
            raise ValueError(f"{API}: max_steps={max_steps!r}; give the most steps a sample may take, an int >= 0")
        limits.append((int(max_steps), BUDGET))
    if t_end is not None:
        if not isinstance(t_end, (int, float)) or not math.isfinite(t_end):
            raise ValueError(f"{API}: t_end={t_end!r}; give a finite Python number")
        # the first step count whose time reaches t_end, forgiving the rounding of t_end / dt
        limits.append((max(0, math.ceil(t_end / dt * (1 - 1e-12) - 1e-12)), T_END))
    if not limits:
        raise ValueError(f"{API}: no bound on the run; give max_steps=N (the most steps a sample may take), or "
                         "t_end with dt: an uncapped device loop whose step never marks a sample done never returns")
    limit, code = min(limits, key=lambda lc: (lc[0], lc[1] != T_END))
    if record is not None:
        if not isinstance(record, (int, np.integer)) or isinstance(record, bool) or record < 1:
            raise ValueError(f"{API}: record={record!r}; give the number of steps between recorded states, an int >= 1")
        record = int(record)
        rows = -(-limit // record)
        if rows > MAX_RECORDS:
            raise ValueError(f"{API}: record={record} over up to {limit} steps records {rows} states; at most "
                             f"{MAX_RECORDS} (the trajectory holds every row from the start, rows x the state's "
                             "size): record less often")
    return _Config(step, until, every, limit, code, dt, key, record, event)


def _leaves_of(state):
    leaves, tree = tree_flatten(state, is_leaf=lambda x: staging.is_array(x))
    if not leaves:
        raise ValueError(f"{API}: the state {state!r:.80} holds no planes; give a tree of arrays, the sample axis last")
    for x in leaves:
        if not (staging.is_array(x) or hasattr(x, "shape")) or not np.ndim(x):
            raise TypeError(f"{API}: the state holds {type(x).__name__} {x!r:.60}; every leaf is a plane, an array "
                            "whose last axis is the samples")
    ns = {x.shape[-1] for x in leaves}
    if len(ns) != 1:
        raise ValueError(f"{API}: the state's planes have different sample counts {sorted(ns)} (their last axis); "
                         "every plane has the same samples")
    return leaves, tree


def _stage(cfg: _Config, state, graph) -> SimResult:
    """Stage the run into `graph` (a builder's): copies of the state's planes, the loop, the result."""
    leaves, tree = _leaves_of(state)
    # one clear mark per sample, read from every leaf so that under vmap it is per instance when any
    # leaf is; the run writes copies made from it (never the caller's state), per instance alike
    done = _fresh(_samples_of(leaves[0]))
    for x in leaves[1:]:
        done = _along(done, _samples_of(x))
    for x in _arguments_under_vmap(graph):  # under vmap: per instance when the step may read one
        done = _along_arg(done, _samples_of(x), done.shape[-1])
    steps = _counters(done)
    planes = [_copier(tuple(x.shape[:-1]), np.dtype(x.dtype))(x, done) for x in leaves]
    first = done
    current = lambda: tree_unflatten(tree, planes)  # noqa: E731
    n = first.shape[-1]

    def apply_step(targets, mark, h):
        """One step of the samples whose mark is clear, written into the planes `targets`."""
        new = _call_step(cfg, tree_unflatten(tree, targets), mark, h)
        if new is None:
            return
        new_leaves, new_tree = tree_flatten(new, is_leaf=lambda x: staging.is_array(x))
        if new_tree != tree:
            raise TypeError(f"{API}: step {_name(cfg.step)} returned {new_tree}, the state is {tree}; return the new "
                            "state in the state's structure (or None when its kernels wrote the planes in place)")
        for k, (dst, src) in enumerate(zip(targets, new_leaves)):
            if tuple(np.shape(src)) != tuple(dst.shape):
                raise ValueError(f"{API}: step {_name(cfg.step)} returned a plane of shape {tuple(np.shape(src))} "
                                 f"for the state's leaf {k} of shape {tuple(dst.shape)}")
            if src is not dst:                       # a finished sample keeps its state, whatever the step says
                _keeper(tuple(dst.shape[:-1]), np.dtype(dst.dtype))(dst, src, mark)

    def checked(fn, what, value, dtype_ok, want):
        if tuple(np.shape(value)) != (n,) or not dtype_ok(getattr(value, "dtype", None)):
            raise ValueError(f"{API}: {what} {_name(fn)} returned {type(value).__name__} of shape "
                             f"{tuple(np.shape(value))} and dtype {getattr(value, 'dtype', None)}; it returns {want}, "
                             f"a plane of shape ({n},)")
        return value

    def event_of(state_tree):
        return checked(cfg.event, "event", cfg.event(state_tree), lambda d: d is not None and np.dtype(d).kind == "f",
                       "one float per sample")

    copy_all = lambda xs: [_copier(tuple(x.shape[:-1]), np.dtype(x.dtype))(x, done) for x in xs]  # noqa: E731
    if cfg.event is not None:
        prev = copy_all(planes)                       # the state before the current step
        g0 = event_of(current())
        g_prev = _copier((), np.dtype(g0.dtype))(g0, done)
        g_last = _copier((), np.dtype(g0.dtype))(g0, done)
        crossed = _fresh(first)

    def advance(mark):
        if cfg.event is not None:
            for p, x in zip(prev, planes):
                _keeper(tuple(x.shape[:-1]), np.dtype(x.dtype))(p, x, mark)
        apply_step(planes, mark, cfg.dt)

    def hit_of():
        hits = []
        if cfg.until is not None:
            hits.append(checked(cfg.until, "until", cfg.until(current()), lambda d: d == np.bool_,
                                "one bool per sample"))
        if cfg.event is not None:
            hits.append(_watch(g_prev, g_last, crossed, event_of(current()) * 1.0, done))
        return False if not hits else hits[0] if len(hits) == 1 else hits[0] | hits[1]

    def count(steps, mark):
        hit = hit_of()
        if hit is False:
            _count(steps, mark)
        else:
            _count_hit(steps, hit, mark)

    def run(n_steps):
        """Exactly n_steps steps (fewer once every sample is done): turns of `every` steps, then the rest."""
        turns, rest = divmod(n_steps, cfg.every)
        if turns:
            _loop(graph, advance, done, steps, count, turns, cfg.every, cfg.stop_active)
        if rest:
            _loop(graph, advance, done, steps, count, 1, rest, cfg.stop_active)

    trajectory = None
    if cfg.record is None:
        run(cfg.limit)
    elif cfg.limit:                         # a device loop of `record` steps a turn, collecting the state
        full, rest = divmod(cfg.limit, cfg.record)
        stacks = _recorded(graph, run, cfg.record, full, planes, _ALWAYS.copy()) if full else None
        if rest:                            # the last row's shorter run, its state a row of its own
            run(rest)
            last = [x.reshape((1,) + tuple(x.shape)) for x in copy_all(planes)]
            stacks = last if stacks is None else [np.concatenate([s, x]) for s, x in zip(stacks, last)]
        trajectory = tree_unflatten(tree, list(stacks))
    # the results are fresh planes, not the loop's buffers: the JAX backend reads a buffer a kernel
    # made and a loop then wrote in place as it was before the loop
    steps, status = _final(steps, done, cfg.code)
    final = copy_all(planes)
    t_event = None
    if cfg.event is not None:
        t_event = _refine(cfg, tree, prev, g_last, g_prev, crossed, steps, final, apply_step, event_of, first)
    t = None if cfg.dt is None else steps * float(cfg.dt)
    return SimResult(tree_unflatten(tree, final), steps, status, status == FINISHED, t, trajectory, t_event)


SECANT_TURNS = 6
_NAN = float("nan")


def _refine(cfg, tree, prev, g_last, g_prev, crossed, steps, final, apply_step, event_of, first):
    """The event time of the samples whose event crossed zero, and their state at it (written into
    `final`): secant iterations on the partial step from the state before the crossing, then one
    Newton step whose derivative is the implicit function theorem's."""
    h = float(cfg.dt)

    def g_at(tau):
        xs = [_copier(tuple(x.shape[:-1]), np.dtype(x.dtype))(x, tau) for x in prev]
        apply_step(xs, _fresh(first), tau)
        return event_of(tree_unflatten(tree, xs)) * 1.0, xs

    ta, ga = _zeros_like(g_last), g_last
    tb = _secant(ta, ga, _zeros_like(g_last) + h, g_prev, h)
    gb, _ = g_at(tb)
    for _ in range(SECANT_TURNS):
        tc = _secant(ta, ga, tb, gb, h)
        ta, ga = tb, gb
        tb = tc
        gb, _ = g_at(tb)
    tau = _stopped(tb)
    delta = 1e-4 * h
    g0, _ = g_at(tau)
    slope = _slope(g_at(tau + delta)[0], g_at(tau - delta)[0], delta)
    tau = _newton(tau, g0, slope)
    _, x_event = g_at(tau)
    final[:] = [_chooser(tuple(x.shape[:-1]), np.dtype(x.dtype))(x, e, crossed) for x, e in zip(final, x_event)]
    return _event_time(steps, tau, crossed, h)


@hawk.kernel
def _watch(g_prev: Mutable[Scalar], g_last: Mutable[Scalar], crossed: Mutable[_Bool], g_new: Scalar,
           done: Terminated):
    """A sign change of the event function in this step: `crossed`, and its values either side kept."""
    hit = ((g_prev > 0.0) & (g_new <= 0.0)) | ((g_prev < 0.0) & (g_new >= 0.0))
    g_last = g_prev
    g_prev = g_new
    crossed = hit
    return hit


@hawk.kernel
def _zeros_like(x: Scalar):
    return 0.0 * x


@hawk.kernel
def _secant(ta: Scalar, ga: Scalar, tb: Scalar, gb: Scalar, h: Param):
    """The secant iterate, kept in [0, h] (a flat pair keeps tb)."""
    dg = gb - ga
    flat = hm.abs(dg) <= 1e-300
    tc = tb - gb * (tb - ta) / hm.where(flat, 1.0, dg)
    return hm.minimum(hm.maximum(hm.where(flat, tb, tc), 0.0), h)


@hawk.kernel
def _stopped(x: Scalar):
    return hm.stop_gradient(x)


@hawk.kernel
def _slope(gp: Scalar, gm: Scalar, delta: Param):
    s = hm.stop_gradient((gp - gm) / (2.0 * delta))
    return hm.where(hm.abs(s) > 1e-300, s, 1.0)


@hawk.kernel
def _newton(tau: Scalar, g: Scalar, slope: Scalar):
    return tau - g / slope


@hawk.kernel
def _event_time(steps: Scalar, tau: Scalar, crossed: Scalar, h: Param):
    return hm.where(crossed, (steps - 1) * h + tau, _NAN)


_KEEPERS = LRU("simulate's keep kernels", 64)       # (shape, dtype) -> the kernel
_COPIERS = LRU("simulate's copy kernels", 64)
_CHOOSERS = LRU("simulate's choose kernels", 64)


def _chooser(shape, dtype) -> Kernel:
    """The kernel `where(pick, b, a)` over planes of this per-sample shape and dtype (a new plane)."""
    k = _CHOOSERS.get((shape, dtype))
    if k is None:
        role = Role("State", shape, dtype)

        def choose(a, b, pick):
            return hm.where(pick, b, a)
        choose.__annotations__ = {"a": role, "b": role, "pick": Scalar}
        k = _CHOOSERS[(shape, dtype)] = hawk.kernel(choose)
    return k


def _copier(shape, dtype) -> Kernel:
    """The kernel returning a copy of a plane of this per-sample shape and dtype (the mark `along`
    only orders it after the mark, batched alike)."""
    k = _COPIERS.get((shape, dtype))
    if k is None:
        role = Role("State", shape, dtype)

        def copy(x, along):
            return x
        copy.__annotations__ = {"x": role, "along": Scalar}
        k = _COPIERS[(shape, dtype)] = hawk.kernel(copy)
    return k


def _keeper(shape, dtype) -> Kernel:
    """The kernel `dst = src` over planes of this per-sample shape and dtype, with a done mark: it
    writes the new state of the samples still running."""
    k = _KEEPERS.get((shape, dtype))
    if k is None:
        role = Role("State", shape, dtype)

        def keep(dst, src, done):
            dst = src  # noqa: F841  (a Mutable: the assignment writes the plane)
        keep.__annotations__ = {"dst": Mutable[role], "src": role, "done": Terminated}
        k = _KEEPERS[(shape, dtype)] = hawk.kernel(keep)
    return k


def _call_step(cfg, state, done, h):
    step = cfg.step
    if isinstance(step, Kernel):
        return _call_kernel_step(step, state, done, cfg.key, h)
    extra = {} if cfg.event is None else {"dt": h}
    return step(state, done, **extra) if cfg.key is None else step(state, done, cfg.key, **extra)


def _call_kernel_step(kernel, state, done, key, h):
    marks = [n for n, r in zip(kernel.param_names, kernel.roles) if isinstance(r, TerminatedRole)]
    if not marks:
        raise TypeError(f"{API}: the step kernel {kernel.name} has no Terminated parameter; add `done: Terminated` "
                        "and set it (`done = cond`) where a sample is finished")
    others = [n for n in kernel.param_names if n != marks[0] and not (n == "dt" and h is not None)]
    if key is not None:
        raise TypeError(f"{API}: key= is passed to a step function step(state, done, key); the step kernel "
                        f"{kernel.name} takes no key: wrap it in a function")
    if isinstance(state, dict):
        missing = [n for n in others if n not in state]
        extra = [k for k in state if k not in others]
        if missing or extra:
            raise TypeError(f"{API}: the step kernel {kernel.name} takes {', '.join(others)} (and the mark "
                            f"{marks[0]!r}); the state's keys are {', '.join(map(str, state))}. Name the state's "
                            "entries as the kernel's parameters, or give a function step(state, done)")
        kwargs = {n: state[n] for n in others}
    else:
        leaves, _ = tree_flatten(state, is_leaf=lambda x: staging.is_array(x))
        if len(leaves) != len(others):
            raise TypeError(f"{API}: the step kernel {kernel.name} takes {len(others)} state parameter(s) "
                            f"({', '.join(others)}), the state has {len(leaves)} plane(s); give a function "
                            "step(state, done) to pass other arguments")
        kwargs = dict(zip(others, leaves))
    kwargs[marks[0]] = done
    if "dt" in kernel.param_names and h is not None:
        kwargs["dt"] = h
    return kernel(**kwargs)        # None (it wrote the state in place) or the new state


@Builder
def _run_simulation(state, cfg):
    g = Graph()
    g.result = _stage(cfg, state, g)
    return g


def _run(cfg: _Config, state) -> SimResult:
    _leaves_of(state)
    return _run_simulation(state, cfg)()


def _name(fn) -> str:
    return getattr(fn, "__name__", None) or type(fn).__name__


__all__ = ["simulate", "SimResult"]


# ---------------------------------------------------------------------------------------------
# under vmap: a state shared by the instances is copied per instance when an argument is batched


@hawk.kernel
def _along_cell(done: Scalar, c: Param):
    return done


def _along_arg(done, x, n):
    """The mark, read after plane `x` (1-d): per instance when x is."""
    return _along(done, x) if x.shape == (n,) else _along_cell(done, x if x.shape == (1,) else x[:1])


def _arguments_under_vmap(graph):
    """Under a vmap staging, the planes of the arguments of the builder of `graph`. The step may
    read any of them (a parameter); when it reads a batched one, its writes into the run's copies
    of the state are per instance, so the copies are made after every argument, per instance
    whenever one is, though the state is shared. Every argument, not only the batched ones, so
    that the graph does not depend on which are (a plain function is staged again on others)."""
    from hawk_fx.context import CONTEXT
    if not CONTEXT.batch_full:
        return []
    return [p for ctx in CONTEXT.building if ctx.graph is graph for p in ctx.planes.values() if p.ndim >= 1]
