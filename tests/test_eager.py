"""disable_staging(): builders run as plain Python. Each tour form runs staged and eager on copies of
the same arrays, and the two agree value by value, results and arguments written in place, after
each change of the cells between runs."""
import copy
import warnings

import numpy as np
import pytest

import eagle_fx as eagle
from hawk_fx.tree import tree_flatten
from tour_kernels import accumulate, add, affine, below, cell, dbl, inc, over, square
from fuzz_kernels import total


def leaves(tree):
    return [np.array(x, copy=True) for x in tree_flatten(tree, is_leaf=lambda x: isinstance(x, np.ndarray))[0]]


def agree(builder, args, updates=({},), n=1):
    """Run `builder` staged and eager on copies of args; before each run, set the cells in one update
    ({argument index: value}); compare the results and every array argument after each run."""
    staged_args, eager_args = copy.deepcopy(args), copy.deepcopy(args)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", eagle.UncappedLoopWarning)
        g = builder(*staged_args)
        with eagle.disable_staging():
            e = builder(*eager_args)
        for update in updates:
            for k, v in update.items():
                staged_args[k][0] = v
                eager_args[k][0] = v
            want = leaves(e(n))
            got = leaves(g(n))
            assert len(got) == len(want)
            for a, b in zip(got, want):
                np.testing.assert_array_equal(a, b)
            for a, b in zip(staged_args, eager_args):
                if isinstance(a, np.ndarray):
                    np.testing.assert_array_equal(a, b)
    return g, e


x = np.arange(4.0)


@eagle.Graph.builder
def twice(g: eagle.Graph, v):
    return dbl(dbl(v))


@eagle.Graph.builder
def first(x):
    g = eagle.Graph()
    g.result = twice(g, inc(x))
    return g


@eagle.Graph.builder
def forks(x):
    g = eagle.Graph()
    a = dbl(x)
    with g.parallel() as p:
        with p.branch() as b:
            l = inc(a)
            l2 = dbl(l)
            with b.parallel() as q:
                with q.branch() as b1:
                    u = inc(l2)
                with q.branch() as b2:
                    v = dbl(l2)
        with p.branch() as w:
            w.wait(l)
            r = add(l, a)
    g.result = (u, v, r)
    return g


@eagle.Graph.builder
def choose(x, flag, which, debug):
    g = eagle.Graph()
    if flag:
        x = dbl(x)
    elif which:
        x = inc(x)
    else:
        x = add(x, x)
    if debug:
        x = inc(x)
    for k in (inc, dbl):
        x = k(x)
    g.result = x
    return g


@eagle.Graph.builder
def capped(x, flag):
    g = eagle.Graph()
    for _ in range(50):
        if not flag: break
        x = dbl(x)
        below(x, 100.0, flag)
    g.result = x
    return g


@eagle.Graph.builder
def counted(x, n):
    g = eagle.Graph()
    for i in range(n):
        x = inc(x)
    g.result = x
    return g


@eagle.Graph.builder
def early_exit(x, flag, done):
    g = eagle.Graph()
    while flag:
        x = inc(x)
        over(x, 2.5, done)
        if done: break
        x = dbl(x)
        below(x, 50.0, flag)
    g.result = x
    return g


@eagle.Graph.builder
def skipping(x, flag, skip):
    g = eagle.Graph()
    while flag:
        x = inc(x)
        below(x, 6.0, flag)
        over(x, 2.5, skip)
        if skip: continue
        x = dbl(x)
    g.result = x
    return g


@eagle.Graph.builder
def chooser(x, sel):
    g = eagle.Graph()
    match sel:
        case 0:
            x = dbl(x)
        case 2:
            x = inc(x)
        case _:
            x = square(x)
    g.result = x
    return g


@eagle.Graph.builder
def keep(x):
    g = eagle.Graph()
    mine = np.zeros(4)
    a = inc(x, buffer=True)
    b = dbl(a, buffer=mine)
    g.result = {"a": a, "pair": (b, [square(b)])}
    return g


