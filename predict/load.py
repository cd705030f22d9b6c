"""Load forecasts: per-series predictors, propagation along the DAG, and the max rule.

* :class:`LinearTrend` -- least-squares line over the last ``window`` slots.
* :class:`LastValue` -- the naive forecast, kept as the yardstick.
* :class:`Arima` -- statsmodels ARIMA whose order is chosen by AIC; the fitted
  parameters are kept and new observations only advance an O(p + q) innovations
  recursion, so the controller holds one object per series between epochs and
  refits only every ``refit_every`` observations or when the one-step error grows.
* :func:`propagate` -- arrivals of non-source operators from their parents:
  ``L_j = sum_p max(0, L_p + delta_p) * rho_pj`` in topological order.
* :func:`combine` -- the max of the available predictions, with the winner named.

Every predictor has ``forecast(history, horizon) -> np.ndarray`` and
``predict(history, horizon) -> Forecast`` (values plus which method produced them and
why). Predictors are also available by name through :func:`make_predictor`.
"""

from __future__ import annotations

import math
import warnings
from collections import deque
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from dsched import validate as v
from dsched.dag import topological_order


@dataclass(frozen=True)
class Forecast:
    """A forecast and how it was made."""

    values: np.ndarray
    method: str
    order: tuple[int, int, int] | None = None
    fallback_reason: str | None = None
    refitted: bool = False


def _check_horizon(horizon: int) -> int:
    return v.positive_int(horizon, "horizon")


def _floor(values: np.ndarray, floor: float | None) -> np.ndarray:
    return values if floor is None else np.maximum(values, floor)


@dataclass(frozen=True)
class LastValue:
    """Tomorrow equals today."""

    floor: float | None = 0.0

    def predict(self, history, horizon: int = 1) -> Forecast:
        h = v.series(history, "history")
        values = np.full(_check_horizon(horizon), h[-1])
        return Forecast(_floor(values, self.floor), "last_value")

    def forecast(self, history, horizon: int = 1) -> np.ndarray:
        return self.predict(history, horizon).values


@dataclass(frozen=True)
class LinearTrend:
    """Least-squares line over the last ``window`` points, evaluated ``horizon`` ahead.

    A single point is forecast flat. Forecasts are clipped at ``floor`` (arrivals are
    never negative); ``floor=None`` disables the clip.
    """

    window: int = 5
    floor: float | None = 0.0

    def __post_init__(self) -> None:
        v.positive_int(self.window, "window")

    def predict(self, history, horizon: int = 1) -> Forecast:
        h = v.series(history, "history")[-self.window :]
        steps = np.arange(1, _check_horizon(horizon) + 1, dtype=float)
        n = h.size
        if n == 1:
            return Forecast(_floor(np.full(steps.size, h[0]), self.floor), "linear_trend")
        x = np.arange(n, dtype=float)
        x_mean, y_mean = x.mean(), h.mean()
        slope = float(np.dot(x - x_mean, h - y_mean) / np.dot(x - x_mean, x - x_mean))
        values = y_mean + slope * (n - 1 + steps - x_mean)
        return Forecast(_floor(values, self.floor), "linear_trend")

    def forecast(self, history, horizon: int = 1) -> np.ndarray:
        return self.predict(history, horizon).values


def linear_trend_many(
    histories: np.ndarray, window: int = 5, floor: float | None = 0.0
) -> np.ndarray:
    """``LinearTrend(window, floor).forecast(row, 1)[0]`` for every row of a 2-D array.

    The controller forecasts thousands of short series per epoch; one call per
    series costs more than the arithmetic. The same operations run on all rows
    at once, in the same order (row means, then the per-row dot product through
    a stacked ``matmul``, which calls the same dot routine as ``np.dot``), so
    each value is the one :class:`LinearTrend` gives, to the bit. A row with a
    non-finite value is a ValueError, as it is for :class:`LinearTrend`.
    """
    h = np.asarray(histories, dtype=float)
    if h.ndim != 2 or h.shape[1] == 0:
        raise ValueError(f"histories must be a 2-D array with at least one column, got {h.shape}")
    window = v.positive_int(window, "window")
    h = np.ascontiguousarray(h[:, -window:])
    bad = ~np.isfinite(h).all(axis=1)
    if bad.any():
        LinearTrend(window, floor).predict(h[int(np.flatnonzero(bad)[0])])  # raises
    n = h.shape[1]
    if n == 1:
        return _floor(h[:, 0].copy(), floor)
    x = np.arange(n, dtype=float)
    x_mean = x.mean()
    dx = x - x_mean
    y_mean = h.mean(axis=1)
    centred = np.ascontiguousarray(h - y_mean[:, None])
    num = np.matmul(np.broadcast_to(dx, h.shape)[:, None, :], centred[:, :, None])[:, 0, 0]
    slope = num / np.dot(dx, dx)
    ahead = (n - 1 + np.arange(1, 2, dtype=float) - x_mean)[0]
    return _floor(y_mean + slope * ahead, floor)


