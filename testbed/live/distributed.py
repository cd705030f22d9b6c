"""One application over several "nodes": worker processes, a central router and acker, live moves.

:class:`DistributedTopology` is a :class:`~testbed.live.topology.Topology`,
like ``engine.LiveTopology`` (``start()``, ``stop(drain_timeout) ->
TopologyStats``, ``stats()``), and adds ``migrate(plan)``. Each instance runs
as a thread in a worker process (``workers.py``): per node, one stateful and
one stateless worker, each registering its instances' TIDs with that node's
agent, so node capacity and per-instance caps are enforced by the real agents
and cgroups.

The driver (this object, in the calling process) is the router, in the way a
Heron stream manager is: every tuple an instance emits goes back to the driver
with the instance's acknowledgement, the driver acks it with the central
:class:`~testbed.live.topology.Acker` (exact lost / duplicated counts by tuple id)
and routes the children by shuffle or fields grouping. Because every tuple
passes through one place, the driver keeps, per instance, an upstream backup:

- ``unacked``: tuples sent to the instance and not yet reported done;
- for stateful instances, the last state snapshot (``checkpoint``, taken every
  ``checkpoint_seconds`` by a marker that travels in order with the tuples) and
  ``replay``, the tuples done since that snapshot.

That is what makes moves and failures exact:

- a **move** pauses delivery to the moving instances (tuples for them are held
  in order), drains them by a stop marker queued behind their in-flight
  tuples, takes the final state, starts them in the target worker (started on
  demand) with that state, re-registers their TIDs with the target node's agent
  (the source worker unregisters them first), switches routing and releases
  the held tuples;
- if the **target worker dies half-way**, the move is rolled back: the
  instance is started again in its source worker from the same state and the
  tuples sent to the target are sent again from ``unacked``;
- for an instance whose **node disappeared** (its worker process is gone), a
  plan moving it elsewhere restarts it there from its last snapshot, re-applies
  ``replay`` to the state only (those tuples were already acknowledged) and
  re-sends ``unacked``. Nothing is lost and nothing is counted twice; tuples
  for it are held meanwhile. A move *to* a node that is not in the testbed is
  refused with the reason.

An instance is never running twice: it is started in a new place only after
its old incarnation has stopped or its process has died, and messages from an
incarnation that is no longer current are ignored.

``rescale(operator, count)`` changes an operator's instance count while the
topology runs (the controller's parallelism decisions, through the endpoint
in ``actuator.py``), with the same pieces:

- a **stateless** operator gets its new instances started first and routed to
  once they run; an instance it loses leaves the routing first and is then
  drained by a stop marker, so no other instance pauses;
- a **stateful**, fields-grouped operator pauses all its instances (tuples for
  it are held in order) and stops each after the tuple in hand, taking its
  final state; the tuples still queued at it come back unprocessed (they are
  in ``unacked``), so the pause does not grow with the backlog. The states are
  split or merged by the new key -> instance map (every key goes to the
  instance that fields grouping will now send it to), the new set of
  instances starts, each with its share, the routing switches, and the
  unprocessed tuples, then the held ones, are routed under the new map. If
  the states cannot be split (a key that is not the grouping key), the old
  instances start again from their own states with their own tuples and
  nothing changes.

New instances register with their node's agent like every other instance
(their worker does it when they start); an instance that stops unregisters.
The acker's counts by tuple id are the evidence that a rescale lost and
duplicated nothing.
"""

from __future__ import annotations

import copy
import logging
import os
import pickle
import queue
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, Listener
from pathlib import Path

from controller.edges.parallelism import RescaleResult
from controller.placement.migration import MoveResult, TestbedMoveActuator
from controller.placement.model import Plan
from testbed.live.engine import check_chunk_seconds, check_cpu_mode, hash_seconds
from testbed.live.topology import Topology, TopologySpec, Tuple, key_slot
from testbed.live.workers import (
    BATCH_SIZE,
    FLUSH_SECONDS,
    BatchingSender,
    OperatorRuntime,
    WorkerConfig,
)

log = logging.getLogger(__name__)

InstanceRef = tuple[str, int]  # (operator, index)

#: Most instances ``rescale`` gives one operator unless the topology says otherwise.
MAX_INSTANCES = 16


def worker_id(app: str, node: str, stateful: bool) -> str:
    """The id of the stateful or stateless worker of ``app`` on ``node``."""
    return f"{app}-{'stateful' if stateful else 'stateless'}-{node}"


class WorkerHandle:
    """The driver's side of one worker process."""

    def __init__(self, wid: str, node: str, stateful: bool, process: subprocess.Popen):
        self.id, self.node, self.stateful, self.process = wid, node, stateful, process
        self.conn: Connection | None = None
        self.out: BatchingSender | None = None
        self.pid: int | None = None
        self.alive = False
        self.retiring = False  # asked to exit: its end is no failure
        self.receiver: threading.Thread | None = None

    def kill(self) -> None:
        """SIGKILL the process, as a crash would."""
        if self.pid is not None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@dataclass
class InstanceSlot:
    """The driver's record of one instance: where it runs and its upstream backup."""

    op: str
    index: int
    stateful: bool
    node: str
    worker: WorkerHandle | None = None
    paused: bool = False
    held: list[tuple] = field(default_factory=list)
    unacked: dict[tuple[int, tuple], tuple] = field(default_factory=dict)
    checkpoint: dict = field(default_factory=dict)
    replay: list[tuple] = field(default_factory=list)
    replies: queue.SimpleQueue = field(default_factory=queue.SimpleQueue)
    native_tid: int | None = None  # the OS thread that burns its CPU, this incarnation
    native_pid: int | None = None  # that thread's process (its worker, or its CPU worker)


