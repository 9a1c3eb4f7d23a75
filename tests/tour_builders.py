"""The builder tour's builders (eagle_fx/tour.py), as the tour writes them, for the tests that run,
lower, draw or differentiate every builder form. They are test inputs: each test keeps its own oracle.

The tour itself is a script that prints as it goes, so the tests cannot import it; a change to a
form there is made here too.
"""
import numpy as np

import eagle_fx as eagle
import hawk_fx as hawk
from hawk_fx import Mutable, Scalar, UInt32
from tour_kernels import accumulate, add, affine, below, dbl, inc, over, square


# sections 1 to 8: one builder per form

@eagle.Graph.builder
def twice(g: eagle.Graph, v):
    return dbl(dbl(v))


@eagle.Graph.builder
def first(x):
    g = eagle.Graph()
    g.result = twice(g, inc(x))
    return g


@eagle.Graph.builder
def forks(x):
    g = eagle.Graph()
    a = dbl(x)
    with g.parallel() as p:
        with p.branch() as b:
            l = inc(a)
            l2 = dbl(l)
            with b.parallel() as q:
                with q.branch() as b1:
                    u = inc(l2)
                with q.branch() as b2:
                    v = dbl(l2)
        with p.branch() as w:
            w.wait(l)
            r = add(l, a)
    g.result = (u, v, r)
    return g


@eagle.Graph.builder
def choose(x, flag, which, debug):
    g = eagle.Graph()
    if flag:
        x = dbl(x)
    elif which:
        x = inc(x)
    else:
        x = add(x, x)
    if debug:
        x = inc(x)
    for k in (inc, dbl):
        x = k(x)
    g.result = x
    return g


@eagle.Graph.builder
def capped(x, flag):
    g = eagle.Graph()
    for _ in range(50):
        if not flag: break
        x = dbl(x)
        below(x, 100.0, flag)
    g.result = x
    return g


@eagle.Graph.builder
def counted(x, n):
    g = eagle.Graph()
    for i in range(n):
        x = inc(x)
    g.result = x
    return g


@eagle.Graph.builder
def early_exit(x, flag, done):
    g = eagle.Graph()
    while flag:
        x = inc(x)
        over(x, 2.5, done)
        if done: break
        x = dbl(x)
        below(x, 50.0, flag)
    g.result = x
    return g


@eagle.Graph.builder
def skipping(x, flag, skip):
    g = eagle.Graph()
    while flag:
        x = inc(x)
        below(x, 6.0, flag)
        over(x, 2.5, skip)
        if skip: continue
        x = dbl(x)
    g.result = x
    return g


@eagle.Graph.builder
def chooser(x, sel):
    g = eagle.Graph()
    match sel:
        case 0:
            x = dbl(x)
        case 2:
            x = inc(x)
        case _:
            x = square(x)
    g.result = x
    return g


@eagle.Graph.builder
def keep(x):
    g = eagle.Graph()
    mine = np.zeros(4)
    a = inc(x, buffer=True)
    b = dbl(a, buffer=mine)
    g.result = {"a": a, "pair": (b, [square(b)])}
    return g


@eagle.Graph.builder
def void(x, y):
    g = eagle.Graph()
    accumulate(x, y)
    return g


@eagle.Graph.builder
def model(x, y, record=False):
    g = eagle.Graph(record=record)
    a = affine(x, 2.0, 1.0, buffer=True)
    accumulate(a, y)
    g.result = square(a)
    return g


# section 10, "one graph with everything": its own kernels; the tour's `accumulate` and `twice` of
# that section are accumulate3 and twice2 here, so that they do not shadow the ones above

@hawk.kernel
def seed(x: Scalar) -> Scalar: return 0.5 * x
@hawk.kernel
def left(a: Scalar) -> Scalar: return a + 1.0
@hawk.kernel
def right(l: Scalar) -> Scalar: return l - 1.0
@hawk.kernel
def polish(v: Scalar) -> Scalar: return 2.0 * v
@hawk.kernel
def tweak(v: Scalar) -> Scalar: return v * v
@hawk.kernel
def merge(s: Scalar, t: Scalar) -> Scalar: return s - t
@hawk.kernel
def remaining(s: Scalar, flag: Mutable[UInt32]):
    flag = hawk.math.uint32(hawk.sum(s > 1.0))
@hawk.kernel
def accumulate3(s: Scalar, r: Scalar, r2: Scalar, y: Mutable[Scalar]):
    y = s + r + r2


@eagle.Graph.builder
def twice2(g: eagle.Graph, v):
    return tweak(tweak(v))


@eagle.Graph.builder
def settle(g: eagle.Graph, s, l, flag):
    for _ in range(50):
        if not flag: break
        s = merge(s, twice2(g, l))
        remaining(s, flag)
    return s


@eagle.Graph.builder
def whole(x, flag, y, record=False) -> eagle.Graph:
    g = eagle.Graph(record=record)
    a = seed(x)
    with g.parallel() as p:
        with p.branch() as b:
            l = left(a)
            l2 = polish(l)
        with p.branch() as w:
            w.wait(l)
            r = right(l)
        with p.branch() as c:
            r2 = twice2(c, a)
    s = settle(g, x, l2, flag)
    accumulate3(s, r, r2, y)
    g.result = s
    return g
