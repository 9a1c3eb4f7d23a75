"""The staging side of eagle_fx.Graph: builders, blocks, parallel regions, and closing a staged graph.

A BUILDER (`@Graph.builder` on a function with no Graph parameter) makes `g = eagle.Graph()`,
stages into it, sets `g.result` and returns `g`; calling the builder on arrays builds the graph,
and calling it inside another builder on the staged values of the graph being built inlines it
into that graph (nesting.py).
A BLOCK (a parameter annotated `eagle.Graph`) appends to the graph or branch it is given.

`GraphStaging` is what a Graph is while it is staged (its trace, result tree, forks, host nodes)
and what closing it makes: the Program and the closed Program (closed.py) the next stage lowers.
graph.py's Graph, the handle that replays what was built, extends it.
"""
from __future__ import annotations

import inspect
import typing

import numpy as np

from hawk_fx.context import CONTEXT
from hawk_fx.tree import TreeDef, make_node, node_children, tree_flatten, tree_unflatten

from . import builder_cache, eager, nesting, staging
from .autograph import convert_builder
from ..backends import select as _select
from ..ir.closed import Closed, Recording
from .guards import release
from .staging import GraphTrace, Plane


class OpaqueNode:
    """A host function the graph calls as one node, with the arrays it reads and writes declared."""

    def __init__(self, fn, reads=None, writes=None, jvp=None, vjp=None):
        self.fn = fn
        self.reads = dict(reads or {})
        self.writes = dict(writes or {})
        self.jvp, self.vjp = jvp, vjp


def opaque(fn, reads=None, writes=None, *, jvp=None, vjp=None) -> OpaqueNode:
    """A host node: `fn()` runs at its place in every replay; reads/writes name the arrays it touches,
    so ordering and branch hazards are checked like any kernel's.

    With derivative rules (jvp= and/or vjp=) it is a pure host function that transforms pass
    through, and every function takes and returns dicts keyed by the reads/writes names:
    fn(primals) -> {write name: value}, the values of the reads given; jvp(primals, tangents) ->
    {write name: tangent}; vjp(primals, cotangents) -> {read name: cotangent}, where the rules'
    primals also hold the values fn wrote (an implicit-function rule reads the root fn found)."""
    for nm, rule in (("jvp", jvp), ("vjp", vjp)):
        if rule is not None and not callable(rule):
            raise TypeError(f"eagle_fx.opaque: {nm}= takes a function, got {type(rule).__name__}")
    return OpaqueNode(fn, reads, writes, jvp, vjp)


class _BuildContext:
    def __init__(self, builder, arg_names):
        self.builder, self.arg_names, self.graph = builder, arg_names, None
        self.planes: dict = {}       # id(array) -> the staged plane the builder sees for that argument

    def wrap(self, value):
        """Arguments (and arrays in tuples, lists and dicts of them) as staged planes."""
        return _wrap_arrays(value, self.planes, lambda a: staging.argument_plane(a, self.arg_names.get(id(a))))

    def claim(self, graph):
        """`graph` is the one the builder made: its arguments' planes become the graph's."""
        self.graph = graph
        t = graph.trace
        t.arg_names = self.arg_names
        for p in self.planes.values():
            p.graph = graph
            t.externs[id(p.key.array)] = p.key
            t.handles.add(p)
        CONTEXT.graph_stagers.append(t)      # popped by the builder call that made this context


def _wrap_arrays(value, planes: dict, make):
    """`value` with each array in it (and in the tree nodes holding them: tuples, lists, dicts,
    NamedTuples, dataclasses, registered classes) replaced by its staged plane, made once per array
    by `make` and kept in `planes` (id(array) -> plane)."""
    if staging.is_array(value):
        p = planes.get(id(value))
        if p is None:
            p = planes[id(value)] = make(value)
        return p
    if isinstance(value, (tuple, list)) and type(value) in (tuple, list):
        return type(value)(_wrap_arrays(v, planes, make) for v in value)
    if type(value) is dict:
        return {k: _wrap_arrays(v, planes, make) for k, v in value.items()}
    node = node_children(value)       # a NamedTuple, dataclass or registered class: its arrays are staged too
    if node is not None:
        kind, meta, kids = node
        new = [_wrap_arrays(v, planes, make) for v in kids]
        if any(n is not v for n, v in zip(new, kids)):
            return make_node(TreeDef(kind, meta), new)
    return value


