"""What every live engine shares: the topology description, exact tuple accounting,
and :class:`Topology`, the interface of a running application.

Two engines implement :class:`Topology`: ``engine.LiveTopology`` (instances as
threads of this process) and ``distributed.DistributedTopology`` (instances in
worker processes on several nodes, with live moves). Both inject root tuples
at ``rate(t)`` per second from a pacer thread, route by shuffle or fields
grouping, and track every root tuple Storm-style with one :class:`Acker`: a
root is complete when its whole tree has been processed, and because every
tuple carries an id, an engine can say exactly how many roots were lost or
processed twice. Their lifecycle is the same::

    topo.start()
    ...
    stats = topo.stop(drain_timeout=60)  # stop_input(), drain(), then stop the instances

so callers (``testbed.demo``, the benchmarks, the tests) need not know which
engine runs.
"""

from __future__ import annotations

import itertools
import random
import threading
import time
import zlib
from abc import ABC, abstractmethod
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dsched.names import check_name


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
class TopologyStats:
    app: str
    roots: int
    completed: int
    lost: int
    duplicated: int
    failed: int
    latencies: list[float] = field(default_factory=list)
    drained: bool = True


def key_slot(key: str, instances: int) -> int:
    """The instance (of ``instances``) that owns ``key`` under fields grouping.

    crc32, not hash(): the same key must land on the same instance in every
    process, so that state can move between workers, and a rescale can tell
    which keys change owner.
    """
    return zlib.crc32(key.encode()) % instances


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


class Topology(ABC):
    """One application running live: input, routing, accounting and the lifecycle.

    Subclasses say how instances run (:meth:`start`, :meth:`_shutdown`) and how a
    root tuple reaches a source instance (:meth:`_deliver_root`); pacing,
    grouping, draining and stopping are here, the same for every engine.
    """

    def __init__(
        self,
        spec: TopologySpec,
        rate: Callable[[float], float],
        *,
        timeout_seconds: float = 30.0,
        seed: int = 0,
        group_keys: dict[str, Callable[[Any], str]] | None = None,
    ):
        """``rate(t)``: roots per second ``t`` seconds after start. ``group_keys``:
        fields grouping of an operator on a function of the tuple's value instead
        of its key (operator -> function)."""
        self.group_keys = dict(group_keys or {})
        unknown = set(self.group_keys) - {o.name for o in spec.operators}
        if unknown:
            raise ValueError(f"group_keys names unknown operators {sorted(unknown)}")
        self.spec, self.rate, self.seed = spec, rate, seed
        self.acker = Acker(timeout_seconds)
        self.children = {o.name: [c.name for c in spec.children(o.name)] for o in spec.operators}
        self._grouping = {o.name: o.grouping for o in spec.operators}
        self._parallelism = {o.name: o.parallelism for o in spec.operators}
        self._rr = {o.name: itertools.cycle(range(o.parallelism)) for o in spec.operators}
        self._root_ids = itertools.count()
        self._rng = random.Random(seed)
        self._stop = threading.Event()
        self._input_threads: list[threading.Thread] = []
        self.started_at = 0.0  # wall clock at start
        self._t0 = 0.0  # monotonic clock at start: rate(t) counts from here
        self.injected = 0

    # ------------------------------------------------------------ what an engine provides
    @abstractmethod
    def start(self) -> None:
        """Start every instance, then the input (:meth:`_start_input`)."""

    @abstractmethod
    def _deliver_root(self, operator: str, t: Tuple) -> None:
        """Hand the new root tuple ``t`` to an instance of the source ``operator``."""

    @abstractmethod
    def _shutdown(self) -> None:
        """Stop every instance; input has stopped and the drain ended or gave up."""

    # ------------------------------------------------------------ routing
    def _pick(self, operator: str, key: str, value: Any) -> int:
        """The index of the instance of ``operator`` that gets a tuple (key, value)."""
        if self._grouping[operator] != "fields":
            return next(self._rr[operator])
        key_of = self.group_keys.get(operator)
        if key_of is not None:
            key = key_of(value)
        return key_slot(key, self._parallelism[operator])

    def _set_parallelism(self, operator: str, count: int) -> None:
        """Route ``operator``'s tuples over ``count`` instances from now on.

        The caller keeps routing and the instances consistent (a rescale holds
        the router's lock while it switches).
        """
        self._parallelism[operator] = count
        self._rr[operator] = itertools.cycle(range(count))

    # ------------------------------------------------------------ input
    def _start_input(self, *loops: tuple[Callable[[], None], str]) -> None:
        """Start the clock, the pacer and ``loops`` ((function, name) pairs) that
        run until input stops."""
        self._t0 = time.monotonic()
        self.started_at = time.time()
        for target, name in ((self._pace, "pacer"), *loops):
            t = threading.Thread(target=target, name=f"{self.spec.app}.{name}", daemon=True)
            t.start()
            self._input_threads.append(t)

    def _inject(self, now: float) -> None:
        for src in self.spec.sources:
            root = next(self._root_ids)
            key, value = self.spec.make_root(root, self._rng)
            self.acker.new_root(root, now)
            self._deliver_root(src.name, Tuple(root, (), now, key, value))
        self.injected += 1

    def _pace(self) -> None:
        due, last = 0.0, time.monotonic()
        while not self._stop.is_set():
            time.sleep(0.005)
            now_m = time.monotonic()
            due += max(0.0, float(self.rate(now_m - self._t0))) * (now_m - last)
            last = now_m
            now = time.time()
            while due >= 1.0:
                self._inject(now)
                due -= 1.0

    # ------------------------------------------------------------ lifecycle
    def stop_input(self) -> None:
        """Stop injecting new roots (the tuples in flight keep going)."""
        self._stop.set()
        for t in self._input_threads:
            t.join(timeout=5)

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
        self._shutdown()
        stats = self.stats()
        stats.drained = drained
        return stats

    def stats(self) -> TopologyStats:
        """Roots, completions, lost (once input stopped), duplicated, latencies."""
        return self.acker.stats(self.spec.app, stopped=self._stop.is_set())
