"""eagle_fx.custom_vjp / custom_jvp on kernels and blocks. The oracle is jax.custom_vjp /
jax.custom_jvp carrying the same rule around the same math in jax.numpy: a rule that differs from
the true derivative on purpose shows that every transform (and every backend) uses the rule."""
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
from tour_kernels import below, cell, dbl, total, wobble  # noqa: E402


@hawk.kernel
def ident(x: Scalar) -> Scalar:
    return x * 1.0


@hawk.kernel
def clip1(x: Scalar) -> Scalar:
    return hm.minimum(hm.maximum(x, -1.0), 1.0)


@hawk.kernel
def square(x: Scalar) -> Scalar:
    return x * x


@hawk.kernel
def triple_times(x: Scalar, t: Scalar) -> Scalar:
    return 3.0 * x * t                 # NOT d(x*x) = 2 x t: the rule is a surrogate, on purpose


# -- custom_vjp: a clipped gradient -----------------------------------------------------------

@eagle_fx.custom_vjp
def clip_gradient(x):
    return ident(x)


clip_gradient.defvjp(lambda x: (ident(x), ()), lambda res, ct: (clip1(ct),))


@eagle_fx.Graph.builder
def clipped(x):
    g = eagle_fx.Graph()
    g.result = total(dbl(clip_gradient(wobble(x))))
    return g


@jax.custom_vjp
def jax_clip_gradient(x):
    return x


jax_clip_gradient.defvjp(lambda x: (x, ()), lambda res, ct: (jnp.clip(ct, -1.0, 1.0),))


def jax_clipped(x):
    return jnp.sum((2.0 * jax_clip_gradient(jnp.sin(x) * x)) ** 2)


def test_custom_vjp_equals_jax_custom_vjp_in_grad_jacrev_and_vmap_on_both_backends():
    rng = np.random.default_rng(0)
    for _ in range(3):
        x = rng.uniform(-2.0, 2.0, 6)
        want = jax.grad(jax_clipped)(jnp.asarray(x))
        np.testing.assert_allclose(eagle_fx.grad(clipped)(x), want, rtol=1e-12)
        np.testing.assert_allclose(eagle_fx.jacrev(clipped)(x)[0], want, rtol=1e-12)
        with use_backend("jax"):
            np.testing.assert_allclose(eagle_fx.grad(clipped)(x), want, rtol=1e-12)
    xs = np.stack([x, 0.5 * x])
    np.testing.assert_allclose(eagle_fx.vmap(eagle_fx.grad(clipped))(xs)[1],
                               jax.grad(jax_clipped)(jnp.asarray(0.5 * x)), rtol=1e-12)
    np.testing.assert_allclose(clipped(x)()[0], jax_clipped(jnp.asarray(x)), rtol=1e-13)
    assert "custom[kind=custom_vjp fn=clip_gradient]" in str(eagle_fx.make_program(clipped)(x))


def test_forward_mode_through_a_custom_vjp_is_refused_with_jax_words():
    with pytest.raises(ValueError, match=r"eagle_fx.jvp: clip_gradient \(clipped:\d+\) is an eagle_fx.custom_vjp: "
                                         r"can't apply forward-mode autodiff \(jvp\) to a custom_vjp function"):
        eagle_fx.jvp(clipped, (np.ones(3),), (np.ones(3),))


# -- custom_jvp: a surrogate rule, transposed for reverse mode --------------------------------

@eagle_fx.custom_jvp
def sq(x):
    return square(x)


@sq.defjvp
def sq_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    return square(x), triple_times(x, t)


@eagle_fx.Graph.builder
def surrogate(x):
    g = eagle_fx.Graph()
    g.result = total(sq(wobble(x)))
    return g


@jax.custom_jvp
def jax_sq(x):
    return x * x


jax_sq.defjvp(lambda p, t: (p[0] * p[0], 3.0 * p[0] * t[0]))


def jax_surrogate(x):
    return jnp.sum(jax_sq(jnp.sin(x) * x) ** 2)


