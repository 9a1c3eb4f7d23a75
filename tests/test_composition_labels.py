"""Refusals under jacfwd, jacrev, hessian and linearize name the composition the user wrote
(eagle_fx.jacfwd(vmap(vmap(loss)))), not the transforms those APIs stage inside (a vmap of jvp over
a basis); the caller's arrays are left as they were. Oracles: the composition each test builds,
written out by hand, and JAX (x64) on the same math for what the refusals point to."""
import numpy as np
import pytest

import eagle_fx as ef
from tour_kernels import cell, grow, total, wobble

jax = pytest.importorskip("jax")
jax.config.update("jax_enable_x64", True)
jnp = jax.numpy


@ef.Graph.builder
def loss(x):
    g = ef.Graph()
    g.result = total(wobble(x))
    return g


def jloss(x):
    return jnp.sum((jnp.sin(x) * x) ** 2)


@ef.Graph.builder
def int_count(x, n):
    g = ef.Graph()
    for _ in range(int(n[0])):
        x = grow(x, 1.1)
    g.result = total(x)
    return g


def moved():
    """vmap(vmap(loss)) batching axis 1 of its argument: the graph reads it with its axes moved."""
    return ef.vmap(ef.vmap(loss), in_axes=1)


MOVED = {
    "jacfwd": (lambda f, x: ef.jacfwd(f)(x), lambda f, x: jax.jacfwd(f)(x)),
    "jacrev": (lambda f, x: ef.jacrev(f)(x), lambda f, x: jax.jacrev(f)(x)),
    "hessian": (lambda f, x: ef.hessian(f)(x), lambda f, x: jax.hessian(f)(x)),
    "linearize": (lambda f, x: ef.linearize(f, x)[1](np.ones_like(x)),
                  lambda f, x: jax.linearize(f, x)[1](np.ones_like(x))),
    "jacfwd(jacrev)": (lambda f, x: ef.jacfwd(ef.jacrev(f))(x), lambda f, x: jax.jacfwd(jax.jacrev(f))(x)),
    "jacfwd(jacfwd)": (lambda f, x: ef.jacfwd(ef.jacfwd(f))(x), lambda f, x: jax.jacfwd(jax.jacfwd(f))(x)),
    "jacrev(jacfwd)": (lambda f, x: ef.jacrev(ef.jacfwd(f))(x), lambda f, x: jax.jacrev(jax.jacfwd(f))(x)),
    "vmap(jacfwd)": (lambda f, x: ef.vmap(ef.jacfwd(f))(x[None]), lambda f, x: jax.vmap(jax.jacfwd(f))(x[None])),
}


@pytest.mark.parametrize("written", list(MOVED))
def test_a_moved_batch_axis_gives_jax_s_derivatives(written):
    """Once refused (before that, zeros): the graph reads x with its axes moved and each
    derivative follows x itself."""
    x = np.random.default_rng(len(written)).uniform(-2.0, 2.0, (3, 2, 4))
    keep = x.copy()
    ours, theirs = MOVED[written]
    got = np.asarray(ours(moved(), x))
    want = np.asarray(theirs(jax.vmap(jax.vmap(jloss), in_axes=1), x))
    assert got.size == want.size, (got.shape, want.shape)
    np.testing.assert_allclose(got.reshape(want.shape), want, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(x, keep)


@pytest.mark.parametrize("api", ["jacfwd", "jacrev"])
def test_the_batch_axis_moved_first_by_hand_gives_jax_s_jacobian(api):
    x = np.random.default_rng(7).uniform(-2.0, 2.0, (3, 2, 4))
    first = np.ascontiguousarray(np.moveaxis(x, 1, 0))
    ours = getattr(ef, api)(ef.vmap(ef.vmap(loss)))(first)
    theirs = getattr(jax, api)(jax.vmap(jax.vmap(jloss)))(first)
    np.testing.assert_allclose(np.asarray(ours).reshape(np.shape(theirs)), theirs, rtol=1e-12, atol=1e-12)


OUTER = {
    "jacfwd": lambda f, x: ef.jacfwd(f)(x),
    "jacrev": lambda f, x: ef.jacrev(f)(x),
    "hessian": lambda f, x: ef.hessian(f)(x),
    "linearize": lambda f, x: ef.linearize(f, x),
}


@pytest.mark.parametrize("outer", list(OUTER))
def test_grad_of_a_vmap_is_refused_as_jax_refuses_it_naming_the_composition(outer):
    xs = np.random.default_rng(3).uniform(-1.0, 1.0, (2, 4))
    keep = xs.copy()
    with pytest.raises(TypeError):                               # JAX: grad needs a scalar output
        jax.grad(jax.vmap(jloss))(xs)
    with pytest.raises(TypeError) as info:
        OUTER[outer](ef.grad(ef.vmap(loss)), xs)
    msg = str(info.value)
    assert msg.startswith("eagle_fx.grad: vmap(loss) returns [(2, 1)]; grad needs one value"), msg
    assert msg.endswith(f"(in eagle_fx.{outer}(eagle_fx.grad(vmap(loss))))"), msg
    np.testing.assert_array_equal(xs, keep)
    with pytest.raises(TypeError) as info:                       # alone: nothing to add
        ef.grad(ef.vmap(loss))(xs)
    assert "(in eagle_fx." not in str(info.value)


def _wrap(api, f):
    if api == "vmap":
        return ef.vmap(f, in_axes=(0, None))
    return getattr(ef, api)(f)


def _chain(rng):
    """Outermost first: transforms around int_count, no vmap right inside a vmap (two merge), and
    linearize (it returns a Python function) only outermost."""
    chain = []
    for _ in range(int(rng.integers(1, 4))):
        pick = [a for a in ("jacfwd", "jacrev", "hessian", "vmap") if not (a == "vmap" and chain[-1:] == ["vmap"])]
        chain.append(pick[int(rng.integers(len(pick)))])
    if rng.integers(3) == 0:
        chain.insert(0, "linearize")
    return chain


@pytest.mark.parametrize("seed", range(12))
def test_int_of_a_cell_under_a_random_composition_names_every_transform_as_written(seed):
    """A seeded sweep of compositions: the refusal of `int(n[0])` as a loop count lists the
    transforms staging the builder, innermost first, exactly as the chain was written."""
    rng = np.random.default_rng(seed)
    chain = _chain(rng)
    x, n = rng.normal(size=(2,) * chain.count("vmap") + (3,)), cell(2)
    keep = x.copy()
    f = int_count
    for api in reversed(chain[1:] if chain[0] == "linearize" else chain):
        f = _wrap(api, f)
    with pytest.raises(IndexError) as info:
        if chain[0] == "linearize":
            ef.linearize(f, x, n)
        else:
            f(x, n)
    msg = str(info.value)
    want = "staged by " + " inside ".join(f"eagle_fx.{a}" for a in reversed(chain)) + ")"
    assert want in msg, (chain, msg)
    assert "int(n[0])" in msg and "for _ in range(n):" in msg
    np.testing.assert_array_equal(x, keep)
    assert n[0] == 2


def test_jacfwd_of_jacrev_is_named_as_written():
    assert ef.jacfwd(ef.jacrev(loss)).__name__ == "jacfwd(jacrev(loss))"
    assert ef.hessian(loss).__name__ == "hessian(loss)"
