"""Compaction for `eagle_fx.simulate(..., compact=True)`: work that falls with the samples still running.

A plain run turns over every sample until the last one is done, the finished ones masked, so a
long tail of a few slow samples costs as much per step as the start did. A compacted run is a
sequence of segments, each the plain run's graph over planes of the samples still running: a
segment stops once at most half of its samples still run (or all are done, or the bound is
reached); the finished samples' state, steps and status are written out, and the next segment
runs over the others, packed into planes of their count. All samples still running have taken the
same number of steps (every one of them stepped on every turn), so a segment starts from that
count, with the bound's remaining steps. The segments' graphs are cached like any simulate graph:
a repeated run over the same data rebuilds nothing.

Each sample's arithmetic is the plain run's, in the same order, so the values are the same as long
as a sample's step reads only that sample: every per-sample plane the step reads is in the state,
and the step sums nothing over the samples. (A plane closed over by the step function keeps the
caller's sample count, and the second segment's kernels refuse it for its count.)
"""
from __future__ import annotations

import dataclasses

import numpy as np

from hawk_fx.tree import tree_unflatten

from .backends.select import forced

API = "eagle_fx.simulate"
MIN_SAMPLES = 1024      # below this many running samples a segment runs to the end: a turn's
#                         fixed cost (its kernel calls) outweighs the samples' work


def run_compacted(cfg, state, compact, staged: bool):
    """The run of `simulate(..., compact=True)`: a SimResult of NumPy arrays, as the plain run's."""
    from .simulate import BUDGET, FINISHED, SimResult, _leaves_of, _run
    if compact is not True:
        raise TypeError(f"{API}: compact={compact!r}; give True (pack the running samples as they finish) or False")
    if staged:
        raise ValueError(f"{API}: compact=True inside a builder; a compacted run is driven from Python between "
                         "segments, outside a graph: call simulate outside the builder, or drop compact")
    for what, given in (("record=", cfg.record), ("event=", cfg.event), ("key=", cfg.key)):
        if given is not None:
            why = {"record=": "its rows hold every sample at fixed steps",
                   "event=": "the crossing is refined from each sample's state before it",
                   "key=": "the random streams are drawn by sample position"}[what]
            raise ValueError(f"{API}: compact=True with {what}; {why}, which packing would change: drop compact")
    backend = forced()
    if backend not in (None, "numpy"):
        raise ValueError(f"{API}: compact=True under use_backend({backend!r}); a compacted run packs NumPy planes on "
                         "the NumPy backend: drop compact, or run it outside use_backend")
    leaves, tree = _leaves_of(state)
    for x in leaves:
        if type(x) is not np.ndarray:
            raise TypeError(f"{API}: compact=True packs NumPy planes; the state holds {type(x).__name__}: pass NumPy "
                            "arrays, or drop compact (the JAX backend's loop masks finished samples on the device)")
    n = leaves[0].shape[-1]
    out = [np.array(x, copy=True) for x in leaves]       # each sample's final state, written as it stops
    steps = np.full(n, cfg.limit, np.int32)
    status = np.full(n, cfg.code, np.int32)
    running = np.arange(n)                               # the caller's index of each sample still running
    current = leaves
    taken = 0                                            # the steps every running sample has taken
    while running.size and taken < cfg.limit:
        m = running.size
        seg = dataclasses.replace(cfg, limit=cfg.limit - taken, code=BUDGET,
                                  stop_active=m // 2 if m // 2 >= MIN_SAMPLES else 0)
        try:
            r = _run(seg, tree_unflatten(tree, current))
        except (ValueError, TypeError) as err:
            if m == n:
                raise
            raise ValueError(f"{err}\n({API} with compact=True: this segment runs over the {m} samples still "
                             f"running, packed; a per-sample plane the step reads from outside the state keeps all "
                             f"{n}: put it in the state, or drop compact)") from err
        finished = np.asarray(r.finished)
        seg_steps = np.asarray(r.steps)
        final = [np.asarray(x) for x in _leaves_of(r.state)[0]]
        stopped = running[finished]
        for o, x in zip(out, final):
            o[..., stopped] = x[..., finished]
        steps[stopped] = taken + seg_steps[finished]
        status[stopped] = FINISHED
        left = ~finished
        if not left.any():
            running = running[:0]
            break
        taken += int(seg_steps[left][0])                 # the same for every sample still running
        running = running[left]
        current = [x[..., left] for x in final]
    for o, x in zip(out, current if running.size else ()):
        o[..., running] = x                              # the bound stopped these: their state at it
    t = None if cfg.dt is None else steps * float(cfg.dt)
    finished = status == FINISHED
    return SimResult(tree_unflatten(tree, out), steps, status, finished, t)


__all__ = ["run_compacted", "MIN_SAMPLES"]
