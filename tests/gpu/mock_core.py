"""Stand-ins for `cupy` and `cuda.core` (1.2 names) that forward to the recording fake, so the REAL
CoreRuntime / CoreGraphBuilder / CudaExecutable code runs on a machine without a GPU.

`install(monkeypatch)` puts modules `cupy`, `cuda.core` and `cuda.core.graph` in sys.modules:

  cupy      ndarray (a NumPy array behind .data.ptr, .device.id, .flags, module 'cupy'), zeros,
            empty, asarray, asnumpy, cuda.runtime (getDevice, getDeviceCount, driverGetVersion,
            memsetAsync), cuda.get_current_stream()
  cuda.core Device, LaunchConfig, launch (runs at once), ObjectCode.from_cubin (the "cubin" is the
            CUDA source: compile_cubin is patched to return it), Stream.from_handle
  cuda.core.graph.GraphDefinition
            explicit graph definitions whose nodes are recorded by a FakeBuilder; kernel arguments
            arrive as cuda.core receives them (pointers as ints) and are mapped back to arrays;
            instantiate() gives an executable with launch/upload/update and graph[node].update(...)

Only what eagle_fx.backends.cuda_graph and hawk_fx.cuda_runtime call exists; anything else raises AttributeError, which is the
point: a misspelt cuda.core call fails here, not first on the GPU. What it cannot tell: whether the
driver accepts what cuda.core passes on (that is tests/gpu's job).
"""
from __future__ import annotations

import sys
import types

import numpy as np

from conftest import stand_in_module
from eagle_fx.backends import cuda as ecuda
from hawk_fx import cuda_runtime
from hawk_fx.emit import cuda as hcuda
from eagle_fx.testing.fake_cuda import FakeBuilder, FakeCondition

_registry: dict = {}          # device pointer -> the NumPy array holding it
calls: list = []              # ('launch' | 'memsetAsync' | 'update_kernel' | 'update_memcpy' | 'update_graph' | ...)


class _Data:
    __slots__ = ("ptr",)

    def __init__(self, ptr):
        self.ptr = ptr


class ndarray:
    __module__ = "cupy"

    def __init__(self, host: np.ndarray, register=True):
        self._a = host
        if register and host.flags.c_contiguous and host.nbytes:
            _registry[host.ctypes.data] = host

    shape = property(lambda self: self._a.shape)
    dtype = property(lambda self: self._a.dtype)
    nbytes = property(lambda self: self._a.nbytes)
    strides = property(lambda self: self._a.strides)
    flags = property(lambda self: self._a.flags)
    size = property(lambda self: self._a.size)
    ndim = property(lambda self: self._a.ndim)
    data = property(lambda self: _Data(self._a.ctypes.data))
    device = property(lambda self: types.SimpleNamespace(id=0))

    @property
    def __cuda_array_interface__(self):
        return {"shape": self.shape, "typestr": self.dtype.str, "data": (self._a.ctypes.data, False), "version": 3}

    def __getitem__(self, k):
        v = self._a[k]
        return ndarray(v, register=False) if isinstance(v, np.ndarray) else v

    def __setitem__(self, k, v):
        self._a[k] = v

    def __repr__(self):
        return f"mock_cupy.ndarray({self._a!r})"


def _host(a):
    return a._a if isinstance(a, ndarray) else a


def _array_at(ptr, what):
    arr = _registry.get(int(ptr))
    if arr is None:
        raise AssertionError(f"mock cuda.core: {what} {ptr:#x} is no device array's pointer")
    return arr


def _arg(a, what="kernel argument"):
    """A kernel argument as cuda.core received it -> what the fake expects."""
    if isinstance(a, bool) or isinstance(a, (ndarray, np.ndarray)):
        raise AssertionError(f"mock cuda.core: a {type(a).__name__} {what}; cuda.core takes ints for pointers")
    if isinstance(a, int):
        return None if a == 0 else _array_at(a, what)
    if isinstance(a, (np.generic, FakeCondition)):
        return a
    raise AssertionError(f"mock cuda.core: {what} of type {type(a).__name__}")


def _module_of(cubin: bytes):
    src = cubin.decode()
    for mod in [ecuda.GUARDS, ecuda.LOWERING] + list(cuda_runtime._body_modules.values()):
        if mod.source == src:
            return mod
    raise AssertionError("mock cuda.core: a cubin of no known module")


class Kernel:
    def __init__(self, module, entry):
        self.module, self.entry = module, entry


class ObjectCode:
    def __init__(self, module):
        self.module = module

    @staticmethod
    def from_cubin(cubin, *, name="", symbol_mapping=None):
        return ObjectCode(_module_of(cubin))

    def get_kernel(self, name):
        if name not in self.module.entries:
            raise AssertionError(f"mock cuda.core: {self.module.name} has no kernel {name!r}")
        return Kernel(self.module, name)


class LaunchConfig:
    def __init__(self, grid, block):
        assert isinstance(grid, int) and isinstance(block, int)
        self.grid, self.block = grid, block


