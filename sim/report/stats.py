"""Statistics the report and the seed aggregation share: the 95% confidence half-width of a mean
(Student's t, ``scipy.stats.t``)."""

from __future__ import annotations

import math

import numpy as np


def ci95(values: np.ndarray) -> float:
    """95% confidence half-width of the mean of ``values`` (0 for one value)."""
    from scipy.stats import t

    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    if len(v) < 2:
        return 0.0
    return float(t.ppf(0.975, len(v) - 1) * v.std(ddof=1) / math.sqrt(len(v)))
