"""A cached call may hand out again a graph its caller dropped (frontend/recycling.py). It must
never be one the caller still reaches: through the graph, a weakref to it, its executable, a
result array or a view of one. Every value here is checked against plain NumPy."""
import gc
import random
import sys
import threading
import weakref

import numpy as np
import pytest

import eagle_fx as ef
import hawk_fx as hawk
from eagle_fx.frontend import builder_cache, cache, recycling
from eagle_fx.frontend.building import Builder
from hawk_fx import Mutable, Scalar
from test_builder_rebuild import chain, numpy_chain as chain_np
from tour_kernels import below, cell, dbl, inc


@hawk.kernel
def bump(s: Scalar, y: Mutable[Scalar]):
    y = s + 1.0


@ef.Graph.builder
def pair(x, y):
    g = ef.Graph()
    bump(x, y)                       # y = x + 1, in the caller's array
    g.result = (dbl(x), inc(dbl(x)))
    return g


@ef.Graph.builder
def capped(x, flag):
    g = ef.Graph()
    for _ in range(20):
        if not flag:
            break
        x = dbl(x)
        below(x, 100.0, flag)
    g.result = x
    return g


def capped_np(x, flag):
    x = x.copy()
    for _ in range(20):
        if not flag[0]:
            break
        x = 2.0 * x
        flag[0] = np.sum(x < 100.0)
    return x


def _pool(fn, *args):
    """The recycling pool of the layout these arguments hit (builder or vmap)."""
    if isinstance(fn, Builder):
        c = cache.cache_for(fn, create=False)
    else:
        c = cache.cache_for(fn._sig, create=False)
    (e,) = c.entries._data.values()
    return e.pool


@pytest.fixture(autouse=True)
def _fresh():
    ef.clear_caches()
    yield
    ef.clear_caches()


def test_a_dropped_graph_is_handed_out_again_and_computes_the_new_call():
    xs = [np.random.default_rng(k).normal(size=8) for k in range(4)]
    chain(xs[0])                                    # stages
    g = chain(xs[1])
    first = id(g)
    np.testing.assert_array_equal(g(), chain_np(xs[1]))
    del g
    for x in xs[2:] + xs[:2]:
        g = chain(x)
        assert id(g) == first                      # the dropped graph, bound anew
        np.testing.assert_array_equal(g(), chain_np(x))
        assert g.generation == 1
        del g
    assert len(_pool(chain, xs[0]).kept) == 1


@pytest.mark.parametrize("hold", ["graph", "weakref", "executable", "result", "view", "handle"])
def test_a_graph_its_caller_still_reaches_is_not_handed_out(hold):
    x1, x2 = np.arange(8.0), -np.arange(8.0)
    chain(x1)
    g = chain(x1)
    r = g()
    if hold == "weakref":
        kept = weakref.ref(g)
    else:
        every = {"graph": g, "executable": g.executable, "result": r, "view": r[2:5], "handle": g._result_flat[0][0]}
        kept = every[hold]
        del every
    expect = chain_np(x1)
    snapshot = np.array(r)
    first = id(g)
    del g, r
    g2 = chain(x2)
    assert id(g2) != first
    np.testing.assert_array_equal(g2(), chain_np(x2))
    if hold in ("result", "view"):
        np.testing.assert_array_equal(kept, snapshot if hold == "result" else snapshot[2:5])
    if hold == "graph":
        np.testing.assert_array_equal(kept(), expect)     # still its own inputs
    del kept


def test_a_graph_the_caller_set_an_attribute_on_is_not_handed_out():
    x = np.ones(8)
    chain(x)
    g = chain(x)
    g.note = "mine"
    first = id(g)
    del g
    g = chain(x + 1.0)
    assert id(g) != first and not hasattr(g, "note")


def test_mutable_writes_land_in_each_callers_array():
    for k in range(6):
        x, y = np.full(5, float(k)), np.zeros(5)
        a, b = pair(x, y)()
        np.testing.assert_array_equal(y, x + 1.0)
        np.testing.assert_array_equal(a, 2.0 * x)
        np.testing.assert_array_equal(b, 2.0 * x + 1.0)
    # a, b hold the last call's results while the next call runs: two graphs take turns
    assert len(_pool(pair, x, y).kept) == 2


