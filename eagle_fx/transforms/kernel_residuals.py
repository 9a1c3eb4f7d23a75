"""A kernel call's forward keeps the costly values its backward would compute again.

A kernel's vjp body (hawk_fx.diff.vjp_spec) maps the kernel's inputs and output cotangents to
input cotangents; it recomputes what it needs of the forward: the vjp of sin(x) * x computes
sin(x) again, that of exp(-x * x) computes exp(-x * x) again. Partial evaluation of that body
against the kernel's own body: its equations that match the kernel's (same primitive, same
operands, found by value numbering) compute values the forward already has. Those of a costly
primitive (a transcendental function, a power, a root) become residuals: the forward call also
returns them (one more output of the same kernel body) and the backward reads them instead of
computing them. Cheap values (sums, products) are computed again, which costs less than a
round trip through memory. A kernel with nothing worth keeping, or that writes an argument in
place, keeps its plain vjp.
"""
from __future__ import annotations

from hawk_fx.core import SAMPLE, Literal, Program, Var
from hawk_fx.diff import vjp_spec
from hawk_fx.kernel import BodySpec

COSTLY = frozenset({
    "sqrt", "rsqrt", "cbrt", "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sin", "cos", "tan",
    "asin", "acos", "atan", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "erf", "erfc", "pow", "atan2",
    "hypot", "logistic", "logaddexp", "xlogy", "xlog1py"})


class Split:
    """forward: the kernel body returning its results, then the residuals; backward: (params...,
    residuals..., output cotangents...) -> the vjp's input cotangents; reads: which params it reads."""

    def __init__(self, forward, backward, n_results, n_residuals, reads):
        self.forward, self.backward = forward, backward
        self.n_results, self.n_residuals, self.reads = n_results, n_residuals, reads


def split_kernel(spec):
    """The Split of a call's spec, or None (cached on the spec)."""
    d = spec.__dict__
    if "_residual_split" not in d:
        d["_residual_split"] = _split(spec)
    return d["_residual_split"]


def _key(e, operand):
    try:
        params = tuple(sorted(e.params.items()))
        hash(params)
    except TypeError:
        return None
    ops = []
    for a in e.inputs:
        if isinstance(a, Literal):
            try:
                hash(a.value)
            except TypeError:
                return None
            ops.append(("literal", a.aval, a.value))
        else:
            ops.append(operand(a))
    return (e.prim, tuple(ops), params)


def _split(spec):
    if getattr(spec, "commits", None):
        return None
    p, v = spec.prog, vjp_spec(spec).prog
    k = len(p.inputs)
    same = dict(zip(v.inputs[:k], p.inputs))           # vjp body value -> the equal kernel body value
    made = {}
    for e in p.eqns:
        key = _key(e, lambda a: a)
        if key is not None:
            made.setdefault(key, e.outputs)
    kept = {}                                           # vjp body value -> kernel value, to read as residual
    for e in v.eqns:
        if not all(isinstance(a, Literal) or a in same for a in e.inputs):
            continue
        key = _key(e, lambda a: same[a])
        outs = made.get(key) if key is not None else None
        if outs is None:
            continue
        same.update(zip(e.outputs, outs))
        if e.prim.name in COSTLY:
            for o, q in zip(e.outputs, outs):
                if o.aval.kind == SAMPLE and not o.aval.weak and isinstance(q, Var):
                    kept[o] = q
    if not kept:
        return None
    inputs = {o: Var(o.aval) for o in kept}
    eqns = [e.replace(inputs=[inputs.get(a, a) if isinstance(a, Var) else a for a in e.inputs])
            for e in v.eqns if not any(o in kept for o in e.outputs)]
    outputs = [inputs.get(a, a) if isinstance(a, Var) else a for a in v.outputs]
    live = {a for a in outputs if isinstance(a, Var)}
    body = []
    for e in reversed(eqns):                            # drop what only the kept values needed
        if any(o in live for o in e.outputs):
            body.append(e)
            live.update(a for a in e.inputs if isinstance(a, Var))
    body.reverse()
    read = [o for o in kept if inputs[o] in live]
    if not read:
        return None
    backward = Program(list(v.inputs[:k]) + [inputs[o] for o in read] + list(v.inputs[k:]), body, outputs)
    forward = Program(list(p.inputs), list(p.eqns), list(p.outputs) + [kept[o] for o in read])
    reads = [x in live for x in v.inputs[:k]]
    return Split(BodySpec(forward, spec.kernel.name), BodySpec(backward, f"vjp({spec.kernel.name})"),
                 len(p.outputs), len(read), reads)
