"""The simulator's node pool: the controller's node changes carried out in the
simulated cluster (``controller.edges.nodepool.NodePool``).

``add`` makes a node join (:meth:`ClusterSim.add_node`), says Hello for it to the
controller as its agent would and opens its directive stream, then moves the
work that the busiest nodes have above the cluster's mean onto it, as an
engine's rebalance after a node joins would (each moved instance pauses for its
migration). ``remove`` takes the newest node away: its instances move to the
least loaded nodes first, then its agent disconnects. Both are instantaneous
in simulated time, so the pool runs on the epoch's thread and a run stays
reproducible for one seed.

    pool = attach_node_pool(controller, sim, agents)   # after SimAgents(sim, controller)
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from controller.edges.nodepool import NodeChange, NodeChangeResult
from dsched_pb import dsched_pb2 as pb
from testbed.sim.agents import SimAgents, node_id
from testbed.sim.engine import ClusterSim


class SimNodePool:
    """Adds and removes simulated nodes of ``node_cores`` cores (default: the
    scenario's cores per node)."""

    name = "sim"
    blocking = False

    def __init__(
        self, sim: ClusterSim, agents: SimAgents, controller, node_cores: float | None = None
    ):
        self.sim = sim
        self.agents = agents
        self.controller = controller
        self.node_cores = float(node_cores or sim.sc.cores_per_node)
        self.added = 0
        self.removed = 0
        self.moves = 0

    # ------------------------------------------------------------ load
    def _demand(self) -> np.ndarray:
        """Cores each instance slot wants: the work arriving at it, smoothed."""
        return np.where(self.sim.alive, self.sim.work_rate, 0.0)

    def _node_load(self, demand: np.ndarray) -> np.ndarray:
        return np.bincount(self.sim.node, demand, minlength=len(self.sim.cores))

    # ------------------------------------------------------------ NodePool
    def add(self, change: NodeChange) -> NodeChangeResult:
        sim = self.sim
        n = sim.add_node(self.node_cores)
        nid = node_id(n)
        self.controller.on_hello(
            pb.Hello(
                node_id=nid,
                cpu_capacity_cores=self.node_cores,
                cgroup_mode=pb.CGROUP_V1,
                counters_available=["throttling", "memory_bandwidth"],
                agent_version="sim",
                slot_seconds=sim.sc.epoch_seconds,
            )
        )
        # SimAgents applies what arrives in its inboxes; the new node gets one.
        inbox = self.agents._inbox.setdefault(nid, [])
        inbox.clear()
        self.controller.sessions.attach(nid, inbox.append)
        moved = self._fill(n, change.weights)
        self.added += 1
        return NodeChangeResult(
            "done",
            f"node {nid} joined with {self.node_cores:g} cores; {moved} instance(s) moved to it",
            nid,
        )

    def _fill(self, new: int, weights: Mapping[str, float]) -> int:
        moved = spread_onto(self.sim, new, weights)
        self.moves += moved
        return moved

    def remove(self, change: NodeChange) -> NodeChangeResult:
        sim = self.sim
        last = len(sim.cores) - 1
        nid = node_id(last)
        if last == 0:
            return NodeChangeResult(
                "refused", "the simulated cluster's last node cannot leave", nid
            )
        demand = self._demand()
        load = self._node_load(demand)[:last]
        leaving = np.flatnonzero(sim.alive & (sim.node == last)).tolist()
        for i in leaving:
            dest = int(np.argmin(load / sim.cores[:last]))
            sim.move(i, dest)
            load[dest] += demand[i]
        moved = len(leaving)
        self.moves += moved
        sim.remove_last_node()

        def closed(_msg: pb.ControllerMessage) -> None:
            pass

        # Whatever sender the node had, its stream ends with it.
        self.controller.sessions.attach(nid, closed)
        self.controller.sessions.detach(nid, closed)
        self.controller.on_disconnect(nid)
        self.removed += 1
        why = f"node {nid} left"
        if change.node is not None and change.node != nid:
            why += f" (the newest node; {change.node} was the least loaded)"
        return NodeChangeResult(
            "done", why + (f", {moved} instance(s) moved off it" if moved else ""), nid
        )

    def close(self) -> None:
        pass


def attach_node_pool(
    controller, sim: ClusterSim, agents: SimAgents, node_cores: float | None = None
) -> SimNodePool:
    """Let ``controller``'s node pool act on ``sim`` (its ``[node_pool]`` gates still apply)."""
    pool = SimNodePool(sim, agents, controller, node_cores)
    controller.node_pool.use(pool)
    return pool


def spread_onto(sim: ClusterSim, new: int, weights: Mapping[str, float] | None = None) -> int:
    """Move instances from the busiest nodes to node ``new`` while that narrows the
    gap to the mean load per core, stateless ones first (as an engine's rebalance
    after a node joins); the instances moved.

    ``weights`` (app -> QoS class weight, from the controller's change) puts the
    lightest classes first: each move pauses the instance moved."""
    demand = np.where(sim.alive, sim.work_rate, 0.0)
    weights = weights or {}
    app_weight = [weights.get(a.name, 0.0) for a in sim.sc.apps]
    load = np.bincount(sim.node, demand, minlength=len(sim.cores))
    target = load.sum() / sim.cores.sum() * sim.cores[new]
    moved = 0
    while True:
        util = load / sim.cores
        util[new] = -np.inf
        src = int(np.argmax(util))
        on = np.flatnonzero(sim.active & (sim.node == src) & (demand > 0))
        if not len(on) or util[src] <= load[new] / sim.cores[new]:
            return moved
        order = sorted(
            on.tolist(),
            key=lambda i: (
                app_weight[sim.op_app[sim.inst_op[i]]],
                bool(sim.op_stateful[sim.inst_op[i]]),
                -demand[i],
            ),
        )
        pick = next((i for i in order if load[new] + demand[i] <= target + 1e-9), None)
        if pick is None:
            return moved
        sim.move(pick, new)
        load[src] -= demand[pick]
        load[new] += demand[pick]
        moved += 1
