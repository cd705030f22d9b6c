"""The controller's epoch in process: reports in (the same NodeReport messages an
agent or the simulator sends), QoS-weighted caps out, decision record, restart."""

from __future__ import annotations

import math

import grpc
import numpy as np
import pytest

from controller.config import ControllerConfig
from controller.core import Controller
from controller.ctl import main as ctl_main
from controller.edges.server import serve
from controller.edges.store import StateStore
from controller.model import InstanceKey, OperatorKey
from controller.qos import QosClass, QosConfig
from controller.stages.demand import (
    RateDemand,
    WithLatencyTarget,
    critical_path_weights,
    latency_budgets,
    latency_needs,
)
from controller.stages.evaluate import evaluate
from controller.stages.forecast import forecast
from dsched.config import ConfigError
from dsched_pb import dsched_pb2 as pb
from dsched_pb import dsched_pb2_grpc as pb_grpc
from predict.queueing import allen_cunneen_wait

# WordCount-like: CPU-seconds per tuple and tuples emitted per tuple executed.
OPS = (
    ("source", (), 0.0002, 1),
    ("split", ("source",), 0.001, 5),
    ("count", ("split",), 0.0003, 0),
)


class SyntheticNode:
    """Cumulative counters of WordCount-shaped apps on one node, as an agent reports them."""

    def __init__(self, controller: Controller, node: str = "n1", cores: float = 2.0):
        self.controller, self.node, self.slot = controller, node, 0
        self.totals: dict[tuple, dict] = {}
        controller.on_hello(pb.Hello(node_id=node, cpu_capacity_cores=cores, slot_seconds=1.0))

    def report(self, now: float, rates: dict[str, float], latency_s: float = 0.02) -> None:
        samples = []
        for app, rate in rates.items():
            arriving = rate
            for op, up, kappa, fanout in OPS:
                t = self.totals.setdefault((app, op), {"n": 0, "cpu": 0.0, "lat": 0.0, "done": 0})
                t["n"] += int(arriving)
                t["cpu"] += arriving * kappa
                if not fanout:  # the sink completes root tuples
                    t["lat"] += latency_s * rate
                    t["done"] += int(rate)
                samples.append(
                    pb.InstanceSample(
                        key=pb.InstanceKey(app=app, operator=op, instance=0),
                        upstream=list(up),
                        received_total=t["n"],
                        executed_total=t["n"],
                        emitted_total=t["n"] * fanout,
                        cpu_seconds_total=t["cpu"],
                        latency_sum_seconds_total=t["lat"],
                        latency_count_total=t["done"],
                        service_seconds_total=t["cpu"],
                    )
                )
                arriving *= fanout or 1
        self.slot += 1
        self.controller.on_report(
            pb.NodeReport(
                node_id=self.node,
                slot=self.slot,
                timestamp=now,
                slot_seconds=1.0,
                instances=samples,
            )
        )


def config(tmp_path, **kw) -> ControllerConfig:
    base = dict(
        state_dir=tmp_path / "state",
        slot_seconds=1.0,
        node_capacity_cores={"n1": 1.0},
        theta_cores=0.05,
        headroom_cores=0.1,
        predictors=["linear_trend", "dag"],
        qos=QosConfig(
            default_class="bronze",
            classes={
                "gold": QosClass("gold", 100.0, 0.01, 8.0),
                "bronze": QosClass("bronze", 2000.0, 0.5, 1.0),
            },
        ),
    )
    base.update(kw)
    cfg = ControllerConfig(**base)
    cfg.validate()
    return cfg


def run(controller, node, clock, epochs, rates):
    rec = None
    for _ in range(epochs):
        clock[0] += 1.0
        node.report(clock[0], rates)
        rec = controller.run_epoch()
    return rec


def views_after(tmp_path, epochs: int, rates: dict[str, float]):
    """A controller fed ``epochs`` slots of ``rates`` by a SyntheticNode, and the
    views over its last 5 slots."""
    clock = [1_000_000.0]
    c = Controller(config(tmp_path), clock=lambda: clock[0])
    run(c, SyntheticNode(c), clock, epochs, rates)
    return c, evaluate(c.cluster, 5)


@pytest.fixture
def clock():
    return [1_000_000.0]


