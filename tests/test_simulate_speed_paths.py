"""The fast paths of run-until-done on NumPy: a per-sample select as bit operations, the all_done
guard as one count, and simulate(compact=True), which packs the samples still running.

Oracles: np.where and np.all on the same arrays (compared bit for bit, NaN payloads and signed
zeros included), a hand-written masked NumPy loop of the step, and the plain (uncompacted) run
compared bit for bit on seeded random cases.
"""
from __future__ import annotations

import sys

import numpy as np
import pytest

import eagle_fx as eagle
import hawk_fx as hawk
import hawk_fx.math as hm
from eagle_fx import SimResult, compaction, simulate
from eagle_fx.backends.select import use_backend
from hawk_fx import Int32, Mutable, Param, Scalar, Terminated, Vector
from hawk_fx.roles import Role
from hawk_fx.emit import numpy as emit_numpy

DT = 0.01
SIM = sys.modules["eagle_fx.simulate"]      # the module (the package's `simulate` is the function)


def _source(kernel, *args):
    spec = kernel.specialize(kernel.layout_of(kernel.bind_arguments(args, {}))[0])
    return spec.compiled.source


def _bits(x):
    x = np.asarray(x)
    return x.view(np.uint8) if x.dtype == np.bool_ else x.view(f"u{x.dtype.itemsize}")


def _random_values(rng, dtype, shape):
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.random(shape) < 0.5
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)
    x = rng.standard_normal(shape).astype(dtype)
    flat = x.reshape(-1)
    specials = np.array([np.nan, -np.nan, np.inf, -np.inf, -0.0, 0.0], dtype)
    at = rng.integers(0, flat.size, min(flat.size, 12))
    flat[at] = specials[rng.integers(0, specials.size, at.size)]
    if flat.size > 1:        # a NaN with a payload of its own: the select keeps the bits, not just NaN-ness
        flat.view(f"u{dtype.itemsize}")[at[0]] = np.array([np.nan], dtype).view(f"u{dtype.itemsize}")[0] | 1
    return x


def _pick_kernel(dtype, shape=()):
    role = Role("P", shape, np.dtype(dtype))

    def pick(c, a, b):
        return hm.where(c, a, b)
    pick.__annotations__ = {"c": Scalar, "a": role, "b": role}
    return hawk.kernel(pick)


DTYPES = [np.float64, np.float32, np.float16, np.int64, np.int32, np.int16, np.int8, np.uint8, np.uint32, np.bool_]


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_bit_select_is_np_where_bit_for_bit(dtype):
    rng = np.random.default_rng(np.dtype(dtype).num)
    pick = _pick_kernel(dtype)
    for n in (1, 7, 1000):
        c = rng.random(n) < rng.random()
        a, b = _random_values(rng, dtype, n), _random_values(rng, dtype, n)
        got = pick(c, a, b)
        assert got.dtype == np.dtype(dtype)
        assert np.array_equal(_bits(got), _bits(np.where(c, a, b)))
    assert "bitwise_xor" in _source(pick, c, a, b)         # the fast path ran, not the copyto form


def test_the_bit_select_over_vector_planes_views_and_chunks():
    rng = np.random.default_rng(3)
    pick = _pick_kernel(np.float64, (3,))
    for n in (5, emit_numpy.CHUNK + 1000):                # one chunk, and chunks (views of the planes)
        c = rng.random(n) < 0.4
        a = _random_values(rng, np.float64, (3, 2 * n))[:, ::2]      # strided: a view, not a copy
        b = _random_values(rng, np.float64, (3, n))
        assert np.array_equal(_bits(pick(c, a, b)), _bits(np.where(c, a, b)))


