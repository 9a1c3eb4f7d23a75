"""eagle_fx.custom_vjp / custom_jvp on whole builders (JAX's decorator shapes): called directly, under
every transform, nested in another builder, on the NumPy and JAX backends and through to_jax. The
oracle is jax.custom_vjp / jax.custom_jvp carrying the same rule around the same math in jax.numpy;
the rules differ from the true derivative on purpose (a clipped gradient, a straight-through
estimator), so agreement shows the rule is used. Where a rule is the true derivative, central
differences of plain NumPy check it."""
import numpy as np
import pytest

jax = pytest.importorskip("jax")
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402

import eagle_fx  # noqa: E402
import hawk_fx as hawk  # noqa: E402
from eagle_fx.backends.select import use_backend  # noqa: E402
from hawk_fx import Scalar  # noqa: E402
from hawk_fx import math as hm  # noqa: E402
from tour_kernels import cell  # noqa: E402


@hawk.kernel
def wave(x: Scalar) -> Scalar:
    return hm.sin(x) * x


@hawk.kernel
def clip1(x: Scalar) -> Scalar:
    return hm.minimum(hm.maximum(x, -1.0), 1.0)


@hawk.kernel
def scaled(c: Scalar, x: Scalar) -> Scalar:
    return c * (hm.sin(x) + x * hm.cos(x))         # d(sin(x) x)/dx, times c


@hawk.kernel
def stair(x: Scalar) -> Scalar:
    return hm.floor(3.0 * x) / 3.0


@hawk.kernel
def sqsum(x: Scalar) -> Scalar:
    return hawk.sum(x * x)


@hawk.kernel
def cube(x: Scalar) -> Scalar:
    return x * x * x


@hawk.kernel
def softplus(x: Scalar) -> Scalar:
    return hm.log(1.0 + hm.exp(x))


@hawk.kernel
def sigmoid_t(x: Scalar, t: Scalar) -> Scalar:
    return t / (1.0 + hm.exp(-x))


# -- custom_vjp on a builder: the gradient of `wave` clipped to [-1, 1] ---------------------------

@eagle_fx.Graph.builder
def wave_b(x):
    g = eagle_fx.Graph()
    g.result = wave(x)
    return g


clipped = eagle_fx.custom_vjp(wave_b)


def clipped_fwd(x):
    return clipped(x), (x,)                        # the rule calls the function itself, as in JAX


def clipped_bwd(res, ct):
    return (clip1(scaled(ct, res[0])),)


clipped.defvjp(clipped_fwd, clipped_bwd)


@eagle_fx.Graph.builder
def loss(x):                                       # the custom builder nested in another builder
    g = eagle_fx.Graph()
    g.result = sqsum(cube(clipped(x)))
    return g


@jax.custom_vjp
def j_clipped(x):
    return jnp.sin(x) * x


j_clipped.defvjp(lambda x: (jnp.sin(x) * x, (x,)),
                 lambda res, ct: (jnp.clip(ct * (jnp.sin(res[0]) + res[0] * jnp.cos(res[0])), -1.0, 1.0),))


def j_loss(x):
    return jnp.sum(j_clipped(x) ** 6)


def _xs(seed, k=3, n=5):
    rng = np.random.default_rng(seed)
    return [rng.uniform(-2.5, 2.5, n) for _ in range(k)]


def test_a_custom_vjp_builder_called_directly_builds_the_builders_graph():
    x = np.linspace(-2.0, 2.0, 5)
    assert isinstance(clipped, eagle_fx.custom_vjp) and repr(clipped) == "<eagle_fx.custom_vjp wave_b>"
    np.testing.assert_allclose(clipped(x)(), np.sin(x) * x, rtol=1e-14)
    assert "custom[kind=custom_vjp fn=wave_b]" in str(eagle_fx.make_program(loss)(x))


