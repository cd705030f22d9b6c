"""The agent's gRPC stream against a real gRPC server on 127.0.0.1 (a recording controller)."""

from __future__ import annotations

import math
import os
import random
from pathlib import Path

import grpc
import pytest

from agent.config import AgentConfig
from agent.link import ControllerLink, backoff_delay
from agent.node import NodeAgent
from dsched.ids import InstanceKey
from dsched.tls import TlsConfig
from dsched_pb import dsched_pb2 as pb
from tests.test_agent_support import (
    RecordingController,
    WorkerThread,
    free_port,
    make_pki,
    release_tree,
    unique_root,
    wait_for,
)


def _dry_agent(**kw) -> NodeAgent:
    return NodeAgent(AgentConfig(dry_run=True, slot_seconds=1, sample_seconds=1, **kw))


def _link(agent: NodeAgent, port: int, buffer_size: int = 360) -> ControllerLink:
    return ControllerLink(
        agent,
        f"127.0.0.1:{port}",
        buffer_size=buffer_size,
        backoff_initial=0.05,
        backoff_max=0.3,
        connect_timeout=0.5,
        rng=random.Random(1),
    )


def _metric(agent: NodeAgent, name: str, **labels) -> float:
    return agent.metrics.registry.get_sample_value(name, labels or None) or 0.0


def test_backoff_grows_exponentially_with_jitter_and_is_capped():
    rng = random.Random(7)
    delays = [backoff_delay(a, 0.5, 30.0, rng) for a in range(12)]
    for attempt, d in enumerate(delays):
        ceiling = min(30.0, 0.5 * 2**attempt)
        assert ceiling / 2 <= d <= ceiling
    assert len({round(d, 6) for d in delays}) == len(delays)


def test_controller_unreachable_at_start_then_started_gets_buffered_reports_replayed():
    agent = _dry_agent()
    port = free_port()
    link = _link(agent, port)
    link.start()
    controller = RecordingController()
    try:
        for _ in range(3):
            link.submit_report(agent.report())
        assert not link.connected.is_set()
        assert link.buffered == 3
        controller.start(port)
        assert wait_for(lambda: len(controller.reports) == 3)
        assert len(controller.hellos) == 1
        assert [r.slot for r in controller.reports] == [1, 2, 3]
        assert all(r.replayed for r in controller.reports)
        link.submit_report(agent.report())
        assert wait_for(lambda: len(controller.reports) == 4)
        assert not controller.reports[-1].replayed
        assert _metric(agent, "dsched_agent_connected") == 1
    finally:
        link.stop()
        controller.stop()


def test_report_buffer_drops_oldest_and_counts():
    agent = _dry_agent()
    port = free_port()
    link = _link(agent, port, buffer_size=2)
    link.start()
    controller = RecordingController()
    try:
        for _ in range(5):
            link.submit_report(agent.report())
        assert _metric(agent, "dsched_agent_reports_dropped_total") == 3
        controller.start(port)
        assert wait_for(lambda: len(controller.reports) == 2)
        assert [r.slot for r in controller.reports] == [4, 5]
    finally:
        link.stop()
        controller.stop()


