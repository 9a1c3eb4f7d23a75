"""Test doubles that ship with the package, for tests without the hardware: `fake_cuda` (a
recording stand-in for the CUDA graph builder and runtime, interpreted with NumPy), registered
as the 'fake-cuda' backend."""
from ..backends.registry import Backend, cuda_executable, register
from .fake_cuda import FakeRuntime

register(Backend("fake-cuda", cuda_executable, supports_record=True, supports_transforms=True, supports_growing_stacks=True,
                 array_types=("numpy",), runtime=FakeRuntime))
