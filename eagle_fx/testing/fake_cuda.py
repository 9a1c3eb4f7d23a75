"""A recording fake of the CUDA graph-builder protocol (see eagle_fx.backends.cuda_graph), for machines
without a GPU.

`FakeBuilder()` implements the protocol with NumPy arrays as "device memory". It records the node
tree: kinds, nesting, dependencies, and which condition each guard kernel sets. It checks, as it
goes, the rules a real driver enforces or that a wrong lowering would break silently:

  * edges only between nodes of one graph; no host nodes inside conditional bodies;
  * a condition belongs to the graph holding its conditional node, and drives one node only;
  * kernel arguments match the kernel's C signature (pointer dtypes, scalar dtypes, handles),
    launch shapes match the entry (one thread for `single` entries, warps for grid-stride ones);
  * a hawk body's entries are launched in order, and a body with a sample reduction has its
    workspace initialised (memset or `_init`) before it runs;
  * at launch, no kernel reads an array that overlaps one it writes without being that very view,
    and no memcpy's source overlaps its destination: on a GPU, threads would read what others
    already wrote (the answer would depend on their order).

`validate()` checks the whole tree once built: every condition is used by exactly one node and is
set by a guard kernel that precedes the node in its graph; every WHILE body ends with a guard that
sets the loop's condition after every other node of the body.

`launch(times, order=...)` INTERPRETS the recorded graph on the host: nodes run in an order that
respects the recorded edges only (`order`: "creation", "lifo" (the latest-created ready node
first: an adversarial order that exposes missing edges), or an int seed for a random order).
Kernels of a hawk body run the kernel's NumPy code on the buffers (the body runs whole at its last
entry; earlier entries are checked for order), guard kernels set the fake condition, the lowering's
small kernels (cell logic, switch index, stack pushes and reads, turn counters, cotangent sums, the
revolve schedule) run their NumPy equivalents, IF/IF-ELSE/
SWITCH run the body the condition selects, WHILE runs its body while the condition is set
(checked before the first turn). Conditions are reset to their default at every launch.

`instantiate()` validates and returns a `FakeExec`: a snapshot of the graph, as cuda.core's
instantiate is (later changes to the definition do not reach it). It launches like the builder,
takes per-node updates (`update_kernel/update_memcpy/update_memset`: argument checks as at
creation; `node_updates="top"` refuses nodes inside conditional bodies, "none" refuses all, to
exercise the fallbacks) and whole-graph updates from another definition (`update`: refused when
the topology differs, as CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED is).

`FakeRuntime` is the runtime eagle_fx.backends.cuda_graph.CudaExecutable and
hawk_fx.cuda_runtime.call_kernel run on for the "fake-cuda" backend: NumPy arrays are the device
memory, launches wait on a fake stream until `sync` (so a missing synchronize shows up as stale
results), and it counts what it did.
"""
from __future__ import annotations

import numpy as np

from hawk_fx.core import SAMPLE

from ..transforms import checkpoint

__all__ = ["FakeBuilder", "FakeCondition", "FakeNode", "FakeCudaError", "FakeExec", "FakeRuntime"]


class FakeCudaError(RuntimeError):
    """What a real driver would refuse, or a lowering mistake the fake detected."""


class FakeCondition:
    __slots__ = ("index", "graph", "default", "value", "users")

    def __init__(self, index, graph, default):
        self.index, self.graph, self.default = index, graph, default
        self.value = 0 if default is None else int(default)
        self.users: list = []

    def __repr__(self):
        return f"<FakeCondition c{self.index} = {self.value}>"


class FakeNode:
    __slots__ = ("index", "kind", "graph", "after", "module", "entry", "grid", "block", "args", "sets", "cond",
                 "bodies", "dst", "src", "value", "fn", "count")

    def __init__(self, index, kind, graph, after, **kw):
        self.index, self.kind, self.graph, self.after = index, kind, graph, tuple(after)
        self.module = self.entry = self.grid = self.block = self.sets = self.cond = None
        self.dst = self.src = self.value = self.fn = self.count = None
        self.args, self.bodies = (), ()
        for k, v in kw.items():
            setattr(self, k, v)

    def __repr__(self):
        what = f" {self.entry}" if self.kind == "kernel" else ""
        return f"<FakeNode #{self.index} {self.kind}{what}>"


