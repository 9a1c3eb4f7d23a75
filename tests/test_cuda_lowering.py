"""The CUDA graph lowering (eagle_fx.backends.cuda_lower) against the recording fake (fake_cuda): for the
builder tour's graphs, the node tree has the shape CUDA conditional nodes need, and the fake's
interpretation of it equals the NumPy backend's result, for several cell values and node orders.
No GPU is needed; the NVRTC checks skip without NVRTC (as in test_cuda_emit)."""
from __future__ import annotations

import re
import sys
import types
import warnings

import numpy as np
import pytest

import eagle_fx as eagle
import hawk_fx as hawk
from eagle_fx.backends import cuda
from eagle_fx.backends.cuda_graph import _PlannedMemory
from hawk_fx.cuda_runtime import core_arg
from eagle_fx.testing.fake_cuda import FakeBuilder, FakeCudaError
from eagle_fx.backends.numpy import NumpyExecutable
from eagle_fx.graph import opaque
from hawk_fx import Mutable, Param, Scalar, UInt32
from hawk_fx import math as hm
from hawk_fx.emit import cuda as hcuda
from conftest import stand_in_module
from tour_kernels import add, cell, dbl, inc, square
from tour_builders import (capped, choose, chooser, counted, early_exit, first, forks, polish, skipping, twice,
                           void, whole)

ORDERS = ("creation", "lifo", 7)


# ---------------------------------------------------------------------------------------------
# the tour's builders (tour_builders), and a few more

@hawk.kernel
def peak_below(s: Scalar, lim: Param, flag: Mutable[UInt32]):     # a max: its workspace starts at -inf
    flag = hm.uint32(hawk.max(s) < lim)

@eagle.Graph.builder
def keep(x, mine):                         # the tour's keep, `mine` passed in: the test finds it
    g = eagle.Graph()
    a = inc(x, buffer=True)
    b = dbl(a, buffer=mine)
    g.result = {"a": a, "pair": (b, [square(b)])}
    return g

@eagle.Graph.builder
def peaked(x, flag):
    g = eagle.Graph()
    for _ in range(20):
        if not flag: break
        x = inc(x)
        peak_below(x, 6.0, flag)
    g.result = x
    return g

@eagle.Graph.builder
def turns(x, n):
    g = eagle.Graph()
    for i in range(n):                     # the body reads its turn counter
        x = add(x, i)
    g.result = x
    return g


# ---------------------------------------------------------------------------------------------
# the harness: the NumPy backend against the fake's interpretation of the lowered plan

class Run:
    def __init__(self, g, plan, fake, ref, ref_inputs, fake_inputs):
        self.g, self.plan, self.fake, self.ref = g, plan, fake, ref
        self.ref_inputs, self.fake_inputs = ref_inputs, fake_inputs


def run_both(g, times=1, orders=ORDERS, copy_inputs=True) -> Run:
    """Lower g's Program into a fresh fake per order, interpret it `times` times, and compare every
    result, kept buffer and written input with a fresh NumPy executable replayed as often."""
    t, prog = g._trace, g._exe.prog
    arrays = [e.array for e in t.input_planes]
    initial = [a.copy() for a in arrays]
    keep = {h.var for h in list(t.handles) + t.buffers if h.var is not None}
    n = t.n or 1

    def inputs():
        if copy_inputs:
            return [a.copy() for a in initial]
        for a, a0 in zip(arrays, initial):
            np.copyto(a, a0)
        return arrays

    ref_in = inputs()
    ref = NumpyExecutable(prog, ref_in, keep, n)
    ref.replay(times)
    want = {v: np.array(ref.array_of(v)) for v in list(keep) + [o for o in prog.outputs if hasattr(o, "aval")]
            if ref.array_of(v) is not None}
    want_in = [np.array(a) for a in ref_in]
    run = None
    for order in orders:
        fake_in = inputs()
        fake = FakeBuilder()
        plan = cuda.lower(prog, fake_in, keep, n, fake)
        fake.validate()
        fake.launch(times, order=order)
        for v, arr in want.items():
            np.testing.assert_array_equal(plan.array_of(v), arr, err_msg=f"order {order}: {v}")
        for a, b in zip(fake_in, want_in):
            np.testing.assert_array_equal(a, b, err_msg=f"order {order}: an input array")
        run = Run(g, plan, fake, ref, ref_in, fake_in)
    return run


