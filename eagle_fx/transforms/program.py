"""Writing Programs from transforms: equations with their output types inferred, functional copies.

A transform that makes a new Program (jvp_graph, vjp_graph) appends equations to an `Eqns` list:
`bind` runs abstract evaluation to make the output Vars. Derived programs are functional: every
value has its own buffer (no `inplace`), because a reverse pass reads forward values that an
in-place write would destroy; `copy_eqn` rewrites a staged equation that way, with fresh Vars.
"""
from __future__ import annotations

import numpy as np

from hawk_fx.core import NO_INFO, Eqn, Literal, Program, RuleTable, Var, abstract_eval

from .. import ir


class TransformError(ValueError):
    pass


def is_float(aval) -> bool:
    return aval.dtype.kind in "fc"


def ct_aval(aval):
    """The type of a tangent or cotangent of a value of type `aval`."""
    return aval if is_float(aval) else ir.plane_aval(aval.shape, np.float64)


class Eqns(list):
    def bind(self, prim, inputs, params, info=NO_INFO) -> list[Var]:
        outs = [Var(a) for a in abstract_eval[prim](*[a.aval for a in inputs], **params)]
        self.append(Eqn(prim, inputs, outs, params, info))
        return outs

    def zeros(self, aval) -> Var:
        return self.bind(ir.zeros_p, [], {"aval": aval})[0]

    def add(self, a, b):
        if a is None:
            return b
        if b is None:
            return a
        return self.bind(ir.add_any_p, [a, b], {})[0]

    def call(self, spec, inputs, n, info=NO_INFO) -> list[Var]:
        return self.bind(ir.call_p, list(inputs), {"kernel": spec.kernel, "spec": spec, "n": n, "inplace": ()}, info)


def refuse_untransformable(e, api):
    """The equations no derivative passes through, with what to do instead."""
    rule = _untransformable.get(e.prim)
    if rule is not None:
        rule(e, api)


_untransformable = RuleTable("derivative refusal")     # prim -> fn(e, api): raises where e has no derivative


@_untransformable.register(ir.opaque_p)
def _host_node(e, api):
    raise TransformError(f"{api}: the host node {e.info.name or _name(e.params['fn'])!r} ({e.info.where}) is a "
                         "Python function "
                         "the transform cannot see into; move its work into a kernel, or keep it out of the "
                         "function you differentiate")


def _name(fn):
    return getattr(fn, "__name__", type(fn).__name__)


def copy_program(prog: Program, extra_inputs=()) -> Program:
    """A functional copy of `prog` with fresh Vars (and unused inputs of types `extra_inputs` after its own)."""
    inputs = [Var(v.aval, v.hint) for v in prog.inputs]
    env = dict(zip(prog.inputs, inputs))
    eqns = Eqns()
    for e in prog.eqns:
        copy_eqn(e, env, eqns)
    outs = [a if isinstance(a, Literal) else env[a] for a in prog.outputs]
    return Program(inputs + [Var(a) for a in extra_inputs], eqns, outs)


def inline(prog: Program, args, eqns: Eqns) -> list:
    """Append a functional copy of `prog` reading `args`; returns its output atoms."""
    env = dict(zip(prog.inputs, args))
    for e in prog.eqns:
        copy_eqn(e, env, eqns)
    return [a if isinstance(a, Literal) else env[a] for a in prog.outputs]


def copy_eqn(e, env, eqns: Eqns):
    """Append `e` reading env's atoms, without in-place writes; binds its outputs in env."""
    inputs = [a if isinstance(a, Literal) else env[a] for a in e.inputs]
    params = dict(e.params)
    if "inplace" in params:
        params["inplace"] = ()
    rule = copy_rules.get(e.prim)
    if rule is not None:
        inputs = rule(e, inputs, params)
    outs = eqns.bind(e.prim, inputs, params, e.info)
    env.update(zip(e.outputs, outs))
    return outs


# prim -> fn(e, inputs, params) -> inputs: what a functional copy changes beyond dropping `inplace`
# (params edited in place); a primitive with none is copied as it is
copy_rules = RuleTable("functional copy")


@copy_rules.register(ir.call_p)
def _copy_call(e, inputs, params):
    return inputs[:len(e.params["kernel"].param_names)]     # buffer= targets: outputs get their own


@copy_rules.register(ir.cond_p)
@copy_rules.register(ir.switch_p)
def _copy_branches(e, inputs, params):
    params["branches"] = tuple(copy_program(b) for b in e.params["branches"])
    return inputs