def migration_result() -> MoveResult:
    """An empty result of the testbed's moves, in the controller's own type.

    ``migrate`` fills it and the move endpoint sends its ``to_dict()``; the
    controller's ``TestbedMoveActuator`` reads it back with ``MoveResult.from_dict``,
    so both ends use one definition. Reasons are keyed by instance id
    (``app/operator/index``); ``restarted`` lists instances started again from a
    vanished node or a dead worker.
    """
    return MoveResult(actuator=TestbedMoveActuator.name, executed=True)


class DistributedTopology(Topology):
    """Runs one application's topology across worker processes on several nodes."""

    def __init__(
        self,
        spec: TopologySpec,
        rate: Callable[[float], float],
        *,
        nodes: Mapping[str, str | None],
        placement: Mapping[str, str] | None = None,
        timeout_seconds: float = 30.0,
        seed: int = 0,
        flush_seconds: float = FLUSH_SECONDS,
        batch_size: int = BATCH_SIZE,
        checkpoint_seconds: float = 1.0,
        reply_timeout: float = 30.0,
        listen: tuple[str, int] | None = None,
        group_keys: Mapping[str, Callable] | None = None,
        on_worker_start: Callable[[str, int], None] | None = None,
        counters_seconds: float = 0.5,
        max_instances: int = MAX_INSTANCES,
        cpu: str = "thread",
        chunk_seconds: float | None = None,
    ):
        """``nodes`` maps node id to its agent's registration socket (None: no agent).

        ``placement`` maps instance ids (``app/operator/index``) to nodes;
        unlisted instances start on the first node. Workers reach the driver on
        a Unix socket, or on TCP at ``listen`` (host, port; port 0 picks one) when
        nodes are network namespaces. ``group_keys``: as for ``Topology`` (the
        driver routes, so the functions never leave this process).
        ``on_worker_start(node, pid)`` runs as soon as a worker process exists,
        before it starts any instance (e.g. to put it into its node's cgroup).
        ``counters_seconds``: how often each worker pushes its instances' counters
        to its agent. ``max_instances``: the most instances ``rescale`` gives
        one operator. ``cpu``: where an instance's per-tuple CPU is burnt, in its
        thread of the worker (``"thread"``) or in a process of its own started by
        that thread (``"process"``); the thread or process doing it is the one
        registered with the agent and capped. ``chunk_seconds``: the CPU seconds
        of one hashed chunk, handed to every worker so that all of them do the same
        work per tuple (default: this process's figure, timed once on first use).
        """
        check_cpu_mode(cpu)
        self.chunk_seconds = None if chunk_seconds is None else check_chunk_seconds(chunk_seconds)
        if not nodes:
            raise ValueError("nodes must name at least one node")
        if checkpoint_seconds <= 0:
            raise ValueError(f"checkpoint_seconds must be > 0, got {checkpoint_seconds!r}")
        if not counters_seconds > 0:
            raise ValueError(f"counters_seconds must be > 0, got {counters_seconds!r}")
        if isinstance(max_instances, bool) or not isinstance(max_instances, int):
            raise ValueError(f"max_instances must be an integer, got {max_instances!r}")
        if max_instances < max([1, *(o.parallelism for o in spec.operators)]):
            raise ValueError(
                f"max_instances must be >= every operator's parallelism, got {max_instances}"
            )
        super().__init__(
            spec,
            rate,
            timeout_seconds=timeout_seconds,
            seed=seed,
            group_keys=dict(group_keys or {}),
        )
        self.nodes: dict[str, str | None] = dict(nodes)
        self.flush_seconds, self.batch_size = flush_seconds, batch_size
        self.checkpoint_seconds = checkpoint_seconds
        self.reply_timeout = reply_timeout
        self.listen = listen
        self._runtimes = {
            o.name: OperatorRuntime(o, len(self.children[o.name])) for o in spec.operators
        }
        placement = dict(placement or {})
        first = next(iter(self.nodes))
        self.slots: dict[InstanceRef, InstanceSlot] = {}
        for o in spec.operators:
            for i in range(o.parallelism):
                iid = self.instance_id(o.name, i)
                node = placement.pop(iid, first)
                if node not in self.nodes:
                    raise ValueError(f"placement of {iid} names unknown node {node!r}")
                self.slots[(o.name, i)] = InstanceSlot(o.name, i, o.stateful, node)
        if placement:
            raise ValueError(f"placement names unknown instances: {sorted(placement)}")
        self.workers: dict[str, WorkerHandle] = {}
        self.traffic: dict[tuple[str, str], int] = {}
        self.stray_acks = 0  # acks from an incarnation that is no longer current
        # (monotonic time, instance id, from node, to node) of every move carried out.
        self.moves_done: list[tuple[float, str, str, str]] = []
        self._lock = threading.RLock()
        self._migrating = threading.Lock()
        self._tmp = tempfile.TemporaryDirectory(prefix="dsched-dist-")
        self._authkey = secrets.token_bytes(16)
        self._listener: Listener | None = None
        self._acceptor: threading.Thread | None = None
        self._arrivals: dict[str, Connection] = {}
        self._arrived = threading.Condition()
        self._aborted = False
        self.on_worker_start = on_worker_start
        self.counters_seconds = counters_seconds
        self.cpu = cpu
        self.max_instances = max_instances
        self._specs = {o.name: o for o in spec.operators}
        # (monotonic time, operator, instances before, after) of every rescale carried out.
        self.rescales_done: list[tuple[float, str, int, int]] = []

    # ------------------------------------------------------------ names
    def instance_id(self, op: str, index: int) -> str:
        return f"{self.spec.app}/{op}/{index}"

    def placement(self) -> dict[str, tuple[str, str]]:
        """Instance id -> (worker id, node) for every instance (the node it last ran on)."""
        with self._lock:
            return {
                self.instance_id(*ref): (worker_id(self.spec.app, s.node, s.stateful), s.node)
                for ref, s in self.slots.items()
            }

    def current(self) -> dict[str, tuple[str, bool]]:
        """Instance id -> (worker id, stateful): the ``current`` of ``plan_placement``."""
        with self._lock:
            return {
                self.instance_id(*ref): (worker_id(self.spec.app, s.node, s.stateful), s.stateful)
                for ref, s in self.slots.items()
            }

    def active(self) -> dict[InstanceRef, tuple[str, str, int, int | None]]:
        """(operator, index) -> (worker id, node, PID and TID of the thread that burns
        the instance's CPU) of every instance whose worker is alive (one being moved
        counts where it still runs)."""
        with self._lock:
            return {
                ref: (s.worker.id, s.worker.node, s.native_pid or s.worker.pid, s.native_tid)
                for ref, s in self.slots.items()
                if s.worker is not None and s.worker.alive
            }

    def homeless(self) -> list[str]:
        """Instances whose worker died and that no plan has placed again yet."""
        with self._lock:
            return [
                self.instance_id(*ref)
                for ref, s in self.slots.items()
                if s.worker is None or not s.worker.alive
            ]

    def final_states(self) -> dict[str, dict]:
        """State of every stateful instance: its last snapshot, final after ``stop()``."""
        with self._lock:
            return {
                self.instance_id(*ref): copy.deepcopy(s.checkpoint)
                for ref, s in self.slots.items()
                if s.stateful
            }

    def traffic_rates(self) -> dict[tuple[str, str], float]:
        """Measured tuples per second between instances since start."""
        seconds = max(1e-9, time.monotonic() - self._t0) if self._t0 else 1.0
        with self._lock:
            return {k: n / seconds for k, n in self.traffic.items()}

    # ------------------------------------------------------------ workers
    def _accept_loop(self) -> None:
        while True:
            try:
                conn = self._listener.accept()
                hello = conn.recv()
            except (OSError, EOFError):
                if self._listener is None:
                    return
                continue
            except Exception as exc:  # noqa: BLE001 - a bad peer must not stop the acceptor
                if self._listener is None:
                    return
                log.warning("refused a worker connection: %s", exc)
                continue
            if not (isinstance(hello, tuple) and len(hello) == 3 and hello[0] == "hello"):
                conn.close()
                continue
            with self._arrived:
                self._arrivals[hello[1]] = conn
                self._arrived.notify_all()

    def _worker(self, node: str, stateful: bool) -> WorkerHandle:
        """The live worker of that kind on ``node``, started if needed."""
        wid = worker_id(self.spec.app, node, stateful)
        handle = self.workers.get(wid)
        if handle is not None and handle.alive:
            return handle
        if node not in self.nodes:
            raise RuntimeError(f"node {node!r} is not in the testbed")
        if self._aborted or self._listener is None:
            # A plan that arrives while the topology stops must not start workers.
            raise RuntimeError("the topology is stopping")
        config = WorkerConfig(
            worker_id=wid,
            app=self.spec.app,
            node=node,
            stateful=stateful,
            address=self._listener.address,
            authkey=self._authkey,
            operators=self._runtimes,
            agent_socket=self.nodes[node],
            flush_seconds=self.flush_seconds,
            batch_size=self.batch_size,
            seed=self.seed,
            counters_seconds=self.counters_seconds,
            cpu=self.cpu,
            chunk_seconds=self.chunk_seconds or hash_seconds(),
        )
        # Pickled first: an operator that does not pickle (a closure) fails here,
        # before a worker process is started to wait for it.
        payload = pickle.dumps(config)
        # A fresh interpreter (not fork, not multiprocessing's spawn) so that the
        # worker never re-imports the caller's main module and owns no copied locks.
        process = subprocess.Popen(
            [sys.executable, "-m", "testbed.live.workers"], stdin=subprocess.PIPE
        )
        if self.on_worker_start is not None:
            try:
                self.on_worker_start(node, process.pid)
            except OSError as exc:
                log.warning("worker %s: start hook failed: %s", wid, exc)
        process.stdin.write(payload)
        process.stdin.close()
        handle = WorkerHandle(wid, node, stateful, process)
        deadline = time.monotonic() + self.reply_timeout
        with self._arrived:
            while wid not in self._arrivals:
                if process.poll() is not None or time.monotonic() > deadline:
                    process.kill()
                    process.wait()
                    raise RuntimeError(
                        f"worker {wid} did not start (exit code {process.returncode})"
                    )
                self._arrived.wait(0.05)
            handle.conn = self._arrivals.pop(wid)
        handle.pid = process.pid
        handle.out = BatchingSender(
            handle.conn,
            flush_seconds=self.flush_seconds,
            batch_size=self.batch_size,
            name=f"driver->{wid}",
        )
        handle.alive = True
        handle.receiver = threading.Thread(
            target=self._receive, args=(handle,), name=f"driver<-{wid}", daemon=True
        )
        self.workers[wid] = handle
        handle.receiver.start()
        return handle

    def _receive(self, handle: WorkerHandle) -> None:
        conn = handle.conn
        while True:
            try:
                batch = conn.recv()
            except (EOFError, OSError):
                break
            for item in batch:
                self._on_message(handle, item)
        self._on_worker_gone(handle)

    def _on_worker_gone(self, handle: WorkerHandle) -> None:
        with self._lock:
            handle.alive = False
            if handle.out is not None:
                handle.out.closed.set()
            for slot in self.slots.values():
                if slot.worker is handle:
                    # Its tuples stay in ``unacked``; new ones are held until a
                    # plan places the instance again.
                    slot.worker = None
                    slot.replies.put(("dead", handle))
        if not self._stop.is_set() and not handle.retiring:
            log.warning("worker %s is gone", handle.id)

    def _on_message(self, handle: WorkerHandle, item: tuple) -> None:
        kind, op, index = item[0], item[1], item[2]
        with self._lock:
            slot = self.slots.get((op, index))
            if slot is None or slot.worker is not handle:
                # An earlier incarnation, or an instance a rescale has removed.
                self.stray_acks += 1
                return
            if kind == "done":
                _, _, _, root, tid, sent, now, out = item
                raw = slot.unacked.pop((root, tid), None)
                if raw is None:
                    self.stray_acks += 1
                    return
                if slot.stateful:
                    slot.replay.append(raw)
                t = Tuple(*raw)
                # Ack before routing, as in engine.py: the children must already be counted.
                latency = self.acker.processed(t, sent, now)
                if latency is not None:
                    # The instance that completes a root reports its latency, as in engine.py.
                    handle.out.put(("lat", op, index, latency))
                src = self.instance_id(op, index)
                for ci, child in enumerate(self.children[op]):
                    for j, (key, value) in enumerate(out):
                        dst = self._route(child, (root, (*tid, ci, j), t.created, key, value))
                        pair = (src, self.instance_id(child, dst))
                        self.traffic[pair] = self.traffic.get(pair, 0) + 1
            elif kind == "checkpointed":
                slot.checkpoint, slot.replay = item[3], []
            elif kind == "stopped":
                slot.checkpoint, slot.replay = item[3], []
                slot.worker = None
                slot.replies.put(("stopped", handle))
            elif kind == "started":
                slot.native_tid, slot.native_pid = item[3], item[4]
                slot.replies.put(("started", handle))

    # ------------------------------------------------------------ routing
    def _route(self, op: str, raw: tuple) -> int:
        """Deliver ``raw`` to one instance of ``op``; returns the instance index."""
        idx = self._pick(op, raw[3], raw[4])
        slot = self.slots[(op, idx)]
        if slot.paused or slot.worker is None:
            slot.held.append(raw)
        else:
            slot.unacked[(raw[0], raw[1])] = raw
            slot.worker.out.put(("t", op, idx, raw))
        return idx

    def _inject(self, now: float) -> None:
        with self._lock:
            super()._inject(now)

    def _deliver_root(self, operator: str, t: Tuple) -> None:
        self._route(operator, (t.root, t.tid, t.created, t.key, t.value))

    def _checkpoint_loop(self) -> None:
        while not self._stop.wait(self.checkpoint_seconds):
            with self._lock:
                for slot in self.slots.values():
                    if slot.stateful and slot.worker is not None and not slot.paused:
                        slot.worker.out.put(("ckpt", slot.op, slot.index))

    # ------------------------------------------------------------ starting instances
    def _launch(self, slot: InstanceSlot, handle: WorkerHandle) -> None:
        """Start ``slot`` in ``handle`` from its snapshot and re-send its unacked tuples."""
        with self._lock:
            slot.worker = handle
            if not handle.alive:
                # Gone before we got here: its death notice was not meant for this slot.
                slot.worker = None
                slot.replies.put(("dead", handle))
                return
            handle.out.put(
                ("start", slot.op, slot.index, copy.deepcopy(slot.checkpoint), list(slot.replay)),
                urgent=True,
            )
            for raw in slot.unacked.values():
                handle.out.put(("t", slot.op, slot.index, raw))

    def _await(self, slot: InstanceSlot, handle: WorkerHandle, want: str) -> bool:
        """Wait for ``want`` from ``handle`` about ``slot``; False if the worker died."""
        deadline = time.monotonic() + self.reply_timeout
        while True:
            try:
                kind, sender = slot.replies.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise TimeoutError(
                    f"worker {handle.id} did not confirm {want} of "
                    f"{self.instance_id(slot.op, slot.index)} in {self.reply_timeout} s"
                ) from None
            if sender is not handle:
                continue  # a reply from an earlier incarnation
            if kind == "dead":
                return False
            if kind == want:
                return True

    def _confirm(self, slot: InstanceSlot, handle: WorkerHandle, want: str) -> bool:
        """Like ``_await``, but a worker that does not answer is killed (then: False).

        Killing it is what keeps an instance from ever running twice: it is
        started elsewhere only once this incarnation is certainly gone.
        """
        try:
            return self._await(slot, handle, want)
        except TimeoutError as exc:
            log.warning("%s; killing worker %s", exc, handle.id)
            handle.kill()
            # Once its receiver has seen the end, the slot is either stopped
            # (final state taken) or orphaned (restart from the backup): both fine.
            handle.process.wait(timeout=10)
            handle.receiver.join(timeout=10)
            return False

    def _resume(self, slot: InstanceSlot, handle: WorkerHandle) -> None:
        with self._lock:
            slot.node = handle.node
            slot.paused = False
            held, slot.held = slot.held, []
            for raw in held:
                slot.unacked[(raw[0], raw[1])] = raw
                handle.out.put(("t", slot.op, slot.index, raw))

    # ------------------------------------------------------------ lifecycle
    def start(self) -> None:
        if self.listen is None:
            address, family = str(Path(self._tmp.name) / "driver.sock"), "AF_UNIX"
        else:
            address, family = self.listen, "AF_INET"
        self._listener = Listener(address, family=family, authkey=self._authkey)
        self._acceptor = threading.Thread(
            target=self._accept_loop, name="driver.accept", daemon=True
        )
        self._acceptor.start()
        for slot in self.slots.values():
            self._launch(slot, self._worker(slot.node, slot.stateful))
        for slot in self.slots.values():
            if not self._confirm(slot, slot.worker, "started"):
                raise RuntimeError(f"worker of {self.instance_id(slot.op, slot.index)} died")
        self._start_input((self._checkpoint_loop, "checkpoints"))

    def _shutdown(self) -> None:
        """Ask every worker to exit, then close the driver's connections and socket."""
        for handle in list(self.workers.values()):
            if handle.alive:
                handle.out.put(("exit",), urgent=True)
        for handle in list(self.workers.values()):
            try:
                handle.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                handle.process.kill()
                handle.process.wait(timeout=5)
            if handle.receiver is not None:
                handle.receiver.join(timeout=5)
            if handle.conn is not None:
                handle.conn.close()
        if self._listener is not None:
            listener, self._listener = self._listener, None
            # accept() does not return when its socket is closed: wake it with a connection.
            family = socket.AF_UNIX if isinstance(listener.address, str) else socket.AF_INET
            with socket.socket(family, socket.SOCK_STREAM) as wake:
                try:
                    wake.connect(listener.address)
                except OSError:
                    pass
            self._acceptor.join(timeout=5)
            listener.close()
        self._tmp.cleanup()

    def abort(self) -> int:
        """Stop input and every worker now, dropping the backlog; returns the roots
        left unfinished (counted as lost by ``stats``). Safe to call twice."""
        self.stop_input()
        if not self._aborted:
            self._aborted = True
            self._shutdown()
        return self.acker.in_flight

    # ------------------------------------------------------------ nodes
    def add_node(self, node: str, agent_socket: str | None) -> None:
        with self._lock:
            self.nodes[node] = agent_socket

    def fail_node(self, node: str) -> None:
        """The node disappears: its worker processes are killed and it leaves the testbed."""
        with self._lock:
            self.nodes.pop(node, None)
            doomed = [h for h in self.workers.values() if h.node == node and h.alive]
        for handle in doomed:
            handle.kill()
        for handle in doomed:
            handle.process.wait(timeout=10)
            handle.receiver.join(timeout=10)

    # ------------------------------------------------------------ migration
    def migrate(
        self,
        plan: Plan,
        observer: Callable[[str, str, WorkerHandle], None] | None = None,
    ) -> MoveResult:
        """Carry out the moves of ``plan`` that concern this application.

        ``observer(phase, instance_id, worker)`` is called at "target-ready"
        (the target worker runs, the instance is not started yet) so that fault
        injection can act at the worst moment.
        """
        with self._migrating:
            return self._migrate(plan, observer)

    def _migrate(
        self, plan: Plan, observer: Callable[[str, str, WorkerHandle], None] | None
    ) -> MoveResult:
        result = migration_result()
        before = self._worker_sets()
        prefix = f"{self.spec.app}/"
        moving: list[tuple[InstanceSlot, str]] = []
        for move in plan.moves:
            if not move.instance.startswith(prefix):
                continue
            reason = self._refusal(move)
            if reason:
                result.refused[move.instance] = reason
                continue
            _, op, index = move.instance.split("/")
            moving.append((self.slots[(op, int(index))], move.to_node))
        # Start missing target workers before pausing anything: a process start
        # must not lengthen the pause, and a target that cannot start is refused.
        targets: dict[str, WorkerHandle] = {}
        for slot, to_node in list(moving):
            iid = self.instance_id(slot.op, slot.index)
            existing = self.workers.get(worker_id(self.spec.app, to_node, slot.stateful))
            try:
                targets[iid] = self._worker(to_node, slot.stateful)
            except RuntimeError as exc:
                result.refused[iid] = f"target worker could not start: {exc}"
                moving.remove((slot, to_node))
                continue
            if targets[iid] is not existing and targets[iid].id not in result.started_workers:
                result.started_workers.append(targets[iid].id)
        if not moving:
            return result
        t0 = time.monotonic()
        with self._lock:
            for slot, _ in moving:
                slot.paused = True
        # Drain: the stop marker follows every tuple already sent to the instance.
        sources: dict[str, WorkerHandle | None] = {}
        for slot, _ in moving:
            handle = slot.worker
            sources[self.instance_id(slot.op, slot.index)] = handle
            if handle is not None:
                handle.out.put(("stop", slot.op, slot.index), urgent=True)
        for slot, _ in moving:
            handle = sources[self.instance_id(slot.op, slot.index)]
            if handle is not None and not self._confirm(slot, handle, "stopped"):
                sources[self.instance_id(slot.op, slot.index)] = None  # died while draining
        for slot, _ in moving:
            iid = self.instance_id(slot.op, slot.index)
            source, target = sources[iid], targets[iid]
            if observer is not None:
                observer("target-ready", iid, target)
            self._launch(slot, target)
            if self._confirm(slot, target, "started"):
                from_node = slot.node
                self._resume(slot, target)
                if source is not None:
                    result.moved.append(iid)
                    self.moves_done.append((time.monotonic(), iid, from_node, target.node))
                else:
                    result.restarted.append(iid)
                continue
            self._roll_back(slot, f"target worker {target.id} died during the move", result)
        result.pause_seconds = time.monotonic() - t0
        # A dead target may have hosted instances that were not moving.
        result.restarted += self._recover()
        result.stopped_workers = self._stop_idle_workers()
        after = self._worker_sets()
        result.affected_workers = sorted(
            w for w in set(before) | set(after) if before.get(w) != after.get(w) and w in before
        )
        return result

    def recover(self) -> list[str]:
        """Restart, on their own node, instances whose worker died while the node stayed.

        They resume from their last snapshot with the tuples of the upstream
        backup; instances of a vanished node wait for a plan instead.
        """
        with self._migrating:
            return self._recover()

    def _recover(self) -> list[str]:
        restarted: list[str] = []
        if self._aborted:
            return restarted  # workers gone because the topology stops, not by failure
        with self._lock:
            orphans = [
                s
                for s in self.slots.values()
                if s.worker is None and not s.paused and s.node in self.nodes
            ]
            for slot in orphans:
                slot.paused = True
        for slot in orphans:
            try:
                handle = self._worker(slot.node, slot.stateful)
            except RuntimeError as exc:
                log.warning("cannot restart %s: %s", self.instance_id(slot.op, slot.index), exc)
                with self._lock:
                    slot.paused = False
                continue
            self._launch(slot, handle)
            if self._confirm(slot, handle, "started"):
                self._resume(slot, handle)
                restarted.append(self.instance_id(slot.op, slot.index))
            else:
                with self._lock:
                    slot.paused = False
        return restarted

    def _refusal(self, move) -> str | None:
        parts = move.instance.split("/")
        if len(parts) != 3 or not parts[2].isdigit() or (parts[1], int(parts[2])) not in self.slots:
            return f"unknown instance {move.instance!r}"
        slot = self.slots[(parts[1], int(parts[2]))]
        if move.to_node not in self.nodes:
            return f"target node {move.to_node!r} is not in the testbed"
        if move.from_node is not None and move.from_node != slot.node:
            return f"stale plan: instance runs on {slot.node!r}, plan says {move.from_node!r}"
        if move.to_node == slot.node and slot.worker is not None:
            return f"already on {move.to_node!r}"
        return None

    def _roll_back(self, slot: InstanceSlot, why: str, result: MoveResult) -> None:
        """Start the instance again where it was (a fresh worker if its own died)."""
        iid = self.instance_id(slot.op, slot.index)
        handle = self._start_anywhere(slot, slot.node)
        if handle is not None:
            self._resume(slot, handle)
            result.rolled_back[iid] = f"{why}; running on {handle.node!r} again"
            return
        with self._lock:
            slot.worker, slot.paused = None, False
        result.rolled_back[iid] = f"{why}; no node could take it back, tuples held"

    def _start_anywhere(self, slot: InstanceSlot, first: str) -> WorkerHandle | None:
        """Start ``slot`` (from its snapshot) in a worker on ``first``, else on any
        other node; the worker it runs in, or None when no node could take it."""
        candidates = [first] if first in self.nodes else []
        candidates += [n for n in self.nodes if n not in candidates]
        for node in candidates:
            try:
                handle = self._worker(node, slot.stateful)
            except RuntimeError:
                continue
            self._launch(slot, handle)
            if self._confirm(slot, handle, "started"):
                return handle
        return None

    def _stop_idle_workers(self) -> list[str]:
        """End worker processes left without instances (an emptied node runs nothing)."""
        with self._lock:
            busy = {id(s.worker) for s in self.slots.values() if s.worker is not None}
            idle = [h for h in self.workers.values() if h.alive and id(h) not in busy]
            for handle in idle:
                handle.retiring = True
                handle.out.put(("exit",), urgent=True)
        for handle in idle:
            try:
                handle.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                handle.kill()
                handle.process.wait(timeout=5)
            handle.receiver.join(timeout=5)
            with self._lock:
                if self.workers.get(handle.id) is handle:
                    del self.workers[handle.id]
        return sorted(h.id for h in idle)

    def _worker_sets(self) -> dict[str, frozenset[str]]:
        with self._lock:
            sets: dict[str, set[str]] = {}
            for ref, slot in self.slots.items():
                if slot.worker is not None and slot.worker.alive:
                    sets.setdefault(slot.worker.id, set()).add(self.instance_id(*ref))
            return {w: frozenset(s) for w, s in sets.items()}

    # ------------------------------------------------------------ rescaling
    def instance_counts(self) -> dict[str, int]:
        """Operator -> how many instances it runs (routing's view)."""
        with self._lock:
            return dict(self._parallelism)

    def rescale(self, operator: str, count: int, node: str | None = None) -> RescaleResult:
        """Run ``count`` instances of ``operator`` from now on, while tuples flow.

        New instances start on ``node``, or (None) each on the node that runs
        the fewest instances of this application; the highest-numbered
        instances are the ones that stop. A change that cannot be made is
        refused with the reason in the result (``done`` False), nothing
        changed. Serialized with moves.
        """
        with self._migrating:
            return self._rescale(operator, count, node)

    def _rescale_refusal(self, op: str, count: object, node: str | None) -> str | None:
        spec = self._specs.get(op)
        if spec is None:
            return f"unknown operator {op!r} (operators: {', '.join(self._specs)})"
        if isinstance(count, bool) or not isinstance(count, int):
            return f"count must be an integer, got {count!r}"
        if count < 1:
            return f"count must be >= 1, got {count}: an operator cannot run without instances"
        if count > self.max_instances:
            return (
                f"count {count} is above the testbed's limit of {self.max_instances} "
                "instances per operator"
            )
        if node is not None and node not in self.nodes:
            return f"node {node!r} is not in the testbed"
        if self._listener is None or self._aborted:
            return "the topology is not running"
        current = self._parallelism[op]
        if count != current and spec.stateful and spec.grouping != "fields":
            return (
                f"{op} is stateful with {spec.grouping} grouping: its state has no key "
                "by which to split or merge it"
            )
        with self._lock:
            homeless = [
                self.instance_id(op, i)
                for i in range(current)
                if self.slots[(op, i)].worker is None or not self.slots[(op, i)].worker.alive
            ]
        if homeless:
            return (
                f"{', '.join(homeless)} has no live worker: recover() or a plan must place it first"
            )
        return None

    def _hosts_for_new(self, n: int, node: str | None) -> list[str]:
        """Nodes for ``n`` new instances: ``node``, else the least-used nodes in turn."""
        if node is not None:
            return [node] * n
        with self._lock:
            load = dict.fromkeys(self.nodes, 0)
            for slot in self.slots.values():
                if slot.node in load:
                    load[slot.node] += 1
        hosts = []
        for _ in range(n):
            best = min(load, key=load.__getitem__)  # first of the least used
            hosts.append(best)
            load[best] += 1
        return hosts

    def _rescale(self, op: str, count: int, node: str | None) -> RescaleResult:
        before = self._parallelism.get(op, 0)
        result = RescaleResult(self.spec.app, op, before, before, done=False)
        result.reason = self._rescale_refusal(op, count, node)
        if result.reason is not None:
            return result
        if count == before:
            result.done = True
            return result
        spec = self._specs[op]
        with self._lock:
            workers_before = {w for w, h in self.workers.items() if h.alive}
        new_slots: list[InstanceSlot] = []
        # Start the workers of new instances before anything pauses (as a move
        # does): a process start must not lengthen the pause.
        for index, host in zip(
            range(before, count), self._hosts_for_new(count - before, node), strict=True
        ):
            try:
                self._worker(host, spec.stateful)
            except RuntimeError as exc:
                result.reason = f"no worker for a new instance on {host!r}: {exc}"
                result.stopped_workers = self._stop_idle_workers()
                return result
            new_slots.append(InstanceSlot(op, index, spec.stateful, host, paused=True))
        with self._lock:
            for slot in new_slots:
                self.slots[(op, slot.index)] = slot
        if spec.stateful:
            self._rescale_stateful(op, count, new_slots, result)
        else:
            self._rescale_stateless(op, count, new_slots, result)
        if result.done:
            self.rescales_done.append((time.monotonic(), op, before, count))
        # A worker that died on the way may have hosted instances of other operators.
        result.notes += [f"{iid} restarted: its worker died" for iid in self._recover()]
        with self._lock:
            result.started_workers = sorted(
                w for w, h in self.workers.items() if h.alive and w not in workers_before
            )
        result.stopped_workers = self._stop_idle_workers()
        result.after = self._parallelism[op]
        return result

    def _rescale_stateless(
        self, op: str, count: int, new_slots: list[InstanceSlot], result: RescaleResult
    ) -> None:
        before = self._parallelism[op]
        if count > before:
            # Routed to only once they run: the others go on meanwhile.
            failed = [s for s in new_slots if self._start_anywhere(s, s.node) is None]
            if failed:
                self._discard(new_slots)
                names = ", ".join(self.instance_id(op, s.index) for s in failed)
                result.reason = f"{names} did not start"
                return
            with self._lock:
                for slot in new_slots:
                    slot.paused = False
                    if slot.worker is not None:
                        slot.node = slot.worker.node
                self._set_parallelism(op, count)
            result.started = [self.instance_id(op, s.index) for s in new_slots]
            result.done = True
            return
        leaving = [self.slots[(op, i)] for i in range(count, before)]
        with self._lock:
            # Out of the routing first: what reaches them from now on is only
            # what was sent before, which they finish before they stop.
            self._set_parallelism(op, count)
            for slot in leaving:
                slot.paused = True
            handles = [(slot, slot.worker) for slot in leaving]
        self._drain(handles)
        with self._lock:
            for slot in leaving:
                del self.slots[(op, slot.index)]
            for slot in leaving:
                for raw in [*slot.unacked.values(), *slot.held]:
                    self._route(op, raw)
            self._forget_traffic(leaving)
        result.stopped = [self.instance_id(op, s.index) for s in leaving]
        result.done = True

    def _rescale_stateful(
        self, op: str, count: int, new_slots: list[InstanceSlot], result: RescaleResult
    ) -> None:
        before = self._parallelism[op]
        old = [self.slots[(op, i)] for i in range(before)]
        t0 = time.monotonic()
        with self._lock:
            for slot in old:
                slot.paused = True
            sources = [(slot, slot.worker) for slot in old]
        # The queued tuples come back (unacked) and go to their keys' new owners:
        # the pause does not grow with the backlog.
        self._drain(sources, now=True)
        fn = self._specs[op].fn
        with self._lock:
            finals = []
            for slot in old:
                # What the instance handed over; after a worker died, its last
                # snapshot with the tuples acknowledged since (as a restart would).
                state = copy.deepcopy(slot.checkpoint)
                for raw in slot.replay:
                    fn(Tuple(*raw), state)
                finals.append(state)
        split = self._split_states(op, finals, count)
        if isinstance(split, str):
            self._restart_unchanged(old, new_slots)
            result.reason = f"{split}; the old instances run on unchanged"
            result.pause_seconds = time.monotonic() - t0
            return
        shares, result.moved_keys = split
        with self._lock:
            # Tuples the old instances did not finish: re-sent to the keys' new owners.
            backlog = {slot.index: list(slot.unacked.values()) for slot in old}
            for slot in old:
                slot.unacked.clear()
            keep = [s for s in old if s.index < count] + new_slots
            leaving = [s for s in old if s.index >= count]
            for slot in keep:
                slot.checkpoint, slot.replay = shares[slot.index], []
        for slot in keep:
            if self._start_anywhere(slot, slot.node) is None:
                result.notes.append(
                    f"{self.instance_id(op, slot.index)} could start on no node; "
                    "its tuples are held until a plan places it"
                )
        with self._lock:
            self._set_parallelism(op, count)
            for slot in leaving:
                del self.slots[(op, slot.index)]
            for slot in keep:
                slot.paused = False
                if slot.worker is not None:
                    slot.node = slot.worker.node
            # Per old owner: its unfinished tuples, then the ones held during the
            # pause. Old owners' keys are disjoint, so every key keeps its order.
            for slot in old:
                held, slot.held = slot.held, []
                for raw in [*backlog[slot.index], *held]:
                    self._route(op, raw)
            self._forget_traffic(leaving)
        result.pause_seconds = time.monotonic() - t0
        result.started = [self.instance_id(op, s.index) for s in new_slots]
        result.stopped = [self.instance_id(op, s.index) for s in leaving]
        result.done = True

    def _drain(
        self, stopping: list[tuple[InstanceSlot, WorkerHandle | None]], *, now: bool = False
    ) -> None:
        """Stop each instance and wait for it: behind every tuple already sent to
        it, or (``now``) after the tuple in hand, its queue left in ``unacked``.

        One whose worker dies meanwhile keeps its snapshot, ``replay`` and
        ``unacked``: the caller rebuilds its state and re-sends its tuples.
        """
        marker = ("now",) if now else ()
        for slot, handle in stopping:
            if handle is not None:
                handle.out.put(("stop", slot.op, slot.index, *marker), urgent=True)
        for slot, handle in stopping:
            if handle is not None:
                self._confirm(slot, handle, "stopped")

    def _split_states(
        self, op: str, finals: list[dict], count: int
    ) -> tuple[list[dict], int] | str:
        """The states of ``count`` instances made from the old instances' ``finals``,
        and how many keys changed owner; or why the states cannot be split."""
        shares: list[dict] = [{} for _ in range(count)]
        moved = 0
        for index, state in enumerate(finals):
            iid = self.instance_id(op, index)
            if not isinstance(state, dict):
                return f"state of {iid} is a {type(state).__name__}, not a dict of keys"
            for key, value in state.items():
                # Only a state keyed by the grouping key can follow the routing.
                if not isinstance(key, str) or key_slot(key, len(finals)) != index:
                    return (
                        f"state of {iid} holds key {key!r}, which fields grouping does not "
                        "send to it: its state is not keyed by the grouping key"
                    )
                owner = key_slot(key, count)
                shares[owner][key] = value
                moved += owner != index
        return shares, moved

    def _restart_unchanged(self, old: list[InstanceSlot], new_slots: list[InstanceSlot]) -> None:
        """Undo a stateful rescale before its switch: old instances from their own state."""
        self._discard(new_slots)
        for slot in old:
            handle = self._start_anywhere(slot, slot.node)
            if handle is not None:
                self._resume(slot, handle)
            else:
                with self._lock:
                    slot.worker, slot.paused = None, False

    def _discard(self, new_slots: list[InstanceSlot]) -> None:
        """Stop and forget new instances that were never routed to."""
        for slot in new_slots:
            handle = slot.worker
            if handle is not None and handle.alive:
                handle.out.put(("stop", slot.op, slot.index), urgent=True)
                self._confirm(slot, handle, "stopped")
        with self._lock:
            for slot in new_slots:
                self.slots.pop((slot.op, slot.index), None)

    def _forget_traffic(self, gone: list[InstanceSlot]) -> None:
        """Drop the traffic of instances that no longer exist (placement plans read it)."""
        ids = {self.instance_id(s.op, s.index) for s in gone}
        for pair in [p for p in self.traffic if p[0] in ids or p[1] in ids]:
            del self.traffic[pair]
