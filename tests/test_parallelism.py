"""Instance counts per operator: the pure stage's rules (MBA with a model, one
more or fewer without), its hysteresis and limits, the `[parallelism]` config,
the decision record's `parallelism` entry and the simulator's actuator."""

from __future__ import annotations

import argparse
from types import SimpleNamespace

import numpy as np
import pytest

from bench.sim_elastic import CONTENDERS, run_elastic
from controller.config import ControllerConfig, ParallelismConfig
from controller.edges.parallelism import ParallelismChange, ParallelismEdge
from controller.record import explain_lines
from controller.stages.demand import InstanceDemand
from controller.stages.forecast import OperatorForecast
from controller.stages.parallelism import (
    OperatorSizing,
    decide_parallelism,
    offered_growth,
    per_instance_needs,
    sizing_inputs,
)
from dsched.config import ConfigError, from_dict
from dsched.ids import OperatorKey
from predict.perfmodel import PerformanceModel
from testbed.sim.engine import ClusterSim
from testbed.sim.parallelism import SimParallelism, attach_parallelism
from testbed.sim.policies import DschedPolicy, UtilScalerPolicy
from testbed.sim.run import observe, run_policy
from testbed.sim.scenario import elastic
from tests.view_support import operator_view

OP = OperatorKey("app", "split")
COUNTERS = ("cpu_seconds", "busy_seconds", "executed", "received", "source_arrivals")


def sizing(current=2, rate=100.0, kappa=0.005, unreachable=False, need_one_fewer=None, **ahead):
    return OperatorSizing(current, rate, kappa, unreachable, need_one_fewer, **ahead)


def decide(inputs, below=None, *, lo=1, hi=8, patience=3, models=None, raise_together=True):
    return decide_parallelism(
        inputs,
        below or {},
        limits=lambda k: (lo, hi),
        max_instance_cores=1.0,
        lower_utilization=0.6,
        patience=patience,
        models=models,
        raise_together=raise_together,
    )


def test_one_more_at_once_when_an_instance_needs_more_than_a_core():
    d, below = decide({OP: sizing(current=2, rate=300.0)})  # 0.75 cores each: fits
    assert d[OP].decided == 2 and d[OP].rule == "step"
    d, below = decide({OP: sizing(current=2, rate=500.0)})  # 1.25 cores each
    assert d[OP].decided == 3 and "max_instance_cores" in d[OP].reason and below == {}


def test_one_more_when_the_latency_target_is_unreachable_at_the_maximum():
    d, _ = decide({OP: sizing(current=2, rate=100.0, unreachable=True)})
    assert d[OP].decided == 3 and "unreachable" in d[OP].reason


def test_one_more_ahead_where_the_offered_load_rises():
    # 0.6 cores per instance now; the trend reaches 440/s (1.1 each) within 2 slots.
    d, _ = decide({OP: sizing(current=2, rate=240.0, rate_ahead=440.0, lookahead=2)})
    assert d[OP].decided == 3
    assert "trend reaches 440.0/s within 2 slot(s)" in d[OP].reason, d[OP].reason
    # Or its latency target would be out of reach at the rate ahead.
    d, _ = decide({OP: sizing(current=2, rate=240.0, rate_ahead=300.0, need_ahead=1.2)})
    assert d[OP].decided == 3 and "latency target would need 1.20 cores" in d[OP].reason
    # Within reach at the rate ahead, or no rise: the count stays.
    for ahead in ({"rate_ahead": 300.0, "need_ahead": 0.9}, {}):
        d, _ = decide({OP: sizing(current=2, rate=240.0, **ahead)})
        assert d[OP].decided == 2, d[OP].reason


def source_view(key, arrivals, upstream=()):
    """An operator over three or two 5-s slots (``upstream``: not a source)."""
    return operator_view(key, arrivals, upstream=upstream, slot_seconds=5.0)


