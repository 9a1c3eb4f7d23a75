"""NumPy math on staged planes: ufuncs and operators become kernel calls, the rest is refused.

Inside a builder, `np.sin(y)`, `y * 2.0`, `x + y`, `-y` stage a call of a small generated kernel
(one per NumPy function and operand roles) whose body is the matching `hawk_fx.math` function, so
the staged value gets every kernel rule for free: derivatives, batching, fusion, CUDA. A NumPy
function with no staged meaning would run once at build on no values at all; it is refused with
the builder's line and what to write instead.
"""
from __future__ import annotations

import itertools
import linecache

import numpy as np

import hawk_fx
import hawk_fx.math as hm
from hawk_fx.caches import LRU
from hawk_fx.context import CONTEXT
from hawk_fx.emit.jax import is_jax_array

from .. import ir, seams
from . import staged_sums, views

# NumPy ufunc -> the hawk_fx.math function of the same meaning
UFUNCS = {
    np.absolute: "abs", np.sign: "sign", np.floor: "floor", np.ceil: "ceil", np.rint: "round",
    np.trunc: "trunc", np.sqrt: "sqrt", np.cbrt: "cbrt", np.exp: "exp", np.exp2: "exp2", np.expm1: "expm1",
    np.log: "log", np.log2: "log2", np.log10: "log10", np.log1p: "log1p", np.sin: "sin", np.cos: "cos",
    np.tan: "tan", np.arcsin: "asin", np.arccos: "acos", np.arctan: "atan", np.sinh: "sinh", np.cosh: "cosh",
    np.tanh: "tanh", np.fabs: "abs", np.arcsinh: "asinh", np.arccosh: "acosh", np.arctanh: "atanh",
    np.isfinite: "isfinite", np.isnan: "isnan", np.isinf: "isinf", np.logical_not: "logical_not", np.negative: "negative",
    np.arctan2: "atan2", np.power: "pow", np.hypot: "hypot", np.fmod: "fmod", np.minimum: "minimum",
    np.maximum: "maximum", np.logical_and: "logical_and", np.logical_or: "logical_or", np.add: "add",
    np.subtract: "subtract", np.multiply: "multiply", np.divide: "divide", np.less: "less",
    np.less_equal: "less_equal", np.greater: "greater", np.greater_equal: "greater_equal", np.equal: "equal",
    np.not_equal: "not_equal",
}

# NumPy ufuncs hawk_fx.math has no single function for, written with those it has
# (// and % are the kernel's own operators, which compute as np.floor_divide and np.remainder:
# floor(a / b) is 5 for 2.0 // 0.4, where NumPy's exact quotient floors to 4)
COMPOSED = {np.square: ("square", "a * a"), np.reciprocal: ("reciprocal", "1.0 / a"),
            np.floor_divide: ("floor_divide", "a // b"), np.remainder: ("remainder", "a % b")}

# NumPy's bitwise ufuncs on bools are the logical ones hawk_fx.math has; integers have no bit
# operations in kernels yet, and NumPy refuses floats
BOOL_UFUNCS = {np.bitwise_and: "logical_and", np.bitwise_or: "logical_or", np.bitwise_xor: "not_equal",
               np.invert: "logical_not"}

_kernels = LRU("NumPy math kernels of builders", 1024)    # (name, roles) -> the kernel
_serial = itertools.count()    # each generated source its own file name, also after an eviction


def role_of(value):
    """The kernel role that takes `value` as it is: by the number of axes of a plane or array."""
    shape = getattr(value, "shape", None)
    if shape is None or len(shape) == 0:
        return "Param"
    if len(shape) == 1:
        return "Scalar"
    if len(shape) == 2:
        return f"Vector[{shape[0]}]"
    if len(shape) == 3:
        return f"Matrix[{shape[0]}, {shape[1]}]"
    return None


def elementwise_kernel(fname: str, roles: tuple, body: str | None = None):
    """The kernel `def fname(a: role, ...): return hawk_fx.math.fname(a, ...)` (or `return body`),
    made once per name and roles."""
    key = (fname, roles)
    k = _kernels.get(key)
    if k is None:
        names = "abcdefgh"[:len(roles)]
        params = ", ".join(f"{n}: {r}" for n, r in zip(names, roles))
        body = body or f"hm.{fname}({', '.join(names)})"
        src = f"def {fname}({params}):\n    return {body}\n"
        filename = f"<eagle_fx numpy {fname}{next(_serial)}>"
        linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)   # for the kernel's source pass
        ns = {"hm": hm, "hawk_fx": hawk_fx, "Scalar": hawk_fx.Scalar, "Vector": hawk_fx.Vector, "Matrix": hawk_fx.Matrix,
              "Param": hawk_fx.Param}
        exec(compile(src, filename, "exec"), ns)
        k = _kernels[key] = hawk_fx.kernel(ns[fname])
    return k