class Branch:
    """One branch of a parallel region; `with p.branch() as b:`. Nodes staged inside run in order."""

    def __init__(self, fork: "Fork", index: int):
        self.fork, self.index = fork, index
        self.graph = fork.graph
        self.path = fork.path + ((fork.id, index),)
        self._saved = None

    def __enter__(self):
        t = self.graph.trace
        self._saved = t.branch
        t.branch = self.path
        return self

    def __exit__(self, *exc):
        self.graph.trace.branch = self._saved
        return False

    def parallel(self) -> "Fork":
        """A fork inside this branch."""
        return Fork(self.graph, self.path)

    def wait(self, plane):
        """This branch continues only after the node that last wrote `plane`."""
        self.graph.trace.add_wait(self.path, plane)
        return self


class Fork:
    """A parallel region: `with g.parallel() as p:`; leaving it joins its branches."""

    def __init__(self, graph, path=()):
        self.graph, self.path = graph, path
        self.id = graph.trace.open_fork()
        self.count = 0

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *exc):
        if exc_type is None:
            self.graph.trace.close_fork(self.id, len(self.path))
        return False

    def branch(self) -> Branch:
        b = Branch(self, self.count)
        self.count += 1
        return b


class _StagingInto:
    """`with _StagingInto(graph):` kernel calls stage into `graph` (refused once it is built)."""

    def __init__(self, graph):
        self.graph = graph

    def __enter__(self):
        t = self.graph.trace
        self.pushed = CONTEXT.innermost("graph_stagers") is not t
        if self.pushed:
            if self.graph.is_closed:
                raise RuntimeError("eagle.Graph: this graph is built; stage into a new graph")
            CONTEXT.graph_stagers.append(t)

    def __exit__(self, *exc):
        if self.pushed:
            CONTEXT.graph_stagers.pop()
        return False