def kinds(tree):
    return [nd.kind for nd in tree]


def body_kernels(tree):
    return [nd.label for nd in tree if nd.kind == "kernel" and nd.role == "body"]


def ancestors(node) -> set:
    seen, stack = set(), list(node.after)
    while stack:
        a = stack.pop()
        if id(a) not in seen:
            seen.add(id(a))
            stack.extend(a.after)
    return seen


def hawk_nodes(plan, label, tree=None):
    return [nd for _, nd in plan.walk(tree) if nd.kind == "kernel" and nd.role == "body" and nd.label == label]


# ---------------------------------------------------------------------------------------------
# structure and results, builder by builder

def test_first_is_one_chain_of_hash_named_kernels():
    run = run_both(first(np.arange(4.0)), times=2)
    plan = run.plan
    assert kinds(plan.tree) == ["kernel"] * 3 and body_kernels(plan.tree) == ["inc", "dbl", "dbl"]
    k0, k1, k2 = plan.tree
    assert k0.after == () and k1.after == (k0,) and k2.after == (k1,) and plan.end is k2
    assert all(re.fullmatch(r"hawk_[0-9a-f]{16}", nd.module.name) for nd in plan.tree)
    assert k1.module is k2.module and k0.module is not k1.module     # one module per body+dtypes
    assert k2.grid == 1 and k2.block == cuda.BLOCK
    np.testing.assert_array_equal(plan.array_of(run.g._exe.prog.outputs[0]), [4.0, 8.0, 12.0, 16.0])


def test_module_names_follow_body_and_dtypes():
    a = cuda.body_module(dbl.specialize(dbl.layout_of([np.zeros(4)])[0]))
    b = cuda.body_module(dbl.specialize(dbl.layout_of([np.zeros(4, np.float32)])[0]))
    c = cuda.body_module(polish.specialize(polish.layout_of([np.zeros(4)])[0]))     # the same body as dbl
    assert a.name != b.name and a.name == c.name and a.label == "dbl" and c.label == "polish"


def test_opaque_is_a_host_node_before_the_block():
    src, dst = np.arange(4.0), np.zeros(4)
    h = eagle.Graph()
    h.add_node(opaque(lambda: np.add(src, 1.0, out=dst), reads={"x": src}, writes={"y": dst}), name="shift")
    z = twice(h, dst)
    h.build()
    run = run_both(h, copy_inputs=False)
    plan = run.plan
    assert kinds(plan.tree) == ["host", "kernel", "kernel"] and plan.tree[0].label == "shift"
    assert plan.tree[1].after == (plan.tree[0],)
    plane = h._trace.pinned[id(z)][1]          # z is an array; the plane it stands for is the block's result
    np.testing.assert_array_equal(plan.array_of(plane.var), [4.0, 8.0, 12.0, 16.0])


def test_opaque_inside_a_device_if_is_refused():
    a = np.zeros(4)

    @eagle.Graph.builder
    def bad(x, flag):
        g = eagle.Graph()
        if flag:
            g.add_node(opaque(lambda: None, reads={"x": a}, writes={}), name="peek")
            x = inc(x)
        g.result = x
        return g

    g = bad(np.zeros(4), cell(1))
    with pytest.raises(NotImplementedError, match="conditional bodies cannot hold host nodes"):
        cuda.lower(g._exe.prog, [p.array for p in g._trace.input_planes], set(), 4, FakeBuilder())


