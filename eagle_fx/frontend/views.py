"""Views of staged planes: NumPy basic indexing and reshape on a plane, staged as IR operations.

A view is not a buffer of its own: its key names its source (a builder argument, a buffer, any
plane) and how it is taken from it. Reading a view stages a `slice` (or `reshape`) of the source's
current version, once per version and scope; writing a view (a kernel's Mutable, buffer=) stages an
`update` of the source, in place, so the write lands in the caller's array and the hazard checks
see the source. Nothing is read at build: after `g.bind(x=new)` or `x[:] = ...` a view follows x.

Indices are normalised to one entry per axis of the root source: an int (the axis goes) or a
`range` (the positions kept). Ranges compose by slicing, so a view of a view is one slice.
"""
from __future__ import annotations

import math
import operator

import numpy as np

from hawk_fx.core import Eqn, Var, abstract_eval

from .. import ir


class IndexRefusal(Exception):
    """An index a plane cannot take; the caller words it with the builder's line."""


class ViewKey:
    """`src[index]`: index has one entry per axis of src (int or range)."""

    __slots__ = ("src", "index", "shape", "src_shape")

    def __init__(self, src, index, shape, src_shape):
        self.src, self.index, self.shape, self.src_shape = src, index, shape, src_shape

    def __eq__(self, other):
        return type(other) is ViewKey and other.src == self.src and other.index == self.index

    def __hash__(self):
        return hash((hash(self.src), self.index))

    def stage_read(self, src_var, eqns, info):
        return _bind(ir.slice_p, [src_var], {"index": self.index}, eqns, info)

    def stage_write(self, src_var, value, eqns, info):
        return _bind(ir.update_p, [src_var, value], {"index": self.index, "inplace": ((0, 0),)}, eqns, info)


class ReshapeKey:
    """`src.reshape(shape)`; a write puts the value back in src's shape, into src's buffer (an update
    of all of src, in place: a written argument's last version is in the caller's array)."""

    __slots__ = ("src", "shape", "src_shape")

    def __init__(self, src, shape, src_shape):
        self.src, self.shape, self.src_shape = src, shape, src_shape

    def __eq__(self, other):
        return type(other) is ReshapeKey and other.src == self.src and other.shape == self.shape

    def __hash__(self):
        return hash((hash(self.src), self.shape))

    def stage_read(self, src_var, eqns, info):
        return _bind(ir.reshape_p, [src_var], {"shape": self.shape}, eqns, info)

    def stage_write(self, src_var, value, eqns, info):
        back = _bind(ir.reshape_p, [value], {"shape": self.src_shape}, eqns, info)
        whole = tuple(range(d) for d in self.src_shape)
        return _bind(ir.update_p, [src_var, back], {"index": whole, "inplace": ((0, 0),)}, eqns, info)


DERIVED = (ViewKey, ReshapeKey)


def footprint(key):
    """(root key, flat boolean mask over the root of the elements the key may touch, or None: all of it).
    Sibling branches writing disjoint views of one array do not conflict."""
    if isinstance(key, ReshapeKey):
        return footprint(key.src)
    if isinstance(key, ViewKey):
        root, inner = footprint(key.src)
        if inner is not None:            # a view of a reshaped view: all of what that one touches
            return root, inner
        mask = np.zeros(key.src_shape, bool)
        mask[ir.numpy_index(key.index)] = True
        return root, mask.ravel()       # over the root in C order, whichever reshape the view was taken of
    return key, None


def root_key(key):
    """The buffer a key's memory belongs to (hazard checks compare buffers)."""
    while isinstance(key, DERIVED):
        key = key.src
    return key


def full_slice(src_var, eqns, info) -> Var:
    """A copy of a value into a buffer of its own (x.copy())."""
    return _bind(ir.slice_p, [src_var], {"index": tuple(range(d) for d in src_var.aval.shape)}, eqns, info)


def _bind(prim, inputs, params, eqns, info) -> Var:
    out = Var(abstract_eval[prim](*[a.aval for a in inputs], **params)[0])
    eqns.append(Eqn(prim, inputs, [out], params, info))
    return out


# ---------------------------------------------------------------------------------------------
# indices

