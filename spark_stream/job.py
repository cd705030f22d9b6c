"""The Structured Streaming history job: spool files in, event-time windows out.

Plan of one query:

1. the file source reads ``slot-*.json`` (JSON Lines) from the spool with an explicit
   schema and a corrupt-record column;
2. each line becomes one uniform record: instance and node samples and the ``slot``
   line (with the decision) at the slot's start, the ``tick`` line at the slot's end
   (it moves the watermark past the slot so its window closes without waiting for the
   next slot); a line that is not valid JSON, has another schema version or lacks a
   required field becomes a ``quarantine`` record with the reason, and the file is
   moved to the quarantine directory once its batch is committed;
3. a watermark on event time, then one streaming aggregation grouped by
   (window, kind, keys) — append mode, so every window is emitted exactly once, when
   the watermark has passed its end;
4. :class:`HistorySink` (``foreachBatch``) turns the emitted groups into the history
   tables (Parquet, ``date=YYYY-MM-DD`` partitions). Each file is named after the
   micro-batch id and published by atomic rename, so replaying a batch after a crash
   rewrites the same files with the same content: no loss (the checkpoint replays the
   batch) and no duplicate (same name).

The aggregated output of a batch is small (one row per operator, node and slot per
window), so the sink writes it from the driver with pyarrow; the per-sample work
(parsing, exploding, aggregating) runs on the executors.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from spark_stream import schema as S
from spark_stream.config import HistoryConfig

log = logging.getLogger(__name__)

_SPARK_TYPES = {
    "string": "StringType",
    "long": "LongType",
    "double": "DoubleType",
    "boolean": "BooleanType",
}


def spark_session(config: HistoryConfig, app_name: str = "dsched-history"):
    """A Spark session on ``config.spark_master`` with the history job's settings."""
    from pyspark.sql import SparkSession

    # Executors must run the interpreter that has this project and pandas installed;
    # on a cluster, spark_conf["spark.pyspark.python"] names the path on the workers.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.master(config.spark_master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", str(config.shuffle_partitions))
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.streaming.noDataMicroBatches.enabled", "true")
        .config("spark.pyspark.python", os.environ["PYSPARK_PYTHON"])
        # A micro-batch names each new spool file as a path; above this many paths Spark
        # would start a listing job with one task per file just to stat them.
        .config("spark.sql.sources.parallelPartitionDiscovery.threshold", "1000000")
        # The sink hands each micro-batch's windows to pandas; Arrow makes that columnar.
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
    )
    for key, value in config.spark_conf.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def _spark_type(name: str):
    from pyspark.sql import types as T

    return getattr(T, _SPARK_TYPES[name])()


def spool_spark_schema():
    """The explicit Spark schema of a spool line (version 1) plus the corrupt-record column."""
    from pyspark.sql import types as T

    fields = [T.StructField(n, _spark_type(t), True) for n, t in S.line_fields()]
    return T.StructType([*fields, T.StructField("_corrupt_record", T.StringType(), True)])


