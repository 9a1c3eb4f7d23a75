"""The memory planner the NumPy and CUDA backends share: slots, reuse by liveness, one walk.

A lowering gives every Var a slot (an index into `slots`, the arrays it runs on). The caller's
arrays are the input slots (written inputs are updated in place). Top-level temporaries come from a pool keyed by (shape, dtype): a slot goes back to the pool once the last
reader of the value it holds has been generated, unless the value is kept (a result, a buffer a
user holds, what a recorded reverse reads). Values inside arms and loop bodies get slots of their
own (`sub_slot`): a body runs many times, and its temporaries must not alias the outer ones.
The values an arm or a loop body hands back land in the construct's slots through `copy_moves`, a
parallel assignment in which a source that is also a destination is first copied aside.
"""
from __future__ import annotations

import numpy as np

from hawk_fx.core import Literal, Var


class SlotPlanner:
    """Mixin for a lowering (NumpyExecutable, the CUDA lowering). The lowering sets `slots` (list)
    and `slot_of` (Var -> slot), calls `_bind_inputs` and `_init_pool`, and defines
    `_zeros(shape, dtype)` (a new array on its device)."""

    pool: dict
    pooled: set

    def _init_pool(self):
        self.pool = {}           # (shape, dtype) -> freed top-level slots
        self.pooled = set()      # the slots the pool made (the caller's arrays are never pooled)

    def _bind_inputs(self, prog, input_arrays, keep):
        """The caller's arrays are the input slots; `keep`: Vars whose slots are never reused (the
        outputs are added)."""
        self.input_slots = []
        for v, arr in zip(prog.inputs, input_arrays):
            self.slot_of[v] = self._new_slot(arr)
            self.input_slots.append(self.slot_of[v])
        self.keep = set(keep) | {a for a in prog.outputs if isinstance(a, Var)}

    def _ref(self, slot, aval) -> Var:
        """A stand-in Var for a slot (a loop's carry buffer), to bind a sub-program's inputs to."""
        v = Var(aval)
        self.slot_of[v] = slot
        return v

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

    def _out_slot(self, v, pre, top, fits=None) -> int:
        """The slot of an equation's output `v`: where `pre` (analysis.direct_outputs) sends it, else
        a pooled slot at the top level, else one of its own."""
        if v in pre:
            return pre[v]
        return self._alloc(v.aval, fits) if top else self._sub_slot(v.aval)

    def _bind_operands(self, sub, operands) -> list:
        """Bind a sub-program's inputs to its operands' slots; a Literal operand gets a slot of its
        own, returned as a (slot, literal) copy to make first."""
        fills = []
        for v, a in zip(sub.inputs, operands):
            if isinstance(a, Literal):
                self.slot_of[v] = self._sub_slot(v.aval)
                fills.append((self.slot_of[v], a))
            else:
                self.slot_of[v] = self.slot_of[a]
        return fills

    def _copy_moves(self, srcs, out_slots) -> list:
        """(destination slot, source atom) copies that land `srcs` in `out_slots` as one parallel
        assignment, in order: a source that is also a destination is first copied aside (into a
        slot of its own), the other moves follow."""
        pending = [(s, a) for a, s in zip(srcs, out_slots) if isinstance(a, Literal) or self.slot_of[a] != s]
        dests = {s for s, _ in pending}
        aside, moves = [], []
        for s, a in pending:
            if isinstance(a, Var) and self.slot_of[a] in dests:
                t = self._sub_slot(a.aval)
                aside.append((t, a))
                moves.append((s, self._ref(t, a.aval)))
            else:
                moves.append((s, a))
        return aside + moves

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
