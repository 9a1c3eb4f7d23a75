"""Tables in kernels: gather (`hm.take`, `table[i]`) and scatter (`hm.scatter_add`) with a per-sample
runtime index.

A `Table` parameter is one array shared by all samples (spline coefficients, a lookup grid, a
histogram), passed as a one-cell array: its last axis has length 1, the one-cell axis every value
shared by all samples has (`(K, 1)` for K entries, `(K, 4, 1)` for K rows of 4). Its first axis is
the one an index picks.

Two primitives:
    gather[mode fill]      (x, i)    -> x[i], x of per-sample shape (K, *rest), i an integer
    scatter_add[mode]      (s, i, v) -> s with v added at row i; where s is one value for all
                                       samples and i or v is per sample, every sample's row is
                                       added (a sum over the samples, in sample order)

Index modes (JAX's, so that results compare number by number with jnp.take and .at[].add):
    "fill"   negative i counts from the end (i + K); outside [0, K) a gather gives the fill value
             (NaN for floats, the most negative int, the largest unsigned, True) and a scatter
             drops the value (JAX's 'drop');
    "clip"   i clamped to [0, K - 1] as given (jnp.take(mode='clip'): -1 reads row 0);
    "wrap"   i modulo K (Python's: -1 is K - 1);
    "index"  negative i counts from the end, then clamped: `x[i]` on a jax.Array, and
             .at[i].add(mode='clip').
No mode reads or writes outside the table: the CUDA code clamps every index it dereferences.

Derivatives: gather's transpose is scatter_add into the cotangent of x, in the same mode (what a
fill-mode gather read from nowhere has no cotangent); scatter_add's transpose is a gather of the
cotangent (fill value 0). Both are linear in their float operands; the index has no derivative.
"""
from __future__ import annotations

import numpy as np

from . import prims
from .core import SAMPLE, UNIFORM, AVal, abstract_eval, eager_impl

gather_p = prims._prim("gather")
scatter_add_p = prims._prim("scatter_add")


def default_fill(dtype):
    """jnp.take's fill value for an out-of-range index in mode 'fill'."""
    dt = np.dtype(dtype)
    if dt.kind in "fc":
        return float("nan")
    if dt.kind == "b":
        return True
    return int(np.iinfo(dt).min if dt.kind == "i" else np.iinfo(dt).max)


def _check_index(api, i: AVal):
    if i.shape != ():
        raise TypeError(f"{api}: the index has per-sample shape {i.shape}; it takes one integer per sample "
                        "(an Int32/UInt32 plane, or an integer computed in the kernel)")
    if i.dtype.kind not in "iu":
        raise TypeError(f"{api}: the index has dtype {i.dtype.name}; it needs an integer dtype (an Int32/UInt32 "
                        "plane, or hm.int32(x) of a float: C casting truncates toward zero; hm.floor first "
                        "for negative x)")


def _check_table(api, x: AVal, what):
    if not x.shape:
        raise TypeError(f"{api}: the {what} is a scalar; it needs a first axis to index (a Table, a Vector or "
                        "a Matrix)")
    if x.shape[0] == 0:
        raise ValueError(f"{api}: the {what} has no rows (per-sample shape {x.shape}); nothing can be indexed")


@abstract_eval.register(gather_p)
def _gather_abstract(x, i, *, mode, fill):
    _check_index("hawk.math.take", i)
    _check_table("hawk.math.take", x, "table")
    return [AVal(x.shape[1:], x.dtype, prims.broadcast_kind(x, i), x.weak)]   # of Python numbers: weak


def _scatter_dtype(sink: AVal, v: AVal):
    return prims.promote((sink, v)) if sink.weak else sink.dtype


@abstract_eval.register(scatter_add_p)
def _scatter_abstract(sink, i, v, *, mode):
    _check_index("hawk.math.scatter_add", i)
    _check_table("hawk.math.scatter_add", sink, "sink")
    try:
        ok = np.broadcast_shapes(v.shape, sink.shape[1:]) == sink.shape[1:]
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(f"hawk.math.scatter_add: the value has per-sample shape {v.shape}, a row of the sink "
                         f"{sink.shape[1:]}; give a value that broadcasts to a row")
    return [AVal(sink.shape, _scatter_dtype(sink, v), sink.kind)]


def folds_samples(e) -> bool:
    """A scatter_add into one value for all samples of per-sample rows: a reduction over the samples
    (a body with one runs as a single pass over every sample, in sample order)."""
    return (e.prim is scatter_add_p and e.outputs[0].aval.kind == UNIFORM
            and any(getattr(a, "aval", None) is not None and a.aval.kind == SAMPLE for a in e.inputs))


