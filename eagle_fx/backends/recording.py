"""What a record=True graph builds: the two halves of the vjp transform of its Program.

The graph's Program, with its named values as outputs (the result, the arguments a kernel writes,
buffer= labels) and a zero probe added to each write a float top-level label may come from (the
cotangent that reaches a probe is the gradient with respect to that write; the run says which
write ran last, which is what the label means: _probe), goes through vjp_graph and is split at
the residual boundary (transforms/split.py):

  * the forward half (inputs -> outputs and residuals: the stacks of loop carries, which grow with
    the turns run, the values the kernels' backwards read) is what the graph runs on launch; it
    is functional, so an argument the graph writes is copied back after each run, its value on
    entry kept for the derivatives. Its residuals are what the backward reads: a value a later
    write replaces is kept (that is the save), a value only a linear kernel's derivative would be
    handed is not (the backward passes it zeros: split.py), and the caller's unwritten arrays are
    read where they lie;
  * the backward half (residuals, cotangents -> input cotangents) is lowered once, on the first
    `eagle_fx.diff.reverse`, and replayed with the record's residuals and the seeds bound;
  * both halves run on the graph's backend, a registry entry that supports records: NumPy, or
    JAX (NumPy arrays with backend="jax"; its stacks have static sizes, so a checkpointed record
    is refused at build there);
  * `eagle_fx.diff.forward` runs jvp_graph of the same Program on the recorded run's inputs.
"""
from __future__ import annotations

import numpy as np

from hawk_fx.context import CONTEXT
from hawk_fx.core import NO_INFO, Eqn, Literal, Program, RuleTable, Var

from .. import ir
from ..transforms.jvp_graph import jvp_graph
from ..transforms.program import TransformError, is_float
from ..transforms.split import split, without_zero_inputs
from ..transforms.vjp_graph import vjp_graph
from . import registry
from .jax_lower import LoweringError
from .numpy import NumpyExecutable

API = "eagle.Graph(record=True)"


