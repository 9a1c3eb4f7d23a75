"""Custom derivative rules for kernels, blocks and whole builders, with JAX's decorator shapes.

    @eagle_fx.custom_vjp
    def clip_gradient(x):                 # a kernel call, or a block: staged into the builder
        return ident(x)

    def fwd(x):
        return ident(x), ()               # (result, residuals: a tree of planes)

    def bwd(res, ct):
        return (clip(ct),)                # a cotangent (or None) per argument

    clip_gradient.defvjp(fwd, bwd)

    @eagle_fx.custom_jvp
    def f(x): ...
    @f.defjvp
    def f_jvp(primals, tangents):         # -> (result, tangent of the result)
        ...

Called inside a builder, a custom function stages its body, and each rule, into sub-Programs of
one `custom` equation (ir/custom.py): the body is what runs (every backend inlines it before
lowering); the transforms read the rules. jvp of a custom_jvp runs its rule; vjp of a custom_vjp
runs fwd in the forward pass, keeping its residuals, and bwd in the backward; jvp of a custom_vjp
is refused with JAX's message; vjp of a custom_jvp transposes the rule's tangent map (the reverse
of the rule with respect to its tangents: right when the tangent map is linear, as in JAX). vmap
batches the body (derivatives of a batched program are refused anyway: differentiate first).
Rules call kernels (a block needs its Graph: call its kernels); the arguments a rule sees are
the custom function's, less any eagle_fx.Graph among them.

On a whole builder (`f = eagle_fx.custom_vjp(loss)`, loss an @eagle_fx.Graph.builder with no
Graph parameter), f is itself a builder: called on arrays it builds a graph whose one `custom`
equation holds loss's body and the rules, so every transform, to_jax and every backend take it as
they take any builder; called inside another builder, it stages that equation there (a builder
nested in a builder, which plain builders are not). Its body's `eagle_fx.Graph()` is then a view
of the graph being built, and its `g.result` what the call returns. A rule that calls f itself
(`return f(x), res`, as JAX users write) gets f's body: the rule is not staged inside itself.
"""
from __future__ import annotations


from hawk_fx import custom as _hawk_custom
from hawk_fx.context import CONTEXT
from hawk_fx.caches import WeakMemo
from hawk_fx.core import Eqn, Literal, Program, Var
from hawk_fx.tree import tree_flatten, tree_unflatten

from . import ir
from .backends import cuda_lower, jax_lower
from .backends import numpy as numpy_backend
from .frontend import staging, views
from .frontend.building import Builder
from .ir.custom import custom_p
from .transforms import jvp_graph, vjp_graph
from .transforms.program import TransformError, ct_aval, inline, is_float
from .transforms.vmap import batch_rules


class _Custom:
    kind = ""

    def __init__(self, fn):
        self.fn = fn
        self.__name__ = getattr(fn, "__name__", type(fn).__name__)
        self.__doc__ = getattr(fn, "__doc__", None)

    def __repr__(self):
        return f"<eagle_fx.{self.kind} {self.__name__}>"

    def __call__(self, *args):
        trace = staging.active_trace()
        if trace is None:
            raise TypeError(f"eagle_fx.{self.kind}({self.__name__}): call it inside a builder "
                            "(@eagle_fx.Graph.builder): it stages its body and rules into the graph being built")
        self._check_rules()
        return _stage(trace, self, args)

    def _body(self, args):
        """The body, staged into the current scope."""
        return self.fn(*args)

    def functions_read(self):
        """The user's functions this one stages (body and rules), which the staging caches follow
        by name (frontend/cache.py names_read): a kernel a rule calls, rebound, stages again."""
        rules = (getattr(self, "fwd", None), getattr(self, "bwd", None), getattr(self, "jvp", None))
        return (getattr(self, "builder", self.fn),) + tuple(r for r in rules if r is not None)

    def _redefined(self):
        """A rule replaced after the function was used: graphs staged with the old one are dropped."""
        from .frontend.cache import clear_caches
        clear_caches()


