"""hawk_fx.math against NumPy (and the math module for erf/erfc), in float32 and float64.

Each function runs inside a kernel over a plane of inputs from its domain; the oracle is the
NumPy function on the same array, so values and dtypes must agree.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

import hawk_fx as hawk
import hawk_fx.math as hm
from hawk_fx import Param, Scalar

N = 64
FLOATS = [np.float32, np.float64]
RTOL = {np.float32: 2e-6, np.float64: 1e-13}

# name -> (NumPy oracle, low, high): inputs are uniform on [low, high]
UNARY = {
    "abs": (np.abs, -5, 5), "sign": (np.sign, -5, 5), "floor": (np.floor, -5, 5), "ceil": (np.ceil, -5, 5),
    "round": (np.round, -5, 5), "trunc": (np.trunc, -5, 5), "negative": (np.negative, -5, 5),
    "sqrt": (np.sqrt, 0.01, 9), "rsqrt": (lambda x: 1 / np.sqrt(x), 0.01, 9), "cbrt": (np.cbrt, -8, 8),
    "exp": (np.exp, -4, 4), "exp2": (np.exp2, -4, 4), "expm1": (np.expm1, -1, 1),
    "log": (np.log, 0.01, 9), "log2": (np.log2, 0.01, 9), "log10": (np.log10, 0.01, 9),
    "log1p": (np.log1p, -0.9, 9),
    "sin": (np.sin, -3, 3), "cos": (np.cos, -3, 3), "tan": (np.tan, -1.4, 1.4),
    "asin": (np.arcsin, -0.99, 0.99), "acos": (np.arccos, -0.99, 0.99), "atan": (np.arctan, -9, 9),
    "sinh": (np.sinh, -3, 3), "cosh": (np.cosh, -3, 3), "tanh": (np.tanh, -3, 3),
    "asinh": (np.arcsinh, -9, 9), "acosh": (np.arccosh, 1.01, 9), "atanh": (np.arctanh, -0.99, 0.99),
}

BINARY = {
    "add": (np.add, (-5, 5), (-5, 5)), "subtract": (np.subtract, (-5, 5), (-5, 5)),
    "multiply": (np.multiply, (-5, 5), (-5, 5)), "divide": (np.divide, (-5, 5), (0.5, 5)),
    "atan2": (np.arctan2, (-5, 5), (-5, 5)), "pow": (np.power, (0.1, 4), (-2, 2)),
    "hypot": (np.hypot, (-5, 5), (-5, 5)), "fmod": (np.fmod, (-9, 9), (0.5, 3)),
    "minimum": (np.minimum, (-5, 5), (-5, 5)), "maximum": (np.maximum, (-5, 5), (-5, 5)),
}

COMPARE = {"less": np.less, "less_equal": np.less_equal, "greater": np.greater,
           "greater_equal": np.greater_equal, "equal": np.equal, "not_equal": np.not_equal}


OTHERS = {"erf", "erfc", "clip", "where", "select", "isfinite", "isnan", "isinf", "logical_and", "logical_or",
          "logical_not", "uint32", "int32", "float32", "float64", "real",
          # small tensors: tested in test_hawk_body.py
          "vec", "dot", "norm", "cross", "outer", "transpose", "matmul", "trace", "einsum",
          # the stable functions of optimisation: tested against JAX in test_stable_math.py
          "sigmoid", "softplus", "log_sigmoid", "logaddexp", "relu", "xlogy", "xlog1py", "logsumexp",
          "stop_gradient",
          # tables: tested against jnp.take and .at[].add in test_tables.py
          "take", "scatter_add",
          # C's and NumPy's remaining functions, argmax/argmin: tested in test_math_extras.py
          "fma", "copysign", "remainder", "rint", "spacing", "fdim", "argmax", "argmin"}
OTHERS |= {"sample_index", "n_samples"}    # per-sample random numbers: tested in test_random.py


def test_every_math_name_is_tested_here_or_in_body_tests():
    assert set(hm.__all__) == set(UNARY) | set(BINARY) | set(COMPARE) | OTHERS


def unary_kernel(fn):
    @hawk.kernel
    def k(x: Scalar):
        return fn(x)
    return k


def binary_kernel(fn):
    @hawk.kernel
    def k(x: Scalar, y: Scalar):
        return fn(x, y)
    return k


def uniform(rng, lo, hi, dtype, n=N):
    return rng.uniform(lo, hi, n).astype(dtype)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_against_numpy(name, dtype, rng):
    oracle, lo, hi = UNARY[name]
    x = uniform(rng, lo, hi, dtype)
    got = unary_kernel(getattr(hm, name))(x)
    want = oracle(x)
    assert got.dtype == want.dtype == dtype
    np.testing.assert_allclose(got, want, rtol=RTOL[dtype], atol=0)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_against_numpy(name, dtype, rng):
    oracle, (lo1, hi1), (lo2, hi2) = BINARY[name]
    x, y = uniform(rng, lo1, hi1, dtype), uniform(rng, lo2, hi2, dtype)
    got = binary_kernel(getattr(hm, name))(x, y)
    want = oracle(x, y)
    assert got.dtype == want.dtype == dtype
    np.testing.assert_allclose(got, want, rtol=RTOL[dtype], atol=0)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("name", sorted(COMPARE))
def test_comparisons(name, dtype, rng):
    x = uniform(rng, -2, 2, dtype)
    y = x.copy()
    y[::2] = uniform(rng, -2, 2, dtype, N // 2)               # half equal, half not
    got = binary_kernel(getattr(hm, name))(x, y)
    assert got.dtype == np.bool_
    np.testing.assert_array_equal(got, COMPARE[name](x, y))


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("name,ref", [("erf", math.erf), ("erfc", math.erfc)])
def test_erf_erfc_against_math_module(name, ref, dtype, rng):
    x = uniform(rng, -3, 3, dtype)
    x[:3] = [0.0, -0.5, 2.5]
    got = unary_kernel(getattr(hm, name))(x)
    want = np.array([ref(float(v)) for v in x])
    assert got.dtype == dtype
    np.testing.assert_allclose(got, want.astype(dtype), rtol=RTOL[dtype], atol=1e-300)


def test_python_operators_against_numpy(rng):
    @hawk.kernel
    def ops(x: Scalar, y: Scalar):
        return (x + y, x - y, x * y, x / y, x // y, x % y, x ** 2, -x, +x, abs(x),
                2.0 - x, 3.0 / y, 2.0 ** x, 7.0 // y, 5.0 % y)
    x, y = rng.uniform(-4, 4, N), rng.uniform(0.5, 3, N)
    want = (x + y, x - y, x * y, x / y, x // y, x % y, x ** 2, -x, +x, abs(x),
            2.0 - x, 3.0 / y, 2.0 ** x, 7.0 // y, 5.0 % y)
    for g, w in zip(ops(x, y), want):
        np.testing.assert_allclose(g, w, rtol=1e-14)


@pytest.mark.parametrize("a_dtype,b_dtype", [
    (np.float32, np.float64), (np.float64, np.float32), (np.float32, np.int32), (np.int32, np.uint32),
    (np.uint32, np.float32), (np.int32, np.int32), (np.bool_, np.float32), (np.float32, np.float32),
])
def test_mixed_dtypes_promote_as_numpy(a_dtype, b_dtype, rng):
    @hawk.kernel
    def mix(a: Scalar, b: Scalar):
        return a * b, a + b, hm.maximum(a, b)
    a = (rng.random(8) * 4).astype(a_dtype)
    b = (rng.random(8) * 4 + 1).astype(b_dtype)
    for got, want in zip(mix(a, b), (a * b, a + b, np.maximum(a, b))):
        assert got.dtype == want.dtype, (got.dtype, want.dtype)
        np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.mark.parametrize("dtype", FLOATS)
def test_python_numbers_are_weak(dtype, rng):
    @hawk.kernel
    def weak(x: Scalar, a: Param):
        return x * 2.5 + a, hm.sqrt(x) * a, x + 1
    x = rng.random(8).astype(dtype)
    for got, want in zip(weak(x, 0.5), (x * 2.5 + 0.5, np.sqrt(x) * 0.5, x + 1)):
        assert got.dtype == want.dtype == dtype


def test_uniform_math_on_python_params():
    @hawk.kernel
    def u(x: Scalar, a: Param):
        return x * hm.exp(a) + hm.atan2(a, 2.0)
    x = np.arange(3.0)
    np.testing.assert_allclose(u(x, 0.7), x * math.exp(0.7) + math.atan2(0.7, 2.0), rtol=1e-15)


def test_math_functions_compute_at_once_on_python_numbers():
    assert float(hm.sin(0.5)) == math.sin(0.5)
    assert float(hm.erf(0.3)) == math.erf(0.3)
    assert float(hm.hypot(3.0, 4.0)) == 5.0
    assert float(hm.clip(7.0, 0.0, 1.0)) == 1.0
    np.testing.assert_allclose(hm.dot(np.array([1.0, 2.0]), np.array([3.0, 4.0])), 11.0)


# ---------------------------------------------------------------------------------------------
# casts

def test_casts_follow_numpy_astype(rng):
    @hawk.kernel
    def casts(x: Scalar):
        return hm.int32(x), hm.uint32(hm.abs(x)), hm.float32(x), hm.float64(hm.float32(x))
    x = rng.uniform(-100, 100, N)
    x[:4] = [-2.7, 2.7, -0.5, 0.5]                         # truncation toward zero
    i32, u32, f32, f64 = casts(x)
    for got, want in ((i32, x.astype(np.int32)), (u32, np.abs(x).astype(np.uint32)),
                      (f32, x.astype(np.float32)), (f64, x.astype(np.float32).astype(np.float64))):
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)


def test_real_passes_floats_and_widens_integers():
    @hawk.kernel
    def r(x: Scalar):
        return hm.real(x) / 2
    assert r(np.arange(4, dtype=np.int32)).dtype == np.float64
    np.testing.assert_array_equal(r(np.arange(4, dtype=np.int32)), np.arange(4) / 2)
    assert r(np.ones(3, np.float32)).dtype == np.float32


# ---------------------------------------------------------------------------------------------
# logic, choice, clipping, classification

def test_logical_ops(rng):
    @hawk.kernel
    def logic(a: Scalar, b: Scalar):
        return (hm.logical_and(a, b), hm.logical_or(a, b), hm.logical_not(a), a & b, a | b, ~a,
                hm.logical_and(a, True))
    a, b = rng.random(N) < 0.5, rng.random(N) < 0.5
    want = (a & b, a | b, ~a, a & b, a | b, ~a, a)
    for got, w in zip(logic(a, b), want):
        assert got.dtype == np.bool_
        np.testing.assert_array_equal(got, w)


@pytest.mark.parametrize("dtype", FLOATS)
def test_where_and_select(dtype, rng):
    @hawk.kernel
    def choose(x: Scalar, y: Scalar):
        return hm.where(x > y, x, y), hm.select(x < 0, -x, 0.0), hm.where(hm.int32(x), 1.0, 2.0)
    x, y = uniform(rng, -2, 2, dtype), uniform(rng, -2, 2, dtype)
    got = choose(x, y)
    want = (np.where(x > y, x, y), np.where(x < 0, -x, dtype(0)), np.where(x.astype(np.int32) != 0, 1.0, 2.0))
    for g, w in zip(got, want):
        assert g.dtype == w.dtype
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("dtype", FLOATS)
def test_clip(dtype, rng):
    @hawk.kernel
    def c(x: Scalar, lo: Param, hi: Scalar):
        return hm.clip(x, lo, hi)
    x, hi = uniform(rng, -3, 3, dtype), uniform(rng, 0, 2, dtype)
    got = c(x, -1.0, hi)
    assert got.dtype == dtype
    np.testing.assert_array_equal(got, np.clip(x, -1.0, hi))


@pytest.mark.parametrize("dtype", FLOATS)
def test_isfinite_isnan_isinf(dtype):
    @hawk.kernel
    def cls(x: Scalar):
        return hm.isfinite(x), hm.isnan(x), hm.isinf(x)
    x = np.array([0.0, -1.5, np.inf, -np.inf, np.nan, 3.0], dtype)
    for got, oracle in zip(cls(x), (np.isfinite, np.isnan, np.isinf)):
        assert got.dtype == np.bool_
        np.testing.assert_array_equal(got, oracle(x))


def test_nonfinite_constants_in_a_body():
    @hawk.kernel
    def guard(x: Scalar):
        return hm.where(x > 0, x, math.inf), hm.minimum(x, -math.inf)
    x = np.array([1.0, -1.0])
    a, b = guard(x)
    np.testing.assert_array_equal(a, [1.0, np.inf])
    np.testing.assert_array_equal(b, [-np.inf, -np.inf])


@pytest.mark.parametrize("shape", [(7,), (5, 8), (3, 16), (2, 3, 24), (4, 7), (100, 8), (30, 40)])
@pytest.mark.parametrize("dtype", [np.bool_, np.float64, np.float32, np.int64])
def test_sample_sums_over_every_row_layout(shape, dtype):
    # the emitter picks count_nonzero, bit counts of bool words, a matrix-vector product or
    # add.reduce by layout: each must equal np.sum over the sample axis
    from hawk_fx.emit.numpy import _sample_sum
    x = (np.random.default_rng(3).random(shape) * 10).astype(dtype) if dtype != np.bool_ else \
        np.random.default_rng(3).random(shape) < 0.4
    out = np.empty(shape[:-1] + (1,), np.int64 if dtype in (np.bool_, np.int64) else dtype)
    _sample_sum(x, out)
    np.testing.assert_allclose(out[..., 0], x.sum(-1, dtype=out.dtype), rtol=1e-6)
