"""Derivatives of kernel bodies: jvp and vjp as Program -> Program interpreters.

Elementwise ops give their partial derivatives once (`PARTIALS`, as functions of the inputs and
the output); jvp sums partial * tangent, vjp multiplies partial * cotangent. Structural ops
(einsum, index, stack, transpose, cross, broadcast, reductions, casts) have their own rules.
A cotangent that reaches a value of a smaller shape or kind is summed back ("unbroadcast"): a
uniform input (a one-cell Param) receives the sum over samples.

    hawk_fx.diff.vjp(kernel, wrt=("x",))  -> a callable (args..., cotangents...) -> {name: gradient}
    hawk_fx.diff.jvp(kernel, wrt=("x",))  -> a callable (args..., tangents...) -> (outputs, tangents)
"""
from __future__ import annotations

import string

import numpy as np

from . import math as hm
from . import prims
from .core import SAMPLE, UNIFORM, AVal, Eqn, Literal, Program, ProgramTrace, RuleTable, Var, abstract_eval
from .emit.numpy import NumpyKernel
from .kernel import BodySpec
from .tables import gather_p, scatter_add_p
from .trace import KTracer, as_aval
from .tree import node_children, tree_flatten

P = prims.P
LN2, LN10 = float(np.log(2.0)), float(np.log(10.0))
TWO_OVER_SQRT_PI = float(2.0 / np.sqrt(np.pi))


def _w(c, a, b):
    return hm.where(c, a, b)


def _hypot_partials(a, b, y):
    """a / y and b / y; at (0, 0), 0.5 each: JAX's hypot orders its legs with max and min, whose tie
    splits the derivative."""
    at0 = y == 0
    safe = _w(at0, 1.0, y)
    return [_w(at0, 0.5, a / safe), _w(at0, 0.5, b / safe)]


def _logaddexp_partials(a, b, y):
    """exp(a - y) and exp(b - y), as JAX; where y is infinite (inf - inf is NaN), sigmoid(a - b) and
    sigmoid(b - a): softplus'(inf) is 1. (JAX gives 1 to a finite argument there; it is 0.)"""
    inf = hm.isinf(y)
    return [_w(inf, hm.sigmoid(a - b), hm.exp(a - y)), _w(inf, hm.sigmoid(b - a), hm.exp(b - y))]


# d(out)/d(input_i) as expressions of the inputs and the output; None: no derivative (zero).
# At special points, JAX's conventions: cbrt'(0) = inf, d/db pow(a, b) = NaN for a < 0, hypot above
PARTIALS = {
    "neg": lambda x, y: [-1.0], "abs": lambda x, y: [_w(x >= 0, 1.0, -1.0)], "sign": None, "floor": None, "ceil": None,
    "round": None, "trunc": None, "sqrt": lambda x, y: [0.5 / y], "rsqrt": lambda x, y: [-0.5 * y / x],
    "cbrt": lambda x, y: [(1.0 / 3.0) / (y * y)], "exp": lambda x, y: [y], "exp2": lambda x, y: [LN2 * y],
    "expm1": lambda x, y: [y + 1.0], "log": lambda x, y: [1.0 / x], "log2": lambda x, y: [1.0 / (LN2 * x)],
    "log10": lambda x, y: [1.0 / (LN10 * x)], "log1p": lambda x, y: [1.0 / (1.0 + x)],
    "sin": lambda x, y: [hm.cos(x)], "cos": lambda x, y: [-hm.sin(x)], "tan": lambda x, y: [1.0 + y * y],
    "asin": lambda x, y: [hm.rsqrt(1.0 - x * x)], "acos": lambda x, y: [-hm.rsqrt(1.0 - x * x)],
    "atan": lambda x, y: [1.0 / (1.0 + x * x)], "sinh": lambda x, y: [hm.cosh(x)], "cosh": lambda x, y: [hm.sinh(x)],
    "tanh": lambda x, y: [1.0 - y * y], "asinh": lambda x, y: [hm.rsqrt(x * x + 1.0)],
    "acosh": lambda x, y: [hm.rsqrt(x * x - 1.0)], "atanh": lambda x, y: [1.0 / (1.0 - x * x)],
    "erf": lambda x, y: [TWO_OVER_SQRT_PI * hm.exp(-x * x)], "erfc": lambda x, y: [-TWO_OVER_SQRT_PI * hm.exp(-x * x)],
    "isfinite": None, "isnan": None, "isinf": None, "not": None,
    "add": lambda a, b, y: [1.0, 1.0], "sub": lambda a, b, y: [1.0, -1.0], "mul": lambda a, b, y: [b, a],
    "div": lambda a, b, y: [1.0 / b, -y / b], "floordiv": None, "mod": lambda a, b, y: [1.0, -hm.floor(a / b)],
    "pow": lambda a, b, y: [b * hm.pow(a, b - 1.0), hm.log(_w(a == 0, 1.0, a)) * y],
    "atan2": lambda a, b, y: [b / (a * a + b * b), -a / (a * a + b * b)],
    "hypot": lambda a, b, y: _hypot_partials(a, b, y), "fmod": lambda a, b, y: [1.0, -hm.trunc(a / b)],
    # JAX's conventions at a kink: a tie of min/max splits the derivative 0.5/0.5; abs'(0) is 1
    "min": lambda a, b, y: [_w(a < b, 1.0, _w(a == b, 0.5, 0.0)), _w(b < a, 1.0, _w(a == b, 0.5, 0.0))],
    "max": lambda a, b, y: [_w(a > b, 1.0, _w(a == b, 0.5, 0.0)), _w(b > a, 1.0, _w(a == b, 0.5, 0.0))],
    "logistic": lambda x, y: [y * (1.0 - y)],
    "logaddexp": lambda a, b, y: _logaddexp_partials(a, b, y),
    "xlogy": lambda a, b, y: [hm.log(b), a / b], "xlog1py": lambda a, b, y: [hm.log1p(b), a / (1.0 + b)],
    "stop_gradient": None,
    "lt": None, "le": None, "gt": None, "ge": None, "eq": None, "ne": None, "and": None, "or": None,
    # copysign(x, y) is where(signbit(y), -abs(x), abs(x)) in JAX: abs'(0) = 1 there too; spacing is a step
    "copysign": lambda a, b, y: [_w(hm.copysign(1.0, b) < 0, -1.0, 1.0) * _w(a >= 0, 1.0, -1.0), None],
    "spacing": None,
}

