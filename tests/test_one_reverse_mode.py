"""`eagle_fx.diff.reverse` over a recorded run and `eagle_fx.vjp` of the plain builder are one
reverse mode: on every control-flow form they agree with each other and with central finite
differences of the plain graph (an oracle that runs no derivative code)."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import eagle_fx as eagle
from test_grad_graph import (capped, choose, chooser, counted, early_exit, fd_grads, forks, keep, mutating,
                             nested, skipping, whole)
from tour_kernels import below, cell, dbl

pytestmark = pytest.mark.usefixtures("backend_heavy")     # on numpy; on jax too with -m slow (compiles)

X3 = np.array([0.3, -0.7, 1.1])

# (builder, its arguments by name, the float arguments to differentiate)
CASES = {
    "cond": (choose, {"x": X3, "flag": cell(1), "which": cell(0)}, ["x"]),
    "cond, other arm": (choose, {"x": X3, "flag": cell(0), "which": cell(0)}, ["x"]),
    "switch": (chooser, {"x": X3, "sel": cell(2)}, ["x"]),
    "switch, default": (chooser, {"x": X3, "sel": cell(7)}, ["x"]),
    "capped loop": (capped, {"x": np.array([0.5, 1.0, 1.5]), "c": np.array([1.3]), "flag": cell(1)}, ["x", "c"]),
    "counted loop": (counted, {"x": X3, "n": cell(4)}, ["x"]),
    "break mid-body": (early_exit, {"x": X3, "flag": cell(1), "done": cell(0)}, ["x"]),
    "continue": (skipping, {"x": X3, "flag": cell(1), "skip": cell(0)}, ["x"]),
    "nested loops": (nested, {"x": np.array([0.1, 0.2, 0.3]), "a": np.array([0.9]), "flag": cell(1),
                              "n": cell(2)}, ["x", "a"]),
    "forks": (forks, {"x": X3}, ["x"]),
    "buffers": (keep, {"x": np.array([0.3, -0.7, 1.1, 0.4])}, ["x"]),
    "written argument": (mutating, {"x": X3, "y": np.array([1.0, 2.0, 0.5])}, ["x", "y"]),
    "everything": (whole, {"x": np.arange(1.0, 9.0) / 8, "flag": cell(1), "y": np.zeros(8)}, ["x"]),
}


def _seed_like(out, rng):
    if isinstance(out, dict):
        return {k: _seed_like(v, rng) for k, v in out.items()}
    if isinstance(out, (tuple, list)):
        return type(out)(_seed_like(v, rng) for v in out)
    return rng.normal(size=np.shape(out))


@pytest.mark.parametrize("form", list(CASES))
def test_reverse_of_a_record_equals_vjp_and_finite_differences(form):
    builder, args, wrt = CASES[form]
    rng = np.random.default_rng(len(form))
    fresh = lambda: {k: v.copy() for k, v in args.items()}         # noqa: E731
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gr = builder(**fresh(), record=True)
        out = gr()
        seed = _seed_like(out, rng)
        got = eagle.diff.reverse(gr.record, {"result": seed}, wrt=tuple(wrt))
        names = list(args)
        _, pull = eagle.vjp(builder, *fresh().values())
        cts = pull(seed)
        fd = fd_grads(builder, fresh(), {"result": seed}, wrt)
    for w in wrt:
        via_vjp = cts[names.index(w)]
        scale = max(1.0, float(np.max(np.abs(fd[w]))))
        np.testing.assert_allclose(got[w], via_vjp, rtol=1e-12, atol=1e-12 * scale, err_msg=f"{form}: d/d{w}")
        np.testing.assert_allclose(got[w], fd[w], rtol=1e-6, atol=1e-6 * scale, err_msg=f"{form}: d/d{w} vs fd")


def test_an_uncapped_loop_is_refused_by_both():
    @eagle.Graph.builder
    def uncapped(x, flag, record=False):
        g = eagle.Graph(record=record)
        while flag:
            x = dbl(x)
            below(x, 10.0, flag)
        g.result = x
        return g

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ValueError, match="uncapped"):
            uncapped(np.ones(3), cell(1), record=True)
        with pytest.raises(ValueError, match="uncapped"):
            eagle.vjp(uncapped, np.ones(3), cell(1))
