"""@hawk.kernel: a one-sample function, traced per dtype signature, run over whole arrays.

A call binds arguments to roles (validating everything before anything runs), picks the
specialisation for the arguments' dtypes and layouts (tracing it the first time), and runs the
compiled body. A positional call whose arguments match the last layout exactly takes a generated
fast entry instead, which tests only types, dtypes and shapes (what matters at small n).
Inside a graph builder the same call stages a node instead (eagle_fx pushes its stager on
the context's `graph_stagers`).
"""
from __future__ import annotations

import inspect
import typing

import numpy as np

from . import prims
from .core import SAMPLE, UNIFORM, AVal, Program, Tracer, literal_aval
from .emit.jax import eager_call, is_jax_array
from .emit.numpy import NumpyKernel, overlapping_inputs
from .context import CONTEXT
from .cuda_runtime import call_kernel
from .roles import Role
from .source import parse_function
from .tables import scatter_add_p, table_layout
from .terminated import gate_commit, gate_results, refuse_reductions, terminated_index
from .trace import UNDEF, TraceError, convert_kernel, trace_body
from .tree import tree_flatten, tree_unflatten

class Layout(tuple):
    """Per parameter: (kind, dtype, per-sample shape, weak). The key of a specialisation."""


class Specialization:
    """A kernel body traced for one Layout: its Program, result tree, commits and NumPy code."""

    def __init__(self, kernel: "Kernel", layout: Layout):
        self.kernel, self.layout = kernel, layout
        avals = [AVal(shape, dt, kind, weak) for kind, dt, shape, weak in layout]
        trace, args, result, muts = trace_body(kernel.converted, kernel.name, kernel.source, avals, kernel.param_names)
        leaves, self.tree = tree_flatten(result, where=f"hawk.kernel {kernel.name}: the returned tree")
        for leaf in leaves:
            if leaf is UNDEF or not (isinstance(leaf, Tracer) or isinstance(leaf, (int, float, bool, np.number))):
                raise TraceError(f"hawk.kernel {kernel.name}: returns {type(leaf).__name__} {leaf!r}; return traced "
                                 "values or numbers, in a tuple/list/dict tree")
        cells = {a.var for a, role in zip(args, kernel.roles) if isinstance(a, Tracer) and not role.uniform}
        one_cell = _one_cell(trace.eqns, cells)
        leaves = [_per_sample(trace, leaf, one_cell) for leaf in leaves]
        leaves = gate_results(kernel, trace, args, leaves)
        self.commits: list[int] = []     # parameter indices written by the body
        commit_values = []
        for name, value in zip(kernel.mutable_names, muts):
            k = kernel.param_names.index(name)
            if value is args[k]:
                continue
            kind, dt, shape, _ = layout[k]
            v_aval = value.aval if isinstance(value, Tracer) else None
            where = f"hawk.kernel {trace.where_made(value)}"
            if v_aval is not None and v_aval.kind == SAMPLE and kind == UNIFORM:
                fix = ("add it into rows with hm.scatter_add(table, i, value), or reduce it first (hawk.sum/max/"
                       "min/mean)" if kernel.roles[k].table else "reduce it first (hawk.sum/max/min/mean) or pass a "
                       f"per-sample plane of shape {kernel.roles[k].plane_shape()}")
                raise TraceError(f"{where}: a per-sample value is written to the one-cell Mutable '{name}'; {fix}")
            v_shape = v_aval.shape if v_aval is not None else np.shape(value)
            if not _broadcasts_to(v_shape, shape):
                raise TraceError(f"{where}: the value written to '{name}' has per-sample shape {v_shape}, "
                                 f"its plane {shape}")
            src_dt = v_aval.dtype if v_aval is not None else literal_aval(value).dtype
            if v_aval is None or src_dt != dt or v_aval.weak:
                value = trace.process(prims.convert_p, [value], {"dtype": dt})[0]
            self.commits.append(k)
            commit_values.append(gate_commit(kernel, trace, args, k, value))
        self.n_results = len(leaves)
        refuse_reductions(kernel, trace)
        self.prog: Program = trace.finish(list(leaves) + commit_values)
        self.result_kinds = [a.aval.kind for a in self.prog.outputs[:self.n_results]]
        out_sample = self.result_kinds + [layout[k][0] for k in self.commits]
        self.compiled = NumpyKernel(self.prog, [k == SAMPLE for k in out_sample])
        # hawk.max/min of no samples has no value (NumPy's empty maximum has no identity)
        self.extremum = next((e for e in self.prog.eqns if e.prim in (prims.P["sample_max"], prims.P["sample_min"])),
                             None)
        self.fast = _fast_entry(self)

    def check_count(self, n: int) -> None:
        """Refuse a call over 0 samples when the body takes hawk.max or hawk.min of them."""
        if n == 0 and self.extremum is not None:
            e = self.extremum
            what = "hawk.max" if e.prim is prims.P["sample_max"] else "hawk.min"
            at = f" at {e.info.where}" if e.info.where else ""
            raise ValueError(f"hawk.kernel {self.kernel.name}: {what}{at} over 0 samples has no value (the planes of "
                             "this call have no samples); call it on at least one sample")

    def result_shape(self, j, n):
        aval = self.prog.outputs[j].aval
        return aval.shape + ((n,) if aval.kind == SAMPLE else (1,))

    def result_dtype(self, j):
        return self.prog.outputs[j].aval.dtype


