"""Calibration chain: simulated half always, live half on real cgroup v1 caps."""

from __future__ import annotations

import math

import numpy as np
import pytest

from testbed.live.engine import hash_seconds
from testbed.sim.calibrate import (
    TICK_CANDIDATES_S,
    CalibrationSetup,
    MessageCost,
    SimModel,
    calibration_inputs,
    measure_cfs_timing,
    measure_handoff_seconds,
    measure_message_cost,
    run_live,
    run_sim,
)


def test_simulated_chain_uses_the_offered_cpu():
    setup = CalibrationSetup(seconds=10.0)
    inputs = calibration_inputs(setup)
    sim = run_sim(setup, inputs)
    assert sim.messages == len(inputs.arrivals)
    assert sim.messages == pytest.approx(setup.rate * setup.seconds, rel=0.1)
    for chunks, cpu in zip(inputs.chunks, sim.cpu_cores, strict=True):
        assert cpu * sim.seconds == pytest.approx(chunks.sum() * inputs.chunk_seconds)
    assert setup.seconds * 0.95 < sim.seconds < setup.seconds * 1.1
    assert sim.latency_ms_mean >= sum(setup.work_ms) * 0.5


def test_both_halves_get_the_same_messages_and_the_sim_burns_their_modelled_cost():
    setup = CalibrationSetup(seconds=5.0, seed=7)
    inputs = calibration_inputs(setup, chunk_seconds=40e-6)
    assert all(len(c) == len(inputs.arrivals) for c in inputs.chunks)
    # Randomized rounding keeps the mean work: 4 ms and 6 ms in 40 us chunks.
    for work_ms, chunks in zip(setup.work_ms, inputs.chunks, strict=True):
        assert chunks.mean() * 40e-6 * 1000 == pytest.approx(work_ms, rel=0.15)
    cost = MessageCost(fixed_s=1e-4, per_chunk_s=41e-6)
    sim = run_sim(setup, inputs, SimModel(cost=cost))
    assert sim.messages == len(inputs.arrivals)
    for k, chunks in enumerate(inputs.chunks):
        assert sim.cpu_cores[k] * sim.seconds == pytest.approx(cost.seconds(chunks).sum())
    # Given arrival instants replace the generated ones, message for message.
    later = run_sim(setup, inputs, SimModel(cost=cost), inputs.arrivals + 0.5)
    assert later.messages == sim.messages
    assert later.seconds == pytest.approx(sim.seconds + 0.5, abs=0.01)
    with pytest.raises(ValueError, match="arrivals_s must hold"):
        run_sim(setup, inputs, arrivals_s=inputs.arrivals[:-1])


@pytest.mark.parametrize(
    ("kw", "name"),
    [
        ({"rate": -1.0}, "rate"),
        ({"seconds": 0.0}, "seconds"),
        ({"work_ms": (4.0, -6.0)}, "work_ms"),
        ({"caps": (0.5, 0.0)}, "caps"),
        ({"caps": (0.5,)}, "work_ms and caps"),
    ],
)
def test_bad_setup_is_named(kw, name):
    with pytest.raises(ValueError, match=name):
        CalibrationSetup(**kw)


def test_live_chain_under_real_cgroup_v1_caps_finishes_every_message(cgroup_v1_cpu):
    # Caps well below what the chain wants: the quota must bind, nothing may be lost.
    setup = CalibrationSetup(work_ms=(4.0, 6.0), caps=(0.1, 0.15), rate=40.0, seconds=4.0)
    inputs = calibration_inputs(setup)
    live = run_live(setup, inputs, mount=cgroup_v1_cpu)
    assert live.figures.messages == len(inputs.arrivals)
    assert len(live.arrivals_s) == len(inputs.arrivals)
    assert np.all(np.diff(live.arrivals_s) >= 0)
    for cap, cpu, throttled in zip(
        setup.caps, live.figures.cpu_cores, live.figures.throttled_seconds, strict=True
    ):
        assert cpu <= cap * 1.15
        assert throttled > 0  # the kernel did throttle the group
    for t in live.timing:
        assert 0 <= t.period_phase_s < 0.1
    assert not (cgroup_v1_cpu / "dsched-simcal").exists()
    # The simulated half runs exactly these messages, with the measured timing.
    model = SimModel.measured(MessageCost(0.0, inputs.chunk_seconds), 0.0, live)
    sim = run_sim(setup, inputs, model, live.arrivals_s)
    assert sim.messages == live.figures.messages
    assert all(t > 0 for t in sim.throttled_seconds)


def test_live_chain_with_threads_of_one_process_finishes_every_message(cgroup_v1_cpu):
    setup = CalibrationSetup(rate=40.0, seconds=2.0)
    inputs = calibration_inputs(setup)
    live = run_live(setup, inputs, mount=cgroup_v1_cpu, isolation="thread")
    assert live.figures.messages == len(inputs.arrivals)
    assert not (cgroup_v1_cpu / "dsched-simcal").exists()
    with pytest.raises(ValueError, match="isolation"):
        run_live(setup, inputs, mount=cgroup_v1_cpu, isolation="fiber")


def test_cfs_timing_probe_finds_a_stable_period_phase_and_the_tick(cgroup_v1_cpu):
    group = cgroup_v1_cpu / "dsched-simcal-probe"
    group.mkdir()
    try:
        (group / "cpu.cfs_period_us").write_text("100000\n")
        (group / "cpu.cfs_quota_us").write_text("30000\n")
        first = measure_cfs_timing(group)
        second = measure_cfs_timing(group)
    finally:
        group.rmdir()
    assert math.isfinite(first.period_phase_s) and 0 <= first.period_phase_s < 0.1
    # The group's period timer keeps its phase across the idle time in between.
    drift = abs((second.period_phase_s - first.period_phase_s + 0.05) % 0.1 - 0.05)
    assert drift < 0.01
    assert first.tick_s in (0.0, *TICK_CANDIDATES_S)


def test_message_cost_and_handoff_are_measured():
    cost = measure_message_cost(messages=60, max_chunks=200)
    # The fitted hashing cost and the engine's own calibration measure one thing.
    assert hash_seconds() / 3 < cost.per_chunk_s < hash_seconds() * 3
    assert cost.fixed_s >= 0
    assert measure_handoff_seconds(messages=30) > 0
    with pytest.raises(ValueError, match="messages"):
        measure_message_cost(messages=2)