LIKE = {np.zeros_like, np.ones_like, np.empty_like, np.full_like}
SHAPE_ONLY = {np.shape: lambda a: a.shape, np.ndim: lambda a: len(a.shape),
              np.size: lambda a: int(np.prod(a.shape))}

CASTS = {np.dtype(np.float64): "float64", np.dtype(np.float32): "float32", np.dtype(np.int32): "int32",
         np.dtype(np.uint32): "uint32"}
API = "eagle.Graph.builder"


def _kernel_for(fname, operands, where, what, body=None):
    roles = []
    for a in operands:
        r = role_of(a)
        if r is None:
            raise ValueError(f"{API} {where}: {what} on an array of shape {a.shape}; staged math takes planes of "
                             "1 to 3 axes (Scalar, Vector[k], Matrix[m, k] planes): write a kernel")
        roles.append(r)
    return elementwise_kernel(fname, tuple(roles), body)


def _operand(a):
    """A 0-d array is a number (a Param); anything else is staged as it is."""
    if isinstance(a, np.ndarray) and a.shape == ():
        return a[()]
    return a


def _refuse(where, what, instead):
    return TypeError(f"{API} {where}: {what} on a staged plane is not staged: run at build, it would see no values "
                     f"and be baked into every replay; {instead}")


WRITE_KERNEL = "write a kernel (@hawk.kernel) that computes it per sample (hawk.sum/max/min/mean reduce over samples)"


def stage_ufunc(uf, method, inputs, kwargs, where):
    name = f"np.{uf.__name__}" + ("" if method == "__call__" else f".{method}")
    if method != "__call__":
        raise _refuse(where, name, WRITE_KERNEL)
    if kwargs:
        raise _refuse(where, f"{name}({', '.join(k + '=' for k in kwargs)}...)",
                      "call it without where=/dtype=/casting= (out=y alone is staged); for a masked update write "
                      "y[...] = np.where(mask, np.sin(x), y)")
    if uf is np.divmod:                  # divmod(y, b): NumPy's (y // b, y % b)
        return stage_ufunc(np.floor_divide, method, inputs, kwargs, where), \
            stage_ufunc(np.remainder, method, inputs, kwargs, where)
    if uf is np.matmul:
        raise _refuse(where, "@ (np.matmul)", "NumPy's @ multiplies the whole arrays, the sample axis included, "
                      "not each sample's vectors: write a kernel with hm.dot(a, b) or hm.matmul(m, v) per sample")
    inputs = [_operand(a) for a in inputs]
    fname, body = UFUNCS.get(uf), None
    if fname is None and uf in COMPOSED:
        fname, body = COMPOSED[uf]
    if uf in BOOL_UFUNCS:
        _require_bools(inputs, where, name)
        fname = BOOL_UFUNCS[uf]
    if fname is None:
        raise _refuse(where, name, f"hawk_fx.math has no {uf.__name__}: {WRITE_KERNEL}")
    _check_broadcast(inputs, where, name)
    return _kernel_for(fname, inputs, where, name, body)(*inputs)


def stage_ufunc_into(uf, method, inputs, kwargs, out, where):
    """`np.add(a, b, out=y)`, and so `y += b`: NumPy's meaning, the result written into the array y
    names, in place, at every replay (visible through every name and view of y; a builder argument
    is the caller's array). Returns y, as NumPy does."""
    name = f"np.{uf.__name__}"
    if len(out) != 1:
        raise _refuse(where, f"{name}(out=<{len(out)} arrays>)", "assign each result: y[...] = ...")
    target = out[0]
    result = stage_ufunc(uf, method, inputs, kwargs, where)
    plane = target if isinstance(target, NdarrayProtocol) else CONTEXT.innermost("graph_stagers").plane_of_array(target)
    write_into(plane, result, where, f"{name}(..., out=y) (or an in-place operator such as y += ...)")
    return target


