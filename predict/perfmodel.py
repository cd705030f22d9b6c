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
:func:`mba_bundles` and :func:`split_bundles` give the slot bundles behind MBA's
figures (Slot-Aware Mapping places them whole).

:func:`map_dsm`, :func:`map_rsm` and :func:`map_sam` map an allocation's threads
onto slots grouped in VMs, as the paper's DSM, RSM and SAM do, and
:func:`predicted_rate` is the highest DAG input rate a mapping sustains by the
models. :meth:`PerformanceModel.from_table` refuses rows that are not in
strictly increasing thread order, naming the model's operator.
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
    """Threads -> (peak stable rate, CPU%, memory%) on one slot, interpolated.

    ``name`` (the operator the model is for) prefixes every error, so a bad
    model among many is found by its operator.
    """

    def __init__(self, points: Iterable[PerfPoint], name: str | None = None) -> None:
        self.name = name
        where = f"model of {name}: " if name is not None else ""
        pts = sorted(points, key=lambda p: p.threads)
        if not pts:
            raise ValueError(
                f"{where}points: a performance model needs at least one profiled point"
            )
        threads = [p.threads for p in pts]
        if len(set(threads)) != len(threads):
            raise ValueError(f"{where}points: duplicate thread counts in {threads}")
        if pts[0].threads != 1:
            raise ValueError(
                f"{where}points: the profile must include 1 thread (LSA and MBA scale from it)"
            )
        if pts[0].peak_rate <= 0:
            raise ValueError(f"{where}points: the peak rate with 1 thread must be > 0")
        self.points: tuple[PerfPoint, ...] = tuple(pts)
        self._x = np.array(threads, dtype=float)
        self._rate = np.array([p.peak_rate for p in pts])
        self._cpu = np.array([p.cpu_percent for p in pts])
        self._mem = np.array([p.memory_percent for p in pts])
        # Every whole thread count from 1 to the largest profiled one.
        self._grid = np.arange(1, pts[-1].threads + 1)
        self._grid_rate = np.interp(self._grid, self._x, self._rate)

    @classmethod
    def from_table(
        cls, rows: Iterable[tuple[int, float, float, float]], name: str | None = None
    ) -> PerformanceModel:
        """From (threads, peak_rate, cpu_percent, memory_percent) rows.

        Rows must come in strictly increasing thread order, as a profile sweep
        writes them: rows out of order or repeated mean a table that was
        corrupted or merged by mistake, so they are refused rather than sorted.
        """
        where = f"model of {name}: " if name is not None else ""
        points = []
        for k, row in enumerate(rows):
            try:
                t, r, c, m = row
                point = PerfPoint(int(t), float(r), float(c), float(m))
            except (TypeError, ValueError) as exc:
                raise ValueError(
                    f"{where}row {k} must be (threads, peak_rate, cpu%, memory%), "
                    f"got {row!r}: {exc}"
                ) from None
            if int(t) != t:
                raise ValueError(f"{where}row {k}: threads must be a whole number, got {t!r}")
            if points and point.threads == points[-1].threads:
                raise ValueError(f"{where}duplicate thread counts: row {k} repeats {point.threads}")
            if points and point.threads < points[-1].threads:
                raise ValueError(
                    f"{where}rows are not monotone in threads: row {k} has "
                    f"{point.threads} after {points[-1].threads}"
                )
            points.append(point)
        return cls(points, name=name)

    @property
    def max_threads(self) -> int:
        return int(self._grid[-1])

    @property
    def _where(self) -> str:
        return f"model of {self.name}: " if self.name is not None else ""

    def _check_threads(self, threads: int) -> int:
        t = v.positive_int(threads, "threads")
        if t > self.max_threads:
            raise ValueError(
                f"{self._where}threads={t} is beyond the profiled range 1..{self.max_threads}"
            )
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
            raise ValueError(
                f"{self._where}rate={r} exceeds the model's best single-slot rate {self.best[1]}"
            )
        return int(self._grid[ok[0]])

    def clamped(self, threads: int) -> tuple[float, float, float]:
        """(peak rate, CPU%, memory%) of ``threads`` threads on one slot, holding the
        last profiled values beyond the profiled range: the profiling sweep stops once
        the rate is flat or falling, so more threads are taken to gain nothing."""
        t = v.positive_int(threads, "threads")
        return (
            float(np.interp(t, self._x, self._rate)),
            float(np.interp(t, self._x, self._cpu)),
            float(np.interp(t, self._x, self._mem)),
        )


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


