"""The engine counter edge and what the controller does with it, without a Flink cluster.

The JobManager here is a real HTTP server on loopback (``LoopbackJobManager``)
that answers the REST calls dsched makes from a table of metric values, the way
Flink 2.x shapes them; it can answer 500, answer non-JSON, or be shut down
(a closed port). tests/test_flink_counters.py runs the same edge against a real
Flink cluster.
"""

from __future__ import annotations

import json
import socket
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from prometheus_client import generate_latest

from controller.config import ControllerConfig, EngineConfig
from controller.core import Controller
from controller.ctl import main as ctl_main
from controller.edges.cluster import ObservedCluster
from controller.edges.engines import (
    EngineEdge,
    FlinkCounterSource,
    MonotonicCounters,
    error_class,
)
from controller.edges.metrics import ControllerMetrics
from controller.edges.server import serve
from controller.model import InstanceKey
from controller.placement import get_strategy
from controller.placement.loop import PlacementLoop, PlacementOffer
from controller.placement.migration import MoveResult, plan_from_dict, plan_to_dict
from controller.placement.stage import PlacementDemand, plan_placement
from controller.record import explain_lines
from dsched.config import ConfigError, load_config
from dsched.engines import InstanceCounters
from dsched_pb import dsched_pb2 as pb
from spark_stream.config import HistoryConfig
from tests.test_controller_epoch import SyntheticNode, config

JID = "a" * 32
# vid, Flink's vertex name, parallelism, upstream vids. Like the testbed's job:
# source -> SHA-256 calc -> keyed aggregate -> latency sink.
VERTICES = (
    ("v1", "Source: src[1]", 2, ()),
    ("v2", "Calc[2]", 2, ("v1",)),
    ("v3", "GroupAggregate[4]", 2, ("v2",)),
    ("v4", "lat[5]: Writer", 1, ("v3",)),
)
OPERATORS = {
    "v1": "Source:_src_1",
    "v2": "Calc_2",
    "v3": "GroupAggregate_4",
    "v4": "lat_5_:_Writer",
}
SLOT = ("numRecordsIn", "numRecordsOut", "accumulateBusyTimeMs", "accumulateBackPressuredTimeMs")
QUEUE = "Shuffle.Netty.Input.Buffers.inputQueueLength"
LAT_SUM, LAT_COUNT = "lat[5]__Writer.dschedLatencySumMs", "lat[5]__Writer.dschedLatencyCount"


class LoopbackJobManager:
    """A real HTTP server on 127.0.0.1 that answers like a Flink JobManager's REST API
    (``/jobs/overview``, ``/jobs/<jid>``, ``/jobs/<jid>/plan``, vertex metrics lists
    and ``?get=`` queries) from ``values``; ``mode`` makes it fail: "500" answers
    HTTP 500, "garbage" answers non-JSON. Request lines over 4,096 bytes get 404,
    as Flink's do. Every path asked is appended to ``requests``."""

    def __init__(self, name: str = "wc", vertices=VERTICES, port: int = 0) -> None:
        self.name = name
        self.vertices = vertices
        self.mode = "ok"
        self.state = "RUNNING"
        self.requests: list[tuple[str, dict]] = []
        self.values: dict[tuple[str, str], float] = {}
        self.extra: dict[str, list[str]] = {"v4": [LAT_SUM, LAT_COUNT]}
        for vid, _, parallelism, _ in vertices:
            for i in range(parallelism):
                for m in (*SLOT, QUEUE, *self.extra.get(vid, ())):
                    self.values[vid, f"{i}.{m}"] = 0.0
        self._server = ThreadingHTTPServer(("127.0.0.1", port), self._handler())
        self._server.daemon_threads = True
        # Answers wait while ``hold`` is set (a JobManager that hangs).
        self.hold = threading.Event()
        self.release = threading.Event()
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def stop(self) -> None:
        """Close the port (connections are refused from now on); idempotent."""
        if self._thread.is_alive():
            self._server.shutdown()
            self._server.server_close()
            self._thread.join()

    def add(self, vid: str, index: int, **metrics: float) -> None:
        """Count on: e.g. add("v1", 0, numRecordsIn=100)."""
        for m, v in metrics.items():
            self.values[vid, f"{index}.{m}"] += v

    def set(self, vid: str, index: int, **metrics: float) -> None:
        for m, v in metrics.items():
            self.values[vid, f"{index}.{m}"] = v

    def answer(self, path: str, query: dict) -> object:
        if path == "/jobs/overview":
            return {"jobs": [{"jid": JID, "name": self.name, "state": self.state}]}
        if path == f"/jobs/{JID}":
            vs = [{"id": v, "name": n, "parallelism": p} for v, n, p, _ in self.vertices]
            return {"jid": JID, "name": self.name, "state": "RUNNING", "vertices": vs}
        if path == f"/jobs/{JID}/plan":
            nodes = [{"id": v, "inputs": [{"id": u} for u in up]} for v, _, _, up in self.vertices]
            return {"plan": {"jid": JID, "nodes": nodes}}
        parts = path.split("/")
        if len(parts) == 6 and parts[3] == "vertices" and parts[5] == "metrics":
            vid = parts[4]
            if "get" not in query:
                return [{"id": mid} for (v, mid) in self.values if v == vid]
            wanted = query["get"][0].split(",")
            return [
                {"id": mid, "value": str(self.values[vid, mid])}
                for mid in wanted
                if (vid, mid) in self.values
            ]
        return None

    def _handler(self):
        jm = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                url = urllib.parse.urlsplit(self.path)
                query = urllib.parse.parse_qs(url.query)
                jm.requests.append((url.path, query))
                if jm.hold.is_set():
                    jm.release.wait(60)
                if len(self.requestline) > 4096:
                    return self._send(404, b'{"errors":["Unable to load requested file"]}')
                if jm.mode == "500":
                    return self._send(500, b'{"errors":["Internal server error."]}')
                if jm.mode == "garbage":
                    return self._send(200, b"<html>not the REST API</html>")
                body = jm.answer(url.path, query)
                if body is None:
                    return self._send(404, b'{"errors":["Not found."]}')
                return self._send(200, json.dumps(body).encode())

            def _send(self, code: int, body: bytes) -> None:
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        return Handler


