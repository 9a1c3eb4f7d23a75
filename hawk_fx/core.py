"""The IR shared by kernels and graphs: abstract values, Var/Literal, Eqn, Program, Primitive.

Grammar (printed like a jaxpr):

    Program ::= { lambda in1:type in2:type ... . let  Eqn*  in (out1, out2, ...) }
    Eqn     ::= out:type ... = prim[param=value ...] atom ...
    atom    ::= Var | Literal

A per-sample value's type shows its whole-array shape with the sample axis `n` last
(`f64[3,n]` is a Vector[3]); a uniform value (one for all samples) has no `n` (`f64[]`);
graph planes show their concrete shape (`f64[8]`). A trailing `~` marks a weakly typed
value (a Python number), which takes the dtype of what it meets, as in NumPy.
"""
from __future__ import annotations

import itertools
from typing import Any

import numpy as np

SAMPLE, UNIFORM, PLANE, CELL = "sample", "uniform", "plane", "cell"


class AVal:
    """The abstract value of a Var: per-sample (or whole-array) shape, dtype, and kind."""

    __slots__ = ("shape", "dtype", "kind", "weak")

    def __init__(self, shape, dtype, kind, weak=False):
        self.shape = tuple(int(d) for d in shape)
        self.dtype = np.dtype(dtype)
        self.kind = kind
        self.weak = bool(weak)

    def replace(self, **kw) -> "AVal":
        d = dict(shape=self.shape, dtype=self.dtype, kind=self.kind, weak=self.weak)
        d.update(kw)
        return AVal(**d)

    def _key(self):
        return (self.shape, self.dtype, self.kind, self.weak)

    def __eq__(self, other):
        return isinstance(other, AVal) and self._key() == other._key()

    def __hash__(self):
        return hash(self._key())

    def __repr__(self):
        return type_str(self)


_SHORT = {"float64": "f64", "float32": "f32", "float16": "f16", "int64": "i64", "int32": "i32",
          "uint32": "u32", "uint64": "u64", "uint8": "u8", "int8": "i8", "bool": "bool",
          "complex128": "c128", "complex64": "c64", "int16": "i16", "uint16": "u16"}


def type_str(aval: AVal) -> str:
    dims = [str(d) for d in aval.shape] + (["n"] if aval.kind == SAMPLE else [])
    return f"{_SHORT.get(aval.dtype.name, aval.dtype.name)}[{','.join(dims)}]" + ("~" if aval.weak else "")


class Var:
    """An SSA value. Identity is the name: two Vars are equal only if they are the same object."""

    __slots__ = ("aval", "hint")

    def __init__(self, aval: AVal, hint: str | None = None):
        self.aval = aval
        self.hint = hint  # the user's name for it, when there is one (shown in errors, not in printing)

    def __repr__(self):
        return f"Var({self.hint or ''}:{type_str(self.aval)})"


class Literal:
    """A constant operand. Python numbers stay Python numbers (weak), so float32 stays float32."""

    __slots__ = ("value", "aval")

    def __init__(self, value, aval: AVal | None = None):
        self.value = value
        self.aval = aval or literal_aval(value)

    def __repr__(self):
        return f"Literal({self.value!r})"


def literal_aval(value) -> AVal:
    if isinstance(value, (bool, np.bool_)):
        return AVal((), np.bool_, UNIFORM, weak=isinstance(value, bool))
    if type(value) in (int, float, complex):          # Python numbers are weak; NumPy scalars are not
        return AVal((), np.asarray(value).dtype, UNIFORM, weak=True)
    arr = np.asarray(value)
    return AVal(arr.shape, arr.dtype, UNIFORM)


Atom = Var | Literal


class EqnInfo:
    """Where an equation came from: the user's name for its result and the source line."""

    __slots__ = ("name", "where", "branch")

    def __init__(self, name: str | None = None, where: str | None = None, branch: tuple = ()):
        self.name, self.where, self.branch = name, where, branch

    def replace(self, **kw) -> "EqnInfo":
        d = dict(name=self.name, where=self.where, branch=self.branch)
        d.update(kw)
        return EqnInfo(**d)


