"""eagle_fx.fixed_point: a per-sample fixed point, differentiated at the point (implicit function
theorem) rather than through the turns that reached it.

    x = eagle_fx.fixed_point(step, x0, *params, tol=1e-10, max_steps=100)

The forward pass is a device loop: x <- step(x, *params) for every sample whose update is still
larger than `tol`, until every sample has converged or `max_steps` turns ran. It is staged as one
custom equation (ir/custom.py) whose rules need no turn of that loop:

  * reverse: with x* the fixed point, J = d step / dx and B = d step / d params at x*, the
    cotangent xbar of x* gives params the cotangent B^T u, where u solves (I - J^T) u = xbar. u is
    a Neumann series run per sample as a device loop of its own, u <- xbar + J^T u (one vjp of
    the step per turn), until its update is below tol times the size of xbar;
  * forward: the tangent t solves (I - J) t = B pdot, run alike: t <- J t + B pdot.

Neither keeps anything per turn: the gradient's memory is that of a few planes, whatever the
number of turns. Where the loop did not converge (a sample still moving after `max_steps`
turns, or a Neumann series that did not settle: J not a contraction at x*), the derivative of
that sample is NaN (0 where its cotangent is 0, so a sample the loss does not read does no harm).
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

import hawk_fx as hawk
import hawk_fx.math as hm
from hawk_fx.caches import LRU
from hawk_fx.core import Eqn, Literal, Program, Var
from hawk_fx.diff import _dce
from hawk_fx.kernel import BodySpec
from hawk_fx.roles import Mutable, Param, Role, Scalar, Terminated

from . import ir
from .custom import _Sub, custom_vjp
from .frontend import staging
from .frontend.building import Builder
from .graph import Graph
from .simulate import _along, _copier, _fresh, _samples_of
from .transforms import vjp_graph
from .transforms.jvp_graph import jvp_graph
from .transforms.program import Eqns, dce, inline, is_float

API = "eagle_fx.fixed_point"


def fixed_point(step, x0, *params, tol=1e-10, max_steps=100):
    """The fixed point x = step(x, *params) of every sample, from x0; differentiable with respect
    to `params` at the fixed point (implicit function theorem: no loop turns are stored).

    `step` is a hawk kernel (or a function calling kernels) taking the state, then `params`, and
    returning the new state: a plane of x0's shape and dtype (a Scalar or Vector[k] per sample).
    Every array `step` reads comes in through `params` (planes, or Python numbers). A sample has
    converged when the norm of its update, |step(x) - x|, is at most `tol`; the loop stops when
    every sample has converged, or after `max_steps` turns. A sample that had not converged keeps
    its last iterate, and its derivative is NaN. The derivative with respect to x0 is zero (the
    fixed point does not depend on where the iteration starts).

    The derivatives solve linear systems with the step's Jacobian J at the fixed point, by Neumann
    series; they are valid where the step is a contraction there (every eigenvalue of J inside the
    unit circle), which a converging iteration of a smooth step is. Newton's method has J = 0 at
    its root: its series settles in one turn.

    Called outside a builder, it builds the graph, runs it once and returns an array (x0 is not
    written). Inside a builder it stages into that graph: grad, vjp, jvp, vmap and every backend
    apply to it.
    """
    cfg = _config(step, tol, max_steps)
    trace = staging.active_trace()
    if trace is None:
        return _run_fixed_point(x0, params, cfg)()
    return _stage(trace, cfg, x0, params)


@dataclasses.dataclass(frozen=True)
class _Config:
    step: object
    tol: float
    max_steps: int


def _config(step, tol, max_steps) -> _Config:
    if not callable(step):
        raise TypeError(f"{API}: step is {type(step).__name__} {step!r:.60}; give a hawk kernel (or a function of "
                        "kernels) step(x, *params) returning the new state")
    if isinstance(tol, bool) or not isinstance(tol, (int, float)) or not math.isfinite(tol) or tol < 0:
        raise ValueError(f"{API}: tol={tol!r}; give a finite Python number >= 0, the largest update (its norm per "
                         "sample) of a converged sample")
    if isinstance(max_steps, bool) or not isinstance(max_steps, (int, np.integer)) or max_steps < 1:
        raise ValueError(f"{API}: max_steps={max_steps!r}; give the most turns of the loop, an int >= 1")
    return _Config(step, float(tol), int(max_steps))


@Builder
def _run_fixed_point(x0, params, cfg):
    g = Graph()
    g.result = fixed_point(cfg.step, x0, *params, tol=cfg.tol, max_steps=cfg.max_steps)
    return g


# -- the per-sample kernels ------------------------------------------------------------------------

_SETTLERS = LRU("fixed_point's settle kernels", 64)
_FINISHERS = LRU("fixed_point's finish kernels", 64)
_NORMS = LRU("fixed_point's norm kernels", 64)
_NEUMANNS = LRU("fixed_point's series kernels", 64)


def _sq(shape):
    """The per-sample sum of squares of a value of this shape, as a function for a kernel body."""
    if not shape:
        return lambda d: d * d
    idx = "abcdefgh"[:len(shape)]
    spec = f"{idx},{idx}->"
    return lambda d: hm.einsum(spec, d, d)


def _settler(shape, dtype):
    """x = y for the samples still running; a sample whose update |y - x| is at most
    tol * scale is marked done (the turn that converged writes its last update)."""
    k = _SETTLERS.get((shape, dtype))
    if k is None:
        role, sq = Role("State", shape, dtype), _sq(shape)

        def settle(x, y, done, scale, tol):
            d = y - x
            done = hm.sqrt(sq(d)) <= tol * scale
            x = y  # noqa: F841  (a Mutable: the assignment writes the plane)
        settle.__annotations__ = {"x": Mutable[role], "y": role, "done": Terminated, "scale": Scalar, "tol": Param}
        k = _SETTLERS[(shape, dtype)] = hawk.kernel(settle)
    return k


def _neumann(shape, dtype):
    """A turn of the series s <- seed + w (w the linear map applied to s), settled as _settler."""
    k = _NEUMANNS.get((shape, dtype))
    if k is None:
        role, sq = Role("State", shape, dtype), _sq(shape)

        def neumann(s, seed, w, done, scale, tol):
            y = seed + w
            d = y - s
            done = hm.sqrt(sq(d)) <= tol * scale
            s = y  # noqa: F841  (a Mutable: the assignment writes the plane)
        neumann.__annotations__ = {"s": Mutable[role], "seed": role, "w": role, "done": Terminated, "scale": Scalar,
                                   "tol": Param}
        k = _NEUMANNS[(shape, dtype)] = hawk.kernel(neumann)
    return k


def _norm(shape, dtype):
    k = _NORMS.get((shape, dtype))
    if k is None:
        role, sq = Role("State", shape, dtype), _sq(shape)

        def norm(x):
            return hm.sqrt(sq(x))
        norm.__annotations__ = {"x": role}
        k = _NORMS[(shape, dtype)] = hawk.kernel(norm)
    return k


def _finisher(shape, dtype):
    """The derivative where both loops converged; else NaN, or 0 where the seed is 0."""
    k = _FINISHERS.get((shape, dtype))
    if k is None:
        role = Role("State", shape, dtype)

        def finish(u, ok, again, scale):
            return hm.where(ok & again, u, hm.where(scale > 0.0, math.nan, 0.0 * u))
        finish.__annotations__ = {"u": role, "ok": Scalar, "again": Scalar, "scale": Scalar}
        k = _FINISHERS[(shape, dtype)] = hawk.kernel(finish)
    return k


@hawk.kernel
def _ones(x: Scalar):
    return 1.0 + 0.0 * x


@Builder
def _iterate(g: Graph, turn, done, cap):
    """At most `cap` turns, leaving once every sample's mark is set."""
    for _ in range(cap):
        turn()
        if hawk.all_done(done):
            break


