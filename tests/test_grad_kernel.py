"""Kernel-level derivatives: hawk_fx.diff.vjp and hawk_fx.diff.jvp against two independent oracles.

  * central finite differences of the kernel itself (its plain forward, run in float64), and
  * jax: jax.vjp / jax.jvp of the same one-sample function written with jax.numpy (float64).

Every differentiable hawk_fx.math primitive is checked in float64 (tight) and float32 (loose),
on inputs inside its domain and away from its kinks; cotangents and tangents are random, so a
rule that is off by a factor or a sign fails.
"""
from __future__ import annotations

import functools
import math
import zlib

import numpy as np
import pytest

import hawk_fx as hawk
import hawk_fx.diff as hd
import hawk_fx.math as hm
from hawk_fx import Matrix, Mutable, Param, Scalar, UInt32, Vector

jax = pytest.importorskip("jax")
jax.config.update("jax_enable_x64", True)
jnp = jax.numpy
jsp = pytest.importorskip("jax.scipy.special")

N = 16
FLOATS = [np.float64, np.float32]
# (vs jax, vs finite differences): float64 is exact up to rounding; float32 runs the kernel in float32
TOL = {np.float64: (1e-12, 1e-6), np.float32: (2e-5, 2e-4)}


def _rng(seed=0):
    return np.random.default_rng(seed)


def _close(got, want, rtol, what):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, f"{what}: shape {got.shape}, expected {want.shape}"
    scale = max(1.0, float(np.max(np.abs(want)))) if want.size else 1.0
    err = float(np.max(np.abs(got - want))) if want.size else 0.0
    assert err <= rtol * scale, f"{what}: max error {err:.3g} (scale {scale:.3g}, rtol {rtol:g})\n{got}\n{want}"


def _fd_vjp(fwd, args, ct, wrt, h=1e-6, separable=True):
    """Central differences of sum(ct * fwd(*args)) in each argument named by index in wrt (float64).

    separable: samples do not interact (no sample reduction), so one component is perturbed in all
    samples at once and each sample's own change is read off; otherwise one cell at a time."""
    args = [np.array(a, np.float64) if isinstance(a, np.ndarray) else a for a in args]
    ct = [np.asarray(c, np.float64) for c in ct]

    def per_sample(outs):
        tot = 0.0
        for c, o in zip(ct, _leaves(outs)):
            prod = c * np.asarray(o, np.float64)
            tot = tot + (prod.reshape(-1, prod.shape[-1]).sum(axis=0) if separable else np.sum(prod))
        return tot

    out = {}
    for i in wrt:
        g = np.zeros_like(args[i])
        sample = separable and args[i].shape[-1] != 1
        cells = np.ndindex(args[i].shape[:-1]) if sample else np.ndindex(args[i].shape)
        for idx in cells:
            at = idx + (slice(None),) if sample else idx
            plus = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
            minus = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
            plus[i][at] += h
            minus[i][at] -= h
            d = (per_sample(fwd(*plus)) - per_sample(fwd(*minus))) / (2 * h)
            g[at] = d if sample else np.sum(d)
        out[i] = g
    return out


_ORACLES: dict = {}


def _jax_vjp_jvp(f, primals, ct, tangents=None, key=None):
    """jax.vjp (and jax.jvp) of f at primals, jitted (op-by-op dispatch is much slower).

    Test inputs are float32-representable in both dtypes, so the float64 oracle of a float32 case
    is the float64 case's: with a key, it is computed once."""
    if key is not None:
        if key not in _ORACLES:
            _ORACLES[key] = _jax_vjp_jvp(f, primals, ct, tangents)
        return _ORACLES[key]
    def both(primals, ct, tangents):
        out, pull = jax.vjp(f, *primals)
        res = (out, pull(ct))
        if tangents is not None:
            res += (jax.jvp(f, tuple(primals), tuple(tangents))[1],)
        return res
    return jax.jit(both)(tuple(primals), ct, None if tangents is None else tuple(tangents))


def _leaves(x):
    if isinstance(x, (tuple, list)):
        return [leaf for item in x for leaf in _leaves(item)]
    return [x]


def _per_sample(f, in_axes):
    """jax: a one-sample function mapped over the trailing sample axis (None: a one-cell value)."""
    return jax.vmap(f, in_axes=in_axes, out_axes=-1)


# ---------------------------------------------------------------------------------------------
# unary primitives

