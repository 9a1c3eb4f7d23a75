"""The staging context: everything a thread is staging now, in one per-thread object.

Staging is a per-thread activity: a thread building a graph must not capture the kernel calls
another thread makes eagerly, and a kernel traced in one thread must not see another's trace. So
all of it lives in one `threading.local`, `CONTEXT`: one stack per kind of frame, innermost last,
each entered and left with `CONTEXT.enter(kind=value, ...)` (a `with` that pops what it pushed even
when the body raises). Reading one is an attribute lookup and a list test: the hot path of a kernel
call outside any graph (`if CONTEXT.graph_stagers:`) stays as cheap as it was.

The frames, who pushes them and what the innermost one means:

    kernel_traces     hawk_fx.trace: kernel bodies being traced; the innermost receives ops
    graph_stagers     eagle_fx graph traces (and eager runs' stagers); the innermost receives kernel calls
    builder_sources   eagle_fx builders being staged (SourceInfo): where errors point
    host_nodes        eagle_fx graphs whose host node runs now: their planes read as arrays
    building          eagle_fx builder calls, for nested builders' results
    deferring         eagle_fx transforms staging: builders close their graphs, unlowered
    transforming      eagle_fx transforms staging a plain function: transforms return graphs
    abstract          eagle_fx.to_jax staging on stand-ins of traced arrays (no values)
    lazy_compile      eagle_fx.to_jax: JAX executables compile at their first replay
    guards            eagle_fx plain functions staged behind guards (api, function, originals)
    recording         eagle_fx cached entries being staged: what they read by name
    backends          eagle_fx.use_backend: the backend graphs built now run on
    staging_disabled  eagle_fx.disable_staging blocks (True / False)
    eager_runs        eagle_fx builders running as plain Python
    plain_sums        hawk_fx.emit.jax: sums traced as jnp.sum (transposable), not the compensated reduce
    transform_apis    eagle_fx transforms staging now (their API names): refusals name the composition
    reversible        eagle_fx reverse passes being built to recompute their turns (reverse over reverse)
    unbounded_recompute  eagle_fx reverse passes for a backend whose stacks have a fixed size (JAX):
                      a loop with no bound on its turns recomputes them (True / False)
    custom_rules      eagle_fx custom functions whose rules are being staged now (a rule calling its
                      own function stages the body)

Two per-thread maps sit beside the stacks: `batch_full` (vmap: an instance array's batched array,
by id) and `scratch` (buffers a kernel's NumPy body reuses; not staging, but per thread for the
same reason).
"""
from __future__ import annotations

import threading

STACKS = ("kernel_traces", "graph_stagers", "builder_sources", "host_nodes", "building", "deferring",
          "transforming", "abstract", "lazy_compile", "guards", "recording", "backends", "staging_disabled",
          "eager_runs", "plain_sums", "transform_apis", "reversible", "unbounded_recompute", "custom_rules")


class Context(threading.local):
    """This thread's staging state (module docstring): one list per kind of frame, two maps."""

    def __init__(self):
        for name in STACKS:
            setattr(self, name, [])
        self.batch_full = {}
        self.scratch = {}

    def enter(self, **frames):
        """Push one frame on each named stack for the `with` body; pop them after, innermost first."""
        return _Frames(self, frames)

    def innermost(self, kind):
        """The innermost frame of one kind, or None when this thread has none."""
        s = getattr(self, kind)
        return s[-1] if s else None



class _Frames:
    """The `with` of Context.enter: a class, not a generator, since host nodes enter it at every
    replay. Leaving truncates each stack to its depth on entry, so frames a failing body left are
    dropped too."""

    __slots__ = ("ctx", "frames", "depths")

    def __init__(self, ctx, frames):
        self.ctx, self.frames = ctx, frames

    def __enter__(self):
        stacks = [getattr(self.ctx, kind) for kind in self.frames]
        self.depths = [(st, len(st)) for st in stacks]
        for st, frame in zip(stacks, self.frames.values()):
            st.append(frame)
        return self.ctx

    def __exit__(self, *exc):
        for st, depth in reversed(self.depths):
            del st[depth:]
        return False


CONTEXT = Context()
