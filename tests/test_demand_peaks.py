"""Peak demand: DemandPeaks keeps each instance's highest demand over the last
epochs, a record row's peak reaches its Instance through demands_from_record,
and Instance.peak_cores never falls below the demand now."""

from __future__ import annotations

import math

import pytest

from controller.memory import DemandPeaks
from controller.placement import Instance
from controller.placement.stage import build_placement_input, demands_from_record
from dsched.ids import InstanceKey


def _row(demand, app="wc", operator="count", instance=0, **extra) -> dict:
    return {"app": app, "operator": operator, "instance": instance, "demand_cores": demand, **extra}


def _observe(peaks: DemandPeaks, rows: list[dict]) -> dict[str, float]:
    """Feed rows as the controller does (typed demands by instance key; a row
    without an identity cannot become one) and answer by instance id."""
    demands = {}
    for row in rows:
        try:
            key = InstanceKey(row["app"], row["operator"], row["instance"])
        except KeyError:
            continue
        demands[key] = row.get("demand_cores")
    return {k.id: v for k, v in peaks.observe(demands).items()}


# --- DemandPeaks -------------------------------------------------------------


def test_the_peak_is_the_max_over_exactly_the_last_window_observations():
    peaks = DemandPeaks(3)
    demands = [0.2, 0.9, 0.1, 0.3, 0.4, 0.1, 0.05, 0.6]
    seen = []
    for demand in demands:
        seen.append(demand)
        got = _observe(peaks, [_row(demand)])
        assert got == {"wc/count/0": max(seen[-3:])}, seen


def test_an_old_high_value_drops_out_after_window_more_epochs():
    peaks = DemandPeaks(4)
    assert _observe(peaks, [_row(2.0)]) == {"wc/count/0": 2.0}
    # Still inside the window for three more epochs...
    for _ in range(3):
        assert _observe(peaks, [_row(0.5)]) == {"wc/count/0": 2.0}
    # ...and gone on the fourth.
    assert _observe(peaks, [_row(0.5)]) == {"wc/count/0": 0.5}


def test_a_window_of_one_is_the_demand_now():
    peaks = DemandPeaks(1)
    for demand in (0.7, 0.2, 0.4):
        assert _observe(peaks, [_row(demand)]) == {"wc/count/0": demand}


def test_instances_keep_separate_windows():
    peaks = DemandPeaks(2)
    _observe(peaks, [_row(1.0, instance=0), _row(0.1, instance=1)])
    got = _observe(peaks, [_row(0.2, instance=0), _row(0.3, instance=1)])
    assert got == {"wc/count/0": 1.0, "wc/count/1": 0.3}


@pytest.mark.parametrize(
    ("peak_seconds", "slot_seconds", "window"),
    [
        (300.0, 10.0, 30),
        (0.0, 10.0, 1),
        (25.0, 10.0, 3),
        (5.0, 10.0, 1),
        (14.0, 10.0, 2),
        # Float quotients a hair off a whole number: 2.9999999999999996 and
        # 3.0000000000000004 epochs are both 3.
        (0.3, 0.1, 3),
        (2.1, 0.7, 3),
    ],
)
def test_for_slot_covers_the_seconds_in_whole_epochs(peak_seconds, slot_seconds, window):
    assert DemandPeaks.for_slot(peak_seconds, slot_seconds).window == window


def test_an_instance_absent_from_one_observe_is_forgotten_and_starts_afresh():
    peaks = DemandPeaks(5)
    _observe(peaks, [_row(3.0), _row(0.1, instance=1)])
    # wc/count/0 misses one epoch.
    assert _observe(peaks, [_row(0.1, instance=1)]) == {"wc/count/1": 0.1}
    # Back again: its 3.0 from before the gap is no longer its peak.
    assert _observe(peaks, [_row(0.2), _row(0.1, instance=1)]) == {
        "wc/count/0": 0.2,
        "wc/count/1": 0.1,
    }


