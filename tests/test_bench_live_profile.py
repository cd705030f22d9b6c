"""`dsched bench live --profile` and `--nodes`: the paper's settings as a named
profile (flags still win), the paper's worker and node counts from a placement
history, the paper's table beside ours, and a few-slot run on two agent nodes
with placement and live moves (real controller, agents, worker processes and
cgroups)."""

from __future__ import annotations

import argparse
import json
import subprocess

import pytest

from bench.live import (
    OWN_RULES,
    PAPER_RULES,
    PAPER_TABLES,
    PROFILES,
    add_arguments,
    build_scenario,
    controller_config,
    cpu_mode,
    paper_comparison,
    profile_record,
    resolve_profile,
    theta_of,
    used_per_slot,
)
from controller.config import ControllerConfig
from testbed.live.static import Scale, first_fit_placement, static_caps
from tests.test_bench_live import CPU, DSCHED, _refused_before_anything_starts


def _resolved(*flags: str) -> tuple[argparse.Namespace, dict]:
    p = argparse.ArgumentParser()
    add_arguments(p)
    args = p.parse_args(["--scenario", "wordcount-regular", "--json", "unused.json", *flags])
    resolve_profile(args)
    scn = build_scenario(args, None)
    theta = theta_of(args, scn.scale)
    return args, {
        "profile": profile_record(args, scn, theta),
        "controller": controller_config(
            scn.scale,
            args.epoch_seconds,
            theta_cores=theta,
            phi=args.phi,
            nodes=args.nodes,
            rules=PROFILES[args.profile].rules,
        ),
        "scale": scn.scale,
        "slots": len(scn.levels),
    }


def test_seed001_profile_sets_the_papers_settings():
    _, r = _resolved("--profile", "seed001")
    s = r["profile"]["settings"]
    assert r["profile"]["name"] == "seed001" and r["profile"]["overridden_by_flags"] == []
    # A decision every 10-s slot, a trend over 5 slots (50 s), the 20-minute trace.
    assert s["slot_seconds"] == 10 and s["epoch_seconds"] == 10 and s["decisions_per_slot"] == 1
    assert s["phi"] == 5 and s["trend_seconds"] == 50
    assert s["duration_seconds"] == 1200 and r["slots"] == 120 and s["warmup_seconds"] == 30
    # Two nodes of 6 paper cores: R-Storm(70)'s 12 x 0.7 = 8.4 cores fill 0.7 of them.
    assert s["nodes"] == 2 and s["node_paper_cores"] == pytest.approx(6.0)
    assert s["static_0.7_share_of_capacity"] == pytest.approx(0.7)
    assert r["scale"].core_07 == pytest.approx(1.6 * 0.7 / 12)
    # theta is 0.2 of the paper's core, scaled like static-0.7's 0.7 core.
    assert s["theta_paper_cores"] == pytest.approx(0.2)
    assert s["theta_cores"] == pytest.approx(0.2 / 0.7 * r["scale"].core_07, rel=1e-4)
    c = r["controller"]
    assert c["phi"] == 5 and c["theta_cores"] == pytest.approx(s["theta_cores"], rel=1e-4)
    # The paper's rounding: up, with theta/2 to spare.
    assert c["cap_rounding"] == s["cap_rounding"] == "margin"
    # and the paper's hysteresis, a decision per slot with no dead band.
    assert c["hysteresis_band"] == s["hysteresis_band"] == 0.0
    assert c["lower_after_falls"] == s["lower_after_falls"] == 0
    # and its point forecast.
    assert c["forecast_median"] == s["forecast_median"] == "off"
    # A backlog drains within one 10-s slot, as the paper's.
    assert c["backlog_drain_slots"] == 1
    assert c["placement"] == "liu" and c["node_capacity_cores"] == {"n1": 0.8, "n2": 0.8}
    # A stateless-only node empties in the first 10-s plan that can, as the paper's.
    assert c["scale_in_wait_stateless_seconds"] == 10.0
    # Placement judges the demand now: one 10-s epoch is the whole mean window,
    # and the rise window too.
    assert c["placement_demand_seconds"] == 10.0
    from controller.memory import DemandPeaks

    peaks = DemandPeaks.for_slot(
        300.0, 10.0, c["placement_demand_seconds"], c["placement_rise_seconds"]
    )
    assert (peaks.mean_window, peaks.rise_window) == (1, 1)


