"""checkpoints=K: reverse mode through a device loop keeps at most K of its states and runs the
loop again from them, on the binomial schedule.

Oracles: the schedule against an exhaustive search of every schedule's cost and a simulation of
the states it visits; gradients against the stored reverse (the same arithmetic, so equal to
rounding), JAX's grad of the loop written in Python, and finite differences; memory against
tracemalloc and a bound computed from the sizes."""
from __future__ import annotations

import tracemalloc
import warnings
from functools import lru_cache

import numpy as np
import pytest

import eagle_fx as eagle
import hawk_fx as hawk
from eagle_fx.transforms import checkpoint
from hawk_fx import Scalar
from hawk_fx import math as hm
from test_compose import central, nested as compose_nested, numpy_nested
from test_grad_graph import capped, counted, fd_grads, nested
from test_one_reverse_mode import jax_grad, numpy_turns, settle, settle_counted, settle_uncapped
from tour_kernels import below, cell, total


# ---------------------------------------------------------------------------------------------
# the schedule

@lru_cache(None)
def least_cost(n, free):
    """The fewest turns run again to reverse n turns from a kept state with `free` more slots:
    every first split tried (the exhaustive search the binomial schedule is checked against)."""
    if n <= 1:
        return 0
    if free == 0:
        return n * (n - 1) // 2
    return min(m + least_cost(n - m, free - 1) + least_cost(m, free) for m in range(1, n))


@pytest.mark.parametrize("K", range(1, 7))
def test_the_schedule_runs_the_fewest_turns_again(K):
    for T in range(1, 90):
        assert checkpoint.cost(T, K) == least_cost(T, K - 1), (T, K)


def simulate(T, K):
    """Run the schedule on integer states: (turns reversed in order, runs per turn, slots used)."""
    work, slots, order, runs, used = [0], {}, [], [0] * T, set()

    def advance(t):
        assert work[0] == t, "a turn runs from its own state"
        runs[t] += 1
        work[0] = t + 1

    def reverse(t):
        assert work[0] == t, "a reverse step starts from its turn's state"
        order.append(t)

    def store(j):
        assert 0 <= j < K
        slots[j] = work[0]
        used.add(j)

    def restore(j):
        work[0] = slots[j]
    checkpoint.run(T, K, advance, reverse, store, restore)
    return order, runs, used


@pytest.mark.parametrize("T, K", [(1, 1), (7, 1), (20, 2), (100, 3), (1000, 8), (20_000, 32), (5, 64)])
def test_the_schedule_reverses_every_turn_from_its_state_within_k_slots(T, K):
    order, runs, used = simulate(T, K)
    assert order == list(range(T - 1, -1, -1))
    assert len(used) <= K
    r = checkpoint.repetitions(T, K)
    assert max(runs) <= r                       # each turn runs again at most r times
    assert sum(runs) == r * T - checkpoint.beta(K + 1, r - 1) if T > 1 else sum(runs) == 0


def test_repetitions_for_twenty_thousand_turns():
    """The figures docs/transforms.md quotes: C(K + r, K) >= 20 000."""
    assert [checkpoint.repetitions(20_000, K) for K in (8, 32, 128)] == [9, 4, 3]


# ---------------------------------------------------------------------------------------------
# gradients: checkpointed == stored, on every loop form

X = np.array([0.5, 1.0, 1.5])
FORMS = {
    "capped": (capped, (X, np.array([1.3]), cell(1))),
    "counted": (counted, (np.array([0.3, -0.7, 1.1]), cell(4))),
    "uncapped": (settle_uncapped, (np.linspace(1.0, 2.0, 5), cell(1))),
    "capped, 200 000": (settle, (np.linspace(1.0, 2.0, 5), cell(1))),
    "nested": (nested, (np.array([0.1, 0.2, 0.3]), np.array([0.9]), cell(1), cell(2))),
}


def _fresh(args):
    return tuple(a.copy() for a in args)


@pytest.mark.parametrize("K", [1, 2, 5, 64])
@pytest.mark.parametrize("form", list(FORMS))
def test_checkpointed_gradients_equal_stored_ones(form, K):
    builder, args = FORMS[form]
    rng = np.random.default_rng(K)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        y, pull = eagle.vjp(builder, *_fresh(args))
        yk, pullk = eagle.vjp(builder, *_fresh(args), checkpoints=K)
    np.testing.assert_array_equal(yk, y)
    seed = rng.normal(size=y.shape)
    for got, want in zip(pullk(seed), pull(seed)):
        if want is not None:
            np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-300, err_msg=form)