@pytest.mark.parametrize("backend", ["numpy", "jax"])
def test_a_custom_vjp_builder_equals_jax_custom_vjp_under_every_reverse_transform(backend):
    with use_backend(backend):
        for x in _xs(0, k=1):
            xj = jnp.asarray(x)
            want = np.asarray(jax.grad(j_loss)(xj))
            true = np.asarray(jax.grad(lambda u: jnp.sum((jnp.sin(u) * u) ** 6))(xj))
            assert not np.allclose(want, true)                    # the rule, not the body's derivative
            np.testing.assert_allclose(eagle_fx.grad(loss)(x), want, rtol=1e-12)
            np.testing.assert_allclose(eagle_fx.jacrev(loss)(x)[0], want, rtol=1e-12)
            v, pull = eagle_fx.vjp(loss, x)
            np.testing.assert_allclose(pull(np.ones(1))[0], want, rtol=1e-12)
            # directly: the custom builder's own Jacobian (diagonal: the clipped derivative)
            np.testing.assert_allclose(eagle_fx.jacrev(clipped)(x), jax.jacrev(j_clipped)(xj), rtol=1e-12)
        xs = np.stack(_xs(1, k=3))
        np.testing.assert_allclose(eagle_fx.vmap(eagle_fx.grad(loss))(xs), jax.vmap(jax.grad(j_loss))(xs),
                                   rtol=1e-12)
        np.testing.assert_allclose(eagle_fx.vmap(clipped)(xs)(), jax.vmap(j_clipped)(xs), rtol=1e-13)


def test_forward_mode_through_a_custom_vjp_builder_is_refused_with_jax_words():
    x = np.ones(3)
    for f in (loss, clipped):
        with pytest.raises(ValueError, match=r"eagle_fx.jvp: wave_b \(.*\) is an eagle_fx.custom_vjp: can't apply "
                                             r"forward-mode autodiff \(jvp\) to a custom_vjp function"):
            eagle_fx.jvp(f, (x,), (x,))
    with pytest.raises(ValueError, match="can't apply forward-mode autodiff"):
        eagle_fx.jacfwd(loss)(x)


def test_to_jax_of_a_custom_vjp_builder_is_reverse_mode_only_as_jax_custom_vjp():
    x = jnp.asarray(np.linspace(-2.2, 1.9, 6))
    f = eagle_fx.to_jax(loss)
    np.testing.assert_allclose(jax.jit(f)(x)[0], j_loss(x), rtol=1e-13)
    np.testing.assert_allclose(jax.grad(lambda u: f(u)[0])(x), jax.grad(j_loss)(x), rtol=1e-12)
    np.testing.assert_allclose(jax.jit(jax.grad(lambda u: f(u)[0]))(x), jax.grad(j_loss)(x), rtol=1e-12)
    with pytest.raises(TypeError, match="can't apply forward-mode autodiff \\(jvp\\) to a custom_vjp function"):
        jax.jvp(lambda u: f(u)[0], (x,), (x,))
    with pytest.raises(TypeError, match="can't apply forward-mode autodiff \\(jvp\\) to a custom_vjp function"):
        jax.jvp(j_loss, (x,), (x,))                                  # the oracle says the same


# -- custom_jvp on a builder: a straight-through estimator ---------------------------------------

@eagle_fx.Graph.builder
def quantize(x):
    g = eagle_fx.Graph()
    g.result = stair(x)
    return g


ste = eagle_fx.custom_jvp(quantize)


@ste.defjvp
def ste_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    return ste(x), t                               # the step's derivative taken as 1


@eagle_fx.Graph.builder
def q_loss(x):
    g = eagle_fx.Graph()
    g.result = sqsum(wave(ste(wave(x))))
    return g


@jax.custom_jvp
def j_ste(x):
    return jnp.floor(3.0 * x) / 3.0


j_ste.defjvp(lambda p, t: (j_ste(p[0]), t[0]))


def j_q_loss(x):
    q = j_ste(jnp.sin(x) * x)
    return jnp.sum((jnp.sin(q) * q) ** 2)


