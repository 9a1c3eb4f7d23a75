"""hm.fma, copysign, remainder, rint, spacing, fdim, argmax and argmin: values against NumPy and
plain Python (edge cases: signed zeros, NaN, infinities, halves, ties), in float32 and float64, on
the NumPy and JAX emitters; derivatives against JAX and finite differences."""
import math

import numpy as np
import pytest

import hawk_fx as hawk
import hawk_fx.diff as hdiff
from hawk_fx import Scalar, Vector
from hawk_fx import math as hm

jax = pytest.importorskip("jax")
jax.config.update("jax_enable_x64", True)
jnp = jax.numpy

FLOATS = [np.float32, np.float64]
IDS = ["f32", "f64"]
EDGE_X = [0.0, -0.0, 1.5, 2.5, -2.5, -3.2, 7.0, np.nan, np.inf, -np.inf, 1e-30, -5.5]
EDGE_Y = [-1.0, 2.0, -0.0, 0.5, 3.0, -2.0, 7.0, 1.0, 3.0, 2.0, np.nan, -0.0]


@hawk.kernel
def extras(x: Scalar, y: Scalar, z: Scalar):
    return {"fma": hm.fma(x, y, z), "copysign": hm.copysign(x, y), "remainder": hm.remainder(x, y),
            "rint": hm.rint(x), "spacing": hm.spacing(x), "fdim": hm.fdim(x, y)}


def _fdim(a, b):
    """C's fdim, written out: NaN if either is NaN, else max(a - b, +0)."""
    if math.isnan(a) or math.isnan(b):
        return math.nan
    return a - b if a > b else 0.0


def oracle(x, y, z):
    with np.errstate(all="ignore"):
        return {"fma": x * y + z, "copysign": np.copysign(x, y), "remainder": np.remainder(x, y), "rint": np.rint(x),
                "spacing": np.spacing(x),
                "fdim": np.array([_fdim(float(a), float(b)) for a, b in zip(x, y)], x.dtype)}


def _inputs(dtype, rng, n=40):
    x = np.concatenate([EDGE_X, rng.uniform(-9, 9, n)]).astype(dtype)
    y = np.concatenate([EDGE_Y, rng.uniform(-4, 4, n)]).astype(dtype)
    z = rng.uniform(-3, 3, x.size).astype(dtype)
    return x, y, z


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("dtype", FLOATS, ids=IDS)
def test_values_match_numpy_and_c(dtype):
    x, y, z = _inputs(dtype, np.random.default_rng(1))
    got, want = extras(x, y, z), oracle(x, y, z)
    for name in want:
        assert got[name].dtype == dtype, name
        if name == "fma":          # a * b + c, rounded twice on NumPy
            np.testing.assert_allclose(got[name], want[name], rtol=4 * np.finfo(dtype).eps, equal_nan=True)
        else:
            np.testing.assert_array_equal(got[name], want[name], err_msg=name)
            np.testing.assert_array_equal(np.signbit(got[name]), np.signbit(want[name]), err_msg=name)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("dtype", FLOATS, ids=IDS)
def test_the_jax_emitter_agrees(dtype):
    x, y, z = _inputs(dtype, np.random.default_rng(2))
    got = extras(jnp.asarray(x), jnp.asarray(y), jnp.asarray(z))
    want = extras(x, y, z)
    for name in want:
        g = np.asarray(got[name])
        assert g.dtype == dtype, name
        np.testing.assert_allclose(g, want[name], rtol=4 * np.finfo(dtype).eps, atol=0, equal_nan=True, err_msg=name)


def test_a_random_sweep_of_copysign_and_spacing_against_numpy():
    rng = np.random.default_rng(3)
    for dtype in FLOATS:
        bits = rng.integers(0, 2**31, 2000).astype(np.uint32)
        x = (bits.view(np.float32) if dtype == np.float32 else rng.normal(size=2000) * 10.0 ** rng.integers(-300, 300, 2000))
        x = x[np.isfinite(x)].astype(dtype)
        y = -x[::-1]
        got = extras(x, y, x)
        np.testing.assert_array_equal(got["copysign"], np.copysign(x, y))
        np.testing.assert_array_equal(got["spacing"], np.spacing(x))


# ---------------------------------------------------------------------------------------------
# derivatives

