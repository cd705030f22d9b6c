"""`dsched bench live`: bad input refused before anything starts, a few-slot smoke
run of the real command (controller, agent, cgroups), and Ctrl-C cleanup."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from bench.live import (
    CONTENDERS,
    balanced_vocabulary,
    operator_cpu_per_root_ms,
    parse_trace_file,
    scenario_levels,
    wordcount_spec,
)
from testbed.live.static import Reservation, Scale, static_caps

DSCHED = str(Path(sys.executable).parent / "dsched")
CPU = Path("/sys/fs/cgroup/cpu")
METRICS = (
    "latency_ms_mean",
    "latency_ms_p99",
    "throughput_tuples",
    "failed",
    "lost",
    "cpu_allocated_core_seconds",
    "cpu_used_core_seconds",
    "workers_used_mean",
    "nodes_used_mean",
    "moves",
)


def _bench(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([DSCHED, "bench", "live", *args], capture_output=True, text=True, **kw)


def _bench_run(args: list[str], timeout: float) -> tuple[subprocess.CompletedProcess, Path]:
    """Run ``dsched bench live`` to the end; also the cgroup it reserved (named
    after its pid), which must be gone afterwards. Another live run at the same
    time has its own: a glob over every ``dsched-live-*`` would see that one."""
    p = subprocess.Popen(
        [DSCHED, "bench", "live", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        stdout, stderr = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        p.communicate()
        raise
    done = subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr)
    return done, CPU / f"dsched-live-{p.pid}"


def _refused_before_anything_starts(tmp_path, *args: str) -> str:
    """Run the command with ``args``; it must exit 2 having created no result, no
    workdir and no cgroup. Returns what it printed."""
    out, workdir = tmp_path / "r.json", tmp_path / "work"
    p = subprocess.Popen(
        [DSCHED, "bench", "live", *args, "--json", str(out), "--workdir", str(workdir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    text, _ = p.communicate(timeout=60)
    assert p.returncode == 2
    assert not out.exists() and not workdir.exists()
    assert not (CPU / f"dsched-live-{p.pid}").exists()
    return text


def test_unknown_scenario_is_refused_before_anything_starts(tmp_path):
    text = _refused_before_anything_starts(
        tmp_path, "--scenario", "wordcount-sideways", "--duration", "4"
    )
    assert "--scenario" in text and "wordcount-sideways" in text


@pytest.mark.parametrize(
    "content", ['[0.5, "lots", 0.2]', "0.1\n0.2\nabc\n", "", "[0.5, NaN]", "0.5\n-1\n", '{"a": 1}']
)
def test_trace_file_that_does_not_parse_is_refused(tmp_path, content):
    trace = tmp_path / "trace.txt"
    trace.write_text(content)
    with pytest.raises(ValueError, match="--trace"):
        parse_trace_file(trace)


def test_trace_file_error_from_the_command_starts_nothing(tmp_path):
    trace = tmp_path / "trace.json"
    trace.write_text("[0.2, 0.4, oops]")
    text = _refused_before_anything_starts(tmp_path, "--scenario", "http", "--trace", str(trace))
    assert "--trace" in text and "does not parse" in text


def test_trace_file_parses_json_and_lines(tmp_path):
    a = tmp_path / "a.json"
    a.write_text("[0.1, 0.5, 1.0]")
    b = tmp_path / "b.txt"
    b.write_text("# level per slot\n0.1\n0.5  # midday\n\n1.0\n")
    assert parse_trace_file(a).tolist() == parse_trace_file(b).tolist() == [0.1, 0.5, 1.0]


def test_unknown_contender_and_equal_without_dsched_are_refused(tmp_path):
    p = _bench(
        "--scenario",
        "http",
        "--contenders",
        "static-0.7,r-storm",
        "--json",
        str(tmp_path / "r.json"),
        timeout=60,
    )
    assert p.returncode == 2 and "r-storm" in p.stderr
    p = _bench(
        "--scenario",
        "http",
        "--contenders",
        "equal",
        "--json",
        str(tmp_path / "r.json"),
        timeout=60,
    )
    assert p.returncode == 2 and "'equal'" in p.stderr


@pytest.mark.parametrize(
    ("flag", "value", "says"),
    [
        ("--epoch-seconds", "3", "longer than a slot"),
        ("--epoch-seconds", "0", "--epoch-seconds must be a positive number"),
        ("--epoch-seconds", "nan", "--epoch-seconds must be a positive number"),
        ("--forecast-quantile", "0.3", "--forecast-quantile must be in [0.5, 1)"),
        ("--forecast-quantile", "1", "--forecast-quantile must be in [0.5, 1)"),
        ("--forecast-quantile", "nan", "--forecast-quantile must be in [0.5, 1)"),
        ("--chunk-seconds", "0", "--chunk-seconds must be a finite number > 0, got 0.0"),
        ("--chunk-seconds", "nan", "--chunk-seconds must be a finite number > 0, got nan"),
        ("--chunk-seconds", "inf", "--chunk-seconds must be a finite number > 0, got inf"),
    ],
)
def test_controller_epoch_out_of_range_is_refused(tmp_path, flag, value, says):
    p = _bench("--scenario", "wordcount-random", flag, value, "--json", str(tmp_path / "r.json"))
    assert p.returncode == 2 and says in p.stderr, p.stderr
    assert not (tmp_path / "r.json").exists()


def test_forecast_quantile_sets_every_default_class_and_is_recorded():
    import argparse

    from bench.live import add_arguments, controller_options, sizing

    p = argparse.ArgumentParser()
    add_arguments(p)
    base = ["--scenario", "wordcount-random", "--json", "r.json"]
    plain = controller_options(p.parse_args(base))
    assert plain == {} and sizing(plain)["forecast_quantile"] == 0.5
    args = p.parse_args([*base, "--forecast-quantile", "0.75"])
    options = controller_options(args)
    assert {c["forecast_quantile"] for c in options["qos"]["classes"].values()} == {0.75}
    assert sizing(options) == {
        "latency_model": "ggm",
        "latency_criterion": "quantile",
        "forecast_quantile": 0.75,
    }


def test_balanced_vocabulary_spreads_words_evenly_over_count_instances():
    import zlib

    words = balanced_vocabulary(20, 4)
    assert len(set(words)) == 20
    counts = [sum(zlib.crc32(w.encode()) % 4 == b for w in words) for b in range(4)]
    assert counts == [5, 5, 5, 5]


def test_wordcount_operators_cost_the_same_per_root():
    per_op = operator_cpu_per_root_ms(wordcount_spec(), {"source": 1.0, "split": 5.0})
    assert per_op == pytest.approx({"source": 1.5, "split": 1.5, "count": 1.5})


def test_static_caps_keep_the_papers_proportions():
    spec = wordcount_spec()
    scale = Scale(1.8, 12)
    c7 = static_caps("static-0.7", spec.operators, scale)
    c3 = static_caps("static-0.3", spec.operators, scale)
    assert sum(c * 4 for c in c7.values()) == pytest.approx(1.8)
    assert c3["count"] / c7["count"] == pytest.approx(3 / 7)
    assert scale.factor == pytest.approx(0.15 / 0.7)
    eq = static_caps("equal", spec.operators, scale, {"source": 0.4, "split": 0.8, "count": 0.2})
    assert eq == pytest.approx({"source": 0.1, "split": 0.2, "count": 0.05})
    with pytest.raises(ValueError, match="equal_total_by_operator"):
        static_caps("equal", spec.operators, scale)
    with pytest.raises(ValueError, match="unknown static strategy"):
        static_caps("static-0.5", spec.operators, scale)


def test_regular_trace_rises_and_falls_twice_and_random_uses_levels_1_to_25():
    reg = scenario_levels("wordcount-regular", 40, seed=1)
    assert reg.max() == pytest.approx(1.0) and reg.min() == pytest.approx(0.1)
    assert sum(1 for i in range(1, 40) if reg[i] == 1.0) == 2
    rnd = scenario_levels("wordcount-random", 200, seed=1) * 25
    assert set(rnd.round().astype(int)) <= set(range(1, 26)) and len(set(rnd)) > 15


@pytest.mark.serial
def test_smoke_few_slots_with_dsched_equal_and_uncapped(tmp_path, cgroup_v1_cpu):
    out, png = tmp_path / "live.json", tmp_path / "live.png"
    p, reserved = _bench_run(
        [
            "--scenario",
            "wordcount-regular",
            "--duration",
            "6",
            "--warmup",
            "2",
            "--contenders",
            "dsched,equal,uncapped",
            "--json",
            str(out),
            "--plot",
            str(png),
            "--workdir",
            str(tmp_path / "work"),
        ],
        timeout=150,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    doc = json.loads(out.read_text())
    assert (
        doc["scenario"] == "wordcount-regular" and doc["revision"] and doc["machine"]["cpu_count"]
    )
    assert doc["scale"]["capacity_cores"] == 1.6 and doc["scale"]["executors"] == 12
    # Timed once for every contender (a 64 KiB SHA-256 costs tens of microseconds).
    assert 1e-6 < doc["chunk_seconds"] < 1e-3
    # dsched decides every half second and its trend looks back one 2-s slot.
    assert doc["epoch_seconds"] == 0.5 and doc["controller_config"]["phi"] == 4
    assert set(doc["contenders"]) == {"dsched", "equal", "uncapped"}
    assert doc["profile"]["name"] == "default" and doc["profile"]["overridden_by_flags"] == [
        "--duration",
        "--warmup",
    ]
    assert "paper_comparison" not in doc
    for name, c in doc["contenders"].items():
        assert set(METRICS) <= set(c), name
        # One node: its stateless and stateful worker, no moves.
        assert (c["workers_used_mean"], c["nodes_used_mean"], c["moves"]) == (2, 1, 0), name
        assert c["completed"] > 0 and c["duplicated"] == 0, name
        assert c["cpu_used_core_seconds"] > 0, name
    unc = doc["contenders"]["uncapped"]
    assert unc["lost"] == 0
    # Uncapped instances are charged the whole capacity for the whole trace.
    assert unc["cpu_window_seconds"] == pytest.approx(6, abs=0.5)
    assert unc["cpu_allocated_core_seconds"] == pytest.approx(
        1.6 * unc["cpu_window_seconds"], rel=0.01
    )
    # The dsched run read the controller's decisions and its caps from the agent's cgroups.
    d = doc["contenders"]["dsched"]
    assert d["decisions"] >= 1
    assert any(v > 0 for v in d["allocated_cores_mean_by_operator"].values())
    assert set(doc["ratios"]) == {"equal", "uncapped"}
    assert png.stat().st_size > 0 and png.with_name("live-allocation.png").stat().st_size > 0
    assert not reserved.exists()
    assert set(CONTENDERS) >= set(doc["contenders"])
    # The controller's log and state are in the workdir asked for, sockets are not.
    kept = tmp_path / "work" / "wordcount-regular-dsched"
    assert (kept / "controller.log").stat().st_size > 0
    assert (kept / "state" / "controller.sqlite").is_file()
    assert not list(kept.rglob("*.sock"))


def test_a_short_stand_in_workdir_hands_its_files_over_and_goes(tmp_path):
    import socket

    from bench.live import MAX_SOCKET_DIR, cluster_workdir, settle_workdir

    wanted = tmp_path / ("w" * MAX_SOCKET_DIR) / "wordcount-random-dsched"
    used = cluster_workdir(wanted)
    assert used != wanted and len(str(used)) <= MAX_SOCKET_DIR
    (used / "state").mkdir()
    (used / "controller.log").write_text("epoch 1\n")
    (used / "state" / "controller.sqlite").write_bytes(b"db")
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(used / "admin.sock"))
        settle_workdir(used, wanted)
    assert (wanted / "controller.log").read_text() == "epoch 1\n"
    assert (wanted / "state" / "controller.sqlite").read_bytes() == b"db"
    assert not (wanted / "admin.sock").exists() and not used.exists()
    # A workdir short enough is used as it is, and settling it changes nothing.
    short = Path("/tmp/dsched-short")
    assert cluster_workdir(short) == short
    settle_workdir(wanted, wanted)
    assert (wanted / "controller.log").is_file()


def test_a_contender_starts_from_an_empty_directory(tmp_path):
    """A second run with the same --workdir must not resume the first run's
    controller state (its SQLite holds caps, hysteresis and costs)."""
    from bench.live import fresh_contender_dir

    old = tmp_path / "wordcount-random-dsched"
    (old / "state").mkdir(parents=True)
    (old / "state" / "controller.sqlite").write_bytes(b"an earlier run")
    (tmp_path / "wordcount-random-ds2").mkdir()
    path = fresh_contender_dir(tmp_path, "wordcount-random", "dsched")
    assert path == old and not path.exists()
    # Another contender's directory is left alone.
    assert (tmp_path / "wordcount-random-ds2").is_dir()
    assert fresh_contender_dir(tmp_path, "http", "vpa") == tmp_path / "http-vpa"


def test_a_stand_in_that_cannot_hand_over_keeps_its_files_and_says_where(tmp_path, capsys):
    from bench.live import MAX_SOCKET_DIR, cluster_workdir, settle_workdir

    (tmp_path / "f").write_text("a file, not a directory")
    wanted = tmp_path / "f" / ("w" * MAX_SOCKET_DIR)
    used = cluster_workdir(wanted)
    (used / "controller.log").write_text("epoch 1\n")
    try:
        settle_workdir(used, wanted)  # no exception: it runs in a finally
        assert (used / "controller.log").is_file()
        assert f"logs left in {used}" in capsys.readouterr().err
    finally:
        shutil.rmtree(used, ignore_errors=True)


def _reservation_has_tasks(top: Path) -> bool:
    testbed = top / "testbed"
    if not testbed.is_dir():
        return False
    return any(
        (d / "tasks").read_text().strip() for d in [testbed, *testbed.rglob("*")] if d.is_dir()
    )


@pytest.mark.serial
def test_sigint_stops_every_worker_and_removes_every_cgroup(tmp_path, cgroup_v1_cpu):
    p = subprocess.Popen(
        [
            DSCHED,
            "bench",
            "live",
            "--scenario",
            "wordcount-regular",
            "--duration",
            "120",
            "--contenders",
            "dsched",
            "--json",
            str(tmp_path / "r.json"),
            "--workdir",
            str(tmp_path / "w"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    top = cgroup_v1_cpu / f"dsched-live-{p.pid}"
    try:
        deadline = time.monotonic() + 60
        # Wait until the agent has put capped instances into cgroups of their own.
        while not any((top / "testbed").glob("*/*/*/tasks")) or not _reservation_has_tasks(top):
            assert p.poll() is None, p.stdout.read()
            assert time.monotonic() < deadline, "the run never reached its cgroups"
            time.sleep(0.2)
        children = psutil.Process(p.pid).children(recursive=True)
        names = " ".join(" ".join(c.cmdline()) for c in children)
        assert "dsched-controller" in names and "dsched-agent" in names
        assert sum("hashlib" in " ".join(c.cmdline()) for c in children) == 12  # CPU workers
        p.send_signal(signal.SIGINT)
        text, _ = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 130, text
    assert "interrupted" in text
    gone, alive = psutil.wait_procs(children, timeout=10)
    assert not alive, [c.pid for c in alive]
    assert not top.exists(), sorted(str(x) for x in top.rglob("*") if x.is_dir())
    assert not (tmp_path / "r.json").exists()


SPAWNER = """
import threading, time
while True:
    threading.Thread(target=time.sleep, args=(0.002,)).start()
    time.sleep(0.0005)
