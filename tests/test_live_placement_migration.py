"""Worker processes and live moves: real subprocess workers, real Unix-socket IPC.

Every test checks the exact accounting by tuple id (no root lost, none
processed twice) and, for the stateful WordCount counters, that the final
state counts every word exactly once: 5 words per sentence, so the counts
must add up to five times the roots.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from controller.placement.model import Move, Plan
from testbed.live.distributed import DistributedTopology
from testbed.live.wordcount import WORDS_PER_SENTENCE, wordcount

pytestmark = pytest.mark.slow

RATE = 120.0  # roots per second: modest, the machine is shared


def _plan(*moves: Move) -> Plan:
    return Plan(
        strategy="test",
        moves=moves,
        assignment={},
        workers=(),
        affected_workers=(),
        affected_stateful_workers=(),
        new_workers=(),
        stateful_moves=0,
        restarted_stateful=0,
        nodes_used=0,
        mixed_workers=0,
        overloaded_nodes=(),
        inter_node_traffic_before=0.0,
        inter_node_traffic_after=0.0,
        plan_seconds=0.0,
        reasons=(),
    )


def _move(instance: str, from_node: str | None, to_node: str) -> Move:
    return Move(instance, None, from_node, "unused", to_node, "/count/" in instance)


@pytest.fixture
def topology():
    topo = DistributedTopology(
        wordcount(app="wc", parallelism=2, split_ms=0.5),
        lambda t: RATE,
        nodes={"n1": None, "n2": None},
        placement={"wc/count/1": "n2"},
        checkpoint_seconds=0.3,
    )
    topo.start()
    yield topo
    if topo._listener is not None:  # the test failed before stopping it
        topo.stop(drain_timeout=5)


def _stop_and_check(topo: DistributedTopology) -> None:
    stats = topo.stop(drain_timeout=30)
    assert stats.roots > 0
    assert stats.drained
    assert stats.lost == 0
    assert stats.duplicated == 0
    assert stats.completed == stats.roots
    assert topo.stray_acks == 0
    words = sum(sum(state.values()) for state in topo.final_states().values())
    assert words == WORDS_PER_SENTENCE * stats.roots


def _running_once(topo: DistributedTopology) -> None:
    """Every instance is in exactly one live worker."""
    seen: dict[str, str] = {}
    for worker, instances in topo._worker_sets().items():
        for iid in instances:
            assert iid not in seen, f"{iid} runs in {seen[iid]} and {worker}"
            seen[iid] = worker
    assert set(seen) == set(topo.placement())


def test_move_stateless_and_stateful_instances_loses_and_duplicates_nothing(topology):
    time.sleep(1.0)
    result = topology.migrate(
        _plan(_move("wc/split/0", "n1", "n2"), _move("wc/count/0", "n1", "n2"))
    )
    assert sorted(result.moved) == ["wc/count/0", "wc/split/0"]
    assert result.refused == {} and result.rolled_back == {}
    assert result.started_workers == ["wc-stateless-n2"]
    # n1's stateful worker has nothing left: its process ends.
    assert result.stopped_workers == ["wc-stateful-n1"]
    # Source stateless and stateful workers lose one instance each; n2's stateful gains one.
    assert result.affected_workers == ["wc-stateful-n1", "wc-stateful-n2", "wc-stateless-n1"]
    placement = topology.placement()
    assert placement["wc/split/0"] == ("wc-stateless-n2", "n2")
    assert placement["wc/count/0"] == ("wc-stateful-n2", "n2")
    _running_once(topology)
    time.sleep(1.0)  # tuples keep flowing through the new placement
    traffic = topology.traffic_rates()
    assert traffic[("wc/source/0", "wc/split/0")] > 0
    assert {a.split("/")[1] + ">" + b.split("/")[1] for a, b in traffic} == {
        "source>split",
        "split>count",
    }
    _stop_and_check(topology)


def test_target_worker_killed_half_way_rolls_back(topology):
    time.sleep(0.8)

    def kill_target(phase: str, instance: str, worker) -> None:
        if phase == "target-ready":
            worker.kill()
            worker.process.wait(timeout=10)

    result = topology.migrate(
        _plan(_move("wc/split/1", "n1", "n2"), _move("wc/count/0", "n1", "n2")),
        observer=kill_target,
    )
    assert result.moved == []
    assert set(result.rolled_back) == {"wc/split/1", "wc/count/0"}
    assert all("died during the move" in why for why in result.rolled_back.values())
    # count/1 was in the killed stateful worker of n2 without moving: restarted there.
    assert result.restarted == ["wc/count/1"]
    placement = topology.placement()
    assert placement["wc/split/1"][1] == "n1"
    assert placement["wc/count/0"][1] == "n1"
    assert topology.homeless() == []
    _running_once(topology)
    time.sleep(0.8)
    _stop_and_check(topology)


def test_unresponsive_target_worker_is_killed_and_the_move_rolled_back():
    topo = DistributedTopology(
        wordcount(app="wc", parallelism=1, split_ms=0.5),
        lambda t: RATE,
        nodes={"n1": None, "n2": None},
        reply_timeout=2.0,
    )
    topo.start()
    frozen = []

    def freeze_target(phase: str, instance: str, worker) -> None:
        os.kill(worker.pid, signal.SIGSTOP)  # alive but silent
        frozen.append(worker)

    try:
        time.sleep(0.5)
        result = topo.migrate(_plan(_move("wc/split/0", "n1", "n2")), observer=freeze_target)
        assert result.moved == []
        assert list(result.rolled_back) == ["wc/split/0"]
        assert frozen[0].process.poll() is not None, "the silent target was not killed"
        assert topo.placement()["wc/split/0"] == ("wc-stateless-n1", "n1")
        _running_once(topo)
        time.sleep(0.5)
    finally:
        _stop_and_check(topo)


def test_plan_for_vanished_node_restarts_its_instances_from_their_snapshot(topology):
    time.sleep(1.0)  # several checkpoints of count/1 have been taken
    topology.fail_node("n2")
    assert topology.homeless() == ["wc/count/1"]
    time.sleep(0.5)  # tuples for it are held meanwhile
    result = topology.migrate(_plan(_move("wc/count/1", "n2", "n1")))
    assert result.restarted == ["wc/count/1"]
    assert topology.placement()["wc/count/1"] == ("wc-stateful-n1", "n1")
    assert topology.homeless() == []
    _running_once(topology)
    time.sleep(0.5)
    _stop_and_check(topology)


def test_worker_crash_outside_a_move_is_recovered_from_the_backup(topology):
    time.sleep(1.0)
    crashed = topology.workers["wc-stateful-n2"]
    crashed.kill()
    crashed.process.wait(timeout=10)
    crashed.receiver.join(timeout=10)
    assert topology.homeless() == ["wc/count/1"]
    time.sleep(0.3)  # its tuples are held meanwhile
    assert topology.recover() == ["wc/count/1"]
    assert topology.workers["wc-stateful-n2"] is not crashed
    assert topology.homeless() == []
    _running_once(topology)
    time.sleep(0.5)
    _stop_and_check(topology)


def test_moves_to_unknown_node_or_from_a_stale_place_are_refused(topology):
    before = topology.placement()
    result = topology.migrate(
        _plan(
            _move("wc/split/0", "n1", "n9"),
            _move("wc/count/1", "n1", "n2"),  # it runs on n2, not n1
            _move("wc/nosuch/0", "n1", "n2"),
            _move("other/split/0", "n1", "n2"),  # another application: not ours to move
        )
    )
    assert result.refused == {
        "wc/split/0": "target node 'n9' is not in the testbed",
        "wc/count/1": "stale plan: instance runs on 'n2', plan says 'n1'",
        "wc/nosuch/0": "unknown instance 'wc/nosuch/0'",
    }
    assert result.moved == [] and result.affected_workers == []
    assert topology.placement() == before
    time.sleep(0.5)
    _stop_and_check(topology)


def test_workers_reach_the_driver_over_tcp():
    topo = DistributedTopology(
        wordcount(app="wc", parallelism=1, split_ms=0.5),
        lambda t: RATE,
        nodes={"n1": None, "n2": None},
        listen=("127.0.0.1", 0),
    )
    topo.start()
    try:
        assert topo._listener.address[0] == "127.0.0.1"
        time.sleep(0.5)
        result = topo.migrate(_plan(_move("wc/split/0", "n1", "n2")))
        assert result.moved == ["wc/split/0"]
        time.sleep(0.5)
    finally:
        _stop_and_check(topo)


def test_bad_construction_arguments_name_the_parameter():
    spec = wordcount(app="wc", parallelism=1)
    with pytest.raises(ValueError, match="nodes"):
        DistributedTopology(spec, lambda t: 1.0, nodes={})
    with pytest.raises(ValueError, match="unknown node 'n3'"):
        DistributedTopology(spec, lambda t: 1.0, nodes={"n1": None}, placement={"wc/split/0": "n3"})
    with pytest.raises(ValueError, match="unknown instances"):
        DistributedTopology(spec, lambda t: 1.0, nodes={"n1": None}, placement={"wc/x/0": "n1"})
    with pytest.raises(ValueError, match="checkpoint_seconds"):
        DistributedTopology(spec, lambda t: 1.0, nodes={"n1": None}, checkpoint_seconds=0)
