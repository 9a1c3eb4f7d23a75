"""What a record=True graph builds: the two halves of the vjp transform of its Program.

The graph's Program, with its named values as outputs (the result, the arguments a kernel writes,
buffer= labels) and a zero probe added to each float top-level buffer (the cotangent that reaches
a buffer is the gradient with respect to its probe), goes through vjp_graph and is split at the
residual boundary (transforms/split.py):

  * the forward half (inputs -> outputs and residuals: the stacks of loop carries, which grow with
    the turns run, the values the kernels' backwards read) is what the graph runs on launch; it
    is functional, so an argument the graph writes is copied back after each run, its value on
    entry kept for the derivatives. Its residuals are what the backward reads: a value a later
    write replaces is kept (that is the save), a value only a linear kernel's derivative would be
    handed is not (the backward passes it zeros: split.py), and the caller's unwritten arrays are
    read where they lie;
  * the backward half (residuals, cotangents -> input cotangents) is lowered once, on the first
    `eagle_fx.diff.reverse`, and replayed with the record's residuals and the seeds bound;
  * both halves run on the graph's backend: NumPy, or JAX (NumPy arrays with backend="jax"; its
    stacks have static sizes, so a checkpointed record is refused at build there);
  * `eagle_fx.diff.forward` runs jvp_graph of the same Program on the recorded run's inputs.
"""
from __future__ import annotations

import numpy as np

from hawk_fx.core import Eqn, Var

from . import ir
from .backends.numpy import NumpyExecutable
from .transforms.jvp_graph import jvp_graph
from .transforms.program import is_float
from .transforms.split import split, without_zero_inputs
from .transforms.vjp_graph import vjp_graph

API = "eagle.Graph(record=True)"


class Halves:
    """The record=True Program `prog` as named outputs, and the forward and backward of its vjp."""

    def __init__(self, prog, seedable, shown, buffers, capacity, checkpoints=None):
        top = set(prog.inputs) | {v for e in prog.eqns for v in e.outputs}
        probed = [b for b in dict.fromkeys(buffers) if b in top and b not in prog.inputs and is_float(b.aval)]
        self.q, self.probe_of, sub = _probe(prog, probed)
        outs = list(self.q.outputs)
        n_seedable = None
        for k, group in enumerate((seedable, shown)):
            for v in group:
                if isinstance(v, Var) and v in top and not (k and v in prog.inputs):
                    w = sub.get(v, v)
                    if w not in outs:
                        outs.append(w)
            if n_seedable is None:
                n_seedable = len(outs)      # the outputs after these are shown only: no seed reaches them
        self.q = self.q.replace(outputs=outs)
        self.index = {}                         # a Var of `prog` -> its place among q's outputs
        for k, a in enumerate(outs):
            if isinstance(a, Var):
                self.index.setdefault(a, k)
        for v, w in sub.items():
            self.index[v] = self.index[w]
        self.inputs = list(prog.inputs)
        self.wrt = [is_float(v.aval) for v in self.q.inputs]
        self.ct_of = {}                         # q output place -> cotangent input place of the backward
        for k, a in enumerate(outs):
            if is_float(a.aval):
                self.ct_of[k] = len(self.ct_of)
        self.grad_of = {}                       # q input place -> output place of the backward
        for k, w in enumerate(self.wrt):
            if w:
                self.grad_of[k] = len(self.grad_of)
        v = vjp_graph(self.q, self.wrt, capacity, API, checkpoints)
        self.forward, backward, self.residuals = split(v, len(self.q.inputs), len(outs))
        unseeded = [backward.inputs[len(self.residuals) + j] for k, j in self.ct_of.items() if k >= n_seedable]
        self.backward = without_zero_inputs(backward, unseeded)
        self.seedable = n_seedable
        self._bw = None
        self._jvp = None

    def backward_exe(self, residuals, seeds, n, backend="numpy"):
        """The backward executable reading `residuals` and the seeds ({q output place: array}) where
        they lie: no copy. A cotangent not seeded reads a private zeros array (the backward is
        functional: it writes none of its inputs). It runs on the forward's backend."""
        if self._bw is None:
            self._zero_cts = [np.zeros(v.aval.shape, v.aval.dtype) for v in self.backward.inputs[len(residuals):]]
            self._bw = _executable(backend, self.backward, list(residuals) + self._zero_cts, n)
        exe = self._bw
        arrays = list(residuals) + list(self._zero_cts)
        for k, j in self.ct_of.items():
            if k < self.seedable and k in seeds:
                arrays[len(residuals) + j] = seeds[k]
        if backend == "jax":            # its arguments are read at each replay: rebinding is free
            for i, arr in enumerate(arrays):
                exe.rebind(i, arr)
            return exe
        changed = False
        for i, arr in enumerate(arrays):
            if exe.slots[exe.input_slots[i]] is not arr:
                exe.slots[exe.input_slots[i]] = arr
                changed = True
        if changed:
            exe._link()
        return exe

    def jvp_exe(self, n):
        if self._jvp is None:
            self._jvp_prog, _ = jvp_graph(self.q, self.wrt, force=[True] * len(self.q.outputs))
            arrays = [np.zeros(v.aval.shape, v.aval.dtype) for v in self._jvp_prog.inputs]
            self._jvp = NumpyExecutable(self._jvp_prog, arrays, set(), n)
        return self._jvp


def _executable(backend, prog, arrays, n, names=None):
    if backend == "jax":
        from .backends.jax import JaxExecutable
        return JaxExecutable(prog, arrays, set(), n, names)
    return NumpyExecutable(prog, arrays, set(), n)