# name -> (hawk function, jax function, low, high): inputs uniform on [low, high]
UNARY = {
    "sin": (hm.sin, jnp.sin, -3, 3), "cos": (hm.cos, jnp.cos, -3, 3), "tan": (hm.tan, jnp.tan, -1.3, 1.3),
    "exp": (hm.exp, jnp.exp, -3, 3), "exp2": (hm.exp2, jnp.exp2, -3, 3), "expm1": (hm.expm1, jnp.expm1, -1, 1),
    "log": (hm.log, jnp.log, 0.1, 5), "log2": (hm.log2, jnp.log2, 0.1, 5), "log10": (hm.log10, jnp.log10, 0.1, 5),
    "log1p": (hm.log1p, jnp.log1p, -0.8, 5), "sqrt": (hm.sqrt, jnp.sqrt, 0.1, 5),
    "rsqrt": (hm.rsqrt, lambda x: 1.0 / jnp.sqrt(x), 0.1, 5), "cbrt": (hm.cbrt, jnp.cbrt, 0.2, 5),
    "sinh": (hm.sinh, jnp.sinh, -3, 3), "cosh": (hm.cosh, jnp.cosh, -3, 3), "tanh": (hm.tanh, jnp.tanh, -2, 2),
    "asin": (hm.asin, jnp.arcsin, -0.9, 0.9), "acos": (hm.acos, jnp.arccos, -0.9, 0.9),
    "atan": (hm.atan, jnp.arctan, -4, 4), "asinh": (hm.asinh, jnp.arcsinh, -4, 4),
    "acosh": (hm.acosh, jnp.arccosh, 1.1, 5), "atanh": (hm.atanh, jnp.arctanh, -0.9, 0.9),
    "erf": (hm.erf, jsp.erf, -2, 2), "erfc": (hm.erfc, jsp.erfc, -2, 2),
    "abs": (hm.abs, jnp.abs, 0.1, 3), "negative": (hm.negative, jnp.negative, -3, 3),
}
NEG_CBRT = ("cbrt_negative", (hm.cbrt, jnp.cbrt, -5, -0.2))
NEG_ABS = ("abs_negative", (hm.abs, jnp.abs, -3, -0.1))


def _unary_kernel(op):
    @hawk.kernel
    def k(x: Scalar) -> Scalar:
        return op(x)
    return k


_UNARY_KERNELS = {}


def _cached(cache, name, make, op):
    """One kernel per case, shared by its float32 and float64 runs."""
    if name not in cache:
        cache[name] = make(op)
    return cache[name]


def _unary_case(name):
    if name == NEG_CBRT[0]:
        return NEG_CBRT[1]
    if name == NEG_ABS[0]:
        return NEG_ABS[1]
    return UNARY[name]


UNARY_NAMES = list(UNARY) + [NEG_CBRT[0], NEG_ABS[0]]


def _f32able(a):
    """float64 values that float32 holds exactly: both dtypes run on the same inputs and share an oracle."""
    return np.asarray(a, np.float64).astype(np.float32).astype(np.float64)


def _unary_inputs(name):
    _, _, lo, hi = _unary_case(name)
    rng = _rng(zlib.crc32(name.encode()))
    return _f32able(rng.uniform(lo, hi, N)), _f32able(rng.normal(size=N)), _f32able(rng.normal(size=N))


@functools.lru_cache(maxsize=None)
def _unary_oracles():
    """jax: value, vjp and jvp of every unary case, in one jitted call (one compile, not one per case)."""
    def all_cases(inputs):
        out = {}
        for name, (x, ct, t) in inputs.items():
            jop = _unary_case(name)[1]
            y, pull = jax.vjp(jop, x)
            out[name] = (y, pull(ct)[0], jax.jvp(jop, (x,), (t,))[1])
        return out
    res = jax.jit(all_cases)({name: _unary_inputs(name) for name in UNARY_NAMES})
    return {k: tuple(np.asarray(a) for a in v) for k, v in res.items()}


@pytest.mark.parametrize("dtype", FLOATS, ids=["f64", "f32"])
@pytest.mark.parametrize("name", UNARY_NAMES)
def test_unary_vjp_and_jvp(name, dtype):
    op = _unary_case(name)[0]
    k = _cached(_UNARY_KERNELS, name, _unary_kernel, op)
    x64, ct64, t64 = _unary_inputs(name)
    x, ct, t = (a.astype(dtype) for a in (x64, ct64, t64))
    tol_jax, tol_fd = TOL[dtype]
    y, jg, jt = _unary_oracles()[name]

    g = hd.vjp(k, "x")(x, cotangent=ct)["x"]
    assert g.dtype == dtype and g.shape == (N,)
    _close(g, jg, tol_jax, f"{name} vjp vs jax")
    fd = _fd_vjp(k, [x64], [ct64], [0])[0]
    _close(g, fd, tol_fd, f"{name} vjp vs finite differences")

    (out,), (tan,) = hd.jvp(k, "x")(x, tangents={"x": t})
    assert tan.dtype == dtype and tan.shape == (N,)
    _close(out, y, tol_jax, f"{name} jvp primal")
    _close(tan, jt, tol_jax, f"{name} jvp vs jax")


def test_unary_chain_of_primitives():
    """A composition: the chain rule across several rules, vs jax and finite differences."""
    @hawk.kernel
    def k(x: Scalar) -> Scalar:
        return hm.exp(hm.sin(x) * hm.sqrt(x)) / (1.0 + hm.log1p(x * x)) - hm.tanh(x) ** 3

    def jf(x):
        return jnp.exp(jnp.sin(x) * jnp.sqrt(x)) / (1.0 + jnp.log1p(x * x)) - jnp.tanh(x) ** 3

    rng = _rng(1)
    x = rng.uniform(0.2, 3.0, N)
    ct = rng.normal(size=N)
    g = hd.vjp(k, "x")(x, cotangent=ct)["x"]
    _, (jg,), jt = _jax_vjp_jvp(jf, [x], ct, [ct])
    _close(g, jg, 1e-12, "chain vjp vs jax")
    _close(g, _fd_vjp(k, [x], [ct], [0])[0], 1e-6, "chain vjp vs fd")
    (_,), (tan,) = hd.jvp(k, "x")(x, tangents={"x": ct})
    _close(tan, jt, 1e-12, "chain jvp vs jax")


