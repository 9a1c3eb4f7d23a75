"""eagle_fx.fixed_point: a per-sample fixed point differentiated at the point.

Oracles: closed forms (sqrt by Newton, a linear contraction), central finite differences, the
unrolled gradient (eagle_fx.grad through the same iteration run by eagle_fx.simulate, which
stores its turns), and jax.lax.custom_root on the same problem written in JAX (float64).
"""
from __future__ import annotations

import numpy as np
import pytest

import eagle_fx as eagle
import hawk_fx as hawk
import hawk_fx.math as hm
from eagle_fx import fixed_point, ir
from eagle_fx.backends.select import use_backend
from hawk_fx import Mutable, Param, Scalar, Terminated, Vector


@pytest.fixture(autouse=True, scope="module")
def _x64():
    import jax
    jax.config.update("jax_enable_x64", True)


@hawk.kernel
def newton(x: Scalar, a: Scalar):
    """A Newton step for x^2 = a: its fixed point is sqrt(a), and J = 0 there."""
    return 0.5 * (x + a / x)


@hawk.kernel
def newton_turn(x: Mutable[Scalar], done: Terminated, a: Scalar, tol: Param):
    """The same iteration as a simulate step, stopping on the same test."""
    y = 0.5 * (x + a / x)
    done = hm.abs(y - x) <= tol
    x = y


@hawk.kernel
def rotate(x: Vector[2], th: Vector[2], w: Param):
    """A contraction of the plane for |w| < ~0.8: x <- tanh(W x + th)."""
    return hm.tanh(hm.vec(w * x[1] + th[0], -w * x[0] + 0.5 * w * x[1] + th[1]))


@hawk.kernel
def rotate_turn(x: Mutable[Vector[2]], done: Terminated, th: Vector[2], w: Param, tol: Param):
    y = hm.tanh(hm.vec(w * x[1] + th[0], -w * x[0] + 0.5 * w * x[1] + th[1]))
    done = hm.norm(y - x) <= tol
    x = y


@hawk.kernel
def total(x: Scalar) -> Scalar:
    return hawk.sum(x)


@hawk.kernel
def weighted(x: Scalar, c: Scalar) -> Scalar:
    return hawk.sum(c * x)


@hawk.kernel
def plane_loss(x: Vector[2]) -> Scalar:
    return hawk.sum(x[0] * x[0] + 3.0 * x[1])


TOL = 1e-13


@eagle.Graph.builder
def sqrt_sum(x0, a, c):
    g = eagle.Graph()
    g.result = weighted(fixed_point(newton, x0, a, tol=TOL), c)
    return g


@eagle.Graph.builder
def sqrt_sum_unrolled(x0, a, c):
    g = eagle.Graph()
    r = eagle.simulate(lambda s, done: newton_turn(s, done, a, TOL), x0, max_steps=100)
    g.result = weighted(r.state, c)
    return g


@eagle.Graph.builder
def plane(x0, th, w):
    g = eagle.Graph()
    g.result = plane_loss(fixed_point(rotate, x0, th, w, tol=TOL, max_steps=300))
    return g


@eagle.Graph.builder
def plane_unrolled(x0, th, w):
    g = eagle.Graph()
    r = eagle.simulate(lambda s, done: rotate_turn(s, done, th, w, TOL), x0, max_steps=300)
    g.result = plane_loss(r.state)
    return g


