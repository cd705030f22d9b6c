"""`dsched bench wire-scale`: a small run of the real command (a dsched-controller
daemon, two client processes of fake agents on real gRPC streams) writes sane
figures and leaves nothing running; SIGTERM mid-run stops everything."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from bench import wire_scale

DSCHED = str(Path(sys.executable).parent / "dsched")


def _start(tmp_path: Path, *args: str) -> subprocess.Popen:
    env = dict(os.environ, TMPDIR=str(tmp_path))  # the benchmark's temporary directory
    return subprocess.Popen(
        [DSCHED, "bench", "wire-scale", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )


def _watch(p: subprocess.Popen, seen: dict[int, psutil.Process]) -> None:
    """Remember every process the benchmark started (it waits for them all)."""
    try:
        for child in psutil.Process(p.pid).children(recursive=True):
            seen.setdefault(child.pid, child)
    except psutil.NoSuchProcess:
        pass


def _cmdline(proc: psutil.Process) -> str:
    try:
        return " ".join(proc.cmdline())
    except psutil.Error:  # gone, or a zombie not reaped yet
        return ""


def _none_left(seen: dict[int, psutil.Process], tmp_path: Path) -> None:
    alive = [c for c in seen.values() if _cmdline(c)]
    assert not alive, f"left running: {[_cmdline(c) for c in alive]}"
    assert not list(tmp_path.glob("dsched-wire-*")), "temporary directory left behind"


def test_small_run_writes_figures_and_leaves_nothing_running(tmp_path):
    out = tmp_path / "wire.json"
    p = _start(
        tmp_path,
        *("--agents", "40", "--instances", "400", "--apps", "20"),
        # 2-s slots: with 1-s slots on a loaded 2-core machine an epoch could end
        # after the next slot's reports, and that slot had no round of its own.
        *("--slot-seconds", "2", "--rounds", "3", "--warmup", "2"),
        *("--client-processes", "2", "--reference-repeats", "1", "--json", str(out)),
    )
    seen: dict[int, psutil.Process] = {}
    deadline = time.monotonic() + 120
    while p.poll() is None and time.monotonic() < deadline:
        _watch(p, seen)
        time.sleep(0.2)
    text, _ = p.communicate(timeout=30)
    assert p.returncode == 0, text
    _none_left(seen, tmp_path)
    assert len(seen) >= 3, "a controller and two client processes were expected"

    doc = json.loads(out.read_text())
    assert doc["benchmark"] == "wire-scale"
    assert doc["revision"] and doc["machine"]["cpu_count"]
    assert doc["agents_connected"] == 40
    assert doc["agents_with_instances"] == 40
    assert doc["config"]["client_processes"] == 2
    assert doc["config"]["instances"] == 360  # 20 apps x 3 operators x 6 instances
    assert doc["warmup_rounds_discarded"] == 2
    assert doc["rounds_measured"] == 3
    assert doc["all_directives_acknowledged"] is True
    measured = [r for r in doc["rounds"] if r["slot"] >= 2]
    assert len(measured) == 3
    epochs = [r["epoch"] for r in measured]
    assert all(e is not None for e in epochs) and epochs == sorted(set(epochs))
    for r in measured:
        assert r["reports"] == 40
        assert r["directives_acked"] == 40
        assert r["applied"] == r["caps"] == 360 and r["rejected"] == 0 and r["stale"] == 0
        assert 0 < r["round_seconds"] < 1.0  # the next slot's reports came after it
        parts = r["reports_seconds"] + r["epoch_seconds"] + r["directives_seconds"]
        assert parts >= r["round_seconds"] - 1e-6
    assert 0 < doc["round_seconds_median"] <= doc["round_seconds_p95"] <= doc["round_seconds_max"]
    assert doc["epochs_in_window"] >= 3
    assert doc["controller_cpu_seconds_per_epoch"] > 0
    assert doc["peak_rss_bytes"] > 10 * 2**20
    assert sum(doc["admin_calls"].values()) > 0
    assert doc["admin_call_seconds_p99"] > 0
    assert doc["reference_seconds"] > 0
    assert doc["target_round_seconds"] == 0.2  # 0.1 of the 2-s slot
    assert isinstance(doc["target_met_p95"], bool)
    assert doc["broken_streams"] == {}
    assert out.with_suffix(".png").stat().st_size > 0
    assert "target: round <= 0.1 of the slot" in text


def test_sigterm_stops_the_controller_and_the_clients(tmp_path):
    p = _start(
        tmp_path,
        *("--agents", "8", "--instances", "48", "--apps", "4", "--slot-seconds", "5"),
        *("--rounds", "20", "--client-processes", "2", "--reference-repeats", "1"),
        *("--json", str(tmp_path / "w.json")),
    )
    seen: dict[int, psutil.Process] = {}
    deadline = time.monotonic() + 60
    clients = 0
    while p.poll() is None and time.monotonic() < deadline and clients < 2:
        _watch(p, seen)
        clients = sum(1 for c in seen.values() if "bench.wire_client" in _cmdline(c))
        time.sleep(0.2)
    assert clients == 2, "the client processes never started"
    _watch(p, seen)
    p.send_signal(signal.SIGTERM)
    text, _ = p.communicate(timeout=60)
    assert p.returncode == 130, text
    _none_left(seen, tmp_path)
    assert not (tmp_path / "w.json").exists()


def test_bad_numbers_are_refused_before_anything_starts(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    parser = argparse.ArgumentParser()
    wire_scale.add_arguments(parser)
    for bad in (["--agents", "0"], ["--warmup", "0"], ["--slot-seconds", "0"]):
        args = parser.parse_args([*bad, "--json", str(tmp_path / "w.json")])
        assert wire_scale.run(args) == 2
        assert f"{bad[0]} must be" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
