"""Timing for the scripts under bench/: medians of repeats, in this process (the scripts report
ratios of these, never one absolute time)."""
import timeit

import numpy as np


def median_time(fn, number, repeat=7):
    """Seconds per call: the median of `repeat` timings of `number` calls, after one call to warm up."""
    fn()
    return float(np.median(timeit.repeat(fn, number=number, repeat=repeat))) / number


def median_ratio(num, den, number, repeat):
    """median time of num / median time of den, after one call of each to warm up; the repeats are
    interleaved, so that a load that comes and goes on the machine falls on both alike."""
    num(), den()
    tn, td = [], []
    for _ in range(repeat):
        tn.append(timeit.timeit(num, number=number))
        td.append(timeit.timeit(den, number=number))
    return float(np.median(tn) / np.median(td))
