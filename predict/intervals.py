"""Forecast intervals: conformal quantiles over each forecaster's own one-step errors.

A point forecast says what the next slot will probably bring; sizing CPU for a QoS
class needs a rate the next slot stays under with a chosen probability. Here that
rate comes from the forecaster's own recent record: the score of a slot is its signed
one-step error ``e = actual - forecast``, and the q-quantile of the next slot is the
forecast plus the finite-sample conformal q-quantile of the last ``window`` scores
(split conformal prediction, Vovk, Gammerman and Shafer, *Algorithmic Learning in a
Random World*, 2005; the one-sided form of Lei et al., "Distribution-Free Predictive
Inference for Regression", JASA 2018, section 2.2). Nothing is assumed about the
forecaster: it is treated as a black box, so every predictor in ``predict.load`` and
``predict.seasonal`` gets intervals the same way.

Under exchangeable errors that quantile covers with probability at least q. Load
does not oblige: levels shift and noise grows with the level. The adaptive variant
is adaptive conformal inference (Gibbs and Candès, "Adaptive Conformal Inference
Under Distribution Shift", NeurIPS 2021, section 2): each tracked level keeps an
effective level ``q_t`` and after every outcome moves it by
``q_{t+1} = q_t + gamma * (q - 1{actual <= bound_t})``, so over any T slots the
realised coverage is within ``|q_{T+1} - q_1| / (gamma T)`` of q whatever the data do.

* :func:`conformal_offset` -- the finite-sample quantile of scores, per row of a
  NaN-padded 2-D array (one row per series) or of a 1-D array;
* :func:`quantile_bound` -- point forecast plus offset, on the right side of the
  point (upper quantiles never below it, lower ones never above it);
* :func:`rate_for_quantile` -- the rate to size for at a QoS class's quantile;
* :func:`aci_step` -- one adaptive-conformal update of effective levels;
* :class:`ConformalBank` -- rolling scores and adaptive levels of many series at once,
  keyed like the controller's operators;
* :class:`WithConformalUpper` -- wraps any single-series forecaster and adds
  ``upper(history, q)`` and ``interval(history, coverage)``;
* :func:`conformal_replay` -- the online procedure replayed over whole arrays of
  forecasts and outcomes (benchmarks, tests).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from dsched import validate as v

#: Effective adaptive levels are kept in this range: beyond it the quantile is
#: already the smallest or largest score and moving further only delays recovery.
_LEVEL_CLAMP = (-0.5, 1.5)


def check_quantile(q, name: str = "quantile") -> np.ndarray:
    """``q`` as a float array, every entry strictly between 0 and 1."""
    try:
        arr = np.asarray(q, dtype=float)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be a number in (0, 1): {exc}") from exc
    if arr.size == 0 or not np.all((arr > 0.0) & (arr < 1.0)):
        raise ValueError(f"{name} must be strictly between 0 and 1, got {q!r}")
    return arr


def _rank(n: np.ndarray, level: np.ndarray) -> np.ndarray:
    """1-based rank of the conformal quantile among ``n`` sorted scores.

    Upper quantiles (level >= 0.5) take the ``ceil((n + 1) level)``-th smallest score,
    lower ones the ``floor((n + 1) level)``-th: both the conservative finite-sample
    choice for their side, and the rank never falls as the level rises. Ranks outside
    ``1..n`` (too few scores for so extreme a level) become the extreme score.
    """
    raw = (n + 1) * level
    rank = np.where(level >= 0.5, np.ceil(raw - 1e-9), np.floor(raw + 1e-9))
    return np.clip(rank, 1, np.maximum(n, 1)).astype(int)


def conformal_offset(scores, quantile) -> np.ndarray | float:
    """Finite-sample conformal ``quantile`` of ``scores``.

    ``scores`` is 1-D (one series; returns a float) or 2-D with one row per series
    and NaN where a row has fewer scores than columns (returns one value per row).
    ``quantile`` is a scalar or one value per row, each in (0, 1). A row without any
    finite score gives NaN: the caller decides the fallback (see
    :class:`ConformalBank` and :class:`WithConformalUpper`).
    """
    s = np.asarray(scores, dtype=float)
    if s.ndim not in (1, 2):
        raise ValueError(f"scores must be 1-D or 2-D, got shape {s.shape}")
    q = check_quantile(quantile)
    single = s.ndim == 1
    s2 = s[None, :] if single else s
    if np.any(np.isinf(s2)):
        raise ValueError("scores must not contain infinities (NaN marks a missing score)")
    q = np.broadcast_to(q, (s2.shape[0],)) if q.ndim <= 1 else q
    if q.shape != (s2.shape[0],):
        raise ValueError(f"quantile must be a scalar or one value per row, got shape {q.shape}")
    n = np.sum(np.isfinite(s2), axis=1)
    out = _offset_sorted(np.sort(s2, axis=1), n, q)
    return float(out[0]) if single else out


def _offset_sorted(sorted_scores: np.ndarray, n: np.ndarray, level: np.ndarray) -> np.ndarray:
    """Quantile at (effective) ``level`` per row of row-sorted, NaN-last scores."""
    if sorted_scores.shape[1] == 0:
        return np.full(sorted_scores.shape[0], np.nan)
    rank = _rank(n, np.asarray(level, dtype=float))
    out = np.take_along_axis(sorted_scores, (rank - 1)[:, None], axis=1)[:, 0]
    return np.where(n > 0, out, np.nan)


def quantile_bound(points, offset, quantile, floor: float | None = 0.0) -> np.ndarray:
    """``points + offset`` kept on the point's side of the distribution.

    For ``quantile >= 0.5`` (an upper quantile) the bound is never below the point
    forecast; below 0.5 it is never above it. Bounds are clipped at ``floor`` (arrival
    rates are never negative; ``None``: no clip). NaN offsets count as 0.
    """
    p = np.asarray(points, dtype=float)
    off = np.nan_to_num(np.asarray(offset, dtype=float), nan=0.0)
    q = check_quantile(quantile)
    bound = p + np.where(q >= 0.5, np.maximum(off, 0.0), np.minimum(off, 0.0))
    return bound if floor is None else np.maximum(bound, floor)


def rate_for_quantile(points, scores, quantile, floor: float | None = 0.0):
    """The arrival rate to size for: the ``quantile`` of next slot's arrivals.

    ``points`` are the point forecasts (scalar or one per row), ``scores`` each
    series' recent one-step errors ``actual - forecast`` (1-D, or 2-D NaN-padded with
    one row per series), ``quantile`` the QoS class's quantile (scalar or one per row;
    e.g. ``1 - max_violation_ratio``). Never below the point forecast; a series with
    no score yet is sized at its point forecast. Pure: keep the scores where you like
    (or use :class:`ConformalBank`, which keeps them and adapts the level).
    """
    s = np.asarray(scores, dtype=float)
    offset = conformal_offset(s, quantile)
    out = quantile_bound(points, offset, quantile, floor)
    return float(out) if np.ndim(out) == 0 else out


def aci_step(effective, hit, target, gamma: float) -> np.ndarray:
    """One adaptive-conformal update: ``effective + gamma * (target - hit)``.

    ``hit`` is 1 where the outcome fell at or below the bound issued at the effective
    level (for a lower quantile: at or below the lower bound, i.e. a miss of the
    interval). Vectorised; the result is kept in [-0.5, 1.5].
    """
    gamma = v.positive(gamma, "gamma")
    eff = np.asarray(effective, dtype=float) + gamma * (
        np.asarray(target, dtype=float) - np.asarray(hit, dtype=float)
    )
    return np.clip(eff, *_LEVEL_CLAMP)


# --------------------------------------------------------------------------- the bank


class ConformalBank:
    """Rolling one-step errors and adaptive levels of many series, keyed.

    Keys are whatever identifies a series (the controller's operator keys). Each key
    owns one row of a ``(capacity, window)`` ring buffer of scores, and one effective
    level per tracked level in ``levels`` (the adaptive state). Everything per epoch
    is one numpy call over all the keys passed:

    * ``update(keys, actual, predicted)`` -- score the forecasts issued last time
      against what arrived, move the adaptive levels, then store the scores;
    * ``bound(keys, points, quantile)`` -- the quantile bound of the next slot,
      ``upper`` / ``interval`` the usual shorthands;
    * ``median(keys, points)`` -- the median of the next slot, either side of the
      point forecast.

    With ``adaptive=True`` a requested quantile that is one of ``levels`` uses its
    adaptive effective level; any other quantile uses the plain conformal level.
    Across the tracked upper levels the offsets are made non-decreasing (each is at
    least the offset of every smaller tracked level), so an adaptive upper bound never
    falls as the quantile rises. A key with fewer than ``min_scores`` scores is "cold":
    its offset is computed from what it has (none: the bound is the point forecast),
    and :meth:`cold` lists such keys.
    """

    def __init__(
        self,
        window: int = 200,
        levels: Iterable[float] = (0.9,),
        *,
        adaptive: bool = True,
        gamma: float = 0.01,
        min_scores: int = 10,
    ) -> None:
        self.window = v.positive_int(window, "window")
        lv = check_quantile(list(levels), "levels") if levels else np.empty(0)
        self.levels = np.unique(lv)
        self.adaptive = bool(adaptive)
        self.gamma = v.positive(gamma, "gamma")
        self.min_scores = v.positive_int(min_scores, "min_scores")
        self._row: dict[Hashable, int] = {}
        self._free: list[int] = []
        cap = 16
        self._scores = np.full((cap, self.window), np.nan)
        self._pos = np.zeros(cap, dtype=int)
        self._count = np.zeros(cap, dtype=int)
        self._eff = np.tile(self.levels, (cap, 1))

    # -- rows --------------------------------------------------------------
    def _rows(self, keys: Sequence[Hashable], create: bool) -> np.ndarray:
        rows = np.empty(len(keys), dtype=int)
        for i, key in enumerate(keys):
            row = self._row.get(key)
            if row is None:
                if not create:
                    row = -1
                else:
                    row = self._free.pop() if self._free else len(self._row)
                    if row >= self._scores.shape[0]:
                        self._grow(row + 1)
                    self._row[key] = row
                    self._reset(row)
            rows[i] = row
        return rows

    def _grow(self, need: int) -> None:
        cap = max(need, 2 * self._scores.shape[0])
        extra = cap - self._scores.shape[0]
        self._scores = np.vstack([self._scores, np.full((extra, self.window), np.nan)])
        self._pos = np.concatenate([self._pos, np.zeros(extra, dtype=int)])
        self._count = np.concatenate([self._count, np.zeros(extra, dtype=int)])
        self._eff = np.vstack([self._eff, np.tile(self.levels, (extra, 1))])

    def _reset(self, row: int) -> None:
        self._scores[row] = np.nan
        self._pos[row] = 0
        self._count[row] = 0
        self._eff[row] = self.levels

    def forget_except(self, live: Iterable[Hashable]) -> None:
        """Drop the state of every key not in ``live``."""
        live = set(live)
        for key in [k for k in self._row if k not in live]:
            self._free.append(self._row.pop(key))

    def __len__(self) -> int:
        return len(self._row)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._row

    # -- state -------------------------------------------------------------
    def count(self, keys: Sequence[Hashable]) -> np.ndarray:
        """How many scores each key holds (0 for an unknown key)."""
        rows = self._rows(list(keys), create=False)
        return np.where(rows >= 0, self._count[np.maximum(rows, 0)], 0)

    def cold(self, keys: Sequence[Hashable]) -> list[Hashable]:
        """The keys with fewer than ``min_scores`` scores."""
        keys = list(keys)
        return [k for k, c in zip(keys, self.count(keys), strict=True) if c < self.min_scores]

    def scores(self, key: Hashable) -> np.ndarray:
        """The key's scores, oldest first."""
        row = self._row.get(key)
        if row is None:
            return np.empty(0)
        n, pos = self._count[row], self._pos[row]
        ring = np.roll(self._scores[row], -pos) if n == self.window else self._scores[row, :n]
        return ring.copy()

    def effective_levels(self, key: Hashable) -> dict[float, float]:
        """The adaptive effective level of each tracked level for ``key``."""
        row = self._row.get(key)
        eff = self._eff[row] if row is not None else self.levels
        return {float(q): float(e) for q, e in zip(self.levels, eff, strict=True)}

    # -- per epoch ---------------------------------------------------------
    def _arrays(self, keys, *arrays, names):
        keys = list(keys)
        out = []
        for arr, name in zip(arrays, names, strict=True):
            a = np.broadcast_to(np.asarray(arr, dtype=float), (len(keys),))
            if not np.all(np.isfinite(a)):
                bad = int(np.flatnonzero(~np.isfinite(a))[0])
                raise ValueError(f"{name} contains a non-finite value for key {keys[bad]!r}")
            out.append(a)
        return keys, out

    def update(self, keys: Sequence[Hashable], actual, predicted) -> None:
        """Score last slot's forecasts ``predicted`` against ``actual`` per key.

        ``actual`` and ``predicted`` are scalars or one value per key (finite). The
        adaptive levels move first, using the bounds the scores held before this
        update gave (the bounds that were issued), then the new scores are stored.
        """
        keys, (y, p) = self._arrays(keys, actual, predicted, names=("actual", "predicted"))
        if not keys:
            return
        if len(set(keys)) != len(keys):
            raise ValueError("keys must be unique within one update")
        rows = self._rows(keys, create=True)
        if self.adaptive and self.levels.size:
            offsets = self._tracked_offsets(rows)  # (k, L), as issued
            bounds = quantile_bound(p[:, None], offsets, self.levels[None, :], floor=None)
            hit = (y[:, None] <= bounds).astype(float)
            has = self._count[rows] > 0
            eff = aci_step(self._eff[rows], hit, self.levels[None, :], self.gamma)
            self._eff[rows] = np.where(has[:, None], eff, self._eff[rows])
        pos = self._pos[rows]
        self._scores[rows, pos] = y - p
        self._pos[rows] = (pos + 1) % self.window
        self._count[rows] = np.minimum(self._count[rows] + 1, self.window)

    def _tracked_offsets(self, rows: np.ndarray) -> np.ndarray:
        """Offsets at every tracked level's effective level, shape (k, L), made
        monotone: upper levels non-decreasing upwards, lower ones non-increasing
        downwards."""
        srt = np.sort(self._scores[rows], axis=1)
        n = self._count[rows]
        cols = [_offset_sorted(srt, n, self._eff[rows, j]) for j in range(self.levels.size)]
        off = np.stack(cols, axis=1) if cols else np.empty((rows.size, 0))
        upper = self.levels >= 0.5
        if upper.any():
            off[:, upper] = np.fmax.accumulate(off[:, upper], axis=1)
        if (~upper).any():
            off[:, ~upper] = np.fmin.accumulate(off[:, ~upper][:, ::-1], axis=1)[:, ::-1]
        return off

    def offset(self, keys: Sequence[Hashable], quantile) -> np.ndarray:
        """Per key, the score quantile added to the point forecast (NaN: no scores)."""
        keys = list(keys)
        q = np.broadcast_to(check_quantile(quantile), (len(keys),))
        rows = self._rows(keys, create=False)
        known = rows >= 0
        out = np.full(len(keys), np.nan)
        if not known.any():
            return out
        r, qk = rows[known], q[known]
        srt = np.sort(self._scores[r], axis=1)
        res = _offset_sorted(srt, self._count[r], qk)
        if self.adaptive and self.levels.size:
            tracked = self._tracked_offsets(r)
            idx = np.searchsorted(self.levels, qk)
            is_tracked = (idx < self.levels.size) & (
                self.levels[np.minimum(idx, self.levels.size - 1)] == qk
            )
            pick = np.take_along_axis(tracked, np.minimum(idx, self.levels.size - 1)[:, None], 1)
            res = np.where(is_tracked, pick[:, 0], res)
        out[known] = res
        return out

    def bound(self, keys: Sequence[Hashable], points, quantile, floor: float | None = 0.0):
        """The ``quantile`` of next slot's value per key, around ``points``."""
        keys, (p,) = self._arrays(keys, points, names=("points",))
        return quantile_bound(p, self.offset(keys, quantile), quantile, floor)

    def upper(self, keys: Sequence[Hashable], points, quantile=0.9, floor: float | None = 0.0):
        """Upper quantile per key (never below the point forecast): the rate to size
        for at a QoS class's ``quantile`` (scalar or one per key)."""
        q = check_quantile(quantile)
        if np.any(q < 0.5):
            raise ValueError(f"quantile of an upper bound must be >= 0.5, got {quantile!r}")
        return self.bound(keys, points, quantile, floor)

    def median(self, keys: Sequence[Hashable], points, floor: float | None = 0.0) -> np.ndarray:
        """The median of next slot's value per key: the point forecast plus the median
        of the key's own scores, on either side of the point (a forecaster that
        overshoots more often than not is brought down). A cold key (fewer than
        ``min_scores`` scores) keeps its point forecast: a handful of errors is no
        median to move a forecast by."""
        keys, (p,) = self._arrays(keys, points, names=("points",))
        rows = self._rows(keys, create=False)
        warm = (rows >= 0) & (self._count[np.maximum(rows, 0)] >= self.min_scores)
        offset = np.zeros(len(keys))
        if warm.any():
            r = rows[warm]
            srt = np.sort(self._scores[r], axis=1)
            offset[warm] = _offset_sorted(srt, self._count[r], np.full(r.size, 0.5))
        out = p + offset
        return out if floor is None else np.maximum(out, floor)

    def interval(self, keys: Sequence[Hashable], points, coverage=0.9, floor=0.0):
        """Central interval ``(lower, upper)`` covering ``coverage`` per key."""
        c = check_quantile(coverage, "coverage")
        lo, hi = (1.0 - c) / 2.0, (1.0 + c) / 2.0
        return self.bound(keys, points, lo, floor), self.bound(keys, points, hi, floor)


# ---------------------------------------------------------------- single-series wrapper


def new_point_count(tail: np.ndarray, seen_size: int, history: np.ndarray) -> int | None:
    """How many points ``history`` has after the previous one, whose last points were
    ``tail`` and whose length was ``seen_size``; None when they do not line up.

    Works for a growing series and for a sliding window of fixed length. A growing
    series is tried first, which also resolves runs of equal values.
    """
    k = tail.size
    if k == 0 or history.size < k:
        return None
    expected = history.size - seen_size
    shifts = list(range(0, history.size - k + 1))
    if 0 <= expected <= history.size - k:
        shifts = [expected, *shifts]
    for shift in shifts:
        end = history.size - shift
        if np.array_equal(history[end - k : end], tail):
            return shift
    return None


@dataclass(frozen=True)
class IntervalForecast:
    """A point forecast for the next slot with its conformal quantile bound."""

    value: float  # the base forecaster's point forecast
    bound: float  # the quantile of next slot's value (upper for quantile >= 0.5)
    quantile: float
    method: str  # the base forecaster's method
    scores: int  # own one-step errors the bound is based on
    fallback_reason: str | None = None


class WithConformalUpper:
    """Any single-series forecaster plus conformal quantiles of its next value.

    ``base`` needs ``forecast(history, horizon) -> array`` (every predictor in
    ``predict.load`` and ``predict.seasonal``). Call :meth:`predict` (or
    :meth:`upper`, :meth:`interval`) with the series as you keep it, growing or a
    sliding window, once per slot: the points that are new since the last call are
    found by aligning the tail, and the first of them scores the forecast issued then.
    ``forecast`` passes the base's point forecast through, so the wrapper drops in
    wherever the base is used.

    The bound uses the last ``window`` own errors, with adaptive conformal inference
    at ``quantile`` (and every level in ``levels``) unless ``adaptive=False``. Until
    ``min_scores`` own errors exist (a new series, or a history that no longer lines
    up), the bound is computed from the own errors plus the last-value errors of the
    history itself (``diff(history)``, newest first), and
    :attr:`IntervalForecast.fallback_reason` says so; with a single point and no own
    error the bound is the point forecast. Intervals are for the next slot only.
    """

    def __init__(
        self,
        base,
        window: int = 200,
        quantile: float = 0.9,
        *,
        levels: Iterable[float] = (),
        adaptive: bool = True,
        gamma: float = 0.01,
        min_scores: int = 10,
    ) -> None:
        if not callable(getattr(base, "forecast", None)):
            raise ValueError(f"base must have forecast(history, horizon), got {base!r}")
        self.base = base
        self.quantile = float(check_quantile(quantile))
        extra = [float(x) for x in check_quantile(list(levels), "levels")] if levels else []
        tracked = {self.quantile, *extra}
        self._bank = ConformalBank(
            window, sorted(tracked), adaptive=adaptive, gamma=gamma, min_scores=min_scores
        )
        self._pending: float | None = None
        self._tail = np.empty(0)
        self._seen_size = 0
        self.last: IntervalForecast | None = None

    @property
    def bank(self) -> ConformalBank:
        return self._bank

    def _advance(self, h: np.ndarray) -> None:
        new = new_point_count(self._tail, self._seen_size, h)
        if new and self._pending is not None:
            self._bank.update([0], h[h.size - new], self._pending)
        if new != 0:
            # A new slot (or a history that does not line up): the forecast of the
            # next slot is made afresh below.
            self._pending = None
        self._tail, self._seen_size = h[-8:].copy(), h.size

    def predict(self, history, quantile: float | None = None) -> IntervalForecast:
        """Point forecast of the next slot and its ``quantile`` (default: the
        wrapper's ``quantile``) bound."""
        h = v.series(history, "history")
        q = self.quantile if quantile is None else float(check_quantile(quantile))
        self._advance(h)
        if self._pending is None:
            base_fc = self.base.predict(h, 1) if hasattr(self.base, "predict") else None
            values = base_fc.values if base_fc is not None else self.base.forecast(h, 1)
            self._pending = float(np.asarray(values, dtype=float)[0])
            self._method = getattr(base_fc, "method", type(self.base).__name__)
        point = self._pending
        n = int(self._bank.count([0])[0])
        reason = None
        if n >= self._bank.min_scores:
            offset = self._bank.offset([0], q)
        else:
            own = self._bank.scores(0)
            naive = np.diff(h)[::-1][: self._bank.window - n]
            pool = np.concatenate([own, naive])
            offset = np.array([conformal_offset(pool, q) if pool.size else np.nan])
            reason = (
                f"{n} own one-step errors, fewer than {self._bank.min_scores}: "
                f"{naive.size} last-value errors of the history added"
            )
            if not pool.size:
                reason = "no one-step error yet: the bound is the point forecast"
        bound = float(quantile_bound(point, offset, q)[0])
        self.last = IntervalForecast(point, bound, q, self._method, n, reason)
        return self.last

    def forecast(self, history, horizon: int = 1) -> np.ndarray:
        """The base's point forecast (also advances the error record)."""
        if horizon == 1:
            return np.array([self.predict(history).value])
        return self.base.forecast(history, horizon)

    def upper(self, history, quantile: float | None = None) -> float:
        """The ``quantile`` (>= 0.5) of next slot's value, never below the forecast."""
        q = self.quantile if quantile is None else float(check_quantile(quantile))
        if q < 0.5:
            raise ValueError(f"quantile of an upper bound must be >= 0.5, got {q}")
        return self.predict(history, q).bound

    def interval(self, history, coverage: float = 0.9) -> tuple[float, float]:
        """Central ``coverage`` interval of next slot's value."""
        c = float(check_quantile(coverage, "coverage"))
        lo = self.predict(history, (1.0 - c) / 2.0).bound
        return lo, self.predict(history, (1.0 + c) / 2.0).bound


# --------------------------------------------------------------------------- replay


def conformal_replay(
    points,
    actuals,
    quantile: float = 0.9,
    window: int = 200,
    *,
    adaptive: bool = True,
    gamma: float = 0.01,
    floor: float | None = 0.0,
) -> np.ndarray:
    """The online bounds a :class:`ConformalBank` issues along whole series.

    ``points[i, t]`` is series i's forecast of slot t made before seeing it and
    ``actuals[i, t]`` what arrived (1-D arrays: one series). The bound for slot t
    uses the scores of slots before t only; the first slot has none, so its bound is
    the point forecast. Returns the bounds, same shape as ``points``.
    """
    p = np.asarray(points, dtype=float)
    y = np.asarray(actuals, dtype=float)
    if p.shape != y.shape or p.ndim not in (1, 2):
        raise ValueError(
            f"points and actuals must have the same 1-D or 2-D shape: {p.shape}, {y.shape}"
        )
    if not (np.all(np.isfinite(p)) and np.all(np.isfinite(y))):
        raise ValueError("points and actuals must be finite")
    single = p.ndim == 1
    p2, y2 = (p[None, :], y[None, :]) if single else (p, y)
    q = float(check_quantile(quantile))
    bank = ConformalBank(window, [q], adaptive=adaptive, gamma=gamma, min_scores=1)
    keys = list(range(p2.shape[0]))
    out = np.empty_like(p2)
    for t in range(p2.shape[1]):
        out[:, t] = bank.bound(keys, p2[:, t], q, floor)
        bank.update(keys, y2[:, t], p2[:, t])
    return out[0] if single else out


def coverage(bounds, actuals, quantile: float) -> float:
    """Share of outcomes on the covered side of ``bounds``: at or below an upper
    quantile (``quantile >= 0.5``), at or above a lower one."""
    b, y = np.asarray(bounds, dtype=float), np.asarray(actuals, dtype=float)
    q = float(check_quantile(quantile))
    return float(np.mean(y <= b) if q >= 0.5 else np.mean(y >= b))
