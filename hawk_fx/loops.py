"""Loops in a kernel body that stop per sample: `for _ in range(K): ... if done: break`.

The kernel pass rewrites a `for` whose body holds a `break` or `continue` into a call of
`for_stmt` with the body as a function of the names it assigns: `break` and `continue` set flags,
and the statements after one run under a guard (`if running(brk, cnt):`), an `if` like any other,
so a per-sample flag selects per sample. `for_stmt` runs turns as Python does while the flags are
Python bools (a static `for` unrolls as before). At the first turn whose break flag is per sample,
the remaining turns of a `range` become one `loop` equation: its body is the loop body traced
once, as a Program of (turn, carries..., captured values...) -> (new carries..., break flag).
Every backend runs it as a loop that ends when no sample is active, the state of a finished
sample frozen: NumPy runs the body on the active samples only (compacted as samples finish), JAX
as `lax.while_loop`, CUDA C as a loop with a real `break` in each thread.

Forward derivatives run the same loop with tangents carried; reverse derivatives run a loop
backwards from each sample's last turn, recomputing the states (hawk_fx/loop_diff.py), so the
gradient is exactly that of the iteration the samples ran.

A loop over something other than a `range`, or a body that cannot be traced once for all turns
(one that needs the loop variable as a Python int, `v[i]`), runs unrolled and masked: the same
values, every turn computed for every sample.
"""
from __future__ import annotations

import ast
import itertools
import math
import warnings

import numpy as np

from . import prims
from .core import SAMPLE, UNIFORM, AVal, Literal, Program, Tracer, Var, abstract_eval, eager_impl, eval_program
from .emit.numpy import NumpyKernel, numpy_emit, several_results
from .source import assigned_names, user_line
from .trace import UNDEF, KernelTrace, TraceError, _pin_to_line, as_aval, current_kernel_trace, where_with_text

P = prims.P

loop_p = prims._prim("loop", multiple_results=True)

# ---------------------------------------------------------------------------------------------
# the AST pass: a `for` holding break/continue becomes a call of for_stmt

_counter = itertools.count()
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)


def _jumps(stmts) -> list:
    """The break/continue statements of this loop level (not those of nested loops or functions)."""
    found = []

    def go(node):
        if isinstance(node, (ast.Break, ast.Continue)):
            found.append(node)
        elif not isinstance(node, _SCOPES + (ast.For, ast.While, ast.AsyncFor)):
            for c in ast.iter_child_nodes(node):
                go(c)
    for s in stmts:
        go(s)
    return found


def _name(id_, store=False):
    return ast.Name(id=id_, ctx=ast.Store() if store else ast.Load())


def _rt(attr):
    return ast.Attribute(value=_name("__hawk_loops__"), attr=attr, ctx=ast.Load())


class _Rewrite:
    def __init__(self, info, api, brk, cnt):
        self.info, self.api, self.brk, self.cnt = info, api, brk, cnt

    def block(self, stmts):
        out = []
        for i, s in enumerate(stmts):
            jumps = _jumps([s])
            out.extend(self.stmt(s))
            if jumps and i + 1 < len(stmts):
                guard = ast.If(test=ast.Call(func=_rt("running"), args=[_name(self.brk), _name(self.cnt)], keywords=[]),
                               body=self.block(stmts[i + 1:]), orelse=[])
                guard._hawk_guard = True
                ast.copy_location(guard, stmts[i + 1])
                ast.fix_missing_locations(guard)
                out.append(guard)
                break
        return out

    def stmt(self, s):
        if isinstance(s, (ast.Break, ast.Continue)):
            flag = self.brk if isinstance(s, ast.Break) else self.cnt
            a = ast.Assign(targets=[_name(flag, True)], value=ast.Constant(value=True))
            return [ast.fix_missing_locations(ast.copy_location(a, s))]
        if not _jumps([s]):
            return [s]
        if isinstance(s, ast.If):
            s.body = self.block(s.body) or [ast.copy_location(ast.Pass(), s)]
            s.orelse = self.block(s.orelse)
            return [s]
        if isinstance(s, (ast.With, ast.AsyncWith)):
            s.body = self.block(s.body)
            return [s]
        line = _jumps([s])[0].lineno
        raise TraceError(f"{self.api} {where_with_text(self.info, line)}: a break/continue inside a "
                         f"`{type(s).__name__.lower()}` statement of a kernel loop; put it in an `if` of the loop body")


