"""Loops inside a kernel that stop per sample: `for _ in range(K): ... if done: break`.

Oracles that share no code with the kernel path: a plain Python loop per sample (values, turn
counts), jax.vmap of lax.while_loop (values), jax.grad / jax.jvp of the loop unrolled and masked
in jax.numpy (gradients), closed forms (0.5/sqrt(a), the implicit derivative of a fixed point),
and central finite differences. Every backend: NumPy, JAX, CUDA C (NVRTC-compiled, and run on
the host with a C++ compiler where one is found), the fake CUDA device through eagle graphs.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import eagle_fx as eagle
import hawk_fx as hawk
import hawk_fx.diff as hd
import hawk_fx.math as hm
from hawk_fx import Int32, Matrix, Mutable, Param, Scalar, Vector
from hawk_fx.trace import TraceError
from conftest import file_and_line, refused

jax = pytest.importorskip("jax")
jax.config.update("jax_enable_x64", True)
jnp = jax.numpy
lax = jax.lax

CAP, TOL = 60, 1e-15


# ---------------------------------------------------------------------------------------------
# kernels

@hawk.kernel
def newton(a: Scalar):
    x = a
    for i in range(CAP):
        dx = (x * x - a) / (2.0 * x)
        x = x - dx
        if abs(dx) <= TOL * x:
            break
    return x, i


@hawk.kernel
def bisect(a: Scalar):
    lo = 0.0 * a
    hi = hm.maximum(a, 1.0)
    for k in range(90):
        mid = 0.5 * (lo + hi)
        if mid * mid * mid > a:
            hi = mid
        else:
            lo = mid
        if hi - lo <= 1e-12:
            break
    return 0.5 * (lo + hi), k


@hawk.kernel
def fixed_point(b: Scalar):
    x = 0.0 * b
    for _ in range(120):
        xn = 0.5 * hm.cos(x) + b
        if abs(xn - x) < 1e-15:
            x = xn
            break
        x = xn
    return x


@hawk.kernel
def skipping(x: Scalar, c: Param):
    s = 0.0 * x
    for k in range(12):
        t = x * k
        if t > c:
            continue
        s = s + t
        if s > 3.0:
            if x > 0.5:
                s = s - 0.25
            break
    return s, k


@hawk.kernel
def power_iteration(m: Matrix[2, 2]):
    v = hm.vec(1.0 + 0.0 * m[0, 0], 0.5 + 0.0 * m[0, 0])
    lam = 0.0 * m[0, 0]
    for _ in range(400):
        w = m @ v
        lam_new = hm.norm(w)
        v = w / lam_new
        if abs(lam_new - lam) <= 1e-13 * lam_new:
            lam = lam_new
            break
        lam = lam_new
    return lam, v


# ---------------------------------------------------------------------------------------------
# oracles

def py_newton(a, cap=CAP, tol=TOL):
    xs, turns = [], []
    for av in np.asarray(a).tolist():
        x = av
        for i in range(cap):
            dx = (x * x - av) / (2.0 * x)
            x = x - dx
            if abs(dx) <= tol * x:
                break
        xs.append(x)
        turns.append(i)
    return np.array(xs), np.array(turns)


def py_bisect(a):
    out, turns = [], []
    for av in np.asarray(a).tolist():
        lo, hi = 0.0, max(av, 1.0)
        for k in range(90):
            mid = 0.5 * (lo + hi)
            if mid * mid * mid > av:
                hi = mid
            else:
                lo = mid
            if hi - lo <= 1e-12:
                break
        out.append(0.5 * (lo + hi))
        turns.append(k)
    return np.array(out), np.array(turns)


def py_skipping(x, c):
    out, turns = [], []
    for xv in np.asarray(x).tolist():
        s = 0.0
        for k in range(12):
            t = xv * k
            if t > c:
                continue
            s = s + t
            if s > 3.0:
                if xv > 0.5:
                    s = s - 0.25
                break
        out.append(s)
        turns.append(k)
    return np.array(out), np.array(turns)


def jax_newton_values(a):
    def one(av):
        def cond(s):
            i, _, done = s
            return (i < CAP) & ~done

        def body(s):
            i, x, _ = s
            dx = (x * x - av) / (2.0 * x)
            x = x - dx
            return i + 1, x, jnp.abs(dx) <= TOL * x

        i, x, _ = lax.while_loop(cond, body, (0, av, False))
        return x, i - 1
    return jax.jit(jax.vmap(one))(jnp.asarray(a))


def jax_unrolled(step, x0, cap):
    """The loop run for all `cap` turns and masked, in JAX (lax.scan over the turns):
    step(turn, state, *args) -> (new state, break)."""
    def run(*args):
        def turn(carry, t):
            state, active = carry
            new, brk = step(t, state, *args)
            state = jax.tree_util.tree_map(lambda n, o: jnp.where(active, n, o), new, state)
            return (state, active & ~brk), None
        (state, _), _ = lax.scan(turn, (x0(*args), jnp.asarray(True)), jnp.arange(cap))
        return state
    return run


def _newton_step(t, x, a):
    dx = (x * x - a) / (2.0 * x)
    x = x - dx
    return x, jnp.abs(dx) <= TOL * x


def _bisect_step(t, s, a):
    lo, hi = s
    mid = 0.5 * (lo + hi)
    up = mid * mid * mid > a
    lo, hi = jnp.where(up, lo, mid), jnp.where(up, mid, hi)
    return (lo, hi), hi - lo <= 1e-12


def _fixed_step(t, x, b):
    xn = 0.5 * jnp.cos(x) + b
    return xn, jnp.abs(xn - x) < 1e-15


def jgrad(step, x0, cap, a, out=lambda s: s):
    f = jax_unrolled(step, x0, cap)
    return np.asarray(jax.grad(lambda a: jnp.sum(jax.vmap(lambda ai: out(f(ai)))(a)))(jnp.asarray(a)))


# ---------------------------------------------------------------------------------------------
# values

A = np.array([1.0, 2.0, 4.0, 0.3, 1e6, 1e-6, 7.5, 123.25])


def test_newton_stops_per_sample_and_matches_a_python_loop_and_jax():
    x, turns = newton(A)
    want, want_turns = py_newton(A)
    np.testing.assert_array_equal(x, want)
    np.testing.assert_array_equal(turns, want_turns)
    assert len(set(turns.tolist())) > 3                  # the samples really leave at different turns
    jx, ji = jax_newton_values(A)
    np.testing.assert_allclose(x, np.asarray(jx), rtol=1e-15)
    np.testing.assert_array_equal(turns, np.asarray(ji))
    np.testing.assert_allclose(x, np.sqrt(A), rtol=4e-16)


def test_the_same_loop_on_jax_arrays():
    x, turns = newton(jnp.asarray(A))
    want, want_turns = py_newton(A)
    np.testing.assert_allclose(np.asarray(x), want, rtol=1e-15)
    np.testing.assert_array_equal(np.asarray(turns), want_turns)
    x2, _ = jax.jit(newton)(jnp.asarray(A))
    np.testing.assert_allclose(np.asarray(x2), want, rtol=1e-15)


def test_bisection_with_nested_ifs():
    a = np.array([0.001, 0.5, 1.0, 2.0, 27.0, 1000.0, 3.3])
    r, k = bisect(a)
    want, want_k = py_bisect(a)
    np.testing.assert_array_equal(r, want)
    np.testing.assert_array_equal(k, want_k)
    np.testing.assert_allclose(r, np.cbrt(a), atol=1e-11)


def test_continue_and_break_with_an_if_inside():
    x = np.linspace(-1.0, 2.0, 23)
    s, k = skipping(x, 2.5)
    want, want_k = py_skipping(x, 2.5)
    np.testing.assert_array_equal(s, want)
    np.testing.assert_array_equal(k, want_k)


def test_a_matrix_and_vector_carry():
    rng = np.random.default_rng(3)
    q = rng.normal(size=(2, 2, 9))
    m = np.einsum("ijn,kjn->ikn", q, q) + 0.1 * np.eye(2)[..., None]      # symmetric positive definite
    lam, v = power_iteration(m)
    top = np.array([np.linalg.eigvalsh(m[..., j])[-1] for j in range(9)])
    np.testing.assert_allclose(lam, top, rtol=1e-9)
    mv = np.einsum("ijn,jn->in", m, v)
    np.testing.assert_allclose(mv, lam * v, atol=1e-6)


def test_a_loop_in_a_loop():
    @hawk.kernel
    def nested(a: Scalar):
        tot = 0.0 * a
        for i in range(5):
            y = a
            for j in range(50):
                y = y * 0.5
                if y < 1.0:
                    break
            tot = tot + y * y + j
            if tot > 8.0:
                break
        return tot, i

    def py(av):
        tot = 0.0
        for i in range(5):
            y = av
            for j in range(50):
                y = y * 0.5
                if y < 1.0:
                    break
            tot = tot + y * y + j
            if tot > 8.0:
                break
        return tot, i
    a = np.array([0.5, 3.0, 40.0, 1000.0, 7.7, 0.01])
    tot, i = nested(a)
    want = np.array([py(v) for v in a.tolist()])
    np.testing.assert_array_equal(tot, want[:, 0])
    np.testing.assert_array_equal(i, want[:, 1])
    tj, ij = nested(jnp.asarray(a))
    np.testing.assert_allclose(np.asarray(tj), want[:, 0], rtol=1e-15)
    g = hd.vjp(nested, wrt="a")(a, cotangent=(np.ones_like(a), np.zeros(len(a))))["a"]
    h = 1e-7 * np.maximum(a, 1.0)
    fd = (np.array([py(v)[0] for v in (a + h).tolist()]) - np.array([py(v)[0] for v in (a - h).tolist()])) / (2 * h)
    np.testing.assert_allclose(g, fd, rtol=1e-6)
    _, (t, _) = hd.jvp(nested, wrt="a")(a, tangents={"a": np.ones_like(a)})
    np.testing.assert_allclose(t, g, rtol=1e-14)


def test_float32_stays_float32():
    a = A[:6].astype(np.float32)

    @hawk.kernel
    def newton32(a: Scalar):
        x = a
        for _ in range(40):
            x_new = 0.5 * (x + a / x)
            if abs(x_new - x) <= 1e-6 * x_new:
                x = x_new
                break
            x = x_new
        return x
    x = newton32(a)
    assert x.dtype == np.float32
    np.testing.assert_allclose(x, np.sqrt(a.astype(np.float64)), rtol=1e-6)


def test_a_python_test_still_unrolls_and_the_loop_variable_indexes():
    @hawk.kernel
    def picks(v: Vector[4]):
        s = 0.0 * v[0]
        for i in range(4):
            if i == 2:
                continue
            s = s + v[i]            # i: a Python int while no sample has left
            if s > 1.5:
                break
        return s, i

    @hawk.kernel
    def first_big(v: Vector[4]):
        found = 0.0 * v[0]
        for i in range(4):
            found = v[i]            # per-sample break and v[i]: the turns unroll, masked
            if v[i] > 0.5:
                break
        return found, i
    rng = np.random.default_rng(0)
    v = rng.random((4, 17))
    s, i = picks(v)
    f, j = first_big(v)
    for n in range(17):
        tot, last = 0.0, 0
        for k in range(4):
            last = k
            if k == 2:
                continue
            tot += v[k, n]
            if tot > 1.5:
                break
        assert s[n] == tot and i[n] == last
        big = next((k for k in range(4) if v[k, n] > 0.5), 3)
        assert f[n] == v[big, n] and j[n] == big


def test_the_values_path_stops_when_no_sample_is_active():
    @hawk.kernel
    def quick(x: Scalar):
        for k in range(10 ** 12):          # a cap no loop could run through
            x = x * 0.5
            if x < 1.0:
                break
        return x, k
    x = np.array([0.7, 3.0, 100.0, 1.5])
    t0 = time.perf_counter()
    got, turns = quick(x)
    got_j, turns_j = quick(jnp.asarray(x))
    assert time.perf_counter() - t0 < 20.0
    want = [next(k for k in range(99) if v / 2.0 ** (k + 1) < 1.0) for v in x.tolist()]
    np.testing.assert_array_equal(turns, want)
    np.testing.assert_array_equal(got, x / 2.0 ** (turns + 1))
    np.testing.assert_array_equal(np.asarray(turns_j), turns)


def test_reverse_mode_stops_per_sample_too():
    @hawk.kernel
    def halve(x: Scalar, r: Param):
        for k in range(10 ** 12):
            x = x * r
            if x < 1.0:
                break
        return x
    x = np.array([0.7, 3.0, 100.0, 1.5])
    r = np.array([0.5])
    g = hd.vjp(halve, wrt=("x", "r"))(x, r, cotangent=np.ones(4))
    turns = np.array([next(k for k in range(99) if v * 0.5 ** (k + 1) < 1.0) for v in x.tolist()]) + 1
    np.testing.assert_allclose(g["x"], 0.5 ** turns, rtol=1e-15)
    np.testing.assert_allclose(g["r"], [np.sum(turns * x * 0.5 ** (turns - 1))], rtol=1e-14)


@pytest.mark.parametrize("seed", [0, 1, 2] + [pytest.param(k, marks=pytest.mark.slow) for k in range(3, 12)])
def test_random_loops_match_the_python_oracle(seed):
    """A sweep: random inputs, caps and tolerances; NumPy and JAX both equal the Python loop."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 400))
    a = np.exp(rng.uniform(-20, 20, n))
    cap = int(rng.integers(1, 40))
    tol = float(10.0 ** rng.uniform(-16, -2))

    @hawk.kernel
    def capped_newton(a: Scalar):
        x = a
        for i in range(cap):
            dx = (x * x - a) / (2.0 * x)
            x = x - dx
            if abs(dx) <= tol * x:
                break
        return x, i
    want, want_turns = py_newton(a, cap, tol)
    got, turns = capped_newton(a)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(turns, want_turns)
    gj, tj = capped_newton(jnp.asarray(a))
    np.testing.assert_allclose(np.asarray(gj), want, rtol=1e-14)
    np.testing.assert_array_equal(np.asarray(tj), want_turns)
    x = rng.uniform(-1, 2, n)
    c = float(rng.uniform(0.5, 5.0))
    s, k = skipping(x, c)
    ws, wk = py_skipping(x, c)
    np.testing.assert_array_equal(s, ws)
    np.testing.assert_array_equal(k, wk)


