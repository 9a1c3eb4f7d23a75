"""Cross-sample reductions: one value for all samples (hawk.sum, hawk.max, hawk.min, hawk.mean).

A one-cell value (a Param, a one-cell plane broadcast over the samples, a number) stands for the
same value in every sample, so a reduction over the samples sees n copies of it: its sum is n
times it, its mean, max and min are itself. Those are written here, as ordinary operations on the
sample count, so every interpreter (NumPy, CUDA, derivatives) gets them without a rule of its own;
the sample_* primitives only ever reduce per-sample values.
"""
from __future__ import annotations

import numpy as np

from .core import SAMPLE, Tracer, abstract_eval, literal_aval
from .prims import P, convert_p, sample_count_p
from .trace import current_kernel_trace


def _uniform_trace(x):
    """The trace a one-cell x is reduced in, or None when x is per-sample or nothing traces it."""
    if isinstance(x, Tracer):
        return None if x.aval.kind == SAMPLE else x.trace
    if isinstance(x, (bool, int, float, np.number)):
        return current_kernel_trace()
    return None


def _aval(x):
    return x.aval if isinstance(x, Tracer) else literal_aval(x)


def _as(x, dtype, trace):
    return x if _aval(x).dtype == dtype and not _aval(x).weak else trace.process(convert_p, [x], {"dtype": dtype})[0]


def _count(x, trace):
    """n, as a weak Python float. Its operand is only an anchor to the trace (for a number: the
    kernel's first input), so that derivatives re-tracing the body count in the body too."""
    if not isinstance(x, Tracer) and trace.inputs:
        x = trace.tracer_type(trace, trace.inputs[0])
    return trace.process(sample_count_p, [x], {})[0]


def sum(x):
    """The sum over all samples (a bool counts its True samples)."""
    trace = _uniform_trace(x)
    if trace is None:
        return P["sample_sum"].bind(x)
    count = _count(x, trace)
    aval = _aval(x)
    if aval.dtype.kind == "f":
        return x * count                # weak count: float32 stays float32, a weak number stays weak
    dt = abstract_eval[P["sample_sum"]](aval)[0].dtype        # ints and bools sum as NumPy's np.sum
    return _as(x, dt, trace) * _as(count, dt, trace)


def max(x):
    """The largest value over all samples."""
    return x if _uniform_trace(x) is not None else P["sample_max"].bind(x)


def min(x):
    """The smallest value over all samples."""
    return x if _uniform_trace(x) is not None else P["sample_min"].bind(x)


def mean(x):
    """The mean over all samples."""
    trace = _uniform_trace(x)
    if trace is None:
        return P["sample_mean"].bind(x)
    if _aval(x).dtype.kind == "f":
        return x
    return _as(x, abstract_eval[P["sample_mean"]](_aval(x))[0].dtype, trace)
