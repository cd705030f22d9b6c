"""CPU cost per tuple (kappa) from per-slot CPU time and processed-tuple counts.

Two strategies, chosen by name:

* ``mean_ratio`` (these functions' default, the Storm paper's rule) -- the mean over the last ``window``
  slots of ``cpu_seconds / tuples``, skipping slots that processed no tuple (their
  ratio is undefined, and idle slots say nothing about the cost of a tuple);
* ``ratio_of_sums`` -- total CPU over total tuples in the window, which weights busy
  slots more and is steadier when counts are small.

When no slot in the window processed a tuple there is no estimate: the function
returns ``default`` if one is given and raises ValueError otherwise.

:func:`marginal_cost_many` is the other half of an affine cost, CPU = fixed +
marginal x tuples: the slope of each slot's CPU against its tuples over a longer
history, where a cost per tuple that divides the fixed part by the tuples of a
quiet window would charge it again for every tuple of a busier next slot.
"""

from __future__ import annotations

import numpy as np

from dsched import validate as v

STRATEGIES = ("mean_ratio", "ratio_of_sums")


def cpu_per_tuple(
    cpu_seconds,
    tuples,
    window: int = 5,
    *,
    strategy: str = "mean_ratio",
    default: float | None = None,
) -> float:
    """CPU-seconds per processed tuple over the last ``window`` slots."""
    cpu = v.series(cpu_seconds, "cpu_seconds")
    n = v.series(tuples, "tuples")
    window = v.positive_int(window, "window")
    if cpu.size != n.size:
        raise ValueError(
            f"cpu_seconds and tuples must have the same length, got {cpu.size} and {n.size}"
        )
    if np.any(cpu < 0):
        raise ValueError("cpu_seconds must be >= 0")
    if np.any(n < 0):
        raise ValueError("tuples must be >= 0")
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
    cpu, n = cpu[-window:], n[-window:]
    busy = n > 0
    if not np.any(busy):
        if default is None:
            raise ValueError(
                f"tuples: no slot in the last {window} processed a tuple; no cost estimate"
            )
        return v.non_negative(default, "default")
    if strategy == "mean_ratio":
        return float(np.mean(cpu[busy] / n[busy]))
    return float(cpu[busy].sum() / n[busy].sum())


def cpu_per_tuple_many(
    cpu_seconds: np.ndarray, tuples: np.ndarray, window: int = 5, strategy: str = "mean_ratio"
) -> np.ndarray:
    """``cpu_per_tuple(row_cpu, row_tuples, window, strategy=strategy)`` for every row of
    two 2-D arrays; NaN for a row where no slot in the window processed a tuple.

    Rows where every slot processed something are computed together (a row mean
    adds in the same order as the mean of that row alone); the rare rows with an
    idle slot go through :func:`cpu_per_tuple` one by one, so every value is the
    one it gives. Bad input is the ValueError :func:`cpu_per_tuple` raises.
    """
    cpu = np.asarray(cpu_seconds, dtype=float)
    n = np.asarray(tuples, dtype=float)
    window = v.positive_int(window, "window")
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
    if cpu.ndim != 2 or cpu.shape != n.shape or cpu.shape[1] == 0:
        raise ValueError(
            f"cpu_seconds and tuples must be 2-D arrays of one shape, got {cpu.shape} and {n.shape}"
        )
    cpu, n = cpu[:, -window:], n[:, -window:]
    out = np.full(cpu.shape[0], np.nan)
    ok = np.isfinite(cpu).all(axis=1) & np.isfinite(n).all(axis=1)
    ok &= (cpu >= 0).all(axis=1) & (n >= 0).all(axis=1)
    for i in np.flatnonzero(~ok):
        cpu_per_tuple(cpu[i], n[i], window, default=np.nan)  # raises on bad input
    busy = n > 0
    full = ok & busy.all(axis=1)
    if full.any():
        if strategy == "mean_ratio":
            out[full] = (cpu[full] / n[full]).mean(axis=1)
        else:
            out[full] = cpu[full].sum(axis=1) / n[full].sum(axis=1)
    for i in np.flatnonzero(ok & ~full & busy.any(axis=1)):
        out[i] = cpu_per_tuple(cpu[i], n[i], window, strategy=strategy)
    return out


def marginal_cost_many(
    cpu_seconds: np.ndarray,
    tuples: np.ndarray,
    *,
    min_slots: int = 10,
    max_relative_error: float = 0.25,
) -> np.ndarray:
    """Per row of two 2-D arrays (operators x slots, NaN for a missing slot), the
    least-squares slope of CPU-seconds on processed tuples: the CPU one more
    tuple costs. NaN where it is not known well enough: fewer than ``min_slots``
    slots that processed a tuple, no spread in their tuples, a slope not above
    zero, or a standard error above ``max_relative_error`` of the slope (a load
    too steady to tell fixed from per-tuple CPU)."""
    cpu = np.asarray(cpu_seconds, dtype=float)
    n = np.asarray(tuples, dtype=float)
    if cpu.ndim != 2 or cpu.shape != n.shape:
        raise ValueError(
            f"cpu_seconds and tuples must be 2-D arrays of one shape, got {cpu.shape} and {n.shape}"
        )
    min_slots = v.positive_int(min_slots, "min_slots")
    if min_slots < 3:
        raise ValueError(f"min_slots must be at least 3 (a slope and its error), got {min_slots}")
    if not max_relative_error > 0:
        raise ValueError(f"max_relative_error must be positive, got {max_relative_error}")
    ok = np.isfinite(cpu) & np.isfinite(n) & (n > 0)
    if np.any((cpu < 0) & ok) or np.any(n < 0):
        raise ValueError("cpu_seconds and tuples must be >= 0")
    k = ok.sum(axis=1)
    x, y = np.where(ok, n, 0.0), np.where(ok, cpu, 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        mx = x.sum(axis=1) / k
        my = y.sum(axis=1) / k
        dx = np.where(ok, x - mx[:, None], 0.0)
        dy = np.where(ok, y - my[:, None], 0.0)
        sxx = (dx * dx).sum(axis=1)
        slope = (dx * dy).sum(axis=1) / sxx
        resid = np.where(ok, dy - slope[:, None] * dx, 0.0)
        se = np.sqrt((resid * resid).sum(axis=1) / (k - 2) / sxx)
        good = (k >= min_slots) & (sxx > 0) & (slope > 0) & (se <= max_relative_error * slope)
    return np.where(good, slope, np.nan)
