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

The layout has a version, SQLite's ``PRAGMA user_version`` (:data:`SCHEMA_VERSION`).
A file without one (0) is a new file or one from dsched 0.1.0, whose tables are
the version-1 layout: opening it stamps version 1 and changes nothing else.
Later versions are reached through :data:`MIGRATIONS`, one step at a time, in
the transaction that stamps the new version. A file of a newer version, or one
SQLite cannot read as a dsched store, is refused with :class:`StateFileError`
before anything is written to it (docs/operations.md, "Upgrading").
"""

from __future__ import annotations

import json
import logging
import os
import queue
import sqlite3
import threading
from collections.abc import Callable, Iterator, Mapping
from operator import is_
from pathlib import Path
from typing import Any

from controller.model import InstanceKey
from controller.record import record_json

log = logging.getLogger(__name__)

# The layout's version, stamped in SQLite's user_version. Bump it with every
# change to the tables (or to what their columns mean) and add the step that
# takes the previous version to it to MIGRATIONS.
SCHEMA_VERSION = 1

# The version-1 layout (also dsched 0.1.0's, which stamped no version). A new
# file is created with it and then migrated like any other version-1 file.
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

# MIGRATIONS[n](db) takes a version-n store to version n + 1 inside the
# transaction that then stamps n + 1, so a failed step leaves the file at n.
# None yet: version 1 is the only layout there has been.
MIGRATIONS: dict[int, Callable[[sqlite3.Connection], None]] = {}

# Each table of the version-1 layout and its columns, in order.
LAYOUT_V1: dict[str, tuple[str, ...]] = {
    "meta": ("key", "value"),
    "caps": ("app", "operator", "instance", "node", "cap_cores", "epoch"),
    "qos": ("app", "qos_class", "set_at"),
    "recommendations": ("epoch", "timestamp", "nodes_delta", "gain", "reason"),
    "decisions": ("epoch", "timestamp", "mode", "record"),
}
# The layout of each stamped version (what the file must hold once stamped).
LAYOUTS: dict[int, dict[str, tuple[str, ...]]] = {1: LAYOUT_V1}


class StateFileError(RuntimeError):
    """The state file cannot be used as it is; nothing was written to it.

    ``path``: the file. The controller must not start on it (``dsched-controller``
    exits with status 2)."""

    def __init__(self, path: Path, message: str):
        self.path = path
        super().__init__(f"state file {path}: {message}")


class StateVersionError(StateFileError):
    """The file's layout is newer than this code knows (written by a newer release)."""

    def __init__(self, path: Path, found: int, known: int | None = None):
        known = SCHEMA_VERSION if known is None else known
        self.found, self.known = found, known
        super().__init__(
            path,
            f"schema version {found} is newer than this dsched knows (version {known}): "
            "it was written by a newer release. Refusing to start rather than rewrite it; "
            "run that release again, or restore the state directory backed up before "
            "the upgrade",
        )


