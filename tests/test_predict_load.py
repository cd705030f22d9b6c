"""Load forecasts: linear trend, ARIMA with its cheap updates and fallbacks, the DAG
propagation and the max rule."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from predict.load import (
    Arima,
    LastValue,
    LinearTrend,
    combine,
    fit_arma_state,
    make_predictor,
    propagate,
)


def test_linear_series_is_forecast_exactly():
    history = 3.0 + 2.5 * np.arange(12)
    np.testing.assert_allclose(
        LinearTrend(5).forecast(history, horizon=3), 3.0 + 2.5 * np.arange(12, 15)
    )


def test_linear_trend_uses_only_the_window():
    # Old points on another line must not matter.
    history = np.concatenate([np.full(20, 1000.0), 10.0 + np.arange(5)])
    assert LinearTrend(5).forecast(history)[0] == pytest.approx(15.0)


def test_linear_trend_single_point_is_flat_and_floor_clips():
    assert LinearTrend(5).forecast([7.0], 2).tolist() == [7.0, 7.0]
    falling = [10.0, 6.0, 2.0]
    assert LinearTrend(5).forecast(falling)[0] == 0.0
    assert LinearTrend(5, floor=None).forecast(falling)[0] == pytest.approx(-2.0)


@pytest.mark.parametrize("predictor", [LinearTrend(5), LastValue(), Arima()])
@pytest.mark.parametrize(
    "history,match",
    [
        ([], "at least 1"),
        ([1.0, math.nan, 2.0], "non-finite"),
        ([1.0, math.inf], "non-finite"),
        ("abc", "numbers"),
    ],
)
def test_bad_history_raises_value_error(predictor, history, match):
    with pytest.raises(ValueError, match=match):
        predictor.forecast(history)


def test_bad_constructor_and_horizon_arguments():
    with pytest.raises(ValueError, match="window"):
        LinearTrend(0)
    with pytest.raises(ValueError, match="horizon"):
        LinearTrend(3).forecast([1, 2, 3], horizon=0)
    with pytest.raises(ValueError, match="order"):
        Arima(order=(1, 2, 1))
    with pytest.raises(ValueError, match="predictor"):
        make_predictor("crystal_ball")
    assert isinstance(make_predictor("linear_trend", window=3), LinearTrend)


def _ar1(n: int, phi: float = 0.7, mean: float = 100.0, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    y = np.empty(n)
    y[0] = mean
    for t in range(1, n):
        y[t] = mean + phi * (y[t - 1] - mean) + rng.normal(0, 5)
    return y


def test_arima_short_history_falls_back_to_linear_trend_and_says_so():
    result = Arima(min_history=20).predict([1.0, 2.0, 3.0, 4.0])
    assert result.method == "linear_trend"
    assert "fewer than 20" in result.fallback_reason
    assert result.values[0] == pytest.approx(5.0)


def test_arima_constant_series_never_raises():
    result = Arima().predict(np.full(40, 5.0))
    assert np.all(np.isfinite(result.values))
    assert result.values[0] == pytest.approx(5.0, abs=1e-6)


def test_arima_fixed_order_matches_statsmodels_forecast():
    from statsmodels.tsa.arima.model import ARIMA

    y = _ar1(200)
    ours = Arima(order=(1, 0, 0)).forecast(y, horizon=3)
    ref = (
        ARIMA(y, order=(1, 0, 0), trend="c", concentrate_scale=True)
        .fit(cov_type="none")
        .forecast(3)
    )
    np.testing.assert_allclose(ours, ref, rtol=1e-6)


def test_kalman_update_equals_statsmodels_filter_with_fixed_parameters():
    from statsmodels.tsa.arima.model import ARIMA

    y = _ar1(160, seed=4)
    state = fit_arma_state(y[:120], (1, 0, 1))
    for value in y[120:]:
        state.push(float(value))
    fitted = ARIMA(y[:120], order=(1, 0, 1), trend="c", concentrate_scale=True).fit(cov_type="none")
    extended = fitted.append(y[120:], refit=False)
    np.testing.assert_allclose(state.forecast(4), extended.forecast(4), rtol=1e-6)


def test_arima_keeps_its_fit_and_updates_cheaply():
    y = _ar1(260, seed=1)
    model = Arima(refit_every=50, error_growth=100.0)
    first = model.predict(y[:200])
    assert first.method == "arima" and first.refitted
    for t in range(201, 240):
        result = model.predict(y[:t])
        assert not result.refitted
    assert model.fits == 1
    # Reaching refit_every new points refreshes the parameters.
    for t in range(240, 252):
        model.predict(y[:t])
    assert model.fits == 2


def test_arima_follows_a_sliding_window():
    y = _ar1(260, seed=2)
    model = Arima(error_growth=100.0)
    for t in range(100, 130):
        model.predict(y[t - 100 : t])
    assert model.fits == 1


def test_arima_advances_through_runs_of_equal_values():
    y = np.concatenate([_ar1(120, seed=6), np.zeros(12)])
    model = Arima(error_growth=1e9, refit_every=1000)
    model.predict(y[:110])
    reference = Arima(error_growth=1e9, refit_every=1000)
    reference.predict(y[:110])
    for t in range(111, y.size + 1):
        model.predict(y[:t])
    # The same points fed explicitly: identical state, so identical forecasts.
    reference.observe(y[110:])
    np.testing.assert_allclose(model.forecast(y, 3), reference.forecast_ahead(3))
    assert model.fits == reference.fits == 1


def test_arima_observe_needs_a_fit_and_finite_values():
    model = Arima()
    with pytest.raises(ValueError, match="no fitted model"):
        model.observe([1.0])
    model.predict(_ar1(60))
    with pytest.raises(ValueError, match="values"):
        model.observe([math.nan])


def test_arima_refits_when_history_does_not_line_up():
    model = Arima(error_growth=100.0)
    model.predict(_ar1(100, seed=1))
    model.predict(_ar1(100, seed=9))
    assert model.fits == 2


def test_arima_refits_when_error_grows():
    y = _ar1(150, seed=3)
    model = Arima(refit_every=1000, error_growth=2.0, error_window=5)
    model.predict(y)
    shifted = np.concatenate([y, y[-1] + 500.0 * np.arange(1, 8)])
    fits_before = model.fits
    for t in range(y.size + 1, shifted.size + 1):
        model.predict(shifted[:t])
    assert model.fits > fits_before


def test_arima_beats_last_value_on_noisy_ar_process():
    y = _ar1(300, phi=0.3, seed=5)
    model = Arima()
    arima_err, naive_err = [], []
    for t in range(100, 300):
        arima_err.append(model.forecast(y[:t])[0] - y[t])
        naive_err.append(y[t - 1] - y[t])
    assert np.sqrt(np.mean(np.square(arima_err))) < np.sqrt(np.mean(np.square(naive_err)))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(0.0, 1e6), min_size=1, max_size=40))
def test_forecasts_are_never_nan(history):
    for predictor in (LinearTrend(5), LastValue()):
        assert np.all(np.isfinite(predictor.forecast(history, 2)))


@settings(max_examples=8, deadline=None)
@given(st.lists(st.floats(0.0, 1e4), min_size=20, max_size=40))
def test_arima_never_raises_or_returns_nan_on_ordinary_data(history):
    result = Arima(max_p=1, max_q=1).predict(history, 2)
    assert np.all(np.isfinite(result.values))
    assert result.method in ("arima", "linear_trend")


DIAMOND = {"src": ["a", "b"], "a": ["sink"], "b": ["sink"], "sink": []}


def test_propagate_diamond():
    rates = propagate(
        DIAMOND,
        {"src": 100.0},
        selectivity={"src": 1.0, "a": 0.5, ("b", "sink"): 2.0},
        queue_change={"src": 10.0, "b": -5.0},
    )
    # A parent processes its arrivals less its queue's growth (the paper's
    # delta = executed - arrivals): src's queue grows by 10/s, so a and b get
    # (100 - 10) * 1; b's shrinks by 5/s, so it sends (90 + 5) * 2 to sink.
    assert rates == {"src": 100.0, "a": 90.0, "b": 90.0, "sink": pytest.approx(45.0 + 190.0)}


def test_propagate_a_parent_falling_behind_sends_less_and_one_draining_sends_more():
    # The sign matters: a parent whose queue grows cannot be sending its children
    # more than it receives, and one working off its queue sends them more.
    behind = propagate({"s": ["x"], "x": []}, {"s": 100.0}, queue_change={"s": 30.0})
    draining = propagate({"s": ["x"], "x": []}, {"s": 100.0}, queue_change={"s": -30.0})
    assert behind["x"] == 70.0 and draining["x"] == 130.0


def test_propagate_clamps_negative_processing_and_combines_along_the_dag():
    rates = propagate({"s": ["x"], "x": ["y"]}, {"s": 10.0}, queue_change={"s": 50.0})
    assert rates["x"] == 0.0 and rates["y"] == 0.0
    rates = propagate({"s": ["x"], "x": ["y"]}, {"s": 10.0}, combine_with={"x": 40.0})
    assert rates["x"] == 40.0 and rates["y"] == 40.0


def test_propagate_bad_input():
    with pytest.raises(ValueError, match="cycle"):
        propagate({"a": ["b"], "b": ["a"]}, {})
    with pytest.raises(ValueError, match="source operator 'src'"):
        propagate(DIAMOND, {})
    with pytest.raises(ValueError, match="source_rates"):
        propagate(DIAMOND, {"src": -1.0})
    with pytest.raises(ValueError, match="not in dag"):
        propagate(DIAMOND, {"src": 1.0, "ghost": 2.0})
    with pytest.raises(ValueError, match=r"selectivity\['a'\]"):
        propagate(DIAMOND, {"src": 1.0}, selectivity={"a": math.nan})
    with pytest.raises(ValueError, match="queue_change"):
        propagate(DIAMOND, {"src": 1.0}, queue_change={"src": math.inf})


def test_combine_takes_the_max_and_names_the_winner():
    result = combine({"linear_trend": 12.0, "arima": 15.5, "parents": None})
    assert result.value == 15.5 and result.winner == "arima"
    assert "arima" in result.reason and "linear_trend=12" in result.reason
    tie = combine({"linear_trend": 3.0, "arima": 3.0})
    assert tie.winner == "linear_trend"


def test_combine_bad_input():
    with pytest.raises(ValueError, match="no predictor"):
        combine({"arima": None})
    with pytest.raises(ValueError, match="arima"):
        combine({"arima": math.nan})
