"""Tables in kernels: gather (hm.take, x[i]) and scatter (hm.scatter_add) with a per-sample index,
their derivatives, and their refusals. Oracles: jax.numpy (jnp.take, .at[].get/.add, jax.grad, jax.jvp)
under x64, plain Python loops for the order of a scatter, finite differences."""
from __future__ import annotations

import numpy as np
import pytest

import eagle_fx as eagle
import hawk_fx as hawk
import hawk_fx.diff as hd
import hawk_fx.math as hm
from hawk_fx import Int32, Matrix, Mutable, Param, Scalar, Table, UInt32, Vector
from hawk_fx.trace import TraceError

jax = pytest.importorskip("jax")
jax.config.update("jax_enable_x64", True)
jnp = jax.numpy


# ---------------------------------------------------------------------------------------------
# kernels

@hawk.kernel
def take_fill(t: Table, i: Int32):
    return hm.take(t, i)


@hawk.kernel
def take_clip(t: Table, i: Int32):
    return hm.take(t, i, mode="clip")


@hawk.kernel
def take_wrap(t: Table, i: Int32):
    return hm.take(t, i, mode="wrap")


@hawk.kernel
def take_fill7(t: Table, i: Int32):
    return hm.take(t, i, fill_value=-7.0)


@hawk.kernel
def subscript(t: Table, i: Int32):
    return t[i]


@hawk.kernel
def vector_at(v: Vector[4], i: Int32):
    return v[i]


@hawk.kernel
def matrix_row(m: Matrix[3, 2], i: Int32):
    return m[i]


@hawk.kernel
def computed_index(t: Table, x: Scalar):
    k = hm.int32(hm.floor(x))           # an integer computed in the kernel
    return hm.take(t, k, mode="clip") * x


@hawk.kernel
def hist_drop(h: Mutable[Table], i: Int32, w: Scalar):
    h = hm.scatter_add(h, i, w)


@hawk.kernel
def hist_clip(h: Mutable[Table], i: Int32, w: Scalar):
    h = hm.scatter_add(h, i, w, mode="clip")


@hawk.kernel
def hist_wrap(h: Mutable[Table], i: Int32, w: Scalar):
    h = hm.scatter_add(h, i, w, mode="wrap")


@hawk.kernel
def count(h: Mutable[Table], i: Int32):
    h = hm.scatter_add(h, i, 1.0)        # a value the same in every sample: added once per sample


@hawk.kernel
def per_sample_scatter(v: Vector[4], i: Int32, w: Scalar):
    return hm.scatter_add(v, i, w)


TAKES = {"fill": take_fill, "clip": take_clip, "wrap": take_wrap}
HISTS = {"drop": hist_drop, "clip": hist_clip, "wrap": hist_wrap}


def indices(rng, k, n, dtype=np.int32):
    lo = 0 if np.dtype(dtype).kind == "u" else -2 * k
    return rng.integers(lo, 2 * k + 1, n).astype(dtype)


# ---------------------------------------------------------------------------------------------
# gather: NumPy and JAX kernels against jnp.take, over a seeded sweep of shapes, dtypes and indices

@pytest.mark.parametrize("mode", sorted(TAKES))
@pytest.mark.parametrize("seed", range(4))
def test_take_equals_jnp_take(mode, seed):
    rng = np.random.default_rng(seed)
    k, n = int(rng.integers(1, 9)), int(rng.integers(1, 40))
    row = [(), (3,), (2, 2)][seed % 3]
    dt = [np.float64, np.float32, np.int32, np.float64][seed]
    t = (rng.normal(size=(k,) + row) * 10).astype(dt)
    idt = [np.int32, np.int64, np.uint32, np.int16][seed]
    i = indices(rng, k, n, idt)
    want = np.moveaxis(np.asarray(jnp.take(jnp.asarray(t), jnp.asarray(i), axis=0, mode=mode)), 0, -1)
    got = TAKES[mode](t[..., None], i)
    assert got.dtype == t.dtype and got.shape == row + (n,)
    np.testing.assert_array_equal(got, want)
    got_jax = TAKES[mode](jnp.asarray(t[..., None]), jnp.asarray(i))        # the JAX emitter
    np.testing.assert_array_equal(np.asarray(got_jax), want)


