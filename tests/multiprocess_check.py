"""Run by test_multiprocess.py as 2 processes x 2 host devices under `python -m eagle_fx.launch`:
a mesh of 4 devices over two processes, each holding half the samples. Every result is checked,
shard by shard in every process, against the single-process run of the same graph on the NumPy
backend (each process knows all the samples) and against plain NumPy."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # this checkout's packages

from eagle_fx import launch  # noqa: E402

PID, NPROC = launch.initialize()

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec  # noqa: E402

import eagle_fx  # noqa: E402
from test_to_jax import ref_until, until  # noqa: E402
from test_graph_control import match_in_counted  # noqa: E402
from tour_kernels import cell  # noqa: E402

assert jax.process_count() == NPROC == 2 and jax.device_count() == 4 and jax.local_device_count() == 2
X = np.linspace(0.2, 1.4, 16)
HALF = len(X) // NPROC
MINE = slice(PID * HALF, (PID + 1) * HALF)


def meshes():
    yield "auto", Mesh(np.array(jax.devices()), ("s",))
    mesh = jax.make_mesh((4,), ("s",))            # Explicit axes: JAX's default for make_mesh
    assert jax.sharding.AxisType.Explicit in tuple(mesh.axis_types)
    yield "explicit", mesh


def global_array(mesh, full):
    """The global array of `full`'s samples built from this process's half."""
    return jax.make_array_from_process_local_data(NamedSharding(mesh, PartitionSpec("s")), full[MINE])


def replicated(mesh, value):
    return jax.make_array_from_process_local_data(NamedSharding(mesh, PartitionSpec()), value)


def check_shards(arr, want, rtol=1e-12):
    """Every shard this process holds equals the same part of the single-process `want`."""
    want = np.asarray(want)
    for shard in arr.addressable_shards:
        np.testing.assert_allclose(np.asarray(shard.data), want[shard.index], rtol=rtol)


@eagle_fx.Graph.builder
def grown(x, flag):
    g = eagle_fx.Graph()
    for _ in range(20):
        if not flag:                   # a sum over all samples: the same turn in every process
            break
        x = grow(x, 1.1)
        below(x, 3.0, flag)
    g.result = x
    return g


from tour_kernels import below, grow  # noqa: E402


def graphs_on_a_global_mesh(name, mesh):
    xs = global_array(mesh, X)
    want = until(X, cell(1))()                      # one process, NumPy backend
    g = until(xs, replicated(mesh, cell(1)))
    check_shards(g(), want)
    np.testing.assert_allclose(want[0], ref_until(X), rtol=1e-13)
    planes = grown(xs, replicated(mesh, cell(1)))
    out = planes()
    assert out.shape == X.shape and len(out.sharding.device_set) == 4, (name, out.sharding)
    check_shards(out, grown(X, cell(1))())
    check_shards(planes(2), grown(X, cell(1))(2))   # g(n): n replays
    m = match_in_counted(xs, replicated(mesh, cell(3)), replicated(mesh, cell(3)))   # a counted loop of matches
    check_shards(m(), match_in_counted(X, cell(3), cell(3))())
    X2 = X[::-1].copy() * 0.9                      # bind new process-local data: the same graph
    g.bind(x=global_array(mesh, X2), flag=replicated(mesh, cell(1)))
    check_shards(g(), until(X2, cell(1))())


def gradients_across_processes(name, mesh):
    f = eagle_fx.to_jax(until)
    xs = global_array(mesh, X)
    v, dx = jax.jit(jax.value_and_grad(lambda u: f(u, jnp.asarray(cell(1)))[0]))(xs)
    want_v, want_dx = eagle_fx.value_and_grad(until)(X, cell(1))
    check_shards(v, want_v[0] if np.ndim(v) == 0 else want_v)
    check_shards(dx, want_dx)
    assert len(dx.sharding.device_set) == 4, (name, dx.sharding)
    v2, dx2 = eagle_fx.value_and_grad(until)(xs, replicated(mesh, cell(1)))   # eagle_fx's own, on global arrays
    check_shards(v2, want_v)
    check_shards(dx2, want_dx)


def refused(call, *words):
    try:
        call()
    except ValueError as e:
        assert all(w in str(e) for w in words), e
    else:
        raise AssertionError(f"not refused: {words}")


def processes_that_disagree_are_refused_at_build(mesh):
    xs = global_array(mesh, X)
    other = replicated(mesh, cell(1 + PID))        # a guard cell with a value per process
    refused(lambda: until(xs, other), "argument 'flag' is replicated over the mesh but holds different values")
    short = jax.make_array_from_process_local_data(NamedSharding(mesh, PartitionSpec("s")),
                                                    X[MINE][:HALF - 2 * PID])     # 8 samples here, 6 there
    refused(lambda: until(short, replicated(mesh, cell(1))), "argument 'x' has global shape",
            "process-local data of the same shape")


for name, mesh in meshes():
    graphs_on_a_global_mesh(name, mesh)
    gradients_across_processes(name, mesh)
processes_that_disagree_are_refused_at_build(Mesh(np.array(jax.devices()), ("s",)))
print(f"multiprocess checks passed in process {PID}", flush=True)
