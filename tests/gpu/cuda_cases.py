"""Builder cases run on two backends and compared: the NumPy backend (the reference) against a CUDA
backend, through the Graph verbs. Shared by tests/test_cuda_wiring.py (the "fake-cuda" backend:
the lowering interpreted by the recording fake, no GPU) and tests/gpu (CuPy arrays on a device).

A Case is a builder, a function making its arguments (NumPy), and steps. Before each replay a step
may set one-cell arguments (`cells={index: value}`) and bind arrays (`bind={name: array}`) on both
graphs; the replay verb cycles through g(), g(2), launch() then result, enqueue()+synchronize()
then result. After each replay the result trees, and every array argument, must agree.

A Device says how the CUDA side gets its arrays: `put` (a NumPy array -> the backend's array),
`get` (back to NumPy), `build(builder, args)` (with the backend selected) and the repr suffix.
"""
from __future__ import annotations

import os
import sys
import warnings
from dataclasses import dataclass, field

import numpy as np

import hawk_fx as hawk
from hawk_fx import Mutable, Param, Scalar, Vector
from hawk_fx import math as hm

_TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)

import tour_builders as tour               # noqa: E402  the builder tour's builders (those of eagle_fx/tour.py)
import tour_kernels as kernels             # noqa: E402  the builder tour's kernels
import test_cuda_lowering as lowering      # noqa: E402  the lowering tests' builders: keep with `mine` passed in, ...
import test_graph_control as control      # noqa: E402
import test_graph_running as running      # noqa: E402

cell = kernels.cell
VERBS = ("call", "call_n", "launch", "enqueue")


@dataclass
class Case:
    name: str
    builder: object
    args: object                          # () -> tuple of builder arguments (NumPy arrays and Python values)
    steps: list = field(default_factory=lambda: [{}, {}, {}, {}])
    kwargs: dict = field(default_factory=dict)


def _f(*v):
    return np.array(v, dtype=np.float64)


def _cells(*pairs):
    """Steps setting cells: _cells({1: 0, 2: 1}, ...)."""
    return [{"cells": p} for p in pairs]