# -- staging -----------------------------------------------------------------------------------------

class _Rules(custom_vjp):
    """A fixed point's custom equation: its body, fwd/bwd for reverse mode and a jvp rule for
    forward mode (eagle_fx.custom stages all three)."""
    kind = "fixed_point"


def _is_plane(a):
    return isinstance(a, staging.Plane) or staging.is_array(a)


def _stage(trace, cfg: _Config, x0, params):
    name = getattr(cfg.step, "__name__", None) or getattr(cfg.step, "name", None) or type(cfg.step).__name__
    where = trace.info().where
    at = f" [called at {where}]" if where else ""
    if not _is_plane(x0):
        raise TypeError(f"{API}({name}): x0 is {type(x0).__name__} {x0!r:.60}; give a plane (an array whose last "
                        "axis is the samples)" + at)
    for k, p in enumerate(params):
        if not (_is_plane(p) or isinstance(p, (bool, int, float, np.number))):
            raise TypeError(f"{API}({name}): parameter {k} is {type(p).__name__} {p!r:.60}; pass planes or Python "
                            "numbers (a tree of them: pass its leaves)" + at)
    x_aval = trace.scope.read(trace.key_of(x0, API, "x0")).aval
    if not is_float(x_aval):
        raise TypeError(f"{API}({name}): x0 has dtype {x_aval.dtype}; the state of a fixed point is floating" + at)
    shape, dtype = tuple(x_aval.shape[:-1]), np.dtype(x_aval.dtype)
    plane_at = [k for k, p in enumerate(params) if _is_plane(p)]
    p_avals = [trace.scope.read(trace.key_of(params[k], API, f"parameter {k}")).aval for k in plane_at]

    def call_step(x, planes):
        args = list(params)
        for k, p in zip(plane_at, planes):
            args[k] = p
        y = cfg.step(x, *args)
        if not isinstance(y, staging.Plane) or tuple(y.shape) != tuple(x_aval.shape) or np.dtype(y.dtype) != dtype:
            got = (f"a plane of shape {tuple(y.shape)} and dtype {y.dtype}" if isinstance(y, staging.Plane)
                   else f"{type(y).__name__} {y!r:.40}")
            raise TypeError(f"{API}({name}): step returns {got}; it returns the new state, a plane of x0's shape "
                            f"{tuple(x_aval.shape)} and dtype {dtype}" + at)
        return y

    # the step as a Program over (x, plane params): its derivatives, applied in the rules' loops
    one = _Sub(trace, lambda *ph: call_step(ph[0], ph[1:]), [x_aval] + p_avals, "step")
    if one.scope.captures:
        raise TypeError(f"{API}({name}): step reads {len(one.scope.captures)} array(s) it is not given; pass every "
                        "array the step reads as a parameter, fixed_point(step, x0, *params), so that the derivative "
                        "reaches it" + at)
    out = one.atoms(trace, [one.out], "step")[0]
    step_prog = Program(list(one.locals), list(one.scope.eqns), [out])
    floats = [is_float(a) for a in p_avals]
    vjp_x = _cotangents(step_prog, [True] + [False] * len(p_avals))
    vjp_p = _cotangents(step_prog, [False] + floats) if any(floats) else None
    jvp_x = _tangent(step_prog, [True] + [False] * len(p_avals))        # (x, p, xdot) -> J xdot
    jvp_p = _tangent(step_prog, [False] + floats)                       # (x, p, pdot) -> B pdot
    settle, series, norm = _settler(shape, dtype), _neumann(shape, dtype), _norm(shape, dtype)
    finish, copy = _finisher(shape, dtype), _copier(shape, dtype)

    def mark(planes):
        """A clear mark per sample, along every plane (per instance under vmap when any is)."""
        done = _fresh(_samples_of(planes[0]))
        for p in planes[1:]:
            done = _along(done, _samples_of(p))
        return done

    def solve(x, planes):
        """The forward loop: (the last iterate, the converged mark)."""
        done = mark([x] + list(planes))
        xs = copy(x, done)
        one_ = _ones(done)
        _iterate(trace.graph, lambda: settle(xs, call_step(xs, planes), done, one_, cfg.tol), done, cfg.max_steps)
        return copy(xs, done), done

    def planes_of(args):
        return [args[k] for k in plane_at]

    def linear(seed, apply, planes):
        """The Neumann series s <- seed + apply(s), to tol relative to |seed|: (s, its settled mark, |seed|)."""
        scale = norm(seed)
        done = mark([seed] + list(planes))
        s = copy(seed, done)
        _iterate(trace.graph, lambda: series(s, seed, apply(s), done, scale, cfg.tol), done, cfg.max_steps)
        return s, done, scale

    def fun(x, *args):
        return solve(x, planes_of(args))[0]

    def fwd(x, *args):
        xs, ok = solve(x, planes_of(args))
        return xs, (xs, ok)

    def bwd(res, xbar):
        xs, ok = res
        planes = planes_of(params)
        u, again, scale = linear(xbar, lambda s: _apply(trace, vjp_x, [xs] + planes + [s])[0], planes)
        u = finish(u, ok, again, scale)
        cts = [None] * len(params)
        if vjp_p is not None:
            got = iter(_apply(trace, vjp_p, [xs] + planes + [u]))
            for k, f in zip(plane_at, floats):
                if f:
                    cts[k] = next(got)
        return (None, *cts)

    def jvp(primals, tangents):
        planes = planes_of(primals[1:])
        xs, ok = solve(primals[0], planes)
        p_dots = [t for k, t in enumerate(tangents[1:]) if k in plane_at]
        p_dots = [t for t, f in zip(p_dots, floats) if f]
        b = _apply(trace, jvp_p, [xs] + planes + p_dots)[0]
        t, again, scale = linear(b, lambda s: _apply(trace, jvp_x, [xs] + planes + [s])[0], planes)
        return xs, finish(t, ok, again, scale)

    rules = _Rules(fun)
    rules.__name__ = name
    rules.defvjp(fwd, bwd)
    rules.jvp = jvp
    return rules(x0, *params)


