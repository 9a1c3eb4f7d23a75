"""vjp as a Program transform: (inputs, output cotangents) -> (outputs, input cotangents).

The result is one functional Program: the forward, then the backward reading the forward's values.
  * call: the kernel's vjp body (hawk_fx.diff.vjp_spec) maps the call's inputs and the cotangents
    of its outputs to the cotangents of its inputs; where that body would compute again a costly
    value the kernel computes (sin(x) for sin(x) * x), the forward call also returns it and the
    backward reads it (kernel_residuals.py);
  * cond/switch: a cond on the same predicate whose arms are the vjp of each arm (an arm's
    forward runs again inside its backward: nothing of the arm needs saving);
  * while: the forward loop also pushes each turn's carries onto a stack (a carry of its own,
    of type ir.stack_aval: it grows with the turns run; its `cap`, the loop's cap or the trip
    count when the derivative is built, is what backends with static shapes allocate, and an
    uncapped loop has none) and counts its turns; the backward is a counted loop over those turns,
    last first, that reads the turn's carries back, runs the body's vjp, and carries the
    cotangents of the carries (and sums those of the consts). With `checkpoints=K` the forward
    loop only counts its turns, and the backward is one `revolve` equation: from the carries on
    entry it runs the body again to the turns it reverses, keeping at most K states
    (transforms/checkpoint.py).
"""
from __future__ import annotations

from hawk_fx.core import Literal, Program, RuleTable, Var
from hawk_fx.diff import kernel_vjp, vjp_spec

from .. import ir
from . import structure
from .kernel_residuals import split_kernel
from .reverse_again import recomputes_unbounded, recomputing
from .vmap import batch_broadcast_p, batch_program, has_instance, instance_program
from .program import Eqns, TransformError, copy_eqn, copy_program, ct_aval, dce, inline, is_float, \
    refuse_untransformable

API = "eagle_fx.grad"

# prim -> fn(vjp, e, cts, env, ct, eqns, saved): the cotangents of e's inputs from those of its
# outputs `cts` (one at least not None), accumulated into ct; `saved`: what the forward pass kept
vjp_rules = RuleTable("reverse")
# prim -> fn(vjp, e, env, eqns, saved): e in the forward pass, keeping in `saved` what its reverse
# reads; a primitive with none is copied as it is
forward_rules = RuleTable("forward pass")


def vjp_graph(prog: Program, wrt, capacity, api=API, checkpoints=None) -> Program:
    """Program over (inputs..., a cotangent per float output...) -> (outputs..., a cotangent per
    input flagged in `wrt`). `capacity(trip, eqn)`: the most turns of the counted loop `eqn`,
    whose trip count is the top-level input `trip` (a Var of the Program given to the outermost
    call): what a backend with static shapes allocates for its stack. `checkpoints`: None saves
    every turn of a loop; K keeps at most K states of each loop and recomputes the others."""
    if checkpoints is not None and (type(checkpoints) is not int or checkpoints < 1):
        raise ValueError(f"{api}: checkpoints={checkpoints!r}; give the number of loop states to keep, an int >= 1 "
                         "(or None to save every turn)")
    v = _Vjp(capacity, api, checkpoints)
    v.top = set(prog.inputs)
    return v.program(prog, wrt)


