"""The CUDA backend wired into eagle_fx.Graph and hawk kernels, without a GPU.

The "fake-cuda" backend (eagle_fx.testing.fake_cuda.FakeRuntime) stands in for the device: the
same CudaExecutable lowers the Program into one graph, instantiates it (a snapshot), launches it
asynchronously on a stream (deferred until synchronize) and binds by per-node updates; the fake
interprets the graph with the kernels' NumPy code. Every Graph verb must give the NumPy backend's
results (tests/gpu/cuda_cases.py holds the cases; tests/gpu runs the same cases on CuPy arrays).
CuPy arrays on a machine without the GPU stack are refused with a message naming what is missing.
"""
from __future__ import annotations

import os
import subprocess
import sys
import types
import warnings

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpu"))

import cuda_cases  # noqa: E402
import eagle_fx as eagle  # noqa: E402
import hawk_fx as hawk  # noqa: E402
from conftest import stand_in_module  # noqa: E402
from cuda_cases import CASES, EAGER, NumpyDevice, run_case  # noqa: E402
from eagle_fx.backends import cuda  # noqa: E402
from eagle_fx.testing.fake_cuda import FakeBuilder, FakeCudaError, FakeRuntime  # noqa: E402
from hawk_fx import Mutable, Scalar  # noqa: E402

tour, kernels = cuda_cases.tour, cuda_cases.kernels
cell = cuda_cases.cell


class FakeDevice(NumpyDevice):
    """The CUDA side on the recording fake: NumPy arrays stand for device memory."""
    suffix = "fake-cuda>"

    def __init__(self, runtime=None):
        self.runtime = runtime if runtime is not None else FakeRuntime()

    def build(self, builder, args, kwargs):
        with cuda.use_backend(self.runtime):
            return builder(*args, **kwargs)


class FakeCupyArray:
    """What staging and kernels see of a CuPy array on a machine with no GPU stack: module 'cupy',
    shape, dtype and __cuda_array_interface__ (no memory behind it)."""
    __module__ = "cupy"

    def __init__(self, shape, dtype=np.float64):
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)
        self.ndim = len(self.shape)

    @property
    def __cuda_array_interface__(self):
        return {"shape": self.shape, "typestr": self.dtype.str, "data": (0, False), "version": 3}


@pytest.fixture
def no_gpu_stack(monkeypatch):
    """This machine as one without CuPy and cuda.core, whatever is installed."""
    monkeypatch.setitem(sys.modules, "cupy", None)
    stand_in_module(monkeypatch, "cuda.core", None)


# ---------------------------------------------------------------------------------------------
# every case through the Graph verbs: fake-cuda == numpy

@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_case_on_the_fake_equals_numpy(case):
    g = run_case(case, FakeDevice(FakeRuntime(order="lifo")))
    assert isinstance(g._exe, cuda.CudaExecutable)
    assert repr(g).endswith(", fake-cuda>")


@pytest.mark.parametrize("name", ["tour.whole", "control.fork_of_blocks", "control.nested_forks"])
@pytest.mark.parametrize("order", ["creation", 3, 11])
def test_forked_cases_in_other_node_orders(name, order):
    case = next(c for c in CASES if c.name == name)
    run_case(case, FakeDevice(FakeRuntime(order=order)))


@pytest.mark.parametrize("updates", [dict(node_updates="top"), dict(node_updates="none"),
                                     dict(node_updates="none", graph_updates=False)])
@pytest.mark.parametrize("name", ["tour.capped", "control.guard_or", "running.bindable",
                                  "control.while_break_continue"])
def test_bind_falls_back_and_still_equals_numpy(name, updates):
    case = next(c for c in CASES if c.name == name)
    rt = FakeRuntime(**updates)
    g = run_case(case, FakeDevice(rt))
    want = {"top": ("nodes", "graph"), "none": ("graph",)}[updates["node_updates"]]
    if not updates.get("graph_updates", True):
        want = ("instantiate",)
    assert g._exe.last_bind in want


# ---------------------------------------------------------------------------------------------
# the verbs, one by one

def fake_build(builder, *args, runtime=None, **kw):
    rt = runtime if runtime is not None else FakeRuntime()
    with cuda.use_backend(rt):
        return builder(*args, **kw), rt


def test_one_cuda_graph_per_built_graph_and_launches_per_replay():
    x, y = np.array([0.0, 1.0, 2.5]), np.zeros(3)
    g, rt = fake_build(cuda_cases.running.counter, x, y)
    assert rt.instantiations == 1 and rt.launches == 0          # building runs nothing
    np.testing.assert_array_equal(y, 0.0)
    yy, sq = g()
    assert yy is y and rt.launches == 1
    g(4)
    assert rt.launches == 5
    np.testing.assert_allclose(y, 5 * (x + 1.0))
    np.testing.assert_array_equal(sq, x * x)
    assert g.launch(2) is g and rt.launches == 7
    assert rt.instantiations == 1


