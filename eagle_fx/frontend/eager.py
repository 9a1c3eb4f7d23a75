"""`with eagle_fx.disable_staging():` runs builders as plain Python (JAX's `disable_jit` is the model).

A builder called in this mode stages nothing: it returns an `EagerGraph`, and every `g()` runs the
builder's function again, top to bottom. Kernels are called eagerly; a device condition (a one-cell
uint32 array) is read as a value at the moment the `if`/`while`/`match` reaches it; loops run in
Python; parallel branches run in order. `print` and `pdb` inside a builder work, and the tests use
this mode as an independent meaning of each builder form.

What stays as staged: a name labelled `buffer=` that device flow rebinds keeps its buffer (the array
holds the value after the loop or arm), and `buffer=array` writes the result into that array.
Hand-made graphs (`eagle.Graph()` outside a builder) and transforms (grad, vmap, jvp) keep staging.
As staged, `g()` hands out the same result arrays at every run (the first run's, refilled), so a
result kept without `.copy()` changes with the next run in both modes.
"""
from __future__ import annotations

import contextlib
import inspect
import warnings

import numpy as np

from hawk_fx.context import CONTEXT
from hawk_fx.tree import tree_flatten, tree_unflatten
from hawk_fx.trace import UNDEF

from .staging import RuntimeBase, UncappedLoopWarning, _is_cell, _is_device, is_array

@contextlib.contextmanager
def disable_staging(disable: bool = True):
    """Within the block, builders run as plain Python on every g() (see the module docstring)."""
    with CONTEXT.enter(staging_disabled=bool(disable)):
        yield


def staging_disabled() -> bool:
    return bool(CONTEXT.innermost("staging_disabled"))


class _Run:
    """One run of an eager builder: the graph its `eagle.Graph()` returns, its buffers by label."""

    def __init__(self, graph):
        self.graph = graph
        self.claimed = False
        self.fresh_buffers: dict[int, np.ndarray] = {}     # buffer= results not yet assigned to a name
        self.labels: dict[str, np.ndarray] = {}            # name -> its buffer
        self.loops: list[EagerLoop] = []                   # the loops running now, innermost last


class EagerLoop:
    """A loop running in this mode, for eagle_fx.collect: its cap (None: counted or uncapped),
    whether a cell drives it, its turn, and its row buffers (one per collect call in the body)."""

    def __init__(self, cap, counted):
        self.cap, self.counted, self.device = cap, counted, counted
        self.turn, self.buffers, self.n_used = 0, [], 0

    @contextlib.contextmanager
    def turn_of(self, t):
        run = CONTEXT.innermost("eager_runs")
        self.turn, self.n_used = t, 0
        if run is not None:
            run.loops.append(self)
        try:
            yield
        finally:
            if run is not None:
                run.loops.pop()


def new_graph(record=False, backend=None):
    """What `eagle.Graph()` is inside an eager builder run: that run's graph (else None)."""
    run = CONTEXT.innermost("eager_runs")
    if run is not None and not run.claimed:
        run.claimed = True
        run.graph._record = bool(record)
        return run.graph
    return None


class _Stager:
    """Receives the kernel calls of an eager run (the context's innermost graph stager) and calls each kernel now."""

    def __init__(self, run: _Run):
        self.run = run

    def stage_call(self, kernel, args, kwargs, buffer):
        stagers = CONTEXT.graph_stagers
        stagers.pop()
        try:
            out = kernel(*args, **kwargs)
        finally:
            stagers.append(self)
        if buffer is None or buffer is False:
            return out
        api = f"hawk.kernel {kernel.name}"
        if not isinstance(out, np.ndarray):
            raise TypeError(f"{api}: buffer= needs a kernel with one returned plane")
        if buffer is True:
            self.run.fresh_buffers[id(out)] = out
            return out
        if not is_array(buffer):
            raise TypeError(f"{api}: buffer= takes True or an array, got {type(buffer).__name__}")
        if buffer.shape != out.shape or buffer.dtype != out.dtype:
            raise ValueError(f"{api}: buffer= has shape {buffer.shape} and dtype {buffer.dtype}; the result is "
                             f"{out.shape} {out.dtype}")
        np.copyto(buffer, out)
        self.run.fresh_buffers[id(buffer)] = buffer
        return buffer


class _Branch:
    def __init__(self, graph):
        self.graph = graph

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def wait(self, plane):
        return self           # branches run in order: what it waits for has run

    def parallel(self):
        return _Fork(self.graph)


class _Fork(_Branch):
    def branch(self):
        return _Branch(self.graph)


