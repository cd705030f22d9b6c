"""Live placement on two "nodes": the controller daemon plans and moves by itself.

Each node is a `dsched-agent` subprocess with its own cgroup root and a
configured ``capacity_cores``, which the agent writes as the root's CFS quota,
so the instances of a node share a real CPU budget. WordCount runs in worker
processes registered with the agents. The controller runs in enforce mode with
``placement = "liu"`` and ``move_actuator = "testbed"``; its ``move_url`` is
the testbed's move endpoint, started first (the topology is attached to it
once the agents run). The test only raises the input rate: planning, the
move and its report in the decision record are the controller's own.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from dsched_pb import dsched_pb2 as pb
from testbed.demo import placement_figure
from testbed.live.actuator import MoveEndpoint
from testbed.live.cluster import LocalCluster, NodeSpec, remove_cgroup_tree
from testbed.live.distributed import DistributedTopology, worker_id
from testbed.live.wordcount import WORDS_PER_SENTENCE, wordcount

pytestmark = pytest.mark.slow

APP = "lpwc"
NODE_CORES = 0.6
HEADROOM = 0.1
# Every instance's demand is at least this, so the six instances always need
# more than one node's usable 0.5 cores: no node can ever be emptied, and the
# only plan the controller can make is the one under test (an overload). The
# five instances on n1 need 0.425 of its 0.5 cores at least.
MIN_CAP = 0.085
PERIOD_US = 100_000
START_RATE = 30.0


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


def _plans(cluster: LocalCluster) -> list[dict]:
    """Decision records that report a finished placement plan."""
    return [r for r in cluster.decisions() if (r.get("placement") or {}).get("planned")]


def test_controller_sheds_only_stateless_instances_of_an_overloaded_node(tmp_path, node_roots):
    endpoint = MoveEndpoint().start()
    cluster = LocalCluster(
        tmp_path,
        mode="enforce",
        slot_seconds=1.0,
        controller_config={
            "headroom_cores": HEADROOM,
            "min_cap_cores": MIN_CAP,
            "placement": "liu",
            "move_actuator": "testbed",
            "move_url": endpoint.url,
        },
        nodes=[
            NodeSpec(n, cgroup_root=root.name, extra_config={"capacity_cores": NODE_CORES})
            for n, root in node_roots.items()
        ],
    )
    rate = {"roots_per_second": START_RATE}
    try:
        with cluster:
            topo = DistributedTopology(
                wordcount(app=APP, parallelism=2, split_ms=3.0, count_ms=0.3),
                lambda t: rate["roots_per_second"],
                nodes={n: str(a.socket) for n, a in cluster.agents.items()},
                placement={f"{APP}/count/1": "n2"},
            )
            topo.start()
            endpoint.attach(topo)
            before = topo.placement()
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

                # Raise the rate until the controller itself has planned and moved.
                reported = []
                for step in (START_RATE, 60.0, 90.0, 120.0, 150.0):
                    rate["roots_per_second"] = step
                    deadline = time.monotonic() + 10
                    while not reported and time.monotonic() < deadline:
                        time.sleep(0.5)
                        reported = _plans(cluster)
                    if reported:
                        break
                assert reported, "the controller never planned a move"
                # Back to the start rate: no further overload while the move settles.
                rate["roots_per_second"] = START_RATE

                record = reported[0]
                placement = record["placement"]
                assert placement["strategy"] == "liu"
                assert placement["actuator"] == "testbed"
                assert any("node n1 over capacity" in r for r in placement["reasons"])
                # Stateless moves suffice: the stateful worker stays untouched.
                moves = placement["moves"]
                assert moves and all(not m["stateful"] for m in moves)
                assert {m["from_node"] for m in moves} == {"n1"}
                assert {m["to_node"] for m in moves} == {"n2"}
                assert placement["stateful_moves"] == 0
                assert placement["affected_stateful_workers"] == 0
                result = placement["result"]
                assert result["executed"] and result["error"] is None
                assert sorted(result["moved"]) == sorted(m["instance"] for m in moves)
                assert result["refused"] == {} and result["rolled_back"] == {}
                assert result["affected_workers"] == [worker_id(APP, "n1", stateful=False)]
                assert placement["affected_workers"] == len(result["affected_workers"]) == 1

                moved = {m["instance"] for m in moves}
                after = topo.placement()
                for iid, (worker, node) in after.items():
                    if iid in moved:
                        assert (worker, node) == (worker_id(APP, "n2", stateful=False), "n2")
                    else:
                        assert (worker, node) == before[iid], f"{iid} moved without a plan"

                # The target node's agent now reports the moved instances.
                def reported_on_target():
                    nodes = {
                        f"{i['app']}/{i['operator']}/{i['instance']}": i["node"]
                        for i in _our_instances(cluster.plan())
                    }
                    return all(nodes.get(k) == "n2" for k in moved)

                _wait_for(reported_on_target, 20, "moved instances reported by their new node")
                # Its instance cgroups come with the first caps for the moved
                # instances, up to a slot after their first report there.
                stateless_n2 = node_roots["n2"] / APP / worker_id(APP, "n2", stateful=False)
                _wait_for(
                    stateless_n2.is_dir, 20, "an instance cgroup under the target node's root"
                )
                # Complete latencies reach the controller from the worker processes.
                latencies = [
                    o["latency_ms"] for o in cluster.plan()["operators"] if o["app"] == APP
                ]
                assert any(lat for lat in latencies), latencies
                figure = placement_figure(cluster.decisions())
            finally:
                stats = topo.stop(drain_timeout=60)
    finally:
        endpoint.stop()
    # The demo's placement figure reads the same count from the decision records.
    assert figure["affected_workers"] == 1 and figure["stateful_moves"] == 0
    assert [p["planned_in_epoch"] for p in figure["plans"]] == [placement["epoch"]]
    print(json.dumps({"rate": step, "placement": figure, "tuples": stats.roots}))
    assert stats.roots > 0 and stats.drained
    assert stats.lost == 0
    assert stats.duplicated == 0
    assert stats.completed == stats.roots
    assert topo.stray_acks == 0
    words = sum(sum(s.values()) for s in topo.final_states().values())
    assert words == WORDS_PER_SENTENCE * stats.roots
