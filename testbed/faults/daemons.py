"""The real daemons of the fault matrix: `dsched-controller` in this machine's
network namespace, one `dsched-agent` per node in its own namespace
(:mod:`testbed.faults.netlab`), the controller's state on a small tmpfs (so a
full disk is a real ENOSPC), and a "pod" cgroup the instances run in.

The agents reach the controller over their veth, a non-loopback address, so the
controller needs TLS or ``allow_plaintext_remote = true``; the harness sets the
opt-out on both sides: its link is a bridge that only its own namespaces join.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from dsched_pb import dsched_pb2 as pb
from dsched_pb import dsched_pb2_grpc as pb_grpc
from testbed.faults.netlab import Host, NetLab
from testbed.live.cluster import (
    CGROUP_V1_CPU,
    free_port,
    metric_value,
    scrape,
    stop_process_group,
    wait_controller_answers,
    write_toml,
)


def _script(name: str) -> str:
    candidate = Path(sys.executable).parent / name
    return str(candidate) if candidate.exists() else name


def _write(path: Path, value: str) -> None:
    """One unbuffered write, so the kernel's refusal is seen."""
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


class Pod:
    """A cgroup the harness's own process (and so every worker it starts) moves
    into: the agents' anchor. Nothing else on the machine lives in it, so every
    change below it outside the agents' roots is the agents' doing."""

    def __init__(self, name: str, mount: Path = CGROUP_V1_CPU):
        self.mount = mount
        self.path = mount / name
        self._home: Path | None = None

    def enter(self) -> Pod:
        self.path.mkdir()
        self._home = self.mount / self._own_cgroup().lstrip("/")
        _write(self.path / "cgroup.procs", str(os.getpid()))
        return self

    @staticmethod
    def _own_cgroup() -> str:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _num, controllers, path = line.split(":", 2)
            if "cpu" in controllers.split(","):
                return path
        return "/"

    def leave(self, wait: float = 15.0) -> bool:
        """Back to where this process came from; the pod is removed once every
        process left it (the workers have exited) and the agents removed their
        roots. True when it is gone."""
        if self._home is not None:
            try:
                _write(self._home / "cgroup.procs", str(os.getpid()))
            except OSError:
                _write(self.mount / "cgroup.procs", str(os.getpid()))
        deadline = time.monotonic() + wait
        while self.path.exists():
            for d in sorted(
                (p for p in self.path.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)
            ):
                _evacuate(d, self.mount)
                try:
                    d.rmdir()
                except OSError:
                    pass
            _evacuate(self.path, self.mount)
            try:
                self.path.rmdir()
            except OSError:
                if time.monotonic() > deadline:
                    return False
                time.sleep(0.2)
        return True


def _evacuate(cgroup: Path, mount: Path) -> None:
    """Move whatever threads are left in ``cgroup`` to the top (cleanup only)."""
    try:
        tids = (cgroup / "tasks").read_text().split()
    except OSError:
        return
    for tid in tids:
        try:
            _write(mount / "tasks", tid)
        except OSError:
            pass


class Tmpfs:
    """A small tmpfs for the controller's state: a full disk in a few megabytes."""

    def __init__(self, path: Path, size_bytes: int):
        self.path = path
        self.size_bytes = size_bytes
        self.mounted = False

    def mount(self) -> Tmpfs:
        self.path.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [
                "mount",
                "-t",
                "tmpfs",
                "-o",
                f"size={self.size_bytes},mode=0700",
                "tmpfs",
                str(self.path),
            ],
            check=True,
            capture_output=True,
        )
        self.mounted = True
        return self

    def remount(self, read_only: bool) -> None:
        subprocess.run(
            ["mount", "-o", f"remount,{'ro' if read_only else 'rw'}", str(self.path)],
            check=True,
            capture_output=True,
        )

    def unmount(self) -> None:
        if self.mounted:
            subprocess.run(["umount", "-l", str(self.path)], check=False, capture_output=True)
            self.mounted = False


@dataclass
class Agent:
    node: str
    host: Host
    config: Path
    socket: Path
    metrics: str
    log: Path
    capacity_cores: float
    fallback: str
    proc: subprocess.Popen | None = None
    starts: int = 0