def _cotangents(prog, wrt) -> Program:
    """(inputs..., a cotangent of the output) -> the cotangents of the inputs flagged in `wrt`."""
    v = vjp_graph._Vjp(lambda trip, e: None, API)
    v.top = set(prog.inputs)
    return _lean_calls(v.program(prog, wrt, values=False))


def _tangent(prog, flags) -> Program:
    """(inputs..., a tangent per input flagged) -> the output's tangent."""
    jp = jvp_graph(prog, flags, force=[True])[0]
    return _lean_calls(jp.replace(outputs=jp.outputs[1:]))


def _lean_calls(prog) -> Program:
    """`prog` with each kernel derivative call computing only the outputs read (a kernel's vjp
    gives every parameter's cotangent, its jvp the value too; a series turn reads one, and a
    Param's cotangent is a sum over the samples)."""
    read = {a for e in prog.eqns for a in e.inputs if isinstance(a, Var)} | \
        {a for a in prog.outputs if isinstance(a, Var)}
    eqns = []
    for e in prog.eqns:
        spec = e.params.get("spec")
        keep = [k for k, o in enumerate(e.outputs) if o in read]
        if e.prim is ir.call_p and isinstance(spec, BodySpec) and not spec.commits and not e.params.get("inplace") \
                and keep and len(keep) < len(e.outputs):
            body = _dce(spec.prog.replace(outputs=[spec.prog.outputs[k] for k in keep]))
            lean = BodySpec(body, spec.kernel.name)
            e = Eqn(e.prim, e.inputs, [e.outputs[k] for k in keep],
                    dict(e.params, kernel=lean.kernel, spec=lean), e.info)
        eqns.append(e)
    return dce(prog.replace(eqns=eqns))


def _apply(trace, prog, args) -> list:
    """Stage `prog`'s equations into the builder's current scope, reading the planes `args`;
    returns its outputs as planes."""
    scope = trace.scope
    ins, reads = [], []
    for a in args:
        if isinstance(a, (int, float)):
            ins.append(Literal(a))
            continue
        key = trace.key_of(a, API, "an operand")
        ins.append(scope.read(key))
        reads.append((key, "in"))
    eqns = Eqns()
    outs = inline(prog, ins, eqns)
    scope.eqns.extend(eqns)
    info = trace.info()
    handles, writes = [], []
    for o in outs:
        if isinstance(o, Literal):
            raise AssertionError("eagle_fx.fixed_point: a derivative program returned a literal")
        h = trace.new_plane(o.aval, info, o)
        scope.define(h.key, o)
        handles.append(h)
        writes.append((h.key, "out"))
    trace.add_access(info, reads, writes, API)
    return handles


__all__ = ["fixed_point"]
