"""Jacobians and Hessians: vmaps of jvp (forward) or of the vjp (reverse) over a basis.

jacfwd(f)(x) and jacrev(f)(x) have JAX's shape, result.shape + x.shape; for a tree argument (a
dict of arrays), a tree like it of such Jacobians, one per floating leaf (None at the others).
jacfwd(jacrev(f)) is JAX's Hessian recipe; it is staged as one vmap, over every (result
cotangent, tangent) pair of basis vectors, of the jvp of the vjp, because a batched graph is not
differentiated again. hessian(f) is jacfwd(jacrev(f)) with a one-cell result read as a scalar
(as grad reads it); for a tree argument, H[a][b] has shape a.shape + b.shape, as jax.hessian's.
A tuple argnums gives a tuple of Jacobians (nested tuples for hessian), computed one by one.
"""
from __future__ import annotations

import numpy as np

from hawk_fx.core import Var
from hawk_fx.tree import node_children, tree_flatten, tree_unflatten

from .api import (Staged, Transformed, argnums_checked, float_array, graph_of, is_array, name_of, refuse_no_float,
                  sig)
from . import seams
from .batching import vmap
from .derivatives import _grad_trees, inner_restore, jvp_as, promote, seed_planes, vjp_program, weak_cast
from .staged_results import then
from .transforms.program import ct_aval


def jacfwd(f, argnums=0):
    """The Jacobian of `f`'s one result with respect to argument `argnums`, by forward mode: a vmap
    of jvp over the basis of that argument. Shape: result.shape + argument.shape."""
    argnums = argnums_checked(argnums, "eagle_fx.jacfwd")
    if isinstance(f, Transformed) and getattr(f, "_jacrev_of", None) is not None:
        inner, a = f._jacrev_of
        return _tupled(argnums, lambda b: _second(inner, a, b, "eagle_fx.jacfwd", squeeze=False,
                                                  shown=("eagle_fx.jacfwd", "eagle_fx.jacrev")))
    return _tupled(argnums, lambda k: _jacobian(f, k, "eagle_fx.jacfwd", forward=True))


def jacrev(f, argnums=0):
    """The Jacobian by reverse mode: a vmap of the vjp over the basis of the result."""
    return _tupled(argnums_checked(argnums, "eagle_fx.jacrev"), lambda k: _jacobian(f, k, "eagle_fx.jacrev",
                                                                                      forward=False))


def hessian(f, argnums=0):
    """The Hessian of `f`, whose result is one value: jacfwd(jacrev(f)), argument shape twice.
    A tuple argnums gives the blocks ((H00, H01), (H10, H11)), as jax.hessian."""
    argnums, multi = argnums_checked(argnums, "eagle_fx.hessian")
    if not multi:
        return _second(f, argnums[0], argnums[0], "eagle_fx.hessian", squeeze=True)
    rows = [[_second(f, a, b, "eagle_fx.hessian", squeeze=True) for b in argnums] for a in argnums]

    def blocks(*args):
        # as jax.hessian: per argument a, a tree like it whose leaves are tuples over the arguments b
        out = []
        for a, row in zip(argnums, rows):
            parts = [h(*args) for h in row]
            tree = tree_flatten(args[a], is_leaf=is_array)[1]
            per_leaf = zip(*[_at_leaves(p, tree) for p in parts])
            out.append(tree_unflatten(tree, [None if all(x is None for x in t) else tuple(t) for t in per_leaf]))
        return tuple(out)
    blocks.__name__ = f"hessian({name_of(f)})"
    return blocks


def _at_leaves(value, tree):
    """The parts of `value` (a tree with `tree`'s structure above its leaves) at `tree`'s leaves."""
    if tree.kind == "leaf":
        return [value]
    if tree.kind == "none":
        return []
    if tree.kind == "dict":
        kids = [value[k] for k in tree.meta]
    else:
        kids = list(node_children(value)[2])
    return [x for v, t in zip(kids, tree.children) for x in _at_leaves(v, t)]


