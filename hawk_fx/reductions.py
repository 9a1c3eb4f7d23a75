"""Cross-sample reductions: one value for all samples (hawk.sum, hawk.max, hawk.min, hawk.mean)."""
from __future__ import annotations

from .prims import P


def sum(x):
    """The sum over all samples (a bool counts its True samples)."""
    return P["sample_sum"].bind(x)


def max(x):
    """The largest value over all samples."""
    return P["sample_max"].bind(x)


def min(x):
    """The smallest value over all samples."""
    return P["sample_min"].bind(x)


def mean(x):
    """The mean over all samples."""
    return P["sample_mean"].bind(x)