class LoopToCall(ast.NodeTransformer):
    """Rewrites each `for` whose body breaks or continues (inner loops first) into a body function
    and a call of for_stmt; refuses a break/continue outside any loop (source that does not compile
    as written: a file changed since the function was defined)."""

    def __init__(self, info, api):
        self.info, self.api = info, api
        self.depth = 0

    def visit_Break(self, node):
        if self.depth == 0:
            what = "break" if isinstance(node, ast.Break) else "continue"
            raise TraceError(f"{self.api} {where_with_text(self.info, node.lineno)}: `{what}` outside a loop; a "
                             f"`{what}` belongs in a `for _ in range(K)` loop (K a Python int cap)")
        return node

    visit_Continue = visit_Break

    def _scoped(self, node):
        depth, self.depth = self.depth, 0
        self.generic_visit(node)
        self.depth = depth
        return node

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _scoped

    def visit_While(self, node):
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1
        return node

    def visit_For(self, node):
        node.iter = self._capped(node.iter)
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1
        if node.orelse or not isinstance(node.target, ast.Name) or not _jumps(node.body):
            return node
        k = next(_counter)
        brk, cnt = f"__hawk_brk_{k}", f"__hawk_cnt_{k}"
        target = node.target.id
        names = [target] + [n for n in assigned_names(node.body) if n != target]
        body = _Rewrite(self.info, self.api, brk, cnt).block(node.body)
        init = [ast.Assign(targets=[_name(f, True)], value=ast.Constant(value=False)) for f in (brk, cnt)]
        ret = ast.Return(value=ast.Tuple(elts=[_name(n) for n in names] + [_name(brk)], ctx=ast.Load()))
        fname = f"__hawk_loop_body_{k}"
        args = ast.arguments(posonlyargs=[], args=[ast.arg(arg=n) for n in names], vararg=None,
                             kwonlyargs=[], kw_defaults=[], kwarg=None, defaults=[])
        fdef = ast.FunctionDef(name=fname, args=args, body=init + body + [ret], decorator_list=[], returns=None,
                               type_params=[])
        call = ast.Call(func=_rt("for_stmt"), args=[
            node.iter, _name(fname),
            ast.Call(func=ast.Attribute(value=_name("__hawk_rt__"), attr="load", ctx=ast.Load()),
                     args=[ast.Call(func=_name("locals"), args=[], keywords=[]), ast.Constant(value=tuple(names))],
                     keywords=[]),
            ast.Constant(value=tuple(names))], keywords=[])
        assign = ast.Assign(targets=[ast.Tuple(elts=[_name(n, True) for n in names], ctx=ast.Store())], value=call)
        for s in (fdef, assign) + tuple(init) + (ret,):
            ast.copy_location(s, node)
        for s in (fdef, assign):
            ast.fix_missing_locations(s)
        _pin_to_line(assign, node, keep=node.iter)      # for_stmt runs at the `for` line
        return [fdef, assign]

    def _capped(self, it):
        """range(...) in a loop header checks its bounds are Python ints (a cap), naming the line."""
        if isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and it.func.id == "range" and not it.keywords:
            it.args = [ast.copy_location(ast.Call(func=_rt("cap"), args=[a], keywords=[]), a) for a in it.args]
            ast.fix_missing_locations(it)
        return it


# ---------------------------------------------------------------------------------------------
# runtime called by rewritten kernel code

def cap(bound):
    """A range bound of a kernel loop: a Python int, or a refusal naming the line."""
    if isinstance(bound, Tracer):
        trace = current_kernel_trace()
        what = ("a `for` over range() of a traced value has no cap: a kernel loop runs a Python int number of "
                f"turns at most (the bound is {bound.aval})")
        fix = ("write `for _ in range(K):` with K a Python int (a cap) and end a sample early with "
               "`if done: break`")
        if isinstance(trace, KernelTrace):
            trace.fail(what, fix)
        raise TraceError(f"hawk: {what}; {fix}")
    return bound


