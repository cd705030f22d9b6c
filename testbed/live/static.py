"""Static contenders for the live benchmark, and the engine variant that runs under caps.

**Static caps.** R-Storm gives every executor a fixed CPU share chosen before
the topology starts. :class:`StaticCaps` does the same on this machine: it
writes one cap per instance, once, through the same cgroup backend the agent
uses (:class:`agent.cgroups.CgroupV1`, same layout
``<mount>/<root>/<app>/<worker>/<operator>-<instance>``), directly and not
through an agent, so no controller or agent process runs for a static
contender. The tree's root gets the testbed's capacity as its quota, exactly as
the agent does with ``capacity_cores``, so every contender runs on the same
amount of CPU. Uncapped instances are still placed in the tree (quota ``-1``)
so that only the per-instance cap differs between contenders.

Cap strategies are chosen by name (:func:`static_caps`): ``static-0.7`` (the
testbed's capacity spread evenly over all executors, the paper's 0.7 core
scaled), ``static-0.3`` (3/7 of it), ``uncapped`` and ``equal`` (per-operator
caps whose total matches a measured allocation).

**CPU work outside the engine's threads.** Instances are threads of one
Python process. A thread throttled by CFS while it holds the GIL blocks every
other thread of the process until its next period, so capping engine threads
also slows the instances that are not throttled (figures in
docs/live-benchmark.md). :class:`SliceBurnTopology` burns a tuple's CPU in one
sha256 call over a memoryview slice of a large buffer, and by default in a
:class:`CpuWorker`: a single-threaded process per instance, whose thread is
the one registered with the agent and capped, while the engine thread keeps
queueing, routing, acking and state. It can also be aborted: a backlog left by
an under-provisioned contender is dropped (and counted) instead of burning
CPU during the next contender's run.

**The run's own CPU.** :class:`Reservation` gives a benchmark run a cgroup of
its own with a high ``cpu.shares`` (``testbed/`` for the instance tree,
``harness/`` for everything else the run starts), so that it gets its promised
capacity on a shared machine, and removes it all at the end.
"""

from __future__ import annotations

import hashlib
import os
import struct
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.cgroups import CgroupV1, ThreadGone
from agent.instance_client import AgentClient, _key
from agent.registry import InstanceKey
from dsched.names import check_name
from testbed.live.engine import Instance, LiveTopology, OperatorSpec, Tuple

_SLICE_BUFFER = os.urandom(32 * 1024 * 1024)
_SLICE_VIEW = memoryview(_SLICE_BUFFER)


def calibrate_seconds_per_byte(size: int = 4 * 1024 * 1024, rounds: int = 5) -> float:
    """CPU seconds per byte of one sha256 call on this machine (best of ``rounds``)."""
    best = float("inf")
    for _ in range(rounds):
        t0 = time.thread_time()
        hashlib.sha256(_SLICE_VIEW[:size]).digest()
        best = min(best, time.thread_time() - t0)
    return max(best / size, 1e-12)


_SECONDS_PER_BYTE: float | None = None


def seconds_per_byte() -> float:
    global _SECONDS_PER_BYTE
    if _SECONDS_PER_BYTE is None:
        _SECONDS_PER_BYTE = calibrate_seconds_per_byte()
    return _SECONDS_PER_BYTE


def slice_burn(cpu_seconds: float) -> None:
    """Spend about ``cpu_seconds`` of CPU in as few GIL-free sha256 calls as possible."""
    remaining = int(cpu_seconds / seconds_per_byte())
    while remaining > 0:
        n = min(remaining, len(_SLICE_BUFFER))
        hashlib.sha256(_SLICE_VIEW[:n]).digest()
        remaining -= n


# The CPU-work process of one instance: reads a byte count (4 bytes, little
# endian), hashes that many bytes in GIL-free sha256 calls, answers one byte.
# It exits when its input closes, so it never outlives the benchmark.
_WORKER_SOURCE = """
import hashlib, os, struct
buf = memoryview(bytes(8 * 1024 * 1024))
os.write(1, b"r")
while True:
    head = os.read(0, 4)
    if len(head) < 4:
        break
    n = struct.unpack("<I", head)[0]
    while n > 0:
        k = min(n, len(buf))
        hashlib.sha256(buf[:k]).digest()
        n -= k
    os.write(1, b"d")
"""

CPU_MODES = ("thread", "process")


