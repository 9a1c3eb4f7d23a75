"""Derivatives over a vmap whose control flow differs by instance, and over vmap(vmap(f)), against
JAX's nested transforms of the same math (x64).

`walk` has a capped loop whose guard is read from the data, a counted loop whose trip count is a
per-instance cell, an `if` on a per-instance cell and a `match` on a per-instance selector: under
vmap every one runs per instance (masked). JAX's version unrolls the capped loop to its cap and
the counted loop to the largest trip count, freezing finished turns with jnp.where, and selects
the arms with jnp.where / lax.switch. A derivative over the vmap (jacfwd(vmap(f)), jacrev,
vjp, grad of a sum) and a vmap over such a derivative batch those per-instance constructs again."""
from __future__ import annotations

import numpy as np
import pytest

import eagle_fx as ef
import hawk_fx as hawk
from hawk_fx import Mutable, Param, Scalar, UInt32
from hawk_fx import math as hm

jax = pytest.importorskip("jax")
jax.config.update("jax_enable_x64", True)
jnp = jax.numpy

CAP, NMAX = 5, 4

from test_compose_matrix import score, shrink, step, wob  # noqa: E402  (the matrix's kernels, its math)


@hawk.kernel
def above(x: Scalar, lim: Param) -> UInt32:
    return hm.uint32(hawk.sum(hm.abs(x) > lim))


@hawk.kernel
def positive(x: Scalar) -> UInt32:
    return hm.uint32(hawk.sum(x) > 0.0)


@ef.Graph.builder
def walk(x, a, lim, n, op):
    g = ef.Graph()
    flag = above(x, lim)
    for _ in range(CAP):                 # a capped loop: its guard is read from the data
        if not flag:
            break
        x = shrink(x)
        flag = above(x, lim)
    for _ in range(n):                   # a counted loop: n is a cell
        x = step(x, a)
    if positive(x):                      # an if on a cell computed from the data
        x = wob(x)
    match op:                            # a match on a selector cell
        case 0:
            x = shrink(x)
        case 1:
            x = step(x, a)
        case _:
            x = wob(x)
    g.result = score(x)
    return g


def jwalk(s, a, lim, n, op):
    """walk on a scalar in JAX: loops unrolled with finished turns frozen, arms selected."""
    def j_shrink(s):
        return 0.6 * s + 0.1 * jnp.sin(s)

    def j_step(s):
        return a * s + 0.1 * jnp.tanh(s)

    def capped(_, state):
        s, run = state
        s = jnp.where(run, j_shrink(s), s)
        return s, run & (jnp.abs(s) > lim)
    s = jax.lax.fori_loop(0, CAP, capped, (s, jnp.abs(s) > lim))[0]
    s = jax.lax.fori_loop(0, NMAX, lambda i, s: jnp.where(i < n, j_step(s), s), s)
    s = jnp.where(s > 0, jnp.sin(s) * s, s)
    s = jax.lax.switch(jnp.clip(op, 0, 2), [j_shrink, j_step, lambda s: jnp.sin(s) * s], s)
    return s * s + 0.3 * s


def case(rng, B):
    """B instances with their own turns, arms and selectors: ours (cells (B, 1)) and JAX's (flat)."""
    x = rng.uniform(-2.0, 2.0, B)
    a = rng.uniform(0.6, 1.2, B)
    lim = rng.uniform(0.2, 0.9, B)
    n = rng.integers(0, NMAX + 1, B).astype(np.uint32)
    op = rng.integers(0, 4, B).astype(np.uint32)
    ours = (x[:, None].copy(), a[:, None].copy(), lim[:, None].copy(), n[:, None].copy(), op[:, None].copy())
    return ours, (x, a, lim, n.astype(np.int64), op.astype(np.int64))


def close(got, want):
    got, want = np.asarray(got), np.asarray(want)
    assert got.size == want.size, f"{got.shape} vs JAX's {want.shape}"
    np.testing.assert_allclose(got.reshape(want.shape), want, rtol=1e-9, atol=1e-11)


def per_instance(rng, B=4):
    """A case whose instances surely differ in their capped turns and in their arms."""
    while True:
        ours, theirs = case(rng, B)
        x, _, lim, n, op = theirs
        if len(set(np.round(np.abs(x) / lim, 1))) == B and len(set(op)) > 1 and len(set(n)) > 1:
            return ours, theirs


def test_jacfwd_jacrev_vjp_and_grad_over_a_vmap_with_per_instance_control_flow():
    ours, theirs = per_instance(np.random.default_rng(0))
    keep = [a.copy() for a in ours]
    f = ef.vmap(walk_values)
    jf = jax.vmap(jwalk)
    for name in ("jacfwd", "jacrev"):
        close(getattr(ef, name)(f)(*ours), jax.jit(getattr(jax, name)(jf))(*theirs))
    y, pullback = ef.vjp(f, *ours)
    ct = np.arange(1.0, 5.0)[:, None]
    _, jpb = jax.vjp(lambda x: jf(x, *theirs[1:]), theirs[0])
    close(y, jf(*theirs))
    close(pullback(ct)[0], jpb(ct.ravel())[0])
    # the gradient of the instances' sum: the pullback of ones (a staged result has no .sum())
    close(pullback(np.ones((4, 1)))[0], jax.grad(lambda x: jnp.sum(jf(x, *theirs[1:])))(theirs[0]))
    for a, k in zip(ours, keep):
        np.testing.assert_array_equal(a, k)