def test_gold_keeps_its_demand_and_bronze_absorbs_the_shortfall(tmp_path, clock):
    # The mean criterion: gold's 99th percentile (the default) needs more than this
    # one-core node can give it beside bronze's floors.
    c = Controller(config(tmp_path, latency_criterion="mean"), clock=lambda: clock[0])
    c.set_qos("gold-wc", "gold")
    node = SyntheticNode(c)
    rec = run(c, node, clock, 6, {"gold-wc": 250.0, "bronze-wc": 250.0})
    apps = {a["app"]: a for a in rec["apps"]}
    gold, bronze = apps["gold-wc"], apps["bronze-wc"]
    assert (gold["class"], bronze["class"]) == ("gold", "bronze")
    assert gold["allocated_cores"] == pytest.approx(gold["demand_cores"])
    assert bronze["cut_cores"] > 0.3 and gold["cut_cores"] == 0
    assert gold["cap_cores"] >= gold["demand_cores"] - 1e-9
    caps = sum(i["cap_cores"] for i in rec["instances"])
    assert caps <= 1.0 - 0.1 + 1e-9  # node capacity override minus headroom
    assert (
        rec["dp"]["solved"] and rec["cuts"] and all(c_["app"] == "bronze-wc" for c_ in rec["cuts"])
    )
    assert math.isfinite(gold["latency_estimate_ms"]) and gold["latency_estimate_ms"] < 100
    # The contract keys others read.
    for key in (
        "app",
        "operator",
        "instances",
        "arrival_rate",
        "predicted_rate",
        "predictor",
        "cap_cores",
        "usage_cores",
        "demand_cores",
        "queue",
        "latency_ms",
        "reason",
    ):
        assert key in rec["operators"][0]
    for key in (
        "app",
        "operator",
        "instance",
        "node",
        "demand_cores",
        "demand_reason",
        "backlog_cores",
        "allocated_cores",
        "cap_cores",
        "usage_cores",
        "cap_in_force",
        "throttled_seconds",
        "queue",
        "arrival_share",
    ):
        assert key in rec["instances"][0]
    c.stop()


def test_demand_allocator_ignores_classes(tmp_path, clock):
    c = Controller(config(tmp_path, allocator="demand"), clock=lambda: clock[0])
    c.set_qos("gold-wc", "gold")
    rec = run(c, SyntheticNode(c), clock, 5, {"gold-wc": 250.0, "bronze-wc": 250.0})
    apps = {a["app"]: a for a in rec["apps"]}
    # Proportional scaling cuts both apps by the same ratio.
    ratio = {a: r["allocated_cores"] / r["demand_cores"] for a, r in apps.items()}
    assert ratio["gold-wc"] == pytest.approx(ratio["bronze-wc"], rel=1e-6) and ratio["gold-wc"] < 1
    c.stop()


def test_enough_cpu_gives_every_demand_and_recommends_removing_a_node(tmp_path, clock):
    c = Controller(config(tmp_path, node_capacity_cores={}, node_cost=0.5), clock=lambda: clock[0])
    SyntheticNode(c, "n2", cores=8.0)
    node = SyntheticNode(c, "n1", cores=8.0)
    rec = run(c, node, clock, 5, {"a": 50.0})
    assert not rec["dp"]["solved"] and not rec["cuts"]
    assert rec["node_recommendation"]["nodes_delta"] == -1
    c.stop()


def test_restart_keeps_caps_in_its_first_epoch(tmp_path, clock):
    cfg = config(tmp_path)
    c = Controller(cfg, clock=lambda: clock[0])
    c.set_qos("gold-wc", "gold")
    node = SyntheticNode(c)
    rates = {"gold-wc": 200.0, "bronze-wc": 200.0}
    before = run(c, node, clock, 6, rates)
    caps_before = {
        (i["app"], i["operator"], i["instance"]): i["cap_cores"] for i in before["instances"]
    }
    c.store.close()  # the process dies; nothing else is saved
    c2 = Controller(cfg, store=StateStore(cfg.state_dir), clock=lambda: clock[0])
    assert c2.qos.class_name_of("gold-wc") == "gold"
    assert c2.epoch == before["epoch"]
    node2 = SyntheticNode(c2)
    node2.totals = node.totals
    changed = []
    for _ in range(4):
        clock[0] += 1.0
        node2.report(clock[0], rates)
        rec = c2.run_epoch()
        if rec["instances"]:
            caps = {
                (i["app"], i["operator"], i["instance"]): i["cap_cores"] for i in rec["instances"]
            }
            changed = {k for k in caps if caps[k] != pytest.approx(caps_before[k])}
            break
    assert rec["instances"], "no epoch with data after the restart"
    assert not changed, f"caps moved after restart: {changed}"
    # Caps of instances that had not reported again were held, not dropped.
    assert len(c2.store.load_caps()) == len(caps_before)
    c2.stop()


