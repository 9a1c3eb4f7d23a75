"""JAX-shaped transformations of builders, each a Program -> Program transform that composes.

    prog = eagle_fx.make_program(f)(x, flag)          # the staged Program of f (like jax.make_jaxpr)
    y, pullback = eagle_fx.vjp(f, x, flag)             # pullback(ct) -> a cotangent per argument
    y, ty = eagle_fx.jvp(f, (x, flag), (dx, None))     # forward mode
    dx = eagle_fx.grad(loss)(x, flag)                  # loss's result is one value
    v, dp = eagle_fx.value_and_grad(loss)(params, x)  # params: a dict (any tree) of arrays
    fb = eagle_fx.vmap(f, in_axes=(0, None))           # B instances in one graph
    eagle_fx.vmap(eagle_fx.grad(loss), in_axes=(0, None))(xs, flag)     # per-instance gradients
    eagle_fx.jvp(eagle_fx.grad(loss), (x, flag), (v, None))             # Hessian-vector product
    eagle_fx.hessian(loss)(x, flag)                                     # jacfwd(jacrev(loss))

This module holds what every transform shares: the transformed-function object, staging a
function into a Graph, and a staged graph seen as a function of its arguments' leaves. The
transforms live in derivatives.py (jvp, vjp, grad, value_and_grad), jacobians.py and batching.py.

Transforms hand each other closed Programs (eagle_fx/ir/closed.py: a Program, its bound arrays and
result tree), and only the outermost call lowers one, once: builders staged inside a transform
close their graphs without lowering them. A transformed function, called, replays a cached graph
for the arguments' layout and returns copies of its result (eagle_fx/frontend/cache.py); `.graph(*args)`
gives a new Graph (bind, launch and result work on it). vmap of a builder is a builder: it returns
the Graph. Inside a function handed to a transform (vmap(lambda x, t: eagle_fx.jvp(f, (x,), (t,))[1])),
transformed functions and jvp return their result's tree with a Graph lowered only if run at each
leaf (staged_results.py), for the outer transform to take.
"""
from __future__ import annotations

import inspect
import operator

import numpy as np

from hawk_fx.core import Eqn, Var
from hawk_fx.emit.jax import is_jax_array
from hawk_fx.context import CONTEXT
from hawk_fx.tree import tree_flatten

from .frontend import cache
from .backends.recording import loop_capacity
from .frontend.building import Builder
from .ir.closed import Closed, closed_of
from .frontend.eager import disable_staging
from .graph import Graph
from .frontend.guards import ValueReadError, guarding, other_values, release, where
from .frontend.staging import Plane
from .transforms.program import TransformError, dce
from . import ir, seams
from .staged_results import merge, staged_result
from .result_views import restored_views
from .transforms.reverse_again import holds_reverse, recomputing, reversible



