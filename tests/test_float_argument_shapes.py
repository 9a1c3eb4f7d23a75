"""Derivatives taken at a Python float (or a 0-d array) against JAX: shapes, dtypes and values of
grad, value_and_grad, jacfwd, jacrev, hessian, jvp and vjp, of their depth-2 compositions, and of
vmap of those with the float shared (in_axes=None). The kernels take a Scalar x and a Param w
given as the float; hawk.sum's one-cell result is JAX's f(...).reshape(1), read as a scalar by
grad, value_and_grad and hessian (JAX: jnp.sum of it)."""
from __future__ import annotations

import linecache
import random

import numpy as np
import pytest

import eagle_fx as ef

jax = pytest.importorskip("jax")
jax.config.update("jax_enable_x64", True)
jnp = jax.numpy

N = 4          # samples
B = 3          # instances

OURS = {"grad": ef.grad, "value_and_grad": ef.value_and_grad, "jacfwd": ef.jacfwd, "jacrev": ef.jacrev,
        "hessian": ef.hessian}
THEIRS = {"grad": jax.grad, "value_and_grad": jax.value_and_grad, "jacfwd": jax.jacfwd, "jacrev": jax.jacrev,
          "hessian": jax.hessian}
SCALAR_READ = ("grad", "value_and_grad", "hessian")     # read a one-cell result as one value
INNER = ["grad", "jacfwd", "jacrev"]
OUTER = ["grad", "jacfwd", "jacrev", "hessian"]


def _load(text, tag):
    filename = f"<float shapes {tag}>"
    text = "import numpy as np\nimport eagle_fx as ef\nimport hawk_fx as hk\nimport hawk_fx.math as hm\n" \
           "from hawk_fx import Param, Scalar\n\n" + text
    linecache.cache[filename] = (len(text), None, text.splitlines(True), filename)
    ns: dict = {}
    exec(compile(text, filename, "exec"), ns)
    return ns["f"]


_UNARY = [("hm.sin", "jnp.sin"), ("hm.cos", "jnp.cos"), ("hm.tanh", "jnp.tanh")]


def _expr(rng, depth):
    if depth == 0 or rng.random() < 0.25:
        return rng.choice(["w", "x", repr(round(rng.uniform(0.5, 2.0), 2))])
    if rng.random() < 0.3:
        return f"{rng.choice(_UNARY)[0]}({_expr(rng, depth - 1)})"
    return f"({_expr(rng, depth - 1)} {rng.choice(['+', '-', '*'])} {_expr(rng, depth - 1)})"


class Case:
    """A random kernel of a Scalar x and a Param w (nonlinear in w: third derivatives are not 0),
    its builder, and the same math in JAX."""

    def __init__(self, seed):
        rng = random.Random(seed)
        e = f"({_expr(rng, 3)}) * x + {rng.choice(_UNARY)[0]}(w * x) + w * w * w"
        self.src = (f"@hk.kernel\ndef k(x: Scalar, w: Param) -> Scalar:\n    return hk.sum({e})\n\n\n"
                    "@ef.Graph.builder\ndef f(w, x):\n    g = ef.Graph()\n    g.result = k(x, w)\n    return g\n")
        self.f = _load(self.src, f"case {seed}")
        je = e
        for h, j in _UNARY:
            je = je.replace(h, j)
        ns = {"jnp": jnp}
        exec(f"def fj(w, x):\n    return jnp.sum({je})\n", ns)
        self.fj = ns["fj"]

    def __repr__(self):
        return self.src


def _theirs(name, g):
    """JAX's transform of the JAX function that stands for ours (a one-cell result: (1,))."""
    if name in SCALAR_READ:
        return THEIRS[name](lambda *a: jnp.sum(g(*a)))
    return THEIRS[name](g)


def _pair(case, names):
    """(ours, JAX's) for a chain of transform names, innermost last."""
    ours, theirs = case.f, lambda w, x: case.fj(w, x).reshape(1)
    for name in reversed(names):
        ours, theirs = OURS[name](ours), _theirs(name, theirs)
    return ours, theirs


