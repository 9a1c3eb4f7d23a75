"""A builder called directly again reuses its staged graph: every graph it hands out must behave
exactly as a fresh build does. Each call is checked against a fresh build with the cache off (the
same builder, staged again) and, where the math is short, against NumPy written here."""
import contextlib

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import eagle_fx as ef
import hawk_fx as hawk
from eagle_fx.frontend import builder_cache, recycling
from hawk_fx import Mutable, Scalar
import tour_builders as tb
from tour_kernels import accumulate, affine, cell, dbl, inc

pytestmark = pytest.mark.usefixtures("backend_heavy")


@pytest.fixture(autouse=True)
def _fresh_caches():
    ef.clear_caches()


@contextlib.contextmanager
def uncached():
    builder_cache.ENABLED = False
    try:
        yield
    finally:
        builder_cache.ENABLED = True


@ef.Graph.builder
def treed(p, k):
    g = ef.Graph()
    a = inc(p["a"])
    g.result = {"s": affine(a, k, 1.0), "t": [dbl(p["b"][0])]}
    accumulate(a, p["b"][1])
    return g


@ef.Graph.builder
def unread(x, z):
    g = ef.Graph()
    g.result = inc(x)
    return g


@ef.Graph.builder
def on_numpy(x):
    g = ef.Graph(backend="numpy")
    g.result = dbl(x)
    return g


WEIGHTS = np.linspace(0.5, 1.5, 7)


@ef.Graph.builder
def weighted(x):
    g = ef.Graph()
    g.result = dbl(inc(x) * WEIGHTS)          # an array it reaches by name, read only (staged as a copy)
    return g


# (builder, argument maker (rng, n) -> (args, names of the arrays it may write), NumPy oracle or None)
def _f(n, rng):
    return rng.normal(size=n)


CASES = {
    "first": (tb.first, lambda r, n: ((_f(n, r),), ()), lambda x: 4 * (x + 1)),
    "forks": (tb.forks, lambda r, n: ((_f(n, r),), ()),
              lambda x: (4 * x + 3, 8 * x + 4, 4 * x + 1)),
    "choose": (tb.choose, lambda r, n: ((_f(n, r), bool(r.integers(2)), bool(r.integers(2)), bool(r.integers(2))), ()),
               None),
    "capped": (tb.capped, lambda r, n: ((np.abs(_f(n, r)) + 0.5, cell(1)), (1,)), None),
    "counted": (tb.counted, lambda r, n: ((_f(n, r), int(r.integers(0, 4))), ()), lambda x, k: x + k),
    "early_exit": (tb.early_exit, lambda r, n: ((np.zeros(n), cell(1), cell(0)), (1, 2)), None),
    "skipping": (tb.skipping, lambda r, n: ((np.full(n, float(r.integers(0, 3))), cell(1), cell(0)), (1, 2)), None),
    "chooser": (tb.chooser, lambda r, n: ((_f(n, r), cell(int(r.integers(0, 4)))), ()), None),
    "void": (tb.void, lambda r, n: ((_f(n, r), np.zeros(n)), (1,)), None),
    "model": (tb.model, lambda r, n: ((_f(n, r), np.zeros(n)), (1,)), None),
    "whole": (tb.whole, lambda r, n: ((_f(n, r), cell(1), np.zeros(n)), (1, 2)), None),
    "treed": (treed, lambda r, n: (({"a": _f(n, r), "b": (_f(n, r), np.zeros(n))}, float(r.integers(1, 3))), ()),
              None),
    "unread": (unread, lambda r, n: ((_f(n, r), _f(n, r)), ()), lambda x, z: x + 1),
    "on_numpy": (on_numpy, lambda r, n: ((_f(n, r),), ()), lambda x: 2 * x),
    "keep": (tb.keep, lambda r, n: ((_f(4, r),), ()), None),
}
SIZES = {"keep": (4,), "weighted": (7,)}
CASES["weighted"] = (weighted, lambda r, n: ((_f(7, r),), ()), lambda x: 2 * ((x + 1) * WEIGHTS))


