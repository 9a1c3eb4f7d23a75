"""Host nodes with derivative rules: eagle_fx.opaque(fn, reads, writes, jvp=, vjp=). The oracles
are jax.custom_vjp / jax.custom_jvp carrying the same rules around the same math in jax.numpy,
closed forms (Cardano's root of r**3 + r = a) and finite differences; and the refusals read."""
import numpy as np
import pytest

jax = pytest.importorskip("jax")
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402

import eagle_fx  # noqa: E402
from eagle_fx.backends.select import use_backend  # noqa: E402
from tour_kernels import affine, total, wobble  # noqa: E402

brentq = pytest.importorskip("scipy.optimize").brentq


# -- a clipped gradient (vjp= only) -------------------------------------------------------------

def clip_vjp(p, ct):
    return {"x": np.clip(ct["y"], -1.0, 1.0)}


@eagle_fx.Graph.builder
def clipped(x):
    g = eagle_fx.Graph()
    y = wobble(x)
    z = y * 1.0
    g.add_node(eagle_fx.opaque(lambda p: {"y": p["x"]}, reads={"x": y}, writes={"y": z}, vjp=clip_vjp),
               name="clip")
    g.result = total(affine(z, 3.0, 0.5))
    return g


@jax.custom_vjp
def jax_clip(x):
    return x


jax_clip.defvjp(lambda x: (x, None), lambda _, c: (jnp.clip(c, -1.0, 1.0),))


def jax_clipped(x):
    y = jax_clip(jnp.sin(x) * x)
    return jnp.sum((3.0 * y + 0.5) ** 2)


def test_a_clipped_gradient_equals_jax_custom_vjp_of_the_same_rule_on_both_backends():
    rng = np.random.default_rng(1)
    for _ in range(3):
        x = rng.uniform(-1.5, 1.5, 7)
        want = jax.grad(jax_clipped)(jnp.asarray(x))
        np.testing.assert_allclose(eagle_fx.grad(clipped)(x), want, rtol=1e-12)
        with use_backend("jax"):
            np.testing.assert_allclose(eagle_fx.grad(clipped)(x), want, rtol=1e-12)
    np.testing.assert_allclose(clipped(x)()[0], jax_clipped(jnp.asarray(x)), rtol=1e-12)


def test_forward_mode_through_a_vjp_only_rule_is_refused_with_jax_words():
    with pytest.raises(ValueError, match=r"eagle_fx.jvp: the host node 'clip' \(clipped:\d+\) has a vjp= rule only: "
                                         r"can't apply forward-mode autodiff \(jvp\) to a custom_vjp function"):
        eagle_fx.jvp(clipped, (np.ones(3),), (np.ones(3),))


# -- a straight-through estimator (both rules) --------------------------------------------------

@eagle_fx.Graph.builder
def quantised(x):
    g = eagle_fx.Graph()
    y = x * 1.0
    g.add_node(eagle_fx.opaque(lambda p: {"y": np.round(p["x"])}, reads={"x": x}, writes={"y": y},
                               jvp=lambda p, t: {"y": t["x"]}, vjp=lambda p, ct: {"x": ct["y"]}), name="round")
    g.result = total(wobble(y))
    return g


@jax.custom_jvp
def jax_round(x):
    return jnp.round(x)


jax_round.defjvp(lambda p, t: (jnp.round(p[0]), t[0]))


def jax_quantised(x):
    y = jax_round(x)
    return jnp.sum((jnp.sin(y) * y) ** 2)


def test_a_straight_through_estimator_equals_jax_custom_jvp_in_both_modes():
    x = np.array([0.2, 0.7, 1.4, 2.6, -0.8])
    want = jax.grad(jax_quantised)(jnp.asarray(x))
    np.testing.assert_allclose(eagle_fx.grad(quantised)(x), want, rtol=1e-12)
    v = np.cos(np.arange(5.0))
    _, t = eagle_fx.jvp(quantised, (x,), (v,))
    np.testing.assert_allclose(t[0], jax.jvp(jax_quantised, (jnp.asarray(x),), (jnp.asarray(v),))[1], rtol=1e-12)
    np.testing.assert_allclose(eagle_fx.jacfwd(quantised)(x)[0], want, rtol=1e-12)
    np.testing.assert_allclose(eagle_fx.jacrev(quantised)(x)[0], want, rtol=1e-12)
    xs = np.stack([x, x + 0.3])                                  # per instance: the host code runs per instance
    vg = eagle_fx.vmap(eagle_fx.grad(quantised))(xs)
    np.testing.assert_allclose(vg[1], jax.grad(jax_quantised)(jnp.asarray(xs[1])), rtol=1e-12)