def test_the_bit_select_under_vmap_with_shared_and_batched_operands():
    rng = np.random.default_rng(9)
    pick = _pick_kernel(np.float32)
    n, B = 30, 4

    @eagle.Graph.builder
    def both(c, a, b):
        g = eagle.Graph()
        g.result = pick(c, a, b)
        return g
    C, A = rng.random((B, n)) < 0.5, _random_values(rng, np.float32, (B, n))
    b = _random_values(rng, np.float32, n)
    for axes, args, want in (((0, 0, None), (C, A, b), np.where(C, A, b[None])),
                             ((None, 0, None), (C[0], A, b), np.where(C[0][None], A, b[None])),
                             ((0, None, None), (C, A[0], b), np.where(C, A[0][None], b[None]))):
        got = np.asarray(eagle.vmap(both, in_axes=axes)(*args)())
        assert got.shape == (B, n) and np.array_equal(_bits(got), _bits(want)), axes


def test_selects_that_keep_the_plain_form_agree_with_np_where():
    """A float mark, a number operand, mixed dtypes: not the bit form, the same values."""
    rng = np.random.default_rng(4)
    n = 50

    @hawk.kernel
    def mixed(c: Scalar, a: Scalar, b: Int32):
        return hm.where(c, a, b), hm.where(c > 0.5, 0.0, a), hm.where(c > 0.5, a, b)

    c, a = rng.random(n), rng.standard_normal(n)
    b = rng.integers(-5, 5, n).astype(np.int32)
    r = mixed(c, a, b)
    want = (np.where(c, a, b), np.where(c > 0.5, 0.0, a), np.where(c > 0.5, a, b))
    for got, w in zip(r, want):
        assert got.dtype == w.dtype and np.array_equal(_bits(got), _bits(w))


F32 = Role("F32", (), np.dtype(np.float32))


@hawk.kernel
def mixed_step(x: Mutable[Scalar], k: Mutable[Int32], p: Mutable[Vector[2]], f: Mutable[F32], done: Terminated,
               h: Param):
    x = x * 0.5 + p[0] * h
    k = k + 3
    p = hm.vec(p[1], -p[0])
    f = f * np.float32(1.5)
    done = x > 1.0


def test_a_terminated_kernel_against_a_masked_numpy_update():
    rng = np.random.default_rng(5)
    for trial in range(20):
        n = int(rng.integers(1, 200))
        x, k = rng.standard_normal(n) * 3, rng.integers(-9, 9, n).astype(np.int32)
        p, f = rng.standard_normal((2, n)), rng.standard_normal(n).astype(np.float32)
        done = rng.random(n) < rng.random()
        h = float(rng.standard_normal())
        want_x = np.where(done, x, x * 0.5 + p[0] * h)
        want_k = np.where(done, k, k + np.int32(3))
        want_p = np.where(done, p, np.stack([p[1], -p[0]]))
        want_f = np.where(done, f, f * np.float32(1.5))
        want_done = done | (want_x > 1.0) & ~done
        args = [x.copy(), k.copy(), p.copy(), f.copy(), done.copy()]
        mixed_step(*args, h)
        for got, want in zip(args, (want_x, want_k, want_p, want_f, want_done)):
            assert got.dtype == want.dtype and np.array_equal(_bits(got), _bits(want)), trial


@hawk.kernel
def shared_values(c: Scalar, x: Scalar, y: Mutable[Scalar]):
    b = x * 2.0
    s1 = hm.where(c, x, b)          # b read again below: a fresh buffer
    s2 = hm.where(c, b, b)          # the same value twice
    s3 = hm.where(c, s1, x + 1.0)   # written over its new value
    y = hm.where(c, y, x)           # the old value of a Mutable that may be x's own array
    return s1 + b, s2, s3


def test_bit_selects_over_shared_buffers_and_aliased_arguments():
    rng = np.random.default_rng(10)
    for n in (3, 257):
        c, x = rng.random(n) < 0.5, _random_values(rng, np.float64, n)
        b = x * 2.0
        s1 = np.where(c, x, b)
        want = (s1 + b, b, np.where(c, s1, x + 1.0))
        y = rng.standard_normal(n)
        want_y = np.where(c, y, x)
        got = shared_values(c, x, y)
        for g, w in zip(got + (y,), want + (want_y,)):
            assert np.array_equal(_bits(g), _bits(w))
        z = x.copy()                                   # y and x one array: each read before any write
        shared_values(c, z, z)
        assert np.array_equal(_bits(z), _bits(np.where(c, x, x)))
    src = _source(shared_values, c, x, y)
    assert "bitwise_xor" in src and "where=" not in src        # every select (4) in the bit form


