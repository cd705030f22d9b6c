"""The controller's side of the Spark history (DESIGN §6).

Each epoch the new slot of every instance and node goes to the spool
(:class:`controller.spool.SpoolWriter`, atomic files). When the controller runs
the job itself (``[history] enabled``, the default for the daemon), the
embedded Structured Streaming query turns the spool into the history table.
Back from the table come what the fast loop lacks after a restart: the
arrivals of sources for ARIMA and the CPU per tuple of operators that have no
measurement of their own yet. The fast loop never waits for any of it.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from controller.model import OperatorKey
from controller.pipeline import OperatorView, SourceHistory
from controller.spool import SpoolWriter
from controller.state import ClusterState
from spark_stream.config import HistoryConfig

log = logging.getLogger(__name__)

# Read back at most this many windows per source when seeding ARIMA.
SEED_WINDOWS = 300
# Operators seeded from the table per epoch: each is a Parquet read on the
# epoch's thread, and after a restart every operator is new at once.
SEED_PER_EPOCH = 16
# Spool writes allowed to wait behind a slow disk before slots are dropped.
MAX_PENDING_WRITES = 4


def history_config(config: HistoryConfig, state_dir: Path, slot_seconds: float) -> HistoryConfig:
    """The history's paths under the controller's state dir, on the controller's slot."""
    return dataclasses.replace(config.rebase(state_dir), slot_seconds=slot_seconds)


class _Collector(Collector):
    def __init__(self, feed: HistoryFeed):
        self.feed = feed

    def collect(self):
        w = self.feed.writer
        yield GaugeMetricFamily(
            "dsched_history_spool_bytes", "Bytes waiting in the spool", value=w.bytes
        )
        yield GaugeMetricFamily(
            "dsched_history_spool_files", "Files waiting in the spool", value=w.files
        )
        yield GaugeMetricFamily(
            "dsched_history_spool_over_limit",
            "1 while slots are refused because the spool reached max_spool_bytes",
            value=1.0 if w.over_limit else 0.0,
        )
        yield CounterMetricFamily(
            "dsched_history_spool_dropped", "Slots refused by a full spool", value=w.dropped_total
        )
        lag = self.feed.lag_seconds()
        if lag is not None:
            yield GaugeMetricFamily(
                "dsched_history_lag_seconds",
                "Age of the newest history window readable by the controller",
                value=lag,
            )


class HistoryFeed:
    def __init__(self, config: HistoryConfig, registry: CollectorRegistry | None = None):
        self.config = config
        self.writer = SpoolWriter(config)
        self.embedded = None
        self._last_spooled: dict[Any, float] = {}
        self._seeded: set[OperatorKey] = set()
        self._reader = None
        # The fast loop only builds the rows; a background thread writes them.
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dsched-spool")
        self._lock = threading.Lock()
        self._pending = 0
        if registry is not None:
            registry.register(_Collector(self))

    # ------------------------------------------------------------ lifecycle
    def start_job(self) -> None:
        """Run the streaming job in this process (Spark on ``config.spark_master``)."""
        from spark_stream.embedded import EmbeddedHistory

        self.embedded = EmbeddedHistory(self.config)
        self.embedded.start()

    def stop(self) -> None:
        self.flush()
        self._pool.shutdown(wait=True)
        if self.embedded is not None:
            self.embedded.stop()
            self.embedded = None

    def status(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "spool_bytes": self.writer.bytes,
            "spool_over_limit": self.writer.over_limit,
            "spool_dropped": self.writer.dropped_total,
            "lag_seconds": self.lag_seconds(),
        }
        if self.embedded is not None:
            st = self.embedded.status()
            out.update(state=st.state, spark_master=st.spark_master, error=st.error)
        return out

    def lag_seconds(self) -> float | None:
        try:
            return self.reader().lag_seconds()
        except (OSError, ValueError):
            return None

    def reader(self):
        if self._reader is None:
            from controller.history import HistoryReader

            self._reader = HistoryReader(self.config)
        return self._reader

    # ------------------------------------------------------------ each epoch
    def spool(self, epoch: int, now: float, state: ClusterState, decision: dict | None) -> None:
        """Append every slot not spooled yet; a full spool drops the slot and says so."""
        instances = []
        for key, h in state.histories.items():
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
                    "arrivals": s.received,
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
        for key in set(self._last_spooled) - set(state.histories):
            del self._last_spooled[key]
        nodes = []
        for node, a in state.agents.items():
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
        with self._lock:
            if self._pending >= MAX_PENDING_WRITES:
                # The disk cannot keep up: drop this slot rather than queue
                # without bound; the metric says so.
                self.writer.dropped_total += 1
                return
            self._pending += 1
        self._pool.submit(self._write, epoch, now, instances, nodes, decision)

    def _write(self, epoch, now, instances, nodes, decision) -> None:
        try:
            path = self.writer.write_slot(
                epoch, now, self.config.slot_seconds, instances, nodes, decision
            )
            if path is None:
                log.warning(
                    "history spool full (%d bytes): slot %d dropped", self.writer.bytes, epoch
                )
            if epoch % 10 == 0:
                self.writer.prune(now)
        except (OSError, ValueError) as exc:
            # The history is a side channel: its failure must not stop the loop.
            log.error("spooling slot %d failed: %s", epoch, exc)
        finally:
            with self._lock:
                self._pending -= 1

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait for queued spool writes (tests, shutdown)."""
        deadline = time.monotonic() + timeout
        while self._pending and time.monotonic() < deadline:
            time.sleep(0.01)
        return self._pending == 0

    def seed(
        self,
        views: dict[OperatorKey, OperatorView],
        sources: SourceHistory | None,
        kappa_memory: dict[OperatorKey, float],
    ) -> None:
        """Once per operator, fill what the ring buffer lacks from the history table
        (a bounded number of operators per epoch, so a restart never stalls one)."""
        todo = [k for k in views if k not in self._seeded][:SEED_PER_EPOCH]
        if not todo:
            return
        try:
            reader = self.reader()
        except (OSError, ValueError) as exc:
            log.debug("history not readable: %s", exc)
            return
        for key in todo:
            self._seeded.add(key)
            view = views[key]
            try:
                frame = reader.operator_history(key.app, key.operator, SEED_WINDOWS)
            except (OSError, ValueError) as exc:
                log.debug("no history for %s: %s", key, exc)
                continue
            if frame.empty:
                continue
            if key not in kappa_memory:
                kappas = [
                    k for k in frame["kappa"].tolist() if isinstance(k, float) and math.isfinite(k)
                ]
                if kappas:
                    kappa_memory[key] = kappas[-1]
            if sources is not None and not view.upstream:
                seconds = (frame["window_end"] - frame["window_start"]).dt.total_seconds()
                rates = (frame["arrivals"] / seconds.where(seconds > 0)).dropna().tolist()
                sources.prepend(key, rates)