def _compare(got, want, what):
    got, want = jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)
    assert len(got) == len(want), what
    for g, w in zip(got, want):
        g, w = np.asarray(g), np.asarray(w)
        assert g.shape == w.shape, f"{what}: shape {g.shape}, JAX {w.shape}"
        assert g.dtype == w.dtype, f"{what}: dtype {g.dtype}, JAX {w.dtype}"
        np.testing.assert_allclose(g, w, rtol=1e-9, atol=1e-11, err_msg=what)


def _value_as_jax(names, out):
    """value_and_grad's value is hawk.sum's one cell; JAX's jnp.sum gives it 0-d."""
    if names == ["value_and_grad"]:
        return np.asarray(out[0]).reshape(np.shape(out[0])[:-1]), out[1]
    return out


def _w(form, v):
    return v if form == "float" else np.array(v)


def _jw(w):
    return w if isinstance(w, float) else jnp.asarray(w)


def check_call(case, names, form, v, x, batched):
    ours, theirs = _pair(case, names)
    w = _w(form, v)
    what = f"{case!r}{'vmap ' if batched else ''}{'('.join(names)}(f) at w={form}"
    if batched:
        got = ef.vmap(ours, in_axes=(None, 0))(w, x)
        want = jax.vmap(theirs, in_axes=(None, 0))(_jw(w), jnp.asarray(x))
    else:
        got = ours(w, x)
        want = theirs(_jw(w), jnp.asarray(x))
    _compare(_value_as_jax(names, got), want, what)


def check_jvp_vjp(case, inner, form, v, t, x):
    ours, theirs = _pair(case, [inner] if inner else [])
    w = _w(form, v)
    what = f"{case!r}jvp/vjp of {inner or 'f'} at w={form}"
    got = ef.jvp(ours, (w, x), (_w(form, t), None))
    want = jax.jvp(lambda a: theirs(a, jnp.asarray(x)), (_jw(w),), (_jw(_w(form, t)),))
    _compare(got, want, what + " (jvp)")
    y, pullback = ef.vjp(ours, w, x)
    yj, pullback_j = jax.vjp(theirs, _jw(w), jnp.asarray(x))
    _compare(y, yj, what + " (vjp result)")
    ct = np.full(np.shape(yj), 0.5 + t)
    _compare(pullback(ct), pullback_j(jnp.asarray(ct)), what + " (vjp pullback)")


def _draws(seed, n):
    r = random.Random(seed * 7919 + 3)
    chains = [[o, i] for o in OUTER for i in INNER] + [[a] for a in OURS]
    for _ in range(n):
        names, batched = r.choice(chains), r.random() < 0.4
        yield names, r.choice(["float", "0d"]), batched, r.choice([None] + INNER)


def run_case(seed, n):
    case = Case(seed)
    rng = np.random.default_rng(seed)
    for names, form, batched, inner in _draws(seed, n):
        v, t = float(rng.uniform(0.3, 1.2)), float(rng.uniform(-1, 1))
        x = rng.uniform(-1, 1, (B, N) if batched else N)
        check_call(case, names, form, v, x, batched)
        check_jvp_vjp(case, inner, form, v, t, x[0] if batched else x)


# ---------------------------------------------------------------------------------------------
# the compositions that gave (1,) where JAX gives (), each once

FIXED = Case(0)


@pytest.mark.parametrize("outer", ["jacfwd", "jacrev"])
@pytest.mark.parametrize("inner", INNER)
def test_a_jacobian_of_a_derivative_at_a_float_has_jax_s_shape(outer, inner):
    x = np.random.default_rng(1).uniform(-1, 1, N)
    form = "0d" if (outer, inner) in (("jacfwd", "jacrev"), ("jacrev", "grad")) else "float"
    check_call(FIXED, [outer, inner], form, 0.7, x, batched=False)


@pytest.mark.parametrize("outer, inner", [("jacfwd", "grad"), ("jacrev", "jacfwd")])
def test_vmap_of_a_jacobian_of_a_derivative_at_a_shared_float(outer, inner):
    x = np.random.default_rng(2).uniform(-1, 1, (B, N))
    check_call(FIXED, [outer, inner], "float", 0.7, x, batched=True)


