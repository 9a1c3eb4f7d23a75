"""The builder tour's kernels, shared by the tests (defined once, as the tour writes them)."""
import numpy as np

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


def cell(v):
    """A one-cell uint32 array: a device condition."""
    return np.array([v], dtype=np.uint32)
