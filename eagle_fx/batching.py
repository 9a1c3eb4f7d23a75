"""vmap: B independent instances of a staged graph in one graph (transforms/vmap.py batches the
Program). in_axes and out_axes are prefix trees, as in JAX: an int or None applies to every leaf
below it."""
from __future__ import annotations

import numpy as np

try:
    from numpy.lib.array_utils import byte_bounds
except ImportError:                      # NumPy < 2
    byte_bounds = np.byte_bounds

from hawk_fx.core import Eqn, Var
from hawk_fx.context import CONTEXT
from hawk_fx.tree import node_children, tree_flatten, tree_unflatten

from .frontend import cache
from . import ir, seams
from .frontend.building import Builder
from .api import Transformed, is_array, name_of, sig, stage
from .frontend.staging import Extern
from .staged_results import lead_view
from .transforms.reverse_again import holds_reverse, recomputing, reversible
from .transforms.program import written_inputs
from .transforms.vmap import VmapError, batch_broadcast_p, batch_program


def _axes(in_axes, n, api):
    if isinstance(in_axes, (int, type(None))):
        return [in_axes] * n
    axes = list(in_axes)
    if len(axes) != n:
        raise ValueError(f"{api}: in_axes has {len(axes)} entries for {n} positional arguments; give one per "
                         "argument (an int axis or None)")
    return axes


def _returns_graph(f):
    return isinstance(f, Builder) or (isinstance(f, Transformed) and not f._values)


def vmap(f, in_axes=0, out_axes=0):
    """Batch `f` over an axis of its array arguments: B independent instances in one graph.

    in_axes: per positional argument, the batch axis (usually 0) or None (shared by all instances);
    for a tree argument, a tree prefix of it ({"w": 0, "b": None}). out_axes: a prefix of the result.
    Per-sample planes (B, n), Vector planes (B, k, n), cells (B, 1), Params (B,) or (B, 1).
    A device condition that differs by instance runs every arm (each instance keeps its own) and a
    loop with per-instance guards runs until every instance is done, finished ones frozen.
    vmap of a builder is a builder (it returns the Graph); of any other function, it returns values."""
    api = "eagle_fx.vmap"
    name = name_of(f)
    for ax in tree_flatten(out_axes)[0]:
        if ax not in (0, None):
            raise ValueError(f"{api}({name}): out_axes {ax!r}: results take the batch axis first (0) or are shared "
                             "(None); move it afterwards with np.moveaxis")

    def make(*args):
        axes = _axes(in_axes, len(args), api)
        if isinstance(f, Transformed) and f._vmap_of is not None and not _differentiating():
            return _nested(f, args, axes, out_axes, api, name)
        return _batch(f, args, axes, out_axes, api, name)
    static = cache.static_of(f)
    if in_axes is not None and static is not cache.ALL:   # only shared (None) arguments trace their floats
        static = cache.ALL if isinstance(in_axes, int) else \
            {k: None for k, ax in enumerate(in_axes) if ax is not None} | static
    return Transformed(f"vmap({name})", make, values=not _returns_graph(f), vmap_of=(f, in_axes, out_axes),
                       sig=sig("vmap", f, in_axes, out_axes), static=static, prepare=_shared_floats(f, in_axes))


def _float_number(x):
    return type(x) is float or isinstance(x, np.floating)