def running(brk, cnt):
    """Neither flag set: the guard of the statements after a break/continue."""
    if not isinstance(brk, Tracer) and not isinstance(cnt, Tracer):
        return not (brk or cnt)
    return P["not"].bind(P["or"].bind(brk, cnt))


def guard_stmt(test, true_fn, false_fn, state, names):
    """The guard's `if`: as a per-sample if, except that a name first assigned after a break keeps
    the value it has where it is assigned (a sample that left the loop never reads it)."""
    if not isinstance(test, Tracer):
        return true_fn(*state) if test else false_fn(*state)
    t_out, f_out = true_fn(*state), false_fn(*state)
    merged = []
    for a, b in zip(t_out, f_out):
        if a is b or b is UNDEF or callable(a):
            merged.append(a)
        elif a is UNDEF:
            merged.append(b)
        else:
            merged.append(P["select"].bind(test, a, b))
    return tuple(merged)


def _not(flag):
    if not isinstance(flag, Tracer):
        return not flag
    if flag.aval.dtype != np.bool_:
        flag = P["ne"].bind(flag, 0)
    return P["not"].bind(flag)


def for_stmt(iterable, body_fn, state, names):
    """Run the loop: turns in Python while the break flag is a Python bool; from the first turn
    whose flag is per sample, the remaining turns as one loop equation (or unrolled and masked)."""
    state = list(state)
    items = iterable if isinstance(iterable, range) else list(iterable)
    for t in range(len(items)):
        state[0] = items[t]
        *state, brk = body_fn(*state)
        if isinstance(brk, Tracer):
            rest = items[t + 1:]
            if len(rest):
                state = _per_sample_rest(rest, body_fn, state, names, _not(brk))
            break
        if brk:
            break
    return tuple(state)


def _is_value(v) -> bool:
    return isinstance(v, (Tracer, bool, int, float, np.number))


def _per_sample_rest(rest, body_fn, state, names, active):
    if isinstance(rest, range):
        marks = _marks()
        try:
            return _bind_loop(rest, body_fn, state, names, active)
        except (TraceError, TypeError, ValueError, IndexError) as e:
            _rewind(marks)  # traced once for all turns it fails (lst[i]): unrolled, it works or says why
            why = f"its body cannot be traced once for all turns ({e})"
            fix = ("change the line it names so the body traces once for all turns (index a Vector with the loop "
                   "variable, not a Python list)")
    else:
        why = f"it runs over a {type(rest).__name__}, not a range"
        fix = "loop over range(K) and index arrays (a Vector) with the loop variable"
    _warn_unrolled(why, fix, len(rest))
    return _unrolled(rest, body_fn, state, active)


class UnrolledLoopWarning(UserWarning):
    """A kernel loop that stops per sample runs its remaining turns unrolled and masked: the same
    values as one loop, but every turn is computed for every sample and the program grows with the cap."""


_warned: dict = {}      # the warnings registry: once per kernel line (reset when the filters change)


def _warn_unrolled(why: str, fix: str, turns: int):
    trace = current_kernel_trace()
    if not isinstance(trace, KernelTrace):
        return
    line = user_line(trace.source.filename) or 0
    where = where_with_text(trace.source, line) if line else trace.kernel_name
    warnings.warn_explicit(UnrolledLoopWarning(
        f"hawk.kernel {where}: the loop's remaining {turns} turns run unrolled and masked because {why}: "
        "every turn is computed for every sample, even those that have left; to run it as one loop that "
        f"stops when no sample is active, {fix}"),
        UnrolledLoopWarning, trace.source.filename, line, registry=_warned)


def _marks():
    """How many equations each enclosing trace holds: a body's ops on enclosing values only are
    recorded there (computed once, outside the loop), and a trial trace of the body must not leave
    its own behind."""
    marks, t = [], current_kernel_trace()
    while t is not None:
        marks.append((t, len(t.eqns)))
        t = t.parent
    return marks


