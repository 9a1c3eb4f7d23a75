"""eagle_fx.collect: a device loop's value kept per turn, stacked (rows, ..., n) as lax.scan stacks.

Oracles: a plain NumPy loop (values), central differences and jax.grad / jax.jvp of the same math
written with lax.fori_loop and a zeros buffer (derivatives), per-instance runs (vmap)."""
import warnings

import numpy as np
import pytest

import hawk_fx as hawk
import hawk_fx.math as hm
from hawk_fx.roles import Mutable, Scalar, Terminated, UInt32, Vector

import eagle_fx as eagle
from eagle_fx.backends.select import use_backend


@hawk.kernel
def advance(x: Scalar, a: Scalar):
    return hm.sin(x) * a + 0.1 * x


@hawk.kernel
def emit(x: Scalar, a: Scalar):
    return x * x + a


@hawk.kernel
def tick(c: Scalar):
    return c + 1.0


@hawk.kernel
def more(c: Scalar, lim: Scalar, flag: Mutable[UInt32]):
    flag = hm.uint32(hawk.sum(c < lim))


@eagle.Graph.builder(static_argnames=("cap",))
def capped(x, a, c, lim, flag, cap):
    g = eagle.Graph()
    for _ in range(cap):
        if not flag:
            break
        x = advance(x, a)
        ys = eagle.collect(emit(x, a))
        c = tick(c)
        more(c, lim, flag)
    g.result = ys
    return g


@eagle.Graph.builder(static_argnames=("rows",))
def counted(x, a, n, rows):
    g = eagle.Graph()
    for i in range(n):
        x = advance(x, a)
        ys = eagle.collect(emit(x, a), rows=rows)
    g.result = ys
    return g


@eagle.Graph.builder(static_argnames=("rows",))
def uncapped(x, a, c, lim, flag, rows):
    g = eagle.Graph()
    while flag:
        x = advance(x, a)
        ys = eagle.collect(emit(x, a), rows=rows)
        c = tick(c)
        more(c, lim, flag)
    g.result = ys
    return g


@eagle.Graph.builder
def two_collects(x, a, flag, c, lim):
    """Two stacks from one loop, and the loop's carry after it."""
    g = eagle.Graph()
    for _ in range(5):
        if not flag:
            break
        x = advance(x, a)
        xs = eagle.collect(x)
        ys = eagle.collect(emit(x, a))
        c = tick(c)
        more(c, lim, flag)
    g.result = (xs, ys, x)
    return g


def oracle(x, a, turns, rows):
    """The plain loop: row t is x*x + a after t + 1 steps; rows past the turns are zeros."""
    ys = np.zeros((rows,) + x.shape)
    for t in range(turns):
        x = np.sin(x) * a + 0.1 * x
        if t < rows:
            ys[t] = x * x + a
    return ys


def _cell(v):
    return np.array([v], np.uint32)


def run(kind, x, a, turns, cap_or_rows):
    """The stack from the `kind` loop running `turns` turns (capped: at most its cap)."""
    n = x.shape[-1]
    if kind == "capped":
        return capped(x, a, np.zeros(n), np.full(n, float(turns)), _cell(turns > 0), cap=cap_or_rows)()
    if kind == "counted":
        return counted(x, a, _cell(turns), rows=cap_or_rows)()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", eagle.UncappedLoopWarning)
        return uncapped(x, a, np.zeros(n), np.full(n, float(turns)), _cell(turns > 0), rows=cap_or_rows)()


@pytest.mark.parametrize("kind", ["capped", "counted", "uncapped"])
def test_values_against_a_plain_loop(kind):
    """A seeded sweep of turn counts around the cap / rows: below, at, past."""
    rng = np.random.default_rng({"capped": 1, "counted": 2, "uncapped": 3}[kind])
    for _ in range(8):
        bound = int(rng.integers(1, 7))
        turns = int(rng.integers(0, bound + 3))
        n = int(rng.integers(1, 5))
        x, a = rng.uniform(-1, 1, n), rng.uniform(0.2, 1.2, n)
        got = run(kind, x, a, turns, bound)
        ran = min(turns, bound) if kind == "capped" else turns
        assert got.shape == (bound, n)
        np.testing.assert_allclose(got, oracle(x, a, ran, bound), rtol=1e-14, atol=0)
        if ran:     # as plain Python (no turn: the name stays unbound), a NumPy buffer per collect
            with eagle.disable_staging():
                plain = run(kind, x, a, turns, bound)
            np.testing.assert_allclose(plain, oracle(x, a, ran, bound), rtol=1e-14, atol=0)


