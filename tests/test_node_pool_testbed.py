"""The testbed node pool: a real `dsched-agent` started for the added node and
connected to a real `dsched-controller` (both subprocesses, as `dsched demo
--nodes 2` runs them), and stopped again when the node is removed."""

from __future__ import annotations

import time

import pytest

from controller.config import ControllerConfig, NodePoolConfig, NodePoolTestbedConfig
from controller.edges.nodepool import NODE_POOLS, NodeChange, TestbedNodePool
from dsched_pb import dsched_pb2 as pb
from testbed.live.cluster import LocalCluster


def connected(cluster: LocalCluster) -> list[str]:
    return sorted(a.node_id for a in cluster.admin().Status(pb.StatusRequest(), timeout=5).agents)


def wait_for(cluster: LocalCluster, want: list[str], timeout: float = 15.0) -> list[str]:
    deadline = time.monotonic() + timeout
    while (got := connected(cluster)) != want and time.monotonic() < deadline:
        time.sleep(0.1)
    return got


@pytest.fixture
def controller(tmp_path):
    cluster = LocalCluster(tmp_path / "c", slot_seconds=1.0)
    try:
        cluster.start_controller()  # no agent of its own: the pool brings them
    except BaseException:
        cluster.stop()
        raise
    yield cluster
    cluster.stop()


def test_an_added_testbed_node_is_an_agent_that_connects_and_leaves(tmp_path, controller):
    cfg = NodePoolTestbedConfig(node_cores=0.5, agent_dry_run=True)
    pool = TestbedNodePool(
        cfg, listen=controller.listen, workdir=tmp_path / "pool", slot_seconds=1.0
    )
    try:
        res = pool.add(NodeChange("add", 1, (), None, "test"))
        assert (res.outcome, res.node) == ("done", "pool-n1"), res.reason
        assert wait_for(controller, ["pool-n1"]) == ["pool-n1"]
        status = controller.admin().Status(pb.StatusRequest(), timeout=5)
        assert status.agents[0].cpu_capacity_cores == pytest.approx(0.5)
        second = pool.add(NodeChange("add", 2, ("pool-n1",), None, "test"))
        assert second.node == "pool-n2"
        assert wait_for(controller, ["pool-n1", "pool-n2"]) == ["pool-n1", "pool-n2"]
        nodes = ("pool-n1", "pool-n2")
        busy = pool.remove(NodeChange("remove", 3, nodes, "pool-n2", "test", {"pool-n2": 3}))
        assert busy.outcome == "refused" and "3 instance(s)" in busy.reason
        gone = pool.remove(NodeChange("remove", 4, nodes, "pool-n2", "test"))
        assert (gone.outcome, gone.node) == ("done", "pool-n2")
        assert wait_for(controller, ["pool-n1"]) == ["pool-n1"]
        # A node it did not start is never stopped: its own newest one goes instead.
        other = pool.remove(NodeChange("remove", 5, ("local", "pool-n1"), "local", "test"))
        assert other.node == "pool-n1"
        assert wait_for(controller, []) == []
        assert pool.remove(NodeChange("remove", 6, (), None, "test")).outcome == "refused"
    finally:
        pool.close()


def test_the_testbed_pool_is_built_from_config(tmp_path):
    cfg = ControllerConfig(
        state_dir=tmp_path, node_pool=NodePoolConfig(strategy="testbed", min_nodes=1)
    )
    cfg.validate()
    pool = NODE_POOLS.create("testbed", cfg)
    assert isinstance(pool, TestbedNodePool) and pool.blocking
    pool.close()
