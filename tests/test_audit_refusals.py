"""Inputs an audit found answered with raw errors, wrongly refused, or wrongly accepted. Each refusal
names the API and what to change, and writes nothing; each accepted program matches NumPy."""
import threading

import numpy as np
import pytest

import eagle_fx
import hawk_fx as hawk
from conftest import refused
from hawk_fx import Mutable, Param, Scalar


@hawk.kernel
def spread(x: Scalar) -> Scalar:
    return x - hawk.max(x) + hawk.min(x)


@hawk.kernel
def total(x: Scalar) -> Scalar:
    return x * 0 + hawk.sum(x)


@hawk.kernel
def inverse(x: Scalar, p: Param) -> Scalar:
    return x * p ** -1


@hawk.kernel
def inverse_float(x: Scalar, p: Param) -> Scalar:
    return x * p ** -1.0


@hawk.kernel
def bump(s: Scalar, y: Mutable[Scalar]):
    y = y + s


@hawk.kernel
def add(a: Scalar, b: Scalar) -> Scalar:
    return a + b


@eagle_fx.Graph.builder
def bumped(s, y):
    g = eagle_fx.Graph()
    bump(s, y)
    return g


def test_max_and_min_of_no_samples_are_refused_naming_the_kernel_and_line():
    for _ in range(2):               # the second call goes through the fast entry
        refused(ValueError, lambda: spread(np.zeros(0)), "hawk.kernel spread", "hawk.max", "return x - hawk.max",
                "over 0 samples")
    assert total(np.zeros(0)).shape == (0,)          # a sum of nothing is 0: NumPy's too
    np.testing.assert_array_equal(spread(np.arange(3.0)), np.arange(3.0) - 2.0 + 0.0)


def test_max_of_no_samples_in_a_graph_is_refused_at_build():
    @eagle_fx.Graph.builder
    def g(x):
        gr = eagle_fx.Graph()
        gr.result = spread(x)
        return gr
    refused(ValueError, lambda: g(np.zeros(0)), "hawk.kernel spread", "over 0 samples")


def test_an_int_param_to_a_negative_int_power_is_refused_naming_the_line():
    for p in (2, np.array([2])):
        refused(ValueError, lambda: inverse(np.ones(3), p), "hawk.kernel inverse", "return x * p ** -1",
                "negative integer power", "** -1.0")
    np.testing.assert_array_equal(inverse_float(np.arange(3.0), 2), np.arange(3.0) * 2 ** -1.0)
    np.testing.assert_array_equal(inverse(np.arange(3.0), 2.0), np.arange(3.0) * 2.0 ** -1)


def test_a_read_only_mutable_argument_is_refused_at_build():
    y = np.zeros(4)
    y.flags.writeable = False
    refused(ValueError, lambda: bumped(np.ones(4), y), "eagle.Graph.builder bumped", "argument 'y'", "read-only",
            "writeable", untouched=[y])


@pytest.mark.parametrize("cell_first", [True, False])
def test_one_cell_planes_broadcast_whichever_call_comes_first(cell_first):
    @eagle_fx.Graph.builder
    def g(c, x):
        gr = eagle_fx.Graph()
        if cell_first:
            u = add(c, c)
            gr.result = add(u, x)
        else:
            v = add(x, c)
            gr.result = add(v, add(c, c))
        return gr
    c, x = np.array([1.5]), np.arange(4.0)
    want = (c + c) + x if cell_first else (x + c) + (c + c)
    np.testing.assert_array_equal(g(c, x)(), want)


@pytest.mark.parametrize("call", [lambda g: g(-1), lambda g: g.launch(2.5), lambda g: g.enqueue(2.5),
                                  lambda g: g(True), lambda g: g.launch("2")])
def test_nonsense_replay_counts_are_refused(call):
    y = np.zeros(4)
    g = bumped(np.ones(4), y)
    refused(ValueError, lambda: call(g), "eagle.Graph.", "replay count is a whole number >= 0", untouched=[y])
    g(np.int64(2))
    np.testing.assert_array_equal(y, np.full(4, 2.0))
    g(0)
    np.testing.assert_array_equal(y, np.full(4, 2.0))


def test_an_enqueued_replay_makes_its_read_inputs_read_only_until_it_ends():
    release = threading.Event()
    s, y = np.ones(5), np.zeros(5)

    @eagle_fx.Graph.builder
    def slow(s, y):
        g = eagle_fx.Graph()
        bump(s, y)
        g.add_node(eagle_fx.opaque(lambda: release.wait(10)))
        return g
    g = slow(s, y)
    g.enqueue()
    try:
        with pytest.raises(ValueError, match="read-only"):
            s[:] = 7.0                   # would tear the replay's result: refused
        assert y.flags.writeable         # the graph writes y itself
    finally:
        release.set()
        g.synchronize()
    assert s.flags.writeable
    s[:] = 2.0
    np.testing.assert_array_equal(y, np.ones(5))
    g()
    np.testing.assert_array_equal(y, np.full(5, 3.0))
