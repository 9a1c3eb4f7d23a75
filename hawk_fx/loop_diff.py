"""Derivatives of the loop equation (hawk_fx/loops.py).

Forward mode runs the same loop, the tangents carried beside the values: the body's jvp is the
new body, so a sample's tangent stops when its value does. Reverse mode is a loop too: each
sample runs its own turns backwards, recomputing a turn's state from the initial one (no stored
states), so the cotangent is exactly the unrolled loop's and the backward stops per sample.
"""
from __future__ import annotations

import numpy as np

from . import prims
from .core import SAMPLE, AVal, Program, ProgramTrace
from .diff import _conform, _ct_aval, _dce, _is_float, jvp_program, jvp_rules, vjp_program, vjp_rules
from .loops import _inline, _typed, loop_p, retype

P = prims.P


@jvp_rules.register(loop_p)
def _loop_jvp(primals, tangents, outs, body, start, step, cap, n_carries):
    nc = n_carries
    carry_in = body.inputs[1:1 + nc]
    const_in = body.inputs[1 + nc:]
    t_consts = tangents[1 + nc:]
    flags_c = [_is_float(v.aval) for v in carry_in]
    flags_k = [t is not None and _is_float(v.aval) for v, t in zip(const_in, t_consts)]
    if not any(flags_k) and all(t is None for t in tangents[1:1 + nc]):
        return [None] * nc
    jb = jvp_program(body, [False] + flags_c + flags_k)
    n_in = len(body.inputs)
    t_ins = iter(jb.inputs[n_in:])
    tc = [next(t_ins) if f else None for f in flags_c]
    tk = [next(t_ins) if f else None for f in flags_k]
    n_out = len(body.outputs)
    new_c, brk, t_new = jb.outputs[:nc], jb.outputs[nc], jb.outputs[n_out:n_out + nc]
    carried = [j for j, f in enumerate(flags_c) if f]
    inputs = ([jb.inputs[0]] + list(jb.inputs[1:1 + nc]) + [tc[j] for j in carried]
              + list(jb.inputs[1 + nc:n_in]) + [t for t in tk if t is not None])
    outputs = list(new_c) + [t_new[j] for j in carried] + [brk]
    avals = ([v.aval for v in carry_in] + [_ct_aval(carry_in[j].aval) for j in carried] + [body.outputs[nc].aval])
    new_body = _dce(_conform(Program(inputs, jb.eqns, outputs), avals))
    active, inits = primals[0], primals[1:1 + nc]
    t_inits = [tangents[1 + j] if tangents[1 + j] is not None else np.zeros((), _ct_aval(carry_in[j].aval).dtype)
               for j in carried]
    consts = list(primals[1 + nc:])
    res = loop_p.bind(active, *inits, *t_inits, *consts, *[t for t, f in zip(t_consts, flags_k) if f],
                      body=new_body, start=start, step=step, cap=cap, n_carries=nc + len(carried))
    tans = [None] * nc
    for j, t in zip(carried, res[nc:]):
        tans[j] = t
    return tans


def _traced(in_avals, fn) -> Program:
    """A closed Program of fn(*input tracers) -> output values, traced on its own."""
    trace = ProgramTrace()
    ins = [trace.new_input(av) for av in in_avals]
    return _dce(trace.finish(fn(*ins)))


def _int_sample():
    return AVal((), np.int64, SAMPLE)