# ------------------------------------------------------------------------------ ARIMA


@dataclass
class _ArmaState:
    """A fitted ARMA on the d-times differenced series as a Kalman filter.

    The state-space matrices and the filtered state come from statsmodels' fit; each
    new observation is one Kalman step on matrices of size max(p, q + 1), which is
    what makes updates cheap and keeps them identical to statsmodels' own filter.
    """

    order: tuple[int, int, int]
    mean: float
    design: np.ndarray  # Z, shape (k,)
    transition: np.ndarray  # T, shape (k, k)
    state_noise: np.ndarray  # R Q R', shape (k, k)
    obs_noise: float  # H
    state: np.ndarray  # predicted state for the next observation
    state_cov: np.ndarray
    sigma: float
    params: np.ndarray  # statsmodels parameter vector, to warm-start the next fit
    last_level: float = 0.0

    def push(self, y: float) -> float:
        """Consume one observation in levels; return its one-step prediction error."""
        w = y - self.last_level if self.order[1] == 1 else y
        self.last_level = y
        z, a, p = self.design, self.state, self.state_cov
        err = (w - self.mean) - float(z @ a)
        pz = p @ z
        f = float(z @ pz) + self.obs_noise
        t = self.transition
        if f > 1e-12:
            gain = t @ pz / f
            self.state = t @ a + gain * err
            self.state_cov = t @ p @ t.T + self.state_noise - np.outer(gain, gain) * f
        else:
            self.state = t @ a
            self.state_cov = t @ p @ t.T + self.state_noise
        return err

    def forecast(self, horizon: int) -> np.ndarray:
        a = self.state
        out = np.empty(horizon)
        for i in range(horizon):
            out[i] = float(self.design @ a) + self.mean
            a = self.transition @ a
        if self.order[1] == 1:
            return self.last_level + np.cumsum(out)
        return out


def _difference_order(y: np.ndarray, alpha: float) -> int:
    """0 when KPSS does not reject level stationarity at ``alpha``, else 1."""
    from statsmodels.tsa.stattools import kpss

    if np.ptp(y) == 0:
        return 0
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _, p_value, *_ = kpss(y, regression="c", nlags="auto")
    except (ValueError, ZeroDivisionError, np.linalg.LinAlgError):
        # Too short or degenerate for the test: fit in levels, AIC still picks p, q.
        return 0
    return 1 if p_value < alpha else 0