# ---------------------------------------------------------------------------------------------
# derivatives

def test_newton_sqrt_derivatives_are_half_over_sqrt():
    a = A
    ct = (np.ones_like(a), np.zeros(len(a)))
    g = hd.vjp(newton, wrt="a")(a, cotangent=ct)["a"]
    np.testing.assert_allclose(g, 0.5 / np.sqrt(a), rtol=1e-12)
    outs, tans = hd.jvp(newton, wrt="a")(a, tangents={"a": np.ones_like(a)})
    np.testing.assert_allclose(tans[0], 0.5 / np.sqrt(a), rtol=1e-12)
    want = jgrad(_newton_step, lambda a: a, CAP, a)
    np.testing.assert_allclose(g, want, rtol=1e-13)


@pytest.mark.parametrize("seed", [0, 1] + [pytest.param(k, marks=pytest.mark.slow) for k in range(2, 8)])
def test_random_loop_derivatives_match_jax_unrolled(seed):
    """A sweep: random caps and tolerances (a loop cut short too); reverse and forward mode both
    equal jax.grad of the same loop run for all its turns, masked."""
    rng = np.random.default_rng(100 + seed)
    a = np.exp(rng.uniform(-12, 12, int(rng.integers(1, 60))))
    cap = int(rng.integers(1, 30))
    tol = float(10.0 ** rng.uniform(-16, -1))

    @hawk.kernel
    def capped_newton(a: Scalar):
        x = a
        for _ in range(cap):
            dx = (x * x - a) / (2.0 * x)
            x = x - dx
            if abs(dx) <= tol * x:
                break
        return x

    def step(t, x, a):
        dx = (x * x - a) / (2.0 * x)
        x = x - dx
        return x, jnp.abs(dx) <= tol * x
    want = jgrad(step, lambda a: a, cap, a)
    g = hd.vjp(capped_newton, wrt="a")(a, cotangent=np.ones_like(a))["a"]
    np.testing.assert_allclose(g, want, rtol=1e-13)
    _, (t,) = hd.jvp(capped_newton, wrt="a")(a, tangents={"a": np.ones_like(a)})
    np.testing.assert_allclose(t, want, rtol=1e-13)


