"""hawk_fx.math: the elementwise and small-tensor vocabulary of a kernel body.

Every function works on traced values and on plain Python numbers (then it computes at once).
Names follow NumPy where NumPy has one; `asin`/`atan2`-style names follow C and CUDA.
"""
from __future__ import annotations

import numpy as np
import opt_einsum

from .core import Tracer
from .prims import P
from .context import CONTEXT

__all__ = ["abs", "sign", "floor", "ceil", "round", "trunc", "sqrt", "rsqrt", "cbrt", "exp", "exp2", "expm1",
           "log", "log2", "log10", "log1p", "sin", "cos", "tan", "asin", "acos", "atan", "atan2", "sinh", "cosh",
           "tanh", "asinh", "acosh", "atanh", "erf", "erfc", "pow", "hypot", "fmod", "minimum", "maximum", "clip",
           "where", "select", "isfinite", "isnan", "isinf", "logical_and", "logical_or", "logical_not",
           "uint32", "int32", "float32", "float64", "real", "vec", "dot", "norm", "cross", "outer", "transpose",
           "matmul", "trace", "einsum", "add", "subtract", "multiply", "divide", "negative", "less", "less_equal",
           "greater", "greater_equal", "equal", "not_equal", "sigmoid", "softplus", "log_sigmoid", "logaddexp",
           "relu", "xlogy", "xlog1py", "logsumexp", "stop_gradient", "take", "scatter_add",
           "fma", "copysign", "remainder", "rint", "spacing", "fdim", "argmax", "argmin"]


_UNARY_DOCS = {"rsqrt": "Elementwise 1 / sqrt(x) (CUDA's rsqrt).",
               "erf": "Elementwise error function, as math.erf (scipy.special.erf).",
               "erfc": "Elementwise complementary error function 1 - erf(x), as math.erfc."}


def _unary(name, doc):
    p = P[name]

    def f(x):
        return p.bind(x)
    f.__name__ = f.__qualname__ = doc
    f.__doc__ = _UNARY_DOCS.get(doc, f"Elementwise {doc}, as numpy.{getattr(p, 'np_name', doc)}.")
    return f


def _binary(name, doc):
    p = P[name]

    def f(x, y):
        return p.bind(x, y)
    f.__name__ = f.__qualname__ = doc
    f.__doc__ = f"Elementwise {doc} of two values (broadcast as NumPy does)."
    return f


abs = _unary("abs", "abs")
sign = _unary("sign", "sign")
floor = _unary("floor", "floor")
ceil = _unary("ceil", "ceil")
round = _unary("round", "round")          # half to even, as numpy.round
trunc = _unary("trunc", "trunc")
sqrt = _unary("sqrt", "sqrt")
rsqrt = _unary("rsqrt", "rsqrt")
cbrt = _unary("cbrt", "cbrt")
exp = _unary("exp", "exp")
exp2 = _unary("exp2", "exp2")
expm1 = _unary("expm1", "expm1")
log = _unary("log", "log")
log2 = _unary("log2", "log2")
log10 = _unary("log10", "log10")
log1p = _unary("log1p", "log1p")
sin = _unary("sin", "sin")
cos = _unary("cos", "cos")
tan = _unary("tan", "tan")
asin = _unary("asin", "asin")
acos = _unary("acos", "acos")
atan = _unary("atan", "atan")
sinh = _unary("sinh", "sinh")
cosh = _unary("cosh", "cosh")
tanh = _unary("tanh", "tanh")
asinh = _unary("asinh", "asinh")
acosh = _unary("acosh", "acosh")
atanh = _unary("atanh", "atanh")
erf = _unary("erf", "erf")
erfc = _unary("erfc", "erfc")
isfinite = _unary("isfinite", "isfinite")
isnan = _unary("isnan", "isnan")
isinf = _unary("isinf", "isinf")
logical_not = _unary("not", "logical_not")
negative = _unary("neg", "negative")

atan2 = _binary("atan2", "atan2")
pow = _binary("pow", "pow")
hypot = _binary("hypot", "hypot")
fmod = _binary("fmod", "fmod")
minimum = _binary("min", "minimum")
maximum = _binary("max", "maximum")
logical_and = _binary("and", "logical_and")
logical_or = _binary("or", "logical_or")
add = _binary("add", "add")
subtract = _binary("sub", "subtract")
multiply = _binary("mul", "multiply")
divide = _binary("div", "divide")
less = _binary("lt", "less")
less_equal = _binary("le", "less_equal")
greater = _binary("gt", "greater")
greater_equal = _binary("ge", "greater_equal")
equal = _binary("eq", "equal")
not_equal = _binary("ne", "not_equal")


