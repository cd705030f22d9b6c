"""What must survive a controller restart, in SQLite (WAL) under the state dir.

Mode, epoch counter, QoS assignments, the last caps (so a restarted controller
resumes where it stopped instead of thrashing caps), node recommendations and
the decision log. Each write is one
short transaction; WAL lets `dschedctl` and backups read while the loop writes.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from pathlib import Path
from typing import Any

from controller.model import InstanceKey

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


class StateStore:
    def __init__(self, state_dir: Path, keep_decisions: int = 8640):
        state_dir = Path(state_dir)
        state_dir.mkdir(parents=True, exist_ok=True)
        self.path = state_dir / "controller.sqlite"
        self.keep_decisions = keep_decisions
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(SCHEMA)

    def close(self) -> None:
        with self._lock:
            self._db.close()

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
    def save_caps(self, epoch: int, caps: dict[InstanceKey, tuple[str, float]]) -> None:
        """Replace the stored caps with ``caps`` (instance → (node, cores)) atomically."""
        rows = [(k.app, k.operator, k.instance, node, c, epoch) for k, (node, c) in caps.items()]
        with self._lock:
            self._db.execute("BEGIN")
            try:
                self._db.execute("DELETE FROM caps")
                self._db.executemany("INSERT INTO caps VALUES (?, ?, ?, ?, ?, ?)", rows)
                self._db.execute(
                    "INSERT INTO meta(key, value) VALUES ('epoch', ?) "
                    "ON CONFLICT(key) DO UPDATE SET value=excluded.value",
                    (str(epoch),),
                )
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

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
        with self._lock:
            self._db.execute(
                "INSERT OR REPLACE INTO recommendations VALUES (?, ?, ?, ?, ?)",
                (epoch, timestamp, nodes_delta, gain, reason),
            )
            self._db.execute(
                "DELETE FROM recommendations WHERE epoch <= ?", (epoch - self.keep_decisions,)
            )

    def recommendations(self, last: int = 1) -> list[tuple[int, float, int, float, str]]:
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
        with self._lock:
            self._db.execute(
                "INSERT OR REPLACE INTO decisions VALUES (?, ?, ?, ?)",
                (epoch, timestamp, mode, json.dumps(record, default=float)),
            )
            self._db.execute(
                "DELETE FROM decisions WHERE epoch <= ?", (epoch - self.keep_decisions,)
            )

    def decisions(self, last: int = 1) -> list[dict[str, Any]]:
        with self._lock:
            rows = self._db.execute(
                "SELECT record FROM decisions ORDER BY epoch DESC LIMIT ?", (last,)
            ).fetchall()
        return [json.loads(r[0]) for r in reversed(rows)]