@pytest.fixture
def jm():
    server = LoopbackJobManager()
    yield server
    server.stop()


def closed_port_url() -> str:
    """A loopback port nothing listens on: connections are refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def metric(registry, name: str, **labels) -> float | None:
    return registry.get_sample_value(name, labels)


def edge_for(url: str, metrics: ControllerMetrics | None = None, **kw) -> EngineEdge:
    observe = metrics.observe_engine_read if metrics is not None else None
    return EngineEdge([(FlinkCounterSource(url, **kw), 1.0)], observe)


def flink_sample(op: str, i: int, cpu: float = 0.0, **kw) -> pb.InstanceSample:
    """What an agent reports for a Flink subtask: CPU, stateful, upstream; no counters."""
    vid = next(v for v, o in OPERATORS.items() if o == op)
    up = next(u for v, _, _, u in VERTICES if v == vid)
    return pb.InstanceSample(
        key=pb.InstanceKey(app="wc", operator=op, instance=i),
        worker="tm-n1",
        stateful=op == "GroupAggregate_4",
        upstream=[OPERATORS[u] for u in up],
        cpu_seconds_total=cpu,
        engine="flink",
        **kw,
    )


def report(node: str, slot: int, ts: float, samples) -> pb.NodeReport:
    return pb.NodeReport(
        node_id=node, slot=slot, timestamp=ts, slot_seconds=1.0, instances=list(samples)
    )


NOW = 1_700_000_000.0


# -- reading ------------------------------------------------------------------------


def test_a_read_returns_every_subtask_with_one_metrics_call_per_vertex(jm):
    jm.set("v1", 0, numRecordsIn=100, numRecordsOut=100, accumulateBusyTimeMs=250)
    jm.set("v3", 1, numRecordsIn=40, numRecordsOut=70, **{QUEUE: 3})
    jm.set("v4", 0, numRecordsIn=70, **{LAT_SUM: 1400.0, LAT_COUNT: 70})
    source = FlinkCounterSource(jm.url)
    first = source.read()
    assert first.error is None and first.missing == {}
    assert set(first.counters) == {
        InstanceKey("wc", OPERATORS[v], i) for v, _, p, _ in VERTICES for i in range(p)
    }
    assert first.counters[InstanceKey("wc", "Source:_src_1", 0)] == InstanceCounters(
        received=100, emitted=100, busy_seconds=0.25
    )
    agg = first.counters[InstanceKey("wc", "GroupAggregate_4", 1)]
    assert (agg.received, agg.emitted, agg.queue_length) == (40, 70, 3)
    sink = first.counters[InstanceKey("wc", "lat_5_:_Writer", 0)]
    assert (sink.latency_sum_seconds, sink.latency_count) == (1.4, 70)
    # The topology and the latency metric ids are asked once per job id.
    jm.requests.clear()
    source.read()
    paths = [p for p, _ in jm.requests]
    assert paths[0] == "/jobs/overview"
    assert sorted(paths[1:]) == sorted(f"/jobs/{JID}/vertices/{v}/metrics" for v, *_ in VERTICES)
    assert all("get" in q for _, q in jm.requests[1:])
    # Only the vertex that has latency counters is asked for them.
    for (path, query), (vid, *_) in zip(jm.requests[1:], VERTICES, strict=True):
        assert ("dschedLatencySumMs" in query["get"][0]) == (vid == "v4"), path


def test_a_wide_vertex_is_read_in_as_few_calls_as_the_request_line_allows():
    wide = (("v1", "Source: src[1]", 60, ()),)
    jm = LoopbackJobManager(vertices=wide)
    try:
        for i in range(60):
            jm.set("v1", i, numRecordsIn=i, numRecordsOut=i)
        jm.requests.clear()
        reading = FlinkCounterSource(jm.url).read()
        assert reading.error is None and not reading.missing
        assert len(reading.counters) == 60
        assert reading.counters[InstanceKey("wc", "Source:_src_1", 59)].received == 59
        gets = [q for p, q in jm.requests if p.endswith("/metrics") and "get" in q]
        # 60 subtasks x 5 metrics do not fit one 4-kB request line; 3 calls do.
        assert 2 <= len(gets) <= 3
    finally:
        jm.stop()


def test_a_closed_port_is_unreachable_and_counters_are_missing_not_zero(jm):
    metrics = ControllerMetrics(lambda: None)
    url = closed_port_url()
    edge = edge_for(url, metrics)
    edge.poll()
    reading = edge.latest("flink")
    assert reading.counters == {} and reading.error.startswith("GET /jobs/overview: ")
    assert "refused" in reading.error.lower()
    assert error_class(reading.error) == "unreachable"
    found = edge.counters("flink", InstanceKey("wc", "Calc_2", 0))
    assert found.counters is None and "refused" in found.reason.lower()
    r = metrics.registry
    assert metric(r, "dsched_engine_read_errors_total", engine="flink", reason="unreachable") == 1
    assert metric(r, "dsched_engine_up", engine="flink") == 0
    assert metric(r, "dsched_engine_read_seconds_count", engine="flink") == 1
    (state,) = edge.status()
    assert not state.healthy and state.endpoint == url and "refused" in state.reason.lower()
    # A JobManager that was answering and goes away: its known jobs are missing.
    edge = edge_for(jm.url)
    edge.poll()
    assert edge.latest("flink").counters
    jm.stop()
    edge.poll()
    reading = edge.latest("flink")
    assert reading.counters == {} and set(reading.missing) == {"wc"}


@pytest.mark.parametrize(
    ("mode", "kind", "text"), [("500", "http_error", "HTTP 500"), ("garbage", "bad_answer", "JSON")]
)
def test_http_errors_and_non_json_answers_are_read_errors_with_a_class(jm, mode, kind, text):
    metrics = ControllerMetrics(lambda: None)
    edge = edge_for(jm.url, metrics)
    edge.poll()
    assert edge.latest("flink").counters
    jm.mode = mode
    edge.poll()
    reading = edge.latest("flink")
    assert reading.counters == {} and text in reading.error
    assert reading.missing == {"wc": reading.error}
    assert error_class(reading.error) == kind
    r = metrics.registry
    assert metric(r, "dsched_engine_read_errors_total", engine="flink", reason=kind) == 1
    assert metric(r, "dsched_engine_up", engine="flink") == 0
    jm.mode = "ok"
    edge.poll()
    assert metric(r, "dsched_engine_up", engine="flink") == 1
    assert edge.status()[0].healthy and edge.status()[0].jobs == 1


def test_counters_stay_monotonic_across_a_new_attempt(jm):
    source = FlinkCounterSource(jm.url)
    key = InstanceKey("wc", "Calc_2", 0)
    jm.set("v2", 0, numRecordsIn=1000, numRecordsOut=900, accumulateBusyTimeMs=4000)
    assert source.read().counters[key].received == 1000
    # Failover: the subtask's new attempt counts from 0 again.
    jm.set("v2", 0, numRecordsIn=30, numRecordsOut=20, accumulateBusyTimeMs=100)
    after = source.read().counters[key]
    assert (after.received, after.emitted) == (1030, 920)
    assert after.busy_seconds == pytest.approx(4.1)
    jm.add("v2", 0, numRecordsIn=10)
    assert source.read().counters[key].received == 1040
    # While the job restarts it is missing (not a read error) and keeps its offsets.
    jm.state = "RESTARTING"
    restarting = source.read()
    assert restarting.counters == {} and restarting.missing == {"wc": "job wc is RESTARTING"}
    assert error_class(restarting.missing["wc"]) is None
    jm.state = "RUNNING"
    jm.set("v2", 0, numRecordsIn=5)
    assert source.read().counters[key].received == 1045
    # A job gone for good (cancelled) takes its offsets with it.
    jm.state = "CANCELED"
    assert source.read().counters == {} and source.read().missing == {}
    jm.state = "RUNNING"
    assert source.read().counters[key].received == 5
    # Counters that never went back are left alone; gauges are never offset.
    mono = MonotonicCounters()
    k = InstanceKey("a", "b", 0)
    mono.apply(k, InstanceCounters(received=10, emitted=5, queue_length=9))
    out = mono.apply(k, InstanceCounters(received=3, emitted=6, queue_length=2))
    assert (out.received, out.emitted, out.queue_length) == (13, 6, 2)


def test_two_running_jobs_with_one_name_are_missing_not_mixed(jm):
    source = FlinkCounterSource(jm.url)
    real = jm.answer

    def twice(path, query):
        if path == "/jobs/overview":
            return {"jobs": [{"jid": JID, "name": "wc", "state": "RUNNING"}] * 2}
        return real(path, query)

    jm.answer = twice
    reading = source.read()
    assert reading.counters == {} and "2 running jobs" in reading.missing["wc"]
    assert error_class(reading.missing["wc"]) is None  # not a read error


def test_samples_name_the_kind_and_any_engine_of_that_kind_answers(jm):
    other = LoopbackJobManager(name="wd")
    try:
        other.set("v2", 1, numRecordsIn=7, numRecordsOut=7)
        edge = EngineEdge(
            [
                (FlinkCounterSource(jm.url, name="flink"), 1.0),
                (FlinkCounterSource(other.url, name="flink-b"), 1.0),
            ]
        )
        edge.poll()
        found = edge.counters("flink", InstanceKey("wd", "Calc_2", 1))
        assert found.counters is not None and found.counters.received == 7
        assert edge.counters("flink-b", InstanceKey("wd", "Calc_2", 1)).counters is not None
        missing = edge.counters("flink", InstanceKey("nobody", "Calc_2", 0))
        assert missing.counters is None and missing.reason.startswith("flink: no counters")
        assert "flink-b: no counters" in missing.reason
        assert (
            "no [[engine]] of kind 'storm'"
            in edge.counters("storm", InstanceKey("a", "b", 0)).reason
        )
    finally:
        other.stop()


# -- ingest -------------------------------------------------------------------------


def observed(edge: EngineEdge) -> ObservedCluster:
    cluster = ObservedCluster(depth=5, engines=edge)
    cluster.agent_connected(
        pb.Hello(node_id="n1", cpu_capacity_cores=2.0, slot_seconds=1.0), now=NOW
    )
    return cluster


def test_engine_counters_are_merged_into_the_agents_samples(jm):
    edge = edge_for(jm.url)
    cluster = observed(edge)
    ops = [(OPERATORS[v], i) for v, _, p, _ in VERTICES for i in range(p)]
    edge.poll()
    cluster.ingest(report("n1", 1, NOW, [flink_sample(op, i) for op, i in ops]), now=NOW)
    jm.add("v3", 0, numRecordsIn=500, numRecordsOut=800, accumulateBusyTimeMs=300)
    jm.set("v3", 0, **{QUEUE: 4})
    jm.add("v4", 0, numRecordsIn=800, **{LAT_SUM: 16000.0, LAT_COUNT: 800})
    edge.poll()
    res = cluster.ingest(
        report("n1", 2, NOW + 1, [flink_sample(op, i, cpu=0.5) for op, i in ops]), now=NOW + 1
    )
    assert res.accepted == len(ops) and not res.rejected and res.unmeasured == 0
    (agg,) = cluster.histories[InstanceKey("wc", "GroupAggregate_4", 0)].slots
    assert (agg.arrivals, agg.executed, agg.emitted, agg.queue_length) == (500, 500, 800, 4)
    assert agg.service_seconds == pytest.approx(0.3) and agg.cpu_seconds == 0.5
    assert agg.stateful and agg.engine == "flink"
    (sink,) = cluster.histories[InstanceKey("wc", "lat_5_:_Writer", 0)].slots
    assert sink.latency_count == 800 and sink.latency_sum_seconds == pytest.approx(16.0)
    # The DAG and the stateful flags come from the agents' samples.
    topo = cluster.topologies["wc"]
    assert topo.operators == [OPERATORS[v] for v, *_ in VERTICES]
    assert topo.parents["GroupAggregate_4"] == ("Calc_2",)
    assert {op for op, s in topo.stateful.items() if s} == {"GroupAggregate_4"}


def test_missing_and_stale_readings_make_instances_unmeasured_not_idle(jm):
    edge = edge_for(jm.url)
    cluster = observed(edge)
    key = InstanceKey("wc", "Calc_2", 0)
    edge.poll()
    cluster.ingest(report("n1", 1, NOW, [flink_sample("Calc_2", 0)]), now=NOW)
    jm.add("v2", 0, numRecordsIn=100, numRecordsOut=100)
    edge.poll()
    cluster.ingest(report("n1", 2, NOW + 1, [flink_sample("Calc_2", 0, cpu=0.1)]), now=NOW + 1)
    assert len(cluster.histories[key].slots) == 1 and key not in cluster.unmeasured
    # No read since the last slot: the same counters would look like an idle slot.
    jm.add("v2", 0, numRecordsIn=100, numRecordsOut=100)
    res = cluster.ingest(
        report("n1", 3, NOW + 2, [flink_sample("Calc_2", 0, cpu=0.2, cap_cores=0.4)]), now=NOW + 2
    )
    assert res.unmeasured == 1 and res.accepted == 0
    assert len(cluster.histories[key].slots) == 1  # no zero slot
    held = cluster.unmeasured[key]
    assert held.reason == "flink counters unavailable: no new reading since the last slot"
    assert held.cap_cores == 0.4 and held.node == "n1"
    assert cluster.histories[key].last_seen == NOW + 2  # alive, only unmeasured
    # The engine fails: unmeasured with its reason.
    jm.mode = "500"
    edge.poll()
    cluster.ingest(report("n1", 4, NOW + 3, [flink_sample("Calc_2", 0, cpu=0.3)]), now=NOW + 3)
    assert cluster.unmeasured[key].reason == (
        "flink counters unavailable: GET /jobs/overview: HTTP 500"
    )
    # Counters again: measured, and the slot spans the gap (rate over 3 s).
    jm.mode = "ok"
    edge.poll()
    cluster.ingest(report("n1", 5, NOW + 4, [flink_sample("Calc_2", 0, cpu=0.4)]), now=NOW + 4)
    assert key not in cluster.unmeasured
    last = cluster.histories[key].slots[-1]
    assert (last.arrivals, last.seconds) == (100, 3.0)
    assert last.cpu_seconds == pytest.approx(0.3)
    # Without any [[engine]], engine samples are unmeasured with that reason.
    bare = ObservedCluster(depth=5)
    bare.agent_connected(pb.Hello(node_id="n1", cpu_capacity_cores=2.0), now=NOW)
    bare.ingest(report("n1", 1, NOW, [flink_sample("Calc_2", 0)]), now=NOW)
    assert "no [[engine]] is configured" in bare.unmeasured[key].reason


def test_unmeasured_instances_are_forgotten_when_they_stop_reporting():
    cluster = ObservedCluster(depth=5, forget_after_seconds=5.0)
    cluster.agent_connected(pb.Hello(node_id="n1", cpu_capacity_cores=2.0), now=NOW)
    cluster.ingest(report("n1", 1, NOW, [flink_sample("Calc_2", 0)]), now=NOW)
    assert cluster.unmeasured and "wc" in cluster.topologies
    cluster.forget_vanished(NOW + 10)
    assert not cluster.unmeasured and "wc" not in cluster.topologies


# -- the epoch ------------------------------------------------------------------------


class FlinkJobOnNode:
    """The testbed job's subtasks on one node as its agent reports them (CPU only, with
    ``engine = "flink"``), their counters served by a LoopbackJobManager. ``step``
    processes one second of input at ``rate`` records/s and polls the edge first,
    as the edge's thread would between two reports."""

    # CPU-seconds per record of each vertex.
    KAPPA = {"v1": 0.0002, "v2": 0.002, "v3": 0.0005, "v4": 0.0001}

    def __init__(self, controller: Controller, jm: LoopbackJobManager, node: str = "n1"):
        self.c, self.jm, self.node, self.slot = controller, jm, node, 0
        self.cpu: dict[tuple[str, int], float] = {}

    def step(self, now: float, rate: float, poll: bool = True) -> None:
        samples = []
        for vid, _, parallelism, _ in VERTICES:
            per = rate / parallelism
            for i in range(parallelism):
                self.jm.add(vid, i, numRecordsIn=per, numRecordsOut=per)
                self.jm.add(vid, i, accumulateBusyTimeMs=1000 * per * self.KAPPA[vid])
                cpu = self.cpu[vid, i] = self.cpu.get((vid, i), 0.0) + per * self.KAPPA[vid]
                samples.append(flink_sample(OPERATORS[vid], i, cpu=cpu))
            if vid == "v4":
                self.jm.add(vid, 0, **{LAT_SUM: 20.0 * rate, LAT_COUNT: rate})
        if poll:
            self.c.engines.poll()
        self.slot += 1
        self.c.on_report(report(self.node, self.slot, now, samples))


