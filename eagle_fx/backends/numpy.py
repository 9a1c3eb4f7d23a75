"""The NumPy backend: a Program becomes one generated Python function over preallocated buffers.

Lowering plans memory once: every Var gets a buffer slot; `inplace` outputs share their input's
slot (Mutable writes land in the caller's array, loop carries stay in one buffer); a value an arm
or loop body produces is written straight into the slot of the construct's output when no later
reader still needs that slot; top-level temporaries reuse freed slots by liveness. The replay
function is straight-line Python: kernel calls are calls of no arguments bound to the slot arrays
(at small n over scratch the graph owns: no per-thread lookup), device conditions read cells
(`if b3[0]:`), capped or counted loops are `for` loops over a range. Replays allocate no arrays.
After a cached call, `release` drops stacks of saved turns and kernel scratch over a threshold.
`bind` swaps the arrays of input slots and rebinds the partials; nothing is re-lowered.
"""
from __future__ import annotations

import functools
import threading

import numpy as np

from hawk_fx.caches import LRU, WeakMemo
from hawk_fx.core import Literal, Program, RuleTable, Var

from hawk_fx.emit.numpy import NumpyKernel, overlapping_inputs

from .. import ir
from ..ir.analysis import direct_outputs
from ..transforms import checkpoint
from .fusion import fused
from .memory import SlotPlanner
from .numpy_stack import Stack


_CELL_UFUNC = {ir.cell_not_p: "np.logical_not", ir.cell_and_p: "np.logical_and", ir.cell_or_p: "np.logical_or"}


def _batched_kernel(spec, batch):
    """The kernel's NumPy code with scratch for `batch` instances (cached on the specialisation)."""
    cache = spec.__dict__.setdefault("_batched", {})
    k = cache.get(batch)
    if k is None:
        k = cache[batch] = NumpyKernel(spec.prog, spec.compiled.out_sample, batch=batch)
    return k


def _shared(x, batch, kernel):
    """A shared plane in a batched call: a size-1 batch axis, or, where the body reduces over
    samples (whose results must be one per instance), a stride-0 view over every instance."""
    x = x[..., None, :]
    return np.broadcast_to(x, x.shape[:-2] + tuple(batch) + x.shape[-1:]) if kernel.has_reduction else x


_CODE = LRU("numpy replay code", 1024)     # replay source -> its code object (a graph lowered again)
_VIEWABLE = WeakMemo()                      # fused plan -> its slices that may be views (read only)
OWN_SCRATCH_BYTES = 1 << 18    # a kernel's scratch up to this size at the graph's n is the graph's own


def _call(kernel, ins, outs, n, own_scratch):
    """A kernel call over bound arrays. Where its scratch is small (own_scratch(kernel, n) gives it,
    else None), a call of no arguments over the graph's own scratch: no lookup of the thread's.
    An input that overlaps an output without being the same view (two views of one user buffer)
    is copied into a private buffer before each run: the body reads every input before any write,
    as NumPy's `y[1:] = f(y[:-1], y[1:])` does."""
    overlap = overlapping_inputs(ins, outs)
    run = kernel.run_fn
    if not overlap:
        scratch = own_scratch(kernel, n) if n <= kernel.chunk else None
        if scratch is not None:
            return kernel.bind(ins, outs, n, scratch)
        return functools.partial(run, tuple(ins), tuple(outs), n)
    ins = list(ins)
    copies = []
    for k in overlap:
        copies.append((ins[k], np.empty(ins[k].shape, ins[k].dtype)))
        ins[k] = copies[-1][1]
    ins, outs = tuple(ins), tuple(outs)

    def call():
        for src, private in copies:
            np.copyto(private, src)
        run(ins, outs, n)
    return call


class _Gen:
    def __init__(self, exe):
        self.exe = exe
        self.lines: list[str] = []
        self.turns = 0
        self.loops: list[list] = []         # per enclosing loop: [its header line, depth, const slots, spreads]

    def loop_header(self, d, consts):
        """Open a loop whose header is the next line: work hoisted out of it goes just before it."""
        slots = {self.exe.slot_of[c] for c in consts if isinstance(c, Var)}
        self.loops.append([len(self.lines), d, slots, {}])

    def hoist(self, line) -> None:
        loop = self.loops[-1]
        self.lines.insert(loop[0], "    " * loop[1] + line)
        loop[0] += 1

    def emit(self, depth, line):
        self.lines.append("    " * depth + line)


