"""Errors at the seams between transforms: which transforms are staging now, so a refusal names
the composition the user wrote (eagle_fx.vmap(eagle_fx.grad(f))) as well as the line.

An API built on other transforms (jacfwd: a vmap of jvp over a basis) registers itself with
`as_written`: the frames its own staging pushes are hidden up to the frame where it stages the
user's function, so a refusal reads eagle_fx.jacfwd(eagle_fx.vmap(f)), not the vmap inside."""
from __future__ import annotations

from hawk_fx.context import CONTEXT


class _Written:
    """A frame for an API as the user wrote it: `shown` are the names it reads as (jacfwd of a
    jacrev staged as one: both); frames after it are its own staging until one is `api` again."""

    __slots__ = ("api", "shown")

    def __init__(self, api, shown):
        self.api, self.shown = api, shown


def staging(api):
    """Transform `api` is staging a function: refusals raised meanwhile name it."""
    return CONTEXT.enter(transform_apis=api)


def as_written(api, make, shown=None):
    """`make` (an API's staging of the user's function through transforms of its own) with
    refusals raised meanwhile naming `shown` (default: `api`) where its own transforms would be."""
    frame = _Written(api, tuple(shown) if shown else (api,))

    def staged(*args):
        with CONTEXT.enter(transform_apis=frame):
            return make(*args)
    return staged


def _names(frames):
    """The frames as the user wrote them: an API's own staging hidden, and a frame that repeats
    the one before it (a transform staging its function again) merged into it."""
    names, hiding, last = [], None, None
    for a in frames:
        if isinstance(a, _Written):
            if hiding is None:
                names.extend(a.shown)
                hiding = last = a.api
        elif hiding is not None:
            if a == hiding:               # the API staging the user's function: what follows is theirs
                hiding = None
        elif a and a != last:
            names.append(a)
            last = a
    return names


def composition(api, fname):
    """`api` of `fname` as written, with the transforms staging it around it: vmap(grad(f))."""
    names = _names(CONTEXT.transform_apis + [api])
    return "".join(f"{a}(" for a in names) + fname + ")" * len(names)


def inside():
    """The transforms staging now as written, outermost first (empty outside any)."""
    return _names(CONTEXT.transform_apis)
