"""eagle_fx.simulate: a step run until every sample is done, as one staged device loop.

Oracles: a hand-written masked NumPy loop of the same step (values, steps, status), the closed
form of the semi-implicit Euler fall, central finite differences of that loop, and jax.jacfwd of
a jax.lax.while_loop with the same stop rule.
"""
from __future__ import annotations

import numpy as np
import pytest

import eagle_fx as eagle
import hawk_fx as hawk
import hawk_fx.math as hm
from eagle_fx import SimResult, simulate
from eagle_fx.backends.select import use_backend
from hawk_fx import Mutable, Param, Scalar, Terminated, Vector

DT = 0.01


@hawk.kernel
def fall(y: Mutable[Scalar], v: Mutable[Scalar], done: Terminated):
    v = v - 9.81 * 0.01
    y = y + v * 0.01
    done = y < 0.0


@hawk.kernel
def fall_g(y: Scalar, v: Scalar, done: Terminated, g: Param):
    """Returns the new state instead of writing it (a finished sample's results read 0)."""
    v2 = v - g * 0.01
    return y + v2 * 0.01, v2


@hawk.kernel
def spiral(p: Mutable[Vector[2]], done: Terminated, w: Param):
    p = hm.vec(p[0] - w * p[1], p[1] + w * p[0]) * 0.99


def masked_fall(y, v, g=9.81, max_steps=10_000, limit_code=SimResult.BUDGET, until=None):
    """The oracle: the fall as a masked NumPy loop; (y, v, steps, status)."""
    y, v = np.array(y, float), np.array(v, float)
    done = np.zeros(y.shape, bool)
    status = np.zeros(y.shape, np.int32)
    steps = np.zeros(y.shape, np.int32)
    for _ in range(max_steps):
        if done.all():
            break
        active = ~done
        vn = v - g * DT
        yn = y + vn * DT
        v, y = np.where(active, vn, v), np.where(active, yn, y)
        steps += active
        hit = active & ((yn < 0.0) if until is None else until(y))
        status[hit] = SimResult.FINISHED
        done |= hit
        over = active & ~hit & (steps >= max_steps)
        status[over] = limit_code
        done |= over
    status[status == 0] = limit_code
    return y, v, steps, status


@pytest.mark.parametrize("backend", ["numpy", "jax", "fake-cuda"])
def test_closed_form_and_the_masked_loop(backend):
    y0, v0 = np.linspace(0.5, 2.0, 6), np.linspace(-1.0, 1.0, 6)
    with use_backend(backend):
        r = simulate(fall, {"y": y0, "v": v0}, max_steps=1000, dt=DT)
    y, v, steps, status = masked_fall(y0, v0)
    np.testing.assert_allclose(r.state["y"], y, rtol=1e-13, atol=1e-15)      # XLA may fuse a multiply-add
    np.testing.assert_allclose(r.state["v"], v, rtol=1e-13)
    np.testing.assert_array_equal(r.steps, steps)
    np.testing.assert_array_equal(r.status, status)
    assert r.finished.all() and r.steps.dtype == np.int32 and r.status.dtype == np.int32 and r.trajectory is None
    np.testing.assert_allclose(r.t, steps * DT, rtol=1e-15)
    # semi-implicit Euler: v_k = v0 - g k dt, y_k = y0 + dt (k v0 - g dt k (k + 1) / 2); the landing step
    # is the first k with y_k < 0, so y_{k-1} >= 0
    k = steps

    def y_at(j):
        return y0 + DT * (j * v0 - 9.81 * DT * j * (j + 1) / 2)
    np.testing.assert_allclose(r.state["y"], y_at(k), atol=1e-12)
    np.testing.assert_allclose(r.state["v"], v0 - 9.81 * k * DT, atol=1e-12)
    assert (y_at(k) < 0).all() and (y_at(k - 1) >= 0).all()


def test_the_callers_state_is_not_written():
    y0, v0 = np.linspace(0.5, 2.0, 4), np.zeros(4)
    keep = (y0.copy(), v0.copy())
    simulate(fall, (y0, v0), max_steps=100)
    np.testing.assert_array_equal(y0, keep[0])
    np.testing.assert_array_equal(v0, keep[1])


