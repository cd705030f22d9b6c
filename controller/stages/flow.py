"""Stage 4b of the epoch: no operator is granted more than its parents can send it.

A parent granted ``G_p`` cores processes at most ``G_p / kappa_p`` tuples per
second next slot, whatever arrives at it, and its children receive that times
its selectivity (``rho_p``, the same edge model as the DAG propagation of the
forecast). A child whose demand was sized for more -- its own forecast ran ahead
of its parents', or the division cut its parents -- would hold CPU it cannot
use while the operator that limits the chain waits for its own. In the decision
records of the two-node live benchmark this was most of dsched's unused CPU:
where the division cut WordCount, the source used all of its grant while split
and count were granted a quarter more than they used.

:func:`bound_by_parents` walks each application in topological order. For an
operator with parents, ``inflow = sum_p rho_p * G_p / kappa_p`` (``G_p`` as
bounded itself); where that is below the rate its demand was sized for
(:attr:`OperatorForecast.demand_rate`), each instance's demand less its backlog
drain is scaled by ``inflow / rate``, its backlog drain kept whole (the queue is
already there), never below the minimum cap, and the grant is lowered to that
where it was above. The CPU taken back is recorded as a cut with its reason; it
is not handed to anyone else. An operator with a parent of unknown cost (kappa
0) or one whose instances are not all in the division (a held instance's cap is
not a grant) bounds nothing.
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
        for op in topological_order(parents):
            if not parents[op]:
                continue
            key = OperatorKey(app, op)
            inflow = _inflow(app, parents[op], ops, alloc, forecasts)
            fc = forecasts.get(key)
            if inflow is None or fc is None or not inflow < fc.demand_rate:
                continue
            share = inflow / fc.demand_rate
            for k in ops[op].instances:
                d, granted = demands.get(k), alloc.cores.get(k)
                if d is None or granted is None:
                    continue
                bound = max(floor_cores, (d.cores - d.backlog_cores) * share + d.backlog_cores)
                if granted > bound:
                    taken[k] = granted - bound
                    alloc.cores[k] = bound
                    alloc.cut[k] = alloc.cut.get(k, 0.0) + taken[k]
                    alloc.cut_reason[k] = _joined(
                        alloc.cut_reason.get(k),
                        f"flow {taken[k]:.3f} (parents send at most {inflow:.4g}/s "
                        f"of {fc.demand_rate:.4g}/s)",
                    )
    for k, cores in taken.items():
        summary = alloc.apps.get(k.app)
        if summary is not None:
            summary.allocated_cores -= cores
            summary.cut_cores += cores
    return taken


def _inflow(
    app: str,
    parent_ops: tuple[str, ...],
    ops: Mapping[str, OperatorView],
    alloc: QosAllocation,
    forecasts: Mapping[OperatorKey, OperatorForecast],
) -> float | None:
    """Tuples per second the parents can send at most under their grants; None
    where a parent's cost or grant is unknown."""
    total = 0.0
    for p in parent_ops:
        fc = forecasts.get(OperatorKey(app, p))
        grants = [alloc.cores.get(k) for k in ops[p].instances]
        if fc is None or fc.selectivity is None or not fc.kappa > 0:
            return None
        if not grants or None in grants:
            return None
        total += fc.selectivity * sum(grants) / fc.kappa  # type: ignore[arg-type]
    return total


def _joined(before: str | None, reason: str) -> str:
    return reason if not before else f"{before}, {reason}"
