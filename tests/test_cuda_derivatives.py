"""Derivative programs on the CUDA backend, checked on the fake device (eagle_fx.testing.fake_cuda)
and compiled with NVRTC.

The NumPy backend's derivative suites (record=True with eagle_fx.diff.reverse, grad, vjp, jvp,
jacfwd/jacrev, value_and_grad, checkpoints=) run again here with every graph built under
`use_backend("fake-cuda")`: their oracles (finite differences, JAX, the NumPy backend's own runs)
then check the CUDA lowering's values. A representative subset runs by default, every test under
`-m slow`. The vmap and Jacobian suites run so too (batched calls, masked arms and loops, stacks
per instance). A test whose arguments are not C-contiguous views is an expected failure (xfail):
the CUDA backend takes C-contiguous arrays only.
"""
from __future__ import annotations

import contextlib
import functools
import importlib

import numpy as np
import pytest

import eagle_fx as eagle
import eagle_fx.backends.cuda_graph as cuda_graph
from eagle_fx.backends import cuda_lower
from eagle_fx.backends.select import use_backend

# the suites run again, and the tests of each that run by default (the rest: -m slow)
SUITES = {
    "test_grad_graph": ("test_chain", "test_tour_whole_gradient_through_its_loop", "test_cond_elif_else_each_arm",
                        "test_match_each_case_on_one_recorded_graph", "test_counted_loop_reads_its_trip_count_per_replay",
                        "test_mid_body_break", "test_counted_loop_nested_in_a_capped_loop",
                        "test_mutable_argument_written_in_place_by_a_loop", "test_forks_with_waits_and_a_result_tree"),
    "test_one_reverse_mode": ("test_reverse_of_a_record_equals_vjp_and_finite_differences",
                              "test_counted_loop_gradient_for_more_turns_than_at_build",
                              "test_gradients_of_a_record_that_writes_the_callers_arrays"),
    "test_checkpointing": ("test_checkpointed_gradients_equal_stored_ones",
                           "test_a_checkpointed_record_reverses_as_the_stored_one", "test_value_and_grad_with_checkpoints"),
    "test_compose": ("test_jvp_of_grad_is_a_hessian_vector_product", "test_second_derivative",
                     "test_jacobian_through_a_cond", "test_grad_and_hvp_through_a_switch_with_a_param",
                     "test_grad_and_jvp_through_loops_in_loops_with_a_cond_and_a_mutable",
                     "test_grad_graph_replay_follows_its_cells_and_more_turns_than_at_build"),
    "test_grad_loops_fuzz": ("test_reverse_through_a_loop_whose_kernel_backward_skips_an_input",
                             "test_a_constant_kernel_as_a_loop_carry"),
    "test_vmap": ("test_refusals", "test_capped_loop_with_per_instance_guards_runs_until_all_are_done",
                  "test_cond_elif_else_shared_and_per_instance", "test_match_on_per_instance_cells",
                  "test_mid_body_break_and_mutable_written_per_instance"),
    "test_vmap_plain": ("test_vmap_of_grad_with_a_batched_argument_made_in_python_that_is_not_differentiated",
                        "test_nested_vmap_writes_the_mutable_back_or_refuses_a_copy"),
    "test_vmap_trip_count": ("test_the_audit_repro_the_batched_loop_reads_its_trip_count_once",),
    "test_jacobians_trees": ("test_hessian_of_a_dict_argument_matches_jax", "test_a_transformed_graph_binds_a_dict_argument"),
}
# about the NumPy backend's own mechanics (host memory of its growing stacks): the CUDA backend's
# device memory is checked by test_checkpointed_device_memory_is_k_states_not_t below
NOT_RERUN = {"test_checkpointing": {"test_checkpointed_memory_is_k_states_not_t",
                                    "test_twenty_thousand_turns_with_32_states_peak_under_24_mb"},
             "test_one_reverse_mode": {"test_under_vmap_the_saved_turns_follow_the_longest_instance"}}