def windows_stream(spark, config: HistoryConfig):
    """The streaming DataFrame of aggregated (window, kind, keys) groups."""
    from pyspark.sql import functions as F

    raw = (
        spark.readStream.schema(spool_spark_schema())
        .option("mode", "PERMISSIVE")
        .option("columnNameOfCorruptRecord", "_corrupt_record")
        .option("pathGlobFilter", "slot-*.json")
        .json(str(config.spool_dir))
        .withColumn("file_name", F.col("_metadata.file_name"))
    )
    kind = F.col("kind")
    reason = (
        F.when(F.col("_corrupt_record").isNotNull(), F.lit("bad_json"))
        .when(F.col("v").isNull() | (F.col("v") != S.SPOOL_SCHEMA_VERSION), F.lit("schema_version"))
        .when(
            kind.isNull()
            | ~kind.isin(*S.LINE_KINDS)
            | F.col("slot").isNull()
            | F.col("timestamp").isNull()
            | F.col("slot_seconds").isNull()
            | (F.col("slot_seconds") <= 0)
            | ((kind == "instance") & (F.col("app").isNull() | F.col("operator").isNull()))
            | ((kind == "node") & F.col("node").isNull()),
            F.lit("missing_field"),
        )
    )
    # A malformed line has no trustworthy content; the file name carries the slot start,
    # so it sits on the same clock as the samples and cannot push the watermark ahead.
    name_time = F.timestamp_millis(
        F.regexp_extract("file_name", S.SPOOL_NAME_PATTERN, 2).cast("long")
    )
    good_time = F.when(kind == "tick", F.col("timestamp") + F.col("slot_seconds")).otherwise(
        F.col("timestamp")
    )
    good = reason.isNull()
    lines = raw.select(
        F.when(good, kind).otherwise(F.lit("quarantine")).alias("kind"),
        F.when(good, F.timestamp_seconds(good_time)).otherwise(name_time).alias("event_time"),
        F.when(good & (kind == "instance"), F.col("app")).alias("app"),
        F.when(good & (kind == "instance"), F.col("operator")).alias("operator"),
        # Instances are grouped per operator, so their node is not part of the key.
        F.when(good & (kind == "node"), F.col("node")).alias("node"),
        F.when(good & (kind == "slot"), F.col("slot")).alias("slot_key"),
        F.when(~good | (kind == "slot"), F.col("file_name")).alias("source_file"),
        F.when(good & (kind == "slot"), F.col("decision")).otherwise(reason).alias("detail"),
        F.col("stateful").cast("long").alias("stateful"),
        *S.OPERATOR_COUNTERS,
        *S.OPERATOR_GAUGES,
        *S.NODE_GAUGES,
    )
    keys = ["kind", "app", "operator", "node", "slot_key", "source_file", "detail"]
    sums = [F.sum(c).alias(c) for c in S.OPERATOR_COUNTERS + S.OPERATOR_GAUGES + S.NODE_GAUGES]
    counts = [F.count(c).alias(f"{c}__n") for c in S.NODE_GAUGES]
    return (
        lines.withWatermark("event_time", f"{int(config.watermark_seconds * 1000)} milliseconds")
        .groupBy(F.window("event_time", f"{int(config.window_seconds * 1000)} milliseconds"), *keys)
        .agg(
            F.count(F.lit(1)).alias("samples"), F.max("stateful").alias("stateful"), *sums, *counts
        )
        .select(
            F.col("window.start").alias("window_start"),
            F.col("window.end").alias("window_end"),
            "*",
        )
        .drop("window")
    )


def _utc(series: pd.Series) -> pd.Series:
    s = pd.to_datetime(series)
    return s.dt.tz_localize("UTC") if s.dt.tz is None else s.dt.tz_convert("UTC")


def operator_windows(groups: pd.DataFrame, batch_id: int) -> pd.DataFrame:
    """Per (app, operator, window): counters summed, gauges as mean per slot of the sum."""
    slots = groups[groups["kind"] == "slot"].groupby("window_start")["samples"].sum()
    ops = groups[groups["kind"] == "instance"].copy()
    if ops.empty:
        return pd.DataFrame(columns=S.OPERATOR_TABLE.names)
    ops["slots"] = ops["window_start"].map(slots).fillna(1).clip(lower=1).astype("int64")
    ops["instances"] = ops["samples"] / ops["slots"]
    for c in S.OPERATOR_GAUGES:
        ops[c] = ops[c] / ops["slots"]
    bounds = (
        groups[groups["kind"] == "slot"].groupby("window_start")["slot_key"].agg(["min", "max"])
    )
    ops["slot_first"] = ops["window_start"].map(bounds["min"]).astype("Int64")
    ops["slot_last"] = ops["window_start"].map(bounds["max"]).astype("Int64")
    ops["stateful"] = ops["stateful"].fillna(0) > 0
    ops["batch_id"] = batch_id
    return ops[S.OPERATOR_TABLE.names].sort_values(["window_start", "app", "operator"])