class NumpyExecutable(SlotPlanner):
    """The NumPy backend's executable (the protocol of protocol.py): the Program as one generated
    Python function over buffers planned once."""

    backend_name = "cpu"

    def __init__(self, prog: Program, input_arrays, keep: set, n: int):
        self.prog = prog                # the Program as staged (other backends and tools read it)
        # what runs: fused calls
        self.plan = fused(prog, keep)
        self.n = n
        self.slots: list[np.ndarray] = []
        self.slot_of: dict[Var, int] = {}
        self.calls: list = []           # (kind, payload) per bound callable c{k}
        self.consts: list = []
        self._bind_inputs(prog, input_arrays, keep)
        self._init_pool()
        self.views: list = []           # (slot, input slot, index): slices read straight from a caller's array
        self.viewable = _VIEWABLE.get(self.plan)
        if self.viewable is None:
            self.viewable = _VIEWABLE[self.plan] = frozenset(_viewable_slices(self.plan))
        self._lock = threading.Lock()
        self._scratch: dict = {}        # (kernel, n) -> its (S, U), or None (_own_scratch)
        g = _Gen(self)
        self._gen_top(g)
        body = g.lines or ["pass"]
        self.source = "def replay(times):\n    for _ in range(times):\n" + "\n".join("        " + ln for ln in body) + "\n"
        self._code = _CODE.get(self.source)
        if self._code is None:
            self._code = _CODE[self.source] = compile(self.source, "<eagle graph>", "exec")
        self._link()

    # -- slots (the planner: backends/memory.py) -----------------------------------------------
    @staticmethod
    def _zeros(shape, dtype):
        return np.zeros(shape, dtype)

    def _alloc(self, aval, fits=None) -> int:
        if ir.is_stack(aval):          # saved loop turns: storage that grows as they are pushed
            return self._new_slot(Stack(aval))
        return super()._alloc(aval, fits)

    def _sub_slot(self, aval) -> int:
        return self._new_slot(Stack(aval)) if ir.is_stack(aval) else super()._sub_slot(aval)

    def b(self, atom) -> str:
        if isinstance(atom, Literal):
            return self._const(atom.value)
        return f"b{self.slot_of[atom]}"

    def _const(self, value) -> str:
        self.consts.append(np.asarray(value))
        return f"k{len(self.consts) - 1}"

    # -- generation --------------------------------------------------------------------------
    def _gen_top(self, g):
        prog = self.plan
        self._walk_top(prog, lambda i, e: self._gen_eqn(g, 0, prog, i, e, {}, top=True))

    def _gen_eqn(self, g, d, prog, idx, e, pre, top=False):
        if top and e in self.viewable:        # no copy: the slot is a NumPy view of the caller's array
            src, index = self.slot_of[e.inputs[0]], ir.numpy_index(e.params["index"])
            self.slot_of[e.outputs[0]] = self._new_slot(self.slots[src][index])
            self.views.append((self.slot_of[e.outputs[0]], src, index))
            return
        inplace = dict(e.params.get("inplace", ()) or ())
        outs = []
        for j, v in enumerate(e.outputs):
            if j in inplace:
                self.slot_of[v] = self.slot_of[e.inputs[inplace[j]]]
            else:
                self.slot_of[v] = self._out_slot(v, pre, top)
            outs.append(self.slot_of[v])
        numpy_rules[e.prim](self, g, d, e, outs)

    def _spread(self, g, e):
        """input index -> slot of its spread copy, for the batched Params of a call in a device loop
        that are consts of the loop: NumPy broadcasts a (B, 1) operand over short (B, n) rows several
        times slower than it reads a (B, n) one, so the spread is made once, before the loop."""
        batch, n = e.params.get("batch"), e.params["n"]
        if not batch or not g.loops:
            return {}
        header_slots, spreads = g.loops[-1][2], g.loops[-1][3]
        kernel = _batched_kernel(e.params["spec"], batch)
        out = {}
        for k, (a, b) in enumerate(zip(e.inputs, e.params["in_batched"])):
            if not (b and isinstance(a, Var) and k < len(kernel.spreadable) and kernel.spreadable[k]
                    and n <= kernel.chunk and self.slot_of[a] in header_slots):
                continue
            src = self.slot_of[a]
            if (src, n) not in spreads:
                moved = np.moveaxis(self.slots[src], 0, -2)
                spreads[(src, n)] = self._new_slot(np.zeros(moved.shape[:-1] + (n,), moved.dtype))
                g.hoist(f"np.copyto(b{spreads[(src, n)]}, np.moveaxis(b{src}, 0, -2))")
            out[k] = spreads[(src, n)]
        return out

    def _gen_sub(self, g, d, sub: Program, operands, out_slots):
        """Generate `sub` with its inputs bound to the operands' slots and its outputs landing in out_slots."""
        for s, a in self._bind_operands(sub, operands):
            g.emit(d, f"np.copyto(b{s}, {self.b(a)})")
        pre = direct_outputs(sub, out_slots, self.slot_of)
        start = len(g.lines)
        for i, e in enumerate(sub.eqns):
            self._gen_eqn(g, d, sub, i, e, pre)
        self._gen_copies(g, d, sub.outputs, out_slots)
        if len(g.lines) == start:
            g.emit(d, "pass")

    def _gen_copies(self, g, d, srcs, out_slots):
        for s, a in self._copy_moves(srcs, out_slots):
            g.emit(d, _copy(f"b{s}", self.b(a), a.aval))

    def _gen_while(self, g, d, e, outs):
        body, cond = e.params["body"], e.params["cond"]
        cap, counted = e.params["cap"], e.params["counted"]
        w = ir.WhileOperands(e)
        trip, consts, init = w.trip, w.consts, w.carries
        self._gen_copies(g, d, init, outs)
        t = f"t{g.turns}"
        g.turns += 1
        ctr = self._sub_slot(ir.U32_CELL)
        if counted:
            g.emit(d, f"{t}_n = int({self.b(trip)}[0])")
        g.loop_header(d, consts)
        if cap is None and not counted:
            g.emit(d, f"{t} = 0")
            g.emit(d, "while True:")
        else:           # the turns a cap or a trip count allow, as a range: no bookkeeping per turn
            g.emit(d, f"for {t} in range({cap if not counted else f'{t}_n' if cap is None else f'min({cap}, {t}_n)'}):")
        if cond is not None:
            c_ops = consts + [self._ref(s, a.aval) for s, a in zip(outs, init)]
            if not cond.eqns and cond.outputs[0] in cond.inputs:     # the guard is a carried cell itself
                a = c_ops[cond.inputs.index(cond.outputs[0])]
                g.emit(d + 1, f"if not {self.b(a)}[0]: break")
            else:
                c_slot = self._sub_slot(ir.U32_CELL)
                self._gen_sub(g, d + 1, cond, c_ops, [c_slot])
                g.emit(d + 1, f"if not b{c_slot}[0]: break")
        if any(body.inputs[0] in e.inputs for e in body.eqns) or body.inputs[0] in body.outputs:
            g.emit(d + 1, f"b{ctr}[0] = {t}")          # the body reads its turn counter
        refs = [self._ref(ctr, ir.U32_CELL)] + consts + [self._ref(s, a.aval) for s, a in zip(outs, init)]
        self._gen_sub(g, d + 1, body, refs, outs)
        g.loops.pop()
        if cap is None and not counted:
            g.emit(d + 1, f"{t} += 1")

    def _gen_revolve(self, g, d, e, outs):
        """A checkpointed reverse (ir.revolve_p): the loop body and its reverse step become local
        functions over a working state, driven by the binomial schedule (transforms/checkpoint.py);
        the kept states are stacks indexed by slot, so they too grow only as they are used."""
        fwd, bwd, K = e.params["forward"], e.params["backward"], e.params["checkpoints"]
        w = ir.WhileOperands(e)
        turns, consts, init, start = w.trip, w.consts, w.carries, w.rest
        self._gen_copies(g, d, start, outs)                  # the seeds and zero sums: what the steps update
        work = [self._sub_slot(a.aval) for a in init]
        kept = [self._new_slot(Stack(ir.stack_aval(K, a.aval.shape, a.aval.dtype))) for a in init]
        k = g.turns
        g.turns += 1
        ctr = self._sub_slot(ir.U32_CELL)
        state = [self._ref(s, a.aval) for s, a in zip(work, init)]
        g.loop_header(d, consts)
        g.emit(d, f"def fa{k}(t):")                         # one turn forward on the working state
        g.emit(d + 1, f"b{ctr}[0] = t")
        self._gen_sub(g, d + 1, fwd, [self._ref(ctr, ir.U32_CELL)] + list(consts) + state, work)
        g.emit(d, f"def fr{k}(t):")                         # the reverse step of turn t
        g.emit(d + 1, f"b{ctr}[0] = t")
        if e.params.get("masked"):                           # instances whose own turns end before t keep theirs
            done = self._new_slot(np.zeros(turns.aval.shape, bool))
            before = [self._sub_slot(v.aval) for v in e.outputs]
            g.emit(d + 1, f"np.less_equal({self.b(turns)}, t, out=b{done})")
            for o, b in zip(outs, before):
                g.emit(d + 1, f"np.copyto(b{b}, b{o})")
        cts = [self._ref(s, v.aval) for s, v in zip(outs, e.outputs)]
        self._gen_sub(g, d + 1, bwd, [self._ref(ctr, ir.U32_CELL)] + list(consts) + state + cts, outs)
        if e.params.get("masked"):
            self._merge(g, d + 1, done, outs, before)
        g.loops.pop()
        g.emit(d, f"def fs{k}(j):")                         # keep the working state in slot j
        for w, s in zip(work, kept):
            g.emit(d + 1, f"b{s}.push(j, b{w})")
        g.emit(d, f"def fl{k}(j):")                         # and back
        for w, s in zip(work, kept):
            g.emit(d + 1, f"np.copyto(b{w}, b{s}.read(j))")
        self._gen_copies(g, d, init, work)
        for s in kept:
            g.emit(d, f"b{s}.clear()")
        g.emit(d, f"revolve(int(np.max({self.b(turns)})), {K}, fa{k}, fr{k}, fs{k}, fl{k})")

    # -- batched (vmap) control flow: every arm runs, each instance keeps its own ---------------
    def _merge(self, g, d, mask_slot, outs, srcs):
        """out = src where the instance's mask is set. The mask is spread to each output's full
        shape first: copyto with a broadcast (stride-0) mask is several times slower."""
        m = self.slots[mask_slot]
        full = {}
        for o, src in zip(outs, srcs):
            shape = self.slots[o].shape
            if shape not in full:
                if shape == m.shape:
                    full[shape] = f"b{mask_slot}"
                else:
                    k = self._new_slot(np.zeros(shape, bool))
                    view = self._const(m.reshape(m.shape[:1] + (1,) * (len(shape) - 1)))
                    g.emit(d, f"np.copyto(b{k}, {view})")
                    full[shape] = f"b{k}"
            g.emit(d, f"np.copyto(b{o}, b{src}, where={full[shape]})")

    def _private(self, g, d, operands, positions):
        """Copies of the operands an arm writes in place, so arms run side by side."""
        ops = list(operands)
        for i in positions:
            a = ops[i]
            t = self._sub_slot(a.aval)
            g.emit(d, f"np.copyto(b{t}, {self.b(a)})")
            ops[i] = self._ref(t, a.aval)
        return ops

    def _gen_masked_branches(self, g, d, e, outs, cases=None):
        """Every arm, then each instance's own: a cond's true arm where its cell is set (cases None),
        a switch's default, then the arm of each of `cases` where the cell equals it."""
        if any(ir.is_stack(v.aval) for v in e.outputs):
            raise NotImplementedError("eagle numpy backend: a stack of saved loop turns leaving a batched arm")
        pred, operands = e.inputs[0], list(e.inputs[1:])
        written = [i - 1 for _, i in e.params["inplace"]]
        arms = e.params["branches"]
        if isinstance(pred, Var):       # read the selector once: an arm may write that cell in place
            p = self._sub_slot(pred.aval)
            g.emit(d, f"np.copyto(b{p}, {self.b(pred)})")
            pred = self._ref(p, pred.aval)
        arm_outs = []
        for arm in arms:
            t_slots = [self._sub_slot(v.aval) for v in e.outputs]
            self._gen_sub(g, d, arm, self._private(g, d, operands, written), t_slots)
            arm_outs.append(t_slots)
        mask = self._new_slot(np.zeros(pred.aval.shape, bool))
        if cases is None:
            false_s, true_s = arm_outs
            g.emit(d, f"np.not_equal({self.b(pred)}, 0, out=b{mask})")
            for o, f in zip(outs, false_s):
                g.emit(d, f"np.copyto(b{o}, b{f})")
            self._merge(g, d, mask, outs, true_s)
        else:
            for o, t in zip(outs, arm_outs[-1]):
                g.emit(d, f"np.copyto(b{o}, b{t})")
            for c, slots in zip(cases, arm_outs[:-1]):
                g.emit(d, f"np.equal({self.b(pred)}, {c}, out=b{mask})")
                self._merge(g, d, mask, outs, slots)

    def _gen_masked_while(self, g, d, e, outs):
        """Every instance runs the body until the last one is done. An instance's carries are kept
        (copied aside, its rows only) on the turn it finishes, and put back when the loop ends: the
        turns it runs past its end touch nothing it returns, and no turn merges whole carries."""
        body, cond = e.params["body"], e.params["cond"]
        cap, counted = e.params["cap"], e.params["counted"]
        w = ir.WhileOperands(e)
        trip, consts, init = w.trip, w.consts, w.carries
        if not outs:            # it carries nothing and writes nothing: no turn has an effect
            return
        self._gen_copies(g, d, init, outs)
        B = self.slots[outs[0]].shape[0]
        live = self._new_slot(np.ones((B, 1), bool))       # not finished yet
        mask = self._new_slot(np.zeros((B, 1), bool))      # runs this turn
        done = self._new_slot(np.zeros((B, 1), bool))      # finished on this turn
        kept = [self._sub_slot(v.aval) for v in e.outputs]  # the carries of finished instances
        t = f"t{g.turns}"
        g.turns += 1
        ctr = self._sub_slot(ir.U32_CELL)
        carries = [self._ref(s, a.aval) for s, a in zip(outs, init)]
        alive = f"{t}_alive"
        if counted and isinstance(trip, Var):
            # the trip counts are read once, on entry, as Python's range(k) and the unbatched loop
            # read them: a body that writes its own trip cell does not change how often it turns
            trips = self._sub_slot(trip.aval)
            g.emit(d, f"np.copyto(b{trips}, {self.b(trip)})")
            trip = self._ref(trips, trip.aval)
        g.emit(d, f"{t} = 0")
        g.emit(d, f"b{live}[...] = True")
        g.emit(d, f"{alive} = {B}")
        g.loop_header(d, consts)
        g.emit(d, "while True:")
        if cap is not None:
            g.emit(d + 1, f"if {t} >= {cap}: break")
        if cond is not None:
            c_ops = consts + carries
            if not cond.eqns and cond.outputs[0] in cond.inputs:     # the guard is a carried cell itself
                guard = self.b(c_ops[cond.inputs.index(cond.outputs[0])])
            else:
                c_slot = self._sub_slot(cond.outputs[0].aval)
                self._gen_sub(g, d + 1, cond, c_ops, [c_slot])
                guard = f"b{c_slot}"
            g.emit(d + 1, f"np.logical_and({guard}, b{live}, out=b{mask})")
        else:
            g.emit(d + 1, f"np.copyto(b{mask}, b{live})")
        if counted:
            g.emit(d + 1, f"np.greater({self.b(trip)}, {t}, out=b{done})")
            g.emit(d + 1, f"np.logical_and(b{mask}, b{done}, out=b{mask})")
        g.emit(d + 1, f"{t}_k = np.count_nonzero(b{mask})")
        g.emit(d + 1, f"if {t}_k != {alive}:")           # some instances finished on this turn
        g.emit(d + 2, f"r = np.flatnonzero(np.not_equal(b{live}, b{mask}, out=b{done}))")
        # a stack of saved turns is not kept: the turns an instance runs past its end are pushed
        # after all of its own, and its backward reads only its own (its turn count is kept)
        kept = [(o, k) for o, k, v in zip(outs, kept, e.outputs) if not ir.is_stack(v.aval)]
        for o, k in kept:
            g.emit(d + 2, f"b{k}[r] = b{o}[r]")
        g.emit(d + 2, f"np.copyto(b{live}, b{mask})")
        g.emit(d + 2, f"{alive} = {t}_k")
        g.emit(d + 2, f"if not {alive}: break")
        if any(body.inputs[0] in q.inputs for q in body.eqns) or body.inputs[0] in body.outputs:
            g.emit(d + 1, f"b{ctr}[0] = {t}")
        refs = [self._ref(ctr, ir.U32_CELL)] + consts + carries
        self._gen_sub(g, d + 1, body, refs, outs)
        g.loops.pop()
        g.emit(d + 1, f"{t} += 1")
        g.emit(d, f"np.logical_not(b{live}, out=b{done})")       # every instance but those the cap stopped
        g.emit(d, f"r = np.flatnonzero(b{done})")
        for o, k in kept:
            g.emit(d, f"b{o}[r] = b{k}[r]")

    # -- binding and running ------------------------------------------------------------------
    def _link(self):
        """Bind the generated function and the kernel calls to the slots' arrays (after the build,
        a bind, or a template's copy: the plan of what goes where is made once per lowering)."""
        plan = self.__dict__.get("_link_plan")
        if plan is None:
            plan = self._link_plan = self._plan_link()
        slot_names, const_names, calls, stacks = plan
        slots = self.slots
        for k, src, index in self.views:     # after bind, the views look into the new arrays
            slots[k] = slots[src][index]
        ns = dict(zip(slot_names, slots))
        ns.update(zip(const_names, self.consts))
        ns["np"], ns["revolve"] = np, checkpoint.run
        thread_scratch = set()
        for call in calls:
            name, fn = call[:2]
            if fn is not None:
                ns[name] = fn
                continue
            ns[name], kernel = self._bound_call(call)
            if self._scratch.get((kernel, call[5])) is None:
                thread_scratch.add(kernel)
        # what `release` looks at: the stacks, and the kernels that run on the thread's scratch
        self._releasable = ([slots[k] for k in stacks], list(thread_scratch))
        self.release_needed = any(self._releasable)        # read by the staging cache after each call
        exec(self._code, ns)
        self._replay = ns.pop("replay")     # not kept in its own globals: no cycle, freed when the graph is

    def _bound_call(self, call):
        """(the callable c{k} of a kernel call of the link plan over the slots' arrays, its kernel)."""
        kernel, ins, out_arrays = self._call_arrays(call)
        return _call(kernel, ins, out_arrays, call[5], self._own_scratch), kernel

    def _call_arrays(self, call):
        """(kernel, input arrays or values, output arrays) of a kernel call of the link plan."""
        _, _, spec, ins, outs, n, batch, in_batched, spread = call
        slots = self.slots
        ins = [slots[a] if type(a) is int else a.value for a in ins]
        out_arrays = [slots[s] for s in outs]
        kernel = spec.compiled
        if batch:        # vmap: (B, *shape, n) planes seen as (*shape, B, n); shared ones get a size-1 axis
            kernel = _batched_kernel(spec, batch)
            ins = [slots[spread[k]] if k in spread else x if not isinstance(x, np.ndarray)
                   else (np.moveaxis(x, 0, -2) if b else _shared(x, batch, kernel))
                   for k, (x, b) in enumerate(zip(ins, in_batched))]
            out_arrays = [np.moveaxis(o, 0, -2) for o in out_arrays]
        return kernel, ins, out_arrays

    def rebind_inputs(self, arrays) -> None:
        """New arrays in the input slots, laid out as the ones there (a graph used again for a new
        call): only the views of them and the kernel calls that touch them are bound again, in the
        generated function's namespace; _link binds everything."""
        slots = self.slots
        ns = self._replay.__globals__
        names = self._link_plan[0]
        changed = False
        for k, arr in zip(self.input_slots, arrays):
            if slots[k] is not arr:
                slots[k] = ns[names[k]] = arr
                changed = True
        if not changed:
            return
        for k, src, index in self.views:
            slots[k] = ns[names[k]] = slots[src][index]
        for name, call, fast in self.prepare_rebind():
            if fast is None:
                ns[name] = self._bound_call(call)[0]
                continue
            kernel, ins, outs, scratch, moving = fast     # on the graph's own scratch: the kernel's bind, straight
            ins, outs = list(ins), list(outs)
            for into, i, k, axes in moving:
                (ins, outs)[into][i] = slots[k] if axes is None else slots[k].transpose(axes)
            ns[name] = kernel.bind(ins, outs, call[5], scratch)

    def prepare_rebind(self):
        """What rebind_inputs binds again (made once: it holds the output buffers)."""
        plan = self.__dict__.get("_input_calls")
        if plan is None:
            plan = self._input_calls = self._plan_rebind()
        return plan

    def _plan_rebind(self):
        """Per kernel call that reads or writes an input slot or a view of one: (name, its link plan
        entry, and, for a call on the graph's own scratch with no input copied aside, what its
        kernel's bind takes: (kernel, inputs and outputs with None where an input slot goes,
        scratch, (0 for an input or 1 for an output, position, slot, axes of the batched view or
        None) per such slot)). The layout key of a cached call keeps which arguments overlap, so a
        call bound without private copies stays so on new arrays of the same layout."""
        reach = set(self.input_slots) | {k for k, _, _ in self.views}
        out = []
        for call in self._link_plan[2]:
            if call[1] is not None:
                continue
            _, _, spec, ins, outs, n, batch, in_batched, spread = call
            moving_in = [j for j, a in enumerate(ins) if type(a) is int and a in reach and j not in spread]
            moving_out = [j for j, k in enumerate(outs) if k in reach]
            if not moving_in and not moving_out:
                continue
            kernel, arrays, out_arrays = self._call_arrays(call)
            scratch = self._scratch.get((kernel, n)) if n <= kernel.chunk else None
            fast = None
            if (scratch is not None and not overlapping_inputs(arrays, out_arrays)
                    and (not batch or all(in_batched[j] for j in moving_in))):
                moving = []
                for into, listed, slots_of, js in ((0, arrays, ins, moving_in), (1, out_arrays, outs, moving_out)):
                    for j in js:
                        d = self.slots[slots_of[j]].ndim
                        moving.append((into, j, slots_of[j], (*range(1, d - 1), 0, d - 1) if batch else None))
                        listed[j] = None      # not the first call's array: it is not kept alive
                fast = (kernel, tuple(arrays), tuple(out_arrays), scratch, tuple(moving))
            out.append((call[0], call, fast))
        return tuple(out)

    def _plan_link(self):
        """(slot names, const names, per bound callable (name, host function or None, and for a
        kernel call its spec, input slots or Literals, output slots, n, batch, in_batched, spread),
        the slots of stacks): what _link needs, with every Var resolved to its slot."""
        calls = []
        for k, call in enumerate(self.calls):
            if call[0] == "fn":
                calls.append((f"c{k}", call[1], None, None, None, None, None, None, None))
                continue
            _, spec, inputs, outs, n, batch, in_batched, spread = call
            nparams = len(spec.kernel.param_names)
            ins = tuple(a if isinstance(a, Literal) else self.slot_of[a] for a in inputs[:nparams])
            calls.append((f"c{k}", None, spec, ins, tuple(outs), n, batch, in_batched, spread))
        stacks = tuple(k for k, s in enumerate(self.slots) if isinstance(s, Stack))
        return (tuple(f"b{k}" for k in range(len(self.slots))), tuple(f"k{k}" for k in range(len(self.consts))),
                tuple(calls), stacks)

    def _own_scratch(self, kernel, n):
        """The graph's own scratch for `kernel` at n samples, shared by its call sites (replays run one
        at a time, under the lock): None where it is larger than OWN_SCRATCH_BYTES."""
        scratch = self._scratch.get((kernel, n))
        if scratch is None and (kernel, n) not in self._scratch:
            scratch = kernel.new_scratch(n)
            if sum(a.nbytes for part in scratch for a in part) > OWN_SCRATCH_BYTES:
                scratch = None
            self._scratch[kernel, n] = scratch
        return scratch

    def rebind(self, input_index: int, arr: np.ndarray):
        self.slots[self.input_slots[input_index]] = arr
        self._link()

    def replay(self, times: int = 1):
        # kernels keep their scratch per thread; this graph's buffers are its own, so two threads
        # replaying this one graph take turns, and any other graph or eager call runs alongside
        with self._lock:
            self._replay(times)

    def release(self, min_bytes: int) -> None:
        """After a cached call returns: drop the stacks of saved turns and this thread's kernel
        scratch that hold more than min_bytes; the next replay allocates them again as it goes.
        Buffers of one value each (n samples) stay: the graph is planned over them; so does the
        scratch the graph owns (OWN_SCRATCH_BYTES at most per kernel)."""
        stacks, kernels = self._releasable
        with self._lock:
            for s in stacks:
                s.release(min_bytes)
            for kernel in kernels:
                kernel.release_scratch(min_bytes)

    def array_of(self, var):
        k = self.slot_of.get(var)
        return None if k is None else self.slots[k]