def _on_fake(fn):
    @functools.wraps(fn)
    def run(*args, **kwargs):
        if any(isinstance(v, str) and v == "jax" for v in kwargs.values()):
            pytest.skip("the JAX backend's case of a test parametrised over backends")
        with use_backend("fake-cuda"):
            try:
                return fn(*args, **kwargs)
            except ValueError as exc:
                if "is not C-contiguous" in str(exc):
                    pytest.xfail(f"the CUDA backend takes C-contiguous arrays only: {exc}")
                raise
    return run


def _rerun(name, default):
    mod = importlib.import_module(name)
    for attr, obj in vars(mod).items():
        if getattr(obj, "_pytestfixturefunction", None) is not None or type(obj).__name__ == "FixtureFunctionDefinition":
            globals().setdefault(attr, obj)            # the suite's own fixtures (records_on)
    for attr, fn in list(vars(mod).items()):
        if not attr.startswith("test_") or not callable(fn) or attr in NOT_RERUN.get(name, ()):
            continue
        if getattr(fn, "__module__", None) != name:
            continue                                   # imported from another suite: run there
        test = _on_fake(fn)
        if attr not in default:
            test = pytest.mark.slow(test)
        globals()[f"test_{name[5:]}__{attr[5:]}"] = test


for _name, _default in SUITES.items():
    _rerun(_name, _default)


# ---------------------------------------------------------------------------------------------
# the CUDA lowering's own mechanics: stacks that grow between runs, checkpoint memory, NVRTC

from test_checkpointing import long_loop  # noqa: E402
from test_one_reverse_mode import jax_grad, numpy_turns, settle_counted, settle_uncapped  # noqa: E402
import tour_builders  # noqa: E402
import tour_kernels  # noqa: E402
from tour_kernels import cell  # noqa: E402


def _device_bytes(g):
    return sum(a.nbytes for a in g._exe._memory)


def test_a_stack_of_no_known_bound_grows_between_runs_and_the_values_are_rerun():
    x = np.linspace(1.0, 2.0, 16)
    turns = numpy_turns(x)
    assert turns > cuda_lower.STACK_TURNS // 2
    with use_backend("fake-cuda"), pytest.warns(Warning):
        g = eagle.grad(settle_uncapped).graph(x, cell(1))
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(cuda_lower, "STACK_TURNS", 4)        # the first run has room for 4 turns only
            mp.setattr(cuda_graph, "STACK_TURNS", 4)
            g = eagle.grad(settle_uncapped).graph(x, cell(1))
            got = g()
    assert isinstance(g._exe, cuda_graph.CudaExecutable)
    assert g._exe.stack_turns >= turns and g._exe.plan.stack_turns == g._exe.stack_turns
    assert int(g._exe.plan.overflow[0]) == 0
    np.testing.assert_allclose(got, jax_grad(x, turns), rtol=1e-12)


def test_a_counted_loop_runs_more_turns_than_its_stacks_held_at_build():
    x = np.linspace(0.1, 1.0, 7)
    n = cell(3)
    with use_backend("fake-cuda"):
        g = eagle.grad(settle_counted).graph(x, n)
        for turns in (3, 200, 1, 0):
            n[0] = turns
            np.testing.assert_allclose(g(), jax_grad(x, turns), rtol=1e-12, err_msg=f"{turns} turns")
    assert g._exe.stack_turns >= 200


def test_checkpointed_device_memory_is_k_states_not_t():
    n, T, K = 1000, 2000, 8
    x = np.linspace(0.1, 3.0, n)
    with use_backend("fake-cuda"):
        g = eagle.grad(long_loop, checkpoints=K).graph(x, cell(T))
        got = g()
        stored = eagle.grad(long_loop).graph(x, cell(T))
        want = stored()
    assert isinstance(g._exe, cuda_graph.CudaExecutable)
    assert _device_bytes(g) < (K + 32) * n * 8, _device_bytes(g)          # the kept states and a few planes
    assert _device_bytes(stored) > T * n * 8                               # the stored reverse holds every turn
    np.testing.assert_allclose(got, want, rtol=1e-13)
    assert any(nd.entry == "eagle_revolve_step" for nd in g._exe.plan.nodes("kernel"))