class Transformed(cache.Cached):
    """A function a transform made. `graph(*args)`: a new Graph it runs for these arguments.
    Called, it replays a cached graph for the arguments' layout (see eagle_fx.frontend.cache).

    prepare(args) -> (args, restore): turns the arguments into what the graph takes (a Python
    float to differentiate becomes a one-cell array) and restore(values) gives the result back
    the shapes the caller gave."""

    def __init__(self, name, stage, values=True, vmap_of=None, sig=None, prepare=None, static=None, promotes=None):
        self.__name__ = name
        self._stage, self._values, self._prepare = stage, values, prepare
        self._vmap_of = vmap_of          # (f, in_axes, out_axes) of a vmap: an outer vmap flattens both
        self._sig = sig if sig is not None else self   # the cache's name for it: (transform, options, function)
        # {position: name} of arguments whose Python floats stay static (the builder's static_argnums), or cache.ALL
        self._static = cache.static_of(self._sig) if static is None else static
        self._on_jax = {}                # the jitted JAX functions of calls on jax.Arrays, by their static arguments
        # the positions where `prepare` changes a float or 0-d array (and nothing else): a call with arrays
        # of one or more dimensions there replays before it; None when prepare may change any call
        self._promotes = () if prepare is None else promotes
        self._hits_first = values and self._promotes is not None     # try the cache before anything else

    def closed(self, *args):
        """The closed Program it stages for these arguments (nothing lowered)."""
        if self._prepare is not None:
            args, restore = self._prepare(args)
            if restore is not None:       # a promoted float's derivative: seen 0-d, as a direct call gives it
                return restored_views(self._stage(*args), restore)
        return self._stage(*args)

    def graph(self, *args):
        return Graph.from_closed(self.closed(*args))

    def __call__(self, *args, **kwargs):
        if self._hits_first and not kwargs and not CONTEXT.transforming:
            out = cache.replay_hit(self._sig, args, self._static, self._promotes)   # flat arguments, layout seen
            if out is not cache.MISS:
                return out
        if kwargs:
            raise TypeError(f"{self.__name__}: pass the arguments positionally (got {', '.join(kwargs)} by keyword)")
        if not CONTEXT.abstract and holds_jax_arrays(args):
            if not self._values:
                _refuse_jax_arrays(self.__name__, args)
            fn, arrays = jax_function(self, args, self._on_jax)      # jax.Arrays in, jax.Arrays out, on XLA
            return fn(*arrays)
        if CONTEXT.transforming:
            args = release(args)
            return staged_result(self.closed(*args))      # for the outer transform: lowered only if run
        if not self._values:              # a graph (vmap of a builder): staged once per layout, bound to these arrays
            args, traced = self._traced(args)
            with traced_hint(self.__name__, traced):
                return cache.graph_call(self._sig, args, self.closed, Graph.from_closed)
        restore = None
        if self._prepare is not None:
            args, restore = self._prepare(args)
            if self._promotes is None or restore is not None:     # not tried above
                out = cache.replay_hit(self._sig, args, self._static)
                if out is not cache.MISS:
                    return restore(out) if restore is not None else out
        args, traced = self._traced(args)
        with traced_hint(self.__name__, traced), cache.staged(self._sig, args, self._stage, Graph.from_closed) as e:
            out = run(e.graph)
        return restore(out) if restore is not None else out

    def _traced(self, args):
        return cache.traced_floats(args, self._static, self.__name__)

    def cache_info(self):
        """(hits, misses, currsize, maxsize) of its cache of staged graphs."""
        c = cache.cache_for(self._sig, create=False)
        return c.info() if c is not None else cache.CacheInfo(0, 0, 0, cache.MAXSIZE)

    def clear_cache(self):
        """Forget its staged graphs: the next call stages again."""
        cache.clear(self._sig)

    def __repr__(self):
        return f"<eagle_fx transformed function {self.__name__}>"


class traced_hint:
    """Adds to an error raised while staging a call whose Python floats were traced what to write
    when the function needs such a float's value as a Python number."""

    __slots__ = ("name", "traced")

    def __init__(self, name, traced):
        self.name, self.traced = name, traced

    def __enter__(self):
        return self

    def __exit__(self, kind, err, tb):
        if self.traced and isinstance(err, (TypeError, ValueError)) and " of a staged plane" in str(err) \
                and not getattr(err, "_eagle_hinted", False):
            err._eagle_hinted = True
            at = ", ".join(map(str, self.traced))
            err.add_note(f"{self.name}: the Python float argument(s) at position {at} were traced as one-cell arrays, "
                         "as jax.jit traces Python scalars (a new value replays the staged graph). If the function "
                         "needs one as a Python number, mark it static on the builder: "
                         "@eagle_fx.Graph.builder(static_argnums=...) or static_argnames=...")
        return False


_PLAIN = (np.ndarray, float, int, bool)


