"""A builder called directly, again: its staged graph is reused, as jax.jit reuses a trace.

`g = model(x)` stages model's graph, fuses and lowers it. A later call with the same layout
(cache.graph_key: shapes, dtypes, strides, writeability, overlaps, the static Python values and
the backend `use_backend` asks for) takes the closed Program kept from the first and makes a NEW
Graph of it, bound to that call's arrays (the caller's arrays themselves, as a fresh build binds
them), its executable copied from a template of the first call's NumPy lowering (buffers of its
own, nothing planned or generated; backends/templates.py), or a small graph of the layout its
caller dropped, bound anew (recycling.py): each call has its own graph, so two graphs alive at
once share no buffer and a Mutable argument is written in the caller's array. Python floats stay static here (a builder
called directly reads them as numbers); transforms trace them.

What a Graph made this way could not reproduce exactly is not kept, and such a builder stages at
every call as before: a record=True graph, one on a mesh, buffers or block results handed out as
arrays, host nodes (their functions may hold the first call's arrays), attributes the builder set
on the graph, a result leaf that is not a plane the graph computed, an array that is no argument
(one the builder made while it staged, np.random or np.arange, or the copy staging takes of a
global array: a new call must see its new values), an empty array argument, arguments of another
library (jax.Array, CuPy). The staging reads the builder's
globals and closures by name: once one is rebound (a kernel redefined), the next call stages again.

`builder.cache_info()` counts hits and misses; `builder.clear_cache()` forgets the builder's graphs.
"""
from __future__ import annotations

import weakref

import numpy as np

from hawk_fx.context import CONTEXT
from hawk_fx.tree import node_children, tree_flatten, tree_unflatten

from .. import ir
from ..backends.templates import template_of
from ..ir.analysis import prog_params
from . import cache, recycling, staging

# what a Graph's __init__ and a builder call set on it: anything else the builder set makes it uncached
_PLAIN = frozenset(("_record", "_backend", "_mesh", "_trace", "_result_tree", "_has_result", "_program",
                    "_input_names", "unread_args", "_tree_args", "made_by", "_exe", "_backend_used", "_worker",
                    "_worker_error", "_generation", "_views", "_closed_src", "_result_flat"))
_LEAVES = frozenset((np.ndarray, bool, int, float, str, type(None)))   # never a tree: not walked
ENABLED = True      # False: every direct builder call stages afresh (the cache's off switch)
_STACKS = ("building", "deferring", "transforming", "graph_stagers", "builder_sources", "host_nodes",
           "kernel_traces", "recording", "abstract", "eager_runs", "staging_disabled", "guards", "lazy_compile")


class BuilderEntry:
    """What one layout of a direct builder call keeps: the Program (shared, read only), per input
    plane its name and where its array is (cache._planes_in), the arguments it writes and the Var
    each ends as, the result tree, the graph's backend= option, and what staging read by name."""

    __slots__ = ("program", "planes", "where", "written", "tree", "n_results", "n", "backend", "names", "accesses",
                 "waits", "template", "backend_used", "pool")

    def __init__(self, g, where, names):
        t = g.trace
        self.program, self.where, self.names = g._program, where, names
        self.planes = [(e.name, e.origin) for e in t.input_planes]
        self.written = {i: t.root.current[e] for i, (e, v) in enumerate(zip(t.input_planes, g._program.inputs))
                        if t.root.current.get(e, v) is not v}
        self.tree, self.n_results, self.n = g._result_flat[1], len(g._result_flat[0]), t.n
        self.backend = g._backend
        # the lowering itself, taken before the graph runs: a call copies its buffers, not its planning
        self.backend_used = g._backend_used
        self.template = template_of(g._exe) if g._backend_used[0].name == "numpy" else None
        self.pool = recycling.Pool.of(self.template)   # graphs of this layout their callers dropped
        # the nodes' order and the branches' waits, as to_dot draws them: without the planes they
        # touched, which would keep the first call's arrays alive
        light = {id(a): staging.Access(a.seq, a.branch, a.info, (), (), a.what) for a in t.accesses}
        self.accesses = list(light.values())
        self.waits = [staging.Wait(w.branch, w.seq_at, light.get(id(w.writer)) or
                                   staging.Access(w.writer.seq, w.writer.branch, w.writer.info, (), (), w.writer.what))
                      for w in t.waits]


