"""What a builder refuses: the exception type, and a message that names the API, says what to change
and, where the refusal belongs to a builder line, gives `function:line` (decorator = line 1)."""
import inspect
import warnings

import numpy as np
import pytest

import eagle_fx
from tour_kernels import accumulate, add, below, cell, dbl, inc


def where(builder, fragment):
    """`name:line` of the first source line of `builder` holding `fragment` (its decorator is line 1)."""
    fn = builder.__wrapped__
    lines, _ = inspect.getsourcelines(fn)
    k = next(i for i, text in enumerate(lines) if fragment in text)
    return f"{fn.__name__}:{k + 1}"


def message(exc_type, call, *fragments):
    with pytest.raises(exc_type) as info:
        call()
    msg = str(info.value)
    for f in fragments:
        assert f in msg, f"{f!r} not in: {msg}"
    return msg


X = np.arange(4.0)


# ---------------------------------------------------------------------------------------------
# what a builder returns; wait outside a fork

def test_a_builder_returning_arrays_is_refused():
    @eagle_fx.Graph.builder
    def returns_array(x):
        g = eagle_fx.Graph()
        return inc(x)

    @eagle_fx.Graph.builder
    def no_graph(x):
        return inc(x)

    message(TypeError, lambda: returns_array(X), "returns_array", "return g", "g.result = ...")
    message(TypeError, lambda: no_graph(X), "no_graph", "return g", "g = eagle.Graph()")


def test_wait_outside_a_fork_is_refused():
    @eagle_fx.Graph.builder
    def top_level_wait(x):
        g = eagle_fx.Graph()
        a = inc(x)
        g.wait(a)
        g.result = a
        return g

    message(RuntimeError, lambda: top_level_wait(X), "eagle.Graph.wait", "parallel region", "b.wait(plane)")


def test_a_builder_cannot_stage_into_a_built_graph():
    g = eagle_fx.Graph()
    g.add_node(eagle_fx.opaque(lambda: None, reads={"x": X}))
    g.build()
    message(RuntimeError, lambda: g.add_node(eagle_fx.opaque(lambda: None)), "built", "new graph")


# ---------------------------------------------------------------------------------------------
# sibling branches touching one plane

@eagle_fx.Graph.builder
def raw_unordered(x):
    g = eagle_fx.Graph()
    a = dbl(x)
    with g.parallel() as p:
        with p.branch() as b:
            u = inc(a)
        with p.branch() as c:
            v = add(u, a)
    g.result = v
    return g


@eagle_fx.Graph.builder
def raw_ordered(x):
    g = eagle_fx.Graph()
    a = dbl(x)
    with g.parallel() as p:
        with p.branch() as b:
            u = inc(a)
        with p.branch() as c:
            c.wait(u)
            v = add(u, a)
    g.result = v
    return g


def test_sibling_branches_reading_a_write_without_wait_are_refused():
    msg = message(ValueError, lambda: raw_unordered(X), "eagle.Graph.build", "wait(plane)", "'u' (node 1",
                  "'v' (node 2", "RAW", where(raw_unordered, "u = inc"), where(raw_unordered, "v = add"))
    assert "put them in one branch" in msg
    g = raw_ordered(X)                           # the same graph, ordered by a wait: accepted
    np.testing.assert_array_equal(g(), (2 * X + 1) + 2 * X)


@eagle_fx.Graph.builder
def waw_unordered(x, y):
    g = eagle_fx.Graph()
    with g.parallel() as p:
        with p.branch() as b:
            accumulate(x, y)
        with p.branch() as c:
            accumulate(inc(x), y)
    return g


@eagle_fx.Graph.builder
def war_unordered(x, y):
    g = eagle_fx.Graph()
    with g.parallel() as p:
        with p.branch() as b:
            u = dbl(y)
        with p.branch() as c:
            accumulate(x, y)
    g.result = u
    return g


@eagle_fx.Graph.builder
def war_ordered(x, y):
    g = eagle_fx.Graph()
    with g.parallel() as p:
        with p.branch() as b:
            u = dbl(y)
        with p.branch() as c:
            c.wait(u)
            accumulate(x, y)
    g.result = u
    return g


def test_writes_to_one_argument_from_two_branches_are_refused():
    y = np.zeros(4)
    message(ValueError, lambda: waw_unordered(X, y), "'accumulate' (node 0", "'accumulate' (node 2",
            where(waw_unordered, "accumulate(x, y)"), where(waw_unordered, "accumulate(inc"))
    message(ValueError, lambda: war_unordered(X, y), "WAR", "'u' (node 0", "'accumulate' (node 1")
    y[:] = 5.0
    g = war_ordered(X, y)
    u = g()
    np.testing.assert_array_equal(u, 10.0)
    np.testing.assert_array_equal(y, X + 1.0)


