"""What every strategy shares: the interface, ordering, capacity bookkeeping,
worker naming and the cost figures of a plan.

A strategy only decides, for each instance, a node and a *group* on that node
(a label such as ``sf``/``sl`` for separated workers, a slot or a container
number). :class:`PlacementStrategy` turns groups into workers, keeping the id
of an existing worker for the group that overlaps it most, so that a worker
whose instances do not change is not counted as restarted. The figures of
:class:`~controller.placement.model.Plan` are computed here, the same way for
every strategy, so strategies are compared on equal terms.
"""

from __future__ import annotations

import abc
import math
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from controller.placement.model import (
    EPSILON_CORES,
    Instance,
    Move,
    PlacementInput,
    Plan,
    Worker,
    operator_order,
)


@dataclass(frozen=True)
class GroupKey:
    """Where a strategy puts an instance: a node and a worker group on it.

    ``kind`` is the group's statefulness (True/False) when the strategy keeps
    stateful and stateless instances apart, None when it does not.
    """

    node: str
    label: str = ""
    kind: bool | None = None


@dataclass(frozen=True)
class Decision:
    """A strategy's raw answer: a group for every instance, and why."""

    groups: Mapping[str, GroupKey]
    reasons: tuple[str, ...] = ()


class PlacementStrategy(abc.ABC):
    """One placement decision, many strategies: ``plan(state, headroom_cores) -> Plan``."""

    name: str = ""

    def plan(self, state: PlacementInput, headroom_cores: float = 0.0) -> Plan:
        headroom_cores = check_headroom(headroom_cores)
        started = time.perf_counter()
        decision = self.decide(state, headroom_cores)
        missing = [i.id for i in state.instances if i.id not in decision.groups]
        if missing:
            raise RuntimeError(f"strategy {self.name} left instances unplaced: {missing[:5]}")
        assignment, workers = name_workers(state, decision.groups)
        seconds = time.perf_counter() - started
        return build_plan(
            state, self.name, assignment, workers, decision.reasons, headroom_cores, seconds
        )

    @abc.abstractmethod
    def decide(self, state: PlacementInput, headroom_cores: float) -> Decision:
        """Group for every instance of ``state``."""

    def observe(self, state: PlacementInput, headroom_cores: float = 0.0) -> None:
        """An epoch in which the caller decided no plan was needed.

        Strategies that count epochs (``liu``'s scale-in patience) update their
        memory here, so that "consecutive plans" means consecutive epochs.
        """
        return None  # most strategies keep no memory between epochs


def check_headroom(headroom_cores: float) -> float:
    if isinstance(headroom_cores, bool) or not isinstance(headroom_cores, int | float):
        raise ValueError(f"headroom_cores must be a number, got {headroom_cores!r}")
    if math.isnan(headroom_cores) or headroom_cores < 0:
        raise ValueError(f"headroom_cores must be >= 0, got {headroom_cores!r}")
    return float(headroom_cores)


# -- ordering -----------------------------------------------------------------


def bfs_instances(
    state: PlacementInput, instances: Iterable[Instance] | None = None
) -> list[Instance]:
    """Instances in breadth-first order of their DAG (apps by name, then index)."""
    chosen = state.instances if instances is None else tuple(instances)
    rank: dict[tuple[str, str], int] = {}
    for app in {i.app for i in chosen}:
        for pos, op in enumerate(operator_order(state, app)):
            rank[(app, op)] = pos
    return sorted(chosen, key=lambda i: (i.app, rank[(i.app, i.operator)], i.index))


def neighbours(state: PlacementInput) -> dict[str, dict[str, float]]:
    """Instance id -> {other instance id: tuples/s in both directions}."""
    out: dict[str, dict[str, float]] = defaultdict(dict)
    for (src, dst), rate in state.traffic.items():
        if src == dst:
            continue
        out[src][dst] = out[src].get(dst, 0.0) + rate
        out[dst][src] = out[dst].get(src, 0.0) + rate
    return out


