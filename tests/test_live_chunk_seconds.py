"""Every worker of a run does the same work per tuple: the driver's chunk figure.

An instance's per-tuple CPU is a number of hashed 64 KiB chunks, ``cost /
chunk_seconds``. A worker process that timed ``chunk_seconds`` itself, at its
own start, did up to a fifth more or less work per tuple than its neighbours,
depending on what the machine was doing at that moment; the benchmark's
contenders then compared CPU over different work. Real worker processes here:
a figure handed down must change what they burn.
"""

from __future__ import annotations

import math
import random
import time
from pathlib import Path

import pytest

from agent.sampling import stat_seconds
from testbed.live import engine
from testbed.live.distributed import DistributedTopology
from testbed.live.wordcount import WORDS_PER_SENTENCE, wordcount

APP = "wc"
RATE = 60.0
SPLIT_MS, COUNT_MS, SOURCE_MS = 4.0, 0.5, 0.2


@pytest.fixture
def own_chunk_figure(monkeypatch):
    """This process's chunk figure, restored after the test."""
    monkeypatch.setattr(engine, "_HASH_SECONDS", engine._HASH_SECONDS)


def test_calibration_is_a_median_of_rounds_and_refuses_empty_ones():
    seconds = engine.calibrate_hash_seconds(samples=2, rounds=3)
    assert 0 < seconds < 0.01
    for samples, rounds in ((0, 1), (1, 0)):
        with pytest.raises(ValueError, match="samples and rounds must be >= 1"):
            engine.calibrate_hash_seconds(samples=samples, rounds=rounds)


@pytest.mark.parametrize("bad", [0, -1e-5, math.nan, math.inf, True, "5e-5"])
def test_a_bad_figure_is_refused_and_the_old_one_kept(own_chunk_figure, bad):
    engine.set_hash_seconds(4e-5)
    with pytest.raises(ValueError, match="chunk_seconds must be"):
        engine.set_hash_seconds(bad)
    assert engine.hash_seconds() == 4e-5
    with pytest.raises(ValueError, match="chunk_seconds must be"):
        DistributedTopology(
            wordcount(app=APP), lambda t: 1.0, nodes={"n1": None}, chunk_seconds=bad
        )


def test_a_set_figure_decides_the_chunks_of_a_cost(own_chunk_figure):
    engine.set_hash_seconds(1e-4)
    rng = random.Random(3)
    # 2 ms at 0.1 ms a chunk: 20 chunks exactly, no rounding left to chance.
    assert {engine.chunks_for(0.002, rng) for _ in range(20)} == {20}


def _worker_cpu_seconds(pids: list[int]) -> float:
    # A process's stat file has a thread's layout, with every thread's time summed.
    return sum(stat_seconds(Path(f"/proc/{pid}/stat").read_bytes()) for pid in pids)


def _run(chunk_seconds: float, seconds: float) -> tuple[float, int]:
    """Worker processes' CPU seconds and roots completed over ``seconds``."""
    topo = DistributedTopology(
        wordcount(
            app=APP, parallelism=1, source_ms=SOURCE_MS, split_ms=SPLIT_MS, count_ms=COUNT_MS
        ),
        lambda t: RATE,
        nodes={"n1": None},
        chunk_seconds=chunk_seconds,
    )
    topo.start()
    stopped = False
    try:
        pids = [h.pid for h in topo.workers.values()]
        before = _worker_cpu_seconds(pids)
        time.sleep(seconds)
        cpu = _worker_cpu_seconds(pids) - before
        stats = topo.stop(drain_timeout=30)
        stopped = True
        assert stats.lost == 0 and stats.completed == stats.roots
        words = sum(sum(s.values()) for s in topo.final_states().values())
        assert words == WORDS_PER_SENTENCE * stats.roots
        return cpu, stats.roots
    finally:
        if not stopped:
            topo.stop(drain_timeout=5)


@pytest.mark.slow
def test_worker_processes_burn_by_the_drivers_figure():
    seconds = 2.0
    measured = engine.calibrate_hash_seconds(samples=20, rounds=3)
    full, roots = _run(measured, seconds)
    # A chunk "costing" a whole second: every tuple rounds to no chunk at all.
    idle, _ = _run(1.0, seconds)
    per_root = (SOURCE_MS + SPLIT_MS + WORDS_PER_SENTENCE * COUNT_MS) / 1000.0
    expected = RATE * seconds * per_root
    assert roots > 0
    # Workers that timed their own figure would burn alike in both runs.
    assert full - idle > 0.5 * expected, (full, idle, expected)
