"""The live testbed engine: real threads, exact tuple accounting."""

from __future__ import annotations

import threading
import time

import pytest

from testbed.live.engine import LiveTopology
from testbed.live.topology import Acker, OperatorSpec, TopologySpec, Tuple
from testbed.live.wordcount import FANOUT, WORDS_PER_SENTENCE, wordcount


def test_wordcount_processes_every_tuple_exactly_once():
    spec = wordcount(parallelism=2, source_ms=0.05, split_ms=0.1, count_ms=0.05)
    topo = LiveTopology(spec, lambda t: 200.0)
    topo.start()
    time.sleep(1.0)
    stats = topo.stop()
    assert stats.roots > 100
    assert stats.completed == stats.roots and stats.lost == 0 and stats.duplicated == 0
    counted = sum(sum(i.state.values()) for i in topo.instances["count"])
    assert counted == WORDS_PER_SENTENCE * stats.roots
    split_out = sum(i.counters.emitted for i in topo.instances["split"])
    assert split_out == WORDS_PER_SENTENCE * stats.roots
    assert len(stats.latencies) == stats.completed and min(stats.latencies) > 0


def test_fields_grouping_sends_a_key_to_one_instance_only():
    spec = wordcount(parallelism=3, source_ms=0, split_ms=0, count_ms=0)
    topo = LiveTopology(spec, lambda t: 300.0)
    topo.start()
    time.sleep(0.5)
    topo.stop()
    owners: dict[str, int] = {}
    for inst in topo.instances["count"]:
        for word in inst.state:
            assert word not in owners, (
                f"{word} counted by instances {owners[word]} and {inst.index}"
            )
            owners[word] = inst.index


def test_acker_counts_duplicates_and_late_completions():
    a = Acker(timeout_seconds=0.5)
    a.new_root(1, created=100.0)
    root = Tuple(1, (), 100.0, "k", None)
    assert a.processed(root, emitted=2, now=100.1) is None
    child0, child1 = Tuple(1, (0, 0), 100.0, "a", None), Tuple(1, (0, 1), 100.0, "b", None)
    assert a.processed(child0, 0, now=100.2) is None
    assert a.processed(child0, 0, now=100.3) is None  # the same part twice
    assert a.duplicated == 1
    assert a.processed(child1, 0, now=101.0) == pytest.approx(1.0)
    assert a.completed == 1 and a.failed == 1  # completed after the 0.5 s timeout
    assert a.processed(child1, 0, now=101.1) is None and a.duplicated == 2  # after completion


def test_cost_model_of_a_topology():
    spec = wordcount(source_ms=0.2, split_ms=1.0, count_ms=0.3)
    assert spec.cpu_per_root_ms(FANOUT) == pytest.approx(0.2 + 1.0 + 5 * 0.3)


@pytest.mark.parametrize(
    "make",
    [
        lambda: OperatorSpec("a/b", 1, 0.1, lambda t, s: []),
        lambda: OperatorSpec("a", 0, 0.1, lambda t, s: []),
        lambda: OperatorSpec("a", 1, -1, lambda t, s: []),
        lambda: OperatorSpec("a", 1, 0.1, lambda t, s: [], grouping="broadcast"),
        lambda: TopologySpec(
            "x", (OperatorSpec("a", 1, 0.1, lambda t, s: [], upstream=("nope",)),)
        ),
        lambda: TopologySpec("..", (OperatorSpec("a", 1, 0.1, lambda t, s: []),)),
    ],
)
def test_bad_topologies_are_refused(make):
    with pytest.raises(ValueError):
        make()


@pytest.mark.parametrize("cpu", ["process", "thread"])
def test_both_cpu_modes_burn_where_they_say(cpu):
    import os

    spec = wordcount(parallelism=1, source_ms=0.05, split_ms=2.0, count_ms=0.05)
    topo = LiveTopology(spec, lambda t: 100.0, cpu=cpu)
    topo.start()
    try:
        (split,) = topo.instances["split"]
        pid, tid = split.cpu_pid_tid
        if cpu == "process":
            assert pid != os.getpid() and tid == pid and split.cpu_worker.process.poll() is None
        else:
            assert pid == os.getpid() and tid == split.native_id
        time.sleep(0.5)
    finally:
        stats = topo.stop()
    assert stats.completed == stats.roots > 0 and stats.lost == 0
    assert all(
        i.cpu_worker is None or i.cpu_worker.process.poll() is not None
        for i in topo.all_instances()
    )


def test_abort_drops_the_backlog_and_stops_every_process():
    spec = wordcount(parallelism=1, source_ms=0.05, split_ms=20.0, count_ms=0.05)
    topo = LiveTopology(spec, lambda t: 500.0, cpu="process")  # far beyond one core
    topo.start()
    time.sleep(0.5)
    unfinished = topo.abort()
    assert unfinished > 0 and topo.stats().lost == unfinished
    assert not any(i.thread.is_alive() for i in topo.all_instances())
    assert all(i.cpu_worker.process.poll() is not None for i in topo.all_instances())


def test_stop_that_gives_up_on_a_backlog_ends_every_thread_without_an_error(monkeypatch):
    # split: 40 ms a tuple on one instance, fed 500 roots/s for half a second:
    # about ten seconds of backlog, more than stop() waits for.
    errors: list[BaseException] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: errors.append(args.exc_value))
    spec = wordcount(parallelism=1, source_ms=0.05, split_ms=40.0, count_ms=0.05)
    topo = LiveTopology(spec, lambda t: 500.0, cpu="process")
    topo.start()
    time.sleep(0.5)
    stats = topo.stop(drain_timeout=0.1)
    assert not stats.drained and stats.lost > 0
    assert topo.closing.is_set()
    assert not any(i.thread.is_alive() for i in topo.all_instances())
    assert all(i.cpu_worker.process.poll() is not None for i in topo.all_instances())
    assert errors == []


def test_group_keys_route_on_a_field_of_the_value_and_bad_options_are_refused():
    spec = wordcount(parallelism=3, source_ms=0, split_ms=0, count_ms=0)
    with pytest.raises(ValueError, match="cpu"):
        LiveTopology(spec, lambda t: 1.0, cpu="gpu")
    with pytest.raises(ValueError, match="unknown operators"):
        LiveTopology(spec, lambda t: 1.0, group_keys={"nope": str})
    # Key every word on its first letter: words sharing it share an instance.
    topo = LiveTopology(spec, lambda t: 300.0, cpu="thread", group_keys={"count": lambda v: v[0]})
    topo.start()
    time.sleep(0.4)
    topo.stop()
    owner: dict[str, int] = {}
    for inst in topo.instances["count"]:
        for word in inst.state:
            assert owner.setdefault(word[0], inst.index) == inst.index