# ---------------------------------------------------------------------------------------------
# NumPy: the values in the runtime layout (*shape, *batch, m), m the chunk's samples or 1

def normalize(i, k: int, mode: str, xp=np):
    """(row, valid): the row each index reads, always in [0, k), and where mode 'fill' found it in
    range (None for the other modes)."""
    if xp is np:
        j = np.asarray(i)
        if j.dtype == np.uint64:                          # beyond int64 is beyond any table
            j = np.minimum(j, np.uint64(2 ** 62)).astype(np.int64)
        if j.size and j.min() >= 0 and j.max() < k:       # every index in range: each mode reads it as it is
            return j, None
        j = j.astype(np.int64)
    else:
        j = xp.asarray(i).astype(np.int64)
    if mode == "wrap":
        return xp.mod(j, k), None
    if mode == "clip":
        return xp.clip(j, 0, k - 1), None
    j = xp.where(j < 0, j + k, j)
    if mode == "index":
        return xp.clip(j, 0, k - 1), None
    valid = (j >= 0) & (j < k)
    return xp.where(valid, j, 0), valid


def _pad(a, ndim, xp=np):
    """`a` with size-1 axes in front, to `ndim` axes."""
    a = xp.asarray(a)
    return a.reshape((1,) * (ndim - a.ndim) + a.shape)


def gather_np(x, i, out, mode, fill):
    x = np.asarray(x)
    j, valid = normalize(i, x.shape[0], mode)
    if x.ndim == 2 and x.shape[1] == 1 and j.shape == out.shape and x.dtype == out.dtype:
        np.take(x[:, 0], j, out=out, mode="clip")     # a 1-d table, one index per sample (j is in range)
    else:
        r = np.take_along_axis(x, _pad(j, x.ndim - 1)[None], axis=0)[0] if j.ndim else x[int(j)]
        np.copyto(out, r, casting="unsafe")
    if valid is not None and not valid.all():
        np.copyto(out, np.asarray(fill, out.dtype) if fill is not None else default_fill(out.dtype),
                  where=_pad(~valid, out.ndim), casting="unsafe")
    return out


def scatter_index(out_shape, j, v, xp=np):
    """The index tuple and the shape of every contribution, for add.at into an array of
    `out_shape` (K, *rest, *batch, s): each axis of the contributions either runs along the
    output's axis or, where the output has one cell there (a sum over samples), adds into it."""
    nd = len(out_shape) - 1
    cshape = np.broadcast_shapes((1,) * (nd - np.ndim(j)) + tuple(np.shape(j)),
                                 (1,) * (nd - np.ndim(v)) + tuple(np.shape(v)), tuple(out_shape[1:]))
    idx = [xp.broadcast_to(_pad(j, nd, xp), cshape)]
    for a, (c, o) in enumerate(zip(cshape, out_shape[1:])):
        ax = xp.arange(c) if o == c else xp.zeros(c, dtype=np.int64)
        idx.append(xp.broadcast_to(ax.reshape((1,) * a + (c,) + (1,) * (nd - a - 1)), cshape))
    return tuple(idx), cshape


def scatter_add_np(sink, i, v, out, mode):
    np.copyto(out, sink, casting="unsafe")
    j, valid = normalize(i, out.shape[0], mode)
    v = np.asarray(v)
    if valid is not None:
        v = np.where(_pad(valid, max(v.ndim, valid.ndim)), v, 0)
    # each row's contributions are summed in sample order, then added to the sink's row
    if out.dtype == np.float64 and out.ndim == 2 and out.shape[1] == 1 and j.ndim == 1 and v.ndim <= 1:
        out[:, 0] += np.bincount(j, weights=np.broadcast_to(v, j.shape), minlength=out.shape[0])
        return out
    idx, cshape = scatter_index(out.shape, j, v)
    acc = np.zeros_like(out)
    np.add.at(acc, idx, np.broadcast_to(v, cshape).astype(out.dtype, copy=False))   # in C order: sample order
    out += acc
    return out


def _eager_gather(x, i, *, mode, fill):
    x = np.asarray(x)
    j, valid = normalize(i, x.shape[0], mode)
    r = np.take(x, j, axis=0)
    if valid is not None and not np.all(valid):
        r = np.where(valid, r, fill if fill is not None else default_fill(x.dtype)).astype(x.dtype)
    return [r]


def _eager_scatter(sink, i, v, *, mode):
    out = np.array(sink, dtype=np.result_type(sink, v) if isinstance(sink, (int, float)) else np.asarray(sink).dtype)
    j, valid = normalize(i, out.shape[0], mode)
    v = np.asarray(v)
    if valid is not None:
        v = np.broadcast_to(v, np.shape(valid) + out.shape[1:])[valid]
        j = j[valid]
    np.add.at(out, j, v)
    return [out]