def test_random_sweep_of_budgets_checks_and_t_end():
    """Whatever `every`, each sample stops at its own step; budgets and t_end give their status."""
    rng = np.random.default_rng(2)
    for trial in range(8):
        n = int(rng.integers(1, 12))
        y0, v0 = rng.uniform(0.0, 3.0, n), rng.uniform(-2.0, 2.0, n)
        every = int(rng.choice([1, 2, 5, 16]))
        max_steps = int(rng.integers(0, 120))
        if trial % 2:
            t_end = float(rng.uniform(0.0, 1.5))
            t_steps = int(np.ceil(round(t_end / DT, 9)))
            limit, code = (t_steps, SimResult.T_END) if t_steps <= max_steps else (max_steps, SimResult.BUDGET)
            r = simulate(fall, {"y": y0, "v": v0}, max_steps=max_steps, t_end=t_end, dt=DT, every=every)
        else:
            limit, code = max_steps, SimResult.BUDGET
            r = simulate(fall, {"y": y0, "v": v0}, max_steps=max_steps, every=every)
        y, v, steps, status = masked_fall(y0, v0, max_steps=limit, limit_code=code)
        np.testing.assert_array_equal(r.state["y"], y, err_msg=f"trial {trial}")
        np.testing.assert_array_equal(r.steps, steps, err_msg=f"trial {trial}")
        np.testing.assert_array_equal(r.status, status, err_msg=f"trial {trial}")
        np.testing.assert_array_equal(r.finished, status == SimResult.FINISHED)


def test_t_end_alone_bounds_the_run():
    y0 = np.array([0.01, 5.0])
    r = simulate(fall, {"y": y0, "v": np.zeros(2)}, t_end=0.3, dt=DT)
    np.testing.assert_array_equal(r.status, [SimResult.FINISHED, SimResult.T_END])
    np.testing.assert_array_equal(r.steps, [masked_fall(y0[:1], [0.0])[2][0], 30])
    np.testing.assert_allclose(r.t, r.steps * DT)


def test_a_vector_state_and_until():
    p0 = np.stack([np.linspace(0.5, 2.0, 5), np.zeros(5)])
    r = simulate(lambda s, d: spiral(s, d, 0.1), p0, until=lambda p: hm_norm2(p) < 1.0, max_steps=500)
    p = p0.copy()
    done = np.zeros(5, bool)
    steps = np.zeros(5, int)
    for _ in range(500):
        new = np.stack([p[0] - 0.1 * p[1], p[1] + 0.1 * p[0]]) * 0.99
        p = np.where(done, p, new)
        steps += ~done
        done |= (p * p).sum(0) < 1.0
    np.testing.assert_allclose(r.state, p, rtol=1e-14)
    np.testing.assert_array_equal(r.steps, steps)


@hawk.kernel
def _norm2(p: Vector[2]) -> Scalar:
    return hm.dot(p, p)


def hm_norm2(p):
    return _norm2(p)


# ---------------------------------------------------------------------------------------------
# inside a builder: derivatives, checkpoints, vmap, backends


@eagle.Graph.builder
def landing(y0, v0, g):
    gr = eagle.Graph()
    r = simulate(lambda s, d: fall_g(s[0], s[1], d, g), (y0, v0), until=lambda s: s[0] < 0.0, max_steps=1000)
    gr.result = r.state[0] * r.state[1] + r.steps
    return gr


def oracle(y0, v0, g):
    y, v, steps, _ = masked_fall(y0, v0, g, max_steps=1000)
    return y * v + steps


def _jax_landing(y0, v0, g):
    import jax
    import jax.numpy as jnp

    def cond(c):
        return ~jnp.all(c[2]) & (c[3] < 1000)

    def body(c):
        y, v, done, k, steps = c
        vn = v - g * DT
        yn = y + vn * DT
        return (jnp.where(done, y, yn), jnp.where(done, v, vn), done | (yn < 0.0), k + 1, steps + ~done)

    y, v, _, _, steps = jax.lax.while_loop(cond, body, (y0, v0, jnp.zeros(y0.shape, bool), 0, jnp.zeros(y0.shape)))
    return y * v + steps


@pytest.fixture(scope="module")
def landing_case():
    """The arguments, a seed, and jax.jacfwd of the lax.while_loop oracle (compiled once)."""
    import jax
    jax.config.update("jax_enable_x64", True)
    rng = np.random.default_rng(9)
    y0, v0, g = rng.uniform(0.3, 2.0, 6), rng.uniform(-1.0, 1.0, 6), np.array([9.81])
    seed = rng.normal(size=6)
    jac = jax.jit(jax.jacfwd(_jax_landing, argnums=(0, 1, 2)))(y0, v0, 9.81)
    return y0, v0, g, seed, [np.asarray(j) for j in jac]


