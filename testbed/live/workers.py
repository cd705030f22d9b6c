"""Worker processes of the distributed testbed: instances as threads, tuples in micro-batches.

A worker is one OS process per (application, node, kind), kind being stateful
or stateless, so that moving a stateless instance never restarts a process
that holds state (the worker layout of the `liu` placement strategy:
docs/placement.md, "Strategies"; docs/live-testbed.md, "Nodes and workers").
Each worker hosts its instances as threads running the same per-tuple work as
``engine.py`` (``burn`` plus the operator's function) and registers, with the
agent of its node, the thread that burns each instance's CPU: the instance
thread itself (``cpu="thread"``, the default), or with ``cpu="process"`` the
instance's own :class:`~testbed.live.engine.CpuWorker`, started by the
instance thread and stopped with it, so that a cap on one instance never
stalls the other threads of its worker through the GIL (docs/live-benchmark.md,
"Threads of one process under CFS caps").

A worker talks to the driver (``distributed.DistributedTopology``) over one
``multiprocessing.connection`` (a Unix socket, or TCP for nodes in network
namespaces). Both directions use a :class:`BatchingSender`, which sends what
has accumulated every ``flush_seconds`` or as soon as ``batch_size`` items
wait, so that IPC does not dominate the CPU at thousands of tuples a second.
Everything on one connection stays in order; the migration protocol relies on
that (a stop or checkpoint marker is processed after every tuple sent before it).

Messages, driver to worker (items of a batch):

- ``("t", op, index, (root, tid, created, key, value))``: a tuple for an instance;
- ``("start", op, index, state, replay)``: start an instance with ``state``,
  first re-applying ``replay`` (tuples already acknowledged since that state
  was taken) to the state only;
- ``("lat", op, index, seconds)``: a root this instance completed, for its latency counters;
- ``("ckpt", op, index)``: reply with a copy of the state once every earlier tuple is done;
- ``("stop", op, index)``: finish every earlier tuple, then stop and reply with the state;
- ``("stop", op, index, "now")``: finish the tuple in hand, then stop and reply
  with the state; the tuples still queued are dropped, and so are tuples that
  arrive for the instance afterwards. The driver, which has not seen them
  done, sends them again (a rescale hands them to the keys' new owners), so a
  long queue does not lengthen the hand-over;
- ``("exit",)``: stop everything and exit.

Worker to driver: ``("hello", worker_id, pid)`` first, then batches of
``("done", op, index, root, tid, sent, now, emitted)``,
``("started", op, index, native_tid, native_pid)`` (the thread that burns the
instance's CPU and its process), ``("checkpointed", op, index, state)``
and ``("stopped", op, index, state)``.
"""

from __future__ import annotations

import copy
import logging
import os
import pickle
import queue
import random
import signal
import sys
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Client, Connection
from typing import Any

from testbed.live.engine import (
    CpuWorker,
    InstanceCounters,
    burn,
    check_cpu_mode,
    chunks_for,
    set_hash_seconds,
)
from testbed.live.topology import OperatorSpec, Tuple

log = logging.getLogger(__name__)

#: Default micro-batching: a batch leaves after this long or at this many items.
FLUSH_SECONDS = 0.002
BATCH_SIZE = 256


