"""CUDA graphs: the graph-building protocol the lowering (cuda_lower.py) speaks, its implementation
over cuda.core explicit graphs, and the executable eagle_fx.Graph replays and binds.

The builder protocol
    One builder object stands for one graph: the top-level graph, or a body of a conditional node
    (the conditional methods return body builders of the same protocol). Node-making methods take
    `after`, a tuple of nodes of the same builder that the new node depends on (empty: a root of
    that graph). The lowering passes at most one node in `after`: where a node has several
    predecessors it first makes a `join` of them (so each call maps onto one cuda.core call).

      memory (on the top-level builder; called outside any node, once, at lowering time)
        zeros(shape, dtype) -> array         a device array, zero-filled, kept by the plan
        to_device(host: np.ndarray) -> array a device copy of a constant (cases, caps, literals)
      conditions
        create_condition(default=0) -> cond  a conditional handle of THIS graph (the graph that
                                             will hold the conditional node using it); `default`
                                             is re-applied at the start of every launch
      nodes
        kernel(module, entry, grid, block, args, after=()) -> node
              launch `entry` of `module` (a KernelModule: name, CUDA C source, entries) with 1-D
              `grid` blocks of `block` threads. `args` are, in C order: device arrays (passed as
              pointers), None (a null pointer), NumPy scalars (passed by value in their dtype),
              or conditions (passed as cudaGraphConditionalHandle)
        memset(dst, value, after=()) -> node every byte of the device array dst := value (0..255)
        memcpy(dst, src, after=()) -> node   device-to-device copy of the whole array (same nbytes)
        host(fn, after=()) -> node           a host callback fn() (top-level graph only: CUDA
                                             refuses host nodes inside conditional bodies)
        join(after) -> node                  an empty node after every node of `after`
        if_then(cond, after=()) -> (node, body)
        if_else(cond, after=()) -> (node, (then_body, else_body))     then runs when cond != 0
        switch(cond, count, after=()) -> (node, [body_0, ..., body_count-1])
              body k runs when cond == k; none when cond >= count
        while_loop(cond, after=()) -> (node, body)
              cond is tested before every turn, the first included

The runtime protocol: what CudaExecutable needs beyond the builder (CoreRuntime here, which extends
hawk_fx.cuda_runtime.KernelRuntime with graphs; eagle_fx.testing.fake_cuda.FakeRuntime for tests)
    name                          'cuda' (shown by repr(g)) or 'fake-cuda'
    device_arrays(arrays, names, api)
                                  the arrays a graph runs on: device arrays as they are (checked:
                                  C-contiguous, this device); NumPy arrays the builder reached (not
                                  its named arguments) are copied to the device once
    is_device(a), zeros, empty, to_device, overlaps(a, b)
    builder()                     a fresh top-level builder
    instantiate(builder)          the executable graph
    stream() / launch(graph, stream) / sync(stream)
                                  launches are asynchronous on the stream; sync waits for them
    update_kernel / update_memcpy / update_memset(graph, plan_node)
                                  set an instantiated node's parameters from the plan node (bind)
    update_graph(graph, builder)  whole-graph update from a definition of the same topology
    run_now(steps)                eager kernels (hawk_fx.cuda_runtime.call_kernel)
"""
from __future__ import annotations

import numpy as np

from hawk_fx.core import Var
from hawk_fx.cuda_runtime import KernelRuntime, core_arg, ptr

from .. import ir
from .cuda_lower import STACK_TURNS, alias_pairs, lower


# ---------------------------------------------------------------------------------------------
# the protocol over cuda.core (>= 1.0) explicit graphs: needs a GPU

