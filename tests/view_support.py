"""Operator views for tests of the stages that read them (no controller needed).

from tests.view_support import operator_view
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

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