def _probe(prog, buffers):
    """`prog` reading `b + probe` wherever it read each buffer b (and returning that), the probes
    its last inputs: (program, {buffer: probe input place}, {buffer: the probed Var})."""
    probes = {b: Var(b.aval) for b in buffers}
    sub = {b: Var(b.aval, b.hint) for b in buffers}
    eqns = []
    for e in prog.eqns:
        eqns.append(e.replace(inputs=[sub.get(a, a) if isinstance(a, Var) else a for a in e.inputs])
                    if any(isinstance(a, Var) and a in sub for a in e.inputs) else e)
        for v in e.outputs:
            if v in probes:
                eqns.append(Eqn(ir.add_any_p, [v, probes[v]], [sub[v]], {}, e.info))
    n = len(prog.inputs)
    q = prog.replace(inputs=list(prog.inputs) + [probes[b] for b in buffers], eqns=eqns,
                     outputs=[sub.get(a, a) if isinstance(a, Var) else a for a in prog.outputs])
    return q, {b: n + k for k, b in enumerate(buffers)}, sub


class RecordedExecutable:
    """Runs the forward half for a record=True graph, as the graph's executable: array_of answers
    for the graph's own Vars, and the arguments it writes are written back after each run."""

    def __init__(self, halves: Halves, arrays, written, n, backend="numpy", names=None):
        self.h, self.n, self.backend = halves, n, backend
        self.backend_name = "cpu" if backend == "numpy" else backend
        # a written argument: the forward reads a private copy of it on entry (what the derivatives
        # read, views included), and its value on exit is copied into the caller's array
        self.user = {i: arrays[i] for i, _ in written}
        self.entry = {i: np.array(arrays[i]) for i in self.user}
        arrays = [self.entry.get(i, a) for i, a in enumerate(arrays)]
        probes = [np.zeros(v.aval.shape, v.aval.dtype) for v in halves.q.inputs[len(arrays):]]
        names = list(names or []) + [None] * len(probes)
        self.exe = _executable(backend, halves.forward, list(arrays) + probes, n, names)
        f = halves.forward
        self.var = {v: f.outputs[k] for v, k in halves.index.items()}
        self.var.update(zip(halves.inputs, f.inputs))
        self.written = [(i, self.var[final]) for i, final in written]     # (input place, its Var on exit)

    def __getattr__(self, name):           # prog, plan, source, ...: the forward's
        return getattr(self.exe, name)

    def replay(self, times: int = 1):
        for _ in range(times):
            for i, out in self.written:
                np.copyto(self.entry[i], self.user[i])
            self.exe.replay(1)
            for i, out in self.written:
                np.copyto(self.user[i], self.exe.array_of(out))

    def rebind(self, i, arr):
        if i in self.user:
            self.user[i] = arr
        else:
            self.exe.rebind(i, arr)

    def array_of(self, var):
        if var in self.h.inputs and self.h.inputs.index(var) in self.user:
            return self.user[self.h.inputs.index(var)]
        v = self.var.get(var)
        return None if v is None or not isinstance(v, Var) else self.exe.array_of(v)

    def input_arrays(self):
        """The inputs of the last run as they were on entry."""
        return [self.exe.array_of(v) for v in self.exe.prog.inputs]

    def residual_arrays(self):
        return [self.exe.array_of(r) for r in self.h.residuals]

    def saved_arrays(self):
        """The residuals this run saved: not those that are the caller's own (unwritten) arrays."""
        f = self.h.forward
        given = {v for i, v in enumerate(f.inputs[:len(self.h.inputs)]) if i not in self.user}
        return [self.exe.array_of(r) for r in self.h.residuals if r not in given]


def recorded_executable(g, keep, arrays, n, backend="numpy") -> RecordedExecutable:
    """The executable of record=True graph `g` (its Program staged, `keep` the Vars it shows) on
    `backend`: "numpy", whose stacks of saved turns grow with the turns run, or "jax", whose
    stacks have static sizes: a counted loop's trip count now (a replay checks it), a capped
    loop's cap; a loop with neither, or checkpoints=, is refused at build (jax_lower.py)."""
    t, prog = g._trace, g._program
    names = [e.name for e in t.input_planes]
    written = [(i, final) for i, (v, e) in enumerate(zip(prog.inputs, t.input_planes))
               if (final := t.root.current.get(e, v)) is not v]
    labelled = [t.buffer_value(h) for h in t.buffers if h.label and h.var is not None]
    capacity = lambda trip, e: None                                   # noqa: E731
    if backend == "jax":
        if any(not isinstance(a, np.ndarray) for a in arrays):
            raise NotImplementedError(f"{API}: record=True graphs on backend 'jax' take NumPy arrays (the record "
                                      "is kept on the host), not jax.Arrays; pass NumPy arrays with "
                                      "eagle.Graph(record=True, backend='jax'), or differentiate with "
                                      "eagle_fx.to_jax and jax.grad")
        from .api import loop_capacity
        capacity = lambda trip, e: loop_capacity(API, trip, e, list(prog.inputs), arrays)    # noqa: E731
    halves = Halves(prog, [f for _, f in written] + labelled, list(keep) + list(t.root.current.values()), labelled,
                    capacity, g._checkpoints)
    if backend == "jax":
        _refuse_revolve(halves.backward)     # now, not at the first reverse, where the backward is compiled
    return RecordedExecutable(halves, arrays, written, n, backend, names)


def _refuse_revolve(prog):
    from .backends.jax_lower import LoweringError
    for e in prog.eqns:
        if e.prim is ir.revolve_p:
            raise LoweringError(f"{API}: the reverse pass through the device loop at {e.info.where} is checkpointed "
                                "(checkpoints=), which runs on the NumPy backend; on backend='jax', record without "
                                "checkpoints (its stacks hold the loop's cap or trip count)")
    for q in prog.subprograms():
        _refuse_revolve(q)