def test_the_offered_load_grows_only_where_the_sources_rise_beyond_chance():
    src, down = OperatorKey("app", "src"), OperatorKey("app", "count")
    other = OperatorKey("other", "src")
    # 40, 46, 52/s over 5-s slots: a Poisson count's slope error is ~2/s per slot.
    views = {
        src: source_view(src, [40.0, 46.0, 52.0]),
        # Downstream of a backlog being drained: its own burst does not count.
        down: source_view(down, [40.0, 90.0, 140.0], upstream=("src",)),
        # A steady stream's slots tilt by chance (45 -> 47 is within one error).
        other: source_view(other, [45.0, 46.0, 47.0]),
    }
    growth = offered_growth(views, 2)
    # Next slot on the line: 58/s; two slots further +12/s.
    assert growth == {"app": pytest.approx(12.0 / 58.0)}
    assert offered_growth({src: source_view(src, [40.0, 52.0])}, 2) == {}  # two slots
    assert offered_growth({src: source_view(src, [52.0, 46.0, 40.0])}, 2) == {}  # falling
    # Every operator of the application gets the sized rate grown by that share.
    fcs = {k: OperatorForecast(k, 100.0, "linear_trend", {}, 0.005) for k in views}
    inputs = sizing_inputs(views, fcs, {}, lookahead=2)
    assert inputs[down].rate_ahead == pytest.approx(100.0 * (1 + 12.0 / 58.0))
    assert inputs[other].rate_ahead is None
    assert all(s.rate_ahead is None for s in sizing_inputs(views, fcs, {}).values())


def test_one_fewer_only_after_patience_epochs_in_a_row():
    low = {OP: sizing(current=3, rate=100.0)}  # 0.5 cores fit one instance fewer
    below: dict = {}
    seen = []
    for _ in range(3):
        d, below = decide(low, below, patience=3)
        seen.append(d[OP].decided)
    assert seen == [3, 3, 2]
    assert "lowering held (1 of 3 epochs)" in decide(low, {}, patience=3)[0][OP].reason
    # An epoch that does not want fewer starts the count again.
    _, below = decide(low, {}, patience=3)
    _, below = decide({OP: sizing(current=3, rate=500.0)}, below, patience=3)
    assert below == {}


def test_no_fewer_when_the_latency_target_would_be_unreachable_with_one_fewer():
    d, below = decide({OP: sizing(current=3, rate=100.0, need_one_fewer=1.4)}, patience=0)
    assert d[OP].decided == 3 and "one instance fewer" in d[OP].reason and below == {}
    # The latency need has the load's band: above lower_utilization x the maximum
    # (0.6 here) one instance fewer would sit just under the raise threshold.
    d, _ = decide({OP: sizing(current=3, rate=100.0, need_one_fewer=0.7)}, patience=0)
    assert d[OP].decided == 3 and "0.70 cores per instance > 0.6 x 1" in d[OP].reason
    d, _ = decide({OP: sizing(current=3, rate=100.0, need_one_fewer=0.55)}, patience=0)
    assert d[OP].decided == 2


def test_one_fewer_needs_the_latency_solved_for_one_server_fewer():
    s = {OP: sizing(current=3, rate=100.0)}
    tight = per_instance_needs(
        s, {OP: 0.006}, arrival_scv=1.0, service_scv=1.0, model="allen-cunneen", fewer=1
    )
    loose = per_instance_needs(
        s, {OP: 1.0}, arrival_scv=1.0, service_scv=1.0, model="allen-cunneen", fewer=1
    )
    # A budget barely above the service time needs fast instances; a loose one does not.
    assert tight[OP] > 0.8 > loose[OP] >= 100.0 * 0.005 / 2
    # Per-operator (measured) variability: burstier arrivals need more.
    bursty = per_instance_needs(
        s, {OP: 0.02}, arrival_scv={OP: 4.0}, service_scv={OP: 1.0}, model="allen-cunneen", fewer=1
    )
    calm = per_instance_needs(
        s, {OP: 0.02}, arrival_scv={OP: 0.1}, service_scv={OP: 1.0}, model="allen-cunneen", fewer=1
    )
    assert bursty[OP] > calm[OP]


