"""`done: Terminated`: a sample whose mark is set is left untouched by the kernel.

Oracles: hand-written masked NumPy loops, closed forms, finite differences and jax.lax.while_loop
on the same math; NVRTC compiles the CUDA emission and the fake CUDA device runs a graph of it.
"""
from __future__ import annotations

import numpy as np
import pytest

import eagle_fx as eagle
import hawk_fx as hawk
import hawk_fx.diff as hd
import hawk_fx.math as hm
from eagle_fx.backends.select import use_backend
from hawk_fx import Mutable, Param, Scalar, Terminated, Vector

from conftest import line_of, refused

DT = 0.01


@hawk.kernel
def fall(y: Mutable[Scalar], v: Mutable[Scalar], done: Terminated, g: Param):
    v = v - g * 0.01
    y = y + v * 0.01
    done = y < 0.0


@hawk.kernel
def push(x: Mutable[Vector[2]], done: Terminated, k: Param):
    x = x * k + 0.25
    done = x[0] > 3.0
    return x[0] + x[1], done


def masked_push(x, done, k):
    """The oracle: the same update written as a masked NumPy step."""
    new = x * k + 0.25
    r = np.where(done, 0.0, new[0] + new[1])
    x_out = np.where(done, x, new)
    done_out = done | (new[0] > 3.0)
    return x_out, done_out, r, np.where(done, False, done_out)


def test_a_finished_sample_is_left_untouched_random_sweep():
    rng = np.random.default_rng(7)
    for trial in range(20):
        n = int(rng.integers(1, 40))
        x = rng.uniform(-1.0, 3.5, (2, n))
        done = rng.random(n) < 0.3
        k = float(rng.uniform(0.5, 1.5))
        want = masked_push(x.copy(), done.copy(), k)
        x_in, d_in = x.copy(), done.copy()
        r, d_res = push(x_in, d_in, k)
        np.testing.assert_array_equal(x_in, want[0])
        np.testing.assert_array_equal(d_in, want[1])
        np.testing.assert_array_equal(r, want[2])
        np.testing.assert_array_equal(d_res, want[3])
        assert d_in.dtype == np.bool_ and r.dtype == np.float64


def test_a_mark_once_set_stays_set_and_the_body_reads_it():
    @hawk.kernel
    def clear(x: Mutable[Scalar], done: Terminated):
        x = hm.where(done, -1.0, x + 1.0)      # never -1: the body runs only for samples not done
        done = False                            # cannot unset a mark

    x, done = np.zeros(4), np.array([True, False, True, False])
    clear(x, done)
    np.testing.assert_array_equal(x, [0.0, 1.0, 0.0, 1.0])
    np.testing.assert_array_equal(done, [True, False, True, False])


def ballistic(y, v, g, turns=1000):
    """The oracle: a masked NumPy loop of the falling ball, its step count per sample."""
    y, v = y.copy(), v.copy()
    done = np.zeros(y.shape, bool)
    steps = np.zeros(y.shape, int)
    for _ in range(turns):
        if done.all():
            break
        vn = v - g * DT
        yn = y + vn * DT
        steps += ~done
        v, y = np.where(done, v, vn), np.where(done, y, yn)
        done = done | (yn < 0.0)
    return y, v, steps


def test_falling_ball_lands_as_the_masked_loop_and_closed_form():
    y0, v0 = np.linspace(0.5, 2.0, 6), np.linspace(-1.0, 1.0, 6)
    y, v, done = y0.copy(), v0.copy(), np.zeros(6, bool)
    while not done.all():
        fall(y, v, done, 9.81)
    ry, rv, steps = ballistic(y0, v0, 9.81)
    np.testing.assert_array_equal(y, ry)
    np.testing.assert_array_equal(v, rv)
    # the semi-implicit Euler step's closed form at step k: v_k = v0 - g k dt, y_k = y0 + dt sum v_j
    k = steps
    np.testing.assert_allclose(v, v0 - 9.81 * k * DT, rtol=0, atol=1e-12)
    np.testing.assert_allclose(y, y0 + DT * (k * v0 - 9.81 * DT * k * (k + 1) / 2), rtol=0, atol=1e-12)


@hawk.kernel
def energy(x: Vector[2], done: Terminated, k: Param):
    return 0.5 * k * hm.dot(x, x)


def test_on_jax_arrays_a_finished_sample_reads_zero():
    """A jax.Array cannot be written in place (a kernel that writes runs in a graph on JAX), so eager
    calls on jax.Arrays read the mark only."""
    import jax
    import jax.numpy as jnp
    jax.config.update("jax_enable_x64", True)
    rng = np.random.default_rng(3)
    x, done = rng.uniform(0.0, 3.5, (2, 9)), rng.random(9) < 0.4
    want = np.where(done, 0.0, 0.5 * 1.1 * (x * x).sum(0))
    np.testing.assert_allclose(np.asarray(energy(jnp.asarray(x), jnp.asarray(done), 1.1)), want, rtol=1e-15)
    np.testing.assert_allclose(energy(x, done, 1.1), want, rtol=1e-15)
    gx = jax.grad(lambda a: energy(a, jnp.asarray(done), 1.1).sum())(jnp.asarray(x))
    np.testing.assert_allclose(np.asarray(gx), np.where(done, 0.0, 1.1 * x), rtol=1e-15)


