"""CuPy arrays make the same builders CUDA graphs: every case of cuda_cases (the builder tour and
the combination tests of tests/test_graph_*.py) built on CuPy arrays, replayed through the Graph
verbs, against the NumPy backend; kernels called eagerly on CuPy arrays; bind, streams, refusals.

Skipped unless CuPy imports and a CUDA device is present (EAGLE_FX_REQUIRE_GPU=1 turns the skip into
an error: bench/gpu_check.sh sets it).
"""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import cuda_cases  # noqa: E402
from cuda_cases import CASES, EAGER, NumpyDevice, assert_same, run_case  # noqa: E402


def gpu_skip_reason():
    try:
        import cupy
    except Exception as exc:
        return f"cupy does not import ({exc})"
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            return "no CUDA device"
    except Exception as exc:
        return f"no usable CUDA device ({exc})"
    try:
        import cuda.core  # noqa: F401
    except Exception as exc:
        return f"cuda.core does not import ({exc})"
    return None


REASON = gpu_skip_reason()
if REASON and os.environ.get("EAGLE_FX_REQUIRE_GPU"):
    raise RuntimeError(f"EAGLE_FX_REQUIRE_GPU is set, but the GPU tests cannot run: {REASON}")
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")

if REASON is None:
    import cupy as cp

    from eagle_fx.backends import cuda

tour, control, running = cuda_cases.tour, cuda_cases.control, cuda_cases.running
cell = cuda_cases.cell


class CupyDevice(NumpyDevice):
    """The same builders on CuPy arrays: CUDA graphs."""
    suffix = ", cuda>"

    @staticmethod
    def put(a):
        return cp.asarray(a) if isinstance(a, np.ndarray) else a

    @staticmethod
    def get(a):
        return cp.asnumpy(a) if isinstance(a, cp.ndarray) else a


BIND_MODES: dict = {}


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_case_on_cupy_equals_numpy(case):
    g = run_case(case, CupyDevice)
    assert isinstance(g._exe, cuda.CudaExecutable) and g._exe.backend_name == "cuda"
    if g._exe.last_bind is not None:
        BIND_MODES[case.name] = (g._exe.last_bind, getattr(g._exe, "last_bind_reason", ""))


def test_report_bind_modes(capsys):
    """Not a check: which bind path the driver took (per-node updates, or a whole-graph update)."""
    with capsys.disabled():
        for name, (mode, why) in sorted(BIND_MODES.items()):
            print(f"\n  bind {name}: {mode}{'  (' + why[:160] + ')' if why else ''}", end="")
        print()


def test_results_are_cupy_arrays_and_one_graph_per_built_graph():
    x = cp.arange(4.0)
    g = tour.first(x)
    r = g()
    assert isinstance(r, cp.ndarray) and r.device.id == x.device.id
    cp.testing.assert_array_equal(r, 4 * (x + 1.0))
    assert type(g._exe.graph).__module__.startswith("cuda.core")
    assert repr(g).endswith(", cuda>")
    assert g._exe.launches == 1
    g(5)
    assert g._exe.launches == 6


def test_enqueue_runs_on_the_current_cupy_stream():
    x, y = cp.asarray([0.0, 1.0, 2.5]), cp.zeros(3)
    g = running.counter(x, y)
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        assert g.enqueue(50) is g
        assert g.synchronize() is g
    cp.testing.assert_allclose(y, 50 * (x + 1.0))
    with s:
        g.enqueue(3)
        z = y * 1.0                          # ordered after the graph on the same stream
    s.synchronize()
    cp.testing.assert_allclose(z, 53 * (x + 1.0))


def test_bind_a_cell_read_inside_a_while_body():
    x, flag = cp.asarray([1.0, 5.0]), cp.asarray(cell(1))
    g = tour.capped(x, flag)
    for x1, fv in [(np.array([3.0, 70.0]), 1), (np.array([0.5, 2.0]), 0), (np.array([0.5, 2.0]), 1)]:
        f1 = cp.asarray(cell(fv))
        g.bind(x=cp.asarray(x1), flag=f1)
        ref_f = cell(fv)
        want = tour.capped(x1.copy(), ref_f)()
        cp.testing.assert_array_equal(g(), want)
        assert int(f1[0]) == int(ref_f[0])
    assert g._exe.last_bind in ("nodes", "graph", "instantiate")


@pytest.mark.parametrize("k", range(len(EAGER)))
def test_a_kernel_called_on_cupy_arrays_equals_the_numpy_call(k):
    kern, ref_args, dev_args = cuda_cases.eager_args(k, CupyDevice.put)
    want = kern(*ref_args)
    got = kern(*dev_args)
    assert_same(got, want, CupyDevice, kern.name)
    for a, b in zip(dev_args, ref_args):
        if isinstance(b, np.ndarray):
            assert_same(a, b, CupyDevice, f"{kern.name} argument")


def test_a_kernel_on_a_million_samples():
    x = np.linspace(-1.0, 1.0, 1_000_003)
    flag = cp.asarray(cell(0))
    cuda_cases.kernels.below(cp.asarray(x), 0.25, flag)
    assert int(flag[0]) == int(np.sum(x < 0.25))
    got = cp.asnumpy(cuda_cases.centre(cp.asarray(x)))
    np.testing.assert_allclose(got, x - x.mean(), rtol=0, atol=1e-12)


def test_a_host_node_runs_once_per_replay():
    import eagle_fx as eagle
    calls = []
    x = cp.arange(4.0)
    h = eagle.Graph()
    h.add_node(eagle.opaque(lambda: calls.append(1)), name="count")      # a host callback: no CUDA calls in it
    z = tour.twice(h, x)
    h.build()
    assert repr(h).endswith(", cuda>")
    h(3)
    assert len(calls) == 3
    cp.testing.assert_array_equal(h._array_of_plane(z), 4 * x)


def test_refusals_on_the_gpu():
    x = cp.arange(8.0)
    with pytest.raises(ValueError, match="not C-contiguous"):
        tour.first(x[::2])
    with pytest.raises(ValueError, match=r"'hi' is a NumPy array"):
        control.jumps(cp.zeros(3), cp.asarray(cell(1)), np.array([10.0]))
    with pytest.raises(NotImplementedError, match="record=True"):
        tour.model(cp.arange(4.0), cp.zeros(4), record=True)
    g = tour.first(cp.arange(4.0))
    with pytest.raises(ValueError, match="eagle.Graph.bind: 'x'"):
        g.bind(x=np.arange(4.0))
