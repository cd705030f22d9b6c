"""Live placement on two "nodes": real agents, real controller, real cgroup quotas, real moves.

Each node is a `dsched-agent` subprocess with its own cgroup root and a
configured ``capacity_cores``, which the agent writes as the root's CFS quota,
so the instances of a node share a real CPU budget.
WordCount runs in worker processes registered with the agents. The rate rises
until the controller's own decision record shows node n1 over capacity minus
headroom; then ``plan_placement`` with ``liu`` plans and the move goes through
the testbed's HTTP endpoint, exactly as the controller's actuator will call it.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from controller.migration import TestbedMoveActuator
from controller.placement import get_strategy
from controller.placement_stage import placement_summary, plan_placement
from dsched_pb import dsched_pb2 as pb
from testbed.live.actuator import MoveEndpoint
from testbed.live.cluster import LocalCluster, NodeSpec, remove_cgroup_tree
from testbed.live.distributed import DistributedTopology
from testbed.live.wordcount import WORDS_PER_SENTENCE, wordcount

pytestmark = pytest.mark.slow

APP = "lpwc"
NODE_CORES = 0.5
HEADROOM = 0.1
PERIOD_US = 100_000
DAG = {APP: [("source", "split"), ("split", "count")]}


def _wait_for(pred, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.25)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def node_roots(cgroup_v1_cpu: Path):
    """One cgroup root per node (the agents create them); removed afterwards."""
    roots = {n: cgroup_v1_cpu / f"dsched-lp-{n}-{os.getpid()}" for n in ("n1", "n2")}
    yield roots
    for root in roots.values():
        remove_cgroup_tree(root)
    assert not any(root.exists() for root in roots.values()), "test left a cgroup behind"


def _our_instances(record: dict | None) -> list[dict]:
    return [i for i in (record or {}).get("instances", []) if i["app"] == APP]


def test_overloaded_node_sheds_only_stateless_instances_without_losing_tuples(tmp_path, node_roots):
    cluster = LocalCluster(
        tmp_path,
        mode="enforce",
        slot_seconds=1.0,
        controller_config={"headroom_cores": HEADROOM},
        nodes=[
            NodeSpec(n, cgroup_root=root.name, extra_config={"capacity_cores": NODE_CORES})
            for n, root in node_roots.items()
        ],
    )
    rate = {"roots_per_second": 30.0}
    with cluster:
        topo = DistributedTopology(
            wordcount(app=APP, parallelism=2, split_ms=3.0, count_ms=0.3),
            lambda t: rate["roots_per_second"],
            nodes={n: str(a.socket) for n, a in cluster.agents.items()},
            placement={f"{APP}/count/1": "n2"},
        )
        topo.start()
        endpoint = MoveEndpoint({APP: topo}).start()
        try:
            _wait_for(
                lambda: len(_our_instances(cluster.plan())) == 6,
                30,
                "all six instances in the controller's record",
            )
            # Node capacity is real: each agent caps its cgroup root at NODE_CORES.
            for root in node_roots.values():
                quota = int((root / "cpu.cfs_quota_us").read_text())
                assert quota == int(NODE_CORES * PERIOD_US)
            capacity = {
                a.node_id: a.cpu_capacity_cores
                for a in cluster.admin().Status(pb.StatusRequest(), timeout=5).agents
            }
            assert capacity == {"n1": NODE_CORES, "n2": NODE_CORES}
            plan = None
            # Raise the rate until the controller's predicted demand overloads n1.
            for step in (60.0, 90.0, 120.0, 150.0):
                rate["roots_per_second"] = step
                deadline = time.monotonic() + 8
                while plan is None and time.monotonic() < deadline:
                    time.sleep(1.0)
                    # Without scale in: at low rates n2 could be emptied, which is
                    # a different decision than the one under test.
                    plan = plan_placement(
                        {"instances": _our_instances(cluster.plan())},
                        capacity,
                        topo.current(),
                        get_strategy("liu", scale_in=False),
                        headroom_cores=HEADROOM,
                        dags=DAG,
                        scale_in=False,
                    )
                if plan is not None:
                    break
            assert plan is not None, "n1 never overloaded"
            assert "node n1 over capacity" in plan.reasons[0]
            # Stateless moves suffice here: the stateful worker stays untouched.
            assert plan.moves and all(not m.stateful for m in plan.moves)
            assert plan.affected_stateful_workers == ()
            summary = placement_summary(plan)

            result = TestbedMoveActuator(endpoint.url).execute(plan)
            assert result.executed and result.error is None
            assert sorted(result.moved) == sorted(m.instance for m in plan.moves)
            assert result.refused == {} and result.rolled_back == {}
            assert result.affected_workers == [f"{APP}-stateless-n1"]
            assert summary["affected_workers"] == len(result.affected_workers)
            for m in plan.moves:
                assert topo.placement()[m.instance] == (f"{APP}-stateless-{m.to_node}", m.to_node)

            # The target node's agent now reports the moved instances.
            moved = {m.instance: m.to_node for m in plan.moves}

            def reported_on_target():
                nodes = {
                    f"{i['app']}/{i['operator']}/{i['instance']}": i["node"]
                    for i in _our_instances(cluster.plan())
                }
                return all(nodes.get(k) == n for k, n in moved.items())

            _wait_for(reported_on_target, 20, "moved instances reported by their new node")
            stateless_n2 = node_roots["n2"] / APP / f"{APP}-stateless-n2"
            assert stateless_n2.is_dir(), "no instance cgroup under the target node's root"
            # Complete latencies reach the controller from the worker processes.
            latencies = [o["latency_ms"] for o in cluster.plan()["operators"] if o["app"] == APP]
            assert any(lat for lat in latencies), latencies
            print(json.dumps({"rate": step, "plan": summary, "result": result.to_dict()}))
        finally:
            endpoint.stop()
            stats = topo.stop(drain_timeout=60)
    assert stats.roots > 0 and stats.drained
    assert stats.lost == 0
    assert stats.duplicated == 0
    assert stats.completed == stats.roots
    words = sum(sum(s.values()) for s in topo.final_states().values())
    assert words == WORDS_PER_SENTENCE * stats.roots
