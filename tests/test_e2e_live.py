"""End to end on this machine: the real daemons, real gRPC, real cgroups, real threads.

A WordCount runs as threads registering with a `dsched-agent` subprocess, which
reports to a `dsched-controller` subprocess; in enforce mode the caps must appear
in the kernel's cgroup files, in dry-run not a single cgroup may be created.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from testbed.live.cluster import (
    CGROUP_V1_CPU,
    LocalCluster,
    NodeSpec,
    metric_value,
    remove_cgroup_tree,
    scrape,
)
from testbed.live.engine import LiveTopology
from testbed.live.wordcount import wordcount

from .conftest import require_cgroups

pytestmark = pytest.mark.slow

SLOT = 1.0


def _wait_for(pred, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _quotas(root: Path) -> dict[str, int]:
    return {
        str(p.parent.relative_to(root)): int(p.read_text())
        for p in root.rglob("cpu.cfs_quota_us")
        if p.parent != root
    }


@pytest.fixture
def cgroup_root_name():
    require_cgroups()
    name = f"dsched-e2e-{os.getpid()}"
    yield name
    remove_cgroup_tree(CGROUP_V1_CPU / name)
    assert not (CGROUP_V1_CPU / name).exists(), "test left a cgroup behind"


def test_enforce_caps_reach_the_kernel_and_metrics_serve(tmp_path, cgroup_root_name):
    cluster = LocalCluster(
        tmp_path,
        mode="enforce",
        slot_seconds=SLOT,
        controller_config={"theta_cores": 0.05},
        nodes=[NodeSpec("n1", cgroup_root=cgroup_root_name)],
    )
    with cluster:
        topo = LiveTopology(
            wordcount(app="e2e", parallelism=2),
            lambda t: 60.0,
            node="n1",
            agent_socket=str(cluster.agents["n1"].socket),
        )
        topo.start()
        try:
            root = CGROUP_V1_CPU / cgroup_root_name
            quotas = _wait_for(
                lambda: {k: q for k, q in _quotas(root).items() if q > 0} or None,
                30,
                "caps under the agent's cgroup root",
            )
            assert any("e2e" in k for k in quotas)
            ctrl = scrape(cluster.metrics)
            for name in (
                "dsched_agents_connected",
                "dsched_dry_run",
                "dsched_controller_epoch_duration_seconds",
                "dsched_instance_cpu_cap_cores",
                "dsched_operator_predicted_rate_tuples_per_second",
            ):
                assert name in ctrl, name
            assert metric_value(ctrl, "dsched_agents_connected") == 1
            assert metric_value(ctrl, "dsched_dry_run") == 0
            agent = scrape(cluster.agents["n1"].metrics)
            for name in (
                "dsched_agent_threads_managed",
                "dsched_instance_cpu_usage_cores",
                "dsched_agent_instance_cpu_cap_cores",
                "dsched_agent_cap_writes_total",
            ):
                assert name in agent, name
            assert metric_value(agent, "dsched_agent_threads_managed") >= 6
            assert metric_value(agent, "dsched_agent_cap_writes_total") > 0
        finally:
            stats = topo.stop()
    assert stats.lost == 0 and stats.duplicated == 0 and stats.completed == stats.roots > 0


def test_dry_run_creates_no_cgroup(tmp_path, cgroup_root_name):
    root = CGROUP_V1_CPU / cgroup_root_name
    cluster = LocalCluster(
        tmp_path,
        mode="dry-run",
        slot_seconds=SLOT,
        agent_dry_run=True,
        nodes=[NodeSpec("n1", cgroup_root=cgroup_root_name)],
    )
    with cluster:
        topo = LiveTopology(
            wordcount(app="dry", parallelism=2),
            lambda t: 40.0,
            node="n1",
            agent_socket=str(cluster.agents["n1"].socket),
        )
        topo.start()
        try:
            # Decisions are made and recorded...
            rec = _wait_for(lambda: (cluster.plan() or {}).get("instances"), 30, "a plan")
            assert all(i["cap_cores"] > 0 for i in rec)
            # ...but nothing reaches the kernel.
            assert not root.exists()
            assert metric_value(scrape(cluster.metrics), "dsched_dry_run") == 1
        finally:
            topo.stop()
    assert not root.exists()


def test_controller_killed_and_restarted_keeps_caps(tmp_path, cgroup_root_name):
    """SIGKILL the controller: caps stay in the kernel, the agent reconnects and
    the restarted controller resumes from SQLite without dropping caps."""
    cluster = LocalCluster(
        tmp_path,
        mode="enforce",
        slot_seconds=SLOT,
        controller_config={"theta_cores": 0.05},
        nodes=[NodeSpec("n1", cgroup_root=cgroup_root_name, extra_config={"lease_epochs": 30})],
    )
    root = CGROUP_V1_CPU / cgroup_root_name
    with cluster:
        topo = LiveTopology(
            wordcount(app="crash", parallelism=2),
            lambda t: 50.0,
            node="n1",
            agent_socket=str(cluster.agents["n1"].socket),
        )
        topo.start()
        try:
            _wait_for(lambda: {k: q for k, q in _quotas(root).items() if q > 0} or None, 30, "caps")
            epoch_before = cluster.plan()["epoch"]
            cluster.kill_controller()
            capped = {k for k, q in _quotas(root).items() if q > 0}
            time.sleep(3 * SLOT)
            # Within the lease the agent holds every cap while the controller is gone.
            assert capped <= {k for k, q in _quotas(root).items() if q > 0}
            cluster.start_controller()
            cluster.wait_agents(1)
            rec = _wait_for(
                lambda: (
                    (p := cluster.plan()) and p["epoch"] > epoch_before + 1 and p["instances"] and p
                ),
                30,
                "epochs after restart",
            )
            assert rec["mode"] == "enforce"  # the persisted mode wins over nothing
            assert capped <= {k for k, q in _quotas(root).items() if q > 0}
        finally:
            stats = topo.stop()
    assert stats.lost == 0 and stats.duplicated == 0


def test_agent_started_before_controller_connects_later(tmp_path, cgroup_root_name):
    cluster = LocalCluster(
        tmp_path,
        mode="enforce",
        slot_seconds=SLOT,
        nodes=[NodeSpec("n1", cgroup_root=cgroup_root_name)],
    )
    try:
        cluster.start_agent(cluster.nodes[0])  # nothing listens at the controller address yet
        time.sleep(2 * SLOT)
        assert cluster.agents["n1"].proc.poll() is None, (
            "agent must keep running without a controller"
        )
        cluster.start_controller()
        cluster.wait_agents(1, timeout=60)
    finally:
        cluster.stop()
