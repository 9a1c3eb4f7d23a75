"""Sums over the samples that are right to within an ulp of the result, however they cancel.

A plain sum of n values can lose everything to cancellation: np.sum of [1e16, 1, -1e16, 1] * 1000
is 0.0, not 2000. `sum_last_axis` is off by at most about one ulp of the result's dtype (see its
docstring for the bound). A sum is computed with an a-priori error bound that costs no extra pass
and accepted where that bound is small enough: float32 data after one plain float64 sum, float64
data after one error-free split; only sums that cancel to nearly nothing take the slow exact path.
"""
from __future__ import annotations

import math

import numpy as np

U = 2.0 ** -53              # float64's unit roundoff
SMALL = 256                 # up to this many samples, math.fsum of a list is the cheaper exact sum
TILE = 1 << 16              # values per tile of the split: few calls, and mostly in cache between passes
BLOCK = 1 << 13             # values per block of short rows (see _split_rows)
PIECE = 1 << 12             # values per piece of a plain float64 sum of float32 data
SAFE = 1 + 2.0 ** -40       # covers the rounding of the bounds' own arithmetic
SPLITS = 4                  # splits of _exact_sums before it gives a row to math.fsum


def two_sum(a, b):
    """s, e with s = fl(a + b) and s + e = a + b exactly (Knuth), elementwise."""
    s = a + b
    z = s - a
    return s, (a - (s - z)) + (b - z)


def gamma(k):
    """Higham's gamma_k = k u / (1 - k u): a float64 sum in which no value passes through more than
    k additions (any order) is off by at most gamma_k times the sum of the values' magnitudes."""
    return k * U / (1 - k * U)


def sum_last_axis(x: np.ndarray, dtype, share=None) -> np.ndarray:
    """The sum of float array x over its last axis, as float64 of shape x.shape[:-1], within
    2u|s|(1 + 3u) of the exact sum s, u the unit roundoff of `dtype` (so under 1.5 ulps; NaN and
    inf propagate as in np.sum).

    Each stage gives every row a float64 total t and a rigorous bound E on |t - s| (besides t's own
    rounding, u64|t|); a row is done where E <= u|t|. Stages: float32 data sum plainly in float64
    (_plain_sums); float64 data, and float32 rows that cancel too far for that, take one error-free
    split (_split_sums); rows that cancel to nearly nothing, or hold a NaN or an inf, are left to
    _exact_sums. share(part, count), if given, runs part(lo, hi) over the split's tiles
    [0, count), perhaps in threads."""
    lead, n = x.shape[:-1], x.shape[-1]
    if x.size <= SMALL:
        return _fsum_rows(x)
    rows = x.reshape(-1, n)
    limit = float(np.finfo(dtype).eps) / 2
    todo = totals = None                # the rows not yet done (all), and the totals so far
    for stage in (_plain_sums, _split_sums) if x.dtype.itemsize < 8 else (_split_sums,):
        got, bound = stage(rows if todo is None else rows[todo], share)
        ok = bound * SAFE <= limit * np.abs(got)        # NaN (a NaN, an inf, an overflow) fails
        if todo is None:
            if ok.all():
                return got.reshape(lead)
            todo, totals = np.arange(rows.shape[0]), np.empty(rows.shape[0])
        totals[todo[ok]] = got[ok]
        todo = todo[~ok]
        if not todo.size:
            return totals.reshape(lead)
    totals[todo] = _exact_sums(rows[todo], dtype)
    return totals.reshape(lead)


def _plain_sums(rows, share):
    """float32 rows, summed plainly in float64 (exact conversions), in pieces of PIECE values and
    then the pieces' sums: no value passes through more than PIECE - 1 + n // PIECE additions, so
    E = gamma(that) * n * max|x| (the max of each long row; of all, for short rows)."""
    count, n = rows.shape
    k = n // PIECE
    if k == 0:
        m = max(np.maximum.reduce(rows, axis=None), -np.minimum.reduce(rows, axis=None))
        if rows.size <= BLOCK:          # see _split_rows
            total = rows.astype(np.float64) @ np.ones(n)
        else:
            total = np.add.reduce(rows, axis=-1, dtype=np.float64)
        return total, np.full(count, gamma(n - 1) * n * float(m))
    m = np.maximum(np.maximum.reduce(rows, axis=-1), -np.minimum.reduce(rows, axis=-1)).astype(np.float64)
    total = np.add.reduce(rows[:, :k * PIECE].reshape(count, k, PIECE), axis=-1, dtype=np.float64)
    total = np.add.reduce(total, axis=-1) + np.add.reduce(rows[:, k * PIECE:], axis=-1, dtype=np.float64)
    return total, gamma(PIECE - 1 + k) * n * m


