"""Stage 5 of the epoch: raise at once, lower slowly, round up to a granularity
(Liu et al., "An Adaptive Online Scheme for Scheduling and Resource
Enforcement in Storm", resource enforcement), then anti-saturation after
rounding.

Caps that follow every wiggle of the demand make CFS throttle instances whose
demand is merely noisy and churn cgroup writes. So a cap rises in the epoch its
demand rises, but falls only once the decreases accumulated since the last
change reach theta/2; and every cap is rounded up to a multiple of theta with a
theta/2 margin:  cap = ceil((r + theta/2) / theta) * theta.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import NamedTuple

import numpy as np

from dsched.ids import InstanceKey


def quantize(demand_cores: float, theta: float) -> float:
    """ceil((r + theta/2) / theta) * theta, computed so exact multiples stay exact."""
    if theta <= 0:
        raise ValueError("theta must be positive")
    if demand_cores < 0 or not math.isfinite(demand_cores):
        raise ValueError(f"demand_cores must be finite and >= 0, got {demand_cores!r}")
    steps = math.ceil(round((demand_cores + theta / 2) / theta, 9))
    return round(steps * theta, 9)


# NamedTuples rather than frozen dataclasses: an epoch makes two per instance
# (19,500 at the benchmark's scale), and tuples are built several times faster.
class HysteresisState(NamedTuple):
    """Per-instance memory between epochs (a value: each epoch makes new ones)."""

    cap: float | None = None  # the last cap decided
    demand: float | None = None  # the demand seen in the last epoch
    accumulated_decrease: float = 0.0


class HysteresisStep(NamedTuple):
    cap: float
    changed: bool
    reason: str  # "first", "raise", "lower", "hold", "fit-node", "held"
    state: HysteresisState  # the instance's memory after this epoch


def step(state: HysteresisState, demand_cores: float, theta: float) -> HysteresisStep:
    """One epoch from ``state`` with this epoch's raw demand: the cap and the new state."""
    target = quantize(demand_cores, theta)
    prev_demand = state.demand
    if state.cap is None:
        return HysteresisStep(target, True, "first", HysteresisState(target, demand_cores, 0.0))
    if target > state.cap:
        return HysteresisStep(target, True, "raise", HysteresisState(target, demand_cores, 0.0))
    accumulated = state.accumulated_decrease
    if prev_demand is not None:
        # Net decrease since the last change: a rise that stays under the cap
        # cancels part of an earlier fall instead of being forgotten.
        accumulated = max(0.0, accumulated + prev_demand - demand_cores)
    if target < state.cap and accumulated >= theta / 2 - 1e-12:
        return HysteresisStep(target, True, "lower", HysteresisState(target, demand_cores, 0.0))
    return HysteresisStep(
        state.cap, False, "hold", HysteresisState(state.cap, demand_cores, accumulated)
    )


_FRESH = HysteresisState()


def hold_caps(
    reported: Mapping[InstanceKey, float | None],
    memory: Mapping[InstanceKey, HysteresisState],
) -> dict[InstanceKey, HysteresisStep]:
    """Caps of unmeasured instances, kept as they are (reason "held").

    An instance without counters this slot may be idle or overloaded: cutting
    its cap could starve it, releasing it could let it take a node. So the cap
    in force stays: the last one decided (the memory), else the one its agent
    reports (``reported``). An instance with neither has no cap to hold and gets
    no step. Its hysteresis state is carried unchanged, so when counters return
    the cap moves as if the hold had not happened.
    """
    steps = {}
    for k, agent_cap in reported.items():
        state = memory.get(k)
        cap = state.cap if state is not None and state.cap is not None else agent_cap
        if cap is None:
            continue
        steps[k] = HysteresisStep(cap, False, "held", state or HysteresisState(cap=cap))
    return steps


def apply_hysteresis(
    allocated: Mapping[InstanceKey, float],
    memory: Mapping[InstanceKey, HysteresisState],
    theta: float,
    max_cap: Mapping[InstanceKey, float],
) -> dict[InstanceKey, HysteresisStep]:
    """Per instance: raise at once, lower after theta/2, quantize; never above the node.

    ``memory`` is read only; each step carries the instance's new state."""
    steps = {}
    for k, cores in allocated.items():
        s = step(memory.get(k, _FRESH), cores, theta)
        limit = max_cap.get(k, math.inf)
        if s.cap > limit:
            # Quantizing up must not push a cap past what the node can give.
            s = HysteresisStep(limit, s.changed, s.reason, s.state._replace(cap=limit))
        steps[k] = s
    return steps


