"""What XLA reads in place and what it copies, on NumPy arguments (backend="jax", and "auto" once
swapped): a 64-byte-aligned argument is read without a copy, so each check writes the caller's
array after a call and looks at what changed. Results never alias an argument (a later write to
either is not seen through the other), each replay reads the arguments as they are then, and a
transformed call's returned arrays are the caller's own. Oracles: plain NumPy."""
import numpy as np
import pytest

jax = pytest.importorskip("jax")
jax.config.update("jax_enable_x64", True)

import eagle_fx  # noqa: E402
import hawk_fx as hawk  # noqa: E402
from eagle_fx.backends.aligned import aligned_copy, aligned_empty, is_aligned, span_lead, span_view  # noqa: E402
from eagle_fx.backends.jax import ALIGNED_BYTES  # noqa: E402
from eagle_fx.backends.select import use_backend  # noqa: E402
from eagle_fx.backends.tiered import tier_policy  # noqa: E402
from hawk_fx import Mutable, Scalar  # noqa: E402

N = 2 * ALIGNED_BYTES // 8           # large enough for the aligned path
SWAP_AT_SECOND = dict(seconds=0, replays=1, background=False, trial=0)


@hawk.kernel
def same(x: Scalar) -> Scalar:
    return x * 1.0                  # XLA may hand back the argument's own buffer for this


@hawk.kernel
def affine(x: Scalar) -> Scalar:
    return 3.0 * x + 1.0


@hawk.kernel
def add_into(x: Scalar, y: Mutable[Scalar]):
    y = y + x


@eagle_fx.Graph.builder
def passthrough(x):
    g = eagle_fx.Graph()
    g.result = {"same": same(x), "affine": affine(x)}
    return g


@eagle_fx.Graph.builder
def accumulate(x, y):
    g = eagle_fx.Graph()
    add_into(x, y)
    g.result = same(y)
    return g


@hawk.kernel
def energy(x: Scalar) -> Scalar:
    return hawk.sum(x * x)


@eagle_fx.Graph.builder
def loss(x):
    g = eagle_fx.Graph()
    g.result = energy(same(x))
    return g


def offset_array(values, offset_bytes):
    """A C-contiguous copy of `values` whose data starts `offset_bytes` past a 64-byte boundary."""
    raw = aligned_empty((values.nbytes + 64,), np.uint8)
    out = raw[offset_bytes:offset_bytes + values.nbytes].view(values.dtype)
    out[...] = values
    return out


def graph_on(backend, builder, *args):
    with use_backend(backend), tier_policy(**SWAP_AT_SECOND):
        g = builder(*args)
    g()
    g()                                     # auto: swapped to XLA at this replay
    assert repr(g).endswith("jax>")
    return g


@pytest.mark.parametrize("backend", ["jax", "auto"])
@pytest.mark.parametrize("offset", [0, 16])
def test_results_never_alias_an_argument_read_in_place(backend, offset):
    x = offset_array(np.linspace(0.0, 1.0, N), offset)
    assert is_aligned(x) == (offset == 0)
    g = graph_on(backend, passthrough, x)
    res = g.result
    for r in res.values():
        assert not np.shares_memory(r, x)
    want = x.copy()
    x[:] = -5.0                             # the caller writes its argument after the call
    np.testing.assert_array_equal(res["same"], want)
    np.testing.assert_allclose(res["affine"], 3.0 * want + 1.0, rtol=1e-15)
    res["same"][:] = 7.0                    # and a result: the argument does not see it
    np.testing.assert_array_equal(x, -5.0)
    g()                                     # the next replay reads the argument as it is now
    assert g.result["same"] is res["same"]
    np.testing.assert_array_equal(res["same"], -5.0)
    np.testing.assert_allclose(res["affine"], -14.0, rtol=1e-15)


@pytest.mark.parametrize("backend", ["jax", "auto"])
def test_a_written_argument_is_updated_in_place_and_the_result_is_its_own(backend):
    x = offset_array(np.full(N, 2.0), 0)
    y = offset_array(np.zeros(N), 0)
    g = graph_on(backend, accumulate, x, y)                 # two replays: y = 4
    np.testing.assert_array_equal(y, 4.0)
    assert not np.shares_memory(g.result, y)
    np.testing.assert_array_equal(g.result, 4.0)
    y[:] = 1.0
    x[:] = 0.5
    g()
    np.testing.assert_array_equal(y, 1.5)
    np.testing.assert_array_equal(g.result, 1.5)


@pytest.mark.parametrize("backend", [None, "auto"])
def test_a_transformed_calls_arrays_are_the_callers_own(backend):
    x = np.linspace(-1.0, 1.0, N)
    f = eagle_fx.grad(loss)
    with use_backend(backend), tier_policy(**SWAP_AT_SECOND):
        g1 = f(x)
        x2 = x + 1.0
        g2 = f(x2)
        g3 = f(x2)
    np.testing.assert_allclose(g1, 2.0 * x, rtol=1e-15)
    for a, b in ((g1, g2), (g2, g3), (g1, x), (g2, x2)):
        assert not np.shares_memory(a, b)
    x2[:] = 0.0                             # the caller's argument, written after the calls
    np.testing.assert_allclose(g3, 2.0 * (x + 1.0), rtol=1e-15)
    g3[:] = 9.0                             # a returned array, written: the next call does not see it
    with use_backend(backend), tier_policy(**SWAP_AT_SECOND):
        g4 = f(x)
    np.testing.assert_allclose(g4, 2.0 * x, rtol=1e-15)
    np.testing.assert_allclose(g2, 2.0 * (x + 1.0), rtol=1e-15)


