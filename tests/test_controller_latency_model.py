"""The controller's latency model: which queueing model, which criterion, the
inversion of a class's target into a service rate and the violation estimate."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from controller.config import ControllerConfig
from controller.core import Controller
from controller.epoch import EpochInputs, run_epoch
from controller.qos import QosClass, QosConfig, default_qos_classes
from controller.stages.allocation import AppLatencyModel, violation_ratio
from controller.stages.demand import (
    app_latency_models,
    estimate_latency_seconds,
    estimate_violation,
    instance_demands,
    latency_budgets,
    latency_needs,
)
from controller.stages.evaluate import evaluate
from controller.stages.forecast import OperatorForecast
from dsched.config import ConfigError, from_dict
from dsched.ids import OperatorKey
from predict.queueing import (
    DEFAULT_WAIT_MODEL,
    WAIT_MODELS,
    allen_cunneen_wait,
    min_service_rate_for_sojourn_many,
    min_service_rate_for_sojourn_quantile_many,
    sojourn_exceedance_many,
    sojourn_quantile,
    sojourn_tail,
)
from tests.test_controller_epoch import SyntheticNode
from tests.test_controller_epoch import config as epoch_config
from tests.view_support import operator_view

G_G_M = sorted(set(WAIT_MODELS) - {"kingman"})


# ------------------------------------------------------------------ config
def test_the_controller_defaults_to_the_library_model_and_the_seed_formulation_is_selectable():
    cfg = ControllerConfig()
    assert (cfg.latency_model, cfg.latency_criterion) == (DEFAULT_WAIT_MODEL, "quantile")
    cfg = ControllerConfig(latency_model="allen-cunneen", latency_criterion="mean")
    cfg.validate()


@pytest.mark.parametrize("name", G_G_M)
def test_every_many_server_model_is_accepted(name, tmp_path):
    from_dict(ControllerConfig, {"latency_model": name, "state_dir": str(tmp_path)})


def test_an_unknown_model_stops_startup_naming_the_key_and_the_known_models(tmp_path):
    with pytest.raises(ConfigError) as err:
        from_dict(ControllerConfig, {"latency_model": "m/m/oo", "state_dir": str(tmp_path)})
    assert err.value.key == "latency_model"
    for name in WAIT_MODELS:
        assert name in str(err.value)


def test_kingman_is_refused_because_operators_run_several_instances(tmp_path):
    with pytest.raises(ConfigError, match="one-server") as err:
        from_dict(ControllerConfig, {"latency_model": "kingman", "state_dir": str(tmp_path)})
    assert err.value.key == "latency_model"


def test_an_unknown_criterion_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="quantile, mean") as err:
        from_dict(ControllerConfig, {"latency_criterion": "p99", "state_dir": str(tmp_path)})
    assert err.value.key == "latency_criterion"


# ------------------------------------------------------------------ queueing additions
@pytest.mark.parametrize("model", G_G_M)
def test_sojourn_exceedance_many_is_the_checked_tail(model):
    rng = np.random.default_rng(1)
    n = 64
    m = rng.integers(1, 9, n).astype(float)
    mu = rng.uniform(0.5, 5.0, n)
    lam = m * mu * rng.uniform(0.0, 1.2, n)  # some unstable
    t = rng.uniform(0.0, 4.0, n)
    ca2, cs2 = rng.uniform(0.25, 2.0, n), rng.uniform(0.25, 2.0, n)
    got = sojourn_exceedance_many(model, t, lam, mu, m, ca2, cs2)
    want = sojourn_tail(model, t, lam, mu, m, ca2, cs2)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=0)
    assert np.all(got[lam >= m * mu] == 1.0)


def test_a_coarse_rate_tolerance_stays_feasible_and_close():
    rng = np.random.default_rng(2)
    n = 200
    q = rng.choice([0.5, 0.9, 0.99], n)
    t = rng.uniform(0.01, 0.2, n)
    lam = rng.uniform(1.0, 2000.0, n)
    m = rng.integers(1, 12, n).astype(float)
    fine = min_service_rate_for_sojourn_quantile_many(q, t, lam, m)
    coarse = min_service_rate_for_sojourn_quantile_many(q, t, lam, m, rtol=1e-4)
    assert np.all(coarse >= fine * (1 - 1e-9)) and np.all(coarse <= fine * (1 + 2e-4))
    tail = sojourn_exceedance_many(DEFAULT_WAIT_MODEL, t, lam, coarse, m, 1.0, 1.0)
    assert np.all(tail <= 1 - q + 1e-9)
    with pytest.raises(ValueError, match="rtol"):
        min_service_rate_for_sojourn_quantile_many(q, t, lam, m, rtol=0.0)


# ------------------------------------------------------------------ the controller's functions
def one_operator(rate: float, kappa: float, instances: int, app: str = "a"):
    key = OperatorKey(app, "op")
    view = operator_view(
        key,
        np.full(3, rate),
        instances=instances,
        emitted=np.zeros(3),
        cpu_seconds=np.full(3, rate * kappa),
        last_timestamp=3.0,
    )
    fc = OperatorForecast(key, rate, "linear_trend", {}, kappa)
    return {key: view}, {key: fc}


def test_the_quantile_need_meets_the_sojourn_quantile_and_rises_as_the_violation_falls():
    views, fcs = one_operator(rate=400.0, kappa=0.002, instances=2)
    key = next(iter(views))
    budgets = {key: 0.02}
    needs = {}
    for v in (0.5, 0.1, 0.01):
        needs[v] = latency_needs(views, fcs, budgets, model="ggm", quantiles={"a": 1 - v})[key]
        mu = needs[v] / 0.002
        assert sojourn_quantile("ggm", 1 - v, 400.0, mu, 2) <= 0.02 * (1 + 1e-6)
        assert sojourn_quantile("ggm", 1 - v, 400.0, mu * (1 - 1e-3), 2) > 0.02
    assert needs[0.5] < needs[0.1] < needs[0.01]


def test_the_mean_criterion_with_allen_cunneen_is_the_old_inversion():
    views, fcs = one_operator(rate=400.0, kappa=0.002, instances=3)
    key = next(iter(views))
    got = latency_needs(views, fcs, {key: 0.03}, 1.0, 1.3)[key]
    mu = min_service_rate_for_sojourn_many(np.array([0.03]), np.array([400.0]), 3.0, 1.0, 1.3)
    assert got == float(mu[0]) * 0.002
    assert allen_cunneen_wait(400.0, got / 0.002, 3, 1.0, 1.3) + 0.002 / got == pytest.approx(0.03)


@pytest.mark.parametrize("model", G_G_M)
def test_the_violation_estimate_is_the_tail_in_0_1_and_falls_with_the_caps(model):
    views, fcs = one_operator(rate=400.0, kappa=0.002, instances=2)
    key = next(iter(views))
    inst = views[key].instances
    budgets = {key: 0.01}
    previous = 1.0
    for cores in (0.42, 0.45, 0.5, 0.6, 0.8, 1.0):
        caps = dict.fromkeys(inst, cores)
        v = estimate_violation(views, fcs, caps, budgets, model=model)["a"]
        assert 0 < v < 1
        assert v <= previous
        previous = v
        assert v == pytest.approx(sojourn_tail(model, 0.01, 400.0, cores / 0.002, 2), rel=1e-12)
    # Caps that cannot keep up: certain violation.
    assert estimate_violation(views, fcs, dict.fromkeys(inst, 0.3), budgets, model=model)["a"] == 1


def test_caps_at_the_quantile_need_predict_at_most_the_allowed_violation():
    views, fcs = one_operator(rate=900.0, kappa=0.001, instances=3)
    key = next(iter(views))
    budgets = {key: 0.005}
    for v in (0.01, 0.1, 0.5):
        need = latency_needs(views, fcs, budgets, model="ggm", quantiles={"a": 1 - v})[key]
        caps = dict.fromkeys(views[key].instances, need)
        got = estimate_violation(views, fcs, caps, budgets, max_instance_cores=10, model="ggm")
        assert got["a"] == pytest.approx(v, rel=1e-3) and got["a"] <= v + 1e-9


def test_the_dp_latency_values_use_the_tail_and_never_rise_with_more_cpu():
    model = AppLatencyModel(
        arrival_rate=np.array([300.0, 1500.0]),
        instances=np.array([1.0, 3.0]),
        kappa=np.array([0.0002, 0.001]),
        share=np.array([0.2, 0.8]),
        parents=((), (0,)),
        floor_cores=np.array([0.05, 0.15]),
        model="ggm",
        budgets=np.array([0.02, 0.08]),
    )
    grants = np.linspace(0.0, 3.0, 61)
    v = model.violation(grants, 0.1)
    assert np.all((v >= 0) & (v <= 1)) and v[0] == 1.0 and 0 < v[-1] < 0.01
    assert np.all(np.diff(v) <= 1e-12)
    # Without budgets: the exponential tail of the mean, as before.
    old = replace(model, model="allen-cunneen", budgets=None)
    np.testing.assert_array_equal(
        old.violation(grants, 0.1), violation_ratio(old.latency_seconds(grants), 0.1)
    )


# ------------------------------------------------------------------ the old behaviour
def old_epoch_parts(views, forecasts, classes, cfg, caps):
    """The epoch's demand and estimates as the controller computed them before the
    latency model was configurable: Allen–Cunneen mean sojourn within each budget,
    latency estimates by Allen–Cunneen, violation from an exponential tail."""
    budgets = latency_budgets(views, forecasts, {a: c.target_seconds for a, c in classes.items()})
    keys = [
        k
        for k in views
        if k in budgets and forecasts[k].kappa > 0 and forecasts[k].rate > 0 and views[k].instances
    ]
    mu = min_service_rate_for_sojourn_many(
        np.array([budgets[k] for k in keys]),
        np.array([forecasts[k].rate for k in keys]),
        np.array([len(views[k].instances) for k in keys], dtype=float),
        cfg.arrival_scv,
        cfg.service_scv,
    )
    kappa = np.array([forecasts[k].kappa for k in keys])
    needs = dict(zip(keys, (mu * kappa).tolist(), strict=True))
    demands = instance_demands(
        views,
        forecasts,
        needs,
        cfg.max_instance_cores,
        drain_seconds=cfg.backlog_drain_slots * cfg.slot_seconds,
        floor_cores=cfg.min_cap_cores,
    )
    estimates = estimate_latency_seconds(
        views, forecasts, caps, cfg.arrival_scv, cfg.service_scv, cfg.max_instance_cores
    )
    violation = {
        a: float(violation_ratio([estimates[a]], classes[a].target_seconds)[0]) for a in estimates
    }
    return demands, estimates, violation


@pytest.mark.parametrize("dp_value", ["covered", "latency"])
def test_allen_cunneen_mean_and_point_forecasts_reproduce_the_old_decisions(tmp_path, dp_value):
    classes = {
        "gold": QosClass("gold", 100.0, 0.01, 8.0, 0.5),
        "bronze": QosClass("bronze", 2000.0, 0.5, 1.0, 0.5),
    }
    cfg = epoch_config(
        tmp_path,
        latency_model="allen-cunneen",
        latency_criterion="mean",
        dp_value=dp_value,
        arrival_scv=1.2,
        qos=QosConfig(default_class="bronze", classes=classes),
    )
    clock = [1_000_000.0]
    c = Controller(cfg, clock=lambda: clock[0])
    c.set_qos("gold-wc", "gold")
    node = SyntheticNode(c)
    rng = np.random.default_rng(5)
    for _ in range(8):
        clock[0] += 1.0
        node.report(clock[0], {"gold-wc": rng.uniform(150, 300), "bronze-wc": 250.0})
        c.run_epoch()
    views = evaluate(c.cluster, cfg.phi)
    apps = ("bronze-wc", "gold-wc")
    inputs = EpochInputs(
        c.epoch + 1, clock[0], views, {a: c.qos.class_of(a) for a in apps}, c.node_capacity()
    )
    result = run_epoch(inputs, c.memory.view(), cfg, c.allocator)
    forecasts = {k: replace(f, sized_rate=None, quantile=0.5) for k, f in result.forecasts.items()}
    assert all(f.demand_rate == f.rate for f in result.forecasts.values())
    caps = {k: cap for k, (_, cap) in result.caps.items()}
    demands, estimates, violation = old_epoch_parts(views, forecasts, inputs.classes, cfg, caps)
    assert result.demands == demands
    assert result.estimates == estimates
    assert result.predicted_violation == violation
    if dp_value == "latency":
        # The allocator saw the old latency model.
        models = app_latency_models(
            views, forecasts, demands, cfg.min_cap_cores, cfg.arrival_scv, cfg.service_scv
        )
        want = c.allocator.allocate(demands, c.node_capacity(), inputs.classes, models)
        assert result.alloc.cores == want.cores
    c.stop()


def test_the_record_names_the_model_and_the_quantiles(tmp_path):
    classes = default_qos_classes()
    classes["gold"] = QosClass("gold", 100.0, 0.01, 8.0, 0.99)
    cfg = epoch_config(
        tmp_path,
        node_capacity_cores={"n1": 4.0},
        qos=QosConfig("bronze", classes),
        latency_model=DEFAULT_WAIT_MODEL,
        latency_criterion="quantile",
    )
    clock = [1_000_000.0]
    c = Controller(cfg, clock=lambda: clock[0])
    c.set_qos("gold-wc", "gold")
    node = SyntheticNode(c)
    for _ in range(4):
        clock[0] += 1.0
        node.report(clock[0], {"gold-wc": 200.0, "bronze-wc": 200.0})
        rec = c.run_epoch()
    sizing = rec["sizing"]
    assert sizing["latency_model"] == DEFAULT_WAIT_MODEL
    assert sizing["latency_criterion"] == "quantile"
    by_app = {a["app"]: a for a in sizing["apps"]}
    assert by_app["gold-wc"]["sojourn_quantile"] == pytest.approx(0.99)
    assert by_app["gold-wc"]["forecast_quantile"] == 0.99
    assert by_app["bronze-wc"]["forecast_quantile"] == 0.5
    assert len(sizing["operators"]) == len(rec["operators"])
    for row, op in zip(sizing["operators"], rec["operators"], strict=True):
        assert (row["app"], row["operator"]) == (op["app"], op["operator"])
        assert row["point_rate"] == op["predicted_rate"]
        assert row["sized_rate"] >= row["point_rate"]
    for app in rec["apps"]:
        assert 0 <= app["predicted_violation_ratio"] <= 1
        assert math.isfinite(app["latency_estimate_ms"])
    c.stop()


def test_nearly_deterministic_service_gives_a_finite_tail():
    # A huge gamma shape overflowed the closed form into inf * 0 (NaN).
    x = sojourn_exceedance_many("ggm", 0.99998, 0.5, 1.0, 1.0, 0.0, 6.103515625e-05)
    assert 0 <= float(x) <= 1
    assert sojourn_quantile("ggm", 0.5, 0.5, 1.0, 1, 0.0, 6.103515625e-05) == pytest.approx(
        1.0, rel=1e-3
    )