class Stream:
    def __init__(self, handle):
        self.handle = handle
        self.synced = 0

    @staticmethod
    def from_handle(handle):
        return Stream(int(handle))

    def sync(self):
        self.synced += 1


class Device:
    def __init__(self, device_id=0):
        self.device_id = device_id
        self.compute_capability = (9, 0)
        self.default_stream = Stream(0)

    def set_current(self):
        calls.append(("set_current",))


_eager_state = {"progress": {}, "fresh": set()}     # a stream's launches share the fake's body bookkeeping


def launch(stream, config, kernel, *args):
    """An eager launch, run at once: a one-node fake graph sharing the stream's body bookkeeping (a
    hawk body's entries arrive as separate launches; memsetAsync initialises workspaces)."""
    assert isinstance(stream, Stream) and isinstance(config, LaunchConfig) and isinstance(kernel, Kernel)
    calls.append(("launch", kernel.entry))
    fb = FakeBuilder()
    fb._progress, fb._fresh = _eager_state["progress"], _eager_state["fresh"]
    fb.kernel(kernel.module, kernel.entry, config.grid, config.block, tuple(_arg(a) for a in args))
    fb.validate().launch()


# -- explicit graphs ---------------------------------------------------------------------------

class _Node:
    def __init__(self, owner, fake):
        self._owner, self._fake = owner, fake

    def _after(self):
        return (self._fake,)

    # node-making methods, as on GraphNode: the new node depends on this one
    def launch(self, config, kernel, *args):
        return self._owner._launch(self._after(), config, kernel, args)

    def memset(self, dst, value, width, height=1, pitch=0, *, dst_owner=None):
        return self._owner._memset(self._after(), dst, value, width, dst_owner)

    def memcpy(self, dst, src, size, *, dst_owner=None, src_owner=None):
        return self._owner._memcpy(self._after(), dst, src, size)

    def callback(self, fn, *, user_data=None):
        return self._owner._wrap(self._owner.fb.host(fn, after=self._after()))

    def join(self, *nodes):
        return self._owner._wrap(self._owner.fb.join(self._after() + tuple(n._fake for n in nodes)))

    def if_then(self, condition):
        return self._owner._cond("if_then", self._after(), condition)

    def if_else(self, condition):
        return self._owner._cond("if_else", self._after(), condition)

    def switch(self, condition, count):
        return self._owner._cond("switch", self._after(), condition, count)

    def while_loop(self, condition):
        return self._owner._cond("while_loop", self._after(), condition)


class GraphDefinition:
    def __init__(self, fb=None):
        self.fb = FakeBuilder() if fb is None else fb

    def _wrap(self, fake, **bodies):
        node = _Node(self, fake)
        for k, v in bodies.items():
            setattr(node, k, v)
        return node

    def _launch(self, after, config, kernel, args):
        assert isinstance(config, LaunchConfig) and isinstance(kernel, Kernel)
        return self._wrap(self.fb.kernel(kernel.module, kernel.entry, config.grid, config.block,
                                         tuple(_arg(a) for a in args), after=after))

    def _memset(self, after, dst, value, width, owner):
        arr = _array_at(dst, "memset destination")
        assert isinstance(value, int) and width == arr.nbytes and _host(owner) is arr
        return self._wrap(self.fb.memset(arr, value, after=after))

    def _memcpy(self, after, dst, src, size):
        d, s = _array_at(dst, "memcpy destination"), _array_at(src, "memcpy source")
        assert size == d.nbytes == s.nbytes
        return self._wrap(self.fb.memcpy(d, s, after=after))

    def _cond(self, kind, after, condition, count=None):
        assert isinstance(condition, FakeCondition)
        if kind == "if_then":
            fake, body = self.fb.if_then(condition, after=after)
            return self._wrap(fake, then=GraphDefinition(body))
        if kind == "if_else":
            fake, (t, e) = self.fb.if_else(condition, after=after)
            return self._wrap(fake, then=GraphDefinition(t), else_=GraphDefinition(e))
        if kind == "switch":
            fake, bodies = self.fb.switch(condition, count, after=after)
            return self._wrap(fake, branches=tuple(GraphDefinition(b) for b in bodies))
        fake, body = self.fb.while_loop(condition, after=after)
        return self._wrap(fake, body=GraphDefinition(body))

    # entry-point versions (no dependencies)
    def launch(self, config, kernel, *args):
        return self._launch((), config, kernel, args)

    def memset(self, dst, value, width, height=1, pitch=0, *, dst_owner=None):
        return self._memset((), dst, value, width, dst_owner)

    def memcpy(self, dst, src, size, *, dst_owner=None, src_owner=None):
        return self._memcpy((), dst, src, size)

    def callback(self, fn, *, user_data=None):
        return self._wrap(self.fb.host(fn))

    def empty(self):
        return self._wrap(self.fb.join(()))

    def join(self, *nodes):
        return self._wrap(self.fb.join(tuple(n._fake for n in nodes)))

    def create_condition(self, default_value=None):
        return self.fb.create_condition(default_value)

    def if_then(self, condition):
        return self._cond("if_then", (), condition)

    def if_else(self, condition):
        return self._cond("if_else", (), condition)

    def switch(self, condition, count):
        return self._cond("switch", (), condition, count)

    def while_loop(self, condition):
        return self._cond("while_loop", (), condition)

    def instantiate(self, options=None):
        return Graph(self.fb.instantiate(NODE_UPDATES[0]))


