"""The done mark of run-until-done: a kernel parameter `done: Terminated` (one bool per sample).

A kernel with one leaves every sample whose mark is set untouched. That is written into its traced
body, so every interpreter (NumPy, JAX, CUDA, the derivative rules) runs it without a rule of its
own: each Mutable's new value becomes `select(done, old, new)`, each result `select(done, 0, r)`,
and `done = cond` commits `done | cond`. A finished sample's Mutables thus pass through with an
identity derivative, and its results' derivatives are zero.
"""
from __future__ import annotations

from .prims import P
from .roles import TerminatedRole

_SAMPLE_AXIS = ("sample_sum", "sample_max", "sample_min", "sample_mean", "sample_count")


def terminated_index(kernel):
    """The index of the kernel's `Terminated` parameter, or None; at most one is allowed."""
    found = [k for k, role in enumerate(kernel.roles) if isinstance(role, TerminatedRole)]
    if len(found) > 1:
        names = ", ".join(repr(kernel.param_names[k]) for k in found)
        raise TypeError(f"hawk.kernel {kernel.name}: parameters {names} are all Terminated; a kernel has one done "
                        "mark per sample. Combine the marks before the call (a Scalar bool plane read with "
                        "`hm.logical_or`), or keep one Terminated parameter")
    return found[0] if found else None


def gate_results(kernel, trace, args, leaves):
    """Each result reads 0 (False) in a finished sample."""
    t = kernel.terminated
    if t is None:
        return leaves
    done = args[t]
    out = []
    for leaf in leaves:
        zero = {"b": False, "i": 0, "u": 0}.get(leaf.aval.dtype.kind, 0.0)
        out.append(trace.process(P["select"], [done, zero, leaf], {})[0])
    return out


def gate_commit(kernel, trace, args, k, value):
    """The value committed to parameter k: the old one in a finished sample; the mark only ever set."""
    t = kernel.terminated
    if t is None:
        return value
    done = args[t]
    if k == t:
        return trace.process(P["or"], [done, value], {})[0]
    return trace.process(P["select"], [done, args[k], value], {})[0]


def refuse_reductions(kernel, trace):
    """A reduction over the samples would still count the finished ones: refused, with the way."""
    if kernel.terminated is None:
        return
    for e in trace.eqns:
        if e.prim.name in _SAMPLE_AXIS:
            at = f" at {e.info.where}" if e.info.where else ""
            name = kernel.param_names[kernel.terminated]
            raise TypeError(
                f"hawk.kernel {kernel.name}: a reduction over the samples{at} in a kernel with the Terminated "
                f"parameter '{name}', which would still count the finished samples. Reduce in a kernel without it, "
                f"taking the mark as a plain plane (`{name}: Scalar`) and masking: "
                f"`hawk.sum(hm.where({name}, 0.0, x))`")


__all__ = ["terminated_index", "gate_results", "gate_commit", "refuse_reductions"]
