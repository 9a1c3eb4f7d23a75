"""Every cache of both packages, in one registry, with one eviction policy.

A cache here is what is made again on a miss (a staged graph, a generated kernel, a compiled CUDA
module): forgetting an entry costs time, never a value. Each is an `LRU`, a bounded mapping that
drops its least recently used entry past `maxsize`; each registers itself (weakly: a cache held
by one function object goes with it), so `clear_all()` (`eagle_fx.clear_caches()`) reaches all
of them. A pure function memoised with functools.lru_cache registers its `cache_clear` with
`register_memo`.
"""
from __future__ import annotations

import threading
import weakref
from collections import OrderedDict

_REGISTRY: "weakref.WeakSet[LRU]" = weakref.WeakSet()
_CLEARERS: list = []            # cache_clear of functools.lru_cache memos
_MISSING = object()


class LRU:
    """A mapping of at most `maxsize` entries that forgets its least recently used one."""

    __slots__ = ("name", "maxsize", "_data", "_lock", "__weakref__")

    def __init__(self, name: str, maxsize: int, register: bool = True):
        self.name, self.maxsize = name, maxsize
        self._data: OrderedDict = OrderedDict()
        self._lock = threading.Lock()
        if register:
            _REGISTRY.add(self)

    def get(self, key, default=None):
        with self._lock:
            v = self._data.get(key, _MISSING)
            if v is _MISSING:
                return default
            self._data.move_to_end(key)
            return v

    def __setitem__(self, key, value):
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self.maxsize:
                self._data.popitem(last=False)

    def __getitem__(self, key):
        v = self.get(key, _MISSING)
        if v is _MISSING:
            raise KeyError(key)
        return v

    def __contains__(self, key):
        return key in self._data

    def __len__(self):
        return len(self._data)

    def pop(self, key, default=None):
        with self._lock:
            return self._data.pop(key, default)

    def pop_if(self, key, value):
        """Forget `key` only while it still holds `value` (another thread may have replaced it)."""
        with self._lock:
            if self._data.get(key) is value:
                del self._data[key]

    def values(self):
        with self._lock:
            return list(self._data.values())

    def clear(self):
        with self._lock:
            self._data.clear()

    def __repr__(self):
        return f"<cache {self.name}: {len(self._data)}/{self.maxsize}>"


def register_memo(memo):
    """Register a functools.lru_cache memo (its cache_clear) with the others; returns it (a decorator)."""
    _CLEARERS.append(memo.cache_clear)
    return memo


class WeakMemo(weakref.WeakKeyDictionary):
    """A memo keyed weakly by an object (a Program): an entry lives as long as its key, and
    clear_all forgets them all as it forgets the LRUs."""

    def __init__(self):
        super().__init__()
        _CLEARERS.append(self.clear)


def clear_all():
    """Forget every cached entry of every registered cache."""
    for cache in list(_REGISTRY):
        cache.clear()
    for clear in _CLEARERS:
        clear()


def registered():
    """The live registered caches (for tests and for `eagle_fx.cache_info`-like reports)."""
    return sorted(_REGISTRY, key=lambda c: c.name)
