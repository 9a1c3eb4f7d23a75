"""What staging NumPy inside a builder costs at replay, against writing the same work by hand.

    python bench/bench_views.py            # n = 1e3 and n = 1e6
    python bench/bench_views.py --quick    # fewer repeats

1. `total(x[1:-1:2])`: a staged strided view (one slice copy, then the kernel), against the same
   kernel on a contiguous array holding those samples (what a builder got before, minus
   correctness: the view was baked in).
2. `dbl(np.sin(x) * 2.0 + 1.0)`: staged ufuncs and operators (generated kernels, fused by the
   NumPy backend), against one hand-written kernel computing the same.
Every figure is a ratio of medians of timeit repeats, interleaved, in one process.
"""
import sys

import numpy as np

import eagle_fx as eagle
import hawk_fx as hawk
import hawk_fx.math as hm
from hawk_fx import Scalar
from timing import median_ratio

QUICK = "--quick" in sys.argv
REPEAT = 5 if QUICK else 15


@hawk.kernel
def total(x: Scalar):
    return hawk.sum(x * x)


@hawk.kernel
def dbl(x: Scalar):
    return 2.0 * x


@hawk.kernel
def by_hand(x: Scalar):
    return 2.0 * (hm.sin(x) * 2.0 + 1.0)


@eagle.Graph.builder
def viewed(x):
    g = eagle.Graph()
    g.result = total(x[1:-1:2])
    return g


@eagle.Graph.builder
def whole(x):
    g = eagle.Graph()
    g.result = total(x)
    return g


@eagle.Graph.builder
def staged_math(x):
    g = eagle.Graph()
    g.result = dbl(np.sin(x) * 2.0 + 1.0)
    return g


@eagle.Graph.builder
def hand_math(x):
    g = eagle.Graph()
    g.result = by_hand(x)
    return g


def main():
    for n in (1_000, 1_000_000):
        x = np.linspace(-1.0, 1.0, n)
        number = 2000 if n < 1e4 else 20
        gv, gw = viewed(x), whole(np.ascontiguousarray(x[1:-1:2]))
        np.testing.assert_allclose(gv(), gw(), rtol=1e-12)
        gs, gh = staged_math(x), hand_math(x)
        np.testing.assert_allclose(gs(), gh(), rtol=1e-12)
        views = median_ratio(gv.launch, gw.launch, number, REPEAT)
        math = median_ratio(gs.launch, gh.launch, number, REPEAT)
        print(f"n = {n:>9}: strided view / contiguous input  {views:5.2f}   staged ufuncs / one hand kernel  {math:5.2f}")


if __name__ == "__main__":
    main()
