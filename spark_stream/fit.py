"""Batch fitting: per-operator ARIMA orders and task performance models.

Reads the operator windows of the history table with Spark, keeps the newest
``fit_windows`` windows per (app, operator), and fits each operator in parallel
with ``groupBy(app, operator).applyInPandas``:

* ARIMA: :func:`predict.load.fit_arma_state` on the arrivals per window (d from a
  KPSS test, p and q by AIC up to ``arima_max_p`` / ``arima_max_q``);
* task performance model (threads -> rate, CPU%), in the shape of
  :meth:`predict.perfmodel.PerformanceModel.from_table`: for each observed
  instance count, the highest executed rate seen (a lower bound on the peak stable
  rate, since history only shows what the load asked for) and the CPU% of one core
  at that window (``basis`` "observed"). A model scales from one thread, and an
  operator seldom runs a single instance, so where no window had one, a one-thread
  row is the busiest window's mean per instance: each instance is one thread, and
  its rate and CPU are its share of the operator's (``basis`` "per-instance").
  Memory is not sampled per instance by the agent, so ``memory_percent`` is null;
  the controller reads a null memory as no memory bound (docs/perf-models.md).

The results are small, so the driver writes each model table as one Parquet file
(atomic rename) under ``model_dir``, stamped with the fit time. The controller
loads ``model_dir/perf/current.parquet`` (its ``perf_model_table`` by default).
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from spark_stream.config import HistoryConfig

ARIMA_TABLE = pa.schema(
    [
        ("app", pa.string()),
        ("operator", pa.string()),
        ("p", pa.int64()),
        ("d", pa.int64()),
        ("q", pa.int64()),
        ("sigma", pa.float64()),
        ("windows", pa.int64()),
        ("status", pa.string()),
    ]
)
PERF_TABLE = pa.schema(
    [
        ("app", pa.string()),
        ("operator", pa.string()),
        ("threads", pa.int64()),
        ("peak_rate", pa.float64()),
        ("cpu_percent", pa.float64()),
        ("memory_percent", pa.float64()),
        ("kappa", pa.float64()),
        ("selectivity", pa.float64()),
        ("windows", pa.int64()),
        ("basis", pa.string()),
    ]
)
_FITTED_AT = b"dsched.fitted_at"
MIN_ARIMA_WINDOWS = 8


def _ddl(schema: pa.Schema) -> str:
    names = {pa.string(): "string", pa.int64(): "long", pa.float64(): "double"}
    return ", ".join(f"{f.name} {names[f.type]}" for f in schema)


def fit_arima_group(frame: pd.DataFrame, max_p: int, max_q: int) -> pd.DataFrame:
    """One operator's windows -> one row with its ARIMA order (or why there is none)."""
    from predict.load import fit_arma_state

    frame = frame.sort_values("window_start")
    y = frame["arrivals"].to_numpy(dtype=float)
    row = {
        "app": frame["app"].iloc[0],
        "operator": frame["operator"].iloc[0],
        "p": -1,
        "d": -1,
        "q": -1,
        "sigma": math.nan,
        "windows": len(y),
        "status": "ok",
    }
    if len(y) < MIN_ARIMA_WINDOWS:
        row["status"] = f"too few windows ({len(y)} < {MIN_ARIMA_WINDOWS})"
    else:
        try:
            state = fit_arma_state(y, None, max_p=max_p, max_q=max_q)
            row.update(p=state.order[0], d=state.order[1], q=state.order[2], sigma=state.sigma)
        except (RuntimeError, ValueError, np.linalg.LinAlgError) as exc:
            row["status"] = f"fit failed: {exc}"
    return pd.DataFrame([row], columns=ARIMA_TABLE.names)