def test_limits_hold_the_decision():
    d, _ = decide({OP: sizing(current=4, rate=2000.0)}, hi=4)
    assert d[OP].decided == 4 and "limits [1, 4]" in d[OP].reason and d[OP].wanted == 5
    d, _ = decide({OP: sizing(current=2, rate=1.0)}, lo=2, patience=0)
    assert d[OP].decided == 2
    d, _ = decide({OP: sizing(current=6, rate=1.0)}, hi=4)
    assert d[OP].decided == 4 and "outside the operator's limits" in d[OP].reason


def test_an_application_gains_instances_together_where_its_operators_are_busy():
    """One operator of `app` needs one more; its other operators whose instances each
    carry more than the lowering band (0.6 x 1 core) gain one in the same epoch, the
    others and other applications' operators do not."""
    up = OperatorKey("app", "count")  # 1.25 cores per instance: needs one more
    busy = OperatorKey("app", "split")  # 0.7 per instance
    idle = OperatorKey("app", "sink")  # 0.3 per instance
    full = OperatorKey("app", "map")  # 0.9 per instance, at its limit
    other = OperatorKey("other", "split")  # 0.9 per instance, another application
    inputs = {
        up: sizing(current=2, rate=500.0),
        busy: sizing(current=2, rate=280.0),
        idle: sizing(current=1, rate=60.0),
        full: sizing(current=4, rate=720.0),
        other: sizing(current=1, rate=180.0),
    }
    d, _ = decide(inputs)
    assert d[up].decided == 3
    assert d[busy].decided == 3 and "one more with app/count" in d[busy].reason
    assert d[idle].decided == 1 and d[other].decided == 1
    d, _ = decide({**inputs, full: sizing(current=4, rate=720.0)}, hi=4)
    assert d[full].decided == 4 and d[busy].decided == 3
    # An operator sized by its performance model keeps the model's count (MBA: two
    # threads carry 280/s where one carries 150/s).
    model = PerformanceModel.from_table(
        [(1, 150.0, 100.0, 10.0), (2, 300.0, 190.0, 10.0)], name="split"
    )
    d, _ = decide(inputs, models={"app/split": model})
    assert d[busy].rule == "mba" and d[busy].decided == 2 and d[up].decided == 3
    # Off: each operator on its own.
    d, _ = decide(inputs, raise_together=False)
    assert d[up].decided == 3 and d[busy].decided == 2
    # An operator waiting to lose an instance is not raised (it carries too little),
    # and with no raise in the application nothing moves.
    d, below = decide({busy: sizing(current=2, rate=280.0), idle: sizing(current=3, rate=60.0)})
    assert d[busy].decided == 2 and d[idle].decided == 3 and below == {idle: 1}


def test_mba_with_a_model_sizes_bundles_and_threads():
    # One slot: 1 thread 10/s, 2 threads 18/s, 3 threads 20/s (the best bundle).
    model = PerformanceModel.from_table(
        [(1, 10.0, 50.0, 10.0), (2, 18.0, 90.0, 15.0), (3, 20.0, 100.0, 20.0)], name="split"
    )
    # 45/s: two full bundles of 3 threads (40/s) and one thread for the rest.
    d, _ = decide({OP: sizing(current=2, rate=45.0)}, models={"app/split": model})
    assert d[OP].rule == "mba" and d[OP].decided == 7 and "MBA" in d[OP].reason
    # Keyed by OperatorKey too; lowering waits like the step rule.
    d, below = decide({OP: sizing(current=7, rate=5.0)}, models={OP: model}, patience=2)
    assert d[OP].decided == 7 and below == {OP: 1}
    d, _ = decide({OP: sizing(current=7, rate=5.0)}, below, models={OP: model}, patience=2)
    assert d[OP].decided == 1


