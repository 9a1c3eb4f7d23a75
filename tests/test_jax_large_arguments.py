"""Large NumPy arguments reach XLA through aligned buffers of the executable's own (jax.py,
_aligned_inputs): every replay still reads the caller's array as it is now (written between
replays, rebound, strided), and written arguments are still written in place. Plain NumPy oracle."""
import numpy as np
import pytest

jax = pytest.importorskip("jax")
jax.config.update("jax_enable_x64", True)

import eagle_fx  # noqa: E402
import hawk_fx as hawk  # noqa: E402
from eagle_fx.backends.jax import ALIGNED_BYTES  # noqa: E402
from hawk_fx import Mutable, Scalar  # noqa: E402
from hawk_fx import math as hm  # noqa: E402


@hawk.kernel
def mix(x: Scalar, z: Scalar, y: Mutable[Scalar]) -> Scalar:
    y = y + x
    return hm.sin(x) * z


@eagle_fx.Graph.builder
def mixed(x, z, y):
    g = eagle_fx.Graph(backend="jax")
    g.result = mix(x, z, y)
    return g


def unaligned(a, shift):
    """A copy of `a` whose data starts `shift` bytes past a 64-byte boundary."""
    raw = np.empty(a.nbytes + 128, np.uint8)
    off = (-raw.ctypes.data % 64) + shift
    out = raw[off:off + a.nbytes].view(a.dtype).reshape(a.shape)
    out[...] = a
    return out


@pytest.mark.parametrize("shift", [0, 8, 16, 24])
def test_large_arguments_are_read_as_they_are_now_at_every_replay(shift):
    rng = np.random.default_rng(shift)
    n = 2 * ALIGNED_BYTES // 8
    x, z = unaligned(rng.uniform(-2, 2, n), shift), unaligned(rng.uniform(-2, 2, n), shift)
    y = np.zeros(n)
    g = mixed(x, z, y)
    acc = np.zeros(n)
    for turn in range(4):
        if turn == 1:
            x[:] = rng.uniform(-2, 2, n)           # written by the caller between replays
        if turn == 2:
            big = rng.uniform(-2, 2, 2 * n)
            g.bind(z=big[::2])                     # a strided view
            z = big[::2]
        if turn == 3:
            z = unaligned(rng.uniform(-2, 2, n), 40 - shift)
            g.bind(z=z)
        got = g()
        acc += x
        np.testing.assert_allclose(got, np.sin(x) * z, rtol=1e-14, atol=1e-300)
        np.testing.assert_array_equal(y, acc)      # the written argument, in place
    assert g._exe._any_staged and g._exe._staged[2] is None     # x and z staged; y (written) not
