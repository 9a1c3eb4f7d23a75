"""eagle_fx.Graph: staging kernel calls into a Program, building it once, replaying it fast.

A BUILDER (`@Graph.builder` on a function with no Graph parameter) makes `g = eagle.Graph()`,
stages into it, sets `g.result` and returns `g`; calling the builder on arrays builds the graph.
A BLOCK (a parameter annotated `eagle.Graph`) appends to the graph or branch it is given.
"""
from __future__ import annotations

import inspect
import threading
import typing

import numpy as np

from hawk_fx.emit.jax import is_jax_array
from hawk_fx.context import CONTEXT
from hawk_fx.tree import make_node, tree_flatten, tree_unflatten

from . import eager, staging, views
from .analysis import count_nodes, count_stages
from .autograph import convert_builder
from .backends import cuda as _cuda
from .backends import select as _select
from .backends.numpy import NumpyExecutable
from .guards import release
from .staging import GraphTrace, Plane


class OpaqueNode:
    """A host function the graph calls as one node, with the arrays it reads and writes declared."""

    def __init__(self, fn, reads=None, writes=None):
        self.fn = fn
        self.reads = dict(reads or {})
        self.writes = dict(writes or {})


def opaque(fn, reads=None, writes=None) -> OpaqueNode:
    """A host node: `fn()` runs at its place in every replay; reads/writes name the arrays it touches,
    so ordering and branch hazards are checked like any kernel's."""
    return OpaqueNode(fn, reads, writes)


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


class _BuildContext:
    def __init__(self, builder, arg_names):
        self.builder, self.arg_names, self.graph = builder, arg_names, None
        self.planes: dict = {}       # id(array) -> the staged plane the builder sees for that argument

    def wrap(self, value):
        """Arguments (and arrays in tuples, lists and dicts of them) as staged planes."""
        return _wrap_arrays(value, self.planes, lambda a: staging.argument_plane(a, self.arg_names.get(id(a))))


def _wrap_arrays(value, planes: dict, make):
    """`value` with each array in it (and in tuples, lists and dicts of them) replaced by its staged
    plane, made once per array by `make` and kept in `planes` (id(array) -> plane)."""
    if staging.is_array(value):
        p = planes.get(id(value))
        if p is None:
            p = planes[id(value)] = make(value)
        return p
    if isinstance(value, (tuple, list)) and type(value) in (tuple, list):
        return type(value)(_wrap_arrays(v, planes, make) for v in value)
    if type(value) is dict:
        return {k: _wrap_arrays(v, planes, make) for k, v in value.items()}
    return value




class Branch:
    """One branch of a parallel region; `with p.branch() as b:`. Nodes staged inside run in order."""

    def __init__(self, fork: "Fork", index: int):
        self.fork, self.index = fork, index
        self.graph = fork.graph
        self.path = fork.path + ((fork.id, index),)
        self._saved = None

    def __enter__(self):
        t = self.graph._trace
        self._saved = t.branch
        t.branch = self.path
        return self

    def __exit__(self, *exc):
        self.graph._trace.branch = self._saved
        return False

    def parallel(self) -> "Fork":
        """A fork inside this branch."""
        return Fork(self.graph, self.path)

    def wait(self, plane):
        """This branch continues only after the node that last wrote `plane`."""
        self.graph._trace.add_wait(self.path, plane)
        return self


class Fork:
    """A parallel region: `with g.parallel() as p:`; leaving it joins its branches."""

    def __init__(self, graph, path=()):
        self.graph, self.path = graph, path
        self.id = graph._trace.open_fork()
        self.count = 0

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *exc):
        if exc_type is None:
            self.graph._trace.close_fork(self.id, len(self.path))
        return False

    def branch(self) -> Branch:
        b = Branch(self, self.count)
        self.count += 1
        return b


