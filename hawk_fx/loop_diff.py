"""Derivatives of the loop equation (hawk_fx/loops.py).

Forward mode runs the same loop, the tangents carried beside the values: the body's jvp is the
new body, so a sample's tangent stops when its value does. Reverse mode differentiates the loop
unrolled and masked (loops.expand_loops, called by diff.vjp_program): exact as the unrolled
computation is, every turn recomputed for every sample in the backward body.
"""
from __future__ import annotations

import numpy as np

from .core import Program
from .diff import _conform, _ct_aval, _dce, _is_float, jvp_program, jvp_rules, vjp_rules
from .loops import loop_p


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


@vjp_rules.refuse(loop_p)
def _loop_vjp(cts, primals, outs, **params):
    """Reverse mode differentiates a loop unrolled (loops.expand_loops, in diff.vjp_program), so
    this rule is never reached."""
    raise NotImplementedError("a loop equation reached the vjp rules unexpanded")
