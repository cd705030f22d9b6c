"""The streaming history job on a real local Spark session (local[2]).

Samples go through the real file source, watermark, streaming aggregation and
checkpoint; the results are read back with the controller's pyarrow reader.
"""

from __future__ import annotations

import json
import shutil
import time

import pandas as pd
import pytest
from prometheus_client import CollectorRegistry

from controller.edges.models import default_table, read_table
from spark_stream import job
from spark_stream.config import HistoryConfig
from spark_stream.embedded import EmbeddedHistory
from spark_stream.feed import HistoryFeed
from spark_stream.fit import fit_models
from spark_stream.reader import HistoryReader
from spark_stream.spool import SpoolWriter
from tests import test_history_samples as H

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def spark(tmp_path_factory):
    base = tmp_path_factory.mktemp("spark")
    config = HistoryConfig.under(base, spark_conf={"spark.sql.warehouse.dir": str(base / "wh")})
    session = job.spark_session(config, app_name="dsched-history-tests")
    yield session
    session.stop()


def _config(tmp_path, **kw) -> HistoryConfig:
    kw.setdefault("slot_seconds", H.SLOT_SECONDS)
    return HistoryConfig.under(tmp_path / "state", **kw)


def test_windows_hold_exact_sums_of_known_input(spark, tmp_path):
    config = _config(tmp_path)
    H.write_slots(SpoolWriter(config), range(6))
    job.run_available(spark, config)
    reader = HistoryReader(config)
    # The tick of the last slot closes its own window: all six are readable.
    for app, op, count in H.OPERATORS:
        hist = reader.operator_history(app, op, 100)
        assert len(hist) == 6
        for slot, row in zip(range(6), hist.itertuples(), strict=True):
            want = H.expected_operator(app, op, slot)
            assert row.slot_first == row.slot_last == slot
            assert row.instances == count
            assert row.arrivals == pytest.approx(want["arrivals"])
            assert row.executed == pytest.approx(want["executed"])
            assert row.emitted == pytest.approx(want["emitted"])
            assert row.cpu_seconds == pytest.approx(want["cpu_seconds"])
            assert row.queue_length == pytest.approx(want["queue_length"])
            assert row.kappa == pytest.approx(0.001)
            assert row.selectivity == pytest.approx(2.0)
            assert row.window_start.timestamp() == H.T0 + H.SLOT_SECONDS * slot
        assert bool(hist["stateful"].iloc[0]) == (op == "count")
    assert reader.operator_history("wc", "split", 2)["slot_first"].tolist() == [4, 5]
    n1, n2 = reader.node_history("n1", 10), reader.node_history("n2", 10)
    assert n1["cpu_usage_cores"].tolist() == pytest.approx([0.1 * s for s in range(6)])
    assert n1["memory_bandwidth_bytes_per_second"].tolist() == [1e9] * 6
    # A counter the node does not have stays missing, never zero.
    assert n2["memory_bandwidth_bytes_per_second"].isna().all()
    assert reader.latest_window_end() == H.T0 + 6 * H.SLOT_SECONDS
    assert SpoolWriter(config).committed_slot() == 5


def test_two_slot_windows_sum_over_both_slots(spark, tmp_path):
    config = _config(tmp_path, window_slots=2)
    H.write_slots(SpoolWriter(config), range(4))
    job.run_available(spark, config)
    hist = HistoryReader(config).operator_history("wc", "count", 10)
    assert hist["slots"].tolist() == [2, 2]
    want = [H.expected_operator("wc", "count", s)["arrivals"] for s in range(4)]
    assert hist["arrivals"].tolist() == pytest.approx([want[0] + want[1], want[2] + want[3]])
    # Gauges are the mean per slot of the sum over instances.
    assert hist["queue_length"].tolist() == pytest.approx([6.0, 6.0])
    assert hist["instances"].tolist() == [3.0, 3.0]


