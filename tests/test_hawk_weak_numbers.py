"""Python numbers are weak (NEP 50) in every operation of a kernel body: float32 in, float32 out,
whatever the order of the operands, in vec, where/select, a per-sample `if` between two numbers,
and hm.<f>(number). The oracle is NumPy with the same numbers as Python scalars (weak) where
NumPy keeps them weak, and as float32 values where a choice of two numbers is made per sample."""
import numpy as np
from hypothesis import given, settings, strategies as st

import hawk_fx as hawk
import hawk_fx.math as hm
from hawk_fx import Param, Scalar, Vector

X = np.linspace(-2.0, 2.0, 37, dtype=np.float32) + np.float32(0.0137)   # no exact zero: atan2 at a signed zero depends on summation order


@hawk.kernel
def vec_first(x: Scalar, p: Param) -> Vector[3]:
    return hm.vec(p, x, x)


@hawk.kernel
def vec_second(x: Scalar, p: Param) -> Vector[3]:
    return hm.vec(x, p, x)


def test_the_audit_repro_vec_keeps_float32_whatever_the_order():
    for k in (vec_first, vec_second):
        got = k(X, 0.1)
        assert got.dtype == np.float32, k.name
    np.testing.assert_array_equal(vec_first(X, 0.1), np.stack([np.broadcast_to(np.float32(0.1), X.shape), X, X]))


def test_a_vector_of_numbers_is_weak():
    @hawk.kernel
    def f(x: Scalar) -> Scalar:
        v = hm.vec(1.0, -0.5, 0.25)
        return hm.dot(hm.vec(x, x, x), v) + v[1]
    got = f(X)
    assert got.dtype == np.float32
    want = np.einsum("i...,i...->...", np.stack([X, X, X]), np.array([1.0, -0.5, 0.25], np.float32)) - 0.5
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_products_of_numbers_only_are_weak_too():
    """dot, norm, outer, cross and einsum of Vectors of Python numbers are Python numbers: a float32
    body stays float32 (NumPy: the same numbers as Python floats, added to the float32 plane)."""
    @hawk.kernel
    def f(x: Scalar) -> Scalar:
        a, b = hm.vec(1.0, 2.0, 0.5), hm.vec(3.0, -4.0, 2.0)
        m = hm.outer(a, b)
        return x * hm.dot(a, b) + hm.norm(b) + hm.cross(a, b)[2] + m[1][0] + hm.einsum("i,i,i->", a, b, a)
    got = f(X)
    assert got.dtype == np.float32
    a, b = [1.0, 2.0, 0.5], [3.0, -4.0, 2.0]
    dot = sum(p * q for p, q in zip(a, b))
    norm = sum(q * q for q in b) ** 0.5
    cross_z = a[0] * b[1] - a[1] * b[0]
    triple = sum(p * q * p for p, q in zip(a, b))
    want = X * np.float32(dot) + np.float32(norm) + np.float32(cross_z) + np.float32(a[1] * b[0]) + np.float32(triple)
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_where_between_two_numbers_in_a_float32_body():
    @hawk.kernel
    def f(x: Scalar) -> Scalar:
        return x * 1.5 + hm.where(x > 0.5, 0.1, 0.7)
    got = f(X)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, X * 1.5 + np.where(X > 0.5, np.float32(0.1), np.float32(0.7)))


def test_a_per_sample_if_between_two_numbers():
    @hawk.kernel
    def f(x: Scalar) -> Scalar:
        if x > 0.5:
            y = 0.1
        else:
            y = 0.3
        return x - y
    got = f(X)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, X - np.where(X > 0.5, np.float32(0.1), np.float32(0.3)))


def test_math_of_a_number_is_a_weak_number():
    @hawk.kernel
    def f(x: Scalar) -> Scalar:
        return x * hm.exp(0.5) + hm.atan2(1.0, 2.0)
    got = f(X)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, X * np.exp(0.5).item() + np.arctan2(1.0, 2.0).item())
    assert type(hm.sin(1.0)) is float and hm.uint32(3).dtype == np.uint32     # an explicit cast stays strong


