"""Registration over the real Unix socket, with the real instance-side client."""

from __future__ import annotations

import json
import math
import os
import socket

import pytest

from agent.config import AgentConfig
from agent.instance_client import AgentClient
from agent.node import NodeAgent
from agent.socket_server import RegistrationServer
from dsched.ids import InstanceKey
from tests.test_agent_support import COUNTERS, WorkerThread, registration_server, wait_for


@pytest.fixture
def served(tmp_path):
    with registration_server(tmp_path) as served:
        yield served


def _raw(path, *messages) -> list[dict]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(5)
        s.connect(str(path))
        s.sendall(b"".join((json.dumps(m) + "\n").encode() for m in messages))
        reader = s.makefile("rb")
        return [json.loads(reader.readline()) for _ in messages]


def _rejected(agent, reason) -> float:
    return (
        agent.metrics.registry.get_sample_value(
            "dsched_agent_rejected_instance_messages_total", {"reason": reason}
        )
        or 0.0
    )


def test_client_registers_thread_and_counters_reach_the_report(served):
    agent, _server, path = served
    client = AgentClient(str(path), flush_seconds=0.05)
    t = WorkerThread()
    try:
        client.register("wc", "count", 1, "w1", True, tid=t.tid)
        client.update("wc", "count", 1, **COUNTERS)
        assert client.flush()
        rec = agent.registry.get(InstanceKey("wc", "count", 1))
        assert rec.tids == {t.tid} and rec.pid == os.getpid() and rec.stateful
        agent.sample()
        sample = agent.report().instances[0]
        assert (sample.received_total, sample.executed_total, sample.emitted_total) == (10, 8, 16)
        assert sample.latency_count_total == 8 and sample.queue_length == 2
        assert agent.metrics.registry.get_sample_value("dsched_agent_threads_managed") == 1
    finally:
        client.close()
        t.join()


def test_nan_and_backwards_counters_are_rejected_counted_and_last_good_kept(served):
    agent, _server, path = served
    client = AgentClient(str(path), flush_seconds=0.05)
    t = WorkerThread()
    try:
        client.register("wc", "split", 0, "w1", False, tid=t.tid)
        client.update("wc", "split", 0, **COUNTERS)
        assert client.flush()
        client.update("wc", "split", 0, **{**COUNTERS, "latency_sum_seconds": math.nan})
        assert client.flush()
        client.update("wc", "split", 0, **{**COUNTERS, "executed": 3})
        assert client.flush()
        client.update("wc", "split", 0, **{**COUNTERS, "emitted": -1})
        assert client.flush()
        assert [r["reason"] for r in client.rejections] == [
            "non_finite",
            "counter_backwards",
            "negative",
        ]
        assert _rejected(agent, "non_finite") == 1
        assert _rejected(agent, "counter_backwards") == 1
        counters = agent.registry.get(InstanceKey("wc", "split", 0)).counters
        assert counters.executed == 8 and counters.latency_sum_seconds == 0.5
        agent.sample()
        assert all(math.isfinite(s.latency_sum_seconds_total) for s in agent.report().instances)
    finally:
        client.close()
        t.join()


@pytest.mark.parametrize(
    "field,value",
    [
        ("app", ".."),
        ("app", "a/b"),
        ("operator", "../../etc"),
        ("worker", "w\x00x"),
        ("app", "x\x00"),
    ],
)
def test_registration_with_unsafe_names_is_refused(served, field, value):
    agent, _server, path = served
    t = WorkerThread()
    try:
        msg = {
            "op": "register",
            "app": "wc",
            "operator": "count",
            "instance": 0,
            "worker": "w1",
            "stateful": False,
            "pid": os.getpid(),
            "tid": t.tid,
        }
        msg[field] = value
        (reply,) = _raw(path, msg)
        assert reply["ok"] is False and reply["reason"] == "bad_name"
        assert len(agent.registry) == 0
        assert _rejected(agent, "bad_name") == 1
        client = AgentClient(str(path))
        try:
            args = {
                "app": "wc",
                "operator": "count",
                "instance": 0,
                "worker": "w1",
                "stateful": False,
            }
            args[field] = value
            with pytest.raises(ValueError):
                client.register(**args)
        finally:
            client.close()
    finally:
        t.join()


