"""jacfwd, jacrev and hessian with tree arguments (dicts, nested, with a Python float leaf and a
cell leaf) at argnums have the shapes and values of jax.jacfwd / jax.jacrev / jax.hessian of the
same computation; Graph.bind takes a dict argument leaf by leaf."""
import numpy as np
import pytest

import eagle_fx as ef
import hawk_fx as hawk
from conftest import refused
from hawk_fx import Param, Scalar
from hawk_fx import math as hm
from tour_kernels import cell

jax = pytest.importorskip("jax")
jax.config.update("jax_enable_x64", True)
jnp, lax = jax.numpy, jax.lax


@hawk.kernel
def layer(x: Scalar, a: Param, b: Param) -> Scalar:
    return hm.tanh(a * x + b)


@hawk.kernel
def mix(x: Scalar, w: Scalar) -> Scalar:
    return x * w + hm.sin(w)


@hawk.kernel
def sq_err(y: Scalar, t: Scalar) -> Scalar:
    return hawk.sum((y - t) * (y - t))


@ef.Graph.builder
def net(g: ef.Graph, p, x, flag, n):
    y = mix(x, p["w"])
    if flag:
        y = layer(y, p["first"]["a"], p["first"]["b"])
    for _ in range(n):
        y = layer(y, p["loop"], 0.1)
    return y


@ef.Graph.builder
def forward(p, x, flag, n):
    g = ef.Graph()
    g.result = net(g, p, x, flag, n)
    return g


@ef.Graph.builder
def model(p, x, t, flag, n):
    g = ef.Graph()
    g.result = sq_err(net(g, p, x, flag, n), t)
    return g


def jforward(p, x, flag, n):
    y = x * p["w"] + jnp.sin(p["w"])
    first = p["first"]
    y = lax.cond(flag != 0, lambda y: jnp.tanh(first["a"] * y + first["b"]), lambda y: y, y)
    return lax.fori_loop(0, n, lambda i, y: jnp.tanh(p["loop"] * y + 0.1), y)


def jmodel(p, x, t, flag, n):
    return jnp.sum((jforward(p, x, flag, n) - t) ** 2)


N = 4
rng = np.random.default_rng(7)
X, T = rng.normal(size=N), rng.normal(size=N)


def params(dtype=np.float64):
    return {"first": {"a": np.array([0.7], dtype), "b": np.array([-0.2], dtype)}, "loop": np.array([1.3], dtype),
            "w": rng.normal(size=N).astype(dtype)}


def same(ours, theirs, rtol=1e-9):
    """Same tree structure, shapes and values."""
    t1 = jax.tree_util.tree_structure(jax.tree_util.tree_map(np.asarray, ours))
    t2 = jax.tree_util.tree_structure(theirs)
    assert t1 == t2, (t1, t2)
    jax.tree_util.tree_map(lambda u, v: (np.testing.assert_equal(np.shape(u), np.shape(v)),
                                         np.testing.assert_allclose(u, v, rtol=rtol, atol=1e-11)), ours,
                           jax.tree_util.tree_map(np.asarray, theirs))


@pytest.mark.parametrize("flag,n", [(1, 2), (0, 3)])
def test_jacfwd_and_jacrev_of_a_dict_argument_match_jax(flag, n):
    p = params()
    for ours, theirs in ((ef.jacfwd, jax.jacfwd), (ef.jacrev, jax.jacrev)):
        same(ours(forward)(p, X, cell(flag), cell(n)), theirs(jforward)(p, X, flag, n))
        # argnums (0, 1): a tuple of a tree and an array
        same(ours(forward, argnums=(0, 1))(p, X, cell(flag), cell(n)),
             theirs(jforward, argnums=(0, 1))(p, X, flag, n))


