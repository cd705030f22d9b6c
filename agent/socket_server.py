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

Who may do what is decided from the kernel's peer credentials (SO_PEERCRED, as
of the client's ``connect``), never from anything the client says:

- an instance key belongs to the uid that registered it (a key the agent found
  itself belongs to the uid of its process); only that uid may update it or
  register it again, and only that uid or root may unregister it;
- ``register`` may name only a process of the peer's own uid (real, effective
  and saved uid all equal to it), or any process when the peer is root. The
  process's owner is read from /proc when the message arrives, so a pid the
  kernel reported for the peer and later reused by another user's process is
  not taken for the peer's.

Refusals answer ``not_owner`` or ``foreign_process`` and are counted in
``dsched_agent_registration_refused_total{op,reason}``.

The socket is created with ``socket_mode`` and ``socket_group`` from the
agent's configuration (0660, the agent's group, by default): who may connect at
all is the file's business, what a connected peer may touch is the rules above.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import socketserver
import stat
import struct
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.config import parse_socket_mode, resolve_group
from agent.node import NodeAgent
from agent.registry import (
    NotOwner,
    ProcessOwner,
    RegistrationError,
    check_owner,
    make_key,
    owner_of,
)
from agent.wire import MAX_LINE_BYTES

log = logging.getLogger(__name__)

KNOWN_OPS = frozenset({"register", "update", "updates", "unregister"})
ROOT_UID = 0
# Refusals logged per connection; later ones are only counted, so that a client
# repeating a refused update every flush cannot fill the log.
MAX_LOGGED_REFUSALS = 20
# Serialises registrations and unregistrations from the socket: an owner check
# and the change it allows must not interleave with another peer's.
_ownership_lock = threading.Lock()


