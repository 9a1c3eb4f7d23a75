"""hawk_fx.math's stable functions and kink conventions against JAX: values and derivatives (by
eagle_fx.grad of a kernel summing the function over samples) in float32 and float64, on inputs
that include +-800, 0 and ties; every value and derivative finite where JAX's is."""
import numpy as np
import pytest

import eagle_fx as ef
import hawk_fx as hawk
from hawk_fx import Param, Scalar, Vector
from hawk_fx import math as hm

jax = pytest.importorskip("jax")
jax.config.update("jax_enable_x64", True)
jnp = jax.numpy
from jax.scipy.special import xlog1py as j_xlog1py  # noqa: E402
from jax.scipy.special import xlogy as j_xlogy  # noqa: E402

X = np.array([-800.0, -40.0, -3.0, -1.0, -0.5, 0.0, 0.25, 1.0, 2.0, 30.0, 800.0])
TOL = {np.float32: 3e-6, np.float64: 1e-13}

UNARY = {
    "sigmoid": (hm.sigmoid, jax.nn.sigmoid), "softplus": (hm.softplus, jax.nn.softplus),
    "log_sigmoid": (hm.log_sigmoid, jax.nn.log_sigmoid), "relu": (hm.relu, jax.nn.relu),
    "abs": (hm.abs, jnp.abs), "clip": (lambda x: hm.clip(x, 0.0, 1.0), lambda x: jnp.clip(x, 0.0, 1.0)),
    "stop_gradient": (lambda x: x * hm.stop_gradient(x), lambda x: x * jax.lax.stop_gradient(x)),
}


def _unary_loss(fn):
    @hawk.kernel
    def k(x: Scalar) -> Scalar:
        return hawk.sum(fn(x))

    @ef.Graph.builder
    def loss(x):
        g = ef.Graph()
        g.result = k(x)
        return g

    @hawk.kernel
    def value(x: Scalar) -> Scalar:
        return fn(x)
    return loss, value


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_values_and_derivatives_match_jax(name, dtype):
    ours, theirs = UNARY[name]
    x = np.concatenate([X, [1.0]]).astype(dtype)                       # 1.0: clip's upper bound
    loss, value = _unary_loss(ours)
    y = value(x)
    d = ef.grad(loss)(x)
    jy = np.asarray(jax.vmap(theirs)(x))
    jd = np.asarray(jax.vmap(jax.grad(theirs))(x))
    assert y.dtype == dtype and d.dtype == dtype
    assert np.all(np.isfinite(y)) and np.all(np.isfinite(d))
    np.testing.assert_allclose(y, jy, rtol=TOL[dtype], atol=TOL[dtype])
    np.testing.assert_allclose(d, jd, rtol=TOL[dtype], atol=TOL[dtype])


def test_kink_conventions_are_jaxs():
    loss_abs, _ = _unary_loss(hm.abs)
    loss_relu, _ = _unary_loss(hm.relu)
    loss_sp, _ = _unary_loss(hm.softplus)
    loss_clip, _ = _unary_loss(lambda x: hm.clip(x, 0.0, 1.0))
    z = np.zeros(1)
    assert ef.grad(loss_abs)(z)[0] == 1.0 and ef.grad(loss_relu)(z)[0] == 0.0
    assert ef.grad(loss_sp)(z)[0] == 0.5                     # softplus' slope at 0, not 1
    np.testing.assert_array_equal(ef.grad(loss_clip)(np.array([0.0, 1.0])), [0.5, 0.5])