class custom_vjp(_Custom):
    """A kernel, block or builder with a reverse rule: f.defvjp(fwd, bwd); fwd(*args) -> (result,
    residuals), bwd(residuals, cotangent) -> a cotangent (or None) per argument, as jax.custom_vjp."""
    kind = "custom_vjp"

    def __new__(cls, fn=None):
        return object.__new__(_BuilderVjp if cls is custom_vjp and _whole_builder(fn) else cls)

    def __init__(self, fn):
        super().__init__(fn)
        self.fwd = self.bwd = None

    def defvjp(self, fwd, bwd):
        if not callable(fwd) or not callable(bwd):
            raise TypeError(f"eagle_fx.custom_vjp({self.__name__}).defvjp: takes two functions, fwd and bwd")
        if self.fwd is not None:
            self._redefined()
        self.fwd, self.bwd = fwd, bwd
        return self

    def _check_rules(self):
        if self.fwd is None:
            raise TypeError(f"eagle_fx.custom_vjp({self.__name__}): no rule yet; define it with "
                            f"{self.__name__}.defvjp(fwd, bwd) before calling it")


class custom_jvp(_Custom):
    """A kernel, block or builder with a forward rule: f.defjvp(jvp); jvp(primals, tangents) ->
    (result, tangent of the result), as jax.custom_jvp. Reverse mode transposes the rule's tangent map."""
    kind = "custom_jvp"

    def __new__(cls, fn=None):
        return object.__new__(_BuilderJvp if cls is custom_jvp and _whole_builder(fn) else cls)

    def __init__(self, fn):
        super().__init__(fn)
        self.jvp = None

    def defjvp(self, jvp):
        if not callable(jvp):
            raise TypeError(f"eagle_fx.custom_jvp({self.__name__}).defjvp: takes a function")
        if self.jvp is not None:
            self._redefined()
        self.jvp = jvp
        return jvp

    def _check_rules(self):
        if self.jvp is None:
            raise TypeError(f"eagle_fx.custom_jvp({self.__name__}): no rule yet; define it with "
                            f"@{self.__name__}.defjvp before calling it")


# -- on a whole builder ------------------------------------------------------------------------

def _whole_builder(fn) -> bool:
    return isinstance(fn, Builder) and fn.graph_param is None and not isinstance(fn, _Custom)


class _WholeBuilder:
    """custom_vjp / custom_jvp of a whole builder: a builder itself (the Builder's attributes are the
    wrapped one's), whose graph is one `custom` equation; inside another builder, that equation."""

    def __init__(self, builder):
        super().__init__(builder.fn)          # custom_vjp's or custom_jvp's (not Builder's: copied below)
        self.__dict__.update({k: v for k, v in builder.__dict__.items() if k not in ("converted", "_eager_fn")})
        self.builder, self._eager_fn = builder, None
        self.converted = self._whole

    def __call__(self, *args, **kwargs):
        trace = staging.active_trace()
        if trace is None:                    # a builder call: builds (or, in a transform, stages) its graph
            return Builder.__call__(self, *args, **kwargs)
        self._check_rules()
        bound = self._bind(args, kwargs)
        bound.apply_defaults()
        return _stage(trace, self, tuple(bound.args))

    def _whole(self, *args, **kwargs):
        """The graph this builder makes: its result is the custom equation's."""
        from .graph import Graph
        g = Graph()
        self._check_rules()
        bound = self._bind(args, kwargs)
        bound.apply_defaults()
        g.result = _stage(staging.active_trace(), self, tuple(bound.args))
        return g

    def _body(self, args):
        """The wrapped builder's body staged into the current scope: its `eagle_fx.Graph()` is a
        view of the graph being built; what it declares as g.result is returned."""
        trace = staging.active_trace()
        into = _Into(self.builder, trace)
        with CONTEXT.enter(building=into, builder_sources=self.builder.source):
            ret = self.builder.converted(*args)
        if into.graph is None or ret is not into.graph:
            raise TypeError(f"eagle_fx.{self.kind}({self.__name__}): a builder returns its graph: `return g`; declare "
                            "the arrays with `g.result = ...`")
        if not into.graph.has_result:
            raise TypeError(f"eagle_fx.{self.kind}({self.__name__}): the builder declares no result (g.result = ...); "
                            "a custom function returns what it computes")
        return into.graph._result_tree


class _Into:
    """The building context of a builder body staged into another graph's trace: the Graph it
    makes stages there (its verbs too), holding only its own declared result."""

    def __init__(self, builder, trace):
        self.builder, self.trace, self.graph = builder, trace, None

    def claim(self, graph):
        self.graph = graph
        graph._trace = self.trace


