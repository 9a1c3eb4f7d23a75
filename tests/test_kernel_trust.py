"""Kernels that do what they say (issue 20, items 9, 12, 13, 14): a reserved role refused, not
ignored; JAX's derivative conventions at special points; float32 kept with Python numbers;
sharded jax.Arrays with uncommitted cells; NumPy's operators on staged planes.

Oracles: jax.grad of the same math, plain NumPy, and NumPy's own dtype rules.
"""
from __future__ import annotations

import numpy as np
import pytest

import hawk_fx as hawk
import hawk_fx.math as hm
from hawk_fx import Mutable, Scalar, Terminated, UInt32

# ---------------------------------------------------------------------------------------------
# item 9: Terminated is reserved for run-until-done, and refused until then


def test_terminated_is_refused_with_the_line_and_the_way_today():
    with pytest.raises(TypeError) as err:
        @hawk.kernel
        def advance(x: Scalar,
                    done: Terminated):
            return hm.where(done, x, x + 1.0)
    msg = str(err.value)
    for part in ("hawk.kernel advance:3", "test_kernel_trust.py", "'done'", "run-until-done",
                 "eagle_fx.simulate", "not yet available", "Mutable[UInt32]", "hm.where"):
        assert part in msg, (part, msg)


def test_mutable_terminated_is_refused():
    with pytest.raises(TypeError, match=r"finish:2 .*'done' is Mutable\[Terminated\].*run-until-done"):
        @hawk.kernel
        def finish(x: Scalar, done: Mutable[Terminated]):
            done = x > 2.0


def test_the_way_today_freezes_finished_samples():
    """What the message tells users to write: a Mutable[UInt32] mark and hm.where, against a loop."""
    @hawk.kernel
    def step(x: Mutable[Scalar], done: Mutable[UInt32]):
        x = hm.where(done != 0, x, x + 0.75)
        done = hm.where(x > 2.0, 1, done)

    x0 = np.array([0.1, 1.0, 1.9, 2.5, -3.0])
    x, done = x0.copy(), np.zeros(x0.size, np.uint32)
    for _ in range(4):
        step(x, done)
    want = []
    for v in x0:
        marked = False
        for _ in range(4):
            v = v if marked else v + 0.75
            marked = marked or v > 2.0
        want.append(v)
    np.testing.assert_array_equal(x, want)
    np.testing.assert_array_equal(done, np.array(want) > 2.0)
