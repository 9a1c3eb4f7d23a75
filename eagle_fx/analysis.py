"""Analyses over staged graphs: branch hazards at a join, and the stage count of a Program."""
from __future__ import annotations

import numpy as np

from hawk_fx.core import Program, Var

from . import ir


def _same_memory(k1, k2) -> bool:
    if k1 is k2:
        return True
    a1, a2 = getattr(k1, "array", None), getattr(k2, "array", None)
    return a1 is not None and a2 is not None and np.shares_memory(a1, a2)


def _ordered(first, second, waits, depth) -> bool:
    """Is `first` ordered before `second` by a wait issued in second's branch before second ran?"""
    top_first = first.branch[:depth + 1]
    for w in waits:
        if (second.branch[:len(w.branch)] == w.branch and len(w.branch) > depth and w.seq_at <= second.seq
                and w.writer.branch[:depth + 1] == top_first and first.seq <= w.writer.seq):
            return True
    return False


def check_fork_hazards(trace, fork_id, depth) -> None:
    """Refuse two sibling branches that touch one plane where one writes, unless a wait orders them."""
    inside = [a for a in trace.accesses if len(a.branch) > depth and a.branch[depth][0] == fork_id]
    for j, b in enumerate(inside):
        for a in inside[:j]:
            if a.branch[depth] == b.branch[depth]:
                continue
            found = _conflict(a, b)
            if found is None or _ordered(a, b, trace.waits, depth):
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