class Halves:
    """The record=True Program `prog` as named outputs, and the forward and backward of its vjp."""

    def __init__(self, prog, seedable, shown, buffers, capacity, checkpoints=None):
        top = set(prog.inputs) | {v for e in prog.eqns for v in e.outputs}
        labels = [b for b in dict.fromkeys(buffers) if b in top and b not in prog.inputs and is_float(b.aval)]
        self.q, self.sites, self.last_of, sub = _probe(prog, labels)
        self.gaps = {b: w for b in labels if (w := _loop_gap(prog, b)) is not None}
        outs = list(self.q.outputs) + [a for a in self.last_of.values() if isinstance(a, Var)]
        n_seedable = None
        for k, group in enumerate((seedable, shown)):
            for v in group:
                if isinstance(v, Var) and v in top and not (k and v in prog.inputs):
                    w = sub.get(v, v)
                    if w not in outs:
                        outs.append(w)
            if n_seedable is None:
                n_seedable = len(outs)      # the outputs after these are shown only: no seed reaches them
        self.q = self.q.replace(outputs=outs)
        self.index = {}                         # a Var of `prog` -> its place among q's outputs
        for k, a in enumerate(outs):
            if isinstance(a, Var):
                self.index.setdefault(a, k)
        for v, w in sub.items():
            if w in self.index:
                self.index[v] = self.index[w]
        self.inputs = list(prog.inputs)
        self.wrt = [is_float(v.aval) for v in self.q.inputs]
        self.ct_of = {}                         # q output place -> cotangent input place of the backward
        for k, a in enumerate(outs):
            if is_float(a.aval):
                self.ct_of[k] = len(self.ct_of)
        self.grad_of = {}                       # q input place -> output place of the backward
        for k, w in enumerate(self.wrt):
            if w:
                self.grad_of[k] = len(self.grad_of)
        v = vjp_graph(self.q, self.wrt, capacity, API, checkpoints)
        self.forward, backward, self.residuals = split(v, len(self.q.inputs), len(outs))
        unseeded = [backward.inputs[len(self.residuals) + j] for k, j in self.ct_of.items() if k >= n_seedable]
        self.backward = without_zero_inputs(backward, unseeded)
        self.seedable = n_seedable
        self._bw = None
        self._jvp = None

    def probe_place(self, label, last):
        """The input place of q's probe at the write a label's value last came from in a run (`last`:
        RecordedExecutable.last_sites of that run); None for a label with no probe (not a float)."""
        return len(self.inputs) + last[label] if label in last else None

    def backward_exe(self, residuals, seeds, n, backend, runtime=None):
        """The backward executable reading `residuals` and the seeds ({q output place: array}) where
        they lie: no copy. A cotangent not seeded reads a private zeros array (the backward is
        functional: it writes none of its inputs). It runs on the forward's backend (its entry)."""
        if self._bw is None:
            self._zero_cts = [np.zeros(v.aval.shape, v.aval.dtype) for v in self.backward.inputs[len(residuals):]]
            self._bw = registry.make(backend, self.backward, list(residuals) + self._zero_cts, set(), n,
                                     runtime=runtime)
        exe = self._bw
        arrays = list(residuals) + list(self._zero_cts)
        for k, j in self.ct_of.items():
            if k < self.seedable and k in seeds:
                arrays[len(residuals) + j] = seeds[k]
        if not isinstance(exe, NumpyExecutable):     # its arguments are read at each replay: rebinding is free
            for i, arr in enumerate(arrays):
                exe.rebind(i, arr)
            return exe
        changed = False
        for i, arr in enumerate(arrays):
            if exe.slots[exe.input_slots[i]] is not arr:
                exe.slots[exe.input_slots[i]] = arr
                changed = True
        if changed:
            exe._link()
        return exe

    def jvp_exe(self, n):
        if self._jvp is None:
            self._jvp_prog, _ = jvp_graph(self.q, self.wrt, force=[True] * len(self.q.outputs))
            arrays = [np.zeros(v.aval.shape, v.aval.dtype) for v in self._jvp_prog.inputs]
            self._jvp = registry.make(registry.get("numpy"), self._jvp_prog, arrays, set(), n)
        return self._jvp


def _probe(prog, labels):
    """`prog` with a zero probe added to each write a label's value may come from (its *sites*), and
    the id of the site that ran last as an output. A label means the value of its last write that
    ran, every use of it counted: a buffer rebound in an arm is the arm's write when that arm ran,
    and the write before the construct (with its uses before it) when an arm that kept it ran, or
    a loop ran no turn that wrote it. The writes in a loop body are one site, the loop's output
    (so the uses inside the loop of the last value written there would not be counted: _loop_gap
    finds those labels, and derivatives with respect to them are refused).
    Returns (program, its sites, {label: Literal id or the u32 cell Var of the id}, {site: probed Var});
    the probe of site k is input len(prog.inputs) + k."""
    sites: list = []
    eqns, lasts, probes, sub = _thread(prog, labels, {}, sites)
    q = prog.replace(inputs=list(prog.inputs) + [probes[s] for s in sites], eqns=eqns,
                     outputs=[sub.get(a, a) if isinstance(a, Var) else a for a in prog.outputs])
    return q, sites, dict(zip(labels, lasts)), sub


def _loop_gap(prog, v):
    """Where a device loop writes a value `v` may come from and reads it in its body (later in that
    turn, or in a later turn that may not write it): uses the probe at the loop's end would miss.
    None when there is no such loop."""
    k, j = next(((k, e.outputs.index(v)) for k, e in enumerate(prog.eqns) if v in e.outputs), (None, None))
    if k is None:
        return None
    e = prog.eqns[k]
    rule = gap_rules.get(e.prim)
    return None if rule is None else rule(prog, e, j)


# -- how if/match and loops hand values on: one table per question, keyed by primitive; a primitive
# in none of them is a plain write (its outputs are new values, any read of an operand counts) --------

