"""Forward and reverse mode on staged graphs: jvp, vjp, grad, value_and_grad.

Arguments are trees (tuples, lists, dicts, NamedTuples, dataclasses) of arrays and Python values;
each floating array leaf is differentiable, and a derivative comes back as a tree of the
argument's shape (None at leaves that are not floating arrays: cells, integers, Python values).
A Python float or a 0-d array in a differentiated position is staged as a one-cell array and its
derivative given back 0-d, as JAX does.
"""
from __future__ import annotations

import numpy as np

from hawk_fx.caches import LRU
from hawk_fx.context import CONTEXT
from hawk_fx.core import Eqn, Var
from hawk_fx.diff import match_tree
from hawk_fx.emit.jax import is_jax_array
from hawk_fx.tree import tree_flatten, tree_unflatten

from .frontend import cache
from . import ir
from .graph import Graph
from .frontend.guards import release
from .api import (Staged, Transformed, holds_jax_arrays, jax_function, traced_hint, arg_names, argnums_checked,
                  argnums_of, float_array, graph_of, is_array, name_of, refuse_no_float, run, sig)
from .frontend.staging import Extern
from .transforms.jvp_graph import jvp_graph
from .transforms.program import ct_aval, is_float
from .transforms.reverse_again import recompute_unbounded, static_stacks
from .transforms.vjp_graph import vjp_graph
from .result_views import restored_views
from .staged_results import staged_result
from .vjp_inside import vjp_inside
from . import seams
from .frontend.guards import where


def _is_scalar_float(x):
    return (isinstance(x, (float, np.floating)) and not isinstance(x, bool)) or \
        (isinstance(x, np.ndarray) and x.ndim == 0 and x.dtype.kind == "f")


def _one_cell(x, weak=np.float64):
    """A one-cell array of `x`; of a 0-d array, a view, so a graph staged inside another transform
    (vmap) reads the array it was given, not a copy baked in. A Python float takes `weak`."""
    if isinstance(x, np.ndarray):
        return x.reshape(1)
    return np.array([x], dtype=x.dtype if isinstance(x, np.generic) else weak)


class Promoted(set):
    """The (argument, leaf) pairs `promote` made one-cell. `weak`: those that were Python floats,
    weakly typed as in JAX: staged in the dtype of the call's float arrays (float32 beside float32
    arrays), while a derivative with respect to one comes back float64, a Python float's dtype."""

    def __init__(self):
        super().__init__()
        self.weak = set()


def promote(args, positions):
    """The arguments with Python floats and 0-d arrays at `positions` (leaf by leaf) made one-cell
    arrays, and the set of (argument, leaf) promoted (a Promoted)."""
    out, promoted, weak = list(args), Promoted(), None
    for k in positions:
        leaves, t = tree_flatten(args[k], is_leaf=is_array)
        for j, x in enumerate(leaves):
            if _is_scalar_float(x):
                if type(x) is float:
                    weak = weak or cache.weak_float(args)
                    promoted.weak.add((k, j))
                leaves[j] = _one_cell(x, weak)
                promoted.add((k, j))
        if any(p[0] == k for p in promoted):
            out[k] = tree_unflatten(t, leaves)
    return tuple(out), promoted


def _demote(tree, k, promoted, shape=True):
    """Argument k's derivative tree with the leaves promoted by `promote` back to 0-d (shape=False:
    shapes kept) and those of Python floats made float64, as JAX gives them."""
    if not any(p[0] == k for p in promoted):
        return tree
    leaves, t = tree_flatten(tree, is_leaf=lambda x: x is None or is_array(x))
    for j, x in enumerate(leaves):
        if (k, j) in promoted and x is not None:
            x = x.reshape(()) if shape else x
            leaves[j] = x.astype(np.float64) if (k, j) in promoted.weak else x
    return tree_unflatten(t, leaves)


# ---------------------------------------------------------------------------------------------
# forward mode

def jvp(f, primals, tangents):
    """(result, result tangent) for tangents given per argument: a tree like the argument's, or
    None (no tangent; a cell or integer leaf takes None)."""
    return jvp_as(f, primals, tangents, "eagle_fx.jvp")


