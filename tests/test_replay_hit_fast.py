"""The transforms' hit path for flat arguments (cache.replay_hit): arrays of any layout, Python
floats (traced: written into the entry's cell), ints, bools and None (static), a float in a
differentiated position (promoted, its derivative 0-d), Mutable arguments written back, globals and
closures rebound, several threads. Every value is checked against NumPy formulas written here;
`_served` records which calls the hit path answered, so a layout the general path would key
differently from the hit path shows up as a call it did not serve."""
import contextlib
import threading

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import eagle_fx as ef
import hawk_fx as hawk
from eagle_fx.backends.select import use_backend
from eagle_fx.frontend import cache
from hawk_fx import Mutable, Param, Scalar
from tour_kernels import dbl, inc


@pytest.fixture(autouse=True)
def _fresh_caches():
    ef.clear_caches()


@contextlib.contextmanager
def serving():
    """Caches emptied, and a list that gets True for each call of the hit path (replay_hit,
    replay_hit_pair) that answered, False for each that passed on to the general path (per
    hypothesis example: a fixture would span them all)."""
    ef.clear_caches()
    seen = []
    inner = cache.replay_hit, cache.replay_hit_pair

    def spying(fn):
        def spy(*a):
            out = fn(*a)
            seen.append(out is not cache.MISS)
            return out
        return spy
    cache.replay_hit, cache.replay_hit_pair = map(spying, inner)
    try:
        yield seen
    finally:
        cache.replay_hit, cache.replay_hit_pair = inner


@pytest.fixture
def served():
    with serving() as seen:
        yield seen


@hawk.kernel
def quad(x: Scalar, a: Param) -> Scalar:
    return hawk.sum(a * x * x)


@hawk.kernel
def plus(x: Scalar, y: Mutable[Scalar], a: Param):
    y = y + a * x


@ef.Graph.builder
def mixed(x, a, k, flag, nothing):
    """sum(a y^2), y = 2^k x (+ 1 when flag): k unrolled in Python, flag a Python branch."""
    g = ef.Graph()
    y = x
    for _ in range(int(k)):
        y = dbl(y)
    if flag:
        y = inc(y)
    assert nothing is None
    g.result = quad(y, a)
    return g


def _want(x, a, k, flag):
    """(value, d/dx, d/da) of mixed, in float64 NumPy."""
    x = np.asarray(x, np.float64)
    y = 2.0 ** k * x + (1.0 if flag else 0.0)
    return a * np.sum(y * y), 2.0 * a * y * 2.0 ** k, np.sum(y * y)


def _laid_out(rng, n, dtype, layout):
    """An array of n values in `layout`: contiguous, every other element of a larger one, reversed, read-only."""
    if layout == "strided":
        x = rng.normal(size=2 * n).astype(dtype)[::2]
    elif layout == "reversed":
        x = rng.normal(size=n).astype(dtype)[::-1]
    else:
        x = rng.normal(size=n).astype(dtype)
    if layout == "readonly":
        x.flags.writeable = False
    return x


LAYOUTS = ("contiguous", "strided", "reversed", "readonly")


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 9), st.sampled_from([np.float32, np.float64]), st.sampled_from(LAYOUTS),
       st.sampled_from(["float", "cell", "np.float64"]), st.integers(0, 2), st.booleans(), st.integers(0, 2**31))
def test_flat_calls_of_any_layout_hit_and_match_numpy(n, dtype, layout, a_kind, k, flag, seed):
    with serving() as served:
        _flat_calls(n, dtype, layout, a_kind, k, flag, seed, served)


def _flat_calls(n, dtype, layout, a_kind, k, flag, seed, served):
    rng = np.random.default_rng(seed)
    f = ef.value_and_grad(mixed)
    for call in range(3):                       # new values each call: the first stages, the others replay
        x = _laid_out(rng, n, dtype, layout)
        a = float(rng.uniform(0.5, 2.0))
        arg = {"float": a, "np.float64": np.float64(a), "cell": np.array([a], dtype)}[a_kind]
        before = len(served)
        v, dx = f(x, arg, k, flag, None)
        value, want_dx, _ = _want(x, a, k, flag)
        tol = 1e-12 if dtype == np.float64 else 2e-5
        assert dx.dtype == dtype and dx.shape == (n,)
        np.testing.assert_allclose(v, [value], rtol=tol, atol=tol)
        np.testing.assert_allclose(dx, want_dx, rtol=tol, atol=tol)
        if call:
            assert served[before:] == [True]
    assert f.cache_info().misses == 1