def test_branches_touching_overlapping_views_are_refused():
    @eagle_fx.Graph.builder
    def views(x, y):
        g = eagle_fx.Graph()
        with g.parallel() as p:
            with p.branch() as b:
                accumulate(x, y[:4])
            with p.branch() as c:
                u = inc(y[2:6])
        g.result = u
        return g

    @eagle_fx.Graph.builder
    def disjoint(x, y):
        g = eagle_fx.Graph()
        with g.parallel() as p:
            with p.branch() as b:
                accumulate(x, y[:4])
            with p.branch() as c:
                u = inc(y[4:])
        g.result = u
        return g

    y = np.zeros(8)
    message(ValueError, lambda: views(X, y), "share memory", "'accumulate'", "'u'")
    y[4:] = 3.0
    u = disjoint(X, y)()
    np.testing.assert_array_equal(u, 4.0)
    np.testing.assert_array_equal(y[:4], X + 1.0)


def test_a_write_inside_a_device_loop_of_a_branch_counts():
    @eagle_fx.Graph.builder
    def loop_writes(x, y, n):
        g = eagle_fx.Graph()
        with g.parallel() as p:
            with p.branch() as b:
                for _ in range(n):
                    accumulate(x, y)
            with p.branch() as c:
                u = inc(y)
        g.result = u
        return g

    message(ValueError, lambda: loop_writes(X, np.zeros(4), cell(2)), "'accumulate'", "'u'", "wait(plane)")


def test_a_wait_for_a_node_before_the_one_read_does_not_order_it():
    @eagle_fx.Graph.builder
    def early_wait(x):
        g = eagle_fx.Graph()
        with g.parallel() as p:
            with p.branch() as b:
                l = inc(x)
                m = dbl(l)
            with p.branch() as c:
                c.wait(l)                        # waits for l, but reads m, written after l
                r = add(m, x)
        g.result = r
        return g

    message(ValueError, lambda: early_wait(X), "'m'", "'r'", "RAW")


# ---------------------------------------------------------------------------------------------
# conditions that are not cells

@pytest.mark.parametrize("bad", [np.zeros(2), np.array([1.0]), np.array([1], np.int64), np.zeros(2, np.uint32)],
                         ids=["f64[2]", "f64[1]", "i64[1]", "u32[2]"])
def test_a_non_cell_array_as_a_condition_is_refused(bad):
    @eagle_fx.Graph.builder
    def as_if(x, c):
        g = eagle_fx.Graph()
        if c:
            x = inc(x)
        g.result = x
        return g

    @eagle_fx.Graph.builder
    def as_while(x, c):
        g = eagle_fx.Graph()
        while c:
            x = inc(x)
        g.result = x
        return g

    @eagle_fx.Graph.builder
    def as_guard(x, c):
        g = eagle_fx.Graph()
        for _ in range(3):
            if not c:
                break
            x = inc(x)
        g.result = x
        return g

    @eagle_fx.Graph.builder
    def as_match(x, c):
        g = eagle_fx.Graph()
        match c:
            case 1:
                x = inc(x)
        g.result = x
        return g

    @eagle_fx.Graph.builder
    def as_trip(x, c):
        g = eagle_fx.Graph()
        for _ in range(c):
            x = inc(x)
        g.result = x
        return g

    @eagle_fx.Graph.builder
    def in_or(x, c, f):
        g = eagle_fx.Graph()
        if f or c:
            x = inc(x)
        g.result = x
        return g

    x = np.zeros(3)
    shape = f"shape {bad.shape}"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", eagle_fx.UncappedLoopWarning)
        for b, line in ((as_if, "if c:"), (as_while, "while c:"), (as_guard, "for _ in range(3)"),
                        (as_match, "match c:")):
            message(TypeError, lambda: b(x, bad), f"eagle.Graph.builder {where(b, line)}", shape,
                    "one-cell uint32")
    message(TypeError, lambda: as_trip(x, bad), f"eagle.Graph.builder {where(as_trip, 'range(c)')}", "range(cell)")
    message(TypeError, lambda: in_or(x, bad, cell(0)), where(in_or, "f or c"), shape, "one-cell uint32")


def test_a_plane_as_a_python_bool_outside_a_builder_is_refused():
    g = eagle_fx.Graph()
    with g._staging():
        p = inc(X)
    message(TypeError, lambda: bool(p), "Python bool", "one-cell uint32")