def test_take_fill_value_and_out_of_range_rule():
    t = np.arange(5.0)[:, None] * 10
    i = np.array([-7, -5, -1, 0, 4, 5, 9], np.int32)
    np.testing.assert_array_equal(take_fill7(t, i), [-7, 0, 40, 0, 40, -7, -7])
    np.testing.assert_array_equal(take_fill(t, i), [np.nan, 0, 40, 0, 40, np.nan, np.nan])
    np.testing.assert_array_equal(take_clip(t, i), [0, 0, 0, 0, 40, 40, 40])     # as given, clamped
    np.testing.assert_array_equal(subscript(t, i), [0, 0, 40, 0, 40, 40, 40])    # from the end, clamped


@pytest.mark.parametrize("seed", range(3))
def test_subscript_vector_and_matrix_rows_equal_jax(seed):
    rng = np.random.default_rng(10 + seed)
    n = 25
    i = indices(rng, 4, n)
    t = rng.normal(size=(4, 1))
    want = np.asarray(jnp.asarray(t[:, 0]).at[jnp.asarray(i)].get(mode="clip"))
    np.testing.assert_array_equal(subscript(t, i), want)
    v = rng.normal(size=(4, n))
    want = np.asarray(jax.vmap(lambda v, i: v.at[i].get(mode="clip"))(jnp.asarray(v.T), jnp.asarray(i)))
    np.testing.assert_array_equal(vector_at(v, i), want)
    np.testing.assert_array_equal(np.asarray(vector_at(jnp.asarray(v), jnp.asarray(i))), want)
    m = rng.normal(size=(3, 2, n))
    j = indices(rng, 3, n)
    want = np.asarray(jax.vmap(lambda m, i: m.at[i].get(mode="clip"))(jnp.asarray(np.moveaxis(m, -1, 0)),
                                                                      jnp.asarray(j)))
    np.testing.assert_array_equal(matrix_row(m, j), want.T)


def test_a_one_cell_index_and_a_computed_index():
    t = np.array([[1.0], [2.0], [4.0]])
    np.testing.assert_array_equal(take_clip(t, np.array([2], np.int32)), [4.0])
    x = np.array([0.5, 1.5, 2.5, 7.0])
    np.testing.assert_array_equal(computed_index(t, x), [0.5, 3.0, 10.0, 28.0])


def test_take_over_chunks_and_threads_equals_jnp():
    rng = np.random.default_rng(3)
    n = 200_001                              # several chunks, several threads
    t = rng.normal(size=(50, 1))
    i = indices(rng, 50, n)
    want = np.asarray(jnp.take(jnp.asarray(t[:, 0]), jnp.asarray(i), mode="wrap"))
    np.testing.assert_array_equal(take_wrap(t, i), want)


# ---------------------------------------------------------------------------------------------
# scatter: against .at[].add, and in sample order (bit for bit against a Python loop)

@pytest.mark.parametrize("mode", sorted(HISTS))
@pytest.mark.parametrize("seed", range(3))
def test_scatter_add_equals_jax_at_add(mode, seed):
    rng = np.random.default_rng(20 + seed)
    k, n = int(rng.integers(1, 7)), int(rng.integers(1, 60))
    h0 = rng.normal(size=(k, 1))
    i, w = indices(rng, k, n), rng.normal(size=n)
    jmode = {"drop": "drop", "clip": "clip", "wrap": None}[mode]
    ji = jnp.asarray(i) % k if mode == "wrap" else jnp.asarray(i)
    want = np.asarray(jnp.asarray(h0[:, 0]).at[ji].add(jnp.asarray(w), mode=jmode))
    h = h0.copy()
    HISTS[mode](h, i, w)
    np.testing.assert_allclose(h[:, 0], want, rtol=1e-13, atol=1e-13)


def test_scatter_add_is_in_sample_order_bit_for_bit():
    rng = np.random.default_rng(5)
    k, n = 7, 100_000
    i = rng.integers(0, k, n).astype(np.int32)
    w = (rng.normal(size=n) * 10.0 ** rng.integers(-3, 4, n)).astype(np.float32)
    want = np.zeros(k, np.float32)
    for s in range(n):                       # the ordered sum, in float32
        want[i[s]] += w[s]
    for _ in range(2):
        h = np.zeros((k, 1), np.float32)
        hist_drop(h, i, w.astype(np.float64))
        # the plane is float64: each value is rounded to float32 as it is added, in sample order
        np.testing.assert_array_equal(h[:, 0], want)


