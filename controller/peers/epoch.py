"""One epoch under a peer's sizing policy: views in, an ordinary EpochResult out.

A peer replaces forecast, demand, allocation and hysteresis with its own rule
(:mod:`controller.peers.policies`); everything after the result is shared with
dsched: the controller commits the caps, saves them, sends them as
CapDirectives through the same agents, records the decision and offers
placement the wishes as demands. Two things every peer's caps go through, as
any cap the agents accept must: each lies in [min_cap_cores,
min(max_instance_cores, node capacity)], and a node's caps never add up to
more than its capacity (scaled down in proportion when they would; peers keep
no headroom of their own). Instances without counters keep their caps, as
under dsched.

Pure, like :func:`controller.epoch.run_epoch`.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict

import numpy as np

from controller.config import ControllerConfig
from controller.epoch import EpochInputs, EpochResult
from controller.memory import MemoryView
from controller.peers import POLICIES
from controller.peers.policies import SizingInputs, SizingPolicy, Wish
from controller.stages.allocation import AppAllocation, QosAllocation
from controller.stages.demand import InstanceDemand
from controller.stages.evaluate import OperatorView
from controller.stages.forecast import OperatorForecast
from controller.stages.hysteresis import HysteresisStep, hold_caps
from dsched.ids import InstanceKey, OperatorKey


def _kappa(view: OperatorView) -> float | None:
    done = float(view.executed @ view.seconds)
    return float(view.cpu_seconds.sum()) / done if done > 0 else None


def _reason(prev: float | None, cap: float, fitted: bool) -> tuple[bool, str]:
    if prev is None:
        return True, "first"
    changed = abs(cap - prev) > 1e-9
    if fitted:
        return changed, "fit-node"
    if not changed:
        return False, "hold"
    return True, "raise" if cap > prev else "lower"


def bound_and_fit(
    wishes: dict[InstanceKey, Wish],
    node_of: dict[InstanceKey, str],
    capacity: dict[str, float],
    held_on: dict[str, float],
    min_cap: float,
    max_instance: float,
    fallback: dict[InstanceKey, float],
) -> tuple[dict[InstanceKey, float], dict[InstanceKey, float]]:
    """Caps within [min_cap, min(max_instance, node capacity)], each node's sum
    within its capacity less what held caps take. Returns (caps, cut per instance).

    A wish that is not a finite number >= 0 keeps ``fallback`` (the cap in force)."""
    caps: dict[InstanceKey, float] = {}
    for k, w in wishes.items():
        cores = w.cores if math.isfinite(w.cores) and w.cores >= 0 else fallback[k]
        top = min(max_instance, capacity.get(node_of[k], max_instance))
        caps[k] = min(max(cores, min_cap), max(top, min_cap))
    by_node: dict[str, list[InstanceKey]] = defaultdict(list)
    for k in caps:
        by_node[node_of[k]].append(k)
    cut: dict[InstanceKey, float] = {}
    for node, keys in by_node.items():
        room = max(0.0, capacity.get(node, math.inf) - held_on.get(node, 0.0))
        wanted = np.array([caps[k] for k in keys])
        if wanted.sum() > room + 1e-12:
            fitted = fit_to_room(wanted, room, min_cap)
            for k, before, after in zip(keys, wanted.tolist(), fitted.tolist(), strict=True):
                cut[k] = before - after
                caps[k] = after
    return caps, cut


def fit_to_room(caps: np.ndarray, room: float, floor: float) -> np.ndarray:
    """``caps`` scaled by one factor so they add up to ``room``, none below ``floor``:
    those the factor would push under it stay at it and the others share the
    rest. When even the floors do not fit, every cap is the floor (a quiet
    instance must still be able to wake up)."""
    fixed = np.zeros(len(caps), dtype=bool)
    while True:
        rest = float(caps[~fixed].sum())
        free = room - floor * int(fixed.sum())
        if rest <= 0 or free <= 0:
            return np.full(len(caps), floor)
        scaled = caps * min(1.0, free / rest)
        under = ~fixed & (scaled < floor)
        if not under.any():
            return np.where(fixed, floor, scaled)
        fixed |= under


def run_peer_epoch(
    inputs: EpochInputs, memory: MemoryView, config: ControllerConfig
) -> EpochResult:
    """The caps of ``config.policy`` for one epoch. Pure."""
    cfg = config
    views, classes, capacity = inputs.views, inputs.classes, dict(inputs.capacity)
    w0, c0 = time.perf_counter(), time.thread_time()
    policy: SizingPolicy = POLICIES.create(cfg.policy)
    node_of = {k: v.nodes[k] for v in views.values() for k in v.instances}
    held = {k: u for k, u in inputs.unmeasured.items() if k not in node_of}
    held_steps = hold_caps({k: u.cap_cores for k, u in held.items()}, memory.hysteresis)
    held_on: dict[str, float] = {}
    for k, s in held_steps.items():
        held_on[held[k].node] = held_on.get(held[k].node, 0.0) + s.cap
    sizing = SizingInputs(
        epoch=inputs.epoch,
        views=views,
        classes=classes,
        capacity=capacity,
        memory=memory.hysteresis,
        kappa=memory.kappa,
        max_instance_cores=cfg.max_instance_cores,
        min_cap_cores=cfg.min_cap_cores,
    )
    wishes = policy.size(sizing)
    prev = {k: sizing.state(k).cap for k in node_of}
    fallback = {
        k: c if c is not None else sizing.first_cap(views[k.operator_key], k)
        for k, c in prev.items()
    }
    caps_now, cut = bound_and_fit(
        wishes,
        node_of,
        capacity,
        held_on,
        cfg.min_cap_cores,
        cfg.max_instance_cores,
        fallback,
    )
    steps: dict[InstanceKey, HysteresisStep] = {}
    demands: dict[InstanceKey, InstanceDemand] = {}
    for k, cap in caps_now.items():
        w = wishes[k]
        changed, reason = _reason(prev[k], cap, cut.get(k, 0.0) > 1e-12)
        steps[k] = HysteresisStep(cap, changed, reason, w.state._replace(cap=cap))
        wished = w.cores if math.isfinite(w.cores) and w.cores >= 0 else fallback[k]
        demands[k] = InstanceDemand(k, node_of[k], wished, policy.name)
    caps = {k: (node_of[k], c) for k, c in caps_now.items()}
    caps.update({k: (held[k].node, s.cap) for k, s in held_steps.items()})
    steps.update(held_steps)

    apps: dict[str, AppAllocation] = {}
    for k, c in caps_now.items():
        cls = classes[k.app]
        a = apps.get(k.app) or AppAllocation(k.app, cls.name, cls.weight, 0.0, 0.0, 0, 0.0, 0.0)
        a.demand_cores += demands[k].cores
        a.floor_cores += cfg.min_cap_cores
        a.allocated_cores += c
        a.cut_cores += cut.get(k, 0.0)
        apps[k.app] = a
    alloc = QosAllocation(
        cores=dict(caps_now),
        notes=[f"caps set by the {policy.name} sizing policy (config key 'policy')"],
        cut={k: v for k, v in cut.items() if v > 1e-12},
        cut_reason={k: "node capacity" for k, v in cut.items() if v > 1e-12},
        apps=apps,
    )
    forecasts: dict[OperatorKey, OperatorForecast] = {}
    kappa_measured: dict[OperatorKey, float] = {}
    for key, view in views.items():
        kappa = _kappa(view)
        if kappa is not None:
            kappa_measured[key] = kappa
        total = float(view.seconds.sum())
        forecasts[key] = OperatorForecast(
            key=key,
            # The observed rate: peers do not forecast.
            rate=float(view.arrivals @ view.seconds) / total if total > 0 else 0.0,
            predictor=policy.name,
            candidates={},
            kappa=kappa if kappa is not None else memory.kappa.get(key, 0.0),
            selectivity=view.selectivity,
        )
    # Placement judges a peer's wishes as it judges dsched's demands.
    wished = {k: d.cores for k, d in demands.items()}
    peaks = memory.peaks.peaks_with(wished) if memory.peaks is not None else {}
    placement_demands = memory.peaks.placement_with(wished) if memory.peaks is not None else {}
    w1, c1 = time.perf_counter(), time.thread_time()
    zero = {
        f"{stage}{suffix}": 0.0
        for stage in ("forecast", "demand", "hysteresis", "estimate")
        for suffix in ("", "_cpu")
    }
    return EpochResult(
        epoch=inputs.epoch,
        now=inputs.now,
        views=views,
        classes=classes,
        capacity=capacity,
        forecasts=forecasts,
        budgets={},
        demands=demands,
        alloc=alloc,
        room=dict(capacity),
        steps=steps,
        caps=caps,
        estimates={},
        predicted_violation={},
        peaks=peaks,
        placement_demands=placement_demands,
        held=held,
        kappa_measured=kappa_measured,
        source_points={},
        forecast_levels=tuple(
            sorted({c.forecast_quantile for c in cfg.qos.classes.values()} - {0.5})
        ),
        latency_model=cfg.latency_model,
        latency_criterion=cfg.latency_criterion,
        # The policy's whole decision counts as the allocation.
        timing={**zero, "allocate": w1 - w0, "allocate_cpu": c1 - c0},
    )