_SAMPLE_AXIS = {prims.P[name] for name in (*prims.REDUCTIONS, "sample_count")} | {scatter_add_p}


def _one_cell(eqns, cells) -> set:
    """The values a body computed from a reduction over the samples (or from their count), or from
    `cells`, the per-sample parameters given one-cell arrays (kept one cell, as NumPy broadcasts)."""
    out = set(cells)
    for e in eqns:
        if e.prim in _SAMPLE_AXIS or any(v in out for v in e.inputs):
            out.update(e.outputs)
    return out


def _per_sample(trace, leaf, one_cell):
    """A result the same in every sample computed only from numbers and Params is one value per
    sample, as jax.vmap broadcasts an unbatched output; one computed from a reduction
    (hawk.sum(x * x)) or a one-cell plane stays one value for all samples, a one-cell array."""
    if isinstance(leaf, Tracer) and (leaf.aval.kind == SAMPLE or leaf.var in one_cell):
        return leaf
    shape = leaf.aval.shape if isinstance(leaf, Tracer) else literal_aval(leaf).shape
    return trace.process(prims.broadcast_p, [leaf], {"shape": shape, "kind": SAMPLE})[0]


class _BodyKernel:
    """Stands in for a Kernel in a call of a BodySpec: a name and one parameter name per input."""

    def __init__(self, name, n_inputs):
        self.name = name
        self.param_names = [f"in{k}" for k in range(n_inputs)]


class BodySpec:
    """A kernel body given as a Program (a fused chain of calls, a kernel's derivative): what a call
    equation's `spec` needs, as a Specialization gives it. Outputs are results, then the new values
    of the `commits` inputs."""

    def __init__(self, prog: Program, name: str, commits=()):
        self.prog = prog
        self.kernel = _BodyKernel(name, len(prog.inputs))
        self.commits = list(commits)
        self.n_results = len(prog.outputs) - len(self.commits)
        self.result_kinds = [a.aval.kind for a in prog.outputs[:self.n_results]]
        self.layout = tuple((v.aval.kind, v.aval.dtype, v.aval.shape, v.aval.weak) for v in prog.inputs)
        self._compiled = None

    @property
    def compiled(self):
        """The NumPy code of the body, generated when first needed (a body the CUDA backend runs
        never needs it)."""
        if self._compiled is None:
            self._compiled = NumpyKernel(self.prog, [a.aval.kind == SAMPLE for a in self.prog.outputs])
        return self._compiled

    result_shape = Specialization.result_shape
    result_dtype = Specialization.result_dtype


def _broadcasts_to(src, dst) -> bool:
    try:
        return np.broadcast_shapes(src, dst) == dst
    except ValueError:
        return False


MISS = object()     # a fast entry's answer for arguments that do not match its layout exactly
_PY_TYPE = {"b": bool, "i": int, "f": float}


