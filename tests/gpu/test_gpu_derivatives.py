"""Derivative programs on the GPU: record=True graphs on CuPy arrays (both halves CUDA graphs, the
stacks of saved loop turns in device memory, checkpoints= included), against the NumPy backend.
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
from test_checkpointing import settle_rec  # noqa: E402
from test_one_reverse_mode import CASES, _seed_like  # noqa: E402
from tour_kernels import cell  # noqa: E402

pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")
if REASON is None:
    import cupy as cp

FORMS = list(CASES)


def _on_gpu(tree):
    if isinstance(tree, dict):
        return {k: _on_gpu(v) for k, v in tree.items()}
    if isinstance(tree, (tuple, list)):
        return type(tree)(_on_gpu(v) for v in tree)
    return cp.asarray(tree)


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
        got = eagle.diff.reverse(g.record, {"result": _on_gpu(seed)}, wrt=tuple(wrt))
    assert repr(g).endswith("cuda>")
    for w in wrt:
        np.testing.assert_allclose(cp.asnumpy(got[w]), want[w], rtol=1e-11, atol=1e-13, err_msg=w)


@pytest.mark.parametrize("K", [1, 4])
def test_a_checkpointed_record_on_cupy_arrays_reverses_as_the_numpy_one(K):
    x = np.linspace(1.0, 2.0, 200)
    seed = np.random.default_rng(0).normal(size=200)
    full = settle_rec(x.copy(), cell(1), record=True)
    full()
    want = eagle.diff.reverse(full.record, {"result": seed}, wrt="x")["x"]
    g = settle_rec(cp.asarray(x), cp.asarray(cell(1)), record=True, checkpoints=K)
    np.testing.assert_allclose(cp.asnumpy(cp.asarray(g())), full.result, rtol=1e-13)
    got = eagle.diff.reverse(g.record, {"result": cp.asarray(seed)}, wrt="x")["x"]
    np.testing.assert_allclose(cp.asnumpy(got), want, rtol=1e-12)