def walk_values(x, a, lim, n, op):
    return walk(x, a, lim, n, op)


def test_a_shared_parameter_sums_its_cotangent_over_the_instances():
    """`a` is shared (in_axes None) and read in the per-instance loop: its Jacobian sums every
    instance's turns, each instance its own count."""
    ours, theirs = per_instance(np.random.default_rng(1))
    a = np.array([0.9])
    f = ef.vmap(walk_values, in_axes=(0, None, 0, 0, 0))
    jf = jax.vmap(jwalk, in_axes=(0, None, 0, 0, 0))
    args = (ours[0], a) + ours[2:]
    jargs = (theirs[0], 0.9) + theirs[2:]
    for name in ("jacfwd", "jacrev"):
        close(getattr(ef, name)(f, argnums=1)(*args), jax.jit(getattr(jax, name)(jf, argnums=1))(*jargs))


def test_a_hessian_of_a_vmap_with_per_instance_control_flow():
    """jacfwd(jacrev(vmap(f))): each row of the Jacobian its own cotangent basis vector."""
    ours, theirs = per_instance(np.random.default_rng(2), B=3)
    close(ef.jacfwd(ef.jacrev(ef.vmap(walk_values)))(*ours), jax.jit(jax.jacfwd(jax.jacrev(jax.vmap(jwalk))))(*theirs))


@pytest.mark.slow
def test_more_second_derivatives_over_a_vmap_with_per_instance_control_flow():
    ours, theirs = per_instance(np.random.default_rng(2), B=3)
    f = ef.vmap(walk_values)
    jf = jax.vmap(jwalk)
    close(ef.jacfwd(ef.jacfwd(f))(*ours), jax.jit(jax.jacfwd(jax.jacfwd(jf)))(*theirs))
    close(ef.jacrev(ef.jacrev(f))(*ours), jax.jit(jax.jacrev(jax.jacrev(jf)))(*theirs))
    close(ef.vmap(ef.jacrev(f))(*[np.stack([o, o]) for o in ours]),
          jax.jit(jax.vmap(jax.jacrev(jf)))(*[np.stack([t, t]) for t in theirs]))


def test_derivatives_of_vmap_of_vmap():
    """jacfwd, jacrev and jvp of vmap(vmap(f)), each instance of both batches its own turns and arms."""
    rng = np.random.default_rng(3)
    x = rng.uniform(-2.0, 2.0, (2, 3))
    op = np.array([[0, 1, 2], [2, 0, 1]])
    out_axis = 0
    n = np.array([2], np.uint32)
    axes = (0, None, None, None, 0)
    f = ef.vmap(ef.vmap(walk_values, in_axes=axes), in_axes=(out_axis, None, None, None, out_axis))
    jf = jax.vmap(jax.vmap(jwalk, in_axes=axes), in_axes=(out_axis, None, None, None, out_axis))
    ours = (x[..., None].copy(), 0.8, 0.5, n, op[..., None].astype(np.uint32))
    theirs = (x, 0.8, 0.5, 2, op)
    close(f(*ours), jf(*theirs))
    close(ef.jacfwd(f)(*ours), jax.jit(jax.jacfwd(jf), static_argnums=(3,))(*theirs))
    close(ef.jacrev(f)(*ours), jax.jit(jax.jacrev(jf), static_argnums=(3,))(*theirs))
    t = rng.normal(size=x.shape)
    _, tan = ef.jvp(lambda u: f(u, *ours[1:]), (ours[0],), (t[..., None],))
    close(tan, jax.jvp(lambda u: jf(u, *theirs[1:]), (x,), (t,))[1])


@pytest.mark.parametrize("seed", [0, 1, 2] + [pytest.param(s, marks=pytest.mark.slow) for s in range(3, 12)])
def test_random_instances_turns_and_arms(seed):
    """A seeded sweep: random inputs, limits, trip counts and selectors per instance (so random
    turns and arms per instance); jacfwd, jacrev and vjp of the vmap against JAX."""
    rng = np.random.default_rng(100 + seed)
    B = int(rng.integers(1, 6))
    ours, theirs = case(rng, B)
    f = ef.vmap(walk_values)
    jf = jax.vmap(jwalk)
    name = ("jacfwd", "jacrev")[seed % 2]
    close(getattr(ef, name)(f)(*ours), jax.jit(getattr(jax, name)(jf))(*theirs))
    ct = rng.normal(size=(B, 1))
    _, pullback = ef.vjp(f, *ours)
    _, jpb = jax.vjp(lambda x: jf(x, *theirs[1:]), theirs[0])
    close(pullback(ct)[0], jpb(ct.ravel())[0])