class CoreGraphBuilder:
    """The builder protocol over cuda.core's explicit GraphDefinition, with CuPy device arrays.

    Written against the cuda.core 1.2 stubs (GraphDefinition/GraphNode: launch, memset, memcpy,
    callback, join, empty, create_condition, if_then/.then, if_else/.then/.else_,
    switch/.branches, while_loop/.body, instantiate). Kernels come from `runtime` (a CoreRuntime:
    compiled once per process and device). Needs a GPU; run by tests/gpu and bench/gpu_check.sh."""

    def __init__(self, definition=None, *, arch=None, runtime=None, _root=None):
        if _root is None:
            self.runtime = runtime if runtime is not None else CoreRuntime.get()
            from cuda.core.graph import GraphDefinition
            self.arch = arch or self.runtime.arch
            self._root = self
            self.definition = GraphDefinition() if definition is None else definition
        else:
            self._root, self.definition, self.runtime, self.arch = _root, definition, _root.runtime, _root.arch

    def _body(self, definition):
        return CoreGraphBuilder(definition, _root=self._root)

    def _origin(self, after):
        if not after:
            return self.definition
        if len(after) == 1:
            return after[0]
        return self.definition.join(*after)

    # memory
    def zeros(self, shape, dtype):
        return self.runtime.zeros(shape, dtype)

    def to_device(self, host):
        return self.runtime.to_device(host)

    def create_condition(self, default=0):
        return self.definition.create_condition(default_value=default)

    # nodes
    def kernel(self, module, entry, grid, block, args, after=()):
        cfg = self.runtime.config(grid, block)
        fn = self.runtime.function(module, entry, self.arch)
        return self._origin(after).launch(cfg, fn, *[core_arg(a) for a in args])

    def memset(self, dst, value, after=()):
        return self._origin(after).memset(ptr(dst), int(value), int(dst.nbytes), dst_owner=dst)

    def memcpy(self, dst, src, after=()):
        return self._origin(after).memcpy(ptr(dst), ptr(src), int(dst.nbytes), dst_owner=dst, src_owner=src)

    def host(self, fn, after=()):
        return self._origin(after).callback(fn)

    def join(self, after):
        return self.definition.join(*after) if after else self.definition.empty()

    def if_then(self, cond, after=()):
        node = self._origin(after).if_then(cond)
        return node, self._body(node.then)

    def if_else(self, cond, after=()):
        node = self._origin(after).if_else(cond)
        return node, (self._body(node.then), self._body(node.else_))

    def switch(self, cond, count, after=()):
        node = self._origin(after).switch(cond, int(count))
        return node, [self._body(b) for b in node.branches]

    def while_loop(self, cond, after=()):
        node = self._origin(after).while_loop(cond)
        return node, self._body(node.body)

    def instantiate(self):
        return self.definition.instantiate()


# ---------------------------------------------------------------------------------------------
# the runtime: hawk's kernel runtime, with graphs

class CoreRuntime(KernelRuntime):
    """The real runtime: CuPy device memory, cuda.core graphs and launches, on the CUDA device
    CuPy has current. Launches go to CuPy's current stream (`with cupy.cuda.Stream(): g.enqueue()`
    works), so a graph is ordered with the CuPy work around it like any CuPy operation. One
    instance per device (CoreRuntime.get()). Needs a GPU; run by tests/gpu."""

    _instances: dict = {}

    @classmethod
    def get(cls, what: str = "eagle_fx: CuPy arrays run as CUDA graphs") -> "CoreRuntime":
        return super().get(what)

    def builder(self):
        return CoreGraphBuilder(runtime=self)

    def instantiate(self, builder):
        self.cupy.cuda.get_current_stream().synchronize()     # the buffers' zero fills and uploads are done
        graph = builder.instantiate()
        try:
            graph.upload(self.stream())
        except Exception:                                     # an optimisation only
            pass
        return graph

    def launch(self, graph, stream):
        graph.launch(stream)

    def sync(self, stream):
        stream.sync()

    def update_kernel(self, graph, node):
        graph[node.handle].update(config=self.config(node.grid, node.block),
                                  kernel=self.function(node.module, node.entry),
                                  args=tuple(core_arg(a) for a in node.args))

    def update_memcpy(self, graph, node):
        graph[node.handle].update(dst=ptr(node.dst), src=ptr(node.src), size=int(node.dst.nbytes))

    def update_memset(self, graph, node):
        graph[node.handle].update(dst=ptr(node.dst), value=int(node.args[0]) if node.args else 0,
                                  width=int(node.dst.nbytes), height=1, pitch=0)

    def update_graph(self, graph, builder):
        graph.update(builder.definition)

# ---------------------------------------------------------------------------------------------
# the executable: what eagle_fx.Graph runs (the backend protocol, protocol.py)

