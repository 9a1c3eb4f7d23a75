"""eagle_fx.to_jax: a graph builder (or a transformed function) as a pure JAX function.

    f = eagle_fx.to_jax(loss)                  # loss: an @eagle_fx.Graph.builder
    jax.jit(jax.grad(lambda x: f(x, flag, 3)))(x)

The builder is staged once per signature (the shapes and dtypes of the array arguments, the values
of the others, which are static, by type and bits: 0.0 and -0.0 differ), on placeholder NumPy
arrays: staging decides by types, never by values; as in the transforms' cache (eagle_fx/frontend/cache.py),
a signature is staged again once a kernel or global its staging read by name is rebound. Its
Program is lowered to jax.numpy and lax control flow (backends/jax_lower.py) and the function
returns the declared result tree (`g.result`), nothing else: a Mutable write to an argument is not
returned unless the result names it. Arrays the builder reaches by closure (and
its `buffer=` arrays) are read when the function is traced, and are constants of it.

Derivatives go through jax.custom_jvp wired to this project's jvp transform: the tangent rule is
the jvp Program of the graph (transforms/jvp_graph.py) lowered by the same backend, with each
capped device loop lowered as a masked lax.scan of its cap turns, which JAX can linearize and
transpose. So forward mode (jax.jvp, jax.jacfwd, jax.linearize), reverse mode (jax.grad, jax.vjp,
jax.jacrev) and their compositions (jax.hessian, jax.vmap(jax.jacfwd(f))) all work through device
loops that have a cap (lax.while_loop has no reverse mode in JAX). The value without a derivative
runs the loops as lax.while_loop (they stop at their last turn). A loop with no cap (a counted
loop whose trip count JAX traces) has forward mode only; reverse mode through it is refused.

Arguments are trees (tuples, lists, dicts, NamedTuples, dataclasses, registered classes) as
jax.jit takes them: array leaves are traced, other leaves static.
"""
from __future__ import annotations

import numpy as np

from hawk_fx.caches import LRU
from hawk_fx.context import CONTEXT
from hawk_fx.emit.jax import is_jax_array, plain_sums, require_jax
from hawk_fx.tree import tree_flatten, tree_unflatten

from .api import name_of, stage
from .backends.jax_lower import lower
from .backends.select import use_backend
from .frontend.cache import MAXSIZE, names_read, static_key, unchanged
from .ir import primitives as _prims
from .ir.custom import custom_p
from .transforms.jvp_graph import jvp_graph
from .transforms.program import TransformError, is_float

API = "eagle_fx.to_jax"
_OPAQUE = ("is a host function; inside a pure JAX function there are no host arrays for it to read "
           "or write: run the graph itself (eagle_fx.Graph(backend='jax') on NumPy arrays) instead of to_jax")


def _is_arraylike(a) -> bool:
    return isinstance(a, np.ndarray) or is_jax_array(a)


