"""Composed transformations, checked against JAX (the same computation written with jax.numpy,
lax.cond and lax.fori_loop, in float64) and against central finite differences.

What is checked:
  * vmap(grad(f)): per-instance gradients with a shared condition and trip count, with a
    per-instance condition cell (B, 1), and with per-instance trip counts (B, 1), against
    jax.vmap(jax.grad(...)) or a Python loop of jax.grad over the instances;
  * jvp(grad(f)): the gradient and a Hessian-vector product, through a cond and a counted loop,
    against jax.jvp(jax.grad(...));
  * grad(grad(f)) on one sample: the second derivative, against jax.grad(jax.grad(...)) and a
    central finite difference of JAX's first derivative;
  * vmap(vmap(f)) of a builder: a Graph whose result has shape (B2, B1, n), against a double loop
    of unbatched runs and plain NumPy, with both levels batching the same or different arguments;
  * vmap(lambda x, t: jvp(f, ...)): batched primal and tangent outputs, against jax.vmap(jax.jvp);
  * jacfwd / jacrev: shape result.shape + arg.shape (JAX's convention), for a diagonal, a dense
    (sample reduction) and a cond Jacobian, and a one-value result;
  * make_program of composed transformations prints `cond` and `while`; grad(f).graph(...) is a
    Graph that replays to the same numbers;
  * derived graphs are functional: vjp/grad of a builder that writes its arguments in place
    leave them untouched and differentiate the function of their values on entry;
  * refusals: reverse mode over a reverse pass through a loop, grad of a vmapped function,
    mismatched batch sizes, in_axes of the wrong length, a tangent of the wrong shape or
    dtype, grad of a result that is not one value, vmap of a graph with a host node; the caller's
    arrays are left unchanged by a refused call.
"""
from __future__ import annotations

import numpy as np
import pytest

import eagle_fx as ef
import hawk_fx as hawk
from hawk_fx import Scalar
from hawk_fx import math as hm
from tour_kernels import add, affine, cell, dbl, grow, loss, total, wobble

pytestmark = pytest.mark.usefixtures("backend_heavy")     # on numpy; on jax too with -m slow (compiles)

jax = pytest.importorskip("jax")
jax.config.update("jax_enable_x64", True)
jnp, lax = jax.numpy, jax.lax

RTOL = 1e-9          # vs JAX, both float64
ATOL = 1e-11
FD_RTOL = 1e-6       # vs central finite differences
FD_ATOL = 1e-7

B, N = 4, 6
B1, B2 = 3, 2
rng = np.random.default_rng(20240607)


# ---------------------------------------------------------------------------------------------
# kernels and builders

@hawk.kernel
def plain_sum(x: Scalar) -> Scalar:
    return hawk.sum(x)


@hawk.kernel
def sinexp(x: Scalar) -> Scalar:
    return hm.sin(x) * hm.exp(x)


@hawk.kernel
def mul(a: Scalar, b: Scalar) -> Scalar:
    return a * b


@hawk.kernel
def centre(x: Scalar) -> Scalar:
    return x - hawk.mean(x)          # a sample reduction: couples the samples of one instance


@ef.Graph.builder
def chain_a(x):                      # sum(x sin(x) exp(x))
    g = ef.Graph()
    g.result = plain_sum(mul(sinexp(x), x))
    return g


@ef.Graph.builder
def chain_b(x):                      # sum((1.1 w + 0.1 tanh w)^2), w = x sin(x)
    g = ef.Graph()
    g.result = total(grow(wobble(x), 1.1))
    return g


@ef.Graph.builder
def shift(x, c):                     # a cond on a cell, a reduction on one arm
    g = ef.Graph()
    if c:
        x = centre(x)
    else:
        x = dbl(x)
    g.result = wobble(x)
    return g


@ef.Graph.builder
def aff(x, a):                       # a Param argument, then a reduction
    g = ef.Graph()
    g.result = wobble(centre(affine(x, a, 0.5)))
    return g


@ef.Graph.builder
def wob(x):                          # elementwise: a diagonal Jacobian
    g = ef.Graph()
    g.result = wobble(x)
    return g


@ef.Graph.builder
def cwob(x):                         # x - mean(x) first: a dense Jacobian
    g = ef.Graph()
    g.result = wobble(centre(x))
    return g