@dataclass(frozen=True)
class Bundle:
    """Threads of one task meant to share one slot, and what they use there.

    A full bundle is the model's best thread count carrying its best rate; it
    owns its slot, so its CPU% and memory% are the whole slot.
    """

    threads: int
    rate: float
    cpu_percent: float
    memory_percent: float
    full: bool


def mba_bundles(rate: float, model: PerformanceModel) -> list[Bundle]:
    """The bundles Model Based Allocation sizes for ``rate`` tuples/s: full bundles
    at the best thread count, then the fewest threads that carry the remainder
    ("Model-driven Scheduling for Distributed Stream Processing Systems", Alg. 3)."""
    rate = v.non_negative(rate, "rate")
    bundle_threads, bundle_rate = model.best
    full = math.floor(rate / bundle_rate)
    rest = rate - full * bundle_rate
    # A full bundle saturates its slot: count the whole slot, not the measured usage.
    bundles = [
        Bundle(bundle_threads, bundle_rate, FULL_SLOT_PERCENT, FULL_SLOT_PERCENT, True)
    ] * full
    if rest > 0:
        extra = model.threads_for_rate(rest)
        if extra > 1:
            cpu, mem = model.cpu_percent(extra), model.memory_percent(extra)
        else:
            share = rest / model.peak_rate(1)
            cpu, mem = model.cpu_percent(1) * share, model.memory_percent(1) * share
        bundles.append(Bundle(extra, rest, cpu, mem, False))
    return bundles


def split_bundles(threads: int, model: PerformanceModel, rate: float | None = None) -> list[Bundle]:
    """``threads`` threads of one task cut as Slot-Aware Mapping cuts them: full
    bundles of the model's best thread count, and the rest as one partial bundle.

    With the task's input ``rate`` the partial bundle is sized as MBA sized it
    (its share of the remainder; one thread scaled down to its load). Without
    it, the partial bundle is taken at its peak rate and usage, an upper bound.
    """
    threads = v.positive_int(threads, "threads")
    bundle_threads, bundle_rate = model.best
    full = threads // bundle_threads
    bundles = [
        Bundle(bundle_threads, bundle_rate, FULL_SLOT_PERCENT, FULL_SLOT_PERCENT, True)
    ] * full
    k = threads - full * bundle_threads
    if k:
        peak, cpu, mem = model.clamped(k)
        load = peak
        if rate is not None:
            load = min(peak, max(0.0, v.non_negative(rate, "rate") - full * bundle_rate))
            if k == 1:
                cpu, mem = cpu * load / peak, mem * load / peak
        bundles.append(Bundle(k, load, cpu, mem, False))
    return bundles


def _mba_task(rate: float, model: PerformanceModel) -> tuple[int, float, float]:
    bundles = mba_bundles(rate, model)
    return (
        sum(b.threads for b in bundles),
        sum(b.cpu_percent for b in bundles),
        sum(b.memory_percent for b in bundles),
    )


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


# ---------------------------------------------------------------------------- mapping
#
# Threads onto slots as "Model-driven Scheduling for Distributed Stream Processing
# Systems" (Shukla and Simmhan, §7) maps them: slots grouped into VMs, a slot being
# one core and its share of memory. The controller's placement strategies work on
# nodes and cores (controller.placement); these work on the paper's own terms so
# its experiments can be reproduced.


class InsufficientSlots(ValueError):
    """A mapping found no slot for some thread (the paper's "insufficient resources")."""


@dataclass(frozen=True)
class SlotMapping:
    """Threads per task on each slot; slot ``s`` is on VM ``s // slots_per_vm``."""

    slots: tuple[Mapping[Hashable, int], ...]
    slots_per_vm: int

    @property
    def used(self) -> int:
        """Slots holding at least one thread."""
        return sum(1 for slot in self.slots if slot)

    def vm(self, slot: int) -> int:
        return slot // self.slots_per_vm


def _check_layout(slots: int, slots_per_vm: int) -> tuple[int, int]:
    return v.positive_int(slots, "slots"), v.positive_int(slots_per_vm, "slots_per_vm")


def _thread_counts(order, threads) -> list[tuple[Hashable, int]]:
    missing = [str(t) for t in threads if t not in order]
    if missing:
        raise ValueError(f"order: task(s) {missing} have threads but no place in the order")
    return [(t, int(threads.get(t, 0))) for t in order if threads.get(t, 0)]


def map_dsm(
    order: Iterable[Hashable], threads: Mapping[Hashable, int], slots: int, slots_per_vm: int
) -> SlotMapping:
    """Default Storm Mapping (Alg. 4): threads round-robin over the slots."""
    slots, slots_per_vm = _check_layout(slots, slots_per_vm)
    out: list[dict[Hashable, int]] = [{} for _ in range(slots)]
    n = 0
    for task, count in _thread_counts(list(order), threads):
        for _ in range(count):
            slot = out[n % slots]
            slot[task] = slot.get(task, 0) + 1
            n += 1
    return SlotMapping(tuple(out), slots_per_vm)


