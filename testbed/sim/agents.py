"""Simulated agents: NodeReports out of the simulator, CapDirectives back into it.

The controller is driven exactly as the gRPC server drives it: ``on_hello`` per
node, a sender attached per node (``controller.sessions.attach``), one
``on_report`` per node per slot with cumulative per-instance counters, and
``run_epoch``. Directives sent to a node's sender are kept and applied to the
simulator's caps; like a real agent, a directive older than the last applied
one is ignored and a directive naming an unknown instance is refused.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from dsched_pb import dsched_pb2 as pb
from testbed.sim.engine import ClusterSim

#: Simulated time 0 as a Unix time; reports carry base + simulated seconds.
CLOCK_BASE = 1_700_000_000.0
#: A simulated node's peak memory bandwidth (bytes/s): the scenario's bandwidth
#: fractions become bytes with it, as resctrl's mbm_total_bytes counts them.
NODE_PEAK_BANDWIDTH_BYTES_PER_SECOND = 20e9


def node_id(n: int) -> str:
    return f"sim-node-{n:04d}"


@dataclass
class DirectiveLog:
    applied: int = 0
    refused: int = 0
    stale: int = 0
    cap_changes: int = 0
    last_epoch: dict[str, int] = field(default_factory=dict)


class SimAgents:
    """All nodes' agents of one simulated cluster, attached to one controller."""

    def __init__(self, sim: ClusterSim, controller, clock_base: float = CLOCK_BASE):
        self.sim = sim
        self.controller = controller
        self.clock_base = clock_base
        self.slot = 0
        self.log = DirectiveLog()
        # Each instance's bandwidth counter at the last report (resctrl's counters
        # are cumulative; the agent reports the rate over the slot).
        self._mbw_last = np.zeros(sim.n_inst)
        self._inbox: dict[str, list[pb.ControllerMessage]] = {}
        sc = sim.sc
        self._op_index = {
            (sc.apps[a].name, op.name): i
            for i, (a, op) in enumerate(
                (a, op) for a, app in enumerate(sc.apps) for op in app.operators
            )
        }
        self._upstream = [
            ()
            if sim.op_stage[i] == 0
            else (sc.apps[sim.op_app[i]].operators[sim.op_stage[i] - 1].name,)
            for i in range(sim.n_ops)
        ]
        for n in range(sc.nodes):
            nid = node_id(n)
            controller.on_hello(
                pb.Hello(
                    node_id=nid,
                    cpu_capacity_cores=float(sim.cores[n]),
                    cgroup_mode=pb.CGROUP_V1,
                    counters_available=["throttling", "memory_bandwidth"],
                    agent_version="sim",
                    slot_seconds=sc.epoch_seconds,
                )
            )
            self._inbox[nid] = []
            controller.sessions.attach(nid, self._inbox[nid].append)

    def now(self) -> float:
        return self.clock_base + self.sim.t

    def instance_index(self, app: str, operator: str, instance: int) -> int | None:
        op = self._op_index.get((app, operator))
        if op is None or not 0 <= instance < self.sim.max_par:
            return None
        return op * self.sim.max_par + instance

    def send_reports(self) -> None:
        sim, sc = self.sim, self.sim.sc
        self.slot += 1
        alive = np.flatnonzero(sim.alive)
        by_node: dict[int, list[pb.InstanceSample]] = {n: [] for n in range(sc.nodes)}
        usage = sim.cpu_seconds  # cumulative; the controller differentiates
        for i in alive.tolist():
            op = int(sim.inst_op[i])
            app = sc.apps[int(sim.op_app[op])]
            cap = float(sim.cap[i])
            sample = pb.InstanceSample(
                key=pb.InstanceKey(
                    app=app.name,
                    operator=app.operators[sim.op_stage[op]].name,
                    instance=int(sim.inst_rank[i]),
                ),
                worker=f"w{int(sim.op_stateful[op])}",
                stateful=bool(sim.op_stateful[op]),
                cpu_seconds_total=float(usage[i]),
                cpu_usage_cores=float(sim.last_alloc[i]),
                received_total=int(sim.received[i]),
                executed_total=int(sim.executed[i]),
                emitted_total=int(sim.emitted[i]),
                queue_length=int(sim.queued[i]),
                latency_sum_seconds_total=float(sim.latency_sum[i]),
                latency_count_total=int(sim.latency_count[i]),
                service_seconds_total=float(sim.busy_seconds[i]),
                throttled_seconds_total=float(sim.throttled_seconds[i]),
                upstream=list(self._upstream[op]),
            )
            if np.isfinite(cap):
                sample.cap_cores = cap
            by_node[int(sim.node[i])].append(sample)
        # Like an agent with resctrl: one monitoring group per application, its
        # bytes over the slot divided by the slot. The simulator's bandwidth use
        # is a fraction of a node's bandwidth per core-second.
        delta = sim.mbw_seconds - self._mbw_last
        self._mbw_last = sim.mbw_seconds.copy()
        app_of = sim.op_app[sim.inst_op]
        n_apps = len(sc.apps)
        per = np.bincount(sim.node * n_apps + app_of, delta, minlength=sc.nodes * n_apps).reshape(
            sc.nodes, n_apps
        )
        scale = NODE_PEAK_BANDWIDTH_BYTES_PER_SECOND / (sc.epoch_seconds * sim.cores)
        bytes_per_s = per * scale[:, None]
        for n, samples in by_node.items():
            groups = {sc.apps[a].name: float(bytes_per_s[n, a]) for a in np.flatnonzero(per[n] > 0)}
            self.controller.on_report(
                pb.NodeReport(
                    node_id=node_id(n),
                    slot=self.slot,
                    timestamp=self.now(),
                    slot_seconds=sc.epoch_seconds,
                    instances=samples,
                    node=pb.NodeSample(
                        cpu_capacity_cores=float(sim.cores[n]),
                        cpu_usage_cores=float(sim.last_alloc[sim.node == n].sum()),
                        memory_bandwidth_available=True,
                        memory_bandwidth_bytes_per_second=groups,
                    ),
                )
            )

    def apply_directives(self) -> int:
        """Apply what the controller sent since the last call; returns caps applied."""
        applied = 0
        for nid, inbox in self._inbox.items():
            msgs, inbox[:] = list(inbox), []
            for msg in msgs:
                if not msg.HasField("directive"):
                    continue
                d = msg.directive
                if d.epoch < self.log.last_epoch.get(nid, 0):
                    self.log.stale += 1
                    continue
                self.log.last_epoch[nid] = d.epoch
                idx, caps = [], []
                for c in d.caps:
                    i = self.instance_index(c.key.app, c.key.operator, c.key.instance)
                    if i is None or not np.isfinite(c.cap_cores) or c.cap_cores < 0:
                        self.log.refused += 1
                        continue
                    idx.append(i)
                    caps.append(c.cap_cores)
                if idx:
                    old = self.sim.cap[idx].copy()
                    self.sim.set_caps(np.array(idx), np.array(caps))
                    self.log.cap_changes += int(np.sum(~np.isclose(old, self.sim.cap[idx])))
                    applied += len(idx)
        self.log.applied += applied
        return applied