def _split_sums(rows, share):
    """Rows cut into tiles, each split once, error-free (_split): slices of TILE values of a long
    row, or blocks of whole rows (_split_rows). A row's tile sums are added with one rounding
    (E: the sum of its tiles' bounds)."""
    count, n = rows.shape
    if 2 * n <= TILE:
        return _split_rows(rows, share)
    pieces = -(-n // TILE)
    parts = np.empty((count, 2 * pieces))
    errs = np.empty((count, pieces))

    def part(lo, hi):
        scratch = np.empty((2, TILE))
        for t in range(lo, hi):
            i, k = divmod(t, pieces)
            tile = rows[i, k * TILE:(k + 1) * TILE]
            qr = scratch[:, :tile.size]
            errs[i, k] = _split(tile, qr)
            parts[i, 2 * k:2 * k + 2] = np.add.reduce(qr, axis=-1)

    (share or _here)(part, count * pieces)
    total = parts[:, 0] + parts[:, 1] if pieces == 1 else np.array([fsum(p) for p in parts.tolist()])
    return total, np.add.reduce(errs, axis=-1)


def _split_rows(rows, share):
    """_split_sums of rows of up to TILE / 2 values, in blocks of whole rows that split with one
    sigma (few calls per row; a row much smaller than the block's largest may fail its bound and
    go on to _exact_sums). Short rows, in blocks of BLOCK values, sum by matrix products with ones:
    add.reduce over many short rows costs several times more (and OpenBLAS threads products above
    about BLOCK values, its threads then competing with ours); longer ones by add.reduce."""
    count, n = rows.shape
    b = BLOCK // n if 2 * n <= BLOCK else TILE // n
    ones = np.ones(n) if 2 * n <= BLOCK else None
    total, bound = np.empty(count), np.empty(count)

    def part(lo, hi):
        scratch, sums = np.empty((2, b, n)), np.empty((2, b))
        for i in range(lo * b, min(hi * b, count), b):
            block = rows[i:i + b]
            q, r = qr = scratch[:, :len(block)]
            bound[i:i + b] = _split(block, qr)
            sq, sr = sums[:, :len(block)]
            if ones is None:
                np.add.reduce(q, axis=-1, out=sq), np.add.reduce(r, axis=-1, out=sr)
            else:
                np.matmul(q, ones, out=sq), np.matmul(r, ones, out=sr)
            np.add(sq, sr, out=total[i:i + b])

    (share or _here)(part, -(-count // b))
    return total, bound


def _here(part, count):
    part(0, count)


def _split(tile, qr):
    """tile = q + r exactly, into qr, and a bound on the error of summing the r of a row plainly.
    q is on a grid of sigma*u, sigma a power of two above 2*(w+1)*max|x| (Rump, Ogita and Oishi): a
    row's q sum exactly in any order; the r are at most sigma*u each, so the bound is
    gamma(w-1) * w * u * sigma. NaN where the tile holds a NaN or an inf, or values too near
    overflow for sigma: those rows are left to _exact_sums."""
    m = float(max(np.maximum.reduce(tile, axis=None), -np.minimum.reduce(tile, axis=None)))
    if not m <= 2.0 ** 1000:
        qr.fill(math.nan)
        return math.nan
    w = tile.shape[-1]
    sigma = math.ldexp(1.0, math.frexp(m)[1] + w.bit_length() + 1)
    q, r = qr
    np.add(tile, sigma, out=q, dtype=np.float64)
    q -= sigma
    np.subtract(tile, q, out=r)
    return gamma(w - 1) * w * U * sigma


def _exact_sums(rows, dtype) -> np.ndarray:
    """The rows that cancel too far for a tile's bound: within 1.5 ulps of `dtype` by repeated
    error-free splits of the whole row, NaN and inf as np.sum. After SPLITS splits (a total that
    is exactly zero never passes a relative bound), or where sigma would overflow, math.fsum."""
    n = rows.shape[-1]
    m = np.maximum(np.maximum.reduce(rows, axis=-1), -np.minimum.reduce(rows, axis=-1)).astype(np.float64)
    finite = np.isfinite(m)
    if not finite.all():                # NaN or inf: the IEEE answer (those rows alone)
        plain = np.add.reduce(rows, axis=-1, dtype=np.float64)
        if not finite.any():
            return plain
        return np.where(finite, _exact_sums(np.where(finite[..., None], rows, 0), dtype), plain)
    half_ulp = float(np.finfo(dtype).eps) / 4
    sigmas, size = [], m                # the splits so far, and a bound on what they leave of each value
    while True:
        bound = (n - 1) * n * U * size
        if np.all(bound <= half_ulp * n * m):           # |total| <= n*m: else no total can pass
            hi = lo = np.zeros(rows.shape[0])
            for part in _extracted_sums(rows, sigmas):
                hi, err = two_sum(hi, part)
                lo = lo + err
            total = hi + lo
            if np.all(bound <= half_ulp * np.abs(total)):
                return total
        sigmas.append(np.ldexp(1.0, np.frexp(size)[1] + (n.bit_length() + 1))[..., None])
        if len(sigmas) > SPLITS or not np.isfinite(sigmas[-1]).all():
            return _fsum_rows(rows)
        size = sigmas[-1][..., 0] * U


CHUNK = 1 << 16     # samples per slice of _extracted_sums: its scratch stays in cache


def _extracted_sums(x, sigmas) -> list:
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
    """math.fsum (exact, then rounded once), or np.sum's answer where the sum overflows (inf) or
    adds inf to -inf (NaN)."""
    try:
        return math.fsum(row)
    except (OverflowError, ValueError):
        return float(np.add.reduce(np.asarray(row, np.float64)))


def _fsum_rows(x) -> np.ndarray:
    rows = x.reshape(math.prod(x.shape[:-1]), x.shape[-1]).tolist()
    return np.array([fsum(r) for r in rows], np.float64).reshape(x.shape[:-1])