def test_a_recycled_graph_starts_from_what_a_new_one_starts_with():
    """Its buffers are reset: a device loop's carries and cells, the stopping turn and the
    caller's flag are what a fresh build gives (the cache switched off as the oracle)."""
    rng = np.random.default_rng(3)
    for _ in range(8):
        x = rng.uniform(0.5, 30.0, size=6)
        f1, f2 = cell(1), cell(1)
        got = capped(x, f1)()
        np.testing.assert_array_equal(got, capped_np(x, f2))
        assert f1[0] == f2[0]
        builder_cache.ENABLED = False
        try:
            f3 = cell(1)
            np.testing.assert_array_equal(capped(x, f3)(), got)
        finally:
            builder_cache.ENABLED = True


def test_bind_on_a_dropped_graph_does_not_leak_into_the_next_call():
    x1, x2, x3 = np.ones(8), np.full(8, 2.0), np.full(8, 3.0)
    chain(x1)
    g = chain(x1)
    g.bind(x=x2)
    np.testing.assert_array_equal(g(), chain_np(x2))
    del g
    g = chain(x3)
    np.testing.assert_array_equal(g(), chain_np(x3))


def test_vmap_graphs_are_recycled_too():
    f = ef.vmap(chain)
    rng = np.random.default_rng(1)
    xs = [rng.normal(size=(3, 8)) for _ in range(5)]
    ids = set()
    for x in xs:
        g = f(x)
        ids.add(id(g))
        np.testing.assert_array_equal(g(), chain_np(x))
        del g
    assert len(ids) <= 2                       # the first call's graph is the staging's, then one kept
    held = f(xs[0])()
    np.testing.assert_array_equal(f(xs[1])(), chain_np(xs[1]))
    np.testing.assert_array_equal(held, chain_np(xs[0]))


def test_large_graphs_are_not_kept():
    n = recycling.POOL_BYTES // 8 + 1
    chain(np.ones(n))
    chain(np.ones(n))()
    pool = _pool(chain, np.ones(n))
    assert pool is None or not pool.kept


def test_property_random_holds_and_drops_never_change_a_held_value():
    """A seeded sweep: calls of three builders and a vmap with new arrays, each result, view,
    graph or executable held or dropped at random; every held value stays its own call's NumPy
    answer, every held graph replays its own inputs."""
    rng = np.random.default_rng(7)
    pyr = random.Random(7)
    vchain = ef.vmap(chain)
    held = []                        # (kind, object, expected)
    for step in range(300):
        which = pyr.randrange(3)
        if which == 0:
            x = rng.normal(size=8)
            g, expect = chain(x), chain_np(x)
        elif which == 1:
            x = rng.normal(size=(2, 8))
            g, expect = vchain(x), chain_np(x)
        else:
            x, y = rng.normal(size=5), np.zeros(5)
            g, expect = pair(x, y), (2.0 * x, 2.0 * x + 1.0)
        out = g()
        if which == 2:
            np.testing.assert_array_equal(y, x + 1.0)
            np.testing.assert_array_equal(out[0], expect[0])
            out = out[1]
            expect = expect[1]
        else:
            np.testing.assert_array_equal(out, expect)
        kind = pyr.choice(["drop", "drop", "drop", "result", "view", "graph", "exe"])
        if kind == "result":
            held.append(("result", out, expect.copy()))
        elif kind == "view":
            held.append(("view", out[1:3], expect[1:3].copy()))
        elif kind == "graph":
            held.append(("graph", g, expect.copy() if which != 2 else None))
        elif kind == "exe":
            held.append(("exe", g.executable, None))
        del g, out
        if held and pyr.random() < 0.3:
            held.pop(pyr.randrange(len(held)))
        for k, obj, want in held:
            if k in ("result", "view"):
                np.testing.assert_array_equal(obj, want)
            elif k == "graph" and want is not None and pyr.random() < 0.2:
                r = obj()
                np.testing.assert_array_equal(r[1] if isinstance(r, tuple) else r, want)
    gc.collect()


def test_threads_calling_one_builder_each_get_their_own_answers():
    errors = []

    def work(k):
        try:
            rng = np.random.default_rng(k)
            for _ in range(200):
                x = rng.normal(size=8)
                np.testing.assert_array_equal(chain(x)(), chain_np(x))
                x, y = rng.normal(size=5), np.zeros(5)
                a, b = pair(x, y)()
                np.testing.assert_array_equal(y, x + 1.0)
                np.testing.assert_array_equal(b, 2.0 * x + 1.0)
        except BaseException as e:             # surfaced below
            errors.append(e)
    chain(np.ones(8))
    ts = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)               # threads switch between nearly any two bytecodes
    try:
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert not errors, errors[0]


def test_the_calibration_matches_this_interpreter():
    """keep's caller and keep itself hold the graph twice over what take sees of a dropped one."""
    assert recycling._KEEP_EXTRA == 2, sys.version
