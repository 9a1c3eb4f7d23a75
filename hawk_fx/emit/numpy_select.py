"""A per-sample `select(c, a, b)` in NumPy as bit operations: `a ^ ((a ^ b) & ~mask)`.

`np.copyto(out, a, where=c)` branches on every element: where the mark `c` is set at random
samples (the done marks of a run whose samples stop at different steps) it costs ten times a plain
copy, and a kernel with a done mark selects once per Mutable. The bit form reads the same bits
whatever the mark: the cleared mark becomes an integer mask of the values' width (all ones where
`c` is clear), made once per mark and width in a body, and each select is then three integer
ufuncs over views of the values, written over the new value `b` where nothing reads it after
(the Terminated gate's `select(done, old, new)`). It moves bits, so it gives exactly what
np.where gives (NaNs and signed zeros included).
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


def select_in_place(e, idx, scratch_of, last_use, root) -> bool:
    """Whether the bit select `e` (equation idx) may write over its new value `b`: b is scratch of
    the result's shape that nothing reads after, and not the old value `a` itself."""
    if e.prim.name != "select" or bit_select_width(e) is None:
        return False
    _, a, b = e.inputs
    return (b in scratch_of and b not in root and last_use.get(b) == idx and root.get(a, a) is not b
            and b.aval.shape == e.outputs[0].aval.shape)


def bit_select_lines(ctx, out, ins, idt, keep) -> list[str]:
    """The lines writing select(c, a, b) into `out` (fresh scratch, or b's own) through `keep`,
    the local name of the cleared mark's integer mask (made by mask_line)."""
    _, a, b = ins
    t = ctx.const(idt, "idt")
    o, w = "sel_out", "sel_a"                # locals, assigned here and read only by these lines
    return [f"{o} = {out}.view({t}); {w} = {a}.view({t})",
            f"np.bitwise_xor({w}, {b}.view({t}), out={o})",
            f"np.bitwise_and({o}, {keep}, out={o})",
            f"np.bitwise_xor({o}, {w}, out={o})"]


def mask_line(ctx, cond, scratch, idt, name) -> str:
    """`name` = c - 1 in the integer width: all ones (-1) where the bool mark is clear, else 0,
    in `scratch` (of the values' width) seen as integers."""
    t = ctx.const(idt, "idt")
    return f"{name} = {scratch}.view({t}); np.subtract({cond}.view(np.int8), 1, out={name})"


__all__ = ["bit_select_width", "select_in_place", "bit_select_lines", "mask_line"]