def write_into(plane, value, where, what):
    """plane[...] = value with NumPy's casting rule for in-place results ('same_kind': float64 into
    float32 casts, float into int is refused); the value has the plane's shape."""
    have, want = np.dtype(value.dtype), plane.aval.dtype
    if have != want:
        if not np.can_cast(have, want, "same_kind"):
            raise TypeError(f"{API} {where}: {what}: the result is {have.name} and y is {want.name}; NumPy refuses "
                            f"this cast ('same_kind'): compute in {want.name}, or make a new array: y = y + ...")
        value = stage_cast(value, want, where)
    shape = tuple(value.shape)
    if shape != plane.aval.shape:
        raise ValueError(f"{API} {where}: {what}: the result has shape {shape} and y has {plane.aval.shape}; an "
                         "in-place result keeps y's shape: give the operands y's shape (a view, .reshape), or make "
                         "a new array: y = y + ...")
    plane[...] = value


def _require_bools(operands, where, name):
    dts = [np.dtype(getattr(a, "dtype", None) or np.result_type(a)) for a in operands]
    bad = next((dt for dt in dts if dt != np.bool_), None)
    if bad is not None:
        raise TypeError(f"{API} {where}: {name} (&, |, ^, ~) with an operand of dtype {bad.name}; staged planes "
                        "have it for bools (where it is logical and, or, xor, not), as comparisons give them: "
                        "(x > 0) & (y < 1). Integer bit operations have no kernel primitive yet"
                        + ("; NumPy refuses floats too" if bad.kind == "f" else ""))


def _check_broadcast(operands, where, name):
    shapes = [tuple(a.shape) for a in operands if getattr(a, "shape", ())]
    try:
        np.broadcast_shapes(*shapes)
    except ValueError:
        raise ValueError(f"{API} {where}: {name} of planes of shapes {', '.join(map(str, shapes))}: they do not "
                         "broadcast together (NumPy's rule; the last axis is the samples): give them the same "
                         "sample count, e.g. by slicing one") from None


def stage_cast(plane, dtype, where):
    fname = CASTS.get(dtype)
    if fname is None:
        raise TypeError(f"{API} {where}: astype(dtype {dtype.name}) of a staged plane; a staged cast goes to a real "
                        f"dtype: {', '.join(CASTS.values())}")
    return _kernel_for(fname, [plane], where, "astype")(plane)


def stage_function(func, args, kwargs, where):
    Plane = NdarrayProtocol
    name = f"np.{func.__name__}"
    if func in LIKE:
        proto = args[0]
        if isinstance(proto, Plane):
            proto = np.empty(proto.shape, proto.dtype)
        return func(proto, *args[1:], **kwargs)
    if func in SHAPE_ONLY:
        return SHAPE_ONLY[func](args[0])
    if func in (np.stack, np.concatenate):
        return _join(func, args, kwargs, where)
    if func in (np.vstack, np.hstack) and len(args) == 1 and not kwargs:
        arrays = list(args[0])
        if func is np.vstack:                   # 1-d planes become rows; the rest join on axis 0
            return _join(np.concatenate, ([a.reshape((1,) + tuple(a.shape)) if len(a.shape) == 1 else a
                                           for a in arrays],), {}, where)
        return _join(np.concatenate, (arrays,), {"axis": 0 if len(arrays[0].shape) == 1 else 1}, where)
    if func is np.reshape and isinstance(args[0], Plane):
        shape = args[1] if len(args) > 1 else kwargs.get("newshape", kwargs.get("shape"))
        return args[0].reshape(shape)
    if func is np.ravel and isinstance(args[0], Plane) and len(args) == 1 and not kwargs:
        return args[0].ravel()
    if func is np.transpose and isinstance(args[0], Plane) and len(args) == 1 and not kwargs:
        return args[0].T
    if func is np.copy and isinstance(args[0], Plane) and len(args) == 1 and not kwargs:
        return args[0].copy()
    if func is np.where and len(args) == 3 and not kwargs:
        ops = [_operand(a) for a in args]
        _check_broadcast(ops, where, name)
        return _kernel_for("where", ops, where, name)(*ops)
    if func is np.round and len(args) == 1 and not kwargs.get("decimals") and not kwargs.get("out"):
        return _kernel_for("round", [args[0]], where, name)(args[0])
    if func in staged_sums.REDUCTIONS and args and isinstance(args[0], Plane):
        return staged_sums.stage_reduction(staged_sums.REDUCTIONS[func], name, args[0], where, *args[1:], **kwargs)
    if func is np.clip and len(args) == 3 and not kwargs and all(a is not None for a in args):
        ops = [_operand(a) for a in args]
        return _kernel_for("clip", ops, where, name)(*ops)
    raise _refuse(where, name, WRITE_KERNEL)


