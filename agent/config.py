"""Agent configuration: the `/etc/dsched/agent.toml` keys as one dataclass.

Loaded with :func:`dsched.config.load_config`; every impossible value fails at
startup with a :class:`~dsched.config.ConfigError` that names the key.
"""

from __future__ import annotations

import grp
import os
import re
import socket
from dataclasses import dataclass, field
from pathlib import Path

from agent.cgroups import BACKENDS
from agent.engines import NODE_ENGINES
from agent.lease import FALLBACK_POLICIES
from dsched.config import ConfigError, is_loopback, parse_hostport, require
from dsched.names import InvalidName, check_name
from dsched.tls import TlsConfig

DEFAULT_CONFIG_PATH = Path("/etc/dsched/agent.toml")

_OCTAL_MODE = re.compile(r"0?[0-7]{3}")


def parse_socket_mode(value: str) -> int:
    """``socket_mode`` as permission bits: three octal digits, optionally after a 0."""
    if not _OCTAL_MODE.fullmatch(value):
        raise ConfigError(
            "socket_mode", f'must be an octal string of permission bits like "0660", got {value!r}'
        )
    return int(value, 8)


def resolve_group(value: str) -> int:
    """``socket_group`` as a gid: a group name or a numeric gid; empty is the agent's group."""
    if not value:
        return os.getegid()
    if value.isascii() and value.isdigit():
        return int(value)
    try:
        return grp.getgrnam(value).gr_gid
    except KeyError:
        raise ConfigError("socket_group", f"no such group {value!r}") from None


class ClientTls(TlsConfig):
    """The agent's ``[tls]`` table: :class:`dsched.tls.TlsConfig` checked as a client.

    ``load_config`` validates a nested table with its own ``validate()``, whose
    default role is the server's; as a server's, an agent's CA-only table would
    be refused under ``tls.cert``.
    """

    def validate(self, role: str = "client") -> None:
        super().validate(role)


@dataclass
class DiscoveryRule:
    """Find instance threads in processes nobody registered.

    ``cmdline`` selects processes (regex searched in the space-joined command
    line); ``thread_name`` must match a thread's name and name the groups
    ``operator`` and ``instance`` (and optionally ``app``, else ``app`` is used).
    ``jvm`` reads full thread names with ``jcmd <pid> Thread.print`` because
    /proc comm is cut at 15 characters.
    """

    # Regex searched in a process's space-joined command line.
    cmdline: str = ""
    # Regex a thread's name must match, with groups `operator` and `instance`
    # (and optionally `app`).
    thread_name: str = ""
    # The application when thread_name has no `app` group.
    app: str = ""
    # The worker these threads belong to (default: the process id).
    worker: str = ""
    # The found instances keep state (placement keeps them apart).
    stateful: bool = False
    # Read full thread names with `jcmd <pid> Thread.print`.
    jvm: bool = False

    def validate(self) -> None:
        for key in ("cmdline", "thread_name"):
            try:
                re.compile(getattr(self, key))
            except re.error as exc:
                raise ConfigError(key, f"invalid regex: {exc}") from None
        require(bool(self.cmdline), "cmdline", "must not be empty")
        groups = re.compile(self.thread_name).groupindex
        for g in ("operator", "instance"):
            require(g in groups, "thread_name", f"needs a named group (?P<{g}>...)")
        require("app" in groups or bool(self.app), "app", "give app or a (?P<app>...) group")


