"""The NumPy emitter: a kernel body becomes straight-line Python source calling NumPy with `out=`.

The generated `run(ins, outs, n)` evaluates the body over cache-sized chunks of samples, each
intermediate in a scratch array allocated once per chunk length and reused across calls.
Values that do not depend on the samples (Params, constants) are computed once per call.
A body with a sample reduction runs as one chunk, since the reduction needs every sample.

Runtime layout: a per-sample value is an array (*shape, m); a uniform value is (*shape, 1), or a
Python number when weakly typed (so float32 stays float32, as NumPy's rules say).
"""
from __future__ import annotations

import numpy as np

from .. import prims
from ..core import SAMPLE, UNIFORM, Literal, Program, RuleTable, Var

CHUNK = 16384   # samples per chunk: a few intermediates of this size stay in L2

numpy_emit = RuleTable("NumPy emission")   # prim -> fn(ctx, out, ins, params) -> list of source lines
single_pass: set = set()                    # prims whose emission may write over one of its inputs


class EmitContext:
    def __init__(self):
        self.globals: dict = {"np": np}

    def const(self, value, hint="k") -> str:
        name = f"{hint}{len(self.globals)}"
        self.globals[name] = value
        return name


def _is_weak(v) -> bool:
    return v.aval.kind == UNIFORM and v.aval.weak


for _p, (_arity, _fn) in prims.ELEMENTWISE.items():
    if _p.name == "select":
        continue

    def _rule(ctx, out, ins, params, fn=_fn, name=_p.name):
        f = ctx.const(fn, f"f_{name}_")
        return [f"{f}({', '.join(ins)}, out={out})"]

    numpy_emit[_p] = _rule
    single_pass.add(_p)


@numpy_emit.register(prims.P["select"])
def _select(ctx, out, ins, params):
    c, a, b = ins
    return [f"np.copyto({out}, {b})", f"np.copyto({out}, {a}, where={c})"]


@numpy_emit.register(prims.convert_p)
def _convert(ctx, out, ins, params):
    return [f"np.copyto({out}, {ins[0]}, casting='unsafe')"]


for _p, _fn in prims.REDUCTION.items():
    def _red(ctx, out, ins, params, fn=_fn, sample_in=True):
        f = ctx.const(fn, "red")
        return [f"{f}({ins[0]}, axis=-1, keepdims=True, out={out})"]
    numpy_emit[_p] = _red


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
}


def _literal_src(ctx, lit: Literal) -> str:
    v = lit.value
    if isinstance(v, bool) or (isinstance(v, (int, float)) and np.isfinite(v)):
        return repr(v)
    return ctx.const(v, "lit")


