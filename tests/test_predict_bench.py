"""The pieces of `dsched bench predict`: the G/G/M simulator against exact M/M/c
results, the forecast and interval scoring, and the queueing summary."""

from __future__ import annotations

import numpy as np
import pytest

from bench.predict import (
    PREDICTORS,
    interval_coverage,
    load_traces,
    one_step_errors,
    one_step_forecasts,
    queueing_summary,
    seasonal_summary,
    simulate_ggm_wait,
    unseen_traces,
)
from predict.load import Arima
from predict.queueing import allen_cunneen_wait, erlang_c_wait


@pytest.mark.parametrize("servers,rho", [(1, 0.7), (2, 0.8), (4, 0.6)])
def test_simulator_matches_erlang_c_for_mmc(servers, rho):
    lam = rho * servers
    sim, stderr = simulate_ggm_wait(lam, 1.0, servers, 1.0, 1.0, customers=150_000, seed=11)
    exact = erlang_c_wait(lam, 1.0, servers)
    assert abs(sim - exact) < max(4 * stderr, 0.03 * exact)


def test_simulator_deterministic_service_matches_pollaczek_khinchine():
    # M/D/1: Wq = rho / (2 mu (1 - rho)), which Allen-Cunneen also gives exactly.
    lam = 0.6
    sim, stderr = simulate_ggm_wait(lam, 1.0, 1, 1.0, 1e-6, customers=150_000, seed=5)
    exact = 0.6 / (2 * 0.4)
    assert abs(sim - exact) < max(4 * stderr, 0.03 * exact)
    assert allen_cunneen_wait(lam, 1.0, 1, 1.0, 0.0) == pytest.approx(exact)


def test_one_step_errors_scores_every_predictor():
    series = 50.0 + 2.0 * np.arange(50, dtype=float)
    scores = one_step_errors(series, warmup=30)
    forecasts = scores.pop("_forecasts")
    assert set(scores) == set(PREDICTORS) == set(forecasts)
    # A straight line: the linear trend is exact, last value is off by the slope.
    assert scores["linear_trend"]["rmse"] == pytest.approx(0.0, abs=1e-9)
    assert scores["last_value"]["rmse"] == pytest.approx(2.0)
    # No period in a line: the seasonal forecaster is its fallback, the max rule.
    assert scores["seasonal"]["rmse"] == scores["max_rule"]["rmse"]
    assert scores["seasonal"]["slots_seasonal"] == 0


def test_shared_objects_give_what_separate_ones_give():
    # The max rule and the seasonal fallback share the ARIMA object with the "arima"
    # column: asking it again for the same history must not change its answer.
    series = 100.0 + 10.0 * np.sin(np.arange(70) / 3.0)
    preds, _ = one_step_forecasts(series, warmup=40)
    alone = Arima()
    np.testing.assert_array_equal(
        preds["arima"], [alone.forecast(series[:t])[0] for t in range(40, 70)]
    )
    np.testing.assert_array_equal(
        preds["max_rule"], np.maximum(preds["linear_trend"], preds["arima"])
    )


def test_unseen_traces_are_seeded_and_sane():
    a, b = unseen_traces(1), unseen_traces(1)
    assert set(a) == {
        "multi_day",
        "multi_day_noisy",
        "batch_spikes",
        "pareto_onoff",
        "random_walk",
    }
    for name in a:
        np.testing.assert_array_equal(a[name], b[name])
        assert a[name].shape == (720,) and np.all(np.isfinite(a[name])) and np.all(a[name] >= 0)
    assert not np.array_equal(unseen_traces(2)["random_walk"], a["random_walk"])


def test_interval_coverage_counts_after_the_burn_in():
    rng = np.random.default_rng(0)
    actual = rng.normal(100.0, 5.0, 600)
    preds = {"flat": np.full(600, 100.0), "low": np.full(600, 90.0)}
    cov = interval_coverage(preds, actual, window=100, burn_in=20)
    for name in preds:
        for method in ("conformal", "aci"):
            assert 0.86 <= cov[name][method]["upper_0.9"] <= 0.94
            assert 0.86 <= cov[name][method]["central_0.9"] <= 0.94
    # The biased forecaster needs the larger margin.
    assert cov["low"]["aci"]["upper_0.9_margin"] > cov["flat"]["aci"]["upper_0.9_margin"]


def test_seasonal_summary_splits_periodic_from_aperiodic():
    load = {
        "triangle": {"seasonal": {"rmse_vs_last_value": 0.5, "rmse_vs_max_rule": 0.7}},
        "poisson": {"seasonal": {"rmse_vs_last_value": 0.9, "rmse_vs_max_rule": 1.0}},
    }
    s = seasonal_summary(load)
    assert s["periodic_rmse_vs_last_value"] == {"triangle": 0.5}
    assert s["aperiodic_rmse_vs_max_rule"] == {"poisson": 1.0}
    assert s["periodic_min_gain_vs_last_value"] == pytest.approx(0.5)


def test_benchmark_traces_are_seeded_and_cover_the_named_shapes():
    a, b = load_traces(1, quick=True), load_traces(1, quick=True)
    assert set(a) == {"triangle", "random_steps", "diurnal", "poisson", "weibull"}
    for name in a:
        np.testing.assert_array_equal(a[name], b[name])
        assert np.all(np.isfinite(a[name])) and np.all(a[name] >= 0)
    # Poisson and Weibull arrivals at 0.2..1 per 100 ms: 2..10 per second.
    assert 1.5 < a["poisson"].mean() < 10.5


def test_queueing_summary_median_and_counts():
    rows = [
        {
            "utilization": 0.5,
            "servers": 1,
            "arrival_scv": 1.0,
            "service_scv": 1.0,
            "relative_error": 0.02,
        },
        {
            "utilization": 0.9,
            "servers": 2,
            "arrival_scv": 0.25,
            "service_scv": 1.0,
            "relative_error": -0.2,
        },
        {
            "utilization": 0.9,
            "servers": 2,
            "arrival_scv": 2.0,
            "service_scv": 1.0,
            "relative_error": 0.5,
        },
        {
            "utilization": 0.3,
            "servers": 2,
            "arrival_scv": 1.0,
            "service_scv": 1.0,
            "relative_error": 0.9,
        },
    ]
    s = queueing_summary(rows)
    assert s["median_abs_relative_error_util_0.5_0.95_scv_le_1"] == pytest.approx(0.11)
    assert s["cells_over_10pct"] == 3
    assert s["by_servers"]["1"] == pytest.approx(0.02)
