"""The CUDA backend's lowering: a staged Program becomes one CUDA graph with conditional nodes.

`lower(program, input_arrays, keep, n, builder)` plans memory once and adds every node of the
graph through `builder`, a small graph-builder protocol (below). It returns a `CudaPlan`, which
keeps the node tree, the device buffers and the kernel modules. The same lowering runs against
`CoreGraphBuilder` (cuda.core >= 1.0 explicit graphs, CuPy arrays; needs a GPU) and against
`eagle_fx.backends.fake_cuda.FakeBuilder` (a recording fake that interprets the plan with NumPy),
which is how it is tested on machines without a GPU.

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

What a Program becomes
    memory   every Var gets a buffer slot, planned once, as the NumPy backend does: `inplace`
             outputs share their input's slot (Mutable writes land in the caller's array, loop
             carries stay in one buffer), values an arm or body produces are written straight into
             the construct's output slot when nothing later still reads that slot, top-level
             temporaries reuse freed slots by liveness. Input slots are the caller's arrays.
    call     the kernel body emitted by hawk_fx.emit.cuda, in a module named by a hash of its CUDA
             source (so of its body and dtypes): `hawk_<sha256[:16]>`. A body with a sample
             reduction first initialises its workspace (a memset when the identities are zero,
             else its `_init` entry), then its map entries, then its `_finish` entry.
    opaque   a host node (refused inside a device if/loop: bodies cannot hold host nodes). Its
             function runs on the host and must not call CUDA; it sees the arrays it closed over.
    cond     `set_cond_from_cell` (emitter guard) then IF-ELSE; an elif nests an IF-ELSE in the
             else body. An arm with no work gets an empty node.
    switch   `eagle_switch_index` maps the cell to the index of the first equal case (the default
             is last, index k), `set_cond_from_value` sets the handle, then SWITCH with k+1 bodies.
    while    the carries are copied into the loop's buffers, the guard program is evaluated, a
             guard kernel sets the condition, then WHILE; its body is the body program, the copies
             into the carry buffers, the guard program again and, last, the guard kernel (after
             every other node of the body, so no grid-wide sync is needed):
               uncapped, no turn counter needed  set_cond_from_cell / set_cond_from_cell
               capped or counted, no guard cell  count_start / count_step   (trips: a cap cell or
                                                                             the trip-count cell)
               a guard cell and a counter        eagle_loop_start / eagle_loop_step
             The turn counter (a device cell, reset at loop entry) holds the turn index during the
             body, and the number of turns after the loop.
    cell_not/and/or  one-thread kernels eagle_cell_not/and/or.
    record   a memcpy into the record buffer; inside device loops, `eagle_record_copy_d<depth>`,
             which indexes the record by the enclosing loops' turn counters (writes beyond a
             record's capacity are dropped). A loop's turn count is written by eagle_record_turns.
    forks    nodes follow program order, except that the branches of one `parallel` region
             (eqn.info.branch paths) are independent chains; an equation after the region joins
             them. Edges for buffer hazards (read-after-write, write-after-read, write-after-write
             on one slot) are added too, so a `wait`, or a slot reused across branches, is ordered.

Running (what eagle_fx.Graph uses; Graph.build picks the backend with `choose`)
    CudaExecutable  the NumpyExecutable interface over one lowered, instantiated graph: replay(times)
                    (launches, then waits), enqueue(times) / synchronize() (asynchronous on the
                    stream), array_of(var), rebind(input_index, array) (per-node updates of the
                    instantiated graph; a whole-graph update where those are refused), records.
    runtimes        CoreRuntime: CuPy memory and cuda.core graphs on CuPy's current device and
                    stream (needs a GPU); fake_cuda.FakeRuntime: the recording fake ("fake-cuda").
    call_kernel     a hawk kernel called eagerly on CuPy arrays: its entries launched directly.
    choose          CuPy (__cuda_array_interface__) arrays -> 'cuda', NumPy arrays -> 'numpy';
                    eagle.Graph(backend=...) or `with use_backend(...)` overrides it.

`require_gpu()` is the refusal for running on CuPy arrays where there is no GPU stack (raised when
a graph over CuPy arrays is built or a kernel is called on them, never at import).
"""
from __future__ import annotations

import hashlib
import threading
import weakref
from dataclasses import dataclass

import numpy as np

from hawk_fx.core import Literal, Program, Var
from hawk_fx.emit import cuda as hcuda

from .. import ir
from ..analysis import direct_outputs

BLOCK = hcuda.BLOCK        # threads per block of the grid-stride map kernels
MAX_GRID = 1024            # blocks at most; the map kernels stride over the rest
MAX_RECORD_DEPTH = 4       # device loops nested around a `record`, at most

INSTALL_HINT = "pip install -e '.[cuda12]'   (CUDA 13 drivers: pip install -e '.[cuda13]')"
MIN_DRIVER = 12080         # IF-ELSE and SWITCH conditional nodes need CUDA driver 12.8


# ---------------------------------------------------------------------------------------------
# the refusal

class GpuUnavailableError(NotImplementedError):
    """CuPy arrays were given, but the GPU stack (CuPy, cuda.core, a device, a recent driver) is not
    usable here. A RuntimeError (NotImplementedError derives from it), as kernels' refusals of
    device arrays always were."""


def require_gpu(what: str = "CuPy arrays run as CUDA graphs") -> int:
    """Check that CuPy, cuda.core and a CUDA device (driver >= 12.8) are usable; return the driver
    version (e.g. 12080). Raises GpuUnavailableError (a RuntimeError) naming what is missing and how
    to install it; `what` starts the message (what needed the GPU)."""
    missing = []
    try:
        import cupy
    except Exception as exc:                      # ImportError, or a broken install
        cupy = None
        missing.append(f"cupy (the cupy-cuda12x wheel; import failed: {exc})")
    try:
        import cuda.core  # noqa: F401
    except Exception as exc:
        missing.append(f"cuda.core (the cuda-core wheel; import failed: {exc})")
    if missing:
        raise GpuUnavailableError(f"eagle_fx: {what}, which needs " + " and ".join(missing)
                                  + f"; install the CUDA extra: {INSTALL_HINT}; or pass NumPy arrays to run on the CPU")
    try:
        count = int(cupy.cuda.runtime.getDeviceCount())
        driver = int(cupy.cuda.runtime.driverGetVersion())
    except Exception as exc:
        raise GpuUnavailableError(f"eagle_fx: {what}, which needs a CUDA device and its driver; "
                                  f"none is usable here ({type(exc).__name__}: {exc}); run on a machine with an NVIDIA "
                                  "GPU (the packages come with: " + INSTALL_HINT + "), or pass NumPy arrays to run on "
                                  "the CPU") from exc
    if count < 1:
        raise GpuUnavailableError(f"eagle_fx: {what}, which needs a CUDA device; the driver reports none; pass "
                                  "NumPy arrays to run on the CPU")
    if driver < MIN_DRIVER:
        raise GpuUnavailableError(f"eagle_fx: CUDA graphs with IF-ELSE and SWITCH nodes need a CUDA driver >= 12.8; "
                                  f"this one is {driver // 1000}.{driver % 1000 // 10}; update the NVIDIA driver, or "
                                  "pass NumPy arrays to run on the CPU")
    return driver


# ---------------------------------------------------------------------------------------------
# kernel modules

@dataclass(frozen=True, eq=False)
class KernelModule:
    """CUDA C compiled as one module. kind: 'body' (a hawk kernel body: `emitted` is its
    EmittedKernel, `spec` the hawk Specialization it came from), 'guard' (the emitter's guard
    kernels) or 'lowering' (this module's small kernels)."""
    name: str
    source: str
    entries: tuple
    kind: str
    emitted: object = None
    spec: object = None
    label: str = ""

    def __repr__(self):
        return f"<KernelModule {self.name} {self.kind}{' ' + self.label if self.label else ''}>"


GUARDS = KernelModule("hawk_guards", hcuda.guard_source(), tuple(hcuda.GUARD_KERNELS), "guard", label="guards")


