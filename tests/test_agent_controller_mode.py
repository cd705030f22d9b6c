"""The agent follows the controller's mode: nothing on the node changes until the
controller says it enforces (real cgroup v1, real threads)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agent.config import AgentConfig
from agent.enforcer import NotEnforcing
from agent.node import NodeAgent
from dsched.ids import InstanceKey
from dsched_pb import dsched_pb2 as pb
from tests.test_agent_support import WorkerThread, release_tree, unique_root

pytestmark = pytest.mark.cgroups

KEY = InstanceKey("wc", "count", 0)
WIRE = pb.InstanceKey(app="wc", operator="count", instance=0)


def _writes(agent: NodeAgent) -> float:
    return agent.metrics.registry.get_sample_value("dsched_agent_cap_writes_total")


def _directive(epoch: int, cap: float) -> pb.CapDirective:
    return pb.CapDirective(epoch=epoch, caps=[pb.InstanceCap(key=WIRE, cap_cores=cap)])


def test_welcome_modes_switch_writes_and_a_directive_means_enforce(cgroup_v1_cpu: Path):
    root = unique_root()
    config = AgentConfig(
        cgroup_mode="v1", cgroup_mount=str(cgroup_v1_cpu), cgroup_root=root, capacity_cores=1.0
    )
    agent = NodeAgent(config, await_controller=True)
    thread = WorkerThread()
    try:
        agent.register("wc", "count", 0, "w1", True, os.getpid(), thread.tid)
        # Before the controller's word (or under a controller that does not say its
        # mode), nothing is written: not even the root quota of capacity_cores.
        agent.on_contact(pb.Welcome(epoch=0, slot_seconds=1.0))
        assert not agent.enforcing and not agent.sampler.resctrl.writable
        with pytest.raises(NotEnforcing):
            agent.apply_cap(agent.registry.get(KEY), 0.5)
        assert not (cgroup_v1_cpu / root).exists() and _writes(agent) == 0
        # No fallback either: nothing is enforced on the controller's behalf.
        assert not agent.check_lease(now=agent.last_contact + 1e6)

        agent.on_contact(pb.Welcome(epoch=0, slot_seconds=1.0, mode=pb.ENFORCE))
        assert agent.enforcing
        assert agent.handle_directive(_directive(1, 0.5)).applied == 1
        path = agent.cgroups[KEY]
        assert int((path / "cpu.cfs_quota_us").read_text()) == 50_000 and _writes(agent) == 1

        # Back to dry-run: the cap in force stays, and is what the Hello and reports say.
        agent.on_contact(pb.Welcome(epoch=1, slot_seconds=1.0, mode=pb.DRY_RUN))
        assert not agent.enforcing
        agent.sample()
        assert [(c.key.operator, c.cap_cores) for c in agent.hello().current_caps] == [
            ("count", 0.5)
        ]
        (sample,) = agent.report().instances
        assert sample.cap_cores == 0.5
        # A directive is only sent by an enforcing controller: it switches writes back on.
        assert agent.handle_directive(_directive(2, 0.4)).applied == 1
        assert agent.enforcing and int((path / "cpu.cfs_quota_us").read_text()) == 40_000
    finally:
        thread.join()
        agent.close()
        release_tree(cgroup_v1_cpu, root)
    assert not (cgroup_v1_cpu / root).exists()


def test_an_agent_in_dry_run_counts_no_write_and_claims_no_cap(cgroup_v1_cpu: Path):
    root = unique_root()
    agent = NodeAgent(
        AgentConfig(
            cgroup_mode="v1", cgroup_mount=str(cgroup_v1_cpu), cgroup_root=root, dry_run=True
        )
    )
    thread = WorkerThread()
    try:
        agent.register("wc", "count", 0, "w1", True, os.getpid(), thread.tid)
        assert agent.handle_directive(_directive(1, 0.5)).applied == 1
        assert _writes(agent) == 0 and not (cgroup_v1_cpu / root).exists()
        # The Hello and the report agree: nothing is enforced.
        assert list(agent.hello().current_caps) == []
        (sample,) = agent.report().instances
        assert not sample.HasField("cap_cores")
    finally:
        thread.join()
        agent.close()