# -- the rules: prim -> fn(exe, g, d, e, outs), the lines of e at depth d (outs: its output slots) -------

numpy_rules = RuleTable("eagle numpy backend")


@numpy_rules.register(ir.call_p)
def _gen_call(exe, g, d, e, outs):
    k = len(exe.calls)
    exe.calls.append(("call", e.params["spec"], list(e.inputs), outs, e.params["n"],
                      e.params.get("batch", ()), e.params.get("in_batched"), exe._spread(g, e)))
    g.emit(d, f"c{k}()")


@numpy_rules.register(ir.opaque_p)
def _gen_opaque(exe, g, d, e, outs):
    k = len(exe.calls)
    exe.calls.append(("fn", e.params["fn"]))
    g.emit(d, f"c{k}()")


def _cell(line):
    """A cell-logic rule: `line(exe, e, outs)` for one cell; batched cells, one per instance, by ufunc."""
    def rule(exe, g, d, e, outs):
        if e.outputs[0].aval.shape != (1,):
            g.emit(d, f"{_CELL_UFUNC[e.prim]}({', '.join(exe.b(a) for a in e.inputs)}, out=b{outs[0]})")
        else:
            g.emit(d, line(exe, e, outs))
    return rule


numpy_rules[ir.cell_not_p] = _cell(lambda exe, e, outs: f"b{outs[0]}[0] = {exe.b(e.inputs[0])}[0] == 0")
numpy_rules[ir.cell_and_p] = _cell(
    lambda exe, e, outs: f"b{outs[0]}[0] = ({exe.b(e.inputs[0])}[0] != 0) & ({exe.b(e.inputs[1])}[0] != 0)")
