"""Each derivative API's refusals name the API the user called, not the one it is built on:
jacfwd and hessian run jvp inside, linearize replays a jvp, linear_transpose pulls back a vjp.
The refusal also names the user's function and line, and writes nothing into the arguments."""
import numpy as np
import pytest

import eagle_fx as ef
import hawk_fx as hawk
from hawk_fx import Scalar
from conftest import file_and_line, refused


@hawk.kernel
def sq(x: Scalar) -> Scalar:
    return x * x


@hawk.kernel
def total(x: Scalar) -> Scalar:
    return hawk.sum(x * x)


@ef.Graph.builder
def squares(x):
    g = ef.Graph()
    g.result = sq(x)
    return g


@ef.Graph.builder
def sum_of_squares(x):
    g = ef.Graph()
    g.result = total(x)
    return g


def doubled(x):
    return squares(x * 2.0)                   # NumPy outside a builder: a constant to the graph


def doubled_total(x):
    return sum_of_squares(x * 2.0)


CALLS = {
    "jacfwd": (doubled, lambda f, x: ef.jacfwd(f)(x)),
    "jacrev": (doubled, lambda f, x: ef.jacrev(f)(x)),
    "hessian": (doubled_total, lambda f, x: ef.hessian(f)(x)),
    "jvp": (doubled, lambda f, x: ef.jvp(f, (x,), (np.ones_like(x),))),
    "linearize": (doubled, lambda f, x: ef.linearize(f, x)[1](np.ones_like(x))),
    "linear_transpose": (doubled, lambda f, x: ef.linear_transpose(f, x)),
    "grad": (doubled_total, lambda f, x: ef.grad(f)(x)),
}


@pytest.mark.parametrize("api", list(CALLS))
def test_a_refusal_names_the_api_called(api):
    f, call = CALLS[api]
    x = np.random.default_rng(len(api)).normal(size=5)
    name, line = file_and_line(f, "x * 2.0")
    msg = refused(Exception, lambda: call(f, x), f"eagle_fx.{api}: {f.__name__} ", untouched=(x,))
    assert name in msg
    others = {f"eagle_fx.{a}:" for a in ("jvp", "vjp", "jacfwd", "jacrev", "hessian")} - {f"eagle_fx.{api}:"}
    assert not any(o in msg for o in others), msg


def test_linearize_names_itself_for_a_tangent_of_the_wrong_shape():
    x = np.linspace(0.5, 2.0, 4)
    y, f_jvp = ef.linearize(squares, x)
    np.testing.assert_allclose(y, x * x, rtol=1e-15)
    np.testing.assert_allclose(f_jvp(np.ones(4)), 2.0 * x, rtol=1e-15)      # d(x^2) = 2x dx
    refused(ValueError, lambda: f_jvp(np.ones(3)), "eagle_fx.linearize: the tangent for argument x has shape (3,)")
