"""The simulator's parallelism actuator: the controller's instance-count decisions
carried out in the simulated cluster (``controller.edges.parallelism``).

A raise starts the new instances on the nodes with the most room (work arriving
per core, smoothed); a lower stops the highest-numbered instances, which drain
their queues before they go (:meth:`ClusterSim.set_parallelism`). Either way
the operator pauses as for a rescale. Changes are instantaneous in simulated
time, so a run stays reproducible for one seed.

    actuator = attach_parallelism(controller, sim, agents)   # after SimAgents(sim, controller)
"""

from __future__ import annotations

import numpy as np

from controller.edges.parallelism import ParallelismChange
from dsched.ids import OperatorKey
from testbed.sim.agents import SimAgents
from testbed.sim.engine import ClusterSim


class SimParallelism:
    name = "sim"

    def __init__(self, sim: ClusterSim, agents: SimAgents):
        self.sim = sim
        self.agents = agents
        self.raised = 0
        self.lowered = 0

    def _op(self, key: OperatorKey) -> int | None:
        return self.agents._op_index.get((key.app, key.operator))

    def apply(self, changes: list[ParallelismChange]) -> dict[OperatorKey, str | None]:
        sim = self.sim
        load = np.bincount(sim.node, np.where(sim.alive, sim.work_rate, 0.0), len(sim.cores))
        out: dict[OperatorKey, str | None] = {}
        for c in changes:
            op = self._op(c.key)
            if op is None:
                out[c.key] = "the simulation has no such operator"
                continue
            if not 1 <= c.decided <= sim.max_par:
                out[c.key] = f"the simulation runs 1 to {sim.max_par} instances per operator"
                continue
            k_old = int(sim.op_k[op])
            slots = sim.slots_of(op)
            nodes = [int(sim.node[s]) for s in slots[:k_old]]
            per = float(sim.work_rate[slots[:k_old]].sum()) / max(1, c.decided)
            for _ in range(c.decided - k_old):
                n = int(np.argmin(load / sim.cores))
                nodes.append(n)
                load[n] += per
            sim.set_parallelism(op, c.decided, nodes)
            if c.decided > k_old:
                self.raised += 1
            elif c.decided < k_old:
                self.lowered += 1
            out[c.key] = None
        return out


def attach_parallelism(controller, sim: ClusterSim, agents: SimAgents) -> SimParallelism:
    """Let ``controller``'s parallelism decisions act on ``sim``."""
    actuator = SimParallelism(sim, agents)
    controller.parallelism.use(actuator)
    return actuator
