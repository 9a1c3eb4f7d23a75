"""Kernel fusion for the NumPy backend: consecutive kernel calls that feed each other become one call.

A chain of calls is wired once, as each call joins it, and its body is made in one pass (time
linear in the chain). Fused bodies are memoised by that wiring (the kernels and how the calls of a
chain connect), so building the same graph again reuses them and their compiled code instead of
generating them anew.

`dbl` then `inc` over a million samples costs two passes over memory; fused, the NumPy emitter
runs both bodies chunk by chunk with the intermediate in cache, and at small n one call replaces
two. Only the code the backend generates changes: the Program users print and transform is the
staged one. Fusion keeps every value that something else reads (a later node, a result, a buffer
a user holds) as an output of the fused call and keeps in-place writes in place; a call that
writes in place ends a fusion. Batched calls (vmap) fuse with batched calls of the same batch.
"""
from __future__ import annotations

from hawk_fx import prims
from hawk_fx.caches import LRU, WeakMemo
from hawk_fx.core import Eqn, Literal, Program, RuleTable, Var
from hawk_fx.kernel import BodySpec

from .. import ir


def _fusible(e, first: bool) -> bool:
    """A call that can join a fusion: the first of a pair must not write in place (its old value
    would be gone for what follows); a body with a sample reduction runs as one chunk, still fused."""
    return e.prim is ir.call_p and not (first and e.params["inplace"])


def _inline(spec_prog: Program, args, eqns):
    """Append a copy of a kernel body (fresh Vars) reading `args`; returns its output atoms."""
    env = dict(zip(spec_prog.inputs, args))
    for q in spec_prog.eqns:
        outs = [Var(v.aval) for v in q.outputs]
        eqns.append(Eqn(q.prim, [a if isinstance(a, Literal) else env[a] for a in q.inputs], outs, q.params, q.info))
        env.update(zip(q.outputs, outs))
    return [a if isinstance(a, Literal) else env[a] for a in spec_prog.outputs]


_FUSED = LRU("fused kernel chains", 4096)    # wiring of a chain of calls -> (fused BodySpec, inplace)


class _Chain:
    """Consecutive calls growing into one fused call. Each call is wired once as it joins (its
    inputs: a graph input by position, a literal, or an earlier call's output), so a chain of k
    calls costs O(size of its bodies), and the wiring is the memo key of the fused body."""

    def __init__(self, i, e):
        self.calls = [e]
        self.last = i                             # index in the program of the newest call
        self.made: dict = {}                      # an output of a call in the chain -> (call, output)
        self.inputs: list = []                    # graph inputs, in order of first use
        self.position: dict = {}                  # id of a graph input -> its place in `inputs`
        self.read: set = set()                    # every Var a call of the chain reads
        self.sigs: list = []                      # per call: how each of its inputs is wired
        self._wire(e)

    def _slot(self, atom):
        if isinstance(atom, Literal):
            return ("lit", type(atom.value), atom.value, atom.aval)
        k = self.position.get(id(atom))
        if k is None:
            k = self.position[id(atom)] = len(self.inputs)
            self.inputs.append(atom)
        return k

    def _wire(self, e):
        m = len(self.calls) - 1
        n = len(e.params["spec"].kernel.param_names)
        self.sigs.append(tuple(("made",) + self.made[a] if isinstance(a, Var) and a in self.made else self._slot(a)
                               for a in e.inputs[:n]))
        self.read.update(a for a in e.inputs if isinstance(a, Var))
        self.made.update((v, (m, j)) for j, v in enumerate(e.outputs))

    def admits(self, e, barriers) -> bool:
        """Does `e` join the chain? It reads a value the chain makes, over the same samples (and
        batch); the chain's last call writes nothing in place and makes no barrier; `e` does not
        write in place a value the chain makes, nor make a value the chain reads."""
        prev = self.calls[-1]
        made = self.made
        return (_fusible(prev, True) and _fusible(e, False) and prev.params["n"] == e.params["n"]
                and prev.params.get("batch", ()) == e.params.get("batch", ())
                and not any(v in barriers for v in prev.outputs)
                and any(a in made for a in e.inputs if isinstance(a, Var))
                and not any(e.inputs[i] in made for _, i in e.params["inplace"])
                and not any(e.inputs[k] in made for k in e.params["spec"].commits)
                and not any(v in self.read for v in e.outputs))

    def add(self, i, e):
        self.calls.append(e)
        self.last = i
        self._wire(e)

    def eqn(self, last_read) -> Eqn:
        """The chain as one call. An output of an earlier call stays an output where something after
        the chain reads it; the last call keeps all of its outputs and its in-place writes."""
        calls = self.calls
        if len(calls) == 1:
            return calls[0]
        last = calls[-1]
        kept = tuple((m, j) for m, q in enumerate(calls[:-1]) for j, v in enumerate(q.outputs)
                     if last_read.get(v, -1) > self.last)
        # a buffer= array the last call writes in place is an input the body does not read
        extra = tuple((self._slot(last.inputs[i]), last.inputs[i].aval) for _, i in last.params["inplace"])
        key = (tuple(q.params["spec"] for q in calls), tuple(self.sigs), extra, kept, tuple(last.params["inplace"]))
        try:
            hit = _FUSED.get(key)
        except TypeError:                         # an unhashable literal: fuse without the memo
            key, hit = None, None
        if hit is None:
            hit = self._body(kept)
            if key is not None:
                _FUSED[key] = hit
        spec, inplace = hit
        out_vars = [calls[m].outputs[j] for m, j in kept] + list(last.outputs)
        params = dict(kernel=spec.kernel, spec=spec, n=last.params["n"], inplace=inplace)
        if last.params.get("batch"):              # vmap: batched calls fuse too, each input keeps its flag
            flag = {id(a): f for q in calls for a, f in zip(q.inputs, q.params["in_batched"])}
            params.update(batch=last.params["batch"], in_batched=tuple(flag[id(a)] for a in self.inputs))
        return Eqn(ir.call_p, self.inputs, out_vars, params, last.info)

    def _body(self, kept):
        """The BodySpec of the chain (its inputs in the order of `inputs`) and the in-place pairs of
        the fused call."""
        kernel_inputs: list = [None] * len(self.inputs)
        body: list = []
        outs: list = []
        for q, sig in zip(self.calls, self.sigs):
            spec = q.params["spec"]
            args = []
            for s, a, v in zip(sig, q.inputs, spec.prog.inputs):
                if isinstance(s, int):
                    if kernel_inputs[s] is None:
                        kernel_inputs[s] = Var(v.aval)
                    args.append(kernel_inputs[s])
                elif s[0] == "made":
                    args.append(outs[s[1]][s[2]])
                else:
                    args.append(a)
            outs.append(_inline(spec.prog, args, body))
        last = self.calls[-1]
        n_last = len(last.params["spec"].kernel.param_names)
        for _, i in last.params["inplace"]:
            k = self.position[id(last.inputs[i])]
            if kernel_inputs[k] is None:
                kernel_inputs[k] = Var(last.inputs[i].aval if i >= n_last else last.params["spec"].prog.inputs[i].aval)
        out_atoms = [outs[m][j] for m, j in kept] + outs[-1]
        prog = Program(kernel_inputs, body, [_as_var(a, body) for a in out_atoms])
        inplace = tuple((len(kept) + j, self.position[id(last.inputs[i])]) for j, i in last.params["inplace"])
        commits = [self.position[id(last.inputs[k])] for k in last.params["spec"].commits]
        name = "+".join(q.params["spec"].kernel.name for q in self.calls)
        return BodySpec(prog, name, commits), inplace


