"""Staging: running a rewritten builder appends equations to scopes instead of computing.

Planes are buffers: a builder argument, an array reached by closure, a kernel result. A plane has
an SSA version per write: a `Mutable` write makes a new version of the same plane (in place), a
name rebinding (`x = dbl(x)`) makes a new plane. A `Scope` maps planes to their current version;
a sub-scope (an arm of a cond, a loop body) captures the versions it reads from its parent as its
inputs, and reports the outer planes it writes, which become outputs of the cond/while equation.
"""
from __future__ import annotations

import contextlib
import gc
import threading
import warnings
import weakref

import numpy as np

from hawk_fx.core import AVal, Eqn, EqnInfo, LeakedTracerError, Literal, Program, Tracer, Var, abstract_eval
from hawk_fx.context import CONTEXT
from hawk_fx.source import SourceInfo, user_line
from hawk_fx.trace import UNDEF
from hawk_fx.tree import tree_unflatten

from .. import ir
from . import staged_numpy, views
from .hazards import check_fork_hazards


class UncappedLoopWarning(UserWarning):
    """A device `while` with no cap: it returns only when its guard cell reads 0."""


class Extern:
    """A plane that is a user's array: a builder argument (named) or an array the builder reached.
    `origin` says where the array comes from, for the transforms that stage plain functions:
    "user" (the caller's, or reached by name), "added" (a transform added it: a seed, a tangent, a
    batched argument) or "derived" (a plain function computed it from its arguments while staged)."""

    __slots__ = ("array", "name", "origin", "__weakref__")

    def __init__(self, array, name=None, origin="user"):
        self.array, self.name, self.origin = array, name, origin

    def __repr__(self):
        return f"<array {self.name or ''} {self.array.dtype}{list(self.array.shape)}>"


def argument_plane(array, name) -> "Plane":
    """A builder argument as the builder sees it: a staged plane over the caller's array (its graph is
    set when the builder makes it), so NumPy on it is staged, never computed once at build."""
    p = Plane(None, ir.plane_aval(array.shape, array.dtype), key=Extern(array, name))
    p.label = name
    return p


class PlaneKey:
    """The identity of a staged buffer. Scopes key versions by it, so they do not keep handles alive."""

    __slots__ = ("__weakref__",)


class Plane(staged_numpy.NdarrayProtocol):
    """A staged array in a graph: NumPy on it is staged or refused (staged_numpy.NdarrayProtocol).
    Once the graph is built it reads as its array (np.asarray, print)."""

    __slots__ = ("graph", "aval", "key", "var", "label", "info", "kept", "__weakref__")

    def __init__(self, graph, aval: AVal, key=None, info: EqnInfo | None = None, var: Var | None = None):
        self.graph, self.aval = graph, aval
        self.key = PlaneKey() if key is None else key
        self.var = var          # a version of the plane; every version of a plane lives in one buffer
        self.label, self.info, self.kept = None, info, False

    # reading the value after the graph is built
    def _check_use(self, use="eagle: the value read as an array (np.asarray, print, a NumPy or hawk.math function)"):
        """A plane a builder staged is that builder's: once it has finished, a use elsewhere is a leak."""
        if self.graph is None:
            raise TypeError(f"eagle.Graph.builder {_here()}: a builder argument is used before its graph exists; "
                            "create it first: g = eagle.Graph()")
        if self.graph.made_by is not None and _finished(self.graph) and self.graph not in CONTEXT.host_nodes:
            _refuse_foreign(self, use)

    def _array(self):
        self._check_use()
        arr = self.graph.array_of(self)
        if arr is None:
            raise RuntimeError(f"eagle: plane {self.label or ''!r} has no value yet: build the graph "
                               "(`g.build()`, or call the builder) and launch it first")
        return arr

    def __repr__(self):
        arr = self.graph.array_of(self) if self.graph is not None else None
        if arr is None:
            return f"<eagle plane {self.label or ''} {self.aval} (not built yet)>"
        return repr(arr)

    def __str__(self):
        arr = self.graph.array_of(self) if self.graph is not None else None
        return str(arr) if arr is not None else repr(self)

    @property
    def shape(self):
        return self.aval.shape

    @property
    def dtype(self):
        return self.aval.dtype

    def __bool__(self):
        if _current_source() is not None:          # a builder is staging: Python asks for a value it cannot have yet
            raise TypeError(f"eagle.Graph.builder {_here()}: plane {self.label or ''!r} ({self.aval}) is used as a "
                            "Python bool (bool(), assert, and/or/not, a comprehension's if); only a builder's own "
                            "if/while/match stage a device condition, on a one-cell uint32 array: have a kernel "
                            "write the condition into a cell (flag = hm.uint32(hawk.sum(...))) and test `if flag:`")
        raise TypeError(f"eagle: plane {self.label or ''!r} ({self.aval}) is used as a Python bool outside a "
                        "builder's if/while; device conditions are one-cell uint32 arrays inside a builder")

    def __len__(self):
        return self.aval.shape[0]

    __hash__ = object.__hash__      # == stages a comparison; identity keeps planes usable in sets

    def _staging(self, what):
        """The trace to stage `what` into, or None when the graph is built (the plane reads as its
        array); refuses a plane whose graph does not exist yet or one leaked into another builder."""
        if self.graph is None:
            raise TypeError(f"eagle.Graph.builder {_here()}: {what} on a builder argument before the graph "
                            "exists; create it first: g = eagle.Graph()")
        if self.graph.is_built:
            self._check_use(f"eagle: {what}")       # a builder's plane after its builder finished: a leak
            return None
        return self.graph.trace

    def _derived(self, key, shape):
        """A view of this plane (views.ViewKey / ReshapeKey): a handle, nothing staged until it is read."""
        t = self.graph.trace
        if shape and shape[-1] != self.aval.shape[-1]:
            t.view_ns.update((shape[-1], self.aval.shape[-1]))
        h = Plane(self.graph, ir.plane_aval(shape, self.aval.dtype), key=key)     # its name is its own
        t.handles.add(h)
        return h

    @staticmethod
    def _where() -> str:
        return _here()


def _here() -> str:
    """`builder:line` of the builder line being staged now."""
    src = _current_source()
    if src is None:
        return "?"
    line = user_line(src.filename)
    return src.where(line) if line else src.name


class LoopMark:
    """What eagle_fx.collect needs of the device loop it is called in: the loop's bound, its turn
    counter, and the row buffers made for it (one per collect call, kept across the passes that
    find the loop's carries). `n_used`: the buffers the current pass has taken."""

    def __init__(self, cap, counted):
        self.cap, self.counted = cap, counted
        self.turn, self.buffers, self.n_used = None, [], 0

    def holds(self, value) -> bool:
        """Is `value` a collect's rows (or a list or tuple of them)?"""
        if isinstance(value, (list, tuple)):
            return bool(value) and all(self.holds(v) for v in value)
        return any(value is b for b in self.buffers)