class _PlannedMemory:
    """The top-level builder as the lowering sees it: zeros/to_device are recorded, in order (or,
    when re-lowering for a whole-graph update, answered with the first lowering's arrays, in the
    same order: the lowering is deterministic); every other call goes to the builder."""

    def __init__(self, builder, reuse=None):
        self._builder = builder
        self.made: list = []
        self._reuse = None if reuse is None else iter(reuse)

    def _take(self, shape, dtype):
        try:
            a = next(self._reuse)
        except StopIteration:
            raise RuntimeError("eagle_fx CUDA: re-lowering asked for more buffers than the first lowering") from None
        if tuple(a.shape) != tuple(shape) or np.dtype(a.dtype) != np.dtype(dtype):
            raise RuntimeError(f"eagle_fx CUDA: re-lowering asked for a {tuple(shape)} {np.dtype(dtype)} buffer where "
                               f"the first lowering made a {tuple(a.shape)} {a.dtype} one")
        return a

    def zeros(self, shape, dtype):
        if self._reuse is not None:
            return self._take(shape, dtype)
        a = self._builder.zeros(shape, dtype)
        self.made.append(a)
        return a

    def to_device(self, host):
        if self._reuse is not None:
            return self._take(np.shape(host), np.asarray(host).dtype)
        a = self._builder.to_device(host)
        self.made.append(a)
        return a

    def __getattr__(self, name):
        return getattr(self._builder, name)


def _regrown(aval, old, new) -> bool:
    """Whether `new` is the same stack of saved turns as `old` with another number of rows."""
    return ir.is_stack(aval) and tuple(new.shape) != tuple(old.shape) and \
        tuple(new.shape[1:]) == tuple(old.shape[1:]) and np.dtype(new.dtype) == np.dtype(old.dtype)


def _writes_inputs(prog) -> bool:
    """Whether a top-level equation writes one of the Program's inputs in place."""
    inputs = set(prog.inputs)
    return any(isinstance(e.inputs[i], Var) and e.inputs[i] in inputs
               for e in prog.eqns for _, i in e.params.get("inplace", ()) or ())


def _refers(node, arr) -> bool:
    if node.kind == "kernel":
        return any(a is arr for a in node.args)
    if node.kind == "memcpy":
        return node.dst is arr or node.src is arr
    if node.kind == "memset":
        return node.dst is arr
    return False


def _swap(node, old, new):
    if node.kind == "kernel":
        node.args = tuple(new if a is old else a for a in node.args)
    else:
        if node.dst is old:
            node.dst = new
        if node.src is old:
            node.src = new


