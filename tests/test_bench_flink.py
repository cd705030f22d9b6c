"""`dsched bench flink`: the figures from synthetic samples, ratios and targets, bad
arguments refused before anything starts, and one short real run on a Flink
cluster (controller, agent, cgroups) that must lose nothing and leave nothing."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import psutil
import pytest

from bench import flink as bf
from tests.conftest import require_cgroups
from tests.flink_support import require_flink

DSCHED = str(Path(sys.executable).parent / "dsched")
CPU = Path("/sys/fs/cgroup/cpu")
OPS = {"Source:_src_1": 2, "Calc_2": 2, "GroupAggregate_4": 2, "lat_5_:_Writer": 2}
CONTENDER_KEYS = {
    "cpu_allocated_core_seconds",
    "cpu_used_core_seconds",
    "records_written",
    "records_processed",
    "records_lost",
    "records_processed_in_window",
    "latency_ms_mean",
    "latency_ms_p99",
    "backpressured_seconds",
    "allocated_cores_mean_by_operator",
    "series",
}


# ---------------------------------------------------------------- synthetic samples


def _samples(
    caps: dict[bf.Ref, float | None],
    seconds: int = 6,
    cpu_per_subtask: float = 0.1,
    rate_per_subtask: float = 100.0,
    written_per_second: int = 200,
) -> list[bf.Sample]:
    refs = [(op, i) for op, n in OPS.items() for i in range(n)]
    out = []
    for t in range(seconds + 1):
        out.append(
            bf.Sample(
                t=float(t),
                cpu=dict.fromkeys(refs, cpu_per_subtask * t),
                caps=dict(caps),
                records_in=dict.fromkeys(refs, rate_per_subtask * t),
                # Calc's first subtask is back-pressured half of every second.
                backpressured_ms={r: (500.0 * t if r == ("Calc_2", 0) else 0.0) for r in refs},
                written=written_per_second * t,
                taskmanager_cpu=1.0 * t,
            )
        )
    return out


def _data(caps, latencies=(), written=1200, processed=1200) -> bf.PhaseData:
    return bf.PhaseData(
        samples=_samples(caps), latencies=list(latencies), written=written, processed=processed
    )


WINDOW = bf.Window(2.0, 6.0, 1.0)


def test_static_caps_are_charged_and_usage_integrated_over_the_window_only():
    caps = {(op, i): 0.15 for op, n in OPS.items() for i in range(n)}
    s = bf.summarize(_data(caps), WINDOW, OPS, capacity_cores=1.2)
    assert s["cpu_allocated_core_seconds"] == pytest.approx(8 * 0.15 * 4)
    assert s["cpu_used_core_seconds"] == pytest.approx(8 * 0.1 * 4)
    assert s["allocated_cores_mean_by_operator"] == pytest.approx(dict.fromkeys(OPS, 0.3))
    assert s["taskmanager_cpu_core_seconds"] == pytest.approx(4.0)
    # The aggregate's two subtasks received 100 records/s each during the 4 s.
    assert s["records_processed_in_window"] == 800
    assert s["backpressured_seconds"] == pytest.approx(2.0)
    assert s["backpressured_seconds_by_operator"]["Calc_2"] == pytest.approx(2.0)
    assert s["enforcement"]["subtasks_capped_min"] == 8
    series = s["series"]
    assert series["time_s"] == [0.0, 1.0, 2.0, 3.0]
    assert series["rate"] == [200.0] * 4
    assert series["operators"]["Calc_2"]["cap_cores"] == [0.3] * 4
    assert series["operators"]["Calc_2"]["usage_cores"] == pytest.approx([0.2] * 4)
    assert series["backpressured_subtasks"] == [0.5] * 4


def test_uncapped_subtasks_are_charged_an_equal_share_and_never_more_than_the_capacity():
    # None (no cgroup) and a cap at the whole capacity both mean "no cap of its own".
    caps = {(op, i): None for op, n in OPS.items() for i in range(n)}
    caps[("Calc_2", 0)] = 1.2
    s = bf.summarize(_data(caps), WINDOW, OPS, capacity_cores=1.2)
    assert s["cpu_allocated_core_seconds"] == pytest.approx(1.2 * 4)
    assert s["enforcement"]["subtasks_capped_min"] == 0
    # Caps that add up to more than the capacity are charged the capacity.
    big = {(op, i): 0.5 for op, n in OPS.items() for i in range(n)}
    s = bf.summarize(_data(big), WINDOW, OPS, capacity_cores=1.2)
    assert s["cpu_allocated_core_seconds"] == pytest.approx(1.2 * 4)


def test_loss_and_duplicates_come_from_written_against_processed():
    caps = dict.fromkeys(((op, i) for op, n in OPS.items() for i in range(n)), 0.15)
    lost = bf.summarize(_data(caps, written=1200, processed=1190), WINDOW, OPS, 1.2)
    assert (lost["records_lost"], lost["records_duplicated"]) == (10, 0)
    dup = bf.summarize(_data(caps, written=1200, processed=1203), WINDOW, OPS, 1.2)
    assert (dup["records_lost"], dup["records_duplicated"]) == (0, 3)


def test_latency_of_records_written_during_the_warm_up_is_left_out():
    # 400 records were written before the window (2 s at 200/s): 400 values of 5000 ms
    # read early, then 800 of 100 ms. Exactly the first 400 by estimated write time go.
    early = (3.0, np.full(400, 5000))
    late = (6.0, np.full(800, 100))
    caps = dict.fromkeys(((op, i) for op, n in OPS.items() for i in range(n)), 0.15)
    s = bf.summarize(_data(caps, latencies=[late, early]), WINDOW, OPS, 1.2)
    assert s["latency_records"] == 800
    assert s["latency_ms_mean"] == pytest.approx(100.0)
    assert s["latency_ms_p99"] == pytest.approx(100.0)


def test_measured_latencies_orders_by_estimated_write_time():
    values, written_at = bf.measured_latencies(
        [(10.0, np.array([100, 9000])), (11.0, np.array([50]))], warm_records=1, read_lag=0.5
    )
    # Written at 9.4, 0.5 and 10.45 s: the 9,000-ms one was written first and is dropped.
    assert values.tolist() == [100.0, 50.0]
    assert written_at == pytest.approx([9.4, 10.45])
    assert bf.measured_latencies([], 5, 0.5)[0].size == 0


def test_decisions_become_a_demand_series_in_window_time():
    caps = dict.fromkeys(((op, i) for op, n in OPS.items() for i in range(n)), 0.15)
    data = _data(caps)
    data.t0_wall = 1000.0
    data.decisions = [
        {"timestamp": 1003.5, "operators": [{"operator": "Calc_2", "demand_cores": 0.25}]},
        {"timestamp": 1000.5, "operators": [{"operator": "Calc_2", "demand_cores": 9.0}]},
    ]
    s = bf.summarize(data, WINDOW, OPS, 1.2)
    # The second one falls in the warm-up.
    assert s["series"]["operators"]["Calc_2"]["demand_cores"] == [[1.5, 0.25]]
    assert s["decisions"] == 2


# ---------------------------------------------------------------- ratios and targets


def _contender(cpu: float, processed: int, in_window: int, lat: float | None, lost: int = 0):
    return {
        "cpu_allocated_core_seconds": cpu,
        "cpu_used_core_seconds": cpu / 2,
        "records_processed": processed,
        "records_processed_in_window": in_window,
        "records_lost": lost,
        "latency_ms_mean": lat,
        "latency_ms_p99": None if lat is None else 3 * lat,
    }


def test_ratios_are_dsched_over_each_other_contender():
    runs = {
        "dsched": _contender(50.0, 1000, 900, 200.0),
        "static-0.7": _contender(100.0, 1000, 1000, 100.0),
    }
    r = bf.ratios(runs)["static-0.7"]
    assert r["dsched_cpu_allocated_over_other"] == 0.5
    assert r["dsched_throughput_over_other"] == 1.0
    assert r["dsched_throughput_in_window_over_other"] == 0.9
    assert r["dsched_latency_mean_over_other"] == 2.0
    assert bf.ratios({"static-0.7": runs["static-0.7"]}) == {}


def test_targets_hold_fail_and_are_none_without_the_contender_they_need():
    d = _contender(50.0, 1000, 1000, 200.0)
    s7 = _contender(100.0, 1000, 1000, 100.0)
    eq = _contender(50.0, 1000, 1000, 900.0)
    t = bf.targets({"dsched": d, "static-0.7": s7, "equal": eq})
    assert t == {
        "no_records_lost": True,
        "dsched_throughput_at_least_0.97x_static_0.7": True,
        "dsched_cpu_at_most_0.6x_static_0.7": True,
        "dsched_latency_below_equal": True,
    }
    # Missing contenders: None, never True.
    only = bf.targets({"dsched": d})
    assert only["dsched_cpu_at_most_0.6x_static_0.7"] is None
    assert only["dsched_throughput_at_least_0.97x_static_0.7"] is None
    assert only["dsched_latency_below_equal"] is None
    assert bf.targets({})["no_records_lost"] is None
    # Each one fails on its own.
    t = bf.targets(
        {
            "dsched": _contender(61.0, 1000, 960, 950.0, lost=1),
            "static-0.7": s7,
            "equal": eq,
        }
    )
    assert t == {
        "no_records_lost": False,
        "dsched_throughput_at_least_0.97x_static_0.7": False,
        "dsched_cpu_at_most_0.6x_static_0.7": False,
        "dsched_latency_below_equal": False,
    }
    # A lost record by any contender fails the loss target.
    assert (
        bf.targets({"dsched": d, "static-0.7": {**s7, "records_lost": 2}})["no_records_lost"]
        is False
    )


def test_peak_is_set_by_the_busiest_operator():
    per_record = {"src": 10e-6, "calc": 300e-6, "agg": 5e-6, "sink": 0.0}
    peak, busiest = bf.peak_rate_from_calibration(per_record, dict.fromkeys(per_record, 2), 1.2, 8)
    assert busiest == "calc"
    # 2 subtasks x 0.15 core / 300 us x 0.85
    assert peak == pytest.approx(0.85 * 2 * 0.15 / 300e-6)
    with pytest.raises(RuntimeError, match="no CPU per record"):
        bf.peak_rate_from_calibration({"a": 0.0}, {"a": 2}, 1.2, 8)


def test_trace_and_feeder_rates():
    rates, levels = bf.trace_rates("regular", 500.0, 40.0, 4.0, seed=1)
    # The triangle's top slot need not reach the peak exactly; it never exceeds it.
    assert len(rates) == 10 and 0 < max(rates) <= 500.0
    assert rates == pytest.approx(levels * 500.0)
    fed = bf.feeder_rates(rates, 3)
    assert len(fed) == 13 and fed[:3].tolist() == [rates[0]] * 3
    random_a, _ = bf.trace_rates("random", 500.0, 40.0, 4.0, seed=1)
    random_b, _ = bf.trace_rates("random", 500.0, 40.0, 4.0, seed=1)
    assert random_a.tolist() == random_b.tolist()


# ---------------------------------------------------------------- arguments


def _args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    bf.add_arguments(p)
    return p.parse_args(["--json", "/tmp/unused.json", *argv])


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--scenario", "sideways"], "--scenario"),
        (["--scenario", "regular", "--contenders", "dsched,r-storm"], "--contenders"),
        (["--scenario", "regular", "--contenders", "equal,static-0.7"], "--contenders"),
        (["--scenario", "regular", "--contenders", "dsched,dsched"], "--contenders"),
        (["--scenario", "regular", "--duration", "-5"], "--duration"),
        (["--scenario", "regular", "--duration", "nan"], "--duration"),
        (["--scenario", "regular", "--duration", "6"], "--duration"),
        (["--scenario", "regular", "--warmup", "-1"], "--warmup"),
        (["--scenario", "regular", "--slot-seconds", "0"], "--slot-seconds"),
        (["--scenario", "regular", "--slot-seconds", "8"], "--slot-seconds"),
        (["--scenario", "regular", "--capacity-cores", "0"], "--capacity-cores"),
        (["--scenario", "regular", "--capacity-cores", "512"], "--capacity-cores"),
        (["--scenario", "regular", "--peak-rate", "0"], "--peak-rate"),
        (["--scenario", "regular", "--calibration-rate", "-3"], "--calibration-rate"),
        (["--scenario", "regular", "--drain-timeout", "0"], "--drain-timeout"),
        (["--scenario", "regular", "--cpu-period-us", "10"], "--cpu-period-us"),
        (["--scenario", "regular", "--rounds", "0"], "--rounds"),
        (["--scenario", "regular", "--metrics-interval-ms", "10"], "--metrics-interval-ms"),
        (["--scenario", "regular", "--metrics-interval-ms", "2000"], "--metrics-interval-ms"),
        (["--scenario", "regular", "--controller-option", "phi"], "--controller-option"),
        (["--scenario", "regular", "--controller-option", "phi=four"], "--controller-option"),
        (["--scenario", "regular", "--workdir", "/tmp/a b"], "--workdir"),
    ],
)
def test_bad_arguments_are_refused_naming_the_flag(argv, says):
    with pytest.raises(ValueError, match=says):
        bf.check_args(_args(*argv))


def test_bad_argument_from_the_command_is_one_line_and_exit_2(tmp_path):
    out = tmp_path / "r.json"
    p = subprocess.Popen(
        [DSCHED, "bench", "flink", "--scenario", "regular", "--contenders", "equal"]
        + ["--json", str(out), "--workdir", str(tmp_path / "work")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    _stdout, stderr = p.communicate(timeout=60)
    assert p.returncode == 2
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "--contenders" in lines[0] and "'equal'" in lines[0]
    assert not out.exists() and not (tmp_path / "work").exists()
    assert not (CPU / f"dsched-flink-{p.pid}").exists()


# ---------------------------------------------------------------- one real run


@pytest.mark.slow
@pytest.mark.cgroups
def test_a_short_real_run_applies_caps_loses_nothing_and_leaves_nothing(tmp_path):
    require_cgroups()
    require_flink()
    out, work = tmp_path / "flink.json", tmp_path / "work"
    p = subprocess.Popen(
        # dsched's first caps come a few seconds after its daemons start (discovery,
        # the first counter reads, phi slots of history): 8 s of warm-up.
        [DSCHED, "bench", "flink", "--scenario", "regular", "--duration", "12"]
        + ["--warmup", "8", "--contenders", "dsched,static-0.7", "--peak-rate", "800"]
        + ["--drain-timeout", "30", "--json", str(out), "--workdir", str(work)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    stdout, stderr = p.communicate(timeout=240)
    assert p.returncode == 0, stdout[-3000:] + stderr[-3000:]
    doc = json.loads(out.read_text())
    for key in ("scenario", "trace", "calibration", "contenders", "ratios", "targets"):
        assert key in doc, key
    for key in ("revision", "machine", "reference_seconds", "controller_config"):
        assert key in doc, key
    assert set(doc["contenders"]) == {"dsched", "static-0.7"}
    ops = doc["job"]["operators"]
    assert sum(ops.values()) == 8 and any(op.startswith("Calc") for op in ops)
    for name, c in doc["contenders"].items():
        assert CONTENDER_KEYS <= set(c), name
        assert c["records_lost"] == 0 and c["records_written"] > 0, name
        assert c["records_processed"] == c["records_written"], name
        assert c["latency_records"] > 0 and c["latency_ms_mean"] > 0, name
        assert c["enforcement"]["subtasks_capped_min"] == 8, name
        assert c["enforcement"]["threads_in_cgroups_mean"] >= 8, name
    # static-0.7's caps, read back from the cgroup files while it ran: 1.2 / 8 per
    # subtask, 0.3 per operator of two.
    s7 = doc["contenders"]["static-0.7"]
    for op, series in s7["series"]["operators"].items():
        assert series["cap_cores"] and all(c == pytest.approx(0.3) for c in series["cap_cores"]), op
    assert doc["contenders"]["dsched"]["decisions"] > 0
    assert doc["targets"]["no_records_lost"] is True
    assert doc["targets"]["dsched_latency_below_equal"] is None  # equal did not run
    assert set(doc["ratios"]) == {"static-0.7"}
    # Nothing left: cgroups, Flink's processes, the work files.
    assert not list(CPU.glob(f"dsched-flink-{p.pid}*"))
    assert doc["cgroups_left"] == []
    conf = str(work / "flink" / "conf")
    for proc in psutil.process_iter(["cmdline"]):
        assert not any(conf in a for a in proc.info["cmdline"] or []), proc.pid
    assert not (work / "input").exists() and not (work / "flink").exists()
    assert os.path.isdir(work)