def _tupled(argnums, one):
    """`one` of the position, or of each position of a tuple argnums: (positions, multi)."""
    pick, multi = argnums
    if not multi:
        return one(pick[0])
    parts = [one(k) for k in pick]

    def each(*args):
        return tuple(p(*args) for p in parts)
    each.__name__ = parts[0].__name__
    return each


class _Arg:
    """Argument k's leaves: which are floating (differentiated), and each one's place in the
    flat basis over all of them (offset, size)."""

    def __init__(self, args, k, api):
        if not -len(args) <= k < len(args):
            raise ValueError(f"{api}: argnums {k} for {len(args)} positional arguments")
        self.k = k % len(args)
        self.leaves, self.tree = tree_flatten(args[self.k], is_leaf=is_array)
        self.floats = [j for j, x in enumerate(self.leaves) if float_array(x)]
        if not self.floats:
            refuse_no_float(api, k, args[k])
        self.offset, at = {}, 0
        for j in self.floats:
            self.offset[j] = at
            at += self.leaves[j].size
        self.size = at

    def basis(self, dtype_of=None):
        """Per floating leaf, its part of the identity over the flat basis: (size, *leaf.shape)."""
        eye = np.eye(self.size)
        return [eye[:, self.offset[j]:self.offset[j] + self.leaves[j].size]
                .astype(self.leaves[j].dtype).reshape((self.size,) + self.leaves[j].shape) for j in self.floats]

    def tangents(self, args, parts):
        """The tangents tuple for jvp: this argument's tree with `parts` at its floating leaves."""
        leaves = [None] * len(self.leaves)
        for j, t in zip(self.floats, parts):
            leaves[j] = t
        t = tree_unflatten(self.tree, leaves)
        return tuple(t if q == self.k else None for q in range(len(args)))

    def wrt(self):
        return [(self.k, j) for j in self.floats]


def _one_result(s):
    if len(s.results) != 1:
        raise TypeError(f"{s.api}: {s.fname} returns {len(s.results)} results; a Jacobian takes one")
    return s.results[0].aval


def _reshaped(c, tree, outputs, views):
    """The closed Program `c` with result `tree` (leaves: its Vars, one per entry of `outputs`)
    seen through `views`."""
    return c.derive(c.program.replace(outputs=outputs), c.planes, tree, len(outputs), views)


def _jacobian(f, argnums, api, forward):
    def make(*args):
        x = _Arg(args, argnums, api)
        s0 = Staged(f, args, api)
        out = _one_result(s0).shape
        seen = s0.g.views[0] if s0.g.views else None        # f's result has a view (a Jacobian's): kept
        if forward:
            def one(*ts):
                return jvp_as(f, args, x.tangents(args, ts), api)[1]
            c = vmap(one, in_axes=0).closed(*x.basis())
            v = c.result_vars()[0][0]                  # (size, *out): row i is d result / d (flat x)_i
            views = [then(_forward_view(x.offset[j], x.leaves[j].size, out, x.leaves[j].shape), seen, len(out),
                          x.leaves[j].ndim) for j in x.floats]
            tree = tree_unflatten(x.tree, [v if j in x.floats else None for j in range(len(x.leaves))])
            leaves, tree = tree_flatten(tree, is_leaf=lambda u: isinstance(u, Var))
            return _reshaped(c, tree, leaves, views)
        m = int(np.prod(out))
        basis = np.eye(m, dtype=ct_aval(s0.results[0].aval).dtype).reshape((m,) + out)

        def one(ct):
            s2 = Staged(f, args, api)
            prog = vjp_program(s2, x.wrt(), api)
            return graph_of(s2, prog, _grad_trees(s2, prog, [x.k], x.wrt())[0], seed_planes(s2, [ct]))
        c = vmap(Transformed(f"vjp({name_of(f)})", one), in_axes=0).closed(basis)
        rows = c.views or [None] * len(x.floats)      # a row's own view: a moved argument's layout
        c.views = [then(_after(r, _reverse_view(out, x.leaves[j].shape)), seen, len(out), x.leaves[j].ndim)
                   for r, j in zip(rows, x.floats)]
        return c
    t = Transformed(f"{api.split('.')[-1]}({name_of(f)})", seams.as_written(api, make), sig=sig(api, f, argnums),
                    prepare=_prepare(argnums, reverse=not forward, f=None if not forward else f, inner=f))
    if not forward:
        t._jacrev_of = (f, argnums)
    return t


