"""Hawk kernels on CuPy arrays: the kernel-level CUDA runtime (no graphs).

A hawk kernel called eagerly on CuPy arrays (`hawk_fx.kernel.Kernel.__call__`) runs here: its body,
emitted as CUDA C by hawk_fx.emit.cuda, is compiled with NVRTC once per module and device, and its
entries are launched one after another on CuPy's current stream (`call_kernel`).

    KernelModule   CUDA C compiled as one module (a hawk body, or guard/lowering kernels)
    body_module    the module of a hawk Specialization: `hawk_<sha256 of its source[:16]>`
    KernelRuntime  CuPy device memory, NVRTC-compiled kernels (cuda.core), CuPy's current stream;
                   eagle_fx's CUDA graph runtime (backends/cuda_graph.py) extends it with graphs
    call_kernel    a kernel's entries launched directly on device arrays
    require_gpu    the refusal where the GPU stack (CuPy, cuda.core, a device, driver >= 12.8) is missing

The runtime protocol call_kernel needs (KernelRuntime here; a recording fake in eagle_fx.testing):
    is_device(a), device_arrays(arrays, names, api), check_array(a, what), empty(shape, dtype),
    to_device(host), overlaps(a, b), and run_now(steps): ('kernel', module, entry, grid, block,
    args) and ('memset', array, value) steps, launched in order on the current stream.

Nothing here imports CuPy or cuda.core at import time; they are imported where a GPU is used.
"""
from __future__ import annotations

import hashlib
import threading
import weakref
from dataclasses import dataclass

import numpy as np

from .emit import cuda as hcuda
from .emit.jax import is_jax_array

BLOCK = hcuda.BLOCK        # threads per block of the grid-stride map kernels
MAX_GRID = 1024            # blocks at most; the map kernels stride over the rest

INSTALL_HINT = "pip install -e '.[cuda12]'   (CUDA 13 drivers: pip install -e '.[cuda13]')"
MIN_DRIVER = 12080         # IF-ELSE and SWITCH conditional nodes need CUDA driver 12.8
NVRTC_OPTIONS = ("--fmad=false",)   # a*x+b rounds as NumPy's multiply then add does


# ---------------------------------------------------------------------------------------------
# the refusal

class GpuUnavailableError(NotImplementedError):
    """CuPy arrays were given, but the GPU stack (CuPy, cuda.core, a device, a recent driver) is not
    usable here. A RuntimeError (NotImplementedError derives from it), as kernels' refusals of
    device arrays always were."""


def require_gpu(what: str = "eagle_fx: CuPy arrays run as CUDA graphs") -> int:
    """Check that CuPy, cuda.core and a CUDA device (driver >= 12.8) are usable; return the driver
    version (e.g. 12080). Raises GpuUnavailableError (a RuntimeError) naming what is missing and how
    to install it; `what` starts the message (the API, and what needed the GPU)."""
    missing = []
    try:
        import cupy
    except Exception as exc:                      # ImportError, or a broken install
        cupy = None
        missing.append(f"cupy (the cupy-cuda12x wheel; import failed: {exc})")
    try:
        import cuda.core  # noqa: F401
    except Exception as exc:
        missing.append(f"cuda.core (the cuda-core wheel; import failed: {exc})")
    if missing:
        raise GpuUnavailableError(f"{what}, which needs " + " and ".join(missing)
                                  + f"; install the CUDA extra: {INSTALL_HINT}; or pass NumPy arrays to run on the CPU")
    try:
        count = int(cupy.cuda.runtime.getDeviceCount())
        driver = int(cupy.cuda.runtime.driverGetVersion())
    except Exception as exc:
        raise GpuUnavailableError(f"{what}, which needs a CUDA device and its driver; "
                                  f"none is usable here ({type(exc).__name__}: {exc}); run on a machine with an NVIDIA "
                                  "GPU (the packages come with: " + INSTALL_HINT + "), or pass NumPy arrays to run on "
                                  "the CPU") from exc
    if count < 1:
        raise GpuUnavailableError(f"{what}, which needs a CUDA device; the driver reports none; pass "
                                  "NumPy arrays to run on the CPU")
    if driver < MIN_DRIVER:
        raise GpuUnavailableError(f"{what}, which needs a CUDA driver >= 12.8 (IF-ELSE and SWITCH graph nodes); "
                                  f"this one is {driver // 1000}.{driver % 1000 // 10}; update the NVIDIA driver, or "
                                  "pass NumPy arrays to run on the CPU")
    return driver


# ---------------------------------------------------------------------------------------------
# kernel modules

