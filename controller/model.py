"""What the controller observes: one slot of one instance, its history, application DAGs.

Everything here is plain data. The epoch's stages (controller/stages/)
turn these into decisions; nothing here does I/O.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import NamedTuple

from dsched.dag import topological_order
from dsched.ids import InstanceKey, OperatorKey


class InstanceSlot(NamedTuple):
    """One instance over one slot, already differentiated from cumulative counters.

    A named tuple rather than a frozen dataclass: ingest makes one per instance
    per slot (20,000 in a burst at a 1,000-node cluster) and a tuple is made
    three times faster; it is as immutable, which the evaluate stage's cache
    of slot values relies on.
    """

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
    engine: str = ""  # the engine whose API supplied the counters ("flink"); "" when registered

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
    engine: str = ""  # "" for instances that register themselves

    @classmethod
    def empty(cls, s: InstanceSlot, depth: int) -> InstanceHistory:
        return cls(
            s.key, s.node, s.worker, s.stateful, s.upstream, deque(maxlen=depth), engine=s.engine
        )

    def add(self, s: InstanceSlot) -> None:
        self.node, self.worker, self.stateful, self.upstream, self.engine = (
            s.node,
            s.worker,
            s.stateful,
            s.upstream,
            s.engine,
        )
        self.slots.append(s)
        self.last_seen = s.timestamp

    def touch(self, u: Unmeasured) -> None:
        """The instance reported but its counters are missing: it is alive where it
        says, with no slot to add (a zero slot would read as an idle instance)."""
        self.node, self.worker, self.stateful, self.upstream, self.engine = (
            u.node,
            u.worker,
            u.stateful,
            u.upstream,
            u.engine,
        )
        self.last_seen = u.timestamp


@dataclass(frozen=True)
class Unmeasured:
    """An instance that reported this slot without usable counters.

    Its engine's counters were missing (the engine's API failed, the job was not
    in the reading, or the reading had not advanced since the instance's last
    slot). The epoch holds its cap: neither cut (it may be busy) nor released
    (it may be overloaded). ``cap_cores`` is the cap its agent reported, if any.
    """

    key: InstanceKey
    node: str
    worker: str
    stateful: bool
    upstream: tuple[str, ...]
    engine: str
    reason: str  # e.g. "flink counters unavailable: GET /jobs/overview: Connection refused"
    timestamp: float  # the report's
    cap_cores: float | None = None


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
    "Unmeasured",
    "topological_order",
]