def test_bisection_and_fixed_point_gradients_match_jax_unrolled():
    a = np.array([0.001, 0.5, 1.0, 2.0, 27.0, 1000.0, 3.3])
    g = hd.vjp(bisect, wrt="a")(a, cotangent=(np.ones_like(a), np.zeros(len(a))))["a"]
    want = jgrad(_bisect_step, lambda a: (0.0 * a, jnp.maximum(a, 1.0)), 90, a, out=lambda s: 0.5 * (s[0] + s[1]))
    np.testing.assert_allclose(g, want, rtol=1e-12, atol=1e-300)
    _, tans = hd.jvp(bisect, wrt="a")(a, tangents={"a": np.ones_like(a)})
    np.testing.assert_allclose(tans[0], want, rtol=1e-12, atol=1e-300)

    b = np.linspace(-2.0, 3.0, 11)
    x = fixed_point(b)
    g = hd.vjp(fixed_point, wrt="b")(b, cotangent=np.ones_like(b))["b"]
    np.testing.assert_allclose(g, 1.0 / (1.0 + 0.5 * np.sin(x)), rtol=1e-12)     # the implicit derivative
    np.testing.assert_allclose(g, jgrad(_fixed_step, lambda b: 0.0 * b, 120, b), rtol=1e-13)
    _, tans = hd.jvp(fixed_point, wrt="b")(b, tangents={"b": np.ones_like(b)})
    np.testing.assert_allclose(tans[0], g, rtol=1e-13)


