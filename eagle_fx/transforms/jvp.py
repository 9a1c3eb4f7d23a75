"""The graph jvp over a recorded run: tangents pushed forward through the Program.

Control flow follows what the run recorded (the arm taken, the number of turns), so the
tangent is that of the function the run computed; kernel calls apply their kernel's jvp
(hawk_fx.diff), reading primal inputs from the record or the forward's buffers.
"""
from __future__ import annotations

import numpy as np

from hawk_fx.core import Program, Var
from hawk_fx.diff import kernel_jvp

from .. import ir
from . import structure
from .vjp import Backward


class Forward(Backward):
    """Forward-mode interpreter; shares the record-reading half with the reverse one."""

    def run(self, prog: Program, tan: dict, turn=()):
        for e in prog.eqns:
            ins_t = [tan.get(a) if isinstance(a, Var) else None for a in e.inputs]
            if e.prim is ir.call_p:
                if all(t is None for t in ins_t):
                    continue
                spec = e.params["spec"]
                nparams = len(e.params["kernel"].param_names)
                values = [self.value(e, k, a, turn) for k, a in enumerate(e.inputs[:nparams])]
                outs = kernel_jvp(spec)(values, ins_t[:nparams], e.params["n"])
                for v, t in zip(e.outputs, outs):
                    _set(tan, v, t)
            elif e.prim in (ir.cond_p, ir.switch_p):
                if all(t is None for t in ins_t[1:]):
                    continue
                p = int(self._read(self.res.preds[id(e)], turn)[0])
                if e.prim is ir.cond_p:
                    arm = e.params["branches"][1 if p else 0]
                else:
                    cases = e.params["cases"]
                    arm = e.params["branches"][cases.index(p) if p in cases else -1]
                sub = {v: t for v, t in zip(arm.inputs, ins_t[1:]) if t is not None}
                self.run(arm, sub, turn)
                for v, a in zip(e.outputs, arm.outputs):
                    _set(tan, v, sub.get(a) if isinstance(a, Var) else None)
            elif e.prim is ir.while_p:
                self._while_forward(e, ins_t, tan, turn)
            elif e.prim in ir.STRUCTURE and any(t is not None for t in ins_t):
                xs = [t if t is not None else np.zeros(a.aval.shape, e.outputs[0].aval.dtype)
                      for t, a in zip(ins_t, e.inputs)]
                _set(tan, e.outputs[0], structure.eval_array(e, xs))
        return tan

    def _while_forward(self, e, ins_t, tan, turn):
        body, nc = e.params["body"], e.params["n_consts"]
        ts = list(ins_t)
        if e.params["counted"]:
            ts.pop(0)
        const_t, carry_t = ts[:nc], ts[nc:]
        if all(t is None for t in ts):
            return
        turns = int(self._read(self.res.turns[id(e)], turn)[0])
        b_consts, b_carries = body.inputs[1:1 + nc], body.inputs[1 + nc:]
        for t in range(turns):
            sub = {v: x for v, x in zip(b_consts, const_t) if x is not None}
            sub.update({v: x for v, x in zip(b_carries, carry_t) if x is not None})
            self.run(body, sub, turn + (t,))
            carry_t = [sub.get(a) if isinstance(a, Var) else None for a in body.outputs]
        for v, t in zip(e.outputs, carry_t):
            _set(tan, v, t)


def _set(tan, v, t):
    if t is not None and v.aval.dtype.kind in "fc":
        tan[v] = t
