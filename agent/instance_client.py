"""Instance side of the registration socket: what an operator instance links in.

Calls from instance threads only touch an in-memory table under a lock; a
background thread sends registrations and the latest counters every
``flush_seconds``. When the agent is absent nothing blocks and nothing is
raised: the client keeps retrying, and on every new connection it registers
all live instances again (that is how an agent restart is survived).

Names are checked on the spot (ValueError), because a bad name is a bug in the
instance, not a condition to retry.

An instance key belongs to the uid that registered it first: a key another uid
holds is refused (``not_owner``, in :attr:`AgentClient.rejections` and the log),
and so is a process of another uid (``foreign_process``). The client does not
retry a refused registration until it reconnects.

Counter updates of all instances go out as ``updates`` batches (one line and one
reply per flush, see :mod:`agent.socket_server`). An agent that does not know
the batch form answers ``unknown op``; the client then sends single ``update``
messages on that connection.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections import deque
from typing import Any

from agent.wire import encode, encode_update_batches
from dsched.names import check_name

log = logging.getLogger(__name__)

Key = tuple[str, str, int]


def _key(app: str, operator: str, instance: int) -> Key:
    check_name("app", app)
    check_name("operator", operator)
    if isinstance(instance, bool) or not isinstance(instance, int) or instance < 0:
        raise ValueError(f"instance must be an integer >= 0, got {instance!r}")
    return (app, operator, instance)


class AgentClient:
    def __init__(self, socket_path: str, flush_seconds: float = 0.5, reply_timeout: float = 2.0):
        if flush_seconds <= 0:
            raise ValueError(f"flush_seconds must be > 0, got {flush_seconds!r}")
        self.socket_path = socket_path
        self.flush_seconds = flush_seconds
        self.reply_timeout = reply_timeout
        self._lock = threading.Lock()
        self._registrations: dict[tuple[Key, int], dict[str, Any]] = {}
        self._ops: list[dict[str, Any]] = []
        self._updates: dict[Key, dict[str, Any]] = {}
        self._sock: socket.socket | None = None
        self._reader: Any = None
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._sent = threading.Condition()
        self._rounds = 0
        self._batch_updates = True
        self.connected = False
        self.connections = 0
        # The agent's refusals, newest last, for logs and diagnostics.
        self.rejections: deque[dict[str, Any]] = deque(maxlen=100)
        self._thread = threading.Thread(target=self._run, name="dsched-agent-client", daemon=True)
        self._thread.start()

    # ---------------------------------------------------------------- API

    def register(
        self,
        app: str,
        operator: str,
        instance: int,
        worker: str,
        stateful: bool,
        tid: int | None = None,
        upstream: tuple[str, ...] | list[str] = (),
        pid: int | None = None,
    ) -> None:
        """Register a thread of an instance. ``upstream`` names the operators that
        feed this one, so the controller learns the application's DAG."""
        key = _key(app, operator, instance)
        for name in upstream:
            check_name("upstream", name)
        check_name("worker", worker)
        if not isinstance(stateful, bool):
            raise ValueError(f"stateful must be a bool, got {stateful!r}")
        tid = threading.get_native_id() if tid is None else tid
        msg = {
            "op": "register",
            "app": app,
            "operator": operator,
            "instance": instance,
            "worker": worker,
            "stateful": stateful,
            # Another process's thread (an instance's CPU worker, say) may be
            # named only when that process runs as this one's uid (or this one
            # is root): the agent checks the socket's peer credentials.
            "pid": os.getpid() if pid is None else pid,
            "tid": tid,
            "upstream": list(upstream),
        }
        with self._lock:
            self._registrations[(key, tid)] = msg
            self._ops.append(msg)
        self._wake.set()

    def update(
        self,
        app: str,
        operator: str,
        instance: int,
        *,
        received: int,
        executed: int,
        emitted: int,
        queue_length: int,
        latency_sum_seconds: float,
        latency_count: int,
        service_seconds: float,
    ) -> None:
        key = (app, operator, instance)
        item = {
            "app": app,
            "operator": operator,
            "instance": instance,
            "received": received,
            "executed": executed,
            "emitted": emitted,
            "queue_length": queue_length,
            "latency_sum_seconds": latency_sum_seconds,
            "latency_count": latency_count,
            "service_seconds": service_seconds,
        }
        with self._lock:
            self._updates[key] = item

    def unregister(self, app: str, operator: str, instance: int) -> None:
        key = _key(app, operator, instance)
        with self._lock:
            for reg in [r for r in self._registrations if r[0] == key]:
                del self._registrations[reg]
            self._updates.pop(key, None)
            self._ops.append(
                {"op": "unregister", "app": app, "operator": operator, "instance": instance}
            )
        self._wake.set()

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until everything queued so far has been offered to the agent (tests, shutdown)."""
        deadline = time.monotonic() + timeout
        with self._sent:
            target = self._rounds + 2
            while self._rounds < target:
                # Wake the sender for each round, not only the first.
                self._wake.set()
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not self._sent.wait(remaining):
                    return self._rounds >= target
            return True

    def close(self) -> None:
        self.flush(timeout=self.reply_timeout)
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=5)
        self._disconnect()

    # ---------------------------------------------------------------- sender

    def _run(self) -> None:
        while not self._stop.is_set():
            # Cleared before the round, so a wake-up asked for during it is not lost.
            self._wake.clear()
            try:
                self._send_round()
            except Exception:  # noqa: BLE001 - the instance must never die of its agent
                log.exception("agent client round failed")
                self._disconnect()
            with self._sent:
                self._rounds += 1
                self._sent.notify_all()
            self._wake.wait(self.flush_seconds)

    def _connect(self) -> bool:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.reply_timeout)
        try:
            sock.connect(self.socket_path)
        except OSError:
            sock.close()
            return False
        self._sock = sock
        self._reader = sock.makefile("rb")
        self.connected = True
        self.connections += 1
        self._batch_updates = True
        with self._lock:
            # Everything registered so far, again: the agent may be new.
            self._ops = list(self._registrations.values()) + [
                op for op in self._ops if op["op"] != "register"
            ]
        return True

    def _disconnect(self) -> None:
        if self._sock is not None:
            try:
                self._reader.close()
                self._sock.close()
            except OSError:
                pass
        self._sock = None
        self.connected = False

    def _send_round(self) -> None:
        if self._sock is None and not self._connect():
            return
        with self._lock:
            ops = self._ops
            updates = list(self._updates.values())
            self._ops = []
            self._updates = {}
        if not ops and not updates:
            if self._peer_closed():
                log.info("agent closed the socket; will reconnect")
                self._disconnect()
            return
        lines = self._encode(ops, updates)
        try:
            self._sock.sendall(b"".join(line for line, _kind, _carried in lines))
            for _line, kind, carried in lines:
                raw = self._reader.readline()
                if not raw:
                    raise ConnectionError("agent closed the socket")
                self._take_reply(json.loads(raw), kind, carried)
        except (OSError, ValueError, ConnectionError) as exc:
            log.info("agent connection lost (%s); will retry", exc)
            self._disconnect()
            self._requeue([m for _line, _kind, carried in lines for m in carried])

    def _encode(
        self, ops: list[dict[str, Any]], updates: list[dict[str, Any]]
    ) -> list[tuple[bytes, str, list[dict[str, Any]]]]:
        """(line, kind, the messages or items it carries) for everything to send."""
        lines = [(encode(op), op["op"], [op]) for op in ops]
        if not self._batch_updates:
            return lines + [(encode({"op": "update", **u}), "update", [u]) for u in updates]
        batches, oversized = encode_update_batches(updates)
        for item in oversized:
            self._rejected(
                {"ok": False, "reason": "bad_message", "error": "update longer than a line"},
                "update",
                item,
            )
        return lines + [(line, "updates", carried) for line, carried in batches]

    def _take_reply(self, reply: Any, kind: str, carried: list[dict[str, Any]]) -> None:
        if not isinstance(reply, dict):
            raise ValueError(f"agent sent a reply that is not an object: {reply!r}")
        if kind == "updates" and isinstance(reply.get("rejected"), list):
            for refused in reply["rejected"]:
                item = carried[refused["index"]]
                self._rejected({"ok": False, **refused}, "update", item)
            return
        if reply.get("ok"):
            return
        if kind == "updates" and str(reply.get("error", "")).startswith("unknown op"):
            # An agent older than the batch form: single updates from now on.
            log.info("agent does not take batched updates; sending them one by one")
            self._batch_updates = False
            self._requeue(carried)
            return
        self._rejected(reply, kind, carried[0])

    def _rejected(self, reply: dict[str, Any], kind: str, message: dict[str, Any]) -> None:
        if kind in ("update", "updates"):
            message = {"op": "update", **message}
        self.rejections.append({**reply, "message": message})
        log.warning("agent refused %s: %s", message.get("op"), reply.get("error"))

    def _peer_closed(self) -> bool:
        """Notice an agent that went away while there was nothing to send."""
        # A socket timeout would make recv wait; peek without waiting instead.
        self._sock.settimeout(0)
        try:
            return self._sock.recv(1, socket.MSG_PEEK) == b""
        except BlockingIOError:
            return False
        except OSError:
            return True
        finally:
            self._sock.settimeout(self.reply_timeout)

    def _requeue(self, batch: list[dict[str, Any]]) -> None:
        """Keep unregisters and the newest counters; registrations are resent on connect.

        ``batch`` holds operations (with ``op``) and counter items (without).
        """
        with self._lock:
            unregisters = []
            for msg in batch:
                key = (msg["app"], msg["operator"], msg["instance"])
                op = msg.get("op")
                if op is None:
                    # Counters queued since are newer than these.
                    self._updates.setdefault(key, msg)
                elif op == "unregister":
                    unregisters.append(msg)
            self._ops[:0] = unregisters