class Graph:
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

    _checkpoints = None             # record=True, checkpoints=K: loops keep at most K states (recording.py)

    def __new__(cls, record: bool = False, backend=None, mesh=None, checkpoints=None):
        if cls is Graph and CONTEXT.eager_runs:       # the graph of a builder running with staging disabled
            g = eager.new_graph(record, backend)
            if g is not None:
                return g
        return super().__new__(cls)

    def __init__(self, record: bool = False, backend=None, mesh=None, checkpoints=None):
        self._record = bool(record)
        if checkpoints is not None:
            if not record:
                raise ValueError("eagle.Graph: checkpoints= is for record=True graphs (how many states of each "
                                 "device loop the record keeps)")
            if type(checkpoints) is not int or checkpoints < 1:
                raise ValueError(f"eagle.Graph: checkpoints={checkpoints!r}; give the number of loop states to "
                                 "keep, an int >= 1")
            self._checkpoints = checkpoints
        self._backend = backend      # None: by the arrays (NumPy -> numpy, CuPy -> cuda, jax.Array -> jax)
        self._mesh = mesh            # backend 'jax': a jax.sharding.Mesh the sample axis is split over
        if mesh is not None and backend not in ("jax", None):
            raise ValueError(f"eagle.Graph: mesh= is for backend='jax' (got backend={backend!r})")
        self._trace = GraphTrace(self)
        self._result_tree = None
        self._has_result = False
        self._exe: NumpyExecutable | None = None
        self._program = None
        self._worker: threading.Thread | None = None
        self._worker_error = None
        self._input_names: dict[str, int] = {}
        self._unread_args: dict = {}   # array arguments of the builder no node reads: bindable all the same
        self._generation = 0
        self._views: dict = {}       # id(result plane) -> the shape it is seen with, or a function (transforms)
        self._tree_args: dict = {}   # builder argument name -> (tree, leaves) of a tree argument, for bind
        self._pending = None         # a transform's graph not lowered yet: its backend (see _from_program)
        self._closed_src = None      # the closed Program a transform made this graph from
        ctx = CONTEXT.innermost("building")
        if ctx is not None and ctx.graph is None:
            ctx.graph = self
            self._trace.arg_names = ctx.arg_names
            for p in ctx.planes.values():
                p.graph = self
                self._trace.externs[id(p.key.array)] = p.key
                self._trace.handles.add(p)
            CONTEXT.graph_stagers.append(self._trace)      # popped by the builder call that made ctx
            self._builder = ctx.builder
        else:
            self._builder = None

    @staticmethod
    def builder(fn):
        """Decorate a builder (a function that makes, fills and returns a Graph) or a block (one
        with a parameter annotated `eagle_fx.Graph`, which appends to the graph it is given)."""
        return Builder(fn)

    def _closed(self):
        """The closed Program this graph runs (Program, bound arrays, result tree): what transforms
        take. A builder's graph staged inside a transform (lowering deferred) is not lowered."""
        from .closed import Closed
        if self._closed_src is not None:
            return self._closed_src
        prog = self.program if self._program is None else self._program
        leaves, tree = self._result_vars() if self._has_result else ([], None)
        arrays = [e.array for e in self._trace.input_planes]
        if self._exe is not None:
            backend = getattr(self._exe, "backend_name", None)
        else:
            backend = _select.choose(arrays, "jax" if self._mesh is not None else self._backend)
        c = Closed(prog, list(self._trace.input_planes), tree, len(leaves), self._trace.n,
                   "jax" if backend == "jax" else None, self._mesh, record=self._record)
        c.tree_args = self._tree_args
        return c

    @classmethod
    def _from_program(cls, program, input_planes, tree, n_results, n, backend=None, mesh=None, views=None,
                      lazy=False, closed=None):
        """A built graph running a Program a transform made: the same verbs as any graph (on the
        backend of the graph it was made from: numpy, or jax). `views`: per result leaf, the shape
        it is seen with or a function of its array (a Jacobian's axes). `lazy`: lowered at its
        first run, so a graph a transform hands to another is never lowered."""
        g = cls.__new__(cls)
        cls.__init__(g, backend=backend, mesh=mesh)
        t = g._trace
        t.input_planes = list(input_planes)
        t.n = n
        g._program = program
        handles = []
        for j, v in enumerate(program.outputs[:n_results]):
            h = Plane(g, v.aval, var=v)
            handles.append(h)
        g._result_tree = tree_unflatten(tree, handles) if tree is not None else None
        g._has_result = tree is not None
        g._result_flat = (handles, tree)
        for h, view in zip(handles, views or ()):
            if view is not None:
                g._views[id(h)] = view
        g._input_names = {e.name: i for i, e in enumerate(t.input_planes) if e.name}
        g._closed_src = closed
        g._tree_args = dict(closed.tree_args) if closed is not None else {}
        g._pending = backend or "numpy"
        if not lazy:
            g._lower_pending()
        return g

    def _lower_pending(self):
        """Lower a Program a transform made (see _from_program)."""
        t, handles = self._trace, self._result_flat[0]
        arrays = [e.array for e in t.input_planes]
        if self._pending == "jax":
            self._exe = _jax_executable(self._program, arrays, {h.var for h in handles}, t.n or 1,
                                        [e.name for e in t.input_planes], self._mesh)
        elif (backend := _select.choose(arrays, self._backend)) not in ("numpy", "jax"):     # a CUDA graph
            self._exe = _cuda.CudaExecutable(self._program, arrays, {h.var for h in handles}, t.n or 1,
                                             runtime=backend, names=[e.name for e in t.input_planes])
        else:
            self._exe = NumpyExecutable(self._program, arrays, {h.var for h in handles}, t.n or 1)
        self._pending = None

    # -- staging -----------------------------------------------------------------------------
    @property
    def result(self):
        """The declared result: staged planes while building, the arrays once built."""
        if self._pending is not None:
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
            return self._array_of_plane(x)
        arr = self._exe.array_of(out_var)         # a user's array in the result: the one bound now
        return x if arr is None else arr

    def add_node(self, node: OpaqueNode, name: str | None = None):
        """Append a host node (see `opaque`)."""
        if not isinstance(node, OpaqueNode):
            raise TypeError(f"eagle.Graph.add_node: takes an opaque(...) node, got {type(node).__name__}")
        with self._staging():
            self._trace.stage_opaque(node, name)
        return self

    def parallel(self) -> Fork:
        """A parallel region; its branches may run at the same time."""
        return Fork(self)

    def wait(self, plane):
        raise RuntimeError("eagle.Graph.wait: only inside a parallel region, on a branch handle "
                           "(`with g.parallel() as p:` / `with p.branch() as b:` / `b.wait(plane)`)")

    def _staging(self):
        graph = self

        class _Ctx:
            def __enter__(self):
                self.pushed = CONTEXT.innermost("graph_stagers") is not graph._trace
                if self.pushed:
                    if graph._exe is not None or graph._program is not None:
                        raise RuntimeError("eagle.Graph: this graph is built; stage into a new graph")
                    CONTEXT.graph_stagers.append(graph._trace)

            def __exit__(self, *exc):
                if self.pushed:
                    CONTEXT.graph_stagers.pop()
                return False
        return _Ctx()

    # -- building ----------------------------------------------------------------------------
    def build(self) -> "Graph":
        """Lower the staged Program for the NumPy backend and bind its arrays."""
        if self._exe is not None:
            return self
        if self._pending is not None:
            self._lower_pending()
            return self
        if self._program is None:
            self._close()
        t = self._trace
        keep = {h.var for h in list(t.handles) + t.buffers if h.var is not None}
        arrays = [e.array for e in t.input_planes]
        backend = _select.choose(arrays, "jax" if self._mesh is not None else self._backend)
        if backend == "jax" and self._record and self._backend is None and self._mesh is None \
                and all(isinstance(a, np.ndarray) for a in arrays):
            backend = "numpy"          # use_backend('jax') keeps records on NumPy (growing stacks, checkpoints=)
        if backend == "jax" and self._record:               # the forward half of its vjp, on XLA
            from .recording import recorded_executable
            self._exe = recorded_executable(self, keep, arrays, t.n or 1, "jax")
        elif backend == "jax":                               # one XLA executable (backends/jax.py)
            self._exe = _jax_executable(self._program, arrays, keep, t.n or 1, [e.name for e in t.input_planes],
                                        self._mesh)
        elif backend != "numpy" and self._record:            # the forward half of its vjp, as a CUDA graph
            from .recording import recorded_executable
            self._exe = recorded_executable(self, keep, arrays, t.n or 1, backend)
        elif backend != "numpy":                             # CuPy arrays: one CUDA graph (backends/cuda.py)
            self._exe = _cuda.CudaExecutable(self._program, arrays, keep, t.n or 1, runtime=backend,
                                             names=[e.name for e in t.input_planes])
        elif self._record:                                   # the forward half of its vjp (recording.py)
            from .recording import recorded_executable
            self._exe = recorded_executable(self, keep, arrays, t.n or 1)
        else:
            self._exe = NumpyExecutable(self._program, arrays, keep, t.n or 1)
        return self

    def _close(self):
        """Make the staged Program (checked) without lowering it."""
        t = self._trace
        leaves, tree = tree_flatten(self._result_tree, is_leaf=lambda x: isinstance(x, Plane) or staging.is_array(x))
        self._result_flat = (leaves, tree)
        outs = []
        for x in leaves:
            if isinstance(x, Plane):
                outs.append(t.root.read(x.key))
            elif staging.is_array(x):
                outs.append(t.root.read(t.extern(x)))
            elif isinstance(x, staging._LoopLocal):
                x._fail()
            else:
                raise TypeError(f"eagle.Graph: g.result holds {type(x).__name__}; a result is a tree of arrays "
                                "computed in the graph")
        self._program = t.program(outs)
        for e, v in zip(t.input_planes, self._program.inputs):      # refused now, not at the first replay
            if isinstance(e.array, np.ndarray) and not e.array.flags.writeable and t.root.current.get(e, v) is not v:
                who = f"eagle.Graph.builder {self._builder.__name__}" if self._builder else "eagle.Graph"
                what = f"argument {e.name!r}" if e.name else "an array the builder reaches by closure"
                raise ValueError(f"{who}: {what} is a read-only array, and the graph writes it in place (a Mutable "
                                 "or buffer=); pass a writeable array")
        self._input_names = {e.name: i for i, e in enumerate(t.input_planes) if e.name}

    # -- gradients ---------------------------------------------------------------------------
    @property
    def record(self):
        """The record of the last launch (record=True graphs): pass it to eagle_fx.diff.reverse."""
        if not self._record:
            raise RuntimeError("eagle.Graph.record: this graph was built without record=True; build a recorded "
                               "twin: g = builder(..., record=True) with eagle.Graph(record=record) inside")
        if self._generation == 0:
            raise RuntimeError("eagle.Graph.record: the graph has not run yet; launch it (g() or g.launch()) first")
        from .diff import Record
        return Record(self, self._generation)

    def _result_copy(self):
        """Copies of the result arrays (as its views show them) after a launch; None without a result."""
        if not self._has_result:
            return None
        leaves, tree = self._result_flat
        outs = self._program.outputs
        if tree.kind == "leaf":
            return np.array(self._leaf_array(leaves[0], outs[0]))
        return tree_unflatten(tree, [np.array(self._leaf_array(x, v)) for x, v in zip(leaves, outs)])

    def _result_vars(self):
        leaves, tree = tree_flatten(self._result_tree, is_leaf=lambda x: isinstance(x, Plane) or staging.is_array(x))
        return list(self._program.outputs[:len(leaves)]), tree

    def _gradient_names(self):
        """name -> (kind, (Var on entry / of the buffer, Var on exit))."""
        t, prog = self._trace, self._program
        names = {}
        for v, e in zip(prog.inputs, t.input_planes):
            if e.name:
                final = t.root.current.get(e, v)
                names[e.name] = ("written" if final is not v else "arg", (v, final))
        for h in t.buffers:
            if h.label and h.label not in names and h.var is not None:
                final = t.buffer_value(h)
                names[h.label] = ("buffer", (final, final))
        names["result"] = ("result", (None, None))
        return names

    @property
    def program(self):
        """The staged Program (print it)."""
        if self._program is None:
            self.build()
        return self._program

    def to_dot(self) -> str:
        """The graph as Graphviz DOT text: kernels, forks and joins, waits, device if/match/while
        as clusters, buffers and results (render it with `dot -Tsvg`)."""
        from .dot import to_dot
        return to_dot(self)

    def _repr_svg_(self):
        """Jupyter shows the graph's picture when Graphviz's `dot` is installed, its text otherwise.
        A hand-made graph still being staged shows as text: drawing it would build it."""
        if self._program is None:
            return None
        from .dot import to_svg
        return to_svg(self)

    def _array_of_plane(self, h: Plane):
        if self._exe is None:
            return None
        if h.var is None:                 # an argument, or a view of one: read from the arrays bound now
            return views.array_of(h.key, self._root_array)
        arr = self._exe.array_of(h.var)
        view = self._views.get(id(h))          # a shape, or a function of the array (a Jacobian's axes)
        if view is None:
            return arr
        return view(arr) if callable(view) else arr.reshape(view)

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
        b = self._builder.__name__ if self._builder is not None else "the builder"
        return (f"eagle.Graph: g(n) and g.launch(n) replay the graph n times on its own arrays; got "
                f"{type(n).__name__}. To run it on new arrays, bind them (g.bind({names}); g()) or call {b}(...) "
                "again (a transformed function, e.g. eagle_fx.grad(f)(x), caches its graph per layout)")

    def _fill_pinned(self):
        """Copy each block result handed out as an array (see Builder._call_block) from its plane."""
        if not self._trace.pinned:
            return
        for arr, plane in self._trace.pinned.values():
            np.copyto(arr, np.asarray(self._array_of_plane(plane)))

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

    def _read_inputs(self):
        """The NumPy arrays of the builder's inputs that the graph reads and never writes."""
        t, prog = self._trace, self._program
        return [e.array for e, v in zip(t.input_planes, prog.inputs)
                if isinstance(e.array, np.ndarray) and t.root.current.get(e, v) is v]

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
            if name not in self._input_names and name not in self._unread_args:
                known = ", ".join([*self._input_names, *self._unread_args, *self._tree_args]) or "none"
                raise KeyError(f"eagle.Graph.bind: {name!r} is not an array argument of the builder (it has: {known})")
            i = self._input_names.get(name)
            old = self._unread_args[name] if i is None else self._trace.input_planes[i].array
            self._check_swap(name, old, arr, i)
            swaps.append((i, arr))
        for name, arr in arrays.items():
            if name in self._unread_args:       # no node reads it: nothing to swap but the record of it
                self._unread_args[name] = arr
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
        from hawk_fx.diff import match_tree
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


