"""JAX-shaped entry points over builders: make_program and vmap.

    prog = eagle_fx.make_program(f)(x, flag)     # the staged Program of builder f (like jax.make_jaxpr)
    fb = eagle_fx.vmap(f, in_axes=(0, None))     # a builder over a leading batch axis of B instances
    g = fb(xs, flag); g()                        # results gain the leading axis
"""
from __future__ import annotations

import numpy as np

from hawk_fx.core import Var
from hawk_fx.tree import tree_flatten, tree_unflatten

from .staging import Extern
from .transforms.vmap import VmapError, batch_broadcast_p, batch_program


def make_program(f):
    """A function returning the Program that builder `f` stages for these arguments."""
    def program(*args, **kwargs):
        return _build(f, args, kwargs, "eagle_fx.make_program").program
    return program


def _build(f, args, kwargs, api):
    from .graph import Graph
    g = f(*args, **kwargs)
    if not isinstance(g, Graph):
        raise TypeError(f"{api}: {getattr(f, '__name__', f)!r} returned {type(g).__name__}; it takes a graph "
                        "builder (@eagle_fx.Graph.builder on a function that returns its graph)")
    return g


def _axes(in_axes, n, api):
    if isinstance(in_axes, (int, type(None))):
        return [in_axes] * n
    axes = list(in_axes)
    if len(axes) != n:
        raise ValueError(f"{api}: in_axes has {len(axes)} entries for {n} positional arguments; give one per "
                         "argument (an int axis or None)")
    return axes


def vmap(f, in_axes=0, out_axes=0):
    """Batch builder `f` over an axis of its array arguments: B independent instances in one graph.

    in_axes: per positional argument, the batch axis (usually 0) or None (shared by all instances).
    Per-sample planes (B, n), Vector planes (B, k, n), cells (B, 1), Params (B,) or (B, 1).
    A device condition that differs by instance runs every arm (each instance keeps its own) and a
    loop with per-instance guards runs until every instance is done, finished ones frozen."""
    api = "eagle_fx.vmap"
    name = getattr(f, "__name__", "f")

    for ax in (out_axes if isinstance(out_axes, (tuple, list)) else [out_axes]):
        if ax not in (0, None):
            raise ValueError(f"{api}({name}): out_axes {ax!r}: results take the batch axis first (0) or are shared "
                             "(None); move it afterwards with np.moveaxis")

    def batched(*args, **kwargs):
        if kwargs:
            raise TypeError(f"{api}({name}): pass the arguments positionally; in_axes names them by position "
                            f"(got {', '.join(kwargs)} by keyword)")
        axes = _axes(in_axes, len(args), api)
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
        g = _build(f, inst, {}, api)
        if getattr(g, "_transformed", False):
            raise VmapError(f"{api}({name}): the builder returns a graph another transform made (a vmap inside a "
                            "vmap); nested batching is not supported yet: batch both axes at once by reshaping "
                            "them into one, (B1 * B2, ...)")
        if g._record:
            raise VmapError(f"{api}({name}): a record=True graph cannot be batched; vmap the plain builder")
        prog = g.program
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
                from hawk_fx.core import Eqn
                eqns.append(Eqn(batch_broadcast_p, [outs[j]], [v], {"size": B}))
                outs[j] = v
        bprog = bprog.replace(eqns=eqns, outputs=outs)
        from .graph import Graph
        return Graph._from_program(bprog, planes, tree, nres, g._trace.n)
    batched.__name__ = f"vmap({name})"
    return batched


def _batched(aval, B):
    from . import ir
    return ir.plane_aval((B,) + aval.shape, aval.dtype)


# ---------------------------------------------------------------------------------------------
# derivatives with JAX's shapes, over a recorded run of the builder

def _recorded(f, args, api):
    from .graph import _force_record
    _force_record.append(True)
    try:
        g = _build(f, args, {}, api)
    finally:
        _force_record.pop()
    g.launch()
    return g


def _arg_names(f, args, api):
    sig = getattr(f, "signature", None)
    if sig is None:
        raise TypeError(f"{api}: takes a builder (@eagle_fx.Graph.builder), got {type(f).__name__}")
    names = list(sig.parameters)[:len(args)]
    return [n if isinstance(a, np.ndarray) and a.dtype.kind == "f" else None for n, a in zip(names, args)]


def _copy_tree(tree):
    leaves, t = tree_flatten(tree, is_leaf=lambda x: isinstance(x, np.ndarray))
    return tree_unflatten(t, [np.array(x) for x in leaves])


def vjp(f, *args):
    """(result, pullback): pullback(cotangent tree) -> a cotangent per positional argument
    (None for arguments that are not floating arrays, such as cells)."""
    from .diff import reverse
    api = "eagle_fx.vjp"
    names = _arg_names(f, args, api)
    g = _recorded(f, args, api)
    y = _copy_tree(g.result)
    record = g.record

    def pullback(ct):
        wrt = tuple(n for n in names if n)
        r = reverse(record, {"result": ct}, wrt=wrt) if wrt else {}
        return tuple(r[n] if n else None for n in names)
    return y, pullback


def jvp(f, primals, tangents):
    """(result, result tangent) for tangents given per argument (None: no tangent; cells have none)."""
    from .diff import forward
    api = "eagle_fx.jvp"
    primals, tangents = tuple(primals), tuple(tangents)
    if len(primals) != len(tangents):
        raise ValueError(f"{api}: {len(primals)} primals and {len(tangents)} tangents; give one tangent (or None) "
                         "per argument")
    names = _arg_names(f, primals, api)
    for n, p, t in zip(names, primals, tangents):
        if t is not None and (n is None or np.shape(t) != np.shape(p) or np.asarray(t).dtype != p.dtype):
            raise ValueError(f"{api}: the tangent for argument {n or '(not a floating array)'} has shape "
                             f"{np.shape(t)} and dtype {np.asarray(t).dtype}; it needs {np.shape(p)} {p.dtype}, "
                             "or None")
    g = _recorded(f, primals, api)
    y = _copy_tree(g.result)
    ts = {n: np.asarray(t) for n, t in zip(names, tangents) if n and t is not None}
    return y, forward(g.record, ts, of="result")["result"]


def grad(f, argnums=0):
    """The gradient of a builder whose result is one value (a one-cell array or a 0-d value)."""
    api = "eagle_fx.grad"

    def gradient(*args):
        y, pullback = vjp(f, *args)
        leaves, _ = tree_flatten(y, is_leaf=lambda x: isinstance(x, np.ndarray))
        if len(leaves) != 1 or np.size(leaves[0]) != 1:
            shapes = [np.shape(x) for x in leaves]
            raise TypeError(f"{api}: {getattr(f, '__name__', f)} returns {shapes}; grad needs one value (a one-cell "
                            "result, e.g. from hawk.sum); for other results use eagle_fx.vjp")
        cts = pullback(np.ones_like(leaves[0]))
        pick = (argnums,) if isinstance(argnums, int) else tuple(argnums)
        for k in pick:
            if cts[k] is None:
                raise TypeError(f"{api}: argument {k} is not a floating array; it has no gradient")
        return cts[argnums] if isinstance(argnums, int) else tuple(cts[k] for k in pick)
    return gradient