NODE_UPDATES = ["all"]        # what per-node updates the mock's executables take (tests set it)


class _View:
    def __init__(self, graph, node):
        self.graph, self.node = graph, node

    def update(self, **kw):
        fake = self.node._fake
        if fake.kind == "kernel":
            assert set(kw) == {"config", "kernel", "args"}, kw
            assert kw["kernel"].entry == fake.entry and kw["config"].grid == fake.grid
            self.graph.exec.update_kernel(fake, tuple(_arg(a) for a in kw["args"]))
        elif fake.kind == "memcpy":
            assert set(kw) == {"dst", "src", "size"}, kw
            self.graph.exec.update_memcpy(fake, _array_at(kw["dst"], "dst"), _array_at(kw["src"], "src"))
        elif fake.kind == "memset":
            self.graph.exec.update_memset(fake, _array_at(kw["dst"], "dst"), kw["value"])
        else:
            raise AssertionError(f"mock cuda.core: update of a {fake.kind} node")
        calls.append((f"update_{fake.kind}", fake.index))


class Graph:
    def __init__(self, exe):
        self.exec = exe

    def launch(self, stream):
        assert isinstance(stream, Stream)
        calls.append(("graph_launch",))
        self.exec.launch()

    def upload(self, stream):
        assert isinstance(stream, Stream)

    def update(self, source):
        assert isinstance(source, GraphDefinition)
        calls.append(("update_graph",))
        self.exec.update(source.fb)

    def __getitem__(self, node):
        assert isinstance(node, _Node)
        return _View(self, node)


# -- cupy --------------------------------------------------------------------------------------

class _CupyStream:
    def __init__(self, ptr=0):
        self.ptr = ptr

    def synchronize(self):
        calls.append(("cupy_sync",))


_current = _CupyStream()


def _memset_async(ptr, value, nbytes, stream_ptr):
    arr = _array_at(ptr, "memsetAsync destination")
    assert arr.nbytes == nbytes
    arr.reshape(-1).view(np.uint8)[:] = value
    if value == 0:
        _eager_state["fresh"].add(id(arr))
    calls.append(("memsetAsync", nbytes))


def install(monkeypatch):
    try:
        import cuda  # noqa: F401   (the namespace package cuda-bindings makes)
    except ImportError:
        monkeypatch.setitem(sys.modules, "cuda", types.ModuleType("cuda"))
    calls.clear()
    _registry.clear()
    _eager_state["progress"].clear()
    _eager_state["fresh"].clear()
    NODE_UPDATES[0] = "all"
    cupy = types.ModuleType("cupy")
    cupy.ndarray = ndarray
    cupy.zeros = lambda shape, dtype=np.float64: ndarray(np.zeros(shape, dtype))
    cupy.empty = lambda shape, dtype=np.float64: ndarray(np.full(shape, 7, dtype) if np.dtype(dtype).kind in "iu"
                                                         else np.full(shape, np.nan, dtype))
    cupy.asarray = lambda a, dtype=None: a if isinstance(a, ndarray) else ndarray(np.array(a, dtype=dtype, copy=True))
    cupy.asnumpy = lambda a: np.array(_host(a), copy=True)
    cupy.cuda = types.SimpleNamespace(
        runtime=types.SimpleNamespace(getDevice=lambda: 0, getDeviceCount=lambda: 1, driverGetVersion=lambda: 12090,
                                      memsetAsync=_memset_async),
        get_current_stream=lambda: _current)
    core = types.ModuleType("cuda.core")
    for name in ("Device", "LaunchConfig", "launch", "ObjectCode", "Stream"):
        setattr(core, name, globals()[name])
    core.__version__ = "mock"
    graph = types.ModuleType("cuda.core.graph")
    graph.GraphDefinition = GraphDefinition
    graph.Graph = Graph
    core.graph = graph
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    stand_in_module(monkeypatch, "cuda.core", core)
    monkeypatch.setitem(sys.modules, "cuda.core.graph", graph)
    monkeypatch.setattr(hcuda, "compile_cubin", lambda source, arch="sm_90", options=(): source.encode())
    for cls in (ecuda.CoreRuntime, ecuda.KernelRuntime):      # runtimes and kernels made over the stand-ins
        monkeypatch.setattr(cls, "_instances", {})
    monkeypatch.setattr(ecuda.KernelRuntime, "_objects", {})
    monkeypatch.setattr(ecuda.KernelRuntime, "_functions", {})
    return cupy
