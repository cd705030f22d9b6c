"""Run one policy over one scenario and summarise what the applications saw.

Per QoS class: mean and p99 end-to-end latency (weighted by messages),
violation ratio (share of messages over the class target), over the whole run
and over phase II (from the burst's start); per epoch: CPU allocated per class
and mean latency per class. CPU allocated counts a capped instance's cap (at
most one core, a thread) for the epoch and an uncapped one's actual use; CPU
used counts what every instance burnt.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from testbed.sim.engine import ClusterSim, SinkRecords
from testbed.sim.policies import EpochObservation, Policy
from testbed.sim.scenario import Scenario


def weighted_quantile(values: np.ndarray, weights: np.ndarray, q: float) -> float:
    if len(values) == 0 or weights.sum() <= 0:
        return float("nan")
    order = np.argsort(values, kind="stable")
    cw = np.cumsum(weights[order])
    return float(values[order][np.searchsorted(cw, q * cw[-1])])


@dataclass
class ClassFigures:
    latency_ms_mean: float
    latency_ms_p99: float
    violation_ratio: float
    messages: int

    @classmethod
    def of(cls, lat_s: np.ndarray, count: np.ndarray, target_ms: float) -> ClassFigures:
        n = int(count.sum())
        if n == 0:
            return cls(float("nan"), float("nan"), float("nan"), 0)
        return cls(
            latency_ms_mean=float((lat_s * count).sum() / n * 1000),
            latency_ms_p99=weighted_quantile(lat_s, count, 0.99) * 1000,
            violation_ratio=float(count[lat_s * 1000 > target_ms].sum() / n),
            messages=n,
        )


@dataclass
class RunResult:
    policy: str
    classes: dict[str, ClassFigures]
    classes_phase2: dict[str, ClassFigures]
    cpu_allocated_core_seconds: float
    reconfigurations: int
    nodes_mean: float
    per_epoch: dict[str, Any]
    conservation: dict[str, int]
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "classes": {c: vars(f) for c, f in self.classes.items()},
            "classes_phase2": {c: vars(f) for c, f in self.classes_phase2.items()},
            "cpu_allocated_core_seconds": self.cpu_allocated_core_seconds,
            "reconfigurations": self.reconfigurations,
            "nodes_mean": self.nodes_mean,
            "per_epoch": self.per_epoch,
            "conservation": self.conservation,
            **self.extra,
        }


def observe(sim: ClusterSim, prev: dict[str, np.ndarray], epoch: int) -> EpochObservation:
    secs = sim.sc.epoch_seconds
    d = {k: getattr(sim, k) - prev[k] for k in prev}
    usage = d["cpu_seconds"] / secs
    return EpochObservation(
        epoch=epoch,
        seconds=secs,
        usage_cores=usage,
        busy_ratio=d["busy_seconds"] / secs,
        executed=d["executed"],
        received=d["received"],
        busy_seconds=d["busy_seconds"],
        queue=sim.queued.copy(),
        node_utilization=np.bincount(sim.node, usage, minlength=sim.sc.nodes) / sim.cores,
        source_rate=d["source_arrivals"] / secs,
    )


_COUNTERS = ("cpu_seconds", "busy_seconds", "executed", "received", "source_arrivals")


def run_policy(scenario: Scenario, policy: Policy) -> RunResult:
    sim = ClusterSim(scenario, max_parallelism=policy.max_parallelism)
    policy.setup(sim)
    classes = [c.name for c in scenario.qos] or sorted({a.qos_class for a in scenario.apps})
    targets = {c.name: c.target_latency_ms for c in scenario.qos}
    app_class = np.array([classes.index(a.qos_class) for a in scenario.apps])
    burst_starts = [a.burst.start_epoch for a in scenario.apps if a.burst is not None]
    phase2_from = (
        min(burst_starts) * scenario.epoch_seconds if burst_starts else scenario.duration_s
    )
    sinks: list[SinkRecords] = []
    cpu_alloc_by_class = np.zeros((scenario.epochs, len(classes)))
    lat_by_class = np.full((scenario.epochs, len(classes)), np.nan)
    nodes_used = []
    cap_changes = 0
    cpu_used = 0.0
    for e in range(scenario.epochs):
        prev = {k: getattr(sim, k).copy() for k in _COUNTERS}
        caps_before = sim.cap.copy()
        sim.run_steps(scenario.steps_per_epoch)
        obs = observe(sim, prev, e)
        alive = sim.alive
        capped = np.isfinite(sim.cap)
        alloc = np.where(
            capped, np.minimum(sim.cap, 1.0) * scenario.epoch_seconds, obs.usage_cores * obs.seconds
        )
        alloc = np.where(alive, alloc, 0.0)
        cls_of_inst = app_class[sim.op_app[sim.inst_op]]
        cpu_alloc_by_class[e] = np.bincount(cls_of_inst, alloc, minlength=len(classes))
        cpu_used += float(obs.usage_cores.sum() * obs.seconds)
        nodes_used.append(len(np.unique(sim.node[alive])))
        rec = sim.take_sinks()
        sinks.append(rec)
        if len(rec.count):
            c = app_class[rec.app]
            n = np.bincount(c, rec.count, minlength=len(classes))
            s = np.bincount(c, rec.count * rec.latency_s, minlength=len(classes))
            lat_by_class[e] = np.where(n > 0, s / np.maximum(n, 1) * 1000, np.nan)
        policy.on_epoch(sim, obs)
        cap_changes += int(np.sum(~np.isclose(caps_before, sim.cap) & alive))
    allrec = SinkRecords(
        *(
            np.concatenate([getattr(r, f) for r in sinks])
            for f in ("app", "count", "latency_s", "time_s")
        )
    )
    cls = app_class[allrec.app]
    late = allrec.time_s >= phase2_from
    figures = {
        c: ClassFigures.of(
            allrec.latency_s[cls == i], allrec.count[cls == i], targets.get(c, np.inf)
        )
        for i, c in enumerate(classes)
    }
    figures2 = {
        c: ClassFigures.of(
            allrec.latency_s[(cls == i) & late],
            allrec.count[(cls == i) & late],
            targets.get(c, np.inf),
        )
        for i, c in enumerate(classes)
    }
    conservation = {
        "source_arrivals": int(sim.source_arrivals.sum()),
        "finished_at_sinks": int(allrec.count.sum()),
        "in_system": sim.in_system(),
        "created_by_selectivity": int(sim.created),
    }
    return RunResult(
        policy=policy.name,
        classes=figures,
        classes_phase2=figures2,
        cpu_allocated_core_seconds=float(cpu_alloc_by_class.sum()),
        reconfigurations=int(sim.reconfigurations + cap_changes),
        nodes_mean=float(np.mean(nodes_used)),
        per_epoch={
            "cpu_allocated_cores": {
                c: (cpu_alloc_by_class[:, i] / scenario.epoch_seconds).round(4).tolist()
                for i, c in enumerate(classes)
            },
            "latency_ms_mean": {
                c: [None if np.isnan(x) else round(float(x), 3) for x in lat_by_class[:, i]]
                for i, c in enumerate(classes)
            },
        },
        conservation=conservation,
        extra={
            "rescales_and_moves": int(sim.reconfigurations),
            "cap_changes": cap_changes,
            # What the threads burnt, capped or not (CPU allocated counts caps).
            "cpu_used_core_seconds": cpu_used,
        },
    )