jvp_rules = RuleTable("jvp")        # prim -> fn(primals, tangents (None = zero), outs, **params) -> tangents
vjp_rules = RuleTable("vjp")        # prim -> fn(cts_out, primals, outs, **params) -> cts_in (None = zero)


def _is_float(aval: AVal) -> bool:
    return aval.dtype.kind in "fc"


def _scale(p, t):
    if t is None or p is None:
        return None
    if isinstance(p, float) and p == 1.0:
        return t
    if isinstance(p, float) and p == -1.0:
        return -t
    return p * t


def _add(a, b):
    if a is None:
        return b
    if b is None:
        return a
    return a + b


def _elementwise_rules(name, partials):
    prim = P[name]
    if partials is None:
        jvp_rules[prim] = lambda primals, tangents, outs, **kw: [None]
        vjp_rules[prim] = lambda cts, primals, outs, **kw: [None] * len(primals)
        return

    def jvp(primals, tangents, outs, **kw):
        ps = partials(*primals, outs[0])
        t = None
        for p, ti in zip(ps, tangents):
            t = _add(t, _scale(p, ti))
        return [t]

    def vjp(cts, primals, outs, **kw):
        if cts[0] is None:
            return [None] * len(primals)
        return [_scale(p, cts[0]) for p in partials(*primals, outs[0])]

    jvp_rules[prim], vjp_rules[prim] = jvp, vjp


for _name, _partials in PARTIALS.items():
    _elementwise_rules(_name, _partials)


@jvp_rules.register(P["select"])
def _select_jvp(primals, tangents, outs):
    c, _, _ = primals
    _, ta, tb = tangents
    if ta is None and tb is None:
        return [None]
    return [hm.where(c, 0.0 if ta is None else ta, 0.0 if tb is None else tb)]


@vjp_rules.register(P["select"])
def _select_vjp(cts, primals, outs):
    c = primals[0]
    return [None, hm.where(c, cts[0], 0.0), hm.where(c, 0.0, cts[0])]


@jvp_rules.register(prims.convert_p)
def _convert_jvp(primals, tangents, outs, dtype):
    if tangents[0] is None or np.dtype(dtype).kind not in "fc" or not _is_float(_aval(primals[0])):
        return [None]
    return [P["convert"].bind(tangents[0], dtype=dtype)]


