"""Derivative programs on the GPU: record=True graphs (both halves CUDA graphs, the stacks of saved
loop turns in device memory) and grad / checkpoints= on CuPy arrays, against the NumPy backend.
The fake device (tests/test_cuda_derivatives.py) checks the same lowering without a GPU; this is
the check on one. Skipped like test_gpu_graphs.py (EAGLE_FX_REQUIRE_GPU=1 makes a skip an error).
"""
from __future__ import annotations

import os
import sys
import warnings

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from test_gpu_graphs import REASON  # noqa: E402

import eagle_fx as eagle  # noqa: E402
from test_checkpointing import long_loop  # noqa: E402
from test_one_reverse_mode import CASES, _seed_like, jax_grad, numpy_turns, settle_counted, settle_uncapped  # noqa: E402
from tour_kernels import cell  # noqa: E402

pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")
if REASON is None:
    import cupy as cp

# records of builders that write none of their arguments (a written argument's entry copy is a host copy)
FORMS = [f for f in CASES if f != "written argument"]


def _on_gpu(tree):
    return {k: cp.asarray(v) for k, v in tree.items()} if isinstance(tree, dict) else cp.asarray(tree)


@pytest.mark.parametrize("form", FORMS)
def test_a_record_on_cupy_arrays_reverses_to_the_numpy_gradients(form):
    builder, args, wrt = CASES[form]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        g_np = builder(**{k: v.copy() for k, v in args.items()}, record=True)
        out = g_np()
        seed = _seed_like(out, np.random.default_rng(3))
        want = eagle.diff.reverse(g_np.record, {"result": seed}, wrt=tuple(wrt))
        g = builder(**{k: cp.asarray(v) for k, v in args.items()}, record=True)
        g()
        got = eagle.diff.reverse(g.record, {"result": _on_gpu(seed) if not isinstance(seed, tuple) else
                                            tuple(cp.asarray(s) for s in seed)}, wrt=tuple(wrt))
    assert repr(g).endswith("cuda>")
    for w in wrt:
        np.testing.assert_allclose(cp.asnumpy(got[w]), want[w], rtol=1e-11, atol=1e-13, err_msg=w)


@pytest.mark.parametrize("checkpoints", [None, 3])
def test_grad_of_a_counted_loop_on_the_device(checkpoints):
    x = np.linspace(0.1, 1.0, 7)
    n = cell(3)
    n_dev = cp.asarray(n)
    g = eagle.grad(settle_counted, checkpoints=checkpoints).graph(cp.asarray(x), n_dev)
    for turns in (3, 200, 0):                       # the trip count is read on the device at each run
        n_dev[...] = turns
        np.testing.assert_allclose(cp.asnumpy(cp.asarray(g())), jax_grad(x, turns), rtol=1e-11)


def test_an_uncapped_loop_grows_its_stacks_on_the_device():
    x = np.linspace(1.0, 2.0, 64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        g = eagle.grad(settle_uncapped).graph(cp.asarray(x), cp.asarray(cell(1)))
    np.testing.assert_allclose(cp.asnumpy(cp.asarray(g())), jax_grad(x, numpy_turns(x)), rtol=1e-11)


def test_checkpointed_grad_equals_the_stored_one_on_the_device():
    x = cp.asarray(np.linspace(0.1, 3.0, 1000))
    trip = cp.asarray(cell(500))
    got = eagle.grad(long_loop, checkpoints=8).graph(x, trip)()
    want = eagle.grad(long_loop).graph(x, trip)()
    np.testing.assert_allclose(cp.asnumpy(cp.asarray(got)), cp.asnumpy(cp.asarray(want)), rtol=1e-13)