class _Signature:
    """One staging of the builder: the lowered forward and (lazily) the lowered tangent rule.
    `args` is the flat list of the arguments' leaves; `arg_tree` rebuilds the arguments."""

    def __init__(self, f, leaves, arg_tree, names):
        self.f, self.names = f, names
        self.positions = [k for k, a in enumerate(leaves) if _is_arraylike(a)]
        self.placeholders = [_placeholder(a) if _is_arraylike(a) else a for a in leaves]
        with use_backend("jax"), _abstract():
            g = stage(f, _args_of(arg_tree, self.placeholders), API)      # a closed Program
            if not g.has_result:
                raise TypeError(f"{API}: {name_of(f)} declares no result (g.result = ...); a JAX function returns it")
            outs, self.tree = g.result_vars()
            self.n = g.n or 1
            self.prog = g.program.replace(outputs=outs)
            self.planes = list(g.planes)
        self.forward, _ = lower(self.prog, self.n, None, _OPAQUE)
        self.ids = {id(p): k for k, p in enumerate(self.placeholders) if isinstance(p, np.ndarray)}
        self.sources = {}                 # id(plane array) -> (argument position, view) for forward and tangent
        self.differentiable = any(is_float(v.aval) for v in self.prog.inputs) and \
            any(is_float(v.aval) for v in self.prog.outputs)
        self._tangent = None

    def inputs(self, arrays, planes):
        """The Program's inputs: the traced arguments (or the views of them a transform staged, as
        vmap's moved batch axis), and closure arrays as constants."""
        by_pos = dict(zip(self.positions, arrays))
        out = []
        for p in planes:
            src = self.source(p)
            if src is None:
                out.append(np.array(p.array))
                continue
            k, offsets = src
            x = by_pos[k]
            out.append(x if offsets is None else _take(x, offsets, p.array.shape))
        return out

    def source(self, plane):
        """(argument position, element offsets or None) of a plane read from an argument, or None
        for a constant; a plane copied from an argument (which would silently be a constant) is refused."""
        arr = plane.array
        key = id(arr)
        if key in self.sources:
            return self.sources[key]
        k = self.ids.get(key)
        found = (k, None) if k is not None else None
        if found is None:
            for pk, ph in enumerate(self.placeholders):
                if isinstance(ph, np.ndarray) and ph.size and np.shares_memory(arr, ph):
                    found = (pk, _offsets(arr, ph))
                    break
        if found is None and _holds_sentinel(arr):
            raise TypeError(f"{API}({name_of(self.f)}): the graph reads a copy of an argument "
                            f"({plane.name or 'a plane'} of shape {arr.shape}) made while staging, which a traced function cannot follow; "
                            "pass the arrays the graph reads as arguments")
        self.sources[key] = found
        return found

    def tangent(self):
        """(fn, flags, uncapped): fn(*inputs, *a tangent per float input) -> (outputs..., a tangent per
        float output...), the jvp Program lowered with capped loops as scans; uncapped: None, or
        the refusal of reverse mode through its loop with no cap (JAX cannot transpose its tangent)."""
        if self._tangent is None:
            flags = [is_float(v.aval) for v in self.prog.inputs]
            force = [is_float(v.aval) for v in self.prog.outputs]
            jp, _ = jvp_graph(self.prog, flags, force)
            fn, _ = lower(jp, self.n, None, _OPAQUE, scan_loops=True)
            refusal = _uncapped_message(self.prog) if _uncapped(self.prog) else _fixed_point_message(self.prog)
            self._tangent = (fn, flags, refusal)
        return self._tangent


def _args_of(arg_tree, leaves):
    """The positional arguments rebuilt from their flat leaves (arg_tree: the tuple of arguments)."""
    return tuple(tree_unflatten(arg_tree, leaves))


def _uncapped(prog):
    """The first loop with no cap in `prog` (or in a program inside one of its equations), or None."""
    for e in prog.eqns:
        if e.prim is _prims.while_p and e.params.get("cap") is None:
            return e
        for v in e.params.values():
            for p in v if isinstance(v, (list, tuple)) else (v,):
                found = _uncapped(p) if hasattr(p, "eqns") else None
                if found is not None:
                    return found
    return None


def _fixed_point_message(prog):
    """The refusal of reverse mode through an eagle_fx.fixed_point of `prog` (its tangent rule runs
    a series until the tangents settle: not a map JAX can transpose), or None."""
    for e in prog.eqns:
        if e.prim is custom_p and e.params["kind"] == "fixed_point":
            return (f"{API}: reverse mode through eagle_fx.fixed_point({e.params['name']}) at {e.info.where}: its "
                    "tangent rule runs a series until the tangents settle, which JAX cannot transpose; take the "
                    "gradient in eagle_fx (eagle_fx.to_jax(eagle_fx.grad(f)) is a JAX function too), or use "
                    "forward mode (jax.jvp, jax.jacfwd)")
        for v in e.params.values():
            for p in v if isinstance(v, (list, tuple)) else (v,):
                found = _fixed_point_message(p) if hasattr(p, "eqns") else None
                if found is not None:
                    return found
    return None


