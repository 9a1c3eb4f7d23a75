"""A kernel loop that stops per sample but cannot run as one loop equation (a loop over a list,
or a body that needs the loop variable as a Python int) runs its remaining turns unrolled and
masked. The values are those of a plain Python loop per sample (the oracle here); the cost is
every turn for every sample, so the kernel says so once, naming its line and why."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import hawk_fx as hawk
from hawk_fx import Scalar, Vector
from hawk_fx import UnrolledLoopWarning
from conftest import file_and_line

STEPS = [1.5, 0.25, 2.0, 3.0, 0.5]


def _python_loop(x, steps, limit):
    """The oracle: one sample, plain Python."""
    for c in steps:
        x = x * c
        if x > limit:
            break
    return x


def test_a_loop_over_a_list_warns_once_naming_its_line_and_matches_python():
    @hawk.kernel
    def scaled(x: Scalar):
        for c in [1.5, 0.25, 2.0, 3.0, 0.5]:
            x = x * c
            if x > 2.0:
                break
        return x
    x = np.random.default_rng(0).random(23) * 4
    with pytest.warns(UnrolledLoopWarning) as got:
        y = scaled(x)
    assert len(got) == 1
    msg = str(got[0].message)
    name, line = file_and_line(scaled, "for c in [1.5")
    assert "hawk.kernel scaled:" in msg and f"({name}, {line})" in msg
    assert "`for c in [1.5, 0.25, 2.0, 3.0, 0.5]:`" in msg
    assert "runs over a list, not a range" in msg and "loop over range(K)" in msg
    assert got[0].filename == __file__
    np.testing.assert_array_equal(y, [_python_loop(v, STEPS, 2.0) for v in x])
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnrolledLoopWarning)
        scaled(x + 1.0)                      # the same kernel again: traced once, no second warning


def test_a_body_needing_a_python_int_says_why():
    @hawk.kernel
    def indexed(x: Scalar):
        for i in range(5):
            x = x * [1.5, 0.25, 2.0, 3.0, 0.5][i]
            if x > 2.0:
                break
        return x
    x = np.random.default_rng(1).random(19) * 4
    with pytest.warns(UnrolledLoopWarning) as got:
        y = indexed(x)
    msg = str(got[0].message)
    name, line = file_and_line(indexed, "for i in range(5)")
    assert "hawk.kernel indexed:" in msg and f"({name}, {line})" in msg and "`for i in range(5):`" in msg
    assert "cannot be traced once for all turns" in msg and "int()" in msg
    np.testing.assert_array_equal(y, [_python_loop(v, STEPS, 2.0) for v in x])


def test_a_loop_that_runs_as_one_equation_does_not_warn():
    @hawk.kernel
    def first_big(v: Vector[4]):
        found = 0.0 * v[0]
        for i in range(4):
            found = v[i]                    # a traced index of a Vector: one loop equation
            if v[i] > 0.5:
                break
        return found
    v = np.random.default_rng(2).random((4, 11))
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnrolledLoopWarning)
        f = first_big(v)
    want = [v[next((k for k in range(4) if v[k, n] > 0.5), 3), n] for n in range(11)]
    np.testing.assert_array_equal(f, want)


@pytest.mark.parametrize("seed", range(6))
def test_random_unrolled_loops_match_python(seed):
    rng = np.random.default_rng(seed)
    steps = [float(s) for s in rng.uniform(0.2, 2.5, rng.integers(2, 7))]
    limit = float(rng.uniform(0.5, 3.0))

    @hawk.kernel
    def scaled(x: Scalar):
        for c in steps:                     # a Python list the kernel reads when traced
            x = x * c
            if x > limit:
                break
        return x
    x = rng.random(29) * 3
    with pytest.warns(UnrolledLoopWarning):
        y = scaled(x)
    np.testing.assert_array_equal(y, [_python_loop(v, steps, limit) for v in x])
