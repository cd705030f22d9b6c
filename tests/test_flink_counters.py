"""The engine counter edge against a real Flink cluster (testbed/flink).

One cluster and one DschedWordCount job (parallelism 2, four vertices:
``Source: src[1] -> Calc[2] -> GroupAggregate[4] -> lat[5]: Writer``) are shared
by the module's tests, which run in file order: the last one restarts the
TaskManager (a failover) and checks the counters stay monotonic. Without Flink
(``make flink`` or ``DSCHED_FLINK_HOME``) the module skips, or fails under
``DSCHED_REQUIRE_CGROUPS=1``, like tests/test_flink_testbed.py.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple, TypeVar

import pytest

from controller.edges.cluster import ObservedCluster
from controller.edges.engines import EngineEdge, FlinkCounterSource
from dsched.engines import CounterReading
from dsched.engines.flink import FlinkJob, safe_name
from dsched.ids import InstanceKey
from dsched_pb import dsched_pb2 as pb
from testbed.flink import metrics
from testbed.flink.cluster import FlinkCluster
from tests.flink_support import running_job

RATE = 2000  # records/s
TOTAL = 6000  # three seconds of input
JOB = "wc-counters"
T = TypeVar("T")


def wait_for(get: Callable[[], T], ok: Callable[[T], bool], timeout: float, what: str) -> T:
    """Poll ``get()`` until ``ok(value)``; the value (a wait with a timeout, not a timing)."""
    deadline = time.monotonic() + timeout
    while True:
        value = get()
        if ok(value):
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.25)


class Fed(NamedTuple):
    cluster: FlinkCluster
    job_id: str
    written: int


@pytest.fixture(scope="module")
def fed(flink_cluster, tmp_path_factory) -> Iterator[Fed]:
    """The job after its feeder wrote TOTAL records and the aggregate received them."""
    work = tmp_path_factory.mktemp("counters")
    with running_job(flink_cluster, work, rate=RATE, total=TOTAL, job_name=JOB) as (jid, feeder):
        feeder.join(timeout=60)
        seen = metrics.drain(flink_cluster.rest_url, jid, feeder.records_written, timeout=90)
        assert seen == feeder.records_written, "the job did not drain its input"
        yield Fed(flink_cluster, jid, feeder.records_written)


def job_of(source: FlinkCounterSource, jid: str) -> FlinkJob:
    return source.jobs[jid]


def totals(reading: CounterReading, operator_prefix: str, field: str) -> float:
    """Sum of one counter over the subtasks of the operator whose name starts so."""
    return sum(
        getattr(c, field)
        for k, c in reading.counters.items()
        if k.app == safe_name(JOB) and k.operator.startswith(operator_prefix)
    )


def within(value: float, expected: float, share: float = 0.05) -> bool:
    return abs(value - expected) <= share * expected


def test_counters_read_by_the_edge_match_flinks_own_totals(fed):
    source = FlinkCounterSource(fed.cluster.rest_url)
    reading = source.read()
    assert reading.error is None and not reading.missing
    job = job_of(source, fed.job_id)
    assert [v.name for v in job.vertices][:3] == ["Source: src[1]", "Calc[2]", "GroupAggregate[4]"]
    assert len(reading.counters) == sum(v.parallelism for v in job.vertices) == 8
    # Flink's own per-subtask totals, from the vertex detail (another REST view).
    agg = next(v for v in job.vertices if v.name.startswith("GroupAggregate"))
    detail = fed.cluster.rest.get(f"/jobs/{fed.job_id}/vertices/{agg.vid}")
    flink_read = sum(s["metrics"]["read-records"] for s in detail["subtasks"])
    edge_in = totals(reading, "GroupAggregate", "received")
    assert within(edge_in, flink_read), (edge_in, flink_read)
    assert within(edge_in, fed.written), (edge_in, fed.written)
    # Sources count records read as numRecordsIn.
    assert within(totals(reading, "Source", "received"), fed.written)
    # The sink's user counters: one latency per row it received, each a few ms or more.
    sink_in = totals(reading, "lat", "received")
    count = totals(reading, "lat", "latency_count")
    assert count > 0 and within(count, sink_in), (count, sink_in)
    assert totals(reading, "lat", "latency_sum_seconds") > 0
    # Busy time is the service time: some, for a job that hashed 6,000 records.
    assert totals(reading, "Calc", "busy_seconds") > 0


def test_one_metrics_get_per_vertex_per_read(fed):
    source = FlinkCounterSource(fed.cluster.rest_url)
    asked: list[tuple[str, Any]] = []
    get = source.rest.get

    def counting(path, params=None):
        asked.append((path, params))
        return get(path, params)

    source.rest.get = counting
    source.read()  # the first read also fetches the topology and the metric lists
    job = job_of(source, fed.job_id)
    for _ in range(2):
        asked.clear()
        reading = source.read()
        assert reading.counters and not reading.missing
        metric_gets = [p for p, params in asked if params and p.endswith("/metrics")]
        assert sorted(metric_gets) == sorted(
            f"/jobs/{fed.job_id}/vertices/{v.vid}/metrics" for v in job.vertices
        )
        assert len(asked) == 1 + len(job.vertices)  # plus /jobs/overview


def test_the_dag_and_the_stateful_flags_match_the_jobs_plan(fed):
    source = FlinkCounterSource(fed.cluster.rest_url)
    source.read()
    job = job_of(source, fed.job_id)
    plan = fed.cluster.rest.get(f"/jobs/{fed.job_id}/plan")["plan"]
    names = {v.vid: v.name for v in job.vertices}
    expected = {
        safe_name(names[n["id"]]): tuple(safe_name(names[i["id"]]) for i in n.get("inputs", ()))
        for n in plan["nodes"]
    }
    assert {v.operator: job.upstream_operators(v) for v in job.vertices} == expected
    assert {v.name for v in job.vertices if v.stateful} == {
        n for n in names.values() if n.startswith("GroupAggregate")
    }
    # Through ingest: samples shaped as the agent sends them (no counters; the DAG and
    # the stateful flag from the job), counters merged from the edge.
    edge = EngineEdge([(source, 1.0)])
    cluster = ObservedCluster(depth=5, engines=edge)
    cluster.agent_connected(pb.Hello(node_id="n1", cpu_capacity_cores=4.0, slot_seconds=1.0))
    samples = [
        pb.InstanceSample(
            key=pb.InstanceKey(app=job.app, operator=v.operator, instance=i),
            stateful=v.stateful,
            upstream=list(job.upstream_operators(v)),
            engine="flink",
        )
        for v in job.vertices
        for i in range(v.parallelism)
    ]
    edge.poll()
    now = time.time()
    cluster.ingest(
        pb.NodeReport(node_id="n1", slot=1, timestamp=now, slot_seconds=1.0, instances=samples), now
    )
    edge.poll()
    res = cluster.ingest(
        pb.NodeReport(node_id="n1", slot=2, timestamp=now + 1, slot_seconds=1.0, instances=samples),
        now + 1,
    )
    assert res.accepted == len(samples) and not res.rejected
    topo = cluster.topologies[job.app]
    assert topo.parents == expected
    assert topo.operators[0] == "Source:_src_1" and topo.operators[2] == "GroupAggregate_4"
    assert {op for op, s in topo.stateful.items() if s} == {"GroupAggregate_4"}


def test_counters_stay_monotonic_across_a_failover(fed):
    """Restarting the TaskManager gives every subtask a new attempt whose counters
    start from 0; the edge adds the old totals, so nothing it reports goes back."""
    source = FlinkCounterSource(fed.cluster.rest_url)
    before = source.read().counters
    assert before
    # SIGKILL the TaskManager and start a fresh one: the job fails over.
    fed.cluster.restart_taskmanager(fed.cluster.taskmanager_pids()[0])

    def offsets_applied(reading: CounterReading) -> bool:
        # Counters are back for every subtask, and some went back to 0 meanwhile.
        keys = set(reading.counters)
        return keys == set(before) and any(source.offset(k).received > 0 for k in keys)

    after = wait_for(source.read, offsets_applied, 120, "counters after the failover")
    for key, old in before.items():
        new = after.counters[key]
        assert new.received >= old.received and new.emitted >= old.emitted, key
        assert new.busy_seconds >= old.busy_seconds - 1e-9, key
    agg = InstanceKey(safe_name(JOB), "GroupAggregate_4", 0)
    assert after.counters[agg].received >= before[agg].received