def _record_kernels(depth: int) -> str:
    levels = "".join(f", const unsigned int* t{k}, unsigned int cap{k}, unsigned long long stride{k}"
                     for k in range(depth))
    inside = " && ".join(f"*t{k} < cap{k}" for k in range(depth)) or "true"
    offset = " + ".join(f"(unsigned long long)(*t{k}) * stride{k}" for k in range(depth)) or "0ull"
    return f"""
extern "C" __global__ void eagle_record_copy_d{depth}(unsigned char* dst, const unsigned char* src,
                                                   unsigned long long nbytes{levels}) {{
    if (!({inside})) return;
    unsigned char* d = dst + ({offset});
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < nbytes;
         i += (unsigned long long)gridDim.x * blockDim.x) d[i] = src[i]; }}
extern "C" __global__ void eagle_record_turns_d{depth}(unsigned char* dst, const unsigned int* counter{levels}) {{
    if (blockIdx.x != 0 || threadIdx.x != 0 || !({inside})) return;
    *(long long*)(dst + ({offset})) = (long long)(*counter); }}
"""


# TODO(hawk_fx.emit.cuda): the emitter's guard_source() has no guard that reads a guard cell AND a
# trip counter (a capped `for _ in range(N): if not cell: break`, a counted loop with a break, or
# an uncapped loop whose body reads its turn counter). eagle_loop_start/step below are that guard,
# kept here until the emitter has one; `trips` and `cell` may be null (no cap / no guard cell).
_LOWERING_SOURCE = hcuda.GUARD_PRELUDE + r"""
extern "C" __global__ void eagle_loop_start(cudaGraphConditionalHandle handle, unsigned int* counter,
                                            const unsigned int* trips, const unsigned int* cell) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    *counter = 0u;
    const bool go = (trips == nullptr || 0u < *trips) && (cell == nullptr || *cell != 0u);
    cudaGraphSetConditional(handle, go ? 1u : 0u); }
extern "C" __global__ void eagle_loop_step(cudaGraphConditionalHandle handle, unsigned int* counter,
                                           const unsigned int* trips, const unsigned int* cell) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    const unsigned int c = *counter + 1u;
    *counter = c;
    const bool go = (trips == nullptr || c < *trips) && (cell == nullptr || *cell != 0u);
    cudaGraphSetConditional(handle, go ? 1u : 0u); }
extern "C" __global__ void eagle_cell_not(unsigned int* out, const unsigned int* a) {
    if (blockIdx.x == 0 && threadIdx.x == 0) *out = *a == 0u ? 1u : 0u; }
extern "C" __global__ void eagle_cell_and(unsigned int* out, const unsigned int* a, const unsigned int* b) {
    if (blockIdx.x == 0 && threadIdx.x == 0) *out = (*a != 0u && *b != 0u) ? 1u : 0u; }
extern "C" __global__ void eagle_cell_or(unsigned int* out, const unsigned int* a, const unsigned int* b) {
    if (blockIdx.x == 0 && threadIdx.x == 0) *out = (*a != 0u || *b != 0u) ? 1u : 0u; }
extern "C" __global__ void eagle_switch_index(unsigned int* index, const unsigned int* cell,
                                              const long long* cases, unsigned int count) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    const long long v = (long long)(*cell);
    unsigned int k = count;                        // no case matches: the default, last
    for (unsigned int i = 0; i < count; ++i) { if (cases[i] == v) { k = i; break; } }
    *index = k; }
// slice / update / concat (ir.STRUCTURE): element i of a C-order walk over `shape` is copied from
// src + soff + sum(idx * sstride) to dst + doff + sum(idx * dstride); geom = shape[ndim],
// sstride[ndim], dstride[ndim], soff, doff, all in bytes
extern "C" __global__ void eagle_strided_copy(unsigned char* dst, const unsigned char* src, const long long* geom,
                                              unsigned int ndim, unsigned long long count, unsigned int itemsize) {
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < count;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        unsigned long long r = i;
        long long s = geom[3 * ndim], d = geom[3 * ndim + 1];
        for (int k = (int)ndim - 1; k >= 0; --k) {
            const unsigned long long e = r % (unsigned long long)geom[k];
            r /= (unsigned long long)geom[k];
            s += (long long)e * geom[ndim + k];
            d += (long long)e * geom[2 * ndim + k];
        }
        if (itemsize == 8u) *(unsigned long long*)(dst + d) = *(const unsigned long long*)(src + s);
        else if (itemsize == 4u) *(unsigned int*)(dst + d) = *(const unsigned int*)(src + s);
        else for (unsigned int b = 0; b < itemsize; ++b) dst[d + b] = src[s + b];
    } }
""" + "".join(_record_kernels(d) for d in range(MAX_RECORD_DEPTH + 1))

_LOWERING_ENTRIES = ("eagle_loop_start", "eagle_loop_step", "eagle_cell_not", "eagle_cell_and", "eagle_cell_or",
                     "eagle_switch_index", "eagle_strided_copy") + tuple(f"eagle_record_{w}_d{d}" for d in range(MAX_RECORD_DEPTH + 1)
                                                   for w in ("copy", "turns"))
LOWERING = KernelModule("eagle_lowering", _LOWERING_SOURCE, _LOWERING_ENTRIES, "lowering", label="lowering")

_body_modules: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()     # Specialization -> KernelModule


def body_module(spec) -> KernelModule:
    """The CUDA module of a hawk Specialization, named by the hash of its source (cached)."""
    mod = _body_modules.get(spec)
    if mod is None:
        probe = hcuda.emit_specialization(spec, "hawk_body")
        digest = hashlib.sha256(probe.source.encode()).hexdigest()[:16]
        ek = hcuda.emit_specialization(spec, f"hawk_{digest}")
        mod = KernelModule(ek.name, ek.source, tuple(ek.entry_names()), "body", ek, spec, spec.kernel.name)
        _body_modules[spec] = mod
    return mod


# ---------------------------------------------------------------------------------------------
# the plan

class PlanNode:
    """One node of the lowered graph. kind: 'kernel' | 'memset' | 'memcpy' | 'host' | 'join' |
    'if' | 'if_else' | 'switch' | 'while'. role of a kernel: 'body' (a hawk entry), 'init' (a
    workspace init entry), 'guard' (sets `cond`), 'cell' (cell logic), 'select' (switch index), 'copy'
    (eagle_strided_copy: slice, update, concat),
    'record'. For a conditional node `cond` is the condition it reads, `bodies` its body trees."""

    __slots__ = ("kind", "role", "label", "handle", "after", "module", "entry", "grid", "block", "args", "cond",
                 "bodies", "dst", "src")

    def __init__(self, kind, handle, after, role="", label="", module=None, entry=None, grid=None, block=None,
                 args=(), cond=None, bodies=(), dst=None, src=None):
        self.kind, self.handle, self.after, self.role, self.label = kind, handle, tuple(after), role, label
        self.module, self.entry, self.grid, self.block, self.args = module, entry, grid, block, tuple(args)
        self.cond, self.bodies, self.dst, self.src = cond, list(bodies), dst, src

    def __repr__(self):
        what = self.entry if self.kind == "kernel" else ""
        return f"<PlanNode {self.kind}{' ' + self.role if self.role else ''} {self.label or what}>".replace("  ", " ")