# ---------------------------------------------------------------------------------------------
# the same computations in JAX / NumPy

def jwobble(x):
    return jnp.sin(x) * x


def jgrow(x):
    return 1.1 * x + 0.1 * jnp.tanh(x)


def jloss(x, flag, n):
    x = lax.cond(flag != 0, jwobble, lambda v: v, x)
    x = lax.fori_loop(0, n, lambda i, v: jgrow(v), x)
    return jnp.sum(x * x)


jloss_grad = jax.jit(jax.grad(jloss), static_argnums=2)     # flag traced, trip count static
jloss_hvp = jax.jit(lambda x, v, flag, n: jax.jvp(jax.grad(lambda u: jloss(u, flag, n)), (x,), (v,)),
                    static_argnums=3)
jloss_hessian = jax.jit(jax.jacfwd(jax.grad(jloss)), static_argnums=2)


def jchain_a(x):
    return jnp.sum(x * jnp.sin(x) * jnp.exp(x))


def jchain_b(x):
    return jnp.sum(jgrow(jwobble(x)) ** 2)


def jshift(x, c):
    return jwobble(x - jnp.mean(x) if c else 2.0 * x)


def jcwob(x):
    return jwobble(x - jnp.mean(x))


def np_aff(x, a):
    v = a * x + 0.5
    v = v - v.mean()
    return np.sin(v) * v


def np_shift(x, c):
    v = x - x.mean() if c else 2.0 * x
    return np.sin(v) * v


def close(got, want, rtol=RTOL, atol=ATOL):
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=rtol, atol=atol)


# ---------------------------------------------------------------------------------------------
# vmap(grad(f))

def test_vmap_grad_shared_condition_and_trip_count():
    xs = rng.normal(size=(B, N))
    keep = xs.copy()
    got = ef.vmap(ef.grad(loss), in_axes=(0, None, None))(xs, cell(1), cell(3))
    assert isinstance(got, np.ndarray) and got.shape == (B, N) and got.dtype == np.float64
    want = jax.vmap(jax.grad(jloss), in_axes=(0, None, None))(xs, 1, 3)
    close(got, want)
    np.testing.assert_array_equal(xs, keep)


@pytest.mark.parametrize("flag,n", [(0, 2), (1, 0)])
def test_vmap_grad_other_arms_and_zero_turns(flag, n):
    xs = rng.normal(size=(B, N))
    got = ef.vmap(ef.grad(loss), in_axes=(0, None, None))(xs, cell(flag), cell(n))
    want = np.stack([jloss_grad(xs[b], flag, n) for b in range(B)])
    close(got, want)


def test_vmap_grad_per_instance_condition():
    xs = rng.normal(size=(B, N))
    flags = np.array([[1], [0], [0], [1]], np.uint32)
    keep_x, keep_f = xs.copy(), flags.copy()
    got = ef.vmap(ef.grad(loss), in_axes=(0, 0, None))(xs, flags, cell(2))
    assert np.shape(got) == (B, N)
    want = np.stack([jloss_grad(xs[b], int(flags[b, 0]), 2) for b in range(B)])
    close(got, want)
    np.testing.assert_array_equal(xs, keep_x)
    np.testing.assert_array_equal(flags, keep_f)


def test_vmap_grad_per_instance_trip_counts():
    xs = rng.normal(size=(B, N))
    trips = np.array([[0], [3], [1], [2]], np.uint32)
    got = ef.vmap(ef.grad(loss), in_axes=(0, None, 0))(xs, cell(1), trips)
    assert np.shape(got) == (B, N)
    want = np.stack([jloss_grad(xs[b], 1, int(trips[b, 0])) for b in range(B)])
    close(got, want)
    np.testing.assert_array_equal(trips.ravel(), [0, 3, 1, 2])


# ---------------------------------------------------------------------------------------------
# jvp(grad(f)): Hessian-vector products