def fit_arma_state(
    y: np.ndarray,
    order: tuple[int, int, int] | None,
    max_p: int = 2,
    max_q: int = 1,
    kpss_alpha: float = 0.05,
    start_params: np.ndarray | None = None,
) -> _ArmaState:
    """Fit ARIMA(p, d, q) with a mean (drift when d = 1) and return its filter state.

    With ``order=None``, d comes from a KPSS test and (p, q) from the smallest AIC over
    ``p <= max_p``, ``q <= max_q``. ``start_params`` (a previous fit of the same fixed
    order) warm-starts the optimizer. Raises RuntimeError when no candidate fits.
    """
    from statsmodels.tsa.arima.model import ARIMA

    d = order[1] if order is not None else _difference_order(y, kpss_alpha)
    if d not in (0, 1):
        raise ValueError(f"order: d must be 0 or 1, got {d}")
    w = np.diff(y) if d == 1 else y
    candidates = (
        [(order[0], order[2])]
        if order is not None
        else [(p, q) for p in range(max_p + 1) for q in range(max_q + 1)]
    )
    best, best_aic, errors = None, math.inf, []
    for p, q in candidates:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                # Concentrating the scale out and skipping the parameter covariance
                # makes a fit several times faster; neither is needed to forecast.
                res = ARIMA(w, order=(p, 0, q), trend="c", concentrate_scale=True).fit(
                    start_params=start_params if order is not None else None,
                    cov_type="none",
                )
        except Exception as exc:  # statsmodels raises many types on degenerate data
            errors.append(f"({p},{d},{q}): {exc}")
            continue
        if np.all(np.isfinite(res.params)) and res.aic < best_aic:
            best, best_aic = (p, q, res), res.aic
    if best is None:
        detail = "; ".join(errors) or "no candidate had finite parameters"
        raise RuntimeError(f"ARIMA fit failed: {detail}")
    p, q, res = best
    ssm = res.model.ssm
    obs_intercept = np.asarray(ssm["obs_intercept"], dtype=float)
    state_cov = (
        np.asarray(ssm["state_cov"], dtype=float)[:, :, 0]
        if np.ndim(ssm["state_cov"]) == 3
        else np.asarray(ssm["state_cov"], dtype=float)
    )
    selection = np.asarray(ssm["selection"], dtype=float).reshape(-1, state_cov.shape[0])
    filtered = res.filter_results
    state = _ArmaState(
        order=(p, d, q),
        mean=float(obs_intercept.ravel()[-1]) if obs_intercept.size else 0.0,
        design=np.asarray(ssm["design"], dtype=float).reshape(-1),
        transition=np.asarray(ssm["transition"], dtype=float).reshape(selection.shape[0], -1),
        state_noise=selection @ state_cov @ selection.T,
        obs_noise=float(np.asarray(ssm["obs_cov"]).ravel()[0]),
        state=np.asarray(filtered.predicted_state[:, -1], dtype=float).copy(),
        state_cov=np.asarray(filtered.predicted_state_cov[:, :, -1], dtype=float).copy(),
        sigma=math.sqrt(max(float(res.scale) * float(state_cov[0, 0]), 0.0)),
        params=np.asarray(res.params, dtype=float).copy(),
        last_level=float(y[-1]),
    )
    return state