def engine_config(tmp_path, url: str, **kw) -> ControllerConfig:
    return config(
        tmp_path, engine=[EngineConfig(kind="flink", rest_url=url, poll_seconds=1.0)], **kw
    )


@pytest.fixture
def clock():
    return [3_000_000.0]


def test_the_epoch_holds_the_cap_of_an_unmeasured_instance(tmp_path, clock, jm):
    c = Controller(
        engine_config(tmp_path, jm.url, mode="enforce", node_capacity_cores={"n1": 1.5}),
        clock=lambda: clock[0],
    )
    sent: list[pb.ControllerMessage] = []
    c.sessions.attach("n1", sent.append)
    # A registered WordCount shares n1 with the Flink job (its agent's reports
    # come half a second apart, one per kind of instance).
    wc = SyntheticNode(c, "n1", cores=2.0)
    flink = FlinkJobOnNode(c, jm)
    for _ in range(6):
        clock[0] += 1.0
        wc.report(clock[0], {"wc-registered": 100})
        flink.step(clock[0] + 0.5, 200)
        rec = c.run_epoch()
    calc = InstanceKey("wc", "Calc_2", 0)
    assert calc in c.memory.caps and not rec["held"]
    assert {r["operator"] for r in rec["instances"] if r["app"] == "wc"} == set(OPERATORS.values())
    flink_caps = {k: v for k, v in c.memory.caps.items() if k.app == "wc"}
    # The JobManager goes away. The registered app's load triples: n1 is short,
    # and the registered instances are cut, but the held caps stay as they were.
    jm.stop()
    for _ in range(c.config.forget_after_slots + 2):
        clock[0] += 1.0
        wc.report(clock[0], {"wc-registered": 900})
        flink.step(clock[0] + 0.5, 800)
        rec = c.run_epoch()
        assert {k: v for k, v in c.memory.caps.items() if k.app == "wc"} == flink_caps
    reason = rec["held"][0]["reason"]
    assert reason.startswith("flink counters unavailable: GET /jobs/overview: ")
    assert "refused" in reason.lower()
    assert len(rec["held"]) == len(flink_caps)
    assert all(r["hysteresis"] == "held" for r in rec["held"])
    assert {(r["operator"], r["instance"]): r["cap_cores"] for r in rec["held"]} == {
        (k.operator, k.instance): cap for k, (_, cap) in flink_caps.items()
    }
    assert rec["cuts"] and all(cut["app"] == "wc-registered" for cut in rec["cuts"])
    assert not any(r["app"] == "wc" for r in rec["instances"])
    assert any(n.startswith(f"held {len(flink_caps)} instance(s)") for n in rec["notes"])
    # The node's caps still fit: the measured instances share what the held leave.
    total = sum(r["cap_cores"] for r in rec["instances"]) + sum(r["cap_cores"] for r in rec["held"])
    assert total <= rec["usable_cores"]["n1"] + 1e-6
    # The directive still carries the held caps: the agent keeps them.
    last = {
        (e.key.app, e.key.operator, e.key.instance): e.cap_cores for e in sent[-1].directive.caps
    }
    assert all(last[k] == cap for k, (_, cap) in flink_caps.items())
    # `dschedctl explain` and the status say why.
    lines = explain_lines("wc", c.store.decisions(1))
    assert any(line.startswith(f"  held: {reason} (") for line in lines), lines
    (engine,) = c.status().engines
    assert (engine.name, engine.kind, engine.endpoint) == ("flink", "flink", jm.url)
    assert not engine.healthy and "refused" in engine.reason.lower()
    assert engine.last_read_age_seconds >= 0
    text = generate_latest(c.metrics.registry).decode()
    assert f'dsched_engine_instances_held{{engine="flink"}} {float(len(flink_caps))}' in text
    assert 'dsched_engine_up{engine="flink"} 0.0' in text
    c.stop()