def _copy(args):
    return tuple(_copy_tree(a) for a in args)


def _copy_tree(a):
    if isinstance(a, np.ndarray):
        return a.copy()
    if isinstance(a, dict):
        return {k: _copy_tree(v) for k, v in a.items()}
    if isinstance(a, (tuple, list)):
        return type(a)(_copy_tree(v) for v in a)
    return a


def _same(a, b):
    """Two trees of arrays (or None) equal bit for bit."""
    la, lb = ef.frontend.building.tree_flatten(a)[0], ef.frontend.building.tree_flatten(b)[0]
    assert len(la) == len(lb)
    for x, y in zip(la, lb):
        if x is None:
            assert y is None
        else:
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def _close(a, b):
    la, lb = ef.frontend.building.tree_flatten(a)[0], ef.frontend.building.tree_flatten(b)[0]
    assert len(la) == len(lb)
    for x, y in zip(la, lb):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-12, atol=1e-12)


def _names(builder, args):
    bound = builder.signature.bind(*args)
    return {k: v for k, v in bound.arguments.items() if isinstance(v, np.ndarray)}


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 2 ** 16), steps=st.integers(3, 9),
       picks=st.lists(st.sampled_from(sorted(CASES)), min_size=2, max_size=4))
def test_property_cached_calls_match_a_fresh_build(seed, steps, picks):
    rng = np.random.default_rng(seed)
    alive = []                                       # (graph, its fresh twin, args, twin's args, oracle)
    for _ in range(steps):
        name = picks[int(rng.integers(len(picks)))]
        builder, make, ref = CASES[name]
        n = SIZES.get(name, (4, 7))[int(rng.integers(len(SIZES.get(name, (4, 7)))))]
        args, _ = make(rng, n)
        if ref is not None:
            want = ref(*_copy(args))
        oargs = _copy(args)
        g = builder(*args)
        with uncached():
            o = builder(*oargs)
        assert type(g) is type(o) and g.made_by is o.made_by
        assert sorted(g._input_names) == sorted(o._input_names)
        assert sorted(g.unread_args) == sorted(o.unread_args)
        assert repr(g) == repr(o) and str(g.program) == str(o.program) and g.to_dot() == o.to_dot()
        for k, v in g.unread_args.items():             # the new call's arrays, not the first call's
            assert v is _names(builder, args)[k]
        for k, v in _names(builder, args).items():
            if k in g._input_names:
                assert (g.argument(k) is v) == (o.argument(k) is _names(builder, oargs)[k])
        times = int(rng.integers(1, 3))
        r, ro = g(times), o(times)
        _same(r, ro)
        _same(args, oargs)
        if ref is not None:                           # these builders are pure: any replay count
            _close(r, want)
        alive.append((g, o, args, oargs))
        if rng.integers(3) == 0 and alive:             # an older graph, alive all along, replays again
            g2, o2, a2, oa2 = alive[int(rng.integers(len(alive)))]
            _same(g2(), o2())
            _same(a2, oa2)
        if rng.integers(3) == 0:                       # bind new arrays (same values) to both
            names = _names(builder, args)
            if names:
                k = sorted(names)[int(rng.integers(len(names)))]
                new = rng.normal(size=names[k].shape).astype(names[k].dtype) if names[k].dtype.kind == "f" \
                    else names[k].copy()
                twin = new.copy()
                g.bind(**{k: new})
                o.bind(**{k: twin})
                _same(g(), o())
                _same(new, twin)
                _same(args, oargs)


