"""eagle_fx.tree (flatten, unflatten, map, leaves, registered classes under every transform),
eagle_fx.linearize, eagle_fx.linear_transpose and eagle_fx.eval_shape. Oracles: jax.tree_util on the
same trees, jax.linearize / jax.eval_shape on the same math in jax.numpy, explicit matrices (NumPy)
for transposes, finite differences."""
import dataclasses
from typing import NamedTuple

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402

import eagle_fx  # noqa: E402
from eagle_fx import tree as et  # noqa: E402
from test_to_jax import X, until  # noqa: E402
from test_to_jax_forward import jax_until, turns  # noqa: E402
from tour_kernels import add, affine, cell, dbl, total, wobble  # noqa: E402


class Pair(NamedTuple):
    a: object
    b: object


@dataclasses.dataclass
class Box:
    u: object
    v: object


class Point:
    """A user class made a tree node by registration (aux data: its label)."""

    def __init__(self, x, a, label="p"):
        self.x, self.a, self.label = x, a, label


et.register_pytree_node(Point, lambda p: ((p.x, p.a), p.label), lambda label, kids: Point(*kids, label))
jax.tree_util.register_pytree_node(Point, lambda p: ((p.x, p.a), p.label), lambda label, kids: Point(*kids, label))


def random_tree(rng, depth=0):
    """A random nest of tuples, lists, sorted-key dicts, NamedTuples, None and Points over small arrays."""
    kind = rng.integers(0, 7 if depth < 3 else 1)
    if kind == 0:
        return np.full(int(rng.integers(1, 4)), float(rng.normal()))
    kids = [random_tree(rng, depth + 1) for _ in range(int(rng.integers(1, 4)))]
    if kind == 1:
        return tuple(kids)
    if kind == 2:
        return list(kids)
    if kind == 3:
        return {f"k{j}": c for j, c in enumerate(kids)}
    if kind == 4:
        return Pair(kids[0], None)
    if kind == 5:
        return Point(kids[0], kids[-1], label=f"L{len(kids)}")
    return None


def test_tree_functions_agree_with_jax_tree_util_on_random_trees():
    rng = np.random.default_rng(3)
    for _ in range(60):
        t = random_tree(rng)
        leaves, treedef = et.tree_flatten(t)
        jl = jax.tree_util.tree_leaves(t)
        assert len(leaves) == len(jl) and all(a is b for a, b in zip(leaves, jl))
        assert et.tree_leaves(t) == leaves or all(a is b for a, b in zip(et.tree_leaves(t), leaves))
        back = et.tree_unflatten(treedef, [x * 2 for x in leaves])
        assert et.tree_structure(back) == treedef
        want = jax.tree_util.tree_leaves(jax.tree_util.tree_map(lambda x: x * 2 + 1, t))
        got = et.tree_leaves(et.tree_map(lambda x: x * 2 + 1, t))
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)


def test_registration_is_checked():
    with pytest.raises(ValueError, match="already a tree node"):
        et.register_pytree_node(Point, lambda p: ((), None), lambda a, k: None)

    class Bad:
        pass
    et.register_pytree_node(Bad, lambda b: ((1.0,), [1]), lambda a, k: Bad())
    with pytest.raises(TypeError, match="aux data .* not hashable"):
        et.tree_flatten(Bad())


@eagle_fx.Graph.builder
def point_loss(p, box):
    g = eagle_fx.Graph()
    g.result = total(add(affine(wobble(p.x), p.a, 0.5), box.u))
    return g


def jax_point_loss(p, box):
    y = p.a * (jnp.sin(p.x) * p.x) + 0.5 + box.u
    return jnp.sum(y * y)


def test_a_registered_class_goes_through_grad_and_jacfwd_as_itself():
    p = Point(np.linspace(0.1, 1.0, 4), np.array([2.0]), label="mine")
    box = Box(np.linspace(-1.0, 1.0, 4), 7)
    gp = eagle_fx.grad(point_loss)(p, box)
    assert isinstance(gp, Point) and gp.label == "mine"
    want = jax.grad(jax_point_loss)(Point(jnp.asarray(p.x), jnp.asarray(p.a), "mine"), box)
    np.testing.assert_allclose(gp.x, want.x, rtol=1e-12)
    np.testing.assert_allclose(gp.a, want.a, rtol=1e-12)
    gb = eagle_fx.grad(point_loss, argnums=1)(p, box)
    assert isinstance(gb, Box) and gb.v is None
    jf = eagle_fx.jacfwd(point_loss)(p, box)
    assert isinstance(jf, Point)
    np.testing.assert_allclose(np.reshape(jf.x, -1), want.x, rtol=1e-12)