# ---------------------------------------------------------------------------------------------
# binary primitives and operators

def _fmod_inputs(rng, dtype):
    a = rng.uniform(1.1, 4.9, N)
    b = rng.uniform(0.6, 0.9, N)
    q = a / b
    ok = np.abs(q - np.round(q)) > 0.1            # away from the jumps of trunc(a/b)
    a = np.where(ok, a, a + 0.3 * b)
    return a.astype(np.float32).astype(dtype), b.astype(np.float32).astype(dtype)


def _minmax_inputs(rng, dtype):
    a = rng.uniform(-2, 2, N)
    b = a + rng.choice([-1.0, 1.0], N) * rng.uniform(0.1, 1.0, N)    # never tied
    return a.astype(np.float32).astype(dtype), b.astype(np.float32).astype(dtype)


def _uniform(alo, ahi, blo, bhi):
    def make(rng, dtype):
        return rng.uniform(alo, ahi, N).astype(np.float32).astype(dtype), rng.uniform(blo, bhi, N).astype(np.float32).astype(dtype)
    return make


# name -> (hawk function, jax function, input maker)
BINARY = {
    "add": (lambda a, b: a + b, lambda a, b: a + b, _uniform(-3, 3, -3, 3)),
    "sub": (lambda a, b: a - b, lambda a, b: a - b, _uniform(-3, 3, -3, 3)),
    "mul": (lambda a, b: a * b, lambda a, b: a * b, _uniform(-3, 3, -3, 3)),
    "div": (lambda a, b: a / b, lambda a, b: a / b, _uniform(-3, 3, 0.5, 3)),
    "mod": (lambda a, b: a % b, lambda a, b: a % b, _fmod_inputs),
    "pow": (hm.pow, jnp.power, _uniform(0.3, 2.5, -2, 2.5)),
    "pow_operator": (lambda a, b: a ** b, lambda a, b: a ** b, _uniform(0.3, 2.5, -2, 2.5)),
    "atan2": (hm.atan2, jnp.arctan2, _uniform(0.3, 3, -3, 3)),
    "hypot": (hm.hypot, jnp.hypot, _uniform(-3, 3, 0.3, 3)),
    "fmod": (hm.fmod, jnp.fmod, _fmod_inputs),
    "minimum": (hm.minimum, jnp.minimum, _minmax_inputs),
    "maximum": (hm.maximum, jnp.maximum, _minmax_inputs),
    "where": (lambda a, b: hm.where(a > 0.0, a * b, a - b * b),
              lambda a, b: jnp.where(a > 0.0, a * b, a - b * b), _minmax_inputs),
    "clip": (lambda a, b: hm.clip(a, -1.0, 1.0) * b, lambda a, b: jnp.clip(a, -1.0, 1.0) * b, None),
}


def _clip_inputs(rng, dtype):
    a = rng.uniform(-2, 2, N)
    a = np.where(np.abs(np.abs(a) - 1.0) < 0.1, a * 0.5, a)      # away from the clip limits
    return a.astype(np.float32).astype(dtype), rng.uniform(-2, 2, N).astype(np.float32).astype(dtype)


BINARY["clip"] = BINARY["clip"][:2] + (_clip_inputs,)


def _binary_kernel(op):
    @hawk.kernel
    def k(a: Scalar, b: Scalar) -> Scalar:
        return op(a, b)
    return k


_BINARY_KERNELS = {}


def _binary_inputs(name):
    rng = _rng(zlib.crc32(name.encode()))
    a, b = BINARY[name][2](rng, np.float64)
    return tuple(_f32able(v) for v in (a, b, rng.normal(size=N), rng.normal(size=N), rng.normal(size=N)))


@functools.lru_cache(maxsize=None)
def _binary_oracles():
    def all_cases(inputs):
        out = {}
        for name, (a, b, ct, ta, tb) in inputs.items():
            jop = BINARY[name][1]
            y, pull = jax.vjp(jop, a, b)
            out[name] = (y,) + tuple(pull(ct)) + (jax.jvp(jop, (a, b), (ta, tb))[1],)
        return out
    res = jax.jit(all_cases)({name: _binary_inputs(name) for name in BINARY})
    return {k: tuple(np.asarray(a) for a in v) for k, v in res.items()}


