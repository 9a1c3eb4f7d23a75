"""JAX-shaped transformations of builders, each a Program -> Program transform that composes.

    prog = eagle_fx.make_program(f)(x, flag)          # the staged Program of f (like jax.make_jaxpr)
    y, pullback = eagle_fx.vjp(f, x, flag)             # pullback(ct) -> a cotangent per argument
    y, ty = eagle_fx.jvp(f, (x, flag), (dx, None))     # forward mode
    dx = eagle_fx.grad(loss)(x, flag)                  # loss's result is one value
    v, dp = eagle_fx.value_and_grad(loss)(params, x)  # params: a dict (any tree) of arrays
    fb = eagle_fx.vmap(f, in_axes=(0, None))           # B instances in one graph
    eagle_fx.vmap(eagle_fx.grad(loss), in_axes=(0, None))(xs, flag)     # per-instance gradients
    eagle_fx.jvp(eagle_fx.grad(loss), (x, flag), (v, None))             # Hessian-vector product
    eagle_fx.hessian(loss)(x, flag)                                     # jacfwd(jacrev(loss))

This module holds what every transform shares: the transformed-function object, staging a
function into a Graph, and a staged graph seen as a function of its arguments' leaves. The
transforms live in derivatives.py (jvp, vjp, grad, value_and_grad), jacobians.py and batching.py.

A transformed function stages a Graph from a Program (`.graph(*args)` gives a new one: bind,
launch and result work on it) and, called, replays a cached graph for the arguments' layout and
returns copies of its result (eagle_fx/cache.py). vmap of a builder is a builder: it returns the
Graph. Inside a function handed to a transform (vmap(lambda x, t: eagle_fx.jvp(f, (x,), (t,)))),
transformed functions and jvp return their Graphs, for the outer transform to take.
"""
from __future__ import annotations

import numpy as np

from hawk_fx.core import Var
from hawk_fx.perthread import ThreadDict, ThreadStack
from hawk_fx.tree import tree_flatten, tree_unflatten

from . import cache
from .transforms.program import TransformError, dce

_STAGING = ThreadStack()     # non-empty: a transform is staging a plain function; transforms return Graphs
_BATCH_FULL = ThreadDict()   # id(instance array) -> its batched array, while vmap stages an instance


class Transformed:
    """A function a transform made. `graph(*args)`: a new Graph it runs for these arguments.
    Called, it replays a cached graph for the arguments' layout (see eagle_fx.cache).

    prepare(args) -> (args, restore): turns the arguments into what the graph takes (a Python
    float to differentiate becomes a one-cell array) and restore(values) gives the result back
    the shapes the caller gave."""

    def __init__(self, name, stage, values=True, vmap_of=None, sig=None, prepare=None):
        self.__name__ = name
        self._stage, self._values, self._prepare = stage, values, prepare
        self._vmap_of = vmap_of          # (f, in_axes, out_axes) of a vmap: an outer vmap flattens both
        self._sig = sig if sig is not None else self   # the cache's name for it: (transform, options, function)

    def graph(self, *args):
        if self._prepare is not None:
            args = self._prepare(args)[0]
        return self._stage(*args)

    def __call__(self, *args, **kwargs):
        if kwargs:
            raise TypeError(f"{self.__name__}: pass the arguments positionally (got {', '.join(kwargs)} by keyword)")
        if _STAGING or not self._values:
            return self.graph(*args)
        restore = None
        if self._prepare is not None:
            args, restore = self._prepare(args)
        with cache.staged(self._sig, args, self._stage) as e:
            out = run(e.graph)
        return restore(out) if restore is not None else out

    def cache_info(self):
        """(hits, misses, currsize, maxsize) of its cache of staged graphs."""
        c = cache.cache_for(self._sig, create=False)
        return c.info() if c is not None else cache.CacheInfo(0, 0, 0, cache.MAXSIZE)

    def clear_cache(self):
        """Forget its staged graphs: the next call stages again."""
        cache.clear(self._sig)

    def __repr__(self):
        return f"<eagle_fx transformed function {self.__name__}>"


def name_of(f):
    return getattr(f, "__name__", type(f).__name__)


def sig(kind, f, *options):
    """The cache's name for transform `kind` of `f`: equal for grad(f) made twice."""
    return (kind, f._sig if isinstance(f, Transformed) else f) + tuple(map(freeze, options))


def freeze(x):
    """A hashable copy of an option (lists of axes become tuples)."""
    if x is None or type(x) in (int, bool):
        return x
    if isinstance(x, (list, tuple)):
        return (type(x).__name__,) + tuple(freeze(v) for v in x)
    if isinstance(x, dict):
        return ("dict",) + tuple((k, freeze(v)) for k, v in x.items())
    return x


def run(g):
    """Replay `g` and return copies of its result (as its result views show it: a Jacobian in JAX's shape)."""
    g.launch()
    if g._has_result:
        leaves, tree = g._result_flat
        if tree.kind == "leaf":
            out = np.array(g._leaf_array(leaves[0], g._program.outputs[0]))
        else:
            out = tree_unflatten(tree, [np.array(g._leaf_array(x, v)) for x, v in zip(leaves, g._program.outputs)])
    else:
        out = None
    return out


