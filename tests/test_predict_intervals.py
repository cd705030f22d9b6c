"""Conformal forecast intervals: coverage, the adaptive variant, the keyed bank, the
single-series wrapper, and bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from predict.intervals import (
    ConformalBank,
    WithConformalUpper,
    aci_step,
    conformal_offset,
    conformal_replay,
    coverage,
    new_point_count,
    quantile_bound,
    rate_for_quantile,
)
from predict.load import Arima, LastValue, LinearTrend
from predict.seasonal import MaxRule, Seasonal


def ar1(n: int, phi: float = 0.6, seed: int = 0, level: float = 100.0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = np.empty(n)
    x[0] = 0.0
    for t in range(1, n):
        x[t] = phi * x[t - 1] + rng.normal(0.0, 5.0)
    return level + x


def last_value_paths(series: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One-step last-value forecasts of series[1:] and the outcomes."""
    return series[:-1], series[1:]


# ---------------------------------------------------------------- coverage


@pytest.mark.parametrize("adaptive", [False, True])
def test_coverage_on_a_long_stationary_series_is_within_88_to_92_percent(adaptive):
    series = ar1(4000, seed=7)
    points, actual = last_value_paths(series)
    bounds = conformal_replay(points, actual, 0.9, window=200, adaptive=adaptive)
    cov = coverage(bounds[50:], actual[50:], 0.9)
    assert 0.88 <= cov <= 0.92


def test_wrapper_coverage_on_a_stationary_series():
    series = ar1(1500, seed=3)
    model = WithConformalUpper(LastValue(), window=200, quantile=0.9)
    hits = []
    for t in range(50, series.size):
        fc = model.predict(series[:t])
        hits.append(series[t] <= fc.bound)
    assert 0.88 <= np.mean(hits) <= 0.92


def test_central_interval_covers_90_percent():
    series = ar1(4000, seed=11)
    points, actual = last_value_paths(series)
    lo = conformal_replay(points, actual, 0.05, window=200)
    hi = conformal_replay(points, actual, 0.95, window=200)
    inside = np.mean((actual[50:] >= lo[50:]) & (actual[50:] <= hi[50:]))
    assert 0.88 <= inside <= 0.92


