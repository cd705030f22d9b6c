"""When placement must act, and its plan (step 7 of the epoch).

:class:`controller.placement.loop.PlacementLoop` calls :func:`plan_placement`
off the fast loop with this epoch's typed demands::

    plan = plan_placement(
        demands,                      # InstanceKey -> PlacementDemand(node, cores, peak)
        capacity=capacity,            # node -> cores
        current=current,              # instance id -> (worker, stateful)
        strategy=strategy,            # built once: build_strategy(...)
        headroom_cores=headroom,
        dags=dags,                    # optional, improves BFS order
    )

It returns a plan only when a node's predicted demand exceeds its capacity
minus headroom, an instance sits on a node that is gone, or a node's whole
demand fits in the spare room of the others (it can be emptied); and only
when that plan moves (or recommends) something. Otherwise it returns None
and the epoch moves nothing; in an epoch that needs no plan the strategy's
``observe`` is called instead, so strategies that count epochs (``liu``'s
scale-in patience) see every one. Instances in ``pinned`` (instance id ->
why, e.g. "flink places subtasks itself") are recommend-only: their moves
leave the plan's ``moves`` for its ``recommended`` (see
:func:`recommend_only`). Build the strategy once and pass the same object
each epoch. Tools that replay decision records build the demands with
:func:`demands_from_record`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from controller.memory import epochs_covering
from controller.placement import get_strategy
from controller.placement.common import PlacementStrategy, build_plan, node_loads
from controller.placement.model import (
    EPSILON_CORES,
    Instance,
    Move,
    Node,
    PlacementInput,
    Plan,
    Recommendation,
    Worker,
    instance_id,
)
from dsched.ids import InstanceKey

#: Where each instance runs now, from the controller's histories: id -> (worker, stateful).
Current = Mapping[str, tuple[str, bool]]


def current_from_histories(histories: Mapping[Any, Any]) -> dict[str, tuple[str, bool]]:
    """``current`` for :func:`plan_placement` from ``ObservedCluster.histories``."""
    return {
        instance_id(k.app, k.operator, k.instance): (h.worker, bool(h.stateful))
        for k, h in histories.items()
    }


def dags_from_topologies(topologies: Mapping[str, Any]) -> dict[str, list[tuple[str, str]]]:
    """Operator edges per app from ``ObservedCluster.topologies`` (parents)."""
    return {
        app: [(parent, op) for op, parents in topo.parents.items() for parent in parents]
        for app, topo in topologies.items()
    }


@dataclass(frozen=True)
class PlacementDemand:
    """What placement needs of one instance: where it runs and what it needs."""

    node: str
    cores: float
    peak_cores: float | None = None  # highest demand over the peak window


def demands_from_record(
    record: Mapping[str, Any], demand_field: str = "demand_cores"
) -> dict[InstanceKey, PlacementDemand]:
    """Typed demands from a decision record's ``instances`` rows (replays, tools).

    ValueError naming the row when one lacks a field; a row's optional
    ``peak_demand_cores`` becomes the instance's peak. With the default
    ``demand_field`` the demand is what the controller's placement judged: the
    row's ``placement_demand_cores`` where it has one, else its demand less its
    ``backlog_cores`` (the part that drains its queue)."""
    rows = record.get("instances")
    if not isinstance(rows, list):
        raise ValueError("record['instances'] must be a list")
    out: dict[InstanceKey, PlacementDemand] = {}
    for i, row in enumerate(rows):
        try:
            key = InstanceKey(row["app"], row["operator"], row["instance"])
            cores = row[demand_field]
            if demand_field == "demand_cores":
                cores = row.get("placement_demand_cores", cores - row.get("backlog_cores", 0.0))
            out[key] = PlacementDemand(row["node"], cores, row.get("peak_demand_cores"))
        except (KeyError, TypeError) as exc:
            raise ValueError(f"record['instances'][{i}] lacks {exc}") from None
    return out


def build_placement_input(
    demands: Mapping[InstanceKey, PlacementDemand],
    capacity: Mapping[str, float],
    current: Current,
    *,
    dags: Mapping[str, Sequence[tuple[str, str]]] | None = None,
    traffic: Mapping[tuple[str, str], float] | None = None,
) -> PlacementInput:
    """The planner's input; ValueError naming what is wrong."""
    instances, workers = [], {}
    for (app, op, index), d in demands.items():
        iid = instance_id(app, op, index)
        if iid not in current:
            raise ValueError(f"current has no worker for instance {iid}")
        worker, stateful = current[iid]
        instances.append(Instance(app, op, index, d.cores, stateful, worker, d.node, d.peak_cores))
        known = workers.get(worker)
        if known is None:
            workers[worker] = Worker(worker, app, d.node, stateful)
        elif known.node != d.node or known.stateful != stateful:
            # Per node one worker of each kind: a name seen on two nodes or with
            # both kinds is a mixed worker.
            workers[worker] = Worker(worker, app, known.node, None)
    return PlacementInput(
        nodes=tuple(Node(node, cores) for node, cores in capacity.items()),
        instances=tuple(instances),
        workers=tuple(workers.values()),
        dags={a: tuple(tuple(e) for e in edges) for a, edges in (dags or {}).items()},
        traffic=dict(traffic or {}),
    )