@vjp_rules.register(prims.convert_p)
def _convert_vjp(cts, primals, outs, dtype):
    src = _aval(primals[0])
    if cts[0] is None or np.dtype(dtype).kind not in "fc" or not _is_float(src):
        return [None]
    return [P["convert"].bind(cts[0], dtype=src.dtype)]


def _linear_jvp(prim):
    def rule(primals, tangents, outs, **params):
        if all(t is None for t in tangents):
            return [None]
        return [prim.bind(*[t if t is not None else 0.0 for t in tangents], **params)]
    return rule


for _p in (prims.transpose_p, prims.broadcast_p):
    jvp_rules[_p] = _linear_jvp(_p)
jvp_rules[prims.index_p] = _linear_jvp(prims.index_p)
jvp_rules[P["sample_sum"]] = _linear_jvp(P["sample_sum"])
jvp_rules[P["sample_mean"]] = _linear_jvp(P["sample_mean"])
jvp_rules[prims.sample_count_p] = lambda primals, tangents, outs: [None]     # n: no derivative
vjp_rules[prims.sample_count_p] = lambda cts, primals, outs: [None]


def _zero_like(x):
    """A zero of x's per-sample shape and kind, whatever x holds (0.0 * x is NaN where x is inf
    or NaN, and would spread to the components that do have a derivative)."""
    return hm.where(x == x, 0.0, 0.0)


@jvp_rules.register(prims.stack_p)
def _stack_jvp(primals, tangents, outs):
    if all(t is None for t in tangents):
        return [None]
    return [P["stack"].bind(*[t if t is not None else _zero_like(p) for t, p in zip(tangents, primals)])]


@vjp_rules.register(prims.stack_p)
def _stack_vjp(cts, primals, outs):
    return [P["index"].bind(cts[0], i=k) for k in range(len(primals))]


@vjp_rules.register(prims.index_p)
def _index_vjp(cts, primals, outs, i):
    x = primals[0]
    k = _aval(x).shape[0]
    zero = _zero_like(cts[0])
    return [P["stack"].bind(*[cts[0] if j == i % k else zero for j in range(k)])]


@vjp_rules.register(prims.transpose_p)
def _transpose_vjp(cts, primals, outs):
    return [P["transpose"].bind(cts[0])]


@vjp_rules.register(prims.broadcast_p)
def _broadcast_vjp(cts, primals, outs, shape, kind):
    return [cts[0]]        # unbroadcast (in the driver) sums it back to the input's shape and kind


@vjp_rules.register(P["sample_sum"])
def _sum_vjp(cts, primals, outs):
    return [cts[0]]        # a uniform cotangent broadcasts over the samples


@vjp_rules.register(P["sample_mean"])
def _mean_vjp(cts, primals, outs):
    return [cts[0] / P["sample_count"].bind(primals[0])]


def _extremum_rules(name):
    prim = P[name]

    def jvp(primals, tangents, outs):
        if tangents[0] is None:
            return [None]
        mask = hm.where(primals[0] == outs[0], 1.0, 0.0)
        return [P["sample_sum"].bind(mask * tangents[0]) / P["sample_sum"].bind(mask)]

    def vjp(cts, primals, outs):
        mask = hm.where(primals[0] == outs[0], 1.0, 0.0)
        return [cts[0] * mask / P["sample_sum"].bind(mask)]

    jvp_rules[prim], vjp_rules[prim] = jvp, vjp


_extremum_rules("sample_max")
_extremum_rules("sample_min")


@jvp_rules.register(prims.cross_p)
def _cross_jvp(primals, tangents, outs):
    a, b = primals
    ta, tb = tangents
    t = None
    if ta is not None:
        t = _add(t, hm.cross(ta, b))
    if tb is not None:
        t = _add(t, hm.cross(a, tb))
    return [t]


@vjp_rules.register(prims.cross_p)
def _cross_vjp(cts, primals, outs):
    a, b = primals
    return [hm.cross(b, cts[0]), hm.cross(cts[0], a)]


@jvp_rules.register(prims.einsum_p)
def _einsum_jvp(primals, tangents, outs, spec):
    t = None
    for k, tk in enumerate(tangents):
        if tk is not None:
            ops = list(primals)
            ops[k] = tk
            t = _add(t, P["einsum"].bind(*ops, spec=spec))
    return [t]