def test_malformed_files_are_quarantined_with_reason_and_stream_continues(spark, tmp_path):
    config = _config(tmp_path)
    writer = SpoolWriter(config)
    H.write_slots(writer, range(2))
    spool = config.spool_dir
    # Placed on the slot clock (name) between good slots, as the writer would name them.
    (spool / "slot-000000000002-1700000020000.json").write_text('{"v": 1, "slot": 2, "times')
    (spool / "slot-000000000003-1700000030000.json").write_text(
        json.dumps({"v": 99, "slot": 3, "timestamp": H.T0 + 30, "slot_seconds": 10.0})
    )
    (spool / "slot-000000000004-1700000040000.json").write_text(
        json.dumps({"v": 1, "slot": 4, "slot_seconds": 10.0, "instances": []})
    )
    job.run_available(spark, config)
    H.write_slots(writer, range(5, 8))
    job.run_available(spark, config)

    reader = HistoryReader(config)
    assert reader.quarantine_counts() == {"bad_json": 1, "schema_version": 1, "missing_field": 1}
    moved = sorted(p.name for p in config.quarantine_dir.iterdir())
    assert moved == [f"slot-00000000000{s}-17000000{s}0000.json" for s in (2, 3, 4)]
    assert not any((spool / name).exists() for name in moved)
    slots = reader.operator_history("wc", "split", 100)["slot_first"].tolist()
    assert slots == [0, 1, 5, 6, 7]


def test_restart_after_crash_mid_batch_loses_and_duplicates_nothing(spark, tmp_path):
    config = _config(tmp_path)
    writer = SpoolWriter(config)
    H.write_slots(writer, range(3))
    job.run_available(spark, config)

    H.write_slots(writer, range(3, 7))
    real = job.HistorySink(config)

    class CrashAfterWindows(job.HistorySink):
        """Writes the operator table of the batch, then dies before finishing it."""

        def write(self, groups, batch_id):
            if groups.empty:
                return real.write(groups, batch_id)
            groups["window_start"] = job._utc(groups["window_start"])
            groups["window_end"] = job._utc(groups["window_end"])
            job.write_partitioned(
                job.operator_windows(groups, batch_id),
                config.operators_dir,
                job.S.OPERATOR_TABLE,
                batch_id,
            )
            raise RuntimeError("simulated crash in the middle of a batch")

    with pytest.raises(Exception, match="simulated crash"):
        job.run_available(spark, config, sink=CrashAfterWindows(config))
    job.run_available(spark, config)

    frame = pd.read_parquet(config.operators_dir)
    split = frame[(frame.app == "wc") & (frame.operator == "split")].sort_values("window_start")
    assert split["slot_first"].tolist() == list(range(7))
    assert not frame.duplicated(subset=["app", "operator", "window_start"]).any()
    for slot, arrivals in zip(range(7), split["arrivals"], strict=True):
        assert arrivals == pytest.approx(H.expected_operator("wc", "split", slot)["arrivals"])
    decisions = pd.read_parquet(config.decisions_dir)
    assert sorted(decisions["slot"].tolist()) == list(range(7))
    assert json.loads(decisions["decision"].iloc[0])["caps"] == {"wc/split/0": 0.5}

    # Committed files older than the retention go; the spool shrinks accordingly.
    pruner = SpoolWriter(HistoryConfig.under(tmp_path / "state", retention_seconds=0.0))
    assert pruner.prune() == 7
    assert pruner.files == 0 and pruner.bytes == 0


def test_embedded_job_makes_windows_readable_and_stops_cleanly(spark, tmp_path):
    config = _config(tmp_path, slot_seconds=2.0, trigger_seconds=0.25)
    history = EmbeddedHistory(config)
    history.start()
    try:
        assert history.wait_running(120), history.status().error
        writer = SpoolWriter(config)
        now = time.time()
        start = now - (now % 2.0) - 4.0
        for slot in range(2):
            instances, nodes = H.slot_samples(slot)
            writer.write_slot(slot, start + 2.0 * slot, 2.0, instances, nodes, None)
        reader = HistoryReader(config)

        # A batch writes its windows first and its progress (committed slot) after.
        def caught_up() -> bool:
            rows = len(reader.operator_history("wc", "split", 5))
            return rows >= 2 and history.status().committed_slot == 1

        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not caught_up():
            time.sleep(0.2)
        assert len(reader.operator_history("wc", "split", 5)) == 2
        status = history.status()
        assert status.state == "running"
        assert status.committed_slot == 1
        assert status.lag_seconds is not None and status.lag_seconds >= 0
    finally:
        # Also on a failure: a query left running in the shared session would
        # refuse the next test's query of the same name.
        history.stop()
    assert history.status().state == "stopped"
    # The shared session survives: the embedded job only stops what it created.
    assert spark.range(3).count() == 3


