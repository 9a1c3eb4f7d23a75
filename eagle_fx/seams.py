"""Errors at the seams between transforms: which transforms are staging now, so a refusal names
the composition the user wrote (eagle_fx.vmap(eagle_fx.grad(f))) as well as the line."""
from __future__ import annotations

from hawk_fx.context import CONTEXT


def staging(api):
    """Transform `api` is staging a function: refusals raised meanwhile name it."""
    return CONTEXT.enter(transform_apis=api)


def composition(api, fname):
    """`api` of `fname` as written, with the transforms staging it around it: vmap(grad(f))."""
    names = []
    for a in CONTEXT.transform_apis + [api]:
        if a and (not names or names[-1] != a):
            names.append(a)
    return "".join(f"{a}(" for a in names) + fname + ")" * len(names)


def inside():
    """The transforms staging now, outermost first (empty outside any)."""
    return list(CONTEXT.transform_apis)
