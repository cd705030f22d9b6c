"""A node's CPU beyond its instances: the agent measures it (its root cgroup's own
threads, or the host less the instances) and the controller may take it off the
node's capacity (real cgroup v1 and real threads for the agent's side)."""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

import pytest

from agent.config import AgentConfig
from agent.node import NodeAgent
from agent.sampling import stat_seconds
from controller.config import ControllerConfig
from controller.core import Controller
from dsched.config import ConfigError
from dsched_pb import dsched_pb2 as pb
from tests.controller_server_support import config, hello, sample
from tests.test_agent_support import WorkerThread, release_tree, unique_root, write_control


def _thread_seconds(tid: int) -> float:
    return stat_seconds(Path(f"/proc/{tid}/task/{tid}/stat").read_bytes())


def _one_slot(agent: NodeAgent, seconds: float = 1.0) -> pb.NodeReport:
    """Sample for ``seconds`` and close the slot."""
    agent.reporter.report()  # starts the slot
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.1)
        agent.sample()
    return agent.reporter.report()


@pytest.mark.cgroups
def test_cgroup_source_counts_the_roots_own_threads_and_never_an_instances(
    cgroup_v1_cpu: Path,
):
    root = unique_root()
    config = AgentConfig(
        cgroup_mode="v1",
        cgroup_mount=str(cgroup_v1_cpu),
        cgroup_root=root,
        capacity_cores=1.6,
        node_cpu="cgroup",
    )
    agent = NodeAgent(config)
    busy_instance, other = WorkerThread(busy=True), WorkerThread(busy=False)
    try:
        record = agent.register("wc", "count", 0, "w1", False, os.getpid(), busy_instance.tid)
        agent.apply_cap(record, 1.0)
        write_control(cgroup_v1_cpu / root / "tasks", str(other.tid))
        agent.sample()
        # An idle thread in the root, a busy one in its instance cgroup: nothing other.
        quiet = _one_slot(agent)
        (inst,) = quiet.instances
        assert inst.cpu_usage_cores > 0.1
        assert quiet.node.HasField("other_cpu_cores") and quiet.node.other_cpu_cores < 0.05
        assert quiet.node.cpu_usage_cores == pytest.approx(
            inst.cpu_usage_cores + quiet.node.other_cpu_cores
        )
        # The root's own thread turns busy: what it used is the node's other CPU.
        other.join()
        busy_other = WorkerThread(busy=True)
        try:
            write_control(cgroup_v1_cpu / root / "tasks", str(busy_other.tid))
            agent.sample()
            before = _thread_seconds(busy_other.tid)
            started = time.monotonic()
            loud = _one_slot(agent)
            used = (_thread_seconds(busy_other.tid) - before) / (time.monotonic() - started)
            # A busy thread gets well under a core when the suite runs beside it on
            # two vCPUs: it must have run, and the root's figure must be its own.
            assert used > 0.1
            assert loud.node.other_cpu_cores > 0.1
            assert loud.node.other_cpu_cores == pytest.approx(used, abs=0.1)
        finally:
            busy_other.join()
        # The root's threads are read through kept-open files; closing the agent closes them.
        reader = agent.sampler.root_threads.reader
        assert reader._fds
        agent.close()
        assert not reader._fds
    finally:
        busy_instance.join()
        other.join()
        agent.close()
        release_tree(cgroup_v1_cpu, root)


def test_host_source_is_the_hosts_busy_time_less_the_instances():
    agent = NodeAgent(
        AgentConfig(cgroup_mode="v1", dry_run=True, cgroup_root=unique_root()),
    )
    try:
        agent.reporter.report()
        time.sleep(0.2)
        node = agent.sampler.node_sample([], instances_cores=0.05)
        assert node.other_cpu_cores == pytest.approx(max(0.0, node.cpu_usage_cores - 0.05))
        # Instances reported above the host's reading (windows a little apart): never < 0.
        time.sleep(0.1)
        assert agent.sampler.node_sample([], instances_cores=1e6).other_cpu_cores == 0.0
    finally:
        agent.close()


@pytest.mark.parametrize("value", ["bogus", "", "CGROUP"])
def test_agent_refuses_an_unknown_node_cpu_source(value):
    with pytest.raises(ConfigError) as info:
        AgentConfig(node_cpu=value).validate()
    assert info.value.key == "node_cpu"


