"""Pytree arguments, value_and_grad, has_aux, tuple argnums, hessian and jacfwd(jacrev) against
JAX (jax.value_and_grad / jax.grad / jax.hessian / jax.jacfwd of the same computation written with
lax.cond and lax.fori_loop), in float32 and float64."""
import dataclasses
from typing import NamedTuple

import numpy as np
import pytest

import eagle_fx as ef
import hawk_fx as hawk
from hawk_fx import Param, Scalar
from hawk_fx import math as hm
from tour_kernels import cell

pytestmark = pytest.mark.usefixtures("backend_heavy")     # on numpy; on jax too with -m slow (compiles)

jax = pytest.importorskip("jax")
jax.config.update("jax_enable_x64", True)
jnp, lax = jax.numpy, jax.lax


@hawk.kernel
def layer(x: Scalar, a: Param, b: Param) -> Scalar:
    return hm.tanh(a * x + b)


@hawk.kernel
def sq_err(y: Scalar, t: Scalar) -> Scalar:
    return hawk.sum((y - t) * (y - t))


@hawk.kernel
def mean_sq(y: Scalar) -> Scalar:
    return hawk.mean(y * y)


@ef.Graph.builder
def forward(g: ef.Graph, params, x, flag, n):
    y = x
    if flag:
        y = layer(y, params["first"]["a"], params["first"]["b"])
    for _ in range(n):
        y = layer(y, params["loop"], 0.1)
    return y


@ef.Graph.builder
def model(params, x, t, flag, n):
    g = ef.Graph()
    g.result = sq_err(forward(g, params, x, flag, n), t)
    return g


@ef.Graph.builder
def model_aux(params, x, t, flag, n):
    g = ef.Graph()
    y = forward(g, params, x, flag, n)
    g.result = (sq_err(y, t), {"spread": mean_sq(y), "y": y})
    return g


def jforward(params, x, flag, n):
    first = params["first"]
    y = lax.cond(flag != 0, lambda y: jnp.tanh(first["a"] * y + first["b"]), lambda y: y, x)
    return lax.fori_loop(0, n, lambda i, y: jnp.tanh(params["loop"] * y + 0.1), y)


def jmodel(params, x, t, flag, n):
    return jnp.sum((jforward(params, x, flag, n) - t) ** 2)


def jmodel_aux(params, x, t, flag, n):
    y = jforward(params, x, flag, n)
    return jnp.sum((y - t) ** 2), {"spread": jnp.mean(y * y)[None], "y": y}


def data(dtype):
    rng = np.random.default_rng(1)
    params = {"first": {"a": np.array([0.7], dtype), "b": np.array([-0.2], dtype)}, "loop": np.array([1.3], dtype)}
    return params, rng.normal(size=9).astype(dtype), rng.normal(size=9).astype(dtype)


def close(a, b, dtype):
    tol = 2e-5 if dtype == np.float32 else 1e-10
    jax.tree_util.tree_map(lambda u, v: np.testing.assert_allclose(np.asarray(u).reshape(np.shape(v)), v, rtol=tol,
                                                                   atol=tol), a, jax.tree_util.tree_map(np.asarray, b))


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("flag,n", [(1, 3), (0, 2)])
def test_value_and_grad_of_a_dict_of_params(dtype, flag, n):
    params, x, t = data(dtype)
    v, g = ef.value_and_grad(model)(params, x, t, cell(flag), cell(n))
    jv, jg = jax.value_and_grad(jmodel)(params, x, t, flag, n)
    assert set(g) == {"first", "loop"} and set(g["first"]) == {"a", "b"} and g["loop"].dtype == dtype
    close(v, jv, dtype)
    close(g, jg, dtype)
    close(ef.grad(model)(params, x, t, cell(flag), cell(n)), jg, dtype)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_has_aux_and_tuple_argnums(dtype):
    params, x, t = data(dtype)
    (v, aux), g = ef.value_and_grad(model_aux, has_aux=True)(params, x, t, cell(1), cell(2))
    (jv, jaux), jg = jax.value_and_grad(jmodel_aux, has_aux=True)(params, x, t, 1, 2)
    close((v, aux, g), (jv, jaux, jg), dtype)
    g2, aux2 = ef.grad(model_aux, has_aux=True)(params, x, t, cell(1), cell(2))
    close((g2, aux2), (jg, jaux), dtype)
    gp, gx, gt = ef.grad(model, argnums=(0, 1, 2))(params, x, t, cell(1), cell(2))
    close((gp, gx, gt), jax.grad(jmodel, argnums=(0, 1, 2))(params, x, t, 1, 2), dtype)
    y, pullback, aux3 = ef.vjp(model_aux, params, x, t, cell(1), cell(2), has_aux=True)
    cts = pullback(np.full(1, 2.0, dtype))
    close((y, aux3, cts[0], cts[1]), (jv, jaux, *jax.tree_util.tree_map(lambda a: 2 * a,
                                                                          jax.grad(jmodel, (0, 1))(params, x, t, 1, 2))),
          dtype)
    assert cts[3] is None and cts[4] is None           # cells have no cotangent