def test_two_nodes_at_the_default_profile_wait_five_levels_before_a_stateless_scale_in():
    from controller.config import ControllerConfig
    from controller.core import build_placement

    _, r = _resolved("--nodes", "2")
    c = r["controller"]
    assert c["placement"] == "liu" and c["scale_in_wait_stateless_seconds"] == 10.0
    cfg = ControllerConfig(
        slot_seconds=0.5,
        placement="liu",
        scale_in_wait_stateless_seconds=c["scale_in_wait_stateless_seconds"],
    )
    # 10 s of 0.5-s epochs: twenty consecutive plans.
    assert build_placement(cfg).strategy.stateless_scale_in_patience == 20
    # Placement judges each instance's demand averaged over five 2-s levels, or
    # over the last level where that is more.
    assert c["placement_demand_seconds"] == 10.0
    assert c["placement_rise_seconds"] == 2.0
    # A plan for overload alone removes 0.02 core of it per instance it moves.
    assert c["placement_min_relief_cores"] == 0.02
    cfg = ControllerConfig(**c)
    cfg.validate()
    assert build_placement(cfg).min_relief_cores == 0.02


def test_default_profile_is_todays_behaviour():
    _, r = _resolved()
    s = r["profile"]["settings"]
    assert r["profile"]["name"] == "default"
    assert (s["slot_seconds"], s["epoch_seconds"], s["duration_seconds"]) == (2, 0.5, 80)
    assert s["theta_cores"] == 0.005 and s["phi"] == 4 and s["nodes"] == 1
    assert r["scale"].share_07 == 1.0
    assert r["controller"]["node_capacity_cores"] == {"local": 1.6}
    # A backlog drains over the trend's 2 s (four 0.5-s epochs), not within one epoch.
    assert r["controller"]["backlog_drain_slots"] == 4
    assert "placement" not in r["controller"]
    assert PROFILES["default"].theta_cores == 0.005
    # At that granularity caps go to the nearest theta, not up with a margin.
    assert r["controller"]["cap_rounding"] == s["cap_rounding"] == "nearest"
    # and each cap holds through moves under 40 % of it (four decisions a slot).
    assert r["controller"]["hysteresis_band"] == s["hysteresis_band"] == 0.4
    # and falls through the band after three falling epochs in a row.
    assert r["controller"]["lower_after_falls"] == s["lower_after_falls"] == 3
    # CPU per tuple is affine in the rate: a slope fitted over the memory's slots.
    assert r["controller"]["cost_model"] == s["cost_model"] == "marginal"
    # Bronze is sized for the median of next slot's arrivals.
    assert r["controller"]["forecast_median"] == s["forecast_median"] == "on"


def test_every_profile_sets_the_same_rules_and_each_is_a_valid_controller_setting():
    """A rule one profile sets and another leaves out would take the controller's
    default in the other, unrecorded: every profile names the same keys."""
    assert set(OWN_RULES) == set(PAPER_RULES)
    for prof in PROFILES.values():
        assert set(prof.rules) == set(PAPER_RULES)
        ControllerConfig(**prof.rules).validate()
    assert OWN_RULES != PAPER_RULES


def test_cpu_work_defaults_to_a_process_on_one_node_and_on_several():
    assert cpu_mode(_resolved()[0]) == "process"
    assert cpu_mode(_resolved("--nodes", "2")[0]) == "process"
    assert cpu_mode(_resolved("--nodes", "2", "--cpu", "thread")[0]) == "thread"
    assert cpu_mode(_resolved("--nodes", "2", "--cpu", "process")[0]) == "process"
    assert cpu_mode(_resolved("--cpu", "thread")[0]) == "thread"