def where(cond, a, b):
    """Per-sample choice: a where cond is true, else b (both are computed)."""
    if not _is_bool(cond):
        cond = P["ne"].bind(cond, 0)
    return P["select"].bind(cond, a, b)


select = where


def _is_bool(x):
    aval = getattr(x, "aval", None)
    return (aval.dtype == np.bool_) if aval is not None else isinstance(x, (bool, np.bool_))


def clip(x, lo, hi):
    """min(max(x, lo), hi), as numpy.clip."""
    return minimum(maximum(x, lo), hi)


def _cast(dtype, doc):
    dt = np.dtype(dtype)

    def f(x):
        return P["convert"].bind(x, dtype=dt)
    f.__name__ = f.__qualname__ = doc
    f.__doc__ = f"Convert to {dt.name} (C casting: floats truncate toward zero)."
    return f


uint32 = _cast(np.uint32, "uint32")
int32 = _cast(np.int32, "int32")
float32 = _cast(np.float32, "float32")
float64 = _cast(np.float64, "float64")


def real(x):
    """A floating value: floats pass through, integers and bools become float64."""
    aval = getattr(x, "aval", None)
    kind = aval.dtype.kind if aval is not None else np.asarray(x).dtype.kind
    return x if kind in "fc" else float64(x)


# ---------------------------------------------------------------------------------------------
# small per-sample tensors (Vector[k] values have per-sample shape (k,), Matrix[m, k] (m, k))

def vec(*xs):
    """A Vector from its components: vec(a, b, c)."""
    if len(xs) == 1 and isinstance(xs[0], (list, tuple)):
        xs = tuple(xs[0])
    trace = CONTEXT.innermost("kernel_traces")
    if trace is not None and not any(isinstance(x, Tracer) for x in xs):
        return trace.process(P["stack"], xs, {})[0]     # numbers only: a weak Vector of the body
    return P["stack"].bind(*xs)


def _shape(x):
    """Per-sample shape of a traced value or a constant (np.shape must not see a tracer)."""
    return x.aval.shape if hasattr(x, "aval") else np.shape(x)


def einsum(spec: str, *operands):
    """Per-sample einsum (the sample axis is implicit). Three or more operands are contracted
    pairwise in the order opt_einsum chooses."""
    if len(operands) <= 2:
        return P["einsum"].bind(*operands, spec=spec)
    shapes = [_shape(o) for o in operands]
    _, info = opt_einsum.contract_path(spec, *shapes, shapes=True)
    ops = list(operands)
    for contraction in info.contraction_list:
        inds, pair_spec = contraction[0], contraction[2]     # inds in the order opt_einsum pops them
        args = [ops.pop(i) for i in inds]
        ops.append(P["einsum"].bind(*args, spec=pair_spec))
    return ops[0]


def dot(a, b):
    """Per-sample inner product of two Vectors."""
    return einsum("i,i->", a, b)


def norm(a):
    """Per-sample Euclidean norm of a Vector."""
    return sqrt(dot(a, a))


def cross(a, b):
    """Per-sample cross product of two Vector[3] values."""
    return P["cross"].bind(a, b)


def outer(a, b):
    """Per-sample outer product: a Matrix from two Vectors."""
    return einsum("i,j->ij", a, b)


def transpose(m):
    """Per-sample transpose of a Matrix."""
    return P["transpose"].bind(m)


def matmul(a, b):
    """Matrix @ Vector, Matrix @ Matrix, Vector @ Matrix, Vector @ Vector."""
    ra, rb = len(_shape(a)), len(_shape(b))
    spec = {(2, 1): "ij,j->i", (2, 2): "ij,jk->ik", (1, 2): "j,jk->k", (1, 1): "i,i->"}.get((ra, rb))
    if spec is None:
        raise ValueError(f"hawk.math.matmul: needs Vector or Matrix operands, got per-sample ranks {ra} and {rb}")
    return einsum(spec, a, b)


def trace(m):
    """Per-sample trace of a square Matrix."""
    return einsum("ii->", m)


# ---------------------------------------------------------------------------------------------
# optimisation: stable at +-800 in float32 and float64, with JAX's derivatives

