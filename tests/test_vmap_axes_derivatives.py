"""Derivatives through a vmap whose in_axes batch an argument along an axis other than its first
(in_axes=1, -1, a tuple with a non-zero entry, a tree prefix): the graph reads the argument with
its axes moved, and each derivative follows the argument itself, as in JAX.

Oracles: JAX (x64) on the same math (jax.jacfwd(jax.vmap(f, in_axes=...)) and friends), and
central differences of the plain NumPy function."""
from __future__ import annotations

import random

import numpy as np
import pytest

import eagle_fx as ef
import hawk_fx as hawk
from hawk_fx import Param, Scalar, Vector
from hawk_fx import math as hm

jax = pytest.importorskip("jax")
jax.config.update("jax_enable_x64", True)
jnp = jax.numpy

N = 4          # samples
B = 3          # instances


@hawk.kernel
def mix(x: Vector[2], w: Param) -> Scalar:
    return hm.sin(w * x[0]) * x[1] + w


@hawk.kernel
def energy(v: Scalar) -> Scalar:
    return hawk.sum(v * v)


@ef.Graph.builder
def f(x, w):
    g = ef.Graph()
    g.result = energy(mix(x, w))
    return g


def jf(x, w):
    """f's math in JAX, one instance: x (2, N), w (1,); the one-cell result as hawk.sum gives it."""
    return jnp.sum((jnp.sin(w * x[0]) * x[1] + w) ** 2).reshape(1)


def nf(x, w):
    """f's math in NumPy, one instance (for central differences)."""
    return np.sum((np.sin(w * x[0]) * x[1] + w) ** 2).reshape(1)


def batched(rng, one, ax):
    """B instances of shape `one`, stacked along axis `ax` (None: one shared instance)."""
    if ax is None:
        return rng.uniform(-1.5, 1.5, one)
    return np.moveaxis(rng.uniform(-1.5, 1.5, (B,) + one), 0, ax)


def close(got, want, what=""):
    want = np.asarray(want)
    assert np.shape(got) == want.shape, f"{what}: shape {np.shape(got)}, JAX {want.shape}"
    np.testing.assert_allclose(got, want, rtol=1e-11, atol=1e-12, err_msg=what)


def _args(seed, x_ax, w_ax):
    rng = np.random.default_rng(seed)
    return batched(rng, (2, N), x_ax), batched(rng, (1,), w_ax)


# ---------------------------------------------------------------------------------------------
# the composition as JAX users write it


def test_grad_of_a_sum_over_a_vmap_on_axis_1_is_jax_s():
    """jax.grad(lambda x: jnp.sum(jax.vmap(f, in_axes=1)(x))): once refused, before that zeros."""
    x, w = _args(0, 1, None)
    keep = x.copy()
    got = ef.grad(lambda x, w: ef.vmap(f, in_axes=(1, None))(x, w).sum())(x, w)
    want = jax.grad(lambda x, w: jnp.sum(jax.vmap(jf, in_axes=(1, None))(x, w)))(x, w)
    close(got, want)
    assert np.abs(got).max() > 0.1
    np.testing.assert_array_equal(x, keep)


def test_central_differences_agree():
    """The gradient with respect to x batched on its last axis, against central differences of NumPy."""
    x, w = _args(1, -1, None)
    got = ef.grad(lambda x, w: ef.vmap(f, in_axes=(-1, None))(x, w).sum())(x, w)

    def total(x):
        return sum(nf(x[..., b], w)[0] for b in range(B))
    fd = np.zeros_like(x)
    h = 1e-6
    for i in np.ndindex(x.shape):
        e = np.zeros_like(x)
        e[i] = h
        fd[i] = (total(x + e) - total(x - e)) / (2 * h)
    np.testing.assert_allclose(got, fd, rtol=1e-6, atol=1e-8)


API = ["jacfwd", "jacrev", "jvp", "vjp", "grad"]


def check(api, x_ax, w_ax, argnum, seed):
    """`api` of vmap(f, in_axes=(x_ax, w_ax)) against JAX's, and the arguments left as they were."""
    x, w = _args(seed, x_ax, w_ax)
    keep = (x.copy(), w.copy())
    axes = (x_ax, w_ax)
    F, JF = ef.vmap(f, in_axes=axes), jax.vmap(jf, in_axes=axes)
    what = f"{api} in_axes={axes} argnum={argnum}"
    rng = np.random.default_rng(seed + 100)
    if api in ("jacfwd", "jacrev"):
        close(getattr(ef, api)(F, argnum)(x, w), getattr(jax, api)(JF, argnum)(x, w), what)
    elif api == "grad":
        close(ef.grad(lambda x, w: F(x, w).sum(), argnum)(x, w),
              jax.grad(lambda x, w: jnp.sum(JF(x, w)), argnum)(x, w), what)
    elif api == "jvp":
        tx, tw = rng.normal(size=x.shape), rng.normal(size=w.shape)
        y, ty = ef.jvp(lambda x, w: F(x, w), (x, w), (tx, tw))
        jy, jty = jax.jvp(JF, (x, w), (tx, tw))
        close(y, jy, what)
        close(ty, jty, what + " (tangent)")
    else:
        y, pullback = ef.vjp(lambda x, w: F(x, w), x, w)
        ct = rng.normal(size=np.shape(y))
        jy, jpb = jax.vjp(JF, x, w)
        close(y, jy, what)
        for got, want in zip(pullback(ct), jpb(ct)):
            close(got, want, what + " (cotangent)")
    np.testing.assert_array_equal(x, keep[0])
    np.testing.assert_array_equal(w, keep[1])


