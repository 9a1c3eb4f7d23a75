"""Module state that each thread has its own of.

Staging is a per-thread activity: a thread building a graph must not capture the kernel calls
another thread makes eagerly, and a kernel traced in one thread must not see another's trace.
So every staging stack is a ThreadStack: a list to its users, a different list in each thread.
"""
from __future__ import annotations

import threading


class ThreadStack(threading.local):
    """A stack (append, pop, [-1], len, truth, del [k:]) that is a separate list in each thread.
    `items` is this thread's list itself, for hot paths that only test it."""

    def __init__(self):
        self.items = []

    def append(self, x):
        self.items.append(x)

    def pop(self, *k):
        return self.items.pop(*k)

    def __getitem__(self, k):
        return self.items[k]

    def __delitem__(self, k):
        del self.items[k]

    def __len__(self):
        return len(self.items)

    def __bool__(self):
        return bool(self.items)

    def __iter__(self):
        return iter(self.items)


class ThreadDict(threading.local):
    """A dict (get, update, pop, [k]) that is a separate dict in each thread."""

    def __init__(self):
        self.items = {}

    def get(self, k, default=None):
        return self.items.get(k, default)

    def update(self, *args, **kwargs):
        self.items.update(*args, **kwargs)

    def pop(self, k, *default):
        return self.items.pop(k, *default)

    def __getitem__(self, k):
        return self.items[k]

    def __setitem__(self, k, v):
        self.items[k] = v

    def __contains__(self, k):
        return k in self.items

    def __len__(self):
        return len(self.items)

    def clear(self):
        self.items.clear()
