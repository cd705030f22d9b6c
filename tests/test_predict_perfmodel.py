"""Task performance models, the profiling sweep, and LSA / MBA allocation."""

from __future__ import annotations

import math

import numpy as np
import pytest

from predict.perfmodel import (
    ALLOCATORS,
    PerformanceModel,
    PerfPoint,
    TrialResult,
    allocate_lsa,
    allocate_mba,
    is_stable,
    latency_slope,
    profile_task,
    task_rates,
)

# Shaped like the seed's Azure Table model: 3 tuples/s with one thread, a peak of
# 40 tuples/s at 60 threads on one slot, falling beyond it.
TABLE = PerformanceModel.from_table(
    [(1, 3.0, 5.0, 10.0), (40, 20.0, 40.0, 50.0), (60, 40.0, 70.0, 80.0), (80, 35.0, 75.0, 90.0)]
)
# A CPU-bound task whose rate barely grows with threads.
PI = PerformanceModel.from_table(
    [(1, 100.0, 60.0, 5.0), (2, 120.0, 95.0, 8.0), (3, 110.0, 100.0, 10.0)]
)


def test_model_interpolates_between_profiled_thread_counts():
    assert TABLE.peak_rate(1) == 3.0
    assert TABLE.peak_rate(50) == pytest.approx(30.0)
    assert TABLE.cpu_percent(50) == pytest.approx(55.0)
    assert TABLE.best == (60, 40.0)
    assert TABLE.threads_for_rate(20.0) == 40
    assert TABLE.threads_for_rate(3.0) == 1
    assert PI.best == (2, 120.0)


def test_model_bad_input():
    with pytest.raises(ValueError, match="threads"):
        TABLE.peak_rate(81)
    with pytest.raises(ValueError, match="threads"):
        TABLE.peak_rate(0)
    with pytest.raises(ValueError, match="rate"):
        TABLE.threads_for_rate(41.0)
    with pytest.raises(ValueError, match="1 thread"):
        PerformanceModel.from_table([(2, 5.0, 1.0, 1.0)])
    with pytest.raises(ValueError, match="duplicate"):
        PerformanceModel.from_table([(1, 5.0, 1.0, 1.0), (1, 6.0, 1.0, 1.0)])
    with pytest.raises(ValueError, match="peak_rate"):
        PerfPoint(1, -1.0, 1.0, 1.0)
    with pytest.raises(ValueError, match="points"):
        PerformanceModel([])


def test_mba_on_the_seed_worked_example():
    # 100 tuples/s into Table: two full 60-thread bundles (40/s each) and the 20/s
    # remainder on the fewest threads that carry it (40) -- 160 threads.
    alloc = allocate_mba({"table": []}, 100.0, {"table": TABLE})
    t = alloc.tasks["table"]
    assert t.threads == 160
    assert t.cpu_percent == pytest.approx(200.0 + 40.0)
    assert t.memory_percent == pytest.approx(200.0 + 50.0)
    assert alloc.slots == 3


def test_lsa_on_the_seed_worked_example():
    # 50 tuples/s at 3/s per thread: 16 full threads and one carrying 2/s.
    alloc = allocate_lsa({"table": []}, 50.0, {"table": TABLE})
    t = alloc.tasks["table"]
    assert t.threads == 17
    assert t.cpu_percent == pytest.approx(5.0 * 50.0 / 3.0)
    assert t.memory_percent == pytest.approx(10.0 * 50.0 / 3.0)
    assert alloc.slots == math.ceil(10.0 * 50.0 / 3.0 / 100.0)


def test_single_thread_remainder_is_scaled_down():
    alloc = allocate_mba({"pi": []}, 50.0, {"pi": PI})
    assert alloc.tasks["pi"].threads == 1
    assert alloc.tasks["pi"].cpu_percent == pytest.approx(60.0 * 0.5)


DIAMOND = {"src": ["pi", "table"], "pi": ["sink"], "table": ["sink"], "sink": []}
SINK = PerformanceModel.from_table([(1, 1000.0, 10.0, 10.0)])


