"""Batched counter updates over the real registration socket, the counter checks they
rely on, and the sampler's rebuild-on-change view of the threads."""

from __future__ import annotations

import json
import math
import os
import socket
import threading
import urllib.request

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.config import AgentConfig
from agent.instance_client import AgentClient
from agent.node import NodeAgent
from agent.registry import Counters, RegistrationError, check_counters
from agent.wire import MAX_LINE_BYTES, encode_update_batches
from dsched.ids import InstanceKey
from tests.test_agent_support import (
    COUNTERS,
    WorkerThread,
    free_port,
    registration_server,
    wait_for,
)


@pytest.fixture
def served(tmp_path):
    with registration_server(tmp_path) as (agent, _server, path):
        yield agent, path


@pytest.fixture
def threads():
    made: list[WorkerThread] = []

    def make(n: int) -> list[WorkerThread]:
        new = [WorkerThread() for _ in range(n)]
        made.extend(new)
        return new

    yield make
    for t in made:
        t.join()


def _raw(path, *messages) -> list[dict]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(5)
        s.connect(str(path))
        s.sendall(b"".join((json.dumps(m) + "\n").encode() for m in messages))
        reader = s.makefile("rb")
        return [json.loads(reader.readline()) for _ in messages]


def _metric(agent, name, **labels) -> float:
    return agent.metrics.registry.get_sample_value(name, labels or None) or 0.0


def _register(agent, threads, n: int, app: str = "wc", operator: str = "count") -> None:
    for i, t in enumerate(threads(n)):
        agent.register(app, operator, i, "w1", False, os.getpid(), t.tid)


def _item(instance: int, **overrides) -> dict:
    return {"app": "wc", "operator": "count", "instance": instance, **COUNTERS, **overrides}


def test_client_sends_all_instances_counters_in_one_batch_per_flush(served, threads):
    agent, path = served
    client = AgentClient(str(path), flush_seconds=60)
    try:
        tids = [t.tid for t in threads(20)]
        for i, tid in enumerate(tids):
            client.register("wc", "count", i, "w1", False, tid=tid)
        assert client.flush()
        for i in range(20):
            client.update("wc", "count", i, **{**COUNTERS, "received": 100 + i})
        assert client.flush()
        assert _metric(agent, "dsched_agent_instance_messages_total", op="updates") == 1
        assert _metric(agent, "dsched_agent_instance_messages_total", op="update") == 0
        received = [
            agent.registry.get(InstanceKey("wc", "count", i)).counters.received for i in range(20)
        ]
        assert received == [100 + i for i in range(20)]
        assert list(client.rejections) == []
    finally:
        client.close()


def test_nan_in_one_batch_item_rejects_that_item_only_and_counts_it(served, threads):
    agent, path = served
    _register(agent, threads, 3)
    (first,) = _raw(path, {"op": "updates", "items": [_item(i) for i in range(3)]})
    assert first == {"ok": True, "accepted": 3, "rejected": []}
    newer = {**COUNTERS, "received": 20, "executed": 9}
    (reply,) = _raw(
        path,
        {
            "op": "updates",
            "items": [
                _item(0, **newer),
                _item(1, **{**newer, "latency_sum_seconds": math.nan}),
                _item(2, **newer),
            ],
        },
    )
    assert reply["ok"] is False and reply["accepted"] == 2
    assert [(r["index"], r["reason"]) for r in reply["rejected"]] == [(1, "non_finite")]
    assert _metric(agent, "dsched_agent_rejected_instance_messages_total", reason="non_finite") == 1
    counters = [agent.registry.get(InstanceKey("wc", "count", i)).counters for i in range(3)]
    assert [c.received for c in counters] == [20, 10, 20]
    # The refused item keeps its last good counters, all of them.
    assert counters[1] == Counters(**COUNTERS)
    agent.sample()
    assert all(math.isfinite(s.latency_sum_seconds_total) for s in agent.report().instances)


