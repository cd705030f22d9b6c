"""The controller's vocabulary: keys, one slot of one instance, application DAGs.

Everything here is plain data. The pipeline stages (controller/pipeline.py)
turn these into decisions; nothing here does I/O.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple


# Keys are NamedTuples rather than dataclasses: an epoch hashes and compares
# them for every instance many times, and tuples do that in C.
class OperatorKey(NamedTuple):
    app: str
    operator: str

    def __str__(self) -> str:
        return f"{self.app}/{self.operator}"


class InstanceKey(NamedTuple):
    app: str
    operator: str
    instance: int

    @property
    def operator_key(self) -> OperatorKey:
        return OperatorKey(self.app, self.operator)

    def __str__(self) -> str:
        return f"{self.app}/{self.operator}/{self.instance}"


@dataclass(frozen=True)
class InstanceSlot:
    """One instance over one slot, already differentiated from cumulative counters."""

    key: InstanceKey
    node: str
    worker: str
    stateful: bool
    slot: int
    timestamp: float  # end of the slot, Unix seconds
    seconds: float  # slot length
    received: float  # tuples that arrived at the instance
    executed: float
    emitted: float
    cpu_seconds: float
    queue_length: float
    latency_sum_seconds: float
    latency_count: float
    service_seconds: float
    cap_cores: float | None
    throttled_seconds: float | None
    upstream: tuple[str, ...] = ()

    @property
    def usage_cores(self) -> float:
        return self.cpu_seconds / self.seconds if self.seconds > 0 else 0.0


@dataclass
class InstanceHistory:
    """The last ``phi`` slots of one instance (the fast loop's memory)."""

    key: InstanceKey
    node: str
    worker: str
    stateful: bool
    upstream: tuple[str, ...]
    slots: deque[InstanceSlot]
    last_seen: float = 0.0

    @classmethod
    def empty(cls, s: InstanceSlot, depth: int) -> InstanceHistory:
        return cls(s.key, s.node, s.worker, s.stateful, s.upstream, deque(maxlen=depth))

    def add(self, s: InstanceSlot) -> None:
        self.node, self.worker, self.stateful, self.upstream = (
            s.node,
            s.worker,
            s.stateful,
            s.upstream,
        )
        self.slots.append(s)
        self.last_seen = s.timestamp


@dataclass
class AppTopology:
    """An application's operator DAG as learnt from its instances' registrations."""

    name: str
    parents: dict[str, tuple[str, ...]] = field(default_factory=dict)
    stateful: dict[str, bool] = field(default_factory=dict)

    @property
    def operators(self) -> list[str]:
        return topological_order(self.parents)

    @property
    def sources(self) -> list[str]:
        return [op for op in self.operators if not self.parents.get(op)]

    def children(self, operator: str) -> list[str]:
        return [op for op, ps in self.parents.items() if operator in ps]


def topological_order(parents: dict[str, Iterable[str]]) -> list[str]:
    """Operators in an order where every parent precedes its children.

    Parents that are not themselves known operators are ignored (an instance
    may register before its upstream does). A cycle raises ValueError: stream
    DAGs are acyclic by definition, and a cycle would make propagation diverge.
    """
    known = set(parents)
    indeg = {op: 0 for op in known}
    kids: dict[str, list[str]] = {op: [] for op in known}
    for op, ps in parents.items():
        for p in set(ps):
            if p in known and p != op:
                indeg[op] += 1
                kids[p].append(op)
            elif p == op:
                raise ValueError(f"operator {op!r} lists itself as upstream")
    ready = sorted(op for op, d in indeg.items() if d == 0)
    order: list[str] = []
    while ready:
        op = ready.pop(0)
        order.append(op)
        for k in sorted(kids[op]):
            indeg[k] -= 1
            if indeg[k] == 0:
                ready.append(k)
        ready.sort()
    if len(order) != len(known):
        cyclic = sorted(known - set(order))
        raise ValueError(f"operator graph has a cycle through {cyclic}")
    return order
