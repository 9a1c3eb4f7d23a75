"""Which backend runs a graph: by the arrays' type (NumPy -> numpy, jax.Array -> jax, CuPy -> cuda),
by `eagle_fx.Graph(backend=...)`, or by `use_backend(...)` around the build.

Every backend is the same small protocol (protocol.py) and one entry of registry.py; `resolve`
turns what was asked into that entry (and, for a CUDA graph, the runtime it runs on).
"""
from __future__ import annotations

from hawk_fx.context import CONTEXT
from hawk_fx.cuda_runtime import is_device_array
from hawk_fx.emit.jax import is_jax_array

from . import registry


class use_backend:
    """`with use_backend("fake-cuda"):` graphs built inside run on that backend: 'numpy', 'auto', 'cuda',
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


def resolve_entry(requested):
    """The registry entry and runtime object of a backend asked for by name or by runtime."""
    if isinstance(requested, str):
        if requested == "fake-cuda" and requested not in registry.BACKENDS:
            from ..testing import fake_cuda  # noqa: F401  (lazy: registers the test double when first asked for)
        if requested in registry.BACKENDS:
            return registry.BACKENDS[requested], None
    elif hasattr(requested, "builder") and getattr(requested, "name", None) in registry.BACKENDS:
        return registry.BACKENDS[requested.name], requested
    raise ValueError(f"eagle_fx: unknown backend {requested!r}; {', '.join(map(repr, registry.BACKENDS))} or "
                     "'fake-cuda'")


def _type_name(a):
    return f"{type(a).__module__}.{type(a).__name__}"


_NOT_ON_DEVICE = {   # entry name -> what it says of a device array among its arguments
    "jax": lambda a: (f"eagle_fx: the jax backend was asked for, but the graph reads a {_type_name(a)}; pass NumPy "
                      "arrays or jax.Arrays"),
    "numpy": lambda a: (f"eagle_fx: the numpy backend was asked for, but the graph reads a {_type_name(a)}; pass "
                        "NumPy arrays (cupy.asnumpy) or drop backend='numpy'"),
    "auto": lambda a: (f"eagle_fx: the auto backend (NumPy, then XLA) was asked for, but the graph reads a "
                       f"{_type_name(a)}; pass NumPy arrays (cupy.asnumpy) or drop backend='auto'"),
}


def resolve(arrays, requested=None):
    """(registry entry, runtime or None) of a graph over `arrays` (its input arrays). `requested`:
    eagle.Graph(backend=...), else use_backend's, else by the arrays: jax.Arrays -> 'jax', CuPy
    (or any __cuda_array_interface__) arrays -> 'cuda', otherwise 'numpy'. A CUDA entry's runtime
    is made here (CoreRuntime refuses where there is no GPU; a FakeRuntime for 'fake-cuda')."""
    if requested is None:
        requested = forced()
    on_gpu = [a for a in arrays if is_device_array(a)]
    if requested is None:
        requested = "jax" if any(is_jax_array(a) for a in arrays) else "cuda" if on_gpu else "numpy"
    entry, runtime = resolve_entry(requested)
    takes = entry.array_types
    if "jax" not in takes and any(is_jax_array(a) for a in arrays):
        raise ValueError(f"eagle_fx: backend {requested!r} was asked for, but the graph reads a jax.Array; pass "
                         "NumPy arrays (np.asarray) or drop backend= (jax.Arrays run on the jax backend)")
    if on_gpu and "device" not in takes:
        say = _NOT_ON_DEVICE.get(entry.name)
        raise ValueError(say(on_gpu[0]) if say is not None else
                         f"eagle_fx: the {entry.name} backend runs on NumPy arrays; the graph reads a device array")
    if runtime is None and entry.runtime is not None:
        runtime = entry.runtime()
    return entry, runtime


def choose(arrays, requested=None):
    """The backend of a graph over `arrays`: 'numpy', 'jax', or the runtime of a CUDA graph (see `resolve`)."""
    entry, runtime = resolve(arrays, requested)
    return runtime if runtime is not None else entry.name


def by_array(a):
    """The entry that runs graphs over arrays of a's type, chosen by the type alone."""
    return registry.BACKENDS["jax" if is_jax_array(a) else "cuda" if is_device_array(a) else "numpy"]
