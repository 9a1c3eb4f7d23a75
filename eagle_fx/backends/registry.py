"""The backends a graph may run on, one registered entry each, and the one place executables are made.

An entry names its backend, makes its executable (`make`: the protocol of protocol.py) and says
what it can do. What a graph asks of a backend it lacks (record=True, a transform's graph) is
refused by `refuse`, here, with the message of that capability:

    supports_record          record=True graphs (the forward half of a vjp, its stacks of turns)
    supports_transforms      graphs made by vmap, grad, jvp and vjp
    supports_growing_stacks  stacks of saved loop turns that grow with the turns run (checkpoints=)
    array_types              what its arguments may be ('numpy', 'jax', 'device': CuPy and any
                             __cuda_array_interface__ array)
    host_results             its planes are NumPy arrays a block called from plain code can pin

numpy, jax, cuda and auto (tiered.py: NumPy first, XLA once hot) register below; eagle_fx.testing registers 'fake-cuda'. select.py resolves
a graph's arrays and `backend=` / `use_backend` to an entry (and, for a CUDA graph, its runtime).
"""
from __future__ import annotations

from .cuda_graph import CoreRuntime, CudaExecutable
from .jax import JaxExecutable
from .numpy import NumpyExecutable


class Backend:
    """One backend: its name, how its executable is made, what it can do."""

    def __init__(self, name, make, *, supports_record=False, supports_transforms=False,
                 supports_growing_stacks=False, array_types=("numpy",), host_results=False, runtime=None):
        self.name, self.make = name, make
        self.supports_record, self.supports_transforms = supports_record, supports_transforms
        self.supports_growing_stacks, self.array_types = supports_growing_stacks, tuple(array_types)
        self.host_results = host_results
        self.runtime = runtime         # a CUDA backend's runtime: made when the entry is first lowered to

    def __repr__(self):
        return f"<eagle_fx backend {self.name!r}>"


BACKENDS: dict = {}            # name -> Backend


def register(backend: Backend) -> Backend:
    BACKENDS[backend.name] = backend
    return backend


def get(name) -> Backend:
    """The entry named `name` (KeyError naming the registered ones otherwise)."""
    if name in BACKENDS:
        return BACKENDS[name]
    raise KeyError(f"eagle_fx: no backend {name!r} is registered; the registered ones: {', '.join(BACKENDS)}")


def make(backend: Backend, program, arrays, keep, n, names=None, mesh=None, runtime=None):
    """The executable of `program` over `arrays` on `backend`: every executable is made here."""
    from ..custom import inline_custom          # custom rules are the transforms': backends run the body
    program = inline_custom(program)
    return backend.make(program, arrays, keep, n, names=names, mesh=mesh, runtime=runtime)


def _record_refusal(backend=""):
    return (f"eagle.Graph: record=True graphs (for eagle_fx.diff) do not run on the {backend} backend: it has no "
            "lowering for the reverse pass's primitives (the stacks of saved loop turns, cotangent sums); build "
            "the recorded graph on NumPy arrays, or drop record=True")


def _transforms_refusal(name="", type_name="", backend=""):
    return (f"eagle_fx transforms: graphs made by vmap, grad, jvp and vjp run on the NumPy backend; argument "
            f"{name} is {type_name}: pass NumPy arrays (cupy.asnumpy) to the transformed function")


_REFUSALS = {"supports_record": _record_refusal, "supports_transforms": _transforms_refusal}


def refuse(backend: Backend, capability: str, **detail):
    """Raise NotImplementedError where `backend` lacks `capability` (what the message says to change)."""
    if not getattr(backend, capability):
        raise NotImplementedError(_REFUSALS[capability](**{"backend": backend.name, **detail}))


def _numpy(program, arrays, keep, n, **_):
    return NumpyExecutable(program, arrays, keep, n)


def _jax(program, arrays, keep, n, names=None, mesh=None, **_):
    return JaxExecutable(program, arrays, keep, n, names, mesh)


def cuda_executable(program, arrays, keep, n, names=None, runtime=None, **_):
    return CudaExecutable(program, arrays, keep, n, runtime=runtime, names=names)


register(Backend("numpy", _numpy, supports_record=True, supports_transforms=True, supports_growing_stacks=True,
                 array_types=("numpy",), host_results=True))
register(Backend("jax", _jax, supports_record=True, supports_transforms=True, array_types=("numpy", "jax")))
register(Backend("cuda", cuda_executable, supports_record=True, supports_growing_stacks=True, array_types=("device",),
                 runtime=CoreRuntime.get))


def _auto(program, arrays, keep, n, names=None, **_):
    from .tiered import TieredExecutable
    return TieredExecutable(program, arrays, keep, n, names)


# record=True graphs run on its NumPy half (lowering.py): their stacks of saved turns grow there
register(Backend("auto", _auto, supports_record=True, supports_transforms=True, supports_growing_stacks=True,
                 array_types=("numpy",), host_results=True))