def test_a_jvp_only_rule_is_refused_in_reverse_mode():
    @eagle_fx.Graph.builder
    def fwd_only(x):
        g = eagle_fx.Graph()
        y = x * 1.0
        g.add_node(eagle_fx.opaque(lambda p: {"y": p["x"]}, reads={"x": x}, writes={"y": y},
                                   jvp=lambda p, t: {"y": t["x"]}), name="fwd")
        g.result = total(y)
        return g
    with pytest.raises(ValueError, match="eagle_fx.grad: the host node 'fwd' .* has a jvp= rule only.*give it vjp="):
        eagle_fx.grad(fwd_only)(np.ones(3))
    np.testing.assert_allclose(eagle_fx.jvp(fwd_only, (np.ones(3),), (np.ones(3),))[1], [6.0])


# -- an implicit-function rule around brentq ----------------------------------------------------

def roots(p):
    return {"r": [brentq(lambda t, a=a: t ** 3 + t - a, -10.0, 10.0, xtol=1e-14) for a in p["a"]]}


@eagle_fx.Graph.builder
def root_loss(a):
    g = eagle_fx.Graph()
    r = a * 0.0
    g.add_node(eagle_fx.opaque(roots, reads={"a": a}, writes={"r": r},
                               jvp=lambda p, t: {"r": t["a"] / (3.0 * p["r"] ** 2 + 1.0)},
                               vjp=lambda p, ct: {"a": ct["r"] / (3.0 * p["r"] ** 2 + 1.0)}), name="brentq")
    g.result = total(wobble(r))
    return g


def cardano(a):
    d = np.sqrt(a ** 2 / 4 + 1 / 27)
    return np.cbrt(a / 2 + d) + np.cbrt(a / 2 - d)


def test_an_implicit_function_rule_matches_the_closed_form_and_finite_differences():
    rng = np.random.default_rng(4)
    for _ in range(3):
        a = rng.uniform(-3.0, 3.0, 6)
        r = cardano(a)
        dr = 1.0 / (3 * r ** 2 + 1)
        s = np.sin(r) * r
        want = 2 * s * (np.sin(r) + r * np.cos(r)) * dr
        np.testing.assert_allclose(eagle_fx.grad(root_loss)(a), want, rtol=1e-10)
        np.testing.assert_allclose(eagle_fx.jacfwd(root_loss)(a)[0], want, rtol=1e-10)
        h = 1e-6
        fd = [(np.sum((np.sin(cardano(a + h * e)) * cardano(a + h * e)) ** 2)
               - np.sum((np.sin(cardano(a - h * e)) * cardano(a - h * e)) ** 2)) / (2 * h) for e in np.eye(6)]
        np.testing.assert_allclose(eagle_fx.grad(root_loss)(a), fd, rtol=1e-6, atol=1e-9)
    with use_backend("jax"):
        np.testing.assert_allclose(eagle_fx.grad(root_loss)(a), want, rtol=1e-10)


def test_to_jax_forward_mode_runs_the_rule_as_a_callback():
    f = eagle_fx.to_jax(root_loss)
    a = np.linspace(0.5, 2.5, 4)
    r = cardano(a)
    want = 2 * (np.sin(r) * r) * (np.sin(r) + r * np.cos(r)) / (3 * r ** 2 + 1)
    np.testing.assert_allclose(jax.jacfwd(lambda u: f(u)[0])(jnp.asarray(a)), want, rtol=1e-10)


def test_bad_rules_are_refused_naming_the_node():
    @eagle_fx.Graph.builder
    def bad(x):
        g = eagle_fx.Graph()
        y = x * 1.0
        g.add_node(eagle_fx.opaque(lambda p: {"y": p["x"]}, reads={"x": x}, writes={"y": y},
                                   vjp=lambda p, ct: {"x": ct["y"][:2]}), name="short")
        g.result = total(y)
        return g
    with pytest.raises(ValueError, match="'short'.*vjp gives 'x' the shape \\(2,\\); the array has \\(3,\\)"):
        eagle_fx.grad(bad)(np.ones(3))
    with pytest.raises(TypeError, match="jvp= takes a function"):
        eagle_fx.opaque(lambda p: p, reads={}, writes={}, jvp=3)


def test_cuda_lowering_refuses_a_host_rule_and_says_where_to_run_it():
    pytest.importorskip("eagle_fx.testing.fake_cuda")
    with use_backend("fake-cuda"), pytest.raises(NotImplementedError,
                                                 match="CUDA lowering: the host function .* run this graph on the "
                                                       "NumPy or JAX backend"):
        eagle_fx.grad(quantised)(np.array([0.2, 0.7, 1.4]))