def fit_perf_group(frame: pd.DataFrame) -> pd.DataFrame:
    """One operator's windows -> threads, observed peak rate and CPU% per instance count."""
    seconds = (frame["window_end"] - frame["window_start"]).dt.total_seconds().to_numpy()
    seconds = np.where(seconds > 0, seconds, np.nan)
    work = pd.DataFrame(
        {
            "threads": np.rint(frame["instances"].to_numpy(dtype=float)).astype("int64"),
            "rate": frame["executed"].to_numpy(dtype=float) / seconds,
            "cpu_percent": 100.0 * frame["cpu_seconds"].to_numpy(dtype=float) / seconds,
            "cpu": frame["cpu_seconds"].to_numpy(dtype=float),
            "executed": frame["executed"].to_numpy(dtype=float),
            "emitted": frame["emitted"].to_numpy(dtype=float),
        }
    )
    work = work[(work["threads"] >= 1) & np.isfinite(work["rate"])]

    def row(group: pd.DataFrame, threads: int, rate: float, cpu: float, basis: str) -> dict:
        executed = group["executed"].sum()
        return {
            "app": frame["app"].iloc[0],
            "operator": frame["operator"].iloc[0],
            "threads": threads,
            "peak_rate": rate,
            "cpu_percent": cpu,
            "memory_percent": math.nan,
            "kappa": float(group["cpu"].sum() / executed) if executed > 0 else math.nan,
            "selectivity": float(group["emitted"].sum() / executed) if executed > 0 else math.nan,
            "windows": len(group),
            "basis": basis,
        }

    rows = []
    for threads, group in work.groupby("threads"):
        peak = group.loc[group["rate"].idxmax()]
        rows.append(
            row(group, int(threads), float(peak["rate"]), float(peak["cpu_percent"]), "observed")
        )
    if rows and rows[0]["threads"] != 1:
        per_instance = work["rate"] / work["threads"]
        busiest = work.loc[per_instance.idxmax()]
        rows.insert(
            0,
            row(
                work,
                1,
                float(busiest["rate"] / busiest["threads"]),
                float(busiest["cpu_percent"] / busiest["threads"]),
                "per-instance",
            ),
        )
    return pd.DataFrame(rows, columns=PERF_TABLE.names)


def write_model_table(
    frame: pd.DataFrame, directory: Path, schema: pa.Schema, fitted_at: float
) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_pandas(frame.reset_index(drop=True), schema=schema, preserve_index=False)
    table = table.replace_schema_metadata({_FITTED_AT: repr(fitted_at).encode()})
    path = directory / "current.parquet"
    tmp = directory / ".current.parquet.tmp"
    pq.write_table(table, tmp)
    os.replace(tmp, path)
    return path


def read_model_table(directory: Path, schema: pa.Schema) -> tuple[pd.DataFrame, float | None]:
    path = Path(directory) / "current.parquet"
    if not path.exists():
        return pd.DataFrame(columns=schema.names), None
    table = pq.read_table(path)
    stamp = (table.schema.metadata or {}).get(_FITTED_AT)
    return table.to_pandas(), float(stamp) if stamp else None


def fit_models(spark, config: HistoryConfig) -> dict[str, int | str]:
    """Fit every operator in the history table; write the model tables; return counts
    and where the performance model table is (the controller's default
    ``perf_model_table``)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    if not config.operators_dir.is_dir():
        raise FileNotFoundError(f"no history table at {config.operators_dir}: nothing to fit yet")
    windows = (
        spark.read.parquet(str(config.operators_dir))
        .select(
            "app",
            "operator",
            "window_start",
            "window_end",
            "instances",
            "arrivals",
            "executed",
            "emitted",
            "cpu_seconds",
        )
        .withColumn(
            "_rank",
            F.row_number().over(
                Window.partitionBy("app", "operator").orderBy(F.col("window_start").desc())
            ),
        )
        .where(F.col("_rank") <= config.fit_windows)
        .drop("_rank")
    )
    max_p, max_q = config.arima_max_p, config.arima_max_q
    arima = (
        windows.groupBy("app", "operator")
        .applyInPandas(lambda f: fit_arima_group(f, max_p, max_q), schema=_ddl(ARIMA_TABLE))
        .toPandas()
    )
    perf = windows.groupBy("app", "operator").applyInPandas(fit_perf_group, schema=_ddl(PERF_TABLE))
    perf = perf.toPandas()
    fitted_at = time.time()
    write_model_table(
        arima.sort_values(["app", "operator"]), config.model_dir / "arima", ARIMA_TABLE, fitted_at
    )
    perf_path = write_model_table(
        perf.sort_values(["app", "operator", "threads"]),
        config.model_dir / "perf",
        PERF_TABLE,
        fitted_at,
    )
    return {
        "operators": len(arima),
        "arima_ok": int((arima["status"] == "ok").sum()),
        "perf_rows": len(perf),
        "perf_table": str(perf_path),
    }