def _as_var(a, body):
    """Kernel outputs must be values the body makes: a literal output becomes a broadcast."""
    if isinstance(a, Var):
        return a
    v = Var(a.aval)
    body.append(Eqn(prims.broadcast_p, [a], [v], {"shape": a.aval.shape, "kind": a.aval.kind}))
    return v


def _last_reads(prog: Program, keep) -> dict:
    """Var -> the index of the last equation that reads it; past the end for results and `keep`."""
    last: dict = {}
    for i, e in enumerate(prog.eqns):
        for a in e.inputs:
            if isinstance(a, Var):
                last[a] = i
    end = len(prog.eqns)
    for a in prog.outputs:
        if isinstance(a, Var):
            last[a] = end
    for a in keep:
        last[a] = end
    return last


def fuse(prog: Program, keep: set, barriers=frozenset()) -> Program:
    """`prog` with chains of fusible calls merged; sub-programs fused too. A call that makes one of
    `barriers` ends a chain (a gradient taken with respect to it must see every use of it)."""
    last_read = _last_reads(prog, keep)
    out: list[Eqn] = []
    chain = None
    for i, e in enumerate(prog.eqns):
        e = _fuse_inside(e, keep, barriers)
        if chain is not None and chain.admits(e, barriers):
            chain.add(i, e)
            continue
        if chain is not None:
            out.append(chain.eqn(last_read))
            chain = None
        if e.prim is ir.call_p:
            chain = _Chain(i, e)
        else:
            out.append(e)
    if chain is not None:
        out.append(chain.eqn(last_read))
    return prog.replace(eqns=out)


_BY_PROGRAM = WeakMemo()       # Program -> {frozenset(keep): its fused plan}


def fused(prog: Program, keep) -> Program:
    """fuse(prog, keep), made once per Program and set of kept values: a builder called again reuses
    its Program, and the graphs lowered from it share this read-only plan (each its own buffers)."""
    key = frozenset(keep)
    plans = _BY_PROGRAM.get(prog)
    hit = None if plans is None else plans.get(key)
    if hit is None:
        hit = fuse(prog, set(key))
        _BY_PROGRAM.setdefault(prog, {})[key] = hit     # two threads racing both make the same plan
    return hit


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