class EagerGraph:
    """A builder's graph under disable_staging: each g() runs the builder's function again."""

    def __init__(self, builder, bound: inspect.BoundArguments):
        self._builder, self._bound = builder, bound
        self._record = False
        self.result = None
        self._last = None
        self._owned = None          # (leaves, treedef) of the first run's result: the arrays g() hands out
        self.buffers: dict = {}

    # what the builder's body calls on its graph
    def parallel(self):
        return _Fork(self)

    def add_node(self, node, name=None):
        node.fn()             # a host node runs at its place
        return self

    def wait(self, plane):
        raise RuntimeError("eagle.Graph.wait: only inside a parallel region, on a branch handle "
                           "(`with g.parallel() as p:` / `with p.branch() as b:` / `b.wait(plane)`)")

    # the running verbs
    def build(self):
        return self

    def launch(self, n: int = 1):
        for _ in range(int(n)):
            self._run()
        return self

    def __call__(self, n: int = 1):
        self.launch(n)
        return self._last

    def enqueue(self, n: int = 1):
        return self.launch(n)

    def synchronize(self):
        return self

    def bind(self, **arrays):
        args = self._bound.arguments
        for name, arr in arrays.items():
            old = args.get(name)
            if not is_array(old):
                known = ", ".join(k for k, v in args.items() if is_array(v)) or "none"
                raise KeyError(f"eagle.Graph.bind: {name!r} is not an array argument of the builder (it has: {known})")
            if not is_array(arr) or arr.shape != old.shape or arr.dtype != old.dtype:
                got = f"{getattr(arr, 'shape', None)} {getattr(arr, 'dtype', type(arr).__name__)}"
                raise ValueError(f"eagle.Graph.bind: {name!r} changed shape/dtype ({old.shape} {old.dtype} -> {got}): "
                                 "call the builder again")
        args.update(arrays)
        return self

    @property
    def record(self):
        raise RuntimeError("eagle.Graph.record: a graph run with staging disabled keeps no record; build it "
                           "outside disable_staging() to take gradients")

    @property
    def program(self):
        raise RuntimeError("eagle.Graph.program: staging is disabled, so there is no Program; build the graph "
                           "outside disable_staging() to see it")

    def __repr__(self):
        return f"<eagle_fx.Graph {self._builder.__name__} (staging disabled: each call runs the builder)>"

    def _run(self):
        run = _Run(self)
        with CONTEXT.enter(eager_runs=run, graph_stagers=_Stager(run)):
            ret = self._builder.eager_fn(*self._bound.args, **self._bound.kwargs)
        if ret is not self:
            raise TypeError(f"{self._builder.__name__}: a builder returns its graph: `return g`; declare the arrays "
                            "with `g.result = ...`")
        self._last = self.result = self._own_results(self.result)
        self.buffers = dict(run.labels)     # label -> its buffer, holding the label's value after the run

    def _own_results(self, tree):
        """The result arrays of the first run, holding this run's values: as a staged graph's g() hands
        out its own arrays, which the next replay overwrites (docs: sharp bits). A leaf that is the
        caller's memory (an argument, a view of one) is returned as it is, as staged."""
        try:
            leaves, treedef = tree_flatten(tree, is_leaf=lambda x: isinstance(x, np.ndarray))
        except TypeError:
            return tree          # not a result tree: g() returns it as it is
        if self._owned is None or self._owned[1] != treedef:
            self._owned = (leaves, treedef)
            return tree
        users = list(_arrays_in((self._bound.args, self._bound.kwargs)))
        out = []
        for old, new in zip(self._owned[0], leaves):
            if old is new or not _owns(old, users) or not _owns(new, users) \
                    or (old.shape, old.dtype) != (new.shape, new.dtype):
                out.append(new)
            else:
                np.copyto(old, new)
                out.append(old)
        return tree_unflatten(treedef, out)