class GraphStaging:
    """A graph being staged: its trace and declared result, the verbs that stage into it, and the
    closing of it into a Program and a closed Program."""

    _checkpoints = None             # record=True, checkpoints=K: loops keep at most K states (recording.py)

    def __new__(cls, *args, **kwargs):
        ctx = CONTEXT.innermost("building")
        if isinstance(ctx, nesting.InlineContext) and ctx.graph is None:
            return ctx.make_graph()         # a builder inlined into the graph being built (nesting.py)
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
        self._program = None
        self._input_names: dict[str, int] = {}
        self.unread_args: dict = {}  # array arguments of the builder no node reads: bindable all the same
        self._tree_args: dict = {}   # builder argument name -> (tree, leaves) of a tree argument, for bind
        self.made_by = None          # the Builder whose call made this graph
        ctx = CONTEXT.innermost("building")
        if ctx is not None and ctx.graph is None:
            ctx.claim(self)
            self.made_by = ctx.builder

    @property
    def trace(self) -> GraphTrace:
        """What staging records into this graph (staging.py)."""
        return self._trace

    @property
    def recorded(self) -> bool:
        """Built with record=True."""
        return self._record

    @property
    def has_result(self) -> bool:
        """A result is declared (g.result = ...)."""
        return self._has_result

    @property
    def is_closed(self) -> bool:
        """Its Program is made: nothing more stages into it."""
        return self._program is not None

    # -- staging verbs -----------------------------------------------------------------------
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
        return _StagingInto(self)

    # -- closing -----------------------------------------------------------------------------
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
                who = f"eagle.Graph.builder {self.made_by.__name__}" if self.made_by else "eagle.Graph"
                what = f"argument {e.name!r}" if e.name else "an array the builder reaches by closure"
                raise ValueError(f"{who}: {what} is a read-only array, and the graph writes it in place (a Mutable "
                                 "or buffer=); pass a writeable array")
        self._input_names = {e.name: i for i, e in enumerate(t.input_planes) if e.name}

    def _traced(self, backend, transformed):
        """The closed Program of this (closed) graph: `transformed`, what transforms take (its
        backend 'jax' or None: NumPy); else the builder's own, lowered on `backend` with the Vars its
        handles keep and, record=True, what the record needs."""
        t, prog = self._trace, self._program
        leaves, tree = self.result_vars() if self._has_result else ([], None)
        c = Closed(prog, list(t.input_planes), tree, len(leaves), t.n, backend, self._mesh, record=self._record)
        c.tree_args = self._tree_args
        c.transformed = transformed
        if not transformed:
            # each handle's version and its buffer's last one (what the handle reads after a replay)
            c.keep = {v for h in list(t.handles) + t.buffers if h.var is not None
                      for v in (h.var, t.root.current.get(h.key, h.var))}
            if self._record:
                written = [(i, final) for i, (v, e) in enumerate(zip(prog.inputs, t.input_planes))
                           if (final := t.root.current.get(e, v)) is not v]
                labelled = [t.buffer_value(h) for h in t.buffers if h.label and h.var is not None]
                c.recording = Recording(written, labelled, list(t.root.current.values()), self._checkpoints)
        return c

    def result_vars(self):
        """(the Program's Vars of the result leaves, the result tree)."""
        leaves, tree = tree_flatten(self._result_tree, is_leaf=lambda x: isinstance(x, Plane) or staging.is_array(x))
        return list(self._program.outputs[:len(leaves)]), tree


    def gradient_names(self):
        """What eagle_fx.diff differentiates by name: name -> (kind, (Var on entry / of the buffer, Var on exit))."""
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

    def _fill_pinned(self):
        """Copy each block result handed out as an array (see Builder._call_block) from its plane."""
        if not self._trace.pinned:
            return
        for arr, plane in self._trace.pinned.values():
            np.copyto(arr, np.asarray(self.array_of(plane)))

    def _read_inputs(self):
        """The NumPy arrays of the builder's inputs that the graph reads and never writes."""
        t, prog = self._trace, self._program
        return [e.array for e, v in zip(t.input_planes, prog.inputs)
                if isinstance(e.array, np.ndarray) and t.root.current.get(e, v) is v]

    def _pin_results(self, tree, given):
        """A block called from plain code (on a hand-made graph) hands its planes out as NumPy arrays,
        filled after every launch; staging the array later in the same graph reads the plane itself.
        An argument it returns untouched is the caller's array itself (given: id(plane) -> array)."""
        t = self._trace
        leaves, treedef = tree_flatten(tree, is_leaf=lambda x: isinstance(x, Plane))
        leaves = [given.get(id(x), x) for x in leaves]
        asked = self._backend
        if (asked is not None and not _select.resolve_entry(asked)[0].host_results) \
                or not all(isinstance(e.array, np.ndarray) for e in t.externs.values()):
            return tree_unflatten(treedef, leaves)    # a CUDA graph: its planes stay handles on the device arrays
        out = []
        for x in leaves:
            if isinstance(x, Plane) and x.graph is self:
                arr = np.zeros(x.aval.shape, x.aval.dtype)
                t.pinned[id(arr)] = (arr, x)
                x = arr
            out.append(x)
        return tree_unflatten(treedef, out)


def check_returned(builder, graph, ret):
    """A builder returns the graph it made."""
    if graph is None or ret is not graph:
        raise TypeError(f"{builder.__name__}: a builder returns its graph: `return g`; declare the arrays with "
                        "`g.result = ...`" + ("" if graph is not None else " (and create it first: g = eagle.Graph())"))