def test_client_reports_the_refused_item_of_a_batch(served, threads):
    agent, path = served
    client = AgentClient(str(path), flush_seconds=60)
    try:
        (t0, t1) = threads(2)
        client.register("wc", "count", 0, "w1", False, tid=t0.tid)
        client.register("wc", "count", 1, "w1", False, tid=t1.tid)
        client.update("wc", "count", 0, **COUNTERS)
        client.update("wc", "count", 1, **COUNTERS)
        assert client.flush()
        client.update("wc", "count", 0, **{**COUNTERS, "received": 11})
        client.update("wc", "count", 1, **{**COUNTERS, "emitted": -4})
        assert client.flush()
        (refused,) = client.rejections
        assert refused["reason"] == "negative"
        assert refused["message"]["op"] == "update" and refused["message"]["instance"] == 1
        assert agent.registry.get(InstanceKey("wc", "count", 0)).counters.received == 11
        assert agent.registry.get(InstanceKey("wc", "count", 1)).counters.emitted == 16
    finally:
        client.close()


@pytest.mark.parametrize(
    "message",
    [
        {"op": "updates"},
        {"op": "updates", "items": None},
        {"op": "updates", "items": {"0": {}}},
        {"op": "updates", "items": "[]"},
    ],
    ids=["no_items", "null_items", "object_items", "string_items"],
)
def test_malformed_batch_is_refused_whole_and_counted(served, threads, message):
    agent, path = served
    _register(agent, threads, 1)
    replies = _raw(path, message, {"op": "updates", "items": [_item(0)]})
    assert replies[0]["ok"] is False and replies[0]["reason"] == "bad_message"
    assert "rejected" not in replies[0]
    assert (
        _metric(agent, "dsched_agent_rejected_instance_messages_total", reason="bad_message") == 1
    )
    # The connection lives on: the next batch is applied.
    assert replies[1] == {"ok": True, "accepted": 1, "rejected": []}


def test_bad_items_are_refused_by_index_with_their_reason(served, threads):
    agent, path = served
    _register(agent, threads, 2)
    items = [
        7,
        _item(0, app="../etc"),
        {**_item(0), "instance": True},
        _item(5),
        {k: v for k, v in _item(0).items() if k != "emitted"},
        _item(1, received="many"),
        _item(1, executed=math.inf),
        _item(0, received=11),
    ]
    (reply,) = _raw(path, {"op": "updates", "items": items})
    assert reply["accepted"] == 1
    assert [(r["index"], r["reason"]) for r in reply["rejected"]] == [
        (0, "bad_message"),
        (1, "bad_name"),
        (2, "bad_field"),
        (3, "unknown_instance"),
        (4, "bad_field"),
        (5, "bad_field"),
        (6, "non_finite"),
    ]
    for reason, n in [
        ("bad_message", 1),
        ("bad_name", 1),
        ("bad_field", 3),
        ("unknown_instance", 1),
        ("non_finite", 1),
    ]:
        assert _metric(agent, "dsched_agent_rejected_instance_messages_total", reason=reason) == n
    # `instance: true` must not land on instance 1 (True == 1 in Python).
    assert agent.registry.get(InstanceKey("wc", "count", 1)).counters == Counters()
    assert agent.registry.get(InstanceKey("wc", "count", 0)).counters.received == 11


def test_single_update_form_still_works(served, threads):
    agent, path = served
    _register(agent, threads, 1)
    replies = _raw(
        path,
        {"op": "update", **_item(0)},
        {"op": "update", **_item(0, received=3)},
    )
    assert replies[0] == {"ok": True}
    assert replies[1]["ok"] is False and replies[1]["reason"] == "counter_backwards"
    assert agent.registry.get(InstanceKey("wc", "count", 0)).counters.received == 10
    assert _metric(agent, "dsched_agent_instance_messages_total", op="update") == 2


