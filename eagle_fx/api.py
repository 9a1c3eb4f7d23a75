"""JAX-shaped transformations of builders, each a Program -> Program transform that composes.

    prog = eagle_fx.make_program(f)(x, flag)          # the staged Program of f (like jax.make_jaxpr)
    y, pullback = eagle_fx.vjp(f, x, flag)             # pullback(ct) -> a cotangent per argument
    y, ty = eagle_fx.jvp(f, (x, flag), (dx, None))     # forward mode
    dx = eagle_fx.grad(loss)(x, flag)                  # loss's result is one value
    fb = eagle_fx.vmap(f, in_axes=(0, None))           # B instances in one graph
    eagle_fx.vmap(eagle_fx.grad(loss), in_axes=(0, None))(xs, flag)     # per-instance gradients
    eagle_fx.jvp(eagle_fx.grad(loss), (x, flag), (v, None))             # Hessian-vector product

A transformed function stages a Graph from a Program (`.graph(*args)` gives it: bind, launch and
result work on it) and, called, runs it and returns copies of its result. vmap of a builder is a
builder: it returns the Graph. Inside a function handed to a transform (vmap(lambda x, t:
eagle_fx.jvp(f, (x,), (t,)))), transformed functions and jvp return their Graphs, for the outer
transform to take.
"""
from __future__ import annotations

import numpy as np

from hawk_fx.core import Eqn, Var
from hawk_fx.diff import match_tree
from hawk_fx.perthread import ThreadDict, ThreadStack
from hawk_fx.tree import tree_flatten, tree_unflatten

from . import cache, ir
from .staging import Extern
from .transforms.jvp_graph import jvp_graph
from .transforms.program import TransformError, ct_aval, dce, is_float
from .transforms.vjp_graph import vjp_graph
from .transforms.vmap import VmapError, batch_broadcast_p, batch_program

_STAGING = ThreadStack()     # non-empty: a transform is staging a plain function; transforms return Graphs
TRACED = ThreadStack()       # non-empty: eagle_fx.to_jax is staging on stand-ins for traced arrays (no values)
_BATCH_FULL = ThreadDict()   # id(instance array) -> its batched array, while vmap stages an instance


class Transformed:
    """A function a transform made. `graph(*args)`: a new Graph it runs for these arguments.
    Called, it replays a cached graph for the arguments' layout (see eagle_fx.cache)."""

    def __init__(self, name, stage, values=True, vmap_of=None, sig=None):
        self.__name__ = name
        self._stage, self._values = stage, values
        self._vmap_of = vmap_of          # (f, in_axes, out_axes) of a vmap: an outer vmap flattens both
        self._sig = sig if sig is not None else self   # the cache's name for it: (transform, options, function)

    def graph(self, *args):
        return self._stage(*args)

    def __call__(self, *args, **kwargs):
        if kwargs:
            raise TypeError(f"{self.__name__}: pass the arguments positionally (got {', '.join(kwargs)} by keyword)")
        if _STAGING or not self._values:
            return self._stage(*args)
        return _run(cache.staged(self._sig, args, self._stage)[0].graph)

    def cache_info(self):
        """(hits, misses, currsize, maxsize) of its cache of staged graphs."""
        c = cache.cache_for(self._sig, create=False)
        return c.info() if c is not None else cache.CacheInfo(0, 0, 0, cache.MAXSIZE)

    def clear_cache(self):
        """Forget its staged graphs: the next call stages again."""
        cache.clear(self._sig)

    def __repr__(self):
        return f"<eagle_fx transformed function {self.__name__}>"


def _name(f):
    return getattr(f, "__name__", type(f).__name__)


def _sig(kind, f, *options):
    """The cache's name for transform `kind` of `f`: equal for grad(f) made twice."""
    return (kind, f._sig if isinstance(f, Transformed) else f) + options


