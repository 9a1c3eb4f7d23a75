"""custom: a call with its own derivative rules (eagle_fx.custom_vjp / custom_jvp of a kernel or block).

    outs = custom(*operands; fun, kind, name, wrt, fwd, bwd, n_out | jvp)

`fun` is the body (operands -> outs), what every backend runs (inlined before lowering). The
rules are sub-Programs over the same operands: custom_vjp: `fwd` (operands -> outs, residuals) and
`bwd` (operands, residuals, cotangents of outs -> a cotangent per differentiated argument leaf);
custom_jvp: `jvp` (operands, a tangent per argument leaf -> outs, their tangents); eagle_fx.fixed_point
has all three (its reverse and forward rules solve its linear systems). `wrt`: per
argument leaf of the custom function, the operand it is (None: not an array).
"""
from __future__ import annotations

from hawk_fx.core import Primitive, abstract_eval, pp_params_rules

custom_p = Primitive("custom", multiple_results=True)


@abstract_eval.register(custom_p)
def _custom_abstract(*avals, fun, **params):
    return list(fun.out_avals)


pp_params_rules[custom_p] = lambda params: {"kind": params["kind"], "fn": params["name"]}
