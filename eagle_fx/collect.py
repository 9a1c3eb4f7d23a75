"""eagle_fx.collect: a value computed in a device loop, kept for every turn.

`ys = eagle_fx.collect(y)` in the body of a builder's device loop stages a buffer of `rows` rows
before the loop, zeros, and writes `y` into row `turn` at every turn (ir.row_set, in place): the
buffer is a loop carry that the body only writes. After the loop `ys` holds the stack
`(rows, *y.shape)`, the turn axis first and the sample axis last, as `jax.lax.scan` stacks its
outputs. A capped loop has `rows` = its cap; a counted or uncapped loop needs `rows=` (its turns
are known only at replay, and a plane's shape is fixed at build). Rows past the turns run stay
zeros (as a `jnp.zeros` buffer written with `.at[i].set` in a `lax.while_loop`); turns past the
rows are not recorded.
"""
from __future__ import annotations

import numpy as np

from hawk_fx.context import CONTEXT
from hawk_fx.core import Eqn, Var

from . import ir
from .backends import rows as _backend_rules  # noqa: F401  (the rules of row_set / row_get)
from .frontend import eager, staging
from .transforms import rows as _transform_rules  # noqa: F401

API = "eagle_fx.collect"


def collect(y, *, rows=None):
    """The stack of `y` over the turns of the device loop this is called in: after the loop, a
    plane `(rows, *y.shape)` whose row t is `y` at turn t, zeros past the turns run.

    `rows`: the rows kept; a capped loop (`for _ in range(N): if not cell: break`) defaults to N,
    a counted (`for i in range(cell)`) or uncapped (`while cell`) loop needs it. Call it in the
    loop's body (not under a device `if`) and assign the result to a name first bound there: the
    name then holds the stack after the loop. Differentiable in both modes; under vmap each
    instance has its rows."""
    trace = staging.active_trace()
    if trace is None and eager.staging_disabled():
        return _collect_eagerly(y, rows)
    if trace is None:
        raise TypeError(f"{API}: called outside a builder; call it in the body of a device loop of an "
                        "eagle_fx.Graph.builder (or of a function a transform stages)")
    scope = trace.scope
    where = trace.info().where
    at = f" at {where}" if where else ""
    s = scope
    while s is not None and getattr(s, "loop_mark", None) is None and getattr(s, "trial_loop", None) is None:
        s = s.parent
    if s is not None and getattr(s, "trial_loop", None) is not None:
        s.collected = True      # a first turn tried to tell a device loop from a Python one: discarded
        return y
    if s is None:
        raise TypeError(f"{API}{at}: not inside a device loop; call it in the body of a device loop "
                        "(for _ in range(N): if not cell: break, for i in range(cell), while cell)")
    if s is not scope:
        raise TypeError(f"{API}{at}: called under a device if/match inside the loop; call it in the loop's body "
                        "itself (collect a value chosen by the if: y = where(cond, a, b), then collect(y))")
    mark = s.loop_mark
    rows = _rows(rows, mark.cap, mark.counted, at)
    key = trace.key_of(y, API, "the collected value")
    if key is None:
        raise TypeError(f"{API}{at}: collects {type(y).__name__} {y!r:.60}; give a plane (an array the builder "
                        "staged, a kernel's result)")
    value = scope.read(key)
    aval = ir.plane_aval((int(rows),) + tuple(value.aval.shape), value.aval.dtype)
    k = mark.n_used
    mark.n_used += 1
    if k < len(mark.buffers):          # a later pass over the body: the buffer made on the first
        buf = mark.buffers[k]
        if buf.aval != aval:
            raise TypeError(f"{API}{at}: the collected value changed type between passes over the loop body "
                            f"({buf.aval} and {aval}); collect values of one shape and dtype")
    else:                              # zeros before the loop, made anew at every replay
        info = trace.info()
        var = Var(aval)
        scope.parent.eqns.append(Eqn(ir.zeros_p, [], [var], {"aval": aval}, info))
        buf = trace.new_plane(aval, info, var)
        buf.label = "collect"
        scope.parent.define(buf.key, var)
        mark.buffers.append(buf)
    info = trace.info()
    new = Var(aval)
    scope.eqns.append(Eqn(ir.row_set_p, [scope.read(buf.key), scope.read(mark.turn), value], [new],
                          {"lead": 0, "inplace": ((0, 0),)}, info))
    scope.write(buf.key, new)
    trace.add_access(info, [(key, "value")], [(buf.key, "collect")], "collect")
    return buf


def _rows(rows, cap, counted, at) -> int:
    if rows is None:
        if cap is None:
            kind = "counted" if counted else "uncapped"
            raise ValueError(f"{API}{at}: a {kind} device loop has no bound on its turns at build, and the stack's "
                             "shape is fixed at build; give rows=R (the turns kept: rows past the turns run stay "
                             "zeros, turns past R are not kept), or cap the loop: for _ in range(N)")
        rows = cap
    if not isinstance(rows, (int, np.integer)) or isinstance(rows, bool) or rows < 1:
        raise ValueError(f"{API}{at}: rows={rows!r}; give the number of turns to keep, an int >= 1")
    return int(rows)


def _collect_eagerly(y, rows):
    """The same under eagle_fx.disable_staging: a NumPy buffer per call in the body, row `turn` set."""
    run = CONTEXT.innermost("eager_runs")
    loop = run.loops[-1] if run is not None and run.loops else None
    if loop is None:
        raise TypeError(f"{API}: not inside a device loop; call it in the body of a device loop "
                        "(for _ in range(N): if not cell: break, for i in range(cell), while cell)")
    if not loop.device:
        raise TypeError(f"{API}: in a Python loop (its guard is no cell: it is unrolled at build); collect the values "
                        "in a list and np.stack it, or make it a device loop: for _ in range(N): if not cell: break")
    rows = _rows(rows, loop.cap, loop.counted, "")
    value = np.asarray(y)
    k = loop.n_used
    loop.n_used += 1
    if k == len(loop.buffers):
        loop.buffers.append(np.zeros((rows,) + value.shape, value.dtype))
    buf = loop.buffers[k]
    if loop.turn < rows:
        buf[loop.turn] = value
    return buf


__all__ = ["collect"]