def holds_jax_arrays(args) -> bool:
    """Whether a call's arguments hold a jax.Array (then it runs on XLA, through to_jax)."""
    for a in args:
        if type(a) in _PLAIN or a is None:     # the common case: no tree to walk
            continue
        if any(is_jax_array(leaf) for leaf in tree_flatten(a)[0]):
            return True
    return False


def _refuse_jax_arrays(name, args):
    """Where no XLA route exists (a graph-returning vmap), a call on jax.Arrays is refused."""
    for k, a in enumerate(args):
        if holds_jax_arrays((a,)):
            raise TypeError(f"{name}: argument {k} holds a jax.Array; a transform that returns a graph takes NumPy "
                            "arrays (pass np.asarray(x)), or make the function a JAX one with eagle_fx.to_jax(f) "
                            "and use jax.vmap on it")


def jax_function(f, args, jitted=None):
    """(a jitted JAX function of f, the array arguments to call it with): f through to_jax under
    jax.jit, the arguments that are not arrays static (as to_jax keeps them), cached in `jitted`
    ({static positions and values: function}) when given."""
    import jax
    from .to_jax import to_jax
    static = tuple((k, a) for k, a in enumerate(args) if not (isinstance(a, np.ndarray) or is_jax_array(a)))
    key = tuple(k for k, _ in static), tuple(cache.static_key(a) if isinstance(a, cache._STATIC) else id(a)
                                            for _, a in static)
    fn = jitted.get(key) if jitted is not None else None
    if fn is None:
        fixed = dict(static)
        g = to_jax(f)

        def pure(*arrays):
            it = iter(arrays)
            return g(*[fixed[k] if k in fixed else next(it) for k in range(len(args))])
        fn = jax.jit(pure)
        if jitted is not None:
            jitted[key] = fn
    return fn, [a for k, a in enumerate(args) if k not in dict(static)]


def name_of(f):
    return getattr(f, "__name__", type(f).__name__)


def sig(kind, f, *options):
    """The cache's name for transform `kind` of `f`: equal for grad(f) made twice."""
    return (kind, f._sig if isinstance(f, Transformed) else f) + tuple(map(freeze, options))


def freeze(x):
    """A hashable copy of an option (lists of axes become tuples)."""
    if x is None or type(x) in (int, bool):
        return x
    if isinstance(x, (list, tuple)):
        return (type(x).__name__,) + tuple(freeze(v) for v in x)
    if isinstance(x, dict):
        return ("dict",) + tuple((k, freeze(v)) for k, v in x.items())
    return x


def run(g):
    """Replay `g` and return copies of its result (as its result views show it: a Jacobian in JAX's shape)."""
    g.launch()
    return g.result_copy(give=True)


def stage(f, args, api):
    """The closed Program `f` stages for these arguments: a builder builds its graph (closed, not
    lowered), a transformed function makes it, a plain function must return a Graph (it calls a
    builder or a transform inside: a lambda around jvp). Transforms stage even inside
    disable_staging(), as JAX's grad and vmap run under disable_jit."""
    with CONTEXT.enter(deferring=True), disable_staging(False), seams.staging(api):
        return _stage(f, args, api)


