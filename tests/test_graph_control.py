"""Builder control flow in combination: device if/elif/else, match, capped, counted and uncapped loops,
break/continue, forks calling blocks, nested loops and Python control flow decided at build.

Every graph is checked against a reference written in plain NumPy with Python control flow. Device
conditions are one-cell uint32 arrays read at every replay, so each test builds once and then changes
the cells (c[0] = v) between replays."""
import itertools
import warnings

import numpy as np
import pytest

import eagle_fx
import hawk_fx as hawk
from hawk_fx import Mutable, Param, Scalar, UInt32
from hawk_fx import math as hm
from tour_kernels import add, affine, below, cell, dbl, inc, over, square

pytestmark = pytest.mark.usefixtures("backend")     # every test on numpy and on jax


@hawk.kernel
def odd(t: Scalar, flag: Mutable[UInt32]):
    flag = hm.uint32(hm.fmod(t, 2.0))


def n_below(x, lim):
    return int(np.sum(x < lim))


def n_over(x, lim):
    return int(np.sum(x > lim))


# ---------------------------------------------------------------------------------------------
# a capped device loop inside an elif arm

CAP = 12


@eagle_fx.Graph.builder
def elif_loop(x, a, b):
    g = eagle_fx.Graph()
    if a:
        x = inc(x)
    elif b:
        for _ in range(CAP):
            if not b:
                break
            x = dbl(x)
            below(x, 50.0, b)
    else:
        x = square(x)
    g.result = x
    return g


def ref_elif_loop(x, a, b):
    x = x.copy()
    if a:
        x = x + 1.0
    elif b:
        for _ in range(CAP):
            if not b:
                break
            x = 2.0 * x
            b = n_below(x, 50.0)
    else:
        x = x * x
    return x, b


@pytest.mark.parametrize("x0", [np.array([1.0, 3.0, 7.0, 60.0]),      # leaves once every sample >= 50
                                np.array([0.0, 1.0, 2.0, 3.0])])     # a 0 never grows: the cap ends it
def test_capped_loop_in_elif_arm(x0):
    a, b = cell(0), cell(0)
    g = elif_loop(x0, a, b)
    for av, bv in [(1, 0), (0, 1), (0, 0), (1, 1), (0, 1), (0, 5)]:
        a[0], b[0] = av, bv
        want, want_b = ref_elif_loop(x0, av, bv)
        np.testing.assert_array_equal(g(), want)
        assert int(b[0]) == want_b              # the loop's guard is the caller's cell, written in place
    np.testing.assert_array_equal(x0, x0.copy())


def test_capped_loop_runs_at_most_cap_turns():
    x0 = np.array([0.0, 1.0])
    a, b = cell(0), cell(1)
    g = elif_loop(x0, a, b)
    np.testing.assert_array_equal(g(), [0.0, 2.0 ** CAP])
    assert b[0] == 1                             # the guard still reads 1: the cap, not the guard, ended it


# ---------------------------------------------------------------------------------------------
# match inside a counted loop

@eagle_fx.Graph.builder
def match_in_counted(x, n, sel):
    g = eagle_fx.Graph()
    for i in range(n):
        match sel:
            case 0:
                x = inc(x)
            case 3:
                x = dbl(x)
            case _:
                x = affine(x, 0.5, 1.0)
        match i:
            case 1:
                x = square(x)
            case _:
                x = inc(x)
    g.result = x
    return g


def ref_match_in_counted(x, n, sel):
    x = x.copy()
    for i in range(n):
        if sel == 0:
            x = x + 1.0
        elif sel == 3:
            x = 2.0 * x
        else:
            x = 0.5 * x + 1.0
        if i == 1:
            x = x * x
        else:
            x = x + 1.0
    return x


