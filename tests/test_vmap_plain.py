"""vmap, grad, jvp and jacfwd of plain functions (no builder of their own) that compute on their
arguments in Python before handing them to a builder: each answer equals a Python loop over the
instances and jax.vmap / jax.grad of the same computation in jax.numpy, or the call is refused
with a message that says what to write instead. A Mutable argument is written back as the loop
writes it."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import eagle_fx as eagle
import hawk_fx as hawk
from conftest import refused
from hawk_fx import Mutable, Scalar
from eagle_fx.transforms.program import TransformError
from eagle_fx.transforms.vmap import VmapError

jax.config.update("jax_enable_x64", True)


@hawk.kernel
def dbl(x: Scalar) -> Scalar:
    return 2.0 * x


@hawk.kernel
def sumsq(x: Scalar) -> Scalar:
    return hawk.sum(x * x)


@hawk.kernel
def acc(x: Scalar, m: Mutable[Scalar]):
    m = m + x


@eagle.Graph.builder
def doubled(x):
    g = eagle.Graph()
    g.result = dbl(x)
    return g


@eagle.Graph.builder
def loss(x):
    g = eagle.Graph()
    g.result = sumsq(x)
    return g


@eagle.Graph.builder
def accumulate(x, m):
    g = eagle.Graph()
    acc(x, m)
    g.result = dbl(x)
    return g


X = np.linspace(-1.0, 2.0, 15).reshape(3, 5)


def loop(fn, *batched):
    """The oracle: the function called on each instance in a Python loop, results stacked."""
    return np.stack([np.asarray(fn(*(a[b] for a in batched))) for b in range(len(batched[0]))])


# -- vmap: every form equals the loop and jax.vmap, or is refused --------------------------------

@pytest.mark.parametrize("form, eagle_fn, numpy_fn, jax_fn", [
    ("numpy on the argument", lambda x: doubled(x * 3.0 + np.sin(x)),
     lambda x: doubled(x * 3.0 + np.sin(x))(), lambda x: 2 * (x * 3.0 + jnp.sin(x))),
    ("a view of the argument", lambda x: doubled(x[1:]), lambda x: doubled(x[1:])(), lambda x: 2 * x[1:]),
    ("a strided view", lambda x: doubled(x[::2]), lambda x: doubled(x[::2])(), lambda x: 2 * x[::2]),
    ("a reversed copy", lambda x: doubled(x[::-1].copy()), lambda x: doubled(x[::-1].copy())(), lambda x: 2 * x[::-1]),
    ("grad of a builder on numpy of the argument", lambda x: eagle.grad(loss)(x * 2.0),
     lambda x: eagle.grad(loss)(x * 2.0), lambda x: jax.grad(lambda u: jnp.sum(u * u))(x * 2.0)),
    ("the argument itself", lambda x: doubled(x), lambda x: doubled(x)(), lambda x: 2 * x),
])
def test_vmap_of_a_plain_function_equals_the_loop_and_jax(form, eagle_fn, numpy_fn, jax_fn):
    got = eagle.vmap(eagle_fn)(X)
    np.testing.assert_allclose(got, loop(numpy_fn, X), rtol=1e-13, err_msg=form)
    np.testing.assert_allclose(got, jax.vmap(jax_fn)(jnp.asarray(X)), rtol=1e-13, err_msg=form)
    # and again with other values, same layout (a cached graph must not answer with the old ones)
    Y = X[::-1] * 1.5
    np.testing.assert_allclose(eagle.vmap(eagle_fn)(Y), loop(numpy_fn, Y), rtol=1e-13, err_msg=form)


def test_vmap_in_axes_1_and_a_shared_argument_made_in_python():
    f = eagle.vmap(lambda x, c: doubled(x * c), in_axes=(1, None))
    got = f(X.T.copy(), 0.5)
    np.testing.assert_allclose(got, loop(lambda x: doubled(x * 0.5)(), X), rtol=1e-13)
    np.testing.assert_allclose(got, jax.vmap(lambda x: 2 * x * 0.5, in_axes=1)(jnp.asarray(X.T)), rtol=1e-13)


def test_an_array_made_in_python_that_is_the_same_for_every_instance_is_shared():
    w = np.arange(5.0)
    got = eagle.vmap(lambda x: eagle.jvp(doubled, (x,), (w * 1.0,)))(X)
    np.testing.assert_allclose(got[0], 2 * X)
    np.testing.assert_allclose(got[1], np.tile(2 * w, (3, 1)))


def test_vmap_of_a_function_that_takes_another_python_path_per_instance_is_refused():
    def pick(x):
        return doubled(x * 1.0) if x.view(np.ndarray)[0] > 0 else doubled(x[1:3] * 1.0)   # past the guard
    # caught when instance 0 is staged: staged again on other values, it takes the other path
    refused(TypeError, lambda: eagle.vmap(pick)(np.stack([X[1], -X[2]])), "pick", "stages a different graph",
            "Decide on the device")


@pytest.mark.parametrize("decide", [lambda x: x[0] > 0, lambda x: float(x.max()) > 0, lambda x: np.any(x * 2.0 > 0),
                                    lambda x: x.sum().item() > 0, lambda x: np.stack([x, x])[0, 0] > 0,
                                    lambda x: np.dot(x, x) > 1.0, lambda x: int(np.argmax(x)) == 0,
                                    lambda x: any(v > 0 for v in x)])
def test_a_python_decision_on_argument_values_is_refused(decide):
    def pick(x):
        return doubled(x) if decide(x) else doubled(-x)

    def pick_loss(x):
        return loss(x) if decide(x) else loss(x * x)
    for call in (lambda: eagle.vmap(pick)(np.stack([X[1], -X[2]])), lambda: eagle.grad(pick_loss)(X[1]),
                 lambda: eagle.jvp(pick, (X[1],), (X[0],)), lambda: eagle.jacfwd(pick)(X[1]),
                 lambda: eagle.vmap(lambda x: eagle.grad(pick_loss)(x))(X)):
        refused(TypeError, call, "pick", "reads the value of an array computed from its arguments in Python",
                "Decide on the device")


def test_shapes_and_python_numbers_stay_readable_while_staging():
    def scaled(x, c):
        assert x.shape == (5,) and len(x) == 5 and x.ndim == 1
        return doubled(x * c) if c > 0 else doubled(x)
    np.testing.assert_allclose(eagle.vmap(scaled, in_axes=(0, None))(X, 2.0), loop(lambda x: 4 * x, X))


@pytest.mark.parametrize("fn", [lambda x: x * 2.0 + np.sin(x), lambda x: dbl(x), lambda x: doubled(x)()])
def test_vmap_of_a_function_returning_values_is_refused_with_what_to_write(fn):
    refused(TypeError, lambda: eagle.vmap(fn)(X), "returned ndarray, not a Graph", "Write it as a builder")


# -- derivatives of plain functions: jax.grad's answer, or refused --------------------------------

def test_derivatives_through_python_arithmetic_on_the_argument_are_refused():
    x = X[0].copy()
    for call in (lambda: eagle.grad(lambda u: loss(u * 2.0))(x),
                 lambda: eagle.jvp(lambda u: doubled(u * 2.0), (x,), (np.ones(5),)),
                 lambda: eagle.jacfwd(lambda u: doubled(u * 2.0))(x),
                 lambda: eagle.vmap(eagle.grad(lambda u: loss(u * 2.0)))(X)):
        refused(TransformError, call, "computed in Python from u", "the derivative through it would be lost",
                "inside a builder")
    refused(TransformError, lambda: eagle.grad(lambda u: loss(u[1:]))(x), "a view of argument")
    refused(TypeError, lambda: eagle.grad(lambda u: np.sum(u * u))(x), "not a Graph")


def test_derivatives_of_plain_functions_passing_the_argument_through_match_jax():
    x = X[1].copy()
    np.testing.assert_allclose(eagle.grad(lambda u: loss(u))(x), jax.grad(lambda u: jnp.sum(u * u))(x), rtol=1e-13)
    _, t = eagle.jvp(lambda u: doubled(u), (x,), (np.arange(5.0),))
    np.testing.assert_allclose(t, jax.jvp(lambda u: 2 * u, (x,), (np.arange(5.0),))[1], rtol=1e-13)
    np.testing.assert_allclose(eagle.jacfwd(lambda u: doubled(u))(x), jax.jacfwd(lambda u: 2 * u)(x), rtol=1e-13)
    # a shared argument scaled in Python is a constant to the derivative, as to jax.grad
    g = eagle.vmap(eagle.grad(lambda u, c: loss2(u, c * 2.0)), in_axes=(0, None))(X, np.full(5, 0.5))
    want = jax.vmap(jax.grad(lambda u, c: jnp.sum((u * c * 2.0) ** 2)), in_axes=(0, None))(X, np.full(5, 0.5))
    np.testing.assert_allclose(g, want, rtol=1e-13)


@hawk.kernel
def sumsq_scaled(x: Scalar, c: Scalar) -> Scalar:
    return hawk.sum((x * c) ** 2)


@eagle.Graph.builder
def loss2(x, c):
    g = eagle.Graph()
    g.result = sumsq_scaled(x, c)
    return g


def test_vmap_of_grad_with_a_batched_argument_made_in_python_that_is_not_differentiated():
    C = np.linspace(0.5, 1.5, 15).reshape(3, 5)
    g = eagle.vmap(eagle.grad(lambda u, c: loss2(u, c * 2.0)), in_axes=(0, 0))(X, C)
    np.testing.assert_allclose(g, loop(lambda u, c: eagle.grad(loss2)(u, c * 2.0), X, C), rtol=1e-13)
    want = jax.vmap(jax.grad(lambda u, c: jnp.sum((u * c * 2.0) ** 2)))(X, C)
    np.testing.assert_allclose(g, want, rtol=1e-13)


# -- a Mutable argument under vmap of a plain function: written back as the loop writes it --------

def test_vmap_of_a_lambda_over_a_builder_writes_the_mutable_back():
    M, want_M = np.zeros((3, 5)), np.zeros((3, 5))
    want = np.stack([accumulate(X[b], want_M[b])() for b in range(3)])
    f = eagle.vmap(lambda x, m: accumulate(x, m))
    np.testing.assert_allclose(f(X, M), want)
    np.testing.assert_allclose(M, want_M)
    np.testing.assert_allclose(f(X, M), want)            # a cache hit writes it again: M holds 2 X
    np.testing.assert_allclose(M, 2 * X)
    V = np.ones((3, 5))
    f2 = eagle.vmap(lambda x, m: accumulate(x[1:], m[1:]))       # through views of the instances
    f2(X, V)
    np.testing.assert_allclose(V[:, 1:], 1 + X[:, 1:])
    np.testing.assert_allclose(V[:, 0], 1.0)


def test_a_read_only_mutable_is_refused_and_nothing_is_written():
    M = np.zeros((3, 5))
    M.flags.writeable = False
    f = eagle.vmap(lambda x, m: accumulate(x, m))
    refused(ValueError, lambda: f(X, M), "writes an argument in place", "read-only")
    M2 = np.zeros((3, 5))
    f(X, M2)                                              # the layout now cached: refused on a hit too
    refused(ValueError, lambda: f(X, M), "read-only")
    assert not M.any()


def test_nested_vmap_writes_the_mutable_back_or_refuses_a_copy():
    X3 = np.arange(24.0).reshape(2, 3, 4)
    want = np.zeros((2, 3, 4))
    for i in range(2):
        for j in range(3):
            accumulate(X3[i, j], want[i, j])()
    M = np.zeros((2, 3, 4))
    out = eagle.vmap(eagle.vmap(lambda x, m: accumulate(x, m)))(X3, M)
    np.testing.assert_allclose(out, 2 * X3)
    np.testing.assert_allclose(M, want)
    Mt = np.zeros((3, 2, 4))            # batch axes swapped: merging them needs a copy the writes would miss
    refused(VmapError, lambda: eagle.vmap(eagle.vmap(lambda x, m: accumulate(x, m)), in_axes=(0, 1))(X3, Mt),
            "argument 1 is written in place", "a copy of it", untouched=(Mt,))