def jvp_as(f, primals, tangents, api):
    """jvp for the API the user called (jacfwd, hessian, linearize): its refusals name `api`."""
    if not (CONTEXT.abstract or CONTEXT.transforming or CONTEXT.guards):   # NumPy arrays, a layout seen: replay
        # sig("jvp", f), written out: the hit path builds no key
        out = cache.replay_hit_pair(("jvp", f._sig if isinstance(f, Transformed) else f), primals, tangents)
        if out is not cache.MISS:
            return out
    if not CONTEXT.abstract and holds_jax_arrays(tuple(primals) + tuple(tangents)):   # on XLA: JAX's jvp
        import jax
        fn, arrays = jax_function(f, tuple(primals))
        kept = [t if t is not None else jax.numpy.zeros_like(p) for p, t in zip(primals, tangents)
                if isinstance(p, np.ndarray) or is_jax_array(p)]
        return jax.jvp(fn, tuple(arrays), tuple(kept))
    primals, tangents = release(tuple(primals)), release(tuple(tangents))
    if len(primals) != len(tangents):
        raise ValueError(f"{api}: {len(primals)} primals and {len(tangents)} tangents; give one tangent (or None) "
                         "per argument")
    names = arg_names(f, len(primals))
    cast = weak_cast(f, primals)
    given = primals
    primals, tangents = _check_tangents(primals, tangents, names, api)
    if CONTEXT.transforming:                     # for the outer transform: lowered only if run
        c = _jvp_graph(f, primals, tangents, names, api)
        cast = _then(inner_restore(f, given, primals)[1], cast)
        return staged_result(restored_views(c, lambda out: tuple(map(cast, out))) if cast else c)
    primals, traced = cache.traced_floats(primals, cache.static_of(f), api)
    cast = _then(inner_restore(f, given, primals)[1], cast)
    with traced_hint(api, traced), cache.staged(sig("jvp", f), (primals, tangents),
                                                lambda p, t: _jvp_graph(f, p, t, names, api), Graph.from_closed) as e:
        out = run(e.graph)
    return tuple(map(cast, out)) if cast else out


def _then(restore, cast):
    """`restore` (shapes and dtypes of an inner derivative's result), then `cast`; either may be None."""
    if restore is None or cast is None:
        return restore or cast
    return lambda out: cast(restore(out))


def weak_cast(f, primals):
    """For a derivative transform `f` whose caller stages a Python float it differentiates as a
    one-cell array (jvp with a tangent for it, jacfwd), which `f` then cannot tell from an array:
    the cast that makes f's derivative with respect to it float64, as f called at the float itself
    gives it (and JAX). None when there is nothing to cast."""
    if not isinstance(f, Transformed) or f._prepare is None or \
            not any(type(x) is float for p in primals for x in tree_flatten(p, is_leaf=is_array)[0]):
        return None
    return getattr(f._prepare(tuple(primals))[1], "cast", None)


def inner_restore(f, given, staged, others=False):
    """For a derivative transform `f` that an outer transform stages at `staged`, its arguments
    `given` with some Python-float (or 0-d) leaves made one-cell arrays, which `f` then cannot tell
    from arrays: (the arguments to stage f at, f's restore of those leaves: the shapes and dtypes
    f called at the scalars gives, and JAX), or (staged, None) when f is no derivative transform
    or none of its scalars was made one-cell. others: the scalars still in `staged` are made
    one-cell too (and restored); else they are left to f, which sees them."""
    if not isinstance(f, Transformed) or f._prepare is None:
        return staged, None
    probe, changed = [], False
    for a, b in zip(given, staged):
        la, (lb, tb) = tree_flatten(a, is_leaf=is_array)[0], tree_flatten(b, is_leaf=is_array)
        if len(la) != len(lb):
            probe.append(b)
            continue
        mixed = []
        for x, y in zip(la, lb):
            made = x is not y and np.shape(y) == (1,)
            if _is_scalar_float(x) and (made or others and x is y):
                mixed.append(x)
                changed = True
            else:
                mixed.append(_one_cell(y) if _is_scalar_float(y) else y)   # left to f: hidden from its restore
        probe.append(tree_unflatten(tb, mixed) if len(mixed) != 1 or tb.kind != "leaf" else mixed[0])
    if not changed:
        return staged, None
    return f._prepare(tuple(probe))