def peer_credentials(sock: socket.socket) -> tuple[int, int]:
    """(pid, uid) of the process at the other end of a Unix socket."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, _gid = struct.unpack("3i", raw)
    return pid, uid


def process_owner(proc_root: str | Path, pid: int) -> int | None:
    """The uid a process belongs to, None when it is gone.

    A process whose real, effective and saved uids differ (a setuid program)
    counts as root's: no unprivileged peer may speak for it.
    """
    try:
        with open(f"{proc_root}/{pid}/status") as fh:
            for line in fh:
                if line.startswith("Uid:"):
                    real, effective, saved = (int(v) for v in line.split()[1:4])
                    return real if real == effective == saved else ROOT_UID
    except (OSError, ValueError):
        return None
    return None


@dataclass
class Peer:
    """One connected client, as the kernel names it."""

    pid: int
    uid: int
    logged_refusals: int = 0


def handle_message(agent: NodeAgent, msg: Any, peer: Peer) -> dict[str, Any]:
    """Dispatch one decoded message; never raises for bad input."""
    try:
        if not isinstance(msg, dict):
            raise RegistrationError("bad_message", "message must be a JSON object")
        op = msg.get("op")
        if op in KNOWN_OPS:
            agent.metrics.instance_messages.labels(op).inc()
        if op == "register":
            _register(agent, msg, peer)
        elif op == "updates":
            return _handle_updates(agent, msg.get("items"), peer)
        elif op == "update":
            _update(agent, msg, peer)
        elif op == "unregister":
            _unregister(agent, msg, peer)
        else:
            raise RegistrationError("bad_message", f"unknown op {op!r}")
    except NotOwner as exc:
        _refused(agent, peer, exc.op, exc.reason, exc.key, _whose(exc))
        return {"ok": False, "reason": exc.reason, "error": str(exc)}
    except RegistrationError as exc:
        if exc.reason == "bad_message":
            agent.metrics.rejected_messages.labels(exc.reason).inc()
            log.warning("refused instance message (%s): %s", exc.reason, exc)
        return {"ok": False, "reason": exc.reason, "error": str(exc)}
    return {"ok": True}


def _register(agent: NodeAgent, msg: dict[str, Any], peer: Peer) -> None:
    key = _key(agent, msg)
    pid = msg.get("pid")
    owner_of_pid = None
    if isinstance(pid, int) and not isinstance(pid, bool) and pid > 0:
        owner_of_pid = process_owner(agent.config.proc_root, pid)
    if peer.uid != ROOT_UID and owner_of_pid is not None and owner_of_pid != peer.uid:
        # A process that is gone, or a bad pid, falls through to the agent's own
        # checks (no_such_thread, bad_field): only a live foreign process is refused here.
        _refused(
            agent, peer, "register", "foreign_process", key, f"process {pid} uid {owner_of_pid}"
        )
        raise RegistrationError(
            "foreign_process",
            f"process {pid} belongs to uid {owner_of_pid}; uid {peer.uid} may not register it",
        )
    proc_owner = _process_owner(agent)
    with _ownership_lock:
        current = agent.registry.get(key)
        if current is not None:
            owner = owner_of(current, proc_owner)
            # A key whose process is gone and that no uid registered is free to take.
            if owner is not None and owner != peer.uid:
                raise NotOwner("register", key, peer.uid, owner)
        agent.register(
            *key,
            msg.get("worker"),
            msg.get("stateful"),
            pid,
            msg.get("tid"),
            upstream=msg.get("upstream", ()),
        )
        agent.registry.claim(key, peer.uid, pid)


def _update(agent: NodeAgent, msg: dict[str, Any], peer: Peer) -> None:
    try:
        agent.registry.update_named(
            msg.get("app"),
            msg.get("operator"),
            msg.get("instance"),
            msg,
            peer.uid,
            _process_owner(agent),
        )
    except RegistrationError as exc:
        if not isinstance(exc, NotOwner):
            _rejected(agent, exc)
        raise


def _unregister(agent: NodeAgent, msg: dict[str, Any], peer: Peer) -> None:
    key = _key(agent, msg)
    with _ownership_lock:
        current = agent.registry.get(key)
        if peer.uid != ROOT_UID:
            if current is None:
                # Nothing of the peer's to remove, and nothing else may be touched.
                return
            check_owner("unregister", current, peer.uid, _process_owner(agent))
        agent.unregister(*key)


def _key(agent: NodeAgent, msg: dict[str, Any]) -> Any:
    try:
        return make_key(msg.get("app"), msg.get("operator"), msg.get("instance"))
    except RegistrationError as exc:
        _rejected(agent, exc)
        raise


def _process_owner(agent: NodeAgent) -> ProcessOwner:
    proc_root = agent.config.proc_root
    return lambda pid: process_owner(proc_root, pid)


def _whose(exc: NotOwner) -> str:
    return "its process is gone" if exc.owner is None else f"owner uid {exc.owner}"


def _rejected(agent: NodeAgent, exc: RegistrationError) -> None:
    """Bad input, counted and logged as the agent counts its own refusals."""
    agent.metrics.rejected_messages.labels(exc.reason).inc()
    log.warning("refused instance message (%s): %s", exc.reason, exc)


def _refused(agent: NodeAgent, peer: Peer, op: str, reason: str, key: Any, whose: str) -> None:
    """A peer acting on what is not its own: counted always, logged up to a limit."""
    agent.metrics.registration_refused.labels(op, reason).inc()
    peer.logged_refusals += 1
    if peer.logged_refusals <= MAX_LOGGED_REFUSALS:
        log.warning(
            "refused %s of %s from uid %d pid %d (%s): %s",
            op,
            key,
            peer.uid,
            peer.pid,
            whose,
            reason,
        )
        if peer.logged_refusals == MAX_LOGGED_REFUSALS:
            log.warning(
                "uid %d pid %d: further refusals on this connection are counted, not logged",
                peer.uid,
                peer.pid,
            )


def _handle_updates(agent: NodeAgent, items: Any, peer: Peer) -> dict[str, Any]:
    if not isinstance(items, list):
        raise RegistrationError("bad_message", "updates must carry a list 'items'")
    refused = agent.registry.update_many(items, peer.uid, _process_owner(agent))
    for _index, exc in refused:
        if isinstance(exc, NotOwner):
            _refused(agent, peer, "updates", exc.reason, exc.key, _whose(exc))
        else:
            _rejected(agent, exc)
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
        peer = Peer(peer_pid, peer_uid)
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
            self._send(handle_message(self.server.agent, msg, peer))

    def _send(self, reply: dict[str, Any]) -> None:
        try:
            self.wfile.write((json.dumps(reply) + "\n").encode())
        except OSError:
            pass


def _prepare_directory(directory: Path, mode: int) -> None:
    """Make the socket's directory, or warn when an existing one defeats ``mode``."""
    if not directory.exists():
        directory.mkdir(parents=True)
        # mkdir honours the umask: under 077 nobody but the agent could reach the socket.
        os.chmod(directory, 0o755)
        return
    st = directory.stat()
    if st.st_mode & stat.S_IWOTH and not st.st_mode & stat.S_ISVTX:
        log.warning(
            "registration socket directory %s is world-writable without the sticky bit: "
            "any user could replace the socket",
            directory,
        )
    reach = (mode & 0o060 and not st.st_mode & stat.S_IXGRP) or (
        mode & 0o006 and not st.st_mode & stat.S_IXOTH
    )
    if reach:
        log.warning(
            "registration socket directory %s (mode %04o) keeps out users socket_mode %04o lets in",
            directory,
            stat.S_IMODE(st.st_mode),
            mode,
        )


class RegistrationServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True

    def __init__(
        self,
        path: str | Path,
        agent: NodeAgent,
        mode: int | None = None,
        gid: int | None = None,
    ):
        """``mode`` and ``gid`` default to the agent's ``socket_mode`` and ``socket_group``."""
        self.path = Path(path)
        self.agent = agent
        self.mode = parse_socket_mode(agent.config.socket_mode) if mode is None else mode
        self.gid = resolve_group(agent.config.socket_group) if gid is None else gid
        _prepare_directory(self.path.parent, self.mode)
        # A socket file left by a previous agent would make bind fail.
        if self.path.is_socket():
            self.path.unlink()
        super().__init__(str(self.path), _Handler)
        self._thread: threading.Thread | None = None
        self._closing = threading.Event()
        self._clients: set[socket.socket] = set()
        self._clients_lock = threading.Lock()

    def server_bind(self) -> None:
        # bind creates the file with the umask's permissions, which may be wider
        # than socket_mode: created owner-only, it opens up only once its group
        # is the configured one. The umask is the process's, restored at once.
        old_umask = os.umask(0o177)
        try:
            super().server_bind()
        finally:
            os.umask(old_umask)
        try:
            os.chown(self.path, -1, self.gid)
        except OSError as exc:
            self.path.unlink(missing_ok=True)
            raise OSError(
                exc.errno,
                f"cannot give the registration socket {self.path} group {self.gid} "
                f"(socket_group): {exc.strerror}",
            ) from None
        os.chmod(self.path, self.mode)

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