def test_match_inside_counted_loop():
    x0 = np.array([-1.5, 0.0, 0.25, 2.0])
    n, sel = cell(0), cell(0)
    g = match_in_counted(x0, n, sel)
    for nv, sv in itertools.product([0, 1, 2, 5], [0, 3, 7, 1]):
        n[0], sel[0] = nv, sv
        np.testing.assert_allclose(g(), ref_match_in_counted(x0, nv, sv), rtol=1e-12)
    text = str(g.program)
    assert "switch" in text and "counted=True" in text


@eagle_fx.Graph.builder
def match_no_default(x, sel):
    g = eagle_fx.Graph()
    match sel:
        case 1:
            x = inc(x)
        case 4:
            x = dbl(x)
    g.result = x
    return g


def test_match_without_default_keeps_the_value():
    x0 = np.array([1.0, 2.0])
    sel = cell(0)
    g = match_no_default(x0, sel)
    for sv, want in [(0, x0), (1, x0 + 1), (4, 2 * x0), (2, x0), (1, x0 + 1)]:
        sel[0] = sv
        np.testing.assert_array_equal(g(), want)


# ---------------------------------------------------------------------------------------------
# a fork whose branches call blocks that hold device loops

@eagle_fx.Graph.builder
def grow(g: eagle_fx.Graph, v, flag, lim):
    for _ in range(30):
        if not flag:
            break
        v = dbl(v)
        below(v, lim, flag)
    return v


@eagle_fx.Graph.builder
def settle(g: eagle_fx.Graph, v, n):
    for i in range(n):
        v = affine(v, 0.5, 1.0)
    return v


@eagle_fx.Graph.builder
def fork_of_blocks(x, f1, f2, n):
    g = eagle_fx.Graph()
    a = inc(x)
    with g.parallel() as p:
        with p.branch() as b:
            u = grow(b, a, f1, 40.0)
            u = settle(b, u, n)
        with p.branch() as c:
            v = grow(c, a, f2, 100.0)
    g.result = add(u, v)
    return g


def ref_grow(v, flag, lim):
    for _ in range(30):
        if not flag:
            break
        v = 2.0 * v
        flag = n_below(v, lim)
    return v, flag


def ref_fork_of_blocks(x, f1, f2, n):
    a = x + 1.0
    u, f1 = ref_grow(a, f1, 40.0)
    for _ in range(n):
        u = 0.5 * u + 1.0
    v, f2 = ref_grow(a, f2, 100.0)
    return u + v, f1, f2


def test_fork_branches_call_blocks_with_device_loops():
    x0 = np.array([0.5, 1.0, 4.0, 9.0])
    f1, f2, n = cell(0), cell(0), cell(0)
    g = fork_of_blocks(x0, f1, f2, n)
    for v1, v2, nv in [(1, 1, 0), (0, 1, 2), (1, 0, 3), (0, 0, 1), (1, 1, 4)]:
        f1[0], f2[0], n[0] = v1, v2, nv
        want, w1, w2 = ref_fork_of_blocks(x0, v1, v2, nv)
        np.testing.assert_allclose(g(), want, rtol=1e-12)
        assert (int(f1[0]), int(f2[0])) == (w1, w2)


# ---------------------------------------------------------------------------------------------
# continue and break in one loop body

@eagle_fx.Graph.builder
def jumps(x, go, hi):
    g = eagle_fx.Graph()
    skip, done = cell(0), cell(0)
    for i in range(10):
        if not go:
            break
        x = inc(x)
        odd(i, skip)
        if skip:
            continue
        over(x, hi, done)
        if done:
            break
        x = dbl(x)
    g.result = x
    return g


def ref_jumps(x, go, hi):
    x = x.copy()
    for i in range(10):
        if not go:
            break
        x = x + 1.0
        if i % 2:
            continue
        if n_over(x, hi):
            break
        x = 2.0 * x
    return x


def test_continue_and_break_in_one_body():
    x0 = np.array([0.0, 0.5, 1.0])
    go, hi = cell(1), np.array([1000.0])        # hi: a one-cell Param, read at every replay too
    g = jumps(x0, go, hi)
    for gv, hv in [(1, 1000.0), (1, 10.0), (1, 3.0), (0, 10.0), (1, 0.5), (1, 100.0)]:
        go[0], hi[0] = gv, hv
        np.testing.assert_array_equal(g(), ref_jumps(x0, gv, hv))


