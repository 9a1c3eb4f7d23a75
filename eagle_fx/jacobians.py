"""Jacobians and Hessians: vmaps of jvp (forward) or of the vjp (reverse) over a basis.

jacfwd(f)(x) and jacrev(f)(x) have JAX's shape, result.shape + x.shape. jacfwd(jacrev(f)) is
JAX's Hessian recipe; it is staged as one vmap, over every (result cotangent, tangent) pair of
basis vectors, of the jvp of the vjp, because a batched graph is not differentiated again.
hessian(f) is jacfwd(jacrev(f)) with a one-cell result read as a scalar (as grad reads it).
A tuple argnums gives a tuple of Jacobians (nested tuples for hessian), computed one by one.
"""
from __future__ import annotations

import numpy as np

from .api import Staged, Transformed, float_array, graph_of, name_of, select_result, sig
from .batching import vmap
from .derivatives import jvp, promote, seed_planes, vjp_program
from .transforms.program import ct_aval


def jacfwd(f, argnums=0):
    """The Jacobian of `f`'s one result with respect to argument `argnums`, by forward mode: a vmap
    of jvp over the basis of that argument. Shape: result.shape + argument.shape."""
    if isinstance(f, Transformed) and getattr(f, "_jacrev_of", None) is not None:
        inner, a = f._jacrev_of
        return _tupled(argnums, lambda b: _second(inner, a, b, "eagle_fx.jacfwd", squeeze=False))
    return _tupled(argnums, lambda k: _jacobian(f, k, "eagle_fx.jacfwd", forward=True))


def jacrev(f, argnums=0):
    """The Jacobian by reverse mode: a vmap of the vjp over the basis of the result."""
    return _tupled(argnums, lambda k: _jacobian(f, k, "eagle_fx.jacrev", forward=False))


def hessian(f, argnums=0):
    """The Hessian of `f`, whose result is one value: jacfwd(jacrev(f)), argument shape twice.
    A tuple argnums gives the blocks ((H00, H01), (H10, H11)), as jax.hessian."""
    if isinstance(argnums, int):
        return _second(f, argnums, argnums, "eagle_fx.hessian", squeeze=True)
    rows = [[_second(f, a, b, "eagle_fx.hessian", squeeze=True) for b in argnums] for a in argnums]

    def blocks(*args):
        return tuple(tuple(h(*args) for h in row) for row in rows)
    blocks.__name__ = f"hessian({name_of(f)})"
    return blocks


def _tupled(argnums, one):
    if isinstance(argnums, int):
        return one(argnums)
    parts = [one(k) for k in argnums]

    def each(*args):
        return tuple(p(*args) for p in parts)
    each.__name__ = parts[0].__name__
    return each


def _check_arg(args, k, api):
    if not -len(args) <= k < len(args):
        raise ValueError(f"{api}: argnums {k} for {len(args)} positional arguments")
    if not float_array(args[k]):
        raise TypeError(f"{api}: argument {k} is {type(args[k]).__name__}, not a floating array; it has no "
                        "derivative (Jacobians take array arguments, not trees: pick one leaf)")


def _prepare(ks):
    """Python-float (or 0-d) arguments at ks staged as one-cell arrays; the Jacobian then loses
    the size-1 axis each of them brought (its axes are the trailing ones, ks in order)."""
    def prepare(args):
        pos = [k % len(args) if -len(args) <= k < len(args) else k for k in ks]
        args, promoted = promote(args, sorted(set(pos)))
        if not promoted:
            return args, None
        widths = [args[k].ndim if -len(args) <= k < len(args) else 0 for k in pos]

        def restore(j):
            axes, at = [], j.ndim
            for k, w in reversed(list(zip(pos, widths))):
                at -= w
                if (k, 0) in promoted:
                    axes.append(at)
            return j.reshape([d for i, d in enumerate(j.shape) if i not in axes])
        return args, restore
    return prepare


