"""Kernels and builders the tests share: the builder tour's kernels (as the tour writes them) and the derivative tests' loss."""
import numpy as np

import eagle_fx as eagle
import hawk_fx as hawk
from hawk_fx import Mutable, Param, Scalar, UInt32
from hawk_fx import math as hm


@hawk.kernel
def inc(x: Scalar) -> Scalar:
    return x + 1.0


@hawk.kernel
def dbl(x: Scalar) -> Scalar:
    return 2.0 * x


@hawk.kernel
def add(a: Scalar, b: Scalar) -> Scalar:
    return a + b


@hawk.kernel
def square(v: Scalar) -> Scalar:
    return v * v


@hawk.kernel
def affine(x: Scalar, a: Param, b: Param) -> Scalar:
    return a * x + b


@hawk.kernel
def below(s: Scalar, lim: Param, flag: Mutable[UInt32]):
    flag = hm.uint32(hawk.sum(s < lim))


@hawk.kernel
def over(s: Scalar, lim: Param, flag: Mutable[UInt32]):
    flag = hm.uint32(hawk.sum(s > lim))


@hawk.kernel
def accumulate(s: Scalar, y: Mutable[Scalar]):
    y = s + 1.0


# kernels of the derivative tests (test_functional_api.py, test_compose.py)
@hawk.kernel
def wobble(x: Scalar) -> Scalar:
    return hm.sin(x) * x


@hawk.kernel
def grow(x: Scalar, a: Param) -> Scalar:
    return a * x + 0.1 * hm.tanh(x)


@hawk.kernel
def total(x: Scalar) -> Scalar:
    return hawk.sum(x * x)


@eagle.Graph.builder
def loss(x, flag, n):
    """An optional wobble, n turns of grow, then sum(x * x)."""
    g = eagle.Graph()
    if flag:
        x = wobble(x)
    for i in range(n):
        x = grow(x, 1.1)
    g.result = total(x)
    return g


def cell(v):
    """A one-cell uint32 array: a device condition."""
    return np.array([v], dtype=np.uint32)
