"""The graph vjp: a Program becomes a forward-with-residuals Program and a backward pass over it.

Forward: `record` equations copy into preallocated record buffers what the backward needs and a
later write would destroy: the inputs of kernel calls that are overwritten in place afterwards
(and every input of a call inside a cond arm or a loop body, once per turn), the predicate of
each cond/switch (the arm taken), and the number of turns of each loop. Values that stay put
(SSA values in their own buffers) are read from the forward's buffers directly.

Backward: an interpreter over the original Program in reverse. A call applies its kernel's vjp
(hawk_fx.diff); a cond/switch runs the backward of the arm that was taken; a loop runs its body's
backward for the recorded turns, last turn first, carrying cotangents of the carries.
"""
from __future__ import annotations

import numpy as np

from hawk_fx.core import Eqn, Literal, Program, Var
from hawk_fx.diff import kernel_vjp

from .. import ir
from . import structure


class Residuals:
    """What a record=True forward saves, and where."""

    def __init__(self):
        self.slots: list[tuple] = []      # (shape, dtype, loop capacities) of each record buffer
        self.saved: dict = {}             # (id(call eqn), input index) -> slot
        self.preds: dict = {}             # id(cond/switch eqn) -> slot
        self.turns: dict = {}             # id(while eqn) -> slot
        self.referenced: set = set()      # forward values the backward reads in place (kept, never reused)

    def new_slot(self, aval, caps) -> int:
        self.slots.append((aval.shape, aval.dtype, tuple(caps)))
        return len(self.slots) - 1

    def allocate(self):
        return [np.zeros(caps + shape, dtype) for shape, dtype, caps in self.slots]


def forward_with_residuals(prog: Program, capacity) -> tuple[Program, Residuals]:
    """`capacity(while_eqn)` gives the most turns a loop can run (its cap, or its trip count now)."""
    res = Residuals()
    return _forward(prog, res, capacity, (), top=True), res


def _forward(prog, res, capacity, caps, top, alias=None):
    alias = alias or {}      # an input of a sub-program -> the top-level Var it reads (consts, arm operands)
    clobbered = set()
    for e in prog.eqns:
        for _, i in e.params.get("inplace", ()) or ():
            if isinstance(e.inputs[i], Var):
                clobbered.add(e.inputs[i])
    out = []
    for e in prog.eqns:
        if e.prim is ir.call_p:
            reads = kernel_vjp(e.params["spec"]).reads      # the inputs its backward reads at all
            for k, a in enumerate(e.inputs[:len(e.params["kernel"].param_names)]):
                if not (isinstance(a, Var) and reads[k]):
                    continue
                if not top or a in clobbered:
                    slot = res.new_slot(a.aval, caps)
                    res.saved[(id(e), k)] = slot
                    out.append(Eqn(ir.record_p, [a], [], {"slot": slot}, e.info))
                else:
                    res.referenced.add(a)          # read from the forward's buffer: keep it there
            out.append(e)
        elif e.prim in (ir.cond_p, ir.switch_p):
            slot = res.new_slot(ir.U32_CELL, caps)
            res.preds[id(e)] = slot
            out.append(Eqn(ir.record_p, [e.inputs[0]], [], {"slot": slot}, e.info))
            branches = tuple(_forward(b, res, capacity, caps, False, _inner(alias, b.inputs, e.inputs[1:]))
                             for b in e.params["branches"])
            out.append(e.replace(params=dict(e.params, branches=branches)))
        elif e.prim is ir.while_p:
            slot = res.new_slot(ir.plane_aval((1,), np.int64), caps)
            res.turns[id(e)] = slot
            trip = e.inputs[0] if e.params["counted"] else None
            # a trip count read inside an arm or a loop body is the builder argument it aliases
            cap = capacity(e if trip not in alias else e.replace(inputs=[alias[trip]] + list(e.inputs[1:])))
            body, nc = e.params["body"], e.params["n_consts"]
            consts = e.inputs[1:1 + nc] if e.params["counted"] else e.inputs[:nc]
            body = _forward(body, res, capacity, caps + (cap,), False, _inner(alias, body.inputs[1:1 + nc], consts))
            out.append(e.replace(params=dict(e.params, body=body, record_turns=slot, record_cap=cap)))
        else:
            out.append(e)
    return prog.replace(eqns=out)