def test_fit_writes_arima_orders_and_perf_models_the_controller_loads(spark, tmp_path):
    config = _config(tmp_path)
    H.write_slots(SpoolWriter(config), range(24))
    job.run_available(spark, config)
    counts = fit_models(spark, config)
    assert counts["operators"] == 3
    models = HistoryReader(config).models()
    assert models.fitted_at is not None
    arima = models.arima.set_index(["app", "operator"])
    assert (arima["windows"] == 24).all()
    assert (arima["status"] == "ok").all()
    order = models.arima_order("wc", "split")
    assert order is not None and order[1] in (0, 1)
    perf = models.perf.set_index(["app", "operator"])
    rows = perf.loc[("wc", "count")]
    # Three instances observed; the model's one-thread row is their mean.
    assert list(rows["threads"]) == [1, 3]
    assert list(rows["basis"]) == ["per-instance", "observed"]
    row = rows.iloc[1]
    assert rows.iloc[0]["peak_rate"] == pytest.approx(row["peak_rate"] / 3)
    peak = (
        max(H.expected_operator("wc", "count", s)["executed"] for s in range(24)) / H.SLOT_SECONDS
    )
    assert row["peak_rate"] == pytest.approx(peak)
    assert row["kappa"] == pytest.approx(0.001)
    assert row["selectivity"] == pytest.approx(2.0)
    # The table the controller loads (its default perf_model_table).
    loaded = read_table(default_table(config.model_dir))
    assert loaded["wc/count"].peak_rate(3) == pytest.approx(peak)
    assert loaded["wc/count"].memory_percent(1) == 0.0  # not sampled: no memory bound


def test_the_running_job_refits_the_model_tables_and_reports_a_failed_refit(spark, tmp_path):
    config = _config(tmp_path, trigger_seconds=0.25, fit_interval_seconds=1.0)
    H.write_slots(SpoolWriter(config), range(24))
    history = EmbeddedHistory(config)
    feed = HistoryFeed(config)
    history.start()
    try:
        assert history.wait_running(120), history.status().error

        def wait_for(check, seconds=300.0):
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline and not check(history.status()):
                time.sleep(0.2)
            return history.status()

        st = wait_for(lambda s: s.fits >= 1)
        assert st.fits >= 1 and st.fit_error is None and st.last_fit_at is not None
        # The table the controller loads, written by the running job alone.
        loaded = read_table(default_table(config.model_dir))
        assert loaded["wc/count"].peak_rate(3) > 0
        # The controller's metrics of a feed running this job.
        registry = CollectorRegistry()
        feed.stop()
        feed = HistoryFeed(config, registry)
        feed.embedded = history
        assert registry.get_sample_value("dsched_history_model_refits_total") >= 1
        assert registry.get_sample_value("dsched_history_model_refit_failed") == 0
        # A refit that cannot write is reported; the stream runs on.
        shutil.rmtree(config.model_dir)
        config.model_dir.write_text("not a directory")
        st = wait_for(lambda s: s.fit_error is not None)
        assert st.fit_error is not None and st.state == "running", st
        assert registry.get_sample_value("dsched_history_model_refit_failed") == 1
        assert feed.status()["model_refit_error"] == st.fit_error
        failed_at = st.fits
        # The next refit after the cause is gone writes again and clears the error.
        config.model_dir.unlink()
        st = wait_for(lambda s: s.fits > failed_at)
        assert st.fit_error is None and st.state == "running", st
        assert read_table(default_table(config.model_dir))["wc/count"].peak_rate(3) > 0
    finally:
        feed.embedded = None
        feed.stop()
        history.stop()


def test_fit_interval_must_not_be_negative():
    with pytest.raises(ValueError, match="fit_interval_seconds"):
        HistoryConfig(fit_interval_seconds=-1.0).validate()
