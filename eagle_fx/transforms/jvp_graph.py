"""jvp as a Program transform: (inputs, tangents) -> (outputs, output tangents), control flow kept.

One rule per primitive:
  * call: the kernel's jvp body (hawk_fx.diff.jvp_spec) computes outputs and tangents in one call;
  * cond/switch: the same predicate; each arm transformed, tangents of the outputs added to its
    outputs (zero in an arm that makes none);
  * while: tangents of the carries ride along as carries (found by a fixpoint over the body),
    tangents of the consts as consts; the guard reads the primal carries only;
  * the derivative primitives are linear in their planes (zeros, add_any, stack_push/read);
  * cells carry no tangent; opaque host nodes are refused.
The result is a Program like any other: printed, built into a graph, batched, transformed again.
"""
from __future__ import annotations

from hawk_fx.core import Literal, Program, RuleTable, Var
from hawk_fx.diff import jvp_spec

from .. import ir
from . import structure
from .program import Eqns, TransformError, copy_eqn, copy_program, ct_aval, dce, inline, is_float, \
    refuse_untransformable
from .vmap import batch_broadcast_p, batch_program, has_instance, instance_program

API = "eagle_fx.jvp"

# prim -> fn(e, env, tan, eqns, ts): e's outputs into env, their tangents into tan (ts: the
# tangent of each input, one at least not None; an equation with none is copied as it is)
jvp_rules = RuleTable(API)


def jvp_graph(prog: Program, flags, force=None):
    """(Program over (inputs..., a tangent per flagged input...) -> (outputs..., a tangent per
    flagged output...), output flags). `force`: outputs that get a tangent even when it is zero."""
    inputs = [Var(v.aval, v.hint) for v in prog.inputs]
    env = dict(zip(prog.inputs, inputs))
    tan: dict = {}
    t_inputs = []
    for v, f in zip(prog.inputs, flags):
        if f:
            tan[v] = Var(ct_aval(v.aval))
            t_inputs.append(tan[v])
    eqns = Eqns()
    for e in prog.eqns:
        _eqn(e, env, tan, eqns)
    outs = [a if isinstance(a, Literal) else env[a] for a in prog.outputs]
    out_flags = [isinstance(a, Var) and is_float(a.aval) and (a in tan or bool(force and force[j]))
                 for j, a in enumerate(prog.outputs)]
    t_outs = [tan.get(a) or eqns.zeros(ct_aval(a.aval)) for a, f in zip(prog.outputs, out_flags) if f]
    return dce(Program(inputs + t_inputs, eqns, outs + t_outs)), out_flags


def _eqn(e, env, tan, eqns):
    refuse_untransformable(e, API)
    ts = [tan.get(a) if isinstance(a, Var) else None for a in e.inputs]
    if all(t is None for t in ts):
        copy_eqn(e, env, eqns)
    else:
        jvp_rules[e.prim](e, env, tan, eqns, ts)


def _read(a, env):
    return a if isinstance(a, Literal) else env[a]


# -- calls, host nodes, cells -----------------------------------------------------------------------

@jvp_rules.register(ir.call_p)
def _call(e, env, tan, eqns, ts):
    spec, n = e.params["spec"], e.params["n"]
    params = e.inputs[:len(e.params["kernel"].param_names)]
    flags = [isinstance(a, Var) and a in tan and is_float(v.aval) and not v.aval.weak
             for a, v in zip(params, spec.prog.inputs)]
    ins = [_read(a, env) for a in params] + [tan[a] for a, f in zip(params, flags) if f]
    jspec = jvp_spec(spec, flags)
    jspec.__dict__.setdefault("primal_split", (len(params), len(e.outputs)))   # vmap: primals read no tangent
    if e.params.get("batch"):            # a batched call (vmap): a tangent is batched where its primal is
        fl = tuple(e.params["in_batched"][:len(params)])
        outs = eqns.bind(ir.call_p, ins, {"kernel": jspec.kernel, "spec": jspec, "n": n, "inplace": (),
                                          "batch": e.params["batch"],
                                          "in_batched": fl + tuple(b for b, f in zip(fl, flags) if f)}, e.info)
    else:
        outs = eqns.call(jspec, ins, n, e.info)
    k = len(e.outputs)
    for v, o, t in zip(e.outputs, outs[:k], outs[k:]):
        env[v] = o
        if is_float(v.aval):
            tan[v] = t


