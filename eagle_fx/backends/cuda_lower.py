"""The CUDA backend's lowering: a staged Program becomes one CUDA graph with conditional nodes.

`lower(program, input_arrays, keep, n, builder)` plans memory once (backends/memory.py, the planner
the NumPy backend uses too) and adds every node of the graph through `builder`, the graph-building
protocol of cuda_graph.py. It returns a `CudaPlan`, which keeps the node tree, the device buffers
and the kernel modules. The same lowering runs against cuda_graph.CoreGraphBuilder (cuda.core
explicit graphs, CuPy arrays; needs a GPU) and against eagle_fx.testing.fake_cuda.FakeBuilder (a
recording fake that interprets the plan with NumPy), which is how it is tested without a GPU.

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
    derivative programs (transforms/vjp_graph.py, jvp_graph.py; record=True's two halves)
             zeros      a memset (a stack: nothing; no turn is read before it is pushed)
             add_any    eagle_add_<dtype>, out = a + b
             stack_push / stack_read   eagle_stack_push / eagle_stack_read: row `turn` (read from
                        the turn cell on the device) of a (rows, *value) buffer, copied
             cell_inc / cell_rev       one-thread kernels on the turn cells
             revolve    the binomial checkpointing schedule (transforms/checkpoint.py) as a state
                        machine on the device: a WHILE whose body SWITCHes on the action
                        eagle_revolve_step chose (advance a turn, reverse a turn, keep the working
                        state in one of K slots, restore it), then asks for the next one; the same
                        actions in the same order as checkpoint.run
    vmap     (transforms/vmap.py: a batched value's batch axis leads, (B, *shape)) the simplest design
             that is correct on every form, as the NumPy backend's semantics, with few new kernels:
             batched call   one launch of the unbatched kernel per instance, over instance b's part of
                            each batched array (a view: contiguous, the batch axis leads) and the whole
                            of each shared one; the launches are one chain, sharing one workspace. No
                            new body code (hawk_fx.emit.cuda has no batch axis), at the cost of B nodes
                            per call. A bind of an argument such a view was taken of lowers again.
             batch_broadcast, add_any of a shared and a batched value   eagle_strided_copy with
                            stride 0 over the batch axis (then eagle_add)
             cells per instance   eagle_cells (not/and/or, cell_inc, cell_rev, <=), a thread a cell
             masked if/match      every arm runs, on private copies of the operands arms write in
                            place, into buffers of its own; then eagle_masked_copy keeps each
                            instance's arm (a match: the default, then each case where the cell equals it)
             masked while   a device loop that turns while ANY instance's guard (or trip count, read
                            once on entry) holds: eagle_masked_loop, one thread over the instances,
                            marks those that finish on this turn; their carries are kept aside
                            (eagle_masked_copy) and put back after the loop, so the turns an instance
                            runs past its end touch nothing it returns; a cap stops every instance.
                            set_cond_from_cell on its `any` cell stays the body's last node.
             masked revolve the schedule of the most turns (eagle_cells_max); an instance whose own
                            turns end at or before turn t keeps its cotangents in the reverse of t
             stacks per instance  stored turn-major, (rows, B, *value), so a push or read of a shared
                            turn is one row as before; a turn per instance reads its own row
                            (eagle_stack_gather)
    stacks   a stack of saved loop turns is a buffer of `rows` turns in device memory: at least
             STACK_TURNS, and its cap (a counted loop's trip count when the derivative was made, a
             capped loop's cap) where that many turns take at most STACK_CAP_BYTES. A push or read past the
             rows copies nothing and raises the plan's overflow cell to the turns it needed; the
             executable (cuda_graph.CudaExecutable) reads that cell after each run, doubles the
             rows until they fit, lowers again and runs again. Growing BETWEEN runs, not sizing every
             stack by its cap, because a cap is an upper bound (a loop capped at 200 000 turns
             that stops after 50) that would hold device memory for turns never run, and because a
             counted loop may run more turns than when its derivative was made; a run that
             overflowed is never read. Derivative programs write none of their arguments, so the
             run is repeated; a graph that writes its arguments in place is refused instead
             (the next launch has the room).
    forks    nodes follow program order, except that the branches of one `parallel` region
             (eqn.info.branch paths) are independent chains; an equation after the region joins
             them. Edges for buffer hazards (read-after-write, write-after-read, write-after-write
             on one slot) are added too, so a `wait`, or a slot reused across branches, is ordered.
    overlap  an input array that shares memory with a Mutable output of the same call without being
             that very view (`k(buf[:-1], buf[1:])`) is copied into a buffer of its own before the
             call, every replay: the kernel's threads would otherwise read samples other threads
             have written. Every input is read before any write, as NumPy's `y[1:] = f(y[:-1],
             y[1:])` does. `CudaPlan.aliasing` records which inputs overlapped; a bind that changes
             it lowers again.
"""
from __future__ import annotations

import numpy as np

from hawk_fx.core import AVal, Literal, Program, RuleTable, Var
from hawk_fx.cuda_runtime import BLOCK, KernelModule, body_module, grid_for, overlaps, same_view
from hawk_fx.emit import cuda as hcuda

from .. import ir
from ..ir.analysis import direct_outputs
from ..transforms.vmap import batch_broadcast_p
from .memory import SlotPlanner

GUARDS = KernelModule("hawk_guards", hcuda.guard_source(), tuple(hcuda.GUARD_KERNELS), "guard", label="guards")

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
// stacks of saved loop turns (ir.stack_push / stack_read): turn t is row t of a (room, count)
// buffer of itemsize-byte elements. A turn past `room` copies nothing and raises *overflow to the
// number of turns it needed: the executable reads it after the replay (and grows the stacks).
__device__ __forceinline__ void eagle_copy_item(unsigned char* dst, const unsigned char* src, unsigned int itemsize) {
    if (itemsize == 8u) *(unsigned long long*)dst = *(const unsigned long long*)src;
    else if (itemsize == 4u) *(unsigned int*)dst = *(const unsigned int*)src;
    else for (unsigned int b = 0; b < itemsize; ++b) dst[b] = src[b]; }
extern "C" __global__ void eagle_stack_push(unsigned char* stack, const unsigned char* value, const unsigned int* turn,
                                            unsigned long long count, unsigned int itemsize, unsigned int room,
                                            unsigned int* overflow) {
    const unsigned int t = *turn;
    if (t >= room) { if (blockIdx.x == 0 && threadIdx.x == 0) atomicMax(overflow, t + 1u); return; }
    unsigned char* row = stack + (unsigned long long)t * count * itemsize;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < count;
         i += (unsigned long long)gridDim.x * blockDim.x)
        eagle_copy_item(row + i * itemsize, value + i * itemsize, itemsize); }