@pytest.mark.parametrize("dtype", FLOATS, ids=["f64", "f32"])
@pytest.mark.parametrize("name", list(BINARY))
def test_binary_vjp_and_jvp(name, dtype):
    op = BINARY[name][0]
    k = _cached(_BINARY_KERNELS, name, _binary_kernel, op)
    a64, b64, ct64, ta64, tb64 = _binary_inputs(name)
    a, b, ct, ta, tb = (v.astype(dtype) for v in (a64, b64, ct64, ta64, tb64))
    tol_jax, tol_fd = TOL[dtype]
    _, ja, jb, jt = _binary_oracles()[name]

    g = hd.vjp(k)(a, b, cotangent=ct)
    assert set(g) == {"a", "b"} and g["a"].dtype == dtype and g["b"].dtype == dtype
    _close(g["a"], ja, tol_jax, f"{name} d/da vs jax")
    _close(g["b"], jb, tol_jax, f"{name} d/db vs jax")
    fd = _fd_vjp(k, [a64, b64], [ct64], [0, 1])
    _close(g["a"], fd[0], tol_fd, f"{name} d/da vs fd")
    _close(g["b"], fd[1], tol_fd, f"{name} d/db vs fd")

    (_,), (tan,) = hd.jvp(k)(a, b, tangents={"a": ta, "b": tb})
    _close(tan, jt, tol_jax, f"{name} jvp vs jax")
    (_,), (tan_a,) = hd.jvp(k, wrt="a")(a, b, tangents={"a": ta, "b": tb})     # b's tangent is not asked for
    (_,), (tan_b,) = hd.jvp(k, wrt="b")(a, b, tangents={"b": tb})
    _close(tan_a + tan_b, jt, tol_jax, f"{name} jvp in a, plus jvp in b")


def test_vjp_wrt_selects_arguments():
    k = _cached(_BINARY_KERNELS, "mul", _binary_kernel, BINARY["mul"][0])
    a, b = np.arange(1.0, 5.0), np.arange(5.0, 9.0)
    g = hd.vjp(k, "b")(a, b, cotangent=np.ones(4))
    assert list(g) == ["b"]
    np.testing.assert_array_equal(g["b"], a)
    with pytest.raises(KeyError, match="'c' is not a parameter"):
        hd.vjp(k, "c")


@pytest.mark.parametrize("dtype", FLOATS, ids=["f64", "f32"])
def test_literal_operands_and_python_number_params(dtype):
    """Constants on either side of an operator: pow(x, 2.5), pow(2, x), 3 / x, x - 1."""
    @hawk.kernel
    def k(x: Scalar, c: Param) -> Scalar:
        return hm.pow(x, 2.5) + hm.pow(2.0, x) + 3.0 / x - (x - 1.0) * c

    def jf(x, c):
        return jnp.power(x, 2.5) + jnp.power(2.0, x) + 3.0 / x - (x - 1.0) * c

    rng = _rng(3)
    x = rng.uniform(0.5, 2.0, N).astype(np.float32).astype(dtype)
    ct = rng.normal(size=N).astype(np.float32).astype(dtype)
    tol_jax, _ = TOL[dtype]
    g = hd.vjp(k)(x, 0.5, cotangent=ct)
    _, (want,) = _jax_vjp_jvp(lambda u: jf(u, 0.5), [x.astype(np.float64)], ct.astype(np.float64), key="literals")
    _close(g["x"], want, tol_jax, "literals vjp")
    # a Python float is differentiated as JAX's grad differentiates one: d/dc = -sum(ct * (x - 1))
    assert np.shape(g["c"]) == ()
    np.testing.assert_allclose(g["c"], -np.sum(ct.astype(np.float64) * (x.astype(np.float64) - 1.0)),
                               rtol=tol_jax * 10, atol=tol_jax * N)


# ---------------------------------------------------------------------------------------------
# casts

@pytest.mark.parametrize("dtype", FLOATS, ids=["f64", "f32"])
def test_integer_casts_have_zero_gradient(dtype):
    @hawk.kernel
    def k(x: Scalar) -> Scalar:
        return hm.float64(hm.int32(x * 10.0)) + hm.float64(hm.uint32(x * 3.0)) * 0.5

    x = np.linspace(0.13, 0.87, N).astype(np.float32).astype(dtype)
    g = hd.vjp(k, "x")(x, cotangent=np.ones(N))["x"]
    assert g.dtype == dtype
    np.testing.assert_array_equal(g, np.zeros(N))
    (_,), (t,) = hd.jvp(k, "x")(x, tangents={"x": np.ones(N, dtype)})
    np.testing.assert_array_equal(t, np.zeros(N))


def test_comparisons_and_sign_like_ops_pass_no_gradient():
    @hawk.kernel
    def k(x: Scalar) -> Scalar:
        return hm.floor(x) + hm.ceil(x) + hm.round(x) + hm.trunc(x) + hm.sign(x) + hm.float64(x > 0.5) * 2.0

    x = np.linspace(0.13, 2.87, N)
    g = hd.vjp(k, "x")(x, cotangent=np.ones(N))["x"]
    np.testing.assert_array_equal(g, np.zeros(N))