def test_flags_given_override_the_profile():
    args, r = _resolved(
        "--profile",
        "seed001",
        "--duration",
        "120",
        "--epoch-seconds",
        "5",
        "--theta-cores",
        "0.2",
        "--phi",
        "3",
        "--nodes",
        "1",
    )
    s = r["profile"]["settings"]
    assert r["profile"]["overridden_by_flags"] == [
        "--duration",
        "--epoch-seconds",
        "--nodes",
        "--theta-cores",
        "--phi",
    ]
    assert s["duration_seconds"] == 120 and r["slots"] == 12
    assert s["epoch_seconds"] == 5 and s["slot_seconds"] == 10  # slot still the profile's
    assert s["theta_cores"] == 0.2 and s["phi"] == 3 and s["nodes"] == 1
    assert r["controller"]["theta_cores"] == 0.2 and r["controller"]["phi"] == 3


def test_unknown_profile_is_refused_before_anything_starts(tmp_path):
    text = _refused_before_anything_starts(
        tmp_path, "--scenario", "wordcount-regular", "--profile", "seed999"
    )
    assert "--profile" in text and "seed999" in text and "seed001" in text


@pytest.mark.parametrize(
    ("flag", "value", "says"),
    [("--nodes", "0", "--nodes"), ("--nodes", "9", "--nodes"), ("--phi", "1", "--phi")],
)
def test_bad_nodes_and_phi_are_refused(tmp_path, flag, value, says):
    text = _refused_before_anything_starts(tmp_path, "--scenario", "http", flag, value)
    assert says in text


def test_workers_and_nodes_used_per_slot_from_a_placement_history():
    a, b = ("a", 0), ("b", 0)
    sl, sf = "app-stateless-n1", "app-stateful-n1"
    times = [0.5, 1.0, 2.5, 3.0, 4.5, 5.5, 9.0]
    placements = [
        {a: (sl, "n1"), b: (sf, "n1")},  # warm-up: not counted
        {a: (sl, "n1"), b: (sf, "n1")},  # slot 0
        {a: (sl, "n1"), b: (sf, "n1")},  # slot 0
        {a: (sl, "n1"), b: (sf, "n1")},  # slot 1
        {a: ("app-stateless-n2", "n2"), b: (sf, "n1")},  # slot 1: a moved to n2
        {a: ("app-stateless-n2", "n2"), b: ("app-stateful-n2", "n2")},  # slot 2
        {a: (sl, "n1"), b: (sf, "n1")},  # after the window
    ]
    # Window [1, 7): three 2-s slots; a slot counts every worker seen in it.
    workers, nodes = used_per_slot(times, placements, 1.0, 7.0, 2.0)
    assert workers == [2, 3, 2] and nodes == [1, 2, 1]
    # A slot without a reading is left out, not counted as zero.
    workers, nodes = used_per_slot(times[:4], placements[:4], 1.0, 7.0, 2.0)
    assert workers == [2, 2] and nodes == [1, 1]


def test_static_caps_fill_as_few_nodes_as_they_fit():
    from bench.live import wordcount_spec

    spec = wordcount_spec()
    scale = Scale(1.6, 12, share_07=0.7)
    caps = static_caps("static-0.7", spec.operators, scale)
    where = first_fit_placement(spec.operators, caps, ["n1", "n2"], 0.8, scale.core_07)
    per_node = {n: sum(1 for v in where.values() if v == n) for n in ("n1", "n2")}
    # 0.8 / (1.12 / 12) = 8.57: eight instances fit on n1, the other four go to n2.
    assert per_node == {"n1": 8, "n2": 4}
    small = static_caps("static-0.3", spec.operators, scale)
    assert set(first_fit_placement(spec.operators, small, ["n1", "n2"], 0.8, 0.1).values()) == {
        "n1"
    }