def _shared_floats(f, in_axes):
    """For vmap of a derivative transform (grad, jacfwd...): a Python float in a shared argument
    that the transform differentiates is handed to it as a 0-d array, so each instance's derivative
    is 0-d, as the direct call gives it (and JAX), not one-cell as a traced float would make it.
    Other shared floats become one-cell arrays, as tracing makes them."""
    if not isinstance(f, Transformed) or f._prepare is None or isinstance(in_axes, int):
        return None
    user_static = cache.static_of(f)
    if user_static is cache.ALL:
        return None

    def prepare(args):
        if f._vmap_of is not None:          # a nested vmap: a float is shared at both levels, the inner decides
            return f._prepare(args)
        axes = _axes(in_axes, len(args), "eagle_fx.vmap")
        weak, out, at = None, list(args), []
        for k, (a, ax) in enumerate(zip(args, axes)):
            if ax is not None or k in user_static:
                continue
            leaves, tree = tree_flatten(a, is_leaf=is_array)
            if not any(_float_number(x) for x in leaves):
                continue
            weak = weak or cache.weak_float(args)
            out[k] = tree_unflatten(tree, [np.array(x, weak if type(x) is float else x.dtype) if _float_number(x)
                                           else x for x in leaves])
            at.append((k, [j for j, x in enumerate(leaves) if _float_number(x)]))
        if not at:
            return args, None
        # a derivative with respect to a Python float is float64 (JAX's), though staged as its 0-d stand-in
        cast = getattr(f._prepare(args)[1], "cast", None)
        seen = f._prepare(tuple(out))[0]           # which of them the transform differentiates (made one-cell)
        for k, js in at:
            leaves, tree = tree_flatten(out[k], is_leaf=is_array)
            promoted = tree_flatten(seen[k], is_leaf=is_array)[0]
            for j in js:
                if np.shape(promoted[j]) == ():
                    leaves[j] = leaves[j].reshape(1)
            out[k] = tree_unflatten(tree, leaves)
        return tuple(out), cast
    return prepare


def _differentiating():
    """Is a derivative staging this vmap? Then vmap(vmap(f)) batches the batched program again
    rather than merging its arguments' batch axes in Python: derivatives follow the arrays given
    to the graph, which a merge would replace by reshaped copies."""
    return any(a in _DERIVATIVES for a in seams.inside())


_DERIVATIVES = {f"eagle_fx.{n}" for n in ("jvp", "vjp", "grad", "value_and_grad", "jacfwd", "jacrev", "hessian",
                                          "linearize", "linear_transpose")}


def prefix_leaves(prefix, value, api, what):
    """The axis the prefix tree `prefix` gives each array leaf of `value`, in order."""
    out = []

    def go(p, v):
        if p is None or isinstance(p, int):
            out.extend([p] * len(tree_flatten(v, is_leaf=is_array)[0]))
            return
        np_, nv = node_children(p), node_children(v)
        if np_ is not None and nv is not None and np_[0] == nv[0] == "dict" and set(p) == set(v):
            for key in v:
                go(p[key], v[key])
            return
        if np_ is None or nv is None or np_[0] != nv[0] or np_[1] != nv[1] or len(np_[2]) != len(nv[2]):
            raise ValueError(f"{api}: {what}: the axes {p!r} do not match its structure {tree_flatten(v)[1]}; "
                             "give an int, None, or a tree of the same structure (a prefix of it)")
        for a, c in zip(np_[2], nv[2]):
            go(a, c)
    go(prefix, value)
    return out