def test_allocations_on_a_diamond_dag():
    models = {"src": SINK, "pi": PI, "table": TABLE, "sink": SINK}
    rates = task_rates(DIAMOND, 100.0, selectivity={("src", "table"): 0.5})
    assert rates == {"src": 100.0, "pi": 100.0, "table": 50.0, "sink": 150.0}
    mba = allocate_mba(DIAMOND, 100.0, models, selectivity={("src", "table"): 0.5})
    lsa = allocate_lsa(DIAMOND, 100.0, models, selectivity={("src", "table"): 0.5})
    # table at 50/s: MBA = one 60-thread bundle + threads_for_rate(10).
    assert mba.tasks["table"].threads == 60 + TABLE.threads_for_rate(10.0)
    assert lsa.tasks["table"].threads == 17
    assert mba.tasks["pi"].threads == 1 and lsa.tasks["pi"].threads == 1
    assert mba.slots == max(math.ceil(mba.cpu_percent / 100), math.ceil(mba.memory_percent / 100))
    assert lsa.slots == max(math.ceil(lsa.cpu_percent / 100), math.ceil(lsa.memory_percent / 100))
    assert set(ALLOCATORS) == {"lsa", "mba"}


def test_allocation_bad_input():
    with pytest.raises(ValueError, match="no performance model"):
        allocate_mba(DIAMOND, 10.0, {"src": SINK})
    with pytest.raises(ValueError, match="rate"):
        allocate_lsa({"t": []}, -5.0, {"t": SINK})


def test_stability_from_latency_slope():
    t = np.linspace(0, 60, 600)
    flat = 0.05 + 0.001 * np.sin(t)
    growing = 0.05 + 0.01 * t
    assert is_stable(t, flat, warmup=10.0)
    assert not is_stable(t, growing, warmup=10.0)
    # A warm-up transient is ignored.
    transient = np.where(t < 10, 0.01 * t, 0.1)
    assert is_stable(t, transient, warmup=10.0)
    assert latency_slope(t, growing, 0.0) == pytest.approx(0.01)
    with pytest.raises(ValueError, match="warm-up"):
        latency_slope(t, flat, warmup=100.0)
    with pytest.raises(ValueError, match="latencies"):
        is_stable(t, flat[:-1], warmup=0.0)


def _queue_trial(capacity_by_threads: dict[int, float], duration: float = 30.0):
    """A trial of a task that serves ``capacity(threads)`` tuples/s: FIFO latencies of
    evenly spaced arrivals by the Lindley recursion."""

    def run(threads: int, rate: float) -> TrialResult:
        capacity = capacity_by_threads[threads]
        n = int(rate * duration)
        arrivals = np.arange(n) / rate
        service = 1.0 / capacity
        latency = np.empty(n)
        done = 0.0
        for i, a in enumerate(arrivals):
            done = max(done, a) + service
            latency[i] = done - a
        cpu = min(100.0, 100.0 * rate / capacity)
        return TrialResult(cpu, 10.0 + threads, arrivals, latency)

    return run


def test_profile_task_finds_peak_rates_and_stops_when_rates_flatten():
    capacity = {1: 10.5, 2: 20.5, 3: 30.5, 4: 30.5, 5: 30.5, 6: 25.5, 7: 25.0, 8: 25.0}
    calls = []
    trial = _queue_trial(capacity)

    def counting_trial(threads, rate):
        calls.append((threads, rate))
        return trial(threads, rate)

    model = profile_task(
        counting_trial, max_threads=8, max_rate=60.0, rate_step=5.0, warmup=2.0, rate_slope_window=3
    )
    assert [p.threads for p in model.points] == [1, 2, 3, 4, 5]
    assert [p.peak_rate for p in model.points] == [10.0, 20.0, 30.0, 30.0, 30.0]
    assert model.best == (3, 30.0)
    # Each thread count stops at the first unstable rate.
    assert (1, 15.0) in calls and (1, 20.0) not in calls
    assert max(t for t, _ in calls) == 5


def test_profile_task_bad_input():
    trial = _queue_trial({1: 0.5})
    with pytest.raises(ValueError, match="rate_step"):
        profile_task(trial, max_threads=1, max_rate=10.0, rate_step=5.0)
    with pytest.raises(ValueError, match="max_threads"):
        profile_task(trial, max_threads=0, max_rate=10.0, rate_step=5.0)