class CudaExecutable:
    """A Program lowered into ONE CUDA graph and instantiated; the backend protocol (protocol.py):
    replay(times), array_of(var), rebind(input_index, array); plus enqueue(times) and
    synchronize() (asynchronous launches on the runtime's stream: CuPy's current stream).

    rebind swaps an input array WITHOUT re-capturing or re-instantiating: every node that reads or
    writes the old array gets the new pointer through a per-node update of the instantiated graph
    (`graph[node].update(...)`, cuda.core >= 1.2, driver >= 12.2). Where that is refused (an older
    cuda.core, or a node inside a conditional body the driver will not update), the same Program
    is lowered again into a new definition over the same buffers, which has the same topology, and
    the instantiated graph is updated from it as a whole (cuGraphExecUpdate). Only if that fails
    too is the new definition instantiated. Where the new array overlaps the other arguments
    differently than the old one did, the copies the lowering made for overlapping inputs change:
    the Program is lowered and instantiated again. `last_bind` says which happened: 'nodes',
    'graph' or 'instantiate'."""

    def __init__(self, prog, input_arrays, keep, n: int, runtime=None, names=None):
        if runtime is None:
            runtime = CoreRuntime.get()
        self.runtime = runtime
        self.backend_name = runtime.name
        self.prog, self.n, self.keep = prog, n, set(keep)
        self.names = list(names) if names is not None else [None] * len(self.prog.inputs)
        self.inputs = runtime.device_arrays(list(input_arrays), self.names)
        self.stack_turns = STACK_TURNS
        self._lower()
        self._pending: list = []
        self.last_bind = None
        self.last_bind_reason = None          # why per-node updates were refused, when they were
        self.launches = 0

    def _lower(self):
        """Lower the Program over self.inputs into a new graph and instantiate it."""
        memory = _PlannedMemory(self.runtime.builder())
        self.plan = lower(self.prog, self.inputs, self.keep, self.n, memory, self.stack_turns)
        self._memory = memory.made
        self.graph = self.runtime.instantiate(memory._builder)
        self._definitions = [memory]          # definitions stay alive with the graph made from them

    def array_of(self, var):
        return self.plan.array_of(var)

    # running
    def enqueue(self, times: int = 1):
        stream = self.runtime.stream()
        for _ in range(int(times)):
            self.runtime.launch(self.graph, stream)
        self.launches += int(times)
        if not any(s is stream for s in self._pending):
            self._pending.append(stream)
        return self

    def synchronize(self):
        pending, self._pending = self._pending, []
        for s in pending:
            self.runtime.sync(s)
        return self

    def replay(self, times: int = 1):
        if self.plan.overflow is None:
            self.enqueue(times)
            self.synchronize()
            return
        for _ in range(int(times)):          # stacks of saved turns: each run is checked for overflow
            self.enqueue(1)
            self.synchronize()
            self._check_stacks()

    def _check_stacks(self):
        """After a run: if a stack of saved turns had no room for a turn (the kernels skipped it and
        raised the overflow cell to the turns needed), make room (double until it fits, lower again)
        and run again; where the graph writes its own arguments in place it cannot run again, and
        is refused instead. Values are never read from a run that overflowed."""
        while True:
            cell = self.plan.overflow
            needed = int(cell[0])
            if not needed:
                return
            cell[0] = 0
            if needed <= self.plan.stack_turns:
                raise RuntimeError(f"eagle_fx CUDA: a stack of saved loop turns was read at turn {needed - 1}, past "
                                   f"the {self.plan.stack_turns} turns it holds: the record it came from is not "
                                   "this run's")
            held = turns = self.plan.stack_turns
            while turns < needed:
                turns *= 2
            self.stack_turns = turns
            self._lower()
            if _writes_inputs(self.prog):
                raise RuntimeError(f"eagle_fx CUDA: a loop ran {needed} turns, past the {held} its "
                                   "stacks of saved turns held, and the graph writes its arguments in place, so "
                                   f"that run is not repeated: the stacks now hold {turns} turns; launch it again")
            self.enqueue(1)
            self.synchronize()

    # binding
    def rebind(self, input_index: int, arr):
        plan = self.plan
        slot = plan.input_slots[input_index]
        old = plan.slots[slot]
        (new,) = self.runtime.device_arrays([arr], [self.names[input_index] or f"input {input_index}"])
        if new is old:
            return
        if _regrown(self.prog.inputs[input_index].aval, old, new):
            # a stack of saved turns with more (or fewer) rows, from a run that grew it: lower again
            self.synchronize()
            self.inputs[input_index] = new
            self._lower()
            self.last_bind, self.last_bind_reason = "instantiate", "a stack of saved turns holds another number of turns"
            return
        if tuple(new.shape) != tuple(old.shape) or np.dtype(new.dtype) != np.dtype(old.dtype):
            raise ValueError(f"eagle_fx CUDA: rebind of input {input_index}: {tuple(new.shape)} {new.dtype} for "
                             f"{tuple(old.shape)} {old.dtype}")
        self.synchronize()
        inputs = list(self.inputs)
        inputs[input_index] = new
        if alias_pairs(inputs, input_index) != {p for p in plan.aliasing if input_index in p}:
            # the copies the lowering made for overlapping inputs come or go: lower again
            self.inputs = inputs
            self._lower()
            self.last_bind = "instantiate"
            self.last_bind_reason = "the arguments overlap one another differently than the arrays bound before"
            return
        if slot in plan.view_slots:
            # a batched call's launches hold views of the old array: lower again over the new one
            self.inputs = inputs
            plan.slots[slot] = new
            self._update_whole(None)
            self.last_bind_reason = "a batched call's launches read views of the argument"
            return
        nodes = [nd for _, nd in plan.walk() if _refers(nd, old)]
        plan.slots[slot] = new
        self.inputs[input_index] = new
        for nd in nodes:
            _swap(nd, old, new)
        try:
            for nd in nodes:
                getattr(self.runtime, f"update_{nd.kind}")(self.graph, nd)
            self.last_bind, self.last_bind_reason = "nodes", None
        except Exception as exc:      # refused per node: a whole-graph update from a new definition
            self._update_whole(exc)

    def _update_whole(self, why):
        memory = _PlannedMemory(self.runtime.builder(), reuse=self._memory)
        plan = lower(self.prog, self.inputs, self.keep, self.n, memory, self.stack_turns)
        try:
            self.runtime.update_graph(self.graph, memory._builder)
        except Exception:
            self.graph = self.runtime.instantiate(memory._builder)
            self.plan = plan
            self._definitions = [memory]
            self.last_bind, self.last_bind_reason = "instantiate", f"{type(why).__name__}: {why}"
            return
        # the instantiated graph keeps the first definition's nodes: the plan keeps their handles
        # and takes the new definition's arguments
        for (_, a), (_, b) in zip(self.plan.walk(), plan.walk()):
            a.args, a.dst, a.src = b.args, b.dst, b.src
        self.plan.slots[:] = plan.slots
        self._definitions = self._definitions[:1] + [memory]     # the first (its nodes index the graph), the latest
        self.last_bind = "graph"
        self.last_bind_reason = f"{type(why).__name__}: {why}"

