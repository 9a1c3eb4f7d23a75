"""Analyses over Programs: node and stage counts, where a value's buffer comes from, which outputs
a sub-program writes straight into its caller's buffers."""
from __future__ import annotations

from hawk_fx.core import Program, Var

from .. import ir


def count_nodes(prog: Program) -> int:
    """Kernel and host nodes, counting those inside control flow once each."""
    n = 0
    for e in prog.eqns:
        if e.prim in (ir.call_p, ir.opaque_p):
            n += 1
        elif e.prim in ir.CONTROL:
            n += 1 + sum(count_nodes(p) for p in prog_params(e))
    return n


def prog_params(e):
    for v in e.params.values():
        if isinstance(v, Program):
            yield v
        elif isinstance(v, tuple):
            yield from (p for p in v if isinstance(p, Program))


def count_stages(prog: Program) -> int:
    """Levels of the top-level dependency graph: how many steps if every branch ran at once."""
    level: dict[Var, int] = {}
    last = 0
    for e in prog.eqns:
        if e.prim in (ir.cell_not_p, ir.cell_and_p, ir.cell_or_p):
            lv = max([level.get(a, 0) for a in e.inputs if isinstance(a, Var)] + [0])
        else:
            lv = 1 + max([level.get(a, 0) for a in e.inputs if isinstance(a, Var)] + [0])
        for v in e.outputs:
            level[v] = lv
        last = max(last, lv)
    return last


def _producers(prog: Program) -> dict:
    """Var -> (equation index, equation, output index) of the equation that makes it."""
    return {o: (i, e, j) for i, e in enumerate(prog.eqns) for j, o in enumerate(e.outputs)}


def buffer_root(prog: Program, v: Var, producers=None):
    """(Var, equation index) that made v's buffer, following `inplace` outputs back; (None, None)
    when the buffer is one of the program's inputs. A backend may place that Var straight into the
    buffer an output needs when nothing reads the buffer's old contents afterwards."""
    if producers is None:
        producers = _producers(prog)
    while True:
        if v not in producers:
            return None, None
        i, e, j = producers[v]
        src = dict(e.params.get("inplace", ()) or ()).get(j)
        if src is None:
            return v, i
        v = e.inputs[src]
        if not isinstance(v, Var):
            return None, None


def direct_outputs(sub: Program, out_slots, slot_of) -> dict:
    """{Var: slot}: the values of `sub` a backend may compute straight into the slot its output
    needs (no copy at the end), because nothing reads that slot's old contents afterwards."""
    producers = _producers(sub)
    last_read: dict = {}                  # Var -> the last equation that reads it
    for i, e in enumerate(sub.eqns):
        for a in e.inputs:
            if isinstance(a, Var):
                last_read[a] = i
    out_at: dict = {}                     # Var -> the output positions it takes
    for k, x in enumerate(sub.outputs):
        if isinstance(x, Var):
            out_at.setdefault(x, []).append(k)
    in_slot: dict = {}                    # slot -> the inputs bound to it
    for v in sub.inputs:
        in_slot.setdefault(slot_of.get(v), []).append(v)
    pre = {}
    for j, (o, s) in enumerate(zip(sub.outputs, out_slots)):
        if not isinstance(o, Var):
            continue
        root, at = buffer_root(sub, o, producers)
        if root is None or root in pre:
            continue
        # an input in slot s read after `at`, or handed back as another output, needs the old contents
        if not any(last_read.get(v, -1) > at or any(k != j for k in out_at.get(v, ())) for v in in_slot.get(s, ())):
            pre[root] = s
    return pre