def _join(func, args, kwargs, where):
    """np.stack / np.concatenate of planes: one `concat` (stack first gives each operand its new axis)."""
    Plane = NdarrayProtocol
    name = f"np.{func.__name__}"
    arrays = args[0]
    axis = args[1] if len(args) > 1 else kwargs.pop("axis", 0)
    if len(args) > 2 or any(k not in ("axis",) for k in kwargs) or axis is None:
        raise _refuse(where, f"{name} with {'axis=None' if axis is None else 'out=/dtype='}",
                      "join along an axis, without out= or dtype=")
    arrays = list(arrays)
    if not arrays:
        raise ValueError(f"{API} {where}: {name} of no arrays")
    trace = CONTEXT.innermost("graph_stagers")
    for a in arrays:
        if not (isinstance(a, Plane) or isinstance(a, np.ndarray)):
            raise TypeError(f"{API} {where}: {name} of a {type(a).__name__}; join planes and arrays")
    shapes = {tuple(a.shape) for a in arrays}
    dtypes = {np.dtype(a.dtype) for a in arrays}
    if len(dtypes) > 1:
        raise TypeError(f"{API} {where}: {name} of planes of dtypes {sorted(d.name for d in dtypes)}; give them one "
                        "dtype (astype)")
    if func is np.stack:
        if len(shapes) > 1:
            raise ValueError(f"{API} {where}: np.stack of planes of shapes {sorted(shapes)}; they need one shape")
        ndim = len(arrays[0].shape) + 1
        if not -ndim <= axis < ndim:
            raise ValueError(f"{API} {where}: np.stack axis {axis} for a result of {ndim} axes")
        axis %= ndim
        if axis == ndim - 1:
            raise ValueError(f"{API} {where}: np.stack(..., axis={axis}) makes the stacked axis the last one, the "
                             "sample axis of a plane; stack along an earlier axis (axis=0 gives (k, n) planes)")
        shape = arrays[0].shape[:axis] + (1,) + arrays[0].shape[axis:]
        arrays = [a.reshape(shape) for a in arrays]
    else:
        ndim = len(arrays[0].shape)
        if not -ndim <= axis < ndim:
            raise ValueError(f"{API} {where}: np.concatenate axis {axis} for planes of {ndim} axes")
        axis %= ndim
        rest = {s[:axis] + s[axis + 1:] for s in shapes}
        if len({len(s) for s in shapes}) > 1 or len(rest) > 1:
            raise ValueError(f"{API} {where}: np.concatenate of planes of shapes {sorted(shapes)} along axis {axis}; "
                             "they need the same shape on every other axis")
    return trace.stage_concat(arrays, axis)


# ---------------------------------------------------------------------------------------------
# the ndarray protocol of a staged plane (eagle_fx.frontend.staging.Plane): views, math, refusals

