"""Reverse mode through device loops: a regression test, and a fuzzer over random kernels in every
loop context.

Each fuzz case draws one or two kernels whose body is a random expression tree, written twice from
the one tree: as hawk code and as jax.numpy code. A builder calls them on the carries x, z and the
const y inside a loop context (counted, capped, uncapped, nested, an unrolled Python loop), and
the same control flow is written as a plain Python function over the jnp kernels: trip counts come
from cells and counter planes, never from x or y, so the oracle runs the same turns. Every case's
eagle.grad (wrt x and y; its Program checked: each Var defined before use) is compared with
jax.grad of the oracle, and the oracle with central differences of the builder's eager run
(eagle_fx.disable_staging); each case also checks one more of: checkpoints=K, vjp with a random
cotangent, record=True + eagle.diff.reverse, vmap(grad) over x and the trip count.
"""
from __future__ import annotations

import itertools
import linecache

import jax
import numpy as np
import pytest

import eagle_fx as eagle
import hawk_fx as hawk
from hawk_fx import Scalar
from hawk_fx import math as hm
from hawk_fx.core import check_program
from tour_kernels import below, cell, inc

jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402

N = 3                                   # samples per plane
RTOL = 1e-6


# -- the regression: a + exp(b) in a counted loop (issue 20, item 1) ---------------------------------

@hawk.kernel
def shift(a: Scalar, b: Scalar) -> Scalar:
    return a + hm.exp(b)


@hawk.kernel
def sum_sq(x: Scalar) -> Scalar:
    return hawk.sum(x * x)


@eagle.Graph.builder
def shifted(x, y, k, record=False):
    g = eagle.Graph(record=record)
    for _ in range(k):
        x = shift(x, y)
    g.result = sum_sq(x)
    return g


def test_reverse_through_a_loop_whose_kernel_backward_skips_an_input():
    """shift's plain vjp does not read `a`; inside a loop body it is given zeros for it, which
    used to be pruned before the plain vjp was swapped in (KeyError: Var(:f64[n]))."""
    x, y, k = np.array([0.1, -0.4, 0.7]), np.array([0.3, -0.2, 0.5]), 3
    end = x + k * np.exp(y)                      # sum(end**2): d/dx = 2 end, d/dy = 2 end k exp(y)
    dx, dy = 2 * end, 2 * end * k * np.exp(y)
    f = lambda x_, y_: shifted(x_, y_, cell(k))  # noqa: E731
    for ck in (None, 1, 2):
        gx, gy = eagle.grad(f, argnums=(0, 1), checkpoints=ck)(x, y)
        np.testing.assert_allclose(gx, dx, rtol=1e-12, err_msg=f"checkpoints={ck}")
        np.testing.assert_allclose(gy, dy, rtol=1e-12, err_msg=f"checkpoints={ck}")
        check_program(eagle.make_program(eagle.grad(f, argnums=(0, 1), checkpoints=ck))(x, y))
    _, pullback = eagle.vjp(f, x, y)
    gx, gy = pullback(np.array([0.5]))
    np.testing.assert_allclose(gx, 0.5 * dx, rtol=1e-12)
    np.testing.assert_allclose(gy, 0.5 * dy, rtol=1e-12)
    g = shifted(x.copy(), y.copy(), cell(k), record=True)
    g()
    r = eagle.diff.reverse(g.record, {"result": np.ones(1)}, wrt=("x", "y"))
    np.testing.assert_allclose(r["x"], dx, rtol=1e-12)
    np.testing.assert_allclose(r["y"], dy, rtol=1e-12)
