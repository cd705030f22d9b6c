"""Periodic load: find a period in the data, forecast with it, fall back without it.

* :func:`autocorrelation` -- sample autocorrelation of the linearly detrended series
  (FFT, O(n log n));
* :func:`detect_period` -- the period the autocorrelation supports, or None: the
  lag of a clear local peak of the ACF (high enough, and rising well above the
  trough before it), the smallest of the near-highest such peaks so that a multiple
  of the period is not taken for it;
* :func:`seasonal_forecast` -- classical decomposition (centred moving average for
  the level, the mean detrended value per phase over the last cycles for the
  seasonal shape), simple exponential smoothing of the seasonally adjusted series
  with its smoothing constant chosen by one-step squared error, plus the shape's
  next phase (Hyndman and Athanasopoulos, *Forecasting: Principles and Practice*,
  3rd ed., sections 3.4 "Classical decomposition", 5.7 "Forecasting with
  decomposition" and 8.1 "Simple exponential smoothing"; Cleveland et al., "STL: A Seasonal-Trend Decomposition Procedure
  Based on Loess", J. Official Statistics 1990, for the idea of a seasonal
  component on top of the level);
* :class:`MaxRule` -- the max of several predictors (the controller's default
  combination, ``combine`` of the linear trend and ARIMA), as one predictor;
* :class:`Seasonal` -- the forecaster: the seasonal forecast where the series has a
  period *and* that forecast has been the better one lately, else its ``fallback``
  (by default the max rule). Registered by name as ``seasonal`` (and ``max_rule``)
  in :data:`predict.load.PREDICTORS` when this module is imported.

Seasonal ARIMA (statsmodels SARIMAX) is not used: with a period of tens of slots a
fit takes seconds, too slow to redo as the period or the data change.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np
from scipy.signal import lfilter

from dsched import validate as v
from predict.intervals import new_point_count
from predict.load import PREDICTORS, Arima, Forecast, LinearTrend, _check_horizon, _floor, combine

#: Smoothing constants tried for the seasonally adjusted level.
SES_ALPHAS = (0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 1.0)


def autocorrelation(history, max_lag: int) -> np.ndarray:
    """ACF at lags ``0..max_lag`` of ``history`` after removing its least-squares line.

    A constant (after detrending) series has no autocorrelation: zeros, with 1 at lag 0.
    """
    y = v.series(history, "history", min_length=2)
    max_lag = min(v.positive_int(max_lag, "max_lag"), y.size - 1)
    t = np.arange(y.size, dtype=float)
    slope, intercept = np.polyfit(t, y, 1)
    x = y - (slope * t + intercept)
    var = float(np.dot(x, x))
    out = np.zeros(max_lag + 1)
    out[0] = 1.0
    if var <= 1e-12 * max(1.0, float(np.dot(y, y))):
        return out
    size = 1 << int(np.ceil(np.log2(2 * y.size)))
    f = np.fft.rfft(x, size)
    acov = np.fft.irfft(f * np.conj(f), size)[: max_lag + 1]
    return acov / var


def detect_period(
    history,
    *,
    min_period: int = 2,
    max_period: int | None = None,
    min_cycles: int = 2,
    min_acf: float = 0.3,
    min_prominence: float = 0.2,
) -> int | None:
    """The period of ``history`` in slots, or None when it has none.

    Candidates are lags ``min_period..max_period`` (default: ``len // min_cycles``) at
    which the ACF is a local maximum, at least ``min_acf``, and at least
    ``min_prominence`` above the lowest ACF at a smaller lag (a decaying ACF, as a
    trend or a random walk has, never qualifies). Of the candidates within 10 % of
    the highest, the smallest lag wins (the ACF also peaks at multiples of the
    period), refined within 10 % to the lag whose multiples have the highest mean
    ACF (noise shifts a broad peak by a slot or two). Too short a history for ``min_cycles`` cycles of ``min_period``: None.
    """
    y = v.series(history, "history")
    min_period = max(v.positive_int(min_period, "min_period"), 2)
    min_cycles = v.positive_int(min_cycles, "min_cycles")
    limit = y.size // min_cycles
    if max_period is not None:
        limit = min(limit, v.positive_int(max_period, "max_period"))
    if limit < min_period or y.size < 4:
        return None
    acf = autocorrelation(y, y.size - 1)
    lags = np.arange(min_period, min(limit, acf.size - 2) + 1)
    if lags.size == 0:
        return None
    here, before, after = acf[lags], acf[lags - 1], acf[lags + 1]
    trough = np.minimum.accumulate(acf[1:])[lags - 1]  # lowest ACF at lags 1..lag
    ok = (here >= before) & (here >= after) & (here >= min_acf) & (here - trough >= min_prominence)
    if not ok.any():
        return None
    cands, vals = lags[ok], here[ok]
    first = int(cands[vals >= 0.9 * vals.max()].min())
    # Noise moves a broad ACF peak by a slot or two; the true period also lines up
    # the peaks at its multiples, so refine within 10 % by the mean ACF at k * lag.
    span = max(1, int(round(0.1 * first)))
    near = np.arange(max(min_period, first - span), min(limit, first + span) + 1)
    # The plain ACF shrinks lag k by (n - k) / n; undo it, and use lags up to n / 2.
    unbiased = acf * y.size / np.maximum(y.size - np.arange(acf.size), 1)
    score = [unbiased[np.arange(p, max(p, y.size // 2) + 1, p)].mean() for p in near]
    return int(near[int(np.argmax(score))])


def _centred_level(y: np.ndarray, period: int, cycles: int | None):
    """Centred moving average over one period (2 x period for an even one) and the
    indices of ``y`` it is centred on, limited to the last ``cycles`` periods."""
    if period % 2:
        kernel = np.full(period, 1.0 / period)
    else:
        kernel = np.concatenate([[0.5], np.ones(period - 1), [0.5]]) / period
    level = np.convolve(y, kernel, mode="valid")
    half = (kernel.size - 1) // 2
    idx = np.arange(half, half + level.size)
    if cycles is not None:
        keep = idx >= y.size - half - cycles * period
        idx, level = idx[keep], level[keep]
    return idx, level


def seasonal_profile(
    history, period: int, cycles: int | None = None, kind: str = "additive"
) -> np.ndarray:
    """The seasonal shape per phase; ``profile[t % period]`` belongs to point ``t`` of
    ``history``.

    ``additive``: mean of ``y - level`` per phase, zero mean. ``multiplicative``: mean
    of ``y / level`` per phase, mean one (at least 0.05, so a shape can be divided
    out). The level is the centred moving average over one period (2 x period for an
    even period), so only points with a full window on both sides contribute;
    ``cycles`` limits it to the last that many periods.
    """
    y = v.series(history, "history")
    period = v.positive_int(period, "period")
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    if y.size < 2 * period:
        raise ValueError(f"history needs two periods ({2 * period} points), got {y.size}")
    idx, level = _centred_level(
        y, period, None if cycles is None else v.positive_int(cycles, "cycles")
    )
    phase = idx % period
    counts = np.bincount(phase, minlength=period)
    if kind == "additive":
        sums = np.bincount(phase, weights=y[idx] - level, minlength=period)
        profile = np.divide(sums, counts, out=np.zeros(period), where=counts > 0)
        return profile - profile[counts > 0].mean()
    ratio = np.divide(y[idx], level, out=np.ones(idx.size), where=level > 1e-12)
    sums = np.bincount(phase, weights=ratio, minlength=period)
    profile = np.divide(sums, counts, out=np.ones(period), where=counts > 0)
    profile = profile / profile[counts > 0].mean()
    return np.maximum(profile, 0.05)


#: Seasonal shapes: added to the level, or scaling it.
KINDS = ("additive", "multiplicative")


def _ses(d: np.ndarray, alphas=SES_ALPHAS) -> tuple[np.ndarray, np.ndarray]:
    """One-step-ahead SES forecasts of ``d`` (``f[t]`` forecasts ``d[t]``, the first
    is ``d[0]``) and the final level, with the alpha of the smallest squared error."""
    best = None
    for a in alphas:
        # l_t = a d_t + (1 - a) l_{t-1}, started at d_0.
        lvl = lfilter([a], [1.0, a - 1.0], d, zi=[(1.0 - a) * d[0]])[0]
        fc = np.concatenate([[d[0]], lvl[:-1]])
        sse = float(np.sum((d - fc) ** 2))
        if best is None or sse < best[0]:
            best = (sse, fc, lvl[-1])
    return best[1], np.array([best[2]])


def seasonal_forecast(
    history, period: int, horizon: int = 1, cycles: int = 6, kind: str = "auto"
) -> tuple[np.ndarray, str]:
    """Forecast ``horizon`` slots with a period of ``period`` slots; return the values
    (not floored) and the kind of shape used.

    The shape comes from the last ``cycles`` periods (:func:`seasonal_profile`); the
    seasonally adjusted series (``y - shape`` or ``y / shape``) over those periods is
    smoothed exponentially, alpha chosen by its one-step squared error, and the next
    phases' shape is put back on the smoothed level. ``kind="auto"`` fits both shapes
    and keeps the one whose in-sample one-step errors, in the series' own units, are
    smaller (a day whose volume changes scales its shape: multiplicative).
    """
    y = v.series(history, "history")
    horizon = _check_horizon(horizon)
    kinds = KINDS if kind == "auto" else (kind,)
    if kind != "auto" and kind not in KINDS:
        raise ValueError(f"kind must be 'auto' or one of {KINDS}, got {kind!r}")
    t = np.arange(y.size)
    future = np.arange(y.size, y.size + horizon)
    recent = slice(max(0, y.size - cycles * period), y.size)
    best = None
    for k in kinds:
        profile = seasonal_profile(y, period, cycles, k)
        shape = profile[t[recent] % period]
        ahead = profile[future % period]
        if k == "additive":
            fitted, level = _ses(y[recent] - shape)
            fitted, values = fitted + shape, level + ahead
        else:
            fitted, level = _ses(y[recent] / shape)
            fitted, values = fitted * shape, level * ahead
        sse = float(np.sum((y[recent] - fitted) ** 2))
        if best is None or sse < best[0]:
            best = (sse, values, k)
    return best[1], best[2]


@dataclass(frozen=True)
class MaxRule:
    """The max of ``predictors`` (by default the linear trend over 5 slots and ARIMA,
    the controller's default combination for a source) as one predictor.

    Its ``method`` names the winner. ARIMA objects keep state: a ``MaxRule`` holding
    the same ``Arima`` as other code sees the same forecast at no extra cost.
    """

    predictors: tuple = ()

    def __post_init__(self) -> None:
        if not self.predictors:
            object.__setattr__(self, "predictors", (LinearTrend(5), Arima()))

    def predict(self, history, horizon: int = 1) -> Forecast:
        horizon = _check_horizon(horizon)
        per = [np.asarray(p.forecast(history, horizon), dtype=float) for p in self.predictors]
        values = np.max(np.stack(per), axis=0)
        names = [_name(p) for p in self.predictors]
        winner = combine({n: float(f[0]) for n, f in zip(names, per, strict=True)}).winner
        return Forecast(values, f"max_rule:{winner}")

    def forecast(self, history, horizon: int = 1) -> np.ndarray:
        return self.predict(history, horizon).values


def _name(predictor) -> str:
    return {"LinearTrend": "linear_trend", "Arima": "arima", "LastValue": "last_value"}.get(
        type(predictor).__name__, type(predictor).__name__.lower()
    )


class Seasonal:
    """Seasonal forecaster with a fallback.

    Every call: detect the period over the last ``max_history`` points
    (:func:`detect_period`); with one, compute the seasonal forecast
    (:func:`seasonal_forecast` over the last ``cycles`` periods). Always compute the
    ``fallback`` (default :class:`MaxRule`: the linear trend and ARIMA). Both
    forecasts are scored online against the next point, as the series grows (or
    slides); the seasonal one is used when it exists, has at least ``min_trial``
    scored forecasts among the last ``select_window`` slots, and its mean squared
    error there is at most ``1 - margin`` times the fallback's. Otherwise the
    fallback's forecast is returned and :attr:`Forecast.fallback_reason` says why.

    So on a series with no period the forecast *is* the fallback's, and where a
    period comes and goes the forecaster only follows it while it pays. A history
    too short for two periods of ``min_period`` has no period (fallback). Empty or
    non-finite history is a ValueError, as for every predictor.
    """

    def __init__(
        self,
        fallback=None,
        *,
        min_period: int = 2,
        max_period: int | None = None,
        max_history: int = 1000,
        cycles: int = 6,
        select_window: int = 30,
        min_trial: int = 10,
        margin: float = 0.1,
        min_acf: float = 0.3,
        min_prominence: float = 0.2,
        floor: float | None = 0.0,
    ) -> None:
        self.fallback = fallback if fallback is not None else MaxRule()
        if not callable(getattr(self.fallback, "forecast", None)):
            raise ValueError(f"fallback must have forecast(history, horizon), got {fallback!r}")
        self.min_period = max(v.positive_int(min_period, "min_period"), 2)
        self.max_period = None if max_period is None else v.positive_int(max_period, "max_period")
        self.max_history = v.positive_int(max_history, "max_history")
        self.cycles = v.positive_int(cycles, "cycles")
        self.select_window = v.positive_int(select_window, "select_window")
        self.min_trial = v.positive_int(min_trial, "min_trial")
        if self.min_trial > self.select_window:
            raise ValueError(
                f"min_trial must be <= select_window, got {min_trial} > {select_window}"
            )
        margin = v.non_negative(margin, "margin")
        if margin >= 1:
            raise ValueError(f"margin must be in [0, 1), got {margin}")
        self.margin = margin
        self.min_acf, self.min_prominence = min_acf, min_prominence
        self.floor = floor
        # Squared one-step errors of (seasonal, fallback); seasonal is NaN when it
        # made no forecast that slot.
        self._errors: deque[tuple[float, float]] = deque(maxlen=self.select_window)
        self._pending: tuple[float, float] | None = None
        self._tail, self._seen_size = np.empty(0), 0
        self._cache: tuple[int, Forecast] | None = None
        self.period: int | None = None
        self.kind: str | None = None
        self.last: Forecast | None = None

    def _score(self, h: np.ndarray) -> int | None:
        new = new_point_count(self._tail, self._seen_size, h)
        if new and self._pending is not None:
            actual = h[h.size - new]
            s, f = self._pending
            self._errors.append(((actual - s) ** 2, (actual - f) ** 2))
        self._tail, self._seen_size = h[-8:].copy(), h.size
        return new

    def _choose(self) -> tuple[bool, str | None]:
        if self.period is None:
            return False, "no period in the history"
        errs = np.array(self._errors, dtype=float).reshape(-1, 2)
        both = errs[np.isfinite(errs[:, 0])]
        if both.shape[0] < self.min_trial:
            return False, (
                f"period {self.period}: {both.shape[0]} scored seasonal forecasts, "
                f"fewer than {self.min_trial}"
            )
        mse_s, mse_f = both.mean(axis=0)
        if mse_s <= (1.0 - self.margin) * mse_f:
            return True, None
        return False, (
            f"period {self.period}: seasonal MSE {mse_s:.4g} not below "
            f"{1 - self.margin:.2f} x fallback MSE {mse_f:.4g} over the last slots"
        )

    def predict(self, history, horizon: int = 1) -> Forecast:
        h = v.series(history, "history")
        horizon = _check_horizon(horizon)
        new = self._score(h)
        if new == 0 and self._cache is not None and self._cache[0] == horizon:
            return self._cache[1]
        fb = np.asarray(self.fallback.forecast(h, horizon), dtype=float)
        recent = h[-self.max_history :]
        self.period = detect_period(
            recent,
            min_period=self.min_period,
            max_period=self.max_period,
            min_acf=self.min_acf,
            min_prominence=self.min_prominence,
        )
        seasonal, self.kind = None, None
        if self.period is not None:
            values, self.kind = seasonal_forecast(recent, self.period, horizon, self.cycles)
            seasonal = _floor(values, self.floor)
        self._pending = (float(seasonal[0]) if seasonal is not None else np.nan, float(fb[0]))
        use, reason = self._choose()
        if use and seasonal is not None:
            result = Forecast(seasonal, f"seasonal:{self.kind}")
        else:
            result = Forecast(_floor(fb, self.floor), "fallback", None, reason)
        self._cache = (horizon, result)
        self.last = result
        return result

    def forecast(self, history, horizon: int = 1) -> np.ndarray:
        return self.predict(history, horizon).values


def register() -> None:
    """Make ``seasonal`` and ``max_rule`` available through ``make_predictor``."""
    PREDICTORS.setdefault("seasonal", Seasonal)
    PREDICTORS.setdefault("max_rule", MaxRule)


register()
