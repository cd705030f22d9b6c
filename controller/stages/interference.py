"""Memory-bandwidth interference in the CPU cost per tuple ("QoS-aware CPU cap
adjustment for timely data-flow", §3.2 "Shared resource interference" and the
slowdown it quantifies from the memory-bandwidth utilisation MBW_util).

Agents with resctrl report each application's memory bandwidth on their node
(bytes/s over the last slot, ``NodeSample.memory_bandwidth_bytes_per_second``);
divided by the node's peak bandwidth (config
``memory_bandwidth_peak_bytes_per_second``) it is the node's utilisation u,
and :class:`predict.interference.InterferenceModel` turns u into a slowdown
s(u) >= 1 of every CPU-second spent there.

An operator's measured kappa (CPU-seconds per tuple over its instances) already
holds the slowdowns its instances met, averaged over their tuples -- with
round-robin dispatch, an equal share each. What it hides is that an instance on
a saturated node pays s_n times the base cost while one on a quiet node pays
the base cost: sized by the mean, the first is starved and its queue (and the
tail of the whole operator) grows, the second is over-provisioned. So each
instance's kappa is the operator's times ``s_n / mean over its instances of
s``: the mean cost stays the measured one (nothing is counted twice), and the
CPU moves to where the tuples cost more.

Nothing is invented: a node without a bandwidth counter, or with no peak
configured, has no utilisation; its instances are not corrected, and neither
are the other instances of an operator that has one there (their mean would
need it). The record says which nodes were corrected by what factor and which
were "unavailable", and why.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from controller.stages.evaluate import OperatorView
from dsched.ids import InstanceKey, OperatorKey
from predict.interference import InterferenceModel

UNAVAILABLE_COUNTER = "unavailable: no memory-bandwidth counter"
UNAVAILABLE_PEAK = "unavailable: memory_bandwidth_peak_bytes_per_second not configured"
OFF = "off"


@dataclass
class Interference:
    """Per instance: the factor on its operator's kappa (only those != 1); per node:
    what was done and why, and the utilisation and slowdown behind it."""

    factors: dict[InstanceKey, float] = field(default_factory=dict)
    nodes: dict[str, str] = field(default_factory=dict)
    utilization: dict[str, float] = field(default_factory=dict)
    slowdown: dict[str, float] = field(default_factory=dict)

    def record(self) -> dict[str, dict[str, float | str | None]]:
        return {
            n: {
                "state": state,
                "utilization": self.utilization.get(n),
                "slowdown": self.slowdown.get(n),
            }
            for n, state in sorted(self.nodes.items())
        }


def node_utilization(
    bandwidth: Mapping[str, float | None], peak_bytes_per_second: float
) -> tuple[dict[str, float], dict[str, str]]:
    """(utilisation per node that has one, reason per node that has none)."""
    util: dict[str, float] = {}
    missing: dict[str, str] = {}
    for node, bw in bandwidth.items():
        if bw is None:
            missing[node] = UNAVAILABLE_COUNTER
        elif not peak_bytes_per_second > 0:
            missing[node] = UNAVAILABLE_PEAK
        else:
            util[node] = max(0.0, float(bw)) / peak_bytes_per_second
    return util, missing


def interference_factors(
    views: Mapping[OperatorKey, OperatorView],
    bandwidth: Mapping[str, float | None],
    peak_bytes_per_second: float,
    model: InterferenceModel,
    enabled: bool = True,
    nodes: Iterable[str] | None = None,
) -> Interference:
    """The correction of every instance's kappa from its node's bandwidth. Pure.

    ``bandwidth``: node -> bytes/s over the last slot, summed over the node's
    resctrl groups, or None where the node has no counter. ``nodes``: every node
    to account for (default: those the views place instances on); one that
    ``bandwidth`` lacks counts as None."""
    if nodes is None:
        nodes = {n for v in views.values() for n in v.nodes.values()}
    every = {**dict.fromkeys(nodes), **bandwidth}
    out = Interference()
    if not enabled:
        out.nodes = dict.fromkeys(every, OFF)
        return out
    util, missing = node_utilization(every, peak_bytes_per_second)
    slow = {n: model.slowdown(u) for n, u in util.items()}
    out.utilization, out.slowdown = util, slow
    out.nodes.update(missing)
    saturated = {n for n, s in slow.items() if s > 1.0}
    if saturated:
        for view in views.values():
            nodes = [view.nodes[k] for k in view.instances]
            if not any(n in saturated for n in nodes) or any(n not in slow for n in nodes):
                continue
            mean = sum(slow[n] for n in nodes) / len(nodes)
            for k, n in zip(view.instances, nodes, strict=True):
                f = slow[n] / mean
                if f != 1.0:
                    out.factors[k] = f
    for n, s in slow.items():
        out.nodes[n] = f"applied {s:.3f}" if s > 1.0 else "applied 1.000 (below threshold)"
    return out