@dataclass(frozen=True, eq=False)
class KernelModule:
    """CUDA C compiled as one module. kind: 'body' (a hawk kernel body: `emitted` is its
    EmittedKernel, `spec` the hawk Specialization it came from), 'guard' (the emitter's guard
    kernels) or 'lowering' (the graph lowering's small kernels)."""
    name: str
    source: str
    entries: tuple
    kind: str
    emitted: object = None
    spec: object = None
    label: str = ""

    def __repr__(self):
        return f"<KernelModule {self.name} {self.kind}{' ' + self.label if self.label else ''}>"


_body_modules: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()     # Specialization -> KernelModule


def body_module(spec) -> KernelModule:
    """The CUDA module of a hawk Specialization, named by the hash of its source (cached)."""
    mod = _body_modules.get(spec)
    if mod is None:
        probe = hcuda.emit_specialization(spec, "hawk_body")
        digest = hashlib.sha256(probe.source.encode()).hexdigest()[:16]
        ek = hcuda.emit_specialization(spec, f"hawk_{digest}")
        mod = KernelModule(ek.name, ek.source, tuple(ek.entry_names()), "body", ek, spec, spec.kernel.name)
        _body_modules[spec] = mod
    return mod


# ---------------------------------------------------------------------------------------------
# device arrays

