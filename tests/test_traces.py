"""Seeded load traces: shapes, determinism, arrival statistics and bad parameters."""

from __future__ import annotations

import math

import numpy as np
import pytest

from testbed import traces


def test_triangle_rises_and_falls_linearly():
    rate = traces.triangle(12, low=10.0, high=70.0, period=6)
    np.testing.assert_allclose(rate[:7], [10, 30, 50, 70, 50, 30, 10])
    np.testing.assert_allclose(rate[6:], rate[:6])


def test_random_steps_are_integers_in_range_and_seeded():
    steps = traces.random_steps(5000, 1, 25, seed=3)
    assert steps.min() == 1 and steps.max() == 25
    assert np.all(steps == np.round(steps))
    np.testing.assert_array_equal(steps, traces.random_steps(5000, 1, 25, seed=3))
    assert not np.array_equal(steps, traces.random_steps(5000, 1, 25, seed=4))
    # A new level every slot: consecutive repeats only by chance (1/25).
    assert np.mean(steps[1:] == steps[:-1]) < 0.08


def test_diurnal_day_shape_and_bursts():
    quiet = traces.diurnal(1000, base=10.0, peak=100.0, bursts=0, noise=0.0, seed=1)
    assert quiet.min() == pytest.approx(10.0, abs=0.01)
    assert quiet.max() == pytest.approx(100.0, abs=0.01)
    assert int(np.argmax(quiet)) == 600  # peak_at = 0.6 of the day
    bursty = traces.diurnal(
        1000, base=10.0, peak=100.0, bursts=5, noise=0.0, seed=1, burst_height=1.0
    )
    assert np.all(bursty >= quiet - 1e-9) and np.max(bursty / quiet) == pytest.approx(2.0)
    np.testing.assert_array_equal(
        traces.diurnal(100, 1.0, 2.0, seed=9), traces.diurnal(100, 1.0, 2.0, seed=9)
    )


def test_poisson_arrivals_statistics():
    times = traces.poisson_arrivals(rate=5.0, duration=2000.0, seed=2)
    assert np.all(np.diff(times) > 0) and times[0] >= 0 and times[-1] < 2000.0
    assert times.size / 2000.0 == pytest.approx(5.0, rel=0.03)
    gaps = np.diff(times)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.05)


def test_weibull_arrivals_statistics():
    scale, shape = 0.2, 3.0
    times = traces.weibull_arrivals(scale, shape, duration=3000.0, seed=5)
    gaps = np.diff(times)
    assert gaps.mean() == pytest.approx(scale * math.gamma(1 + 1 / shape), rel=0.02)
    # Shape 3 is much more regular than Poisson.
    assert gaps.std() / gaps.mean() < 0.45
    np.testing.assert_array_equal(times, traces.weibull_arrivals(scale, shape, 3000.0, seed=5))


def test_counts_per_slot():
    counts = traces.counts_per_slot([0.1, 0.2, 1.5, 9.99], slot=1.0, duration=10.0)
    assert counts.tolist() == [2, 1, 0, 0, 0, 0, 0, 0, 0, 1]
    with pytest.raises(ValueError, match="arrivals"):
        traces.counts_per_slot([10.0], slot=1.0, duration=10.0)
    with pytest.raises(ValueError, match="slot"):
        traces.counts_per_slot([1.0], slot=0.0, duration=10.0)


def test_zero_rate_and_zero_duration_give_no_arrivals():
    assert traces.poisson_arrivals(0.0, 10.0).size == 0
    assert traces.weibull_arrivals(1.0, 2.0, 0.0).size == 0


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda: traces.poisson_arrivals(-1.0, 10.0), "rate"),
        (lambda: traces.poisson_arrivals(math.nan, 10.0), "rate"),
        (lambda: traces.poisson_arrivals(1.0, -10.0), "duration"),
        (lambda: traces.weibull_arrivals(1.0, 0.0, 10.0), "shape"),
        (lambda: traces.weibull_arrivals(1.0, -2.0, 10.0), "shape"),
        (lambda: traces.weibull_arrivals(0.0, 2.0, 10.0), "scale"),
        (lambda: traces.triangle(10, 5.0, 1.0, 4), "high"),
        (lambda: traces.triangle(10, -1.0, 1.0, 4), "low"),
        (lambda: traces.triangle(10, 0.0, 1.0, 1), "period"),
        (lambda: traces.triangle(0, 0.0, 1.0, 4), "slots"),
        (lambda: traces.random_steps(10, 5, 2), "high"),
        (lambda: traces.random_steps(10, 1.5, 2), "whole"),
        (lambda: traces.random_steps(-3), "slots"),
        (lambda: traces.diurnal(10, 5.0, 1.0), "peak"),
        (lambda: traces.diurnal(10, 1.0, 5.0, bursts=-1), "bursts"),
        (lambda: traces.diurnal(10, 1.0, 5.0, noise=-0.1), "noise"),
    ],
)
def test_bad_parameters_raise_naming_the_parameter(call, match):
    with pytest.raises(ValueError, match=match):
        call()
