"""The benchmark workloads, shared by every script under bench/ (run them as `python bench/<name>.py`).

W-chain: 10 x (dbl, inc). W-loop: a 50-turn capped loop whose guard kernel never clears, so every
turn runs. W-fork: three branches of four kernels. W-trans: two transcendental kernels. L-chain and L-loop:
W-chain and a 50-turn sin(x) * x loop, then sum(x * x) (losses for the gradient benchmarks).
"""
import eagle_fx as eagle
import hawk_fx as hawk
from hawk_fx import Mutable, Param, Scalar, UInt32
from hawk_fx import math as hm


@hawk.kernel
def dbl(x: Scalar) -> Scalar:
    return 2.0 * x


@hawk.kernel
def inc(x: Scalar) -> Scalar:
    return x + 1.0


@hawk.kernel
def halve(x: Scalar) -> Scalar:
    return 0.5 * x + 1.0


@hawk.kernel
def below(s: Scalar, lim: Param, flag: Mutable[UInt32]):
    flag = hm.uint32(hawk.sum(s < lim))


@hawk.kernel
def k1(x: Scalar) -> Scalar:
    return hm.sin(x) * x


@hawk.kernel
def k2(x: Scalar) -> Scalar:
    return hm.exp(-x * x)


@eagle.Graph.builder
def w_chain(x, record=False):
    g = eagle.Graph(record=record)
    for _ in range(10):
        x = inc(dbl(x))
    g.result = x
    return g


@eagle.Graph.builder
def w_loop(x, flag, record=False):
    g = eagle.Graph(record=record)
    for _ in range(50):
        if not flag:
            break
        x = halve(x)
        below(x, 1e9, flag)          # never clears: all 50 turns run
    g.result = x
    return g


@eagle.Graph.builder
def w_loop_to(x, flag, lim):
    """The capped loop doubling x until it reaches lim (a per-instance trip count under vmap)."""
    g = eagle.Graph()
    for _ in range(50):
        if not flag:
            break
        x = dbl(x)
        below(x, lim, flag)
    g.result = x
    return g


@eagle.Graph.builder
def w_fork(x):
    g = eagle.Graph()
    with g.parallel() as p:
        with p.branch():
            a = inc(dbl(inc(dbl(x))))
        with p.branch():
            b = dbl(inc(dbl(inc(x))))
        with p.branch():
            c = halve(halve(halve(halve(x))))
    g.result = (a, b, c)
    return g


@eagle.Graph.builder
def w_trans(x, record=False):
    g = eagle.Graph(record=record)
    g.result = k2(k1(x))
    return g


@hawk.kernel
def sumsq(y: Scalar) -> Scalar:
    return hawk.sum(y * y)


@eagle.Graph.builder
def l_chain(x, record=False):
    g = eagle.Graph(record=record)
    for _ in range(10):
        x = inc(dbl(x))
    g.result = sumsq(x)
    return g


@eagle.Graph.builder
def l_loop(x, flag, record=False):
    g = eagle.Graph(record=record)
    for _ in range(50):
        if not flag:
            break
        x = k1(x)
        below(x, 1e9, flag)          # never clears: all 50 turns run
    g.result = sumsq(x)
    return g
