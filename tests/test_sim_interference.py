"""The interference scenario and the simulated agents' resctrl-like bandwidth."""

from __future__ import annotations

import argparse

import numpy as np
import pytest

from bench.sim_interference import run_interference
from testbed.sim import scenario as scen
from testbed.sim.agents import NODE_PEAK_BANDWIDTH_BYTES_PER_SECOND, SimAgents
from testbed.sim.engine import ClusterSim
from testbed.sim.policies import round_robin_layout


class Recorder:
    """Takes what SimAgents sends a controller."""

    def __init__(self):
        self.reports = []
        self.sessions = self

    def on_hello(self, hello):
        pass

    def attach(self, node, send):
        pass

    def on_report(self, report):
        self.reports.append(report)


def test_sim_agents_report_bandwidth_per_application_over_the_slot():
    sc = scen.interference(epochs=4, step_seconds=0.05)
    sim = ClusterSim(sc, max_parallelism=3)
    round_robin_layout(sim, np.array(scen.INTERFERENCE_PARALLELISM))
    rec = Recorder()
    agents = SimAgents(sim, rec)
    for _ in range(2):
        before = sim.mbw_seconds.copy()
        sim.run_steps(sc.steps_per_epoch)
        rec.reports.clear()
        agents.send_reports()
    node0 = next(r for r in rec.reports if r.node_id.endswith("0000"))
    groups = dict(node0.node.memory_bandwidth_bytes_per_second)
    assert node0.node.memory_bandwidth_available
    assert set(groups) == {"gold", "hog"}
    # The slot's traffic, not the run's average: the last epoch's bandwidth-seconds.
    on0 = sim.node == 0
    hog = on0 & (sim.op_app[sim.inst_op] == 1)
    want = (sim.mbw_seconds - before)[hog].sum() / (sc.epoch_seconds * sim.cores[0])
    assert groups["hog"] == pytest.approx(want * NODE_PEAK_BANDWIDTH_BYTES_PER_SECOND)
    assert groups["hog"] / NODE_PEAK_BANDWIDTH_BYTES_PER_SECOND > 0.5  # saturating


def test_interference_bench_writes_its_figures():
    args = argparse.Namespace(epochs=4, step=0.05)
    doc = run_interference(args)
    assert set(doc["contenders"]) == {"dsched", "dsched-no-interference"}
    for row in doc["contenders"].values():
        assert row["failed_epochs"] == []
        for key in ("gold_violation_ratio", "gold_bound", "cpu_allocated_core_seconds"):
            assert key in row
    on = doc["last_record"]["dsched"]["interference"]
    off = doc["last_record"]["dsched-no-interference"]["interference"]
    assert on["sim-node-0000"]["state"].startswith("applied ")
    assert {v["state"] for v in off.values()} == {"off"}