class _BuilderVjp(_WholeBuilder, custom_vjp, Builder):
    pass


class _BuilderJvp(_WholeBuilder, custom_jvp, Builder):
    pass


# -- staging ------------------------------------------------------------------------------------

class _Sub:
    """One function staged into a sub-scope: its eqns, the outer planes it read, its outputs."""

    def __init__(self, trace, fn, local_avals, what):
        parent = trace.scope
        self.scope = s = staging.Scope(trace, parent)
        self.locals = [Var(a) for a in local_avals]
        planes = []
        for v in self.locals:
            h = trace.new_plane(v.aval, trace.info(), v)
            s.define(h.key, v)
            planes.append(h)
        n_access = len(trace.accesses)
        trace.scope = s
        try:
            out = fn(*planes)
        finally:
            trace.scope = parent
        if what != "the body":
            del trace.accesses[n_access:]      # a rule's nodes are not the graph's: no ordering to check
        if s.written:
            raise TypeError(f"eagle_fx custom rule: {what} writes an array it was given in place (a Mutable "
                            "argument); a custom function returns what it computes")
        self.out = out

    def atoms(self, trace, leaves, what, copy=False):
        res = []
        for x in leaves:
            if x is None:
                res.append(None)
                continue
            if not (isinstance(x, staging.Plane) or staging.is_array(x)):
                raise TypeError(f"eagle_fx custom rule: {what} returns {type(x).__name__}; it returns planes "
                                "(what kernels return) or None")
            v = self.scope.read(trace.key_of(x, "eagle_fx custom rule", what))
            if copy and not any(v in e.outputs for e in self.scope.eqns):       # the body's outputs are its own
                v = views.full_slice(v, self.scope.eqns, trace.info())
            res.append(v)
        return res


def _stage(trace, c, args):
    if any(b is c for b in CONTEXT.custom_rules):      # its own rule calls it: the body, not the rule inside itself
        return c._body(args)
    with CONTEXT.enter(custom_rules=c):
        return _stage_custom(trace, c, args)