def _check_tangents(primals, tangents, names, api):
    """Primals and tangents with Python-float primals that have a tangent made one-cell arrays."""
    ps, ts = list(primals), list(tangents)
    for k, (p, t) in enumerate(zip(primals, tangents)):
        if t is None:
            continue
        p_leaves, p_tree = tree_flatten(p, is_leaf=is_array)
        t_leaves = match_tree(t, p_tree)
        if t_leaves is None:
            raise ValueError(f"{api}: the tangent for argument {names[k]} has structure {tree_flatten(t)[1]}; the "
                             f"argument has {p_tree}: give a tangent tree of the same structure (None leaves allowed)")
        for j, (pl, tl) in enumerate(zip(p_leaves, t_leaves)):
            if tl is None:
                continue
            if _is_scalar_float(pl) and np.ndim(tl) == 0:
                p_leaves[j] = _one_cell(pl, cache.weak_float(primals))
                t_leaves[j] = _one_cell(np.asarray(tl, dtype=p_leaves[j].dtype))
                continue
            if not float_array(pl) or np.shape(tl) != np.shape(pl) or np.asarray(tl).dtype != pl.dtype:
                need = f"{np.shape(pl)} {pl.dtype}, or None" if float_array(pl) else \
                    "None (it is not a floating array)"
                at = names[k] if p_tree.kind == "leaf" else f"{names[k]} (leaf {j})"
                raise ValueError(f"{api}: the tangent for argument {at} has shape {np.shape(tl)} and dtype "
                                 f"{np.asarray(tl).dtype}; it needs {need}")
        ps[k], ts[k] = tree_unflatten(p_tree, p_leaves), tree_unflatten(p_tree, t_leaves)
    return tuple(ps), tuple(ts)


def _jvp_graph(f, primals, tangents, names, api):
    s = Staged(f, primals, api)
    t_leaves = [tree_flatten(t, is_leaf=lambda x: x is None or is_array(x))[0] if t is not None else None
                for t in tangents]

    def tangent_of(a):
        return None if a is None or t_leaves[a[0]] is None else t_leaves[a[0]][a[1]]
    with_tangent = [(k, j) for k, ls in enumerate(t_leaves) if ls is not None for j, t in enumerate(ls) if t is not None]
    s.refuse_views(with_tangent)
    s.refuse_made(with_tangent)
    flags = [tangent_of(a) is not None for a in s.arg_of]
    force = [is_float(v.aval) for v in s.results]
    jp, out_flags = jvp_graph(s.prog, flags, force)
    k = len(s.results)
    outs, eqns = list(jp.outputs[:k]), list(jp.eqns)
    t_iter = iter(jp.outputs[k:])
    for v, fl in zip(s.results, out_flags):          # an integer result's tangent: float zeros
        if fl:
            outs.append(next(t_iter))
        else:
            z = Var(ct_aval(v.aval))
            eqns.append(Eqn(ir.zeros_p, [], [z], {"aval": z.aval}))
            outs.append(z)
    jp = jp.replace(eqns=eqns)
    t_planes = [Extern(s.tangent_plane(i, tangent_of(a)), f"t_{names[a[0]]}")
                for i, (a, fl) in enumerate(zip(s.arg_of, flags)) if fl]
    c = graph_of(s, jp, (tree_unflatten(s.tree, outs[:k]), tree_unflatten(s.tree, outs[k:])), t_planes)
    if s.g.views:                     # a tangent is seen as its primal is (a Jacobian's axes)
        c.views = list(s.g.views) * 2
    return c


# ---------------------------------------------------------------------------------------------
# reverse mode

def vjp_program(s: Staged, wrt, api, checkpoints=None):
    """The vjp Program of the staged graph: (inputs, a cotangent per float result) -> (results, a
    cotangent per (argument, leaf) in `wrt`, zeros for one the graph does not read). checkpoints=K:
    each device loop keeps at most K of its states and recomputes the others (binomial schedule)."""
    s.reversible()
    s.refuse_views(wrt)
    s.refuse_made(wrt)
    want = set(wrt)
    flags = [a is not None and a in want for a in s.arg_of]
    with recompute_unbounded(static_stacks([p.array for p in s.planes])):   # no stack XLA cannot size
        vp = vjp_graph(s.prog, flags, s.capacity, api, checkpoints)
    k = len(s.results)
    eqns, outs = list(vp.eqns), list(vp.outputs[:k])
    grads = s.cotangents(flags, vp.outputs[k:], eqns, api)
    for a in wrt:
        if a not in grads:
            x = s.leaves[a[0]][a[1]]
            z = Var(ct_aval(ir.plane_aval(x.shape, x.dtype)))
            eqns.append(Eqn(ir.zeros_p, [], [z], {"aval": z.aval}))
            grads[a] = z
        outs.append(grads[a])
    return vp.replace(eqns=eqns, outputs=outs)


