"""The history job inside another process: the controller's default deployment.

:class:`EmbeddedHistory` starts a Spark session on ``config.spark_master`` and the
streaming query from a background thread, so the controller's loop never waits
for the JVM to start (about 4 s on ``local[2]``). ``stop()`` stops the query
(the checkpoint keeps its position) and the session if this object created it.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field, replace

from spark_stream import job
from spark_stream.config import HistoryConfig
from spark_stream.reader import HistoryReader

log = logging.getLogger(__name__)


@dataclass
class HistoryStatus:
    """What the controller shows about its history (metrics, `dschedctl status`, demo)."""

    state: str  # "stopped", "starting", "running", "failed"
    spark_master: str
    last_batch_id: int | None = None
    committed_slot: int | None = None
    latest_window_end: float | None = None
    lag_seconds: float | None = None
    rows_dropped_late_total: int = 0
    input_rows_per_second: float | None = None
    error: str | None = None
    quarantined: dict[str, int] = field(default_factory=dict)
    # Refits of the model tables by the running job (``fit_interval_seconds``).
    fits: int = 0
    last_fit_at: float | None = None  # wall clock of the last refit that wrote the tables
    fit_error: str | None = None  # why the last refit failed (None after a good one)


class EmbeddedHistory:
    """Start/stop/status of the streaming history job in this process."""

    def __init__(self, config: HistoryConfig):
        config.validate()
        self.config = config
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._state = "stopped"
        self._error: str | None = None
        self._spark = None
        self._owns_session = False
        self._query = None
        self._sink = job.HistorySink(config)
        self._dropped_late = 0
        self._seen_batch = -1
        self._fits = 0
        self._last_fit_at: float | None = None
        self._fit_error: str | None = None

    def start(self) -> None:
        """Start in the background; returns at once. A no-op when already running."""
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return
            self._stop.clear()
            self._state, self._error = "starting", None
            self._thread = threading.Thread(target=self._run, name="dsched-history", daemon=True)
            self._thread.start()

    def wait_running(self, timeout: float = 120.0) -> bool:
        """Block until the query runs (True) or failed/timed out (False)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._state == "running":
                return True
            if self._state in ("failed", "stopped"):
                return False
            time.sleep(0.05)
        return False

    def _run(self) -> None:
        try:
            from pyspark import SparkContext

            # The active session is per thread; the context tells whether this process
            # already runs Spark (then it belongs to someone else and outlives us).
            self._owns_session = SparkContext._active_spark_context is None
            self._spark = job.spark_session(self.config)
            if self._stop.is_set():
                return
            self._query = job.start_query(self._spark, self.config, self._sink)
            self._state = "running"
            next_prune = 0.0
            interval = self.config.fit_interval_seconds
            # The first refit after a full interval: the windows of a fresh start
            # are too few, and a restart keeps the tables the last run wrote.
            next_fit = time.monotonic() + interval
            while not self._stop.is_set():
                if time.monotonic() >= next_prune:
                    job.prune_table(self.config)
                    next_prune = time.monotonic() + 3600.0
                if interval and time.monotonic() >= next_fit:
                    self._refit()
                    next_fit = time.monotonic() + interval
                if not self._query.isActive:
                    exc = self._query.exception()
                    raise RuntimeError(f"history query stopped: {exc}")
                self._collect_progress()
                self._stop.wait(1.0)
        except Exception as exc:  # any failure is reported through status(), not raised
            log.exception("history job failed")
            self._error = _first_line(exc)
            self._state = "failed"

    def _refit(self) -> None:
        """Fit the model tables from the history table; a failure is reported, and
        the stream (and the tables the last good fit wrote) stay."""
        from spark_stream.fit import fit_models

        if not self.config.operators_dir.exists():
            return  # nothing committed yet
        try:
            counts = fit_models(self._spark, self.config)
        except Exception as exc:  # noqa: BLE001 - a bad fit must not stop the history
            log.warning("history: refit of the model tables failed", exc_info=True)
            self._fit_error = _first_line(exc)
            return
        self._fits += 1
        self._last_fit_at = time.time()
        self._fit_error = None
        log.info("history: model tables refitted (%s)", counts)

    def _collect_progress(self) -> None:
        # recentProgress repeats batches between polls; count each batch id once.
        for progress in self._query.recentProgress if self._query else []:
            batch = int(progress.get("batchId", -1))
            if batch <= self._seen_batch:
                continue
            self._seen_batch = batch
            for op in progress.get("stateOperators", []):
                self._dropped_late += int(op.get("numRowsDroppedByWatermark", 0))

    def stop(self, timeout: float = 60.0) -> None:
        """Stop the query (position kept in the checkpoint) and the session if we made it."""
        self._stop.set()
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
        if self._query is not None:
            try:
                self._query.stop()
            except Exception:  # a query that already died has nothing left to stop
                log.debug("query stop failed", exc_info=True)
            self._query = None
        if self._spark is not None and self._owns_session:
            self._spark.stop()
        self._spark = None
        if self._state != "failed":
            self._state = "stopped"

    def fit_counts(self) -> HistoryStatus:
        """The refit fields of :meth:`status` alone (no table read: for metrics scrapes)."""
        return HistoryStatus(
            state=self._state,
            spark_master=self.config.spark_master,
            fits=self._fits,
            last_fit_at=self._last_fit_at,
            fit_error=self._fit_error,
        )

    def status(self) -> HistoryStatus:
        reader = HistoryReader(self.config)
        progress = job.read_progress(self.config)
        rate = None
        if self._query is not None:
            try:
                last = self._query.lastProgress
                rate = float(last["processedRowsPerSecond"]) if last else None
            except Exception:  # the JVM may be going away while we ask
                rate = None
        return replace(
            self.fit_counts(),
            last_batch_id=progress.get("batch_id"),
            committed_slot=progress.get("committed_slot"),
            latest_window_end=reader.latest_window_end(),
            lag_seconds=reader.lag_seconds(),
            rows_dropped_late_total=self._dropped_late,
            input_rows_per_second=rate,
            error=self._error,
            quarantined=reader.quarantine_counts(),
        )


def _first_line(exc: BaseException) -> str:
    """An exception's first line for a status field (its type when it has no text)."""
    text = str(exc)
    return text.splitlines()[0] if text else type(exc).__name__