"""


def test_reservation_is_removed_while_a_process_in_it_starts_threads(cgroup_v1_cpu):
    """A run's process still stopping can start threads in ``harness/`` while the
    reservation is being removed; each keeps the cgroup busy for the rmdir that
    follows the move of the tasks listed before it. Nothing may be left."""
    res = Reservation(cgroup_v1_cpu, f"dsched-test-leave-{os.getpid()}")
    res.top.mkdir()
    res.harness.mkdir()
    spawner = subprocess.Popen([sys.executable, "-c", SPAWNER])
    try:
        (res.harness / "cgroup.procs").write_text(f"{spawner.pid}\n")
        time.sleep(0.3)
        assert len((res.harness / "tasks").read_text().split()) > 1
        res.leave()
        assert res.leftover() == []
        assert spawner.poll() is None  # its threads moved out; the process lives on
    finally:
        spawner.kill()
        spawner.wait()
        res.leave()


def test_http_monitor_counters_report_closed_windows_and_alarm_flags_bursts():
    from testbed.live import http_monitor as hm
    from testbed.live.engine import Tuple

    now = [0.0]
    count = hm.windowed_counter("country", clock=lambda: now[0])
    state: dict = {}
    rec = hm.parse_line("10.1.2.3 DE as3320 GET / 200")
    assert rec["prefix"] == "10.1.0.0/16" and rec["country"] == "DE"
    reports = []
    # Ten quiet windows of 5 requests, then a burst of 40.
    for n in [5] * 10 + [40, 1]:
        for _ in range(n):
            reports += count(Tuple(0, (), 0.0, "k", rec), state)
        now[0] += hm.WINDOW_SECONDS
    assert [r[1][2] for r in reports] == [5] * 10 + [40]
    assert reports[-1][1][3] == pytest.approx(5.0)  # the normal value before the burst
    alarm_state: dict = {}
    for key, value in reports:
        hm._alarm(Tuple(0, (), 0.0, key, value), alarm_state)
    assert alarm_state["reports"] == 11 and len(alarm_state["alarms"]) == 1


def test_http_monitor_operators_pickle_for_worker_processes():
    # A multi-node run pickles every operator into its worker processes.
    import pickle

    from testbed.live import http_monitor as hm
    from testbed.live.engine import Tuple

    spec = pickle.loads(pickle.dumps(hm.http_monitor()))
    counter = {o.name: o for o in spec.operators}["isp"].fn
    rec = hm.parse_line("10.1.2.3 DE as3320 GET / 200")
    state: dict = {}
    assert counter(Tuple(0, (), 0.0, "k", rec), state) == []
    assert state["as3320"]["count"] == 1


def test_http_monitor_refuses_bad_lines_and_unknown_costs():
    from testbed.live import http_monitor as hm

    with pytest.raises(ValueError, match="access-log"):
        hm.parse_line("garbage")
    with pytest.raises(ValueError, match="IPv4"):
        hm.parse_line("10.1.2 DE as3320 GET / 200")
    with pytest.raises(ValueError, match="costs_ms"):
        hm.http_monitor(costs_ms={"sink": 1.0})


# ---------------------------------------------------------------- peers


def test_peers_are_contenders_after_dsched():
    from controller.peers import PEERS

    assert CONTENDERS[0] == "dsched" and set(PEERS) <= set(CONTENDERS)
    assert CONTENDERS.index("equal") > max(CONTENDERS.index(p) for p in PEERS)


def test_cap_changes_count_each_instance_whose_cap_moved_inside_the_window():
    from bench.live import cap_changes_per_instance_hour

    a, b = ("split", 0), ("split", 1)
    times = [0.0, 1.0, 2.0, 3.0, 4.0]
    caps = [
        {a: None, b: 0.2},
        {a: 0.1, b: 0.2},  # at 1 s: before the window
        {a: 0.2, b: 0.2},  # one change
        {a: 0.2, b: 0.3},  # one change
        {a: 0.2, b: 0.3},
    ]
    # Window [1.5, 4]: 2 changes over 2 instances and 2.5 s.
    assert cap_changes_per_instance_hour(times, caps, 1.5, 4.0) == pytest.approx(
        2 / 2 / (2.5 / 3600)
    )
    assert cap_changes_per_instance_hour(times, [{a: 0.5}] * 5, 0.0, 4.0) == 0.0
    assert cap_changes_per_instance_hour([], [], 0.0, 4.0) == 0.0


def test_violation_slots_count_late_slots_and_trace_slots_where_nothing_completed():
    from bench.live import slot_violations

    judged = slot_violations(
        [100.0, 2500.0, None, 1900.0, None], [10, 5, 0, 3, 0], trace_slots=4, target_ms=2000.0
    )
    # slot 2: input flowed, nothing completed; slot 4: after the trace, empty: not judged.
    assert judged == [False, True, True, False]


def test_pareto_front_keeps_the_points_nothing_beats():
    from bench.live import pareto_front

    points = {"dsched": (70.0, 0.1), "static-0.7": (128.0, 0.0), "equal": (70.0, 0.5)}
    points |= {"vpa": (90.0, 0.2), "ds2": (60.0, 0.6)}
    assert pareto_front(points) == ["ds2", "dsched", "static-0.7"]


def test_qos_class_sets_the_default_class_and_its_forecast_quantile():
    import argparse

    from bench.live import add_arguments, controller_options, sizing

    p = argparse.ArgumentParser()
    add_arguments(p)
    base = ["--scenario", "wordcount-random", "--json", "r.json"]
    assert p.parse_args(base).qos_class == "bronze"
    gold = controller_options(p.parse_args([*base, "--qos-class", "gold"]))
    assert gold == {"qos": {"default_class": "gold"}}
    assert sizing(gold)["forecast_quantile"] == 0.9
    both = controller_options(
        p.parse_args([*base, "--qos-class", "silver", "--forecast-quantile", "0.6"])
    )
    assert both["qos"]["default_class"] == "silver" and sizing(both)["forecast_quantile"] == 0.6


def test_unknown_qos_class_is_refused_before_anything_starts(tmp_path):
    text = _refused_before_anything_starts(
        tmp_path, "--scenario", "http", "--qos-class", "platinum"
    )
    assert "--qos-class" in text and "platinum" in text


def test_pareto_plot_marks_every_contender(tmp_path):
    from bench.live import plot_pareto

    doc = {
        "scenario": "wordcount-regular",
        "qos_class": {"name": "bronze", "target_latency_ms": 2000.0, "max_violation_ratio": 0.5},
        "contenders": {
            "dsched": {
                "cpu_allocated_core_seconds": 70.0,
                "violation_slot_share": 0.1,
                "policy": "dsched",
            },
            "vpa": {
                "cpu_allocated_core_seconds": 90.0,
                "violation_slot_share": 0.2,
                "policy": "vpa",
            },
            "static-0.7": {
                "cpu_allocated_core_seconds": 128.0,
                "violation_slot_share": 0.0,
                "policy": None,
            },
        },
    }
    out = plot_pareto(doc, tmp_path / "p.png")
    assert out.stat().st_size > 0


def test_point_labels_take_their_points_colour_and_a_leader_line():
    """Close points (dsched beside a static contender) must not be misread: each
    label is drawn in its point's colour, tied to it by a line, and neighbours'
    labels sit at different heights."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from bench.common import label_points

    fig, ax = plt.subplots()
    try:
        label_points(
            ax,
            [
                ("equal", 118.9, 0.049, "tab:grey"),
                ("dsched", 118.8, 0.0, "tab:red"),
                ("ds2", 88.0, 0.0, "tab:blue"),
            ],
        )
        texts = {t.get_text(): t for t in ax.texts}
        assert set(texts) == {"equal", "dsched", "ds2"}
        colour = matplotlib.colors.to_hex
        assert colour(texts["dsched"].get_color()) == colour("tab:red")
        assert colour(texts["equal"].get_color()) == colour("tab:grey")
        assert all(t.arrow_patch is not None for t in ax.texts)
        # By cost: ds2, dsched, equal; the two close ones get different offsets.
        assert texts["dsched"].xyann != texts["equal"].xyann
    finally:
        plt.close(fig)


