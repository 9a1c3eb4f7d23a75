"""What eagle_fx.diff.reverse refuses, and the lifetime of a Record.

Each refusal is checked for its exception type and for the words that tell the user what to do.
"""
from __future__ import annotations

import numpy as np
import pytest

import eagle_fx as eagle
import hawk_fx as hawk
from hawk_fx import Scalar
from hawk_fx import math as hm
from tour_kernels import accumulate, affine, below, cell, inc, square


@hawk.kernel
def wave(x: Scalar) -> Scalar:
    return hm.sin(x) * x

@eagle.Graph.builder
def model(x, y, record=False):
    g = eagle.Graph(record=record)
    a = affine(x, 2.0, 1.0, buffer=True)
    t = wave(a)                                  # a temporary: no buffer
    accumulate(t, y)
    g.result = square(a)
    return g


@pytest.fixture
def recorded():
    x = np.arange(4.0)
    g = model(x, np.zeros(4), record=True)
    g()
    return g


def test_reverse_without_wrt_lists_the_arguments(recorded):
    with pytest.raises(ValueError) as info:
        eagle.diff.reverse(recorded.record, {"result": np.ones(4)})
    msg = str(info.value)
    assert "wrt=" in msg and msg.rstrip().endswith("x, y"), msg


@pytest.mark.parametrize("where", ["wrt", "seed"])
def test_a_temporary_is_not_a_name(recorded, where):
    call = (lambda: eagle.diff.reverse(recorded.record, {"result": np.ones(4)}, wrt=("x", "t"))) if where == "wrt" \
        else (lambda: eagle.diff.reverse(recorded.record, {"t": np.ones(4)}, wrt=("x",)))
    with pytest.raises(KeyError) as info:
        call()
    msg = str(info.value)
    assert "'t'" in msg and "buffer=True" in msg and "t = kernel(..., buffer=True)" in msg, msg


def test_wrt_result_is_not_an_input(recorded):
    with pytest.raises(KeyError, match="'result'"):
        eagle.diff.reverse(recorded.record, {"result": np.ones(4)}, wrt=("result",))


@pytest.mark.parametrize("seed", [np.ones(3), np.ones((4, 1)), np.ones(4, np.float32), np.ones(4, np.int64)],
                         ids=["short", "2d", "float32", "int64"])
@pytest.mark.parametrize("key", ["result", "y", "a"])
def test_seed_of_the_wrong_shape_or_dtype(recorded, key, seed):
    with pytest.raises(ValueError) as info:
        eagle.diff.reverse(recorded.record, {key: seed}, wrt=("x",))
    msg = str(info.value)
    assert f"{key!r}" in msg and "(4,) float64" in msg and "shape and dtype" in msg, msg


def test_a_float32_graph_wants_float32_seeds():
    g = model(np.arange(4.0, dtype=np.float32), np.zeros(4, np.float32), record=True)
    g()
    with pytest.raises(ValueError, match="float32"):
        eagle.diff.reverse(g.record, {"result": np.ones(4)}, wrt=("x",))
    r = eagle.diff.reverse(g.record, {"result": np.ones(4, np.float32)}, wrt=("x",))
    assert r["x"].dtype == np.float32
    np.testing.assert_array_equal(r["x"], [4.0, 12.0, 20.0, 28.0])


def test_enqueue_on_a_recorded_graph(recorded):
    with pytest.raises(RuntimeError, match="launch"):
        recorded.enqueue()
    with pytest.raises(RuntimeError, match="launch"):
        model(np.arange(4.0), np.zeros(4), record=True).enqueue(2)


def test_record_of_a_graph_without_record_or_before_a_run():
    with pytest.raises(RuntimeError, match="record=True"):
        model(np.arange(4.0), np.zeros(4)).record
    with pytest.raises(RuntimeError, match="launch"):
        model(np.arange(4.0), np.zeros(4), record=True).record
    with pytest.raises(TypeError, match="g.record"):
        eagle.diff.reverse(model(np.arange(4.0), np.zeros(4)), {"result": np.ones(4)}, wrt=("x",))