def test_float_casts_pass_the_gradient_and_keep_the_input_dtype():
    @hawk.kernel
    def down(x: Scalar) -> Scalar:           # float64 -> float32 -> float64
        return hm.float64(hm.float32(x) * 3.0) * x

    @hawk.kernel
    def up(x: Scalar) -> Scalar:             # float32 -> float64 -> float32
        return hm.float32(hm.float64(x) * hm.float64(x))

    x = np.linspace(0.5, 1.5, N)
    g = hd.vjp(down, "x")(x, cotangent=np.ones(N))["x"]
    assert g.dtype == np.float64
    _close(g, 6.0 * x, 1e-6, "float32 round trip")           # the float32 cast rounds the value, not the rule
    x32 = x.astype(np.float32)
    g = hd.vjp(up, "x")(x32, cotangent=np.ones(N, np.float32))["x"]
    assert g.dtype == np.float32
    _close(g, 2.0 * x, 1e-6, "float64 round trip")


# ---------------------------------------------------------------------------------------------
# sample reductions

@pytest.mark.parametrize("dtype", FLOATS, ids=["f64", "f32"])
def test_sample_reductions(dtype):
    @hawk.kernel
    def k(x: Scalar):
        return hawk.sum(x * x), hawk.mean(hm.sin(x)), hawk.max(x * 2.0), hawk.min(hm.exp(x))

    def jf(x):
        return (jnp.sum(x * x)[None], jnp.mean(jnp.sin(x))[None], jnp.max(x * 2.0)[None], jnp.min(jnp.exp(x))[None])

    rng = _rng(5)
    x = rng.permutation(np.linspace(-1.0, 1.0, N)).astype(np.float32).astype(dtype)     # distinct: one argmax, one argmin
    cts = tuple(rng.normal(size=1).astype(np.float32).astype(dtype) for _ in range(4))
    tol_jax, tol_fd = TOL[dtype]
    g = hd.vjp(k, "x")(x, cotangent=cts)["x"]
    x64 = x.astype(np.float64)
    t = rng.normal(size=N).astype(np.float32).astype(dtype)
    c64 = tuple(c.astype(np.float64) for c in cts)
    _, (want,), jt = _jax_vjp_jvp(jf, [x64], c64, [t.astype(np.float64)], key="reductions")
    _close(g, want, tol_jax, "reductions vjp vs jax")
    _close(g, _fd_vjp(k, [x64], list(c64), [0], separable=False)[0], tol_fd, "reductions vjp vs fd")
    assert g[np.argmax(x)] != 0 and g[np.argmin(x)] != 0

    outs, tans = hd.jvp(k, "x")(x, tangents={"x": t})
    assert [o.shape for o in tans] == [(1,)] * 4
    for j, (a, b) in enumerate(zip(tans, jt)):
        _close(a, b, tol_jax, f"reduction {j} jvp")


def test_reduction_mixed_into_per_sample_values():
    """A per-sample output that depends on every sample through mean and sum (centring, normalising)."""
    @hawk.kernel
    def k(x: Scalar, w: Scalar) -> Scalar:
        c = x - hawk.mean(x)
        return w * c * c / hawk.sum(x * x)

    def jf(x, w):
        c = x - jnp.mean(x)
        return w * c * c / jnp.sum(x * x)

    rng = _rng(6)
    x, w, ct = rng.normal(size=N), rng.normal(size=N), rng.normal(size=N)
    g = hd.vjp(k)(x, w, cotangent=ct)
    _, (jx, jw), jt = _jax_vjp_jvp(jf, [x, w], ct, [ct, w])
    _close(g["x"], jx, 1e-12, "centred d/dx")
    _close(g["w"], jw, 1e-12, "centred d/dw")
    fd = _fd_vjp(k, [x, w], [ct], [0, 1], separable=False)
    _close(g["x"], fd[0], 1e-6, "centred d/dx fd")
    _close(g["w"], fd[1], 1e-6, "centred d/dw fd")
    (_,), (t,) = hd.jvp(k)(x, w, tangents={"x": ct, "w": w})
    _close(t, jt, 1e-12, "centred jvp")


def test_max_with_ties_splits_the_gradient():
    @hawk.kernel
    def k(x: Scalar):
        return hawk.max(x)

    x = np.array([1.0, 3.0, 2.0, 3.0])
    g = hd.vjp(k, "x")(x, cotangent=np.array([2.0]))["x"]
    np.testing.assert_array_equal(g, [0.0, 1.0, 0.0, 1.0])


# ---------------------------------------------------------------------------------------------
# Params: a one-cell array gets the sum over samples

@pytest.mark.parametrize("dtype", FLOATS, ids=["f64", "f32"])
def test_param_gradient_is_the_sum_over_samples(dtype):
    @hawk.kernel
    def k(x: Scalar, a: Param, b: Param) -> Scalar:
        return a * hm.sin(x) + b * b * x

    rng = _rng(7)
    x = rng.uniform(-2, 2, N).astype(np.float32).astype(dtype)
    a, b = np.array([1.5], dtype), np.array([-0.7], dtype)
    ct = rng.normal(size=N).astype(np.float32).astype(dtype)
    tol_jax, tol_fd = TOL[dtype]
    g = hd.vjp(k)(x, a, b, cotangent=ct)
    assert g["a"].shape == (1,) and g["b"].shape == (1,) and g["a"].dtype == dtype
    x64, ct64 = x.astype(np.float64), ct.astype(np.float64)
    jf = _per_sample(lambda x, a, b: a[0] * jnp.sin(x) + b[0] * b[0] * x, (0, None, None))
    _, (jx, ja, jb) = _jax_vjp_jvp(jf, [x64, a.astype(np.float64), b.astype(np.float64)], ct64, key="param")
    _close(g["x"], jx, tol_jax, "x")
    _close(g["a"], ja, tol_jax, "Param a")
    _close(g["b"], jb, tol_jax, "Param b")
    _close(g["a"], [np.sum(ct64 * np.sin(x64))], tol_jax, "Param a = sum over samples")
    fd = _fd_vjp(k, [x64, a.astype(np.float64), b.astype(np.float64)], [ct64], [1, 2])
    _close(g["a"], fd[1], tol_fd, "Param a fd")
    _close(g["b"], fd[2], tol_fd, "Param b fd")

    (_,), (t,) = hd.jvp(k, wrt=("a", "b"))(x, a, b, tangents={"a": np.array([1.0], dtype), "b": np.array([2.0], dtype)})
    _close(t, np.sin(x64) + 2 * 2 * b[0] * x64, tol_jax, "Param jvp")


