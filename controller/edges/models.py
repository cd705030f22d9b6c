"""Task performance models the controller loads from a model table file.

The table is either the JSON that ``dsched profile OPERATOR --json PATH`` writes
or the Parquet that ``dsched-history fit`` writes under the history's
``model_dir`` (``perf/current.parquet``), chosen by the file's suffix; the
``perf_model_table`` key names it, and by default it is the fitted one. The
formats are in docs/perf-models.md.

:meth:`PerfModelsEdge.refresh` runs once per epoch: it compares the file's
(mtime, size, inode) with the last one seen and reads it only when they
changed, so a replaced file (written aside and renamed, as both writers do) is
picked up within one epoch and an unchanged one costs one ``stat``. A file that
does not parse, or whose rows :meth:`PerformanceModel.from_table` refuses (not
in increasing thread order, no one-thread row, negative figures), is refused
as a whole: the models loaded before stay in force, the refusal is logged with
its reason and counted in ``dsched_perf_model_refusals_total{reason}``, and the
same file is not read again until it changes. A file that disappears leaves
the models in force too.

A null memory figure (the history does not sample memory per instance) loads
as 0 % of a slot: the model then bounds CPU only, as placement does for an
operator without a model.
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

from dsched.config import ConfigError
from predict.perfmodel import PerformanceModel

log = logging.getLogger(__name__)

COLUMNS = ("threads", "peak_rate", "cpu_percent", "memory_percent")
SUFFIXES = (".json", ".parquet")
#: Reasons a table is refused (the counter's label values).
REASONS = ("unreadable", "unparsable", "invalid")


class TableRefused(ValueError):
    """A model table that cannot be used, with why (one of :data:`REASONS`)."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


def default_table(model_dir: Path) -> Path:
    """Where ``dsched-history fit`` writes the task performance models."""
    return Path(model_dir) / "perf" / "current.parquet"


def check_table_path(key: str, path: Path | None) -> None:
    """ConfigError naming ``key`` when ``path`` cannot be a model table the controller
    watches: a suffix it cannot read, or a directory that is not there to hold it."""
    if path is None:
        return
    path = Path(path)
    if path.suffix not in SUFFIXES:
        raise ConfigError(
            key, f"must end in {' or '.join(SUFFIXES)} (the table's format), got {str(path)!r}"
        )
    parent = path.parent
    if not parent.is_dir():
        raise ConfigError(key, f"directory {parent} does not exist")
    if not os.access(parent, os.R_OK | os.X_OK):
        raise ConfigError(key, f"directory {parent} is not readable by the controller")
    if path.exists() and not path.is_file():
        raise ConfigError(key, f"{path} is not a file")


def _memory(value: Any) -> float:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return 0.0
    return value


def _models(rows_by_key: Mapping[str, list]) -> dict[str, PerformanceModel]:
    out = {}
    for key, rows in rows_by_key.items():
        if not isinstance(key, str) or not key:
            raise TableRefused("invalid", f"operator names must be non-empty strings, got {key!r}")
        if not isinstance(rows, list | tuple):
            raise TableRefused("invalid", f"model of {key}: rows must be a list, got {rows!r}")
        fixed = []
        for row in rows:
            if isinstance(row, list | tuple) and len(row) == len(COLUMNS):
                row = (*row[:3], _memory(row[3]))
            fixed.append(row)
        try:
            out[key] = PerformanceModel.from_table(fixed, name=key)
        except (TypeError, ValueError) as exc:
            raise TableRefused("invalid", str(exc)) from None
    return out


