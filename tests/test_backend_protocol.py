"""The backend protocol (eagle_fx/backends/protocol.py): every backend's executable lowers a Program
with its arrays once and then replays it, binds new arrays without lowering again, and answers
array_of with stable arrays. One builder runs on each backend against a plain NumPy oracle."""
import numpy as np
import pytest

import eagle_fx
from eagle_fx.backends.protocol import Executable
from eagle_fx.backends.select import use_backend
from tour_kernels import accumulate, affine, below, cell

BACKENDS = ["numpy", "fake-cuda", "jax", "record"]


def builder(backend):
    @eagle_fx.Graph.builder
    def climb(x, flag, y):
        g = eagle_fx.Graph(record=backend == "record")
        for _ in range(20):
            if not flag:
                break
            x = affine(x, 1.5, 0.25)
            below(x, 30.0, flag)
        accumulate(x, y)                 # y = x + 1: a Mutable argument, written in place
        g.result = x
        return g
    return climb


def oracle(x, flag):
    flag = int(flag[0])
    for _ in range(20):
        if not flag:
            break
        x = 1.5 * x + 0.25
        flag = int(np.sum(x < 30.0))
    return x, x + 1.0


def build(backend, *args):
    pick = {"record": "numpy"}.get(backend, backend)
    if pick == "jax":
        pytest.importorskip("jax")
    with use_backend(pick):
        return builder(backend)(*args)


@pytest.mark.parametrize("backend", BACKENDS)
def test_lower_replay_rebind_array_of(backend):
    x, y, flag = np.array([0.5, 1.0, -2.0]), np.zeros(3), cell(1)
    g = build(backend, x, flag, y)
    exe = g._exe
    assert isinstance(exe, Executable)
    assert exe.backend_name == {"numpy": "cpu", "record": "cpu"}.get(backend, backend)
    got = g()
    want, want_y = oracle(x, cell(1))
    np.testing.assert_allclose(got, want, rtol=1e-12)
    np.testing.assert_allclose(y, want_y, rtol=1e-12)     # the caller's array, written in place
    flag[0] = 1
    again = g()
    assert again is got                                    # a stable result array
    x2, y2 = np.array([3.0, -1.0, 0.0]), np.zeros(3)
    g.bind(x=x2, y=y2)                                     # rebind: no lowering
    assert g._exe is exe
    flag[0] = 1
    got2 = g()
    want2, want_y2 = oracle(x2, cell(1))
    np.testing.assert_allclose(got2, want2, rtol=1e-12)
    np.testing.assert_allclose(y2, want_y2, rtol=1e-12)
    np.testing.assert_allclose(y, want_y, rtol=1e-12)      # the first array: untouched since
    assert exe.array_of(g.program.inputs[g._input_names["y"]]) is y2     # an argument: the array bound now
