"""eagle_fx.Graph: the handle that replays a built graph, and the stages that make one.

As in JAX (jax.jit(f).lower(x).compile()), a graph goes through three stages:

    Traced    the closed Program (closed.py's Closed): staged by a builder (building.py), or
              made by a transform; nothing lowered
    Lowered   that Program lowered for one backend (lowering.lower, the backend registry's
              entry): its executable and `as_text()`; `compile()` gives
    Graph     the handle: replay (g(), launch, enqueue), bind, result, argument, program, to_dot

A builder's graph is staged into the Graph object itself (`g = eagle.Graph()` inside the
builder; the staging side, building.GraphStaging) and built in place; `g.lower(backend)` lowers
what it runs again, for another backend or to read the lowered text. A transform's closed
Program becomes a Graph through `Graph.from_closed`.
"""
from __future__ import annotations

import threading

import numpy as np

from hawk_fx.diff import match_tree
from hawk_fx.emit.jax import is_jax_array
from hawk_fx.context import CONTEXT
from hawk_fx.tree import make_node, tree_flatten, tree_unflatten

from .frontend import eager, staged_sums, staging, views
from .backends import select
from .ir.analysis import count_nodes, count_stages
from .frontend.building import Builder, GraphStaging, opaque  # noqa: F401  (opaque: `from eagle_fx.graph import opaque`)
from .ir.closed import Closed
from .diff import Record
from .ir.dot import to_dot, to_svg
from .backends.lowering import lower
from .frontend.staging import Plane


def _rebuild(t, leaves, k):
    """The tree `t` over leaves[k:], and the next index: tree_unflatten without closures, so reading
    a result leaves no reference cycle behind for the garbage collector."""
    if t.kind == "leaf":
        return leaves[k], k + 1
    if t.kind == "none":
        return None, k
    kids = []
    for c in t.children:
        v, k = _rebuild(c, leaves, k)
        kids.append(v)
    return make_node(t, kids), k



class Lowered:
    """A closed Program lowered for one backend (the second stage): `as_text()` shows what the
    backend runs, `compile()` gives the Graph that replays it."""

    def __init__(self, closed: Closed, backend=None):
        self.closed = closed
        self.backend, self.runtime, self.executable = lower(closed, backend)

    @property
    def text_kind(self) -> str:
        """What as_text() gives: 'stablehlo' (jax: the lowered XLA function), 'python' (numpy: the
        generated replay function), or 'program' (the Program's text, for other backends)."""
        exe = self.executable
        return "stablehlo" if hasattr(exe, "as_text") else "python" if hasattr(exe, "source") else "program"

    def as_text(self) -> str:
        kind = self.text_kind
        if kind == "stablehlo":
            return self.executable.as_text()
        return self.executable.source if kind == "python" else str(self.closed.program)

    def compile(self) -> "Graph":
        return Graph.from_closed(self.closed, executable=(self.backend, self.runtime, self.executable))

    def __repr__(self):
        return f"<eagle_fx.Lowered on {self.backend.name!r}, {count_nodes(self.closed.program)} nodes>"