def seed_planes(s, values=None):
    """Extern planes for the cotangent inputs, one per float result: values[j] for the j-th float
    result (None, or no values: zeros)."""
    out = []
    for j, v in enumerate(r for r in s.results if is_float(r.aval)):
        a = ct_aval(v.aval)
        val = release(values[j]) if values is not None and j < len(values) else None   # vmap finds the instance by id
        out.append(Extern(val if val is not None else np.zeros(a.shape, a.dtype), "ct", "added"))
    return out


def _grad_trees(s, prog, ks, wrt):
    """Per argument in ks, its tree of gradient Vars (None at leaves that are not floating arrays)."""
    gvars = dict(zip(wrt, prog.outputs[len(s.results):]))
    return tuple(tree_unflatten(s.arg_trees[k], [gvars.get((k, j)) for j in range(len(s.leaves[k]))]) for k in ks)


def _looks_like_aux(s):
    """A result (value, aux): a pair whose first part is one floating value."""
    t = s.tree
    if t.kind not in ("tuple", "list") or len(t.children) != 2 or t.children[0].num_leaves != 1 or len(s.results) < 2:
        return False
    v = s.results[0]
    return int(np.prod(v.aval.shape)) == 1 and is_float(v.aval)


def _split_aux(s, has_aux, api):
    """(the number of primal result leaves, the aux tree or None) of a has_aux function."""
    if not has_aux:
        return len(s.results), None
    t = s.tree
    if t.kind not in ("tuple", "list") or len(t.children) != 2:
        raise TypeError(f"{api}: {s.fname} is given has_aux=True but its result is {t}; declare "
                        "g.result = (value, aux), aux any tree of arrays")
    return t.children[0].num_leaves, t.children[1]


def vjp(f, *args, has_aux=False, checkpoints=None):
    """(result, pullback) or, has_aux, (result, pullback, aux): pullback(cotangent tree) -> a
    cotangent tree per positional argument (None at leaves that are not floating arrays; 0-d for
    a Python float). checkpoints=K: the reverse through a device loop keeps at most K of its
    states and runs the loop again from them (less memory, more time; see docs, Checkpointing)."""
    return vjp_as(f, args, "eagle_fx.vjp", has_aux, checkpoints)


