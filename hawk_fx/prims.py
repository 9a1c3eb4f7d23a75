"""Kernel primitives and their abstract-evaluation and eager rules.

Elementwise ops form one family: each has a NumPy function that defines both its values and,
applied to tiny arrays, its result dtype, so promotion is NumPy's by construction.
"""
from __future__ import annotations

import functools
import math as _pymath

import numpy as np

from . import caches
from .core import SAMPLE, UNIFORM, AVal, Primitive, abstract_eval, eager_impl


def _written(r, out):
    if out is None:
        return r
    np.copyto(out, r)
    return out


_erf_u = np.vectorize(_pymath.erf, otypes=[np.float64])   # exact to an ulp; NumPy has no erf
_erfc_u = np.vectorize(_pymath.erfc, otypes=[np.float64])


def _erf(x, out=None):
    return _written(_erf_u(x).astype(np.result_type(x, 1.0)), out)


def _erfc(x, out=None):
    return _written(_erfc_u(x).astype(np.result_type(x, 1.0)), out)


def _rsqrt(x, out=None):
    r = np.sqrt(x, out=out)
    return np.divide(1, r, out=r if out is not None else None)


def _logistic(x, out=None):
    """1 / (1 + exp(-x)) without overflow: exp of -|x| only."""
    x = np.asarray(x)
    if x.dtype.kind not in "fc":                # integers: in float64, as np.exp computes them
        x = x.astype(np.float64)
    e = np.exp(-np.abs(x))
    return _written(np.where(x >= 0, 1.0, e) / (1.0 + e), out)


def _xlogy(x, y, out=None):
    """x * log(y), 0 where x is 0 (scipy.special.xlogy)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return _written(np.where(np.asarray(x) == 0, 0, x * np.log(_weak_as(y, x))), out)


def _xlog1py(x, y, out=None):
    """x * log1p(y), 0 where x is 0 (scipy.special.xlog1py)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return _written(np.where(np.asarray(x) == 0, 0, x * np.log1p(_weak_as(y, x))), out)


def _weak_as(y, x):
    """y in the dtype x and y compute in: np.log of a Python number is a (strong) float64, which
    would make x * log(y) float64 for a float32 x."""
    return np.asarray(y, np.result_type(x, y)) if isinstance(y, (int, float)) else y


def _identity(x, out=None):
    return np.array(x) if out is None else _written(x, out)


# name -> (arity, NumPy function). The NumPy function defines values and dtypes.
ELEMENTWISE_TABLE = {
    "neg": (1, np.negative), "abs": (1, np.absolute), "sign": (1, np.sign), "floor": (1, np.floor),
    "ceil": (1, np.ceil), "round": (1, np.rint), "trunc": (1, np.trunc), "sqrt": (1, np.sqrt),
    "rsqrt": (1, _rsqrt), "cbrt": (1, np.cbrt), "exp": (1, np.exp), "exp2": (1, np.exp2),
    "expm1": (1, np.expm1), "log": (1, np.log), "log2": (1, np.log2), "log10": (1, np.log10),
    "log1p": (1, np.log1p), "sin": (1, np.sin), "cos": (1, np.cos), "tan": (1, np.tan),
    "asin": (1, np.arcsin), "acos": (1, np.arccos), "atan": (1, np.arctan), "sinh": (1, np.sinh),
    "cosh": (1, np.cosh), "tanh": (1, np.tanh), "asinh": (1, np.arcsinh), "acosh": (1, np.arccosh),
    "atanh": (1, np.arctanh), "erf": (1, _erf), "erfc": (1, _erfc), "isfinite": (1, np.isfinite),
    "isnan": (1, np.isnan), "isinf": (1, np.isinf), "not": (1, np.logical_not),
    "add": (2, np.add), "sub": (2, np.subtract), "mul": (2, np.multiply), "div": (2, np.true_divide),
    "floordiv": (2, np.floor_divide), "mod": (2, np.remainder), "pow": (2, np.power),
    "atan2": (2, np.arctan2), "hypot": (2, np.hypot), "fmod": (2, np.fmod), "min": (2, np.minimum),
    "max": (2, np.maximum), "lt": (2, np.less), "le": (2, np.less_equal), "gt": (2, np.greater),
    "ge": (2, np.greater_equal), "eq": (2, np.equal), "ne": (2, np.not_equal),
    "and": (2, np.logical_and), "or": (2, np.logical_or),
    "select": (3, np.where),
    # the stable functions of optimisation (hawk_fx.math.sigmoid, softplus, ...) and stop_gradient
    "logistic": (1, _logistic), "logaddexp": (2, np.logaddexp), "xlogy": (2, _xlogy), "xlog1py": (2, _xlog1py),
    "stop_gradient": (1, _identity),
    # C's copysign and NumPy's spacing (the distance to the next float away from zero)
    "copysign": (2, np.copysign), "spacing": (1, np.spacing),
}

