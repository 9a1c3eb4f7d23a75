"""eval_shape: the shapes and dtypes of a function's result, found by staging it (nothing runs).

    eagle_fx.eval_shape(eagle_fx.jacfwd(f), x, flag)   # ShapeDtypeStruct(shape=(8, 8), dtype=float64)
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from hawk_fx.context import CONTEXT
from hawk_fx.tree import tree_map, tree_unflatten

from .api import is_array, name_of, stage
from .backends.select import use_backend

API = "eagle_fx.eval_shape"


class ShapeDtypeStruct(NamedTuple):
    """A result's shape and dtype, like jax.ShapeDtypeStruct (and accepted where an argument is)."""
    shape: tuple
    dtype: np.dtype

    def __repr__(self):
        return f"ShapeDtypeStruct(shape={self.shape}, dtype={np.dtype(self.dtype).name})"


def eval_shape(f, *args):
    """A tree of ShapeDtypeStruct shaped like f(*args)'s result. `f`: a builder or a function an
    eagle_fx transform made (or a plain function returning one's graph). Array arguments may be
    arrays or anything with .shape and .dtype (a ShapeDtypeStruct, a jax.ShapeDtypeStruct); the
    graph is staged on stand-ins (no kernel runs, nothing is compiled), so its values are never read:
    a count the builder reads from an array is refused, as under eagle_fx.to_jax."""
    stand_ins = tuple(tree_map(_stand_in, a, is_leaf=_is_shaped) for a in args)
    with use_backend("numpy"), CONTEXT.enter(lazy_compile=True, abstract=True):
        c = stage(f, stand_ins, API)
    if not c.has_result:
        raise TypeError(f"{API}: {name_of(f)} declares no result (g.result = ...): there is no shape to give")
    outs, tree = c.result_vars()
    views = c.views or [None] * len(outs)
    structs = [_struct(v.aval, view) for v, view in zip(outs, views)]
    return tree_unflatten(tree, structs)


def _is_shaped(x):
    return is_array(x) or (hasattr(x, "shape") and hasattr(x, "dtype") and not isinstance(x, type))


def _stand_in(x):
    """A stand-in array of x's shape and dtype (NaN, or the dtype's largest value: never a real count)."""
    if not _is_shaped(x):
        return x
    dt = np.dtype(x.dtype)
    fill = np.nan if dt.kind in "fc" else True if dt.kind == "b" else np.iinfo(dt).max
    return np.full(tuple(x.shape), fill, dt)


def _struct(aval, view):
    if view is None:
        return ShapeDtypeStruct(tuple(aval.shape), np.dtype(aval.dtype))
    if isinstance(view, tuple):
        return ShapeDtypeStruct(tuple(view), np.dtype(aval.dtype))
    shaped = view(np.zeros(aval.shape, aval.dtype))       # a view function: reshapes, no graph runs
    return ShapeDtypeStruct(tuple(np.shape(shaped)), np.asarray(shaped).dtype)


__all__ = ["eval_shape", "ShapeDtypeStruct"]