def read_json_table(path: Path) -> dict[str, PerformanceModel]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise TableRefused("unreadable", f"{path}: {exc.strerror or exc}") from None
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise TableRefused("unparsable", f"{path} is not JSON: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("models"), dict):
        raise TableRefused("unparsable", f'{path} has no "models" object')
    columns = doc.get("columns", list(COLUMNS))
    if list(columns) != list(COLUMNS):
        raise TableRefused(
            "unparsable", f"{path}: columns must be {list(COLUMNS)}, got {columns!r}"
        )
    return _models(doc["models"])


def read_parquet_table(path: Path) -> dict[str, PerformanceModel]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except OSError as exc:
        raise TableRefused("unreadable", f"{path}: {exc}") from None
    except (pa.ArrowException, ValueError) as exc:
        raise TableRefused("unparsable", f"{path} is not Parquet: {exc}") from None
    missing = [c for c in ("app", "operator", *COLUMNS) if c not in table.column_names]
    if missing:
        raise TableRefused("unparsable", f"{path} lacks columns {missing}")
    data = table.select(["app", "operator", *COLUMNS]).to_pydict()
    rows: dict[str, list] = {}
    # File order, not sorted: rows out of thread order are refused, not repaired.
    for i, (app, op) in enumerate(zip(data["app"], data["operator"], strict=True)):
        rows.setdefault(f"{app}/{op}", []).append([data[c][i] for c in COLUMNS])
    return _models(rows)


def read_table(path: Path) -> dict[str, PerformanceModel]:
    """Every model in the table at ``path``; :class:`TableRefused` when it is unusable."""
    path = Path(path)
    if path.suffix == ".parquet":
        return read_parquet_table(path)
    return read_json_table(path)


class PerfModelsEdge:
    """The models in force, reloaded when their file changes; refusals counted."""

    def __init__(
        self, path: Path, registry: CollectorRegistry | None = None, clock=time.time
    ) -> None:
        self.path = Path(path)
        self.clock = clock
        self._lock = threading.Lock()
        self._models: Mapping[str, PerformanceModel] = MappingProxyType({})
        self._seen: tuple[int, int, int] | None = None
        self.loaded_at: float | None = None
        self.loaded_from: tuple[int, int, int] | None = None
        self.last_error: str | None = None
        self.refusals = Counter(
            "dsched_perf_model_refusals_total",
            "Performance model tables refused (the models loaded before stay in force)",
            ["reason"],
            registry=registry,
        )
        for reason in REASONS:
            self.refusals.labels(reason)
        self.loaded = Gauge(
            "dsched_perf_models_loaded",
            "Operators with a performance model in force",
            registry=registry,
        )

    @classmethod
    def from_config(
        cls, config, registry: CollectorRegistry | None = None, clock=time.time
    ) -> PerfModelsEdge:
        """The edge of a controller: ``perf_model_table``, else the history's fitted table."""
        path = config.perf_model_table
        if path is None:
            from controller.edges.history import history_config

            history = history_config(config.history, config.state_dir, config.slot_seconds)
            path = default_table(history.model_dir)
        edge = cls(path, registry, clock)
        edge.refresh()
        return edge

    def current(self) -> Mapping[str, PerformanceModel]:
        """Operator (``app/operator``) -> model in force (read-only)."""
        return self._models

    def refresh(self) -> bool:
        """Load the table if its file changed since the last look; True when new models
        came into force."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            if self._seen is not None:
                log.warning(
                    "performance model table %s is gone; keeping the %d models loaded",
                    self.path,
                    len(self._models),
                )
            self._seen = None
            return False
        except OSError as exc:
            return self._refuse(None, TableRefused("unreadable", f"{self.path}: {exc.strerror}"))
        signature = (st.st_mtime_ns, st.st_size, st.st_ino)
        if signature == self._seen:
            return False
        try:
            models = read_table(self.path)
        except TableRefused as exc:
            return self._refuse(signature, exc)
        with self._lock:
            self._models = MappingProxyType(models)
            self._seen = self.loaded_from = signature
            self.loaded_at = self.clock()
            self.last_error = None
        self.loaded.set(len(models))
        log.info(
            "performance models loaded from %s: %s",
            self.path,
            ", ".join(sorted(models)) or "none",
        )
        return True

    def _refuse(self, signature, exc: TableRefused) -> bool:
        self._seen = signature
        self.last_error = str(exc)
        self.refusals.labels(exc.reason).inc()
        log.error(
            "performance model table refused (%s): %s; keeping the %d models loaded before",
            exc.reason,
            exc,
            len(self._models),
        )
        return False

    def apply(self, placement) -> None:
        """Give the models in force to a placement strategy that takes them (``sam``).

        Called every epoch: a plan made in the planner process hands back its own
        copy of the strategy, which may carry models older than these.
        """
        strategy = getattr(placement, "strategy", None)
        if strategy is None or not hasattr(strategy, "models"):
            return
        models = self._models
        if strategy.models != models:
            strategy.models = dict(models)

    def status(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "operators": sorted(self._models),
            "loaded_at": self.loaded_at,
            "last_error": self.last_error,
        }