@pytest.mark.parametrize("flag,n", [(1, 3), (0, 2), (1, 0)])
def test_jvp_of_grad_is_a_hessian_vector_product(flag, n):
    x = np.linspace(-1.0, 1.2, N)
    v = np.cos(np.arange(N) + 0.5)
    keep_x, keep_v = x.copy(), v.copy()
    gx, hv = ef.jvp(ef.grad(loss), (x, cell(flag), cell(n)), (v, None, None))
    jg, jhv = jloss_hvp(x, v, flag, n)
    assert np.shape(gx) == (N,) and np.shape(hv) == (N,)
    close(gx, jg)
    close(hv, jhv)
    np.testing.assert_array_equal(x, keep_x)
    np.testing.assert_array_equal(v, keep_v)


def test_jvp_of_grad_matches_the_dense_hessian():
    x = rng.normal(size=N)
    H = np.asarray(jloss_hessian(x, 1, 2))
    for k in (0, N - 1):
        e = np.zeros(N)
        e[k] = 1.0
        _, hv = ef.jvp(ef.grad(loss), (x, cell(1), cell(2)), (e, None, None))
        close(hv, H[:, k])


# ---------------------------------------------------------------------------------------------
# grad(grad(f)) on one sample

@pytest.mark.parametrize("builder,jf", [(chain_a, jchain_a), (chain_b, jchain_b)], ids=["sinexp_mul", "wobble_grow"])
@pytest.mark.parametrize("x0", [0.3, -0.7])
def test_second_derivative(builder, jf, x0):
    x = np.array([x0])
    keep = x.copy()
    got = ef.grad(ef.grad(builder))(x)
    assert np.shape(got) == (1,) and np.asarray(got).dtype == np.float64
    want = jax.grad(jax.grad(lambda s: jf(jnp.reshape(s, (1,)))))(x0)
    close(got, [want])
    d1 = jax.grad(lambda s: jf(jnp.reshape(s, (1,))))
    h = 1e-5
    fd = (d1(x0 + h) - d1(x0 - h)) / (2 * h)
    close(got, [fd], rtol=FD_RTOL, atol=FD_ATOL)
    np.testing.assert_array_equal(x, keep)


def test_first_derivative_of_the_chain_matches_its_formula():
    x0 = 0.45
    got = ef.grad(chain_a)(np.array([x0]))
    want = np.exp(x0) * (np.sin(x0) + x0 * np.cos(x0) + x0 * np.sin(x0))
    close(got, [want])


# ---------------------------------------------------------------------------------------------
# vmap(vmap(f)) of a builder

@pytest.mark.parametrize("c", [0, 1])
def test_nested_vmap_shared_cell(c):
    xss = rng.normal(size=(B2, B1, N))
    keep = xss.copy()
    g = ef.vmap(ef.vmap(shift, in_axes=(0, None)), in_axes=(0, None))(xss, cell(c))
    assert isinstance(g, ef.Graph)
    out = g()
    assert np.shape(out) == (B2, B1, N)
    loop = np.stack([np.stack([shift(xss[i, j].copy(), cell(c))() for j in range(B1)]) for i in range(B2)])
    close(out, loop)
    want = np.stack([np.stack([np_shift(xss[i, j], c) for j in range(B1)]) for i in range(B2)])
    close(out, want)
    np.testing.assert_array_equal(xss, keep)


def test_nested_vmap_per_instance_cells_at_both_levels():
    xss = rng.normal(size=(B2, B1, N))
    cs = np.array([[[1], [0], [1]], [[0], [0], [1]]], np.uint32)
    out = ef.vmap(ef.vmap(shift))(xss, cs)()
    assert np.shape(out) == (B2, B1, N)
    want = np.stack([np.stack([np_shift(xss[i, j], cs[i, j, 0]) for j in range(B1)]) for i in range(B2)])
    close(out, want)


def test_nested_vmap_outer_batches_param_inner_batches_plane():
    xs = rng.normal(size=(B1, N))
    a = np.array([0.5, -1.5])                                    # (B2,) Params
    g = ef.vmap(ef.vmap(aff, in_axes=(0, None)), in_axes=(None, 0))(xs, a)
    out = g()
    assert np.shape(out) == (B2, B1, N)
    loop = np.stack([np.stack([aff(xs[j].copy(), a[i])() for j in range(B1)]) for i in range(B2)])
    close(out, loop)
    close(out, np.stack([np.stack([np_aff(xs[j], a[i]) for j in range(B1)]) for i in range(B2)]))