def test_a_count_adds_a_shared_value_once_per_sample():
    i = np.array([0, 2, 2, 5, -1], np.int32)
    h = np.zeros((3, 1))
    count(h, i)
    np.testing.assert_array_equal(h[:, 0], [1, 0, 3])       # -1 is row 2; 5 is dropped


def test_scatter_into_a_per_sample_vector():
    rng = np.random.default_rng(6)
    n = 30
    v, i, w = rng.normal(size=(4, n)), indices(rng, 4, n), rng.normal(size=n)
    want = jax.vmap(lambda v, i, w: v.at[i].add(w))(jnp.asarray(v.T), jnp.asarray(i), jnp.asarray(w))
    np.testing.assert_allclose(per_sample_scatter(v, i, w), np.asarray(want).T, rtol=1e-15)
    np.testing.assert_allclose(np.asarray(per_sample_scatter(jnp.asarray(v), jnp.asarray(i), jnp.asarray(w))),
                               np.asarray(want).T, rtol=1e-15)


@hawk.kernel
def segment_sums(s: Mutable[Table], seg: Int32, x: Scalar):
    s = hm.scatter_add(s, seg, hm.vec(x, x * x))      # rows of two: sum and sum of squares


def test_segment_sums_of_rows():
    rng = np.random.default_rng(7)
    seg, x = rng.integers(0, 4, 50).astype(np.int32), rng.normal(size=50)
    s = np.zeros((4, 2, 1))
    segment_sums(s, seg, x)
    for r in range(4):
        np.testing.assert_allclose(s[r, :, 0], [x[seg == r].sum(), (x[seg == r] ** 2).sum()], rtol=1e-13)


# ---------------------------------------------------------------------------------------------
# derivatives: against jax.grad / jax.jvp of the same jnp.take / .at[].add program

@hawk.kernel
def lerp_loss(c: Table, x: Scalar, y: Scalar):
    k = hm.int32(hm.floor(x))
    u = x - hm.floor(x)
    p = (1.0 - u) * hm.take(c, k, mode="clip") + u * hm.take(c, k + 1, mode="clip")
    return hawk.sum((p - y) ** 2)


def jax_lerp_loss(c, x, y):
    k = jnp.floor(x).astype(jnp.int32)
    u = x - jnp.floor(x)
    p = (1.0 - u) * jnp.take(c[:, 0], k, mode="clip") + u * jnp.take(c[:, 0], k + 1, mode="clip")
    return jnp.sum((p - y) ** 2)


@eagle.Graph.builder
def lerp_graph(c, x, y):
    g = eagle.Graph()
    g.result = lerp_loss(c, x, y)
    return g


def lerp_data(seed, k=9, n=64):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(k, 1)), rng.uniform(-1.0, k + 1.0, n), rng.normal(size=n)


@pytest.mark.parametrize("seed", range(3))
def test_value_and_grad_of_a_table_equals_jax(seed):
    c, x, y = lerp_data(seed)
    val, g = eagle.value_and_grad(lerp_graph)(c, x, y)
    jv, jg = jax.value_and_grad(jax_lerp_loss)(jnp.asarray(c), x, y)
    np.testing.assert_allclose(val[0], float(jv), rtol=1e-13)
    assert g.shape == c.shape
    np.testing.assert_allclose(g, np.asarray(jg), rtol=1e-12, atol=1e-12)