ELEMENTWISE: dict[Primitive, tuple[int, object]] = {}
P: dict[str, Primitive] = {}     # every kernel primitive by name


def _prim(name, multiple_results=False):
    p = Primitive(name, multiple_results)
    P[name] = p
    return p


def _probe(aval: AVal):
    """A tiny value with aval's dtype; a Python number when weak, so NumPy applies its weak rules."""
    if aval.weak:
        return {"b": True, "i": 1, "u": 1, "f": 1.0, "c": 1j}[aval.dtype.kind]
    return np.ones(1, aval.dtype)


@caches.register_memo
@functools.lru_cache(maxsize=4096)
def _elementwise_dtype(name, sig):
    fn = ELEMENTWISE_TABLE[name][1]
    probes = [_probe(AVal((), dt, UNIFORM, weak)) for dt, weak in sig]
    with np.errstate(all="ignore"):
        out = fn(*probes)
    return np.asarray(out).dtype


def broadcast_kind(*avals):
    return SAMPLE if any(a.kind == SAMPLE for a in avals) else UNIFORM


def _elementwise_abstract(name):
    def rule(*avals):
        try:
            shape = np.broadcast_shapes(*[a.shape for a in avals])
        except ValueError:
            shapes = ", ".join(str(a.shape) for a in avals)
            raise ValueError(f"hawk.math.{name}: per-sample shapes {shapes} do not broadcast") from None
        dt = _elementwise_dtype(name, tuple((a.dtype, a.weak) for a in avals))
        # weak when its values are: a choice between two Python numbers is a Python number in
        # each sample, whatever the condition (so float32 code stays float32, as with a Param)
        weak = all(a.weak for a in (avals[1:] if name == "select" else avals))
        return [AVal(shape, dt, broadcast_kind(*avals), weak)]
    return rule


def promote(avals) -> np.dtype:
    """The dtype NumPy computes operands of these avals in (Python numbers weak, NEP 50)."""
    return _promote(tuple((a.dtype, a.weak) for a in avals))


@caches.register_memo
@functools.lru_cache(maxsize=1024)
def _promote(sig):
    return np.result_type(*[_probe(AVal((), dt, UNIFORM, weak)) for dt, weak in sig])


for _name, (_arity, _fn) in ELEMENTWISE_TABLE.items():
    _p = _prim(_name)
    ELEMENTWISE[_p] = (_arity, _fn)
    abstract_eval[_p] = _elementwise_abstract(_name)
    eager_impl[_p] = (lambda fn: lambda *xs: [fn(*xs)])(_fn)


# ---------------------------------------------------------------------------------------------
# casts

convert_p = _prim("convert")


@abstract_eval.register(convert_p)
def _convert_abstract(x, *, dtype):
    return [AVal(x.shape, dtype, x.kind)]


eager_impl[convert_p] = lambda x, *, dtype: [np.asarray(x).astype(dtype)]


# ---------------------------------------------------------------------------------------------
# sample reductions: one value for all samples

REDUCTIONS = {"sample_sum": np.sum, "sample_max": np.max, "sample_min": np.min, "sample_mean": np.mean}
REDUCTION: dict[Primitive, object] = {}


def _reduction_abstract(fn):
    def rule(x):
        return [AVal(x.shape, np.asarray(fn(np.ones(1, x.dtype))).dtype, UNIFORM)]
    return rule


for _name, _fn in REDUCTIONS.items():
    _p = _prim(_name)
    REDUCTION[_p] = _fn
    abstract_eval[_p] = _reduction_abstract(_fn)
    eager_impl[_p] = (lambda fn: lambda x: [np.asarray(fn(x))])(_fn)   # eager: a constant is one sample


# ---------------------------------------------------------------------------------------------
# small per-sample tensors: index, stack, einsum, cross, transpose