def test_every_source_the_derivative_rules_emit_compiles(nvrtc):
    """NVRTC compiles every module of derivative graphs (stacks, sums, turn counters, revolve), and
    the lowering's module holds every new entry."""
    x = np.linspace(0.1, 1.0, 5)
    with use_backend("fake-cuda"), pytest.warns(Warning):
        graphs = [eagle.grad(settle_counted).graph(x, cell(3)), eagle.grad(settle_counted, checkpoints=2).graph(x, cell(3)),
                  eagle.grad(settle_uncapped).graph(x, cell(1))]
        rec = tour_builders.model(x.copy(), np.zeros(5), record=True)
        rec()
        eagle.diff.reverse(rec.record, {"result": np.ones(5)}, wrt=("x",))
    plans = [g._exe.plan for g in graphs] + [rec._exe.exe.plan, rec._exe.h._bw.plan]
    entries, modules = set(), {}
    for plan in plans:
        modules.update(plan.modules)
        entries |= {nd.entry for nd in plan.nodes("kernel")}
    for entry in ("eagle_stack_push", "eagle_stack_read", "eagle_cell_inc", "eagle_cell_rev", "eagle_add_float64",
                  "eagle_revolve_step"):
        assert entry in entries and entry in cuda_lower.LOWERING.entries, entry
    for name, cubin in {name: m for name, m in modules.items()}.items():
        assert len(cuda_lower.hcuda.compile_cubin(cubin.source, "sm_90")) > 0, name


def test_a_record_whose_stacks_grew_reverses_again():
    """The backward reads the forward's stacks where they lie; a run that grew them binds stacks of
    more rows, and the backward is lowered again for them."""
    from test_grad_graph import counted
    x = np.array([0.3, -0.7, 1.1])
    for turns in (4, 150, 2):
        want = eagle.diff.reverse(_ran(counted(x.copy(), cell(turns), record=True)).record, {"result": 1.0 + 0 * x},
                                  wrt=("x",))
        if turns == 4:
            with use_backend("fake-cuda"):
                n = cell(4)
                g = counted(x.copy(), n, record=True)
        n[0] = turns
        g()
        got = eagle.diff.reverse(g.record, {"result": 1.0 + 0 * x}, wrt=("x",))
        np.testing.assert_allclose(got["x"], want["x"], rtol=1e-13, err_msg=f"{turns} turns")
    assert g._exe.exe.stack_turns >= 150 and type(g._exe.exe).__name__ == "CudaExecutable"


def _ran(g):
    g()
    return g


@pytest.mark.parametrize("order", ["lifo", 7])
@pytest.mark.parametrize("form", ["nested loops", "everything", "break mid-body", "switch"])
def test_records_in_an_adversarial_node_order_equal_numpy(form, order):
    """The fake runs nodes in any order the edges allow: a missing edge in a derivative rule shows."""
    from eagle_fx.testing.fake_cuda import FakeRuntime
    from test_one_reverse_mode import CASES, _seed_like
    builder, args, wrt = CASES[form]
    grads = []
    for backend in ("numpy", FakeRuntime(order=order)):
        with use_backend(backend):
            g = builder(**{k: v.copy() for k, v in args.items()}, record=True)
            out = g()
        seed = _seed_like(out, np.random.default_rng(5))
        grads.append(eagle.diff.reverse(g.record, {"result": seed}, wrt=tuple(wrt)))
    assert "fake-cuda" in repr(g)
    for w in wrt:
        np.testing.assert_allclose(grads[1][w], grads[0][w], rtol=1e-13, atol=1e-15, err_msg=w)


def test_a_graph_that_writes_its_arguments_is_not_rerun_when_its_stacks_overflow(monkeypatch):
    """A run that overflowed is repeated only where repeating it changes nothing the caller holds;
    elsewhere it is refused (never read), and the next launch has the room."""
    x = np.linspace(0.1, 1.0, 7)
    monkeypatch.setattr(cuda_graph, "STACK_TURNS", 4)
    monkeypatch.setattr(cuda_graph, "_writes_inputs", lambda prog: True)
    with use_backend("fake-cuda"):
        n = cell(3)
        g = eagle.grad(settle_counted).graph(x, n)
        n[0] = 100                                     # more turns than its stacks hold
        with pytest.raises(RuntimeError, match="writes its arguments in place.*launch it again"):
            g()
        np.testing.assert_allclose(g(), jax_grad(x, 100), rtol=1e-12)
    assert g._exe.stack_turns >= 100


