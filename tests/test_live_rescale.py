"""Rescaling operators of a running DistributedTopology: real worker processes,
real agents' registration sockets, the real move endpoint over HTTP.

Every run is checked three ways: the acker's counts by tuple id (no root lost,
none processed twice), a ledger kept in the stateful operator's own state (every
tuple id it processed, so a tuple counted twice or dropped during a state
hand-over shows there), and the final word counts against the words the source
emitted.
"""

from __future__ import annotations

import json
import random
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from contextlib import ExitStack

import pytest

from controller.config import ControllerConfig
from controller.edges.parallelism import (
    ParallelismChange,
    ParallelismEdge,
    TestbedParallelism,
)
from dsched.config import ConfigError, from_dict
from dsched.ids import InstanceKey, OperatorKey
from testbed.live.actuator import MoveEndpoint
from testbed.live.distributed import DistributedTopology
from testbed.live.topology import OperatorSpec, TopologySpec, Tuple, key_slot
from testbed.live.wordcount import WORDS, WORDS_PER_SENTENCE
from tests.test_agent_support import node_agents, wait_for

pytestmark = pytest.mark.slow

RATE = 100.0  # roots per second: modest, the machine is shared
APP = "rs"


def _emit(t: Tuple, state: dict) -> list:
    return [(t.key, t.value)]


def _split(t: Tuple, state: dict) -> list:
    return [(w, w) for w in t.value.split()]


def _count_ids(t: Tuple, state: dict) -> list:
    # word -> the (root, tid) of every tuple counted for it: the count is its length.
    state.setdefault(t.key, []).append((t.root, t.tid))
    return []


def _count_total(t: Tuple, state: dict) -> list:
    # Not keyed by the grouping key: such a state cannot follow a new key map.
    state["total"] = state.get("total", 0) + 1
    return []


def _spec(sentences: list[str], count_fn=_count_ids, count_parallelism: int = 1) -> TopologySpec:
    def make_root(n: int, rng: random.Random) -> tuple[str, str]:
        sentence = " ".join(rng.choice(WORDS) for _ in range(WORDS_PER_SENTENCE))
        sentences.append(sentence)  # the driver injects roots in order, under its lock
        return str(n), sentence

    return TopologySpec(
        app=APP,
        operators=(
            OperatorSpec("source", 1, 0.1, _emit),
            OperatorSpec("split", 1, 0.3, _split, upstream=("source",)),
            OperatorSpec(
                "count",
                count_parallelism,
                0.2,
                count_fn,
                upstream=("split",),
                stateful=True,
                grouping="fields",
            ),
        ),
        make_root=make_root,
    )


def _stop_and_check(topo: DistributedTopology, sentences: list[str]) -> None:
    """0 lost and 0 duplicated by tuple id, and counts exactly the words emitted."""
    stats = topo.stop(drain_timeout=30)
    assert stats.roots > 0 and stats.drained
    assert stats.lost == 0
    assert stats.duplicated == 0
    assert stats.completed == stats.roots == len(sentences)
    assert topo.stray_acks == 0
    ledger = [
        (root, tuple(tid))
        for state in topo.final_states().values()
        for ids in state.values()
        for root, tid in ids
    ]
    assert len(ledger) == len(set(ledger)), "a tuple id was counted twice"
    expected = {(r, (0, 0, 0, j)) for r in range(stats.roots) for j in range(WORDS_PER_SENTENCE)}
    assert set(ledger) == expected, "a tuple id was never counted"
    counts = Counter()
    for state in topo.final_states().values():
        for word, ids in state.items():
            assert word not in counts, f"{word!r} is held by two instances"
            counts[word] = len(ids)
    assert counts == Counter(w for s in sentences for w in s.split())


def _keys_at_their_owner(topo: DistributedTopology) -> None:
    states = {int(iid.rsplit("/", 1)[1]): s for iid, s in topo.final_states().items()}
    for index, state in states.items():
        assert all(key_slot(word, len(states)) == index for word in state), index