def _models_for(tasks, models) -> None:
    missing = [str(t) for t in tasks if t not in models]
    if missing:
        raise ValueError(f"models: no performance model for task(s) {missing}")


def map_rsm(
    order: Iterable[Hashable],
    threads: Mapping[Hashable, int],
    models: Mapping[Hashable, PerformanceModel],
    slots: int,
    slots_per_vm: int,
    *,
    w_cpu: float = 1.0,
    w_mem: float = 1.0,
    w_net: float = 1.0,
    per_thread: Mapping[Hashable, tuple[float, float]] | None = None,
) -> SlotMapping:
    """R-Storm Mapping (Alg. 5): one thread of each task per sweep in topological
    order, to the VM nearest by ``w_mem (M_j - m)^2 + w_cpu (C_j - c)^2 + w_net
    NWDist`` (free memory and CPU of the VM and one thread's needs, in slots;
    NWDist 0 on the last VM used, 0.5 elsewhere: the paper's VMs share one rack)
    that has the CPU for the thread and a slot with its memory.

    A thread's needs are ``per_thread[task]`` (CPU%, memory%), by default the
    model's one-thread figures; an allocation's c_i / q_i and m_i / q_i are what
    the paper's experiments give it. CPU is pooled over a VM's slots, memory is
    per slot, as Storm's resource-aware scheduler accounts them. Raises
    :class:`InsufficientSlots`.
    """
    slots, slots_per_vm = _check_layout(slots, slots_per_vm)
    order = list(order)
    pending = dict(_thread_counts(order, threads))
    _models_for(pending, models)
    per_thread = per_thread or {}
    need = {}
    for task in pending:
        cpu, mem = per_thread.get(
            task, (models[task].cpu_percent(1), models[task].memory_percent(1))
        )
        need[task] = (
            v.non_negative(cpu, f"per_thread[{task!r}] CPU%") / FULL_SLOT_PERCENT,
            v.non_negative(mem, f"per_thread[{task!r}] memory%") / FULL_SLOT_PERCENT,
        )
    vms = math.ceil(slots / slots_per_vm)
    size = np.array([min(slots_per_vm, slots - j * slots_per_vm) for j in range(vms)], float)
    vm_cpu = size.copy()
    vm_mem = size.copy()
    slot_mem = np.ones(slots)
    out: list[dict[Hashable, int]] = [{} for _ in range(slots)]
    reference = 0
    while any(pending.values()):
        for task in order:
            if not pending.get(task):
                continue
            cpu, mem = need[task]
            net = np.full(vms, 0.5)
            net[reference] = 0.0
            distance = w_mem * (vm_mem - mem) ** 2 + w_cpu * (vm_cpu - cpu) ** 2 + w_net * net
            target = None
            for j in np.argsort(distance, kind="stable"):
                if vm_cpu[j] + 1e-9 < cpu:
                    continue
                first = int(j) * slots_per_vm
                room = np.flatnonzero(slot_mem[first : first + int(size[j])] + 1e-9 >= mem)
                if room.size:
                    target = first + int(room[0])
                    break
            if target is None:
                raise InsufficientSlots(f"no slot has room for a thread of task {task}")
            out[target][task] = out[target].get(task, 0) + 1
            j = target // slots_per_vm
            vm_cpu[j] -= cpu
            vm_mem[j] -= mem
            slot_mem[target] -= mem
            pending[task] -= 1
            reference = j
    return SlotMapping(tuple(out), slots_per_vm)


