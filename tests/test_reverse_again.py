"""Reverse over reverse through device loops (capped, counted, uncapped): the inner reverse pass is
staged reversible (turns recomputed), and the four Hessian-vector products (fwd-over-rev,
rev-over-fwd, rev-over-rev, fwd-over-fwd) agree with each other and with central differences of
plain NumPy."""
import warnings

import numpy as np
import pytest

import eagle_fx as ef
import hawk_fx as hawk
from hawk_fx import Scalar, UInt32
from hawk_fx import math as hm
from tour_kernels import cell


@hawk.kernel
def settle_step(x: Scalar) -> Scalar:
    return 0.5 * x + 0.05 * hm.sin(x) * x


@hawk.kernel
def still_big(x: Scalar) -> UInt32:
    return hm.uint32(hawk.sum(hm.abs(x) > 0.2))


@hawk.kernel
def energy(x: Scalar) -> Scalar:
    return hawk.sum(x * x * x + x)


@ef.Graph.builder
def uncapped(x):
    g = ef.Graph()
    flag = still_big(x)
    while flag:                                   # no cap: as many turns as the data needs
        x = settle_step(x)
        flag = still_big(x)
    g.result = energy(x)
    return g


@ef.Graph.builder
def capped(x):
    g = ef.Graph()
    flag = still_big(x)
    for _ in range(40):
        if not flag:
            break
        x = settle_step(x)
        flag = still_big(x)
    g.result = energy(x)
    return g


@ef.Graph.builder
def counted(x, n):
    g = ef.Graph()
    for _ in range(n):
        x = settle_step(x)
    g.result = energy(x)
    return g


def numpy_f(x, n=None):
    x = np.array(x, dtype=float)
    turns = 0
    while (n is None and np.any(np.abs(x) > 0.2)) or (n is not None and turns < n):
        x = 0.5 * x + 0.05 * np.sin(x) * x
        turns += 1
    return np.sum(x ** 3 + x)


def fd_hvp(f, x, v, h=1e-4):
    def grad(u):
        e = np.eye(len(u)) * 1e-6
        return np.array([(f(u + d) - f(u - d)) / 2e-6 for d in e])
    return (grad(x + h * v) - grad(x - h * v)) / (2 * h)


CASES = [("uncapped", lambda x: uncapped(x), lambda x: numpy_f(x)),
         ("capped", lambda x: capped(x), lambda x: numpy_f(x)),
         ("counted", lambda x: counted(x, cell(5)), lambda x: numpy_f(x, 5))]


@pytest.mark.parametrize("name,f,nf", CASES, ids=[c[0] for c in CASES])
def test_four_hessian_vector_products_agree(name, f, nf):
    rng = np.random.default_rng(5)
    x = rng.uniform(0.3, 1.2, 3)                  # each sample needs a few turns to settle
    v = rng.normal(size=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ef.UncappedLoopWarning)
        fr = ef.jvp(ef.grad(f), (x,), (v,))[1]
        rr = ef.jacrev(ef.grad(f))(x) @ v
        rf = ef.grad(lambda u: ef.jvp(f, (u,), (v,))[1])(x)
        ff = ef.jacfwd(ef.jacfwd(f))(x).reshape(3, 3) @ v
        gg = ef.hessian(f)(x) @ v
    for other in (rr, rf, ff, gg):
        np.testing.assert_allclose(other, fr, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(fr, fd_hvp(nf, x, v), rtol=2e-4, atol=1e-5)


# -- the JAX backend: loops with no bound on their turns recompute them (no stack for XLA to size) --

def _on_jax(fn, *args):
    from eagle_fx.backends.select import use_backend
    with use_backend("jax"), warnings.catch_warnings():
        warnings.simplefilter("ignore", ef.UncappedLoopWarning)
        return fn(*args)


def _on_numpy(fn, *args):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ef.UncappedLoopWarning)
        return fn(*args)


UNBOUNDED = [pytest.param(*c, id=c[0], marks=[pytest.mark.slow] if c[0] == "uncapped" else [])
             for c in CASES if c[0] != "capped"]


@pytest.mark.parametrize("name,f,nf", UNBOUNDED)
def test_reverse_over_reverse_through_counted_and_uncapped_loops_on_jax(name, f, nf):
    pytest.importorskip("jax")
    rng = np.random.default_rng(11)
    x = rng.uniform(0.3, 1.2, 3)
    v = rng.normal(size=3)
    rr = _on_jax(lambda: ef.jacrev(ef.grad(f))(x))             # Hessian by reverse over reverse
    np.testing.assert_allclose(rr, _on_numpy(lambda: ef.jacrev(ef.grad(f))(x)), rtol=1e-11, atol=1e-13)
    np.testing.assert_allclose(rr @ v, fd_hvp(nf, x, v), rtol=2e-4, atol=1e-5)
    np.testing.assert_allclose(rr, rr.T, rtol=1e-10, atol=1e-12)
    # grad(grad(f)) on one sample, against a central second difference of plain NumPy
    x1 = np.array([0.9])
    gg = _on_jax(lambda: ef.grad(ef.grad(f))(x1))
    h = 1e-4
    want = (nf(x1 + h) - 2 * nf(x1) + nf(x1 - h)) / h ** 2
    np.testing.assert_allclose(gg, want, rtol=1e-5)
    np.testing.assert_allclose(gg, _on_numpy(lambda: ef.grad(ef.grad(f))(x1)), rtol=1e-11)


def test_grad_through_an_uncapped_loop_on_jax_recomputes_its_turns():
    pytest.importorskip("jax")
    x = np.array([0.45, 0.9, 1.3])
    g = _on_jax(lambda: ef.grad(uncapped)(x))
    np.testing.assert_allclose(g, _on_numpy(lambda: ef.grad(uncapped)(x)), rtol=1e-12)
    e = np.eye(3) * 1e-6
    np.testing.assert_allclose(g, [(numpy_f(x + d) - numpy_f(x - d)) / 2e-6 for d in e], rtol=1e-6)


@pytest.mark.slow
def test_reverse_over_reverse_on_jax_sweep_over_trip_counts_and_points():
    """A seeded sweep: hessian by jacrev(jacrev) on JAX equals the NumPy backend's and differences."""
    pytest.importorskip("jax")
    rng = np.random.default_rng(12)
    for n in (1, 2, 4, 7):
        x = rng.uniform(-1.2, 1.2, 3)
        v = rng.normal(size=3)
        hj = _on_jax(lambda: ef.jacrev(ef.jacrev(counted))(x, cell(n))).reshape(3, 3)
        hn = _on_numpy(lambda: ef.jacrev(ef.jacrev(counted))(x, cell(n))).reshape(3, 3)
        np.testing.assert_allclose(hj, hn, rtol=1e-11, atol=1e-13)
        np.testing.assert_allclose(hj @ v, fd_hvp(lambda u: numpy_f(u, n), x, v), rtol=2e-4, atol=1e-5)
    for _ in range(3):
        x = rng.uniform(0.3, 1.4, 3)
        hj = _on_jax(lambda: ef.jacrev(ef.jacrev(uncapped))(x)).reshape(3, 3)
        np.testing.assert_allclose(hj, _on_numpy(lambda: ef.jacrev(ef.jacrev(uncapped))(x)).reshape(3, 3),
                                   rtol=1e-11, atol=1e-13)