@pytest.mark.parametrize("api", API)
@pytest.mark.parametrize("axes", [(1, None), (-1, 0), (2, 1), (0, 1)], ids=str)
def test_each_derivative_through_a_moved_batch_axis_is_jax_s(api, axes):
    w_ax = axes[1]
    argnum = 1 if api in ("jacfwd", "jacrev") and w_ax is not None else 0
    check(api, axes[0], w_ax, argnum, seed=len(api) + 7 * axes[0] % 5)


def _draw(seed):
    r = random.Random(seed)
    x_ax = r.choice([0, 1, 2, -1, -2])
    w_ax = r.choice([None, 0, 1, -1])
    return r.choice(API), x_ax, w_ax, r.choice([0, 1]) if w_ax is not None else 0


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(40))
def test_a_seeded_sweep_of_axes_and_derivatives_matches_jax(seed):
    check(*_draw(seed), seed=seed)


def _moved_pair():
    return ef.vmap(f, in_axes=(1, None)), jax.vmap(jf, in_axes=(1, None))


def test_hessian_and_second_derivatives_through_a_moved_axis():
    x, w = _args(3, 1, None)
    F, JF = _moved_pair()
    loss = lambda x, w: F(x, w).sum()          # noqa: E731
    jloss = lambda x, w: jnp.sum(JF(x, w))     # noqa: E731
    close(ef.hessian(loss)(x, w), jax.hessian(jloss)(x, w), "hessian")
    v = np.random.default_rng(4).normal(size=x.shape)
    g, hv = ef.jvp(ef.grad(loss), (x, w), (v, None))
    jg, jhv = jax.jvp(jax.grad(jloss), (x, w), (v, jnp.zeros_like(w)))
    close(g, jg, "jvp(grad): the gradient")
    close(hv, jhv, "jvp(grad): Hessian times v")


@pytest.mark.slow
def test_jacobians_of_jacobians_through_a_moved_axis():
    x, w = _args(3, 1, None)
    F, JF = _moved_pair()
    close(ef.jacfwd(ef.jacrev(F))(x, w), jax.jacfwd(jax.jacrev(JF))(x, w), "jacfwd(jacrev)")
    close(ef.jacrev(ef.jacfwd(F))(x, w), jax.jacrev(jax.jacfwd(JF))(x, w), "jacrev(jacfwd)")


def test_vmap_of_a_derivative_of_a_moved_vmap():
    """An outer vmap over jacrev / grad of vmap(f, in_axes=1): each instance's, as JAX's."""
    rng = np.random.default_rng(5)
    xs = rng.uniform(-1.5, 1.5, (2, 2, B, N))           # 2 outer instances of x batched on axis 1
    w = np.array([0.7])
    F = ef.vmap(f, in_axes=(1, None))
    JF = jax.vmap(jf, in_axes=(1, None))
    close(ef.vmap(ef.jacrev(F), in_axes=(0, None))(xs, w), jax.vmap(jax.jacrev(JF), in_axes=(0, None))(xs, w))
    close(ef.vmap(ef.grad(lambda x, w: F(x, w).sum()), in_axes=(0, None))(xs, w),
          jax.vmap(jax.grad(lambda x, w: jnp.sum(JF(x, w))), in_axes=(0, None))(xs, w))


def test_a_tree_argument_with_a_leaf_batched_on_another_axis():
    @ef.Graph.builder
    def ft(p):
        g = ef.Graph()
        g.result = energy(mix(p["x"], p["w"]))
        return g
    rng = np.random.default_rng(6)
    p = {"x": batched(rng, (2, N), 2), "w": batched(rng, (1,), 0)}
    axes = ({"x": 2, "w": 0},)
    got = ef.jacrev(ef.vmap(ft, in_axes=axes))(p)
    want = jax.jacrev(jax.vmap(lambda p: jf(p["x"], p["w"]), in_axes=axes))(p)
    for k in p:
        close(got[k], want[k], k)