@eagle.Graph.builder
def void(x, y):
    g = eagle.Graph()
    accumulate(x, y)
    return g


@eagle.Graph.builder
def model(x, y, record=False):
    g = eagle.Graph(record=record)
    a = affine(x, 2.0, 1.0, buffer=True)
    accumulate(a, y)
    g.result = square(a)
    return g


def test_builder_and_block():
    agree(first, (x,), n=3)


def test_forks_run_their_branches_in_order():
    agree(forks, (x,))


def test_device_if_elif_else_and_python_if_and_for():
    agree(choose, (x, cell(1), cell(1), True), [{}, {1: 0}, {2: 0}, {1: 1}])
    agree(choose, (x, cell(0), cell(0), False), [{}, {2: 1}])


def test_capped_counted_uncapped_loops_with_break_and_continue():
    agree(capped, (np.ones(4), cell(1)), [{}, {1: 1}, {1: 0}])
    agree(counted, (np.zeros(4), cell(3)), [{}, {1: 0}, {1: 7}])
    agree(early_exit, (np.zeros(4), cell(1), cell(0)), [{}, {1: 1, 2: 0}])
    agree(skipping, (np.zeros(4), cell(1), cell(0)), [{}, {1: 1, 2: 0}])


def test_match():
    agree(chooser, (np.full(4, 3.0), cell(0)), [{}, {1: 2}, {1: 5}])


def test_buffers_results_and_mutable_arguments():
    agree(keep, (x,))
    agree(void, (x, np.zeros(4)), n=2)
    agree(model, (x, np.zeros(4)))


def test_running_verbs_and_bind():
    g, e = agree(first, (x,))
    for h in (g, e):
        h.bind(x=x + 10.0)
        h.launch(2)
        h.enqueue(3)
        h.synchronize()
    np.testing.assert_array_equal(g.result, e.result)
    np.testing.assert_array_equal(e.result, 4.0 * (x + 11.0))
    with pytest.raises(ValueError, match="changed shape/dtype"):
        e.bind(x=np.arange(5.0))
    with pytest.raises(KeyError, match="not an array argument"):
        e.bind(z=x)


def test_each_call_runs_the_builder_again_and_reads_cells_then():
    seen = []

    @eagle.Graph.builder
    def noisy(x, flag):
        g = eagle.Graph()
        seen.append(int(flag[0]))       # plain Python: runs on every g(), sees the cell's value then
        if flag:
            x = dbl(x)
        g.result = x
        return g

    flag = cell(1)
    with eagle.disable_staging():
        e = noisy(x, flag)
    assert seen == []
    np.testing.assert_array_equal(e(), 2.0 * x)
    flag[0] = 0
    np.testing.assert_array_equal(e(), x)
    assert seen == [1, 0]
    assert "staging disabled" in repr(e)
    with pytest.raises(RuntimeError, match="keeps no record"):
        e.record


def test_buffer_labels_follow_their_name_in_eager_runs_too():
    M = np.zeros(4)

    @eagle.Graph.builder
    def f(x, n, c):
        g = eagle.Graph()
        own = inc(x, buffer=M)
        for _ in range(n):
            own = dbl(own)
        if c:
            own = square(own)
        g.result = inc(own)
        return g

    for cv in (1, 0):
        M[:] = 0.0
        with eagle.disable_staging():
            e = f(x, cell(3), cell(cv))
        e()
        want = (x + 1.0) * 8.0
        want = want * want if cv else want
        np.testing.assert_array_equal(M, want)
        np.testing.assert_array_equal(e.result, want + 1.0)
        M_eager = M.copy()
        M[:] = 0.0
        f(x, cell(3), cell(cv))()
        np.testing.assert_array_equal(M, M_eager)