@vjp_rules.register(prims.einsum_p)
def _einsum_vjp(cts, primals, outs, spec):
    lhs, out = spec.replace(" ", "").split("->")
    terms = lhs.split(",")
    res = []
    for k, term in enumerate(terms):
        shape = _aval(primals[k]).shape
        fresh = iter(c for c in string.ascii_letters if c not in spec)
        target, extra_terms, extra_ops = "", [], []
        for c, d in zip(term, shape):
            if c in target:                       # a repeated index (a trace): its cotangent lies on a diagonal
                f = next(fresh)
                target += f
                extra_terms.append(c + f)
                extra_ops.append(Literal(np.eye(d)))
            else:
                target += c
        others = [(t, p) for j, (t, p) in enumerate(zip(terms, primals)) if j != k]
        known = set(out) | {c for t, _ in others for c in t} | {c for t in extra_terms for c in t}
        for c, d in zip(term, shape):
            if c not in known:                    # summed only within this operand: it broadcasts back
                extra_terms.append(c)
                extra_ops.append(Literal(np.ones(d)))
                known.add(c)
        ops_terms = [out] + [t for t, _ in others] + extra_terms
        ops = [cts[0]] + [p for _, p in others] + extra_ops
        res.append(_einsum_chain(",".join(ops_terms) + "->" + target, ops))
    return res


def _einsum_chain(spec, ops):
    consts = [o for o in ops if isinstance(o, Literal)]
    if not consts:
        return hm.einsum(spec, *ops)
    # constants (eye/ones) go in as uniform traced values
    trace = next(o.trace for o in ops if isinstance(o, KTracer))
    vals = [trace.const(o.value) if isinstance(o, Literal) else o for o in ops]
    return hm.einsum(spec, *vals)


def _aval(x) -> AVal:
    return as_aval(x)


# tables: gather's transpose is scatter_add into the table's cotangent, in the same mode (a fill-mode
# read from outside the table has none); scatter_add's is a gather of the cotangent (0 outside)
@jvp_rules.register(gather_p)
def _gather_jvp(primals, tangents, outs, mode, fill):
    if tangents[0] is None:
        return [None]
    return [gather_p.bind(tangents[0], primals[1], mode=mode, fill=0.0)]


@vjp_rules.register(gather_p)
def _gather_vjp(cts, primals, outs, mode, fill):
    return [scatter_add_p.bind(_zero_like(primals[0]), primals[1], cts[0], mode=mode), None]


@jvp_rules.register(scatter_add_p)
def _scatter_add_jvp(primals, tangents, outs, mode):
    sink, i, v = primals
    ts, _, tv = tangents
    if tv is None:
        return [ts]
    return [scatter_add_p.bind(_zero_like(sink) if ts is None else ts, i, tv, mode=mode)]


@vjp_rules.register(scatter_add_p)
def _scatter_add_vjp(cts, primals, outs, mode):
    return [cts[0], None, gather_p.bind(cts[0], primals[1], mode=mode, fill=0.0)]


# ---------------------------------------------------------------------------------------------
# the drivers

class _DiffTrace(ProgramTrace):
    tracer_type = KTracer

    def __init__(self):
        super().__init__()
        self.consts = []

    def const(self, value):
        """A constant array as a traced uniform value (added as a Literal-valued input)."""
        arr = np.asarray(value, dtype=np.float64)
        aval = AVal(arr.shape, arr.dtype, UNIFORM)
        return self.tracer_type(self, _ConstVar(aval, arr))


class _ConstVar(Var):
    __slots__ = ("value",)

    def __init__(self, aval, value):
        super().__init__(aval)
        self.value = value


def _unbroadcast(ct, aval: AVal):
    if ct is None:
        return None
    c_aval = _aval(ct)
    if aval.kind == SAMPLE and c_aval.kind == UNIFORM and _is_float(aval):
        # one value for every sample (a reduction's cotangent): spread, so a path from it to a
        # Param that meets no per-sample factor (hawk.sum(x + w)) still sums it over the samples
        ct = P["broadcast"].bind(ct, shape=aval.shape, kind=SAMPLE)
        c_aval = _aval(ct)
    if aval.kind == UNIFORM and c_aval.kind == SAMPLE:
        ct = P["sample_sum"].bind(ct)
        c_aval = _aval(ct)
    if c_aval.shape != aval.shape:
        letters = string.ascii_lowercase[:len(c_aval.shape)]
        lead = len(c_aval.shape) - len(aval.shape)
        keep = "".join(letters[lead + j] for j, d in enumerate(aval.shape) if d == c_aval.shape[lead + j])
        ct = hm.einsum(f"{letters}->{keep}", ct) if isinstance(ct, KTracer) else np.einsum(f"{letters}->{keep}", ct)
        if _aval(ct).shape != aval.shape:
            ct = P["broadcast"].bind(ct, shape=aval.shape, kind=_aval(ct).kind)
    if isinstance(ct, KTracer) and ct.aval.dtype != aval.dtype and _is_float(aval):
        ct = P["convert"].bind(ct, dtype=aval.dtype)
    return ct