def test_dry_run_sends_nothing_enforce_sends_caps(tmp_path, clock):
    sent = []
    for mode in ("dry-run", "enforce"):
        c = Controller(config(tmp_path / mode, mode=mode), clock=lambda: clock[0])
        node = SyntheticNode(c)
        c.sessions.attach("n1", sent.append)
        before = len(sent)
        rec = run(c, node, clock, 4, {"x": 100.0})
        assert rec["instances"]
        assert (len(sent) > before) == (mode == "enforce")
        c.stop()


def test_latency_budgets_split_the_target_along_the_critical_path(tmp_path, clock):
    weights = critical_path_weights(
        {"a": (), "b": ("a",), "c": ("a",), "d": ("b", "c")},
        {"a": 1.0, "b": 5.0, "c": 1.0, "d": 2.0},
    )
    assert weights == {"a": 8.0, "b": 8.0, "c": 4.0, "d": 8.0}
    c = Controller(config(tmp_path), clock=lambda: clock[0])
    node = SyntheticNode(c)
    run(c, node, clock, 4, {"x": 200.0})
    views = evaluate(c.cluster, 5)
    fcs = forecast(views, 5).forecasts
    budgets = latency_budgets(views, fcs, {"x": 0.05})
    assert sum(budgets.values()) == pytest.approx(0.05)  # one chain: all on the critical path
    est = WithLatencyTarget(RateDemand(), latency_needs(views, fcs, budgets))
    for op, v in views.items():
        d = est.estimate(v, fcs[op])[InstanceKey("x", op.operator, 0)]
        rate_only = RateDemand().estimate(v, fcs[op])[InstanceKey("x", op.operator, 0)]
        assert d.cores >= rate_only.cores  # the rate demand is the floor
        mu = d.cores / fcs[op].kappa
        sojourn = allen_cunneen_wait(fcs[op].rate, mu, 1, 1.0, 1.0) + 1 / mu
        assert sojourn <= budgets[op] * (1 + 1e-6)
        # A hair less CPU would miss the budget: the cap is the smallest.
        mu_less = 0.999 * mu
        assert allen_cunneen_wait(fcs[op].rate, mu_less, 1, 1.0, 1.0) + 1 / mu_less > budgets[op]
    assert OperatorKey("x", "split") in budgets
    c.stop()


@pytest.fixture
def served(tmp_path, clock):
    c = Controller(config(tmp_path), clock=lambda: clock[0])
    server = serve(c, "127.0.0.1:0", f"unix:{tmp_path}/admin.sock")
    address = server.admin_address
    channel = grpc.insecure_channel(address)
    yield c, pb_grpc.AdminServiceStub(channel), address
    channel.close()
    server.stop(0)
    c.stop()


