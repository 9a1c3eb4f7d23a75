"""Sums and means of staged planes: `np.sum(y)`, `y.sum()`, `np.mean(y)`, `y.mean()`.

Each is a call of a small generated kernel whose body reduces the per-sample components
(`hm.einsum`) and then the samples (`hawk_fx.sum` / `hawk_fx.mean`), so the result gets every
kernel rule: derivatives, batching (under vmap a sum stays per instance), fusion, CUDA. A staged
plane keeps a sample axis, so the full sum is a one-cell plane of shape (1,) where NumPy gives a
0-d array; the values agree.
"""
from __future__ import annotations

import numpy as np

from hawk_fx.core import Eqn, EqnInfo, Var
from hawk_fx.tree import LEAF

from .. import ir
from . import staged_numpy as sn

REDUCTIONS = {np.sum: "sum", np.mean: "mean"}

# components of a plane of 1, 2, 3 axes summed per sample (the sample axis is implicit in a kernel)
_COMPONENTS = {1: None, 2: "i->", 3: "ij->"}


def reduction_kernel(what: str, shape: tuple, over_samples_only: bool = False):
    """The kernel reducing a plane of `shape`: over every axis, or (over_samples_only) over its samples alone."""
    role = sn.role_of(np.empty(shape, dtype=[]))
    spec = _COMPONENTS[len(shape)]
    per_sample = "a" if spec is None or over_samples_only else f'hm.einsum("{spec}", a)'
    body = f"hawk_fx.{what}({per_sample})"
    if what == "mean" and not over_samples_only and len(shape) > 1:
        body += f" / {int(np.prod(shape[:-1]))}"          # the sample mean of each sample's sum, over its components
    name = f"{what}_samples" if over_samples_only else f"{what}_all"
    return sn.elementwise_kernel(name, (role,), body)


def _axis(axis, ndim, at, name):
    """None for the full reduction, -1 for one over the samples; any other axis is refused."""
    if axis is None:
        return None
    if isinstance(axis, tuple):
        axes = {int(a) % ndim if -ndim <= int(a) < ndim else None for a in axis}
        if axes == set(range(ndim)):
            return None
        if axes == {ndim - 1}:
            return -1
    elif isinstance(axis, (int, np.integer)) and -ndim <= axis < ndim:
        if axis % ndim == ndim - 1:
            return None if ndim == 1 else -1
    raise sn._refuse(at, f"{name}(axis={axis!r}) of a plane of {ndim} axes",
                     "reduce over every axis (no axis=) or over the samples (axis=-1); " + sn.WRITE_KERNEL)


def stage_reduction(what, name, plane, at, axis=None, dtype=None, out=None, keepdims=False, **rest):
    """np.sum / np.mean of a staged plane (`name` as the user wrote it, `at` the builder line), as
    NumPy: over every axis (a (1,) one-cell plane, not 0-d), or over the samples (axis=-1: the
    shape without its last axis). Other axes are refused: a kernel reduces over the samples."""
    given = [k for k, v in (("out", out), *rest.items()) if v is not None]
    if given:
        raise sn._refuse(at, f"{name}({', '.join(k + '=' for k in given)}...)",
                         "call it with axis=, keepdims= or dtype= alone (assign the result: y[...] = np.sum(x); "
                         "for a masked sum: np.sum(np.where(mask, x, 0.0)))")
    shape = tuple(plane.shape)
    if not 1 <= len(shape) <= 3:
        raise ValueError(f"{sn.API} {at}: {name} of a plane of shape {shape}; staged sums take planes of 1 to "
                         "3 axes (Scalar, Vector[k], Matrix[m, k] planes): write a kernel")
    if dtype is not None:
        plane = sn.stage_cast(plane, np.dtype(dtype), at)
    if np.dtype(plane.dtype).kind != "f":
        raise TypeError(f"{sn.API} {at}: {name} of a {np.dtype(plane.dtype).name} plane; staged sums take float "
                        "planes: cast first (np.sum(y.astype(np.float64)), or dtype=np.float64)")
    ax = _axis(axis, len(shape), at, name)
    result = reduction_kernel(what, shape, over_samples_only=ax is not None)(plane)
    if ax is None:
        return result.reshape((1,) * len(shape)) if keepdims else result
    lead = shape[:-1]
    return result.reshape(lead + (1,) if keepdims else lead)


def graph_reduction(g, what: str):
    """A Graph staged inside a transform (a builder or transform a plain function called), reduced
    as `np.sum` / `np.mean` of its one result: a new lazy Graph whose Program ends in the reduction
    kernel's call, so `lambda x: f(x).sum()` hands the transform a one-cell result."""
    from ..graph import Graph
    from ..ir.closed import closed_of
    from ..transforms.program import dce
    c = closed_of(g)
    api = f"eagle_fx.Graph.{what}"
    if c.n_results != 1 or (c.tree is not None and c.tree.kind != "leaf"):
        raise TypeError(f"{api}: the graph has {c.n_results} results; .{what}() reduces a graph of one result: "
                        "reduce each part (jvp(...)[1].sum())")
    v = c.program.outputs[0]
    shape = tuple(v.aval.shape)
    if not 1 <= len(shape) <= 3 or v.aval.dtype.kind != "f":
        raise TypeError(f"{api}: the result is {v.aval.dtype.name}{list(shape)}; .{what}() takes a float result of "
                        "1 to 3 axes: reduce it in a kernel")
    if c.views and c.views[0] is not None:
        raise TypeError(f"{api}: the result is seen through a view (a Jacobian's shape); reduce it in a builder")
    k = reduction_kernel(what, shape)
    layout, n = k.layout_of([np.empty(shape, v.aval.dtype)])
    spec = k.specialize(layout)
    out = Var(ir.plane_aval(spec.result_shape(0, n), spec.result_dtype(0)))
    eqn = Eqn(ir.call_p, [v], [out], dict(kernel=k, spec=spec, n=n, inplace=()), EqnInfo(name=k.name))
    prog = c.program.replace(eqns=list(c.program.eqns) + [eqn], outputs=[out])
    part = c.derive(dce(prog), c.planes, LEAF, 1)
    part.made = c.made
    return Graph.from_closed(part, lazy=True)
