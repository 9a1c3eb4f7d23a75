"""Linear maps of staged graphs, as JAX has them: linearize (the jvp at fixed primals) and
linear_transpose (the transpose of a linear function, through its vjp).

    y, f_jvp = eagle_fx.linearize(f, x, flag)
    ty = f_jvp(dx, None)                       # a tangent (or None) per argument, as eagle_fx.jvp
    f_t = eagle_fx.linear_transpose(lin, x)    # lin linear in x: f_t(ct) -> (cotangent of x,)
"""
from __future__ import annotations

import numpy as np

from hawk_fx.context import CONTEXT
from hawk_fx.tree import tree_flatten, tree_map

from . import seams
from .api import is_array, name_of
from .derivatives import jvp_as, vjp_as
from .transforms.program import TransformError


def linearize(f, *primals):
    """(f(*primals), f_jvp): f_jvp(*tangents) is the tangent of f's result at `primals` for a tangent
    (or None) per argument, as eagle_fx.jvp gives it. The primals are copied now; each call replays
    the cached jvp graph (its forward included: no residuals are kept between calls)."""
    api = "eagle_fx.linearize"
    if CONTEXT.transforming:
        raise TransformError(f"{api}: inside a transformed function, use eagle_fx.jvp (it returns its graph to the "
                             "outer transform); linearize returns a Python function")
    primals = tuple(tree_map(lambda x: np.array(x) if isinstance(x, np.ndarray) else x, p, is_leaf=is_array)
                    for p in primals)
    jvp_at = seams.as_written(api, lambda *ts: jvp_as(f, primals, ts, api))     # refusals name linearize(f)
    y, _ = jvp_at(*(None,) * len(primals))

    def f_jvp(*tangents):
        if len(tangents) != len(primals):
            raise TypeError(f"{api}: f_jvp takes a tangent (or None) per argument of f: {len(primals)}, got "
                            f"{len(tangents)}")
        return jvp_at(*tangents)[1]
    return y, f_jvp


def linear_transpose(f, *primals):
    """The transpose of `f`, linear in its floating arguments: f_t(ct) -> a cotangent tree per
    argument (None at leaves that are not floating arrays). `primals` give the arguments' shapes,
    dtypes and any static values (arrays, or objects with .shape and .dtype). Linearity is checked
    only as far as f(0) == 0: an affine offset is refused; a nonlinear f gives its vjp at zero."""
    api = "eagle_fx.linear_transpose"
    if CONTEXT.transforming:
        raise TransformError(f"{api}: inside a transformed function, use eagle_fx.grad or eagle_fx.jacrev")
    zeros = tuple(tree_map(_zeros_like, p, is_leaf=_is_shaped) for p in primals)
    y0, pullback = vjp_as(f, zeros, api)
    offset = [x for x in tree_flatten(y0, is_leaf=is_array)[0] if isinstance(x, np.ndarray) and x.dtype.kind == "f"
              and np.any(x != 0)]
    if offset:
        raise ValueError(f"{api}: {name_of(f)} is not linear: at zero arguments its result is {offset[0]!r:.80}, not 0 "
                         "(an affine offset); transpose the linear part (subtract f(0))")

    def f_t(ct):
        return pullback(ct)
    return f_t


def _is_shaped(x):
    return is_array(x) or (hasattr(x, "shape") and hasattr(x, "dtype"))


def _zeros_like(x):
    if _is_shaped(x):
        return np.zeros(tuple(x.shape), np.dtype(x.dtype))
    return x
