"""Shared pieces of the agent tests: real threads, a real cgroup root, a real gRPC controller.

Holds no tests itself; the other tests/test_agent_*.py import from here.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import queue
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from contextlib import ExitStack, contextmanager
from pathlib import Path

import grpc

from agent.cgroups import CgroupV1
from dsched_pb import dsched_pb2 as pb
from dsched_pb import dsched_pb2_grpc as pb_grpc

_counter = itertools.count()


def unique_root() -> str:
    return f"dsched-test-{os.getpid()}-{next(_counter)}"


def wait_for(predicate: Callable[[], object], timeout: float = 10.0, step: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return bool(predicate())


class WorkerThread:
    """A real OS thread: sleeping, or saturated with hashlib (which releases the GIL)."""

    def __init__(self, busy: bool = False):
        self.stop = threading.Event()
        self._ready = threading.Event()
        self.tid = 0
        self.busy = busy
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        self._ready.wait(5)

    def _run(self) -> None:
        self.tid = threading.get_native_id()
        self._ready.set()
        if not self.busy:
            self.stop.wait()
            return
        buf = b"x" * 65536
        while not self.stop.is_set():
            hashlib.sha256(buf).digest()

    def join(self) -> None:
        self.stop.set()
        self.thread.join(10)


def release_tree(mount: Path, root_name: str) -> None:
    """Move every thread left in the test root back to the top cgroup, then remove the root."""
    root = mount / root_name
    if not root.exists():
        return
    for tasks in root.rglob("tasks"):
        for tid in tasks.read_text().split():
            try:
                fd = os.open(mount / "tasks", os.O_WRONLY)
                try:
                    os.write(fd, tid.encode())
                finally:
                    os.close(fd)
            except OSError:
                pass
    CgroupV1(mount, root_name).remove_root()


def write_control(path: Path, value: str) -> None:
    """One write(2) of ``value`` to a cgroup control file (the kernel wants one)."""
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def empty_and_remove(directory: Path, top_tasks: Path) -> None:
    """Every thread of ``directory``'s tree into ``top_tasks``, then the tree goes
    (bottom-up: rmdir is the only way to remove a cgroup)."""
    if not directory.exists():
        return
    for tasks in directory.rglob("tasks"):
        for tid in tasks.read_text().split():
            try:
                write_control(top_tasks, tid)
            except OSError:
                pass  # the thread exited meanwhile
    for d in sorted((p for p in directory.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
        d.rmdir()
    directory.rmdir()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RecordingController(pb_grpc.AgentServiceServicer):
    """A minimal controller side of AgentService.Connect on a real gRPC server."""

    def __init__(self, welcome_epoch: int = 0):
        self.welcome_epoch = welcome_epoch
        self.hellos: list[pb.Hello] = []
        self.reports: list[pb.NodeReport] = []
        self.acks: list[pb.Ack] = []
        self.outbox: queue.Queue[pb.ControllerMessage] = queue.Queue()
        self.server: grpc.Server | None = None
        self.port = 0

    def Connect(self, request_iterator, context) -> Iterator[pb.ControllerMessage]:  # noqa: N802
        def read() -> None:
            try:
                for msg in request_iterator:
                    kind = msg.WhichOneof("body")
                    getattr(
                        self, {"hello": "hellos", "report": "reports", "ack": "acks"}[kind]
                    ).append(getattr(msg, kind))
            except grpc.RpcError:
                pass

        threading.Thread(target=read, daemon=True).start()
        yield pb.ControllerMessage(welcome=pb.Welcome(epoch=self.welcome_epoch, slot_seconds=1))
        while context.is_active():
            try:
                yield self.outbox.get(timeout=0.05)
            except queue.Empty:
                continue

    def start(self, port: int = 0, credentials: grpc.ServerCredentials | None = None) -> int:
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        pb_grpc.add_AgentServiceServicer_to_server(self, self.server)
        address = f"127.0.0.1:{port}"
        if credentials is None:
            self.port = self.server.add_insecure_port(address)
        else:
            self.port = self.server.add_secure_port(address, credentials)
        self.server.start()
        return self.port

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop(grace=0).wait(5)
            self.server = None

    def send_caps(self, epoch: int, caps: list[tuple[str, str, int, float]]) -> None:
        directive = pb.CapDirective(epoch=epoch, reason="test")
        for app, operator, instance, cap in caps:
            directive.caps.append(
                pb.InstanceCap(
                    key=pb.InstanceKey(app=app, operator=operator, instance=instance), cap_cores=cap
                )
            )
        self.outbox.put(pb.ControllerMessage(directive=directive))


COUNTERS = dict(
    received=10,
    executed=8,
    emitted=16,
    queue_length=2,
    latency_sum_seconds=0.5,
    latency_count=8,
    service_seconds=0.1,
)


@contextmanager
def registration_server(tmp_path: Path) -> Iterator[tuple]:
    """A dry-run NodeAgent behind a real registration socket: (agent, server, path)."""
    from agent.config import AgentConfig
    from agent.node import NodeAgent
    from agent.socket_server import RegistrationServer

    path = tmp_path / "agent.sock"
    agent = NodeAgent(AgentConfig(dry_run=True, socket=str(path)))
    server = RegistrationServer(path, agent)
    server.start()
    try:
        yield agent, server, path
    finally:
        server.stop()
        agent.close()


def node_agents(
    stack: ExitStack, tmp_path: Path, nodes: tuple[str, ...] = ("n1", "n2")
) -> dict[str, tuple]:
    """A :func:`registration_server` per node, each in its own directory, kept open
    by ``stack``: node -> (agent, socket path as a string)."""
    agents = {}
    for node in nodes:
        (tmp_path / node).mkdir()
        agent, _server, path = stack.enter_context(registration_server(tmp_path / node))
        agents[node] = (agent, str(path))
    return agents


def make_pki(directory: Path) -> dict[str, Path]:
    """A CA and two certificates it signed, made with the openssl CLI: ``server`` for
    127.0.0.1 and ``client`` for an agent. PEM paths by name: ``ca``, ``server``,
    ``server.key``, ``client``, ``client.key``."""

    def openssl(*args: str) -> None:
        subprocess.run(
            ["openssl", *args],
            cwd=directory,
            check=True,
            capture_output=True,
            stdin=subprocess.DEVNULL,
        )

    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    openssl(
        "req", "-x509", *ec, "-subj", "/CN=dsched-test-ca", "-keyout", "ca.key", "-out", "ca.pem"
    )
    pki = {"ca": directory / "ca.pem"}
    for name, extension in (
        ("server", "subjectAltName=IP:127.0.0.1,DNS:localhost"),
        ("client", "extendedKeyUsage=clientAuth"),
    ):
        (directory / f"{name}.ext").write_text(extension + "\n")
        openssl("req", *ec, "-subj", f"/CN={name}", "-keyout", f"{name}.key", "-out", f"{name}.csr")
        openssl(
            "x509",
            "-req",
            "-in",
            f"{name}.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "1",
            "-extfile",
            f"{name}.ext",
            "-out",
            f"{name}.pem",
        )
        pki[name] = directory / f"{name}.pem"
        pki[f"{name}.key"] = directory / f"{name}.key"
    return pki