def _stage_custom(trace, c, args):
    parent = trace.scope
    primal_pos = [k for k, a in enumerate(args) if not isinstance(a, _graph_type())]
    primals = [args[k] for k in primal_pos]

    body = _Sub(trace, lambda: c._body(args), [], "the body")
    out_leaves, out_tree = tree_flatten(body.out, is_leaf=lambda x: isinstance(x, staging.Plane) or staging.is_array(x))
    outs = body.atoms(trace, out_leaves, f"{c.__name__}", copy=True)
    if any(o is None for o in outs) or not outs:
        raise TypeError(f"eagle_fx.{c.kind}({c.__name__}): it returns no plane; a custom function returns what its "
                        "kernels compute")
    out_avals = [o.aval for o in outs]
    # the planes among the arguments: where each rule's tangent / cotangent goes
    arg_keys = []
    for a in primals:
        leaves, _ = tree_flatten(a, is_leaf=lambda x: isinstance(x, staging.Plane) or staging.is_array(x))
        arg_keys.append([trace.key_of(x, "eagle_fx custom", "an argument")
                         if isinstance(x, staging.Plane) or staging.is_array(x) else None for x in leaves])
    subs, extra = [body], {}
    if isinstance(c, custom_vjp):
        fwd = _Sub(trace, lambda: c.fwd(*primals), [], "fwd")
        if not (isinstance(fwd.out, tuple) and len(fwd.out) == 2):
            raise TypeError(f"eagle_fx.custom_vjp({c.__name__}): fwd returns {type(fwd.out).__name__}; it returns "
                            "(result, residuals)")
        y_leaves, y_tree = tree_flatten(fwd.out[0], is_leaf=lambda x: isinstance(x, staging.Plane))
        if y_tree != out_tree:
            raise TypeError(f"eagle_fx.custom_vjp({c.__name__}): fwd's result has structure {y_tree}; the function's "
                            f"is {out_tree}")
        r_leaves, r_tree = tree_flatten(fwd.out[1], is_leaf=lambda x: isinstance(x, staging.Plane))
        fwd_outs = fwd.atoms(trace, y_leaves, "fwd's result") + fwd.atoms(trace, r_leaves, "fwd's residuals")
        r_avals = [v.aval for v in fwd_outs[len(y_leaves):]]
        ct_avals = [ct_aval(a) for a in out_avals]

        def run_bwd(*ph):
            res = tree_unflatten(r_tree, list(ph[:len(r_avals)]))
            ct = tree_unflatten(out_tree, list(ph[len(r_avals):]))
            return c.bwd(res, ct)
        bwd = _Sub(trace, run_bwd, r_avals + ct_avals, "bwd")
        got = bwd.out if isinstance(bwd.out, (tuple, list)) else None
        if got is None or len(got) != len(primals):
            raise TypeError(f"eagle_fx.custom_vjp({c.__name__}): bwd returns {type(bwd.out).__name__}; it returns a "
                            f"tuple of {len(primals)} cotangents (one per argument, None where there is none)")
        ct_leaves = []
        for a, keys in zip(got, arg_keys):
            leaves = [None] * len(keys) if a is None else \
                tree_flatten(a, is_leaf=lambda x: x is None or isinstance(x, staging.Plane))[0]
            if len(leaves) != len(keys):
                raise TypeError(f"eagle_fx.custom_vjp({c.__name__}): bwd's cotangent {a!r:.40} does not match its "
                                "argument's structure")
            ct_leaves += leaves
        subs += [fwd, bwd]
        extra = {"n_out": len(y_leaves), "fwd_outs": fwd_outs, "bwd_outs": bwd.atoms(trace, ct_leaves, "bwd")}
    if getattr(c, "jvp", None) is not None:       # custom_jvp; a rule set with both (fixed_point) too
        t_avals = [ct_aval(trace.scope.read(k).aval) for keys in arg_keys for k in keys if k is not None]

        def run_jvp(*ph):
            it = iter(ph)
            tangents = []
            for a, keys in zip(primals, arg_keys):
                leaves, t = tree_flatten(a, is_leaf=lambda x: isinstance(x, staging.Plane) or staging.is_array(x))
                tl = [next(it) if k is not None else (0.0 if isinstance(x, float) else None)
                      for k, x in zip(keys, leaves)]
                tangents.append(tree_unflatten(t, tl))
            return c.jvp(tuple(primals), tuple(tangents))
        jr = _Sub(trace, run_jvp, t_avals, "the jvp rule")
        if not (isinstance(jr.out, tuple) and len(jr.out) == 2):
            raise TypeError(f"eagle_fx.custom_jvp({c.__name__}): the rule returns {type(jr.out).__name__}; it returns "
                            "(result, tangent of the result)")
        y_leaves, y_tree = tree_flatten(jr.out[0], is_leaf=lambda x: isinstance(x, staging.Plane))
        t_leaves, t_tree = tree_flatten(jr.out[1], is_leaf=lambda x: isinstance(x, staging.Plane))
        if y_tree != out_tree or t_tree != out_tree:
            raise TypeError(f"eagle_fx.custom_jvp({c.__name__}): the rule returns structures {y_tree} and {t_tree}; "
                            f"the function's result is {out_tree}")
        subs.append(jr)
        extra["jvp_outs"] = jr.atoms(trace, y_leaves, "the rule's result") + jr.atoms(trace, t_leaves, "the tangent")
    # one operand list for every sub-program: the outer planes any of them read
    keys = list(dict.fromkeys(k for s in subs for k in s.scope.captures))
    operands = [parent.read(k) for k in keys]

    def program(s, outs):
        ins = [s.scope.captures[k][0] if k in s.scope.captures else Var(parent.read(k).aval) for k in keys]
        res = [o if o is not None else _zeros(s, a) for o, a in outs]      # first: a zero is an equation
        return Program(ins + s.locals, list(s.scope.eqns), res)

    at = {k: i for i, k in enumerate(keys)}
    wrt = [at.get(k) for keys_ in arg_keys for k in keys_]      # per argument leaf: its operand, or None
    params = {"fun": program(body, [(o, o.aval) for o in outs]), "name": c.__name__, "kind": c.kind,
              "wrt": tuple(wrt), "inplace": ()}
    if isinstance(c, custom_vjp):
        params["fwd"] = program(subs[1], [(o, o.aval) for o in extra["fwd_outs"]])
        params["n_out"] = extra["n_out"]
        leaf_avals = [ct_aval(parent.read(keys[i]).aval) if i is not None else None for i in wrt]
        params["bwd"] = program(subs[2], [(o, a) for o, a in zip(extra["bwd_outs"], leaf_avals) if a is not None])
    if "jvp_outs" in extra:
        params["jvp"] = program(subs[-1], [(o, o.aval) for o in extra["jvp_outs"]])
    info = trace.info()
    out_vars = [Var(a) for a in out_avals]
    parent.eqns.append(Eqn(custom_p, operands, out_vars, params, info))
    handles = []
    for v in out_vars:
        h = trace.new_plane(v.aval, info, v)
        parent.define(h.key, v)
        handles.append(h)
    return tree_unflatten(out_tree, handles)


