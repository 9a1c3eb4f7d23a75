"""Sums over the samples that are right to within an ulp of the result, however they cancel.

A plain sum of n values can lose everything to cancellation: np.sum of [1e16, 1, -1e16, 1] * 1000
is 0.0, not 2000. `sum_last_axis` is off by at most about one ulp of the result's dtype (see its
docstring for the bound), at a cost of a few passes over the data where the plain sum makes one.
"""
from __future__ import annotations

import math

import numpy as np

U = 2.0 ** -53              # float64's unit roundoff
SMALL = 256                 # up to this many samples, math.fsum of a list is the cheaper exact sum


def two_sum(a, b):
    """s, e with s = fl(a + b) and s + e = a + b exactly (Knuth), elementwise."""
    s = a + b
    z = s - a
    return s, (a - (s - z)) + (b - z)


def sum_last_axis(x: np.ndarray, dtype) -> np.ndarray:
    """The sum of float array x over its last axis, as float64 of shape x.shape[:-1], within
    1.5 ulps of `dtype` of the exact sum (NaN and inf propagate as in np.sum).

    A float64 sum of n values no larger than m is off by at most (n-1)*n*m*u, whatever the order of
    the additions. Where that bound is under half an ulp of `dtype` of the total, the plain sum is
    the answer: the usual case for float32 data, which sums in float64. Elsewhere each value is
    split exactly, x = q + r, with q on a grid of sigma*u (sigma a power of two above 2*n*m):
    the q sum exactly in any order, and the r are at most sigma*u, so each split shrinks the bound
    by about 2*n*u (Rump, Ogita and Oishi's error-free vector transformation), and the splits go on
    until it is small enough. The exact sums are gathered with two_sum; a sum that would overflow
    sigma is left to math.fsum."""
    lead, n = x.shape[:-1], x.shape[-1]
    if x.size <= SMALL:
        return _fsum_rows(x)
    m = np.maximum(np.maximum.reduce(x, axis=-1), -np.minimum.reduce(x, axis=-1)).astype(np.float64)
    finite = np.isfinite(m)
    if not finite.all():                # NaN or inf: the IEEE answer (those rows alone)
        plain = np.add.reduce(x, axis=-1, dtype=np.float64)
        return np.where(finite, sum_last_axis(np.where(finite[..., None], x, 0), dtype), plain)
    half_ulp = float(np.finfo(dtype).eps) / 4
    sigmas, size = [], m                # the splits so far, and a bound on what they leave of each value
    while True:
        bound = (n - 1) * n * U * size
        if np.all(bound <= half_ulp * n * m):           # |total| <= n*m: else no total can pass
            hi = lo = np.zeros(lead)
            for part in _split_sums(x, sigmas):
                hi, err = two_sum(hi, part)
                lo = lo + err
            total = hi + lo
            if np.all(bound <= half_ulp * np.abs(total)):
                return total
        sigmas.append(np.ldexp(1.0, np.frexp(size)[1] + (n.bit_length() + 1))[..., None])
        if not np.isfinite(sigmas[-1]).all():
            return _fsum_rows(x)
        size = sigmas[-1][..., 0] * U


CHUNK = 1 << 16     # samples per slice: its scratch stays in cache, and nothing of n's size is made


def _split_sums(x, sigmas) -> list:
    """The exact sum of the q of each split, then the plain sum of what the splits leave, over
    slices of the samples (a split's q sum exactly in any order, so slice by slice too)."""
    sums = [0.0] * (len(sigmas) + 1)
    for s in range(0, x.shape[-1], CHUNK):
        r = x[..., s:s + CHUNK]
        for k, sigma in enumerate(sigmas):
            q = np.add(r, sigma, dtype=np.float64)
            q -= sigma
            sums[k] = sums[k] + np.add.reduce(q, axis=-1)
            r = np.subtract(r, q, out=q)
        sums[-1] = sums[-1] + np.add.reduce(r, axis=-1, dtype=np.float64)
    return sums


def fsum(row) -> float:
    """math.fsum (exact, then rounded once), or the inf that np.sum gives where the sum overflows."""
    try:
        return math.fsum(row)
    except OverflowError:               # the exact sum is beyond float64: inf, as np.sum says
        return float(np.add.reduce(np.asarray(row, np.float64)))


def _fsum_rows(x) -> np.ndarray:
    rows = x.reshape(math.prod(x.shape[:-1]), x.shape[-1]).tolist()
    return np.array([fsum(r) for r in rows], np.float64).reshape(x.shape[:-1])