def _lead_aware(fn):
    """Mark a view that reads only an instance's trailing axes: a batch axis in front is kept (vmap
    of a Jacobian), see staged_results.lead_view."""
    fn.lead_aware = True
    return fn


def _after(first, view):
    """`view` of a result first seen through `first` (a lead-aware view, or None)."""
    if first is None:
        return view
    return _lead_aware(lambda a: view(first(a)))


def _forward_view(off, size, out_shape, in_shape):
    def view(j):
        lead = j.shape[:j.ndim - 1 - len(out_shape)]
        t = np.moveaxis(j[(slice(None),) * len(lead) + (slice(off, off + size),)], len(lead), -1)
        return t.reshape(lead + out_shape + in_shape)
    return _lead_aware(view)


def _reverse_view(out_shape, in_shape):
    return _lead_aware(lambda j: j.reshape(j.shape[:j.ndim - 1 - len(in_shape)] + out_shape + in_shape))


def _second(f, a, b, api, squeeze, shown=None):
    """jacfwd(jacrev(f, a), b): d/dx_b of the Jacobian of f with respect to x_a, one vmap over the
    pairs (cotangent basis vector j, tangent basis vector i) of jvp(vjp_j f)(e_i). Refusals name
    `shown` (default: `api`), the APIs as the user wrote them."""
    def make(*args):
        xa, xb = _Arg(args, a, api), _Arg(args, b, api)
        s = Staged(f, args, api)
        out = _one_result(s).shape
        m, nb = int(np.prod(out)), xb.size
        cts = np.repeat(np.eye(m, dtype=ct_aval(s.results[0].aval).dtype), nb, axis=0).reshape((m * nb,) + out)
        tans = [np.tile(t.reshape(nb, int(np.prod(t.shape[1:]))), (m, 1)).reshape((m * nb,) + t.shape[1:])
                for t in xb.basis()]

        def one(ct, *ts):
            def row(*args2):
                s2 = Staged(f, args2, api)
                prog = vjp_program(s2, xa.wrt(), api)
                return graph_of(s2, prog, _grad_trees(s2, prog, [xa.k], xa.wrt())[0], seed_planes(s2, [ct]))
            vjp_row = Transformed(f"vjp({name_of(f)})", row)
            return jvp_as(vjp_row, args, xb.tangents(args, ts), api)[1]
        c = vmap(one, in_axes=0).closed(cts, *tans)
        rows = c.result_vars()[0]                      # per floating leaf of x_a: (m * nb, *leaf shape)
        row_views = iter(c.views or [None] * len(rows))
        lead = () if squeeze and m == 1 else out
        outer, outputs, views = [], [], []
        it = iter(rows)
        for ja in range(len(xa.leaves)):
            if ja not in xa.floats:
                outer.append(None)
                continue
            v, seen = next(it), next(row_views)
            inner = []
            for jb in range(len(xb.leaves)):
                if jb not in xb.floats:
                    inner.append(None)
                    continue
                inner.append(v)
                outputs.append(v)
                views.append(_after(seen, _second_view(m, nb, xb.offset[jb], xb.leaves[jb].size, lead,
                                                       xa.leaves[ja].shape, xb.leaves[jb].shape)))
            outer.append(tree_unflatten(xb.tree, inner))
        tree = tree_flatten(tree_unflatten(xa.tree, outer), is_leaf=lambda u: isinstance(u, Var))[1]
        return _reshaped(c, tree, outputs, views)
    label = "".join(f"{n.split('.')[-1]}(" for n in shown or (api,)) + name_of(f) + ")" * len(shown or (api,))
    return Transformed(label, seams.as_written(api, make, shown),
                       sig=sig(api + "2", f, a, b, squeeze),
                       prepare=_prepare(a, b, inner=None if squeeze else f))


