"""What must survive a controller restart, in SQLite (WAL) under the state dir.

Mode, epoch counter, QoS assignments, the last caps (so a restarted controller
resumes where it stopped instead of thrashing caps), node recommendations and
the decision log. Each write is one short transaction; WAL lets `dschedctl`
and backups read while the loop writes.

Two kinds of write, on purpose:

* **Caps, mode, QoS, the epoch counter** are written on the caller's thread and
  committed before the call returns. The controller writes an epoch's caps
  before it sends them to any agent, so whatever an agent enforces is on disk
  first. Only the caps that changed since the last save are written: at a few
  thousand instances per node most caps hold from one epoch to the next.
* **Decision records and node recommendations** go through a bounded queue to
  one writer thread, which also does the JSON encoding: a 1,000-node record is
  a few megabytes of JSON, and encoding it on the epoch's thread cost as much
  as deciding it. Reads of these tables (:meth:`StateStore.decisions`,
  :meth:`StateStore.recommendations`) wait for the queue to drain first, so a
  reader in this process always sees every record written before it asked. A
  crash loses at most the records still queued (the audit log's tail), never
  a cap.
"""

from __future__ import annotations

import json
import logging
import queue
import sqlite3
import threading
from collections.abc import Callable, Iterator, Mapping
from operator import is_
from pathlib import Path
from typing import Any

from controller.model import InstanceKey