class _Vjp:
    def __init__(self, capacity, api, checkpoints=None):
        self.capacity, self.api, self.checkpoints = capacity, api, checkpoints
        self.recompute = recomputing() and not checkpoints    # reversible: turns recomputed, no stacks (reverse_again.py)
        self.unbounded = recomputes_unbounded() and not checkpoints   # loops with no bound recompute (same)
        self.alias: dict = {}       # a sub-program's input -> the outer atom it reads (for trip counts)
        self.in_loop = 0            # > 0: building the vjp of a loop body (its values come from saved turns)
        self.top: set = set()       # the inputs of the outermost Program
        self.kept: dict = {}        # a call -> the residuals its forward returns for its backward

    def program(self, prog, wrt, values=True):
        """The vjp of `prog`: its outputs, then the cotangents of its inputs flagged in `wrt`
        (values=False: the cotangents only, for a construct's backward, which has the values)."""
        inputs = [Var(v.aval, v.hint) for v in prog.inputs]
        env = dict(zip(prog.inputs, inputs))
        ct_in = [Var(ct_aval(a.aval)) for a in prog.outputs if is_float(a.aval)]
        eqns = Eqns()
        saved: dict = {}
        for e in prog.eqns:
            refuse_untransformable(e, self.api)
            forward_rules.get(e.prim, _copy)(self, e, env, eqns, saved)
        ct: dict = {}
        it = iter(ct_in)
        for a in prog.outputs:
            if is_float(a.aval):
                c = next(it)
                if isinstance(a, Var):
                    ct[a] = eqns.add(ct.get(a), c)
        for e in reversed(prog.eqns):
            cts = [ct.get(v) for v in e.outputs]
            if all(c is None for c in cts):
                continue
            vjp_rules[e.prim](self, e, cts, env, ct, eqns, saved)
        outs = [a if isinstance(a, Literal) else env[a] for a in prog.outputs]
        grads = [ct.get(v) or eqns.zeros(ct_aval(v.aval)) for v, w in zip(prog.inputs, wrt) if w]
        return _settle(Program(inputs + ct_in, eqns, (outs if values else []) + grads), self.kept)

    # -- rules -------------------------------------------------------------------------------
    def forward_call(self, e, env, eqns):
        """The call, also returning the costly values its backward reads (kernel_residuals.py)."""
        sp = split_kernel(e.params["spec"])
        params = [_read(a, env) for a in e.inputs[:len(e.params["kernel"].param_names)]]
        outs = eqns.call(sp.forward, params, e.params["n"], e.info)
        env.update(zip(e.outputs, outs[:sp.n_results]))
        self.kept[e] = _Kept(eqns[-1], sp.n_results, e)

    def call(self, e, cts, env, ct, eqns):
        spec, n = e.params["spec"], e.params["n"]
        params = e.inputs[:len(e.params["kernel"].param_names)]
        seeds = [c or eqns.zeros(ct_aval(v.aval)) for c, v in zip(cts, e.outputs)]
        # in a loop body, a value the kernel's backward does not read (any input of a linear body)
        # is not passed, so the loop saves no turns of it; elsewhere it is there anyway
        values = [_read(a, env) if r or not self.in_loop or isinstance(a, Literal) else eqns.zeros(a.aval)
                  for a, r in zip(params, kernel_vjp(spec).reads)]
        kept = self.kept.get(e)
        if e.params.get("batch"):   # a batched call (vmap): its vjp over the same batch, shared inputs' cts summed
            fl = tuple(e.params["in_batched"][:len(params)])
            spec_b = vjp_spec(spec)
            grads = eqns.bind(ir.call_p, values + seeds, {"kernel": spec_b.kernel, "spec": spec_b, "n": n, "inplace": (),
                                                          "batch": e.params["batch"],
                                                          "in_batched": fl + (True,) * len(seeds)}, e.info)
            grads = iter([g if b else eqns.bind(ir.batch_sum_p, [g], {"axis": 0})[0]
                          for g, b in zip(grads, [b for b, w in zip(fl, kernel_vjp(spec).wrt) if w])])
        elif kept is not None:      # the backward reading the forward's residuals; the plain one kept aside
            sp = split_kernel(spec)
            with_res = [_read(a, env) if r or not self.in_loop or isinstance(a, Literal) else eqns.zeros(a.aval)
                        for a, r in zip(params, sp.reads)]
            kept.plain = values + seeds
            residuals = list(kept.forward.outputs[sp.n_results:])
            grads = iter(eqns.call(sp.backward, with_res + residuals + seeds, n, e.info))
            kept.backward = eqns[-1]
        else:
            grads = iter(eqns.call(vjp_spec(spec), values + seeds, n, e.info))
        for a, w in zip(params, kernel_vjp(spec).wrt):
            if w:
                _accumulate(ct, a, next(grads), eqns)

    def refuse_masked(self, e):
        """A device if or loop a vmap runs per instance (its predicate or guard differs by instance)."""
        if e.params.get("masked"):
            raise TransformError(f"{self.api}: the device {'loop' if e.prim is ir.while_p else 'condition'} at "
                                 f"{e.info.where} runs per instance in a batched program (its guard differs by "
                                 "instance); reverse mode over it is not supported: take the derivative inside the "
                                 "batch (eagle_fx.vmap(eagle_fx.jacrev(f)) rather than eagle_fx.jacrev(eagle_fx.vmap(f))), "
                                 "or in forward mode (eagle_fx.jacfwd)")

    def per_instance(self, e, cts, env, ct, eqns):
        """Reverse mode over a cond or loop vmap runs per instance (masked): the vjp of its
        one-instance equation, batched as vmap batched that equation; the cotangents of operands
        every instance shares are summed over the instances. The construct runs again inside
        (its turns are saved, or recomputed, there)."""
        if not has_instance(e):
            self.refuse_masked(e)
        inst = e.params["instance"]
        one, at = instance_program(e)
        outer, b_flags = [e.inputs[k] for k in at], [inst.flags[k] for k in at]
        sub = _Vjp(self.capacity, self.api, self.checkpoints)
        sub.recompute, sub.top, sub.alias = self.recompute, self.top, dict(self.alias)
        for v, a in zip(one.inputs, outer):
            if isinstance(a, Var):
                sub.alias[v] = self.alias.get(a, a)
        wrt = [is_float(v.aval) for v in one.inputs]
        floats = [is_float(v.aval) for v in one.outputs]
        vjp_one = sub.program(one, wrt)
        batched, out_flags = batch_program(vjp_one, b_flags + [True] * sum(floats), inst.B)
        seeds = [c or eqns.zeros(ct_aval(v.aval)) for c, v, f in zip(cts, e.outputs, floats) if f]
        outs = inline(batched, [_read(a, env) for a in outer] + seeds, eqns)
        k = len(e.outputs)
        grads = zip(*[[x for x, w in zip(seq, wrt) if w] for seq in (outer, b_flags)])
        for (a, b), g, g_b in zip(grads, outs[k:], out_flags[k:]):
            if g_b and not b:
                g = eqns.bind(ir.batch_sum_p, [g], {"axis": 0})[0]
            elif b and not g_b:
                g = eqns.bind(batch_broadcast_p, [g], {"size": inst.B})[0]
            _accumulate(ct, a, g, eqns)

    def branches(self, e, cts, env, ct, eqns):
        if e.params.get("masked"):
            return self.per_instance(e, cts, env, ct, eqns)
        ops = e.inputs[1:]
        op_wrt = [isinstance(a, Var) and is_float(a.aval) for a in ops]
        arms = []
        for arm in e.params["branches"]:
            self._alias(arm.inputs, ops)
            arms.append(self.program(arm, op_wrt, values=False))
        seeds = [c or eqns.zeros(ct_aval(v.aval)) for c, v in zip(cts, e.outputs) if is_float(v.aval)]
        inputs = [_read(e.inputs[0], env)] + [_read(a, env) for a in ops] + seeds
        grads = eqns.bind(e.prim, inputs, dict(e.params, branches=tuple(arms), inplace=()), e.info)
        for a, g in zip([a for a, w in zip(ops, op_wrt) if w], grads):
            _accumulate(ct, a, g, eqns)

    def _alias(self, inner, outer):
        for v, a in zip(inner, outer):
            if isinstance(a, Var):
                self.alias[v] = self.alias.get(a, a)

    def _cap(self, e):
        if _holds_backward(e.params["body"]):
            raise TransformError(f"{self.api}: the program already holds a reverse pass through a device loop; "
                                 "reverse mode over it again is not supported: take the outer derivative in "
                                 "forward mode (eagle_fx.jvp(eagle_fx.grad(f), ...): a Hessian-vector product)")
        if self.checkpoints or self._recomputes(e):
            return None             # no stack of turns: a checkpointed loop keeps K states, whatever its length
        return self._bound(e)

    def _recomputes(self, e) -> bool:
        """Loop `e`'s reverse recomputes its turns (no stack): reversible, or with no bound where
        stacks cannot grow (reverse_again.py)."""
        return self.recompute or (self.unbounded and self._bound(e) is None)

    def _bound(self, e):
        """The most turns loop `e` runs, where known: its cap, or its trip count's capacity."""
        if e.params["cap"] is not None:
            return e.params["cap"]
        if e.params["counted"]:
            trip = ir.WhileOperands(e).trip
            trip = self.alias.get(trip, trip)
            cap = self.capacity(trip, e) if trip in self.top else None
            return None if cap is None else max(1, cap)
        return None                 # no known bound: the stack grows as the loop runs

    def forward_loop(self, e, env, eqns):
        """The loop, also stacking each turn's carries (unless checkpointed) and counting its turns."""
        body, cond = e.params["body"], e.params["cond"]
        w = ir.WhileOperands(e)
        consts, init = w.consts, w.carries
        cap = self._cap(e)
        stack_avals = [] if self.checkpoints or self._recomputes(e) else [ir.stack_aval(cap, a.aval.shape, a.aval.dtype) for a in init]
        b_ins = [Var(v.aval, v.hint) for v in body.inputs]
        stacks = [Var(a) for a in stack_avals]
        turns = Var(ir.U32_CELL)
        b_eqns = Eqns()
        pushed = [b_eqns.bind(ir.stack_push_p, [s, b_ins[0], c], {"cap": cap, "batched": False, "inplace": ((0, 0),)},
                              e.info)[0] for s, c in zip(stacks, w.body_parts(b_ins)[2])]
        outs = inline(body, b_ins, b_eqns)
        counted = b_eqns.bind(ir.cell_inc_p, [b_ins[0]], {})[0]
        new_body = Program(b_ins + stacks + [turns], b_eqns, outs + pushed + [counted])
        new_cond = copy_program(cond, stack_avals + [ir.U32_CELL]) if cond is not None else None
        inputs = ([_read(w.trip, env)] if w.head else []) + [_read(a, env) for a in consts + init] \
            + [eqns.zeros(a) for a in stack_avals] + [eqns.zeros(ir.U32_CELL)]
        params = dict(e.params, body=new_body, cond=new_cond, inplace=())
        outs = eqns.bind(ir.while_p, inputs, params, e.info)
        k = len(init)
        env.update(zip(e.outputs, outs[:k]))
        return outs[k:k + len(stacks)], outs[-1]

    def loop(self, e, cts, env, ct, eqns, saved):
        if e.params.get("masked"):
            return self.per_instance(e, cts, env, ct, eqns)
        if self.checkpoints:
            return self.revolve(e, cts, env, ct, eqns, saved[1])
        if self._recomputes(e):
            return self.recomputed(e, cts, env, ct, eqns, saved[1])
        stacks, turns = saved
        w = self._loop_parts(e)
        # the backward body: (turn, consts, turns, stacks, carry cts, const ct sums) -> (carry cts, sums)
        r_turn, r_turns = Var(ir.U32_CELL), Var(ir.U32_CELL)
        r_consts = [Var(a.aval) for a in w.consts]
        r_stacks = [Var(s.aval) for s in stacks]
        b = Eqns()
        idx = b.bind(ir.cell_rev_p, [r_turns, r_turn], {})[0]
        carries = [b.bind(ir.stack_read_p, [s, idx], {"batched": False, "turn_batched": False})[0] for s in r_stacks]
        body_cts = w.body_cts(b, idx, r_consts, carries)
        r_body = dce(Program([r_turn] + r_consts + [r_turns] + r_stacks + w.r_cts + w.r_sums, b, body_cts))
        inputs = [turns] + [_read(a, env) for a in w.consts] + [turns] + list(stacks) + w.seeds(cts, eqns)
        params = {"body": r_body, "cond": None, "cap": None, "counted": True,
                  "n_consts": w.nc + 1 + len(stacks), "inplace": ()}
        w.accumulate(eqns.bind(ir.while_p, inputs, params, e.info), ct, eqns)

    def recomputed(self, e, cts, env, ct, eqns, turns):
        """The backward as a counted loop whose turn t runs the body again from the loop's entry
        to turn turns - 1 - t (a counted loop), then its vjp: plain loops, reversible again."""
        w = self._loop_parts(e)
        r_turn, r_turns = Var(ir.U32_CELL), Var(ir.U32_CELL)
        r_consts = [Var(a.aval) for a in w.consts]
        r_init = [Var(a.aval) for a in w.init]
        b = Eqns()
        idx = b.bind(ir.cell_rev_p, [r_turns, r_turn], {})[0]
        # a capped loop's cap bounds both loops (static sizes for their reverse on JAX); a counted
        # loop's trip count is read at replay, so no bound is set from the one seen at build
        cap = e.params["cap"]
        again = {"body": copy_program(e.params["body"]), "cond": None, "cap": cap, "counted": True,
                 "n_consts": w.nc, "inplace": ()}
        carries = b.bind(ir.while_p, [idx] + r_consts + r_init, again, e.info)
        body_cts = w.body_cts(b, idx, r_consts, carries)
        r_body = dce(Program([r_turn] + r_consts + [r_turns] + r_init + w.r_cts + w.r_sums, b, body_cts))
        inputs = [turns] + [_read(a, env) for a in w.consts] + [turns] + [_read(a, env) for a in w.init] \
            + w.seeds(cts, eqns)
        params = {"body": r_body, "cond": None, "cap": cap, "counted": True,
                  "n_consts": w.nc + 1 + len(w.init), "inplace": ()}
        w.accumulate(eqns.bind(ir.while_p, inputs, params, e.info), ct, eqns)

    def revolve(self, e, cts, env, ct, eqns, turns):
        """The checkpointed backward: one revolve equation over the loop's carries on entry."""
        w = self._loop_parts(e)
        r_turn = Var(ir.U32_CELL)
        r_consts = [Var(a.aval) for a in w.consts]
        r_carries = [Var(a.aval) for a in w.init]
        b = Eqns()
        body_cts = w.body_cts(b, r_turn, r_consts, r_carries)
        backward = dce(Program([r_turn] + r_consts + r_carries + w.r_cts + w.r_sums, b, body_cts))
        inputs = [turns] + [_read(a, env) for a in w.consts + w.init] + w.seeds(cts, eqns)
        params = {"forward": copy_program(e.params["body"]), "backward": backward,
                  "checkpoints": self.checkpoints, "n_consts": w.nc}
        w.accumulate(eqns.bind(ir.revolve_p, inputs, params, e.info), ct, eqns)

    def _loop_parts(self, e) -> "_LoopBackward":
        """What both loop backwards (stored turns, revolve) share: the body's vjp and its operands."""
        body, w = e.params["body"], ir.WhileOperands(e)
        nc, consts, init = w.n_consts, w.consts, w.carries
        c_wrt = [isinstance(a, Var) and is_float(a.aval) for a in consts]
        k_float = [is_float(a.aval) for a in init]
        self._alias(w.body_parts(body.inputs)[1], consts)
        self.in_loop += 1
        try:
            bv = self.program(body, [False] + c_wrt + k_float, values=False)    # (turn, consts, carries, cts) -> cts
        finally:
            self.in_loop -= 1
        return _LoopBackward(e, nc, consts, init, c_wrt, k_float, bv)