def test_enqueue_is_asynchronous_until_synchronize():
    x, y = np.array([1.0, 2.0]), np.zeros(2)
    g, rt = fake_build(cuda_cases.running.counter, x, y)
    g.enqueue(3)
    np.testing.assert_array_equal(y, 0.0)                       # launched on the stream, not run yet
    assert rt.launches == 3
    assert g.synchronize() is g
    np.testing.assert_allclose(y, 3 * (x + 1.0))
    g.enqueue(2)
    g.enqueue(1)                                                # waits for the first (Graph.enqueue syncs)
    np.testing.assert_allclose(y, 5 * (x + 1.0))
    g.launch()                                                  # launch waits for what is enqueued, then runs
    np.testing.assert_allclose(y, 7 * (x + 1.0))


def test_result_reads_the_device_arrays_without_launching():
    x, y = np.array([1.0, 2.0]), np.zeros(2)
    g, rt = fake_build(cuda_cases.running.counter, x, y)
    res = g.result
    assert rt.launches == 0 and res[0] is y
    g()
    r2 = g.result
    assert rt.launches == 1 and r2[1] is res[1]                 # the same buffers every time


def test_bind_updates_the_instantiated_graph_in_place():
    x0, y0 = np.array([1.0, 2.0, 3.0]), np.zeros(3)
    g, rt = fake_build(cuda_cases.running.bindable, x0, y0, cell(1), cell(2))
    exe = g._exe
    graph = exe.graph
    before = [a for k, a in enumerate(exe.plan.slots) if k not in exe.plan.input_slots]
    x1, y1 = np.array([0.5, -1.0, 4.0]), np.zeros(3)
    g.bind(x=x1, y=y1)
    assert exe.last_bind == "nodes" and exe.graph is graph and rt.instantiations == 1
    kinds = {k for k, _ in graph.updates}
    assert kinds <= {"kernel", "memcpy"} and graph.updates
    after = [a for k, a in enumerate(exe.plan.slots) if k not in exe.plan.input_slots]
    assert all(a is b for a, b in zip(before, after))          # no buffer was remade
    want, want_y = cuda_cases.running.ref_bindable(x1, 1, 2)
    np.testing.assert_allclose(g(), want)
    np.testing.assert_allclose(y1, want_y)
    np.testing.assert_array_equal(y0, 0.0)                      # the first arrays are no longer written


def test_bind_by_whole_graph_update_keeps_the_buffers():
    x0, y0 = np.array([1.0, 2.0, 3.0]), np.zeros(3)
    rt = FakeRuntime(node_updates="none")
    g, _ = fake_build(cuda_cases.running.bindable, x0, y0, cell(1), cell(2), runtime=rt)
    exe = g._exe
    graph, slots = exe.graph, list(exe.plan.slots)
    n = cell(3)
    g.bind(n=n)
    assert exe.last_bind == "graph" and exe.graph is graph and rt.instantiations == 1
    assert graph.updates[-1] == ("graph", None)
    assert all(a is b for k, (a, b) in enumerate(zip(slots, exe.plan.slots)) if k not in exe.plan.input_slots)
    np.testing.assert_allclose(g(), cuda_cases.running.ref_bindable(x0, 1, 3)[0])


def test_bind_refuses_another_type_shape_or_dtype():
    g, _ = fake_build(cuda_cases.running.bindable, np.zeros(3), np.zeros(3), cell(1), cell(2))
    for bad in (FakeCupyArray((3,)), np.zeros(4), np.zeros(3, np.float32)):
        with pytest.raises(ValueError, match="eagle.Graph.bind: 'x'"):
            g.bind(x=bad)


def test_the_backend_follows_the_arrays_and_can_be_chosen():
    x = np.arange(3.0)
    assert repr(tour.first(x)).endswith(", cpu>")                 # NumPy arrays: the NumPy backend
    with cuda.use_backend("fake-cuda"):
        g = tour.first(x)
    assert repr(g).endswith(", fake-cuda>") and repr(g).endswith("cuda>")
    np.testing.assert_array_equal(g(), 2 * 2 * (x + 1.0))
    h = eagle.Graph(backend="fake-cuda")
    z = tour.twice(h, x)
    h.build()
    assert repr(h).endswith("fake-cuda>")
    h()
    np.testing.assert_array_equal(np.asarray(z), 4 * x)
    with pytest.raises(ValueError, match="unknown backend"):
        eagle.Graph(backend="tpu").build()
    with cuda.use_backend("numpy"), pytest.raises(ValueError, match="numpy backend was asked for"):
        tour.first(FakeCupyArray((3,)))