def placement_needed(
    state: PlacementInput, headroom_cores: float, scale_in: bool = True
) -> list[str]:
    """Why placement must run this epoch (empty: it need not).

    With ``scale_in`` False a node that could be emptied is no reason to plan.
    """
    return _needs(state, headroom_cores, scale_in)[0]


def _needs(state: PlacementInput, headroom_cores: float, scale_in: bool) -> tuple[list[str], bool]:
    """:func:`placement_needed`'s reasons, and whether overload is the only one."""
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
    overloaded = len(reasons)
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
    return reasons, overloaded == len(reasons)


def build_strategy(
    name: str,
    slot_seconds: float,
    scale_in_wait_seconds: float,
    scale_in_wait_stateless_seconds: float = 0.0,
    **options,
):
    """The strategy ``name`` for a controller whose epoch is ``slot_seconds``, with
    its typed options (config ``[placement.<name>]``). ``liu`` waits before it
    empties a node: its waits (holding a stateful worker, holding only stateless
    ones), given in seconds, become plans of this slot; ``aniello-online`` counts
    its overload window in slots of this length."""
    if name == "liu":
        # One plan per epoch: a wait in seconds is the plans that cover it.
        options.setdefault(
            "scale_in_patience", epochs_covering(scale_in_wait_seconds, slot_seconds)
        )
        options.setdefault(
            "stateless_scale_in_patience",
            epochs_covering(scale_in_wait_stateless_seconds, slot_seconds),
        )
    if name == "aniello-online":
        # Its overload window X_i is in seconds; each plan or observation is one slot.
        options.setdefault("slot_seconds", slot_seconds)
    return get_strategy(name, **options)


def plan_placement(
    demands: Mapping[InstanceKey, PlacementDemand],
    capacity: Mapping[str, float],
    current: Current,
    strategy: PlacementStrategy | str = "liu",
    *,
    headroom_cores: float = 0.0,
    dags: Mapping[str, Sequence[tuple[str, str]]] | None = None,
    traffic: Mapping[tuple[str, str], float] | None = None,
    scale_in: bool = True,
    pinned: Mapping[str, str] | None = None,
    min_relief_cores: float = 0.0,
) -> Plan | None:
    """A plan when placement must act and the strategy moves or recommends
    something, else None.

    ``scale_in`` False: only overload and vanished nodes trigger a plan (pass a
    strategy built without scale in too, e.g. ``get_strategy("liu", scale_in=False)``).
    ``pinned``: instance id -> why dsched must not move it; its moves are only
    recommended. ``min_relief_cores``: a plan made for overload alone must
    lower the overload by at least this much per instance it moves
    (:func:`relieves`).
    """
    for name, value in (("headroom_cores", headroom_cores), ("min_relief_cores", min_relief_cores)):
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not (0 <= value < float("inf"))
        ):
            raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    if not capacity:
        # No node is connected (its agents all left): there is nowhere to place
        # anything, and nothing to plan until one is back.
        return None
    if isinstance(strategy, str):
        strategy = get_strategy(strategy)
    state = build_placement_input(demands, capacity, current, dags=dags, traffic=traffic)
    why, overload_only = _needs(state, headroom_cores, scale_in)
    if not why:
        strategy.observe(state, headroom_cores)
        return None
    plan = strategy.plan(state, headroom_cores=headroom_cores)
    # Judged as the strategy planned it: moves of pinned instances relieve a node
    # once their engine carries out the recommendation.
    if plan.moves and overload_only and not relieves(state, plan, headroom_cores, min_relief_cores):
        return None
    if pinned:
        plan = recommend_only(state, plan, pinned, headroom_cores)
    if not plan.moves and not plan.recommended:
        return None
    return replace(plan, reasons=(*why, *plan.reasons))