class CudaPlan:
    """A lowered Program: the node tree (`tree`: top-level nodes in creation order, each
    conditional node holding its bodies' trees), the device buffers, modules and conditions."""

    def __init__(self, program, n, builder):
        self.program, self.n, self.builder = program, n, builder
        self.tree: list[PlanNode] = []
        self.end: PlanNode | None = None       # the last node: every other top-level node is before it
        self.slots: list = []
        self.slot_of: dict = {}
        self.input_slots: list[int] = []
        self.modules: dict[str, KernelModule] = {}
        self.conditions: list = []
        self.records: list = []
        self.constants: list = []
        self.workspaces: list = []

    def array_of(self, var):
        k = self.slot_of.get(var)
        return None if k is None else self.slots[k]

    def walk(self, tree=None, depth=0):
        """(depth, node) for every node, bodies after their conditional node."""
        for node in self.tree if tree is None else tree:
            yield depth, node
            for body in node.bodies:
                yield from self.walk(body, depth + 1)

    def nodes(self, kind=None, role=None):
        return [nd for _, nd in self.walk() if (kind is None or nd.kind == kind) and (role is None or nd.role == role)]

    def pretty(self) -> str:
        """The node tree as indented text: one line per node."""
        names, lines = {}, []

        def name(nd):
            return names.setdefault(id(nd), f"n{len(names)}")

        conds = {}

        def cname(c):
            return conds.setdefault(id(c), f"c{len(conds)}")

        def emit(tree, depth):
            for nd in tree:
                head = f"{'  ' * depth}{name(nd)} {nd.kind}"
                if nd.kind == "kernel":
                    head += f" {nd.role} {nd.entry}" + (f" ({nd.label})" if nd.label and nd.role == "body" else "")
                    head += f" <<<{nd.grid},{nd.block}>>>"
                    if nd.cond is not None:
                        head += f" sets {cname(nd.cond)}"
                elif nd.kind in ("if", "if_else", "switch", "while"):
                    head += f" on {cname(nd.cond)}"
                elif nd.label:
                    head += f" {nd.label}"
                if nd.after:
                    head += " after " + ",".join(name(a) for a in nd.after)
                lines.append(head)
                for k, body in enumerate(nd.bodies):
                    lines.append(f"{'  ' * (depth + 1)}[{_body_name(nd.kind, k, len(nd.bodies))}]")
                    emit(body, depth + 2)
        emit(self.tree, 0)
        return "\n".join(lines)

    def compile(self, arch: str = "sm_90") -> dict:
        """Compile every module with NVRTC (no GPU needed): {module name: cubin bytes}."""
        return {name: hcuda.compile_cubin(m.source, arch) for name, m in self.modules.items()}

    def instantiate(self):
        """The executable graph (the builder's `instantiate()`; CoreGraphBuilder has one)."""
        return self.builder.instantiate()


def _body_name(kind, k, count):
    if kind == "if_else":
        return ("then", "else")[k]
    if kind == "switch":
        return f"branch {k}" + (" (default)" if k == count - 1 else "")
    return "body" if kind == "while" else "then"


# ---------------------------------------------------------------------------------------------
# ordering: program order except between sibling branches of a fork, plus buffer hazards

def _ordered(p, q) -> bool:
    """Must items with branch paths p and q run in program order? Not when they sit in different
    branches of one fork."""
    for a, b in zip(p, q):
        if a != b:
            return a[0] != b[0]
    return True


class _Level:
    """One graph (the top-level graph or a body) and its node tree."""

    def __init__(self, builder, tree):
        self.builder, self.tree = builder, tree


class _Item:
    __slots__ = ("path", "tail", "anc")

    def __init__(self, path, tail, anc):
        self.path, self.tail, self.anc = path, tail, anc


class _Seq:
    """The items (equations, copies) of one program on one level, each a chain of nodes."""

    def __init__(self, low, level, start=()):
        self.low, self.level, self.start = low, level, tuple(start)
        self.items: list[_Item] = []
        self.writer: dict = {}
        self.readers: dict = {}
        self._open = None

    def open(self, path, reads, writes) -> tuple:
        cands = {j for j, it in enumerate(self.items) if _ordered(it.path, path)}
        for s in reads:
            if s in self.writer:
                cands.add(self.writer[s])
        for s in writes:
            if s in self.writer:
                cands.add(self.writer[s])
            cands |= self.readers.get(s, set())
        anc = set()
        for j in cands:
            anc |= self.items[j].anc
        deps = sorted(cands - anc)
        self._open = (tuple(path), anc | cands)
        return tuple(self.items[j].tail for j in deps) or self.start

    def close(self, tail, reads, writes):
        path, anc = self._open
        k = len(self.items)
        self.items.append(_Item(path, tail, anc))
        for s in reads:
            self.readers.setdefault(s, set()).add(k)
        for s in writes:
            self.writer[s] = k
            self.readers[s] = set()

    def finish(self) -> tuple:
        """The tails no other item follows (or `start` when there are no items)."""
        covered = set()
        for it in self.items:
            covered |= it.anc
        return tuple(it.tail for k, it in enumerate(self.items) if k not in covered) or self.start


class _Chain:
    """Nodes one after another on one level, starting after `after`."""

    def __init__(self, low, level, after):
        self.low, self.level, self.last = low, level, tuple(after)
        self.made = 0

    def deps(self) -> tuple:
        if len(self.last) > 1:
            self.last = (self.low.join(self.level, self.last),)
        return self.last

    def push(self, node):
        self.last = (node,)
        self.made += 1
        return node

    def kernel(self, module, entry, grid, block, args, role, label="", cond=None):
        return self.push(self.low.kernel(self.level, self.deps(), module, entry, grid, block, args, role, label, cond))

    def memcpy(self, dst, src, label=""):
        return self.push(self.low.memcpy(self.level, self.deps(), dst, src, label))

    def memset(self, dst, value, label=""):
        return self.push(self.low.memset(self.level, self.deps(), dst, value, label))

    def tail(self):
        if not self.made:
            raise AssertionError("eagle_fx CUDA lowering: an equation made no node")
        return self.deps()[0]


# ---------------------------------------------------------------------------------------------
# the lowering

def lower(program: Program, input_arrays, keep, n: int, builder, records=None) -> CudaPlan:
    """Lower `program` into a CUDA graph through `builder` (the protocol in the module docstring).
    input_arrays: the device arrays of program.inputs (they are used in place); keep: Vars whose
    buffers must survive (results, buffer= planes); n: the graph's sample count; records: the
    record buffers of a record=True forward (device arrays, in record-slot order)."""
    return _Lowering(program, input_arrays, keep, n, builder, records).plan


def _has_records(prog: Program) -> bool:
    for e in prog.eqns:
        if e.prim is ir.record_p or (e.prim is ir.while_p and e.params.get("record_turns") is not None):
            return True
    return any(_has_records(p) for p in prog.subprograms())


def _region(aval, index):
    """(shape, byte strides, byte offset) of `index` (ints and ranges, None: all) of a C-order array."""
    strides = _c_strides(aval.shape, aval.dtype.itemsize) if aval.shape else []
    if index is None:
        return tuple(aval.shape) or (1,), list(strides) or [aval.dtype.itemsize], 0
    shape, out, off = [], [], 0
    for r, st in zip(index, strides):
        if isinstance(r, range):
            shape.append(len(r))
            out.append(st * r.step)
            off += r.start * st
        else:
            off += r * st
    return tuple(shape), out, off


def _c_strides(shape, itemsize):
    strides, acc = [], itemsize
    for d in reversed(shape):
        strides.append(acc)
        acc *= d
    return tuple(reversed(strides))