@dataclass
class EngineConfig:
    """An engine whose instances the agent finds by itself (`[[engine]]`); docs/agent.md, "Engines"."""

    # Name in metrics and logs; empty: the kind (a second table of one kind: `flink-2`).
    # Names must be unique.
    name: str = ""
    # The engine: `flink` (another name is refused, listing the known ones).
    kind: str = ""
    # The engine's REST API as http://HOST:PORT (flink: the JobManager; required).
    rest_url: str = ""
    # Regex searched in a process's space-joined command line: this node's
    # TaskManager JVMs. It must select only TaskManagers of the cluster at
    # rest_url, or another cluster's threads could be taken for this one's.
    taskmanager_cmdline: str = r"org\.apache\.flink\.runtime\.taskexecutor\.TaskManagerRunner"
    # Regex a job's name must match in full for its subtasks to be managed (default: every job).
    jobs: str = ".*"
    # Operators (Flink vertex names or their dsched names) that keep state whatever
    # their kind says.
    stateful_operators: list[str] = field(default_factory=list)
    # Operators (Flink vertex names or their dsched names) that keep no state whatever
    # their kind says.
    stateless_operators: list[str] = field(default_factory=list)
    # How often this node's threads are mapped, seconds; 0 means once a slot (slot_seconds).
    scan_seconds: float = 0.0
    # The job directory is read again from the REST API when a thread does not
    # resolve with it or when it is older than this (never every scan).
    directory_refresh_seconds: float = 30.0
    # Timeout of one REST call, seconds.
    rest_timeout_seconds: float = 2.0
    # Timeout of one `jcmd <pid> Thread.print`, seconds.
    jcmd_timeout_seconds: float = 10.0

    def validate(self) -> None:
        engine = NODE_ENGINES.factory(self.kind, "kind")
        if self.name:
            try:
                check_name("name", self.name)
            except InvalidName as exc:
                raise ConfigError("name", str(exc)) from None
        for key in ("taskmanager_cmdline", "jobs"):
            try:
                re.compile(getattr(self, key))
            except re.error as exc:
                raise ConfigError(key, f"invalid regex: {exc}") from None
        require(bool(self.taskmanager_cmdline), "taskmanager_cmdline", "must not be empty")
        both = sorted(set(self.stateful_operators) & set(self.stateless_operators))
        require(not both, "stateless_operators", f"also listed as stateful: {', '.join(both)}")
        require(self.scan_seconds >= 0, "scan_seconds", "must be >= 0 (0 = slot_seconds)")
        require(self.directory_refresh_seconds > 0, "directory_refresh_seconds", "must be > 0")
        require(self.rest_timeout_seconds > 0, "rest_timeout_seconds", "must be > 0")
        require(self.jcmd_timeout_seconds > 0, "jcmd_timeout_seconds", "must be > 0")
        check = getattr(engine, "check_config", None)
        if check is not None:
            check(self)

    def stateful_overrides(self) -> dict[str, bool]:
        """Operator name -> stateful, from the two override lists."""
        return {
            **dict.fromkeys(self.stateless_operators, False),
            **dict.fromkeys(self.stateful_operators, True),
        }


#: Where NodeSample.other_cpu_cores comes from (AgentConfig.node_cpu).
NODE_CPU_SOURCES = ("host", "cgroup")


