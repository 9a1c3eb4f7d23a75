"""The memory planner the NumPy and CUDA backends share: slots, reuse by liveness, one walk.

A lowering gives every Var a slot (an index into `slots`, the arrays it runs on). Top-level
temporaries come from a pool keyed by (shape, dtype): a slot goes back to the pool once the last
reader of the value it holds has been generated, unless the value is kept (a result, a buffer a
user holds, what a recorded reverse reads). Values inside arms and loop bodies get slots of their
own (`sub_slot`): a body runs many times, and its temporaries must not alias the outer ones.
"""
from __future__ import annotations

import numpy as np

from hawk_fx.core import Var


class SlotPlanner:
    """Mixin for a lowering. The lowering sets `slots` (list), `slot_of` (Var -> slot), `keep`
    (Vars whose slots are never reused) and defines
    `_zeros(shape, dtype)` (a new array on its device)."""

    pool: dict
    pooled: set

    def _init_pool(self):
        self.pool = {}           # (shape, dtype) -> freed top-level slots
        self.pooled = set()      # the slots the pool made (the caller's arrays are never pooled)

    def _new_slot(self, arr) -> int:
        self.slots.append(arr)
        return len(self.slots) - 1

    def _sub_slot(self, aval) -> int:
        """A slot of its own (an arm's or a loop body's value)."""
        return self._new_slot(self._zeros(aval.shape, aval.dtype))

    def _alloc(self, aval, fits=None) -> int:
        """A top-level slot: the last freed one of this shape and dtype that `fits(slot)`, else a new one."""
        free = self.pool.get((tuple(aval.shape), np.dtype(aval.dtype)))
        for i in range(len(free or ()) - 1, -1, -1):
            if fits is None or fits(free[i]):
                return free.pop(i)
        k = self._new_slot(self._zeros(aval.shape, aval.dtype))
        self.pooled.add(k)
        return k

    def _free(self, k):
        if k in self.pooled:
            arr = self.slots[k]
            self.pool.setdefault((tuple(arr.shape), np.dtype(arr.dtype)), []).append(k)

    def _walk_top(self, prog, gen):
        """gen(i, eqn) for each top-level equation, freeing after it the slots of values it read or
        made last (a slot is freed by the value that holds it now: in-place outputs share slots)."""
        last_use: dict[Var, int] = {}
        for i, e in enumerate(prog.eqns):
            for a in e.inputs:
                if isinstance(a, Var):
                    last_use[a] = i
        holder: dict[int, Var] = {}
        for i, e in enumerate(prog.eqns):
            gen(i, e)
            for v in e.outputs:
                holder[self.slot_of[v]] = v
            dead = [a for a in e.inputs if isinstance(a, Var) and last_use.get(a) == i and a not in self.keep]
            dead += [v for v in e.outputs if v not in last_use and v not in self.keep]
            for a in dead:
                k = self.slot_of.get(a)
                if k is not None and holder.get(k) is a:
                    holder.pop(k)
                    self._free(k)