# ---------------------------------------------------------------------------------------------
# record=True refuses an uncapped loop

def test_an_uncapped_while_under_record_is_refused():
    @eagle_fx.Graph.builder
    def recorded(x, flag):
        g = eagle_fx.Graph(record=True)
        while flag:
            x = dbl(x)
            below(x, 10.0, flag)
        g.result = x
        return g

    message(ValueError, lambda: recorded(np.ones(4), cell(1)), where(recorded, "while flag"), "record=True",
            "for _ in range(N): if not cell: break")


# ---------------------------------------------------------------------------------------------
# a value assigned only inside a device if/loop, read after it

def test_a_plane_computed_only_inside_a_device_if_is_refused_after_it():
    @eagle_fx.Graph.builder
    def result_after_if(x, flag):
        g = eagle_fx.Graph()
        if flag:
            t = inc(x)
        g.result = t
        return g

    @eagle_fx.Graph.builder
    def call_after_loop(x, n):
        g = eagle_fx.Graph()
        for _ in range(n):
            t = inc(x)
        g.result = dbl(t)
        return g

    @eagle_fx.Graph.builder
    def carried(x, flag):
        g = eagle_fx.Graph()
        t = x                                    # assigned before: the if carries it out
        if flag:
            t = inc(x)
        g.result = dbl(t)
        return g

    for b, line in ((result_after_if, "if flag"), (call_after_loop, "for _ in")):
        message(NameError, lambda: b(X, cell(1)), "'t'", "only inside a device if/loop", where(b, line),
                "assign it before")
    g = carried(X, cell(1))
    np.testing.assert_array_equal(g(), 2 * (X + 1))


# ---------------------------------------------------------------------------------------------
# kernel argument errors inside a builder

def test_kernel_argument_errors_inside_a_builder():
    @eagle_fx.Graph.builder
    def too_many(x):
        g = eagle_fx.Graph()
        g.result = inc(x, x)
        return g

    @eagle_fx.Graph.builder
    def unknown(x):
        g = eagle_fx.Graph()
        g.result = inc(y=x)
        return g

    @eagle_fx.Graph.builder
    def a_string(x):
        g = eagle_fx.Graph()
        g.result = inc("one")
        return g

    @eagle_fx.Graph.builder
    def counts(x, y):
        g = eagle_fx.Graph()
        g.result = add(x, y)
        return g

    @eagle_fx.Graph.builder
    def counts_between_calls(x, y):
        g = eagle_fx.Graph()
        a = inc(x)
        g.result = inc(y)
        return g

    @eagle_fx.Graph.builder
    def mutable_number(x):
        g = eagle_fx.Graph()
        accumulate(x, 1.0)
        return g

    @eagle_fx.Graph.builder
    def bad_buffer(x):
        g = eagle_fx.Graph()
        g.result = inc(x, buffer=np.zeros(3))
        return g

    @eagle_fx.Graph.builder
    def complex_plane(x):
        g = eagle_fx.Graph()
        g.result = inc(x.astype(np.complex128))
        return g

    @eagle_fx.Graph.builder
    def unstaged_numpy(x):
        g = eagle_fx.Graph()
        g.result = np.cumsum(inc(x))
        return g

    cases = [
        (TypeError, too_many, (X,), "inc(x, x)", ["hawk.kernel inc", "takes 1 argument"]),
        (TypeError, unknown, (X,), "inc(y=x)", ["hawk.kernel inc", "unknown argument 'y'", "its parameters are x"]),
        (TypeError, a_string, (X,), "inc(\"one\")", ["argument 'x'", "str", "pass arrays, staged planes"]),
        (ValueError, counts, (X, np.zeros(5)), "add(x, y)", ["hawk.kernel add", "5 samples", "same sample count"]),
        (ValueError, counts_between_calls, (X, np.zeros(5)), "inc(y)", ["5 samples in a graph of 4"]),
        (TypeError, mutable_number, (X,), "accumulate(x, 1.0)", ["'y'", "Mutable", "needs an array"]),
        (ValueError, bad_buffer, (X,), "buffer=", ["buffer= has shape (3,)", "the result is (4,)"]),
        (TypeError, complex_plane, (X,), "complex128", ["dtype complex128", "real"]),
    ]
    for exc, b, args, line, fragments in cases:
        message(exc, lambda: b(*args), *fragments, f"eagle.Graph.builder {where(b, line)}")
    message(TypeError, lambda: unstaged_numpy(X), "np.cumsum on a staged plane is not staged", "@hawk.kernel",
            f"eagle.Graph.builder {where(unstaged_numpy, 'np.cumsum')}")


