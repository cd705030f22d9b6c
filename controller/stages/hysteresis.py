"""Stage 5 of the epoch: raise at once, lower slowly, round up to a granularity
(Liu et al., "An Adaptive Online Scheme for Scheduling and Resource
Enforcement in Storm", resource enforcement), then anti-saturation after
rounding.

Caps that follow every wiggle of the demand make CFS throttle instances whose
demand is merely noisy and churn cgroup writes. So a cap rises in the epoch its
demand rises, but falls only once the decreases accumulated since the last
change reach theta/2; and every cap is rounded up to a multiple of theta with a
theta/2 margin:  cap = ceil((r + theta/2) / theta) * theta  (``cap_rounding``
"margin", the default).

The margin adds theta to a cap on average, and a whole theta to a grant the
division already made a multiple of theta: with a coarse theta it keeps a cap
from landing just under its demand, but where theta is fine next to the
instances' demands and the demand already carries its latency margin, it is
CPU granted for nothing (n instances hold about n x theta above their grants).
``cap_rounding = "nearest"`` rounds to the nearest multiple instead, at least
one theta: a cap is then within theta/2 of its grant either way and above it no
more than below it on average.

Where decisions come often (every half second) the demand of a steady load
moves by more than theta from one epoch to the next, and the cap would follow
it. ``hysteresis_band`` widens the dead band by a share of the cap in force:
a raise must exceed it, a fall must accumulate it. On a node that stays full
the band also holds the caps fitted to it: the node's share-out moves with
every epoch's demands, so the caps in force stay while they still fit and
none of the new ones is further from its old cap than the band
(:func:`fit_quantized_columns`). 0 (the default) is the paper's rule.

``lower_after_epochs`` holds a fall back until the cap has stood that many
epochs (a raise is never held): the scale-down stabilisation of the Kubernetes
autoscalers and the Flink autoscaler, in epochs. Where the load's level changes
every few epochs, a cap that falls in the epoch after each rise drains its
queue and is raised again in the next; 0 or 1 (the default 0) is the paper's
rule.

``lower_after_falls`` lets a fall through, band or not, once the demand has
fallen that many epochs in a row (and by theta/2 in all): the band is there
for noise, and a demand that keeps falling is a trend. On a load whose level
falls smoothly the band would otherwise hold each cap above a falling demand
until it had fallen by the band's share. 0 (the default): off.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from itertools import repeat
from typing import NamedTuple

import numpy as np

from controller.stages.columns import tuples, values_in_order
from dsched.ids import InstanceKey

# How a cap is rounded to a multiple of theta (config ``cap_rounding``).
CAP_ROUNDINGS = ("margin", "nearest")


def _unknown_rounding(rounding: str) -> ValueError:
    return ValueError(f"rounding must be one of {', '.join(CAP_ROUNDINGS)}, got {rounding!r}")


def quantize(demand_cores: float, theta: float, rounding: str = "margin") -> float:
    """``margin``: ceil((r + theta/2) / theta) * theta; ``nearest``: the nearest
    multiple of theta (halves up), at least theta. Computed so exact multiples
    stay exact."""
    if theta <= 0:
        raise ValueError("theta must be positive")
    if demand_cores < 0 or not math.isfinite(demand_cores):
        raise ValueError(f"demand_cores must be finite and >= 0, got {demand_cores!r}")
    if rounding == "margin":
        steps = math.ceil(round((demand_cores + theta / 2) / theta, 9))
    elif rounding == "nearest":
        steps = max(1, math.floor(round(demand_cores / theta + 0.5, 9)))
    else:
        raise _unknown_rounding(rounding)
    return round(steps * theta, 9)


# NamedTuples rather than frozen dataclasses: an epoch makes two per instance
# (tens of thousands on a cluster of a thousand nodes), and tuples are built
# several times faster.
class HysteresisState(NamedTuple):
    """Per-instance memory between epochs (a value: each epoch makes new ones)."""

    cap: float | None = None  # the last cap decided
    demand: float | None = None  # the demand seen in the last epoch
    accumulated_decrease: float = 0.0
    stood: int = 0  # epochs the cap has been in force since it last changed
    falls: int = 0  # epochs in a row, up to the last, whose demand fell


class HysteresisStep(NamedTuple):
    cap: float
    changed: bool
    reason: str  # "first", "raise", "lower", "hold", "fit-node", "held"
    state: HysteresisState  # the instance's memory after this epoch


def step(
    state: HysteresisState,
    demand_cores: float,
    theta: float,
    band: float = 0.0,
    lower_after_epochs: int = 0,
    rounding: str = "margin",
    lower_after_falls: int = 0,
) -> HysteresisStep:
    """One epoch from ``state`` with this epoch's raw demand: the cap and the new state.

    ``band`` (a share of the cap in force, 0 by default: the paper's rule) widens
    the dead band around the cap: a raise must take it up by more than that
    share, a fall must have accumulated at least that share (and theta/2).
    ``lower_after_epochs`` lets a fall through only once the cap in force has
    stood that many epochs, this one included. ``rounding``: :func:`quantize`'s.
    ``lower_after_falls`` (0: off) lets a fall through once the demand has fallen
    that many epochs in a row, whatever the band."""
    target = quantize(demand_cores, theta, rounding)
    prev_demand = state.demand
    if state.cap is None:
        return HysteresisStep(target, True, "first", HysteresisState(target, demand_cores))
    if target > state.cap + band * state.cap:
        return HysteresisStep(target, True, "raise", HysteresisState(target, demand_cores))
    accumulated = state.accumulated_decrease
    if prev_demand is not None:
        # Net decrease since the last change: a rise that stays under the cap
        # cancels part of an earlier fall instead of being forgotten.
        accumulated = max(0.0, accumulated + prev_demand - demand_cores)
    stood = state.stood + 1
    falls = state.falls + 1 if prev_demand is not None and demand_cores < prev_demand else 0
    trend = 0 < lower_after_falls <= falls and accumulated >= theta / 2 - 1e-12
    if (
        target < state.cap
        and (accumulated >= max(theta / 2, band * state.cap) - 1e-12 or trend)
        and stood >= lower_after_epochs
    ):
        return HysteresisStep(target, True, "lower", HysteresisState(target, demand_cores))
    return HysteresisStep(
        state.cap,
        False,
        "hold",
        HysteresisState(state.cap, demand_cores, accumulated, stood, falls),
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


def quantize_many(demand_cores: np.ndarray, theta: float, rounding: str = "margin") -> np.ndarray:
    """:func:`quantize` of every value, to the bit.

    ``ceil(round(x, 9))`` equals ``ceil(x)`` unless ``x`` lies within rounding
    distance of an integer (``floor`` alike); only those values take Python's
    ``round``. The few distinct step counts are then multiplied out with
    Python's ``round`` too, so no value depends on numpy rounding differently
    from Python.
    """
    d = np.asarray(demand_cores, dtype=float)
    if theta <= 0:
        raise ValueError("theta must be positive")
    bad = ~np.isfinite(d) | (d < 0)
    if bad.any():
        quantize(float(d[np.flatnonzero(bad)[0]]), theta)  # raises, naming the value
    if rounding == "margin":
        x, to_int = (d + theta / 2) / theta, math.ceil
    elif rounding == "nearest":
        x, to_int = d / theta + 0.5, math.floor
    else:
        raise _unknown_rounding(rounding)
    steps = np.ceil(x) if to_int is math.ceil else np.floor(x)
    near = np.flatnonzero(np.abs(x - np.rint(x)) < 1e-6)
    if len(near):
        steps[near] = [to_int(round(v, 9)) for v in x[near].tolist()]
    if rounding == "nearest":
        steps = np.maximum(steps, 1.0)
    unique, inverse = np.unique(steps, return_inverse=True)
    return np.array([round(n * theta, 9) for n in unique.tolist()])[inverse.reshape(-1)]


_REASONS = ("first", "raise", "lower", "hold")
_FIRST, _RAISE, _LOWER, _HOLD = range(len(_REASONS))


@dataclass
class StepColumns:
    """The epoch's hysteresis steps as columns, one row per instance.

    The epoch computes hysteresis and then anti-saturation on these and builds
    the :class:`HysteresisStep` objects once (:meth:`steps`), instead of once
    per stage."""

    keys: list[InstanceKey]
    cap: np.ndarray
    changed: np.ndarray  # bool
    reason: list[str]
    demand: list  # the state's demand (the allocation this epoch), as given
    accumulated: np.ndarray
    # Epochs the cap in force before this epoch will have stood if it is kept.
    stood: np.ndarray
    # Epochs in a row, this one included, whose demand fell (kept if the cap is).
    falls: np.ndarray
    # The cap in force before this epoch (NaN: none); None where not known.
    previous: np.ndarray | None = None
    # The decrease accumulated if the cap in force is kept; None where not known.
    held_decrease: np.ndarray | None = None

    def steps(self) -> dict[InstanceKey, HysteresisStep]:
        caps = self.cap.tolist()
        stood = np.where(self.changed, 0, self.stood).tolist()
        falls = np.where(self.changed, 0, self.falls).tolist()
        states = tuples(HysteresisState, caps, self.demand, self.accumulated.tolist(), stood, falls)
        steps = tuples(HysteresisStep, caps, self.changed.tolist(), self.reason, states)
        return dict(zip(self.keys, steps, strict=True))

    @classmethod
    def of(cls, steps: Mapping[InstanceKey, HysteresisStep]) -> StepColumns:
        keys = list(steps)
        cap, changed, reason, states = zip(*steps.values(), strict=True) if keys else ((),) * 4
        _, demand, accumulated, stood, falls = zip(*states, strict=True) if keys else ((),) * 5
        return cls(
            keys,
            np.array(cap, dtype=float),
            np.array(changed, dtype=bool),
            list(reason),
            list(demand),
            np.array(accumulated, dtype=float),
            np.array(stood, dtype=int),
            np.array(falls, dtype=int),
        )


def apply_hysteresis(
    allocated: Mapping[InstanceKey, float],
    memory: Mapping[InstanceKey, HysteresisState],
    theta: float,
    max_cap: Mapping[InstanceKey, float],
    band: float = 0.0,
    lower_after_epochs: int = 0,
    rounding: str = "margin",
    lower_after_falls: int = 0,
) -> dict[InstanceKey, HysteresisStep]:
    """Per instance: raise at once, lower after theta/2, quantize; never above the node.

    ``memory`` is read only; each step carries the instance's new state."""
    return hysteresis_columns(
        allocated, memory, theta, max_cap, band, lower_after_epochs, rounding, lower_after_falls
    ).steps()


def hysteresis_columns(
    allocated: Mapping[InstanceKey, float],
    memory: Mapping[InstanceKey, HysteresisState],
    theta: float,
    max_cap: Mapping[InstanceKey, float],
    band: float = 0.0,
    lower_after_epochs: int = 0,
    rounding: str = "margin",
    lower_after_falls: int = 0,
) -> StepColumns:
    """:func:`apply_hysteresis` as columns. This is :func:`step` for every
    instance at once: the same comparisons and arithmetic in the same order on
    arrays, so each step equals the one :func:`step` makes (and the clamp to
    ``max_cap`` the one the per-instance loop made; tests/test_epoch_vectorised.py
    checks both)."""
    keys = list(allocated)
    n = len(keys)
    demand_in = list(allocated.values())
    if not keys:
        empty = np.empty(0)
        return StepColumns(
            [],
            empty,
            empty.astype(bool),
            [],
            [],
            empty,
            empty.astype(int),
            empty.astype(int),
            empty,
            empty,
        )
    demand = np.fromiter(demand_in, float, n)
    target = quantize_many(demand, theta, rounding)
    old_cap, old_demand, old_acc, old_stood, old_falls = zip(
        *values_in_order(memory, keys, _FRESH), strict=True
    )
    fresh = np.fromiter((c is None for c in old_cap), bool, n)
    no_prev = np.fromiter((p is None for p in old_demand), bool, n)
    cap = np.array([0.0 if c is None else c for c in old_cap], dtype=float)
    prev = np.array([0.0 if p is None else p for p in old_demand], dtype=float)
    acc = np.fromiter(old_acc, float, n)
    stood = np.fromiter(old_stood, int, n) + 1
    falls = np.where(~no_prev & (demand < prev), np.fromiter(old_falls, int, n) + 1, 0)
    raise_ = ~fresh & (target > cap + band * cap)
    # Net decrease since the last change: a rise that stays under the cap
    # cancels part of an earlier fall instead of being forgotten.
    fell = acc + prev - demand
    accumulated = np.where(no_prev, acc, np.where(fell > 0.0, fell, 0.0))
    needed = np.maximum(theta / 2, band * cap)
    trend = (
        (lower_after_falls > 0) & (falls >= lower_after_falls) & (accumulated >= theta / 2 - 1e-12)
    )
    lower = (
        ~fresh
        & ~raise_
        & (target < cap)
        & ((accumulated >= needed - 1e-12) | trend)
        & (stood >= lower_after_epochs)
    )
    hold = ~(fresh | raise_ | lower)
    reason = np.select([fresh, raise_, lower], [_FIRST, _RAISE, _LOWER], _HOLD)
    new_cap = np.where(hold, cap, target)
    limit = np.fromiter(values_in_order(max_cap, keys, math.inf), float, n)
    # Quantizing up must not push a cap past what the node can give.
    return StepColumns(
        keys,
        np.where(new_cap > limit, limit, new_cap),
        ~hold,
        list(map(_REASONS.__getitem__, reason.tolist())),
        demand_in,
        np.where(hold, accumulated, 0.0),
        stood,
        falls,
        np.where(fresh, np.nan, cap),
        accumulated,
    )


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
    out = dict(steps)
    if not steps:
        return out
    cols = StepColumns.of(steps)
    rows = fit_quantized_columns(cols, allocated, node_of, weight_of, room, min_cap).tolist()
    # The fitted rows' steps as the columns build them: reason "fit-node", a
    # fresh accumulated decrease and count of epochs stood.
    fitted = cols.steps()
    out.update((cols.keys[i], fitted[cols.keys[i]]) for i in rows)
    return out


def fit_quantized_columns(
    cols: StepColumns,
    allocated: Mapping[InstanceKey, float],
    node_of: Mapping[InstanceKey, str],
    weight_of: Mapping[InstanceKey, float],
    room: Mapping[str, float],
    min_cap: float,
    band: float = 0.0,
) -> np.ndarray:
    """:func:`fit_quantized_caps` on columns, changed in place (caps lowered
    here get reason "fit-node" and a fresh accumulated decrease); the rows
    it changed.

    With ``band`` > 0 and the caps in force known (``cols.previous``), a node
    that needed fitting keeps its caps in force (reason "hold") when they
    still fit its room and no fitted cap is further from its cap in force
    than ``band`` of it: a full node's share-out shifts a little with every
    epoch's demands, and following it rewrites every cap on the node."""
    keys = cols.keys
    none = np.empty(0, dtype=int)
    if not keys:
        return none
    node_names = values_in_order(node_of, keys)
    nodes = sorted(set(node_names))
    node_ix = {n: i for i, n in enumerate(nodes)}
    node = np.fromiter(map(node_ix.__getitem__, node_names), int, len(keys))
    caps = cols.cap
    load = np.bincount(node, weights=caps, minlength=len(nodes))
    limit = np.array([room.get(n, math.inf) for n in nodes])
    over_node = load - limit
    hot = over_node[node] > 1e-9
    if not hot.any():
        return none
    idx = np.flatnonzero(hot)
    hnode, hcap = node[idx], caps[idx]
    weight = np.array(values_in_order(weight_of, keys, 1.0), dtype=float)[idx]
    floor = np.minimum(min_cap, hcap)
    alloc = np.array(values_in_order(allocated, keys, 0.0), dtype=float)[idx]
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
    cut = np.flatnonzero(new < hcap - 1e-12)
    rows = idx[cut]
    cols.cap[rows] = list(map(round, new[cut].tolist(), repeat(9)))
    cols.changed[rows] = True
    cols.accumulated[rows] = 0.0
    for i in rows.tolist():
        cols.reason[i] = "fit-node"
    if band > 0 and cols.previous is not None:
        kept = _hold_full_nodes(cols, node, over_node > 1e-9, limit, band)
        rows = rows[~np.isin(rows, kept)]
    return rows


def _hold_full_nodes(
    cols: StepColumns, node: np.ndarray, full: np.ndarray, limit: np.ndarray, band: float
) -> np.ndarray:
    """The rows of full nodes whose caps in force are kept (see
    :func:`fit_quantized_columns`), set back to them in place."""
    prev = cols.previous
    assert prev is not None
    n = len(full)
    known = ~np.isnan(prev)
    prev0 = np.where(known, prev, 0.0)
    # An instance without a cap in force counts as far: its node is refitted.
    far = ~known | (np.abs(cols.cap - prev0) > band * prev0 + 1e-12)
    keep = (
        full
        & (np.bincount(node, weights=far, minlength=n) == 0)
        & (np.bincount(node, weights=prev0, minlength=n) <= limit + 1e-9)
    )
    rows = np.flatnonzero(keep[node])
    if not len(rows):
        return rows
    cols.cap[rows] = prev[rows]
    cols.changed[rows] = False
    # A kept cap goes on accumulating its decrease, as a hold in step() does.
    cols.accumulated[rows] = 0.0 if cols.held_decrease is None else cols.held_decrease[rows]
    for i in rows.tolist():
        cols.reason[i] = "hold"
    return rows