def _run(g):
    """Replay `g` and return copies of its result (through the transform's finishing step)."""
    g.launch()
    if g._has_result:
        leaves, tree = g._result_flat
        out = tree_unflatten(tree, [np.array(g._leaf_array(x, v)) for x, v in zip(leaves, g._program.outputs)])
    else:
        out = None
    post = getattr(g, "_post", None)
    return post(out) if post is not None else out


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
        raise TypeError(f"{api}: {_name(f)!r} returned {type(g).__name__}; a transform takes a graph builder "
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

class _Staged:
    """A staged graph seen as a function: its Program restricted to the result, and which builder
    argument each Program input is."""

    def __init__(self, f, args, api):
        self.api, self.fname, self.args = api, _name(f), args
        self.g = g = stage(f, args, api)
        if any(e.params.get("batch") for e in g.program.eqns):
            raise TransformError(f"{api}: {self.fname} is batched (made by vmap); differentiate first, then batch: "
                                 "eagle_fx.vmap(eagle_fx.grad(f))")
        leaves, self.tree = g._result_vars() if g._has_result else ([], None)
        if not leaves:
            raise TypeError(f"{api}: {self.fname} declares no result (g.result = ...); transforms act on results")
        self.results = leaves
        self.prog = dce(g.program.replace(outputs=leaves))
        self.planes = list(g._trace.input_planes)
        self.arg_of = [next((k for k, a in enumerate(args) if a is e.array), None) for e in self.planes]
        self.n = g._trace.n

    def graph(self, prog, extra_planes, tree, n_results):
        from .graph import Graph
        backend, mesh = self.g._backend_of()
        return Graph._from_program(prog, self.planes + list(extra_planes), tree, n_results, self.n, backend, mesh)

    def capacity(self, trip, e):
        """The most turns a counted loop of trip count `trip` (a Program input) runs: its value now,
        the largest over the instances under vmap."""
        if trip in self.prog.inputs and TRACED:
            raise TransformError(f"{self.api}: reverse mode through the counted loop at {e.info.where} saves each of "
                                 "its turns, and its trip count is an argument traced by JAX (eagle_fx.to_jax: its "
                                 "value is unknown while staging): cap the loop (`for _ in range(N): if not cell: "
                                 "break`) so its turns are bounded")
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


def _float_array(a):
    return isinstance(a, np.ndarray) and a.dtype.kind == "f"


def _pair_tree(*trees):
    return tree_flatten(tuple(tree_unflatten(t, [0] * t.num_leaves) for t in trees))[1]


def _leaf_tree(n):
    return tree_flatten(0 if n is None else tuple([0] * n))[1]


# ---------------------------------------------------------------------------------------------
# forward mode

def jvp(f, primals, tangents):
    """(result, result tangent) for tangents given per argument (None: no tangent; cells have none)."""
    api = "eagle_fx.jvp"
    primals, tangents = tuple(primals), tuple(tangents)
    if len(primals) != len(tangents):
        raise ValueError(f"{api}: {len(primals)} primals and {len(tangents)} tangents; give one tangent (or None) "
                         "per argument")
    names = _arg_names(f, len(primals))
    for k, (p, t) in enumerate(zip(primals, tangents)):
        if t is None:
            continue
        if not _float_array(p) or np.shape(t) != np.shape(p) or np.asarray(t).dtype != p.dtype:
            need = f"{np.shape(p)} {p.dtype}, or None" if _float_array(p) else "None (it is not a floating array)"
            raise ValueError(f"{api}: the tangent for argument {names[k]} has shape {np.shape(t)} and dtype "
                             f"{np.asarray(t).dtype}; it needs {need}")
    if _STAGING:
        return _jvp_graph(f, primals, tangents, names, api)
    e, _ = cache.staged(_sig("jvp", f), (primals, tangents), lambda p, t: _jvp_graph(f, p, t, names, api))
    return _run(e.graph)


def _jvp_graph(f, primals, tangents, names, api):
    s = _Staged(f, primals, api)
    flags = [k is not None and tangents[k] is not None for k in s.arg_of]
    force = [is_float(v.aval) for v in s.results]
    jp, out_flags = jvp_graph(s.prog, flags, force)
    k = len(s.results)
    outs, eqns = list(jp.outputs[:k]), list(jp.eqns)
    t_iter = iter(jp.outputs[k:])
    for v, fl in zip(s.results, out_flags):          # an integer result's tangent: float zeros
        if fl:
            outs.append(next(t_iter))
        else:
            z = Var(ct_aval(v.aval))
            eqns.append(Eqn(ir.zeros_p, [], [z], {"aval": z.aval}))
            outs.append(z)
    jp = jp.replace(eqns=eqns, outputs=outs)
    t_planes = [Extern(np.asarray(tangents[a]), f"t_{names[a]}") for a, fl in zip(s.arg_of, flags) if fl]
    return s.graph(jp, t_planes, _pair_tree(s.tree, s.tree), 2 * k)


def _arg_names(f, n):
    sig = getattr(f, "signature", None)
    names = list(sig.parameters)[:n] if sig is not None else []
    return names + [str(k) for k in range(len(names), n)]


# ---------------------------------------------------------------------------------------------
# reverse mode

def _vjp_program(s: _Staged, wrt_args, api):
    """The vjp Program of the staged graph: (inputs, a cotangent per float result) -> (results, a
    cotangent per argument in wrt_args, zeros for one the graph does not read)."""
    wrt = [k is not None and k in wrt_args for k in s.arg_of]
    vp = vjp_graph(s.prog, wrt, s.capacity, api)
    k = len(s.results)
    grads = dict(zip([a for a, w in zip(s.arg_of, wrt) if w], vp.outputs[k:]))
    eqns, outs = list(vp.eqns), list(vp.outputs[:k])
    for a in wrt_args:
        if a not in grads:
            z = Var(ct_aval(_arg_aval(s, a)))
            eqns.append(Eqn(ir.zeros_p, [], [z], {"aval": z.aval}))
            grads[a] = z
        outs.append(grads[a])
    return vp.replace(eqns=eqns, outputs=outs)


def _arg_aval(s, k):
    a = s.args[k]
    return ir.plane_aval(a.shape, a.dtype)


def _seed_planes(s, values=None):
    """Extern planes for the cotangent inputs (one per float result), holding `values` or zeros."""
    out = []
    for j, v in enumerate(r for r in s.results if is_float(r.aval)):
        a = ct_aval(v.aval)
        out.append(Extern(values[j] if values is not None else np.zeros(a.shape, a.dtype), "ct"))
    return out


def vjp(f, *args):
    """(result, pullback): pullback(cotangent tree) -> a cotangent per positional argument (None for
    arguments that are not floating arrays, such as cells)."""
    api = "eagle_fx.vjp"
    if _STAGING:
        raise TransformError(f"{api}: inside a transformed function, use eagle_fx.grad or eagle_fx.jacrev (they "
                             "return their graph to the outer transform); vjp returns a Python pullback")
    floats = [k for k, a in enumerate(args) if _float_array(a)]

    def make(*args):
        s = _Staged(f, args, api)
        prog = _vjp_program(s, floats, api)
        seeds = _seed_planes(s)
        # one functional graph gives the result (at zero seeds) and the pullback
        g = s.graph(prog, seeds, _pair_tree(s.tree, _leaf_tree(len(floats))), len(s.results) + len(floats))
        g._vjp = (s, seeds)
        return g
    e, _ = cache.staged(_sig("vjp", f), args, make)
    g = e.graph
    s, seeds = g._vjp
    y = _run(g)[0]
    # the cached graph may run other calls before this pullback: it keeps the arguments it saw
    saved = [None if o is None else np.array(o) for o in e.owned] if e.owned is not None else None
    float_results = [j for j, v in enumerate(s.results) if is_float(v.aval)]

    def pullback(ct):
        leaves = match_tree(ct, s.tree)
        if leaves is None:
            raise ValueError(f"{api}: the cotangent has structure {tree_flatten(ct)[1]}; {s.fname}'s result is "
                             f"{s.tree}")
        for p, j in zip(seeds, float_results):
            c = np.asarray(leaves[j])
            if c.shape != p.array.shape:
                raise ValueError(f"{api}: the cotangent of result {j} has shape {c.shape}; the result has "
                                 f"{p.array.shape}")
            np.copyto(p.array, c)
        if saved is not None:
            e.bind(saved)
        cts = dict(zip(floats, _run(g)[1]))
        return tuple(cts.get(k) for k in range(len(args)))
    return y, pullback


def grad(f, argnums=0):
    """The gradient of `f`, whose result is one value (a one-cell array or a 0-d value), with
    respect to argument(s) `argnums`."""
    api = "eagle_fx.grad"
    pick = (argnums,) if isinstance(argnums, int) else tuple(argnums)

    def make(*args):
        s = _Staged(f, args, api)
        if len(s.results) != 1 or int(np.prod(s.results[0].aval.shape)) != 1 or not is_float(s.results[0].aval):
            shapes = [v.aval.shape for v in s.results]
            raise TypeError(f"{api}: {s.fname} returns {shapes}; grad needs one value (a one-cell result, e.g. from "
                            "hawk.sum); for other results use eagle_fx.vjp or eagle_fx.jacrev")
        for k in pick:
            if not -len(args) <= k < len(args):
                raise ValueError(f"{api}: argnums {k} for {len(args)} arguments")
            if not _float_array(args[k]):
                raise TypeError(f"{api}: argument {k} is not a floating array; it has no gradient")
        ks = [k % len(args) for k in pick]
        prog = _vjp_program(s, ks, api)
        prog = dce(prog.replace(outputs=prog.outputs[1:]))
        v = s.results[0]
        seed = [Extern(np.ones(v.aval.shape, v.aval.dtype), "ct")]
        return s.graph(prog, seed, _leaf_tree(None if isinstance(argnums, int) else len(ks)), len(ks))
    return Transformed(f"grad({_name(f)})", make, sig=_sig("grad", f, _freeze(argnums)))


def jacfwd(f, argnums=0):
    """The Jacobian of `f`'s one result with respect to argument `argnums`, by forward mode: a vmap
    of jvp over the basis of that argument. Shape: result.shape + argument.shape."""
    return _jacobian(f, argnums, "eagle_fx.jacfwd", forward=True)


def jacrev(f, argnums=0):
    """The Jacobian by reverse mode: a vmap of the vjp over the basis of the result."""
    return _jacobian(f, argnums, "eagle_fx.jacrev", forward=False)


def _jacobian(f, argnums, api, forward):
    if not isinstance(argnums, int):
        raise TypeError(f"{api}: argnums is one argument position (an int)")
    def make(*args):
        x = args[argnums]
        if not _float_array(x):
            raise TypeError(f"{api}: argument {argnums} is not a floating array; it has no derivative")
        s = _Staged(f, args, api)
        if len(s.results) != 1:
            raise TypeError(f"{api}: {s.fname} returns {len(s.results)} results; a Jacobian takes one")
        out = s.results[0].aval
        if forward:
            basis = np.eye(x.size, dtype=x.dtype).reshape((x.size,) + x.shape)

            def one(t):
                return jvp(f, args, tuple(t if k == argnums else None for k in range(len(args))))
            g = vmap(one, in_axes=0).graph(basis)
        else:
            basis = np.eye(int(np.prod(out.shape)), dtype=ct_aval(out).dtype).reshape((-1,) + out.shape)

            def one(ct):
                s2 = _Staged(f, args, api)
                prog = _vjp_program(s2, [argnums % len(args)], api)
                return s2.graph(dce(prog.replace(outputs=prog.outputs[1:])), _seed_planes(s2, [ct]),
                                _leaf_tree(None), 1)
            g = vmap(Transformed(f"vjp({_name(f)})", one), in_axes=0).graph(basis)
        g._post = lambda value: _jacobian_shape(value, forward, out.shape, x.shape)
        return g
    return Transformed(f"{api.split('.')[-1]}({_name(f)})", make, sig=_sig(api, f, argnums))


def _jacobian_shape(value, forward, out_shape, in_shape):
    j = value[1] if forward else value                   # (inputs..., *out) or (outputs..., *in)
    j = np.moveaxis(j, 0, -1) if forward else j
    return j.reshape(out_shape + in_shape)


def _freeze(x):
    """A hashable copy of an option (lists of axes become tuples)."""
    if isinstance(x, (list, tuple)):
        return tuple(_freeze(v) for v in x)
    if isinstance(x, dict):
        return tuple((k, _freeze(v)) for k, v in x.items())
    return x


# ---------------------------------------------------------------------------------------------
# batching

def _axes(in_axes, n, api):
    if isinstance(in_axes, (int, type(None))):
        return [in_axes] * n
    axes = list(in_axes)
    if len(axes) != n:
        raise ValueError(f"{api}: in_axes has {len(axes)} entries for {n} positional arguments; give one per "
                         "argument (an int axis or None)")
    return axes


def _returns_graph(f):
    from .graph import Builder
    return isinstance(f, Builder) or (isinstance(f, Transformed) and not f._values)


def vmap(f, in_axes=0, out_axes=0):
    """Batch `f` over an axis of its array arguments: B independent instances in one graph.

    in_axes: per positional argument, the batch axis (usually 0) or None (shared by all instances).
    Per-sample planes (B, n), Vector planes (B, k, n), cells (B, 1), Params (B,) or (B, 1).
    A device condition that differs by instance runs every arm (each instance keeps its own) and a
    loop with per-instance guards runs until every instance is done, finished ones frozen.
    vmap of a builder is a builder (it returns the Graph); of any other function, it returns values."""
    api = "eagle_fx.vmap"
    name = _name(f)
    for ax in (out_axes if isinstance(out_axes, (tuple, list)) else [out_axes]):
        if ax not in (0, None):
            raise ValueError(f"{api}({name}): out_axes {ax!r}: results take the batch axis first (0) or are shared "
                             "(None); move it afterwards with np.moveaxis")

    def make(*args):
        axes = _axes(in_axes, len(args), api)
        if isinstance(f, Transformed) and f._vmap_of is not None:
            return _nested(f, args, axes, out_axes, api, name)
        return _batch(f, args, axes, out_axes, api, name)
    return Transformed(f"vmap({name})", make, values=not _returns_graph(f), vmap_of=(f, in_axes, out_axes),
                       sig=_sig("vmap", f, _freeze(in_axes), _freeze(out_axes)))


def _batch(f, args, axes, out_axes, api, name):
    B, first = None, None
    inst, full = [], {}
    for k, (a, ax) in enumerate(zip(args, axes)):
        if ax is None:
            inst.append(a)
            continue
        if not isinstance(a, np.ndarray):
            raise TypeError(f"{api}({name}): argument {k} has in_axes {ax} but is {type(a).__name__}; only "
                            "arrays are batched: give it in_axes None")
        if not -a.ndim <= ax < a.ndim:
            raise ValueError(f"{api}({name}): in_axes {ax} for argument {k} of shape {a.shape}")
        if a.shape == (1,) and a.dtype == np.uint32:
            raise ValueError(f"{api}({name}): argument {k} is a one-cell array of shape {a.shape}; its only "
                             "axis is the cell, not a batch: give it in_axes None, or stack B cells as (B, 1)")
        a = np.moveaxis(a, ax, 0)
        if B is None:
            B, first = a.shape[0], k
        elif a.shape[0] != B:
            raise ValueError(f"{api}({name}): mismatched batch sizes: argument {first} has {B} instances "
                             f"along its batch axis, argument {k} has {a.shape[0]}")
        if a.ndim == 1:                    # a batched Param or cell given as (B,)
            a = a[:, None]
        one = a[0]
        inst.append(one)
        full[id(one)] = a
    if B is None:
        raise ValueError(f"{api}({name}): no argument is batched; give at least one array an in_axes of 0")
    _BATCH_FULL.update(full)
    try:
        g = stage(f, inst, api)
    finally:
        for key in full:
            _BATCH_FULL.pop(key, None)
    prog = g.program
    if any(e.params.get("batch") for e in prog.eqns):
        raise VmapError(f"{api}({name}): the function returns a graph another vmap made; batch nested vmaps as "
                        "eagle_fx.vmap(eagle_fx.vmap(f, ...), ...), or reshape both axes into one, (B1 * B2, ...)")
    flags, planes = [], []
    for e in g._trace.input_planes:
        big = full.get(id(e.array))
        flags.append(big is not None)
        planes.append(Extern(big if big is not None else e.array, e.name))
    bprog, out_flags = batch_program(prog, flags, B)
    leaves, tree = g._result_vars() if g._has_result else ([], None)
    outs = list(bprog.outputs)
    nres = len(leaves)
    oax = _axes(out_axes, nres, api) if nres else []
    eqns = list(bprog.eqns)
    for j in range(nres):
        if oax[j] is None and out_flags[j]:
            raise ValueError(f"{api}({name}): result {j} differs by instance but out_axes is None for it; "
                             "give it out_axes 0")
        if oax[j] is not None and not out_flags[j]:
            v = Var(_batched(outs[j].aval, B))
            eqns.append(Eqn(batch_broadcast_p, [outs[j]], [v], {"size": B}))
            outs[j] = v
    bprog = bprog.replace(eqns=eqns, outputs=outs)
    from .graph import Graph
    return Graph._from_program(bprog, planes, tree, nres, g._trace.n, *g._backend_of())


def _nested(f, args, outer_axes, out_axes, api, name):
    """vmap(vmap(inner, in_axes=ia), in_axes=oa): one vmap over B2 * B1 instances, results seen as
    (B2, B1, ...). An argument batched by one level only is repeated along the other."""
    inner, ia, inner_out = f._vmap_of
    cache.uncacheable()                  # the arguments are repeated into new arrays: stage each call
    if out_axes != 0 or inner_out != 0:
        raise ValueError(f"{api}({name}): nested vmap takes out_axes 0 at both levels")
    B2 = B1 = None
    moved = []
    for k, (a, ax) in enumerate(zip(args, outer_axes)):
        if ax is not None:
            if not isinstance(a, np.ndarray) or not -a.ndim <= ax < a.ndim:
                raise ValueError(f"{api}({name}): in_axes {ax} for argument {k} of shape {np.shape(a)}")
            a = np.moveaxis(a, ax, 0)
            if B2 is not None and a.shape[0] != B2:
                raise ValueError(f"{api}({name}): mismatched batch sizes: {B2} and {a.shape[0]} instances (argument {k})")
            B2 = a.shape[0]
        moved.append(a)
    inner_axes = _axes(ia, len(args), api)
    combined, flat = [], []
    for k, (a, o, i) in enumerate(zip(moved, outer_axes, inner_axes)):
        if i is not None:
            one = a[0] if o is not None else a
            if not -one.ndim <= i < one.ndim:
                raise ValueError(f"{api}({name}): inner in_axes {i} for argument {k} of shape {one.shape}")
            a = np.moveaxis(a, i + (1 if o is not None else 0) if i >= 0 else i, 1 if o is not None else 0)
            b1 = a.shape[1] if o is not None else a.shape[0]
            if B1 is not None and b1 != B1:
                raise ValueError(f"{api}({name}): mismatched inner batch sizes: {B1} and {b1} (argument {k})")
            B1 = b1
        combined.append((a, o, i))
    if B2 is None or B1 is None:
        raise ValueError(f"{api}({name}): each level of a nested vmap batches at least one argument")
    for a, o, i in combined:
        if o is not None and i is not None:
            flat.append(a.reshape((B2 * B1,) + a.shape[2:]))
        elif o is not None:
            flat.append(np.repeat(a, B1, axis=0))
        elif i is not None:
            flat.append(np.concatenate([a] * B2, axis=0))
        else:
            flat.append(a)
    axes = [0 if (o is not None or i is not None) else None for _, o, i in combined]
    g = _batch(inner, flat, axes, 0, api, name)
    for h in g._result_flat[0]:
        g._views[id(h)] = (B2, B1) + h.aval.shape[1:]
    return g


def _batched(aval, B):
    return ir.plane_aval((B,) + aval.shape, aval.dtype)
