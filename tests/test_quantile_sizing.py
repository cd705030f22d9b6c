"""Demand sized at each QoS class's forecast quantile: the conformal bank in the
controller's memory, the sized rates, and what they do to a gold app's demand."""

from __future__ import annotations

import numpy as np
import pytest

from controller.config import ControllerConfig
from controller.core import Controller
from controller.epoch import EpochInputs, run_epoch
from controller.memory import ControllerMemory
from controller.qos import QosClass, QosConfig, default_qos_classes
from controller.record import explain_lines
from controller.stages.evaluate import evaluate
from controller.stages.forecast import OperatorForecast, size_forecasts
from dsched.config import ConfigError, from_dict
from dsched.ids import OperatorKey
from predict.intervals import ConformalBank, conformal_offset
from tests.test_controller_epoch import SyntheticNode
from tests.test_controller_epoch import config as epoch_config


# ------------------------------------------------------------------ config
def test_default_classes_size_higher_the_more_a_violation_costs():
    classes = default_qos_classes()
    assert {n: c.forecast_quantile for n, c in classes.items()} == {
        "gold": 0.9,
        "silver": 0.75,
        "bronze": 0.5,
    }
    # A class table that does not say sizes at the point forecast.
    assert QosClass("mine").forecast_quantile == 0.5
    assert QosClass("gold", 100.0, 0.01, 8.0, 0.99).forecast_quantile == 0.99


@pytest.mark.parametrize("bad", [0.3, 1.0, 1.5, float("nan")])
def test_a_forecast_quantile_outside_half_to_one_stops_startup(bad, tmp_path):
    data = {
        "state_dir": str(tmp_path),
        "qos": {"classes": {"gold": {"forecast_quantile": bad}}, "default_class": "gold"},
    }
    with pytest.raises(ConfigError) as err:
        from_dict(ControllerConfig, data)
    assert err.value.key == "qos.classes.gold.forecast_quantile"


# ------------------------------------------------------------------ size_forecasts
def forecasts(rates: dict[str, float]) -> dict[OperatorKey, OperatorForecast]:
    out = {}
    for name, rate in rates.items():
        key = OperatorKey("a", name)
        out[key] = OperatorForecast(key, rate, "linear_trend", {}, 0.001)
    return out


def test_the_median_or_no_history_is_the_point_forecast():
    fcs = forecasts({"x": 100.0, "y": 50.0})
    q = dict.fromkeys(fcs, 0.99)
    for sized in (
        size_forecasts(fcs, dict.fromkeys(fcs, 0.5), ConformalBank(levels=[0.99])),
        size_forecasts(fcs, q, None),
        size_forecasts(fcs, q, ConformalBank(levels=[0.99])),
    ):
        assert all(f.demand_rate == f.rate for f in sized.values())


def test_sized_rates_rise_with_the_quantile_and_never_fall_below_the_point():
    fcs = forecasts({"x": 100.0, "y": 50.0})
    keys = list(fcs)
    bank = ConformalBank(levels=[0.9, 0.99])
    rng = np.random.default_rng(0)
    for _ in range(150):
        bank.update(keys, 100 + rng.normal(0, 20, 2), 100.0)
    sized = {q: size_forecasts(fcs, dict.fromkeys(fcs, q), bank) for q in (0.5, 0.6, 0.9, 0.99)}
    for k in keys:
        rates = [sized[q][k].demand_rate for q in (0.5, 0.6, 0.9, 0.99)]
        assert rates[0] == fcs[k].rate
        assert all(b >= a for a, b in zip(rates, rates[1:], strict=False))
        assert rates[-1] > fcs[k].rate + 20  # about two standard deviations above
        assert sized[0.99][k].quantile == 0.99 and sized[0.99][k].rate == fcs[k].rate


def test_with_the_median_a_half_quantile_is_the_point_plus_the_median_error():
    fcs = forecasts({"x": 100.0, "y": 50.0, "z": 80.0})
    x, y, z = fcs
    bank = ConformalBank(levels=[0.9])
    for i in range(12):
        bank.update([x, y], [100.0 - 20.0 - i % 3, 50.0 + 5.0], [100.0, 50.0])
    bank.update([z], 0.0, 80.0)  # one error: cold
    halves = dict.fromkeys(fcs, 0.5)
    sized = size_forecasts(fcs, halves, bank, median=True)
    assert sized[x].demand_rate == 100.0 + conformal_offset(bank.scores(x), 0.5) == 79.0
    assert sized[y].demand_rate == 55.0 and sized[y].quantile == 0.5
    assert sized[z].demand_rate == 80.0
    # Off, or a class above the median: as before.
    assert all(f.demand_rate == f.rate for f in size_forecasts(fcs, halves, bank).values())
    upper = size_forecasts(fcs, {x: 0.9, y: 0.5, z: 0.5}, bank, median=True)
    assert upper[x].demand_rate == bank.upper([x], 100.0, 0.9)[0] == 100.0  # never below
    assert upper[y].demand_rate == 55.0


def median_run(tmp_path, median: str, epochs: int = 60) -> list[dict]:
    """A bronze app whose arrivals are drawn afresh each slot, forecast by the max
    of the trend and the last slot: a rule that over-forecasts by design."""
    cfg = epoch_config(
        tmp_path / median,
        node_capacity_cores={"n1": 8.0},
        predictors=["linear_trend", "last_value", "dag"],
        forecast_median=median,
    )
    clock = [1_000_000.0]
    c = Controller(cfg, clock=lambda: clock[0])
    node = SyntheticNode(c, cores=8.0)
    rng = np.random.default_rng(5)
    records = []
    for _ in range(epochs):
        clock[0] += 1.0
        node.report(clock[0], {"wc": float(rng.uniform(100, 400))})
        records.append(c.run_epoch())
    c.stop()
    return [r for r in records if r["operators"]]


