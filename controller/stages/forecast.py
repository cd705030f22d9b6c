"""Stage 2 of the epoch: each operator's arrivals next slot and its CPU per tuple.

The prediction is the max of the enabled predictors, chosen by name in the
config (``predictors``); docs/architecture.md, "Load", gives the formulas:

* ``linear_trend``: least squares over the last phi slots, evaluated one slot
  on (Liu et al., "An Adaptive Online Scheme for Scheduling and Resource
  Enforcement in Storm", load prediction by regression);
* ``dag``: for non-sources, what the parents are predicted to send, sum over
  parents of (arrivals - queue growth) * selectivity (the same paper's
  prediction from parents: what a parent processes);
* ``arima``: for sources with enough long history, an ARIMA forecast
  (statsmodels) over the source's arrival series ("QoS-aware CPU cap
  adjustment for timely data-flow", the MPC controller's forecast).

Pure: the controller's memory (source series, CPU-per-tuple memory) is read,
never written. What this epoch observed comes back in :class:`ForecastResult`
and :class:`controller.memory.ControllerMemory` takes it in one place. The one
exception is a cache: each source's :class:`predict.load.Arima` keeps its
fitted parameters between epochs so an epoch advances its filter instead of
refitting; the cache changes how fast a forecast is made, not its value.

:func:`size_forecasts` adds the rate demand is sized for: a QoS class's quantile
of next slot's arrivals, from the memory's conformal bank of one-step errors.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import numpy as np

from controller.stages.evaluate import OperatorView
from dsched.ids import OperatorKey
from dsched.registry import Registry
from predict.cost import cpu_per_tuple, cpu_per_tuple_many
from predict.intervals import ConformalBank
from predict.load import (
    Arima,
    Combined,
    LinearTrend,
    combine,
    linear_trend_many,
    propagate,
)
from predict.seasonal import Seasonal

#: Predictor names for the ``predictors`` config key; ``dag`` applies to
#: non-sources, ``arima`` and ``seasonal`` to sources only, ``last_value`` to all.
PREDICTORS: Registry[str] = Registry("predictor", "predictors")
for _name in ("linear_trend", "last_value", "dag", "arima", "seasonal"):
    PREDICTORS.add(_name, lambda _n=_name: _n)


class _GivenForecast:
    """The fallback a source's :class:`~predict.seasonal.Seasonal` scores itself
    against: the max of the controller's other predictions for that source this
    epoch, computed before it is asked for."""

    value = 0.0

    def forecast(self, history, horizon: int = 1) -> np.ndarray:
        return np.full(horizon, self.value)


@dataclass
class OperatorForecast:
    key: OperatorKey
    rate: float  # predicted arrivals, tuples/s, next slot
    predictor: str  # which prediction won
    candidates: dict[str, float]
    kappa: float  # CPU-seconds per tuple
    # The view's selectivity (emitted / executed), computed with the forecast so
    # the decision record need not compute it again.
    selectivity: float | None = None
    # The rate demand is sized for: the class's forecast quantile of next slot's
    # arrivals (:func:`size_forecasts`); None: the point forecast ``rate``.
    sized_rate: float | None = None
    quantile: float = 0.5  # the forecast quantile ``sized_rate`` stands for
    # The window's CPU per tuple when ``kappa`` was taken to the sized rate by
    # :func:`cost_at_rate`; None: ``kappa`` is the window's.
    window_kappa: float | None = None

    @property
    def demand_rate(self) -> float:
        """The arrivals demand is sized for (tuples/s)."""
        return self.rate if self.sized_rate is None else self.sized_rate


class SourceHistory:
    """Long arrival series of source operators, part of the controller's memory.

    The fast loop keeps only phi slots; a source gets one point per new slot
    here (:meth:`observe`, called by the memory update), and a cached
    :class:`predict.load.Arima` per series.
    """

    def __init__(self, length: int = 300, fits_per_epoch: int = 8, **arima_options):
        self.length = length
        # First fits cost tens of milliseconds each; when many sources reach the
        # minimum history together, fitting all in one epoch would stall it, so
        # only this many first fits run per epoch (the rest use the trend meanwhile).
        self.fits_per_epoch = fits_per_epoch
        self.arima_options = arima_options
        self.series: dict[OperatorKey, deque[float]] = {}
        self.models: dict[OperatorKey, Arima] = {}
        self.seasonal_models: dict[OperatorKey, Seasonal] = {}
        self._seen: dict[OperatorKey, float] = {}

    def is_new(self, view: OperatorView) -> bool:
        """Does ``view`` end with a slot this series has not taken yet?"""
        return bool(len(view.arrivals)) and self._seen.get(view.key, -1.0) < view.last_timestamp

    def series_with(self, view: OperatorView) -> np.ndarray:
        """The series as it will be once ``view``'s newest slot is observed."""
        old = self.series.get(view.key, ())
        values = [*old, float(view.arrivals[-1])] if self.is_new(view) else list(old)
        return np.asarray(values[-self.length :], dtype=float)

    def predict(self, key: OperatorKey, series: np.ndarray, budget: FitBudget) -> float | None:
        """ARIMA's next value, or None while the series is too short to fit."""
        model = self.models.get(key)
        if model is None:
            model = self.models[key] = Arima(**self.arima_options)
        if len(series) < model.min_history:
            return None
        if model.fitted_order is None and not budget.take():
            return None
        fc = model.predict(series)
        return float(fc.values[0]) if fc.method == "arima" else None

    def predict_seasonal(self, key: OperatorKey, series: np.ndarray, others: float) -> float | None:
        """The seasonal forecast of ``key``'s next value when its series has a period
        and that forecast has beaten ``others`` (the max of the other predictions)
        over the recent slots; None otherwise. Periods up to half the series
        (``arima_history`` slots) can be found."""
        model = self.seasonal_models.get(key)
        if model is None:
            model = self.seasonal_models[key] = Seasonal(_GivenForecast())
        model.fallback.value = others
        if len(series) == 0:
            return None
        fc = model.predict(series)
        return float(fc.values[0]) if fc.method.startswith("seasonal") else None

    # --- updates: only ControllerMemory calls these -------------------------
    def observe(self, key: OperatorKey, timestamp: float, value: float) -> None:
        if self._seen.get(key, -1.0) >= timestamp:
            return
        self._seen[key] = timestamp
        self.series.setdefault(key, deque(maxlen=self.length)).append(value)

    def prepend(self, key: OperatorKey, older: tuple[float, ...] | list[float]) -> None:
        """Put rates from before this controller's memory (the history table)
        ahead of what it has observed itself, so ARIMA can fit after a restart."""
        mine = list(self.series.get(key, ()))
        self.series[key] = deque([*older, *mine][-self.length :], maxlen=self.length)

    def forget_except(self, live: set[OperatorKey]) -> None:
        for store in (self.series, self.models, self.seasonal_models, self._seen):
            for k in set(store) - live:
                del store[k]