def test_a_cap_is_held_when_readings_do_not_advance_and_moves_again_after(tmp_path, clock, jm):
    c = Controller(engine_config(tmp_path, jm.url), clock=lambda: clock[0])
    c.on_hello(pb.Hello(node_id="n1", cpu_capacity_cores=2.0, slot_seconds=1.0))
    flink = FlinkJobOnNode(c, jm)
    for _ in range(6):
        clock[0] += 1.0
        flink.step(clock[0], 300)
        c.run_epoch()
    calc = InstanceKey("wc", "Calc_2", 0)
    before = c.memory.caps[calc]
    # The edge's thread is late: two reports see one reading. The load fell to 0,
    # but a repeated reading must not read as idle: held, not lowered.
    clock[0] += 1.0
    flink.step(clock[0], 0, poll=False)
    rec = c.run_epoch()
    assert c.memory.caps[calc] == before
    row = next(r for r in rec["held"] if r["operator"] == "Calc_2" and r["instance"] == 0)
    assert row["reason"] == "flink counters unavailable: no new reading since the last slot"
    # Readings again: the cap follows the (now low) load.
    for _ in range(4):
        clock[0] += 1.0
        flink.step(clock[0], 0)
        rec = c.run_epoch()
    assert not rec["held"] and c.memory.caps[calc][1] < before[1]
    c.stop()


