"""Local registration endpoint: JSON lines over a Unix stream socket.

One message per line, one reply line per message::

    {"op": "register", "app", "operator", "instance", "worker", "stateful", "pid", "tid"}
    {"op": "update", "app", "operator", "instance", "received", "executed", "emitted",
     "queue_length", "latency_sum_seconds", "latency_count", "service_seconds"}
    {"op": "unregister", "app", "operator", "instance"}
    -> {"ok": true} | {"ok": false, "reason": "...", "error": "..."}

    {"op": "updates", "items": [{"app", "operator", "instance", "received", ...}, ...]}
    -> {"ok": true, "accepted": n, "rejected": []}
     | {"ok": false, "accepted": n, "rejected": [{"index", "reason", "error"}, ...]}

A batch carries many instances' counters in one line and gets one reply, so a
client with hundreds of instances costs the agent one read, one decode and one
write per flush instead of one per instance. Each item is checked on its own: a
refused item (NaN, unknown instance, not an object, ...) is counted under its
reason and named by its index, the others still apply. A batch whose ``items``
is not a list is refused whole (``bad_message``) without a ``rejected`` list.

The socket is world-writable so unprivileged instances can register, so the
kernel's peer credentials (SO_PEERCRED) decide whose threads a client may name:
a non-root peer may only register threads of its own process.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import socketserver
import struct
import threading
from pathlib import Path
from typing import Any

from agent.node import NodeAgent
from agent.registry import RegistrationError
from agent.wire import MAX_LINE_BYTES

log = logging.getLogger(__name__)

KNOWN_OPS = frozenset({"register", "update", "updates", "unregister"})


def peer_credentials(sock: socket.socket) -> tuple[int, int]:
    """(pid, uid) of the process at the other end of a Unix socket."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, _gid = struct.unpack("3i", raw)
    return pid, uid


def handle_message(agent: NodeAgent, msg: Any, peer_pid: int, peer_uid: int) -> dict[str, Any]:
    """Dispatch one decoded message; never raises for bad input."""
    try:
        if not isinstance(msg, dict):
            raise RegistrationError("bad_message", "message must be a JSON object")
        op = msg.get("op")
        if op in KNOWN_OPS:
            agent.metrics.instance_messages.labels(op).inc()
        ident = (msg.get("app"), msg.get("operator"), msg.get("instance"))
        if op == "register":
            pid = msg.get("pid")
            if peer_uid != 0 and pid != peer_pid:
                raise RegistrationError(
                    "pid_mismatch", f"process {peer_pid} may not register threads of process {pid}"
                )
            agent.register(
                *ident,
                msg.get("worker"),
                msg.get("stateful"),
                pid,
                msg.get("tid"),
                upstream=msg.get("upstream", ()),
            )
        elif op == "updates":
            return _handle_updates(agent, msg.get("items"))
        elif op == "update":
            agent.update(*ident, msg)
        elif op == "unregister":
            agent.unregister(*ident)
        else:
            raise RegistrationError("bad_message", f"unknown op {op!r}")
    except RegistrationError as exc:
        if exc.reason in ("bad_message", "pid_mismatch"):
            agent.metrics.rejected_messages.labels(exc.reason).inc()
            log.warning("refused instance message (%s): %s", exc.reason, exc)
        return {"ok": False, "reason": exc.reason, "error": str(exc)}
    return {"ok": True}


def _handle_updates(agent: NodeAgent, items: Any) -> dict[str, Any]:
    if not isinstance(items, list):
        raise RegistrationError("bad_message", "updates must carry a list 'items'")
    refused = agent.update_many(items)
    return {
        "ok": not refused,
        "accepted": len(items) - len(refused),
        "rejected": [
            {"index": index, "reason": exc.reason, "error": str(exc)} for index, exc in refused
        ],
    }


class _Handler(socketserver.StreamRequestHandler):
    server: RegistrationServer
    # A batch line is up to 64 KiB: read it in one recv, not eight of the default 8 KiB.
    rbufsize = MAX_LINE_BYTES + 1

    def handle(self) -> None:
        peer_pid, peer_uid = peer_credentials(self.request)
        while True:
            line = self.rfile.readline(MAX_LINE_BYTES + 1)
            if not line:
                return
            if len(line) > MAX_LINE_BYTES:
                reply = {"ok": False, "reason": "bad_message", "error": "line too long"}
                self.server.agent.metrics.rejected_messages.labels("bad_message").inc()
                self._send(reply)
                return
            try:
                msg = json.loads(line)
            except ValueError as exc:
                self.server.agent.metrics.rejected_messages.labels("bad_message").inc()
                self._send({"ok": False, "reason": "bad_message", "error": f"not JSON: {exc}"})
                continue
            self._send(handle_message(self.server.agent, msg, peer_pid, peer_uid))

    def _send(self, reply: dict[str, Any]) -> None:
        try:
            self.wfile.write((json.dumps(reply) + "\n").encode())
        except OSError:
            pass


class RegistrationServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True

    def __init__(self, path: str | Path, agent: NodeAgent):
        self.path = Path(path)
        self.agent = agent
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # A socket file left by a previous agent would make bind fail.
        if self.path.is_socket():
            self.path.unlink()
        super().__init__(str(self.path), _Handler)
        os.chmod(self.path, 0o666)
        self._thread: threading.Thread | None = None
        self._closing = threading.Event()
        self._clients: set[socket.socket] = set()
        self._clients_lock = threading.Lock()

    def process_request(self, request, client_address):  # type: ignore[no-untyped-def]
        with self._clients_lock:
            self._clients.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request):  # type: ignore[no-untyped-def]
        with self._clients_lock:
            self._clients.discard(request)
        super().shutdown_request(request)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._accept_loop, name="registration", daemon=True)
        self._thread.start()

    def _accept_loop(self) -> None:
        # A blocking accept instead of serve_forever's select with a timeout: the
        # agent does not wake up several times a second for nothing. stop()
        # shuts the listening socket down, which ends the accept.
        while not self._closing.is_set():
            try:
                request, client_address = self.get_request()
            except OSError as exc:
                if not self._closing.is_set():
                    log.warning("registration socket accept failed: %s", exc)
                    self._closing.wait(0.1)
                continue
            try:
                self.process_request(request, client_address)
            except Exception:  # noqa: BLE001 - one bad client must not stop the server
                self.handle_error(request, client_address)
                self.shutdown_request(request)

    def stop(self) -> None:
        self._closing.set()
        try:
            self.socket.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.server_close()
        # Clients must see the agent go away, as they would if its process died.
        with self._clients_lock:
            for conn in self._clients:
                try:
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass
