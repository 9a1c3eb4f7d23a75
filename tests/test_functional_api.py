"""eagle_fx.make_program / vjp / jvp / grad against JAX (jax.grad / jax.jvp of the same computation
written with lax.cond and lax.fori_loop) and against central finite differences."""
import numpy as np
import pytest

import eagle_fx as ef
from tour_kernels import cell, grow, loss, total, wobble

pytestmark = pytest.mark.usefixtures("backend")     # every test on numpy and on jax


def numpy_loss(x, flag, n):
    if flag:
        x = np.sin(x) * x
    for _ in range(n):
        x = 1.1 * x + 0.1 * np.tanh(x)
    return np.sum(x * x)


X = np.linspace(-1.0, 1.2, 7)


@pytest.mark.parametrize("flag,n", [(1, 3), (0, 2), (1, 0)])
def test_grad_matches_finite_differences(flag, n):
    g = ef.grad(loss)(X, cell(flag), cell(n))
    eps = 1e-6
    fd = np.array([(numpy_loss(X + e, flag, n) - numpy_loss(X - e, flag, n)) / (2 * eps) for e in np.eye(7) * eps])
    np.testing.assert_allclose(g, fd, rtol=1e-6, atol=1e-8)


def test_grad_vjp_jvp_match_jax():
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    jnp, lax = jax.numpy, jax.lax

    def jloss(x, flag, n):
        x = lax.cond(flag != 0, lambda v: jnp.sin(v) * v, lambda v: v, x)
        x = lax.fori_loop(0, n, lambda i, v: 1.1 * v + 0.1 * jnp.tanh(v), x)
        return jnp.sum(x * x)

    want = np.asarray(jax.grad(jloss)(X, 1, 3))
    np.testing.assert_allclose(ef.grad(loss)(X, cell(1), cell(3)), want, rtol=1e-10)
    y, pullback = ef.vjp(loss, X, cell(1), cell(3))
    dx, dflag, dn = pullback(np.ones(1))
    np.testing.assert_allclose(dx, want, rtol=1e-10)
    assert dflag is None and dn is None            # cells have no cotangent
    np.testing.assert_allclose(y, np.asarray(jloss(X, 1, 3)))
    t = np.cos(np.arange(7.0))
    y2, ty = ef.jvp(loss, (X, cell(1), cell(3)), (t, None, None))
    _, jt = jax.jvp(lambda v: jloss(v, 1, 3), (X,), (t,))
    np.testing.assert_allclose(ty, np.asarray(jt), rtol=1e-10)


def test_make_program_prints_the_staged_program():
    text = str(ef.make_program(loss)(X, cell(1), cell(2)))
    assert text.startswith("{ lambda") and "cond" in text and "while" in text and "counted=True" in text


def test_refusals():
    @ef.Graph.builder
    def planes(x):
        g = ef.Graph()
        g.result = wobble(x)
        return g
    with pytest.raises(TypeError, match="grad needs one value"):
        ef.grad(planes)(X)
    with pytest.raises(ValueError, match="tangent for argument x"):
        ef.jvp(planes, (X,), (np.ones(3),))
    with pytest.raises(ValueError, match="2 primals and 1 tangents"):
        ef.jvp(loss, (X, cell(1)), (None,))