sigmoid = _unary("logistic", "sigmoid")
sigmoid.__doc__ = "Elementwise 1 / (1 + exp(-x)), without overflow; derivative s (1 - s) (jax.nn.sigmoid)."
logaddexp = _binary("logaddexp", "logaddexp")
logaddexp.__doc__ = "log(exp(a) + exp(b)) without overflow (numpy.logaddexp); a tie splits the derivative 0.5/0.5."
xlogy = _binary("xlogy", "xlogy")
xlogy.__doc__ = "x * log(y), 0 where x is 0 (jax.scipy.special.xlogy); derivatives log(y) and x / y."
xlog1py = _binary("xlog1py", "xlog1py")
xlog1py.__doc__ = "x * log1p(y), 0 where x is 0 (jax.scipy.special.xlog1py)."
stop_gradient = _unary("stop_gradient", "stop_gradient")
stop_gradient.__doc__ = "x, with a zero derivative (jax.lax.stop_gradient)."


def softplus(x):
    """log(1 + exp(x)) without overflow: logaddexp(x, 0); derivative sigmoid(x), 0.5 at 0."""
    return logaddexp(x, 0.0)


def log_sigmoid(x):
    """log(sigmoid(x)) = -softplus(-x), finite for large |x|."""
    return -softplus(-x)


def relu(x):
    """max(x, 0) with derivative 0 at 0 (jax.nn.relu's convention)."""
    return where(x > 0, x, 0.0)


def logsumexp(v):
    """log(sum(exp(v))) over the components of a Vector, shifted by their largest (held constant
    for the derivative, as jax.nn.logsumexp), so it neither overflows nor underflows."""
    shape = _shape(v)
    if len(shape) != 1:
        raise TypeError(f"hawk.math.logsumexp: takes a Vector (one axis per sample), got per-sample shape {shape}")
    comps = [v[i] for i in range(shape[0])]
    m = comps[0]
    for c in comps[1:]:
        m = maximum(m, c)
    m = stop_gradient(where(isfinite(m), m, 0.0))
    s = exp(comps[0] - m)
    for c in comps[1:]:
        s = s + exp(c - m)
    return m + log(s)


# tables: a per-sample runtime index into a Table (or a Vector/Matrix value)
from .tables import scatter_add, take  # noqa: E402

# ---------------------------------------------------------------------------------------------
# C's and NumPy's remaining elementwise functions, and argmax/argmin over a Vector

copysign = _binary("copysign", "copysign")
copysign.__doc__ = "|x| with the sign bit of y (numpy.copysign; -0.0 and NaN signs count); derivative JAX's."
remainder = _binary("mod", "remainder")
remainder.__doc__ = "x - floor(x / y) * y, the sign of y (numpy.remainder, Python's %)."
rint = _unary("round", "rint")
rint.__doc__ = "Elementwise round to the nearest integer, half to even (numpy.rint, C's rint)."
spacing = _unary("spacing", "spacing")
spacing.__doc__ = "The distance from x to the next float away from zero (numpy.spacing); derivative 0."


def fma(a, b, c):
    """a * b + c. Rounded once where the backend fuses it (CUDA contracts a * b + c), twice on
    NumPy and JAX (NumPy has no fused multiply-add); derivatives b, a, 1."""
    return a * b + c


def fdim(x, y):
    """x - y where x > y, else +0; NaN if either is NaN (C's fdim). Derivatives 1, -1 where x > y."""
    return where(x <= y, 0.0, x - y)


def _arg_extremum(v, api, better):
    shape = _shape(v)
    if len(shape) != 1:
        raise TypeError(f"hawk.math.{api}: takes a Vector (one axis per sample), got per-sample shape {shape}")
    best, at = v[0], 0
    for i in range(1, shape[0]):
        c = v[i]
        take = logical_or(better(c, best), logical_and(isnan(c), logical_not(isnan(best))))
        best, at = where(take, c, best), where(take, i, at)
    return int32(at)


def argmax(v):
    """The index (int32) of a Vector's largest component, the first of ties; a NaN counts as the
    largest (numpy.argmax)."""
    return _arg_extremum(v, "argmax", greater)


def argmin(v):
    """The index (int32) of a Vector's smallest component, the first of ties; a NaN counts as the
    smallest (numpy.argmin)."""
    return _arg_extremum(v, "argmin", less)


from . import linalg  # noqa: E402  (hm.linalg: small per-sample linear algebra, built on the functions above)

# ---------------------------------------------------------------------------------------------
# per-sample random numbers (hm.random) and the sample's place in the call

from . import random                                   # noqa: E402  (hawk_fx.random uses this module)
from .random import n_samples, sample_index            # noqa: E402

__all__ += ["sample_index", "n_samples"]               # and the module `random` (hm.random.normal, ...)
