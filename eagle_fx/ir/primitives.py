"""Graph primitives: the operations a staged Program is made of.

    call    a kernel body over planes (params: kernel, spec, n, inplace)
    opaque  a host function with declared reads and writes
    cond    if/else on a one-cell uint32 array: branches=(false_program, true_program)
    switch  match on a cell: cases=(v0, v1, ...), branches=(program per case..., default)
    while   a device loop: cond program (or None), body program, cap, counted (trip cell operand)
    cell_not / cell_and / cell_or   logic on cells, for `not`, `and`, break and continue flags

`inplace` is a tuple of (output index, input index) pairs: that output overwrites that input's
buffer. It is how `Mutable` writes stay in the caller's array and a loop carry stays in one buffer.
Sub-programs of cond/switch take the operands after the predicate; a while body takes
(turn counter cell, consts..., carries...) and returns the carries; its cond takes (consts..., carries...).
"""
from __future__ import annotations

import numpy as np

from hawk_fx.core import CELL, PLANE, AVal, Primitive, abstract_eval, pp_params_rules

call_p = Primitive("call", multiple_results=True)
opaque_p = Primitive("opaque", multiple_results=True)
cond_p = Primitive("cond", multiple_results=True)
switch_p = Primitive("switch", multiple_results=True)
while_p = Primitive("while", multiple_results=True)
cell_not_p = Primitive("cell_not")
cell_and_p = Primitive("cell_and")
cell_or_p = Primitive("cell_or")

CONTROL = (cond_p, switch_p, while_p)
U32_CELL = AVal((1,), np.uint32, CELL)


def plane_aval(shape, dtype) -> AVal:
    shape = tuple(shape)
    return AVal(shape, dtype, CELL if shape == (1,) else PLANE)


def is_cond_cell(aval: AVal) -> bool:
    return aval.shape == (1,) and aval.dtype == np.uint32


@abstract_eval.register(call_p)
def _call_abstract(*avals, kernel, spec, n, inplace, batch=(), in_batched=None):
    out = []
    for j, a in enumerate(spec.prog.outputs[:spec.n_results]):
        out.append(plane_aval(tuple(batch) + spec.result_shape(j, n), spec.result_dtype(j)))
    for k in spec.commits:
        out.append(avals[k])
    return out


@abstract_eval.register(opaque_p)
def _opaque_abstract(*avals, fn, reads, writes, inplace):
    return [avals[i] for _, i in inplace]


def _branches_abstract(*avals, branches, inplace, **_):
    outs = branches[0].out_avals
    for b in branches[1:]:
        if [(a.shape, a.dtype) for a in b.out_avals] != [(a.shape, a.dtype) for a in outs]:
            raise TypeError(f"branches of one conditional return different types: {outs} and {b.out_avals}")
    return list(outs)


abstract_eval[cond_p] = _branches_abstract
abstract_eval[switch_p] = _branches_abstract


@abstract_eval.register(while_p)
def _while_abstract(*avals, body, cond, cap, counted, n_consts, inplace, **rest):
    return list(body.out_avals)


class WhileOperands:
    """The operands of a while (or revolve) equation split by role, so no rule decodes the layout
    by hand: `trip` (the trip count cell of a counted loop, a revolve's turn count; None for an
    uncounted loop), `consts`, `carries` (a revolve's carries on entry) and `rest` (a revolve's
    carry cotangents and const cotangent sums; empty for a loop). `operands` defaults to the
    equation's inputs; any sequence laid out like them (values, avals) splits the same way.
    `head` is the number of operands before the consts: a const's operand index is head + i, a
    carry's head + n_consts + j. `body_parts` / `guard_parts` split the inputs of the body
    (turn, consts..., carries...) and of the guard (consts..., carries...)."""

    __slots__ = ("head", "n_consts", "trip", "consts", "carries", "rest")

    def __init__(self, eqn, operands=None):
        ops = list(eqn.inputs if operands is None else operands)
        nc = self.n_consts = eqn.params["n_consts"]
        self.head = 1 if eqn.prim is revolve_p or eqn.params.get("counted") else 0
        self.trip = ops[0] if self.head else None
        self.consts = ops[self.head:self.head + nc]
        if eqn.prim is revolve_p:
            nk = len(eqn.params["forward"].outputs)
            self.carries, self.rest = ops[1 + nc:1 + nc + nk], ops[1 + nc + nk:]
        else:
            self.carries, self.rest = ops[self.head + nc:], []

    def body_parts(self, seq):
        """(turn, consts, carries) of a sequence laid out as the loop body's inputs."""
        nc = self.n_consts
        return seq[0], list(seq[1:1 + nc]), list(seq[1 + nc:])

    def guard_parts(self, seq):
        """(consts, carries) of a sequence laid out as the guard's inputs."""
        return list(seq[:self.n_consts]), list(seq[self.n_consts:])