@pytest.mark.parametrize("backend", ["numpy", "jax"])
def test_a_straight_through_builder_equals_jax_custom_jvp_in_forward_and_reverse_mode(backend):
    with use_backend(backend):
        for k, x in enumerate(_xs(2, k=1)):
            xj, v = jnp.asarray(x), np.cos(3.0 * x + k)
            np.testing.assert_allclose(q_loss(x)()[0], j_q_loss(xj), rtol=1e-13)
            want = np.asarray(jax.grad(j_q_loss)(xj))
            assert np.any(np.abs(want) > 1e-3)                        # the step's true derivative is 0
            np.testing.assert_allclose(eagle_fx.grad(q_loss)(x), want, rtol=1e-12)
            np.testing.assert_allclose(eagle_fx.jvp(q_loss, (x,), (v,))[1][0],
                                       jax.jvp(j_q_loss, (xj,), (jnp.asarray(v),))[1], rtol=1e-12)
            np.testing.assert_allclose(eagle_fx.jacfwd(q_loss)(x)[0], want, rtol=1e-12)
            np.testing.assert_allclose(eagle_fx.jacfwd(ste)(x), jax.jacfwd(j_ste)(xj), rtol=1e-13)
            np.testing.assert_allclose(eagle_fx.jacrev(ste)(x), jax.jacrev(j_ste)(xj), rtol=1e-13)
        xs = np.stack(_xs(3, k=3))
        np.testing.assert_allclose(eagle_fx.vmap(eagle_fx.grad(q_loss))(xs), jax.vmap(jax.grad(j_q_loss))(xs),
                                   rtol=1e-12)


def test_to_jax_of_a_custom_jvp_builder_takes_jax_forward_and_reverse_mode():
    x = jnp.asarray(np.linspace(-2.1, 2.3, 6))
    f = eagle_fx.to_jax(q_loss)
    np.testing.assert_allclose(jax.grad(lambda u: f(u)[0])(x), jax.grad(j_q_loss)(x), rtol=1e-12)
    np.testing.assert_allclose(jax.jvp(lambda u: f(u)[0], (x,), (jnp.cos(x),))[1],
                               jax.jvp(j_q_loss, (x,), (jnp.cos(x),))[1], rtol=1e-12)
    np.testing.assert_allclose(eagle_fx.to_jax(ste)(x), j_ste(x), rtol=1e-14)


# -- true rules: finite differences ---------------------------------------------------------------

@eagle_fx.Graph.builder
def soft_b(x):
    g = eagle_fx.Graph()
    g.result = softplus(x)
    return g


soft_v = eagle_fx.custom_vjp(soft_b)
soft_v.defvjp(lambda x: (softplus(x), (x,)), lambda res, ct: (sigmoid_t(res[0], ct),))
soft_j = eagle_fx.custom_jvp(soft_b)
soft_j.defjvp(lambda p, t: (softplus(p[0]), sigmoid_t(p[0], t[0])))


def _loss_of(f):
    @eagle_fx.Graph.builder
    def soft_loss(x):
        g = eagle_fx.Graph()
        g.result = sqsum(f(wave(x)))
        return g
    return soft_loss


def numpy_soft_loss(x):
    return np.sum(np.log1p(np.exp(np.sin(x) * x)) ** 2)


def central(f, x, h=1e-6):
    return np.array([(f(x + h * e) - f(x - h * e)) / (2 * h) for e in np.eye(len(x))])


def test_true_rules_on_builders_match_central_differences_and_second_derivatives():
    lv, lj = _loss_of(soft_v), _loss_of(soft_j)
    for x in _xs(4, k=4, n=4):                                # a seeded random sweep
        want = central(numpy_soft_loss, x)
        np.testing.assert_allclose(eagle_fx.grad(lv)(x), want, rtol=1e-7, atol=1e-8)
        np.testing.assert_allclose(eagle_fx.grad(lj)(x), want, rtol=1e-7, atol=1e-8)
    # second derivatives differentiate the rule (a true one here): forward over the custom_jvp's reverse
    x = _xs(5, k=1, n=4)[0]
    hess = np.array([central(lambda u: eagle_fx.grad(lj)(u)[k], x, 1e-5) for k in range(4)])
    np.testing.assert_allclose(eagle_fx.hessian(lj)(x), hess, rtol=1e-6, atol=1e-7)