def test_forks_are_independent_chains_joined_at_the_end():
    run = run_both(forks(np.arange(4.0)), orders=ORDERS + (1, 2, 3))
    plan = run.plan
    (a,) = hawk_nodes(plan, "add")
    l_node, u_node = hawk_nodes(plan, "inc")
    dbls = hawk_nodes(plan, "dbl")
    first_dbl, l2_node, v_node = dbls
    assert id(l_node) in ancestors(l2_node)
    assert u_node.after == (l2_node,) and v_node.after == (l2_node,)          # the inner fork
    assert id(u_node) not in ancestors(v_node) and id(v_node) not in ancestors(u_node)
    assert a.after == (l_node,)                                                # w.wait(l): after `l` only
    assert a.handle.after == (l_node.handle,)                                  # as the fake recorded it
    assert id(l2_node) not in ancestors(a)
    assert plan.end.kind == "join" and set(map(id, plan.end.after)) == {id(u_node), id(v_node), id(a)}
    u, v, r = (plan.array_of(o) for o in run.g._exe.prog.outputs)
    np.testing.assert_array_equal(u, [3.0, 7.0, 11.0, 15.0])
    np.testing.assert_array_equal(r, [1.0, 5.0, 9.0, 13.0])


@pytest.mark.parametrize("flag,which", [(0, 0), (0, 1), (1, 0), (1, 1)])
def test_choose_nests_if_else_for_the_elif(flag, which):
    run = run_both(choose(np.arange(4.0), cell(flag), cell(which), True), times=2)
    plan = run.plan
    assert kinds(plan.tree) == ["kernel", "if_else", "kernel", "kernel", "kernel"]
    guard, outer = plan.tree[:2]
    assert guard.role == "guard" and guard.entry == "set_cond_from_cell" and guard.cond is outer.cond
    assert outer.after == (guard,)
    then, else_ = outer.bodies
    assert body_kernels(then) == ["dbl"]
    assert kinds(else_) == ["kernel", "if_else"] and else_[0].cond is else_[1].cond is not outer.cond
    inner_then, inner_else = else_[1].bodies
    assert body_kernels(inner_then) == ["inc"] and body_kernels(inner_else) == ["add"]
    assert body_kernels(plan.tree[2:]) == ["inc", "inc", "dbl"]          # debug, then the unrolled for


@pytest.mark.parametrize("start,flag", [(1.0, 1), (1.0, 0), (30.0, 1), (200.0, 1)])
def test_capped_is_one_while_ending_with_its_guard(start, flag):
    run = run_both(capped(np.full(4, start), cell(flag)), times=2)
    plan = run.plan
    (loop,) = plan.nodes("while")
    assert loop in plan.tree
    (body,) = loop.bodies
    guard = body[-1]
    assert guard.kind == "kernel" and guard.role == "guard" and guard.cond is loop.cond
    assert guard.entry == "eagle_loop_step"                         # the cell and the cap
    assert {id(nd) for nd in body[:-1]} <= ancestors(guard)         # after every other node of the body
    before = plan.tree[plan.tree.index(loop) - 1]
    assert before.role == "guard" and before.entry == "eagle_loop_start" and before.cond is loop.cond
    assert loop.after == (before,)
    cap_cell = before.args[2]
    assert cap_cell.dtype == np.uint32 and int(cap_cell[0]) == 50
    assert before.args[3] is run.fake_inputs[1]                      # the guard reads the caller's cell
    assert body_kernels(body) == ["dbl", "below", "below"]           # below: map entry, then _finish
    ws_init = [nd for nd in body if nd.kind == "memset"]
    assert len(ws_init) == 1 and ws_init[0].label == "below workspace"   # initialised before the reduction
    # the fake recorded the same: its WHILE node's condition is set before it and at the end of its body
    fw = next(nd for nd in run.fake.nodes if nd.kind == "while")
    assert loop.handle is fw and fw.after[0].sets is fw.cond and fw.bodies[0].nodes[-1].sets is fw.cond


@pytest.mark.parametrize("trips", [0, 1, 3])
def test_counted_uses_the_trip_cell(trips):
    run = run_both(counted(np.zeros(4), cell(trips)), times=2)
    plan = run.plan
    (loop,) = plan.nodes("while")
    start = plan.tree[plan.tree.index(loop) - 1]
    step = loop.bodies[0][-1]
    assert (start.entry, step.entry) == ("count_start", "count_step") and start.module is cuda.GUARDS
    assert start.args[2] is run.fake_inputs[1] and step.args[2] is run.fake_inputs[1]
    assert step.args[1] is start.args[1]                              # one turn counter
    np.testing.assert_array_equal(plan.array_of(run.g._exe.prog.outputs[0]), np.full(4, float(trips)))


