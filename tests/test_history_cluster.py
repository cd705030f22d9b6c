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
import pyspark
import pytest

from spark_stream.config import HistoryConfig
from spark_stream.reader import HistoryReader
from tests import test_history_samples as H

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
            rows.append(H.operator_window(app, op, w, level, threads=threads))
    H.write_operator_table(config, rows)


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
    # The rows the windows showed (the fit adds a one-thread row, basis
    # "per-instance", where none was observed).
    perf = models.perf[models.perf["basis"] == "observed"].set_index("operator")
    assert int(perf.loc["count", "threads"]) == 4
    assert perf.loc["count", "kappa"] == pytest.approx(0.002)
    # The work ran in an executor the worker launched, not in the driver.
    assert (
        "Launching executor" in worker_log.read_text()
        or "Asked to launch executor" in worker_log.read_text()
    )