def test_custom_jvp_rule_is_used_in_forward_and_transposed_in_reverse_mode():
    rng = np.random.default_rng(2)
    for _ in range(2):
        x = rng.uniform(-2.0, 2.0, 5)
        v = rng.normal(size=5)
        xj = jnp.asarray(x)
        np.testing.assert_allclose(eagle_fx.jvp(surrogate, (x,), (v,))[1][0],
                                   jax.jvp(jax_surrogate, (xj,), (jnp.asarray(v),))[1], rtol=1e-12)
        want = jax.grad(jax_surrogate)(xj)
        np.testing.assert_allclose(eagle_fx.grad(surrogate)(x), want, rtol=1e-12)
        true = jax.grad(lambda u: jnp.sum((jnp.sin(u) * u) ** 4))(xj)
        assert not np.allclose(want, true)                       # the rule, not the body's derivative
    np.testing.assert_allclose(eagle_fx.hessian(surrogate)(x), jax.hessian(jax_surrogate)(xj), rtol=1e-10,
                               atol=1e-12)
    np.testing.assert_allclose(eagle_fx.jacfwd(surrogate)(x)[0], want, rtol=1e-12)


def test_to_jax_carries_the_custom_rules():
    x = np.linspace(-1.2, 1.7, 5)
    fs, fc = eagle_fx.to_jax(surrogate), eagle_fx.to_jax(clipped)
    np.testing.assert_allclose(jax.grad(lambda u: fs(u)[0])(jnp.asarray(x)), jax.grad(jax_surrogate)(x), rtol=1e-12)
    np.testing.assert_allclose(jax.hessian(lambda u: fs(u)[0])(jnp.asarray(x)), jax.hessian(jax_surrogate)(x),
                               rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(jax.jit(fc)(jnp.asarray(x))[0], jax_clipped(jnp.asarray(x)), rtol=1e-13)


# -- a custom function in a device loop, and a block ------------------------------------------

@eagle_fx.Graph.builder
def looped(x, flag):
    g = eagle_fx.Graph()
    for _ in range(6):
        if not flag:
            break
        x = sq(x)
        below(x, 50.0, flag)
    g.result = total(x)
    return g


def test_a_custom_jvp_inside_a_capped_loop_uses_its_rule_at_every_turn():
    x = np.array([1.1, 1.3, 1.2])
    turns = 0
    y = x.copy()
    while turns < 6:
        y = y * y
        turns += 1
        if not np.any(y < 50.0):
            break

    def ref(u):
        for _ in range(turns):
            u = jax_sq(u)
        return jnp.sum(u * u)
    np.testing.assert_allclose(eagle_fx.grad(looped)(x, cell(1)), jax.grad(ref)(jnp.asarray(x)), rtol=1e-11)
    np.testing.assert_allclose(eagle_fx.jvp(looped, (x, cell(1)), (np.ones(3), None))[1][0],
                               jax.jvp(ref, (jnp.asarray(x),), (jnp.ones(3),))[1], rtol=1e-11)


@eagle_fx.Graph.builder
def twice(g: eagle_fx.Graph, v):
    return dbl(dbl(v))


twice_c = eagle_fx.custom_vjp(twice)
twice_c.defvjp(lambda v: (dbl(dbl(v)), ()), lambda res, ct: (dbl(ct),))      # 2, not 4: a surrogate


@eagle_fx.Graph.builder
def with_block(x):
    g = eagle_fx.Graph()
    g.result = total(twice_c(g, x))
    return g


def test_a_block_with_a_custom_vjp():
    x = np.array([0.5, -1.0, 2.0])
    np.testing.assert_allclose(with_block(x)()[0], np.sum((4 * x) ** 2))
    np.testing.assert_allclose(eagle_fx.grad(with_block)(x), 2.0 * (2 * 4 * x * 4) / 4)    # ct 32 x, times 2


def test_misuse_is_refused_with_what_to_do():
    @eagle_fx.custom_vjp
    def bare(x):
        return ident(x)
    with pytest.raises(TypeError, match="custom_vjp\\(bare\\): call it inside a builder"):
        bare(np.ones(3))

    @eagle_fx.Graph.builder
    def uses_bare(x):
        g = eagle_fx.Graph()
        g.result = total(bare(x))
        return g
    with pytest.raises(TypeError, match="no rule yet; define it with bare.defvjp"):
        uses_bare(np.ones(3))
    bare.defvjp(lambda x: (ident(x), ()), lambda res, ct: (ct, ct))
    with pytest.raises(TypeError, match="bwd returns tuple; it returns a tuple of 1 cotangents"):
        uses_bare(np.ones(3))


def test_the_cuda_lowering_runs_the_body_and_the_rules():
    pytest.importorskip("eagle_fx.testing.fake_cuda")
    x = np.linspace(-1.5, 1.5, 6)
    with use_backend("fake-cuda"):
        np.testing.assert_allclose(clipped(x)()[0], jax_clipped(jnp.asarray(x)), rtol=1e-12)
        np.testing.assert_allclose(eagle_fx.grad(clipped)(x), jax.grad(jax_clipped)(jnp.asarray(x)), rtol=1e-12)
        np.testing.assert_allclose(eagle_fx.grad(surrogate)(x), jax.grad(jax_surrogate)(jnp.asarray(x)), rtol=1e-12)


# -- the kernel-level form: hawk_fx.custom_jvp, a per-sample rule ---------------------------------

@hawk.custom_jvp
@hawk.kernel
def softplus(x: Scalar) -> Scalar:
    return hm.log(1.0 + hm.exp(x))


@softplus.defjvp
def softplus_jvp(x: Scalar, t: Scalar):
    return hm.log(1.0 + hm.exp(x)), 2.0 * t / (1.0 + hm.exp(-x))        # twice the derivative: a surrogate


@eagle_fx.Graph.builder
def smooth_loss(x):
    g = eagle_fx.Graph()
    g.result = total(softplus(wobble(x)))
    return g


@jax.custom_jvp
def jax_softplus(x):
    return jnp.log1p(jnp.exp(x))


jax_softplus.defjvp(lambda p, t: (jnp.log1p(jnp.exp(p[0])), 2.0 * t[0] / (1.0 + jnp.exp(-p[0]))))


def jax_smooth_loss(x):
    return jnp.sum(jax_softplus(jnp.sin(x) * x) ** 2)


def test_a_kernel_level_rule_is_used_by_every_transform():
    x = np.linspace(-1.3, 1.1, 6)
    xj = jnp.asarray(x)
    np.testing.assert_allclose(softplus(x), np.log1p(np.exp(x)), rtol=1e-13)        # outside a graph: the kernel
    np.testing.assert_allclose(smooth_loss(x)()[0], jax_smooth_loss(xj), rtol=1e-13)
    np.testing.assert_allclose(eagle_fx.grad(smooth_loss)(x), jax.grad(jax_smooth_loss)(xj), rtol=1e-12)
    np.testing.assert_allclose(eagle_fx.jvp(smooth_loss, (x,), (np.cos(x),))[1][0],
                               jax.jvp(jax_smooth_loss, (xj,), (jnp.cos(xj),))[1], rtol=1e-12)
    np.testing.assert_allclose(eagle_fx.hessian(smooth_loss)(x), jax.hessian(jax_smooth_loss)(xj), rtol=1e-10,
                               atol=1e-12)
    with pytest.raises(TypeError, match="the rule takes 1 parameters; it takes the kernel's 1 \\(x\\), then a tangent"):
        @softplus.defjvp
        def short(x: Scalar):
            return x


def test_a_kernel_level_rule_called_inside_another_kernel_is_refused_naming_both():
    @hawk.custom_jvp
    @hawk.kernel
    def passthrough(x: Scalar) -> Scalar:
        return x * 1.0

    @passthrough.defjvp
    def passthrough_jvp(x: Scalar, t: Scalar):
        return x * 1.0, 0.5 * t

    @hawk.kernel
    def outer(x: Scalar) -> Scalar:
        return passthrough(x) * 2.0
    with pytest.raises(TypeError, match=r"outer:.*custom_jvp\(passthrough\): called inside another kernel's body"):
        outer(np.linspace(0.0, 1.0, 3))