def _batch(f, args, axes, out_axes, api, name):
    B, first = None, None
    split = []       # per argument: (arg, tree, leaves, {leaf index: its batched array}, leaves given as (B,))
    for k, (arg, prefix) in enumerate(zip(args, axes)):
        leaves, tree = tree_flatten(arg, is_leaf=is_array)
        leaf_axes = prefix_leaves(prefix, arg, f"{api}({name})", f"in_axes of argument {k}")
        big, flat = {}, set()
        for j, (a, ax) in enumerate(zip(leaves, leaf_axes)):
            at = f"argument {k}" if tree.kind == "leaf" else f"argument {k} (leaf {j} of {tree})"
            if ax is None:
                continue
            if not isinstance(a, np.ndarray):
                raise TypeError(f"{api}({name}): {at} has in_axes {ax} but is {type(a).__name__}; only "
                                "arrays are batched: give it in_axes None")
            if not -a.ndim <= ax < a.ndim:
                raise ValueError(f"{api}({name}): in_axes {ax} for {at} of shape {a.shape}")
            if a.shape == (1,) and a.dtype == np.uint32:
                raise ValueError(f"{api}({name}): {at} is a one-cell array of shape {a.shape}; its only "
                                 "axis is the cell, not a batch: give it in_axes None, or stack B cells as (B, 1)")
            a = a if ax % a.ndim == 0 else np.moveaxis(a, ax, 0)    # the argument itself where it can: derivatives follow it
            if B is None:
                B, first = a.shape[0], at
            elif a.shape[0] != B:
                raise ValueError(f"{api}({name}): mismatched batch sizes: {first} has {B} instances "
                                 f"along its batch axis, {at} has {a.shape[0]}")
            if a.ndim == 1:                    # a batched Param or cell given as (B,)
                a = a[:, None]
                flat.add(j)
            big[j] = a
        split.append((arg, tree, leaves, big, flat))
    if B is None:
        raise ValueError(f"{api}({name}): no argument is batched; give at least one array an in_axes of 0")
    g, full = _stage_instance(f, split, 0, api)
    if not recomputing() and holds_reverse(g.program) and any(e.params.get("batch") for e in g.program.eqns):
        with reversible():       # a batched stack of saved turns is not batched again: turns recomputed instead
            return _batch(f, args, axes, out_axes, api, name)
    prog = g.program
    flags, planes = _batched_planes(f, split, g, full, B, api, name)
    bprog, out_flags = batch_program(prog, flags, B)
    leaves, tree = g.result_vars()
    outs = list(bprog.outputs)
    nres = len(leaves)
    oax = _out_axes(out_axes, tree, nres, api, name) if nres else []
    eqns = list(bprog.eqns)
    for j in range(nres):
        if oax[j] is None and out_flags[j]:
            raise ValueError(f"{api}({name}): result {j} differs by instance but out_axes is None for it; "
                             "give it out_axes 0")
        if oax[j] is not None and not out_flags[j]:
            v = Var(_batched(outs[j].aval, B))
            eqns.append(Eqn(batch_broadcast_p, [outs[j]], [v], {"size": B}))
            outs[j] = v
    bprog = bprog.replace(eqns=eqns, outputs=outs)
    return g.derive(bprog, planes, tree, nres, [lead_view(v, 1) for v in g.views] if g.views else None)


def _stage_instance(f, split, b, api):
    """f staged on instance b of the batched arguments; and id(instance array) -> its batched array."""
    inst, full = [], {}
    for arg, tree, leaves, big, _ in split:
        leaves = list(leaves)
        for j, a in big.items():
            leaves[j] = a[b] if len(a) else np.zeros(a.shape[1:], a.dtype)    # 0 instances: a stand-in gives the shapes
            full[id(leaves[j])] = a
        inst.append(tree_unflatten(tree, leaves) if tree.kind != "leaf" else leaves[0] if leaves else arg)
    inst, swaps = _zero_d_instances(f, split, inst)
    for old, new in swaps:          # keyed by the array staged: a dropped one's id may be reused
        full[id(new)] = full.pop(id(old))
    CONTEXT.batch_full.update(full)
    try:
        return stage(f, inst, api), full
    finally:
        for key in full:
            CONTEXT.batch_full.pop(key, None)


def _zero_d_instances(f, split, inst):
    """A (B,) argument's instance is 0-d, as in JAX: a derivative transform that differentiates it
    is handed a 0-d view (it stages a one-cell view of that, found by _view_of_instance) and gives
    each instance's derivative 0-d; anything else keeps the one-cell instance a Param takes."""
    if not isinstance(f, Transformed) or f._prepare is None or not any(fl for *_, fl in split):
        return inst, ()
    zero = [tree_flatten(x, is_leaf=is_array)[0] for x in inst]
    for ls, (*_, big, flat) in zip(zero, split):
        for j in flat:
            ls[j] = ls[j].reshape(())
    trees = [tree_flatten(x, is_leaf=is_array)[1] for x in inst]
    cand = [tree_unflatten(t, ls) if t.kind != "leaf" else ls[0] if ls else x for t, ls, x in zip(trees, zero, inst)]
    seen = f._prepare(tuple(cand))[0]
    out, swaps = list(inst), []
    for k, (x, y, (*_, flat)) in enumerate(zip(inst, seen, split)):
        ys = tree_flatten(y, is_leaf=is_array)[0]
        promoted = [j for j in flat if np.shape(ys[j]) == (1,)]
        if promoted:
            ls = tree_flatten(x, is_leaf=is_array)[0]
            for j in promoted:
                swaps.append((ls[j], zero[k][j]))
                ls[j] = zero[k][j]
            out[k] = tree_unflatten(trees[k], ls) if trees[k].kind != "leaf" else ls[0]
    return out, swaps