def test_numpy_and_jax_agree():
    rng = np.random.default_rng(5)
    x, a = rng.uniform(-1, 1, 4), rng.uniform(0.2, 1.2, 4)
    for kind, turns, bound in [("capped", 3, 6), ("counted", 5, 4), ("uncapped", 2, 5)]:
        with use_backend("numpy"):
            a_np = run(kind, x, a, turns, bound)
        with use_backend("jax"):
            a_jx = run(kind, x, a, turns, bound)
        np.testing.assert_allclose(np.asarray(a_jx), a_np, rtol=1e-14, atol=0)


def test_two_stacks_and_the_carry():
    rng = np.random.default_rng(6)
    x, a = rng.uniform(-1, 1, 3), rng.uniform(0.2, 1.2, 3)
    xs, ys, last = two_collects(x, a, _cell(1), np.zeros(3), np.full(3, 3.0))()
    want_x = np.zeros((5, 3))
    v = x.copy()
    for t in range(3):
        v = np.sin(v) * a + 0.1 * v
        want_x[t] = v
    np.testing.assert_allclose(xs, want_x, rtol=1e-14)
    np.testing.assert_allclose(ys, oracle(x, a, 3, 5), rtol=1e-14)
    np.testing.assert_allclose(last, v, rtol=1e-14)


# ---------------------------------------------------------------------------------------------
# derivatives: reverse and forward mode against central differences and JAX on the same math

def _fd(f, x, h=1e-6):
    out = []
    for e in np.eye(x.size):
        out.append((f(x + h * e) - f(x - h * e)) / (2 * h))
    return np.array(out)