@jvp_rules.refuse(ir.opaque_p)
def _opaque(e, env, tan, eqns, ts):
    """Host nodes: refused (refuse_untransformable says why), with tangents or without."""
    refuse_untransformable(e, API)


@jvp_rules.register(ir.cell_not_p)
@jvp_rules.register(ir.cell_and_p)
@jvp_rules.register(ir.cell_or_p)
@jvp_rules.register(ir.cell_inc_p)
@jvp_rules.register(ir.cell_rev_p)
@jvp_rules.register(ir.zeros_p)
def _no_tangent(e, env, tan, eqns, ts):
    """Cells (and zeros) carry no tangent: the equation as it is."""
    copy_eqn(e, env, eqns)


# -- control flow ------------------------------------------------------------------------------------

def _per_instance(e, env, tan, eqns):
    """A cond or loop vmap runs per instance (masked): the jvp of its one-instance equation,
    batched as vmap batched it, so the constructs made record their own one-instance equations
    (reverse mode over this jvp differentiates them so)."""
    inst = e.params["instance"]
    one, at = instance_program(e)
    t_flags = [e.inputs[k] in tan for k in at]
    j, out_t = jvp_graph(one, t_flags)
    b_flags = [inst.flags[k] for k in at]
    batched, _ = batch_program(j, b_flags + [b for b, t in zip(b_flags, t_flags) if t], inst.B,
                               force_out=[True] * len(j.outputs))
    args = [_read(e.inputs[k], env) for k in at] + [tan[e.inputs[k]] for k, t in zip(at, t_flags) if t]
    outs = inline(batched, args, eqns)
    k = len(e.outputs)
    env.update(zip(e.outputs, outs[:k]))
    for v, t in zip([v for v, f in zip(e.outputs, out_t) if f], outs[k:]):
        tan[v] = t


@jvp_rules.register(ir.cond_p)
@jvp_rules.register(ir.switch_p)
def _branches(e, env, tan, eqns, ts):
    if has_instance(e):
        return _per_instance(e, env, tan, eqns)
    ops = e.inputs[1:]
    op_flags = [isinstance(a, Var) and a in tan for a in ops]
    arms = e.params["branches"]
    trial = [jvp_graph(a, op_flags)[1] for a in arms]
    out_flags = [any(t[j] for t in trial) for j in range(len(e.outputs))]
    new_arms = tuple(jvp_graph(a, op_flags, force=out_flags)[0] for a in arms)
    inputs = [_read(e.inputs[0], env)] + [_read(a, env) for a in ops] + [tan[a] for a, f in zip(ops, op_flags) if f]
    params = dict(e.params, branches=new_arms, inplace=())
    params.pop("instance", None)            # a masked cond's one-instance equation: not this one's
    outs = eqns.bind(e.prim, inputs, params, e.info)
    k = len(e.outputs)
    env.update(zip(e.outputs, outs[:k]))
    for v, t in zip([v for v, f in zip(e.outputs, out_flags) if f], outs[k:]):
        tan[v] = t


