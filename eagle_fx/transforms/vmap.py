"""vmap: a Program over one instance becomes a Program over B instances (a leading batch axis).

Each value is either batched (shape (B, ...)) or shared by every instance (its shape unchanged).
Rules, one per primitive:
  * call: the kernel runs over all instances at once (the backend views (B, *shape, n) planes as
    (*shape, B, n), so elementwise code is unchanged and sample reductions stay per instance);
    a kernel that writes a shared plane in place from batched inputs is refused;
  * cell logic: batched when any operand is;
  * cond/switch on a shared cell: the arms are batched (the fast path: one arm runs);
    on a batched cell: every arm runs and each instance keeps its own arm's values ("masked");
  * while: carries found batched by a fixpoint over the body; with a batched guard (or trip
    count) the loop runs until every instance's guard is 0, finished instances frozen (masked);
  * a masked cond or loop records its one-instance equation and flags (`instance`): the
    derivative transforms differentiate that equation and batch the result, and a second batch
    meeting it batches that equation over both batches at once (B2 * B1 instances);
  * derivative primitives: zeros and sums as elementwise ops; a stack of saved loop turns gains
    the batch axis after its turn axis is read per instance (each instance ran its own turns);
  * opaque host nodes are refused.
"""
from __future__ import annotations

import numpy as np

from hawk_fx.core import Eqn, Literal, Program, RuleTable, Var, abstract_eval

from .. import ir
from . import structure
from .program import inline

batch_broadcast_p = ir.batch_broadcast_p
# prim -> fn(batcher, e, atoms, flags of the atoms, env, flags, eqns): the _Batcher methods marked so
batch_rules = RuleTable("batching")


class VmapError(ValueError):
    pass


class Instance:
    """What a masked construct batches: its one-instance equation, the batched flag of each operand,
    and B. Reverse mode differentiates that equation and batches its vjp (transforms/vjp_graph.py)."""

    __slots__ = ("eqn", "flags", "B")

    def __init__(self, eqn, flags, B):
        self.eqn, self.flags, self.B = eqn, tuple(flags), B

    def __repr__(self):
        return f"Instance({self.eqn.prim}, B={self.B})"

    def keeping(self, cs, js, keep, reads):
        """This instance of a loop pruned to its consts `cs` and carries `js` (when its body and
        guard read no other: else None, and reverse mode over the pruned loop is refused)."""
        e0 = self.eqn
        w = ir.WhileOperands(e0)
        body, cond = e0.params["body"], e0.params["cond"]
        _, consts, carries = w.body_parts(body.inputs)
        read = reads(body, [body.outputs[j] for j in js]) | \
            (reads(cond, cond.outputs) if cond is not None else set())
        g_consts, g_carries = w.guard_parts(cond.inputs) if cond is not None else ([], [])
        dropped = [consts[i] for i in range(len(consts)) if i not in cs] + \
            [carries[j] for j in range(len(carries)) if j not in js]
        dropped += [g_consts[i] for i in range(len(g_consts)) if i not in cs] + \
            [g_carries[j] for j in range(len(g_carries)) if j not in js]
        if any(v in read for v in dropped):
            return None
        nc = w.n_consts
        flags = self.flags[:w.head] + tuple(self.flags[w.head + i] for i in cs) + \
            tuple(self.flags[w.head + nc + j] for j in js)
        return Instance(keep(e0, cs, js), flags, self.B)


