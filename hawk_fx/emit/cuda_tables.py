"""CUDA C for tables (hawk_fx/tables.py).

gather: a table that is a parameter of the body is read where it is indexed, `in3[row * R + c]`
(a per-sample one at `in3[(row * R + c) * n + i]`), with `row` always clamped into [0, K): no mode
reads memory outside the table. A table the body computed (a small Vector or Matrix in registers)
is read through a chain of selects on the row.

scatter_add: rewritten, before emission, into operations the emitter has: row r of the result is
sink[r] plus the contributions of the samples whose index is r, `sample_sum(where(row == r, v, 0))`,
each a compensated sum as hawk.sum's (its last bit may vary with the order of the blocks' atomics).
It costs K sums per sample, so it suits tables of a few hundred rows at most (histograms, segment
sums; more than MAX_CELLS cells are refused, naming the kernel line); NumPy and JAX add each sample once.
"""
from __future__ import annotations

import numpy as np

from .. import prims, tables
from ..core import SAMPLE, UNIFORM, Literal, ProgramTrace, Tracer
from .cuda import CUDA_RULES, c_literal

P = prims.P


def _row(idx: str, k: int, mode: str):
    """(row, valid): C expressions of the row an index reads, always in [0, k), and of whether mode
    'fill' found it in range (None for the other modes)."""
    j = f"((long long)({idx}))"
    top = f"{k - 1}LL"
    if mode == "wrap":
        return f"((({j} % {k}LL) + {k}LL) % {k}LL)", None
    if mode == "clip":
        return f"({j} < 0LL ? 0LL : ({j} > {top} ? {top} : {j}))", None
    jn = f"({j} < 0LL ? {j} + {k}LL : {j})"
    if mode == "index":
        return f"({jn} < 0LL ? 0LL : ({jn} > {top} ? {top} : {jn}))", None
    valid = f"({jn} >= 0LL && {jn} < {k}LL)"
    return f"({valid} ? {jn} : 0LL)", valid


def _pointer(em, var):
    """The parameter index of `var` when it is an input passed by pointer, else None."""
    for k, v in enumerate(em.prog.inputs):
        if v is var:
            return None if k in em.by_value else k
    return None


def _gather_rule(em, e, vals):
    x, i = vals
    out = e.outputs[0].aval
    k, r = x.shape[0], int(np.prod(x.shape[1:], dtype=np.int64))
    row, valid = _row(i.comps[0], k, e.params["mode"])
    src = _pointer(em, e.inputs[0])
    comps = []
    for c in range(r):
        if src is not None and e.inputs[0].aval.kind == UNIFORM:
            read = f"in{src}[{row} * {r}LL + {c}LL]"
        elif src is not None:
            read = f"in{src}[({row} * {r}LL + {c}LL) * hawk_n + hawk_i]"
        else:
            xs = x.cast(out.dtype)
            read = xs[(k - 1) * r + c]
            for q in reversed(range(k - 1)):
                read = f"({row} == {q}LL ? {xs[q * r + c]} : {read})"
        if valid is not None:
            fill = e.params["fill"]
            fill = tables.default_fill(out.dtype) if fill is None else fill
            read = f"({valid} ? {read} : {c_literal(fill, out.dtype)})"
        comps.append(read)
    return comps


CUDA_RULES[tables.gather_p] = _gather_rule


def read_where_indexed(prog) -> set:
    """The inputs the body reads only as the table of a gather: bound to no registers (the gather
    reads the entry it needs)."""
    uses: dict = {}
    for e in prog.eqns:
        for pos, a in enumerate(e.inputs):
            if a in uses or any(a is v for v in prog.inputs):
                uses.setdefault(a, []).append(e.prim is tables.gather_p and pos == 0)
    outs = {id(a) for a in prog.outputs}
    return {v for v, flags in uses.items() if all(flags) and id(v) not in outs}


# ---------------------------------------------------------------------------------------------
# scatter_add, rewritten into per-row sums

class _Retrace(ProgramTrace):
    def atom(self, x):
        return x if isinstance(x, Literal) else super().atom(x)


def expand_scatter(prog):
    """`prog` with every scatter_add written as per-row selects and sample sums (see the module doc)."""
    if not any(e.prim is tables.scatter_add_p for e in prog.eqns):
        return prog
    t = _Retrace()
    env = {v: t.new_input(v.aval, v.hint) for v in prog.inputs}

    def read(a):
        return a if isinstance(a, Literal) else env[a]

    for e in prog.eqns:
        ins = [read(a) for a in e.inputs]
        if e.prim is tables.scatter_add_p:
            outs = [_scatter_rows(t, e, ins)]
        else:
            outs = t.process(e.prim, ins, e.params)
            t.eqns[-1] = t.eqns[-1].replace(info=e.info)
        for v, x in zip(e.outputs, outs):
            env[v] = x
    return t.finish([read(a) for a in prog.outputs])


MAX_CELLS = 4096     # the cells a CUDA scatter_add sums one by one (each a sum over the samples)


def _scatter_rows(t, e, ins):
    want = e.outputs[0].aval
    cells = int(np.prod(want.shape, dtype=np.int64))
    if cells > MAX_CELLS:
        at = f" at {e.info.where}" if e.info.where else ""
        raise NotImplementedError(
            f"hawk CUDA emitter: hm.scatter_add{at} into a table of {want.shape[0]} rows ({cells} cells): the "
            f"CUDA code sums each cell over the samples, one sum per cell (deterministic), which suits up to "
            f"{MAX_CELLS} cells; run this kernel on the NumPy or JAX backend, or scatter into a smaller table")

    def op(name, *args, **params):
        return t.process(P[name], list(args), params)[0]

    def aval(x):
        return x.aval if isinstance(x, (Tracer, Literal)) else None

    sink, i, v = ins
    k, mode = want.shape[0], e.params["mode"]
    j = op("convert", i, dtype=np.dtype(np.int64))
    valid = None
    if mode == "wrap":
        j = op("mod", j, k)
    elif mode == "clip":
        j = op("min", op("max", j, 0), k - 1)
    else:
        j = op("select", op("lt", j, 0), op("add", j, k), j)
        if mode == "index":
            j = op("min", op("max", j, 0), k - 1)
        else:
            valid = op("and", op("ge", j, 0), op("lt", j, k))
    if aval(v).dtype != want.dtype or aval(v).weak:
        v = op("convert", v, dtype=want.dtype)
    fold = want.kind == UNIFORM and any(aval(a).kind == SAMPLE for a in (i, v))
    rows = []
    for r in range(k):
        hit = op("eq", j, r)
        if valid is not None:
            hit = op("and", hit, valid)
        c = op("select", hit, v, 0)
        if fold:
            c = op("sample_sum", c)
        rows.append(op("add", op("index", sink, i=r), c))
    res = op("stack", *rows)
    if res.aval.dtype != want.dtype or res.aval.weak:
        res = op("convert", res, dtype=want.dtype)
    if (res.aval.shape, res.aval.kind) != (want.shape, want.kind):
        res = op("broadcast", res, shape=want.shape, kind=want.kind)
    return res


def _scatter_rule(em, e, vals):
    """scatter_add never reaches emission: the emitter rewrites it first (expand_scatter)."""
    raise AssertionError("hawk CUDA emitter: scatter_add is rewritten into per-row sums before emission")


CUDA_RULES[tables.scatter_add_p] = _scatter_rule