@pytest.mark.parametrize("dtype", [np.bool_, np.float64, np.int32])
def test_all_done_is_np_all(dtype):
    rng = np.random.default_rng(6)
    for n in (0, 1, 2, 9, 300):
        for frac in (0.0, 0.5, 0.99, 1.0):
            x = (rng.random(n) < frac).astype(dtype)
            if dtype == np.float64 and n:
                x[x != 0] = rng.choice([1.0, -2.5, np.nan, np.inf], int(np.count_nonzero(x)))
            got = hawk.all_done(x)
            assert got.dtype == np.uint32 and int(got[0]) == int(np.all(x != 0)), (n, frac)


# -- compaction ------------------------------------------------------------------------------------

@hawk.kernel
def fall(y: Mutable[Scalar], v: Mutable[Scalar], done: Terminated):
    v = v - 9.81 * 0.01
    y = y + v * 0.01
    done = y < 0.0


@hawk.kernel
def spiral(p: Mutable[Vector[2]], done: Terminated, w: Param):
    p = hm.vec(p[0] - w * p[1], p[1] + w * p[0]) * 0.99


@hawk.kernel
def height(y: Scalar) -> Scalar:
    return y


def masked_fall(y, v, max_steps, code=SimResult.BUDGET):
    """The oracle: the fall as a masked NumPy loop; (y, v, steps, status)."""
    y, v = np.array(y, float), np.array(v, float)
    done = np.zeros(y.shape, bool)
    steps = np.zeros(y.shape, np.int32)
    status = np.full(y.shape, code)
    for _ in range(max_steps):
        if done.all():
            break
        active = ~done
        vn = v - 9.81 * DT
        yn = y + vn * DT
        v, y = np.where(active, vn, v), np.where(active, yn, y)
        steps += active
        hit = active & (yn < 0.0)
        status[hit] = SimResult.FINISHED
        done |= hit
    return y, v, steps, status


def _same(a: SimResult, b: SimResult):
    for f in ("steps", "status", "finished", "t"):
        x, y = getattr(a, f), getattr(b, f)
        if x is None or y is None:
            assert x is None and y is None, f
            continue
        assert x.dtype == y.dtype and x.shape == y.shape and np.array_equal(_bits(x), _bits(y)), f
    la, lb = SIM._leaves_of(a.state), SIM._leaves_of(b.state)
    assert la[1] == lb[1]
    for x, y in zip(la[0], lb[0]):
        assert x.dtype == y.dtype and x.shape == y.shape and np.array_equal(_bits(x), _bits(y))


@pytest.fixture
def small_segments(monkeypatch):
    """Pack down to a few samples, so that small runs go through many segments."""
    monkeypatch.setattr(compaction, "MIN_SAMPLES", 2)


def test_compaction_gives_the_plain_run_bit_for_bit(small_segments):
    rng = np.random.default_rng(7)
    for trial in range(12):
        n = int(rng.integers(1, 120))
        y0 = np.exp(rng.normal(0.0, 1.0, n)) * rng.choice([1.0, 10.0])
        v0 = rng.standard_normal(n)
        kw = dict(max_steps=int(rng.integers(0, 400)), every=int(rng.choice([1, 3, 16])))
        if rng.random() < 0.4:
            kw.update(t_end=float(rng.uniform(0.0, 3.0)), dt=DT)
        state = {"y": y0, "v": v0} if trial % 2 else {"v": v0, "y": y0}
        before = {k: x.copy() for k, x in state.items()}
        plain = simulate(fall, state, **kw)
        packed = simulate(fall, state, compact=True, **kw)
        _same(plain, packed)
        for k in state:
            assert np.array_equal(state[k], before[k])            # the caller's arrays are not written
        if not kw.get("t_end"):
            y, v, steps, status = masked_fall(y0, v0, kw["max_steps"])
            assert np.array_equal(packed.state["y"], y) and np.array_equal(packed.state["v"], v)
            assert np.array_equal(packed.steps, steps) and np.array_equal(packed.status, status)


