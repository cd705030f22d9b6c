"""Operator views for tests of the stages that read them (no controller needed).

from tests.view_support import operator_view, one_operator_cluster
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from types import SimpleNamespace

import numpy as np

from controller.model import InstanceHistory, InstanceSlot
from controller.stages.evaluate import OperatorView
from dsched.ids import InstanceKey, OperatorKey


def operator_view(
    key: OperatorKey,
    arrivals: Sequence[float],
    *,
    instances: int = 1,
    upstream: Sequence[str] = (),
    slot_seconds: float = 1.0,
    emitted: Sequence[float] | None = None,
    cpu_seconds: Sequence[float] | None = None,
    last_timestamp: float = 0.0,
) -> OperatorView:
    """A stateless operator on node ``n1`` whose instances executed every arrival
    of each slot (``arrivals`` in tuples/s); ``emitted`` defaults to the arrivals,
    ``cpu_seconds`` to none."""
    arrivals = np.asarray(arrivals, dtype=float)
    zeros = np.zeros(len(arrivals))
    inst = [InstanceKey(key.app, key.operator, i) for i in range(instances)]
    return OperatorView(
        key=key,
        instances=inst,
        nodes=dict.fromkeys(inst, "n1"),
        stateful=False,
        upstream=tuple(upstream),
        seconds=np.full(len(arrivals), slot_seconds),
        arrivals=arrivals,
        executed=arrivals,
        emitted=arrivals if emitted is None else np.asarray(emitted, dtype=float),
        cpu_seconds=zeros if cpu_seconds is None else np.asarray(cpu_seconds, dtype=float),
        queue=zeros,
        queue_by_instance={},
        usage_by_instance={},
        cap_by_instance={},
        throttled_by_instance={},
        latency_ms=None,
        service_ms=None,
        last_timestamp=last_timestamp,
    )


ISP = OperatorKey("app", "isp")


def one_operator_cluster(
    instances: Sequence[dict], slots: int = 4, key: OperatorKey = ISP
) -> SimpleNamespace:
    """What :func:`controller.stages.evaluate.evaluate` reads for one stateful
    operator on node ``n1``: instance i reports the same 1-s slot ``slots`` times,
    with ``instances[i]``'s ``arrivals`` (tuples/s, all executed), ``cpu`` (CPU
    seconds; default 1 ms per arrival), ``queue`` (default 0) and ``cap`` (cores,
    default 0.5; None: uncapped)."""
    histories = {}
    for i, spec in enumerate(instances):
        arrivals = spec.get("arrivals", 0.0)
        cpu = spec.get("cpu", arrivals * 0.001)
        ik = InstanceKey(key.app, key.operator, i)
        h = InstanceHistory(ik, "n1", "w", True, (), deque(maxlen=8))
        for s in range(slots):
            h.add(
                InstanceSlot(
                    key=ik,
                    node="n1",
                    worker="w",
                    stateful=True,
                    slot=s,
                    timestamp=1000.0 + s,
                    seconds=1.0,
                    arrivals=arrivals,
                    executed=arrivals,
                    emitted=0.0,
                    cpu_seconds=cpu,
                    queue_length=spec.get("queue", 0.0),
                    latency_sum_seconds=0.0,
                    latency_count=0,
                    service_seconds=cpu,
                    cap_cores=spec.get("cap", 0.5),
                    throttled_seconds=0.0,
                )
            )
        histories[ik] = h
    return SimpleNamespace(histories=histories)
