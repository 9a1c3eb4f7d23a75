"""vmap(grad(f)) over NamedTuple, dataclass and registered-class arguments gives what the same call
with a dict gives and what jax.vmap(jax.grad) gives on the same math; NumPy a builder does on the
arrays of such an argument is differentiated (as for a dict). A derivative of vmap(vmap(f)) is
refused up front, naming the nested vmap and what to write, and writes nothing into the arrays."""
import dataclasses
from typing import NamedTuple

import numpy as np
import pytest

import eagle_fx as ef
import hawk_fx as hawk
from hawk_fx import Param, Scalar
from hawk_fx import math as hm

jax = pytest.importorskip("jax")
jax.config.update("jax_enable_x64", True)
jnp = jax.numpy


@hawk.kernel
def fit(x: Scalar, w: Param, b: Param) -> Scalar:
    return hawk.sum(hm.sin(w * x + b) * x)


class Pair(NamedTuple):
    w: np.ndarray
    b: np.ndarray


@dataclasses.dataclass
class Fields:
    w: np.ndarray
    b: np.ndarray


class Boxed:
    """A class registered as a tree node (as with jax.tree_util.register_pytree_node)."""

    def __init__(self, w, b):
        self.w, self.b = w, b


ef.tree.register_pytree_node(Boxed, lambda p: ((p.w, p.b), None), lambda aux, kids: Boxed(*kids))


def _wb(p):
    return (p["w"], p["b"]) if isinstance(p, dict) else (p.w, p.b)


@ef.Graph.builder
def loss(p, x):
    g = ef.Graph()
    w, b = _wb(p)
    g.result = fit(x, w * 2.0, b)            # NumPy on an argument's leaf: staged, so differentiated
    return g


def jloss(w, b, x):
    return jnp.sum(jnp.sin(2.0 * w * x + b) * x)


MAKE = {"dict": lambda w, b: {"w": w, "b": b}, "namedtuple": Pair, "dataclass": Fields, "registered": Boxed}


