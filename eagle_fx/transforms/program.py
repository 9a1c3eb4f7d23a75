"""Writing Programs from transforms: equations with their output types inferred, functional copies.

A transform that makes a new Program (jvp_graph, vjp_graph) appends equations to an `Eqns` list:
`bind` runs abstract evaluation to make the output Vars. Derived programs are functional: every
value has its own buffer (no `inplace`), because a reverse pass reads forward values that an
in-place write would destroy; `copy_eqn` rewrites a staged equation that way, with fresh Vars.
"""
from __future__ import annotations

from hawk_fx.core import NO_INFO, Eqn, Literal, Program, Var, abstract_eval

from .. import ir


class TransformError(ValueError):
    pass


def is_float(aval) -> bool:
    return aval.dtype.kind in "fc"


def ct_aval(aval):
    """The type of a tangent or cotangent of a value of type `aval`."""
    import numpy as np
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
    if e.prim is ir.opaque_p:
        raise TransformError(f"{api}: the host node {e.info.name or _name(e.params['fn'])!r} ({e.info.where}) is a "
                             "Python function "
                             "the transform cannot see into; move its work into a kernel, or keep it out of the "
                             "function you differentiate")
    if e.prim is ir.record_p:
        raise TransformError(f"{api}: a record=True graph cannot be transformed; transform the plain builder")
    if e.prim is ir.call_p and e.params.get("batch"):
        raise TransformError(f"{api}: the program is batched (made by vmap); differentiate first, then batch: "
                             "eagle_fx.vmap(eagle_fx.grad(f))")


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
    if e.prim is ir.call_p:
        inputs = inputs[:len(e.params["kernel"].param_names)]     # buffer= targets: outputs get their own
    elif e.prim in (ir.cond_p, ir.switch_p):
        params["branches"] = tuple(copy_program(b) for b in e.params["branches"])
    elif e.prim is ir.while_p:
        params["body"] = copy_program(e.params["body"])
        params["cond"] = copy_program(e.params["cond"]) if e.params["cond"] is not None else None
    elif e.prim is ir.stack_push_p:
        params["inplace"] = ((0, 0),)
    outs = eqns.bind(e.prim, inputs, params, e.info)
    env.update(zip(e.outputs, outs))
    return outs


def dce(prog: Program) -> Program:
    """Drop equations no output reads (derived programs hold no effects: opaque nodes are refused)."""
    live = {a for a in prog.outputs if isinstance(a, Var)}
    keep = []
    for e in reversed(prog.eqns):
        if any(v in live for v in e.outputs):
            keep.append(e)
            live.update(a for a in e.inputs if isinstance(a, Var))
    return prog if len(keep) == len(prog.eqns) else prog.replace(eqns=keep[::-1])