index_p = _prim("index")
stack_p = _prim("stack")
einsum_p = _prim("einsum")
cross_p = _prim("cross")
transpose_p = _prim("transpose")
broadcast_p = _prim("broadcast")     # a value made per-sample (or given a per-sample shape)


@abstract_eval.register(index_p)
def _index_abstract(x, *, i):
    if not x.shape:
        raise TypeError("hawk: indexing a per-sample scalar; only Vector/Matrix values can be indexed")
    if not -x.shape[0] <= i < x.shape[0]:
        raise IndexError(f"hawk: index {i} out of range for a value of per-sample shape {x.shape}")
    return [AVal(x.shape[1:], x.dtype, x.kind, x.weak)]


eager_impl[index_p] = lambda x, *, i: [np.asarray(x)[i]]


@abstract_eval.register(stack_p)
def _stack_abstract(*xs):
    shape = np.broadcast_shapes(*[a.shape for a in xs])
    # the components promote as one NumPy operation would: Python numbers are weak wherever they
    # stand (vec(p, a, a) and vec(a, p, a) are float32 alike for a float32 a)
    return [AVal((len(xs),) + shape, promote(xs), broadcast_kind(*xs), all(a.weak for a in xs))]


eager_impl[stack_p] = lambda *xs: [np.stack(np.broadcast_arrays(*xs))]


def parse_einsum(spec: str, shapes):
    if "->" not in spec:
        raise ValueError(f"hawk.math.einsum: spec {spec!r} needs an explicit '->' output")
    lhs, out = spec.replace(" ", "").split("->")
    terms = lhs.split(",")
    if len(terms) != len(shapes):
        raise ValueError(f"hawk.math.einsum: spec {spec!r} names {len(terms)} operands, got {len(shapes)}")
    dims: dict[str, int] = {}
    for t, s in zip(terms, shapes):
        if len(t) != len(s):
            raise ValueError(f"hawk.math.einsum: operand {t!r} has per-sample shape {tuple(s)}")
        for c, d in zip(t, s):
            if dims.setdefault(c, d) != d:
                raise ValueError(f"hawk.math.einsum: index {c!r} is {dims[c]} and {d} in {spec!r}")
    for c in out:
        if c not in dims:
            raise ValueError(f"hawk.math.einsum: output index {c!r} is not in any operand of {spec!r}")
    return terms, out, dims


@abstract_eval.register(einsum_p)
def _einsum_abstract(*xs, spec):
    _, out, dims = parse_einsum(spec, [a.shape for a in xs])
    # every operand promotes (Python numbers weak): an einsum of Python numbers only is weak
    return [AVal(tuple(dims[c] for c in out), promote(xs), broadcast_kind(*xs), all(a.weak for a in xs))]


def sample_spec(spec: str) -> str:
    """The whole-array spec: every operand and the output gain a trailing sample axis."""
    lhs, out = spec.replace(" ", "").split("->")
    return ",".join(t + "..." for t in lhs.split(",")) + "->" + out + "..."


eager_impl[einsum_p] = lambda *xs, spec: [np.einsum(spec, *xs)]


@abstract_eval.register(cross_p)
def _cross_abstract(a, b):
    if a.shape != (3,) or b.shape != (3,):
        raise ValueError(f"hawk.math.cross: needs two Vector[3] values, got per-sample shapes {a.shape} and {b.shape}")
    return [AVal((3,), promote((a, b)), broadcast_kind(a, b), a.weak and b.weak)]


eager_impl[cross_p] = lambda a, b: [np.cross(a, b, axis=0)]


@abstract_eval.register(transpose_p)
def _transpose_abstract(x):
    if len(x.shape) != 2:
        raise ValueError(f"hawk.math.transpose: needs a Matrix value, got per-sample shape {x.shape}")
    return [AVal(x.shape[::-1], x.dtype, x.kind, x.weak)]


eager_impl[transpose_p] = lambda x: [np.swapaxes(x, 0, 1)]


@abstract_eval.register(broadcast_p)
def _broadcast_abstract(x, *, shape, kind):
    return [AVal(shape, x.dtype, kind, x.weak and kind == UNIFORM)]


eager_impl[broadcast_p] = lambda x, *, shape, kind: [np.broadcast_to(x, shape)]


# the number of samples, as a Python number (for the derivative of sample_mean)
sample_count_p = _prim("sample_count")
abstract_eval[sample_count_p] = lambda x: [AVal((), np.float64, UNIFORM, weak=True)]
eager_impl[sample_count_p] = lambda x: [1.0]