# -- a custom builder with a device loop inside, and several arguments -----------------------------

@hawk.kernel
def relax(x: Scalar, a: Scalar) -> Scalar:
    return 0.5 * x + 0.3 * hm.sin(a * x)


@hawk.kernel
def half(ct: Scalar) -> Scalar:
    return 0.5 * ct


@eagle_fx.Graph.builder
def settle(x, a, n):
    g = eagle_fx.Graph()
    for _ in range(n):                  # a counted device loop (n a one-cell integer array)
        x = relax(x, a)
    g.result = x
    return g


settle_c = eagle_fx.custom_vjp(settle)
settle_c.defvjp(lambda x, a, n: (settle_c(x, a, n), (x,)),
                lambda res, ct: (half(ct), None, None))       # a surrogate: d/dx taken as 0.5


@eagle_fx.Graph.builder
def settle_loss(x, a, n):
    g = eagle_fx.Graph()
    g.result = sqsum(settle_c(x, a, n))
    return g


def numpy_settle(x, a, n):
    for _ in range(n):
        x = 0.5 * x + 0.3 * np.sin(a * x)
    return x


def test_a_custom_builder_with_a_loop_runs_its_body_and_uses_its_rule():
    rng = np.random.default_rng(7)
    x, a, n = rng.uniform(-1, 1, 4), rng.uniform(0.5, 1.5, 4), cell(3)
    y = numpy_settle(x, a, 3)
    np.testing.assert_allclose(settle_loss(x, a, n)()[0], np.sum(y * y), rtol=1e-13)
    np.testing.assert_allclose(eagle_fx.grad(settle_loss)(x, a, n), 2 * y * 0.5, rtol=1e-12)
    ga = eagle_fx.grad(settle_loss, argnums=1)(x, a, n)
    np.testing.assert_allclose(ga, 0.0)                        # bwd gives no cotangent for `a`


# -- misuse ---------------------------------------------------------------------------------------

def test_misuse_of_a_custom_builder_is_refused_with_what_to_do():
    bare = eagle_fx.custom_vjp(wave_b)
    with pytest.raises(TypeError, match=r"custom_vjp\(wave_b\): no rule yet; define it with wave_b.defvjp"):
        bare(np.ones(3))
    bare.defvjp(lambda x: (wave(x), ()), lambda res, ct: (ct, ct))
    with pytest.raises(TypeError, match="bwd returns tuple; it returns a tuple of 1 cotangents"):
        eagle_fx.grad(_loss_of(bare))(np.ones(3))

    @eagle_fx.Graph.builder
    def no_result(x):
        g = eagle_fx.Graph()
        wave(x)
        return g
    nr = eagle_fx.custom_jvp(no_result)
    nr.defjvp(lambda p, t: (wave(p[0]), t[0]))
    with pytest.raises(TypeError, match=r"custom_jvp\(no_result\): the builder declares no result"):
        nr(np.ones(3))


def test_sweep_the_rules_of_custom_builders_over_random_points():
    """A seeded sweep: the clipped gradient and the straight-through estimator equal JAX's at random
    points, scales and sizes (a graph staged per size, replayed for the other points)."""
    rng = np.random.default_rng(8)
    grad_loss, grad_q = jax.jit(jax.grad(j_loss)), jax.jit(jax.grad(j_q_loss))
    for n in (1, 4, 9):
        for _ in range(4):
            x = rng.uniform(-1.0, 1.0, n) * rng.choice([0.3, 1.0, 3.0])
            np.testing.assert_allclose(eagle_fx.grad(loss)(x), grad_loss(x), rtol=1e-11, atol=1e-14)
            np.testing.assert_allclose(eagle_fx.grad(q_loss)(x), grad_q(x), rtol=1e-11, atol=1e-14)


