"""Kernel fusion for the NumPy backend: consecutive kernel calls that feed each other become one call.

Fused bodies are memoised by their wiring (the kernels and how the pair connects), so building the
same graph again reuses them and their compiled code instead of generating them anew.

`dbl` then `inc` over a million samples costs two passes over memory; fused, the NumPy emitter
runs both bodies chunk by chunk with the intermediate in cache, and at small n one call replaces
two. Only the code the backend generates changes: the Program users print and transform is the
staged one. Fusion keeps every value that something else reads (a later node, a result, a buffer
a user holds) as an output of the fused call and keeps in-place writes in place; a call that
writes in place ends a fusion. Batched calls (vmap) fuse with batched calls of the same batch.
"""
from __future__ import annotations

from hawk_fx import prims
from hawk_fx.caches import LRU
from hawk_fx.core import Eqn, Literal, Program, RuleTable, Var
from hawk_fx.kernel import BodySpec

from .. import ir


def _fusible(e, first: bool) -> bool:
    """A call that can join a fusion: the first of a pair must not write in place (its old value
    would be gone for what follows); a body with a sample reduction runs as one chunk, still fused."""
    return e.prim is ir.call_p and not (first and e.params["inplace"])


def _inline(spec_prog: Program, args, eqns):
    """Append a copy of a kernel body (fresh Vars) reading `args`; returns its output atoms."""
    env = {}
    for v, a in zip(spec_prog.inputs, args):
        env[v] = a
    for q in spec_prog.eqns:
        outs = [Var(v.aval) for v in q.outputs]
        eqns.append(q.replace(inputs=[a if isinstance(a, Literal) else env[a] for a in q.inputs], outputs=outs))
        env.update(zip(q.outputs, outs))
    return [a if isinstance(a, Literal) else env[a] for a in spec_prog.outputs]


_FUSED = LRU("fused kernel pairs", 4096)    # wiring of a pair of calls -> (fused BodySpec, inplace, graph inputs)


def _wiring(e1, e2, needed_later):
    """(key, graph inputs, keep1): what decides the fused body of e1 then e2, independent of the
    graph's Vars, so that building the same graph again reuses the body and its compiled code."""
    s1, s2 = e1.params["spec"], e2.params["spec"]
    graph_inputs: list = []

    def slot(atom):
        if isinstance(atom, Literal):
            return ("lit", type(atom.value), atom.value, atom.aval)
        for k, g in enumerate(graph_inputs):
            if g is atom:
                return k
        graph_inputs.append(atom)
        return len(graph_inputs) - 1
    n1, n2 = len(s1.kernel.param_names), len(s2.kernel.param_names)
    sig1 = tuple(slot(a) for a in e1.inputs[:n1])
    made = {v: j for j, v in enumerate(e1.outputs)}
    sig2 = tuple(("made", made[a]) if isinstance(a, Var) and a in made else slot(a) for a in e2.inputs[:n2])
    extra = tuple((slot(e2.inputs[i]), e2.inputs[i].aval) for _, i in e2.params["inplace"])
    keep1 = tuple(j for j, v in enumerate(e1.outputs) if v in needed_later)
    return (s1, s2, sig1, sig2, extra, keep1, tuple(e2.params["inplace"])), graph_inputs, keep1


def _fuse_pair(e1, e2, needed_later):
    """One call doing e1 then e2. Graph-level inputs become kernel inputs; e1's results that e2 reads
    stay inside; e1's results needed elsewhere stay outputs."""
    key, graph_inputs, keep1 = _wiring(e1, e2, needed_later)
    try:
        hit = _FUSED.get(key)
    except TypeError:                             # an unhashable literal: fuse without the memo
        key, hit = None, None
    if hit is None:
        hit = _fused_body(e1, e2, keep1)
        if key is not None:
            _FUSED[key] = hit
    spec, inplace = hit
    out_vars = [e1.outputs[j] for j in keep1] + list(e2.outputs)
    params = dict(kernel=spec.kernel, spec=spec, n=e2.params["n"], inplace=inplace)
    if e2.params.get("batch"):                    # vmap: batched calls fuse too, each input keeps its flag
        flag = {id(a): f for q in (e1, e2) for a, f in zip(q.inputs, q.params["in_batched"])}
        params.update(batch=e2.params["batch"], in_batched=tuple(flag[id(a)] for a in graph_inputs))
    return Eqn(ir.call_p, graph_inputs, out_vars, params, e2.info)