def _fast_entry(spec: Specialization):
    """A generated function for positional calls that match spec.layout exactly: a few type, dtype
    and shape tests, the result arrays, the compiled run and the result tree, nothing generic.
    Anything it does not recognise returns MISS, and the full binding path decides."""
    kernel, layout, nk = spec.kernel, spec.layout, spec.compiled
    g = {"nd": np.ndarray, "MISS": MISS, "empty": np.empty, "may_share": np.may_share_memory,
         "run": nk.run_flat}
    args = [f"a{k}" for k in range(len(layout))]
    types, dtypes, shapes = [], [], []
    first = next((k for k, entry in enumerate(layout) if entry[0] == SAMPLE), None)
    for k, (kind, dt, shape, weak) in enumerate(layout):
        if weak:
            if dt.kind not in _PY_TYPE:
                return _no_fast          # a Python int beyond int64: rare enough to bind in full
            types.append(f"type(a{k}) is {_PY_TYPE[dt.kind].__name__}")
            if dt.kind == "i":           # a bigger int would be uint64, another layout
                types.append(f"{-2 ** 63} <= a{k} < {2 ** 63}")
            continue
        g[f"d{k}"] = dt
        types.append(f"type(a{k}) is nd")
        dtypes.append(f"a{k}.dtype is d{k}")
        if kernel.roles[k].mutable:
            dtypes.append(f"a{k}.flags.writeable")
        if k == first and not shape:
            continue                   # its rank is tested where n is read
        last = "n" if kind == SAMPLE else "1"
        shapes.append(f"a{k}.shape == ({', '.join([str(d) for d in shape] + [last])},)")
    for a in range(len(spec.commits)):
        for b in range(a):
            shapes.append(f"not may_share(a{spec.commits[a]}, a{spec.commits[b]})")
    for c in spec.commits:            # an input overlapping a Mutable: the full path copies it first
        for k, entry in enumerate(layout):   # (two arrays that own their memory cannot overlap: cheap)
            if k != c and not entry[3]:
                shapes.append(f"(a{k} is a{c} or (a{k}.base is None and a{c}.base is None) or not may_share(a{k}, a{c}))")
    lines = [f"def fast({', '.join(args)}):",
             f"    if not ({' and '.join(types + dtypes) or 'True'}):",
             "        return MISS"]
    if first is None:
        lines.append("    n = 1")
    else:
        lines += [f"    s = a{first}.shape",
                  f"    if len(s) != {len(layout[first][2]) + 1}:",
                  "        return MISS",
                  "    n = s[-1]",
                  f"    if n {'<=' if spec.extremum is not None else '=='} 1:",
                  "        return MISS"]
    if shapes:
        lines += [f"    if not ({' and '.join(shapes)}):", "        return MISS"]
    outs = []
    for j in range(spec.n_results):
        aval = spec.prog.outputs[j].aval
        g[f"r{j}"] = aval.dtype
        last = "n" if aval.kind == SAMPLE else "1"
        lines.append(f"    o{j} = empty(({', '.join([str(d) for d in aval.shape] + [last])},), r{j})")
        outs.append(f"o{j}")
    outs += [f"a{k}" for k in spec.commits]
    lines.append(f"    run({', '.join(args + outs + ['n'])})")
    lines.append(f"    return {_tree_src(spec.tree, iter(range(spec.n_results)))}")
    ns: dict = {}
    exec(compile("\n".join(lines) + "\n", f"<hawk fast entry {kernel.name}>", "exec"), g, ns)
    fast = ns["fast"]
    fast.source = "\n".join(lines)
    return fast


def _tree_src(tree, counter) -> str:
    """Source that rebuilds a result tree from the names o0, o1, ... in leaf order."""
    if tree.kind == "leaf":
        return f"o{next(counter)}"
    if tree.kind == "none":
        return "None"
    kids = [_tree_src(c, counter) for c in tree.children]
    if tree.kind == "dict":
        return "{" + ", ".join(f"{k!r}: {c}" for k, c in zip(tree.meta, kids)) + "}"
    if tree.kind == "list":
        return "[" + ", ".join(kids) + "]"
    return "(" + "".join(c + ", " for c in kids) + ")"


def _no_fast(*args):
    return MISS


