"""The backend protocol: what a backend gives eagle_fx.Graph, and nothing more.

A backend LOWERS a Program, with the arrays it runs on, to an executable, once, when a graph is
built; the executable REPLAYS it with no re-tracing and no re-lowering:

    lower   registry.make(entry, program, input_arrays, keep, n, names, mesh, runtime)
              program        the staged Program (hawk_fx.core.Program)
              input_arrays   the arrays of program.inputs, in order: the caller's (used in place:
                             Mutable arguments and buffer= arrays are written back into them)
              keep           Vars whose arrays must survive a replay (results, buffer= planes, the
                             planes a user holds); every other value may share memory
              n              the graph's sample count
    replay(times=1)          run the Program `times` times, one after the other; returns when done
    rebind(index, array)     swap the array of input `index` (same shape, dtype and device) without
                             lowering again; the next replay reads and writes the new array
    array_of(var)            the array that holds `var` after a replay (a result, an argument, a
                             buffer), or None where the executable keeps no array for it; the same
                             array object at every replay (results are stable)
    backend_name             what repr(graph) shows: 'cpu', 'jax', 'cuda', 'fake-cuda'

Optional: `enqueue(times)` / `synchronize()` where replays run asynchronously (CUDA: on a stream);
`release(min_bytes)`, called when a cached transformed call returns (frontend/cache.py,
RELEASE_BYTES): drop working memory over min_bytes that the next replay allocates again.

The three backends implement it: numpy.py (NumpyExecutable), jax.py (JaxExecutable) and
cuda_graph.py (CudaExecutable); recording.py's RecordedExecutable (a record=True graph) too, and
tiered.py's TieredExecutable (backend="auto": a NumPy executable swapped for a JAX one between replays).
Each backend is an entry of registry.py, where its executables are made (`registry.make`);
select.py resolves a graph's arrays and `backend=` to an entry, and eagle_fx/backends/lowering.py's
`lower` is the one way a graph's closed Program becomes its executable.
"""
from __future__ import annotations

from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Executable(Protocol):
    backend_name: str

    def replay(self, times: int = 1) -> Any: ...

    def rebind(self, input_index: int, arr) -> Any: ...

    def array_of(self, var) -> Any: ...
