"""`dsched demo` as a user runs it: a real subprocess, short, with its JSON checked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from testbed.live.cluster import CGROUP_V1_CPU, remove_cgroup_tree

from .conftest import require_cgroups

pytestmark = pytest.mark.slow

DSCHED = str(Path(sys.executable).parent / "dsched")


def _demo(tmp_path: Path, mode: str, root: str) -> dict:
    out = tmp_path / "demo.json"
    r = subprocess.run(
        [
            DSCHED,
            "demo",
            "--duration",
            "10",
            "--slot-seconds",
            "1",
            "--mode",
            mode,
            "--json",
            str(out),
            "--workdir",
            str(tmp_path / "work"),
            "--cgroup-root",
            root,
            "--no-history",
            "--peak-rate",
            "120",
            "--quiet",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.fixture
def root_name():
    require_cgroups()
    name = f"dsched-demo-test-{os.getpid()}"
    yield name
    remove_cgroup_tree(CGROUP_V1_CPU / name)
    assert not (CGROUP_V1_CPU / name).exists()


def test_enforce_demo_caps_real_threads_and_loses_nothing(tmp_path, root_name):
    doc = _demo(tmp_path, "enforce", root_name)
    s = doc["summary"]
    assert doc["mode"] == "enforce"
    assert s["lost"] == 0 and s["duplicated"] == 0 and s["tuples_done"] == s["tuples_in"] > 0
    assert s["caps_applied"] > 0 and s["cgroups_created"] > 0 and s["cgroups_left_after"] == []
    ops = {o["operator"] for e in doc["epochs"] for o in e["operators"]}
    assert ops == {"source", "split", "count"}
    row = doc["epochs"][-1]["operators"][0]
    assert set(row) >= {"arrival", "predicted", "cap_cores", "usage_cores", "queue", "latency_ms"}
    assert "affected_workers" in s and "history_lag_seconds_median" in s


def test_dry_run_demo_touches_no_cgroup(tmp_path, root_name):
    doc = _demo(tmp_path, "dry-run", root_name)
    s = doc["summary"]
    assert doc["mode"] == "dry-run" and s["lost"] == 0 and s["caps_applied"] == 0
    assert s["cgroups_created"] == 0
    assert not (CGROUP_V1_CPU / root_name).exists()
