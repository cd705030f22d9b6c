"""`dsched profile`: Alg. 1 over real trials of a testbed operator on real threads
under a real cgroup v1 cap, written as a table the controller loads.

Rates in the tiny run stay far below what the slot can process and the slope
bound is loose, so the sweep's outcome does not hinge on this machine's load;
a separate trial at three times the slot's capacity must be judged unstable.
"""

from __future__ import annotations

import json
import os
import subprocess
from types import SimpleNamespace

import numpy as np
import pytest

from controller.edges.models import read_table
from dsched import cli
from predict.perfmodel import TrialResult, is_stable
from testbed.profile import CGROUP_V1_CPU, Profiler, profile, remove_stale_trees, resolve
from tests.conftest import require_cgroups


def _leftover(pid: int) -> bool:
    return (CGROUP_V1_CPU / f"dsched-profile-{pid}").exists()


def test_profile_writes_a_model_whose_peak_rate_does_not_fall_with_threads(tmp_path, capsys):
    require_cgroups()
    out = tmp_path / "models.json"
    code = cli.main(
        [
            "profile",
            "wordcount/split",
            "--threads=1-2",
            "--trial-seconds=1.2",
            "--warmup-seconds=0.4",
            "--cost-ms=2",
            "--slot-cores=0.5",
            "--rate-step=20",
            "--max-rate=40",
            "--rate-slope-window=2",
            "--max-latency-slope=0.5",
            f"--json={out}",
        ]
    )
    assert code == 0
    assert "model of wordcount/split" in capsys.readouterr().out
    model = read_table(out)["wordcount/split"]
    assert [p.threads for p in model.points] == [1, 2]
    assert model.peak_rate(1) > 0
    assert model.peak_rate(2) >= model.peak_rate(1)
    assert model.cpu_percent(1) > 0 and model.memory_percent(1) > 0
    doc = json.loads(out.read_text())
    trials = doc["profile"]["wordcount/split"]["trials"]
    assert {t["threads"] for t in trials} == {1, 2}
    assert all(t["measured_rate"] > 0 for t in trials)
    assert not _leftover(os.getpid())


def test_a_rate_beyond_the_slot_is_unstable_by_the_latency_slope():
    require_cgroups()
    # 4 ms per tuple on a quarter core: about 62 tuples/s; offered 200/s.
    profiler = Profiler(
        resolve("wordcount/split", cost_ms=4.0),
        slot_cores=0.25,
        trial_seconds=1.5,
        warmup_seconds=0.5,
    )
    result = profiler.run_trial(1, 200.0)
    assert profiler.trials[-1].latency_slope > 0.5
    assert not is_stable(result.timestamps, result.latencies, 0.5, 0.5)
    assert profiler.trials[-1].measured_rate < 150.0
    assert not _leftover(os.getpid())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["nosuch/op"], "unknown operator 'nosuch/op' (known: wordcount/source"),
        (["wordcount/split", "--threads=2-4"], "--threads must start at 1"),
        (["wordcount/split", "--threads=1-0"], "--threads: the last thread count"),
        (["wordcount/split", "--threads=one"], "--threads must be N or FIRST-LAST"),
        (["wordcount/split", "--trial-seconds=2", "--warmup-seconds=2"], "--warmup-seconds"),
        (["wordcount/split", "--rate-step=0"], "--rate-step must be a number > 0"),
        (["wordcount/split", "--rate-step=10", "--max-rate=5"], "--max-rate must be"),
        (["wordcount/split", "--slot-cores=-1"], "--slot-cores must be a number > 0"),
        (["httpmon/alarm"], "receives no steady input"),
    ],
)
def test_bad_arguments_exit_2_before_anything_runs(args, message, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["profile", *args])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_an_existing_file_that_is_not_a_table_is_not_overwritten(tmp_path, capsys):
    path = tmp_path / "notes.json"
    path.write_text("my notes")
    with pytest.raises(SystemExit) as exc:
        cli.main(["profile", "wordcount/split", f"--json={path}"])
    assert exc.value.code == 2
    assert "is not a model table" in capsys.readouterr().err
    assert path.read_text() == "my notes"


def test_a_tree_left_by_a_killed_run_is_removed_and_a_live_ones_is_not():
    require_cgroups()
    gone = subprocess.Popen(["true"])
    gone.wait()
    stale = CGROUP_V1_CPU / f"dsched-profile-{gone.pid}"
    live = CGROUP_V1_CPU / f"dsched-profile-{os.getpid()}"
    try:
        (stale / "wordcount" / "w").mkdir(parents=True)
        live.mkdir()
        assert remove_stale_trees() == [stale.name]
        assert not stale.exists() and live.exists()
    finally:
        for tree in (stale / "wordcount" / "w", stale / "wordcount", stale, live):
            if tree.exists():
                tree.rmdir()


class _Stub:
    """Trials of an operator that sustains 30 tuples/s whatever its threads."""

    warmup_seconds = 0.0

    def __init__(self):
        self.trials = []
        self.target = resolve("wordcount/split")

    def run_trial(self, threads, rate):
        slope = 0.0 if rate <= 30.0 else 1.0
        self.trials.append(
            SimpleNamespace(threads=threads, rate=rate, latency_slope=slope, stable=None)
        )
        t = np.linspace(0.0, 1.0, 10)
        return TrialResult(10.0, 1.0, t, 0.01 + slope * t)


def test_a_first_step_one_thread_cannot_sustain_is_halved_until_it_can():
    stub, grids = _Stub(), []
    model = profile(
        stub,
        max_threads=3,
        max_rate=800.0,
        rate_step=100.0,
        max_latency_slope=0.02,
        rate_slope_window=2,
        refine=3,
        on_refine=lambda step, top: grids.append((step, top)),
    )
    assert grids == [(50.0, 400.0), (25.0, 200.0)]
    assert [(p.threads, p.peak_rate) for p in model.points] == [(1, 25.0), (2, 25.0)]
    assert model.name == "wordcount/split"
    with pytest.raises(ValueError, match="unstable with 1 thread"):
        profile(
            _Stub(),
            max_threads=2,
            max_rate=800.0,
            rate_step=100.0,
            max_latency_slope=0.02,
            rate_slope_window=2,
        )
