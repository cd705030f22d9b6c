"""One control epoch as a pure function: typed inputs in, :class:`EpochResult` out.

    views ─► forecast ─► demand ─► allocate ─► hysteresis + anti-saturation ─► caps
             (stages/     (stages/   (stages/     (stages/hysteresis.py)
             forecast.py) demand.py) allocation.py)

:func:`run_epoch` reads the controller's memory through a read-only
:class:`~controller.memory.MemoryView` and changes nothing; the controller
then commits its caps (:meth:`ControllerMemory.commit_caps`) and the store
saves them, the actuators send them, and only then does the memory learn from
the result (:meth:`ControllerMemory.learn`) and the decision record
(:mod:`controller.record`), the placement loop and the store's log follow.
docs/architecture.md follows one epoch through these files.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from itertools import repeat
from operator import attrgetter, itemgetter

from controller.config import ControllerConfig
from controller.memory import MemoryView
from controller.model import Unmeasured
from controller.qos import QosClass
from controller.stages.allocation import Allocator, QosAllocation, violation_ratio
from controller.stages.columns import KeyedColumn, values_in_order
from controller.stages.demand import (
    DemandEstimator,
    InstanceDemand,
    RateDemand,
    WithBacklogDrain,
    WithFloor,
    WithLatencyTarget,
    app_latency_models,
    estimate_latency_seconds,
    estimate_violation,
    instance_demands,
    latency_budgets,
    latency_needs,
)
from controller.stages.evaluate import OperatorView
from controller.stages.feedback import FeedbackSettings
from controller.stages.flow import bound_by_parents
from controller.stages.forecast import (
    OperatorForecast,
    cost_at_rate,
    forecast,
    size_forecasts,
)
from controller.stages.hysteresis import (
    HysteresisStep,
    fit_quantized_columns,
    hold_caps,
    hysteresis_columns,
)
from controller.stages.interference import interference_factors
from controller.stages.variability import (
    OperatorVariability,
    VariabilitySettings,
    marginal_costs,
    measure_variability,
)
from dsched.ids import InstanceKey, OperatorKey
from predict.interference import InterferenceModel


@dataclass(frozen=True)
class EpochInputs:
    """What one epoch decides from, besides the memory."""

    epoch: int
    now: float
    views: Mapping[OperatorKey, OperatorView]
    classes: Mapping[str, QosClass]  # every app in ``views`` has one
    capacity: Mapping[str, float]  # node -> cores dsched may hand out
    # Instances that reported without usable counters (engine counters missing):
    # not in ``views``; their caps are held.
    unmeasured: Mapping[InstanceKey, Unmeasured] = field(default_factory=dict)
    # Node -> memory bandwidth over the last slot (bytes/s, all resctrl groups),
    # None where the node has no counter (stages/interference.py).
    memory_bandwidth: Mapping[str, float | None] = field(default_factory=dict)


@dataclass
class EpochResult:
    """Everything one epoch decided, with the inputs that explain it."""

    epoch: int
    now: float
    views: Mapping[OperatorKey, OperatorView]
    classes: Mapping[str, QosClass]
    capacity: Mapping[str, float]
    forecasts: dict[OperatorKey, OperatorForecast]
    budgets: dict[OperatorKey, float]  # latency budget per operator, seconds
    demands: dict[InstanceKey, InstanceDemand]
    alloc: QosAllocation
    room: dict[str, float]  # node -> cores usable after headroom
    steps: dict[InstanceKey, HysteresisStep]  # cap, reason and new hysteresis state
    caps: dict[InstanceKey, tuple[str, float]]  # instance -> (node, cap cores)
    estimates: dict[str, float]  # app -> mean latency under the caps (latency_model), seconds
    predicted_violation: dict[str, float]  # app -> predicted violation ratio
    # Highest demand (less its backlog drain) over the peak window (placement).
    peaks: dict[InstanceKey, float]
    # Each instance's demand as placement judges it: less its backlog drain, and
    # averaged over ``placement_demand_seconds``, or over the shorter
    # ``placement_rise_seconds`` where that is more (empty without placement, where
    # the controller falls back to the demand now less its backlog drain).
    placement_demands: dict[InstanceKey, float] = field(default_factory=dict)
    # Unmeasured instances this epoch (their caps, when they have one, are in
    # ``caps`` and ``steps`` with reason "held").
    held: dict[InstanceKey, Unmeasured] = field(default_factory=dict)
    kappa_measured: dict[OperatorKey, float] = field(default_factory=dict)
    source_points: dict[OperatorKey, tuple[float, float]] = field(default_factory=dict)
    # stage -> wall seconds, stage_cpu -> CPU seconds of the epoch's thread
    timing: dict[str, float] = field(default_factory=dict)
    # The forecast quantiles of the configured classes above the point forecast,
    # ascending: the levels the memory's conformal bank tracks adaptively.
    forecast_levels: tuple[float, ...] = ()
    latency_model: str = "allen-cunneen"
    latency_criterion: str = "mean"
    # Per operator: the arrival and service C² the latency model used, and their
    # source (stages/variability.py); the slots the memory keeps for them (0: none).
    variability: dict[OperatorKey, OperatorVariability] = field(default_factory=dict)
    variability_slots: int = 0
    # Latency feedback: the settings the memory moves the gains with (None: off),
    # and the gains this epoch sized each application with.
    feedback: FeedbackSettings | None = None
    latency_gains: dict[str, float] = field(default_factory=dict)
    # Per node: the interference correction applied or why none was
    # (stages/interference.py, Interference.record()).
    interference: dict[str, dict] = field(default_factory=dict)
    # run_epoch(defer_explanation=True): what explain() still has to compute.
    pending_explanation: Callable[[], tuple[dict, dict, dict, dict]] | None = field(
        default=None, repr=False
    )

    def explain(self) -> EpochResult:
        """Fill ``estimates``, ``predicted_violation``, ``peaks`` and
        ``placement_demands`` if run_epoch left them for later (once; later calls
        do nothing)."""
        pending, self.pending_explanation = self.pending_explanation, None
        if pending is not None:
            start = _now()
            (
                self.estimates,
                self.predicted_violation,
                self.peaks,
                self.placement_demands,
            ) = pending()
            self.timing.update(_spans((("estimate", start, _now()),)))
        return self

    def caps_by_node(self) -> dict[str, dict[InstanceKey, float]]:
        out: dict[str, dict[InstanceKey, float]] = {}
        for key, (node, cap) in self.caps.items():
            out.setdefault(node, {})[key] = cap
        return out


def _now() -> tuple[float, float]:
    """(wall, this thread's CPU) seconds: stage timings report both, because on a
    shared machine the wall time of a stage says as much about the neighbours."""
    return time.perf_counter(), time.thread_time()


def _spans(
    stages: tuple[tuple[str, tuple[float, float], tuple[float, float]], ...],
) -> dict[str, float]:
    """stage -> wall seconds and stage_cpu -> CPU seconds."""
    out = {}
    for name, (w0, c0), (w1, c1) in stages:
        out[name] = w1 - w0
        out[f"{name}_cpu"] = c1 - c0
    return out


_node = attrgetter("node")  # of an InstanceDemand
_app = itemgetter(0)  # of an InstanceKey


def build_estimator(
    config: ControllerConfig, needs: Mapping[OperatorKey, float] | None = None
) -> DemandEstimator:
    """Rate demand, raised to meet latency budgets (``needs``, when given), plus
    backlog drain, never below the minimum cap."""
    inner: DemandEstimator = RateDemand()
    if needs is not None:
        inner = WithLatencyTarget(inner, needs, config.max_instance_cores)
    return WithFloor(
        WithBacklogDrain(inner, drain_seconds=config.backlog_drain_slots * config.slot_seconds),
        floor_cores=config.min_cap_cores,
    )


def run_epoch(
    inputs: EpochInputs,
    memory: MemoryView,
    config: ControllerConfig,
    allocator: Allocator,
    *,
    defer_explanation: bool = False,
) -> EpochResult:
    """Forecast, demand, allocation, hysteresis and caps for one epoch. Pure.

    With ``defer_explanation`` the estimates, predicted violations and peaks are
    left to :meth:`EpochResult.explain`, which the controller calls once the
    directives are on their way: they explain the caps and feed placement, and
    a thousand-node epoch spends some 40 ms on them.

    Under a peer sizing policy (config key ``policy``) the peer's rule takes the
    place of all four (controller/peers)."""
    if config.policy != "dsched":
        from controller.peers.epoch import run_peer_epoch

        return run_peer_epoch(inputs, memory, config)
    cfg = config
    views, classes, capacity = inputs.views, inputs.classes, inputs.capacity
    t0 = _now()
    fc = forecast(
        views,
        cfg.phi,
        memory.sources,
        memory.kappa,
        tuple(cfg.predictors),
        kappa_estimator=cfg.kappa_estimator,
    )
    t_demand = _now()
    # Demand is sized for each class's forecast quantile of next slot's arrivals.
    forecasts = size_forecasts(
        fc.forecasts,
        {k: classes[k.app].forecast_quantile for k in fc.forecasts if k.app in classes},
        memory.forecast_bank,
        median=cfg.forecast_median == "on",
    )
    if cfg.cost_model == "marginal":
        forecasts = cost_at_rate(
            forecasts,
            views,
            marginal_costs(
                views, memory.variability, cfg.variability_slots, cfg.variability_min_slots
            ),
        )
    # Latency feedback: an application over its measured aim is sized for a
    # tighter target and drains sooner (stages/feedback.py).
    gains = (
        {a: memory.latency_gain.get(a, 1.0) for a in classes}
        if cfg.latency_feedback == "on"
        else {}
    )
    budgets = latency_budgets(
        views, forecasts, {a: c.target_seconds * gains.get(a, 1.0) for a, c in classes.items()}
    )
    by_quantile = cfg.latency_criterion == "quantile"
    model = cfg.latency_model
    variability = measure_variability(
        views,
        memory.variability,
        VariabilitySettings(
            cfg.variability,
            cfg.arrival_scv,
            cfg.service_scv,
            cfg.variability_slots,
            cfg.variability_min_slots,
            cfg.variability_min_tuples,
            cfg.scv_min,
            cfg.scv_max,
        ),
    )
    # Fixed: the configured scalars (the vectorised paths broadcast them).
    fixed = cfg.variability != "measured"
    arrival_scv = cfg.arrival_scv if fixed else variability.arrival()
    service_scv = cfg.service_scv if fixed else variability.service()
    interference = interference_factors(
        views,
        inputs.memory_bandwidth,
        cfg.memory_bandwidth_peak_bytes_per_second,
        InterferenceModel(cfg.interference_threshold, cfg.interference_slope),
        enabled=cfg.interference == "on",
        nodes=capacity,
    )
    needs = latency_needs(
        views,
        forecasts,
        budgets,
        arrival_scv,
        service_scv,
        model=model,
        quantiles={a: c.sojourn_quantile for a, c in classes.items()} if by_quantile else None,
    )
    # build_estimator's composition, over all instances at once.
    demands = instance_demands(
        views,
        forecasts,
        needs,
        cfg.max_instance_cores,
        drain_seconds=cfg.backlog_drain_slots * cfg.slot_seconds,
        floor_cores=cfg.min_cap_cores,
        kappa_factor=interference.factors,
        drain_scale=gains or None,
    )
    models = (
        app_latency_models(
            views,
            forecasts,
            demands,
            cfg.min_cap_cores,
            arrival_scv,
            service_scv,
            model=model,
            budgets=budgets if by_quantile else None,
        )
        if cfg.dp_value == "latency"
        else None
    )
    # Held caps stay whole: the measured instances share what they leave of each node.
    held = {k: u for k, u in inputs.unmeasured.items() if k not in demands}
    held_steps = hold_caps({k: u.cap_cores for k, u in held.items()}, memory.hysteresis)
    held_on: dict[str, float] = {}
    for k, s in held_steps.items():
        held_on[held[k].node] = held_on.get(held[k].node, 0.0) + s.cap
    t_alloc = _now()
    alloc = allocator.allocate(
        demands,
        {n: max(0.0, c - held_on.get(n, 0.0)) for n, c in capacity.items()},
        classes,
        models,
    )
    if cfg.flow_bound == "on":
        bound_by_parents(alloc, demands, views, forecasts, cfg.min_cap_cores)
    t_hyst = _now()
    # Per-instance inputs as columns in the demands' order: the stages read
    # them in a row instead of hashing every instance key (stages/columns.py).
    keys = list(demands)
    nodes = list(map(_node, demands.values()))
    node_of = KeyedColumn(keys, nodes)
    max_cap = KeyedColumn(keys, list(map(capacity.get, nodes, repeat(math.inf))))
    # apply_hysteresis then fit_quantized_caps, on columns: the steps are built once.
    cols = hysteresis_columns(
        alloc.cores,
        memory.hysteresis,
        cfg.theta_cores,
        max_cap,
        cfg.hysteresis_band,
        cfg.lower_after_epochs,
        cfg.cap_rounding,
        cfg.lower_after_falls,
    )
    room = {n: max(0.0, c - cfg.headroom_cores) for n, c in capacity.items()}
    weight = {a: c.weight for a, c in classes.items()}
    fit_quantized_columns(
        cols,
        alloc.cores,
        node_of,
        KeyedColumn(cols.keys, list(map(weight.__getitem__, map(_app, cols.keys)))),
        {n: max(0.0, r - held_on.get(n, 0.0)) for n, r in room.items()},
        cfg.min_cap_cores,
        cfg.hysteresis_band,
    )
    steps = cols.steps()
    step_caps = cols.cap.tolist()
    measured_caps = KeyedColumn(cols.keys, step_caps)
    caps = dict(
        zip(
            steps,
            zip(values_in_order(node_of, list(steps)), step_caps, strict=True),
            strict=True,
        )
    )
    caps.update({k: (held[k].node, s.cap) for k, s in held_steps.items()})
    steps.update(held_steps)

    def explanation() -> tuple[dict, dict, dict, dict]:
        """What the record and placement read: the latency under the caps, the
        predicted violation, the demand peaks and the demands placement judges.
        None of it changes a cap."""
        estimates = estimate_latency_seconds(
            views,
            forecasts,
            measured_caps,
            arrival_scv,
            service_scv,
            cfg.max_instance_cores,
            model,
        )
        if by_quantile:
            tails = estimate_violation(
                views,
                forecasts,
                measured_caps,
                budgets,
                arrival_scv,
                service_scv,
                cfg.max_instance_cores,
                model,
            )
            predicted_violation = {a: tails[a] for a in sorted({k.app for k in views})}
        else:
            predicted_violation = {
                a: float(violation_ratio([estimates[a]], classes[a].target_seconds)[0])
                for a in sorted({k.app for k in views})
            }
        # A queue drains within backlog_drain_slots and a move pauses the
        # instance: placement leaves the drain out of what it judges.
        lasting = {k: d.cores - d.backlog_cores for k, d in demands.items()}
        if memory.peaks is None:
            return estimates, predicted_violation, {}, {}
        return (
            estimates,
            predicted_violation,
            memory.peaks.peaks_with(lasting),
            memory.peaks.placement_with(lasting),
        )

    t_end = _now()
    result = EpochResult(
        epoch=inputs.epoch,
        now=inputs.now,
        views=views,
        classes=classes,
        capacity=capacity,
        forecasts=forecasts,
        budgets=budgets,
        demands=demands,
        alloc=alloc,
        room=room,
        steps=steps,
        caps=caps,
        estimates={},
        predicted_violation={},
        peaks={},
        held=held,
        kappa_measured=fc.kappa_measured,
        source_points=fc.source_points,
        forecast_levels=tuple(
            sorted({c.forecast_quantile for c in cfg.qos.classes.values()} - {0.5})
        ),
        latency_model=model,
        latency_criterion=cfg.latency_criterion,
        variability=variability.by_operator,
        # The slot totals are kept for the measured C² and the marginal cost.
        variability_slots=0 if fixed and cfg.cost_model != "marginal" else cfg.variability_slots,
        feedback=FeedbackSettings(
            max(1, round(cfg.latency_feedback_seconds / cfg.slot_seconds)),
            cfg.latency_feedback_aim,
            cfg.slot_seconds,
        )
        if cfg.latency_feedback == "on"
        else None,
        latency_gains=gains,
        interference=interference.record(),
        timing={
            **_spans(
                (
                    ("forecast", t0, t_demand),
                    ("demand", t_demand, t_alloc),
                    ("allocate", t_alloc, t_hyst),
                    ("hysteresis", t_hyst, t_end),
                )
            ),
        },
    )
    result.pending_explanation = explanation
    if not defer_explanation:
        result.explain()
    return result
