"""Kernels and a block the generated builder programs of test_fuzz_builder.py call: smooth, and
bounded enough that loops of a few turns stay finite."""
import eagle_fx as eagle
import hawk_fx as hawk
from hawk_fx import Mutable, Scalar, UInt32
from hawk_fx import math as hm
from tour_kernels import accumulate, add, below, dbl, inc, over  # noqa: F401  (the programs import them from here)


@hawk.kernel
def half(x: Scalar) -> Scalar:
    return 0.5 * x + 1.0


@hawk.kernel
def wave(x: Scalar) -> Scalar:
    return hm.sin(x) * x + 0.25


@hawk.kernel
def soft(x: Scalar) -> Scalar:
    return x / (1.0 + x * x) - 0.5


@hawk.kernel
def mix(a: Scalar, b: Scalar) -> Scalar:
    return 0.5 * a - 0.25 * b + 0.1


@hawk.kernel
def total(x: Scalar) -> Scalar:
    return hawk.sum(x * x) * 0.1


@hawk.kernel
def count_up(x: Scalar, c: Mutable[UInt32]):
    c = hm.uint32(hawk.sum(x > 0.0))


@eagle.Graph.builder
def blk(g: eagle.Graph, v):
    return half(wave(v))
