"""seed004 in the paper's regime: its service times, scaled arrival rates, measured
C², ERR skipping over-utilised nodes, and the Pareto view of the sim benchmark."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from bench import sim as bench_sim
from dsched.cli import main as dsched_main
from testbed.sim.engine import ClusterSim
from testbed.sim.measure import measure_scv
from testbed.sim.policies import EpochObservation, ErrPolicy
from testbed.sim.scenario import (
    PAPER_SERVICE_MEAN_S,
    AppSpec,
    ArrivalSpec,
    OperatorSpec,
    Scenario,
    seed004_paper,
)


def test_paper_scenario_keeps_service_times_and_scales_arrivals():
    sc = seed004_paper(apps=12, cores=16.0, phase1_utilization=0.5)
    ops = [o for a in sc.apps for o in a.operators]
    assert all(o.work_mean_s == PAPER_SERVICE_MEAN_S for o in ops)
    offered = sum(a.arrivals.rate * sum(o.work_mean_s for o in a.operators) for a in sc.apps)
    assert offered == pytest.approx(8.0)
    # The class targets keep the paper's ratios (620 : 1100 : 1400), gold at 2 x 3.6 s.
    t = {c.name: c.target_latency_ms for c in sc.qos}
    assert t["gold"] == pytest.approx(7200.0)
    assert t["silver"] / t["gold"] == pytest.approx(1100 / 620)
    assert t["bronze"] / t["gold"] == pytest.approx(1400 / 620)
    assert sorted(a.qos_class for a in sc.apps).count("gold") == 4
    assert all(2.0 <= a.arrivals.shape <= 6.0 for a in sc.apps)
    with pytest.raises(ValueError, match="gold_target_factor"):
        seed004_paper(gold_target_factor=1.0)


def _one_kind(kind: str, shape: float = 1.0) -> Scenario:
    apps = tuple(
        AppSpec(
            f"a{i}",
            "gold",
            (OperatorSpec("op", 0.9, work_cv=0.5),),
            ArrivalSpec(kind, rate=4.0 + i, shape=shape),
        )
        for i in range(3)
    )
    return Scenario("scv", 1, 4.0, apps, epochs=20, epoch_seconds=5.0, seed=3)


def test_measured_scv_tells_weibull_from_poisson():
    weibull = measure_scv(_one_kind("weibull", shape=4.0), warmup_epochs=20)
    poisson = measure_scv(_one_kind("poisson"), warmup_epochs=20)
    # Weibull(4) gaps: C² = Gamma(1.5) / Gamma(1.25)² - 1 = 0.079.
    expected = math.gamma(1.5) / math.gamma(1.25) ** 2 - 1
    assert weibull.gaps > 1000 and poisson.gaps > 1000
    assert weibull.arrival_scv == pytest.approx(expected, rel=0.25)
    assert weibull.arrival_scv < 0.2
    assert poisson.arrival_scv == pytest.approx(1.0, abs=0.15)
    # Gamma service with CV 0.5, drawn by the engine's own sampler.
    assert weibull.service_scv == pytest.approx(0.25, rel=0.15)


def _err_on_two_nodes() -> tuple[ClusterSim, ErrPolicy]:
    app = AppSpec(
        "g", "gold", (OperatorSpec("op", 0.001, work_cv=0.0),), ArrivalSpec("poisson", 200.0)
    )
    sc = Scenario("err", 2, 2.0, (app,), epochs=2, epoch_seconds=1.0, step_seconds=0.01, seed=1)
    policy = ErrPolicy()
    sim = ClusterSim(sc, max_parallelism=policy.max_parallelism)
    policy.setup(sim)
    return sim, policy


def _observation(sim: ClusterSim, node_utilization: list[float]) -> EpochObservation:
    z = np.zeros(sim.n_inst)
    return EpochObservation(0, 1.0, z, z, z, z, z, z, np.array(node_utilization), np.zeros(1))


def test_err_skips_an_over_utilised_node():
    sim, policy = _err_on_two_nodes()
    threads = np.flatnonzero(sim.active)
    assert len(threads) == 8 and set(sim.node[threads]) == {0, 1}
    policy.on_epoch(sim, _observation(sim, [0.95, 0.2]))
    before = sim.received.copy()
    sim.run_steps(100)
    got = sim.received - before
    on0, on1 = threads[sim.node[threads] == 0], threads[sim.node[threads] == 1]
    assert got[on0].sum() == 0
    assert got[on1].sum() > 100 and got[on1].min() > 0  # still round robin among the rest
    assert policy.marked_node_epochs == 1 and policy.skipping_epochs == 1
    # When every node is marked there is nowhere else to go: all threads take work.
    policy.on_epoch(sim, _observation(sim, [0.95, 0.99]))
    before = sim.received.copy()
    sim.run_steps(100)
    assert (sim.received - before)[threads].min() > 0


def test_err_without_skipping_keeps_every_thread():
    sim, policy = _err_on_two_nodes()
    policy.skip_over_utilized = False
    policy.on_epoch(sim, _observation(sim, [0.95, 0.2]))
    before = sim.received.copy()
    sim.run_steps(100)
    assert (sim.received - before)[np.flatnonzero(sim.active)].min() > 0


def test_pareto_front_on_a_hand_made_set():
    points = {
        "a": (1.0, 0.5),
        "b": (2.0, 0.2),
        "c": (3.0, 0.2),  # beaten by b
        "d": (1.0, 0.6),  # beaten by a
        "e": (4.0, 0.0),
        "f": (2.0, 0.2),  # the same point as b: both stay
        "g": (0.5, math.nan),  # no violation figure: never on the front
        "h": (5.0, 0.0),  # beaten by e
    }
    assert bench_sim.pareto_front(points) == ["a", "b", "f", "e"]
    assert bench_sim.pareto_front({"only": (1.0, 1.0)}) == ["only"]


def test_bench_paper_scenario_quick(tmp_path):
    out, png = tmp_path / "paper.json", tmp_path / "pareto.png"
    rc = dsched_main(
        [
            "bench",
            "sim",
            "--scenario",
            "seed004-paper-weibull",
            "--apps",
            "6",
            "--epochs",
            "6",
            "--warmup-epochs",
            "4",
            "--policies",
            "dsched,err",
            "--dsched-headrooms",
            "0.5",
            "--json",
            str(out),
            "--pareto-png",
            str(png),
        ]
    )
    assert rc == 0
    doc = json.loads(out.read_text())
    assert doc["regime"] == "paper" and doc["apps"] == 6
    assert "measured" in doc["scv_source"] and doc["scv"]["scv_source"] == doc["scv_source"]
    assert 0 < doc["scv"]["arrival_scv"] < 1  # Weibull gaps of shape 2-6
    assert doc["settings"]["epochs"] == 6 and doc["settings"]["warmup_epochs"] == 4
    assert doc["settings"]["phase1_offered_cores"] == pytest.approx(8.0)
    assert set(doc["policies"]) == {"dsched", "dsched-h0.5", "err"}
    cfg = doc["policies"]["dsched"]["controller_config"]
    assert "arima" in cfg["predictors"]
    assert cfg["arrival_scv"] == pytest.approx(doc["scv"]["arrival_scv"])
    assert cfg["service_scv"] == pytest.approx(doc["scv"]["service_scv"])
    assert doc["policies"]["dsched-h0.5"]["controller_config"]["headroom_cores"] == 0.5
    assert "epochs_skipping_a_node" in doc["policies"]["err"]
    for key in ("whole_run", "phase2"):
        assert set(doc["paper_comparison"][key]) == {
            "gold_violation_reduction",
            "gold_latency_reduction",
        }
    assert doc["paper_comparison"]["paper_gold_violation_reduction"] == 0.77
    par = doc["pareto"]
    assert set(par["points"]) == {"dsched", "dsched-h0.5", "err"}
    assert par["frontier"] and all(par["points"][n]["on_frontier"] for n in par["frontier"])
    assert isinstance(par["dsched_on_frontier"], bool)
    assert png.stat().st_size > 10_000


def test_bench_scaled_scenario_is_labelled_scaled(tmp_path):
    out = tmp_path / "scaled.json"
    rc = dsched_main(
        ["bench", "sim", "--scenario", "seed004-weibull", "--apps", "3", "--epochs", "2"]
        + ["--policies", "err", "--json", str(out)]
    )
    assert rc == 0
    doc = json.loads(out.read_text())
    assert doc["regime"] == "scaled" and "scv_source" not in doc


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--scenario", "seed004-nonsense"], "invalid choice"),
        (
            ["--scenario", "seed004-paper-weibull", "--dsched-headrooms", "-0.5"],
            "--dsched-headrooms",
        ),
        (["--scenario", "seed004-paper-weibull", "--dsched-headrooms", "4"], "--dsched-headrooms"),
        (["--scenario", "seed004-paper-weibull", "--dsched-headrooms", "x"], "--dsched-headrooms"),
        (["--scenario", "seed004-paper-weibull", "--warmup-epochs", "0"], "--warmup-epochs"),
        (
            ["--scenario", "seed004-paper-weibull", "--gold-target-factor", "0"],
            "gold_target_factor",
        ),
    ],
)
def test_bad_input_is_a_clear_cli_error(tmp_path, capsys, argv, message):
    out = tmp_path / "x.json"
    with pytest.raises(SystemExit) as exc:
        dsched_main(["bench", "sim", *argv, "--epochs", "2", "--json", str(out)])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err
    assert not out.exists()