def _resolve_roles(fn) -> list[tuple[str, Role]]:
    try:
        hints = typing.get_type_hints(fn)
    except Exception:
        hints = dict(getattr(fn, "__annotations__", {}))
    out = []
    for name, p in inspect.signature(fn).parameters.items():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise TypeError(f"hawk.kernel {fn.__name__}: *{name} is not a role; list each parameter with its role")
        role = hints.get(name)
        if not isinstance(role, Role):
            raise TypeError(f"hawk.kernel {fn.__name__}: parameter '{name}' has no role annotation (found "
                            f"{role!r}); annotate it, e.g. `{name}: Scalar`, `{name}: Param`, `{name}: Mutable[Scalar]`")
        if role.reserved:
            raise TypeError(f"hawk.kernel {_param_where(fn, name)}: parameter '{name}' is {role!r}, which is "
                            f"reserved for {role.reserved}")
        out.append((name, role))
    return out


def _param_where(fn, name) -> str:
    """`fn:line (file, line k)` of parameter `name`, or the function's name when its source is unreadable."""
    try:
        fdef, info = parse_function(fn, "hawk.kernel")
    except TypeError:
        return fn.__name__
    a = fdef.args
    line = next((p.lineno for p in a.posonlyargs + a.args + a.kwonlyargs if p.arg == name), fdef.lineno)
    return info.where_long(line)


def _is_gpu_array(a) -> bool:
    return type(a).__module__.split(".")[0] == "cupy"


def _is_cuda_array(a) -> bool:
    """A CuPy array (or any __cuda_array_interface__ array): the call runs the emitted CUDA kernel."""
    return ((type(a).__module__.split(".")[0] == "cupy" or hasattr(type(a), "__cuda_array_interface__"))
            and hasattr(a, "shape") and hasattr(a, "dtype") and not is_jax_array(a))


def _shape_proxy(a) -> np.ndarray:
    """A zero-memory NumPy stand-in with a device array's shape and dtype, to lay the call out."""
    shape = tuple(int(d) for d in a.shape)
    return np.lib.stride_tricks.as_strided(np.zeros(1, np.dtype(a.dtype)), shape, (0,) * len(shape))