def test_hits_and_misses():
    x = np.arange(4.0)
    for k in range(3):
        np.testing.assert_array_equal(np.asarray(tb.first(x + k)()), 4 * (x + k + 1))
    assert tb.first.cache_info()[:3] == (2, 1, 1)
    tb.first(np.arange(5.0))                         # another length: another layout
    tb.first(np.asfortranarray(np.ones((2, 4)))[0])  # other strides
    assert tb.first.cache_info()[:3] == (2, 3, 3)
    tb.first.clear_cache()
    assert tb.first.cache_info()[:3] == (0, 0, 0)
    tb.counted(x, 2)
    tb.counted(x, 3)                                 # a Python int is static: a new value stages
    tb.counted(x, 2)
    assert tb.counted.cache_info()[:2] == (1, 2)
    treed({"a": x, "b": (x, np.zeros(4))}, 1.0)
    treed({"a": x, "b": (x, np.zeros(4))}, 2.0)      # a Python float is static for a direct call
    assert treed.cache_info()[:2] == (0, 2)


def test_a_mutable_argument_is_written_in_the_callers_array_and_graphs_share_nothing():
    x1, y1 = np.full(4, 1.0), np.zeros(4)
    x2, y2 = np.full(4, 5.0), np.zeros(4)
    g1 = tb.model(x1, y1)
    g2 = tb.model(x2, y2)
    g1(), g2()
    np.testing.assert_array_equal(y1, 4.0)           # y = 2x + 1 + 1
    np.testing.assert_array_equal(y2, 12.0)
    h1 = ef.Graph.builder(tb.void.fn)                # a builder with no buffer: cached
    a1, b1 = np.full(3, 1.0), np.zeros(3)
    a2, b2 = np.full(3, 7.0), np.zeros(3)
    v1, v2 = h1(a1, b1), h1(a2, b2)
    assert h1.cache_info()[:2] == (1, 1)
    v2(), v1()
    np.testing.assert_array_equal(b1, 2.0)
    np.testing.assert_array_equal(b2, 8.0)
    r1, r2 = tb.first(np.zeros(3)), tb.first(np.ones(3))
    np.testing.assert_array_equal(np.asarray(r2()), 8.0)
    np.testing.assert_array_equal(np.asarray(r1()), 4.0)
    np.testing.assert_array_equal(np.asarray(r2.result), 8.0)


def test_bind_after_a_cached_call_and_tree_arguments():
    p = {"a": np.zeros(4), "b": (np.ones(4), np.zeros(4))}
    treed(p, 2.0)
    q = {"a": np.ones(4), "b": (np.full(4, 3.0), np.zeros(4))}
    g = treed(q, 2.0)
    assert treed.cache_info().hits == 1
    r = g()
    np.testing.assert_array_equal(r["s"], 2 * (q["a"] + 1) + 1)
    np.testing.assert_array_equal(r["t"][0], 2 * q["b"][0])
    np.testing.assert_array_equal(q["b"][1], q["a"] + 1 + 1)     # accumulate: y = s + 1
    np.testing.assert_array_equal(p["b"][1], 0.0)                # the first call's arrays untouched
    new = {"a": np.full(4, 2.0), "b": (np.full(4, -1.0), np.zeros(4))}
    g.bind(p=new)
    r = g()
    np.testing.assert_array_equal(r["s"], 7.0)
    np.testing.assert_array_equal(r["t"][0], -2.0)
    np.testing.assert_array_equal(new["b"][1], 4.0)
    np.testing.assert_array_equal(q["b"][1], 3.0)
    u = unread(np.zeros(3), np.ones(3))
    z = np.full(3, 9.0)
    u2 = unread(np.ones(3), z)
    assert u2.unread_args["z"] is z
    u2.bind(z=np.zeros(3))
    np.testing.assert_array_equal(np.asarray(u2()), 2.0)
    x = np.arange(3.0)
    assert unread(x, z).argument("x") is x


def test_read_only_argument_written_in_place_is_refused_on_a_hit():
    tb.void(np.zeros(3), np.zeros(3))
    g = tb.void(np.zeros(3), np.zeros(3))
    assert tb.void.cache_info().hits == 1
    y = np.zeros(3)
    y.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        g.bind(y=y)


@hawk.kernel
def _step(x: Scalar) -> Scalar:
    return x + 1.0


@ef.Graph.builder
def stepping(x):
    g = ef.Graph()
    g.result = _step(x)
    return g


