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
  * derivative primitives: zeros and sums as elementwise ops; a stack of saved loop turns gains
    the batch axis after its turn axis is read per instance (each instance ran its own turns);
  * opaque host nodes are refused.
"""
from __future__ import annotations

from hawk_fx.core import Eqn, Literal, Program, RuleTable, Var

from .. import ir
from . import structure

batch_broadcast_p = ir.batch_broadcast_p
# prim -> fn(batcher, e, atoms, flags of the atoms, env, flags, eqns): the _Batcher methods marked so
batch_rules = RuleTable("batching")


class VmapError(ValueError):
    pass


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
        """Cell logic, sums, zeros, turn counting: batched when any operand is."""
        self.copy(e, atoms, [any(fl)], env, flags, eqns)

    @batch_rules.register(ir.stack_read_p)
    def stack_read(self, e, atoms, fl, env, flags, eqns):
        params = dict(e.params, batched=fl[0], turn_batched=fl[1])
        self.copy(e, atoms, [any(fl)], env, flags, eqns, params)

    @batch_rules.register(ir.call_p)
    def call(self, e, atoms, fl, env, flags, eqns):
        if not any(fl):
            self.copy(e, atoms, [False] * len(e.outputs), env, flags, eqns)
            return
        kernel = e.params["kernel"]
        for j, i in e.params["inplace"]:
            if not fl[i]:
                name = kernel.param_names[i] if i < len(kernel.param_names) else "buffer="
                raise VmapError(f"eagle_fx.vmap: kernel {kernel.name} ({e.info.where}) writes '{name}' in place with "
                                f"per-instance values, but that array is shared by all instances: batch it "
                                "(in_axes=0), so each instance has its own")
        params = dict(e.params, batch=(self.B,), in_batched=tuple(fl))
        self.copy(e, atoms, [True] * len(e.outputs), env, flags, eqns, params)

    @batch_rules.register(ir.stack_push_p)
    def push(self, e, atoms, fl, env, flags, eqns):
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
        self.copy(e, atoms, out_b, env, flags, eqns, params)

    @batch_rules.register(ir.while_p)
    def loop(self, e, atoms, fl, env, flags, eqns):
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
        self.copy(e, atoms, carry_f, env, flags, eqns, params)


    @batch_rules.register(ir.revolve_p)
    def revolve(self, e, atoms, fl, env, flags, eqns):
        """A checkpointed reverse: carries, cotangents and sums batched (the consts as they are);
        with a turn count per instance, masked: an instance's turns past its own count are no-ops."""
        if not any(fl):
            self.copy(e, atoms, [False] * len(e.outputs), env, flags, eqns)
            return
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


# -- refusals ---------------------------------------------------------------------------------------

@batch_rules.refuse(batch_broadcast_p)
def _batched_twice(b, e, atoms, fl, env, flags, eqns):
    """A program vmap already batched: batching it again is not supported."""
    raise NotImplementedError(f"no batching rule for primitive '{e.prim}'")


def batch_program(prog: Program, in_flags, B: int):
    """(batched Program, batched flag per output)."""
    return _Batcher(B).program(prog, list(in_flags))