def _rewind(marks):
    for t, k in marks:
        del t.eqns[k:]


def _unrolled(items, body_fn, state, active):
    """The remaining turns in Python, each masked: a sample that left keeps its values."""
    for item in items:
        old = list(state)
        state[0] = item
        *new, brk = body_fn(*state)
        for k, (a, b) in enumerate(zip(new, old)):
            if a is b or b is UNDEF or callable(a):
                state[k] = a
            elif a is not UNDEF:
                state[k] = P["select"].bind(active, a, b)
        active = P["and"].bind(active, _not(brk))
    return state


class LoopBodyTrace(KernelTrace):
    """The trace of a loop body: values of enclosing traces it reads become inputs (captured)."""

    def __init__(self, outer):
        super().__init__(outer.kernel_name, outer.source)
        self.parent = outer
        self.captured: list = []
        self._lifted: dict = {}

    def lift(self, x):
        v = self._lifted.get(x.var)
        if v is None:
            v = self._lifted[x.var] = Var(x.aval, x.var.hint)
            self.inputs.append(v)
            self.captured.append(x)
        return v


def _join(a: AVal, o: AVal) -> AVal:
    shape = np.broadcast_shapes(a.shape, o.shape)
    return AVal(shape, prims.promote([a, o]), SAMPLE, a.weak and o.weak)


def _trace_turn(outer, body_fn, state, names, carry, avals):
    from .context import CONTEXT
    bt = LoopBodyTrace(outer)
    st = list(state)
    turn = bt.new_input(AVal((), np.int64, UNIFORM, weak=True), names[0])
    for k, av in zip(carry, avals):
        st[k] = bt.new_input(av, names[k])
    st[0] = turn
    traces = CONTEXT.kernel_traces
    traces.append(bt)
    try:
        *new, brk = body_fn(*st)
    finally:
        traces.pop()
        bt.active = False
    return bt, new, brk


def _conformed(trace, x, aval: AVal):
    """x as a value of exactly `aval` (dtype, per-sample shape, per sample)."""
    a = as_aval(x)
    if a.dtype != aval.dtype or a.weak:
        x = trace.process(prims.convert_p, [x], {"dtype": aval.dtype})[0]
    if a.shape != aval.shape or a.kind != SAMPLE:
        x = trace.process(prims.broadcast_p, [x], {"shape": aval.shape, "kind": SAMPLE})[0]
    return x


def _bind_loop(rest: range, body_fn, state, names, active):
    outer = current_kernel_trace()
    carry = [k for k, v in enumerate(state) if _is_value(v)]
    avals = [as_aval(state[k]).replace(kind=SAMPLE) for k in carry]
    marks = _marks()
    for _ in range(4):          # the carries' types: what the body makes of them, NumPy's promotion
        _rewind(marks)
        bt, new, brk = _trace_turn(outer, body_fn, state, names, carry, avals)
        for k, v in enumerate(new):
            if k not in carry and not (v is state[k] or callable(v)):
                raise TraceError(f"{names[k]!r} holds {type(v).__name__}, not a number")
        joined = [_join(a, as_aval(new[k])).replace(weak=False) for a, k in zip(avals, carry)]
        if joined == avals:
            break
        avals = joined
    else:
        raise TraceError("the loop's carried types do not settle")
    if any(e.prim in prims.REDUCTION or e.prim is prims.sample_count_p for e in bt.eqns):
        raise TraceError("a reduction over samples in the body")
    bt.active = True
    outs = [_conformed(bt, new[k], av) for k, av in zip(carry, avals)]
    flag = _conformed(bt, brk if isinstance(brk, Tracer) else bool(brk), AVal((), np.bool_, SAMPLE))
    body = bt.finish(outs + [flag])
    params = dict(body=body, start=rest.start, step=rest.step, cap=len(rest), n_carries=len(carry))
    results = outer.process(loop_p, [active] + [state[k] for k in carry] + bt.captured, params)
    state = list(state)
    for k, r in zip(carry, results):
        state[k] = r
    return state