# ------------------------------------------------------------- bundles and mapping


def test_split_bundles_matches_mba_sizing():
    from predict.perfmodel import mba_bundles, split_bundles

    # Table at 100/s: two 60-thread bundles and 40 threads for the 20/s left.
    sized = mba_bundles(100.0, TABLE)
    assert [(b.threads, b.full) for b in sized] == [(60, True), (60, True), (40, False)]
    split = split_bundles(160, TABLE, rate=100.0)
    assert split == sized
    # Without the rate the partial bundle is taken at its peak usage.
    peak = split_bundles(160, TABLE)[-1]
    assert (peak.rate, peak.cpu_percent) == (20.0, 40.0)
    # One leftover thread is scaled to its load, as MBA scales it.
    one = split_bundles(3, PI, rate=170.0)[-1]
    assert one.threads == 1 and one.cpu_percent == pytest.approx(60.0 * 50.0 / 100.0)
    with pytest.raises(ValueError, match="threads"):
        split_bundles(0, PI)


def test_slot_mappings_on_a_small_dag():
    from predict.perfmodel import InsufficientSlots, map_dsm, map_rsm, map_sam

    order = ["pi", "table"]
    threads = {"pi": 3, "table": 70}
    dsm = map_dsm(order, threads, 4, 2)
    assert [sum(s.values()) for s in dsm.slots] == [19, 18, 18, 18]
    models = {"pi": PI, "table": TABLE}
    sam = map_sam(order, threads, models, 4, 2, rates={"pi": 170.0, "table": 45.0})
    # Full bundles alone: pi's 2 threads, table's 60; the leftovers share a slot.
    assert {"pi": 2} in sam.slots and {"table": 60} in sam.slots
    assert {"pi": 1, "table": 10} in sam.slots
    assert sam.used == 3
    # R-Storm extrapolates one thread (table: 10% memory each): 70 threads need 7 slots.
    with pytest.raises(InsufficientSlots, match="table"):
        map_rsm(order, threads, models, 4, 2)
    rsm = map_rsm(order, {"pi": 3, "table": 20}, models, 4, 2)
    assert sum(sum(s.values()) for s in rsm.slots) == 23
    # Memory is per slot: no slot holds more than 100% by the one-thread figures.
    assert all(10.0 * s.get("table", 0) + 5.0 * s.get("pi", 0) <= 100 for s in rsm.slots)
    with pytest.raises(InsufficientSlots, match="table"):
        map_sam(order, {"table": 180}, models, 2, 2)
    with pytest.raises(InsufficientSlots, match="pi"):
        map_rsm(order, {"pi": 3}, models, 1, 1)
    with pytest.raises(ValueError, match="no performance model"):
        map_sam(order, threads, {"pi": PI}, 4, 2)


def test_predicted_rate_by_hand():
    from predict.perfmodel import SlotMapping, predicted_rate

    # 2 pi threads on slot 0, 1 on slot 1; shuffle gives slot 0 two thirds of the input.
    mapping = SlotMapping(({"pi": 2}, {"pi": 1}), slots_per_vm=2)
    shuffle = predicted_rate(mapping, {"pi": PI}, {"pi": 1.0})
    # Slot 1: 1 thread carries 100/s and gets a third: 300/s. Slot 0: 120 / (2/3) = 180/s.
    # CPU of the VM: 95 * (2/3)/120 + 60 * (1/3)/100 per unit rate against 200%.
    cpu_bound = 200.0 / (95.0 * (2 / 3) / 120.0 + 60.0 * (1 / 3) / 100.0)
    assert shuffle.rate == pytest.approx(min(180.0, cpu_bound))
    capacity = predicted_rate(mapping, {"pi": PI}, {"pi": 1.0}, routing="capacity")
    assert capacity.rate == pytest.approx(220.0)
    assert "pi" in capacity.limit
    with pytest.raises(ValueError, match="routing"):
        predicted_rate(mapping, {"pi": PI}, {"pi": 1.0}, routing="random")


def test_clamped_holds_the_last_profiled_values():
    assert PI.clamped(2) == (120.0, 95.0, 8.0)
    assert PI.clamped(10) == PI.clamped(3)