@pytest.mark.parametrize("trips", [0, 2, 5])
def test_a_body_reading_its_turn_counter(trips):
    run = run_both(turns(np.zeros(4), cell(trips)))
    (loop,) = run.plan.nodes("while")
    add_node = hawk_nodes(run.plan, "add")[0]
    counter = loop.bodies[0][-1].args[1]
    assert any(a is counter for a in add_node.args)                   # the body reads the device counter


@pytest.mark.parametrize("flag,done", [(1, 0), (0, 0), (1, 1)])
def test_early_exit_breaks_mid_body(flag, done):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        g = early_exit(np.zeros(4), cell(flag), cell(done))
    run = run_both(g, times=2)
    plan = run.plan
    (loop,) = plan.nodes("while")
    body = loop.bodies[0]
    (brk,) = [nd for nd in body if nd.kind == "if_else"]
    assert body_kernels(brk.bodies[1]) == ["dbl", "below", "below"]      # the rest of the body
    assert body_kernels(brk.bodies[0]) == []                              # the break: set flags, carry x out
    # the guard: not broken and flag, computed by cell kernels after the if, then set
    tail = body[body.index(brk) + 1:]
    assert [nd.entry for nd in tail] == ["eagle_cell_not", "eagle_cell_and", "set_cond_from_cell"]
    assert tail[-1].cond is loop.cond and tail[-1].args[1] is tail[-2].args[0]


@pytest.mark.parametrize("start", [0.0, 2.0, 5.0])
def test_skipping_continues(start):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        g = skipping(np.full(4, start), cell(1), cell(0))
    run = run_both(g, times=2)
    (loop,) = run.plan.nodes("while")
    body = loop.bodies[0]
    assert [nd.kind for nd in body][-2:] == ["if_else", "kernel"] and body[-1].cond is loop.cond
    (cont,) = [nd for nd in body if nd.kind == "if_else"]
    assert body_kernels(cont.bodies[1]) == ["dbl"] and kinds(cont.bodies[0]) == ["memcpy"]


@pytest.mark.parametrize("sel,want", [(0, 6.0), (1, 9.0), (2, 4.0), (5, 9.0)])
def test_chooser_is_a_switch_with_three_branches(sel, want):
    run = run_both(chooser(np.full(4, 3.0), cell(sel)))
    plan = run.plan
    assert kinds(plan.tree) == ["kernel", "kernel", "switch"]
    select, guard, sw = plan.tree
    assert select.entry == "eagle_switch_index" and list(select.args[2]) == [0, 2] and int(select.args[3]) == 2
    assert guard.entry == "set_cond_from_value" and guard.args[1] is select.args[0] and guard.cond is sw.cond
    assert len(sw.bodies) == 3
    assert [body_kernels(b) for b in sw.bodies] == [["dbl"], ["inc"], ["square"]]     # the default last
    np.testing.assert_array_equal(plan.array_of(run.g._exe.prog.outputs[0]), np.full(4, want))


def test_keep_writes_buffer_arrays_in_place():
    run = run_both(keep(np.arange(4.0), np.zeros(4)))
    plan = run.plan
    (d,) = hawk_nodes(plan, "dbl")
    out = [a for a, p in zip(d.args, d.module.emitted.params) if p.role == "out_plane"]
    assert out == [run.fake_inputs[1]] and out[0] is run.fake_inputs[1]     # b lands in the caller's array
    np.testing.assert_array_equal(run.fake_inputs[1], [2.0, 4.0, 6.0, 8.0])


def test_void_writes_the_mutable_argument():
    run = run_both(void(np.arange(4.0), np.zeros(4)))
    plan = run.plan
    assert kinds(plan.tree) == ["kernel"]
    (k,) = plan.tree
    outs = [a for a, p in zip(k.args, k.module.emitted.params) if p.role == "out_plane"]
    assert outs[0] is run.fake_inputs[1]
    np.testing.assert_array_equal(run.fake_inputs[1], [1.0, 2.0, 3.0, 4.0])