def _static_positions(fn, signature, argnums, argnames):
    """{position: name} of the parameters `static_argnums` and `static_argnames` name, checked."""
    api = f"eagle_fx.Graph.builder({fn.__name__})"
    argnums = (argnums,) if isinstance(argnums, int) else tuple(argnums)
    argnames = (argnames,) if isinstance(argnames, str) else tuple(argnames)
    params = [p.name for p in signature.parameters.values()
              if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    out = {}
    for k in argnums:
        if type(k) is not int or not -len(params) <= k < len(params):
            raise ValueError(f"{api}: static_argnums has {k!r}; {fn.__name__} takes {len(params)} positional "
                             f"parameter(s) ({', '.join(params)}): give their positions")
        out[k % len(params)] = params[k]
    for name in argnames:
        if name not in params:
            raise ValueError(f"{api}: static_argnames has {name!r}, which is not a positional parameter of "
                             f"{fn.__name__} ({', '.join(params)})")
        out[params.index(name)] = name
    return out


class Builder:
    """`@eagle.Graph.builder`: a builder (makes its graph) or a block (appends to a given one)."""

    def __init__(self, fn, static_argnums=(), static_argnames=()):
        self.fn = fn
        self.__name__, self.__qualname__, self.__doc__ = fn.__name__, fn.__qualname__, fn.__doc__
        self.__wrapped__ = fn
        self.signature = inspect.signature(fn)
        self.static_argnums = _static_positions(fn, self.signature, static_argnums, static_argnames)
        try:
            hints = typing.get_type_hints(fn)
        except Exception:
            hints = dict(getattr(fn, "__annotations__", {}))
        self.graph_param = next((n for n in self.signature.parameters
                                 if _is_graph_type(hints.get(n)) or hints.get(n) == "eagle.Graph"), None)
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
        if self.graph_param is None:         # a direct call of a layout seen before: no binding, no build
            g = builder_cache.fast_call(self, args, kwargs)
            if g is not None:
                return g
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
        into = nesting.target(self, bound) if CONTEXT.graph_stagers else None
        if into is not None:             # called on the staged values of the graph being built: inline
            return nesting.call(self, bound, into)
        if builder_cache.enabled():      # a direct call: the staging of an earlier call with this layout, rebound
            return builder_cache.call(self, bound, lambda: self._stage(bound))
        return self._stage(bound)

    def cache_info(self):
        """(hits, misses, currsize, maxsize) of this builder's direct calls (builder_cache.py)."""
        from .cache import CacheInfo, MAXSIZE, cache_for
        c = cache_for(self, create=False)
        return c.info() if c is not None else CacheInfo(0, 0, 0, MAXSIZE)

    def clear_cache(self):
        """Forget the graphs staged for this builder's direct calls: the next call stages again."""
        from .cache import clear
        clear(self)

    def _stage(self, bound):
        """Stage, close and (outside a transform) build the graph of one call."""
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
        check_returned(self, ctx.graph, ret)
        if CONTEXT.deferring:
            ret._close()              # a transform stages it: the outermost call lowers what it makes
        else:
            ret.build()
        builder_cache.finish(ret, bound)
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
        graph = handle if isinstance(handle, GraphStaging) else getattr(handle, "graph", None)
        if not isinstance(graph, GraphStaging):
            raise TypeError(f"{self.__name__}: its parameter {self.graph_param!r} takes the graph (or a branch) to "
                            f"append to, got {type(handle).__name__}")
        outermost = not CONTEXT.builder_sources
        given: dict = {}        # id(plane) -> the caller's array it stands for

        def enter(arr):
            p = graph.trace.plane_of_array(arr)
            given[id(p)] = arr
            return p
        with CONTEXT.enter(builder_sources=self.source), _StagingInto(graph):
            if outermost:   # called from plain code (a hand-made graph): its arrays enter as planes
                args, kwargs = _wrap_arrays((args, kwargs), {}, enter)
            ret = self.converted(*args, **kwargs)
        return graph._pin_results(ret, given) if outermost else ret


def _is_graph_type(hint) -> bool:
    """A parameter annotated eagle_fx.Graph (a class that stages into a graph)."""
    return isinstance(hint, type) and issubclass(hint, GraphStaging)
