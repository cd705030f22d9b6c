"""What the wire-scale round leans on in the core and the server: the epoch's wait
for Acks, Status rows copied from templates, the plan's reply encoded once, and
the instance generation that tells Status when to count again."""

from __future__ import annotations

import threading

from controller.config import ControllerConfig
from controller.core import AckWait, Controller
from controller.edges.server import _EncodeOnce
from controller.model import InstanceKey
from controller.qos import QosClass, QosConfig
from dsched_pb import dsched_pb2 as pb
from spark_stream.config import HistoryConfig

NOW = 1_700_000_000.0


# ------------------------------------------------------------ AckWait
def test_the_wait_ends_once_every_reached_node_acknowledged_this_epoch():
    acks = AckWait()
    acks.enabled = True
    acks.expect(7, ["a", "b", "c"])
    acks.only({"a": 3, "b": 2})  # c had no stream: it will not answer
    assert not acks.wait(0)
    acks.acked("a", 7)
    acks.acked("b", 6)  # an Ack of an older directive counts for nothing
    acks.acked("x", 7)  # nor one from a node not waited for
    assert not acks.wait(0)
    acks.acked("b", 7)
    assert acks.wait(0)


def test_a_stream_that_ends_is_not_waited_for():
    acks = AckWait()
    acks.enabled = True
    acks.expect(1, ["a", "b"])
    acks.acked("a", 1)
    acks.gone("b")
    assert acks.wait(0)


def test_an_ack_on_another_thread_wakes_the_waiting_epoch():
    acks = AckWait()
    acks.enabled = True
    acks.expect(3, ["a"])
    done = threading.Event()

    def epoch() -> None:
        assert acks.wait(60)
        done.set()

    t = threading.Thread(target=epoch)
    t.start()
    acks.acked("a", 3)
    t.join(60)
    assert done.is_set()


def test_without_a_transport_that_reports_acks_nothing_is_waited_for():
    acks = AckWait()  # not enabled: the in-process transports, tests
    acks.expect(1, ["a", "b"])
    assert acks.wait(0)


# ------------------------------------------------------------ Status
def config(tmp_path) -> ControllerConfig:
    cfg = ControllerConfig(
        state_dir=tmp_path / "state",
        slot_seconds=1.0,
        theta_cores=0.05,
        predictors=["linear_trend", "dag"],
        placement="none",
        history=HistoryConfig(enabled=False),
        qos=QosConfig(
            default_class="bronze", classes={"bronze": QosClass("bronze", 2000.0, 0.5, 1.0)}
        ),
    )
    cfg.validate()
    return cfg


def hello(node: str, cores: float = 2.0, **kw) -> pb.Hello:
    return pb.Hello(
        node_id=node, cpu_capacity_cores=cores, cgroup_mode=pb.CGROUP_V1, slot_seconds=1.0, **kw
    )


def report(node: str, ts: float, instances: list[int], slot: int = 1) -> pb.NodeReport:
    return pb.NodeReport(
        node_id=node,
        slot=slot,
        timestamp=ts,
        slot_seconds=1.0,
        instances=[
            pb.InstanceSample(
                key=pb.InstanceKey(app="wc", operator="split", instance=i),
                worker="w",
                received_total=int(ts - NOW) * 10,
                executed_total=int(ts - NOW) * 10,
                cpu_seconds_total=ts - NOW,
                upstream=["source"],
            )
            for i in instances
        ],
    )


def rows_made_field_by_field(c: Controller, now: float) -> list[pb.AgentStatus]:
    """Status's agent rows as they were made before the templates."""
    per_node: dict[str, int] = {}
    for h in c.cluster.histories.values():
        per_node[h.node] = per_node.get(h.node, 0) + 1
    return [
        pb.AgentStatus(
            node_id=a.node_id,
            cpu_capacity_cores=a.cpu_capacity_cores,
            cgroup_mode=a.cgroup_mode,
            instances=per_node.get(a.node_id, 0),
            last_report_age_seconds=(now - a.last_report_at) if a.last_report_at else -1,
            counters_available=list(a.counters_available),
            dry_run=a.dry_run,
        )
        for a in sorted(c.cluster.agents.values(), key=lambda a: a.node_id)
        if a.connected
    ]