def test_a_max_reduction_runs_its_init_entry():
    run = run_both(peaked(np.zeros(4), cell(1)))
    (loop,) = run.plan.nodes("while")
    roles = [(nd.role, nd.entry.rsplit("_", 1)[-1]) for nd in loop.bodies[0] if nd.kind == "kernel"
             and nd.label == "peak_below"]
    assert [r for r, _ in roles] == ["init", "body", "body"] and roles[0][1] == "init"
    np.testing.assert_array_equal(run.plan.array_of(run.g._exe.prog.outputs[0]), np.full(4, 6.0))


@pytest.mark.parametrize("flag", [1, 0])
def test_whole(flag):
    x, y = np.arange(8.0), np.zeros(8)
    run = run_both(whole(x, cell(flag), y), times=2, orders=ORDERS + (11,))
    plan = run.plan
    (lft,) = hawk_nodes(plan, "left")
    (rgt,) = hawk_nodes(plan, "right")
    (pol,) = hawk_nodes(plan, "polish")
    assert rgt.after == (lft,) and pol.after == (lft,)                  # w waits for `left` only
    top_tweaks = [nd for nd in plan.tree if nd.kind == "kernel" and nd.label == "tweak"]
    assert len(top_tweaks) == 2 and id(lft) not in ancestors(top_tweaks[0])     # branch c is its own chain
    (loop,) = plan.nodes("while")
    copies = plan.tree[plan.tree.index(loop) - 2]
    join = copies.after[0]
    assert join.kind == "join" and {id(pol), id(top_tweaks[1])} <= set(map(id, join.after))
    assert body_kernels(loop.bodies[0]) == ["tweak", "tweak", "merge", "remaining", "remaining"]
    assert loop.bodies[0][-1].cond is loop.cond
    (acc,) = hawk_nodes(plan, "accumulate3")
    assert id(loop) in ancestors(acc) and id(rgt) in ancestors(acc)
    np.testing.assert_array_equal(run.fake_inputs[2], run.ref_inputs[2])     # y, written in place


def test_repeated_launch_restarts_conditions_and_loops():
    g = capped(np.ones(4), cell(1))
    run = run_both(g, times=3)
    assert run.fake.launches == 3


# ---------------------------------------------------------------------------------------------
# the fake itself

def test_the_fake_refuses_what_a_driver_refuses():
    fb = FakeBuilder()
    fb.create_condition()
    with pytest.raises(FakeCudaError, match="unused handle"):
        fb.validate()
    fb = FakeBuilder()
    c = fb.create_condition()
    node, body = fb.while_loop(c)
    with pytest.raises(FakeCudaError, match="host node inside a conditional body"):
        body.host(lambda: None)
    other = FakeBuilder()
    with pytest.raises(FakeCudaError, match="not a node of this graph"):
        other.join((node,))
    with pytest.raises(FakeCudaError, match="nothing sets the condition"):
        fb.validate()


def test_the_fake_orders_expose_a_missing_edge():
    fb = FakeBuilder()
    a, b, c = fb.to_device(np.array([1.0])), fb.zeros((1,), np.float64), fb.zeros((1,), np.float64)
    fb.memcpy(b, a)
    fb.memcpy(c, b)                       # no edge: it may run first
    fb.launch(order="creation")
    assert c[0] == 1.0
    b[0] = c[0] = 0.0
    fb.launch(order="lifo")
    assert c[0] == 0.0


def test_the_fake_checks_kernel_arguments():
    fb = FakeBuilder()
    c = fb.create_condition()
    with pytest.raises(FakeCudaError, match="u32\\* device array"):
        fb.kernel(cuda.GUARDS, "set_cond_from_cell", 1, 1, (c, np.zeros(1, np.int32)))
    with pytest.raises(FakeCudaError, match="one thread"):
        fb.kernel(cuda.GUARDS, "set_cond_from_cell", 2, 32, (c, np.zeros(1, np.uint32)))


# ---------------------------------------------------------------------------------------------
# the sources compile (NVRTC; no GPU)