def test_a_loop_decided_by_a_cell_in_its_guard_or_break_is_device_flow_in_eager_runs_too():
    """`if not c: break` / `if c: break` make the loop device flow whatever the cell holds, so a buffer's
    name rebound in it leaves its value in the buffer (found by the slow fuzzer: eager kept the first value)."""
    x = np.array([0.0, 1.0, 2.0])

    @eagle.Graph.builder
    def f(x, c, d, B):
        g = eagle.Graph()
        p = inc(x)
        own = dbl(x, buffer=B)
        for _ in range(2):
            if not c: break
            own = inc(p)
            if d: break
            p = dbl(p)
        g.result = own
        return g

    for cv, dv in ((1, 1), (1, 0), (0, 1), (0, 0)):
        p, want = x + 1.0, 2.0 * x
        for _ in range(2):          # the loop as plain NumPy
            if not cv:
                break
            want = p + 1.0
            if dv:
                break
            p = 2.0 * p
        for staged in (True, False):
            B = np.full(3, -1.0)
            with eagle.disable_staging(not staged):
                g = f(x, cell(cv), cell(dv), B)
            np.testing.assert_array_equal(g(), want)
            np.testing.assert_array_equal(B, want, err_msg=f"c={cv} d={dv} staged={staged}")


def test_transforms_stage_inside_disable_staging():
    from tour_kernels import wobble

    @eagle.Graph.builder
    def loss(x):
        g = eagle.Graph()
        g.result = total(wobble(x))
        return g

    x = np.array([0.3, -1.2, 2.0])
    with eagle.disable_staging():
        got = eagle.grad(loss)(x)
        batched = np.asarray(eagle.vmap(loss)(np.stack([x, 2.0 * x]))())
    np.testing.assert_allclose(got, 0.2 * (np.sin(x) * x) * (np.cos(x) * x + np.sin(x)), rtol=1e-12)
    np.testing.assert_allclose(batched.reshape(2), [0.1 * np.sum((np.sin(r) * r) ** 2) for r in (x, 2.0 * x)], rtol=1e-12)


def test_a_capped_loop_is_device_flow_in_eager_runs_too():
    # found by the differential fuzzer: `if not flag: break` made the guard a Python bool, so the
    # eager run did not leave the rebound name's value in its buffer
    M = np.zeros(4)

    @eagle.Graph.builder
    def f(x, flag, stop):
        g = eagle.Graph()
        own = inc(x, buffer=M)
        for _ in range(3):
            if not flag: break
            own = dbl(own)
            if stop and flag: break
        g.result = own
        return g

    for stop in (0, 1):
        with eagle.disable_staging():
            e = f(x, cell(1), cell(stop))
        np.testing.assert_array_equal(e(), (x + 1.0) * (2.0 if stop else 8.0))
        np.testing.assert_array_equal(M, (x + 1.0) * (2.0 if stop else 8.0))


def test_g_hands_out_the_same_result_arrays_at_every_run_as_staged():
    @eagle.Graph.builder
    def parts(x):
        g = eagle.Graph()
        y = dbl(x)
        g.result = {"y": y, "tail": y[1:], "x": x, "xs": x[:2]}
        return g

    x0, x1 = np.arange(3.0), np.array([5.0, -1.0, 0.5])
    results = []
    for staged in (True, False):
        x = x0.copy()
        if staged:
            g = parts(x)
        else:
            with eagle.disable_staging():
                g = parts(x)
        a = g()
        g.bind(x=x1.copy())
        b = g()
        assert a["y"] is b["y"] and a["tail"] is b["tail"]      # the graph's own arrays
        np.testing.assert_array_equal(a["y"], 2.0 * x1)           # the first run's array, refilled
        np.testing.assert_array_equal(a["tail"], 2.0 * x1[1:])
        np.testing.assert_array_equal(a["x"], x0)                 # the caller's arrays are never written
        np.testing.assert_array_equal(b["x"], x1)
        np.testing.assert_array_equal(b["xs"], x1[:2])
        results.append((a, b))
    for k in ("y", "tail", "x", "xs"):
        np.testing.assert_array_equal(results[0][1][k], results[1][1][k])
