"""A small real stream engine: one OS thread per operator instance, real CPU work.

Each instance thread takes tuples from its queue, burns the operator's CPU
cost with hashlib on 64 KiB chunks, applies the operator's function and routes
what it emits downstream by shuffle or fields grouping.

Where the CPU is burnt matters under caps. Threads of one Python process share
the GIL, and a thread that CFS throttles while it holds the GIL stalls every
other thread of its process until its next period: capping engine threads
slows the instances that are not throttled too (measured in
docs/live-benchmark.md: mean latency 13 ms uncapped, 400 ms capped, where a
JVM worker would show no such coupling). So by default (``cpu="process"``)
each instance burns its CPU in a :class:`CpuWorker`, a single-threaded
process whose thread is the one registered with the agent and capped, while
the instance thread keeps queueing, routing, acking and state. ``cpu="thread"``
burns in the instance thread itself (no root needed to register it).

Input, routing by grouping, the acker (exact lost / duplicated counts by tuple
id, complete latency from creation to the end of a root's tree) and
stop / drain are :class:`~testbed.live.topology.Topology`'s, shared with
``distributed.DistributedTopology``; the topology types are defined there and
re-exported here.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import queue
import random
import statistics
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from testbed.live.topology import (
    Acker,
    Emit,
    OperatorSpec,
    Topology,
    TopologySpec,
    TopologyStats,
    Tuple,
)

__all__ = [
    "CPU_MODES",
    "check_cpu_mode",
    "Acker",
    "CpuWorker",
    "Emit",
    "Instance",
    "InstanceCounters",
    "LiveTopology",
    "OperatorSpec",
    "TopologySpec",
    "TopologyStats",
    "Tuple",
    "burn",
    "burn_chunks",
    "calibrate_hash_seconds",
    "check_chunk_seconds",
    "chunks_for",
    "default_cpu_mode",
    "hash_seconds",
    "set_hash_seconds",
]

log = logging.getLogger(__name__)

CHUNK = 64 * 1024
# One hashlib call over many 64 KiB chunks releases the GIL once per tuple
# instead of once per chunk: a thread that CFS throttles while it holds the
# GIL stalls every other instance thread of its process, so the less time a
# thread spends holding it, the closer a capped process comes to a JVM worker.
_CHUNKS = 64
_BUFFER = memoryview(os.urandom(CHUNK * _CHUNKS))


def calibrate_hash_seconds(samples: int = 40, rounds: int = 1) -> float:
    """CPU seconds to hash one 64 KiB chunk on this machine: the median of
    ``rounds`` timings of ``samples`` calls each.

    One timing of 40 calls has varied by a fifth from one process to the next on
    a virtual machine, so a benchmark times once, over several rounds, and hands
    the figure to every process it starts (:func:`set_hash_seconds`)."""
    if samples < 1 or rounds < 1:
        raise ValueError(f"samples and rounds must be >= 1, got {samples!r} and {rounds!r}")
    timings = []
    for _ in range(rounds):
        t0 = time.thread_time()
        for _ in range(samples):
            hashlib.sha256(_BUFFER).digest()
        timings.append(max((time.thread_time() - t0) / (samples * _CHUNKS), 1e-7))
    return statistics.median(timings)


_HASH_SECONDS: float | None = None


def hash_seconds() -> float:
    """The CPU seconds of one chunk in this process: set, or timed on first use."""
    global _HASH_SECONDS
    if _HASH_SECONDS is None:
        _HASH_SECONDS = calibrate_hash_seconds()
    return _HASH_SECONDS


def check_chunk_seconds(seconds: float, name: str = "chunk_seconds") -> float:
    """``seconds`` as a float, if it is a finite number > 0; else a ValueError
    naming it ``name``."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        raise ValueError(f"{name} must be a number, got {seconds!r}")
    if not (math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"{name} must be a finite number > 0, got {seconds!r}")
    return float(seconds)


def set_hash_seconds(seconds: float) -> None:
    """Use ``seconds`` as the CPU seconds of one chunk in this process instead of
    timing it: processes started at different moments then do the same number of
    chunks for the same tuple, whatever the machine was doing when each started."""
    global _HASH_SECONDS
    _HASH_SECONDS = check_chunk_seconds(seconds)


def chunks_for(cpu_seconds: float, rng: random.Random) -> int:
    """How many 64 KiB chunks cost ``cpu_seconds``; randomized rounding keeps the
    mean exact for costs of a few chunks."""
    n = cpu_seconds / hash_seconds()
    whole = int(n)
    return whole + 1 if rng.random() < n - whole else whole


def burn_chunks(chunks: int) -> None:
    while chunks > 0:
        k = min(chunks, _CHUNKS)
        hashlib.sha256(_BUFFER[: k * CHUNK]).digest()
        chunks -= k


def burn(cpu_seconds: float, rng: random.Random) -> None:
    """Spend about ``cpu_seconds`` of CPU hashing 64 KiB chunks, GIL released."""
    burn_chunks(chunks_for(cpu_seconds, rng))


