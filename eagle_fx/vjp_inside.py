"""vjp inside a transformed function: vmap(lambda x, c: eagle_fx.vjp(f, x)[1](c)).

Outside a transform, vjp runs f and hands back a Python pullback that runs the vjp graph on the
cotangents it is given. Inside one, the function is being staged: vjp returns f's result as
staged values (lazy Graphs, as jvp and grad return inside a transform) and a pullback that,
called on cotangents (arrays the transform batches or tracks, constants, or staged values such as
the vjp's own result), stages f's vjp Program with them as its seed and returns the cotangent
tree as staged values, for the outer transform to take back. Each call stages its own vjp
Program, so a pullback may be called more than once. Refused: a pullback called after the
function that made it was staged (its graph belongs to that staging).
"""
from __future__ import annotations

import numpy as np

from hawk_fx.context import CONTEXT
from hawk_fx.core import Program, Var
from hawk_fx.diff import match_tree
from hawk_fx.tree import tree_flatten, tree_unflatten

from .api import Staged, float_array, graph_of
from .frontend.guards import release, where
from .frontend.staging import Extern
from .result_views import restored_views
from .staged_results import is_part, shared_input, staged_result
from .ir.closed import closed_of
from .transforms.program import Eqns, TransformError, ct_aval, inline, is_float
from . import seams


def vjp_inside(f, args, api, has_aux, checkpoints):
    """(result, pullback) or (result, pullback, aux), each result a tree of staged values."""
    from .derivatives import _demote, _grad_trees, _split_aux, promote, vjp_program
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
                got = closed_of(c)
                r = got.result_vars()[0][0].aval
                seen = got.views is not None and any(w is not None for w in got.views)
                if seen or got.n != s.g.n or tuple(r.shape) != tuple(v.shape) or r.dtype != v.dtype:
                    raise TransformError(f"{here}: the cotangent of result {j} given to the pullback of {at} is "
                                         f"another transform's staged result of {tuple(r.shape)} {r.dtype}"
                                         + (" seen through a view" if seen else "") + f"; the result is "
                                         f"{tuple(v.shape)} {v.dtype} over {s.g.n} samples: give a staged value or "
                                         "array of that shape")
            elif not isinstance(c, np.ndarray) or c.shape != tuple(v.shape) or c.dtype != v.dtype:
                got = f"{type(c).__name__} {np.shape(c)}" + (f" {c.dtype}" if isinstance(c, np.ndarray) else "")
                raise ValueError(f"{here}: the cotangent of result {j} is {got}; the result is {tuple(v.shape)} "
                                 f"{v.dtype}: give an array of that shape and dtype")
        s2 = Staged(f, args, api)
        wrt = [(k, j) for k, ls in enumerate(s2.leaves) for j, x in enumerate(ls) if float_array(x)]
        prog = vjp_program(s2, wrt, api, checkpoints)
        # a cotangent array is the user's, as a jvp tangent is: the staging check sees where it comes
        # from (an argument, a closure, or computed in Python from the arguments: c * 2); aux: zeros
        given = cs + [None] * (sum(is_float(r.aval) for r in s2.results) - len(cs))
        seeds = [Extern(c, "ct") if c is not None and not is_part(c) else
                 Extern(np.zeros(v.shape, v.dtype), "ct", "added")
                 for c, v in zip(given, [ct_aval(r.aval) for r in s2.results if is_float(r.aval)])]
        c = graph_of(s2, prog, _grad_trees(s2, prog, range(len(args)), wrt), seeds)
        c = _seeded_by_parts(c, [(p, closed_of(x)) for p, x in zip(seeds, cs) if is_part(x)])
        if promoted:                 # a Python float's cotangent is seen 0-d, as outside
            c = restored_views(c, lambda out: tuple(_demote(g, k, promoted) for k, g in enumerate(out)))
        return staged_result(c)
    return (y, pullback, aux) if has_aux else (y, pullback)


def _seeded_by_parts(c, pairs):
    """`c` with each (seed plane, staged value) pair's plane replaced by the Program computing the
    value: one Program, the value's planes after `c`'s (one input per array), so the outer
    transform sees the cotangent as the function of the arguments it is (pullback(y), y from the
    same vjp)."""
    if not pairs:
        return c
    at = {next(i for i, e in enumerate(c.planes) if e is p): part for p, part in pairs}
    eqns = Eqns()
    inputs = [Var(v.aval, v.hint) for i, v in enumerate(c.program.inputs) if i not in at]
    planes = [e for i, e in enumerate(c.planes) if i not in at]
    made = list(c.made)
    env = {}
    fresh = iter(inputs)
    for i, v in enumerate(c.program.inputs):
        if i in at:
            part = at[i]
            own = [shared_input(inputs, planes, u, e) for u, e in zip(part.program.inputs, part.planes)]
            env[i] = inline(part.program, own, eqns)[0]
            made += [e for e in part.made if not any(e is m for m in made)]
        else:
            env[i] = next(fresh)
    outs = inline(c.program, [env[i] for i in range(len(c.program.inputs))], eqns)
    out = c.derive(Program(inputs, eqns, outs), planes, c.tree, c.n_results, c.views)
    out.made = made
    return out
