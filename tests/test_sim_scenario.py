"""Scenario parameters out of range are refused with the parameter's name."""

from __future__ import annotations

import math

import pytest

from bench import sim as bench_sim
from testbed.sim.policies import make_policy
from testbed.sim.scenario import (
    AppSpec,
    ArrivalSpec,
    BurstSpec,
    OperatorSpec,
    QosClassSpec,
    Scenario,
    scale,
    seed004,
    wordcount,
)

OP = OperatorSpec("x", 0.01)
APP = AppSpec("a", "gold", (OP,), ArrivalSpec("poisson", rate=1.0))


@pytest.mark.parametrize(
    ("build", "name"),
    [
        (lambda: ArrivalSpec("poisson", rate=-1.0), "rate"),
        (lambda: ArrivalSpec("weibull", rate=1.0, shape=0.0), "shape"),
        (lambda: ArrivalSpec("weibull", rate=1.0, shape=-2.0), "shape"),
        (lambda: ArrivalSpec("trace", rate=0.0, trace=(1.0, -3.0)), "trace"),
        (lambda: ArrivalSpec("trace", rate=0.0), "trace"),
        (lambda: ArrivalSpec("bursty", rate=1.0), "arrival kind"),
        (lambda: ArrivalSpec("poisson", rate=math.nan), "rate"),
        (lambda: OperatorSpec("x", -0.1), "work_mean_s"),
        (lambda: OperatorSpec("x", 0.1, work_cv=-1), "work_cv"),
        (lambda: BurstSpec(5, 3, 2.0), "end_epoch"),
        (lambda: BurstSpec(1, 3, 0.0), "factor"),
        (lambda: QosClassSpec("gold", 100.0, 1.5, 1.0), "max_violation_ratio"),
        (lambda: Scenario("s", 0, 4.0, (APP,), epochs=1), "nodes"),
        (lambda: Scenario("s", 2, 0.0, (APP,), epochs=1), "cores_per_node"),
        (lambda: Scenario("s", 2, 4.0, (APP,), epochs=0), "epochs"),
        (lambda: Scenario("s", 2, 4.0, (), epochs=1), "apps"),
        (lambda: Scenario("s", 2, 4.0, (APP,), epochs=1, step_seconds=0.0), "step_seconds"),
        (
            lambda: Scenario("s", 2, 4.0, (APP,), epochs=1, interference_threshold=2.0),
            "interference_threshold",
        ),
        (lambda: Scenario("s", 2, 4.0, (APP, APP), epochs=1), "unique"),
        (lambda: Scenario("s", 2, 4.0, (APP,), epochs=1, handoff_s=-0.001), "handoff_s"),
        (lambda: Scenario("s", 2, 4.0, (APP,), epochs=1, cfs_tick_s=-0.004), "cfs_tick_s"),
        (lambda: seed004(apps=0), "apps"),
        (lambda: seed004(apps=10, nodes=0), "nodes"),
        (lambda: seed004(apps=10, cores=-16), "cores"),
        (lambda: seed004(apps=10, arrivals="uniform"), "arrivals"),
        (lambda: seed004(apps=10, phase1_utilization=1.2), "phase1_utilization"),
        (lambda: scale(nodes=0), "nodes"),
        (lambda: scale(instances=2), "instances"),
        (lambda: wordcount(rate=-5.0), "rate"),
        (lambda: make_policy("round-robin"), "unknown policy"),
    ],
)
def test_bad_parameter_is_named(build, name):
    with pytest.raises(ValueError, match=name):
        build()


def test_unknown_qos_class_is_refused():
    qos = (QosClassSpec("gold", 100.0, 0.01, 8.0),)
    app = AppSpec("a", "platinum", (OP,), ArrivalSpec("poisson", rate=1.0))
    with pytest.raises(ValueError, match="qos_class"):
        Scenario("s", 1, 1.0, (app,), epochs=1, qos=qos)


def test_seed004_matches_the_paper_setup():
    sc = seed004(apps=60, arrivals="poisson", epochs=80)
    assert sc.nodes == 4 and sc.total_cores == 16
    assert {a.qos_class for a in sc.apps} == {"gold", "silver", "bronze"}
    assert all(len(a.operators) == 4 for a in sc.apps)
    assert all(2.0 <= a.arrivals.rate <= 10.0 for a in sc.apps)  # 0.2-1 per 100 ms
    factors = {a.qos_class: a.burst.factor for a in sc.apps}
    assert factors == {"gold": 1.8, "silver": 2.7, "bronze": 3.6}
    assert {(a.burst.start_epoch, a.burst.end_epoch) for a in sc.apps} == {(40, 51)}
    assert [c.max_violation_ratio for c in sc.qos] == [0.01, 0.10, 0.50]
    # Phase I offers half of the cluster's cores.
    work = sum(a.arrivals.rate * sum(o.work_mean_s for o in a.operators) for a in sc.apps)
    assert work == pytest.approx(0.5 * 16)
    w = seed004(apps=60, arrivals="weibull")
    assert all(1.1 * 0.88 * 10 <= a.arrivals.rate <= 4 * 0.95 * 10 for a in w.apps)
    assert all(2.0 <= a.arrivals.shape <= 6.0 for a in w.apps)


def test_bench_refuses_unknown_policy_before_running(tmp_path):
    import argparse

    p = argparse.ArgumentParser()
    bench_sim.add_arguments(p)
    args = p.parse_args(
        ["--scenario", "wordcount", "--policies", "err,magic", "--json", str(tmp_path / "x.json")]
    )
    with pytest.raises(ValueError, match="magic"):
        bench_sim.run(args)
    assert not (tmp_path / "x.json").exists()