def _second_view(m, nb, off, size, lead, a_shape, b_shape):
    def view(t):
        first = t.shape[:t.ndim - 1 - len(a_shape)]           # a batch axis in front (vmap of a Hessian)
        t = t.reshape(first + (m, nb, int(np.prod(a_shape))))[..., off:off + size, :]   # [j, i, k]: d(J[j, k]) / d x_b[i]
        return np.swapaxes(t, -1, -2).reshape(first + lead + a_shape + b_shape)
    return _lead_aware(view)


def _prepare(a, b=None, reverse=True, f=None, inner=None):
    """Python-float (or 0-d) leaves of the differentiated arguments staged as one-cell arrays; each
    Jacobian then loses the size-1 axis such a leaf brought (a's after the result's axes, b's last).
    reverse (a is differentiated by reverse mode): a Jacobian with respect to a Python float is
    float64, as JAX's (forward mode: the result's dtype, float64 where `f` is a derivative with
    respect to a Python float). `inner`, the function differentiated: when it is a derivative
    transform of such a leaf too (jacfwd(grad(f)) at a float), it is staged at the one-cell array
    and its result's part of each Jacobian is given the shape it has at the float (0-d for grad)."""
    def prepare(args):
        n = len(args)
        ks = [k % n for k in (a, b) if k is not None and -n <= k < n]
        wide = f is not None and weak_cast(f, args) is not None
        given = args
        args, promoted = promote(args, sorted(set(ks)))
        # the scalars the inner derivative takes (here or at another position) made one-cell here,
        # so that its restore is known: staged at a one-cell array, it cannot tell
        staged, restore_in = inner_restore(inner, given, args, others=True)
        one = getattr(restore_in, "one", None)
        if one is not None:
            args = staged
        if not promoted and not wide and one is None:
            return args, None
        ka = ks[0]
        kb = ks[1] if b is not None and len(ks) > 1 else None
        la = tree_flatten(args[ka], is_leaf=is_array)[0]
        lb = tree_flatten(args[kb], is_leaf=is_array)[0] if kb is not None else None

        def fix(x, ja, jb, shape):
            if wide or reverse and (ka, ja) in promoted.weak:
                x = x.astype(np.float64)
            if not shape:
                return x
            b_nd = np.ndim(lb[jb]) if jb is not None else 0
            drop = set()
            if jb is not None and (kb, jb) in promoted:
                drop.add(x.ndim - 1)
            if (ka, ja) in promoted:
                drop.add(x.ndim - b_nd - 1)
            x = x.reshape([d for i, d in enumerate(x.shape) if i not in drop]) if drop else x
            if one is None:
                return x
            tail = np.ndim(la[ja]) - ((ka, ja) in promoted) + \
                (np.ndim(lb[jb]) - ((kb, jb) in promoted) if jb is not None else 0)
            return x.reshape(tuple(one(x.shape[:x.ndim - tail])) + x.shape[x.ndim - tail:])

        def restore(out, shape=True):
            flat, tree = tree_flatten(out, is_leaf=lambda u: u is None or is_array(u))
            pairs = []
            for ja, xa in enumerate(la):
                if kb is None or not float_array(xa):
                    pairs.append((ja, None))
                else:
                    pairs += [(ja, jb) for jb in range(len(lb))]
            return tree_unflatten(tree, [x if x is None else fix(x, ja, jb, shape)
                                         for x, (ja, jb) in zip(flat, pairs)])
        if wide or reverse and any(p[0] == ka for p in promoted.weak):   # for vmap: instances have the caller's shapes
            restore.cast = lambda out: restore(out, shape=False)
        fa = [j for j, x in enumerate(la) if float_array(x)]
        fb = [j for j, x in enumerate(lb) if float_array(x)] if lb is not None else [None]
        if len(fa) == 1 and len(fb) == 1:       # one Jacobian: as an outer Jacobian's function, its shape
            restore.one = lambda shape: fix(np.broadcast_to(np.zeros(()), tuple(shape)), fa[0], fb[0], True).shape
        return args, restore
    return prepare
