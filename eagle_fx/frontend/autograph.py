"""The builder pass: rewrite a builder's AST so its control flow calls the staging runtime.

One converter per construct, applied bottom-up:
  * `not x` -> rt.not_(x); `a and b` / `a or b` in if/while tests -> rt.and_/or_ (thunks keep
    Python's short-circuit), so a cell stays a device value instead of becoming a Python bool;
  * loops: break/continue are first canonicalised away (a `break` sets a flag `__brk_k` and the
    rest of the body moves into the `else` of the `if` that broke; a leading `if T: break` becomes
    the loop's guard), then `for`/`while` become rt.for_stmt/rt.while_stmt over body functions;
  * `if` -> rt.if_stmt over arm functions; `match` with literal cases -> rt.match_stmt;
  * `name = value` -> name = rt.label(value, 'name'): assigned names label nodes and buffers.
The runtime decides at trace time: a one-cell uint32 array is device control flow, anything else
is Python, decided once. State flows through the functions as the tuple of names the construct
assigns (found here, like AutoGraph's liveness); `locals()` supplies their values on entry.
"""
from __future__ import annotations

import ast
import copy
import itertools

from hawk_fx.source import SourceInfo, assigned_names, parse_function, recompile

from . import staging

_ids = itertools.count()
RT = "__eagle_rt__"


class BuilderSyntaxError(SyntaxError):
    pass


def _rt(attr):
    return ast.Attribute(value=ast.Name(id=RT, ctx=ast.Load()), attr=attr, ctx=ast.Load())


def _call(attr, *args):
    return ast.Call(func=_rt(attr), args=list(args), keywords=[])


def _name(n, store=False):
    return ast.Name(id=n, ctx=ast.Store() if store else ast.Load())


def _func(name, params, body, ret_names):
    args = ast.arguments(posonlyargs=[], args=[ast.arg(arg=p) for p in params], vararg=None,
                         kwonlyargs=[], kw_defaults=[], kwarg=None, defaults=[])
    ret = ast.Return(value=ast.Tuple(elts=[_name(n) for n in ret_names], ctx=ast.Load()))
    return ast.FunctionDef(name=name, args=args, body=(body or [ast.Pass()]) + [ret], decorator_list=[],
                           returns=None, type_params=[])


def _state_names(stmts):
    return [n for n in assigned_names(stmts) if not n.startswith("__eagle_fn")]


def _load_state(names):
    return _call("load", ast.Call(func=_name("locals"), args=[], keywords=[]), ast.Constant(value=tuple(names)))


def _assign_tuple(names, value):
    return ast.Assign(targets=[ast.Tuple(elts=[_name(n, True) for n in names], ctx=ast.Store())], value=value)


