"""eagle_fx.vjp inside another transform: vmap of the pullback, grad and jvp of what the pullback
returns (second order), has_aux, against JAX (float64) on the same math, with a capped device loop
whose guard reads the data (JAX: unrolled to the cap, finished turns frozen with jnp.where)."""
from __future__ import annotations

import numpy as np
import pytest

import eagle_fx as ef
import hawk_fx as hawk
from hawk_fx import Param, Scalar, UInt32
from hawk_fx import math as hm
from eagle_fx.transforms.program import TransformError

jax = pytest.importorskip("jax")
jax.config.update("jax_enable_x64", True)
jnp = jax.numpy
tmap = jax.tree_util.tree_map

CAP, LIM = 5, 0.5


@hawk.kernel
def big(x: Scalar, lim: Param) -> UInt32:
    return hm.uint32(hawk.sum(hm.abs(x) > lim))


@hawk.kernel
def shrink(x: Scalar, a: Param) -> Scalar:
    return a * x + 0.1 * hm.sin(x)


@hawk.kernel
def wob(x: Scalar) -> Scalar:
    return hm.sin(x) * x


@hawk.kernel
def score(x: Scalar) -> Scalar:
    return hawk.sum(x * x + 0.3 * x)


@ef.Graph.builder
def f(x, a):
    g = ef.Graph()
    flag = big(x, LIM)
    for _ in range(CAP):                 # a capped loop: its guard is read from the data
        if not flag:
            break
        x = shrink(x, a)
        flag = big(x, LIM)
    g.result = (wob(x), score(x))
    return g


@ef.Graph.builder
def f_aux(x, a):
    g = ef.Graph()
    flag = big(x, LIM)
    for _ in range(CAP):
        if not flag:
            break
        x = shrink(x, a)
        flag = big(x, LIM)
    g.result = (wob(x), score(x))        # with has_aux: the value wob(x), the aux score(x)
    return g


@ef.Graph.builder
def f_tree(p):
    g = ef.Graph()
    g.result = (wob(shrink(p["x"], p["a"])), score(p["x"]))
    return g


def f_tree_j(p):
    u = p["a"] * p["x"] + 0.1 * jnp.sin(p["x"])
    return jnp.sin(u) * u, jnp.sum(p["x"] ** 2 + 0.3 * p["x"])[None]


def fj(x, a):
    for _ in range(CAP):
        flag = jnp.sum(jnp.abs(x) > LIM) > 0
        x = jnp.where(flag, a * x + 0.1 * jnp.sin(x), x)
    return jnp.sin(x) * x, jnp.sum(x * x + 0.3 * x)[None]


def close(ours, theirs):
    assert jax.tree_util.tree_structure(tmap(lambda u: 0, ours)) == \
        jax.tree_util.tree_structure(tmap(lambda u: 0, theirs))
    for o, t in zip(jax.tree_util.tree_leaves(ours), jax.tree_util.tree_leaves(theirs)):
        assert np.shape(o) == np.shape(t)
        np.testing.assert_allclose(o, np.asarray(t), rtol=1e-10, atol=1e-12)


def data(seed, B=3, n=4):
    rng = np.random.default_rng(seed)
    xs = rng.normal(size=(B, n)) * rng.uniform(0.5, 3.0)
    a = np.array([rng.uniform(0.4, 0.9)])
    return xs, a, rng.normal(size=(B, n)), rng.normal(size=(B, 1))


def test_vmap_of_pullback():
    xs, a, cs, ds = data(0)
    ours = ef.vmap(lambda x, c, d: ef.vjp(f, x, a)[1]((c, d)))(xs, cs, ds)
    close(ours, jax.vmap(lambda x, c, d: jax.vjp(fj, x, a)[1]((c, d)))(xs, cs, ds))


