"""Gradients of graphs: `Graph(record=True)` records a run; `reverse` runs its backward half.

    gr = model(x, y, record=True); gr()
    grads = eagle_fx.diff.reverse(gr.record, {"result": ones}, wrt=("x",))

Names are the arrays that enter and leave the graph: builder arguments (`wrt='y'` is y's value
on entry; seeding `'y'` seeds its value on exit when a kernel writes it), `'result'` (a tree
result takes a seed tree of the same structure) and `buffer=` labels.
"""
from __future__ import annotations

import numpy as np

from hawk_fx.cuda_runtime import is_device_array
from hawk_fx.diff import match_tree
from hawk_fx.tree import tree_flatten, tree_unflatten



class Record:
    """What the last launch of a record=True graph saved: the residuals of its vjp's forward half
    (and its inputs on entry, for forward mode). Valid until the graph launches again; `copy()`
    keeps one for later."""

    def __init__(self, graph, generation, residuals=None, inputs=None, last=None):
        self.graph, self.generation = graph, generation
        self._residuals, self._inputs, self._last = residuals, inputs, last

    def copy(self) -> "Record":
        _check_fresh(self, "eagle.diff.Record.copy")
        return Record(self.graph, None, [r.copy() for r in self.residuals()],
                      [x.copy() for x in self.inputs()], self.last_sites())

    def last_sites(self):
        """Which write of each buffer label ran last: what the label means in this run's gradients."""
        return self._last if self._last is not None else self.graph.executable.last_sites()

    def residuals(self):
        return self._residuals if self._residuals is not None else self.graph.executable.residual_arrays()

    def inputs(self):
        return self._inputs if self._inputs is not None else self.graph.executable.input_arrays()

    @property
    def nbytes(self) -> int:
        """Bytes this run saved for the reverse: its residuals, less the caller's arrays the graph
        reads and does not write (read where they lie; a copy() holds copies of them too)."""
        saved = self._residuals if self._residuals is not None else self.graph.executable.saved_arrays()
        return sum(r.nbytes for r in saved)

    def __repr__(self):
        return f"<eagle_fx.diff.Record of {self.graph!r}, {self.nbytes} bytes saved>"


def _check_fresh(record, api):
    g = record.graph
    if record.generation is not None and record.generation != g.generation:
        raise RuntimeError(f"{api}: this record was overwritten by a later launch of the graph; reverse right after "
                           "the launch it describes, or keep it with `rec = g.record.copy()`")


def reverse(record: Record, seeds: dict, wrt=None) -> dict:
    """Reverse-mode gradients of a recorded run: {name in wrt: d(sum of seed * output)/d(name)}."""
    api = "eagle.diff.reverse"
    if not isinstance(record, Record):
        raise TypeError(f"{api}: takes g.record of a graph built with record=True, got {type(record).__name__}")
    g = record.graph
    names = g.gradient_names()
    args = [n for n, (kind, _) in names.items() if kind in ("arg", "written")]
    if wrt is None:
        raise ValueError(f"{api}: a builder graph has no default gradients: pass wrt=(...) naming the arguments "
                         f"it could take: {', '.join(args)}")
    wrt = (wrt,) if isinstance(wrt, str) else tuple(wrt)
    _check_fresh(record, api)
    unread = g.unread_args                      # arguments no node reads: their gradient is zero (as in JAX)
    for w in wrt:
        if w not in unread and (w not in names or names[w][0] == "result"):
            raise KeyError(_unknown(api, w, [*(n for n in names if n != "result"), *unread]))
    _top_level_buffers(api, g, names, list(wrt) + [k for k in seeds if k != "result"])
    h = g.executable.h
    _refuse_loop_gaps(api, h, names, wrt)
    ct: dict = {}                                # place among the recorded outputs -> seed
    for key, seed in seeds.items():
        if key == "result":
            want_leaves, want_tree = g.result_vars()
            leaves = match_tree(seed, want_tree)        # dicts by key, in any order
            if leaves is None:
                tree = tree_flatten(seed, is_leaf=lambda x: isinstance(x, np.ndarray))[1]
                raise ValueError(f"{api}: the 'result' seed has structure {tree}; the result is {want_tree}")
            for v, s in zip(want_leaves, leaves):
                _seed(ct, h, v, s, api, "result")
            continue
        if key not in names:
            raise KeyError(_unknown(api, key))
        kind, (v_in, v_out) = names[key]
        _seed(ct, h, v_out, seed, api, key)
    exe = h.backward_exe(record.residuals(), ct, g.executable.n, g.executable.backend_entry,
                         g.executable.runtime)
    exe.replay(1)
    out = {}
    for w in wrt:
        if w in unread:
            out[w] = _zeros(unread[w].shape, unread[w].dtype)
            continue
        kind, (v_in, _) = names[w]
        place = h.probe_place(v_in, record.last_sites()) if kind == "buffer" else h.inputs.index(v_in)
        j = h.grad_of.get(place)
        out[w] = _zeros(v_in.aval.shape, v_in.aval.dtype) if j is None else _fresh(exe.array_of(h.backward.outputs[j]))
    return out


def _fresh(a):
    """A copy the caller owns, on the device the backward ran on."""
    return a.copy() if is_device_array(a) else np.array(a)


def _zeros(shape, dtype):
    """The gradient of an input nothing differentiable reads (a float zero for an integer input)."""
    return np.zeros(shape, dtype if np.dtype(dtype).kind == "f" else np.float64)


