"""The production controller driven by simulated agents, and the sim benchmark."""

from __future__ import annotations

import json

import numpy as np
import pytest

from controller.model import InstanceKey
from dsched.cli import main as dsched_main
from dsched_pb import dsched_pb2 as pb
from testbed.sim.agents import SimAgents
from testbed.sim.engine import ClusterSim
from testbed.sim.policies import DschedPolicy, controller_features
from testbed.sim.run import observe, run_policy
from testbed.sim.scenario import seed004


@pytest.fixture
def small_run():
    sc = seed004(apps=6, arrivals="weibull", epochs=6, burst_start=3, burst_end=4, seed=5)
    policy = DschedPolicy()
    sim = ClusterSim(sc, max_parallelism=1)
    policy.setup(sim)
    yield sc, sim, policy
    policy.close()


def test_controller_learns_the_dag_and_caps_every_instance(small_run):
    sc, sim, policy = small_run
    prev = {
        k: getattr(sim, k).copy()
        for k in ("cpu_seconds", "busy_seconds", "executed", "received", "source_arrivals")
    }
    for e in range(4):
        sim.run_steps(sc.steps_per_epoch)
        policy.on_epoch(sim, observe(sim, prev, e))
    ctl = policy.controller
    assert not ctl.cluster.rejected, dict(ctl.cluster.rejected)
    topo = ctl.cluster.topologies[sc.apps[0].name]
    assert topo.operators == ["op0", "op1", "op2", "op3"]
    assert topo.parents["op1"] == ("op0",) and topo.stateful["op2"] is True
    active = np.flatnonzero(sim.active)
    assert np.all(np.isfinite(sim.cap[active]))  # enforce mode: every instance capped
    assert policy.agents.log.applied >= len(active)
    # The caps in the simulator are the ones the controller decided and persisted.
    caps = ctl.store.load_caps()
    key = InstanceKey(sc.apps[0].name, "op0", 0)
    assert caps[key][1] == pytest.approx(sim.cap[0])
    assert len(policy.epoch_seconds) == 4


def test_class_assignment_reaches_the_controller(small_run):
    sc, _, policy = small_run
    if not controller_features()["set_qos"]:
        pytest.fail("controller has no set_qos: the class adapter would be a no-op")
    assert policy.class_assignment == "set_qos"
    listed = {a.app: a.qos_class for a in policy.controller.list_qos()}
    assert listed == {a.name: a.qos_class for a in sc.apps}


def test_agents_refuse_unknown_instances_and_ignore_stale_directives(small_run):
    sc, sim, policy = small_run
    agents: SimAgents = policy.agents
    send = agents._inbox["sim-node-0000"].append
    key = pb.InstanceKey(app=sc.apps[0].name, operator="op0", instance=0)
    send(
        pb.ControllerMessage(
            directive=pb.CapDirective(epoch=10, caps=[pb.InstanceCap(key=key, cap_cores=0.3)])
        )
    )
    bogus = pb.InstanceKey(app="nope", operator="op0", instance=0)
    send(
        pb.ControllerMessage(
            directive=pb.CapDirective(epoch=11, caps=[pb.InstanceCap(key=bogus, cap_cores=0.3)])
        )
    )
    assert agents.apply_directives() == 1
    assert sim.cap[0] == pytest.approx(0.3)
    assert agents.log.refused == 1
    send(
        pb.ControllerMessage(
            directive=pb.CapDirective(epoch=9, caps=[pb.InstanceCap(key=key, cap_cores=0.9)])
        )
    )
    assert agents.apply_directives() == 0
    assert agents.log.stale == 1 and sim.cap[0] == pytest.approx(0.3)


def test_full_run_reports_every_class(small_run):
    sc, _, _ = small_run
    policy = DschedPolicy()
    try:
        res = run_policy(sc, policy)
    finally:
        policy.close()
    assert set(res.classes) == {"gold", "silver", "bronze"}
    c = res.conservation
    assert c["source_arrivals"] == c["finished_at_sinks"] + c["in_system"]
    assert res.cpu_allocated_core_seconds > 0 and res.nodes_mean == 4