def test_count_and_split_rescaled_under_load_lose_and_duplicate_nothing(tmp_path):
    sentences: list[str] = []
    with ExitStack() as stack:
        agents = node_agents(stack, tmp_path)
        topo = DistributedTopology(
            _spec(sentences),
            lambda t: RATE,
            nodes={n: path for n, (_, path) in agents.items()},
            checkpoint_seconds=0.3,
        )
        topo.start()
        try:
            time.sleep(0.8)
            up = topo.rescale("count", 2)
            assert up.done and up.reason is None, up
            assert (up.before, up.after) == (1, 2)
            assert up.started == [f"{APP}/count/1"] and up.stopped == []
            assert up.moved_keys > 0
            # The new instance went to the emptier node and got a worker there.
            assert up.started_workers == [f"{APP}-stateful-n2"]
            assert topo.placement()[f"{APP}/count/1"] == (f"{APP}-stateful-n2", "n2")
            _keys_at_their_owner(topo)
            # It registered with n2's agent like any other instance (cap, counters).
            tid = topo.active()[("count", 1)][3]
            n2 = agents["n2"][0]
            assert wait_for(
                lambda: (
                    (rec := n2.registry.get(InstanceKey(APP, "count", 1))) is not None
                    and rec.tids == {tid}
                ),
                timeout=10,
            )
            assert topo.instance_counts() == {"source": 1, "split": 1, "count": 2}
            time.sleep(0.8)  # tuples flow under the new key map

            out = topo.rescale("split", 2)
            assert out.done and out.started == [f"{APP}/split/1"], out
            assert out.pause_seconds == 0.0
            time.sleep(0.8)
            traffic = topo.traffic_rates()
            assert traffic[(f"{APP}/source/0", f"{APP}/split/1")] > 0
            out = topo.rescale("split", 1)
            assert out.done and out.stopped == [f"{APP}/split/1"], out
            assert all(f"{APP}/split/1" not in pair for pair in topo.traffic_rates())
            time.sleep(0.5)

            down = topo.rescale("count", 1)
            assert down.done and down.stopped == [f"{APP}/count/1"], down
            assert down.moved_keys > 0
            assert f"{APP}-stateful-n2" in down.stopped_workers  # left empty: it exits
            assert wait_for(
                lambda: n2.registry.get(InstanceKey(APP, "count", 1)) is None, timeout=10
            )
            assert list(topo.final_states()) == [f"{APP}/count/0"]
            time.sleep(0.5)
            assert len(topo.rescales_done) == 4
        finally:
            _stop_and_check(topo, sentences)


def test_refusals_change_nothing():
    sentences: list[str] = []
    topo = DistributedTopology(
        _spec(sentences),
        lambda t: RATE,
        nodes={"n1": None},
        checkpoint_seconds=0.3,
        max_instances=3,
    )
    topo.start()
    try:
        time.sleep(0.3)
        refused = {
            "zero": topo.rescale("count", 0),
            "over": topo.rescale("count", 4),
            "unknown": topo.rescale("nosuch", 2),
            "not an int": topo.rescale("split", 2.0),
            "bad node": topo.rescale("split", 2, node="n9"),
        }
        for name, r in refused.items():
            assert not r.done and r.reason, name
            assert r.before == r.after and r.started == r.stopped == [], name
        assert "must be >= 1" in refused["zero"].reason
        assert "limit of 3" in refused["over"].reason
        assert "unknown operator 'nosuch'" in refused["unknown"].reason
        assert "integer" in refused["not an int"].reason
        assert "'n9' is not in the testbed" in refused["bad node"].reason
        same = topo.rescale("count", 1)
        assert same.done and same.started == same.stopped == []
        assert topo.instance_counts() == {"source": 1, "split": 1, "count": 1}
        assert sorted(topo.workers) == [f"{APP}-stateful-n1", f"{APP}-stateless-n1"]
        time.sleep(0.3)
    finally:
        _stop_and_check(topo, sentences)


def test_state_not_keyed_by_the_grouping_key_is_rolled_back():
    sentences: list[str] = []
    topo = DistributedTopology(
        _spec(sentences, count_fn=_count_total, count_parallelism=2),
        lambda t: RATE,
        nodes={"n1": None},
        checkpoint_seconds=0.3,
    )
    topo.start()
    try:
        time.sleep(0.6)
        r = topo.rescale("count", 3)
        assert not r.done and "not keyed by the grouping key" in r.reason, r
        assert "run on unchanged" in r.reason
        assert topo.instance_counts()["count"] == 2 and len(topo.final_states()) == 2
        time.sleep(0.5)
    finally:
        stats = topo.stop(drain_timeout=30)
    assert stats.lost == 0 and stats.duplicated == 0 and stats.completed == stats.roots
    total = sum(s.get("total", 0) for s in topo.final_states().values())
    assert total == WORDS_PER_SENTENCE * stats.roots