def _jacobian(f, argnums, api, forward):
    def make(*args):
        _check_arg(args, argnums, api)
        x = args[argnums]
        s = Staged(f, args, api)
        if len(s.results) != 1:
            raise TypeError(f"{api}: {s.fname} returns {len(s.results)} results; a Jacobian takes one")
        out = s.results[0].aval
        if forward:
            basis = np.eye(x.size, dtype=x.dtype).reshape((x.size,) + x.shape)

            def one(t):
                return select_result(jvp(f, args, tuple(t if k == argnums else None for k in range(len(args)))), 1)
            g = vmap(one, in_axes=0).closed(basis)
        else:
            basis = np.eye(int(np.prod(out.shape)), dtype=ct_aval(out).dtype).reshape((-1,) + out.shape)

            def one(ct):
                s2 = Staged(f, args, api)
                prog = vjp_program(s2, [(argnums % len(args), 0)], api)
                return graph_of(s2, prog, prog.outputs[len(s2.results)], seed_planes(s2, [ct]))
            g = vmap(Transformed(f"vjp({name_of(f)})", one), in_axes=0).closed(basis)
        # the graph's own result has JAX's shape (make_graph shows it too)
        g.views = [lambda j: _jacobian_shape(j, forward, out.shape, x.shape)]
        return g
    t = Transformed(f"{api.split('.')[-1]}({name_of(f)})", make, sig=sig(api, f, argnums),
                    prepare=_prepare([argnums]))
    if not forward:
        t._jacrev_of = (f, argnums)
    return t


def _jacobian_shape(j, forward, out_shape, in_shape):
    """A Jacobian's batched result, (out, *in) by reverse mode or (in, *out) by forward mode, seen
    as JAX's out_shape + in_shape."""
    if forward:
        j = np.moveaxis(j, 0, -1)
    return j.reshape(out_shape + in_shape)


def _second(f, a, b, api, squeeze):
    """jacfwd(jacrev(f, a), b): d/dx_b of the Jacobian of f with respect to x_a, one vmap over the
    pairs (cotangent basis vector j, tangent basis vector i) of jvp(vjp_j f)(e_i)."""
    def make(*args):
        _check_arg(args, a, api)
        _check_arg(args, b, api)
        xa, xb = args[a], args[b]
        s = Staged(f, args, api)
        if len(s.results) != 1:
            raise TypeError(f"{api}: {s.fname} returns {len(s.results)} results; a Jacobian takes one")
        out = s.results[0].aval
        m, nb = int(np.prod(out.shape)), xb.size
        cts = np.repeat(np.eye(m, dtype=ct_aval(out).dtype), nb, axis=0).reshape((m * nb,) + out.shape)
        tans = np.tile(np.eye(nb, dtype=xb.dtype), (m, 1)).reshape((m * nb,) + xb.shape)

        def one(ct, t):
            def row(*args2):
                s2 = Staged(f, args2, api)
                prog = vjp_program(s2, [(a % len(args2), 0)], api)
                return graph_of(s2, prog, prog.outputs[len(s2.results)], seed_planes(s2, [ct]))
            vjp_row = Transformed(f"vjp({name_of(f)})", row)
            tangents = tuple(t if k == b % len(args) else None for k in range(len(args)))
            return select_result(jvp(vjp_row, args, tangents), 1)
        g = vmap(one, in_axes=(0, 0)).closed(cts, tans)
        lead = () if squeeze and m == 1 else out.shape
        g.views = [lambda t: _second_shape(t, m, nb, lead, xa.shape, xb.shape)]
        return g
    return Transformed(f"{api.split('.')[-1]}({name_of(f)})", make, sig=sig(api + "2", f, a, b, squeeze),
                       prepare=_prepare([a, b]))


def _second_shape(t, m, nb, lead, a_shape, b_shape):
    t = t.reshape((m, nb, -1))                            # [j, i, k]: d(J[j, k]) / d x_b[i]
    return np.swapaxes(t, 1, 2).reshape(lead + a_shape + b_shape)