def _stage(f, args, api):
    if isinstance(f, Transformed):
        return f.closed(*args)
    if not callable(f):
        raise TypeError(f"{api}: takes a graph builder (@eagle_fx.Graph.builder) or a transformed function, got "
                        f"{type(f).__name__}")
    if isinstance(f, Builder):
        g = f(*args)
    else:
        other = _restage(f, args, api)       # first, so what the function leaves behind is from its real staging
        g = _call_plain(f, args, api)
        if not isinstance(g, (Graph, Closed)):
            g = merge(g, api, name_of(f)) or g        # a tree of transforms' results: (y, t), jvp(...)[1]
    if not isinstance(g, Graph) and isinstance(g, (np.ndarray, np.generic, float, int, Plane)):
        what = "ndarray" if isinstance(g, np.ndarray) else "a graph's result" if isinstance(g, Plane) else \
            type(g).__name__
        raise TypeError(f"{api}: {name_of(f)!r} returned {what}, not a Graph: a transform stages the "
                        "function once, so NumPy math on its arguments (or a kernel called on them, or a replayed "
                        "graph's values) would be computed in Python for the arrays it was staged with. Write it as "
                        "a builder (@eagle_fx.Graph.builder: kernel calls and NumPy on its arguments are staged "
                        "into its graph) and transform that, or return a builder's graph (lambda x: f(x))")
    if not isinstance(g, (Graph, Closed)):
        raise TypeError(f"{api}: {name_of(f)!r} returned {type(g).__name__}; a transform takes a graph builder "
                        "(@eagle_fx.Graph.builder on a function that returns its graph), a transformed function, "
                        "or a function returning one transform's result (lambda x, t: eagle_fx.jvp(f, (x,), (t,)))")
    c = closed_of(g)
    if c.record:
        raise TransformError(f"{api}: a record=True graph cannot be transformed; transform the plain builder")
    if not isinstance(f, Builder):
        _check_plain(f, args, c, api, other)
    return c


def _call_plain(f, args, api):
    """f called on its arguments, guarded; the transforms it calls return their graphs to this one."""
    with CONTEXT.enter(transforming=True), guarding(api, f, args) as guarded:
        return f(*guarded)


def _restage(f, args, api, which=None):
    """Plain function f staged again on other values of its floating arguments (those in `which`;
    all when None): the text of its Program, where each plane comes from (_sources) and a copy of
    the arrays f made or reaches by name, to compare with its staging on the real values. None when
    it raised: other values may fail for reasons of their own (a Cholesky factor), proving nothing."""
    other = other_values(args, which)
    try:
        with np.errstate(all="ignore"):
            c = closed_of(_call_plain(f, other, api))
    except Exception:
        return None
    src = _sources(f, other, c)
    return str(c.program), src, [e.array.copy() if o in _OWN else None for e, o in zip(c.planes, src)]


_OWN = ("closure", "made")


def _sources(f, args, c):
    """Per plane of c, where its array comes from: ("argument", k, j, byte offset, strides, shape)
    for leaf j of argument k or a view of it; "added" for a plane a transform added; "closure" for
    an array f reaches by name; "made" for an array f made while staging."""
    leaves = [(k, j, x) for k, a in enumerate(args) for j, x in enumerate(tree_flatten(a, is_leaf=is_array)[0])
              if isinstance(x, np.ndarray)]
    known, out = None, []
    for e in c.planes:
        if e.origin == "added":
            out.append("added")
            continue
        hit = next(((k, j, x) for k, j, x in leaves if e.array is x or np.shares_memory(e.array, x)), None)
        if hit is not None:
            k, j, x = hit
            at = e.array.__array_interface__["data"][0] - x.__array_interface__["data"][0]
            out.append(("argument", k, j, at, e.array.strides, e.array.shape))
        else:
            known = _closure_arrays(f) if known is None else known
            out.append("closure" if id(e.array) in known else "made")
    return out


def _varying(c, src, other):
    """The planes of c whose arrays (made or reached by name) differ from `other`'s (a _restage)."""
    return [e for e, o, x in zip(c.planes, src, other[2])
            if o in _OWN and not np.array_equal(x, e.array, equal_nan=e.array.dtype.kind in "fc")]


