"""The controller with its history edge: every slot spooled, and a restarted
controller seeded from the history table a real local Spark job wrote.

These drive a real :class:`controller.core.Controller`, whose ``history`` is a
:class:`controller.edges.history.HistoryEdge` (the edge alone is tested in
tests/test_history_edge.py)."""

from __future__ import annotations

import json

import pytest

from controller.core import Controller
from controller.edges.history import HistoryEdge
from dsched.ids import OperatorKey
from spark_stream import job
from tests.test_controller_epoch import SyntheticNode, config

# Sources keep a long arrival series (for ARIMA) only with the arima predictor.
WITH_ARIMA = ["linear_trend", "dag", "arima"]


@pytest.fixture
def clock():
    return [1_700_000_000.0]


def _drive(c, node, clock, epochs, rate):
    for i in range(epochs):
        clock[0] += 1.0
        # A rate that moves, so the source series is worth fitting.
        node.report(clock[0], {"wc": rate + 10 * (i % 7)})
        c.run_epoch()
        # Epochs here come back to back, not a slot apart: let the spool write
        # each slot, or a busy machine makes it drop some (by design, when
        # writes pile up) and the history comes out shorter.
        assert c.history.flush()


def test_every_slot_is_spooled_with_the_instances_it_saw(tmp_path, clock):
    c = Controller(config(tmp_path), clock=lambda: clock[0])
    node = SyntheticNode(c)
    assert isinstance(c.history, HistoryEdge)
    _drive(c, node, clock, 5, 40)
    assert c.history.flush()
    files = sorted(c.history.config.spool_dir.glob("slot-*.json"))
    # The first report only sets counter baselines: 4 slots carry samples.
    assert len(files) >= 4
    rows = [json.loads(line) for line in files[-1].read_text().splitlines()]
    inst = [r for r in rows if r.get("kind") == "instance" or "operator" in r]
    assert {r["operator"] for r in inst} == {"source", "split", "count"}
    assert all(r["v"] == 1 for r in rows if "v" in r)
    c.stop()


def test_history_can_be_switched_off(tmp_path, clock):
    from spark_stream.config import HistoryConfig

    c = Controller(config(tmp_path, history=HistoryConfig(enabled=False)), clock=lambda: clock[0])
    assert c.history is None
    c.stop()


@pytest.mark.spark
@pytest.mark.slow
def test_a_restarted_controller_is_seeded_from_the_history_table(tmp_path, clock):
    first = Controller(config(tmp_path, predictors=WITH_ARIMA), clock=lambda: clock[0])
    _drive(first, SyntheticNode(first), clock, 40, 40)
    assert first.history.flush()
    hcfg = first.history.config
    first.stop()
    spark = job.spark_session(hcfg, app_name="dsched-feed-test")
    try:
        job.run_available(spark, hcfg)
    finally:
        spark.stop()
    # A new controller with an empty ring buffer (its SQLite state gone too).
    (tmp_path / "state" / "controller.sqlite").unlink()
    second = Controller(config(tmp_path, predictors=WITH_ARIMA), clock=lambda: clock[0])
    node = SyntheticNode(second)
    _drive(second, node, clock, 3, 40)
    key = OperatorKey("wc", "source")
    assert len(second.memory.sources.series[key]) >= 30  # windows from the table, then its own
    assert second.memory.kappa[OperatorKey("wc", "split")] == pytest.approx(0.001, rel=0.1)
    second.stop()