def test_a_derivative_through_a_batch_on_another_axis_follows_the_argument():
    """jacfwd(vmap(vmap(f), in_axes=1)) once gave zeros, then was refused: the graph reads x with its
    axes moved, and the derivative follows x itself, as JAX's does."""
    x = np.random.default_rng(4).uniform(-2.0, 2.0, (3, 2, 1))
    keep = x.copy()
    ours = (0.8, 0.5, np.array([2], np.uint32), np.array([1], np.uint32))
    shared = (None, None, None, None)
    f = ef.vmap(ef.vmap(walk_values, in_axes=(0,) + shared), in_axes=(1,) + shared)
    jf = jax.vmap(jax.vmap(jwalk, in_axes=(0,) + shared), in_axes=(1,) + shared)
    for name in ("jacfwd", "jacrev"):
        close(getattr(ef, name)(f)(x, *ours), jax.jit(getattr(jax, name)(jf))(x[..., 0], 0.8, 0.5, 2, 1))
    np.testing.assert_array_equal(x, keep)


@pytest.mark.parametrize("backend", ["jax", "fake-cuda"])
def test_on_the_jax_backend_and_the_cuda_lowering(backend):
    """The masks over both batches (a Jacobian's basis over per-instance loops) lower there too."""
    from eagle_fx.backends.select import use_backend
    ours, theirs = per_instance(np.random.default_rng(5), B=3)
    f = ef.vmap(walk_values)
    jf = jax.vmap(jwalk)
    with use_backend(backend):
        close(ef.jacfwd(f)(*ours), jax.jit(jax.jacfwd(jf))(*theirs))
        close(ef.jacrev(f)(*ours), jax.jit(jax.jacrev(jf))(*theirs))


@ef.Graph.builder
def dropped(x, lim):
    g = ef.Graph()
    y = wob(x)
    flag = above(x, lim)
    for _ in range(CAP):
        if not flag:
            break
        x = shrink(x)
        y = wob(x)                       # carried, never read after the loop: pruned
        flag = above(x, lim)
    g.result = score(x)
    return g


def jdropped(s, lim):
    def capped(_, state):
        s, run = state
        s = jnp.where(run, 0.6 * s + 0.1 * jnp.sin(s), s)
        return s, run & (jnp.abs(s) > lim)
    s = jax.lax.fori_loop(0, CAP, capped, (s, jnp.abs(s) > lim))[0]
    return s * s + 0.3 * s


def test_reverse_mode_over_a_per_instance_loop_whose_unread_carry_was_pruned():
    x, lim = np.array([1.5, 0.3, -1.9]), np.array([0.5, 0.5, 0.4])
    f = ef.vmap(lambda u, v: dropped(u, v))
    close(ef.jacrev(f)(x[:, None].copy(), lim[:, None].copy()), jax.jit(jax.jacrev(jax.vmap(jdropped)))(x, lim))


@ef.Graph.builder
def halving(x, flag, lim):
    g = ef.Graph()
    for _ in range(CAP):
        if not flag:
            break
        x = shrink(x)
        flag = above(x, lim)
    g.result = score(x)
    return g


@hawk.kernel
def still_above(x: Scalar, lim: Param, flag: Mutable[UInt32]):
    flag = hm.uint32(hawk.sum(hm.abs(x) > lim))


@ef.Graph.builder
def halving_in_place(x, flag, lim):
    g = ef.Graph()
    for _ in range(CAP):
        if not flag:
            break
        x = shrink(x)
        still_above(x, lim, flag)        # writes the caller's flag
    g.result = score(x)
    return g


def test_a_second_batch_over_a_per_instance_loop_that_writes_in_place_is_refused():
    x = np.random.default_rng(6).uniform(-2.0, 2.0, (2, 3, 1))
    flags = np.ones((2, 3, 1), np.uint32)
    keep = flags.copy()
    inner = ef.vmap(lambda u, f: halving_in_place(u, f, 0.5))
    with pytest.raises(ValueError, match="writes an array in place") as info:
        ef.vmap(lambda u, f: inner(u, f))(x, flags)
    assert "eagle_fx.vmap(eagle_fx.vmap(f))" in str(info.value)
    np.testing.assert_array_equal(flags, keep)
    # without the write, the same loop batched twice runs each instance's own turns
    got = ef.vmap(lambda u, f: ef.vmap(lambda v, g: halving(v, g, 0.5))(u, f))(x, flags)
    want = jax.vmap(jax.vmap(jhalving))(x[..., 0])
    close(got, want)


def jhalving(s, lim=0.5):
    """halving with its flag set on entry: the first turn always runs."""
    def capped(_, state):
        s, run = state
        s = jnp.where(run, 0.6 * s + 0.1 * jnp.sin(s), s)
        return s, run & (jnp.abs(s) > lim)
    s = jax.lax.fori_loop(0, CAP, capped, (s, True))[0]
    return s * s + 0.3 * s
