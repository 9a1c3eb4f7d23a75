"""Analyses over staged graphs: branch hazards at a join, and the stage count of a Program."""
from __future__ import annotations

import numpy as np

from hawk_fx.core import Program, Var

from . import ir
from .views import footprint


def _same_memory(k1, k2) -> bool:
    """Do two planes share memory? A view (eagle_fx/views.py) touches the part of its root it selects."""
    (r1, m1), (r2, m2) = footprint(k1), footprint(k2)
    if r1 is r2:
        return m1 is None or m2 is None or bool((m1 & m2).any())
    k1, k2 = r1, r2
    a1, a2 = getattr(k1, "array", None), getattr(k2, "array", None)
    return a1 is not None and a2 is not None and np.shares_memory(a1, a2)


def _in_order(x, y) -> bool:
    """Program order: x is staged before y and runs before it: in one branch, in a branch enclosing
    the other's, or in a fork that joined before y's fork opened (not in sibling branches)."""
    if x.seq >= y.seq:
        return False
    for (fork_x, bx), (fork_y, by) in zip(x.branch, y.branch):
        if fork_x != fork_y:
            return True          # two forks, one after the other
        if bx != by:
            return False         # sibling branches of one fork
    return True


def _ordered(first, second, trace) -> bool:
    """Does `first` happen before `second`? Program order, and waits: a wait orders the node that
    wrote its plane before what its branch runs after it; chained, so a branch that waits for a
    branch that waited for `first` is ordered after `first` too."""
    todo, seen = [second], {id(second)}
    while todo:
        y = todo.pop()
        if y is first or _in_order(first, y):
            return True
        preds = [w.writer for w in trace.waits if y.branch[:len(w.branch)] == w.branch and w.seq_at <= y.seq]
        preds += [x for x in trace.accesses if _in_order(x, y)]
        for x in preds:
            if id(x) not in seen:
                seen.add(id(x))
                todo.append(x)
    return False


def check_fork_hazards(trace, fork_id, depth) -> None:
    """Refuse two sibling branches that touch one plane where one writes, unless a wait orders them."""
    inside = [a for a in trace.accesses if len(a.branch) > depth and a.branch[depth][0] == fork_id]
    for j, b in enumerate(inside):
        for a in inside[:j]:
            if a.branch[depth] == b.branch[depth]:
                continue
            found = _conflict(a, b)
            if found is None or _ordered(a, b, trace):
                continue
            kind, pa, pb = found
            na, nb = a.info.name or a.what or "?", b.info.name or b.what or "?"
            raise ValueError(
                "eagle.Graph.build: two branches of one parallel region touch one plane and one writes it: "
                "put them in one branch, or order them with <branch>.wait(plane) "
                f"[{a.describe()} and {b.describe()} are in sibling branches but overlap ({kind}): "
                f"{na!r} plane {pa!r} and {nb!r} plane {pb!r} share memory; give each branch its own planes "
                f"or make the later branch wait for {na!r}]")


def _conflict(a, b):
    for kind, xs, ys in (("RAW", a.writes, b.reads), ("WAR", a.reads, b.writes), ("WAW", a.writes, b.writes)):
        for kx, nx in xs:
            for ky, ny in ys:
                if _same_memory(kx, ky):
                    return kind, nx, ny
    return None


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