class Arima:
    """Per-series ARIMA forecaster that keeps its fit between calls.

    ``forecast(history)`` accepts the series as the caller keeps it, growing or a
    sliding window: the new points since the last call are found by aligning the
    stored tail and only advance the fitted filter. A refit happens every
    ``refit_every`` new observations, when the RMS of the last ``error_window``
    one-step errors exceeds ``error_growth`` times the fitted innovation sigma, or when
    the history no longer lines up with what was seen. Routine refits keep the order
    and only re-estimate parameters; the other two choose the order afresh. Fits use
    the last ``fit_window`` points.

    It never raises on ordinary data: with fewer than ``min_history`` points or when
    the fit fails it forecasts with :class:`LinearTrend` and says why in
    :attr:`Forecast.fallback_reason`. Empty or non-finite history is a ValueError.
    """

    def __init__(
        self,
        order: tuple[int, int, int] | None = None,
        *,
        min_history: int = 20,
        refit_every: int = 50,
        error_growth: float = 2.0,
        error_window: int = 5,
        fit_window: int = 300,
        max_p: int = 2,
        max_q: int = 1,
        fallback: LinearTrend | None = None,
        floor: float | None = 0.0,
    ) -> None:
        if order is not None:
            if len(order) != 3 or any(not isinstance(o, int) or o < 0 for o in order):
                raise ValueError(f"order must be three non-negative integers, got {order!r}")
            if order[1] > 1:
                raise ValueError(f"order: d must be 0 or 1, got {order[1]}")
        self.order = order
        self.min_history = max(v.positive_int(min_history, "min_history"), 3)
        self.refit_every = v.positive_int(refit_every, "refit_every")
        self.error_growth = v.positive(error_growth, "error_growth")
        self.error_window = v.positive_int(error_window, "error_window")
        self.fit_window = v.positive_int(fit_window, "fit_window")
        self.max_p, self.max_q = max_p, max_q
        self.fallback = fallback or LinearTrend()
        self.floor = floor
        self._state: _ArmaState | None = None
        self._seen: np.ndarray = np.empty(0)  # last fit_window points of the series
        self._seen_size = 0  # length of the last history passed in
        self._since_fit = 0
        self._recent_sq_errors: deque[float] = deque(maxlen=self.error_window)
        self.fits = 0
        self.last: Forecast | None = None

    # -- state ---------------------------------------------------------------
    @property
    def fitted_order(self) -> tuple[int, int, int] | None:
        return self._state.order if self._state else None

    def _new_points(self, h: np.ndarray) -> np.ndarray | None:
        """Points of ``h`` after what was seen, or None when they do not line up."""
        tail = self._seen[-8:]
        k = tail.size
        if k == 0 or h.size < k:
            return None
        # A growing series first: the seen tail ends where the last history ended.
        # This also resolves runs of equal values, which match at several shifts.
        expected = h.size - self._seen_size
        shifts = range(0, h.size - k + 1)
        if 0 <= expected <= h.size - k:
            shifts = [expected, *shifts]
        for shift in shifts:
            end = h.size - shift
            if np.array_equal(h[end - k : end], tail):
                return h[end:]
        return None

    def _refit(self, h: np.ndarray, keep_order: bool = False) -> None:
        y = h[-self.fit_window :]
        order, start = self.order, None
        if keep_order and self._state is not None:
            order, start = self._state.order, self._state.params
        self._state = fit_arma_state(y, order, self.max_p, self.max_q, start_params=start)
        self._since_fit = 0
        self._recent_sq_errors.clear()
        self.fits += 1

    def _error_grew(self) -> bool:
        if self._state is None or len(self._recent_sq_errors) < self.error_window:
            return False
        rms = math.sqrt(sum(self._recent_sq_errors) / len(self._recent_sq_errors))
        return rms > self.error_growth * max(self._state.sigma, 1e-12)

    def update(self, history) -> bool:
        """Bring the fit up to date with ``history``; return whether it refitted."""
        h = v.series(history, "history")
        new = self._new_points(h) if self._state is not None else None
        if new is None:
            self._refit(h)
            refitted = True
        else:
            refitted = self._advance(new, h)
        self._seen, self._seen_size = h[-self.fit_window :].copy(), h.size
        return refitted

    def observe(self, values) -> bool:
        """Feed new observations without passing the whole history; return whether it
        refitted. Needs a fit from an earlier :meth:`forecast` or :meth:`update`."""
        new = v.series(values, "values")
        if self._state is None:
            raise ValueError("values: no fitted model yet; call forecast(history) first")
        series = np.concatenate([self._seen, new])
        refitted = self._advance(new, series)
        self._seen, self._seen_size = series[-self.fit_window :], self._seen_size + new.size
        return refitted

    def _advance(self, new: np.ndarray, series: np.ndarray) -> bool:
        for value in new:
            err = self._state.push(float(value))
            self._recent_sq_errors.append(err * err)
        self._since_fit += new.size
        if self._error_grew():
            # The series changed character: choose the order afresh.
            self._refit(series)
            return True
        if self._since_fit >= self.refit_every:
            # Routine refresh of the parameters; the order stays.
            self._refit(series, keep_order=True)
            return True
        return False

    def forecast_ahead(self, horizon: int = 1) -> np.ndarray:
        """Forecast from the current fit (after :meth:`observe`)."""
        if self._state is None:
            raise ValueError("horizon: no fitted model yet; call forecast(history) first")
        return _floor(self._state.forecast(_check_horizon(horizon)), self.floor)

    def reset(self) -> None:
        self._state, self._seen, self._seen_size = None, np.empty(0), 0

    # -- forecasting ---------------------------------------------------------
    def predict(self, history, horizon: int = 1) -> Forecast:
        h = v.series(history, "history")
        horizon = _check_horizon(horizon)
        if h.size < self.min_history:
            self.reset()
            result = self._fallback(
                h, horizon, f"history has {h.size} points, fewer than {self.min_history}"
            )
        else:
            try:
                refitted = self.update(h)
            except (RuntimeError, ValueError, np.linalg.LinAlgError) as exc:
                self.reset()
                result = self._fallback(h, horizon, str(exc))
            else:
                values = self._state.forecast(horizon)
                if np.all(np.isfinite(values)):
                    result = Forecast(
                        _floor(values, self.floor), "arima", self._state.order, None, refitted
                    )
                else:
                    self.reset()
                    result = self._fallback(h, horizon, "ARIMA forecast was not finite")
        self.last = result
        return result

    def forecast(self, history, horizon: int = 1) -> np.ndarray:
        return self.predict(history, horizon).values

    def _fallback(self, h: np.ndarray, horizon: int, reason: str) -> Forecast:
        values = self.fallback.forecast(h, horizon)
        return Forecast(_floor(values, self.floor), "linear_trend", None, reason)


#: Predictor factories by name, for configuration files and benchmarks.
PREDICTORS = {
    "last_value": LastValue,
    "linear_trend": LinearTrend,
    "arima": Arima,
}