def _arrays_in(value):
    if isinstance(value, np.ndarray):
        yield value
    elif isinstance(value, (tuple, list)):
        for v in value:
            yield from _arrays_in(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _arrays_in(v)


def _owns(a, users) -> bool:
    """Is `a` an array the run made (not the memory of an argument)?"""
    return isinstance(a, np.ndarray) and a.flags.writeable and not any(np.shares_memory(a, u) for u in users)


def call_builder(builder, args, kwargs):
    bound = builder.signature.bind(*args, **kwargs)
    bound.apply_defaults()
    return EagerGraph(builder, bound)


def is_eager_handle(handle) -> bool:
    return isinstance(handle, (EagerGraph, _Branch))


def call_block(builder, args, kwargs):
    """A block appended to an eager graph: its body runs now."""
    run = CONTEXT.innermost("eager_runs")
    if run is None:
        raise RuntimeError(f"{builder.__name__}: a block on a graph with staging disabled runs inside its builder")
    return builder.eager_fn(*args, **kwargs)


# ---------------------------------------------------------------------------------------------
# the runtime the rewritten builder calls in this mode: Python control flow, cells read as values

def _truth(v, where):
    if isinstance(v, _DeviceBool):
        return v.value
    if _is_cell(v):
        return bool(np.asarray(v)[0])
    if _is_device(v):
        raise TypeError(f"eagle.Graph.builder {where}: an array of shape {tuple(v.shape)} and dtype {v.dtype} is "
                        "used as a condition; device conditions are one-cell uint32 arrays")
    return bool(v)


class _DeviceBool:
    """`not cell`, `cell and x`: a Python truth value that came from a cell, so the construct it
    decides is device flow (a buffer's name rebound there keeps its buffer, as staged)."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = bool(value)

    def __bool__(self):
        return self.value


def _device_test(v) -> bool:
    return _is_cell(v) or isinstance(v, _DeviceBool)


class _Turns:
    """range(cell) in this mode: the cell's count, read when the loop starts."""

    def __init__(self, n):
        self.range = range(n)

    def __iter__(self):
        return iter(self.range)


class EagerRuntime(RuntimeBase):
    @staticmethod
    def load(scope, names):
        return tuple(scope.get(n, UNDEF) for n in names)

    @staticmethod
    def label(value, name):
        run = CONTEXT.innermost("eager_runs")
        if run is not None and isinstance(value, np.ndarray):
            buf = run.fresh_buffers.pop(id(value), None)
            if buf is value:
                run.labels.setdefault(name, value)
        return value

    def not_(self, x):
        out = not _truth(x, self.info.name)
        return _DeviceBool(out) if _device_test(x) else out

    def _logic(self, thunks, is_and):
        """As staged: a Python operand that decides the expression is its value; cells combine."""
        cells, v = [], is_and
        for t in thunks:
            v = t()
            if _device_test(v):
                cells.append(_truth(v, self.info.name))
            elif bool(_truth(v, self.info.name)) != is_and:
                return v
        if not cells:
            return v
        return _DeviceBool(all(cells) if is_and else any(cells))

    def and_(self, *thunks):
        return self._logic(thunks, True)

    def or_(self, *thunks):
        return self._logic(thunks, False)

    # -- constructs --------------------------------------------------------------------------
    def if_stmt(self, test, true_fn, false_fn, state, names, line):
        out = true_fn(*state) if _truth(test, self.where(line)) else false_fn(*state)
        return _follow_buffers(state, out, names) if _device_test(test) else out

    def match_stmt(self, subject, values, fns, default, state, names, line):
        device = _is_cell(subject)
        key = int(np.asarray(subject)[0]) if device else subject
        for v, fn in zip(values, fns):
            if key == v:
                out = fn(*state)
                break
        else:
            out = default(*state) if default is not None else state
        return _follow_buffers(state, out, names) if device else out

    def range_(self, *args):
        if any(_is_device(a) for a in args):
            if len(args) != 1 or not _is_cell(args[0]):
                raise TypeError(f"eagle.Graph.builder {self.info.name}: a device trip count is `range(cell)` with "
                                "one one-cell uint32 array; start and step are not supported on the device")
            return _Turns(int(np.asarray(args[0])[0]))
        return range(*args)

    def for_stmt(self, iterable, cond_fn, body_fn, state, names, line):
        device = isinstance(iterable, _Turns)
        start = state
        loop = EagerLoop(len(iterable) if isinstance(iterable, range) else None, device)
        for t, v in enumerate(iterable):
            c = cond_fn(*state)
            device |= _device_test(c)
            loop.device = device
            if not _truth(c, self.where(line)):
                break
            with loop.turn_of(t):
                state = tuple(body_fn(v, *state))
        return _follow_buffers(start, state, names) if device else state

    def while_stmt(self, cond_fn, body_fn, state, names, line):
        start, device = state, False
        loop, t = EagerLoop(None, False), 0
        while True:
            c = cond_fn(*state)
            if _device_test(c) and not device:
                device = True
                warnings.warn_explicit(UncappedLoopWarning(
                    f"uncapped device loop at {self.where(line)}: a body that never clears its guard never returns; "
                    "cap it with for _ in range(N): if not cell: break"), UncappedLoopWarning, self.info.filename, line)
            if not _truth(c, self.where(line)):
                break
            loop.device = device
            with loop.turn_of(t):
                state = tuple(body_fn(*state))
            t += 1
        return _follow_buffers(start, state, names) if device else state


def _follow_buffers(before, after, names):
    """After device flow: a buffer's name that was rebound leaves its value in the buffer and names it."""
    run = CONTEXT.innermost("eager_runs")
    if run is None:
        return after
    out = list(after)
    for i, name in enumerate(names):
        buf = run.labels.get(name)
        if buf is not None and before[i] is buf and out[i] is not buf and isinstance(out[i], np.ndarray):
            np.copyto(buf, out[i])
            out[i] = buf
    return tuple(out)
