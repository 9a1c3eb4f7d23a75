"""A recorded graph runs wherever its forward runs: on the JAX backend (NumPy arrays with
`eagle.Graph(record=True, backend="jax")`) its record reverses to the NumPy backend's gradients,
and it replays with g(n), launch and bind as any graph. On the CUDA backend (the fake device here)
both halves are CUDA graphs, and its gradients are the NumPy backend's too."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import eagle_fx as eagle
import eagle_fx.graph as graph_module
from eagle_fx.backends.jax_lower import LoweringError
from test_grad_graph import fd_grads, forks, keep
from test_one_reverse_mode import CASES, _seed_like, _writes_args, creep, settle_counted, writes
from tour_kernels import below, cell, total

jax = pytest.importorskip("jax")
jax.config.update("jax_enable_x64", True)


@pytest.fixture
def records_on(monkeypatch):
    """records_on(backend): the builders' record=True graphs are built with that backend= (they
    take record= only)."""
    init = graph_module.Graph.__init__

    def on(backend):
        def patched(self, record=False, backend_=None, mesh=None, checkpoints=None, **kw):
            init(self, record=record, backend=backend if record else kw.get("backend", backend_), mesh=mesh,
                 checkpoints=checkpoints)
        monkeypatch.setattr(graph_module.Graph, "__init__", patched)
    return on


def _gradients(builder, args, wrt, seed):
    g = builder(**{k: v.copy() for k, v in args.items()}, record=True)
    out = g()
    seed = seed if seed is not None else _seed_like(out, np.random.default_rng(3))
    return g, out, seed, eagle.diff.reverse(g.record, {"result": seed}, wrt=tuple(wrt))


CASES_ALL = dict(CASES, **{"tree result": (forks, {"x": np.array([0.3, -0.7, 1.1])}, ["x"])})


@pytest.mark.parametrize("form", list(CASES_ALL))
def test_a_record_on_jax_reverses_to_the_numpy_gradients(form, records_on):
    builder, args, wrt = CASES_ALL[form]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        g_np, out_np, seed, want = _gradients(builder, args, wrt, None)
        assert g_np._exe.backend == "numpy"
        records_on("jax")
        g_jx, out_jx, _, got = _gradients(builder, args, wrt, seed)
    assert g_jx._exe.backend == "jax" and "jax" in repr(g_jx)
    for a, b in zip(jax.tree_util.tree_leaves(out_jx), jax.tree_util.tree_leaves(out_np)):
        np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-15)
    for w in wrt:
        scale = max(1.0, float(np.max(np.abs(want[w]))))
        np.testing.assert_allclose(got[w], want[w], rtol=1e-12, atol=1e-12 * scale, err_msg=f"{form}: d/d{w}")


@pytest.mark.parametrize("backend", ["numpy", "jax"])
def test_a_record_replays_with_n_launch_and_bind(backend, records_on):
    """g(3), launch() and bind() on a recorded graph: the caller's arrays as the plain NumPy graph
    leaves them, and the gradients of the last run against central differences of the plain graph
    on the arrays that run started from."""
    records_on(backend)
    same = np.testing.assert_array_equal if backend == "numpy" else \
        lambda x, y, err_msg="": np.testing.assert_allclose(x, y, rtol=1e-14, atol=1e-15, err_msg=err_msg)
    a, b = _writes_args(), _writes_args()
    plain, rec = writes(**a), writes(**b, record=True)
    assert rec.build()._exe.backend == backend
    same(rec(3), plain(3))
    for k in a:
        same(b[k], a[k], err_msg=k)
    a2, b2 = _writes_args(), _writes_args()
    for d in (a2, b2):
        d["x"] *= 1.5
        d["y"] -= 0.2
    entry = {k: v.copy() for k, v in b2.items()}
    plain.bind(**a2).launch()
    rec.bind(**b2).launch()
    for k in a2:
        same(b2[k], a2[k], err_msg=f"after bind: {k}")
    seeds = {"result": np.array([0.3, -1.0, 2.0]), "y": np.array([1.0, 0.5, -0.25])}
    got = eagle.diff.reverse(rec.record, seeds, wrt=("x", "y"))
    fd = fd_grads(writes, entry, seeds, ["x", "y"])
    for w in ("x", "y"):
        np.testing.assert_allclose(got[w], fd[w], rtol=1e-6, atol=1e-7, err_msg=f"d/d{w}")


@eagle.Graph.builder
def counted_rec(x, n, record=False):
    g = eagle.Graph(record=record)
    for _ in range(n):
        x = creep(x)
    g.result = total(x)
    return g


def test_a_record_on_jax_sizes_its_stack_by_the_trip_count_at_build(records_on):
    """XLA's stacks have static sizes: a counted loop's holds the trip count at build; fewer turns
    reverse exactly, more are refused at the replay, naming the argument."""
    x, n = np.linspace(0.1, 1.0, 5), cell(4)
    records_on("jax")
    g = counted_rec(x, n, record=True)
    for turns in (4, 2):
        n[0] = turns
        g()
        got = eagle.diff.reverse(g.record, {"result": np.array([1.0])}, wrt="x")["x"]
        np.testing.assert_allclose(got, eagle.grad(settle_counted)(x, cell(turns)), rtol=1e-12)
    n[0] = 9
    with pytest.raises(RuntimeError, match="asks for 9 turns .*'n'.*holds 4"):
        g()


@eagle.Graph.builder
def settle_rec(x, flag, record=False):
    g = eagle.Graph(record=record, checkpoints=2 if record else None)
    for _ in range(50):
        if not flag: break
        x = creep(x)
        below(x, 100.0, flag)
    g.result = x
    return g


def test_jax_refuses_a_checkpointed_record_at_build(records_on):
    records_on("jax")
    with pytest.raises(LoweringError, match="checkpointed .*NumPy backend"):
        settle_rec(np.linspace(1.0, 2.0, 4), cell(1), record=True).build()


def test_jax_refuses_a_record_on_jax_arrays():
    jnp = jax.numpy
    with pytest.raises(NotImplementedError, match="record=True.*NumPy arrays"):
        keep(jnp.asarray([0.3, -0.7, 1.1, 0.4]), record=True).build()


@pytest.mark.parametrize("form", list(CASES_ALL))
def test_a_record_on_the_fake_cuda_device_reverses_to_the_numpy_gradients(form, records_on):
    """Both halves of the record lower to CUDA graphs (run here on the fake device)."""
    builder, args, wrt = CASES_ALL[form]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        g_np, out_np, seed, want = _gradients(builder, args, wrt, None)
        records_on("fake-cuda")
        g_cu, out_cu, _, got = _gradients(builder, args, wrt, seed)
    assert g_cu._exe.backend_name == "fake-cuda" and repr(g_cu).endswith("fake-cuda>")
    assert type(g_cu._exe.exe).__name__ == "CudaExecutable"
    for a, b in zip(jax.tree_util.tree_leaves(out_cu), jax.tree_util.tree_leaves(out_np)):
        np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-15)
    for w in wrt:
        np.testing.assert_allclose(got[w], want[w], rtol=1e-12, atol=1e-14)


def test_forward_mode_and_a_kept_record_on_jax_equal_numpy(records_on):
    """diff.forward of a JAX record, and diff.reverse of a record kept with copy() across a launch
    on other arrays: the NumPy backend's values."""
    tangents = {"x": np.ones(3), "y": np.array([1.0, 0.0, 2.0])}
    out = {}
    for backend in ("numpy", "jax"):
        records_on(backend)
        g = writes(**_writes_args(), record=True)
        g()
        fwd = eagle.diff.forward(g.record, tangents, of=("result", "y"))
        kept = g.record.copy()
        other = _writes_args()
        other["x"] += 1.0
        g.bind(**other)
        g()
        out[backend] = (fwd, eagle.diff.reverse(kept, {"result": np.ones(3)}, wrt="x")["x"])
    (f_np, r_np), (f_jx, r_jx) = out["numpy"], out["jax"]
    for k in ("result", "y"):
        np.testing.assert_allclose(f_jx[k], f_np[k], rtol=1e-13, err_msg=k)
    np.testing.assert_allclose(r_jx, r_np, rtol=1e-13)