class Scope:
    def __init__(self, trace: "GraphTrace", parent: "Scope | None"):
        self.trace, self.parent = trace, parent
        self.eqns: list[Eqn] = []
        self.current: dict = {}        # plane key -> Var (its version in this scope)
        self.captures: dict = {}       # plane key -> (inner Var, outer Var), in order of first read
        self.written: dict = {}        # outer planes written here (keys, in order of first write)
        self.local: set = set()
        self.derived: dict = {}        # view key -> (its source's Var, the view's Var): one slice per version

    def read(self, key) -> Var:
        if isinstance(key, views.DERIVED):
            src = self.read(key.src)
            hit = self.derived.get(key)
            if hit is not None and hit[0] is src:
                return hit[1]
            v = key.stage_read(src, self.eqns, self.trace.info())
            self.derived[key] = (src, v)
            return v
        v = self.current.get(key)
        if v is not None:
            return v
        if self.parent is None:
            v = self.trace.root_input(key)
        else:
            outer = self.parent.read(key)
            v = Var(outer.aval, outer.hint)
            self.captures[key] = (v, outer)
        self.current[key] = v
        return v

    def define(self, key, var):
        self.local.add(key)
        self.current[key] = var

    def write(self, key, var):
        if isinstance(key, views.DERIVED):       # a write through a view updates its source, in place
            src = key.stage_write(self.read(key.src), var, self.eqns, self.trace.info())
            self.write(key.src, src)
            self.derived.pop(key, None)          # `var` may live in another plane's buffer: read it back anew
            return
        if key not in self.local:
            self.written.setdefault(key)
        self.current[key] = var


class Access:
    __slots__ = ("seq", "branch", "info", "reads", "writes", "what")

    def __init__(self, seq, branch, info, reads, writes, what=None):
        self.seq, self.branch, self.info, self.reads, self.writes = seq, branch, info, reads, writes
        self.what = what        # the kernel or host function, naming a node the builder did not assign

    def describe(self) -> str:
        """`'u' (node 1, at bad:6)`: the node's name (its kernel's when unassigned), number and line."""
        at = f", at {self.info.where}" if self.info.where else ""
        return f"{self.info.name or self.what or '?'!r} (node {self.seq}{at})"


class Wait:
    __slots__ = ("branch", "seq_at", "writer")

    def __init__(self, branch, seq_at, writer: Access):
        self.branch, self.seq_at, self.writer = branch, seq_at, writer


def _proxy(aval: AVal):
    """A zero-memory array with aval's shape and dtype, for role validation at staging time."""
    return np.lib.stride_tricks.as_strided(np.zeros(1, aval.dtype), aval.shape, (0,) * len(aval.shape))