# -- the forward pass --------------------------------------------------------------------------------

def _copy(v, e, env, eqns, saved):
    copy_eqn(e, env, eqns)


@forward_rules.register(ir.while_p)
def _forward_loop(v, e, env, eqns, saved):
    if e.params.get("masked"):       # per instance: its reverse runs it again (_Vjp.per_instance)
        copy_eqn(e, env, eqns)
        saved[e] = None
        return
    saved[e] = v.forward_loop(e, env, eqns)


@forward_rules.register(ir.call_p)
def _forward_call(v, e, env, eqns, saved):
    if not e.params.get("inplace") and not e.params.get("batch") and split_kernel(e.params["spec"]):
        v.forward_call(e, env, eqns)
    else:
        copy_eqn(e, env, eqns)


# -- the reverse pass: calls, control flow ---------------------------------------------------------------

vjp_rules[ir.call_p] = lambda v, e, cts, env, ct, eqns, saved: v.call(e, cts, env, ct, eqns)
vjp_rules[ir.cond_p] = vjp_rules[ir.switch_p] = \
    lambda v, e, cts, env, ct, eqns, saved: v.branches(e, cts, env, ct, eqns)
vjp_rules[ir.while_p] = lambda v, e, cts, env, ct, eqns, saved: v.loop(e, cts, env, ct, eqns, saved[e])


