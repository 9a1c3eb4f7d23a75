"""Python floats are traced by the transforms' cache, as jax.jit traces Python scalars: a new value
replays the staged graph. Weakly typed: beside float32 arrays they stay float32. A builder's
static_argnums / static_argnames keep the floats it needs as numbers static. Oracles: NumPy
formulas written here."""
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import eagle_fx as ef
import hawk_fx as hawk
from hawk_fx import Param, Scalar


@pytest.fixture(autouse=True)
def _fresh_caches():
    ef.clear_caches()


@hawk.kernel
def quad(x: Scalar, a: Param) -> Scalar:
    return hawk.sum(a * x * x)


@hawk.kernel
def scale(x: Scalar, a: Param) -> Scalar:
    return a * x


@ef.Graph.builder
def loss(x, a):
    g = ef.Graph()
    g.result = quad(x, a)
    return g


@ef.Graph.builder
def model(x, a):
    g = ef.Graph()
    g.result = scale(x, a)
    return g


@ef.Graph.builder(static_argnames="a")
def loss_exp(x, a):
    g = ef.Graph()
    g.result = quad(x, math.exp(a))          # needs a as a Python number
    return g


@ef.Graph.builder
def loss_exp_traced(x, a):
    g = ef.Graph()
    g.result = quad(x, math.exp(a))
    return g


@settings(max_examples=25, deadline=None)
@given(st.lists(st.floats(-3.0, 3.0), min_size=1, max_size=6))
def test_a_float_schedule_replays_one_graph(values):
    f = ef.value_and_grad(loss)
    x = np.linspace(-1.0, 1.0, 7)
    for a in values:
        v, dx = f(x, a)
        np.testing.assert_allclose(v, [a * np.sum(x * x)], rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(dx, 2 * a * x, rtol=1e-12, atol=1e-12)
    assert f.cache_info().misses == 1


def test_a_float_is_weakly_typed_beside_float32_arrays():
    f = ef.grad(loss)
    x32 = np.linspace(-1.0, 1.0, 5, dtype=np.float32)
    g = f(x32, 0.1)
    assert g.dtype == np.float32
    np.testing.assert_allclose(g, 2 * np.float32(0.1) * x32, rtol=1e-6)
    g64 = f(x32.astype(np.float64), 0.1)
    assert g64.dtype == np.float64
    np.testing.assert_allclose(g64, 0.2 * x32.astype(np.float64), rtol=1e-12)


def test_a_numpy_float_scalar_keeps_its_dtype_and_is_traced():
    f = ef.grad(loss)
    x = np.linspace(-1.0, 1.0, 5)
    for a in (np.float64(0.5), np.float64(1.5)):
        np.testing.assert_allclose(f(x, a), 2 * a * x, rtol=1e-12)
    assert f.cache_info()[:2] == (1, 1)


def test_a_float_inside_a_tree_is_traced():
    @ef.Graph.builder
    def tree_loss(p, x):
        g = ef.Graph()
        g.result = quad(x, p["a"])
        return g
    f = ef.grad(tree_loss, argnums=1)
    x = np.linspace(-1.0, 1.0, 5)
    for a in (0.5, 1.5, 2.5):
        np.testing.assert_allclose(f({"a": a}, x), 2 * a * x, rtol=1e-12)
    assert f.cache_info()[:2] == (2, 1)


def test_static_argnames_keeps_a_float_static():
    f = ef.grad(loss_exp)
    x = np.linspace(-1.0, 1.0, 5)
    for a in (0.5, 1.0, 0.5):
        np.testing.assert_allclose(f(x, a), 2 * np.exp(a) * x, rtol=1e-12)
    assert f.cache_info()[:3] == (1, 2, 2)


def test_static_argnums_by_position():
    @ef.Graph.builder(static_argnums=1)
    def shifted(x, a):
        g = ef.Graph()
        g.result = quad(x, math.exp(a))
        return g
    f = ef.grad(shifted)
    x = np.linspace(-1.0, 1.0, 5)
    np.testing.assert_allclose(f(x, 0.25), 2 * np.exp(0.25) * x, rtol=1e-12)


def test_a_traced_float_read_in_python_says_to_mark_it_static():
    with pytest.raises(TypeError) as err:
        ef.grad(loss_exp_traced)(np.linspace(-1.0, 1.0, 5), 0.5)
    text = str(err.value) + "".join(getattr(err.value, "__notes__", []))
    assert "float()" in text and "static_argnames" in text and "position 1" in text


@pytest.mark.parametrize("kw, what", [({"static_argnums": 5}, "static_argnums has 5"),
                                      ({"static_argnames": "b"}, "static_argnames has 'b'")])
def test_a_bad_static_declaration_names_the_builder(kw, what):
    with pytest.raises(ValueError, match=what) as err:
        @ef.Graph.builder(**kw)
        def shifted(x, a):
            g = ef.Graph()
            return g
    assert "shifted" in str(err.value)


def test_an_unhashable_static_argument_is_named():
    @ef.Graph.builder(static_argnames="opts")
    def with_opts(x, opts):
        g = ef.Graph()
        g.result = quad(x, 1.0)
        return g
    with pytest.raises(TypeError, match="opts.*unhashable list"):
        ef.grad(with_opts)(np.linspace(-1.0, 1.0, 5), [1, 2])


def test_vmap_traces_a_shared_float_and_refuses_a_batched_one():
    f = ef.vmap(ef.grad(loss), in_axes=(0, None))
    xs = np.random.default_rng(0).normal(size=(3, 6))
    for a in (0.5, 1.5):
        np.testing.assert_allclose(f(xs, a), 2 * a * xs, rtol=1e-12)
    assert f.cache_info()[:2] == (1, 1)
    with pytest.raises(Exception):
        ef.vmap(ef.grad(loss))(xs, 0.5)


def test_vmap_of_a_builder_traces_a_shared_float():
    f = ef.vmap(model, in_axes=(0, None))
    xs = np.random.default_rng(1).normal(size=(2, 4))
    for a in (0.5, 1.5, 2.5):
        np.testing.assert_allclose(np.asarray(f(xs, a)()), a * xs, rtol=1e-12)
    assert f.cache_info()[:2] == (2, 1)


def test_jvp_traces_a_float_without_tangent():
    x = np.linspace(-1.0, 1.0, 5)
    t = np.ones(5)
    for a in (0.5, 1.5, 2.5):
        y, ty = ef.jvp(model, (x, a), (t, None))
        np.testing.assert_allclose(y, a * x, rtol=1e-12)
        np.testing.assert_allclose(ty, a * t, rtol=1e-12)
    assert ef.jvp.__module__           # the cache is per function: count through a fresh transform below
    from eagle_fx.api import sig
    from eagle_fx.frontend import cache
    assert cache.cache_for(sig("jvp", model), create=False).info()[:2] == (2, 1)


def test_ints_and_bools_stay_static():
    @ef.Graph.builder
    def repeated(x, n):
        g = ef.Graph()
        y = x
        for _ in range(n):                     # a Python int: unrolled
            y = scale(y, 2.0)
        g.result = quad(y, 1.0)
        return g
    f = ef.grad(repeated)
    x = np.linspace(-1.0, 1.0, 5)
    for n in (1, 2, 1):
        np.testing.assert_allclose(f(x, n), 2 * 4.0 ** n * x, rtol=1e-12)
    assert f.cache_info()[:2] == (1, 2)
