"""A damaged state file is refused, never taken for a new one (found by the fault
matrix, `dsched bench faults`: a controller started on a state file truncated to
0 bytes came up with no QoS classes, no mode and no caps, and said nothing).

SQLite reads an empty file as an empty database; the store now refuses it, and
builds a new store beside its final name and links it into place, so that the
store itself never leaves an empty file behind.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from controller.edges.store import SCHEMA_VERSION, StateFileError, StateStore, check_state_file


def _filled(state: Path) -> Path:
    store = StateStore(state)
    store.set_qos("wc", "gold", 1.0)
    store.put("mode", "enforce")
    store.close()
    return state / "controller.sqlite"


def test_a_state_file_truncated_to_nothing_is_refused_and_left_as_it_is(tmp_path):
    path = _filled(tmp_path)
    path.write_bytes(b"")
    with pytest.raises(StateFileError, match="empty") as exc:
        StateStore(tmp_path)
    assert "restore" in str(exc.value)
    assert path.stat().st_size == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["controller.sqlite"]


def test_a_state_file_truncated_half_way_is_refused(tmp_path):
    path = _filled(tmp_path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(StateFileError):
        check_state_file(path)
    assert path.read_bytes() == data[: len(data) // 2]


def test_an_empty_file_beside_a_write_ahead_log_is_left_to_sqlite(tmp_path):
    """A log with content may hold the whole database: only SQLite can tell."""
    path = tmp_path / "controller.sqlite"
    path.write_bytes(b"")
    path.with_name("controller.sqlite-wal").write_bytes(b"\0" * 32)
    try:
        check_state_file(path)
    except StateFileError as exc:
        assert "empty" not in str(exc)


def test_a_new_store_appears_whole_and_leaves_nothing_beside_it(tmp_path):
    store = StateStore(tmp_path / "state")
    try:
        assert store.found_version == 0
        path = tmp_path / "state" / "controller.sqlite"
        assert check_state_file(path) == SCHEMA_VERSION
        names = sorted(p.name for p in path.parent.iterdir())
        assert not [n for n in names if ".new" in n]
        store.set_qos("wc", "silver", 2.0)
    finally:
        store.close()
    again = StateStore(tmp_path / "state")
    try:
        assert again.qos_assignments() == {"wc": "silver"}
        assert again.found_version == SCHEMA_VERSION
    finally:
        again.close()


def test_a_half_built_new_store_left_by_a_crash_is_ignored(tmp_path):
    """A crash while the new store was being built leaves only its temporary file."""
    state = tmp_path / "state"
    state.mkdir()
    (state / "controller.sqlite.new").write_bytes(b"garbage")
    store = StateStore(state)
    try:
        store.set_qos("wc", "bronze", 3.0)
        assert store.qos_assignments() == {"wc": "bronze"}
    finally:
        store.close()
    assert not (state / "controller.sqlite.new").exists()


def test_the_controller_exits_2_on_an_empty_state_file(tmp_path):
    _filled(tmp_path / "state")
    (tmp_path / "state" / "controller.sqlite").write_bytes(b"")
    cfg = tmp_path / "controller.toml"
    cfg.write_text(
        f'state_dir = "{tmp_path / "state"}"\n'
        f'admin_listen = "unix:{tmp_path / "admin.sock"}"\n'
        'listen = "127.0.0.1:0"\nmetrics = "127.0.0.1:0"\n'
        "[history]\nenabled = false\n"
    )
    r = subprocess.run(
        [sys.executable, "-m", "controller.daemon", "--config", str(cfg)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2, r.stderr[-2000:]
    assert "is empty (0 bytes)" in r.stderr
    assert (tmp_path / "state" / "controller.sqlite").stat().st_size == 0


def test_the_sqlite_module_reads_an_empty_file_as_an_empty_database(tmp_path):
    """Why the check is needed: nothing below the store would notice."""
    path = tmp_path / "x.sqlite"
    path.write_bytes(b"")
    db = sqlite3.connect(path)
    try:
        assert db.execute("SELECT count(*) FROM sqlite_master").fetchone() == (0,)
    finally:
        db.close()