def node_windows(groups: pd.DataFrame, batch_id: int) -> pd.DataFrame:
    nodes = groups[groups["kind"] == "node"].copy()
    if nodes.empty:
        return pd.DataFrame(columns=S.NODE_TABLE.names)
    for c in S.NODE_GAUGES:
        count = nodes[f"{c}__n"]
        # A counter the node cannot read stays missing; it is never averaged in as zero.
        nodes[c] = (nodes[c] / count).where(count > 0)
    nodes["batch_id"] = batch_id
    return nodes[S.NODE_TABLE.names].sort_values(["window_start", "node"])


def decision_records(groups: pd.DataFrame, batch_id: int) -> pd.DataFrame:
    slots = groups[groups["kind"] == "slot"].rename(
        columns={"slot_key": "slot", "detail": "decision"}
    )
    slots = slots.assign(batch_id=batch_id)
    return slots[S.DECISION_TABLE.names].sort_values("slot")


def quarantine_records(groups: pd.DataFrame, batch_id: int) -> pd.DataFrame:
    bad = groups[groups["kind"] == "quarantine"].rename(
        columns={"detail": "reason", "samples": "lines"}
    )
    bad = bad.assign(batch_id=batch_id)
    return bad[S.QUARANTINE_TABLE.names].sort_values("source_file")


def write_partitioned(
    frame: pd.DataFrame,
    table_dir: Path,
    schema: pa.Schema,
    batch_id: int,
    date_column: str | None = "window_start",
) -> list[Path]:
    """Write one Parquet file per date partition named after the batch; atomic and idempotent."""
    if frame.empty:
        return []
    if date_column is None:
        parts = {time.strftime("%Y-%m-%d", time.gmtime()): frame}
    else:
        dates = _utc(frame[date_column]).dt.strftime("%Y-%m-%d")
        parts = {d: frame[dates == d] for d in sorted(dates.unique())}
    written = []
    for date, part in parts.items():
        directory = table_dir / f"date={date}"
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"batch-{batch_id:012d}.parquet"
        table = pa.Table.from_pandas(
            part.reset_index(drop=True), schema=schema, preserve_index=False
        )
        tmp = directory / f".batch-{batch_id:012d}.parquet.tmp"
        pq.write_table(table, tmp)
        os.replace(tmp, path)
        written.append(path)
    return written


