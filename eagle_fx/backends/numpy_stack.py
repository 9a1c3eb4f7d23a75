"""The NumPy backend's stack of saved loop turns: memory that follows the turns run.

A reverse-mode loop pushes each turn's carries (ir.stack_push) and its backward reads them back
(ir.stack_read). The stack's type names the most turns it may hold (`cap`, 0 when unbounded);
here it is only an upper bound: storage is allocated as turns are pushed, so a loop capped at
200 000 turns that stops after 50 holds about 50. Storage is a list of segments of `seg` turns
(about 1 MB each); the first grows by doubling up to `seg` (a short loop holds little), the
others are allocated whole: nothing is copied once a stack passes one segment, and at most one
segment is unused. Storage is turn-major ((turns, *value) or, under vmap, (turns, B, *value))
whatever the type's layout, so a push writes one contiguous row.
"""
from __future__ import annotations

import numpy as np

from .. import ir

_SEGMENT_BYTES = 1 << 20
_MIN_TURNS = 4


class Stack:
    """Saved values, one per turn. `turns`: one past the highest turn pushed since `clear`."""

    __slots__ = ("aval", "row", "dtype", "segs", "seg", "turns", "batch")

    def __init__(self, aval):
        self.aval = aval
        shape = aval.shape
        self.batch = shape[0] if aval.kind == ir.BATCHED_STACK else None
        self.row = (shape[0],) + shape[2:] if self.batch is not None else shape[1:]
        self.dtype = np.dtype(aval.dtype)
        row_bytes = max(1, int(np.prod(self.row)) * self.dtype.itemsize)
        self.seg = 1 << max(2, (_SEGMENT_BYTES // row_bytes).bit_length() - 1)    # a power of 2, >= 4
        self.segs: list = []
        self.turns = 0

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self.segs)

    def clear(self):
        """An empty stack (zeros of a stack type). Storage is kept for the next run unless the
        last run used under a quarter of it."""
        if self.turns * 4 < sum(len(s) for s in self.segs):
            self.segs = []
        self.turns = 0

    def release(self, min_bytes: int) -> None:
        """Drop the storage when it holds more than min_bytes (after a cached call returns): the
        next run's pushes allocate it again, as a first run does."""
        if self.nbytes > min_bytes:
            self.segs = []
            self.turns = 0

    def push(self, turn: int, value):
        k, i = divmod(turn, self.seg)
        if k >= len(self.segs) or (k == 0 and i >= len(self.segs[0])):
            self._grow(k, i)
        self.segs[k][i] = value
        if turn >= self.turns:
            self.turns = turn + 1

    def _grow(self, k, i):
        if k == 0:                      # the first segment doubles (copying) until it is whole
            old = self.segs[0] if self.segs else None
            size = min(self.seg, max(_MIN_TURNS, i + 1, 2 * (len(old) if old is not None else 0)))
            new = np.empty((size,) + self.row, self.dtype)
            if old is not None:
                new[:len(old)] = old
            self.segs[:1] = [new]
            return
        if not self.segs or len(self.segs[0]) < self.seg:
            self._grow(0, self.seg - 1)
        while len(self.segs) <= k:
            self.segs.append(np.empty((self.seg,) + self.row, self.dtype))

    def read(self, turn: int):
        k, i = divmod(turn, self.seg)
        return self.segs[k][i]

    def gather(self, turns):
        """The turn of each instance (turns: (B, 1) cells), as one array."""
        k, i = np.divmod(turns[:, 0].astype(np.intp), self.seg)
        cols = np.arange(len(k))
        out = np.empty((len(k),) + (self.row[1:] if self.batch is not None else self.row), self.dtype)
        for s in np.unique(k):
            m = k == s
            out[m] = self.segs[s][i[m], cols[m]] if self.batch is not None else self.segs[s][i[m]]
        return out

    def assign(self, other: "Stack"):
        """This stack holds what `other` holds (under vmap: an unbatched one, for each instance)."""
        self.segs = []
        self.turns = 0
        for t in range(other.turns):
            v = other.read(t)
            self.push(t, v[None] if self.batch is not None and other.batch is None else v)

    def copy(self) -> "Stack":
        s = Stack(self.aval)
        s.assign(self)
        return s

    def __array__(self, dtype=None, copy=None):
        """The saved turns as an array of the type's layout (turn axis first, or second under vmap)."""
        a = np.concatenate(self.segs)[:self.turns] if self.segs else np.zeros((0,) + self.row, self.dtype)
        if self.batch is not None:
            a = np.moveaxis(a, 0, 1)
        return np.array(a, dtype=dtype)

    def __repr__(self):
        return f"<stack of {self.turns} turns of {self.row} {self.dtype}, room for {sum(map(len, self.segs))}>"