@pytest.mark.parametrize(
    "bad",
    [
        {"operator": "count", "instance": 0, "demand_cores": 5.0},  # no app
        {"app": "wc", "instance": 0, "demand_cores": 5.0},  # no operator
        {"app": "wc", "operator": "count", "demand_cores": 5.0},  # no instance
        {"app": "wc", "operator": "count", "instance": 0},  # no demand
        _row(None),
        _row("abc"),
        _row(math.nan),
        _row(math.inf),
        _row(-math.inf),
        _row(-0.5),
    ],
    ids=[
        "no-app",
        "no-operator",
        "no-instance",
        "no-demand",
        "none",
        "abc",
        "nan",
        "inf",
        "-inf",
        "negative",
    ],
)
def test_bad_rows_are_skipped_without_disturbing_the_others(bad):
    peaks = DemandPeaks(3)
    good = _row(0.4, operator="split")
    assert _observe(peaks, [good, bad, _row(0.2, operator="source")]) == {
        "wc/split/0": 0.4,
        "wc/source/0": 0.2,
    }
    # The bad row left nothing behind: a good row for wc/count/0 starts afresh.
    assert _observe(peaks, [good, bad, _row(0.1)]) == {
        "wc/split/0": 0.4,
        "wc/count/0": 0.1,
    }


def test_a_bad_demand_does_not_enter_an_instances_window():
    peaks = DemandPeaks(3)
    _observe(peaks, [_row(0.3)])
    for bad in (math.inf, -1.0):
        _observe(peaks, [_row(0.3), _row(bad, instance=1)])
    assert _observe(peaks, [_row(0.2), _row(0.1, instance=1)]) == {
        "wc/count/0": 0.3,
        "wc/count/1": 0.1,
    }


def test_one_bad_demand_keeps_the_window_the_instance_had():
    peaks = DemandPeaks(5)
    _observe(peaks, [_row(3.0)])
    assert _observe(peaks, [_row(math.nan)]) == {}
    assert _observe(peaks, [_row(0.1)]) == {"wc/count/0": 3.0}


@pytest.mark.parametrize("window", [0, -1, True, 2.5, "3", None])
def test_a_bad_window_names_window(window):
    with pytest.raises(ValueError, match="window"):
        DemandPeaks(window)


# --- demands_from_record -> build_placement_input ------------------------------


def _record(*rows) -> dict:
    return {"instances": list(rows)}


CURRENT = {"wc/count/0": ("wc@n1:sf", True), "wc/split/0": ("wc@n1:sl", False)}


def _state_of(*rows):
    return build_placement_input(demands_from_record(_record(*rows)), {"n1": 2.0}, CURRENT)


def test_a_rows_peak_reaches_the_instance():
    state = _state_of(
        _row(0.3, node="n1", peak_demand_cores=0.8),
        _row(0.2, operator="split", node="n1", peak_demand_cores=0),
    )
    by_id = {i.id: i for i in state.instances}
    assert by_id["wc/count/0"].peak_demand_cores == 0.8
    assert by_id["wc/count/0"].peak_cores == 0.8
    assert by_id["wc/split/0"].peak_demand_cores == 0.0
    assert by_id["wc/split/0"].peak_cores == 0.2


def test_rows_without_a_peak_give_none():
    state = _state_of(_row(0.3, node="n1"), _row(0.2, operator="split", node="n1"))
    assert [i.peak_demand_cores for i in state.instances] == [None, None]
    assert [i.peak_cores for i in state.instances] == [0.3, 0.2]


@pytest.mark.parametrize("peak", [-0.1, math.nan, math.inf, "0.8", True])
def test_a_bad_peak_names_peak_demand_cores(peak):
    with pytest.raises(ValueError, match="peak_demand_cores of instance wc/count/0"):
        _state_of(_row(0.3, node="n1", peak_demand_cores=peak))


# --- Instance ----------------------------------------------------------------


def test_peak_cores_is_never_below_the_demand_now():
    assert Instance("wc", "count", 0, 0.5, True, peak_demand_cores=0.2).peak_cores == 0.5
    assert Instance("wc", "count", 0, 0.5, True).peak_cores == 0.5
    assert Instance("wc", "count", 0, 0.5, True, peak_demand_cores=0.9).peak_cores == 0.9


@pytest.mark.parametrize("peak", [-1.0, math.nan, "x"])
def test_a_bad_peak_on_an_instance_names_peak_demand_cores(peak):
    with pytest.raises(ValueError, match="peak_demand_cores of instance wc/count/0"):
        Instance("wc", "count", 0, 0.5, True, peak_demand_cores=peak)


def test_peaks_with_gives_good_demands_their_peak_and_changes_no_window():
    """What the epoch reads (the record's peak_demand_cores comes from it)."""
    peaks = DemandPeaks(2)
    _observe(peaks, [_row(0.9), _row(0.2, instance=1)])
    count0, count1 = InstanceKey("wc", "count", 0), InstanceKey("wc", "count", 1)
    assert peaks.peaks_with({count0: 0.4, count1: math.nan}) == {count0: 0.9}
    # Had peaks_with entered 0.4, the window would now be [0.4, 0.1].
    assert _observe(peaks, [_row(0.1)]) == {"wc/count/0": 0.9}