def test_a_refused_builder_leaves_no_graph_open():
    @eagle_fx.Graph.builder
    def fails(x):
        g = eagle_fx.Graph()
        g.result = inc(x, x)
        return g

    with pytest.raises(TypeError):
        fails(X)
    np.testing.assert_array_equal(inc(X), X + 1.0)    # a plain kernel call runs again: no stager left


def test_builder_syntax_refusals_name_the_line():
    def with_guard():
        @eagle_fx.Graph.builder
        def guarded(x, c):
            g = eagle_fx.Graph()
            match c:
                case 1 if True:
                    x = inc(x)
            g.result = x
            return g

    def with_for_else():
        @eagle_fx.Graph.builder
        def for_else(x, n):
            g = eagle_fx.Graph()
            for _ in range(n):
                x = inc(x)
            else:
                x = dbl(x)
            g.result = x
            return g

    message(SyntaxError, with_guard, "guarded:5", "case` guard", "inside the arm")
    message(SyntaxError, with_for_else, "for_else:4", "`else`", "after the loop")


# ---------------------------------------------------------------------------------------------
# what a wait orders: chained waits and nested joins are accepted, a sibling's wait is not enough

def test_chained_waits_order_a_branch_after_the_first_writer():
    @eagle_fx.Graph.builder
    def chained(x):
        g = eagle_fx.Graph()
        with g.parallel() as p:
            with p.branch() as a:
                l = inc(x)
            with p.branch() as b:
                b.wait(l)
                v = dbl(l)
            with p.branch() as c:
                c.wait(v)                        # after v, hence after l: b waited for l before writing v
                r = add(l, v)
        g.result = (l, v, r)
        return g

    x = np.array([0.0, 1.5, -2.0, 4.0])
    l, v, r = chained(x)()
    np.testing.assert_array_equal(l, x + 1)
    np.testing.assert_array_equal(v, 2 * (x + 1))
    np.testing.assert_array_equal(r, 3 * (x + 1))


def test_a_wait_inside_a_nested_fork_orders_what_follows_its_join():
    @eagle_fx.Graph.builder
    def after_join(x):
        g = eagle_fx.Graph()
        with g.parallel() as p:
            with p.branch() as a:
                l = inc(x)
            with p.branch() as b:
                with b.parallel() as q:
                    with q.branch() as q1:
                        q1.wait(l)
                        m = dbl(l)
                    with q.branch() as q2:
                        k = dbl(x)
                r = add(l, k)                    # after the inner join: after q1's wait for l
        g.result = (m, r)
        return g

    x = np.array([1.0, 2.0, 3.0, 4.0])
    m, r = after_join(x)()
    np.testing.assert_array_equal(m, 2 * (x + 1))
    np.testing.assert_array_equal(r, (x + 1) + 2 * x)


def test_a_wait_in_a_sibling_nested_branch_does_not_order_another():
    @eagle_fx.Graph.builder
    def sibling_wait(x):
        g = eagle_fx.Graph()
        with g.parallel() as p:
            with p.branch() as a:
                l = inc(x)
            with p.branch() as b:
                with b.parallel() as q:
                    with q.branch() as q1:
                        q1.wait(l)
                        m = dbl(l)
                    with q.branch() as q2:
                        k = dbl(l)               # q2 did not wait
        g.result = (m, k)
        return g

    message(ValueError, lambda: sibling_wait(X), "'l' (node 0", "'k' (node 2", "RAW")


def test_two_forks_in_one_branch_run_one_after_the_other():
    @eagle_fx.Graph.builder
    def two_forks(x, y):
        g = eagle_fx.Graph()
        with g.parallel() as p:
            with p.branch() as a:
                with a.parallel() as q:
                    with q.branch() as q1:
                        accumulate(x, y)
                    with q.branch() as q2:
                        u = dbl(x)
                with a.parallel() as q:
                    with q.branch() as q1:
                        v = inc(y)               # the first inner fork joined: y is written
                    with q.branch() as q2:
                        w = add(u, x)
            with p.branch() as b:
                t = dbl(x)
        g.result = (v, w, t)
        return g

    y = np.zeros(4)
    v, w, t = two_forks(X, y)()
    np.testing.assert_array_equal(y, X + 1)
    np.testing.assert_array_equal(v, X + 2)
    np.testing.assert_array_equal(w, 3 * X)
    np.testing.assert_array_equal(t, 2 * X)
