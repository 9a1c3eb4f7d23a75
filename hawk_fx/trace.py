"""The kernel pass: rewrite a one-sample function's AST, then trace it into a Program.

Three rewrites, each small:
  * a `for` whose body breaks or continues becomes a body function and a call of
    `hawk_fx.loops.for_stmt` (a loop that stops per sample; see that module), first;
  * every `if` whose arms hold no break/continue/return becomes a call `if_stmt(test, true_fn,
    false_fn, state)`; a per-sample test runs both arms and selects, a Python test runs one arm;
  * the function returns `(result, (final values of Mutable parameters))`, so an assignment to a
    Mutable parameter is a commit to its plane.
Everything else is plain Python run on tracers: a static `for` unrolls, helper functions inline.
"""
from __future__ import annotations

import ast
import itertools
import linecache
import sys

import numpy as np

from . import prims
from .core import NO_INFO, SAMPLE, UNIFORM, AVal, EqnInfo, ProgramTrace, Tracer, literal_aval
from .context import CONTEXT
from .math import matmul
from .tables import gather_p
from .source import SourceInfo, assigned_names, parse_function, recompile, user_line

P = prims.P


class TraceError(TypeError):
    """A construct a kernel body cannot contain, named with the user's function and line."""


def where_with_text(info: SourceInfo, line: int) -> str:
    """`name:line (file, line N) `code``: the user's line, quoted so the message shows what failed."""
    text = linecache.getline(info.filename, line).strip()
    return info.where_long(line) + (f" `{text}`" if text else "")


class _Undefined:
    def __repr__(self):
        return "<undefined>"


UNDEF = _Undefined()

def current_kernel_trace():
    traces = CONTEXT.kernel_traces
    return traces[-1] if traces else None


class KernelTrace(ProgramTrace):
    def __init__(self, kernel_name: str, source: SourceInfo):
        super().__init__()
        self.kernel_name = kernel_name
        self.source = source

    def where(self) -> str:
        line = user_line(self.source.filename)
        return f"{self.kernel_name}" if line is None else where_with_text(self.source, line)

    def fail(self, what: str, fix: str):
        raise TraceError(f"hawk.kernel {self.where()}: {what}; {fix}")

    def info(self) -> EqnInfo:
        """Each equation remembers the user's line, for errors found after the body has run."""
        line = user_line(self.source.filename)
        return NO_INFO if line is None else EqnInfo(where=where_with_text(self.source, line))

    def made(self, tracer) -> str:
        var = tracer.var
        if var in self.inputs:
            return f"hawk.kernel {self.kernel_name} (its parameter {var.hint!r})"
        return f"hawk.kernel {self.where_made(tracer)}"

    def process(self, prim, args, params):
        if prim is prims.P["pow"]:
            _check_int_power(*args)
        return super().process(prim, args, params)

    def where_made(self, value) -> str:
        """Where the body computed `value` (a tracer), else just the kernel's name."""
        var = getattr(value, "var", None)
        for e in self.eqns:
            if var in e.outputs and e.info.where:
                return e.info.where
        return self.kernel_name


def _check_int_power(base, exponent):
    """NumPy refuses integers to negative integer powers when the body runs; say so at trace time,
    where the user's line is known (a Python-int Param `p ** -1`)."""
    b_kind = (base.aval.dtype if isinstance(base, Tracer) else np.asarray(base).dtype).kind
    if (b_kind in "iu" and isinstance(exponent, (int, np.integer)) and not isinstance(exponent, bool)
            and exponent < 0):
        raise ValueError(f"hawk.math.pow: an integer raised to the negative integer power {exponent}; NumPy refuses "
                         f"integers to negative integer powers. Make one operand a float: `** {float(exponent)}`, "
                         "or pass a float Param")