def _zeros(s, aval):
    v = Var(aval)
    s.scope.eqns.append(Eqn(ir.zeros_p, [], [v], {"aval": aval}))
    return v


def _graph_type():
    from .graph import Graph
    return Graph


# -- the transforms ----------------------------------------------------------------------------

def _operands(e, env):
    return [a if isinstance(a, Literal) else env[a] for a in e.inputs]


@jvp_graph.jvp_rules.register(custom_p)
def _custom_jvp(e, env, tan, eqns, ts):
    """custom_jvp (and fixed_point): its rule; custom_vjp: refused, as in JAX."""
    p = e.params
    if "jvp" not in p:
        raise TransformError(f"{jvp_graph.API}: {p['name']} ({e.info.where}) is an eagle_fx.custom_vjp: can't apply "
                             "forward-mode autodiff (jvp) to a custom_vjp function (as JAX says); define it with "
                             "eagle_fx.custom_jvp, or take this derivative in reverse mode")
    t_in = [_tangent(e, i, tan, eqns) for i in p["wrt"] if i is not None]
    outs = inline(p["jvp"], _operands(e, env) + t_in, eqns)
    k = len(e.outputs)
    for v, o, t in zip(e.outputs, outs[:k], outs[k:]):
        env[v] = o
        if is_float(v.aval):
            tan[v] = t


def _tangent(e, i, tan, eqns):
    a = e.inputs[i]
    t = tan.get(a) if isinstance(a, Var) else None
    return t if t is not None else eqns.zeros(ct_aval(a.aval))


@vjp_graph.forward_rules.register(custom_p)
def _custom_forward(v, e, env, eqns, saved):
    """custom_vjp: fwd, keeping its residuals for bwd; custom_jvp: the rule's own result (at zero
    tangents), so that a derivative taken over this reverse pass differentiates what the rule
    computes, as in JAX (where linearizing runs the rule)."""
    p = e.params
    if "fwd" in p:
        outs = inline(p["fwd"], _operands(e, env), eqns)
        saved[e] = outs[len(e.outputs):]
    else:
        zeros = [eqns.zeros(v.aval) for v in p["jvp"].inputs[len(e.inputs):]]
        outs = inline(p["jvp"], _operands(e, env) + zeros, eqns)
        saved[e] = []
    env.update(zip(e.outputs, outs[:len(e.outputs)]))


@vjp_graph.vjp_rules.register(custom_p)
def _custom_vjp(v, e, cts, env, ct, eqns, saved):
    """custom_vjp: bwd on the residuals; custom_jvp: the rule's tangent map transposed."""
    p = e.params
    seeds = [c if c is not None else eqns.zeros(ct_aval(o.aval)) for c, o in zip(cts, e.outputs)]
    ops = _operands(e, env)
    wrt = [i for i in p["wrt"] if i is not None]
    if "bwd" in p:
        grads = inline(p["bwd"], ops + list(saved[e]) + seeds, eqns)
    else:
        rule = p["jvp"]
        k = len(e.outputs)
        flags = [False] * len(e.inputs) + [True] * len(wrt)
        tp = vjp_graph.vjp_graph(rule, flags, v.capacity, v.api)
        zeros_t = [eqns.zeros(x.aval) for x in rule.inputs[len(e.inputs):]]
        y_seeds = [eqns.zeros(ct_aval(o.aval)) for o in rule.outputs[:k] if is_float(o.aval)]
        outs = inline(tp, ops + zeros_t + y_seeds + [s for s, o in zip(seeds, e.outputs) if is_float(o.aval)], eqns)
        grads = outs[len(rule.outputs):]
    for i, g in zip(wrt, grads):
        vjp_graph._accumulate(ct, e.inputs[i], g, eqns)


