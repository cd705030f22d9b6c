"""The other papers' placers behind the same interface: ``even``, ``rstorm``, ``sam``
and ``aniello-offline`` (``aniello-online`` is in :mod:`controller.placement.aniello`,
the two-stage placers in :mod:`controller.placement.heron`).

They were designed to place a topology from scratch, so they keep the current
placement while it is complete and within capacity, and otherwise place every
instance again (an engine's "rebalance").
None of them separates stateful from stateless instances: the node-level
placers run one worker per application per node, as the engines they come
from do.
"""

from __future__ import annotations

import math
from collections import defaultdict

from controller.placement.common import (
    Decision,
    GroupKey,
    PlacementStrategy,
    bfs_instances,
    current_fits,
    fits,
    keep_current,
    least_loaded_fallback,
)
from controller.placement.model import Instance, PlacementInput, operator_order


def _check_number(name: str, value: object, low: float, high: float = math.inf) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        raise ValueError(f"{name} must be a number, got {value!r}")
    if not low <= value <= high:
        raise ValueError(f"{name} must be in [{low}, {high}], got {value!r}")
    return float(value)


def _check_count(name: str, value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return value


class ReplanningStrategy(PlacementStrategy):
    """Keep the placement while it fits; otherwise place everything again."""

    def decide(self, state: PlacementInput, headroom_cores: float) -> Decision:
        ok, why = current_fits(state, headroom_cores)
        if ok:
            return Decision(keep_current(state), (why,))
        groups, reasons = self.fresh(state, headroom_cores)
        return Decision(groups, (why + "; placing every instance again", *reasons))

    def fresh(
        self, state: PlacementInput, headroom_cores: float
    ) -> tuple[dict[str, GroupKey], list[str]]:
        raise NotImplementedError


def _by_app_bfs(state: PlacementInput) -> dict[str, list[Instance]]:
    out: dict[str, list[Instance]] = defaultdict(list)
    for inst in bfs_instances(state):
        out[inst.app].append(inst)
    return out


class EvenStrategy(ReplanningStrategy):
    """Storm's EvenScheduler: executors round-robin over the app's workers, workers
    round-robin over nodes. Blind to demand."""

    name = "even"

    def __init__(self, workers_per_app: int | None = None) -> None:
        self.workers_per_app = _check_count("workers_per_app", workers_per_app)

    def fresh(self, state, headroom_cores):
        nodes = state.node_ids
        groups: dict[str, GroupKey] = {}
        next_node = 0
        for _app, insts in sorted(_by_app_bfs(state).items()):
            count = min(len(insts), self.workers_per_app or len(nodes))
            worker_node = []
            for _ in range(count):
                worker_node.append(nodes[next_node % len(nodes)])
                next_node += 1
            for k, inst in enumerate(insts):
                w = k % count
                groups[inst.id] = GroupKey(worker_node[w], f"w{w}")
        return groups, ["round-robin over workers and nodes"]


class RStormStrategy(ReplanningStrategy):
    """R-Storm as described in "Model-driven Scheduling for Distributed Stream
    Processing Systems" (Shukla and Simmhan, §7.3): one instance of each
    operator per sweep in BFS order, each to the node with the smallest distance
    ``w_cpu * (free - demand)^2 + w_net * [node != last node]`` that has room
    (free and demand as fractions of the largest node)."""

    name = "rstorm"

    def __init__(self, w_cpu: float = 1.0, w_net: float = 1.0) -> None:
        self.w_cpu = _check_number("w_cpu", w_cpu, 0.0)
        self.w_net = _check_number("w_net", w_net, 0.0)

    def fresh(self, state, headroom_cores):
        nodes = state.node_ids
        free = {n: state.capacity(n, headroom_cores) for n in nodes}
        scale = max(max(free.values(), default=1.0), 1e-9)
        groups: dict[str, GroupKey] = {}
        reasons: list[str] = []
        reference = nodes[0]
        for app in state.apps():
            pending: dict[str, list[Instance]] = defaultdict(list)
            for inst in sorted((i for i in state.instances if i.app == app), key=lambda i: i.index):
                pending[inst.operator].append(inst)
            order = operator_order(state, app)
            while any(pending.values()):
                for op in order:
                    if not pending[op]:
                        continue
                    inst = pending[op].pop(0)

                    def distance(n: str, inst: Instance = inst, ref: str = reference) -> float:
                        gap = (free[n] - inst.demand_cores) / scale
                        return self.w_cpu * gap * gap + self.w_net * (n != ref)

                    ranked = sorted(nodes, key=lambda n: (distance(n), nodes.index(n)))
                    target = next((n for n in ranked if fits(free[n], inst.demand_cores)), None)
                    if target is None:
                        target = least_loaded_fallback(state, free, inst.demand_cores)
                        reasons.append(f"{inst.id} fits on no node; put on {target}")
                    free[target] -= inst.demand_cores
                    groups[inst.id] = GroupKey(target)
                    reference = target
        return groups, ["resource-aware distance-based best fit in BFS sweeps", *reasons]


class SamStrategy(ReplanningStrategy):
    """Slot-Aware Mapping (Shukla and Simmhan, §7.4): a full bundle (as many
    instances of one operator as fill a slot of ``slot_cores``) gets an exclusive
    slot on the last used node or the next; the partial bundle goes to the
    best-fit slot. Each slot is a worker."""

    name = "sam"

    def __init__(self, slot_cores: float = 1.0) -> None:
        self.slot_cores = _check_number("slot_cores", slot_cores, 1e-6)

    def fresh(self, state, headroom_cores):
        nodes = state.node_ids
        free = {n: state.capacity(n, headroom_cores) for n in nodes}
        # slot -> (node, free cores in slot)
        slots: dict[tuple[str, int], list] = {}
        groups: dict[str, GroupKey] = {}
        reasons: list[str] = []
        current = 0

        def open_slot(app: str, size: float, need: float) -> tuple[str, int]:
            nonlocal current
            for step in range(len(nodes)):
                n = nodes[(current + step) % len(nodes)]
                if fits(free[n], need):
                    current = (current + step) % len(nodes)
                    take = min(max(size, need), max(free[n], need))
                    break
            else:
                n = least_loaded_fallback(state, free, need)
                take = need
                reasons.append(f"no node has room for a {need:.3g}-core bundle of {app}; used {n}")
            free[n] -= take
            key = (app, len([s for s in slots if s[0] == app]))
            slots[key] = [n, take]
            return key

        for app in state.apps():
            pending: dict[str, list[Instance]] = defaultdict(list)
            for inst in sorted((i for i in state.instances if i.app == app), key=lambda i: i.index):
                pending[inst.operator].append(inst)
            order = operator_order(state, app)
            while any(pending.values()):
                for op in order:
                    insts = pending[op]
                    if not insts:
                        continue
                    mean = sum(i.demand_cores for i in insts) / len(insts)
                    bundle = len(insts) if mean <= 0 else max(1, int(self.slot_cores // mean))
                    if len(insts) >= bundle:
                        chosen, insts[:] = insts[:bundle], insts[bundle:]
                        need = sum(i.demand_cores for i in chosen)
                        key = open_slot(app, self.slot_cores, need)
                        slots[key][1] = 0.0  # exclusive: nothing else joins a full slot
                    else:
                        chosen, insts[:] = list(insts), []
                        need = sum(i.demand_cores for i in chosen)
                        fitting = [
                            k for k, (_, room) in slots.items() if k[0] == app and fits(room, need)
                        ]
                        if fitting:
                            key = min(fitting, key=lambda k: (slots[k][1], k))
                            slots[key][1] -= need
                        else:
                            key = open_slot(app, self.slot_cores, need)
                            slots[key][1] -= need
                    for inst in chosen:
                        groups[inst.id] = GroupKey(slots[key][0], f"s{key[1]}")
        return groups, ["full bundles on exclusive slots, partial bundles best fit", *reasons]


class AnielloOfflineStrategy(ReplanningStrategy):
    """Offline scheduler of "Adaptive Online Scheduling in Storm" (Aniello et
    al., §3.1): operators in topological order, each operator's instances into
    the workers that hold its upstream operators' instances (at most M(alpha)
    per worker; empty workers allowed once past beta of the operators), workers
    round-robin over nodes. Blind to demand, as in the paper."""

    name = "aniello-offline"

    def __init__(
        self, alpha: float = 0.0, beta: float = 0.5, workers_per_app: int | None = None
    ) -> None:
        self.alpha = _check_number("alpha", alpha, 0.0, 1.0)
        self.beta = _check_number("beta", beta, 0.0, 1.0)
        self.workers_per_app = _check_count("workers_per_app", workers_per_app)

    def fresh(self, state, headroom_cores):
        nodes = state.node_ids
        groups: dict[str, GroupKey] = {}
        next_node = 0
        for app, insts in sorted(_by_app_bfs(state).items()):
            executors = len(insts)
            workers = min(executors, self.workers_per_app or len(nodes))
            even = math.ceil(executors / workers)
            limit = even + int(self.alpha * (executors - workers + 1 - even))
            content: list[list[Instance]] = [[] for _ in range(workers)]
            order = operator_order(state, app)
            upstream: dict[str, set[str]] = defaultdict(set)
            for up, down in state.dags.get(app, ()):
                upstream[down].add(up)
            for pos, op in enumerate(order):
                ops_insts = [i for i in insts if i.operator == op]
                allow_empty = pos == 0 or pos + 1 > self.beta * len(order)
                turn = 0
                for inst in ops_insts:
                    near = [
                        w
                        for w in range(workers)
                        if len(content[w]) < limit
                        and any(o.operator in upstream[op] for o in content[w])
                    ]
                    empty = [w for w in range(workers) if not content[w]]
                    if allow_empty and empty:
                        near = near + empty
                    if not near:
                        near = [w for w in range(workers) if len(content[w]) < limit] or list(
                            range(workers)
                        )
                    w = near[turn % len(near)]
                    turn += 1
                    content[w].append(inst)
            for w, members in enumerate(content):
                node = nodes[next_node % len(nodes)]
                next_node += 1
                for inst in members:
                    groups[inst.id] = GroupKey(node, f"w{w}")
        return groups, ["topology order, instances joined with their upstream workers"]


__all__ = [
    "AnielloOfflineStrategy",
    "EvenStrategy",
    "RStormStrategy",
    "ReplanningStrategy",
    "SamStrategy",
]