class GraphTrace:
    """The stager of one Graph: its root scope, inputs, forks and accesses."""

    def __init__(self, graph):
        self.graph = graph
        self.root = Scope(self, None)
        self.scope = self.root
        self.inputs: list[Var] = []
        self.input_planes: list[Extern] = []
        self.externs: dict[int, Extern] = {}
        self.arg_names: dict[int, str] = {}
        self.n: int | None = None
        self.view_ns: set = set()          # sample counts of views (x[:2] has 2 samples in a graph of n)
        self.handles = weakref.WeakSet()
        self.buffers: list[Plane] = []     # buffer= planes: nameable for gradients, kept by the graph
        self.accesses: list[Access] = []
        self.waits: list[Wait] = []
        self.pinned: dict[int, tuple] = {}  # id(array) -> (array, plane): a block's result handed out as an array
        self.phis: dict = {}               # plane key -> (where, origin keys): a name's value after device flow
        self.branch: tuple = ()
        self.fork_ids = 0
        self.seq = 0
        self.layouts: dict = {}            # (kernel, argument shapes, dtypes and numbers) -> (Layout, n)

    # -- planes ------------------------------------------------------------------------------
    def extern(self, arr: np.ndarray):
        """The plane key of a user's array: its Extern, or the plane a pinned block result stands for."""
        pin = self.pinned.get(id(arr))
        if pin is not None and pin[0] is arr:
            return pin[1].key
        e = self.externs.get(id(arr))
        if e is None or e.array is not arr:
            base = _numpy_base(arr)
            found = views.of_array(arr, base) if base is not None else None
            if found is not None:
                return self.view_of_base(base, *found)
            if base is not None and arr.flags.writeable:    # a read-only one (np.broadcast_to) is read as it is
                raise TypeError(f"eagle.Graph.builder {_here()}: a NumPy view of shape {arr.shape} of an array of shape "
                                f"{base.shape} that no basic index and reshape of it make (a transpose, a broadcast, "
                                "another dtype); writes through it would miss the array it views. Take a view by "
                                "indexing or reshaping that array (z[:, k] and z.T[k] are such views; z.T is not), "
                                "or pass a new array: np.ascontiguousarray(view)")
            e = self.externs[id(arr)] = Extern(arr, self.arg_names.get(id(arr)))
        return e

    def view_of_base(self, base, src, index, shape):
        """A NumPy view (`z[1]`, `z[::2]`, `z.reshape(...)`: a new ndarray at each use) of an array
        the builder reached is a view of its base's plane, as for planes: writes through it land in
        the base, and every later read of the base or of a view of it sees them (views.of_array)."""
        key = self.extern(base)
        if src is not None:
            key = views.ReshapeKey(key, src, base.shape)
        src = src or base.shape
        if any(r != range(d) for r, d in zip(index, src)):
            key = views.ViewKey(key, index, ir.index_shape(index), src)
        if shape is not None:
            key = views.ReshapeKey(key, shape, ir.index_shape(index))
        last = (shape or ir.index_shape(index))[-1]
        if last != base.shape[-1]:
            self.view_ns.update((last, base.shape[-1]))
        return key

    def plane_of_array(self, arr) -> Plane:
        """A staged plane over a user's array (or over the block result the array stands for): how a
        block called from plain code sees its arguments, and what `out=arr` writes into."""
        key = self.extern(arr)
        pin = self.pinned.get(id(arr))
        aval = pin[1].aval if pin is not None and pin[0] is arr else ir.plane_aval(arr.shape, arr.dtype)
        p = Plane(self.graph, aval, key=key)
        p.label = getattr(key, "name", None)
        self.handles.add(p)
        return p

    # -- in-place writes to names device flow rebound ---------------------------------------------
    def note_phi(self, plane, values, where, shared=False):
        """`plane` is a name's value after a device if/loop (or a loop carry at the start of a turn).
        In NumPy the name is then one of several arrays: `values` lists (value, keys made inside the
        arm or None) for each way in; a value not made there (kept by an arm, the entry value of a
        loop that may run 0 turns) is an origin: NumPy would update it in place through the name."""
        origins = {_SHARED} if shared else set()
        for v, local in values:
            if not _is_device(v):
                continue
            k = self.key_of(v, "eagle", "a value")
            if local is not None and k in local:
                continue
            r = views.root_key(k)
            origins.add(r if isinstance(k, PlaneKey) else _SHARED)     # an argument, a view: seen elsewhere
            origins |= self.phis.get(r, (None, set()))[1]
        if origins:
            self.phis[plane.key] = (where, origins)

    def check_inplace(self, key, what):
        """Refuse an in-place write to a name's value after device flow when an array NumPy could be
        writing through it (see note_phi) is still seen through another name, view or result."""
        root = views.root_key(key)
        entry = self.phis.get(root)
        if entry is None or not any(self._observable(o, root) for o in entry[1]):
            return
        raise TypeError(f"eagle.Graph.builder {_here()}: {what} of a value that the device if/match/loop at "
                        f"{entry[0]} gave its name. In NumPy the name may still be the array it held before (an "
                        "arm that keeps it, a loop of 0 turns, the first turn of a loop), which another name, "
                        "view or result still sees; staged, it is a new array, so the update cannot mean the "
                        "same. Make a new array (y = y + 1.0 rather than y += 1.0), or update the array before "
                        "the if/loop")

    def _observable(self, origin, root, collected=False) -> bool:
        if origin is _SHARED or not isinstance(origin, PlaneKey) or any(b.key is origin for b in self.buffers):
            return True
        if any(h.key is not root and views.root_key(h.key) is origin for h in list(self.handles)):
            if collected:
                return True
            gc.collect()            # planes held only by garbage (closure cycles) do not count
            return self._observable(origin, root, True)
        return False

    def root_input(self, key) -> Var:
        if isinstance(key, Extern):
            v = Var(ir.plane_aval(key.array.shape, key.array.dtype), key.name)
            self.inputs.append(v)
            self.input_planes.append(key)
            return v
        raise ValueError("eagle.Graph: a plane computed inside a device if/loop body is read outside it; assign "
                         "it to a name that exists before the if/loop, so the construct carries it out")

    def key_of(self, value, api, what):
        if isinstance(value, _LoopLocal):
            value._fail()
        if isinstance(value, Plane):
            if value.graph is not self.graph:
                _refuse_foreign(value, f"{api}: {what}")
            return value.key
        if isinstance(value, Tracer):
            if not value.trace.active:
                value.trace.leaked(value, f"{api}: {what} is a traced value")
            raise TypeError(f"{api}: {what} is a value traced inside a kernel body; graphs take arrays")
        if is_array(value):
            return self.extern(value)
        if type(value).__module__.split(".")[0] in ("jax", "jaxlib"):
            raise NotImplementedError(f"{api}: {what} is a traced {type(value).__name__} (inside jax.jit, jax.grad or "
                                      "jax.vmap): a builder stages concrete arrays; to call a graph from JAX code, "
                                      "wrap the builder: eagle_fx.to_jax(builder)")
        if type(value).__module__.split(".")[0] == "cupy":
            raise NotImplementedError(f"{api}: {what} is a {type(value).__module__}.{type(value).__name__}: graphs run "
                                      "on NumPy arrays, CuPy arrays (CUDA graphs) or jax.Arrays; pass one of those")
        return None

    def new_plane(self, aval, info=None, var=None) -> Plane:
        h = Plane(self.graph, aval, info=info, var=var)
        self.handles.add(h)
        return h

    def rebind_buffer(self, old: Plane, var: Var, info) -> Plane:
        """The handle of a buffer's name after device flow rebound it: the buffer's next version,
        and what the label means from now on (in gradients too)."""
        h = Plane(self.graph, var.aval, key=old.key, info=info, var=var)
        h.label, h.kept = old.label, True
        self.handles.add(h)
        self.scope.write(h.key, var)
        # the buffer's entry, even one a construct nested inside this one already moved on
        self.buffers[:] = [h if b.key is old.key and b.label == old.label else b for b in self.buffers]
        return h

    def buffer_value(self, h: Plane) -> Var:
        """The Var a buffer label means in gradients: the buffer's last version at the top level (after
        in-place updates that followed its kernel), or its own Var for one made inside device flow."""
        return self.root.current.get(h.key, h.var)

    # -- equations ---------------------------------------------------------------------------
    def info(self, name=None) -> EqnInfo:
        src = _current_source()
        where = None
        if src is not None:
            line = user_line(src.filename)
            where = src.where(line) if line else None
        return EqnInfo(name=name, where=where, branch=self.branch)

    def add_access(self, info, reads, writes, what=None):
        self.accesses.append(Access(self.seq, self.branch, info, reads, writes, what))
        self.seq += 1

    def stage_call(self, kernel, args, kwargs, buffer):
        try:
            return self._stage_call(kernel, args, kwargs, buffer)
        except (TypeError, ValueError) as e:     # a refused call: say which builder line made it
            where = self.info().where
            if where and e.args and isinstance(e.args[0], str) and f" {where}" not in e.args[0]:
                e.args = (f"{e.args[0]} [called at eagle.Graph.builder {where}]",) + e.args[1:]
            raise

    def _stage_call(self, kernel, args, kwargs, buffer):
        api = f"hawk.kernel {kernel.name}"
        scope = self.scope
        values = kernel.bind_arguments(args, kwargs)
        atoms, proxies, reads, keys = [], [], [], {}
        for k, (name, role, v) in enumerate(zip(kernel.param_names, kernel.roles, values)):
            key = self.key_of(v, api, f"argument '{name}'")
            if key is not None:
                var = scope.read(key)
                atoms.append(var)
                proxies.append((var.aval.shape, var.aval.dtype))
                reads.append((key, name))
                keys[k] = key
            elif isinstance(v, (bool, int, float, np.number)):
                atoms.append(Literal(v))
                proxies.append((type(v), v))
            else:
                raise TypeError(f"{api}: argument '{name}' ({role!r}) is {type(v).__name__} {v!r:.60}; in a graph, "
                                "pass arrays, staged planes or Python numbers")
        # the layout depends only on the planes' shapes and dtypes and the numbers: laid out once per
        # kernel and such arguments, on stand-in arrays (role checks included)
        layout_key = (kernel, tuple(proxies))
        hit = self.layouts.get(layout_key)
        if hit is None:
            hit = self.layouts[layout_key] = kernel.layout_of(
                [_proxy(a.aval) if isinstance(a, Var) else a.value for a in atoms])
        layout, n = hit
        if any(kind == "sample" for kind, *_ in layout):
            if self.n is None or (self.n == 1 and n != 1):     # one-cell planes broadcast, whichever call is first
                self.n = n
            elif n != self.n and n != 1 and n not in self.view_ns:
                raise ValueError(f"{api}: called on planes of {n} samples in a graph of {self.n}; "
                                 "every plane of one graph has the same sample count")
        spec = kernel.specialize(layout)
        spec.check_count(n)
        info = self.info()
        out_vars = [Var(ir.plane_aval(spec.result_shape(j, n), spec.result_dtype(j))) for j in range(spec.n_results)]
        handles = [self.new_plane(v.aval, info, v) for v in out_vars]
        inplace, commits = [], []
        for k in spec.commits:
            out_vars.append(Var(atoms[k].aval))
            inplace.append((len(out_vars) - 1, k))
            commits.append((keys[k], kernel.param_names[k], out_vars[-1]))
        if buffer is not None and buffer is not False:
            if spec.n_results != 1:
                raise TypeError(f"{api}: buffer= needs a kernel with one returned plane; it returns {spec.n_results}")
            self.buffers.append(handles[0])
            if buffer is True:
                handles[0].kept = True
            else:
                key = self.key_of(buffer, api, "buffer=")
                if key is None:
                    raise TypeError(f"{api}: buffer= takes True or an array, got {type(buffer).__name__}")
                want, have = out_vars[0].aval, scope.read(key)
                if have.aval.shape != want.shape or have.aval.dtype != want.dtype:
                    raise ValueError(f"{api}: buffer= has shape {have.aval.shape} and dtype {have.aval.dtype}; "
                                     f"the result is {want.shape} {want.dtype}")
                atoms.append(have)
                inplace.insert(0, (0, len(atoms) - 1))
                handles[0] = Plane(self.graph, want, key=key, info=info, var=out_vars[0])
                handles[0].kept = True
                self.handles.add(handles[0])
                self.buffers[-1] = handles[0]
        params = dict(kernel=kernel, spec=spec, n=n, inplace=tuple(inplace))
        scope.eqns.append(Eqn(ir.call_p, atoms, out_vars, params, info))
        writes = []          # after the call: a write through a view stages an update that reads its value
        for h, v in zip(handles, out_vars):
            if isinstance(h.key, PlaneKey):
                scope.define(h.key, v)
            else:
                scope.write(h.key, v)
            writes.append((h.key, "out"))
        for key, name, v in commits:
            self.check_inplace(key, f"hawk.kernel {kernel.name}: the Mutable write to '{name}'")
            scope.write(key, v)
            writes.append((key, name))
        self.add_access(info, reads, writes, kernel.name)
        result = tree_unflatten(spec.tree, handles)
        # tree_unflatten's closures form a cycle that holds `handles` until a garbage collection; a
        # plane alive at build keeps its buffer, so empty the list: the planes live as long as the user's names
        handles.clear()
        return result

    def stage_opaque(self, node, name):
        if getattr(node, "jvp", None) is not None or getattr(node, "vjp", None) is not None:
            from ..host_rules import stage_pure_host     # a host function with derivative rules
            return stage_pure_host(self, node, name)
        scope = self.scope
        atoms, reads, writes = self.node_access(node)
        outs, inplace = [], []
        for key, _ in writes:
            atoms.append(scope.read(key))
            outs.append(Var(atoms[-1].aval))
            inplace.append((len(outs) - 1, len(atoms) - 1))
        info = self.info(name)
        for (j, _), (key, _) in zip(inplace, writes):
            scope.write(key, outs[j])
        params = dict(fn=_in_host_node(self.graph, node.fn), reads=tuple(node.reads), writes=tuple(node.writes), inplace=tuple(inplace))
        scope.eqns.append(Eqn(ir.opaque_p, atoms, outs, params, info))
        self.add_access(info, reads, writes, getattr(node.fn, "__name__", "opaque"))

    def node_access(self, node):
        """A host node's reads and writes: the current values of its reads, then (key, name) of
        each read and of each write."""
        reads = [(self.key_of(arr, "eagle.graph.opaque", f"reads[{nm!r}]"), nm) for nm, arr in node.reads.items()]
        writes = [(self.key_of(arr, "eagle.graph.opaque", f"writes[{nm!r}]"), nm) for nm, arr in node.writes.items()]
        return [self.scope.read(key) for key, _ in reads], reads, writes

    def stage_copy(self, plane) -> Plane:
        """x.copy(): a new plane holding x's current value (a full slice into its own buffer)."""
        src = self.scope.read(plane.key)
        v = views.full_slice(src, self.scope.eqns, self.info())
        h = self.new_plane(v.aval, self.info(), v)
        self.scope.define(h.key, v)
        return h

    def stage_concat(self, operands, axis) -> Plane:
        """np.concatenate / np.stack of planes and arrays: one concat equation, a new plane."""
        ins = [self.scope.read(self.key_of(a, "np.concatenate", "an operand")) for a in operands]
        info = self.info()
        params = {"axis": axis}
        v = Var(abstract_eval[ir.concat_p](*[a.aval for a in ins], **params)[0])
        self.scope.eqns.append(Eqn(ir.concat_p, ins, [v], params, info))
        if v.aval.shape[-1] != ins[0].aval.shape[-1]:
            self.view_ns.update([v.aval.shape[-1]] + [a.aval.shape[-1] for a in ins])
        h = self.new_plane(v.aval, info, v)
        self.scope.define(h.key, v)
        return h

    def stage_assign(self, view, value, where) -> None:
        """`x[idx] = value` in a builder: an in-place update of x, at every replay. A Python number or
        an array the builder made is a constant (as a Param number or a constant array is)."""
        scope, info = self.scope, self.info()
        if isinstance(value, (bool, int, float, np.number)) or (is_array(value) and not isinstance(value, Plane)):
            value = np.array(np.broadcast_to(np.asarray(value, view.aval.dtype), view.aval.shape))
        if not isinstance(value, Plane) and not is_array(value):
            raise TypeError(f"eagle.Graph.builder {where}: x[...] = {type(value).__name__}; assign a plane, an array "
                            "or a number")
        if tuple(value.shape) != view.aval.shape or np.dtype(value.dtype) != view.aval.dtype:
            raise ValueError(f"eagle.Graph.builder {where}: x[...] = a plane of {np.dtype(value.dtype).name}"
                             f"{list(value.shape)} for a region of {view.aval.dtype.name}{list(view.aval.shape)}; "
                             "give it the region's shape and dtype (a view, .reshape, .astype)")
        key = self.key_of(value, "eagle.Graph.builder", "the assigned value")
        scope.write(view.key, scope.read(key))
        self.add_access(info, [(key, "value")], [(view.key, view.label or "x")], "assignment")

    def stage_cell_op(self, prim, *cells):
        ins = [self.scope.read(c.key) if isinstance(c, Plane) else self.scope.read(self.extern(c)) for c in cells]
        v = Var(ir.U32_CELL)
        self.scope.eqns.append(Eqn(prim, ins, [v], {}, self.info()))
        h = self.new_plane(ir.U32_CELL, var=v)
        self.scope.define(h.key, v)
        return h

    # -- forks -------------------------------------------------------------------------------
    def open_fork(self):
        self.fork_ids += 1
        return self.fork_ids

    def close_fork(self, fork_id, depth):
        check_fork_hazards(self, fork_id, depth)

    def add_wait(self, branch_path, value):
        key = views.root_key(self.key_of(value, "eagle.Graph.wait", "the plane"))
        for acc in reversed(self.accesses):
            if any(views.root_key(k) is key for k, _ in acc.writes):
                self.waits.append(Wait(branch_path, self.seq, acc))
                return

    # -- finishing ---------------------------------------------------------------------------
    def program(self, outputs) -> Program:
        inputs = set(self.inputs)
        written = [k for k in self.root.current if isinstance(k, Extern) and self.root.current[k] not in inputs]
        outs = list(outputs) + [self.root.current[k] for k in written]
        return Program(self.inputs, self.root.eqns, outs)