class NumpyKernel:
    """One kernel body compiled for one input signature. Call run(ins, outs, n)."""

    def __init__(self, prog: Program, out_sample, chunk: int = CHUNK):
        self.prog = prog
        self.out_sample = tuple(out_sample)   # per output: is its array a per-sample plane?
        has_reduction = any(e.prim in prims.REDUCTION for e in prog.eqns)
        self.chunk = 1 << 62 if has_reduction else chunk
        self._scratch_cache: dict[int, tuple] = {}
        self.source = self._generate()
        ns = dict(self.ctx.globals)
        exec(compile(self.source, f"<hawk kernel {id(prog):x}>", "exec"), ns)
        self.run_fn = ns["run"]
        self._uniform = tuple(np.empty(s + (1,), d) for s, d in self.uniform_specs)

    def _generate(self) -> str:
        prog = self.prog
        ctx = self.ctx = EmitContext()
        depends: set[Var] = {v for v in prog.inputs if v.aval.kind == SAMPLE}
        for e in prog.eqns:
            if any(isinstance(a, Var) and a in depends for a in e.inputs) or e.prim in prims.REDUCTION:
                depends.update(e.outputs)
        names: dict[Var, str] = {}
        for k, v in enumerate(prog.inputs):
            names[v] = f"i{k}"
        self.uniform_specs: list = []   # hoisted scratch: (shape, dtype)
        self.scratch_specs: list = []   # per-chunk scratch: (shape, dtype, is_sample)
        hoisted, body = [], []

        # which outputs can be written directly by the equation that makes them
        out_pos: dict[Var, int] = {}
        for j, a in enumerate(prog.outputs):
            if isinstance(a, Var) and a not in out_pos and a not in prog.inputs:
                out_pos[a] = j
        last_input_read = -1
        for idx, e in enumerate(prog.eqns):
            if any(isinstance(a, Var) and a in prog.inputs and a.aval.kind == SAMPLE for a in e.inputs):
                last_input_read = idx
        direct: dict[Var, int] = {}
        for idx, e in enumerate(prog.eqns):
            for v in e.outputs:
                if (v in out_pos and e.prim in single_pass and v in depends and idx >= last_input_read
                        and v.aval.kind == SAMPLE and self.out_sample[out_pos[v]]):
                    direct[v] = out_pos[v]

        def src(a):
            return _literal_src(ctx, a) if isinstance(a, Literal) else names[a]

        for e in prog.eqns:
            ins = [src(a) for a in e.inputs]
            v = e.outputs[0]
            lines = hoisted if v not in depends else body
            if e.prim in view_emit:
                names[v] = f"t{len(names)}"
                lines.append(f"{names[v]} = {view_emit[e.prim](ins, e.params)}")
                continue
            if _is_weak(v):
                names[v] = f"t{len(names)}"
                if e.prim not in single_pass:
                    raise NotImplementedError(f"hawk: {e.prim} of Python numbers only")
                call = numpy_emit[e.prim](ctx, "None", ins, e.params)[0].replace(", out=None)", ")")
                lines.append(f"{names[v]} = {call}.item()")
                continue
            if v in direct:
                names[v] = f"o{direct[v]}"
            elif v not in depends:
                names[v] = f"U[{len(self.uniform_specs)}]"
                self.uniform_specs.append((v.aval.shape, v.aval.dtype))
            else:
                names[v] = f"S[{len(self.scratch_specs)}]"
                self.scratch_specs.append((v.aval.shape, v.aval.dtype, v.aval.kind == SAMPLE))
            lines.extend(numpy_emit[e.prim](ctx, names[v], ins, e.params))
        for j, a in enumerate(prog.outputs):
            if not (isinstance(a, Var) and direct.get(a) == j):
                body.append(f"np.copyto(o{j}, {src(a)}, casting='unsafe')")

        ni, no = len(prog.inputs), len(prog.outputs)
        i_names = [f"i{k}" for k in range(ni)]
        o_names = [f"o{k}" for k in range(no)]
        hoisted_names = sorted({names[v] for v in names if v not in depends and v not in prog.inputs
                                and not names[v].startswith("U[")})
        params = ", ".join(i_names + o_names + hoisted_names + ["S", "U", "n"])
        code = [f"def body({params}):"] + ["    " + ln for ln in body or ["pass"]]
        sliced_in = [f"i{k}[..., s:e]" if v.aval.kind == SAMPLE else f"i{k}" for k, v in enumerate(prog.inputs)]
        out_sample = self.out_sample
        code += [f"def run(ins, outs, n, U, scratch):",
                 f"    {', '.join(i_names) + ',' if ni else '_'} = ins",
                 f"    {', '.join(o_names) + ',' if no else '_'} = outs"]
        code += ["    " + ln for ln in hoisted]
        rest = ", ".join(hoisted_names + ["U", "n"])
        code += [f"    if n <= {self.chunk}:",
                 f"        body({', '.join(i_names + o_names + [rest.replace('U, n', 'scratch(n), U, n')])})",
                 f"        return",
                 f"    for s in range(0, n, {self.chunk}):",
                 f"        e = s + {self.chunk} if s + {self.chunk} < n else n",
                 f"        body({', '.join(sliced_in + [f'o{j}[..., s:e]' if out_sample[j] else f'o{j}' for j in range(no)] + [rest.replace('U, n', 'scratch(e - s), U, n')])})"]
        return "\n".join(code) + "\n"

    def scratch(self, m: int) -> tuple:
        s = self._scratch_cache.get(m)
        if s is None:
            if len(self._scratch_cache) > 8:
                self._scratch_cache.clear()
            s = tuple(np.empty(shape + ((m if sample else 1),), dt) for shape, dt, sample in self.scratch_specs)
            self._scratch_cache[m] = s
        return s

    def __call__(self, ins, outs, n):
        self.run_fn(ins, outs, n, self._uniform, self.scratch)

