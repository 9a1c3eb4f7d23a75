"""The JAX emitter: a kernel body evaluated as jax.numpy expressions, one rule per primitive.

The body is interpreted once per trace (under jax.jit that is once per shape), so what XLA sees
is a plain expression graph it can fuse with its neighbours. Runtime layout is the NumPy
emitter's: a per-sample value is (*shape, *batch, n), a uniform one (*shape, *batch, 1), a weakly
typed one a Python number (or a weak JAX scalar), so dtypes follow NumPy's rules. Every result is
cast to the dtype the IR gives it, which is NumPy's by construction (hawk_fx/prims.py).

Importing this module turns on `jax_enable_x64`: float64 planes stay float64, as in NumPy.
"""
from __future__ import annotations

import numpy as np

from .. import prims, tables
from ..accurate import two_sum
from ..context import CONTEXT
from ..core import SAMPLE, Literal, RuleTable

JAX_EXTRA = "pip install 'eagle_fx[jax]'"


def require_jax(api: str):
    """The jax module, or an ImportError that names the extra to install."""
    try:
        import jax
    except ImportError as exc:
        raise ImportError(f"{api}: JAX arrays and backend='jax' need the `jax` extra ({JAX_EXTRA}); "
                          f"import failed: {exc}") from None
    if not jax.config.read("jax_enable_x64"):
        jax.config.update("jax_enable_x64", True)
    return jax


def is_jax_array(a) -> bool:
    """A jax.Array (or a tracer of one), told by its module so that jax need not be imported."""
    mod = type(a).__module__.split(".")[0]
    return mod in ("jax", "jaxlib") and hasattr(a, "shape") and hasattr(a, "dtype")


jax_rules = RuleTable("JAX lowering")    # prim -> fn(ctx, out_aval, *ins, **params) -> value
# prims with several results (a loop, hawk_fx/loops.py): fn(ctx, out_avals, *ins, **params) -> values;
# each also has its entry in jax_rules, which the checks of the tables look up
several_results = RuleTable("JAX lowering of several results")


class Ctx:
    """What a rule may need besides its operands: the sample count and the batch axes."""

    def __init__(self, n: int, batch: tuple = ()):
        self.n, self.batch = n, tuple(batch)


def _jnp():
    import jax.numpy as jnp
    return jnp


def _cast(out, aval):
    """`out` with the IR's dtype; a weakly typed value stays as JAX's weak rules made it."""
    if aval.weak or isinstance(out, (bool, int, float)):
        return out
    return out if out.dtype == aval.dtype else out.astype(aval.dtype)


def _rsqrt(x):
    jnp = _jnp()
    return 1 / jnp.sqrt(x)


def _erf(x):
    import jax.scipy.special as sp
    return sp.erf(x)


def _erfc(x):
    import jax.scipy.special as sp
    return sp.erfc(x)


def _logistic(x):
    jnp = _jnp()                     # 1 / (1 + exp(-x)) from exp(-|x|) only, as the NumPy rule
    x = jnp.asarray(x)
    if x.dtype.kind not in "fc":
        x = x.astype(np.float64)
    e = jnp.exp(-jnp.abs(x))
    return jnp.where(x >= 0, 1.0, e) / (1.0 + e)


def _xlogy(x, y):
    import jax.scipy.special as sp
    return sp.xlogy(x, y)


def _xlog1py(x, y):
    import jax.scipy.special as sp
    return sp.xlog1py(x, y)


def _stop_gradient(x):
    from jax import lax
    return lax.stop_gradient(x)


def _spacing(x):
    """numpy.spacing (jax.numpy has none): the step to the next float away from zero; at zero the
    smallest subnormal, selected (XLA on CPU flushes a subnormal difference to zero)."""
    jnp = _jnp()
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        x = x.astype(jnp.float64)
    step = jnp.nextafter(x, jnp.copysign(jnp.asarray(jnp.inf, x.dtype), x)) - x
    return jnp.where(x == 0, jnp.asarray(np.finfo(x.dtype).smallest_subnormal, x.dtype), step)


# name -> jax.numpy function name (or a function): the twin of prims.ELEMENTWISE_TABLE
_ELEMENTWISE = {
    "neg": "negative", "abs": "absolute", "sign": "sign", "floor": "floor", "ceil": "ceil", "round": "rint",
    "trunc": "trunc", "sqrt": "sqrt", "rsqrt": _rsqrt, "cbrt": "cbrt", "exp": "exp", "exp2": "exp2",
    "expm1": "expm1", "log": "log", "log2": "log2", "log10": "log10", "log1p": "log1p", "sin": "sin",
    "cos": "cos", "tan": "tan", "asin": "arcsin", "acos": "arccos", "atan": "arctan", "sinh": "sinh",
    "cosh": "cosh", "tanh": "tanh", "asinh": "arcsinh", "acosh": "arccosh", "atanh": "arctanh", "erf": _erf,
    "erfc": _erfc, "isfinite": "isfinite", "isnan": "isnan", "isinf": "isinf", "not": "logical_not",
    "add": "add", "sub": "subtract", "mul": "multiply", "div": "true_divide", "floordiv": "floor_divide",
    "mod": "remainder", "pow": "power", "atan2": "arctan2", "hypot": "hypot", "fmod": "fmod",
    "min": "minimum", "max": "maximum", "lt": "less", "le": "less_equal", "gt": "greater",
    "ge": "greater_equal", "eq": "equal", "ne": "not_equal", "and": "logical_and", "or": "logical_or",
    "select": "where", "logistic": _logistic, "logaddexp": "logaddexp", "xlogy": _xlogy, "xlog1py": _xlog1py,
    "stop_gradient": _stop_gradient,
    "copysign": "copysign", "spacing": _spacing,
}


