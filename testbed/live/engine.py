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

Every root tuple is tracked Storm-style by an acker: a root is complete when
its whole tree has been processed; its complete latency is measured from
creation to that moment. Because every tuple carries an id, the engine can say
exactly how many roots were lost or processed twice, which is how tests and
benchmarks prove that caps and migrations never drop data.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import math
import os
import queue
import random
import struct
import subprocess
import sys
import threading
import time
import zlib
from array import array
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from dsched.names import check_name

log = logging.getLogger(__name__)

CHUNK = 64 * 1024
# One hashlib call over many 64 KiB chunks releases the GIL once per tuple
# instead of once per chunk: a thread that CFS throttles while it holds the
# GIL stalls every other instance thread of its process, so the less time a
# thread spends holding it, the closer a capped process comes to a JVM worker.
_CHUNKS = 64
_BUFFER = memoryview(os.urandom(CHUNK * _CHUNKS))


def calibrate_hash_seconds(samples: int = 40) -> float:
    """CPU seconds to hash one 64 KiB chunk on this machine."""
    t0 = time.thread_time()
    for _ in range(samples):
        hashlib.sha256(_BUFFER).digest()
    return max((time.thread_time() - t0) / (samples * _CHUNKS), 1e-7)


_HASH_SECONDS: float | None = None


def hash_seconds() -> float:
    global _HASH_SECONDS
    if _HASH_SECONDS is None:
        _HASH_SECONDS = calibrate_hash_seconds()
    return _HASH_SECONDS


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
# input closes, so it never outlives the engine that started it.
_CPU_WORKER_SOURCE = """
import hashlib, os, struct
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
    os.write(1, b"d")
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


def default_cpu_mode() -> str:
    """``process`` where the agent will accept another process's thread (root)."""
    return "process" if os.geteuid() == 0 else "thread"


@dataclass(frozen=True)
class Tuple:
    root: int
    tid: tuple[int, ...]  # unique path of this tuple in its root's tree
    created: float
    key: str
    value: Any


Emit = list[tuple[str, Any]]  # (key, value) pairs


@dataclass(frozen=True)
class OperatorSpec:
    name: str
    parallelism: int
    cost_ms: float
    fn: Callable[[Tuple, dict], Emit]
    upstream: tuple[str, ...] = ()
    stateful: bool = False
    # How tuples reach this operator's instances: "shuffle" or "fields" (by key).
    grouping: str = "shuffle"

    def __post_init__(self) -> None:
        check_name("operator", self.name)
        if self.parallelism < 1:
            raise ValueError(f"operator {self.name}: parallelism must be >= 1")
        if self.cost_ms < 0:
            raise ValueError(f"operator {self.name}: cost_ms must be >= 0")
        if self.grouping not in ("shuffle", "fields"):
            raise ValueError(f"operator {self.name}: grouping must be shuffle or fields")


@dataclass(frozen=True)
class TopologySpec:
    app: str
    operators: tuple[OperatorSpec, ...]
    # Makes the root tuples' (key, value) for a source, given a sequence number.
    make_root: Callable[[int, random.Random], tuple[str, Any]] = lambda n, rng: (str(n), n)

    def __post_init__(self) -> None:
        check_name("app", self.app)
        names = [o.name for o in self.operators]
        if len(set(names)) != len(names):
            raise ValueError(f"topology {self.app}: duplicate operator names")
        for o in self.operators:
            for u in o.upstream:
                if u not in names:
                    raise ValueError(f"topology {self.app}: {o.name} has unknown upstream {u!r}")

    @property
    def sources(self) -> list[OperatorSpec]:
        return [o for o in self.operators if not o.upstream]

    def children(self, name: str) -> list[OperatorSpec]:
        return [o for o in self.operators if name in o.upstream]

    def cpu_per_root_ms(self, fanout: dict[str, float]) -> float:
        """Mean CPU per root tuple given mean tuples emitted per input per operator."""
        arrivals = {o.name: 1.0 for o in self.sources}
        total = 0.0
        for o in self.operators:  # operators are listed in topological order
            a = arrivals.get(o.name, 0.0)
            total += a * o.cost_ms
            for c in self.children(o.name):
                arrivals[c.name] = arrivals.get(c.name, 0.0) + a * fanout.get(o.name, 1.0)
        return total


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


