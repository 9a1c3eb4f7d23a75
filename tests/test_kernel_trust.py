"""Kernels that do what they say: a reserved role refused, not
ignored; JAX's derivative conventions at special points; float32 kept with Python numbers;
sharded jax.Arrays with uncommitted cells; NumPy's operators on staged planes.

Oracles: jax.grad of the same math, plain NumPy, and NumPy's own dtype rules.
"""
from __future__ import annotations

import numpy as np
import pytest

import eagle_fx as eagle
import hawk_fx as hawk
import hawk_fx.diff as hd
import hawk_fx.math as hm
from hawk_fx import Mutable, Scalar, Terminated, UInt32, Vector

from conftest import line_of

# ---------------------------------------------------------------------------------------------
# Terminated runs (its behaviour is in tests/test_terminated.py): a kernel never ignores it silently


def test_terminated_is_not_ignored():
    @hawk.kernel
    def advance(x: Scalar,
                done: Terminated):
        return hm.where(done, x, x + 1.0)
    out = advance(np.array([1.0, 2.0, 3.0]), np.array([False, True, False]))
    np.testing.assert_array_equal(out, [2.0, 0.0, 4.0])      # a finished sample's result reads 0


def test_mutable_terminated_is_refused():
    with pytest.raises(TypeError, match=r"finish:2 .*'done' is Mutable\[Terminated\].*run-until-done"):
        @hawk.kernel
        def finish(x: Scalar, done: Mutable[Terminated]):
            done = x > 2.0


def test_the_way_today_freezes_finished_samples():
    """What the message tells users to write: a Mutable[UInt32] mark and hm.where, against a loop."""
    @hawk.kernel
    def step(x: Mutable[Scalar], done: Mutable[UInt32]):
        x = hm.where(done != 0, x, x + 0.75)
        done = hm.where(x > 2.0, 1, done)

    x0 = np.array([0.1, 1.0, 1.9, 2.5, -3.0])
    x, done = x0.copy(), np.zeros(x0.size, np.uint32)
    for _ in range(4):
        step(x, done)
    want = []
    for v in x0:
        marked = False
        for _ in range(4):
            v = v if marked else v + 0.75
            marked = marked or v > 2.0
        want.append(v)
    np.testing.assert_array_equal(x, want)
    np.testing.assert_array_equal(done, np.array(want) > 2.0)


# ---------------------------------------------------------------------------------------------
# derivatives at special points are JAX's; float32 stays float32 with Python numbers

def _jax():
    from hawk_fx.emit.jax import require_jax
    jax = require_jax("test")
    import jax.numpy as jnp
    import jax.scipy.special as jss
    return jax, jnp, jss


def _unary_pairs():
    jax, jnp, jss = _jax()
    return {"abs": jnp.abs, "sign": jnp.sign, "floor": jnp.floor, "ceil": jnp.ceil, "round": jnp.round,
            "trunc": jnp.trunc, "sqrt": jnp.sqrt, "rsqrt": jax.lax.rsqrt, "cbrt": jnp.cbrt, "exp": jnp.exp,
            "exp2": jnp.exp2, "expm1": jnp.expm1, "log": jnp.log, "log2": jnp.log2, "log10": jnp.log10,
            "log1p": jnp.log1p, "sin": jnp.sin, "cos": jnp.cos, "tan": jnp.tan, "asin": jnp.arcsin,
            "acos": jnp.arccos, "atan": jnp.arctan, "sinh": jnp.sinh, "cosh": jnp.cosh, "tanh": jnp.tanh,
            "asinh": jnp.arcsinh, "acosh": jnp.arccosh, "atanh": jnp.arctanh, "erf": jss.erf, "erfc": jss.erfc,
            "negative": jnp.negative, "sigmoid": jax.nn.sigmoid, "softplus": jax.nn.softplus,
            "log_sigmoid": jax.nn.log_sigmoid, "relu": jax.nn.relu, "stop_gradient": jax.lax.stop_gradient}


