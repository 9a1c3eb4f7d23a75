"""A per-sample `select(c, a, b)` in NumPy as bit operations: `b ^ ((a ^ b) & mask)`.

`np.copyto(out, a, where=c)` branches on every element: where the mark `c` is set at random
samples (the done marks of a run whose samples stop at different steps) it costs ten times a plain
copy, and a kernel with a done mark selects once per Mutable. The bit form reads the same bits
whatever the mark: the mark becomes an integer mask of the values' width (all ones where set),
made once per mark and width in a body, and each select is then three integer ufuncs over
views of the values. It moves bits, so it gives exactly what np.where gives (NaNs and signed
zeros included).
"""
from __future__ import annotations

import numpy as np

from ..core import SAMPLE, Var

_INT_OF_SIZE = {1: np.dtype(np.int8), 2: np.dtype(np.int16), 4: np.dtype(np.int32), 8: np.dtype(np.int64)}


def bit_select_width(e):
    """The integer dtype the select `e` runs in as bits, or None where it keeps the plain form: a
    bool mark per sample choosing between two per-sample values of the result's dtype."""
    c, a, b = e.inputs
    v = e.outputs[0]
    if not all(isinstance(x, Var) and x.aval.kind == SAMPLE for x in (c, a, b)):
        return None
    if c.aval.dtype != np.bool_ or c.aval.shape or a.aval.weak or b.aval.weak:
        return None
    dt = np.dtype(v.aval.dtype)
    if a.aval.dtype != dt or b.aval.dtype != dt or dt.kind not in "biuf":
        return None
    return _INT_OF_SIZE.get(dt.itemsize)


def bit_select_lines(ctx, out, ins, idt, mask) -> list[str]:
    """The lines writing select(c, a, b) into `out` (scratch of its own: neither a nor b) through
    `mask`, the name of the mark's integer mask (made by mask_line)."""
    _, a, b = ins
    t = ctx.const(idt, "idt")
    o, w = "sel_out", "sel_b"                # locals, assigned here and read only by these lines
    return [f"{o} = {out}.view({t}); {w} = {b}.view({t})",
            f"np.bitwise_xor({a}.view({t}), {w}, out={o})",
            f"np.bitwise_and({o}, {mask}, out={o})",
            f"np.bitwise_xor({o}, {w}, out={o})"]


def mask_line(cond, mask) -> str:
    """mask = -c: all ones (-1) where the bool mark is set, else 0."""
    return f"np.negative({cond}.view(np.int8), out={mask})"


__all__ = ["bit_select_width", "bit_select_lines", "mask_line"]