def test_gradient_of_a_param_and_a_carry_against_finite_differences():
    @hawk.kernel
    def damped(x: Scalar, r: Param):
        y = x
        for _ in range(30):
            y_new = y - r * (y * y * y - x)
            if abs(y_new - y) < 1e-3:
                y = y_new
                break
            y = y_new
        return y * x
    x = np.linspace(0.5, 1.5, 7)
    r = np.array([0.2])             # a one-cell Param: differentiable (a Python number is not)
    ct = np.linspace(1.0, 2.0, 7)
    g = hd.vjp(damped, wrt=("x", "r"))(x, r, cotangent=ct)
    h = 1e-6
    fd_x = ct * (damped(x + h, r) - damped(x - h, r)) / (2 * h)
    fd_r = np.sum(ct * (damped(x, r + h) - damped(x, r - h)) / (2 * h))
    np.testing.assert_allclose(g["x"], fd_x, rtol=1e-6)
    np.testing.assert_allclose(g["r"], [fd_r], rtol=1e-6)
    _, tans = hd.jvp(damped, wrt=("x", "r"))(x, r, tangents={"x": np.ones_like(x), "r": np.zeros(1)})
    np.testing.assert_allclose(ct * tans[0], fd_x, rtol=1e-6)


# ---------------------------------------------------------------------------------------------
# eagle: grad / vjp / jvp / vmap of a builder calling such a kernel