def test_status_over_grpc_and_dschedctl_show_the_engines(tmp_path, clock, jm, capsys):
    c = Controller(engine_config(tmp_path, jm.url), clock=lambda: clock[0])
    c.engines.poll()
    server = serve(c, "127.0.0.1:0", f"unix:{tmp_path}/admin.sock")
    try:
        address = server.admin_address
        assert ctl_main(["--address", address, "status"]) == 0
        out = capsys.readouterr().out
        assert f"engine flink (flink at {jm.url}): healthy, 1 job(s), 7 instance(s)" in out
        jm.mode = "500"
        c.engines.poll()
        assert ctl_main(["--address", address, "--json", "status"]) == 0
        (engine,) = json.loads(capsys.readouterr().out)["engines"]
        assert engine["name"] == "flink" and "HTTP 500" in engine["reason"]
        assert not engine.get("healthy", False)
    finally:
        server.stop(0)
        c.stop()


def test_a_hanging_jobmanager_blocks_neither_ingest_nor_the_epoch(tmp_path, clock, jm):
    hanging = EngineConfig(kind="flink", rest_url=jm.url, poll_seconds=1.0, rest_timeout_seconds=60)
    c = Controller(
        config(tmp_path, engine=[hanging], history=HistoryConfig(enabled=False)),
        clock=lambda: clock[0],
    )
    c.on_hello(pb.Hello(node_id="n1", cpu_capacity_cores=2.0, slot_seconds=1.0))
    flink = FlinkJobOnNode(c, jm)
    jm.hold.set()
    c.start(serve_metrics=False)  # the edge's thread is now stuck in its first read
    try:
        done = threading.Event()

        def epochs() -> None:
            for _ in range(3):
                clock[0] += 1.0
                flink.step(clock[0], 100, poll=False)
                c.run_epoch()
            done.set()

        worker = threading.Thread(target=epochs, daemon=True)
        worker.start()
        assert done.wait(30), "ingest or the epoch waited on the JobManager"
        assert c.engines.latest("flink") is None
        assert "not read yet" in next(iter(c.cluster.unmeasured.values())).reason
        assert c.status().engines[0].reason == "not read yet"
        # The JobManager answers again: the edge's thread reads on its own.
        jm.hold.clear()
        jm.release.set()
        pause = threading.Event()
        for _ in range(600):
            if c.engines.latest("flink") is not None:
                break
            pause.wait(0.05)
        assert c.engines.latest("flink").counters
    finally:
        jm.hold.clear()
        jm.release.set()
        c.stop()


