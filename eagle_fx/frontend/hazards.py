"""Branch hazards at a join: two sibling branches of a parallel region that touch one plane where
one writes are refused, unless a wait orders them. Read from the trace's accesses while staging."""
from __future__ import annotations

import numpy as np

from .views import footprint


def _same_memory(k1, k2) -> bool:
    """Do two planes share memory? A view (eagle_fx/frontend/views.py) touches the part of its root it selects."""
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
