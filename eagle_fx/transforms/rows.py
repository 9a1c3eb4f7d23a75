"""The transform rules of a loop's per-turn rows (ir.row_set / ir.row_get, eagle_fx.collect).

Both are linear in their planes, the turn a cell:
  jvp        the same op on the tangents (a missing tangent is zeros);
  transpose  row_set -> the cotangent with the row zeroed (buffer) and the row read back (value);
             row_get -> the cotangent written into a zero buffer at the row;
  batching   the batch axis is axis 0, before the row axis (`lead` + 1); an unbatched operand
             meeting a batched one is broadcast; a turn per instance is refused (a batched
             loop's turns are shared).
The transpose of row_set never reads the buffer, so the reverse of a loop keeps no stack of a
collect buffer's turns: the stored reverse's pruning (program.dce) drops that stack unread.
"""
from __future__ import annotations

from hawk_fx.core import Var

from .. import ir
from .jvp_graph import _linear, jvp_rules
from .program import copy_rules, ct_aval, is_float
from .vjp_graph import _accumulate, _read, vjp_rules
from .vmap import VmapError, _Batcher, batch_rules


def _set(eqns, buf, turn, value, lead):
    return eqns.bind(ir.row_set_p, [buf, turn, value], {"lead": lead, "inplace": ((0, 0),)})[0]


def _get(eqns, buf, turn, lead):
    return eqns.bind(ir.row_get_p, [buf, turn], {"lead": lead})[0]


@copy_rules.register(ir.row_set_p)
def _copy_row_set(e, inputs, params):
    """A row written in place in a functional copy too: a buffer copied every turn would make a
    loop of T turns cost T times the buffer (each buffer is read by its row_set only)."""
    params["inplace"] = ((0, 0),)
    return inputs


@jvp_rules.register(ir.row_set_p)
@_linear
def _row_set_tangent(e, env, tan, eqns):
    buf, turn, value = e.inputs
    tb = tan.get(buf)
    tv = tan.get(value) if isinstance(value, Var) else None
    if tb is None and tv is None:
        return None
    tb = tb or eqns.zeros(ct_aval(buf.aval))
    tv = tv or eqns.zeros(ct_aval(value.aval))
    return _set(eqns, tb, env[turn], tv, e.params["lead"])


@jvp_rules.register(ir.row_get_p)
@_linear
def _row_get_tangent(e, env, tan, eqns):
    t = tan.get(e.inputs[0])
    return None if t is None else _get(eqns, t, env[e.inputs[1]], e.params["lead"])


@vjp_rules.register(ir.row_set_p)
def _row_set_transpose(v, e, cts, env, ct, eqns, saved):
    buf, turn, value = e.inputs
    g, lead, t = cts[0], e.params["lead"], _read(turn, env)
    if g is None or not is_float(e.outputs[0].aval):
        return
    if isinstance(value, Var):                  # read before the row is zeroed in place below
        _accumulate(ct, value, _get(eqns, g, t, lead), eqns)
    if isinstance(buf, Var):
        _accumulate(ct, buf, _set(eqns, g, t, eqns.zeros(ct_aval(value.aval)), lead), eqns)


@vjp_rules.register(ir.row_get_p)
def _row_get_transpose(v, e, cts, env, ct, eqns, saved):
    buf, turn = e.inputs
    if cts[0] is None or not isinstance(buf, Var) or not is_float(buf.aval):
        return
    zeros = eqns.zeros(ct_aval(buf.aval))
    _accumulate(ct, buf, _set(eqns, zeros, _read(turn, env), cts[0], e.params["lead"]), eqns)


def _refuse_turn(e):
    raise VmapError(f"eagle_fx.vmap: a per-instance turn for the rows of eagle_fx.collect ({e.info.where}); the "
                    "turns of a batched loop are shared: batch the loop's values, not its turn counter")


@batch_rules.register(ir.row_set_p)
def _batch_row_set(self: _Batcher, e, atoms, fl, env, flags, eqns):
    buf_b, turn_b, value_b = fl
    if turn_b:
        _refuse_turn(e)
    if not (buf_b or value_b):
        return self.copy(e, atoms, [False], env, flags, eqns)
    atoms = list(atoms)
    if not buf_b:
        atoms[0] = self.broadcast(atoms[0], eqns)
    if not value_b:
        atoms[2] = self.broadcast(atoms[2], eqns)
    self.copy(e, atoms, [True], env, flags, eqns, dict(e.params, lead=e.params["lead"] + 1))


@batch_rules.register(ir.row_get_p)
def _batch_row_get(self: _Batcher, e, atoms, fl, env, flags, eqns):
    if fl[1]:
        _refuse_turn(e)
    if not fl[0]:
        return self.copy(e, atoms, [False], env, flags, eqns)
    self.copy(e, atoms, [True], env, flags, eqns, dict(e.params, lead=e.params["lead"] + 1))