# -- placement ------------------------------------------------------------------------


class RecordingMover:
    """A move actuator that records what it was asked to move and says it was done."""

    name = "testbed"

    def __init__(self) -> None:
        self.plans = []

    def execute(self, plan):
        self.plans.append(plan)
        return MoveResult(self.name, True, moved=[m.instance for m in plan.moves])


def test_placement_recommends_moves_of_engine_instances_and_never_executes_them():
    # n1 is over capacity with a pinned (Flink) instance and a registered one.
    demands = {
        InstanceKey("fl", "Calc_2", 0): PlacementDemand("n1", 0.6),
        InstanceKey("fl", "Calc_2", 1): PlacementDemand("n1", 0.6),
        InstanceKey("wc", "split", 0): PlacementDemand("n1", 0.3),
    }
    current = {
        "fl/Calc_2/0": ("tm-n1", False),
        "fl/Calc_2/1": ("tm-n1", False),
        "wc/split/0": ("wc-stateless-n1", False),
    }
    pinned = {
        "fl/Calc_2/0": "flink places subtasks itself",
        "fl/Calc_2/1": "flink places subtasks itself",
    }
    capacity = {"n1": 1.0, "n2": 2.0}
    free = plan_placement(demands, capacity, current, "liu")
    assert free is not None and {m.instance for m in free.moves} & set(pinned)
    plan = plan_placement(demands, capacity, current, "liu", pinned=pinned)
    assert plan is not None
    assert not {m.instance for m in plan.moves} & set(pinned)
    assert plan.recommended and {r.move.instance for r in plan.recommended} <= set(pinned)
    assert all(r.reason == "flink places subtasks itself" for r in plan.recommended)
    assert any("only recommended: flink places subtasks itself" in r for r in plan.reasons)
    for iid in pinned:
        assert plan.assignment[iid] == ("tm-n1", "n1")
    assert "tm-n1" not in plan.affected_workers
    # Recommendations survive the plan's JSON form.
    assert (
        plan_from_dict(json.loads(json.dumps(plan_to_dict(plan)))).recommended == plan.recommended
    )
    # Through the placement loop in enforce mode: the mover never sees a pinned move.
    mover = RecordingMover()
    loop = PlacementLoop(get_strategy("liu"), mover, 0.0, 3)
    try:
        offer = PlacementOffer(1, "enforce", demands, capacity, current, {}, pinned)
        loop.offer(1, dict, lambda: offer)
        assert loop.wait(30)
        summary = loop.offer(2, lambda: {i: "n1" for i in current}, lambda: offer)
        assert summary["planned"] is True
        assert {r["instance"] for r in summary["recommended"]} <= set(pinned)
        assert all(r["reason"] == "flink places subtasks itself" for r in summary["recommended"])
        assert all(m.instance not in pinned for p in mover.plans for m in p.moves)
    finally:
        loop.stop()