def vjp_as(f, args, api, has_aux=False, checkpoints=None):
    """vjp for the API the user called (linear_transpose): its refusals name `api`."""
    if not CONTEXT.abstract and holds_jax_arrays(args):        # on XLA: JAX's vjp of the JAX function
        import jax
        fn, arrays = jax_function(f, args)
        return jax.vjp(fn, *arrays, has_aux=has_aux)
    if CONTEXT.transforming:                     # staged values and a pullback that stages the vjp
        return vjp_inside(f, args, api, has_aux, checkpoints)

    def make(*args):
        s = Staged(f, args, api)
        n_out, aux_tree = _split_aux(s, has_aux, api)
        wrt = [(k, j) for k, ls in enumerate(s.leaves) for j, x in enumerate(ls) if float_array(x)]
        prog = vjp_program(s, wrt, api, checkpoints)
        seeds = seed_planes(s)
        out_tree = s.tree.children[0] if has_aux else s.tree
        aux = tree_unflatten(aux_tree, prog.outputs[n_out:len(s.results)]) if has_aux else None
        # one functional graph gives the result (at zero seeds) and the pullback
        c = graph_of(s, prog, (tree_unflatten(out_tree, prog.outputs[:n_out]), aux,
                               _grad_trees(s, prog, range(len(args)), wrt)), seeds)
        c.extra = (s, seeds, n_out, out_tree)
        return c
    given = args
    args, promoted = promote(args, range(len(args)))     # Python floats are differentiable, as in JAX
    inner = None if has_aux else inner_restore(f, given, args)[1]   # vjp(grad(f)) at a float: grad's shapes
    with cache.staged(sig("vjp", f, has_aux, *_opt(checkpoints)), args, make, Graph.from_closed) as e:
        g = e.graph
        s, seeds, n_out, out_tree = e.closed.extra
        y, aux, _ = run(g)
        # the cached graph may run other calls before this pullback: it keeps the arguments it saw
        saved = [None if o is None else np.array(o) for o in e.owned] if e.owned is not None else None
    float_out = [j for j, v in enumerate(s.results[:n_out]) if is_float(v.aval)]
    if inner is not None:
        y = inner(y)
        shown = tree_flatten(y, is_leaf=lambda u: u is None or is_array(u))[0]

    def pullback(ct):
        leaves = match_tree(ct, out_tree)
        if leaves is None:
            raise ValueError(f"{api}: the cotangent has structure {tree_flatten(ct)[1]}; {s.fname}'s result is "
                             f"{out_tree}: give one cotangent array per result array, in the same tree")
        cs = [np.asarray(leaves[j]) for j in float_out]
        if inner is not None:        # given in the shapes the result is shown in
            cs = [c.reshape(p.array.shape) if c.shape == np.shape(shown[j]) else c
                  for c, p, j in zip(cs, seeds, float_out)]
        for c, p, j in zip(cs, seeds, float_out):
            if c.shape != p.array.shape:
                want = np.shape(shown[j]) if inner is not None else p.array.shape
                raise ValueError(f"{api}: the cotangent of result {j} has shape {c.shape}; the result has "
                                 f"{want}")
        with e.lock:
            for c, p in zip(cs, seeds):
                np.copyto(p.array, c)
            if saved is not None:
                e.bind(saved)
            cts = run(g)[2]
        return tuple(_demote(c, k, promoted) for k, c in enumerate(cts)) if promoted else cts
    return (y, pullback, aux) if has_aux else (y, pullback)


def grad(f, argnums=0, has_aux=False, checkpoints=None):
    """The gradient of `f`, whose result is one value (a one-cell array, e.g. from hawk.sum), with
    respect to argument(s) `argnums` (an int, or a tuple: a tuple of gradients). Each gradient is a
    tree shaped like its argument. has_aux: `f`'s result is (value, aux); returns (gradient, aux).
    checkpoints=K: the reverse through a device loop keeps at most K of its states and runs the
    loop again from them (less memory, more time; see docs, Checkpointing)."""
    return _gradient(f, argnums, has_aux, False, "eagle_fx.grad", checkpoints)


def value_and_grad(f, argnums=0, has_aux=False, checkpoints=None):
    """(value, gradient) of `f` in one graph; has_aux: ((value, aux), gradient), as jax.value_and_grad."""
    return _gradient(f, argnums, has_aux, True, "eagle_fx.value_and_grad", checkpoints)


_MADE = LRU("grad and value_and_grad of functions", 256)   # (api, f, argnums, has_aux, checkpoints) -> its
#                                                             Transformed: grad(f) in a loop makes one


def _opt(checkpoints):
    """The checkpoints option as extra cache-key parts (none when not given)."""
    return () if checkpoints is None else (("checkpoints", checkpoints),)


def _gradient(f, argnums, has_aux, with_value, api, checkpoints=None):
    if type(argnums) is not int:
        argnums_checked(argnums, api)         # refused when made, and never a key (0.0 == 0)
    key = (api, f, argnums, has_aux, checkpoints)
    made = _MADE._data
    try:
        t = made.get(key)
    except TypeError:                 # an unhashable argnums (a list)
        key, t = None, None
    if t is not None:
        try:                          # the most recent use, as LRU.get makes it
            made.move_to_end(key)
        except KeyError:              # forgotten meanwhile by another thread
            pass
        return t
    t = _new_gradient(f, argnums, has_aux, with_value, api, checkpoints)
    if key is not None:
        _MADE[key] = t
    return t