def _check_plain(f, args, c, api, other):
    """A builder stages what NumPy does to its arguments; a plain function handed to a transform
    (`lambda x, t: eagle_fx.jvp(f, (x * 2,), (t,))`) computes on the arrays themselves, and an
    array it makes is a constant to the graph, read as it was when staged. The graph may read the
    arguments (or views of them), arrays reached by closure, and planes transforms add; a graph
    that reads other arrays is not kept by the staging cache (staged at every call), and
    `c.made` lists those that change with the arguments' values (derivatives refuse to
    differentiate through them). Staged again on other values (`other`), a function whose graph
    changes read a value in Python past the guard (np.asarray(x)[0] > 0): refused here."""
    src = _sources(f, args, c)
    if other is not None and (other[0] != str(c.program) or other[1] != src):
        raise ValueReadError(
            f"{api}: {where(f)} stages a different graph when its arguments hold other values: it reads their values "
            "in Python past the guard (np.asarray(x)[0] > 0, np.float64(x[0]), x.view(np.ndarray)) to take a "
            "branch or make a constant, which the transform would replay for every instance and every later call "
            "with the same layout. Decide on the device inside a builder (a cell: `if flag:` / hawk_fx.math.where "
            "in a kernel), or pass the value as a Python number (static: it keys the cache)")
    varying = _varying(c, src, other) if other is not None else None
    for e, o in zip(c.planes, src):
        if o == "closure" and varying is not None and any(e is v for v in varying):
            raise ValueReadError(f"{api}: {where(f)} writes values computed from its arguments into an array of "
                                 f"shape {e.array.shape} it reaches by name, in Python while it is staged; the graph "
                                 "would read what the last staging wrote. Compute it inside a builder (NumPy on a "
                                 "builder's arguments is staged) or in a kernel")
    made = [e for e, o in zip(c.planes, src) if o == "made"]
    if made:
        cache.uncacheable()
        for e in made:
            e.origin = "derived"
    c.made = made if varying is None else [e for e in made if any(e is v for v in varying)]


def _closure_arrays(f, depth=2):
    """ids of the arrays a function reaches by name: its globals, closure and defaults, and those
    of the functions and builders found there, `depth` levels down."""
    found, seen = set(), set()

    def visit(v, d):
        if isinstance(v, np.ndarray):
            found.add(id(v))
        elif isinstance(v, (list, tuple)):
            for x in v[:64]:
                visit(x, d)
        elif isinstance(v, dict):
            for x in list(v.values())[:64]:
                visit(x, d)
        elif d > 0 and callable(v) and id(v) not in seen:
            seen.add(id(v))
            fn = getattr(v, "fn", None) or getattr(v, "__wrapped__", None) or v
            code = getattr(fn, "__code__", None)
            glb = getattr(fn, "__globals__", {})
            for name in (code.co_names if code is not None else ()):
                if name in glb:
                    visit(glb[name], d - 1)
            for cell in getattr(fn, "__closure__", None) or ():
                try:
                    visit(cell.cell_contents, d - 1)
                except ValueError:          # an empty cell
                    pass
            for x in getattr(fn, "__defaults__", None) or ():
                visit(x, d - 1)
    visit(f, depth + 1)
    return found


def make_program(f):
    """A function returning the Program that `f` stages for these arguments."""
    def program(*args):
        return stage(f, args, "eagle_fx.make_program").program
    return program


def make_graph(f):
    """A function returning the built Graph that `f` stages for these arguments, to replay:
    make_graph(lambda x, v: eagle_fx.jvp(eagle_fx.grad(f), (x,), (v,)))(x, v) is a
    Hessian-vector product graph; bind new arrays to it, launch it, read its result."""
    def graph(*args):
        return Graph.from_closed(stage(f, args, "eagle_fx.make_graph"))
    return graph


# ---------------------------------------------------------------------------------------------
# the pieces every transform needs from a staged graph

def is_array(x):
    return isinstance(x, np.ndarray)


def float_array(a):
    return isinstance(a, np.ndarray) and a.dtype.kind == "f"