def _elementwise_rule(fn):
    def rule(ctx, aval, *xs):
        f = getattr(_jnp(), fn) if isinstance(fn, str) else fn
        if fn in ("power",) and not aval.weak:      # NumPy computes in the result dtype (int ** int stays int)
            xs = [x if isinstance(x, (bool, int, float)) else x.astype(aval.dtype) for x in xs]
        return _cast(f(*xs), aval)
    return rule


for _name, _fn in _ELEMENTWISE.items():
    if _name in prims.P:
        jax_rules[prims.P[_name]] = _elementwise_rule(_fn)

jax_rules[prims.convert_p] = lambda ctx, aval, x, *, dtype: _jnp().asarray(x).astype(dtype)


def _compensated_sum(x):
    """The sum over the last axis as pairs (sum, carried error): XLA may combine the samples in
    any order, and each combination captures its rounding error exactly (two_sum), so the result
    is off by u|sum| + O(n^2 u^2) sum|x| at worst (Neumaier's bound), not by O(n u) sum|x|."""
    from jax import lax
    jnp = _jnp()

    def combine(p, q):
        s, e = two_sum(p[0], q[0])
        return s, p[1] + q[1] + e

    zero = jnp.zeros((), x.dtype)
    s, c = lax.reduce((x, jnp.zeros_like(x)), (zero, zero), combine, (x.ndim - 1,))
    return (s + c)[..., None]


def plain_sums():
    """Kernels traced inside sum with jnp.sum, not the compensated reduce: JAX can transpose a plain
    sum, and a tangent map must be transposable for reverse mode (eagle_fx.to_jax's tangent rule)."""
    return CONTEXT.enter(plain_sums=True)


def _reduction_rule(name):
    def rule(ctx, aval, x):
        jnp = _jnp()
        x = jnp.asarray(x)
        if x.ndim == 0:
            x = x.reshape(1)
        if name in ("sum", "mean") and jnp.issubdtype(x.dtype, jnp.floating) and not CONTEXT.plain_sums:
            total = _compensated_sum(x)
            return _cast(total if name == "sum" else total / x.shape[-1], aval)
        return _cast(getattr(jnp, name)(x, axis=-1, keepdims=True), aval)
    return rule


for _name, _np_name in (("sample_sum", "sum"), ("sample_max", "max"), ("sample_min", "min"),
                        ("sample_mean", "mean")):
    jax_rules[prims.P[_name]] = _reduction_rule(_np_name)


@jax_rules.register(prims.stack_p)
def _stack(ctx, aval, *xs):
    jnp = _jnp()
    out = jnp.stack(jnp.broadcast_arrays(*[jnp.asarray(x) for x in xs]))
    if out.ndim == len(aval.shape):     # of Python numbers only: a constant, (*shape, *batch, 1) as _literal's
        out = out.reshape(out.shape + (1,) * (len(ctx.batch) + 1))
    return _cast(out, aval)


@jax_rules.register(prims.einsum_p)
def _einsum(ctx, aval, *xs, spec):
    return _cast(_jnp().einsum(prims.sample_spec(spec), *xs), aval)


jax_rules[prims.cross_p] = lambda ctx, aval, a, b: _cast(_jnp().cross(a, b, axis=0), aval)
jax_rules[prims.index_p] = lambda ctx, aval, x, *, i: x[i]
jax_rules[prims.transpose_p] = lambda ctx, aval, x: _jnp().swapaxes(x, 0, 1)
jax_rules[prims.sample_count_p] = lambda ctx, aval, x: float(ctx.n)


@jax_rules.register(prims.broadcast_p)
def _broadcast(ctx, aval, x, *, shape, kind):
    if aval.weak and not shape:
        return x
    full = tuple(shape) + ctx.batch + ((ctx.n,) if kind == SAMPLE else (1,))
    return _jnp().broadcast_to(x, full)


def _literal(value, nbatch: int):
    """A constant: Python numbers as they are; a constant Vector/Matrix as (*shape, *batch, 1)."""
    if np.ndim(value):
        return np.asarray(value).reshape(np.shape(value) + (1,) * (nbatch + 1))
    return value


