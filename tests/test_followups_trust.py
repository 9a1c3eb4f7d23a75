"""Refusals that name the user's builder and line, and say what to change."""
from __future__ import annotations

import numpy as np
import pytest

import eagle_fx as eagle
import hawk_fx as hawk
from conftest import line_of, refused
from hawk_fx import Scalar
from test_compose import central
from tour_kernels import add, below, dbl, inc


def _where(builder, fragment):
    """`builder:line` as refusals write it: lines counted from the decorator."""
    return f"{builder.__name__}:{line_of(builder, fragment) - line_of(builder, '@eagle') + 1}"


@eagle.Graph.builder
def asserts_a_plane(x):
    g = eagle.Graph()
    y = dbl(x)
    assert y
    g.result = y
    return g


@eagle.Graph.builder
def bool_of_a_plane(x):
    g = eagle.Graph()
    y = dbl(x)
    g.result = add(x, y) if bool(y) else y
    return g


@eagle.Graph.builder
def or_of_planes(x):
    g = eagle.Graph()
    y = dbl(x)
    g.result = y or x
    return g


@eagle.Graph.builder
def filters_on_a_plane(x):
    g = eagle.Graph()
    y = dbl(x)
    g.result = [add(x, y) for _ in range(2) if y]
    return g


@pytest.mark.parametrize("builder, fragment", [(asserts_a_plane, "assert y"), (bool_of_a_plane, "bool(y)"),
                                               (or_of_planes, "y or x"), (filters_on_a_plane, "if y]")])
def test_a_plane_as_a_python_bool_in_a_builder(builder, fragment):
    """Inside a builder the refusal names the builder and line, and says which constructs stage a
    device condition (it used to say 'outside a builder's if/while')."""
    msg = refused(TypeError, lambda: builder(np.ones(3)), f"eagle.Graph.builder {_where(builder, fragment)}: ",
                  "plane 'y'", "used as a Python bool", "only a builder's own if/while/match",
                  "one-cell uint32 array", "hm.uint32(hawk.sum(")
    assert "outside" not in msg


# -- a buffer label rebound in a device loop that reads the value it writes --------------------------

@hawk.kernel
def mul(a: Scalar, b: Scalar) -> Scalar:
    return a * b


@eagle.Graph.builder
def reads_what_it_writes(x, n, record=False):
    g = eagle.Graph(record=record)
    a = dbl(x, buffer=True)
    v = mul(a, x)
    for _ in range(n):
        a = mul(a, x)
        v = add(v, a)                            # the value just written, used later in its turn
    g.result = add(v, a)
    return g


def reads_what_it_writes_numpy(x, n, eps):
    """The same program with eps added at the label's last write that ran."""
    a = 2 * x + (eps if n == 0 else 0)
    v = a * x
    for t in range(n):
        a = a * x + (eps if t == n - 1 else 0)
        v = v + a
    return v + a


@pytest.mark.parametrize("n", [1, 3])
def test_a_label_a_loop_reads_after_writing_it_is_refused(n):
    """The uses in the loop of the label's last value would not be counted (the loop's writes are
    one site, at its end): refused, naming the label, the loop's line and what to do, rather than
    answered wrong. The right answer (central differences) counts the use in the last turn."""
    x = np.array([0.5, -1.0, 2.0])
    gr = reads_what_it_writes(x, np.array([n], np.uint32), record=True)
    gr()
    want = central(lambda e: np.sum(reads_what_it_writes_numpy(x, n, e)), np.zeros(3))
    np.testing.assert_allclose(want, 2.0, rtol=1e-8)             # v and the result both use it
    where = _where(reads_what_it_writes, "a = mul(a, x)")
    for call in (lambda: eagle.diff.reverse(gr.record, {"result": np.ones(3)}, wrt=("a",)),
                 lambda: eagle.diff.forward(gr.record, {"a": np.ones(3)})):
        refused(ValueError, call, "'a'", f"rebound at {where} in a device loop", "reads in its body", "wrt=")
    got = eagle.diff.reverse(gr.record, {"result": np.ones(3)}, wrt=("x",))["x"]    # the arguments still answer
    np.testing.assert_allclose(got, central(lambda e: np.sum(reads_what_it_writes_numpy(x + e, n, 0.0)),
                                            np.zeros(3)), rtol=1e-6)
    got = eagle.diff.reverse(gr.record, {"a": np.ones(3)}, wrt=("x",))["x"]         # seeding it: a = 2 x^(n+1)
    np.testing.assert_allclose(got, 2 * (n + 1) * x ** n, rtol=1e-12)


@eagle.Graph.builder
def writes_in_an_arm_of_a_loop(x, n, c, record=False):
    g = eagle.Graph(record=record)
    a = dbl(x, buffer=True)
    v = mul(a, x)
    for _ in range(n):
        if c:
            a = mul(x, x)                        # the body never reads a: nothing is missed
        v = add(v, x)
    g.result = add(v, a)
    return g


@pytest.mark.parametrize("n, c", [(0, 1), (2, 0), (2, 1)])
def test_a_label_a_loop_writes_and_does_not_read_still_answers(n, c):
    def numpy_run(x, eps):
        written = n > 0 and c
        a = 2 * x + (0 if written else eps)
        v = a * x
        for t in range(n):
            if c:
                a = x * x + (eps if t == n - 1 else 0)
            v = v + x
        return v + a

    x = np.array([0.5, -1.0, 2.0])
    gr = writes_in_an_arm_of_a_loop(x, np.array([n], np.uint32), np.array([c], np.uint32), record=True)
    gr()
    got = eagle.diff.reverse(gr.record, {"result": np.ones(3)}, wrt=("a",))["a"]
    np.testing.assert_allclose(got, central(lambda e: np.sum(numpy_run(x, e)), np.zeros(3)), rtol=1e-7)


@eagle.Graph.builder
def writes_in_early_turns(x, n, flag, record=False):
    g = eagle.Graph(record=record)
    a = dbl(x, buffer=True)
    v = mul(a, x)
    s = mul(x, 0.0 * x)
    for _ in range(n):
        v = add(v, a)                            # in a turn after the last write: that write's value
        below(s, 1.5, flag)                      # flag: set in the first two turns only
        if flag:
            a = mul(a, x)
        s = inc(s)
    g.result = add(v, a)
    return g


def writes_in_early_turns_numpy(x, n, eps):
    a = 2 * x + (eps if n == 0 else 0)
    v = a * x
    for t in range(n):
        v = v + a
        if t < 2:
            a = a * x + (eps if t == min(n, 2) - 1 else 0)
    return v + a


@pytest.mark.parametrize("n", [3, 4])
def test_a_label_read_in_turns_after_a_changing_condition_wrote_it_is_refused(n):
    """The loop reads the label before an arm that runs in some turns only writes it; the turns
    after its last write use that value (central differences: n - 1 with the result's use), which
    the probe at the loop's end misses. Refused, naming the write's line."""
    x = np.array([0.5, -1.0, 2.0])
    np.testing.assert_allclose(central(lambda e: np.sum(writes_in_early_turns_numpy(x, n, e)), np.zeros(3)), n - 1,
                               rtol=1e-7)
    gr = writes_in_early_turns(x, np.array([n], np.uint32), np.zeros(1, np.uint32), record=True)
    gr()
    refused(ValueError, lambda: eagle.diff.reverse(gr.record, {"result": np.ones(3)}, wrt=("a",)),
            f"'a' is rebound at {_where(writes_in_early_turns, 'a = mul(a, x)')} in a device loop")