@settings(max_examples=20, deadline=None)
@given(st.integers(1, 7), st.sampled_from(LAYOUTS), st.integers(0, 2**31))
def test_a_float_in_the_differentiated_position_is_promoted_and_its_derivative_is_0d(n, layout, seed):
    with serving() as served:
        _promoted_calls(n, layout, seed, served)


def _promoted_calls(n, layout, seed, served):
    rng = np.random.default_rng(seed)
    f = ef.grad(mixed, argnums=(0, 1))
    for _ in range(3):
        x = _laid_out(rng, n, np.float64, layout)
        a = float(rng.uniform(0.5, 2.0))
        dx, da = f(x, a, 1, True, None)
        _, want_dx, want_da = _want(x, a, 1, True)
        assert np.shape(da) == ()
        np.testing.assert_allclose(dx, want_dx, rtol=1e-12)
        np.testing.assert_allclose(da, want_da, rtol=1e-12)
    assert f.cache_info().misses == 1
    # a float where argnums points is promoted first: the first try passes, the one after promotion stages, then hits
    assert served == [False, False] + [False, True] * 2


def test_ints_bools_and_static_floats_key_by_value():
    x = np.linspace(-1.0, 1.0, 5)
    f = ef.grad(mixed)
    for k, flag in [(0, False), (1, False), (1, True), (0, False), (1, True), (2, True)]:
        np.testing.assert_allclose(f(x, 0.5, k, flag, None), _want(x, 0.5, k, flag)[1], rtol=1e-12)
    assert f.cache_info().misses == 4 and f.cache_info().hits == 2
    p = ef.grad(lambda u, a: mixed(u, a, 1, False, None))     # a plain function: its floats stay static
    for a in (0.5, 0.25, 0.5, -0.0, 0.0):
        np.testing.assert_allclose(p(x, a), _want(x, a, 1, False)[1], rtol=1e-12)
    assert p.cache_info().misses == 4 and p.cache_info().hits == 1      # 0.0 and -0.0 are two values


def test_a_float_is_weak_beside_arrays_of_one_float_dtype_and_float64_beside_none():
    x32 = np.linspace(-1.0, 1.0, 4, dtype=np.float32)
    f = ef.grad(mixed)
    for a in (0.1, 0.3):
        g = f(x32, a, 0, False, None)
        assert g.dtype == np.float32
        np.testing.assert_allclose(g, 2 * np.float32(a) * x32, rtol=1e-6)
    assert f.cache_info().misses == 1


def test_the_same_array_twice_or_overlapping_takes_the_general_path(served):
    @ef.Graph.builder
    def two(x, y):
        g = ef.Graph()
        g.result = quad(dbl(x), 1.0)
        return g
    f = ef.grad(two, argnums=(0, 1))
    u = np.linspace(-1.0, 1.0, 6)
    for _ in range(2):
        dx, dy = f(u, u)                         # f(u, u) differentiates as f(a, b): each its own value
        np.testing.assert_allclose(dx, 8.0 * u, rtol=1e-12)
        np.testing.assert_allclose(dy, 0.0)
    assert not any(served)
    base = np.linspace(-1.0, 1.0, 8)
    dx, _ = f(base[:6], base[2:])
    np.testing.assert_allclose(dx, 8.0 * base[:6], rtol=1e-12)


@settings(max_examples=20, deadline=None)
@given(st.integers(1, 3), st.integers(1, 6), st.sampled_from(["contiguous", "strided", "readonly"]),
       st.integers(0, 2**31))
def test_mutable_arguments_are_written_back_at_each_hit(B, n, layout, seed):
    with serving() as served:
        _mutable_calls(B, n, layout, seed, served)