def _eval_into(trace, prog, args):
    env = {}

    def read(a):
        if isinstance(a, Literal):
            return a.value
        return env[a]

    for v, x in zip(prog.inputs, args):
        env[v] = x
    for e in prog.eqns:
        outs = _rebind(trace, e, [read(a) for a in e.inputs])
        for v, x in zip(e.outputs, outs):
            env[v] = x
    return env, read


def _rebind(trace, e, ins) -> list:
    """e's primitive on these operands, in `trace`; one of no operands (sample_index) has no
    tracer to find its trace by, so it is recorded there directly."""
    if not e.inputs:
        return trace.process(e.prim, [], e.params)
    outs = e.prim.bind(*ins, **e.params)
    return outs if e.prim.multiple_results else [outs]


def _finish(trace: _DiffTrace, outputs) -> Program:
    prog = _dce(trace.finish(outputs))
    consts = {}
    for e in prog.eqns:
        for a in e.inputs:
            if isinstance(a, _ConstVar):
                consts[a] = Literal(a.value, a.aval)
    if not consts:
        return prog
    eqns = [e.replace(inputs=[consts.get(a, a) for a in e.inputs]) for e in prog.eqns]
    return prog.replace(eqns=eqns)


def _dce(prog: Program) -> Program:
    """Drop the equations no output depends on: the replayed forward a linear rule does not read,
    the cotangents of constants. Kernel primitives have no effects, so this changes no value."""
    live = {a for a in prog.outputs if isinstance(a, Var)}
    keep = []
    for e in reversed(prog.eqns):
        if any(v in live for v in e.outputs):
            keep.append(e)
            live.update(a for a in e.inputs if isinstance(a, Var))
    return prog if len(keep) == len(prog.eqns) else prog.replace(eqns=keep[::-1])


NONDIFF: set = set()     # prims that mark a parameter differentiation refuses (hawk_fx/rng_prims.py)


def refuse_nondiff(prog: Program, flagged) -> None:
    """Refuse, before any rule runs, a derivative that would pass through a NONDIFF mark (the
    parameter of a discrete draw): naming the draw and the user's line. Reverse mode would never
    reach the mark's rule (a draw's result carries no cotangent), so the check is by dependence."""
    live = {v for v, f in zip(prog.inputs, flagged) if f and _is_float(v.aval)}
    for e in prog.eqns:
        hit = [a for a in e.inputs if isinstance(a, Var) and a in live]
        if not hit:
            continue
        if e.prim in NONDIFF:
            at = f" at {e.info.where}" if e.info.where else ""
            api = e.params["api"]
            why = e.params.get("why") or "its result is discrete, so it has no derivative with respect to its parameters"
            raise TypeError(f"{api}{at}: {why}, and this derivative would pass through them. Wrap the parameter in "
                            f"hm.stop_gradient(...) to treat it as a constant, or differentiate with respect to "
                            f"other inputs (a score-function estimator needs the log-probability, which you can "
                            f"write in the kernel)")
        if e.prim is not P["stop_gradient"]:
            live.update(v for v in e.outputs if _is_float(v.aval))


def vjp_program(prog: Program, wrt) -> Program:
    """(inputs..., output cotangents...) -> cotangents of the inputs flagged in `wrt`."""
    refuse_nondiff(prog, wrt)
    trace = _DiffTrace()
    primals = [trace.new_input(v.aval, v.hint) for v in prog.inputs]
    cts_in = [trace.new_input(_ct_aval(a.aval)) for a in prog.outputs]
    env, read = _eval_into(trace, prog, primals)
    ct: dict = {}
    for a, c in zip(prog.outputs, cts_in):
        if isinstance(a, Var) and _is_float(a.aval):
            ct[a] = _add(ct.get(a), c)
    for e in reversed(prog.eqns):
        cts_out = [ct.pop(v, None) for v in e.outputs]
        if all(c is None for c in cts_out):
            continue
        ins = [read(a) for a in e.inputs]
        outs = [read(v) for v in e.outputs]
        for a, c in zip(e.inputs, vjp_rules[e.prim](cts_out, ins, outs, **e.params)):
            if c is not None and isinstance(a, Var) and _is_float(a.aval):
                ct[a] = _add(ct.get(a), _unbroadcast(c, a.aval))
    outs = []
    for v, w in zip(prog.inputs, wrt):
        if w:
            g = ct.get(v)
            outs.append(0.0 if g is None else g)
    return _finish(trace, outs)


