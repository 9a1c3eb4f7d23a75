"""The small-n replay path: kernel calls bound to the graph's planes and scratch, Python numbers
held as 0-d arrays of their operands' float dtype, and a guard's count stored straight into its
cell. Each must compute what NumPy computes with the Python numbers themselves (NEP 50)."""
import numpy as np
from hypothesis import given, settings, strategies as st

import eagle_fx as eagle
import hawk_fx as hawk
from hawk_fx import Mutable, Scalar, UInt32
from hawk_fx import math as hm

NUMBERS = st.one_of(st.floats(-1e6, 1e6, allow_nan=False, width=64), st.integers(-5, 5),
                    st.sampled_from([0.1, 0.5, 1e9, 3.4e38, 2.0 ** 60]))


def make(a, b, lim):
    @hawk.kernel
    def step(x: Scalar, flag: Mutable[UInt32]) -> Scalar:
        y = x * a + b
        flag = hm.uint32(hawk.sum(y < lim))
        return y

    @eagle.Graph.builder
    def loop(x, flag):
        g = eagle.Graph()
        for _ in range(3):
            if not flag:
                break
            x = step(x, flag)
        g.result = x
        return g
    return step, loop


def numpy_loop(x, a, b, lim):
    flag = 1
    for _ in range(3):
        if not flag:
            break
        x = x * a + b
        flag = np.uint32(np.count_nonzero(x < lim))
    return x, flag


@settings(max_examples=30, deadline=None)
@given(a=NUMBERS, b=NUMBERS, lim=NUMBERS, dtype=st.sampled_from([np.float32, np.float64]),
       n=st.sampled_from([1, 8, 16]))
def test_small_n_replay_computes_what_numpy_does(a, b, lim, dtype, n):
    x = np.linspace(-3, 3, n).astype(dtype)
    step, loop = make(a, b, lim)
    with np.errstate(all="ignore"):
        want, want_flag = numpy_loop(x, a, b, lim)
        flag = np.array([7], np.uint32)
        eager = step(x, flag)
        np.testing.assert_array_equal(eager, x * a + b)
        assert eager.dtype == (x * a + b).dtype
        flag = np.array([1], np.uint32)
        g = loop(x, flag)
        for _ in range(2):                          # a replay reuses the bound calls and their scratch
            flag[0] = 1
            got = g()
            np.testing.assert_array_equal(got, want)
            assert got.dtype == want.dtype
            assert flag[0] == want_flag
