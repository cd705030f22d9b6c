"""Queueing models: textbook values, identities, monotonicity and the minimal-rate searches."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from predict.queueing import (
    DEFAULT_WAIT_MODEL,
    WAIT_MODELS,
    allen_cunneen_wait,
    allen_cunneen_wait_array,
    allen_cunneen_wait_many,
    busy_probability,
    erlang_c,
    erlang_c_wait,
    kingman_wait,
    min_service_rate,
    min_service_rate_for_sojourn,
    min_service_rate_for_sojourn_many,
    min_service_rate_many,
    waiting_time,
)


def test_erlang_c_textbook_values():
    # M/M/1: Wq = rho / (mu - lambda).
    assert erlang_c_wait(0.5, 1.0, 1) == pytest.approx(1.0)
    # M/M/2 with a = 1: C = 1/3, Wq = C / (2 mu - lambda).
    assert erlang_c(1.0, 2) == pytest.approx(1 / 3)
    assert erlang_c_wait(1.0, 1.0, 2) == pytest.approx(1 / 3)
    # Kleinrock's M/M/3 example: a = 2, C(3, 2) = 4/9.
    assert erlang_c(2.0, 3) == pytest.approx(4 / 9)
    assert erlang_c_wait(2.0, 1.0, 3) == pytest.approx((4 / 9) / 1.0)


def test_erlang_c_large_server_count_is_finite():
    w = erlang_c_wait(950.0, 1.0, 1000)
    assert math.isfinite(w) and w > 0


@pytest.mark.parametrize(
    "lam,mu,arrival_scv,service_scv", [(0.5, 1.0, 1, 1), (3.0, 4.0, 0.25, 2), (0.1, 7.0, 2, 0.25)]
)
def test_allen_cunneen_equals_kingman_for_one_server(lam, mu, arrival_scv, service_scv):
    assert allen_cunneen_wait(lam, mu, 1, arrival_scv, service_scv) == pytest.approx(
        kingman_wait(lam, mu, arrival_scv, service_scv), rel=1e-12
    )


def test_allen_cunneen_formula_at_hand_computed_point():
    # M = 2, rho = 0.8 >= 0.7: P_cb = (0.64 + 0.8) / 2 = 0.72; W = 0.72 / (1*2*0.2) * 1.
    assert allen_cunneen_wait(1.6, 1.0, 2, 1.0, 1.0) == pytest.approx(0.72 / 0.4)
    # M = 4, rho = 0.5 < 0.7: P_cb = 0.5 ** 2.5.
    assert busy_probability(0.5, 4) == pytest.approx(0.5**2.5)


def test_allen_cunneen_is_exact_for_mm1():
    assert allen_cunneen_wait(0.7, 1.0, 1, 1, 1) == pytest.approx(erlang_c_wait(0.7, 1.0, 1))


@pytest.mark.parametrize(
    "kwargs,param",
    [
        (
            dict(arrival_rate=-1, service_rate=1, servers=1, arrival_scv=1, service_scv=1),
            "arrival_rate",
        ),
        (
            dict(arrival_rate=1, service_rate=0, servers=1, arrival_scv=1, service_scv=1),
            "service_rate",
        ),
        (dict(arrival_rate=1, service_rate=2, servers=0, arrival_scv=1, service_scv=1), "servers"),
        (
            dict(arrival_rate=1, service_rate=2, servers=1.5, arrival_scv=1, service_scv=1),
            "servers",
        ),
        (
            dict(arrival_rate=1, service_rate=2, servers=1, arrival_scv=-0.1, service_scv=1),
            "arrival_scv",
        ),
        (
            dict(arrival_rate=1, service_rate=2, servers=1, arrival_scv=1, service_scv=math.nan),
            "service_scv",
        ),
        (
            dict(arrival_rate=math.nan, service_rate=2, servers=1, arrival_scv=1, service_scv=1),
            "arrival_rate",
        ),
        (dict(arrival_rate=2, service_rate=1, servers=2, arrival_scv=1, service_scv=1), "unstable"),
        (dict(arrival_rate=3, service_rate=1, servers=2, arrival_scv=1, service_scv=1), "unstable"),
    ],
)
def test_bad_queue_parameters_raise_naming_the_parameter(kwargs, param):
    with pytest.raises(ValueError, match=param):
        allen_cunneen_wait(**kwargs)


def test_unstable_queue_raises_in_every_model():
    with pytest.raises(ValueError, match="unstable"):
        kingman_wait(1.0, 1.0, 1, 1)
    with pytest.raises(ValueError, match="unstable"):
        erlang_c_wait(4.0, 1.0, 4)


def test_wait_models_by_name():
    assert set(WAIT_MODELS) == {"allen-cunneen", "kingman", "erlang-c", "whitt", "ggm"}
    assert DEFAULT_WAIT_MODEL == "ggm" and DEFAULT_WAIT_MODEL in WAIT_MODELS
    assert waiting_time("erlang-c", 1.0, 1.0, 2) == pytest.approx(1 / 3)
    assert waiting_time("ggm", 1.0, 1.0, 2) == pytest.approx(1 / 3)
    assert waiting_time("allen-cunneen", 1.6, 1.0, 2) == pytest.approx(0.72 / 0.4)
    with pytest.raises(ValueError, match="unknown queueing model 'magic'; known models: "):
        waiting_time("magic", 1.0, 1.0, 2)
    with pytest.raises(ValueError, match="servers"):
        waiting_time("kingman", 1.0, 1.0, 2)


@settings(max_examples=200, deadline=None)
@given(
    rho_a=st.floats(0.0, 0.99),
    rho_b=st.floats(0.0, 0.99),
    m=st.integers(1, 16),
    arrival_scv=st.floats(0.0, 4.0),
    service_scv=st.floats(0.0, 4.0),
)
def test_allen_cunneen_wait_is_finite_and_monotone_in_arrival_rate(
    rho_a, rho_b, m, arrival_scv, service_scv
):
    lo, hi = sorted((rho_a, rho_b))
    w_lo = allen_cunneen_wait(lo * m, 1.0, m, arrival_scv, service_scv)
    w_hi = allen_cunneen_wait(hi * m, 1.0, m, arrival_scv, service_scv)
    assert math.isfinite(w_lo) and math.isfinite(w_hi)
    assert 0.0 <= w_lo <= w_hi


@settings(max_examples=200, deadline=None)
@given(
    t1=st.floats(1e-4, 10.0),
    t2=st.floats(1e-4, 10.0),
    lam=st.floats(0.01, 1000.0),
    m=st.integers(1, 32),
    arrival_scv=st.floats(0.05, 4.0),
    service_scv=st.floats(0.05, 4.0),
)
def test_min_service_rate_meets_target_is_minimal_and_monotone(
    t1, t2, lam, m, arrival_scv, service_scv
):
    small, large = sorted((t1, t2))
    mu_small = min_service_rate(small, lam, m, arrival_scv, service_scv)
    mu_large = min_service_rate(large, lam, m, arrival_scv, service_scv)
    assert math.isfinite(mu_small) and math.isfinite(mu_large)
    # A looser target never needs more capacity.
    assert mu_large <= mu_small * (1 + 1e-8)
    # Meets the target, and 1e-6 less does not (exact to 1e-6 relative).
    assert allen_cunneen_wait(lam, mu_small, m, arrival_scv, service_scv) <= small * (1 + 1e-9)
    below = mu_small * (1 - 1e-6)
    if below > lam / m:
        assert allen_cunneen_wait(lam, below, m, arrival_scv, service_scv) > small


def test_min_service_rate_closed_form_for_one_server():
    lam, t, var = 10.0, 0.1, 1.0
    expected = (lam + math.sqrt(lam**2 + 4 * lam * var / t)) / 2
    assert min_service_rate(t, lam, 1, 1.0, 1.0) == pytest.approx(expected, rel=1e-12)
    assert allen_cunneen_wait(lam, expected, 1, 1, 1) == pytest.approx(t)


def test_min_service_rate_across_the_busy_probability_jump():
    # M = 4, lambda = 10, target 0.1: the answer sits where rho crosses 0.7 and P_cb jumps.
    mu = min_service_rate(0.1, 10.0, 4, 1.0, 1.0)
    assert allen_cunneen_wait(10.0, mu, 4, 1, 1) <= 0.1
    assert allen_cunneen_wait(10.0, mu * (1 - 1e-6), 4, 1, 1) > 0.1
    assert mu == pytest.approx(10.0 / (4 * 0.7), rel=1e-6)


def test_min_service_rate_edge_cases():
    assert min_service_rate(0.1, 0.0, 3, 1, 1) == 0.0
    # Deterministic arrivals and service: anything just above lambda/M.
    mu = min_service_rate(0.1, 8.0, 4, 0.0, 0.0)
    assert mu > 2.0 and mu == pytest.approx(2.0)
    # Rounding must not leave M * mu == lambda (an unstable queue).
    mu = min_service_rate_for_sojourn(1.0, 8.5, 5, 0.0, 0.0)
    assert allen_cunneen_wait(8.5, mu, 5, 0.0, 0.0) == 0.0 and mu == pytest.approx(1.7)
    with pytest.raises(ValueError, match="target_wait"):
        min_service_rate(0.0, 1.0, 1, 1, 1)
    with pytest.raises(ValueError, match="arrival_rate"):
        min_service_rate(0.1, -1.0, 1, 1, 1)
    with pytest.raises(ValueError, match="servers"):
        min_service_rate(0.1, 1.0, 0, 1, 1)


@settings(max_examples=150, deadline=None)
@given(
    t=st.floats(1e-3, 10.0),
    lam=st.floats(0.0, 500.0),
    m=st.integers(1, 16),
    arrival_scv=st.floats(0.0, 4.0),
    service_scv=st.floats(0.0, 4.0),
)
def test_min_service_rate_for_sojourn_meets_target_and_is_minimal(
    t, lam, m, arrival_scv, service_scv
):
    mu = min_service_rate_for_sojourn(t, lam, m, arrival_scv, service_scv)
    assert math.isfinite(mu) and mu > 0
    assert allen_cunneen_wait(lam, mu, m, arrival_scv, service_scv) + 1 / mu <= t * (1 + 1e-9)
    below = mu * (1 - 1e-6)
    if below > lam / m:
        assert allen_cunneen_wait(lam, below, m, arrival_scv, service_scv) + 1 / below > t


def test_sojourn_rate_gives_the_smallest_cpu_cap():
    # Controller use: cap c = kappa * mu; W(c) + kappa / c <= target.
    kappa, lam, target = 0.002, 300.0, 0.05
    cap = kappa * min_service_rate_for_sojourn(target, lam, 2, 1.0, 1.0)
    mu = cap / kappa
    assert allen_cunneen_wait(lam, mu, 2, 1, 1) + kappa / cap == pytest.approx(target, rel=1e-6)


def test_vectorised_versions_agree_with_scalar():
    rng = np.random.default_rng(3)
    lam = rng.uniform(0.1, 200, 300)
    m = rng.integers(1, 9, 300)
    arrival_scv, service_scv = rng.uniform(0.1, 3, 300), rng.uniform(0.1, 3, 300)
    t = rng.uniform(0.001, 1, 300)
    many = min_service_rate_many(t, lam, m, arrival_scv, service_scv)
    scalar = [
        min_service_rate(*args) for args in zip(t, lam, m, arrival_scv, service_scv, strict=True)
    ]
    np.testing.assert_allclose(many, scalar, rtol=1e-6)
    soj = min_service_rate_for_sojourn_many(t + 0.01, lam, m, arrival_scv, service_scv)
    soj_scalar = [
        min_service_rate_for_sojourn(*args)
        for args in zip(t + 0.01, lam, m, arrival_scv, service_scv, strict=True)
    ]
    np.testing.assert_allclose(soj, soj_scalar, rtol=1e-6)
    waits = allen_cunneen_wait_many(lam, many, m, arrival_scv, service_scv)
    assert np.all(waits <= t * (1 + 1e-9))
    assert np.isinf(allen_cunneen_wait_many(5.0, 1.0, 2, 1, 1))
    np.testing.assert_allclose(
        allen_cunneen_wait_array(lam, many, m, (arrival_scv + service_scv) / 2), waits, rtol=1e-12
    )


def test_allen_cunneen_is_unchanged_by_the_model_keyword():
    # The default of every minimal-rate function stays Allen--Cunneen.
    args = (0.05, 300.0, 2, 1.0, 1.0)
    assert min_service_rate_for_sojourn(*args) == min_service_rate_for_sojourn(
        *args, model="allen-cunneen"
    )
    assert min_service_rate(*args) == min_service_rate(*args, model="allen-cunneen")
    np.testing.assert_array_equal(
        min_service_rate_for_sojourn_many(*args),
        min_service_rate_for_sojourn_many(*args, model="allen-cunneen"),
    )
    # ... and another model gives another answer.
    assert min_service_rate_for_sojourn(0.05, 300.0, 2, 0.25, 1.0, model="ggm") < (
        min_service_rate_for_sojourn(0.05, 300.0, 2, 0.25, 1.0)
    )


def test_vectorised_bad_input():
    with pytest.raises(ValueError, match="servers"):
        min_service_rate_many(0.1, [1.0, 2.0], [1, 0], 1, 1)
    with pytest.raises(ValueError, match="arrival_rate"):
        min_service_rate_many(0.1, [1.0, np.nan], 1, 1, 1)
    with pytest.raises(ValueError, match="target_wait"):
        min_service_rate_many([0.1, -1], 1.0, 1, 1, 1)
