"""`hawk_fx.all_done(done)`: the guard of a graph loop that runs until every sample is marked done."""
from __future__ import annotations

from . import math as hm
from .kernel import kernel
from .reductions import sum as sample_sum
from .roles import Scalar


@kernel
def all_done(done: Scalar):
    """A one-cell uint32: 1 when every sample's mark is set (and over no samples), else 0.
    In a builder loop: `if hawk_fx.all_done(done): break`."""
    # the marks still clear, counted as bools: one pass, no branch per sample (NumPy counts them
    # with count_nonzero)
    return hm.uint32(sample_sum(hm.logical_not(done)) == 0)