@vjp_rules.refuse(ir.opaque_p)
def _opaque(v, e, cts, env, ct, eqns, saved):
    """Host nodes: refused in the forward pass already (refuse_untransformable says why)."""
    refuse_untransformable(e, v.api)


@vjp_rules.register(batch_broadcast_p)
def _broadcast_transpose(v, e, cts, env, ct, eqns, saved):
    """A value spread over a batch: its cotangent is the sum of the instances'."""
    if ir.is_stack(e.outputs[0].aval):
        raise TransformError(f"{v.api}: reverse mode over a batched program's stack of saved loop turns is not "
                             "supported: take this derivative inside the batch (eagle_fx.vmap(eagle_fx.grad(f)))")
    _accumulate(ct, e.inputs[0], eqns.bind(ir.batch_sum_p, [cts[0]], {"axis": e.params.get("axis", 0)})[0], eqns)


@vjp_rules.register(ir.batch_sum_p)
def _sum_transpose(v, e, cts, env, ct, eqns, saved):
    """A sum over a batch: its cotangent spread over the instances."""
    a = e.inputs[0]
    axis = e.params.get("axis", 0)
    _accumulate(ct, a, eqns.bind(batch_broadcast_p, [cts[0]], {"size": a.aval.shape[axis], "axis": axis})[0], eqns)