def test_host_nodes_run_on_the_fake_cuda_backend():
    src, dst = np.arange(4.0), np.zeros(4)
    h = eagle.Graph(backend="fake-cuda")
    h.add_node(eagle.opaque(lambda: np.add(src, 1.0, out=dst), reads={"x": src}, writes={"y": dst}), name="shift")
    z = tour.twice(h, dst)
    h.build().launch()
    np.testing.assert_array_equal(dst, src + 1.0)
    np.testing.assert_array_equal(np.asarray(z), 4 * (src + 1.0))


def test_record_true_runs_on_the_cuda_backend():
    x, y = np.arange(4.0), np.zeros(4)
    want = eagle.diff.reverse(_ran(tour.model(x.copy(), y.copy(), record=True)).record, {"result": np.ones(4)},
                              wrt=("x",))
    with cuda.use_backend("fake-cuda"):
        g = _ran(tour.model(x.copy(), y.copy(), record=True))
        got = eagle.diff.reverse(g.record, {"result": np.ones(4)}, wrt=("x",))
    assert repr(g).endswith("fake-cuda>")
    np.testing.assert_allclose(got["x"], want["x"], rtol=1e-13)


def _ran(g):
    g()
    return g


def test_a_non_contiguous_array_is_refused():
    with cuda.use_backend("fake-cuda"), pytest.raises(ValueError, match="not C-contiguous"):
        tour.first(np.arange(8.0)[::2])


# ---------------------------------------------------------------------------------------------
# no GPU here: CuPy arrays are refused when asked to run, with what is missing

def test_importing_eagle_fx_needs_no_gpu_package():
    code = ("import sys, eagle_fx, eagle_fx.backends.cuda, eagle_fx.testing.fake_cuda; "
            "bad = [m for m in sys.modules if m.startswith(('cupy', 'cuda.core'))]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_builder_on_cupy_arrays_is_refused_at_build(no_gpu_stack):
    x = FakeCupyArray((4,))
    g = eagle.Graph()                        # staging accepts the device array as a plane ...
    tour.twice(g, x)
    with pytest.raises(RuntimeError) as info:     # ... building it for the GPU is refused
        g.build()
    msg = str(info.value)
    assert isinstance(info.value, cuda.GpuUnavailableError)
    assert "cupy" in msg and "cuda.core" in msg and "pip install -e '.[cuda12]'" in msg and "NumPy" in msg
    with pytest.raises(RuntimeError, match=r"pip install -e '\.\[cuda12\]'"):
        tour.chooser(x, FakeCupyArray((1,), np.uint32))


def test_a_kernel_on_cupy_arrays_is_refused_naming_the_argument(no_gpu_stack):
    with pytest.raises(RuntimeError) as info:
        kernels.affine(FakeCupyArray((5,)), 2.0, 1.0)
    msg = str(info.value)
    assert "hawk.kernel affine: argument 'x' is a cupy.FakeCupyArray" in msg
    assert "pip install -e '.[cuda12]'" in msg and "cupy" in msg


def test_a_machine_with_cupy_but_no_device(monkeypatch):
    def no_device():
        raise RuntimeError("cudaErrorNoDevice: no CUDA-capable device is detected")

    fake_cupy = types.ModuleType("cupy")
    fake_cupy.cuda = types.SimpleNamespace(runtime=types.SimpleNamespace(getDeviceCount=no_device,
                                                                         driverGetVersion=no_device,
                                                                         getDevice=no_device))
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy)
    stand_in_module(monkeypatch, "cuda.core", types.ModuleType("cuda.core"))
    with pytest.raises(RuntimeError, match="needs a CUDA device") as info:
        tour.first(FakeCupyArray((4,)))
    assert "cudaErrorNoDevice" in str(info.value) and "pip install" in str(info.value)


def test_mixing_numpy_arguments_into_a_cupy_graph_is_refused():
    # CoreRuntime.device_arrays over a stand-in for CuPy: named NumPy arguments are refused,
    # arrays the builder made itself are copied to the device
    class Dev:
        flags = types.SimpleNamespace(c_contiguous=True)

    uploaded = []
    stub = types.SimpleNamespace(cupy=types.SimpleNamespace(asarray=lambda a: a),
                                 is_device=lambda a: isinstance(a, Dev),
                                 check_array=lambda a, what: None, to_device=lambda a: uploaded.append(a) or Dev())
    d = Dev()
    with pytest.raises(ValueError, match=r"'flag' is a NumPy array.*cupy.asarray\(flag\)"):
        cuda.CoreRuntime.device_arrays(stub, [d, cell(1)], ["x", "flag"])
    out = cuda.CoreRuntime.device_arrays(stub, [d, cell(0)], ["x", None])
    assert out[0] is d and isinstance(out[1], Dev) and len(uploaded) == 1