def test_vmap_of_pullback_on_a_cotangent_computed_in_python():
    xs, a, cs, ds = data(9)
    close(ef.vmap(lambda x, c, d: ef.vjp(f, x, a)[1]((c * 2.0, d)))(xs, cs, ds),
          jax.vmap(lambda x, c, d: jax.vjp(fj, x, a)[1]((c * 2.0, d)))(xs, cs, ds))


def test_vmap_of_result_and_pullback_shared_cotangent():
    xs, a, cs, ds = data(1)
    c, d = cs[0], ds[0]

    def ours(x):
        y, pb = ef.vjp(f, x, a)
        return y, pb((c, d))

    def theirs(x):
        y, pb = jax.vjp(fj, x, a)
        return y, pb((c, d))
    close(ef.vmap(ours)(xs), jax.vmap(theirs)(xs))


def test_grad_of_pullback_second_order():
    xs, a, cs, ds = data(2)
    x, c, d = xs[0], cs[0], ds[0]
    # the cotangent of the Param a is one value: its gradient in x and in a
    close(ef.grad(lambda u: ef.vjp(f, u, a)[1]((c, d))[1])(x),
          jax.grad(lambda u: jax.vjp(fj, u, a)[1]((c, d))[1][0])(x))
    close(ef.grad(lambda b: ef.vjp(f, x, b)[1]((c, d))[1])(a),
          jax.grad(lambda b: jax.vjp(fj, x, b)[1]((c, d))[1][0])(a))


def test_jacobians_of_pullback_and_a_python_float():
    xs, a, cs, ds = data(6)
    x, c, d = xs[0], cs[0], ds[0]
    close(ef.jacrev(lambda u: ef.vjp(f, u, a)[1]((c, d))[0])(x),
          jax.jacrev(lambda u: jax.vjp(fj, u, a)[1]((c, d))[0])(x))
    close(ef.jacfwd(lambda u: ef.vjp(f, u, a)[1]((c, d))[0])(x),
          jax.jacfwd(lambda u: jax.vjp(fj, u, a)[1]((c, d))[0])(x))
    # a Python float argument: its cotangent 0-d, per instance, as JAX's
    close(ef.vmap(lambda u, c, d: ef.vjp(f, u, 0.7)[1]((c, d)))(xs, cs, ds),
          jax.vmap(lambda u, c, d: jax.vjp(fj, u, 0.7)[1]((c, d)))(xs, cs, ds))


def test_pullback_called_twice():
    xs, a, cs, ds = data(7)

    def ours(x, c, d):
        y, pb = ef.vjp(f, x, a)
        return pb((c, d)), pb((cs[0], ds[0]))

    def theirs(x, c, d):
        y, pb = jax.vjp(fj, x, a)
        return pb((c, d)), pb((cs[0], ds[0]))
    close(ef.vmap(ours)(xs, cs, ds), jax.vmap(theirs)(xs, cs, ds))


def test_staged_cotangents():
    """A cotangent that is itself staged (the vjp's own result, another transform's): its Program
    is spliced in before the seed, so an outer derivative follows it too."""
    xs, a, cs, ds = data(8)
    t = cs[0]
    close(ef.vmap(lambda x, d: (lambda y, pb: pb((y[0], d)))(*ef.vjp(f, x, a)))(xs, ds),
          jax.vmap(lambda x, d: (lambda y, pb: pb((y[0], d)))(*jax.vjp(fj, x, a)))(xs, ds))
    close(ef.vmap(lambda x, d: ef.vjp(f, x, a)[1]((ef.jvp(f, (x, a), (t, None))[1][0], d)))(xs, ds),
          jax.vmap(lambda x, d: jax.vjp(fj, x, a)[1]((jax.jvp(lambda u: fj(u, a), (x,), (t,))[1][0], d)))(xs, ds))
    x, d = xs[0], ds[0]
    close(ef.grad(lambda u: (lambda y, pb: pb((y[0], d)))(*ef.vjp(f, u, a))[1])(x),
          jax.grad(lambda u: (lambda y, pb: pb((y[0], d)))(*jax.vjp(fj, u, a))[1][0])(x))