class KTracer(Tracer):
    """A per-sample (or uniform) value inside a kernel body."""

    __slots__ = ()

    def _fail(self, what, fix):
        t = self.trace
        if not t.active:
            t.leaked(self, what)
        if isinstance(t, KernelTrace) and t.active:
            t.fail(what, fix)
        raise TraceError(f"hawk: {what}; {fix}")

    # Python protocols that would need a concrete value
    def __bool__(self):
        self._fail("a traced value is used as a Python bool (a `while`, `and`/`or`, `assert`, or an `if` "
                   "around break/continue)", "use a per-sample `if` that assigns values, or hm.where(cond, a, b)")

    def __float__(self):
        self._fail("a traced value is converted with float() (directly, or by a math-module function such "
                   "as math.sin)", "use hm.float64(x) to cast, or the hawk.math function of the same name (hm.sin)")

    def __int__(self):
        self._fail("a traced value is converted with int()", "use hm.int32(x) or hm.uint32(x)")

    __index__ = __int__

    def __array__(self, *a, **k):
        self._fail("a traced value reached NumPy (np.asarray or a NumPy function)",
                   "call the hawk.math function of the same name, e.g. hm.sin(x)")

    def __array_ufunc__(self, ufunc, method, *inputs, **kw):
        name = _OPERATOR_UFUNCS.get(ufunc)
        if name is not None and method == "__call__" and not kw and len(inputs) == 2:
            # an array on the left of an operator (`W * v`, `R @ v`): NumPy hands the operator to us
            return matmul(*inputs) if name == "matmul" else P[name].bind(*inputs)
        self._fail(f"np.{ufunc.__name__} was called on a traced value",
                   f"use hawk.math ({'hm.' + ufunc.__name__}) inside a kernel")

    def __array_function__(self, func, types, args, kwargs):
        self._fail(f"np.{func.__name__} was called on a traced value",
                   "use the hawk.math function of the same name inside a kernel")

    def __iter__(self):
        if not self.aval.shape:
            self._fail("iterating over a per-sample scalar", "only Vector/Matrix values can be iterated")
        return iter([self[i] for i in range(self.aval.shape[0])])

    def __len__(self):
        if not self.aval.shape:
            self._fail("len() of a per-sample scalar", "only Vector/Matrix values have a length")
        return self.aval.shape[0]

    def __repr__(self):
        return f"<traced {self.var.hint or 'value'}: {self.aval}>"

    @property
    def shape(self):
        return self.aval.shape

    @property
    def dtype(self):
        return self.aval.dtype

    @property
    def T(self):
        return P["transpose"].bind(self)

    def __getitem__(self, i):
        if isinstance(i, tuple):
            out = self
            for j in i:
                out = out[j]
            return out
        if isinstance(i, Tracer):         # a runtime index: clamped, as x[i] on a jax.Array
            return gather_p.bind(self, i, mode="index", fill=None)
        if not isinstance(i, (int, np.integer)):
            self._fail(f"index {i!r} is not a Python int or a traced integer",
                       "index Vector/Matrix/Table values with constants or integers computed in the kernel")
        return P["index"].bind(self, i=int(i))

    __hash__ = object.__hash__


def _binop(name, swap=False):
    p = P[name]
    if swap:
        return lambda self, other: p.bind(other, self)
    return lambda self, other: p.bind(self, other)


for _dunder, _name in [("add", "add"), ("sub", "sub"), ("mul", "mul"), ("truediv", "div"), ("floordiv", "floordiv"),
                       ("mod", "mod"), ("pow", "pow")]:
    setattr(KTracer, f"__{_dunder}__", _binop(_name))
    setattr(KTracer, f"__r{_dunder}__", _binop(_name, swap=True))
for _dunder, _name in [("lt", "lt"), ("le", "le"), ("gt", "gt"), ("ge", "ge"), ("eq", "eq"), ("ne", "ne")]:
    setattr(KTracer, f"__{_dunder}__", _binop(_name))


def _logic(symbol, name, swap=False):
    """&, |, ^ of bools: logical and, or, xor (ne), as NumPy's bitwise ufuncs are on bools. On
    integers NumPy's are bitwise, which kernels have no primitive for: refused, not made logical."""
    p = P[name]

    def op(self, other):
        bad = next((as_aval(v).dtype for v in (self, other) if as_aval(v).dtype != np.bool_), None)
        if bad is not None:
            self._fail(f"`{symbol}` with a {bad.name} operand (NumPy's `{symbol}` on numbers is bitwise; kernels "
                       "have no bit operations yet)", f"for a logical one compare first, `(a > 0) {symbol} (b > 0)`, "
                       "or call hm.logical_and / hm.logical_or")
        return p.bind(other, self) if swap else p.bind(self, other)
    return op


def _invert(x):
    if x.aval.dtype != np.bool_:
        x._fail(f"`~` of a {x.aval.dtype.name} value (NumPy's `~` on integers is bitwise; kernels have no bit "
                "operations yet)", "for a logical not compare first, `~(x > 0)`, or call hm.logical_not")
    return P["not"].bind(x)


for _dunder, _symbol, _name in [("and", "&", "and"), ("or", "|", "or"), ("xor", "^", "ne")]:
    setattr(KTracer, f"__{_dunder}__", _logic(_symbol, _name))
    setattr(KTracer, f"__r{_dunder}__", _logic(_symbol, _name, swap=True))
KTracer.__neg__ = lambda self: P["neg"].bind(self)
KTracer.__pos__ = lambda self: self
KTracer.__abs__ = lambda self: P["abs"].bind(self)
KTracer.__invert__ = lambda self: _invert(self)
KTracer.__matmul__ = lambda self, other: matmul(self, other)
KTracer.__rmatmul__ = lambda self, other: matmul(other, self)
KernelTrace.tracer_type = KTracer


