"""Arrays whose data starts on a 64-byte boundary: XLA on the CPU reads such a C-contiguous NumPy
array in place (no copy) and copies any other, far slower than NumPy copies it."""
from __future__ import annotations

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
    return a.ctypes.data % ALIGN == 0 and a.flags.c_contiguous


def aligned_copy(a: np.ndarray) -> np.ndarray:
    """A copy of `a` (as np.array makes it), 64-byte aligned when `a` is C-contiguous."""
    if not a.flags.c_contiguous or a.dtype.hasobject:
        return np.array(a)
    out = aligned_empty(a.shape, a.dtype)
    np.copyto(out, a)
    return out
