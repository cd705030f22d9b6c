"""Real cgroup v1 caps on real threads (root; DSCHED_REQUIRE_CGROUPS=1 turns skips into failures)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from agent.cgroups import CgroupError, CgroupV1, ThreadGone
from agent.config import AgentConfig
from agent.node import NodeAgent
from agent.sampling import thread_cpu_seconds
from dsched.ids import InstanceKey
from dsched.names import InvalidName
from tests.test_agent_support import WorkerThread, release_tree, unique_root

pytestmark = pytest.mark.cgroups


@pytest.fixture
def v1_agent(cgroup_v1_cpu: Path):
    root = unique_root()
    config = AgentConfig(cgroup_mode="v1", cgroup_mount=str(cgroup_v1_cpu), cgroup_root=root)
    agent = NodeAgent(config)
    threads: list[WorkerThread] = []
    yield agent, threads
    for t in threads:
        t.join()
    agent.close()
    release_tree(cgroup_v1_cpu, root)
    assert not (cgroup_v1_cpu / root).exists(), "test left its cgroup root behind"


def _register(agent: NodeAgent, threads: list, instance: int, busy: bool) -> WorkerThread:
    t = WorkerThread(busy=busy)
    threads.append(t)
    agent.register("wc", "count", instance, "w1", True, os.getpid(), t.tid)
    return t


@pytest.mark.slow
@pytest.mark.parametrize("cap", [0.2, 0.5, 0.8])
def test_saturated_thread_measures_its_cap(v1_agent, cap):
    agent, threads = v1_agent
    t = _register(agent, threads, 0, busy=True)
    agent.apply_cap(agent.registry.get(InstanceKey("wc", "count", 0)), cap)
    path = agent.cgroups[InstanceKey("wc", "count", 0)]
    # The machine is shared: the test root outweighs other work (cpu.shares), so the
    # measurement shows what the cap allows, not what the neighbours leave over.
    (agent.backend.root / "cpu.shares").write_text("262144")
    assert int((path / "cpu.cfs_quota_us").read_text()) == round(cap * 100_000)
    assert str(t.tid) in (path / "tasks").read_text().split()
    time.sleep(0.3)  # let the first throttled period settle
    c0, t0 = thread_cpu_seconds("/proc", os.getpid(), t.tid), time.monotonic()
    time.sleep(3.0)
    c1, t1 = thread_cpu_seconds("/proc", os.getpid(), t.tid), time.monotonic()
    measured = (c1 - c0) / (t1 - t0)
    assert abs(measured - cap) <= 0.03, f"cap {cap} measured {measured:.3f} cores"
    throttling = agent.backend.throttling(path)
    assert throttling is not None and throttling.throttled_periods_total > 0


def test_thread_exits_before_cap_write_is_skipped_and_cgroup_removed(v1_agent):
    agent, threads = v1_agent
    t = _register(agent, threads, 0, busy=False)
    rec = agent.registry.get(InstanceKey("wc", "count", 0))
    t.join()
    time.sleep(0.05)
    with pytest.raises(ThreadGone):
        agent.apply_cap(rec, 0.5)
    assert agent.metrics.registry.get_sample_value("dsched_agent_threads_vanished_total") == 1
    assert InstanceKey("wc", "count", 0) not in agent.cgroups
    assert not (agent.backend.root / "wc" / "w1" / "count-0").exists()


def test_dead_threads_cgroup_is_removed_on_next_sample(v1_agent):
    agent, threads = v1_agent
    t = _register(agent, threads, 3, busy=False)
    key = InstanceKey("wc", "count", 3)
    agent.apply_cap(agent.registry.get(key), 0.3)
    path = agent.cgroups[key]
    assert path.is_dir()
    t.join()
    time.sleep(0.05)
    agent.sample()
    assert not path.exists()
    assert agent.registry.get(key) is None
    assert agent.metrics.registry.get_sample_value("dsched_agent_cgroups_removed_total") >= 1


def test_restarted_agent_readopts_tree_and_keeps_caps(v1_agent, cgroup_v1_cpu):
    agent, threads = v1_agent
    t = _register(agent, threads, 1, busy=False)
    key = InstanceKey("wc", "count", 1)
    agent.apply_cap(agent.registry.get(key), 0.4)
    # A stale cgroup whose threads are gone must be cleaned up on adoption.
    stale = agent.backend.create(InstanceKey("wc", "split", 9), "w1", os.getpid())
    agent.close()

    restarted = NodeAgent(agent.config)
    try:
        rec = restarted.registry.get(key)
        assert rec is not None and rec.source == "adopted" and rec.tids == {t.tid}
        assert restarted.caps[key] == pytest.approx(0.4)
        assert not stale.exists()
        hello = restarted.hello()
        assert [(c.key.operator, c.key.instance, c.cap_cores) for c in hello.current_caps] == [
            ("count", 1, pytest.approx(0.4))
        ]
        assert int((restarted.cgroups[key] / "cpu.cfs_quota_us").read_text()) == 40_000
        # The instance registers again (its client reconnected): same record, cap untouched.
        restarted.register("wc", "count", 1, "w1", True, os.getpid(), t.tid)
        assert restarted.registry.get(key).source == "registration"
        assert int((restarted.cgroups[key] / "cpu.cfs_quota_us").read_text()) == 40_000
    finally:
        restarted.close()


def test_cap_zero_removes_the_quota(v1_agent):
    agent, threads = v1_agent
    _register(agent, threads, 2, busy=False)
    key = InstanceKey("wc", "count", 2)
    agent.apply_cap(agent.registry.get(key), 0.5)
    agent.apply_cap(agent.registry.get(key), None)
    assert (agent.cgroups[key] / "cpu.cfs_quota_us").read_text().strip() == "-1"
    assert key not in agent.caps


def test_paths_outside_the_root_are_refused(cgroup_v1_cpu):
    backend = CgroupV1(cgroup_v1_cpu, unique_root())
    for key, worker in [
        (InstanceKey("..", "op", 0), "w"),
        (InstanceKey("app", "op", 0), "../../etc"),
        (InstanceKey("a/b", "op", 0), "w"),
        (InstanceKey("app", "op\x00x", 0), "w"),
    ]:
        with pytest.raises(InvalidName):
            backend.create(key, worker, os.getpid())
    with pytest.raises(InvalidName):
        backend.set_cap(cgroup_v1_cpu / "tasks", 0.5)
    with pytest.raises(InvalidName):
        backend.remove(cgroup_v1_cpu)
    assert not backend.root.exists()


def test_write_errors_raise_esrch_as_thread_gone_others_as_cgroup_error(v1_agent):
    agent, threads = v1_agent
    _register(agent, threads, 4, busy=False)
    path = agent.backend.create(InstanceKey("wc", "count", 4), "w1", os.getpid())
    with pytest.raises(CgroupError) as info:
        agent.backend.attach(path, os.getpid(), 2**22 + 7)  # no such thread: ESRCH
    assert isinstance(info.value, ThreadGone)
    # The kernel refuses a quota above a parent's (EINVAL): the cap written stays below it.
    (path.parent / "cpu.cfs_quota_us").write_text("10000")
    agent.backend.set_cap(path, 0.5)
    assert int((path / "cpu.cfs_quota_us").read_text()) == 10_000
    # A cgroup removed under the agent's feet: an error, not a vanished thread.
    agent.backend.remove(path)
    with pytest.raises(CgroupError) as info:
        agent.backend.set_cap(path, 0.5)
    assert not isinstance(info.value, ThreadGone)


def test_dry_run_creates_and_writes_nothing(cgroup_v1_cpu):
    def listing() -> dict[str, float]:
        return {str(p): p.stat().st_mtime for p in cgroup_v1_cpu.rglob("*") if "dsched" in str(p)}

    root = unique_root()
    before = listing()
    config = AgentConfig(
        cgroup_mode="v1", cgroup_mount=str(cgroup_v1_cpu), cgroup_root=root, dry_run=True
    )
    agent = NodeAgent(config)
    t = WorkerThread()
    try:
        agent.register("wc", "count", 0, "w1", True, os.getpid(), t.tid)
        agent.apply_cap(agent.registry.get(InstanceKey("wc", "count", 0)), 0.5)
        agent.sample()
        agent.report()
        assert agent.caps[InstanceKey("wc", "count", 0)] == 0.5
        assert not (cgroup_v1_cpu / root).exists()
        assert listing() == before
        assert agent.hello().cgroup_mode == 3  # CGROUP_NONE
    finally:
        t.join()
        agent.close()
