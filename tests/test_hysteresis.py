"""Raise at once, lower after theta/2 of accumulated decrease, quantize (epoch step 6,
docs/architecture.md; Liu et al., "An Adaptive Online Scheme for Scheduling and Resource
Enforcement in Storm", §III.A.2)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controller.stages.hysteresis import HysteresisState, quantize, step


@pytest.mark.parametrize(
    "demand,theta,expected",
    [
        (0.0, 0.2, 0.2),
        (0.09, 0.2, 0.2),
        (0.1, 0.2, 0.2),
        (0.11, 0.2, 0.4),
        (0.3, 0.2, 0.4),
        (0.31, 0.2, 0.6),
        (1.0, 0.1, 1.1),
    ],
)
def test_quantize_matches_the_formula(demand, theta, expected):
    assert quantize(demand, theta) == pytest.approx(expected)


@given(st.floats(0, 64, allow_nan=False), st.sampled_from([0.05, 0.1, 0.2, 0.25]))
def test_quantized_cap_has_margin_and_is_a_multiple(demand, theta):
    cap = quantize(demand, theta)
    assert cap >= demand + theta / 2 - 1e-9
    assert cap < demand + 1.5 * theta + 1e-9
    assert math.isclose(cap / theta, round(cap / theta), abs_tol=1e-6)


def _step(s: HysteresisState, demand: float, theta: float):
    """One step; the state it returns replaces ``s`` (step is pure)."""
    r = step(s, demand, theta)
    return r, r.state


def test_raise_at_once_lower_only_after_half_theta_of_decrease():
    s = HysteresisState()
    r, s = _step(s, 0.5, 0.2)
    assert r.reason == "first" and s.cap == pytest.approx(0.6)
    r, s = _step(s, 0.71, 0.2)
    assert r.reason == "raise" and s.cap == pytest.approx(1.0)
    # The quantized target is already lower (0.8), but the cap holds until the
    # decreases accumulated since the raise reach theta/2 = 0.1.
    r, s = _step(s, 0.69, 0.2)
    assert r.reason == "hold" and s.cap == pytest.approx(1.0)
    r, s = _step(s, 0.65, 0.2)
    assert r.reason == "hold" and s.cap == pytest.approx(1.0)
    r, s = _step(s, 0.60, 0.2)
    assert r.reason == "lower" and s.cap == pytest.approx(quantize(0.60, 0.2)) == pytest.approx(0.8)


def test_a_rise_under_the_cap_cancels_part_of_an_earlier_fall():
    s = HysteresisState()
    _, s = _step(s, 1.0, 0.2)
    cap = s.cap
    _, s = _step(s, 0.95, 0.2)  # -0.05
    _, s = _step(s, 0.99, 0.2)  # +0.04: net -0.01
    r, s = _step(s, 0.94, 0.2)
    assert r.reason == "hold" and s.cap == cap  # net -0.06 < 0.1


def test_step_leaves_its_input_state_alone():
    s = HysteresisState(cap=1.0, demand=1.0)
    r = step(s, 0.2, 0.1)
    assert s == HysteresisState(cap=1.0, demand=1.0) and r.state.demand == 0.2


@given(st.lists(st.floats(0, 4, allow_nan=False), min_size=1, max_size=60))
def test_cap_never_below_quantized_current_demand(demands):
    s = HysteresisState()
    for d in demands:
        r, s = _step(s, d, 0.1)
        assert r.cap >= quantize(d, 0.1) - 1e-9 or r.reason == "hold"
        assert r.cap >= d  # the cap always covers this epoch's demand


@pytest.mark.parametrize("bad", [-0.1, math.nan, math.inf])
def test_bad_demand_is_refused(bad):
    with pytest.raises(ValueError):
        quantize(bad, 0.1)


def test_a_band_holds_the_cap_through_moves_smaller_than_its_share():
    theta, band = 0.005, 0.1
    first = step(HysteresisState(), 0.1, theta, band)
    assert first.cap == pytest.approx(0.105)
    # Up 5 % of the cap: the paper's rule raises, the band holds.
    assert step(first.state, 0.105, theta).reason == "raise"
    held = step(first.state, 0.105, theta, band)
    assert (held.reason, held.cap) == ("hold", pytest.approx(0.105))
    # Up more than 10 %: raised at once.
    up = step(first.state, 0.12, theta, band)
    assert up.reason == "raise" and up.cap == pytest.approx(0.125)
    # Down 5 %: the paper's rule lowers (over theta/2), the band waits ...
    assert step(first.state, 0.095, theta).reason == "lower"
    down = step(first.state, 0.095, theta, band)
    assert down.reason == "hold"
    # ... until the falls add up to 10 % of the cap.
    later = step(down.state, 0.089, theta, band)
    assert later.reason == "lower" and later.cap == pytest.approx(0.095)


@pytest.mark.parametrize("bad", [-0.1, 1.0, 1.5, True, "0.1"])
def test_bad_hysteresis_band_is_refused(bad):
    from controller.config import ConfigError, ControllerConfig

    with pytest.raises(ConfigError, match="hysteresis_band"):
        ControllerConfig(hysteresis_band=bad).validate()


def _fit_one_node(memory_caps, allocated, room, band):
    """Hysteresis then anti-saturation for instances on one node ``n``."""
    from controller.stages.hysteresis import fit_quantized_columns, hysteresis_columns
    from dsched.ids import InstanceKey

    keys = [InstanceKey("app", "op", i) for i in range(len(allocated))]
    memory = {k: HysteresisState(cap=c, demand=c) for k, c in zip(keys, memory_caps, strict=True)}
    alloc = dict(zip(keys, allocated, strict=True))
    cols = hysteresis_columns(alloc, memory, 0.005, {}, band)
    fit_quantized_columns(
        cols, alloc, {k: "n" for k in keys}, {k: 1.0 for k in keys}, {"n": room}, 0.05, band
    )
    return cols.steps().values()


def test_a_band_keeps_the_caps_of_a_node_that_stays_full():
    # Both demands rose together: the node is full again and its fitted
    # share-out is within 20 % of the caps in force, which still fit.
    steps = list(_fit_one_node([0.5, 0.45], [0.6, 0.55], 1.0, 0.2))
    assert [(s.reason, s.changed) for s in steps] == [("hold", False)] * 2
    assert [s.cap for s in steps] == [0.5, 0.45]
    # Without the band, every cap on the node is rewritten.
    plain = list(_fit_one_node([0.5, 0.45], [0.6, 0.55], 1.0, 0.0))
    assert [s.reason for s in plain] == ["fit-node"] * 2
    assert sum(s.cap for s in plain) == pytest.approx(1.0)
    assert plain[0].cap != 0.5


def test_a_kept_cap_on_a_full_node_goes_on_accumulating_its_decrease():
    # One demand rose, the other fell by 0.01: the node is full and keeps its
    # caps in force; the one that fell keeps the decrease it accumulated, as a
    # plain hold would, so a later fall lowers it no later than without the node.
    rose, fell = _fit_one_node([0.5, 0.45], [0.62, 0.44], 1.0, 0.2)
    assert [(s.reason, s.cap) for s in (rose, fell)] == [("hold", 0.5), ("hold", 0.45)]
    assert fell.state.accumulated_decrease == pytest.approx(0.01)
    assert rose.state.accumulated_decrease == 0.0


def test_a_band_refits_a_full_node_whose_share_out_moved_or_no_longer_fits():
    # One demand tripled: its fitted cap is far beyond the band of its old one.
    moved = list(_fit_one_node([0.5, 0.45], [1.5, 0.3], 1.0, 0.2))
    assert {s.reason for s in moved} <= {"fit-node", "lower", "raise"}
    assert moved[0].cap > 0.6
    assert sum(s.cap for s in moved) <= 1.0 + 1e-9
    # The node's room shrank below the caps in force: they cannot stay.
    shrunk = list(_fit_one_node([0.5, 0.45], [0.6, 0.55], 0.9, 0.2))
    assert all(s.reason == "fit-node" for s in shrunk)
    assert sum(s.cap for s in shrunk) == pytest.approx(0.9)


def test_a_fall_waits_until_the_cap_has_stood_lower_after_epochs():
    theta = 0.005
    up = step(HysteresisState(), 0.4, theta, lower_after_epochs=3)
    # The paper's rule lowers in the next epoch; with 3 the cap stands 3 epochs.
    assert step(up.state, 0.2, theta).reason == "lower"
    one = step(up.state, 0.2, theta, lower_after_epochs=3)
    two = step(one.state, 0.2, theta, lower_after_epochs=3)
    assert [s.reason for s in (one, two)] == ["hold", "hold"] and two.cap == up.cap
    three = step(two.state, 0.2, theta, lower_after_epochs=3)
    assert three.reason == "lower" and three.cap == pytest.approx(0.205)
    # A raise never waits, and starts the count again.
    assert step(three.state, 0.5, theta, lower_after_epochs=3).reason == "raise"
    again = step(three.state, 0.1, theta, lower_after_epochs=3)
    assert again.reason == "hold" and again.state.stood == 1


def test_a_demand_falling_epochs_in_a_row_lowers_through_the_band():
    theta, band = 0.005, 0.4
    s = step(HysteresisState(), 1.0, theta, band).state
    # Three falls of 5 % each: 14 % in all, well inside a band of 40 %.
    reasons = []
    for demand in (0.95, 0.90, 0.86):
        r = step(s, demand, theta, band, lower_after_falls=3)
        reasons.append(r.reason)
        s = r.state
    assert reasons == ["hold", "hold", "lower"] and r.cap == quantize(0.86, theta)
    assert r.state.falls == 0
    # Off (the default), the band holds the cap through the same falls.
    off = step(HysteresisState(), 1.0, theta, band).state
    for demand in (0.95, 0.90, 0.86):
        held = step(off, demand, theta, band)
        off = held.state
    assert held.reason == "hold" and held.cap == quantize(1.0, theta) and held.state.falls == 3
    # A rise between the falls starts the count again: noise, not a trend.
    s = step(HysteresisState(), 1.0, theta, band).state
    for demand in (0.95, 0.90, 0.93, 0.88, 0.85):
        r = step(s, demand, theta, band, lower_after_falls=3)
        s = r.state
    assert r.reason == "hold" and r.state.falls == 2
    # Falls smaller than theta/2 in all move nothing, though the target is lower.
    s = step(HysteresisState(), 0.998, theta, band, rounding="nearest").state
    assert s.cap == 1.0
    for demand in (0.9979, 0.9978, 0.9974):
        r = step(s, demand, theta, band, rounding="nearest", lower_after_falls=3)
        s = r.state
    assert quantize(0.9974, theta, "nearest") < 1.0
    assert r.reason == "hold" and r.state.falls == 3


@pytest.mark.parametrize("bad", [-1, 1.5, True, "2"])
def test_bad_lower_after_falls_is_refused(bad):
    from controller.config import ConfigError, ControllerConfig

    with pytest.raises(ConfigError, match="lower_after_falls"):
        ControllerConfig(lower_after_falls=bad).validate()


@pytest.mark.parametrize("bad", [-1, 1.5, True, "2"])
def test_bad_lower_after_epochs_is_refused(bad):
    from controller.config import ConfigError, ControllerConfig

    with pytest.raises(ConfigError, match="lower_after_epochs"):
        ControllerConfig(lower_after_epochs=bad).validate()


@pytest.mark.parametrize(
    "demand,theta,expected",
    [
        (0.0, 0.005, 0.005),  # never below one theta
        (0.001, 0.005, 0.005),
        (0.1, 0.005, 0.1),  # a multiple stays itself (the margin rule adds theta)
        (0.1024, 0.005, 0.1),
        (0.1025, 0.005, 0.105),  # halves go up
        (0.1074, 0.005, 0.105),
        (0.29, 0.2, 0.2),
        (0.31, 0.2, 0.4),
    ],
)
def test_nearest_rounding_matches_the_formula(demand, theta, expected):
    assert quantize(demand, theta, "nearest") == pytest.approx(expected)


@given(st.floats(0, 64, allow_nan=False), st.sampled_from([0.005, 0.05, 0.1, 0.2]))
def test_nearest_cap_is_within_half_theta_and_a_multiple(demand, theta):
    cap = quantize(demand, theta, "nearest")
    assert abs(cap - demand) <= theta / 2 + 1e-9 or (cap == theta and demand < theta / 2)
    assert cap <= quantize(demand, theta) + 1e-9  # never above the margin rule's
    assert math.isclose(cap / theta, round(cap / theta), abs_tol=1e-6)


def test_nearest_rounding_grants_less_than_the_margin_over_many_instances():
    # A dozen grants spread over one theta: the margin rule holds about one
    # theta each above them, nearest about none.
    theta = 0.005
    grants = [0.06 + theta * i / 12 for i in range(12)]
    margin = sum(quantize(g, theta) for g in grants) - sum(grants)
    nearest = sum(quantize(g, theta, "nearest") for g in grants) - sum(grants)
    assert margin == pytest.approx(12 * theta, abs=theta)
    assert abs(nearest) <= theta


def test_step_rounds_as_told_and_lowers_to_the_nearest_multiple():
    first = step(HysteresisState(), 0.1, 0.005, rounding="nearest")
    assert first.cap == pytest.approx(0.1)
    # A fall of theta/2 or more is let through, to the nearest multiple.
    down = step(first.state, 0.094, 0.005, rounding="nearest")
    assert down.reason == "lower" and down.cap == pytest.approx(0.095)


def test_unknown_rounding_is_refused_by_quantize_and_the_config():
    from controller.config import ConfigError, ControllerConfig

    with pytest.raises(ValueError, match="rounding must be one of margin, nearest, got 'up'"):
        quantize(0.1, 0.1, "up")
    with pytest.raises(ConfigError, match="cap_rounding"):
        ControllerConfig(cap_rounding="up").validate()


def test_the_controller_rounds_its_caps_as_configured(tmp_path):
    """A real controller over WordCount-shaped counters: with ``margin`` every cap
    is at least theta/2 above its grant; with ``nearest`` every cap is within
    theta/2 of it, and the caps add up to less."""
    from controller.core import Controller
    from tests.test_controller_epoch import SyntheticNode, config, run

    theta = 0.005
    total = {}
    for rounding in ("margin", "nearest"):
        clock = [1_000_000.0]
        c = Controller(
            config(tmp_path / rounding, cap_rounding=rounding, theta_cores=theta),
            clock=lambda clock=clock: clock[0],
        )
        node = SyntheticNode(c)
        records = [run(c, node, clock, 1, {"wc": 200.0 + 20 * e}) for e in range(6)]
        c.stop()
        rows = [
            i
            for rec in records
            for i in rec["instances"]
            if i["hysteresis"] in ("first", "raise", "lower")
        ]
        assert rows, "no cap was set"
        for i in rows:
            gap = i["cap_cores"] - i["allocated_cores"]
            if rounding == "margin":
                assert gap >= theta / 2 - 1e-9
            else:
                assert abs(gap) <= theta / 2 + 1e-9
        total[rounding] = sum(i["cap_cores"] for i in records[-1]["instances"])
    assert total["nearest"] < total["margin"]