def test_bench_sim_writes_the_documented_keys(tmp_path):
    out, png = tmp_path / "sim.json", tmp_path / "sim.png"
    rc = dsched_main(
        [
            "bench",
            "sim",
            "--scenario",
            "seed004-poisson",
            "--apps",
            "6",
            "--epochs",
            "4",
            "--policies",
            "dsched,err,vpa",
            "--json",
            str(out),
            "--plot",
            str(png),
        ]
    )
    assert rc == 0
    doc = json.loads(out.read_text())
    assert doc["scenario"] == "seed004-poisson" and doc["apps"] == 6
    for name in ("dsched", "err", "vpa"):
        p = doc["policies"][name]
        for cls in ("gold", "silver", "bronze"):
            assert set(p["classes"][cls]) >= {
                "latency_ms_mean",
                "latency_ms_p99",
                "violation_ratio",
            }
        assert {"cpu_allocated_core_seconds", "reconfigurations", "nodes_mean"} <= set(p)
    assert doc["ratios_vs_err"]["err"]["classes"]["gold"]["latency_ms_mean"] == pytest.approx(1.0)
    assert png.stat().st_size > 10_000


def test_bench_scale_reports_controller_cost(tmp_path):
    out = tmp_path / "scale.json"
    rc = dsched_main(
        [
            "bench",
            "sim",
            "--scenario",
            "scale",
            "--nodes",
            "20",
            "--instances",
            "200",
            "--epochs",
            "3",
            "--json",
            str(out),
        ]
    )
    assert rc == 0
    doc = json.loads(out.read_text())
    assert doc["controller_epoch_seconds_median"] > 0
    assert doc["controller_epoch_cpu_seconds_median"] > 0
    assert doc["controller_peak_rss_bytes"] > 0
    assert len(doc["controller_epoch_seconds"]) == 3
    assert doc["controller_failed_epochs"] == []
    assert list(doc["policies"]) == ["dsched"]


def test_operators_idle_for_longer_than_the_window_do_not_fail_an_epoch():
    """At scale some operator always processed nothing in the last phi epochs; that
    once made predict.cost.cpu_per_tuple raise and failed the whole epoch
    (controller.stages.forecast.operator_cost now keeps or charges a cost instead)."""
    from testbed.sim.scenario import SEED004_CLASSES, AppSpec, ArrivalSpec, OperatorSpec, Scenario

    ops = tuple(OperatorSpec(f"op{k}", 0.004, 0.7) for k in range(3))
    busy = AppSpec("busy", "gold", ops, ArrivalSpec("poisson", rate=20.0))
    # Messages in epochs 0 and 1, then none for four epochs (phi is 3), then again.
    pause = AppSpec(
        "pause", "silver", ops, ArrivalSpec("trace", rate=0.0, trace=(20, 20, 0, 0, 0, 0, 20, 20))
    )
    never = AppSpec("never", "bronze", ops, ArrivalSpec("poisson", rate=0.0))
    sc = Scenario(
        "idle", 1, 2.0, (busy, pause, never), epochs=8, step_seconds=0.02, qos=SEED004_CLASSES
    )
    policy = DschedPolicy()
    try:
        res = run_policy(sc, policy)
        assert policy.failed_epochs == []
        assert len(policy.epoch_seconds) == sc.epochs
        ctl = policy.controller
        assert {"busy", "pause"} <= set(ctl.cluster.topologies)
    finally:
        policy.close()
    assert (
        res.conservation["in_system"] + res.conservation["finished_at_sinks"]
        == (res.conservation["source_arrivals"])
    )


def test_the_simulated_controller_gets_the_daemons_gc_tuning(small_run):
    import gc

    from controller.core import tune_gc

    _, _, policy = small_run
    before = gc.get_threshold()
    try:
        tune_gc()
        assert policy.gc_threshold == gc.get_threshold()
    finally:
        gc.set_threshold(*before)