def test_qos_over_grpc_and_dschedctl(served, clock, capsys):
    c, stub, address = served
    node = SyntheticNode(c)
    # A class for an app not seen yet is held.
    r = stub.SetQos(pb.SetQosRequest(app="gold-wc", qos_class="gold"), timeout=5)
    assert not r.app_known
    with pytest.raises(grpc.RpcError) as err:
        stub.SetQos(pb.SetQosRequest(app="gold-wc", qos_class="platinum"), timeout=5)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "platinum" in err.value.details() and "gold" in err.value.details()
    with pytest.raises(grpc.RpcError) as err:
        stub.SetQos(pb.SetQosRequest(app="../etc", qos_class="gold"), timeout=5)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    listed = {a.app: a for a in stub.ListQos(pb.ListQosRequest(), timeout=5).assignments}
    assert listed["gold-wc"].qos_class == "gold" and not listed["gold-wc"].app_known
    run(c, node, clock, 5, {"gold-wc": 250.0, "bronze-wc": 250.0})
    listed = {a.app: a for a in stub.ListQos(pb.ListQosRequest(), timeout=5).assignments}
    assert listed["gold-wc"].app_known and not listed["gold-wc"].defaulted
    assert listed["bronze-wc"].qos_class == "bronze" and listed["bronze-wc"].defaulted
    # dschedctl against the same server.
    assert ctl_main(["--address", address, "qos", "set", "bronze-wc", "nope"]) == 1
    assert "unknown QoS class" in capsys.readouterr().err
    assert ctl_main(["--address", address, "qos", "list"]) == 0
    out = capsys.readouterr().out
    assert "gold-wc" in out and "bronze-wc" in out
    assert ctl_main(["--address", address, "plan"]) == 0
    out = capsys.readouterr().out
    assert "applications" in out and "qos-dp" in out
    assert ctl_main(["--address", address, "explain", "bronze-wc", "--epochs", "3"]) == 0
    out = capsys.readouterr().out
    assert out.count("class bronze") == 3 and "cut" in out
    reply = stub.Explain(pb.ExplainRequest(app="nobody", epochs=3), timeout=5)
    assert "no decision" in reply.lines[0]


def test_metrics_carry_the_qos_view(tmp_path, clock):
    c = Controller(config(tmp_path), clock=lambda: clock[0])
    c.set_qos("gold-wc", "gold")
    run(c, SyntheticNode(c), clock, 5, {"gold-wc": 250.0, "bronze-wc": 250.0})
    from prometheus_client import generate_latest

    text = generate_latest(c.metrics.registry).decode()
    for name in (
        'dsched_app_demand_cores{app="gold-wc",class="gold"}',
        'dsched_app_allocated_cores{app="bronze-wc",class="bronze"}',
        'dsched_app_latency_estimate_seconds{app="gold-wc"}',
        "dsched_cluster_node_recommendation",
        "dsched_controller_dp_duration_seconds_count",
    ):
        assert name in text, name
    c.stop()


def test_sources_keep_one_cached_arima_and_first_fits_are_budgeted(tmp_path, clock):
    from collections import deque

    from controller.stages.forecast import SourceHistory

    c = Controller(
        config(tmp_path, predictors=["linear_trend", "dag", "arima"]), clock=lambda: clock[0]
    )
    c.memory.sources = SourceHistory(300, fits_per_epoch=1, order=(1, 0, 0))
    node = SyntheticNode(c)
    rates = {"a": 100.0, "b": 100.0}
    run(c, node, clock, 2, rates)  # the operators exist from the second report on
    for app in rates:
        c.memory.sources.series[OperatorKey(app, "source")] = deque(
            [100.0 + (i % 3) for i in range(30)], maxlen=300
        )
    rec = run(c, node, clock, 2, rates)
    fitted = {k.app for k, m in c.memory.sources.models.items() if m.fitted_order is not None}
    assert fitted == {"a", "b"}  # one first fit per epoch, both done by now
    sources = {o["app"]: o for o in rec["operators"] if o["operator"] == "source"}
    assert all("arima" in o["candidates"] for o in sources.values())
    model = c.memory.sources.models[OperatorKey("a", "source")]
    fits = model.fits
    run(c, node, clock, 2, rates)
    assert model is c.memory.sources.models[OperatorKey("a", "source")] and model.fits == fits
    c.stop()


def test_an_operator_that_processed_nothing_keeps_or_gets_a_cost(tmp_path, clock):
    """No tuple processed in the window is no reason to fail the epoch: an idle
    operator keeps its last cost; a starved one never measured is charged its CPU."""
    c = Controller(config(tmp_path), clock=lambda: clock[0])
    node = SyntheticNode(c)
    run(c, node, clock, 6, {"wc": 50})
    before = {o["operator"]: o["kappa"] for o in c.last_record["operators"]}
    assert before["split"] == pytest.approx(0.001, rel=0.05)
    rec = run(c, node, clock, 6, {"wc": 0})  # idle for longer than phi
    after = {o["operator"]: o["kappa"] for o in rec["operators"]}
    assert after["split"] == pytest.approx(before["split"])
    # An operator seen only while it processed nothing but burnt CPU.
    view = next(v for v in evaluate(c.cluster, 5).values() if v.key.operator == "split")
    view.cpu_seconds[:] = 0.2
    memory: dict = {}
    from controller.stages.forecast import operator_cost

    assert operator_cost(view, 5, memory)[0] == pytest.approx(0.2 * len(view.cpu_seconds))


