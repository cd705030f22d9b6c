"""The sampler's per-slot CPU accounting and the reporter's NodeReport and Hello."""

from __future__ import annotations

import os
import time

import pytest

from agent.cgroups import NoCgroups
from agent.config import AgentConfig
from agent.cpu_sampler import CpuSampler, InstanceCpu, node_capacity
from agent.enforcer import CapEnforcer
from agent.metrics import AgentMetrics
from agent.registry import Registry
from agent.reporter import Reporter
from dsched.ids import InstanceKey
from dsched_pb import dsched_pb2 as pb
from tests.test_agent_support import WorkerThread

COUNT = InstanceKey("wc", "count", 0)


def test_slot_usage_counts_from_an_instances_first_sample_and_restarts_the_slot():
    never_sampled = InstanceCpu(per_tid={1: 3.0}, exited_seconds=1.0)
    assert never_sampled.end_slot(now=10.0, elapsed=10.0) == (4.0, 0.0)
    # First sampled 2 s before the slot's end, one CPU second since: half a core.
    cpu = InstanceCpu(per_tid={1: 2.0}, at_slot_start=1.0, slot_started=8.0, sampled=True)
    assert cpu.end_slot(now=10.0, elapsed=10.0) == (2.0, 0.5)
    assert (cpu.at_slot_start, cpu.slot_started) == (2.0, 10.0)
    cpu.per_tid[1] = 7.0
    assert cpu.end_slot(now=20.0, elapsed=10.0) == (7.0, 0.5)


def test_threads_that_leave_keep_their_cpu_in_the_instance_total():
    cpu = InstanceCpu(per_tid={1: 2.0, 2: 3.0})
    cpu.keep_only({1})
    assert cpu.per_tid == {1: 2.0} and cpu.exited_seconds == 3.0 and cpu.total == 5.0


def test_node_capacity_is_the_smaller_of_configured_and_online():
    assert node_capacity(0.0, 4.0) == 4.0
    assert node_capacity(1.5, 4.0) == 1.5
    assert node_capacity(8.0, 4.0) == 4.0


def test_sample_pass_hands_back_exited_threads_and_keeps_their_cpu():
    registry = Registry()
    sampler = CpuSampler(registry)
    stays, leaves = WorkerThread(busy=True), WorkerThread()
    try:
        for t in (stays, leaves):
            registry.register(COUNT, "w1", False, os.getpid(), t.tid)
        first = sampler.sample()
        assert [r.key for r in first.rebuilt] == [COUNT] and first.lost == []
        assert sampler.sample().rebuilt == []  # registry unchanged: the same view
        leaves.join()
        lost = []
        deadline = time.monotonic() + 10.0
        # The OS thread outlives Python's join by a moment, longer on a loaded machine.
        while not lost and time.monotonic() < deadline:
            lost = sampler.sample().lost
            if not lost:
                time.sleep(0.005)
        assert [(x.key, x.live) for x in lost] == [(COUNT, frozenset({stays.tid}))]
        assert sampler.cpu_seconds(COUNT) > 0
    finally:
        stays.join()
        leaves.join()
        sampler.close()


@pytest.mark.parametrize("dry_run", [False, True])
def test_report_claims_a_cap_only_when_it_enforces_one(tmp_path, dry_run):
    config = AgentConfig(dry_run=dry_run, node_id="n1", resctrl_mount=str(tmp_path / "absent"))
    registry = Registry()
    registry.register(COUNT, "w1", True, pid=100, tid=101, upstream=["split"])
    sampler = CpuSampler(registry, resctrl_mount=config.resctrl_mount)
    enforcer = CapEnforcer(NoCgroups(), registry, AgentMetrics(), 2.0, dry_run=dry_run)
    enforcer.apply_cap(registry.get(COUNT), 0.5)
    reporter = Reporter(config, registry, sampler, enforcer)
    try:
        first, second = reporter.report(), reporter.report()
        assert (first.node_id, first.slot, second.slot) == ("n1", 1, 2)
        (sample,) = first.instances
        assert (sample.key.app, sample.key.operator, sample.key.instance) == ("wc", "count", 0)
        assert sample.stateful and list(sample.upstream) == ["split"] and list(sample.tids) == [101]
        assert sample.HasField("cap_cores") == (not dry_run)
        # No cgroup behind the cap: no throttling figures, rather than zeros.
        assert not sample.HasField("throttled_periods_total")
        assert first.node.cpu_capacity_cores == sampler.capacity_cores
        hello = reporter.hello()
        assert hello.cgroup_mode == pb.CGROUP_NONE and hello.dry_run == dry_run
        # The Hello claims what the reports claim: a dry run enforces no cap.
        claimed = [] if dry_run else [("count", 0.5)]
        assert [(c.key.operator, c.cap_cores) for c in hello.current_caps] == claimed
        assert "throttling" not in hello.counters_available
    finally:
        sampler.close()