@dataclass
class FitBudget:
    """First ARIMA fits allowed in one epoch."""

    left: int

    def take(self) -> bool:
        if self.left <= 0:
            return False
        self.left -= 1
        return True


@dataclass
class ForecastResult:
    forecasts: dict[OperatorKey, OperatorForecast]
    #: CPU per tuple measured this epoch (operators that processed something).
    kappa_measured: dict[OperatorKey, float] = field(default_factory=dict)
    #: Sources' newest slot: (end of slot, arrivals per second), for SourceHistory.
    source_points: dict[OperatorKey, tuple[float, float]] = field(default_factory=dict)


def forecast(
    views: Mapping[OperatorKey, OperatorView],
    phi: int,
    sources: SourceHistory | None = None,
    kappa_memory: Mapping[OperatorKey, float] | None = None,
    predictors: tuple[str, ...] = ("linear_trend", "dag", "arima"),
    kappa_estimator: str = "mean_ratio",
) -> ForecastResult:
    """Predict every operator's arrivals: the max of the enabled predictors.

    ``kappa_memory`` holds each operator's last measured CPU per tuple; it is
    used when an operator processed nothing in the window (see
    :func:`operator_cost`). ``kappa_estimator`` names how the window's CPU and
    tuples become a cost per tuple (:data:`predict.cost.STRATEGIES`)."""
    kappa_memory = {} if kappa_memory is None else kappa_memory
    use_trend = "linear_trend" in predictors
    use_dag = "dag" in predictors
    use_last = "last_value" in predictors
    use_arima = sources is not None and "arima" in predictors
    use_seasonal = sources is not None and "seasonal" in predictors
    cols = operator_columns(views, phi, use_trend, kappa_estimator)
    budget = FitBudget(sources.fits_per_epoch if sources is not None else 0)
    result = ForecastResult({})
    by_app: dict[str, dict[str, OperatorView]] = {}
    for k, v in views.items():
        by_app.setdefault(k.app, {})[k.operator] = v
    for app in sorted(by_app):
        ops = by_app[app]
        # The trend is the fallback of every operator: with it switched off an
        # operator with no other prediction still gets its last measured rate.
        trended = {
            op: max(0.0, cols.trend[v.key]) if use_trend else float(v.arrivals[-1])
            for op, v in ops.items()
        }
        own = dict(trended)
        # The last slot's arrivals: under the max rule they keep a trend that
        # overshoots downward after a drop (a step, not a ramp) from forecasting
        # less than what is arriving now.
        last = {op: float(v.arrivals[-1]) for op, v in ops.items()} if use_last else {}
        for op, value in last.items():
            own[op] = max(own[op], value)
        children = {op: [c for c, w in ops.items() if op in w.upstream] for op in ops}
        has_parents = {op for kids in children.values() for op in kids}
        arima: dict[str, float] = {}
        seasonal: dict[str, float] = {}
        for op, v in ops.items():
            if op in has_parents or sources is None:
                continue
            if sources.is_new(v):
                result.source_points[v.key] = (v.last_timestamp, float(v.arrivals[-1]))
            series = sources.series_with(v) if use_arima or use_seasonal else None
            if use_arima:
                value = sources.predict(v.key, series, budget)
                if value is not None:
                    arima[op] = max(0.0, value)
                    own[op] = max(own[op], arima[op])
            if use_seasonal:
                # Where the load has a period, its shape predicts the next slot
                # better than a maximum of trends, which overshoots every turn of
                # the cycle: the seasonal forecast then replaces the max rule.
                value = sources.predict_seasonal(v.key, series, own[op])
                if value is not None:
                    seasonal[op] = own[op] = max(0.0, value)
        # The max rule is applied along the DAG: a child sees the larger of its
        # own trend and what its parents are predicted to send it.
        from_parents = (
            propagate(
                children,
                {op: own[op] for op in ops if op not in has_parents},
                {op: cols.selectivity[v.key] for op, v in ops.items()},
                {op: cols.queue_change[v.key] for op, v in ops.items()},
                combine_with={op: own[op] for op in has_parents},
            )
            if use_dag
            else {}
        )
        for op, v in ops.items():
            candidates = {"linear_trend": trended[op]}
            if op in last:
                candidates["last_value"] = last[op]
            if op in arima:
                candidates["arima"] = arima[op]
            if op in has_parents and use_dag:
                candidates["dag"] = from_parents[op]
            if op in seasonal:
                candidates["seasonal"] = seasonal[op]
                best = Combined(seasonal[op], "seasonal", candidates)
            else:
                best = combine(candidates)
            kappa = cols.kappa.get(v.key)
            measured = kappa is not None
            if not measured:
                kappa = kappa_memory.get(v.key, cols.cpu_window[v.key])
            if measured:
                result.kappa_measured[v.key] = kappa
            result.forecasts[v.key] = OperatorForecast(
                v.key,
                best.value,
                best.winner,
                best.candidates,
                float(kappa),
                cols.selectivity[v.key],
            )
    return result