NO_INFO = EqnInfo()


class Eqn:
    __slots__ = ("prim", "inputs", "outputs", "params", "info")

    def __init__(self, prim: "Primitive", inputs, outputs, params: dict | None = None, info: EqnInfo = NO_INFO):
        self.prim = prim
        self.inputs = tuple(inputs)
        self.outputs = tuple(outputs)
        self.params = dict(params or {})
        self.info = info

    def replace(self, **kw) -> "Eqn":
        d = dict(prim=self.prim, inputs=self.inputs, outputs=self.outputs, params=self.params, info=self.info)
        d.update(kw)
        return Eqn(**d)


class Program:
    """A closed, typed, immutable list of equations: the unit every interpreter consumes."""

    __slots__ = ("inputs", "eqns", "outputs", "__weakref__")    # weak: lowering memoises per Program

    def __init__(self, inputs, eqns, outputs):
        self.inputs = tuple(inputs)
        self.eqns = tuple(eqns)
        self.outputs = tuple(outputs)

    def replace(self, **kw) -> "Program":
        d = dict(inputs=self.inputs, eqns=self.eqns, outputs=self.outputs)
        d.update(kw)
        return Program(**d)

    @property
    def in_avals(self):
        return [v.aval for v in self.inputs]

    @property
    def out_avals(self):
        return [v.aval for v in self.outputs]

    def subprograms(self):
        for e in self.eqns:
            for p in e.params.values():
                if isinstance(p, Program):
                    yield p
                elif isinstance(p, tuple):
                    yield from (q for q in p if isinstance(q, Program))

    def __str__(self):
        return pprint(self)

    __repr__ = __str__


class Primitive:
    """One operation. Rules live in per-interpreter tables keyed by the Primitive."""

    def __init__(self, name: str, multiple_results: bool = False):
        self.name = name
        self.multiple_results = multiple_results

    def __repr__(self):
        return self.name

    def bind(self, *args, **params):
        trace = find_trace(args)
        if trace is None:
            outs = eval_eager(self, args, params)
        else:
            outs = trace.process(self, args, params)
        return outs if self.multiple_results else outs[0]


# ---------------------------------------------------------------------------------------------
# Rule tables. Each interpreter owns one; a missing rule names the rule and the primitive.

class RuleTable(dict):
    """prim -> rule. A missing rule's error names the table and the primitive. A primitive an
    interpreter declines on purpose has a refusal (`refuse`): a rule that raises the reason, kept
    in `refused` so a check of the tables tells a refusal from a forgotten rule."""

    def __init__(self, rule: str):
        super().__init__()
        self.rule = rule
        self.refused: set = set()

    def __missing__(self, prim):
        raise NotImplementedError(f"no {self.rule} rule for primitive '{prim}'")

    def register(self, prim):
        def deco(fn):
            self[prim] = fn
            return fn
        return deco

    def refuse(self, *prims):
        """Register `fn` (which raises why) as the rule of each of `prims`: declined on purpose."""
        def deco(fn):
            for prim in prims:
                self[prim] = fn
                self.refused.add(prim)
            return fn
        return deco


abstract_eval = RuleTable("abstract evaluation")   # prim -> fn(*avals, **params) -> list[AVal]
eager_impl = RuleTable("eager NumPy")             # prim -> fn(*values, **params) -> list[values]


def eval_eager(prim, args, params):
    outs = eager_impl[prim](*args, **params)
    if args and all(type(a) in _PY_NUMBER for a in args):
        # Python numbers in: a Python number out where the traced result would be weak (hm.sin(1.0)
        # in a float32 body is what hm.sin(p) of a Python-number Param is, not a float64 scalar)
        avals = abstract_eval[prim](*[literal_aval(a) for a in args], **params)
        outs = [o.item() if av.weak and np.ndim(o) == 0 else o for o, av in zip(outs, avals)]
    return outs