gap_rules = RuleTable("loop gap")          # prim -> fn(prog, e, j): _loop_gap of e's output j
steady_rules = RuleTable("steady")         # prim -> fn(d, v, fixed): _steady of d's output v
read_rules = RuleTable("reads")            # prim -> fn(prog, e, p): does e's operand p count as read
walk_rules = RuleTable("walk")             # prim -> fn(e, k, j, chained, handed, todo, carried): _walk
thread_rules = RuleTable("thread")         # prim -> fn(e, js, handed, last, probes, sites, fixed): _thread


@gap_rules.register(ir.cond_p)
@gap_rules.register(ir.switch_p)
def _arms_gap(prog, e, j):
    for b in e.params["branches"]:
        o = b.outputs[j]
        where = _loop_gap(prog, e.inputs[1 + b.inputs.index(o)]) if o in b.inputs else _loop_gap(b, o)
        if where is not None:
            return where
    return None


@gap_rules.register(ir.while_p)
def _while_gap(prog, e, j):
    body, w = e.params["body"], ir.WhileOperands(e)
    _, body_consts, body_carries = w.body_parts(body.inputs)
    out, carry = body.outputs[j], body_carries[j]
    if (out is not carry and _reads(body, out)) or (_reads(body, carry) and not _steady(body, out, body_consts)):
        write = next((d for d in body.eqns if out in d.outputs), e)
        return write.info.where or e.info.where
    return (_loop_gap(body, out) if out is not carry else None) or _loop_gap(prog, w.carries[j])


def _steady(prog, v, fixed):
    """Whether every turn of a loop body does the same to v: writes it, or hands a value on,
    as decided by conditions that do not change from turn to turn (`fixed`: the body's loop
    constants). Then the carry a turn reads is never the label's last value, or always it."""
    d = next((d for d in prog.eqns if v in d.outputs), None)
    rule = None if d is None else steady_rules.get(d.prim)
    return True if rule is None else rule(d, v, fixed)


@steady_rules.register(ir.cond_p)
@steady_rules.register(ir.switch_p)
def _arms_steady(d, v, fixed):
    if not any(d.inputs[0] is c for c in fixed):
        return False
    j = d.outputs.index(v)
    return all(_steady(b, b.outputs[j], [b.inputs[p - 1] for p, a in enumerate(d.inputs) if p and any(a is c for c in fixed)])
               for b in d.params["branches"])


steady_rules[ir.while_p] = lambda d, v, fixed: False


def _reads(prog, v):
    """Whether an equation of prog reads v (an if/match arm that hands it on unchanged does not:
    then the reads of that output count)."""
    for e in prog.eqns:
        for p, a in enumerate(e.inputs):
            if a is not v:
                continue
            rule = read_rules.get(e.prim)
            if rule is None or rule(prog, e, p):
                return True
    return False


@read_rules.register(ir.cond_p)
@read_rules.register(ir.switch_p)
def _arms_read(prog, e, p):
    if p == 0:
        return True
    for b in e.params["branches"]:
        w = b.inputs[p - 1]
        if _reads(b, w) or any(o is w and _reads(prog, e.outputs[j]) for j, o in enumerate(b.outputs)):
            return True
    return False


def _id(k):
    return Literal(np.array([k], np.uint32), ir.U32_CELL)


def _walk(prog, wants):
    """Where the values `wants` of prog come from: (the writes, {eqn place: [output j]} of the
    if/match/loops that hand them on, {eqn place: operand places an arm may hand on unchanged},
    the places of the inputs of prog they may be, the writes that are a loop's output)."""
    defs = {v: (k, j) for k, e in enumerate(prog.eqns) for j, v in enumerate(e.outputs)}
    writes, chained, handed, reached, carried = [], {}, {}, set(), set()
    todo, seen = list(wants), set()
    while todo:
        v = todo.pop()
        if not isinstance(v, Var) or v in seen:
            continue
        seen.add(v)
        if v not in defs:
            reached.add(prog.inputs.index(v))
            continue
        k, j = defs[v]
        e = prog.eqns[k]
        rule = walk_rules.get(e.prim)
        if rule is None or rule(e, k, j, chained, handed, todo, carried):
            writes.append(v)
    return writes, chained, handed, reached, carried


