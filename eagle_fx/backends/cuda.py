"""The CUDA backend: with CuPy arrays, a staged Program runs as ONE CUDA graph with conditional nodes.

Its parts, one concern each:

    cuda_lower.py            Program -> CUDA graph nodes: memory plan, kernel bodies, IF-ELSE /
                             SWITCH / WHILE conditional nodes, fork branches, hazards (`lower`,
                             `CudaPlan`)
    cuda_graph.py            the graph-building protocol the lowering speaks, its implementation
                             over cuda.core (`CoreGraphBuilder`, `CoreRuntime`), and the
                             executable eagle_fx.Graph replays and binds (`CudaExecutable`)
    hawk_fx.cuda_runtime     the kernel-level runtime: kernel modules, NVRTC compilation, launches,
                             and `call_kernel` (a hawk kernel called eagerly on CuPy arrays);
                             `require_gpu`, the refusal where there is no GPU stack
    eagle_fx.testing.fake_cuda
                             the recording fake of the builder and runtime (the "fake-cuda"
                             backend), how all of the above is tested without a GPU
    registry.py              the registered backends ('cuda', and 'fake-cuda' from eagle_fx.testing)
                             and what each supports (a capability an entry lacks is refused there)
    select.py                which backend a graph runs on (`choose`, `use_backend`)

This module gathers their public names. `require_gpu()` is raised when a graph over CuPy arrays is
built or a kernel is called on them where there is no GPU stack, never at import.
"""
from __future__ import annotations

from hawk_fx.cuda_runtime import (BLOCK, INSTALL_HINT, MAX_GRID, MIN_DRIVER, GpuUnavailableError,  # noqa: F401
                                  KernelModule, KernelRuntime, body_module, call_kernel, is_device_array,
                                  require_gpu)

from .cuda_graph import CoreGraphBuilder, CoreRuntime, CudaExecutable  # noqa: F401
from .cuda_lower import GUARDS, LOWERING, CudaPlan, PlanNode, lower  # noqa: F401
from .select import choose, use_backend  # noqa: F401
