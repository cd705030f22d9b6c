"""The history as one small service for the controller's process, in plain types.

Each epoch the controller hands over the rows of its new slot (instance and node
samples as dicts, in the spool's field names, and the decision record);
:meth:`HistoryFeed.spool` queues them and a background thread writes the slot file
(:class:`spark_stream.spool.SpoolWriter`, atomic files), so the fast loop never
waits for the disk. When the controller runs the job itself (``[history]
enabled``, the default for the daemon), :meth:`HistoryFeed.start_job` starts the
embedded Structured Streaming query that turns the spool into the history table.
Back from the table, through :meth:`HistoryFeed.seed`, come what the fast loop
lacks after a restart: the arrival series of sources for ARIMA and the CPU per
tuple of operators that have no measurement of their own yet (docs/history.md,
"Feedback to the controller").

Nothing here knows the controller's types: operators are ``(app, operator)``
tuples, samples are dicts. The controller's adapter is
``controller/edges/history.py``.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from spark_stream.config import HistoryConfig
from spark_stream.reader import HistoryReader
from spark_stream.spool import SpoolWriter

log = logging.getLogger(__name__)

# The defaults of the config keys that bound seeding and spool writes.
SEED_WINDOWS: int = HistoryConfig.seed_windows
SEED_PER_EPOCH: int = HistoryConfig.seed_operators_per_epoch
MAX_PENDING_WRITES: int = HistoryConfig.max_pending_writes


@dataclass(frozen=True)
class OperatorSeed:
    """What the history table holds for one operator.

    ``kappa``: the newest finite CPU-seconds per executed tuple, or None when no
    window executed anything. ``source_rates``: arrivals per second of each window,
    oldest first; empty unless the operator was asked about as a source.
    """

    kappa: float | None
    source_rates: tuple[float, ...] = ()


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
                "Age of the newest history window readable by the controller "
                "(before the first window: of the first slot spooled)",
                value=lag,
            )
        embedded = self.feed.embedded
        if embedded is not None:
            fits = embedded.fit_counts()
            yield CounterMetricFamily(
                "dsched_history_model_refits",
                "Refits of the model tables by the running history job",
                value=fits.fits,
            )
            yield GaugeMetricFamily(
                "dsched_history_model_refit_failed",
                "1 while the running history job's last refit of the model tables failed",
                value=1.0 if fits.fit_error else 0.0,
            )


class HistoryFeed:
    """Spool writes in the background, the embedded job, and seeds read from the table."""

    def __init__(self, config: HistoryConfig, registry: CollectorRegistry | None = None):
        self.config = config
        self.writer = SpoolWriter(config)
        self.embedded = None
        self._seeded: set[tuple[str, str]] = set()
        self._reader: HistoryReader | None = None
        # The caller only builds the rows; a background thread writes them.
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dsched-spool")
        self._lock = threading.Lock()
        self._pending = 0
        # Stamp of the first slot this feed spooled: until the job writes its first
        # window, the history trails the controller since then.
        self._first_spooled: float | None = None
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
            out.update(
                state=st.state,
                spark_master=st.spark_master,
                error=st.error,
                model_refits=st.fits,
                model_refit_at=st.last_fit_at,
                model_refit_error=st.fit_error,
            )
        return out

    def lag_seconds(self) -> float | None:
        """How far the readable history trails the wall clock: now minus the newest
        window's end; before the first window, now minus the first slot this feed
        spooled (a job that never writes a window then shows a growing lag, and
        the lag alert fires). None while there is neither."""
        try:
            lag = self._open_reader().lag_seconds()
        except (OSError, ValueError):
            lag = None
        if lag is None and self._first_spooled is not None:
            lag = max(0.0, time.time() - self._first_spooled)
        return lag

    def _open_reader(self) -> HistoryReader:
        if self._reader is None:
            self._reader = HistoryReader(self.config)
        return self._reader

    # ------------------------------------------------------------ each epoch
    def spool(
        self,
        epoch: int,
        now: float,
        instances: list[dict],
        nodes: list[dict],
        decision: dict | None,
    ) -> None:
        """Queue one slot's rows for the spool; when writes pile up, drop it and count it.

        ``instances`` and ``nodes`` are dicts with the spool's fields
        (:data:`spark_stream.schema.INSTANCE_FIELDS`, :data:`~spark_stream.schema.NODE_FIELDS`).
        """
        with self._lock:
            if self._first_spooled is None:
                self._first_spooled = now
            if self._pending >= self.config.max_pending_writes:
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
        """Wait for queued spool writes (tests, shutdown); False if some are still queued."""
        deadline = time.monotonic() + timeout
        while self._pending and time.monotonic() < deadline:
            time.sleep(0.01)
        return self._pending == 0

    def seed(
        self, operators: Mapping[tuple[str, str], bool]
    ) -> dict[tuple[str, str], OperatorSeed]:
        """What the history table holds for operators not asked about before.

        ``operators`` maps ``(app, operator)`` to whether it is a source. At most
        :attr:`HistoryConfig.seed_operators_per_epoch` operators not asked about before are read per call
        (so a restart never stalls one epoch); each is asked once. The answer has
        an entry for each of them whose table has windows: the newest kappa and,
        for a source, its arrival rates oldest first. A pure read: nothing outside
        the feed changes.
        """
        todo = [k for k in operators if k not in self._seeded][
            : self.config.seed_operators_per_epoch
        ]
        if not todo:
            return {}
        try:
            reader = self._open_reader()
        except (OSError, ValueError) as exc:
            log.debug("history not readable: %s", exc)
            return {}
        out: dict[tuple[str, str], OperatorSeed] = {}
        for key in todo:
            self._seeded.add(key)
            app, operator = key
            try:
                frame = reader.operator_history(app, operator, self.config.seed_windows)
            except (OSError, ValueError) as exc:
                log.debug("no history for %s/%s: %s", app, operator, exc)
                continue
            if frame.empty:
                continue
            kappas = [
                k for k in frame["kappa"].tolist() if isinstance(k, float) and math.isfinite(k)
            ]
            rates: tuple[float, ...] = ()
            if operators[key]:
                seconds = (frame["window_end"] - frame["window_start"]).dt.total_seconds()
                rates = tuple(
                    float(r) for r in (frame["arrivals"] / seconds.where(seconds > 0)).dropna()
                )
            out[key] = OperatorSeed(kappa=kappas[-1] if kappas else None, source_rates=rates)
        return out