@pytest.mark.parametrize("value", ["bogus", "", "on"])
def test_controller_refuses_an_unknown_other_cpu_use(value):
    with pytest.raises(ConfigError) as info:
        ControllerConfig(other_cpu=value).validate()
    assert info.value.key == "other_cpu"


def _report(slot: int, now: float, other: float | None) -> pb.NodeReport:
    node = pb.NodeSample(cpu_capacity_cores=2.0, cpu_usage_cores=1.0)
    if other is not None:
        node.other_cpu_cores = other
    return pb.NodeReport(
        node_id="n1",
        slot=slot,
        timestamp=now + slot,
        slot_seconds=1.0,
        node=node,
        instances=[sample(n=100 * slot)],
    )


def _controller(tmp_path: Path, other_cpu: str, phi: int = 3) -> Controller:
    controller = Controller(config(tmp_path, other_cpu=other_cpu, phi=phi))
    controller.on_hello(hello("n1").hello)
    return controller


def test_capacity_is_less_the_mean_other_cpu_of_the_last_phi_reports(tmp_path):
    controller = _controller(tmp_path, "subtract", phi=3)
    now = time.time() - 100
    for slot, other in enumerate([0.9, 0.1, 0.2, 0.3], start=1):
        assert controller.cluster.ingest(_report(slot, now, other)).taken
    # phi = 3: the first report's 0.9 has left the mean.
    assert controller.cluster.other_cpu() == {"n1": pytest.approx(0.2)}
    assert controller.node_capacity() == {"n1": pytest.approx(1.8)}
    # A configured limit caps what is left; it is not cut again.
    # The decision says what was taken off and why; so does /metrics.
    record = controller.run_epoch()
    assert record["other_cpu_cores"] == {"n1": pytest.approx(0.2)}
    assert record["capacity_cores"] == {"n1": pytest.approx(1.8)}
    registry = controller.metrics.registry
    assert registry.get_sample_value("dsched_node_other_cpu_cores", {"node": "n1"}) == (
        pytest.approx(0.2)
    )
    assert registry.get_sample_value("dsched_node_capacity_cores", {"node": "n1"}) == (
        pytest.approx(1.8)
    )
    controller.config.node_capacity_cores = {"n1": 1.5}
    assert controller.node_capacity() == {"n1": pytest.approx(1.5)}
    controller.config.node_capacity_cores = {"n1": 1.9}
    assert controller.node_capacity() == {"n1": pytest.approx(1.8)}


def test_ignore_keeps_the_reported_capacity_and_an_agent_without_the_figure_loses_nothing(
    tmp_path,
):
    now = time.time() - 100
    ignoring = _controller(tmp_path / "a", "ignore")
    ignoring.cluster.ingest(_report(1, now, 0.5))
    assert ignoring.node_capacity() == {"n1": 2.0}
    # An agent from before the figure sends none: nothing is subtracted.
    older = _controller(tmp_path / "b", "subtract")
    assert older.cluster.ingest(_report(1, now, None)).taken
    assert older.cluster.other_cpu() == {} and older.node_capacity() == {"n1": 2.0}


@pytest.mark.parametrize("bad", [math.nan, -0.1, math.inf])
def test_a_bad_other_cpu_figure_is_refused_by_name_and_the_instances_still_count(tmp_path, bad):
    controller = _controller(tmp_path, "subtract")
    now = time.time() - 100
    controller.cluster.ingest(_report(1, now, 0.4))
    # The first report is the instance's baseline: its counters are cumulative.
    assert not controller.cluster.histories
    result = controller.cluster.ingest(_report(2, now, bad))
    assert result.taken and result.accepted == 1 and result.rejected == {"bad_other_cpu": 1}
    assert controller.cluster.rejected["bad_other_cpu"] == 1
    # The instance's slot from that report is kept; the node keeps its earlier figure.
    (history,) = controller.cluster.histories.values()
    assert len(history.slots) == 1
    assert controller.cluster.other_cpu() == {"n1": pytest.approx(0.4)}
    assert controller.node_capacity() == {"n1": pytest.approx(1.6)}