def test_aligned_copy_is_an_aligned_equal_copy():
    rng = np.random.default_rng(3)
    for shape in [(), (1,), (7,), (3, 5), (2, 3, 4)]:
        a = rng.standard_normal(shape)
        c = aligned_copy(a)
        assert c.ctypes.data % 64 == 0 and c.flags.c_contiguous and c.flags.writeable
        assert not np.shares_memory(a, c)
        np.testing.assert_array_equal(c, a)
    f = np.asfortranarray(rng.standard_normal((4, 3)))
    np.testing.assert_array_equal(aligned_copy(f), f)       # not C-contiguous: a plain copy


@pytest.mark.parametrize("seed", range(6))
def test_seeded_sweep_jax_and_auto_agree_with_numpy_under_writes_between_replays(seed):
    rng = np.random.default_rng(seed)
    offset = int(rng.choice([0, 8, 16, 32, 48]))
    backend = ["jax", "auto"][seed % 2]
    x = offset_array(rng.uniform(-1, 1, N), offset)
    y = offset_array(rng.uniform(-1, 1, N), int(rng.choice([0, 16])))
    want_y = y.copy()
    g = graph_on(backend, accumulate, x, y)
    want_y += 2 * x
    np.testing.assert_allclose(y, want_y, rtol=1e-14)
    for _ in range(3):
        k = int(rng.integers(0, N))
        x[k:] = rng.uniform(-1, 1, N - k)           # the caller writes between replays
        y[:k] = 0.0
        want_y = y.copy() + x
        g()
        np.testing.assert_allclose(y, want_y, rtol=1e-14)
        np.testing.assert_array_equal(g.result, y)
        assert not np.shares_memory(g.result, y) and not np.shares_memory(g.result, x)


@pytest.mark.parametrize("backend", ["jax", "auto"])
def test_rebinding_to_an_array_at_another_offset_or_strided_reads_it_right(backend):
    rng = np.random.default_rng(7)
    x = offset_array(rng.uniform(-1, 1, N), 16)
    g = graph_on(backend, passthrough, x)
    for x1 in (offset_array(rng.uniform(-1, 1, N), 40), offset_array(rng.uniform(-1, 1, N), 0),
               rng.uniform(-1, 1, 2 * N)[::2], offset_array(rng.uniform(-1, 1, N), 16)):
        g.bind(x=x1)
        g()
        np.testing.assert_array_equal(g.result["same"], x1)
        np.testing.assert_allclose(g.result["affine"], 3.0 * x1 + 1.0, rtol=1e-15)
        x1[: N // 2] = 0.25                          # written between replays: seen by the next one
        g()
        np.testing.assert_array_equal(g.result["same"], x1)


@hawk.kernel
def norm3(v: hawk.Vector[3]) -> Scalar:
    return v[0] * v[0] + v[1] * v[1] + v[2] * v[2]


@eagle_fx.Graph.builder
def norms(v):
    g = eagle_fx.Graph()
    g.result = norm3(v)
    return g


@pytest.mark.parametrize("offset, dtype", [(8, np.float64), (24, np.float64), (4, np.float32), (60, np.float32)])
def test_planes_of_every_offset_and_dtype_read_in_place_match_numpy(offset, dtype):
    rng = np.random.default_rng(offset)
    n = ALIGNED_BYTES // 4
    v = offset_array(rng.uniform(-1, 1, 3 * n).astype(dtype), offset).reshape(3, n)
    with use_backend("jax"):
        g = norms(v)
    g()
    want = (v.astype(np.float64) ** 2).sum(axis=0)
    np.testing.assert_allclose(g.result, want, rtol=1e-5 if dtype == np.float32 else 1e-14)
    v[1] = 0.0
    g()
    np.testing.assert_allclose(g.result, (v.astype(np.float64) ** 2).sum(axis=0), rtol=1e-5 if dtype == np.float32
                               else 1e-14)


def test_a_span_covers_the_array_inside_its_own_pages():
    rng = np.random.default_rng(11)
    for _ in range(50):
        item = int(rng.choice([1, 2, 4, 8, 16]))
        dtype = {1: np.uint8, 2: np.float16, 4: np.float32, 8: np.float64, 16: np.complex128}[item]
        size = int(rng.integers(1, 5000))
        off = int(rng.integers(1, 64 // item)) * item
        a = offset_array(np.arange(size).astype(dtype), off)
        lead = span_lead(a)
        assert lead == off // item
        view = span_view(a, lead)
        start, end = view.ctypes.data, view.ctypes.data + view.nbytes
        assert start % 64 == 0 and end % 64 == 0
        assert start <= a.ctypes.data and a.ctypes.data + a.nbytes <= end and end - start < a.nbytes + 128
        assert start // 4096 == a.ctypes.data // 4096                       # no page before the array's first
        assert (end - 1) // 4096 == (a.ctypes.data + a.nbytes - 1) // 4096  # nor after its last
        np.testing.assert_array_equal(view[lead:lead + size], a)
        assert not view.flags.writeable
    assert span_lead(offset_array(np.ones(8), 0)) is None                 # aligned: read as it is
    assert span_lead(np.ones((4, 6))[:, ::2]) is None                      # strided: copied