@vjp_rules.register(loop_p)
def _loop_vjp(cts, primals, outs, body, start, step, cap, n_carries):
    """The loop run backwards, each sample from its own last turn: turn t's state is recomputed
    from the initial one (an inner loop of t turns), then the body's vjp carries the cotangent
    one turn back. Exact as the unrolled loop's reverse is; the time is quadratic in a sample's
    turns, the memory that of one turn."""
    nc = n_carries
    carry_avals = [v.aval for v in body.inputs[1:1 + nc]]
    const_avals = [v.aval for v in body.inputs[1 + nc:]]
    fc = [j for j, a in enumerate(carry_avals) if _is_float(a)]
    fk = [j for j, a in enumerate(const_avals) if _is_float(a) and not a.weak]
    if not fc and not fk or all(cts[j] is None for j in fc):
        return [None] * len(primals)
    active, inits, consts = primals[0], list(primals[1:1 + nc]), list(primals[1 + nc:])
    turn_of = lambda u: u if (start, step) == (0, 1) else P["add"].bind(start, P["mul"].bind(u, step))

    # the turns each sample ran: the loop again, counting
    def counting(u, *xs):
        cs, cnt, ks = xs[:nc], xs[nc], xs[nc + 1:]
        new = _inline(body, [turn_of(u), *cs, *ks])
        return [*new[:nc], P["add"].bind(cnt, 1), new[nc]]
    turn_av = body.inputs[0].aval
    counted = _traced([turn_av, *carry_avals, _int_sample(), *const_avals], counting)
    res = loop_p.bind(active, *inits, 0, *consts, body=counted, start=0, step=1, cap=cap, n_carries=nc + 1)
    count = res[nc]

    # the body's vjp: (turn, carries, consts, cotangents of new carries and of the flag) -> cts
    # (a one-cell const retyped per sample: its cotangent is summed over the samples once, at the end)
    spread = [a.replace(kind=SAMPLE) if j in fk else a for j, a in enumerate(const_avals)]
    bvjp = vjp_program(retype(body, [body.inputs[0].aval, *carry_avals, *spread]),
                       [False] + [_is_float(a) for a in carry_avals] + [j in fk for j in range(len(const_avals))])
    ct_avals = [_ct_aval(carry_avals[j]) for j in fc]
    acc_avals = [_ct_aval(const_avals[j]).replace(kind=SAMPLE) for j in fk]

    def recompute(u, *xs):                # the state at the start of turn t: t turns from the start
        cs, t, ks = xs[:nc], xs[nc], xs[nc + 1:]
        new = _inline(body, [turn_of(u), *cs, *ks])
        return [*new[:nc], P["ge"].bind(P["add"].bind(u, 1), t)]
    inner = _traced([turn_av, *carry_avals, _int_sample(), *const_avals], recompute)

    def backward(r, *xs):
        ct_c, acc = xs[:len(fc)], xs[len(fc):len(fc) + len(fk)]
        cnt, x0, ks = xs[len(fc) + len(fk)], xs[len(fc) + len(fk) + 1:len(fc) + len(fk) + 1 + nc], \
            xs[len(fc) + len(fk) + 1 + nc:]
        t = P["sub"].bind(P["sub"].bind(cnt, 1), r)
        state = loop_p.bind(P["gt"].bind(t, 0), *x0, t, *ks, body=inner, start=0, step=1, cap=cap,
                            n_carries=nc)
        cts_new = [0.0] * nc
        for j, c in zip(fc, ct_c):
            cts_new[j] = c
        turn = turn_of(t)
        got = _inline(bvjp, [turn, *state, *ks, *cts_new, 0.0])
        g_c, g_k = got[:len(fc)], got[len(fc):]
        new_ct = [_typed(g, a) for g, a in zip(g_c, ct_avals)]
        new_acc = [_typed(P["add"].bind(a_, g), av) for a_, g, av in zip(acc, g_k, acc_avals)]
        return [*new_ct, *new_acc, P["le"].bind(t, 0)]
    back = _traced([turn_av, *ct_avals, *acc_avals, _int_sample(), *carry_avals, *const_avals], backward)
    seeds = [cts[j] if cts[j] is not None else 0.0 for j in fc]
    res = loop_p.bind(P["gt"].bind(count, 0), *seeds, *[0.0] * len(fk), count, *inits, *consts,
                      body=back, start=0, step=1, cap=cap, n_carries=len(fc) + len(fk))
    out = [None] * len(primals)
    for j, g in zip(fc, res[:len(fc)]):
        out[1 + j] = g
    for j, g in zip(fk, res[len(fc):]):
        out[1 + nc + j] = g
    return out