def jvp_program(prog: Program, with_tangent) -> Program:
    """(inputs..., tangents of the flagged inputs...) -> (outputs..., output tangents...)."""
    refuse_nondiff(prog, with_tangent)
    trace = _DiffTrace()
    primals = [trace.new_input(v.aval, v.hint) for v in prog.inputs]
    tans = {v: trace.new_input(_ct_aval(v.aval)) for v, w in zip(prog.inputs, with_tangent) if w}
    env: dict = {}
    tenv: dict = dict(tans)

    def read(a):
        return a.value if isinstance(a, Literal) else env[a]

    for v, x in zip(prog.inputs, primals):
        env[v] = x
    for e in prog.eqns:
        ins = [read(a) for a in e.inputs]
        outs = _rebind(trace, e, ins)
        for v, x in zip(e.outputs, outs):
            env[v] = x
        ts = [tenv.get(a) if isinstance(a, Var) else None for a in e.inputs]
        if any(t is not None for t in ts):
            for v, t in zip(e.outputs, jvp_rules[e.prim](ins, ts, outs, **e.params)):
                if t is not None and _is_float(v.aval):
                    tenv[v] = t
    out_t = [tenv.get(a, 0.0) if isinstance(a, Var) else 0.0 for a in prog.outputs]
    return _finish(trace, [read(a) for a in prog.outputs] + out_t)


def _ct_aval(aval: AVal) -> AVal:
    dt = aval.dtype if _is_float(aval) else np.dtype(np.float64)
    return AVal(aval.shape, dt, aval.kind)


# ---------------------------------------------------------------------------------------------
# per-specialisation backward kernels (used by graph gradients) and the public kernel API

class KernelVJP:
    """The backward of one kernel Specialization: (param values, output cotangents) -> param cotangents."""

    def __init__(self, spec):
        self.spec = spec
        prog = spec.prog
        self.wrt = [_is_float(v.aval) and not v.aval.weak for v in prog.inputs]
        self.prog = vjp_program(prog, self.wrt)
        self.ct_avals = [_ct_aval(a.aval) for a in prog.outputs]
        self.in_avals = [v.aval for v, w in zip(prog.inputs, self.wrt) if w]
        kinds = [a.kind == SAMPLE for a in self.in_avals]
        self.compiled = NumpyKernel(self.prog, kinds)
        used = {a for e in self.prog.eqns for a in e.inputs if isinstance(a, Var)}
        used |= {a for a in self.prog.outputs if isinstance(a, Var)}
        k = len(prog.inputs)
        # the residuals: which parameter values the backward reads (a linear body reads none)
        self.reads = [v in used for v in self.prog.inputs[:k]]
        # an output that is an input cotangent as it is (the vjp of x + 1): returned without a copy
        ins = {v: j for j, v in enumerate(self.prog.inputs[k:])}
        self.passthrough = [ins.get(o) if isinstance(o, Var) and o.aval == a else None
                            for o, a in zip(self.prog.outputs, [_ct_aval(a) for a in self.in_avals])]
        self._zeros: dict = {}

    def _zero(self, j, n):
        z = self._zeros.get((j, n))
        if z is None:
            a = self.ct_avals[j]
            z = self._zeros[(j, n)] = np.zeros(a.shape + ((n,) if a.kind == SAMPLE else (1,)), a.dtype)
            z.flags.writeable = False
        return z

    def __call__(self, values, cts, n):
        """values: per param (arrays / numbers); cts: per output (array or None)."""
        cts = [self._zero(j, n) if c is None else c for j, c in enumerate(cts)]
        if all(p is not None for p in self.passthrough):
            outs = [cts[p] for p in self.passthrough]
        else:
            outs = [np.empty(a.shape + ((n,) if a.kind == SAMPLE else (1,)), a.dtype) for a in self.in_avals]
            self.compiled(list(values) + cts, outs, n)
        it = iter(outs)
        return [next(it) if w else None for w in self.wrt]