@pytest.mark.parametrize(
    "table, key",
    [
        ({"min_instances": 0}, "parallelism.min_instances"),
        ({"max_instances": 5000}, "parallelism.max_instances"),
        ({"min_instances": 4, "max_instances": 2}, "parallelism.max_instances"),
        ({"lower_patience_epochs": -1}, "parallelism.lower_patience_epochs"),
        ({"lower_utilization": 1.5}, "parallelism.lower_utilization"),
        ({"raise_together": "yes"}, "parallelism.raise_together"),
        ({"raise_lookahead_slots": -1}, "parallelism.raise_lookahead_slots"),
        ({"raise_lookahead_slots": 61}, "parallelism.raise_lookahead_slots"),
        ({"raise_lookahead_slots": 2.5}, "parallelism.raise_lookahead_slots"),
        ({"raise_lookahead_slots": True}, "parallelism.raise_lookahead_slots"),
        ({"actuator": "kubectl"}, "parallelism.actuator"),
        (
            {"operators": {"a/b": {"max_instances": -2}}},
            'parallelism.operators."a/b".max_instances',
        ),
        ({"operators": {"ab": {"max_instances": 2}}}, 'parallelism.operators."ab"'),
        (
            {"operators": {"a/b": {"min_instances": 5, "max_instances": 3}}},
            'parallelism.operators."a/b".max_instances',
        ),
    ],
)
def test_bad_limits_are_startup_errors_naming_the_key(table, key):
    with pytest.raises(ConfigError) as exc:
        from_dict(ControllerConfig, {"parallelism": table})
    assert exc.value.key == key, str(exc.value)


def test_per_operator_limits_override_the_defaults():
    cfg = from_dict(
        ControllerConfig,
        {"parallelism": {"max_instances": 6, "operators": {"a/b": {"max_instances": 2}}}},
    )
    assert cfg.parallelism.limits("a", "b") == (1, 2)
    assert cfg.parallelism.limits("a", "c") == (1, 6)
    cfg.validate()


def run_epochs(sc, sim, policy, epochs):
    for e in range(epochs):
        prev = {k: getattr(sim, k).copy() for k in COUNTERS}
        sim.run_steps(sc.steps_per_epoch)
        policy.on_epoch(sim, observe(sim, prev, e))


def overloaded(epochs=4):
    # Gold's operators each need 1.2 cores from the start: one instance cannot.
    return elastic(
        epochs=epochs, gold_rate=120.0, burst_start=100, burst_end=101, nodes=4, step_seconds=0.1
    )


@pytest.mark.parametrize("act", [False, True])
def test_record_says_what_was_decided_and_whether_it_was_carried_out(act):
    sc = overloaded()
    policy = DschedPolicy(max_parallelism=4, config_overrides={"latency_criterion": "quantile"})
    sim = ClusterSim(sc, max_parallelism=4)
    policy.setup(sim)
    try:
        if act:
            attach_parallelism(policy.controller, sim, policy.agents)
        run_epochs(sc, sim, policy, 3)
        rec = policy.controller.last_record["parallelism"]
        assert rec["enabled"] and rec["actuator"] == ("sim" if act else "recommend")
        rows = {(r["app"], r["operator"]): r for r in rec["operators"]}
        assert len(rows) == sim.n_ops
        gold = rows[("gold0", "op0")]
        assert {"current", "decided", "rule", "reason", "carried_out", "outcome"} <= set(gold)
        if act:
            assert sim.op_k[0] >= 2, rec
        else:
            assert gold["decided"] > gold["current"] == 1
            assert gold["outcome"].startswith("recommend-only: ") and not gold["carried_out"]
            assert (sim.op_k == 1).all()
            story = "\n".join(explain_lines("gold0", [policy.controller.last_record]))
            assert "parallelism op0: 1 -> 2 (step): recommend-only: " in story
        assert not policy.failed_epochs
    finally:
        policy.close()


class CarriesOut:
    """An actuator that does what it is told (the edge's bookkeeping is under test)."""

    name = "test"

    def apply(self, changes):
        return {c.key: None for c in changes}


