"""Cached staging for transformed functions: the jax.jit contract.

Calling `eagle_fx.grad(f)(x)` stages f, transforms its Program and builds a Graph; all of that
depends only on the *layout* of the arguments, so it is done once per layout and replayed after.
The key is that of jax.jit: the transformed function (the transform, its options and the user's
function, so `grad(f)` made twice shares one cache), the argument tree structure, each array's
shape and dtype (which decide its kind: plane, cell, Param), and the Python values (static).

A hit copies the new arrays into the arrays the graph owns (so later changes to the caller's
arrays are never seen, and the graph never writes them), replays, and returns copies of the
results. As with jax.jit, Python values the function reaches by closure (a global float) are read
when it is staged, not at each call: after changing one, `eagle_fx.clear_caches()`.

A reverse-mode graph keeps residuals for as many turns of a counted loop as the trip count it was
staged with; a call whose trip count is larger stages again.
"""
from __future__ import annotations

import threading
from collections import OrderedDict, namedtuple

import numpy as np

from hawk_fx.perthread import ThreadStack
from hawk_fx.tree import tree_flatten, tree_unflatten

MAXSIZE = 64               # entries (layouts) per transformed function
MAX_FUNCTIONS = 256        # transformed functions with a cache

CacheInfo = namedtuple("CacheInfo", "hits misses currsize maxsize")

_STATIC = (bool, int, float, complex, str, bytes, type(None), np.generic)
_CACHES: "OrderedDict[object, FunctionCache]" = OrderedDict()
_LOCK = threading.Lock()   # guards the dicts of caches and of entries (not the runs)
_RECORDING = ThreadStack()  # the Staging record of the entry being staged (innermost last)


class Staging:
    """What staging one entry noticed: trip counts it sized reverse-mode loops for, and whether a
    graph reads derived copies of the arguments (then it cannot be rebound, and is not cached)."""

    def __init__(self):
        self.caps: list = []          # (view of an owned argument, the largest value it was staged for)
        self.cacheable = True


def note_capacity(array, value):
    """A reverse-mode loop was sized for `value` turns read from `array` (a view of an argument)."""
    if _RECORDING:
        _RECORDING[-1].caps.append((array, value))


def uncacheable():
    """The graph being staged reads arrays derived from the arguments by copying, or made while it
    was staged: it is not kept, and the next call stages again."""
    if _RECORDING:
        _RECORDING[-1].cacheable = False


class Entry:
    """A staged closed Program, its graph (lowered here, once), the arrays it owns, and a lock:
    binding and running it is one step, so two threads calling with one layout take turns.
    `staged` returns it locked; `with entry:` releases."""

    __slots__ = ("closed", "graph", "owned", "caps", "lock", "writes", "back")

    def __init__(self, closed, owned, caps):
        self.closed, self.owned, self.caps = closed, owned, caps
        self.graph = closed.lower()
        self.lock = threading.RLock()
        self.writes = _written_owned(closed, owned)  # owned arrays the graph writes in place
        self.back = ()                                # (caller's array, owned array) to copy after the run

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *exc):
        if not self.back:
            self.lock.release()
            return False
        try:
            if exc_type is None:
                for dst, src in self.back:        # a Mutable argument: the caller's array is written, as a loop would
                    np.copyto(dst, src)
        finally:
            self.back = ()
            self.lock.release()
        return False

    def bind(self, leaves):
        """Copy the call's arrays into the graph's own; False when a trip count outgrew the graph."""
        back = [(leaves[i], self.owned[i]) for i in self.writes] if self.writes else ()
        for dst, _ in back:
            if not dst.flags.writeable:
                raise ValueError("eagle_fx: the transformed function writes an argument in place (a Mutable or "
                                 f"buffer=), and the array given for it (shape {dst.shape}) is read-only; pass a "
                                 "writeable array")
        for dst, src in zip(self.owned, leaves):
            if dst is not None:
                np.copyto(dst, src)
        for view, cap in self.caps:
            if view.max() > cap:
                return False
        self.back = back
        return True