def test_client_falls_back_to_single_updates_old_agent_stand_in(tmp_path):
    """An agent from before the batch form, stood in for by a socket that speaks its protocol."""
    path = tmp_path / "old.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen()
    seen: list[dict] = []

    def old_agent() -> None:
        conn, _ = listener.accept()
        with conn, conn.makefile("rb") as reader:
            for line in reader:
                msg = json.loads(line)
                seen.append(msg)
                if msg["op"] in ("register", "update", "unregister"):
                    reply = {"ok": True}
                else:
                    reply = {
                        "ok": False,
                        "reason": "bad_message",
                        "error": f"unknown op {msg['op']!r}",
                    }
                conn.sendall((json.dumps(reply) + "\n").encode())

    server = threading.Thread(target=old_agent, daemon=True)
    server.start()
    # The stand-in serves one connection: a reply slowed past the timeout by a
    # loaded machine would make the client reconnect to nobody.
    client = AgentClient(str(path), flush_seconds=60, reply_timeout=30.0)
    try:
        client.update("wc", "count", 0, **COUNTERS)
        client.update("wc", "count", 1, **COUNTERS)
        assert client.flush(timeout=30.0)
        assert wait_for(lambda: len(seen) == 3, timeout=30.0)
        assert [m["op"] for m in seen] == ["updates", "update", "update"]
        assert sorted(m["instance"] for m in seen[1:]) == [0, 1]
        assert list(client.rejections) == []
    finally:
        client.close()
        listener.close()


def test_batches_stay_under_the_line_limit_and_keep_every_item_in_order():
    items = [
        {"app": "a" * 120, "operator": "o" * 120, "instance": i, **COUNTERS} for i in range(1000)
    ]
    batches, oversized = encode_update_batches(items)
    assert oversized == []
    assert len(batches) > 1
    assert all(len(line) <= MAX_LINE_BYTES and line.endswith(b"\n") for line, _ in batches)
    assert [i for _, carried in batches for i in carried] == items
    for line, carried in batches:
        assert json.loads(line) == {"op": "updates", "items": carried}
    huge = {"app": "x" * MAX_LINE_BYTES, "operator": "o", "instance": 0, **COUNTERS}
    batches, oversized = encode_update_batches([items[0], huge])
    assert oversized == [huge] and [c for _, c in batches] == [[items[0]]]


def test_client_sends_many_instances_in_several_lines_all_applied(served, threads):
    agent, path = served
    n = 300
    app, operator = "a" * 100, "o" * 100
    _register(agent, threads, n, app=app, operator=operator)
    client = AgentClient(str(path), flush_seconds=60)
    try:
        for i in range(n):
            client.update(app, operator, i, **{**COUNTERS, "received": 1000 + i})
        assert client.flush()
        lines = _metric(agent, "dsched_agent_instance_messages_total", op="updates")
        assert 1 < lines < n
        assert all(
            agent.registry.get(InstanceKey(app, operator, i)).counters.received == 1000 + i
            for i in range(n)
        )
    finally:
        client.close()


def test_unchanged_update_keeps_the_same_counters_object():
    previous = Counters(**COUNTERS)
    assert check_counters({**COUNTERS, "app": "ignored"}, previous) is previous
    changed = check_counters({**COUNTERS, "received": 11}, previous)
    assert changed == previous._replace(received=11)
    # A whole number sent as a float is stored as an int.
    assert type(check_counters({**COUNTERS, "received": 12.0}, previous).received) is int


_number = st.one_of(
    st.integers(min_value=-5, max_value=50),
    st.floats(min_value=-5, max_value=50),
    st.sampled_from([math.nan, math.inf, -math.inf]),
    st.booleans(),
    st.none(),
    st.just("7"),
)