def test_directive_rejections_unknown_instance_out_of_bounds_and_stale_epoch():
    agent = _dry_agent()
    t = WorkerThread()
    agent.register("wc", "split", 0, "w1", False, os.getpid(), t.tid)
    controller = RecordingController()
    port = controller.start()
    link = _link(agent, port)
    link.start()
    try:
        assert wait_for(link.connected.is_set)
        cores = agent.capacity_cores
        controller.send_caps(
            5,
            [
                ("wc", "split", 0, 0.5),
                ("wc", "nosuch", 0, 0.5),
                ("wc", "split", 0, -0.1),
                ("wc", "split", 0, cores + 0.5),
                ("wc", "split", 0, math.nan),
                ("../x", "split", 0, 0.5),
            ],
        )
        assert wait_for(lambda: len(controller.acks) == 1)
        ack = controller.acks[0]
        assert ack.epoch == 5 and ack.applied == 1 and not ack.stale
        assert [r.reason for r in ack.rejected] == [
            "unknown_instance",
            "cap_out_of_bounds",
            "cap_out_of_bounds",
            "cap_out_of_bounds",
            "unknown_instance",
        ]
        assert agent.caps == {InstanceKey("wc", "split", 0): 0.5}
        controller.send_caps(4, [("wc", "split", 0, 0.9)])
        assert wait_for(lambda: len(controller.acks) == 2)
        assert controller.acks[1].stale and controller.acks[1].applied == 0
        assert agent.caps == {InstanceKey("wc", "split", 0): 0.5}
        assert _metric(agent, "dsched_agent_rejected_directives_total", reason="stale_epoch") == 1
        assert (
            _metric(agent, "dsched_agent_rejected_directives_total", reason="unknown_instance") == 2
        )
        assert (
            _metric(agent, "dsched_agent_rejected_directives_total", reason="cap_out_of_bounds")
            == 3
        )
        # Cap 0 is out of bounds like any other; removing a cap is its own entry kind.
        controller.send_caps(6, [("wc", "split", 0, 0.0)])
        assert wait_for(lambda: len(controller.acks) == 3)
        assert [r.reason for r in controller.acks[2].rejected] == ["cap_out_of_bounds"]
        assert agent.caps == {InstanceKey("wc", "split", 0): 0.5}
        controller.outbox.put(
            pb.ControllerMessage(
                directive=pb.CapDirective(
                    epoch=7,
                    release=[
                        pb.InstanceKey(app="wc", operator="split", instance=0),
                        pb.InstanceKey(app="wc", operator="nosuch", instance=0),
                    ],
                )
            )
        )
        assert wait_for(lambda: len(controller.acks) == 4)
        ack = controller.acks[3]
        assert ack.applied == 1 and [r.reason for r in ack.rejected] == ["unknown_instance"]
        assert agent.caps == {}
    finally:
        link.stop()
        controller.stop()
        t.join()


def _mutual_tls_controller(pki: dict[str, Path]) -> tuple[RecordingController, int]:
    """A controller that serves TLS and wants a client certificate signed by the CA."""
    controller = RecordingController()
    credentials = grpc.ssl_server_credentials(
        [(pki["server.key"].read_bytes(), pki["server"].read_bytes())],
        root_certificates=pki["ca"].read_bytes(),
        require_client_auth=True,
    )
    return controller, controller.start(credentials=credentials)


def test_link_speaks_mutual_tls_with_the_configured_files(tmp_path):
    pki = make_pki(tmp_path)
    agent = _dry_agent()
    controller, port = _mutual_tls_controller(pki)
    tls = TlsConfig(cert=pki["client"], key=pki["client.key"], ca=pki["ca"])
    tls.validate("client")
    link = ControllerLink(agent, f"127.0.0.1:{port}", tls=tls, connect_timeout=5.0)
    link.start()
    try:
        assert wait_for(link.connected.is_set)
        link.submit_report(agent.report())
        assert wait_for(lambda: len(controller.reports) == 1)
        assert controller.hellos[0].node_id == agent.config.node_id
    finally:
        link.stop()
        controller.stop()
        agent.close()


def test_link_without_a_client_certificate_is_refused_by_a_mutual_tls_controller(tmp_path):
    pki = make_pki(tmp_path)
    agent = _dry_agent()
    controller, port = _mutual_tls_controller(pki)
    link = ControllerLink(
        agent, f"127.0.0.1:{port}", tls=TlsConfig(ca=pki["ca"]), connect_timeout=0.5
    )
    link.start()
    try:
        assert not wait_for(link.connected.is_set, timeout=2.0)
        assert controller.hellos == []
    finally:
        link.stop()
        controller.stop()
        agent.close()


@pytest.fixture
def v1_agent(cgroup_v1_cpu: Path):
    root = unique_root()
    agent = NodeAgent(
        AgentConfig(
            cgroup_mode="v1",
            cgroup_mount=str(cgroup_v1_cpu),
            cgroup_root=root,
            slot_seconds=1,
            lease_epochs=2,
        )
    )
    t = WorkerThread()
    agent.register("wc", "count", 0, "w1", True, os.getpid(), t.tid)
    yield agent
    t.join()
    agent.close()
    release_tree(cgroup_v1_cpu, root)
    assert not (cgroup_v1_cpu / root).exists()