def _jax_plane():
    """The same problem with jax.lax.custom_root per sample (a fixed-point solve, and the
    tangent system solved with the dense Jacobian of the residual)."""
    import jax
    import jax.numpy as jnp

    def step(x, th, w):
        return jnp.tanh(jnp.stack([w * x[1] + th[0], -w * x[0] + 0.5 * w * x[1] + th[1]]))

    def one(x0, th, w):
        def residual(x):
            return step(x, th, w) - x

        def solve(_, x):
            def body(c):
                x, _, k = c
                y = step(x, th, w)
                return y, jnp.linalg.norm(y - x), k + 1
            return jax.lax.while_loop(lambda c: (c[1] > TOL) & (c[2] < 300), body, (x, jnp.inf, 0))[0]

        def tangent_solve(g, y):
            return jnp.linalg.solve(jax.jacobian(g)(y), y)
        return jax.lax.custom_root(residual, x0, solve, tangent_solve)

    def loss(x0, th, w):
        x = jax.vmap(one, in_axes=(1, 1, None), out_axes=1)(x0, th, w)
        return jnp.sum(x[0] * x[0] + 3.0 * x[1])
    return jax.jit(loss), jax.jit(jax.grad(loss, argnums=(1, 2)))


@pytest.fixture(scope="module")
def plane_case():
    rng = np.random.default_rng(3)
    n = 6
    th, w, x0 = rng.normal(size=(2, n)), np.array([0.6]), np.zeros((2, n))
    loss, grad = _jax_plane()
    return x0, th, w, float(loss(x0, th, 0.6)), [np.asarray(g) for g in grad(x0, th, 0.6)]


def _prims(prog):
    for e in prog.eqns:
        yield e.prim
        for q in prog_subs(e):
            yield from _prims(q)


def prog_subs(e):
    for v in e.params.values():
        for q in v if isinstance(v, (tuple, list)) else (v,):
            if isinstance(q, hawk.Program):
                yield q


# ---------------------------------------------------------------------------------------------


def test_sqrt_by_newton_value_gradient_and_tangent_against_the_closed_form():
    a = np.array([2.0, 3.0, 9.0, 0.25, 100.0])
    x0, c = np.ones(5), np.array([1.0, -2.0, 0.5, 3.0, 1.0])
    x = fixed_point(newton, x0, a, tol=TOL)               # outside a builder: runs once
    np.testing.assert_allclose(x, np.sqrt(a), rtol=1e-15)
    np.testing.assert_array_equal(x0, 1.0)                # the caller's x0 is not written
    ga, gc = eagle.grad(sqrt_sum, argnums=(1, 2))(x0, a, c)
    np.testing.assert_allclose(ga, c * 0.5 / np.sqrt(a), rtol=1e-13)
    np.testing.assert_allclose(gc, np.sqrt(a), rtol=1e-15)
    gx0 = eagle.grad(sqrt_sum, argnums=0)(x0, a, c)
    np.testing.assert_array_equal(gx0, 0.0)               # the point does not depend on the start
    da = np.linspace(-1.0, 1.0, 5)
    _, t = eagle.jvp(sqrt_sum, (x0, a, c), (np.ones(5), da, np.zeros(5)))
    np.testing.assert_allclose(t, [np.sum(c * 0.5 / np.sqrt(a) * da)], rtol=1e-13)


def test_hessian_of_sqrt_is_forward_over_the_rules():
    a, x0, c = np.array([2.0, 3.0, 9.0]), np.ones(3), np.array([1.0, -2.0, 0.5])
    hess = eagle.hessian(sqrt_sum, argnums=1)(x0, a, c)
    np.testing.assert_allclose(hess, np.diag(-0.25 * c * a ** -1.5), rtol=1e-10, atol=1e-15)


def test_sqrt_against_the_unrolled_gradient_and_finite_differences():
    a = np.array([2.0, 3.0, 9.0, 0.25])
    x0, c = np.full(4, 1.5), np.array([1.0, -2.0, 0.5, 3.0])
    g_imp = eagle.grad(sqrt_sum, argnums=1)(x0, a, c)
    g_unr = eagle.grad(sqrt_sum_unrolled, argnums=1)(x0, a, c)
    np.testing.assert_allclose(g_imp, g_unr, rtol=1e-12)
    h = 1e-6
    fd = [(sqrt_sum(x0, a + h * e, c)()[0] - sqrt_sum(x0, a - h * e, c)()[0]) / (2 * h) for e in np.eye(4)]
    np.testing.assert_allclose(g_imp, fd, rtol=1e-8)


