"""Who may do what on the registration socket: the real server on a real Unix
socket, with clients in forked children that switch to another uid."""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import stat
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest

from agent import daemon
from agent.config import AgentConfig
from agent.instance_client import AgentClient
from agent.node import NodeAgent
from agent.socket_server import RegistrationServer
from dsched.config import ConfigError, load_config
from dsched.ids import InstanceKey
from tests.test_agent_support import COUNTERS, WorkerThread

NOBODY = 65534  # uid of `nobody` and gid of `nogroup`; owns nothing here
SELF = "$self"  # in a child's message: the child's own pid (its main thread's TID too)
KEY = {"app": "wc", "operator": "count", "instance": 0}

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="switching uid needs root")


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory every uid can reach: pytest's own tmp_path is 0700."""
    directory = Path(tempfile.mkdtemp(prefix="dsched-sock-", dir="/tmp"))
    os.chmod(directory, 0o755)
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@contextmanager
def serve(path: Path, **settings: str) -> Iterator[NodeAgent]:
    agent = NodeAgent(AgentConfig(dry_run=True, socket=str(path), **settings))
    server = RegistrationServer(path, agent)
    server.start()
    try:
        yield agent
    finally:
        server.stop()
        agent.close()


@pytest.fixture
def nobody_may_connect(shared_dir) -> Iterator[tuple[NodeAgent, Path]]:
    """A server whose socket group is nobody's, so a child running as nobody gets in."""
    path = shared_dir / "agent.sock"
    with serve(path, socket_group=str(NOBODY)) as agent:
        yield agent, path


def _send(path: Path, messages: list[dict]) -> list[dict]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(10)
        s.connect(str(path))
        reader = s.makefile("rb")
        replies = []
        for msg in messages:
            s.sendall((json.dumps(msg) + "\n").encode())
            replies.append(json.loads(reader.readline()))
        return replies