class Graph(GraphStaging):
    """A graph of kernel calls. Build it with a builder; run it with g(), launch, enqueue.

    A builder makes one with `eagle.Graph()`, calls kernels (they become nodes), declares
    `g.result` and returns it; calling the builder on arrays builds the graph once, and calling
    the graph replays it:

        @eagle_fx.Graph.builder
        def chain(x):
            g = eagle_fx.Graph()
            g.result = square(scale(x, 2.0, 1.0))
            return g

        g = chain(np.arange(4.0))      # build
        g()                            # replay: the result arrays (the graph's own; copy to keep)

    `record=True` keeps what `eagle_fx.diff.reverse` needs (`checkpoints=K`: of each device loop, at
    most K states, the other turns run again in the reverse); `backend=` names a backend ("numpy",
    "cuda") instead of choosing by the arrays' type.
    """

    def __new__(cls, record: bool = False, backend=None, mesh=None, checkpoints=None):
        if cls is Graph and CONTEXT.eager_runs:       # the graph of a builder running with staging disabled
            g = eager.new_graph(record, backend)
            if g is not None:
                return g
        return super().__new__(cls)

    def __init__(self, record: bool = False, backend=None, mesh=None, checkpoints=None):
        super().__init__(record, backend, mesh, checkpoints)
        self._exe = None
        self._backend_used = None    # (registry entry, runtime or None) the executable was lowered for
        self._worker: threading.Thread | None = None
        self._worker_error = None
        self._generation = 0
        self._views: dict = {}       # id(result plane) -> the shape it is seen with, or a function (transforms)
        self._closed_src = None      # the closed Program a transform made this graph from (from_closed)

    @staticmethod
    def builder(fn=None, *, static_argnums=(), static_argnames=()):
        """Decorate a builder (a function that makes, fills and returns a Graph) or a block (one
        with a parameter annotated `eagle_fx.Graph`, which appends to the graph it is given).

        A transform of it (grad, vmap, ...) traces Python floats as one-cell arrays, as jax.jit
        does: a new value replays the staged graph. `static_argnums` / `static_argnames` name the
        parameters whose Python values the builder needs as numbers (a step count it unrolls, a
        float it branches on in Python): those stay static, part of the cache key."""
        if fn is None:
            return lambda f: Builder(f, static_argnums, static_argnames)
        return Builder(fn, static_argnums, static_argnames)

    # -- the stages ----------------------------------------------------------------------------
    @classmethod
    def from_closed(cls, closed: Closed, lazy=False, executable=None) -> "Graph":
        """The Graph running a closed Program (a transform's, or a Lowered's): the same verbs as any
        graph. `lazy`: lowered at its first run, so a graph a transform hands to another is never
        lowered; `executable`: the one a Lowered made."""
        g = cls(backend=closed.backend, mesh=closed.mesh)
        g._adopt(closed)
        if executable is not None:
            g._backend_used, g._exe = executable[:2], executable[2]
        elif not lazy:
            g.build()
        return g

    def _adopt(self, closed):
        """Take `closed` as what this (new) graph runs: its planes, Program and result handles."""
        t = self._trace
        t.input_planes, t.n = list(closed.planes), closed.n
        self._program = closed.program
        handles = [Plane(self, v.aval, var=v) for v in closed.program.outputs[:closed.n_results]]
        self.result = tree_unflatten(closed.tree, handles) if closed.tree is not None else None
        self._result_flat = (handles, closed.tree)
        for h, view in zip(handles, closed.views or ()):
            if view is not None:
                self._views[id(h)] = view
        self._input_names = {e.name: i for i, e in enumerate(t.input_planes) if e.name}
        self._closed_src = closed
        self._tree_args = dict(closed.tree_args)

    @property
    def closed(self) -> Closed:
        """The closed Program this graph runs (Program, bound arrays, result tree): what transforms
        take. A builder's graph staged inside a transform (lowering deferred) is not lowered."""
        if self._closed_src is not None:
            return self._closed_src
        if self._program is None:
            self.build()
        if self._exe is not None:
            entry = self._backend_used[0]
        else:
            asked = "jax" if self._mesh is not None else self._backend
            entry = select.resolve([e.array for e in self._trace.input_planes], asked)[0]
        return self._traced(entry.name if entry.supports_transforms else None, transformed=True)

    def lower(self, backend=None) -> Lowered:
        """This graph's Program lowered again for `backend` (None: the one it runs on), on its
        arrays: `g.lower("jax").as_text()`, `g.lower("numpy").compile()()`."""
        if backend is None and self._exe is not None:
            entry, runtime = self._backend_used
            backend = runtime if runtime is not None else entry.name
        return Lowered(self._own_closed(), backend)

    def build(self) -> "Graph":
        """Lower the staged Program for its backend and bind its arrays."""
        if self._exe is not None:
            return self
        entry, runtime, self._exe = lower(self._own_closed())
        self._backend_used = (entry, runtime)
        return self

    def _own_closed(self):
        """The closed Program of a builder's graph, as it is lowered (or a transform's)."""
        if self._closed_src is not None:
            return self._closed_src
        if self._program is None:
            self._close()
        return self._traced(self._backend, transformed=False)

    @property
    def executable(self):
        """What replays it (backends/protocol.py), made at the build (lowered now if it is not)."""
        return self.build()._exe

    @property
    def is_built(self) -> bool:
        """Lowered: its planes read as arrays, and nothing more stages into it."""
        return self._exe is not None

    @property
    def generation(self) -> int:
        """How many launches ran (counted from the first; a Record names the one it describes)."""
        return self._generation

    # -- the result --------------------------------------------------------------------------
    @property
    def result(self):
        """The declared result: staged planes while building, the arrays once built."""
        if self._closed_src is not None and self._exe is None:
            self.build()
        if self._exe is None or not self._has_result:
            return self._result_tree
        leaves, tree = self._result_flat          # flattened once, at build: a replay's g() allocates little
        if tree.kind == "leaf":                   # one array: no tree to rebuild
            return self._leaf_array(leaves[0], self._program.outputs[0])
        return _rebuild(tree, [self._leaf_array(x, v) for x, v in zip(leaves, self._program.outputs)], 0)[0]

    @result.setter
    def result(self, tree):
        self._result_tree = tree
        self._has_result = tree is not None

    def _leaf_array(self, x, out_var):
        if isinstance(x, Plane) and x.var is not None:
            return self.array_of(x)
        arr = self._exe.array_of(out_var)         # a user's array in the result: the one bound now
        return x if arr is None else arr

    def sum(self) -> "Graph":
        """A new Graph whose result is np.sum of this one's (one float result), as a (1,) cell: so a
        plain function handed to a transform can write `lambda x: f(x).sum()`."""
        return staged_sums.graph_reduction(self, "sum")

    def mean(self) -> "Graph":
        """A new Graph whose result is np.mean of this one's (one float result), as a (1,) cell."""
        return staged_sums.graph_reduction(self, "mean")

    def result_copy(self, give=False):
        """Copies of the result arrays (as its views show them) after a launch; None without a result.
        give=True: the caller reads no result of this replay again (a transformed function's call),
        so a backend may give its own arrays away instead of copying them (JaxExecutable.take)."""
        if not self._has_result:
            return None
        leaves, tree = self._result_flat
        outs = self._program.outputs
        take = getattr(self._exe, "take", None) if give else None     # give its own arrays away: no copy
        if take is None:
            if tree.kind == "leaf":
                return np.array(self._leaf_array(leaves[0], outs[0]))
            return tree_unflatten(tree, [np.array(self._leaf_array(x, v)) for x, v in zip(leaves, outs)])
        keys = [self._trace.root.current.get(x.key, x.var) if isinstance(x, Plane) and x.var is not None and
                id(x) not in self._views else None for x in leaves]
        # the copies first (one may bring a plane up to date), then what the backend gives away
        copies = [np.array(self._leaf_array(x, v)) if k is None else None for x, v, k in zip(leaves, outs, keys)]
        given: dict = {}
        for i, (x, v, k) in enumerate(zip(leaves, outs, keys)):
            if k is not None:
                a = given.get(k)
                if a is None:
                    a = given[k] = take(k)
                    copies[i] = a if a is not None else np.array(self._leaf_array(x, v))
                else:           # the same plane twice in the result: two arrays, as np.array makes them
                    copies[i] = np.array(a)
        return copies[0] if tree.kind == "leaf" else tree_unflatten(tree, copies)

    @property
    def record(self):
        """The record of the last launch (record=True graphs): pass it to eagle_fx.diff.reverse."""
        if not self._record:
            raise RuntimeError("eagle.Graph.record: this graph was built without record=True; build a recorded "
                               "twin: g = builder(..., record=True) with eagle.Graph(record=record) inside")
        if self._generation == 0:
            raise RuntimeError("eagle.Graph.record: the graph has not run yet; launch it (g() or g.launch()) first")
        return Record(self, self._generation)

    @property
    def program(self):
        """The staged Program (print it)."""
        if self._program is None:
            self.build()
        return self._program

    def to_dot(self) -> str:
        """The graph as Graphviz DOT text: kernels, forks and joins, waits, device if/match/while
        as clusters, buffers and results (render it with `dot -Tsvg`)."""
        return to_dot(self)

    def _repr_svg_(self):
        """Jupyter shows the graph's picture when Graphviz's `dot` is installed, its text otherwise.
        A hand-made graph still being staged shows as text: drawing it would build it."""
        if self._program is None:
            return None
        return to_svg(self)

    def array_of(self, h: Plane):
        """The array plane `h` of this graph holds now (None before the build)."""
        if self._exe is None:
            return None
        if h.var is None:                 # an argument, or a view of one: read from the arrays bound now
            return views.array_of(h.key, self._root_array)
        # the buffer's last version: a kernel may write the plane in place after it was made (a Mutable),
        # which a backend of values (JAX) returns as a new value, not in the same memory
        arr = self._exe.array_of(self._trace.root.current.get(h.key, h.var))
        view = self._views.get(id(h))          # a shape, or a function of the array (a Jacobian's axes)
        if view is None:
            return arr
        return view(arr) if callable(view) else arr.reshape(view)

    _array_of_plane = array_of

    def _root_array(self, key):
        if isinstance(key, staging.Extern):
            return key.array
        v = self._trace.root.current.get(key)
        return None if v is None else self._exe.array_of(v)

    # -- running -----------------------------------------------------------------------------
    def __call__(self, n: int = 1):
        """Replay n times and return the result (None when the graph has none)."""
        self.launch(n)
        return self.result if self._has_result else None

    def launch(self, n: int = 1) -> "Graph":
        """Replay n times and wait."""
        n = self._replay_count(n, "launch")
        self.synchronize()
        self.build()._exe.replay(n)
        self._fill_pinned()
        self._generation += 1
        return self

    def _replay_count(self, n, verb: str) -> int:
        """A replay count: a whole number >= 0 (launch(2.5) does not run twice, g(-1) does not run);
        an array is the user meaning to run on new arrays: say how."""
        if type(n) is int and n >= 0:          # the common case, checked first: a replay is short
            return n
        if getattr(n, "ndim", 0) > 0:
            raise TypeError(self._replay_refusal(n))
        if isinstance(n, (bool, np.bool_)) or not isinstance(n, (int, np.integer)) or n < 0:
            raise ValueError(f"eagle.Graph.{verb}: the replay count is a whole number >= 0, got {n!r}")
        return int(n)

    def _replay_refusal(self, n):
        """g(x): a Graph replays the arrays bound to it; say how to run it on others."""
        names = ", ".join(f"{k}=..." for k in self._input_names) or "name=..."
        b = self.made_by.__name__ if self.made_by is not None else "the builder"
        return (f"eagle.Graph: g(n) and g.launch(n) replay the graph n times on its own arrays; got "
                f"{type(n).__name__}. To run it on new arrays, bind them (g.bind({names}); g()) or call {b}(...) "
                "again (a transformed function, e.g. eagle_fx.grad(f)(x), caches its graph per layout)")

    def enqueue(self, n: int = 1) -> "Graph":
        """Replay n times on a worker thread and return at once; `synchronize()` waits. Until then
        the arrays the graph only reads are read-only (a write would tear the replay's results)."""
        n = self._replay_count(n, "enqueue")
        if self._record:
            raise RuntimeError("eagle.Graph.enqueue: a record=True graph runs with launch(), which waits for the "
                               "run its Record describes")
        self.synchronize()
        exe = self.build()._exe
        if hasattr(exe, "enqueue"):          # a CUDA graph: launched asynchronously on the stream
            exe.enqueue(n)
            return self
        locked = [a for a in self._read_inputs() if a.flags.writeable]
        for a in locked:
            a.flags.writeable = False

        def work():
            try:
                exe.replay(n)
                self._fill_pinned()
            except BaseException as e:   # surfaced by synchronize()
                self._worker_error = e
            finally:
                for a in locked:
                    a.flags.writeable = True
        self._worker = threading.Thread(target=work, daemon=True)
        self._worker.start()
        return self

    def synchronize(self) -> "Graph":
        """Wait for enqueued replays."""
        w = self._worker
        if w is not None:
            w.join()
            self._worker = None
            if self._worker_error is not None:
                e, self._worker_error = self._worker_error, None
                raise e
        if hasattr(self._exe, "synchronize"):    # a CUDA graph: wait for its stream
            self._exe.synchronize()
        return self

    def bind(self, **arrays) -> "Graph":
        """Swap the arrays of builder arguments (same shape, dtype and device; a tree argument, such
        as a dict of arrays, takes a tree of the same structure); no re-trace."""
        self.synchronize()
        self.build()
        swaps = []                  # (plane index or None for an argument no node reads, array)
        for name, arr in arrays.items():
            if name in self._tree_args:
                swaps += self._tree_swaps(name, arr)
                continue
            if name not in self._input_names and name not in self.unread_args:
                known = ", ".join([*self._input_names, *self.unread_args, *self._tree_args]) or "none"
                raise KeyError(f"eagle.Graph.bind: {name!r} is not an array argument of the builder (it has: {known})")
            i = self._input_names.get(name)
            old = self.unread_args[name] if i is None else self._trace.input_planes[i].array
            self._check_swap(name, old, arr, i)
            swaps.append((i, arr))
        for name, arr in arrays.items():
            if name in self.unread_args:       # no node reads it: nothing to swap but the record of it
                self.unread_args[name] = arr
        for i, arr in swaps:
            if i is not None:
                self._trace.input_planes[i].array = arr
                self._exe.rebind(i, arr)
        self._generation += 1 if self._generation else 0
        return self

    def _check_swap(self, name, old, arr, i):
        if not staging.is_array(arr):
            raise ValueError(f"eagle.Graph.bind: {name!r} takes an array of shape {old.shape} and dtype {old.dtype}, "
                             f"got {type(arr).__name__}: pass np.asarray({name}, dtype=np.{old.dtype.name})")
        if isinstance(arr, np.ndarray) != isinstance(old, np.ndarray):
            raise ValueError(f"eagle.Graph.bind: {name!r} was built with a {_array_type(old)} and got a "
                             f"{_array_type(arr)}; the array type chose the graph's backend: pass the same type "
                             "(np.asarray / jnp.asarray), or call the builder again")
        if tuple(arr.shape) != tuple(old.shape) or arr.dtype != old.dtype:
            got = f"{getattr(arr, 'shape', None)} {getattr(arr, 'dtype', type(arr).__name__)}"
            raise ValueError(f"eagle.Graph.bind: {name!r} changed shape/dtype ({old.shape} {old.dtype} -> {got}): "
                             "call the builder again")
        if i is None:
            return
        entry, v = self._trace.input_planes[i], self._program.inputs[i]
        if isinstance(arr, np.ndarray) and not arr.flags.writeable and self._trace.root.current.get(entry, v) is not v:
            raise ValueError(f"eagle.Graph.bind: {name!r} is a read-only array, and the graph writes this argument "
                             "in place (a Mutable or buffer=); pass a writeable array")

    def _tree_swaps(self, name, value):
        """(plane index or None, new array) for each array leaf of tree argument `name`, checked."""
        tree, where = self._tree_args[name]
        leaves = match_tree(value, tree)
        if leaves is None:
            raise ValueError(f"eagle.Graph.bind: {name!r} takes a tree of structure {tree}, got "
                             f"{tree_flatten(value)[1]}: give the same keys and nesting (or call the builder again)")
        swaps = []
        for j, (w, new) in enumerate(zip(where, leaves)):
            if w is None:             # a Python value: static, kept from the build
                continue
            i, old = w
            self._check_swap(f"{name} (leaf {j} of {tree})", old if i is None else self._trace.input_planes[i].array,
                             new, i)
            swaps.append((i, new))
        return swaps

    def argument(self, name: str):
        """The array bound to builder argument `name` now. With jax.Arrays (immutable), a graph that
        writes the argument (a Mutable, buffer=) rebinds it to the written value at each replay:
        this returns that value, and the next replay reads it."""
        self.synchronize()
        self.build()
        if name not in self._input_names:
            known = ", ".join(self._input_names) or "none"
            raise KeyError(f"eagle.Graph.argument: {name!r} is not an array argument of the builder (it has: {known})")
        i = self._input_names[name]
        arrays = getattr(self._exe, "arrays", None)       # the jax backend carries its arguments
        return arrays[i] if arrays is not None else self._trace.input_planes[i].array

    def __repr__(self):
        if self._exe is None and self._program is None:
            return f"<eagle_fx.Graph (staging) {self._trace.seq} nodes, cpu>"
        prog = self.program
        return (f"<eagle_fx.Graph {count_nodes(prog)} nodes, {count_stages(prog)} stages, "
                f"{getattr(self._exe, 'backend_name', 'cpu')}>")


def _array_type(a) -> str:
    """numpy.ndarray, jax.Array, cupy.ndarray: the name a message gives an array's type."""
    return "jax.Array" if is_jax_array(a) else f"{type(a).__module__.split('.')[0]}.{type(a).__name__}"