class NdarrayProtocol:
    """What NumPy code sees of a staged plane. Indexing and reshape give views (eagle_fx/frontend/views.py),
    ufuncs and operators stage kernel calls, the rest is refused; once its graph is built a plane
    reads as its array. The plane supplies aval, key, graph, _array(), _staging(what) (the trace,
    or None once built), _derived(key, shape) (a view handle) and _where() (the builder line)."""

    __slots__ = ()

    @property
    def ndim(self):
        return len(self.aval.shape)

    @property
    def size(self):
        return int(np.prod(self.aval.shape))

    @property
    def itemsize(self):
        return self.aval.dtype.itemsize

    @property
    def nbytes(self):
        return self.size * self.aval.dtype.itemsize

    def __getitem__(self, idx):
        if self._staging("indexing") is None:
            return self._array()[idx]
        try:
            index = views.normalise(self.aval.shape, idx)
        except views.IndexRefusal as e:
            raise IndexError(f"eagle.Graph.builder {self._where()}: {e}") from None
        if not isinstance(index[-1], range):
            if ir.is_cond_cell(self.aval):
                outer = seams.inside()
                raise IndexError(f"eagle.Graph.builder {self._where()}" + (f" (staged by {' inside '.join(outer[::-1])})"
                                                                            if outer else "") +
                                 f": [{idx!r}] reads the value of a cell (a one-cell uint32 array: its one entry "
                                 "is on the sample axis), which the graph knows only at replay; `int(n[0])` as a loop "
                                 "count would freeze it at build. The cell is itself a device condition: `if c:`, "
                                 "`while c:`, and a count: write `for _ in range(n):` (a device counted loop that "
                                 "reads n at every replay)")
            raise IndexError(f"eagle.Graph.builder {self._where()}: an integer index on the last axis of a plane of "
                             f"shape {self.aval.shape}; the last axis is the sample axis: keep it with a slice "
                             "(x[..., k:k+1] is sample k as a one-sample plane), or read per-sample values in a "
                             "kernel")
        return self._view(index, idx)

    def _view(self, index, idx):
        shape = ir.index_shape(index)
        if 0 in shape:
            raise IndexError(f"eagle.Graph.builder {self._where()}: the index {idx!r} selects no element of a plane "
                             f"of shape {self.aval.shape}; a plane holds at least one sample")
        key, src_shape = self.key, self.aval.shape
        if isinstance(key, views.ViewKey):
            index, key, src_shape = views.compose(key.index, index), key.src, key.src_shape
        return self._derived(views.ViewKey(key, index, shape, src_shape), shape)

    def reshape(self, *shape, order="C"):
        if self._staging("reshape") is None:
            return self._array().reshape(*shape, order=order)
        if order != "C":
            raise ValueError(f"eagle.Graph.builder {self._where()}: reshape(order={order!r}); a staged reshape is "
                             "in C order")
        shape = shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
        shape = np.empty(self.aval.shape, dtype=[]).reshape(tuple(int(d) for d in shape)).shape  # NumPy's rules, -1
        if shape == self.aval.shape:
            return self
        if not shape:
            raise ValueError(f"eagle.Graph.builder {self._where()}: reshape to () leaves no sample axis; keep "
                             "one: (1,)")
        return self._derived(views.ReshapeKey(self.key, shape, self.aval.shape), shape)

    def ravel(self, order="C"):
        return self.reshape(-1, order=order)

    flatten = ravel

    @property
    def T(self):
        if self._staging(".T") is None:
            return self._array().T
        if len(self.aval.shape) >= 2:
            raise ValueError(f"eagle.Graph.builder {self._where()}: .T of a plane of shape {self.aval.shape} moves "
                             "its last (sample) axis; a plane keeps its samples last: transpose the per-sample "
                             "values in a kernel (hawk.math.transpose)")
        return self

    def copy(self):
        t = self._staging(".copy()")
        if t is None:
            return self._array().copy()
        return t.stage_copy(self)

    def astype(self, dtype, copy=True):
        if self._staging(".astype") is None:
            return self._array().astype(dtype)
        return stage_cast(self, np.dtype(dtype), self._where())

    def sum(self, axis=None, dtype=None, out=None, keepdims=False, **kwargs):
        if self._staging(".sum()") is None:
            return self._array().sum(axis, dtype, out, keepdims, **kwargs)
        return staged_sums.stage_reduction("sum", ".sum", self, self._where(), axis, dtype, out, keepdims, **kwargs)

    def mean(self, axis=None, dtype=None, out=None, keepdims=False, **kwargs):
        if self._staging(".mean()") is None:
            return self._array().mean(axis, dtype, out, keepdims, **kwargs)
        return staged_sums.stage_reduction("mean", ".mean", self, self._where(), axis, dtype, out, keepdims, **kwargs)

    def __array_ufunc__(self, uf, method, *inputs, **kwargs):
        out = kwargs.pop("out", None)
        if not any(isinstance(a, NdarrayProtocol) and a._staging(uf.__name__) is not None
                   for a in (*inputs, *(out or ()))):
            if out is not None:
                kwargs["out"] = tuple(_arrays(out))
            return getattr(uf, method)(*_arrays(inputs), **kwargs)
        if out is None:
            return stage_ufunc(uf, method, inputs, kwargs, self._where())
        return stage_ufunc_into(uf, method, inputs, kwargs, out, self._where())

    def __array_function__(self, func, types, args, kwargs):
        if self._staging(func.__name__) is None:
            return func(*_arrays(args), **kwargs)
        return stage_function(func, args, kwargs, self._where())

    def __array__(self, dtype=None, copy=None):
        if self.graph is None or not self.graph.is_built:
            raise TypeError(f"eagle.Graph.builder {self._where()}: a staged plane ({self.aval}) is converted to a "
                            "NumPy array while the graph is being built; it has no value yet, and a value read now "
                            "would be baked into every replay: compute with kernels, or with NumPy ufuncs and "
                            "operators on the plane (they are staged)")
        a = self._array()
        if not isinstance(a, np.ndarray) and is_jax_array(a):      # a jax backend graph's plane
            a = np.asarray(a)
        return a if dtype is None else a.astype(dtype)

    def _no_value(self, what):
        if self.graph is not None and self.graph.is_built:
            return self._array()
        raise TypeError(f"eagle.Graph.builder {self._where()}: {what} of a staged plane ({self.aval}); it has no value "
                        "while the graph is being built, and one read now would be baked into every replay: "
                        "decide it on the device (a one-cell uint32 condition) or compute it in a kernel")

    def __float__(self):
        return float(self._no_value("float()"))

    def __int__(self):
        return int(self._no_value("int()"))

    def __index__(self):
        return self._no_value("an index or int()").__index__()

    def __complex__(self):
        return complex(self._no_value("complex()"))

    def __iter__(self):
        if self._staging("iteration") is None:
            return iter(self._array())
        if len(self.aval.shape) < 2:
            raise TypeError(f"eagle.Graph.builder {self._where()}: iterating over a 1-d plane walks its samples "
                            "(the last axis); write the per-sample work as a kernel, or slice: x[k:k+1]")
        return (self[i] for i in range(self.aval.shape[0]))

    def __setitem__(self, idx, value):
        t = self._staging("assignment")
        if t is None:
            self._array()[idx] = value
            return
        try:
            index = views.normalise(self.aval.shape, idx)
        except views.IndexRefusal as e:
            raise IndexError(f"eagle.Graph.builder {self._where()}: {e}") from None
        if not isinstance(index[-1], range):        # one sample: a region of one sample (the value is one too)
            index = index[:-1] + (range(index[-1], index[-1] + 1),)
        view = self._view(index, idx)
        t.check_inplace(view.key, "an in-place update (y[...] = ..., y += ...)")
        if isinstance(value, NdarrayProtocol) and value.key == view.key:
            return          # `y[1:] += v`: Python assigns the updated view back to itself; it is there already
        t.stage_assign(view, value, self._where())    # an update of this plane, every replay

    def __getattr__(self, name):
        if hasattr(np.ndarray, name) and not name.startswith("__"):
            raise TypeError(f"eagle.Graph.builder {self._where()}: .{name} of a staged plane is not staged (it "
                            "would run once at build and be baked in); write a kernel (@hawk.kernel) that computes it "
                            "per sample, with hawk.sum/max/min/mean for reductions over samples")
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")


