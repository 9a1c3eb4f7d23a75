"""Graphs of cached calls, used again once their caller has dropped them.

A cached builder call gives every call a Graph of its own (builder_cache.py), on the caller's
arrays, with buffers of its own. At small n, making that Graph costs several replays of it. A
graph the caller has dropped -- nothing outside it refers to it, to its executable, to its result
arrays or to any other buffer it owns -- cannot be told from a new one once its input planes are
bound to the new call's arrays and its buffers are set back to what a new executable starts with:
such a graph is handed out again instead of a new one.

"Dropped" is read from reference counts: a Graph refers to itself (its trace, its result
planes), so only the cycle collector frees it, and a pool of them kept strongly here is the only
other holder. Each count is taken when the graph is kept (before the caller sees it) and must be
the same again: one more holder of the graph, its executable, a handle or any buffer it owns (a
result array the caller kept, a view of one, an executable taken with `g.executable`, a weakref
to the graph) and the graph is not used again. The counts read through the same code at both
moments; the one difference, the keeping call's own references to the graph, is measured once
on this interpreter (`_calibrate`) rather than assumed.

Only small graphs are kept (buffers and arguments of at most POOL_BYTES each, no stack of saved
turns, no host node), at most POOL_SIZE per layout: a large graph's buffers cost more to keep than
its Graph costs to make. A kept graph holds the arrays of its last call until a call takes it
again or its cache is cleared (`builder.clear_cache()`, `eagle_fx.clear_caches()`): at most
POOL_SIZE * POOL_BYTES of a caller's small arrays per layout stay alive after the caller dropped them.
"""
from __future__ import annotations

import sys
import threading
import weakref

import numpy as np

POOL_SIZE = 4                # dropped graphs kept per cached layout
POOL_BYTES = 1 << 16         # a graph whose own buffers hold more is not kept


class _Kept:
    """A kept graph, the objects it hands out (its executable, result handles, own buffers) and
    their reference counts when it was kept."""

    __slots__ = ("graph", "graph_refs", "watched", "counts", "replay")

    def __init__(self, graph, watched):
        self.graph, self.watched = graph, watched
        self.graph_refs = 0
        self.counts = self.replay = None


def _watched(g, own):
    """What a graph hands out: its executable, its result handles, the buffers its executable
    made (slots `own`: not the caller's arrays, nor views of them)."""
    exe = g._exe
    return (exe, *g._result_flat[0], *(exe.slots[k] for k, _ in own))


def _counts(item):
    """The holders of what a kept graph hands out, weakrefs to it, a running enqueue and the
    attributes set on it: read through this one function when it is kept and when it is taken."""
    g = item.graph
    return (*map(sys.getrefcount, item.watched), weakref.getweakrefcount(g), g._worker is None, len(g.__dict__))


def _graph_refs(item):
    return sys.getrefcount(item.graph)


class Pool:
    """The graphs of one cached layout that may be handed out again."""

    __slots__ = ("kept", "lock", "own")

    def __init__(self, own):
        self.kept: list[_Kept] = []
        self.lock = threading.Lock()
        self.own = own                # per buffer the executables make: (slot, initial value or None for zeros)

    @classmethod
    def of(cls, template):
        """The pool of a layout whose executables are copies of `template` (backends/templates.py);
        None where its graphs are not kept: no template, a stack of saved turns, own buffers
        over POOL_BYTES."""
        own = template.own_buffers() if template is not None else None
        if own is None or own[1] > POOL_BYTES:
            return None
        return cls(own[0])

    def take(self):
        """(item, its graph) of a kept graph nothing outside refers to, or None; `rebind` sets it up.
        Under the pool's lock, and the graph returned held: another thread's take, counting
        after this one, sees the reference and passes it by."""
        with self.lock:
            for item in self.kept:
                if (_graph_refs(item) == item.graph_refs and _counts(item) == item.counts
                        and item.graph._exe._replay is item.replay):
                    return item, item.graph
        return None

    @staticmethod
    def recount(item) -> None:
        """Take the counts again once a taken graph is bound anew, before its caller sees it:
        binding replaces the kernel calls and views that hold its buffers."""
        item.counts = _counts(item)
        item.replay = item.graph._exe._replay

    def rebind(self, taken, arrays):
        """The graph `take` gave set up as a new one on a call's arrays (one per input plane): the
        planes and the executable's input slots rebound, its own buffers set back to what a new
        executable starts with, nothing run yet, its counts taken again. (The trace's staging maps
        are left: a built graph stages nothing more.)"""
        item, g = taken
        for p, a in zip(g._trace.input_planes, arrays):
            p.array = a
        exe = g._exe
        exe.rebind_inputs(arrays)
        slots = exe.slots
        for k, initial in self.own:
            if initial is None:
                slots[k].fill(0)
            else:
                np.copyto(slots[k], initial)
        del exe, slots                # (not counted as holders)
        g._generation, g._worker_error = 0, None
        self.recount(item)
        return g

    def keep(self, g) -> None:
        """Keep `g` (a new graph, not yet seen by its caller) for later calls when there is room."""
        if len(self.kept) >= POOL_SIZE or sum(p.array.nbytes for p in g._trace.input_planes) > POOL_BYTES:
            return                    # (a kept graph keeps its last caller's arrays until it is taken)
        g._exe.prepare_rebind()       # it holds the buffers: made before they are counted
        item = _Kept(g, _watched(g, self.own))
        self.kept.append(item)
        item.graph_refs = _graph_refs(item) - _KEEP_EXTRA
        self.recount(item)


def _calibrate() -> int:
    """How many references to the graph `keep`'s caller and `keep` itself add, over those a
    dropped graph has while `take` reads it: measured on this interpreter, with the very
    functions both use, on a stand-in that refers to itself as a Graph does."""
    class Stand:
        pass
    g = Stand()
    g.me = g
    item = _Kept(g, ())
    held = [item]
    kept_refs = _measure_as_kept(g, held)
    del g
    return kept_refs - _graph_refs(held[0])


def _measure_as_kept(g, held):
    return _graph_refs(held[0])


_KEEP_EXTRA = _calibrate()