def test_one_cell_scalar_broadcast_gets_the_sum():
    """A Scalar argument given as a one-cell array is one value for all samples: its gradient sums."""
    k = _cached(_BINARY_KERNELS, "mul", _binary_kernel, BINARY["mul"][0])
    a, b = np.arange(1.0, 6.0), np.array([3.0])
    ct = np.array([1.0, -1.0, 2.0, 0.5, 1.0])
    g = hd.vjp(k)(a, b, cotangent=ct)
    np.testing.assert_allclose(g["a"], 3.0 * ct)
    np.testing.assert_allclose(g["b"], [np.sum(a * ct)])


# ---------------------------------------------------------------------------------------------
# Vector and Matrix kernels

@hawk.kernel
def vec_ops(a: Vector[3], b: Vector[3], s: Scalar):
    c = hm.cross(a, b)
    return hm.dot(c, b + a * s) + hm.norm(a) * s, c * s, hm.vec(a[0] * b[1], hm.norm(b), s * s)


def _jvec_ops(a, b, s):
    c = jnp.cross(a, b)
    return (jnp.dot(c, b + a * s) + jnp.linalg.norm(a) * s, c * s,
            jnp.stack([a[0] * b[1], jnp.linalg.norm(b), s * s]))


@hawk.kernel
def mat_ops(m: Matrix[3, 3], p: Matrix[3, 2], v: Vector[3]):
    mv = hm.matmul(m, v)
    mp = hm.matmul(m, p)
    vm = hm.matmul(v, p)
    o = hm.outer(v, mv)
    return (hm.trace(m @ m) + hm.dot(v, mv), mp * hm.trace(o), vm, hm.transpose(o) - o * 0.5,
            hm.einsum("ij,jk,k->i", m, p, vm), hm.einsum("ii->", o) * hm.einsum("ij->", p))


def _jmat_ops(m, p, v):
    mv, mp, vm = m @ v, m @ p, v @ p
    o = jnp.outer(v, mv)
    return (jnp.trace(m @ m) + v @ mv, mp * jnp.trace(o), vm, o.T - o * 0.5,
            jnp.einsum("ij,jk,k->i", m, p, vm), jnp.trace(o) * jnp.sum(p))


@pytest.mark.parametrize("dtype", FLOATS, ids=["f64", "f32"])
def test_vector_kernel_vjp_jvp(dtype):
    rng = _rng(8)
    a, b = rng.normal(size=(3, N)).astype(np.float32).astype(dtype), rng.normal(size=(3, N)).astype(np.float32).astype(dtype)
    s = rng.normal(size=N).astype(np.float32).astype(dtype)
    cts = (rng.normal(size=N).astype(np.float32).astype(dtype), rng.normal(size=(3, N)).astype(np.float32).astype(dtype),
           rng.normal(size=(3, N)).astype(np.float32).astype(dtype))
    tol_jax, tol_fd = TOL[dtype]
    g = hd.vjp(vec_ops)(a, b, s, cotangent=cts)
    assert g["a"].shape == (3, N) and g["a"].dtype == dtype
    f64 = [x.astype(np.float64) for x in (a, b, s)]
    c64 = tuple(c.astype(np.float64) for c in cts)
    tans = [rng.normal(size=x.shape).astype(np.float32).astype(dtype) for x in (a, b, s)]
    jf = _per_sample(_jvec_ops, (-1, -1, -1))
    _, want, jt = _jax_vjp_jvp(jf, f64, c64, [t.astype(np.float64) for t in tans], key="vector")
    for name, w in zip("abs", want):
        _close(g[name], w, tol_jax, f"vector d/d{name} vs jax")
    fd = _fd_vjp(vec_ops, f64, list(c64), [0, 1, 2])
    for i, name in enumerate("abs"):
        _close(g[name], fd[i], tol_fd, f"vector d/d{name} vs fd")

    outs, tout = hd.jvp(vec_ops)(a, b, s, tangents=dict(zip("abs", tans)))
    for j, (x, y) in enumerate(zip(tout, jt)):
        _close(x, y, tol_jax, f"vector jvp output {j}")


