"""Reverse mode over a reverse pass through a device loop (grad(grad(f)), jacrev(jacrev(f))).

A loop's reverse pass usually saves every turn's carries on a stack and reads them back, last
first. Reversing that again would need the stacks' own cotangents. Instead, when a reverse
transform finds a reverse pass through a loop in the program it differentiates, it stages that
program again with reversible reverse passes: the forward loop only counts its turns, and the
backward loop, at turn t, runs the body again from the loop's entry to turn turns - 1 - t (a
counted loop inside it), then the body's vjp. Everything is then plain loops, which reverse mode
takes (loops in loops), at the cost of O(turns^2) body evaluations in that inner reverse pass.

A reverse pass saves a loop's turns on stacks, which need a bound on the turns where the backend
sizes its arrays statically (JAX). An uncapped `while` has none, nor has a counted loop whose trip
count the graph computes (the reversible backward loop counts the turns the forward ran, so every
reverse over reverse meets one). There, `recompute_unbounded` has the reverse pass recompute each
loop with no bound: its forward only counts turns (a plain lax.while_loop, no stack) and its
backward runs the body again from the entry: O(turns^2) body runs for grad(f), O(turns^3) for
grad(grad(f)), instead of stacks that XLA cannot size. Loops with a bound (a cap, or a trip count
the call passes in) keep their stacks.
"""
from __future__ import annotations

from hawk_fx.context import CONTEXT
from hawk_fx.emit.jax import is_jax_array

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


def recompute_unbounded(on: bool):
    """`with recompute_unbounded(on):` reverse passes built inside recompute each loop whose turns
    have no bound (no stack to size), when `on` (or when an enclosing frame said so)."""
    return CONTEXT.enter(unbounded_recompute=bool(on) or recomputes_unbounded())


def recomputes_unbounded() -> bool:
    return bool(CONTEXT.innermost("unbounded_recompute"))


def static_stacks(arrays) -> bool:
    """Does the backend a graph over `arrays` runs on size its stacks of turns statically (JAX:
    no supports_growing_stacks)? As select.resolve chooses it, without making a runtime."""
    from ..backends import select
    requested = select.forced()
    if requested is None:
        if not any(is_jax_array(a) for a in arrays):
            return False
        requested = "jax"
    try:
        entry = select.resolve_entry(requested)[0]
    except ValueError:
        return False
    return not entry.supports_growing_stacks
