"""Host functions with derivative rules: `eagle_fx.opaque(fn, reads, writes, jvp=..., vjp=...)`.

Host code (a SciPy solver, a simulator) is Python the transforms cannot see into. Given rules, a
node is staged as a pure `host` equation (ir/host.py): fn(primals) -> {write name: value} on the
values of its reads, its results the new values of its writes. Transforms pass through it by its
rules, which run as `host` equations too: forward mode adds jvp(primals, tangents) -> {write:
tangent}; reverse mode adds vjp(primals, cotangents) -> {read: cotangent} to the backward. The
rules' `primals` hold the reads and the values fn wrote (an implicit-function rule reads the root
fn found). A node with vjp= only is refused in forward mode (as JAX refuses jvp of a custom_vjp);
one with jvp= only in reverse mode (host code has no transpose). `host` equations run on the NumPy
backend (a Python call) and the JAX backend (jax.pure_callback); CUDA lowering refuses them.
"""
from __future__ import annotations

import numpy as np

from hawk_fx.core import Eqn, Literal, Var

from . import ir
from .backends import cuda_lower, jax_lower
from .backends import numpy as numpy_backend
from .ir.host import host_p
from .transforms import jvp_graph, vjp_graph
from .transforms.program import TransformError, copy_eqn, ct_aval, is_float
from .transforms.vmap import batch_rules


class Rules:
    """What a `host` equation of a node with rules keeps: its rules and its reads/writes names."""
    __slots__ = ("jvp", "vjp", "reads", "writes", "label")

    def __init__(self, jvp, vjp, reads, writes, label):
        self.jvp, self.vjp, self.reads, self.writes, self.label = jvp, vjp, tuple(reads), tuple(writes), label


def _host_fn(fn, kind, label, names, n_values, in_names, out_names, out_avals):
    """A `host` equation's function: (values named `names`, then seeds named `in_names`) -> one array
    per name of `out_names`, from `fn`'s dict, checked against the declared shapes."""
    def run(values):
        primals = dict(zip(names, (np.asarray(v) for v in values[:n_values])))
        if kind == "fn":
            got = fn(primals)
        else:
            got = fn(primals, dict(zip(in_names, (np.asarray(v) for v in values[n_values:]))))
        if not isinstance(got, dict):
            raise TypeError(f"eagle_fx.opaque {label}: its {kind} returned {type(got).__name__}; it returns a "
                            f"dict {{name: array}} for {list(out_names)}")
        outs = []
        for nm, aval in zip(out_names, out_avals):
            x = got.get(nm)
            if x is None and kind == "fn":
                raise ValueError(f"eagle_fx.opaque {label}: fn returned no value for the write {nm!r}")
            x = np.zeros(aval.shape, aval.dtype) if x is None else np.asarray(x, dtype=aval.dtype)
            if x.shape != tuple(aval.shape):
                raise ValueError(f"eagle_fx.opaque {label}: its {kind} gives {nm!r} the shape {x.shape}; the array "
                                 f"has {tuple(aval.shape)}")
            outs.append(x)
        return outs
    run.__name__ = label if kind == "fn" else f"{kind} of {label}"
    return run


def stage_pure_host(trace, node, name):
    """Stage a node with rules as a pure `host` equation: its reads in, new values of its writes out."""
    scope = trace.scope
    atoms, reads, writes = trace.node_access(node)
    avals = [scope.read(key).aval for key, _ in writes]
    info = trace.info(name)
    label = name or getattr(node.fn, "__name__", "fn")
    rules = Rules(node.jvp, node.vjp, node.reads, node.writes, repr(label))
    fn = _host_fn(node.fn, "fn", label, rules.reads, len(atoms), (), rules.writes, avals)
    outs = [Var(a) for a in avals]
    params = {"fn": fn, "avals_out": tuple(avals), "name": fn.__name__, "rules": rules}
    scope.eqns.append(Eqn(host_p, atoms, outs, params, info))
    for (key, _), v in zip(writes, outs):
        scope.write(key, v)
    trace.add_access(info, reads, writes, label)


def _values(e, env, outs):
    """The rules' primal values: the reads (as the transform sees them), then the writes fn made."""
    read = [a if isinstance(a, Literal) else env[a] for a in e.inputs]
    return read + list(outs), e.params["rules"]


def _bind(eqns, fn, inputs, avals, info):
    return eqns.bind(host_p, list(inputs), {"fn": fn, "avals_out": tuple(avals), "name": fn.__name__}, info)


