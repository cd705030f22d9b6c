"""Source arrival times of every application, with bursts applied by a time change.

A renewal process with a time-varying rate multiplier m(t) is generated in
operational time Lambda(t) = integral of m and mapped back to wall time by the
inverse of Lambda: the shape of the gaps (Poisson, Weibull) is kept while the
rate follows the burst. Traces are Poisson processes with a rate per epoch.
"""

from __future__ import annotations

import math

import numpy as np

from testbed import traces
from testbed.sim.scenario import AppSpec, Scenario


def multiplier(app: AppSpec, t: np.ndarray, epoch_seconds: float) -> np.ndarray:
    """The burst's rate multiplier at wall times ``t``."""
    if app.burst is None:
        return np.ones_like(t)
    b = app.burst
    t0, t1 = b.start_epoch * epoch_seconds, b.end_epoch * epoch_seconds
    if t1 <= t0:
        return np.where(t >= t0, b.factor, 1.0)
    frac = np.clip((t - t0) / (t1 - t0), 0.0, 1.0)
    return 1.0 + (b.factor - 1.0) * frac


def app_arrivals(app: AppSpec, duration: float, epoch_seconds: float, seed: int) -> np.ndarray:
    """Sorted arrival times in [0, duration) of one application's source."""
    spec = app.arrivals
    grid = np.linspace(0.0, duration, max(2, int(duration / 0.01) + 1))
    if spec.kind == "trace":
        epoch_idx = np.minimum((grid / epoch_seconds).astype(int), len(spec.trace) - 1)
        rate = np.asarray(spec.trace, dtype=float)[epoch_idx] * multiplier(app, grid, epoch_seconds)
        base_rate = 1.0
    else:
        rate = spec.rate * multiplier(app, grid, epoch_seconds)
        base_rate = spec.rate
    if base_rate <= 0 or not np.any(rate > 0):
        return np.empty(0)
    # Operational time in units of "seconds at the base rate".
    op_time = (
        np.concatenate([[0.0], np.cumsum((rate[1:] + rate[:-1]) / 2 * np.diff(grid))]) / base_rate
    )
    horizon = float(op_time[-1])
    if spec.kind == "weibull":
        scale = 1.0 / (spec.rate * math.gamma(1.0 + 1.0 / spec.shape))
        unit = traces.weibull_arrivals(scale, spec.shape, horizon, seed=seed)
    else:
        unit = traces.poisson_arrivals(base_rate, horizon, seed=seed)
    return np.interp(unit, op_time, grid)


def all_arrivals(scenario: Scenario) -> tuple[np.ndarray, np.ndarray]:
    """(times, app index) of every source arrival of the scenario, sorted by time."""
    times, apps = [], []
    for i, app in enumerate(scenario.apps):
        t = app_arrivals(
            app, scenario.duration_s, scenario.epoch_seconds, seed=scenario.seed * 100_003 + i
        )
        times.append(t)
        apps.append(np.full(len(t), i, dtype=np.int64))
    t_all = np.concatenate(times) if times else np.empty(0)
    a_all = np.concatenate(apps) if apps else np.empty(0, dtype=np.int64)
    order = np.argsort(t_all, kind="stable")
    return t_all[order], a_all[order]