def _arrays(values):
    """A built graph's planes as their arrays (NumPy on them after the build runs on values)."""
    return [a._array() if isinstance(a, NdarrayProtocol) else a for a in values]


def _dunder(ufunc, reflected=False):
    if reflected:
        return lambda self, other: ufunc(other, self)
    return lambda self, other: ufunc(self, other)


for _name, _uf in (("add", np.add), ("sub", np.subtract), ("mul", np.multiply), ("truediv", np.divide),
                   ("pow", np.power), ("mod", np.remainder), ("floordiv", np.floor_divide)):
    setattr(NdarrayProtocol, f"__{_name}__", _dunder(_uf))
    setattr(NdarrayProtocol, f"__r{_name}__", _dunder(_uf, True))
for _name, _uf in (("lt", np.less), ("le", np.less_equal), ("gt", np.greater), ("ge", np.greater_equal),
                   ("eq", np.equal), ("ne", np.not_equal)):
    setattr(NdarrayProtocol, f"__{_name}__", _dunder(_uf))
for _name, _uf in (("and", np.bitwise_and), ("or", np.bitwise_or), ("xor", np.bitwise_xor), ("matmul", np.matmul),
                   ("divmod", np.divmod)):
    setattr(NdarrayProtocol, f"__{_name}__", _dunder(_uf))
    setattr(NdarrayProtocol, f"__r{_name}__", _dunder(_uf, True))
NdarrayProtocol.__invert__ = lambda self: np.invert(self)
for _name, _uf in (("add", np.add), ("sub", np.subtract), ("mul", np.multiply), ("truediv", np.divide),
                   ("pow", np.power), ("mod", np.remainder), ("floordiv", np.floor_divide)):
    setattr(NdarrayProtocol, f"__i{_name}__", lambda self, other, _uf=_uf: _uf(self, other, out=(self,)))
NdarrayProtocol.__neg__ = lambda self: np.negative(self)
NdarrayProtocol.__pos__ = lambda self: self
NdarrayProtocol.__abs__ = lambda self: np.absolute(self)