for _p in (cell_not_p, cell_and_p, cell_or_p):
    abstract_eval[_p] = lambda *avals: [U32_CELL]


def _pp_call(params):
    return {"kernel": params["kernel"].name, **({"inplace": params["inplace"]} if params["inplace"] else {})}


def _pp_opaque(params):
    return {"fn": getattr(params["fn"], "__name__", "fn"), "writes": tuple(params["writes"])}


def _pp_while(params):
    shown = {}
    if params["cap"] is not None:
        shown["cap"] = params["cap"]
    if params["counted"]:
        shown["counted"] = True
    if params.get("masked"):
        shown["masked"] = True
    if params["inplace"]:
        shown["inplace"] = params["inplace"]
    if params["cond"] is not None:
        shown["cond"] = params["cond"]
    shown["body"] = params["body"]
    return shown


def _pp_branches(params):
    shown = {k: v for k, v in params.items() if k not in ("inplace", "branches", "masked", "instance")}
    if params.get("masked"):
        shown["masked"] = True
    if params["inplace"]:
        shown["inplace"] = params["inplace"]
    shown["branches"] = params["branches"]
    return shown


pp_params_rules[call_p] = _pp_call
pp_params_rules[opaque_p] = _pp_opaque
pp_params_rules[while_p] = _pp_while
pp_params_rules[cond_p] = _pp_branches
pp_params_rules[switch_p] = _pp_branches


# ---------------------------------------------------------------------------------------------
# primitives the derivative transforms emit (transforms/jvp_graph.py, transforms/vjp_graph.py)
#
#   zeros       a plane of zeros (a cotangent or tangent nothing flows into): params aval
#   add_any     the sum of two planes of one type (cotangents meeting at a value)
#   stack_push  stack' = stack with stack[turn] = value (in place): a loop's carries, per turn
#   stack_read  stack[turn] (the backward loop reads the turn it undoes)
#
# A stack's type (`stack_aval`) has kind STACK, shape (cap, *value shape), or BATCHED_STACK,
# (B, cap, *value shape) under vmap. `cap` is the most turns it may hold: the loop's cap, the trip
# count when the derivative was built, or 0 for a loop with no known bound. Backends that allocate
# as they run (NumPy) grow a stack with the turns pushed and ignore `cap`; backends with static
# shapes (JAX) allocate `cap` turns and refuse cap 0.
#   cell_inc    turn + 1 (a loop counting its turns)
#   cell_rev    max(turns - 1 - turn, 0) (the turn the backward loop's turn-th turn undoes)

STACK, BATCHED_STACK = "stack", "stack_b"


def stack_aval(cap, shape, dtype) -> AVal:
    """The type of a stack of `cap` saved values of `shape` (cap None: no known bound)."""
    return AVal((cap or 0,) + tuple(shape), dtype, STACK)


def is_stack(aval) -> bool:
    return aval.kind in (STACK, BATCHED_STACK)


zeros_p = Primitive("zeros")
add_any_p = Primitive("add_any")
stack_push_p = Primitive("stack_push")
stack_read_p = Primitive("stack_read")
cell_inc_p = Primitive("cell_inc")
cell_rev_p = Primitive("cell_rev")