def test_the_median_brings_an_over_forecast_back_to_half_the_slots(tmp_path):
    def split(rows, field):
        return np.array([next(o[field] for o in row if o["operator"] == "split") for row in rows])

    share, sized_mean = {}, {}
    for median in ("on", "off"):
        records = median_run(tmp_path, median)
        sizing = [r["sizing"]["operators"] for r in records]
        sized, point = split(sizing, "sized_rate"), split(sizing, "point_rate")
        arrived = split([r["operators"] for r in records], "arrival_rate")
        # Ten errors before the median moves anything.
        np.testing.assert_array_equal(sized[:10], point[:10])
        warm = slice(15, -1)
        share[median] = float(np.mean(arrived[16:] > sized[warm]))
        sized_mean[median] = float(np.mean(sized[warm] / point[warm]))
    assert share["off"] < 0.45 and 0.45 <= share["on"] <= 0.6
    assert sized_mean["off"] == 1.0 and sized_mean["on"] < 0.95


# ------------------------------------------------------------------ the controller
def gold_run(tmp_path, quantile: float, epochs: int = 14, **settings):
    classes = {
        "gold": QosClass("gold", 100.0, 0.01, 8.0, quantile),
        "bronze": QosClass("bronze", 2000.0, 0.5, 1.0, 0.5),
    }
    cfg = epoch_config(
        tmp_path / f"q{quantile}",
        node_capacity_cores={"n1": 8.0},
        qos=QosConfig(default_class="bronze", classes=classes),
        **settings,
    )
    clock = [1_000_000.0]
    c = Controller(cfg, clock=lambda: clock[0])
    c.set_qos("gold-wc", "gold")
    node = SyntheticNode(c, cores=8.0)
    rng = np.random.default_rng(11)
    records = []
    for _ in range(epochs):
        clock[0] += 1.0
        node.report(clock[0], {"gold-wc": float(rng.uniform(100, 400)), "bronze-wc": 200.0})
        records.append(c.run_epoch())
    return c, records


def test_a_gold_apps_demand_rises_with_its_forecast_quantile(tmp_path):
    demand = {}
    for q in (0.5, 0.9, 0.99):
        # Without the median a 0.5 quantile is the point forecast itself.
        c, records = gold_run(tmp_path, q, forecast_median="off")
        rec = records[-1]
        demand[q] = next(a["demand_cores"] for a in rec["apps"] if a["app"] == "gold-wc")
        sizing = [o for o in rec["sizing"]["operators"] if o["app"] == "gold-wc"]
        if q == 0.5:
            assert all(o["sized_rate"] == o["point_rate"] for o in sizing)
        else:
            assert all(o["sized_rate"] >= o["point_rate"] for o in sizing)
            assert any(o["sized_rate"] > o["point_rate"] for o in sizing)
        # Bronze stays at its point forecast whatever gold does.
        bronze = [o for o in rec["sizing"]["operators"] if o["app"] == "bronze-wc"]
        assert all(o["sized_rate"] == o["point_rate"] for o in bronze)
        lines = explain_lines("gold-wc", [rec])
        assert any(f"sized for the {q:g} forecast quantile" in line for line in lines)
        c.stop()
    assert demand[0.5] < demand[0.9] <= demand[0.99]


def test_the_memory_scores_each_forecast_once_and_forgets_vanished_operators(tmp_path):
    c, records = gold_run(tmp_path, 0.99, epochs=6)
    bank = c.memory.forecast_bank
    assert bank is not None and tuple(bank.levels.tolist()) == (0.99,)
    keys = [OperatorKey(app, op) for app in ("gold-wc", "bronze-wc") for op in ("source", "split")]
    records = [r for r in records if r["operators"]]  # the first report only sets baselines
    assert len(records) >= 4
    # The first epoch with operators only forecasts; each later one scores the
    # slot the one before predicted.
    n = len(records) - 1
    assert bank.count(keys).tolist() == [n] * len(keys)
    # An epoch without a new slot scores nothing.
    c.run_epoch()
    assert bank.count(keys).tolist() == [n] * len(keys)
    # Scores are the point forecasts' errors: actual - forecast.
    src = OperatorKey("gold-wc", "source")
    point = [
        next(
            o["point_rate"]
            for o in r["sizing"]["operators"]
            if (o["app"], o["operator"]) == ("gold-wc", "source")
        )
        for r in records
    ]
    actual = [
        next(
            o["arrival_rate"]
            for o in r["operators"]
            if (o["app"], o["operator"]) == ("gold-wc", "source")
        )
        for r in records
    ]
    np.testing.assert_allclose(
        bank.scores(src), np.array(actual[1:]) - np.array(point[:-1]), rtol=1e-12
    )
    memory: ControllerMemory = c.memory
    assert {k.app for k in memory.last_forecast} == {"gold-wc", "bronze-wc"}
    c.stop()


def test_forgetting_follows_the_views(tmp_path):
    c, _ = gold_run(tmp_path, 0.99, epochs=4)
    views = {k: v for k, v in evaluate(c.cluster, c.config.phi).items() if k.app == "gold-wc"}
    inputs = EpochInputs(
        c.epoch + 1, 2_000_000.0, views, {"gold-wc": c.qos.class_of("gold-wc")}, c.node_capacity()
    )
    c.memory.update(run_epoch(inputs, c.memory.view(), c.config, c.allocator))
    assert {k.app for k in c.memory.last_forecast} == {"gold-wc"}
    bank = c.memory.forecast_bank
    assert len(bank) == len(views) and all(k in bank for k in views)
    c.stop()