def test_malformed_messages_get_an_answer_and_do_not_kill_the_connection(served):
    agent, _server, path = served
    t = WorkerThread()
    try:
        replies = _raw(
            path,
            ["not", "an", "object"],
            {"op": "explode"},
            {"op": "update", "app": "wc", "operator": "nope", "instance": 0, **COUNTERS},
            {
                "op": "register",
                "app": "wc",
                "operator": "c",
                "instance": -1,
                "worker": "w",
                "stateful": False,
                "pid": os.getpid(),
                "tid": t.tid,
            },
            {
                "op": "register",
                "app": "wc",
                "operator": "c",
                "instance": 0,
                "worker": "w",
                "stateful": False,
                "pid": os.getpid(),
                "tid": 2**22 + 3,
            },
            {
                "op": "register",
                "app": "wc",
                "operator": "c",
                "instance": 0,
                "worker": "w",
                "stateful": False,
                "pid": os.getpid(),
                "tid": t.tid,
            },
        )
        assert [r.get("reason") for r in replies] == [
            "bad_message",
            "bad_message",
            "unknown_instance",
            "bad_field",
            "no_such_thread",
            None,
        ]
        assert len(agent.registry) == 1
    finally:
        t.join()


def test_client_without_agent_never_blocks_and_registers_once_agent_appears(tmp_path):
    path = tmp_path / "late.sock"
    client = AgentClient(str(path), flush_seconds=0.05)
    t = WorkerThread()
    try:
        for i in range(1000):
            client.update("wc", "count", 0, **{**COUNTERS, "received": i})
        client.register("wc", "count", 0, "w1", True, tid=t.tid)
        assert not client.connected
        agent = NodeAgent(AgentConfig(dry_run=True, socket=str(path)))
        server = RegistrationServer(path, agent)
        server.start()
        try:
            assert wait_for(lambda: agent.registry.get(InstanceKey("wc", "count", 0)) is not None)
            # Agent restart: a new agent gets the registration again.
            server.stop()
            agent2 = NodeAgent(AgentConfig(dry_run=True, socket=str(path)))
            server2 = RegistrationServer(path, agent2)
            server2.start()
            try:
                assert wait_for(
                    lambda: agent2.registry.get(InstanceKey("wc", "count", 0)) is not None
                )
                assert client.connections >= 2
            finally:
                server2.stop()
        finally:
            agent.close()
    finally:
        client.close()
        t.join()


def test_a_peer_may_register_only_processes_of_its_own_uid(served):
    agent, _server, _path = served
    t = WorkerThread()
    try:
        from agent.socket_server import Peer, handle_message

        msg = {
            "op": "register",
            "app": "wc",
            "operator": "c",
            "instance": 0,
            "worker": "w",
            "stateful": False,
            "pid": os.getpid(),
            "tid": t.tid,
        }
        # The kernel's pid for the peer equals the named pid, as it would after the
        # peer's process exited and a root process got its pid: the named process's
        # owner decides, not the pid the peer connected with.
        reply = handle_message(agent, msg, Peer(pid=os.getpid(), uid=1000))
        assert reply == {"ok": False, "reason": "foreign_process", "error": reply["error"]}
        assert len(agent.registry) == 0
        assert (
            agent.metrics.registry.get_sample_value(
                "dsched_agent_registration_refused_total",
                {"op": "register", "reason": "foreign_process"},
            )
            == 1
        )
        # Root may name any process.
        assert handle_message(agent, msg, Peer(pid=os.getpid() + 1, uid=0)) == {"ok": True}
        assert agent.registry.get(InstanceKey("wc", "c", 0)).owner_uid == 0
    finally:
        t.join()
