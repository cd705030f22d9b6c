"""Discovery by rules, for engines whose instances do not register themselves.

A rule selects processes by a regex over the command line and their instance
threads by a regex over thread names, with named groups ``operator``,
``instance`` (and ``app``, unless the rule fixes it). Linux cuts a thread's
``comm`` at 15 characters, so for JVMs (``jvm = true``) full names come from
``jcmd <pid> Thread.print``, where ``nid=0x..`` is the OS thread id.

The process's start time is read when its command line matches and goes with
every registration from it: if the pid names another process by the time the
threads are registered, the registration is refused instead of taking that
process's threads.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import psutil

from agent.config import DiscoveryRule
from agent.jvm import JcmdError, is_jvm, jcmd_threads, parse_jcmd_threads
from agent.node import NodeAgent
from agent.registry import RegistrationError
from agent.sampling import process_start_ticks

log = logging.getLogger(__name__)

# parse_jcmd_threads lives in agent.jvm (engines use it too) and stays importable from here.
__all__ = ["RuleDiscovery", "jvm_threads", "match_threads", "parse_jcmd_threads", "proc_threads"]


@dataclass(frozen=True)
class FoundThread:
    pid: int
    tid: int
    name: str


@dataclass(frozen=True)
class Match:
    app: str
    operator: str
    instance: int
    worker: str
    stateful: bool
    pid: int
    tid: int


def jvm_threads(pid: int, timeout: float = 10.0, proc_root: str | Path = "/proc") -> dict[int, str]:
    """TID -> full name of a JVM's threads; empty (with a log line) when jcmd cannot tell.

    A process that is not a JVM is never attached to: jcmd's SIGQUIT would kill it.
    """
    if not is_jvm(proc_root, pid):
        log.warning("process %d matched a jvm rule but is not a JVM; not attaching", pid)
        return {}
    try:
        return jcmd_threads(pid, timeout)
    except JcmdError as exc:
        log.warning("%s", exc)
        return {}


def proc_threads(proc_root: str | Path, pid: int) -> dict[int, str]:
    """TID -> comm (at most 15 characters) from /proc."""
    out = {}
    try:
        for task in Path(f"{proc_root}/{pid}/task").iterdir():
            try:
                out[int(task.name)] = (task / "comm").read_text().rstrip("\n")
            except (OSError, ValueError):
                continue
    except OSError:
        pass
    return out


def match_threads(rule: DiscoveryRule, pid: int, threads: dict[int, str]) -> list[Match]:
    """Threads of one selected process that the rule names as instances."""
    pattern = re.compile(rule.thread_name)
    found = []
    for tid, name in sorted(threads.items()):
        m = pattern.fullmatch(name) or pattern.search(name)
        if not m:
            continue
        groups = m.groupdict()
        try:
            instance = int(groups["instance"])
        except (TypeError, ValueError):
            continue
        found.append(
            Match(
                app=groups.get("app") or rule.app,
                operator=groups["operator"],
                instance=instance,
                worker=rule.worker or f"pid{pid}",
                stateful=rule.stateful,
                pid=pid,
                tid=tid,
            )
        )
    return found


def matching_processes(
    rule: DiscoveryRule, processes: Iterable[psutil.Process], proc_root: str | Path = "/proc"
) -> list[tuple[int, int]]:
    """(pid, start time) of the processes whose command line the rule selects.

    The command line of a match is read again after its start time: the start
    time kept is then that of a process the rule selects, or of an earlier one
    under the same pid, which the registration refuses.
    """
    pattern = re.compile(rule.cmdline)

    def selected(proc: psutil.Process) -> bool:
        try:
            cmdline = " ".join(proc.cmdline())
        except (psutil.Error, OSError):
            return False
        return bool(cmdline and pattern.search(cmdline))

    found = []
    for proc in processes:
        if not selected(proc):
            continue
        started = process_start_ticks(proc_root, proc.pid)
        if started is not None and selected(proc):
            found.append((proc.pid, started))
    return found


class RuleDiscovery:
    """Registers the threads the configured rules find (periodically, from the daemon loop)."""

    def __init__(self, agent: NodeAgent, rules: list[DiscoveryRule], proc_root: str = "/proc"):
        self.agent = agent
        self.rules = rules
        self.proc_root = proc_root

    def scan(self) -> list[Match]:
        registered = []
        processes = list(psutil.process_iter())
        for rule in self.rules:
            for pid, started in matching_processes(rule, processes, self.proc_root):
                threads = (
                    jvm_threads(pid, proc_root=self.proc_root)
                    if rule.jvm
                    else proc_threads(self.proc_root, pid)
                )
                for m in match_threads(rule, pid, threads):
                    try:
                        self.agent.register(
                            m.app,
                            m.operator,
                            m.instance,
                            m.worker,
                            m.stateful,
                            m.pid,
                            m.tid,
                            source="rule",
                            start_time=started,
                        )
                        registered.append(m)
                    except RegistrationError:
                        continue
        return registered
