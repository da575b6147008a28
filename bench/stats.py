"""Percentiles for the benchmarks' tables."""


def pct(values, p):
    """The `p`th percentile of `values`, interpolated between the nearest two."""
    ordered = sorted(values)
    k = (len(ordered) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def summary(ms):
    """p50, p95, p99, min and max of `ms`, as a table's columns."""
    return f"{pct(ms, 50):7.1f} {pct(ms, 95):7.1f} {pct(ms, 99):7.1f} {min(ms):7.1f} {max(ms):7.1f}"