extern "C" __global__ void eagle_stack_read(unsigned char* out, const unsigned char* stack, const unsigned int* turn,
                                            unsigned long long count, unsigned int itemsize, unsigned int room,
                                            unsigned int* overflow) {
    const unsigned int t = *turn;
    if (t >= room) { if (blockIdx.x == 0 && threadIdx.x == 0) atomicMax(overflow, t + 1u); return; }
    const unsigned char* row = stack + (unsigned long long)t * count * itemsize;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < count;
         i += (unsigned long long)gridDim.x * blockDim.x)
        eagle_copy_item(out + i * itemsize, row + i * itemsize, itemsize); }
// turn counters of derivative loops (ir.cell_inc, ir.cell_rev)
extern "C" __global__ void eagle_cell_inc(unsigned int* out, const unsigned int* turn) {
    if (blockIdx.x == 0 && threadIdx.x == 0) *out = *turn + 1u; }
extern "C" __global__ void eagle_cell_rev(unsigned int* out, const unsigned int* turns, const unsigned int* turn) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    const long long r = (long long)(*turns) - 1 - (long long)(*turn);
    *out = r > 0 ? (unsigned int)r : 0u; }
// revolve (ir.revolve_p): the binomial schedule of transforms/checkpoint.py's `run`, one action per
// launch, as a state machine over `state` (u32: phase, level, cur, goal, then, unused, t0[K], t1[K]:
// the frames of its recursion, one per kept slot). It writes the action's kind (0 advance turn,
// 1 reverse turn, 2 store slot, 3 restore slot, 4 done) to *kind and its turn or slot to *turn or
// *slot, and sets the loop's condition: not done. `start` != 0: the first action (store slot 0).
__device__ unsigned int eagle_beta_capped(unsigned int c, unsigned int r, unsigned int cap) {
    unsigned long long v = 1ull;                   // C(c + r, c) = prod (r + i) / i, exact at every i
    for (unsigned int i = 1u; i <= c; ++i) { v = v * (unsigned long long)(r + i) / i; if (v >= cap) return cap; }
    return (unsigned int)v; }
__device__ unsigned int eagle_repetitions(unsigned int T, unsigned int K) {
    unsigned int r = 0u;
    while (eagle_beta_capped(K, r, T) < T) ++r;
    return r; }
__device__ unsigned int eagle_split(unsigned int n, unsigned int c) {
    unsigned int lo = 1u, hi = n - 1u;
    while (lo < hi) {
        const unsigned int l = (lo + hi) / 2u;
        if (1ll + (long long)eagle_repetitions(l + 1u, c) - (long long)eagle_repetitions(n - l, c - 1u) >= 0ll) hi = l;
        else lo = l + 1u;
    }
    return lo; }
extern "C" __global__ void eagle_revolve_step(cudaGraphConditionalHandle handle, unsigned int* state,
                                              const unsigned int* turns, unsigned int K, unsigned int start,
                                              unsigned int* kind, unsigned int* turn, unsigned int* slot) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    unsigned int* t0 = state + 6;
    unsigned int* t1 = state + 6 + K;
    unsigned int k = 4u, arg = 0u;
    if (start) {
        if (*turns > 0u) { state[0] = 0u; state[1] = 0u; state[2] = 0u; t0[0] = 0u; t1[0] = *turns; k = 2u; }
    } else {
        for (;;) {
            const unsigned int lvl = state[1];
            if (state[0] == 0u) {                  // back(t0, t1, lvl): the next stretch, or return
                if (t1[lvl] > t0[lvl]) {
                    const unsigned int n = t1[lvl] - t0[lvl], spare = K - 1u - lvl;
                    if (n == 1u || spare == 0u) { state[3] = t1[lvl] - 1u; state[4] = 0u; }
                    else { state[3] = t0[lvl] + eagle_split(n, spare + 1u); state[4] = 1u; }
                    state[0] = 1u;
                } else {
                    if (lvl == 0u) break;          // done
                    t1[lvl - 1u] = t0[lvl];
                    state[1] = lvl - 1u;
                    continue;
                }
            }
            if (state[0] == 1u) {                  // bring the working state to the goal: restore first?
                state[0] = 2u;
                if (!(state[2] <= state[3]) || state[2] < t0[lvl]) { state[2] = t0[lvl]; k = 3u; arg = lvl; break; }
            }
            if (state[2] < state[3]) { k = 0u; arg = state[2]; state[2] += 1u; break; }
            state[0] = 0u;                         // at the goal: reverse its turn, or keep it and recurse
            if (state[4] == 0u) { t1[lvl] -= 1u; k = 1u; arg = t1[lvl]; break; }
            t0[lvl + 1u] = state[3];
            t1[lvl + 1u] = t1[lvl];
            state[1] = lvl + 1u;
            k = 2u;
            arg = lvl + 1u;
            break;
        }
    }
    *kind = k;
    if (k <= 1u) *turn = arg;
    else if (k <= 3u) *slot = arg;
    cudaGraphSetConditional(handle, k != 4u ? 1u : 0u); }
// vmap's primitives. Cells per instance: `count` cells, elementwise; sa / sb are 1 where that
// operand holds a cell per instance, 0 where one cell is shared by all. op: 0 not, 1 and, 2 or,
// 3 a + 1 (cell_inc), 4 max(a - 1 - b, 0) (cell_rev), 5 a <= b
extern "C" __global__ void eagle_cells(unsigned int* out, const unsigned int* a, const unsigned int* b,
                                       unsigned int count, unsigned int sa, unsigned int sb, unsigned int op) {
    for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < count; i += gridDim.x * blockDim.x) {
        const unsigned int x = a[i * sa], y = b == nullptr ? 0u : b[i * sb];
        const long long r = (long long)x - 1 - (long long)y;
        out[i] = op == 0u ? (x == 0u ? 1u : 0u) : op == 1u ? ((x != 0u && y != 0u) ? 1u : 0u)
               : op == 2u ? ((x != 0u || y != 0u) ? 1u : 0u) : op == 3u ? x + 1u
               : op == 4u ? (r > 0 ? (unsigned int)r : 0u) : (x <= y ? 1u : 0u);
    } }
extern "C" __global__ void eagle_cells_max(unsigned int* out, const unsigned int* a, unsigned int count) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    unsigned int m = 0u;
    for (unsigned int i = 0; i < count; ++i) m = a[i] > m ? a[i] : m;
    *out = m; }
