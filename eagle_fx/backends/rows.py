"""The backends' rules for a loop's per-turn rows (ir.row_set / ir.row_get, eagle_fx.collect).

NumPy writes the row in place (`buf[..., turn, ...] = value`, nothing past the rows); JAX uses
`.at[turn].set(mode="drop")` and `take(mode="fill")`, the same contract; CUDA copies the row with
the kernels of the reverse's stacks (one launch each; under vmap refused for now).
"""
from __future__ import annotations

import numpy as np

from .. import ir
from hawk_fx.cuda_runtime import BLOCK, grid_for

from .cuda_lower import LOWERING, cuda_rules
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


def _cuda_rows(lw, e, buf):
    """(rows, items per row, a sink cell for the stack kernels' overflow): a turn past the rows is
    not kept (row_set) or reads zeros (row_get), so the overflow the stacks grow by is not raised."""
    if e.params["lead"]:
        raise NotImplementedError("eagle_fx CUDA lowering: eagle_fx.collect" +
                                  (f" ({e.info.where})" if e.info.where else "") + " under vmap (rows per "
                                  "instance) is not lowered to CUDA yet; run the graph on the NumPy or JAX backend")
    return int(buf.shape[0]), int(np.prod(buf.shape[1:], dtype=np.int64)), lw._zeros((1,), np.uint32)


def _cuda_row_set(lw, chain, e, outs):
    buf, turn, value = e.inputs
    dst = lw.slots[outs[0]]
    if lw.slot_of[buf] != outs[0]:                 # a functional row_set: the buffer copied first
        chain.memcpy(dst, lw.buf(buf), label="rows")
    rows, count, sink = _cuda_rows(lw, e, dst)
    args = [dst, lw.buf(value), lw.buf(turn, ir.U32_CELL), np.uint64(count), np.uint32(dst.dtype.itemsize),
            np.uint32(rows), sink]
    chain.kernel(LOWERING, "eagle_stack_push", grid_for(count), BLOCK, args, "stack", "row_set")


def _cuda_row_get(lw, chain, e, outs):
    src, out = lw.buf(e.inputs[0]), lw.slots[outs[0]]
    rows, count, sink = _cuda_rows(lw, e, src)
    chain.memset(out, 0, label="row")                # a turn past the rows reads zeros
    args = [out, src, lw.buf(e.inputs[1], ir.U32_CELL), np.uint64(count), np.uint32(src.dtype.itemsize),
            np.uint32(rows), sink]
    chain.kernel(LOWERING, "eagle_stack_read", grid_for(count), BLOCK, args, "stack", "row_get")


cuda_rules[ir.row_set_p] = _cuda_row_set
cuda_rules[ir.row_get_p] = _cuda_row_get
