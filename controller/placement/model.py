"""Inputs and output of placement: the cluster as the planner sees it, and a plan.

Everything is plain, validated data. A :class:`PlacementInput` is built once per
epoch from the controller's view (nodes and their CPU capacity, workers, every
instance with its predicted demand and current worker, each application's
operator DAG and the measured traffic between instances). Strategies read it
and return a :class:`Plan`; they never mutate it.

Bad input fails loudly with a ``ValueError`` that names the field, except one
case that happens in normal operation: an instance or worker on a node that is
no longer listed (the node died or was removed). Those instances are
*displaced*: the plan must place them again, and it says so in its reasons.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType

from dsched.dag import topological_order
from dsched.ids import instance_id
from dsched.names import check_name

#: Capacity comparisons tolerate this much rounding in summed float demands.
EPSILON_CORES = 1e-9


def _check_cores(field_name: str, owner: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{field_name} of {owner} must be a number, got {value!r}")
    if math.isnan(value) or math.isinf(value):
        raise ValueError(f"{field_name} of {owner} must be finite, got {value!r}")
    if value < 0:
        raise ValueError(f"{field_name} of {owner} must be >= 0, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class Node:
    """A machine (or a CPU share standing for one) with ``capacity_cores`` of CPU.

    ``clock_hz`` is the speed of one of its cores; None (the default) for
    every node means equal speeds. Only strategies that measure load in Hz
    (``aniello-online``) read it: a core-second on a 2 GHz node is half of one
    on a 1 GHz node.

    ``memory_mb`` is the memory instances may use there (None: not known, so
    not a limit); ``rack`` names its rack (None: the one default rack, as
    Storm assumes without a rack mapping). Only ``rstorm`` reads them.
    """

    id: str
    capacity_cores: float
    clock_hz: float | None = None
    memory_mb: float | None = None
    rack: str | None = None

    def __post_init__(self) -> None:
        check_name("node id", self.id)
        object.__setattr__(
            self,
            "capacity_cores",
            _check_cores("capacity_cores", f"node {self.id}", self.capacity_cores),
        )
        if self.clock_hz is not None:
            clock = _check_cores("clock_hz", f"node {self.id}", self.clock_hz)
            if clock <= 0:
                raise ValueError(f"clock_hz of node {self.id} must be > 0, got {self.clock_hz!r}")
            object.__setattr__(self, "clock_hz", clock)
        if self.memory_mb is not None:
            object.__setattr__(
                self, "memory_mb", _check_cores("memory_mb", f"node {self.id}", self.memory_mb)
            )
        if self.rack is not None and (not isinstance(self.rack, str) or not self.rack):
            raise ValueError(
                f"rack of node {self.id} must be a non-empty string, got {self.rack!r}"
            )


@dataclass(frozen=True)
class Worker:
    """A process of one application on one node.

    ``stateful`` is True for a worker that holds only stateful instances, False
    for only stateless ones, and None for a worker that may hold both (the way
    most engines place by default).
    """

    id: str
    app: str
    node: str
    stateful: bool | None = None

    def __post_init__(self) -> None:
        check_name("worker id", self.id)
        check_name(f"app of worker {self.id}", self.app)
        check_name(f"node of worker {self.id}", self.node)


@dataclass(frozen=True)
class Instance:
    """One parallel instance of an operator, with its predicted CPU demand.

    ``worker`` and ``node`` are where it runs now; both None for an instance
    that has never been placed. ``memory_mb`` is the memory it needs (None:
    not known); only ``rstorm`` reads it.
    """

    app: str
    operator: str
    index: int
    demand_cores: float
    stateful: bool
    worker: str | None = None
    node: str | None = None
    peak_demand_cores: float | None = None
    memory_mb: float | None = None

    def __post_init__(self) -> None:
        check_name("app", self.app)
        check_name(f"operator of app {self.app}", self.operator)
        if isinstance(self.index, bool) or not isinstance(self.index, int) or self.index < 0:
            raise ValueError(
                f"index of {self.app}/{self.operator} must be an int >= 0, got {self.index!r}"
            )
        object.__setattr__(
            self,
            "demand_cores",
            _check_cores("demand_cores", f"instance {self.id}", self.demand_cores),
        )
        if not isinstance(self.stateful, bool):
            raise ValueError(
                f"stateful of instance {self.id} must be a bool, got {self.stateful!r}"
            )
        if self.peak_demand_cores is not None:
            object.__setattr__(
                self,
                "peak_demand_cores",
                _check_cores("peak_demand_cores", f"instance {self.id}", self.peak_demand_cores),
            )
        if self.memory_mb is not None:
            object.__setattr__(
                self,
                "memory_mb",
                _check_cores("memory_mb", f"instance {self.id}", self.memory_mb),
            )
        if (self.worker is None) != (self.node is None):
            raise ValueError(
                f"worker and node of instance {self.id} must be both set or both None, "
                f"got worker={self.worker!r} node={self.node!r}"
            )

    @property
    def id(self) -> str:
        return instance_id(self.app, self.operator, self.index)

    @property
    def peak_cores(self) -> float:
        """The most this instance is expected to need soon: its peak, never below its demand."""
        if self.peak_demand_cores is None:
            return self.demand_cores
        return max(self.demand_cores, self.peak_demand_cores)


Edge = tuple[str, str]


def _freeze(mapping: Mapping) -> Mapping:
    return MappingProxyType(dict(mapping))


@dataclass(frozen=True)
class PlacementInput:
    """What a strategy plans from.

    ``dags`` maps an application to its operator edges (upstream, downstream);
    an application missing from it is treated as operators without edges.
    ``traffic`` maps (sending instance id, receiving instance id) to measured
    tuples per second.
    """

    nodes: tuple[Node, ...]
    instances: tuple[Instance, ...]
    workers: tuple[Worker, ...] = ()
    dags: Mapping[str, tuple[Edge, ...]] = field(default_factory=dict)
    traffic: Mapping[tuple[str, str], float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "nodes", tuple(self.nodes))
        object.__setattr__(self, "instances", tuple(self.instances))
        object.__setattr__(self, "workers", tuple(self.workers))
        object.__setattr__(self, "dags", _freeze({a: tuple(e) for a, e in self.dags.items()}))
        object.__setattr__(self, "traffic", _freeze(self.traffic))
        _unique("nodes", [n.id for n in self.nodes])
        _unique("instances", [i.id for i in self.instances])
        _unique("workers", [w.id for w in self.workers])
        workers = {w.id: w for w in self.workers}
        ids = {i.id for i in self.instances}
        for inst in self.instances:
            if inst.worker is None or inst.worker not in workers:
                continue
            worker = workers[inst.worker]
            if worker.app != inst.app:
                raise ValueError(
                    f"worker of instance {inst.id} is {worker.id}, which belongs to app {worker.app}"
                )
            if worker.node != inst.node:
                raise ValueError(
                    f"node of instance {inst.id} is {inst.node} but its worker {worker.id} "
                    f"runs on {worker.node}"
                )
        for key, rate in self.traffic.items():
            if not (isinstance(key, tuple) and len(key) == 2):
                raise ValueError(f"traffic key must be (sender id, receiver id), got {key!r}")
            for end in key:
                if end not in ids:
                    raise ValueError(f"traffic names unknown instance {end!r}")
            _check_cores("traffic", f"{key[0]} -> {key[1]}", rate)
        for app, edges in self.dags.items():
            for edge in edges:
                if not (isinstance(edge, tuple) and len(edge) == 2):
                    raise ValueError(
                        f"dags[{app!r}] edge must be (upstream, downstream), got {edge!r}"
                    )
            operator_order(self, app)  # raises on a cycle

    # -- views --------------------------------------------------------------

    # Views are cached: strategies ask for them inside per-instance loops, and a
    # state is immutable, so building them once per state is enough.
    @cached_property
    def node_ids(self) -> tuple[str, ...]:
        return tuple(n.id for n in self.nodes)

    @cached_property
    def node_index(self) -> dict[str, int]:
        """Position of each node in ``nodes`` (the order strategies break ties by)."""
        return {n: i for i, n in enumerate(self.node_ids)}

    @cached_property
    def _nodes_by_id(self) -> dict[str, Node]:
        return {n.id: n for n in self.nodes}

    def capacity(self, node: str, headroom_cores: float = 0.0) -> float:
        """Usable cores of ``node``: capacity minus headroom, never below zero."""
        return max(0.0, self.node(node).capacity_cores - headroom_cores)

    def node(self, node_id: str) -> Node:
        return self._nodes_by_id[node_id]

    def live_workers(self) -> dict[str, Worker]:
        """Workers whose node is still listed."""
        live = set(self.node_ids)
        return {w.id: w for w in self.workers if w.node in live}

    def current_assignment(self) -> dict[str, tuple[str, str]]:
        """Instance id -> (worker, node) for every instance that still has a live placement.

        An instance on a vanished node, on a worker that is not listed, or never
        placed is absent: it is displaced.
        """
        live = self.live_workers()
        return {
            i.id: (i.worker, i.node)
            for i in self.instances
            if i.worker is not None and i.worker in live
        }

    def displaced(self) -> tuple[Instance, ...]:
        placed = self.current_assignment()
        return tuple(i for i in self.instances if i.id not in placed)

    @cached_property
    def operators_by_app(self) -> dict[str, tuple[str, ...]]:
        """App -> its operators, in the order they first appear among the instances."""
        out: dict[str, dict[str, None]] = {}
        for i in self.instances:
            out.setdefault(i.app, {})[i.operator] = None
        return {app: tuple(ops) for app, ops in out.items()}

    def instance_map(self) -> dict[str, Instance]:
        return {i.id: i for i in self.instances}

    def apps(self) -> tuple[str, ...]:
        return tuple(sorted({i.app for i in self.instances}))


def _unique(field_name: str, ids: list[str]) -> None:
    seen: set[str] = set()
    for i in ids:
        if i in seen:
            raise ValueError(f"{field_name} lists {i!r} twice")
        seen.add(i)


def operator_order(state: PlacementInput, app: str) -> list[str]:
    """Operators of ``app`` in breadth-first order from its sources.

    Operators that appear only in instances (no edges) come after, by name.
    Raises ValueError naming ``dags[app]`` when the graph has a cycle.
    """
    parents: dict[str, list[str]] = {op: [] for op in state.operators_by_app.get(app, ())}
    for up, down in state.dags.get(app, ()):
        parents.setdefault(up, [])
        parents.setdefault(down, []).append(up)
    try:
        return topological_order(parents)
    except ValueError:
        raise ValueError(f"dags[{app!r}] has a cycle") from None


@dataclass(frozen=True)
class Move:
    """One instance changing worker. ``from_worker``/``from_node`` are None for an
    instance placed for the first time; ``from_node`` names a vanished node for an
    instance displaced by it."""

    instance: str
    from_worker: str | None
    from_node: str | None
    to_worker: str
    to_node: str
    stateful: bool


@dataclass(frozen=True)
class Recommendation:
    """A move the strategy wanted that dsched does not carry out, and why: the
    instance's engine places it itself (Flink schedules its subtasks)."""

    move: Move
    reason: str


@dataclass(frozen=True)
class Plan:
    """A placement decision and what it costs.

    ``affected_workers`` are existing workers whose set of instances changes
    (they restart); ``stateful_moves`` counts stateful instances that leave a
    running worker (their state has to be carried); ``restarted_stateful``
    counts stateful instances inside affected workers, moved or not.
    ``mixed_workers`` are workers that hold stateful and stateless instances of
    one application after the plan.
    """

    strategy: str
    moves: tuple[Move, ...]
    assignment: Mapping[str, tuple[str, str]]
    workers: tuple[Worker, ...]
    affected_workers: tuple[str, ...]
    affected_stateful_workers: tuple[str, ...]
    new_workers: tuple[str, ...]
    stateful_moves: int
    restarted_stateful: int
    nodes_used: int
    mixed_workers: int
    overloaded_nodes: tuple[str, ...]
    inter_node_traffic_before: float
    inter_node_traffic_after: float
    plan_seconds: float
    reasons: tuple[str, ...]
    # Moves only recommended (not in ``moves``, never given to a move actuator).
    recommended: tuple[Recommendation, ...] = ()

    @property
    def feasible(self) -> bool:
        """True when no node is over its usable capacity after the plan."""
        return not self.overloaded_nodes