def _placeholder(a):
    """A stand-in for an array argument while staging: its shape and dtype, filled with a sentinel
    (NaN, or the dtype's largest value) so that a copy of it made while staging is recognised."""
    dt = np.dtype(a.dtype)
    fill = np.nan if dt.kind in "fc" else True if dt.kind == "b" else np.iinfo(dt).max
    return np.full(np.shape(a), fill, dt)


def _holds_sentinel(arr) -> bool:
    if not isinstance(arr, np.ndarray) or not arr.size or arr.dtype.kind == "b":
        return False
    if arr.dtype.kind in "fc":
        return bool(np.isnan(arr).any())
    return bool((arr == np.iinfo(arr.dtype).max).any())


def _offsets(view, base):
    """The flat element offsets into `base` of each element of `view` (a strided view of it)."""
    item = base.itemsize
    start = (view.__array_interface__["data"][0] - base.__array_interface__["data"][0]) // item
    idx = np.arange(base.size).reshape(base.shape) if base.flags.c_contiguous else None
    if idx is None or view.itemsize != item:
        raise TypeError(f"{API}: a staged view of an argument that is not a plain strided view")
    flat = np.lib.stride_tricks.as_strided(idx.reshape(-1)[start:], view.shape,
                                           tuple(st // item * idx.itemsize for st in view.strides))
    flat = np.array(flat)
    return None if flat.shape == base.shape and (flat.ravel() == np.arange(base.size)).all() else flat


def _take(x, offsets, shape):
    import jax.numpy as jnp  # lazy: jax is an optional dependency
    if (offsets.ravel() == np.arange(offsets.size)).all():
        return jnp.reshape(x, shape)
    return jnp.reshape(x, (-1,))[offsets]


def _abstract():
    """Staging on stand-ins of traced arrays: graphs staged inside are lowered when run, not compiled at
    build (to_jax only needs their Program)."""
    return CONTEXT.enter(lazy_compile=True, abstract=True)


def to_jax(f):
    """A pure JAX function of `f` (a graph builder, or a function an eagle_fx transform made):
    array leaves of its arguments (trees as jax.jit takes them) may be jax.Arrays or tracers (it
    works inside jax.jit, jax.vmap, jax.grad, jax.jvp, jax.jacfwd, jax.hessian); other leaves are
    static. It returns f's declared result tree as jax.Arrays."""
    jax = require_jax(API)
    sigs = LRU(f"to_jax({name_of(f)}) signatures", MAXSIZE)     # signature key -> _Signature

    def key_of(leaves, tree):
        key = [tree]
        for a in leaves:
            if _is_arraylike(a):
                key.append(("array", tuple(np.shape(a)), np.dtype(a.dtype).str))
            else:
                try:
                    hash(a)
                except TypeError:
                    raise TypeError(f"{API}({name_of(f)}): argument leaf {a!r:.40} is neither an array nor hashable; "
                                    "non-array leaves are static (part of the signature)") from None
                key.append(("static", static_key(a)))
        return tuple(key)

    def call(*args):
        leaves, tree = tree_flatten(args, is_leaf=_is_arraylike)
        key = key_of(leaves, tree)
        sig = sigs.get(key)
        if sig is None or not unchanged(sig.names):      # new, or a kernel or global it read was rebound
            names = names_read(f)
            sig = sigs[key] = _Signature(f, leaves, tree, None)
            sig.pure, sig.names = _make_pure(jax, sig), names
        out = sig.pure(*[leaves[k] for k in sig.positions])
        return tree_unflatten(sig.tree, list(out))

    call.__name__ = f"to_jax({name_of(f)})"
    call.__doc__ = f.__doc__
    return call


def _make_pure(jax, sig):
    if not sig.differentiable:
        return lambda *arrays: tuple(sig.forward(*sig.inputs(arrays, sig.planes)))
    if _holds_custom_vjp(sig.prog):
        return _reverse_only(jax, sig)
    core = jax.custom_jvp(lambda *ins: tuple(sig.forward(*ins)))
    outs = sig.prog.outputs

    @core.defjvp
    def rule(primals, tangents):
        fn, flags, uncapped = sig.tangent()
        t_in = [_instantiate(jax, t, v.aval) for t, v, fl in zip(tangents, sig.prog.inputs, flags) if fl]
        k = len(outs)
        with plain_sums():                # a tangent map JAX can transpose
            if uncapped:                  # forward mode only: its tangent loop has no transpose
                ys = tuple(sig.forward(*primals))
                ts = _forward_only(lambda *a: tuple(fn(*a)[k:]), primals, t_in, uncapped)
            else:
                res = fn(*primals, *t_in)
                ys, ts = tuple(res[:k]), res[k:]
        it = iter(ts)
        return ys, tuple(next(it) if is_float(v.aval) else np.zeros(v.aval.shape, jax.dtypes.float0) for v in outs)

    return lambda *arrays: core(*sig.inputs(arrays, sig.planes))


def _holds_custom_vjp(prog) -> bool:
    from .ir.custom import custom_p
    return any(e.prim is custom_p and e.params["kind"] == "custom_vjp" for e in prog.eqns) or \
        any(_holds_custom_vjp(q) for q in prog.subprograms())


def _reverse_only(jax, sig):
    """A graph holding an eagle_fx.custom_vjp: a jax.custom_vjp whose backward is this project's vjp
    Program (which runs the rule's bwd), so jax.grad / jax.vjp / jax.jacrev use the rule; forward mode
    is refused by JAX in its own words, as for any custom_vjp. Its residuals are the inputs."""
    from .transforms.reverse_again import recompute_unbounded
    from .transforms.vjp_graph import vjp_graph
    ins_v, outs = sig.prog.inputs, sig.prog.outputs
    flags = [is_float(v.aval) for v in ins_v]
    core = jax.custom_vjp(lambda *ins: tuple(sig.forward(*ins)))
    made = []

    def bwd(ins, cts):
        if not made:
            with recompute_unbounded(True):     # a loop with no cap: its turns recomputed, no stack to size
                vp = vjp_graph(sig.prog, flags, lambda trip, e: None, API)
            made.append(lower(vp, sig.n, None, _OPAQUE)[0])
        k = len(outs)
        seeds = [_instantiate(jax, c, v.aval) for c, v in zip(cts, outs) if is_float(v.aval)]
        it = iter(made[0](*ins, *seeds)[k:])
        return tuple(next(it) if fl else np.zeros(v.aval.shape, jax.dtypes.float0) for v, fl in zip(ins_v, flags))

    core.defvjp(lambda *ins: (tuple(sig.forward(*ins)), ins), bwd)
    return lambda *arrays: core(*sig.inputs(arrays, sig.planes))


def _instantiate(jax, t, aval):
    """A tangent as an array (JAX hands a float0 zero for an input it does not differentiate)."""
    if hasattr(t, "dtype") and t.dtype == jax.dtypes.float0:
        return np.zeros(aval.shape, aval.dtype)
    return t


def _forward_only(fn, primals, t_in, message):
    """fn(*primals, *t_in) as a linear map whose transpose is refused with `message` (its loop has
    no cap: JAX cannot transpose it). Under jax.vmap (jax.jacfwd), where JAX batches no such map,
    the tangents are computed directly: that is forward mode, which needs no transpose."""
    from jax.custom_derivatives import linear_call

    def transpose(res, cts):
        raise TransformError(message)
    try:
        return linear_call(lambda res, lin: fn(*res, *lin), transpose, tuple(primals), tuple(t_in))
    except NotImplementedError:
        return fn(*primals, *t_in)


def _uncapped_message(prog):
    """The refusal of reverse mode through the first loop of `prog` with no cap."""
    e = _uncapped(prog)
    return (f"{API}: reverse mode through the counted loop at {e.info.where}: its trip count is an argument "
            "traced by JAX (its value is unknown while staging, so its turns have no bound): cap the loop "
            "(`for _ in range(N): if not cell: break`) so its turns are bounded; forward mode (jax.jvp, "
            "jax.jacfwd) works as it is")
