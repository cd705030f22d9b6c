"""What the controller observes: one slot of one instance, its history, application DAGs.

Everything here is plain data. The epoch's stages (controller/stages/)
turn these into decisions; nothing here does I/O.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from dsched.dag import topological_order
from dsched.ids import InstanceKey, OperatorKey


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
    arrivals: float  # tuples that arrived at the instance
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


__all__ = [
    "AppTopology",
    "InstanceHistory",
    "InstanceKey",
    "InstanceSlot",
    "OperatorKey",
    "topological_order",
]
