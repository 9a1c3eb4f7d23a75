"""The NumPy emitter: a kernel body becomes straight-line Python source calling NumPy with `out=`.

The generated `run(ins, outs, n)` evaluates the body over cache-sized chunks of samples, each
intermediate in a scratch array allocated once per chunk length and reused across calls.
Values that do not depend on the samples (Params, constants) are computed once per call.
Scratch belongs to a thread (a few chunk lengths each), so any number of threads may call one
compiled body at once: eagerly, from graph replays, or as chunk workers.
A body with a sample reduction runs as one chunk, since the reduction needs every sample.
Large calls share their chunks out to a few threads; one chunk runs inline, for small-n speed.
A graph replay binds a call (`bind`) to its planes and to scratch of its own: no lookup per call.

Runtime layout: a per-sample value is an array (*shape, m); a uniform value is (*shape, 1), or a
Python number when weakly typed (so float32 stays float32, as NumPy's rules say).
"""
from __future__ import annotations

import os
import re
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .. import prims, tables
from ..core import SAMPLE, UNIFORM, Literal, Program, RuleTable, Var, eager_impl
from ..accurate import SMALL as SMALL_SUM, fsum, sum_last_axis
from ..context import CONTEXT
from .numpy_select import bit_select_lines, bit_select_width, mask_line, select_in_place

CHUNK = 32768   # samples per chunk: a few intermediates of this size (reused by liveness) stay in L2

