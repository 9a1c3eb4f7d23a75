"""Executable templates: what a cached call copies to get an executable of its own.

Lowering a Program for the NumPy backend fuses it, plans its buffers, generates and compiles its
replay function; none of that depends on the call's arrays. A template keeps all of it from one
lowering, with a recipe per buffer (the caller's array, zeros of a shape and dtype, a new stack of
saved turns, a copy of a small initial value), so a call with the same layout makes its
executable by allocating its buffers and binding the kernels to them: two graphs made from one
template share no buffer, and each writes its Mutable arguments in its own caller's arrays.

A template is taken from an executable that has not run (its buffers hold their initial values).
What it cannot reproduce (another backend, host nodes whose functions may hold the executable,
a buffer that views another) gives no template: such a call lowers as before.
"""
from __future__ import annotations

import threading

import numpy as np

from .numpy import NumpyExecutable
from .numpy_stack import Stack

# per-executable state: made anew for each instance; everything else of a NumpyExecutable is shared
_OWN = frozenset(("slots", "consts", "_lock", "_scratch", "_releasable", "release_needed", "_replay"))
_INPUT, _ZEROS, _STACK, _COPY = range(4)


class Template:
    """A NumPy executable's lowering, kept to make executables of it on other arrays."""

    __slots__ = ("shared", "recipe", "consts", "const_views")

    def __init__(self, shared, recipe, consts, const_views):
        self.shared, self.recipe, self.consts, self.const_views = shared, recipe, consts, const_views

    def own_buffers(self):
        """((slot, initial value, or None for zeros), ...) of the buffers an executable of this
        template makes, and their bytes; None where one is a stack of saved turns (it grows as
        the executable runs: not set back by a copy)."""
        own, nbytes = [], 0
        for k, (kind, spec) in enumerate(self.recipe):
            if kind == _STACK:
                return None
            if kind == _ZEROS:
                own.append((k, None))
                nbytes += int(np.prod(spec[0])) * spec[1].itemsize
            elif kind == _COPY:
                own.append((k, spec))
                nbytes += spec.nbytes
        return tuple(own), nbytes

    def instantiate(self, input_arrays) -> NumpyExecutable:
        """A new executable of the template's lowering over `input_arrays` (one per Program input,
        laid out as the template's were), with buffers of its own; not run."""
        exe = object.__new__(NumpyExecutable)
        d = exe.__dict__
        d.update(self.shared)
        slots = []
        for kind, spec in self.recipe:
            if kind == _ZEROS:
                slots.append(np.zeros(*spec))
            elif kind == _INPUT:
                slots.append(None)
            elif kind == _STACK:
                slots.append(Stack(spec))
            else:
                slots.append(spec.copy())
        for k, arr in zip(self.shared["input_slots"], input_arrays):
            slots[k] = arr
        consts = self.consts
        if self.const_views:
            consts = list(consts)
            for j, k, offset, shape, strides, dtype in self.const_views:
                consts[j] = np.ndarray(shape, dtype, buffer=slots[k], offset=offset, strides=strides)
        d["slots"], d["consts"] = slots, consts
        d["_lock"], d["_scratch"] = threading.Lock(), {}
        exe._link()
        return exe


def template_of(exe):
    """The Template of a NumPy executable that has not run yet, or None where it cannot be copied."""
    if type(exe) is not NumpyExecutable or any(c[0] != "call" for c in exe.calls):
        return None
    inputs = set(exe.input_slots)
    views = {k for k, _, _ in exe.views}
    recipe = []
    owned = {}                            # id(buffer) -> slot, for the consts that view one
    for k, s in enumerate(exe.slots):
        if k in inputs or k in views:
            recipe.append((_INPUT, None))
        elif isinstance(s, Stack):
            if s.segs or s.turns:
                return None
            recipe.append((_STACK, s.aval))
        elif type(s) is np.ndarray and s.base is None and s.flags.c_contiguous:
            owned[id(s)] = k
            recipe.append((_ZEROS, (s.shape, s.dtype)) if not s.any() else (_COPY, s.copy()))
        else:
            return None
    const_views = []
    for j, c in enumerate(exe.consts):
        if type(c) is not np.ndarray or c.base is None:
            continue
        base = c.base
        while isinstance(base, np.ndarray) and id(base) not in owned and base.base is not None:
            base = base.base
        k = owned.get(id(base))
        if k is None:
            if any(isinstance(s, np.ndarray) and np.may_share_memory(c, s) for s in exe.slots):
                return None               # a view of a caller's array: not reproducible
            continue
        offset = c.__array_interface__["data"][0] - base.__array_interface__["data"][0]
        const_views.append((j, k, offset, c.shape, c.strides, c.dtype))
    shared = {a: v for a, v in vars(exe).items() if a not in _OWN}
    return Template(shared, tuple(recipe), list(exe.consts), tuple(const_views))