def test_checkpointed_gradient_against_jax_and_finite_differences():
    x = np.linspace(1.0, 2.0, 6)
    got = eagle.grad(settle, checkpoints=3)(x, cell(1))
    np.testing.assert_allclose(got, jax_grad(x, numpy_turns(x)), rtol=1e-12)
    c = np.array([1.3])
    _, pull = eagle.vjp(capped, X.copy(), c.copy(), cell(1), checkpoints=2)
    seed = np.array([1.0, -0.5, 2.0])
    dx, dc, _ = pull(seed)
    fd = fd_grads(capped, {"x": X, "c": c, "flag": cell(1)}, {"result": seed}, ["x", "c"])
    np.testing.assert_allclose(dx, fd["x"], rtol=1e-6)
    np.testing.assert_allclose(dc, fd["c"], rtol=1e-6)


def test_value_and_grad_with_checkpoints():
    x = np.linspace(0.1, 1.0, 7)
    v, dx = eagle.value_and_grad(settle_counted, checkpoints=2)(x, cell(9))
    v0, dx0 = eagle.value_and_grad(settle_counted)(x, cell(9))
    np.testing.assert_array_equal(v, v0)
    np.testing.assert_allclose(dx, dx0, rtol=1e-13)
    np.testing.assert_allclose(dx, jax_grad(x, 9), rtol=1e-12)


def test_under_vmap_each_instance_reverses_its_own_turns():
    B, n = 3, 40
    xs = np.stack([np.linspace(1.0, 2.0, n), np.linspace(30.0, 40.0, n), np.linspace(5.0, 6.0, n)])
    flags = np.ones((B, 1), np.uint32)
    stored = eagle.vmap(eagle.grad(settle))(xs, flags)
    for K in (1, 3, 8):
        got = eagle.vmap(eagle.grad(settle, checkpoints=K))(xs, flags)
        np.testing.assert_allclose(got, stored, rtol=1e-13, err_msg=f"K={K}")
    for b in range(B):
        np.testing.assert_allclose(got[b], jax_grad(xs[b], numpy_turns(xs[b])), rtol=1e-12)
    trips = np.array([[3], [0], [7]], np.uint32)              # a trip count per instance
    xs3 = xs[:, :5] / 40.0
    stored = eagle.vmap(eagle.grad(settle_counted))(xs3, trips)
    got = eagle.vmap(eagle.grad(settle_counted, checkpoints=2))(xs3, trips)
    np.testing.assert_allclose(got, stored, rtol=1e-13)
    for b in range(B):
        np.testing.assert_allclose(got[b], jax_grad(xs3[b], int(trips[b, 0])), rtol=1e-12)


@pytest.mark.parametrize("K", [None, 3])
def test_an_uncapped_loop_under_vmap(K):
    """Stored or checkpointed: each instance its own number of turns (the guard is set on entry,
    so an instance already past 100 still runs one)."""
    xs = np.stack([np.linspace(1.0, 2.0, 20), np.linspace(30.0, 40.0, 20), np.linspace(100.0, 140.0, 20)])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = eagle.vmap(eagle.grad(settle_uncapped, checkpoints=K))(xs, np.ones((3, 1), np.uint32))
    for b in range(3):
        np.testing.assert_allclose(got[b], jax_grad(xs[b], max(1, numpy_turns(xs[b]))), rtol=1e-12)


def test_nested_loops_under_vmap_with_a_trip_count_and_a_flag_per_instance():
    """Counted loops in a counted loop, a conditional arm and a written argument: every instance
    its own turns; checkpointed == stored, and central differences of plain NumPy agree."""
    rng = np.random.default_rng(0)
    xs, y, a = rng.random((3, 5)), np.linspace(0.2, 0.5, 5), np.array([0.6])
    ns, cs = np.array([[2], [0], [3]], np.uint32), np.array([[1], [0], [1]], np.uint32)
    stored = eagle.vmap(eagle.grad(compose_nested), in_axes=(0, None, None, 0, 0))(xs, y, a, ns, cs)
    for K in (1, 2, 4):
        got = eagle.vmap(eagle.grad(compose_nested, checkpoints=K), in_axes=(0, None, None, 0, 0))(xs, y, a, ns, cs)
        np.testing.assert_allclose(got, stored, rtol=1e-13, err_msg=f"K={K}")
    for b in range(3):
        fd = central(lambda x: numpy_nested(x, y, a, int(ns[b, 0]), int(cs[b, 0])), xs[b])
        np.testing.assert_allclose(got[b], fd, rtol=1e-5, atol=1e-7 * np.max(np.abs(fd)))    # fd's own error


# ---------------------------------------------------------------------------------------------
# record=True, checkpoints=K

@hawk.kernel
def creep(x: Scalar) -> Scalar:
    return 1.1 * x + 0.05 * hm.sin(x)


