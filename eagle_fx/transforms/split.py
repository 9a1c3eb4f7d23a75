"""Splitting a vjp Program at its residual boundary (partial evaluation of the linearized program).

vjp_graph makes one Program over (primals..., cotangents...) -> (outputs..., input cotangents...).
Its top-level equations that read no cotangent are the forward half; the rest are the backward
half. The forward's values the backward reads are the residuals: the forward returns them beside
its outputs, the backward takes them beside the cotangents. Equations that read nothing (zeros)
are made again in the backward instead of being saved.
"""
from __future__ import annotations

from hawk_fx.core import Eqn, Program, RuleTable, Var

from .. import ir
from .program import Eqns, dce


def split(prog: Program, n_primals: int, n_outputs: int):
    """(forward, backward, residuals): forward: primals -> (outputs..., residuals...);
    backward: (residuals..., cotangents...) -> input cotangents. `residuals` are forward Vars."""
    known = set(prog.inputs[:n_primals])
    fwd, bwd, free = [], [], []
    for e in prog.eqns:
        ins = [a for a in e.inputs if isinstance(a, Var)]
        if not ins:
            free.append(e)                       # made in whichever half reads it
            known.update(e.outputs)
        elif all(a in known for a in ins):
            fwd.append(e)
            known.update(e.outputs)
        else:
            bwd.append(e)
    bwd = _unread_as_zeros(bwd, known)
    made_in_bwd = {v for e in bwd for v in e.outputs} | set(prog.inputs[n_primals:])
    grads = prog.outputs[n_outputs:]
    read = {a for e in bwd for a in e.inputs if isinstance(a, Var)} | {a for a in grads if isinstance(a, Var)}
    free_out = {v: e for e in free for v in e.outputs}
    residuals, copies = [], []
    for a in _ordered(bwd, grads):
        if a in made_in_bwd or a not in read:
            continue
        if a in free_out:
            if free_out[a] not in copies:
                copies.append(free_out[a])
        elif a not in residuals:
            residuals.append(a)
    forward = dce(Program(list(prog.inputs[:n_primals]), free + fwd, list(prog.outputs[:n_outputs]) + residuals))
    backward = dce(Program(residuals + list(prog.inputs[n_primals:]), copies + bwd, list(grads)))
    return forward, backward, residuals


def _unread_as_zeros(bwd, known):
    """The backward's calls reading zeros, not a forward value, where the kernel body reads not
    that parameter (the vjp of a linear kernel reads none of its inputs): no residual is kept for
    it. One zeros value per type, made in the backward."""
    zeros: dict = {}
    out = []
    for e in bwd:
        rule = unread_rules.get(e.prim)
        if rule is not None:
            e = rule(e, known, zeros, out)
        out.append(e)
    return out


# prim -> fn(e, known, zeros, out) -> e reading zeros (made at the front of `out`, one per type in
# `zeros`) instead of the forward values (`known`) it does not read; a primitive with none reads all
unread_rules = RuleTable("unread residuals")


@unread_rules.register(ir.call_p)
def _call_unread(e, known, zeros, out):
    body = e.params["spec"].prog
    read = {a for q in body.eqns for a in q.inputs if isinstance(a, Var)} | \
        {a for a in body.outputs if isinstance(a, Var)}
    ins = list(e.inputs)
    for k, v in enumerate(body.inputs[:len(ins)]):
        a = ins[k]
        if v not in read and isinstance(a, Var) and a in known:
            if a.aval not in zeros:
                z = Var(a.aval)
                zeros[a.aval] = z
                out.insert(0, Eqn(ir.zeros_p, [], [z], {"aval": a.aval}))
            ins[k] = zeros[a.aval]
    if ins != list(e.inputs):
        e = e.replace(inputs=ins)
    return e


def _ordered(eqns, outputs):
    for e in eqns:
        yield from (a for a in e.inputs if isinstance(a, Var))
    yield from (a for a in outputs if isinstance(a, Var))


def without_zero_inputs(prog: Program, zero) -> Program:
    """`prog` with the inputs `zero` known to be zeros (cotangents no seed reaches): sums with
    them are dropped; any other reader gets a zeros value. The inputs stay, unread."""
    zero = set(zero)
    alias: dict = {}
    eqns = Eqns()
    made: dict = {}

    def atom(a):
        a = alias.get(a, a) if isinstance(a, Var) else a
        if isinstance(a, Var) and a in zero:
            if a not in made:
                made[a] = eqns.zeros(a.aval)
            return made[a]
        return a
    for e in prog.eqns:
        rule = zero_rules.get(e.prim)
        if rule is not None and rule(e, zero, alias):
            continue
        eqns.append(e.replace(inputs=[atom(a) for a in e.inputs]))
    return dce(prog.replace(eqns=list(eqns), outputs=[atom(a) for a in prog.outputs]))


# prim -> fn(e, zero, alias) -> True where e goes, its output known zero (added to `zero`) or another
# value (in `alias`); a primitive with none is kept, reading zeros for the zero inputs
zero_rules = RuleTable("zero inputs")


@zero_rules.register(ir.add_any_p)
def _add_zero(e, zero, alias):
    x, y = (alias.get(a, a) for a in e.inputs)
    if x in zero or y in zero:
        other = y if x in zero else x
        if other in zero:
            zero.add(e.outputs[0])
        else:
            alias[e.outputs[0]] = other
        return True
    return False
