"""Squared coefficients of variation (C²) the simulator measures on its own draws.

The controller's latency model takes one C² for inter-arrival gaps and one for
service times (``arrival_scv``, ``service_scv``). A scenario with Weibull gaps
of shape 2-6 is much smoother than Poisson (C² 0.04-0.27 against 1), so
assuming 1 overstates every waiting time. Until the controller measures C²
itself, a run can hand it what a warm-up of the same scenario measured: the
simulator generates the warm-up's source arrivals and per-message service
works exactly as it does in a run, with a seed of its own (the measured run's
draws stay unseen), and the C² of those samples is computed here.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from testbed.sim.engine import ClusterSim
from testbed.sim.scenario import Scenario

#: The warm-up's seed is the scenario's plus this, so it draws other samples.
WARMUP_SEED_OFFSET = 7919


@dataclass(frozen=True)
class MeasuredScv:
    arrival_scv: float  # pooled over applications, each gap divided by its app's mean gap
    service_scv: float  # pooled over operators, each work divided by its operator's mean
    arrival_scv_per_app: tuple[float, ...]
    gaps: int
    service_samples: int
    service_min_s: float
    service_max_s: float
    warmup_seconds: float

    def to_json(self) -> dict[str, object]:
        per_app = np.array(self.arrival_scv_per_app)
        per_app = per_app[np.isfinite(per_app)]
        return {
            "arrival_scv": self.arrival_scv,
            "service_scv": self.service_scv,
            "arrival_scv_per_app_min": float(per_app.min()) if len(per_app) else None,
            "arrival_scv_per_app_max": float(per_app.max()) if len(per_app) else None,
            "gaps": self.gaps,
            "service_samples": self.service_samples,
            "service_min_s": self.service_min_s,
            "service_max_s": self.service_max_s,
            "warmup_seconds": self.warmup_seconds,
        }


def scv(x: np.ndarray) -> float:
    """Variance over squared mean (NaN for fewer than two samples or a zero mean)."""
    x = np.asarray(x, dtype=float)
    if len(x) < 2 or x.mean() <= 0:
        return float("nan")
    return float(x.var(ddof=1) / x.mean() ** 2)


def measure_scv(
    sc: Scenario, warmup_epochs: int = 20, service_samples_per_op: int = 200
) -> MeasuredScv:
    """C² of the warm-up's inter-arrival gaps and service times.

    The warm-up is the scenario's first ``warmup_epochs`` epochs (phase I when the
    burst starts later). Gaps are pooled after dividing each application's gaps by
    their mean, so applications with different rates measure one shape, not the
    spread of rates; likewise service works by their operator's mean.
    """
    if warmup_epochs < 1:
        raise ValueError(f"warmup_epochs must be >= 1, got {warmup_epochs}")
    if service_samples_per_op < 2:
        raise ValueError(f"service_samples_per_op must be >= 2, got {service_samples_per_op}")
    warm = replace(sc, epochs=warmup_epochs, seed=sc.seed + WARMUP_SEED_OFFSET)
    sim = ClusterSim(warm, max_parallelism=1)
    pooled, per_app = [], []
    for a in range(len(sc.apps)):
        gaps = np.diff(sim.arrival_t[sim.arrival_app == a])
        per_app.append(scv(gaps))
        if len(gaps) >= 2 and gaps.mean() > 0:
            pooled.append(gaps / gaps.mean())
    gaps_all = np.concatenate(pooled) if pooled else np.empty(0)
    ops = np.repeat(np.arange(sim.n_ops), service_samples_per_op)
    work = sim.sample_message_work(ops)
    # Each sample over its operator's own sample mean: operators of different
    # means measure one shape.
    means = np.bincount(ops, work, minlength=sim.n_ops) / service_samples_per_op
    return MeasuredScv(
        arrival_scv=scv(gaps_all),
        service_scv=scv(work / means[ops]),
        arrival_scv_per_app=tuple(per_app),
        gaps=len(gaps_all),
        service_samples=len(work),
        service_min_s=float(work.min()),
        service_max_s=float(work.max()),
        warmup_seconds=warm.duration_s,
    )
