"""Step 7 of the epoch: decide whether placement must act, and plan it.

The controller calls :func:`plan_placement` once per epoch, after caps are
decided, with the decision record it already builds (``Controller._record``)::

    from controller.placement import get_strategy
    from controller.placement_stage import (
        current_from_histories, dags_from_topologies, placement_summary, plan_placement,
    )

    strategy = get_strategy(config.placement)            # once, at start
    # dry-run: get_move_actuator("log-only"); enforce on the testbed:
    # get_move_actuator("testbed", url=config.testbed_url)  (controller.migration)
    plan = plan_placement(
        record,                                          # this epoch's record
        capacity=self.state.node_capacity(),             # node -> cores
        current=current_from_histories(self.state.histories),
        strategy=strategy,
        headroom_cores=config.headroom_cores,
        dags=dags_from_topologies(self.state.topologies),  # optional, improves BFS order
    )
    if plan is not None:
        record["placement"] = placement_summary(plan)
        result = move_actuator.execute(plan)             # controller.migration
        record["placement"]["result"] = result.to_dict()

It returns a plan only when a node's predicted demand exceeds its capacity
minus headroom, an instance sits on a node that is gone, or a node's whole
demand fits in the spare room of the others (it can be emptied); and only
when that plan moves something. Otherwise it returns None and the epoch
moves nothing; in an epoch that needs no plan the strategy's ``observe`` is
called instead, so strategies that count epochs (``liu``'s scale-in
patience) see every one. Build the strategy once and pass the same object
each epoch.
"""

from __future__ import annotations

import inspect
import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from controller.placement import STRATEGIES, get_strategy
from controller.placement.common import PlacementStrategy
from controller.placement.model import (
    EPSILON_CORES,
    ClusterState,
    Instance,
    Node,
    Plan,
    Worker,
    instance_id,
)

#: Where each instance runs now, from the controller's histories: id -> (worker, stateful).
Current = Mapping[str, tuple[str, bool]]


def current_from_histories(histories: Mapping[Any, Any]) -> dict[str, tuple[str, bool]]:
    """``current`` for :func:`plan_placement` from ``controller.state.ClusterState.histories``."""
    return {
        instance_id(k.app, k.operator, k.instance): (h.worker, bool(h.stateful))
        for k, h in histories.items()
    }


def dags_from_topologies(topologies: Mapping[str, Any]) -> dict[str, list[tuple[str, str]]]:
    """Operator edges per app from ``controller.state.ClusterState.topologies`` (parents)."""
    return {
        app: [(parent, op) for op, parents in topo.parents.items() for parent in parents]
        for app, topo in topologies.items()
    }


class DemandPeaks:
    """Each instance's highest predicted demand over the last ``window`` epochs.

    ``liu`` places stateful instances where their workers keep room for these
    peaks: a stateful worker that outgrows its node must carry its state
    elsewhere, a stateless one only restarts. Call :meth:`observe` every epoch,
    planned or not, so the window is a run of consecutive epochs. An instance
    that stops reporting is forgotten; one that comes back starts afresh.
    """

    def __init__(self, window: int) -> None:
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ValueError(f"window (epochs) must be an int >= 1, got {window!r}")
        self.window = window
        self._demands: dict[str, deque[float]] = {}

    @classmethod
    def for_slot(cls, peak_seconds: float, slot_seconds: float) -> DemandPeaks:
        """The window covering ``peak_seconds`` of epochs of ``slot_seconds`` (at least one)."""
        return cls(max(1, math.ceil(peak_seconds / slot_seconds - 1e-9)))

    def observe(self, rows: Sequence[Mapping[str, Any]]) -> dict[str, float]:
        """Record this epoch's ``demand_cores`` rows; instance id -> its peak.

        Rows that lack a field or carry no finite demand >= 0 are left out (the
        planner's input check names them): a bad demand does not enter the
        window, and the instance keeps the window it had.
        """
        return {iid: peak for _, iid, peak in self._record(rows)}

    def annotate(self, rows: Sequence[dict[str, Any]]) -> None:
        """:meth:`observe`, writing each peak into its row as ``peak_demand_cores``."""
        for row, _, peak in self._record(rows):
            row["peak_demand_cores"] = peak

    def _record(self, rows: Sequence[Mapping[str, Any]]) -> list[tuple[Any, str, float]]:
        """(row, instance id, peak) for every row with a good demand."""
        out: list[tuple[Any, str, float]] = []
        present: set[str] = set()
        for row in rows:
            try:
                iid = instance_id(row["app"], row["operator"], row["instance"])
            except (KeyError, TypeError, ValueError):
                continue
            present.add(iid)
            try:
                demand = float(row["demand_cores"])
            except (KeyError, TypeError, ValueError):
                continue
            if not (math.isfinite(demand) and demand >= 0):
                continue
            seen = self._demands.get(iid)
            if seen is None:
                seen = self._demands[iid] = deque(maxlen=self.window)
            seen.append(demand)
            out.append((row, iid, max(seen)))
        for iid in set(self._demands) - present:
            del self._demands[iid]
        return out


