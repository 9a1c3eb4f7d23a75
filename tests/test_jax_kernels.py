"""Kernels called on jax.Arrays: every primitive lowered to jax.numpy, checked against the same
kernel on NumPy arrays (the NumPy emitter) and against derivatives written by hand; jax.grad,
jax.vmap and jax.jit of kernel calls."""
import numpy as np
import pytest

jax = pytest.importorskip("jax")
jax.config.update("jax_enable_x64", True)      # float64 planes, as NumPy's
import jax.numpy as jnp  # noqa: E402

import hawk_fx as hawk  # noqa: E402
from hawk_fx import Matrix, Mutable, Param, Scalar, UInt32, Vector  # noqa: E402
from hawk_fx import math as hm  # noqa: E402


@hawk.kernel
def unary(x: Scalar):
    return {"abs": hm.abs(x), "sign": hm.sign(x), "floor": hm.floor(x), "ceil": hm.ceil(x), "round": hm.round(x),
            "trunc": hm.trunc(x), "sqrt": hm.sqrt(hm.abs(x)), "rsqrt": hm.rsqrt(hm.abs(x) + 1), "cbrt": hm.cbrt(x),
            "exp": hm.exp(x), "exp2": hm.exp2(x), "expm1": hm.expm1(x), "log": hm.log(hm.abs(x) + 1),
            "log2": hm.log2(hm.abs(x) + 1), "log10": hm.log10(hm.abs(x) + 1), "log1p": hm.log1p(hm.abs(x)),
            "sin": hm.sin(x), "cos": hm.cos(x), "tan": hm.tan(x), "asin": hm.asin(x / 4), "acos": hm.acos(x / 4),
            "atan": hm.atan(x), "sinh": hm.sinh(x), "cosh": hm.cosh(x), "tanh": hm.tanh(x), "asinh": hm.asinh(x),
            "acosh": hm.acosh(hm.abs(x) + 1), "atanh": hm.atanh(x / 4), "erf": hm.erf(x), "erfc": hm.erfc(x),
            "isfinite": hm.isfinite(x / x), "isnan": hm.isnan(x / x), "isinf": hm.isinf(1 / x), "neg": -x,
            "not": hm.logical_not(x > 0)}


@hawk.kernel
def binary(x: Scalar, y: Scalar, k: Scalar):
    return {"add": x + y, "sub": x - y, "mul": x * y, "div": x / y, "floordiv": x // y, "mod": x % y,
            "pow": hm.pow(hm.abs(x), y), "atan2": hm.atan2(x, y), "hypot": hm.hypot(x, y), "fmod": hm.fmod(x, y),
            "min": hm.minimum(x, y), "max": hm.maximum(x, y), "lt": x < y, "le": x <= y, "gt": x > y, "ge": x >= y,
            "eq": x == k, "ne": x != k, "and": hm.logical_and(x > 0, y > 0), "or": hm.logical_or(x > 0, y > 0),
            "where": hm.where(x > y, x, k), "clip": hm.clip(x, -0.5, 0.5)}


@hawk.kernel
def integers(i: UInt32, j: UInt32):
    return {"add": i + j, "mul": i * 3, "floordiv": i // (j + 1), "mod": i % (j + 1), "f": hm.float32(i) / 2,
            "count": hawk.sum(i > j)}


@hawk.kernel
def reductions(x: Scalar, a: Param):
    return hawk.sum(x * a), hawk.max(x), hawk.min(x), hawk.mean(x), x - hawk.mean(x)


@hawk.kernel
def tensors(v: Vector[3], w: Vector[3], m: Matrix[3, 3]):
    return {"dot": hm.dot(v, w), "norm": hm.norm(v), "cross": hm.cross(v, w), "outer": hm.outer(v, w),
            "mv": hm.matmul(m, v), "mm": hm.matmul(m, hm.transpose(m)), "trace": hm.trace(m),
            "ein": hm.einsum("ij,j,i->", m, v, w), "vec": hm.vec(v[0], w[1], 1.0), "row": m[1]}


@hawk.kernel
def wobble(x: Scalar, a: Param):
    return hm.sin(x) * x * a + hm.exp(-x * x)


@hawk.kernel
def push(x: Scalar, y: Mutable[Scalar]):
    y = y + x