def test_nested_vmap_outer_batches_plane_inner_batches_param():
    xss = rng.normal(size=(B2, N))
    a = np.array([0.5, 2.0, -1.0])                               # (B1,) Params
    out = ef.vmap(ef.vmap(aff, in_axes=(None, 0)), in_axes=(0, None))(xss, a)()
    assert np.shape(out) == (B2, B1, N)
    close(out, np.stack([np.stack([np_aff(xss[i], a[j]) for j in range(B1)]) for i in range(B2)]))


# ---------------------------------------------------------------------------------------------
# vmap of a jvp

@pytest.mark.parametrize("c", [0, 1])
def test_vmap_of_jvp(c):
    xs = rng.normal(size=(B, N))
    ts = rng.normal(size=(B, N))
    keep_x, keep_t = xs.copy(), ts.copy()
    cc = cell(c)
    ys, tys = ef.vmap(lambda x, t: ef.jvp(shift, (x, cc), (t, None)), in_axes=(0, 0))(xs, ts)
    assert np.shape(ys) == (B, N) and np.shape(tys) == (B, N)
    jys, jtys = jax.vmap(lambda x, t: jax.jvp(lambda u: jshift(u, c), (x,), (t,)))(xs, ts)
    close(ys, jys)
    close(tys, jtys)
    for b in range(B):
        y1, ty1 = ef.jvp(shift, (xs[b].copy(), cell(c)), (ts[b].copy(), None))
        close(ys[b], y1)
        close(tys[b], ty1)
    np.testing.assert_array_equal(xs, keep_x)
    np.testing.assert_array_equal(ts, keep_t)


# ---------------------------------------------------------------------------------------------
# jacfwd / jacrev

JACS = ["jacfwd", "jacrev"]


@pytest.mark.parametrize("which", JACS)
def test_jacobian_of_an_elementwise_map_is_diagonal(which):
    x = np.linspace(-1.0, 1.3, N)
    J = getattr(ef, which)(wob, argnums=0)(x)
    assert np.shape(J) == (N, N)
    close(J, getattr(jax, which)(jwobble)(x))
    close(J, np.diag(np.sin(x) + x * np.cos(x)))


@pytest.mark.parametrize("which", JACS)
def test_jacobian_with_a_sample_reduction_is_dense(which):
    x = rng.normal(size=N)
    J = getattr(ef, which)(cwob, argnums=0)(x)
    assert np.shape(J) == (N, N)
    want = np.asarray(getattr(jax, which)(jcwob)(x))
    close(J, want)
    assert np.count_nonzero(np.abs(want) > 1e-12) > N     # really dense, and not symmetric
    assert not np.allclose(want, want.T)


@pytest.mark.parametrize("which", JACS)
@pytest.mark.parametrize("c", [0, 1])
def test_jacobian_through_a_cond(which, c):
    x = rng.normal(size=N)
    J = getattr(ef, which)(shift, argnums=0)(x, cell(c))
    assert np.shape(J) == (N, N)
    close(J, getattr(jax, which)(lambda u: jshift(u, c))(x))


@pytest.mark.parametrize("which", JACS)
def test_jacobian_of_a_one_value_result(which):
    x = rng.normal(size=N)
    J = getattr(ef, which)(loss, argnums=0)(x, cell(1), cell(2))
    assert np.shape(J) == (1, N)                                 # result (1,) + argument (N,)
    close(J, np.asarray(jax.grad(jloss)(x, 1, 2))[None, :])


# ---------------------------------------------------------------------------------------------
# programs and graphs of composed transformations

def test_make_program_of_grad_shows_cond_and_while():
    x = np.linspace(-1.0, 1.2, N)
    text = str(ef.make_program(ef.grad(loss))(x, cell(1), cell(3)))
    assert text.startswith("{ lambda")
    assert "cond" in text and "while" in text


def test_make_program_of_vmap_grad_prints_a_batched_program():
    xs = rng.normal(size=(B, N))
    text = str(ef.make_program(ef.vmap(ef.grad(loss), in_axes=(0, None, None)))(xs, cell(1), cell(3)))
    assert text.startswith("{ lambda")
    assert "cond" in text and "while" in text
    assert f"f64[{B},{N}]" in text


