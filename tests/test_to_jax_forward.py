"""eagle_fx.to_jax under JAX's forward mode and its compositions: jax.jvp, jax.jacfwd, jax.linearize,
jax.hessian, jax.vmap(jax.jacfwd(...)) through a data-dependent device loop, and tree arguments and
results. The oracle is the same math written in jax.numpy (the loop unrolled for the turn count the
plain-Python reference takes at that point, which is locally constant) and finite differences."""
from typing import NamedTuple

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402

import eagle_fx  # noqa: E402
from test_to_jax import X, counted, ref_until, until  # noqa: E402
from tour_kernels import affine, cell, total, wobble  # noqa: E402

ON = jnp.asarray(cell(1))


def turns(x):
    """The number of turns `until` runs from x (plain NumPy)."""
    for k in range(20):
        x = 1.1 * x + 0.1 * np.tanh(x)
        if not np.any(x < 3.0):
            return k + 1
    return 20


def jax_until(x, k):
    """`until` in jax.numpy with its turn count fixed to k: JAX differentiates it natively."""
    for _ in range(k):
        x = 1.1 * x + 0.1 * jnp.tanh(x)
    return jnp.sum(x * x)


def scalar(u):
    return eagle_fx.to_jax(until)(u, ON)[0]


def test_jvp_and_linearize_match_native_jax_on_the_same_math():
    x, v = jnp.asarray(X), jnp.asarray(np.cos(np.arange(8.0)))
    y, ty = jax.jvp(scalar, (x,), (v,))
    ry, rty = jax.jvp(lambda u: jax_until(u, turns(X)), (x,), (v,))
    np.testing.assert_allclose(y, ry, rtol=1e-13)
    np.testing.assert_allclose(ty, rty, rtol=1e-12)
    y2, lin = jax.linearize(scalar, x)
    np.testing.assert_allclose(lin(v), rty, rtol=1e-12)
    np.testing.assert_allclose(y2, ry, rtol=1e-13)


def test_jacfwd_equals_eagle_jacfwd_and_finite_differences():
    f = eagle_fx.to_jax(until)
    got = jax.jacfwd(lambda u: f(u, ON)[0])(jnp.asarray(X))
    np.testing.assert_allclose(got, eagle_fx.grad(until)(X, cell(1)), rtol=1e-12)
    h = 1e-6
    fd = [(ref_until(X + h * e) - ref_until(X - h * e)) / (2 * h) for e in np.eye(len(X))]
    np.testing.assert_allclose(got, fd, rtol=1e-6)


def test_hessian_through_a_data_dependent_loop_equals_eagle_hessian_and_native_jax():
    got = jax.hessian(scalar)(jnp.asarray(X))
    np.testing.assert_allclose(got, eagle_fx.hessian(until)(X, cell(1)), rtol=1e-11, atol=1e-12)
    np.testing.assert_allclose(got, jax.hessian(lambda u: jax_until(u, turns(X)))(jnp.asarray(X)), rtol=1e-11,
                               atol=1e-12)


def test_vmap_of_jacfwd_and_reverse_over_reverse_match_per_instance_oracles():
    xs = np.stack([X, 1.7 * X, 0.6 * X])
    got = jax.vmap(jax.jacfwd(scalar))(jnp.asarray(xs))
    for r, row in zip(got, xs):
        np.testing.assert_allclose(r, jax.grad(lambda u: jax_until(u, turns(row)))(jnp.asarray(row)), rtol=1e-12)
    gg = jax.jacrev(jax.grad(scalar))(jnp.asarray(X))
    np.testing.assert_allclose(gg, jax.hessian(lambda u: jax_until(u, turns(X)))(jnp.asarray(X)), rtol=1e-11,
                               atol=1e-12)


def _four_hvp_modes(seed, count):
    rng = np.random.default_rng(seed)
    for _ in range(count):
        x = rng.uniform(0.1, 2.5, 8)
        v = rng.normal(size=8)
        want = jax.jvp(jax.grad(lambda u: jax_until(u, turns(x))), (jnp.asarray(x),), (jnp.asarray(v),))[1]
        fwd_rev = jax.jvp(jax.grad(scalar), (jnp.asarray(x),), (jnp.asarray(v),))[1]
        rev_fwd = jax.grad(lambda u: jax.jvp(scalar, (u,), (jnp.asarray(v),))[1])(jnp.asarray(x))
        rev_rev = jax.grad(lambda u: jnp.vdot(jax.grad(scalar)(u), v))(jnp.asarray(x))
        fwd_fwd = jax.jacfwd(jax.jacfwd(scalar))(jnp.asarray(x)) @ v
        for got in (fwd_rev, rev_fwd, rev_rev, fwd_fwd):
            np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)


@pytest.mark.slow
def test_hessian_vector_products_agree_in_all_four_modes():
    _four_hvp_modes(7, 1)


@pytest.mark.slow
def test_seeded_sweep_of_hessian_vector_products_in_all_four_modes():
    _four_hvp_modes(11, 6)


def test_forward_mode_through_a_loop_with_no_cap_works_and_reverse_is_refused():
    f = eagle_fx.to_jax(counted)
    n = jnp.asarray(cell(3))
    x, v = jnp.asarray(X), jnp.ones(8)
    _, ty = jax.jvp(lambda u: f(u, n)[0], (x,), (v,))
    _, want = jax.jvp(lambda u: jax_until(u, 3), (x,), (v,))
    np.testing.assert_allclose(ty, want, rtol=1e-12)
    np.testing.assert_allclose(jax.jacfwd(lambda u: f(u, n)[0])(x), jax.grad(lambda u: jax_until(u, 3))(x),
                               rtol=1e-12)
    with pytest.raises(ValueError, match="reverse mode through the counted loop at .*traced by JAX.*cap the loop"):
        jax.grad(lambda u: f(u, n)[0])(x)


class Out(NamedTuple):
    loss: object
    y: object


@eagle_fx.Graph.builder
def fit(p, flag):
    g = eagle_fx.Graph()
    g.result = Out(total(affine(wobble(p["x"]), p["a"], p["b"])), affine(p["x"], p["a"], p["b"]))
    return g


def jax_fit(p):
    y = p["a"] * (jnp.sin(p["x"]) * p["x"]) + p["b"]
    return Out(jnp.sum(y * y).reshape(1), p["a"] * p["x"] + p["b"])


def test_dict_arguments_and_namedtuple_results_as_jax_jit_takes_them():
    f = eagle_fx.to_jax(fit)
    p = {"x": jnp.linspace(0.1, 1.0, 5), "a": jnp.array([1.5]), "b": jnp.array([0.3])}
    out = jax.jit(f)(p, ON)
    assert isinstance(out, Out)
    want = jax_fit(p)
    np.testing.assert_allclose(out.loss, want.loss, rtol=1e-13)
    np.testing.assert_allclose(out.y, want.y, rtol=1e-13)
    g = jax.grad(lambda q: f(q, ON).loss[0])(p)
    gw = jax.grad(lambda q: jax_fit(q).loss[0])(p)
    assert set(g) == {"x", "a", "b"}
    for k in g:
        np.testing.assert_allclose(g[k], gw[k], rtol=1e-12)
