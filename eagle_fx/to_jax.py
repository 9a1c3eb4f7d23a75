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

Reverse mode goes through jax.custom_vjp wired to this project's vjp transform: the backward is
the vjp Program of the graph (transforms/vjp_graph.py) lowered by the same backend, so jax.grad
works through device loops (lax.while_loop has no reverse mode in JAX) and equals eagle_fx.grad.
The backward runs the forward again (nothing is kept between the two but the arguments).
"""
from __future__ import annotations

import numpy as np

from hawk_fx.caches import LRU
from hawk_fx.context import CONTEXT
from hawk_fx.emit.jax import is_jax_array, require_jax
from hawk_fx.tree import tree_unflatten

from .api import Staged, stage
from .backends.jax_lower import lower
from .backends.select import use_backend
from .frontend.cache import MAXSIZE, names_read, static_key, unchanged
from .derivatives import vjp_program
from .transforms.program import dce

API = "eagle_fx.to_jax"
_OPAQUE = ("is a host function; inside a pure JAX function there are no host arrays for it to read "
           "or write: run the graph itself (eagle_fx.Graph(backend='jax') on NumPy arrays) instead of to_jax")


def _is_arraylike(a) -> bool:
    return isinstance(a, np.ndarray) or is_jax_array(a)


class _Signature:
    """One staging of the builder: the lowered forward and (lazily) backward."""

    def __init__(self, f, args, names):
        self.f, self.names = f, names
        self.positions = [k for k, a in enumerate(args) if _is_arraylike(a)]
        self.placeholders = [_placeholder(a) if _is_arraylike(a) else a for a in args]
        with use_backend("jax"), _abstract():
            g = stage(f, self.placeholders, API)            # a closed Program
            if not g.has_result:
                raise TypeError(f"{API}: {_name(f)} declares no result (g.result = ...); a JAX function returns it")
            leaves, self.tree = g.result_vars()
            self.n = g.n or 1
            self.prog = g.program.replace(outputs=leaves)
            self.planes = list(g.planes)
            self.float_results = [j for j, v in enumerate(leaves) if v.aval.dtype.kind == "f"]
            self._stage_for_vjp = lambda: Staged(f, self.placeholders, API)
        self.forward, _ = lower(self.prog, self.n, None, _OPAQUE)
        self.ids = {id(p): k for k, p in enumerate(self.placeholders) if isinstance(p, np.ndarray)}
        self.sources = {}                 # id(plane array) -> (argument position, view) for forward and backward
        self.float_args = [k for k in self.positions if np.dtype(args[k].dtype).kind == "f"]
        self._backward = None

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
            raise TypeError(f"{API}({_name(self.f)}): the graph reads a copy of an argument ({plane.name or 'a plane'} "
                            f"of shape {arr.shape}) made while staging, which a traced function cannot follow; "
                            "pass the arrays the graph reads as arguments")
        self.sources[key] = found
        return found

    def backward(self):
        """(fn, planes): fn(*inputs, *cotangents of the float results) -> a cotangent per float argument."""
        if self._backward is None:
            with use_backend("jax"), _abstract():
                s = self._stage_for_vjp()
                prog = vjp_program(s, [(k, 0) for k in self.float_args], API)
            prog = dce(prog.replace(outputs=prog.outputs[len(s.results):]))
            fn, _ = lower(prog, self.n, None, _OPAQUE)
            self._backward = (fn, list(s.planes))
        return self._backward


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


def _name(f):
    return getattr(f, "__name__", type(f).__name__)


def to_jax(f):
    """A pure JAX function of `f` (a graph builder, or a function an eagle_fx transform made):
    array arguments may be jax.Arrays or tracers (it works inside jax.jit, jax.vmap, jax.grad);
    other arguments are static. It returns f's declared result tree as jax.Arrays."""
    jax = require_jax(API)
    sigs = LRU(f"to_jax({_name(f)}) signatures", MAXSIZE)     # signature key -> _Signature

    def key_of(args):
        key = []
        for a in args:
            if _is_arraylike(a):
                key.append(("array", tuple(np.shape(a)), np.dtype(a.dtype).str))
            else:
                try:
                    hash(a)
                except TypeError:
                    raise TypeError(f"{API}({_name(f)}): argument {a!r:.40} is neither an array nor hashable; "
                                    "non-array arguments are static (part of the signature)") from None
                key.append(("static", static_key(a)))
        return tuple(key)

    def call(*args):
        key = key_of(args)
        sig = sigs.get(key)
        if sig is None or not unchanged(sig.names):      # new, or a kernel or global it read was rebound
            names = names_read(f)
            sig = sigs[key] = _Signature(f, args, None)
            sig.pure, sig.names = _make_pure(jax, sig), names
        leaves = sig.pure(*[args[k] for k in sig.positions])
        return tree_unflatten(sig.tree, list(leaves))

    call.__name__ = f"to_jax({_name(f)})"
    call.__doc__ = f.__doc__
    return call


def _make_pure(jax, sig):
    def run(*arrays):
        return tuple(sig.forward(*sig.inputs(arrays, sig.planes)))

    if not sig.float_args or not sig.float_results:
        return run
    pure = jax.custom_vjp(run)

    def fwd(*arrays):
        return run(*arrays), arrays

    def bwd(arrays, cts):
        fn, planes = sig.backward()
        seeds = []
        for j in sig.float_results:
            c = cts[j]
            seeds.append(c if not (hasattr(c, "dtype") and c.dtype == jax.dtypes.float0) else
                         np.zeros(np.shape(c), sig.prog.outputs[j].aval.dtype))
        grads = dict(zip(sig.float_args, fn(*sig.inputs(arrays, planes), *seeds)))
        return tuple(grads.get(k) if k in grads else None for k in sig.positions)

    pure.defvjp(fwd, bwd)
    return pure