@dataclass
class AgentConfig:
    """All agent settings; the defaults suit a single node talking to a local controller."""

    # The controller's gRPC address (HOST:PORT).
    controller: str = "127.0.0.1:7700"
    # This node's id in reports and directives (default: the host name).
    node_id: str = field(default_factory=socket.gethostname)
    # The agent's cgroup subtree; nothing is written outside it.
    cgroup_root: str = "dsched"
    # `auto` (detect), `v1` (cpu hierarchy, TIDs into tasks) or `v2`
    # (threaded subtree, cpu.max).
    cgroup_mode: str = "auto"
    # Empty means the kernel's usual place for the chosen mode.
    cgroup_mount: str = ""
    # Prometheus /metrics address (HOST:PORT).
    metrics: str = "127.0.0.1:9709"
    # Unix socket where instances register their threads.
    socket: str = "/run/dsched/agent.sock"
    # File mode of the socket (octal): who may connect at all. Whatever the
    # mode, an instance key belongs to the uid that registered it
    # (docs/agent.md, "Registration socket").
    socket_mode: str = "0660"
    # Group of the socket (name or number); empty: the agent's own.
    socket_group: str = ""
    # Measure and report, never write a cgroup.
    dry_run: bool = False
    # One report per slot; the controller's slot wins once connected.
    slot_seconds: float = 10.0
    # How often per-thread CPU is sampled within a slot.
    sample_seconds: float = 1.0
    # Slots without a word from the controller before the fallback applies.
    lease_epochs: int = 3
    # After the lease: `hold` the last caps, or `release` them.
    fallback: str = "hold"
    # Reports kept while disconnected, resent on reconnect (oldest dropped).
    report_buffer: int = 360
    # CFS period written with every quota (cgroup v1 cfs_period_us, v2 cpu.max).
    cpu_period_us: int = 100_000
    # CPU this node offers to managed instances; 0 means every online CPU. When
    # set, it is also enforced as the quota of the agent's root cgroup, so the
    # capacity the controller plans with is the capacity the kernel grants.
    capacity_cores: float = 0.0
    # Where the node's CPU beyond its instances (NodeSample.other_cpu_cores) is
    # read: `host`, the machine's busy time less the instances' (one agent per
    # machine), or `cgroup`, the threads the agent's root cgroup holds directly
    # (the node's processes run inside that root: a container, or several
    # agents sharing one machine, each with a root of its own).
    node_cpu: str = "host"
    # Where resctrl is mounted (LLC occupancy, memory bandwidth); absent: unavailable.
    resctrl_mount: str = "/sys/fs/resctrl"
    # The /proc to read threads from (tests point it elsewhere).
    proc_root: str = "/proc"
    # Any TlsConfig works when built in code; the annotation makes a loaded table a client one.
    # Client TLS: ca to check the controller, cert + key of this agent.
    tls: ClientTls = field(default_factory=ClientTls)
    # Connect without TLS to a non-loopback controller (a warning at every start).
    allow_plaintext_remote: bool = False
    # Rules that find instance threads nobody registered (`[[discovery]]`).
    discovery: list[DiscoveryRule] = field(default_factory=list)
    # How often discovery rules rescan processes.
    discovery_seconds: float = 10.0
    # Engines whose instances the agent finds itself, threads by name
    # (`[[engine]]`; docs/agent.md, "Engines").
    engine: list[EngineConfig] = field(default_factory=list)

    def validate(self) -> None:
        host, _ = parse_hostport("controller", self.controller)
        parse_hostport("metrics", self.metrics)
        try:
            check_name("node_id", self.node_id)
        except InvalidName as exc:
            raise ConfigError("node_id", str(exc)) from None
        try:
            check_name("cgroup_root", self.cgroup_root)
        except InvalidName as exc:
            raise ConfigError("cgroup_root", str(exc)) from None
        BACKENDS.check(self.cgroup_mode)
        require(
            self.fallback in FALLBACK_POLICIES, "fallback", f"one of {', '.join(FALLBACK_POLICIES)}"
        )
        require(bool(self.socket), "socket", "must not be empty")
        parse_socket_mode(self.socket_mode)
        resolve_group(self.socket_group)
        require(self.slot_seconds > 0, "slot_seconds", "must be > 0")
        require(self.sample_seconds > 0, "sample_seconds", "must be > 0")
        require(
            self.sample_seconds <= self.slot_seconds,
            "sample_seconds",
            "must not exceed slot_seconds",
        )
        require(self.lease_epochs >= 1, "lease_epochs", "must be >= 1")
        require(self.report_buffer >= 1, "report_buffer", "must be >= 1")
        # The kernel accepts CFS periods from 1 ms to 1 s.
        require(
            1000 <= self.cpu_period_us <= 1_000_000, "cpu_period_us", "must be in [1000, 1000000]"
        )
        require(self.discovery_seconds > 0, "discovery_seconds", "must be > 0")
        require(self.capacity_cores >= 0, "capacity_cores", "must be >= 0 (0 = all CPUs)")
        require(self.node_cpu in NODE_CPU_SOURCES, "node_cpu", "one of host, cgroup")
        names = [e.name for e in self.engine if e.name]
        for i, e in enumerate(self.engine):
            require(
                not e.name or names.count(e.name) == 1,
                f"engine[{i}].name",
                f"{e.name!r} names two [[engine]] tables",
            )
        self.tls.validate("client")
        require(
            self.tls.enabled or is_loopback(host) or self.allow_plaintext_remote,
            "controller",
            f"plaintext gRPC to non-loopback host {host!r} is refused; configure [tls] "
            "or set allow_plaintext_remote = true",
        )