def test_jvp_of_pullback():
    xs, a, cs, ds = data(3)
    x, c, d, t = xs[0], cs[0], ds[0], cs[1]
    close(ef.jvp(lambda u: ef.vjp(f, u, a)[1]((c, d)), (x,), (t,)),
          jax.jvp(lambda u: jax.vjp(fj, u, a)[1]((c, d)), (x,), (t,)))


def test_tree_argument_and_vmap_of_grad_of_pullback():
    xs, a, cs, ds = data(11)
    c, d = cs[0], ds[0]
    close(ef.vmap(lambda x: ef.vjp(f_tree, {"x": x, "a": a})[1]((c, d)))(xs),
          jax.vmap(lambda x: jax.vjp(f_tree_j, {"x": x, "a": a})[1]((c, d)))(xs))
    close(ef.vmap(ef.grad(lambda u: ef.vjp(f, u, a)[1]((c, d))[1]))(xs),
          jax.vmap(jax.grad(lambda u: jax.vjp(fj, u, a)[1]((c, d))[1][0]))(xs))


def test_has_aux():
    xs, a, cs, _ = data(4)

    def ours(x, c):
        y, pb, aux = ef.vjp(f_aux, x, a, has_aux=True)
        return y, pb(c), aux

    def theirs(x, c):
        y, pb, aux = jax.vjp(fj, x, a, has_aux=True)
        return y, pb(c), aux
    close(ef.vmap(ours)(xs, cs), jax.vmap(theirs)(xs, cs))


@pytest.mark.parametrize("seed", range(3))
def test_seeded_sweep(seed):
    """Random sizes, scales (the loop runs 0 to CAP turns) and compositions."""
    rng = np.random.default_rng(100 + seed)
    B, n = int(rng.integers(1, 4)), int(rng.integers(1, 6))
    xs, a, cs, ds = data(seed + 10, B, n)
    close(ef.vmap(lambda x, c, d: ef.vjp(f, x, a)[1]((c, d)))(xs, cs, ds),
          jax.vmap(lambda x, c, d: jax.vjp(fj, x, a)[1]((c, d)))(xs, cs, ds))
    x, c, d = xs[0], cs[0], ds[0]
    close(ef.grad(lambda u: ef.vjp(f, u, a)[1]((c, d))[1])(x),
          jax.grad(lambda u: jax.vjp(fj, u, a)[1]((c, d))[1][0])(x))


def test_refusals():
    xs, a, cs, ds = data(5)
    kept = []

    def leak(x):
        y, pb = ef.vjp(f, x, a)
        kept.append(pb)
        return y
    ef.vmap(leak)(xs)
    outside = r"vmap\(eagle_fx.vjp\(f\)\).*inside a transformed function.*line \d+.*called outside it"
    with pytest.raises(TransformError, match=outside):
        kept[-1]((cs[0], ds[0]))
    with pytest.raises(ValueError, match=r"vjp\(f\)\).*the cotangent has structure.*same tree"):
        ef.vmap(lambda x, c: ef.vjp(f, x, a)[1](c))(xs, cs)
    with pytest.raises(ValueError, match=r"the cotangent of result 0 is .*\(4,\) float64"):
        ef.vmap(lambda x, c, d: ef.vjp(f, x, a)[1]((c[:2], d)))(xs, cs, ds)
    with pytest.raises(TransformError, match=r"line \d+.*staged result of \(1,\) float64.*the result is \(4,\)"):
        ef.vmap(lambda x, d: (lambda y, pb: pb((y[1], d)))(*ef.vjp(f, x, a)))(xs, ds)
    # outside any transform the pullback stays Python, as before
    y, pb = ef.vjp(f, xs[0], a)
    close(pb((cs[0], ds[0])), jax.vjp(fj, xs[0], a)[1]((cs[0], ds[0])))
