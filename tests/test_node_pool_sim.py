"""The simulator's node pool: the production controller, fed by simulated agents,
adds a node when the cluster is short of CPU, and the new node takes load."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from controller.config import NodePoolConfig
from controller.edges.nodepool import NodeChange
from testbed.sim.agents import node_id
from testbed.sim.engine import ClusterSim
from testbed.sim.nodepool import attach_node_pool, spread_onto
from testbed.sim.policies import DschedPolicy
from testbed.sim.run import observe
from testbed.sim.scenario import seed004

COUNTERS = ("cpu_seconds", "busy_seconds", "executed", "received", "source_arrivals")


def short_of_cpu(epochs: int = 10):
    # Phase I uses 90 % of 4 cores; from epoch 1 bursts take the demand well beyond.
    return seed004(
        apps=12,
        arrivals="poisson",
        epochs=epochs,
        nodes=2,
        cores=4.0,
        phase1_utilization=0.9,
        burst_start=1,
        burst_end=2,
        seed=3,
    )


@pytest.fixture
def elastic():
    sc = short_of_cpu()
    policy = DschedPolicy()
    sim = ClusterSim(sc, max_parallelism=1)
    policy.setup(sim)
    ctl = policy.controller
    ctl.allocator.node_cost = 1.0
    ctl.node_pool.config = NodePoolConfig(cooldown_seconds=3 * sc.epoch_seconds, max_nodes=3)
    pool = attach_node_pool(ctl, sim, policy.agents)
    yield sc, sim, policy, pool
    policy.close()


def run_epochs(sc, sim, policy, epochs):
    rows = []
    for e in range(epochs):
        prev = {k: getattr(sim, k).copy() for k in COUNTERS}
        sim.run_steps(sc.steps_per_epoch)
        policy.on_epoch(sim, observe(sim, prev, e))
        rows.append(policy.controller.last_record["node_pool_action"])
    return rows


def test_a_node_added_in_the_simulation_takes_load(elastic):
    sc, sim, policy, pool = elastic
    rows = run_epochs(sc, sim, policy, 3)
    added = [r for r in rows if r["action"] == "add"]
    assert len(added) == 1 and added[0]["outcome"] == "done", rows
    assert added[0]["strategy"] == "sim" and added[0]["node"] == node_id(2)
    assert len(sim.cores) == 3 and sim.sc.nodes == 3 and pool.moves > 0
    # The cool-down holds the next add although the DP still asks for one.
    after = rows[rows.index(added[0]) + 1 :]
    assert after and all(r["outcome"] == "held" for r in after if r["recommended"] == "add")
    on_new = sim.node == 2
    before = sim.cpu_seconds[on_new].sum()
    run_epochs(sc, sim, policy, 2)
    assert sim.cpu_seconds[sim.node == 2].sum() > before + 0.5  # core-seconds done there
    ctl = policy.controller
    assert node_id(2) in ctl.node_capacity()
    # The controller caps the instances now on the new node, from that node's reports.
    rec = ctl.last_record
    assert any(i["node"] == node_id(2) and i["cap_cores"] > 0 for i in rec["instances"])
    assert not policy.failed_epochs and not ctl.cluster.rejected


def test_max_nodes_stops_the_simulated_cluster_growing(elastic):
    sc, sim, policy, _ = elastic
    rows = run_epochs(sc, sim, policy, 8)
    assert len(sim.cores) == 3
    assert any("max_nodes" in r["reason"] for r in rows)


def test_removing_a_simulated_node_moves_its_instances_first(elastic):
    sc, sim, policy, pool = elastic
    run_epochs(sc, sim, policy, 1)
    change = NodeChange("add", 1, (node_id(0), node_id(1)), None, "test")
    pool.add(change)
    assert np.any(sim.alive & (sim.node == 2))
    res = pool.remove(NodeChange("remove", 2, tuple(map(node_id, range(3))), node_id(0), "test"))
    assert res.outcome == "done" and res.node == node_id(2)
    assert "least loaded" in res.reason
    assert len(sim.cores) == 2 and not np.any(sim.node >= 2)
    assert node_id(2) not in policy.controller.node_capacity()
    rows = run_epochs(sc, sim, policy, 2)  # the cluster keeps running on two nodes
    assert rows and not policy.failed_epochs


def test_a_new_node_takes_the_lightest_classes_first():
    """Told the apps' class weights, the pool moves the heaviest class last: each
    move pauses an instance. Without weights it moves the largest stateless ones."""
    sc = short_of_cpu()
    weight = {"gold": 8.0, "silver": 3.0, "bronze": 1.0}
    moved_class = {}
    for weighted in (False, True):
        policy = DschedPolicy()
        sim = ClusterSim(sc, max_parallelism=1)
        policy.setup(sim)
        try:
            run_epochs(sc, sim, policy, 1)
            # Gold's instances the busiest: an unweighted spread takes them first.
            gold = np.array([sc.apps[sim.op_app[op]].qos_class == "gold" for op in sim.inst_op])
            sim.work_rate[:] = np.where(gold, 0.4, 0.1)
            weights = {a.name: weight[a.qos_class] for a in sc.apps} if weighted else None
            before = sim.node.copy()
            n = sim.add_node(4.0)
            assert spread_onto(sim, n, weights) > 0
            moved = np.flatnonzero(sim.node != before)
            moved_class[weighted] = Counter(
                sc.apps[sim.op_app[sim.inst_op[i]]].qos_class for i in moved
            )
        finally:
            policy.close()
    plain, weighted = moved_class[False], moved_class[True]
    assert weighted["gold"] < plain["gold"], moved_class
    assert weighted["bronze"] > plain["bronze"], moved_class


def test_engine_node_hooks_check_their_input():
    sim = ClusterSim(short_of_cpu(), max_parallelism=1)
    with pytest.raises(ValueError, match="cores"):
        sim.add_node(0.0)
    n = sim.add_node(3.0)
    assert n == 2 and sim.cores[n] == 3.0 and sim.sc.nodes == 3
    sim.set_parallelism(0, 1, [n], pause=False)
    sim.move(0, n)
    with pytest.raises(ValueError, match="still runs"):
        sim.remove_last_node()
    sim.move(0, 0)
    sim.remove_last_node()
    with pytest.raises(ValueError, match="node must be"):
        sim.move(0, 2)
    sim.remove_last_node()
    with pytest.raises(ValueError, match="last node"):
        sim.remove_last_node()