def _new_gradient(f, argnums, has_aux, with_value, api, checkpoints=None):
    def make(*args):
        ks, multi = argnums_of(argnums, len(args), api)
        for k in ks:                 # before staging: an integer argument may not even stage (an arm's dtype)
            if not any(float_array(x) for x in tree_flatten(args[k], is_leaf=is_array)[0]):
                refuse_no_float(seams.composition(api, name_of(f)), arg_names(f, len(args))[k], args[k],
                                where(getattr(f, "fn", None) or f))
        s = Staged(f, args, api)
        wrt = []
        for k in ks:
            here = [(k, j) for j, x in enumerate(s.leaves[k]) if float_array(x)]
            if not here:
                refuse_no_float(seams.composition(api, name_of(f)), arg_names(f, len(args))[k], args[k],
                                where(getattr(f, "fn", None) or f))
            wrt += here
        n_out, aux_tree = _split_aux(s, has_aux, api)
        v = s.results[0]
        if not has_aux and _looks_like_aux(s):
            fn = api.split('.')[-1]
            raise TypeError(f"{seams.composition(api, s.fname)}: {where(getattr(f, 'fn', None) or f)} returns a pair "
                            f"whose first part is one value, (value, aux), and {fn} needs one value. Pass has_aux=True: eagle_fx.{fn}({s.fname}, "
                            f"has_aux=True) returns " + ("((value, aux), gradient)" if with_value else
                                                          "(gradient, aux)") + "; or return the value alone")
        if n_out != 1 or int(np.prod(v.aval.shape)) != 1 or not is_float(v.aval):
            shapes = [r.aval.shape for r in s.results[:n_out]]
            jac = getattr(f, "__name__", "").startswith(("jacrev(", "jacfwd(", "hessian("))
            raise TypeError(f"{api}: {s.fname} returns {shapes}" + (", a Jacobian" if jac else "") +
                            f"; {api.split('.')[-1]} needs one value (a one-cell "
                            "float result, e.g. from hawk.sum)" + (", then the aux tree: g.result = (value, aux)"
                                                                    if has_aux else "") +
                            ("; for second derivatives use eagle_fx.hessian(f), eagle_fx.jacfwd(eagle_fx.jacrev(f)) "
                             "or eagle_fx.jacrev(eagle_fx.jacrev(f))" if jac else
                             "; for other results use eagle_fx.vjp or eagle_fx.jacrev") +
                            (f" (in {seams.composition(api, s.fname)})" if seams.inside() else ""))
        prog = vjp_program(s, wrt, api, checkpoints)
        grads = _grad_trees(s, prog, ks, wrt)
        grads = grads if multi else grads[0]
        value = prog.outputs[0]
        aux = tree_unflatten(aux_tree, prog.outputs[1:len(s.results)]) if has_aux else None
        if with_value:
            out = ((value, aux) if has_aux else value, grads)
        else:
            out = (grads, aux) if has_aux else grads
        ones = np.ones(v.aval.shape, ct_aval(v.aval).dtype)
        return graph_of(s, prog, out, seed_planes(s, [ones]))

    def prepare(args):
        if type(argnums) is int and -len(args) <= argnums < len(args):
            a = args[argnums]
            if type(a) is np.ndarray and a.ndim:          # the common case: nothing to promote
                return args, None
        ks, multi = argnums_of(argnums, len(args), api)
        args, promoted = promote(args, ks)
        if not promoted:
            return args, None

        def restore(out, shape=True):
            if has_aux or with_value:
                head, grads = (out[1], out[0]) if not with_value else (out[0], out[1])
            else:
                grads = out
            fixed = tuple(_demote(g, k, promoted, shape) for g, k in zip(grads if multi else (grads,), ks))
            fixed = fixed if multi else fixed[0]
            if with_value:
                return head, fixed
            return (fixed, head) if has_aux else fixed
        if promoted.weak:             # for vmap, whose instances' shapes are already the caller's
            restore.cast = lambda out: restore(out, shape=False)
        floats = [(k, j) for k in ks for j, x in enumerate(tree_flatten(args[k], is_leaf=is_array)[0])
                  if float_array(x)]
        if not (has_aux or with_value) and len(floats) == 1 and floats[0] in promoted:
            restore.one = lambda shape: ()      # its one result (an outer Jacobian's function): 0-d
        return args, restore
    return Transformed(f"{api.split('.')[-1]}({name_of(f)})", make, prepare=prepare,
                       sig=sig(api, f, argnums, has_aux, *_opt(checkpoints)), promotes=argnums_checked(argnums, api)[0])
