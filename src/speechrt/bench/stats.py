"""Latency statistics as the seeds' tables define them."""

from __future__ import annotations

import numpy as np

PERCENTILES = (50, 90, 95, 99)


def summarize(latencies_s: list[float]) -> dict[str, float]:
    """mean, std and empirical percentiles of per-batch latencies, in seconds.

    The p-th percentile is the smallest latency with at least p % of the runs at or below it
    (DLE test_infer.py's "confidence interval": the max of the lowest p fraction of the runs).
    """
    x = np.asarray(latencies_s, dtype=np.float64)
    if x.size == 0:
        raise ValueError("no measurements")
    out = {"mean": float(x.mean()), "std": float(x.std()), "min": float(x.min())}
    for p in PERCENTILES:
        out[f"p{p}"] = float(np.percentile(x, p, method="inverted_cdf"))
    out["max"] = float(x.max())
    return out