@pytest.mark.parametrize("backend", ["numpy", "jax", "fake-cuda"])
def test_derivatives_of_a_run_in_a_builder(backend, landing_case):
    y0, v0, g, seed, jac = landing_case
    jy, jv, jg = (seed @ j for j in jac)
    with use_backend(backend):
        np.testing.assert_allclose(landing(y0, v0, g)(), oracle(y0, v0, 9.81), rtol=1e-14)
        out, pull = eagle.vjp(landing, y0, v0, g)
        gy, gv, gg = pull(seed)
        np.testing.assert_allclose(out, oracle(y0, v0, 9.81), rtol=1e-14)
        _, tan = eagle.jvp(landing, (y0, v0, g), (seed, np.zeros(6), np.zeros(1)))
        if backend == "numpy":
            _, pull_k = eagle.vjp(landing, y0, v0, g, checkpoints=3)
            for a, b in zip(pull_k(seed), (gy, gv, gg)):
                np.testing.assert_allclose(a, b, rtol=1e-13)
    np.testing.assert_allclose(gy, jy, rtol=1e-12)
    np.testing.assert_allclose(gv, jv, rtol=1e-12)
    np.testing.assert_allclose(gg, [jg], rtol=1e-12)
    np.testing.assert_allclose(tan, jac[0] @ seed, rtol=1e-12)
    # and finite differences of the masked NumPy loop (no jump in the steps within h)
    h = 1e-7
    fd = np.array([(oracle(y0 + h * e, v0, 9.81) - oracle(y0 - h * e, v0, 9.81)) @ seed / (2 * h) for e in np.eye(6)])
    np.testing.assert_allclose(gy, fd, rtol=1e-6, atol=1e-8)


def test_grad_and_vmap_of_a_run():
    y0, v0, g = np.linspace(0.4, 1.6, 4), np.linspace(-0.5, 0.5, 4), np.array([9.81])

    @hawk.kernel
    def total(x: Scalar) -> Scalar:
        return hawk.sum(x)

    @eagle.Graph.builder
    def loss(y0, v0, g):
        gr = eagle.Graph()
        r = simulate(lambda s, d: fall_g(s[0], s[1], d, g), (y0, v0), until=lambda s: s[0] < 0.0, max_steps=1000)
        gr.result = total(r.state[1] * r.state[1])
        return gr

    dg = eagle.grad(loss, argnums=2)(y0, v0, g)
    h = 1e-6
    f = lambda gv: float((masked_fall(y0, v0, gv, max_steps=1000)[1] ** 2).sum())   # noqa: E731
    np.testing.assert_allclose(dg, [(f(9.81 + h) - f(9.81 - h)) / (2 * h)], rtol=1e-7)
    Y = np.stack([y0, y0 + 0.25, y0 * 2.0])
    out = eagle.vmap(landing, in_axes=(0, None, None))(Y, v0, g)()
    for b in range(3):
        np.testing.assert_allclose(out[b], oracle(Y[b], v0, 9.81), rtol=1e-14)


# ---------------------------------------------------------------------------------------------
# record=K: the state every K steps


def masked_rows(y0, v0, every_k, rows, g=9.81, max_steps=10_000):
    """The oracle: the masked loop's state after K, 2K, ... steps."""
    ys, vs = [], []
    for r in range(1, rows + 1):
        y, v, _, _ = masked_fall(y0, v0, g, max_steps=min(r * every_k, max_steps))
        ys.append(y)
        vs.append(v)
    return np.array(ys), np.array(vs)