def as_user(path: Path, messages: list[dict], uid: int = NOBODY, groups=()) -> dict:
    """Send ``messages`` from a forked child that became ``uid`` (gid nogroup,
    supplementary ``groups``). Returns {"pid", "replies"} or {"pid", "error"}."""
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:
        try:
            os.close(read_end)
            os.setgroups(list(groups))
            os.setgid(NOBODY)
            os.setuid(uid)
            me = os.getpid()
            assert (os.getuid(), os.geteuid()) == (uid, uid)
            msgs = [{k: me if v == SELF else v for k, v in m.items()} for m in messages]
            result = {"replies": _send(path, msgs)}
        except BaseException as exc:  # noqa: BLE001 - reported to the parent, never raised here
            result = {"error": f"{type(exc).__name__}: {exc}"}
        try:
            os.write(write_end, json.dumps(result).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as fh:
        data = fh.read()
    os.waitpid(child, 0)
    return {"pid": child, **json.loads(data)}


def replies_as_user(path: Path, messages: list[dict], **kwargs) -> tuple[int, list[dict]]:
    out = as_user(path, messages, **kwargs)
    assert "error" not in out, out["error"]
    return out["pid"], out["replies"]


def register(pid, tid, **key) -> dict:
    return {
        "op": "register",
        **(key or KEY),
        "worker": "w1",
        "stateful": False,
        "pid": pid,
        "tid": tid,
    }


def update(received: int, **key) -> dict:
    return {"op": "update", **(key or KEY), **COUNTERS, "received": received}


def updates(received: int, **key) -> dict:
    return {"op": "updates", "items": [{**(key or KEY), **COUNTERS, "received": received}]}


def unregister(**key) -> dict:
    return {"op": "unregister", **(key or KEY)}


def refused(agent: NodeAgent, op: str, reason: str) -> float:
    return (
        agent.metrics.registry.get_sample_value(
            "dsched_agent_registration_refused_total", {"op": op, "reason": reason}
        )
        or 0.0
    )


# ----------------------------------------------------------------- the socket file


@pytest.mark.parametrize(
    "settings,mode,gid",
    [
        ({}, 0o660, None),
        ({"socket_mode": "0600", "socket_group": "nogroup"}, 0o600, NOBODY),
        ({"socket_mode": "666", "socket_group": str(NOBODY)}, 0o666, NOBODY),
    ],
)
def test_socket_is_created_with_the_configured_mode_and_group(shared_dir, settings, mode, gid):
    path = shared_dir / "agent.sock"
    with serve(path, **settings):
        st = path.stat()
        assert stat.S_ISSOCK(st.st_mode)
        assert stat.S_IMODE(st.st_mode) == mode
        assert st.st_gid == (os.getegid() if gid is None else gid)


def test_a_tight_umask_narrows_neither_the_socket_nor_the_directory_it_creates(shared_dir):
    path = shared_dir / "run" / "dsched" / "agent.sock"
    old = os.umask(0o077)
    try:
        agent = NodeAgent(AgentConfig(dry_run=True, socket=str(path)))
        server = RegistrationServer(path, agent)
    finally:
        os.umask(old)
    try:
        assert stat.S_IMODE(path.stat().st_mode) == 0o660
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o755
    finally:
        server.stop()
        agent.close()


def test_the_socket_is_owner_only_until_its_group_is_set(shared_dir, monkeypatch):
    seen = []
    real_chown = os.chown

    def chown(path, uid, gid):
        seen.append(stat.S_IMODE(os.stat(path).st_mode))
        real_chown(path, uid, gid)

    monkeypatch.setattr(os, "chown", chown)
    path = shared_dir / "agent.sock"
    with ExitStack() as stack:
        # Under umask 0 a plain bind would leave the socket 0777 until the chmod.
        old = os.umask(0)
        try:
            stack.enter_context(serve(path, socket_group=str(NOBODY)))
        finally:
            os.umask(old)
        assert seen == [0o600]
        assert stat.S_IMODE(path.stat().st_mode) == 0o660


@pytest.mark.parametrize(
    "line,key",
    [
        ('socket_mode = "rw-rw----"', "socket_mode"),
        ('socket_mode = "0999"', "socket_mode"),
        ('socket_mode = "4755"', "socket_mode"),
        ("socket_mode = 0o660", "socket_mode"),
        ('socket_group = "no-such-group-dsched"', "socket_group"),
    ],
)
def test_a_bad_mode_or_unknown_group_stops_the_agent_naming_the_key(tmp_path, capsys, line, key):
    config = tmp_path / "agent.toml"
    config.write_text(line + "\n")
    with pytest.raises(ConfigError) as err:
        load_config(AgentConfig, config)
    assert err.value.key == key
    assert daemon.main(["--config", str(config)]) == 2
    assert key in capsys.readouterr().err


@needs_root
def test_the_mode_keeps_out_users_outside_the_socket_group(shared_dir):
    path = shared_dir / "agent.sock"
    with serve(path, socket_group="0"):
        outside = as_user(path, [unregister()])
        assert "PermissionError" in outside.get("error", ""), outside
        _pid, replies = replies_as_user(path, [unregister()], groups=[0])
        assert replies == [{"ok": True}]


# ----------------------------------------------------------------- ownership


@needs_root
def test_another_uid_can_neither_update_unregister_nor_reregister_a_key(nobody_may_connect, caplog):
    agent, path = nobody_may_connect
    t = WorkerThread()
    try:
        assert _send(path, [register(os.getpid(), t.tid), update(10)]) == [{"ok": True}] * 2
        key = InstanceKey("wc", "count", 0)
        before = agent.registry.get(key)
        assert before.owner_uid == 0

        with caplog.at_level(logging.WARNING, logger="agent.socket_server"):
            child, replies = replies_as_user(
                path,
                [update(99), updates(99), unregister(), register(SELF, SELF)],
            )
        reasons = [r.get("reason") for r in replies]
        assert reasons == ["not_owner", None, "not_owner", "not_owner"]
        assert replies[1]["ok"] is False and replies[1]["accepted"] == 0
        assert [r["reason"] for r in replies[1]["rejected"]] == ["not_owner"]
        assert "belongs to uid 0" in replies[0]["error"]

        after = agent.registry.get(key)
        assert (after.pid, after.tids, after.owner_uid) == (os.getpid(), {t.tid}, 0)
        assert after.counters == before.counters and after.counters.received == 10
        for op in ("update", "updates", "unregister", "register"):
            assert refused(agent, op, "not_owner") == 1, op
        logged = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
        assert len(logged) == 4
        for line in logged:
            assert f"uid {NOBODY} pid {child}" in line and "owner uid 0" in line
            assert "wc/count/0" in line or str(key) in line
        assert [line.split()[1] for line in logged] == [
            "update",
            "updates",
            "unregister",
            "register",
        ]

        # The owner's own operations still work.
        assert _send(path, [update(20), updates(30)])[0] == {"ok": True}
        assert agent.registry.get(key).counters.received == 30
        assert _send(path, [unregister()]) == [{"ok": True}]
        assert agent.registry.get(key) is None
    finally:
        t.join()


@needs_root
def test_processes_of_one_uid_share_its_keys(nobody_may_connect):
    agent, path = nobody_may_connect
    key = InstanceKey("wc", "count", 0)
    first, replies = replies_as_user(path, [register(SELF, SELF), update(10)])
    assert replies == [{"ok": True}] * 2
    rec = agent.registry.get(key)
    assert (rec.pid, rec.owner_uid) == (first, NOBODY)

    second, replies = replies_as_user(
        path, [update(20), updates(30), register(SELF, SELF), unregister()]
    )
    assert replies[0] == {"ok": True} and replies[2:] == [{"ok": True}] * 2
    assert replies[1] == {"ok": True, "accepted": 1, "rejected": []}
    assert agent.registry.get(key) is None
    assert second != first
    assert refused(agent, "update", "not_owner") == 0


@needs_root
def test_root_may_unregister_any_key_but_neither_update_nor_take_it(nobody_may_connect):
    agent, path = nobody_may_connect
    key = InstanceKey("wc", "count", 0)
    child, replies = replies_as_user(path, [register(SELF, SELF)])
    assert replies == [{"ok": True}]
    t = WorkerThread()
    try:
        replies = _send(path, [update(10), register(os.getpid(), t.tid)])
        assert [r.get("reason") for r in replies] == ["not_owner", "not_owner"]
        rec = agent.registry.get(key)
        assert (rec.pid, rec.owner_uid) == (child, NOBODY)
        assert _send(path, [unregister()]) == [{"ok": True}]
        assert agent.registry.get(key) is None
        assert refused(agent, "unregister", "not_owner") == 0
    finally:
        t.join()


@needs_root
def test_a_peer_may_not_register_a_process_of_another_uid(nobody_may_connect):
    agent, path = nobody_may_connect
    t = WorkerThread()
    try:
        _child, replies = replies_as_user(path, [register(os.getpid(), t.tid)])
        assert replies[0]["reason"] == "foreign_process"
        assert len(agent.registry) == 0
        assert refused(agent, "register", "foreign_process") == 1
    finally:
        t.join()


@needs_root
def test_a_key_the_agent_found_itself_belongs_to_the_uid_of_its_process(nobody_may_connect):
    agent, path = nobody_may_connect
    key = InstanceKey("wc", "count", 0)
    t = WorkerThread()
    try:
        # As a cgroup re-adopted after an agent restart: no registering uid, a root process.
        agent.registry.register(key, "w1", False, os.getpid(), t.tid, source="adopted")
        _child, replies = replies_as_user(path, [update(10), register(SELF, SELF)])
        assert [r.get("reason") for r in replies] == ["not_owner", "not_owner"]
        assert agent.registry.get(key).pid == os.getpid()
        # Its process's uid registers it again, as an instance does on reconnecting.
        assert _send(path, [register(os.getpid(), t.tid), update(10)]) == [{"ok": True}] * 2
        rec = agent.registry.get(key)
        assert (rec.owner_uid, rec.source, rec.counters.received) == (0, "registration", 10)
    finally:
        t.join()


@needs_root
def test_a_key_the_agent_found_whose_process_is_gone_is_free_to_take(nobody_may_connect):
    agent, path = nobody_may_connect
    key = InstanceKey("wc", "count", 0)
    gone = os.fork()
    if gone == 0:
        os._exit(0)
    os.waitpid(gone, 0)
    agent.registry.register(key, "w1", False, gone, gone, source="adopted")
    _child, replies = replies_as_user(path, [update(10), unregister()])
    assert [r.get("reason") for r in replies] == ["not_owner", "not_owner"]
    child, replies = replies_as_user(path, [register(SELF, SELF)])
    assert replies == [{"ok": True}]
    rec = agent.registry.get(key)
    assert (rec.pid, rec.owner_uid) == (child, NOBODY)


@needs_root
def test_the_client_is_told_why_a_key_is_refused(nobody_may_connect):
    agent, path = nobody_may_connect
    _child, replies = replies_as_user(path, [register(SELF, SELF)])
    assert replies == [{"ok": True}]
    client = AgentClient(str(path), flush_seconds=0.05)
    t = WorkerThread()
    try:
        client.register("wc", "count", 0, "w1", False, tid=t.tid)
        assert client.flush()
        (rejection,) = client.rejections
        assert rejection["reason"] == "not_owner"
        assert f"belongs to uid {NOBODY}" in rejection["error"]
        assert rejection["message"]["op"] == "register"
    finally:
        client.close()
        t.join()