def match_tree(value, tree):
    """The leaves of `value` in the order of TreeDef `tree` (a dict matches by its keys, in any
    order), or None when the structures differ."""
    leaves = []

    def go(v, t):
        if t.kind == "leaf":
            leaves.append(v)
            return node_children(v) is None
        if t.kind == "none":
            return v is None
        if t.kind == "dict":
            return (isinstance(v, dict) and set(v) == set(t.meta)
                    and all(go(v[k], c) for k, c in zip(t.meta, t.children)))
        node = node_children(v)
        return (node is not None and node[0] == t.kind and node[1] == t.meta and len(node[2]) == len(t.children)
                and all(go(x, c) for x, c in zip(node[2], t.children)))

    return leaves if go(value, tree) else None


def kernel_vjp(spec) -> KernelVJP:
    vjp = getattr(spec, "_vjp", None)
    if vjp is None:
        vjp = spec._vjp = KernelVJP(spec)
    return vjp


def vjp(kernel, wrt=None):
    """The reverse derivative of `kernel`: f(*args, cotangent) -> {param name: gradient}.

    The cotangent has the shape of the kernel's returned tree (or, for a kernel with no return,
    a dict {mutable name: cotangent of its final value})."""
    names = kernel.param_names
    wrt = tuple(names if wrt is None else ([wrt] if isinstance(wrt, str) else wrt))
    for w in wrt:
        if w not in names:
            raise KeyError(f"hawk.diff.vjp: {w!r} is not a parameter of {kernel.name} ({', '.join(names)})")

    def f(*args, cotangent):
        values = kernel.bind_arguments(args, {})
        # a Python float to differentiate is a one-cell array: as a weak constant it would get none
        promoted = {k for k, (nm, v) in enumerate(zip(names, values)) if nm in wrt and type(v) is float}
        if promoted:                # weakly typed, as in JAX: the floating dtype of the array arguments
            floats = [np.asarray(v).dtype for v in values if isinstance(v, np.ndarray) and v.dtype.kind == "f"]
            weak = np.result_type(*floats) if floats else np.float64
            values = [np.array([v], weak) if k in promoted else v for k, v in enumerate(values)]
        layout, n = kernel.layout_of(values)
        spec = kernel.specialize(layout)
        leaves = match_tree(cotangent, spec.tree)      # dicts by key: their order is not the return's
        if leaves is not None:
            leaves += [None] * len(spec.commits)
        elif isinstance(cotangent, dict) and not spec.n_results:
            leaves = [cotangent.get(names[k]) for k in spec.commits]
        else:
            leaves, _ = tree_flatten(cotangent)      # results and Mutables, flat
            if not spec.commits or len(leaves) != len(spec.prog.outputs):
                raise ValueError(f"hawk.diff.vjp: {kernel.name} returns {spec.tree} ({len(spec.prog.outputs)} "
                                 f"output(s) with its Mutables); the cotangent tree has {len(leaves)} leaves")
        cts = kernel_vjp(spec)([np.asarray(v) if isinstance(v, np.ndarray) else v for v in values],
                               [None if c is None else np.asarray(c) for c in leaves], n)
        out = {}
        for k, (name, g, v) in enumerate(zip(names, cts, values)):
            if name in wrt:
                # a copy: a passed-through gradient is the caller's cotangent array itself
                out[name] = np.zeros(np.shape(v)) if g is None else (np.array(g).reshape(np.shape(v)) if np.ndim(v) else g.sum())
                if k in promoted:
                    out[name] = np.asarray(out[name]).reshape(())          # a float's gradient: 0-d, as in JAX
        return out
    return f


def jvp(kernel, wrt=None):
    """The forward derivative of `kernel`: f(*args, tangents={name: tangent}) -> (outputs, output tangents)."""
    names = kernel.param_names
    wrt = tuple(names if wrt is None else ([wrt] if isinstance(wrt, str) else wrt))

    def f(*args, tangents):
        values = kernel.bind_arguments(args, {})
        layout, n = kernel.layout_of(values)
        spec = kernel.specialize(layout)
        flags = [nm in wrt and nm in tangents and _is_float(v.aval) for nm, v in zip(names, spec.prog.inputs)]
        prog = jvp_program(spec.prog, flags)
        k = len(spec.prog.outputs)
        # a tangent has its output's shape and kind, even where it is a (uniform) zero
        outs_avals = [a.aval for a in prog.outputs[:k]] + [_ct_aval(a.aval) for a in spec.prog.outputs]
        kinds = [a.kind == SAMPLE for a in outs_avals]
        compiled = NumpyKernel(prog, kinds)
        tans = [np.asarray(tangents[nm], dtype=_ct_aval(v.aval).dtype) for nm, v, fl in zip(names, spec.prog.inputs, flags) if fl]
        outs = [np.empty(a.shape + ((n,) if a.kind == SAMPLE else (1,)), a.dtype) for a in outs_avals]
        compiled(list(values) + tans, outs, n)
        return outs[:k], outs[k:]
    return f