def _mutable_calls(B, n, layout, seed, served):
    @ef.Graph.builder
    def summing(x, y, a):
        g = ef.Graph()
        plus(x, y, a)
        g.result = dbl(x)
        return g
    f = ef.vmap(lambda x, y, a: summing(x, y, a), in_axes=(0, 0, None))
    rng = np.random.default_rng(seed)
    for call in range(3):
        x = rng.normal(size=(B, n))
        big = rng.normal(size=(B, 2 * n))
        y = big[:, ::2] if layout == "strided" else big[:, :n].copy()
        keep, y0 = big.copy(), y.copy()
        if layout == "readonly" and call:            # the layout staged by a writeable call first
            y.flags.writeable = False
            with pytest.raises(ValueError, match="read-only; pass a writeable array"):
                f(x, y, 0.5)
            np.testing.assert_array_equal(y, y0)          # nothing written
            continue
        np.testing.assert_allclose(f(x, y, 0.5), 2.0 * x, rtol=1e-12)
        np.testing.assert_allclose(y, y0 + 0.5 * x, rtol=1e-12)
        if layout == "strided":
            np.testing.assert_array_equal(big[:, 1::2], keep[:, 1::2])   # the elements between untouched
    assert f.cache_info().misses == 1 and served[-1] is (layout != "readonly")


K = dbl


@ef.Graph.builder
def reads_a_global(x):
    g = ef.Graph()
    g.result = quad(K(x), 1.0)
    return g


def test_a_rebound_global_or_closure_stages_again(monkeypatch, served):
    x = np.linspace(-1.0, 1.0, 5)
    f = ef.grad(reads_a_global)
    np.testing.assert_allclose(f(x), 8.0 * x, rtol=1e-12)
    np.testing.assert_allclose(f(x), 8.0 * x, rtol=1e-12)
    monkeypatch.setitem(globals(), "K", inc)              # d/dx sum((x + 1)^2)
    np.testing.assert_allclose(f(x), 2.0 * (x + 1.0), rtol=1e-12)
    assert served[-2:] == [True, False] and f.cache_info().misses == 2

    scale = 1.0

    def plain(u):
        return mixed(u, scale, 0, False, None)
    p = ef.grad(plain)
    np.testing.assert_allclose(p(x), 2.0 * x, rtol=1e-12)
    np.testing.assert_allclose(p(x), 2.0 * x, rtol=1e-12)
    scale = 3.0                                        # the closure cell now holds another value
    np.testing.assert_allclose(p(x), 6.0 * x, rtol=1e-12)
    assert p.cache_info().misses == 2


def test_jvp_pairs_of_any_layout_hit_and_match_numpy(served):
    rng = np.random.default_rng(3)

    def chain(u):
        return mixed(u, 0.5, 1, True, None)
    for layout in LAYOUTS:
        for call in range(3):
            x, t = _laid_out(rng, 5, np.float64, layout), _laid_out(rng, 5, np.float64, layout)
            v, tv = ef.jvp(chain, (x,), (t,))
            y = 2.0 * x + 1.0
            np.testing.assert_allclose(v, [0.5 * np.sum(y * y)], rtol=1e-12)
            np.testing.assert_allclose(tv, [np.sum(0.5 * 2.0 * y * 2.0 * t)], rtol=1e-12)
    ef.clear_caches()
    served.clear()
    x, t = np.ones(4), np.full(4, 0.5)
    for _ in range(3):
        ef.jvp(dbl_chain, (x,), (t,))
    assert served == [False, True, True]


@ef.Graph.builder
def dbl_chain(x):
    g = ef.Graph()
    g.result = quad(dbl(x), 1.0)
    return g