def test_paper_comparison_puts_the_papers_table_beside_ours():
    ours = {
        "dsched": {
            "latency_ms_mean": 30.0,
            "throughput_tuples": 990,
            "completed": 1000,
            "failed": 10,
            "workers_used_mean": 2.5,
            "nodes_used_mean": 1.5,
        },
        "static-0.7": {
            "latency_ms_mean": 10.0,
            "throughput_tuples": 1000,
            "completed": 1000,
            "failed": 0,
            "workers_used_mean": 4.0,
            "nodes_used_mean": 2.0,
        },
    }
    c = paper_comparison("wordcount-regular", ours)
    assert "Table II" in c["source"] and c["r_storm_70_analogue"] == "static-0.7"
    m = c["metrics"]
    assert m["latency_ms_mean"] == {
        "paper_scheduler": 7.6,
        "ours_dsched": 30.0,
        "paper_r_storm_70": 23.9,
        "ours_static-0.7": 10.0,
    }
    assert m["failed"]["paper_scheduler"] == 699 and m["failed"]["paper_r_storm_70"] == 0
    assert m["workers_used_mean"]["paper_scheduler"] == 2.6
    assert m["nodes_used_mean"]["paper_scheduler"] == 1.6
    assert m["nodes_used_mean"]["paper_r_storm_70"] == 2.0
    assert m["failed_share"]["ours_dsched"] == pytest.approx(10 / 1010, abs=1e-5)
    assert c["latency_over_r_storm_70"] == {"paper": round(7.6 / 23.9, 4), "ours": 3.0}
    rnd = paper_comparison("wordcount-random", {})
    assert rnd["metrics"]["latency_ms_mean"]["paper_scheduler"] == 66.5
    assert rnd["metrics"]["latency_ms_mean"]["ours_dsched"] is None
    assert rnd["latency_over_r_storm_70"]["ours"] is None
    assert PAPER_TABLES["http"]["static-0.7"] is None
    assert paper_comparison("http", ours)["latency_over_r_storm_70"]["paper"] is None


# Alone (tests/conftest.py): a live run on two agent nodes.
@pytest.mark.serial
def test_smoke_two_nodes_with_placement_and_the_papers_table(tmp_path, cgroup_v1_cpu):
    """seed001 shortened by flags: dsched on two agent nodes with `liu` placement and
    live moves, static-0.7 placed once; workers, nodes and moves reported."""
    out = tmp_path / "live.json"
    p = subprocess.Popen(
        [
            DSCHED,
            "bench",
            "live",
            "--scenario",
            "wordcount-regular",
            "--profile",
            "seed001",
            "--duration",
            "8",
            "--slot-seconds",
            "2",
            "--epoch-seconds",
            "1",
            "--warmup",
            "3",
            "--chunk-seconds",
            "5e-5",
            "--contenders",
            "dsched,static-0.7",
            "--json",
            str(out),
            "--workdir",
            str(tmp_path / "work"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        text, _ = p.communicate(timeout=300)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 0, text
    doc = json.loads(out.read_text())
    prof = doc["profile"]
    assert prof["name"] == "seed001"
    assert prof["overridden_by_flags"] == [
        "--duration",
        "--slot-seconds",
        "--epoch-seconds",
        "--warmup",
    ]
    assert prof["settings"]["nodes"] == 2 and prof["settings"]["phi"] == 5
    assert doc["nodes"] == {"n1": 0.8, "n2": 0.8}
    assert doc["chunk_seconds"] == 5e-5
    assert doc["controller_config"]["placement"] == "liu"
    for name, c in doc["contenders"].items():
        assert c["lost"] == 0 and c["duplicated"] == 0 and c["completed"] > 0, name
        assert 1 <= c["nodes_used_mean"] <= 2, name
        assert c["nodes_used_mean"] <= c["workers_used_mean"] <= 4, name
        assert c["moves"] == len(c["move_log"]), name
        assert all(m["to"] in ("n1", "n2") and m["from"] != m["to"] for m in c["move_log"])
        assert len(c["series"]["nodes_used"]) >= 3, name
    d, s7 = doc["contenders"]["dsched"], doc["contenders"]["static-0.7"]
    assert d["decisions"] >= 1
    # static-0.7 needs 1.12 cores: more than one 0.8-core node, placed once.
    assert s7["nodes_used_mean"] == 2 and s7["moves"] == 0
    cmp = doc["paper_comparison"]
    assert cmp["metrics"]["latency_ms_mean"]["paper_r_storm_70"] == 23.9
    assert cmp["metrics"]["nodes_used_mean"]["ours_dsched"] == d["nodes_used_mean"]
    assert "paper vs this run" in text
    assert not (CPU / f"dsched-live-{p.pid}").exists()