def _jax_executable(program, arrays, keep, n, names, mesh):
    from .backends.jax import JaxExecutable
    return JaxExecutable(program, arrays, keep, n, names, mesh)


class Builder:
    """`@eagle.Graph.builder`: a builder (makes its graph) or a block (appends to a given one)."""

    def __init__(self, fn):
        self.fn = fn
        self.__name__, self.__qualname__, self.__doc__ = fn.__name__, fn.__qualname__, fn.__doc__
        self.__wrapped__ = fn
        self.signature = inspect.signature(fn)
        try:
            hints = typing.get_type_hints(fn)
        except Exception:
            hints = dict(getattr(fn, "__annotations__", {}))
        self.graph_param = next((n for n in self.signature.parameters
                                 if hints.get(n) is Graph or hints.get(n) == "eagle.Graph"), None)
        self.converted, self.source = convert_builder(fn)
        self._eager_fn = None

    @property
    def eager_fn(self):
        """The function rewritten for eager runs (disable_staging): its control flow runs in Python."""
        if self._eager_fn is None:
            self._eager_fn = convert_builder(self.fn, eager.EagerRuntime)[0]
        return self._eager_fn

    def __repr__(self):
        return f"<eagle.Graph.{'block' if self.graph_param else 'builder'} {self.__name__}>"

    def __call__(self, *args, **kwargs):
        with staging.collector_paused():
            return self._call(args, kwargs)

    def _call(self, args, kwargs):
        if self.graph_param is not None:
            return self._call_block(args, kwargs)
        if eager.staging_disabled():
            return eager.call_builder(self, args, kwargs)
        args, kwargs = release(args), release(kwargs)      # a plain function's guarded arguments (guards.py)
        bound = self._bind(args, kwargs)
        bound.apply_defaults()
        names = {id(v): k for k, v in bound.arguments.items() if staging.is_array(v)}
        ctx = _BuildContext(self, names)
        stagers = CONTEXT.graph_stagers
        depth = len(stagers)
        args = ctx.wrap(tuple(bound.args))
        kwargs = ctx.wrap(dict(bound.kwargs))
        with CONTEXT.enter(building=ctx, builder_sources=self.source):
            try:
                ret = self.converted(*args, **kwargs)
            except TypeError as e:
                if ctx.graph is not None or not ctx.planes:
                    raise
                raise TypeError(f"{self.__name__}: its arguments are used before its graph exists ({e}); a "
                                "builder creates its graph first: g = eagle.Graph(), stages kernel calls into it, "
                                "declares g.result = ... and ends with `return g`") from None
            finally:
                del stagers[depth:]           # the trace its eagle.Graph() pushed
        if ctx.graph is None or ret is not ctx.graph:
            raise TypeError(f"{self.__name__}: a builder returns its graph: `return g`; declare the arrays with "
                            "`g.result = ...`" + ("" if ctx.graph is not None else
                                                  " (and create it first: g = eagle.Graph())"))
        if CONTEXT.deferring:
            ret._close()              # a transform stages it: the outermost call lowers what it makes
        else:
            ret.build()
        ret._unread_args = {k: v for k, v in bound.arguments.items()
                            if staging.is_array(v) and k not in ret._input_names}
        for k, v in bound.arguments.items():       # tree arguments: bind takes them leaf by leaf
            if isinstance(v, (tuple, list, dict)):
                leaves, tree = tree_flatten(v, is_leaf=staging.is_array)
                if any(staging.is_array(x) for x in leaves):
                    at = {id(e.array): i for i, e in enumerate(ret._trace.input_planes)}
                    ret._tree_args[k] = (tree, [None if not staging.is_array(x) else (at.get(id(x)), x)
                                                for x in leaves])
        return ret

    def _bind(self, args, kwargs):
        """The call's arguments bound to the builder's parameters; a mismatch names them."""
        try:
            return self.signature.bind(*args, **kwargs)
        except TypeError as e:
            params = ", ".join(self.signature.parameters)
            unknown = [k for k in kwargs if k not in self.signature.parameters]
            hint = f"; {', '.join(map(repr, unknown))} is not one of them" if unknown else ""
            raise TypeError(f"{self.__name__}: {e}; the {'block' if self.graph_param else 'builder'} takes "
                            f"({params}){hint}") from None

    def _call_block(self, args, kwargs):
        bound = self._bind(args, kwargs)
        handle = bound.arguments[self.graph_param]
        if eager.is_eager_handle(handle):
            return eager.call_block(self, args, kwargs)
        graph = handle if isinstance(handle, Graph) else getattr(handle, "graph", None)
        if not isinstance(graph, Graph):
            raise TypeError(f"{self.__name__}: its parameter {self.graph_param!r} takes the graph (or a branch) to "
                            f"append to, got {type(handle).__name__}")
        outermost = not CONTEXT.builder_sources
        given: dict = {}        # id(plane) -> the caller's array it stands for

        def enter(arr):
            p = graph._trace.plane_of_array(arr)
            given[id(p)] = arr
            return p
        with CONTEXT.enter(builder_sources=self.source), graph._staging():
            if outermost:   # called from plain code (a hand-made graph): its arrays enter as planes
                args, kwargs = _wrap_arrays((args, kwargs), {}, enter)
            ret = self.converted(*args, **kwargs)
        return _pin_results(graph, ret, given) if outermost else ret


def _pin_results(graph, tree, given):
    """A block called from plain code (on a hand-made graph) hands its planes out as NumPy arrays,
    filled after every launch; staging the array later in the same graph reads the plane itself.
    An argument it returns untouched is the caller's array itself (given: id(plane) -> array)."""
    t = graph._trace
    leaves, treedef = tree_flatten(tree, is_leaf=lambda x: isinstance(x, Plane))
    leaves = [given.get(id(x), x) for x in leaves]
    if graph._backend not in (None, "numpy") or not all(isinstance(e.array, np.ndarray) for e in t.externs.values()):
        return tree_unflatten(treedef, leaves)    # a CUDA graph: its planes stay handles that read the device arrays
    out = []
    for x in leaves:
        if isinstance(x, Plane) and x.graph is graph:
            arr = np.zeros(x.aval.shape, x.aval.dtype)
            t.pinned[id(arr)] = (arr, x)
            x = arr
        out.append(x)
    return tree_unflatten(treedef, out)