def _seed(ct, h, v, s, api, name):
    s = s if is_device_array(s) else np.asarray(s)         # a CuPy seed for a record on the GPU stays there
    if s.shape != v.aval.shape or s.dtype != v.aval.dtype:
        raise ValueError(f"{api}: the seed for {name!r} has shape {s.shape} and dtype {s.dtype}; {name!r} is "
                         f"{v.aval.shape} {v.aval.dtype}: pass an array of that shape and dtype")
    k = h.index.get(v)
    if k is None or k not in h.ct_of:
        return                                   # no float output there: nothing flows from it
    ct[k] = (s.copy() if is_device_array(s) else np.ascontiguousarray(s)) if k not in ct else ct[k] + s


def _top_level_buffers(api, g, names, keys):
    prog = g.program
    top = set(prog.inputs) | {v for e in prog.eqns for v in e.outputs}
    for k in keys:
        if k in names and names[k][0] == "buffer" and names[k][1][0] not in top:
            raise ValueError(f"{api}: {k!r} is a buffer= made inside a device if/loop body, a value of one arm or "
                             "turn, not of the run: gradients take top-level buffers; carry the value out of the "
                             f"construct and give it its buffer there (`{k} = kernel(..., buffer=True)` after it)")


def _refuse_loop_gaps(api, h, names, keys):
    """A label whose last write may be in a device loop that reads it back in its body: those uses
    would not be counted (the loop's writes are one site, at its end), so refuse rather than answer."""
    for k in keys:
        if k in names and names[k][0] == "buffer" and names[k][1][0] in h.gaps:
            raise ValueError(f"{api}: {k!r} is rebound at {h.gaps[names[k][1][0]]} in a device loop that reads in its "
                             "body the value it writes there; derivatives with respect to that value would miss "
                             f"those uses. Take them with respect to the arguments (wrt=), or give {k!r} to a write "
                             "the loop does not read back (its own buffer=, after the loop)")


def _unknown(api, name, known=None):
    listed = f" (this graph's: {', '.join(known)})" if known else ""
    return (f"{api}: {name!r} is not a builder argument, 'result' or a buffer= label{listed}: gradients flow through "
            "the arrays that enter and leave the graph. For a temporary, give it a dedicated buffer: "
            f"`{name} = kernel(..., buffer=True)` (or pass an array), then use that name")


def forward(record: Record, tangents: dict, of=None) -> dict:
    """Forward-mode derivatives of a recorded run: {name in of: tangent of that output}.

    `tangents` maps builder arguments (their values on entry) and buffer labels to tangents;
    `of` names outputs: 'result' (a tree), arguments a kernel writes (their values on exit), labels."""
    api = "eagle.diff.forward"
    if not isinstance(record, Record):
        raise TypeError(f"{api}: takes g.record of a graph built with record=True, got {type(record).__name__}")
    g = record.graph
    names = g.gradient_names()
    if of is None:
        of = ("result",) if g.has_result else tuple(n for n, (k, _) in names.items() if k == "written")
    of = (of,) if isinstance(of, str) else tuple(of)
    _check_fresh(record, api)
    h = g.executable.h
    _refuse_loop_gaps(api, h, names, tangents)
    tan: dict = {}                               # place among the recorded inputs -> tangent
    for key, t in tangents.items():
        if key not in g.unread_args and (key not in names or key == "result"):
            raise KeyError(_unknown(api, key))
        want = g.unread_args[key] if key in g.unread_args else names[key][1][0].aval
        t = np.asarray(t)
        if t.shape != want.shape or t.dtype != want.dtype:
            raise ValueError(f"{api}: the tangent for {key!r} has shape {t.shape} and dtype {t.dtype}; {key!r} is "
                             f"{want.shape} {want.dtype}: pass an array of that shape and dtype")
        if key in g.unread_args:
            continue                             # no node reads it: its tangent moves nothing
        kind, (v_in, _) = names[key]
        tan[h.probe_place(v_in, record.last_sites()) if kind == "buffer" else h.inputs.index(v_in)] = t
    for o in of:
        if o not in names:
            raise KeyError(_unknown(api, o))
    exe = h.jvp_exe(g.executable.n)
    prog = h._jvp_prog
    primals = record.inputs()
    nq = len(h.q.inputs)
    for i, arr in enumerate(primals):
        np.copyto(exe.array_of(prog.inputs[i]), arr)
    for k, j in h.grad_of.items():
        arr = exe.array_of(prog.inputs[nq + j])
        if k in tan:
            np.copyto(arr, tan[k])
        else:
            arr.fill(0)
    exe.replay(1)
    t_out = {}
    nout = len(h.q.outputs)
    flagged = [k for k, a in enumerate(h.q.outputs) if a.aval.dtype.kind in "fc"]
    for j, k in enumerate(flagged):
        t_out[k] = exe.array_of(prog.outputs[nout + j])
    out = {}
    for o in of:
        if o == "result":
            leaves, tree = g.result_vars()
            out[o] = tree_unflatten(tree, [_tangent(t_out, h, v) for v in leaves])
        else:
            out[o] = _tangent(t_out, h, names[o][1][1])
    return out


def _tangent(t_out, h, v):
    t = t_out.get(h.index.get(v))
    return _zeros(v.aval.shape, v.aval.dtype) if t is None else np.array(t)
