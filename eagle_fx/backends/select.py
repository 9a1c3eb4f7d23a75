"""Which backend runs a graph: by the arrays' type (NumPy -> numpy, jax.Array -> jax, CuPy -> cuda),
by `eagle_fx.Graph(backend=...)`, or by `use_backend(...)` around the build.

Every backend is the same small protocol (protocol.py): made from (Program, input arrays, kept
Vars, n), an executable has `replay(times)`, `rebind(input index, array)`, `array_of(var)` and
`backend_name`. numpy.py (NumpyExecutable), jax.py (JaxExecutable) and cuda_graph.py
(CudaExecutable) implement it.
"""
from __future__ import annotations

from hawk_fx.context import CONTEXT
from hawk_fx.cuda_runtime import is_device_array
from hawk_fx.emit.jax import is_jax_array

class use_backend:
    """`with use_backend("fake-cuda"):` graphs built inside run on that backend: 'numpy', 'cuda',
    'fake-cuda' (the recording fake: NumPy arrays stand for device memory, for tests without a
    GPU), or a runtime object (e.g. fake_cuda.FakeRuntime(node_updates="top")). None: by the
    arrays' type. eagle.Graph(backend=...) chooses for one graph."""

    def __init__(self, backend):
        self.backend = backend

    def __enter__(self):
        CONTEXT.backends.append(self.backend)
        return self

    def __exit__(self, *exc):
        CONTEXT.backends.pop()
        return False


def forced():
    """The backend `use_backend` asks for in this thread (None: chosen by the arrays). Part of
    every cached call's key."""
    return CONTEXT.innermost("backends")


def choose(arrays, requested=None):
    """The backend of a graph over `arrays` (its input arrays): 'numpy', 'jax', or a runtime for the CUDA
    graph backend (CoreRuntime for CuPy arrays: it refuses where there is no GPU; a FakeRuntime for
    'fake-cuda'). `requested`: eagle.Graph(backend=...), else use_backend's, else by the arrays:
    jax.Arrays -> 'jax', CuPy (or any __cuda_array_interface__) arrays -> 'cuda', otherwise 'numpy'."""
    if requested is None:
        requested = forced()
    on_gpu = [a for a in arrays if is_device_array(a)]
    if requested is None:
        requested = "jax" if any(is_jax_array(a) for a in arrays) else "cuda" if on_gpu else "numpy"
    if requested == "jax":
        if on_gpu:
            raise ValueError(f"eagle_fx: the jax backend was asked for, but the graph reads a "
                             f"{type(on_gpu[0]).__module__}.{type(on_gpu[0]).__name__}; pass NumPy arrays or jax.Arrays")
        return "jax"
    if any(is_jax_array(a) for a in arrays):
        raise ValueError(f"eagle_fx: backend {requested!r} was asked for, but the graph reads a jax.Array; pass "
                         "NumPy arrays (np.asarray) or drop backend= (jax.Arrays run on the jax backend)")
    if requested == "numpy":
        if on_gpu:
            a = on_gpu[0]
            raise ValueError(f"eagle_fx: the numpy backend was asked for, but the graph reads a "
                             f"{type(a).__module__}.{type(a).__name__}; pass NumPy arrays (cupy.asnumpy) or drop "
                             "backend='numpy'")
        return "numpy"
    if requested == "cuda":
        from .cuda_graph import CoreRuntime
        return CoreRuntime.get()
    if requested == "fake-cuda":
        from ..testing.fake_cuda import FakeRuntime
        requested = FakeRuntime()
    if not hasattr(requested, "builder"):
        raise ValueError(f"eagle_fx: unknown backend {requested!r}; 'numpy', 'jax', 'cuda' or 'fake-cuda'")
    if on_gpu and requested.name == "fake-cuda":
        raise ValueError("eagle_fx: the fake-cuda backend runs on NumPy arrays; the graph reads a device array")
    return requested