@vjp_rules.refuse(ir.revolve_p, ir.stack_push_p, ir.stack_read_p)
def _no_reverse(v, e, cts, env, ct, eqns, saved):
    """A reverse pass (revolve, stacks of saved turns) met by another reverse mode: reverse over
    reverse restages it to recompute its turns (reverse_again.py), except a checkpointed one."""
    if e.prim is ir.revolve_p:
        raise TransformError(f"{v.api}: reverse mode over a checkpointed reverse pass (checkpoints=, "
                             f"{e.info.where}) is not supported: take the inner derivative without checkpoints "
                             "(reverse over reverse then recomputes each turn of the loop from its entry)")
    raise TransformError(f"{v.api}: reverse mode over a loop's saved turns ({e.prim}, {e.info.where}) is not "
                         "supported here: take the inner derivative in the same transform (grad(grad(f)), "
                         "jacrev(grad(f))), which recomputes the turns")


@vjp_rules.register(ir.zeros_p)
@vjp_rules.register(ir.cell_not_p)
@vjp_rules.register(ir.cell_and_p)
@vjp_rules.register(ir.cell_or_p)
@vjp_rules.register(ir.cell_inc_p)
@vjp_rules.register(ir.cell_rev_p)
def _no_cotangent(v, e, cts, env, ct, eqns, saved):
    """Cells and zeros: no cotangent flows into their operands."""