abstract_eval[zeros_p] = lambda *, aval: [aval]
abstract_eval[add_any_p] = lambda x, y: [x if len(x.shape) >= len(y.shape) else y]
abstract_eval[cell_inc_p] = lambda turn: [turn]
abstract_eval[cell_rev_p] = lambda turns, turn: [turns if len(turns.shape) >= len(turn.shape) else turn]


@abstract_eval.register(stack_push_p)
def _push_abstract(stack, turn, value, *, cap, batched=False, inplace=((0, 0),)):
    return [stack]


@abstract_eval.register(stack_read_p)
def _read_abstract(stack, turn, *, batched=False, turn_batched=False, **_):
    shape = stack.shape[:1] + stack.shape[2:] if batched else stack.shape[1:]
    return [plane_aval(shape, stack.dtype)]


# revolve: the reverse of a loop that keeps at most `checkpoints` of its states and runs the
# others again (transforms/checkpoint.py: the binomial schedule), where the stored reverse reads
# a stack of every turn. Operands (turns, consts..., carries on entry..., carry cotangents...,
# const cotangent sums...) -> (cotangents of the carries on entry..., const cotangent sums...).
# `forward` is the loop body (turn, consts..., carries...) -> carries; `backward` is one reverse
# step (turn, consts..., carries of that turn..., carry cts..., sums...) -> (carry cts..., sums...).
# Under vmap with a turn count per instance (`masked`), each instance's turns past its own count
# leave its cotangents as they are.
revolve_p = Primitive("revolve", multiple_results=True)


@abstract_eval.register(revolve_p)
def _revolve_abstract(*avals, forward, backward, checkpoints, n_consts, masked=False):
    return list(backward.out_avals)


pp_params_rules[revolve_p] = lambda params: {"checkpoints": params["checkpoints"],
                                             **({"masked": True} if params.get("masked") else {}),
                                             "forward": params["forward"], "backward": params["backward"]}
pp_params_rules[zeros_p] = lambda params: {}
pp_params_rules[stack_push_p] = lambda params: {"cap": params["cap"]} if params["cap"] is not None else {}
pp_params_rules[stack_read_p] = lambda params: {}


# ---------------------------------------------------------------------------------------------
# array structure: what NumPy indexing, reshape and stack/concatenate on staged planes become
# (eagle_fx/frontend/views.py stages them). All four are linear. Backends copy: a slot the planner reuses
# would change under a view; the NumPy backend reads a slice of an argument that nothing writes
# in place as a view of the caller's array.
#
#   slice    x[index]: index has one entry per axis of x, an int (the axis goes) or a range
#   update   base' = base with base[index] = value (in place on base when staged)
#   reshape  x.reshape(shape), C order
#   concat   the operands joined along `axis`

slice_p = Primitive("slice")
update_p = Primitive("update")
reshape_p = Primitive("reshape")
concat_p = Primitive("concat")
STRUCTURE = (slice_p, update_p, reshape_p, concat_p)


def index_shape(index) -> tuple:
    return tuple(len(r) for r in index if isinstance(r, range))


def numpy_index(index) -> tuple:
    """The NumPy index of a normalised one (ints and ranges) that selects the same elements."""
    out = []
    for r in index:
        if isinstance(r, range):
            if len(r) == 0:
                out.append(slice(0, 0))
            else:
                stop = r[-1] + (1 if r.step > 0 else -1)
                out.append(slice(r[0], stop if stop >= 0 else None, r.step))
        else:
            out.append(r)
    return tuple(out)


@abstract_eval.register(slice_p)
def _slice_abstract(x, *, index):
    return [plane_aval(index_shape(index), x.dtype)]


@abstract_eval.register(update_p)
def _update_abstract(base, value, *, index, inplace=()):
    if value.shape != index_shape(index):
        raise TypeError(f"update: a value of shape {value.shape} for a region of shape {index_shape(index)}")
    return [base]


@abstract_eval.register(reshape_p)
def _reshape_abstract(x, *, shape):
    if int(np.prod(shape)) != int(np.prod(x.shape)):
        raise TypeError(f"reshape: {x.shape} has {int(np.prod(x.shape))} elements, {tuple(shape)} needs "
                        f"{int(np.prod(shape))}")
    return [plane_aval(shape, x.dtype)]