def test_a_new_call_replays_with_the_new_values():
    """The staged graph is kept for the layout and rebound: a second call reads its own arrays."""
    F = ef.vmap(f, in_axes=(1, None))
    J = ef.jacrev(F)
    for seed in (7, 8):
        x, w = _args(seed, 1, None)
        close(J(x, w), jax.jacrev(jax.vmap(jf, in_axes=(1, None)))(x, w), f"seed {seed}")
    x, w = _args(9, 1, None)
    x = np.asfortranarray(x)                     # another layout of the same shape
    close(J(x, w), jax.jacrev(jax.vmap(jf, in_axes=(1, None)))(x, w), "Fortran order")
    rng = np.random.default_rng(12)
    for _ in range(2):                           # jvp replayed: the tangent read through the moved view
        t = rng.normal(size=x.shape)
        ty = ef.jvp(F, (x, w), (t, None))[1]
        close(ty, jax.jvp(lambda x: jax.vmap(jf, in_axes=(1, None))(x, w), (x,), (t,))[1], "jvp")


@pytest.mark.slow
def test_nested_vmap_on_moved_axes():
    """jacfwd / jacrev / vjp of vmap(vmap(f), in_axes=1): JAX's nested vmap on the same axes (the
    default suite checks such compositions in test_composition_labels.py)."""
    rng = np.random.default_rng(10)
    x = rng.uniform(-1.5, 1.5, (3, 5, 2, N))            # outer batch on axis 1 (5), inner on axis 0 (3)
    w = np.array([0.4])
    F = ef.vmap(ef.vmap(f, in_axes=(0, None)), in_axes=(1, None))
    JF = jax.vmap(jax.vmap(jf, in_axes=(0, None)), in_axes=(1, None))
    close(ef.jacfwd(F)(x, w), jax.jacfwd(JF)(x, w), "jacfwd")
    close(ef.jacrev(F)(x, w), jax.jacrev(JF)(x, w), "jacrev")
    y, pullback = ef.vjp(F, x, w)
    ct = rng.normal(size=np.shape(y))
    for got, want in zip(pullback(ct), jax.vjp(JF, x, w)[1](ct)):
        close(got, want, "vjp")


def test_one_array_batched_along_two_axes_orders():
    """x read as np.moveaxis(x, 1, 0) and as x itself: forward mode adds both tangents (JAX's);
    reverse mode cannot add the two cotangents' layouts: refused naming the function and the fix."""
    @ef.Graph.builder
    def both(x, y, w):
        g = ef.Graph()
        g.result = energy(mix(x, w)) + energy(mix(y, w))
        return g
    rng = np.random.default_rng(11)
    x = rng.uniform(-1.5, 1.5, (2, 2, N))
    w = np.array([0.3])
    keep = x.copy()
    F = ef.vmap(both, in_axes=(0, 1, None))

    def jboth(x, y, w):
        return jf(x, w) + jf(y, w)
    JF = jax.vmap(jboth, in_axes=(0, 1, None))

    def twice(x):
        return F(x, x, w)
    close(ef.jacfwd(twice)(x), jax.jacfwd(lambda x: JF(x, x, w))(x), "jacfwd")
    with pytest.raises(ValueError, match="twice with its axes in different orders") as info:
        ef.jacrev(twice)(x)
    msg = str(info.value)
    assert "eagle_fx.jacrev(twice)" in msg and "twice (" in msg and "y = x.copy()" in msg
    np.testing.assert_array_equal(x, keep)
    # what the refusal says to write: two arguments, a copy made outside, the derivatives added
    gx, gy = ef.jacrev(lambda x, y: F(x, y, w), (0, 1))(x, x.copy())
    close(gx + gy, jax.jacrev(lambda x: JF(x, x, w))(x), "the fix")


@pytest.mark.parametrize("backend", ["jax", "fake-cuda"])
def test_on_the_jax_backend_and_the_cuda_lowering(backend):
    """The graphs run there too: the moved view of x, its tangent moved as well, the cotangent
    seen back. (On CUDA, reverse mode only: a tangent moved with x is a strided view, and the
    CUDA backend refuses an input array that is not C-contiguous, by name.)"""
    from eagle_fx.backends.select import use_backend
    x, w = _args(13, 1, None)
    F, JF = _moved_pair()
    t = np.random.default_rng(14).normal(size=x.shape)
    with use_backend(backend):
        close(ef.jacrev(F)(x, w), jax.jacrev(JF)(x, w), "jacrev")
        if backend == "jax":
            close(ef.jvp(F, (x, w), (t, None))[1], jax.jvp(lambda x: JF(x, w), (x,), (t,))[1], "jvp")
            close(ef.jacfwd(F)(x, w), jax.jacfwd(JF)(x, w), "jacfwd")


def test_a_transposed_argument_handed_on_by_a_plain_function():
    """x.T is the same permuted view a vmap makes: followed back to x (it was refused as a view)."""
    x = np.random.default_rng(15).uniform(-1.5, 1.5, (N, 2))
    w = np.array([0.6])
    close(ef.grad(lambda x, w: f(x.T, w))(x, w), jax.grad(lambda x, w: jf(x.T, w)[0])(x, w), "grad")
    close(ef.jacfwd(lambda x, w: f(x.T, w))(x, w), jax.jacfwd(lambda x, w: jf(x.T, w))(x, w), "jacfwd")