@pytest.mark.parametrize("backend", ["numpy", "jax"])
@pytest.mark.parametrize("kind", ["capped", "counted", "uncapped"])
def test_reverse_and_forward_mode(backend, kind):
    rng = np.random.default_rng(7)
    n, bound, turns = 3, 5, 4
    x, a = rng.uniform(-1, 1, n), rng.uniform(0.2, 1.2, n)
    w = rng.normal(size=(bound, n))
    if kind == "capped":
        f, rest = capped, dict(cap=bound)
        args = lambda x, a: (x, a, np.zeros(n), np.full(n, float(turns)), _cell(1))  # noqa: E731
    elif kind == "counted":
        f, rest = counted, dict(rows=bound)
        args = lambda x, a: (x, a, _cell(turns))  # noqa: E731
    else:
        f, rest = uncapped, dict(rows=bound)
        args = lambda x, a: (x, a, np.zeros(n), np.full(n, float(turns)), _cell(1))  # noqa: E731
    with use_backend(backend), warnings.catch_warnings():
        warnings.simplefilter("ignore", eagle.UncappedLoopWarning)
        out, pull = eagle.vjp(lambda *s: f(*s, **rest), *args(x, a))
        cts = pull(w)
        tx = rng.normal(size=n)
        _, tan = eagle.jvp(lambda *s: f(*s, **rest), args(x, a), (tx, np.zeros(n)) + (None,) * (len(args(x, a)) - 2))
    loss = lambda x, a: (w * oracle(x, a, turns, bound)).sum()   # noqa: E731
    np.testing.assert_allclose(np.asarray(out), oracle(x, a, turns, bound), rtol=1e-14)
    np.testing.assert_allclose(cts[0], _fd(lambda v: loss(v, a), x), rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(cts[1], _fd(lambda v: loss(x, v), a), rtol=1e-6, atol=1e-8)
    h = 1e-6
    fd_t = (oracle(x + h * tx, a, turns, bound) - oracle(x - h * tx, a, turns, bound)) / (2 * h)
    np.testing.assert_allclose(np.asarray(tan), fd_t, rtol=1e-6, atol=1e-8)


def test_against_jax_fori_loop_and_scan():
    """The same math in JAX: a zeros buffer written with .at[t].set in lax.fori_loop, and lax.scan."""
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
    from jax import lax
    rng = np.random.default_rng(8)
    n, cap, turns = 4, 6, 6
    x, a = rng.uniform(-1, 1, n), rng.uniform(0.2, 1.2, n)
    w = rng.normal(size=(cap, n))

    def jax_fori(x, a):
        def body(t, s):
            x, buf = s
            x = jnp.sin(x) * a + 0.1 * x
            return x, buf.at[t].set(x * x + a)
        return lax.fori_loop(0, turns, body, (x, jnp.zeros((cap, n))))[1]

    def jax_scan(x, a):
        def body(x, _):
            x = jnp.sin(x) * a + 0.1 * x
            return x, x * x + a
        return lax.scan(body, x, None, length=turns)[1]

    out, pull = eagle.vjp(lambda x, a: capped(x, a, np.zeros(n), np.full(n, float(turns)), _cell(1), cap=cap), x, a)
    gx, ga = pull(w)
    np.testing.assert_allclose(out, jax_scan(x, a), rtol=1e-14)
    for fn in (jax_fori, jax_scan):
        jx, ja = jax.grad(lambda x, a: (w * fn(x, a)).sum(), argnums=(0, 1))(x, a)
        np.testing.assert_allclose(gx, jx, rtol=1e-12)
        np.testing.assert_allclose(ga, ja, rtol=1e-12)


def test_checkpointed_reverse_matches_the_stored_one():
    rng = np.random.default_rng(9)
    n, cap = 3, 6
    x, a = rng.uniform(-1, 1, n), rng.uniform(0.2, 1.2, n)
    w = rng.normal(size=(cap, n))
    f = lambda x, a: capped(x, a, np.zeros(n), np.full(n, 5.0), _cell(1), cap=cap)   # noqa: E731
    stored = eagle.vjp(f, x, a)[1](w)
    kept = eagle.vjp(f, x, a, checkpoints=2)[1](w)
    np.testing.assert_allclose(kept[0], stored[0], rtol=1e-13)
    np.testing.assert_allclose(kept[1], stored[1], rtol=1e-13)


@pytest.mark.parametrize("backend", ["numpy", "jax"])
def test_vmap_gives_each_instance_its_rows(backend):
    """Instances stop at their own turns (a per-instance guard): each reads its own rows."""
    rng = np.random.default_rng(10)
    B, n, cap = 3, 2, 6
    X, a = rng.uniform(-1, 1, (B, n)), rng.uniform(0.2, 1.2, n)
    lims = np.array([[1.0, 1.0], [4.0, 4.0], [9.0, 9.0]])
    flags = np.ones((B, 1), np.uint32)
    with use_backend(backend):
        got = eagle.vmap(lambda x, lim, flag: capped(x, a, np.zeros(n), lim, flag, cap=cap),
                         in_axes=(0, 0, 0))(X, lims, flags)
    for b in range(B):
        np.testing.assert_allclose(np.asarray(got)[b], oracle(X[b], a, min(int(lims[b, 0]), cap), cap), rtol=1e-14)


@hawk.kernel
def step1(x: Scalar, a: Scalar):
    return hm.sin(x) * a + 1.0


@hawk.kernel
def sumsq4(x: Vector[4]):
    return hawk.sum(x[0] * x[0] + x[1] * x[1] + x[2] * x[2] + x[3] * x[3])


@eagle.Graph.builder
def nested(x, a, on):
    """A stack of stacks: the inner loop's rows collected by the outer loop, (3, 4, n)."""
    g = eagle.Graph()
    for _ in range(3):
        if not on:
            break
        for _ in range(4):
            if not on:
                break
            x = step1(x, a)
            ys = eagle.collect(x)
        zs = eagle.collect(ys)
    g.result = zs
    return g


@eagle.Graph.builder
def stacked_loss(x, a, on):
    g = eagle.Graph()
    for _ in range(4):
        if not on:
            break
        x = step1(x, a)
        ys = eagle.collect(x)
    g.result = sumsq4(ys)
    return g


def _steps(x, a, k):
    out = []
    for _ in range(k):
        x = np.sin(x) * a + 1.0
        out.append(x)
    return np.array(out)


def test_nested_loops_stack_their_stacks_and_differentiate():
    rng = np.random.default_rng(12)
    x, a = rng.uniform(-1, 1, 2), rng.uniform(0.2, 1.2, 2)
    w = rng.normal(size=(3, 4, 2))
    out, pull = eagle.vjp(nested, x, a, _cell(1))
    np.testing.assert_allclose(out, _steps(x, a, 12).reshape(3, 4, 2), rtol=1e-14)
    with eagle.disable_staging():
        np.testing.assert_allclose(nested(x, a, _cell(1))(), out, rtol=1e-14)
    gx, ga = pull(w)[:2]
    loss = lambda x, a: (w * _steps(x, a, 12).reshape(3, 4, 2)).sum()   # noqa: E731
    np.testing.assert_allclose(gx, _fd(lambda v: loss(v, a), x), rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(ga, _fd(lambda v: loss(x, v), a), rtol=1e-6, atol=1e-8)


def test_vmap_of_grad_of_a_collected_loss():
    rng = np.random.default_rng(13)
    X, a = rng.uniform(-1, 1, (3, 2)), rng.uniform(0.2, 1.2, 2)
    got = eagle.vmap(eagle.grad(lambda x, a: stacked_loss(x, a, _cell(1))), in_axes=(0, None))(X, a)
    for b in range(3):
        loss = lambda v: (_steps(v, a, 4) ** 2).sum()   # noqa: E731
        np.testing.assert_allclose(np.asarray(got)[b], _fd(loss, X[b]), rtol=1e-6, atol=1e-8)


# ---------------------------------------------------------------------------------------------
# refusals: each names the API and the builder's line

@eagle.Graph.builder
def _outside(x, a):
    g = eagle.Graph()
    g.result = eagle.collect(advance(x, a))
    return g


@eagle.Graph.builder
def _python_loop(x, a):
    g = eagle.Graph()
    for _ in range(3):
        x = advance(x, a)
        ys = eagle.collect(x)
    g.result = ys
    return g


@eagle.Graph.builder
def _counted_without_rows(x, a, n):
    g = eagle.Graph()
    for i in range(n):
        x = advance(x, a)
        ys = eagle.collect(x)
    g.result = ys
    return g


@eagle.Graph.builder
def _under_an_if(x, a, flag, pick):
    g = eagle.Graph()
    for _ in range(3):
        if not flag:
            break
        x = advance(x, a)
        if pick:
            ys = eagle.collect(x)
    g.result = x
    return g


def test_refusals():
    x, a = np.ones(2), np.ones(2)
    with pytest.raises(TypeError, match=r"eagle_fx.collect at _outside:4: not inside a device loop"):
        _outside(x, a)
    with pytest.raises(TypeError, match=r"eagle_fx.collect at _python_loop:4: in a Python loop .* np.stack"):
        _python_loop(x, a)
    with pytest.raises(ValueError, match=r"eagle_fx.collect at _counted_without_rows:6: a counted device loop .* "
                                         r"give rows=R"):
        _counted_without_rows(x, a, _cell(2))
    with pytest.raises(TypeError, match=r"eagle_fx.collect at _under_an_if:9: called under a device if"):
        _under_an_if(x, a, _cell(1), _cell(1))
    with pytest.raises(TypeError, match="eagle_fx.collect: called outside a builder"):
        eagle.collect(x)
    with eagle.disable_staging():
        with pytest.raises(TypeError, match=r"eagle_fx.collect: in a Python loop .* np.stack"):
            _python_loop(x, a)()
        with pytest.raises(ValueError, match=r"eagle_fx.collect: a counted device loop .* give rows=R"):
            _counted_without_rows(x, a, _cell(2))()
        with pytest.raises(TypeError, match=r"eagle_fx.collect: not inside a device loop"):
            _outside(x, a)()


def test_fake_cuda_agrees_with_numpy(nvrtc):
    """The CUDA lowering (NVRTC-compiled, run on the fake device): values and the reverse."""
    from eagle_fx.testing import fake_cuda  # noqa: F401
    rng = np.random.default_rng(11)
    n, cap = 3, 5
    x, a = rng.uniform(-1, 1, n), rng.uniform(0.2, 1.2, n)
    w = rng.normal(size=(cap, n))
    f = lambda x, a: capped(x, a, np.zeros(n), np.full(n, 3.0), _cell(1), cap=cap)   # noqa: E731
    with use_backend("fake-cuda"):
        out, pull = eagle.vjp(f, x, a)
        gx, ga = pull(w)
    np.testing.assert_allclose(np.asarray(out), oracle(x, a, 3, cap), rtol=1e-14)
    loss = lambda x, a: (w * oracle(x, a, 3, cap)).sum()   # noqa: E731
    np.testing.assert_allclose(gx, _fd(lambda v: loss(v, a), x), rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(ga, _fd(lambda v: loss(x, v), a), rtol=1e-6, atol=1e-8)


def test_fake_cuda_refuses_rows_per_instance(nvrtc):
    from eagle_fx.testing import fake_cuda  # noqa: F401
    with use_backend("fake-cuda"), pytest.raises(NotImplementedError, match=r"collect \(capped:8\) under vmap"):
        eagle.vmap(lambda x, flag: capped(x, np.ones(2), np.zeros(2), np.full(2, 2.0), flag, cap=3),
                   in_axes=(0, 0))(np.ones((2, 2)), np.ones((2, 1), np.uint32))


def test_the_reverse_saves_no_rows_per_turn():
    """The stored reverse pushes the loop's state per turn, never the (rows, n) buffer."""
    from eagle_fx import ir

    def pushes(prog):
        for e in prog.eqns:
            if e.prim is ir.stack_push_p:
                yield tuple(e.inputs[2].aval.shape)
        for q in prog.subprograms():
            yield from pushes(q)

    prog = eagle.make_program(eagle.grad(lambda x, a: stacked_loss(x, a, _cell(1))))(np.ones(2), np.ones(2))
    shapes = list(pushes(prog))
    assert shapes and all(s == (2,) for s in shapes), shapes


def test_to_jax_jits_and_differentiates_a_collect():
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    rng = np.random.default_rng(14)
    n, cap, turns = 3, 6, 4
    x, a = rng.uniform(-1, 1, n), rng.uniform(0.2, 1.2, n)
    w = rng.normal(size=(cap, n))
    f = eagle.to_jax(lambda x, a: capped(x, a, np.zeros(n), np.full(n, float(turns)), _cell(1), cap=cap))
    np.testing.assert_allclose(np.asarray(jax.jit(f)(x, a)), oracle(x, a, turns, cap), rtol=1e-14)
    gx = jax.grad(lambda x: (w * f(x, a)).sum())(x)
    np.testing.assert_allclose(np.asarray(gx), _fd(lambda v: (w * oracle(v, a, turns, cap)).sum(), x),
                               rtol=1e-6, atol=1e-8)


# ---------------------------------------------------------------------------------------------
# simulate(record=K) is built on collect: per-instance rows under vmap, a bound shorter than K

@hawk.kernel
def _fall(y: Mutable[Scalar], v: Mutable[Scalar], done: Terminated):
    v = v - 9.81 * 0.01
    y = y + v * 0.01
    done = y < 0.0


def _fall_rows(y, v, every_k, steps):
    """A masked NumPy loop: y after K, 2K, ... steps (and after `steps`), a landed sample kept."""
    y, v = np.array(y, float), np.array(v, float)
    done = np.zeros(y.shape, bool)
    rows = []
    for s in range(1, steps + 1):
        vn, yn = v - 9.81 * 0.01, y + (v - 9.81 * 0.01) * 0.01
        v, y = np.where(done, v, vn), np.where(done, y, yn)
        done |= y < 0.0
        if s % every_k == 0 or s == steps:
            rows.append(y.copy())
    return np.array(rows)


@pytest.mark.parametrize("backend", ["numpy", "jax"])
def test_simulate_records_each_instance_under_vmap(backend):
    Y, v0 = np.array([[0.05, 0.3, 1.0], [0.5, 0.8, 2.0]]), np.array([0.5, 0.0, -1.0])

    @eagle.Graph.builder
    def traj(y0, v0):
        g = eagle.Graph()
        g.result = eagle.simulate(_fall, {"y": y0, "v": v0}, max_steps=45, record=10).trajectory["y"]
        return g

    with use_backend(backend):
        out = np.asarray(eagle.vmap(traj, in_axes=(0, None))(Y, v0)())
    for b in range(2):
        np.testing.assert_allclose(out[b], _fall_rows(Y[b], v0, 10, 45), rtol=1e-13, atol=1e-15)


def test_simulate_with_a_bound_shorter_than_one_row():
    y0, v0 = np.array([0.02, 1.0]), np.array([0.0, 0.0])
    r = eagle.simulate(_fall, {"y": y0, "v": v0}, max_steps=7, record=10)
    assert r.trajectory["y"].shape == (1, 2)
    np.testing.assert_allclose(r.trajectory["y"], _fall_rows(y0, v0, 10, 7), rtol=1e-14)
