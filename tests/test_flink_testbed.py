"""The Flink testbed on a real cluster: start, the job's vertices and threads, no loss,
latency, cancel, stop. One cluster and one job are shared by the module's tests
(they run in file order: the last ones cancel the job and stop the cluster).

The first tests need no cluster: the feeder, the traces, the latency files and
the install check.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from testbed.flink import install, job, metrics
from testbed.flink.cluster import FlinkCluster, jvm_threads
from testbed.flink.load import WORDS, TraceFeeder, scenario_rates
from tests.flink_support import require_flink, running_job

RATE = 2000  # records/s: about half a core for the whole job here
TOTAL = 6000  # three seconds of input
PARALLELISM = 2


def _read_batches(input_dir: Path) -> list[str]:
    return [line for path in sorted(input_dir.iterdir()) for line in path.read_text().splitlines()]


def _wait_for(get, ok, timeout: float, what: str):
    """Poll ``get()`` until ``ok(value)``; the value."""
    deadline = time.monotonic() + timeout
    while True:
        value = get()
        if ok(value):
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.25)


# -- no cluster -------------------------------------------------------------------


def test_feeder_writes_exactly_total_records_with_consecutive_ids(tmp_path):
    feeder = TraceFeeder(tmp_path, 8000, total=1000, batch_period=0.05).start()
    feeder.join(timeout=10)
    assert feeder.records_written == 1000
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names and not any(n.startswith(".") for n in names)  # every batch renamed in
    rows = [line.split(",") for line in _read_batches(tmp_path)]
    assert [int(r[0]) for r in rows] == list(range(1000))
    assert {r[1] for r in rows} <= set(WORDS)
    stamps = [int(r[2]) for r in rows]
    assert stamps == sorted(stamps)  # monotonic: the job's MAX(ts) is the latest record's


def test_feeder_follows_an_array_trace_and_stops_at_its_end(tmp_path):
    # Binary-exact periods: 4 batches per 0.5-s slot of 100, 0, 200 records.
    feeder = TraceFeeder(tmp_path, [800, 0, 1600], slot_seconds=0.5, batch_period=0.125)
    feeder.start().join(timeout=10)
    assert feeder.records_written == 1200
    assert feeder.batches_written == 8
    sizes = sorted(len(p.read_text().splitlines()) for p in tmp_path.iterdir())
    assert sizes == [100] * 4 + [200] * 4


def test_scenario_rates_scale_the_benchmark_traces():
    regular = scenario_rates("regular", 4000, 40)
    assert regular.max() == pytest.approx(4000) and regular.min() == pytest.approx(400)
    random = scenario_rates("random", 2500, 200, seed=3)
    steps = random / 100.0  # peak / 25 per producer
    np.testing.assert_allclose(steps, np.round(steps))
    assert steps.min() >= 1 and steps.max() <= 25
    np.testing.assert_array_equal(random, scenario_rates("random", 2500, 200, seed=3))
    with pytest.raises(ValueError, match="unknown scenario"):
        scenario_rates("diurnal", 1, 10)


def test_latency_tail_reads_each_window_once_and_only_whole_lines(tmp_path):
    path = tmp_path / "wc-0-0.lat"
    path.write_bytes(b"10\n20\n3")
    tail = metrics.LatencyTail(tmp_path, "wc")
    assert tail.read().tolist() == [10, 20]
    with path.open("ab") as f:
        f.write(b"0\n40\n")
    (tmp_path / "wc-1-0.lat").write_bytes(b"5\n")
    assert sorted(tail.read().tolist()) == [5, 30, 40]
    assert tail.read().size == 0
    stats = metrics.LatencyStats.of(metrics.read_latencies(tmp_path, "wc"))
    assert stats.count == 5 and stats.mean_ms == pytest.approx(21.0) and stats.max_ms == 40


def test_missing_flink_names_what_and_how_to_install(tmp_path, monkeypatch):
    monkeypatch.setenv(install.HOME_ENV, str(tmp_path / "nowhere"))
    monkeypatch.setenv("PATH", str(tmp_path))  # no java either
    why = install.missing()
    assert str(tmp_path / "nowhere") in why and "make flink" in why
    assert "java, javac, jar, jcmd not found" in why and "openjdk-17-jdk-headless" in why
    with pytest.raises(install.FlinkUnavailable, match="make flink"):
        FlinkCluster(tmp_path / "work")


def test_job_args_default_the_latency_dir_and_cost():
    assert job.job_args(Path("/in"), "wc") == ["/in", "wc", "-"]
    assert job.job_args(Path("/in"), "wc", Path("/lat"), 7) == ["/in", "wc", "/lat", "7"]
    assert job.DEFAULT_ROUNDS > 0


# -- a real cluster ---------------------------------------------------------------


@dataclass
class Job:
    job_id: str
    feeder: TraceFeeder
    latency_dir: Path


@pytest.fixture(scope="module")
def wordcount(flink_cluster, tmp_path_factory):
    work = tmp_path_factory.mktemp("wordcount")
    latency_dir = work / "latency"
    with running_job(
        flink_cluster,
        work,
        rate=RATE,
        total=TOTAL,
        parallelism=PARALLELISM,
        latency_dir=latency_dir,
    ) as (job_id, feeder):
        yield Job(job_id, feeder, latency_dir)


@pytest.mark.slow
def test_cluster_reports_one_taskmanager_with_four_slots(flink_cluster):
    tms = flink_cluster.registered_taskmanagers()
    assert [tm["slotsNumber"] for tm in tms] == [4]
    assert list(flink_cluster.taskmanagers()) == [tms[0]["id"]]
    assert flink_cluster.rest.get("/overview")["slots-total"] == 4


@pytest.mark.slow
def test_every_vertex_runs_at_parallelism_two(flink_cluster, wordcount):
    vertices = flink_cluster.job_vertices(wordcount.job_id)
    names = [v["name"] for v in vertices]
    prefixes = (job.SOURCE_VERTEX, job.CALC_VERTEX, job.AGGREGATE_VERTEX, job.SINK_VERTEX)
    assert len(names) == len(prefixes), names  # no ConstraintEnforcer, no TableToDataStream
    assert all(n.startswith(p) for n, p in zip(names, prefixes, strict=True)), names
    for v in vertices:
        assert v["parallelism"] == PARALLELISM
        assert v["tasks"]["RUNNING"] == PARALLELISM, v


@pytest.mark.slow
def test_every_subtask_has_a_named_task_thread(flink_cluster, wordcount):
    (pid,) = flink_cluster.taskmanager_pids()
    threads = {t.name: t.tid for t in jvm_threads(pid)}
    for v in flink_cluster.job_vertices(wordcount.job_id):
        for i in range(1, PARALLELISM + 1):
            pattern = re.compile(rf"{re.escape(v['name'])} \({i}/{PARALLELISM}\)#\d+")
            found = [name for name in threads if pattern.fullmatch(name)]
            assert len(found) == 1, (v["name"], i, sorted(threads))
            assert Path(f"/proc/{pid}/task/{threads[found[0]]}").exists()  # a real Linux TID


@pytest.mark.slow
def test_every_record_is_counted_once_and_its_latency_recorded(flink_cluster, wordcount):
    wordcount.feeder.join(timeout=60)
    assert wordcount.feeder.records_written == TOTAL
    rest, jid = flink_cluster.rest, wordcount.job_id
    assert metrics.drain(rest, jid, TOTAL, timeout=60) == TOTAL  # 0 lost, 0 duplicated
    assert metrics.source_records_out(rest, jid) == TOTAL
    # The sink takes upserts: one row, hence one latency value, per input record.
    count, total_ms = _wait_for(
        lambda: metrics.latency_counters(rest, jid),
        lambda c: c[0] >= TOTAL,
        30,
        f"dschedLatencyCount to reach {TOTAL}",
    )
    assert total_ms > 0
    sink = metrics.records(rest, jid)[flink_cluster.job_vertices(jid)[-1]["name"]]
    assert sum(s.records_in for s in sink) == count
    files = metrics.latency_files(wordcount.latency_dir, "wc")
    assert {f.name for f in files} <= {f"wc-{i}-0.lat" for i in range(PARALLELISM)}
    assert count == TOTAL
    values = _wait_for(
        lambda: metrics.read_latencies(wordcount.latency_dir, "wc"),
        lambda v: v.size >= count,
        10,
        "the sink's latency files to be flushed",
    )
    assert values.size == count and (values >= 0).all()
    assert values.sum() == total_ms  # the same values as the counters, file by file


@pytest.mark.slow
def test_cancel_ends_the_job(flink_cluster, wordcount):
    assert flink_cluster.cancel(wordcount.job_id) == "CANCELED"
    assert flink_cluster.job_state(wordcount.job_id) == "CANCELED"


@pytest.mark.slow
def test_stop_leaves_no_process_of_the_cluster(tmp_path):
    # A cluster of its own: the shared one serves the other modules after this one.
    cluster = FlinkCluster(tmp_path / "own", home=require_flink())
    cluster.start(taskmanagers=1, slots=1)
    pids = [cluster.jobmanager_pid(), *cluster.taskmanager_pids()]
    assert None not in pids and len(pids) == 2
    cluster.stop(keep_logs=True)
    assert cluster.processes() == []
    assert not any(Path(f"/proc/{pid}").exists() for pid in pids)
    assert not cluster.conf_dir.exists() and cluster.log_dir.exists()


@pytest.mark.slow
def test_a_port_taken_before_the_jobmanager_binds_it_starts_again_on_new_ones(
    tmp_path, monkeypatch
):
    import socket

    import testbed.flink.cluster as flink_cluster_module

    # Another process takes the REST port between its choice and the JobManager's bind.
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen()
    real_free_port = flink_cluster_module.free_port
    ports = iter([held.getsockname()[1]])
    monkeypatch.setattr(
        flink_cluster_module, "free_port", lambda: next(ports, None) or real_free_port()
    )
    cluster = FlinkCluster(tmp_path / "taken", home=require_flink())
    try:
        cluster.start(taskmanagers=0)
        assert cluster.rest_port != held.getsockname()[1]
        assert cluster.rest.get("/taskmanagers")["taskmanagers"] == []
        # The failed start's log is kept beside the new one.
        first = list(cluster.log_dir.glob("*standalonesession*.log.attempt1"))
        assert first and "java.net.BindException" in first[0].read_text(errors="replace")
    finally:
        cluster.stop()
        held.close()