# ---------------------------------------------------------------------------------------------
# kernels called eagerly on device arrays: the emitted kernel launched directly (call_kernel)

@pytest.mark.parametrize("k", range(len(EAGER)))
def test_call_kernel_on_the_fake_equals_the_numpy_call(k):
    kern, args = EAGER[k]
    ref_args = [np.array(a, copy=True) if isinstance(a, np.ndarray) else a for a in args]
    dev_args = [np.array(a, copy=True) if isinstance(a, np.ndarray) else a for a in args]
    want = kern(*ref_args)
    values = kern.bind_arguments(dev_args, {})
    layout, n = kern.layout_of(values)
    spec = kern.specialize(layout)
    rt = FakeRuntime()
    got = hawk.tree.tree_unflatten(spec.tree, cuda.call_kernel(spec, values, n, runtime=rt))
    assert rt.eager and rt.eager[-1].nodes
    cuda_cases.assert_same(got, want, NumpyDevice, kern.name)
    for a, b in zip(dev_args, ref_args):
        if isinstance(b, np.ndarray):
            np.testing.assert_allclose(a, b, rtol=1e-12)


@hawk.kernel
def two_out(x: Scalar, a: Mutable[Scalar], b: Mutable[Scalar]):
    a = x
    b = 2.0 * x


def test_call_kernel_refuses_mutables_sharing_memory():
    y = np.zeros(4)
    values = [np.arange(4.0), y, y[:]]
    layout, n = two_out.layout_of(values)
    with pytest.raises(ValueError, match="'a' and 'b' share memory"):
        cuda.call_kernel(two_out.specialize(layout), values, n, runtime=FakeRuntime())


def test_a_kernel_call_stays_on_numpy_arrays_outside_graphs():
    x = np.arange(3.0)
    np.testing.assert_array_equal(kernels.inc(x), x + 1.0)


# ---------------------------------------------------------------------------------------------
# the fake's instantiated graphs

def test_an_instantiated_fake_graph_is_a_snapshot():
    fb = FakeBuilder()
    a, b = fb.to_device(np.array([1.0])), fb.zeros((1,), np.float64)
    node = fb.memcpy(b, a)
    ge = fb.instantiate()
    fb.memcpy(fb.zeros((1,), np.float64), b, after=(node,))       # after instantiation: not in ge
    ge.launch()
    assert b[0] == 1.0 and len(ge.graph.nodes) == 1
    c = fb.to_device(np.array([5.0]))
    ge.update_memcpy(node, b, c)
    ge.launch()
    assert b[0] == 5.0
    with pytest.raises(FakeCudaError, match="changes its size"):
        ge.update_memcpy(node, b, np.zeros(2))
    other = FakeBuilder()
    other.memcpy(other.zeros((1,), np.float64), other.to_device(np.array([2.0])))
    other.memcpy(other.zeros((1,), np.float64), other.to_device(np.array([2.0])))
    with pytest.raises(FakeCudaError, match="TOPOLOGY_CHANGED"):
        ge.update(other)


def test_fake_node_updates_check_arguments_and_modes():
    fb = FakeBuilder()
    c = fb.create_condition()
    cellv = fb.to_device(np.array([1], np.uint32))
    guard = fb.kernel(cuda.GUARDS, "set_cond_from_cell", 1, 1, (c, cellv))
    node, body = fb.if_then(c, after=(guard,))
    inner = body.memcpy(body.zeros((1,), np.float64), body.to_device(np.array([3.0])))
    ge = fb.instantiate(node_updates="top")
    with pytest.raises(FakeCudaError, match="u32\\* device array"):
        ge.update_kernel(guard, (c, np.zeros(1, np.int32)))
    ge.update_kernel(guard, (c, np.array([0], np.uint32)))
    with pytest.raises(FakeCudaError, match="inside a conditional body"):
        ge.update_memcpy(inner, inner.dst, inner.src)
    with pytest.raises(FakeCudaError, match="not a node of this graph"):
        ge.update_kernel(FakeBuilder().join(()), ())


