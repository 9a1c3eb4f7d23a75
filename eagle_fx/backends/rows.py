"""The backends' rules for a loop's per-turn rows (ir.row_set / ir.row_get, eagle_fx.collect).

NumPy writes the row in place (`buf[..., turn, ...] = value`, nothing past the rows); JAX uses
`.at[turn].set(mode="drop")` and `take(mode="fill")`, the same contract; the CUDA lowering
refuses them (documented below).
"""
from __future__ import annotations

import numpy as np

from .. import ir
from .cuda_lower import cuda_rules
from .jax_lower import _jnp, fit, graph_rules
from .numpy import numpy_rules


def _row_index(lead, turn):
    return "".join(":, " for _ in range(lead)) + turn


@numpy_rules.register(ir.row_set_p)
def _numpy_row_set(exe, g, d, e, outs):
    buf, turn, value = (exe.b(a) for a in e.inputs)
    lead = e.params["lead"]
    rows = e.inputs[0].aval.shape[lead]
    if not e.params.get("inplace"):
        g.emit(d, f"np.copyto(b{outs[0]}, {buf})")
    t = f"int({turn}[0])"
    g.emit(d, f"if {t} < {rows}: b{outs[0]}[{_row_index(lead, t)}] = {value}")


@numpy_rules.register(ir.row_get_p)
def _numpy_row_get(exe, g, d, e, outs):
    buf, turn = exe.b(e.inputs[0]), exe.b(e.inputs[1])
    lead = e.params["lead"]
    rows = e.inputs[0].aval.shape[lead]
    t = f"int({turn}[0])"
    g.emit(d, f"np.copyto(b{outs[0]}, {buf}[{_row_index(lead, t)}]) if {t} < {rows} else b{outs[0]}.fill(0)")


@graph_rules.register(ir.row_set_p)
def _jax_row_set(lw, e, ins):
    jnp = _jnp()
    buf, turn, value = jnp.asarray(ins[0]), jnp.asarray(ins[1]), ins[2]
    i = turn.reshape(-1)[0].astype(np.int64)
    index = (slice(None),) * e.params["lead"] + (i,)
    return [buf.at[index].set(jnp.asarray(value, buf.dtype), mode="drop")]


@graph_rules.register(ir.row_get_p)
def _jax_row_get(lw, e, ins):
    jnp = _jnp()
    buf, turn = jnp.asarray(ins[0]), jnp.asarray(ins[1])
    i = turn.reshape(-1)[0].astype(np.int64)
    return [fit(jnp.take(buf, i, axis=e.params["lead"], mode="fill", fill_value=0), e.outputs[0].aval)]


@cuda_rules.refuse(ir.row_set_p, ir.row_get_p)
def _cuda_rows(lw, chain, e, outs):
    """The rows of eagle_fx.collect (a buffer written at the loop's turn counter) are not lowered to
    CUDA yet: the lowering writes planes through kernels whose targets are fixed when the graph is
    captured, and a row chosen by a device cell needs a kernel of its own. NumPy and JAX run them."""
    raise NotImplementedError("eagle_fx CUDA lowering: eagle_fx.collect" +
                              (f" ({e.info.where})" if e.info.where else "") + " writes a loop's per-turn rows, "
                              "which the CUDA lowering does not do yet; run the graph on the NumPy or JAX backend")