def test_the_epoch_is_pure_and_the_memory_changes_only_in_update(tmp_path, clock):
    """run_epoch reads the memory and returns a result; the same inputs give the
    same result, and only ControllerMemory.update changes what is remembered."""
    import copy

    from controller.epoch import EpochInputs, run_epoch

    c = Controller(
        config(tmp_path, predictors=["linear_trend", "dag", "arima"]), clock=lambda: clock[0]
    )
    node = SyntheticNode(c)
    run(c, node, clock, 6, {"wc": 80})
    views = evaluate(c.cluster, c.config.phi)
    inputs = EpochInputs(
        c.epoch + 1, clock[0], views, {"wc": c.qos.class_of("wc")}, c.node_capacity()
    )
    before = copy.deepcopy(
        (c.memory.hysteresis, c.memory.caps, c.memory.kappa, c.memory.sources.series)
    )
    first = run_epoch(inputs, c.memory.view(), c.config, c.allocator)
    second = run_epoch(inputs, c.memory.view(), c.config, c.allocator)
    after = (c.memory.hysteresis, c.memory.caps, c.memory.kappa, c.memory.sources.series)
    assert after == before
    assert first.caps == second.caps and first.steps == second.steps
    c.memory.update(first)
    assert c.memory.caps == {**first.caps}
    assert {k: s.state for k, s in first.steps.items()} == c.memory.hysteresis
    with pytest.raises(TypeError):
        c.memory.view().hysteresis[next(iter(first.caps))] = None  # read-only
    c.stop()


def _source_forecast_errors(tmp_path, clock, predictors, rates):
    """Drive one app's source through ``rates`` (one per epoch); return, per epoch,
    (predicted source rate for the next slot, winning predictor)."""
    c = Controller(config(tmp_path, predictors=predictors), clock=lambda: clock[0])
    node = SyntheticNode(c)
    out = []
    for rate in rates:
        rec = run(c, node, clock, 1, {"a": float(rate)})
        src = [o for o in rec["operators"] if o["operator"] == "source"] if rec else []
        out.append((src[0]["predicted_rate"], src[0]["predictor"]) if src else (None, None))
    c.stop()
    return out


def test_seasonal_predictor_follows_a_periodic_source_and_beats_the_max_rule(tmp_path, clock):
    # A period of 12 slots: the trend's maximum overshoots every turn of the
    # cycle; the seasonal forecast, once it has beaten it for a while, replaces it.
    period, n = 12, 120
    rates = [200.0 + 150.0 * math.sin(2 * math.pi * t / period) for t in range(n)]
    plain = _source_forecast_errors(tmp_path / "plain", [clock[0]], ["linear_trend", "dag"], rates)
    seasonal = _source_forecast_errors(
        tmp_path / "seasonal", [clock[0]], ["linear_trend", "dag", "seasonal"], rates
    )
    tail = range(n - 36, n - 1)  # forecast at epoch t is for the rate of epoch t + 1

    def mae(run_):
        return sum(abs(run_[t][0] - rates[t + 1]) for t in tail) / len(tail)

    assert {seasonal[t][1] for t in tail} == {"seasonal"}
    assert mae(seasonal) < 0.5 * mae(plain), (mae(seasonal), mae(plain))


def test_seasonal_predictor_falls_back_without_a_period(tmp_path, clock):
    import random

    rng = random.Random(7)
    rates = [rng.choice([60.0, 150.0, 300.0]) for _ in range(80)]
    plain = _source_forecast_errors(tmp_path / "plain", [clock[0]], ["linear_trend", "dag"], rates)
    seasonal = _source_forecast_errors(
        tmp_path / "seasonal", [clock[0]], ["linear_trend", "dag", "seasonal"], rates
    )
    used = sum(1 for _, winner in seasonal if winner == "seasonal")
    assert used <= 8, used  # random levels: the seasonal forecast almost never pays
    diff = [abs(a[0] - b[0]) for a, b in zip(plain, seasonal, strict=True) if a[0] is not None]
    assert sum(1 for d in diff if d > 1e-9) == used