def test_use_backend_nests_and_restores():
    with cuda.use_backend("fake-cuda"):
        with cuda.use_backend("numpy"):
            assert repr(tour.first(np.zeros(2))).endswith("cpu>")
        assert repr(tour.first(np.zeros(2))).endswith("fake-cuda>")
    assert repr(tour.first(np.zeros(2))).endswith("cpu>")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cuda.choose([np.zeros(2)])


def test_threads_calling_one_kernel_on_the_fake_device_at_once():
    """Each eager call has its own workspace and results: threads sharing one runtime do not mix
    (a kernel with a sample reduction, whose workspace would be the shared state)."""
    import threading

    @hawk.kernel
    def centre(x: Scalar) -> Scalar:
        return x - hawk.mean(x)

    rt = FakeRuntime()
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(5000) for _ in range(8)]
    layout, n = centre.layout_of([inputs[0]])
    spec = centre.specialize(layout)
    got, errors = {}, []

    def work(k):
        try:
            for rep in range(5):
                (out,) = cuda.call_kernel(spec, [inputs[k]], n, runtime=rt)
                got[(k, rep)] = out
        except Exception as exc:          # reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for (k, rep), out in got.items():
        np.testing.assert_allclose(out, inputs[k] - inputs[k].mean(), rtol=0, atol=1e-12)


# ---------------------------------------------------------------------------------------------
# the real CoreRuntime / CoreGraphBuilder over stand-ins for cupy and cuda.core (tests/gpu/mock_core.py)

@pytest.fixture
def mock_gpu(monkeypatch):
    import mock_core
    cupy = mock_core.install(monkeypatch)

    class MockCupyDevice(NumpyDevice):
        suffix = ", cuda>"

        @staticmethod
        def put(a):
            return cupy.asarray(a) if isinstance(a, np.ndarray) else a

        @staticmethod
        def get(a):
            return cupy.asnumpy(a) if isinstance(a, cupy.ndarray) else a

    return cupy, mock_core, MockCupyDevice


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_case_through_the_core_runtime_over_stand_ins(case, mock_gpu):
    cupy, mc, device = mock_gpu
    g = run_case(case, device)
    exe = g._exe
    assert isinstance(exe.runtime, cuda.CoreRuntime) and isinstance(exe.plan.builder._builder, cuda.CoreGraphBuilder)
    assert exe.backend_name == "cuda" and isinstance(g.result if g.result is not None else cupy.zeros(1),
                                                     (cupy.ndarray, dict, tuple, list))
    assert sum(1 for c in mc.calls if c[0] == "graph_launch") == exe.launches


@pytest.mark.parametrize("mode", ["top", "none"])
def test_core_runtime_bind_falls_back_to_a_whole_graph_update(mode, mock_gpu):
    cupy, mc, device = mock_gpu
    mc.NODE_UPDATES[0] = mode
    g = run_case(next(c for c in CASES if c.name == "running.bindable"), device)   # binds n: read in a loop body
    assert g._exe.last_bind == "graph" and ("update_graph",) in mc.calls


def test_core_runtime_kernels_called_on_cupy_arrays(mock_gpu):
    cupy, mc, device = mock_gpu
    for k in range(len(EAGER)):
        kern, ref, dev = cuda_cases.eager_args(k, device.put)
        cuda_cases.assert_same(kern(*dev), kern(*ref), device, kern.name)
        for a, b in zip(dev, ref):
            if isinstance(b, np.ndarray):
                cuda_cases.assert_same(a, b, device, kern.name + " argument")
    assert any(c[0] == "memsetAsync" for c in mc.calls) and any(c[0] == "launch" for c in mc.calls)


def test_core_runtime_refusals(mock_gpu):
    cupy, mc, device = mock_gpu
    with pytest.raises(ValueError, match=r"'hi' is a NumPy array"):
        cuda_cases.control.jumps(cupy.zeros(3), cupy.asarray(cell(1)), np.array([10.0]))
    with pytest.raises(ValueError, match=r"^eagle_fx: the array argument 'x' is not C-contiguous"):
        tour.first(cupy.asarray(np.arange(8.0))[::2])
    with pytest.raises(ValueError, match=r"^hawk.kernel affine: argument 'x' is not C-contiguous"):
        kernels.affine(cupy.asarray(np.arange(8.0))[::2], 2.0, 1.0)
    with pytest.raises(ValueError, match=r"Mutable written on the GPU"):
        kernels.accumulate(cupy.asarray(np.arange(3.0)), np.zeros(3))
    g = tour.first(cupy.asarray(np.arange(4.0)))
    assert repr(g).endswith(", cuda>")
    with pytest.raises(ValueError, match="eagle.Graph.bind: 'x'"):
        g.bind(x=np.arange(4.0))