numpy_rules[ir.cell_or_p] = _cell(
    lambda exe, e, outs: f"b{outs[0]}[0] = ({exe.b(e.inputs[0])}[0] != 0) | ({exe.b(e.inputs[1])}[0] != 0)")


@numpy_rules.register(ir.batch_broadcast_p)
def _gen_broadcast(exe, g, d, e, outs):
    src = exe.b(e.inputs[0])
    if e.params.get("axis"):              # an inner batch axis under an outer one
        src = f"np.expand_dims({src}, {e.params['axis']})"
    g.emit(d, _copy(f"b{outs[0]}", src, e.outputs[0].aval))


@numpy_rules.register(ir.batch_sum_p)
def _gen_batch_sum(exe, g, d, e, outs):
    g.emit(d, f"np.sum({exe.b(e.inputs[0])}, axis={e.params.get('axis', 0)}, out=b{outs[0]})")


# -- control flow --------------------------------------------------------------------------------------

@numpy_rules.register(ir.cond_p)
def _gen_cond(exe, g, d, e, outs):
    if e.params.get("masked"):
        return exe._gen_masked_branches(g, d, e, outs)
    false_p, true_p = e.params["branches"]
    g.emit(d, f"if {exe.b(e.inputs[0])}[0]:")
    exe._gen_sub(g, d + 1, true_p, e.inputs[1:], outs)
    g.emit(d, "else:")
    exe._gen_sub(g, d + 1, false_p, e.inputs[1:], outs)


