"""Sums over samples worth trusting: hawk.sum and hawk.mean against math.fsum, on every backend,
forward and in the cotangent sums of the reverse.

Bounds (u: the unit roundoff of the result's dtype, S: the exact sum, from math.fsum):
  numpy  |got - S| <= 2u|S|(1 + 3u)           (hawk_fx/accurate.py: under 1.5 ulps, any input)
  jax    |got - S| <= 3u|S| + (n u)^2 sum|x|  (pairs with two_sum in any order: Neumaier's bound)
"""
from __future__ import annotations

import math

import numpy as np
import pytest

import hawk_fx as hawk
import hawk_fx.diff as hd
from hawk_fx import Param, Scalar, accurate
from hawk_fx.accurate import sum_last_axis
from hawk_fx.emit import cuda
import hawk_fx.emit.numpy as emit_numpy
from hawk_fx.emit.jax import require_jax

CANCELLING = np.array([1e16, 1.0, -1e16, 1.0] * 1000)


@hawk.kernel
def total(x: Scalar):
    return hawk.sum(x), hawk.mean(x)


@hawk.kernel
def scaled(x: Scalar, a: Param) -> Scalar:
    return hawk.sum(a * x)


def _jnp(x):
    require_jax("test")
    import jax.numpy as jnp
    return jnp.asarray(x)


def test_cancelling_terms_numpy():
    s, m = total(CANCELLING)
    assert s[0] == 2000.0 and m[0] == 0.5
    s32, _ = total(CANCELLING.astype(np.float32))
    assert s32.dtype == np.float32 and s32[0] == 2000.0


def test_cancelling_terms_jax():
    s, m = total(_jnp(CANCELLING))
    assert float(s[0]) == 2000.0 and float(m[0]) == 0.5
    s32, _ = total(_jnp(CANCELLING.astype(np.float32)))
    assert s32.dtype == np.float32 and float(s32[0]) == 2000.0


def test_cotangent_sum_over_samples():
    """The gradient of a one-cell Param is a sum over samples of per-sample cotangents."""
    g = hd.vjp(scaled, wrt="a")(CANCELLING, np.array([3.0]), cotangent=np.array([1.0]))
    assert g["a"][0] == 2000.0


def test_cuda_emits_a_compensated_sum():
    ek = cuda.emit_specialization(total.specialize(total.default_layout()))
    assert "hawk_sum2_add(" in ek.source and "hawk_atomic_sum2(" in ek.source
    assert ek.workspace_bytes == 32           # two sums, each with its error cell


# ---------------------------------------------------------------------------------------------
# adversarial arrays against math.fsum