# C signatures of the guard kernels and the lowering's kernels: 'h' a condition handle,
# 'u32*' / 'i64*' / 'u8*' device pointers ('?' suffix: may be null), 'u32' / 'u64' scalars
_SIGNATURES = {
    "set_cond_from_cell": ("h", "u32*"),
    "set_cond_from_value": ("h", "u32*"),
    "set_cond_lt": ("h", "u32*", "u32*"),
    "count_step": ("h", "u32*", "u32*"),
    "count_start": ("h", "u32*", "u32*"),
    "eagle_loop_start": ("h", "u32*", "u32*?", "u32*?"),
    "eagle_loop_step": ("h", "u32*", "u32*?", "u32*?"),
    "eagle_cell_not": ("u32*", "u32*"),
    "eagle_cell_and": ("u32*", "u32*", "u32*"),
    "eagle_cell_or": ("u32*", "u32*", "u32*"),
    "eagle_switch_index": ("u32*", "u32*", "i64*?", "u32"),
    "eagle_strided_copy": ("u8*", "u8*", "i64*", "u32", "u64", "u32"),
    "eagle_stack_push": ("u8*", "u8*", "u32*", "u64", "u32", "u32", "u32*"),
    "eagle_stack_read": ("u8*", "u8*", "u32*", "u64", "u32", "u32", "u32*"),
    "eagle_cell_inc": ("u32*", "u32*"),
    "eagle_revolve_step": ("h", "u32*", "u32*", "u32", "u32", "u32*", "u32*", "u32*"),
    "eagle_cell_rev": ("u32*", "u32*", "u32*"),
    "eagle_cells": ("u32*", "u32*", "u32*?", "u32", "u32", "u32", "u32"),
    "eagle_cells_max": ("u32*", "u32*", "u32"),
    "eagle_masked_copy": ("u8*", "u8*", "u32*", "u64", "u64", "u32", "u32", "i64"),
    "eagle_masked_loop": ("u32*", "u32*", "u32*", "u32*", "u32*?", "u32", "u32*?", "u32", "u32", "u32", "u32"),
    "eagle_stack_gather": ("u8*", "u8*", "u32*", "u64", "u64", "u64", "u32", "u32", "u32", "u32*"),
    "eagle_add_float32": ("f32*", "f32*", "f32*", "u64"),
    "eagle_add_float64": ("f64*", "f64*", "f64*", "u64"),
    "eagle_add_int32": ("i32*", "i32*", "i32*", "u64"),
    "eagle_add_int64": ("i64*", "i64*", "i64*", "u64"),
}

_DT = {"u32": np.dtype(np.uint32), "i64": np.dtype(np.int64), "u64": np.dtype(np.uint64), "u8": None,
       "f32": np.dtype(np.float32), "f64": np.dtype(np.float64), "i32": np.dtype(np.int32)}


def _nbytes_view(a: np.ndarray) -> np.ndarray:
    return a.reshape(-1).view(np.uint8)


