"""Arrays whose data starts on a 64-byte boundary: XLA on the CPU reads such a C-contiguous NumPy
array in place (no copy) and copies any other, far slower than NumPy copies it."""
from __future__ import annotations

import ctypes

import numpy as np

ALIGN = 64


def aligned_empty(shape, dtype) -> np.ndarray:
    """An uninitialised C-contiguous array whose data starts on a 64-byte boundary."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(nbytes + ALIGN, np.uint8)
    off = -raw.ctypes.data % ALIGN
    return raw[off:off + nbytes].view(dtype).reshape(shape)


def is_aligned(a) -> bool:
    """Whether XLA reads `a` in place: C-contiguous, its data on a 64-byte boundary."""
    return a.ctypes.data % ALIGN == 0 and a.flags.c_contiguous


def aligned_copy(a: np.ndarray) -> np.ndarray:
    """A copy of `a` (as np.array makes it), 64-byte aligned when `a` is C-contiguous."""
    if not a.flags.c_contiguous or a.dtype.hasobject:
        return np.array(a)
    out = aligned_empty(a.shape, a.dtype)
    np.copyto(out, a)
    return out


# -- reading an unaligned array through the aligned span around it ---------------------------------
#
# An array's bytes [p, p + nbytes) lie inside [floor64(p), ceil64(p + nbytes)): pages are 4096-byte
# aligned, so that span touches no page the array does not, and reading it is always safe. XLA
# reads the span in place (it is aligned) and the compiled function slices the array out of it:
# a large read-only argument reaches XLA with no copy wherever NumPy put it.

def span_lead(a):
    """The number of elements between the 64-byte boundary below `a`'s data and its first element,
    when `a` can be read through its span (C-contiguous, unaligned, a plain dtype whose size
    divides 64); else None."""
    item = a.dtype.itemsize
    if not a.flags.c_contiguous or a.dtype.hasobject or not item or ALIGN % item or a.size == 0:
        return None
    off = a.ctypes.data % ALIGN
    return off // item if off and off % item == 0 else None


def span_size(lead: int, size: int, itemsize: int) -> int:
    """The number of elements of the aligned span of `size` elements that start `lead` in."""
    return -(-(lead + size) * itemsize // ALIGN) * ALIGN // itemsize


def span_view(a: np.ndarray, lead: int) -> np.ndarray:
    """A read-only one-dimensional array over the aligned span around `a` (span_lead(a) == lead),
    which keeps `a` alive."""
    item = a.dtype.itemsize
    count = span_size(lead, a.size, item)
    raw = (ctypes.c_char * (count * item)).from_address(a.ctypes.data - lead * item)
    raw._keeps = a                          # the memory is a's: it lives as long as the view
    view = np.frombuffer(raw, a.dtype)
    view.flags.writeable = False
    return view


class SpanInput:
    """How one read-only argument compiled to be read through its span (lead elements in) reaches
    XLA: the span around the bound array when it starts `lead` elements past a boundary too (the
    view made once per bound array), else a copy into an aligned buffer at that offset."""

    __slots__ = ("lead", "count", "_array", "_view", "_staged")

    def __init__(self, a, lead):
        self.lead, self.count = lead, span_size(lead, a.size, a.dtype.itemsize)
        self._array = self._view = self._staged = None

    def of(self, a):
        if a is self._array:                # a bound array's data never moves while it is referenced
            return self._view
        if span_lead(a) == self.lead:
            self._array, self._view = a, span_view(a, self.lead)
            return self._view
        if self._staged is None:
            self._staged = aligned_empty((self.count,), a.dtype)
        np.copyto(self._staged[self.lead:self.lead + a.size].reshape(a.shape), a)
        return self._staged
