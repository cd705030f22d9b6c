"""Division of CPU: the qos-dp allocator, anti-saturation per node, latency values."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.model import InstanceKey
from controller.qos import QosClass
from controller.stages import hysteresis
from controller.stages.allocation import (
    AppLatencyModel,
    QosDpAllocator,
    fit_nodes,
    latency_values,
    violation_ratio,
)
from controller.stages.demand import InstanceDemand
from controller.stages.hysteresis import fit_quantized_caps

GOLD = QosClass("gold", 100.0, 0.01, 8.0)
SILVER = QosClass("silver", 500.0, 0.1, 3.0)
BRONZE = QosClass("bronze", 2000.0, 0.5, 1.0)


def demands(spec):
    """spec: (app, instance, node, cores) rows."""
    return {
        InstanceKey(app, "op", i): InstanceDemand(InstanceKey(app, "op", i), node, cores, "rate")
        for app, i, node, cores in spec
    }


def test_gold_first_then_bronze_never_below_floor():
    d = demands(
        [("g", 0, "n1", 0.6), ("g", 1, "n2", 0.6), ("b", 0, "n1", 0.6), ("b", 1, "n2", 0.6)]
    )
    alloc = QosDpAllocator(headroom_cores=0.0, floor_cores=0.05, theta_cores=0.05).allocate(
        d, {"n1": 1.0, "n2": 1.0}, {"g": GOLD, "b": BRONZE}
    )
    assert alloc.apps["g"].allocated_cores == pytest.approx(1.2)
    assert alloc.apps["b"].allocated_cores == pytest.approx(0.8)
    assert all(c >= 0.05 - 1e-12 for c in alloc.cores.values())
    assert sum(alloc.cores.values()) <= 2.0 + 1e-9
    assert set(alloc.cut) == {InstanceKey("b", "op", 0), InstanceKey("b", "op", 1)}
    assert all("qos-dp" in r for r in alloc.cut_reason.values())


def test_node_overflow_is_cut_from_the_lightest_class_on_that_node_and_reported():
    # The cluster has room, node n1 does not: n1's bronze is cut, n2 untouched.
    d = demands([("g", 0, "n1", 0.8), ("b", 0, "n1", 0.5), ("b", 1, "n2", 0.2)])
    alloc = QosDpAllocator(headroom_cores=0.1, floor_cores=0.05).allocate(
        d, {"n1": 1.0, "n2": 1.0}, {"g": GOLD, "b": BRONZE}
    )
    assert alloc.cores[InstanceKey("g", "op", 0)] == pytest.approx(0.8)
    assert alloc.cores[InstanceKey("b", "op", 0)] == pytest.approx(0.1)
    assert alloc.cores[InstanceKey("b", "op", 1)] == pytest.approx(0.2)
    assert alloc.overflow == {"n1": pytest.approx(0.4)}
    assert "node n1 full" in alloc.cut_reason[InstanceKey("b", "op", 0)]


def test_equal_weights_share_in_proportion_to_demand():
    d = demands([("a", 0, "n1", 1.0), ("c", 0, "n1", 3.0)])
    alloc = QosDpAllocator(headroom_cores=0.0, floor_cores=0.0001, theta_cores=0.01).allocate(
        d, {"n1": 2.0}, {"a": SILVER, "c": SILVER}
    )
    ratio_a = alloc.cores[InstanceKey("a", "op", 0)] / 1.0
    ratio_c = alloc.cores[InstanceKey("c", "op", 0)] / 3.0
    assert ratio_a == pytest.approx(ratio_c, rel=1e-3) and ratio_a == pytest.approx(0.5, rel=1e-2)


def test_fit_nodes_scales_floors_when_even_floors_do_not_fit():
    out, over = fit_nodes(
        np.array([0.5, 0.5, 0.5]),
        np.array([0, 0, 0]),
        np.array([1.0, 1.0, 8.0]),
        np.array([0.5, 0.5, 0.5]),
        np.array([1.0]),
    )
    assert out.sum() == pytest.approx(1.0) and over[0] == pytest.approx(0.5)


def test_quantized_caps_lose_their_margins_before_anything_else():
    keys = [InstanceKey("g", "op", 0), InstanceKey("b", "op", 0)]
    memory = {k: hysteresis.HysteresisState() for k in keys}
    alloc = {keys[0]: 0.52, keys[1]: 0.3}
    steps = {k: hysteresis.step(memory[k], alloc[k], 0.1) for k in keys}  # 0.6 + margin each
    fitted = fit_quantized_caps(
        steps,
        alloc,
        dict.fromkeys(keys, "n1"),
        {keys[0]: 8.0, keys[1]: 1.0},
        {"n1": 0.85},
        0.05,
    )
    assert fitted[keys[1]].cap == pytest.approx(0.3)  # bronze margin gone first
    assert fitted[keys[0]].cap == pytest.approx(0.55)  # then gold's, down to the room
    assert fitted[keys[0]].state.cap == pytest.approx(0.55)  # the memory follows
    assert sum(s.cap for s in fitted.values()) <= 0.85 + 1e-9


def model(rate=100.0, kappa=0.002):
    return AppLatencyModel(
        arrival_rate=np.array([rate]),
        instances=np.array([1.0]),
        kappa=np.array([kappa]),
        share=np.array([1.0]),
        parents=((),),
        floor_cores=np.array([0.05]),
    )


def test_latency_values_rise_with_cpu_and_stop_at_demand():
    vals = latency_values(model(), 0.5, GOLD, 0.05)
    assert len(vals) == 11 and np.all(np.diff(vals) >= 0)
    assert vals[0] == 0.0  # 0.05 cores cannot serve 0.2 cores of load: all late
    assert vals[-1] == pytest.approx(GOLD.weight * 0.5)
    lat = model().latency_seconds(np.array([0.55 - 0.05]))
    assert violation_ratio(lat, GOLD.target_seconds)[0] < GOLD.max_violation_ratio


def test_latency_valued_allocator_prefers_gold():
    d = demands([("g", 0, "n1", 0.5), ("b", 0, "n1", 0.5)])
    models = {"g": model(), "b": model()}
    alloc = QosDpAllocator(headroom_cores=0.0, floor_cores=0.05, value="latency").allocate(
        d, {"n1": 0.7}, {"g": GOLD, "b": BRONZE}, models
    )
    gold = alloc.cores[InstanceKey("g", "op", 0)]
    bronze = alloc.cores[InstanceKey("b", "op", 0)]
    # Gold gets what meets its bound (not necessarily all its demand), bronze the rest.
    lat = model().latency_seconds(np.array([gold - 0.05]))
    assert violation_ratio(lat, GOLD.target_seconds)[0] <= GOLD.max_violation_ratio
    assert gold + bronze == pytest.approx(0.7) and gold > bronze


def rows_on_three_nodes(most_cores: float, tags: list, max_size: int):
    """(node, cores, tag) rows over nodes n1..n3."""
    return st.lists(
        st.tuples(
            st.sampled_from(["n1", "n2", "n3"]), st.floats(0.0, most_cores), st.sampled_from(tags)
        ),
        min_size=1,
        max_size=max_size,
    )


@settings(max_examples=200, deadline=None)
@given(rows=rows_on_three_nodes(1.0, [1.0, 3.0, 8.0], 12), room=st.floats(0.2, 3.0))
def test_fit_quantized_caps_properties(rows, room):
    keys = [InstanceKey(f"a{w:g}", "op", i) for i, (_, _, w) in enumerate(rows)]
    memory = {k: hysteresis.HysteresisState() for k in keys}
    alloc = {k: r[1] for k, r in zip(keys, rows, strict=True)}
    steps = {k: hysteresis.step(memory[k], alloc[k], 0.1) for k in keys}
    node_of = {k: r[0] for k, r in zip(keys, rows, strict=True)}
    weight_of = {k: r[2] for k, r in zip(keys, rows, strict=True)}
    fitted = fit_quantized_caps(
        steps, alloc, node_of, weight_of, dict.fromkeys("n1 n2 n3".split(), room), 0.05
    )
    for n in ("n1", "n2", "n3"):
        on = [k for k in keys if node_of[k] == n]
        if not on:
            continue
        assert all(fitted[k].cap <= steps[k].cap + 1e-9 for k in on)
        assert all(fitted[k].cap >= min(0.05, steps[k].cap) - 1e-9 for k in on)
        if sum(min(0.05, steps[k].cap) for k in on) <= room:
            assert sum(fitted[k].cap for k in on) <= room + 1e-6
        if any(fitted[k].cap < alloc[k] - 1e-9 for k in on):
            # Below allocation only once every rounding margin on the node is gone.
            assert all(fitted[k].cap <= max(alloc[k], 0.05) + 1e-9 for k in on)
        # A heavier class goes below its allocation only when the lighter ones are at floor.
        for k in on:
            if fitted[k].cap < alloc[k] - 1e-9:
                lighter = [j for j in on if weight_of[j] < weight_of[k]]
                assert all(fitted[j].cap <= min(0.05, steps[j].cap) + 1e-9 for j in lighter)


def test_room_a_node_has_left_goes_to_its_instances_unmet_demand():
    # The HTTP monitor at its peak: one bronze app wants 2.0 cores of 1.5 usable,
    # 1.4 of them on n2. The division's one ratio (0.75) would leave n1's
    # instances at 0.45 of their 0.6 while n2 is cut to its 0.75: 0.3 core idle.
    d = demands(
        [("b", 0, "n1", 0.3), ("b", 1, "n1", 0.3), ("b", 2, "n2", 1.0), ("b", 3, "n2", 0.4)]
    )
    alloc = QosDpAllocator(headroom_cores=0.05, floor_cores=0.01, theta_cores=0.005).allocate(
        d, {"n1": 0.8, "n2": 0.8}, {"b": BRONZE}
    )
    assert alloc.cores[InstanceKey("b", "op", 0)] == pytest.approx(0.3)
    assert alloc.cores[InstanceKey("b", "op", 1)] == pytest.approx(0.3)
    assert alloc.cores[InstanceKey("b", "op", 2)] + alloc.cores[
        InstanceKey("b", "op", 3)
    ] == pytest.approx(0.75)
    assert alloc.apps["b"].allocated_cores == pytest.approx(1.35)
    assert not {InstanceKey("b", "op", 0), InstanceKey("b", "op", 1)} & set(alloc.cut)
    assert any("node n1: 0.15 cores of room" in n for n in alloc.notes)
    # n2's cuts say the node was full, not only the division.
    assert all("node n2 full" in alloc.cut_reason[InstanceKey("b", "op", i)] for i in (2, 3))


def test_a_nodes_room_goes_to_the_heaviest_class_first():
    from controller.stages.allocation import fill_nodes

    out, given = fill_nodes(
        np.array([0.1, 0.1, 0.1, 0.5]),
        np.array([0.4, 0.5, 0.3, 0.5]),
        np.array([0, 0, 0, 1]),
        np.array([1.0, 8.0, 8.0, 1.0]),
        np.array([0.7, 0.5]),
    )
    # Node 0 has 0.4 spare: gold's 0.6 still wanted gets it (0.4 x 2/3, 0.4 x 1/3),
    # bronze nothing; node 1 is full.
    assert out == pytest.approx([0.1, 0.1 + 0.4 * 0.4 / 0.6, 0.1 + 0.2 * 0.4 / 0.6, 0.5])
    assert given == pytest.approx([0.4, 0.0])


@settings(max_examples=300, deadline=None)
@given(rows=rows_on_three_nodes(1.5, ["g", "s", "b", "b2"], 16), room=st.floats(0.2, 2.0))
def test_the_division_is_work_conserving_per_node(rows, room):
    """No node keeps room while one of its instances wants more, no node goes over
    its room, and no instance gets more than its demand (or the floor)."""
    spec = [(app, i, n, cores) for i, (n, cores, app) in enumerate(rows)]
    d = demands(spec)
    classes = {"g": GOLD, "s": SILVER, "b": BRONZE, "b2": BRONZE}
    alloc = QosDpAllocator(headroom_cores=0.0, floor_cores=0.02, theta_cores=0.01).allocate(
        d, dict.fromkeys(("n1", "n2", "n3"), room), classes
    )
    for n in ("n1", "n2", "n3"):
        on = [k for k, v in d.items() if v.node == n]
        if not on:
            continue
        total = sum(alloc.cores[k] for k in on)
        floors = sum(min(0.02, d[k].cores) for k in on)
        if floors <= room:
            assert total <= room + 1e-6
        assert all(alloc.cores[k] <= max(d[k].cores, 0.02) + 1e-9 for k in on)
        if total < room - 1e-6:
            assert all(alloc.cores[k] >= d[k].cores - 1e-6 for k in on), (n, total, room)
