"""The controller's edge to the Spark history: the only controller module that uses it.

Each epoch :meth:`HistoryEdge.spool` turns the slots of the cluster state not
spooled yet into the spool's rows and hands them to
:class:`spark_stream.feed.HistoryFeed`, which writes them on its own thread.
:meth:`HistoryEdge.seed` asks the history table what the fast loop lacks after a
restart (source arrival series for ARIMA, CPU per tuple) and returns it as a
:class:`HistorySeed`; the caller decides what to apply to its memory. See
docs/history.md.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from prometheus_client import CollectorRegistry

from dsched.ids import InstanceKey, OperatorKey
from spark_stream.config import HistoryConfig
from spark_stream.feed import HistoryFeed


class _Cluster(Protocol):
    """What the spool reads of the cluster state (``controller.edges.cluster.ClusterState``)."""

    histories: Mapping[InstanceKey, Any]  # .slots: deque of InstanceSlot
    agents: Mapping[str, Any]  # .node_sample (pb.NodeSample | None), .cpu_capacity_cores


class _View(Protocol):
    upstream: tuple[str, ...]  # empty for a source


def history_config(config: HistoryConfig, state_dir: Path, slot_seconds: float) -> HistoryConfig:
    """The history's paths under the controller's state dir, on the controller's slot."""
    return dataclasses.replace(config.rebase(state_dir), slot_seconds=slot_seconds)


@dataclass(frozen=True)
class HistorySeed:
    """What the history table holds for operators the controller has just seen.

    ``kappa``: the newest CPU-seconds per executed tuple; ``source_rates``: a
    source's arrival rates per window, oldest first. Operators without history
    are absent.
    """

    kappa: dict[OperatorKey, float]
    source_rates: dict[OperatorKey, tuple[float, ...]]


class HistoryEdge:
    """Controller state in, spool rows out; history table in, :class:`HistorySeed` out."""

    def __init__(self, feed: HistoryFeed):
        self.feed = feed
        self._last_spooled: dict[InstanceKey, float] = {}

    @classmethod
    def open(
        cls,
        config: HistoryConfig,
        state_dir: Path,
        slot_seconds: float,
        registry: CollectorRegistry | None = None,
    ) -> HistoryEdge:
        """The edge of a controller: its ``[history]`` table rebased by :func:`history_config`."""
        return cls(HistoryFeed(history_config(config, state_dir, slot_seconds), registry))

    @property
    def config(self) -> HistoryConfig:
        return self.feed.config

    # ------------------------------------------------------------ lifecycle
    def start_job(self) -> None:
        self.feed.start_job()

    def stop(self) -> None:
        self.feed.stop()

    def flush(self, timeout: float = 10.0) -> bool:
        return self.feed.flush(timeout)

    def status(self) -> dict[str, Any]:
        return self.feed.status()

    def lag_seconds(self) -> float | None:
        return self.feed.lag_seconds()

    # ------------------------------------------------------------ each epoch
    def spool(self, epoch: int, now: float, cluster: _Cluster, decision: dict | None) -> None:
        """Spool every instance slot not spooled yet and every node's latest sample."""
        instances = []
        for key, h in cluster.histories.items():
            if not h.slots:
                continue
            s = h.slots[-1]
            if self._last_spooled.get(key, 0.0) >= s.timestamp:
                continue
            self._last_spooled[key] = s.timestamp
            instances.append(
                {
                    "app": key.app,
                    "operator": key.operator,
                    "instance": key.instance,
                    "node": s.node,
                    "worker": s.worker,
                    "stateful": s.stateful,
                    "arrivals": s.arrivals,
                    "executed": s.executed,
                    "emitted": s.emitted,
                    "cpu_seconds": s.cpu_seconds,
                    "queue_length": s.queue_length,
                    "latency_sum_seconds": s.latency_sum_seconds,
                    "latency_count": s.latency_count,
                    "service_seconds": s.service_seconds,
                    "cap_cores": s.cap_cores,
                }
            )
        for key in set(self._last_spooled) - set(cluster.histories):
            del self._last_spooled[key]
        nodes = []
        for node, a in cluster.agents.items():
            ns = a.node_sample
            if ns is None:
                continue
            nodes.append(
                {
                    "node": node,
                    "cpu_capacity_cores": a.cpu_capacity_cores,
                    "cpu_usage_cores": ns.cpu_usage_cores,
                    "memory_bandwidth_bytes_per_second": (
                        sum(ns.memory_bandwidth_bytes_per_second.values())
                        if ns.memory_bandwidth_available
                        else None
                    ),
                    "llc_occupancy_bytes": (
                        sum(ns.llc_occupancy_bytes.values()) if ns.llc_available else None
                    ),
                }
            )
        self.feed.spool(epoch, now, instances, nodes, decision)

    def seed(self, views: Mapping[OperatorKey, _View]) -> HistorySeed:
        """The history of operators not asked about before (a bounded number per call).

        Reads only: the caller applies the seed (kappa where it has none measured,
        source rates ahead of its own series).
        """
        found = self.feed.seed({key: not view.upstream for key, view in views.items()})
        kappa: dict[OperatorKey, float] = {}
        rates: dict[OperatorKey, tuple[float, ...]] = {}
        for key, seed in found.items():
            op = OperatorKey(*key)
            if seed.kappa is not None:
                kappa[op] = seed.kappa
            if seed.source_rates:
                rates[op] = seed.source_rates
        return HistorySeed(kappa=kappa, source_rates=rates)