def _prior_in_group(group: np.ndarray, values: np.ndarray) -> np.ndarray:
    """For rows sorted by ``group``: sum of ``values`` of the earlier rows of the same group."""
    before = np.cumsum(values) - values
    _, first = np.unique(group, return_index=True)
    starts = np.zeros(len(group), dtype=int)
    starts[first] = first
    starts = np.maximum.accumulate(starts)
    return before - before[starts]


def fit_quantized_caps(
    steps: Mapping[InstanceKey, HysteresisStep],
    allocated: Mapping[InstanceKey, float],
    node_of: Mapping[InstanceKey, str],
    weight_of: Mapping[InstanceKey, float],
    room: Mapping[str, float],
    min_cap: float,
) -> dict[InstanceKey, HysteresisStep]:
    """Anti-saturation after quantization.

    Rounding up with a theta/2 margin can push a node's caps past its room
    again. Where it does, first the rounding margins come off (down to the
    allocation; lightest class first, largest margin first), then caps go below
    their allocation, lightest class first and in proportion within a class,
    never below ``min_cap``. Caps lowered here need not be multiples of theta:
    the node's room wins over the granularity. Vectorized over all instances.
    """
    if not steps:
        return {}
    keys = list(steps)
    nodes = sorted({node_of[k] for k in keys})
    node_ix = {n: i for i, n in enumerate(nodes)}
    node = np.fromiter((node_ix[node_of[k]] for k in keys), int, len(keys))
    caps = np.fromiter((steps[k].cap for k in keys), float, len(keys))
    load = np.bincount(node, weights=caps, minlength=len(nodes))
    limit = np.array([room.get(n, math.inf) for n in nodes])
    over_node = load - limit
    hot = over_node[node] > 1e-9
    out = dict(steps)
    if not hot.any():
        return out
    idx = np.flatnonzero(hot)
    hkeys = [keys[i] for i in idx]
    hnode, hcap = node[idx], caps[idx]
    weight = np.fromiter((weight_of.get(k, 1.0) for k in hkeys), float, len(hkeys))
    floor = np.minimum(min_cap, hcap)
    alloc = np.fromiter((allocated.get(k, 0.0) for k in hkeys), float, len(hkeys))
    target = np.maximum(alloc, floor)
    # 1: rounding margins, lightest class first, largest margin first.
    margin = np.maximum(hcap - target, 0.0)
    order = np.lexsort((np.arange(len(idx)), -margin, weight, hnode))
    prior = _prior_in_group(hnode[order], margin[order])
    take = np.clip(over_node[hnode[order]] - prior, 0.0, margin[order])
    new = hcap.copy()
    new[order] -= take
    left = np.maximum(over_node - np.bincount(hnode, weights=hcap - new, minlength=len(nodes)), 0.0)
    # 2: below allocation, lightest class first, in proportion within a class.
    if (left > 1e-9).any():
        _, wrank = np.unique(weight, return_inverse=True)
        group = hnode * (wrank.max() + 1) + wrank
        uniq, ginv = np.unique(group, return_inverse=True)
        cuttable = np.maximum(new - floor, 0.0)
        gcut = np.bincount(ginv, weights=cuttable, minlength=len(uniq))
        gnode = uniq // (wrank.max() + 1)
        gprior = _prior_in_group(gnode, gcut)
        gtake = np.clip(left[gnode] - gprior, 0.0, gcut)
        with np.errstate(divide="ignore", invalid="ignore"):
            share = np.where(gcut > 0, gtake / gcut, 0.0)
        new -= cuttable * share[ginv]
    for j in np.flatnonzero(new < hcap - 1e-12):
        k = hkeys[j]
        c = round(float(new[j]), 9)
        out[k] = HysteresisStep(c, True, "fit-node", HysteresisState(c, steps[k].state.demand, 0.0))
    return out
