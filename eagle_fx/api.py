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

    def batched(*args):
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
        return Graph._from_program(bprog, planes, tree, nres, g._trace.n, out_axes=oax)
    batched.__name__ = f"vmap({name})"
    return batched


def _batched(aval, B):
    from . import ir
    return ir.plane_aval((B,) + aval.shape, aval.dtype)