@pytest.mark.parametrize("flag,n", [(1, 2), (0, 1)])
def test_hessian_of_a_dict_argument_matches_jax(flag, n):
    p = params()
    want = jax.hessian(jmodel)(p, X, T, flag, n)
    got = ef.hessian(model)(p, X, T, cell(flag), cell(n))
    # our one-value result is a one-cell array: jax's scalar loss has no result axes, and neither has ours
    same(got, want)
    same(ef.hessian(model, argnums=(0, 1))(p, X, T, cell(flag), cell(n)),
         jax.hessian(jmodel, argnums=(0, 1))(p, X, T, flag, n))
    # jacfwd(jacrev): JAX's recipe, with the one-cell result axis kept
    jj = ef.jacfwd(ef.jacrev(model))(p, X, T, cell(flag), cell(n))
    same(jax.tree_util.tree_map(lambda h: np.asarray(h)[0], jj,
                                is_leaf=lambda h: isinstance(h, np.ndarray)), want)


def test_a_python_float_leaf_and_a_float32_tree():
    p = params()
    pf = dict(p, loop=1.3)                     # a Python float leaf: its derivative axis is dropped, as in JAX
    same(ef.jacrev(forward)(pf, X, cell(1), cell(2)), jax.jacrev(jforward)(pf, X, 1, 2))
    same(ef.hessian(model)(pf, X, T, cell(1), cell(2)), jax.hessian(jmodel)(pf, X, T, 1, 2))
    p32 = params(np.float32)
    same(ef.jacfwd(forward)(p32, X.astype(np.float32), cell(1), cell(2)),
         jax.jacfwd(jforward)(p32, X.astype(np.float32), 1, 2), rtol=2e-5)


def test_a_tree_without_floating_leaves_is_refused():
    refused(TypeError, lambda: ef.jacfwd(forward, argnums=2)(params(), X, {"c": cell(1)}, cell(2)),
            "holds no floating array")


def test_bind_takes_a_dict_argument_leaf_by_leaf():
    p = params()
    g = model(p, X, T, cell(1), cell(2))
    np.testing.assert_allclose(g(), float(jmodel(p, X, T, 1, 2)), rtol=1e-12)
    q = params()
    g.bind(p=q)
    np.testing.assert_allclose(g(), float(jmodel(q, X, T, 1, 2)), rtol=1e-12)
    bad = dict(q, first={"a": q["first"]["a"]})
    refused(ValueError, lambda: g.bind(p=bad), "takes a tree of structure")
    refused(ValueError, lambda: g.bind(p=dict(q, w=np.ones(N + 1))), "changed shape/dtype")
    np.testing.assert_allclose(g(), float(jmodel(q, X, T, 1, 2)), rtol=1e-12)    # a refused bind changed nothing


def test_a_transformed_graph_binds_a_dict_argument():
    p, q = params(), params()
    h = ef.make_graph(ef.hessian(model))(p, X, T, cell(1), cell(2))
    same(h(), jax.hessian(jmodel)(p, X, T, 1, 2))
    h.bind(p=q)
    same(h(), jax.hessian(jmodel)(q, X, T, 1, 2))
    g = ef.grad(model).graph(p, X, T, cell(0), cell(3))
    g.bind(p=q, x=X[::-1].copy())
    same(g(), jax.grad(jmodel)(q, X[::-1], T, 0, 3))
    P = {"first": {"a": np.array([[0.7], [0.4]]), "b": np.array([[-0.2], [0.1]])}, "loop": np.array([[1.3], [0.9]]),
         "w": np.stack([p["w"], q["w"]])}
    vb = ef.vmap(model, in_axes=({"first": 0, "loop": 0, "w": 0}, None, None, None, None))(P, X, T, cell(1), cell(2))
    vb.bind(p=jax.tree_util.tree_map(lambda a: a[::-1].copy(), P))
    want = [float(jmodel(jax.tree_util.tree_map(lambda a: a[b], P), X, T, 1, 2)) for b in (1, 0)]
    np.testing.assert_allclose(np.ravel(vb()), want, rtol=1e-12)