def test_a_choice_of_two_numbers_alone_is_float64_as_a_returned_param_is():
    @hawk.kernel
    def f(x: Scalar) -> Scalar:
        return hm.where(x > 0.5, 0.1, 0.7)
    got = f(X)
    assert got.dtype == np.float64
    np.testing.assert_array_equal(got, np.where(X > 0.5, 0.1, 0.7))


# ---------------------------------------------------------------------------------------------
# the fuzzer: random float32 bodies over a plane x, a Python-number Param p and literals

LEAF = st.one_of(st.just(("x",)), st.just(("p",)),
                 st.floats(-2.0, 2.0, allow_nan=False).map(lambda v: ("lit", round(v, 3))))
UNARY = {"sin": (hm.sin, np.sin), "tanh": (hm.tanh, np.tanh), "cos": (hm.cos, np.cos)}
BINARY = {"add": (lambda a, b: a + b,) * 2, "sub": (lambda a, b: a - b,) * 2, "mul": (lambda a, b: a * b,) * 2,
          "max": (hm.maximum, np.maximum), "atan2": (hm.atan2, np.arctan2)}


def _extend(sub):
    return st.one_of(
        st.tuples(st.just("un"), st.sampled_from(sorted(UNARY)), sub),
        st.tuples(st.just("bin"), st.sampled_from(sorted(BINARY)), sub, sub),
        st.tuples(st.just("where"), sub, sub, sub),
        st.tuples(st.just("vec"), sub, sub, sub))


TREES = st.recursive(LEAF, _extend, max_leaves=8)


def build(t, x, p):
    """The body, in hawk_fx.math."""
    tag = t[0]
    if tag == "x":
        return x
    if tag == "p":
        return p
    if tag == "lit":
        return t[1]
    if tag == "un":
        return UNARY[t[1]][0](build(t[2], x, p))
    if tag == "bin":
        return BINARY[t[1]][0](build(t[2], x, p), build(t[3], x, p))
    if tag == "where":
        return hm.where(build(t[1], x, p) > 0.25, build(t[2], x, p), build(t[3], x, p))
    return (hm.dot(hm.vec(build(t[1], x, p), build(t[2], x, p), build(t[3], x, p)), hm.vec(x, -0.5, p))
            + hm.dot(hm.vec(1.0, 2.0), hm.vec(build(t[1], x, p), -0.25 * x)))


def reference(t, x, p):
    """The same body in float64 NumPy."""
    tag = t[0]
    if tag == "x":
        return x.astype(np.float64)
    if tag == "p":
        return p
    if tag == "lit":
        return t[1]
    if tag == "un":
        return UNARY[t[1]][1](reference(t[2], x, p))
    if tag == "bin":
        return BINARY[t[1]][1](reference(t[2], x, p), reference(t[3], x, p))
    if tag == "where":
        return np.where(reference(t[1], x, p) > 0.25, reference(t[2], x, p), reference(t[3], x, p))
    x64 = x.astype(np.float64)
    return (reference(t[1], x, p) * x64 - 0.5 * reference(t[2], x, p) + p * reference(t[3], x, p)
            + reference(t[1], x, p) - 0.5 * x64)


@settings(max_examples=80, deadline=None)
@given(tree=TREES, p=st.floats(-2.0, 2.0, allow_nan=False).map(lambda v: round(v, 3)))
def test_fuzzed_float32_bodies_stay_float32_and_match_numpy(tree, p):
    def body(x: Scalar, q: Param) -> Scalar:
        return x * 0.5 + build(tree, x, q)
    k = hawk.kernel(body)
    got = k(X, p)
    assert got.dtype == np.float32, tree
    want = X.astype(np.float64) * 0.5 + reference(tree, X, p)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5 * (1 + np.abs(want).max()), err_msg=str(tree))