def normalise(shape, idx) -> tuple:
    """One entry per axis of `shape` (int or range) for a NumPy basic index; refuses the rest."""
    idx = idx if isinstance(idx, tuple) else (idx,)
    if any(i is None for i in idx):
        raise IndexRefusal("None (np.newaxis) in an index adds an axis; a plane's axes are fixed by its role: "
                           "use .reshape(...) for a new shape")
    n_ell = sum(i is Ellipsis for i in idx)
    if n_ell > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    if n_ell:
        k = idx.index(Ellipsis)
        idx = idx[:k] + (slice(None),) * (len(shape) - len(idx) + 1) + idx[k + 1:]
    if len(idx) > len(shape):
        raise IndexError(f"too many indices for a plane of shape {shape}: {len(idx)} given")
    idx = idx + (slice(None),) * (len(shape) - len(idx))
    out = []
    for axis, (i, d) in enumerate(zip(idx, shape)):
        if isinstance(i, slice):
            out.append(range(d)[i])
            continue
        if isinstance(i, bool) or not _is_int(i):
            raise IndexRefusal(f"index {i!r} (a {type(i).__name__}) is not a basic index; integer-array and "
                               "boolean indexing gather values: write a kernel that does it")
        i = operator.index(i)
        if not -d <= i < d:
            raise IndexError(f"index {i} is out of bounds for axis {axis} with size {d}")
        out.append(i % d)
    return tuple(out)


def _is_int(i) -> bool:
    try:
        operator.index(i)
        return True
    except TypeError:
        return False


def compose(outer, inner) -> tuple:
    """The index of the root that `root[outer][inner]` selects (inner over outer's kept axes)."""
    it = iter(inner)
    out = []
    for r in outer:
        if isinstance(r, range):
            i = next(it)
            out.append(r[ir.numpy_index((i,))[0]] if isinstance(i, range) else r[i])
        else:
            out.append(r)
    return tuple(out)


def of_array(arr, root):
    """How to take `arr`, a NumPy view of `root`, from root: (shape, index, result shape) with
    root.reshape(shape)[index].reshape(result shape) its elements in its order (index normalised;
    shape None for root's own, result shape None when no reshape is needed); None when no basic
    index of a reshape of root takes them (a transpose, a broadcast, another dtype). Found from
    the elements' offsets in root, so whichever chain of views made arr, it is seen as its region."""
    if arr.dtype != root.dtype or not root.flags.c_contiguous or arr.ndim == 0 or arr.size == 0:
        return None
    offsets = np.asarray(arr.__array_interface__["data"][0] - root.__array_interface__["data"][0], np.int64)
    for d, s in zip(arr.shape, arr.strides):
        offsets = np.add.outer(offsets, np.arange(d, dtype=np.int64) * s)
    offsets = offsets.ravel()
    if (offsets % root.itemsize).any():
        return None
    offsets //= root.itemsize
    for shape in dict.fromkeys((root.shape, _shape_of_strides(arr, root), (root.size,))):
        index = shape and _ranges(np.unravel_index(offsets, shape))
        if index is None:
            continue
        dropped = tuple(r[0] if len(r) == 1 else r for r in index)      # x[1] rather than x[1:2]
        src = None if shape == root.shape else shape
        for idx in (index, dropped):
            if ir.index_shape(idx) == arr.shape:
                return src, idx, None
        return src, (dropped if ir.index_shape(dropped) else index), arr.shape
    return None


def _shape_of_strides(arr, root):
    """A shape of root in which each axis of arr (of more than one element) steps along an axis of
    its own: the axis blocks are the greatest common divisors of arr's strides, outermost first,
    and of root's size (x.reshape(3, 4, 5)[:, ::3] of a flat x is x.reshape(3, 4, 5)[:, 0:4:3])."""
    block, shape = root.size, []
    for d, s in zip(arr.shape, arr.strides):
        if d > 1:
            inner = math.gcd(abs(s) // root.itemsize, block)
            shape.append(block // inner)
            block = inner
    shape.append(block)
    return tuple(d for d in shape if d > 1) or (1,)


def _ranges(coords):
    """The index (a range per axis) whose elements, in C order, are at `coords`; None if none is."""
    index = []
    for c in coords:            # the positions each axis visits, in order of first visit
        seq = c[np.sort(np.unique(c, return_index=True)[1])]
        step = int(seq[1] - seq[0]) if len(seq) > 1 else 1
        if (np.diff(seq) != step).any():
            return None
        index.append(range(int(seq[0]), int(seq[-1]) + (1 if step > 0 else -1), step))
    grid = np.meshgrid(*index, indexing="ij")
    if grid[0].size != coords[0].size or any((g.ravel() != c).any() for g, c in zip(grid, coords)):
        return None
    return tuple(index)


def array_of(key, root_array):
    """The NumPy value of a key from its root's array (a built graph reading a view it returned)."""
    if isinstance(key, ViewKey):
        a = array_of(key.src, root_array)
        return None if a is None else a[ir.numpy_index(key.index)]
    if isinstance(key, ReshapeKey):
        a = array_of(key.src, root_array)
        return None if a is None else a.reshape(key.shape)
    return root_array(key)
