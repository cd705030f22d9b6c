"""Scheduling weights, node capacity and the DAG an instance registers (real cgroup v1)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agent.config import AgentConfig
from agent.node import NodeAgent
from dsched.ids import InstanceKey
from dsched_pb import dsched_pb2 as pb
from tests.test_agent_support import WorkerThread, release_tree, unique_root

pytestmark = pytest.mark.cgroups


@pytest.fixture
def make_agent(cgroup_v1_cpu: Path):
    made = []

    def make(**extra) -> NodeAgent:
        root = unique_root()
        agent = NodeAgent(
            AgentConfig(
                cgroup_mode="v1", cgroup_mount=str(cgroup_v1_cpu), cgroup_root=root, **extra
            )
        )
        made.append((agent, root))
        return agent

    threads: list[WorkerThread] = []
    yield make, threads
    for t in threads:
        t.join()
    for agent, root in made:
        agent.close()
        release_tree(cgroup_v1_cpu, root)
        assert not (cgroup_v1_cpu / root).exists()


def _directive(epoch: int, caps: list[tuple[str, str, int, float]]) -> pb.CapDirective:
    return pb.CapDirective(
        epoch=epoch,
        caps=[
            pb.InstanceCap(key=pb.InstanceKey(app=a, operator=o, instance=i), cap_cores=c)
            for a, o, i, c in caps
        ],
    )


def test_each_cgroup_weighs_as_much_as_the_threads_inside(make_agent):
    make, threads = make_agent
    agent = make()
    # Instance count/0 runs on two threads, split/0 on one.
    for op, n in (("count", 2), ("split", 1)):
        for _ in range(n):
            t = WorkerThread()
            threads.append(t)
            agent.register("wc", op, 0, "w1", op == "count", os.getpid(), t.tid)
    ack = agent.handle_directive(_directive(1, [("wc", "count", 0, 0.5), ("wc", "split", 0, 0.3)]))
    assert ack.applied == 2
    root = agent.backend.root
    shares = lambda p: int((p / "cpu.shares").read_text())  # noqa: E731
    assert shares(root / "wc" / "w1" / "count-0") == 2 * 1024
    assert shares(root / "wc" / "w1" / "split-0") == 1024
    assert shares(root / "wc" / "w1") == 3 * 1024
    assert shares(root / "wc") == 3 * 1024
    assert shares(root) == 3 * 1024


def test_capacity_cores_is_reported_and_enforced_on_the_root(make_agent):
    make, _ = make_agent
    agent = make(capacity_cores=1.0, cpu_period_us=100_000)
    assert agent.hello().cpu_capacity_cores == 1.0
    # The root is made (with its quota) with the first cap, inside the thread's cgroup.
    assert not agent.backend.root.exists()
    t = WorkerThread()
    _, threads = make_agent
    threads.append(t)
    agent.register("wc", "count", 0, "w1", True, os.getpid(), t.tid)
    ack = agent.handle_directive(_directive(1, [("wc", "count", 0, 0.5)]))
    assert ack.applied == 1
    assert int((agent.backend.root / "cpu.cfs_quota_us").read_text()) == 100_000
    # A cap above the configured capacity is refused, even though the machine has more.
    ack = agent.handle_directive(_directive(2, [("wc", "count", 0, 1.5)]))
    assert ack.applied == 0 and ack.rejected[0].reason == "cap_out_of_bounds"


def test_registered_upstream_reaches_the_report(make_agent):
    make, threads = make_agent
    agent = make(dry_run=True)
    t = WorkerThread()
    threads.append(t)
    agent.register("wc", "count", 0, "w1", True, os.getpid(), t.tid, upstream=["split"])
    report = agent.report()
    (sample,) = [s for s in report.instances if s.key.operator == "count"]
    assert list(sample.upstream) == ["split"]


@pytest.mark.parametrize("bad", [["../x"], "split", [1]])
def test_bad_upstream_is_refused(make_agent, bad):
    from agent.registry import RegistrationError

    make, threads = make_agent
    agent = make(dry_run=True)
    t = WorkerThread()
    threads.append(t)
    with pytest.raises(RegistrationError):
        agent.register("wc", "count", 0, "w1", True, os.getpid(), t.tid, upstream=bad)
    assert agent.registry.get(InstanceKey("wc", "count", 0)) is None
