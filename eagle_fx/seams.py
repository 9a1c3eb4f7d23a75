"""Errors at the seams between transforms: which transforms are staging now, so a refusal names
the composition the user wrote (eagle_fx.vmap(eagle_fx.grad(f))) as well as the line."""
from __future__ import annotations

import threading
from contextlib import contextmanager

_state = threading.local()


def _stack():
    s = getattr(_state, "stack", None)
    if s is None:
        s = _state.stack = []
    return s


@contextmanager
def staging(api):
    """Transform `api` is staging a function: refusals raised meanwhile name it."""
    s = _stack()
    s.append(api)
    try:
        yield
    finally:
        s.pop()


def composition(api, fname):
    """`api` of `fname` as written, with the transforms staging it around it: vmap(grad(f))."""
    names = []
    for a in _stack() + [api]:
        if a and (not names or names[-1] != a):
            names.append(a)
    return "".join(f"{a}(" for a in names) + fname + ")" * len(names)


def inside():
    """The transforms staging now, outermost first (empty outside any)."""
    return list(_stack())