// dst = src for the instances `mask` selects (a masked arm's values, a finished instance's carries):
// element i belongs to instance i / per; mode 0: mask != 0, 1: mask == 0, 2: mask == key
extern "C" __global__ void eagle_masked_copy(unsigned char* dst, const unsigned char* src, const unsigned int* mask,
                                             unsigned long long per, unsigned long long count, unsigned int itemsize,
                                             unsigned int mode, long long key) {
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < count;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        const unsigned int m = mask[i / per];
        if (mode == 0u ? m != 0u : mode == 1u ? m == 0u : (long long)m == key)
            eagle_copy_item(dst + i * itemsize, src + i * itemsize, itemsize);
    } }
// a masked loop's guard (a guard cell or a trip count per instance), one thread over B instances:
// the turn (0 at start, else one more) goes to *counter; on a turn under the cap each live instance
// runs while its guard (gs: 1 per instance, 0 shared; null: none) holds and its trip count (ts
// likewise) is not reached; done[b]: instance b finished on this turn. *go: any runs (the loop's
// guard kernel, last in its body, reads it after the finished instances' carries are kept)
extern "C" __global__ void eagle_masked_loop(unsigned int* counter, unsigned int* go,
                                             unsigned int* live, unsigned int* done, const unsigned int* guard,
                                             unsigned int gs, const unsigned int* trips, unsigned int ts,
                                             unsigned int cap, unsigned int B, unsigned int start) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    const unsigned int t = start ? 0u : *counter + 1u;
    *counter = t;
    bool any = false;
    for (unsigned int b = 0; b < B; ++b) {
        if (start) live[b] = 1u;
        if (t >= cap) { done[b] = 0u; continue; }          // capped: every instance keeps what it has
        const bool run = live[b] != 0u && (guard == nullptr || guard[b * gs] != 0u)
                         && (trips == nullptr || t < trips[b * ts]);
        done[b] = (live[b] != 0u && !run) ? 1u : 0u;
        live[b] = run ? 1u : 0u;
        any = any || run;
    }
    *go = any ? 1u : 0u; }
// a turn per instance (stack_read under vmap): instance b reads row turns[b] (rows of `rowcount`
// items), its own part (bstride = per) or the one value shared by all (bstride = 0)
extern "C" __global__ void eagle_stack_gather(unsigned char* out, const unsigned char* stack, const unsigned int* turns,
                                              unsigned long long per, unsigned long long rowcount,
                                              unsigned long long bstride, unsigned int B, unsigned int itemsize,
                                              unsigned int room, unsigned int* overflow) {
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < per * B;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        const unsigned long long b = i / per, j = i % per;
        const unsigned int t = turns[b];
        if (t >= room) { if (j == 0) atomicMax(overflow, t + 1u); continue; }
        eagle_copy_item(out + i * itemsize, stack + ((unsigned long long)t * rowcount + b * bstride + j) * itemsize,
                        itemsize);
    } }
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
"""

# cotangent sums (ir.add_any): one entry per dtype, out[i] = a[i] + b[i]
ADD_DTYPES = tuple(np.dtype(t) for t in ("float32", "float64", "int32", "int64"))


def _add_entry(dtype) -> str:
    return f"eagle_add_{np.dtype(dtype).name}"


_LOWERING_SOURCE += "".join(f"""extern "C" __global__ void {_add_entry(dt)}({hcuda.ctype(dt)}* out, const {hcuda.ctype(dt)}* a,
        const {hcuda.ctype(dt)}* b, unsigned long long count) {{
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < count;
         i += (unsigned long long)gridDim.x * blockDim.x) out[i] = a[i] + b[i]; }}