class FunctionCache:
    """The LRU of one transformed function: layout key -> Entry."""

    def __init__(self):
        self.entries: OrderedDict = OrderedDict()
        self.maxsize, self.hits, self.misses = MAXSIZE, 0, 0

    def info(self):
        return CacheInfo(self.hits, self.misses, len(self.entries), self.maxsize)

    def lookup(self, key, leaves):
        """The entry for `key` with these arrays bound, locked; None (and no lock) for a miss."""
        with _LOCK:
            e = self.entries.get(key)
            if e is not None:
                self.entries.move_to_end(key)
        if e is None:
            return None
        e.lock.acquire()
        try:
            bound = e.bind(leaves)
        except BaseException:
            e.lock.release()
            raise
        if not bound:
            e.lock.release()
            with _LOCK:
                if self.entries.get(key) is e:
                    del self.entries[key]
            return None
        self.hits += 1
        return e

    def store(self, key, entry):
        with _LOCK:
            self.misses += 1
            self.entries[key] = entry
            while len(self.entries) > self.maxsize:
                self.entries.popitem(last=False)


def _written_owned(closed, owned):
    """Indices of the owned arrays (copies of the caller's) that the Program writes in place."""
    if owned is None:
        return ()
    from .transforms.program import written_inputs
    arrays = [closed.planes[i].array for i in written_inputs(closed.program)]
    return tuple(k for k, o in enumerate(owned) if o is not None and any(np.may_share_memory(o, a) for a in arrays))


def layout_key(args):
    """(key, array leaves, tree) of the arguments; key None when a leaf cannot be keyed (then the
    call stages afresh): an array of another library, or an object with no value semantics."""
    parts = []
    for x in args:                       # the common case, flat arguments: no tree to build
        if type(x) is np.ndarray:
            parts.append((x.shape, x.dtype))
        elif isinstance(x, _STATIC):
            parts.append((type(x), x))
        else:
            break
    else:
        return tuple(parts), args, None
    leaves, tree = tree_flatten(args, is_leaf=_is_ndarray)
    parts = []
    for x in leaves:
        if type(x) is np.ndarray:
            parts.append((x.shape, x.dtype))
        elif isinstance(x, _STATIC):
            parts.append((type(x), x))
        else:
            return None, leaves, tree
    return (tree, tuple(parts)), leaves, tree


def _is_ndarray(x):
    return type(x) is np.ndarray


def cache_for(sig, create=True):
    with _LOCK:
        c = _CACHES.get(sig)
        if c is None and create:
            c = _CACHES[sig] = FunctionCache()
            while len(_CACHES) > MAX_FUNCTIONS:
                _CACHES.popitem(last=False)
        elif c is not None:
            _CACHES.move_to_end(sig)
        return c


def _locked(e):
    e.lock.acquire()
    return e


def staged(sig, args, stage):
    """The Entry whose graph runs what `stage` (returning a closed Program) makes for these
    arguments, locked (`with staged(...) as e:`): a cached one with the arrays bound, or a new one,
    staged on copies of the arguments that it keeps."""
    key, leaves, tree = layout_key(args)
    if key is None:
        return _locked(Entry(stage(*args), None, ()))
    try:
        c = cache_for(sig)
    except TypeError:                     # an unhashable option (a list in in_axes): no cache
        c = None
    e = c.lookup(key, leaves) if c is not None else None
    if e is not None:
        return e
    owned = [np.array(x) if type(x) is np.ndarray else None for x in leaves]
    own = [o if o is not None else x for o, x in zip(owned, leaves)]
    own_args = tuple(own) if tree is None else tree_unflatten(tree, own)
    rec = Staging()
    _RECORDING.append(rec)
    try:
        g = stage(*own_args)
    finally:
        _RECORDING.pop()
    e = _locked(Entry(g, owned, rec.caps))
    try:
        e.bind(leaves)
    except BaseException:
        e.lock.release()
        raise
    if c is not None and rec.cacheable:
        c.store(key, e)
    return e


def clear_caches():
    """Forget every staged graph of every transformed function (after changing a global a function
    reads by closure, for instance)."""
    with _LOCK:
        _CACHES.clear()


def clear(sig):
    with _LOCK:
        _CACHES.pop(sig, None)