@hawk.kernel
def smooth(x: Scalar, y: Scalar, z: Scalar):
    return hm.fma(x, y, z) + hm.copysign(x, y) * 1.5 + hm.remainder(x, hm.abs(y) + 0.5) * 0.25 + hm.fdim(x, y) * 2.0 + hm.rint(x)


def _jax_smooth(x, y, z):
    return x * y + z + jnp.copysign(x, y) * 1.5 + jnp.remainder(x, jnp.abs(y) + 0.5) * 0.25 + jnp.maximum(x - y, 0.0) * 2.0 + jnp.rint(x)


def test_derivatives_match_jax():
    rng = np.random.default_rng(4)
    x, y, z = rng.uniform(-5, 5, 64), rng.uniform(-3, 3, 64), rng.uniform(-3, 3, 64)
    x[:4], y[:4] = [0.0, -0.0, 1.0, -2.0], [1.0, -1.0, -0.0, 0.5]       # abs'(0) = 1 as JAX; copysign of -0.0
    g = hdiff.vjp(smooth)(x, y, z, cotangent=np.ones_like(x))
    want = jax.vmap(jax.grad(_jax_smooth, argnums=(0, 1, 2)))(x, y, z)
    for name, w in zip("xyz", want):
        np.testing.assert_allclose(g[name], np.asarray(w), rtol=1e-13, atol=1e-13, err_msg=name)
    _, (t,) = hdiff.jvp(smooth)(x, y, z, tangents={"x": np.ones_like(x), "y": np.zeros_like(x), "z": np.zeros_like(x)})
    np.testing.assert_allclose(t, np.asarray(want[0]), rtol=1e-13, atol=1e-13)


def test_fdim_and_fma_derivatives_against_finite_differences():
    rng = np.random.default_rng(5)
    x, y, z = rng.uniform(-2, 2, 32), rng.uniform(-2, 2, 32), rng.uniform(-2, 2, 32)

    @hawk.kernel
    def f(x: Scalar, y: Scalar, z: Scalar):
        return hm.fdim(x, y) * hm.fma(x, z, y)

    g = hdiff.vjp(f)(x, y, z, cotangent=np.ones_like(x))
    h = 1e-6
    for name, i in zip("xyz", range(3)):
        args = [x, y, z]
        up = [a + h if j == i else a for j, a in enumerate(args)]
        dn = [a - h if j == i else a for j, a in enumerate(args)]
        fd = (f(*up) - f(*dn)) / (2 * h)
        np.testing.assert_allclose(g[name], fd, rtol=1e-6, atol=1e-7, err_msg=name)


# ---------------------------------------------------------------------------------------------
# argmax / argmin

@hawk.kernel
def args_of(v: Vector[5]):
    return hm.argmax(v), hm.argmin(v)


@pytest.mark.parametrize("dtype", FLOATS, ids=IDS)
def test_argmax_argmin_match_numpy_with_ties_and_nan(dtype):
    rng = np.random.default_rng(6)
    v = rng.integers(-3, 3, (5, 300)).astype(dtype)              # many ties: the first one wins
    v[rng.random((5, 300)) < 0.08] = np.nan                          # NaN counts as the extreme, first NaN wins
    v[:, 0] = [np.inf, 1.0, np.inf, -np.inf, 0.0]
    i, j = args_of(v)
    assert i.dtype == np.int32 and j.dtype == np.int32
    np.testing.assert_array_equal(i, np.argmax(v, axis=0))
    np.testing.assert_array_equal(j, np.argmin(v, axis=0))
    ji, jj = args_of(jnp.asarray(v))
    np.testing.assert_array_equal(np.asarray(ji), i)
    np.testing.assert_array_equal(np.asarray(jj), j)


def test_argmax_has_no_derivative_and_refuses_a_scalar():
    @hawk.kernel
    def pick(v: Vector[3]):
        return hm.float64(hm.argmax(v)) * v[0]

    v = np.array([[1.0, 3.0], [2.0, 1.0], [0.0, 2.0]])
    g = hdiff.vjp(pick)(v, cotangent=np.ones(2))["v"]
    np.testing.assert_array_equal(g, [[1.0, 0.0], [0.0, 0.0], [0.0, 0.0]])

    @hawk.kernel
    def bad(x: Scalar):
        return hm.argmax(x)

    with pytest.raises(TypeError, match=r"bad.*hm\.argmax\(x\).*takes a Vector"):
        bad(np.zeros(3))