def epoch_of(epoch, rate, unreachable):
    """What the parallelism edge reads of an epoch: one operator whose views show a
    single instance, sized for ``rate`` (10 ms per tuple, a 50-ms budget)."""
    view = source_view(OP, [rate] * 3)
    inst = view.instances[0]
    reason = "latency-unreachable" if unreachable else "latency"
    return SimpleNamespace(
        epoch=epoch,
        views={OP: view},
        forecasts={OP: OperatorForecast(OP, rate, "linear_trend", {}, 0.01)},
        demands={inst: InstanceDemand(inst, "n1", 1.0, reason)},
        budgets={OP: 0.05},
        classes={},
        latency_criterion="mean",
        latency_model="allen-cunneen",
        variability={},
    )


def test_an_instance_added_is_counted_before_its_first_report():
    """An instance added reports a slot after it starts: until then the views show
    the old one carrying everything, which the demand stage finds short of the
    target again. Judged for the two instances set, 80/s is within reach (0.4
    cores each), and the operator must not gain a third (and pause again)."""
    edge = ParallelismEdge(ParallelismConfig(), max_instance_cores=1.0)
    edge.use(CarriesOut())
    first = edge.offer(epoch_of(1, 120.0, unreachable=True), enforce=True)
    assert [(r["current"], r["decided"], r["outcome"]) for r in first["operators"]] == [
        (1, 2, "done")
    ]
    second = edge.offer(epoch_of(2, 80.0, unreachable=True), enforce=True)
    row = second["operators"][0]
    assert (row["current"], row["decided"]) == (2, 2), row
    # Where two are short of the target too, the third comes at once.
    third = edge.offer(epoch_of(3, 190.0, unreachable=True), enforce=True)
    assert third["operators"][0]["decided"] == 3, third


def test_sim_actuator_changes_instance_counts():
    sc = overloaded()
    policy = DschedPolicy(max_parallelism=4)
    sim = ClusterSim(sc, max_parallelism=4)
    policy.setup(sim)
    try:
        act = SimParallelism(sim, policy.agents)
        key = OperatorKey("gold0", "op1")
        out = act.apply([ParallelismChange(key, 1, 3, "test")])
        assert out == {key: None} and sim.op_k[1] == 3 and sim.active[sim.slots_of(1)].sum() == 3
        out = act.apply([ParallelismChange(key, 3, 2, "test")])
        assert out == {key: None} and sim.op_k[1] == 2
        out = act.apply([ParallelismChange(key, 2, 9, "test")])
        assert "1 to 4" in out[key] and sim.op_k[1] == 2
        out = act.apply([ParallelismChange(OperatorKey("nope", "x"), 1, 2, "test")])
        assert out[OperatorKey("nope", "x")] is not None
        assert (act.raised, act.lowered) == (1, 1)
    finally:
        policy.close()


def test_util_scaler_adds_a_node_under_sustained_high_utilisation():
    sc = elastic(epochs=5, gold_rate=120.0, burst_start=100, burst_end=101, step_seconds=0.1)
    policy = UtilScalerPolicy(cooldown_epochs=1)
    res = run_policy(sc, policy)
    assert policy.added >= 1 and policy.removed == 0
    assert res.conservation["source_arrivals"] > 0


def test_elastic_scenario_in_a_tiny_configuration_writes_its_keys():
    args = argparse.Namespace(
        epochs=4, seed=1, step=0.1, policies="dsched,dsched-fixed,util-scaler"
    )
    doc = run_elastic(args)
    assert set(doc["contenders"]) == set(CONTENDERS)
    for row in doc["contenders"].values():
        assert {
            "gold_violation_ratio",
            "gold_bound",
            "node_epochs",
            "cpu_used_core_seconds",
        } <= set(row)
        assert row["gold_bound"] == 0.01 and row["node_epochs"] >= 4 * 2
        assert np.isfinite(row["cpu_allocated_core_seconds"])
    assert "met" in doc["targets"]


def test_disabled_parallelism_decides_nothing():
    cfg = ParallelismConfig(enabled=False)
    cfg.validate()
    from controller.edges.parallelism import ParallelismEdge

    edge = ParallelismEdge(cfg, max_instance_cores=1.0)
    assert edge.offer(None, enforce=True) == {  # type: ignore[arg-type]
        "enabled": False,
        "actuator": "recommend",
        "operators": [],
    }