@pytest.mark.parametrize("dtype", FLOATS, ids=["f64", "f32"])
def test_matrix_kernel_vjp_jvp(dtype):
    rng = _rng(9)
    m = rng.normal(size=(3, 3, N)).astype(np.float32).astype(dtype)
    p = rng.normal(size=(3, 2, N)).astype(np.float32).astype(dtype)
    v = rng.normal(size=(3, N)).astype(np.float32).astype(dtype)
    outs = mat_ops(m, p, v)
    cts = tuple(rng.normal(size=o.shape).astype(np.float32).astype(dtype) for o in outs)
    tol_jax, tol_fd = TOL[dtype]
    g = hd.vjp(mat_ops)(m, p, v, cotangent=cts)
    f64 = [x.astype(np.float64) for x in (m, p, v)]
    c64 = tuple(c.astype(np.float64) for c in cts)
    tans = [rng.normal(size=x.shape).astype(np.float32).astype(dtype) for x in (m, p, v)]
    jf = _per_sample(_jmat_ops, (-1, -1, -1))
    _, want, jt = _jax_vjp_jvp(jf, f64, c64, [t.astype(np.float64) for t in tans], key="matrix")
    for name, w in zip(("m", "p", "v"), want):
        assert g[name].shape == w.shape and g[name].dtype == dtype
        _close(g[name], w, tol_jax * 10, f"matrix d/d{name} vs jax")
    fd = _fd_vjp(mat_ops, f64, list(c64), [0, 1, 2])
    for i, name in enumerate(("m", "p", "v")):
        _close(g[name], fd[i], tol_fd * 10, f"matrix d/d{name} vs fd")

    _, tout = hd.jvp(mat_ops)(m, p, v, tangents=dict(zip(("m", "p", "v"), tans)))
    for j, (x, y) in enumerate(zip(tout, jt)):
        _close(x, y, tol_jax * 10, f"matrix jvp output {j}")


@hawk.kernel
def einsum_forms(m: Matrix[3, 3], v: Vector[3], p: Matrix[3, 2]):
    return (hm.einsum("ii,i->i", m, v), hm.einsum("ij,ij->", m, m), hm.einsum("ij->j", p), v[-1] * v[0],
            hm.einsum("ii->i", m), hm.einsum("ij,k->ijk", p, v), hm.einsum("i,i,i->", v, v, v))


def _jeinsum_forms(m, v, p):
    return (jnp.einsum("ii,i->i", m, v), jnp.einsum("ij,ij->", m, m), jnp.einsum("ij->j", p), v[-1] * v[0],
            jnp.einsum("ii->i", m), jnp.einsum("ij,k->ijk", p, v), jnp.einsum("i,i,i->", v, v, v))


def test_einsum_diagonals_sums_outer_products_and_negative_indices():
    rng = _rng(11)
    m, v, p = rng.normal(size=(3, 3, N)), rng.normal(size=(3, N)), rng.normal(size=(3, 2, N))
    cts = tuple(rng.normal(size=o.shape) for o in einsum_forms(m, v, p))
    tans = [rng.normal(size=a.shape) for a in (m, v, p)]
    g = hd.vjp(einsum_forms)(m, v, p, cotangent=cts)
    _, want, jt = _jax_vjp_jvp(_per_sample(_jeinsum_forms, (-1, -1, -1)), [m, v, p], cts, tans)
    for name, w in zip("mvp", want):
        _close(g[name], w, 1e-12, f"einsum d/d{name}")
    _, tout = hd.jvp(einsum_forms)(m, v, p, tangents=dict(zip("mvp", tans)))
    for j, (a, b) in enumerate(zip(tout, jt)):
        _close(a, b, 1e-12, f"einsum jvp {j}")


def test_uniform_vector_param_gets_the_sum():
    """A Vector given as a one-cell (3, 1) array against per-sample Scalars: summed over samples."""
    @hawk.kernel
    def k(d: Vector[3], s: Scalar) -> Scalar:
        return hm.dot(d, hm.vec(s, s * s, 1.0))

    s = np.linspace(-1, 1, N)
    d = np.array([[0.5], [2.0], [-1.0]])
    ct = np.cos(s)
    g = hd.vjp(k)(d, s, cotangent=ct)
    assert g["d"].shape == (3, 1)
    # math.fsum: the sums are exact to an ulp (np.sum's pairwise cancellation gives 0.0 for the first)
    np.testing.assert_allclose(g["d"][:, 0], [math.fsum(ct * s), math.fsum(ct * s * s), math.fsum(ct)], rtol=1e-12)
    np.testing.assert_allclose(g["s"], ct * (0.5 + 4.0 * s), rtol=1e-12)


# ---------------------------------------------------------------------------------------------
# Mutable kernels: the cotangent is a dict {mutable name: cotangent of its final value}

def test_mutable_kernel_cotangent_dict():
    @hawk.kernel
    def k(x: Scalar, y: Mutable[Scalar], flag: Mutable[UInt32]):
        y = y * hm.sin(x) + x
        flag = hm.uint32(hawk.sum(x > 0.0))

    rng = _rng(10)
    x, y = rng.normal(size=N), rng.normal(size=N)
    ct = rng.normal(size=N)
    g = hd.vjp(k, ("x", "y"))(x, y, np.zeros(1, np.uint32), cotangent={"y": ct})
    np.testing.assert_allclose(g["x"], ct * (y * np.cos(x) + 1.0), rtol=1e-12)
    np.testing.assert_allclose(g["y"], ct * np.sin(x), rtol=1e-12)