def test_grad_by_table_and_by_sample_equals_jax_and_jvp_equals_jax():
    c, x, y = lerp_data(4)
    gc, gx = eagle.grad(lerp_graph, argnums=(0, 1))(c, x, y)
    jc, jx = jax.grad(jax_lerp_loss, argnums=(0, 1))(jnp.asarray(c), x, y)
    np.testing.assert_allclose(gc, np.asarray(jc), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(gx, np.asarray(jx), rtol=1e-12, atol=1e-12)
    tc = np.random.default_rng(1).normal(size=c.shape)
    out, tan = eagle.jvp(lerp_graph, (c, x, y), (tc, np.zeros_like(x), np.zeros_like(y)))
    _, jt = jax.jvp(lambda c: jax_lerp_loss(c, x, y), (jnp.asarray(c),), (jnp.asarray(tc),))
    np.testing.assert_allclose(np.ravel(tan)[0], float(jt), rtol=1e-12)


@pytest.mark.parametrize("mode", sorted(TAKES) + ["index"])
def test_gather_vjp_is_scatter_in_its_mode_as_jax(mode):
    rng = np.random.default_rng(8)
    t, i, ct = rng.normal(size=(5, 1)), indices(rng, 5, 40), rng.normal(size=40)
    kern = TAKES.get(mode, subscript)
    got = hd.vjp(kern, wrt="t")(t, i, cotangent=ct)["t"]
    if mode == "index":           # x.at[i].get(mode='clip'): JAX's plain x[i] drops what it clamped
        f = lambda t: jnp.asarray(t[:, 0]).at[jnp.asarray(i)].get(mode="clip")     # noqa: E731
    else:
        f = lambda t: jnp.take(t[:, 0], jnp.asarray(i), mode=mode, fill_value=0.0)     # noqa: E731
    _, pull = jax.vjp(f, jnp.asarray(t))
    np.testing.assert_allclose(got, np.asarray(pull(jnp.asarray(ct))[0]), rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("mode", sorted(HISTS))
def test_scatter_vjp_is_gather_as_jax(mode):
    rng = np.random.default_rng(9)
    h, i, w, ct = rng.normal(size=(4, 1)), indices(rng, 4, 30), rng.normal(size=30), rng.normal(size=(4, 1))
    got = hd.vjp(HISTS[mode], wrt=("h", "w"))(h, i, w, cotangent={"h": ct})
    jmode = {"drop": "drop", "clip": "clip", "wrap": None}[mode]
    ji = jnp.asarray(i) % 4 if mode == "wrap" else jnp.asarray(i)
    _, pull = jax.vjp(lambda h, w: h.at[ji].add(w, mode=jmode), jnp.asarray(h[:, 0]), jnp.asarray(w))
    jh, jw = pull(jnp.asarray(ct[:, 0]))
    np.testing.assert_allclose(got["h"][:, 0], np.asarray(jh), rtol=1e-14)
    np.testing.assert_allclose(got["w"], np.asarray(jw), rtol=1e-14)


def test_vector_index_derivatives_equal_jax():
    rng = np.random.default_rng(11)
    v, i, ct = rng.normal(size=(4, 20)), indices(rng, 4, 20), rng.normal(size=20)
    got = hd.vjp(vector_at, wrt="v")(v, i, cotangent=ct)["v"]
    f = jax.vmap(lambda v, i: v.at[i].get(mode="clip"))
    _, pull = jax.vjp(lambda v: f(v, jnp.asarray(i)), jnp.asarray(v.T))
    np.testing.assert_allclose(got, np.asarray(pull(jnp.asarray(ct))[0]).T, rtol=1e-15)
    tv = rng.normal(size=v.shape)
    _, (tan,) = hd.jvp(vector_at, wrt="v")(v, i, tangents={"v": tv})
    _, jt = jax.jvp(lambda v: f(v, jnp.asarray(i)), (jnp.asarray(v.T),), (jnp.asarray(tv.T),))
    np.testing.assert_allclose(tan, np.asarray(jt), rtol=1e-15)


@hawk.kernel
def shifted(c: Table, i: Int32, a: Param):
    return hawk.sum(hm.take(c, i, mode="wrap") * a)


@eagle.Graph.builder
def shifted_sum(c, i, a):
    g = eagle.Graph()
    g.result = shifted(c, i, a)
    return g


def test_vmap_over_tables_equals_a_loop_and_jax():
    rng = np.random.default_rng(12)
    cs, i = rng.normal(size=(3, 6, 1)), indices(rng, 6, 25)
    got = eagle.vmap(shifted_sum, in_axes=(0, None, None))(cs, i, 2.0)()       # vmap of a builder: a Graph
    want = [float(jnp.sum(jnp.take(jnp.asarray(c[:, 0]), jnp.asarray(i), mode="wrap") * 2.0)) for c in cs]
    np.testing.assert_allclose(np.ravel(got), want, rtol=1e-13)
    g = eagle.vmap(eagle.grad(shifted_sum), in_axes=(0, None, None))(cs, i, 2.0)
    jg = jax.vmap(jax.grad(lambda c: jnp.sum(jnp.take(c, jnp.asarray(i), mode="wrap") * 2.0)))(jnp.asarray(cs[..., 0]))
    np.testing.assert_allclose(np.reshape(g, cs.shape)[..., 0], np.asarray(jg), rtol=1e-13)


# ---------------------------------------------------------------------------------------------
# bad input: a clear error before anything runs, naming the kernel and line; nothing written

@hawk.kernel
def float_index(t: Table, x: Scalar):
    return hm.take(t, x)


@hawk.kernel
def float_index_hist(h: Mutable[Table], x: Scalar):
    h = hm.scatter_add(h, x, 1.0)


def test_an_index_of_floats_is_refused_at_its_line():
    with pytest.raises(TypeError, match=r"float_index:.*hm\.take\(t, x\).*integer dtype"):
        float_index(np.ones((3, 1)), np.ones(4))
    h = np.zeros((3, 1))
    with pytest.raises(TypeError, match=r"float_index_hist:.*integer dtype"):
        float_index_hist(h, np.ones(4))
    assert not h.any()
    with pytest.raises(TypeError, match="argument 'i'.*dtype float64.*integer"):
        take_fill(np.ones((3, 1)), np.ones(4))          # a float plane for an Int32 parameter


def test_a_table_with_the_sample_axis_is_refused():
    with pytest.raises(ValueError, match=r"argument 't' \(Table\).*shape \(3, 4\).*call's 4 samples"):
        take_fill(np.ones((3, 4)), np.zeros(4, np.int32))
    with pytest.raises(ValueError, match=r"shape \(3,\).*table\[\.\.\., None\]"):
        take_fill(np.ones(3), np.zeros(4, np.int32))
    with pytest.raises(TypeError, match="a Table needs an array"):
        take_fill(1.0, np.zeros(4, np.int32))
    h = np.zeros((3, 4))
    with pytest.raises(ValueError, match="call's 4 samples"):
        hist_drop(h, np.zeros(4, np.int32), np.ones(4))
    assert not h.any()
    ro = np.zeros((3, 1))
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        hist_drop(ro, np.zeros(4, np.int32), np.ones(4))


@hawk.kernel
def bad_mode(t: Table, i: Int32):
    return hm.take(t, i, mode="nearest")


@hawk.kernel
def scalar_table(x: Scalar, i: Int32):
    return hm.take(x, i)


@hawk.kernel
def bad_row(h: Mutable[Table], i: Int32, w: Vector[3]):
    h = hm.scatter_add(h, i, w)


def test_bad_mode_scalar_table_and_bad_row_are_refused():
    with pytest.raises(ValueError, match=r"bad_mode:.*mode='nearest'.*'fill', 'clip', 'wrap'"):
        bad_mode(np.ones((3, 1)), np.zeros(2, np.int32))
    with pytest.raises(TypeError, match=r"scalar_table:.*a scalar; it needs a first axis"):
        scalar_table(np.ones(2), np.zeros(2, np.int32))
    h = np.zeros((4, 2, 1))
    with pytest.raises(ValueError, match=r"bad_row:.*per-sample shape \(3,\), a row of the sink \(2,\)"):
        bad_row(h, np.zeros(2, np.int32), np.ones((3, 2)))
    assert not h.any()


@hawk.kernel
def uint_take(t: Table, i: UInt32):
    return hm.take(t, i, mode="clip")


def test_unsigned_indices_and_float32_tables():
    t = np.arange(4, dtype=np.float32)[:, None]
    got = uint_take(t, np.array([0, 3, 7, 2 ** 32 - 1], np.uint32))
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, [0, 3, 3, 3])


@pytest.mark.parametrize("backend", ["jax", "fake-cuda"])
def test_table_gradients_on_the_other_backends_equal_numpy(backend):
    from eagle_fx.backends.select import use_backend
    c, x, y = lerp_data(0)
    want = eagle.value_and_grad(lerp_graph)(c, x, y)
    rng = np.random.default_rng(12)
    cs, i = rng.normal(size=(3, 6, 1)), indices(rng, 6, 25)
    want_v = eagle.vmap(eagle.grad(shifted_sum), in_axes=(0, None, None))(cs, i, 2.0)
    with use_backend(backend):
        got = eagle.value_and_grad(lerp_graph)(c, x, y)
        got_v = eagle.vmap(eagle.grad(shifted_sum), in_axes=(0, None, None))(cs, i, 2.0)
    np.testing.assert_allclose(np.asarray(got[0]), want[0], rtol=1e-14)
    np.testing.assert_allclose(np.asarray(got[1]), want[1], rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(np.asarray(got_v), np.asarray(want_v), rtol=1e-13, atol=1e-15)


# ---------------------------------------------------------------------------------------------
# a property test against plain Python: every mode, any table size, any index

from hypothesis import given, settings, strategies as st  # noqa: E402


def python_row(i, k, mode):
    """The row a mode reads for index i, or None (fill / drop), in plain Python."""
    if mode == "wrap":
        return i % k
    if mode == "clip":
        return min(max(i, 0), k - 1)
    j = i + k if i < 0 else i
    if mode == "index":
        return min(max(j, 0), k - 1)
    return j if 0 <= j < k else None


@settings(max_examples=40, deadline=None)
@given(k=st.integers(1, 6), idx=st.lists(st.integers(-20, 20), min_size=1, max_size=12),
       mode=st.sampled_from(["fill", "clip", "wrap"]))
def test_gather_and_scatter_follow_the_python_rule(k, idx, mode):
    t = np.arange(1.0, k + 1.0)[:, None] * 10.0
    i = np.array(idx, np.int32)
    got = TAKES[mode](t, i)
    for g, ii in zip(got, idx):
        r = python_row(ii, k, mode)
        assert (np.isnan(g) if r is None else g == t[r, 0])
    h = np.zeros((k, 1))
    w = np.arange(1.0, len(idx) + 1.0)
    HISTS[{"fill": "drop", "clip": "clip", "wrap": "wrap"}[mode]](h, i, w)
    want = np.zeros(k)
    for ii, wi in zip(idx, w):
        r = python_row(ii, k, "index" if mode == "clip" else mode)
        if r is not None:
            want[r] += wi
    np.testing.assert_array_equal(h[:, 0], want)


@hawk.kernel
def constant_tables(x: Scalar, i: Int32, p: Param):
    return hm.take(hm.vec(1.0, 2.0, 3.0), i, mode="clip") * x, hm.take(hm.vec(x, 2.0 * x), 1), hm.take(hm.vec(1.0, 5.0), p)


def test_tables_of_numbers_stay_weak_and_a_param_index():
    x, i = np.full(4, 2.0, np.float32), np.array([0, 1, 2, 7], np.int32)
    for args in ((x, i, 1), (jnp.asarray(x), jnp.asarray(i), 1)):
        a, b, c = constant_tables(*args)
        assert a.dtype == np.float32 and b.dtype == np.float32         # numbers take x's dtype, as in NumPy
        np.testing.assert_array_equal(np.asarray(a), [2, 4, 6, 6])
        np.testing.assert_array_equal(np.asarray(b), [4, 4, 4, 4])
        np.testing.assert_array_equal(np.asarray(c), [5, 5, 5, 5])
    assert hm.take(np.arange(5.0), 2) == 2.0 and np.isnan(hm.take(np.arange(5.0), -9))    # outside a kernel


@hawk.kernel
def per_sample_into_table(t: Mutable[Table], x: Scalar):
    t = t + x


def test_a_per_sample_value_written_to_a_table_is_refused():
    t = np.zeros((3, 1))
    with pytest.raises(TraceError, match=r"per_sample_into_table:.*`t = t \+ x`.*hm\.scatter_add"):
        per_sample_into_table(t, np.ones(4))
    assert not t.any()


def test_hessian_by_a_table_and_float32_gradients_equal_jax():
    c, x, y = lerp_data(1, k=5, n=30)
    h = eagle.hessian(lerp_graph)(c, x, y)                     # jvp of the vjp: both rules twice
    want = jax.hessian(jax_lerp_loss)(jnp.asarray(c), x, y)
    np.testing.assert_allclose(np.reshape(h, want.shape), np.asarray(want), rtol=1e-12, atol=1e-12)
    c32, x32, y32 = (a.astype(np.float32) for a in (c, x, y))
    v, g = eagle.value_and_grad(lerp_graph)(c32, x32, y32)
    jv, jg = jax.value_and_grad(jax_lerp_loss)(jnp.asarray(c32), jnp.asarray(x32), jnp.asarray(y32))
    assert g.dtype == np.float32
    np.testing.assert_allclose(v[0], float(jv), rtol=1e-5)
    np.testing.assert_allclose(g, np.asarray(jg), rtol=1e-5, atol=1e-5)
