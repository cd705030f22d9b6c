"""The seasonal forecaster: period detection, the decomposition forecast, the online
choice against its fallback, registration and bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest

from predict.load import PREDICTORS, LastValue, LinearTrend, make_predictor
from predict.seasonal import (
    MaxRule,
    Seasonal,
    autocorrelation,
    detect_period,
    seasonal_forecast,
    seasonal_profile,
)


def periodic(n: int, period: int, seed: int = 0, noise: float = 4.0) -> np.ndarray:
    """A peaked daily-like shape of ``period`` slots, level 100, Gaussian noise."""
    rng = np.random.default_rng(seed)
    t = np.arange(n)
    shape = (0.5 * (1.0 - np.cos(2.0 * np.pi * (t % period) / period))) ** 2
    return 40.0 + 160.0 * shape + noise * rng.standard_normal(n)


def rolling(model, series: np.ndarray, start: int) -> np.ndarray:
    return np.array([model.forecast(series[:t])[0] for t in range(start, series.size)])


def rmse(forecasts: np.ndarray, actual: np.ndarray) -> float:
    return float(np.sqrt(np.mean((forecasts - actual) ** 2)))


# ------------------------------------------------------------ period detection


@pytest.mark.parametrize("period", [7, 12, 24, 50])
@pytest.mark.parametrize("seed", [0, 1])
def test_detect_period_finds_the_period(period, seed):
    assert detect_period(periodic(8 * period, period, seed)) == period


def test_detect_period_of_a_triangle_through_poisson_counts():
    rng = np.random.default_rng(3)
    t = np.arange(500)
    rate = 20 + 380 * (1 - np.abs(2 * (t % 60) / 60 - 1))
    assert detect_period(rng.poisson(rate * 10) / 10) == 60


@pytest.mark.parametrize(
    "kind",
    ["white_noise", "random_walk", "trend", "constant", "short"],
)
def test_detect_period_is_none_without_a_period(kind):
    rng = np.random.default_rng(4)
    series = {
        "white_noise": 100 + 10 * rng.standard_normal(600),
        "random_walk": 100 + np.cumsum(rng.normal(0, 3, 600)),
        "trend": 10 + 0.5 * np.arange(600) + rng.standard_normal(600),
        "constant": np.full(600, 42.0),
        "short": periodic(30, 24),  # not two periods
    }[kind]
    assert detect_period(series) is None


def test_autocorrelation_is_one_at_lag_zero_and_zero_for_a_line():
    acf = autocorrelation(periodic(200, 20), 40)
    assert acf[0] == pytest.approx(1.0) and acf[20] > 0.8
    assert np.all(autocorrelation(3.0 + 2.0 * np.arange(50.0), 10)[1:] == 0.0)


# ---------------------------------------------------------------- the forecast


@pytest.mark.parametrize("kind", ["additive", "multiplicative", "auto"])
def test_noise_free_periodic_series_is_forecast_almost_exactly(kind):
    y = periodic(240, 24, noise=0.0)
    values, used = seasonal_forecast(y, 24, horizon=24, kind=kind)
    truth = periodic(264, 24, noise=0.0)[240:]
    np.testing.assert_allclose(values, truth, atol=0.05 * truth.std())
    assert used in ("additive", "multiplicative")


def test_multiplicative_shape_is_chosen_when_the_volume_scales_the_day():
    t = np.arange(480)
    shape = 1.0 + 0.8 * np.sin(2 * np.pi * t / 48)
    volume = np.repeat([100.0, 140.0, 90.0, 150.0, 110.0, 130.0, 120.0, 100.0, 140.0, 150.0], 48)
    _, used = seasonal_forecast(volume * shape, 48, cycles=6)
    assert used == "multiplicative"
    profile = seasonal_profile(volume * shape, 48, kind="multiplicative")
    assert profile.mean() == pytest.approx(1.0) and profile.min() > 0


def test_seasonal_beats_last_value_by_20_percent_on_a_periodic_series():
    series = periodic(600, 48, seed=5)
    model = Seasonal(fallback=LinearTrend(5))
    start = 100
    seasonal = rolling(model, series, start)
    last = rolling(LastValue(), series, start)
    actual = series[start:]
    assert model.period == 48
    assert rmse(seasonal, actual) <= 0.8 * rmse(last, actual)
    assert model.last.method.startswith("seasonal")


@pytest.mark.parametrize("kind", ["white_noise", "random_walk"])
def test_falls_back_to_the_default_without_a_period(kind):
    rng = np.random.default_rng(6)
    n = 130
    series = {
        "white_noise": 100 + 10 * rng.standard_normal(n),
        "random_walk": 100 + np.cumsum(rng.normal(0, 3, n)),
    }[kind]
    default = MaxRule()  # the controller's default: linear trend and ARIMA
    model = Seasonal(fallback=default)
    start = 90
    got, want = [], []
    for t in range(start, n):
        got.append(model.forecast(series[:t])[0])
        want.append(default.forecast(series[:t])[0])
    actual = series[start:]
    assert rmse(np.array(got), actual) <= 1.05 * rmse(np.array(want), actual)
    assert model.last.method == "fallback"


@pytest.mark.parametrize("kind", ["white_noise", "random_walk", "steps"])
def test_never_worse_than_its_fallback_by_more_than_5_percent(kind):
    rng = np.random.default_rng(7)
    n = 800
    series = {
        "white_noise": 100 + 10 * rng.standard_normal(n),
        "random_walk": 100 + np.cumsum(rng.normal(0, 3, n)),
        "steps": np.repeat(rng.uniform(50, 150, n // 40), 40) + rng.normal(0, 3, n),
    }[kind]
    fallback = MaxRule((LinearTrend(5), LastValue()))
    model = Seasonal(fallback=fallback)
    start = 50
    got = rolling(model, series, start)
    want = rolling(MaxRule((LinearTrend(5), LastValue())), series, start)
    actual = series[start:]
    assert rmse(got, actual) <= 1.05 * rmse(want, actual)


def test_a_period_that_does_not_pay_is_not_used():
    # A weak period under heavy noise: the seasonal forecast is no better than a
    # long-window mean, so that fallback stays (the reason says why).
    rng = np.random.default_rng(8)
    t = np.arange(400)
    series = 100 + 3 * np.sin(2 * np.pi * t / 20) + 30 * rng.standard_normal(400)
    model = Seasonal(fallback=LinearTrend(100), min_acf=0.0, min_prominence=0.0)
    for k in range(100, 400):
        model.predict(series[:k])
    assert model.last.method == "fallback"
    assert model.last.fallback_reason


def test_same_history_twice_is_one_slot():
    series = periodic(300, 24)
    model = Seasonal(fallback=LastValue())
    for t in range(60, 300):
        a = model.predict(series[:t])
        assert model.predict(series[:t]) is a
    assert len(model._errors) == model.select_window


def test_registered_by_name_and_horizon():
    assert PREDICTORS["seasonal"] is Seasonal and PREDICTORS["max_rule"] is MaxRule
    model = make_predictor("seasonal", fallback=LastValue())
    series = periodic(400, 20, seed=2)
    for t in range(100, 400):
        model.forecast(series[:t])
    values = model.forecast(series, horizon=5)
    assert values.shape == (5,) and np.all(values >= 0)
    assert make_predictor("max_rule").predict([1.0, 2.0, 3.0]).method.startswith("max_rule")


# ------------------------------------------------------------------ bad input


def test_bad_input():
    model = Seasonal(fallback=LastValue())
    with pytest.raises(ValueError, match="non-finite"):
        model.forecast([1.0, math.nan, 3.0])
    with pytest.raises(ValueError, match="at least 1"):
        model.forecast([])
    with pytest.raises(ValueError, match="horizon"):
        model.forecast([1.0, 2.0], horizon=0)
    with pytest.raises(ValueError, match="margin"):
        Seasonal(fallback=LastValue(), margin=1.0)
    with pytest.raises(ValueError, match="min_trial"):
        Seasonal(fallback=LastValue(), min_trial=40, select_window=30)
    with pytest.raises(ValueError, match="fallback"):
        Seasonal(fallback=object())
    with pytest.raises(ValueError, match="two periods"):
        seasonal_profile(np.arange(30.0), 24)
    with pytest.raises(ValueError, match="kind"):
        seasonal_forecast(periodic(100, 10), 10, kind="weird")
    with pytest.raises(ValueError, match="non-finite"):
        detect_period([1.0, math.inf, 2.0, 3.0, 4.0])


def test_too_short_history_falls_back_with_a_reason():
    fc = Seasonal(fallback=LastValue()).predict([3.0, 4.0, 5.0])
    assert fc.method == "fallback" and fc.values.tolist() == [5.0]
    assert fc.fallback_reason == "no period in the history"