def test_cotangent_tree_with_wrong_leaf_count_is_refused():
    k = _cached(_BINARY_KERNELS, "mul", _binary_kernel, BINARY["mul"][0])
    with pytest.raises(ValueError, match="output"):
        hd.vjp(k)(np.ones(4), np.ones(4), cotangent=(np.ones(4), np.ones(4)))


@hawk.kernel
def tree_out(a: Scalar, b: Scalar):
    return {"p": a * 2.0, "q": (b * 3.0, [a * b])}


def test_dict_cotangent_matches_by_key_not_by_order():
    """A dict cotangent built in another key order (as jax.tree_util and sorted dicts do) must reach
    the outputs of the same names; it used to be taken leaf by leaf in its own order."""
    a, b = np.array([1.0, 2.0, 3.0]), np.array([-1.0, 0.5, 2.0])
    cp, cq, cr = np.array([1.0, 1.0, 1.0]), np.array([10.0, 10.0, 10.0]), np.array([0.5, -0.5, 1.0])
    want = {"a": 2.0 * cp + b * cr, "b": 3.0 * cq + a * cr}
    for ct in ({"p": cp, "q": (cq, [cr])}, {"q": (cq, [cr]), "p": cp}):
        g = hd.vjp(tree_out)(a, b, cotangent=ct)
        np.testing.assert_allclose(g["a"], want["a"], rtol=1e-15)
        np.testing.assert_allclose(g["b"], want["b"], rtol=1e-15)


def test_cotangent_of_another_structure_is_refused():
    a = np.ones(3)
    for ct in ({"p": a, "q": (a, a)}, {"p": a, "r": (a, [a])}, ((a, a), a), [a, (a, [a])]):
        with pytest.raises(ValueError, match="returns"):
            hd.vjp(tree_out)(a, a, cotangent=ct)


def test_result_and_mutable_cotangents():
    """A kernel with a result and a Mutable: the returned tree's cotangent alone (the Mutable's final
    value unseeded), or every output flat (results, then Mutables)."""
    @hawk.kernel
    def k(x: Scalar, y: Mutable[Scalar]) -> Scalar:
        y = y * x
        return hm.sin(x)

    x, y = np.array([0.5, 1.0, 1.5]), np.array([2.0, -1.0, 0.5])
    cr, cy = np.array([1.0, 2.0, 3.0]), np.array([-1.0, 0.5, 0.25])
    g = hd.vjp(k)(x, y.copy(), cotangent=cr)
    np.testing.assert_allclose(g["x"], cr * np.cos(x), rtol=1e-15)
    np.testing.assert_array_equal(g["y"], np.zeros(3))
    g = hd.vjp(k)(x, y.copy(), cotangent=(cr, cy))
    np.testing.assert_allclose(g["x"], cr * np.cos(x) + cy * y, rtol=1e-15)
    np.testing.assert_allclose(g["y"], cy * x, rtol=1e-15)


# ---------------------------------------------------------------------------------------------
# what the backward reads, and what it hands back

def _spec(kernel, *args):
    values = kernel.bind_arguments(args, {})
    return kernel.specialize(kernel.layout_of(values)[0])


def test_the_backward_of_a_linear_body_reads_no_primal():
    """The vjp program keeps only what its outputs need: a linear body's reads none of its inputs
    (no replayed forward), a nonlinear one the inputs its partials use."""
    from hawk_fx.diff import kernel_vjp

    @hawk.kernel
    def lin(x: Scalar, y: Scalar, a: Param) -> Scalar:
        return 2.0 * x - y / 4.0 + a

    @hawk.kernel
    def nonlin(x: Scalar, y: Scalar) -> Scalar:
        return hm.sin(x) + 3.0 * y

    x = np.linspace(0.0, 1.0, 8)
    kv = kernel_vjp(_spec(lin, x, x, np.array([1.0])))
    assert kv.reads == [False, False, False]
    assert all(e.prim.name in ("mul", "div", "neg", "sample_sum", "convert") for e in kv.prog.eqns), kv.prog
    assert kernel_vjp(_spec(nonlin, x, x)).reads == [True, False]


def test_gradients_handed_back_are_fresh_arrays():
    """An identity-like backward (x + 1) passes the cotangent through; what the caller gets must
    still be its own array, not a view of the cotangent it passed."""
    @hawk.kernel
    def shift(x: Scalar) -> Scalar:
        return x + 1.0

    ct = np.array([1.0, 2.0, 3.0])
    g = hd.vjp(shift, "x")(np.zeros(3), cotangent=ct)["x"]
    np.testing.assert_array_equal(g, [1.0, 2.0, 3.0])
    assert not np.shares_memory(g, ct)
    ct[:] = 0.0
    np.testing.assert_array_equal(g, [1.0, 2.0, 3.0])
    g += 1.0                                   # writable
