"""What a derivative transform staged inside another transform shows: the shapes its caller gets.

grad, value_and_grad and the Jacobians stage a Python float (or a 0-d array) they differentiate as
a one-cell array, and called directly, give its derivative back 0-d (the size-1 axis dropped).
Staged for an outer transform (vmap(grad(f)) at w = 0.5) the same drop is a view of each result:
each instance is seen as the direct call shows it, so vmap returns (B,), as JAX does, not (B, 1).
"""
from __future__ import annotations

import numpy as np

from hawk_fx.tree import tree_flatten, tree_unflatten

from .ir.closed import Closed


def _is_leaf(u):
    return u is None or isinstance(u, np.ndarray)


def _stand_in(aval, view):
    """A zero-memory array of `aval`'s shape, seen through `view` (None, a shape, or a function)."""
    a = np.broadcast_to(np.zeros((), aval.dtype), aval.shape)
    if view is None:
        return a
    return view(a) if callable(view) else a.reshape(view)


def _dropped(view, seen, shape, dtype=None):
    """`view`, then the instance reshaped from `seen` to `shape` (restore only drops size-1 axes)
    and, given a dtype, cast to it (a derivative with respect to a Python float: float64)."""
    if dtype is None and (view is None or not callable(view)):
        return tuple(shape)

    def fn(a):
        t = a if view is None else view(a) if callable(view) else a.reshape(view)
        t = t.reshape(t.shape[:t.ndim - len(seen)] + tuple(shape))
        return t if dtype is None else t.astype(dtype)
    fn.lead_aware = getattr(view, "lead_aware", False) or not callable(view)
    return fn


def restored_views(c: Closed, restore) -> Closed:
    """`c` with each result leaf seen as `restore` (a Transformed's prepare) gives it to a caller."""
    leaves, tree = c.result_vars()
    if tree is None or not leaves:
        return c
    old = list(c.views) if c.views else [None] * len(leaves)
    seen = [_stand_in(v.aval, view) for v, view in zip(leaves, old)]
    back = tree_flatten(restore(tree_unflatten(tree, seen)), is_leaf=_is_leaf)[0]
    back = [b for b in back if b is not None]
    if len(back) != len(seen):
        return c
    views = [view if np.shape(b) == s.shape and np.asarray(b).dtype == s.dtype else
             _dropped(view, s.shape, np.shape(b), None if np.asarray(b).dtype == s.dtype else np.asarray(b).dtype)
             for view, s, b in zip(old, seen, back)]
    if any(v is not w for v, w in zip(views, old)):
        c.views = views
    return c