class CpuWorker:
    """A process that does one instance's per-tuple CPU work (one thread: its pid)."""

    def __init__(self):
        self.process = subprocess.Popen(
            [sys.executable, "-c", _WORKER_SOURCE],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        self._in = self.process.stdin.fileno()
        self._out = self.process.stdout.fileno()

    @property
    def pid(self) -> int:
        return self.process.pid

    def wait_ready(self) -> None:
        if os.read(self._out, 1) != b"r":
            raise RuntimeError(f"CPU worker {self.pid} did not start")

    def burn(self, cpu_seconds: float) -> None:
        n = int(cpu_seconds / seconds_per_byte())
        if n <= 0:
            return
        os.write(self._in, struct.pack("<I", min(n, 0xFFFFFFFF)))
        if os.read(self._out, 1) != b"d":
            raise RuntimeError(f"CPU worker {self.pid} exited")

    def close(self, timeout: float = 2.0) -> None:
        for f in (self.process.stdin, self.process.stdout):
            try:
                f.close()
            except OSError:
                pass
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class SliceBurnInstance(Instance):
    """An engine instance that burns with :func:`slice_burn` (in its own thread or in
    its :class:`CpuWorker` process) and stops on abort."""

    cpu_worker: CpuWorker | None = None

    @property
    def cpu_pid_tid(self) -> tuple[int, int]:
        """The OS thread that does this instance's CPU work (the one to cap)."""
        if self.cpu_worker is not None:
            return self.cpu_worker.pid, self.cpu_worker.pid
        return os.getpid(), self.native_id

    def _run(self) -> None:
        self.native_id = threading.get_native_id()
        self.started.set()
        eng, cost = self.engine, self.spec.cost_ms / 1000.0
        children = eng.children[self.spec.name]
        burn_cpu = self.cpu_worker.burn if self.cpu_worker is not None else slice_burn
        while True:
            t = self.queue.get()
            if t is None or eng.aborted.is_set():
                return
            start = time.perf_counter()
            try:
                burn_cpu(cost)
            except (OSError, RuntimeError):
                if eng.aborted.is_set():
                    return
                raise
            out = self.spec.fn(t, self.state)
            sent = len(out) * len(children)
            # Ack before routing, as in the stock engine: a child processed at
            # once must find its parent's emissions already counted.
            latency = eng.acker.processed(t, sent, time.time())
            for ci, child in enumerate(children):
                for j, (key, value) in enumerate(out):
                    eng.route(child, Tuple(t.root, (*t.tid, ci, j), t.created, key, value))
            c = self.counters
            c.executed += 1
            # Storm's "emitted" (tuples per output stream), not "transferred"
            # (times the number of subscribers): the controller's parent-based
            # prediction multiplies it by the parent's rate for each child.
            c.emitted += len(out)
            c.service_seconds += time.perf_counter() - start
            if latency is not None:
                c.latency_sum_seconds += latency
                c.latency_count += 1


class SliceBurnTopology(LiveTopology):
    """:class:`LiveTopology` with :class:`SliceBurnInstance` threads and ``abort()``.

    ``cpu="process"`` gives every instance a :class:`CpuWorker`: the instance
    thread keeps routing, acking and state (never capped, so it never stalls the
    process's other threads) and the CPU work runs in a single-threaded process
    whose thread is the one registered with the agent and capped.
    """

    instance_class: type[Instance] = SliceBurnInstance

    def __init__(
        self,
        *args,
        group_keys: Mapping[str, Callable[[Any], str]] | None = None,
        cpu: str = "process",
        **kwargs,
    ):
        """``group_keys`` keys fields grouping of an operator on a field of the tuple's
        value instead of the tuple's key (operator name -> function of the value)."""
        super().__init__(*args, **kwargs)
        if cpu not in CPU_MODES:
            raise ValueError(f"cpu must be one of {', '.join(CPU_MODES)}, got {cpu!r}")
        self.cpu = cpu
        self.group_keys = dict(group_keys or {})
        unknown = set(self.group_keys) - {o.name for o in self.spec.operators}
        if unknown:
            raise ValueError(f"group_keys names unknown operators {sorted(unknown)}")
        self.aborted = threading.Event()
        self.instances = {
            o.name: [self.instance_class(self, o, i, insts[i].worker) for i in range(o.parallelism)]
            for o, insts in ((o, self.instances[o.name]) for o in self.spec.operators)
        }

    def start(self) -> None:
        seconds_per_byte()  # calibrate before the clock starts
        if self.cpu == "process":
            for inst in self.all_instances():
                inst.cpu_worker = CpuWorker()
            for inst in self.all_instances():
                inst.cpu_worker.wait_ready()
        super().start()

    def _register_all(self) -> None:
        self._client = ForeignThreadClient(self._agent_socket)
        for inst in self.all_instances():
            pid, tid = inst.cpu_pid_tid
            self._client.register_thread(
                self.spec.app,
                inst.spec.name,
                inst.index,
                inst.worker,
                inst.spec.stateful,
                pid=pid,
                tid=tid,
                upstream=inst.spec.upstream,
            )

    def route(self, operator: str, t: Tuple) -> None:
        key_of = self.group_keys.get(operator)
        if key_of is None:
            super().route(operator, t)
            return
        insts = self.instances[operator]
        inst = insts[zlib.crc32(key_of(t.value).encode()) % len(insts)]
        inst.counters.received += 1
        inst.queue.put(t)

    def abort(self, join_timeout: float = 5.0) -> int:
        """Stop input and every instance (thread and CPU worker) now; returns the
        roots left unfinished."""
        self.stop_input()
        self.aborted.set()
        for inst in self.all_instances():
            inst.queue.put(None)
        for inst in self.all_instances():
            if inst.cpu_worker is not None:
                inst.cpu_worker.close()
        for inst in self.all_instances():
            if inst.thread.is_alive():
                inst.thread.join(timeout=join_timeout)
        if self._reporter is not None:
            self._reporter.join(timeout=2)
        if self._client is not None:
            for inst in self.all_instances():
                self._client.unregister(self.spec.app, inst.spec.name, inst.index)
            self._client.close()
            self._client = None
        return self.acker.in_flight

    def processes_alive(self) -> int:
        return sum(
            inst.cpu_worker is not None and inst.cpu_worker.process.poll() is None
            for inst in self.all_instances()
        )

    def threads_alive(self) -> int:
        return sum(inst.thread.is_alive() for inst in self.all_instances())


class ForeignThreadClient(AgentClient):
    """Registers a thread of another process (the instance's CPU worker).

    The agent accepts a pid other than the caller's only from root (peer
    credentials), which the benchmark is.
    """

    def register_thread(
        self,
        app: str,
        operator: str,
        instance: int,
        worker: str,
        stateful: bool,
        *,
        pid: int,
        tid: int,
        upstream: tuple[str, ...] = (),
    ) -> None:
        key = _key(app, operator, instance)
        for name in (*upstream, worker):
            check_name("upstream" if name != worker else "worker", name)
        msg = {
            "op": "register",
            "app": app,
            "operator": operator,
            "instance": instance,
            "worker": worker,
            "stateful": bool(stateful),
            "pid": pid,
            "tid": tid,
            "upstream": list(upstream),
        }
        with self._lock:
            self._registrations[(key, tid)] = msg
            self._ops.append(msg)
        self._wake.set()


# ---------------------------------------------------------------- cap strategies

STATIC_STRATEGIES = ("static-0.7", "static-0.3", "uncapped", "equal")


@dataclass(frozen=True)
class Scale:
    """The paper's proportions on this machine.

    The paper's cluster had room for ``executors`` executors at 0.7 core each;
    here 0.7 core becomes ``capacity_cores / executors``.
    """

    capacity_cores: float
    executors: int

    def __post_init__(self) -> None:
        if not self.capacity_cores > 0:
            raise ValueError(f"capacity_cores must be > 0, got {self.capacity_cores!r}")
        if self.executors < 1:
            raise ValueError(f"executors must be >= 1, got {self.executors!r}")

    @property
    def core_07(self) -> float:
        return self.capacity_cores / self.executors

    @property
    def factor(self) -> float:
        """Cores here per core of the paper's executors."""
        return self.core_07 / 0.7


def static_caps(
    name: str,
    operators: Iterable[OperatorSpec],
    scale: Scale,
    equal_total_by_operator: Mapping[str, float] | None = None,
) -> dict[str, float | None]:
    """Per-instance cap (cores, None = uncapped) for each operator under strategy ``name``.

    ``equal`` needs ``equal_total_by_operator``: the mean total cores a measured
    run allocated to each operator; each instance gets its operator's share.
    """
    ops = list(operators)
    if name == "static-0.7":
        return {o.name: scale.core_07 for o in ops}
    if name == "static-0.3":
        return {o.name: scale.core_07 * 3 / 7 for o in ops}
    if name == "uncapped":
        return {o.name: None for o in ops}
    if name == "equal":
        if equal_total_by_operator is None:
            raise ValueError("strategy 'equal' needs equal_total_by_operator (a measured run)")
        missing = [o.name for o in ops if o.name not in equal_total_by_operator]
        if missing:
            raise ValueError(f"equal_total_by_operator lacks operators {missing}")
        return {o.name: max(0.01, equal_total_by_operator[o.name] / o.parallelism) for o in ops}
    raise ValueError(f"unknown static strategy {name!r} (known: {', '.join(STATIC_STRATEGIES)})")


class StaticCaps:
    """Fixed per-instance caps written once with :class:`agent.cgroups.CgroupV1`."""

    def __init__(self, mount: str | Path, root_name: str, period_us: int = 100_000):
        self.backend = CgroupV1(mount, root_name, period_us)
        self.paths: dict[tuple[str, int], Path] = {}

    @property
    def root(self) -> Path:
        return self.backend.root

    def apply(
        self, topology: LiveTopology, caps: Mapping[str, float | None], capacity_cores: float
    ) -> None:
        """Limit the root to the testbed's capacity, then cap every instance thread."""
        self.backend.limit_root(capacity_cores)
        pid = os.getpid()
        for inst in topology.all_instances():
            key = InstanceKey(topology.spec.app, inst.spec.name, inst.index)
            pid, tid = (
                inst.cpu_pid_tid if isinstance(inst, SliceBurnInstance) else (pid, inst.native_id)
            )
            path = self.backend.create(key, inst.worker, pid)
            try:
                self.backend.attach(path, pid, tid)
            except ThreadGone:
                self.backend.remove(path)
                continue
            self.backend.set_cap(path, caps[inst.spec.name])
            self.paths[(inst.spec.name, inst.index)] = path

    def cap_of(self, operator: str, index: int) -> float | None:
        path = self.paths.get((operator, index))
        return None if path is None else self.backend.read_cap(path)

    def remove(self) -> None:
        """Move any thread still inside back to the mount's root cgroup, remove the tree."""
        release_and_remove(self.backend)


def hierarchy_root(path: Path) -> Path:
    """The top cgroup of the v1 hierarchy that ``path`` lies in."""
    path = path.resolve()
    while (path.parent / "cgroup.procs").exists() and path.parent != path:
        path = path.parent
    return path


def release_and_remove(backend: CgroupV1) -> None:
    """Empty ``backend``'s tree (threads back to the hierarchy's top) and remove it."""
    if not backend.root.is_dir():
        return
    top_tasks = hierarchy_root(backend.mount) / "tasks"
    for dirpath, _dirs, _files in os.walk(backend.root):
        for tid in backend.tids(Path(dirpath)):
            try:
                fd = os.open(top_tasks, os.O_WRONLY)
                try:
                    os.write(fd, f"{tid}\n".encode())
                finally:
                    os.close(fd)
            except OSError:
                pass  # the thread exited meanwhile
    backend.remove_root()


# ---------------------------------------------------------------- the run's own CPU


def _write_file(path: Path, value: str) -> None:
    # Unbuffered, so the kernel's answer to each write is seen.
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


class Reservation:
    """The CPU a benchmark run is given on a shared machine, as one cgroup of its own.

    ``<mount>/<name>`` gets a high ``cpu.shares`` so that the run receives the
    CPU it is promised even while other work runs on the machine; inside it,
    ``testbed/`` is the instance tree (the agent's or :class:`StaticCaps`'
    root, whose quota is the testbed's capacity) and ``harness/`` holds this
    process's other threads and the processes it starts (controller, agent),
    which must not be starved either. Nothing is capped outside ``testbed/``.
    """

    TESTBED = "testbed"
    HARNESS = "harness"

    def __init__(self, mount: str | Path, name: str, shares: int = 65536):
        if not 2 <= shares <= 262144:
            raise ValueError(f"shares must be in [2, 262144], got {shares!r}")
        self.mount = Path(mount)
        self.top = self.mount / name
        self.shares = shares

    @property
    def harness(self) -> Path:
        return self.top / self.HARNESS

    def backend(self, period_us: int) -> CgroupV1:
        """The cgroup backend of the instance tree (same as the agent's with this mount)."""
        return CgroupV1(self.top, self.TESTBED, period_us)

    def enter(self) -> None:
        """Create the cgroups and move this whole process into ``harness/``."""
        self.top.mkdir(exist_ok=True)
        _write_file(self.top / "cpu.shares", f"{self.shares}\n")
        self.harness.mkdir(exist_ok=True)
        _write_file(self.harness / "cgroup.procs", f"{os.getpid()}\n")

    def place(self, tids: Iterable[int], period_us: int, capacity_cores: float) -> None:
        """Limit ``testbed/`` to the capacity and put ``tids`` in it (not in an instance cgroup)."""
        backend = self.backend(period_us)
        backend.limit_root(capacity_cores)
        for tid in tids:
            try:
                _write_file(backend.root / "tasks", f"{tid}\n")
            except ProcessLookupError:
                pass  # the thread exited meanwhile

    def leave(self) -> None:
        """Move every thread back to the top cgroup and remove the whole reservation."""
        if not self.top.is_dir():
            return
        release_and_remove(CgroupV1(self.top, self.TESTBED))
        release_and_remove(CgroupV1(self.top, self.HARNESS))
        try:
            self.top.rmdir()
        except OSError:
            pass

    def leftover(self) -> list[str]:
        """Cgroup directories of this reservation still present (empty after ``leave``)."""
        if not self.top.exists():
            return []
        return sorted(str(p) for p in [self.top, *self.top.rglob("*")] if p.is_dir())