@numpy_rules.register(ir.switch_p)
def _gen_switch(exe, g, d, e, outs):
    if e.params.get("masked"):
        return exe._gen_masked_branches(g, d, e, outs, e.params["cases"])
    sel = f"s{g.turns}"
    g.turns += 1
    g.emit(d, f"{sel} = int({exe.b(e.inputs[0])}[0])")
    *arms, default = e.params["branches"]
    for c, arm in zip(e.params["cases"], arms):
        g.emit(d, f"{'if' if c == e.params['cases'][0] else 'elif'} {sel} == {c}:")
        exe._gen_sub(g, d + 1, arm, e.inputs[1:], outs)
    g.emit(d, "else:" if arms else "if True:")
    exe._gen_sub(g, d + 1, default, e.inputs[1:], outs)


@numpy_rules.register(ir.while_p)
def _gen_while(exe, g, d, e, outs):
    if e.params.get("masked"):
        return exe._gen_masked_while(g, d, e, outs)
    exe._gen_while(g, d, e, outs)


numpy_rules[ir.revolve_p] = lambda exe, g, d, e, outs: exe._gen_revolve(g, d, e, outs)


# -- the primitives of derivative programs (ir.py): one line each ------------------------------------

def _copy(dst, src, aval):
    return f"{dst}.assign({src})" if ir.is_stack(aval) else f"np.copyto({dst}, {src})"