@eagle_fx.Graph.builder
def late_break(x, flag):
    g = eagle_fx.Graph()
    for _ in range(20):
        x = dbl(x)
        below(x, 100.0, flag)
        if not flag:
            break
        x = inc(x)
    g.result = x
    return g


def ref_late_break(x):
    x = x.copy()
    for _ in range(20):
        x = 2.0 * x
        if not n_below(x, 100.0):
            break
        x = x + 1.0
    return x


def test_break_at_the_end_of_a_capped_loop_is_a_device_loop():
    x0 = np.array([0.0, 3.0, 250.0])
    g = late_break(x0, cell(1))
    np.testing.assert_array_equal(g(), ref_late_break(x0))
    g.bind(x=np.array([40.0, 60.0, 7.0]))
    np.testing.assert_array_equal(g(), ref_late_break(np.array([40.0, 60.0, 7.0])))
    assert "while[cap=20" in str(g.program)


# ---------------------------------------------------------------------------------------------
# nested forks with waits

@eagle_fx.Graph.builder
def nested_forks(x):
    g = eagle_fx.Graph()
    a = dbl(x)
    with g.parallel() as p:
        with p.branch() as b:
            l = inc(a)
            with b.parallel() as q:
                with q.branch() as b1:
                    u = inc(l)
                with q.branch() as b2:
                    v = dbl(l)
                with q.branch() as b3:
                    b3.wait(v)
                    t = add(v, l)
        with p.branch() as w:
            w.wait(l)
            r = add(l, a)
        with p.branch() as z:
            z.wait(u)
            s = square(u)
    g.result = (u, v, t, r, s)
    return g


def ref_nested_forks(x):
    a = 2.0 * x
    l = a + 1.0
    u, v = l + 1.0, 2.0 * l
    return u, v, v + l, l + a, u * u


def test_nested_forks_with_waits():
    x0 = np.array([0.0, 1.0, -2.0, 3.5])
    g = nested_forks(x0)
    for got, want in zip(g(), ref_nested_forks(x0)):
        np.testing.assert_array_equal(got, want)
    x1 = np.array([5.0, -1.0, 0.25, 8.0])
    g.bind(x=x1)
    for got, want in zip(g(), ref_nested_forks(x1)):
        np.testing.assert_array_equal(got, want)


# ---------------------------------------------------------------------------------------------
# loops nested in loops

@eagle_fx.Graph.builder
def nested_loops(x, n, m, flag):
    g = eagle_fx.Graph()
    for i in range(n):
        for j in range(m):
            x = affine(x, 0.5, 1.0)
        below(x, 30.0, flag)
        for _ in range(8):
            if not flag:
                break
            x = dbl(x)
            below(x, 30.0, flag)
        x = affine(x, 0.25, 0.0)
    g.result = x
    return g


def ref_nested_loops(x, n, m):
    x = x.copy()
    for _ in range(n):
        for _ in range(m):
            x = 0.5 * x + 1.0
        flag = n_below(x, 30.0)
        for _ in range(8):
            if not flag:
                break
            x = 2.0 * x
            flag = n_below(x, 30.0)
        x = 0.25 * x
    return x


def test_loops_nested_in_loops():
    x0 = np.array([0.0, 3.0, 50.0, 200.0])
    n, m, flag = cell(0), cell(0), cell(0)
    g = nested_loops(x0, n, m, flag)
    for nv, mv in [(0, 0), (1, 0), (1, 2), (3, 1), (2, 4), (4, 0)]:
        n[0], m[0] = nv, mv
        np.testing.assert_allclose(g(), ref_nested_loops(x0, nv, mv), rtol=1e-12)


@eagle_fx.Graph.builder
def triangle(x, n):
    g = eagle_fx.Graph()
    total = dbl(x)
    for i in range(n):
        for j in range(i):                      # the inner trip count is the outer loop's turn counter
            total = add(total, x)
    g.result = total
    return g


