"""Configuration of the history pipeline: the `[history]` table of the controller's TOML.

Every path defaults to a directory under one state directory, so an embedded
deployment needs no path at all; a cluster deployment points the paths at
shared storage (NFS, HDFS through a mounted path) and ``spark_master`` at the
cluster.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path

from dsched.config import require

DEFAULT_STATE_DIR = Path("/var/lib/dsched")

# Paths derived from the state directory when not given explicitly.
_DERIVED_PATHS = {
    "spool_dir": "history/spool",
    "table_dir": "history/table",
    "checkpoint_dir": "history/checkpoint",
    "model_dir": "history/models",
    "quarantine_dir": "history/quarantine",
}


@dataclass
class HistoryConfig:
    """Where the history lives, how it is windowed, and on which Spark it runs."""

    # Spool every slot and run the streaming job in the controller process.
    enabled: bool = True
    # Spark master URL: `local[N]`, or a standalone, YARN or Kubernetes master.
    spark_master: str = "local[2]"
    # Base directory; the paths below default under it.
    state_dir: Path = DEFAULT_STATE_DIR
    # Where slot files wait for the streaming job (default: state_dir/spool).
    spool_dir: Path | None = None
    # The Parquet history table (default: state_dir/history).
    table_dir: Path | None = None
    # The streaming query's checkpoint (default: state_dir/checkpoints).
    checkpoint_dir: Path | None = None
    # Fitted ARIMA orders and task models (default: state_dir/models).
    model_dir: Path | None = None
    # Spool files that could not be parsed (default: state_dir/quarantine).
    quarantine_dir: Path | None = None
    # Spool files the history has committed are kept this long (for replay/inspection).
    retention_seconds: float = 3600.0
    # Beyond this the controller stops spooling and counts the dropped slots.
    max_spool_bytes: int = 256 * 1024 * 1024
    # History table date partitions older than this are deleted by the running job (hourly).
    table_retention_days: int = 30
    # The controller's slot length; windows and the watermark are whole slots.
    slot_seconds: float = 10.0
    # Slots per history window.
    window_slots: int = 1
    # Lateness tolerated beyond a slot's end; every extra slot delays a window by one slot.
    watermark_slots: int = 0
    # How often the streaming query looks at the spool.
    trigger_seconds: float = 1.0
    # spark.sql.shuffle.partitions of the job.
    shuffle_partitions: int = 2
    # Extra `spark.*` settings (e.g. executor memory on a real cluster).
    spark_conf: dict[str, str] = field(default_factory=dict)
    # The running job refits the ARIMA orders and task models from the table this
    # often (the controller reloads the model table when it changes); 0: only
    # `dsched-history fit` does.
    fit_interval_seconds: float = 3600.0
    # Batch fitting: how many windows per operator and the ARIMA (p, q) grid (d by KPSS).
    fit_windows: int = 360
    # Windows read back per source when seeding ARIMA after a restart.
    seed_windows: int = 300
    # Operators seeded from the table per epoch: each is a Parquet read on the
    # epoch's thread, and after a restart every operator is new at once.
    seed_operators_per_epoch: int = 16
    # Spool writes allowed to wait behind a slow disk before slots are dropped.
    max_pending_writes: int = 4
    # Largest AR order p the batch fit tries.
    arima_max_p: int = 2
    # Largest MA order q the batch fit tries.
    arima_max_q: int = 1

    def __post_init__(self) -> None:
        self.state_dir = Path(self.state_dir)
        for name, rel in _DERIVED_PATHS.items():
            value = getattr(self, name)
            setattr(self, name, self.state_dir / rel if value is None else Path(value))

    @classmethod
    def under(cls, state_dir: str | Path, **overrides) -> HistoryConfig:
        """A configuration whose paths all live under ``state_dir``."""
        return cls(state_dir=Path(state_dir), **overrides)

    def rebase(self, state_dir: str | Path) -> HistoryConfig:
        """Move the paths that were derived from the old state directory under ``state_dir``."""
        changes: dict[str, object] = {"state_dir": Path(state_dir)}
        for name, rel in _DERIVED_PATHS.items():
            if getattr(self, name) == self.state_dir / rel:
                changes[name] = None
        return dataclasses.replace(self, **changes)

    @property
    def window_seconds(self) -> float:
        return self.window_slots * self.slot_seconds

    @property
    def watermark_seconds(self) -> float:
        return self.watermark_slots * self.slot_seconds

    @property
    def operators_dir(self) -> Path:
        return self.table_dir / "operators"

    @property
    def nodes_dir(self) -> Path:
        return self.table_dir / "nodes"

    @property
    def decisions_dir(self) -> Path:
        return self.table_dir / "decisions"

    @property
    def quarantine_table_dir(self) -> Path:
        return self.table_dir / "quarantine"

    @property
    def progress_path(self) -> Path:
        return self.table_dir / "_progress.json"

    def validate(self) -> None:
        require(
            isinstance(self.spark_master, str) and bool(self.spark_master.strip()),
            "spark_master",
            "must be a non-empty Spark master URL (local[2], spark://h:p, yarn, k8s://...)",
        )
        require(
            self.retention_seconds >= 0,
            "retention_seconds",
            f"must be >= 0, got {self.retention_seconds}",
        )
        require(
            self.max_spool_bytes > 0, "max_spool_bytes", f"must be > 0, got {self.max_spool_bytes}"
        )
        require(
            self.table_retention_days >= 1,
            "table_retention_days",
            f"must be >= 1, got {self.table_retention_days}",
        )
        require(self.slot_seconds > 0, "slot_seconds", f"must be > 0, got {self.slot_seconds}")
        require(self.window_slots >= 1, "window_slots", f"must be >= 1, got {self.window_slots}")
        require(
            self.watermark_slots >= 0,
            "watermark_slots",
            f"must be >= 0, got {self.watermark_slots}",
        )
        require(
            self.trigger_seconds > 0, "trigger_seconds", f"must be > 0, got {self.trigger_seconds}"
        )
        require(
            self.shuffle_partitions >= 1,
            "shuffle_partitions",
            f"must be >= 1, got {self.shuffle_partitions}",
        )
        require(self.fit_windows >= 8, "fit_windows", f"must be >= 8, got {self.fit_windows}")
        require(
            math.isfinite(self.fit_interval_seconds) and self.fit_interval_seconds >= 0,
            "fit_interval_seconds",
            f"must be a number >= 0 (0: no refits while running), got {self.fit_interval_seconds}",
        )
        for key in ("seed_windows", "seed_operators_per_epoch", "max_pending_writes"):
            require(getattr(self, key) >= 1, key, f"must be >= 1, got {getattr(self, key)}")
        for key in ("arima_max_p", "arima_max_q"):
            value = getattr(self, key)
            require(0 <= value <= 5, key, f"must be within 0..5, got {value}")
        for key in self.spark_conf:
            require(key.startswith("spark."), f"spark_conf.{key}", "must start with 'spark.'")
        paths = {name: getattr(self, name) for name in _DERIVED_PATHS}
        require(paths["spool_dir"] != paths["table_dir"], "table_dir", "must differ from spool_dir")
        require(
            paths["checkpoint_dir"] not in (paths["spool_dir"], paths["table_dir"]),
            "checkpoint_dir",
            "must differ from spool_dir and table_dir",
        )