@walk_rules.register(ir.cond_p)
@walk_rules.register(ir.switch_p)
def _arms_walk(e, k, j, chained, handed, todo, carried):
    """An arm's output: what each arm may hand on (no write of its own)."""
    chained.setdefault(k, []).append(j)
    for b in e.params["branches"]:
        for p in _walk(b, [b.outputs[j]])[3]:
            handed.setdefault(k, set()).add(1 + p)
            todo.append(e.inputs[1 + p])
    return False


@walk_rules.register(ir.while_p)
def _while_walk(e, k, j, chained, handed, todo, carried):
    """The loop's output is the write of its body's writes (and what it carries in)."""
    chained.setdefault(k, []).append(j)
    todo.append(ir.WhileOperands(e).carries[j])
    carried.add(e.outputs[j])
    return True


def _thread(prog, wants, entry, sites, fixed=None):
    """Thread the ids of the writes the values `wants` last came from through `prog`: a write (a
    kernel, an update, a loop's output) is a site with an id (its place in `sites`) and a probe
    input; an if/match or loop that hands a value on takes the ids of what it may hand on unchanged
    and gives out the id of the write that ran last. `entry` maps inputs of prog to their ids. In a
    loop body every write has the loop's id `fixed` and no probe of its own.
    Returns (eqns, the ids of `wants`, {site: its probe's Var in prog}, {site: probed Var})."""
    writes, chained, handed, reached, loops = _walk(prog, wants)
    last = dict(entry)
    mine = [prog.inputs[p] for p in sorted(reached) if prog.inputs[p] not in entry] + writes
    for v in mine:
        if fixed is not None:
            last[v] = fixed
            continue
        sites.append(v)
        if v not in loops:              # a loop's output has the id the loop carries out
            last[v] = _id(len(sites) - 1)
    probes = {} if fixed is not None else {s: Var(s.aval) for s in mine}
    sub: dict = {}
    eqns = []

    def probed(v):
        """site v + its probe: every later use reads it (a probe is zero; its cotangent is the gradient)."""
        sub[v] = Var(v.aval, v.hint)
        last[sub[v]] = last[v]
        eqns.append(Eqn(ir.add_any_p, [v, probes[v]], [sub[v]], {}, NO_INFO))

    for v in prog.inputs:
        if v in probes:
            probed(v)
    for k, e in enumerate(prog.eqns):
        e = e.replace(inputs=[sub.get(a, a) if isinstance(a, Var) else a for a in e.inputs])
        if k in chained:
            e = thread_rules[e.prim](e, chained[k], sorted(handed.get(k, ())), last, probes, sites, fixed)
        eqns.append(e)
        for v in e.outputs:
            if v in probes:
                probed(v)
    return eqns, [last[v] for v in wants], probes, sub


def _thread_arms(e, js, handed, last, probes, sites, fixed):
    """The cond/switch `e` taking the ids of the operands an arm may hand on (`handed`) and giving
    the ids of its outputs js; the probes of the sites inside its arms are operands too."""
    given = [last[e.inputs[p]] for p in handed]
    cells = [a for a in given if isinstance(a, Var)]        # an id known at build is a literal in each arm
    arms, inner = [], {}
    for b in e.params["branches"]:
        entry = {b.inputs[p - 1]: a if isinstance(a, Literal) else Var(ir.U32_CELL) for p, a in zip(handed, given)}
        eqns, ids, bprobes, sub = _thread(b, [b.outputs[j] for j in js], entry, sites, fixed)
        arms.append((b, [a for a in entry.values() if isinstance(a, Var)], eqns, ids, bprobes, sub))
        inner.update(bprobes)
    for s in inner:                         # a probe of this scope for each site in an arm
        probes.setdefault(s, Var(s.aval))
    branches = []
    for b, ins, eqns, ids, bprobes, sub in arms:
        ins = list(b.inputs) + ins + [bprobes.get(s) or Var(s.aval) for s in inner]
        outs = [sub.get(a, a) if isinstance(a, Var) else a for a in b.outputs] + ids
        branches.append(Program(ins, eqns, outs))
    return e.replace(inputs=list(e.inputs) + cells + [probes[s] for s in inner],
                     outputs=list(e.outputs) + _ids_out(e, js, last), params=dict(e.params, branches=tuple(branches)))


