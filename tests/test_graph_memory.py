"""Memory: replays allocate nothing (tracemalloc), a long chain reuses a few buffers instead of one per
node, and a loop-carried value stays in one buffer. Plans must not depend on when the garbage
collector runs, so builds here run with it switched off."""
import gc
import tracemalloc

import numpy as np
import pytest

import eagle_fx
import hawk_fx as hawk
from hawk_fx import Mutable, Param, Scalar, UInt32
from hawk_fx import math as hm
from tour_kernels import accumulate, affine, cell, dbl, inc

N = 100_000


@hawk.kernel
def min_below(s: Scalar, lim: Param, flag: Mutable[UInt32]):    # 1 while the smallest sample is below lim
    flag = hm.uint32(hawk.min(s) < lim)


@hawk.kernel
def count_below(s: Scalar, lim: Param, flag: Mutable[UInt32]):  # the tour's guard: how many are below lim
    flag = hm.uint32(hawk.sum(s < lim))


class no_gc:
    def __enter__(self):
        self.was = gc.isenabled()
        gc.disable()

    def __exit__(self, *exc):
        if self.was:
            gc.enable()


def replay_memory(run, times=20):
    """(bytes still held after `times` runs, peak bytes above the start) as tracemalloc sees them."""
    gc.collect()
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        for k in range(times):
            run(k)
        gc.collect()
        now, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return now - start, peak - start


def make_work(guard):
    @eagle_fx.Graph.builder
    def work(x, y, flag, sel):
        g = eagle_fx.Graph()
        a = inc(x)
        for _ in range(10):
            if not flag:
                break
            a = dbl(a)
            guard(a, 40.0, flag)
        if sel:
            a = affine(a, 0.5, 1.0)
        else:
            a = inc(a)
        accumulate(a, y)
        g.result = {"a": a, "y": y}
        return g
    return work


def ref_work(x, sel, count):
    a = x + 1.0
    flag = 1
    for _ in range(10):
        if not flag:
            break
        a = 2.0 * a
        flag = int(np.sum(a < 40.0)) if count else int(a.min() < 40.0)
    a = 0.5 * a + 1.0 if sel else a + 1.0
    return a, a + 1.0


@pytest.fixture(scope="module")
def data():
    return np.random.default_rng(3).uniform(0.5, 3.0, N)


def test_replays_allocate_no_arrays(data):
    y, flag, sel = np.zeros(N), cell(1), cell(1)
    g = make_work(min_below)(data, y, flag, sel)
    g()                                          # warm up

    def launch(k):
        flag[0], sel[0] = 1, k % 2
        g.launch()

    def call(k):
        flag[0], sel[0] = 1, k % 2
        g()

    held, peak = replay_memory(launch)
    assert held < 1024 and peak < 8 * 1024, (held, peak)       # one plane of N samples is 800 KB
    held, peak = replay_memory(call)                           # g(): the result dict, nothing else
    assert held < 1024 and peak < 8 * 1024, (held, peak)
    for s in (0, 1):                                           # and the replays computed the right thing
        flag[0], sel[0] = 1, s
        res = g()
        want_a, want_y = ref_work(data, s, count=False)
        np.testing.assert_allclose(res["a"], want_a, rtol=1e-12)
        np.testing.assert_allclose(y, want_y, rtol=1e-12)
        assert res["y"] is y


def test_replays_with_a_counting_guard_allocate_no_arrays(data):
    y, flag, sel = np.zeros(N), cell(1), cell(1)
    g = make_work(count_below)(data, y, flag, sel)
    g()
    flag[0] = 1
    want_a, _ = ref_work(data, 1, count=True)
    np.testing.assert_allclose(g()["a"], want_a, rtol=1e-12)

    def launch(k):
        flag[0] = 1
        g.launch()

    held, peak = replay_memory(launch)
    assert held < 1024 and peak < 8 * 1024, (held, peak)


def distinct_planes(g, n):
    """The distinct buffers of n samples the executable holds, by identity."""
    return {id(a): a for a in g._exe.slots if a.shape == (n,)}


def test_a_long_chain_reuses_a_few_buffers(data):
    @eagle_fx.Graph.builder
    def chain(x, m):
        g = eagle_fx.Graph()
        for i in range(m):
            x = affine(x, 0.5, float(i % 3))
        g.result = x
        return g

    with no_gc():
        g = chain(data, 60)
    planes = distinct_planes(g, N)
    assert len(planes) <= 3, len(planes)                # the input and two buffers in turn, not 60
    want = data
    for i in range(60):
        want = 0.5 * want + float(i % 3)
    np.testing.assert_allclose(g(), want, rtol=1e-12)
    np.testing.assert_array_equal(data, np.random.default_rng(3).uniform(0.5, 3.0, N))   # input untouched


def test_a_chain_keeps_the_buffers_a_user_holds(data):
    @eagle_fx.Graph.builder
    def chain_with_taps(x):
        g = eagle_fx.Graph()
        taps = []
        for i in range(12):
            x = inc(x)
            if i % 4 == 3:
                taps.append(x)                   # a plane the result names keeps its own buffer
        g.result = taps
        return g

    with no_gc():
        g = chain_with_taps(data)
    taps = g()
    assert len(taps) == 3
    want, wants = data, []
    for i in range(12):
        want = want + 1.0
        if i % 4 == 3:
            wants.append(want)
    for t, w in zip(taps, wants):
        np.testing.assert_array_equal(t, w)
    assert len(distinct_planes(g, N)) <= 1 + 3 + 2


def test_a_loop_carried_value_stays_in_one_buffer(data):
    @eagle_fx.Graph.builder
    def carried(x, n):
        g = eagle_fx.Graph()
        s = inc(x)
        for _ in range(n):
            s = affine(s, 0.5, 1.0)
            s = dbl(s)
            s = affine(s, 0.5, -0.25)
        g.result = s
        return g

    with no_gc():
        n = cell(0)
        g = carried(data, n)
    planes = distinct_planes(g, N)
    assert len(planes) <= 5, len(planes)                 # input, s, the carry, two body temporaries
    first = None
    for nv in (0, 1, 3, 7):
        n[0] = nv
        got = g()
        want = data + 1.0
        for _ in range(nv):
            want = 2.0 * (0.5 * want + 1.0) * 0.5 - 0.25
        np.testing.assert_allclose(got, want, rtol=1e-12)
        first = got if first is None else first
        assert got is first                              # every trip count: the same buffer holds the carry
    held, peak = replay_memory(lambda k: g.launch())
    assert held < 1024 and peak < 8 * 1024, (held, peak)


def test_a_guard_cell_carried_by_a_loop_is_the_callers_cell(data):
    @eagle_fx.Graph.builder
    def grow(x, flag):
        g = eagle_fx.Graph()
        for _ in range(30):
            if not flag:
                break
            x = dbl(x)
            min_below(x, 100.0, flag)
        g.result = x
        return g

    with no_gc():
        flag = cell(1)
        g = grow(data, flag)
    cells = [a for a in g._exe.slots if a.shape == (1,) and a.dtype == np.uint32]
    assert any(a is flag for a in cells)
    got = g()
    want = data.copy()
    while want.min() < 100.0:
        want = 2.0 * want
    np.testing.assert_array_equal(got, want)
    assert flag[0] == 0
    assert len(distinct_planes(g, N)) <= 2