_SHARED = object()       # an origin seen by another name for sure (an argument, a view, an alias in the arm)


def _buffer_named(trace, value, name) -> bool:
    """Is `value` the buffer labelled `name` (`name = k(..., buffer=...)`) of this graph?"""
    return isinstance(value, Plane) and value.graph is trace.graph and value.kept and value.label == name


def _aliased(values, i, among) -> bool:
    """Is values[i] an array that another of the names `among` also holds (one array, two names)?"""
    return _is_device(values[i]) and any(j != i and values[j] is values[i] for j in among)


def _finished(graph) -> bool:
    return graph.is_built or graph.trace not in CONTEXT.graph_stagers


def _refuse_foreign(plane: Plane, use):
    """A plane of another graph: leaked from a builder that has finished, or an outer graph's."""
    g = plane.graph
    by = f"eagle.Graph.builder {g.made_by.__name__}" if getattr(g, "made_by", None) else "another graph"
    at = f" at {plane.info.where}" if plane.info is not None and plane.info.where else ""
    name = f" {plane.label!r}" if plane.label else ""
    if _finished(g):
        raise LeakedTracerError(
            f"{use} is the staged value{name} made by {by}{at}, which has finished: it stands for a buffer "
            "of that graph, not a value. Return it through that graph's g.result and pass the array (after a "
            "launch), or compute it in this builder")
    raise ValueError(f"{use} is the staged value{name} of {by}{at}, another graph being built, reached from "
                     "a graph of its own. To compose builders, pass the value to the inner builder as an argument "
                     "(a builder called on the staged values of the graph being built stages into that graph); "
                     "else pass arrays between graphs as NumPy arrays")


