"""hawk_fx.diff.vjp with respect to a Param given as a Python float: its gradient, not 0 (a Python
number is a weak constant of the kernel; differentiated, it is promoted to a one-cell array, as
JAX's grad takes a Python float). Oracle: the closed form, and the same call with a one-cell array."""
import numpy as np
from hypothesis import given, settings, strategies as st

import hawk_fx as hawk
from hawk_fx import Param, Scalar
from hawk_fx.diff import vjp


@hawk.kernel
def scaled_square(x: Scalar, a: Param, b: Param) -> Scalar:
    return a * x * x + b * x


@settings(max_examples=30, deadline=None)
@given(st.floats(-3.0, 3.0), st.floats(-3.0, 3.0), st.lists(st.floats(-2.0, 2.0), min_size=1, max_size=6))
def test_a_python_float_param_gets_its_gradient(a, b, xs):
    x = np.array(xs)
    ct = np.linspace(0.5, 1.5, len(xs))
    got = vjp(scaled_square, wrt=("x", "a", "b"))(x, a, b, cotangent=ct)
    assert np.shape(got["a"]) == () and np.shape(got["b"]) == ()
    np.testing.assert_allclose(got["a"], np.sum(ct * x * x), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got["b"], np.sum(ct * x), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got["x"], ct * (2 * a * x + b), rtol=1e-12, atol=1e-12)
    as_cells = vjp(scaled_square, wrt=("a", "b"))(x, np.array([a]), np.array([b]), cotangent=ct)
    np.testing.assert_allclose(as_cells["a"], [got["a"]], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(as_cells["b"], [got["b"]], rtol=1e-12, atol=1e-12)
