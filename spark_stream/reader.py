"""The reader of the history table and the fitted models (pyarrow only).

The streaming job writes one Parquet file per micro-batch and date partition,
named ``batch-<id>.parquet``; newer batches hold newer windows. The reader walks
the newest files first and stops as soon as it has the windows it was asked for,
so reading the last few hundred windows after a restart costs a few file reads,
however long the history is. No Spark session is needed here.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from spark_stream import schema as S
from spark_stream.config import HistoryConfig
from spark_stream.job import read_progress


@dataclass
class FittedModels:
    """What ``dsched-history fit`` produced; empty frames when it has not run yet."""

    arima: pd.DataFrame
    perf: pd.DataFrame
    fitted_at: float | None

    def arima_order(self, app: str, operator: str) -> tuple[int, int, int] | None:
        rows = self.arima[(self.arima["app"] == app) & (self.arima["operator"] == operator)]
        if rows.empty:
            return None
        r = rows.iloc[0]
        return int(r["p"]), int(r["d"]), int(r["q"])


def _batch_files_newest_first(table: Path) -> list[Path]:
    if not table.is_dir():
        return []
    files: list[Path] = []
    for part in sorted((p for p in table.iterdir() if p.name.startswith("date=")), reverse=True):
        files.extend(sorted(part.glob("batch-*.parquet"), reverse=True))
    return files


def _check_key(name: str, value: object) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{name} must be a non-empty string, got {value!r}")
    return value


def _check_slots(slots: object) -> int:
    if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
        raise ValueError(f"slots must be a positive integer, got {slots!r}")
    return slots


class HistoryReader:
    """Latest windows, fitted models and lag, read from ``config.table_dir``/``model_dir``."""

    def __init__(self, config: HistoryConfig):
        self.config = config

    def _latest(
        self,
        table: Path,
        key_column: str,
        key: str,
        slots: int,
        columns: list[str],
        extra: tuple[str, str] | None = None,
    ) -> pd.DataFrame:
        frames: list[pd.DataFrame] = []
        found = 0
        for path in _batch_files_newest_first(table):
            frame = pq.read_table(path).to_pandas()
            match = frame[key_column] == key
            if extra is not None:
                match &= frame[extra[0]] == extra[1]
            frame = frame[match]
            if not frame.empty:
                frames.append(frame)
                found += len(frame)
            if found >= slots:
                break
        if not frames:
            return pd.DataFrame(columns=columns)
        out = pd.concat(frames, ignore_index=True).sort_values("window_start")
        # A window lives in exactly one batch file; keep the last one defensively anyway.
        out = out.drop_duplicates(subset=["window_start"], keep="last")
        return out.tail(slots).reset_index(drop=True)[columns]

    def operator_history(self, app: str, operator: str, slots: int) -> pd.DataFrame:
        """The last ``slots`` windows of one operator, oldest first.

        Columns: window_start/end, slots, instances, the counters (arrivals, executed,
        emitted, cpu_seconds, latency sums, service_seconds) summed over instances,
        queue_length and cap_cores summed over instances (mean per slot), and the
        derived ``kappa`` (CPU-seconds per executed tuple) and ``selectivity``
        (emitted per executed), NaN where nothing was executed.
        """
        _check_key("app", app)
        _check_key("operator", operator)
        slots = _check_slots(slots)
        columns = [c for c in S.OPERATOR_TABLE.names if c not in ("app", "operator", "batch_id")]
        frame = self._latest(
            self.config.operators_dir, "app", app, slots, columns, extra=("operator", operator)
        )
        executed = frame["executed"].astype(float).replace(0.0, np.nan)
        frame = frame.assign(
            kappa=frame["cpu_seconds"].astype(float) / executed,
            selectivity=frame["emitted"].astype(float) / executed,
        )
        return frame

    def node_history(self, node: str, slots: int) -> pd.DataFrame:
        """The last ``slots`` windows of one node, oldest first (missing counters stay NaN)."""
        _check_key("node", node)
        slots = _check_slots(slots)
        columns = [c for c in S.NODE_TABLE.names if c not in ("node", "batch_id")]
        return self._latest(self.config.nodes_dir, "node", node, slots, columns)

    def latest_window_end(self) -> float | None:
        """Unix time of the end of the newest window written, or None before the first."""
        value = read_progress(self.config).get("latest_window_end")
        return float(value) if value is not None else None

    def lag_seconds(self, now: float | None = None) -> float | None:
        """How far the history trails the wall clock: now minus the newest window's end."""
        end = self.latest_window_end()
        if end is None:
            return None
        return max(0.0, (time.time() if now is None else now) - end)

    def quarantine_counts(self) -> dict[str, int]:
        """How many spool files were quarantined, by reason (a file counts once per reason)."""
        table = self.config.quarantine_table_dir
        files = _batch_files_newest_first(table)
        if not files:
            return {}
        frame = pd.concat([pq.read_table(f).to_pandas() for f in files], ignore_index=True)
        frame = frame.drop_duplicates(subset=["source_file", "reason"])
        return {str(k): int(v) for k, v in frame.groupby("reason").size().items()}

    def models(self) -> FittedModels:
        """The ARIMA orders and task performance models of the last ``dsched-history fit``."""
        from spark_stream.fit import ARIMA_TABLE, PERF_TABLE, read_model_table

        arima, fitted_a = read_model_table(self.config.model_dir / "arima", ARIMA_TABLE)
        perf, fitted_p = read_model_table(self.config.model_dir / "perf", PERF_TABLE)
        stamps = [t for t in (fitted_a, fitted_p) if t is not None]
        return FittedModels(arima=arima, perf=perf, fitted_at=max(stamps) if stamps else None)
