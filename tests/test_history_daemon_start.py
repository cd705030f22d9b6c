"""``dsched-history run`` judging its job's start.

The job's state moves on its own thread: wait_running can give up a moment before
the query starts, and the next status already says running. That is a start, not
a failure (under load this window grew to seconds and the daemon exited 1 with
"failed to start: None"). The stand-in below replaces the embedded Spark job to
place the daemon's checks on either side of that moment, which a real JVM's
timing cannot do on demand; the real job's start and stop are tested in
tests/test_sigterm.py.
"""

from __future__ import annotations

import os
import signal
import threading

import pytest

import spark_stream.daemon as daemon
import spark_stream.embedded as embedded
from spark_stream.config import HistoryConfig
from spark_stream.embedded import HistoryStatus


class JobStartingLate:
    """Stand-in for EmbeddedHistory: wait_running gives up ``late`` times before
    the status turns to ``final`` (with ``error``)."""

    instances: list[JobStartingLate] = []

    def __init__(self, config, *, late=1, final="running", error=None):
        self.late, self.final, self.error = late, final, error
        self.stopped = False
        JobStartingLate.instances.append(self)

    def start(self) -> None:
        pass

    def wait_running(self, timeout: float = 120.0) -> bool:
        if self.late:
            self.late -= 1
            return False
        return self.final == "running"

    def status(self) -> HistoryStatus:
        return HistoryStatus(state=self.final, spark_master="local[1]", error=self.error)

    def fit_counts(self) -> HistoryStatus:
        return HistoryStatus(state=self.final, spark_master="local[1]")

    def stop(self) -> None:
        self.stopped = True


@pytest.fixture
def job(monkeypatch):
    JobStartingLate.instances.clear()

    def use(**kw):
        monkeypatch.setattr(
            embedded, "EmbeddedHistory", lambda config: JobStartingLate(config, **kw)
        )

    return use


def _run_until_signalled(tmp_path) -> int:
    config = HistoryConfig(state_dir=tmp_path / "state")
    # The steady loop waits 10 s between checks; a SIGTERM ends it at once. It
    # comes after the second a failed start waits for a stop, so it cannot pass
    # for one.
    timer = threading.Timer(2.0, os.kill, (os.getpid(), signal.SIGTERM))
    timer.start()
    try:
        return daemon._run(config)
    finally:
        timer.cancel()


def test_a_query_that_starts_after_wait_running_gave_up_is_running(tmp_path, job, capsys):
    job(late=1, final="running")
    assert _run_until_signalled(tmp_path) == daemon.STOPPED
    assert "failed to start" not in capsys.readouterr().err
    assert JobStartingLate.instances[0].stopped


@pytest.mark.parametrize(
    ("final", "error", "says"),
    [
        ("failed", "Py4JError: no gateway", "failed to start: Py4JError: no gateway"),
        ("stopped", None, "failed to start: the job is stopped and gave no error"),
    ],
)
def test_a_job_that_ends_while_starting_says_why(tmp_path, job, capsys, final, error, says):
    job(late=1, final=final, error=error)
    config = HistoryConfig(state_dir=tmp_path / "state")
    assert daemon._run(config) == 1
    assert says in capsys.readouterr().err
    assert JobStartingLate.instances[0].stopped
