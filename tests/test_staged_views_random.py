"""Random chains of basic indices on a staged argument, against NumPy and JAX (hypothesis).

Each example draws an argument shape (1 to 3 axes) and one or two basic indices (ints, slices with
any start/stop/step, an Ellipsis), applies them in a builder, and checks the replayed value against
NumPy on the same array (after `x[:] = ...` too), the gradient against jax.grad, and a write
through the same view against NumPy's assignment into that view.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings, strategies as st

import eagle_fx as eagle
import hawk_fx as hawk
from hawk_fx import Mutable, Scalar

jax = pytest.importorskip("jax")
jax.config.update("jax_enable_x64", True)
jnp = jax.numpy

CHAIN: list = []          # the indices the builders apply (read at build)


@hawk.kernel
def cubes(x: Scalar):
    return hawk.sum(x * x * x)


@hawk.kernel
def put(x: Scalar, y: Mutable[Scalar]):
    y = 2.0 * x + 1.0


@eagle.Graph.builder
def chained(x):
    g = eagle.Graph()
    v = x
    for idx in CHAIN:
        v = v[idx]
    g.result = cubes(v.reshape(-1))
    return g


@eagle.Graph.builder
def written(x, y):
    g = eagle.Graph()
    v = y
    for idx in CHAIN:
        v = v[idx]
    put(x, v.reshape(-1))                 # a reshape of a view: the write lands in y's elements
    g.result = cubes(y.reshape(-1))
    return g


def _slice(d):
    bound = st.one_of(st.none(), st.integers(-d - 1, d + 1))
    return st.builds(slice, bound, bound, st.sampled_from([None, 1, 2, -1, -2, 3]))


@st.composite
def _index(draw, shape):
    """A basic index of `shape` that keeps the last (sample) axis with a slice."""
    parts = []
    for k, d in enumerate(shape):
        last = k == len(shape) - 1
        parts.append(draw(_slice(d) if last else st.one_of(st.integers(-d, d - 1), _slice(d))))
    cut = draw(st.integers(0, len(parts) - 1))           # leave trailing full axes out, or an Ellipsis
    if draw(st.booleans()) and cut > 0:
        parts = [Ellipsis] + parts[cut:]
    return tuple(parts)


@st.composite
def _case(draw):
    shape = tuple(draw(st.lists(st.integers(1, 5), min_size=1, max_size=3)))
    chain, cur = [], np.empty(shape)
    for _ in range(draw(st.integers(1, 2))):
        if cur.ndim == 0:
            break
        idx = draw(_index(cur.shape))
        nxt = cur[idx]
        if nxt.ndim == 0 or nxt.size == 0:
            break
        chain.append(idx)
        cur = nxt
    return shape, chain


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_case(), st.integers(0, 2 ** 31))
def test_random_views_match_numpy_and_jax(case, seed):
    shape, chain = case
    assume(chain)
    rng = np.random.default_rng(seed)
    CHAIN[:] = chain
    eagle.clear_caches()          # the builders read CHAIN when staged (as jax.jit reads a global)

    def view(a):
        for idx in chain:
            a = a[idx]
        return a

    x = rng.normal(size=shape)
    g = chained(x)
    np.testing.assert_allclose(g()[0], np.sum(view(x) ** 3), rtol=1e-12)
    x[...] = rng.normal(size=shape)
    np.testing.assert_allclose(g()[0], np.sum(view(x) ** 3), rtol=1e-12)
    want = jax.grad(lambda a: jnp.sum(view(a).reshape(-1) ** 3))(jnp.asarray(x))
    np.testing.assert_allclose(eagle.grad(chained)(x), np.asarray(want), rtol=1e-10, atol=1e-13)

    y = rng.normal(size=shape)
    src = rng.normal(size=view(y).size)
    expect = y.copy()
    view(expect)[...] = (2.0 * src + 1.0).reshape(view(expect).shape)
    out = written(src, y)()
    np.testing.assert_allclose(y, expect, rtol=1e-14)
    np.testing.assert_allclose(out[0], np.sum(expect ** 3), rtol=1e-12)
