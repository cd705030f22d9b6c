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


def _demo(tmp_path: Path, mode: str, root: str, *extra: str) -> dict:
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
            *extra,
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
    # The root itself, and the per-node roots of --nodes 2.
    roots = [CGROUP_V1_CPU / n for n in (name, f"{name}-n1", f"{name}-n2")]
    yield name
    for root in roots:
        remove_cgroup_tree(root)
    assert not any(root.exists() for root in roots)


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


def test_dry_run_demo_touches_no_cgroup_and_its_shadow_report_matches_its_log(tmp_path, root_name):
    doc = _demo(tmp_path, "dry-run", root_name)
    s = doc["summary"]
    assert doc["mode"] == "dry-run" and s["lost"] == 0 and s["caps_applied"] == 0
    assert s["cgroups_created"] == 0
    assert not (CGROUP_V1_CPU / root_name).exists()

    # What enforce mode would have done, from the demo's own decision log: a
    # controller reopened on the demo's state answers dschedctl report.
    from controller.config import ControllerConfig
    from dsched.config import load_config
    from tests.controller_server_support import start, stop
    from tests.test_shadow_report import recompute

    cfg = load_config(ControllerConfig, tmp_path / "work" / "controller.toml")
    controller, server = start(cfg, loop=False)
    try:
        records = controller.store.decisions(10_000)
        assert any(r.get("apps") for r in records)
        assert all(r["mode"] == "dry-run" for r in records)
        out = subprocess.run(
            [str(Path(DSCHED).parent / "dschedctl"), "--address", server.admin_address,
             "--json", "report", "--since", "1h"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        got = json.loads(out.stdout)
    finally:
        stop(controller, server)
    want = recompute(records)
    apps = {a["app"]: a for a in got["apps"]}
    assert set(apps) == set(want)
    for app, w in want.items():
        assert apps[app]["epochs"] == w["epochs"]
        assert apps[app]["freed_core_seconds"] == pytest.approx(w["freed"])
        assert apps[app]["estimated_epochs"] == w["estimated"]
        assert apps[app]["missed_epochs"] == w["missed"]
        assert apps[app]["cap_changes"] == w["changes"]
        assert apps[app]["held_instance_epochs"] == w["held"]
    assert got["total"]["cap_changes"] == sum(w["changes"] for w in want.values())
    # The demo's WordCount was measured: the report has figures for it, not only doubts.
    assert any(w["epochs"] > 0 for w in want.values())


# Alone (tests/conftest.py): which instances the plan moves follows the CPU they
# measure: with a busy neighbour on the other worker it once moved a stateful one.
@pytest.mark.serial
def test_two_node_demo_moves_only_stateless_instances_and_loses_nothing(tmp_path, root_name):
    # Rises to 300 sentences/s (about 0.8 cores) at 15 s: more than n1's usable
    # 0.7 cores, so the controller must move instances, and WordCount's
    # stateful count alone (about 0.45 cores) fits, so stateless moves suffice.
    doc = _demo(
        tmp_path,
        "enforce",
        root_name,
        "--nodes",
        "2",
        "--duration",
        "30",
        "--peak-rate",
        "300",
    )
    s = doc["summary"]
    assert doc["nodes"] == {"n1": 0.8, "n2": 0.8}
    assert s["lost"] == 0 and s["duplicated"] == 0 and s["tuples_done"] == s["tuples_in"] > 0
    placement = doc["placement"]
    assert s["placement_plans"] == len(placement["plans"]) >= 1
    assert s["affected_workers"] == placement["affected_workers"] >= 1
    first = placement["plans"][0]
    assert first["strategy"] == "liu" and first["actuator"] == "testbed"
    assert {(m["from_node"], m["to_node"]) for m in first["moves"]} == {("n1", "n2")}
    assert all(not m["stateful"] for m in first["moves"])
    for plan in placement["plans"]:
        assert plan["result"]["executed"] and plan["result"]["error"] is None
        # A stateful worker restarts only when its node's stateful workers alone
        # do not fit it (the predicted demand of count can pass n1's 0.7 usable
        # cores at the peak): moving stateless ones would not have sufficed.
        if plan["affected_stateful_workers"]:
            why = ("disrupting stateful", "disrupting stateless and stateful", "full repack")
            assert any(w in r for r in plan["reasons"] for w in why), plan["reasons"]
        else:
            assert all(not m["stateful"] for m in plan["moves"])
    assert s["cgroups_left_after"] == []
    assert not (CGROUP_V1_CPU / f"{root_name}-n1" / "wordcount").exists()


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--nodes", "0"], "--nodes must be between 1 and 8"),
        (["--node-cores", "nan"], "--node-cores must be a finite number > 0"),
        (["--duration", "0"], "--duration must be a finite number > 0"),
        (["--low-rate", "500"], "--low-rate must be between 0 and --peak-rate"),
        (["--parallelism", "0"], "--parallelism must be >= 1"),
    ],
)
def test_bad_demo_arguments_are_refused_before_anything_starts(tmp_path, flags, message):
    work = tmp_path / "work"
    r = subprocess.run(
        [DSCHED, "demo", "--workdir", str(work), "--no-history", *flags],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2, r.stdout + r.stderr
    assert message in r.stderr
    assert not work.exists()