def test_grad_graph_replays_to_the_same_numbers():
    x = np.linspace(-1.0, 1.2, N)
    g = ef.grad(loss).graph(x, cell(1), cell(3))
    assert isinstance(g, ef.Graph)
    text = str(g.program)
    assert "cond" in text and "while" in text
    want = np.asarray(jax.grad(jloss)(x, 1, 3))
    first = np.array(g())
    second = np.array(g())
    close(first, want)
    np.testing.assert_array_equal(first, second)


def test_grad_graph_replay_follows_its_cells_and_more_turns_than_at_build(backend_heavy):
    x = np.linspace(-1.0, 1.2, N)
    c, n = cell(1), cell(2)
    g = ef.grad(loss).graph(x, c, n)
    close(g(), jloss_grad(x, 1, 2))
    c[0] = 0                                       # the other arm, read at the replay
    close(g(), jloss_grad(x, 0, 2))
    n[0] = 1                                       # fewer turns than when it was built
    close(g(), jloss_grad(x, 0, 1))
    n[0] = 4                                       # more turns than at build
    if backend_heavy == "numpy":                   # its stacks grow with the turns run
        close(g(), jloss_grad(x, 0, 4))
    else:                                          # static shapes: refused, not wrong
        with pytest.raises(RuntimeError, match="turns"):
            g()
    n[0] = 2
    close(g(), jloss_grad(x, 0, 2))


# ---------------------------------------------------------------------------------------------
# refusals

def test_refused_mismatched_batch_sizes():
    xs = rng.normal(size=(B, N))
    flags = np.ones((B + 1, 1), np.uint32)
    keep_x, keep_f = xs.copy(), flags.copy()
    with pytest.raises(ValueError, match="batch sizes"):
        ef.vmap(ef.grad(loss), in_axes=(0, 0, None))(xs, flags, cell(2))
    np.testing.assert_array_equal(xs, keep_x)
    np.testing.assert_array_equal(flags, keep_f)
    ts = rng.normal(size=(B + 1, N))
    with pytest.raises(ValueError, match="batch sizes"):
        ef.vmap(lambda x, t: ef.jvp(shift, (x, cell(1)), (t, None)), in_axes=(0, 0))(xs, ts)
    np.testing.assert_array_equal(xs, keep_x)


def test_refused_in_axes_of_the_wrong_length():
    xs = rng.normal(size=(B, N))
    keep = xs.copy()
    with pytest.raises(ValueError, match="in_axes"):
        ef.vmap(ef.grad(loss), in_axes=(0, None))(xs, cell(1), cell(3))
    with pytest.raises(ValueError, match="in_axes"):
        ef.vmap(ef.vmap(shift, in_axes=(0, None, None)), in_axes=(0, None))(xs[None], cell(1))
    np.testing.assert_array_equal(xs, keep)


def test_refused_tangent_of_the_wrong_shape_or_dtype():
    x = np.linspace(-1.0, 1.2, N)
    keep = x.copy()
    with pytest.raises(ValueError, match="tangent"):
        ef.jvp(ef.grad(loss), (x, cell(1), cell(3)), (np.ones(N + 1), None, None))
    with pytest.raises(ValueError, match="tangent"):
        ef.jvp(ef.grad(loss), (x, cell(1), cell(3)), (np.ones(N, np.float32), None, None))
    np.testing.assert_array_equal(x, keep)


def test_refused_grad_of_a_result_that_is_not_one_value():
    x = np.linspace(-1.0, 1.2, N)                  # grad(loss) has N values: grad of it is refused
    keep = x.copy()
    with pytest.raises(TypeError, match="grad needs one value"):
        ef.grad(ef.grad(loss))(x, cell(1), cell(3))
    np.testing.assert_array_equal(x, keep)
    xs = rng.normal(size=(B, N))
    keep_xs = xs.copy()
    with pytest.raises(TypeError, match="grad needs one value"):
        ef.vmap(ef.grad(wob))(xs)
    np.testing.assert_array_equal(xs, keep_xs)