def overload_cores(
    state: PlacementInput, assignment: Mapping[str, tuple[str, str]], headroom_cores: float
) -> float:
    """How far the nodes' demand exceeds their usable capacity, summed over the nodes,
    with the instances where ``assignment`` (id -> (worker, node)) puts them."""
    loads = node_loads(state, {i: node for i, (_worker, node) in assignment.items()})
    return sum(max(0.0, used - state.capacity(n, headroom_cores)) for n, used in loads.items())


def relieves(
    state: PlacementInput, plan: Plan, headroom_cores: float, min_relief_cores: float = 0.0
) -> bool:
    """Whether a plan made for overload alone (no instance displaced, no node to
    empty) is worth its moves: it empties a node, or it lowers the cores by which
    nodes are over capacity by more than ``min_relief_cores`` per instance it
    moves (any amount, with 0).

    Moving an instance between two nodes that are both over, or onto one it
    pushes over by as much as it relieves, pauses the instance and relieves
    nothing: the allocator cuts the caps to fit each node either way. Nor is a
    few thousandths of a core worth a pause: a demand measured under caps swings
    by more than that from epoch to epoch, and a move made for it is often undone
    by the next plan."""
    current = state.current_assignment()
    if plan.nodes_used < len({node for _worker, node in current.values()}):
        return True
    before = overload_cores(state, current, headroom_cores)
    needed = max(EPSILON_CORES, min_relief_cores * len(plan.moves))
    return overload_cores(state, plan.assignment, headroom_cores) < before - needed


def recommend_only(
    state: PlacementInput, plan: Plan, pinned: Mapping[str, str], headroom_cores: float = 0.0
) -> Plan:
    """``plan`` with the moves of ``pinned`` instances turned into recommendations.

    Pinned instances stay where they are in the plan's assignment (one that
    sits on a vanished node is left out: its engine places it again), and the
    plan's costs (affected workers, stateful moves, overloaded nodes...) are
    those of the moves dsched carries out. Only moves to another node are
    recommended (the engine runs its own workers). The reasons say how many
    moves are only recommended and why.
    """
    held_back = [m for m in plan.moves if m.instance in pinned]
    if not held_back:
        return plan
    # A new worker on the same node says nothing to an engine that runs its own
    # workers (a Flink TaskManager's slots are its own business): not recommended.
    recommended = tuple(
        Recommendation(m, pinned[m.instance]) for m in held_back if m.to_node != m.from_node
    )
    before = state.current_assignment()
    gone = {i.id for i in state.instances if i.id in pinned and i.id not in before}
    if gone:
        state = replace(
            state,
            instances=tuple(i for i in state.instances if i.id not in gone),
            traffic={k: v for k, v in state.traffic.items() if not set(k) & gone},
        )
    assignment = {
        i: (before[i] if i in pinned else where)
        for i, where in plan.assignment.items()
        if i not in gone
    }
    kept = build_plan(
        state,
        plan.strategy,
        assignment,
        plan.workers,
        (),
        headroom_cores,
        plan.plan_seconds,
    )
    why = sorted({pinned[m.instance] for m in held_back})
    reasons = [
        r
        for r in plan.reasons
        if not r.startswith(("no placement found within capacity", "no move"))
    ]
    return replace(
        kept,
        reasons=(
            *reasons,
            *kept.reasons,
            f"{len(recommended)} move(s) only recommended: {'; '.join(why)}",
        ),
        recommended=recommended,
    )


def _move_dict(m: Move) -> dict[str, Any]:
    return {
        "instance": m.instance,
        "from_node": m.from_node,
        "to_node": m.to_node,
        "from_worker": m.from_worker,
        "to_worker": m.to_worker,
        "stateful": m.stateful,
    }


def placement_summary(plan: Plan) -> dict[str, Any]:
    """What goes into the decision record (and the demo JSON) about a plan."""
    return {
        "strategy": plan.strategy,
        "moves": [_move_dict(m) for m in plan.moves],
        "recommended": [{**_move_dict(r.move), "reason": r.reason} for r in plan.recommended],
        "affected_workers": len(plan.affected_workers),
        "affected_stateful_workers": len(plan.affected_stateful_workers),
        "stateful_moves": plan.stateful_moves,
        "nodes_used": plan.nodes_used,
        "feasible": plan.feasible,
        "reasons": list(plan.reasons),
    }
