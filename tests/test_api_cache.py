"""Cached staging of transformed functions (the jax.jit contract): a call with a layout seen before
replays its graph; a new shape, dtype, static value or a longer counted loop stages again. Every
value is checked against NumPy finite differences or a closed form, not against an earlier call."""
import numpy as np
import pytest

import eagle_fx as ef
from eagle_fx.transforms.program import TransformError
import hawk_fx as hawk
from hawk_fx import Param, Scalar
from tour_kernels import add, cell, loss, total, wobble


def numpy_loss(x, flag, n):
    if flag:
        x = np.sin(x) * x
    for _ in range(n):
        x = 1.1 * x + 0.1 * np.tanh(x)
    return np.sum(x * x)


def fd_grad(x, flag, n, eps=1e-6):
    return np.array([(numpy_loss(x + e, flag, n) - numpy_loss(x - e, flag, n)) / (2 * eps)
                     for e in np.eye(x.size) * eps])


@pytest.fixture(autouse=True)
def fresh():
    ef.clear_caches()
    yield
    ef.clear_caches()


def test_hits_replay_with_the_new_values_and_return_fresh_arrays():
    x1, x2 = np.linspace(-1.0, 1.2, 7), np.linspace(0.3, -0.8, 7)
    f = ef.grad(loss)
    g1 = f(x1, cell(1), cell(3))
    g2 = ef.grad(loss)(x2, cell(1), cell(3))          # made again: the same cache
    g3 = f(x1, cell(0), cell(3))                      # a cell is an array: its value is not static
    assert f.cache_info()[:3] == (2, 1, 1)
    np.testing.assert_allclose(g1, fd_grad(x1, 1, 3), rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(g2, fd_grad(x2, 1, 3), rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(g3, fd_grad(x1, 0, 3), rtol=1e-6, atol=1e-8)
    before = g2.copy()
    g1[:] = 99.0                                      # results are the caller's own arrays
    np.testing.assert_array_equal(g2, before)


def test_the_callers_arrays_are_neither_written_nor_kept():
    x = np.linspace(-1.0, 1.2, 7)
    keep = x.copy()
    f = ef.grad(loss)
    f(x, cell(1), cell(2))
    np.testing.assert_array_equal(x, keep)
    x[:] = 0.5                                        # changing it afterwards changes nothing staged
    y = np.linspace(0.1, 0.9, 7)
    np.testing.assert_allclose(f(y, cell(1), cell(2)), fd_grad(y, 1, 2), rtol=1e-6, atol=1e-8)


def test_new_shape_dtype_or_static_value_stages_again():
    f = ef.grad(loss)
    x = np.linspace(-1.0, 1.2, 7)
    f(x, cell(1), cell(2))
    f(np.linspace(-1.0, 1.2, 9), cell(1), cell(2))
    g32 = f(x.astype(np.float32), cell(1), cell(2))
    assert g32.dtype == np.float32 and f.cache_info().misses == 3
    np.testing.assert_allclose(g32, fd_grad(x, 1, 2), rtol=1e-4, atol=1e-5)

    @hawk.kernel
    def sc(x: Scalar, a: Param) -> Scalar:
        return a * x * x

    @ef.Graph.builder
    def scaled(x, a):
        g = ef.Graph()
        g.result = total(sc(x, a))
        return g
    h = ef.grad(scaled)
    for a in (2.0, 3.0, 2.0):                         # a Python float is traced, as jax.jit does: one staging
        np.testing.assert_allclose(h(x, a), 4 * a * a * x ** 3, rtol=1e-12)
    assert h.cache_info()[:3] == (2, 1, 1)
    for a in (2, 3, 2):                               # a Python int is static: part of the key
        np.testing.assert_allclose(h(x, a), 4 * a * a * x ** 3, rtol=1e-12)
    assert h.cache_info()[:3] == (3, 3, 3)


def test_a_longer_counted_loop_stages_again_a_shorter_one_replays():
    f = ef.grad(loss)
    x = np.linspace(-1.0, 1.2, 7)
    for n, misses in ((3, 1), (5, 2), (2, 2), (5, 2), (0, 2)):
        np.testing.assert_allclose(f(x, cell(1), cell(n)), fd_grad(x, 1, n), rtol=1e-6, atol=1e-8)
        assert f.cache_info().misses == misses


def test_lru_bound_and_clearing(monkeypatch):
    from eagle_fx.frontend import cache
    monkeypatch.setattr(cache, "MAXSIZE", 3)

    @ef.Graph.builder(static_argnames="a")          # a static float: each value is its own entry
    def shifted(x, a):
        g = ef.Graph()
        g.result = total(wobble(x))
        return g
    f = ef.grad(shifted)
    x = np.linspace(-1.0, 1.0, 5)
    for a in range(5):
        f(x, float(a))
    assert f.cache_info().currsize == 3
    f(x, 4.0)
    assert f.cache_info().hits == 1
    f(x, 0.0)                                         # evicted: staged again
    assert f.cache_info().misses == 6
    f.clear_cache()
    assert f.cache_info().currsize == 0
    f(x, 0.0)
    ef.clear_caches()
    assert f.cache_info()[:3] == (0, 0, 0)


GAIN = 2.0
GAINS = [2.0]


def test_a_global_rebound_stages_again_one_changed_in_place_needs_clear_caches():
    @hawk.kernel
    def gained(x: Scalar, a: Param) -> Scalar:
        return hawk.sum(a * x * x)

    @ef.Graph.builder
    def f(x):
        g = ef.Graph()
        g.result = gained(x, GAIN)
        return g

    @ef.Graph.builder
    def f_list(x):
        g = ef.Graph()
        g.result = gained(x, GAINS[0])
        return g
    global GAIN
    x = np.arange(3.0)
    np.testing.assert_allclose(ef.grad(f)(x), 2 * 2.0 * x)
    np.testing.assert_allclose(ef.grad(f_list)(x), 2 * 2.0 * x)
    GAIN, GAINS[0] = 5.0, 5.0
    try:
        np.testing.assert_allclose(ef.grad(f)(x), 2 * 5.0 * x)      # the name holds a new object: staged again
        np.testing.assert_allclose(ef.grad(f_list)(x), 2 * 2.0 * x)  # the same list, changed in place: replayed
        ef.clear_caches()
        np.testing.assert_allclose(ef.grad(f_list)(x), 2 * 5.0 * x)
    finally:
        GAIN, GAINS[0] = 2.0, 2.0


def test_vjp_jvp_vmap_jacobians_are_cached_and_keep_their_arguments():
    x1, x2 = np.linspace(-1.0, 1.2, 7), np.linspace(0.3, -0.8, 7)
    y1, pb1 = ef.vjp(loss, x1, cell(1), cell(2))
    y2, pb2 = ef.vjp(loss, x2, cell(1), cell(2))
    np.testing.assert_allclose(pb1(np.ones(1))[0], fd_grad(x1, 1, 2), rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(pb2(np.ones(1))[0], fd_grad(x2, 1, 2), rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(y1, numpy_loss(x1, 1, 2))
    t = np.cos(np.arange(7.0))
    for x in (x1, x2):
        _, ty = ef.jvp(loss, (x, cell(1), cell(2)), (t, None, None))
        np.testing.assert_allclose(ty, fd_grad(x, 1, 2) @ t, rtol=1e-6)
        j = ef.jacrev(loss)(x, cell(1), cell(2))
        np.testing.assert_allclose(j.reshape(-1), fd_grad(x, 1, 2), rtol=1e-6, atol=1e-8)
    xs = np.stack([x1, x2])
    vg = ef.vmap(ef.grad(loss), in_axes=(0, None, None))
    for _ in range(2):
        out = vg(xs, cell(1), cell(2))
        np.testing.assert_allclose(out, np.stack([fd_grad(x1, 1, 2), fd_grad(x2, 1, 2)]), rtol=1e-6, atol=1e-8)
        xs = xs[::-1].copy()
        x1, x2 = x2, x1
    assert vg.cache_info()[:2] == (1, 1)


def test_threads_calling_one_transformed_function_take_turns():
    import threading
    f = ef.grad(loss)
    xs = [np.linspace(-1.0, 1.2, 7) * (1 + 0.1 * w) for w in range(4)]
    want = [fd_grad(x, 1, 2) for x in xs]
    f(xs[0], cell(1), cell(2))
    errors = []

    def work(w):
        try:
            for _ in range(40):
                np.testing.assert_allclose(f(xs[w], cell(1), cell(2)), want[w], rtol=1e-6, atol=1e-8)
        except Exception as e:          # reported by the main thread
            errors.append(e)
    threads = [threading.Thread(target=work, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    assert f.cache_info().misses == 1


SHIFT = np.linspace(0.0, 0.6, 7)


def test_arrays_made_while_staging_are_not_replayed_stale():
    @hawk.kernel
    def sc2(x: Scalar, a: Param) -> Scalar:
        return a * x * x

    @ef.Graph.builder
    def doubled(x, a):
        g = ef.Graph()
        g.result = total(sc2(x, a * 2.0))              # NumPy arithmetic on an argument, at staging
        return g

    @ef.Graph.builder(static_argnames="a")          # a static float: each value is its own entry
    def shifted(x, a):
        g = ef.Graph()
        g.result = total(sc2(wobble(x), a[:1]))        # a view of an argument: rebound with it
        return g

    x = np.linspace(-1.0, 1.0, 7)
    f = ef.grad(doubled)
    for a in (1.0, 3.0):
        np.testing.assert_allclose(f(x, np.array([a])), 4 * (2 * a) ** 2 * x ** 3, rtol=1e-12)
    assert f.cache_info()[:3] == (1, 1, 1)              # a * 2.0 is staged: the cached graph reads the new a
    h = ef.grad(shifted)
    w, dw = np.sin(x) * x, np.sin(x) + x * np.cos(x)
    for a in (1.0, 3.0):
        np.testing.assert_allclose(h(x, np.array([a, 9.0])), 4 * a * a * w ** 3 * dw, rtol=1e-12)
    assert h.cache_info()[:3] == (1, 1, 1)
    # the view a[:1] is staged: the gradient reaches a's first cell and none other
    np.testing.assert_allclose(ef.grad(shifted, argnums=1)(x, np.array([1.5, 9.0])),
                               [2 * 1.5 * np.sum(w ** 4), 0.0], rtol=1e-12)


def test_a_plain_function_computing_on_its_arguments():
    @ef.Graph.builder
    def doubled(x):
        g = ef.Graph()
        g.result = total(wobble(x * 2.0))
        return g

    def numpy_doubled_grad(x):
        y = 2.0 * x
        return 2 * np.sin(y) * y * (np.sin(y) + y * np.cos(y)) * 2.0
    x1, x2 = np.linspace(-1.0, 1.0, 7), np.linspace(0.2, 0.9, 7)
    # a plain function computes on the arrays themselves: y * 2.0 is a constant to the graph
    with pytest.raises(TransformError, match=r"<lambda> \(test_api_cache.py, line \d+\) hands its graph an array of "
                                             r"shape \(7,\) it computed in Python from y"):
        ef.grad(lambda y: doubled(y * 2.0))(x1)
    jv = ef.vmap(lambda x, t: ef.jvp(doubled, (x,), (t * 1.0,)))     # a tangent made while staging: not cached
    for xs in (np.stack([x1, x2]), np.stack([x2, x1])):
        _, dy = jv(xs, np.ones((2, 7)))
        # atol: the first sum cancels to ~1e-15 (an odd function on a symmetric grid), where the
        # kernel's compensated sum and np.sum's pairwise one of differently rounded terms differ
        np.testing.assert_allclose(dy.ravel(), [numpy_doubled_grad(x).sum() for x in xs], rtol=1e-12, atol=1e-13)
    assert jv.cache_info().currsize == 0


def test_an_array_reached_by_closure_is_cached_and_read_in_place():
    @ef.Graph.builder
    def plus_shift(x):
        g = ef.Graph()
        g.result = total(add(x, SHIFT))
        return g
    x = np.linspace(-1.0, 1.0, 7)
    f = ef.grad(plus_shift)
    np.testing.assert_allclose(f(x), 2 * (x + SHIFT))
    np.testing.assert_allclose(f(x[::-1].copy()), 2 * (x[::-1] + SHIFT))
    assert f.cache_info()[:3] == (1, 1, 1)