def test_refused_vmap_of_a_graph_with_a_host_node():
    @ef.Graph.builder
    def hosted(x, y):
        g = ef.Graph()
        g.add_node(ef.opaque(lambda: None, reads={"x": x}, writes={"y": y}))
        g.result = total(add(x, y))
        return g

    xs = rng.normal(size=(B, N))
    y = np.zeros(N)
    keep_x, keep_y = xs.copy(), y.copy()
    with pytest.raises(ValueError, match="host"):
        ef.vmap(ef.grad(hosted), in_axes=(0, None))(xs, y)
    np.testing.assert_array_equal(xs, keep_x)
    np.testing.assert_array_equal(y, keep_y)
    xss = rng.normal(size=(B2, B1, N))
    yss = np.zeros((B2, B1, N))
    keep_xss = xss.copy()
    with pytest.raises(ValueError, match="host"):
        ef.vmap(ef.vmap(hosted))(xss, yss)
    np.testing.assert_array_equal(xss, keep_xss)
    np.testing.assert_array_equal(yss, 0.0)



# ---------------------------------------------------------------------------------------------
# functional semantics and the remaining refusals

@hawk.kernel
def shrink_until(x: hawk.Mutable[Scalar], lim: hawk.Param, flag: hawk.Mutable[hawk.UInt32]):
    x = 0.5 * x + 0.1 * hm.sin(x)
    flag = hm.uint32(hawk.sum(hm.abs(x) > lim))


@ef.Graph.builder
def shrink_loss(x, flag):
    g = ef.Graph()
    for _ in range(20):
        if not flag:
            break
        shrink_until(x, 0.3, flag)
    g.result = total(x)
    return g


def numpy_shrink_loss(x):
    x = x.copy()
    for _ in range(20):
        x = 0.5 * x + 0.1 * np.sin(x)
        if not np.any(np.abs(x) > 0.3):
            break
    return np.sum(x * x)


def test_vjp_and_grad_of_a_builder_writing_its_arguments_leave_them_untouched():
    # the builder writes x and flag in place (Mutable); derived graphs are functional, so the
    # pullback sees the arguments as they were and the caller's arrays are not written
    x = np.linspace(-2.0, 2.5, N)
    flag = cell(1)
    x0 = x.copy()
    eps = 1e-6
    fd = np.array([(numpy_shrink_loss(x0 + e) - numpy_shrink_loss(x0 - e)) / (2 * eps) for e in np.eye(N) * eps])
    y, pullback = ef.vjp(shrink_loss, x, flag)
    np.testing.assert_allclose(y, numpy_shrink_loss(x0), rtol=1e-12)
    np.testing.assert_allclose(pullback(np.ones(1))[0], fd, rtol=FD_RTOL, atol=FD_ATOL)
    np.testing.assert_allclose(pullback(np.ones(1))[0], fd, rtol=FD_RTOL, atol=FD_ATOL)   # again: same
    np.testing.assert_allclose(ef.grad(shrink_loss)(x, flag), fd, rtol=FD_RTOL, atol=FD_ATOL)
    np.testing.assert_array_equal(x, x0)
    assert flag[0] == 1


def test_reverse_mode_over_a_reverse_pass_through_a_loop_agrees_with_forward_over_reverse(backend_heavy):
    x, n = np.array([0.4]), cell(3)
    def jl(v):
        return jnp.sum(lax.fori_loop(0, 3, lambda i, u: 1.1 * u + 0.1 * jnp.tanh(u), v) ** 2)
    want = np.asarray(jax.hessian(jl)(x))[0]
    np.testing.assert_allclose(ef.grad(ef.grad(loss))(x, cell(0), n), want, rtol=RTOL)
    # forward over reverse takes it too: the second derivative, against JAX
    _, hv = ef.jvp(ef.grad(loss), (x, cell(0), n), (np.ones(1), None, None))
    np.testing.assert_allclose(hv, want, rtol=RTOL)


def test_grad_of_a_vmapped_function_is_refused_as_jax_refuses_it():
    xs = rng.random((B, N))                         # its result has B values, not one (as jax.grad says)
    with pytest.raises(TypeError, match="grad needs one value"):
        ef.grad(ef.vmap(loss, in_axes=(0, None, None)))(xs, cell(1), cell(2))