@numpy_rules.register(ir.zeros_p)
def _zeros(exe, g, d, e, outs):
    g.emit(d, f"b{outs[0]}.clear()" if ir.is_stack(e.outputs[0].aval) else f"b{outs[0]}.fill(0)")


@numpy_rules.register(ir.add_any_p)
def _add_any(exe, g, d, e, outs):
    g.emit(d, f"np.add({exe.b(e.inputs[0])}, {exe.b(e.inputs[1])}, out=b{outs[0]})")


@numpy_rules.register(ir.stack_push_p)
def _stack_push(exe, g, d, e, outs):
    stack, turn, value = e.inputs          # in place: outs[0] is the stack's slot (numpy_stack.Stack)
    g.emit(d, f"b{outs[0]}.push(int({exe.b(turn)}[0]), {exe.b(value)})")


@numpy_rules.register(ir.stack_read_p)
def _stack_read(exe, g, d, e, outs):
    stack, turn = exe.b(e.inputs[0]), exe.b(e.inputs[1])
    if e.params["turn_batched"]:             # a turn per instance
        src = f"{stack}.gather({turn})"
    else:
        src = f"{stack}.read(int({turn}[0]))"
    g.emit(d, f"np.copyto(b{outs[0]}, {src})")


@numpy_rules.register(ir.cell_inc_p)
def _cell_inc(exe, g, d, e, outs):
    g.emit(d, f"np.add({exe.b(e.inputs[0])}, 1, out=b{outs[0]})")


