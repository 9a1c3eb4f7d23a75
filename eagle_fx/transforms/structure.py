"""The transform rules of the array-structure primitives (slice, update, reshape, concat).

All four are linear, so each rule is the same kind of operation again:
  jvp        the same op on the tangents (a missing tangent is zeros);
  transpose  slice -> scatter into zeros (an update of zeros: basic indices never repeat a position);
             update -> the cotangent with the region zeroed (base) and its slice (value);
             reshape -> reshape back; concat -> the slice of each operand's part;
  batching   the batch axis is axis 0: indices gain a leading full range, shapes a leading B, the
             concat axis shifts by one; an unbatched operand meets a batched one by broadcasting.
Graph-level rules write equations (`Eqns`); the record interpreters (eagle_fx.diff) use the NumPy
ones at the end, on arrays.
"""
from __future__ import annotations

import numpy as np

from hawk_fx.core import RuleTable

from .. import ir
from .program import Eqns, ct_aval

transpose_rules = RuleTable("transpose")                # prim -> fn(e, ct, eqns) -> input cotangents
batch_rules = RuleTable("structure batching")           # prim -> fn(e, params, B): the batched params
array_rules = RuleTable("structure on arrays")          # prim -> fn(e, xs) -> the result array
array_transpose_rules = RuleTable("transpose on arrays")   # prim -> fn(e, ct) -> input cotangent arrays


# -- jvp (Program transform): tangent atoms in, the output's tangent Var out (None: zero) -----------

def jvp(e, ts, eqns: Eqns):
    if all(t is None for t in ts):
        return None
    ts = [t if t is not None else eqns.zeros(ct_aval(a.aval)) for t, a in zip(ts, e.inputs)]
    params = dict(e.params)
    if "inplace" in params:
        params["inplace"] = ()
    return eqns.bind(e.prim, ts, params)[0]


# -- transpose (Program transform): the cotangent of each input (None: none) ----------------------

def transpose(e, ct, eqns: Eqns) -> list:
    return transpose_rules[e.prim](e, ct, eqns)


@transpose_rules.register(ir.slice_p)
def _slice_transpose(e, ct, eqns):
    zeros = eqns.zeros(ct_aval(e.inputs[0].aval))
    return [eqns.bind(ir.update_p, [zeros, ct], {"index": e.params["index"], "inplace": ()})[0]]


@transpose_rules.register(ir.update_p)
def _update_transpose(e, ct, eqns):
    index = e.params["index"]
    region = eqns.zeros(ct_aval(e.inputs[1].aval))
    return [eqns.bind(ir.update_p, [ct, region], {"index": index, "inplace": ()})[0],
            eqns.bind(ir.slice_p, [ct], {"index": index})[0]]


@transpose_rules.register(ir.reshape_p)
def _reshape_transpose(e, ct, eqns):
    return [eqns.bind(ir.reshape_p, [ct], {"shape": e.inputs[0].aval.shape})[0]]


@transpose_rules.register(ir.concat_p)
def _concat_transpose(e, ct, eqns):
    return [eqns.bind(ir.slice_p, [ct], {"index": idx})[0] for idx in _parts(e)]


def _parts(e):
    """The index of each concat operand's part of the result."""
    axis, out = e.params["axis"], e.outputs[0].aval.shape
    start, parts = 0, []
    for a in e.inputs:
        k = a.aval.shape[axis]
        parts.append(tuple(range(start, start + k) if i == axis else range(d) for i, d in enumerate(out)))
        start += k
    return parts


# -- batching: (params, operands to broadcast) for a batch of B --------------------------------

def batch_params(e, flags, B):
    """The params of the batched equation and which operands must be broadcast to the batch."""
    params = dict(e.params)
    batch_rules[e.prim](e, params, B)
    broadcast = [not f for f in flags] if e.prim in _MEETS_BATCHED else [False] * len(flags)
    return params, broadcast


_MEETS_BATCHED = (ir.update_p, ir.concat_p)      # an unbatched operand is broadcast to meet a batched one


@batch_rules.register(ir.slice_p)
@batch_rules.register(ir.update_p)
def _index_batch(e, params, B):
    params["index"] = (range(B),) + tuple(params["index"])


@batch_rules.register(ir.reshape_p)
def _reshape_batch(e, params, B):
    params["shape"] = (B,) + tuple(params["shape"])


@batch_rules.register(ir.concat_p)
def _concat_batch(e, params, B):
    params["axis"] = params["axis"] + 1


# -- the same on arrays, for the record interpreters ------------------------------------------

def eval_array(e, xs):
    """The op itself on arrays (a tangent pushed forward through it)."""
    return array_rules[e.prim](e, xs)


def transpose_array(e, ct) -> list:
    return array_transpose_rules[e.prim](e, ct)


array_rules[ir.slice_p] = lambda e, xs: np.array(xs[0][ir.numpy_index(e.params["index"])])
array_rules[ir.reshape_p] = lambda e, xs: np.reshape(xs[0], e.params["shape"]).copy()
array_rules[ir.concat_p] = lambda e, xs: np.concatenate(xs, axis=e.params["axis"])


@array_rules.register(ir.update_p)
def _update_array(e, xs):
    out = np.array(xs[0], dtype=np.result_type(xs[0], xs[1]))
    out[ir.numpy_index(e.params["index"])] = xs[1]
    return out


@array_transpose_rules.register(ir.slice_p)
def _slice_transpose_array(e, ct):
    out = np.zeros(e.inputs[0].aval.shape, ct.dtype)
    out[ir.numpy_index(e.params["index"])] = ct
    return [out]


@array_transpose_rules.register(ir.update_p)
def _update_transpose_array(e, ct):
    idx = ir.numpy_index(e.params["index"])
    base = np.array(ct)
    base[idx] = 0
    return [base, np.array(ct[idx])]


array_transpose_rules[ir.reshape_p] = lambda e, ct: [np.reshape(ct, e.inputs[0].aval.shape)]
array_transpose_rules[ir.concat_p] = lambda e, ct: [np.array(ct[ir.numpy_index(idx)]) for idx in _parts(e)]