def test_a_vector_contraction_against_jax_custom_root_the_unrolled_gradient_and_fd(plane_case):
    x0, th, w, j_loss, (j_th, j_w) = plane_case
    np.testing.assert_allclose(plane(x0, th, w)(), [j_loss], rtol=1e-12)
    g_th, g_w = eagle.grad(plane, argnums=(1, 2))(x0, th, w)
    np.testing.assert_allclose(g_th, j_th, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(g_w, [j_w], rtol=1e-10)
    u_th, u_w = eagle.grad(plane_unrolled, argnums=(1, 2))(x0, th, w)
    np.testing.assert_allclose(g_th, u_th, rtol=1e-9, atol=1e-11)         # to the solver's tolerance
    np.testing.assert_allclose(g_w, u_w, rtol=1e-9)
    h = 1e-6
    f = lambda w_: plane(x0, th, np.array([w_]))()[0]                     # noqa: E731
    np.testing.assert_allclose(g_w, [(f(0.6 + h) - f(0.6 - h)) / (2 * h)], rtol=1e-7)
    # forward mode: the tangent along (th, w) is the gradient's projection
    d_th, d_w = np.cos(th), np.array([0.7])
    _, t = eagle.jvp(plane, (x0, th, w), (np.zeros_like(x0), d_th, d_w))
    np.testing.assert_allclose(t, [np.sum(j_th * d_th) + j_w * 0.7], rtol=1e-10)


@pytest.mark.parametrize("backend", ["jax", "fake-cuda"])
def test_other_backends(backend, plane_case):
    x0, th, w, j_loss, (j_th, j_w) = plane_case
    with use_backend(backend):
        g_th, g_w = eagle.grad(plane, argnums=(1, 2))(x0, th, w)
        _, t = eagle.jvp(plane, (x0, th, w), (np.zeros_like(x0), np.ones_like(th), np.zeros(1)))
    np.testing.assert_allclose(g_th, j_th, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(g_w, [j_w], rtol=1e-10)
    np.testing.assert_allclose(t, [j_th.sum()], rtol=1e-10)


def test_vmap_of_the_gradient_and_of_the_value():
    A = np.array([[2.0, 3.0, 9.0], [4.0, 5.0, 0.25]])
    x0, c = np.ones(3), np.array([1.0, 2.0, -1.0])
    g = eagle.vmap(eagle.grad(sqrt_sum, argnums=1), in_axes=(None, 0, None))(x0, A, c)
    np.testing.assert_allclose(g, c * 0.5 / np.sqrt(A), rtol=1e-13)
    v = eagle.vmap(sqrt_sum, in_axes=(None, 0, None))(x0, A, c)()
    np.testing.assert_allclose(v[:, 0], (c * np.sqrt(A)).sum(axis=1), rtol=1e-14)


def test_the_gradient_keeps_no_turns():
    """The implicit gradient's Program holds no stack of turns; the unrolled one does."""
    a, x0, c = np.array([2.0, 3.0]), np.ones(2), np.ones(2)
    imp = eagle.make_program(eagle.grad(sqrt_sum, argnums=1))(x0, a, c)
    unr = eagle.make_program(eagle.grad(sqrt_sum_unrolled, argnums=1))(x0, a, c)
    stacks = {ir.stack_push_p, ir.stack_read_p, ir.revolve_p}
    assert not stacks & set(_prims(imp))
    assert ir.while_p in set(_prims(imp))
    assert stacks & set(_prims(unr))


@hawk.kernel
def affine(x: Scalar, m: Scalar, c: Scalar):
    """x <- m x + c: the fixed point c / (1 - m); J = m."""
    return m * x + c


@hawk.kernel
def repel(x: Scalar, a: Scalar):
    """x <- 2 x - a: the fixed point a, repelling (J = 2)."""
    return 2.0 * x - a


def test_unconverged_samples_get_nan_unless_unread():
    @eagle.Graph.builder
    def f(x0, m, a, c):
        g = eagle.Graph()
        g.result = weighted(fixed_point(affine, x0, m, a, tol=1e-12, max_steps=20), c)
        return g
    # sample 0 converges in a turn (m = 0); the others (m = 0.9) are still moving after 20
    m, a = np.array([0.0, 0.9, 0.9, 0.9]), np.array([3.0, 1.0, 1.0, 2.0])
    x0, c = np.zeros(4), np.array([1.0, 1.0, 0.0, 2.0])
    g = eagle.grad(f, argnums=2)(x0, m, a, c)
    assert g[0] == 1.0
    assert np.isnan(g[1]) and np.isnan(g[3])
    assert g[2] == 0.0                                    # not read by the loss
    _, t = eagle.jvp(f, (x0, m, a, c), (np.zeros(4), np.zeros(4), np.array([1.0, 0.0, 0.0, 0.0]), np.zeros(4)))
    assert t[0] == 1.0                                    # no tangent enters the unconverged samples
    _, t = eagle.jvp(f, (x0, m, a, c), (np.zeros(4), np.zeros(4), np.ones(4), np.zeros(4)))
    assert np.isnan(t[0])                                 # the sum reads the NaN tangents of samples 1, 3
    # a converged loop whose adjoint series does not settle in max_steps is NaN too
    m = np.array([0.0, 0.9, 0.9, 0.9])
    g = eagle.grad(f, argnums=2)(a / (1 - m), m, a, c)    # started at the point: converged at once
    assert g[0] == 1.0 and np.isnan(g[1]) and g[2] == 0.0

    @eagle.Graph.builder
    def r(x0, a):
        g = eagle.Graph()
        g.result = total(fixed_point(repel, x0, a, max_steps=50))
        return g
    a = np.array([1.0, 2.0])
    assert np.isnan(eagle.grad(r, argnums=1)(a.copy(), a)).all()      # converged (x0 = a), J = 2: no solution


def test_random_sweep_of_linear_contractions():
    """x <- m x + c per sample, |m| < 0.95: x* = c / (1 - m), and its derivatives in closed form."""
    @eagle.Graph.builder
    def f(x0, m, c, w):
        g = eagle.Graph()
        g.result = weighted(fixed_point(affine, x0, m, c, tol=1e-14, max_steps=2000), w)
        return g
    rng = np.random.default_rng(17)
    for _ in range(3):
        n = int(rng.integers(1, 9))
        m, c, w, x0 = rng.uniform(-0.95, 0.95, n), rng.normal(size=n), rng.normal(size=n), rng.normal(size=n)
        np.testing.assert_allclose(f(x0, m, c, w)(), [np.sum(w * c / (1 - m))], rtol=1e-11)
        gm, gc = eagle.grad(f, argnums=(1, 2))(x0, m, c, w)
        np.testing.assert_allclose(gm, w * c / (1 - m) ** 2, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(gc, w / (1 - m), rtol=1e-9)


def _msg(exc, fn):
    with pytest.raises(exc) as info:
        fn()
    return str(info.value)


def test_bad_input():
    x0, a = np.ones(3), np.array([1.0, 2.0, 3.0])
    assert "step is int" in _msg(TypeError, lambda: fixed_point(3, x0, a))
    assert "tol=-1.0" in _msg(ValueError, lambda: fixed_point(newton, x0, a, tol=-1.0))
    assert "max_steps=0" in _msg(ValueError, lambda: fixed_point(newton, x0, a, max_steps=0))

    @hawk.kernel
    def widen(x: Scalar, a: Scalar):
        return hm.vec(x, a)
    m = _msg(TypeError, lambda: fixed_point(widen, x0, a))
    assert "eagle_fx.fixed_point(widen)" in m and "shape (2, 3)" in m and "x0's shape (3,)" in m
    m = _msg(TypeError, lambda: fixed_point(newton, np.arange(3), a))
    assert "dtype int64" in m and "floating" in m

    @eagle.Graph.builder
    def closes_over(x0, a):
        g = eagle.Graph()
        g.result = fixed_point(lambda x: newton(x, a), x0)
        return g
    m = _msg(TypeError, lambda: closes_over(x0, a))
    assert "reads 1 array(s) it is not given" in m and "as a parameter" in m
    assert "parameter 0 is dict" in _msg(TypeError, lambda: fixed_point(newton, x0, {"a": a}))


def test_a_refusal_in_a_builder_names_its_line():
    @eagle.Graph.builder
    def bad(x0, a):
        g = eagle.Graph()
        g.result = fixed_point(newton, x0, {"a": a})
        return g
    m = _msg(TypeError, lambda: bad(np.ones(2), np.ones(2)))
    assert "eagle_fx.fixed_point(newton): parameter 0 is dict" in m and "[called at bad:" in m


def test_to_jax_forward_mode_and_a_jax_function_of_the_gradient():
    """Through eagle_fx.to_jax: jax.jvp works, jax.grad is refused with what to do (the tangent
    series is not a map JAX can transpose), and to_jax(eagle_fx.grad(f)) is the gradient."""
    import jax
    import jax.numpy as jnp
    from eagle_fx.transforms.program import TransformError
    a, x0, c = np.array([2.0, 3.0, 9.0]), np.ones(3), np.array([1.0, -1.0, 2.0])
    f = eagle.to_jax(sqrt_sum)
    _, t = jax.jvp(lambda a_: f(x0, a_, c), (jnp.asarray(a),), (jnp.ones(3),))
    np.testing.assert_allclose(np.asarray(t), [np.sum(c * 0.5 / np.sqrt(a))], rtol=1e-13)
    with pytest.raises(TransformError, match=r"fixed_point\(newton\) at sqrt_sum:.*eagle_fx.to_jax\(eagle_fx.grad"):
        jax.grad(lambda a_: f(x0, a_, c)[0])(jnp.asarray(a))
    g = jax.jit(eagle.to_jax(eagle.grad(sqrt_sum, argnums=1)))(x0, jnp.asarray(a), c)
    np.testing.assert_allclose(np.asarray(g), c * 0.5 / np.sqrt(a), rtol=1e-13)


def test_jacrev_and_jacfwd_of_the_roots():
    @eagle.Graph.builder
    def roots(x0, a):
        g = eagle.Graph()
        g.result = fixed_point(newton, x0, a, tol=TOL)
        return g
    a, x0 = np.array([2.0, 3.0, 9.0]), np.ones(3)
    want = np.diag(0.5 / np.sqrt(a))
    np.testing.assert_allclose(eagle.jacrev(roots, argnums=1)(x0, a), want, rtol=1e-13, atol=1e-300)
    np.testing.assert_allclose(eagle.jacfwd(roots, argnums=1)(x0, a), want, rtol=1e-13, atol=1e-300)


@hawk.kernel
def halve(x: Scalar):
    return 0.5 * x


def test_a_step_made_of_kernels_and_staged_numpy():
    """step(x, a) = halve(x + a / x): two kernels and staged arithmetic, differentiated as one."""
    @eagle.Graph.builder
    def f(x0, a, c):
        g = eagle.Graph()
        g.result = weighted(fixed_point(lambda x, a_: halve(x + a_ / x), x0, a, tol=TOL), c)
        return g
    a, x0, c = np.array([2.0, 5.0]), np.ones(2), np.array([1.0, 3.0])
    np.testing.assert_allclose(eagle.grad(f, argnums=1)(x0, a, c), c * 0.5 / np.sqrt(a), rtol=1e-13)
