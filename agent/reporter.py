"""The reporter: what the agent tells the controller.

``hello()`` opens each stream (what this node is, what it can measure, the caps
already in force); ``report()`` builds one NodeReport a slot from the registry
(who runs where, their counters), the sampler (CPU) and the enforcer (caps,
throttling). Reports produced while disconnected wait in the link's buffer.
docs/agent.md, "Counters", describes every field.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from agent import __version__
from agent.config import AgentConfig
from agent.cpu_sampler import CpuSampler
from agent.enforcer import CapEnforcer
from agent.registry import Registry
from dsched.ids import InstanceKey
from dsched_pb import dsched_pb2 as pb

CGROUP_MODE_PB = {"v1": pb.CGROUP_V1, "v2": pb.CGROUP_V2, "none": pb.CGROUP_NONE}


def pb_key(key: InstanceKey) -> pb.InstanceKey:
    return pb.InstanceKey(app=key.app, operator=key.operator, instance=key.instance)


@dataclass(eq=False)
class Reporter:
    """Slots are numbered from 1; the first slot starts when the reporter is built."""

    config: AgentConfig
    registry: Registry
    sampler: CpuSampler
    enforcer: CapEnforcer
    slot: int = field(default=0, init=False)
    _slot_started: float = field(default_factory=time.monotonic, init=False, repr=False)

    def counters_available(self) -> list[str]:
        names = self.sampler.counters_available()
        if self.enforcer.backend.mode != "none":
            names.append("throttling")
        return names

    def hello(self) -> pb.Hello:
        # The same caps a report claims: none in dry-run, where nothing is enforced.
        current = [
            pb.InstanceCap(key=pb_key(key), cap_cores=cap)
            for key, cap in self.enforcer.enforced_caps()
        ]
        return pb.Hello(
            node_id=self.config.node_id,
            cpu_capacity_cores=self.sampler.capacity_cores,
            cgroup_mode=CGROUP_MODE_PB[self.enforcer.backend.mode],
            counters_available=self.counters_available(),
            agent_version=__version__,
            dry_run=self.config.dry_run,
            current_caps=current,
            slot_seconds=self.config.slot_seconds,
        )

    def report(self) -> pb.NodeReport:
        """The NodeReport for the slot that ends now; starts the next slot."""
        now = time.monotonic()
        elapsed = max(now - self._slot_started, 1e-9)
        self._slot_started = now
        self.slot += 1
        out = pb.NodeReport(
            node_id=self.config.node_id,
            slot=self.slot,
            timestamp=time.time(),
            slot_seconds=self.config.slot_seconds,
        )
        records = sorted(self.registry.snapshot(), key=lambda r: r.key)
        instances_cores = 0.0
        for rec in records:
            total, usage = self.sampler.end_slot(rec.key, now, elapsed)
            instances_cores += usage
            c = rec.counters
            # add() builds the sample in place; append() would copy it.
            sample = out.instances.add(
                key=pb_key(rec.key),
                worker=rec.worker,
                stateful=rec.stateful,
                tids=sorted(rec.tids),
                pid=rec.pid,
                cpu_seconds_total=total,
                cpu_usage_cores=usage,
                received_total=c.received,
                executed_total=c.executed,
                emitted_total=c.emitted,
                queue_length=c.queue_length,
                latency_sum_seconds_total=c.latency_sum_seconds,
                latency_count_total=c.latency_count,
                service_seconds_total=c.service_seconds,
                upstream=list(rec.upstream),
                engine=rec.engine,
            )
            cap, throttling = self.enforcer.enforced(rec.key)
            # A dry run enforces nothing, so it claims no cap (nor does its Hello).
            if cap is not None and self.enforcer.claims():
                sample.cap_cores = cap
            if throttling is not None:
                sample.periods_total = throttling.periods_total
                sample.throttled_periods_total = throttling.throttled_periods_total
                sample.throttled_seconds_total = throttling.throttled_seconds_total
        out.node.CopyFrom(self.sampler.node_sample(records, instances_cores))
        return out
