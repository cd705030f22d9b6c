"""Engines dsched steers: how each one tells which threads run which instance,
and where its counters and DAG come from.

An engine has two sides, because they run in different places:

- the **node side** (:class:`ThreadMapping`, built by the agent on every node):
  which OS threads of which local process run each instance, with the
  operator's stateful flag and upstream operators;
- the **counter side** (:class:`CounterReading`, built beside the controller,
  once per job per slot): per-instance records in and out, the queue or its
  nearest measure, busy time, and latency where the engine has it.

The project's own instrumented testbed is the ``registration`` engine: its
instances register their threads over the agent's local socket and push their
counters with them, so both sides live in the agent. ``flink`` (Apache Flink
via ``jcmd`` on the node and the JobManager's REST API beside the controller)
is the first engine that is not instrumented. docs/engines/ describes each.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dsched.ids import InstanceKey

# Engines the agent and the controller know, by the `kind` of an `[[engine]]` table.
ENGINE_KINDS = ("flink",)


@dataclass(frozen=True)
class InstanceThreads:
    """One instance on this node: its process, its threads and its operator's place in the DAG."""

    key: InstanceKey
    worker: str
    pid: int
    tids: frozenset[int]
    stateful: bool
    upstream: tuple[str, ...] = ()


@dataclass(frozen=True)
class ThreadMapping:
    """One pass of the node side.

    ``unavailable`` says why nothing could be mapped (the engine's API is
    unreachable, ``jcmd`` is missing...): then ``instances`` is empty and the
    agent must keep what it already knows rather than treat every instance as
    gone. ``unowned_threads`` counts threads that look like task threads but
    belong to no instance of a managed job; ``ambiguous`` counts threads whose
    names fit more than one running job.
    """

    instances: tuple[InstanceThreads, ...] = ()
    unavailable: str | None = None
    unowned_threads: int = 0
    ambiguous_threads: int = 0


@dataclass(frozen=True)
class InstanceCounters:
    """Cumulative counters of one instance as its engine reports them.

    ``queue_length`` is a gauge in the engine's own unit (for Flink: input
    buffers queued, the nearest measure it has of records waiting).
    """

    received: int
    emitted: int
    queue_length: int = 0
    busy_seconds: float = 0.0
    backpressured_seconds: float = 0.0
    latency_sum_seconds: float = 0.0
    latency_count: int = 0


@dataclass(frozen=True)
class CounterReading:
    """One pass of the counter side: counters by instance, and what could not be read.

    ``missing`` maps an application to the reason its counters are absent this
    slot; its instances must then be treated as unmeasured (caps held), never
    as idle.
    """

    timestamp: float
    counters: dict[InstanceKey, InstanceCounters] = field(default_factory=dict)
    missing: dict[str, str] = field(default_factory=dict)
    error: str | None = None