def _inner(alias, inner_vars, outer_atoms):
    out = dict(alias)
    for v, a in zip(inner_vars, outer_atoms):
        if isinstance(a, Var):
            out[v] = alias.get(a, a)
    return out


class Backward:
    """Reverse interpreter over the original Program, reading a run's record."""

    def __init__(self, res: Residuals, buffers, forward_value, want=()):
        self.res, self.R, self.forward_value = res, buffers, forward_value
        self.want = set(want)
        self.got: dict = {}

    def value(self, e, k, a, turn):
        if isinstance(a, Literal):
            return a.value
        slot = self.res.saved.get((id(e), k))
        if slot is not None:
            return self.R[slot][turn] if turn else self.R[slot]
        v = self.forward_value(a)
        # None: an input the backward never reads (not kept by the forward): any array of its shape will do
        return v if v is not None else np.zeros(a.aval.shape, a.aval.dtype)

    def _pop(self, ct, outputs):
        cts = []
        for v in outputs:
            c = ct.pop(v, None)
            if v in self.want:
                self.got[v] = c
            cts.append(c)
        return cts

    def run(self, prog: Program, ct: dict, turn=()):
        for e in reversed(prog.eqns):
            cts = self._pop(ct, e.outputs)
            if all(c is None for c in cts):
                continue
            if e.prim is ir.call_p:
                spec = e.params["spec"]
                nparams = len(e.params["kernel"].param_names)
                values = [self.value(e, k, a, turn) for k, a in enumerate(e.inputs[:nparams])]
                grads = kernel_vjp(spec)(values, cts[:spec.n_results + len(spec.commits)], e.params["n"])
                for a, g in zip(e.inputs, grads):
                    _accumulate(ct, a, g)
            elif e.prim in (ir.cond_p, ir.switch_p):
                p = int(self._read(self.res.preds[id(e)], turn)[0])
                if e.prim is ir.cond_p:
                    arm = e.params["branches"][1 if p else 0]
                else:
                    cases = e.params["cases"]
                    arm = e.params["branches"][cases.index(p) if p in cases else -1]
                sub: dict = {}
                for v, c in zip(arm.outputs, cts):
                    _accumulate(sub, v, c)
                self.run(arm, sub, turn)
                for v, a in zip(arm.inputs, e.inputs[1:]):
                    _accumulate(ct, a, sub.get(v))
            elif e.prim is ir.while_p:
                self._while(e, cts, ct, turn)
            elif e.prim in ir.STRUCTURE and cts[0] is not None:
                for a, g in zip(e.inputs, structure.transpose_array(e, np.asarray(cts[0]))):
                    _accumulate(ct, a, g)
            # opaque nodes and cell logic pass no gradient
        return ct

    def _read(self, slot, turn):
        return self.R[slot][turn] if turn else self.R[slot]

    def _while(self, e, cts, ct, turn):
        body, nc = e.params["body"], e.params["n_consts"]
        ops = list(e.inputs)
        if e.params["counted"]:
            ops.pop(0)
        consts, init = ops[:nc], ops[nc:]
        turns = int(self._read(self.res.turns[id(e)], turn)[0])
        carry = list(cts)
        const_ct = [None] * nc
        b_consts = body.inputs[1:1 + nc]
        b_carries = body.inputs[1 + nc:]
        for t in reversed(range(turns)):
            sub: dict = {}
            for v, c in zip(body.outputs, carry):
                _accumulate(sub, v, c)
            self.run(body, sub, turn + (t,))
            for i, v in enumerate(b_consts):
                const_ct[i] = _sum(const_ct[i], sub.get(v))
            carry = [sub.get(v) for v in b_carries]
        for a, c in zip(consts, const_ct):
            _accumulate(ct, a, c)
        for a, c in zip(init, carry):
            _accumulate(ct, a, c)


def _sum(a, b):
    if a is None:
        return b
    if b is None:
        return a
    return a + b


def _accumulate(ct, a, g):
    if g is None or not isinstance(a, Var) or a.aval.dtype.kind not in "fc":
        return
    g = np.asarray(g)
    if g.shape != a.aval.shape:
        g = np.broadcast_to(g, a.aval.shape) if g.size == 1 or g.ndim < len(a.aval.shape) else g.reshape(a.aval.shape)
    ct[a] = g if a not in ct else ct[a] + g
