"""Sample reductions of one-cell values. A one-cell plane broadcast over the samples, a Param and a
number stand for the same value in every sample: a reduction over n samples sees n copies of it.
The oracle is the same reduction of the plane spread to n samples with np.full, in NumPy."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import hawk_fx as hawk
import hawk_fx.diff as hd
from hawk_fx import Param, Scalar

REDUCE = {"sum": (hawk.sum, np.sum), "mean": (hawk.mean, np.mean), "max": (hawk.max, np.max),
          "min": (hawk.min, np.min)}


def kernels(red):
    @hawk.kernel
    def plane(x: Scalar, c: Scalar) -> Scalar:
        return x * 0 + red(c * c)

    @hawk.kernel
    def param(x: Scalar, p: Param) -> Scalar:
        return x * 0 + red(p)

    @hawk.kernel
    def literal(x: Scalar) -> Scalar:
        return x * 0 + red(2.5)
    return plane, param, literal


def test_the_audit_repro_a_sum_of_a_one_cell_plane_counts_every_sample():
    @hawk.kernel
    def total(x: Scalar, c: Scalar) -> Scalar:
        return x * 0 + hawk.sum(c)
    x = np.arange(4.0)
    np.testing.assert_array_equal(total(x, np.array([3.0])), np.full(4, 12.0))
    np.testing.assert_array_equal(total(x, np.full(4, 3.0)), np.full(4, 12.0))


@pytest.mark.parametrize("name", list(REDUCE))
@pytest.mark.parametrize("n", [1, 4, 40_000])
def test_every_reduction_of_a_one_cell_value_sees_n_samples(name, n):
    red, ref = REDUCE[name]
    plane, param, literal = kernels(red)
    x, c = np.arange(float(n)), np.array([-1.5])
    want = ref(np.full(n, c[0] * c[0]))
    np.testing.assert_allclose(plane(x, c), np.full(n, want), rtol=1e-15)
    np.testing.assert_allclose(plane(x, np.full(n, c[0])), np.full(n, want), rtol=1e-15)
    np.testing.assert_allclose(param(x, c), np.full(n, ref(np.full(n, c[0]))), rtol=1e-15)
    np.testing.assert_allclose(param(x, -1.5), np.full(n, ref(np.full(n, -1.5))), rtol=1e-15)
    np.testing.assert_allclose(literal(x), np.full(n, ref(np.full(n, 2.5))), rtol=1e-15)


def test_an_int_and_a_bool_cell_sum_as_numpy_does():
    @hawk.kernel
    def count(x: Scalar, c: Param) -> Scalar:
        return x * 0 + hawk.sum(c)
    x = np.arange(5.0)
    np.testing.assert_array_equal(count(x, np.array([3], np.int32)), np.full(5, np.sum(np.full(5, 3, np.int32))))

    @hawk.kernel
    def truths(x: Scalar, c: Scalar) -> Scalar:
        return x * 0 + hawk.sum(c > 0.0)
    np.testing.assert_array_equal(truths(x, np.array([1.0])), np.full(5, 5.0))
    np.testing.assert_array_equal(truths(x, np.array([-1.0])), np.zeros(5))


def test_float32_cells_stay_float32():
    @hawk.kernel
    def total(x: Scalar, c: Scalar) -> Scalar:
        return x * 0 + hawk.sum(c)
    got = total(np.arange(4, dtype=np.float32), np.array([3.0], np.float32))
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, np.full(4, 12.0, np.float32))


@pytest.mark.parametrize("name", ["sum", "mean"])
def test_the_gradient_of_a_reduced_one_cell_plane_sums_its_cotangent(name):
    """d/dc of sum over n samples of c*c is 2c n for a one-cell c: the cotangent of every sample."""
    red, ref = REDUCE[name]

    @hawk.kernel
    def f(x: Scalar, c: Scalar) -> Scalar:
        return x + red(c * c)
    n = 6
    x, c = np.linspace(0.0, 1.0, n), np.array([0.7])
    ct = np.linspace(1.0, 2.0, n)
    got = hd.vjp(f, "c")(x, c, cotangent=ct)["c"]
    # the oracle: central differences of the NumPy function
    h = 1e-6
    fd = (np.dot(ct, x + ref(np.full(n, (c[0] + h) ** 2))) - np.dot(ct, x + ref(np.full(n, (c[0] - h) ** 2)))) / (2 * h)
    np.testing.assert_allclose(np.ravel(got), [fd], rtol=1e-6)


@settings(max_examples=30, deadline=None)
@given(name=st.sampled_from(list(REDUCE)), n=st.sampled_from([1, 2, 3, 32767, 32768, 32769, 70000]),
       first_cell=st.booleans(), value=st.floats(-10, 10, allow_nan=False))
def test_a_one_cell_plane_reduces_as_its_spread_plane(name, n, first_cell, value):
    """Either call first (one-cell, or spread to n samples): both give the spread plane's reduction."""
    red, ref = REDUCE[name]

    @hawk.kernel
    def f(x: Scalar, c: Scalar) -> Scalar:
        return x * 0 + red(c * 2.0)
    x = np.arange(float(n))
    want = np.full(n, ref(np.full(n, value * 2.0)))
    calls = [np.array([value]), np.full(n, value)]
    for c in (calls if first_cell else calls[::-1]):
        np.testing.assert_allclose(f(x, c), want, rtol=1e-12, atol=1e-12)