def test_linearize_matches_jax_linearize_on_the_same_math():
    y, f_jvp = eagle_fx.linearize(until, X, cell(1))
    ry, rlin = jax.linearize(lambda u: jax_until(u, turns(X)), jnp.asarray(X))
    np.testing.assert_allclose(y[0], ry, rtol=1e-13)
    rng = np.random.default_rng(5)
    for _ in range(3):
        v = rng.normal(size=8)
        np.testing.assert_allclose(f_jvp(v, None)[0], rlin(jnp.asarray(v)), rtol=1e-12)
    x = X.copy()
    y2, f2 = eagle_fx.linearize(until, x, cell(1))
    x[:] = 100.0                                          # the primals were copied
    np.testing.assert_allclose(f2(np.ones(8), None), f_jvp(np.ones(8), None), rtol=1e-14)
    with pytest.raises(TypeError, match="a tangent .* per argument"):
        f_jvp(np.ones(8))


@eagle_fx.Graph.builder
def mix(x, y):
    g = eagle_fx.Graph()
    g.result = Pair(add(dbl(x), y), dbl(y))
    return g


@eagle_fx.Graph.builder
def shifted(x):
    g = eagle_fx.Graph()
    g.result = affine(x, 2.0, 1.0)
    return g


def test_linear_transpose_equals_the_transposed_matrix():
    n = 5
    ft = eagle_fx.linear_transpose(mix, eagle_fx.ShapeDtypeStruct((n,), np.float64), np.zeros(n))
    eye, zero = np.eye(n), np.zeros((n, n))
    m = np.block([[2 * eye, eye], [zero, 2 * eye]])       # (a, b) = M (x, y)
    rng = np.random.default_rng(9)
    for _ in range(3):
        ca, cb = rng.normal(size=n), rng.normal(size=n)
        cx, cy = ft(Pair(ca, cb))
        np.testing.assert_allclose(np.concatenate([cx, cy]), m.T @ np.concatenate([ca, cb]), rtol=1e-14)
    with pytest.raises(ValueError, match="linear_transpose: shifted is not linear.*affine offset"):
        eagle_fx.linear_transpose(shifted, np.zeros(n))


def test_eval_shape_matches_jax_eval_shape_and_runs_nothing():
    calls = []

    @eagle_fx.Graph.builder
    def watched(x, flag):
        g = eagle_fx.Graph()
        g.add_node(eagle_fx.opaque(lambda: calls.append(1), reads={}), name="watch")
        g.result = total(wobble(x))
        return g
    s = eagle_fx.eval_shape(until, eagle_fx.ShapeDtypeStruct((8,), np.float64), cell(1))
    assert s == eagle_fx.ShapeDtypeStruct((1,), np.dtype(np.float64))
    ref = lambda u: jnp.sum(u * u).reshape(1)  # noqa: E731
    scalar = lambda u: jnp.sum(u * u)  # noqa: E731   (eagle_fx.hessian of a one-cell value is (n, n))
    for f, g in [(eagle_fx.jacfwd(until), jax.jacfwd(ref)), (eagle_fx.hessian(until), jax.hessian(scalar))]:
        got = eagle_fx.eval_shape(f, jax.ShapeDtypeStruct((8,), jnp.float64), cell(1))
        want = jax.eval_shape(g, jax.ShapeDtypeStruct((8,), jnp.float64))
        assert (got.shape, got.dtype) == (want.shape, want.dtype)
    out = eagle_fx.eval_shape(mix, np.zeros(3), np.zeros(3))
    assert isinstance(out, Pair) and out.a.shape == (3,)
    eagle_fx.eval_shape(watched, np.zeros(8), cell(1))
    assert calls == []
