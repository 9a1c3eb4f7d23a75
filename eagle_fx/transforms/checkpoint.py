"""Binomial checkpointing: reversing a T-turn loop that keeps at most K of its states.

Reverse mode needs the state of every turn of a loop, last first. Saving all T costs T states;
keeping K (`checkpoints=K`) and recomputing the others from the nearest kept one costs turns run
again. Griewank and Walther's binomial schedule ("revolve") is the one that runs the fewest: with
K states kept (the loop's start among them), each turn is run forward again at most r times, r
the least number with C(K + r, K) >= T, and the total, r*T - C(K + r, r - 1), is the least any
schedule keeping K states runs.

The rule behind it: with c kept states (the one a stretch starts from included) and each turn
run again at most r times, at most beta(c, r) = C(c + r, c) turns can be reversed, and
beta(c, r) = beta(c, r - 1) + beta(c - 1, r): run from the kept state at t0 to a turn m and keep
that state too; reverse the turns after m with those c - 1 states, then the turns before m,
which have been run once more, with all c. The least total t(n, c) = r*n - beta(c + 1, r - 1)
grows by r(n + 1, c) from n to n + 1 turns, so the total of a split at offset l,
l + t(n - l, c - 1) + t(l, c), grows with l by 1 + r(l + 1, c) - r(n - l, c - 1): the best l is
the first where that is not negative (a binary search; checked against an exhaustive search in
the tests).

`run` drives a loop through the schedule with four callbacks; the NumPy backend generates them
for ir.revolve_p. `cost` counts the turns a schedule runs again, for the docs and the benchmark.
"""
from __future__ import annotations

from functools import lru_cache
from math import comb

from hawk_fx.caches import register_memo


def beta(c: int, r: int) -> int:
    """How many turns c kept states reverse with each turn run again at most r times."""
    return comb(c + r, c)


@register_memo
@lru_cache(maxsize=1 << 14)
def repetitions(T: int, K: int) -> int:
    """The most times a turn runs again when T turns are reversed keeping K states."""
    r = 0
    while beta(K, r) < T:
        r += 1
    return r


def split(n: int, c: int) -> int:
    """Where to keep the next state in a stretch of n > 1 turns with c > 1 states: its offset."""
    lo, hi = 1, n - 1
    while lo < hi:
        l = (lo + hi) // 2
        if 1 + repetitions(l + 1, c) - repetitions(n - l, c - 1) >= 0:
            hi = l
        else:
            lo = l + 1
    return lo


def run(T: int, K: int, advance, reverse, store, restore):
    """Reverse turns T-1 .. 0 of a loop. The working state holds the state at turn 0 on entry.

    advance(t): run turn t on the working state (state t -> state t + 1);
    reverse(t): the reverse step of turn t, from the working state (state t), leaving it unchanged;
    store(j) / restore(j): copy the working state into slot j < K, or back from it."""
    if T <= 0:
        return
    if K < 1:
        raise ValueError(f"checkpoints={K}: keep at least one state (the loop's start)")
    store(0)
    cur = [0]                      # the turn whose state the working state holds

    def bring(j, t0, t):
        """The working state at turn t, from slot j (state t0) or from where it is."""
        if not cur[0] <= t or cur[0] < t0:
            restore(j)
            cur[0] = t0
        for u in range(cur[0], t):
            advance(u)
        cur[0] = t

    def back(t0, t1, j):
        """Reverse turns t1-1 .. t0; slot j holds the state at t0, slots above j are free."""
        while t1 > t0:
            n, free = t1 - t0, K - 1 - j
            if n == 1 or free == 0:
                bring(j, t0, t1 - 1)
                reverse(t1 - 1)
                t1 -= 1
                continue
            m = t0 + split(n, free + 1)
            bring(j, t0, m)
            store(j + 1)
            back(m, t1, j + 1)
            t1 = m
    back(0, T, 0)


def cost(T: int, K: int) -> int:
    """The turns `run` runs forward again for T turns and K kept states (the reverse steps not counted)."""
    count = [0]
    run(T, K, lambda t: count.__setitem__(0, count[0] + 1), lambda t: None, lambda j: None, lambda j: None)
    return count[0]
