"""Slowdown from memory-bandwidth contention, used to inflate the CPU cost kappa.

Co-located workloads that saturate memory bandwidth make every tuple cost more CPU.
The model is a hinge on memory-bandwidth utilization ``u`` (0..1):

    slowdown(u) = 1 + slope * max(0, u - threshold)

fitted from history pairs (u, kappa): for each candidate threshold, the baseline
kappa is the median of kappa at utilizations below the threshold, the observed
slowdown is ``kappa / baseline``, and the slope is the least-squares fit through the
hinge (clamped at >= 0, contention never speeds work up). The threshold with the
smallest squared error wins. When the node has no bandwidth counter (``u`` is None)
the slowdown is 1: an unavailable counter is never treated as a measurement.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dsched import validate as v


@dataclass(frozen=True)
class InterferenceModel:
    threshold: float = 1.0
    slope: float = 0.0
    max_slowdown: float = 10.0

    def __post_init__(self) -> None:
        t = v.finite(self.threshold, "threshold")
        if not 0.0 <= t <= 1.0:
            raise ValueError(f"threshold must be in [0, 1], got {t}")
        v.non_negative(self.slope, "slope")
        if v.finite(self.max_slowdown, "max_slowdown") < 1.0:
            raise ValueError(f"max_slowdown must be >= 1, got {self.max_slowdown}")

    def slowdown(self, mbw_util: float | None) -> float:
        """Factor >= 1 by which CPU per tuple grows at utilization ``mbw_util``."""
        if mbw_util is None:
            return 1.0
        u = v.non_negative(mbw_util, "mbw_util")
        return float(min(1.0 + self.slope * max(0.0, u - self.threshold), self.max_slowdown))

    def inflate(self, kappa: float, mbw_util: float | None) -> float:
        """kappa inflated by the slowdown at ``mbw_util``."""
        return v.non_negative(kappa, "kappa") * self.slowdown(mbw_util)


#: The model that never inflates (no contention measured).
NO_INTERFERENCE = InterferenceModel()


def fit_interference(
    mbw_util,
    kappa,
    *,
    thresholds=None,
    min_baseline: int = 3,
    max_slowdown: float = 10.0,
) -> InterferenceModel:
    """Fit the hinge model from history pairs of bandwidth utilization and kappa.

    Needs at least ``min_baseline`` samples below a candidate threshold to define the
    uncontended cost; with no usable candidate it returns :data:`NO_INTERFERENCE`
    (nothing to learn from) rather than guessing.
    """
    u = v.series(mbw_util, "mbw_util")
    k = v.series(kappa, "kappa")
    if u.size != k.size:
        raise ValueError(f"mbw_util and kappa must have the same length, got {u.size} and {k.size}")
    if np.any(u < 0):
        raise ValueError("mbw_util must be >= 0")
    if np.any(k <= 0):
        raise ValueError("kappa must be > 0")
    grid = np.linspace(0.3, 0.95, 27) if thresholds is None else v.series(thresholds, "thresholds")
    best, best_sse = NO_INTERFERENCE, np.inf
    for thr in grid:
        below = u < thr
        if below.sum() < min_baseline:
            continue
        baseline = float(np.median(k[below]))
        observed = k / baseline - 1.0
        hinge = np.maximum(0.0, u - thr)
        denom = float(hinge @ hinge)
        slope = max(0.0, float(hinge @ observed) / denom) if denom > 0 else 0.0
        sse = float(np.sum((observed - slope * hinge) ** 2))
        if sse < best_sse - 1e-12:
            best_sse = sse
            best = InterferenceModel(float(min(max(thr, 0.0), 1.0)), slope, max_slowdown)
    return best