# The CPU-work process of one instance: reads a chunk count (4 bytes, little
# endian), hashes that many 64 KiB chunks, answers one byte. It exits when its
# input closes, so it never outlives the engine that started it; SIGINT and
# SIGTERM sent to the whole process group (a terminal's Ctrl-C, `timeout`,
# systemd) are left to the engine, which stops it in order. An engine that
# exits during a burn closes the answer pipe: the worker then exits quietly.
_CPU_WORKER_SOURCE = """
import hashlib, os, signal, struct
signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
chunk, per_call = 64 * 1024, 64
buf = memoryview(bytes(chunk * per_call))
os.write(1, b"r")
while True:
    head = os.read(0, 4)
    if len(head) < 4:
        break
    n = struct.unpack("<I", head)[0]
    while n > 0:
        k = min(n, per_call)
        hashlib.sha256(buf[: k * chunk]).digest()
        n -= k
    try:
        os.write(1, b"d")
    except BrokenPipeError:
        break
"""

CPU_MODES = ("process", "thread")


class CpuWorker:
    """A single-threaded process doing one instance's per-tuple CPU work."""

    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", _CPU_WORKER_SOURCE],
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

    def burn_chunks(self, chunks: int) -> None:
        if chunks <= 0:
            return
        os.write(self._in, struct.pack("<I", min(chunks, 0xFFFFFFFF)))
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


def check_cpu_mode(cpu: str) -> str:
    """``cpu`` itself, if it is one of :data:`CPU_MODES`; else a ValueError naming them."""
    if cpu not in CPU_MODES:
        raise ValueError(f"cpu must be one of {', '.join(CPU_MODES)}, got {cpu!r}")
    return cpu


def default_cpu_mode() -> str:
    """``process`` where the agent will accept another process's thread (root)."""
    return "process" if os.geteuid() == 0 else "thread"


@dataclass
class InstanceCounters:
    received: int = 0
    executed: int = 0
    emitted: int = 0
    latency_sum_seconds: float = 0.0
    latency_count: int = 0
    service_seconds: float = 0.0

    def push(self, client, app: str, operator: str, index: int, queue_length: int) -> None:
        """Send these counters to the agent (``AgentClient.update``)."""
        client.update(
            app,
            operator,
            index,
            received=self.received,
            executed=self.executed,
            emitted=self.emitted,
            queue_length=queue_length,
            latency_sum_seconds=self.latency_sum_seconds,
            latency_count=self.latency_count,
            service_seconds=self.service_seconds,
        )


class Instance:
    """One operator instance: a thread, a queue, counters, and (if stateful) state."""

    def __init__(self, engine: LiveTopology, spec: OperatorSpec, index: int, worker: str):
        self.engine, self.spec, self.index, self.worker = engine, spec, index, worker
        self.queue: queue.SimpleQueue[Tuple | None] = queue.SimpleQueue()
        self.counters = InstanceCounters()
        self.state: dict = {}
        self.native_id: int | None = None
        self.cpu_worker: CpuWorker | None = None
        self.started = threading.Event()
        self.rng = random.Random(hash((engine.spec.app, spec.name, index, engine.seed)))
        self.thread = threading.Thread(
            target=self._run, name=f"{engine.spec.app}.{spec.name}.{index}", daemon=True
        )

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
        burn_chunks_here = self.cpu_worker.burn_chunks if self.cpu_worker else burn_chunks
        while True:
            t = self.queue.get()
            if t is None or eng.aborted.is_set():
                return
            start = time.perf_counter()
            try:
                burn_chunks_here(chunks_for(cost, self.rng))
            except (OSError, RuntimeError):
                # Its CPU worker was closed under it: an abort, or a stop that
                # gave up waiting for this instance's backlog.
                if eng.aborted.is_set() or eng.closing.is_set():
                    return
                raise
            out = self.spec.fn(t, self.state)
            sent = len(out) * len(children)
            # Ack before routing: a child processed at once must find its
            # parent's emissions already counted, or the tree would complete early.
            latency = eng.acker.processed(t, sent, time.time())
            for ci, child in enumerate(children):
                for j, (key, value) in enumerate(out):
                    eng.route(child, Tuple(t.root, (*t.tid, ci, j), t.created, key, value))
            c = self.counters
            c.executed += 1
            # Storm's "emitted" (tuples per output stream), not "transferred"
            # (times the number of subscribers): the controller multiplies it by
            # the parent's rate for each child.
            c.emitted += len(out)
            c.service_seconds += time.perf_counter() - start
            if latency is not None:
                c.latency_sum_seconds += latency
                c.latency_count += 1