class _Batcher:
    def __init__(self, B: int):
        self.B = B

    def program(self, prog: Program, in_flags, force_out=None):
        """The batched Program and the batched flag of each output. force_out: outputs to batch."""
        env: dict = {}
        flags: dict = {}
        inputs = []
        for v, f in zip(prog.inputs, in_flags):
            nv = Var(ir.batched_aval(v.aval, self.B) if f else v.aval, v.hint)
            env[v], flags[v] = nv, f
            inputs.append(nv)
        eqns: list[Eqn] = []
        for e in prog.eqns:
            self.eqn(e, env, flags, eqns)
        outs, out_flags = [], []
        for j, a in enumerate(prog.outputs):
            atom, f = self.read(a, env, flags)
            if force_out is not None and force_out[j] and not f:
                atom, f = self.broadcast(atom, eqns), True
            outs.append(atom)
            out_flags.append(f)
        return Program(inputs, eqns, outs), out_flags

    def read(self, a, env, flags):
        if isinstance(a, Literal):
            return a, False
        return env[a], flags[a]

    def broadcast(self, atom, eqns):
        v = Var(ir.batched_aval(atom.aval, self.B))
        eqns.append(Eqn(batch_broadcast_p, [atom], [v], {"size": self.B}))
        return v

    def eqn(self, e, env, flags, eqns):
        ins = [self.read(a, env, flags) for a in e.inputs]
        atoms = [a for a, _ in ins]
        fl = [f for _, f in ins]
        batch_rules[e.prim](self, e, atoms, fl, env, flags, eqns)

    def copy(self, e, atoms, out_flags, env, flags, eqns, params=None):
        outs = []
        for v, f in zip(e.outputs, out_flags):
            nv = Var(ir.batched_aval(v.aval, self.B) if f else v.aval, v.hint)
            env[v], flags[v] = nv, f
            outs.append(nv)
        eqns.append(Eqn(e.prim, atoms, outs, params if params is not None else e.params, e.info))
        return outs

    @batch_rules.register(ir.opaque_p)
    def opaque(self, e, atoms, fl, env, flags, eqns):
        if any(fl):
            raise VmapError(f"eagle_fx.vmap: the host node {e.info.name or getattr(e.params['fn'], '__name__', 'fn')!r} ({e.info.where}) reads batched "
                            "arrays; a host function runs once per replay and cannot be batched: move its work "
                            "into a kernel, or keep its arrays out of the batch (in_axes=None)")
        self.copy(e, atoms, [False] * len(e.outputs), env, flags, eqns)

    @batch_rules.register(ir.cell_not_p)
    @batch_rules.register(ir.cell_and_p)
    @batch_rules.register(ir.cell_or_p)
    @batch_rules.register(ir.add_any_p)
    @batch_rules.register(ir.cell_inc_p)
    @batch_rules.register(ir.cell_rev_p)
    @batch_rules.register(ir.zeros_p)
    def elementwise(self, e, atoms, fl, env, flags, eqns):
        """Cell logic, sums, zeros, turn counting: batched when any operand is. A shared operand
        meets a batched one by broadcasting (its axes are the trailing ones); batched again, such an
        operand is spread over the axes it lacks, after this batch's axis, so the two stay aligned."""
        if any(fl):
            rank = len(e.outputs[0].aval.shape)
            atoms = [self.spread_inner(a, rank - len(v.aval.shape), e.outputs[0].aval.shape, eqns, e.info)
                     if f and len(v.aval.shape) < rank else a for a, f, v in zip(atoms, fl, e.inputs)]
        self.copy(e, atoms, [any(fl)], env, flags, eqns)

    def spread_inner(self, atom, k, shape, eqns, info):
        """A batched (B, *x) spread to (B, *shape[:k], *x): the leading axes another vmap's batched
        operand has and this one lacks."""
        for j in range(k):
            atom = _bind(eqns, batch_broadcast_p, [atom], {"size": shape[j], "axis": 1 + j}, info)
        return atom

    @batch_rules.register(ir.stack_read_p)
    def stack_read(self, e, atoms, fl, env, flags, eqns):
        if e.params.get("batched") or e.params.get("turn_batched"):       # another vmap's stack
            if any(fl):
                self.refuse_masked(e, fl)
            return self.copy(e, atoms, [False], env, flags, eqns)
        params = dict(e.params, batched=fl[0], turn_batched=fl[1])
        self.copy(e, atoms, [any(fl)], env, flags, eqns, params)

    @batch_rules.register(ir.call_p)
    def call(self, e, atoms, fl, env, flags, eqns):
        if not any(fl):
            self.copy(e, atoms, [False] * len(e.outputs), env, flags, eqns)
            return
        if e.params.get("batch"):
            return self.inner_batched_call(e, atoms, fl, env, flags, eqns)
        shared = _shared_outputs(e, fl)
        if shared:           # results no batched input reaches (a jvp kernel's primal, a guard): one unbatched call
            stand_in = [_bind(eqns, ir.zeros_p, [], {"aval": v.aval}, e.info) if f else a
                        for a, f, v in zip(atoms, fl, e.inputs)]
            one = [Var(v.aval, v.hint) for v in e.outputs]
            eqns.append(Eqn(e.prim, stand_in, one, e.params, e.info))
        kernel = e.params["kernel"]
        for j, i in e.params["inplace"]:
            if not fl[i]:
                name = kernel.param_names[i] if i < len(kernel.param_names) else "buffer="
                raise VmapError(f"eagle_fx.vmap: kernel {kernel.name} ({e.info.where}) writes '{name}' in place with "
                                f"per-instance values, but that array is shared by all instances: batch it "
                                "(in_axes=0), so each instance has its own")
        params = dict(e.params, batch=(self.B,), in_batched=tuple(fl))
        self.copy(e, atoms, [True] * len(e.outputs), env, flags, eqns, params)
        for j in shared:
            env[e.outputs[j]], flags[e.outputs[j]] = one[j], False

    def inner_batched_call(self, e, atoms, fl, env, flags, eqns):
        """A call another vmap batched (B1 instances) under this one (B2): one call over the B2 * B1
        instances, outer-major. A value of both batches (B2, B1, ...) is seen as (B2 * B1, ...); one
        of one batch only is spread over the other first; the results are seen as (B2, B1, ...)."""
        inner = tuple(e.params["batch"])
        B1 = int(np.prod(inner))
        if e.params["inplace"]:
            raise VmapError(f"eagle_fx.vmap: kernel {e.params['kernel'].name} ({e.info.where}) writes in place inside "
                            "a batched program that is batched again; transform the function that does not write "
                            "its arguments (a derivative's graph is functional), or batch both levels with "
                            "eagle_fx.vmap(eagle_fx.vmap(f))")
        new_atoms, new_ib = [], []
        for a, o, i in zip(atoms, fl, e.params["in_batched"]):
            if not (o or i):
                new_atoms.append(a)
                new_ib.append(False)
                continue
            if not o:                                  # (B1, ...) -> (B2, B1, ...)
                a = self.broadcast(a, eqns)
            elif not i:                                # (B2, ...) -> (B2, B1, ...)
                a = _bind(eqns, batch_broadcast_p, [a], {"size": B1, "axis": 1}, e.info)
            new_atoms.append(_bind(eqns, ir.reshape_p, [a], {"shape": (self.B * B1,) + a.aval.shape[1 + len(inner):]},
                                   e.info))
            new_ib.append(True)
        params = dict(e.params, batch=(self.B * B1,), in_batched=tuple(new_ib))
        outs = abstract_eval[ir.call_p](*[a.aval for a in new_atoms], **params)
        flat = [Var(a) for a in outs]
        eqns.append(Eqn(ir.call_p, new_atoms, flat, params, e.info))
        for v, o in zip(e.outputs, flat):
            nv = _bind(eqns, ir.reshape_p, [o], {"shape": (self.B,) + inner + o.aval.shape[1:]}, e.info)
            nv.hint = v.hint
            env[v], flags[v] = nv, True

    @batch_rules.register(batch_broadcast_p)
    def broadcast_again(self, e, atoms, fl, env, flags, eqns):
        """Another vmap's spread under this one: (B2, ...) spread over the inner axis, after the outer."""
        if not fl[0]:
            self.copy(e, atoms, [False], env, flags, eqns)
            return
        if ir.is_stack(e.outputs[0].aval):
            raise VmapError("eagle_fx.vmap: a batched program's stack of saved loop turns is batched again; batch the "
                            "unbatched function at both levels (eagle_fx.vmap(eagle_fx.vmap(f)))")
        self.copy(e, atoms, [True], env, flags, eqns, dict(e.params, axis=e.params.get("axis", 0) + 1))

    @batch_rules.register(ir.batch_sum_p)
    def sum_again(self, e, atoms, fl, env, flags, eqns):
        """Another vmap's sum over its batch, under this one: the axis after the outer batch's."""
        if not fl[0]:
            self.copy(e, atoms, [False], env, flags, eqns)
            return
        self.copy(e, atoms, [True], env, flags, eqns, dict(e.params, axis=e.params.get("axis", 0) + 1))

    def refuse_masked(self, e, fl):
        """A construct another vmap made per instance (a masked cond or loop, a stack of each
        instance's turns) taking values of this vmap's batch: not supported."""
        raise VmapError(f"eagle_fx.vmap: a device {'loop' if e.prim in (ir.while_p, ir.revolve_p) else 'condition'} "
                        f"({e.info.where}) that an inner vmap runs per instance (its guard or predicate differs by "
                        "instance) takes values of an outer batch (a Jacobian's basis, or a second vmap); "
                        "transform in the other order: eagle_fx.vmap(eagle_fx.jacfwd(f)) rather than "
                        "eagle_fx.jacfwd(eagle_fx.vmap(f)), or eagle_fx.vmap(eagle_fx.vmap(f)) of the unbatched f")

    # -- another vmap's per-instance constructs (masked) meeting this batch: masks over both --------
    # A masked cond or loop of an inner batch (B1 instances) that reads values of this batch (B2)
    # records its one-instance equation (Instance): that equation is batched once over the
    # B2 * B1 instances, outer-major, its operands of either batch merged into one axis
    # (B2 * B1, ...) around it, and its results seen as (B2, B1, ...). Each instance of both
    # batches keeps its own arm, or runs its own turns, with the one level of masks every backend
    # lowers; and the result is again one vmap of one equation (reverse mode differentiates it so).

    def merged(self, a, outer_b, inner_b, B1, eqns, info):
        """`a` as (B2 * B1, ...): spread over the batch it lacks, then its two batch axes merged."""
        if not inner_b:
            if not outer_b:
                return a
            a = _bind(eqns, batch_broadcast_p, [a], {"size": B1, "axis": 1}, info)
        elif not outer_b:
            a = self.broadcast(a, eqns)
        return _bind(eqns, ir.reshape_p, [a], {"shape": (self.B * B1,) + a.aval.shape[2:]}, info)

    def instance_again(self, e, atoms, fl, env, flags, eqns):
        if not _has_instance(e):          # pruned since, in a way its one-instance equation could not be
            self.refuse_masked(e, fl)
        if e.params["inplace"] or any(ir.is_stack(v.aval) for v in e.outputs):
            what = "writes an array in place" if e.params["inplace"] else "saves its turns for a reverse pass"
            raise VmapError(f"eagle_fx.vmap: a device {'loop' if e.prim is ir.while_p else 'condition'} "
                            f"({e.info.where}) that an inner vmap runs per instance {what}, and takes values of an "
                            "outer batch (a second vmap); batch a function that does not write its arguments "
                            "(a derivative's graph does not), or batch both levels at once: "
                            "eagle_fx.vmap(eagle_fx.vmap(f)) of the unbatched f")
        inst = e.params["instance"]
        B1 = inst.B
        one, at = instance_program(e)
        merged = [self.merged(atoms[k], fl[k], inst.flags[k], B1, eqns, e.info) for k in at]
        both = [fl[k] or inst.flags[k] for k in at]
        batched, _ = _Batcher(self.B * B1).program(one, both, force_out=[True] * len(e.outputs))
        for v, o in zip(e.outputs, inline(batched, merged, _Appending(eqns))):
            nv = _bind(eqns, ir.reshape_p, [o], {"shape": (self.B,) + v.aval.shape}, e.info)
            nv.hint = v.hint
            env[v], flags[v] = nv, True

    @batch_rules.register(ir.stack_push_p)
    def push(self, e, atoms, fl, env, flags, eqns):
        if e.params.get("batched"):                # another vmap's stack
            if any(fl):
                self.refuse_masked(e, fl)
            return self.copy(e, atoms, [False], env, flags, eqns)
        stack_b, turn_b, value_b = fl
        if turn_b:
            raise VmapError("eagle_fx.vmap: a per-instance turn for a stack of saved loop turns; the turns of a "
                            "batched loop are shared")
        atoms = list(atoms)
        if value_b and not stack_b:
            atoms[0] = self.broadcast(atoms[0], eqns)
        batched = stack_b or value_b
        self.copy(e, atoms, [batched], env, flags, eqns, dict(e.params, batched=batched))

    @batch_rules.register(ir.slice_p)
    @batch_rules.register(ir.reshape_p)
    @batch_rules.register(ir.concat_p)
    def structure(self, e, atoms, fl, env, flags, eqns, new_base=False):
        if not any(fl):
            self.copy(e, atoms, [False], env, flags, eqns)
            return
        params, broadcast = structure.batch_params(e, fl, self.B)
        atoms = [self.broadcast(a, eqns) if b else a for a, b in zip(atoms, broadcast)]
        if new_base:
            params["inplace"] = ()          # the base was broadcast: a new buffer
        self.copy(e, atoms, [True], env, flags, eqns, params)

    @batch_rules.register(ir.update_p)
    def update(self, e, atoms, fl, env, flags, eqns):
        """As structure; a shared base meeting batched values is broadcast (a write through a view refused)."""
        if any(fl) and not fl[0] and e.params.get("inplace"):
            raise VmapError(f"eagle_fx.vmap: a write through a view ({e.info.where}) puts per-instance values into "
                            "an array shared by all instances; batch that array (in_axes=0)")
        self.structure(e, atoms, fl, env, flags, eqns, new_base=not fl[0])

    @batch_rules.register(ir.cond_p)
    @batch_rules.register(ir.switch_p)
    def branches(self, e, atoms, fl, env, flags, eqns):
        if e.params.get("masked"):               # another vmap's per-instance construct
            if any(fl):
                return self.instance_again(e, atoms, fl, env, flags, eqns)
            return self.copy(e, atoms, [False] * len(e.outputs), env, flags, eqns)
        pred_b, op_flags = fl[0], fl[1:]
        arms = e.params["branches"]
        trial = [self.program(a, op_flags)[1] for a in arms]
        out_b = [pred_b or any(t[j] for t in trial) for j in range(len(e.outputs))]
        for j, i in e.params["inplace"]:
            if out_b[j] and not fl[i]:
                raise VmapError(f"eagle_fx.vmap: a device conditional ({e.info.where}) writes a shared array in place "
                                "with per-instance values; batch that array (in_axes=0)")
        new_arms = tuple(self.program(a, op_flags, force_out=out_b)[0] for a in arms)
        params = dict(e.params, branches=new_arms, masked=pred_b)
        if pred_b:
            params["instance"] = Instance(e, fl, self.B)
        self.copy(e, atoms, out_b, env, flags, eqns, params)

    @batch_rules.register(ir.while_p)
    def loop(self, e, atoms, fl, env, flags, eqns):
        if e.params.get("masked"):               # another vmap's per-instance construct
            if any(fl):
                return self.instance_again(e, atoms, fl, env, flags, eqns)
            return self.copy(e, atoms, [False] * len(e.outputs), env, flags, eqns)
        body, cond = e.params["body"], e.params["cond"]
        w = ir.WhileOperands(e, fl)
        trip_b = w.trip if w.head else False
        const_f = w.consts
        carry_f = list(w.carries)
        masked = trip_b
        while True:            # batched carries: a fixpoint (the flags only grow)
            _, body_out = self.program(body, [False] + const_f + carry_f)
            guard_b = self.program(cond, const_f + carry_f)[1][0] if cond is not None else False
            new = [c or b for c, b in zip(carry_f, body_out)]
            masked = trip_b or guard_b
            if masked:
                new = [True] * len(carry_f)
            if new == carry_f:
                break
            carry_f = new
        for j, i in e.params["inplace"]:
            if carry_f[j] and not fl[i]:
                raise VmapError(f"eagle_fx.vmap: a device loop ({e.info.where}) writes a shared array in place with "
                                "per-instance values; batch that array (in_axes=0)")
        new_body = self.program(body, [False] + const_f + carry_f, force_out=carry_f)[0]
        new_cond = self.program(cond, const_f + carry_f)[0] if cond is not None else None
        atoms = list(atoms)
        for j, f in enumerate(carry_f):
            k = w.head + w.n_consts + j
            if f and not fl[k]:
                atoms[k] = self.broadcast(atoms[k], eqns)
        params = dict(e.params, body=new_body, cond=new_cond, masked=masked)
        if masked:
            params["instance"] = Instance(e, ([trip_b] if w.head else []) + const_f + carry_f, self.B)
        self.copy(e, atoms, carry_f, env, flags, eqns, params)


    @batch_rules.register(ir.revolve_p)
    def revolve(self, e, atoms, fl, env, flags, eqns):
        """A checkpointed reverse: carries, cotangents and sums batched (the consts as they are);
        with a turn count per instance, masked: an instance's turns past its own count are no-ops."""
        if not any(fl):
            self.copy(e, atoms, [False] * len(e.outputs), env, flags, eqns)
            return
        if e.params.get("masked") or any(q.params.get("batch") for q in e.params["forward"].eqns):
            self.refuse_masked(e, fl)
        fwd, bwd = e.params["forward"], e.params["backward"]
        w = ir.WhileOperands(e, fl)
        const_f = w.consts
        rest = [True] * (len(w.carries) + len(w.rest))
        nk = len(fwd.outputs)
        new_fwd = self.program(fwd, [False] + const_f + rest[:nk], force_out=[True] * nk)[0]
        new_bwd = self.program(bwd, [False] + const_f + rest, force_out=[True] * len(bwd.outputs))[0]
        atoms = list(atoms)
        for k in range(w.head + w.n_consts, len(atoms)):
            if not fl[k]:
                atoms[k] = self.broadcast(atoms[k], eqns)
        params = dict(e.params, forward=new_fwd, backward=new_bwd, masked=w.trip)
        self.copy(e, atoms, [True] * len(e.outputs), env, flags, eqns, params)