def _binary_pairs():
    jax, jnp, jss = _jax()
    return {"atan2": jnp.arctan2, "pow": jnp.power, "hypot": jnp.hypot, "fmod": jnp.fmod, "minimum": jnp.minimum,
            "maximum": jnp.maximum, "add": jnp.add, "subtract": jnp.subtract, "multiply": jnp.multiply,
            "divide": jnp.divide, "logaddexp": jnp.logaddexp, "xlogy": jss.xlogy, "xlog1py": jss.xlog1py}


# Where JAX's value is not the derivative, ours is, and the sweep skips the point:
#   hypot with an infinite leg: JAX masks its inf branch after computing inf * 0, so the finite
#     leg's derivative is NaN; it is a / hypot = 0.
#   logaddexp with an infinite argument: JAX replaces inf by 0 before exp(a - out), so the finite
#     argument's derivative is 1; it is sigmoid(a - b) = 0.
KNOWN = {"hypot": lambda a, b: np.isinf(a) or np.isinf(b), "logaddexp": lambda a, b: np.isinf(a) or np.isinf(b)}
# Points: zeros of both signs, a tiny normal value (1e-150: its square is still normal; XLA on CPU
# flushes subnormals to zero, so smaller ones test XLA, not the rule), ones, infinities. Huge ones
# are 1e100: at 1e300 JAX's own formulas overflow (hypot's derivative at equal legs is 1.06, not
# 0.707; d/dy x / y of inf is NaN, not -inf) and results go subnormal, which XLA flushes.
POINTS = [0.0, -0.0, 1e-150, -1e-150, 1.0, -1.0, np.inf, -np.inf]
N_UNARY, N_BINARY = 36, 13        # the functions of _unary_pairs and _binary_pairs
MORE_POINTS = POINTS + [0.5, -0.5, 2.0, -2.0, 1e100, -1e100, 3.0, 1e-8]


