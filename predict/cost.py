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