@pytest.mark.parametrize("seed", range(4))
def test_vmap_of_grad_over_tree_arguments_matches_the_dict_call_and_jax(seed):
    rng = np.random.default_rng(seed)
    B, n = int(rng.integers(1, 5)), int(rng.integers(1, 6))
    ws, bs, x = rng.normal(size=(B, 1)), rng.normal(size=(B, 1)), rng.normal(size=n)
    keep = (ws.copy(), bs.copy(), x.copy())
    jw, jb = jax.vmap(jax.grad(jloss, argnums=(0, 1)), in_axes=(0, 0, None))(ws[:, 0], bs[:, 0], x)
    by_kind = {}
    for kind, make in MAKE.items():
        got = ef.vmap(ef.grad(loss), in_axes=(0, None))(make(ws, bs), x)
        assert type(got) is (dict if kind == "dict" else make)
        gw, gb = _wb(got)
        np.testing.assert_allclose(np.ravel(gw), np.asarray(jw), rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(np.ravel(gb), np.asarray(jb), rtol=1e-12, atol=1e-12)
        by_kind[kind] = (np.ravel(gw), np.ravel(gb))
    for kind in MAKE:
        np.testing.assert_array_equal(by_kind[kind][0], by_kind["dict"][0])
        np.testing.assert_array_equal(by_kind[kind][1], by_kind["dict"][1])
    for a, k in zip((ws, bs, x), keep):
        np.testing.assert_array_equal(a, k)


@pytest.mark.parametrize("kind", list(MAKE))
def test_grad_differentiates_numpy_on_a_tree_argument(kind):
    """p.w * 2.0 in a builder is staged for every kind of tree node, not computed once in Python
    (which would make it a constant and its derivative zero)."""
    w, b, x = np.array([0.5]), np.array([0.1]), np.array([0.3, -0.4, 1.2])
    got = ef.grad(loss)(MAKE[kind](w, b), x)
    jw, jb = jax.grad(jloss, argnums=(0, 1))(w[0], b[0], x)
    gw, gb = _wb(got)
    np.testing.assert_allclose(np.ravel(gw), [jw], rtol=1e-12)
    np.testing.assert_allclose(np.ravel(gb), [jb], rtol=1e-12)


@hawk.kernel
def wave(x: Scalar) -> Scalar:
    return hawk.sum(hm.sin(x) * x)


@ef.Graph.builder
def one(x):
    g = ef.Graph()
    g.result = wave(x)
    return g


XS = np.outer([1.0, 0.7], [1.3, 0.3, -0.8])[..., None]      # (2, 3, 1): two batch axes, one sample


@pytest.mark.parametrize("name", ["jacfwd", "jacrev", "vjp"])
def test_a_derivative_of_a_nested_vmap_follows_its_argument(name):
    """The derivative batches the inner vmap's program again, so it follows x itself: JAX's."""
    def jwave(s):
        return jnp.sin(s) * s
    x = XS.copy()
    nested = ef.vmap(ef.vmap(one))
    jnested = jax.vmap(jax.vmap(jwave))
    if name == "vjp":
        ct = np.arange(6.0).reshape(2, 3, 1)
        got = ef.vjp(nested, x)[1](ct)[0]
        want = jax.vjp(jnested, XS[..., 0])[1](ct[..., 0])[0]
    else:
        got, want = getattr(ef, name)(nested)(x), getattr(jax, name)(jnested)(XS[..., 0])
    assert np.size(got) == np.size(want)
    np.testing.assert_allclose(np.ravel(got), np.ravel(want), rtol=1e-12, atol=1e-14)
    np.testing.assert_array_equal(x, XS)


@pytest.mark.parametrize("name", ["jacfwd", "jacrev", "vjp"])
def test_a_derivative_of_a_nested_vmap_over_a_moved_axis_follows_its_argument(name):
    """The outer vmap batches axis 1: the graph reads x with its axes moved, the derivative follows x."""
    def jwave(s):
        return jnp.sin(s) * s
    x = np.ascontiguousarray(np.moveaxis(XS, 0, 1))
    keep = x.copy()
    nested = ef.vmap(ef.vmap(one), in_axes=1)
    jnested = jax.vmap(jax.vmap(jwave), in_axes=1)
    if name == "vjp":
        ct = np.arange(6.0).reshape(2, 3, 1)
        got = ef.vjp(nested, x)[1](ct)[0]
        want = jax.vjp(jnested, x[..., 0])[1](ct[..., 0])[0]
    else:
        got, want = getattr(ef, name)(nested)(x), getattr(jax, name)(jnested)(x[..., 0])
    assert np.size(got) == np.size(want)
    np.testing.assert_allclose(np.ravel(got), np.ravel(want), rtol=1e-12, atol=1e-14)
    np.testing.assert_array_equal(x, keep)


def test_a_derivative_of_a_nested_vmap_through_a_plain_function():
    def jwave(s):
        return jnp.sin(s) * s
    got = ef.jacrev(lambda x: ef.vmap(ef.vmap(one))(x))(XS.copy())
    want = jax.jacrev(jax.vmap(jax.vmap(jwave)))(XS[..., 0])
    np.testing.assert_allclose(np.ravel(got), np.ravel(want), rtol=1e-12, atol=1e-14)


def test_what_the_refusal_suggests_matches_jax():
    """The derivative taken inside the batches, and the axes merged by hand, against JAX."""
    def jwave(s):
        return jnp.sin(s) * s
    want = np.asarray(jax.vmap(jax.vmap(jax.grad(jwave)))(XS[..., 0]))
    inside = ef.vmap(ef.vmap(ef.jacfwd(one)))(XS.copy())
    np.testing.assert_allclose(np.ravel(inside), want.ravel(), rtol=1e-12)
    merged = ef.jacfwd(ef.vmap(one))(XS.reshape(6, 1))
    full = np.asarray(jax.jacfwd(jax.vmap(jwave))(XS[..., 0].reshape(6)))
    assert np.size(merged) == full.size
    np.testing.assert_allclose(np.ravel(merged), full.ravel(), rtol=1e-12, atol=1e-14)