@abstract_eval.register(concat_p)
def _concat_abstract(*xs, axis):
    shape = list(xs[0].shape)
    shape[axis] = sum(x.shape[axis] for x in xs)
    return [plane_aval(shape, xs[0].dtype)]


def _pp_index(index):
    parts = []
    for r in index:
        if not isinstance(r, range):
            parts.append(str(r))
        else:
            s = numpy_index((r,))[0]
            parts.append(f"{'' if s.start in (0, None) else s.start}:{'' if s.stop is None else s.stop}"
                         + ("" if s.step in (1, None) else f":{s.step}"))
    return "[" + ",".join(parts) + "]"


pp_params_rules[slice_p] = lambda params: {"index": _pp_index(params["index"])}
pp_params_rules[update_p] = lambda params: {"index": _pp_index(params["index"]),
                                            **({"inplace": params["inplace"]} if params.get("inplace") else {})}
pp_params_rules[reshape_p] = pp_params_rules[concat_p] = dict      # every param shown, as they are


# ---------------------------------------------------------------------------------------------
# vmap's one primitive (transforms/vmap.py): a value shared by every instance, spread over the
# batch axis where a batched value needs it (size: the batch B).

batch_broadcast_p = Primitive("batch_broadcast")


def batched_aval(aval, B):
    """The type of B instances of a value of type `aval` (a leading batch axis)."""
    if is_stack(aval):
        return aval.replace(shape=(B,) + aval.shape, kind=BATCHED_STACK)
    return plane_aval((B,) + aval.shape, aval.dtype)


@abstract_eval.register(batch_broadcast_p)
def _broadcast_abstract(x, *, size, axis=0):
    if axis:          # an inner batch axis under an outer one (vmap of a batched program): (B2, *x) -> (B2, B1, *x)
        return [plane_aval(x.shape[:axis] + (size,) + x.shape[axis:], x.dtype)]
    return [batched_aval(x, size)]


pp_params_rules[batch_broadcast_p] = lambda params: {"size": params["size"],
                                                     **({"axis": params["axis"]} if params.get("axis") else {})}

# reverse mode over a batched program: the cotangent of a value every instance shares is the sum of
# the instances' (the transpose of batch_broadcast); axis: the batch axis summed
batch_sum_p = Primitive("batch_sum")


@abstract_eval.register(batch_sum_p)
def _batch_sum_abstract(x, *, axis=0):
    return [plane_aval(x.shape[:axis] + x.shape[axis + 1:], x.dtype)]


pp_params_rules[batch_sum_p] = lambda params: {"axis": params["axis"]} if params.get("axis") else {}


# ---------------------------------------------------------------------------------------------
# per-turn outputs of a device loop (eagle_fx.collect): a plane buffer of `rows` rows, one per turn,
# written at the loop's turn counter. `lead`: batch axes before the row axis (0 unless vmapped).
#
#   row_set  buf' = buf with buf[turn] = value, in place; a turn past the rows writes nothing
#   row_get  buf[turn] (zeros for a turn past the rows): the reverse of row_set reads its row back

row_set_p = Primitive("row_set")
row_get_p = Primitive("row_get")


def _row_shape(buf, lead):
    return buf.shape[:lead] + buf.shape[lead + 1:]


@abstract_eval.register(row_set_p)
def _row_set_abstract(buf, turn, value, *, lead=0, inplace=((0, 0),)):
    if tuple(value.shape) != _row_shape(buf, lead) or value.dtype != buf.dtype:
        raise TypeError(f"row_set: a value of {value.dtype}{list(value.shape)} for rows of "
                        f"{buf.dtype}{list(_row_shape(buf, lead))}")
    return [buf]


@abstract_eval.register(row_get_p)
def _row_get_abstract(buf, turn, *, lead=0):
    return [plane_aval(_row_shape(buf, lead), buf.dtype)]


pp_params_rules[row_set_p] = lambda params: {k: v for k, v in params.items() if v}
pp_params_rules[row_get_p] = lambda params: {k: v for k, v in params.items() if v}