def dag_neighbours(state: PlacementInput) -> dict[str, set[str]]:
    """Instance id -> instances of adjacent operators (for strategies that only see the DAG)."""
    by_op: dict[tuple[str, str], list[str]] = defaultdict(list)
    for inst in state.instances:
        by_op[(inst.app, inst.operator)].append(inst.id)
    out: dict[str, set[str]] = defaultdict(set)
    for app, edges in state.dags.items():
        for up, down in edges:
            for a in by_op.get((app, up), ()):
                for b in by_op.get((app, down), ()):
                    out[a].add(b)
                    out[b].add(a)
    return out


# -- capacity -----------------------------------------------------------------


def fits(free_cores: float, demand: float) -> bool:
    return demand <= free_cores + EPSILON_CORES


def node_loads(state: PlacementInput, node_of: Mapping[str, str]) -> dict[str, float]:
    loads = dict.fromkeys(state.node_ids, 0.0)
    demand = {i.id: i.demand_cores for i in state.instances}
    for inst, node in node_of.items():
        if node in loads:
            loads[node] += demand[inst]
    return loads


def overloaded_nodes(
    state: PlacementInput, node_of: Mapping[str, str], headroom_cores: float
) -> tuple[str, ...]:
    loads = node_loads(state, node_of)
    return tuple(
        n for n in state.node_ids if loads[n] > state.capacity(n, headroom_cores) + EPSILON_CORES
    )


def current_fits(state: PlacementInput, headroom_cores: float) -> tuple[bool, str]:
    """Whether the current placement is complete and within capacity, and if not, why."""
    placed = state.current_assignment()
    displaced = [i.id for i in state.instances if i.id not in placed]
    if displaced:
        return False, f"{len(displaced)} instance(s) unplaced or on a vanished node"
    over = overloaded_nodes(state, {i: n for i, (_, n) in placed.items()}, headroom_cores)
    if over:
        return False, f"node(s) over capacity: {', '.join(over)}"
    return True, "current placement is complete and within capacity"


def keep_current(state: PlacementInput) -> dict[str, GroupKey]:
    """Groups that reproduce the current placement exactly (one group per worker)."""
    workers = state.live_workers()
    return {
        inst: GroupKey(node, f"keep:{worker}", workers[worker].stateful)
        for inst, (worker, node) in state.current_assignment().items()
    }


class FreeTree:
    """Free cores of nodes by position, for the first node with room and the
    roomiest node in O(log n) instead of a scan of every node.

    Each inner entry is the largest free room below it. A query walks down to
    the leftmost leaf that satisfies a predicate that is monotone in the room
    (more room never turns it false): then an entry satisfies it exactly when
    some leaf below does, so the answer is the one a scan in node order finds.
    """

    def __init__(self, free: Iterable[float]):
        leaves = list(free)
        size = 1
        while size < len(leaves):
            size *= 2
        self.size = size
        self.tree = [-math.inf] * (2 * size)
        self.tree[size : size + len(leaves)] = leaves
        for i in range(size - 1, 0, -1):
            self.tree[i] = max(self.tree[2 * i], self.tree[2 * i + 1])

    def set(self, pos: int, free: float) -> None:
        tree = self.tree
        i = pos + self.size
        tree[i] = free
        i //= 2
        while i:
            tree[i] = max(tree[2 * i], tree[2 * i + 1])
            i //= 2

    def first(self, ok, start: int = 0) -> int | None:
        """Position of the first node from ``start`` on whose room satisfies the
        monotone ``ok``; None when there is none."""
        tree, size = self.tree, self.size
        if start >= size:
            return None
        i = start + size
        while True:
            if ok(tree[i]):
                while i < size:
                    i = 2 * i if ok(tree[2 * i]) else 2 * i + 1
                return i - size
            # On to the subtree just right of this one.
            while i & 1:
                i >>= 1
            if i == 0:
                return None
            i += 1

    def first_fit(self, demand: float) -> int | None:
        """The first node where ``demand`` fits (:func:`fits`)."""
        return self.first(lambda room: fits(room, demand))

    def roomiest(self, demand: float = 0.0) -> int:
        """The first of the nodes with most room once ``demand`` is taken from it:
        ``max(nodes, key=(room - demand, -position))``."""
        best = self.tree[1] - demand
        found = self.first(lambda room: room - demand >= best)
        assert found is not None
        return found


