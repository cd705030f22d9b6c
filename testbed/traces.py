"""Seeded load traces shared by the live testbed, the simulator and the benchmarks.

Rate schedules (one value per slot, numpy float arrays):

* :func:`triangle` -- linear rise from ``low`` to ``high`` over half a period, fall
  back over the other half, repeated;
* :func:`random_steps` -- a fresh integer level drawn uniformly from ``low..high``
  every slot (e.g. the number of active producers);
* :func:`diurnal` -- one day compressed into ``slots``: a cosine between ``base``
  (night) and ``peak`` (afternoon), with short multiplicative bursts and noise.

Arrival processes (sorted arrival times in seconds within ``[0, duration)``):

* :func:`poisson_arrivals` -- exponential inter-arrivals at ``rate`` per second;
* :func:`weibull_arrivals` -- Weibull(``shape``) inter-arrivals with ``scale`` seconds;
* :func:`counts_per_slot` -- arrivals binned into slots.

Every function is pure: the same arguments (and ``seed``) give the same array. Bad
parameters raise ValueError naming the parameter.
"""

from __future__ import annotations

import math

import numpy as np

from dsched import validate as v


def triangle(slots: int, low: float, high: float, period: int) -> np.ndarray:
    """Rise linearly from ``low`` to ``high`` over ``period / 2`` slots, then fall back.

    With 10-second slots, ``period=60`` is the 5-minute rise and 5-minute fall.
    """
    slots = v.positive_int(slots, "slots")
    low = v.non_negative(low, "low")
    high = v.non_negative(high, "high")
    if high < low:
        raise ValueError(f"high must be >= low, got high={high} < low={low}")
    period = v.positive_int(period, "period")
    if period < 2:
        raise ValueError(f"period must be >= 2 slots, got {period}")
    phase = (np.arange(slots) % period) / period  # 0..1 within a period
    shape = 1.0 - np.abs(2.0 * phase - 1.0)  # 0 -> 1 -> 0
    return low + (high - low) * shape


def random_steps(slots: int, low: int = 1, high: int = 25, seed: int = 0) -> np.ndarray:
    """A new integer level uniform in ``low..high`` (inclusive) every slot."""
    slots = v.positive_int(slots, "slots")
    low_i, high_i = int(v.non_negative(low, "low")), int(v.non_negative(high, "high"))
    if low_i != low or high_i != high:
        raise ValueError(f"low and high must be whole numbers, got {low}, {high}")
    if high_i < low_i:
        raise ValueError(f"high must be >= low, got high={high} < low={low}")
    rng = np.random.default_rng(seed)
    return rng.integers(low_i, high_i + 1, size=slots).astype(float)


def diurnal(
    slots: int,
    base: float,
    peak: float,
    bursts: int = 4,
    seed: int = 0,
    *,
    burst_height: float = 0.5,
    burst_slots: int = 5,
    noise: float = 0.05,
    peak_at: float = 0.6,
) -> np.ndarray:
    """A day compressed into ``slots``: ``base`` at night, ``peak`` at ``peak_at``.

    ``bursts`` short bursts (``burst_slots`` long, raising the rate by
    ``burst_height`` times, with a quick rise and decay) land at random slots;
    ``noise`` is the standard deviation of multiplicative Gaussian noise.
    """
    slots = v.positive_int(slots, "slots")
    base = v.non_negative(base, "base")
    peak = v.non_negative(peak, "peak")
    if peak < base:
        raise ValueError(f"peak must be >= base, got peak={peak} < base={base}")
    if isinstance(bursts, bool) or not isinstance(bursts, (int, np.integer)) or bursts < 0:
        raise ValueError(f"bursts must be an integer >= 0, got {bursts!r}")
    burst_height = v.non_negative(burst_height, "burst_height")
    burst_slots = v.positive_int(burst_slots, "burst_slots")
    noise = v.non_negative(noise, "noise")
    peak_at = v.non_negative(peak_at, "peak_at")
    if peak_at > 1:
        raise ValueError(f"peak_at must be in [0, 1], got {peak_at}")
    rng = np.random.default_rng(seed)
    day = np.arange(slots) / slots
    level = base + (peak - base) * 0.5 * (1.0 + np.cos(2.0 * np.pi * (day - peak_at)))
    boost = np.zeros(slots)
    ramp = np.exp(-np.arange(burst_slots) / max(burst_slots / 3.0, 1.0))
    for start in rng.integers(0, slots, size=bursts):
        end = min(slots, start + burst_slots)
        boost[start:end] += burst_height * ramp[: end - start]
    jitter = 1.0 + noise * rng.standard_normal(slots)
    return np.maximum(level * (1.0 + boost) * jitter, 0.0)


def poisson_arrivals(rate: float, duration: float, seed: int = 0) -> np.ndarray:
    """Arrival times of a Poisson process with ``rate`` arrivals per second."""
    rate = v.non_negative(rate, "rate")
    duration = v.non_negative(duration, "duration")
    if rate == 0.0 or duration == 0.0:
        return np.empty(0)
    return _renewal(lambda rng, n: rng.exponential(1.0 / rate, n), rate, duration, seed)


def weibull_arrivals(scale: float, shape: float, duration: float, seed: int = 0) -> np.ndarray:
    """Arrival times of a renewal process with Weibull(``shape``) inter-arrival times
    of ``scale`` seconds (mean ``scale * Gamma(1 + 1/shape)``)."""
    scale = v.positive(scale, "scale")
    shape = v.positive(shape, "shape")
    duration = v.non_negative(duration, "duration")
    if duration == 0.0:
        return np.empty(0)
    mean_gap = scale * math.gamma(1.0 + 1.0 / shape)
    return _renewal(lambda rng, n: scale * rng.weibull(shape, n), 1.0 / mean_gap, duration, seed)


def _renewal(draw, rate: float, duration: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    chunks, t = [], 0.0
    # Draw in blocks sized for the expected count so one block nearly always suffices.
    block = int(rate * duration * 1.2) + 16
    while t < duration:
        gaps = draw(rng, block)
        times = t + np.cumsum(gaps)
        chunks.append(times)
        t = float(times[-1])
    times = np.concatenate(chunks)
    return times[times < duration]


def counts_per_slot(arrivals, slot: float, duration: float) -> np.ndarray:
    """Number of arrivals in each slot of ``slot`` seconds covering ``[0, duration)``."""
    slot = v.positive(slot, "slot")
    duration = v.positive(duration, "duration")
    times = np.asarray(arrivals, dtype=float)
    if times.ndim != 1 or not np.all(np.isfinite(times)):
        raise ValueError("arrivals must be a 1-D array of finite times")
    if np.any(times < 0) or np.any(times >= duration):
        raise ValueError(f"arrivals must lie in [0, duration={duration})")
    n = math.ceil(duration / slot - 1e-9)
    return np.bincount(np.minimum((times // slot).astype(int), n - 1), minlength=n).astype(float)