def enabled() -> bool:
    """A direct call from plain code: not nested in a builder, a transform's staging, or an eager run."""
    if not ENABLED:
        return False
    frames = CONTEXT.__dict__              # this thread's stacks, read as one dict
    for kind in _STACKS:
        if frames[kind]:
            return False
    return True


def fast_call(builder, args, kwargs):
    """The Graph of a direct call that hits the cache, before the builder binds its arguments the
    general way (inspect) and pauses the collector for a build; None for anything else (a miss, a
    builder whose parameters are not plain ones, an argument error): Builder.__call__ goes on."""
    plain = _PARAMS.get(builder)
    if plain is None:
        plain = _PARAMS[builder] = _plain_params(builder)
    if not plain or len(args) > len(plain) or not enabled():
        return None
    arguments = dict(zip((name for name, _ in plain), args))
    if kwargs:
        for k in kwargs:
            if k in arguments:
                return None
        arguments.update(kwargs)
    for name, default in plain[len(args):]:
        if name not in arguments:
            if default is _REQUIRED:
                return None
            arguments[name] = default
    if len(arguments) != len(plain):            # an unknown keyword
        return None
    if kwargs:                                  # the parameters' order, as inspect binds them
        arguments = {name: arguments[name] for name, _ in plain}
    return _hit(builder, arguments)


_PARAMS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()   # builder -> ((name, default), ...) or ()
_REQUIRED = object()


def _plain_params(builder):
    """((name, default or _REQUIRED), ...) of a builder whose parameters are all positional-or-keyword
    (no *args, **kwargs, keyword- or positional-only ones); () otherwise."""
    out = []
    for p in builder.signature.parameters.values():
        if p.kind is not p.POSITIONAL_OR_KEYWORD:
            return ()
        out.append((p.name, _REQUIRED if p.default is p.empty else p.default))
    return tuple(out)


def _hit(builder, arguments):
    """The new Graph of a call whose layout is cached (arguments: name -> value, defaults applied), or None."""
    key, leaves, _ = cache.graph_key(tuple(arguments.values()))
    if key is None:
        return None
    c = cache.cache_for(builder, create=False)
    if c is None:
        return None
    key = (tuple(arguments), key)
    e = c.entries.get(key)
    if e is None:
        return None
    if not cache.unchanged(e.names):
        c.entries.pop_if(key, e)
        return None
    c.hits += 1
    pool = e.pool
    if pool is None:
        return _graph_of(builder, e, leaves, arguments)
    taken = pool.take()
    if taken is not None:
        return _again(taken, e, leaves, arguments)
    g = _graph_of(builder, e, leaves, arguments)
    pool.keep(g)
    return g


def call(builder, bound, stage):
    """The Graph of `builder` on these bound arguments: a new one from the cached staging of this
    layout, or `stage()`'s (a fresh build), kept for the next call when it can be reproduced."""
    g = _hit(builder, bound.arguments)
    if g is not None:
        return g
    values = tuple(bound.arguments.values())
    key, leaves, _ = cache.graph_key(values)
    if key is None:
        return stage()
    key = (tuple(bound.arguments), key)
    c = cache.cache_for(builder)
    g = stage()
    where = _reproducible(g, leaves)
    names = cache.names_read(builder) if where is not None else ()
    if where is not None and all(k is not None or any(a is obj for _, _, obj in names) for k, a, _ in where):
        c.store(key, BuilderEntry(g, where, names))
    else:
        c.misses += 1
    return g


