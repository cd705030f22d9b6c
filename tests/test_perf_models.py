"""Performance model tables: the controller loads them at start, reloads a changed
file, refuses a bad one (keeping the models before, counted), hands them to `sam`;
the history's fitted table loads."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd
import pytest
from prometheus_client import CollectorRegistry

from controller.core import Controller
from controller.edges.models import PerfModelsEdge, check_table_path, read_table
from dsched.config import ConfigError
from spark_stream.fit import PERF_TABLE, fit_perf_group, write_model_table
from tests.test_controller_epoch import SyntheticNode, config, run

ROWS = [[1, 100.0, 50.0, 2.0], [2, 180.0, 95.0, 3.0], [3, 180.0, 100.0, 4.0]]


def _write(path: Path, models: dict, **extra) -> None:
    # Aside and renamed, as `dsched profile --json` writes it.
    tmp = path.with_name(".tmp-" + path.name)
    tmp.write_text(json.dumps({"models": models, **extra}))
    os.replace(tmp, path)


def _refusals(registry: CollectorRegistry, reason: str) -> float:
    return registry.get_sample_value("dsched_perf_model_refusals_total", {"reason": reason})


def test_a_json_table_loads_with_its_operators_named(tmp_path):
    path = tmp_path / "models.json"
    _write(path, {"wc/split": ROWS, "wc/count": [[1, 50.0, 20.0, None]]})
    models = read_table(path)
    assert set(models) == {"wc/split", "wc/count"}
    assert models["wc/split"].best == (2, 180.0)
    # A memory figure that was not measured bounds nothing.
    assert models["wc/count"].memory_percent(1) == 0.0


def test_the_edge_reloads_a_changed_file_and_refuses_bad_ones_keeping_the_last(tmp_path):
    path = tmp_path / "models.json"
    registry = CollectorRegistry()
    edge = PerfModelsEdge(path, registry)
    assert edge.refresh() is False and dict(edge.current()) == {}  # no file yet: no models

    _write(path, {"wc/split": ROWS})
    assert edge.refresh() is True
    first = edge.current()["wc/split"]
    assert first.peak_rate(2) == 180.0
    assert edge.refresh() is False  # unchanged: not read again
    assert registry.get_sample_value("dsched_perf_models_loaded") == 1

    _write(path, {"wc/split": [[1, 120.0, 50.0, 2.0], [2, 230.0, 95.0, 3.0]]})
    assert edge.refresh() is True
    assert edge.current()["wc/split"].peak_rate(2) == 230.0

    # Rows out of thread order: refused naming the operator; the models stay.
    _write(path, {"wc/split": ROWS, "wc/count": [[2, 90.0, 40.0, 1.0], [1, 50.0, 20.0, 1.0]]})
    assert edge.refresh() is False
    assert edge.current()["wc/split"].peak_rate(2) == 230.0 and "wc/count" not in edge.current()
    assert "wc/count" in edge.last_error and "monotone" in edge.last_error
    assert _refusals(registry, "invalid") == 1
    assert edge.refresh() is False and _refusals(registry, "invalid") == 1  # counted once

    # Not JSON at all.
    path.write_text('{"models": {"wc/split": [[1, 100')
    assert edge.refresh() is False
    assert _refusals(registry, "unparsable") == 1
    assert edge.current()["wc/split"].peak_rate(2) == 230.0

    # Columns in another order would be read wrongly: refused too.
    _write(path, {"wc/split": ROWS}, columns=["threads", "cpu_percent", "peak_rate", "memory"])
    assert edge.refresh() is False and _refusals(registry, "unparsable") == 2

    # A good file again is taken at once.
    _write(path, {"wc/split": ROWS})
    assert edge.refresh() is True and edge.last_error is None
    assert edge.current()["wc/split"].peak_rate(2) == 180.0

    # The file vanishing keeps the models in force.
    path.unlink()
    assert edge.refresh() is False and "wc/split" in edge.current()


def test_the_table_path_key_is_checked_at_startup(tmp_path):
    check_table_path("perf_model_table", None)
    check_table_path("perf_model_table", tmp_path / "m.json")
    with pytest.raises(ConfigError, match="perf_model_table.*does not exist"):
        check_table_path("perf_model_table", tmp_path / "nowhere" / "m.json")
    with pytest.raises(ConfigError, match="perf_model_table.*must end in"):
        check_table_path("perf_model_table", tmp_path / "m.csv")
    with pytest.raises(ConfigError, match="perf_model_table"):
        config(tmp_path, perf_model_table=tmp_path / "nowhere" / "models.parquet")


def test_the_controller_loads_at_start_reloads_each_epoch_and_feeds_sam(tmp_path):
    clock = [1_000_000.0]
    path = tmp_path / "models.json"
    _write(path, {"wc/split": ROWS})
    c = Controller(config(tmp_path, placement="sam", perf_model_table=path), clock=lambda: clock[0])
    try:
        assert set(c.models.current()) == {"wc/split"}
        strategy = c.placement.strategy
        assert strategy.name == "sam" and strategy.models["wc/split"].best == (2, 180.0)
        node = SyntheticNode(c)
        run(c, node, clock, 2, {"wc": 100})
        _write(path, {"wc/split": ROWS, "wc/count": [[1, 400.0, 30.0, 1.0]]})
        run(c, node, clock, 1, {"wc": 100})
        assert set(c.models.current()) == {"wc/split", "wc/count"}
        assert set(c.placement.strategy.models) == {"wc/split", "wc/count"}
        # The decision record says which models were in force and where from.
        shown = c.last_record["perf_models"]
        assert shown["operators"] == ["wc/count", "wc/split"] and shown["path"] == str(path)
        assert shown["loaded_at"] == clock[0] and shown["last_error"] is None
        _write(path, {"wc/split": [[2, 1.0, 1.0, 1.0], [1, 1.0, 1.0, 1.0]]})
        run(c, node, clock, 1, {"wc": 100})
        assert set(c.placement.strategy.models) == {"wc/split", "wc/count"}
        assert _refusals(c.metrics.registry, "invalid") == 1
        shown = c.last_record["perf_models"]
        assert shown["operators"] == ["wc/count", "wc/split"] and "wc/split" in shown["last_error"]
    finally:
        c.stop()


def test_the_default_table_is_the_historys_fitted_one(tmp_path):
    c = Controller(config(tmp_path))
    try:
        assert (
            c.models.path == tmp_path / "state" / "history" / "models" / "perf" / "current.parquet"
        )
    finally:
        c.stop()


def _windows(instances: int, executed: list[float], cpu: list[float]) -> pd.DataFrame:
    start = pd.Timestamp("2026-01-01", tz="UTC") + pd.to_timedelta(
        [10 * i for i in range(len(executed))], unit="s"
    )
    return pd.DataFrame(
        {
            "app": "wc",
            "operator": "split",
            "window_start": start,
            "window_end": start + pd.Timedelta(seconds=10),
            "instances": instances,
            "arrivals": executed,
            "executed": executed,
            "emitted": [5 * e for e in executed],
            "cpu_seconds": cpu,
        }
    )


def test_the_fitted_table_loads_with_a_one_thread_row_and_no_memory_bound(tmp_path):
    frame = pd.concat(
        [_windows(3, [3000.0, 6000.0], [3.0, 6.0]), _windows(4, [4000.0], [4.4])],
        ignore_index=True,
    )
    perf = fit_perf_group(frame)
    assert list(perf["threads"]) == [1, 3, 4]
    assert list(perf["basis"]) == ["per-instance", "observed", "observed"]
    # The busiest window per instance: 6000 tuples in 10 s over 3 instances.
    assert perf["peak_rate"].iloc[0] == pytest.approx(200.0)
    assert perf["cpu_percent"].iloc[0] == pytest.approx(20.0)
    path = write_model_table(perf, tmp_path / "perf", PERF_TABLE, 1.0)
    models = read_table(path)
    model = models["wc/split"]
    assert model.peak_rate(3) == pytest.approx(600.0)
    assert model.memory_percent(4) == 0.0


def test_a_fitted_table_out_of_thread_order_is_refused(tmp_path):
    perf = fit_perf_group(_windows(3, [3000.0], [3.0]))
    perf = pd.concat([perf.iloc[[1]], perf.iloc[[0]]], ignore_index=True)
    path = write_model_table(perf, tmp_path / "perf", PERF_TABLE, 1.0)
    registry = CollectorRegistry()
    edge = PerfModelsEdge(path, registry)
    assert edge.refresh() is False
    assert "wc/split" in edge.last_error and _refusals(registry, "invalid") == 1
    (tmp_path / "perf" / "current.parquet").write_bytes(b"not parquet")
    assert edge.refresh() is False and _refusals(registry, "unparsable") == 1
