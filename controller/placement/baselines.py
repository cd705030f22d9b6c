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
from collections.abc import Mapping

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
from predict.perfmodel import FULL_SLOT_PERCENT, PerformanceModel, split_bundles


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
    """R-Storm ("R-Storm: Resource-aware scheduling in Storm", Peng et al., §4;
    as mapped in "Model-driven Scheduling for Distributed Stream Processing
    Systems", Shukla and Simmhan, §7.3): one instance of each operator per sweep
    in BFS order, each to the node with the smallest distance
    ``w_mem * (free_mem - mem)^2 + w_cpu * (free - demand)^2 + w_net * NWDist``
    that has room (CPU and memory as fractions of the largest node; NWDist 0 on
    the node of the last instance placed, 0.5 in its rack, 1 in another rack).

    Memory is R-Storm's hard constraint: a node whose free memory is below an
    instance's ``memory_mb`` is refused even when the CPU would fit. Where the
    instance's or the node's memory is not known, memory neither limits nor
    steers; nodes without a ``rack`` share one default rack.
    """

    name = "rstorm"

    def __init__(self, w_cpu: float = 1.0, w_net: float = 1.0, w_mem: float = 1.0) -> None:
        self.w_cpu = _check_number("w_cpu", w_cpu, 0.0)
        self.w_net = _check_number("w_net", w_net, 0.0)
        self.w_mem = _check_number("w_mem", w_mem, 0.0)

    def fresh(self, state, headroom_cores):
        nodes = state.node_ids
        free = {n: state.capacity(n, headroom_cores) for n in nodes}
        scale = max(max(free.values(), default=1.0), 1e-9)
        memory = {n: state.node(n).memory_mb for n in nodes}
        free_mem = {n: m for n, m in memory.items() if m is not None}
        mem_scale = max(max(free_mem.values(), default=1.0), 1e-9)
        rack = {n: state.node(n).rack for n in nodes}
        groups: dict[str, GroupKey] = {}
        reasons: list[str] = []
        reference = nodes[0]

        def memory_fits(n: str, inst: Instance) -> bool:
            if inst.memory_mb is None or n not in free_mem:
                return True
            return inst.memory_mb <= free_mem[n] + 1e-9

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
                        d = self.w_cpu * gap * gap
                        if inst.memory_mb is not None and n in free_mem:
                            mem_gap = (free_mem[n] - inst.memory_mb) / mem_scale
                            d += self.w_mem * mem_gap * mem_gap
                        hops = 0.0 if n == ref else (0.5 if rack[n] == rack[ref] else 1.0)
                        return d + self.w_net * hops

                    ranked = sorted(nodes, key=lambda n: (distance(n), nodes.index(n)))
                    target = next(
                        (
                            n
                            for n in ranked
                            if fits(free[n], inst.demand_cores) and memory_fits(n, inst)
                        ),
                        None,
                    )
                    if target is None:
                        roomy = [n for n in nodes if memory_fits(n, inst)]
                        if roomy:
                            target = max(roomy, key=lambda n: (free[n], -nodes.index(n)))
                            reasons.append(f"{inst.id} fits on no node; put on {target}")
                        else:
                            target = least_loaded_fallback(state, free, inst.demand_cores)
                            reasons.append(
                                f"{inst.id} needs {inst.memory_mb:g} MB, more than any node has "
                                f"free; put on {target}"
                            )
                    free[target] -= inst.demand_cores
                    if inst.memory_mb is not None and target in free_mem:
                        free_mem[target] -= inst.memory_mb
                    groups[inst.id] = GroupKey(target)
                    reference = target
        return groups, ["resource-aware distance-based best fit in BFS sweeps", *reasons]


def _check_models(
    models: Mapping[str, object] | None,
) -> dict[str, PerformanceModel]:
    """Operator (or ``app/operator``) -> model; table rows are turned into models
    here, so a bad table is refused at start with its operator named."""
    if models is None:
        return {}
    if not isinstance(models, Mapping):
        raise ValueError(f"models must map operator -> performance model, got {models!r}")
    out = {}
    for key, model in models.items():
        if not isinstance(key, str) or not key:
            raise ValueError(f"models: operator names must be non-empty strings, got {key!r}")
        if isinstance(model, PerformanceModel):
            out[key] = model
        else:
            try:
                out[key] = PerformanceModel.from_table(model, name=key)
            except TypeError as exc:
                raise ValueError(f"models[{key!r}] is not a performance model: {exc}") from None
    return out


def _check_rates(rates: Mapping[str, object] | None) -> dict[str, float]:
    if rates is None:
        return {}
    if not isinstance(rates, Mapping):
        raise ValueError(f"rates must map operator -> tuples/s, got {rates!r}")
    return {key: _check_number(f"rates[{key!r}]", r, 0.0) for key, r in rates.items()}