def test_every_module_of_the_tour_compiles(nvrtc):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        graphs = [first(np.arange(4.0)), choose(np.arange(4.0), cell(1), cell(0), True),
                  early_exit(np.zeros(4), cell(1), cell(0)), chooser(np.arange(4.0), cell(0)),
                  peaked(np.zeros(4), cell(1)), whole(np.arange(8.0), cell(1), np.zeros(8))]
    modules = {}
    for g in graphs:
        t = g._trace
        plan = cuda.lower(g._exe.prog, [p.array.copy() for p in t.input_planes], set(), t.n or 1, FakeBuilder())
        modules.update(plan.modules)
    assert cuda.LOWERING.name in modules and cuda.GUARDS.name in modules
    for name, mod in modules.items():
        cubin = hcuda.compile_cubin(mod.source, "sm_90")
        for entry in mod.entries:
            assert b"\0" + entry.encode() + b"\0" in cubin, f"{name}: entry {entry} missing"
    ptx = hcuda.compile_ptx(cuda.LOWERING.source, "sm_90")
    assert sorted(hcuda.ptx_entries(ptx)) == sorted(cuda.LOWERING.entries)
    assert ".extern .func cudaGraphSetConditional" in ptx


# ---------------------------------------------------------------------------------------------
# the refusal without a GPU

def test_require_gpu_names_what_is_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)
    stand_in_module(monkeypatch, "cuda.core", None)
    with pytest.raises(RuntimeError) as info:
        cuda.require_gpu()
    msg = str(info.value)
    assert "cupy" in msg and "cuda.core" in msg and "pip install -e '.[cuda12]'" in msg


def test_require_gpu_without_a_device(monkeypatch):
    def no_device():
        raise RuntimeError("cudaErrorInsufficientDriver: CUDA driver version is insufficient")

    fake_cupy = types.ModuleType("cupy")
    fake_cupy.cuda = types.SimpleNamespace(runtime=types.SimpleNamespace(getDeviceCount=no_device,
                                                                         driverGetVersion=no_device))
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy)
    stand_in_module(monkeypatch, "cuda.core", types.ModuleType("cuda.core"))
    with pytest.raises(RuntimeError, match="needs a CUDA device") as info:
        cuda.require_gpu()
    assert "cudaErrorInsufficientDriver" in str(info.value)


# ---------------------------------------------------------------------------------------------
# what the cuda.core builder passes on (no GPU needed)

def test_core_arguments_are_pointers_scalars_and_conditions():
    class FakeCupy:
        data = types.SimpleNamespace(ptr=0xABC000)

    cond = object()
    assert core_arg(FakeCupy()) == 0xABC000 and isinstance(core_arg(FakeCupy()), int)
    assert core_arg(None) == 0                              # a null pointer
    for s in (np.uint64(7), np.float64(0.5), np.uint32(3)):
        assert core_arg(s) is s                             # by value, in its own dtype
    assert core_arg(cond) is cond


def test_relowering_reuses_the_first_lowerings_buffers():
    g = capped(np.ones(4), cell(1))
    prog, t = g._exe.prog, g._trace
    keep = {h.var for h in list(t.handles) + t.buffers if h.var is not None}
    first = _PlannedMemory(FakeBuilder())
    plan1 = cuda.lower(prog, [p.array.copy() for p in t.input_planes], keep, 4, first)
    again = _PlannedMemory(FakeBuilder(), reuse=first.made)
    plan2 = cuda.lower(prog, [p.array.copy() for p in t.input_planes], keep, 4, again)
    assert again.made == [] and len(first.made) > 0
    inputs = set(plan1.input_slots)
    assert all(a is b for k, (a, b) in enumerate(zip(plan1.slots, plan2.slots)) if k not in inputs)
    assert [nd.kind for _, nd in plan1.walk()] == [nd.kind for _, nd in plan2.walk()]
    short = _PlannedMemory(FakeBuilder(), reuse=first.made[:1])
    with pytest.raises(RuntimeError, match="more buffers than the first lowering"):
        cuda.lower(prog, [p.array.copy() for p in t.input_planes], keep, 4, short)