@hawk.kernel
def sqrt_sum(a: Scalar) -> Scalar:
    x = a
    for _ in range(CAP):
        dx = (x * x - a) / (2.0 * x)
        x = x - dx
        if abs(dx) <= TOL * x:
            break
    return hawk.sum(x)


@eagle.Graph.builder
def roots_total(a):
    g = eagle.Graph()
    g.result = sqrt_sum(a)
    return g


@eagle.Graph.builder
def roots(a):
    g = eagle.Graph()
    x, _ = newton(a)
    g.result = x
    return g


@pytest.mark.usefixtures("backend_heavy")
def test_eagle_transforms_of_a_builder_calling_the_loop():
    a = A.copy()
    np.testing.assert_allclose(eagle.grad(roots_total)(a), 0.5 / np.sqrt(A), rtol=1e-12)
    y, pull = eagle.vjp(roots, A.copy())
    np.testing.assert_allclose(y, np.sqrt(A), rtol=4e-16)
    seed = np.linspace(1.0, 2.0, len(A))
    (da,) = pull(seed)
    np.testing.assert_allclose(da, seed * 0.5 / np.sqrt(A), rtol=1e-12)
    _, t = eagle.jvp(roots, (A.copy(),), (np.ones_like(A),))
    np.testing.assert_allclose(t, 0.5 / np.sqrt(A), rtol=1e-12)
    batch = np.stack([A, 2.0 * A, A / 3.0])
    got = eagle.vmap(roots)(batch)
    got = got() if callable(got) else got
    np.testing.assert_allclose(got, np.sqrt(batch), rtol=4e-16)
    gb = eagle.vmap(eagle.grad(roots_total))(batch)
    np.testing.assert_allclose(gb, 0.5 / np.sqrt(batch), rtol=1e-12)


