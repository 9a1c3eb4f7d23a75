"""Arguments of a plain function a transform stages, guarded against Python decisions on values.

A plain function handed to a transform (`eagle_fx.vmap(lambda x: ...)`) runs once, at staging,
on real arrays; the transform and the staging cache then replay what it staged for every
instance and every later call with the same layout. A Python decision on an argument's values
(`if x[0] > 0:`, `float(x.max())`) would be frozen silently, as JAX would refuse it on a tracer
(ConcretizationTypeError). While such a function stages, its array arguments are `Guarded`
views: arithmetic on them stays Guarded, and turning one into a Python bool, number or list is
refused with what to write instead. Builders, transforms and jvp take the plain arrays back
(`release`), so graphs never hold a Guarded array.

The guard has holes: np.asarray(x) and np.array(x) give a plain ndarray (NumPy does not ask a
subclass), and so does a copy through Python (np.array(list(x))). What leaks through them is
caught after the fact: the transform stages the function a second time on `other_values` of its
arguments, and a graph or an array handed to it that changes with the values is found (api.py).
"""
from __future__ import annotations

import os

import numpy as np

try:
    from numpy.lib.array_utils import byte_bounds
except ImportError:                      # NumPy < 2
    byte_bounds = np.byte_bounds

from hawk_fx.context import CONTEXT
from hawk_fx.source import user_line
from hawk_fx.tree import tree_flatten, tree_unflatten

class ValueReadError(TypeError):
    pass


class Guarded(np.ndarray):
    def __array_wrap__(self, arr, context=None, return_scalar=False):
        return (arr if isinstance(arr, np.ndarray) else np.asarray(arr)).view(Guarded)

    def __array_function__(self, func, types, args, kwargs):
        out = super().__array_function__(func, types, args, kwargs)
        return _guard_result(out)

    def __getitem__(self, index):
        out = super().__getitem__(index)
        return out if isinstance(out, np.ndarray) else np.asarray(out).view(Guarded)

    def __iter__(self):
        for i in range(len(self)):
            yield self[i]

    def _refuse(self, what):
        if not CONTEXT.guards:
            return
        api, f, _ = CONTEXT.guards[-1]
        code = getattr(f, "__code__", None)
        line = user_line(code.co_filename) if code is not None else None
        raise ValueReadError(
            f"{api}: {where(f, line)} reads the value of an array computed from its arguments in Python ({what}) "
            "while it is staged: the transform stages it once and replays that for every instance and every later "
            "call with the same layout, so a Python decision on values would be frozen. Decide on the device inside a "
            "builder (a cell: `if flag:` / hawk_fx.math.where in a kernel), or pass the value as a Python "
            "number (static: it keys the cache)")

    def __bool__(self):
        self._refuse("bool, e.g. `if x[0] > 0:`")
        return super().__bool__()

    def __float__(self):
        self._refuse("float(...)")
        return super().__float__()

    def __int__(self):
        self._refuse("int(...)")
        return super().__int__()

    def __index__(self):
        self._refuse("an index from an array")
        return super().__index__()

    def __complex__(self):
        self._refuse("complex(...)")
        return super().__complex__()

    def item(self, *args):
        self._refuse(".item()")
        return super().item(*args)

    def tolist(self):
        self._refuse(".tolist()")
        return super().tolist()


def _guard_result(out):
    """A NumPy function's result on Guarded arrays, guarded too (np.stack, np.dot, np.max)."""
    if isinstance(out, np.ndarray):
        return out if isinstance(out, Guarded) else out.view(Guarded)
    if isinstance(out, np.generic):
        return np.asarray(out).view(Guarded)
    if type(out) in (tuple, list):
        return type(out)(_guard_result(x) for x in out)
    return out


def _is_array(x):
    return isinstance(x, np.ndarray)