@numpy_rules.register(ir.cell_rev_p)
def _cell_rev(exe, g, d, e, outs):
    turns, turn = exe.b(e.inputs[0]), exe.b(e.inputs[1])
    g.emit(d, f"np.copyto(b{outs[0]}, np.maximum({turns}.astype(np.int64) - 1 - {turn}.astype(np.int64), 0), "
              "casting='unsafe')")


# -- array structure (ir.STRUCTURE): copies, but for slices of arguments nothing writes ---------------

def _viewable_slices(prog: Program) -> set:
    """Top-level slices that may be NumPy views instead of copies: of an input whose buffer nothing
    in the program writes in place (so every read sees the value the slice was taken from), read
    only by calls and structure ops that do not write them (a view may not be written through).
    Every other slot can be reused for another value by the planner, so a view of it would change."""
    buffer_of = {v: v for v in prog.inputs}
    written = set()
    for e in prog.eqns:
        for j, i in e.params.get("inplace", ()) or ():
            a = e.inputs[i]
            if isinstance(a, Var):
                written.add(buffer_of.get(a, a))
                buffer_of[e.outputs[j]] = buffer_of.get(a, a)
    out = {}
    inputs = set(prog.inputs)
    for e in prog.eqns:
        if e.prim is ir.slice_p and e.inputs[0] in inputs and e.inputs[0] not in written:
            out[e.outputs[0]] = e
    for e in prog.eqns:
        targets = {e.inputs[i] for _, i in e.params.get("inplace", ()) or ()}
        safe = e.prim in (ir.call_p, ir.slice_p, ir.reshape_p, ir.concat_p, ir.update_p)
        for k, a in enumerate(e.inputs):
            if a in out and (not safe or a in targets or (e.prim is ir.update_p and k == 0)):
                del out[a]
    return set(out.values())