def _thread_loop(e, js, last, sites, fixed):
    """The while `e` carrying, for each carry j on a chain, the id of its last write: the entry's
    until a turn writes it, then the loop's own (`fixed` in an enclosing body)."""
    body, cond = e.params["body"], e.params["cond"]
    w = ir.WhileOperands(e)
    given = []
    for j in js:
        own = fixed if fixed is not None else _id(sites.index(e.outputs[j]))
        carry = Var(ir.U32_CELL)
        eqns, ids, _, _ = _thread(body, [body.outputs[j]], {w.body_parts(body.inputs)[2][j]: carry}, sites, own)
        body = Program(list(body.inputs) + [carry], eqns, list(body.outputs) + ids)
        if cond is not None:
            cond = cond.replace(inputs=list(cond.inputs) + [Var(ir.U32_CELL)])
        given.append(last[w.carries[j]])
    return e.replace(inputs=list(e.inputs) + given, outputs=list(e.outputs) + _ids_out(e, js, last),
                     params=dict(e.params, body=body, cond=cond))


thread_rules[ir.cond_p] = thread_rules[ir.switch_p] = _thread_arms
thread_rules[ir.while_p] = lambda e, js, handed, last, probes, sites, fixed: _thread_loop(e, js, last, sites, fixed)


def _ids_out(e, js, last):
    """New u32 outputs of `e`: the ids of its outputs js."""
    ids = [Var(ir.U32_CELL) for _ in js]
    for j, v in zip(js, ids):
        last[e.outputs[j]] = v
    return ids


class RecordedExecutable:
    """Runs the forward half for a record=True graph, as the graph's executable: array_of answers
    for the graph's own Vars, and the arguments it writes are written back after each run."""

    def __init__(self, halves: Halves, arrays, written, n, entry, names=None, runtime=None):
        self.h, self.n, self.backend_entry, self.backend = halves, n, entry, entry.name
        self.runtime = runtime          # a CUDA graph's runtime (None elsewhere): the backward runs on it too
        # a written argument: the forward reads a private copy of it on entry (what the derivatives
        # read, views included), and its value on exit is copied into the caller's array
        self.user = {i: arrays[i] for i, _ in written}
        self.entry = {i: arrays[i].copy() for i in self.user}       # on the arrays' device
        arrays = [self.entry.get(i, a) for i, a in enumerate(arrays)]
        probes = [np.zeros(v.aval.shape, v.aval.dtype) for v in halves.q.inputs[len(arrays):]]
        names = list(names or []) + [None] * len(probes)
        self.exe = registry.make(entry, halves.forward, list(arrays) + probes, set(), n, names, runtime=runtime)
        self.backend_name = self.exe.backend_name
        f = halves.forward
        self.var = {v: f.outputs[k] for v, k in halves.index.items()}
        self.var.update(zip(halves.inputs, f.inputs))
        self.written = [(i, self.var[final]) for i, final in written]     # (input place, its Var on exit)

    def __getattr__(self, name):           # prog, plan, source, ...: the forward's
        return getattr(self.exe, name)

    def replay(self, times: int = 1):
        for _ in range(times):
            for i, out in self.written:
                self.entry[i][...] = self.user[i]
            self.exe.replay(1)
            for i, out in self.written:
                self.user[i][...] = self.exe.array_of(out)

    def rebind(self, i, arr):
        if i in self.user:
            self.user[i] = arr
        else:
            self.exe.rebind(i, arr)

    def array_of(self, var):
        if var in self.h.inputs and self.h.inputs.index(var) in self.user:
            return self.user[self.h.inputs.index(var)]
        v = self.var.get(var)
        return None if v is None or not isinstance(v, Var) else self.exe.array_of(v)

    def last_sites(self):
        """{label Var: the site (Halves.sites) its value came from in the last run}."""
        return {b: int((np.asarray(a.value) if isinstance(a, Literal) else self.exe.array_of(self.var[a]))[0])
                for b, a in self.h.last_of.items()}

    def input_arrays(self):
        """The inputs of the last run as they were on entry."""
        return [self.exe.array_of(v) for v in self.exe.prog.inputs]

    def residual_arrays(self):
        return [self.exe.array_of(r) for r in self.h.residuals]

    def saved_arrays(self):
        """The residuals this run saved: not those that are the caller's own (unwritten) arrays."""
        f = self.h.forward
        given = {v for i, v in enumerate(f.inputs[:len(self.h.inputs)]) if i not in self.user}
        return [self.exe.array_of(r) for r in self.h.residuals if r not in given]