def test_inner_trip_count_is_the_outer_turn():
    x0 = np.array([1.0, -0.5, 2.0])
    n = cell(0)
    g = triangle(x0, n)
    for nv in (0, 1, 2, 5):
        n[0] = nv
        want = 2.0 * x0
        for i in range(nv):
            for _ in range(i):
                want = want + x0
        np.testing.assert_array_equal(g(), want)


# ---------------------------------------------------------------------------------------------
# Python if / for: decided once, at build

@eagle_fx.Graph.builder
def python_flow(x, debug, scales, k):
    g = eagle_fx.Graph()
    if debug:
        x = inc(x)
    for s in scales:
        x = affine(x, s, 0.0)
    for kern in (inc, dbl):
        x = kern(x)
    for _ in range(k):
        x = square(x)
    g.result = x
    return g


def ref_python_flow(x, debug, scales, k):
    if debug:
        x = x + 1.0
    for s in scales:
        x = s * x
    x = 2.0 * (x + 1.0)
    for _ in range(k):
        x = x * x
    return x


@pytest.mark.parametrize("debug,scales,k", [(True, (2.0, 0.5, 3.0), 2), (False, (), 0), (False, (1.5,), 1)])
def test_python_if_and_for_are_unrolled_at_build(debug, scales, k):
    x0 = np.array([0.0, 0.5, -1.0])
    g = python_flow(x0, debug, scales, k)
    np.testing.assert_allclose(g(), ref_python_flow(x0, debug, scales, k), rtol=1e-12)
    text = str(g.program)
    assert "cond" not in text and "while" not in text and "switch" not in text
    assert text.count("call[kernel=") == int(debug) + len(scales) + 2 + k
    assert repr(g).startswith(f"<eagle_fx.Graph {int(debug) + len(scales) + 2 + k} nodes")


@eagle_fx.Graph.builder
def collect(x, k):
    g = eagle_fx.Graph()
    outs = []
    for i in range(k):
        x = inc(x)
        outs.append(x)
    g.result = outs
    return g


def test_python_range_loop_collecting_planes_in_a_list():
    x0 = np.array([0.0, 10.0])
    res = collect(x0, 3)()
    assert len(res) == 3
    for i, r in enumerate(res):
        np.testing.assert_array_equal(r, x0 + i + 1)


def test_python_loop_body_runs_once_per_turn_at_build():
    calls = []

    @eagle_fx.Graph.builder
    def counted_at_build(x):
        g = eagle_fx.Graph()
        for i in range(3):
            calls.append(i)
            x = inc(x)
            if i == 1:
                break
        g.result = x
        return g

    g = counted_at_build(np.zeros(2))
    assert calls == [0, 1]
    np.testing.assert_array_equal(g(), [2.0, 2.0])


@eagle_fx.Graph.builder
def python_cond_device_body(x, flag, reps):
    g = eagle_fx.Graph()
    for r in range(reps):                       # a Python loop ...
        if flag:                                # ... around a device if: unrolled, each copy read per replay
            x = dbl(x)
        else:
            x = inc(x)
    g.result = x
    return g


def test_python_loop_around_a_device_if():
    x0 = np.array([1.0, 2.0])
    flag = cell(1)
    g = python_cond_device_body(x0, flag, 3)
    assert str(g.program).count("cond") == 3 and "while" not in str(g.program)
    np.testing.assert_array_equal(g(), 8 * x0)
    flag[0] = 0
    np.testing.assert_array_equal(g(), x0 + 3)


# ---------------------------------------------------------------------------------------------
# while cell: uncapped, warns with the builder's name and line

