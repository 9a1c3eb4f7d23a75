"""Reading a user function's source, recompiling a rewritten AST of it, and naming user lines.

Shared by the kernel pass (hawk_fx.trace) and the builder pass (eagle_fx.frontend.autograph). Rewritten code
keeps the user's file name and line numbers, so tracebacks and our messages point at their code.
"""
from __future__ import annotations

import ast
import inspect
import os
import sys
import textwrap
import types


class SourceInfo:
    """Where a function lives: `name:line` counts from the first line of its source (decorator = 1)."""

    __slots__ = ("name", "filename", "first_line")

    def __init__(self, name, filename, first_line):
        self.name, self.filename, self.first_line = name, filename, first_line

    def where(self, lineno: int) -> str:
        return f"{self.name}:{lineno - self.first_line + 1}"

    def where_long(self, lineno: int) -> str:
        return f"{self.where(lineno)} ({os.path.basename(self.filename)}, line {lineno})"


def parse_function(fn, api: str):
    """The function's AST (FunctionDef), with line numbers of its file, and its SourceInfo."""
    try:
        lines, first = inspect.getsourcelines(fn)
        filename = inspect.getsourcefile(fn) or fn.__code__.co_filename
    except (OSError, TypeError):
        raise TypeError(f"{api}: cannot read the source of {getattr(fn, '__qualname__', fn)!r}: "
                        "define it with `def` in a file or a notebook cell (not exec'd text or a lambda)") from None
    src = textwrap.dedent("".join(lines))
    tree = ast.parse(src)
    fdef = tree.body[0]
    if not isinstance(fdef, (ast.FunctionDef, ast.AsyncFunctionDef)):
        raise TypeError(f"{api}: {fn.__qualname__} is not defined with `def`; write it as a function")
    ast.increment_lineno(tree, first - 1)
    return fdef, SourceInfo(fn.__name__, fn.__code__.co_filename or filename, first)


def recompile(fn, fdef: ast.FunctionDef, extra: dict):
    """Compile the rewritten `fdef` as a closure over fn's free variables plus `extra` names. It
    shares fn's own cells, so a name the enclosing function rebinds later (a kernel redefined
    there) is seen, as Python's closures see it."""
    fdef.decorator_list = []
    extra_names = list(extra)
    free = [a for a in fn.__code__.co_freevars if a not in extra]   # a function rewritten inside another
    #                                                               # rewritten one closes over its extras
    factory = ast.FunctionDef(
        name="__factory__",
        args=ast.arguments(posonlyargs=[], args=[ast.arg(arg=a) for a in free + extra_names], vararg=None,
                           kwonlyargs=[], kw_defaults=[], kwarg=None, defaults=[]),
        body=[fdef, ast.Return(value=ast.Name(id=fdef.name, ctx=ast.Load()))],
        decorator_list=[], returns=None, type_params=[])
    mod = ast.Module(body=[factory], type_ignores=[])
    ast.copy_location(factory, fdef)
    ast.fix_missing_locations(mod)
    code = compile(mod, fn.__code__.co_filename, "exec")
    ns: dict = {}
    exec(code, fn.__globals__, ns)
    own = dict(zip(fn.__code__.co_freevars, fn.__closure__ or ()))
    cells = [own[a].cell_contents if _cell_full(own[a]) else None for a in free]
    new = ns["__factory__"](*cells, *[extra[k] for k in extra_names])
    if new.__closure__:
        closure = tuple(own.get(name, c) if name not in extra else c
                        for name, c in zip(new.__code__.co_freevars, new.__closure__))
        qualname = new.__qualname__
        new = types.FunctionType(new.__code__, new.__globals__, new.__name__, None, closure)
        new.__qualname__ = qualname
    new.__defaults__ = fn.__defaults__
    new.__kwdefaults__ = fn.__kwdefaults__
    return new


def _cell_full(c):
    try:
        c.cell_contents
        return True
    except ValueError:
        return False


def user_line(filename: str) -> int | None:
    """The innermost line now running in `filename` (user code), found by walking the stack."""
    f = sys._getframe(1)
    while f is not None:
        if f.f_code.co_filename == filename:
            return f.f_lineno
        f = f.f_back
    return None


def assigned_names(stmts) -> list[str]:
    """Names a block of statements binds, in order, not looking into nested function scopes."""
    out: list[str] = []

    def add(n):
        if n not in out:
            out.append(n)

    class V(ast.NodeVisitor):
        def visit_Name(self, node):
            if isinstance(node.ctx, (ast.Store, ast.Del)):
                add(node.id)

        def visit_FunctionDef(self, node):
            add(node.name)

        visit_AsyncFunctionDef = visit_FunctionDef

        def visit_ClassDef(self, node):
            add(node.name)

        def visit_Lambda(self, node):
            pass

        def visit_alias(self, node):
            add((node.asname or node.name).split(".")[0])

        def visit_ListComp(self, node):
            pass

        visit_SetComp = visit_DictComp = visit_GeneratorExp = visit_ListComp

    for s in stmts:
        V().visit(s)
    return out


def is_function(obj) -> bool:
    return isinstance(obj, types.FunctionType)