class KernelJVP:
    """The forward derivative of one kernel Specialization: (param values, param tangents) -> output tangents."""

    def __init__(self, spec):
        self.spec = spec
        prog = spec.prog
        self.flags = [_is_float(v.aval) and not v.aval.weak for v in prog.inputs]
        self.prog = jvp_program(prog, self.flags)
        self.t_avals = [_ct_aval(v.aval) for v, f in zip(prog.inputs, self.flags) if f]
        self.out_avals = [a.aval for a in self.prog.outputs]
        self.compiled = NumpyKernel(self.prog, [a.kind == SAMPLE for a in self.out_avals])
        self.n_primal = len(prog.outputs)

    def __call__(self, values, tangents, n):
        """tangents: per param (array or None); returns the tangent of each output."""
        ts = []
        for t, f, v in zip(tangents, self.flags, self.spec.prog.inputs):
            if f:
                a = _ct_aval(v.aval)
                ts.append(np.zeros(a.shape + ((n,) if a.kind == SAMPLE else (1,)), a.dtype) if t is None else t)
        outs = [np.empty(a.shape + ((n,) if a.kind == SAMPLE else (1,)), a.dtype) for a in self.out_avals]
        self.compiled(list(values) + ts, outs, n)
        return outs[self.n_primal:]


def kernel_jvp(spec) -> KernelJVP:
    jvp_ = getattr(spec, "_jvp", None)
    if jvp_ is None:
        jvp_ = spec._jvp = KernelJVP(spec)
    return jvp_


# ---------------------------------------------------------------------------------------------
# derivative bodies as call specs, for graph transforms that emit them as equations

def _conform(prog: Program, avals) -> Program:
    """`prog` with each output given exactly `avals[j]`: a literal zero or a uniform tangent becomes
    a broadcast, a weak or other dtype a cast. A call's output buffers have these shapes."""
    eqns, outs = list(prog.eqns), []
    for a, want in zip(prog.outputs, avals):
        for prim, params, bad in ((prims.broadcast_p, {"shape": want.shape, "kind": want.kind},
                                   lambda av: isinstance(a, Literal) or (av.shape, av.kind) != (want.shape, want.kind)),
                                  (prims.convert_p, {"dtype": want.dtype}, lambda av: av.dtype != want.dtype or av.weak)):
            if bad(a.aval):
                v = Var(abstract_eval[prim](a.aval, **params)[0])
                eqns.append(Eqn(prim, [a], [v], params))
                a = v
        outs.append(a)
    return prog.replace(eqns=eqns, outputs=outs)


def jvp_spec(spec, flags):
    """The call body (params..., tangents of the flagged params...) -> (outputs..., a tangent per
    output), for the kernel Specialization (or BodySpec) `spec`."""
    cache = spec.__dict__.setdefault("_jvp_specs", {})
    key = tuple(bool(f) for f in flags)
    if key not in cache:
        outs = [a.aval for a in spec.prog.outputs]
        prog = _conform(jvp_program(spec.prog, key), outs + [_ct_aval(a) for a in outs])
        cache[key] = BodySpec(prog, f"jvp({spec.kernel.name})")
    return cache[key]


def vjp_spec(spec):
    """The call body (params..., a cotangent per output...) -> a cotangent per differentiable
    param (those `kernel_vjp(spec).wrt` flags), for `spec`."""
    body = spec.__dict__.get("_vjp_spec")
    if body is None:
        vjp_ = kernel_vjp(spec)
        prog = _conform(vjp_.prog, [_ct_aval(a) for a in vjp_.in_avals])
        body = spec._vjp_spec = BodySpec(prog, f"vjp({spec.kernel.name})")
    return body


from . import loop_diff  # noqa: E402,F401  (the loop equation's derivative rules)
