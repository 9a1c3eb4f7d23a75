"""Inputs that overlap a Mutable (two views of one buffer), at sizes around the chunk boundary.

A call computes what NumPy computes for `y[1:] = 0.5 * y[:-1] + 0.5 * y[1:]`: every input is read
before any output is written, whatever order the chunks run in. The oracle is that NumPy line."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from eagle_fx.backends import cuda
from eagle_fx.testing.fake_cuda import FakeRuntime
from hawk_fx.emit.numpy import CHUNK
from aliasing_kernels import scale, smooth, smooth_graph, views

pytestmark = pytest.mark.usefixtures("backend_heavy")     # on numpy; on jax too with -m slow (compiles)


def numpy_smooth(buf, shift):
    out = buf.copy()
    s, y = views(out, shift)
    y[...] = 0.5 * s + 0.5 * y          # NumPy evaluates the right side first
    return out


def test_the_audit_repro_an_input_one_sample_behind_its_mutable():
    buf = np.arange(32770.0)
    want = numpy_smooth(buf, 1)
    smooth(buf[:-1], buf[1:])
    assert buf[32769] == 32768.5
    np.testing.assert_array_equal(buf, want)


def test_the_audit_repro_through_a_graph_on_two_views():
    buf = np.arange(32770.0)
    want = numpy_smooth(buf, 1)
    g = smooth_graph(buf[:-1], buf[1:])
    g()
    np.testing.assert_array_equal(buf, want)
    g()                                  # each replay reads its inputs before it writes
    np.testing.assert_array_equal(buf, numpy_smooth(want, 1))


def test_a_graph_bound_to_overlapping_views_later():
    buf, other = np.arange(40000.0), np.arange(40000.0)
    g = smooth_graph(other[:-1].copy(), other[1:])
    want = numpy_smooth(buf, 1)
    g.bind(s=buf[:-1], y=buf[1:])
    g()
    np.testing.assert_array_equal(buf, want)


def test_a_param_cell_inside_the_mutable_it_scales():
    y = np.linspace(1.0, 2.0, 3 * CHUNK)
    a = y[10:11]                         # written by the first chunk, read by every chunk
    want = y * y[10] + 1.0
    scale(a, y)
    np.testing.assert_array_equal(y, want)


def test_the_same_view_twice_and_a_separate_copy_are_unchanged():
    y = np.arange(2 * CHUNK + 5.0)
    want = y.copy()
    smooth(y, y)
    np.testing.assert_array_equal(y, want)
    s = np.arange(2 * CHUNK + 5.0)[::-1].copy()
    want = 0.5 * s + 0.5 * y
    smooth(s, y)
    np.testing.assert_array_equal(y, want)
    y2 = np.arange(2 * CHUNK + 5.0)
    smooth(y2[:], y2)                    # another object, the very same view: nothing to copy
    np.testing.assert_array_equal(y2, np.arange(2 * CHUNK + 5.0))


def test_an_overlapping_input_on_the_fake_device():
    buf = np.arange(CHUNK + 2.0)
    want = numpy_smooth(buf, 1)
    values = [buf[:-1], buf[1:]]
    layout, n = smooth.layout_of(values)
    cuda.call_kernel(smooth.specialize(layout), values, n, runtime=FakeRuntime())
    np.testing.assert_array_equal(buf, want)


SIZES = st.sampled_from([CHUNK - 2, CHUNK - 1, CHUNK, CHUNK + 1, CHUNK + 2, CHUNK + 7,
                         2 * CHUNK - 1, 2 * CHUNK + 1, 3 * CHUNK + 3, 17])


@settings(max_examples=40, deadline=None)
@given(n=SIZES, shift=st.integers(-3, 3).filter(bool), path=st.sampled_from(["fast", "keywords", "graph"]),
       step=st.sampled_from([1, 2]))
def test_overlapping_views_compute_as_numpy(n, shift, path, step):
    """Any shift either way, strided or not, through the fast entry, the full binding path and a graph."""
    base = np.random.default_rng(n + shift).standard_normal((n + abs(shift)) * step)
    buf = base[::step]
    want = numpy_smooth(buf, shift)
    s, y = views(buf, shift)
    if path == "fast":
        smooth(s, y)
    elif path == "keywords":
        smooth(s=s, y=y)
    else:
        smooth_graph(s, y)()
    np.testing.assert_array_equal(buf, want)
    if step == 2:                                # the samples between the views' are untouched
        fresh = np.random.default_rng(n + shift).standard_normal((n + abs(shift)) * step)
        np.testing.assert_array_equal(base[1::2], fresh[1::2])


@pytest.mark.parametrize("shift", [1, -1])
def test_an_eager_call_leaves_no_copy_behind_on_the_fast_entry(shift):
    """The next call through the fast entry sees the same overlap and copies again."""
    buf = np.arange(CHUNK + 10.0)
    want = numpy_smooth(numpy_smooth(buf, shift), shift)
    for _ in range(2):
        smooth(*views(buf, shift))
    np.testing.assert_array_equal(buf, want)