def test_adaptive_recovers_coverage_after_the_noise_grows():
    # The noise triples halfway: the plain window under-covers until the old errors
    # have left it; adaptive conformal inference tracks the target.
    rng = np.random.default_rng(5)
    n = 1200
    sd = np.where(np.arange(n) < n // 2, 2.0, 6.0)
    actual = 100.0 + sd * rng.standard_normal(n)
    points = np.full(n, 100.0)
    plain = conformal_replay(points, actual, 0.9, window=400, adaptive=False)
    aci = conformal_replay(points, actual, 0.9, window=400, adaptive=True, gamma=0.02)
    after = slice(n // 2, n // 2 + 200)
    assert coverage(plain[after], actual[after], 0.9) < 0.85
    assert coverage(aci[after], actual[after], 0.9) > coverage(plain[after], actual[after], 0.9)
    assert 0.88 <= coverage(aci[50:], actual[50:], 0.9) <= 0.92


def test_aci_long_run_coverage_identity():
    # Gibbs and Candes: mean miss = alpha - (q_{T+1} - q_1) / (gamma T), exactly.
    rng = np.random.default_rng(1)
    actual = rng.standard_exponential(500)
    points = np.zeros(500)
    bank = ConformalBank(window=50, levels=[0.9], gamma=0.05, min_scores=1)
    hits = []
    for t in range(500):
        b = bank.bound(["s"], points[t], 0.9, floor=None)[0]
        hits.append(actual[t] <= b)
        bank.update(["s"], actual[t], points[t])
    final = bank.effective_levels("s")[0.9]
    # The first update has no scores yet and does not move the level.
    assert np.mean(hits[1:]) == pytest.approx(0.9 - (final - 0.9) / (0.05 * 499), abs=1e-9)


# ------------------------------------------------------------ pure functions


def test_finite_sample_rank():
    scores = np.arange(1.0, 10.0)  # 1..9
    assert conformal_offset(scores, 0.9) == 9.0  # ceil(10 * 0.9) = 9th smallest
    assert conformal_offset(scores, 0.5) == 5.0
    assert conformal_offset(scores, 0.99) == 9.0  # too few scores: the largest
    assert conformal_offset(scores, 0.1) == 1.0  # floor(10 * 0.1) = 1st smallest


def test_rows_with_nan_padding_equal_their_own_scores():
    rng = np.random.default_rng(0)
    rows = [rng.normal(size=n) for n in (5, 40, 200)]
    padded = np.full((3, 200), np.nan)
    for i, r in enumerate(rows):
        padded[i, : r.size] = r
    q = np.array([0.9, 0.5, 0.99])
    got = conformal_offset(padded, q)
    for i, r in enumerate(rows):
        assert got[i] == conformal_offset(r, q[i])
    assert math.isnan(conformal_offset(np.full((1, 3), np.nan), 0.9)[0])


def test_rate_for_quantile_gold_above_bronze_and_never_below_the_forecast():
    scores = np.random.default_rng(2).normal(0.0, 10.0, 300)
    gold, silver, bronze = (rate_for_quantile(100.0, scores, q) for q in (0.99, 0.9, 0.5))
    assert gold > silver > bronze >= 100.0
    biased = scores - 100.0  # a forecaster that always overshoots
    assert rate_for_quantile(100.0, biased, 0.9) == 100.0
    assert rate_for_quantile(100.0, [], 0.9) == 100.0  # no score yet: the forecast


@settings(max_examples=60, deadline=None)
@given(
    point=st.floats(0.0, 1e4),
    scores=st.lists(st.floats(-1e3, 1e3), min_size=1, max_size=60),
    q1=st.floats(0.5, 0.999),
    q2=st.floats(0.5, 0.999),
)
def test_upper_quantile_is_at_least_the_point_and_monotone_in_the_quantile(point, scores, q1, q2):
    lo, hi = sorted((q1, q2))
    a = rate_for_quantile(point, scores, lo)
    b = rate_for_quantile(point, scores, hi)
    assert a >= point and b >= point
    assert b >= a


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    quantiles=st.lists(st.floats(0.5, 0.995), min_size=2, max_size=5, unique=True),
)
def test_adaptive_bank_upper_is_monotone_across_tracked_levels(seed, quantiles):
    rng = np.random.default_rng(seed)
    bank = ConformalBank(window=30, levels=quantiles, gamma=0.1, min_scores=1)
    keys = ["a", "b"]
    for _ in range(60):
        bank.update(keys, rng.gamma(2.0, 10.0, 2), rng.gamma(2.0, 10.0, 2))
    qs = sorted(quantiles)
    uppers = np.stack([bank.upper(keys, [50.0, 5.0], q) for q in qs])
    assert np.all(np.diff(uppers, axis=0) >= -1e-12)
    assert np.all(uppers >= np.array([50.0, 5.0]))


def test_quantile_bound_sides_and_floor():
    assert quantile_bound(10.0, -3.0, 0.9) == 10.0
    assert quantile_bound(10.0, 3.0, 0.9) == 13.0
    assert quantile_bound(10.0, 3.0, 0.1) == 10.0
    assert quantile_bound(10.0, -30.0, 0.1) == 0.0
    assert quantile_bound(10.0, -30.0, 0.1, floor=None) == -20.0


def test_aci_step_moves_towards_the_target_and_is_clamped():
    assert aci_step(0.9, 1.0, 0.9, 0.1) == pytest.approx(0.89)
    assert aci_step(0.9, 0.0, 0.9, 0.1) == pytest.approx(0.99)
    assert aci_step(1.5, 0.0, 0.9, 0.5) == 1.5
    with pytest.raises(ValueError, match="gamma"):
        aci_step(0.9, 0.0, 0.9, 0.0)


def test_new_point_count_growing_and_sliding():
    h = np.arange(20.0)
    assert new_point_count(h[:10][-8:], 10, h[:12]) == 2
    assert new_point_count(h[2:12][-8:], 10, h[3:13]) == 1  # sliding window
    assert new_point_count(h[:10][-8:], 10, h[:10]) == 0
    assert new_point_count(np.array([99.0, 98.0]), 2, h) is None
    assert new_point_count(np.empty(0), 0, h) is None


# ------------------------------------------------------------------ the bank


def test_bank_rows_equal_one_bank_per_series():
    rng = np.random.default_rng(4)
    keys = [("app", f"op{i}") for i in range(6)]
    many = ConformalBank(window=40, levels=[0.9, 0.99], min_scores=1)
    single = {k: ConformalBank(window=40, levels=[0.9, 0.99], min_scores=1) for k in keys}
    for _ in range(120):
        actual, predicted = rng.gamma(3.0, 20.0, 6), rng.gamma(3.0, 20.0, 6)
        for i, k in enumerate(keys):
            single[k].update([k], actual[i], predicted[i])
        many.update(keys, actual, predicted)
    points = rng.uniform(10, 100, 6)
    for q in (0.9, 0.99, 0.8):
        got = many.upper(keys, points, q)
        want = [single[k].upper([k], points[i], q)[0] for i, k in enumerate(keys)]
        np.testing.assert_array_equal(got, want)
    # Per-key quantiles (one QoS class per application).
    q = np.array([0.99, 0.9, 0.9, 0.99, 0.8, 0.9])
    mixed = many.upper(keys, points, q)
    for i, k in enumerate(keys):
        assert mixed[i] == single[k].upper([k], points[i], q[i])[0]


def test_bank_plain_matches_rate_for_quantile_and_forgets():
    rng = np.random.default_rng(8)
    bank = ConformalBank(window=25, adaptive=False)
    for _ in range(60):
        bank.update(["a", "b"], rng.normal(50, 5, 2), [50.0, 50.0])
    for key in ("a", "b"):
        assert bank.scores(key).size == 25
        assert bank.upper([key], 50.0, 0.9)[0] == rate_for_quantile(50.0, bank.scores(key), 0.9)
    assert bank.cold(["a", "c"]) == ["c"]
    assert bank.upper(["c"], 7.0, 0.9)[0] == 7.0  # unknown key: the forecast
    bank.forget_except(["a"])
    assert "b" not in bank and len(bank) == 1
    bank.update(["d"], 1.0, 1.0)  # reuses b's row, starting empty
    assert bank.count(["d"]).tolist() == [1]


def test_bank_grows_past_its_initial_capacity():
    bank = ConformalBank(window=5)
    keys = list(range(100))
    bank.update(keys, np.arange(100.0), np.zeros(100))
    assert bank.scores(99).tolist() == [99.0]


def test_interval_lower_at_most_point_at_most_upper():
    rng = np.random.default_rng(9)
    bank = ConformalBank(window=100, levels=[0.05, 0.95])
    for _ in range(150):
        bank.update(["x"], rng.normal(20, 4), 20.0)
    lo, hi = bank.interval(["x"], 20.0, 0.9)
    assert lo[0] < 20.0 < hi[0]


# ---------------------------------------------------------------- the wrapper


@pytest.mark.parametrize(
    "base",
    [
        LastValue(),
        LinearTrend(5),
        Arima(order=(1, 0, 0)),
        MaxRule((LinearTrend(5), LastValue())),
        Seasonal(fallback=LinearTrend(5)),
    ],
    ids=["last_value", "linear_trend", "arima", "max_rule", "seasonal"],
)
def test_every_forecaster_gets_an_upper_quantile(base):
    series = ar1(60, seed=2)
    model = WithConformalUpper(base, window=50)
    for t in range(25, 60):
        fc = model.predict(series[:t])
        assert fc.bound >= fc.value >= 0.0
        assert fc.value == base.forecast(series[:t])[0]
    assert model.last.scores == 34
    assert model.upper(series, 0.99) >= model.upper(series, 0.9)
    lo, hi = model.interval(series, 0.9)
    assert lo <= model.forecast(series)[0] <= hi


def test_wrapper_equals_the_replay():
    series = ar1(300, seed=12)
    model = WithConformalUpper(LastValue(), window=50, min_scores=1)
    bounds = [model.predict(series[:t]).bound for t in range(1, series.size)]
    replay = conformal_replay(series[:-1], series[1:], 0.9, window=50)
    np.testing.assert_allclose(bounds[1:], replay[1:], rtol=0, atol=1e-12)


def test_wrapper_sliding_window_and_repeated_calls():
    series = ar1(200, seed=6)
    model = WithConformalUpper(LastValue(), window=30)
    for t in range(20, 200):
        window = series[t - 20 : t]
        a = model.predict(window)
        b = model.predict(window)  # same slot asked twice: no new score
        assert a == b
    assert model.last.scores == 30


def test_wrapper_cold_start_fallback_is_documented():
    model = WithConformalUpper(LastValue(), min_scores=10)
    one = model.predict([5.0])
    assert one.bound == one.value == 5.0
    assert "no one-step error" in one.fallback_reason
    short = WithConformalUpper(LastValue(), min_scores=10).predict([5.0, 9.0, 4.0, 8.0])
    assert short.bound > short.value
    assert "last-value errors of the history" in short.fallback_reason


# ------------------------------------------------------------------ bad input


@pytest.mark.parametrize("q", [0.0, 1.0, -0.1, 1.5, math.nan, "x"])
def test_quantile_outside_the_open_unit_interval_is_rejected(q):
    with pytest.raises(ValueError, match="quantile"):
        rate_for_quantile(1.0, [0.1, 0.2], q)
    with pytest.raises(ValueError, match="quantile"):
        WithConformalUpper(LastValue(), quantile=q)


def test_bad_input_raises_clear_errors():
    model = WithConformalUpper(LastValue())
    with pytest.raises(ValueError, match="non-finite"):
        model.predict([1.0, math.nan, 2.0])
    with pytest.raises(ValueError, match="at least 1"):
        model.predict([])
    with pytest.raises(ValueError, match=">= 0.5"):
        model.upper([1.0, 2.0], 0.2)
    with pytest.raises(ValueError, match="base"):
        WithConformalUpper(object())
    bank = ConformalBank()
    with pytest.raises(ValueError, match="actual contains a non-finite value for key 'b'"):
        bank.update(["a", "b"], [1.0, math.nan], [1.0, 1.0])
    with pytest.raises(ValueError, match="unique"):
        bank.update(["a", "a"], [1.0, 2.0], [1.0, 1.0])
    with pytest.raises(ValueError, match="levels"):
        ConformalBank(levels=[0.9, 1.0])
    with pytest.raises(ValueError, match="window"):
        ConformalBank(window=0)
    with pytest.raises(ValueError, match="infinities"):
        conformal_offset([1.0, math.inf], 0.9)
    with pytest.raises(ValueError, match="same"):
        conformal_replay([1.0, 2.0], [1.0], 0.9)


def test_the_banks_median_moves_a_warm_forecast_either_way_and_leaves_a_cold_one():
    bank = ConformalBank(levels=[0.9], min_scores=10)
    over, under, cold = "over", "under", "cold"
    rng = np.random.default_rng(4)
    for _ in range(30):
        # "over" arrives 20 below its forecast more often than not, "under" 15 above.
        bank.update([over, under], [80.0 + rng.normal(0, 5), 115.0 + rng.normal(0, 5)], 100.0)
    for _ in range(9):
        bank.update([cold], 50.0, 100.0)
    got = bank.median([over, under, cold, "unknown"], [100.0, 100.0, 100.0, 7.0])
    assert got[0] == pytest.approx(100.0 + conformal_offset(bank.scores(over), 0.5))
    assert got[0] < 100.0 < got[1]
    assert got[1] == pytest.approx(100.0 + conformal_offset(bank.scores(under), 0.5))
    assert got[2] == 100.0  # nine errors: no median yet
    assert got[3] == 7.0
    # The median of the scores, not their mean: one huge miss does not move it.
    bank.update([over], 1e6, 100.0)
    assert bank.median([over], 100.0)[0] == pytest.approx(got[0], abs=1.0)
    # Arrival rates are never negative, unless asked.
    assert bank.median([over], 5.0)[0] == 0.0
    assert bank.median([over], 5.0, floor=None)[0] < 0.0