@dataclass
class FaultCluster:
    """Controller + agents for the matrix. ``agent_options``: per node, extra agent keys."""

    workdir: Path
    lab: NetLab
    slot_seconds: float
    lease_epochs: int
    capacity_cores: float
    fallback: dict[str, str]
    cgroup_root: dict[str, str]
    state_size_bytes: int = 16 * 1024 * 1024
    controller_options: dict[str, Any] = field(default_factory=dict)
    controller: subprocess.Popen | None = None
    agents: dict[str, Agent] = field(default_factory=dict)
    controller_starts: int = 0

    def __post_init__(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.state = Tmpfs(self.workdir / "state", self.state_size_bytes)
        self.port = free_port()
        self.listen = f"{self.lab.bridge_address}:{self.port}"
        self.admin_address = f"unix:{(self.workdir / 'admin.sock').resolve()}"
        self.metrics = f"127.0.0.1:{free_port()}"
        self._channel: grpc.Channel | None = None

    @property
    def state_file(self) -> Path:
        return self.state.path / "controller.sqlite"

    # ------------------------------------------------------------ controller
    def controller_config(self) -> Path:
        cfg = {
            "listen": self.listen,
            "allow_plaintext_remote": True,
            "admin_listen": self.admin_address,
            "metrics": self.metrics,
            "state_dir": str(self.state.path),
            "mode": "enforce",
            "slot_seconds": self.slot_seconds,
            "history": {"enabled": False},
            **self.controller_options,
        }
        return write_toml(self.workdir / "controller.toml", cfg)

    def spawn_controller(self) -> subprocess.Popen:
        """Start the controller; do not wait for it (it may be meant to refuse)."""
        if not self.state.mounted:
            self.state.mount()
        path = self.controller_config()
        log = (self.workdir / "controller.log").open("ab")
        self.controller = subprocess.Popen(
            [_script("dsched-controller"), "--config", str(path), "--log-level", "INFO"],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        self.controller_starts += 1
        return self.controller

    def start_controller(self, timeout: float = 60.0) -> None:
        self.spawn_controller()
        self.wait_ready(timeout)

    def wait_ready(self, timeout: float = 60.0) -> None:
        wait_controller_answers(
            self.controller,
            self.workdir / "controller.log",
            lambda: self.status(timeout=1),
            timeout,
            poll_seconds=0.05,
        )

    def kill_controller(self) -> None:
        if self.controller is not None and self.controller.poll() is None:
            self.controller.kill()
            self.controller.wait()

    def signal_controller(self, sig: int) -> None:
        if self.controller is not None and self.controller.poll() is None:
            self.controller.send_signal(sig)

    def stop_controller(self, timeout: float = 20.0) -> int | None:
        proc, self.controller = self.controller, None
        # A stopped (stalled) controller cannot act on SIGTERM until it is continued.
        return _terminate(proc, timeout, continue_first=True)

    # ------------------------------------------------------------ admin door
    def admin(self) -> pb_grpc.AdminServiceStub:
        if self._channel is None:
            self._channel = grpc.insecure_channel(self.admin_address)
        return pb_grpc.AdminServiceStub(self._channel)

    def reset_admin(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None

    def status(self, timeout: float = 2.0) -> pb.StatusReply:
        return self.admin().Status(pb.StatusRequest(), timeout=timeout)

    def connected(self) -> set[str]:
        try:
            return {a.node_id for a in self.status().agents}
        except grpc.RpcError:
            return set()

    def qos(self) -> dict[str, str]:
        reply = self.admin().ListQos(pb.ListQosRequest(), timeout=5)
        return {a.app: a.qos_class for a in reply.assignments if not a.defaulted}

    def dschedctl(self, *args: str, timeout: float = 20.0) -> subprocess.CompletedProcess:
        """The admin door as an operator uses it."""
        return subprocess.run(
            [_script("dschedctl"), "--address", self.admin_address, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def controller_metric(self, name: str, labels: dict[str, str] | None = None) -> float | None:
        try:
            return metric_value(scrape(self.metrics, timeout=3), name, labels)
        except OSError:
            return None

    # ------------------------------------------------------------ agents
    def add_agent(self, node: str) -> Agent:
        host = self.lab.hosts[node]
        sock = self.workdir / f"agent-{node}.sock"
        metrics = f"{host.address}:{free_port()}"
        cfg = {
            "controller": self.listen,
            "allow_plaintext_remote": True,
            "node_id": node,
            "cgroup_mode": "v1",
            "cgroup_mount": str(CGROUP_V1_CPU),
            "cgroup_root": self.cgroup_root[node],
            "metrics": metrics,
            "socket": str(sock),
            "slot_seconds": self.slot_seconds,
            "sample_seconds": min(0.25, self.slot_seconds),
            "lease_epochs": self.lease_epochs,
            "fallback": self.fallback[node],
            "capacity_cores": self.capacity_cores,
            "cpu_period_us": 10_000,
            "resctrl_mount": str(self.workdir / "no-resctrl"),
        }
        path = write_toml(self.workdir / f"agent-{node}.toml", cfg)
        agent = Agent(
            node=node,
            host=host,
            config=path,
            socket=sock,
            metrics=metrics,
            log=self.workdir / f"agent-{node}.log",
            capacity_cores=self.capacity_cores,
            fallback=self.fallback[node],
        )
        self.agents[node] = agent
        return agent

    def start_agent(self, node: str, timeout: float = 60.0) -> Agent:
        """Start (or restart) the agent inside its namespace; ready once its /metrics
        answers (a socket file may be left by the agent killed before)."""
        agent = self.agents[node]
        log = agent.log.open("ab")
        agent.proc = subprocess.Popen(
            agent.host.command(
                [_script("dsched-agent"), "--config", str(agent.config), "--log-level", "INFO"]
            ),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        agent.starts += 1
        deadline = time.monotonic() + timeout
        while True:
            if agent.proc.poll() is not None:
                raise RuntimeError(f"dsched-agent {node} exited: {agent.log.read_text()[-2000:]}")
            try:
                scrape(agent.metrics, timeout=1)
                if agent.socket.exists():
                    return agent
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"dsched-agent {node} did not come up in {timeout:g} s")
            time.sleep(0.05)

    def kill_agent(self, node: str) -> None:
        proc = self.agents[node].proc
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()

    def stop_agent(self, node: str, timeout: float = 20.0) -> int | None:
        agent = self.agents[node]
        proc, agent.proc = agent.proc, None
        return _terminate(proc, timeout)

    def agent_metrics(self, node: str) -> str | None:
        try:
            return scrape(self.agents[node].metrics, timeout=3)
        except OSError:
            return None

    def wait_connected(self, nodes: set[str], timeout: float) -> float | None:
        """Seconds until the controller lists every node in ``nodes``; None on timeout."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if nodes <= self.connected():
                return time.monotonic() - t0
            time.sleep(0.05)
        return None

    # ------------------------------------------------------------ all
    def start(self) -> FaultCluster:
        try:
            self.start_controller()
            for node in self.lab.hosts:
                self.add_agent(node)
                self.start_agent(node)
            if self.wait_connected(set(self.lab.hosts), 60) is None:
                raise RuntimeError("the agents did not connect to the controller")
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> dict[str, int | None]:
        """SIGTERM everything (the daemons' clean stop); their exit statuses."""
        codes = {}
        for node in list(self.agents):
            codes[node] = self.stop_agent(node)
        codes["controller"] = self.stop_controller()
        self.reset_admin()
        return codes

    def close(self) -> None:
        self.stop()
        self.state.unmount()


def _terminate(
    proc: subprocess.Popen | None, timeout: float, continue_first: bool = False
) -> int | None:
    """SIGTERM, SIGKILL to the group after ``timeout``, then whatever of the group is
    left; the exit status (None: there was no process)."""
    if proc is None:
        return None
    if proc.poll() is None:
        if continue_first:
            proc.send_signal(signal.SIGCONT)
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    stop_process_group(proc.pid, 5)
    return proc.returncode
