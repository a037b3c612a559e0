"""Percentiles of a benchmark's timings (linear interpolation between the closest ranks, numpy's default)."""

from __future__ import annotations

import numpy as np


def percentile(values: list[float], q: float, digits: int = 4) -> float:
    """The q-th percentile (0-100) of `values`, rounded to `digits`; 0.0 when there are none."""
    return round(float(np.percentile(values, q)), digits) if values else 0.0
