"""Spool writer, history configuration, reader and CLI: no Spark needed."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from dsched.config import ConfigError, from_dict
from spark_stream import schema as S
from spark_stream.config import HistoryConfig
from spark_stream.daemon import load_history_config
from spark_stream.reader import HistoryReader
from spark_stream.spool import SpoolWriter, encode_slot
from tests import test_history_samples as H


def _writer(tmp_path, **kw) -> SpoolWriter:
    return SpoolWriter(HistoryConfig.under(tmp_path, **kw))


def test_slot_file_is_versioned_json_published_under_its_final_name(tmp_path):
    writer = _writer(tmp_path)
    instances, nodes = H.slot_samples(3)
    path = writer.write_slot(3, H.T0 + 30, 10.0, instances, nodes, {"why": "raise"})
    assert path.name == "slot-000000000003-1700000030000.json"
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert all(line["v"] == S.SPOOL_SCHEMA_VERSION and line["slot"] == 3 for line in lines)
    assert all(line["timestamp"] == H.T0 + 30 and line["slot_seconds"] == 10.0 for line in lines)
    kinds = [line["kind"] for line in lines]
    assert kinds == ["instance"] * len(instances) + ["node"] * len(nodes) + ["slot", "tick"]
    assert lines[len(instances) + 1]["llc_occupancy_bytes"] is None
    assert json.loads(lines[-2]["decision"]) == {"why": "raise"}
    assert [p.name for p in writer.spool_dir.iterdir()] == [path.name]  # no temp file left
    assert writer.files == 1 and writer.bytes == path.stat().st_size


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"slot": -1}, "slot"),
        ({"timestamp": math.nan}, "timestamp"),
        ({"slot_seconds": 0}, "slot_seconds"),
        ({"decision": {"x": object()}}, "decision"),
        ({"instances": [{"app": "a"}]}, "instances sample lacks"),
        (
            {"instances": [dict(H.instance_sample("a", "b", 0, 0), arrivals=math.inf)]},
            "instances.arrivals",
        ),
        (
            {"instances": [dict(H.instance_sample("a", "b", 0, 0), instance="0")]},
            "instances.instance",
        ),
        ({"nodes": [dict(H.node_sample("n1", 0), node="")]}, "nodes.node"),
    ],
)
def test_bad_slot_input_is_a_value_error_naming_the_parameter_and_writes_nothing(
    tmp_path, change, message
):
    instances, nodes = H.slot_samples(0)
    args = {
        "slot": 0,
        "timestamp": H.T0,
        "slot_seconds": 10.0,
        "instances": instances,
        "nodes": nodes,
        "decision": None,
        **change,
    }
    writer = _writer(tmp_path)
    with pytest.raises(ValueError, match=message):
        writer.write_slot(**args)
    assert list(writer.spool_dir.iterdir()) == []


def test_full_spool_drops_and_counts_until_pruned(tmp_path):
    size = len(encode_slot(0, H.T0, 10.0, *H.slot_samples(0), None))
    writer = _writer(tmp_path, max_spool_bytes=int(size * 2.5), retention_seconds=0.0)
    H.write_slots(writer, range(4))
    assert writer.files == 2 and writer.dropped_total == 2 and writer.over_limit
    # Nothing committed yet: nothing may be removed, the spool stays full.
    assert writer.prune() == 0 and writer.over_limit
    writer.config.progress_path.parent.mkdir(parents=True)
    writer.config.progress_path.write_text(json.dumps({"committed_slot": 0}))
    assert writer.prune() == 1 and writer.files == 1
    assert writer.write_slot(4, H.T0 + 40, 10.0, *H.slot_samples(4), None) is not None
    assert not writer.over_limit and writer.dropped_total == 2


def test_prune_keeps_committed_files_younger_than_retention(tmp_path):
    writer = _writer(tmp_path, retention_seconds=3600.0)
    H.write_slots(writer, range(3))
    writer.config.progress_path.parent.mkdir(parents=True)
    writer.config.progress_path.write_text(json.dumps({"committed_slot": 1}))
    assert writer.prune() == 0
    old = writer.spool_dir / S.spool_file_name(0, H.T0)
    os.utime(old, (0, 0))
    assert writer.prune() == 1 and not old.exists() and writer.files == 2


def test_config_defaults_live_under_the_state_dir_and_rebase(tmp_path):
    config = HistoryConfig.under(tmp_path / "a")
    assert config.spool_dir == tmp_path / "a/history/spool"
    assert config.spark_master == "local[2]" and config.enabled
    moved = config.rebase(tmp_path / "b")
    assert moved.table_dir == tmp_path / "b/history/table"
    explicit = HistoryConfig.under(tmp_path / "a", spool_dir=tmp_path / "shared").rebase(
        tmp_path / "c"
    )
    assert explicit.spool_dir == tmp_path / "shared"


@pytest.mark.parametrize(
    ("data", "key"),
    [
        ({"spark_master": " "}, "history.spark_master"),
        ({"window_slots": 0}, "history.window_slots"),
        ({"watermark_slots": -1}, "history.watermark_slots"),
        ({"trigger_seconds": 0}, "history.trigger_seconds"),
        ({"max_spool_bytes": 0}, "history.max_spool_bytes"),
        ({"retention_seconds": -1}, "history.retention_seconds"),
        ({"slot_seconds": -10}, "history.slot_seconds"),
        ({"spark_conf": {"executor.memory": "1g"}}, "history.spark_conf.executor.memory"),
        ({"spool_dir": "/x", "table_dir": "/x"}, "history.table_dir"),
        ({"window_slots": "two"}, "history.window_slots"),
        ({"no_such_key": 1}, "history.no_such_key"),
    ],
)
def test_bad_history_config_names_the_key(data, key):
    with pytest.raises(ConfigError) as err:
        from_dict(HistoryConfig, data, prefix="history.")
    assert err.value.key == key


def test_daemon_reads_the_history_table_of_a_toml_file(tmp_path):
    toml = tmp_path / "controller.toml"
    toml.write_text('[history]\nspark_master = "spark://127.0.0.1:7077"\nwindow_slots = 3\n')
    config = load_history_config(str(toml), str(tmp_path / "state"), None)
    assert config.spark_master == "spark://127.0.0.1:7077" and config.window_slots == 3
    assert config.spool_dir == tmp_path / "state/history/spool"
    assert load_history_config(str(toml), None, "local[1]").spark_master == "local[1]"


def test_daemon_exits_nonzero_with_the_key_on_bad_config(tmp_path):
    toml = tmp_path / "bad.toml"
    toml.write_text("[history]\ntrigger_seconds = -1\n")
    proc = subprocess.run(
        [sys.executable, "-m", "spark_stream.daemon", "run", "--config", str(toml)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "history.trigger_seconds" in proc.stderr
    helptext = subprocess.run(
        [sys.executable, "-m", "spark_stream.daemon", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    assert "run" in helptext and "fit" in helptext


def test_reader_on_an_empty_history_and_bad_arguments(tmp_path):
    reader = HistoryReader(HistoryConfig.under(tmp_path))
    assert reader.operator_history("wc", "split", 5).empty
    assert reader.latest_window_end() is None and reader.lag_seconds() is None
    assert reader.models().arima.empty and reader.models().fitted_at is None
    assert reader.quarantine_counts() == {}
    with pytest.raises(ValueError, match="slots"):
        reader.operator_history("wc", "split", 0)
    with pytest.raises(ValueError, match="app"):
        reader.operator_history("", "split", 5)
    with pytest.raises(ValueError, match="node"):
        reader.node_history(None, 5)


def test_systemd_unit_verifies_with_the_installed_command(tmp_path):
    import shutil
    from pathlib import Path

    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed")
    unit = Path(__file__).resolve().parent.parent / "systemd" / "dsched-history.service"
    command = Path(sys.executable).parent / "dsched-history"
    text = unit.read_text()
    assert "ExecStart=/opt/dsched/bin/dsched-history run" in text
    local = tmp_path / unit.name
    local.write_text(text.replace("/opt/dsched/bin/dsched-history", str(command)))
    proc = subprocess.run(
        ["systemd-analyze", "verify", str(local)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr


def test_table_retention_removes_only_partitions_older_than_the_limit(tmp_path):
    from spark_stream.job import prune_table

    config = HistoryConfig.under(tmp_path, table_retention_days=2)
    for day in ("2026-01-01", "2026-01-09", "2026-01-10"):
        part = config.operators_dir / f"date={day}"
        part.mkdir(parents=True)
        (part / "batch-000000000001.parquet").write_bytes(b"x")
    now = 1768046400.0  # 2026-01-10 12:00 UTC
    removed = prune_table(config, now=now)
    assert [p.name for p in removed] == ["date=2026-01-01"]
    assert sorted(p.name for p in config.operators_dir.iterdir()) == [
        "date=2026-01-09",
        "date=2026-01-10",
    ]