class Acker:
    """Tracks every root tuple's tree; complete when no part of it is pending."""

    def __init__(self, timeout_seconds: float):
        self.timeout_seconds = timeout_seconds
        self._lock = threading.Lock()
        self._pending: dict[int, int] = {}
        self._created: dict[int, float] = {}
        # Parts of each open tree already processed, to catch a tuple processed twice.
        self._seen: dict[int, set[tuple[int, ...]]] = {}
        self.roots = 0
        self.completed = 0
        self.failed = 0  # completed after the timeout
        self.duplicated = 0
        self.latencies = array("d")
        self.completion_times = array("d")

    def new_root(self, root: int, created: float) -> None:
        with self._lock:
            self._pending[root] = 1
            self._created[root] = created
            self._seen[root] = set()
            self.roots += 1

    def processed(self, t: Tuple, emitted: int, now: float) -> float | None:
        """Account one processed tuple; returns the root's latency if it just completed."""
        with self._lock:
            seen = self._seen.get(t.root)
            if seen is None or t.tid in seen:
                # Either the tree already completed or this part was done before.
                self.duplicated += 1
                return None
            seen.add(t.tid)
            left = self._pending[t.root]
            left += emitted - 1
            if left > 0:
                self._pending[t.root] = left
                return None
            del self._pending[t.root]
            del self._seen[t.root]
            latency = now - self._created.pop(t.root)
            self.completed += 1
            self.latencies.append(latency)
            self.completion_times.append(now)
            if latency > self.timeout_seconds:
                self.failed += 1
            return latency

    @property
    def in_flight(self) -> int:
        with self._lock:
            return len(self._pending)

    def stats(self, app: str, stopped: bool) -> TopologyStats:
        """The counts so far; roots still open count as lost once input has stopped."""
        return TopologyStats(
            app=app,
            roots=self.roots,
            completed=self.completed,
            lost=self.in_flight if stopped else 0,
            duplicated=self.duplicated,
            failed=self.failed,
            latencies=list(self.latencies),
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


class LiveTopology:
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
        self.cpu = cpu or default_cpu_mode()
        if self.cpu not in CPU_MODES:
            raise ValueError(f"cpu must be one of {', '.join(CPU_MODES)}, got {cpu!r}")
        self.group_keys = dict(group_keys or {})
        unknown = set(self.group_keys) - {o.name for o in spec.operators}
        if unknown:
            raise ValueError(f"group_keys names unknown operators {sorted(unknown)}")
        self.aborted = threading.Event()
        # Set once shutdown closes the CPU workers, whether or not every
        # instance thread has finished its queue.
        self.closing = threading.Event()
        self.spec = spec
        self.rate = rate
        self.node = node
        self.seed = seed
        self.acker = Acker(timeout_seconds)
        self.instances: dict[str, list[Instance]] = {}
        for o in spec.operators:
            kind = "stateful" if o.stateful else "stateless"
            worker = f"{spec.app}-{kind}-{node}"
            self.instances[o.name] = [Instance(self, o, i, worker) for i in range(o.parallelism)]
        self.children = {o.name: [c.name for c in spec.children(o.name)] for o in spec.operators}
        self._grouping = {o.name: o.grouping for o in spec.operators}
        self._root_ids = itertools.count()
        self._rr = {o.name: itertools.cycle(range(o.parallelism)) for o in spec.operators}
        self._stop = threading.Event()
        self._pacer = threading.Thread(target=self._pace, name=f"{spec.app}.pacer", daemon=True)
        self._reporter: threading.Thread | None = None
        self._client = None
        self._agent_socket = agent_socket
        self.started_at = 0.0
        self.injected = 0
        self._rng = random.Random(seed)

    # ------------------------------------------------------------ routing
    def all_instances(self) -> Iterable[Instance]:
        for insts in self.instances.values():
            yield from insts

    def route(self, operator: str, t: Tuple) -> None:
        insts = self.instances[operator]
        if self._grouping[operator] == "fields":
            key_of = self.group_keys.get(operator)
            key = t.key if key_of is None else key_of(t.value)
            # crc32, not hash(): the same key must land on the same instance in
            # every process, so that state can move between workers.
            idx = zlib.crc32(key.encode()) % len(insts)
        else:
            idx = next(self._rr[operator])
        inst = insts[idx]
        inst.counters.received += 1
        inst.queue.put(t)

    def _inject(self, now: float) -> None:
        for src in self.spec.sources:
            root = next(self._root_ids)
            key, value = self.spec.make_root(root, self._rng)
            self.acker.new_root(root, now)
            self.route(src.name, Tuple(root, (), now, key, value))
        self.injected += 1

    def _pace(self) -> None:
        due = 0.0
        last = time.monotonic()
        while not self._stop.is_set():
            time.sleep(0.005)
            now_m = time.monotonic()
            r = max(0.0, float(self.rate(now_m - self._t0)))
            due += r * (now_m - last)
            last = now_m
            now = time.time()
            while due >= 1.0:
                self._inject(now)
                due -= 1.0

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
        self._t0 = time.monotonic()
        self.started_at = time.time()
        self._pacer.start()

    def stop_input(self) -> None:
        """Stop injecting new roots (the tuples in flight keep going)."""
        self._stop.set()
        if self._pacer.is_alive():
            self._pacer.join()

    def drain(self, timeout: float = 60.0) -> bool:
        """Wait until every injected root has completed; False on timeout."""
        deadline = time.monotonic() + timeout
        while self.acker.in_flight and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.acker.in_flight == 0

    def stop(self, drain_timeout: float = 60.0) -> TopologyStats:
        """Stop input, wait for the tuples in flight, then stop every instance."""
        self.stop_input()
        drained = self.drain(drain_timeout)
        self._shutdown(push_counters=True)
        stats = self.stats()
        stats.drained = drained
        return stats

    def abort(self) -> int:
        """Stop input and every instance now, dropping the backlog; returns the
        roots left unfinished (counted as lost by ``stats``)."""
        self.stop_input()
        self.aborted.set()
        self._shutdown(push_counters=False)
        return self.acker.in_flight

    def _shutdown(self, push_counters: bool) -> None:
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

    def stats(self) -> TopologyStats:
        return self.acker.stats(self.spec.app, stopped=self._stop.is_set())


@dataclass
class TopologyStats:
    app: str
    roots: int
    completed: int
    lost: int
    duplicated: int
    failed: int
    latencies: list[float] = field(default_factory=list)
    drained: bool = True
