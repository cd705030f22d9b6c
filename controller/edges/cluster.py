"""In-memory cluster state: what the agents said, checked and differentiated.

Reports arrive with cumulative counters. Ingest turns consecutive reports of an
instance into :class:`InstanceSlot` deltas, keeps the last ``depth`` of them per
instance, and refuses what cannot be trusted. Every refusal has a reason that is
counted (``rejected``) and logged once per (node, reason) burst; the loop never
stops because one agent sent garbage.

Samples of engines that are not instrumented (``engine`` set, e.g. "flink")
carry CPU, threads, stateful flag and upstream but no counters: ingest takes
those from the engine edge's latest reading (controller/edges/engines.py).
When the reading has none for the instance, or has not advanced since the one
its previous slot used, the instance is *unmeasured* this slot: it gets no
slot (zeros would read as an idle instance), it is listed in ``unmeasured``
with the reason, and the epoch holds its cap.

An instance belongs to one node at a time. A node *claims* the instances of
its latest report; another node's sample of a claimed instance is refused
(``owned_by_other_node``) while the owner is connected and its claiming report
is younger than the forget window. A migration therefore passes as soon as
the old node reports without the instance (its next slot) or disconnects; the
new node's samples in between are refused and counted, not merged into the
instance's series.
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from functools import partial
from typing import NamedTuple

from controller.edges.engines import EngineCounters
from controller.model import AppTopology, InstanceHistory, InstanceKey, InstanceSlot, Unmeasured
from dsched.engines import InstanceCounters
from dsched.names import InvalidName, check_name
from dsched_pb import dsched_pb2 as pb

log = logging.getLogger(__name__)

# A report stamped further ahead than this is from a broken clock, not the future.
MAX_CLOCK_SKEW_SECONDS = 30.0
# Valid names remembered by ingest (then forgotten all at once and learnt again).
MAX_REMEMBERED_NAMES = 1_000_000


class HelloRefused(ValueError):
    """An agent's Hello that cannot be accepted; ``reason`` is the metric label."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


@dataclass
class AgentInfo:
    node_id: str
    cpu_capacity_cores: float
    cgroup_mode: int
    counters_available: tuple[str, ...]
    dry_run: bool
    connected_at: float
    slot_seconds: float = 0.0
    last_report_at: float = 0.0
    last_timestamp: float = 0.0
    last_slot: int = -1
    connected: bool = True
    node_sample: pb.NodeSample | None = None
    # The node's CPU beyond its instances over its latest reports (ObservedCluster.depth).
    other_cpu: deque[float] = field(default_factory=deque)
    caps: dict[InstanceKey, float] = field(default_factory=dict)  # as the agent reported
    # Instances of the node's latest report: the ones it owns (see the module doc).
    claims: set[InstanceKey] = field(default_factory=set)


class _Baseline(NamedTuple):
    """The previous cumulative reading of one instance."""

    timestamp: float
    arrivals: int  # the wire's received_total: tuples that arrived
    executed: int
    emitted: int
    cpu_seconds: float
    latency_sum: float
    latency_count: int
    service_seconds: float
    throttled_seconds: float | None


# Tuples made in C: a NamedTuple's own constructor is a Python function, and
# ingest makes three per sample (20,000 samples in a 1,000-node burst).
_new_key = partial(tuple.__new__, InstanceKey)
_new_baseline = partial(tuple.__new__, _Baseline)
_new_slot = partial(tuple.__new__, InstanceSlot)


@dataclass
class IngestResult:
    accepted: int = 0
    unmeasured: int = 0  # engine instances without counters this slot
    rejected: Counter = field(default_factory=Counter)
    # The report as a whole was taken (known node, sane header): it is fresh data.
    taken: bool = False