class Lin(NamedTuple):
    a: np.ndarray
    b: np.ndarray


@dataclasses.dataclass
class Net:
    lin: Lin
    loop: np.ndarray


def test_namedtuple_and_dataclass_params():
    _, x, t = data(np.float64)

    @ef.Graph.builder
    def net_loss(net, x, t, n):
        g = ef.Graph()
        y = layer(x, net.lin.a, net.lin.b)
        for _ in range(n):
            y = layer(y, net.loop, 0.1)
        g.result = sq_err(y, t)
        return g

    def jnet(p, x, t):
        return jmodel({"first": {"a": p[0], "b": p[1]}, "loop": p[2]}, x, t, 1, 2)
    net = Net(Lin(np.array([0.7]), np.array([-0.2])), np.array([1.3]))
    g = ef.grad(net_loss)(net, x, t, cell(2))
    assert isinstance(g, Net) and isinstance(g.lin, Lin)
    jg = jax.grad(jnet)((net.lin.a, net.lin.b, net.loop), x, t)
    close((g.lin.a, g.lin.b, g.loop), jg, np.float64)


@hawk.kernel
def cubic(x: Scalar, a: Param) -> Scalar:
    return hawk.sum(a * x * x * x + hm.sin(x) * x)


@ef.Graph.builder
def poly(x, a, flag, n):
    g = ef.Graph()
    if flag:
        x = layer(x, a, 0.3)
    for _ in range(n):
        x = layer(x, 0.9, 0.1)
    g.result = cubic(x, a)
    return g


def jpoly(x, a, flag, n):
    x = lax.cond(flag != 0, lambda v: jnp.tanh(a * v + 0.3), lambda v: v, x)
    x = lax.fori_loop(0, n, lambda i, v: jnp.tanh(0.9 * v + 0.1), x)
    return jnp.sum(a * x ** 3 + jnp.sin(x) * x)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_hessian_and_jacfwd_of_jacrev(dtype):
    x, a = np.linspace(-0.8, 0.9, 5).astype(dtype), np.array([0.6], dtype)
    tol = 1e-4 if dtype == np.float32 else 1e-9
    want = np.asarray(jax.hessian(jpoly)(x, a, 1, 3))
    h = ef.hessian(poly)(x, a, cell(1), cell(3))
    assert h.shape == (5, 5) and h.dtype == dtype
    np.testing.assert_allclose(h, want, rtol=tol, atol=tol)
    jj = ef.jacfwd(ef.jacrev(poly))(x, a, cell(1), cell(3))
    assert jj.shape == (1, 5, 5)                      # a one-cell result keeps its axis, as JAX would
    np.testing.assert_allclose(jj[0], want, rtol=tol, atol=tol)
    blocks = ef.hessian(poly, argnums=(0, 1))(x, a, cell(1), cell(3))
    jb = jax.hessian(jpoly, argnums=(0, 1))(x, a, 1, 3)
    for r in range(2):
        for c in range(2):
            np.testing.assert_allclose(blocks[r][c], np.asarray(jb[r][c]), rtol=tol, atol=tol)