# -- the derivative primitives and array structure: linear ------------------------------------------------

@vjp_rules.register(ir.add_any_p)
def _add_any(v, e, cts, env, ct, eqns, saved):
    for a in e.inputs:
        _accumulate(ct, a, cts[0], eqns)


@vjp_rules.register(ir.slice_p)
@vjp_rules.register(ir.update_p)
@vjp_rules.register(ir.reshape_p)
@vjp_rules.register(ir.concat_p)
def _structure(v, e, cts, env, ct, eqns, saved):
    if is_float(e.outputs[0].aval):
        for a, g in zip(e.inputs, structure.transpose(e, cts[0], eqns)):
            _accumulate(ct, a, g, eqns)


class _LoopBackward:
    """A loop's body vjp and the cotangent operands of its backward loop (carry cts, const ct sums)."""

    def __init__(self, e, nc, consts, init, c_wrt, k_float, bv):
        self.e, self.nc, self.consts, self.init = e, nc, consts, init
        self.c_wrt, self.k_float, self.bv = c_wrt, k_float, bv
        self.r_cts = [Var(ct_aval(a.aval)) for a, f in zip(init, k_float) if f]
        self.r_sums = [Var(ct_aval(a.aval)) for a, w in zip(consts, c_wrt) if w]

    def body_cts(self, b, turn, consts, carries):
        """One backward turn into `b`: (carry cts, const ct sums + this turn's const cts)."""
        outs = inline(self.bv, [turn] + consts + carries + self.r_cts, b)
        const_cts, carry_cts = outs[:len(self.r_sums)], outs[len(self.r_sums):]
        return carry_cts + [b.add(s, c) for s, c in zip(self.r_sums, const_cts)]

    def seeds(self, cts, eqns):
        """The backward loop's initial carries: the outputs' cotangents (zeros where none), zero sums."""
        seeds = [c or eqns.zeros(ct_aval(v.aval)) for c, v, f in zip(cts, self.e.outputs, self.k_float) if f]
        return seeds + [eqns.zeros(v.aval) for v in self.r_sums]

    def accumulate(self, grads, ct, eqns):
        floats = [a for a, f in zip(self.init, self.k_float) if f] + [a for a, w in zip(self.consts, self.c_wrt) if w]
        for a, g in zip(floats, grads):
            _accumulate(ct, a, g, eqns)