def test_status_rows_equal_rows_made_field_by_field(tmp_path):
    clock = [NOW]
    c = Controller(config(tmp_path), clock=lambda: clock[0])
    try:
        c.on_hello(hello("n2", counters_available=["cpu", "queue"]))
        c.on_hello(hello("n1", dry_run=True))
        c.on_hello(hello("n3", cores=4.0))
        for ts in (NOW + 1, NOW + 2):
            clock[0] = ts
            c.on_report(report("n1", ts, [0, 1], slot=int(ts - NOW)))
            c.on_report(report("n2", ts, [2], slot=int(ts - NOW)))
        clock[0] = NOW + 2.5
        first = c.status()
        assert list(first.agents) == rows_made_field_by_field(c, NOW + 2.5)
        # A node that leaves, one that comes back with another Hello, an
        # instance that moves: the rows follow, and the earlier reply is untouched.
        c.on_disconnect("n3")
        c.on_hello(hello("n2", cores=3.0))
        c.on_disconnect("n1")
        clock[0] = NOW + 4
        c.on_report(report("n2", NOW + 4, [0, 1, 2], slot=3))
        again = c.status()
        assert list(again.agents) == rows_made_field_by_field(c, NOW + 4)
        assert [a.node_id for a in again.agents] == ["n2"]
        assert again.agents[0].instances == 3
        assert [(a.node_id, a.instances) for a in first.agents] == [("n1", 2), ("n2", 1), ("n3", 0)]
    finally:
        c.stop()


def test_the_generation_changes_when_instances_come_go_or_move_only():
    from controller.edges.cluster import ObservedCluster

    cluster = ObservedCluster(depth=5, forget_after_seconds=100.0)
    cluster.agent_connected(hello("n1"), now=NOW)
    cluster.agent_connected(hello("n2"), now=NOW)
    cluster.ingest(report("n1", NOW, [0]), now=NOW)
    assert not cluster.histories  # a baseline only
    seen = cluster.generation
    cluster.ingest(report("n1", NOW + 1, [0], slot=2), now=NOW + 1)  # a new instance
    assert cluster.generation > seen
    seen = cluster.generation
    cluster.ingest(report("n1", NOW + 2, [0], slot=3), now=NOW + 2)  # nothing changed
    assert cluster.generation == seen
    assert cluster.instances_per_node() == {"n1": 1}
    # n1 reports without it: n2 may take it, and its series goes on there.
    cluster.ingest(report("n1", NOW + 3, [], slot=4), now=NOW + 3)
    assert cluster.generation == seen
    cluster.ingest(report("n2", NOW + 4, [0], slot=5), now=NOW + 4)  # moved
    assert cluster.generation > seen
    assert cluster.instances_per_node() == {"n2": 1}
    assert cluster.histories[InstanceKey("wc", "split", 0)].node == "n2"
    seen = cluster.generation
    cluster.ingest(report("n2", NOW + 5, [0], slot=6), now=NOW + 5)
    assert cluster.generation == seen
    cluster.forget_vanished(NOW + 200)  # gone
    assert cluster.generation > seen
    assert cluster.instances_per_node() == {}


# ------------------------------------------------------------ GetPlan's bytes
def test_a_reply_is_encoded_once_and_a_new_one_again():
    calls = []

    def encode(reply: pb.PlanReply) -> bytes:
        calls.append(reply)
        return reply.SerializeToString()

    once = _EncodeOnce(encode)
    plan = pb.PlanReply(epoch=3, record_json="{}")
    assert once(plan) == plan.SerializeToString()
    assert once(plan) is once(plan)
    newer = pb.PlanReply(epoch=4)
    assert pb.PlanReply.FromString(once(newer)) == newer
    assert calls == [plan, newer]