def map_sam(
    order: Iterable[Hashable],
    threads: Mapping[Hashable, int],
    models: Mapping[Hashable, PerformanceModel],
    slots: int,
    slots_per_vm: int,
    rates: Mapping[Hashable, float] | None = None,
) -> SlotMapping:
    """Slot-Aware Mapping (Alg. 6): per sweep in topological order, a task's next
    full bundle (:func:`split_bundles`) takes an empty slot of the last VM used or
    the next, alone; its partial bundle goes to the slot with the least free CPU
    plus memory that holds its c_i and m_i. ``rates`` (task input rates) size the
    partial bundles as MBA did. Raises :class:`InsufficientSlots`."""
    slots, slots_per_vm = _check_layout(slots, slots_per_vm)
    order = list(order)
    counts = dict(_thread_counts(order, threads))
    _models_for(counts, models)
    rates = rates or {}
    pending = {t: split_bundles(n, models[t], rates.get(t)) for t, n in counts.items()}
    free_cpu = np.full(slots, FULL_SLOT_PERCENT)
    free_mem = np.full(slots, FULL_SLOT_PERCENT)
    empty = np.ones(slots, dtype=bool)
    out: list[dict[Hashable, int]] = [{} for _ in range(slots)]
    current_vm = 0
    while any(pending.values()):
        for task in order:
            if not pending.get(task):
                continue
            bundle = pending[task].pop(0)
            if bundle.full:
                # Empty slots from the start of the current VM on, wrapping round.
                start = current_vm * slots_per_vm
                ring = np.roll(np.arange(slots), -start)
                found = ring[empty[ring]]
                if found.size == 0:
                    raise InsufficientSlots(f"no empty slot for a full bundle of task {task}")
                target = int(found[0])
            else:
                ok = np.flatnonzero(
                    (free_cpu + 1e-9 >= bundle.cpu_percent)
                    & (free_mem + 1e-9 >= bundle.memory_percent)
                )
                if ok.size == 0:
                    raise InsufficientSlots(f"no slot has room for the partial bundle of {task}")
                target = int(ok[np.argmin(free_cpu[ok] + free_mem[ok])])
            out[target][task] = out[target].get(task, 0) + bundle.threads
            free_cpu[target] -= bundle.cpu_percent
            free_mem[target] -= bundle.memory_percent
            empty[target] = False
            current_vm = target // slots_per_vm
    return SlotMapping(tuple(out), slots_per_vm)


#: Mappings by name.
MAPPERS = {"dsm": map_dsm, "rsm": map_rsm, "sam": map_sam}


@dataclass(frozen=True)
class RatePrediction:
    """The highest DAG input rate a mapping sustains by the models, and what binds it."""

    rate: float
    limit: str


def predicted_rate(
    mapping: SlotMapping,
    models: Mapping[Hashable, PerformanceModel],
    multipliers: Mapping[Hashable, float],
    routing: str = "shuffle",
) -> RatePrediction:
    """The highest DAG input rate at which no slot or VM exceeds its modelled capacity.

    ``multipliers`` are each task's input rate per unit of DAG input rate (task_rates
    at rate 1). With ``routing="shuffle"`` (Storm's shuffle grouping) every thread of
    a task receives an equal share of its input, so ``k`` of its ``q`` threads on a
    slot receive ``k/q`` of it; with ``"capacity"`` each slot's threads of a task
    receive in proportion to their modelled peak rate, the load-aware grouping the
    paper leaves to future work (§11). On a slot, ``k`` threads of a task carry at
    most the model's peak rate for ``k`` threads and use its CPU% and memory% scaled
    by their load over that peak (the model's own reading of partly loaded
    threads); memory is bounded per slot, CPU per VM. Every bound is linear in the
    DAG rate, so the answer is a minimum of ratios.
    """
    if routing not in ("shuffle", "capacity"):
        raise ValueError(f"routing must be 'shuffle' or 'capacity', got {routing!r}")
    totals: dict[Hashable, float] = {}
    for slot in mapping.slots:
        for task, k in slot.items():
            weight = k if routing == "shuffle" else models[task].clamped(k)[0]
            totals[task] = totals.get(task, 0.0) + weight
    _models_for(totals, models)
    best, limit = math.inf, "nothing"
    vm_cpu: dict[int, float] = {}
    vm_slots: dict[int, int] = {}
    for s, slot in enumerate(mapping.slots):
        vm = mapping.vm(s)
        vm_slots[vm] = vm_slots.get(vm, 0) + 1
        mem = 0.0
        for task, k in slot.items():
            peak, cpu, memory = models[task].clamped(k)
            weight = k if routing == "shuffle" else peak
            share = float(multipliers[task]) * weight / totals[task]
            if share <= 0:
                continue
            if peak / share < best:
                best, limit = peak / share, f"rate of {k} thread(s) of {task} on slot {s}"
            vm_cpu[vm] = vm_cpu.get(vm, 0.0) + cpu * share / peak
            mem += memory * share / peak
        if mem > 0 and FULL_SLOT_PERCENT / mem < best:
            best, limit = FULL_SLOT_PERCENT / mem, f"memory of slot {s}"
    for vm, cpu in vm_cpu.items():
        if cpu > 0 and FULL_SLOT_PERCENT * vm_slots[vm] / cpu < best:
            best, limit = FULL_SLOT_PERCENT * vm_slots[vm] / cpu, f"CPU of VM {vm}"
    return RatePrediction(best, limit)