def recorded_executable(closed, entry, arrays, n, runtime=None) -> RecordedExecutable:
    """The executable of a record=True graph's closed Program (`closed.recording`: what its
    staging wrote and labelled) on `entry`: one with growing stacks (NumPy), whose stacks of saved
    turns grow with the turns run, or one with static ones (JAX), sized now: a counted loop's trip
    count (a replay checks it), a capped loop's cap; a loop with neither, or checkpoints=, is
    refused at build (jax_lower.py)."""
    prog, rec = closed.program, closed.recording
    names = [e.name for e in closed.planes]
    capacity = lambda trip, e: None                                   # noqa: E731
    if not entry.supports_growing_stacks:
        if any(not isinstance(a, np.ndarray) for a in arrays):
            raise NotImplementedError(f"{API}: record=True graphs on backend {entry.name!r} take NumPy arrays (the "
                                      "record is kept on the host), not jax.Arrays; pass NumPy arrays with "
                                      f"eagle.Graph(record=True, backend={entry.name!r}), or differentiate with "
                                      "eagle_fx.to_jax and jax.grad")
        capacity = lambda trip, e: loop_capacity(API, trip, e, list(prog.inputs), arrays)    # noqa: E731
    halves = Halves(prog, [f for _, f in rec.written] + rec.labelled, list(closed.keep) + list(rec.shown),
                    rec.labelled, capacity, rec.checkpoints)
    if not entry.supports_growing_stacks:
        _refuse_revolve(halves.backward, entry)     # now, not at the first reverse, where the backward is compiled
    return RecordedExecutable(halves, arrays, rec.written, n, entry, names, runtime)


def _refuse_revolve(prog, entry):
    for e in prog.eqns:
        if e.prim is ir.revolve_p:
            raise LoweringError(f"{API}: the reverse pass through the device loop at {e.info.where} is checkpointed "
                                f"(checkpoints=), which runs on the NumPy backend; on backend={entry.name!r}, record "
                                "without checkpoints (its stacks hold the loop's cap or trip count)")
    for q in prog.subprograms():
        _refuse_revolve(q, entry)

def loop_capacity(api, trip, e, inputs, arrays):
    """The most turns a counted loop of trip count `trip` (one of a Program's `inputs`, bound to
    `arrays`) runs, for a backend with static shapes to size its stack: its value now, the largest
    over the instances under vmap. (A trip count computed in the graph has none: its stack grows.)"""
    if CONTEXT.abstract:
        raise TransformError(f"{api}: reverse mode through the counted loop at {e.info.where} saves each of "
                             "its turns, and its trip count is an argument traced by JAX (eagle_fx.to_jax: its "
                             "value is unknown while staging): cap the loop (`for _ in range(N): if not cell: "
                             "break`) so its turns are bounded")
    arr = arrays[inputs.index(trip)]
    full = CONTEXT.batch_full.get(id(arr))
    src = full if full is not None else arr
    cap = int(np.max(src))
    if CONTEXT.recording:               # the staging cache checks the trip count at each later call
        CONTEXT.recording[-1].caps.append((src, cap))
    return cap