def stage(f, args, api):
    """The Graph `f` stages for these arguments: a builder builds it, a transformed function makes
    it, a plain function must return one (it calls a transform inside: a lambda around jvp)."""
    from .graph import Builder, Graph
    if isinstance(f, Transformed):
        return f.graph(*args)
    if not callable(f):
        raise TypeError(f"{api}: takes a graph builder (@eagle_fx.Graph.builder) or a transformed function, got "
                        f"{type(f).__name__}")
    if isinstance(f, Builder):
        g = f(*args)
    else:
        _STAGING.append(True)
        try:
            g = f(*args)
        finally:
            _STAGING.pop()
    if not isinstance(g, Graph):
        raise TypeError(f"{api}: {name_of(f)!r} returned {type(g).__name__}; a transform takes a graph builder "
                        "(@eagle_fx.Graph.builder on a function that returns its graph), a transformed function, "
                        "or a function returning one transform's result (lambda x, t: eagle_fx.jvp(f, (x,), (t,)))")
    if g._record:
        raise TransformError(f"{api}: a record=True graph cannot be transformed; transform the plain builder")
    return g


def make_program(f):
    """A function returning the Program that `f` stages for these arguments."""
    def program(*args):
        return stage(f, args, "eagle_fx.make_program").program
    return program


def make_graph(f):
    """A function returning the built Graph that `f` stages for these arguments, to replay:
    make_graph(lambda x, v: eagle_fx.jvp(eagle_fx.grad(f), (x,), (v,)))(x, v) is a
    Hessian-vector product graph; bind new arrays to it, launch it, read its result."""
    def graph(*args):
        return stage(f, args, "eagle_fx.make_graph")
    return graph


# ---------------------------------------------------------------------------------------------
# the pieces every transform needs from a staged graph

def is_array(x):
    return isinstance(x, np.ndarray)


def float_array(a):
    return isinstance(a, np.ndarray) and a.dtype.kind == "f"


class Staged:
    """A staged graph seen as a function: its Program restricted to the result, and which leaf of
    which builder argument each Program input is (`arg_of`: (argument, leaf) or None)."""

    def __init__(self, f, args, api):
        self.api, self.fname, self.args = api, name_of(f), args
        self.g = g = stage(f, args, api)
        if any(e.params.get("batch") for e in g.program.eqns):
            raise TransformError(f"{api}: {self.fname} is batched (made by vmap or a Jacobian); differentiate "
                                 "first, then batch: eagle_fx.vmap(eagle_fx.grad(f)); for second derivatives use "
                                 "eagle_fx.hessian(f), eagle_fx.jacfwd(eagle_fx.jacrev(f)) or "
                                 "eagle_fx.jvp(eagle_fx.grad(f), ...)")
        leaves, self.tree = g._result_vars() if g._has_result else ([], None)
        if not leaves:
            raise TypeError(f"{api}: {self.fname} declares no result (g.result = ...); transforms act on results")
        self.results = leaves
        self.prog = dce(g.program.replace(outputs=leaves))
        self.planes = list(g._trace.input_planes)
        self.leaves = [tree_flatten(a, is_leaf=is_array)[0] for a in args]
        self.arg_trees = [tree_flatten(a, is_leaf=is_array)[1] for a in args]
        where = {}
        for k, ls in enumerate(self.leaves):
            for j, x in enumerate(ls):
                if isinstance(x, np.ndarray):
                    where.setdefault(id(x), (k, j))
        self.arg_of = [where.get(id(e.array)) for e in self.planes]
        self.n = g._trace.n

    def graph(self, prog, extra_planes, tree, n_results):
        from .graph import Graph
        return Graph._from_program(prog, self.planes + list(extra_planes), tree, n_results, self.n)

    def capacity(self, trip, e):
        """The most turns a counted loop of trip count `trip` (a Program input) runs: its value now,
        the largest over the instances under vmap."""
        if trip in self.prog.inputs:
            arr = self.planes[self.prog.inputs.index(trip)].array
            full = _BATCH_FULL.get(id(arr))
            src = full if full is not None else arr
            cap = int(np.max(src))
            cache.note_capacity(src, cap)
            return cap
        raise TransformError(f"{self.api}: the trip count of the counted loop at {e.info.where} is computed in the "
                             "graph; reverse mode needs to know its turns: cap the loop "
                             "(`for _ in range(N): if not cell: break`)")


def graph_of(s: Staged, prog, outputs, extra_planes):
    """The Graph running `prog` with result `outputs` (a tree whose leaves are Program Vars)."""
    leaves, tree = tree_flatten(outputs, is_leaf=lambda v: isinstance(v, Var))
    return s.graph(dce(prog.replace(outputs=leaves)), extra_planes, tree, len(leaves))


def select_result(g, k):
    """A Graph over g's inputs whose result is part k of g's result tuple (a jvp graph's tangent)."""
    from .graph import Graph
    leaves, tree = g._result_vars()
    start = sum(c.num_leaves for c in tree.children[:k])
    part = tree.children[k]
    outs = leaves[start:start + part.num_leaves]
    return Graph._from_program(dce(g.program.replace(outputs=outs)), g._trace.input_planes, part, len(outs),
                               g._trace.n)


def arg_names(f, n):
    sig_ = getattr(f, "signature", None)
    names = list(sig_.parameters)[:n] if sig_ is not None else []
    return names + [str(k) for k in range(len(names), n)]


def argnums_of(argnums, nargs, api):
    """(positions, multi): argnums as non-negative positions; multi when a tuple was given."""
    multi = not isinstance(argnums, int)
    pick = tuple(argnums) if multi else (argnums,)
    if multi and not pick:
        raise ValueError(f"{api}: argnums is empty; give an int or a tuple of ints")
    for k in pick:
        if not isinstance(k, int) or not -nargs <= k < nargs:
            raise ValueError(f"{api}: argnums {k!r} for {nargs} positional arguments")
    return tuple(k % nargs for k in pick), multi