def _fused_body(e1, e2, keep1):
    """The BodySpec of e1 then e2 (its inputs in the order _wiring lists the graph inputs) and
    the in-place pairs of the fused call."""
    s1, s2 = e1.params["spec"], e2.params["spec"]
    graph_inputs, kernel_inputs = [], []

    def kin(atom, aval):
        if isinstance(atom, Literal):
            return atom
        for g, k in zip(graph_inputs, kernel_inputs):
            if g is atom:
                return k
        k = Var(aval)
        graph_inputs.append(atom)
        kernel_inputs.append(k)
        return k

    body: list = []
    n1 = len(s1.kernel.param_names)
    outs1 = _inline(s1.prog, [kin(a, v.aval) for a, v in zip(e1.inputs[:n1], s1.prog.inputs)], body)
    made = dict(zip(e1.outputs, outs1))           # e1's graph outputs -> their values in the body
    n2 = len(s2.kernel.param_names)
    args2 = [made[a] if isinstance(a, Var) and a in made else kin(a, v.aval)
             for a, v in zip(e2.inputs[:n2], s2.prog.inputs)]
    outs2 = _inline(s2.prog, args2, body)
    out_atoms = [outs1[j] for j in keep1] + outs2
    prog = Program(kernel_inputs, body, [_as_var(a, body) for a in out_atoms])
    names = [s1.kernel.name, s2.kernel.name]
    # e2's in-place writes (Mutable commits, buffer= arrays) stay in place: its output j overwrites
    # graph input i; a buffer= array is an input the body does not read
    for _, i in e2.params["inplace"]:
        kin(e2.inputs[i], e2.inputs[i].aval if i >= n2 else s2.prog.inputs[i].aval)
    prog = prog.replace(inputs=kernel_inputs)

    def position(atom):
        return next(k for k, g in enumerate(graph_inputs) if g is atom)
    inplace = tuple((len(keep1) + j, position(e2.inputs[i])) for j, i in e2.params["inplace"])
    commits = [position(e2.inputs[k]) for k in s2.commits]
    return BodySpec(prog, "+".join(names), commits), inplace


def _as_var(a, body):
    """Kernel outputs must be values the body makes: a literal output becomes a broadcast."""
    if isinstance(a, Var):
        return a
    v = Var(a.aval)
    body.append(Eqn(prims.broadcast_p, [a], [v], {"shape": a.aval.shape, "kind": a.aval.kind}))
    return v


def fuse(prog: Program, keep: set, barriers=frozenset()) -> Program:
    """`prog` with chains of fusible calls merged; sub-programs fused too. A call that makes one of
    `barriers` ends a chain (a gradient taken with respect to it must see every use of it)."""
    reads_after: list[set] = [set() for _ in prog.eqns]
    later: set = set(a for a in prog.outputs if isinstance(a, Var)) | set(keep)
    for i in range(len(prog.eqns) - 1, -1, -1):
        reads_after[i] = set(later)
        later |= {a for a in prog.eqns[i].inputs if isinstance(a, Var)}
    out: list[Eqn] = []
    for i, e in enumerate(prog.eqns):
        e = _fuse_inside(e, keep, barriers)
        prev = out[-1] if out else None
        if (prev is not None and _fusible(prev, True) and _fusible(e, False) and prev.params["n"] == e.params["n"]
                and prev.params.get("batch", ()) == e.params.get("batch", ())
                and not any(v in barriers for v in prev.outputs)
                and any(a in prev.outputs for a in e.inputs if isinstance(a, Var))
                and not any(e.inputs[i] in prev.outputs for _, i in e.params["inplace"])
                and not any(e.inputs[k] in prev.outputs for k in e.params["spec"].commits)
                and not any(a in e.outputs for a in prev.inputs if isinstance(a, Var))):
            out[-1] = _fuse_pair(prev, e, reads_after[i])
        else:
            out.append(e)
    return prog.replace(eqns=out)


def _fuse_inside(e, keep, barriers):
    rule = fuse_inside_rules.get(e.prim)
    return e if rule is None else rule(e, keep, barriers)


# prim -> fn(e, keep, barriers) -> e with its sub-programs fused; a primitive with none holds none
fuse_inside_rules = RuleTable("fusion inside")


@fuse_inside_rules.register(ir.cond_p)
@fuse_inside_rules.register(ir.switch_p)
def _fuse_branches(e, keep, barriers):
    branches = tuple(fuse(b, keep, barriers) for b in e.params["branches"])
    return e.replace(params=dict(e.params, branches=branches))


@fuse_inside_rules.register(ir.while_p)
def _fuse_while(e, keep, barriers):
    return e.replace(params=dict(e.params, body=fuse(e.params["body"], keep, barriers)))


@fuse_inside_rules.register(ir.revolve_p)
def _fuse_revolve(e, keep, barriers):
    return e.replace(params=dict(e.params, forward=fuse(e.params["forward"], keep, barriers),
                                 backward=fuse(e.params["backward"], keep, barriers)))