# NumPy ufuncs behind Python's binary operators, and the primitive each operator binds on a tracer
_OPERATOR_UFUNCS = {np.add: "add", np.subtract: "sub", np.multiply: "mul", np.true_divide: "div",
                    np.floor_divide: "floordiv", np.remainder: "mod", np.power: "pow", np.matmul: "matmul",
                    np.less: "lt", np.less_equal: "le", np.greater: "gt", np.greater_equal: "ge",
                    np.equal: "eq", np.not_equal: "ne", np.bitwise_and: "and", np.bitwise_or: "or"}


# ---------------------------------------------------------------------------------------------
# runtime called by rewritten kernel code

def load(scope: dict, names):
    return tuple(scope.get(n, UNDEF) for n in names)


def if_stmt(test, true_fn, false_fn, state, names):
    if not isinstance(test, Tracer):
        return true_fn(*state) if test else false_fn(*state)
    trace = test.trace
    if test.aval.dtype != np.bool_:
        test = P["ne"].bind(test, 0)
    t_out, f_out = true_fn(*state), false_fn(*state)
    merged = []
    for name, a, b in zip(names, t_out, f_out):
        if a is b:
            merged.append(a)
        elif callable(a) or callable(b):
            merged.append(UNDEF)   # helper functions defined in an arm (one or both) do not leave it
        elif a is UNDEF or b is UNDEF:
            if name.startswith("__hawk"):
                merged.append(UNDEF)
                continue
            trace.fail(f"{name!r} is assigned in only one arm of a per-sample if",
                       f"assign {name} before the if, so both arms define it")
        else:
            merged.append(P["select"].bind(test, a, b))
    return tuple(merged)


# ---------------------------------------------------------------------------------------------
# the AST pass

_counter = itertools.count()


def _has_jump(stmts) -> bool:
    """A break/continue that would leave the if's arms, or any return: such an if stays Python."""
    def go(node, in_loop):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            return False
        if isinstance(node, ast.Return):
            return True
        if isinstance(node, (ast.Break, ast.Continue)):
            return not in_loop
        if isinstance(node, (ast.For, ast.While)):
            return any(go(c, True) for c in node.body) or any(go(c, in_loop) for c in node.orelse)
        return any(go(c, in_loop) for c in ast.iter_child_nodes(node))
    return any(go(s, False) for s in stmts)


class _IfToCall(ast.NodeTransformer):
    def visit_FunctionDef(self, node):
        self.generic_visit(node)
        return node

    def visit_If(self, node):
        self.generic_visit(node)
        if _has_jump(node.body) or _has_jump(node.orelse):
            return node
        names = [n for n in assigned_names(node.body + node.orelse)]
        k = next(_counter)
        tname, fname = f"__hawk_if_true_{k}", f"__hawk_if_false_{k}"
        ret = ast.Return(value=ast.Tuple(elts=[ast.Name(id=n, ctx=ast.Load()) for n in names], ctx=ast.Load()))

        def arm(name, body):
            args = ast.arguments(posonlyargs=[], args=[ast.arg(arg=n) for n in names], vararg=None,
                                 kwonlyargs=[], kw_defaults=[], kwarg=None, defaults=[])
            return ast.FunctionDef(name=name, args=args, body=(body or [ast.Pass()]) + [ret],
                                   decorator_list=[], returns=None, type_params=[])

        rt = ast.Name(id="__hawk_rt__", ctx=ast.Load())
        # the guard of the statements after a loop's break/continue (hawk_fx.loops) merges its own way
        guard = getattr(node, "_hawk_guard", False)
        call = ast.Call(
            func=ast.Attribute(value=ast.Name(id="__hawk_loops__", ctx=ast.Load()) if guard else rt,
                               attr="guard_stmt" if guard else "if_stmt", ctx=ast.Load()),
            args=[node.test, ast.Name(id=tname, ctx=ast.Load()), ast.Name(id=fname, ctx=ast.Load()),
                  ast.Call(func=ast.Attribute(value=rt, attr="load", ctx=ast.Load()),
                           args=[ast.Call(func=ast.Name(id="locals", ctx=ast.Load()), args=[], keywords=[]),
                                 ast.Constant(value=tuple(names))], keywords=[]),
                  ast.Constant(value=tuple(names))],
            keywords=[])
        target = ast.Tuple(elts=[ast.Name(id=n, ctx=ast.Store()) for n in names], ctx=ast.Store())
        assign = ast.Assign(targets=[target], value=call)
        out = [arm(tname, node.body), arm(fname, node.orelse), assign]
        for s in out:
            ast.copy_location(s, node)
        _pin_to_line(assign, node, keep=node.test)
        return out


