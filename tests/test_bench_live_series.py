"""`dsched bench live-series`: the spread over runs and the peer targets judged per run."""

from __future__ import annotations

import json
import subprocess

import pytest

from bench.live_series import judge, load_runs, markdown, summarize
from tests.test_bench_live import DSCHED


def _c(cpu, over, meets, changes=1000.0, lost=0, failed=0, latency=100.0):
    return {
        "cpu_allocated_core_seconds": cpu,
        "violation_slot_share": over,
        "meets_target": meets,
        "cap_changes_per_instance_hour": changes,
        "lost": lost,
        "failed": failed,
        "latency_ms_mean": latency,
        "latency_ms_p99": 3 * latency,
        "moves": 6,
        "workers_used_mean": 4.0,
        "nodes_used_mean": 2.0,
    }


def _doc(contenders, **over):
    doc = {
        "benchmark": "live",
        "revision": "abc1234",
        "created": "2026-11-28T00:00:00Z",
        "scenario": "wordcount-random",
        "qos_class": "bronze",
        "nodes": 2,
        "duration_seconds": 120.0,
        "contenders": contenders,
    }
    doc.update(over)
    return doc


def test_a_cheaper_peer_that_meets_the_class_breaks_the_cpu_target():
    t = judge(
        {
            "dsched": _c(100.0, 0.0, True),
            "ds2": _c(85.0, 0.4, True),
            "vpa": _c(90.0, 0.6, False),  # cheaper but misses the class: not counted
            "err": _c(190.0, 0.0, True),
        }
    )
    assert t["cpu"] == {
        "holds": False,
        "dsched_meets": True,
        "peers_meeting_with_less": {"ds2": 0.85},
    }
    # Every cheaper peer has more slots over the target.
    assert t["violations"]["holds"] is True


def test_a_cheaper_peer_with_as_few_violations_is_a_tie_and_breaks_the_target():
    t = judge({"dsched": _c(100.0, 0.0, True), "ds2": _c(90.0, 0.0, True)})
    assert t["violations"] == {
        "holds": False,
        "cheaper_peers_with_as_few": {"ds2": 0.0},
        "ties": ["ds2"],
    }


def test_equal_and_dsched_at_other_headrooms_are_not_peers():
    t = judge(
        {
            "dsched": _c(100.0, 0.1, True),
            "equal": _c(100.0 - 1e-6, 0.0, True),
            "dsched-h0.25": _c(80.0, 0.0, True),
        }
    )
    assert t["cpu"]["holds"] and t["violations"]["holds"]
    assert t["cap_changes"]["holds"] is None  # util-target did not run


def test_cap_changes_and_losses_are_judged_against_util_target_and_zero():
    t = judge(
        {
            "dsched": _c(100.0, 0.0, True, changes=2000.0, lost=3, failed=5),
            "util-target": _c(120.0, 0.2, True, changes=2500.0),
        }
    )
    assert t["cap_changes"] == {"holds": True, "dsched": 2000.0, "util_target": 2500.0}
    assert t["lost"] == {"holds": False, "lost": 3, "failed": 5}


def test_the_spread_and_the_targets_over_three_runs(tmp_path):
    runs = [
        _doc({"dsched": _c(100.0, 0.0, True), "ds2": _c(cpu, 0.3, True)})
        for cpu in (90.0, 110.0, 120.0)
    ]
    s = summarize(runs)
    ds2 = s["contenders"]["ds2"]
    assert ds2["cpu_allocated_core_seconds"] == {"median": 110.0, "min": 90.0, "max": 120.0}
    assert ds2["cpu_over_dsched"]["min"] == pytest.approx(0.9)
    assert ds2["met_target_runs"] == 3
    assert s["targets_held"]["cpu"] == {"held": 2, "judged": 3}  # run 1: ds2 with less
    assert s["targets_held"]["cap_changes"] == {"held": 0, "judged": 0}  # no util-target
    text = markdown(s)
    assert "| `ds2` | 110.0 (90.0–120.0) |" in text
    assert "| 1 | missed: ds2 0.90× |" in text and "| 2 | holds |" in text


def test_a_contender_missing_from_a_run_is_left_out_of_the_spread():
    runs = [
        _doc({"dsched": _c(100.0, 0.0, True), "dsched-h0.25": _c(80.0, 0.1, True)}),
        _doc({"dsched": _c(101.0, 0.0, True)}),
    ]
    assert list(summarize(runs)["contenders"]) == ["dsched"]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("not json", "not a readable bench live result"),
        (json.dumps({"benchmark": "sim", "contenders": {}}), "not a `dsched bench live` result"),
        (json.dumps(_doc({"ds2": _c(1.0, 0.0, True)})), "dsched did not run in it"),
    ],
)
def test_a_bad_file_is_refused_naming_it(tmp_path, content, message):
    path = tmp_path / "run.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=message) as err:
        load_runs([path])
    assert str(path) in str(err.value)


def test_runs_of_different_series_are_refused(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(_doc({"dsched": _c(1.0, 0.0, True)})))
    b.write_text(json.dumps(_doc({"dsched": _c(1.0, 0.0, True)}, qos_class="silver")))
    with pytest.raises(ValueError, match="qos_class is 'silver', the first run's is 'bronze'"):
        load_runs([a, b])


def test_the_command_writes_json_and_markdown_and_refuses_a_missing_file(tmp_path):
    run_json = tmp_path / "r1.json"
    run_json.write_text(json.dumps(_doc({"dsched": _c(100.0, 0.0, True)})))
    out, md = tmp_path / "s.json", tmp_path / "s.md"
    done = subprocess.run(
        [DSCHED, "bench", "live-series", str(run_json), "--json", str(out), "--markdown", str(md)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    doc = json.loads(out.read_text())
    assert doc["benchmark"] == "live-series"
    assert doc["targets_held"]["lost"] == {"held": 1, "judged": 1}
    assert md.read_text().startswith("| contender |")
    missing = subprocess.run(
        [DSCHED, "bench", "live-series", str(tmp_path / "nope.json"), "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert missing.returncode != 0 and "nope.json" in missing.stderr


def test_dsched_missing_the_class_misses_the_cpu_target_even_with_no_cheaper_peer():
    t = judge({"dsched": _c(100.0, 0.6, False), "vpa": _c(150.0, 0.0, True)})
    assert t["cpu"]["holds"] is False and t["cpu"]["dsched_meets"] is False
    assert "dsched misses the class" in markdown(
        summarize([_doc({"dsched": _c(100.0, 0.6, False), "vpa": _c(150.0, 0.0, True)})])
    )


def test_a_run_without_a_peer_the_series_ran_says_so():
    runs = [
        _doc({"dsched": _c(100.0, 0.0, True), "ds2": _c(80.0, 0.0, True)}),
        _doc({"dsched": _c(100.0, 0.0, True)}),  # ds2 did not run here
    ]
    s = summarize(runs)
    assert [t["peers_missing"] for t in s["targets"]] == [[], ["ds2"]]
    assert "| 2 (without ds2) | holds |" in markdown(s)