def _batched_planes(f, split, g, full, B, api, name):
    """(batched flag, plane) per input of g, staged on instance 0. An instance's own array is
    replaced by the batched one; a view of it made in Python (x[1:] in a plain function) by the
    same view of every instance; an array a plain function made while staging (x * 2.0, which
    may depend on the instance) is found by staging every instance: shared when every instance
    made the same values, else stacked, one per instance (what a loop over instances computes)."""
    insts = [(a[0], a) for _, _, _, big, _ in split for a in big.values() if len(a)]
    flags, planes, derived = [], [], []
    for p, e in enumerate(g.planes):
        big = full.get(id(e.array))
        if big is None and e.origin != "added" and isinstance(e.array, np.ndarray):
            big = _view_of_instance(e.array, insts, api, name)
        if big is None and e.origin == "derived":
            derived.append(p)
        flags.append(big is not None)
        planes.append(Extern(big if big is not None else e.array, e.name,
                             "added" if e.origin == "added" else "user"))
    if derived and B > 1:
        cache.uncacheable()
        text = str(g.program)
        made = [[g.planes[p].array] for p in derived]
        for b in range(1, B):
            gb, _ = _stage_instance(f, split, b, api)
            ins = gb.planes
            if len(ins) != len(planes) or str(gb.program) != text or \
                    any(ins[p].array.shape != m[0].shape or ins[p].array.dtype != m[0].dtype
                        for p, m in zip(derived, made)):
                raise VmapError(f"{api}({name}): {name} stages a different graph for instance {b} than for "
                                "instance 0: it computes on its arguments' values in Python (outside a builder) "
                                "and takes another path; write that computation inside a builder (NumPy on a "
                                "builder's arguments is staged) or in a kernel, with device conditions")
            for p, m in zip(derived, made):
                m.append(ins[p].array)
        for p, m in zip(derived, made):
            if any(not np.array_equal(x, m[0]) for x in m[1:]):
                stacked = np.stack(m)
                planes[p] = Extern(stacked[:, None] if stacked.ndim == 1 else stacked, planes[p].name)
                flags[p] = True
    return flags, planes


def _view_of_instance(v, insts, api, name):
    """The batched view of every instance matching `v`, a view of instance 0 of a batched
    argument made in Python (x[1:]), or None when `v` is not inside one."""
    lo, hi = byte_bounds(v)
    for a0, big in insts:
        lo0, hi0 = byte_bounds(a0)
        if hi0 <= lo or hi <= lo0:
            continue
        if not (lo0 <= lo and hi <= hi0) or big.strides[0] == 0:
            raise VmapError(f"{api}({name}): an array of shape {v.shape} the function hands its graph overlaps the "
                            "first instance of a batched argument without lying inside it; pass the batched "
                            "argument itself (or a view of one instance, x[1:])")
        b = np.lib.stride_tricks.as_strided(v, (big.shape[0],) + v.shape, (big.strides[0],) + v.strides,
                                            writeable=v.flags.writeable)
        return b[:, None] if b.ndim == 1 else b
    return None


def _out_axes(out_axes, tree, nres, api, name):
    """Per result leaf, its out axis: out_axes is a prefix of the result tree (or, as before, a
    flat tuple with one entry per leaf)."""
    try:
        return prefix_leaves(out_axes, tree_unflatten(tree, [np.zeros(0)] * nres), f"{api}({name})", "out_axes")
    except ValueError:
        if isinstance(out_axes, (tuple, list)) and len(out_axes) == nres:
            return list(out_axes)
        raise