eager_impl[gather_p] = _eager_gather
eager_impl[scatter_add_p] = _eager_scatter


def table_layout(where, role, v, n):
    """The layout of a Table argument: one value for all samples, its per-sample shape the array's
    without the one-cell axis. Refuses numbers, arrays with a sample axis and arrays without the
    one-cell axis, before anything runs."""
    if not isinstance(v, np.ndarray):
        raise TypeError(f"{where} is {type(v).__name__} {v!r:.60}; a Table needs an array, one for all samples, "
                        "with a last axis of length 1: e.g. np.asarray(coeffs)[:, None] of shape (K, 1)")
    if v.dtype.kind not in "biuf" or not role.accepts_dtype(v.dtype):
        raise TypeError(f"{where} has dtype {v.dtype}; it needs {role.describe_dtype()}")
    if role.mutable and not v.flags.writeable:
        raise ValueError(f"{where} is a read-only array; a Mutable is written in place")
    if v.ndim >= 2 and v.shape[-1] == n != 1:
        raise ValueError(f"{where} has shape {v.shape}: its last axis has the call's {n} samples, and a Table is one "
                         "array for all samples, without a sample axis. Pass per-sample values as Scalar/Vector/"
                         "Matrix arguments, and a Table as (K, ..., 1)")
    if v.ndim < 2 or v.shape[-1] != 1:
        raise ValueError(f"{where} has shape {v.shape}; a Table's last axis is the one-cell axis (length 1) of a "
                         f"value shared by all samples: pass table[..., None], shape {v.shape + (1,)}")
    if v.shape[0] == 0:
        raise ValueError(f"{where} has shape {v.shape}: a Table with no rows; nothing could be read from it")
    return (UNIFORM, v.dtype, v.shape[:-1], False)


# ---------------------------------------------------------------------------------------------
# the kernel vocabulary: hm.take, hm.scatter_add (and `x[i]` with a traced i)

def _mode(api, mode, allowed):
    if mode not in allowed:
        raise ValueError(f"{api}: mode={mode!r}; it takes one of {', '.join(map(repr, allowed))}")
    return allowed[mode]


def take(table, i, mode="fill", fill_value=None):
    """table[i] for an integer index computed per sample, as jnp.take(table, i, axis=0, mode=mode).

    `table` is a Table parameter (or a Vector/Matrix value): i picks a row along its first axis.
    mode: 'fill' (default, as jnp.take: negative i counts from the end; out of range gives
    `fill_value`, NaN for floats), 'clip' (clamped to [0, K - 1] as given), 'wrap' (modulo K).
    No mode reads outside the table."""
    mode = _mode("hawk.math.take", mode, {"fill": "fill", "clip": "clip", "wrap": "wrap"})
    return gather_p.bind(table, i, mode=mode, fill=fill_value)


def scatter_add(sink, i, v, mode="drop"):
    """`sink` with v added at row i of every sample: the new value of a Table (a histogram, segment
    sums), as sink.at[i].add(v) in JAX summed over the samples.

    Assign it to a Mutable[Table] parameter to write the caller's array (`hist = hm.scatter_add(hist,
    b, 1.0)`). Rows are added in sample order, so every run gives the same bits (NumPy: one ordered
    pass; JAX: .at[].add; CUDA: one compensated sum per row, as hawk.sum). A value the same in every
    sample is added once per sample, as hawk.sum counts it. mode: 'drop' (default: negative i counts
    from the end, out of range is dropped), 'clip' (negative from the end, then clamped), 'wrap'."""
    mode = _mode("hawk.math.scatter_add", mode, {"drop": "fill", "fill": "fill", "clip": "index", "wrap": "wrap"})
    kinds = [getattr(a, "aval", None) for a in (sink, i, v)]
    if kinds[0] is not None and kinds[0].kind == UNIFORM and all(k is None or k.kind == UNIFORM for k in kinds[1:]):
        v = _per_sample(v)
    return scatter_add_p.bind(sink, i, v, mode=mode)


def _per_sample(v):
    """v spread over the samples (so that a sum over the samples counts it once per sample)."""
    from .trace import current_kernel_trace
    trace = current_kernel_trace()
    if trace is None:
        return v
    shape = v.aval.shape if hasattr(v, "aval") else np.shape(v)
    return trace.process(prims.broadcast_p, [v], {"shape": tuple(shape), "kind": SAMPLE})[0]


__all__ = ["take", "scatter_add", "gather_p", "scatter_add_p"]