def test_uncapped_while_warns_and_runs():
    @eagle_fx.Graph.builder
    def until(x, flag):
        g = eagle_fx.Graph()
        while flag:
            x = dbl(x)
            below(x, 20.0, flag)
        g.result = x
        return g

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        flag = cell(1)
        g = until(np.array([1.0, 3.0]), flag)
    ws = [w for w in caught if issubclass(w.category, eagle_fx.UncappedLoopWarning)]
    assert len(ws) == 1
    msg = str(ws[0].message)
    assert "until:4" in msg                     # decorator = line 1
    assert "for _ in range(N)" in msg
    import inspect
    lines, first = inspect.getsourcelines(until.__wrapped__)
    assert ws[0].lineno == first + 3 and ws[0].filename == __file__
    np.testing.assert_array_equal(g(), ref_until(np.array([1.0, 3.0]), 1))
    assert flag[0] == 0
    np.testing.assert_array_equal(g(), [1.0, 3.0])          # the guard reads 0 on entry: no turn
    for x1 in (np.array([25.0, 0.5]), np.array([19.0, 30.0])):
        flag[0] = 1
        g.bind(x=x1)
        np.testing.assert_array_equal(g(), ref_until(x1, 1))


def ref_until(x, flag):
    while flag:
        x = 2.0 * x
        flag = n_below(x, 20.0)
    return x


@eagle_fx.Graph.builder
def while_break_continue(x, flag, skip, done):
    g = eagle_fx.Graph()
    while flag:
        x = inc(x)
        below(x, 12.0, flag)
        over(x, 2.5, skip)
        if skip:
            continue
        over(x, 1.5, done)
        if done:
            break
        x = dbl(x)
    g.result = x
    return g


def ref_while_break_continue(x, flag):
    x = x.copy()
    while flag:
        x = x + 1.0
        flag = n_below(x, 12.0)
        if n_over(x, 2.5):
            continue
        if n_over(x, 1.5):
            break
        x = 2.0 * x
    return x


def test_uncapped_while_with_break_and_continue():
    with pytest.warns(eagle_fx.UncappedLoopWarning, match="while_break_continue:4"):
        flag = cell(1)
        g = while_break_continue(np.zeros(3), flag, cell(0), cell(0))
    for x1 in (np.zeros(3), np.array([0.0, 0.3, -4.0]), np.array([5.0, 6.0, 7.0]), np.array([-1.0, 0.0, 0.1])):
        g.bind(x=x1)
        flag[0] = 1
        np.testing.assert_array_equal(g(), ref_while_break_continue(x1, 1))
        flag[0] = 0
        np.testing.assert_array_equal(g(), x1)


# ---------------------------------------------------------------------------------------------
# boolean logic on cells

@eagle_fx.Graph.builder
def logic(x, a, b, c):
    g = eagle_fx.Graph()
    if a and not b:
        x = inc(x)
    elif b or c:
        x = dbl(x)
    if not (a or c):
        x = square(x)
    g.result = x
    return g


def test_and_or_not_on_cells():
    x0 = np.array([1.0, -2.0, 3.0])
    a, b, c = cell(0), cell(0), cell(0)
    g = logic(x0, a, b, c)
    for av, bv, cv in itertools.product([0, 1, 7], [0, 1], [0, 2]):
        a[0], b[0], c[0] = av, bv, cv
        want = x0.copy()
        if av and not bv:
            want = want + 1.0
        elif bv or cv:
            want = 2.0 * want
        if not (av or cv):
            want = want * want
        np.testing.assert_array_equal(g(), want)


@eagle_fx.Graph.builder
def guard_or(x, a, b):
    g = eagle_fx.Graph()
    for _ in range(6):
        if a or b:                              # a leading `if T: break` with and/or: a device guard
            break
        x = affine(x, 2.0, 1.0)
        over(x, 40.0, a)
        below(x, -30.0, b)
    g.result = x
    return g


def ref_guard_or(x, a, b):
    x = x.copy()
    for _ in range(6):
        if a or b:
            break
        x = 2.0 * x + 1.0
        a, b = n_over(x, 40.0), n_below(x, -30.0)
    return x