# ---------------------------------------------------------------------------------------------
# harder control flow: loops in loops with a cond and a Mutable, a switch, Vector planes,
# float32, an uncapped loop in forward mode; oracles are NumPy functions and central differences

@hawk.kernel
def scale_tanh(x: Scalar, a: hawk.Param) -> Scalar:
    return a * x + hm.tanh(x)


@hawk.kernel
def damp(s: Scalar, y: hawk.Mutable[Scalar]):
    y = y + hm.cos(s) * y


@ef.Graph.builder
def nested(x, y, a, n, c):
    g = ef.Graph()
    for i in range(n):
        if c:
            x = wobble(x)
        for j in range(n):
            x = scale_tanh(x, a)
            damp(x, y)
    g.result = total(y)
    return g


def numpy_nested(x, y, a, n, c):
    y = y.copy()
    for _ in range(n):
        if c:
            x = np.sin(x) * x
        for _ in range(n):
            x = a * x + np.tanh(x)
            y = y + np.cos(x) * y
    return np.sum(y * y)


@ef.Graph.builder
def switched(x, a, sel):
    g = ef.Graph()
    match sel:
        case 0:
            x = wobble(x)
        case 1:
            x = scale_tanh(x, a)
        case _:
            x = scale_tanh(wobble(x), a)
    g.result = total(x)
    return g


def numpy_switched(x, a, sel):
    if sel in (0, 2):
        x = np.sin(x) * x
    if sel in (1, 2):
        x = a * x + np.tanh(x)
    return np.sum(x * x)


def central(f, x, eps=1e-6):
    out = np.zeros(np.shape(x))
    for i in np.ndindex(out.shape):
        e = np.zeros(out.shape)
        e[i] = eps
        out[i] = (f(x + e) - f(x - e)) / (2 * eps)
    return out


@pytest.mark.parametrize("c", [0, 1])
def test_grad_and_jvp_through_loops_in_loops_with_a_cond_and_a_mutable(c):
    x, y, a = np.linspace(-0.3, 0.4, 5), np.linspace(0.2, 0.5, 5), np.array([0.6])
    y0 = y.copy()
    n, cc = cell(2), cell(c)
    gx, gy, ga = ef.grad(nested, argnums=(0, 1, 2))(x, y, a, n, cc)
    np.testing.assert_allclose(gx, central(lambda q: numpy_nested(q, y0, a, 2, c), x), rtol=FD_RTOL, atol=FD_ATOL)
    np.testing.assert_allclose(gy, central(lambda q: numpy_nested(x, q, a, 2, c), y0), rtol=FD_RTOL, atol=FD_ATOL)
    np.testing.assert_allclose(ga, central(lambda q: numpy_nested(x, y0, q, 2, c), a), rtol=FD_RTOL, atol=FD_ATOL)
    _, t = ef.jvp(nested, (x, y, a, n, cc), (np.ones(5), None, None, None, None))
    np.testing.assert_allclose(t, gx.sum(), rtol=1e-9)             # the directional derivative along ones
    np.testing.assert_array_equal(y, y0)                            # the Mutable y is not written


@pytest.mark.parametrize("sel", [0, 1, 2])
def test_grad_and_hvp_through_a_switch_with_a_param(sel):
    x, a, c = np.linspace(-1.0, 1.3, 6), np.array([1.3]), cell(sel)
    gx, ga = ef.grad(switched, argnums=(0, 1))(x, a, c)
    np.testing.assert_allclose(gx, central(lambda q: numpy_switched(q, a, sel), x), rtol=FD_RTOL, atol=FD_ATOL)
    np.testing.assert_allclose(ga, central(lambda q: numpy_switched(x, q, sel), a), rtol=FD_RTOL, atol=FD_ATOL)
    v = np.cos(np.arange(6.0))
    _, hv = ef.jvp(ef.grad(switched), (x, a, c), (v, None, None))
    want = central(lambda s: central(lambda q: numpy_switched(q, a, sel), x + s * v, 1e-5) @ v, np.zeros(1), 1e-4)
    np.testing.assert_allclose(hv @ v, want[0], rtol=1e-5)