def _same(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    both_nan = np.isnan(got) & np.isnan(want)
    close = np.isclose(got, want, rtol=1e-12, atol=0) | (got == want)
    return both_nan | close


def _sweep(points):
    """Every function's derivative at every point (pair), as one Vector kernel per arity (a
    component per function) against one jax.grad: two compiles, not fifty."""
    jax, jnp, _ = _jax()
    bad, count = [], 0
    un, bi = _unary_pairs(), _binary_pairs()
    fu, fb = [getattr(hm, n) for n in un], [getattr(hm, n) for n in bi]
    assert (len(fu), len(fb)) == (N_UNARY, N_BINARY)

    @hawk.kernel
    def unary(x: Vector[N_UNARY]):
        return hm.vec(*[f(x[j]) for j, f in enumerate(fu)])

    @hawk.kernel
    def binary(x: Vector[N_BINARY], y: Vector[N_BINARY]):
        return hm.vec(*[f(x[j], y[j]) for j, f in enumerate(fb)])

    x = np.tile(np.array(points), (len(fu), 1))
    got = hd.vjp(unary)(x, cotangent=np.ones_like(x))["x"]
    grad_u = jax.grad(lambda v: sum(f(v[j]) for j, f in enumerate(un.values())))
    want = jax.jit(jax.vmap(grad_u, 1, 1))(jnp.asarray(x))
    ok = _same(got, want)
    count += ok.size
    bad += [(name, p, g, w) for name, row, wrow, okr in zip(un, got, np.asarray(want), ok)
            for p, g, w, o in zip(points, row, wrow, okr) if not o]
    a, b = (np.array(v) for v in zip(*[(p, q) for p in points for q in points]))
    a, b = np.tile(a, (len(fb), 1)), np.tile(b, (len(fb), 1))
    got = hd.vjp(binary)(a, b, cotangent=np.ones_like(a))
    grad_b = jax.grad(lambda u, v: sum(f(u[j], v[j]) for j, f in enumerate(bi.values())), (0, 1))
    want = jax.jit(jax.vmap(grad_b, 1, 1))(jnp.asarray(a), jnp.asarray(b))
    for row, name in enumerate(bi):
        skip = np.array([KNOWN.get(name, lambda p, q: False)(p, q) for p, q in zip(a[row], b[row])])
        for j, w in enumerate("xy"):
            ok = _same(got[w][row], want[j][row]) | skip
            count += int((~skip).sum())
            bad += [(f"{name}/d{w}", (p, q), g, v) for p, q, g, v, o in
                    zip(a[row], b[row], got[w][row], np.asarray(want[j][row]), ok) if not o]
    return bad, count


def _one(f):
    def k(x: Scalar):
        return f(x)
    return k


def _two(f):
    def k(x: Scalar, y: Scalar):
        return f(x, y)
    return k


def test_cbrt_and_hypot_derivatives_at_zero_are_jaxs():
    jax, jnp, _ = _jax()
    k = hawk.kernel(_one(hm.cbrt))
    x = np.array([0.0, -0.0, np.inf, 8.0])
    np.testing.assert_array_equal(hd.vjp(k)(x, cotangent=np.ones(4))["x"],
                                  [float(jax.grad(jnp.cbrt)(v)) for v in x])
    h = hawk.kernel(_two(hm.hypot))
    g = hd.vjp(h)(np.array([0.0, 3.0]), np.array([0.0, 4.0]), cotangent=np.ones(2))
    want = [jax.grad(jnp.hypot, (0, 1))(p, q) for p, q in ((0.0, 0.0), (3.0, 4.0))]
    np.testing.assert_allclose(g["x"], [float(w[0]) for w in want], rtol=1e-15)
    np.testing.assert_allclose(g["y"], [float(w[1]) for w in want], rtol=1e-15)


def test_derivatives_at_special_points_match_jax():
    """36 unary functions at 8 points and 13 binary ones at their 64 pairs: 1,840 derivatives
    (and 112 at KNOWN points skipped)."""
    bad, count = _sweep(POINTS)
    assert not bad, bad[:10]
    assert count == 1840


@pytest.mark.slow
def test_derivatives_at_more_points_match_jax():
    """16 points: 6,992 derivatives."""
    bad, count = _sweep(MORE_POINTS)
    assert not bad, bad[:10]
    assert count == 6992


def _float32_cases():
    """(name, f(x)) with x a float32 plane and every other operand a Python number."""
    cases = [(n, lambda x, f=getattr(hm, n): f(0.5 * x + 0.25)) for n in _UNARY]
    for n in _BINARY:
        f = getattr(hm, n)
        cases += [(f"{n}(x, 0.5)", lambda x, f=f: f(x, 0.5)), (f"{n}(0.5, x)", lambda x, f=f: f(0.5, x))]
    return cases + [
        ("x + 1", lambda x: x + 1.0), ("1 - x", lambda x: 1.0 - x), ("3 / x", lambda x: 3.0 / x),
        ("x ** 2", lambda x: x ** 2.0), ("2 ** x", lambda x: 2.0 ** x), ("x // 2", lambda x: x // 2.0),
        ("x % 2", lambda x: x % 2.0), ("x * 2 (int)", lambda x: x * 2),
        ("where(c, x, 2)", lambda x: hm.where(x > 0, x, 2.0)), ("where(c, 1, x)", lambda x: hm.where(x > 0, 1.0, x)),
        ("where(c, 1, 2) * x", lambda x: hm.where(x > 0, 1.0, 2.0) * x),
        ("select(c, 1, 2) + x", lambda x: hm.select(x > 0, 1.0, 2.0) + x),
        ("clip(x, 0, 0.5)", lambda x: hm.clip(x, 0.0, 0.5)),
        ("vec(1, x)", lambda x: hm.vec(1.0, x)), ("vec(x, 1)", lambda x: hm.vec(x, 1.0)),
        ("vec(1, 2) * x", lambda x: hm.vec(1.0, 2.0) * x), ("x * vec(1, 2)", lambda x: x * hm.vec(1.0, 2.0)),
        ("dot(vec(1, 2), vec(x, x))", lambda x: hm.dot(hm.vec(1.0, 2.0), hm.vec(x, x))),
        ("norm(vec(1, x))", lambda x: hm.norm(hm.vec(1.0, x))),
        ("cross", lambda x: hm.cross(hm.vec(1.0, 2.0, 3.0), hm.vec(x, x, 1.0))),
        ("outer", lambda x: hm.outer(hm.vec(1.0, 2.0), hm.vec(x, 3.0))),
        ("trace(outer)", lambda x: hm.trace(hm.outer(hm.vec(1.0, 2.0), hm.vec(x, x)))),
        ("matmul", lambda x: hm.matmul(hm.outer(hm.vec(1.0, 2.0), hm.vec(3.0, 4.0)), hm.vec(x, 1.0))),
        ("einsum", lambda x: hm.einsum("i,i->", hm.vec(1.0, 2.0), hm.vec(x, x))),
        ("logsumexp(vec(1, x))", lambda x: hm.logsumexp(hm.vec(1.0, x))),
    ]


_UNARY = ("abs", "sign", "floor", "ceil", "round", "trunc", "sqrt", "rsqrt", "cbrt", "exp", "exp2", "expm1", "log",
          "log2", "log10", "log1p", "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "tanh", "asinh",
          "acosh", "atanh", "erf", "erfc", "negative", "sigmoid", "softplus", "log_sigmoid", "relu", "stop_gradient")
_BINARY = ("atan2", "pow", "hypot", "fmod", "minimum", "maximum", "add", "subtract", "multiply", "divide",
           "logaddexp", "xlogy", "xlog1py")


def test_float32_stays_float32_with_python_numbers():
    """87 expressions, one kernel: float32 results on NumPy and JAX, float32 gradients."""
    cases = _float32_cases()
    fs = [f for _, f in cases]

    @hawk.kernel
    def every(x: Scalar):
        return tuple(f(x) for f in fs)

    x = np.linspace(0.1, 0.9, 5, dtype=np.float32)
    _, jnp, _ = _jax()
    outs = every(x)
    for (name, _), a, b in zip(cases, outs, every(jnp.asarray(x))):
        assert (a.dtype, b.dtype) == (np.float32, np.float32), (name, a.dtype, b.dtype)
    g = hd.vjp(every)(x, cotangent=tuple(np.ones_like(a) for a in outs))["x"]
    assert g.dtype == np.float32
    assert len(cases) == 87


def test_an_infinite_derivative_stays_in_its_component():
    """log'(0) = inf in one component of a Vector made no other component NaN (it did: the zeros
    of index's and stack's rules were 0.0 * value). Oracle: the derivative by hand."""
    @hawk.kernel
    def f(v: Vector[2]):
        return hm.log(v[0]) + v[1]

    @hawk.kernel
    def g(x: Scalar, y: Scalar):
        return hm.vec(hm.log(x), y)

    with np.errstate(divide="ignore"):
        grad = hd.vjp(f)(np.array([[0.0, 1.0], [2.0, 3.0]]), cotangent=np.ones(2))["v"]
        _, (tangent,) = hd.jvp(g, wrt=("y",))(np.array([0.0, 1.0]), np.array([1.0, 2.0]), tangents={"y": np.ones(2)})
    np.testing.assert_array_equal(grad, [[np.inf, 1.0], [1.0, 1.0]])
    np.testing.assert_array_equal(tangent, [[0.0, 0.0], [1.0, 1.0]])


# ---------------------------------------------------------------------------------------------
# &, |, ^, ~, divmod and @ on staged planes (inside builders)

@eagle.Graph.builder
def flags(x, y):
    g = eagle.Graph()
    a, b = x > 0.0, y < 0.5
    g.result = (a & b, a | b, a ^ b, ~a, a & True, False | b, True ^ a)
    return g


def _flags_numpy(x, y):
    a, b = x > 0.0, y < 0.5
    return (a & b, a | b, a ^ b, ~a, a & True, False | b, True ^ a)


@eagle.Graph.builder
def quotients(x):
    g = eagle.Graph()
    q, r = divmod(x, 0.75)
    q2, r2 = np.divmod(x, -1.5)
    g.result = (q, r, q2, r2) + divmod(2.0, x)
    return g


def _quotients_numpy(x):
    return np.divmod(x, 0.75) + np.divmod(x, -1.5) + np.divmod(2.0, x)


def test_bool_operators_on_planes_stage_as_numpy():
    """Against NumPy on the arrays, after each replay (the flags follow new values of x)."""
    rng = np.random.default_rng(7)
    x, y = rng.normal(size=9), rng.random(9)
    g = flags(x, y)
    for _ in range(2):
        for got, want in zip(g(), _flags_numpy(x, y)):
            assert got.dtype == np.bool_
            np.testing.assert_array_equal(got, want)
        x[:] = rng.normal(size=9)


def test_divmod_on_planes_stages_floor_division_and_remainder():
    x = np.array([-3.5, -0.75, -0.1, 0.0, 0.4, 1.6, 7.25])
    g = quotients(x)
    with np.errstate(divide="ignore", invalid="ignore"):           # divmod(2.0, 0.0), as NumPy warns
        for got, want in zip(g(), _quotients_numpy(x)):
            np.testing.assert_allclose(got, want, rtol=1e-15)


def _refusal(builder, *args):
    with pytest.raises(TypeError) as err:
        builder(*args)
    return str(err.value)


def test_integer_and_float_bit_operators_are_refused_with_the_line():
    @eagle.Graph.builder
    def bits(k, m):
        g = eagle.Graph()
        g.result = k & m
        return g

    @eagle.Graph.builder
    def float_bits(x):
        g = eagle.Graph()
        g.result = ~x
        return g

    msg = _refusal(bits, np.arange(4, dtype=np.int32), np.ones(4, np.int32))
    assert f"bits:{line_of(bits, 'k & m') - line_of(bits, '@eagle') + 1}" in msg and "int32" in msg, msg
    assert "(x > 0) & (y < 1)" in msg, msg
    msg = _refusal(float_bits, np.ones(4))
    assert "float_bits:" in msg and "float64" in msg and "NumPy refuses floats too" in msg, msg


def test_matmul_of_planes_is_refused_with_the_line_and_hm_dot():
    @eagle.Graph.builder
    def product(v, w):
        g = eagle.Graph()
        g.result = v @ w
        return g

    msg = _refusal(product, np.ones((3, 5)), np.ones((3, 5)))
    assert f"product:{line_of(product, 'v @ w') - line_of(product, '@eagle') + 1}" in msg, msg
    assert "@ (np.matmul)" in msg and "hm.dot" in msg, msg


def test_bit_operators_in_kernels_are_logical_on_bools_and_refused_on_integers():
    """In a kernel, `k & 1` on integers was logical_and (True), where NumPy's is bitwise (k's low bit)."""
    @hawk.kernel
    def logic(x: Scalar, y: Scalar):
        a, b = x > 0, y < 0.5
        return a & b, a | True, False ^ b, ~a, a ^ b

    x, y = np.array([-1.0, 0.5, 2.0, 3.0]), np.array([0.1, 0.7, 0.2, 0.9])
    a, b = x > 0, y < 0.5
    for got, want in zip(logic(x, y), (a & b, a | True, False ^ b, ~a, a ^ b)):
        assert got.dtype == np.bool_
        np.testing.assert_array_equal(got, want)

    @hawk.kernel
    def low_bit(k: UInt32):
        return k & 1

    with pytest.raises(hawk.TraceError, match=r"low_bit:3 .*`&` with a uint32 operand.*bitwise"):
        low_bit(np.arange(4, dtype=np.uint32))