@settings(max_examples=300, deadline=None)
@given(
    previous=st.builds(
        Counters,
        received=st.integers(0, 30),
        executed=st.integers(0, 30),
        emitted=st.integers(0, 30),
        queue_length=st.integers(0, 30),
        latency_sum_seconds=st.floats(0, 30),
        latency_count=st.integers(0, 30),
        service_seconds=st.floats(0, 30),
    ),
    values=st.fixed_dictionaries({name: _number for name in Counters._fields}),
)
def test_accepted_counters_are_finite_whole_and_never_go_backwards(previous, values):
    try:
        out = check_counters(values, previous)
    except RegistrationError as exc:
        assert exc.reason in {"bad_field", "non_finite", "negative", "counter_backwards"}
        return
    for name in Counters._fields:
        value = getattr(out, name)
        assert type(value) in (int, float) and math.isfinite(value) and value >= 0
        assert value == values[name]
        if name != "queue_length":
            assert value >= getattr(previous, name)
        if name in ("received", "executed", "emitted", "queue_length", "latency_count"):
            assert type(value) is int


def test_sampler_follows_thread_changes_and_closes_stat_files_of_forgotten_instances(threads):
    agent = NodeAgent(AgentConfig(dry_run=True))
    try:
        t0, t1, t2 = threads(3)
        agent.register("wc", "count", 0, "w1", False, os.getpid(), t0.tid)
        agent.register("wc", "split", 0, "w1", False, os.getpid(), t1.tid)
        agent.sample()
        assert agent.thread_cpu.open_files == 2
        # A second thread joins an instance between passes: the next pass reads it.
        agent.register("wc", "count", 0, "w1", False, os.getpid(), t2.tid)
        agent.sample()
        assert agent.thread_cpu.open_files == 3
        assert set(agent.report().instances[0].tids) == {t0.tid, t2.tid}
        # A thread exits: dropped from the instance, its CPU kept in the total.
        before = agent.sampler.cpu_seconds(InstanceKey("wc", "count", 0))
        t2.join()

        def exited_thread_dropped() -> bool:
            # The OS thread outlives Python's join by a moment.
            agent.sample()
            return agent.registry.get(InstanceKey("wc", "count", 0)).tids == {t0.tid}

        assert wait_for(exited_thread_dropped, step=0.05)
        assert agent.sampler.cpu_seconds(InstanceKey("wc", "count", 0)) >= before
        assert agent.metrics.registry.get_sample_value("dsched_agent_threads_managed") == 2
        agent.unregister("wc", "split", 0)
        agent.sample()
        assert agent.thread_cpu.open_files == 1
        assert agent.metrics.registry.get_sample_value("dsched_agent_instances_managed") == 1
    finally:
        agent.close()


def test_usage_metric_is_scraped_per_instance_and_dropped_after_unregister(threads):
    agent = NodeAgent(AgentConfig(dry_run=True))
    port = agent.metrics.serve(f"127.0.0.1:{free_port()}")
    busy = WorkerThread(busy=True)
    try:
        (idle,) = threads(1)
        agent.register("wc", "hot", 0, "w1", False, os.getpid(), busy.tid)
        agent.register("wc", "cold", 0, "w1", False, os.getpid(), idle.tid)
        agent.sample()
        threading.Event().wait(0.5)
        agent.sample()

        def usage(operator: str) -> float | None:
            return agent.metrics.registry.get_sample_value(
                "dsched_instance_cpu_usage_cores",
                {"app": "wc", "operator": operator, "instance_id": "0", "worker": "w1"},
            )

        # A shared machine may give the busy thread well under a core.
        assert usage("hot") > max(0.02, 5 * usage("cold"))
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            text = r.read().decode()
        assert (
            'dsched_instance_cpu_usage_cores{app="wc",instance_id="0",operator="hot",worker="w1"}'
            in text
        )
        busy.join()
        agent.unregister("wc", "hot", 0)
        assert usage("hot") is None and usage("cold") is not None
    finally:
        busy.join()
        agent.metrics.close()
        agent.close()