class Staged:
    """A staged graph seen as a function: its Program restricted to the result, and which leaf of
    which builder argument each Program input is (`arg_of`: (argument, leaf) or None)."""

    def __init__(self, f, args, api):
        self.api, self.f, self.fname, self.args = api, f, name_of(f), args
        self.g = g = stage(f, args, api)        # a Closed
        leaves, self.tree = g.result_vars()
        if not leaves:
            raise TypeError(f"{api}: {self.fname} declares no result (g.result = ...); transforms act on results")
        self.results = leaves
        self.prog = dce(g.program.replace(outputs=leaves))
        self.planes = list(g.planes)
        self.leaves = [tree_flatten(a, is_leaf=is_array)[0] for a in args]
        self.arg_trees = [tree_flatten(a, is_leaf=is_array)[1] for a in args]
        where = {}
        for k, ls in enumerate(self.leaves):
            for j, x in enumerate(ls):
                if isinstance(x, np.ndarray):
                    where.setdefault(id(x), (k, j))
        self.arg_of = [where.get(id(e.array)) for e in self.planes]
        # planes holding an argument with its axes permuted (a vmap batching another axis hands its
        # graph np.moveaxis(x, axis, 0)): {plane index: perm}, the plane is np.transpose(x, perm).
        # Derivatives follow x: a tangent goes in permuted, a cotangent comes back seen unpermuted.
        self.moved = {}
        for i, e in enumerate(self.planes):
            if self.arg_of[i] is None and e.array.dtype.kind == "f":
                for kj in where.values():
                    perm = axes_permutation(e.array, self.leaves[kj[0]][kj[1]])
                    if perm is not None:
                        self.arg_of[i], self.moved[i] = kj, perm
                        break
        self.back = {}        # a cotangent Var of a moved plane -> the view that shows it in its argument's layout
        # planes that are views of an argument (a[:1] in the builder): not followed by derivatives
        self.view_of = {}
        for e, a in zip(self.planes, self.arg_of):
            if a is None and e.array.dtype.kind == "f":
                hit = next((kj for kj, x in ((kj, self.leaves[kj[0]][kj[1]]) for kj in where.values())
                            if x.dtype.kind == "f" and np.shares_memory(e.array, x)), None)
                if hit is not None:
                    self.view_of[hit] = e
        self.n = g.n

    def reversible(self):
        """Staged again with reversible reverse passes when it holds a reverse pass through a
        loop, for reverse mode over it (transforms/reverse_again.py)."""
        if not recomputing() and holds_reverse(self.g.program):
            with reversible():
                self.__init__(self.f, self.args, self.api)

    def refuse_made(self, wrt):
        """An array a plain function computed in Python from a differentiated argument (u.sum(),
        u * 2, np.array(u)) is a constant to the graph: the derivative through it would be lost.
        Refuse it rather than answer without it. When other floating arguments were changed too
        by the staging check, the function is staged again with only the differentiated ones
        changed, so an array computed from the others (c * 2) stays a constant, as in JAX."""
        made = [e for e in self.g.made if e.array.dtype.kind == "f"]
        if not made or not wrt:
            return
        floats = {(k, j) for k, ls in enumerate(self.leaves) for j, x in enumerate(ls) if float_array(x)}
        if floats - set(wrt):
            other = _restage(self.f, self.args, self.api, set(wrt))
            src = _sources(self.f, self.args, self.g)
            if other is not None and other[:2] == (str(self.g.program), src):
                varying = _varying(self.g, src, other)
                made = [e for e in made if any(e is v for v in varying)]
        if made:
            names = arg_names(self.f, len(self.args))
            which = " or ".join(dict.fromkeys(names[k] for k, _ in wrt))
            raise TransformError(f"{self.api}: {where(self.f)} hands its graph an array of shape "
                                 f"{made[0].array.shape} it computed in Python from {which} (NumPy on an argument "
                                 "outside a builder: u.sum(), u.copy(), np.array(u), u[[0, 2]], u * 2.0; or a kernel "
                                 "called on it with no builder staging: an eagle_fx.Graph() made in a plain function "
                                 "runs its kernel calls at once); the graph sees a constant, so the derivative through "
                                 "it would be lost. Do that inside a builder (make the function a "
                                 "@eagle_fx.Graph.builder: it stages kernel calls and NumPy on its arguments) or in a "
                                 "kernel, and hand the graph the argument itself")

    def refuse_views(self, wrt):
        """Derivatives follow the arrays passed to kernels; a view of a differentiated argument made
        in the builder's Python would get no derivative: refuse it rather than answer 0."""
        nested = self.g.merged_by
        for a in wrt:
            e = self.view_of.get(a)
            if nested is not None and a not in self.arg_of:    # reshaped, or a copy (repeated, an axis moved)
                names = arg_names(self.f, len(self.args))
                who = f"{nested} is" if self.fname == nested else f"{where(self.f)} calls {nested},"
                raise TransformError(
                    f"{self.api}: {who} a nested vmap: it hands its graph argument {names[a[0]]} of shape "
                    f"{self.leaves[a[0]][a[1]].shape} as one batch, its two batch axes merged into one (a reshape "
                    "or a copy of it), and derivatives follow the arrays given to kernels, not that array. Take the "
                    "derivative inside the batches (eagle_fx.vmap(eagle_fx.vmap(eagle_fx.jacfwd(f))), or jacrev, "
                    "grad: each instance's), or merge the axes yourself and batch once: differentiate "
                    "eagle_fx.vmap(f) at x.reshape(B2 * B1, ...)")
            if e is not None:
                names = arg_names(self.f, len(self.args))
                raise TransformError(f"{self.api}: {where(self.f)} passes a kernel a view of argument {names[a[0]]} "
                                     f"(an array of shape {e.array.shape} sharing its memory, made in Python while "
                                     "staging); derivatives follow the arrays given to kernels: pass the whole "
                                     "array and index it inside the kernel, or pass the part as its own argument")

    def graph(self, prog, extra_planes, tree, n_results, views=None):
        """The closed Program running `prog` over the staged planes and `extra_planes`."""
        return self.g.derive(prog, self.planes + list(extra_planes), tree, n_results, views)

    def tangent_plane(self, i, t):
        """The tangent array plane i reads for its argument's tangent `t`: permuted as the plane is."""
        return t if i not in self.moved else np.transpose(t, self.moved[i])

    def cotangents(self, flags, outputs, eqns, api):
        """{(argument, leaf): its cotangent Var} from `outputs`, one per plane flagged. A leaf the
        graph reads through more than one plane gets their sum; a moved plane's cotangent is kept
        in the plane's layout and noted in `back`, to be seen in the argument's."""
        grads, perm_of = {}, {}
        for i, v in zip([i for i, fl in enumerate(flags) if fl], outputs):
            a, perm = self.arg_of[i], self.moved.get(i)
            if a not in grads:
                grads[a], perm_of[a] = v, perm
                continue
            if perm_of[a] != perm:
                names = arg_names(self.f, len(self.args))
                raise TransformError(
                    f"{seams.composition(api, self.fname)}: {where(self.f)} hands its graph argument {names[a[0]]} "
                    f"of shape {self.leaves[a[0]][a[1]].shape} twice with its axes in different orders (a vmap "
                    "batching it along one axis in one place and another axis in another, or x and x.T), and reverse "
                    "mode cannot add the two cotangents' layouts. Make the two uses two arguments, called with x and "
                    "a copy made outside (y = x.copy()), differentiate with respect to both (argnums=(0, 1)) and "
                    "add the two derivatives")
            w = Var(v.aval)
            eqns.append(Eqn(ir.add_any_p, [grads[a], v], [w], {}))
            grads[a] = w
        for a, perm in perm_of.items():
            if perm is not None:
                self.back[grads[a]] = _unpermute(perm)
        return grads

    def capacity(self, trip, e):
        return loop_capacity(self.api, trip, e, self.prog.inputs, [p.array for p in self.planes])