def _loop_jumps(node) -> bool:
    """Does `node` hold a break/continue of the loop it sits in (not of a nested loop)?"""
    if isinstance(node, (ast.Break, ast.Continue)):
        return True
    if isinstance(node, (ast.For, ast.While, ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
        return False
    return any(_loop_jumps(c) for c in ast.iter_child_nodes(node))


def _has_return(stmts) -> bool:
    todo = list(stmts)
    while todo:
        n = todo.pop()
        if isinstance(n, ast.Return):
            return True
        if not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            todo.extend(ast.iter_child_nodes(n))
    return False


class _Pass(ast.NodeTransformer):
    def __init__(self, info: SourceInfo):
        self.info = info

    def fail(self, node, what):
        raise BuilderSyntaxError(f"eagle.Graph.builder {self.info.where_long(node.lineno)}: {what}")

    # -- expressions -------------------------------------------------------------------------
    def visit_UnaryOp(self, node):
        if isinstance(node.op, ast.Not):
            # `not (a or b)`: the operand is a test too, so its and/or stay on the device
            return ast.copy_location(_call("not_", self._test(node.operand)), node)
        self.generic_visit(node)
        return node

    def _test(self, test):
        if isinstance(test, ast.BoolOp):
            fn = "and_" if isinstance(test.op, ast.And) else "or_"
            thunks = [ast.Lambda(args=ast.arguments(posonlyargs=[], args=[], vararg=None, kwonlyargs=[],
                                                    kw_defaults=[], kwarg=None, defaults=[]), body=self._test(v))
                      for v in test.values]
            return ast.copy_location(_call(fn, *thunks), test)
        return self.visit(test)

    # -- statements --------------------------------------------------------------------------
    def visit_Assign(self, node):
        self.generic_visit(node)
        if len(node.targets) == 1:
            t = node.targets[0]
            if isinstance(t, ast.Name):
                node.value = _call("label", node.value, ast.Constant(value=t.id))
            elif isinstance(t, ast.Tuple) and all(isinstance(e, ast.Name) for e in t.elts):
                node.value = _call("label_all", node.value, ast.Constant(value=tuple(e.id for e in t.elts)))
        return node

    def visit_If(self, node):
        returns = _has_return(node.body + node.orelse)
        test = self._test(node.test)
        node.body = self._block(node.body)
        node.orelse = self._block(node.orelse)
        if returns:
            node.test = _call("python_test", test, ast.Constant(value=node.lineno))
            return node
        names = _state_names(node.body + node.orelse)
        k = next(_ids)
        t, f = f"__eagle_fn_true_{k}", f"__eagle_fn_false_{k}"
        call = _call("if_stmt", test, _name(t), _name(f), _load_state(names), ast.Constant(value=tuple(names)),
                     ast.Constant(value=node.lineno))
        out = [_func(t, names, node.body, names), _func(f, names, node.orelse, names), _assign_tuple(names, call)]
        return [ast.copy_location(s, node) for s in out]

    def visit_Match(self, node):
        subject = self.visit(node.subject)
        values, default = [], None
        arms = []
        for case in node.cases:
            p = case.pattern
            if case.guard is not None:
                self.fail(case.pattern, "a `case` guard (`if ...`) in a builder match; test it inside the arm")
            if isinstance(p, ast.MatchAs) and p.pattern is None and p.name is None:
                default = case
            elif isinstance(p, ast.MatchValue) and isinstance(p.value, ast.Constant) and isinstance(p.value.value, int):
                values.append(p.value.value)
                arms.append(case)
            elif isinstance(p, ast.MatchValue) and isinstance(p.value, ast.UnaryOp) and isinstance(p.value.operand, ast.Constant):
                self.fail(p, "a negative case value; a device match compares a uint32 cell with literals >= 0")
            else:
                self.fail(p, "a `case` pattern other than an integer literal or `_`; a builder match picks an arm "
                             "by a cell's value: write `case 0:`, `case 2:`, `case _:`")
        bodies = [self._block(c.body) for c in arms] + ([self._block(default.body)] if default else [])
        names = _state_names([s for b in bodies for s in b])
        k = next(_ids)
        out, fn_names = [], []
        for j, body in enumerate(bodies):
            fname = f"__eagle_fn_case_{k}_{j}"
            fn_names.append(fname)
            out.append(_func(fname, names, body, names))
        fn_tuple = ast.Tuple(elts=[_name(f) for f in fn_names[:len(arms)]], ctx=ast.Load())
        default_fn = _name(fn_names[-1]) if default else ast.Constant(value=None)
        call = _call("match_stmt", subject, ast.Constant(value=tuple(values)), fn_tuple, default_fn,
                     _load_state(names), ast.Constant(value=tuple(names)), ast.Constant(value=node.lineno))
        out.append(_assign_tuple(names, call))
        return [ast.copy_location(s, node) for s in out]

    def _block(self, stmts):
        out = []
        for s in stmts:
            r = self.visit(s)
            out.extend(r if isinstance(r, list) else [r])
        return out

    # -- loops -------------------------------------------------------------------------------
    def _canon(self, stmts, brk):
        """Remove this loop's break/continue: a break sets `brk`; the statements after a jump move
        into the arm that did not jump."""
        out = []
        for i, s in enumerate(stmts):
            if not _loop_jumps(s):
                out.append(s)
                continue
            rest = stmts[i + 1:]
            if isinstance(s, ast.Break):
                out.append(ast.copy_location(ast.Assign(targets=[_name(brk, True)], value=ast.Constant(True)), s))
                return out
            if isinstance(s, ast.Continue):
                return out
            if isinstance(s, ast.If):
                body = self._canon(s.body + rest, brk)
                orelse = self._canon(s.orelse + copy.deepcopy(rest), brk)
                out.append(ast.copy_location(ast.If(test=s.test, body=body or [ast.Pass()], orelse=orelse), s))
                return out
            self.fail(s, f"break/continue inside a `{type(s).__name__.lower()}` block of a loop; "
                         "move it directly under the loop or under an `if`")
        return out

    def _loop(self, node, kind):
        if node.orelse:
            self.fail(node, f"`{kind}`/`else` in a builder; move the else block after the loop")
        k = next(_ids)
        brk = f"__brk_{k}"
        body = list(node.body)
        guard = None
        first = body[0] if body else None
        if (isinstance(first, ast.If) and not first.orelse and len(first.body) == 1
                and isinstance(first.body[0], ast.Break)):
            t = first.test                                     # `if T: break` first: the loop's guard
            guard = (t.operand if isinstance(t, ast.UnaryOp) and isinstance(t.op, ast.Not)
                     else ast.UnaryOp(op=ast.Not(), operand=t))   # a test: its and/or stay on the device
            body = body[1:]
        uses_brk = any(_loop_jumps(s) and any(isinstance(n, ast.Break) for n in ast.walk(s)) for s in body)
        body = self._canon(body, brk)
        pre = []
        if uses_brk:
            pre.append(ast.copy_location(ast.Assign(targets=[_name(brk, True)], value=ast.Constant(False)), node))
        conds = []
        if kind == "while":
            conds.append(node.test)
        if guard is not None:
            conds.append(guard)
        if uses_brk:
            conds.append(ast.UnaryOp(op=ast.Not(), operand=_name(brk)))
        test = (conds[0] if len(conds) == 1 else ast.BoolOp(op=ast.And(), values=conds)) if conds else ast.Constant(True)
        test = self._test(ast.copy_location(test, node))
        body = self._block(body)
        target_param = f"__eagle_target_{k}"
        if kind == "for":
            body = [ast.copy_location(ast.Assign(targets=[node.target], value=_name(target_param)), node)] + body
        names = _state_names(body + pre)
        cname, bname = f"__eagle_fn_cond_{k}", f"__eagle_fn_body_{k}"
        cond_fn = ast.FunctionDef(
            name=cname, args=ast.arguments(posonlyargs=[], args=[ast.arg(arg=n) for n in names], vararg=None,
                                           kwonlyargs=[], kw_defaults=[], kwarg=None, defaults=[]),
            body=[ast.Return(value=test)], decorator_list=[], returns=None, type_params=[])
        body_fn = _func(bname, ([target_param] if kind == "for" else []) + names, body, names)
        if kind == "for":
            it = node.iter
            if isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and it.func.id == "range":
                it = ast.copy_location(ast.Call(func=_rt("range_"), args=it.args, keywords=it.keywords), it)
            it = self.visit(it)
            call = _call("for_stmt", it, _name(cname), _name(bname), _load_state(names),
                         ast.Constant(value=tuple(names)), ast.Constant(value=node.lineno))
        else:
            call = _call("while_stmt", _name(cname), _name(bname), _load_state(names),
                         ast.Constant(value=tuple(names)), ast.Constant(value=node.lineno))
        out = pre + [cond_fn, body_fn, _assign_tuple(names, call)]
        return [ast.copy_location(s, node) for s in out]

    def visit_For(self, node):
        return self._loop(node, "for")

    def visit_While(self, node):
        return self._loop(node, "while")

    def visit_FunctionDef(self, node):
        node.body = self._block(node.body)
        return node

    def visit_Try(self, node):
        self.generic_visit(node)
        return node


def convert_builder(fn, runtime_type=None):
    """The rewritten builder or block, and where it lives (for messages). Its control flow calls a
    staging.Runtime, or `runtime_type` (the eager runtime of disable_staging)."""
    fdef, info = parse_function(fn, "eagle.Graph.builder")
    for a in fdef.args.posonlyargs + fdef.args.args + fdef.args.kwonlyargs:
        a.annotation = None
    fdef.returns = None
    p = _Pass(info)
    fdef.body = p._block(fdef.body)
    runtime = (runtime_type or staging.Runtime)(info)
    return recompile(fn, fdef, {RT: runtime}), info
