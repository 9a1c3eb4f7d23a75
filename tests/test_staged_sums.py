"""np.sum / np.mean / .sum() / .mean() of staged planes, in builders and (Graph.sum) in plain functions.

Oracles: NumPy on the arrays (values, dtypes, shapes but for the 0-d full sum, which is a (1,)
cell), jax.grad / jax.vmap of the same math in x64 (derivatives, batching), a loop over instances.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

import eagle_fx as eagle
import hawk_fx as hawk
import hawk_fx.math as hm
from hawk_fx import Scalar, Vector

from conftest import line_of

jax = pytest.importorskip("jax")
jax.config.update("jax_enable_x64", True)
jnp = jax.numpy

pytestmark = pytest.mark.usefixtures("backend")     # every test on numpy and on jax


@hawk.kernel
def wave(x: Scalar):
    return hm.sin(x) * x


@hawk.kernel
def spin(v: Vector[3]):
    return hm.vec(v[0] * v[1], hm.cos(v[2]), v[0] + v[2])


REDUCERS = {
    "np.sum": (lambda y: np.sum(y), lambda a: np.sum(a)),
    ".sum()": (lambda y: y.sum(), lambda a: a.sum()),
    "np.mean": (lambda y: np.mean(y), lambda a: np.mean(a)),
    ".mean()": (lambda y: y.mean(), lambda a: a.mean()),
    "np.sum axis=-1": (lambda y: np.sum(y, axis=-1), lambda a: np.sum(a, axis=-1)),
    ".mean(axis=-1, keepdims)": (lambda y: y.mean(axis=-1, keepdims=True), lambda a: a.mean(axis=-1, keepdims=True)),
    "np.sum keepdims": (lambda y: np.sum(y, keepdims=True), lambda a: np.sum(a, keepdims=True)),
    ".sum(axis=(0, 1))": (lambda y: y.sum(axis=tuple(range(y.ndim))), lambda a: a.sum(axis=tuple(range(a.ndim)))),
}


def _reduced(red):
    @eagle.Graph.builder
    def reduced(x):
        g = eagle.Graph()
        g.result = red(np.sin(x) * 2.0 + x)
        return g
    return reduced


def _check(got, want, dtype):
    want = np.asarray(want)
    assert got.dtype == want.dtype
    assert got.shape == (want.shape if want.shape else (1,))         # NumPy's 0-d sum is a (1,) cell
    rtol = 1e-12 if dtype == np.float64 else 2e-6
    np.testing.assert_allclose(got.reshape(want.shape), want, rtol=rtol, atol=rtol)


@pytest.mark.parametrize("name", list(REDUCERS))
@pytest.mark.parametrize("shape", [(5,), (3, 4), (2, 3, 4)], ids=["scalar", "vector", "matrix"])
def test_builder_reductions_match_numpy_after_each_replay(name, shape, rng):
    staged, plain = REDUCERS[name]
    x = rng.normal(size=shape)
    g = _reduced(staged)(x)
    _check(g(), plain(np.sin(x) * 2.0 + x), np.float64)
    x[...] = rng.normal(size=shape)                       # the graph reads x at every replay: nothing baked
    _check(g(), plain(np.sin(x) * 2.0 + x), np.float64)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_dtype_follows_numpy(dtype, rng):
    x = rng.normal(size=(3, 6)).astype(dtype)
    for name in ("np.sum", "np.mean", "np.sum axis=-1"):
        staged, plain = REDUCERS[name]
        _check(_reduced(staged)(x)(), plain(np.sin(x) * dtype(2) + x), dtype)


def test_dtype_argument_sums_in_that_dtype(rng):
    @eagle.Graph.builder
    def wide(x):
        g = eagle.Graph()
        g.result = np.sum(x, dtype=np.float64)
        return g
    x = rng.normal(size=7).astype(np.float32)
    out = wide(x)()
    assert out.dtype == np.float64
    np.testing.assert_allclose(out[0], np.sum(x.astype(np.float64)), rtol=1e-14)


def test_compensated_like_hawk_sum():
    x = np.array([1e16, 1.0, -1e16, 1.0] * 50)
    out = _reduced(lambda y: np.sum(y))(x)()        # sin(x)*2 + x: the big terms cancel exactly in fsum
    np.testing.assert_allclose(out[0], math.fsum(np.sin(x) * 2.0 + x), rtol=1e-12)


# -- derivatives and batching against JAX --------------------------------------------------------

@eagle.Graph.builder
def loss(x):
    g = eagle.Graph()
    y = wave(x)
    g.result = np.sum(y * y) + y.mean()
    return g


def _jloss(x):
    y = jnp.sin(x) * x
    return jnp.sum(y * y) + jnp.mean(y)


def test_grad_of_a_builder_that_sums(rng):
    x = rng.normal(size=6)
    np.testing.assert_allclose(eagle.grad(loss)(x), jax.grad(_jloss)(jnp.asarray(x)), rtol=1e-12)


def test_vmap_of_a_builder_sums_per_instance(rng):
    X = rng.normal(size=(4, 6))
    out = np.asarray(eagle.vmap(loss)(X)())
    np.testing.assert_allclose(np.reshape(out, 4), jax.vmap(_jloss)(jnp.asarray(X)), rtol=1e-12)


@eagle.Graph.builder
def waved(x):
    g = eagle.Graph()
    g.result = wave(x)
    return g


@eagle.Graph.builder
def spun(v):
    g = eagle.Graph()
    g.result = spin(v)
    return g


def _jwave(x):
    return jnp.sin(x) * x


def _jspin(v):
    return jnp.stack([v[0] * v[1], jnp.cos(v[2]), v[0] + v[2]])


def test_grad_of_a_plain_function_that_sums_a_graph(rng):
    x = rng.normal(size=5)
    np.testing.assert_allclose(eagle.grad(lambda u: waved(u).sum())(x),
                               jax.grad(lambda u: _jwave(u).sum())(jnp.asarray(x)), rtol=1e-12)
    np.testing.assert_allclose(eagle.grad(lambda u: waved(u).mean())(x),
                               jax.grad(lambda u: _jwave(u).mean())(jnp.asarray(x)), rtol=1e-12)
    v = rng.normal(size=(3, 4))                        # a Vector[3] plane: every component and sample
    np.testing.assert_allclose(eagle.grad(lambda u: spun(u).sum())(v),
                               jax.grad(lambda u: _jspin(u).sum())(jnp.asarray(v)), rtol=1e-12)
    np.testing.assert_allclose(eagle.grad(lambda u: spun(u).mean())(v),
                               jax.grad(lambda u: _jspin(u).mean())(jnp.asarray(v)), rtol=1e-12)


def test_vmap_of_a_plain_function_that_sums_is_per_instance(rng):
    X = rng.normal(size=(3, 5))
    out = eagle.vmap(lambda u: waved(u).sum())(X)
    assert out.shape == (3, 1)                        # each instance's (1,) cell
    np.testing.assert_allclose(out[:, 0], [np.sum(np.sin(r) * r) for r in X], rtol=1e-12)
    np.testing.assert_allclose(eagle.vmap(eagle.grad(lambda u: waved(u).sum()))(X),
                               jax.vmap(jax.grad(lambda u: _jwave(u).sum()))(jnp.asarray(X)), rtol=1e-12)


def test_grad_of_the_sum_of_a_vmap(rng):
    X = rng.normal(size=(3, 5))                       # JAX's grad(lambda x: vmap(f)(x).sum())
    np.testing.assert_allclose(eagle.grad(lambda u: eagle.vmap(waved)(u).sum())(X),
                               jax.grad(lambda u: jax.vmap(_jwave)(u).sum())(jnp.asarray(X)), rtol=1e-12)
    np.testing.assert_allclose(eagle.grad(lambda u: eagle.vmap(waved)(u).mean())(X),
                               jax.grad(lambda u: jax.vmap(_jwave)(u).mean())(jnp.asarray(X)), rtol=1e-12)


def test_seeded_sweep_of_shapes_dtypes_and_reducers():
    rng = np.random.default_rng(7)
    names = list(REDUCERS)
    for _ in range(12):
        shape = tuple(int(d) for d in rng.integers(1, 4, size=rng.integers(1, 4)))
        shape = shape[:-1] + (int(rng.integers(1, 9)),)
        dtype = (np.float32, np.float64)[int(rng.integers(2))]
        name = names[int(rng.integers(len(names)))]
        staged, plain = REDUCERS[name]
        x = (rng.normal(size=shape) * 10.0 ** rng.integers(-3, 4)).astype(dtype)
        _check(_reduced(staged)(x)(), plain(np.sin(x) * dtype(2) + x), dtype)
    for _ in range(4):                                # derivatives of random-sized sums against JAX
        n = int(rng.integers(1, 9))
        x = rng.normal(size=n)
        np.testing.assert_allclose(eagle.grad(loss)(x), jax.grad(_jloss)(jnp.asarray(x)), rtol=1e-12)


# -- refusals: the API, the builder line, what was found and what to write ----------------------

@eagle.Graph.builder
def first_axis(v):
    g = eagle.Graph()
    g.result = np.sum(v, axis=0)
    return g


@eagle.Graph.builder
def into(x, y):
    g = eagle.Graph()
    g.result = np.sum(x, out=y)
    return g


@eagle.Graph.builder
def ints(k):
    g = eagle.Graph()
    g.result = k.sum()
    return g


@eagle.Graph.builder
def masked(x):
    g = eagle.Graph()
    g.result = x.sum(where=x > 0)
    return g


@eagle.Graph.builder
def counts(x):
    g = eagle.Graph()
    g.result = np.sum(x > 0)
    return g


def _refused(exc, builder, args, fragment, *words):
    before = [np.array(a, copy=True) for a in args]
    with pytest.raises(exc) as info:
        builder(*args)
    msg = str(info.value)
    where = f"{builder.__name__}:{line_of(builder, fragment) - line_of(builder, '@eagle') + 1}"
    for w in ("eagle.Graph.builder", where) + words:
        assert w in msg, f"{w!r} not in {msg!r}"
    for a, b in zip(args, before):
        np.testing.assert_array_equal(a, b)


def test_refusals_name_the_line_and_the_fix(rng):
    _refused(TypeError, first_axis, (rng.normal(size=(3, 4)),), "axis=0", "np.sum(axis=0)", "axis=-1",
             "write a kernel")
    _refused(TypeError, into, (rng.normal(size=4), np.zeros(1)), "out=y", "np.sum(out=", "y[...] = np.sum(x)")
    _refused(TypeError, ints, (np.arange(4, dtype=np.int32),), "k.sum()", "int32", "float64")
    _refused(TypeError, masked, (rng.normal(size=4),), "where=", ".sum(where=", "np.where(mask, x, 0.0)")
    _refused(TypeError, counts, (rng.normal(size=4),), "np.sum(x > 0)", "np.sum of a bool plane", "astype")


def test_graph_sum_outside_a_transform_replays_on_the_bound_arrays(rng):
    x = rng.normal(size=5)
    total = waved(x).sum()
    np.testing.assert_allclose(total(), [np.sum(np.sin(x) * x)], rtol=1e-12)
    x[...] = rng.normal(size=5)
    np.testing.assert_allclose(total(), [np.sum(np.sin(x) * x)], rtol=1e-12)


def test_graph_sum_of_several_results_is_refused(rng):
    @eagle.Graph.builder
    def two(x):
        g = eagle.Graph()
        g.result = (wave(x), wave(x))
        return g
    with pytest.raises(TypeError, match=r"eagle_fx.Graph.sum: the graph has 2 results"):
        eagle.grad(lambda u: two(u).sum())(rng.normal(size=3))


@pytest.mark.numpy_only
def test_fake_cuda_sums_as_numpy_and_jax(nvrtc, rng):
    """The reduction kernels' CUDA lowering (NVRTC-compiled, run on the fake device)."""
    from eagle_fx.backends.select import use_backend
    from eagle_fx.testing import fake_cuda  # noqa: F401
    x, v = rng.normal(size=6), rng.normal(size=(3, 4))
    with use_backend("fake-cuda"):
        out = np.asarray(loss(x)())
        gx = eagle.grad(loss)(x)
        gv = eagle.grad(lambda u: spun(u).mean())(v)
        ax = np.asarray(_reduced(lambda y: np.sum(y, axis=-1))(v)())
    np.testing.assert_allclose(out, [_jloss(jnp.asarray(x))], rtol=1e-12)
    np.testing.assert_allclose(gx, jax.grad(_jloss)(jnp.asarray(x)), rtol=1e-12)
    np.testing.assert_allclose(gv, jax.grad(lambda u: _jspin(u).mean())(jnp.asarray(v)), rtol=1e-12)
    np.testing.assert_allclose(ax, np.sum(np.sin(v) * 2.0 + v, axis=-1), rtol=1e-12)