def axes_permutation(view, x):
    """perm with `view` exactly np.transpose(x, perm) (what a vmap over another axis hands a
    kernel: the same memory, axes reordered), or None (another view, or x's own layout)."""
    if view.ndim != x.ndim or view.ndim < 2 or view.dtype != x.dtype or view.size != x.size or \
            view.__array_interface__["data"][0] != x.__array_interface__["data"][0]:
        return None
    perm, free = [], list(range(x.ndim))
    for n, st in zip(view.shape, view.strides):
        p = next((p for p in free if x.shape[p] == n and (x.strides[p] == st or n <= 1)), None)
        if p is None:
            return None
        perm.append(p)
        free.remove(p)
    if perm == sorted(perm):
        return None
    return tuple(perm)


def _unpermute(perm):
    """The view giving a cotangent of np.transpose(x, perm) in x's layout; batch axes in front are kept."""
    inv = tuple(int(i) for i in np.argsort(perm))

    def view(a):
        lead = a.ndim - len(inv)
        return np.transpose(a, tuple(range(lead)) + tuple(lead + i for i in inv))
    view.lead_aware = True
    return view


def graph_of(s: Staged, prog, outputs, extra_planes):
    """The closed Program running `prog` with result `outputs` (a tree whose leaves are Program Vars)."""
    leaves, tree = tree_flatten(outputs, is_leaf=lambda v: isinstance(v, Var))
    views = [s.back.get(v) for v in leaves] if s.back else None
    return s.graph(dce(prog.replace(outputs=leaves)), extra_planes, tree, len(leaves),
                   views if views and any(w is not None for w in views) else None)




