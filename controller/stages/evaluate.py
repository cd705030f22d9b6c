"""Stage 1 of the epoch: what each operator did over the last phi slots.

The reports of an operator's instances are summed per slot into an
:class:`OperatorView`, the input of every later stage. Pure: it reads the
observed cluster and returns new values.
"""

from __future__ import annotations

from collections.abc import Container, Mapping
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from controller.model import InstanceHistory
from dsched.ids import InstanceKey, OperatorKey


@dataclass
class OperatorView:
    """An operator over the last phi slots, summed over its instances."""

    key: OperatorKey
    instances: list[InstanceKey]
    nodes: dict[InstanceKey, str]
    stateful: bool
    upstream: tuple[str, ...]
    seconds: np.ndarray  # slot lengths
    arrivals: np.ndarray  # tuples/s per slot
    executed: np.ndarray  # tuples/s per slot
    emitted: np.ndarray  # tuples/s per slot
    cpu_seconds: np.ndarray  # CPU-seconds per slot
    queue: np.ndarray  # tuples waiting at each slot's end
    queue_by_instance: dict[InstanceKey, float]
    usage_by_instance: dict[InstanceKey, float]
    cap_by_instance: dict[InstanceKey, float | None]  # the cap in force during the last slot
    throttled_by_instance: dict[InstanceKey, float | None]  # seconds throttled in the last slot
    latency_ms: float | None  # mean end-to-end latency of tuples finished here, last slot
    service_ms: float | None  # mean processing time per tuple, over the window
    last_timestamp: float = 0.0  # end of the newest slot

    @property
    def usage_cores(self) -> float:
        return float(sum(self.usage_by_instance.values()))

    @property
    def selectivity(self) -> float:
        """Tuples emitted per tuple executed (rho: emitted / executed), over the window."""
        done = float(self.executed @ self.seconds)
        return float(self.emitted @ self.seconds) / done if done > 0 else 0.0

    @property
    def queue_change(self) -> float:
        """Mean change of the queue per second over the window (delta in the load model)."""
        if len(self.queue) < 2:
            return 0.0
        return float((self.queue[-1] - self.queue[0]) / max(self.seconds[1:].sum(), 1e-9))


class Observed(Protocol):
    """What evaluate reads of the observed cluster (controller/edges/cluster.py)."""

    histories: Mapping[InstanceKey, InstanceHistory]


def evaluate(
    cluster: Observed, phi: int, exclude: Container[InstanceKey] = ()
) -> dict[OperatorKey, OperatorView]:
    """Views of every operator with slots. Instances in ``exclude`` (unmeasured this
    slot: their engine's counters are missing) are left out; the epoch holds their caps."""
    by_op: dict[OperatorKey, list] = {}
    for h in cluster.histories.values():
        if h.slots and h.key not in exclude:
            by_op.setdefault(h.key.operator_key, []).append(h)
    views: dict[OperatorKey, OperatorView] = {}
    for op, hists in sorted(by_op.items()):
        hists.sort(key=lambda h: h.key.instance)
        # Instances on different nodes report on their own clocks; align by
        # recency (the k-th newest slot of each) over the slots all of them have.
        n = min(phi, min(len(h.slots) for h in hists))
        rows = [list(h.slots)[-n:] for h in hists]
        secs = np.array([sum(r[i].seconds for r in rows) / len(rows) for i in range(n)])

        def per_second(attr: str, rows=rows, secs=secs, n=n) -> np.ndarray:
            return np.array([sum(getattr(r[i], attr) for r in rows) for i in range(n)]) / secs

        last = [r[-1] for r in rows]
        lat_count = sum(s.latency_count for s in last)
        svc_count = sum(s.executed for r in rows for s in r)
        views[op] = OperatorView(
            key=op,
            instances=[h.key for h in hists],
            nodes={h.key: h.node for h in hists},
            stateful=any(h.stateful for h in hists),
            upstream=hists[0].upstream,
            seconds=secs,
            arrivals=per_second("arrivals"),
            executed=per_second("executed"),
            emitted=per_second("emitted"),
            cpu_seconds=np.array([sum(r[i].cpu_seconds for r in rows) for i in range(n)]),
            queue=np.array([sum(r[i].queue_length for r in rows) for i in range(n)]),
            queue_by_instance={h.key: r[-1].queue_length for h, r in zip(hists, rows, strict=True)},
            usage_by_instance={h.key: r[-1].usage_cores for h, r in zip(hists, rows, strict=True)},
            cap_by_instance={h.key: r[-1].cap_cores for h, r in zip(hists, rows, strict=True)},
            throttled_by_instance={
                h.key: r[-1].throttled_seconds for h, r in zip(hists, rows, strict=True)
            },
            latency_ms=(1000 * sum(s.latency_sum_seconds for s in last) / lat_count)
            if lat_count
            else None,
            service_ms=(1000 * sum(s.service_seconds for r in rows for s in r) / svc_count)
            if svc_count
            else None,
            last_timestamp=max(s.timestamp for s in last),
        )
    return views
