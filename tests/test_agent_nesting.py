"""Caps stay inside the container: dsched's groups nest in the thread's own cgroup
(real cgroup v1, real busy threads; DSCHED_REQUIRE_CGROUPS=1 turns skips into failures).

The "container" is a cgroup the test makes, as a container runtime or systemd would,
with its own 0.5-core quota. A thread started inside it and capped by dsched above
that limit still measures the container's limit (cpuacct.usage), capped below it
measures dsched's cap, and a released cap puts the thread back in the container.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.config import AgentConfig
from agent.node import NodeAgent
from dsched.ids import InstanceKey
from dsched_pb import dsched_pb2 as pb
from tests.test_agent_support import WorkerThread, empty_and_remove, unique_root, write_control

pytestmark = [pytest.mark.cgroups, pytest.mark.slow]

CPUACCT = Path("/sys/fs/cgroup/cpuacct")
KEY = InstanceKey("wc", "count", 0)
WIRE = pb.InstanceKey(app="wc", operator="count", instance=0)
_names = itertools.count()


def _tids(directory: Path) -> set[int]:
    return {int(t) for t in (directory / "tasks").read_text().split()}


def _settings(directory: Path) -> dict[str, str]:
    """Every writable control file of one cgroup (threads aside), by name."""
    return {
        f.name: f.read_text()
        for f in sorted(directory.iterdir())
        if f.is_file() and f.stat().st_mode & 0o200 and f.name not in ("tasks", "cgroup.procs")
    }


@pytest.fixture
def container(cgroup_v1_cpu: Path) -> Iterator[tuple[Path, Path]]:
    """(cpu cgroup with a 0.5-core quota, cgroup whose cpuacct.usage counts its threads)."""
    name = f"dsched-pod-{os.getpid()}-{next(_names)}"
    pod = cgroup_v1_cpu / name
    pod.mkdir()
    acct = pod
    try:
        write_control(pod / "cpu.cfs_period_us", "100000")
        write_control(pod / "cpu.cfs_quota_us", "50000")
        # The machine is shared: the container outweighs other work, so a measurement
        # shows what the limits allow, not what the neighbours leave over.
        write_control(pod / "cpu.shares", "262144")
        if not (pod / "cpuacct.usage").exists():
            if not (CPUACCT / "cpuacct.usage").exists():
                pytest.skip(f"no cpuacct controller at {pod} or {CPUACCT} to measure usage with")
            acct = CPUACCT / name
            acct.mkdir()
        yield pod, acct
    finally:
        empty_and_remove(pod, cgroup_v1_cpu / "tasks")
        if acct != pod:
            empty_and_remove(acct, CPUACCT / "tasks")
    assert not pod.exists() and not acct.exists(), "test left a cgroup behind"


def _usage(acct: Path, seconds: float = 2.0) -> float:
    """Cores used by the threads in ``acct`` over ``seconds`` (cpuacct.usage, ns)."""
    time.sleep(0.3)  # the first throttled periods settle
    u0, t0 = int((acct / "cpuacct.usage").read_text()), time.monotonic()
    time.sleep(seconds)
    u1, t1 = int((acct / "cpuacct.usage").read_text()), time.monotonic()
    return (u1 - u0) / 1e9 / (t1 - t0)


def _cap(agent: NodeAgent, epoch: int, cap: float) -> pb.Ack:
    return agent.handle_directive(
        pb.CapDirective(epoch=epoch, caps=[pb.InstanceCap(key=WIRE, cap_cores=cap)])
    )


def test_a_capped_thread_stays_under_its_containers_limit(container, cgroup_v1_cpu):
    pod, acct = container
    thread = WorkerThread(busy=True)
    root = unique_root()
    agent = NodeAgent(
        AgentConfig(
            node_id="n1", cgroup_mode="v1", cgroup_mount=str(cgroup_v1_cpu), cgroup_root=root
        )
    )
    try:
        # Started inside the container, as its runtime would start it.
        write_control(pod / "tasks", str(thread.tid))
        if acct != pod:
            write_control(acct / "tasks", str(thread.tid))
        pod_settings = _settings(pod)
        top_settings = _settings(cgroup_v1_cpu)
        agent.register("wc", "count", 0, "w1", True, os.getpid(), thread.tid)

        # Above the container's limit: nested, so the container's 0.5 still applies.
        assert _cap(agent, 1, 0.8).applied == 1
        path = agent.cgroups[KEY]
        assert path == (pod / root / "wc" / "w1" / "count-0").resolve()
        assert _tids(path) == {thread.tid}
        assert not (cgroup_v1_cpu / root).exists(), "a group outside the container"
        # v1 refuses a child quota above its parent's: the quota is the container's.
        assert int((path / "cpu.cfs_quota_us").read_text()) == 50_000
        measured = _usage(acct)
        assert abs(measured - 0.5) <= 0.05, f"cap 0.8 in a 0.5 container measured {measured:.3f}"

        # Below it: dsched's cap is what the thread gets.
        assert _cap(agent, 2, 0.3).applied == 1
        assert int((path / "cpu.cfs_quota_us").read_text()) == 30_000
        measured = _usage(acct)
        assert abs(measured - 0.3) <= 0.05, f"cap 0.3 in a 0.5 container measured {measured:.3f}"

        # Released: the thread is back in the container, dsched's group is gone.
        ack = agent.handle_directive(pb.CapDirective(epoch=3, release=[WIRE]))
        assert ack.applied == 1 and not ack.rejected
        assert thread.tid in _tids(pod) and not path.exists()
        assert KEY not in agent.caps and KEY not in agent.cgroups
        agent.enforcer.remove_empty()
        assert not (pod / root).exists(), "the agent left its root in the container"
        # Nothing of the container's or the hierarchy's own settings changed.
        assert _settings(pod) == pod_settings and _settings(cgroup_v1_cpu) == top_settings
    finally:
        thread.join()
        agent.close()


def test_an_unregistered_instance_goes_back_to_its_container(container, cgroup_v1_cpu):
    pod, _acct = container
    thread = WorkerThread()
    root = unique_root()
    agent = NodeAgent(
        AgentConfig(
            node_id="n1", cgroup_mode="v1", cgroup_mount=str(cgroup_v1_cpu), cgroup_root=root
        )
    )
    try:
        write_control(pod / "tasks", str(thread.tid))
        agent.register("wc", "count", 0, "w1", True, os.getpid(), thread.tid)
        assert _cap(agent, 1, 0.4).applied == 1
        path = agent.cgroups[KEY]
        # The thread lives on but the instance leaves: its threads return to the container.
        agent.unregister("wc", "count", 0)
        assert thread.tid in _tids(pod) and not path.exists()
        agent.enforcer.remove_empty()
        assert not (pod / root).exists()
    finally:
        thread.join()
        agent.close()


def test_an_agent_given_a_subtree_nests_under_the_threads_cgroup(container, cgroup_v1_cpu):
    # The agent's mount is a reservation inside the hierarchy (the container
    # here), while /proc names the thread's cgroup from the hierarchy's top.
    pod, acct = container
    inner = pod / "task-group"
    inner.mkdir()
    thread = WorkerThread(busy=True)
    root = unique_root()
    agent = NodeAgent(
        AgentConfig(node_id="n1", cgroup_mode="v1", cgroup_mount=str(pod), cgroup_root=root)
    )
    try:
        write_control(inner / "tasks", str(thread.tid))
        agent.register("wc", "count", 0, "w1", True, os.getpid(), thread.tid)
        ack = _cap(agent, 1, 0.3)
        assert ack.applied == 1, ack
        path = agent.cgroups[KEY]
        assert path == (inner / root / "wc" / "w1" / "count-0").resolve()
        assert _tids(path) == {thread.tid}
        ack = agent.handle_directive(pb.CapDirective(epoch=2, release=[WIRE]))
        assert ack.applied == 1 and thread.tid in _tids(inner)
    finally:
        thread.join()
        agent.close()