def eval_body(prog, ins, ctx: Ctx) -> list:
    """The body's outputs for operands in the runtime layout (the ~15-line interpreter)."""
    env = dict(zip(prog.inputs, ins))

    def read(a):
        return _literal(a.value, len(ctx.batch)) if isinstance(a, Literal) else env[a]

    for e in prog.eqns:
        if e.prim in several_results:    # a loop (hawk_fx/loops.py): a list of results
            env.update(zip(e.outputs, several_results[e.prim](ctx, [v.aval for v in e.outputs],
                                                              *[read(a) for a in e.inputs], **e.params)))
            continue
        env[e.outputs[0]] = jax_rules[e.prim](ctx, e.outputs[0].aval, *[read(a) for a in e.inputs], **e.params)
    return [read(a) for a in prog.outputs]


def run_call(spec, ins, n: int, batch: tuple = (), in_batched=None) -> list:
    """A call of a kernel specialisation on whole planes: its results, then the new values of its
    Mutable parameters, each with the plane shape the graph gives it. With `batch` (vmap), batched
    planes carry the batch axes first, (*batch, *shape, n), as graphs lay them out."""
    jnp = _jnp()
    nb = len(batch)
    prog = spec.prog
    args = []
    for k, (v, x) in enumerate(zip(prog.inputs, ins)):
        if not isinstance(x, (bool, int, float)):
            x = jnp.asarray(x)
            if v.aval.weak and x.ndim == 0:
                pass
            elif x.ndim == 0:
                x = x.reshape(v.aval.shape + (1,))
            if nb and x.ndim:
                if in_batched is not None and in_batched[k]:
                    x = jnp.moveaxis(x, tuple(range(nb)), tuple(range(x.ndim - 1 - nb, x.ndim - 1)))
                else:
                    x = jnp.expand_dims(x, tuple(range(x.ndim - 1, x.ndim - 1 + nb)))
        args.append(x)
    outs = eval_body(prog, args, Ctx(n, batch))
    kinds = list(spec.result_kinds) + [spec.layout[k][0] for k in spec.commits]
    result = []
    for a, kind, x in zip(prog.outputs, kinds, outs):
        shape = a.aval.shape + tuple(batch) + ((n,) if kind == SAMPLE else (1,))
        x = jnp.broadcast_to(jnp.asarray(x, dtype=a.aval.dtype), shape)
        if nb:
            x = jnp.moveaxis(x, tuple(range(len(a.aval.shape), len(a.aval.shape) + nb)), tuple(range(nb)))
        result.append(x)
    return result


def eager_call(spec, values, n: int):
    """A kernel called on jax.Arrays (or tracers): its results, traced into one jitted function per
    specialisation and n, so jax.grad, jax.vmap and jax.jit see ordinary JAX operations."""
    jax = require_jax(f"hawk.kernel {spec.kernel.name}")
    if spec.commits:
        names = ", ".join(repr(spec.kernel.param_names[k]) for k in spec.commits)
        raise TypeError(f"hawk.kernel {spec.kernel.name}: it writes its Mutable parameter(s) {names}, and a "
                        "jax.Array cannot be written in place; return the new value from the kernel instead, or "
                        "run it in a graph (eagle_fx.Graph(backend='jax')), which carries written arguments")
    cache = spec.__dict__.setdefault("_jax_calls", {})
    fn = cache.get(n)
    if fn is None:
        fn = cache[n] = jax.jit(lambda *xs: run_call(spec, xs, n)[:spec.n_results])
    return fn(*values)


# tables: gather and scatter_add, in the runtime layout (hawk_fx/tables.py says the modes)
@jax_rules.register(tables.gather_p)
def _gather(ctx, aval, x, i, *, mode, fill):
    jnp = _jnp()
    x = jnp.asarray(x)
    j, valid = tables.normalize(i, x.shape[0], mode, xp=jnp)
    if x.ndim == 2 and x.shape[1] == 1 and j.ndim == 1:
        out = x[:, 0].at[j].get(mode="promise_in_bounds")      # a 1-d table, one index per sample
    else:
        out = x[tables.scatter_index(x.shape, j, 0, xp=jnp)[0]]
    if valid is not None:
        fill = tables.default_fill(aval.dtype) if fill is None else fill
        out = jnp.where(tables._pad(valid, out.ndim, jnp), out, jnp.asarray(fill, aval.dtype))
    return _cast(out, aval)


@jax_rules.register(tables.scatter_add_p)
def _scatter_add(ctx, aval, sink, i, v, *, mode):
    jnp = _jnp()
    out = jnp.asarray(sink).astype(aval.dtype)
    if out.ndim == len(aval.shape):                 # a weak constant: (*shape, *batch, 1) as _literal's
        out = out.reshape(out.shape + (1,) * (len(ctx.batch) + 1))
    j, valid = tables.normalize(i, out.shape[0], mode, xp=jnp)
    v = jnp.asarray(v, aval.dtype)
    if valid is not None:
        v = jnp.where(tables._pad(valid, max(v.ndim, valid.ndim), jnp), v, 0)
    idx, cshape = tables.scatter_index(out.shape, j, v, xp=jnp)
    return out.at[idx].add(jnp.broadcast_to(v, cshape), mode="promise_in_bounds")