def _pin_to_line(tree, where, keep):
    """Place generated nodes on the `if` line, end included: Python reports a method call at its
    attribute's end line, which copy_location would set to the last line of the whole if/else."""
    todo = [tree]
    while todo:
        n = todo.pop()
        if n is keep:
            continue
        if "lineno" in n._attributes:
            n.lineno = n.end_lineno = where.lineno
            n.col_offset = n.end_col_offset = where.col_offset
        todo.extend(ast.iter_child_nodes(n))


def convert_kernel(fn, mutable_names, api="hawk.kernel"):
    """The rewritten function: same parameters, returns (result, (final Mutable values))."""
    fdef, info = parse_function(fn, api)
    for a in fdef.args.posonlyargs + fdef.args.args + fdef.args.kwonlyargs:
        a.annotation = None
    fdef.returns = None
    body = fdef.body
    for i, stmt in enumerate(body):
        for node in ast.walk(stmt):
            if isinstance(node, (ast.Yield, ast.YieldFrom, ast.Await)):
                raise TraceError(f"{api} {where_with_text(info, node.lineno)}: a kernel body cannot yield or await; "
                                 "return one value (or a tree) at the end")
        early = [n for n in _walk_no_defs(stmt) if isinstance(n, ast.Return)]
        if early and not (i == len(body) - 1 and isinstance(stmt, ast.Return)):
            line = early[0].lineno
            raise TraceError(f"{api} {where_with_text(info, line)}: an early `return` in a kernel body: a kernel "
                             "returns once, at its end; assign the value to a name (a per-sample if selects) "
                             "and `return` it on the last line")
    muts = ast.Tuple(elts=[ast.Name(id=m, ctx=ast.Load()) for m in mutable_names], ctx=ast.Load())
    if body and isinstance(body[-1], ast.Return):
        last = body[-1]
        last.value = ast.Tuple(elts=[last.value or ast.Constant(value=None), muts], ctx=ast.Load())
    else:
        body.append(ast.Return(value=ast.Tuple(elts=[ast.Constant(value=None), muts], ctx=ast.Load())))
        ast.copy_location(body[-1], body[-2] if len(body) > 1 else fdef)
    from . import loops         # a `for` that breaks per sample: a loop body function (hawk_fx/loops.py)
    fdef = loops.LoopToCall(info, api).visit(fdef)
    body = fdef.body
    fdef.body = [_IfToCall().visit(s) for s in body]
    fdef.body = [s for x in fdef.body for s in (x if isinstance(x, list) else [x])]
    new = recompile(fn, fdef, {"__hawk_rt__": sys.modules[__name__], "__hawk_loops__": loops})
    return new, info


def _walk_no_defs(node):
    todo = [node]
    while todo:
        n = todo.pop()
        yield n
        for c in ast.iter_child_nodes(n):
            if not isinstance(c, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
                todo.append(c)


def trace_body(converted, kernel_name, info: SourceInfo, in_avals, param_names):
    """Run the converted function on tracers; returns (trace, result, final Mutable values)."""
    trace = KernelTrace(kernel_name, info)
    args = [trace.new_input(av, hint=nm) for av, nm in zip(in_avals, param_names)]
    traces = CONTEXT.kernel_traces
    traces.append(trace)
    try:
        result, muts = converted(*args)
    except (TypeError, ValueError, IndexError) as exc:
        trace.active = False        # a failed trace is finished too: values it made and leaked are refused
        located = _locate(exc, info, kernel_name)
        if located is None:
            raise
        raise located from exc
    except BaseException:
        trace.active = False
        raise
    finally:
        traces.pop()
    return trace, args, result, muts


def _locate(exc, info: SourceInfo, kernel_name):
    """The same error, its message prefixed with the user's line that raised it (a shape that
    does not broadcast, a bad einsum spec...); None when it already names the kernel."""
    msg = str(exc)
    if msg.startswith("hawk.kernel") or isinstance(exc, TraceError):
        return None
    line, tb = None, exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == info.filename:
            line = tb.tb_lineno
        tb = tb.tb_next
    where = kernel_name if line is None else where_with_text(info, line)
    try:
        return type(exc)(f"hawk.kernel {where}: {msg}")
    except Exception:
        return None


def kind_of(x) -> str:
    return x.aval.kind if isinstance(x, Tracer) else UNIFORM


def as_aval(x) -> AVal:
    if isinstance(x, Tracer):
        return x.aval
    return literal_aval(x)


__all__ = ["TraceError", "KTracer", "KernelTrace", "convert_kernel", "trace_body", "SAMPLE", "UNIFORM"]
