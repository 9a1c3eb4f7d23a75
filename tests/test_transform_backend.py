"""Where a transform's graph runs: `use_backend(X)` around a transformed call moves its graph to X
for every X (jax, auto, ...), also when the builder's own graph is pinned to NumPy; without
use_backend it runs on NumPy. Values are checked against plain NumPy (and finite differences for
the gradient)."""
import numpy as np
import pytest

jax = pytest.importorskip("jax")
jax.config.update("jax_enable_x64", True)

import eagle_fx  # noqa: E402
import hawk_fx as hawk  # noqa: E402
from eagle_fx.backends.select import use_backend  # noqa: E402
from hawk_fx import Scalar  # noqa: E402


@hawk.kernel
def shift_sq(x: Scalar) -> Scalar:
    return (x + 1.0) * (x + 1.0)


@hawk.kernel
def total(y: Scalar) -> Scalar:
    return hawk.sum(y)


@eagle_fx.Graph.builder
def pinned(x):
    g = eagle_fx.Graph(backend="numpy")          # the builder's own graph stays on NumPy
    g.result = shift_sq(x)
    return g


@eagle_fx.Graph.builder
def pinned_loss(x):
    g = eagle_fx.Graph(backend="numpy")
    g.result = total(shift_sq(x))
    return g


def _backend_of(graph):
    return repr(graph).rsplit(" ", 1)[-1].rstrip(">")


@pytest.mark.parametrize("backend, shown", [("jax", "jax"), ("auto", "auto/cpu"), (None, "cpu")])
def test_use_backend_moves_a_transforms_graph_whatever_the_builders_pin(backend, shown):
    xs = np.random.default_rng(1).uniform(-1, 1, (3, 5))
    with use_backend(backend):
        g = eagle_fx.vmap(pinned)(xs)                       # a graph-returning transform
        h = eagle_fx.make_graph(eagle_fx.grad(pinned_loss))(xs[0])
    assert _backend_of(g) == shown
    assert _backend_of(h) == shown
    np.testing.assert_allclose(np.asarray(g()), (xs + 1.0) ** 2, rtol=1e-14)
    np.testing.assert_allclose(np.asarray(h()), 2.0 * (xs[0] + 1.0), rtol=1e-14)


@pytest.mark.parametrize("seed", range(4))
def test_seeded_sweep_a_transformed_call_agrees_on_every_backend(seed):
    rng = np.random.default_rng(seed)
    x = rng.uniform(-2, 2, int(rng.integers(1, 9)))
    eps = 1e-6
    fd = np.array([((x + eps * e + 1.0) ** 2).sum() - ((x - eps * e + 1.0) ** 2).sum()
                   for e in np.eye(x.size)]) / (2 * eps)
    for backend in (None, "jax", "auto"):
        with use_backend(backend):
            got = eagle_fx.grad(pinned_loss)(x)
        np.testing.assert_allclose(got, 2.0 * (x + 1.0), rtol=1e-13)
        np.testing.assert_allclose(got, fd, rtol=1e-6, atol=1e-8)