BINARY = {
    "logaddexp": (hm.logaddexp, jnp.logaddexp, X, X[::-1]),
    "logaddexp_tie": (hm.logaddexp, jnp.logaddexp, X, X),
    "maximum_tie": (hm.maximum, jnp.maximum, X, np.where(np.arange(X.size) % 2, X, -X)),
    "minimum_tie": (hm.minimum, jnp.minimum, X, np.where(np.arange(X.size) % 2, X, 2 * X)),
    "xlogy": (hm.xlogy, j_xlogy, np.where(np.arange(X.size) % 3, X, 0.0), np.abs(X) + 0.5),
    "xlog1py": (hm.xlog1py, j_xlog1py, np.where(np.arange(X.size) % 3, X, 0.0), np.abs(X) - 0.5),
}


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_values_and_derivatives_match_jax(name, dtype):
    ours, theirs, a, b = BINARY[name]
    a, b = a.astype(dtype), b.astype(dtype)

    @hawk.kernel
    def k(x: Scalar, y: Scalar) -> Scalar:
        return hawk.sum(ours(x, y))

    @hawk.kernel
    def value(x: Scalar, y: Scalar) -> Scalar:
        return ours(x, y)

    @ef.Graph.builder
    def loss(x, y):
        g = ef.Graph()
        g.result = k(x, y)
        return g
    da, db = ef.grad(loss, argnums=(0, 1))(a, b)
    ja, jb = (np.asarray(v) for v in jax.vmap(jax.grad(theirs, argnums=(0, 1)))(a, b))
    np.testing.assert_allclose(value(a, b), np.asarray(jax.vmap(theirs)(a, b)), rtol=TOL[dtype], atol=TOL[dtype])
    np.testing.assert_allclose(da, ja, rtol=TOL[dtype], atol=TOL[dtype])
    np.testing.assert_allclose(db, jb, rtol=TOL[dtype], atol=TOL[dtype])
    assert np.all(np.isfinite(da)) and np.all(np.isfinite(db))


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
def test_logsumexp_over_a_vectors_components(dtype):
    @hawk.kernel
    def k(v: Vector[3]) -> Scalar:
        return hawk.sum(hm.logsumexp(v))

    @hawk.kernel
    def value(v: Vector[3]) -> Scalar:
        return hm.logsumexp(v)

    @ef.Graph.builder
    def loss(v):
        g = ef.Graph()
        g.result = k(v)
        return g
    v = np.stack([X, X[::-1], np.where(np.arange(X.size) % 2, X, 0.0)]).astype(dtype)     # (3, n): ties, +-800
    got, d = value(v), ef.grad(loss)(v)
    want = np.asarray(jax.vmap(jax.nn.logsumexp)(v.T))
    jd = np.asarray(jax.vmap(jax.grad(jax.nn.logsumexp))(v.T)).T
    np.testing.assert_allclose(got, want, rtol=TOL[dtype], atol=TOL[dtype])
    np.testing.assert_allclose(d, jd, rtol=TOL[dtype], atol=TOL[dtype])


def test_logistic_regression_matches_jax_step_by_step():
    rng = np.random.default_rng(3)
    feats, labels = rng.normal(size=(2, 40)), (rng.random(40) < 0.5).astype(np.float64)
    feats[:, :5] = 0.0                                         # margins exactly 0: softplus' kink

    @hawk.kernel
    def nll(x: Vector[2], y: Scalar, w: Vector[2], b: Param) -> Scalar:
        z = hm.dot(w, x) + b
        return hawk.sum(hm.softplus(z) - y * z)

    @ef.Graph.builder
    def loss(params, x, y):
        g = ef.Graph()
        g.result = nll(x, y, params["w"], params["b"])
        return g

    def jloss(params, x, y):
        z = params["w"] @ x + params["b"][0]
        return jnp.sum(jax.nn.softplus(z) - y * z)
    p = {"w": np.zeros((2, 1)), "b": np.zeros(1)}
    jp = {"w": np.zeros(2), "b": np.zeros(1)}
    step = ef.value_and_grad(loss)
    jstep = jax.jit(jax.value_and_grad(jloss))
    for _ in range(25):
        v, g = step(p, feats, labels)
        jv, jg = jstep(jp, feats, labels)
        np.testing.assert_allclose(v, jv, rtol=1e-12)
        p = {k: p[k] - 0.05 * g[k] for k in p}
        jp = {k: jp[k] - 0.05 * np.asarray(jg[k]) for k in jp}
    np.testing.assert_allclose(p["w"][:, 0], jp["w"], rtol=1e-10)
