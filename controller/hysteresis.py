"""Raise at once, lower slowly, round up to a granularity (DESIGN §4 step 6).

Caps that follow every wiggle of the demand make CFS throttle instances whose
demand is merely noisy and churn cgroup writes. So a cap rises in the epoch its
demand rises, but falls only once the decreases accumulated since the last
change reach theta/2; and every cap is rounded up to a multiple of theta with a
theta/2 margin:  cap = ceil((r + theta/2) / theta) * theta.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


def quantize(demand_cores: float, theta: float) -> float:
    """ceil((r + theta/2) / theta) * theta, computed so exact multiples stay exact."""
    if theta <= 0:
        raise ValueError("theta must be positive")
    if demand_cores < 0 or not math.isfinite(demand_cores):
        raise ValueError(f"demand_cores must be finite and >= 0, got {demand_cores!r}")
    steps = math.ceil(round((demand_cores + theta / 2) / theta, 9))
    return round(steps * theta, 9)


@dataclass
class HysteresisState:
    """Per-instance memory between epochs."""

    cap: float | None = None  # the last cap decided
    demand: float | None = None  # the demand seen in the last epoch
    accumulated_decrease: float = 0.0


@dataclass(frozen=True)
class HysteresisStep:
    cap: float
    changed: bool
    reason: str  # "first", "raise", "lower", "hold"


def step(state: HysteresisState, demand_cores: float, theta: float) -> HysteresisStep:
    """Advance ``state`` by one epoch with this epoch's raw demand; return the cap."""
    target = quantize(demand_cores, theta)
    prev_demand = state.demand
    state.demand = demand_cores
    if state.cap is None:
        state.cap, state.accumulated_decrease = target, 0.0
        return HysteresisStep(target, True, "first")
    if target > state.cap:
        state.cap, state.accumulated_decrease = target, 0.0
        return HysteresisStep(target, True, "raise")
    if prev_demand is not None:
        # Net decrease since the last change: a rise that stays under the cap
        # cancels part of an earlier fall instead of being forgotten.
        state.accumulated_decrease = max(
            0.0, state.accumulated_decrease + prev_demand - demand_cores
        )
    if target < state.cap and state.accumulated_decrease >= theta / 2 - 1e-12:
        state.cap, state.accumulated_decrease = target, 0.0
        return HysteresisStep(target, True, "lower")
    return HysteresisStep(state.cap, False, "hold")