@pytest.mark.parametrize("k, every, max_steps", [(10, 1, 100), (8, 4, 90), (1, 1, 30), (25, 5, 40), (6, 4, 50)])
def test_record_every_k_steps(k, every, max_steps):
    y0, v0 = np.array([0.05, 0.3, 1.0, 2.5]), np.array([0.5, 0.0, -1.0, 2.0])
    r = simulate(fall, {"y": y0, "v": v0}, max_steps=max_steps, every=every, record=k)
    rows = -(-max_steps // k)
    ys, vs = masked_rows(y0, v0, k, rows, max_steps=max_steps)
    assert r.trajectory["y"].shape == (rows, 4)
    np.testing.assert_array_equal(r.trajectory["y"], ys)
    np.testing.assert_array_equal(r.trajectory["v"], vs)
    np.testing.assert_array_equal(r.trajectory["y"][-1], r.state["y"])
    np.testing.assert_array_equal(r.steps, masked_fall(y0, v0, max_steps=max_steps)[2])


@pytest.mark.parametrize("backend", ["numpy", "jax"])
def test_a_recorded_trajectory_is_differentiable(backend):
    """d/d(y0, v0) of sum(seed * trajectory) against central differences of the masked rows."""
    rng = np.random.default_rng(4)
    y0, v0 = rng.uniform(0.2, 1.0, 5), rng.uniform(-1.0, 1.0, 5)
    seed = rng.normal(size=(6, 5))

    @eagle.Graph.builder
    def traj(y0, v0):
        gr = eagle.Graph()
        r = simulate(fall, {"y": y0, "v": v0}, max_steps=60, record=10)
        gr.result = r.trajectory["y"]
        return gr

    with use_backend(backend):
        out, pull = eagle.vjp(traj, y0, v0)
        gy, gv = pull(seed)
        _, tan = eagle.jvp(traj, (y0, v0), (np.zeros(5), seed[0]))
    np.testing.assert_allclose(out, masked_rows(y0, v0, 10, 6, max_steps=60)[0], rtol=1e-13)
    h = 1e-7
    f = lambda a, b: (seed * masked_rows(a, b, 10, 6, max_steps=60)[0]).sum()   # noqa: E731
    fy = [(f(y0 + h * e, v0) - f(y0 - h * e, v0)) / (2 * h) for e in np.eye(5)]
    fv = [(f(y0, v0 + h * e) - f(y0, v0 - h * e)) / (2 * h) for e in np.eye(5)]
    np.testing.assert_allclose(gy, fy, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(gv, fv, rtol=1e-6, atol=1e-8)
    rows = lambda b: masked_rows(y0, b, 10, 6, max_steps=60)[0]                  # noqa: E731
    np.testing.assert_allclose(tan, (rows(v0 + h * seed[0]) - rows(v0 - h * seed[0])) / (2 * h), rtol=1e-6, atol=1e-8)


# ---------------------------------------------------------------------------------------------
# bad input: each a clear error at build, nothing written


def _msg(exc_type, fn):
    with pytest.raises(exc_type) as err:
        fn()
    return str(err.value)


def test_bad_input():
    y, v = np.ones(3), np.zeros(3)
    s = {"y": y, "v": v}
    m = _msg(ValueError, lambda: simulate(fall, s))
    assert "eagle_fx.simulate" in m and "max_steps" in m and "never returns" in m
    m = _msg(ValueError, lambda: simulate(fall, s, t_end=1.0))
    assert "t_end=1.0 without dt" in m
    m = _msg(ValueError, lambda: simulate(fall, s, max_steps=10, every=0))
    assert "every=0" in m
    m = _msg(ValueError, lambda: simulate(fall, s, max_steps=-1))
    assert "max_steps=-1" in m
    m = _msg(TypeError, lambda: simulate(lambda st, d: (st["y"],), s, max_steps=10))
    assert "returned (*,)" in m and "the state is {'y': *, 'v': *}" in m
    m = _msg(ValueError, lambda: simulate(fall, s, max_steps=10, until=lambda st: st["y"][:2] > 0))
    assert "until" in m and "shape (3,)" in m
    m = _msg(ValueError, lambda: simulate(fall, s, max_steps=10, until=lambda st: st["y"] * 2.0))
    assert "one bool per sample" in m
    m = _msg(TypeError, lambda: simulate(fall, {"y": y, "w": v}, max_steps=10))
    assert "takes y, v" in m and "keys are y, w" in m
    m = _msg(TypeError, lambda: simulate(_norm2, np.ones((2, 3)), max_steps=10))
    assert "no Terminated parameter" in m
    m = _msg(ValueError, lambda: simulate(fall, s, max_steps=10, record=lambda st: st["y"]))
    assert "record=<function" in m and "an int >= 1" in m
    m = _msg(ValueError, lambda: simulate(fall, s, max_steps=10_000, record=1))
    assert "records 10000 states; at most 512" in m
    m = _msg(ValueError, lambda: simulate(fall, {"y": np.ones(3), "v": np.ones(4)}, max_steps=10))
    assert "different sample counts" in m
    np.testing.assert_array_equal(y, 1.0)
    np.testing.assert_array_equal(v, 0.0)


def test_the_docs_page_runs_and_prints_what_it_says(tmp_path):
    """docs/simulate.md: its blocks run in order as one script, and each `print(...)  # text` line
    prints that text (up to the first `:`, where a comment goes on explaining)."""
    import pathlib
    import re
    import subprocess
    import sys
    root = pathlib.Path(__file__).resolve().parents[1]
    blocks = re.findall(r"```python\n(.*?)```", (root / "docs" / "simulate.md").read_text(), re.S)
    src = "\n".join(blocks)
    script = tmp_path / "simulate_page.py"
    script.write_text(src)
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                         env={**__import__("os").environ, "PYTHONPATH": str(root)})
    assert run.returncode == 0, run.stderr[-3000:]
    said = [m.group(1).split(":")[0].strip() for m in re.finditer(r"^print\(.*\)\s+# (.*)$", src, re.M)]
    printed = run.stdout.strip().splitlines()
    assert len(said) == len(printed)
    for want, got in zip(said, printed):
        assert " ".join(got.split()) == " ".join(want.split()), (want, got)
    assert "simulate.md" in (root / "mkdocs.yml").read_text()


# ---------------------------------------------------------------------------------------------
# stop events: the crossing refined, its time and the state at it differentiable (implicit
# function theorem); oracle: the closed form of a ball under constant gravity


@hawk.kernel
def ballistic(y: Mutable[Scalar], v: Mutable[Scalar], done: Terminated, dt: Scalar, g: Param):
    """The exact step under constant gravity, of any length dt (the refinement takes partial ones)."""
    y = y + v * dt - 0.5 * g * dt * dt
    v = v - g * dt


@hawk.kernel
def height(y: Scalar) -> Scalar:
    return y


@eagle.Graph.builder
def land(y0, v0, g):
    gr = eagle.Graph()
    r = simulate(lambda s, d, dt: ballistic(s["y"], s["v"], d, dt, g), {"y": y0, "v": v0},
                 event=lambda s: height(s["y"]), max_steps=1000, dt=0.01)
    gr.result = (r.t_event, r.state["v"])
    return gr


def landing_closed_form(y0, v0, g):
    """Landing time (v0 + s) / g and velocity -s, s = sqrt(v0^2 + 2 g y0), and their derivatives."""
    s = np.sqrt(v0 ** 2 + 2 * g * y0)
    t = (v0 + s) / g
    dt = {"y0": 1 / s, "v0": (1 + v0 / s) / g, "g": (y0 / s) / g - (v0 + s) / g ** 2}
    dv = {"y0": -g / s, "v0": -v0 / s, "g": -y0 / s}
    return t, -s, dt, dv


@pytest.mark.parametrize("backend", ["numpy", pytest.param("jax", marks=pytest.mark.slow), "fake-cuda"])
def test_landing_time_velocity_and_their_derivatives_against_the_closed_form(backend):
    """(On JAX, compiling the refinement's partial steps, with their jvp and vjp, takes tens of seconds: slow.)"""
    rng = np.random.default_rng(21)
    y0, v0, g = rng.uniform(0.1, 3.0, 7), rng.uniform(-2.0, 3.0, 7), np.array([9.81])
    t, v, dt, dv = landing_closed_form(y0, v0, 9.81)
    cy, cv = rng.normal(size=7), rng.normal(size=7)
    with use_backend(backend):
        te, ve = land(y0, v0, g)()
        _, pull = eagle.vjp(land, y0, v0, g)
        gy, gv, gg = pull((cy, cv))
        _, (tt, tv) = eagle.jvp(land, (y0, v0, g), (np.zeros(7), np.zeros(7), np.ones(1)))
    np.testing.assert_allclose(te, t, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(ve, v, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(gy, cy * dt["y0"] + cv * dv["y0"], rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(gv, cy * dt["v0"] + cv * dv["v0"], rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(gg, [(cy * dt["g"] + cv * dv["g"]).sum()], rtol=1e-8)
    np.testing.assert_allclose(tt, dt["g"], rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(tv, dv["g"], rtol=1e-8, atol=1e-10)


def test_a_sample_with_no_crossing_has_no_event_time():
    te, ve = land(np.array([1.0, 500.0]), np.zeros(2), np.array([9.81]))()
    assert np.isfinite(te[0]) and np.isnan(te[1])
    np.testing.assert_allclose(ve[1], -9.81 * 10.0, rtol=1e-12)     # 1000 steps of 0.01: still falling


@hawk.kernel
def bounce(y: Scalar, v: Scalar, e: Param):
    """The reset at the ground: on it exactly, the speed reversed and scaled by the restitution e."""
    return 0.0 * y, -e * v


@eagle.Graph.builder
def bounces(y0, v0, e):
    gr = eagle.Graph()
    state, total = {"y": y0, "v": v0}, None
    for _ in range(4):
        r = simulate(lambda s, d, dt: ballistic(s["y"], s["v"], d, dt, 9.81), state,
                     event=lambda s: height(s["y"]), max_steps=2000, dt=0.01)
        total = r.t_event if total is None else total + r.t_event
        y, v = bounce(r.state["y"], r.state["v"], e)
        state = {"y": y, "v": v}
    gr.result = total
    return gr


def test_a_bouncing_ball_over_four_bounces_with_resets():
    """The time of the fourth landing, t1 + 2 s (e + e^2 + e^3) / g, and its gradient."""
    g = 9.81
    y0, v0, e = np.array([1.0, 2.5]), np.array([0.0, 1.0]), np.array([0.8])
    s = np.sqrt(v0 ** 2 + 2 * g * y0)
    want = (v0 + s) / g + 2 * s * (e + e ** 2 + e ** 3) / g
    np.testing.assert_allclose(bounces(y0, v0, e)(), want, rtol=1e-10)
    gy, gv, ge = eagle.vjp(bounces, y0, v0, e)[1](np.ones(2))
    geo = 1 + 2 * (e + e ** 2 + e ** 3)
    np.testing.assert_allclose(gy, (g / s) * geo / g, rtol=1e-8)
    np.testing.assert_allclose(gv, (1 + v0 / s * geo) / g, rtol=1e-8)
    np.testing.assert_allclose(ge, [(2 * s * (1 + 2 * e + 3 * e ** 2) / g).sum()], rtol=1e-8)


def test_event_bad_input():
    s = {"y": np.ones(3), "v": np.zeros(3)}
    step = lambda st, d, dt: ballistic(st["y"], st["v"], d, dt, 9.81)      # noqa: E731
    m = _msg(ValueError, lambda: simulate(step, s, event=lambda st: height(st["y"]), max_steps=10))
    assert "event= without dt" in m
    m = _msg(ValueError, lambda: simulate(step, s, event=lambda st: st["y"] > 0.0, max_steps=10, dt=0.1))
    assert "event" in m and "one float per sample" in m and "dtype bool" in m
    m = _msg(ValueError, lambda: simulate(step, s, event=lambda st: np.stack([st["y"], st["v"]]), max_steps=10, dt=0.1))
    assert "shape (2, 3)" in m and "a plane of shape (3,)" in m
    m = _msg(TypeError, lambda: simulate(step, s, event=1.0, max_steps=10, dt=0.1))
    assert "event is float" in m


@pytest.mark.slow
def test_the_notebook_executes_and_prints_what_is_stored():
    """notebooks/run-until-done.ipynb checks its numbers with asserts (closed forms, finite
    differences, the implicit function theorem); re-run, it prints what is stored (numbers masked)."""
    import pathlib
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    from test_notebooks import stdout_by_cell
    root = pathlib.Path(__file__).resolve().parents[1]
    path = root / "notebooks" / "run-until-done.ipynb"
    stored, nb = nbformat.read(path, as_version=4), nbformat.read(path, as_version=4)
    nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                            resources={"metadata": {"path": str(root)}}).execute()
    assert stdout_by_cell(nb) == stdout_by_cell(stored)


@pytest.mark.slow
def test_to_jax_and_jax_grad_of_the_event_time():
    import jax
    import jax.numpy as jnp
    jax.config.update("jax_enable_x64", True)
    f = eagle.to_jax(land)
    y0, v0, g = np.array([1.0, 2.0, 0.4]), np.array([0.0, 1.5, -2.0]), np.array([9.81])
    t, _, dt, _ = landing_closed_form(y0, v0, 9.81)
    np.testing.assert_allclose(np.asarray(f(jnp.asarray(y0), jnp.asarray(v0), jnp.asarray(g))[0]), t, rtol=1e-12)
    grad = jax.jit(jax.grad(lambda a: f(a, jnp.asarray(v0), jnp.asarray(g))[0].sum()))(jnp.asarray(y0))
    np.testing.assert_allclose(np.asarray(grad), dt["y0"], rtol=1e-10)
