"""Calibration chain: simulated half always, live half on real cgroup v1 caps."""

from __future__ import annotations

import pytest

from testbed.sim.calibrate import CalibrationSetup, run_live, run_sim


def test_simulated_chain_uses_the_offered_cpu():
    setup = CalibrationSetup(seconds=10.0)
    sim = run_sim(setup)
    assert sim.messages == pytest.approx(setup.rate * setup.seconds, rel=0.1)
    for work_ms, cpu in zip(setup.work_ms, sim.cpu_cores, strict=True):
        assert cpu == pytest.approx(setup.rate * work_ms / 1000.0, rel=0.1)
    assert sim.latency_ms_mean >= sum(setup.work_ms) * 0.5


def test_live_chain_under_real_cgroup_v1_caps_finishes_every_message(cgroup_v1_cpu):
    # Caps well below what the chain wants: the quota must bind, nothing may be lost.
    setup = CalibrationSetup(work_ms=(4.0, 6.0), caps=(0.1, 0.15), rate=40.0, seconds=4.0)
    live = run_live(setup, mount=cgroup_v1_cpu)
    assert live.messages == pytest.approx(setup.rate * setup.seconds, rel=0.25)
    for cap, cpu in zip(setup.caps, live.cpu_cores, strict=True):
        assert cpu <= cap * 1.15
    assert not (cgroup_v1_cpu / "dsched-simcal").exists()
