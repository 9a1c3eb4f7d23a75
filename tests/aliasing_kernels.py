"""Kernels and views the aliasing tests share (test_aliasing.py on the NumPy/JAX paths,
test_cuda_aliasing.py on the CUDA lowering): an input that overlaps a Mutable output. Each test
keeps its own NumPy oracle."""
import eagle_fx
import hawk_fx as hawk
from hawk_fx import Mutable, Param, Scalar


@hawk.kernel
def smooth(s: Scalar, y: Mutable[Scalar]):
    y = 0.5 * s + 0.5 * y


@hawk.kernel
def scale(a: Param, y: Mutable[Scalar]):
    y = y * a + 1.0


@eagle_fx.Graph.builder
def smooth_graph(s, y):
    g = eagle_fx.Graph()
    smooth(s, y)
    return g


def views(buf, shift):
    """(s, y): s reads `shift` samples behind y (ahead when negative), both views of buf."""
    m = len(buf) - abs(shift)
    if shift >= 0:
        return buf[:m], buf[shift:shift + m]
    return buf[-shift:-shift + m], buf[:m]