def test_a_record_overwritten_by_a_later_launch_is_refused_and_a_copy_stays_usable():
    x = np.arange(4.0)
    g = model(x, np.zeros(4), record=True)
    g()
    rec, kept = g.record, g.record.copy()
    saved = rec.nbytes
    assert kept.nbytes == saved
    seeds = {"result": np.ones(4), "y": np.ones(4)}
    first = eagle.diff.reverse(rec, seeds, wrt=("x",))["x"]
    g.bind(x=x + 2.0)                              # new values: the next launch records other numbers
    with pytest.raises(RuntimeError, match="copy"):
        eagle.diff.reverse(rec, seeds, wrt=("x",))  # a bind already makes it stale
    g()
    with pytest.raises(RuntimeError, match=r"later launch.*g\.record\.copy\(\)"):
        eagle.diff.reverse(rec, seeds, wrt=("x",))
    with pytest.raises(RuntimeError, match="later launch"):
        rec.copy()
    np.testing.assert_array_equal(eagle.diff.reverse(kept, seeds, wrt=("x",))["x"], first)
    second = eagle.diff.reverse(g.record, seeds, wrt=("x",))["x"]
    a0, a1 = 2.0 * x + 1.0, 2.0 * (x + 2.0) + 1.0
    for a, got in ((a0, first), (a1, second)):        # d/dx [a^2 + sin(a) a + 1], a = 2x + 1
        np.testing.assert_allclose(got, 2.0 * (2.0 * a + np.cos(a) * a + np.sin(a)), rtol=1e-13)
    assert not np.allclose(first, second)


@eagle.Graph.builder
def looped(x, flag, record=False):
    g = eagle.Graph(record=record)
    for _ in range(10):
        if not flag: break
        x = wave(inc(x))
        below(x, 5.0, flag)
    g.result = x
    return g


def test_a_copied_record_keeps_its_loop_turns():
    x = np.array([0.1, 0.5, 0.9])
    g = looped(x, cell(1), record=True)
    g()
    kept = g.record.copy()
    first = eagle.diff.reverse(g.record, {"result": np.ones(3)}, wrt="x")["x"]
    g.bind(x=np.array([1.5, 1.6, 1.7]), flag=cell(1))   # fewer turns
    g()
    second = eagle.diff.reverse(g.record, {"result": np.ones(3)}, wrt="x")["x"]
    np.testing.assert_array_equal(eagle.diff.reverse(kept, {"result": np.ones(3)}, wrt="x")["x"], first)
    assert not np.allclose(first, second)


def test_an_uncapped_loop_cannot_be_recorded():
    @eagle.Graph.builder
    def bad(x, flag):
        g = eagle.Graph(record=True)
        while flag:
            x = inc(x)
            below(x, 10.0, flag)
        g.result = x
        return g
    with pytest.raises(ValueError, match=r"uncapped.*for _ in range\(N\)"):
        bad(np.ones(4), cell(1))


@eagle.Graph.builder
def counted(x, n, record=False):
    g = eagle.Graph(record=record)
    for i in range(n):
        x = wave(x)
    g.result = x
    return g


def test_a_counted_loop_running_more_turns_than_at_build_is_recorded_in_full():
    """The record's stack of saved turns grows with the turns run: a replay with a larger trip
    count than at build gives the gradient of all the turns it ran."""
    x, n = np.array([0.5, 1.0]), cell(2)
    g = counted(x.copy(), n, record=True)
    g()
    n[0] = 5
    g()
    got = eagle.diff.reverse(g.record, {"result": np.ones(2)}, wrt="x")["x"]
    want = np.ones(2)
    v = x.copy()
    for _ in range(5):                     # d/dv sin(v) * v, turn by turn, in plain NumPy
        want = want * (np.cos(v) * v + np.sin(v))
        v = np.sin(v) * v
    np.testing.assert_allclose(got, want, rtol=1e-12)


@eagle.Graph.builder
def buffer_in_a_loop(x, flag, record=False):
    g = eagle.Graph(record=record)
    for _ in range(3):
        if not flag: break
        t = wave(x, buffer=True)
        x = inc(t)
        below(x, 100.0, flag)
    g.result = x
    return g


@pytest.mark.parametrize("where", ["wrt", "seed"])
def test_a_buffer_inside_a_loop_body_is_refused_not_zero(where):
    """A buffer= made in a loop body has one value per turn: reverse used to give it a silent zero
    gradient (and drop its seed); it refuses it and says to give the buffer at top level."""
    g = buffer_in_a_loop(np.array([0.1, 0.2, 0.3]), cell(1), record=True)
    g()
    call = (lambda: eagle.diff.reverse(g.record, {"result": np.ones(3)}, wrt=("x", "t"))) if where == "wrt" \
        else (lambda: eagle.diff.reverse(g.record, {"t": np.ones(3)}, wrt=("x",)))
    with pytest.raises(ValueError, match=r"'t' is a buffer= made inside a device if/loop body.*top-level"):
        call()
    r = eagle.diff.reverse(g.record, {"result": np.ones(3)}, wrt=("x",))["x"]     # the rest still works
    assert np.all(r != 0)