class FakeBuilder:
    """One graph of the fake (the top level, or a conditional body); see the module docstring."""

    def __init__(self, *, parent=None, max_turns=1_000_000):
        self.parent = parent
        self.root = self if parent is None else parent.root
        self.nodes: list[FakeNode] = []
        self.max_turns = max_turns
        if parent is None:
            self.conditions: list[FakeCondition] = []
            self.arrays: list = []
            self._counter = 0
            self._fresh: set = set()          # id() of workspaces initialised since their body last ran
            self._progress: dict = {}         # (module, args) -> next entry index of a hawk body
            self.launches = 0

    # -- recording ---------------------------------------------------------------------------
    @property
    def in_body(self) -> bool:
        return self.parent is not None

    def _node(self, kind, after, **kw) -> FakeNode:
        after = tuple(after)
        for a in after:
            if not isinstance(a, FakeNode) or a.graph is not self:
                raise FakeCudaError(f"fake CUDA: a {kind} node depends on {a!r}, which is not a node of this graph")
        root = self.root
        node = FakeNode(root._counter, kind, self, after, **kw)
        root._counter += 1
        self.nodes.append(node)
        return node

    def zeros(self, shape, dtype):
        a = np.zeros(shape, dtype)
        self.root.arrays.append(a)
        return a

    def to_device(self, host):
        a = np.array(host, copy=True, order="C")
        self.root.arrays.append(a)
        return a

    def create_condition(self, default=0) -> FakeCondition:
        c = FakeCondition(len(self.root.conditions), self, default)
        self.root.conditions.append(c)
        return c

    def kernel(self, module, entry, grid, block, args, after=()):
        if entry not in module.entries:
            raise FakeCudaError(f"fake CUDA: module {module.name} has no entry {entry!r}")
        grid, block = int(grid), int(block)
        if grid < 1 or not 1 <= block <= 1024:
            raise FakeCudaError(f"fake CUDA: {entry} launched <<<{grid}, {block}>>>")
        args = tuple(args)
        sets = self._check_args(module, entry, grid, block, args)
        return self._node("kernel", after, module=module, entry=entry, grid=grid, block=block, args=args, sets=sets)

    def memset(self, dst, value, after=()):
        if not isinstance(dst, np.ndarray) or not 0 <= int(value) < 256:
            raise FakeCudaError(f"fake CUDA: memset of {type(dst).__name__} to {value!r}")
        return self._node("memset", after, dst=dst, value=int(value))

    def memcpy(self, dst, src, after=()):
        if not (isinstance(dst, np.ndarray) and isinstance(src, np.ndarray)) or dst.nbytes != src.nbytes:
            raise FakeCudaError(f"fake CUDA: memcpy of {getattr(src, 'nbytes', src)} bytes into "
                                f"{getattr(dst, 'nbytes', dst)} bytes")
        if dst is src:
            raise FakeCudaError("fake CUDA: memcpy of an array onto itself")
        return self._node("memcpy", after, dst=dst, src=src)

    def host(self, fn, after=()):
        if self.in_body:
            raise FakeCudaError("fake CUDA: a host node inside a conditional body (the driver refuses it)")
        return self._node("host", after, fn=fn)

    def join(self, after):
        return self._node("join", after)

    def _conditional(self, kind, cond, after, nbodies, count=None):
        if not isinstance(cond, FakeCondition):
            raise FakeCudaError(f"fake CUDA: a {kind} node on {cond!r}, not a condition")
        if cond.graph is not self:
            raise FakeCudaError(f"fake CUDA: a {kind} node uses a condition created for another graph")
        if cond.users:
            raise FakeCudaError(f"fake CUDA: condition c{cond.index} drives a second conditional node")
        bodies = tuple(FakeBuilder(parent=self, max_turns=self.max_turns) for _ in range(nbodies))
        node = self._node(kind, after, cond=cond, bodies=bodies, count=count)
        cond.users.append(node)
        return node, bodies

    def if_then(self, cond, after=()):
        node, (body,) = self._conditional("if", cond, after, 1)
        return node, body

    def if_else(self, cond, after=()):
        node, bodies = self._conditional("if_else", cond, after, 2)
        return node, bodies

    def switch(self, cond, count, after=()):
        if int(count) < 1:
            raise FakeCudaError(f"fake CUDA: a switch with {count} branches")
        node, bodies = self._conditional("switch", cond, after, int(count), count=int(count))
        return node, list(bodies)

    def while_loop(self, cond, after=()):
        node, (body,) = self._conditional("while", cond, after, 1)
        return node, body

    # -- argument checks ---------------------------------------------------------------------
    def _check_args(self, module, entry, grid, block, args):
        if module.kind == "body":
            return self._check_body_args(module, entry, grid, block, args)
        sig = _SIGNATURES.get(entry)
        if sig is None:
            raise FakeCudaError(f"fake CUDA: no signature known for kernel {entry!r}")
        if len(args) != len(sig):
            raise FakeCudaError(f"fake CUDA: {entry} takes {len(sig)} arguments, got {len(args)}")
        sets = None
        for k, (want, a) in enumerate(zip(sig, args)):
            where = f"fake CUDA: {entry} argument {k}"
            if want == "h":
                if not isinstance(a, FakeCondition):
                    raise FakeCudaError(f"{where} must be a condition, got {a!r}")
                sets = a
            elif want.endswith("*") or want.endswith("*?"):
                if a is None and want.endswith("?"):
                    continue
                dt = _DT[want.rstrip("*?")]
                if not isinstance(a, np.ndarray) or (dt is not None and a.dtype != dt) or a.size < 1:
                    raise FakeCudaError(f"{where} must be a {want} device array, got {_describe(a)}")
            else:
                if not isinstance(a, np.generic) or a.dtype != _DT[want]:
                    raise FakeCudaError(f"{where} must be a {want} scalar, got {_describe(a)}")
        if sets is not None and (grid, block) != (1, 1):
            raise FakeCudaError(f"fake CUDA: guard {entry} launched <<<{grid}, {block}>>>; guards are one thread")
        return sets

    def _check_body_args(self, module, entry, grid, block, args):
        ek = module.emitted
        if len(args) != len(ek.params):
            raise FakeCudaError(f"fake CUDA: {entry} takes {len(ek.params)} arguments, got {len(args)}")
        n = None
        for prm, a in zip(ek.params, args):
            if prm.role == "n":
                if not isinstance(a, np.uint64):
                    raise FakeCudaError(f"fake CUDA: {entry}: n must be a uint64 scalar, got {_describe(a)}")
                n = int(a)
        for prm, a in zip(ek.params, args):
            where = f"fake CUDA: {entry} argument {prm.name} ({prm.ctype})"
            if prm.role == "in_value":
                if not isinstance(a, np.generic) or a.dtype != prm.dtype:
                    raise FakeCudaError(f"{where} must be a {prm.dtype} scalar, got {_describe(a)}")
            elif prm.role == "workspace":
                if not isinstance(a, np.ndarray) or a.nbytes < ek.workspace_bytes:
                    raise FakeCudaError(f"{where} must be a workspace of {ek.workspace_bytes} bytes, "
                                        f"got {_describe(a)}")
            elif prm.role != "n":
                if not isinstance(a, np.ndarray) or a.dtype != prm.dtype:
                    raise FakeCudaError(f"{where} must be a {prm.dtype} device array, got {_describe(a)}")
                per = int(np.prod(prm.shape, dtype=np.int64))
                want = per * n if prm.role in ("in_plane", "out_plane") else per
                if a.size != want:
                    raise FakeCudaError(f"{where} holds {a.size} elements, the kernel reads {want}")
        en = next(x for x in ek.entries if x.name == entry)
        if en.launch == "single" and (grid, block) != (1, 1):
            raise FakeCudaError(f"fake CUDA: {entry} is a one-thread entry, launched <<<{grid}, {block}>>>")
        if en.launch == "grid" and block % 32:
            raise FakeCudaError(f"fake CUDA: {entry} needs a block of whole warps, got {block}")
        return None

    # -- validation --------------------------------------------------------------------------
    def walk(self):
        for node in self.nodes:
            yield node
            for b in node.bodies:
                yield from b.walk()

    def ancestors(self, node) -> set:
        seen, stack = set(), list(node.after)
        while stack:
            a = stack.pop()
            if a.index not in seen:
                seen.add(a.index)
                stack.extend(a.after)
        return seen

    def validate(self) -> "FakeBuilder":
        """Check the recorded tree (see the module docstring); returns self."""
        root = self.root
        for c in root.conditions:
            if len(c.users) != 1:
                raise FakeCudaError(f"fake CUDA: condition c{c.index} drives {len(c.users)} conditional nodes "
                                    "(an unused handle fails instantiation)")
        for g in [root] + [b for n in root.walk() for b in n.bodies]:
            for node in g.nodes:
                if node.cond is None:
                    continue
                anc = g.ancestors(node)
                if not any(k.sets is node.cond and k.index in anc for k in g.nodes if k.kind == "kernel"):
                    raise FakeCudaError(f"fake CUDA: nothing sets the condition of {node!r} before it")
                if node.kind == "while":
                    body = node.bodies[0]
                    last = body.nodes[-1] if body.nodes else None
                    if last is None or last.kind != "kernel" or last.sets is not node.cond:
                        raise FakeCudaError(f"fake CUDA: the body of {node!r} does not end with its guard kernel")
                    others = {k.index for k in body.nodes if k is not last}
                    if not others <= body.ancestors(last):
                        raise FakeCudaError(f"fake CUDA: the guard of {node!r} does not follow every node of its body")
        return self

    def instantiate(self, node_updates="all") -> "FakeExec":
        """Validate and snapshot the graph (see the module docstring)."""
        if self.parent is not None:
            raise FakeCudaError("fake CUDA: instantiate the top-level graph, not a conditional body")
        self.validate()
        return FakeExec(self, node_updates)

    # -- interpretation ----------------------------------------------------------------------
    def launch(self, times: int = 1, order="creation") -> "FakeBuilder":
        """Interpret the graph `times` times (see the module docstring for `order`)."""
        root = self.root
        rng = np.random.default_rng(order) if isinstance(order, (int, np.integer)) and not isinstance(order, bool) \
            else None
        for _ in range(int(times)):
            for c in root.conditions:
                if c.default is not None:
                    c.value = int(c.default)
            root._run(order, rng)
            root.launches += 1
        return self

    def _run(self, order, rng):
        pending = {n.index: len(n.after) for n in self.nodes}
        succ: dict = {n.index: [] for n in self.nodes}
        for n in self.nodes:
            for a in n.after:
                succ[a.index].append(n)
        ready = [n for n in self.nodes if not n.after]
        done = 0
        while ready:
            if order == "creation":
                k = min(range(len(ready)), key=lambda i: ready[i].index)
            elif order == "lifo":
                k = max(range(len(ready)), key=lambda i: ready[i].index)
            elif rng is not None:
                k = int(rng.integers(len(ready)))
            else:
                raise ValueError(f"fake CUDA: order {order!r}: 'creation', 'lifo' or an int seed")
            node = ready.pop(k)
            self._exec(node, order, rng)
            done += 1
            for s in succ[node.index]:
                pending[s.index] -= 1
                if pending[s.index] == 0:
                    ready.append(s)
        if done != len(self.nodes):
            raise FakeCudaError("fake CUDA: the graph has a cycle")

    def _exec(self, node, order, rng):
        kind = node.kind
        if kind == "kernel":
            self._kernel(node)
        elif kind == "memset":
            _nbytes_view(node.dst)[:] = node.value
            if node.value == 0:
                self.root._fresh.add(id(node.dst))
        elif kind == "memcpy":
            if np.shares_memory(node.dst, node.src):
                raise FakeCudaError(f"fake CUDA: a memcpy ({node!r}) whose source overlaps its destination")
            _nbytes_view(node.dst)[:] = _nbytes_view(node.src)
        elif kind == "host":
            node.fn()
        elif kind == "join":
            pass
        elif kind == "if":
            if node.cond.value:
                node.bodies[0]._run(order, rng)
        elif kind == "if_else":
            node.bodies[0 if node.cond.value else 1]._run(order, rng)
        elif kind == "switch":
            if node.cond.value < node.count:
                node.bodies[node.cond.value]._run(order, rng)
        elif kind == "while":
            turns = 0
            while node.cond.value:
                turns += 1
                if turns > self.max_turns:
                    raise FakeCudaError(f"fake CUDA: {node!r} ran more than {self.max_turns} turns")
                node.bodies[0]._run(order, rng)
        else:
            raise FakeCudaError(f"fake CUDA: unknown node kind {kind!r}")

    # -- kernels -----------------------------------------------------------------------------
    def _kernel(self, node):
        mod, entry, a = node.module, node.entry, node.args
        if mod.kind == "body":
            return self._body(node)
        if entry == "set_cond_from_cell":
            a[0].value = 1 if a[1][0] != 0 else 0
        elif entry == "set_cond_from_value":
            a[0].value = int(a[1][0])
        elif entry == "set_cond_lt":
            a[0].value = int(a[1][0] < a[2][0])
        elif entry == "count_start":
            a[1][0] = 0
            a[0].value = int(0 < a[2][0])
        elif entry == "count_step":
            a[1][0] += np.uint32(1)
            a[0].value = int(a[1][0] < a[2][0])
        elif entry in ("eagle_loop_start", "eagle_loop_step"):
            h, counter, trips, cell = a
            counter[0] = 0 if entry == "eagle_loop_start" else counter[0] + np.uint32(1)
            go = (trips is None or counter[0] < trips[0]) and (cell is None or cell[0] != 0)
            h.value = int(go)
        elif entry == "eagle_cell_not":
            a[0][0] = a[1][0] == 0
        elif entry == "eagle_cell_and":
            a[0][0] = (a[1][0] != 0) and (a[2][0] != 0)
        elif entry == "eagle_cell_or":
            a[0][0] = (a[1][0] != 0) or (a[2][0] != 0)
        elif entry == "eagle_switch_index":
            out, cell, cases, count = a
            k = int(count)
            for i in range(int(count)):
                if int(cases[i]) == int(cell[0]):
                    k = i
                    break
            out[0] = k
        elif entry == "eagle_strided_copy":
            _no_race(node, [a[1]], [a[0]])
            self._strided_copy(a)
        elif entry in ("eagle_stack_push", "eagle_stack_read"):
            self._stack_copy(node, a)
        elif entry == "eagle_revolve_step":
            h, state, turns, K, start, kind, turn, slot = a
            k, arg = _revolve_step(state, int(turns[0]), int(K), int(start))
            kind[0] = k
            if k <= 1:
                turn[0] = arg
            elif k <= 3:
                slot[0] = arg
            h.value = int(k != 4)
        elif entry == "eagle_cell_inc":
            a[0][0] = a[1][0] + np.uint32(1)
        elif entry == "eagle_cell_rev":
            a[0][0] = max(int(a[1][0]) - 1 - int(a[2][0]), 0)
        elif entry == "eagle_cells":
            out, x, y, count, sa, sb, op = a
            k = int(count)
            x = np.broadcast_to(x.reshape(-1)[:k if sa else 1].astype(np.int64), (k,))
            y = np.zeros(k, np.int64) if y is None else np.broadcast_to(y.reshape(-1)[:k if sb else 1].astype(np.int64), (k,))
            r = {0: x == 0, 1: (x != 0) & (y != 0), 2: (x != 0) | (y != 0), 3: x + 1,
                 4: np.maximum(x - 1 - y, 0), 5: x <= y}[int(op)]
            out.reshape(-1)[:k] = r
        elif entry == "eagle_cells_max":
            out, x, count = a
            out[0] = int(x.reshape(-1)[:int(count)].max(initial=0))
        elif entry == "eagle_masked_copy":
            _no_race(node, [a[1]], [a[0]])
            self._masked_copy(a)
        elif entry == "eagle_masked_loop":
            counter, go, live, done, guard, gs, trips, ts, cap, B, start = a
            t = 0 if start else int(counter[0]) + 1
            counter[0] = t
            if start:
                live[:int(B)] = 1
            if t >= int(cap):
                done[:int(B)] = 0
                go[0] = 0
                return
            run = live[:int(B)] != 0
            if guard is not None:
                run &= np.broadcast_to(guard.reshape(-1)[:int(B) if gs else 1], (int(B),)) != 0
            if trips is not None:
                run &= t < np.broadcast_to(trips.reshape(-1)[:int(B) if ts else 1], (int(B),))
            done[:int(B)] = (live[:int(B)] != 0) & ~run
            live[:int(B)] = run
            go[0] = int(run.any())
        elif entry == "eagle_stack_gather":
            self._stack_gather(node, a)
        elif entry.startswith("eagle_add_"):
            out, x, y, count = a
            if not out.size == x.size == y.size == int(count):
                raise FakeCudaError(f"fake CUDA: {entry} of {int(count)} elements over arrays of {out.size}, {x.size}, "
                                    f"{y.size}")
            np.add(x.reshape(-1), y.reshape(-1), out=out.reshape(-1))
        else:
            raise FakeCudaError(f"fake CUDA: no interpretation for kernel {entry!r}")

    @staticmethod
    def _stack_copy(node, a):
        """Row `turn` of a stack from/to a value; a turn past the room raises the overflow cell."""
        push = node.entry == "eagle_stack_push"
        dst, src, turn, count, itemsize, room, overflow = a
        stack, value = (dst, src) if push else (src, dst)
        t, row = int(turn[0]), int(count) * int(itemsize)
        if int(room) * row > stack.nbytes or row != value.nbytes:
            raise FakeCudaError(f"fake CUDA: {node.entry} of rows of {row} bytes, room {int(room)}, over a stack of "
                                f"{stack.nbytes} bytes and a value of {value.nbytes}")
        if t >= int(room):
            overflow[0] = max(int(overflow[0]), t + 1)
            return
        _no_race(node, [src], [dst])
        rows = _nbytes_view(stack)[t * row:(t + 1) * row]
        if push:
            rows[:] = _nbytes_view(value)
        else:
            _nbytes_view(value)[:] = rows

    @staticmethod
    def _masked_copy(a):
        """dst = src, item by item, for the instances the mask selects (eagle_masked_copy)."""
        dst, src, mask, per, count, itemsize, mode, key = a
        per, count, size = int(per), int(count), int(itemsize)
        if count * size > min(dst.nbytes, src.nbytes) or count // per > mask.size:
            raise FakeCudaError(f"fake CUDA: eagle_masked_copy of {count} items over arrays of {dst.nbytes}, "
                                f"{src.nbytes} bytes and {mask.size} instances")
        m = mask.reshape(-1)[:count // per].astype(np.int64)
        take = {0: m != 0, 1: m == 0, 2: m == int(key)}[int(mode)]
        d = _nbytes_view(dst)[:count * size].reshape(-1, per * size)
        d[take] = _nbytes_view(src)[:count * size].reshape(-1, per * size)[take]

    @staticmethod
    def _stack_gather(node, a):
        """Row turns[b] of a stack, for each instance b (eagle_stack_gather)."""
        out, stack, turns, per, rowcount, bstride, B, itemsize, room, overflow = a
        per, rowcount, bstride, size = int(per), int(rowcount), int(bstride), int(itemsize)
        if int(room) * rowcount * size > stack.nbytes or out.nbytes != per * int(B) * size:
            raise FakeCudaError(f"fake CUDA: eagle_stack_gather of {int(B)} rows of {per} items, room {int(room)}, "
                                f"over a stack of {stack.nbytes} bytes and a value of {out.nbytes}")
        _no_race(node, [stack], [out])
        src, dst = _nbytes_view(stack), _nbytes_view(out)
        for b in range(int(B)):
            t = int(turns.reshape(-1)[b])
            if t >= int(room):
                overflow[0] = max(int(overflow[0]), t + 1)
                continue
            lo = (t * rowcount + b * bstride) * size
            dst[b * per * size:(b + 1) * per * size] = src[lo:lo + per * size]

    @staticmethod
    def _strided_copy(a):
        dst, src, geom, ndim, count, itemsize = a
        nd, size = int(ndim), int(itemsize)
        shape, sst, dst_st = geom[:nd], geom[nd:2 * nd], geom[2 * nd:3 * nd]
        idx = np.indices(tuple(int(d) for d in shape)).reshape(nd, -1)
        if idx.shape[1] != int(count):
            raise FakeCudaError(f"fake CUDA: eagle_strided_copy of {int(count)} elements over a shape {shape}")
        s_off = int(geom[3 * nd]) + sst @ idx
        d_off = int(geom[3 * nd + 1]) + dst_st @ idx
        d_bytes, s_bytes = _nbytes_view(dst), _nbytes_view(src)
        for lo, hi, name in ((s_off, s_bytes, "source"), (d_off, d_bytes, "destination")):
            if lo.min() < 0 or lo.max() + size > hi.size:
                raise FakeCudaError(f"fake CUDA: eagle_strided_copy reads/writes outside its {name} array")
        for b in range(size):
            d_bytes[d_off + b] = s_bytes[s_off + b]

    def _body(self, node):
        root = self.root
        mod, args = node.module, node.args
        ek, spec = mod.emitted, mod.spec
        names = [en.name for en in ek.entries]
        k = names.index(node.entry)
        en = ek.entries[k]
        ws = next((a for p, a in zip(ek.params, args) if p.role == "workspace"), None)
        if en.role == "init":
            for red in ek.reductions:
                _acc_view(ws, red)[:] = _identity(red.kind, red.acc_dtype)
            root._fresh.add(id(ws))
            return
        first = next(i for i, x in enumerate(ek.entries) if x.role != "init")
        key = (mod.name, tuple(id(a) for a in args))
        expect = root._progress.get(key, first)
        if k != expect:
            raise FakeCudaError(f"fake CUDA: {node.entry} ran out of order: entry {names[expect]} comes first")
        if k + 1 < len(names):
            root._progress[key] = k + 1
            return
        root._progress.pop(key, None)
        if ek.reductions:
            if id(ws) not in root._fresh:
                raise FakeCudaError(f"fake CUDA: {mod.label or mod.name} reduces over samples, but its workspace was "
                                    "not initialised (memset or _init) before it ran")
            root._fresh.discard(id(ws))
        n = next(int(a) for p, a in zip(ek.params, args) if p.role == "n")
        ins = [None] * len(spec.prog.inputs)
        outs = [None] * len(spec.prog.outputs)
        for prm, a in zip(ek.params, args):
            if prm.role in ("in_plane", "in_cell"):
                ins[prm.index] = a
            elif prm.role == "in_value":
                weak = spec.layout[prm.index][3]
                ins[prm.index] = a.item() if weak else a
            elif prm.role in ("out_plane", "out_cell"):
                outs[prm.index] = a
        _no_race(node, [a for a in ins if isinstance(a, np.ndarray)], outs)
        # hawk's NumPy code takes uniform inputs as (*shape, 1) arrays: a one-cell pointer is one
        for i, v in enumerate(spec.prog.inputs):
            if isinstance(ins[i], np.ndarray) and v.aval.kind != SAMPLE:
                ins[i] = ins[i].reshape(tuple(v.aval.shape) + (1,))
        nk = spec.compiled
        nk.run_fn(tuple(ins), tuple(outs), n)


class FakeExec:
    """An instantiated fake graph (FakeBuilder.instantiate): a snapshot of the definition's nodes,
    conditions and arguments, launched and updated on its own."""

    def __init__(self, definition: FakeBuilder, node_updates="all"):
        if node_updates not in ("all", "top", "none"):
            raise ValueError(f"fake CUDA: node_updates={node_updates!r}: 'all', 'top' or 'none'")
        self.definition, self.node_updates = definition, node_updates
        self.graph = FakeBuilder(max_turns=definition.max_turns)
        self._conds = {id(c): FakeCondition(c.index, None, c.default) for c in definition.conditions}
        self.graph.conditions = [self._conds[id(c)] for c in definition.conditions]
        self.graph._counter = definition._counter
        self._nodes: dict = {}                  # definition node index -> (definition node, clone)
        self._clone(definition, self.graph)
        self.updates: list = []                 # ('kernel' | 'memcpy' | 'memset' | 'graph', node index)

    def _map(self, args, conds):
        return tuple(conds[id(a)] if isinstance(a, FakeCondition) and id(a) in conds else a for a in args)

    def _clone(self, src: FakeBuilder, dst: FakeBuilder):
        for n in src.nodes:
            c = FakeNode(n.index, n.kind, dst, [self._nodes[a.index][1] for a in n.after],
                         module=n.module, entry=n.entry, grid=n.grid, block=n.block, dst=n.dst, src=n.src,
                         value=n.value, fn=n.fn, count=n.count)
            c.args = self._map(n.args, self._conds)
            c.sets = self._conds.get(id(n.sets)) if n.sets is not None else None
            if n.cond is not None:
                c.cond = self._conds[id(n.cond)]
                c.cond.users.append(c)
            bodies = []
            for b in n.bodies:
                nb = FakeBuilder(parent=dst, max_turns=self.graph.max_turns)
                self._clone(b, nb)
                bodies.append(nb)
            c.bodies = tuple(bodies)
            dst.nodes.append(c)
            self._nodes[n.index] = (n, c)

    @property
    def launches(self) -> int:
        return self.graph.launches

    def launch(self, times: int = 1, order="creation") -> "FakeExec":
        self.graph.launch(times, order)
        return self

    # -- per-node updates --------------------------------------------------------------------
    def _target(self, node, kind) -> FakeNode:
        orig, clone = self._nodes.get(getattr(node, "index", None), (None, None))
        if orig is not node:
            raise FakeCudaError(f"fake CUDA: {node!r} is not a node of this graph's definition")
        if clone.kind != kind:
            raise FakeCudaError(f"fake CUDA: a {kind} update of a {clone.kind} node")
        if self.node_updates == "none" or (self.node_updates == "top" and clone.graph is not self.graph):
            raise FakeCudaError(f"fake CUDA (node_updates={self.node_updates!r}): no per-node update of {node!r}"
                                + (" inside a conditional body" if clone.graph is not self.graph else ""))
        return clone

    def update_kernel(self, node, args):
        c = self._target(node, "kernel")
        args = self._map(tuple(args), self._conds)
        sets = self.graph._check_args(c.module, c.entry, c.grid, c.block, args)
        if sets is not c.sets:
            raise FakeCudaError(f"fake CUDA: an update of {node!r} changes the condition it sets")
        c.args = args
        self.updates.append(("kernel", node.index))

    def update_memcpy(self, node, dst, src):
        c = self._target(node, "memcpy")
        if not (isinstance(dst, np.ndarray) and isinstance(src, np.ndarray)) or dst.nbytes != c.dst.nbytes \
                or src.nbytes != dst.nbytes:
            raise FakeCudaError(f"fake CUDA: a memcpy update of {node!r} changes its size")
        c.dst, c.src = dst, src
        self.updates.append(("memcpy", node.index))

    def update_memset(self, node, dst, value):
        c = self._target(node, "memset")
        if not isinstance(dst, np.ndarray) or dst.nbytes != c.dst.nbytes or not 0 <= int(value) < 256:
            raise FakeCudaError(f"fake CUDA: a memset update of {node!r} changes its size")
        c.dst, c.value = dst, int(value)
        self.updates.append(("memset", node.index))

    # -- whole-graph update ------------------------------------------------------------------
    @staticmethod
    def _shape(b: FakeBuilder):
        return [(n.kind, n.index, tuple(a.index for a in n.after), getattr(n.module, "name", None), n.entry,
                 n.count, n.cond.index if n.cond is not None else None, [FakeExec._shape(x) for x in n.bodies])
                for n in b.nodes]

    def update(self, definition: FakeBuilder):
        """cuGraphExecUpdate: take every node's parameters from `definition`, whose topology must be
        this graph's."""
        definition.validate()
        if len(definition.conditions) != len(self.graph.conditions) or \
                self._shape(definition) != self._shape(self.definition):
            raise FakeCudaError("fake CUDA: whole-graph update from a definition of another topology "
                                "(CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED)")
        conds = {id(c): self.graph.conditions[c.index] for c in definition.conditions}

        def walk(b):
            for n in b.nodes:
                yield n
                for x in n.bodies:
                    yield from walk(x)
        for n in walk(definition):
            c = self._nodes[n.index][1]
            c.args = self._map(n.args, conds)
            c.grid, c.block, c.dst, c.src, c.value, c.fn = n.grid, n.block, n.dst, n.src, n.value, n.fn
        self.updates.append(("graph", None))


class FakeStream:
    """Launches wait here until the runtime syncs the stream."""

    def __init__(self):
        self.pending: list = []


class FakeRuntime:
    """The runtime of the 'fake-cuda' backend (the runtime protocol of eagle_fx.backends.cuda_graph):
    NumPy arrays are device memory, graphs are FakeExecs interpreted in `order`, launches are
    deferred to sync.

    node_updates: what per-node updates the instantiated graphs take ('all', 'top', 'none');
    graph_updates: whether whole-graph updates are taken (False: bind has to re-instantiate)."""

    name = "fake-cuda"

    def __init__(self, order="creation", node_updates="all", graph_updates=True):
        self.order, self.node_updates, self.graph_updates = order, node_updates, graph_updates
        self._stream = FakeStream()
        self.launches = 0
        self.syncs = 0
        self.instantiations = 0
        self.eager: list = []                  # the FakeBuilders of eager kernel calls

    def __repr__(self):
        return f"<FakeRuntime order={self.order!r} node_updates={self.node_updates!r}>"

    # memory
    @staticmethod
    def is_device(a) -> bool:
        return isinstance(a, np.ndarray)

    def device_arrays(self, arrays, names=None, api="eagle_fx") -> list:
        names = list(names) if names is not None else [None] * len(arrays)
        out = []
        for a, name in zip(arrays, names):
            what = f"{api}: " + (f"the array argument {name!r}" if name else "an array the builder reached")
            if not isinstance(a, np.ndarray):
                raise ValueError(f"{what} is a {type(a).__name__}; the fake-cuda backend's device memory is "
                                 "NumPy arrays")
            self.check_array(a, what)
            out.append(a)
        return out

    @staticmethod
    def check_array(a, what="eagle_fx: an array"):
        if not a.flags.c_contiguous:
            raise ValueError(f"{what} is not C-contiguous (strides {a.strides}); CUDA kernels read planes "
                             "densely: pass cupy.ascontiguousarray(...)")

    @staticmethod
    def zeros(shape, dtype):
        return np.zeros(tuple(shape), np.dtype(dtype))

    @staticmethod
    def empty(shape, dtype):
        """Uninitialised memory: filled with 0xA5 bytes, so a value read before it is written shows."""
        dt = np.dtype(dtype)
        return np.full(int(np.prod(shape, dtype=np.int64)) * dt.itemsize, 0xA5, np.uint8).view(dt).reshape(tuple(shape))

    @staticmethod
    def to_device(host):
        return np.array(host, copy=True, order="C")

    @staticmethod
    def overlaps(a, b) -> bool:
        return bool(np.shares_memory(a, b))

    # graphs
    @staticmethod
    def builder():
        return FakeBuilder()

    def instantiate(self, builder):
        self.instantiations += 1
        return builder.instantiate(self.node_updates)

    def stream(self):
        return self._stream

    def launch(self, graph, stream):
        stream.pending.append(graph)
        self.launches += 1

    def sync(self, stream):
        self.syncs += 1
        pending, stream.pending = stream.pending, []
        for graph in pending:
            graph.launch(1, self.order)

    def update_kernel(self, graph, node):
        graph.update_kernel(node.handle, node.args)

    def update_memcpy(self, graph, node):
        graph.update_memcpy(node.handle, node.dst, node.src)

    def update_memset(self, graph, node):
        graph.update_memset(node.handle, node.dst, node.args[0] if node.args else 0)

    def update_graph(self, graph, builder):
        if not self.graph_updates:
            raise FakeCudaError("fake CUDA (graph_updates=False): no whole-graph update")
        graph.update(builder)

    def run_now(self, steps):
        """Eager kernels: after what the stream holds, as a one-off chain of nodes."""
        self.sync(self._stream)
        fb = FakeBuilder()
        last = ()
        for st in steps:
            if st[0] == "memset":
                last = (fb.memset(st[1], st[2], after=last),)
            else:
                _, module, entry, grid, block, args = st
                last = (fb.kernel(module, entry, grid, block, args, after=last),)
        fb.validate().launch(1, self.order)
        self.eager.append(fb)


def _revolve_step(state, T, K, start):
    """eagle_revolve_step (cuda_lower.py), line for line: (action kind, its turn or slot)."""
    t0, t1 = state[6:6 + K], state[6 + K:6 + 2 * K]
    if start:
        if T > 0:
            state[0] = state[1] = state[2] = 0
            t0[0], t1[0] = 0, T
            return 2, 0
        return 4, 0
    while True:
        lvl = int(state[1])
        if state[0] == 0:
            if t1[lvl] > t0[lvl]:
                n, spare = int(t1[lvl] - t0[lvl]), K - 1 - lvl
                if n == 1 or spare == 0:
                    state[3], state[4] = t1[lvl] - 1, 0
                else:
                    state[3], state[4] = t0[lvl] + checkpoint.split(n, spare + 1), 1
                state[0] = 1
            else:
                if lvl == 0:
                    return 4, 0
                t1[lvl - 1] = t0[lvl]
                state[1] = lvl - 1
                continue
        if state[0] == 1:
            state[0] = 2
            if not state[2] <= state[3] or state[2] < t0[lvl]:
                state[2] = t0[lvl]
                return 3, lvl
        if state[2] < state[3]:
            state[2] += 1
            return 0, int(state[2]) - 1
        state[0] = 0
        if state[4] == 0:
            t1[lvl] -= 1
            return 1, int(t1[lvl])
        t0[lvl + 1], t1[lvl + 1] = state[3], t1[lvl]
        state[1] = lvl + 1
        return 2, lvl + 1


def _no_race(node, reads, writes):
    """Refuse a kernel that reads an array overlapping one it writes, unless it is that very view
    (each thread then reads the sample it writes): on a GPU its threads race."""
    for r in reads:
        for w in writes:
            if np.shares_memory(r, w) and not (r.shape == w.shape and r.strides == w.strides
                                               and r.__array_interface__["data"][0] == w.__array_interface__["data"][0]):
                raise FakeCudaError(f"fake CUDA: {node.entry} reads an {_describe(r)} that overlaps an {_describe(w)} it "
                                    "writes (not as the same view): on a GPU its threads race")


def _acc_view(ws, red):
    dt = np.dtype(red.acc_dtype)
    return _nbytes_view(ws)[red.offset:red.offset + dt.itemsize * red.size].view(dt)


def _identity(kind, dtype):
    dt = np.dtype(dtype)
    if kind == "sum":
        return 0
    if dt.kind == "f":
        return -np.inf if kind == "max" else np.inf
    info = np.iinfo(dt)
    return info.min if kind == "max" else info.max


def _describe(a) -> str:
    if isinstance(a, np.ndarray):
        return f"array {a.dtype}{list(a.shape)}"
    if isinstance(a, np.generic):
        return f"{a.dtype} scalar"
    return type(a).__name__