def _holds_backward(prog) -> bool:
    """Does a loop body hold a reverse pass through a loop (a stack read back, a revolve)?"""
    return any(e.prim in (ir.stack_read_p, ir.revolve_p) for e in prog.eqns) or \
        any(_holds_backward(q) for q in prog.subprograms())


class _Kept:
    """A call whose forward returns residuals: its forward and backward equations, and the inputs
    of its plain vjp call (what the backward becomes if the forward's results turn out unread)."""

    def __init__(self, forward, n_results, eqn):
        self.forward, self.n_results, self.eqn = forward, n_results, eqn
        self.backward = self.plain = None


def _settle(prog, kept):
    """Residuals only where they pay: a forward whose residuals nothing reads calls the kernel as
    it was; a forward whose results nothing reads (a loop body's last values, recomputed for
    their backward only) is dropped, and its backward is the plain vjp (which computes the costly
    values itself, with no round trip through memory). `prog` is not yet pruned: what is read is
    judged on its pruned form, but the swap edits the whole one, where the plain vjp's operands (in
    a loop body, zeros for the values it does not read, which nothing else reads) are still defined."""
    lean = dce(prog)
    ids = {id(q) for q in lean.eqns}
    mine = [k for k in kept.values() if id(k.forward) in ids]
    if not mine:
        return lean
    read = {a for q in lean.eqns for a in q.inputs if isinstance(a, Var)} | \
        {a for a in lean.outputs if isinstance(a, Var)}
    swap = {}
    for k in mine:
        f, e = k.forward, k.eqn
        if not any(r in read for r in f.outputs[k.n_results:]):
            swap[id(f)] = f.replace(params=dict(f.params, kernel=e.params["kernel"], spec=e.params["spec"]),
                                    outputs=f.outputs[:k.n_results])
        elif not any(o in read for o in f.outputs[:k.n_results]) and k.backward is not None \
                and id(k.backward) in ids:
            spec = vjp_spec(e.params["spec"])
            swap[id(f)] = None
            swap[id(k.backward)] = k.backward.replace(inputs=list(k.plain), params=dict(
                k.backward.params, kernel=spec.kernel, spec=spec))
    if not swap:
        return lean
    eqns = [swap.get(id(q), q) for q in prog.eqns]
    return dce(prog.replace(eqns=[q for q in eqns if q is not None]))


def _read(a, env):
    return a if isinstance(a, Literal) else env[a]


def _accumulate(ct, a, g, eqns):
    if g is None or not isinstance(a, Var) or not is_float(a.aval):
        return
    if g.aval.shape != a.aval.shape:
        raise AssertionError(f"cotangent of type {g.aval} for a value of type {a.aval}")
    ct[a] = eqns.add(ct.get(a), g)
