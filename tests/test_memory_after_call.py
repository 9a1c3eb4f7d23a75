"""A cached transformed call keeps its graph's code, not its data: the stacks of saved loop turns
(and kernel scratch) over the release threshold are dropped when the call returns, and the next
call grows them again to the same values."""
import gc
import tracemalloc

import numpy as np
import pytest

import eagle_fx as eagle
import hawk_fx as hawk
from eagle_fx.frontend import cache
from hawk_fx import Scalar
from hawk_fx import math as hm

TURNS, N = 20_000, 200


@hawk.kernel
def relax(x: Scalar) -> Scalar:
    return x + 0.001 * hm.sin(x)


@hawk.kernel
def total(x: Scalar) -> Scalar:
    return hawk.sum(x * x)


@eagle.Graph.builder
def long_loop(x, turns):
    g = eagle.Graph()
    for _ in range(turns):
        x = relax(x)
    g.result = total(x)
    return g


def oracle(x, turns):
    """sum(x_T^2) and its gradient by the chain rule, turn by turn in NumPy."""
    d = np.ones_like(x)
    for _ in range(turns):
        d *= 1 + 0.001 * np.cos(x)
        x = x + 0.001 * np.sin(x)
    return np.sum(x * x), 2 * x * d


def held_by(call):
    """Bytes still allocated (tracemalloc) after call() returns and its results are dropped."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        call()
        gc.collect()
        return tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()


@pytest.fixture
def vg():
    f = eagle.value_and_grad(long_loop)
    yield f
    f.clear_cache()


def test_long_loop_memory_falls_back_after_the_call(vg):
    x, trip = np.linspace(0.1, 3.0, N), np.array([TURNS], np.uint32)
    want_v, want_g = oracle(x, TURNS)
    results = []
    held = held_by(lambda: results.append(vg(x, trip)))     # the first call stages, lowers and runs
    assert held < 5e6, f"{held / 1e6:.1f} MB held after the call (the stacks alone are {TURNS * N * 8 / 1e6:.0f} MB)"
    held = held_by(lambda: results.append(vg(x, trip)))     # a cached call: the released stacks regrow
    assert held < 5e6
    assert vg.cache_info().hits == 1
    for v, g in results:
        np.testing.assert_allclose(v, want_v, rtol=1e-12)
        np.testing.assert_allclose(g, want_g, rtol=1e-10)


def test_the_threshold_is_configurable(vg, monkeypatch):
    monkeypatch.setattr(cache, "RELEASE_BYTES", 1 << 40)    # nothing is that large: everything is kept
    x, trip = np.linspace(0.1, 3.0, N), np.array([TURNS // 4], np.uint32)
    held = held_by(lambda: vg(x, trip))
    assert held > TURNS // 4 * N * 8
    monkeypatch.setattr(cache, "RELEASE_BYTES", 1 << 20)
    want_v, want_g = oracle(x, TURNS // 4)
    v, g = vg(x, trip)
    np.testing.assert_allclose(v, want_v, rtol=1e-12)
    np.testing.assert_allclose(g, want_g, rtol=1e-10)
    assert held_by(lambda: vg(x, trip)) < 5e6
