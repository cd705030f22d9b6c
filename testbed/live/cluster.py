"""A real dsched deployment on this machine: controller and agents as subprocesses.

Used by `dsched demo`, the live benchmarks and the integration tests, so that all
of them exercise the shipped daemons over real gRPC and real cgroups, exactly
as an operator would start them.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import psutil

from dsched.signals import check_stop
from dsched_pb import dsched_pb2 as pb
from dsched_pb import dsched_pb2_grpc as pb_grpc

CGROUP_V1_CPU = Path("/sys/fs/cgroup/cpu")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cgroups_writable() -> tuple[bool, str]:
    """Whether this machine lets us cap threads, and if not, why not."""
    if (CGROUP_V1_CPU / "cpu.cfs_quota_us").exists():
        if os.access(CGROUP_V1_CPU, os.W_OK):
            return True, f"cgroup v1 cpu controller at {CGROUP_V1_CPU} is writable"
        return False, f"{CGROUP_V1_CPU} is not writable (run as root)"
    v2 = Path("/sys/fs/cgroup")
    controllers = v2 / "cgroup.controllers"
    if controllers.exists() and "cpu" in controllers.read_text().split():
        if os.access(v2, os.W_OK):
            return True, "cgroup v2 with the cpu controller is writable"
        return False, f"{v2} is not writable (run as root)"
    return False, "no cgroup cpu controller (v1 cpu or v2 cpu) is mounted"


def _script(name: str) -> str:
    """The console script next to this interpreter (works inside a venv)."""
    candidate = Path(sys.executable).parent / name
    return str(candidate) if candidate.exists() else name


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{k} = {_toml_value(x)}" for k, x in v.items()) + " }"
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return json.dumps(str(v))


def _is_table(v: Any) -> bool:
    return isinstance(v, dict) and all(not isinstance(x, dict) for x in v.values())


def write_toml(path: Path, data: dict[str, Any]) -> Path:
    """Write a flat/one-level TOML file (enough for our configs): keys, tables and
    arrays of tables (a list of flat dicts, e.g. ``[[engine]]``)."""
    lines, tables = [], []
    for k, v in data.items():
        if _is_table(v):
            tables.append((f"[{k}]", v))
        elif isinstance(v, list) and v and all(_is_table(x) for x in v):
            tables.extend((f"[[{k}]]", x) for x in v)
        else:
            lines.append(f"{k} = {_toml_value(v)}")
    for header, table in tables:
        lines.append(f"\n{header}")
        lines.extend(f"{k} = {_toml_value(x)}" for k, x in table.items())
    path.write_text("\n".join(lines) + "\n")
    return path


@dataclass
class NodeSpec:
    node_id: str = "local"
    cgroup_root: str = "dsched"
    metrics_port: int | None = None
    extra_config: dict[str, Any] = field(default_factory=dict)


@dataclass
class AgentProcess:
    spec: NodeSpec
    socket: Path
    metrics: str
    proc: subprocess.Popen
    log: Path


class LocalCluster:
    """Start `dsched-controller` and one `dsched-agent` per node as subprocesses."""

    def __init__(
        self,
        workdir: Path,
        *,
        mode: str = "dry-run",
        slot_seconds: float = 2.0,
        controller_config: dict[str, Any] | None = None,
        nodes: list[NodeSpec] | None = None,
        controller_port: int | None = None,
        metrics_port: int | None = None,
        agent_dry_run: bool = False,
        log_level: str = "INFO",
        history: bool = False,
    ):
        """``history``: run the controller's embedded Spark history (a JVM of its
        own, seconds to start), as the daemon does by default; off for tests."""
        self.workdir = Path(workdir)
        self.mode = mode
        self.slot_seconds = slot_seconds
        self.controller_config = controller_config or {}
        self.nodes = nodes or [NodeSpec()]
        self.listen = f"127.0.0.1:{controller_port or free_port()}"
        # The admin door: a Unix socket beside the agents' sockets (dschedctl
        # --address takes it as is).
        self.admin_address = self.controller_config.get(
            "admin_listen", f"unix:{self.workdir.resolve() / 'admin.sock'}"
        )
        self.metrics = f"127.0.0.1:{metrics_port or free_port()}"
        self.agent_dry_run = agent_dry_run
        self.history = history
        self.log_level = log_level
        self.controller: subprocess.Popen | None = None
        self.agents: dict[str, AgentProcess] = {}
        self._channel: grpc.Channel | None = None

    # ------------------------------------------------------------ processes
    def start_controller(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        cfg = {
            "listen": self.listen,
            "admin_listen": self.admin_address,
            "metrics": self.metrics,
            "state_dir": str(self.workdir / "state"),
            "mode": self.mode,
            "slot_seconds": self.slot_seconds,
            **self.controller_config,
        }
        cfg["history"] = {"enabled": self.history, **cfg.get("history", {})}
        path = write_toml(self.workdir / "controller.toml", cfg)
        log = (self.workdir / "controller.log").open("ab")
        self.controller = subprocess.Popen(
            [_script("dsched-controller"), "--config", str(path), "--log-level", self.log_level],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.wait_ready()

    def start_agent(self, spec: NodeSpec) -> AgentProcess:
        sock = self.workdir / f"agent-{spec.node_id}.sock"
        metrics = f"127.0.0.1:{spec.metrics_port or free_port()}"
        cfg = {
            "controller": self.listen,
            "node_id": spec.node_id,
            "cgroup_root": spec.cgroup_root,
            "metrics": metrics,
            "socket": str(sock),
            "slot_seconds": self.slot_seconds,
            "dry_run": self.agent_dry_run,
            **spec.extra_config,
        }
        path = write_toml(self.workdir / f"agent-{spec.node_id}.toml", cfg)
        logfile = self.workdir / f"agent-{spec.node_id}.log"
        proc = subprocess.Popen(
            [_script("dsched-agent"), "--config", str(path), "--log-level", self.log_level],
            stdout=logfile.open("ab"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        agent = AgentProcess(spec, sock, metrics, proc, logfile)
        self.agents[spec.node_id] = agent
        deadline = time.monotonic() + 20
        while not sock.exists():
            if proc.poll() is not None:
                raise RuntimeError(
                    f"dsched-agent {spec.node_id} exited: {logfile.read_text()[-2000:]}"
                )
            if time.monotonic() > deadline:
                raise RuntimeError(f"dsched-agent {spec.node_id} did not open {sock}")
            check_stop()
            time.sleep(0.05)
        return agent

    def start(self) -> LocalCluster:
        """Start the controller and the agents; a failed or interrupted start (a stop
        signal: :func:`dsched.signals.check_stop`) stops what it started."""
        try:
            self.start_controller()
            for spec in self.nodes:
                self.start_agent(spec)
            self.wait_agents(len(self.nodes))
        except BaseException:
            self.stop()
            raise
        return self

    def wait_ready(self, timeout: float = 30.0) -> None:
        wait_controller_answers(
            self.controller,
            self.workdir / "controller.log",
            lambda: self.admin().Status(pb.StatusRequest(), timeout=1),
            timeout,
            between=check_stop,
        )

    def wait_agents(self, n: int, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while len(self.admin().Status(pb.StatusRequest(), timeout=2).agents) < n:
            if time.monotonic() > deadline:
                raise RuntimeError(f"only some of {n} agents connected")
            check_stop()
            time.sleep(0.1)

    def admin(self) -> pb_grpc.AdminServiceStub:
        if self._channel is None:
            self._channel = grpc.insecure_channel(self.admin_address)
        return pb_grpc.AdminServiceStub(self._channel)

    def plan(self) -> dict[str, Any] | None:
        r = self.admin().GetPlan(pb.GetPlanRequest(), timeout=5)
        return json.loads(r.record_json) if r.record_json else None

    def decisions(self, last: int = 1000) -> list[dict[str, Any]]:
        """The controller's last ``last`` decision records, oldest first.

        Read from its state store, read-only (WAL lets readers in while the
        controller writes): unlike polling ``plan()``, no epoch is missed.
        """
        path = Path(self.controller_config.get("state_dir", self.workdir / "state"))
        path = path / "controller.sqlite"
        if not path.exists():
            return []
        with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
            rows = db.execute(
                "SELECT record FROM decisions ORDER BY epoch DESC LIMIT ?", (last,)
            ).fetchall()
        return [json.loads(row[0]) for row in reversed(rows)]

    @staticmethod
    def _terminate(proc: subprocess.Popen | None, timeout: float = 10.0) -> None:
        """SIGTERM (the daemon's clean stop), SIGKILL to its whole session after
        ``timeout``; then whatever its session still holds (a Spark JVM the
        controller started) is stopped too."""
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        stop_process_group(proc.pid, timeout)

    def stop_agent(self, node_id: str) -> None:
        self._terminate(self.agents.pop(node_id).proc)

    def kill_controller(self) -> None:
        """SIGKILL, as a crash would."""
        if self.controller is not None and self.controller.poll() is None:
            self.controller.kill()
            self.controller.wait()

    def stop(self) -> None:
        for node in list(self.agents):
            self.stop_agent(node)
        self._terminate(self.controller)
        if self._channel is not None:
            self._channel.close()
            self._channel = None

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def stop_process_group(pgid: int, timeout: float = 10.0) -> None:
    """Stop what is left of process group ``pgid`` after its leader exited:
    SIGTERM, then SIGKILL after ``timeout``. Zombies waiting for their reaper
    do not count."""

    def members() -> list[psutil.Process]:
        found = []
        for p in psutil.process_iter():
            try:
                if os.getpgid(p.pid) == pgid and p.status() != psutil.STATUS_ZOMBIE:
                    found.append(p)
            except (OSError, psutil.Error):
                pass  # gone meanwhile
        return found

    for sig in (signal.SIGTERM, signal.SIGKILL):
        left = members()
        if not left:
            return
        for p in left:
            try:
                p.send_signal(sig)
            except psutil.Error:
                pass
        deadline = time.monotonic() + (timeout if sig == signal.SIGTERM else 5.0)
        while members() and time.monotonic() < deadline:
            time.sleep(0.1)


def scrape(address: str, timeout: float = 5.0) -> str:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=timeout) as r:
        return r.read().decode()


def metric_value(text: str, name: str, labels: dict[str, str] | None = None) -> float | None:
    """Sum of the samples of ``name`` (matching ``labels``) in Prometheus text."""
    from prometheus_client.parser import text_string_to_metric_families

    total, found = 0.0, False
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in (labels or {}).items()):
                total += s.value
                found = True
    return total if found else None


def remove_cgroup_tree(root: Path) -> None:
    """Remove an (empty of tasks) cgroup tree bottom-up; rmdir is the only way."""
    if not root.exists():
        return
    for d in sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
        try:
            d.rmdir()
        except OSError:
            pass
    try:
        root.rmdir()
    except OSError:
        pass  # still has tasks: the agent (or the kernel) will finish


def wait_controller_answers(
    controller: subprocess.Popen | None,
    log: Path,
    probe: Callable[[], object],
    timeout: float,
    *,
    poll_seconds: float = 0.1,
    between: Callable[[], None] = lambda: None,
) -> None:
    """Call ``probe`` (an admin RPC) until it answers; RuntimeError with the tail of
    ``log`` if the controller process exits first, the RpcError after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        if controller is not None and controller.poll() is not None:
            raise RuntimeError("dsched-controller exited: " + log.read_text()[-2000:])
        try:
            probe()
            return
        except grpc.RpcError:
            if time.monotonic() > deadline:
                raise
            between()
            time.sleep(poll_seconds)