# ---------------------------------------------------------------------------------------------
# the primitive: abstract evaluation, eager NumPy, printing

def loop_parts(e_inputs, params):
    """(active, initial carries, captured values) of a loop equation's operands."""
    nc = params["n_carries"]
    return e_inputs[0], list(e_inputs[1:1 + nc]), list(e_inputs[1 + nc:])


def turn_value(params, t):
    return params["start"] + t * params["step"]


@abstract_eval.register(loop_p)
def _loop_abstract(*avals, body, start, step, cap, n_carries):
    return [v.aval for v in body.inputs[1:1 + n_carries]]


@eager_impl.register(loop_p)
def _loop_eager(active, *ins, body, start, step, cap, n_carries):
    """Masked over whole arrays, until no sample is active."""
    params = dict(start=start, step=step, n_carries=n_carries)
    carries, consts = list(ins[:n_carries]), list(ins[n_carries:])
    avals = [v.aval for v in body.inputs[1:1 + n_carries]]
    carries = [np.asarray(c, a.dtype) for c, a in zip(carries, avals)]
    active = np.asarray(active, bool)
    for t in range(cap):
        if not active.any():
            break
        outs = eval_program(body, [turn_value(params, t)] + carries + consts)
        carries = [np.where(active, np.asarray(n, a.dtype), c) for n, c, a in zip(outs[:n_carries], carries, avals)]
        active = active & ~np.asarray(outs[n_carries], bool)
    return carries


# ---------------------------------------------------------------------------------------------
# NumPy: the body compiled once, run on the active samples only

def retype(prog: Program, in_avals) -> Program:
    """`prog` with new input types (a captured value given per sample), every type recomputed."""
    env: dict = {}
    new_in = [Var(av, v.hint) for v, av in zip(prog.inputs, in_avals)]
    env.update(zip(prog.inputs, new_in))
    eqns = []
    for e in prog.eqns:
        ins = [env.get(a, a) if isinstance(a, Var) else a for a in e.inputs]
        avs = abstract_eval[e.prim](*[a.aval for a in ins], **e.params)
        outs = [Var(av, v.hint) for av, v in zip(avs, e.outputs)]
        env.update(zip(e.outputs, outs))
        eqns.append(e.replace(inputs=ins, outputs=outs))
    return Program(new_in, eqns, [env.get(a, a) if isinstance(a, Var) else a for a in prog.outputs])