def _adversarial(rng, n, dtype):
    """Large cancellations, magnitudes over many decades, exact zeros, ties at the last bit."""
    kind = rng.integers(5)
    if kind == 0:                             # mixed magnitudes
        x = rng.standard_normal(n) * 10.0 ** rng.integers(-30, 30, n)
    elif kind == 1:                           # a few huge values that cancel, tiny ones between
        x = rng.standard_normal(n)
        big = rng.integers(0, n, max(1, n // 8))
        x[big] = 1e15 * rng.choice([-1.0, 1.0], big.size)
    elif kind == 2:                           # every value and its negation, plus a remainder
        half = rng.standard_normal(n // 2) * 10.0 ** rng.integers(-8, 8, n // 2)
        x = np.concatenate([half, -half, rng.standard_normal(n - 2 * (n // 2))])
    elif kind == 3:                           # one large value and many at half its ulp
        x = np.full(n, 2.0 ** -53)
        x[0] = 1.0
    else:                                     # large terms that cancel around small ones, at a random scale
        x = np.resize([1.0, 2.0 ** -30, -1.0, 2.0 ** -30], n) * 10.0 ** rng.integers(-20, 20)
    x = x.astype(dtype)
    return x[rng.permutation(n)]


def _cases(count, sizes, seed):
    rng = np.random.default_rng(seed)
    for k in range(count):
        dtype = (np.float64, np.float32)[k % 2]
        n = int(sizes[k % len(sizes)])
        yield _adversarial(rng, n, dtype)


def _check(x, got, neumaier=False):
    exact = math.fsum(x.astype(np.float64).tolist())
    u = float(np.finfo(x.dtype).eps) / 2
    bound = 2 * u * (1 + 3 * u) * abs(exact)
    if neumaier:
        bound = 3 * u * abs(exact) + (x.size * u) ** 2 * math.fsum(np.abs(x.astype(np.float64)).tolist())
    assert got.dtype == x.dtype
    assert abs(float(got[0]) - exact) <= bound, (x.dtype, x.size, float(got[0]), exact, bound)


SIZES = [1, 2, 3, 8, 255, 256, 257, 1000, 4096, 4097, 10_000]


def test_numpy_against_fsum():
    """120 cases: every size around the small-n boundary (256) and beyond, both float dtypes."""
    for x in _cases(120, SIZES, seed=1):
        s, _ = total(x)
        _check(x, s)


def test_numpy_across_slices_against_fsum(monkeypatch):
    """The splits run over slices of accurate.CHUNK samples: made small here, 60 cases cross many
    slice boundaries (n not a multiple of the slice)."""
    monkeypatch.setattr(accurate, "CHUNK", 300)
    for x in _cases(60, [301, 599, 1000, 4097], seed=8):
        s, _ = total(x)
        _check(x, s)


def test_numpy_mean_against_fsum():
    for x in _cases(40, SIZES, seed=2):
        _, m = total(x)
        exact = math.fsum(x.astype(np.float64).tolist()) / x.size
        u = float(np.finfo(x.dtype).eps) / 2
        assert abs(float(m[0]) - exact) <= 4 * u * abs(exact)


def test_numpy_batched_rows_against_fsum():
    """vmap: one sum per row, each within the bound (rows of mixed difficulty)."""
    rng = np.random.default_rng(3)
    for n in (8, 300, 5000):
        for dtype in (np.float64, np.float32):
            rows = np.stack([_adversarial(rng, n, dtype) for _ in range(5)])
            got = sum_last_axis(rows, dtype).astype(dtype)
            for r, g in zip(rows, got):
                _check(r, np.array([g]))


def _check_rows(rows, dtype):
    got = sum_last_axis(rows, dtype).astype(dtype)
    for r, g in zip(rows, got):
        _check(r, np.array([g]))


@pytest.mark.parametrize("n", [2, 3, 8, 17, 64, 300, 4095, 5000])
def test_numpy_many_short_rows_against_fsum(n):
    """Batched calls (vmap: a row per instance): short rows split in blocks with one sigma each.
    Rows of every kind, and rows of very different scales in one block (the small ones fail the
    block's bound and are summed again), both dtypes, each row against math.fsum."""
    rng = np.random.default_rng(n)
    for dtype in (np.float64, np.float32):
        rows = np.stack([_adversarial(rng, n, dtype) for _ in range(40)])
        e = 30 if dtype == np.float64 else 6         # float32's adversarial values reach 1e15
        rows[::3] *= np.asarray(10.0 ** rng.integers(-e, e, (len(rows[::3]), 1)), dtype)
        _check_rows(rows, dtype)
        easy = (rng.random((1000, n)) + 0.5).astype(dtype)      # the common case: one pass, all done
        _check_rows(easy, dtype)


def test_numpy_rows_across_tiles_and_blocks_against_fsum(monkeypatch):
    """Tiles, blocks and pieces made small: long rows cross many tiles (float64) and pieces
    (float32), short rows (n = 7, 23: matrix products; n = 30: add.reduce) many blocks, none a
    multiple of the cut."""
    monkeypatch.setattr(accurate, "TILE", 64)
    monkeypatch.setattr(accurate, "BLOCK", 48)
    monkeypatch.setattr(accurate, "PIECE", 32)
    rng = np.random.default_rng(9)
    for n, count in ((7, 100), (23, 30), (30, 21), (1000, 6), (4097, 3)):
        for dtype in (np.float64, np.float32):
            _check_rows(np.stack([_adversarial(rng, n, dtype) for _ in range(count)]), dtype)


def test_numpy_sum_shared_across_threads(monkeypatch):
    """A large sum's tiles go to the chunk workers: the same totals, against math.fsum."""
    monkeypatch.setattr(emit_numpy, "THREADS", 3)
    monkeypatch.setattr(emit_numpy, "PARALLEL_MIN", 1000)
    monkeypatch.setattr(accurate, "TILE", 500)
    for x in _cases(6, [4001, 10_000], seed=10):
        s, _ = total(x)
        _check(x, s)


def test_nonfinite_and_overflowing_rows():
    """Rows with a NaN or an inf give np.sum's answer, beside finite rows in the same block; an
    exact sum beyond float64 is inf, one that comes back within range is right."""
    rng = np.random.default_rng(11)
    rows = rng.standard_normal((40, 8))
    rows[3, 2], rows[7, 0], rows[8, 1:3] = np.nan, np.inf, (np.inf, -np.inf)
    with np.errstate(invalid="ignore"):
        want = np.sum(rows, axis=-1)
    got = sum_last_axis(rows, np.float64)
    np.testing.assert_equal(got[[3, 7, 8]], want[[3, 7, 8]])
    for k in set(range(40)) - {3, 7, 8}:
        _check(rows[k], np.array([got[k]]))
    big = np.full((2, 300), 1e306)
    big[1, ::2] = -1e306
    big[1, 0] = 1.7e308
    with np.errstate(over="ignore"):
        got = sum_last_axis(big, np.float64)
    assert got[0] == np.inf and got[1] == math.fsum(big[1].tolist())
    with np.errstate(invalid="ignore"):
        assert np.isnan(sum_last_axis(np.array([1.0, np.inf, -np.inf]), np.float64))   # fsum's path


def test_nan_and_inf_propagate():
    with np.errstate(invalid="ignore"):             # inf - inf, as np.sum warns
        for bad in (np.nan, np.inf, -np.inf):
            x = np.r_[CANCELLING, bad]
            s, _ = total(x)
            np.testing.assert_equal(s[0], np.sum(x))
        s, _ = total(np.array([np.inf, -np.inf, 1.0] * 100))
    assert np.isnan(s[0])


def test_jax_against_fsum():
    for x in _cases(16, [1, 7, 256, 1000, 4097], seed=4):
        s, _ = total(_jnp(x))
        _check(x, np.asarray(s), neumaier=True)


@pytest.mark.slow
def test_numpy_against_fsum_large():
    for x in _cases(400, SIZES + [100_000], seed=5):
        s, _ = total(x)
        _check(x, s)


@pytest.mark.slow
def test_jax_against_fsum_large():
    for x in _cases(60, SIZES + [100_000], seed=6):
        s, _ = total(_jnp(x))
        _check(x, np.asarray(s), neumaier=True)
