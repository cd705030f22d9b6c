"""Each operator's arrival and service variability (squared coefficients of
variation, C²) measured from the slot counters, for the latency model.

The G/G/M waits of the demand stage ("QoS-aware CPU cap adjustment for timely
data-flow", the queueing model of the MPC controller) grow with
``(c_a² + c_s²) / 2``. Fixed at 1 (Poisson arrivals, exponential service) they
overstate waits of smooth streams several times over and understate bursty
ones; the slots already hold what is needed to measure both.

Arrivals. For a renewal process the index of dispersion of counts over a window
of length T, Var(N) / E(N), tends to c_a² (the limit QNA uses; for a Poisson
stream it is exactly 1 at every T). A slot's count N_t is such a count. But the
counts of consecutive slots also move with the load itself -- trends, daily
shapes, the level steps of a load -- and that is not burstiness within a slot:
the forecast and its quantile already size for it. So the level is removed
with second differences, D_t = N_t - 2 N_{t-1} + N_{t-2}, which cancel any
linear trend; for independent counts E[D_t²] = c_a² (E N_t + 4 E N_{t-1} +
E N_{t-2}), so each triple gives r_t = D_t² / (N_t + 4 N_{t-1} + N_{t-2}).
A level step still lands in two triples; they are outliers of r, dropped with
their neighbours when above ``TRIM`` times the estimate, which is found by
iterating from the untrimmed one. The estimate is the ratio of the kept sums,
which stays unbiased at small counts where a median would not.

Service. A slot's mean service time s_t = service_seconds / n_t over n_t
executions has variance σ² / n_t, so with second differences again
E[(s_t - 2 s_{t-1} + s_{t-2})²] = σ² (1/n_t + 4/n_{t-1} + 1/n_{t-2}): the level
(cost drifting with caches, interference, input) cancels and σ² remains;
c_s² = σ² / s̄², with s̄ the window's mean service time.

Evidence. Each estimate needs ``min_slots`` triples whose slots all carry at
least ``min_tuples`` tuples (arrived, or executed for service) within the last
``slots`` slots; until then the configured ``arrival_scv`` / ``service_scv``
stay and the record says why. Estimates are clipped to ``[scv_min, scv_max]``:
below, the models' deterministic limits are out of their range of accuracy;
above, a few slots of a transient would dominate.

The slots come from :class:`VariabilityMemory`, which keeps the last ``slots``
slot totals of every operator (the views hold only phi of them, too few for a
variance); :func:`measure_variability` reads it and the views and changes
nothing, the memory takes the views' newest slots after the epoch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import chain, repeat
from typing import NamedTuple

import numpy as np

from controller.stages.evaluate import OperatorView
from dsched.ids import OperatorKey
from predict.cost import marginal_cost_many

#: Triples above this many times the estimate are level changes, not burstiness
#: (for normal counts 0.16 % of triples lie above it, carrying ~2 % of the sum).
TRIM = 10.0
#: New slots after which an operator's estimate is recomputed.
REFRESH_SLOTS = 6
#: Passes of the trimming (each cuts against the last estimate), and the range
#: of its start (see :func:`_trimmed_ratio`).
PASSES = 8
START = (0.25, 1.0)
#: Median of χ² with one degree of freedom: the median of D² / Var(D) for normal D.
CHI2_1_MEDIAN = 0.454936

SOURCE_MEASURED = "measured"
SOURCE_FIXED = "fixed: configured"
SOURCE_FEW = "fixed: not enough evidence"


class OperatorVariability(NamedTuple):
    arrival_scv: float
    service_scv: float
    arrival_source: str  # "measured", "fixed: configured" or "fixed: not enough evidence"
    service_source: str
    slots: int  # triples of slots behind the arrival estimate


@dataclass(frozen=True)
class VariabilitySettings:
    mode: str = "measured"  # or "fixed"
    arrival_scv: float = 1.0  # used while fixed
    service_scv: float = 1.0
    slots: int = 60
    min_slots: int = 10
    min_tuples: float = 10.0
    scv_min: float = 0.05
    scv_max: float = 4.0


@dataclass
class VariabilityMemory:
    """The last ``slots`` slot totals of every operator: tuples arrived, executed,
    service seconds, CPU seconds, and the end of the newest slot taken (a row per
    operator);
    and each operator's last estimates with the slots taken since.

    An estimate over 60 slots moves little with one more, and at thousands of
    operators recomputing all of them every epoch costs tens of milliseconds: an
    operator's estimate is recomputed every ``REFRESH_SLOTS`` new slots (every
    epoch while it is still gathering evidence), staggered by row.
    """

    slots: int = 60
    rows: dict[OperatorKey, int] = field(default_factory=dict)
    arrived: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    executed: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    service: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    cpu: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    seen: np.ndarray = field(default_factory=lambda: np.zeros(0))
    #: Per row: c_a², c_s², arrival and service triples of the last estimate (NaN: none).
    estimates: np.ndarray = field(default_factory=lambda: np.zeros((0, 4)))
    #: Per row: new slots since that estimate.
    age: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=int))
    # The last window and estimates worked out for a views mapping (identity), so
    # that observe() takes them instead of working them out again: a cache.
    _last: tuple | None = field(default=None, repr=False, compare=False)

    def window(
        self, views: Mapping[OperatorKey, OperatorView], slots: int | None = None
    ) -> tuple[np.ndarray, ...]:
        """(arrived, executed, service, cpu) per view (rows in ``views`` order) over
        the last ``slots`` slots (default: the memory's), the views' newest slot
        included, oldest first; NaN where there was no slot."""
        return self._window(views, self.slots if slots is None else slots)[0]

    def _window(self, views: Mapping[OperatorKey, OperatorView], depth: int) -> tuple:
        """(the four arrays, whether each row took a new slot, the row each view
        had in the memory or -1)."""
        last = self._last
        if last is not None and last[0] is views and last[1] == depth:
            return last[2]
        keys = list(views)
        n = len(keys)
        out = [np.full((n, depth), np.nan) for _ in range(_COLUMNS)]
        if not n:
            return tuple(out), np.zeros(0, dtype=bool), np.zeros(0, dtype=int)
        newest = np.fromiter(
            chain.from_iterable(map(_newest, views.values())), float, (_COLUMNS + 1) * n
        )
        newest = newest.reshape(n, _COLUMNS + 1)
        rows = self.rows
        have = np.fromiter(map(rows.get, keys, repeat(-1)), int, n)
        known = (have >= 0) & (self.arrived.shape[1:] == (depth,))
        have = np.where(known, have, -1)
        prev = self.seen[np.maximum(have, 0)] if len(self.seen) else np.full(n, -np.inf)
        fresh = newest[:, _COLUMNS] > np.where(known, prev, -np.inf)
        stored = (self.arrived, self.executed, self.service, self.cpu)
        if n == len(self.seen) and fresh.all() and (have == np.arange(n)).all():
            # The usual epoch: the same operators, in the same order, each with a
            # new slot: every stored row moves on by one.
            for col, (arr, mine) in enumerate(zip(out, stored, strict=True)):
                arr[:, :-1] = mine[:, 1:]
                arr[:, -1] = newest[:, col]
            result = (tuple(out), fresh, have)
            self._last = (views, depth, result, None)
            return result
        for col, (arr, mine) in enumerate(zip(out, stored, strict=True)):
            if known.any():
                # The newest slot already taken: the stored window as it is.
                arr[known] = mine[have[known]]
                # A new slot: the stored window shifted by one, the new slot last.
                shift = known & fresh
                arr[shift, :-1] = mine[have[shift], 1:]
                arr[shift, -1] = newest[shift, col]
            arr[~known, -1] = newest[~known, col]
        result = (tuple(out), fresh, have)
        self._last = (views, depth, result, None)
        return result

    def estimate(
        self, views: Mapping[OperatorKey, OperatorView], settings: VariabilitySettings
    ) -> tuple[np.ndarray, np.ndarray]:
        """(estimates per view: c_a², c_s², arrival and service triples; their age in
        new slots), recomputing only the rows due. Changes nothing but the cache."""
        depth = settings.slots
        last = self._last
        if last is not None and last[0] is views and last[1] == depth and last[3] is not None:
            return last[3]
        (arrived, executed, service, cpu), fresh, have = self._window(views, depth)
        n = len(have)
        prev = np.full((n, 4), np.nan)
        age = np.zeros(n, dtype=int)
        old = have >= 0
        if old.any() and len(self.estimates) == len(self.seen):
            prev[old] = self.estimates[have[old]]
            age[old] = self.age[have[old]] + fresh[old]
        gathering = ~(
            (np.nan_to_num(prev[:, 2]) >= settings.min_slots)
            & (np.nan_to_num(prev[:, 3]) >= settings.min_slots)
        )
        # Rows still gathering are worth a look only once their window can hold
        # the triples the evidence needs.
        filled = np.isfinite(arrived).sum(axis=1) if n else np.zeros(0, dtype=int)
        due = np.flatnonzero(
            (gathering & (filled >= settings.min_slots + 2)) | (age >= REFRESH_SLOTS)
        )
        if len(due):
            got = estimate_scv(
                arrived[due], executed[due], service[due], settings.min_tuples, settings.min_slots
            )
            prev[due] = np.column_stack(got)
            # Staggered: rows computed together come due on different epochs.
            age[due] = due % REFRESH_SLOTS
        out = (prev, age)
        self._last = (views, depth, ((arrived, executed, service, cpu), fresh, have), out)
        return out

    def observe(self, views: Mapping[OperatorKey, OperatorView], slots: int | None = None) -> None:
        """Take the views' newest slots (and the estimates worked out for them);
        forget operators no longer in the views. ``slots`` changes how many are kept."""
        if slots is not None:
            self.slots = slots
        last = self._last
        (arrived, executed, service, cpu), _, _ = self._window(views, self.slots)
        ests = last[3] if last is not None and last[0] is views and last[1] == self.slots else None
        self.rows = {k: i for i, k in enumerate(views)}
        self.arrived, self.executed, self.service, self.cpu = arrived, executed, service, cpu
        self.seen = np.array([v.last_timestamp for v in views.values()], dtype=float)
        if ests is None:
            self.estimates = np.full((len(views), 4), np.nan)
            self.age = np.zeros(len(views), dtype=int)
        else:
            self.estimates, self.age = ests
        self._last = None


#: Slot totals the memory keeps per operator: arrived, executed, service, CPU.
_COLUMNS = 4


def _newest(view: OperatorView) -> tuple[float, float, float, float, float]:
    """(arrived, executed, service seconds, CPU seconds, end) of the view's newest slot."""
    try:
        secs = view.seconds[-1]
        return (
            view.arrivals[-1] * secs,
            view.executed[-1] * secs,
            view.service_seconds[-1] if len(view.service_seconds) else np.nan,
            view.cpu_seconds[-1],
            view.last_timestamp,
        )
    except IndexError:
        return (np.nan, np.nan, np.nan, np.nan, view.last_timestamp)


def _second_differences(x: np.ndarray) -> np.ndarray:
    return x[:, 2:] - 2.0 * x[:, 1:-1] + x[:, :-2]


def _trimmed_ratio(
    d2: np.ndarray, var: np.ndarray, ok: np.ndarray, min_triples: int = 1
) -> np.ndarray:
    """Per row: sum of d2 over sum of var across the kept triples (``ok`` and not a
    level change); NaN where no triple is kept, or where fewer than
    ``min_triples`` are ``ok`` (those rows are not worked on).

    The cut is ``TRIM`` times the estimate itself, found by iterating: each pass
    cuts what lies far above the last estimate. Started from above, level
    changes could hold it up (a cut of 10 x an inflated estimate keeps them);
    started from below it climbs to the level-free value (for normal counts the
    kept share of the sum at a cut of c times the value is P(χ²₃ <= c), whose
    fixed point is 0.98), so the start is the median of r over the median of
    χ²₁ held within ``START``: not above the Poisson value, and not at 0, where
    the median of small counts often is and a cut would keep nothing.
    Bursty streams climb past 1 in a few passes."""
    out = np.full(len(d2), np.nan)
    count = ok.sum(axis=1)
    rows = np.flatnonzero(count >= max(1, min_triples))
    if not len(rows):
        return out
    d2, var, ok, count = d2[rows], var[rows], ok[rows], count[rows]
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.where(ok, d2 / np.where(ok, var, 1.0), np.inf)
        # The median of the ok values: they sort before the infs.
        ranked = np.sort(r, axis=1)
        at = np.arange(len(r))
        median = (ranked[at, (count - 1) // 2] + ranked[at, count // 2]) / 2
        est = np.clip(median / CHI2_1_MEDIAN, START[0], START[1])
        for left in range(PASSES - 1, -1, -1):
            if left == 0:
                est = _final_pass(r, d2, var, ok, est)
                break
            new = _pooled(ok & (r <= TRIM * np.nan_to_num(est, nan=np.inf)[:, None]), d2, var)
            settled = np.allclose(new, est, rtol=1e-3, atol=0.0, equal_nan=True)
            est = new
            if settled:
                # The cut no longer moves: one last pass with the neighbours.
                est = _final_pass(r, d2, var, ok, est)
                break
    out[rows] = est
    return out


def _pooled(keep: np.ndarray, d2: np.ndarray, var: np.ndarray) -> np.ndarray:
    """Per row: the kept squared second differences over their expected variance."""
    top = np.where(keep, d2, 0.0).sum(axis=1)
    bottom = np.where(keep, var, 0.0).sum(axis=1)
    return np.where(bottom > 0, top / bottom, np.nan)


def _final_pass(r, d2, var, ok, est) -> np.ndarray:
    # A level step lands in two neighbouring triples (+J, then -J); noise can
    # leave one of them under the cut, so at the settled estimate a cut triple
    # takes its neighbours along. Not while climbing: from a low start that
    # would cut most large values.
    cut = ok & ~(r <= TRIM * np.nan_to_num(est, nan=np.inf)[:, None])
    flagged = cut.copy()
    cut[:, 1:] |= flagged[:, :-1]
    cut[:, :-1] |= flagged[:, 1:]
    return _pooled(ok & ~cut, d2, var)


def estimate_scv(
    arrived: np.ndarray,
    executed: np.ndarray,
    service: np.ndarray,
    min_tuples: float,
    min_triples: int = 1,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(c_a², c_s², arrival triples, service triples) per row of per-slot totals
    (operators x slots, oldest first, NaN for a missing slot); NaN where no triple
    carries enough tuples or fewer than ``min_triples`` do (those rows are skipped).
    Unclipped: :func:`measure_variability` applies bounds."""
    arrived = np.asarray(arrived, dtype=float)
    executed = np.asarray(executed, dtype=float)
    service = np.asarray(service, dtype=float)
    if arrived.shape[1] < 3:
        nan = np.full(arrived.shape[0], np.nan)
        zero = np.zeros(arrived.shape[0], dtype=int)
        return nan, nan.copy(), zero, zero.copy()
    # Arrivals: D² against (N_t + 4 N_{t-1} + N_{t-2}).
    a_ok_slot = np.isfinite(arrived) & (arrived >= min_tuples) & (arrived > 0)
    a_ok = a_ok_slot[:, 2:] & a_ok_slot[:, 1:-1] & a_ok_slot[:, :-2]
    a_var = arrived[:, 2:] + 4.0 * arrived[:, 1:-1] + arrived[:, :-2]
    a_d2 = np.nan_to_num(_second_differences(arrived)) ** 2
    ca2 = _trimmed_ratio(a_d2, np.nan_to_num(a_var), a_ok, min_triples)
    # Service: mean service time per slot, D² against σ² (1/n_t + 4/n_{t-1} + 1/n_{t-2}).
    s_ok_slot = (
        np.isfinite(executed)
        & np.isfinite(service)
        & (executed >= min_tuples)
        & (executed > 0)
        & (service > 0)
    )
    s_ok = s_ok_slot[:, 2:] & s_ok_slot[:, 1:-1] & s_ok_slot[:, :-2]
    with np.errstate(divide="ignore", invalid="ignore"):
        mean_s = np.where(s_ok_slot, service / np.where(s_ok_slot, executed, 1.0), 0.0)
        inv = np.where(s_ok_slot, 1.0 / np.where(s_ok_slot, executed, 1.0), 0.0)
        total_n = np.where(s_ok_slot, executed, 0.0).sum(axis=1)
        overall = np.where(total_n > 0, np.where(s_ok_slot, service, 0.0).sum(axis=1) / total_n, 0)
        w = inv[:, 2:] + 4.0 * inv[:, 1:-1] + inv[:, :-2]
        d2 = _second_differences(mean_s) ** 2
        sigma2 = _trimmed_ratio(d2, w, s_ok, min_triples)
        cs2 = np.where(overall > 0, sigma2 / overall**2, np.nan)
    return ca2, cs2, a_ok.sum(axis=1), s_ok.sum(axis=1)


@dataclass
class Variability:
    """Per operator: the C² the latency model uses, and where they come from."""

    by_operator: dict[OperatorKey, OperatorVariability]

    def arrival(self) -> dict[OperatorKey, float]:
        return {k: v.arrival_scv for k, v in self.by_operator.items()}

    def service(self) -> dict[OperatorKey, float]:
        return {k: v.service_scv for k, v in self.by_operator.items()}


def measure_variability(
    views: Mapping[OperatorKey, OperatorView],
    memory: VariabilityMemory | None,
    settings: VariabilitySettings,
) -> Variability:
    """Every operator's (c_a², c_s²) and their sources. ``memory`` is read; only
    its cache of what was worked out for ``views`` changes (observe takes it)."""
    keys = list(views)
    fixed_a, fixed_s = float(settings.arrival_scv), float(settings.service_scv)
    if settings.mode != "measured" or not keys:
        row = OperatorVariability(fixed_a, fixed_s, SOURCE_FIXED, SOURCE_FIXED, 0)
        return Variability(dict.fromkeys(keys, row))
    mem = memory if memory is not None else VariabilityMemory(settings.slots)
    est, _ = mem.estimate(views, settings)
    ca2, cs2, na, ns = est[:, 0], est[:, 1], np.nan_to_num(est[:, 2]), np.nan_to_num(est[:, 3])
    lo, hi = settings.scv_min, settings.scv_max
    enough_a = (na >= settings.min_slots) & np.isfinite(ca2)
    enough_s = (ns >= settings.min_slots) & np.isfinite(cs2)
    a = np.where(enough_a, np.clip(np.nan_to_num(ca2), lo, hi), fixed_a).tolist()
    s = np.where(enough_s, np.clip(np.nan_to_num(cs2), lo, hi), fixed_s).tolist()
    src_a = [SOURCE_MEASURED if e else SOURCE_FEW for e in enough_a.tolist()]
    src_s = [SOURCE_MEASURED if e else SOURCE_FEW for e in enough_s.tolist()]
    return Variability(
        {
            k: OperatorVariability(a[i], s[i], src_a[i], src_s[i], int(na[i]))
            for i, k in enumerate(keys)
        }
    )


def marginal_costs(
    views: Mapping[OperatorKey, OperatorView],
    memory: VariabilityMemory | None,
    slots: int,
    min_slots: int = 10,
) -> dict[OperatorKey, float]:
    """Each operator's CPU per extra tuple over its last ``slots`` slot totals
    (:func:`predict.cost.marginal_cost_many`); operators whose slots cannot tell
    it are left out. Reads the memory only."""
    if memory is None or not views:
        return {}
    _, executed, _, cpu = memory.window(views, slots)
    slope = marginal_cost_many(cpu, executed, min_slots=max(3, min_slots))
    return {k: float(b) for k, b in zip(views, slope.tolist(), strict=True) if math.isfinite(b)}