def test_or_in_a_loop_guard_stays_on_the_device():
    x0 = np.array([0.0, 1.0])
    a, b = cell(0), cell(0)
    g = guard_or(x0, a, b)
    for x1 in (np.array([0.0, 1.0]), np.array([-3.0, 0.0]), np.array([0.0, 0.0]), np.array([20.0, -20.0])):
        for av, bv in [(0, 0), (1, 0), (0, 1)]:
            g.bind(x=x1)
            a[0], b[0] = av, bv
            np.testing.assert_array_equal(g(), ref_guard_or(x1, av, bv))


# ---------------------------------------------------------------------------------------------
# more Python loops, loops over cell planes, forks inside loops

@hawk.kernel
def count_under(s: Scalar, lim: Param):         # returns a cell plane (not a Mutable write)
    return hm.uint32(hawk.sum(s < lim))


@hawk.kernel
def gather(s: Scalar, y: Mutable[Scalar]):
    y = y + s


def test_python_while_collecting_planes():
    @eagle_fx.Graph.builder
    def countdown(x, k):
        g = eagle_fx.Graph()
        outs = []
        while k:                                 # a Python int: a Python loop, one body run per turn
            x = affine(x, 2.0, 1.0)
            outs.append(x)
            k -= 1
        g.result = outs
        return g

    x0 = np.array([0.0, -1.0])
    res = countdown(x0, 4)()
    want, x = [], x0
    for _ in range(4):
        x = 2.0 * x + 1.0
        want.append(x)
    assert len(res) == 4
    for r, w in zip(res, want):
        np.testing.assert_array_equal(r, w)


def test_nested_python_loops_around_a_device_if():
    @eagle_fx.Graph.builder
    def grid(x, flag):
        g = eagle_fx.Graph()
        outs = []
        for i in range(2):
            for j in range(3):
                if flag:
                    x = dbl(x)
                else:
                    x = affine(x, 1.0, float(i + j))
                outs.append(x)
        g.result = outs
        return g

    x0 = np.array([1.0, 0.5])
    flag = cell(1)
    g = grid(x0, flag)
    for fv in (1, 0, 1):
        flag[0] = fv
        want, x = [], x0
        for i in range(2):
            for j in range(3):
                x = 2.0 * x if fv else x + float(i + j)
                want.append(x)
        got = g()
        assert len(got) == 6
        for r, w in zip(got, want):
            np.testing.assert_array_equal(r, w)


def test_a_device_while_over_a_cell_plane_the_body_recomputes():
    @eagle_fx.Graph.builder
    def until(x, lim):
        g = eagle_fx.Graph()
        c = count_under(x, lim)
        while c:
            x = dbl(x)
            c = count_under(x, lim)
        g.result = (x, c)
        return g

    lim = np.array([20.0])
    with pytest.warns(eagle_fx.UncappedLoopWarning):
        g = until(np.array([1.0, 3.0, 0.5]), lim)
    for lv in (20.0, 1.0, 100.0):
        lim[0] = lv
        x, c = g()
        want = np.array([1.0, 3.0, 0.5])
        while np.sum(want < lv):
            want = 2.0 * want
        np.testing.assert_array_equal(x, want)
        assert c.dtype == np.uint32 and c[0] == 0


def test_a_fork_inside_a_counted_loop():
    @eagle_fx.Graph.builder
    def fork_loop(x, y, n):
        g = eagle_fx.Graph()
        for i in range(n):
            a = inc(x)
            with g.parallel() as p:
                with p.branch() as b:
                    u = dbl(a)
                with p.branch() as c:
                    v = affine(a, 1.0, 1.0)
            x = add(u, v)
            gather(x, y)
        g.result = x
        return g

    x0, y, n = np.array([1.0, -0.5]), np.zeros(2), cell(0)
    g = fork_loop(x0, y, n)
    for nv in (0, 1, 3):
        n[0] = nv
        y[:] = 0.0
        x, yy = x0.copy(), np.zeros(2)
        for _ in range(nv):
            a = x + 1.0
            x = 2.0 * a + (a + 1.0)
            yy = yy + x
        np.testing.assert_array_equal(g(), x)
        np.testing.assert_array_equal(y, yy)


