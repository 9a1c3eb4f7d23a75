"""Arguments of a plain function a transform stages, guarded against Python decisions on values.

A plain function handed to a transform (`eagle_fx.vmap(lambda x: ...)`) runs once, at staging,
on real arrays; the transform and the staging cache then replay what it staged for every
instance and every later call with the same layout. A Python decision on an argument's values
(`if x[0] > 0:`, `float(x.max())`) would be frozen silently, as JAX would refuse it on a tracer
(ConcretizationTypeError). While such a function stages, its array arguments are `Guarded`
views: arithmetic on them stays Guarded, and turning one into a Python bool, number or list is
refused with what to write instead. Builders, transforms and jvp take the plain arrays back
(`release`), so graphs never hold a Guarded array. Best effort: a NumPy function that returns a
Python bool (np.allclose) or a copy through Python (x.copy().tolist() is refused, np.array(list(x))
is not) lets a value through.
"""
from __future__ import annotations

import numpy as np

from hawk_fx.perthread import ThreadStack
from hawk_fx.tree import tree_flatten, tree_unflatten

_ACTIVE = ThreadStack()      # (api, function name, {id(guard): the argument array}) per plain function staging


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
        if not _ACTIVE:
            return
        api, name, _ = _ACTIVE[-1]
        raise ValueReadError(
            f"{api}: {name} reads the value of an array computed from its arguments in Python ({what}) while it is "
            "staged: the transform stages it once and replays that for every instance and every later call with "
            "the same layout, so a Python decision on values would be frozen. Decide on the device inside a "
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


class guarding:
    """`with guarding(api, name, args) as gargs:` the arguments with their arrays guarded."""

    def __init__(self, api, name, args):
        self.api, self.name, self.args = api, name, args

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
        _ACTIVE.append((self.api, self.name, originals))
        return tuple(out)

    def __exit__(self, *exc):
        _ACTIVE.pop()
        return False


def release(tree):
    """`tree` with each Guarded array replaced by the argument it guards, or a plain view of it
    (an array computed from the arguments). Free when nothing is being guarded."""
    if not _ACTIVE:
        return tree
    leaves, t = tree_flatten(tree, is_leaf=_is_array)
    if not any(isinstance(x, Guarded) for x in leaves):
        return tree
    return tree_unflatten(t, [_release(x) if isinstance(x, Guarded) else x for x in leaves])


def _release(x):
    for _, _, originals in reversed(_ACTIVE):
        hit = originals.get(id(x))
        if hit is not None and hit[0] is x:
            return hit[1]
    return x.view(np.ndarray)