class NumpyLoop:
    """A loop equation's NumPy run: carries in flat work arrays (*shape, samples), the body run
    on the samples still active, compacted as samples finish; the state of a finished sample is
    written back when it finishes, and never computed again."""

    def __init__(self, body: Program, start, step, cap, n_carries):
        self.body, self.start, self.step, self.cap, self.nc = body, start, step, cap, n_carries
        self.carry_avals = [v.aval for v in body.inputs[1:1 + n_carries]]
        self.const_avals = [v.aval for v in body.inputs[1 + n_carries:]]
        self.kernels: dict = {}

    def kernel(self, spread):
        """The body compiled with the captured values flagged in `spread` typed per sample."""
        k = self.kernels.get(spread)
        if k is None:
            avals = [v.aval for v in self.body.inputs]
            for j, s in enumerate(spread):
                if s:
                    avals[1 + self.nc + j] = avals[1 + self.nc + j].replace(kind=SAMPLE, weak=False)
            prog = self.body if not any(spread) else retype(self.body, avals)
            k = self.kernels[spread] = NumpyKernel(prog, [True] * (self.nc + 1))
        return k

    def __call__(self, outs, ins):
        nc = self.nc
        active0, inits, consts = ins[0], ins[1:1 + nc], ins[1 + nc:]
        lead = len(self.carry_avals[0].shape) if nc else 0
        tail = outs[0].shape[lead:] if nc else np.shape(active0)
        M = math.prod(tail)
        work = []
        for a, x in zip(self.carry_avals, inits):
            w = np.empty(a.shape + (M,), a.dtype)
            np.copyto(w.reshape(a.shape + tail), x, casting="unsafe")
            work.append(w)
        full = work
        # a captured value per sample (or per instance, under vmap) is spread over the flat samples,
        # and compacted with them; a one-cell one (a Param, a constant) is read as it is
        spread, cs = [], []
        for a, x in zip(self.const_avals, consts):
            s = isinstance(x, np.ndarray) and (len(tail) > 1 or (a.kind == SAMPLE and x.shape[-1] == M))
            if s:
                x = np.broadcast_to(x, a.shape + tail).reshape(a.shape + (M,))
            spread.append(s)
            cs.append(x)
        kern = self.kernel(tuple(s and a.kind != SAMPLE for s, a in zip(spread, self.const_avals)))
        active = np.empty(M, bool)
        np.copyto(active.reshape(tail), active0)
        idx = None
        if not active.all():
            idx = np.flatnonzero(active)
            work = [w[..., idx] for w in work]
            cs = [c[..., idx] if s else c for c, s in zip(cs, spread)]
        m = M if idx is None else len(idx)
        buf = [np.empty_like(w) for w in work]
        brk = np.empty(m, bool)
        for t in range(self.cap):
            if m == 0:
                break
            kern.run_fn([self.start + t * self.step] + work + cs, buf + [brk], m)
            work, buf = buf, work
            if brk.any():
                if idx is None:
                    idx = np.arange(M)
                done = np.flatnonzero(brk)
                for f, w in zip(full, work):
                    f[..., idx[done]] = w[..., done]
                keep = np.flatnonzero(~brk)
                idx = idx[keep]
                m = len(idx)
                work = [w[..., keep] for w in work]
                cs = [c[..., keep] if s else c for c, s in zip(cs, spread)]
                buf = [np.empty_like(w) for w in work]
                brk = np.empty(m, bool)
        for f, w, o, a in zip(full, work, outs, self.carry_avals):
            if idx is None:
                if w is not f:
                    np.copyto(f, w)
            elif m:
                f[..., idx] = w
            np.copyto(o, f.reshape(a.shape + tail))


@numpy_emit.register(loop_p)
@several_results.register(loop_p)
def _loop_numpy(ctx, outs, ins, params):
    run = ctx.const(NumpyLoop(**params), "loop")
    return [f"{run}(({''.join(o + ', ' for o in outs)}), ({''.join(i + ', ' for i in ins)}))"]


# ---------------------------------------------------------------------------------------------
# JAX: lax.while_loop over the whole planes, ending when no sample is active

def _loop_jax(ctx, avals, *ins, body, start, step, cap, n_carries):
    import jax.numpy as jnp
    from jax import lax
    from .emit.jax import eval_body
    active0, inits, consts = ins[0], ins[1:1 + n_carries], ins[1 + n_carries:]
    plane = tuple(ctx.batch) + (ctx.n,)
    carry_avals = [v.aval for v in body.inputs[1:1 + n_carries]]
    carries = tuple(jnp.broadcast_to(jnp.asarray(x, a.dtype), a.shape + plane) for x, a in zip(inits, carry_avals))
    active = jnp.broadcast_to(jnp.asarray(active0, bool), plane)

    def cond(s):
        t, act, _ = s
        return (t < cap) & jnp.any(act)

    def step_fn(s):
        t, act, cs = s
        turn = start + t * step
        outs = eval_body(body, [turn, *cs, *consts], ctx)
        new = tuple(jnp.where(act, jnp.broadcast_to(jnp.asarray(n, a.dtype), c.shape), c)
                    for n, c, a in zip(outs[:n_carries], cs, carry_avals))
        brk = jnp.broadcast_to(jnp.asarray(outs[n_carries], bool), plane)
        return t + 1, act & ~brk, new

    _, _, final = lax.while_loop(cond, step_fn, (jnp.asarray(0, jnp.int64), active, carries))
    return list(final)


def _register_jax():
    from .emit.jax import jax_rules, several_results as jax_several
    jax_rules[loop_p] = jax_several[loop_p] = _loop_jax