CASES = [
    # the builder tour
    Case("tour.first", tour.first, lambda: (np.arange(4.0),)),
    Case("tour.forks", tour.forks, lambda: (np.arange(4.0),)),
    Case("tour.choose", tour.choose, lambda: (np.arange(4.0), cell(0), cell(0), True),
         _cells({1: 1}, {1: 0, 2: 1}, {1: 0, 2: 0}, {1: 5, 2: 5}, {1: 0, 2: 7})),
    Case("tour.capped", tour.capped, lambda: (np.full(4, 1.0), cell(1)),
         _cells({1: 1}, {1: 0}, {1: 1}, {1: 1}) + [{"cells": {1: 1}, "bind": {"x": _f(30.0, 1.0, 200.0, 0.0)}}]),
    Case("tour.counted", tour.counted, lambda: (np.zeros(4), cell(0)),
         _cells({1: 0}, {1: 1}, {1: 3}, {1: 7})),
    Case("tour.early_exit", tour.early_exit, lambda: (np.zeros(4), cell(1), cell(0)),
         _cells({1: 1, 2: 0}, {1: 0, 2: 0}, {1: 1, 2: 1}, {1: 1, 2: 0})),
    Case("tour.skipping", tour.skipping, lambda: (np.full(4, 2.0), cell(1), cell(0)),
         _cells({1: 1, 2: 0}, {1: 1, 2: 1}, {1: 0, 2: 0}, {1: 1, 2: 0})),
    Case("tour.chooser", tour.chooser, lambda: (np.full(4, 3.0), cell(0)),
         _cells({1: 0}, {1: 1}, {1: 2}, {1: 5}, {1: 0})),
    Case("tour.keep", lowering.keep, lambda: (np.arange(4.0), np.zeros(4)),
         [{}, {"bind": {"x": _f(4.0, -1.0, 0.5, 2.0)}}, {}, {"bind": {"mine": np.zeros(4)}}]),
    Case("tour.void", tour.void, lambda: (np.arange(4.0), np.zeros(4))),
    Case("tour.peaked", lowering.peaked, lambda: (np.zeros(4), cell(1)),
         _cells({1: 1}, {1: 0}, {1: 1}, {1: 1})),
    Case("tour.turns", lowering.turns, lambda: (np.zeros(4), cell(0)), _cells({1: 0}, {1: 2}, {1: 5}, {1: 1})),
    Case("tour.whole", tour.whole, lambda: (np.arange(8.0), cell(1), np.zeros(8)),
         _cells({1: 1}, {1: 0}, {1: 1}, {1: 1})),
    Case("tour.model", tour.model, lambda: (np.arange(4.0), np.zeros(4))),
    # combinations (tests/test_graph_control.py)
    Case("control.elif_loop", control.elif_loop, lambda: (_f(1.0, 3.0, 7.0, 60.0), cell(0), cell(0)),
         _cells({1: 1, 2: 0}, {1: 0, 2: 1}, {1: 0, 2: 0}, {1: 1, 2: 1}, {1: 0, 2: 1}, {1: 0, 2: 5})),
    Case("control.match_in_counted", control.match_in_counted, lambda: (_f(-1.5, 0.0, 0.25, 2.0), cell(0), cell(0)),
         _cells(*[{1: n, 2: s} for n in (0, 1, 2, 5) for s in (0, 3, 7, 1)])),
    Case("control.match_no_default", control.match_no_default, lambda: (_f(1.0, 2.0), cell(0)),
         _cells({1: 0}, {1: 1}, {1: 4}, {1: 2}, {1: 1})),
    Case("control.fork_of_blocks", control.fork_of_blocks, lambda: (_f(0.5, 1.0, 4.0, 9.0), cell(0), cell(0), cell(0)),
         _cells({1: 1, 2: 1, 3: 0}, {1: 0, 2: 1, 3: 2}, {1: 1, 2: 0, 3: 3}, {1: 0, 2: 0, 3: 1}, {1: 1, 2: 1, 3: 4})),
    Case("control.jumps", control.jumps, lambda: (_f(0.0, 0.5, 1.0), cell(1), _f(1000.0)),
         _cells({1: 1, 2: 1000.0}, {1: 1, 2: 10.0}, {1: 1, 2: 3.0}, {1: 0, 2: 10.0}, {1: 1, 2: 0.5},
                {1: 1, 2: 100.0})),
    Case("control.late_break", control.late_break, lambda: (_f(0.0, 3.0, 250.0), cell(1)),
         [{"cells": {1: 1}}, {"cells": {1: 1}, "bind": {"x": _f(40.0, 60.0, 7.0)}}, {"cells": {1: 1}}]),
    Case("control.nested_forks", control.nested_forks, lambda: (_f(0.0, 1.0, -2.0, 3.5),),
         [{}, {"bind": {"x": _f(5.0, -1.0, 0.25, 8.0)}}, {}]),
    Case("control.nested_loops", control.nested_loops, lambda: (_f(0.0, 3.0, 50.0, 200.0), cell(0), cell(0), cell(0)),
         _cells({1: 0, 2: 0}, {1: 1, 2: 0}, {1: 1, 2: 2}, {1: 3, 2: 1}, {1: 2, 2: 4}, {1: 4, 2: 0})),
    Case("control.triangle", control.triangle, lambda: (_f(1.0, -0.5, 2.0), cell(0)),
         _cells({1: 0}, {1: 1}, {1: 2}, {1: 5})),
    Case("control.python_flow", control.python_flow, lambda: (_f(0.0, 0.5, -1.0), True, (2.0, 0.5, 3.0), 2)),
    Case("control.collect", control.collect, lambda: (_f(0.0, 10.0), 3)),
    Case("control.python_cond_device_body", control.python_cond_device_body, lambda: (_f(1.0, 2.0), cell(1), 3),
         _cells({1: 1}, {1: 0}, {1: 1}, {1: 0})),
    Case("control.while_break_continue", control.while_break_continue,
         lambda: (np.zeros(3), cell(1), cell(0), cell(0)),
         [{"cells": {1: 1}, "bind": {"x": x}} for x in (np.zeros(3), _f(0.0, 0.3, -4.0), _f(5.0, 6.0, 7.0),
                                                         _f(-1.0, 0.0, 0.1))] + _cells({1: 0})),
    Case("control.logic", control.logic, lambda: (_f(1.0, -2.0, 3.0), cell(0), cell(0), cell(0)),
         _cells(*[{1: a, 2: b, 3: c} for a in (0, 1, 7) for b in (0, 1) for c in (0, 2)])),
    Case("control.guard_or", control.guard_or, lambda: (_f(0.0, 1.0), cell(0), cell(0)),
         [{"cells": {1: a, 2: b}, "bind": {"x": x}} for x in (_f(0.0, 1.0), _f(-3.0, 0.0), _f(20.0, -20.0))
          for a, b in ((0, 0), (1, 0), (0, 1))]),
    # buffers, result trees, verbs, bind (tests/test_graph_running.py)
    Case("running.keep", running.keep, lambda: (_f(0.0, 1.5, -2.0, 3.0), np.zeros(4)),
         [{}, {"bind": {"x": _f(4.0, -1.0, 0.25, 10.0)}}, {}, {}]),
    Case("running.counter", running.counter, lambda: (_f(0.0, 1.0, 2.5), np.zeros(3))),
    Case("running.bindable", running.bindable, lambda: (_f(1.0, 2.0, 3.0), np.zeros(3), cell(1), cell(2)),
         [{}, {"bind": {"x": _f(-0.5, 0.25, 3.0), "y": np.full(3, np.nan), "flag": cell(0), "n": cell(3)}},
          {"cells": {2: 1}}, {"bind": {"flag": cell(1), "n": cell(0)}}, {"cells": {3: 5}}]),
]


# kernels called eagerly

@hawk.kernel
def norm3(v: Vector[3], w: Param) -> Scalar:
    return w * hm.sqrt(v[0] * v[0] + v[1] * v[1] + v[2] * v[2])