PEER_KEYS = (
    "cpu_allocated_core_seconds",
    "throughput_tuples",
    "lost",
    "failed",
    "latency_ms_mean",
    "latency_ms_p99",
    "cap_changes_per_instance_hour",
    "violation_slot_share",
    "meets_target",
)


@pytest.mark.serial
def test_smoke_peers_drive_real_caps_side_by_side_with_dsched(tmp_path, cgroup_v1_cpu):
    """Every peer through the real controller and agent: caps in the agent's cgroups,
    decisions recorded under the peer's name, nothing lost."""
    from controller.peers import PEERS

    out, png = tmp_path / "live.json", tmp_path / "live.png"
    names = ["dsched", *PEERS]
    p, reserved = _bench_run(
        [
            "--scenario",
            "wordcount-regular",
            "--duration",
            "6",
            "--warmup",
            "1",
            "--contenders",
            ",".join(names),
            "--dsched-headrooms",
            "0.3",
            "--json",
            str(out),
            "--plot",
            str(png),
            "--workdir",
            str(tmp_path / "work"),
        ],
        timeout=900,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    doc = json.loads(out.read_text())
    assert list(doc["contenders"]) == ["dsched", "dsched-h0.3", *names[1:]]
    assert doc["contenders"]["dsched-h0.3"]["policy"] == "dsched"
    assert doc["qos_class"]["name"] == "bronze"
    for name, c in doc["contenders"].items():
        assert set(PEER_KEYS) <= set(c), name
        assert c["lost"] == 0, (name, c["lost"])
        assert c["completed"] > 0 and c["duplicated"] == 0, name
        assert 0.0 <= c["violation_slot_share"] <= 1.0, name
        assert c["meets_target"] == (
            c["violation_slot_share"] <= doc["qos_class"]["max_violation_ratio"]
        ), name
        assert c["cap_changes_per_instance_hour"] >= 0, name
    for name in ("dsched", *PEERS):
        c = doc["contenders"][name]
        assert c["policy"] == name and c["decisions"] >= 1, name
        if name != "dsched":
            # The controller's decision records say the peer sized the caps.
            assert c["decision_predictors"] == [name], (name, c["decision_predictors"])
        # The controller's caps reached the instances' cgroups through the agent.
        assert any(v > 0 for v in c["allocated_cores_mean_by_operator"].values()), name
        assert c["cpu_allocated_core_seconds"] <= 1.6 * c["cpu_window_seconds"] + 1e-6, name
    # The adaptive peers move caps (caps that never move count 0: checked on a
    # made-up window in test_cap_changes_count_each_instance_whose_cap_moved_inside_the_window).
    assert any(doc["contenders"][n]["cap_changes_per_instance_hour"] > 0 for n in ("ds2", "vpa"))
    assert png.with_name("live-pareto.png").stat().st_size > 0
    assert not reserved.exists()


def test_dsched_headrooms_become_contenders_after_dsched():
    from bench.live import headroom_contenders, headroom_of, policy_of

    assert headroom_contenders("0.05, 0.2,0.4", 1.6) == [
        "dsched-h0.05",
        "dsched-h0.2",
        "dsched-h0.4",
    ]
    assert headroom_contenders("", 1.6) == []
    assert policy_of("dsched-h0.2") == "dsched" and headroom_of("dsched-h0.2") == 0.2
    assert policy_of("vpa") == "vpa" and policy_of("static-0.7") is None
    for bad in ("-0.1", "1.6", "nan", "lots", "0.2,0.2"):
        with pytest.raises(ValueError, match="--dsched-headrooms"):
            headroom_contenders(bad, 1.6)


def test_bad_dsched_headroom_is_refused_before_anything_starts(tmp_path):
    text = _refused_before_anything_starts(
        tmp_path, "--scenario", "http", "--dsched-headrooms", "0.1,9"
    )
    assert "--dsched-headrooms" in text