def _nested(f, args, outer_axes, out_axes, api, name):
    """vmap(vmap(inner, in_axes=ia), in_axes=oa): one vmap over B2 * B1 instances, results seen as
    (B2, B1, ...). An argument batched by one level only is repeated along the other."""
    inner, ia, inner_out = f._vmap_of
    cache.uncacheable()                  # the arguments are repeated into new arrays: stage each call
    if out_axes != 0 or inner_out != 0:
        raise ValueError(f"{api}({name}): nested vmap takes out_axes 0 at both levels")
    B2 = B1 = None
    moved = []
    for k, (a, ax) in enumerate(zip(args, outer_axes)):
        if ax is not None:
            if not isinstance(a, np.ndarray) or not -a.ndim <= ax < a.ndim:
                raise ValueError(f"{api}({name}): in_axes {ax} for argument {k} of shape {np.shape(a)}")
            a = np.moveaxis(a, ax, 0)
            if B2 is not None and a.shape[0] != B2:
                raise ValueError(f"{api}({name}): mismatched batch sizes: {B2} and {a.shape[0]} instances (argument {k})")
            B2 = a.shape[0]
        moved.append(a)
    inner_axes = _axes(ia, len(args), api)
    combined, flat = [], []
    for k, (a, o, i) in enumerate(zip(moved, outer_axes, inner_axes)):
        if i is not None:
            one = a.shape[1:] if o is not None else a.shape
            if not -len(one) <= i < len(one):
                raise ValueError(f"{api}({name}): inner in_axes {i} for argument {k} of shape {one}")
            a = np.moveaxis(a, i + (1 if o is not None else 0) if i >= 0 else i, 1 if o is not None else 0)
            b1 = a.shape[1] if o is not None else a.shape[0]
            if B1 is not None and b1 != B1:
                raise ValueError(f"{api}({name}): mismatched inner batch sizes: {B1} and {b1} (argument {k})")
            B1 = b1
        combined.append((a, o, i))
    if B2 is None or B1 is None:
        raise ValueError(f"{api}({name}): each level of a nested vmap batches at least one argument")
    for a, o, i in combined:
        if o is not None and i is not None:
            flat.append(a.reshape((B2 * B1,) + a.shape[2:]))
        elif o is not None:
            flat.append(np.repeat(a, B1, axis=0))
        elif i is not None:
            flat.append(np.concatenate([a] * B2, axis=0))
        else:
            flat.append(a)
    axes = [0 if (o is not None or i is not None) else None for _, o, i in combined]
    g = _batch(inner, flat, axes, 0, api, name)
    written = [g.planes[i].array for i in written_inputs(g.program)]
    for k, (a, x) in enumerate(zip(args, flat)):
        if isinstance(x, np.ndarray) and isinstance(a, np.ndarray) and not np.may_share_memory(x, a) \
                and any(np.may_share_memory(w, x) for w in written):
            raise VmapError(f"{api}({name}): argument {k} is written in place (a Mutable or buffer=), and a nested "
                            "vmap hands the graph a copy of it (its two batch axes cannot be merged into one view, "
                            "or it is batched at one level only), so the writes would not reach your array: batch "
                            "it at both levels, outer axis first, in a C-contiguous array "
                            "(np.ascontiguousarray(np.moveaxis(...))) and read the writes from that array")
    inner_views = g.views or [None] * g.n_results     # an instance's own view (a 0-d derivative) kept
    g.views = [(B2, B1) + v.aval.shape[1:] if w is None else _split_lead(w, B2, B1)
               for v, w in zip(g.result_vars()[0], inner_views)]
    g.merged_by = f"vmap({name})"
    return g


def _split_lead(view, B2, B1):
    """`view` of a (B2 * B1, ...) result, its leading axis then seen as (B2, B1)."""
    def fn(a):
        t = view(a) if callable(view) else a.reshape(view)
        return t.reshape((B2, B1) + t.shape[1:])
    return fn


def _batched(aval, B):
    return ir.plane_aval((B,) + aval.shape, aval.dtype)