_PY_NUMBER = (bool, int, float, complex)


# ---------------------------------------------------------------------------------------------
# Traces. A Tracer belongs to one trace; binding a primitive on a tracer appends an equation.

class LeakedTracerError(TypeError):
    """A traced value used after its trace finished: it is a placeholder from that trace, not a number."""


class Tracer:
    __slots__ = ("trace", "var")
    __array_priority__ = 1000

    def __init__(self, trace, var: Var):
        self.trace = trace
        self.var = var

    @property
    def aval(self) -> AVal:
        return self.var.aval


def find_trace(args):
    trace = None
    for a in args:
        if isinstance(a, Tracer):
            if trace is None:
                trace = a.trace
            elif a.trace is not trace:
                trace = _innermost(trace, a.trace)
    return trace


def _innermost(t1, t2):
    # Traces hold their parent explicitly; the one nested deeper wins and lifts the other's values.
    p = t1
    while p is not None:
        if p is t2:
            return t1
        p = p.parent
    return t2


class ProgramTrace:
    """Builds a Program by recording every primitive bound on its tracers."""

    tracer_type = Tracer

    def __init__(self, parent=None):
        self.parent = parent
        self.eqns: list[Eqn] = []
        self.inputs: list[Var] = []
        self.active = True

    def new_input(self, aval: AVal, hint=None):
        v = Var(aval, hint)
        self.inputs.append(v)
        return self.tracer_type(self, v)

    def atom(self, x) -> Atom:
        if isinstance(x, Tracer):
            if x.trace is self:
                return x.var
            return self.lift(x)
        return Literal(x)

    def lift(self, x: Tracer) -> Atom:
        raise TypeError(f"a value traced elsewhere ({x.var}) reached this trace; pass it as an argument")

    def info(self) -> EqnInfo:
        return NO_INFO

    def made(self, tracer) -> str:
        """What traced `tracer` and where, for the refusal of a leaked value."""
        return "a trace that has finished"

    def leaked(self, tracer, use: str):
        raise LeakedTracerError(
            f"hawk: {use}, and it is a leaked value: it was traced by {self.made(tracer)}, a trace that has "
            "finished, so it is a placeholder the trace recorded, not a number (it was kept outside the trace: "
            "in a global, a list or a closure). Return it from the kernel and use the returned array instead")

    def process(self, prim, args, params):
        for a in args:
            if isinstance(a, Tracer) and not a.trace.active:
                a.trace.leaked(a, f"`{prim}` was applied to a traced value")
        ins = [self.atom(a) for a in args]
        out_avals = abstract_eval[prim](*[a.aval for a in ins], **params)
        outs = [Var(av) for av in out_avals]
        self.eqns.append(Eqn(prim, ins, outs, params, self.info()))
        return [self.tracer_type(self, v) for v in outs]

    def finish(self, outputs) -> Program:
        self.active = False
        return Program(self.inputs, self.eqns, [self.atom(o) for o in outputs])


# ---------------------------------------------------------------------------------------------
# Evaluation: the ~15-line interpreter every final interpreter specialises.

def eval_program(prog: Program, args, impl: RuleTable = eager_impl):
    env: dict[Var, Any] = {}

    def read(a):
        return a.value if isinstance(a, Literal) else env[a]

    for v, x in zip(prog.inputs, args):
        env[v] = x
    for e in prog.eqns:
        outs = impl[e.prim](*[read(a) for a in e.inputs], **e.params)
        for v, x in zip(e.outputs, outs):
            env[v] = x
    return [read(a) for a in prog.outputs]


