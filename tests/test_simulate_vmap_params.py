"""vmap of a builder running `eagle_fx.simulate` whose only batched argument is a parameter the
step reads (the state is shared by the instances): each instance runs from the shared state with
its own parameter. Oracles: the masked NumPy loop of the same step per instance, a plain NumPy
loop of a Mutable Vector step, and central finite differences for vmap of grad."""
from __future__ import annotations

import numpy as np
import pytest

import eagle_fx as eagle
import hawk_fx as hawk
from eagle_fx import simulate
from eagle_fx.backends.select import use_backend
from hawk_fx import Int32, Mutable, Param, Scalar, Terminated, Vector
from test_simulate import fall_g, masked_fall


@hawk.kernel
def total(x: Scalar) -> Scalar:
    return hawk.sum(x)


@hawk.kernel
def combine(y: Scalar, v: Scalar, s: Int32) -> Scalar:
    return y * v + s


@eagle.Graph.builder
def landing(y0, v0, g):
    gr = eagle.Graph()
    r = simulate(lambda s, d: fall_g(s[0], s[1], d, g), (y0, v0), until=lambda s: s[0] < 0.0, max_steps=600)
    gr.result = combine(r.state[0], r.state[1], r.steps)
    return gr


@eagle.Graph.builder
def energy(y0, v0, g):
    gr = eagle.Graph()
    r = simulate(lambda s, d: fall_g(s[0], s[1], d, g), (y0, v0), until=lambda s: s[0] < 0.0, max_steps=600)
    gr.result = total(r.state[1] * r.state[1])
    return gr


def landing_oracle(y0, v0, g):
    y, v, steps, _ = masked_fall(y0, v0, g, max_steps=600)
    return y * v + steps


@pytest.mark.parametrize("backend, seed", [("numpy", 0), ("numpy", 1), ("numpy", 2), ("numpy", 3), ("jax", 4)])
def test_only_a_parameter_batched(backend, seed):
    rng = np.random.default_rng(seed)
    n, B = int(rng.integers(1, 7)), int(rng.integers(1, 5))
    y0, v0 = rng.uniform(0.3, 2.0, n), rng.uniform(-1.0, 1.0, n)
    G = rng.uniform(2.0, 20.0, (B, 1))
    before = (y0.copy(), v0.copy())
    with use_backend(backend):
        out = np.asarray(eagle.vmap(landing, in_axes=(None, None, 0))(y0, v0, G)())
    assert out.shape == (B, n)
    for b in range(B):
        np.testing.assert_allclose(out[b], landing_oracle(y0, v0, float(G[b, 0])), rtol=1e-13)
    np.testing.assert_array_equal(y0, before[0])            # the shared state is not written
    np.testing.assert_array_equal(v0, before[1])


def test_a_plain_function_calling_the_builder():
    y0, v0, G = np.linspace(0.4, 1.6, 4), np.linspace(-0.5, 0.5, 4), np.array([[9.81], [5.0], [20.0]])
    out = np.asarray(eagle.vmap(lambda y, v, g: landing(y, v, g), in_axes=(None, None, 0))(y0, v0, G))
    for b in range(3):
        np.testing.assert_allclose(out[b], landing_oracle(y0, v0, float(G[b, 0])), rtol=1e-13)


def test_vmap_of_grad_over_the_parameter():
    y0, v0, G = np.linspace(0.4, 1.6, 4), np.linspace(-0.5, 0.5, 4), np.array([[9.81], [4.0], [15.0]])
    dg = np.asarray(eagle.vmap(eagle.grad(energy, argnums=2), in_axes=(None, None, 0))(y0, v0, G))
    f = lambda g: float((masked_fall(y0, v0, g, max_steps=600)[1] ** 2).sum())   # noqa: E731
    h = 1e-6
    for b in range(3):
        g = float(G[b, 0])
        np.testing.assert_allclose(dg[b], [(f(g + h) - f(g - h)) / (2 * h)], rtol=1e-7)


@hawk.kernel
def turn(p: Mutable[Vector[2]], done: Terminated, w: Param):
    p = hawk.math.vec(p[0] - w * p[1], p[1] + w * p[0]) * 0.99


@eagle.Graph.builder
def spun(p0, w):
    gr = eagle.Graph()
    r = simulate(lambda s, d: turn(s, d, w), p0, max_steps=25, record=5)
    gr.result = r.trajectory
    return gr


def test_a_vector_state_recorded_with_a_batched_parameter():
    p0 = np.array([[1.0, 0.5, -0.3], [0.0, 0.2, 0.8]])
    W = np.array([[0.1], [0.3]])
    out = np.asarray(eagle.vmap(spun, in_axes=(None, 0))(p0, W)())
    assert out.shape == (2, 5, 2, 3)
    for b in range(2):
        p, rows = p0.copy(), []
        for k in range(1, 26):
            w = W[b, 0]
            p = np.array([p[0] - w * p[1], p[1] + w * p[0]]) * 0.99
            if k % 5 == 0:
                rows.append(p)
        np.testing.assert_allclose(out[b], np.array(rows), rtol=1e-13)