def least_loaded_fallback(state: PlacementInput, free: dict[str, float], demand: float) -> str:
    """The node with most free cores, for an instance that fits nowhere."""
    return max(state.node_ids, key=lambda n: (free[n] - demand, -state.node_index[n]))


def first_fit_decreasing(
    state: PlacementInput, headroom_cores: float, fixed: Mapping[str, str] | None = None
) -> tuple[dict[str, str], bool]:
    """Instance -> node by first-fit decreasing over nodes in id order; and whether all fit.

    Instances in ``fixed`` (instance -> node) stay where they are and are packed
    around; they count as fitting only if their node holds them.
    """
    fixed = dict(fixed or {})
    free = {n: state.capacity(n, headroom_cores) for n in state.node_ids}
    demand = {i.id: i.demand_cores for i in state.instances}
    for inst_id, node in fixed.items():
        free[node] -= demand[inst_id]
    ok = all(fits(room, 0.0) for room in free.values())
    node_of = dict(fixed)
    # The first node with room (else the roomiest: least_loaded_fallback), found
    # in a tree of the rooms rather than by a scan of every node per instance.
    nodes = state.node_ids
    rooms = FreeTree(free[n] for n in nodes)
    for inst in sorted(state.instances, key=lambda i: (-i.demand_cores, i.id)):
        if inst.id in fixed:
            continue
        pos = rooms.first_fit(inst.demand_cores)
        if pos is None:
            ok = False
            pos = rooms.roomiest(inst.demand_cores)
        target = nodes[pos]
        node_of[inst.id] = target
        free[target] -= inst.demand_cores
        rooms.set(pos, free[target])
    return node_of, ok


# -- workers ------------------------------------------------------------------


def _worker_id(app: str, group: GroupKey) -> str:
    if group.label:
        return f"{app}@{group.node}:{group.label}"
    return f"{app}@{group.node}"


def name_workers(
    state: PlacementInput, groups: Mapping[str, GroupKey]
) -> tuple[dict[str, tuple[str, str]], tuple[Worker, ...]]:
    """Turn groups into workers, keeping existing worker ids where instances stay together.

    Each (app, group) becomes one worker. An existing live worker of the same
    app and node gives its id to the new group sharing most of its instances
    (greedy, largest overlap first, one to one); other groups get fresh ids.
    """
    instances = state.instance_map()
    members: dict[tuple[str, GroupKey], set[str]] = defaultdict(set)
    for inst_id, group in groups.items():
        members[(instances[inst_id].app, group)].add(inst_id)

    old_members: dict[str, set[str]] = defaultdict(set)
    for inst_id, (worker, _) in state.current_assignment().items():
        old_members[worker].add(inst_id)
    live = state.live_workers()

    # Live workers by (app, node), each list in the order of ``live``: a group
    # only ever meets the workers of its app on its node (the candidates, and
    # so the choice, are those of a scan of every live worker per group).
    live_at: dict[tuple[str, str], list[str]] = defaultdict(list)
    for wid, worker in live.items():
        live_at[(worker.app, worker.node)].append(wid)
    candidates: list[tuple[int, str, str, tuple[str, GroupKey]]] = []
    for key, insts in members.items():
        app, group = key
        for wid in live_at.get((app, group.node), ()):
            overlap = len(insts & old_members[wid])
            if overlap:
                candidates.append((overlap, wid, _worker_id(app, group), key))
    candidates.sort(key=lambda c: (-c[0], c[1], c[2]))
    chosen: dict[tuple[str, GroupKey], str] = {}
    taken: set[str] = set()
    for _, wid, _, key in candidates:
        if key in chosen or wid in taken:
            continue
        chosen[key] = wid
        taken.add(wid)

    used_ids = set(live) | {w.id for w in state.workers}
    for key in sorted(members, key=lambda k: (k[0], k[1].node, k[1].label)):
        if key in chosen:
            continue
        base = _worker_id(*key)
        wid, n = base, 1
        while wid in used_ids:
            n += 1
            wid = f"{base}-{n}"
        used_ids.add(wid)
        chosen[key] = wid

    assignment: dict[str, tuple[str, str]] = {}
    workers: list[Worker] = []
    for key, insts in members.items():
        app, group = key
        wid = chosen[key]
        kinds = {instances[i].stateful for i in insts}
        kind = group.kind if group.kind is not None else (kinds.pop() if len(kinds) == 1 else None)
        workers.append(Worker(wid, app, group.node, kind))
        for inst in insts:
            assignment[inst] = (wid, group.node)
    workers.sort(key=lambda w: w.id)
    return assignment, tuple(workers)