def _shared_outputs(e, fl):
    """Indices of the results of call `e` that no batched input reaches (by the kernel's Program),
    when some others are reached; empty when the call writes in place or every result is reached."""
    spec = e.params["spec"]
    prog = spec.prog
    if e.params["inplace"] or len(prog.outputs) != len(e.outputs) or len(prog.inputs) > len(fl):
        return []
    split = spec.__dict__.get("primal_split")      # a jvp body: its primal results read no tangent
    if split is not None and not any(fl[:split[0]]) and any(fl[split[0]:len(prog.inputs)]):
        return list(range(split[1]))
    dep = {v for v, f in zip(prog.inputs, fl) if f}
    for q in prog.eqns:
        if any(a in dep for a in _read_vars(q)):
            dep.update(q.outputs)
    out = [j for j, o in enumerate(prog.outputs) if o not in dep]
    return out if len(out) < len(prog.outputs) else []


def _read_vars(q):
    """The Vars an equation reads, those its sub-programs read included."""
    out = [a for a in q.inputs if isinstance(a, Var)]
    for p in q.params.values():
        subs = [p] if isinstance(p, Program) else [x for x in p if isinstance(x, Program)] if isinstance(p, tuple) else []
        for sub in subs:
            for r in sub.eqns:
                out += _read_vars(r)
            out += [a for a in sub.outputs if isinstance(a, Var)]
    return out