@jvp_graph.jvp_rules.register(host_p)
def _host_jvp(e, env, tan, eqns, ts):
    """A node with a jvp= rule: the node, then its tangents by the rule; anything else is refused."""
    r = e.params.get("rules")
    if r is None:
        raise TransformError(f"{jvp_graph.API}: the derivative of a host node ({e.params['name']}, {e.info.where}) "
                             "is host code with no derivative of its own; one order of derivatives passes a host node")
    if r.jvp is None:
        raise TransformError(f"{jvp_graph.API}: the host node {r.label} ({e.info.where}) has a vjp= rule only: "
                             "can't apply forward-mode autodiff (jvp) to a custom_vjp function (as JAX says); give it "
                             "jvp= as well, or take this derivative in reverse mode (eagle_fx.grad, eagle_fx.jacrev)")
    outs = copy_eqn(e, env, eqns)
    values, _ = _values(e, env, outs)
    floats = [(nm, t, a) for nm, t, a in zip(r.reads, ts, e.inputs) if is_float(a.aval)]
    t_in = [t if t is not None else eqns.zeros(ct_aval(a.aval)) for _, t, a in floats]
    w_float = [(v, nm) for v, nm in zip(e.outputs, r.writes) if is_float(v.aval)]
    avals = [ct_aval(v.aval) for v, _ in w_float]
    fn = _host_fn(r.jvp, "jvp", r.label, r.reads + r.writes, len(values), [nm for nm, _, _ in floats],
                  [nm for _, nm in w_float], avals)
    for (v, _), t in zip(w_float, _bind(eqns, fn, values + t_in, avals, e.info)):
        tan[v] = t


@vjp_graph.vjp_rules.register(host_p)
def _host_vjp(v, e, cts, env, ct, eqns, saved):
    """A node with a vjp= rule: the cotangents of its reads by the rule; anything else is refused."""
    r = e.params.get("rules")
    if r is None:
        raise TransformError(f"{v.api}: the derivative of a host node ({e.params['name']}, {e.info.where}) is host "
                             "code with no derivative of its own; one order of derivatives passes a host node")
    if r.vjp is None:
        raise TransformError(f"{v.api}: the host node {r.label} ({e.info.where}) has a jvp= rule only; reverse "
                             "mode would transpose its tangent map, which is host code: give it vjp= as well, or take "
                             "this derivative in forward mode (eagle_fx.jvp, eagle_fx.jacfwd)")
    values, _ = _values(e, env, [env[o] for o in e.outputs])
    w_float = [(o, nm, c) for o, nm, c in zip(e.outputs, r.writes, cts) if is_float(o.aval)]
    seeds = [c if c is not None else eqns.zeros(ct_aval(o.aval)) for o, _, c in w_float]
    r_float = [(a, nm) for a, nm in zip(e.inputs, r.reads) if isinstance(a, Var) and is_float(a.aval)]
    avals = [ct_aval(a.aval) for a, _ in r_float]
    fn = _host_fn(r.vjp, "vjp", r.label, r.reads + r.writes, len(values), [nm for _, nm, _ in w_float],
                  [nm for _, nm in r_float], avals)
    for (a, _), g in zip(r_float, _bind(eqns, fn, values + seeds, avals, e.info)):
        vjp_graph._accumulate(ct, a, g, eqns)


@batch_rules.register(host_p)
def _host_batch(self, e, atoms, fl, env, flags, eqns):
    """Host code on batched values runs once per instance (a Python loop), its results stacked."""
    if not any(fl):
        return self.copy(e, atoms, [False] * len(e.outputs), env, flags, eqns)
    fn, B = e.params["fn"], self.B

    def per_instance(values):
        runs = [fn([v[b] if f else v for v, f in zip(values, fl)]) for b in range(B)]
        return [np.stack(xs) for xs in zip(*runs)]
    per_instance.__name__ = e.params["name"]
    avals = tuple(ir.batched_aval(a, B) for a in e.params["avals_out"])
    self.copy(e, atoms, [True] * len(e.outputs), env, flags, eqns,
              params={"fn": per_instance, "avals_out": avals, "name": e.params["name"]})


@numpy_backend.numpy_rules.register(host_p)
def _numpy_host(exe, g, d, e, outs):
    k = len(exe.calls)
    fn = e.params["fn"]

    def run(ins, out_arrays):
        for o, x in zip(out_arrays, fn(list(ins))):
            np.copyto(o, x)
    exe.calls.append(("fn", run))
    ins = "".join(f"{exe.b(a)}, " for a in e.inputs)
    g.emit(d, f"c{k}(({ins}), ({''.join(f'b{o}, ' for o in outs)}))")


@jax_lower.graph_rules.register(host_p)
def _jax_host(lw, e, ins):
    import jax
    shapes = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in e.params["avals_out"]]
    fn = e.params["fn"]
    return list(jax.pure_callback(lambda *vals: [np.asarray(x) for x in fn(list(vals))], shapes, *ins,
                                  vmap_method="sequential"))


@cuda_lower.cuda_rules.refuse(host_p)
def _cuda_host(self, chain, e, outs):
    """A host function reads values the graph makes on the device: run it on NumPy or JAX."""
    raise NotImplementedError(f"eagle_fx CUDA lowering: the host function {e.params['name']} ({e.info.where}) reads "
                              "values the graph makes on the device, and CUDA graphs do not bring them to the host: "
                              "run this graph on the NumPy or JAX backend (use_backend('numpy') or 'jax'), or write "
                              "the host work as a kernel")