log = logging.getLogger(__name__)

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS caps (
    app TEXT NOT NULL, operator TEXT NOT NULL, instance INTEGER NOT NULL,
    node TEXT NOT NULL, cap_cores REAL NOT NULL, epoch INTEGER NOT NULL,
    PRIMARY KEY (app, operator, instance)
);
CREATE TABLE IF NOT EXISTS qos (
    app TEXT PRIMARY KEY, qos_class TEXT NOT NULL, set_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS recommendations (
    epoch INTEGER PRIMARY KEY, timestamp REAL NOT NULL, nodes_delta INTEGER NOT NULL,
    gain REAL NOT NULL, reason TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS decisions (
    epoch INTEGER PRIMARY KEY, timestamp REAL NOT NULL, mode TEXT NOT NULL, record TEXT NOT NULL
);
"""

# Records waiting for the writer. One epoch makes one record per slot (10 s by
# default), so a full queue means the disk has stalled for minutes; the epoch
# then waits for room rather than drop audit records silently.
WRITE_QUEUE_SIZE = 8


class StateStore:
    def __init__(self, state_dir: Path, keep_decisions: int = 8640):
        state_dir = Path(state_dir)
        state_dir.mkdir(parents=True, exist_ok=True)
        self.path = state_dir / "controller.sqlite"
        self.keep_decisions = keep_decisions
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        # NORMAL in WAL mode: a commit survives the process dying at any point
        # (what a controller crash is); only a power cut may lose the last ones.
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(SCHEMA)
        # The caps table as last committed by save_caps (None: not known yet,
        # the next save replaces the whole table).
        self._saved_caps: dict[InstanceKey, tuple[str, float]] | None = None
        self._queue: queue.Queue[Callable[[], None] | None] = queue.Queue(WRITE_QUEUE_SIZE)
        self._writer: threading.Thread | None = None
        self._writer_lock = threading.Lock()
        self._closed = False

    def close(self) -> None:
        """Write what is queued, then close the database."""
        self.flush()
        with self._writer_lock:
            writer, self._writer = self._writer, None
            self._closed = True
        if writer is not None:
            self._queue.put(None)
            writer.join()
        with self._lock:
            self._db.close()

    # ------------------------------------------------------------ the writer
    def flush(self) -> None:
        """Block until every queued write is committed (or has failed and been logged)."""
        if self._writer is not None:
            self._queue.join()

    def _enqueue(self, write: Callable[[], None]) -> None:
        with self._writer_lock:
            if self._closed:
                raise sqlite3.ProgrammingError("the state store is closed")
            if self._writer is None:
                self._writer = threading.Thread(
                    target=self._write_loop, name="dsched-store", daemon=True
                )
                self._writer.start()
        self._queue.put(write)

    def _write_loop(self) -> None:
        while True:
            write = self._queue.get()
            try:
                if write is None:
                    return
                write()
            except Exception:
                # One failed write (disk full, a value JSON cannot take) must not
                # stop the ones after it.
                log.exception("state store: a queued write failed")
            finally:
                self._queue.task_done()

    # meta
    def get(self, key: str, default: str | None = None) -> str | None:
        with self._lock:
            row = self._db.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return row[0] if row else default

    def put(self, key: str, value: str) -> None:
        with self._lock:
            self._db.execute(
                "INSERT INTO meta(key, value) VALUES (?, ?) "
                "ON CONFLICT(key) DO UPDATE SET value=excluded.value",
                (key, value),
            )

    # caps
    def save_caps(self, epoch: int, caps: Mapping[InstanceKey, tuple[str, float]]) -> None:
        """Make the stored caps equal ``caps`` (instance → (node, cores)) atomically,
        with the epoch counter, committed before this returns.

        Rows whose cap and node did not change are left alone (their ``epoch``
        column says when that cap was set)."""
        saved = self._saved_caps
        with self._lock:
            self._db.execute("BEGIN")
            try:
                if saved is None:
                    self._db.execute("DELETE FROM caps")
                    changed = caps.items()
                    gone: list[InstanceKey] = []
                elif len(saved) == len(caps) and all(map(is_, saved, caps)):
                    # The same instances in the same order (the usual epoch):
                    # compare in a row, without hashing a key.
                    changed = [
                        (k, v)
                        for k, v, was in zip(caps, caps.values(), saved.values(), strict=True)
                        if v != was
                    ]
                    gone = []
                else:
                    get = saved.get
                    changed = [(k, v) for k, v in caps.items() if get(k) != v]
                    gone = [k for k in saved if k not in caps]
                if gone:
                    self._db.executemany(
                        "DELETE FROM caps WHERE app=? AND operator=? AND instance=?", gone
                    )
                self._db.executemany(
                    "INSERT INTO caps VALUES (?, ?, ?, ?, ?, ?) "
                    "ON CONFLICT(app, operator, instance) DO UPDATE SET "
                    "node=excluded.node, cap_cores=excluded.cap_cores, epoch=excluded.epoch",
                    [(k.app, k.operator, k.instance, node, c, epoch) for k, (node, c) in changed],
                )
                self._db.execute(
                    "INSERT INTO meta(key, value) VALUES ('epoch', ?) "
                    "ON CONFLICT(key) DO UPDATE SET value=excluded.value",
                    (str(epoch),),
                )
                self._db.execute("COMMIT")
            except BaseException:
                self._saved_caps = None  # the table is what it was: unknown to the mirror
                self._db.execute("ROLLBACK")
                raise
        self._saved_caps = dict(caps)

    def load_caps(self) -> dict[InstanceKey, tuple[str, float]]:
        with self._lock:
            rows = self._db.execute(
                "SELECT app, operator, instance, node, cap_cores FROM caps"
            ).fetchall()
        return {InstanceKey(a, o, i): (n, c) for a, o, i, n, c in rows}

    # QoS assignments
    def set_qos(self, app: str, qos_class: str, at: float) -> None:
        with self._lock:
            self._db.execute(
                "INSERT INTO qos(app, qos_class, set_at) VALUES (?, ?, ?) "
                "ON CONFLICT(app) DO UPDATE SET qos_class=excluded.qos_class, set_at=excluded.set_at",
                (app, qos_class, at),
            )

    def qos_assignments(self) -> dict[str, str]:
        with self._lock:
            rows = self._db.execute("SELECT app, qos_class FROM qos ORDER BY app").fetchall()
        return dict(rows)

    # node recommendations
    def record_recommendation(
        self, epoch: int, timestamp: float, nodes_delta: int, gain: float, reason: str
    ) -> None:
        """Queue a recommendation for the writer thread."""

        def write() -> None:
            with self._lock:
                self._db.execute(
                    "INSERT OR REPLACE INTO recommendations VALUES (?, ?, ?, ?, ?)",
                    (epoch, timestamp, nodes_delta, gain, reason),
                )
                self._db.execute(
                    "DELETE FROM recommendations WHERE epoch <= ?", (epoch - self.keep_decisions,)
                )

        self._enqueue(write)

    def recommendations(self, last: int = 1) -> list[tuple[int, float, int, float, str]]:
        self.flush()
        with self._lock:
            rows = self._db.execute(
                "SELECT epoch, timestamp, nodes_delta, gain, reason FROM recommendations "
                "ORDER BY epoch DESC LIMIT ?",
                (last,),
            ).fetchall()
        return list(reversed(rows))

    # decisions
    def record_decision(
        self, epoch: int, timestamp: float, mode: str, record: dict[str, Any]
    ) -> None:
        """Queue a decision record for the writer thread, which encodes it.

        The caller hands ``record`` over: it must not change it afterwards."""

        def write() -> None:
            text = json.dumps(record, default=float)
            with self._lock:
                self._db.execute(
                    "INSERT OR REPLACE INTO decisions VALUES (?, ?, ?, ?)",
                    (epoch, timestamp, mode, text),
                )
                self._db.execute(
                    "DELETE FROM decisions WHERE epoch <= ?", (epoch - self.keep_decisions,)
                )

        self._enqueue(write)

    def decisions(self, last: int = 1) -> list[dict[str, Any]]:
        self.flush()
        with self._lock:
            rows = self._db.execute(
                "SELECT record FROM decisions ORDER BY epoch DESC LIMIT ?", (last,)
            ).fetchall()
        return [json.loads(r[0]) for r in reversed(rows)]

    def decisions_since(
        self, since: float, limit: int, batch: int = 32
    ) -> Iterator[dict[str, Any]]:
        """The newest ``limit`` decision records stamped at or after ``since``, oldest
        first, read ``batch`` rows at a time: a long window never sits in memory
        whole, and the writer is not held up between batches. Records written
        after the call are not included."""
        self.flush()
        with self._lock:
            lo, hi = self._db.execute(
                "SELECT MIN(epoch), MAX(epoch) FROM (SELECT epoch FROM decisions "
                "WHERE timestamp >= ? ORDER BY epoch DESC LIMIT ?)",
                (since, limit),
            ).fetchone()
        if lo is None:
            return
        after = lo - 1
        while True:
            with self._lock:
                rows = self._db.execute(
                    "SELECT epoch, record FROM decisions WHERE epoch > ? AND epoch <= ? "
                    "AND timestamp >= ? ORDER BY epoch LIMIT ?",
                    (after, hi, since, batch),
                ).fetchall()
            if not rows:
                return
            for _, text in rows:
                yield json.loads(text)
            after = rows[-1][0]
