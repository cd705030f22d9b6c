"""Task performance models and model-driven allocation (LSA and MBA).

A :class:`PerformanceModel` says, for a task running ``threads`` threads on one
resource slot, the peak stable input rate (tuples/s) and the CPU% and memory% of the
slot it uses there (100 = the whole slot). Values between profiled thread counts are
linearly interpolated.

:func:`profile_task` builds a model by sweeping threads and input rates: a trial is
stable when the slope of tuple latency over time after the warm-up stays under a
bound; the thread sweep stops when the slope of peak rates over the trailing window
of thread counts is flat or falling.

:func:`allocate_lsa` (linear scaling of one thread's profile) and
:func:`allocate_mba` (full bundles at the model's best thread count, then the
smallest thread count for the remainder) return threads, CPU% and memory% per task
and the slot count ``max(ceil(sum cpu / 100), ceil(sum mem / 100))``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from dsched import validate as v
from predict.load import propagate

FULL_SLOT_PERCENT = 100.0


@dataclass(frozen=True)
class PerfPoint:
    """What one profiled thread count achieved on one slot."""

    threads: int
    peak_rate: float
    cpu_percent: float
    memory_percent: float

    def __post_init__(self) -> None:
        v.positive_int(self.threads, "threads")
        v.non_negative(self.peak_rate, "peak_rate")
        v.non_negative(self.cpu_percent, "cpu_percent")
        v.non_negative(self.memory_percent, "memory_percent")


class PerformanceModel:
    """Threads -> (peak stable rate, CPU%, memory%) on one slot, interpolated."""

    def __init__(self, points: Iterable[PerfPoint]) -> None:
        pts = sorted(points, key=lambda p: p.threads)
        if not pts:
            raise ValueError("points: a performance model needs at least one profiled point")
        threads = [p.threads for p in pts]
        if len(set(threads)) != len(threads):
            raise ValueError(f"points: duplicate thread counts in {threads}")
        if pts[0].threads != 1:
            raise ValueError(
                "points: the profile must include 1 thread (LSA and MBA scale from it)"
            )
        if pts[0].peak_rate <= 0:
            raise ValueError("points: the peak rate with 1 thread must be > 0")
        self.points: tuple[PerfPoint, ...] = tuple(pts)
        self._x = np.array(threads, dtype=float)
        self._rate = np.array([p.peak_rate for p in pts])
        self._cpu = np.array([p.cpu_percent for p in pts])
        self._mem = np.array([p.memory_percent for p in pts])
        # Every whole thread count from 1 to the largest profiled one.
        self._grid = np.arange(1, pts[-1].threads + 1)
        self._grid_rate = np.interp(self._grid, self._x, self._rate)

    @classmethod
    def from_table(cls, rows: Iterable[tuple[int, float, float, float]]) -> PerformanceModel:
        """From (threads, peak_rate, cpu_percent, memory_percent) rows."""
        return cls(PerfPoint(int(t), float(r), float(c), float(m)) for t, r, c, m in rows)

    @property
    def max_threads(self) -> int:
        return int(self._grid[-1])

    def _check_threads(self, threads: int) -> int:
        t = v.positive_int(threads, "threads")
        if t > self.max_threads:
            raise ValueError(f"threads={t} is beyond the profiled range 1..{self.max_threads}")
        return t

    def peak_rate(self, threads: int) -> float:
        return float(np.interp(self._check_threads(threads), self._x, self._rate))

    def cpu_percent(self, threads: int) -> float:
        return float(np.interp(self._check_threads(threads), self._x, self._cpu))

    def memory_percent(self, threads: int) -> float:
        return float(np.interp(self._check_threads(threads), self._x, self._mem))

    @property
    def best(self) -> tuple[int, float]:
        """(fewest threads reaching the highest peak rate, that rate) on one slot."""
        i = int(np.argmax(self._grid_rate))
        return int(self._grid[i]), float(self._grid_rate[i])

    def threads_for_rate(self, rate: float) -> int:
        """Fewest threads whose peak rate on one slot is at least ``rate``."""
        r = v.non_negative(rate, "rate")
        ok = np.flatnonzero(self._grid_rate >= r)
        if ok.size == 0:
            raise ValueError(f"rate={r} exceeds the model's best single-slot rate {self.best[1]}")
        return int(self._grid[ok[0]])


# -------------------------------------------------------------------------- profiling


@dataclass(frozen=True)
class TrialResult:
    """Measurements of one profiling trial (a task at a fixed thread count and rate)."""

    cpu_percent: float
    memory_percent: float
    timestamps: np.ndarray  # seconds since the trial started, one per tuple
    latencies: np.ndarray  # seconds, one per tuple


def latency_slope(timestamps, latencies, warmup: float) -> float:
    """Least-squares slope of latency over time after ``warmup`` seconds."""
    t = v.series(timestamps, "timestamps")
    lat = v.series(latencies, "latencies")
    if t.size != lat.size:
        raise ValueError(f"timestamps and latencies differ in length: {t.size} vs {lat.size}")
    keep = t >= v.non_negative(warmup, "warmup")
    if keep.sum() < 2:
        raise ValueError(f"latencies: fewer than 2 samples after the {warmup}s warm-up")
    return float(np.polyfit(t[keep], lat[keep], 1)[0])


def is_stable(timestamps, latencies, warmup: float, max_slope: float = 0.001) -> bool:
    """A trial is stable when latency does not keep growing after the warm-up."""
    return latency_slope(timestamps, latencies, warmup) <= max_slope


def profile_task(
    run_trial: Callable[[int, float], TrialResult],
    *,
    max_threads: int,
    max_rate: float,
    rate_step: float,
    thread_step: int = 1,
    warmup: float = 0.0,
    max_latency_slope: float = 0.001,
    rate_slope_window: int = 3,
    min_rate_slope: float = 0.0,
) -> PerformanceModel:
    """Sweep threads and rates with ``run_trial(threads, rate)``; return the model.

    For each thread count the rate rises by ``rate_step`` until a trial is unstable or
    ``max_rate`` is reached; the last stable rate is the peak. Thread counts rise by
    ``thread_step`` until ``max_threads`` or until the slope of peak rates over the
    last ``rate_slope_window`` thread counts is <= ``min_rate_slope``.
    """
    max_threads = v.positive_int(max_threads, "max_threads")
    max_rate = v.positive(max_rate, "max_rate")
    rate_step = v.positive(rate_step, "rate_step")
    thread_step = v.positive_int(thread_step, "thread_step")
    window = v.positive_int(rate_slope_window, "rate_slope_window")
    points: list[PerfPoint] = []
    threads = 1
    while threads <= max_threads:
        peak: PerfPoint | None = None
        rate = rate_step
        while rate <= max_rate + 1e-12:
            trial = run_trial(threads, rate)
            if not is_stable(trial.timestamps, trial.latencies, warmup, max_latency_slope):
                break
            peak = PerfPoint(threads, rate, trial.cpu_percent, trial.memory_percent)
            rate += rate_step
        points.append(peak or PerfPoint(threads, 0.0, 0.0, 0.0))
        if len(points) >= max(window, 2):
            recent = points[-window:]
            rates = [p.peak_rate for p in recent]
            slope = np.polyfit([p.threads for p in recent], rates, 1)[0]
            # Tolerance for the rounding noise of a least-squares fit to a flat line.
            if slope <= min_rate_slope + 1e-9 * max(max(rates), 1.0):
                break
        threads += thread_step
    if points[0].peak_rate <= 0:
        raise ValueError(f"rate_step: even {rate_step}/s is unstable with 1 thread; lower it")
    return PerformanceModel(points)


# ------------------------------------------------------------------------- allocation


@dataclass(frozen=True)
class TaskAllocation:
    input_rate: float
    threads: int
    cpu_percent: float
    memory_percent: float


@dataclass(frozen=True)
class Allocation:
    tasks: dict[Hashable, TaskAllocation]
    slots: int

    @property
    def cpu_percent(self) -> float:
        return sum(t.cpu_percent for t in self.tasks.values())

    @property
    def memory_percent(self) -> float:
        return sum(t.memory_percent for t in self.tasks.values())


def task_rates(
    dag: Mapping[Hashable, Iterable[Hashable]], rate: float, selectivity: Mapping | None = None
) -> dict[Hashable, float]:
    """Input rate of every task when each source receives ``rate`` (GetRate)."""
    rate = v.non_negative(rate, "rate")
    parents = {n: False for n in dag}
    for children in dag.values():
        for c in children:
            parents[c] = True
    sources = {n: rate for n, has_parent in parents.items() if not has_parent}
    return propagate(dag, sources, selectivity or {})


def _lsa_task(rate: float, model: PerformanceModel) -> tuple[int, float, float]:
    per_thread = model.peak_rate(1)
    full = math.floor(rate / per_thread)
    rest = rate - full * per_thread
    threads = full + (1 if rest > 0 else 0)
    share = full + rest / per_thread
    return threads, model.cpu_percent(1) * share, model.memory_percent(1) * share


def _mba_task(rate: float, model: PerformanceModel) -> tuple[int, float, float]:
    bundle_threads, bundle_rate = model.best
    bundles = math.floor(rate / bundle_rate)
    rest = rate - bundles * bundle_rate
    # A full bundle saturates its slot: count the whole slot, not the measured usage.
    threads, cpu, mem = (
        bundles * bundle_threads,
        bundles * FULL_SLOT_PERCENT,
        bundles * FULL_SLOT_PERCENT,
    )
    if rest > 0:
        extra = model.threads_for_rate(rest)
        threads += extra
        if extra > 1:
            cpu += model.cpu_percent(extra)
            mem += model.memory_percent(extra)
        else:
            share = rest / model.peak_rate(1)
            cpu += model.cpu_percent(1) * share
            mem += model.memory_percent(1) * share
    return threads, cpu, mem


def _allocate(dag, rate, models, selectivity, per_task) -> Allocation:
    rates = task_rates(dag, rate, selectivity)
    missing = [str(t) for t in rates if t not in models]
    if missing:
        raise ValueError(f"models: no performance model for task(s) {missing}")
    tasks = {}
    for task, omega in rates.items():
        threads, cpu, mem = per_task(omega, models[task])
        tasks[task] = TaskAllocation(omega, threads, cpu, mem)
    total_cpu = sum(t.cpu_percent for t in tasks.values())
    total_mem = sum(t.memory_percent for t in tasks.values())
    # Round away float dust (e.g. 300.0000000001%) before taking the ceiling.
    slots = max(
        math.ceil(round(total_cpu / FULL_SLOT_PERCENT, 9)),
        math.ceil(round(total_mem / FULL_SLOT_PERCENT, 9)),
    )
    return Allocation(tasks, slots)


def allocate_lsa(
    dag: Mapping[Hashable, Iterable[Hashable]],
    rate: float,
    models: Mapping[Hashable, PerformanceModel],
    selectivity: Mapping | None = None,
) -> Allocation:
    """Linear Scaling Allocation: one thread's rate and usage, scaled linearly."""
    return _allocate(dag, rate, models, selectivity, _lsa_task)


def allocate_mba(
    dag: Mapping[Hashable, Iterable[Hashable]],
    rate: float,
    models: Mapping[Hashable, PerformanceModel],
    selectivity: Mapping | None = None,
) -> Allocation:
    """Model Based Allocation: full slot bundles at the best thread count, then the
    fewest threads that carry the remainder."""
    return _allocate(dag, rate, models, selectivity, _mba_task)


#: Allocation strategies by name.
ALLOCATORS = {"lsa": allocate_lsa, "mba": allocate_mba}