def test_kernel_derivatives_pass_a_finished_sample_through():
    """vjp: a finished sample's cotangent is the identity on its Mutables, zero from its results;
    jvp likewise; against finite differences of the masked oracle."""
    rng = np.random.default_rng(11)
    x, done = rng.uniform(0.0, 3.5, (2, 8)), rng.random(8) < 0.5
    k = 1.3
    ct_x, ct_r = rng.normal(size=(2, 8)), rng.normal(size=8)

    def objective(x_):
        xo, _, r, _ = masked_push(x_, done, k)
        return float(np.sum(ct_x * xo) + np.sum(ct_r * r))

    h, fd = 1e-6, np.zeros_like(x)
    for idx in np.ndindex(*x.shape):
        e = np.zeros_like(x)
        e[idx] = h
        fd[idx] = (objective(x + e) - objective(x - e)) / (2 * h)
    got = hd.vjp(push, wrt=("x",))(x.copy(), done.copy(), k, cotangent=[ct_r, np.zeros(8), ct_x, np.zeros(8)])
    np.testing.assert_allclose(got["x"], fd, rtol=1e-7, atol=1e-8)
    np.testing.assert_array_equal(got["x"][:, done], ct_x[:, done])          # exactly the identity
    t = rng.normal(size=(2, 8))
    _, tans = hd.jvp(push, wrt=("x",))(x.copy(), done.copy(), k, tangents={"x": t})
    np.testing.assert_array_equal(tans[0][done], 0.0)                         # the result reads 0
    np.testing.assert_allclose(tans[0][~done], k * (t[0] + t[1])[~done], rtol=1e-14)


@eagle.Graph.builder
def drop(y, v, done, g):
    gr = eagle.Graph()
    for _ in range(1000):
        fall(y, v, done, g)
        if hawk.all_done(done):
            break
    gr.result = y * v
    return gr


def _jax_drop(y, v, g):
    """The oracle in JAX: lax.while_loop with the same masked step and stop rule."""
    import jax
    import jax.numpy as jnp

    def cond(c):
        return (~jnp.all(c[2])) & (c[3] < 1000)

    def body(c):
        y, v, done, t = c
        vn = v - g * DT
        yn = y + vn * DT
        return jnp.where(done, y, yn), jnp.where(done, v, vn), done | (yn < 0.0), t + 1

    y, v, _, _ = jax.lax.while_loop(cond, body, (y, v, jnp.zeros(y.shape, bool), 0))
    return y * v


@pytest.mark.parametrize("backend", ["numpy", "jax", "fake-cuda"])
def test_a_graph_loop_until_all_done_and_its_gradient(backend):
    import jax
    jax.config.update("jax_enable_x64", True)
    rng = np.random.default_rng(5)
    y0, v0, g = rng.uniform(0.3, 2.0, 7), rng.uniform(-1.0, 1.0, 7), np.array([9.81])
    ry, rv, _ = ballistic(y0, v0, 9.81)
    seed = rng.normal(size=7)
    with use_backend(backend):
        out = drop(y0.copy(), v0.copy(), np.zeros(7, bool), g)()
        np.testing.assert_allclose(out, ry * rv, rtol=1e-14)
        _, pull = eagle.vjp(drop, y0.copy(), v0.copy(), np.zeros(7, bool), g)
        gy, gv, gd, gg = pull(seed)
    jac = jax.jit(jax.jacfwd(_jax_drop, argnums=(0, 1, 2)))(y0, v0, 9.81)     # a while_loop: forward mode
    jy, jv, jg = (seed @ np.asarray(j) for j in jac)
    np.testing.assert_allclose(gy, jy, rtol=1e-12)
    np.testing.assert_allclose(gv, jv, rtol=1e-12)
    np.testing.assert_allclose(gg, [jg], rtol=1e-12)
    assert gd is None


def test_all_done_reads_every_mark():
    for marks, want in [([True, True], 1), ([True, False], 0), ([False], 0), ([], 1)]:
        assert hawk.all_done(np.array(marks, bool)).tolist() == [want]


def test_the_cuda_emission_compiles(nvrtc):
    from hawk_fx.emit import cuda
    for kern in (fall, push):
        src = cuda.emit_specialization(kern.specialize(kern.default_layout()), kern.name)
        cuda.compile_cubin(src.source, arch="sm_90")


# ---------------------------------------------------------------------------------------------
# refusals


def test_mutable_terminated_is_refused_with_the_way():
    with pytest.raises(TypeError, match=r"fin:2 .*'done' is Mutable\[Terminated\].*`done: Terminated`"):
        @hawk.kernel
        def fin(x: Scalar, done: Mutable[Terminated]):
            done = x > 2.0


def test_two_marks_are_refused():
    with pytest.raises(TypeError, match=r"twice: parameters 'a', 'b' are all Terminated"):
        @hawk.kernel
        def twice(x: Mutable[Scalar], a: Terminated, b: Terminated):
            x = x + 1.0


def test_a_reduction_over_samples_is_refused_with_the_line():
    @hawk.kernel
    def norm_all(x: Mutable[Scalar], done: Terminated):
        x = x / hawk.sum(x * x)

    x = np.ones(3)
    msg = refused(TypeError, lambda: norm_all(x, np.zeros(3, bool)), "norm_all", "reduction over the samples",
                  f"line {line_of(norm_all, 'hawk.sum')}", "'done'", "hm.where(done, 0.0, x)", untouched=(x,))
    assert msg


def test_a_mark_of_the_wrong_dtype_is_refused_before_anything_runs():
    y, v = np.ones(3), np.zeros(3)
    refused(TypeError, lambda: fall(y, v, np.zeros(3), 9.81), "fall", "'done' (Terminated)", "dtype float64",
            "dtype bool", untouched=(y, v))
    refused(TypeError, lambda: fall(y, v, False, 9.81), "'done' (Terminated)", "needs an array", untouched=(y, v))