def size_forecasts(
    forecasts: Mapping[OperatorKey, OperatorForecast],
    quantiles: Mapping[OperatorKey, float],
    bank: ConformalBank | None,
    median: bool = False,
) -> dict[OperatorKey, OperatorForecast]:
    """Each forecast with the rate its demand is sized for: the ``quantiles[key]``
    quantile of next slot's arrivals, the point forecast plus the conformal offset
    of the operator's own recent one-step errors (``bank``, read only; see
    docs/prediction.md, "Forecast intervals"). Above 0.5 the rate is never below the
    point forecast. At 0.5 (or a missing quantile) it is, with ``median``, the point
    plus the median of those errors, on either side of the point, and without it the
    point forecast. No bank or an operator without errors yet: the point forecast.
    One bank call for the operators sized above their point forecast, one for the
    medians."""
    out = dict(forecasts)
    ready = bank is not None and len(bank) > 0
    upper = [k for k in forecasts if quantiles.get(k, 0.5) > 0.5]
    if upper:
        q = np.fromiter((quantiles[k] for k in upper), float, len(upper))
        points = np.fromiter((forecasts[k].rate for k in upper), float, len(upper))
        sized = bank.upper(upper, points, q) if ready else points
        for k, quantile, rate in zip(upper, q.tolist(), sized.tolist(), strict=True):
            out[k] = replace(forecasts[k], sized_rate=rate, quantile=quantile)
    middle = [k for k in forecasts if quantiles.get(k, 0.5) == 0.5] if median and ready else []
    if middle:
        points = np.fromiter((forecasts[k].rate for k in middle), float, len(middle))
        for k, rate in zip(middle, bank.median(middle, points).tolist(), strict=True):
            out[k] = replace(forecasts[k], sized_rate=rate, quantile=0.5)
    return out


