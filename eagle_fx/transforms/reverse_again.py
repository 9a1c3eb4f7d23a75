"""Reverse mode over a reverse pass through a device loop (grad(grad(f)), jacrev(jacrev(f))).

A loop's reverse pass usually saves every turn's carries on a stack and reads them back, last
first. Reversing that again would need the stacks' own cotangents. Instead, when a reverse
transform finds a reverse pass through a loop in the program it differentiates, it stages that
program again with reversible reverse passes: the forward loop only counts its turns, and the
backward loop, at turn t, runs the body again from the loop's entry to turn turns - 1 - t (a
counted loop inside it), then the body's vjp. Everything is then plain loops, which reverse mode
takes (loops in loops), at the cost of O(turns^2) body evaluations in that inner reverse pass.
"""
from __future__ import annotations

from hawk_fx.context import CONTEXT

from .. import ir

def recomputing() -> bool:
    """Are reverse passes being built reversible (recomputing their turns)?"""
    return bool(CONTEXT.reversible)


def reversible():
    return CONTEXT.enter(reversible=True)


def holds_reverse(prog) -> bool:
    """Does `prog` hold a reverse pass through a loop (a stack of saved turns, a revolve)?"""
    return any(e.prim in (ir.stack_push_p, ir.stack_read_p, ir.revolve_p) for e in prog.eqns) or \
        any(holds_reverse(q) for q in prog.subprograms())