def test_eagle_on_the_fake_cuda_device():
    from eagle_fx.backends.select import use_backend
    with use_backend("fake-cuda"):
        got = roots(A.copy())
        got = got() if callable(got) else got
        g = eagle.grad(roots_total)(A.copy())
    np.testing.assert_allclose(got, np.sqrt(A), rtol=4e-16)
    np.testing.assert_allclose(g, 0.5 / np.sqrt(A), rtol=1e-12)


# ---------------------------------------------------------------------------------------------
# CUDA C: NVRTC compiles the per-thread loop; a host C++ compiler runs it against the oracle

def _spec(kernel, *args):
    kernel(*args)
    return next(iter(kernel._specs.values()))


def test_cuda_source_has_a_per_thread_loop_with_a_break_and_compiles(nvrtc):
    from hawk_fx.emit import cuda
    for kern, args in ((newton, (A,)), (skipping, (np.linspace(-1, 2, 5), 2.5)), (power_iteration, (np.ones((2, 2, 3)),))):
        ek = cuda.emit_specialization(_spec(kern, *args))
        assert "for (long long" in ek.source and "break;" in ek.source
        assert ek.entry_names()[0] in cuda.ptx_entries(cuda.compile_ptx(ek.source))
    spec = _spec(newton, A)
    for body in (hd.vjp_spec(spec), hd.jvp_spec(spec, [True])):      # loops in loops: the derivatives
        ek = cuda.emit_specialization(body, name="deriv")
        assert ek.source.count("for (long long") >= 2
        assert "deriv" in cuda.ptx_entries(cuda.compile_ptx(ek.source))


HOST_SHIM = """
#include <cmath>
#include <cstdio>
#include <cstdlib>
#define __global__
#define __device__
#define __forceinline__ inline
#define __restrict__
using namespace std;
struct hawk_dim { unsigned x; };
static hawk_dim blockIdx = {0}, threadIdx = {0}, blockDim = {1}, gridDim = {1};
"""