def test_grad_of_vector_planes_and_float32():
    @hawk.kernel
    def vsum(v: hawk.Vector[3], w: hawk.Param) -> Scalar:
        return hawk.sum(w * hm.norm(v) ** 2 + v[0])

    @ef.Graph.builder
    def vec(v, w):
        g = ef.Graph()
        g.result = vsum(v, w)
        return g
    v, w = rng.random((3, 5)), np.array([0.7])
    gv, gw = ef.grad(vec, argnums=(0, 1))(v, w)
    np.testing.assert_allclose(gv, 2 * w * v + np.eye(3)[0][:, None], rtol=1e-12)
    np.testing.assert_allclose(gw, [np.sum(v * v)], rtol=1e-12)
    g32 = ef.grad(vec)(v.astype(np.float32), w.astype(np.float32))
    assert g32.dtype == np.float32
    np.testing.assert_allclose(g32, gv, rtol=1e-5)


def test_forward_mode_takes_an_uncapped_loop_and_reverse_mode_on_numpy(backend_heavy):
    @hawk.kernel
    def step(x: Scalar) -> Scalar:
        return 0.5 * x + 0.01 * x * x

    @hawk.kernel
    def large(s: Scalar, flag: hawk.Mutable[hawk.UInt32]):
        flag = hm.uint32(hawk.sum(hm.abs(s) > 0.1))

    @ef.Graph.builder
    def settle(x, flag):
        g = ef.Graph()
        while flag:
            x = step(x)
            large(x, flag)
        g.result = total(x)
        return g

    def numpy_settle(x):
        while True:
            x = 0.5 * x + 0.01 * x * x
            if not np.any(np.abs(x) > 0.1):
                return np.sum(x * x)
    x = np.linspace(0.5, 1.0, 4)
    with pytest.warns(ef.UncappedLoopWarning):
        _, t = ef.jvp(settle, (x, cell(1)), (np.ones(4), None))
    np.testing.assert_allclose(t, central(lambda s: numpy_settle(x + s), np.zeros(1))[0], rtol=1e-6)
    with pytest.warns(ef.UncappedLoopWarning):
        # NumPy: its stacks of saved turns grow with the turns run; JAX: its turns are recomputed
        np.testing.assert_allclose(ef.grad(settle)(x, cell(1)), central(numpy_settle, x), rtol=1e-6)


def test_batched_hessian_vector_products_and_nested_vmap_of_grad():
    xs, vs, y, a = rng.random((4, 5)), rng.random((4, 5)), np.linspace(0.2, 0.5, 5), np.array([0.6])
    n, c = cell(2), cell(1)
    gs, hs = ef.vmap(lambda x, v: ef.jvp(ef.grad(nested), (x, y, a, n, c), (v, None, None, None, None)))(xs, vs)
    for b in range(4):
        g1, h1 = ef.jvp(ef.grad(nested), (xs[b], y, a, n, c), (vs[b], None, None, None, None))
        np.testing.assert_allclose(gs[b], g1, rtol=1e-12)
        np.testing.assert_allclose(hs[b], h1, rtol=1e-12)
    A = np.array([[0.5], [0.7]])
    G = ef.vmap(ef.vmap(ef.grad(switched), in_axes=(0, None, None)), in_axes=(None, 0, None))(xs, A, cell(2))
    assert G.shape == (2, 4, 5)
    for i in range(2):
        for b in range(4):
            np.testing.assert_allclose(G[i, b], central(lambda q: numpy_switched(q, A[i], 2), xs[b]),
                                       rtol=FD_RTOL, atol=FD_ATOL)


def test_a_grad_graph_binds_new_arrays_and_runs_on_a_worker():
    x = np.linspace(-1.0, 1.0, N)
    g = ef.grad(loss).graph(x, cell(1), cell(3))
    np.testing.assert_allclose(g(), np.asarray(jloss_grad(x, 1, 3)), rtol=RTOL, atol=ATOL)
    x2 = 0.5 * x
    g.bind(x=x2)
    np.testing.assert_allclose(g(), np.asarray(jloss_grad(x2, 1, 3)), rtol=RTOL, atol=ATOL)
    x2 *= 2.0                                          # the graph reads the bound array at each replay
    g.enqueue().synchronize()
    np.testing.assert_allclose(g.result, np.asarray(jloss_grad(x2, 1, 3)), rtol=RTOL, atol=ATOL)