def make_predictor(name: str, **kwargs):
    """A predictor by name (see :data:`PREDICTORS`)."""
    try:
        return PREDICTORS[name](**kwargs)
    except KeyError:
        raise ValueError(f"predictor must be one of {sorted(PREDICTORS)}, got {name!r}") from None


# ------------------------------------------------------------------- DAG and max rule


def parents_of(dag: Mapping[Hashable, Iterable[Hashable]]) -> dict[Hashable, list[Hashable]]:
    parents: dict[Hashable, list[Hashable]] = {node: [] for node in dag}
    for parent, children in dag.items():
        for child in children:
            parents.setdefault(child, []).append(parent)
    return parents


def _selectivity(selectivity: Mapping, parent: Hashable, child: Hashable, default: float) -> float:
    if (parent, child) in selectivity:
        value, name = selectivity[(parent, child)], f"selectivity[{parent!r}, {child!r}]"
    elif parent in selectivity:
        value, name = selectivity[parent], f"selectivity[{parent!r}]"
    else:
        value, name = default, "default_selectivity"
    return v.non_negative(value, name)


def propagate(
    dag: Mapping[Hashable, Iterable[Hashable]],
    source_rates: Mapping[Hashable, float],
    selectivity: Mapping | None = None,
    queue_change: Mapping[Hashable, float] | None = None,
    *,
    default_selectivity: float = 1.0,
    combine_with: Mapping[Hashable, float] | None = None,
) -> dict[Hashable, float]:
    """Predicted arrivals of every operator, sources included.

    ``dag`` maps each operator to its children. ``selectivity`` maps an operator (its
    emitted/executed ratio) or a ``(parent, child)`` edge to tuples sent per tuple
    processed; missing entries use ``default_selectivity``. ``queue_change`` is the
    mean growth of each operator's pending queue per second (missing: 0). A parent
    processes its arrivals less that growth: the paper's ``delta_p = executed -
    arrivals`` is the growth with its sign turned, so a parent falling behind sends
    its children less than it receives and one working off its queue sends them
    more. A non-source operator receives ``sum_p max(0, L_p + delta_p) * rho_pj`` --
    a parent cannot process a negative number of tuples. With ``combine_with``, an operator's arrivals
    become the max of the propagated value and its own forecast before its children
    are computed (the max rule applied along the DAG).
    """
    selectivity = selectivity or {}
    queue_change = queue_change or {}
    combine_with = combine_with or {}
    if not isinstance(dag, Mapping):
        raise ValueError(f"dag must map each operator to its children, got {type(dag).__name__}")
    parents = parents_of(dag)
    order = topological_order(parents)
    rates: dict[Hashable, float] = {}
    for node in order:
        if not parents[node]:
            if node not in source_rates:
                raise ValueError(f"source_rates has no rate for source operator {node!r}")
            rates[node] = v.non_negative(source_rates[node], f"source_rates[{node!r}]")
            continue
        total = 0.0
        for parent in parents[node]:
            growth = v.finite(queue_change.get(parent, 0.0), f"queue_change[{parent!r}]")
            processed = max(0.0, rates[parent] - growth)
            total += processed * _selectivity(selectivity, parent, node, default_selectivity)
        if node in combine_with:
            total = max(total, v.non_negative(combine_with[node], f"combine_with[{node!r}]"))
        rates[node] = total
    unknown = set(source_rates) - set(rates)
    if unknown:
        raise ValueError(f"source_rates names operators not in dag: {sorted(map(str, unknown))}")
    return rates


@dataclass(frozen=True)
class Combined:
    """The prediction the controller uses and which predictor supplied it."""

    value: float
    winner: str
    candidates: dict[str, float]

    @property
    def reason(self) -> str:
        others = ", ".join(
            f"{k}={val:.4g}" for k, val in self.candidates.items() if k != self.winner
        )
        return f"max of predictions: {self.winner}={self.value:.4g}" + (
            f" over {others}" if others else ""
        )


def combine(predictions: Mapping[str, float | None]) -> Combined:
    """Max of the available predictions (None = predictor unavailable).

    Taking the max avoids congestion when one predictor lags a rise. Ties go to the
    predictor listed first. NaN or negative predictions are a ValueError.
    """
    candidates = {}
    for name, value in predictions.items():
        if value is None:
            continue
        candidates[name] = v.non_negative(value, f"predictions[{name!r}]")
    if not candidates:
        raise ValueError("predictions: no predictor produced a value")
    winner = max(candidates, key=lambda k: candidates[k])
    return Combined(candidates[winner], winner, candidates)
