"""Test doubles that ship with the package, for tests without the hardware: `fake_cuda` (a
recording stand-in for the CUDA graph builder and runtime, interpreted with NumPy)."""