# -- figures ------------------------------------------------------------------


def inter_node_traffic(state: PlacementInput, node_of: Mapping[str, str]) -> float:
    """Tuples/s between instances on different nodes (pairs with an unknown node are skipped)."""
    total = 0.0
    for (src, dst), rate in state.traffic.items():
        a, b = node_of.get(src), node_of.get(dst)
        if a is not None and b is not None and a != b:
            total += rate
    return total


def build_plan(
    state: PlacementInput,
    strategy: str,
    assignment: Mapping[str, tuple[str, str]],
    workers: tuple[Worker, ...],
    reasons: Iterable[str],
    headroom_cores: float,
    plan_seconds: float,
) -> Plan:
    instances = state.instance_map()
    before = state.current_assignment()
    live = state.live_workers()

    moves: list[Move] = []
    for inst in bfs_instances(state):
        new = assignment[inst.id]
        old = before.get(inst.id)
        if old == new:
            continue
        from_worker, from_node = old if old is not None else (inst.worker, inst.node)
        moves.append(Move(inst.id, from_worker, from_node, new[0], new[1], inst.stateful))

    old_members: dict[str, set[str]] = {w: set() for w in live}
    for inst_id, (worker, _) in before.items():
        old_members[worker].add(inst_id)
    new_members: dict[str, set[str]] = defaultdict(set)
    for inst_id, (worker, _) in assignment.items():
        new_members[worker].add(inst_id)

    affected = sorted(w for w, insts in old_members.items() if new_members.get(w, set()) != insts)
    affected_stateful = [w for w in affected if any(instances[i].stateful for i in old_members[w])]
    restarted_stateful = sum(1 for w in affected for i in old_members[w] if instances[i].stateful)
    new_workers = sorted(w for w in new_members if w not in live)
    stateful_moves = sum(1 for m in moves if m.stateful and m.from_worker is not None)
    mixed = sum(
        1 for insts in new_members.values() if len({instances[i].stateful for i in insts}) > 1
    )
    node_after = {i: n for i, (_, n) in assignment.items()}
    node_before = {i: n for i, (_, n) in before.items()}
    over = overloaded_nodes(state, node_after, headroom_cores)
    reasons = list(reasons)
    if over:
        reasons.append(
            "no placement found within capacity; still over capacity: " + ", ".join(over)
        )
    if not moves:
        reasons.append("no move needed" if not over else "no move found that helps")
    return Plan(
        strategy=strategy,
        moves=tuple(moves),
        assignment=dict(assignment),
        workers=workers,
        affected_workers=tuple(affected),
        affected_stateful_workers=tuple(affected_stateful),
        new_workers=tuple(new_workers),
        stateful_moves=stateful_moves,
        restarted_stateful=restarted_stateful,
        nodes_used=len(set(node_after.values())),
        mixed_workers=mixed,
        overloaded_nodes=over,
        inter_node_traffic_before=inter_node_traffic(state, node_before),
        inter_node_traffic_after=inter_node_traffic(state, node_after),
        plan_seconds=plan_seconds,
        reasons=tuple(reasons),
    )


def apply_plan(state: PlacementInput, plan: Plan, **changes) -> PlacementInput:
    """The state after ``plan`` is carried out (for simulations and tests).

    ``changes`` replaces other fields (e.g. new demands come in as ``instances``
    built from the returned state).
    """
    instances = tuple(
        replace(i, worker=plan.assignment[i.id][0], node=plan.assignment[i.id][1])
        for i in state.instances
    )
    fields = {
        "nodes": state.nodes,
        "instances": instances,
        "workers": plan.workers,
        "dags": state.dags,
        "traffic": state.traffic,
    }
    fields.update(changes)
    return PlacementInput(**fields)