def cost_at_rate(
    forecasts: Mapping[OperatorKey, OperatorForecast],
    views: Mapping[OperatorKey, OperatorView],
    marginal: Mapping[OperatorKey, float],
) -> dict[OperatorKey, OperatorForecast]:
    """Each forecast's CPU per tuple at the rate its demand is sized for, under an
    affine cost: the window's CPU plus ``marginal`` (CPU per extra tuple, from
    :func:`predict.cost.marginal_cost_many`) times the tuples the sized rate adds
    to (or takes from) those the window processed.

    The window's cost per tuple divides its fixed CPU (an instance's own loop,
    its reporting) by the window's tuples; charged per tuple, that part grows
    with a busier next slot when it does not, and a load that steps between
    levels pays it at every step up. The marginal cost never exceeds the
    window's, so the fixed part is never negative. Operators without a marginal
    cost, or whose window processed nothing, keep the window's cost."""
    out = dict(forecasts)
    for key, slope in marginal.items():
        fc, view = forecasts.get(key), views.get(key)
        if fc is None or view is None or not fc.kappa > 0:
            continue
        seconds = float(view.seconds.sum())
        processed = float(view.executed @ view.seconds)
        rate = fc.demand_rate
        if seconds <= 0 or processed <= 0 or not rate > 0:
            continue
        b = min(slope, fc.kappa)
        fixed = processed / seconds * (fc.kappa - b)  # CPU-seconds per second
        out[key] = replace(fc, kappa=b + fixed / rate, window_kappa=fc.kappa)
    return out


def operator_cost(
    view: OperatorView,
    phi: int,
    memory: Mapping[OperatorKey, float],
    kappa_estimator: str = "mean_ratio",
) -> tuple[float, bool]:
    """CPU-seconds per tuple of an operator and whether it was measured now.

    An operator that processed nothing in the window has no cost estimate of its
    own. An idle one needs none, but one starved by too small a cap must get
    CPU back, or it would stay starved: it keeps its last measured cost, and one
    never measured is charged all the CPU it burnt in the window as if for a
    single tuple, a deliberate overestimate that lifts its cap.
    """
    processed = view.executed * view.seconds
    if float(processed[-phi:].sum()) > 0:
        kappa = cpu_per_tuple(view.cpu_seconds, processed, window=phi, strategy=kappa_estimator)
        return float(kappa), True
    return memory.get(view.key, float(view.cpu_seconds[-phi:].sum())), False


