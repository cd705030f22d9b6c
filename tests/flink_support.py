"""Shared pieces of the tests that drive a real Flink cluster (testbed/flink).

Holds no tests itself. Use::

    from tests.flink_support import running_job

    def test_something(flink_cluster, tmp_path):
        with running_job(flink_cluster, tmp_path, rate=2000) as (job_id, feeder):
            ...

``flink_cluster`` (tests/conftest.py) is session-scoped: one 1-TaskManager
cluster (4 slots) for the whole run, 10-40 s to start. :func:`make_cluster_fixture` builds other shapes.
Without Flink (``make flink``) the tests skip, or fail under
``DSCHED_REQUIRE_CGROUPS=1`` (CI), like the cgroup tests.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

import pytest

from testbed.flink import install
from testbed.flink.cluster import FlinkCluster
from testbed.flink.job import submit_wordcount
from testbed.flink.load import TraceFeeder


def require_flink() -> Path:
    """The Flink home; skip (or, under DSCHED_REQUIRE_CGROUPS=1, fail) when Flink or
    the JDK tools are missing."""
    why = install.missing()
    if why is None:
        return install.flink_home()
    if os.environ.get("DSCHED_REQUIRE_CGROUPS") == "1":
        pytest.fail(f"Flink unavailable but DSCHED_REQUIRE_CGROUPS=1: {why}")
    pytest.skip(why)  # "Flink not installed: run `make flink` (...)" or the JDK tool missing


def _report(request: pytest.FixtureRequest, message: str) -> None:
    """Print past pytest's capture: a module fixture's teardown output would otherwise
    be attached to the module's last test and shown only if that one failed."""
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if capture is None:
        print(message, file=sys.__stderr__)
        return
    with capture.global_and_fixture_disabled():
        print(f"\n{message}")


def make_cluster_fixture(
    scope: str = "module", taskmanagers: int = 1, slots: int = 4
) -> Callable[..., Iterator[FlinkCluster]]:
    """A pytest fixture yielding a started :class:`FlinkCluster` in a fresh tmp dir.

    It stops the cluster afterwards; if a test failed meanwhile (or the start
    failed) it keeps the logs and prints where they are."""

    @pytest.fixture(scope=scope)
    def fixture(
        request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
    ) -> Iterator[FlinkCluster]:
        home = require_flink()
        cluster = FlinkCluster(tmp_path_factory.mktemp("flink"), home=home)
        try:
            cluster.start(taskmanagers=taskmanagers, slots=slots)
        except Exception:
            _report(request, f"Flink cluster failed to start; logs kept in {cluster.log_dir}")
            raise
        failed_before = request.session.testsfailed
        try:
            yield cluster
        finally:
            failed = request.session.testsfailed > failed_before
            cluster.stop(keep_logs=failed)
            if failed:
                _report(request, f"Flink logs kept in {cluster.log_dir}")

    return fixture


class RunningJob(NamedTuple):
    job_id: str
    feeder: TraceFeeder


@contextmanager
def running_job(
    cluster: FlinkCluster,
    work_dir: Path,
    *,
    rate: float,
    job_name: str = "wc",
    parallelism: int = 2,
    total: int | None = None,
    latency_dir: Path | None = None,
    rounds: int | None = None,
    timeout: float = 60.0,
) -> Iterator[RunningJob]:
    """Submit DschedWordCount reading ``work_dir/<job_name>-in``, wait until every
    subtask runs, then feed it at a constant ``rate`` (records/s; ``total`` stops the
    feeder after that many). Yields ``(job_id, feeder)``; afterwards stops the feeder
    and cancels the job if it is still running."""
    input_dir = Path(work_dir) / f"{job_name}-in"
    job_id = submit_wordcount(
        cluster,
        input_dir,
        job_name,
        parallelism=parallelism,
        latency_dir=latency_dir,
        rounds=rounds,
    )
    feeder = TraceFeeder(input_dir, rate, total=total)
    try:
        cluster.wait_running(job_id, timeout)
        feeder.start()
        yield RunningJob(job_id, feeder)
    finally:
        in_flight = sys.exc_info()[1] is not None
        try:
            feeder.stop()
            # A test may have stopped the cluster itself (e.g. to check stop()).
            if cluster.started:
                cluster.cancel(job_id)
        except Exception:
            if not in_flight:  # never hide the test's own failure behind a cleanup error
                raise