_register_jax()


# ---------------------------------------------------------------------------------------------
# helpers of the derivative rules (hawk_fx/loop_diff.py)

def _inline(prog: Program, args):
    """prog's equations bound again on `args` (tracers of the current trace, or numbers): the
    types follow the arguments (a turn given per sample makes the body's values per sample)."""
    env = dict(zip(prog.inputs, args))

    def read(a):
        return a.value if isinstance(a, Literal) else env[a]

    for e in prog.eqns:
        ins = [read(a) for a in e.inputs]
        outs = e.prim.bind(*ins, **e.params)
        outs = outs if e.prim.multiple_results else [outs]
        env.update(zip(e.outputs, outs))
    return [read(a) for a in prog.outputs]


def _typed(x, aval):
    """x as a per-sample value of exactly `aval`."""
    a = as_aval(x)
    if a.dtype != aval.dtype or a.weak:
        x = P["convert"].bind(x, dtype=aval.dtype)
    if as_aval(x).shape != aval.shape or as_aval(x).kind != SAMPLE:
        x = P["broadcast"].bind(x, shape=aval.shape, kind=SAMPLE)
    return x


__all__ = ["loop_p", "for_stmt", "LoopToCall", "NumpyLoop"]


# ---------------------------------------------------------------------------------------------
# CUDA C: each thread runs its sample's loop and leaves it with a real `break`

def _loop_cuda(em, e, vals):
    from .emit.cuda import CUDA_RULES, _Val, ctype
    p = e.params
    body, nc = p["body"], p["n_carries"]
    pre = em.var_names[e.outputs[0]] + "L"
    active, inits, consts = vals[0], vals[1:1 + nc], vals[1 + nc:]
    lines = [f"// {pre}: loop[start={p['start']} step={p['step']} cap={p['cap']}], a sample leaves at its break"]
    carries = []
    for j, (v, x) in enumerate(zip(body.inputs[1:1 + nc], inits)):
        T = ctype(v.aval.dtype)
        comps = x.broadcast(v.aval.shape).cast(v.aval.dtype)
        names = [f"{pre}_c{j}_{c}" for c in range(len(comps))]
        lines += [f"{T} {n} = {c};" for n, c in zip(names, comps)]
        carries.append(_Val(names, v.aval.dtype, v.aval.shape))
    act = active.cast(np.bool_)[0]
    turn = f"{pre}_t"
    lines.append(f"for (long long {turn} = 0; ({act}) && {turn} < {p['cap']}LL; ++{turn}) {{")
    counter = itertools.count()
    for q in body.eqns:
        if q.prim not in CUDA_RULES:
            raise NotImplementedError(f"no CUDA emission rule for primitive '{q.prim}'")
        for v in q.outputs:
            em.var_names[v] = f"{pre}b{next(counter)}"
    env = {body.inputs[0]: _Val([f"({p['start']}LL + {turn} * {p['step']}LL)"], np.int64, ())}
    env.update(zip(body.inputs[1:1 + nc], carries))
    env.update(zip(body.inputs[1 + nc:], consts))
    inner: list = []
    em._emit_eqns(env, body.eqns, inner, inner)
    new = [em._value(env, a) for a in body.outputs]
    for j, (c, n) in enumerate(zip(carries, new[:nc])):       # read every new value before writing any
        T = ctype(c.dtype)
        inner += [f"const {T} {pre}_n{j}_{k} = {x};" for k, x in enumerate(n.cast(c.dtype))]
    for j, c in enumerate(carries):
        inner += [f"{name} = {pre}_n{j}_{k};" for k, name in enumerate(c.comps)]
    inner.append(f"if ({new[nc].cast(np.bool_)[0]}) break;")
    lines += ["    " + ln for ln in inner] + ["}"]
    return lines, carries


def _register_cuda():
    from .emit.cuda import CUDA_RULES, STATEMENT_RULES
    CUDA_RULES[loop_p] = STATEMENT_RULES[loop_p] = _loop_cuda


_register_cuda()