@pytest.mark.cgroups
def test_controller_restart_agent_reconnects_and_caps_stay(v1_agent):
    agent = v1_agent
    key = InstanceKey("wc", "count", 0)
    controller = RecordingController()
    port = controller.start()
    link = _link(agent, port)
    link.start()
    try:
        assert wait_for(link.connected.is_set)
        controller.send_caps(1, [("wc", "count", 0, 0.3)])
        assert wait_for(lambda: len(controller.acks) == 1)
        quota = agent.cgroups[key] / "cpu.cfs_quota_us"
        assert quota.read_text().strip() == "30000"

        controller.stop()
        assert wait_for(lambda: not link.connected.is_set())
        link.submit_report(agent.report())  # produced while the controller is down
        restarted = RecordingController(welcome_epoch=1)
        restarted.start(port)
        assert wait_for(lambda: len(restarted.reports) == 1)
        hello = restarted.hellos[0]
        assert [(c.key.operator, c.cap_cores) for c in hello.current_caps] == [("count", 0.3)]
        assert restarted.reports[0].replayed
        assert quota.read_text().strip() == "30000"
        assert _metric(agent, "dsched_agent_reconnects_total") == 2
        restarted.stop()
    finally:
        link.stop()


@pytest.mark.cgroups
@pytest.mark.parametrize("policy", ["hold", "release"])
def test_lease_expiry_applies_fallback_once(v1_agent, policy):
    agent = v1_agent
    agent.config.fallback = policy
    key = InstanceKey("wc", "count", 0)
    agent.apply_cap(agent.registry.get(key), 0.25)
    quota = agent.cgroups[key] / "cpu.cfs_quota_us"
    start = agent.last_contact
    assert not agent.check_lease(start + 1.5)  # within 2 slots of 1 s
    assert agent.check_lease(start + 2.5)
    assert not agent.check_lease(start + 3.5)  # applied once only
    assert _metric(agent, "dsched_agent_fallbacks_total", policy=policy) == 1
    if policy == "hold":
        assert quota.read_text().strip() == "25000" and agent.caps[key] == 0.25
    else:
        # Released as a release directive does: the cgroup is gone with its quota.
        assert not quota.exists() and key not in agent.caps and key not in agent.cgroups
    agent.on_contact()
    assert not agent.fallback_applied


def test_a_refused_agent_keeps_its_reports_and_backs_off_to_the_longest_delay(tmp_path, pki):
    """The real controller refuses a node id its certificate does not carry."""
    from tests.controller_server_support import config, start, stop

    cfg = config(tmp_path, tls=TlsConfig(cert=pki.server_cert, key=pki.server_key, ca=pki.ca))
    controller, server = start(cfg, loop=False)
    cert, key = pki.agent("node-y")
    agent = _dry_agent(node_id="node-x")
    link = ControllerLink(
        agent,
        f"localhost:{server.port}",
        tls=TlsConfig(cert=cert, key=key, ca=pki.ca),
        backoff_initial=0.05,
        backoff_max=30.0,
        connect_timeout=5.0,
        rng=random.Random(3),
    )
    for _ in range(3):
        link.submit_report(agent.report())
    link.start()
    try:
        assert wait_for(
            lambda: (
                _metric(agent, "dsched_agent_controller_refusals_total", code="permission_denied")
                >= 1
            )
        )
        assert link.refusal == grpc.StatusCode.PERMISSION_DENIED
        assert not link.connected.is_set()
        # Nothing buffered went down a stream the controller refused.
        assert link.buffered == 3
        assert "node-x" not in controller.cluster.agents
        # A certificate problem does not fix itself: the next try waits the longest backoff.
        assert link.retry_delay(0, link.refusal) >= 15.0
        assert link.retry_delay(0, grpc.StatusCode.ALREADY_EXISTS) <= 0.05
        assert link.retry_delay(0, None) <= 0.05
    finally:
        link.stop()
        stop(controller, server)