def grid_for(n: int) -> int:
    """Blocks of a grid-stride map kernel over n items."""
    return max(1, min(-(-int(n) // BLOCK), MAX_GRID))


def core_arg(a):
    """A kernel argument as cuda.core's launch marshals it: device arrays as their pointer (a Python
    int is passed as a pointer), None as a null pointer, NumPy scalars by value in their dtype,
    GraphConditions as their handle (cuda.core unwraps them)."""
    if a is None:
        return 0
    if isinstance(a, np.generic):
        return a
    data = getattr(a, "data", None)
    ptr = getattr(data, "ptr", None)
    if ptr is not None:                            # a CuPy array: its device pointer
        return int(ptr)
    return a


def ptr(a) -> int:
    """The device pointer of a CuPy array."""
    return int(a.data.ptr)


def _start(a) -> int:
    return a.__array_interface__["data"][0] if isinstance(a, np.ndarray) else ptr(a)


def same_view(a, b) -> bool:
    """Two device arrays over the same elements in the same order (CuPy, or a fake's NumPy)."""
    return tuple(a.shape) == tuple(b.shape) and a.strides == b.strides and _start(a) == _start(b)


def overlaps(a, b) -> bool:
    """Do two device arrays share memory? NumPy arrays (a fake's device memory) exactly; device arrays
    by their byte ranges (they are C-contiguous: every array a launch reads is checked)."""
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        return bool(np.shares_memory(a, b))
    pa, pb = _start(a), _start(b)
    return a.nbytes > 0 and b.nbytes > 0 and pa < pb + b.nbytes and pb < pa + a.nbytes


def is_device_array(a) -> bool:
    """A GPU array: a CuPy array (by its module), or anything with __cuda_array_interface__ that is
    not a jax.Array (those go to the jax backend)."""
    return (type(a).__module__.split(".")[0] == "cupy" or hasattr(type(a), "__cuda_array_interface__")) \
        and hasattr(a, "shape") and hasattr(a, "dtype") and not is_jax_array(a)


# ---------------------------------------------------------------------------------------------
# the runtime over CuPy and cuda.core (>= 1.0): needs a GPU

class KernelRuntime:
    """CuPy device memory, NVRTC-compiled kernels loaded through cuda.core, and launches on CuPy's
    current stream (so a call is ordered with the CuPy work around it like any CuPy operation), on
    the CUDA device CuPy has current. One instance per device (`KernelRuntime.get()`); compiled
    modules are shared by every runtime of a device. Needs a GPU; run by tests/gpu."""

    name = "cuda"
    _instances: dict = {}          # device id -> runtime (each subclass keeps its own)
    _objects: dict = {}            # (device id, module name, arch) -> cuda.core ObjectCode
    _functions: dict = {}          # (device id, module name, entry, arch) -> kernel
    _lock = threading.Lock()

    @classmethod
    def get(cls, what: str = "hawk_fx: CuPy arrays run hawk kernels on the GPU"):
        try:
            import cupy
            dev = int(cupy.cuda.runtime.getDevice())
        except Exception:
            dev = None
        rt = cls._instances.get(dev) if dev is not None else None
        if rt is None:
            driver = require_gpu(what)
            import cupy
            dev = int(cupy.cuda.runtime.getDevice())
            with cls._lock:
                rt = cls._instances.get(dev)
                if rt is None:
                    rt = cls._instances[dev] = cls(dev, driver)
        rt._make_current()
        return rt

    def __init__(self, device_id: int, driver: int):
        import cupy
        from cuda.core import Device
        self.cupy, self.device_id, self.driver = cupy, device_id, driver
        self.device = Device(device_id)
        self._local = threading.local()
        self._make_current()
        cc = self.device.compute_capability
        self.arch = f"sm_{cc[0]}{cc[1]}"
        self._configs: dict = {}
        self._null_stream = None

    def __repr__(self):
        return f"<{type(self).__name__} device {self.device_id} {self.arch} driver {self.driver}>"

    def _make_current(self):
        if not getattr(self._local, "current", False):    # cuda.core needs a current context per thread
            self.device.set_current()
            self._local.current = True

    # memory
    def is_device(self, a) -> bool:
        return isinstance(a, self.cupy.ndarray)

    def device_arrays(self, arrays, names=None, api="eagle_fx") -> list:
        """The arrays a launch or graph runs on: device arrays as they are (checked: C-contiguous, this
        device); NumPy arrays that are not named arguments (a constant or scratch cell a graph's
        builder made) are copied to the device once. `api` starts the refusals."""
        names = list(names) if names is not None else [None] * len(arrays)
        out = []
        for a, name in zip(arrays, names):
            what = f"{api}: " + (f"the array argument {name!r}" if name else "an array the builder reached")
            if isinstance(a, np.ndarray):
                if name:
                    raise ValueError(f"{what} is a NumPy array, and other arrays of this graph are CuPy "
                                     f"arrays; a graph runs on one device: pass cupy.asarray({name}) (or NumPy "
                                     "arrays only, to run on the CPU)")
                out.append(self.to_device(a))
                continue
            if not self.is_device(a):
                a = self.cupy.asarray(a)             # __cuda_array_interface__: a zero-copy CuPy view
            self.check_array(a, what)
            out.append(a)
        return out

    def check_array(self, a, what="eagle_fx: an array"):
        """Refuse what a kernel cannot read densely on this device; `what` names the array, API first."""
        if not a.flags.c_contiguous:
            raise ValueError(f"{what} is not C-contiguous (strides {a.strides}); CUDA kernels read planes "
                             "densely: pass cupy.ascontiguousarray(...)")
        dev = int(a.device.id)
        if dev != self.device_id:
            raise ValueError(f"{what} lives on CUDA device {dev}, and this runs on device {self.device_id} (CuPy's "
                             "current device); a call or a graph runs on one device")

    def zeros(self, shape, dtype):
        return self.cupy.zeros(tuple(shape), np.dtype(dtype))

    def empty(self, shape, dtype):
        return self.cupy.empty(tuple(shape), np.dtype(dtype))

    def to_device(self, host):
        return self.cupy.asarray(np.ascontiguousarray(host))

    overlaps = staticmethod(overlaps)

    # kernels
    def function(self, module: KernelModule, entry: str, arch: str | None = None):
        arch = arch or self.arch
        key = (self.device_id, module.name, entry, arch)
        fn = self._functions.get(key)
        if fn is None:
            okey = (self.device_id, module.name, arch)
            obj = self._objects.get(okey)
            if obj is None:
                from cuda.core import ObjectCode
                cubin = hcuda.compile_cubin(module.source, arch, NVRTC_OPTIONS)
                obj = self._objects[okey] = ObjectCode.from_cubin(cubin)
            fn = self._functions[key] = obj.get_kernel(entry)
        return fn

    def config(self, grid, block):
        key = (int(grid), int(block))
        cfg = self._configs.get(key)
        if cfg is None:
            from cuda.core import LaunchConfig
            cfg = self._configs[key] = LaunchConfig(grid=key[0], block=key[1])
        return cfg

    # streams
    def stream(self):
        """CuPy's current stream, as a cuda.core Stream."""
        self._make_current()
        s = self.cupy.cuda.get_current_stream()
        handle = int(s.ptr)
        from cuda.core import Stream
        if handle == 0:
            if self._null_stream is None:
                try:
                    self._null_stream = Stream.from_handle(0)
                except Exception:
                    self._null_stream = self.device.default_stream
            return self._null_stream
        return Stream.from_handle(handle)       # non-owning; CuPy keeps the stream alive

    def run_now(self, steps):
        from cuda.core import launch
        stream = self.stream()
        for st in steps:
            if st[0] == "memset":
                _, arr, value = st
                self.cupy.cuda.runtime.memsetAsync(ptr(arr), int(value), int(arr.nbytes),
                                                   self.cupy.cuda.get_current_stream().ptr)
            else:
                _, module, entry, grid, block, args = st
                launch(stream, self.config(grid, block), self.function(module, entry),
                       *[core_arg(a) for a in args])


# ---------------------------------------------------------------------------------------------
# a kernel called eagerly on CuPy arrays: the emitted kernel, launched directly

def call_kernel(spec, values, n: int, runtime=None) -> list:
    """Run hawk Specialization `spec` on `values` (its arguments in parameter order: device arrays,
    Python numbers, NumPy scalars and one-cell arrays, which are uploaded) over n samples: the body's
    entries launched one after another on CuPy's current stream (asynchronous, like a CuPy
    operation). Returns the result arrays (new device arrays, in spec order); Mutable arguments are
    written in place. Refuses (GpuUnavailableError) where there is no GPU stack."""
    kernel = spec.kernel
    if runtime is None:
        try:
            runtime = KernelRuntime.get("CuPy arrays run hawk kernels on the GPU")
        except GpuUnavailableError as exc:
            k = next((i for i, v in enumerate(values) if is_device_array(v)), 0)
            v = values[k]
            raise GpuUnavailableError(f"hawk.kernel {kernel.name}: argument '{kernel.param_names[k]}' is a "
                                      f"{type(v).__module__}.{type(v).__name__}; {exc}") from None
    mod = body_module(spec)
    ek = mod.emitted
    commits = list(spec.commits)
    dev = list(values)
    for k, (name, v) in enumerate(zip(kernel.param_names, values)):
        where = f"hawk.kernel {kernel.name}: argument '{name}'"
        if runtime.is_device(v) or is_device_array(v):
            if not runtime.is_device(v):            # another __cuda_array_interface__ array: a CuPy view
                (dev[k],) = runtime.device_arrays([v], [name], api=f"hawk.kernel {kernel.name}")
            runtime.check_array(dev[k], where)
        elif k in commits:
            raise ValueError(f"{where} is a Mutable written on the GPU, but it is a {type(v).__name__}, not a "
                             "device array; pass a CuPy array (other arguments of this call are CuPy arrays)")
        elif isinstance(v, np.ndarray) and v.shape and v.shape[-1] != 1:
            raise ValueError(f"{where} is a NumPy plane of {v.shape[-1]} samples, and other arguments are CuPy "
                             f"arrays; a call runs on one device: pass cupy.asarray({name})")
    for a in range(len(commits)):
        for b in range(a):
            if runtime.overlaps(dev[commits[a]], dev[commits[b]]):
                raise ValueError(f"hawk.kernel {kernel.name}: Mutable arguments '{kernel.param_names[commits[b]]}' "
                                 f"and '{kernel.param_names[commits[a]]}' share memory; pass separate arrays")
    for k, v in enumerate(dev):     # an input overlapping a Mutable (not that very view): read before written
        if k not in commits and runtime.is_device(v) and any(
                runtime.overlaps(v, dev[c]) and not same_view(v, dev[c]) for c in commits):
            dev[k] = v.copy()
    outs = [runtime.empty(spec.result_shape(j, n), spec.result_dtype(j)) for j in range(spec.n_results)]
    targets = outs + [dev[k] for k in commits]
    ws = runtime.empty((ek.workspace_bytes,), np.uint8) if ek.workspace_bytes else None
    args = []
    for prm in ek.params:
        if prm.role in ("in_plane", "in_cell"):
            v = dev[prm.index]
            if not runtime.is_device(v):             # a NumPy one-cell array or scalar: uploaded
                v = runtime.to_device(np.asarray(v, dtype=prm.dtype).reshape(-1))
            args.append(v)
        elif prm.role == "in_value":
            args.append(np.dtype(prm.dtype).type(values[prm.index]))
        elif prm.role in ("out_plane", "out_cell"):
            args.append(targets[prm.index])
        elif prm.role == "workspace":
            args.append(ws)
        elif prm.role == "n":
            args.append(np.uint64(n))
        else:
            raise NotImplementedError(f"eagle_fx CUDA: unknown kernel parameter role {prm.role!r}")
    steps = []
    if ek.reductions:
        if ek.init_is_zero:
            steps.append(("memset", ws, 0))
        else:
            steps.append(("kernel", mod, f"{ek.name}_init", 1, 1, tuple(args)))
    grid = grid_for(n)
    for en in ek.entries:
        if en.role == "init":
            continue
        steps.append(("kernel", mod, en.name, *((1, 1) if en.launch == "single" else (grid, BLOCK)), tuple(args)))
    runtime.run_now(steps)
    return outs