def _reproducible(g, leaves):
    """cache._planes_in of a freshly built graph when a Graph made from its Program is the same
    graph on new arrays; else None (not kept). The caller keeps it only when each array that is
    no argument is one the builder reaches by name (checked at each call): one it made while
    staging (np.random, the copy staging takes of a global array) could differ next time."""
    from ..graph import Graph
    t = g.trace
    if (type(g) is not Graph or g._record or g._mesh is not None or not g.is_built or t.buffers or t.pinned
            or g._views or not _PLAIN.issuperset(vars(g)) or _has_host_nodes(g._program)):
        return None
    if not all(isinstance(e, staging.Extern) and isinstance(e.array, np.ndarray) for e in t.input_planes) \
            or any(type(x) is np.ndarray and not x.size for x in leaves):   # an empty array has no address to find
        return None
    if g._has_result:
        outs = g._program.outputs
        hs, _ = g._result_flat
        if not all(isinstance(h, staging.Plane) and h.graph is g and h.var is outs[k] for k, h in enumerate(hs)):
            return None
    where = cache._planes_in(g._own_closed(), leaves)
    return where


def _has_host_nodes(prog) -> bool:
    for e in prog.eqns:
        if e.prim is ir.opaque_p or any(_has_host_nodes(p) for p in prog_params(e)):
            return True
    return False


def _again(taken, e, leaves, arguments):
    """A graph of this layout its caller dropped, set up as a new one on this call's arrays."""
    g = e.pool.rebind(taken, cache.arrays_on(e.where, leaves))
    if g._tree_args:
        _finish(g, arguments)
    else:                      # which arguments no node reads is the layout's: the first call's names
        g.unread_args = {k: arguments[k] for k in g.unread_args}
    return g


def _graph_of(builder, e, leaves, arguments):
    """A new Graph running `e`'s Program on the call's arrays, set up as a fresh build leaves it.
    With a template (a NumPy lowering kept from the first call), its executable is the template's
    copy: the call allocates its buffers and binds them, and plans, generates and resolves nothing."""
    from ..graph import Graph
    planes = [staging.Extern(a, name, origin) for (name, origin), a in zip(e.planes, cache.arrays_on(e.where, leaves))]
    g = Graph(backend=e.backend)
    if e.template is not None:
        g._exe, g._backend_used = e.template.instantiate([p.array for p in planes]), e.backend_used
    t = g._trace
    t.input_planes, t.n = planes, e.n
    t.accesses, t.waits = e.accesses, e.waits
    t.externs = {id(p.array): p for p in planes}
    t.arg_names = {id(v): k for k, v in arguments.items() if type(v) is np.ndarray or staging.is_array(v)}
    t.root.current.update((planes[i], v) for i, v in e.written.items())
    g._program = e.program
    if e.tree is not None:
        handles = [staging.Plane(g, v.aval, var=v) for v in e.program.outputs[:e.n_results]]
        t.handles.update(handles)
        g._result_tree = handles[0] if e.tree.kind == "leaf" else tree_unflatten(e.tree, handles)
        g._has_result = True
        g._result_flat = (handles, e.tree)
    g._input_names = {p.name: i for i, p in enumerate(planes) if p.name}
    g.made_by = builder
    if g._exe is None:
        g.build()
    _finish(g, arguments)
    return g


def finish(g, bound):
    """What a builder call records on its graph after the build: the array arguments no node
    reads (bindable all the same), and each tree argument's leaves, for bind."""
    _finish(g, bound.arguments)


def _finish(g, arguments):
    names = g._input_names
    g.unread_args = {k: v for k, v in arguments.items()
                     if (type(v) is np.ndarray or staging.is_array(v)) and k not in names}
    for k, v in arguments.items():
        if type(v) in _LEAVES:
            continue
        if node_children(v) is not None:       # any tree the call takes: containers, dataclasses, registered
            leaves, tree = tree_flatten(v, is_leaf=staging.is_array)
            if any(staging.is_array(x) for x in leaves):
                at = {id(e.array): i for i, e in enumerate(g.trace.input_planes)}
                g._tree_args[k] = (tree, [None if not staging.is_array(x) else (at.get(id(x)), x) for x in leaves])