def test_threads_calling_one_layout_with_their_own_floats_each_get_their_own_answer():
    f = ef.grad(mixed)
    x = np.linspace(-1.0, 1.0, 6)
    f(x, 1.0, 1, False, None)
    errors = []

    def work(j):
        try:
            for i in range(40):
                a = 0.1 * (j + 1) + 0.001 * i
                xi = x + j
                np.testing.assert_allclose(f(xi, a, 1, False, None), _want(xi, a, 1, False)[1], rtol=1e-12)
        except Exception as e:                 # noqa: BLE001 (reported below)
            errors.append(e)
    threads = [threading.Thread(target=work, args=(j,)) for j in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors
    assert f.cache_info().misses == 1


@hawk.kernel
def wxb(w: Scalar, x: Scalar, b: Scalar) -> Scalar:
    return w * x + b


@ef.Graph.builder
def fit(p, x, a, nothing):
    """sum(a y^2), y = w x + b, with (w, b) from a dict {"w", "b"} or a tuple or list (w, b)."""
    g = ef.Graph()
    w, b = (p["w"], p["b"]) if isinstance(p, dict) else p
    g.result = quad(wxb(w, x, b), a)
    return g


def _params(kind, w, b):
    return {"dict": {"w": w, "b": b}, "reordered": {"b": b, "w": w}, "tuple": (w, b), "list": [w, b]}[kind]


@settings(max_examples=30, deadline=None)
@given(st.sampled_from(["dict", "reordered", "tuple", "list"]), st.integers(1, 8),
       st.sampled_from([np.float32, np.float64]), st.sampled_from(LAYOUTS), st.integers(0, 2**31))
def test_parameters_in_a_container_hit_and_match_numpy(kind, n, dtype, layout, seed):
    with serving() as served:
        f = ef.grad(fit)
        v = ef.value_and_grad(fit, argnums=(0, 1))
        rng = np.random.default_rng(seed)
        for call in range(3):
            w, b, x = (_laid_out(rng, n, dtype, layout) for _ in range(3))
            a = float(rng.uniform(0.5, 2.0))
            y = w.astype(np.float64) * x + b
            tol = 1e-12 if dtype == np.float64 else 2e-5
            before = len(served)
            dp = f(_params(kind, w, b), x, a, None)
            value, (dp2, dx) = v(_params(kind, w, b), x, a, None)
            assert type(dp) is type(_params(kind, w, b)) and type(dp2) is type(dp)
            dw, db = (dp["w"], dp["b"]) if kind in ("dict", "reordered") else dp
            for got, want in ((dw, 2 * a * y * x), (db, 2 * a * y), (dx, 2 * a * y * w)):
                assert got.dtype == dtype
                np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
            np.testing.assert_allclose(value, [a * np.sum(y * y)], rtol=tol, atol=tol)
            if call:
                assert served[before:] == [True, True]
        assert f.cache_info().misses == 1 and v.cache_info().misses == 1


def test_containers_key_by_their_keys_order_and_the_same_array_twice_stages_on_its_own():
    x = np.linspace(-1.0, 1.0, 5)
    w, b = np.full(5, 2.0), np.full(5, 0.5)
    f = ef.grad(fit)
    y = w * x + b
    for p in ({"w": w, "b": b}, {"b": b, "w": w}, (w, b), [w, b], {"w": w, "b": b}):
        dp = f(p, x, 1.0, None)
        dw, db = (dp["w"], dp["b"]) if isinstance(dp, dict) else dp
        np.testing.assert_allclose(dw, 2 * y * x, rtol=1e-12)
        np.testing.assert_allclose(db, 2 * y, rtol=1e-12)
    assert f.cache_info().misses == 4 and f.cache_info().hits == 1
    u = np.full(5, 1.5)
    dp = f({"w": u, "b": u}, x, 1.0, None)           # one array as both: each its own value
    y = u * x + u
    np.testing.assert_allclose(dp["w"], 2 * y * x, rtol=1e-12)
    np.testing.assert_allclose(dp["b"], 2 * y, rtol=1e-12)
    assert f.cache_info().misses == 5


def test_a_float_inside_a_container_is_traced_by_the_general_path():
    @ef.Graph.builder
    def scaled(x, opts):
        g = ef.Graph()
        g.result = quad(x, opts["a"])
        return g
    f = ef.grad(scaled)
    x = np.linspace(-1.0, 1.0, 4)
    for a in (0.5, 1.5, 2.5):
        np.testing.assert_allclose(f(x, {"a": a}), 2 * a * x, rtol=1e-12)
    assert f.cache_info().misses == 1 and f.cache_info().hits == 2


def test_a_0d_array_in_a_differentiated_container_gets_a_0d_derivative_at_every_call():
    f = ef.grad(fit)
    x = np.linspace(-1.0, 1.0, 3)
    for w in (np.array(2.0), np.array(3.0), np.array([3.0]), np.array(3.0)):
        dp = f({"w": w, "b": np.zeros(3)}, x, 1.0, None)
        assert dp["w"].shape == w.shape
        np.testing.assert_allclose(dp["w"], np.sum(2 * w * x * x), rtol=1e-12)


LAYOUT = st.tuples(st.integers(1, 5), st.sampled_from([np.float32, np.float64]), st.integers(0, 1), st.booleans(),
                   st.sampled_from(["float", "cell", "scalar"]))


def _number(kind, a, dtype):
    """The float argument as a Python float, a one-cell array or a NumPy scalar of the arrays' dtype:
    all three key alike (a Python float is weak), so one entry serves them."""
    return {"float": a, "cell": np.array([a], dtype), "scalar": dtype(a)}[kind]


@settings(max_examples=25, deadline=None)
@given(st.lists(LAYOUT, min_size=1, max_size=4), st.lists(st.integers(0, 3), min_size=1, max_size=10),
       st.integers(0, 2**31))
def test_calls_switching_between_layouts_each_get_their_own_graph(layouts, order, seed):
    """The hit path compares a call with the last hit's layout before keying it: a call of another
    layout, or one that comes back, must still find its own entry. A traced float, a one-cell array
    of the weak dtype and a NumPy scalar of it key alike: one entry serves all three."""
    ef.clear_caches()
    rng = np.random.default_rng(seed)
    f = ef.grad(mixed)
    used = set()
    for i in order:
        n, dtype, k, flag, a_kind = layouts[i % len(layouts)]
        for _ in range(2):                       # a hit, so the next layout is compared with this one
            x = rng.normal(size=n).astype(dtype)
            a = float(dtype(rng.uniform(0.5, 2.0)))
            dx = f(x, _number(a_kind, a, dtype), k, flag, None)
            assert dx.dtype == dtype and dx.shape == (n,)
            tol = 1e-12 if dtype == np.float64 else 2e-5
            np.testing.assert_allclose(dx, _want(x, a, k, flag)[1], rtol=tol, atol=tol)
        used.add((n, dtype, k, flag))
    assert f.cache_info().misses == len(used)
    assert f.cache_info().hits == 2 * len(order) - len(used)


@pytest.mark.parametrize("other", ["dtype", "shape", "k", "flag", "cell", "backend"])
def test_a_call_differing_from_the_last_hit_in_one_part_of_its_layout_finds_its_own_entry(other):
    x = np.linspace(-1.0, 1.0, 4)
    f = ef.grad(mixed)
    for _ in range(2):
        np.testing.assert_allclose(f(x, 0.5, 0, False, None), x, rtol=1e-12)
    y, a, k, flag = x, 0.25, 0, False
    if other == "dtype":
        y = x.astype(np.float32)
    elif other == "shape":
        y = np.linspace(-1.0, 1.0, 5)
    elif other == "k":
        k = 1
    elif other == "flag":
        flag = True
    elif other == "cell":
        a = np.array([0.25])                          # the traced float's own key: the same entry
    with use_backend("numpy") if other == "backend" else contextlib.nullcontext():
        dx = f(y, a, k, flag, None)
    assert dx.dtype == y.dtype and dx.shape == y.shape
    np.testing.assert_allclose(dx, _want(y, 0.25, k, flag)[1], rtol=1e-6 if other == "dtype" else 1e-12)
    assert f.cache_info().misses == (1 if other == "cell" else 2)


def test_static_floats_of_a_plain_function_alternate_by_their_bits():
    x = np.linspace(-1.0, 1.0, 4)
    f = ef.grad(lambda u, a: mixed(u, 1.0, 0, a > 0.0 or str(a) == "-0.0", None))   # a branch on the float's value
    for a in (0.0, 0.0, -0.0, 0.0, -0.0, -0.0):
        np.testing.assert_allclose(f(x, a), _want(x, 1.0, 0, str(a) == "-0.0")[1], rtol=1e-12)
    assert f.cache_info().misses == 2 and f.cache_info().hits == 4


def test_the_last_layout_is_forgotten_with_the_cache_and_kept_apart_per_backend():
    x = np.linspace(-1.0, 1.0, 4)
    f = ef.grad(mixed)
    for _ in range(2):
        np.testing.assert_allclose(f(x, 0.5, 0, False, None), x, rtol=1e-12)
    f.clear_cache()
    np.testing.assert_allclose(f(x, 0.5, 0, False, None), x, rtol=1e-12)
    assert f.cache_info().misses == 1 and f.cache_info().hits == 0
    with use_backend("numpy"):                         # another backend asked for: its own entry
        np.testing.assert_allclose(f(x, 0.25, 0, False, None), 0.5 * x, rtol=1e-12)
        np.testing.assert_allclose(f(x, 0.25, 0, False, None), 0.5 * x, rtol=1e-12)
    np.testing.assert_allclose(f(x, 0.75, 0, False, None), 1.5 * x, rtol=1e-12)
    assert f.cache_info().misses == 2 and f.cache_info().hits == 2
    ef.clear_caches()
    np.testing.assert_allclose(f(x, 0.5, 0, False, None), x, rtol=1e-12)
    assert f.cache_info().misses == 1


def test_least_recently_used_layout_is_the_one_forgotten_whichever_path_used_the_others(monkeypatch):
    """A hit on the last hit's entry leaves the LRU order as it is (that entry is the newest);
    any other use of an entry (the general path's, np.float64 takes it) forgets which was last."""
    monkeypatch.setattr(cache, "MAXSIZE", 2)
    f = ef.grad(mixed)
    a, b, c = (np.linspace(-1.0, 1.0, n) for n in (3, 4, 5))

    def call(x, s=0.5):
        np.testing.assert_allclose(f(x, s, 0, False, None), 2 * float(s) * x, rtol=1e-12)
    call(a), call(b)                     # staged: a, b
    call(a), call(a)                     # hits on a, the second through the last hit's layout
    call(b, np.float64(0.5))             # b used by the general path: b is the newest
    call(a)                              # a the newest again
    call(c)                              # stages c, forgets b (the least recent)
    assert f.cache_info().misses == 3
    call(a)
    assert f.cache_info().misses == 3    # a kept
    call(b)
    assert f.cache_info().misses == 4    # b forgotten


def test_clearing_the_caches_lets_go_of_the_graphs_of_the_last_hit():
    import gc
    import weakref
    f = ef.grad(mixed)
    x = np.linspace(-1.0, 1.0, 4)
    f(x, 0.5, 0, False, None)
    f(x, 0.5, 0, False, None)
    held = weakref.ref(cache.cache_for(f._sig, create=False))
    ef.clear_caches()
    gc.collect()
    assert held() is None


@pytest.mark.parametrize("scalar", [np.float64, np.float32, np.float16])
def test_numpy_float_scalars_are_traced_in_their_own_dtype_and_numpy_ints_stay_static(scalar, served):
    f = ef.grad(mixed)
    x = np.linspace(-1.0, 1.0, 5)
    for j, a in enumerate((0.5, 0.25, 1.5)):
        k = np.int64(j % 2)                      # static: keyed by its type and bits
        dx = f(x, scalar(a), k, False, None)
        np.testing.assert_allclose(dx, 2 * float(scalar(a)) * 2.0 ** (2 * int(k)) * x, rtol=1e-12)
    assert f.cache_info().misses == 2 and f.cache_info().hits == 1
    assert served == [False, False, True]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_float_a_numpy_scalar_and_a_cell_in_turn_share_one_entry(dtype, served):
    f = ef.grad(mixed)
    x = np.linspace(-1.0, 1.0, 4).astype(dtype)
    kinds = ["scalar", "scalar", "cell", "cell", "float", "float", "scalar", "cell", "float", "scalar"]
    for j, kind in enumerate(kinds):
        a = float(dtype(0.25 * (j + 1)))
        dx = f(x, _number(kind, a, dtype), 0, False, None)
        assert dx.dtype == dtype
        np.testing.assert_allclose(dx, 2 * a * x.astype(np.float64), rtol=1e-6 if dtype == np.float32 else 1e-12)
    assert f.cache_info().misses == 1 and served[1:] == [True] * (len(kinds) - 1)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(["fresh", "empty", "view0", "view1", "again", "int", "float"]), min_size=1, max_size=5))
def test_the_quick_overlap_test_decides_as_the_full_one(kinds):
    """_disjoint is the hit path's shortcut for `overlaps(leaves) is None`: the same answer for
    arrays that own their memory, views of one buffer (overlapping or not), an array passed twice
    (an empty one too), and numbers between them."""
    buf = np.arange(12.0)
    leaves, made = [], []
    for kind in kinds:
        if kind == "fresh":
            x = np.zeros(3)
        elif kind == "empty":
            x = np.zeros(0)
        elif kind == "view0":
            x = buf[:6]
        elif kind == "view1":
            x = buf[4:10]
        elif kind == "again":
            x = made[-1] if made else np.zeros(2)
        else:
            leaves.append(1 if kind == "int" else 0.5)
            continue
        made.append(x)
        leaves.append(x)
    assert cache._disjoint(leaves) == (cache.overlaps(leaves) is None)