class Kernel:
    """A traced per-sample function (made by `@hawk_fx.kernel`): call it on arrays to run it over
    every sample, or inside a builder to add it to a graph. `ir` is its traced body."""

    def __init__(self, fn):
        self.fn = fn
        self.name = fn.__name__
        self.__name__ = fn.__name__
        self.__qualname__ = fn.__qualname__
        self.__doc__ = fn.__doc__
        self.__wrapped__ = fn
        spec = _resolve_roles(fn)
        self.param_names = [n for n, _ in spec]
        self.roles = [r for _, r in spec]
        self.mutable_names = [n for n, r in spec if r.mutable]
        self.terminated = terminated_index(self)     # the done mark's parameter index, or None
        self.converted, self.source = convert_kernel(fn, self.mutable_names)
        self._specs: dict[Layout, Specialization] = {}
        self._nparams = len(spec)
        self._fast = _no_fast     # the fast entry of the last layout called

    def __repr__(self):
        params = ", ".join(f"{n}: {r!r}" for n, r in zip(self.param_names, self.roles))
        return f"<hawk.kernel {self.name}({params})>"

    # -- binding -------------------------------------------------------------------------------
    def bind_arguments(self, args, kwargs) -> list:
        """Arguments in parameter order; refuses missing, extra and unknown ones."""
        if len(args) > self._nparams:
            raise TypeError(f"hawk.kernel {self.name}: takes {self._nparams} argument(s) "
                            f"({', '.join(self.param_names)}), got {len(args)}")
        if not kwargs and len(args) == self._nparams:
            return list(args)
        bound = list(args) + [UNDEF] * (self._nparams - len(args))
        for k, v in kwargs.items():
            if k not in self.param_names:
                raise TypeError(f"hawk.kernel {self.name}: unknown argument {k!r}; its parameters are "
                                f"{', '.join(self.param_names)}")
            i = self.param_names.index(k)
            if bound[i] is not UNDEF:
                raise TypeError(f"hawk.kernel {self.name}: argument '{k}' given twice (by position and by name)")
            bound[i] = v
        missing = [f"'{n}' ({r!r})" for n, r, v in zip(self.param_names, self.roles, bound) if v is UNDEF]
        if missing:
            raise TypeError(f"hawk.kernel {self.name}: missing argument(s) {', '.join(missing)}")
        return bound

    def layout_of(self, values, shapes=None):
        """The Layout and sample count n of concrete arguments (arrays and Python numbers)."""
        n = first = None
        for name, role, v in zip(self.param_names, self.roles, values):
            if role.uniform or role.table:
                continue
            shape = getattr(v, "shape", None)
            if shape is not None and len(shape) == len(role.shape) + 1 and shape[-1] != 1:
                if n is None:
                    n, first = shape[-1], name
                elif shape[-1] != n:
                    raise ValueError(f"hawk.kernel {self.name}: argument '{name}' has {shape[-1]} samples, "
                                     f"'{first}' has {n}; every plane of one call has the same sample count "
                                     "(the last axis)")
        n = 1 if n is None else n
        layout = []
        for name, role, v in zip(self.param_names, self.roles, values):
            layout.append(self._layout_one(name, role, v, n))
        return Layout(layout), n

    def _layout_one(self, name, role: Role, v, n):
        where = f"hawk.kernel {self.name}: argument '{name}' ({role!r})"
        if role.table:
            return table_layout(where, role, _shape_proxy(v) if _is_cuda_array(v) or is_jax_array(v) else v, n)
        if isinstance(v, (bool, int, float)) and not isinstance(v, np.generic):   # np.float64 is a float
            if role.mutable:
                raise TypeError(f"{where} is a Python {type(v).__name__}; a Mutable is written in place, so it "
                                f"needs an array: pass np.array([{v!r}]) or a plane of shape {role.plane_shape()}")
            if role.shape:
                raise ValueError(f"{where} is a Python {type(v).__name__}; it needs a plane of shape "
                                 f"{role.plane_shape()} or a one-cell {role.shape + (1,)}")
            dt = np.asarray(v).dtype
            if not role.accepts_dtype(dt):
                raise TypeError(f"{where} is a Python {type(v).__name__} {v!r}; it needs {role.describe_dtype()}")
            return (UNIFORM, dt, (), True)
        if is_jax_array(v) and not v.shape and not role.mutable and not role.shape:
            dt = np.dtype(v.dtype)          # a 0-d jax.Array (a traced scalar): one value for all samples
            if dt.kind not in "biuf" or not role.accepts_dtype(dt):
                raise TypeError(f"{where} has dtype {dt}; it needs {role.describe_dtype()}")
            return (UNIFORM, dt, (), False)
        if _is_cuda_array(v) or is_jax_array(v):    # laid out by shape and dtype; __call__ runs it there
            v = _shape_proxy(v)
        if not isinstance(v, np.ndarray):
            if _is_gpu_array(v):
                raise NotImplementedError(
                    f"{where} is a {type(v).__module__}.{type(v).__name__}: kernels run on NumPy arrays, or on "
                    f"CuPy arrays on the GPU; pass a NumPy array, e.g. np.asarray({name})")
            if isinstance(v, np.generic) and not role.mutable and not role.shape:
                if v.dtype.kind not in "biuf" or not role.accepts_dtype(v.dtype):
                    raise TypeError(f"{where} has dtype {v.dtype}; it needs {role.describe_dtype()}")
                return (UNIFORM, v.dtype, (), False)
            if isinstance(v, Tracer) and not v.trace.active:
                v.trace.leaked(v, f"{where} is a traced value")
            check = getattr(v, "_check_use", None)          # a staged plane of a graph: refused when leaked
            if check is not None:
                check(where)
            raise TypeError(f"{where} is {type(v).__name__} {v!r:.60}; pass a NumPy array"
                            + ("" if role.mutable or role.shape else " or a Python number"))
        if v.dtype.kind not in "biuf" or not role.accepts_dtype(v.dtype):
            raise TypeError(f"{where} has dtype {v.dtype}; it needs {role.describe_dtype()}")
        if role.mutable and not v.flags.writeable:
            raise ValueError(f"{where} is a read-only array; a Mutable is written in place")
        if role.uniform:
            if v.shape != (1,):
                fix = (" (a 0-d array: pass a.reshape(1), a view read at every call, or float(a), fixed when "
                       "the graph is built)") if v.ndim == 0 else ""
                raise ValueError(f"{where} has shape {v.shape}; a Param is a Python number or a one-cell array "
                                 f"of shape (1,), read at every call{fix}")
            return (UNIFORM, v.dtype, (), False)
        want = role.shape
        if v.ndim != len(want) + 1 or v.shape[:-1] != want:
            raise ValueError(f"{where} has shape {v.shape}; it needs a plane of shape {role.plane_shape()} "
                             f"(the sample axis last) or a one-cell {tuple(want) + (1,)}")
        if v.shape[-1] == n:
            return (SAMPLE, v.dtype, want, False)
        return (UNIFORM, v.dtype, want, False)

    def specialize(self, layout: Layout) -> Specialization:
        spec = self._specs.get(layout)
        if spec is None:
            spec = self._specs[layout] = Specialization(self, layout)
        return spec

    # -- calling -------------------------------------------------------------------------------
    def __call__(self, *args, buffer=None, **kwargs):
        staging = CONTEXT.graph_stagers
        if not kwargs and buffer is None and len(args) == self._nparams and not staging:
            out = self._fast(*args)
            if out is not MISS:
                return out
        if staging:
            return staging[-1].stage_call(self, args, kwargs, buffer)
        if buffer is not None:
            raise TypeError(f"hawk.kernel {self.name}: buffer= is for kernel calls inside a graph builder; "
                            "outside one, a call returns new arrays")
        values = self.bind_arguments(args, kwargs)
        layout, n = self.layout_of(values)
        spec = self.specialize(layout)
        if any(is_jax_array(v) for v in values):     # jax.Arrays (or tracers): jax.numpy, jitted
            return tree_unflatten(spec.tree, eager_call(spec, values, n))
        if any(_is_cuda_array(v) for v in values):   # CuPy arrays: the emitted CUDA kernel, on the GPU
            return tree_unflatten(spec.tree, call_kernel(spec, values, n))
        self._fast = spec.fast
        spec.check_count(n)
        if len(spec.commits) > 1:
            targets = [values[k] for k in spec.commits]
            for a in range(len(targets)):
                for b in range(a):
                    if np.shares_memory(targets[a], targets[b]):
                        raise ValueError(f"hawk.kernel {self.name}: Mutable arguments "
                                         f"'{self.param_names[spec.commits[b]]}' and "
                                         f"'{self.param_names[spec.commits[a]]}' share memory; pass separate arrays")
        targets = [values[k] for k in spec.commits]
        for k in overlapping_inputs(values, targets):       # read before written, whatever the chunk order
            values[k] = values[k].copy()
        outs = [np.empty(spec.result_shape(j, n), spec.result_dtype(j)) for j in range(spec.n_results)]
        spec.compiled(values, outs + targets, n)
        return tree_unflatten(spec.tree, outs)

    # -- inspection ----------------------------------------------------------------------------
    def default_layout(self) -> Layout:
        out = []
        for role in self.roles:
            if role.table:
                out.append((UNIFORM, np.dtype(np.float64), (1,), False))
            elif role.uniform:
                out.append((UNIFORM, np.dtype(np.float64), (), True))
            else:
                out.append((SAMPLE, np.dtype(role.dtype or np.float64), role.shape, False))
        return Layout(out)

    @property
    def ir(self) -> Program:
        """The traced body for float64 planes and Python-number Params (print it)."""
        return self.specialize(self.default_layout()).prog

    def trace(self, *args, **kwargs) -> Program:
        """The traced body for these arguments' dtypes and layouts."""
        values = self.bind_arguments(args, kwargs)
        return self.specialize(self.layout_of(values)[0]).prog


def kernel(fn) -> Kernel:
    """Decorate a one-sample function whose parameters are annotated with roles.

    The body is traced once per argument layout (dtypes, shapes) into a Program, then runs over
    whole arrays, the sample axis last. Inside a builder, a call adds a node to the graph.

        @hawk_fx.kernel
        def scale(x: Scalar, a: Param, b: Param) -> Scalar:
            return a * x + b

        scale(np.arange(4.0), 2.0, 1.0)      # array([1., 3., 5., 7.])
    """
    if isinstance(fn, Kernel):
        return fn
    return Kernel(fn)