def test_kappa_estimator_divides_sums_by_default_and_means_ratios_on_request(tmp_path, clock):
    """A window whose slots processed very different counts for similar CPU: the
    mean of the slots' ratios overstates the cost of a tuple; the ratio of sums
    is the CPU the window spent per tuple it processed."""
    c = Controller(config(tmp_path), clock=lambda: clock[0])
    node = SyntheticNode(c)
    run(c, node, clock, 6, {"wc": 50})
    views = evaluate(c.cluster, 5)
    key = next(k for k in views if k.operator == "split")
    view = views[key]
    view.executed[-5:] = [10.0, 100.0, 10.0, 100.0, 10.0]
    view.cpu_seconds[-5:] = 0.1
    processed = view.executed[-5:] * view.seconds[-5:]
    sums = 0.5 / float(processed.sum())
    ratios = float(np.mean(0.1 / processed))
    assert ControllerConfig().kappa_estimator == "ratio_of_sums"
    got = {
        name: forecast(views, 5, kappa_estimator=name).forecasts[key].kappa
        for name in ("ratio_of_sums", "mean_ratio")
    }
    assert got["ratio_of_sums"] == pytest.approx(sums)
    assert got["mean_ratio"] == pytest.approx(ratios)
    assert got["mean_ratio"] > 2 * got["ratio_of_sums"]
    with pytest.raises(ValueError, match="strategy must be one of"):
        forecast(views, 5, kappa_estimator="median")


class FixedCostNode(SyntheticNode):
    """SyntheticNode whose instances also burn ``fixed`` CPU-seconds every slot,
    whatever they process (their own loop and reporting)."""

    def __init__(self, controller: Controller, fixed: float):
        super().__init__(controller)
        self.fixed = fixed

    def report(self, now: float, rates: dict[str, float], latency_s: float = 0.02) -> None:
        for app in rates:
            for op, *_ in OPS:
                t = self.totals.setdefault((app, op), {"n": 0, "cpu": 0.0, "lat": 0.0, "done": 0})
                t["cpu"] += self.fixed
        super().report(now, rates, latency_s)


def test_marginal_cost_charges_a_step_up_its_tuples_not_the_fixed_cpu_again(tmp_path, clock):
    """Levels that change every few slots, then a step from a quiet window to a busy
    one: the window's cost per tuple carries the quiet window's fixed CPU into
    every tuple of the busy slot; the marginal cost charges the fixed CPU once."""
    rng = np.random.default_rng(3)
    levels = np.repeat(rng.integers(5, 60, 12), 3).tolist() + [8] * 6 + [80]
    costs = {}
    for model in ("proportional", "marginal"):
        clock[0] = 1_000_000.0
        c = Controller(
            config(tmp_path / model, cost_model=model, node_capacity_cores={"n1": 8.0}),
            clock=lambda: clock[0],
        )
        node = FixedCostNode(c, fixed=0.02)
        for rate in levels:
            rec = run(c, node, clock, 1, {"wc": rate})
        c.stop()
        split = next(o for o in rec["operators"] if o["operator"] == "split")
        sized = next(o for o in rec["sizing"]["operators"] if o["operator"] == "split")
        costs[model] = (split["kappa"], sized["window_kappa"], sized["sized_rate"])
    (kp, wp, rate), (km, wm, rate_m) = costs["proportional"], costs["marginal"]
    assert wp is None and wm == pytest.approx(kp)
    assert rate_m == pytest.approx(rate)
    true_cost = 0.02 + 0.001 * rate  # CPU-seconds per second at the sized rate
    assert km * rate == pytest.approx(true_cost, rel=0.05)
    assert kp * rate > 1.3 * true_cost


def test_an_unknown_cost_model_is_refused_by_name():
    with pytest.raises(ConfigError, match="cost_model.*proportional, marginal"):
        ControllerConfig(cost_model="affine").validate()