def _in_host_node(graph, fn):
    """fn, run so that the planes of `graph` it closes over (a builder's arguments, its buffers) read
    as the arrays they stand for at that moment, as a host node means."""
    def host():
        with CONTEXT.enter(host_nodes=graph):
            return fn()
    host.__name__ = getattr(fn, "__name__", "opaque")
    return host


_PAUSE_LOCK = threading.Lock()
_paused = [0, False]              # builds in progress (all threads), and whether the collector ran before


@contextlib.contextmanager
def collector_paused():
    """The cyclic garbage collector paused while a builder stages and lowers its graph. A build makes
    many objects that live as long as the graph, and little garbage; the collector's passes over
    the growing heap made a build's time per call grow with the program's size."""
    with _PAUSE_LOCK:
        if _paused[0] == 0:
            _paused[1] = gc.isenabled()
            gc.disable()
        _paused[0] += 1
    try:
        yield
    finally:
        with _PAUSE_LOCK:
            _paused[0] -= 1
            if _paused[0] == 0 and _paused[1]:
                gc.enable()


def _current_source():
    return CONTEXT.innermost("builder_sources")


def active_trace() -> GraphTrace | None:
    t = CONTEXT.innermost("graph_stagers")
    return t if isinstance(t, GraphTrace) else None


# ---------------------------------------------------------------------------------------------
# the runtime the rewritten builder calls

class DeviceRange:
    __slots__ = ("trip",)

    def __init__(self, trip):
        self.trip = trip


class _LoopLocal:
    """A name assigned only inside a device loop/if body: it has no value after the construct."""

    def __init__(self, name, where):
        self.name, self.where = name, where

    def _fail(self, *a, **k):
        raise NameError(f"eagle: {self.name!r} is assigned only inside a device if/loop at {self.where}; "
                        "assign it before the construct so it is carried out of it")

    __bool__ = __array__ = __iter__ = __getattr__ = _fail


def is_array(v) -> bool:
    """An array a graph stages as a plane: a NumPy array, or a GPU array (CuPy, or any object with
    __cuda_array_interface__, shape and dtype), which makes the graph a CUDA graph at build."""
    return isinstance(v, np.ndarray) or (hasattr(type(v), "__cuda_array_interface__") and hasattr(v, "shape")
                                         and hasattr(v, "dtype"))


def _numpy_base(arr):
    """The array that owns the memory of NumPy view `arr` (None for an array that owns its own)."""
    base = arr.base if isinstance(arr, np.ndarray) else None
    while isinstance(base, np.ndarray) and isinstance(base.base, np.ndarray):
        base = base.base
    return base if isinstance(base, np.ndarray) else None


def _is_device(v) -> bool:
    if isinstance(v, Plane):
        return True
    return is_array(v)


def _is_cell(v) -> bool:
    if isinstance(v, Plane):
        return ir.is_cond_cell(v.aval)
    return is_array(v) and tuple(v.shape) == (1,) and v.dtype == np.uint32


class RuntimeBase:
    """What the staged and the eager runtime share: the builder function they are bound to (for its
    name and lines in messages), the labelling of a tuple unpacked into names, and the refusal of an
    array deciding an `if` that returns (decided in Python)."""

    def __init__(self, info: SourceInfo):
        self.info = info

    def where(self, line):
        return self.info.where(line)

    def python_test(self, test, line):
        if _is_device(test):
            raise TypeError(f"eagle.Graph.builder {self.where(line)}: an `if` that contains `return` is decided in "
                            "Python, but its condition is an array; move the `return` after the if")
        return test

    def label_all(self, value, names):
        if isinstance(value, (tuple, list)) and len(value) == len(names):
            for v, n in zip(value, names):
                self.label(v, n)
        return value


