"""Batch fitting on a real Spark standalone cluster started from the installed pyspark.

A master and one worker run on loopback (``spark-class ...Master`` / ``...Worker``
with ``SPARK_HOME`` = the pyspark package); ``dsched-history fit --master
spark://...`` runs as its own process against them, and both are stopped after.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pyspark
import pytest

from controller.history import HistoryReader
from spark_stream import job
from spark_stream import schema as S
from spark_stream.config import HistoryConfig

pytestmark = [pytest.mark.spark, pytest.mark.slow]

SPARK_HOME = Path(pyspark.__file__).parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for(path: Path, text: str, proc: subprocess.Popen, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and text in path.read_text(errors="replace"):
            return
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args} exited {proc.returncode}: {path.read_text()[-2000:]}")
        time.sleep(0.2)
    raise TimeoutError(f"{text!r} not in {path} after {timeout} s")


@pytest.fixture
def standalone_cluster(tmp_path):
    env = dict(
        os.environ,
        SPARK_HOME=str(SPARK_HOME),
        SPARK_LOCAL_IP="127.0.0.1",
        PYSPARK_PYTHON=sys.executable,
        SPARK_WORKER_DIR=str(tmp_path / "work"),
        SPARK_LOG_DIR=str(tmp_path / "logs"),
    )
    spark_class = str(SPARK_HOME / "bin" / "spark-class")
    port = _free_port()
    url = f"spark://127.0.0.1:{port}"
    procs = []
    try:
        master_log = tmp_path / "master.log"
        master = subprocess.Popen(
            [
                spark_class,
                "org.apache.spark.deploy.master.Master",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--webui-port",
                str(_free_port()),
            ],
            env=env,
            stdout=master_log.open("w"),
            stderr=subprocess.STDOUT,
        )
        procs.append(master)
        _wait_for(master_log, "I have been elected leader", master)
        worker_log = tmp_path / "worker.log"
        worker = subprocess.Popen(
            [
                spark_class,
                "org.apache.spark.deploy.worker.Worker",
                url,
                "--host",
                "127.0.0.1",
                "--cores",
                "2",
                "--memory",
                "2g",
                "--webui-port",
                str(_free_port()),
            ],
            env=env,
            stdout=worker_log.open("w"),
            stderr=subprocess.STDOUT,
        )
        procs.append(worker)
        _wait_for(worker_log, "Successfully registered with master", worker)
        yield url, env, worker_log
    finally:
        for proc in reversed(procs):
            proc.terminate()
        for proc in reversed(procs):
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
    assert all(p.poll() is not None for p in procs)


def _operator_history(config: HistoryConfig, windows: int) -> None:
    """A history table as the streaming job writes it: AR(1) arrivals, known rates."""
    rng = np.random.default_rng(7)
    rows = []
    for app, op, threads in [("wc", "split", 2), ("wc", "count", 4)]:
        level = 1000.0
        for w in range(windows):
            level = 1000.0 + 0.7 * (level - 1000.0) + rng.normal(0, 50)
            start = pd.Timestamp(1_700_000_000 + 10 * w, unit="s", tz="UTC")
            rows.append(
                {
                    "app": app,
                    "operator": op,
                    "window_start": start,
                    "window_end": start + pd.Timedelta(seconds=10),
                    "slot_first": w,
                    "slot_last": w,
                    "slots": 1,
                    "samples": threads,
                    "instances": float(threads),
                    "stateful": False,
                    "arrivals": level,
                    "executed": level,
                    "emitted": level * 2,
                    "cpu_seconds": level * 0.002,
                    "latency_sum_seconds": 1.0,
                    "latency_count": 10.0,
                    "service_seconds": 0.01,
                    "queue_length": 1.0,
                    "cap_cores": None,
                    "batch_id": w,
                }
            )
    frame = pd.DataFrame(rows)
    for w, part in frame.groupby("batch_id"):
        job.write_partitioned(part, config.operators_dir, S.OPERATOR_TABLE, int(w))


def test_fit_runs_on_a_standalone_master_and_worker(standalone_cluster, tmp_path):
    url, env, worker_log = standalone_cluster
    config = HistoryConfig.under(tmp_path / "state")
    _operator_history(config, 40)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "spark_stream.daemon",
            "fit",
            "--state-dir",
            str(tmp_path / "state"),
            "--master",
            url,
            "--log-level",
            "WARNING",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f'"spark_master": "{url}"' in proc.stdout
    models = HistoryReader(config).models()
    assert sorted(models.arima["operator"]) == ["count", "split"]
    assert (models.arima["status"] == "ok").all() and (models.arima["windows"] == 40).all()
    perf = models.perf.set_index("operator")
    assert int(perf.loc["count", "threads"]) == 4
    assert perf.loc["count", "kappa"] == pytest.approx(0.002)
    # The work ran in an executor the worker launched, not in the driver.
    assert (
        "Launching executor" in worker_log.read_text()
        or "Asked to launch executor" in worker_log.read_text()
    )
