"""CPU cost per tuple and the memory-bandwidth interference model."""

from __future__ import annotations

import math

import numpy as np
import pytest

from predict.cost import cpu_per_tuple, marginal_cost_many
from predict.interference import NO_INTERFERENCE, InterferenceModel, fit_interference


def test_cpu_per_tuple_mean_over_window():
    cpu = [9.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    tuples = [1.0, 100.0, 100.0, 100.0, 100.0, 100.0]
    # The first slot is outside the window of 5.
    assert cpu_per_tuple(cpu, tuples, window=5) == pytest.approx(0.03)


def test_cpu_per_tuple_skips_idle_slots():
    cpu = [1.0, 0.2, 3.0]
    tuples = [100.0, 0.0, 100.0]
    assert cpu_per_tuple(cpu, tuples, window=3) == pytest.approx(0.02)
    assert cpu_per_tuple(cpu, tuples, window=3, strategy="ratio_of_sums") == pytest.approx(
        4.0 / 200.0
    )


def test_cpu_per_tuple_strategies_differ_when_counts_differ():
    cpu, tuples = [1.0, 1.0], [10.0, 1000.0]
    assert cpu_per_tuple(cpu, tuples, strategy="mean_ratio") == pytest.approx((0.1 + 0.001) / 2)
    assert cpu_per_tuple(cpu, tuples, strategy="ratio_of_sums") == pytest.approx(2.0 / 1010.0)


def test_cpu_per_tuple_no_tuples_at_all():
    with pytest.raises(ValueError, match="no slot"):
        cpu_per_tuple([0.1, 0.1], [0.0, 0.0])
    assert cpu_per_tuple([0.1, 0.1], [0.0, 0.0], default=0.004) == 0.004


@pytest.mark.parametrize(
    "cpu,tuples,kwargs,match",
    [
        ([], [], {}, "cpu_seconds"),
        ([1.0, math.nan], [1.0, 1.0], {}, "cpu_seconds"),
        ([1.0], [1.0, 2.0], {}, "same length"),
        ([-1.0], [1.0], {}, "cpu_seconds"),
        ([1.0], [-3.0], {}, "tuples"),
        ([1.0], [1.0], {"window": 0}, "window"),
        ([1.0], [1.0], {"strategy": "median"}, "strategy"),
    ],
)
def test_cpu_per_tuple_bad_input(cpu, tuples, kwargs, match):
    with pytest.raises(ValueError, match=match):
        cpu_per_tuple(cpu, tuples, **kwargs)


def test_marginal_cost_is_the_slope_of_cpu_on_tuples_once_the_slots_can_tell_it():
    rng = np.random.default_rng(7)
    tuples = rng.integers(10, 500, (4, 60)).astype(float)
    tuples[2] = 200.0 + rng.normal(0.0, 1.0, 60)  # a steady load: the slope is noise
    cpu = 0.02 + 0.0012 * tuples + rng.normal(0.0, 0.005, tuples.shape)
    cpu[1, :52] = np.nan  # 8 slots: too few
    cpu[3] = 0.05  # CPU that does not follow the tuples: no slope above zero
    got = marginal_cost_many(cpu, tuples)
    assert got[0] == pytest.approx(0.0012, rel=0.02)
    assert np.isnan(got[1:]).all()
    # Idle slots say nothing about the cost of a tuple and are skipped.
    idle = tuples[:1].copy()
    idle[0, ::3] = 0.0
    again = marginal_cost_many(np.where(idle > 0, cpu[:1], 0.02), idle)
    assert again[0] == pytest.approx(0.0012, rel=0.03)


@pytest.mark.parametrize(
    "cpu,tuples,kwargs,match",
    [
        (np.ones(3), np.ones(3), {}, "2-D"),
        (np.ones((1, 3)), np.ones((1, 4)), {}, "one shape"),
        (-np.ones((1, 12)), np.ones((1, 12)), {}, ">= 0"),
        (np.ones((1, 12)), -np.ones((1, 12)), {}, ">= 0"),
        (np.ones((1, 12)), np.ones((1, 12)), {"min_slots": 2}, "at least 3"),
        (np.ones((1, 12)), np.ones((1, 12)), {"max_relative_error": 0.0}, "positive"),
    ],
)
def test_marginal_cost_bad_input(cpu, tuples, kwargs, match):
    with pytest.raises(ValueError, match=match):
        marginal_cost_many(cpu, tuples, **kwargs)


def test_interference_model_hinge_and_unavailable_counter():
    model = InterferenceModel(threshold=0.6, slope=2.0)
    assert model.slowdown(0.5) == 1.0
    assert model.slowdown(0.8) == pytest.approx(1.4)
    assert model.slowdown(None) == 1.0
    assert model.inflate(0.01, 0.8) == pytest.approx(0.014)
    assert NO_INTERFERENCE.slowdown(1.0) == 1.0
    with pytest.raises(ValueError, match="threshold"):
        InterferenceModel(threshold=1.5)
    with pytest.raises(ValueError, match="slope"):
        InterferenceModel(slope=-1.0)
    with pytest.raises(ValueError, match="mbw_util"):
        model.slowdown(math.nan)


def test_fit_interference_recovers_a_hinge():
    rng = np.random.default_rng(7)
    util = rng.uniform(0.0, 1.0, 400)
    kappa = 0.002 * (1.0 + 1.5 * np.maximum(0.0, util - 0.65)) * (1 + rng.normal(0, 0.01, 400))
    model = fit_interference(util, kappa)
    assert model.threshold == pytest.approx(0.65, abs=0.05)
    assert model.slope == pytest.approx(1.5, rel=0.15)


def test_fit_interference_without_contention_learns_nothing():
    rng = np.random.default_rng(8)
    util = rng.uniform(0.0, 1.0, 200)
    kappa = 0.002 * (1 + rng.normal(0, 0.01, 200))
    assert fit_interference(util, kappa).slowdown(1.0) < 1.05


def test_fit_interference_bad_input():
    with pytest.raises(ValueError, match="same length"):
        fit_interference([0.1, 0.2], [0.1])
    with pytest.raises(ValueError, match="kappa"):
        fit_interference([0.1], [0.0])
    with pytest.raises(ValueError, match="mbw_util"):
        fit_interference([math.nan], [0.1])
