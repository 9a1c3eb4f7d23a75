"""Composed transforms hand each other closed Programs and lower once, at the outermost call:
vmap(grad(f)), jacfwd(jacrev(f)), hessian(f), jvp(grad(f)) and vmap of a lambda around jvp each
build one executable on their first call and none on a cache hit, and still match JAX (float64,
through a device condition and a counted loop)."""
import numpy as np
import pytest

import eagle_fx as ef
import eagle_fx.backends.registry as graph_module
from tour_kernels import cell, loss

jax = pytest.importorskip("jax")
jax.config.update("jax_enable_x64", True)
jnp, lax = jax.numpy, jax.lax


def jloss(x, flag, n):
    x = lax.cond(flag != 0, lambda v: jnp.sin(v) * v, lambda v: v, x)
    x = lax.fori_loop(0, n, lambda i, v: 1.1 * v + 0.1 * jnp.tanh(v), x)
    return jnp.sum(x * x)


@pytest.fixture
def lowerings(monkeypatch):
    """The number of NumPy executables built (one per lowering) since the test began."""
    count = [0]
    real = graph_module.NumpyExecutable

    class Counting(real):
        def __init__(self, *args, **kwargs):
            count[0] += 1
            super().__init__(*args, **kwargs)
    monkeypatch.setattr(graph_module, "NumpyExecutable", Counting)
    ef.clear_caches()
    return count


X = np.linspace(-0.8, 0.9, 5)
XS = np.stack([X, X[::-1] * 0.7, X + 0.3])
V = np.linspace(1.0, -1.0, 5)
C1, C3 = cell(1), cell(3)


def once(fn, lowerings, *args):
    """fn(*args) lowers exactly one executable; a second call with new values lowers none."""
    before = lowerings[0]
    out = fn(*args)
    assert lowerings[0] - before == 1, f"{fn!r} lowered {lowerings[0] - before} executables"
    again = fn(*[a * 1.0 if isinstance(a, np.ndarray) and a.dtype.kind == "f" else a for a in args])
    assert lowerings[0] - before == 1, "a cache hit lowered again"
    np.testing.assert_allclose(again, out, rtol=1e-13)
    return out


@pytest.mark.parametrize("flag", [0, 1])
def test_vmap_of_grad_lowers_once(lowerings, flag):
    got = once(ef.vmap(ef.grad(loss), in_axes=(0, None, None)), lowerings, XS, cell(flag), cell(3))
    want = jax.vmap(jax.grad(jloss), in_axes=(0, None, None))(XS, flag, 3)
    np.testing.assert_allclose(got, want, rtol=1e-10)


def test_jacfwd_of_jacrev_and_hessian_lower_once(lowerings):
    want = jax.hessian(jloss)(X, 1, 3)
    np.testing.assert_allclose(once(ef.jacfwd(ef.jacrev(loss)), lowerings, X, cell(1), cell(3)).reshape(5, 5),
                               want, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(once(ef.hessian(loss), lowerings, X, cell(1), cell(3)), want, rtol=1e-9, atol=1e-12)


def test_jvp_of_grad_and_vmap_of_a_lambda_around_jvp_lower_once(lowerings):
    before = lowerings[0]
    g, hv = ef.jvp(ef.grad(loss), (X, cell(1), cell(3)), (V, None, None))
    assert lowerings[0] - before == 1
    jg, jhv = jax.jvp(jax.grad(lambda u: jloss(u, 1, 3)), (X,), (V,))
    np.testing.assert_allclose(g, jg, rtol=1e-10)
    np.testing.assert_allclose(hv, jhv, rtol=1e-9)
    f = ef.vmap(lambda x, t: ef.jvp(ef.grad(loss), (x, C1, C3), (t, None, None)))   # closure cells: cached
    got = once(lambda a, b: f(a, b)[1], lowerings, XS, np.tile(V, (3, 1)))
    want = jax.vmap(lambda x: jax.jvp(jax.grad(lambda u: jloss(u, 1, 3)), (x,), (V,))[1])(XS)
    np.testing.assert_allclose(got, want, rtol=1e-9)


def test_a_graph_a_transform_returns_inside_a_lambda_is_lowered_only_if_run(lowerings):
    seen = []

    def inner(x):
        g = ef.grad(loss)(x, cell(1), cell(2))       # inside a transform: a Graph for the outer one
        seen.append(g)
        return g
    ef.vmap(inner)(XS)
    assert lowerings[0] == 1
    # inner runs twice per staging, first on other values (a check), then on instance 0's: seen[1]
    np.testing.assert_allclose(seen[1](), jax.grad(jloss)(XS[0], 1, 2), rtol=1e-10)   # runs: lowered now
    assert lowerings[0] == 2