# ---------------------------------------------------------------------------------------------
# vmap'd graphs: batched calls (a launch per instance), masked arms and loops, stacks per instance

VMAP_ENTRIES = ("eagle_cells", "eagle_cells_max", "eagle_masked_copy", "eagle_masked_loop", "eagle_stack_gather")


def _vmap_graphs():
    """name -> a function building one vmap'd graph (every masked form and a stack per instance)."""
    from test_vmap import branchy, capped, chooser, counted
    B = 3
    xs = np.random.default_rng(0).random((B, 5)) + 0.5
    trips = np.array([[0], [3], [7]], np.uint32)
    return {
        "masked loop": lambda: eagle.vmap(capped)(xs.copy(), np.ones((B, 1), np.uint32), np.array([1.0, 10.0, 3.0])),
        "masked if": lambda: eagle.vmap(branchy)(xs.copy(), np.array([[1], [0], [0]], np.uint32),
                                                 np.array([[0], [1], [0]], np.uint32)),
        "masked match": lambda: eagle.vmap(chooser)(xs.copy(), np.array([[0], [2], [5]], np.uint32)),
        "trip counts": lambda: eagle.vmap(counted)(xs.copy(), trips.copy()),
        "grad per instance": lambda: eagle.vmap(eagle.grad(settle_uncapped), in_axes=(0, 0)).graph(
            xs.copy() * 20, np.ones((B, 1), np.uint32)),
        "checkpointed": lambda: eagle.vmap(eagle.grad(long_loop, checkpoints=2), in_axes=(0, 0)).graph(
            xs.copy(), trips.copy()),
    }


def _leaves(tree):
    return [tree[k] for k in sorted(tree)] if isinstance(tree, dict) else [tree]


@pytest.mark.parametrize("order", ["creation", "lifo", 7])
def test_vmapd_graphs_in_any_node_order_equal_numpy(order):
    """The fake runs nodes in any order the edges allow: a missing edge in a vmap rule shows."""
    from eagle_fx.testing.fake_cuda import FakeRuntime
    for name, make in _vmap_graphs().items():
        outs = []
        for backend in ("numpy", FakeRuntime(order=order)):
            with use_backend(backend), pytest.warns() if "grad" in name else contextlib.nullcontext():
                outs.append(_leaves(make()()))
        for got, want in zip(outs[1], outs[0]):
            np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-15, err_msg=name)


@eagle.Graph.builder
def _doubled_sum(x, y):
    g = eagle.Graph()
    g.result = tour_kernels.add(tour_kernels.dbl(x), y)
    return g


def test_a_vmapd_graph_bound_to_new_arrays_reads_them():
    """A batched call's launches read views of the batched arguments: a bind lowers again."""
    xs, y = np.linspace(0.5, 1.5, 15).reshape(3, 5), np.linspace(-1.0, 1.0, 5)
    with use_backend("fake-cuda"):
        g = eagle.vmap(_doubled_sum, in_axes=(0, None))(xs.copy(), y.copy())
        g()
        g.bind(x=3 * xs)
        got = g()
    assert g._exe.last_bind == "graph"
    np.testing.assert_allclose(got, 6 * xs + y, rtol=1e-14)


def test_every_source_the_vmap_rules_emit_compiles(nvrtc):
    """NVRTC compiles every module of vmap'd graphs, which use every new entry of the lowering."""
    entries, modules = set(), {}
    with pytest.warns():
        for make in _vmap_graphs().values():
            with use_backend("fake-cuda"):
                plan = make()._exe.plan
            modules.update(plan.modules)
            entries |= {nd.entry for nd in plan.nodes("kernel")}
    for entry in VMAP_ENTRIES:
        assert entry in entries and entry in cuda_lower.LOWERING.entries, entry
    for name, m in modules.items():
        assert len(cuda_lower.hcuda.compile_cubin(m.source, "sm_90")) > 0, name