def check_program(prog: Program) -> None:
    """Re-run abstract evaluation over `prog` and check every type and that Vars are defined once."""
    defined = set(prog.inputs)
    for e in prog.eqns:
        for a in e.inputs:
            if isinstance(a, Var) and a not in defined:
                raise AssertionError(f"{e.prim}: input {a} used before it is defined")
        want = abstract_eval[e.prim](*[a.aval for a in e.inputs], **e.params)
        got = [v.aval for v in e.outputs]
        if [(w.shape, w.dtype, w.kind) for w in want] != [(g.shape, g.dtype, g.kind) for g in got]:
            raise AssertionError(f"{e.prim}: outputs typed {got}, abstract evaluation gives {want}")
        for v in e.outputs:
            if v in defined:
                raise AssertionError(f"{e.prim}: output {v} defined twice")
            defined.add(v)
    for a in prog.outputs:
        if isinstance(a, Var) and a not in defined:
            raise AssertionError(f"program output {a} is never defined")
    for sub in prog.subprograms():       # closed: each sub-program defines what it uses
        check_program(sub)


# ---------------------------------------------------------------------------------------------
# Printing. Sub-programs indent; primitives may register a hook for their params.

pp_params_rules = RuleTable("printing")     # prim -> fn(params) -> the params shown (none: all of them)


def _names():
    for n in itertools.count():
        s = ""
        n += 1
        while n:
            n, r = divmod(n - 1, 26)
            s = chr(97 + r) + s
        yield s


class _Namer:
    def __init__(self):
        self.names: dict[Var, str] = {}
        self.gen = _names()

    def __call__(self, a) -> str:
        if isinstance(a, Literal):
            v = a.value
            return repr(v.item() if isinstance(v, np.generic) else v) if np.ndim(v) == 0 else f"<const {np.shape(v)}>"
        if a not in self.names:
            self.names[a] = next(self.gen)
        return self.names[a]


def pprint(prog: Program, indent: int = 0, namer: _Namer | None = None) -> str:
    namer = namer or _Namer()
    pad = " " * indent
    ins = " ".join(f"{namer(v)}:{type_str(v.aval)}" for v in prog.inputs)
    lines = [f"{{ lambda {ins} . let"]
    for e in prog.eqns:
        outs = " ".join(f"{namer(v)}:{type_str(v.aval)}" for v in e.outputs) or "_"
        params, subs = _pp_params(e, namer, indent + 4)
        args = " ".join(namer(a) for a in e.inputs)
        head = f"    {outs} = {e.prim.name}{params} {args}".rstrip()
        note = _pp_info(e.info)
        lines.append(f"{head}  # {note}" if note else head)
        lines.extend(subs)
    outs = ", ".join(namer(a) for a in prog.outputs)
    lines.append(f"  in ({outs}) }}")
    return "\n".join(pad + ln if i else ln for i, ln in enumerate(lines))


def _pp_info(info: EqnInfo) -> str:
    """The user's name for a node and the branch it runs on, as a trailing comment."""
    parts = []
    if info.name:
        parts.append(info.name)
    if info.branch:
        parts.append("branch " + ".".join(f"{f}:{b}" for f, b in info.branch))
    return ", ".join(parts)


def _pp_params(e: Eqn, namer, indent):
    if e.prim in pp_params_rules:
        shown = pp_params_rules[e.prim](e.params)
    else:
        shown = {k: v for k, v in e.params.items()}
    flat, subs = [], []
    for k, v in shown.items():
        progs = [v] if isinstance(v, Program) else list(v) if isinstance(v, tuple) and v and all(isinstance(q, Program) for q in v) else None
        if progs:
            for i, p in enumerate(progs):
                label = k if len(progs) == 1 else f"{k}[{i}]"
                subs.append(" " * 6 + f"{label}=" + pprint(p, indent + 6 + len(label) + 1, namer).lstrip())
        else:
            flat.append(f"{k}={_pp_value(v)}")
    return (f"[{' '.join(flat)}]" if flat else ""), [" " * 0 + s for s in subs]


def _pp_value(v):
    if isinstance(v, np.dtype):
        return v.name
    if isinstance(v, type) and issubclass(v, np.generic):
        return np.dtype(v).name
    if callable(v) and hasattr(v, "__name__"):
        return v.__name__
    return repr(v) if not isinstance(v, str) else v