def test_jacobian_shapes_are_jaxs():
    @ef.Graph.builder
    def wide(x, a):
        g = ef.Graph()
        g.result = layer(x, a, 0.2)
        return g
    x, a = np.linspace(-1, 1, 4), np.array([0.5])

    def jwide(x, a):
        return jnp.tanh(a * x + 0.2)
    for ours, theirs in ((ef.jacfwd, jax.jacfwd), (ef.jacrev, jax.jacrev)):
        for k in (0, 1):
            want = np.asarray(theirs(jwide, argnums=k)(x, a))
            got = ours(wide, argnums=k)(x, a)
            assert got.shape == want.shape
            np.testing.assert_allclose(got, want, rtol=1e-12)
    for ours, theirs in ((ef.jacfwd, jax.jacfwd), (ef.jacrev, jax.jacrev)):
        g = ef.make_graph(ours(wide, argnums=1))(x, a)       # the graph's own result has JAX's shape
        g.launch()
        np.testing.assert_allclose(g.result, np.asarray(theirs(jwide, argnums=1)(x, a)), rtol=1e-12)
    h = ef.make_graph(ef.hessian(poly))(x, a, cell(1), cell(2))
    h.launch()
    np.testing.assert_allclose(h.result, np.asarray(jax.hessian(jpoly)(x, a, 1, 2)), rtol=1e-9, atol=1e-9)


def test_python_float_and_0d_arguments_are_differentiable():
    x = np.linspace(-0.8, 0.9, 5)
    want = float(jax.grad(jpoly, argnums=1)(x, 0.6, 1, 2))
    for a in (0.6, np.array(0.6)):
        g = ef.grad(poly, argnums=1)(x, a, cell(1), cell(2))
        assert np.shape(g) == ()
        np.testing.assert_allclose(g, want, rtol=1e-10)
    v, (gx, ga) = ef.value_and_grad(poly, argnums=(0, 1))(x, 0.6, cell(1), cell(2))
    assert np.shape(ga) == () and gx.shape == (5,)
    np.testing.assert_allclose(ga, want, rtol=1e-10)
    _, pullback = ef.vjp(poly, x, 0.6, cell(1), cell(2))
    cx, ca, cf, cn = pullback(np.ones(1))
    assert np.shape(ca) == () and cf is None and cn is None
    np.testing.assert_allclose(ca, want, rtol=1e-10)
    np.testing.assert_allclose(cx, np.asarray(jax.grad(jpoly)(x, 0.6, 1, 2)), rtol=1e-10)
    hx = ef.hessian(poly, argnums=1)(x, 0.6, cell(1), cell(2))
    np.testing.assert_allclose(hx, float(jax.hessian(jpoly, argnums=1)(x, 0.6, 1, 2)), rtol=1e-9)
    assert np.shape(hx) == ()


def test_jvp_tangent_trees_and_vmap_prefix_trees():
    params, x, t = data(np.float64)
    tan = {"first": {"a": np.array([1.0]), "b": None}, "loop": np.array([0.5])}
    _, ty = ef.jvp(model, (params, x, t, cell(1), cell(2)), (tan, None, None, None, None))
    jtan = {"first": {"a": np.array([1.0]), "b": np.zeros(1)}, "loop": np.array([0.5])}
    _, jty = jax.jvp(lambda p: jmodel(p, x, t, 1, 2), (params,), (jtan,))
    np.testing.assert_allclose(ty, np.asarray(jty).reshape(1), rtol=1e-10)

    loops = np.array([[0.9], [1.1], [1.3]])
    batched = dict(params, loop=loops)
    axes = ({"first": None, "loop": 0}, None, None, None, None)
    gs = ef.vmap(ef.grad(model), in_axes=axes)(batched, x, t, cell(1), cell(2))
    jgs = jax.vmap(jax.grad(jmodel), in_axes=({"first": None, "loop": 0}, None, None, None, None))(
        batched, x, t, 1, 2)
    close(gs, jgs, np.float64)