@eagle.Graph.builder
def settle_rec(x, flag, record=False, checkpoints=None):
    g = eagle.Graph(record=record, checkpoints=checkpoints)
    for _ in range(500):
        if not flag: break
        x = creep(x)
        below(x, 100.0, flag)
    g.result = x
    return g


def test_a_checkpointed_record_reverses_as_the_stored_one():
    x = np.linspace(1.0, 2.0, 200)
    seed = np.random.default_rng(0).normal(size=200)
    full = settle_rec(x.copy(), cell(1), record=True)
    full()
    want = eagle.diff.reverse(full.record, {"result": seed}, wrt="x")["x"]
    for K in (1, 4):
        g = settle_rec(x.copy(), cell(1), record=True, checkpoints=K)
        np.testing.assert_array_equal(g(), full.result)
        got = eagle.diff.reverse(g.record, {"result": seed}, wrt="x")["x"]
        np.testing.assert_allclose(got, want, rtol=1e-13)
        assert g.record.nbytes < full.record.nbytes / 10       # the carries on entry, not ~50 turns
    g.bind(x=x + 0.5, flag=cell(1))                            # replays: another start, other turns
    g()
    again = settle_rec(x + 0.5, cell(1), record=True)
    again()
    np.testing.assert_allclose(eagle.diff.reverse(g.record, {"result": seed}, wrt="x")["x"],
                               eagle.diff.reverse(again.record, {"result": seed}, wrt="x")["x"], rtol=1e-13)


# ---------------------------------------------------------------------------------------------
# memory: K states of the loop, not T

@hawk.kernel
def relax(x: Scalar) -> Scalar:
    return x + 0.001 * hm.sin(x)


@eagle.Graph.builder
def long_loop(x, n):
    g = eagle.Graph()
    for i in range(n):
        x = relax(x)
    g.result = total(x)
    return g


def first_run_peak(g):
    tracemalloc.start()
    try:
        out = g()
        return out, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_checkpointed_memory_is_k_states_not_t():
    n, T, K = 1000, 2000, 8
    x = np.linspace(0.1, 3.0, n)
    got, peak = first_run_peak(eagle.grad(long_loop, checkpoints=K).graph(x, cell(T)))
    assert peak < (K + 32) * n * 8, peak                  # the kept states and a few planes
    stored, stored_peak = first_run_peak(eagle.grad(long_loop).graph(x, cell(T)))
    assert stored_peak > T * n * 8                        # the stored reverse holds every turn
    np.testing.assert_allclose(got, stored, rtol=1e-13)


@pytest.mark.slow
def test_twenty_thousand_turns_with_32_states_peak_under_24_mb():
    n, T = 1000, 20_000
    x = np.linspace(0.1, 3.0, n)
    got, peak = first_run_peak(eagle.grad(long_loop, checkpoints=32).graph(x, cell(T)))
    assert peak < 24e6, peak
    stored, stored_peak = first_run_peak(eagle.grad(long_loop).graph(x, cell(T)))
    assert stored_peak > 160e6
    np.testing.assert_allclose(got, stored, rtol=1e-13)


# ---------------------------------------------------------------------------------------------
# refusals

def test_refusals():
    x = np.linspace(0.1, 1.0, 4)
    for bad in (0, -2, 2.5, "8"):
        with pytest.raises(ValueError, match="checkpoints="):
            eagle.grad(settle_counted, checkpoints=bad)(x, cell(2))
    with pytest.raises(ValueError, match="checkpoints= is for record=True"):
        eagle.Graph(checkpoints=4)
    with pytest.raises(ValueError, match="forward mode over a checkpointed reverse"):
        eagle.jvp(eagle.grad(settle_counted, checkpoints=2), (x, cell(2)), (np.ones(4), None))


def test_the_jax_backend_refuses_a_checkpointed_reverse():
    pytest.importorskip("jax")
    from eagle_fx.backends.select import use_backend
    with use_backend("jax"), pytest.raises(ValueError, match="checkpointed"):
        eagle.grad(settle_counted, checkpoints=2)(np.linspace(0.1, 1.0, 4), cell(2))


def test_reverse_over_a_checkpointed_reverse_is_refused_saying_what_to_write():
    """grad over grad(..., checkpoints=K): the revolve equation has no reverse rule; the refusal
    names checkpoints= and the way that works (the inner derivative without it)."""
    x = np.linspace(1.0, 2.0, 4)
    outer = eagle.grad(lambda u: eagle.grad(settle, checkpoints=2)(u, cell(1)).sum())
    with pytest.raises(eagle.transforms.program.TransformError, match="reverse mode over a checkpointed reverse pass.*without checkpoints"):
        outer(x)
