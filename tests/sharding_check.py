"""Run by test_jax_sharding.py in a fresh process with 4 simulated CPU devices
(XLA_FLAGS=--xla_force_host_platform_device_count=4): the sample axis split over a Mesh, results
against the single-device run and plain Python, outputs sharded over all 4 devices."""
import os
import sys

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # this checkout's packages

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec  # noqa: E402

import eagle_fx  # noqa: E402
from test_to_jax import ref_until, until  # noqa: E402
from tour_kernels import accumulate, below, cell, grow, total  # noqa: E402

assert len(jax.devices()) == 4, jax.devices()
MESH = Mesh(np.array(jax.devices()), ("samples",))
SPLIT, REPL = NamedSharding(MESH, PartitionSpec("samples")), NamedSharding(MESH, PartitionSpec())
X = np.linspace(0.2, 1.4, 16)


@eagle_fx.Graph.builder
def until_on_mesh(x, flag, y):
    g = eagle_fx.Graph(backend="jax", mesh=MESH)
    for _ in range(20):
        if not flag:                 # the guard: a sample reduction, a collective across devices
            break
        x = grow(x, 1.1)
        below(x, 3.0, flag)
    accumulate(x, y)                 # y = x + 1, written into the caller's array
    g.result = (x, total(x))
    return g


def on_four(arr):
    return len(arr.sharding.device_set) == 4


def numpy_arguments_with_a_mesh():
    y = np.zeros(16)
    g = until_on_mesh(X, cell(1), y)
    x_out, s = g()
    ref = until(X, cell(1))()                    # the same graph, one device (numpy backend)
    np.testing.assert_allclose(s, ref, rtol=1e-13)
    np.testing.assert_allclose(s[0], ref_until(X), rtol=1e-13)
    np.testing.assert_allclose(y, x_out + 1.0, rtol=1e-13)
    out = g._exe.compile().output_shardings[0]   # the plane result leaves the executable split over 4
    assert out.spec == PartitionSpec("samples") and len(out.device_set) == 4, out


def sharded_jax_arguments():
    xs = jax.device_put(X, SPLIT)
    g = until(xs, jax.device_put(cell(1), REPL))
    s = g()
    np.testing.assert_allclose(s, until(X, cell(1))(), rtol=1e-13)
    assert g.argument("x").sharding == SPLIT     # the argument keeps its sharding

    @eagle_fx.Graph.builder
    def planes(x, flag):
        g = eagle_fx.Graph()
        for _ in range(20):
            if not flag:
                break
            x = grow(x, 1.1)
            below(x, 3.0, flag)
        g.result = x
        return g
    out = planes(xs, jax.device_put(cell(1), REPL))()
    assert on_four(out) and out.sharding.spec == PartitionSpec("samples"), out.sharding
    np.testing.assert_allclose(out, planes(X, cell(1))(), rtol=1e-13)
    try:
        other = Mesh(np.array(jax.devices()[:2]), ("other",))
        planes(xs, jax.device_put(cell(1), NamedSharding(other, PartitionSpec())))
    except ValueError as e:
        assert "argument 'x' and argument 'flag' are sharded over different meshes" in str(e), e
    else:
        raise AssertionError("two meshes were not refused")
    on_other = NamedSharding(other, PartitionSpec("other"))
    y = jax.device_put(np.zeros(16), on_other)
    try:                                         # jax.Arrays on one mesh, the graph's mesh= another
        until_on_mesh(jax.device_put(X, on_other), jnp.asarray(cell(1)), y)
    except ValueError as e:
        assert "argument 'x' is sharded over another mesh than the graph's mesh=" in str(e), e
    else:
        raise AssertionError("a jax.Array on another mesh than mesh= was not refused")
    np.testing.assert_array_equal(y, np.zeros(16))


def an_uncommitted_cell_follows_the_sharded_plane():
    """jnp.asarray(flag) is uncommitted (on one device): it follows the sharded x, as jax.jit's
    arguments do, at the build and at bind (it failed inside lowering: 'incompatible devices')."""
    xs = jax.device_put(X, SPLIT)
    want = until(X, cell(1))()
    g = until(xs, jnp.asarray(cell(1)))
    np.testing.assert_allclose(g(), want, rtol=1e-13)
    np.testing.assert_allclose(jax.jit(lambda a, f: a * f[0])(xs, jnp.asarray(cell(2))), 2 * X)   # the oracle's rule
    g.bind(flag=jnp.asarray(cell(1)))
    np.testing.assert_allclose(g(), want, rtol=1e-13)


def to_jax_grad_on_the_mesh():
    f = eagle_fx.to_jax(until)
    xs = jax.device_put(X, SPLIT)
    g = jax.jit(jax.grad(lambda u: f(u, jnp.asarray(cell(1)))[0]))(xs)
    assert on_four(g), g.sharding
    np.testing.assert_allclose(g, eagle_fx.grad(until)(X, cell(1)), rtol=1e-12)


def on_an_explicit_mesh():
    """jax.make_mesh's axes are Explicit by default: the reverse pass's stack of saved turns is
    written with the sharding of the values it saves (it raised ShardingTypeError)."""
    mesh = jax.make_mesh((4,), ("s",))
    assert jax.sharding.AxisType.Explicit in tuple(mesh.axis_types)
    split = NamedSharding(mesh, PartitionSpec("s"))
    f = eagle_fx.to_jax(until)
    xs = jax.device_put(X, split)
    v, g = jax.jit(jax.value_and_grad(lambda u: f(u, jnp.asarray(cell(1)))[0]))(xs)
    assert on_four(g), g.sharding
    np.testing.assert_allclose(v, until(X, cell(1))()[0], rtol=1e-12)
    np.testing.assert_allclose(g, eagle_fx.grad(until)(X, cell(1)), rtol=1e-12)
    out = until(xs, jax.device_put(cell(1), NamedSharding(mesh, PartitionSpec())))()
    np.testing.assert_allclose(out, until(X, cell(1))(), rtol=1e-13)


def a_mesh_that_does_not_divide_n():
    y = np.zeros(6)
    try:
        until_on_mesh(np.linspace(0.2, 1.4, 6), cell(1), y)
    except ValueError as e:
        assert "argument 'x' has 6 samples, which 4 devices of the mesh do not divide" in str(e), e
        assert not y.any()
    else:
        raise AssertionError("n = 6 on 4 devices was not refused")


if __name__ == "__main__":
    numpy_arguments_with_a_mesh()
    sharded_jax_arguments()
    an_uncommitted_cell_follows_the_sharded_plane()
    to_jax_grad_on_the_mesh()
    on_an_explicit_mesh()
    a_mesh_that_does_not_divide_n()
    print("sharding checks passed")