def test_a_flink_only_overload_gives_recommendations_and_no_move(tmp_path, clock, jm):
    c = Controller(
        engine_config(
            tmp_path,
            jm.url,
            mode="enforce",
            node_capacity_cores={"n1": 0.6, "n2": 2.0},
        ),
        clock=lambda: clock[0],
    )
    mover = c.placement.mover = RecordingMover()
    c.on_hello(pb.Hello(node_id="n1", cpu_capacity_cores=2.0, slot_seconds=1.0))
    c.on_hello(pb.Hello(node_id="n2", cpu_capacity_cores=2.0, slot_seconds=1.0))
    flink = FlinkJobOnNode(c, jm)
    recommended = []
    for slot in range(10):
        clock[0] += 1.0
        flink.step(clock[0], 400)
        c.on_report(report("n2", slot + 1, clock[0], []))
        rec = c.run_epoch()
        assert c.wait_placement(timeout=30)
        recommended += rec["placement"].get("recommended", [])
    assert recommended, "n1 never overloaded"
    assert all(r["reason"] == "flink places subtasks itself" for r in recommended)
    assert all(r["from_node"] == "n1" for r in recommended)
    assert mover.plans == []  # nothing was given to the move actuator
    c.stop()


# -- config --------------------------------------------------------------------------