def arg_names(f, n):
    """The names of f's first n parameters (positions where f has no signature to read)."""
    sig_ = getattr(f, "signature", None)
    if sig_ is None and callable(f) and not isinstance(f, Transformed):
        try:
            sig_ = inspect.signature(f)
        except (TypeError, ValueError):
            sig_ = None
    names = list(sig_.parameters)[:n] if sig_ is not None else []
    return names + [str(k) for k in range(len(names), n)]


def refuse_no_float(api, name, arg, at=None):
    """Argument `name`, picked by argnums, holds no floating array: it has no derivative. Integer
    inputs have none, as jax.grad says (it requires inexact inputs). `at`: the user's function."""
    ints = [x for x in tree_flatten(arg, is_leaf=is_array)[0]
            if isinstance(x, (int, np.integer, np.ndarray)) and np.asarray(x).dtype.kind in "biu"]
    head, tail = api, ""
    if at is not None:                       # api: the composition as written; at: the user's function
        head, tail = api[api.rfind("eagle_fx."):].split("(")[0], f" (in {api}, at {at})"
    if ints:
        raise TypeError(f"{head}: argument {name} holds no floating array, only integer values "
                        f"({np.asarray(ints[0]).dtype}); integer inputs have no derivative (as in JAX, a derivative "
                        f"needs floating inputs): pass a float array (x.astype(np.float64)), or pick another argnums"
                        f"{tail}")
    raise TypeError(f"{head}: argument {name} is {type(arg).__name__} and holds no floating array; it has no "
                    f"derivative: pass a float array (or a tree of them), or pick another argnums{tail}")


def argnums_checked(argnums, api):
    """(positions as given, multi): an int (a NumPy integer too), or a tuple or list of them when
    multi; anything else is refused, as JAX refuses it."""
    multi = isinstance(argnums, (tuple, list))
    try:
        pick = tuple(operator.index(k) for k in (argnums if multi else (argnums,)))
    except TypeError:
        raise TypeError(f"{api}: argnums must be an int or a tuple of ints, got {argnums!r}") from None
    if multi and not pick:
        raise ValueError(f"{api}: argnums is empty; give an int or a tuple of ints")
    return pick, multi


def argnums_of(argnums, nargs, api):
    """(positions, multi): argnums as non-negative positions; multi when a tuple was given."""
    pick, multi = argnums_checked(argnums, api)
    for k in pick:
        if not -nargs <= k < nargs:
            raise ValueError(f"{api}: argnums {k!r} for {nargs} positional arguments")
    return tuple(k % nargs for k in pick), multi
