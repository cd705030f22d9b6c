"""Measured arrival and service C² (controller/stages/variability.py) and the
interference correction of CPU per tuple (controller/stages/interference.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from controller.core import Controller
from controller.stages.demand import instance_demands, latency_needs
from controller.stages.evaluate import OperatorView
from controller.stages.forecast import OperatorForecast
from controller.stages.interference import (
    OFF,
    UNAVAILABLE_COUNTER,
    UNAVAILABLE_PEAK,
    interference_factors,
)
from controller.stages.variability import (
    SOURCE_FEW,
    SOURCE_FIXED,
    SOURCE_MEASURED,
    VariabilityMemory,
    VariabilitySettings,
    estimate_scv,
    measure_variability,
)
from dsched.ids import InstanceKey, OperatorKey
from dsched_pb import dsched_pb2 as pb
from predict.interference import InterferenceModel
from tests.test_controller_epoch import SyntheticNode, config

SLOT = 10.0


def renewal_counts(rng, gaps, rate: float, slots: int, reps: int) -> np.ndarray:
    """Counts per slot of a renewal process with the given gap sampler (mean 1/rate)."""
    out = np.empty((reps, slots))
    for r in range(reps):
        t = np.cumsum(gaps(int(rate * SLOT * slots * 1.3) + 100))
        out[r] = np.histogram(t, bins=np.arange(slots + 1) * SLOT)[0]
    return out


def service_of(executed: np.ndarray) -> np.ndarray:
    return executed * 0.01


def test_poisson_counts_measure_about_one():
    rng = np.random.default_rng(1)
    counts = renewal_counts(rng, lambda n: rng.exponential(1 / 50, n), 50, 30, 200)
    ca2, _, triples, _ = estimate_scv(counts, counts, service_of(counts), 10)
    assert (triples == 28).all()
    assert ca2.mean() == pytest.approx(1.0, abs=0.08)


def test_weibull_shape_4_is_much_smoother_than_poisson():
    rng = np.random.default_rng(2)
    k = 4.0
    scale = 1 / 50 / math.gamma(1 + 1 / k)
    counts = renewal_counts(rng, lambda n: scale * rng.weibull(k, n), 50, 30, 200)
    ca2, _, _, _ = estimate_scv(counts, counts, service_of(counts), 10)
    true = math.gamma(1 + 2 / k) / math.gamma(1 + 1 / k) ** 2 - 1  # 0.079
    assert ca2.mean() == pytest.approx(true, abs=0.03)
    assert ca2.mean() < 0.2


def test_level_steps_and_trends_do_not_inflate_the_arrival_scv():
    rng = np.random.default_rng(3)
    # Poisson within each slot, at a level that steps (a trace) or grows by 5 % a slot.
    steps = np.repeat([500.0, 750.0, 375.0], 10)
    trend = 500.0 * (1 + 0.05 * np.arange(30))
    counts = rng.poisson(np.broadcast_to(trend, (200, 30))).astype(float)
    ca2, _, _, _ = estimate_scv(counts, counts, service_of(counts), 10)
    assert ca2.mean() == pytest.approx(1.0, abs=0.1)
    counts = rng.poisson(np.broadcast_to(steps, (200, 30))).astype(float)
    ca2, _, _, _ = estimate_scv(counts, counts, service_of(counts), 10)
    # Steps of +50 % and -50 % leave a little (noise can hide a step under the cut).
    assert 0.85 < ca2.mean() < 1.35
    # Without the level removal they alone would read as very bursty.
    naive = counts.var(axis=1) / counts.mean(axis=1)
    assert naive.mean() > 20


def test_service_scv_from_per_slot_mean_service_times():
    rng = np.random.default_rng(4)
    executed = rng.poisson(100, (200, 30)).astype(float)
    # Gamma service times, mean 20 ms, C² 0.25; the level drifts (interference).
    drift = 1 + 0.3 * np.arange(30) / 30
    service = np.array(
        [
            [rng.gamma(4.0, 0.005, int(n)).sum() * d for n, d in zip(row, drift, strict=True)]
            for row in executed
        ]
    )
    _, cs2, _, triples = estimate_scv(executed, executed, service, 10)
    assert (triples == 28).all()
    assert cs2.mean() == pytest.approx(0.25 * np.mean(drift**2) / np.mean(drift) ** 2, rel=0.1)


def view(key: OperatorKey, ts: float, arrived: float, executed: float, service: float, nodes=None):
    nodes = nodes or {InstanceKey(key.app, key.operator, 0): "n1"}
    inst = list(nodes)
    one = np.array([SLOT])
    return OperatorView(
        key=key,
        instances=inst,
        nodes=dict(nodes),
        stateful=False,
        upstream=(),
        seconds=one,
        arrivals=np.array([arrived / SLOT]),
        executed=np.array([executed / SLOT]),
        emitted=np.array([executed / SLOT]),
        cpu_seconds=np.array([service]),
        queue=np.zeros(1),
        queue_by_instance=dict.fromkeys(inst, 0.0),
        usage_by_instance=dict.fromkeys(inst, 0.5),
        cap_by_instance=dict.fromkeys(inst, None),
        throttled_by_instance=dict.fromkeys(inst, None),
        latency_ms=None,
        service_ms=None,
        last_timestamp=ts,
        service_seconds=np.array([service]),
    )


KEY = OperatorKey("a", "op")


def feed(counts, settings: VariabilitySettings, key=KEY):
    """One epoch per slot, as the controller runs them: measure, then learn."""
    memory = VariabilityMemory(settings.slots)
    out = None
    for t, n in enumerate(counts):
        views = {key: view(key, 1000.0 + t * SLOT, n, n, n * 0.01)}
        out = measure_variability(views, memory, settings)
        memory.observe(views, settings.slots)
    return out.by_operator[key]


def test_floor_of_evidence_keeps_the_configured_values():
    rng = np.random.default_rng(5)
    s = VariabilitySettings(arrival_scv=0.7, service_scv=0.9, min_slots=10, min_tuples=50)
    few = feed(rng.poisson(500, 8).astype(float), s)  # 6 triples
    assert (few.arrival_scv, few.service_scv) == (0.7, 0.9)
    assert few.arrival_source == few.service_source == SOURCE_FEW
    small = feed(rng.poisson(20, 30).astype(float), s)  # slots under min_tuples
    assert small.arrival_source == SOURCE_FEW and small.arrival_scv == 0.7
    enough = feed(rng.poisson(500, 30).astype(float), s)
    assert enough.arrival_source == SOURCE_MEASURED
    assert enough.slots == 28
    assert 0.3 < enough.arrival_scv < 2.0


def test_bounds_clip_measured_values_and_fixed_mode_ignores_the_slots():
    rng = np.random.default_rng(6)
    s = VariabilitySettings(scv_min=0.05, scv_max=4.0, min_tuples=10)
    # Identical counts: no variability at all, clipped up to the lower bound.
    assert feed(np.full(30, 400.0), s).arrival_scv == 0.05
    # Batches of 50: C² about 50, clipped down to the upper bound.
    batches = rng.poisson(10, 30).astype(float) * 50 + 10
    assert feed(batches, s).arrival_scv == 4.0
    fixed = feed(batches, VariabilitySettings(mode="fixed", arrival_scv=1.0))
    assert fixed.arrival_scv == 1.0 and fixed.arrival_source == SOURCE_FIXED


def test_the_memory_takes_one_slot_per_new_timestamp():
    key = OperatorKey("a", "op")
    memory = VariabilityMemory(5)
    views = {key: view(key, 1000.0, 100, 100, 1.0)}
    memory.observe(views)
    memory.observe(views)  # the same slot again: not taken twice
    arrived, _, _, cpu = memory.window({key: view(key, 1010.0, 200, 200, 2.0)})
    assert np.isnan(arrived[0, :3]).all()
    assert arrived[0, 3:].tolist() == [100.0, 200.0]
    assert cpu[0, 3:].tolist() == [1.0, 2.0]


def forecasts_for(keys, rate=100.0, kappa=0.004):
    return {k: OperatorForecast(k, rate, "linear_trend", {}, kappa) for k in keys}


def test_latency_needs_take_per_operator_scv():
    a, b = OperatorKey("a", "x"), OperatorKey("a", "y")
    views = {
        a: view(a, 1.0, 1000, 1000, 1.0),
        b: view(b, 1.0, 1000, 1000, 1.0, {InstanceKey("a", "y", 0): "n1"}),
    }
    fcs = forecasts_for(views)
    budgets = dict.fromkeys(views, 0.02)
    scalar = latency_needs(views, fcs, budgets, 1.0, 1.0)
    same = latency_needs(views, fcs, budgets, {a: 1.0, b: 1.0}, {a: 1.0, b: 1.0})
    assert same == pytest.approx(scalar)
    mixed = latency_needs(views, fcs, budgets, {a: 0.1, b: 1.0}, {a: 0.1, b: 1.0})
    assert mixed[a] < scalar[a]
    assert mixed[b] == pytest.approx(scalar[b])


# ------------------------------------------------------------------ interference

MODEL = InterferenceModel(threshold=0.5, slope=2.0)
PEAK = 20e9


def two_node_views():
    key = OperatorKey("gold", "work")
    nodes = {InstanceKey("gold", "work", 0): "hot", InstanceKey("gold", "work", 1): "cool"}
    return {key: view(key, 1.0, 1000, 1000, 10.0, nodes)}, list(nodes)


def test_saturated_node_gets_its_share_of_the_cost():
    views, (hot, cool) = two_node_views()
    # hot at 80 % of its bandwidth: slowdown 1.6; cool at 10 %: none.
    got = interference_factors(views, {"hot": 0.8 * PEAK, "cool": 0.1 * PEAK}, PEAK, MODEL)
    assert got.factors[hot] == pytest.approx(1.6 / 1.3)
    assert got.factors[cool] == pytest.approx(1.0 / 1.3)
    # The measured mean cost is kept: nothing is counted twice.
    assert (got.factors[hot] + got.factors[cool]) / 2 == pytest.approx(1.0)
    assert got.nodes["hot"] == "applied 1.600"
    assert got.nodes["cool"].startswith("applied 1.000")
    fc = forecasts_for(views, rate=100.0, kappa=0.004)
    plain = instance_demands(views, fc, None, 1.0, 10.0, 0.01)
    corrected = instance_demands(views, fc, None, 1.0, 10.0, 0.01, kappa_factor=got.factors)
    assert corrected[hot].cores == pytest.approx(plain[hot].cores * 1.6 / 1.3)
    assert corrected[cool].cores == pytest.approx(plain[cool].cores / 1.3)


def test_no_counter_or_no_peak_is_unavailable_and_nothing_is_invented():
    views, _ = two_node_views()
    got = interference_factors(views, {"hot": 0.9 * PEAK, "cool": None}, PEAK, MODEL)
    assert got.nodes["cool"] == UNAVAILABLE_COUNTER
    assert got.factors == {}  # the operator's mean would need cool's slowdown
    got = interference_factors(views, {}, PEAK, MODEL)
    assert got.nodes == {"hot": UNAVAILABLE_COUNTER, "cool": UNAVAILABLE_COUNTER}
    got = interference_factors(views, {"hot": 0.9 * PEAK, "cool": 0.1 * PEAK}, 0.0, MODEL)
    assert set(got.nodes.values()) == {UNAVAILABLE_PEAK} and got.factors == {}
    got = interference_factors(
        views, {"hot": 0.9 * PEAK, "cool": 0.1 * PEAK}, PEAK, MODEL, enabled=False
    )
    assert set(got.nodes.values()) == {OFF} and got.factors == {}
    fc = forecasts_for(views)
    assert instance_demands(views, fc, None, 1.0, 10.0, 0.01, kappa_factor={}) == (
        instance_demands(views, fc, None, 1.0, 10.0, 0.01)
    )


# ------------------------------------------------------------------ the record


def test_record_shows_scv_sources_and_interference(tmp_path):
    clock = [1_000_000.0]
    c = Controller(
        config(tmp_path, memory_bandwidth_peak_bytes_per_second=PEAK), clock=lambda: clock[0]
    )
    node = SyntheticNode(c)
    rec = None
    for _ in range(4):
        clock[0] += 1.0
        node.report(clock[0], {"wc": 200.0})
        rec = c.run_epoch()
    ops = rec["sizing"]["operators"]
    assert {o["arrival_scv_source"] for o in ops} == {SOURCE_FEW}
    assert {o["arrival_scv"] for o in ops} == {1.0}
    # The synthetic agent reports no bandwidth counter.
    assert rec["sizing"]["interference"]["n1"]["state"] == UNAVAILABLE_COUNTER
    # Once it does (resctrl), the node is measured against the configured peak.
    sample = pb.NodeSample(
        cpu_capacity_cores=2.0,
        memory_bandwidth_available=True,
        memory_bandwidth_bytes_per_second={"wc": 0.9 * PEAK},
    )
    c.on_report(
        pb.NodeReport(
            node_id="n1", slot=99, timestamp=clock[0] + 0.5, node=sample, slot_seconds=1.0
        )
    )
    rec = c.run_epoch()
    row = rec["sizing"]["interference"]["n1"]
    assert row["utilization"] == pytest.approx(0.9)
    assert row["state"].startswith("applied ")