def test_engine_tables_load_from_toml_with_defaults(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(
        f'state_dir = "{tmp_path}"\n'
        '[[engine]]\nkind = "flink"\nrest_url = "http://jm.example:8081"\n'
        'stateful_operators = ["Calc[2]"]\n'
        '[[engine]]\nname = "flink-b"\nkind = "flink"\nrest_url = "https://10.0.0.2:8081/"\n'
        "poll_seconds = 2.5\nrest_timeout_seconds = 0.5\n"
    )
    cfg = load_config(ControllerConfig, path)
    a, b = cfg.engine
    assert (a.engine_name, a.poll_seconds, a.latency_sum_metric) == (
        "flink",
        0.0,
        "dschedLatencySumMs",
    )
    assert (b.engine_name, b.poll_seconds, b.rest_timeout_seconds) == ("flink-b", 2.5, 0.5)
    edge = EngineEdge.from_config(cfg.engine, slot_seconds=10.0)
    assert edge.names == ["flink", "flink-b"]
    assert edge.poll_seconds("flink") == 10.0  # 0: the slot
    assert edge.poll_seconds("flink-b") == 2.5
    assert edge.source("flink").stateful_overrides == {"Calc[2]": True}


@pytest.mark.parametrize(
    ("table", "key", "words"),
    [
        ('kind = "storm"\nrest_url = "http://h:1"', "engine[0].kind", ["storm", "flink"]),
        ('rest_url = "http://h:1"', "engine[0].kind", ["required", "flink"]),
        ('kind = "flink"', "engine[0].rest_url", ["required"]),
        ('kind = "flink"\nrest_url = "http://h"', "engine[0].rest_url", ["host:port"]),
        ('kind = "flink"\nrest_url = "ftp://h:21"', "engine[0].rest_url", ["host:port"]),
        ('kind = "flink"\nrest_url = "http://h:8081/jm"', "engine[0].rest_url", ["host:port"]),
        ('kind = "flink"\nrest_url = "http://h:99999"', "engine[0].rest_url", ["host:port"]),
        (
            'kind = "flink"\nrest_url = "http://h:1"\npoll_seconds = -1',
            "engine[0].poll_seconds",
            [],
        ),
        (
            'kind = "flink"\nrest_url = "http://h:1"\nrest_timeout_seconds = 0',
            "engine[0].rest_timeout_seconds",
            [],
        ),
        ('kind = "flink"\nrest_url = "http://h:1"\nname = "a/b"', "engine[0].name", []),
        (
            'kind = "flink"\nrest_url = "http://h:1"\nstateful_operators = ["x"]\n'
            'stateless_operators = ["x"]',
            "engine[0].stateless_operators",
            ["x"],
        ),
        ('kind = "flink"\nrest_url = "http://h:1"\nport = 1', "engine[0].port", ["unknown"]),
    ],
)
def test_engine_config_errors_name_the_key(tmp_path, table, key, words):
    path = tmp_path / "c.toml"
    path.write_text(f"[[engine]]\n{table}\n")
    with pytest.raises(ConfigError) as err:
        load_config(ControllerConfig, path)
    assert err.value.key == key, str(err.value)
    for word in words:
        assert word in str(err.value)


def test_two_engines_may_not_share_a_name(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(
        '[[engine]]\nkind = "flink"\nrest_url = "http://a:1"\n'
        '[[engine]]\nkind = "flink"\nrest_url = "http://b:1"\n'
    )
    with pytest.raises(ConfigError) as err:
        load_config(ControllerConfig, path)
    assert err.value.key == "engine[1].name" and "flink" in str(err.value)
