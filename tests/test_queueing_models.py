"""The G/G/M models of predict.queueing against exact results and simulation.

* exact cases: M/M/m (Erlang C), M/D/1 and M/G/1 (Pollaczek--Khinchine), the M/M/m
  sojourn-time distribution;
* monotonicity in utilization and variability (hypothesis);
* array versions against the scalar ones (hypothesis), the quantile inversion;
* the committed simulated grid (bench/results/queueing-grid.json) rescored with the
  current code meets the accuracy targets, and the fitted constants are reproducible
  from the committed fitting grid;
* a short fresh simulation checks the simulator and the scoring code themselves.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import brentq

from bench import queueing as bq
from predict.queueing import (
    DEFAULT_WAIT_MODEL,
    GGM_DELAY_COEF,
    GGM_WAIT_COEF,
    WAIT_MODELS,
    allen_cunneen_wait,
    delay_probability,
    erlang_c,
    erlang_c_wait,
    ggm_wait,
    ggm_wait_many,
    min_service_rate_for_sojourn,
    min_service_rate_for_sojourn_many,
    min_service_rate_for_sojourn_quantile,
    min_service_rate_for_sojourn_quantile_many,
    min_service_rate_many,
    sojourn_quantile,
    sojourn_quantile_many,
    sojourn_tail,
    waiting_time,
    waiting_time_many,
    whitt_wait,
)

RESULTS = Path(__file__).resolve().parents[1] / "bench" / "results"
GRID_JSON = RESULTS / "queueing-grid.json"
FIT_JSON = RESULTS / "queueing-fit-grid.json"

# ------------------------------------------------------------------------ exact cases


@pytest.mark.parametrize("model", ["ggm", "whitt"])
@pytest.mark.parametrize("m", [1, 2, 3, 4, 8, 16])
@pytest.mark.parametrize("rho", [0.1, 0.3, 0.7, 0.95])
def test_mmm_is_erlang_c(model, m, rho):
    lam, mu = rho * m * 2.0, 2.0
    assert waiting_time(model, lam, mu, m, 1.0, 1.0) == pytest.approx(
        erlang_c_wait(lam, mu, m), rel=1e-12
    )


@pytest.mark.parametrize("cs2", [0.0, 0.25, 0.5, 2.0, 3.0, 10.0])
@pytest.mark.parametrize("rho", [0.2, 0.5, 0.9])
def test_mg1_is_pollaczek_khinchine(cs2, rho):
    mu = 4.0
    lam = rho * mu
    pk = rho * (1 + cs2) / (2 * mu * (1 - rho))
    assert ggm_wait(lam, mu, 1, 1.0, cs2) == pytest.approx(pk, rel=1e-12)
    if cs2 == 0:  # M/D/1: W = rho / (2 mu (1 - rho))
        assert ggm_wait(lam, mu, 1, 1.0, 0.0) == pytest.approx(rho / (2 * mu * (1 - rho)))


def test_delay_probability_exact_cases():
    assert delay_probability("ggm", 0.6, 1.0, 1, 1.0, 0.3) == pytest.approx(0.6)
    assert delay_probability("ggm", 3.0, 1.0, 4, 1.0, 1.0) == pytest.approx(erlang_c(3.0, 4))
    assert delay_probability("erlang-c", 3.0, 1.0, 4) == pytest.approx(erlang_c(3.0, 4))
    # Smooth arrivals wait less often than Poisson ones, bursty ones more often.
    smooth = delay_probability("ggm", 0.5, 1.0, 1, 0.25, 1.0)
    bursty = delay_probability("ggm", 0.5, 1.0, 1, 2.0, 1.0)
    assert smooth < 0.5 < bursty


@pytest.mark.parametrize("q", [0.5, 0.9, 0.99, 0.999])
def test_mm1_sojourn_is_exponential(q):
    lam, mu = 3.0, 4.0
    expected = -math.log(1 - q) / (mu - lam)
    for model in ("ggm", "erlang-c", "allen-cunneen", "kingman"):
        assert sojourn_quantile(model, q, lam, mu, 1, 1.0, 1.0) == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize(("m", "rho", "q"), [(2, 0.6, 0.9), (4, 0.85, 0.99), (8, 0.95, 0.99)])
def test_mmm_sojourn_quantile_is_exact(m, rho, q):
    # FCFS M/M/m: wait is 0 w.p. 1 - C, else Exp(m mu - lambda); service Exp(mu), independent.
    mu = 1.5
    lam = rho * m * mu
    c = erlang_c(lam / mu, m)
    alpha = m * mu - lam

    def tail(t):
        both = (alpha * math.exp(-mu * t) - mu * math.exp(-alpha * t)) / (alpha - mu)
        return (1 - c) * math.exp(-mu * t) + c * both

    expected = brentq(lambda t: tail(t) - (1 - q), 0, 1e3, xtol=1e-14)
    assert sojourn_quantile("ggm", q, lam, mu, m, 1.0, 1.0) == pytest.approx(expected, rel=1e-9)
    assert sojourn_tail("ggm", expected, lam, mu, m, 1.0, 1.0) == pytest.approx(1 - q, rel=1e-8)


def test_no_arrivals_sojourn_is_the_service_time():
    # Gamma service with SCV 0.5 (shape 2): quantile of Gamma(2, 1/(2 mu)).
    from scipy.stats import gamma

    mu = 5.0
    assert sojourn_quantile("ggm", 0.99, 0.0, mu, 3, 1.0, 0.5) == pytest.approx(
        gamma.ppf(0.99, 2, scale=1 / (2 * mu)), rel=1e-9
    )
    # Deterministic service never exceeds 1/mu.
    assert sojourn_quantile("ggm", 0.99, 0.0, mu, 3, 1.0, 0.0) == pytest.approx(1 / mu)


# ----------------------------------------------------------------------- monotonicity


@settings(max_examples=300, deadline=None)
@given(
    rho_a=st.floats(0.0, 0.995),
    rho_b=st.floats(0.0, 0.995),
    m=st.integers(1, 32),
    ca2=st.floats(0.0, 4.0),
    cs2=st.floats(0.0, 4.0),
)
def test_ggm_is_monotone_in_utilization(rho_a, rho_b, m, ca2, cs2):
    lo, hi = sorted((rho_a, rho_b))
    w_lo, w_hi = (ggm_wait(r * m, 1.0, m, ca2, cs2) for r in (lo, hi))
    assert math.isfinite(w_lo) and math.isfinite(w_hi)
    assert 0.0 <= w_lo <= w_hi * (1 + 1e-12)
    p_lo, p_hi = (delay_probability("ggm", r * m, 1.0, m, ca2, cs2) for r in (lo, hi))
    assert 0.0 <= p_lo <= p_hi * (1 + 1e-12) + 1e-15 and p_hi <= 1.0


@settings(max_examples=300, deadline=None)
@given(
    rho=st.floats(0.01, 0.99),
    m=st.integers(1, 32),
    a=st.floats(0.0, 4.0),
    b=st.floats(0.0, 4.0),
    other=st.floats(0.0, 4.0),
)
def test_ggm_is_monotone_in_variability(rho, m, a, b, other):
    """More variable arrivals always wait longer; more variable service too, except with
    bursty arrivals (Ca^2 > 1), where the simulation itself shows light-load waits that
    fall as Cs^2 grows (e.g. rho = 0.3, M = 8, Ca^2 = 2 in the committed grid)."""
    lo, hi = sorted((a, b))
    lam = rho * m
    assert ggm_wait(lam, 1.0, m, lo, other) <= ggm_wait(lam, 1.0, m, hi, other) * (1 + 1e-12)
    if other <= 1.0:
        assert ggm_wait(lam, 1.0, m, other, lo) <= ggm_wait(lam, 1.0, m, other, hi) * (1 + 1e-12)


@settings(max_examples=100, deadline=None)
@given(
    rho_a=st.floats(0.0, 0.99),
    rho_b=st.floats(0.0, 0.99),
    m=st.integers(1, 16),
    ca2=st.floats(0.0, 3.0),
    cs2=st.floats(0.0, 3.0),
    q=st.floats(0.5, 0.999),
)
def test_sojourn_quantile_is_monotone_in_utilization(rho_a, rho_b, m, ca2, cs2, q):
    lo, hi = sorted((rho_a, rho_b))
    a, b = (sojourn_quantile("ggm", q, r * m, 1.0, m, ca2, cs2) for r in (lo, hi))
    assert a <= b * (1 + 1e-9)


# ----------------------------------------------------------------- arrays vs scalars

operators = st.tuples(
    st.floats(0.0, 0.98),  # utilization
    st.integers(1, 16),
    st.floats(0.0, 3.0),
    st.floats(0.0, 3.0),
    st.floats(0.05, 20.0),  # service rate
)
# Waits below this are zero for any purpose. A tiny utilization raised to the
# server count lands among subnormal floats (1e-317), which keep a few digits:
# there the array and scalar forms differ by the format's rounding, not the code.
TINY_SECONDS = 1e-300


@settings(max_examples=60, deadline=None)
@given(ops=st.lists(operators, min_size=1, max_size=12), q=st.sampled_from([0.5, 0.9, 0.99]))
def test_array_versions_agree_with_scalar(ops, q):
    rho, m, ca2, cs2, mu = (np.array(x, dtype=float) for x in zip(*ops, strict=True))
    lam = rho * m * mu
    scalar = [ggm_wait(*x) for x in zip(lam, mu, m.astype(int), ca2, cs2, strict=True)]
    np.testing.assert_allclose(
        ggm_wait_many(lam, mu, m, ca2, cs2), scalar, rtol=1e-12, atol=TINY_SECONDS
    )
    np.testing.assert_allclose(
        waiting_time_many("allen-cunneen", lam, mu, m, ca2, cs2),
        [allen_cunneen_wait(*x) for x in zip(lam, mu, m.astype(int), ca2, cs2, strict=True)],
        rtol=1e-12,
        atol=TINY_SECONDS,
    )
    quant = [
        sojourn_quantile("ggm", q, *x) for x in zip(lam, mu, m.astype(int), ca2, cs2, strict=True)
    ]
    np.testing.assert_allclose(
        sojourn_quantile_many("ggm", q, lam, mu, m, ca2, cs2), quant, rtol=1e-8
    )


@settings(max_examples=40, deadline=None)
@given(
    ops=st.lists(
        st.tuples(
            st.floats(0.0, 300.0),  # arrival rate
            st.integers(1, 16),
            st.floats(0.0, 3.0),
            st.floats(0.0, 3.0),
            st.floats(1e-3, 2.0),  # target
        ),
        min_size=1,
        max_size=8,
    ),
    q=st.sampled_from([0.9, 0.99]),
)
def test_quantile_inversion_meets_target_is_minimal_and_matches_scalar(ops, q):
    lam, m, ca2, cs2, t = (np.array(x, dtype=float) for x in zip(*ops, strict=True))
    many = min_service_rate_for_sojourn_quantile_many(q, t, lam, m, ca2, cs2)
    for i in range(len(ops)):
        args = (lam[i], int(m[i]), ca2[i], cs2[i])
        mu = min_service_rate_for_sojourn_quantile(q, t[i], *args)
        assert many[i] == pytest.approx(mu, rel=1e-6)
        assert sojourn_quantile("ggm", q, lam[i], mu, *args[1:]) <= t[i] * (1 + 1e-6)
        below = mu * (1 - 1e-5)
        if below * m[i] > lam[i]:
            assert sojourn_quantile("ggm", q, lam[i], below, *args[1:]) > t[i] * (1 - 1e-7)
    mean_many = min_service_rate_for_sojourn_many(t, lam, m, ca2, cs2, model="ggm")
    for i in range(len(ops)):
        mu = min_service_rate_for_sojourn(t[i], lam[i], int(m[i]), ca2[i], cs2[i], model="ggm")
        assert mean_many[i] == pytest.approx(mu, rel=1e-6)
        assert ggm_wait(lam[i], mu, int(m[i]), ca2[i], cs2[i]) + 1 / mu <= t[i] * (1 + 1e-9)


def test_wait_inversion_for_the_default_model():
    lam = np.array([0.0, 10.0, 250.0, 40.0])
    m = np.array([2, 1, 8, 3])
    t = np.array([0.1, 0.05, 0.002, 0.5])
    mu = min_service_rate_many(t, lam, m, 0.5, 2.0, model=DEFAULT_WAIT_MODEL)
    assert mu[0] == 0.0
    waits = ggm_wait_many(lam[1:], mu[1:], m[1:], 0.5, 2.0)
    np.testing.assert_allclose(waits, t[1:], rtol=1e-6)


# ------------------------------------------------------------------------- bad input


def test_unknown_model_names_it_and_the_known_ones():
    for call in (
        lambda: waiting_time("magic", 1.0, 2.0, 1),
        lambda: sojourn_quantile("magic", 0.9, 1.0, 2.0, 1),
        lambda: waiting_time_many("magic", 1.0, 2.0, 1),
        lambda: min_service_rate_for_sojourn_quantile_many(0.9, 1.0, 1.0, 1, model="magic"),
        lambda: min_service_rate_many(1.0, 1.0, 1, 1.0, 1.0, model="magic"),
    ):
        with pytest.raises(ValueError, match="'magic'") as err:
            call()
        for name in WAIT_MODELS:
            assert name in str(err.value)


def test_unstable_queue_waits_forever():
    assert ggm_wait(2.0, 1.0, 2, 1.0, 1.0) == math.inf
    assert whitt_wait(3.0, 1.0, 2, 0.5, 1.0) == math.inf
    assert sojourn_quantile("ggm", 0.99, 5.0, 1.0, 4, 1.0, 1.0) == math.inf
    assert sojourn_tail("ggm", 10.0, 5.0, 1.0, 4, 1.0, 1.0) == 1.0
    many = sojourn_quantile_many("ggm", 0.9, [1.0, 5.0], 1.0, 4, 1.0, 1.0)
    assert math.isfinite(many[0]) and many[1] == math.inf
    assert np.isinf(ggm_wait_many([4.0, 1.0], 1.0, 4, 1.0, 1.0)).tolist() == [True, False]


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: ggm_wait(1.0, 0.0, 1, 1.0, 1.0), "service_rate"),
        (lambda: ggm_wait(1.0, -2.0, 1, 1.0, 1.0), "service_rate"),
        (lambda: ggm_wait(-1.0, 2.0, 1, 1.0, 1.0), "arrival_rate"),
        (lambda: ggm_wait(1.0, 2.0, 0, 1.0, 1.0), "servers"),
        (lambda: ggm_wait(1.0, 2.0, 1, math.nan, 1.0), "arrival_scv"),
        (lambda: ggm_wait(1.0, 2.0, 1, 1.0, math.nan), "service_scv"),
        (lambda: ggm_wait(1.0, 2.0, 1, -0.5, 1.0), "arrival_scv"),
        (lambda: sojourn_quantile("ggm", 0.0, 1.0, 2.0, 1), r"q must be in the open interval"),
        (lambda: sojourn_quantile("ggm", 1.0, 1.0, 2.0, 1), r"q must be in the open interval"),
        (lambda: sojourn_quantile("ggm", math.nan, 1.0, 2.0, 1), "q"),
        (lambda: sojourn_quantile("ggm", 0.9, 1.0, 0.0, 1), "service_rate"),
        (lambda: sojourn_quantile("ggm", 0.9, 1.0, 2.0, 1, math.nan), "arrival_scv"),
        (lambda: sojourn_quantile_many("ggm", [0.9, 1.5], 1.0, 2.0, 1), "q must be"),
        (lambda: sojourn_quantile_many("ggm", 0.9, 1.0, [2.0, 0.0], 1), "service_rate"),
        (lambda: ggm_wait_many(1.0, 2.0, 1, [1.0, math.nan], 1.0), "arrival_scv"),
        (lambda: min_service_rate_for_sojourn_quantile(1.2, 1.0, 1.0, 1), "q must be"),
        (lambda: min_service_rate_for_sojourn_quantile(0.9, 0.0, 1.0, 1), "target_sojourn"),
        (lambda: min_service_rate_for_sojourn_quantile(0.9, 1.0, -1.0, 1), "arrival_rate"),
        (lambda: min_service_rate_for_sojourn_quantile_many(0.9, [1.0, -1.0], 1.0, 1), "target"),
        (lambda: min_service_rate_for_sojourn_quantile_many(0.9, 1.0, 1.0, 1.5), "servers"),
        (lambda: sojourn_tail("ggm", -1.0, 1.0, 2.0, 1), "t must be"),
    ],
)
def test_bad_input_raises_a_clear_value_error(call, message):
    with pytest.raises(ValueError, match=message):
        call()


# --------------------------------------------------------------- the committed grid


@pytest.fixture(scope="module")
def committed():
    return json.loads(GRID_JSON.read_text())


@pytest.fixture(scope="module")
def rescored(committed):
    points = bq.points_from_json(r["simulation"] for r in committed["points"])
    return bq.score_wait_models(points, ["allen-cunneen", "kingman", "whitt", "ggm"])


def test_committed_grid_is_the_scoring_grid_and_precise_enough(committed):
    points = bq.points_from_json(r["simulation"] for r in committed["points"])
    assert sorted((p.utilization, p.servers, p.ca2, p.cs2) for p in points) == sorted(
        bq.score_grid()
    )
    assert {p.seed for p in points} == {bq.SCORE_SEED}
    scored = [p for p in points if p.mean_wait > bq.MIN_SCORED_WAIT]
    assert len(scored) > 300
    assert max(p.relative_halfwidth for p in scored) < 0.03


def test_committed_grid_meets_the_accuracy_targets(rescored):
    rows, summary = rescored
    ggm = summary["ggm"]
    assert ggm["wait"]["median_abs_relative_error"] <= 0.10
    assert ggm["wait"]["max_abs_relative_error"] <= 0.25
    assert ggm["p99"]["median_abs_relative_error"] <= 0.15
    # and the new model is better than the old one where the old one was poor.
    ac = summary["allen-cunneen"]["wait"]
    assert ggm["wait"]["max_abs_relative_error"] < ac["max_abs_relative_error"] / 4


def test_committed_json_matches_the_current_code(committed, rescored):
    rows, summary = rescored
    for stored, fresh in zip(committed["points"], rows, strict=True):
        for key in ("wait", "p99"):
            assert stored["models"]["ggm"][key] == pytest.approx(
                fresh["models"]["ggm"][key], rel=1e-6
            )
    assert committed["summary"]["ggm"]["wait"]["max_abs_relative_error"] == pytest.approx(
        summary["ggm"]["wait"]["max_abs_relative_error"], rel=1e-6
    )


def test_fitted_constants_are_reproducible_from_the_fitting_grid():
    fit = bq.load_points(FIT_JSON)
    assert {p.seed for p in fit} == {bq.FIT_SEED}
    score_cells = set(bq.score_grid())
    assert not score_cells & {(p.utilization, p.servers, p.ca2, p.cs2) for p in fit}
    wait_coef, delay_coef = bq.fit_ggm(fit)
    np.testing.assert_allclose(wait_coef, GGM_WAIT_COEF, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(delay_coef, GGM_DELAY_COEF, rtol=1e-6, atol=1e-9)


# ---------------------------------------------------------- a short fresh simulation


def test_fresh_simulation_of_mm1_matches_closed_forms():
    p = bq.simulate_ggm(0.5, 1, 1.0, 1.0, seed=7, replications=64, max_customers=600_000)
    assert abs(p.mean_wait - 1.0) <= 3 * p.mean_wait_halfwidth + 0.02
    assert p.prob_wait == pytest.approx(0.5, abs=0.01)
    assert p.sojourn_p99 == pytest.approx(math.log(100) / 0.5, rel=0.06)


@pytest.mark.parametrize(
    ("rho", "m", "ca2", "cs2"), [(0.85, 1, 0.5, 2.0), (0.75, 4, 2.0, 0.5), (0.7, 2, 0.25, 1.0)]
)
def test_fresh_simulation_agrees_with_ggm_and_is_scored(rho, m, ca2, cs2):
    p = bq.simulate_ggm(
        rho, m, ca2, cs2, seed=11, replications=64, max_customers=1_500_000, target_halfwidth=0.05
    )
    assert p.customers <= 1_600_000
    rows, summary = bq.score_wait_models([p], ["ggm", "allen-cunneen"])
    err = rows[0]["models"]["ggm"]["wait_relative_error"]
    # model error on the grid is <= 10 %; allow the run's own half-width on top.
    assert abs(err) <= 0.10 + 2 * p.relative_halfwidth
    assert abs(rows[0]["models"]["ggm"]["p99_relative_error"]) <= 0.15
    assert summary["ggm"]["wait"]["points"] == 1