@pytest.mark.parametrize("inner, form", [("grad", "float"), ("jacfwd", "0d"), ("jacrev", "float")])
def test_jvp_and_vjp_of_a_derivative_at_a_float(inner, form):
    check_jvp_vjp(FIXED, inner, form, 0.7, 0.3, np.random.default_rng(3).uniform(-1, 1, N))


@pytest.mark.parametrize("outer", ["jacfwd", "jacrev"])
def test_a_jacobian_in_x_of_a_gradient_in_a_float_w(outer):
    """The float is differentiated by the inner grad only (the outer takes x): traced by the call,
    it is still the float to grad, whose part of the Jacobian is 0-d: shape x.shape, as JAX's."""
    x = np.random.default_rng(5).uniform(-1, 1, N)
    got = OURS[outer](ef.grad(FIXED.f, 0), 1)(0.7, x)
    want = THEIRS[outer](jax.grad(FIXED.fj, 0), 1)(0.7, jnp.asarray(x))
    _compare(got, want, f"{outer}(grad(f, 0), 1)")
    xb = np.random.default_rng(6).uniform(-1, 1, (B, N))
    got = ef.vmap(OURS[outer](ef.grad(FIXED.f, 0), 1), in_axes=(None, 0))(np.array(0.7), xb)
    want = jax.vmap(THEIRS[outer](jax.grad(FIXED.fj, 0), 1), in_axes=(None, 0))(jnp.asarray(0.7), jnp.asarray(xb))
    _compare(got, want, f"vmap({outer}(grad(f, 0), 1))")


def test_jacfwd_of_grad_at_a_float_gives_the_second_derivative_0d():
    """d2/dw2 sum(w**3 * x) = 6 w sum(x), by hand."""
    f = _load("@hk.kernel\ndef k(x: Scalar, w: Param) -> Scalar:\n    return hk.sum(w * w * w * x)\n\n\n"
              "@ef.Graph.builder\ndef f(w, x):\n    g = ef.Graph()\n    g.result = k(x, w)\n    return g\n", "cube")
    x = np.array([0.5, -1.0, 2.0])
    for outer in (ef.jacfwd, ef.jacrev):
        got = outer(ef.grad(f))(0.5, x)
        assert got.shape == () and got.dtype == np.float64
        np.testing.assert_allclose(got, 6 * 0.5 * x.sum(), rtol=1e-12)


def test_a_cotangent_in_the_raw_one_cell_shape_is_still_taken():
    """vjp(grad(f)) at a float shows a 0-d result; a (1,) cotangent, as before, is read the same."""
    x = np.random.default_rng(4).uniform(-1, 1, N)
    y, pullback = ef.vjp(ef.grad(FIXED.f), 0.7, x)
    assert np.shape(y) == ()
    a, b = pullback(np.array(1.5)), pullback(np.array([1.5]))
    np.testing.assert_allclose(a[0], b[0], rtol=0)
    np.testing.assert_allclose(a[1], b[1], rtol=0)
    with pytest.raises(ValueError, match=r"cotangent of result 0 has shape \(2,\); the result has \(\)"):
        pullback(np.ones(2))


def test_vmap_of_jacrev_of_grad_through_sin_of_a_product():
    f = _load("@hk.kernel\ndef k(x: Scalar, w: Param) -> Scalar:\n    return hk.sum(hm.sin(x * w) * x)\n\n\n"
              "@ef.Graph.builder\ndef f(w, x):\n    g = ef.Graph()\n    g.result = k(x, w)\n    return g\n", "sin")
    x = np.random.default_rng(6).uniform(-1, 1, (B, N))
    got = ef.vmap(ef.jacrev(ef.grad(f)), in_axes=(None, 0))(np.array([0.7]), x)
    want = jax.vmap(jax.jacrev(jax.grad(lambda w, x: jnp.sum(jnp.sin(x * w) * x))), in_axes=(None, 0))(
        jnp.asarray([0.7]), jnp.asarray(x))
    _compare(got, want, "vmap(jacrev(grad(f)))")


# ---------------------------------------------------------------------------------------------
# a seeded sweep over random kernels

def test_random_kernels_derivatives_at_a_float_match_jax():
    run_case(1, 3)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(3, 40))
def test_random_kernels_derivatives_at_a_float_match_jax_sweep(seed):
    run_case(seed, 10)
