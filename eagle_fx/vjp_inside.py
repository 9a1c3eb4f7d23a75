"""vjp inside a transformed function: vmap(lambda x, c: eagle_fx.vjp(f, x)[1](c)).

Outside a transform, vjp runs f and hands back a Python pullback that runs the vjp graph on the
cotangents it is given. Inside one, the function is being staged: vjp returns f's result as
staged values (lazy Graphs, as jvp and grad return inside a transform) and a pullback that,
called on cotangent arrays (ones the transform batches or tracks, or constants), stages f's vjp
Program with them as its seed and returns the cotangent tree as staged values, for the outer
transform to take back. Each call stages its own vjp Program, so a pullback may be called more
than once. Refused: a cotangent that is another transform's staged result (the seed is a plane),
and a pullback called after the function that made it was staged (its graph is gone).
"""
from __future__ import annotations

import numpy as np

from hawk_fx.context import CONTEXT
from hawk_fx.diff import match_tree
from hawk_fx.tree import tree_flatten, tree_unflatten

from .api import Staged, float_array, graph_of
from .frontend.guards import release, where
from .result_views import restored_views
from .staged_results import is_part, staged_result
from .transforms.program import TransformError, ct_aval, is_float
from . import seams


def vjp_inside(f, args, api, has_aux, checkpoints):
    """(result, pullback) or (result, pullback, aux), each result a tree of staged values."""
    from .derivatives import _demote, _grad_trees, _split_aux, promote, seed_planes, vjp_program
    args, promoted = promote(release(tuple(args)), range(len(args)))
    s = Staged(f, args, api)
    n_out, aux_tree = _split_aux(s, has_aux, api)
    out_tree = s.tree.children[0] if has_aux else s.tree
    y = tree_unflatten(out_tree, s.results[:n_out])
    aux = tree_unflatten(aux_tree, s.results[n_out:]) if has_aux else None
    made = staged_result(graph_of(s, s.prog, (y, aux), []))
    y, aux = made[0], made[1]
    frame = CONTEXT.guards[-1] if CONTEXT.guards else None
    float_out = [j for j, v in enumerate(s.results[:n_out]) if is_float(v.aval)]
    avals = [ct_aval(s.results[j].aval) for j in float_out]
    here = seams.composition(api, s.fname)
    at = where(getattr(f, "fn", None) or f)

    def pullback(ct):
        if not CONTEXT.transforming or (CONTEXT.guards[-1] if CONTEXT.guards else None) is not frame:
            raise TransformError(f"{here}: the pullback eagle_fx.vjp returned inside a transformed function (of "
                                 f"{at}) is called outside it; its graph belongs to that function's staging. Call "
                                 "the pullback inside the function that called eagle_fx.vjp, or call eagle_fx.vjp "
                                 "again where the pullback is needed")
        leaves = match_tree(ct, out_tree)
        if leaves is None:
            raise ValueError(f"{here}: the cotangent has structure {tree_flatten(ct, is_leaf=is_part)[1]}; "
                             f"{s.fname}'s result is {out_tree}: give one cotangent per result array, in the same tree")
        cs = [release(leaves[j]) for j in float_out]
        for c, v, j in zip(cs, avals, float_out):
            if is_part(c):
                raise TransformError(f"{here}: the cotangent of result {j} given to the pullback of {at} is "
                                     "another transform's staged result; the pullback seeds its graph with arrays. "
                                     "Pass an argument of the transformed function (vmap batches it) or a NumPy array")
            if not isinstance(c, np.ndarray) or c.shape != tuple(v.shape) or c.dtype != v.dtype:
                got = f"{type(c).__name__} {np.shape(c)}" + (f" {c.dtype}" if isinstance(c, np.ndarray) else "")
                raise ValueError(f"{here}: the cotangent of result {j} is {got}; the result is {tuple(v.shape)} "
                                 f"{v.dtype}: give an array of that shape and dtype")
        s2 = Staged(f, args, api)
        wrt = [(k, j) for k, ls in enumerate(s2.leaves) for j, x in enumerate(ls) if float_array(x)]
        prog = vjp_program(s2, wrt, api, checkpoints)
        c = graph_of(s2, prog, _grad_trees(s2, prog, range(len(args)), wrt), seed_planes(s2, cs))
        if promoted:                 # a Python float's cotangent is seen 0-d, as outside
            c = restored_views(c, lambda out: tuple(_demote(g, k, promoted) for k, g in enumerate(out)))
        return staged_result(c)
    return (y, pullback, aux) if has_aux else (y, pullback)
