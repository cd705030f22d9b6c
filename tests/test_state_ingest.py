"""Ingest of NodeReports: differentiation, and every kind of bad report refused with a reason."""

from __future__ import annotations

import math

import pytest

from controller.edges.cluster import ObservedCluster
from controller.model import InstanceKey
from dsched.dag import topological_order
from dsched_pb import dsched_pb2 as pb

NOW = 1_700_000_000.0


def hello(node="n1", cores=2.0) -> pb.Hello:
    return pb.Hello(
        node_id=node, cpu_capacity_cores=cores, cgroup_mode=pb.CGROUP_V1, slot_seconds=1.0
    )


def sample(
    app="wc",
    op="split",
    i=0,
    received=0,
    executed=0,
    emitted=0,
    cpu=0.0,
    queue=0,
    lat_sum=0.0,
    lat_n=0,
    upstream=("source",),
    **extra,
) -> pb.InstanceSample:
    s = pb.InstanceSample(
        key=pb.InstanceKey(app=app, operator=op, instance=i),
        worker="w",
        stateful=False,
        received_total=received,
        executed_total=executed,
        emitted_total=emitted,
        cpu_seconds_total=cpu,
        queue_length=queue,
        latency_sum_seconds_total=lat_sum,
        latency_count_total=lat_n,
        upstream=list(upstream),
    )
    for k, v in extra.items():
        setattr(s, k, v)
    return s


def report(ts, *samples, node="n1", slot=1, slot_seconds=1.0) -> pb.NodeReport:
    return pb.NodeReport(
        node_id=node, slot=slot, timestamp=ts, slot_seconds=slot_seconds, instances=list(samples)
    )


@pytest.fixture
def state() -> ObservedCluster:
    st = ObservedCluster(depth=5)
    st.agent_connected(hello(), now=NOW)
    return st


def test_consecutive_reports_become_slot_deltas(state):
    k = InstanceKey("wc", "split", 0)
    assert (
        state.ingest(report(NOW, sample(received=100, executed=90, cpu=1.0)), now=NOW).accepted == 0
    )
    res = state.ingest(
        report(NOW + 2, sample(received=300, executed=280, emitted=900, cpu=1.5, queue=20), slot=2),
        now=NOW + 2,
    )
    assert res.accepted == 1 and not res.rejected
    (s,) = state.histories[k].slots
    assert (s.arrivals, s.executed, s.emitted, s.seconds) == (200, 190, 900, 2.0)
    assert s.usage_cores == pytest.approx(0.25)
    assert s.queue_length == 20
    assert state.topologies["wc"].parents == {"split": ("source",)}


@pytest.mark.parametrize(
    "field,value,reason",
    [
        ("cpu_seconds_total", math.nan, "nan"),
        ("cpu_seconds_total", math.inf, "nan"),
        ("latency_sum_seconds_total", -1.0, "negative"),
        ("queue_length", -5, "negative"),
        ("cap_cores", math.nan, "nan"),
    ],
)
def test_non_finite_or_negative_samples_are_rejected_and_counted(state, field, value, reason):
    state.ingest(report(NOW, sample()), now=NOW)
    bad = sample(received=10)
    setattr(bad, field, value)
    good = sample(op="count", upstream=("split",))
    res = state.ingest(report(NOW + 1, bad, good, slot=2), now=NOW + 1)
    assert res.rejected[reason] == 1
    assert state.rejected[reason] == 1
    # The good instance of the same report still counts: one bad sample loses nothing else.
    assert InstanceKey("wc", "count", 0) not in state.histories  # first reading is a baseline
    state.ingest(
        report(NOW + 2, sample(op="count", upstream=("split",), received=5), slot=3), now=NOW + 2
    )
    assert len(state.histories[InstanceKey("wc", "count", 0)].slots) == 1


def test_counter_that_went_backwards_resets_the_baseline(state):
    k = InstanceKey("wc", "split", 0)
    state.ingest(report(NOW, sample(received=1000, executed=1000)), now=NOW)
    res = state.ingest(report(NOW + 1, sample(received=10, executed=10), slot=2), now=NOW + 1)
    assert res.rejected["counter_reset"] == 1 and k not in state.histories
    state.ingest(report(NOW + 2, sample(received=40, executed=35), slot=3), now=NOW + 2)
    (s,) = state.histories[k].slots
    assert (s.arrivals, s.executed) == (30, 25)


def test_far_future_duplicate_and_unknown_reports_are_refused(state):
    assert state.ingest(report(NOW + 3600, sample()), now=NOW).rejected["future_timestamp"] == 1
    state.ingest(report(NOW, sample()), now=NOW)
    assert state.ingest(report(NOW, sample()), now=NOW).rejected["duplicate_report"] == 1
    assert (
        state.ingest(report(NOW + 5, sample(), node="ghost"), now=NOW + 5).rejected["unknown_node"]
        == 1
    )
    assert (
        state.ingest(report(NOW + 6, sample(), slot_seconds=math.nan), now=NOW + 6).rejected[
            "bad_slot_seconds"
        ]
        == 1
    )
    assert state.ingest(report(math.nan, sample()), now=NOW + 7).rejected["bad_timestamp"] == 1


@pytest.mark.parametrize("app", ["../etc", "a/b", "x\x00"])
def test_names_that_could_escape_a_path_are_refused(state, app):
    assert state.ingest(report(NOW, sample(app=app)), now=NOW).rejected["bad_name"] == 1
    assert not state.histories and app not in state.topologies


def test_hello_with_nonsense_capacity_is_refused():
    st = ObservedCluster()
    with pytest.raises(ValueError, match="cpu_capacity_cores"):
        st.agent_connected(hello(cores=math.nan))
    with pytest.raises(ValueError):
        st.agent_connected(hello(node="../x"))


def test_vanished_instances_are_forgotten():
    st = ObservedCluster(depth=3, forget_after_seconds=10)
    st.agent_connected(hello(), now=NOW)
    st.ingest(report(NOW, sample(op="a", upstream=()), sample(op="b", upstream=("a",))), now=NOW)
    st.ingest(
        report(NOW + 1, sample(op="a", upstream=()), sample(op="b", upstream=("a",)), slot=2),
        now=NOW + 1,
    )
    st.ingest(report(NOW + 20, sample(op="a", upstream=()), slot=3), now=NOW + 20)
    assert InstanceKey("wc", "b", 0) in st.histories  # forgetting is an epoch's job
    st.forget_vanished(NOW + 20)
    assert InstanceKey("wc", "b", 0) not in st.histories
    assert st.topologies["wc"].parents == {"a": ()}


def test_topological_order_and_cycles():
    assert topological_order({"c": ("b",), "b": ("a",), "a": (), "d": ("a", "c")}) == [
        "a",
        "b",
        "c",
        "d",
    ]
    with pytest.raises(ValueError, match="cycle"):
        topological_order({"a": ("b",), "b": ("a",)})