@jvp_rules.register(ir.while_p)
def _while(e, env, tan, eqns, ts):
    if has_instance(e):
        return _per_instance(e, env, tan, eqns)
    body, cond = e.params["body"], e.params["cond"]
    w = ir.WhileOperands(e)
    nc, consts, init = w.n_consts, w.consts, w.carries
    const_f = [isinstance(a, Var) and a in tan for a in consts]
    carry_f = [isinstance(a, Var) and a in tan for a in init]
    while True:            # carries with a tangent: a fixpoint over the body (the flags only grow)
        out_f = jvp_graph(body, [False] + const_f + carry_f)[1]
        new = [c or o for c, o in zip(carry_f, out_f)]
        if new == carry_f:
            break
        carry_f = new
    jb = jvp_graph(body, [False] + const_f + carry_f, force=carry_f)[0]
    # its inputs are (turn, consts, carries, const tangents, carry tangents): the loop takes
    # (turn, consts + const tangents, carries + carry tangents)
    ntc, nt = sum(const_f), sum(carry_f)
    ins = list(jb.inputs)
    ctr, c_in, k_in = ins[0], ins[1:1 + nc], ins[1 + nc:1 + len(consts) + len(init)]
    tc_in, tk_in = ins[1 + nc + len(init):1 + nc + len(init) + ntc], ins[1 + nc + len(init) + ntc:]
    jb = jb.replace(inputs=[ctr] + c_in + tc_in + k_in + tk_in)
    new_cond = None
    if cond is not None:
        cc = copy_program(cond)                     # the guard reads no tangent: unused inputs for them
        t_consts = [Var(ct_aval(a.aval)) for a, f in zip(consts, const_f) if f]
        t_carries = [Var(ct_aval(a.aval)) for a, f in zip(init, carry_f) if f]
        c_consts, c_carries = w.guard_parts(cc.inputs)
        new_cond = cc.replace(inputs=c_consts + t_consts + c_carries + t_carries)
    t_init = [tan.get(a) or eqns.zeros(ct_aval(a.aval)) for a, f in zip(init, carry_f) if f]
    inputs = ([_read(w.trip, env)] if w.head else []) + [_read(a, env) for a in consts] \
        + [tan[a] for a, f in zip(consts, const_f) if f] + [_read(a, env) for a in init] + t_init
    params = dict(e.params, body=jb, cond=new_cond, n_consts=nc + ntc, inplace=())
    params.pop("instance", None)            # a masked loop's one-instance equation: not this one's
    outs = eqns.bind(ir.while_p, inputs, params, e.info)
    k = len(e.outputs)
    env.update(zip(e.outputs, outs[:k]))
    for v, t in zip([v for v, f in zip(e.outputs, carry_f) if f], outs[k:k + nt]):
        tan[v] = t


@jvp_rules.refuse(ir.revolve_p)
def _revolve(e, env, tan, eqns, ts):
    """A checkpointed reverse pass: forward mode over it is refused (take the inner gradient without)."""
    raise TransformError(f"{API}: forward mode over a checkpointed reverse pass (checkpoints=) is not "
                         "supported: for a Hessian-vector product, take the inner gradient without checkpoints")


# -- array structure: the same op on the tangents (transforms/structure.py) ----------------------------

@jvp_rules.register(ir.slice_p)
@jvp_rules.register(ir.update_p)
@jvp_rules.register(ir.reshape_p)
@jvp_rules.register(ir.concat_p)
def _structure(e, env, tan, eqns, ts):
    copy_eqn(e, env, eqns)
    t = structure.jvp(e, ts, eqns)
    if t is not None and is_float(e.outputs[0].aval):
        tan[e.outputs[0]] = t


# -- the derivative primitives, linear in their planes ------------------------------------------------

def _linear(fn):
    """The rule of a linear primitive: the equation as it is, and `fn`'s tangent of its output."""
    def rule(e, env, tan, eqns, ts):
        copy_eqn(e, env, eqns)
        t = fn(e, env, tan, eqns)
        if t is not None:
            tan[e.outputs[0]] = t
    return rule


@jvp_rules.register(ir.add_any_p)
@_linear
def _add_tangent(e, env, tan, eqns):
    return eqns.add(tan.get(e.inputs[0]), tan.get(e.inputs[1]))


@jvp_rules.register(ir.stack_push_p)
@_linear
def _push_tangent(e, env, tan, eqns):
    stack, turn, value = e.inputs
    ts = tan.get(stack) or eqns.zeros(ct_aval(stack.aval))
    tv = tan.get(value) if isinstance(value, Var) else None
    tv = tv or eqns.zeros(ct_aval(value.aval))
    return eqns.bind(ir.stack_push_p, [ts, env[turn], tv], dict(e.params, inplace=((0, 0),)))[0]


@jvp_rules.register(ir.stack_read_p)
@_linear
def _read_tangent(e, env, tan, eqns):
    t = tan.get(e.inputs[0])
    return None if t is None else eqns.bind(ir.stack_read_p, [t, env[e.inputs[1]]], e.params)[0]


@jvp_rules.register(batch_broadcast_p)
@jvp_rules.register(ir.batch_sum_p)
@_linear
def _broadcast_tangent(e, env, tan, eqns):
    return eqns.bind(e.prim, [tan[e.inputs[0]]], e.params)[0]