@hawk.kernel
def centre(x: Scalar) -> Scalar:             # two passes: the mean, then every sample
    return x - hawk.mean(x)


@hawk.kernel
def pair_out(x: Scalar, s: Mutable[Scalar]):
    s = s + x
    return x * 2.0, hawk.sum(x)


_rng = np.random.default_rng(3)
_x, _v = _rng.normal(size=7), _rng.normal(size=(3, 7))
EAGER = [   # (kernel, arguments): eager calls on device arrays against the NumPy call
    (kernels.inc, (_x,)),
    (kernels.affine, (_x, 2.0, -1.0)),
    (kernels.affine, (_x, np.array([0.5]), np.float64(3.0))),   # a one-cell Param array, a NumPy scalar
    (kernels.below, (_x, 0.25, cell(9))),
    (lowering.peak_below, (_x, 10.0, cell(0))),
    (kernels.accumulate, (_x, np.zeros(7))),
    (norm3, (_v, 1.5)),
    (centre, (_x,)),
    (pair_out, (_x, np.ones(7))),
]
EAGER_HOST = {2: (1,)}     # EAGER index -> the arguments left as NumPy arrays (a Param cell: uploaded)


def eager_args(k, put):
    """EAGER[k]'s kernel, reference arguments (NumPy copies) and device arguments (put(copy))."""
    kern, args = EAGER[k]
    ref = [np.array(a, copy=True) if isinstance(a, np.ndarray) else a for a in args]
    host = EAGER_HOST.get(k, ())
    dev = [(np.array(a, copy=True) if i in host else put(np.array(a, copy=True))) if isinstance(a, np.ndarray) else a
           for i, a in enumerate(args)]
    return kern, ref, dev


class NumpyDevice:
    """The reference: the builder on NumPy arrays, the NumPy backend."""
    suffix = "cpu>"

    @staticmethod
    def put(a):
        return np.array(a, copy=True) if isinstance(a, np.ndarray) else a

    @staticmethod
    def get(a):
        return a

    @staticmethod
    def set_cell(a, v):
        a[0] = v

    @staticmethod
    def build(builder, args, kwargs):
        return builder(*args, **kwargs)


def build_quietly(device, case, args):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")          # uncapped device loops warn at build
        return device.build(case.builder, args, case.kwargs)


def assert_same(got, want, device, what):
    if isinstance(want, dict):
        assert isinstance(got, dict) and list(got) == list(want), what
        for k in want:
            assert_same(got[k], want[k], device, f"{what}[{k!r}]")
    elif isinstance(want, (tuple, list)):
        assert type(got) is type(want) and len(got) == len(want), what
        for k, (a, b) in enumerate(zip(got, want)):
            assert_same(a, b, device, f"{what}[{k}]")
    elif want is None:
        assert got is None, what
    else:
        g = np.asarray(device.get(got))
        assert g.shape == want.shape and g.dtype == want.dtype, \
            f"{what}: {g.shape} {g.dtype} vs {want.shape} {want.dtype}"
        if want.dtype.kind == "f":
            np.testing.assert_allclose(g, want, rtol=1e-12, atol=0, err_msg=what)
        else:
            np.testing.assert_array_equal(g, want, err_msg=what)


def _replay(g, verb):
    if verb == "call":
        return g()
    if verb == "call_n":
        return g(2)
    if verb == "launch":
        assert g.launch() is g
        return g.result
    assert g.enqueue() is g
    assert g.synchronize() is g
    return g.result


def run_case(case: Case, device, verbs=VERBS):
    """Build `case` on the reference and on `device`, replay its steps on both, compare. Returns
    the device graph."""
    ref_args = [NumpyDevice.put(a) for a in case.args()]
    dev_args = [device.put(a) for a in ref_args]
    g_ref = build_quietly(NumpyDevice, case, ref_args)
    g_dev = build_quietly(device, case, dev_args)
    assert repr(g_dev).endswith(device.suffix), repr(g_dev)
    assert repr(g_dev).rsplit(",", 1)[0] == repr(g_ref).rsplit(",", 1)[0]      # same nodes and stages
    for k, step in enumerate(case.steps):
        for i, v in step.get("cells", {}).items():
            NumpyDevice.set_cell(ref_args[i], v)
            device.set_cell(dev_args[i], v)
        bind = step.get("bind")
        if bind:
            names = list(case.builder.signature.parameters)
            ref_new = {n: np.array(a, copy=True) for n, a in bind.items()}
            dev_new = {n: device.put(a) for n, a in ref_new.items()}
            assert g_ref.bind(**ref_new) is g_ref
            assert g_dev.bind(**dev_new) is g_dev
            for n in bind:
                ref_args[names.index(n)], dev_args[names.index(n)] = ref_new[n], dev_new[n]
        verb = verbs[k % len(verbs)]
        want = _replay(g_ref, verb)
        got = _replay(g_dev, verb)
        where = f"{case.name} step {k} ({verb})"
        assert_same(got, want, device, where + " result")
        for i, (a, b) in enumerate(zip(dev_args, ref_args)):
            if isinstance(b, np.ndarray):
                assert_same(a, b, device, f"{where} argument {i}")
    return g_dev