def test_python_continue_and_break_in_a_python_loop():
    @eagle_fx.Graph.builder
    def skip_some(x, stop):
        g = eagle_fx.Graph()
        for i in range(6):
            if i % 2:
                continue
            x = affine(x, 1.0, float(i))
            if i == stop:
                break
        g.result = x
        return g

    x0 = np.array([0.0, 1.0])
    for stop in (0, 2, 4, 9):
        want = x0.copy()
        for i in range(6):
            if i % 2:
                continue
            want = want + float(i)
            if i == stop:
                break
        g = skip_some(x0, stop)
        np.testing.assert_array_equal(g(), want)
        assert "while" not in str(g.program) and "cond" not in str(g.program)


def test_a_counted_loop_with_a_device_break():
    @eagle_fx.Graph.builder
    def counted_break(x, n, done):
        g = eagle_fx.Graph()
        for i in range(n):
            x = inc(x)
            over(x, 3.5, done)
            if done:
                break
            x = dbl(x)
        g.result = x
        return g

    x0 = np.array([0.0, -4.0])
    n = cell(0)
    g = counted_break(x0, n, cell(0))
    for nv in (0, 1, 2, 3, 6):
        n[0] = nv
        want = x0.copy()
        for _ in range(nv):
            want = want + 1.0
            if n_over(want, 3.5):
                break
            want = 2.0 * want
        np.testing.assert_array_equal(g(), want)


def test_a_python_flag_set_under_a_device_if_becomes_a_cell():
    @eagle_fx.Graph.builder
    def found(x, c, lim):
        g = eagle_fx.Graph()
        hit = False
        for _ in range(4):
            x = inc(x)
            over(x, lim, c)
            if c:
                hit = True                       # differs by arm: carried as a cell
        if hit:
            x = dbl(x)
        g.result = x
        return g

    lim = np.array([2.5])
    g = found(np.zeros(2), cell(0), lim)
    for lv in (2.5, 10.0, 3.5, 0.0):
        lim[0] = lv
        want, hit = np.zeros(2), False
        for _ in range(4):
            want = want + 1.0
            if n_over(want, lv):
                hit = True
        np.testing.assert_array_equal(g(), 2.0 * want if hit else want)


def test_match_on_a_python_value_is_decided_at_build():
    @eagle_fx.Graph.builder
    def pick(x, k):
        g = eagle_fx.Graph()
        match k:
            case 0:
                x = inc(x)
            case 1:
                x = dbl(x)
            case _:
                pass
        g.result = x
        return g

    x0 = np.array([1.0, 3.0])
    for k, want in ((0, x0 + 1), (1, 2 * x0), (7, x0)):
        g = pick(x0, k)
        np.testing.assert_array_equal(g(), want)
        assert "switch" not in str(g.program)


def test_a_python_loop_around_a_device_loop():
    @eagle_fx.Graph.builder
    def rounds(x, flag, y):
        g = eagle_fx.Graph()
        for r in range(3):                       # Python: three copies of the device loop
            below(x, 10.0 * (r + 1), flag)
            for _ in range(16):
                if not flag:
                    break
                x = affine(x, 1.0, 1.0)
                below(x, 10.0 * (r + 1), flag)
            gather(x, y)
        g.result = x
        return g

    x0, flag, y = np.array([0.5, 4.0, 12.0]), cell(0), np.zeros(3)
    g = rounds(x0, flag, y)
    assert str(g.program).count("while[cap=16") == 3
    for x1 in (x0, np.array([-3.0, 25.0, 9.5])):
        g.bind(x=x1)
        y[:] = 0.0
        want, yy = x1.copy(), np.zeros(3)
        for r in range(3):
            for _ in range(16):
                if not n_below(want, 10.0 * (r + 1)):
                    break
                want = want + 1.0
            yy = yy + want
        np.testing.assert_array_equal(g(), want)
        np.testing.assert_array_equal(y, yy)