class LiveTopology(Topology):
    """Runs one application's topology as threads in this process."""

    def __init__(
        self,
        spec: TopologySpec,
        rate: Callable[[float], float],
        *,
        node: str = "local",
        agent_socket: str | None = None,
        timeout_seconds: float = 30.0,
        seed: int = 0,
        cpu: str | None = None,
        group_keys: dict[str, Callable[[Any], str]] | None = None,
        report_seconds: float = 0.5,
    ):
        """``cpu``: where instances burn their CPU (``process`` or ``thread``; default
        :func:`default_cpu_mode`). ``group_keys``: fields grouping of an operator on
        a function of the tuple's value instead of its key (operator -> function).
        ``report_seconds``: how often counters go to the agent; keep it well below
        the agent's slot, or a slot's counts depend on when pushes land in it."""
        if not (math.isfinite(report_seconds) and report_seconds > 0):
            raise ValueError(f"report_seconds must be a positive number, got {report_seconds!r}")
        self.report_seconds = report_seconds
        self.cpu = check_cpu_mode(cpu or default_cpu_mode())
        super().__init__(
            spec, rate, timeout_seconds=timeout_seconds, seed=seed, group_keys=group_keys
        )
        self.aborted = threading.Event()
        # Set once shutdown closes the CPU workers, whether or not every
        # instance thread has finished its queue.
        self.closing = threading.Event()
        self.node = node
        self.instances: dict[str, list[Instance]] = {}
        for o in spec.operators:
            kind = "stateful" if o.stateful else "stateless"
            worker = f"{spec.app}-{kind}-{node}"
            self.instances[o.name] = [Instance(self, o, i, worker) for i in range(o.parallelism)]
        self._reporter: threading.Thread | None = None
        self._client = None
        self._agent_socket = agent_socket

    # ------------------------------------------------------------ routing
    def all_instances(self) -> Iterable[Instance]:
        for insts in self.instances.values():
            yield from insts

    def route(self, operator: str, t: Tuple) -> None:
        inst = self.instances[operator][self._pick(operator, t.key, t.value)]
        inst.counters.received += 1
        inst.queue.put(t)

    def _deliver_root(self, operator: str, t: Tuple) -> None:
        self.route(operator, t)

    # ------------------------------------------------------------ agent link
    def _register_all(self) -> None:
        from agent.instance_client import AgentClient

        self._client = AgentClient(self._agent_socket)
        for inst in self.all_instances():
            pid, tid = inst.cpu_pid_tid
            self._client.register(
                self.spec.app,
                inst.spec.name,
                inst.index,
                inst.worker,
                inst.spec.stateful,
                tid=tid,
                pid=pid,
                upstream=inst.spec.upstream,
            )

    def _report(self) -> None:
        while not self._stop.wait(self.report_seconds):
            self.push_counters()

    def push_counters(self) -> None:
        if self._client is None:
            return
        for inst in self.all_instances():
            inst.counters.push(
                self._client, self.spec.app, inst.spec.name, inst.index, inst.queue.qsize()
            )

    # ------------------------------------------------------------ lifecycle
    def start(self) -> None:
        hash_seconds()  # calibrate before the clock starts
        if self.cpu == "process":
            for inst in self.all_instances():
                inst.cpu_worker = CpuWorker()
            for inst in self.all_instances():
                inst.cpu_worker.wait_ready()
        for inst in self.all_instances():
            inst.thread.start()
        for inst in self.all_instances():
            inst.started.wait()
        if self._agent_socket:
            self._register_all()
            self._reporter = threading.Thread(
                target=self._report, name=f"{self.spec.app}.reporter", daemon=True
            )
            self._reporter.start()
        self._start_input()

    def abort(self) -> int:
        """Stop input and every instance now, dropping the backlog; returns the
        roots left unfinished (counted as lost by ``stats``)."""
        self.stop_input()
        self.aborted.set()
        self._shutdown(push_counters=False)
        return self.acker.in_flight

    def _shutdown(self, push_counters: bool = True) -> None:
        for inst in self.all_instances():
            inst.queue.put(None)
        for inst in self.all_instances():
            if inst.cpu_worker is not None:
                # Closing its pipe ends a CPU worker; an aborted instance thread
                # blocked on it wakes with an error and exits.
                if self.aborted.is_set():
                    inst.cpu_worker.close()
        for inst in self.all_instances():
            if inst.thread.is_alive():
                inst.thread.join(timeout=5)
        stuck = [i for i in self.all_instances() if i.thread.is_alive()]
        if stuck:
            log.warning(
                "%d instance threads still busy after 5 s; dropping their queues: %s",
                len(stuck),
                ", ".join(f"{i.spec.name}/{i.index}" for i in stuck),
            )
        self.closing.set()
        for inst in self.all_instances():
            if inst.cpu_worker is not None:
                inst.cpu_worker.close()
        if self._reporter is not None:
            self._reporter.join(timeout=2)
        if self._client is not None:
            if push_counters:
                self.push_counters()
            for inst in self.all_instances():
                self._client.unregister(self.spec.app, inst.spec.name, inst.index)
            self._client.close()
            self._client = None
