"""What a transform returns inside another transform, and how the outer one takes it back.

Outside a transform, jvp returns a tuple of arrays and grad(f, has_aux=True) a (gradient, aux)
pair; inside one (vmap(lambda x, t: eagle_fx.jvp(f, (x,), (t,))[1])) they return the same tree,
with a lazy Graph (lowered only if run) at each leaf, so the result indexes, unpacks and
tree-maps like the arrays it stands for. A function handed to a transform may return any tree of
such parts: `merge` makes the one closed Program they come from, with that tree as its result.
"""
from __future__ import annotations

import numpy as np

from hawk_fx.core import Var
from hawk_fx.tree import LEAF, tree_flatten, tree_unflatten

from .graph import Graph
from .ir.closed import Closed, closed_of
from .transforms.program import Eqns, TransformError, dce, inline


def staged_result(c: Closed):
    """`c`'s result as a tree of lazy Graphs, one per leaf (a single Graph for a one-leaf result)."""
    if c.tree is None or c.tree.kind == "leaf":
        return Graph.from_closed(c, lazy=True)
    leaves, tree = c.result_vars()
    parts = []
    for j, v in enumerate(leaves):
        part = c.derive(dce(c.program.replace(outputs=[v])), c.planes, LEAF, 1,
                        [c.views[j]] if c.views else None)
        part.made, part.part_of = c.made, (c, j)
        parts.append(Graph.from_closed(part, lazy=True))
    return tree_unflatten(tree, parts)


def is_part(x):
    return isinstance(x, (Graph, Closed))


def merge(value, api, fname):
    """The closed Program whose result is `value`, a tree of staged parts (Graphs a transform or a
    builder returned); None when `value` holds anything else at a leaf."""
    leaves, tree = tree_flatten(value, is_leaf=is_part)
    if not leaves or not all(is_part(x) for x in leaves):
        return None
    cs = [closed_of(x) for x in leaves]
    if len(cs) == 1 and tree.kind == "leaf":
        return cs[0]
    parents = {id(getattr(c, "part_of", None) and c.part_of[0]) for c in cs}
    if len(parents) == 1 and cs[0].part_of is not None:
        base = cs[0].part_of[0]
        outs = [base.program.outputs[c.part_of[1]] for c in cs]
        views = [base.views[c.part_of[1]] if base.views else None for c in cs]
    else:
        base, outs, views = _joined(cs, api, fname)
    sub = [tree_unflatten(c.tree, o) for c, o in zip(cs, _split(outs, cs))]
    flat, full = tree_flatten(tree_unflatten(tree, sub), is_leaf=lambda u: isinstance(u, Var))
    out = base.derive(dce(base.program.replace(outputs=flat)), base.planes, full, len(flat),
                      views if any(v is not None for v in views) else None)
    out.made = [e for c in cs for e in c.made]
    return out


def _split(outs, cs):
    at = 0
    for c in cs:
        yield outs[at:at + c.n_results]
        at += c.n_results


def _joined(cs, api, fname):
    """One closed Program running the Programs of `cs` side by side: their planes one after the
    other, their results in order (a copy of each Program after the first; one input per array)."""
    n = {c.n for c in cs}
    if len(n) > 1:
        raise TransformError(f"{api}: {fname} returns graphs of {sorted(n)} samples; a result tree takes graphs of "
                             "one sample count")
    first = cs[0]
    inputs, eqns, planes = list(first.program.inputs), Eqns(first.program.eqns), list(first.planes)
    outs = list(first.program.outputs[:first.n_results])
    for c in cs[1:]:        # a copy reading the inputs of arrays already in (shared_input)
        own = [shared_input(inputs, planes, u, e) for u, e in zip(c.program.inputs, c.planes)]
        outs += inline(c.program, own, eqns)[:c.n_results]
    views = [v for c in cs for v in (list(c.views) if c.views else [None] * c.n_results)]
    prog = first.program.replace(inputs=inputs, eqns=eqns, outputs=outs)
    base = first.derive(prog, planes, first.tree, len(outs))
    return base, outs, views


def shared_input(inputs, planes, u, e):
    """The input Var reading plane `e` (for `u`, an input of a Program joined in): the one already
    there for its array, else a new one appended with `e`. One input per array, so an outer
    transform maps each argument to one input and keeps its whole cotangent."""
    at = next((i for i, q in enumerate(planes) if q.array is e.array), None)
    if at is None:
        inputs.append(Var(u.aval, u.hint))
        planes.append(e)
        at = len(planes) - 1
    return inputs[at]


def lead_view(view, k):
    """`view` (None, a shape, or a function of a result's array) for that array with k batch axes
    in front (vmap of a Jacobian): each instance seen as `view` sees one."""
    if view is None or getattr(view, "lead_aware", False):
        return view
    if not callable(view):
        shape = tuple(view)

        return lambda a: a.reshape(a.shape[:k] + shape)

    def each(a):
        lead = a.shape[:k]
        parts = [view(x) for x in a.reshape((-1,) + a.shape[k:])]
        return np.stack(parts).reshape(lead + parts[0].shape) if parts else a
    return each


def then(view, inner, raw_nd, k):
    """`view` (lead-aware, giving arrays (..., *raw, *tail) with k tail axes), then `inner`, the
    view of the (*raw) part (the result's own view, when a Jacobian is taken of a Jacobian)."""
    if inner is None:
        return view

    def fn(a):
        t = view(a) if view is not None else a
        nd = t.ndim
        L = nd - raw_nd - k
        t = np.moveaxis(t, list(range(nd - k, nd)), list(range(L, L + k)))       # (*lead, *tail, *raw)
        t = lead_view(inner, L + k)(t)
        return np.moveaxis(t, list(range(L, L + k)), list(range(t.ndim - k, t.ndim)))
    fn.lead_aware = True
    return fn
