"""CPU cost per tuple (kappa) from per-slot CPU time and processed-tuple counts.

Two strategies, chosen by name:

* ``mean_ratio`` (default, the controller's rule) -- the mean over the last ``window``
  slots of ``cpu_seconds / tuples``, skipping slots that processed no tuple (their
  ratio is undefined, and idle slots say nothing about the cost of a tuple);
* ``ratio_of_sums`` -- total CPU over total tuples in the window, which weights busy
  slots more and is steadier when counts are small.

When no slot in the window processed a tuple there is no estimate: the function
returns ``default`` if one is given and raises ValueError otherwise.
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
