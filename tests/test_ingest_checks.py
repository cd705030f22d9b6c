"""Ingest's checks of a sample, on random values: the reason a sample is refused
(and the value it names) is that of a check of every value in the documented
order, and an accepted slot carries the counters' exact differences.

Ingest checks the usual case (all values finite and non-negative, no counter
gone back) in one expression and names the culprit only when it fails; this
holds it to the field-by-field check it replaced.
"""

from __future__ import annotations

import logging
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from controller.edges.cluster import ObservedCluster
from controller.model import InstanceKey
from dsched_pb import dsched_pb2 as pb

NOW = 1_700_000_000.0
FLOATS = (
    "cpu_seconds_total",
    "cpu_usage_cores",
    "latency_sum_seconds_total",
    "service_seconds_total",
    "cap_cores",
    "throttled_seconds_total",
)
COUNTERS = {
    "arrivals": "received_total",
    "executed": "executed_total",
    "emitted": "emitted_total",
    "cpu_seconds": "cpu_seconds_total",
    "latency_sum": "latency_sum_seconds_total",
    "latency_count": "latency_count_total",
    "service_seconds": "service_seconds_total",
}

values = st.one_of(
    st.floats(0.0, 1e6),
    st.sampled_from([math.nan, math.inf, -math.inf, -1.0, -0.0, 0.0]),
)
optional_values = st.one_of(st.none(), values)
names = st.sampled_from(["wc", "split", "a.b", "x@y", "../up", "bad/name", "", "ok-1"])


def _sample(app, op, upstream, floats, ints) -> pb.InstanceSample:
    s = pb.InstanceSample(
        key=pb.InstanceKey(app=app, operator=op, instance=ints["instance"]),
        worker="w",
        upstream=list(upstream),
        received_total=ints["received_total"],
        executed_total=ints["executed_total"],
        emitted_total=ints["emitted_total"],
        latency_count_total=ints["latency_count_total"],
        queue_length=ints["queue_length"],
    )
    for name, v in floats.items():
        if v is not None:
            setattr(s, name, v)
    return s


def _expected_refusal(floats, ints) -> tuple[str, str] | None:
    """The first bad value, in the order ingest documents, as (reason, field)."""
    if ints["instance"] < 0:
        return "bad_instance", ""
    for name in FLOATS:
        v = floats.get(name)
        if v is None:
            continue
        if not math.isfinite(v):
            return "nan", name
        if v < 0:
            return "negative", name
    if ints["queue_length"] < 0:
        return "negative", "queue_length"
    return None


ints_st = st.fixed_dictionaries(
    {
        "instance": st.integers(-1, 3),
        "received_total": st.integers(0, 10**9),
        "executed_total": st.integers(0, 10**9),
        "emitted_total": st.integers(0, 10**9),
        "latency_count_total": st.integers(0, 10**9),
        "queue_length": st.integers(-2, 100),
    }
)
floats_st = st.fixed_dictionaries(
    {
        "cpu_seconds_total": values,
        "cpu_usage_cores": values,
        "latency_sum_seconds_total": values,
        "service_seconds_total": values,
        "cap_cores": optional_values,
        "throttled_seconds_total": optional_values,
    }
)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(names, names, floats_st, ints_st), min_size=1, max_size=6),
    st.lists(st.booleans(), min_size=1, max_size=6),
)
def test_a_sample_is_refused_for_its_first_bad_value(steps, upstream_ok):
    cluster = ObservedCluster(depth=3)
    cluster.agent_connected(
        pb.Hello(node_id="n1", cpu_capacity_cores=4.0, slot_seconds=1.0), now=NOW
    )
    baseline: dict[InstanceKey, pb.InstanceSample] = {}
    for t, ((app, op, floats, ints), up_ok) in enumerate(
        zip(steps, upstream_ok * len(steps), strict=False), start=1
    ):
        upstream = ("source",) if up_ok else ("bad/up",)
        s = _sample(app, op, upstream, floats, ints)
        before = dict(cluster.rejected)
        res = cluster.ingest(
            pb.NodeReport(node_id="n1", slot=t, timestamp=NOW + t, slot_seconds=1.0, instances=[s]),
            now=NOW + t,
        )
        new = {r: n - before.get(r, 0) for r, n in cluster.rejected.items() if n != before.get(r)}
        bad_name = any(not n or "/" in n or ".." in n for n in (app, op)) or not up_ok
        if bad_name:
            assert new == {"bad_name": 1}
            continue
        expected = _expected_refusal(floats, ints)
        key = InstanceKey(app, op, ints["instance"])
        if expected is not None:
            assert new == {expected[0]: 1}, (new, expected)
            continue
        prev = baseline.get(key)
        baseline[key] = s
        if prev is None:
            assert new == {} and res.accepted == 0
            continue
        back = sorted(k for k, f in COUNTERS.items() if getattr(s, f) - getattr(prev, f) < 0)
        if back:
            assert new == {"counter_reset": 1}
            continue
        assert new == {} and res.accepted == 1
        slot = cluster.histories[key].slots[-1]
        assert slot.arrivals == s.received_total - prev.received_total
        assert slot.executed == s.executed_total - prev.executed_total
        assert slot.emitted == s.emitted_total - prev.emitted_total
        assert slot.cpu_seconds == s.cpu_seconds_total - prev.cpu_seconds_total
        assert slot.latency_sum_seconds == (
            s.latency_sum_seconds_total - prev.latency_sum_seconds_total
        )
        assert slot.latency_count == s.latency_count_total - prev.latency_count_total
        assert slot.service_seconds == s.service_seconds_total - prev.service_seconds_total
        assert slot.cap_cores == (s.cap_cores if s.HasField("cap_cores") else None)
        if s.HasField("throttled_seconds_total") and prev.HasField("throttled_seconds_total"):
            assert slot.throttled_seconds == max(
                0.0, s.throttled_seconds_total - prev.throttled_seconds_total
            )
        else:
            assert slot.throttled_seconds is None


def test_a_refusal_names_the_first_bad_value(caplog):
    cluster = ObservedCluster()
    cluster.agent_connected(pb.Hello(node_id="n1", cpu_capacity_cores=4.0), now=NOW)
    s = pb.InstanceSample(
        key=pb.InstanceKey(app="wc", operator="split", instance=0),
        cpu_seconds_total=1.0,
        cpu_usage_cores=-2.0,
        service_seconds_total=math.nan,
    )
    with caplog.at_level(logging.WARNING):
        cluster.ingest(
            pb.NodeReport(node_id="n1", slot=1, timestamp=NOW, slot_seconds=1.0, instances=[s]),
            now=NOW,
        )
    assert dict(cluster.rejected) == {"negative": 1}
    assert "cpu_usage_cores is -2.0" in caplog.text