@dataclass
class OperatorColumns:
    """Per operator, what forecast needs from its view, computed for all at once."""

    trend: dict[OperatorKey, float]  # LinearTrend(phi) one slot ahead (empty when not asked)
    kappa: dict[OperatorKey, float]  # CPU per tuple, for operators measured in the window
    cpu_window: dict[OperatorKey, float]  # CPU-seconds in the window (the unmeasured charge)
    selectivity: dict[OperatorKey, float]
    queue_change: dict[OperatorKey, float]


_ARRAYS = ("seconds", "arrivals", "executed", "emitted", "cpu_seconds", "queue")


def operator_columns(
    views: Mapping[OperatorKey, OperatorView],
    phi: int,
    trend: bool = True,
    kappa_estimator: str = "mean_ratio",
) -> OperatorColumns:
    """The trend, cost, selectivity and queue change of every view, as the
    per-view code computes them (:class:`~predict.load.LinearTrend`,
    :func:`operator_cost`, :attr:`OperatorView.selectivity`,
    :attr:`OperatorView.queue_change`) to the bit, but over one array per
    window length: at thousands of operators the per-call overhead, not the
    arithmetic, is the cost."""
    out = OperatorColumns({}, {}, {}, {}, {})
    groups: dict[int, list[OperatorView]] = {}
    for view in views.values():
        n = len(view.arrivals)
        if n and all(len(getattr(view, a)) == n for a in _ARRAYS):
            groups.setdefault(n, []).append(view)
        else:
            _one_view(out, view, phi, trend, kappa_estimator)
    for n, group in groups.items():
        keys = [view.key for view in group]
        k = len(group)

        def stacked(attr: str, group=group, k=k, n=n) -> np.ndarray:
            return np.concatenate([getattr(view, attr) for view in group]).reshape(k, n)

        secs, arrivals, executed = stacked("seconds"), stacked("arrivals"), stacked("executed")
        emitted, cpu, queue = stacked("emitted"), stacked("cpu_seconds"), stacked("queue")
        out.trend.update(
            zip(keys, linear_trend_many(arrivals, phi, floor=0.0).tolist(), strict=True)
        )
        processed = executed * secs
        measured = np.ascontiguousarray(processed[:, -phi:]).sum(axis=1) > 0
        cpu_window = np.ascontiguousarray(cpu[:, -phi:]).sum(axis=1)
        out.cpu_window.update(zip(keys, cpu_window.tolist(), strict=True))
        if measured.any():
            kappa = cpu_per_tuple_many(
                cpu[measured], processed[measured], window=phi, strategy=kappa_estimator
            )
            out.kappa.update(
                zip([keys[i] for i in np.flatnonzero(measured)], kappa.tolist(), strict=True)
            )
        done = _rowdot(executed, secs)
        with np.errstate(divide="ignore", invalid="ignore"):
            sel = np.where(done > 0, _rowdot(emitted, secs) / done, 0.0)
        out.selectivity.update(zip(keys, sel.tolist(), strict=True))
        if n < 2:
            change = np.zeros(k)
        else:
            span = np.maximum(np.ascontiguousarray(secs[:, 1:]).sum(axis=1), 1e-9)
            change = (queue[:, -1] - queue[:, 0]) / span
        out.queue_change.update(zip(keys, change.tolist(), strict=True))
    return out


def _rowdot(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a[i] @ b[i]`` for every row (a stacked matmul runs np.dot's routine per row)."""
    return np.matmul(a[:, None, :], b[:, :, None])[:, 0, 0]


def _one_view(
    out: OperatorColumns, view: OperatorView, phi: int, trend: bool, kappa_estimator: str
) -> None:
    """The per-view code, for a view whose arrays do not line up (or are empty)."""
    key = view.key
    if trend:
        out.trend[key] = float(LinearTrend(window=phi).forecast(view.arrivals, horizon=1)[0])
    processed = view.executed * view.seconds
    if float(processed[-phi:].sum()) > 0:
        out.kappa[key] = float(
            cpu_per_tuple(view.cpu_seconds, processed, window=phi, strategy=kappa_estimator)
        )
    out.cpu_window[key] = float(view.cpu_seconds[-phi:].sum())
    out.selectivity[key] = view.selectivity
    out.queue_change[key] = view.queue_change
