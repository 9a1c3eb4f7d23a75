"""The NumPy backend's stack of saved loop turns: memory that follows the turns run.

A reverse-mode loop pushes each turn's carries (ir.stack_push) and its backward reads them back
(ir.stack_read). The stack's type names the most turns it may hold (`cap`, 0 when unbounded);
here it is only an upper bound: storage grows by doubling as turns are pushed, so a loop capped
at 200 000 turns that stops after 50 holds 64 turns. Storage is turn-major ((turns, *value) or,
under vmap, (turns, B, *value)) whatever the type's layout, so a push writes one contiguous row.
"""
from __future__ import annotations

import numpy as np

from .. import ir

_MIN_TURNS = 4


class Stack:
    """Saved values, one per turn. `turns`: one past the highest turn pushed since `clear`."""

    __slots__ = ("aval", "row", "dtype", "data", "turns", "batch")

    def __init__(self, aval):
        self.aval = aval
        shape = aval.shape
        self.batch = shape[0] if aval.kind == ir.BATCHED_STACK else None
        self.row = (shape[0],) + shape[2:] if self.batch is not None else shape[1:]
        self.dtype = aval.dtype
        self.data = np.zeros((0,) + self.row, self.dtype)
        self.turns = 0

    @property
    def nbytes(self) -> int:
        return self.data.nbytes

    def clear(self):
        """An empty stack (zeros of a stack type). Storage is kept for the next run unless the
        last run used under a quarter of it."""
        if self.turns * 4 < len(self.data):
            self.data = np.zeros((0,) + self.row, self.dtype)
        self.turns = 0

    def push(self, turn: int, value):
        if turn >= len(self.data):
            self._grow(turn + 1)
        self.data[turn] = value
        if turn >= self.turns:
            self.turns = turn + 1

    def _grow(self, need):
        new = np.empty((max(need, 2 * len(self.data), _MIN_TURNS),) + self.row, self.dtype)
        new[:self.turns] = self.data[:self.turns]
        self.data = new

    def read(self, turn: int):
        return self.data[turn]

    def gather(self, turns):
        """The turn of each instance (turns: (B, 1) cells)."""
        idx = turns[:, 0].astype(np.intp)
        if self.batch is not None:
            return self.data[idx, np.arange(self.batch)]
        return self.data[idx]

    def assign(self, other: "Stack"):
        """This stack holds what `other` holds (under vmap: an unbatched one, for each instance)."""
        self.turns = 0
        if other.turns > len(self.data):
            self.data = np.empty((other.turns,) + self.row, self.dtype)
        if self.batch is not None and other.batch is None:
            self.data[:other.turns] = other.data[:other.turns, None]
        else:
            self.data[:other.turns] = other.data[:other.turns]
        self.turns = other.turns

    def copy(self) -> "Stack":
        s = Stack(self.aval)
        s.assign(self)
        return s

    def __array__(self, dtype=None, copy=None):
        """The saved turns as an array of the type's layout (turn axis first, or second under vmap)."""
        a = self.data[:self.turns]
        if self.batch is not None:
            a = np.moveaxis(a, 0, 1)
        return np.array(a, dtype=dtype)

    def __repr__(self):
        return f"<stack of {self.turns} turns of {self.row} {self.dtype}, room for {len(self.data)}>"
