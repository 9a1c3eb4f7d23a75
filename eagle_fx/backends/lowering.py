"""Lowering a closed Program for a backend: the one way an executable of a graph is made.

`lower(closed, backend)` resolves the backend (by the arrays, `backend=`, `use_backend`: select.py)
to a registry entry, refuses what that entry cannot run (registry.refuse), and makes the
executable: the record=True graph's forward half (recording.py) or the Program's own
(registry.make). graph.Lowered holds its result; Lowered.compile() gives the Graph.
"""
from __future__ import annotations

import numpy as np

from . import registry, select
from .recording import recorded_executable


def lower(closed, backend=None):
    """(registry entry, runtime or None, executable) of `closed` on `backend` (None: the closed
    Program's own: for a transform's, NumPy or 'jax'; for a builder's graph, by its arrays)."""
    arrays = closed.arrays
    requested = backend if backend is not None else "jax" if closed.mesh is not None else closed.backend
    if closed.transformed:                  # a transform's graph runs where transforms run
        forced = select.forced()
        if requested in (None, "numpy") and forced is not None:
            requested = forced              # use_backend's backend, whichever (jax, auto, CUDA): its graphs run there
        target, _ = select.resolve_entry(requested or "numpy")
        for e in closed.planes:
            if not isinstance(e.array, np.ndarray) and target is not select.by_array(e.array):
                registry.refuse(select.by_array(e.array), "supports_transforms", name=e.name or "",
                                type_name=type(e.array).__name__)
        if requested is None or isinstance(requested, str):
            requested = target.name
    entry, runtime = select.resolve(arrays, requested)
    n = closed.n or 1
    if closed.recording is None:
        return entry, runtime, registry.make(entry, closed.program, arrays, closed.kept(), n, closed.names,
                                             closed.mesh, runtime)
    if entry.supports_record and not entry.supports_growing_stacks and backend is None and closed.backend is None \
            and closed.mesh is None and all(isinstance(a, np.ndarray) for a in arrays):
        entry = registry.get("numpy")   # use_backend('jax') keeps records on NumPy (growing stacks, checkpoints=)
    if entry.name == "auto":
        entry = registry.get("numpy")   # a record's forward keeps its stacks of turns on NumPy
    registry.refuse(entry, "supports_record")
    return entry, runtime, recorded_executable(closed, entry, arrays, n, runtime)