class ObservedCluster:
    """Agents, instance histories and application DAGs, fed by NodeReports."""

    def __init__(
        self,
        depth: int = 5,
        forget_after_seconds: float = 60.0,
        max_clock_skew_seconds: float = MAX_CLOCK_SKEW_SECONDS,
        engines: EngineCounters | None = None,
        max_capacity_cores: float = math.inf,
    ):
        self.max_clock_skew_seconds = max_clock_skew_seconds
        self.max_capacity_cores = max_capacity_cores
        self.engines = engines
        if depth < 1:
            raise ValueError("depth must be at least 1")
        self.depth = depth
        self.forget_after_seconds = forget_after_seconds
        self.agents: dict[str, AgentInfo] = {}
        self.histories: dict[InstanceKey, InstanceHistory] = {}
        self.topologies: dict[str, AppTopology] = {}
        self.rejected: Counter = Counter()
        self._baselines: dict[InstanceKey, _Baseline] = {}
        self._logged: set[tuple[str, str]] = set()
        #: Instances whose last report came without usable engine counters.
        self.unmeasured: dict[InstanceKey, Unmeasured] = {}
        # Per engine instance: the stamp of the reading its last counters came from.
        self._engine_stamps: dict[InstanceKey, int] = {}
        # The node an instance was last accepted from (its owner while it claims it).
        self._owners: dict[InstanceKey, str] = {}
        self._good_names: set[str] = set()
        # Bumped whenever instances come, go or change node (after the change):
        # readers without the controller's lock cache what they derive from it.
        self.generation = 0
        self._per_node: tuple[int, dict[str, int]] = (-1, {})

    # ------------------------------------------------------------------ agents
    def agent_connected(self, hello: pb.Hello, now: float | None = None) -> AgentInfo:
        now = time.time() if now is None else now
        try:
            check_name("node_id", hello.node_id)
        except InvalidName as exc:
            raise HelloRefused("bad_hello", str(exc)) from None
        cap = hello.cpu_capacity_cores
        if not math.isfinite(cap) or cap <= 0:
            raise HelloRefused(
                "bad_hello", f"node {hello.node_id}: cpu_capacity_cores {cap!r} is not positive"
            )
        if cap > self.max_capacity_cores:
            raise HelloRefused(
                "capacity_too_large",
                f"node {hello.node_id}: cpu_capacity_cores {cap:g} exceeds "
                f"max_node_capacity_cores {self.max_capacity_cores:g}",
            )
        info = AgentInfo(
            node_id=hello.node_id,
            cpu_capacity_cores=cap,
            cgroup_mode=hello.cgroup_mode,
            counters_available=tuple(hello.counters_available),
            dry_run=hello.dry_run,
            connected_at=now,
            slot_seconds=hello.slot_seconds,
            other_cpu=deque(maxlen=self.depth),
        )
        old = self.agents.get(hello.node_id)
        if old is not None:
            # A reconnect continues the node's series; only the link is new.
            info.last_timestamp, info.last_slot = old.last_timestamp, old.last_slot
            info.node_sample = old.node_sample
            info.other_cpu = old.other_cpu
            info.claims = old.claims
        for c in hello.current_caps:
            info.caps[InstanceKey(c.key.app, c.key.operator, c.key.instance)] = c.cap_cores
        self.agents[hello.node_id] = info
        return info

    def agent_disconnected(self, node_id: str) -> None:
        if node_id in self.agents:
            self.agents[node_id].connected = False

    # ------------------------------------------------------------------ reports
    def _reject(self, result: IngestResult, node: str, reason: str, detail: str) -> None:
        result.rejected[reason] += 1
        self.rejected[reason] += 1
        if (node, reason) not in self._logged:
            self._logged.add((node, reason))
            log.warning("node %s: rejected (%s): %s", node, reason, detail)

    def ingest(self, report: pb.NodeReport, now: float | None = None) -> IngestResult:
        now = time.time() if now is None else now
        result = IngestResult()
        node = report.node_id
        agent = self.agents.get(node)
        if agent is None:
            self._reject(result, node, "unknown_node", "report before hello")
            return result
        ts = report.timestamp
        if not math.isfinite(ts) or ts <= 0:
            self._reject(result, node, "bad_timestamp", f"timestamp {ts!r}")
            return result
        if ts > now + self.max_clock_skew_seconds:
            self._reject(
                result, node, "future_timestamp", f"{ts - now:.0f} s ahead of the controller"
            )
            return result
        if ts <= agent.last_timestamp:
            self._reject(result, node, "duplicate_report", f"slot {report.slot} already seen")
            return result
        if not math.isfinite(report.slot_seconds) or report.slot_seconds <= 0:
            self._reject(result, node, "bad_slot_seconds", f"slot_seconds {report.slot_seconds!r}")
            return result
        agent.last_timestamp, agent.last_slot, agent.last_report_at = ts, report.slot, now
        result.taken = True
        if report.HasField("node"):
            agent.node_sample = report.node
            if report.node.HasField("other_cpu_cores"):
                other = report.node.other_cpu_cores
                if 0.0 <= other < math.inf:
                    agent.other_cpu.append(other)
                else:
                    # The instances' samples still count: only this figure is left out.
                    self._reject(result, node, "bad_other_cpu", f"other_cpu_cores {other!r}")
        agent.caps = {}
        claims: set[InstanceKey] = set()
        owners, histories, topologies = self._owners, self.histories, self.topologies
        instance_slot, slot_number = self._instance_slot, report.slot
        moved = False  # an instance came, or its history changed node
        for sample in report.instances:
            k = sample.key
            key = _new_key((k.app, k.operator, k.instance))
            owner = owners.get(key)
            if owner is not None and owner != node:
                owner = self._owned_elsewhere(key, node, now)
                if owner is not None:
                    self._reject(
                        result,
                        node,
                        "owned_by_other_node",
                        f"{key} is reported by node {owner}",
                    )
                    continue
            claims.add(key)
            slot = instance_slot(result, node, agent, ts, slot_number, sample, key)
            if slot is None:
                continue
            if type(slot) is Unmeasured:
                self.unmeasured[key] = slot
                hist = histories.get(key)
                if hist is not None:
                    moved = moved or hist.node != node
                    hist.touch(slot)  # alive where it says; no slot to add
                self._learn_topology(key, slot.upstream, slot.stateful)
                result.unmeasured += 1
                continue
            hist = histories.get(key)
            if hist is None:
                hist = histories[key] = InstanceHistory.empty(slot, self.depth)
                moved = True
            elif hist.node != node:
                moved = True
            hist.add(slot)
            # The DAG changes rarely; checked before it is written.
            topo = topologies.get(key.app)
            op = key.operator
            if (
                topo is None
                or topo.parents.get(op) != slot.upstream
                or topo.stateful.get(op) != slot.stateful
            ):
                self._learn_topology(key, slot.upstream, slot.stateful)
            result.accepted += 1
        for key in claims:
            owners[key] = node
        agent.claims = claims
        if moved:
            # Only then: status calls recount the instances per node on a change.
            self.generation += 1
        return result

    def _owned_elsewhere(self, key: InstanceKey, node: str, now: float) -> str | None:
        """The other node that still owns ``key``, or None when ``node`` may report it."""
        owner = self._owners.get(key)
        if owner is None or owner == node:
            return None
        info = self.agents.get(owner)
        if (
            info is not None
            and info.connected
            and key in info.claims
            and now - info.last_report_at <= self.forget_after_seconds
        ):
            return owner
        return None

    def _name(self, kind: str, value: str) -> str:
        """``check_name``, remembering the names that passed (the same few
        thousand arrive every slot; whether a name is valid depends on it alone)."""
        if value in self._good_names:
            return value
        check_name(kind, value)
        if len(self._good_names) >= MAX_REMEMBERED_NAMES:
            self._good_names.clear()
        self._good_names.add(value)
        return value

    def _engine_counters(self, engine: str, key: InstanceKey) -> tuple[InstanceCounters, int] | str:
        """(counters, reading stamp) of an engine instance, or why it is unmeasured."""
        if self.engines is None:
            return f"{engine} counters unavailable: no [[engine]] is configured"
        found = self.engines.counters(engine, key)
        if found.counters is None:
            return f"{engine} counters unavailable: {found.reason}"
        if found.stamp <= self._engine_stamps.get(key, 0):
            # The same reading again would make the slot look idle.
            return f"{engine} counters unavailable: no new reading since the last slot"
        return found.counters, found.stamp

    def _instance_slot(
        self,
        result: IngestResult,
        node: str,
        agent: AgentInfo,
        ts: float,
        slot_number: int,
        s: pb.InstanceSample,
        key: InstanceKey,
    ) -> InstanceSlot | Unmeasured | None:
        # The hot path of a 1,000-node report burst: 20,000 samples per slot,
        # so each protobuf field is read once and names already seen valid
        # cost a set lookup.
        good = self._good_names
        stateful = s.stateful
        # An engine that does not name its workers gets the testbed's
        # convention: one stateful and one stateless worker per app and node.
        worker = s.worker or f"{key.app}-{'stateful' if stateful else 'stateless'}-{node}"
        upstream = tuple(s.upstream)
        if not (
            key.app in good
            and key.operator in good
            and worker in good
            and good.issuperset(upstream)
        ):
            name = self._name
            try:
                name("app", key.app)
                name("operator", key.operator)
                name("worker", worker)
                for u in upstream:
                    name("upstream", u)
            except InvalidName as exc:
                self._reject(result, node, "bad_name", str(exc))
                return None
        if key.instance < 0:
            self._reject(result, node, "bad_instance", f"{key}: negative instance index")
            return None
        cap = s.cap_cores if s.HasField("cap_cores") else None
        throttled = s.throttled_seconds_total if s.HasField("throttled_seconds_total") else None
        cpu_total = s.cpu_seconds_total
        latency_total = s.latency_sum_seconds_total
        service_total = s.service_seconds_total
        # Every value finite and >= 0 (NaN fails each comparison): the usual case,
        # checked without naming the values. Otherwise the first bad one is named.
        if not (
            0.0 <= cpu_total < math.inf
            and 0.0 <= s.cpu_usage_cores < math.inf
            and 0.0 <= latency_total < math.inf
            and 0.0 <= service_total < math.inf
            and (cap is None or 0.0 <= cap < math.inf)
            and (throttled is None or 0.0 <= throttled < math.inf)
        ):
            floats = {
                "cpu_seconds_total": cpu_total,
                "cpu_usage_cores": s.cpu_usage_cores,
                "latency_sum_seconds_total": latency_total,
                "service_seconds_total": service_total,
            }
            if cap is not None:
                floats["cap_cores"] = cap
            if throttled is not None:
                floats["throttled_seconds_total"] = throttled
            for field_name, v in floats.items():
                if not math.isfinite(v):
                    self._reject(result, node, "nan", f"{key}: {field_name} is {v!r}")
                    return None
                if v < 0:
                    self._reject(result, node, "negative", f"{key}: {field_name} is {v!r}")
                    return None
        queue_length = s.queue_length
        if queue_length < 0:
            self._reject(result, node, "negative", f"{key}: queue_length is {queue_length}")
            return None
        if cap is not None:
            agent.caps[key] = cap
        queue_length = float(queue_length)
        engine = s.engine
        if engine:
            found = self._engine_counters(engine, key)
            if isinstance(found, str):
                # The baseline stays: the next measured slot spans the gap.
                return Unmeasured(key, node, worker, stateful, upstream, engine, found, ts, cap)
            c, stamp = found
            self._engine_stamps[key] = stamp
            queue_length = float(c.queue_length)
            # Flink counts records in, not arrivals and executions apart: both are
            # numRecordsIn; busy time is the service time.
            current = _new_baseline(
                (
                    ts,
                    c.received,
                    c.received,
                    c.emitted,
                    cpu_total,
                    c.latency_sum_seconds,
                    c.latency_count,
                    c.busy_seconds,
                    throttled,
                )
            )
        else:
            current = _new_baseline(
                (
                    ts,
                    s.received_total,
                    s.executed_total,
                    s.emitted_total,
                    cpu_total,
                    latency_total,
                    s.latency_count_total,
                    service_total,
                    throttled,
                )
            )
        if self.unmeasured:
            self.unmeasured.pop(key, None)
        baselines = self._baselines
        prev = baselines.get(key)
        baselines[key] = current
        if prev is None:
            return None  # the first reading only sets the baseline
        seconds = current.timestamp - prev.timestamp
        if seconds <= 0:
            self._reject(result, node, "bad_timestamp", f"{key}: time did not advance")
            return None
        arrivals = current.arrivals - prev.arrivals
        executed = current.executed - prev.executed
        emitted = current.emitted - prev.emitted
        cpu_seconds = current.cpu_seconds - prev.cpu_seconds
        latency_sum = current.latency_sum - prev.latency_sum
        latency_count = current.latency_count - prev.latency_count
        service_seconds = current.service_seconds - prev.service_seconds
        if (
            arrivals < 0
            or executed < 0
            or emitted < 0
            or cpu_seconds < 0
            or latency_sum < 0
            or latency_count < 0
            or service_seconds < 0
        ):
            deltas = {
                "arrivals": arrivals,
                "executed": executed,
                "emitted": emitted,
                "cpu_seconds": cpu_seconds,
                "latency_sum": latency_sum,
                "latency_count": latency_count,
                "service_seconds": service_seconds,
            }
            went_back = sorted(k for k, v in deltas.items() if v < 0)
            # An instance that restarted begins its counters again; its new
            # reading becomes the baseline and this slot carries no delta.
            self._reject(
                result, node, "counter_reset", f"{key}: {', '.join(went_back)} went backwards"
            )
            return None
        throttled_delta = None
        if throttled is not None and prev.throttled_seconds is not None:
            throttled_delta = max(0.0, throttled - prev.throttled_seconds)
        # In the field order of InstanceSlot.
        return _new_slot(
            (
                key,
                node,
                worker,
                stateful,
                slot_number,
                ts,
                seconds,
                arrivals,
                executed,
                emitted,
                cpu_seconds,
                queue_length,
                latency_sum,
                latency_count,
                service_seconds,
                cap,
                throttled_delta,
                upstream,
                engine,
            )
        )

    def _learn_topology(self, key: InstanceKey, upstream: tuple[str, ...], stateful: bool) -> None:
        topo = self.topologies.setdefault(key.app, AppTopology(key.app))
        topo.parents[key.operator] = upstream
        topo.stateful[key.operator] = stateful

    def forget_vanished(self, now: float) -> None:
        """Drop instances that stopped reporting (once per epoch: it scans them all)."""
        gone = [
            k for k, h in self.histories.items() if now - h.last_seen > self.forget_after_seconds
        ]
        for k in gone:
            del self.histories[k]
            self._baselines.pop(k, None)
            self._engine_stamps.pop(k, None)
            if k not in self.unmeasured:
                self._owners.pop(k, None)
        silent = [
            k for k, u in self.unmeasured.items() if now - u.timestamp > self.forget_after_seconds
        ]
        for k in silent:
            del self.unmeasured[k]
            if k not in self.histories:
                self._baselines.pop(k, None)
                self._engine_stamps.pop(k, None)
                self._owners.pop(k, None)
        if gone:
            self.generation += 1
        if gone or silent:
            live_ops = {(k.app, k.operator) for k in (*self.histories, *self.unmeasured)}
            for app, topo in list(self.topologies.items()):
                for op in list(topo.parents):
                    if (app, op) not in live_ops:
                        del topo.parents[op]
                        topo.stateful.pop(op, None)
                if not topo.parents:
                    del self.topologies[app]

    # ------------------------------------------------------------------ views
    def instances_of(self, app: str, operator: str) -> list[InstanceHistory]:
        return sorted(
            (h for k, h in self.histories.items() if k.app == app and k.operator == operator),
            key=lambda h: h.key.instance,
        )

    def node_capacity(self) -> dict[str, float]:
        return {n: a.cpu_capacity_cores for n, a in self.agents.items() if a.connected}

    def other_cpu(self) -> dict[str, float]:
        """Node -> mean CPU beyond its instances over its last ``depth`` reports, cores;
        nodes that never reported it are left out."""
        return {
            n: math.fsum(a.other_cpu) / len(a.other_cpu)
            for n, a in self.agents.items()
            if a.connected and a.other_cpu
        }

    def memory_bandwidth(self) -> dict[str, float | None]:
        """Node -> memory bandwidth of its last report (bytes/s, summed over the
        node's resctrl groups); None where the node has no such counter: a
        missing counter is never read as an idle memory bus."""
        out: dict[str, float | None] = {}
        for n, a in self.agents.items():
            if not a.connected:
                continue
            ns = a.node_sample
            if ns is None or not ns.memory_bandwidth_available:
                out[n] = None
            else:
                values = [v for v in ns.memory_bandwidth_bytes_per_second.values() if v >= 0]
                out[n] = math.fsum(values) if all(map(math.isfinite, values)) else None
        return out

    def instances_per_node(self) -> dict[str, int]:
        """Node -> instances with a history there. Safe without the controller's
        lock (a status call): computed from a snapshot, and kept until the next
        change of :attr:`generation`. The caller must not change the dict."""
        generation = self.generation  # read before the snapshot
        cached_at, counts = self._per_node
        if cached_at == generation:
            return counts
        counts = {}
        for h in list(self.histories.values()):
            counts[h.node] = counts.get(h.node, 0) + 1
        self._per_node = (generation, counts)
        return counts