# Large calls split their chunks across threads (NumPy releases the GIL inside each ufunc loop).
# Read at every call, so they can be changed at run time; THREADS = 1 keeps every call in one thread.
THREADS = min(8, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
PARALLEL_MIN = 8 * CHUNK    # below this, waking workers costs more than they save
INLINE_LINES = 64          # a body up to this long runs inline in run_flat at one chunk: a call fewer
SCRATCH_SIZES = 4          # chunk lengths whose scratch a thread keeps per compiled body (LRU)
_pool: list = [None, 0]     # [ThreadPoolExecutor, its worker count], made at the first large call
_pool_lock = threading.Lock()


def _workers(count: int) -> ThreadPoolExecutor:
    """A pool of at least `count` threads. A smaller one is replaced, not shut down: a call in
    another thread may still be submitting to it."""
    with _pool_lock:
        if _pool[1] < count:
            _pool[:] = [ThreadPoolExecutor(max_workers=count, thread_name_prefix="hawk-chunks"), count]
        return _pool[0]


def run_chunks(part, n: int, chunk: int, args: tuple = ()) -> None:
    """Run part(lo, hi, *args) over samples [0, n): in this thread, or cut at chunk boundaries
    into one range per worker, this thread taking the first. Returns when every range is done."""
    chunks = -(-n // chunk)
    workers = min(THREADS, chunks)
    if workers <= 1 or n < PARALLEL_MIN:
        part(0, n, *args)
        return
    pool = _workers(workers - 1)
    per = -(-chunks // workers) * chunk           # whole chunks per worker
    futures = [pool.submit(part, lo, min(lo + per, n), *args) for lo in range(per, n, per)]
    try:
        part(0, min(per, n), *args)
    finally:
        errors = [f.exception() for f in futures]     # wait for all: no write may outlive the call
    for err in errors:
        if err is not None:
            raise err


def overlapping_inputs(ins, outs) -> list[int]:
    """Indices of the input arrays that share memory with an output array without being that very
    view. A body runs chunk by chunk, so such an input would be read after an earlier chunk wrote
    over it; callers copy these once first, so a call computes what NumPy computes for
    `y[1:] = f(y[:-1], y[1:])`: every input read before any write. (may_share_memory: an
    interleaved view that does not truly overlap is copied too, which is merely slower.)"""
    found = []
    for k, a in enumerate(ins):
        if isinstance(a, np.ndarray) and any(a is not o and np.may_share_memory(a, o) and not _same_view(a, o)
                                             for o in outs):
            found.append(k)
    return found


def _same_view(a: np.ndarray, b: np.ndarray) -> bool:
    """Both arrays see the same elements in the same order: each sample reads what it writes."""
    return (a.shape == b.shape and a.strides == b.strides
            and a.__array_interface__["data"][0] == b.__array_interface__["data"][0])


numpy_emit = RuleTable("NumPy emission")   # prim -> fn(ctx, out, ins, params) -> list of source lines
single_pass: set = set()                    # prims whose emission may write over one of its inputs
# prims with several results (a loop, hawk_fx/loops.py): fn(ctx, [out names], ins, params) -> lines;
# each also has its entry in numpy_emit, which the checks of the tables look up
several_results = RuleTable("NumPy emission of several results")

SAMPLE_SOURCES: set = set()                 # prims of no operands whose value is per sample (sample_index)


class EmitContext:
    def __init__(self):
        self.globals: dict = {"np": np}
        self._names: dict = {}          # (id(value), hint) -> its name: one global per object, however often used

    def const(self, value, hint="k") -> str:
        key = (id(value), hint)
        name = self._names.get(key)
        if name is None:
            name = self._names[key] = f"{hint}{len(self.globals)}"
            self.globals[name] = value
        return name


def _is_weak(v) -> bool:
    """A value held as a Python number at run time: a weak uniform scalar. (A weak Vector, or a
    per-sample choice between numbers, is an array in its default dtype: see _strong_operands.)"""
    return v.aval.kind == UNIFORM and v.aval.weak and not v.aval.shape


for _p, (_arity, _fn) in prims.ELEMENTWISE.items():
    if _p.name == "select":
        continue

    def _rule(ctx, out, ins, params, fn=_fn, name=_p.name):
        f = ctx.const(fn, f"f_{name}_")
        # `out` positionally, which a ufunc parses faster, except where NumPy deprecates it (an
        # extra operand of minimum/maximum); out None: return a new value
        if out is None:
            return [f"{f}({', '.join(ins)})"]
        return [f"{f}({', '.join(ins)}, {'out=' if fn in (np.minimum, np.maximum) else ''}{out})"]

    numpy_emit[_p] = _rule
    single_pass.add(_p)


@numpy_emit.register(prims.P["select"])
def _select(ctx, out, ins, params):
    c, a, b = ins
    return [f"np.copyto({out}, {b})", f"np.copyto({out}, {a}, where={c})"]


@numpy_emit.register(prims.convert_p)
def _convert(ctx, out, ins, params):
    return [f"np.copyto({out}, {ins[0]}, casting='unsafe')"]


single_pass.add(prims.convert_p)     # an elementwise copy: it may write straight into an output


def _sample_sum(x, out):
    """The sum over samples. Of floats, within an ulp however they cancel (hawk_fx/accurate.py).
    Of a bool plane, count_nonzero: it needs no casting buffer, where np.add.reduce from bool to
    int allocates one per call. Over many short rows of bools (a batched call: one row per
    instance), a matrix-vector product with ones: add.reduce over a short last axis costs several
    times more. The float sum reads values (its certificates, fsum) only to compute this result,
    again at every call, so it reads them past a staging guard (np.asarray)."""
    if x.dtype.kind == "f" and x.ndim == 1 and x.size <= SMALL_SUM:
        out[0] = fsum(np.asarray(x).tolist())     # a few samples: the exact sum is the cheap one
    elif x.dtype.kind == "f":
        np.copyto(out, sum_last_axis(np.asarray(x), out.dtype, _share(x))[..., None], casting="unsafe")
    elif x.dtype == np.bool_ and x.ndim == 1:
        out[0] = np.count_nonzero(x)
    elif x.dtype == np.bool_ and x.shape[-1] % 8 == 0 and x.flags.c_contiguous and _POPCOUNT is not None:
        # rows of bools, 8 per 64-bit word: each row's count is the bit count of its words
        words = _POPCOUNT(x.view(np.uint64))
        if words.shape[-1] == 1:
            np.copyto(out, words, casting="unsafe")
        else:
            np.add.reduce(words, axis=-1, keepdims=True, out=out, dtype=out.dtype)
    elif x.ndim > 1 and x.dtype == np.bool_ and x.shape[-1] <= _SHORT_ROW and x.size >= 8 * x.shape[-1]:
        _row_sums(x, out)
    else:
        np.add.reduce(x, axis=-1, keepdims=True, out=out)


def _share(x):
    """For a large sum, a share(part, count) that runs the sum's tiles [0, count) as run_chunks
    runs a body's chunks (a tile counts as PARALLEL_MIN samples, so any one may go to a worker)."""
    if THREADS <= 1 or x.size < PARALLEL_MIN:
        return None
    return lambda part, count: run_chunks(lambda lo, hi: part(lo // PARALLEL_MIN, hi // PARALLEL_MIN),
                                          count * PARALLEL_MIN, PARALLEL_MIN)


try:        # np.count_nonzero without its Python wrapper (which costs the count four times over at small n)
    from numpy._core.multiarray import count_nonzero as _count_nonzero
except ImportError:
    _count_nonzero = np.count_nonzero

_SHORT_ROW = 64
_POPCOUNT = getattr(np, "bitwise_count", None)      # NumPy >= 2.0


def _row_sums(x, out):
    key = ("row_sums", x.shape, out.dtype)
    scratch = CONTEXT.scratch          # this thread's: the buffers of _row_sums by (shape, dtype)
    bufs = scratch.get(key)
    if bufs is None:
        dt = np.dtype(np.float64)        # counts of up to 64 are exact in it
        if len(scratch) >= SCRATCH_SIZES:
            scratch.clear()
        bufs = scratch[key] = (np.ones((x.shape[-1], 1), dt), np.empty(x.shape, dt),
                                    np.empty(x.shape[:-1] + (1,), dt))
    ones, rows, sums = bufs
    np.copyto(rows, x, casting="unsafe")
    np.matmul(rows, ones, out=sums)
    np.copyto(out, sums, casting="unsafe")


# ufunc.reduce skips np.max's Python wrapper, which dominates at small n
for _name, _ufunc in (("sample_max", np.maximum), ("sample_min", np.minimum)):
    def _red(ctx, out, ins, params, f=_ufunc.reduce):
        return [f"{ctx.const(f, 'red')}({ins[0]}, axis=-1, keepdims=True, out={out})"]
    numpy_emit[prims.P[_name]] = _red


def _sample_mean(x, out):
    """The mean over samples: the accurate sum (of floats, or of counts as float64) over n."""
    total = sum_last_axis(np.asarray(x, np.float64 if x.dtype.kind != "f" else None), out.dtype, _share(x))
    np.copyto(out, (total / x.shape[-1])[..., None], casting="unsafe")


@numpy_emit.register(prims.P["sample_sum"])
def _sum(ctx, out, ins, params):
    return [f"{ctx.const(_sample_sum, 'sum')}({ins[0]}, {out})"]


@numpy_emit.register(prims.P["sample_mean"])
def _mean(ctx, out, ins, params):
    return [f"{ctx.const(_sample_mean, 'mean')}({ins[0]}, {out})"]


@numpy_emit.register(prims.stack_p)
def _stack(ctx, out, ins, params):
    return [f"np.copyto({out}[{k}], {a})" for k, a in enumerate(ins)]


@numpy_emit.register(prims.einsum_p)
def _einsum(ctx, out, ins, params):
    spec = prims.sample_spec(params["spec"])
    return [f"np.einsum({spec!r}, {', '.join(f'np.asarray({a})' for a in ins)}, out={out})"]


@numpy_emit.register(prims.cross_p)
def _cross(ctx, out, ins, params):
    return [f"np.copyto({out}, np.cross({ins[0]}, {ins[1]}, axis=0))"]


@numpy_emit.register(prims.broadcast_p)
def _broadcast(ctx, out, ins, params):
    return [f"np.copyto({out}, {ins[0]})"]


# ops that make a view: no scratch, no copy
view_emit = {
    prims.index_p: lambda ins, params: f"{ins[0]}[{params['i']}]",
    prims.transpose_p: lambda ins, params: f"np.swapaxes({ins[0]}, 0, 1)",
    prims.sample_count_p: lambda ins, params: "float(n)",
}


def _literal_src(ctx, lit: Literal, nbatch: int = 0) -> str:
    v = lit.value
    if isinstance(v, bool) or (isinstance(v, (int, float)) and np.isfinite(v)):
        return repr(v)
    if np.ndim(v):                      # a constant Vector/Matrix is uniform: (*shape, *batch, 1) at run time
        v = np.asarray(v).reshape(np.shape(v) + (1,) * (nbatch + 1))
    return ctx.const(v, "lit")


def _unpacked(line: str) -> str:
    """A body line reading scratch and uniforms as names (S_0, U_0) in place of tuple items."""
    return re.sub(r"\b([SU])\[(\d+)\]", r"\1_\2", line)


def _typed_literals(ctx, e, ins):
    """A Python number beside a ufunc's operands of one float dtype becomes a 0-d array of that
    dtype: what NumPy converts the weak number to (exactly: only values the dtype holds), with no
    conversion at each call, which costs a ufunc as much again at small n."""
    dts = {np.dtype(a.aval.dtype) for a in e.inputs if isinstance(a, Var)}
    if len(dts) != 1 or any(isinstance(a, Var) and a.aval.weak for a in e.inputs):
        return ins
    dt = dts.pop()
    if dt.kind != "f":
        return ins
    out = list(ins)
    for k, a in enumerate(e.inputs):
        v = a.value if isinstance(a, Literal) else None
        if type(v) in (int, float) and abs(v) < 2 ** 53 and float(dt.type(v)) == v:     # finite, exact
            out[k] = ctx.const(np.array(v, dt), "lit")
    return out


class _ThreadScratch(threading.local):
    """One thread's scratch for one compiled body: U, the values computed once per call (Params,
    constants), and per chunk length the intermediates, most recently used last."""

    def __init__(self, uniform_specs, batch):
        self.U = tuple(np.empty(s + batch + (1,), d) for s, d in uniform_specs)
        self.sets: dict[int, tuple] = {}


class NumpyKernel:
    """One kernel body compiled for one input signature. Call run(ins, outs, n), from any thread."""

    def __init__(self, prog: Program, out_sample, chunk: int = CHUNK, batch: tuple = ()):
        self.prog = prog
        self.out_sample = tuple(out_sample)   # per output: is its array a per-sample plane?
        # vmap: every value gains these axes just before the sample axis (*shape, *batch, n); inputs
        # without them broadcast (size-1 axes), reductions over the last axis stay per instance
        self.batch = tuple(batch)
        self.has_reduction = any(e.prim in prims.REDUCTION or tables.folds_samples(e) for e in prog.eqns)
        self.chunk = 1 << 62 if self.has_reduction else chunk
        self.source = self._generate()
        self._local = _ThreadScratch(self.uniform_specs, self.batch)
        ns = dict(self.ctx.globals, _T=self._local, _scratch=self.scratch, _run_chunks=run_chunks)
        exec(compile(self.source, f"<hawk kernel {id(prog):x}>", "exec"), ns)
        self.run_fn = ns["run"]              # run(ins, outs, n)
        self.run_flat = ns["run_flat"]       # run_flat(*ins, *outs, n): the same, positionally
        self._bind = ns["bind"]

    def _generate(self) -> str:
        prog = self.prog
        ctx = self.ctx = EmitContext()
        depends: set[Var] = {v for v in prog.inputs if v.aval.kind == SAMPLE}
        for e in prog.eqns:
            if (any(isinstance(a, Var) and a in depends for a in e.inputs) or e.prim in prims.REDUCTION
                    or e.prim in SAMPLE_SOURCES or any(v.aval.kind == SAMPLE for v in e.outputs)):
                depends.update(e.outputs)
        # a uniform input read only by elementwise ops on per-sample values may be given already
        # spread over the samples (a batched Param inside a device loop: spread once, not per op)
        consumers: dict[Var, list] = {v: [] for v in prog.inputs}
        for e in prog.eqns:
            for v in dict.fromkeys(a for a in e.inputs if isinstance(a, Var) and a in consumers):
                consumers[v].append(e)
        out_set = {a for a in prog.outputs if isinstance(a, Var)}
        self.spreadable = tuple(
            v.aval.kind != SAMPLE and v not in out_set and bool(consumers[v])
            and all((e.prim in prims.ELEMENTWISE or e.prim is prims.P["select"]) and all(o in depends for o in e.outputs)
                    for e in consumers[v])
            for v in prog.inputs)
        # vmap: a weak scalar computed from an instance's values (select(x == x, 0.0, 0.0)) differs
        # by instance, so it is held as an array with the batch axes, not as a Python number
        self.held = set()
        if self.batch:
            per_instance = set(prog.inputs)
            for e in prog.eqns:
                if any(isinstance(a, Var) and a in per_instance for a in e.inputs):
                    per_instance.update(e.outputs)
                    self.held.update(v for v in e.outputs if _is_weak(v))
        names: dict[Var, str] = {}
        for k, v in enumerate(prog.inputs):
            names[v] = f"i{k}"
        self.uniform_specs: list = []   # hoisted scratch: (shape, dtype)
        self.scratch_specs: list = []   # per-chunk scratch: (shape, dtype, is_sample)
        hoisted, body, after = [], [], []

        # An output may be the caller's input array (a Mutable), so a value that still reads input
        # memory (an input, or a view of one) must be read before any output is written.
        in_mem: set[Var] = set(prog.inputs)
        for e in prog.eqns:
            if e.prim in view_emit and isinstance(e.inputs[0], Var) and e.inputs[0] in in_mem:
                in_mem.update(e.outputs)
        # Outputs made from the samples are written per chunk; the others once, after the chunks,
        # so a later chunk still reads the caller's old one-cell values.
        in_body = [j for j, a in enumerate(prog.outputs) if isinstance(a, Var) and a in depends]
        body_set = set(in_body)
        out_after = [j for j in range(len(prog.outputs)) if j not in body_set]
        body_from_mem = [j for j in in_body if prog.outputs[j] in in_mem]

        # which outputs can be written directly by the equation that makes them: a single-pass
        # op after the last read of input memory, when no output is itself a copy of input memory
        out_pos: dict[Var, int] = {}
        for j in in_body:
            out_pos.setdefault(prog.outputs[j], j)
        last_mem_read = last_any_read = len(prog.eqns) if body_from_mem else -1
        for idx, e in enumerate(prog.eqns):
            reads = [a for a in e.inputs if isinstance(a, Var) and a in in_mem]
            if any(a.aval.kind == SAMPLE for a in reads):
                last_mem_read = max(last_mem_read, idx)
            if reads:
                last_any_read = max(last_any_read, idx)
        direct: dict[Var, int] = {}
        for idx, e in enumerate(prog.eqns):
            for v in e.outputs:
                if v not in out_pos or e.prim not in single_pass:
                    continue
                if idx >= last_mem_read and v.aval.kind == SAMPLE and self.out_sample[out_pos[v]]:
                    direct[v] = out_pos[v]
                # a one-cell result of a reduction (a guard's count, converted): the body runs as one
                # chunk, so it is written once, after the last read of anything in input memory
                elif self.has_reduction and idx >= last_any_read and not self.out_sample[out_pos[v]]:
                    direct[v] = out_pos[v]

        def src(a):
            return _literal_src(ctx, a, len(self.batch)) if isinstance(a, Literal) else names[a]

        # scratch reuse by liveness: an intermediate's array serves a later one once it is dead, so a
        # long body keeps a few chunk-sized arrays hot in cache instead of one per value
        root: dict[Var, Var] = {}
        for e in prog.eqns:
            if e.prim in view_emit and isinstance(e.inputs[0], Var):
                root[e.outputs[0]] = root.get(e.inputs[0], e.inputs[0])
        last_use: dict[Var, float] = {}
        for idx, e in enumerate(prog.eqns):
            for a in e.inputs:
                if isinstance(a, Var):
                    last_use[root.get(a, a)] = idx
        for a in prog.outputs:
            if isinstance(a, Var):
                last_use[root.get(a, a)] = float("inf")
        free: dict[tuple, list] = {}
        scratch_of: dict[Var, int] = {}
        # a count of bools read only by its conversion into a direct output of 32 bits or more
        # (a guard's flag): the count is stored there, and the conversion is no copy at all
        readers: dict[Var, list] = {}
        for e in prog.eqns:
            for a in e.inputs:
                if isinstance(a, Var):
                    readers.setdefault(a, []).append(e)
        count_into: dict[Var, Var] = {}
        for idx, e in enumerate(prog.eqns):
            a = e.inputs[0] if e.inputs else None
            if (e.prim is prims.P["sample_sum"] and idx >= last_any_read and not self.batch and isinstance(a, Var)
                    and a.aval.dtype == np.bool_ and not a.aval.shape and a.aval.kind == SAMPLE):
                r = readers.get(e.outputs[0], [])
                w = r[0].outputs[0] if len(r) == 1 and r[0].prim is prims.convert_p else None
                if (w is not None and w in direct and e.outputs[0] not in out_pos
                        and np.dtype(w.aval.dtype).kind in "iu" and np.dtype(w.aval.dtype).itemsize >= 4):
                    count_into[e.outputs[0]] = w

        masks: dict = {}        # (a select's bool mark, int dtype) -> the local name of its bit mask
        for idx, e in enumerate(prog.eqns):
            ins = [src(a) for a in e.inputs]
            if (e.prim in prims.ELEMENTWISE and isinstance(prims.ELEMENTWISE[e.prim][1], np.ufunc)
                    and not self._number(e.outputs[0])):
                ins = _typed_literals(ctx, e, ins)
            if e.prim in several_results:   # a loop (hawk_fx/loops.py): its results in scratch of their own
                lines = hoisted if e.outputs[0] not in depends else body
                for v in e.outputs:
                    if v not in depends:
                        names[v] = f"U[{len(self.uniform_specs)}]"
                        self.uniform_specs.append((v.aval.shape, v.aval.dtype))
                    else:
                        names[v] = f"S[{len(self.scratch_specs)}]"
                        self.scratch_specs.append((v.aval.shape, v.aval.dtype, v.aval.kind == SAMPLE))
                lines.extend(several_results[e.prim](ctx, [names[v] for v in e.outputs], ins, e.params))
                continue
            v = e.outputs[0]
            lines = hoisted if v not in depends else body
            if e.prim in view_emit:
                names[v] = f"t{len(names)}"
                view = view_emit[e.prim](ins, e.params)
                if self._number(v) and e.prim is not prims.sample_count_p:
                    view = f"{view}.item(0)"      # a component of a weak Vector: a Python number
                lines.append(f"{names[v]} = {view}")
                continue
            if self._number(v):
                # Python numbers in, a Python number out (NumPy's weak-scalar rules keep float32)
                names[v] = f"t{len(names)}"
                if e.prim in single_pass or e.prim is prims.einsum_p:      # emitters that return with out=None
                    call = numpy_emit[e.prim](ctx, None, ins, e.params)[0]
                else:
                    f = ctx.const(lambda *xs, _impl=eager_impl[e.prim], _kw=e.params: _impl(*xs, **_kw)[0],
                                  f"w_{e.prim.name}_")
                    call = f"np.asarray({f}({', '.join(ins)}))"
                lines.append(f"{names[v]} = {call}.item()")
                continue
            if e.prim is not prims.convert_p and e.prim not in prims.REDUCTION:
                ins = self._strong_operands(e, ins, lines, hoisted)
            if e.prim is prims.convert_p and e.inputs[0] in count_into:
                names[v] = f"o{direct[v]}"      # written by the count
                continue
            if v in direct:
                names[v] = f"o{direct[v]}"
            elif v in count_into:
                names[v] = f"o{direct[count_into[v]]}"
            elif v not in depends:
                names[v] = f"U[{len(self.uniform_specs)}]"
                self.uniform_specs.append((v.aval.shape, v.aval.dtype))
            elif select_in_place(e, idx, scratch_of, last_use, root):     # into the new value's scratch
                scratch_of[v] = scratch_of.pop(e.inputs[2])
                names[v] = names[e.inputs[2]]
            else:
                key = (v.aval.shape, v.aval.dtype, v.aval.kind == SAMPLE)
                k = free[key].pop() if free.get(key) else None
                if k is None:
                    k = len(self.scratch_specs)
                    self.scratch_specs.append(key)
                scratch_of[v] = k
                names[v] = f"S[{k}]"
            a = e.inputs[0] if e.inputs else None
            if (e.prim is prims.P["sample_sum"] and not self.batch and isinstance(a, Var)
                    and a.aval.dtype == np.bool_ and not a.aval.shape and a.aval.kind == SAMPLE):
                lines.append(f"{names[v]}[0] = {ctx.const(_count_nonzero, 'count')}({ins[0]})")  # _sample_sum's count
            elif e.prim is prims.P["select"] and bit_select_width(e) is not None:    # no branch per sample
                idt = bit_select_width(e)
                if (e.inputs[0], idt) not in masks:     # in a dead scratch of the values' size where one is free
                    key = ((), v.aval.dtype, True)
                    k = free[key].pop() if free.get(key) else None
                    if k is None:
                        k = len(self.scratch_specs)
                        self.scratch_specs.append(key)
                    masks[e.inputs[0], idt] = f"sel_mask{k}"
                    lines.append(mask_line(ctx, ins[0], f"S[{k}]", idt, f"sel_mask{k}"))
                lines.extend(bit_select_lines(ctx, names[v], ins, idt, masks[e.inputs[0], idt]))
            else:
                lines.extend(numpy_emit[e.prim](ctx, names[v], ins, e.params))
            for a in {root.get(a, a) for a in e.inputs if isinstance(a, Var)}:
                if last_use.get(a) == idx and a in scratch_of:
                    free.setdefault(self.scratch_specs[scratch_of[a]], []).append(scratch_of.pop(a))

        # copies into outputs; with more than one output, those still in input memory are
        # snapshotted first (`a, b = b, a` on two Mutables)
        body_src = {j: src(prog.outputs[j]) for j in in_body}
        if len(in_body) > 1:
            for j in body_from_mem:
                a = prog.outputs[j]
                snap = f"S[{len(self.scratch_specs)}]"
                self.scratch_specs.append((a.aval.shape, a.aval.dtype, a.aval.kind == SAMPLE))
                body.append(f"np.copyto({snap}, {body_src[j]})")
                body_src[j] = snap
        for j in in_body:
            if direct.get(prog.outputs[j]) != j:
                body.append(f"np.copyto(o{j}, {body_src[j]}, casting='unsafe')")
        after_src = {j: src(prog.outputs[j]) for j in out_after}
        if len(out_after) > 1:
            for j in out_after:
                a = prog.outputs[j]
                if isinstance(a, Var) and a in in_mem and not self._number(a):
                    after.append(f"c{j} = np.array({after_src[j]})")
                    after_src[j] = f"c{j}"
        after += [f"np.copyto(o{j}, {after_src[j]}, casting='unsafe')" for j in out_after]

        ni, no = len(prog.inputs), len(prog.outputs)
        i_names = [f"i{k}" for k in range(ni)]
        o_names = [f"o{k}" for k in range(no)]
        hoisted_names = sorted({names[v] for v in names if v not in depends and v not in prog.inputs
                                and not names[v].startswith("U[")})
        # s0: the first sample of the chunk (what sample_index counts from)
        self.uses_index = any(e.prim in SAMPLE_SOURCES for e in prog.eqns)
        params = ", ".join(i_names + o_names + hoisted_names + ["S", "U", "n", "s0"])
        code = [f"def body({params}):"] + ["    " + ln for ln in body or ["pass"]]
        sliced_in = [f"i{k}[..., s:e]" if v.aval.kind == SAMPLE else f"i{k}" for k, v in enumerate(prog.inputs)]
        sliced_out = [f"o{j}[..., s:e]" if self.out_sample[j] else f"o{j}" for j in range(no)]
        if not self.scratch_specs and self.chunk < 1 << 62:
            # no intermediates to keep in cache: chunks only share the work out to threads, so make
            # them big (one pass on one core)
            self.chunk = PARALLEL_MIN if THREADS > 1 else 1 << 62
        ch = self.chunk
        # part: the chunks in samples [lo, hi), with the scratch of the thread that runs it
        whole = i_names + o_names + hoisted_names
        code += [f"def part(lo, hi, {', '.join(whole + ['U', 'n'])}):",
                 f"    for s in range(lo, hi, {ch}):",
                 f"        e = s + {ch} if s + {ch} < hi else hi",
                 f"        body({', '.join(sliced_in + sliced_out + hoisted_names + ['_scratch(e - s)', 'U', 'n', 's'])})"]
        # run_flat: positional planes, then n; one chunk runs the body inline (a call fewer, which
        # counts at small n), more go through run_chunks (worker threads for large n). U and S are
        # this thread's: another thread may be in the same body now
        code += [f"def run_flat({', '.join(i_names + o_names + ['n'])}):"]
        code += ["    U = _T.U" if self.uniform_specs else "    U = ()"]
        code += ["    " + ln for ln in hoisted]
        if body:
            code += [f"    if n <= {ch}:",
                     "        S = _T.sets.get(n)",
                     "        if S is None:",
                     "            S = _scratch(n)"]
            if len(body) <= INLINE_LINES:
                code += ["        s0 = 0"] * self.uses_index + ["        " + ln for ln in body]
            else:       # a long body (a fused chain): one copy of its code, not two to compile
                code += [f"        body({', '.join(i_names + o_names + hoisted_names + ['S', 'U', 'n', '0'])})"]
            part_args = "".join(a + ", " for a in whole + ["U", "n"])
            code += ["    else:",
                     f"        _run_chunks(part, n, {ch}, ({part_args}))"]
        code += ["    " + ln for ln in after] + ["    return"]
        code += ["def run(ins, outs, n):",
                 "    run_flat(*ins, *outs, n)"]
        # bind: a call of no arguments over given planes, n (one chunk) and scratch of the caller's
        # own (a graph replay: it holds its planes and scratch, and runs one call at a time)
        code += [f"def bind({', '.join(i_names + o_names + ['S', 'U', 'n'])}):"]
        code += [f"    {', '.join(f'S_{k}' for k in range(len(self.scratch_specs)))}, = S"] if self.scratch_specs else []
        code += [f"    {', '.join(f'U_{k}' for k in range(len(self.uniform_specs)))}, = U"] if self.uniform_specs else []
        code += ["    def call():"]
        if len(body) <= INLINE_LINES:
            inner = hoisted + ["s0 = 0"] * self.uses_index + body + after
        else:
            inner = hoisted + [f"body({', '.join(i_names + o_names + hoisted_names + ['S', 'U', 'n', '0'])})"] + after
        code += ["        " + _unpacked(ln) for ln in inner] + ["        return", "    return call"]
        return "\n".join(code) + "\n"

    def _number(self, v) -> bool:
        """Is `v` held as a Python number at run time (a weak scalar the same for every instance)?"""
        return _is_weak(v) and v not in self.held

    def _strong_operands(self, e, ins, lines, hoisted):
        """A weak value held as an array (a per-sample choice between two Python numbers, a Vector
        of them) is stored in its default dtype; meeting a float32 operand it is converted first,
        as NumPy converts a Python number, so the operation computes in float32. The copy goes to
        scratch of its own (per chunk) or, for a uniform value, to U (once per call)."""
        first = 1 if e.prim is prims.P["select"] else 0          # select's condition stays as it is
        values = e.inputs[first:]
        weak = [k for k, a in enumerate(values, first) if isinstance(a, Var) and a.aval.weak and not self._number(a)]
        if not weak:
            return ins
        target = prims.promote([a.aval for a in values])
        ins = list(ins)
        for k in weak:
            a = e.inputs[k]
            if a.aval.dtype == target:
                continue
            if a.aval.kind == SAMPLE:
                name, into = f"S[{len(self.scratch_specs)}]", lines
                self.scratch_specs.append((a.aval.shape, target, True))
            else:
                name, into = f"U[{len(self.uniform_specs)}]", hoisted
                self.uniform_specs.append((a.aval.shape, target))
            into.append(f"np.copyto({name}, {ins[k]}, casting='unsafe')")
            ins[k] = name
        return ins

    def new_scratch(self, m: int) -> tuple:
        """(S, U): new intermediates for a chunk of m samples, and the values computed once per call."""
        S = tuple(np.empty(shape + self.batch + ((m if sample else 1),), dt) for shape, dt, sample in self.scratch_specs)
        return S, tuple(np.empty(s + self.batch + (1,), d) for s, d in self.uniform_specs)

    def bind(self, ins, outs, n: int, scratch) -> callable:
        """call(): run(ins, outs, n) with no arguments and no scratch lookup, for n within one chunk;
        `scratch` (new_scratch(n)) is the caller's, and used by one call at a time."""
        assert n <= self.chunk
        return self._bind(*ins, *outs, *scratch, n)

    def scratch(self, m: int) -> tuple:
        """This thread's intermediates for a chunk of m samples. A thread keeps them for the
        SCRATCH_SIZES chunk lengths it used last (a chunked call uses two: the chunk and the tail)."""
        sets = self._local.sets
        s = sets.pop(m, None)
        if s is None:
            if len(sets) >= SCRATCH_SIZES:
                del sets[next(iter(sets))]
            s = self.new_scratch(m)[0]
        sets[m] = s
        return s

    def release_scratch(self, min_bytes: int) -> None:
        """Drop this thread's intermediates for the chunk lengths whose set holds more than min_bytes
        (a body with a sample reduction keeps whole-n planes): they are made again when next used."""
        sets = self._local.sets
        for m in [m for m, s in sets.items() if sum(a.nbytes for a in s) > min_bytes]:
            del sets[m]

    def __call__(self, ins, outs, n):
        self.run_fn(ins, outs, n)


# tables: gather and scatter_add (hawk_fx/tables.py computes them in the runtime layout)
@numpy_emit.register(tables.gather_p)
def _gather(ctx, out, ins, params):
    f, fill = ctx.const(tables.gather_np, "gather"), ctx.const(params["fill"], "fill")
    return [f"{f}({ins[0]}, {ins[1]}, {out}, {params['mode']!r}, {fill})"]


@numpy_emit.register(tables.scatter_add_p)
def _scatter_add(ctx, out, ins, params):
    f = ctx.const(tables.scatter_add_np, "scatter_add")
    return [f"{f}({ins[0]}, {ins[1]}, {ins[2]}, {out}, {params['mode']!r})"]
