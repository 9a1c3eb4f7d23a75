"""The memory planner (eagle_fx/backends/memory.py) is one module the NumPy backend and the CUDA
lowering share: the same expectations hold on both (the CUDA lowering through the recording fake).
Oracles: plain NumPy loops, and buffer counts reasoned from liveness (a chain needs two buffers in
turn; a loop carry stays in one)."""
import gc

import numpy as np
import pytest

import eagle_fx
from eagle_fx.backends.cuda import use_backend
from eagle_fx.backends.memory import SlotPlanner
from hawk_fx.core import SAMPLE, AVal, Literal, Var
from tour_kernels import affine, cell, dbl, inc

N = 1000
BACKENDS = ["numpy", "fake-cuda"]


def slots(g):
    exe = g._exe
    return exe.slots if hasattr(exe, "slots") else exe.plan.slots


def planes(g, n=N):
    """The distinct buffers of n samples the executable holds."""
    return {id(a): a for a in slots(g) if a.shape == (n,)}


def build(builder, *args, backend):
    was = gc.isenabled()
    gc.disable()                           # plans must not depend on when the collector runs
    try:
        with use_backend(backend):
            return builder(*args)
    finally:
        if was:
            gc.enable()


@pytest.fixture
def data():
    return np.random.default_rng(5).uniform(0.5, 3.0, N)


@eagle_fx.Graph.builder
def chain(x, m):
    g = eagle_fx.Graph()
    for i in range(m):
        x = affine(x, 0.5, float(i % 3))
    g.result = x
    return g


@eagle_fx.Graph.builder
def taps(x):
    g = eagle_fx.Graph()
    out = []
    for i in range(12):
        x = inc(x)
        if i % 4 == 3:
            out.append(x)                  # a plane the result names keeps its own buffer
    g.result = out
    return g


@eagle_fx.Graph.builder
def carried(x, n):
    g = eagle_fx.Graph()
    s = inc(x)
    for _ in range(n):
        s = affine(s, 0.5, 1.0)
        s = dbl(s)
    g.result = s
    return g


@eagle_fx.Graph.builder
def swapper(a, b, n):
    g = eagle_fx.Graph()
    for _ in range(n):
        a, b = b, inc(a)                   # each carry's new value is the other's old one
    g.result = (a, b)
    return g


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_long_chain_reuses_two_buffers_in_turn(backend, data):
    g = build(chain, data, 40, backend=backend)
    assert len(planes(g)) <= 3, len(planes(g))          # the input and two buffers in turn, not 40
    want = data
    for i in range(40):
        want = 0.5 * want + float(i % 3)
    np.testing.assert_allclose(g(), want, rtol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
def test_planes_the_result_names_keep_their_buffers(backend, data):
    g = build(taps, data, backend=backend)
    got = g()
    x, want = data, []
    for i in range(12):
        x = x + 1.0
        if i % 4 == 3:
            want.append(x)
    for t, w in zip(got, want):
        np.testing.assert_array_equal(t, w)
    assert len({id(t) for t in got}) == 3 and len(planes(g)) <= 1 + 3 + 2


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_loop_carry_stays_in_one_buffer(backend, data):
    n = cell(0)
    g = build(carried, data, n, backend=backend)
    assert len(planes(g)) <= 5, len(planes(g))
    first = None
    for nv in (0, 1, 4):
        n[0] = nv
        got = g()
        want = data + 1.0
        for _ in range(nv):
            want = 2.0 * (0.5 * want + 1.0)
        np.testing.assert_allclose(got, want, rtol=1e-12)
        first = got if first is None else first
        assert got is first


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("turns", [0, 1, 2, 5])
def test_carries_that_swap_are_copied_aside_first(backend, turns, data):
    other = data[::-1].copy()
    g = build(swapper, data, other, cell(turns), backend=backend)
    a, b = data, other
    for _ in range(turns):
        a, b = b, a + 1.0
    got = g()
    np.testing.assert_array_equal(got[0], a)
    np.testing.assert_array_equal(got[1], b)


class _Planner(SlotPlanner):
    """The planner alone, over NumPy arrays."""

    def __init__(self):
        self.slots, self.slot_of = [], {}
        self._init_pool()

    @staticmethod
    def _zeros(shape, dtype):
        return np.zeros(shape, dtype)


def test_copy_moves_is_a_parallel_assignment():
    av = AVal((3,), np.float64, SAMPLE)
    p = _Planner()
    x, y, z = Var(av), Var(av), Var(av)
    for v in (x, y, z):
        p.slot_of[v] = p._new_slot(np.zeros(3))
    sx, sy, sz = p.slot_of[x], p.slot_of[y], p.slot_of[z]
    # (x, y, z) := (y, x, 2.0): x's and y's old values swap, z takes a constant
    moves = p._copy_moves([y, x, Literal(2.0)], [sx, sy, sz])
    for k, v in enumerate((x, y, z)):
        p.slots[p.slot_of[v]][:] = k + 1.0
    for dst, src in moves:                               # run the moves in order
        p.slots[dst][:] = src.value if isinstance(src, Literal) else p.slots[p.slot_of[src]]
    np.testing.assert_array_equal(p.slots[sx], 2.0)
    np.testing.assert_array_equal(p.slots[sy], 1.0)
    np.testing.assert_array_equal(p.slots[sz], 2.0)
    assert p._copy_moves([x, y], [sx, sy]) == []         # already in place: nothing to copy


def test_a_freed_slot_is_reused_only_where_it_fits():
    av = AVal((3,), np.float64, SAMPLE)
    p = _Planner()
    a = p._alloc(av)
    p._free(a)
    assert p._alloc(av, lambda k: False) != a            # refused by `fits`: a new slot
    assert p._alloc(av) == a                             # taken again
    p._free(p._new_slot(np.zeros(3)))                    # not made by the pool (a caller's array): never pooled
    assert p._alloc(av) == len(p.slots) - 1 == 3         # a new slot