class SamStrategy(ReplanningStrategy):
    """Slot-Aware Mapping (Shukla and Simmhan, §7.4, Alg. 6): per BFS sweep, an
    operator's next full bundle gets an exclusive slot of ``slot_cores`` on the
    last used node or the next; its partial bundle goes to the best-fit slot
    (least free CPU plus memory that still holds it). Each slot is a worker.

    With a performance model for the operator (``models``: operator or
    ``app/operator`` -> :class:`~predict.perfmodel.PerformanceModel` or its table
    rows), a full bundle is the model's best thread count tau_hat = T(omega_hat)
    and the partial bundle is sized by MBA's c_i, m_i (CPU% and memory% of a
    slot; with the operator's input rate in ``rates`` a single leftover thread is
    scaled to its load, as MBA does, otherwise taken at its peak). Without one,
    a full bundle is as many instances as their mean demand fits in a slot, and
    a partial bundle needs its summed demand.
    """

    name = "sam"

    def __init__(
        self,
        slot_cores: float = 1.0,
        models: Mapping[str, object] | None = None,
        rates: Mapping[str, object] | None = None,
    ) -> None:
        self.slot_cores = _check_number("slot_cores", slot_cores, 1e-6)
        self.models = _check_models(models)
        self.rates = _check_rates(rates)

    def _lookup(self, table: Mapping, app: str, op: str):
        return table.get(f"{app}/{op}", table.get(op))

    def _bundles(
        self, app: str, op: str, insts: list[Instance]
    ) -> list[tuple[int, float, float, bool]]:
        """(instances, cores, memory fraction of a slot, full) per bundle, full ones
        first; a full bundle takes a slot of its own."""
        model = self._lookup(self.models, app, op)
        if model is not None:
            out = []
            for b in split_bundles(len(insts), model, self._lookup(self.rates, app, op)):
                cores = b.cpu_percent / FULL_SLOT_PERCENT * self.slot_cores
                out.append((b.threads, cores, b.memory_percent / FULL_SLOT_PERCENT, b.full))
            return out
        out, rest = [], list(insts)
        while rest:
            mean = sum(i.demand_cores for i in rest) / len(rest)
            size = len(rest) if mean <= 0 else max(1, int(self.slot_cores // mean))
            chosen = rest[:size]
            rest = rest[size:]
            out.append((len(chosen), sum(i.demand_cores for i in chosen), 0.0, size == len(chosen)))
        return out

    def fresh(self, state, headroom_cores):
        nodes = state.node_ids
        free = {n: state.capacity(n, headroom_cores) for n in nodes}
        # slot -> [node, free cores in slot, free memory fraction of slot]
        slots: dict[tuple[str, int], list] = {}
        groups: dict[str, GroupKey] = {}
        reasons: list[str] = []
        by_model: list[str] = []
        by_demand: list[str] = []
        current = 0

        def open_slot(app: str, need: float) -> tuple[str, int]:
            nonlocal current
            for step in range(len(nodes)):
                n = nodes[(current + step) % len(nodes)]
                if fits(free[n], need):
                    current = (current + step) % len(nodes)
                    take = min(max(self.slot_cores, need), max(free[n], need))
                    break
            else:
                n = least_loaded_fallback(state, free, need)
                take = need
                reasons.append(f"no node has room for a {need:.3g}-core bundle of {app}; used {n}")
            free[n] -= take
            key = (app, len([s for s in slots if s[0] == app]))
            slots[key] = [n, take, 1.0]
            return key

        for app in state.apps():
            pending: dict[str, list[Instance]] = defaultdict(list)
            for inst in sorted((i for i in state.instances if i.app == app), key=lambda i: i.index):
                pending[inst.operator].append(inst)
            order = operator_order(state, app)
            bundles: dict[str, list[tuple[int, float, float, bool]]] = {}
            for op in order:
                if pending[op]:
                    bundles[op] = self._bundles(app, op, pending[op])
                    model = self._lookup(self.models, app, op)
                    (by_model if model is not None else by_demand).append(f"{app}/{op}")
            while any(bundles.values()):
                for op in order:
                    if not bundles.get(op):
                        continue
                    count, need, mem, full = bundles[op].pop(0)
                    chosen, pending[op][:] = pending[op][:count], pending[op][count:]
                    if full:
                        key = open_slot(app, need)
                        slots[key][1:] = [0.0, 0.0]  # exclusive: nothing else joins a full slot
                    else:
                        fitting = [
                            k
                            for k, (_, room, mem_room) in slots.items()
                            if k[0] == app and fits(room, need) and mem <= mem_room + 1e-9
                        ]
                        if fitting:
                            key = min(
                                fitting,
                                key=lambda k: (slots[k][1] / self.slot_cores + slots[k][2], k),
                            )
                        else:
                            key = open_slot(app, need)
                        slots[key][1] -= need
                        slots[key][2] -= mem
                    for inst in chosen:
                        groups[inst.id] = GroupKey(slots[key][0], f"s{key[1]}")
        if by_model:
            reasons.append("bundled by performance model: " + ", ".join(by_model))
        if by_demand:
            reasons.append("no performance model, bundled by mean demand: " + ", ".join(by_demand))
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