class _Lowering:
    def __init__(self, prog, input_arrays, keep, n, builder, records):
        self.prog, self.builder = prog, builder
        self.plan = plan = CudaPlan(prog, n, builder)
        self.slots, self.slot_of = plan.slots, plan.slot_of
        self.records = list(records or [])
        plan.records = self.records
        self.reuse = records is None
        self.consts: dict = {}
        self.pool: dict = {}
        self.pooled: set = set()
        self.slot_paths: dict = {}       # top-level slot -> branch paths of the equations that used it
        self.loops: list = []            # (counter slot, record capacity) of the enclosing device loops
        self.depth = 0                   # conditional bodies around the current node
        input_arrays = list(input_arrays)
        if len(input_arrays) != len(prog.inputs):
            raise ValueError(f"eagle_fx CUDA lowering: {len(input_arrays)} input arrays for a program of "
                             f"{len(prog.inputs)} inputs")
        for v, arr in zip(prog.inputs, input_arrays):
            if tuple(arr.shape) != v.aval.shape or np.dtype(arr.dtype) != v.aval.dtype:
                raise ValueError(f"eagle_fx CUDA lowering: an input array is {tuple(arr.shape)} {arr.dtype}, the "
                                 f"program's input is {v.aval.shape} {v.aval.dtype}")
            self.slot_of[v] = self._new_slot(arr)
            plan.input_slots.append(self.slot_of[v])
        self.keep = set(keep) | {a for a in prog.outputs if isinstance(a, Var)}
        top = _Level(builder, plan.tree)
        sinks = self._gen_top(top)
        plan.end = sinks[0] if len(sinks) == 1 else (self.join(top, sinks) if sinks else None)

    # -- memory ------------------------------------------------------------------------------
    def _new_slot(self, arr) -> int:
        self.slots.append(arr)
        return len(self.slots) - 1

    def _zeros(self, shape, dtype):
        return self.builder.zeros(tuple(shape), np.dtype(dtype))

    def _alloc(self, aval, path=()) -> int:
        """A top-level slot: a freed one whose users all run in order with `path` (reusing a slot
        of a sibling branch would serialise the branches), else a new one."""
        free = self.pool.get((aval.shape, aval.dtype))
        for i in range(len(free or ()) - 1, -1, -1):
            if all(_ordered(q, path) for q in self.slot_paths.get(free[i], ())):
                return free.pop(i)
        k = self._new_slot(self._zeros(aval.shape, aval.dtype))
        self.pooled.add(k)
        return k

    def _free(self, k):
        if k in self.pooled and self.reuse:
            arr = self.slots[k]
            self.pool.setdefault((tuple(arr.shape), np.dtype(arr.dtype)), []).append(k)

    def _sub_slot(self, aval) -> int:
        return self._new_slot(self._zeros(aval.shape, aval.dtype))

    def _ref(self, slot, aval) -> Var:
        v = Var(aval)
        self.slot_of[v] = slot
        return v

    def const(self, value, dtype, shape=None):
        """A device array holding a constant (uploaded once, shared by equal constants)."""
        host = np.asarray(value, dtype=dtype)
        if shape is not None:
            host = np.broadcast_to(host, shape)
        host = np.ascontiguousarray(host).reshape(host.shape or (1,))
        key = (host.dtype.str, host.shape, host.tobytes())
        arr = self.consts.get(key)
        if arr is None:
            arr = self.consts[key] = self.builder.to_device(host)
            self.plan.constants.append(arr)
        return arr

    def buf(self, atom, aval=None):
        """The device array of an operand: its slot, or a constant for a Literal."""
        if isinstance(atom, Literal):
            aval = aval or atom.aval
            return self.const(atom.value, aval.dtype, aval.shape if aval.shape else None)
        return self.slots[self.slot_of[atom]]

    # -- nodes -------------------------------------------------------------------------------
    def _add(self, level, node):
        level.tree.append(node)
        return node

    @staticmethod
    def _h(after):
        return tuple(a.handle for a in after)

    def kernel(self, level, after, module, entry, grid, block, args, role, label="", cond=None):
        if entry not in module.entries:
            raise ValueError(f"eagle_fx CUDA lowering: {module.name} has no entry {entry!r}")
        self.plan.modules.setdefault(module.name, module)
        h = level.builder.kernel(module, entry, int(grid), int(block), tuple(args), after=self._h(after))
        return self._add(level, PlanNode("kernel", h, after, role, label, module, entry, grid, block, args, cond))

    def memcpy(self, level, after, dst, src, label=""):
        h = level.builder.memcpy(dst, src, after=self._h(after))
        return self._add(level, PlanNode("memcpy", h, after, label=label, dst=dst, src=src))

    def memset(self, level, after, dst, value, label=""):
        h = level.builder.memset(dst, int(value), after=self._h(after))
        return self._add(level, PlanNode("memset", h, after, label=label, dst=dst, args=(int(value),)))

    def join(self, level, after, label="join"):
        h = level.builder.join(self._h(after))
        return self._add(level, PlanNode("join", h, after, label=label))

    def host(self, level, after, fn, label=""):
        h = level.builder.host(fn, after=self._h(after))
        return self._add(level, PlanNode("host", h, after, label=label))

    def condition(self, level):
        c = level.builder.create_condition(0)
        self.plan.conditions.append(c)
        return c

    def conditional(self, level, after, kind, cond, count=None, label=""):
        b, a = level.builder, self._h(after)
        if kind == "if":
            h, body = b.if_then(cond, after=a)
            bodies = [body]
        elif kind == "if_else":
            h, bodies = b.if_else(cond, after=a)
        elif kind == "switch":
            h, bodies = b.switch(cond, count, after=a)
        else:
            h, body = b.while_loop(cond, after=a)
            bodies = [body]
        bodies = list(bodies)
        node = self._add(level, PlanNode(kind, h, after, label=label, cond=cond, bodies=[[] for _ in bodies]))
        return node, [_Level(bb, tree) for bb, tree in zip(bodies, node.bodies)]

    def _seal(self, level):
        """A body with no work gets an empty node (an empty body graph is not relied on)."""
        if not level.tree:
            self.join(level, (), label="empty")

    # -- generation --------------------------------------------------------------------------
    def _gen_top(self, level):
        prog = self.prog
        seq = _Seq(self, level)
        last_use: dict = {}
        for i, e in enumerate(prog.eqns):
            for a in e.inputs:
                if isinstance(a, Var):
                    last_use[a] = i
        holder: dict = {}
        for i, e in enumerate(prog.eqns):
            self._gen_eqn(seq, prog, i, e, {}, top=True)
            for v in e.outputs:
                holder[self.slot_of[v]] = v
            dead = [a for a in e.inputs if isinstance(a, Var) and last_use.get(a) == i and a not in self.keep]
            dead += [v for v in e.outputs if v not in last_use and v not in self.keep]
            for a in dead:
                k = self.slot_of.get(a)
                if k is not None and holder.get(k) is a:
                    holder.pop(k)
                    self._free(k)
        return seq.finish()

    def _out_slot(self, v, pre, top, path=()):
        if v in pre:
            return pre[v]
        return self._alloc(v.aval, path) if top else self._sub_slot(v.aval)

    def _gen_eqn(self, seq, prog, idx, e, pre, top=False):
        inplace = dict(e.params.get("inplace", ()) or ())
        outs = []
        for j, v in enumerate(e.outputs):
            if j in inplace:
                self.slot_of[v] = self.slot_of[e.inputs[inplace[j]]]
            else:
                self.slot_of[v] = self._out_slot(v, pre, top, e.info.branch)
            outs.append(self.slot_of[v])
        reads = {self.slot_of[a] for a in e.inputs if isinstance(a, Var)}
        writes = set(outs)
        if top:
            for k in reads | writes:
                self.slot_paths.setdefault(k, set()).add(tuple(e.info.branch))
        p = e.prim
        if p is ir.record_p:
            writes = {("record", e.params["slot"])}
        chain = _Chain(self, seq.level, seq.open(e.info.branch, reads, writes))
        if p is ir.call_p:
            self._gen_call(chain, e, outs)
        elif p is ir.opaque_p:
            self._gen_opaque(chain, e)
        elif p is ir.record_p:
            self._gen_record(chain, e)
        elif p in (ir.cell_not_p, ir.cell_and_p, ir.cell_or_p):
            entry = {ir.cell_not_p: "eagle_cell_not", ir.cell_and_p: "eagle_cell_and", ir.cell_or_p: "eagle_cell_or"}[p]
            args = [self.slots[outs[0]]] + [self.buf(a, ir.U32_CELL) for a in e.inputs]
            chain.kernel(LOWERING, entry, 1, 1, args, "cell", p.name)
        elif p is ir.cond_p:
            self._gen_cond(chain, e, outs)
        elif p is ir.switch_p:
            self._gen_switch(chain, e, outs)
        elif p is ir.while_p:
            self._gen_while(chain, e, outs)
        elif p in ir.STRUCTURE:
            self._gen_structure(chain, e, outs)
        else:
            raise NotImplementedError(f"eagle_fx CUDA lowering: no rule for primitive '{p}'")
        seq.close(chain.tail(), reads, writes)

    def _grid(self, n):
        return max(1, min(-(-int(n) // BLOCK), MAX_GRID))

    def _gen_call(self, chain, e, outs):
        spec, n = e.params["spec"], e.params["n"]
        mod = body_module(spec)
        ek = mod.emitted
        ins = e.inputs[:len(spec.kernel.param_names)]
        ws = None
        if ek.workspace_bytes:
            ws = self._zeros((ek.workspace_bytes,), np.uint8)
            self.plan.workspaces.append(ws)
        args = []
        for prm in ek.params:
            if prm.role in ("in_plane", "in_cell"):
                args.append(self.buf(ins[prm.index]))
            elif prm.role == "in_value":
                a = ins[prm.index]
                if not isinstance(a, Literal):
                    raise NotImplementedError(f"eagle_fx CUDA lowering: {spec.kernel.name} takes input {prm.index} by "
                                              "value, but the graph passes a buffer")
                args.append(np.dtype(prm.dtype).type(a.value))
            elif prm.role in ("out_plane", "out_cell"):
                args.append(self.slots[outs[prm.index]])
            elif prm.role == "workspace":
                args.append(ws)
            elif prm.role == "n":
                args.append(np.uint64(n))
            else:
                raise NotImplementedError(f"eagle_fx CUDA lowering: unknown kernel parameter role {prm.role!r}")
        name = spec.kernel.name
        if ek.reductions:
            if ek.init_is_zero:
                chain.memset(ws, 0, label=f"{name} workspace")
            else:
                chain.kernel(mod, f"{ek.name}_init", 1, 1, args, "init", name)
        for en in ek.entries:
            if en.role == "init":
                continue
            grid, block = (1, 1) if en.launch == "single" else (self._grid(n), BLOCK)
            chain.kernel(mod, en.name, grid, block, args, "body", name)

    def _gen_structure(self, chain, e, outs):
        """slice/update/concat: strided copies (eagle_strided_copy); reshape: a memcpy (both C order)."""
        p, out = e.prim, self.slots[outs[0]]
        if p is ir.reshape_p:
            chain.memcpy(out, self.buf(e.inputs[0]), label="reshape")
            return
        if p is ir.slice_p:
            self._strided(chain, out, e.inputs[0], _region(e.inputs[0].aval, e.params["index"]),
                          _region(e.outputs[0].aval, None), "slice")
        elif p is ir.update_p:
            base, value = e.inputs
            if self.buf(base) is not out:          # a functional update: the base is copied first
                chain.memcpy(out, self.buf(base), label="update")
            self._strided(chain, out, value, _region(value.aval, None),
                          _region(base.aval, e.params["index"]), "update")
        else:
            axis, start, shape = e.params["axis"], 0, e.outputs[0].aval.shape
            for a in e.inputs:
                k = a.aval.shape[axis]
                index = tuple(range(start, start + k) if i == axis else range(d) for i, d in enumerate(shape))
                self._strided(chain, out, a, _region(a.aval, None), _region(e.outputs[0].aval, index), "concat")
                start += k

    def _strided(self, chain, dst, src_atom, src_region, dst_region, label):
        (shape, sstride, soff), (dshape, dstride, doff) = src_region, dst_region
        assert shape == dshape, (shape, dshape)
        count = int(np.prod(shape))
        geom = self.const(list(shape) + list(sstride) + list(dstride) + [soff, doff], np.int64)
        args = [dst, self.buf(src_atom), geom, np.uint32(len(shape)), np.uint64(count),
                np.uint32(src_atom.aval.dtype.itemsize)]
        chain.kernel(LOWERING, "eagle_strided_copy", self._grid(count), BLOCK, args, "copy", label)

    def _gen_opaque(self, chain, e):
        label = e.info.name or getattr(e.params["fn"], "__name__", "fn")
        if self.depth:
            raise NotImplementedError(f"eagle_fx CUDA lowering: the opaque node {label!r} is inside a device if/loop; "
                                      "a CUDA graph's conditional bodies cannot hold host nodes: move it out of the "
                                      "device if/loop, or write it as a kernel")
        chain.push(self.host(chain.level, chain.deps(), e.params["fn"], label))

    def _levels(self):
        out = []
        for ctr, cap in self.loops:
            if cap is None:
                raise NotImplementedError("eagle_fx CUDA lowering: a record inside a device loop with no record "
                                          "capacity (record_cap)")
            out.append((ctr, cap))
        return out

    def _level_args(self, rec_shape, itemsize):
        levels = self._levels()
        strides = _c_strides(rec_shape, itemsize)
        args = []
        for k, (ctr, cap) in enumerate(levels):
            args += [self.slots[ctr], np.uint32(cap), np.uint64(strides[k])]
        return args

    def _gen_record(self, chain, e):
        slot = e.params["slot"]
        if slot >= len(self.records):
            raise ValueError(f"eagle_fx CUDA lowering: the program records into slot {slot}; pass its record buffers "
                             "(records=)")
        rec, src = self.records[slot], self.buf(e.inputs[0])
        depth = len(self.loops)
        if depth == 0:
            chain.memcpy(rec, src, label=f"record {slot}")
            return
        if depth > MAX_RECORD_DEPTH:
            raise NotImplementedError(f"eagle_fx CUDA lowering: a record inside {depth} nested device loops "
                                      f"(at most {MAX_RECORD_DEPTH})")
        nbytes = int(np.prod(e.inputs[0].aval.shape, dtype=np.int64)) * e.inputs[0].aval.dtype.itemsize
        args = [rec, src, np.uint64(nbytes)] + self._level_args(tuple(rec.shape), np.dtype(rec.dtype).itemsize)
        chain.kernel(LOWERING, f"eagle_record_copy_d{depth}", self._grid(max(1, nbytes)), BLOCK, args, "record",
                     f"record {slot}")

    # -- sub-programs ------------------------------------------------------------------------
    def _gen_sub(self, level, start, sub: Program, operands, out_slots) -> tuple:
        """Lower `sub` on `level` after `start`, its inputs bound to the operands' slots and its
        outputs landing in out_slots; returns its tails."""
        seq = _Seq(self, level, start)
        for v, a in zip(sub.inputs, operands):
            if isinstance(a, Literal):
                self.slot_of[v] = self._sub_slot(v.aval)
                self._copy_item(seq, self.slot_of[v], a)
            else:
                self.slot_of[v] = self.slot_of[a]
        pre = direct_outputs(sub, out_slots, self.slot_of)
        for i, e in enumerate(sub.eqns):
            self._gen_eqn(seq, sub, i, e, pre)
        self._gen_copies(seq, sub.outputs, out_slots)
        return seq.finish()

    def _copy_item(self, seq, dst_slot, src):
        """A memcpy as an item of `seq`, ordered after everything before it."""
        dst = self.slots[dst_slot]
        reads = {self.slot_of[src]} if isinstance(src, Var) else set()
        chain = _Chain(self, seq.level, seq.open((), reads, {dst_slot}))
        if isinstance(src, Var):
            chain.memcpy(dst, self.slots[self.slot_of[src]], label="copy")
        else:
            chain.memcpy(dst, self.const(src.value, dst.dtype, tuple(dst.shape)), label="constant")
        seq.close(chain.tail(), reads, {dst_slot})

    def _gen_copies(self, seq, srcs, out_slots):
        pending = [(s, a) for a, s in zip(srcs, out_slots) if isinstance(a, Literal) or self.slot_of[a] != s]
        dests = {s for s, _ in pending}
        staged = []
        for s, a in pending:                 # a source that is also a destination: copy it aside first
            if isinstance(a, Var) and self.slot_of[a] in dests:
                t = self._sub_slot(a.aval)
                self._copy_item(seq, t, a)
                staged.append((s, self._ref(t, a.aval)))
            else:
                staged.append((s, a))
        for s, a in staged:
            self._copy_item(seq, s, a)

    def _copies_seq(self, level, start, srcs, out_slots) -> tuple:
        seq = _Seq(self, level, start)
        self._gen_copies(seq, srcs, out_slots)
        return seq.finish()

    def _body(self, level, sub, operands, outs, extra=None):
        self.depth += 1
        try:
            tails = self._gen_sub(level, (), sub, operands, outs)
            if extra is not None:
                extra(tails)
        finally:
            self.depth -= 1
        self._seal(level)

    def _gen_cond(self, chain, e, outs):
        false_p, true_p = e.params["branches"]
        c = self.condition(chain.level)
        chain.kernel(GUARDS, "set_cond_from_cell", 1, 1, [c, self.buf(e.inputs[0], ir.U32_CELL)], "guard", "if", c)
        node, (then_l, else_l) = self.conditional(chain.level, chain.deps(), "if_else", c, label="if")
        chain.push(node)
        self._body(then_l, true_p, e.inputs[1:], outs)
        self._body(else_l, false_p, e.inputs[1:], outs)

    def _gen_switch(self, chain, e, outs):
        cases = tuple(e.params["cases"])
        *arms, default = e.params["branches"]
        k = len(cases)
        idx = self._sub_slot(ir.U32_CELL)
        table = self.const(np.array(cases, dtype=np.int64), np.int64) if k else None
        chain.kernel(LOWERING, "eagle_switch_index", 1, 1,
                     [self.slots[idx], self.buf(e.inputs[0], ir.U32_CELL), table, np.uint32(k)], "select", "match")
        c = self.condition(chain.level)
        chain.kernel(GUARDS, "set_cond_from_value", 1, 1, [c, self.slots[idx]], "guard", "match", c)
        node, levels = self.conditional(chain.level, chain.deps(), "switch", c, count=k + 1, label="match")
        chain.push(node)
        for lv, arm in zip(levels, list(arms) + [default]):
            self._body(lv, arm, e.inputs[1:], outs)

    def _gen_while(self, chain, e, outs):
        body, cond = e.params["body"], e.params["cond"]
        cap, counted, nc = e.params["cap"], e.params["counted"], e.params["n_consts"]
        record_turns = e.params.get("record_turns")
        ops = list(e.inputs)
        trip = ops.pop(0) if counted else None
        consts, init = ops[:nc], ops[nc:]
        level = chain.level
        chain.last = self._copies_seq(level, chain.deps(), init, outs)
        reads_turn = any(body.inputs[0] in q.inputs for q in body.eqns) or body.inputs[0] in body.outputs
        needs_counter = (cap is not None or counted or reads_turn or record_turns is not None
                         or _has_records(body))
        if cap is None and not counted and cond is None:
            raise NotImplementedError("eagle_fx CUDA lowering: a device loop with neither a guard nor a trip count")
        ctr = self._sub_slot(ir.U32_CELL)
        trips = None
        if counted:
            trips = self.buf(trip, ir.U32_CELL)
        elif cap is not None:
            trips = self.const(np.array([cap], dtype=np.uint32), np.uint32)
        c_slot = None

        def guard_cell(level_, start):
            """Evaluate the loop's guard program on the carries; (cell slot, tails)."""
            nonlocal c_slot
            if cond is None:
                return None, start
            c_ops = consts + [self._ref(s, a.aval) for s, a in zip(outs, init)]
            if not cond.eqns and cond.outputs[0] in cond.inputs:     # the guard is a carried cell itself
                a = c_ops[cond.inputs.index(cond.outputs[0])]
                return self.slot_of[a], start
            if c_slot is None:
                c_slot = self._sub_slot(ir.U32_CELL)
            return c_slot, self._gen_sub(level_, start, cond, c_ops, [c_slot])

        cell_slot, chain.last = guard_cell(level, chain.last)
        cell = self.slots[cell_slot] if cell_slot is not None else None
        c = self.condition(level)
        counter = self.slots[ctr]
        if cell is None:
            start = (GUARDS, "count_start", [c, counter, trips])
            step = (GUARDS, "count_step", [c, counter, trips])
        elif not needs_counter:
            start = step = (GUARDS, "set_cond_from_cell", [c, cell])
        else:
            start = (LOWERING, "eagle_loop_start", [c, counter, trips, cell])
            step = (LOWERING, "eagle_loop_step", [c, counter, trips, cell])
        chain.kernel(start[0], start[1], 1, 1, start[2], "guard", "while", c)
        node, (body_l,) = self.conditional(level, chain.deps(), "while", c, label="while")
        chain.push(node)
        refs = [self._ref(ctr, ir.U32_CELL)] + consts + [self._ref(s, a.aval) for s, a in zip(outs, init)]
        self.loops.append((ctr, e.params.get("record_cap")))

        def finish_body(tails):
            _, tails = guard_cell(body_l, tails)       # the same cell as before the loop
            _Chain(self, body_l, tails).kernel(step[0], step[1], 1, 1, step[2], "guard", "while", c)

        try:
            self._body(body_l, body, refs, outs, extra=finish_body)
        finally:
            self.loops.pop()
        if record_turns is not None:
            rec = self.records[record_turns]
            depth = len(self.loops)
            args = [rec, counter] + self._level_args(tuple(rec.shape), np.dtype(rec.dtype).itemsize)
            chain.kernel(LOWERING, f"eagle_record_turns_d{depth}", 1, 1, args, "record", f"turns {record_turns}")


# ---------------------------------------------------------------------------------------------
# the protocol over cuda.core (>= 1.0) explicit graphs: needs a GPU

def _core_arg(a):
    """A kernel argument as cuda.core's launch marshals it: device arrays as their pointer (a Python
    int is passed as a pointer), None as a null pointer, NumPy scalars by value in their dtype,
    GraphConditions as their handle (cuda.core unwraps them)."""
    if a is None:
        return 0
    if isinstance(a, np.generic):
        return a
    data = getattr(a, "data", None)
    ptr = getattr(data, "ptr", None)
    if ptr is not None:                            # a CuPy array: its device pointer
        return int(ptr)
    return a


def _ptr(a) -> int:
    return int(a.data.ptr)


def _same_view(a, b) -> bool:
    """Two device arrays over the same elements in the same order (CuPy, or the fake runtime's NumPy)."""
    start = (lambda x: x.__array_interface__["data"][0]) if isinstance(a, np.ndarray) else _ptr
    return a.shape == b.shape and a.strides == b.strides and start(a) == start(b)


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
        return self._origin(after).launch(cfg, fn, *[_core_arg(a) for a in args])

    def memset(self, dst, value, after=()):
        return self._origin(after).memset(_ptr(dst), int(value), int(dst.nbytes), dst_owner=dst)

    def memcpy(self, dst, src, after=()):
        return self._origin(after).memcpy(_ptr(dst), _ptr(src), int(dst.nbytes), dst_owner=dst, src_owner=src)

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
# runtimes: where a lowered plan's memory lives and how its graph runs
#
# A runtime is what CudaExecutable and call_kernel need beyond the builder protocol:
#   name                          'cuda' (shown by repr(g)) or 'fake-cuda'
#   device_arrays(arrays, names)  the arrays a graph runs on: device arrays as they are (checked:
#                                 C-contiguous, this device); NumPy arrays the builder reached (not
#                                 its named arguments) are copied to the device once
#   is_device(a), zeros, empty, to_device, overlaps(a, b)
#   builder()                     a fresh top-level builder
#   instantiate(builder)          the executable graph
#   stream() / launch(graph, stream) / sync(stream)
#                                 launches are asynchronous on the stream; sync waits for them
#   update_kernel / update_memcpy / update_memset(graph, plan_node)
#                                 set an instantiated node's parameters from the plan node (bind)
#   update_graph(graph, builder)  whole-graph update from a definition of the same topology
#   run_now(steps)                eager kernels: ('kernel', module, entry, grid, block, args) and
#                                 ('memset', array, value) steps, launched in order on stream()

NVRTC_OPTIONS = ("--fmad=false",)   # a*x+b rounds as NumPy's multiply then add does


class CoreRuntime:
    """The real runtime: CuPy device memory, cuda.core graphs and launches, on the CUDA device
    CuPy has current. Launches go to CuPy's current stream (`with cupy.cuda.Stream(): g.enqueue()`
    works), so a graph is ordered with the CuPy work around it like any CuPy operation. One
    instance per device (CoreRuntime.get()). Needs a GPU; run by tests/gpu."""

    name = "cuda"
    _instances: dict = {}

    @classmethod
    def get(cls, what: str = "CuPy arrays run as CUDA graphs") -> "CoreRuntime":
        try:
            import cupy
            dev = int(cupy.cuda.runtime.getDevice())
        except Exception:
            dev = None
        rt = cls._instances.get(dev) if dev is not None else None
        if rt is None:
            driver = require_gpu(what)
            import cupy
            dev = int(cupy.cuda.runtime.getDevice())
            rt = cls._instances[dev] = cls(dev, driver)
        rt._make_current()
        return rt

    def __init__(self, device_id: int, driver: int):
        import threading

        import cupy
        from cuda.core import Device
        self.cupy, self.device_id, self.driver = cupy, device_id, driver
        self.device = Device(device_id)
        self._local = threading.local()
        self._make_current()
        cc = self.device.compute_capability
        self.arch = f"sm_{cc[0]}{cc[1]}"
        self._objects: dict = {}
        self._functions: dict = {}
        self._configs: dict = {}
        self._null_stream = None

    def __repr__(self):
        return f"<eagle_fx CoreRuntime device {self.device_id} {self.arch} driver {self.driver}>"

    def _make_current(self):
        if not getattr(self._local, "current", False):    # cuda.core needs a current context per thread
            self.device.set_current()
            self._local.current = True

    # memory
    def is_device(self, a) -> bool:
        return isinstance(a, self.cupy.ndarray)

    def device_arrays(self, arrays, names=None) -> list:
        names = list(names) if names is not None else [None] * len(arrays)
        out = []
        for a, name in zip(arrays, names):
            what = f"the array argument {name!r}" if name else "an array the builder reached"
            if isinstance(a, np.ndarray):
                if name:
                    raise ValueError(f"eagle_fx: {what} is a NumPy array, and other arrays of this graph are CuPy "
                                     f"arrays; a graph runs on one device: pass cupy.asarray({name}) (or NumPy "
                                     "arrays only, to run on the CPU)")
                out.append(self.to_device(a))        # a constant or scratch cell the builder made: copied once
                continue
            if not self.is_device(a):
                a = self.cupy.asarray(a)             # __cuda_array_interface__: a zero-copy CuPy view
            self.check_array(a, what)
            out.append(a)
        return out

    def check_array(self, a, what="an array"):
        if not a.flags.c_contiguous:
            raise ValueError(f"eagle_fx: {what} is not C-contiguous (strides {a.strides}); CUDA kernels read planes "
                             "densely: pass cupy.ascontiguousarray(...)")
        dev = int(a.device.id)
        if dev != self.device_id:
            raise ValueError(f"eagle_fx: {what} lives on CUDA device {dev}, the graph on device {self.device_id}; "
                             "a graph runs on one device")

    def zeros(self, shape, dtype):
        return self.cupy.zeros(tuple(shape), np.dtype(dtype))

    def empty(self, shape, dtype):
        return self.cupy.empty(tuple(shape), np.dtype(dtype))

    def to_device(self, host):
        return self.cupy.asarray(np.ascontiguousarray(host))

    @staticmethod
    def overlaps(a, b) -> bool:
        pa, pb = _ptr(a), _ptr(b)
        return a.nbytes > 0 and b.nbytes > 0 and pa < pb + b.nbytes and pb < pa + a.nbytes

    # kernels
    def function(self, module: KernelModule, entry: str, arch: str | None = None):
        arch = arch or self.arch
        key = (module.name, entry, arch)
        fn = self._functions.get(key)
        if fn is None:
            obj = self._objects.get((module.name, arch))
            if obj is None:
                from cuda.core import ObjectCode
                cubin = hcuda.compile_cubin(module.source, arch, NVRTC_OPTIONS)
                obj = self._objects[(module.name, arch)] = ObjectCode.from_cubin(cubin)
            fn = self._functions[key] = obj.get_kernel(entry)
        return fn

    def config(self, grid, block):
        key = (int(grid), int(block))
        cfg = self._configs.get(key)
        if cfg is None:
            from cuda.core import LaunchConfig
            cfg = self._configs[key] = LaunchConfig(grid=key[0], block=key[1])
        return cfg

    # graphs
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

    def stream(self):
        self._make_current()
        s = self.cupy.cuda.get_current_stream()
        ptr = int(s.ptr)
        from cuda.core import Stream
        if ptr == 0:
            if self._null_stream is None:
                try:
                    self._null_stream = Stream.from_handle(0)
                except Exception:
                    self._null_stream = self.device.default_stream
            return self._null_stream
        return Stream.from_handle(ptr)       # non-owning; CuPy keeps the stream alive

    def launch(self, graph, stream):
        graph.launch(stream)

    def sync(self, stream):
        stream.sync()

    def update_kernel(self, graph, node):
        graph[node.handle].update(config=self.config(node.grid, node.block),
                                  kernel=self.function(node.module, node.entry),
                                  args=tuple(_core_arg(a) for a in node.args))

    def update_memcpy(self, graph, node):
        graph[node.handle].update(dst=_ptr(node.dst), src=_ptr(node.src), size=int(node.dst.nbytes))

    def update_memset(self, graph, node):
        graph[node.handle].update(dst=_ptr(node.dst), value=int(node.args[0]) if node.args else 0,
                                  width=int(node.dst.nbytes), height=1, pitch=0)

    def update_graph(self, graph, builder):
        graph.update(builder.definition)

    def run_now(self, steps):
        from cuda.core import launch
        stream = self.stream()
        for st in steps:
            if st[0] == "memset":
                _, arr, value = st
                self.cupy.cuda.runtime.memsetAsync(_ptr(arr), int(value), int(arr.nbytes),
                                                   self.cupy.cuda.get_current_stream().ptr)
            else:
                _, module, entry, grid, block, args = st
                launch(stream, self.config(grid, block), self.function(module, entry),
                       *[_core_arg(a) for a in args])


def _fake_runtime():
    from .fake_cuda import FakeRuntime
    return FakeRuntime()


# ---------------------------------------------------------------------------------------------
# the executable: what eagle_fx.Graph runs (the NumpyExecutable interface)

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
    """A Program lowered into ONE CUDA graph and instantiated; the interface of NumpyExecutable:
    replay(times), array_of(var), rebind(input_index, array), records; plus enqueue(times) and
    synchronize() (asynchronous launches on the runtime's stream: CuPy's current stream).

    rebind swaps an input array WITHOUT re-capturing or re-instantiating: every node that reads or
    writes the old array gets the new pointer through a per-node update of the instantiated graph
    (`graph[node].update(...)`, cuda.core >= 1.2, driver >= 12.2). Where that is refused (an older
    cuda.core, or a node inside a conditional body the driver will not update), the same Program
    is lowered again into a new definition over the same buffers, which has the same topology, and
    the instantiated graph is updated from it as a whole (cuGraphExecUpdate). Only if that fails
    too is the new definition instantiated. `last_bind` says which happened: 'nodes', 'graph' or
    'instantiate'."""

    def __init__(self, prog, input_arrays, keep, n: int, records=None, runtime=None, names=None):
        if runtime is None:
            runtime = CoreRuntime.get()
        elif runtime == "fake-cuda":
            runtime = _fake_runtime()
        self.runtime = runtime
        self.backend_name = runtime.name
        self.prog, self.n, self.keep = prog, n, set(keep)
        self._records_arg = records
        self.names = list(names) if names is not None else [None] * len(self.prog.inputs)
        self.inputs = runtime.device_arrays(list(input_arrays), self.names)
        memory = _PlannedMemory(runtime.builder())
        self.plan = lower(prog, self.inputs, self.keep, n, memory, records=records)
        self._memory = memory.made
        self.graph = runtime.instantiate(memory._builder)
        self._definitions = [memory]          # definitions stay alive with the graph made from them
        self._pending: list = []
        self.last_bind = None
        self.last_bind_reason = None          # why per-node updates were refused, when they were
        self.launches = 0

    @property
    def records(self):
        return self.plan.records

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
        self.enqueue(times)
        self.synchronize()

    # binding
    def rebind(self, input_index: int, arr):
        plan = self.plan
        slot = plan.input_slots[input_index]
        old = plan.slots[slot]
        (new,) = self.runtime.device_arrays([arr], [self.names[input_index] or f"input {input_index}"])
        if new is old:
            return
        if tuple(new.shape) != tuple(old.shape) or np.dtype(new.dtype) != np.dtype(old.dtype):
            raise ValueError(f"eagle_fx CUDA: rebind of input {input_index}: {tuple(new.shape)} {new.dtype} for "
                             f"{tuple(old.shape)} {old.dtype}")
        self.synchronize()
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
        plan = lower(self.prog, self.inputs, self.keep, self.n, memory, records=self._records_arg)
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


# ---------------------------------------------------------------------------------------------
# a kernel called eagerly on CuPy arrays: the emitted kernel, launched directly

def call_kernel(spec, values, n: int, runtime=None) -> list:
    """Run hawk Specialization `spec` on `values` (its arguments in parameter order: device arrays,
    Python numbers, NumPy scalars and one-cell arrays, which are uploaded) over n samples: the body's
    entries launched one after another on CuPy's current stream (asynchronous, like a CuPy
    operation). Returns the result arrays (new device arrays, in spec order); Mutable arguments are
    written in place. Refuses (GpuUnavailableError) where there is no GPU stack."""
    kernel = spec.kernel
    if runtime is None:
        try:
            runtime = CoreRuntime.get("CuPy arrays run hawk kernels on the GPU")
        except GpuUnavailableError as exc:
            k = next((i for i, v in enumerate(values) if _device_like(v)), 0)
            v = values[k]
            raise GpuUnavailableError(f"hawk.kernel {kernel.name}: argument '{kernel.param_names[k]}' is a "
                                      f"{type(v).__module__}.{type(v).__name__}; {exc}") from None
    elif runtime == "fake-cuda":
        runtime = _fake_runtime()
    mod = body_module(spec)
    ek = mod.emitted
    commits = list(spec.commits)
    dev = list(values)
    for k, (name, v) in enumerate(zip(kernel.param_names, values)):
        where = f"hawk.kernel {kernel.name}: argument '{name}'"
        if runtime.is_device(v) or _device_like(v):
            (dev[k],) = runtime.device_arrays([v], [name]) if not runtime.is_device(v) else (v,)
            runtime.check_array(dev[k], where)
        elif k in commits:
            raise ValueError(f"{where} is a Mutable written on the GPU, but it is a {type(v).__name__}, not a "
                             "device array; pass a CuPy array (other arguments of this call are CuPy arrays)")
        elif isinstance(v, np.ndarray) and v.shape and v.shape[-1] != 1:
            raise ValueError(f"{where} is a NumPy plane of {v.shape[-1]} samples, and other arguments are CuPy "
                             f"arrays; a call runs on one device: pass cupy.asarray({name})")
    for a in range(len(commits)):
        for b in range(a):
            if runtime.overlaps(dev[commits[a]], dev[commits[b]]):
                raise ValueError(f"hawk.kernel {kernel.name}: Mutable arguments '{kernel.param_names[commits[b]]}' "
                                 f"and '{kernel.param_names[commits[a]]}' share memory; pass separate arrays")
    for k, v in enumerate(dev):     # an input overlapping a Mutable (not that very view): read before written
        if k not in commits and runtime.is_device(v) and any(
                runtime.overlaps(v, dev[c]) and not _same_view(v, dev[c]) for c in commits):
            dev[k] = v.copy()
    outs = [runtime.empty(spec.result_shape(j, n), spec.result_dtype(j)) for j in range(spec.n_results)]
    targets = outs + [dev[k] for k in commits]
    ws = runtime.empty((ek.workspace_bytes,), np.uint8) if ek.workspace_bytes else None
    args = []
    for prm in ek.params:
        if prm.role in ("in_plane", "in_cell"):
            v = dev[prm.index]
            if not runtime.is_device(v):             # a NumPy one-cell array or scalar: uploaded
                v = runtime.to_device(np.asarray(v, dtype=prm.dtype).reshape(-1))
            args.append(v)
        elif prm.role == "in_value":
            args.append(np.dtype(prm.dtype).type(values[prm.index]))
        elif prm.role in ("out_plane", "out_cell"):
            args.append(targets[prm.index])
        elif prm.role == "workspace":
            args.append(ws)
        elif prm.role == "n":
            args.append(np.uint64(n))
        else:
            raise NotImplementedError(f"eagle_fx CUDA: unknown kernel parameter role {prm.role!r}")
    steps = []
    if ek.reductions:
        if ek.init_is_zero:
            steps.append(("memset", ws, 0))
        else:
            steps.append(("kernel", mod, f"{ek.name}_init", 1, 1, tuple(args)))
    grid = max(1, min(-(-int(n) // BLOCK), MAX_GRID))
    for en in ek.entries:
        if en.role == "init":
            continue
        steps.append(("kernel", mod, en.name, *((1, 1) if en.launch == "single" else (grid, BLOCK)), tuple(args)))
    runtime.run_now(steps)
    return outs


# ---------------------------------------------------------------------------------------------
# which backend runs a graph

_forced = threading.local()


def _device_like(a) -> bool:
    """A GPU array: a CuPy array (by its module), or anything with __cuda_array_interface__."""
    return (type(a).__module__.split(".")[0] == "cupy" or hasattr(type(a), "__cuda_array_interface__")) \
        and hasattr(a, "shape") and hasattr(a, "dtype")


class use_backend:
    """`with use_backend("fake-cuda"):` graphs built inside run on that backend: 'numpy', 'cuda',
    'fake-cuda' (the recording fake: NumPy arrays stand for device memory, for tests without a
    GPU), or a runtime object (e.g. fake_cuda.FakeRuntime(node_updates="top")). None: by the
    arrays' type. eagle.Graph(backend=...) chooses for one graph."""

    def __init__(self, backend):
        self.backend = backend

    def __enter__(self):
        stack = getattr(_forced, "stack", None)
        if stack is None:
            stack = _forced.stack = []
        stack.append(self.backend)
        return self

    def __exit__(self, *exc):
        _forced.stack.pop()
        return False


def choose(arrays, requested=None):
    """The backend of a graph over `arrays` (its input arrays): 'numpy', or a runtime for the CUDA
    graph backend (CoreRuntime for CuPy arrays: it refuses where there is no GPU; a FakeRuntime for
    'fake-cuda'). `requested`: eagle.Graph(backend=...), else use_backend's, else by the arrays:
    CuPy (or any __cuda_array_interface__) arrays -> 'cuda', otherwise 'numpy'."""
    if requested is None:
        stack = getattr(_forced, "stack", None)
        requested = stack[-1] if stack else None
    on_gpu = [a for a in arrays if _device_like(a)]
    if requested is None:
        requested = "cuda" if on_gpu else "numpy"
    if requested == "numpy":
        if on_gpu:
            a = on_gpu[0]
            raise ValueError(f"eagle_fx: the numpy backend was asked for, but the graph reads a "
                             f"{type(a).__module__}.{type(a).__name__}; pass NumPy arrays (cupy.asnumpy) or drop "
                             "backend='numpy'")
        return "numpy"
    if requested == "cuda":
        return CoreRuntime.get()
    if requested == "fake-cuda":
        requested = _fake_runtime()
    if not hasattr(requested, "builder"):
        raise ValueError(f"eagle_fx: unknown backend {requested!r}; 'numpy', 'cuda' or 'fake-cuda'")
    if on_gpu and requested.name == "fake-cuda":
        raise ValueError("eagle_fx: the fake-cuda backend runs on NumPy arrays; the graph reads a device array")
    return requested


RECORD_REFUSAL = ("eagle.Graph: record=True graphs (for eagle_fx.diff) run on the NumPy backend in this version; "
                  "build the recorded graph on NumPy arrays (cupy.asnumpy), or drop record=True to run on the GPU")
