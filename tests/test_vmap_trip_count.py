"""vmap of a counted loop whose body writes its own trip-count cell. Python evaluates range(k)
once, so each instance turns k times as it had on entry, whatever the body does to k; vmap must
mean the loop over instances. The oracle is that loop in plain Python and NumPy."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import eagle_fx
import hawk_fx as hawk
import hawk_fx.math as hm
from hawk_fx import Mutable, Scalar, UInt32

pytestmark = pytest.mark.usefixtures("backend_heavy")     # on numpy; on jax too with -m slow (compiles)


@hawk.kernel
def inc(x: Scalar) -> Scalar:
    return x + 1.0


@hawk.kernel
def dec(x: Scalar, k: Mutable[UInt32]):
    k = hm.uint32(k - 1)


@hawk.kernel
def grow(x: Scalar, k: Mutable[UInt32]):
    k = hm.uint32(k + 2)


@eagle_fx.Graph.builder
def shrinking(x, k):
    g = eagle_fx.Graph()
    for i in range(k):
        x = inc(x)
        dec(x, k)
    g.result = x
    return g


@eagle_fx.Graph.builder
def growing(x, k):
    g = eagle_fx.Graph()
    for i in range(k):
        x = inc(x)
        grow(x, k)
    g.result = x
    return g


def python_loop(x, k, step):
    """Per instance: range(k) once; k changes by `step` every turn."""
    x, k = x.copy(), k.astype(np.int64)
    for b in range(x.shape[0]):
        for _ in range(int(k[b, 0])):
            x[b] += 1.0
            k[b, 0] += step
    return x, k


def test_the_audit_repro_the_batched_loop_reads_its_trip_count_once():
    x, k = np.zeros((2, 3)), np.array([[4], [4]], np.uint32)
    want_x, want_k = python_loop(x, k, -1)
    got = eagle_fx.vmap(shrinking)(x, k)()
    np.testing.assert_array_equal(got, want_x)          # 4 turns each, not 2
    np.testing.assert_array_equal(k, want_k)


@settings(max_examples=25, deadline=None)
@given(trips=st.lists(st.integers(0, 6), min_size=1, max_size=5), grows=st.booleans(), n=st.sampled_from([1, 3, 40]))
def test_vmap_of_a_self_counting_loop_is_the_loop_over_instances(trips, grows, n):
    B = len(trips)
    x = np.arange(B * n, dtype=np.float64).reshape(B, n)
    k = np.array(trips, np.uint32).reshape(B, 1)
    want_x, want_k = python_loop(x, k, 2 if grows else -1)
    if not grows:
        want_k = np.maximum(want_k, 0)
    got = eagle_fx.vmap(growing if grows else shrinking)(x, k)()
    np.testing.assert_array_equal(got, want_x)
    np.testing.assert_array_equal(k, want_k)