def test_a_kernel_redefined_between_calls_stages_again():
    global _step
    x = np.arange(3.0)
    np.testing.assert_array_equal(np.asarray(stepping(x)()), x + 1)
    old = _step
    try:
        @hawk.kernel
        def _step(x: Scalar) -> Scalar:
            return x + 10.0
        np.testing.assert_array_equal(np.asarray(stepping(x)()), x + 10)
        assert stepping.cache_info()[:2] == (0, 2)
        np.testing.assert_array_equal(np.asarray(stepping(x)()), x + 10)
        assert stepping.cache_info()[:2] == (1, 2)
    finally:
        _step = old


def test_what_is_not_reproduced_is_not_kept():
    for _ in range(2):
        tb.keep(np.zeros(4))                          # buffers
        tb.model(np.zeros(4), np.zeros(4), record=True)
    assert tb.keep.cache_info()[:3] == (0, 2, 0)
    assert tb.model.cache_info()[:3] == (0, 2, 0)


def test_inside_a_transform_or_another_builder_it_is_not_consulted():
    x = np.linspace(-1.0, 1.0, 4)
    tb.first(x)
    jx = ef.jvp(tb.first, (x,), (np.ones(4),))
    np.testing.assert_allclose(jx[1], 4.0)
    assert tb.first.cache_info()[:2] == (0, 1)


def test_threads_calling_one_builder_each_get_their_own_graph():
    import threading
    errors = []

    def work(k):
        try:
            rng = np.random.default_rng(k)
            for _ in range(15):
                x, y = rng.normal(size=5), np.zeros(5)
                g = tb.whole(x, cell(1), y)
                s = np.array(g())
                with uncached():
                    o = tb.whole(x.copy(), cell(1), np.zeros(5))
                np.testing.assert_array_equal(s, o())
                np.testing.assert_array_equal(y, o.argument("y"))
        except BaseException as e:          # surfaced below
            errors.append(e)
    ts = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors, errors[0]
    assert tb.whole.cache_info().hits >= 1           # the off switch is global: some calls stage


@pytest.mark.parametrize("n", [6, 20_000])
def test_the_cache_keeps_no_callers_array(n):
    """Large arrays are freed once the caller drops them; small ones a dropped graph kept for the
    next call (recycling.py) once the builder's cache is cleared."""
    import gc
    import weakref
    x0, y0 = np.zeros(n), np.zeros(n)
    g0 = tb.void(x0, y0)                              # the call that stages
    x, y = np.ones(n), np.zeros(n)
    g = tb.void(x, y)
    assert tb.void.cache_info().hits == 1
    g()
    np.testing.assert_array_equal(y, 2.0)
    refs = [weakref.ref(a) for a in (x0, y0, x, y)]
    del g, x, y, g0, x0, y0
    gc.collect()
    if n * 16 <= recycling.POOL_BYTES:
        tb.void.clear_cache()
        gc.collect()
    assert all(r() is None for r in refs)


@ef.Graph.builder
def noisy(x):
    g = ef.Graph()
    g.result = inc(x) * np.random.default_rng().normal(size=x.shape)   # an array made while staging
    return g


def test_an_array_the_builder_makes_while_staging_is_made_again():
    x = np.ones(5)
    r1 = noisy(x)().copy()
    r2 = noisy(x)().copy()
    assert noisy.cache_info()[:3] == (0, 2, 0)
    assert not np.array_equal(r1, r2)


def test_a_global_array_changed_in_place_is_seen_by_the_next_call():
    w = WEIGHTS.copy()
    try:
        x = np.ones(7)
        np.testing.assert_allclose(np.asarray(weighted(x)()), 2 * (x + 1) * w, rtol=1e-12)
        WEIGHTS[:] = 3.0
        np.testing.assert_allclose(np.asarray(weighted(x)()), 2 * (x + 1) * 3.0, rtol=1e-12)
    finally:
        WEIGHTS[:] = w