def _index(exe, index):
    exe.consts.append(ir.numpy_index(index))
    return f"k{len(exe.consts) - 1}"


@numpy_rules.register(ir.slice_p)
def _slice(exe, g, d, e, outs):
    g.emit(d, f"np.copyto(b{outs[0]}, {exe.b(e.inputs[0])}[{_index(exe, e.params['index'])}])")


@numpy_rules.register(ir.update_p)
def _update(exe, g, d, e, outs):
    base, value = e.inputs
    if exe.b(base) != f"b{outs[0]}":           # a functional update (derived programs): copy the base first
        g.emit(d, f"np.copyto(b{outs[0]}, {exe.b(base)})")
    g.emit(d, f"b{outs[0]}[{_index(exe, e.params['index'])}] = {exe.b(value)}")


@numpy_rules.register(ir.reshape_p)
def _reshape(exe, g, d, e, outs):
    g.emit(d, f"np.copyto(b{outs[0]}, {exe.b(e.inputs[0])}.reshape({e.params['shape']}))")


@numpy_rules.register(ir.concat_p)
def _concat(exe, g, d, e, outs):
    g.emit(d, f"np.concatenate(({''.join(exe.b(a) + ', ' for a in e.inputs)}), axis={e.params['axis']}, "
              f"out=b{outs[0]})")