def build_cluster_state(
    record: Mapping[str, Any],
    capacity: Mapping[str, float],
    current: Current,
    *,
    dags: Mapping[str, Sequence[tuple[str, str]]] | None = None,
    traffic: Mapping[tuple[str, str], float] | None = None,
    demand_field: str = "demand_cores",
) -> ClusterState:
    """The planner's input from a decision record; ValueError naming what is wrong.

    A row's optional ``peak_demand_cores`` (see :class:`DemandPeaks`) becomes
    the instance's peak.
    """
    rows = record.get("instances")
    if not isinstance(rows, list):
        raise ValueError("record['instances'] must be a list")
    instances, workers = [], {}
    for i, row in enumerate(rows):
        try:
            app, op, index, node = row["app"], row["operator"], row["instance"], row["node"]
            demand = row[demand_field]
        except (KeyError, TypeError) as exc:
            raise ValueError(f"record['instances'][{i}] lacks {exc}") from None
        iid = instance_id(app, op, index)
        if iid not in current:
            raise ValueError(f"current has no worker for instance {iid}")
        worker, stateful = current[iid]
        peak = row.get("peak_demand_cores")
        instances.append(Instance(app, op, index, demand, stateful, worker, node, peak))
        known = workers.get(worker)
        if known is None:
            workers[worker] = Worker(worker, app, node, stateful)
        elif known.node != node or known.stateful != stateful:
            # Per node one worker of each kind: a name seen on two nodes or with
            # both kinds is a mixed worker.
            workers[worker] = Worker(worker, app, known.node, None)
    return ClusterState(
        nodes=tuple(Node(node, cores) for node, cores in capacity.items()),
        instances=tuple(instances),
        workers=tuple(workers.values()),
        dags={a: tuple(tuple(e) for e in edges) for a, edges in (dags or {}).items()},
        traffic=dict(traffic or {}),
    )


def placement_needed(
    state: ClusterState, headroom_cores: float, scale_in: bool = True
) -> list[str]:
    """Why placement must run this epoch (empty: it need not).

    With ``scale_in`` False a node that could be emptied is no reason to plan.
    """
    reasons = []
    load = dict.fromkeys(state.node_ids, 0.0)
    for inst in state.instances:
        if inst.node in load:
            load[inst.node] += inst.demand_cores
    for node, used in load.items():
        if used > state.capacity(node, headroom_cores) + EPSILON_CORES:
            reasons.append(
                f"node {node} over capacity: {used:.2f} > "
                f"{state.capacity(node, headroom_cores):.2f} cores"
            )
    displaced = state.displaced()
    if displaced:
        reasons.append(f"{len(displaced)} instances on nodes that are gone")
    spare = {n: state.capacity(n, headroom_cores) - load[n] for n in load}
    for node, used in sorted(load.items(), key=lambda kv: kv[1]):
        if used <= 0 or not scale_in:
            continue
        room = sum(max(0.0, s) for n, s in spare.items() if n != node and load[n] > 0)
        if used <= room + EPSILON_CORES:
            reasons.append(f"node {node} ({used:.2f} cores) can be emptied")
            break
    return reasons


def build_strategy(name: str, slot_seconds: float, scale_in_wait_seconds: float):
    """The strategy ``name`` for a controller whose epoch is ``slot_seconds``: a
    strategy that waits before a stateful scale in gets its wait in plans."""
    if "scale_in_patience" in inspect.signature(STRATEGIES[name]).parameters:
        plans = max(1, math.ceil(scale_in_wait_seconds / slot_seconds - 1e-9))
        return get_strategy(name, scale_in_patience=plans)
    return get_strategy(name)


def plan_placement(
    record: Mapping[str, Any],
    capacity: Mapping[str, float],
    current: Current,
    strategy: PlacementStrategy | str = "liu",
    *,
    headroom_cores: float = 0.0,
    dags: Mapping[str, Sequence[tuple[str, str]]] | None = None,
    traffic: Mapping[tuple[str, str], float] | None = None,
    demand_field: str = "demand_cores",
    scale_in: bool = True,
) -> Plan | None:
    """A plan when placement must act and the strategy moves something, else None.

    ``scale_in`` False: only overload and vanished nodes trigger a plan (pass a
    strategy built without scale in too, e.g. ``get_strategy("liu", scale_in=False)``).
    """
    if (
        isinstance(headroom_cores, bool)
        or not isinstance(headroom_cores, int | float)
        or not (headroom_cores >= 0)
    ):
        raise ValueError(f"headroom_cores must be a number >= 0, got {headroom_cores!r}")
    if isinstance(strategy, str):
        strategy = get_strategy(strategy)
    state = build_cluster_state(
        record, capacity, current, dags=dags, traffic=traffic, demand_field=demand_field
    )
    why = placement_needed(state, headroom_cores, scale_in)
    if not why:
        strategy.observe(state, headroom_cores)
        return None
    plan = strategy.plan(state, headroom_cores=headroom_cores)
    if not plan.moves:
        return None
    return replace(plan, reasons=(*why, *plan.reasons))


def placement_summary(plan: Plan) -> dict[str, Any]:
    """What goes into the decision record (and the demo JSON) about a plan."""
    return {
        "strategy": plan.strategy,
        "moves": [
            {
                "instance": m.instance,
                "from_node": m.from_node,
                "to_node": m.to_node,
                "from_worker": m.from_worker,
                "to_worker": m.to_worker,
                "stateful": m.stateful,
            }
            for m in plan.moves
        ],
        "affected_workers": len(plan.affected_workers),
        "affected_stateful_workers": len(plan.affected_stateful_workers),
        "stateful_moves": plan.stateful_moves,
        "nodes_used": plan.nodes_used,
        "feasible": plan.feasible,
        "reasons": list(plan.reasons),
    }