class Runtime(RuntimeBase):
    """Bound to one builder function (for its name and lines in messages)."""

    def here(self) -> str:
        """`name:line` of the builder line being staged now (found on the stack)."""
        line = user_line(self.info.filename)
        return self.where(line) if line else self.info.name

    @staticmethod
    def load(scope, names):
        """The construct's state from the builder's `locals()`. That dict is the frame's snapshot, which
        would keep the names' old values alive after they are rebound (so an in-place check would see
        them as still named): emptied once read; the next locals() fills it again."""
        state = tuple(scope.get(n, UNDEF) for n in names)
        scope.clear()
        return state

    @staticmethod
    def label(value, name):
        if isinstance(value, Plane) and value.label is None:
            value.label = name
            if value.info is not None and value.info.name is None:
                value.info.name = name
        return value

    # -- conditions --------------------------------------------------------------------------
    def device_condition(self, test, line):
        """The cell's current Var when `test` is device control flow, else None (Python)."""
        if _is_cell(test):
            trace = active_trace()
            if trace is None:
                raise RuntimeError(f"eagle.Graph.builder {self.where(line)}: a device condition outside a graph; "
                                   "create the graph first: g = eagle.Graph()")
            return trace.scope.read(trace.key_of(test, "eagle", "the condition"))
        if _is_device(test):
            shape = test.shape
            dt = test.dtype
            raise TypeError(f"eagle.Graph.builder {self.where(line)}: an array of shape {tuple(shape)} and dtype {dt} "
                            "is used as a condition; device conditions are one-cell uint32 arrays, "
                            "e.g. np.array([1], dtype=np.uint32) written by a kernel's Mutable[UInt32]")
        return None

    def not_(self, x):
        if _is_cell(x):
            return active_trace().stage_cell_op(ir.cell_not_p, x)
        if _is_device(x):
            raise TypeError(f"eagle.Graph.builder {self.here()}: `not` of an array of shape {tuple(x.shape)} and "
                            f"dtype {x.dtype}; device conditions are one-cell uint32 arrays")
        return not x

    def _logic(self, thunks, prim, is_and):
        device = []
        for t in thunks:
            v = t()
            if _is_cell(v):
                device.append(v)
            elif _is_device(v):
                raise TypeError(f"eagle.Graph.builder {self.here()}: an array of shape {tuple(v.shape)} and dtype "
                                f"{v.dtype} in `and`/`or`; device conditions are one-cell uint32 arrays")
            elif bool(v) != is_and:          # a Python value that decides the whole expression
                return v
        if not device:
            return v
        out = device[0]
        for d in device[1:]:
            out = active_trace().stage_cell_op(prim, out, d)
        return out

    def and_(self, *thunks):
        return self._logic(thunks, ir.cell_and_p, True)

    def or_(self, *thunks):
        return self._logic(thunks, ir.cell_or_p, False)

    # -- if / match --------------------------------------------------------------------------
    def if_stmt(self, test, true_fn, false_fn, state, names, line):
        c = self.device_condition(test, line)
        if c is None:
            return true_fn(*state) if test else false_fn(*state)
        return self._stage_branches(ir.cond_p, c, (false_fn, true_fn), state, names, line, {})

    def match_stmt(self, subject, values, fns, default, state, names, line):
        c = self.device_condition(subject, line)
        if c is None:
            for v, fn in zip(values, fns):
                if subject == v:
                    return fn(*state)
            return default(*state) if default is not None else state
        arms = tuple(fns) + ((default,) if default is not None else ((lambda *s: s),))
        return self._stage_branches(ir.switch_p, c, arms, state, names, line, {"cases": tuple(values)})

    def _stage_branches(self, prim, pred, fns, state, names, line, params):
        trace = active_trace()
        parent = trace.scope
        scopes, outs = [], []
        for fn in fns:
            s = Scope(trace, parent)
            trace.scope = s
            try:
                outs.append(tuple(fn(*state)))
            finally:
                trace.scope = parent
            scopes.append(s)
        new_state = list(state)
        name_outs = []      # (state index, per-arm atoms, aval)
        for i, name in enumerate(names):
            vals = [o[i] for o in outs]
            if all(v is vals[0] for v in vals):
                new_state[i] = vals[0]
                continue
            if any(v is UNDEF or isinstance(v, _LoopLocal) for v in vals) or any(callable(v) and not _is_device(v) for v in vals):
                new_state[i] = _LoopLocal(name, self.where(line))
                continue
            if all(_is_device(v) or isinstance(v, (bool, int, np.bool_)) for v in vals):
                # arrays, or flags: a Python bool/int that differs by arm becomes a literal cell
                atoms = [s.read(trace.key_of(v, "eagle", name)) if _is_device(v)
                         else Literal(np.array([int(v)], np.uint32), ir.U32_CELL) for s, v in zip(scopes, vals)]
                avals = {(a.aval.shape, a.aval.dtype) for a in atoms}
                if len(avals) > 1:
                    raise TypeError(f"eagle.Graph.builder {self.where(line)}: {name!r} has different shapes/dtypes "
                                    f"in the arms of a device conditional: {[str(a.aval) for a in atoms]}; "
                                    "give it one shape and dtype in every arm")
                name_outs.append((i, atoms, atoms[0].aval))
                continue
            raise TypeError(f"eagle.Graph.builder {self.where(line)}: {name!r} is set to different Python values in "
                            f"the arms of a device conditional ({', '.join(repr(v)[:30] for v in vals)}); only "
                            "arrays and bools/ints can differ by arm; decide Python values outside the if")
        written = list(dict.fromkeys(k for s in scopes for k in s.written))
        arm_outs = [[a[j] for _, a, _ in name_outs] + [s.read(k) for k in written] for j, s in enumerate(scopes)]
        operands = list(dict.fromkeys(k for s in scopes for k in s.captures))
        labelled = {j: state[i] for j, (i, _, _) in enumerate(name_outs) if _buffer_named(trace, state[i], names[i])}
        via_key = {}        # buffers an arm also writes (a construct nested in it moved the name's buffer)
        for j, h0 in list(labelled.items()):
            if h0.key in written:
                w = len(name_outs) + written.index(h0.key)
                for a in arm_outs:          # the buffer leaves each arm holding the name's value there
                    a[w] = a[j]
                via_key[name_outs[j][0]] = labelled.pop(j)
            elif h0.key not in operands:
                operands.append(h0.key)
        if via_key:
            keep = [j for j, (i, _, _) in enumerate(name_outs) if i not in via_key]
            name_outs = [name_outs[j] for j in keep]
            arm_outs = [[o[j] for j in keep] + o[len(keep) + len(via_key):] for o in arm_outs]
            labelled = {keep.index(j): h0 for j, h0 in labelled.items()}
        progs = []
        for s, o in zip(scopes, arm_outs):
            ins = [s.captures[k][0] if k in s.captures else Var(parent.read(k).aval) for k in operands]
            progs.append(Program(ins, s.eqns, o))
        in_atoms = [pred] + [parent.read(k) for k in operands]
        out_vars = [Var(av) for _, _, av in name_outs] + [Var(parent.read(k).aval) for k in written]
        at = {k: i for i, k in enumerate(operands)}
        inplace = tuple((j, 1 + at[h0.key]) for j, h0 in labelled.items()) \
            + tuple((len(name_outs) + j, 1 + at[k]) for j, k in enumerate(written))
        info = trace.info()
        parent.eqns.append(Eqn(prim, in_atoms, out_vars, dict(params, branches=tuple(progs), inplace=inplace), info))
        for j, ((i, _, av), v) in enumerate(zip(name_outs, out_vars)):
            if j in labelled:       # a buffer's name rebound in an arm: its value after the if lands in the buffer
                new_state[i] = trace.rebind_buffer(labelled[j], v, info)
                continue
            h = trace.new_plane(av, info, v)
            h.label = names[i]
            parent.define(h.key, v)
            new_state[i] = h
            shared = any(_aliased(o, i, range(len(names))) for o in outs)     # two names, one array, in an arm
            trace.note_phi(h, [(o[i], s.local) for o, s in zip(outs, scopes)], self.where(line), shared)
        for k, v in zip(written, out_vars[len(name_outs):]):
            parent.write(k, v)
        for i, h0 in via_key.items():
            new_state[i] = trace.rebind_buffer(h0, parent.read(h0.key), info)
        return tuple(new_state)

    # -- loops -------------------------------------------------------------------------------
    def range_(self, *args):
        if any(_is_device(a) for a in args):
            if len(args) != 1 or not _is_cell(args[0]):
                raise TypeError(f"eagle.Graph.builder {self.here()}: a device trip count is `range(cell)` with one "
                                "one-cell uint32 array; start and step are not supported on the device")
            return DeviceRange(args[0])
        return range(*args)

    def _decide_device(self, cond_fn, body_fn, state, target, line):
        """Is this loop device control flow? Its guard is a cell, or becomes one after a turn.
        Returns (device, state, turns): the first turn is tried in a throwaway scope; when the loop
        stays Python, that turn is kept (its nodes move to the open scope) rather than run again,
        so a Python loop's body runs once per turn at build (a list it appends to stays right)."""
        trace = active_trace()
        if trace is None:
            return _is_device(cond_fn(*state)), state, 0
        saved = trace.scope
        trial = trace.scope = Scope(trace, saved)
        trial.trial_loop = line          # eagle_fx.collect in it: refused below if the loop stays Python
        try:
            c = cond_fn(*state)
            if _is_device(c) or not c:
                return _is_device(c), state, 0
            out = tuple(body_fn(target, *state) if target is not None else body_fn(*state))
            if _is_device(cond_fn(*out)):
                return True, state, 0
        finally:
            trace.scope = saved
        if getattr(trial, "collected", False):
            raise TypeError(f"eagle_fx.collect at {self.where(line)}: in a Python loop (its guard is no cell: it is "
                            "unrolled at build); collect the values in a list and np.stack it, or make it a device "
                            "loop: for _ in range(N): if not cell: break")
        self._adopt(trial, saved)
        return False, out, 1

    @staticmethod
    def _adopt(trial: Scope, parent: Scope):
        """Keep what a trial scope staged: its equations, reading the parent's versions, join the parent."""
        outer = {inner: v for inner, v in trial.captures.values()}
        for e in trial.eqns:
            parent.eqns.append(e.replace(inputs=[outer.get(a, a) if isinstance(a, Var) else a for a in e.inputs]))
        for k, v in trial.current.items():
            if k in trial.local:
                parent.define(k, v)
            elif k in trial.written:
                parent.write(k, v)

    def for_stmt(self, iterable, cond_fn, body_fn, state, names, line):
        if isinstance(iterable, Plane) and len(iterable.shape) < 2 and iterable._staging("iteration") is not None:
            raise TypeError(f"eagle.Graph.builder {self.where(line)}: iterating over a 1-d plane walks its samples "
                            "(the last axis); write the per-sample work as a kernel, or slice: x[k:k+1]")
        if isinstance(iterable, DeviceRange):
            return self._stage_loop(cond_fn, body_fn, state, names, line, cap=None, trip=iterable.trip, target=True)
        if isinstance(iterable, range) and len(iterable) and active_trace() is not None:
            device, state, done = self._decide_device(cond_fn, body_fn, state, iterable[0], line)
            if device:
                if (iterable.start, iterable.step) != (0, 1):
                    raise TypeError(f"eagle.Graph.builder {self.where(line)}: a device loop over {iterable!r}; "
                                    "device loops count from 0 by 1: use range(N)")
                return self._stage_loop(cond_fn, body_fn, state, names, line, cap=len(iterable), trip=None, target=True)
            iterable = iterable[done:]
        for v in iterable:
            c = cond_fn(*state)
            if _is_device(c):
                raise TypeError(f"eagle.Graph.builder {self.where(line)}: a device break in a Python loop over "
                                f"{type(iterable).__name__}; device loops run over range(N) or range(cell)")
            if not c:
                break
            state = body_fn(v, *state)
        return state

    def while_stmt(self, cond_fn, body_fn, state, names, line):
        device, state, _ = self._decide_device(cond_fn, body_fn, state, None, line)
        if device:
            trace = active_trace()
            if trace.graph.recorded:
                raise ValueError(f"{self.where(line)}: an uncapped device loop cannot be recorded (record=True): "
                                 "cap it: for _ in range(N): if not cell: break")
            warnings.warn_explicit(UncappedLoopWarning(
                f"uncapped device loop at {self.where(line)}: a body that never clears its guard never returns; "
                "cap it with for _ in range(N): if not cell: break"), UncappedLoopWarning, self.info.filename, line)
            return self._stage_loop(cond_fn, body_fn, state, names, line, cap=None, trip=None, target=False)
        while True:
            c = cond_fn(*state)
            if _is_device(c):
                raise TypeError(f"eagle.Graph.builder {self.where(line)}: the loop condition became a device value "
                                "after the first turn; make it a cell from the start")
            if not c:
                return state
            state = body_fn(*state)

    def _stage_loop(self, cond_fn, body_fn, state, names, line, cap, trip, target):
        trace = active_trace()
        parent = trace.scope
        carried: list[int] = []     # names the body rebinds; a name only updated in place is not a carry:
        #                            its writes land in the array it names (in place), seen through every alias
        inplace: list = []
        mark = LoopMark(cap, trip is not None)
        while True:     # the carries and in-place planes only grow, so this reaches a fixpoint
            body = Scope(trace, parent)
            counter = Var(ir.U32_CELL, "turn")
            counter_h = trace.new_plane(ir.U32_CELL, var=counter)
            body.define(counter_h.key, counter)
            body.loop_mark, mark.turn, mark.n_used = mark, counter_h.key, 0
            carry_in, body_state = self._seed(trace, body, state, carried, inplace, self.where(line))
            trace.scope = body
            try:
                out = tuple(body_fn(counter_h, *body_state) if target else body_fn(*body_state))
            finally:
                trace.scope = parent
            new_carried = list(carried)
            for i, (v0, v1) in enumerate(zip(state, out)):
                if i in carried or v1 is v0 or v0 is UNDEF or isinstance(v0, _LoopLocal):
                    continue
                if _is_device(v1) or isinstance(v1, (bool, int, np.bool_)):
                    new_carried.append(i)
                elif not callable(v1):
                    raise TypeError(f"eagle.Graph.builder {self.where(line)}: {names[i]!r} is a Python value that "
                                    "changes in a device loop; a device loop carries arrays and cells only")
            seen = set(inplace)
            new_inplace = inplace + [k for k in body.written if k not in seen]
            if sorted(new_carried) == sorted(carried) and new_inplace == inplace:
                break
            # the carries only grow, and for fixed carries so do the in-place planes: a fixpoint. New carries
            # start the in-place planes afresh (what a name wrote before it was a carry, its carry takes now)
            inplace = new_inplace if sorted(new_carried) == sorted(carried) else []
            carried = sorted(new_carried)
        # the guard, in its own scope over the same carries
        cscope = Scope(trace, parent)
        c_in, c_state = self._seed(trace, cscope, state, carried, inplace)
        trace.scope = cscope
        try:
            c = cond_fn(*c_state)
            cond_var = self.device_condition(c, line)       # a cell's Var, or None for a Python value
        finally:
            trace.scope = parent
        if cond_var is None and not c:
            return state
        body_out = []
        for i in carried:
            v = out[i]
            if _is_device(v):
                body_out.append(body.read(trace.key_of(v, "eagle", names[i])))
            else:
                body_out.append(Literal(np.array([int(v)], np.uint32), ir.U32_CELL))
        body_out += [body.read(k) for k in inplace]
        consts = list(dict.fromkeys(k for s in (body, cscope) for k in s.captures))

        def ins(s, seeded):
            return [s.captures[k][0] if k in s.captures else Var(parent.read(k).aval) for k in consts] + seeded

        body_prog = Program([counter] + ins(body, carry_in), body.eqns, body_out)
        cond_prog = Program(ins(cscope, c_in), cscope.eqns, [cond_var]) if cond_var is not None else None
        init = []
        for i in carried:
            v = state[i]
            init.append(parent.read(trace.key_of(v, "eagle", names[i])) if _is_device(v)
                        else Literal(np.array([int(v)], np.uint32), ir.U32_CELL))
        init += [parent.read(k) for k in inplace]
        for a, b in zip(init, body_out):
            if (a.aval.shape, a.aval.dtype) != (b.aval.shape, b.aval.dtype):
                raise TypeError(f"eagle.Graph.builder {self.where(line)}: a loop-carried value changes type in the "
                                f"body: {a.aval} on entry, {b.aval} after a turn; keep its shape and dtype")
        head = [parent.read(trace.key_of(trip, "eagle", "the trip count"))] if trip is not None else []
        operands = head + [parent.read(k) for k in consts] + init
        base = len(head) + len(consts)
        out_vars = [Var(a.aval) for a in init]
        n_names = len(carried)
        labelled = {j: state[i] for j, i in enumerate(carried) if _buffer_named(trace, state[i], names[i])}
        for j, h0 in labelled.items():
            if h0.key in inplace or h0.key in consts:
                raise TypeError(f"eagle.Graph.builder {self.where(line)}: the buffer {h0.label!r} is rebound in this "
                                "device loop and also read or written through another name inside it (the buffer "
                                f"holds each turn's value); use {h0.label!r} itself in the loop")
        inplace_pairs = tuple((j, base + j) for j in labelled) \
            + tuple((n_names + j, base + n_names + j) for j, k in enumerate(inplace)
                    if not any(k == b.key for b in mark.buffers))   # a collect's zeros: a carry like any
        info = trace.info()
        params = dict(body=body_prog, cond=cond_prog, cap=cap, counted=trip is not None, n_consts=len(consts),
                      inplace=inplace_pairs)
        parent.eqns.append(Eqn(ir.while_p, operands, out_vars, params, info))
        new_state = list(state)
        for i, name in enumerate(names):
            if state[i] is UNDEF and out[i] is not UNDEF:      # a collect's rows are read after the loop
                new_state[i] = out[i] if mark.holds(out[i]) else _LoopLocal(name, self.where(line))
        for j, i in enumerate(carried):
            if j in labelled:       # a buffer's name rebound in the loop: its final value lands in the buffer
                new_state[i] = trace.rebind_buffer(labelled[j], out_vars[j], info)
                continue
            h = trace.new_plane(out_vars[j].aval, info, out_vars[j])
            h.label = names[i]
            parent.define(h.key, out_vars[j])
            new_state[i] = h
            trace.note_phi(h, [(state[i], None), (out[i], body.local)], self.where(line),
                           _aliased(state, i, carried) or _aliased(out, i, carried))
        for k, v in zip(inplace, out_vars[n_names:]):
            parent.write(k, v)
        return tuple(new_state)

    @staticmethod
    def _seed(trace, scope, state, carried, inplace, where=None):
        """Fresh carry inputs: carried names become new planes, in-place planes are pre-seeded."""
        seeded, st = [], list(state)
        for i in carried:
            v = state[i]
            aval = (scope.parent.read(trace.key_of(v, "eagle", "a carry")).aval if _is_device(v) else ir.U32_CELL)
            var = Var(aval)
            h = trace.new_plane(aval, var=var)
            scope.define(h.key, var)
            if where is not None:       # on the first turn, the carry is the array the name held on entry,
                trace.note_phi(h, [(v, None)], where, True)     # which the builder's frame still holds
            st[i] = h
            seeded.append(var)
        for k in inplace:
            var = Var(scope.parent.read(k).aval)
            scope.current[k] = var
            scope.local.add(k)
            seeded.append(var)
        return seeded, st