@eagle_fx.Graph.builder
def looped_loss(x, a, n):
    g = eagle_fx.Graph()
    for _ in range(n):                  # a counted loop before the custom builder: to_jax's reverse
        x = relax(x, a)                 # mode recomputes its turns (its trip count is traced by JAX)
    g.result = sqsum(cube(clipped(4.0 * x)))
    return g


@pytest.mark.slow
def test_to_jax_of_a_custom_vjp_after_a_counted_loop_takes_jax_grad():
    x, a = jnp.asarray(np.linspace(-2.0, 2.0, 5)), jnp.full(5, 0.7)

    def j_looped(u):
        for _ in range(3):
            u = 0.5 * u + 0.3 * jnp.sin(a * u)
        return jnp.sum(j_clipped(4.0 * u) ** 6)
    f = eagle_fx.to_jax(looped_loss)
    want = jax.grad(j_looped)(x)
    np.testing.assert_allclose(jax.grad(lambda u: f(u, a, jnp.array([3], jnp.uint32))[0])(x), want, rtol=1e-11)
    np.testing.assert_allclose(eagle_fx.grad(looped_loss)(np.asarray(x), np.asarray(a), cell(3)), want, rtol=1e-11)


@hawk.kernel
def clip_half(x: Scalar) -> Scalar:
    return hm.minimum(hm.maximum(x, -0.5), 0.5)


def test_a_kernel_a_rule_reads_by_name_rebound_stages_again(monkeypatch):
    x = np.linspace(-2.0, 2.0, 5)
    first = eagle_fx.grad(loss)(x)
    np.testing.assert_allclose(np.abs(first).max(), 1.0)
    monkeypatch.setitem(globals(), "clip1", clip_half)          # clipped_bwd reads clip1 by name
    np.testing.assert_allclose(eagle_fx.grad(loss)(x), np.clip(first, -0.5, 0.5))
    monkeypatch.undo()
    np.testing.assert_allclose(eagle_fx.grad(loss)(x), first)


# -- a tree result, a keyword argument with a default, called in a device loop ----------------------

@eagle_fx.Graph.builder
def pair(x, scale=2.0):
    g = eagle_fx.Graph()
    g.result = {"w": wave(x), "c": cube(x * scale)}
    return g


pair_c = eagle_fx.custom_vjp(pair)
pair_c.defvjp(lambda x, scale: (pair_c(x, scale), (x,)),
              lambda res, ct: (clip1(ct["w"]) + ct["c"], None))     # a surrogate: a cotangent per argument


@eagle_fx.Graph.builder
def pair_loop(x, n):
    g = eagle_fx.Graph()
    for _ in range(n):
        d = pair_c(x, scale=0.5)
        x = d["w"] + d["c"]
    g.result = sqsum(x)
    return g


@jax.custom_vjp
def j_pair(x, s):
    return {"w": jnp.sin(x) * x, "c": (x * s) ** 3}


j_pair.defvjp(lambda x, s: (j_pair(x, s), (x,)), lambda res, ct: (jnp.clip(ct["w"], -1.0, 1.0) + ct["c"], None))


def test_a_custom_builder_with_a_tree_result_and_a_keyword_in_a_counted_loop():
    rng = np.random.default_rng(9)
    for turns in (1, 3):
        x = rng.uniform(-1.5, 1.5, 4)

        def j_loop(u):
            for _ in range(turns):
                d = j_pair(u, 0.5)
                u = d["w"] + d["c"]
            return jnp.sum(u * u)
        np.testing.assert_allclose(pair_loop(x, cell(turns))()[0], j_loop(jnp.asarray(x)), rtol=1e-13)
        np.testing.assert_allclose(eagle_fx.grad(pair_loop)(x, cell(turns)), jax.grad(j_loop)(jnp.asarray(x)),
                                   rtol=1e-12)
    out = pair_c(x)()                                       # directly: the default scale, the dict result
    np.testing.assert_allclose(out["c"], (2.0 * x) ** 3, rtol=1e-13)