@batch_rules.register(custom_p)
def _custom_batch(self, e, atoms, fl, env, flags, eqns):
    """The body, batched in place (a batched program is not differentiated: its rules are not needed)."""
    fun = e.params["fun"]
    for v, a, f in zip(fun.inputs, atoms, fl):
        env[v], flags[v] = a, f
    for inner in fun.eqns:
        self.eqn(inner, env, flags, eqns)
    for v, o in zip(e.outputs, fun.outputs):
        env[v], flags[v] = self.read(o, env, flags)


# -- lowering: every backend runs the body, inlined --------------------------------------------

_INLINED = WeakMemo()       # Program -> its inlined one (None: itself)


def inline_custom(prog: Program) -> Program:
    """`prog` with each custom equation replaced by its body (in sub-programs too); made once per
    Program, so a graph lowered again from the same Program lowers the same one (and hits the
    memo of its fused plan)."""
    try:
        hit = _INLINED[prog]
    except KeyError:
        hit = _INLINED[prog] = _inline_custom(prog) if _has_custom(prog) else None
    return prog if hit is None else hit


def _inline_custom(prog: Program) -> Program:
    eqns = []
    for e in prog.eqns:
        e = _inline_params(e)
        if e.prim is not custom_p:
            eqns.append(e)
            continue
        fun = inline_custom(e.params["fun"])
        env = dict(zip(fun.inputs, e.inputs))
        named = {}
        for o, v in zip(fun.outputs, e.outputs):
            named.setdefault(o, v)
        for inner in fun.eqns:
            ins = [a if isinstance(a, Literal) else env.get(a, a) for a in inner.inputs]
            outs = [named.pop(o) if o in named else Var(o.aval, o.hint) for o in inner.outputs]
            env.update(zip(inner.outputs, outs))
            eqns.append(Eqn(inner.prim, ins, outs, inner.params, inner.info))
        for o, v in zip(fun.outputs, e.outputs):        # an output the body gives twice: a copy
            if env.get(o) is not v:
                src = o if isinstance(o, Literal) else env[o]
                eqns.append(Eqn(ir.slice_p, [src], [v], {"index": tuple(range(d) for d in v.aval.shape)}, e.info))
    return prog.replace(eqns=eqns)


def _has_custom(prog) -> bool:
    return any(e.prim is custom_p or any(_has_custom(p) for p in _subprograms(e)) for e in prog.eqns)


def _subprograms(e):
    for v in e.params.values():
        for p in v if isinstance(v, (tuple, list)) else (v,):
            if isinstance(p, Program):
                yield p


def _inline_params(e):
    if e.prim is custom_p or not any(_has_custom(p) for p in _subprograms(e)):
        return e
    params = {}
    for k, v in e.params.items():
        if isinstance(v, Program):
            v = inline_custom(v)
        elif isinstance(v, tuple) and any(isinstance(p, Program) for p in v):
            v = tuple(inline_custom(p) if isinstance(p, Program) else p for p in v)
        params[k] = v
    return Eqn(e.prim, e.inputs, e.outputs, params, e.info)


def _inlined_before_lowering(*args):
    """A custom equation is inlined before any backend lowers a Program (custom.inline_custom)."""
    raise AssertionError("eagle_fx: a custom equation reached a backend's lowering without being inlined")


for _table in (numpy_backend.numpy_rules, jax_lower.graph_rules, cuda_lower.cuda_rules):
    _table.refuse(custom_p)(_inlined_before_lowering)



def _stage_kernel_rule(ck, args):
    """A hawk_fx.custom_jvp kernel called in a builder: its kernel as the body, its per-sample rule
    (the kernel's parameters, then a tangent each) as the jvp rule."""
    c = custom_jvp(ck.kernel)
    c.defjvp(lambda primals, tangents: ck.rule(*primals, *[0.0 if t is None else t for t in tangents]))
    return c(*args)


_hawk_custom.STAGER.append(_stage_kernel_rule)