def _bind(eqns, prim, inputs, params, info):
    """Append prim(inputs) with its output type inferred; its one output."""
    out = Var(abstract_eval[prim](*[a.aval for a in inputs], **params)[0])
    eqns.append(Eqn(prim, list(inputs), [out], params, info))
    return out


def _has_instance(e):
    """Does masked `e` record its one-instance equation, operand for operand (not pruned since)?"""
    inst = e.params.get("instance")
    return inst is not None and len(inst.eqn.inputs) == len(e.inputs) and len(inst.eqn.outputs) == len(e.outputs)


class _Appending:
    """An Eqns-like view of a plain list of equations, for inline()."""

    def __init__(self, eqns):
        self.eqns = eqns

    def bind(self, prim, inputs, params, info=None):
        return _bind_all(self.eqns, prim, inputs, params, info)


def _bind_all(eqns, prim, inputs, params, info):
    """Append prim(inputs) with its output types inferred; its outputs."""
    outs = [Var(a) for a in abstract_eval[prim](*[a.aval for a in inputs], **params)]
    eqns.append(Eqn(prim, list(inputs), outs, params, info))
    return outs


def batch_program(prog: Program, in_flags, B: int, force_out=None):
    """(batched Program, batched flag per output); force_out: outputs batched even when shared."""
    return _Batcher(B).program(prog, list(in_flags), force_out)


def has_instance(e):
    """Is `e` a construct vmap runs per instance (masked) that records its one-instance equation?"""
    return bool(e.params.get("masked")) and _has_instance(e)


def instance_program(e):
    """The one-instance equation of masked `e` as a Program over its Var operands, and their
    operand positions."""
    e0 = e.params["instance"].eqn
    at = [k for k, a in enumerate(e0.inputs) if isinstance(a, Var)]
    ins = {k: Var(e0.inputs[k].aval) for k in at}
    return Program(list(ins.values()), [e0.replace(inputs=[ins.get(k, a) for k, a in enumerate(e0.inputs)])],
                   list(e0.outputs)), at