def test_controller_actuator_rescales_through_the_endpoint():
    sentences: list[str] = []
    topo = DistributedTopology(
        _spec(sentences), lambda t: RATE, nodes={"n1": None, "n2": None}, checkpoint_seconds=0.3
    )
    with MoveEndpoint() as endpoint:
        topo.start()
        endpoint.attach(topo)
        try:
            cfg = from_dict(
                ControllerConfig,
                {
                    "parallelism": {
                        "actuator": "testbed",
                        "url": endpoint.url,
                        "timeout_seconds": 20,
                    }
                },
            )
            actuator = ParallelismEdge.from_config(cfg).actuator
            assert isinstance(actuator, TestbedParallelism) and actuator.timeout_seconds == 20
            time.sleep(0.5)
            split, count = OperatorKey(APP, "split"), OperatorKey(APP, "count")
            gone, zero = OperatorKey("other", "count"), OperatorKey(APP, "source")
            out = actuator.apply(
                [
                    ParallelismChange(split, 1, 2, "test"),
                    ParallelismChange(count, 1, 2, "test"),
                    ParallelismChange(gone, 1, 2, "test"),
                    ParallelismChange(zero, 1, 0, "test"),
                ]
            )
            assert out[split] is None and out[count] is None, out
            assert out[gone] == "application 'other' is not running in this testbed"
            assert "must be >= 1" in out[zero]
            with urllib.request.urlopen(f"{endpoint.url}/parallelism", timeout=5) as reply:
                assert json.loads(reply.read()) == {APP: {"source": 1, "split": 2, "count": 2}}
            time.sleep(0.5)
            out = actuator.apply([ParallelismChange(count, 2, 1, "test")])
            assert out == {count: None}
            assert actuator.requests == 2 and endpoint.requests == {"/rescale": 2}
            # A malformed request is a 400 naming the field; nothing changes.
            bad = urllib.request.Request(
                f"{endpoint.url}/rescale",
                data=json.dumps({"changes": [{"app": APP, "operator": "count"}]}).encode(),
                method="POST",
            )
            with pytest.raises(urllib.error.HTTPError) as err:
                urllib.request.urlopen(bad, timeout=5)
            assert err.value.code == 400 and "changes[0].count" in err.value.read().decode()
            assert topo.instance_counts()["count"] == 1
            time.sleep(0.3)
        finally:
            _stop_and_check(topo, sentences)


def test_hung_endpoint_times_out_once_and_is_not_asked_again_at_once():
    now = [0.0]
    with MoveEndpoint() as endpoint:
        actuator = TestbedParallelism(
            endpoint.url, timeout_seconds=1.0, retry_after_seconds=60.0, clock=lambda: now[0]
        )
        key = OperatorKey(APP, "count")
        change = [ParallelismChange(key, 1, 2, "test")]
        # A plan in progress holds the endpoint: the rescale waits behind it.
        endpoint._serialize.acquire()
        try:
            t0 = time.monotonic()
            first = actuator.apply(change)[key]
            assert time.monotonic() - t0 < 5
            assert "did not answer" in first and "timed out" in first, first
            now[0] = 10.0
            second = actuator.apply(change)[key]
            assert second.startswith("not sent: the testbed failed 10 s ago"), second
            assert "next try in 50 s" in second
            assert actuator.requests == 1
        finally:
            endpoint._serialize.release()
        assert wait_for(lambda: endpoint.requests.get("/rescale") == 1, timeout=5)
        time.sleep(0.2)
        assert endpoint.requests == {"/rescale": 1}  # no retry storm
        now[0] = 61.0
        third = actuator.apply(change)[key]
        assert third == f"application {APP!r} is not running in this testbed"
        assert actuator.requests == 2


def test_unreachable_testbed_is_a_reason_not_an_exception():
    with MoveEndpoint() as endpoint:
        url = endpoint.url
    actuator = TestbedParallelism(url, timeout_seconds=2.0)
    key = OperatorKey(APP, "count")
    out = actuator.apply([ParallelismChange(key, 1, 2, "test")])
    assert "did not answer" in out[key]


@pytest.mark.parametrize(
    ("table", "key"),
    [
        ({"actuator": "testbed"}, "parallelism.url"),
        ({"actuator": "testbed", "url": "ftp://127.0.0.1:1"}, "parallelism.url"),
        ({"actuator": "testbed", "url": "http://127.0.0.1"}, "parallelism.url"),
        ({"actuator": "recommend", "timeout_seconds": 0}, "parallelism.timeout_seconds"),
        ({"retry_after_seconds": -1}, "parallelism.retry_after_seconds"),
        ({"actuator": "storm"}, "parallelism.actuator"),
    ],
)
def test_bad_testbed_actuator_config_names_the_key(table, key):
    with pytest.raises(ConfigError) as exc:
        from_dict(ControllerConfig, {"parallelism": table})
    assert exc.value.key == key, str(exc.value)


def test_a_slow_endpoint_does_not_block_concurrent_reads():
    """GET /parallelism answers while a rescale request waits behind a plan."""
    with MoveEndpoint() as endpoint:
        endpoint._serialize.acquire()
        waiting = threading.Thread(
            target=TestbedParallelism(endpoint.url, timeout_seconds=1.0).apply,
            args=([ParallelismChange(OperatorKey(APP, "count"), 1, 2, "test")],),
        )
        waiting.start()
        try:
            with urllib.request.urlopen(f"{endpoint.url}/parallelism", timeout=5) as reply:
                assert json.loads(reply.read()) == {}
        finally:
            endpoint._serialize.release()
            waiting.join(timeout=5)