class BatchingSender:
    """Sends items over a connection in batches from one thread, keeping their order.

    The first item after a quiet spell of ``flush_seconds`` leaves at once; under
    load, items wait at most ``flush_seconds`` or until ``batch_size`` are queued.

    ``put`` never blocks on I/O. A connection error stops the sender and is
    reported through ``closed``; items put afterwards are dropped (the peer is
    gone, and the driver's replay log, not this buffer, is what prevents loss).
    """

    def __init__(
        self,
        conn: Connection,
        *,
        flush_seconds: float = FLUSH_SECONDS,
        batch_size: int = BATCH_SIZE,
        name: str = "sender",
    ):
        if flush_seconds <= 0:
            raise ValueError(f"flush_seconds must be > 0, got {flush_seconds!r}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size!r}")
        self.conn = conn
        self.flush_seconds = flush_seconds
        self.batch_size = batch_size
        self._items: list[tuple] = []
        self._last_send = 0.0
        self._cond = threading.Condition()
        self._urgent = False
        self._stopping = False
        self.closed = threading.Event()
        self.batches_sent = 0
        self.items_sent = 0
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def put(self, item: tuple, urgent: bool = False) -> None:
        with self._cond:
            if self.closed.is_set():
                return
            self._items.append(item)
            # An idle link sends at once (low latency at low rates); a busy one
            # batches (few sends at high rates), like Nagle's algorithm turned around.
            idle = time.monotonic() - self._last_send > self.flush_seconds
            if urgent or idle or len(self._items) >= self.batch_size:
                self._urgent = True
                self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                if not self._urgent and not self._stopping:
                    self._cond.wait(self.flush_seconds)
                batch, self._items, self._urgent = self._items, [], False
                stopping = self._stopping
            if batch:
                self._last_send = time.monotonic()
                try:
                    self.conn.send(batch)
                except (OSError, EOFError, ValueError):
                    self.closed.set()
                    return
                self.batches_sent += 1
                self.items_sent += len(batch)
            if stopping:
                with self._cond:
                    if not self._items:
                        return

    def close(self, timeout: float = 5.0) -> None:
        """Send what is queued, then stop the thread (the connection stays open)."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self._thread.join(timeout)


@dataclass(frozen=True)
class OperatorRuntime:
    """What a worker needs to run one operator: its spec and how many children it feeds."""

    spec: OperatorSpec
    children: int


@dataclass(frozen=True)
class WorkerConfig:
    """Everything a worker process is started with (pickled to its stdin)."""

    worker_id: str
    app: str
    node: str
    stateful: bool
    address: Any
    authkey: bytes
    operators: dict[str, OperatorRuntime]
    agent_socket: str | None = None
    flush_seconds: float = FLUSH_SECONDS
    batch_size: int = BATCH_SIZE
    seed: int = 0
    counters_seconds: float = 0.5
    # Where an instance's per-tuple CPU is burnt: "thread" or "process" (CPU_MODES).
    cpu: str = "thread"
    # The CPU seconds of one hashed chunk, timed once by the driver, so that every
    # worker of a run does the same work per tuple (None: the worker times it).
    chunk_seconds: float | None = None


_STOP = object()
_CHECKPOINT = object()


class WorkerInstance:
    """One instance thread inside a worker process."""

    def __init__(self, worker: WorkerProcess, op: str, index: int, state: dict, replay: list):
        self.worker, self.op, self.index = worker, op, index
        self.runtime = worker.config.operators[op]
        self.state = state
        self.replay = replay
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        # Set by a stop "now": leave the queue to the driver.
        self.yielding = threading.Event()
        # Set while the agent knows the instance: its counters are pushed only then
        # (a CPU worker takes a moment to start before the instance registers).
        self.registered = threading.Event()
        self.counters = InstanceCounters()
        self.rng = random.Random(hash((worker.config.app, op, index, worker.config.seed)))
        self.thread = threading.Thread(
            target=self._run, name=f"{worker.config.app}.{op}.{index}", daemon=True
        )

    def _run(self) -> None:
        w, spec = self.worker, self.runtime.spec
        for raw in self.replay:
            # Already acknowledged upstream: only the state must see it again.
            spec.fn(Tuple(*raw), self.state)
        self.replay = []
        cpu_worker = CpuWorker() if w.config.cpu == "process" else None
        try:
            if cpu_worker is not None:
                cpu_worker.wait_ready()
                # A CPU worker is one single-threaded process: its TID is its PID.
                pid = tid = cpu_worker.pid
            else:
                pid, tid = os.getpid(), threading.get_native_id()
            w.register(self.op, self.index, tid, pid)
            self.registered.set()
            w.out.put(("started", self.op, self.index, tid, pid), urgent=True)
            self._serve(cpu_worker)
        finally:
            if cpu_worker is not None:
                cpu_worker.close()

    def _serve(self, cpu_worker: CpuWorker | None) -> None:
        w, spec = self.worker, self.runtime.spec
        cost = spec.cost_ms / 1000.0
        while True:
            item = self.queue.get()
            if item is _STOP or self.yielding.is_set():
                # Unregister before replying: a restart in this same process is
                # only requested after the reply, so the agent sees them in order.
                self.registered.clear()
                w.unregister(self.op, self.index)
                w.out.put(("stopped", self.op, self.index, self.state), urgent=True)
                return
            if item is _CHECKPOINT:
                w.out.put(("checkpointed", self.op, self.index, copy.deepcopy(self.state)))
                continue
            start = time.perf_counter()
            t = Tuple(*item)
            if cpu_worker is None:
                burn(cost, self.rng)
            else:
                cpu_worker.burn_chunks(chunks_for(cost, self.rng))
            out = spec.fn(t, self.state)
            sent = len(out) * self.runtime.children
            w.out.put(("done", self.op, self.index, t.root, t.tid, sent, time.time(), out))
            c = self.counters
            c.executed += 1
            # Storm's "emitted" (tuples per output stream), not "transferred"
            # (``sent``, times the number of subscribers), as the in-process
            # engine counts it: the controller multiplies it by the parent's
            # rate for each child.
            c.emitted += len(out)
            c.service_seconds += time.perf_counter() - start


class WorkerProcess:
    """The body of a worker process (also usable in-process for debugging)."""

    def __init__(self, config: WorkerConfig):
        check_cpu_mode(config.cpu)
        if config.chunk_seconds is not None:
            set_hash_seconds(config.chunk_seconds)
        self.config = config
        self.conn = Client(config.address, authkey=config.authkey)
        self.conn.send(("hello", config.worker_id, os.getpid()))
        self.out = BatchingSender(
            self.conn,
            flush_seconds=config.flush_seconds,
            batch_size=config.batch_size,
            name=f"{config.worker_id}.sender",
        )
        self.instances: dict[tuple[str, int], WorkerInstance] = {}
        self.dropped = 0  # tuples for instances stopped "now"
        self._client = None
        if config.agent_socket:
            from agent.instance_client import AgentClient

            self._client = AgentClient(config.agent_socket)
        self._stop = threading.Event()

    def register(self, op: str, index: int, tid: int, pid: int) -> None:
        if self._client is not None:
            spec = self.config.operators[op].spec
            self._client.register(
                self.config.app,
                op,
                index,
                self.config.worker_id,
                spec.stateful,
                tid=tid,
                pid=pid,
                upstream=spec.upstream,
            )

    def unregister(self, op: str, index: int) -> None:
        if self._client is not None:
            self._client.unregister(self.config.app, op, index)

    def _push_counters(self) -> None:
        if self._client is None:
            return
        for (op, index), inst in list(self.instances.items()):
            if not inst.registered.is_set():
                continue
            inst.counters.push(self._client, self.config.app, op, index, inst.queue.qsize())

    def _report(self) -> None:
        while not self._stop.wait(self.config.counters_seconds):
            self._push_counters()

    def _handle(self, item: tuple) -> bool:
        """Apply one message; False when the worker must exit."""
        kind = item[0]
        if kind == "t":
            inst = self.instances.get((item[1], item[2]))
            if inst is None:
                # Sent before the instance was stopped "now": the driver re-sends it.
                self.dropped += 1
                return True
            inst.counters.received += 1
            inst.queue.put(item[3])
        elif kind == "start":
            _, op, index, state, replay = item
            inst = WorkerInstance(self, op, index, state, replay)
            self.instances[(op, index)] = inst
            inst.thread.start()
        elif kind == "lat":
            inst = self.instances.get((item[1], item[2]))
            if inst is not None:
                inst.counters.latency_sum_seconds += item[3]
                inst.counters.latency_count += 1
        elif kind == "ckpt":
            inst = self.instances.get((item[1], item[2]))
            if inst is not None:
                inst.queue.put(_CHECKPOINT)
        elif kind == "stop":
            inst = self.instances.pop((item[1], item[2]))
            if item[3:] == ("now",):
                inst.yielding.set()
            inst.queue.put(_STOP)
        elif kind == "exit":
            return False
        else:
            raise ValueError(f"unknown message kind {kind!r}")
        return True

    def run(self) -> None:
        reporter = threading.Thread(target=self._report, name="counters", daemon=True)
        reporter.start()
        try:
            running = True
            while running:
                try:
                    batch = self.conn.recv()
                except (EOFError, OSError):
                    break  # the driver is gone: nothing left to do
                for item in batch:
                    if not self._handle(item):
                        running = False
                        break
        finally:
            self._shutdown()

    def _shutdown(self) -> None:
        self._stop.set()
        for inst in self.instances.values():
            inst.queue.put(_STOP)
        for inst in self.instances.values():
            inst.thread.join(timeout=5)
        if self._client is not None:
            self._client.close()
        self.out.close()
        self.conn.close()


def worker_main(config: WorkerConfig) -> None:
    """Body of a worker process started with its config."""
    logging.basicConfig(level=logging.WARNING)
    WorkerProcess(config).run()


if __name__ == "__main__":
    # SIGINT / SIGTERM sent to the whole process group (a terminal's Ctrl-C,
    # `timeout`, systemd) are the driver's to handle: it stops its workers in
    # order, and a worker whose driver is gone exits when its connection closes.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # The driver writes the pickled WorkerConfig to stdin; it is trusted (same user).
    worker_main(pickle.loads(sys.stdin.buffer.read()))
