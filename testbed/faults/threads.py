"""Fault 7: an instance's thread exits, or its number goes to another process,
between the controller's decision and the agent's cgroup write.

The agent under test is :class:`agent.node.NodeAgent` in this process with real
cgroups below the pod: the decision is a CapDirective built before the fault,
the write is ``handle_directive`` right after it, so the fault lands exactly
in between (with the daemons, the window is too short to hit on purpose).

A pid is made to be reused on demand through ``/proc/sys/kernel/ns_last_pid``
(root): writing ``p - 1`` there makes the next process this machine starts get
``p`` if it is free. Another process starting in between takes it instead;
such a run is retried and, after a few misses, counted as not made.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dsched_pb import dsched_pb2 as pb

NS_LAST_PID = Path("/proc/sys/kernel/ns_last_pid")

# A process with a second thread that exits when told to ("t\n"); EOF ends it.
CHILD = r"""
import sys, threading
tids, go = [], threading.Event()
def run():
    tids.append(threading.get_native_id())
    go.wait()
t = threading.Thread(target=run); t.start()
while not tids: pass
print(threading.get_native_id(), tids[0], flush=True)
for line in sys.stdin:
    if line.strip() == "t":
        go.set(); t.join(); print("gone", flush=True)
"""


class Child:
    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        main, self.tid = (int(x) for x in self.proc.stdout.readline().split())
        self.pid = self.proc.pid

    def end_thread(self) -> None:
        self.proc.stdin.write("t\n")
        self.proc.stdin.flush()
        self.proc.stdout.readline()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except OSError:
                pass


def spawn_with_pid(pid: int, tries: int = 20) -> subprocess.Popen | None:
    """A sleeping process whose pid is ``pid``; None if others kept taking it."""
    for _ in range(tries):
        try:
            NS_LAST_PID.write_text(str(pid - 1))
        except OSError:
            return None
        proc = subprocess.Popen(["sleep", "60"])
        if proc.pid == pid:
            return proc
        proc.kill()
        proc.wait()
    return None


def cpu_cgroup(pid: int, tid: int) -> str | None:
    try:
        text = Path(f"/proc/{pid}/task/{tid}/cgroup").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        _n, controllers, path = line.split(":", 2)
        if "cpu" in controllers.split(","):
            return path
    return None


@dataclass
class ThreadFaults:
    runs: Counter = field(default_factory=Counter)
    not_made: Counter = field(default_factory=Counter)
    outcomes: Counter = field(default_factory=Counter)
    foreign_threads_capped: int = 0
    cgroups_left: int = 0
    crashes: int = 0
    crash_examples: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "runs": dict(self.runs),
            "not_made": dict(self.not_made),
            "outcomes": dict(self.outcomes),
            "foreign_threads_capped": self.foreign_threads_capped,
            "cgroups_left": self.cgroups_left,
            "crashes": self.crashes,
            "crash_examples": self.crash_examples,
        }


def _directive(epoch: int, key: tuple[str, str, int], cap: float) -> pb.CapDirective:
    return pb.CapDirective(
        epoch=epoch,
        caps=[
            pb.InstanceCap(
                key=pb.InstanceKey(app=key[0], operator=key[1], instance=key[2]), cap_cores=cap
            )
        ],
        reason="fault 7",
    )


def run_thread_faults(node_agent, root_name: str, runs: int) -> ThreadFaults:
    """``runs`` of each kind: ``thread_exit`` (the instance's only thread ends,
    its process lives), ``process_exit`` (the process ends), ``pid_reused`` (the
    process ends and its pid goes to another process), ``tid_reused`` (the
    thread ends and its number becomes another process's pid)."""
    out = ThreadFaults()
    epoch = 1
    for k in range(runs):
        for kind in ("thread_exit", "process_exit", "pid_reused", "tid_reused"):
            key = ("fz7", kind.replace("_", "-"), k)
            child = Child()
            other: subprocess.Popen | None = None
            try:
                register_tid = child.tid if kind in ("thread_exit", "tid_reused") else child.pid
                node_agent.register(key[0], key[1], key[2], "w7", False, child.pid, register_tid)
                decision = _directive(epoch, key, 0.3)
                epoch += 1
                # The fault, between decision and write.
                if kind in ("thread_exit", "tid_reused"):
                    child.end_thread()
                else:
                    child.stop()
                watch: tuple[int, int] | None = None
                if kind == "pid_reused":
                    other = spawn_with_pid(child.pid)
                    watch = (other.pid, other.pid) if other else None
                elif kind == "tid_reused":
                    other = spawn_with_pid(register_tid)
                    watch = (other.pid, other.pid) if other else None
                if kind in ("pid_reused", "tid_reused") and other is None:
                    out.not_made[kind] += 1
                    continue
                out.runs[kind] += 1
                try:
                    ack = node_agent.handle_directive(decision)
                    node_agent.sample()
                    node_agent.sample()
                except Exception as exc:
                    out.crashes += 1
                    if len(out.crash_examples) < 5:
                        out.crash_examples.append(f"{kind}: {exc!r}")
                    continue
                if ack.stale:
                    reason = "stale_epoch"
                elif ack.rejected:
                    reason = ack.rejected[0].reason.split(":", 1)[0]
                else:
                    reason = "applied"
                out.outcomes[f"{kind}:{reason}"] += 1
                if watch is not None:
                    where = cpu_cgroup(*watch) or ""
                    if f"/{root_name}/" in where + "/":
                        out.foreign_threads_capped += 1
                time.sleep(0.01)
            finally:
                if other is not None:
                    other.kill()
                    other.wait()
                child.stop()
    node_agent.sample()
    node_agent.sample()
    out.cgroups_left = sum(1 for p in node_agent.cgroups.values() if p.exists())
    return out