@copy_rules.register(ir.while_p)
def _copy_while(e, inputs, params):
    params["body"] = copy_program(e.params["body"])
    params["cond"] = copy_program(e.params["cond"]) if e.params["cond"] is not None else None
    return inputs


@copy_rules.register(ir.stack_push_p)
def _copy_push(e, inputs, params):
    params["inplace"] = ((0, 0),)
    return inputs


def written_inputs(prog: Program) -> set:
    """Indices of the inputs `prog` writes in place (a Mutable, buffer=): the caller's arrays change."""
    root = {v: k for k, v in enumerate(prog.inputs)}
    out = set()
    for e in prog.eqns:
        for j, i in e.params.get("inplace", ()) or ():
            a = e.inputs[i]
            if isinstance(a, Var) and a in root:
                root[e.outputs[j]] = root[a]
                out.add(root[a])
    return out


def dce(prog: Program) -> Program:
    """Drop equations no output reads, and loop carries nothing reads (a stack of saved turns
    the backward never reads back). Derived programs hold no effects: opaque nodes are refused."""
    live = {a for a in prog.outputs if isinstance(a, Var)}
    keep, changed = [], False
    for e in reversed(prog.eqns):
        if any(v in live for v in e.outputs):
            prune = _prune_rules.get(e.prim)
            if prune is not None and not e.params["inplace"]:
                pruned = prune(e, live)
                changed |= pruned is not e
                e = pruned
            keep.append(e)
            live.update(a for a in e.inputs if isinstance(a, Var))
    return prog if len(keep) == len(prog.eqns) and not changed else prog.replace(eqns=keep[::-1])


def _reads(prog: Program, outputs) -> set:
    kept = dce(prog.replace(outputs=outputs))
    return {a for q in kept.eqns for a in q.inputs if isinstance(a, Var)} | {a for a in outputs if isinstance(a, Var)}


_prune_rules = RuleTable("pruning")    # prim -> fn(e, live) -> e without what nothing live reads


@_prune_rules.register(ir.while_p)
def _prune_carries(e, live):
    """The loop without the carries no live output or later turn needs, and without unread consts."""
    body, cond = e.params["body"], e.params["cond"]
    w = ir.WhileOperands(e)
    nc = w.n_consts
    n = len(e.outputs)
    _, body_consts, carry_in = w.body_parts(body.inputs)
    kept = [v in live for v in e.outputs]
    guard = _reads(cond, cond.outputs) if cond is not None else set()
    guard_consts, guard_carries = w.guard_parts(cond.inputs) if cond is not None else ((), ())
    while True:
        read = _reads(body, [o for o, k in zip(body.outputs, kept) if k])
        more = [k or carry_in[j] in read or guard_carries and guard_carries[j] in guard for j, k in enumerate(kept)]
        if more == kept:
            break
        kept = more
    js = [j for j in range(n) if kept[j]]
    read = _reads(body, [body.outputs[j] for j in js]) | guard
    cs = [i for i in range(nc) if body_consts[i] in read or (cond is not None and guard_consts[i] in guard)]
    if len(js) == n and len(cs) == nc:
        return e
    pruned = _loop_keeping(e, cs, js)
    inst = e.params.get("instance")           # vmap's one-instance loop (a masked one): pruned alike
    if inst is not None:
        pruned.params["instance"] = inst.keeping(cs, js, _loop_keeping, _reads)
    return pruned


def _loop_keeping(e, cs, js):
    """Loop `e` with only its consts `cs` and carries `js` (indices), its body pruned to them."""
    body, cond = e.params["body"], e.params["cond"]
    w = ir.WhileOperands(e)
    _, body_consts, carry_in = w.body_parts(body.inputs)
    new_body = dce(Program([body.inputs[0]] + [body_consts[i] for i in cs] + [carry_in[j] for j in js],
                           body.eqns, [body.outputs[j] for j in js]))
    new_cond = None
    if cond is not None:
        guard_consts, guard_carries = w.guard_parts(cond.inputs)
        new_cond = cond.replace(inputs=[guard_consts[i] for i in cs] + [guard_carries[j] for j in js])
    inputs = list(e.inputs[:w.head]) + [w.consts[i] for i in cs] + [w.carries[j] for j in js]
    return e.replace(inputs=inputs, outputs=[e.outputs[j] for j in js],
                     params=dict(e.params, body=new_body, cond=new_cond, n_consts=len(cs)))