def test_every_kernel_primitive_has_a_jax_rule():
    from hawk_fx import prims
    from hawk_fx.emit.jax import jax_rules
    missing = [name for name, p in prims.P.items() if p not in jax_rules]
    assert not missing, f"no JAX rule for {missing}"


@hawk.kernel
def stable(x: Scalar, y: Scalar):
    return {"sigmoid": hm.sigmoid(x), "logaddexp": hm.logaddexp(x, y), "xlogy": hm.xlogy(x, hm.abs(y)),
            "xlog1py": hm.xlog1py(x, hm.abs(y)), "stop": hm.stop_gradient(x) * y}


def test_the_stable_functions_match_numpy(rng):
    x, y = rng.normal(size=32) * 30, rng.normal(size=32)
    x[:2] = 0.0
    same(stable(jnp.asarray(x), jnp.asarray(y)), stable(x, y))
    g = jax.grad(lambda u: stable(u, jnp.asarray(y))["stop"].sum())(jnp.asarray(x))
    np.testing.assert_array_equal(g, np.zeros(32))          # stop_gradient stops JAX's gradient too


def same(got, want, rtol=1e-13, atol=1e-13):
    got_l, want_l = jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)
    assert len(got_l) == len(want_l)
    for g, w in zip(got_l, want_l):
        g = np.asarray(g)
        assert g.dtype == w.dtype and g.shape == w.shape, (g.dtype, w.dtype, g.shape, w.shape)
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, equal_nan=True)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_every_elementwise_primitive_matches_numpy(rng):
    x = rng.uniform(-3, 3, 64)
    x[:3] = (0.0, 2.5, -1.5)
    y = rng.uniform(0.5, 2, 64)
    same(unary(jnp.asarray(x)), unary(x))
    same(binary(jnp.asarray(x), jnp.asarray(y), jnp.asarray(np.round(x))), binary(x, y, np.round(x)))


def test_float32_and_integers_keep_numpy_dtypes(rng):
    x = rng.uniform(-3, 3, 16).astype(np.float32)
    same(unary(jnp.asarray(x)), unary(x), rtol=2e-6, atol=2e-6)
    i = rng.integers(0, 50, 16).astype(np.uint32)
    j = rng.integers(0, 50, 16).astype(np.uint32)
    same(integers(jnp.asarray(i), jnp.asarray(j)), integers(i, j))


def test_reductions_vectors_matrices_einsum(rng):
    x = rng.normal(size=40)
    same(reductions(jnp.asarray(x), 1.5), reductions(x, 1.5))
    v, w, m = rng.normal(size=(3, 9)), rng.normal(size=(3, 9)), rng.normal(size=(3, 3, 9))
    same(tensors(jnp.asarray(v), jnp.asarray(w), jnp.asarray(m)), tensors(v, w, m))
    same(tensors(jnp.asarray(v), jnp.asarray(w[:, :1]), jnp.asarray(m[..., :1])), tensors(v, w[:, :1], m[..., :1]))


def test_jax_grad_jit_vmap_of_kernel_calls(rng):
    x = rng.uniform(-2, 2, 32)
    want = 2.5 * (np.cos(x) * x + np.sin(x)) - 2 * x * np.exp(-x * x)        # by hand
    got = jax.jit(jax.grad(lambda u: wobble(u, 2.5).sum()))(jnp.asarray(x))
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    # a traced Param: d/da sum(sin(x) x a) = sum(sin(x) x)
    ga = jax.grad(lambda a: wobble(jnp.asarray(x), a).sum())(jnp.float64(2.5))
    np.testing.assert_allclose(ga, np.sum(np.sin(x) * x), rtol=1e-12)
    xs = rng.uniform(-2, 2, (4, 32))
    got = jax.vmap(lambda u: reductions(u, 2.0)[3])(jnp.asarray(xs))
    np.testing.assert_allclose(np.asarray(got)[:, 0], xs.mean(axis=1), rtol=1e-12)


def test_mutable_write_on_a_jax_array_is_refused():
    with pytest.raises(TypeError, match="writes its Mutable parameter.*'y'.*return the new value"):
        push(jnp.ones(4), jnp.zeros(4))