def check_state_file(path: Path) -> int:
    """The schema version of the state file at ``path`` (0: unstamped or absent),
    read without writing to it.

    StateVersionError if it is newer than :data:`SCHEMA_VERSION`; StateFileError
    if SQLite cannot read it, its tables are not a dsched layout, or the rows
    startup reads (mode, epoch, QoS, caps, the last decision) cannot be read."""
    path = Path(path)
    if not path.exists():
        return 0
    wal_path = path.with_name(path.name + "-wal")
    if path.stat().st_size == 0 and not (wal_path.exists() and wal_path.stat().st_size > 0):
        # SQLite would read an empty file as a new database, and the controller
        # would start with no QoS classes, mode or caps. A store never leaves one
        # (a new file is built beside it and renamed into place, see
        # StateStore), so an empty file is a truncated one.
        raise StateFileError(
            path,
            "is empty (0 bytes): it was truncated, so the QoS classes, mode and caps it "
            "held are gone. Refusing to start afresh on it; restore the state directory "
            "from a backup, or remove the file to start with no state",
        )
    # Read-only: closing it neither checkpoints nor removes a write-ahead log. A
    # file closed cleanly (no log beside it) is read as immutable, which leaves
    # no -wal or -shm file behind either.
    wal = path.with_name(path.name + "-wal").exists()
    try:
        db = sqlite3.connect(
            f"{path.resolve().as_uri()}?{'mode=ro' if wal else 'immutable=1'}", uri=True
        )
    except sqlite3.Error as exc:
        raise StateFileError(path, f"cannot be opened: {exc}") from exc
    try:
        version = db.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise StateVersionError(path, version)
        tables = {
            name: tuple(c for (c,) in db.execute("SELECT name FROM pragma_table_info(?)", (name,)))
            for (name,) in db.execute(
                "SELECT name FROM sqlite_master WHERE type='table' AND name NOT LIKE 'sqlite_%'"
            )
        }
        expected = LAYOUTS[max(version, 1)]
        unknown = sorted(set(tables) - set(expected))
        wrong = sorted(t for t in expected if t in tables and tables[t] != expected[t])
        missing = sorted(set(expected) - set(tables)) if version else []
        if unknown or wrong or missing:
            what = "; ".join(
                f"{label}: {', '.join(names)}"
                for label, names in (
                    ("tables it does not know", unknown),
                    ("tables with other columns", wrong),
                    ("missing tables", missing),
                )
                if names
            )
            raise StateFileError(
                path, f"is not a dsched state database of schema version {version or 1} ({what})"
            )
        if version == SCHEMA_VERSION or not version:
            for table in ("meta", "qos", "caps"):
                if table in tables:
                    db.execute(f"SELECT * FROM {table}").fetchall()
            if "decisions" in tables:
                db.execute("SELECT record FROM decisions ORDER BY epoch DESC LIMIT 1").fetchall()
    except sqlite3.Error as exc:
        raise StateFileError(
            path, f"cannot be read as a dsched state database ({exc}); it was left as it is"
        ) from exc
    finally:
        db.close()
    return version


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
        # Refuses a newer or unreadable file before anything is written to it.
        found = check_state_file(self.path)
        # The version the file had when opened (0: new or from dsched 0.1.0).
        self.found_version = found
        if not found and not self.path.exists():
            self._create()
            found = 1  # the version-1 layout; later versions are reached below
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        try:
            self._db.execute("PRAGMA journal_mode=WAL")
            # NORMAL in WAL mode: a commit survives the process dying at any point
            # (what a controller crash is); only a power cut may lose the last ones.
            self._db.execute("PRAGMA synchronous=NORMAL")
            if found != SCHEMA_VERSION:
                self._migrate()
        except sqlite3.Error as exc:
            self._db.close()
            raise StateFileError(self.path, f"cannot be opened for writing: {exc}") from exc
        except BaseException:
            self._db.close()
            raise
        # The caps table as last committed by save_caps (None: not known yet,
        # the next save replaces the whole table).
        self._saved_caps: dict[InstanceKey, tuple[str, float]] | None = None
        self._queue: queue.Queue[Callable[[], None] | None] = queue.Queue(WRITE_QUEUE_SIZE)
        self._writer: threading.Thread | None = None
        self._writer_lock = threading.Lock()
        self._closed = False

    def _create(self) -> None:
        """A new store, built under another name and renamed into place: a crash
        half-way leaves no file at :attr:`path`, and so no empty one (which
        :func:`check_state_file` refuses as truncated)."""
        tmp = self.path.with_name(self.path.name + ".new")
        for leftover in (tmp, *(tmp.with_name(tmp.name + s) for s in ("-wal", "-shm", "-journal"))):
            leftover.unlink(missing_ok=True)
        db = sqlite3.connect(tmp, isolation_level=None)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("BEGIN IMMEDIATE")
            for statement in SCHEMA.split(";"):
                if statement.strip():
                    db.execute(statement)
            db.execute("PRAGMA user_version = 1")
            db.execute("COMMIT")
        finally:
            # The last connection's close checkpoints and removes the -wal file.
            db.close()
        try:
            # A link, not a rename: a store another process made meanwhile is kept.
            os.link(tmp, self.path)
        except FileExistsError:
            pass
        finally:
            tmp.unlink(missing_ok=True)

    def _migrate(self) -> None:
        """Create or migrate the tables up to :data:`SCHEMA_VERSION` and stamp it,
        in one transaction."""
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            # Again under the write lock: another process may have stamped it since.
            version = db.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise StateVersionError(self.path, version)
            if version == 0:
                # New, or dsched 0.1.0's version-1 tables (then this creates nothing).
                for statement in SCHEMA.split(";"):
                    if statement.strip():
                        db.execute(statement)
                version = 1
            for step in range(version, SCHEMA_VERSION):
                try:
                    MIGRATIONS[step](db)
                except sqlite3.Error as exc:
                    raise StateFileError(
                        self.path,
                        f"migrating schema version {step} to {step + 1} failed ({exc}); "
                        f"the file was left at version {self.found_version or 1}",
                    ) from exc
            db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        if self.found_version or db.execute("SELECT 1 FROM meta LIMIT 1").fetchone():
            log.info(
                "state file %s: schema version %s -> %d",
                self.path,
                self.found_version or "none (dsched 0.1.0)",
                SCHEMA_VERSION,
            )

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
            text = record_json(record)
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
