"""Stage 4b of the epoch: no operator is granted more than its parents can send it.

A parent sends at most what it can process next slot times its selectivity
(``rho_p``, the edge model of the forecast's DAG propagation), and it can
process at most what its grant allows (``G_p / kappa_p`` tuples/s) and at most
what reaches it (its own rate as bounded here, or what it processed over the
window if that was more) plus its queue drained (its backlog-drain cores over
``kappa_p``). A child sized for more -- its own forecast ran ahead of its
parents', or the division cut its parents -- would hold CPU it cannot use while
the operator that limits the chain waits for its own: a shortfall divided in
proportion to demand leaves the operators downstream of a cut one with CPU for
tuples it cannot send them, and that CPU stands idle (docs/controller.md, "Flow
bound", has the measurement).

:func:`bound_by_parents` walks each application in topological order. For an
operator with parents, ``inflow`` is the sum of what they can send; where that
is below the rate its demand was sized for (:attr:`OperatorForecast.demand_rate`),
each instance's demand less its backlog drain is scaled by ``inflow / rate``, its
backlog drain kept whole (the queue is already there), never below the minimum
cap, and the grant is lowered to that where it was above. The CPU taken back is
recorded as a cut with its reason; it is not handed to anyone else. An operator
with a parent of unknown cost (kappa 0) or one whose instances are not all in
the division (a held instance's cap is not a grant) bounds nothing.
"""

from __future__ import annotations

from collections.abc import Mapping

from controller.stages.allocation import QosAllocation
from controller.stages.demand import InstanceDemand
from controller.stages.evaluate import OperatorView
from controller.stages.forecast import OperatorForecast
from dsched.dag import topological_order
from dsched.ids import InstanceKey, OperatorKey

FLOW_BOUNDS = ("on", "off")


def bound_by_parents(
    alloc: QosAllocation,
    demands: Mapping[InstanceKey, InstanceDemand],
    views: Mapping[OperatorKey, OperatorView],
    forecasts: Mapping[OperatorKey, OperatorForecast],
    floor_cores: float,
) -> dict[InstanceKey, float]:
    """Lower ``alloc``'s grants (in place) to what each operator's parents can
    send it; returns the cores taken back per instance (only where some were)."""
    taken: dict[InstanceKey, float] = {}
    by_app: dict[str, dict[str, OperatorView]] = {}
    for key, view in views.items():
        by_app.setdefault(key.app, {})[key.operator] = view
    for app, ops in by_app.items():
        parents = {op: tuple(p for p in v.upstream if p in ops) for op, v in ops.items()}
        # Tuples/s each operator can send next slot (None: unknown).
        sends: dict[str, float | None] = {}
        for op in topological_order(parents):
            key = OperatorKey(app, op)
            fc = forecasts.get(key)
            inflow = _inflow(parents[op], sends) if parents[op] else None
            share = 1.0
            if inflow is not None and fc is not None and inflow < fc.demand_rate:
                share = inflow / fc.demand_rate
                for k in ops[op].instances:
                    cut = _bound(alloc, demands.get(k), k, share, floor_cores)
                    if cut > 0:
                        taken[k] = cut
                        alloc.cut[k] = alloc.cut.get(k, 0.0) + cut
                        alloc.cut_reason[k] = _joined(
                            alloc.cut_reason.get(k),
                            f"flow {cut:.3f} (parents send at most {inflow:.4g}/s "
                            f"of {fc.demand_rate:.4g}/s)",
                        )
            sends[op] = _sends(ops[op], alloc, demands, fc, share)
    for k, cores in taken.items():
        summary = alloc.apps.get(k.app)
        if summary is not None:
            summary.allocated_cores -= cores
            summary.cut_cores += cores
    return taken


def _bound(
    alloc: QosAllocation,
    d: InstanceDemand | None,
    k: InstanceKey,
    share: float,
    floor_cores: float,
) -> float:
    """Lower one instance's grant to its demand at ``share`` of its rate (its
    backlog drain whole, never below the floor); the cores taken back."""
    granted = alloc.cores.get(k)
    if d is None or granted is None:
        return 0.0
    bound = max(floor_cores, (d.cores - d.backlog_cores) * share + d.backlog_cores)
    if granted <= bound:
        return 0.0
    alloc.cores[k] = bound
    return granted - bound


def _sends(
    view: OperatorView,
    alloc: QosAllocation,
    demands: Mapping[InstanceKey, InstanceDemand],
    fc: OperatorForecast | None,
    share: float,
) -> float | None:
    """What an operator can send next slot: at most what its grant processes
    (grant / kappa), and at most what reaches it (its rate, bounded by its own
    parents, or its rate over the window if more) plus its queue drained
    (backlog cores / kappa), times its selectivity. None where its cost,
    selectivity or a grant is unknown (a held instance's cap is not a grant)."""
    if fc is None or fc.selectivity is None or not fc.kappa > 0:
        return None
    if not view.instances or any(k not in alloc.cores for k in view.instances):
        return None
    granted = sum(alloc.cores[k] for k in view.instances)
    backlog = sum(demands[k].backlog_cores for k in view.instances if k in demands)
    # Never below what it processed over the window: a slot whose counters were
    # read late shows no arrivals and forecasts next to nothing, and a bound from
    # that alone would starve every operator below it for the epoch.
    reaching = max(fc.demand_rate * share, view.window_mean(view.executed))
    processed = min(granted / fc.kappa, reaching + backlog / fc.kappa)
    return fc.selectivity * processed


def _inflow(parent_ops: tuple[str, ...], sends: Mapping[str, float | None]) -> float | None:
    """Tuples/s the parents can send together; None if any parent's is unknown."""
    total = 0.0
    for p in parent_ops:
        value = sends.get(p)
        if value is None:
            return None
        total += value
    return total


def _joined(before: str | None, reason: str) -> str:
    return reason if not before else f"{before}, {reason}"