def _run_on_host(ek, inputs, tmp_path):
    """Compile an emitted body's C with the host C++ compiler (one thread, a loop over the samples)
    and run it on `inputs` (one array per in_plane parameter); returns its out_plane arrays."""
    n = len(inputs[0])
    decl, args, outs = [], [], []
    ins = iter(inputs)
    for p in ek.params:
        T = p.ctype.replace("const ", "").replace("*", "").replace("__restrict__", "").strip()
        if p.role == "in_plane":
            vals = ", ".join(repr(float(v)) if T in ("double", "float") else str(int(v)) for v in next(ins))
            decl.append(f"{T} {p.name}[{n}] = {{{vals}}};")
        elif p.role == "out_plane":
            decl.append(f"{T} {p.name}[{n}];")
            outs.append((p.name, T))
        else:
            assert p.role == "n", p.role
        args.append(p.name if p.role != "n" else f"{n}ull")
    prints = "".join(f'printf("%.17g\\n", (double){o}[i]); ' for o, _ in outs)
    main = f"int main() {{ {' '.join(decl)} {ek.name}({', '.join(args)}); " \
           f"for (int i = 0; i < {n}; ++i) {{ {prints} }} return 0; }}"
    src = tmp_path / f"{ek.name}.cpp"
    src.write_text(HOST_SHIM + ek.source.replace('extern "C" ', "") + main)
    exe = tmp_path / ek.name
    subprocess.run(["g++", "-O0", "-ffp-contract=off", "-o", str(exe), str(src)], check=True, capture_output=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.split()
    return np.array([float(v) for v in out]).reshape(n, len(outs)).T


@pytest.mark.skipif(shutil.which("g++") is None, reason="no host C++ compiler")
def test_the_cuda_loop_runs_on_the_host_against_the_python_loop(tmp_path):
    from hawk_fx.emit import cuda
    spec = _spec(newton, A)
    x, turns = _run_on_host(cuda.emit_specialization(spec, name="newton_k", prelude=False), [A], tmp_path)
    want, want_turns = py_newton(A)
    np.testing.assert_array_equal(x, want)
    np.testing.assert_array_equal(turns, want_turns)
    # the derivative bodies: loops in loops (reverse: each sample's turns backwards)
    (g,) = _run_on_host(cuda.emit_specialization(hd.vjp_spec(spec), name="newton_vjp", prelude=False),
                        [A, np.ones_like(A), np.zeros_like(A)], tmp_path)
    np.testing.assert_allclose(g, 0.5 / np.sqrt(A), rtol=1e-12)
    x, _, t, _ = _run_on_host(cuda.emit_specialization(hd.jvp_spec(spec, [True]), name="newton_jvp", prelude=False),
                              [A, np.ones_like(A)], tmp_path)
    np.testing.assert_allclose(t, 0.5 / np.sqrt(A), rtol=1e-12)


# ---------------------------------------------------------------------------------------------
# refusals

def test_a_loop_over_a_traced_bound_has_no_cap(rng):
    @hawk.kernel
    def uncapped(x: Scalar, k: Int32, log: Mutable[Scalar]):
        log = log + 1.0
        for _ in range(k):
            x = x * 0.5
        return x
    log = np.zeros(5)
    fname, line = file_and_line(uncapped, "for _ in range(k)")
    refused(TraceError, lambda: uncapped(rng.random(5), np.arange(5, dtype=np.int32), log),
            "uncapped", fname, line, "no cap", "range(K)", "break", untouched=(log,))


def test_an_uncapped_while_with_a_per_sample_break_stays_refused(rng):
    @hawk.kernel
    def forever(x: Scalar, log: Mutable[Scalar]):
        log = log + 1.0
        while True:
            x = x * 0.5
            if x < 1.0:
                break
        return x
    log = np.zeros(5)
    fname, line = file_and_line(forever, "if x < 1.0")
    refused(TraceError, lambda: forever(rng.random(5) * 10, log), "forever", fname, line, "bool", "break",
            untouched=(log,))


def test_break_outside_a_loop_names_the_line(tmp_path, monkeypatch):
    """Source that Python would not compile as written reaches the kernel pass only when the file
    changed after the function was defined: the pass refuses it, naming the line."""
    mod = tmp_path / "changed_kernel.py"
    mod.write_text(textwrap.dedent("""
        from hawk_fx import Scalar
        def k(x: Scalar):
            for _ in range(3):
                if x > 1.0:
                    break
            return x
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    import importlib
    import linecache
    m = importlib.import_module("changed_kernel")
    mod.write_text(textwrap.dedent("""
        from hawk_fx import Scalar
        def k(x: Scalar):
            y = x
            if x > 1.0:
                break
            return x
    """))
    linecache.checkcache(str(mod))
    with pytest.raises(TraceError) as info:
        hawk.kernel(m.k)(np.ones(3))
    msg = str(info.value)
    assert "k:" in msg and "changed_kernel.py, line 6" in msg and "`break` outside a loop" in msg
    sys.modules.pop("changed_kernel", None)