def test_compaction_segments_shrink(small_segments, monkeypatch):
    """The segments run over fewer and fewer samples: the finished ones leave the planes."""
    sim = SIM
    sizes = []
    real = sim._run

    def spy(cfg, state):
        sizes.append(sim._leaves_of(state)[0][0].shape[-1])
        return real(cfg, state)
    monkeypatch.setattr(sim, "_run", spy)
    n = 64
    y0 = 0.5 * 9.81 * (np.linspace(10, 200, n) * DT) ** 2          # landing steps spread 10..200
    packed = simulate(fall, {"y": y0, "v": np.zeros(n)}, max_steps=500, compact=True)
    assert sizes[0] == n and len(sizes) >= 4 and all(b <= a // 2 for a, b in zip(sizes, sizes[1:]))
    y, v, steps, status = masked_fall(y0, np.zeros(n), 500)
    assert np.array_equal(packed.steps, steps) and np.array_equal(packed.state["y"], y)


def test_compaction_of_a_vector_state_a_tuple_and_until(small_segments):
    rng = np.random.default_rng(8)
    for trial in range(6):
        n = int(rng.integers(2, 80))
        p0 = rng.standard_normal((2, n)) * rng.uniform(1, 5, n)
        w = float(rng.uniform(0.01, 0.3))

        def until(s):
            return height(s[0][0] * s[0][0] + s[0][1] * s[0][1]) < 0.5

        def step(s, done):
            spiral(s[0], done, w)
        kw = dict(until=until, max_steps=int(rng.integers(1, 300)), every=int(rng.choice([1, 4])))
        _same(simulate(step, (p0,), **kw), simulate(step, (p0,), compact=True, **kw))


def test_compaction_refusals():
    y, v = np.array([1.0, 2.0]), np.zeros(2)
    st = {"y": y, "v": v}
    with pytest.raises(TypeError, match="compact='yes'"):
        simulate(fall, st, max_steps=5, compact="yes")
    with pytest.raises(ValueError, match="compact=True with record="):
        simulate(fall, st, max_steps=5, record=1, compact=True)
    with pytest.raises(ValueError, match="compact=True with event="):
        simulate(lambda s, d, dt: None, st, max_steps=5, dt=0.1, event=lambda s: height(s["y"]), compact=True)
    with pytest.raises(ValueError, match="compact=True with key="):
        simulate(lambda s, d, k: None, st, max_steps=5, key=1, compact=True)

    @eagle.Graph.builder
    def inside(y, v):
        g = eagle.Graph()
        g.result = simulate(fall, {"y": y, "v": v}, max_steps=5, compact=True).steps
        return g
    with pytest.raises(ValueError, match="compact=True inside a builder"):
        inside(y, v)
    with use_backend("fake-cuda"), pytest.raises(ValueError, match="compact=True under use_backend"):
        simulate(fall, st, max_steps=5, compact=True)
    jnp = pytest.importorskip("jax.numpy")
    with pytest.raises(TypeError, match="compact=True packs NumPy planes"):
        simulate(fall, {"y": jnp.asarray(y), "v": jnp.asarray(v)}, max_steps=5, compact=True)


@hawk.kernel
def fall_drag(y: Mutable[Scalar], v: Mutable[Scalar], done: Terminated, c: Scalar):
    v = v - (9.81 + c * v) * 0.01
    y = y + v * 0.01
    done = y < 0.0


def test_a_plane_from_outside_the_state_is_refused_once_packed(small_segments):
    n = 40
    y0 = 0.5 * 9.81 * (np.linspace(10, 200, n) * DT) ** 2
    drag = np.linspace(0.0, 0.1, n)

    def step(s, done):
        fall_drag(s["y"], s["v"], done, drag)
    with pytest.raises(ValueError, match="put it in the state, or drop compact"):
        simulate(step, {"y": y0, "v": np.zeros(n)}, max_steps=500, compact=True)
