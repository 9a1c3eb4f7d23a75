"""Inputs that overlap a Mutable output on the CUDA graph path (two views of one buffer): the lowering
copies such an input into a buffer of its own before the node that reads it, so every input is read
before any write, as NumPy's `y[1:] = 0.5 * y[:-1] + 0.5 * y[1:]` reads. On a GPU, without the copy,
threads read samples other threads already wrote. The recording fake refuses any kernel or copy that
reads memory it writes through another view, so these tests fail on a lowering without the copies,
at any size. The oracle is that NumPy line."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import eagle_fx
import hawk_fx as hawk
from eagle_fx.backends.cuda import use_backend
from eagle_fx.testing.fake_cuda import FakeRuntime
from hawk_fx import Mutable, Param, Scalar
from hawk_fx.cuda_runtime import call_kernel as cuda_call_kernel
from hawk_fx.emit.numpy import CHUNK


@hawk.kernel
def smooth(s: Scalar, y: Mutable[Scalar]):
    y = 0.5 * s + 0.5 * y


@hawk.kernel
def scale(a: Param, y: Mutable[Scalar]):
    y = y * a + 1.0


@eagle_fx.Graph.builder
def smooth_graph(s, y):
    g = eagle_fx.Graph()
    smooth(s, y)
    return g


@eagle_fx.Graph.builder
def smooth_loop(s, y, n):
    g = eagle_fx.Graph()
    for _ in range(n):                   # a device loop: the copy is made at every turn
        smooth(s, y)
    return g


@eagle_fx.Graph.builder
def scale_graph(a, y):
    g = eagle_fx.Graph()
    scale(a, y)
    return g


@eagle_fx.Graph.builder
def assign(s, y):
    g = eagle_fx.Graph()
    y[...] = s                           # an update: a strided copy from s into y
    return g


def views(buf, shift):
    """(s, y): s reads `shift` samples behind y (ahead when negative), both views of buf."""
    m = len(buf) - abs(shift)
    if shift >= 0:
        return buf[:m], buf[shift:shift + m]
    return buf[-shift:-shift + m], buf[:m]


def numpy_smooth(buf, shift, times=1):
    out = buf.copy()
    for _ in range(times):
        s, y = views(out, shift)
        y[...] = 0.5 * s + 0.5 * y          # NumPy evaluates the right side first
    return out


def fake(order="creation"):
    return use_backend(FakeRuntime(order=order))


def overlap_copies(g):
    return [nd for nd in g._exe.plan.nodes("memcpy") if nd.label == "overlapping input"]


def test_the_audit_repro_through_a_graph_on_the_fake_device():
    buf = np.arange(32770.0)
    want = numpy_smooth(buf, 1)
    with fake():
        g = smooth_graph(buf[:-1], buf[1:])
    g()
    assert buf[32769] == 32768.5
    np.testing.assert_array_equal(buf, want)
    g()                                  # each replay reads its inputs before it writes
    np.testing.assert_array_equal(buf, numpy_smooth(want, 1))
    assert len(overlap_copies(g)) == 1


@pytest.mark.parametrize("order", ["creation", "lifo", 3])
@pytest.mark.parametrize("shift", [1, -1, 2, -3])
@pytest.mark.parametrize("n", [1, 5, CHUNK + 1])
def test_shifted_views_compute_as_numpy_in_any_node_order(n, shift, order):
    buf = np.random.default_rng(n + 10 * abs(shift)).standard_normal(n + abs(shift))
    want = numpy_smooth(buf, shift)
    with fake(order):
        g = smooth_graph(*views(buf, shift))
    g()
    np.testing.assert_array_equal(buf, want)


@pytest.mark.parametrize("turns", [0, 1, 3])
def test_inside_a_device_loop_the_copy_is_made_every_turn(turns):
    buf = np.linspace(-1.0, 2.0, 40)
    want = numpy_smooth(buf, 1, turns)
    with fake("lifo"):
        g = smooth_loop(buf[:-1], buf[1:], np.array([turns], np.uint32))
    g()
    np.testing.assert_array_equal(buf, want)


def test_a_param_cell_inside_the_mutable_it_scales():
    y = np.linspace(1.0, 2.0, 50)
    want = y * y[10] + 1.0
    with fake():
        g = scale_graph(y[10:11], y)      # written by the thread of sample 10, read by every thread
    g()
    np.testing.assert_array_equal(y, want)


@pytest.mark.parametrize("shift", [1, -1])
def test_an_assignment_between_overlapping_views(shift):
    buf = np.arange(20.0)
    want = buf.copy()
    s, y = views(want, shift)
    y[...] = s                           # NumPy copies as if through a temporary
    with fake():
        g = assign(*views(buf, shift))
    g()
    np.testing.assert_array_equal(buf, want)


def test_the_same_view_twice_and_separate_arrays_need_no_copy():
    y = np.arange(30.0)
    with fake():
        g = smooth_graph(y, y)
    g()
    np.testing.assert_array_equal(y, np.arange(30.0))
    assert overlap_copies(g) == []
    s, y2 = np.arange(30.0)[::-1].copy(), np.arange(30.0)
    with fake():
        g2 = smooth_graph(s, y2)
    g2()
    np.testing.assert_array_equal(y2, 0.5 * np.arange(30.0)[::-1] + 0.5 * np.arange(30.0))
    assert overlap_copies(g2) == []


def test_binding_overlapping_views_later_lowers_again_and_back():
    other = np.arange(40.0)
    with fake():
        g = smooth_graph(other[:-1].copy(), other[1:])
    assert overlap_copies(g) == []
    buf = np.arange(40.0)
    want = numpy_smooth(buf, 1)
    g.bind(s=buf[:-1], y=buf[1:])
    assert g._exe.last_bind == "instantiate" and len(overlap_copies(g)) == 1
    g()
    np.testing.assert_array_equal(buf, want)
    s2, y2 = np.full(39, 4.0), np.zeros(39)
    g.bind(s=s2, y=y2)                    # separate arrays again (lowered again at s): no copy
    assert overlap_copies(g) == []
    g()
    np.testing.assert_array_equal(y2, 2.0)
    s3, y3 = np.full(39, 8.0), np.ones(39)
    g.bind(s=s3, y=y3)                    # the same overlaps as before: per-node updates
    assert g._exe.last_bind == "nodes"
    g()
    np.testing.assert_array_equal(y3, 4.5)


def test_the_fake_refuses_a_kernel_that_races():
    """What the copies prevent: a body reading memory it writes through another view."""
    from eagle_fx.testing.fake_cuda import FakeBuilder, FakeCudaError
    from hawk_fx.cuda_runtime import body_module
    buf = np.arange(9.0)
    values = [buf[:-1], buf[1:]]
    spec = smooth.specialize(smooth.layout_of(values)[0])
    mod = body_module(spec)
    ek = mod.emitted
    args = []
    for prm in ek.params:
        if prm.role in ("in_plane", "in_cell"):
            args.append(values[prm.index])
        elif prm.role in ("out_plane", "out_cell"):
            args.append(values[1])
        elif prm.role == "n":
            args.append(np.uint64(8))
        else:
            args.append(None)
    fb = FakeBuilder()
    last = ()
    for en in ek.entries:
        last = (fb.kernel(mod, en.name, 1, 32, tuple(args), after=last),)
    with pytest.raises(FakeCudaError, match="threads race"):
        fb.validate().launch()


def test_the_lowered_modules_compile_with_nvrtc():
    pytest.importorskip("cuda.bindings.nvrtc")
    from hawk_fx.emit import cuda as hcuda
    buf = np.arange(10.0)
    with fake():
        g = smooth_loop(buf[:-1], buf[1:], np.array([2], np.uint32))
    for name, mod in g._exe.plan.modules.items():
        cubin = hcuda.compile_cubin(mod.source, "sm_90")
        for entry in mod.entries:
            assert b"\0" + entry.encode() + b"\0" in cubin, f"{name}: entry {entry} missing"


SIZES = st.sampled_from([1, 2, 17, 255, 256, 257, CHUNK - 1, CHUNK, CHUNK + 1])


@settings(max_examples=30, deadline=None)
@given(n=SIZES, shift=st.integers(-3, 3).filter(bool), path=st.sampled_from(["graph", "loop", "eager"]),
       order=st.sampled_from(["creation", "lifo", 11]))
def test_overlapping_views_compute_as_numpy(n, shift, path, order):
    """Any shift either way, sizes around a block and the NumPy chunk, through a graph, a device
    loop of two turns and an eager call on the fake device, in any order the edges allow."""
    buf = np.random.default_rng(n + 10 * abs(shift)).standard_normal(n + abs(shift))
    want = numpy_smooth(buf, shift, 2 if path == "loop" else 1)
    s, y = views(buf, shift)
    if path == "eager":
        values = [s, y]
        layout, m = smooth.layout_of(values)
        cuda_call_kernel(smooth.specialize(layout), values, m, runtime=FakeRuntime(order=order))
    else:
        with fake(order):
            g = smooth_graph(s, y) if path == "graph" else smooth_loop(s, y, np.array([2], np.uint32))
        g()
    np.testing.assert_array_equal(buf, want)



def test_alias_pairs_are_overlaps_that_are_not_one_view():
    from eagle_fx.backends.cuda_lower import alias_pairs
    buf, other = np.arange(10.0), np.arange(10.0)
    arrays = [buf[:-1], buf[1:], buf[1:], other, buf[5:6]]     # 1 and 2: the same view, twice
    assert alias_pairs(arrays) == {(0, 1), (0, 2), (0, 4), (1, 4), (2, 4)}
    assert alias_pairs(arrays, 4) == {(0, 4), (1, 4), (2, 4)}
    assert alias_pairs(arrays, 3) == set()