def read_progress(config: HistoryConfig) -> dict[str, Any]:
    try:
        return json.loads(config.progress_path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def _write_json_atomic(path: Path, doc: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name("." + path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1, sort_keys=True))
    os.replace(tmp, path)


class HistorySink:
    """``foreachBatch`` target: emitted window groups → history tables + progress file."""

    def __init__(self, config: HistoryConfig):
        self.config = config
        self.batches = 0
        self.last_batch_id: int | None = None
        self.last_batch_at: float | None = None

    def __call__(self, batch_df, batch_id: int) -> None:
        groups = batch_df.toPandas()
        self.write(groups, batch_id)

    def write(self, groups: pd.DataFrame, batch_id: int) -> None:
        cfg = self.config
        if not groups.empty:
            groups["window_start"] = _utc(groups["window_start"])
            groups["window_end"] = _utc(groups["window_end"])
            write_partitioned(
                operator_windows(groups, batch_id), cfg.operators_dir, S.OPERATOR_TABLE, batch_id
            )
            write_partitioned(node_windows(groups, batch_id), cfg.nodes_dir, S.NODE_TABLE, batch_id)
            write_partitioned(
                decision_records(groups, batch_id), cfg.decisions_dir, S.DECISION_TABLE, batch_id
            )
            bad = quarantine_records(groups, batch_id)
            write_partitioned(
                bad, cfg.quarantine_table_dir, S.QUARANTINE_TABLE, batch_id, date_column=None
            )
            for row in bad.itertuples():
                log.warning(
                    "quarantined spool file %s: %s (%d lines)",
                    row.source_file,
                    row.reason,
                    row.lines,
                )
            self._move_quarantined(sorted(set(bad["source_file"])))
        self._update_progress(groups, batch_id)
        self.batches += 1
        self.last_batch_id = batch_id
        self.last_batch_at = time.time()

    def _move_quarantined(self, names: list[str]) -> None:
        # The batch that read these files is committed (windows are emitted one batch
        # later), so moving them cannot break a replay.
        qdir = self.config.quarantine_dir
        qdir.mkdir(parents=True, exist_ok=True)
        for name in names:
            src = self.config.spool_dir / name
            if src.exists():
                shutil.move(src, qdir / name)

    def _update_progress(self, groups: pd.DataFrame, batch_id: int) -> None:
        progress = read_progress(self.config)
        slots = groups[groups["kind"] == "slot"] if not groups.empty else groups
        committed = progress.get("committed_slot")
        if not slots.empty:
            top = int(slots["slot_key"].max())
            committed = top if committed is None else max(committed, top)
        latest_end = progress.get("latest_window_end")
        if not groups.empty:
            data = groups["kind"].isin(["instance", "node", "slot"])
            top_end = groups.loc[data, "window_end"].max()
            if pd.notna(top_end):
                top_end = top_end.timestamp()
                latest_end = top_end if latest_end is None else max(latest_end, top_end)
        progress.update(
            batch_id=batch_id,
            committed_slot=committed,
            latest_window_end=latest_end,
            updated_at=time.time(),
            schema_version=S.SPOOL_SCHEMA_VERSION,
        )
        _write_json_atomic(self.config.progress_path, progress)


def prune_table(config: HistoryConfig, now: float | None = None) -> list[Path]:
    """Delete date partitions older than ``table_retention_days``; return what was removed."""
    now = time.time() if now is None else now
    cutoff = time.strftime("%Y-%m-%d", time.gmtime(now - config.table_retention_days * 86400))
    removed = []
    for table in (
        config.operators_dir,
        config.nodes_dir,
        config.decisions_dir,
        config.quarantine_table_dir,
    ):
        if not table.is_dir():
            continue
        for part in table.iterdir():
            # ISO dates compare correctly as strings.
            if part.is_dir() and part.name.startswith("date=") and part.name[5:] < cutoff:
                shutil.rmtree(part)
                removed.append(part)
    return removed


def ensure_dirs(config: HistoryConfig) -> None:
    for d in (config.spool_dir, config.table_dir, config.checkpoint_dir, config.quarantine_dir):
        Path(d).mkdir(parents=True, exist_ok=True)


def start_query(
    spark,
    config: HistoryConfig,
    sink: Callable[[Any, int], None] | None = None,
    available_now: bool = False,
):
    """Start the streaming query; ``available_now`` processes what is spooled, then stops."""
    ensure_dirs(config)
    writer = (
        windows_stream(spark, config)
        .writeStream.outputMode("append")
        .foreachBatch(sink or HistorySink(config))
        .option("checkpointLocation", str(config.checkpoint_dir))
        .queryName("dsched_history")
    )
    if available_now:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=f"{int(config.trigger_seconds * 1000)} milliseconds")
    return writer.start()


def run_available(spark, config: HistoryConfig, sink=None, timeout: float = 300.0) -> None:
    """Process every spooled file now (and emit the windows it closes), then return."""
    query = start_query(spark, config, sink, available_now=True)
    query.awaitTermination(timeout)
    if query.isActive:
        query.stop()
        raise TimeoutError(f"history query did not finish within {timeout} s")
    if query.exception() is not None:
        raise RuntimeError(f"history query failed: {query.exception()}")