""" for dt in ADD_DTYPES)

_LOWERING_ENTRIES = ("eagle_loop_start", "eagle_loop_step", "eagle_cell_not", "eagle_cell_and", "eagle_cell_or",
                     "eagle_switch_index", "eagle_strided_copy", "eagle_stack_push", "eagle_stack_read",
                     "eagle_cell_inc", "eagle_cell_rev", "eagle_revolve_step", "eagle_cells", "eagle_cells_max",
                     "eagle_masked_copy", "eagle_masked_loop", "eagle_stack_gather") + tuple(_add_entry(dt) for dt in ADD_DTYPES)
LOWERING = KernelModule("eagle_lowering", _LOWERING_SOURCE, _LOWERING_ENTRIES, "lowering", label="lowering")

# a stack of saved turns holds its cap's turns where that takes at most STACK_CAP_BYTES, else (and
# for a stack of no known bound, cap 0) STACK_TURNS at first; CudaExecutable doubles it as needed
STACK_TURNS = 64
STACK_CAP_BYTES = 16 << 20


# ---------------------------------------------------------------------------------------------
# the plan

class PlanNode:
    """One node of the lowered graph. kind: 'kernel' | 'memset' | 'memcpy' | 'host' | 'join' |
    'if' | 'if_else' | 'switch' | 'while'. role of a kernel: 'body' (a hawk entry), 'init' (a
    workspace init entry), 'guard' (sets `cond`), 'cell' (cell logic, turn counters), 'select'
    (switch index), 'copy' (eagle_strided_copy: slice, update, concat), 'sum' (add_any), 'stack'
    (a push or read of saved turns). For a conditional node `cond` is the condition it
    reads, `bodies` its body trees."""

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
        self.aliasing: frozenset = frozenset()    # (i, j): inputs i < j overlap without being one view
        self.modules: dict[str, KernelModule] = {}
        self.conditions: list = []
        self.constants: list = []
        self.workspaces: list = []
        self.overflow = None                   # the stacks' overflow cell (a u32 device cell), if any
        self.view_slots: set = set()           # slots a batched call reads or writes an instance's part of
        self.stack_turns = STACK_TURNS

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

def alias_pairs(arrays, of=None) -> frozenset:
    """(i, j), i < j, for the arrays that share memory without being the very same view (two views
    of one caller's buffer, shifted or strided): what a node must not read while it writes. `of`:
    only the pairs that hold array `of`."""
    pairs = ((i, j) for j in range(len(arrays)) for i in range(j)) if of is None else \
        ((min(i, of), max(i, of)) for i in range(len(arrays)) if i != of)
    return frozenset((i, j) for i, j in pairs if overlaps(arrays[i], arrays[j]) and not same_view(arrays[i], arrays[j]))


def lower(program: Program, input_arrays, keep, n: int, builder, stack_turns: int = STACK_TURNS) -> CudaPlan:
    """Lower `program` into a CUDA graph through `builder` (the protocol in the module docstring).
    input_arrays: the device arrays of program.inputs (they are used in place); keep: Vars whose
    buffers must survive (results, buffer= planes); n: the graph's sample count; stack_turns: the
    turns each stack of saved loop turns holds at least (its cap, when larger)."""
    return _Lowering(program, input_arrays, keep, n, builder, stack_turns).plan


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


class _Lowering(SlotPlanner):
    def __init__(self, prog, input_arrays, keep, n, builder, stack_turns=STACK_TURNS):
        self.prog, self.builder = prog, builder
        self.plan = plan = CudaPlan(prog, n, builder)
        plan.stack_turns = self.stack_turns = max(1, int(stack_turns))
        self.slots, self.slot_of = plan.slots, plan.slot_of
        self.consts: dict = {}
        self._init_pool()
        self.slot_paths: dict = {}       # top-level slot -> branch paths of the equations that used it
        self.depth = 0                   # conditional bodies around the current node
        input_arrays = list(input_arrays)
        if len(input_arrays) != len(prog.inputs):
            raise ValueError(f"eagle_fx CUDA lowering: {len(input_arrays)} input arrays for a program of "
                             f"{len(prog.inputs)} inputs")
        for v, arr in zip(prog.inputs, input_arrays):
            if ir.is_stack(v.aval) and tuple(arr.shape[1:]) == v.aval.shape[1:] and np.dtype(arr.dtype) == v.aval.dtype:
                # a stack another graph filled (a record's residual): as many turns as it made room for
                plan.stack_turns = self.stack_turns = max(self.stack_turns, int(arr.shape[0]))
                continue
            if tuple(arr.shape) != v.aval.shape or np.dtype(arr.dtype) != v.aval.dtype:
                raise ValueError(f"eagle_fx CUDA lowering: an input array is {tuple(arr.shape)} {arr.dtype}, the "
                                 f"program's input is {v.aval.shape} {v.aval.dtype}")
        self._bind_inputs(prog, input_arrays, keep)
        plan.input_slots = self.input_slots
        plan.aliasing = alias_pairs(input_arrays)
        self.aliases: dict = {}          # input slot -> the input slots it overlaps (not as one view)
        for i, j in plan.aliasing:
            a, b = self.input_slots[i], self.input_slots[j]
            self.aliases.setdefault(a, set()).add(b)
            self.aliases.setdefault(b, set()).add(a)
        top = _Level(builder, plan.tree)
        sinks = self._gen_top(top)
        plan.end = sinks[0] if len(sinks) == 1 else (self.join(top, sinks) if sinks else None)

    # -- memory (the planner: backends/memory.py) ----------------------------------------------
    def _zeros(self, shape, dtype):
        return self.builder.zeros(tuple(shape), np.dtype(dtype))

    def _alloc(self, aval, fits=None) -> int:
        return super()._alloc(self._room(aval), fits)

    def _sub_slot(self, aval) -> int:
        return super()._sub_slot(self._room(aval))

    def _room(self, aval):
        """The buffer type of a value: a stack of saved turns gets rows for its cap or for
        `stack_turns`, whichever is more (the turn axis of its type is only an upper bound)."""
        if not ir.is_stack(aval):
            return aval
        shape = aval.shape
        if aval.kind == ir.BATCHED_STACK:       # (B, cap, *value) under vmap: stored turn-major, (rows, B, *value)
            shape = shape[1:2] + shape[:1] + shape[2:]
        cap, row = shape[0], int(np.prod(shape[1:], dtype=np.int64)) * aval.dtype.itemsize
        rows = max(self.stack_turns, cap if cap * row <= STACK_CAP_BYTES else 0)
        return AVal((rows,) + shape[1:], aval.dtype, aval.kind)

    def overflow(self):
        """The device cell the stack kernels raise to the turns they needed past a stack's room."""
        if self.plan.overflow is None:
            self.plan.overflow = self._zeros((1,), np.uint32)
        return self.plan.overflow

    def _fits(self, path):
        """Which freed top-level slots an output of an equation on branch `path` may take: those whose
        users all run in order with it (reusing a slot of a sibling branch would serialise the
        branches)."""
        return lambda k: all(_ordered(q, path) for q in self.slot_paths.get(k, ()))

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

    def read(self, chain, atom, writes, private):
        """The array a node that writes the slots `writes` reads `atom` from: its buffer, or a copy of
        it made first (on `chain`, once per node: `private`) where that buffer overlaps one the node
        writes without being that very view. Every input is then read before any write."""
        if isinstance(atom, Literal):
            return self.buf(atom)
        s = self.slot_of[atom]
        if not self.aliases.get(s, set()) & set(writes):
            return self.slots[s]
        if s not in private:
            src = self.slots[s]
            t = self._new_slot(self._zeros(src.shape, src.dtype))
            chain.memcpy(self.slots[t], src, label="overlapping input")
            private[s] = self.slots[t]
        return private[s]

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
        self._walk_top(prog, lambda i, e: self._gen_eqn(seq, prog, i, e, {}, top=True))
        return seq.finish()

    def _gen_eqn(self, seq, prog, idx, e, pre, top=False):
        inplace = dict(e.params.get("inplace", ()) or ())
        outs = []
        for j, v in enumerate(e.outputs):
            if j in inplace:
                self.slot_of[v] = self.slot_of[e.inputs[inplace[j]]]
            else:
                self.slot_of[v] = self._out_slot(v, pre, top, self._fits(e.info.branch))
            outs.append(self.slot_of[v])
        reads = {self.slot_of[a] for a in e.inputs if isinstance(a, Var)}
        writes = set(outs)
        if top:
            for k in reads | writes:
                self.slot_paths.setdefault(k, set()).add(tuple(e.info.branch))
        chain = _Chain(self, seq.level, seq.open(e.info.branch, reads, writes))
        cuda_rules[e.prim](self, chain, e, outs)
        seq.close(chain.tail(), reads, writes)

    def _gen_call(self, chain, e, outs):
        """A kernel call; under vmap (`batch`), one launch of the same kernel per instance, over
        instance b's part of each batched array (the batch axis leads: a contiguous (*shape, n)
        block) and the whole of each shared one."""
        spec, n = e.params["spec"], e.params["n"]
        batch = e.params.get("batch")
        if not batch:
            return self._launch(chain, spec, n, e.inputs, outs, lambda a, batched: a)
        in_batched = e.params["in_batched"]
        for b in range(int(np.prod(batch))):
            self._launch(chain, spec, n, e.inputs, outs, lambda a, batched, b=b: self.view(a, b) if batched else a,
                         in_batched)

    def view(self, arr, b):
        """Instance b's part of a batched buffer (a view: rebind lowers again where one was taken
        of an argument)."""
        for k, s in enumerate(self.slots):
            if s is arr:
                self.plan.view_slots.add(k)
                break
        return arr[b] if arr.ndim > 1 else arr[b:b + 1]

    def _launch(self, chain, spec, n, inputs, outs, part, in_batched=None):
        """The nodes of one kernel launch; part(array, batched): the array the kernel gets."""
        batched = in_batched or (False,) * len(inputs)
        mod = body_module(spec)
        ek = mod.emitted
        ins = inputs[:len(spec.kernel.param_names)]
        ws = None
        if ek.workspace_bytes:
            ws = self._zeros((ek.workspace_bytes,), np.uint8)
            self.plan.workspaces.append(ws)
        args, private = [], {}
        for prm in ek.params:
            if prm.role in ("in_plane", "in_cell"):
                args.append(part(self.read(chain, ins[prm.index], outs, private), batched[prm.index]))
            elif prm.role == "in_value":
                a = ins[prm.index]
                if not isinstance(a, Literal):
                    raise NotImplementedError(f"eagle_fx CUDA lowering: {spec.kernel.name} takes input {prm.index} by "
                                              "value, but the graph passes a buffer")
                args.append(np.dtype(prm.dtype).type(a.value))
            elif prm.role in ("out_plane", "out_cell"):
                args.append(part(self.slots[outs[prm.index]], True))
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
            grid, block = (1, 1) if en.launch == "single" else (grid_for(n), BLOCK)
            chain.kernel(mod, en.name, grid, block, args, "body", name)

    def _gen_structure(self, chain, e, outs):
        """slice/update/concat: strided copies (eagle_strided_copy); reshape: a memcpy (both C order)."""
        p, out, private = e.prim, self.slots[outs[0]], {}

        def src(atom):
            return self.read(chain, atom, outs, private)
        if p is ir.reshape_p:
            chain.memcpy(out, src(e.inputs[0]), label="reshape")
            return
        if p is ir.slice_p:
            a = e.inputs[0]
            self._strided(chain, out, src(a), a.aval, _region(a.aval, e.params["index"]),
                          _region(e.outputs[0].aval, None), "slice")
        elif p is ir.update_p:
            base, value = e.inputs
            if self.buf(base) is not out:          # a functional update: the base is copied first
                chain.memcpy(out, src(base), label="update")
            self._strided(chain, out, src(value), value.aval, _region(value.aval, None),
                          _region(base.aval, e.params["index"]), "update")
        else:
            axis, start, shape = e.params["axis"], 0, e.outputs[0].aval.shape
            for a in e.inputs:
                k = a.aval.shape[axis]
                index = tuple(range(start, start + k) if i == axis else range(d) for i, d in enumerate(shape))
                self._strided(chain, out, src(a), a.aval, _region(a.aval, None), _region(e.outputs[0].aval, index),
                              "concat")
                start += k

    def _strided(self, chain, dst, src, aval, src_region, dst_region, label):
        (shape, sstride, soff), (dshape, dstride, doff) = src_region, dst_region
        assert shape == dshape, (shape, dshape)
        count = int(np.prod(shape))
        geom = self.const(list(shape) + list(sstride) + list(dstride) + [soff, doff], np.int64)
        args = [dst, src, geom, np.uint32(len(shape)), np.uint64(count), np.uint32(aval.dtype.itemsize)]
        chain.kernel(LOWERING, "eagle_strided_copy", grid_for(count), BLOCK, args, "copy", label)

    def _gen_opaque(self, chain, e, outs):
        label = e.info.name or getattr(e.params["fn"], "__name__", "fn")
        if self.depth:
            raise NotImplementedError(f"eagle_fx CUDA lowering: the opaque node {label!r} is inside a device if/loop; "
                                      "a CUDA graph's conditional bodies cannot hold host nodes: move it out of the "
                                      "device if/loop, or write it as a kernel")
        chain.push(self.host(chain.level, chain.deps(), e.params["fn"], label))

    # -- sub-programs ------------------------------------------------------------------------
    def _gen_sub(self, level, start, sub: Program, operands, out_slots) -> tuple:
        """Lower `sub` on `level` after `start`, its inputs bound to the operands' slots and its
        outputs landing in out_slots; returns its tails."""
        seq = _Seq(self, level, start)
        for s, a in self._bind_operands(sub, operands):
            self._copy_item(seq, s, a)
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
        if isinstance(src, Var):            # (through a copy where src overlaps dst: memcpy must not)
            chain.memcpy(dst, self.read(chain, src, {dst_slot}, {}), label="copy")
        else:
            chain.memcpy(dst, self.const(src.value, dst.dtype, tuple(dst.shape)), label="constant")
        seq.close(chain.tail(), reads, {dst_slot})

    def _gen_copies(self, seq, srcs, out_slots):
        for s, a in self._copy_moves(srcs, out_slots):
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

    def _gen_cells(self, chain, e, outs):
        if e.outputs[0].aval.shape != (1,):
            return self._cells(chain, _CELLS_OP[e.prim], outs[0], *e.inputs)
        args = [self.slots[outs[0]]] + [self.buf(a, ir.U32_CELL) for a in e.inputs]
        chain.kernel(LOWERING, _CELL_ENTRY[e.prim], 1, 1, args, "cell", e.prim.name)

    def _cells(self, chain, op, out_slot, a, b=None):
        """eagle_cells: a cell per instance from cells per instance or shared (op: _CELLS_OP)."""
        out = self.slots[out_slot]
        count = int(np.prod(out.shape))

        def operand(x):
            if x is None:
                return None, np.uint32(0)
            return self.buf(x, ir.U32_CELL if x.aval.shape == (1,) else x.aval), np.uint32(x.aval.shape != (1,))
        (pa, sa), (pb, sb) = operand(a), operand(b)
        chain.kernel(LOWERING, "eagle_cells", grid_for(count), BLOCK,
                     [out, pa, pb, np.uint32(count), sa, sb, np.uint32(op)], "cell", "cells per instance")

    # -- vmap's masked forms: every arm or turn runs, each instance keeps its own ------------
    def _masked_copy(self, chain, dst_slot, src, mask, aval, mode, key=0):
        """eagle_masked_copy: dst = src for the instances `mask` (a u32 per instance) selects."""
        dst = self.slots[dst_slot]
        count = int(np.prod(aval.shape, dtype=np.int64))
        per = max(1, count // max(1, int(aval.shape[0])))
        chain.kernel(LOWERING, "eagle_masked_copy", grid_for(count), BLOCK,
                     [dst, src, mask, np.uint64(per), np.uint64(count), np.uint32(aval.dtype.itemsize), np.uint32(mode),
                      np.int64(key)], "copy", "masked")

    def _gen_masked_branches(self, chain, e, outs, cases=None):
        """Every arm, each on private copies of the operands arms write in place, into buffers of
        its own; then each instance's: a cond's true arm where its cell is set (cases None), a
        switch's default, then each case's arm where the cell equals it."""
        if any(ir.is_stack(v.aval) for v in e.outputs):
            raise NotImplementedError("eagle_fx CUDA lowering: a stack of saved loop turns leaving an if/match with "
                                      "a condition per instance")
        level, pred, operands = chain.level, e.inputs[0], list(e.inputs[1:])
        p = self._sub_slot(pred.aval)            # read once: an arm may write that cell in place
        chain.memcpy(self.slots[p], self.buf(pred), label="selector")
        written = {i - 1 for _, i in e.params["inplace"]}
        arm_outs = []
        for arm in e.params["branches"]:
            ops = list(operands)
            for i in written:
                t = self._sub_slot(ops[i].aval)
                chain.memcpy(self.slots[t], self.buf(ops[i]), label="private operand")
                ops[i] = self._ref(t, ops[i].aval)
            t_slots = [self._sub_slot(v.aval) for v in e.outputs]
            chain.last = self._gen_sub(level, chain.deps(), arm, ops, t_slots)
            arm_outs.append(t_slots)
        mask = self.slots[p]
        first, rest = (arm_outs[0], [(0, arm_outs[1], 0)]) if cases is None else \
            (arm_outs[-1], [(2, slots, c) for c, slots in zip(cases, arm_outs[:-1])])
        for o, t in zip(outs, first):
            chain.memcpy(self.slots[o], self.slots[t], label="arm")
        for mode, slots, key in rest:
            for o, t, v in zip(outs, slots, e.outputs):
                self._masked_copy(chain, o, self.slots[t], mask, v.aval, mode, key)

    def _gen_cond(self, chain, e, outs):
        if e.params.get("masked"):
            return self._gen_masked_branches(chain, e, outs)
        false_p, true_p = e.params["branches"]
        c = self.condition(chain.level)
        chain.kernel(GUARDS, "set_cond_from_cell", 1, 1, [c, self.buf(e.inputs[0], ir.U32_CELL)], "guard", "if", c)
        node, (then_l, else_l) = self.conditional(chain.level, chain.deps(), "if_else", c, label="if")
        chain.push(node)
        self._body(then_l, true_p, e.inputs[1:], outs)
        self._body(else_l, false_p, e.inputs[1:], outs)

    def _gen_switch(self, chain, e, outs):
        if e.params.get("masked"):
            return self._gen_masked_branches(chain, e, outs, tuple(e.params["cases"]))
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
        if e.params.get("masked"):
            return self._gen_masked_while(chain, e, outs)
        body, cond = e.params["body"], e.params["cond"]
        cap, counted = e.params["cap"], e.params["counted"]
        w = ir.WhileOperands(e)
        trip, consts, init = w.trip, w.consts, w.carries
        level = chain.level
        chain.last = self._copies_seq(level, chain.deps(), init, outs)
        reads_turn = any(body.inputs[0] in q.inputs for q in body.eqns) or body.inputs[0] in body.outputs
        needs_counter = cap is not None or counted or reads_turn
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

        def finish_body(tails):
            _, tails = guard_cell(body_l, tails)       # the same cell as before the loop
            _Chain(self, body_l, tails).kernel(step[0], step[1], 1, 1, step[2], "guard", "while", c)

        self._body(body_l, body, refs, outs, extra=finish_body)


    def _gen_masked_while(self, chain, e, outs):
        """A device loop that turns while ANY instance's guard holds (eagle_masked_loop, after the
        body, as an unmasked loop's guard). On the turn an instance finishes its carries are kept
        aside (its part only), and put back after the loop: the turns it runs past its end, as
        the NumPy backend's, touch nothing it returns. A capped loop stops every instance."""
        body, cond = e.params["body"], e.params["cond"]
        cap, counted = e.params["cap"], e.params["counted"]
        w = ir.WhileOperands(e)
        trip, consts, init = w.trip, list(w.consts), list(w.carries)
        level = chain.level
        if not outs:            # it carries nothing and writes nothing: no turn has an effect
            chain.push(self.join(level, chain.deps(), label="empty loop"))
            return
        B = int(e.outputs[0].aval.shape[0])
        chain.last = self._copies_seq(level, chain.deps(), init, outs)
        trips, ts = None, np.uint32(0)
        if counted:             # read once, on entry: a body that writes its trip cell turns as often
            tslot = self._sub_slot(trip.aval)
            chain.memcpy(self.slots[tslot], self.buf(trip), label="trip counts")
            trips, ts = self.slots[tslot], np.uint32(trip.aval.shape != (1,))
        live = self._sub_slot(ir.plane_aval((B,), np.uint32))
        done = self._sub_slot(ir.plane_aval((B,), np.uint32))
        ctr, go = self._sub_slot(ir.U32_CELL), self._sub_slot(ir.U32_CELL)
        kept = [(o, self._sub_slot(v.aval), v.aval) for o, v in zip(outs, e.outputs) if not ir.is_stack(v.aval)]
        carries = [self._ref(s, a.aval) for s, a in zip(outs, init)]
        c_slot = None

        def guard(level_, start):
            """The guard program on the carries: (its cells, tails)."""
            nonlocal c_slot
            if cond is None:
                return None, start
            c_ops = consts + carries
            if not cond.eqns and cond.outputs[0] in cond.inputs:     # the guard is a carried cell itself
                return c_ops[cond.inputs.index(cond.outputs[0])], start
            if c_slot is None:
                c_slot = self._sub_slot(cond.outputs[0].aval)
            return self._ref(c_slot, cond.outputs[0].aval), self._gen_sub(level_, start, cond, c_ops, [c_slot])

        c = self.condition(level)

        def step(ch, g, start):
            gs = np.uint32(0 if g is None else g.aval.shape != (1,))
            args = [self.slots[ctr], self.slots[go], self.slots[live], self.slots[done], None if g is None else self.buf(g),
                    gs, trips, ts, np.uint32(0xFFFFFFFF if cap is None else cap), np.uint32(B), np.uint32(start)]
            ch.kernel(LOWERING, "eagle_masked_loop", 1, 1, args, "select", "while")
            for o, k, aval in kept:            # the carries of instances that finished on this turn
                self._masked_copy(ch, k, self.slots[o], self.slots[done], aval, 0)
            ch.kernel(GUARDS, "set_cond_from_cell", 1, 1, [c, self.slots[go]], "guard", "while", c)

        g, chain.last = guard(level, chain.last)
        step(chain, g, 1)
        node, (body_l,) = self.conditional(level, chain.deps(), "while", c, label="while")
        chain.push(node)
        refs = [self._ref(ctr, ir.U32_CELL)] + consts + carries

        def finish_body(tails):
            g_, tails = guard(body_l, tails)
            step(_Chain(self, body_l, tails), g_, 0)

        self._body(body_l, body, refs, outs, extra=finish_body)
        for o, k, aval in kept:                # every instance but those the cap stopped
            self._masked_copy(chain, o, self.slots[k], self.slots[live], aval, 1)

    # -- vmap's other primitives ---------------------------------------------------------------
    def _spread(self, chain, atom, aval):
        """The device array of `atom` at the shape of `aval` (a shared value over a batch): its own
        buffer where it has that shape, else a copy spread by eagle_strided_copy (stride 0)."""
        if isinstance(atom, Literal) or tuple(atom.aval.shape) == tuple(aval.shape):
            return self.buf(atom, aval)
        out = self._sub_slot(aval)
        self._broadcast(chain, self.slots[out], self.buf(atom), atom.aval, aval, "spread")
        return self.slots[out]

    def _broadcast(self, chain, dst, src, src_aval, dst_aval, label, axis=0):
        """eagle_strided_copy of src over the leading axes of dst it lacks (NumPy's broadcasting);
        axis > 0: over that axis of dst (an inner batch axis under an outer one)."""
        shape, item = tuple(dst.shape), dst_aval.dtype.itemsize
        sshape = (1,) * (len(shape) - len(src.shape)) + tuple(src.shape) if not axis else \
            tuple(src.shape[:axis]) + (1,) + tuple(src.shape[axis:])
        sstr = [0 if d == 1 and t != 1 else st for d, t, st in zip(sshape, shape, _c_strides(sshape, item))]
        self._strided(chain, dst, src, dst_aval, (shape, sstr, 0), (shape, list(_c_strides(shape, item)), 0), label)

    def _gen_batch_broadcast(self, chain, e, outs):
        """A shared value spread over a batch. A stack of saved turns (rows, *value) becomes one of
        (rows, B, *value), the rows both hold."""
        (x,), out, aval = e.inputs, self.slots[outs[0]], e.outputs[0].aval
        if isinstance(x, Literal) or not ir.is_stack(aval):
            if isinstance(x, Literal):
                chain.memcpy(out, self.const(x.value, aval.dtype, tuple(out.shape)), label="constant")
            else:
                self._broadcast(chain, out, self.buf(x), x.aval, aval, "batch_broadcast", e.params.get("axis", 0))
            return
        src = self.buf(x)
        rows = min(int(src.shape[0]), int(out.shape[0]))
        shape = (rows,) + tuple(out.shape[1:])
        item = aval.dtype.itemsize
        sstr = list(_c_strides(tuple(src.shape), item))
        sstr = sstr[:1] + [0] + sstr[1:]
        self._strided(chain, out, src, aval, (shape, sstr, 0), (shape, list(_c_strides(tuple(out.shape), item))[:len(shape)], 0),
                      "batch_broadcast")

    # -- the derivative programs' primitives (ir.py: zeros .. cell_rev) --------------------------
    def _gen_zeros(self, chain, e, outs):
        if ir.is_stack(e.outputs[0].aval):        # no turn is saved yet: nothing is read before a push
            chain.push(self.join(chain.level, chain.deps(), label="empty stack"))
        else:
            chain.memset(self.slots[outs[0]], 0, label="zeros")

    def _gen_add_any(self, chain, e, outs):
        out_aval = e.outputs[0].aval
        if out_aval.dtype not in ADD_DTYPES:
            raise NotImplementedError(f"eagle_fx CUDA lowering: add_any of {out_aval.dtype} planes")
        count = int(np.prod(out_aval.shape))
        a, b = (self._spread(chain, x, out_aval) for x in e.inputs)     # (under vmap: a shared one spread)
        chain.kernel(LOWERING, _add_entry(out_aval.dtype), grid_for(count), BLOCK,
                     [self.slots[outs[0]], a, b, np.uint64(count)], "sum", "add_any")

    def _turn(self, e, atom):
        return self.buf(atom, ir.U32_CELL)

    def _gen_stack_push(self, chain, e, outs):
        _, turn, value = e.inputs
        stack = self.slots[outs[0]]
        row = ir.plane_aval(tuple(stack.shape[1:]), stack.dtype)    # under vmap (B, *value): a shared value is spread
        count = int(np.prod(stack.shape[1:], dtype=np.int64))
        args = [stack, self._spread(chain, value, row), self._turn(e, turn), np.uint64(count),
                np.uint32(stack.dtype.itemsize), np.uint32(stack.shape[0]), self.overflow()]
        chain.kernel(LOWERING, "eagle_stack_push", grid_for(count), BLOCK, args, "stack", "push")

    def _gen_stack_read(self, chain, e, outs):
        stack, turn = self.buf(e.inputs[0]), self._turn(e, e.inputs[1])
        count = int(np.prod(stack.shape[1:], dtype=np.int64))
        if e.params.get("turn_batched"):          # a turn per instance: each reads its own row
            B = int(e.outputs[0].aval.shape[0])
            per = int(np.prod(e.outputs[0].aval.shape[1:], dtype=np.int64))
            args = [self.slots[outs[0]], stack, turn, np.uint64(per), np.uint64(count),
                    np.uint64(per if e.params.get("batched") else 0), np.uint32(B), np.uint32(stack.dtype.itemsize),
                    np.uint32(stack.shape[0]), self.overflow()]
            chain.kernel(LOWERING, "eagle_stack_gather", grid_for(per * B), BLOCK, args, "stack", "gather")
            return
        args = [self.slots[outs[0]], stack, turn, np.uint64(count), np.uint32(stack.dtype.itemsize),
                np.uint32(stack.shape[0]), self.overflow()]
        chain.kernel(LOWERING, "eagle_stack_read", grid_for(count), BLOCK, args, "stack", "read")

    def _gen_cell_count(self, chain, e, outs):
        if e.outputs[0].aval.shape != (1,):      # turn counters per instance
            return self._cells(chain, _CELLS_OP[e.prim], outs[0], *e.inputs)
        entry = "eagle_cell_inc" if e.prim is ir.cell_inc_p else "eagle_cell_rev"
        args = [self.slots[outs[0]]] + [self.buf(a, ir.U32_CELL) for a in e.inputs]
        chain.kernel(LOWERING, entry, 1, 1, args, "cell", e.prim.name)

    def _gen_revolve(self, chain, e, outs):
        """A checkpointed reverse: a WHILE whose body runs one action of the binomial schedule
        (eagle_revolve_step, a state machine on the device: SWITCH over advance / reverse / store /
        restore), then asks for the next. The K kept states are (K, *shape) buffers, a turn each."""
        fwd, bwd, K, nc = e.params["forward"], e.params["backward"], int(e.params["checkpoints"]), e.params["n_consts"]
        if K < 1:
            raise ValueError(f"checkpoints={K}: keep at least one state (the loop's start)")
        nk = len(fwd.outputs)
        turns, consts = e.inputs[0], list(e.inputs[1:1 + nc])
        init, start = e.inputs[1 + nc:1 + nc + nk], e.inputs[1 + nc + nk:]
        level = chain.level
        masked = turns.aval.shape != (1,)         # vmap: a turn count per instance; the schedule runs the most
        if masked:
            most = self._sub_slot(ir.U32_CELL)
            chain.kernel(LOWERING, "eagle_cells_max", 1, 1, [self.slots[most], self.buf(turns, turns.aval),
                         np.uint32(np.prod(turns.aval.shape))], "cell", "most turns")
        work = [self._sub_slot(a.aval) for a in init]
        kept = [self._zeros((K,) + tuple(a.aval.shape), a.aval.dtype) for a in init]
        state = self._zeros((6 + 2 * K,), np.uint32)
        kind, ctr, slot = (self._sub_slot(ir.U32_CELL) for _ in range(3))
        tails = self._copies_seq(level, chain.deps(), start, outs)     # the seeds and zero sums
        chain.last = self._copies_seq(level, tails, init, work)
        loop = self.condition(level)
        step = [loop, state, self.slots[most] if masked else self.buf(turns, ir.U32_CELL), np.uint32(K)]
        tail = [self.slots[kind], self.slots[ctr], self.slots[slot]]
        chain.kernel(LOWERING, "eagle_revolve_step", 1, 1, step + [np.uint32(1)] + tail, "guard", "revolve", loop)
        node, (body_l,) = self.conditional(level, chain.deps(), "while", loop, label="revolve")
        chain.push(node)
        self.depth += 1
        try:
            inner = _Chain(self, body_l, ())
            pick = self.condition(body_l)
            inner.kernel(GUARDS, "set_cond_from_value", 1, 1, [pick, self.slots[kind]], "guard", "revolve action", pick)
            sw, (advance, reverse, store, restore) = self.conditional(body_l, inner.deps(), "switch", pick, count=4,
                                                                     label="revolve action")
            inner.push(sw)
            turn_ref = self._ref(ctr, ir.U32_CELL)
            states = [self._ref(w, a.aval) for w, a in zip(work, init)]
            self._body(advance, fwd, [turn_ref] + consts + states, work)
            cts = [self._ref(o, v.aval) for o, v in zip(outs, e.outputs)]
            if masked:
                self._masked_reverse(reverse, bwd, turns, turn_ref, [turn_ref] + consts + states + cts, outs, e)
            else:
                self._body(reverse, bwd, [turn_ref] + consts + states + cts, outs)
            for lv, entry in ((store, "eagle_stack_push"), (restore, "eagle_stack_read")):
                c = _Chain(self, lv, ())
                for w, buf in zip(work, kept):
                    arr = self.slots[w]
                    count = int(np.prod(arr.shape, dtype=np.int64))
                    pair = [buf, arr] if entry == "eagle_stack_push" else [arr, buf]
                    c.kernel(LOWERING, entry, grid_for(count), BLOCK, pair + [self.slots[slot], np.uint64(count),
                             np.uint32(arr.dtype.itemsize), np.uint32(K), self.overflow()], "stack",
                             "keep" if entry == "eagle_stack_push" else "restore")
                self._seal(lv)
            inner.kernel(LOWERING, "eagle_revolve_step", 1, 1, step + [np.uint32(0)] + tail, "guard", "revolve", loop)
        finally:
            self.depth -= 1

    def _masked_reverse(self, level, bwd, turns, turn_ref, operands, outs, e):
        """A masked revolve's reverse of turn t: instances whose own turns end at or before t keep
        the cotangents they had (copied aside first, put back after)."""
        self.depth += 1
        try:
            ch = _Chain(self, level, ())
            before = [self._sub_slot(v.aval) for v in e.outputs]
            for o, b in zip(outs, before):
                ch.memcpy(self.slots[b], self.slots[o], label="cotangents before")
            done = self._sub_slot(turns.aval)
            self._cells(ch, _CELLS_OP["le"], done, turns, turn_ref)
            ch.last = self._gen_sub(level, ch.deps(), bwd, operands, outs)
            for o, b, v in zip(outs, before, e.outputs):
                self._masked_copy(ch, o, self.slots[b], self.slots[done], v.aval, 0)
        finally:
            self.depth -= 1
        self._seal(level)


_CELL_ENTRY = {ir.cell_not_p: "eagle_cell_not", ir.cell_and_p: "eagle_cell_and", ir.cell_or_p: "eagle_cell_or"}
# eagle_cells' op codes (cells per instance)
_CELLS_OP = {ir.cell_not_p: 0, ir.cell_and_p: 1, ir.cell_or_p: 2, ir.cell_inc_p: 3, ir.cell_rev_p: 4, "le": 5}

# primitive -> rule(lowering, chain, eqn, output slots): adds the equation's nodes to `chain`
cuda_rules = RuleTable("CUDA lowering")
cuda_rules[ir.call_p] = _Lowering._gen_call
cuda_rules[ir.opaque_p] = _Lowering._gen_opaque
cuda_rules[ir.cond_p] = _Lowering._gen_cond
cuda_rules[ir.switch_p] = _Lowering._gen_switch
cuda_rules[ir.while_p] = _Lowering._gen_while
for _p in _CELL_ENTRY:
    cuda_rules[_p] = _Lowering._gen_cells
for _p in ir.STRUCTURE:
    cuda_rules[_p] = _Lowering._gen_structure
cuda_rules[ir.zeros_p] = _Lowering._gen_zeros
cuda_rules[ir.add_any_p] = _Lowering._gen_add_any
cuda_rules[ir.stack_push_p] = _Lowering._gen_stack_push
cuda_rules[ir.stack_read_p] = _Lowering._gen_stack_read
cuda_rules[ir.cell_inc_p] = _Lowering._gen_cell_count
cuda_rules[ir.cell_rev_p] = _Lowering._gen_cell_count
cuda_rules[ir.revolve_p] = _Lowering._gen_revolve
cuda_rules[batch_broadcast_p] = _Lowering._gen_batch_broadcast


@cuda_rules.refuse(ir.batch_sum_p)
def _batch_sum(lw, chain, e, outs):
    """Reverse mode over a batched program (grad of a Jacobian, jacrev of a vmap) sums a shared
    value's cotangent over the instances: not lowered to CUDA yet (NumPy and JAX run it)."""
    raise NotImplementedError("eagle_fx CUDA lowering: reverse mode over a batched program" +
                              (f" ({e.info.where})" if e.info.where else "") + " sums over the batch, which the CUDA lowering does not do yet; run it on the NumPy or JAX "
                              "backend, or take the derivative inside the batch (eagle_fx.vmap(eagle_fx.grad(f)))")