def where(f, line=None):
    """`name (file.py, line N)` of a user's function: at `line`, else where it is defined."""
    name = getattr(f, "__name__", type(f).__name__)
    code = getattr(f, "__code__", None)
    if code is None:
        return name
    return f"{name} ({os.path.basename(code.co_filename)}, line {line or code.co_firstlineno})"


class guarding:
    """`with guarding(api, f, args) as gargs:` the arguments of plain function f with their arrays guarded."""

    def __init__(self, api, f, args):
        self.api, self.f, self.args = api, f, args

    def __enter__(self):
        originals = {}
        out = []
        for a in self.args:
            leaves, tree = tree_flatten(a, is_leaf=_is_array)
            if not any(type(x) is np.ndarray for x in leaves):
                out.append(a)
                continue
            for j, x in enumerate(leaves):
                if type(x) is np.ndarray:
                    g = x.view(Guarded)
                    originals[id(g)] = (g, x)
                    leaves[j] = g
            out.append(tree_unflatten(tree, leaves) if tree.kind != "leaf" else leaves[0])
        CONTEXT.guards.append((self.api, self.f, originals))
        return tuple(out)

    def __exit__(self, *exc):
        CONTEXT.guards.pop()
        return False


def release(tree):
    """`tree` with each Guarded array replaced by the argument it guards, or a plain view of it
    (an array computed from the arguments). Free when nothing is being guarded."""
    if not CONTEXT.guards:
        return tree
    leaves, t = tree_flatten(tree, is_leaf=_is_array)
    if not any(isinstance(x, Guarded) for x in leaves):
        return tree
    return tree_unflatten(t, [_release(x) if isinstance(x, Guarded) else x for x in leaves])


def _release(x):
    for _, _, originals in reversed(CONTEXT.guards):
        hit = originals.get(id(x))
        if hit is not None and hit[0] is x:
            return hit[1]
    return x.view(np.ndarray)


def other_values(args, which=None):
    """The arguments with their floating arrays (the (argument, leaf) pairs in `which`; all when
    None) holding other values: each element moved across zero and scaled (x > 0 to -1.3 x - 0.5,
    else to 0.5 - 1.3 x), so every one changes, and so does a sign, a sum or a branch on one.
    Arrays that share memory share it in the copies too (x and x[1:] stay views of one buffer),
    and change together."""
    floats = [(k, j, x) for k, a in enumerate(args) for j, x in enumerate(tree_flatten(a, is_leaf=_is_array)[0])
              if type(x) is np.ndarray and x.dtype.kind == "f"]
    owners = {id(_owner(x)) for k, j, x in floats if which is None or (k, j) in which}
    spans = {}                                   # id(memory owner) -> [lo, hi) bytes its leaves cover
    picked = [(k, j, x) for k, j, x in floats if id(_owner(x)) in owners]
    for k, j, x in picked:
        lo, hi = byte_bounds(x)
        span = spans.setdefault(id(_owner(x)), [lo, hi])
        span[0], span[1] = min(span[0], lo), max(span[1], hi)
    buffers = {key: np.empty(hi - lo, np.uint8) for key, (lo, hi) in spans.items()}
    stand_in = {}
    for k, j, x in picked:
        key = id(_owner(x))
        at = x.__array_interface__["data"][0] - spans[key][0]
        y = np.ndarray(x.shape, x.dtype, buffer=buffers[key], offset=at, strides=x.strides)
        y[...] = np.where(x > 0, -1.3 * x - 0.5, 0.5 - 1.3 * x)
        y.flags.writeable = x.flags.writeable
        stand_in[k, j] = y
    out = []
    for k, a in enumerate(args):
        leaves, t = tree_flatten(a, is_leaf=_is_array)
        leaves = [stand_in.get((k, j), x) for j, x in enumerate(leaves)]
        out.append(tree_unflatten(t, leaves) if t.kind != "leaf" else leaves[0])
    return tuple(out)


def _owner(x):
    while isinstance(x.base, np.ndarray):
        x = x.base
    return x