# --- the mean placement judges -------------------------------------------------


def test_the_mean_is_over_exactly_the_last_mean_window_observations():
    peaks = DemandPeaks(2, mean_window=3)
    key = InstanceKey("wc", "split", 0)
    seen = []
    for demand in (0.9, 0.3, 0.3, 0.6, 0.0):
        seen.append(demand)
        assert peaks.means_with({key: demand})[key] == pytest.approx(
            sum(seen[-3:]) / len(seen[-3:])
        )
        # The peak keeps its own, shorter window.
        assert peaks.peaks_with({key: demand})[key] == max(seen[-2:])
        peaks.advance({key: demand})


def test_a_mean_window_of_one_is_the_demand_now_and_bad_windows_are_refused():
    peaks = DemandPeaks(3)
    key = InstanceKey("wc", "split", 0)
    peaks.advance({key: 5.0})
    assert peaks.means_with({key: 1.0}) == {key: 1.0}
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="mean_window"):
            DemandPeaks(3, mean_window=bad)


def test_the_windows_in_seconds_become_epochs_of_the_slot():
    peaks = DemandPeaks.for_slot(300.0, 0.5, 10.0)
    assert (peaks.window, peaks.mean_window) == (600, 20)
    assert DemandPeaks.for_slot(300.0, 10.0, 0.0).mean_window == 1


def test_a_window_not_yet_full_is_read_whole():
    # Two epochs seen of a four-epoch window: the peak is the larger of both and
    # this epoch's, not only the newest's.
    peaks = DemandPeaks(4, mean_window=4)
    key = InstanceKey("wc", "count", 0)
    peaks.advance({key: 2.0})
    peaks.advance({key: 0.5})
    assert peaks.peaks_with({key: 0.5}) == {key: 2.0}
    assert peaks.means_with({key: 0.5}) == {key: 1.0}


# --- the rise placement sees within the short mean ---------------------------


def test_a_rise_is_placed_by_the_short_mean_before_the_long_mean_catches_up():
    # A ramp from 0.1 to 0.8 core, judged over a 10-epoch mean and a 4-epoch rise.
    peaks = DemandPeaks(2, mean_window=10, rise_window=4)
    key = InstanceKey("wc", "split", 0)
    seen, judged, means = [], [], []
    for demand in [0.1] * 10 + [0.8] * 6:
        seen.append(demand)
        judged.append(peaks.placement_with({key: demand})[key])
        means.append(peaks.means_with({key: demand})[key])
        short = sum(seen[-4:]) / len(seen[-4:])
        assert judged[-1] == pytest.approx(max(means[-1], short))
        peaks.advance({key: demand})
    # Flat: the long mean. Two epochs into the rise the short mean has half of
    # it (0.45) where the long one has a seventh (0.24); at four, all of it.
    assert judged[9] == pytest.approx(0.1)
    assert (judged[11], means[11]) == (pytest.approx(0.45), pytest.approx(0.24))
    assert (judged[13], means[13]) == (pytest.approx(0.8), pytest.approx(0.38))


def test_a_fall_is_judged_by_the_long_mean():
    peaks = DemandPeaks(2, mean_window=10, rise_window=4)
    key = InstanceKey("wc", "split", 0)
    for demand in [0.9] * 10 + [0.1] * 3:
        peaks.advance({key: demand})
    # Four epochs at 0.1: the short mean is 0.1, the long one 0.58.
    assert peaks.placement_with({key: 0.1}) == peaks.means_with({key: 0.1})
    assert peaks.placement_with({key: 0.1})[key] == pytest.approx((6 * 0.9 + 4 * 0.1) / 10)


def test_without_a_rise_window_placement_judges_the_mean_and_bad_rise_windows_are_refused():
    peaks = DemandPeaks.for_slot(300.0, 0.5, 10.0)
    assert peaks.rise_window is None
    assert DemandPeaks.for_slot(300.0, 0.5, 10.0, 2.0).rise_window == 4
    key = InstanceKey("wc", "split", 0)
    for demand in (0.1, 0.1, 0.9):
        assert peaks.placement_with({key: demand}) == peaks.means_with({key: demand})
        peaks.advance({key: demand})
    # A bad demand is left out, as from the other windows.
    assert DemandPeaks(2, 3, 2).placement_with({key: math.nan}) == {}
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="rise_window"):
            DemandPeaks(3, rise_window=bad)
