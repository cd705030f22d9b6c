"""The Controller: wires its edges (server, store, actuators, history) to the epoch.

Transport-agnostic: the gRPC server (controller/edges/server.py) and the
simulator's in-process transport both call ``on_hello`` / ``on_report`` /
``on_ack`` and attach a sender per agent to ``sessions``. ``run_epoch`` runs
one epoch: the pure pipeline (controller/epoch.py) over the observed cluster
and the memory (controller/memory.py), then the edges act on its result.
docs/architecture.md follows one epoch through the files.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections.abc import Container, Iterable
from operator import attrgetter
from typing import Any

from controller.config import ControllerConfig
from controller.edges.actuators import CAP_ACTUATORS, AgentSessions, LogOnlyActuator
from controller.edges.cluster import AgentInfo, ObservedCluster
from controller.edges.engines import EngineEdge, places_itself
from controller.edges.history import HistoryEdge
from controller.edges.metrics import ControllerMetrics
from controller.edges.models import PerfModelsEdge
from controller.edges.nodepool import NodePoolEdge
from controller.edges.parallelism import ParallelismEdge
from controller.edges.store import StateStore
from controller.epoch import EpochInputs, EpochResult, run_epoch
from controller.memory import ControllerMemory, DemandPeaks
from controller.placement.loop import PlacementLoop, PlacementOffer
from controller.placement.migration import get_move_actuator
from controller.placement.stage import (
    PlacementDemand,
    build_strategy,
    current_from_histories,
    dags_from_topologies,
)
from controller.qos import QosRegistry
from controller.record import build_record
from controller.stages.allocation import ALLOCATORS, Allocator
from controller.stages.evaluate import evaluate
from controller.stages.forecast import SourceHistory
from dsched import __version__
from dsched_pb import dsched_pb2 as pb

log = logging.getLogger(__name__)


def tune_gc() -> None:
    """Collect the young generation less often in a controller process.

    A controller holds on the order of a million long-lived objects (instance
    histories, caps, records). CPython's default threshold starts a collection
    every 700 net allocations, and an epoch allocates hundreds of thousands, so
    at a thousand nodes collections, not decisions, would take much of an epoch.
    Garbage here is short-lived and acyclic; a higher threshold changes when it is
    freed, not whether.
    """
    gc.set_threshold(100_000, 50, 100)


class CollectionPause:
    """Automatic garbage collection off while a slot's reports are ingested and
    its epoch decides, on again once the directives are acknowledged (or the
    epoch stops waiting for the Acks, :class:`AckWait`).

    A young-generation collection at a 1,000-node cluster walks about 100,000
    objects (tens of milliseconds), and one or two would fall on the path from
    the last report to the directives every slot. Paused, what that path
    allocates waits for the first collection after it; nothing is freed later
    than one slot. One pause per epoch number; a pause that outlives ``longest``
    seconds (an epoch loop that stalled) ends at the next report, so garbage
    never piles up.
    Only a running epoch loop turns it on (``enabled``): a controller driven
    epoch by epoch, as tests and benchmarks do, leaves collection alone.
    """

    def __init__(self, longest: float):
        self.longest = longest
        self.enabled = False
        self._lock = threading.Lock()
        self._since: float | None = None  # monotonic start of the pause in force
        self._epoch = -1  # the epoch number of the last pause

    def pause(self, epoch: int) -> None:
        """At a report taken under epoch number ``epoch``."""
        if not self.enabled:
            return
        with self._lock:
            if self._since is not None:
                if time.monotonic() - self._since > self.longest:
                    self._end()
                return
            if epoch != self._epoch and gc.isenabled():
                self._epoch = epoch
                self._since = time.monotonic()
                gc.disable()

    def resume(self) -> None:
        with self._lock:
            if self._since is not None:
                self._end()

    def _end(self) -> None:
        self._since = None
        gc.enable()


# How long an epoch waits for its directives to be handed to the agents' streams
# before it goes on with its record.
DELIVERY_WAIT_SECONDS = 2.0
# How long, as a share of the slot, an epoch then waits for the agents' Acks
# before it goes on with its record: a round of directives and Acks is to take
# at most a tenth of the slot (docs/wire-scale.md measures rounds).
ACK_WAIT_SLOTS = 0.1


class AckWait:
    """The nodes whose Ack of the current epoch's directive has not arrived yet.

    After its directives are on their way an epoch still has its learning, the
    decision record and the placement offer to do (and the record wakes the
    store's writer and the admin door's plan), a second of CPU at a thousand
    nodes. Done while the agents receive and acknowledge, it takes the CPU
    their round needs; the epoch waits for the Acks first, a bounded time. Only
    a transport that reports Acks (the gRPC server, :meth:`acked`) turns it on
    (``enabled``); without one nothing waits. Its own lock, never the
    controller's: the server's event loop calls :meth:`acked`.
    """

    def __init__(self) -> None:
        self.enabled = False
        self._cond = threading.Condition(threading.Lock())
        self._epoch = -1
        self._waiting: set[str] = set()

    def expect(self, epoch: int, nodes: Iterable[str]) -> None:
        """Before ``epoch``'s directives leave: its Acks will come from ``nodes``."""
        with self._cond:
            self._epoch = epoch
            self._waiting = set(nodes) if self.enabled else set()

    def only(self, nodes: Container[str]) -> None:
        """Of the nodes expected, only those in ``nodes`` (reached) will answer."""
        with self._cond:
            self._waiting = {n for n in self._waiting if n in nodes}
            if not self._waiting:
                self._cond.notify_all()

    def acked(self, node: str, epoch: int) -> None:
        """``node`` acknowledged the directive of ``epoch`` (any thread)."""
        with self._cond:
            if epoch == self._epoch and node in self._waiting:
                self._waiting.discard(node)
                if not self._waiting:
                    self._cond.notify_all()

    def gone(self, node: str) -> None:
        """``node``'s stream ended: its Ack will not come."""
        with self._cond:
            if node in self._waiting:
                self._waiting.discard(node)
                if not self._waiting:
                    self._cond.notify_all()

    def wait(self, timeout: float) -> bool:
        """Block until every expected Ack arrived (True) or ``timeout`` seconds passed."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._waiting, timeout)


class AgentRows:
    """The ``Status`` row of each agent as its Hello described it, kept between
    calls (a status call copies it and sets the instances and the report age).

    Keyed by those values, not by the agent: a reconnect with another Hello
    gets a row of its own. Rows are never changed once made, so calls on two
    threads may share them.
    """

    def __init__(self, limit: int = 100_000):
        self._limit = limit
        self._rows: dict[tuple, pb.AgentStatus] = {}

    def template(self, agent: AgentInfo) -> pb.AgentStatus:
        said = (
            agent.node_id,
            agent.cpu_capacity_cores,
            agent.cgroup_mode,
            agent.counters_available,
            agent.dry_run,
        )
        row = self._rows.get(said)
        if row is None:
            if len(self._rows) >= self._limit:
                self._rows = {}  # bounded: agents that came and went are forgotten
            row = self._rows[said] = pb.AgentStatus(
                node_id=agent.node_id,
                cpu_capacity_cores=agent.cpu_capacity_cores,
                cgroup_mode=agent.cgroup_mode,
                counters_available=list(agent.counters_available),
                dry_run=agent.dry_run,
            )
        return row


_node_id_of = attrgetter("node_id")

MODE_TO_PB = {"dry-run": pb.DRY_RUN, "enforce": pb.ENFORCE}
PB_TO_MODE = {v: k for k, v in MODE_TO_PB.items()}


def build_allocator(config: ControllerConfig) -> Allocator:
    return ALLOCATORS.create(config.allocator, config)


def build_placement(config: ControllerConfig) -> PlacementLoop | None:
    if config.placement == "none":
        return None
    strategy = build_strategy(
        config.placement,
        config.slot_seconds,
        config.scale_in_wait_seconds,
        config.scale_in_wait_stateless_seconds,
        **config.placement_options.for_strategy(config.placement),
    )
    options = {}
    if config.move_actuator == "testbed":
        options = {"url": config.move_url, "timeout_seconds": config.move_timeout_seconds}
    mover = get_move_actuator(config.move_actuator, **options)
    return PlacementLoop(
        strategy,
        mover,
        config.headroom_cores,
        config.forget_after_slots,
        min_relief_cores=config.placement_min_relief_cores,
    )


class Controller:
    def __init__(
        self,
        config: ControllerConfig,
        store: StateStore | None = None,
        clock=time.time,
    ):
        self.config = config
        self.clock = clock
        self.store = store or StateStore(config.state_dir, keep_decisions=config.decisions_kept)
        self.metrics = ControllerMetrics(lambda: self.last_record, config.qos, config.slot_seconds)
        # Counters of engines that are not instrumented, read on their own threads.
        self.engines: EngineEdge | None = (
            EngineEdge.from_config(
                config.engine, config.slot_seconds, self.metrics.observe_engine_read
            )
            if config.engine
            else None
        )
        self.cluster = ObservedCluster(
            depth=config.phi,
            forget_after_seconds=config.forget_after_slots * config.slot_seconds,
            max_clock_skew_seconds=config.max_clock_skew_seconds,
            engines=self.engines,
            max_capacity_cores=config.max_node_capacity_cores,
        )
        self.sessions = AgentSessions()
        self._collection_pause = CollectionPause(2 * config.slot_seconds)
        #: Acks of the last epoch's directives still to come (the server reports them).
        self.acks = AckWait()
        self.cap_actuator = CAP_ACTUATORS.create(config.cap_actuator, self.sessions)
        self.allocator = build_allocator(config)
        self.history: HistoryEdge | None = None
        if config.history.enabled:
            self.history = HistoryEdge.open(
                config.history, config.state_dir, config.slot_seconds, self.metrics.registry
            )
        self.placement = build_placement(config)
        # Task performance models (docs/perf-models.md): loaded now, reloaded each
        # epoch when their file changes, and handed to a strategy that uses them.
        self.models = PerfModelsEdge.from_config(config, self.metrics.registry, self.clock)
        self.models.apply(self.placement)
        self.qos = QosRegistry(config.qos, self.store)
        # Carries out the DP's node recommendation (side effects, off the pure stages).
        self.node_pool = NodePoolEdge.from_config(config, clock=clock, store=self.store)
        # Instance counts per operator, decided and (by its actuator) carried out.
        self.parallelism = ParallelismEdge.from_config(config)
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # epoch_trigger = "reports": which connected node has reported in which epoch.
        # Its own lock, never held while waiting for _lock, so the epoch loop can
        # wait on it while an agent's report waits for the epoch.
        self._trigger = threading.Condition(threading.Lock())
        self._connected: set[str] = set()
        self._reported_in: dict[str, int] = {}
        # Connected nodes that have not reported under epoch number _missing_for:
        # the trigger is woken once, by the last report, not by each of them.
        self._missing: set[str] = set()
        self._missing_for = -1
        # Health: monotonic time of the loop's start and of the last epoch it completed.
        self._loop_started_at: float | None = None
        self._last_epoch_done_at: float | None = None
        self.started_at = clock()
        self.mode = self.store.get("mode") or config.mode
        self.store.put("mode", self.mode)
        self.epoch = int(self.store.get("epoch", "0") or 0)
        # Resume from the persisted caps (held until their instances report).
        self.memory = ControllerMemory.resumed(
            self.store.load_caps(),
            self.epoch,
            config.forget_after_slots,
            sources=SourceHistory(config.arima_history, config.arima_fits_per_epoch)
            if {"arima", "seasonal"} & set(config.predictors)
            else None,
            peaks=DemandPeaks.for_slot(
                config.stateful_peak_seconds,
                config.slot_seconds,
                config.placement_demand_seconds,
                config.placement_rise_seconds,
            )
            if self.placement is not None
            else None,
        )
        records = self.store.decisions(1)
        self.last_record: dict[str, Any] | None = records[0] if records else None
        self.metrics.dry_run.set(1 if self.mode == "dry-run" else 0)
        self.metrics.epoch.set(self.epoch)
        self._rejected_seen: dict[str, int] = {}
        self.last_timing: dict[str, float] = {}
        self._agent_rows = AgentRows()

    # ------------------------------------------------------------ agent side
    def on_hello(self, hello: pb.Hello) -> pb.Welcome:
        with self._lock:
            info = self.cluster.agent_connected(hello, self.clock())
            log.info(
                "agent %s connected: %.2f cores, cgroup mode %s, counters %s%s",
                info.node_id,
                info.cpu_capacity_cores,
                pb.CgroupMode.Name(info.cgroup_mode),
                ",".join(info.counters_available) or "-",
                " (dry-run)" if info.dry_run else "",
            )
            self._update_agent_gauge()
            welcome = self._welcome()
        with self._trigger:
            self._connected.add(info.node_id)
            if self._reported_in.get(info.node_id) != self._missing_for:
                self._missing.add(info.node_id)
        return welcome

    def on_disconnect(self, node_id: str) -> None:
        with self._lock:
            self.cluster.agent_disconnected(node_id)
            self._update_agent_gauge()
            log.info("agent %s disconnected", node_id)
        with self._trigger:
            self._connected.discard(node_id)
            self._reported_in.pop(node_id, None)
            self._missing.discard(node_id)
            # One reporter fewer may be all the reports trigger was waiting for.
            self._trigger.notify_all()

    def on_report(self, report: pb.NodeReport) -> None:
        with self._lock:
            self.metrics.reports.inc()
            res = self.cluster.ingest(report, self.clock())
            for reason, n in res.rejected.items():
                self.metrics.rejected.labels(reason).inc(n)
            # The epoch number when the data was taken: epochs increment it under
            # this lock before reading the cluster, so data taken under a number
            # is in none of that number's epochs yet.
            epoch = self.epoch
        if res.taken:
            self._collection_pause.pause(epoch)
            with self._trigger:
                if report.node_id in self._connected:
                    self._reported_in[report.node_id] = epoch
                    if epoch != self._missing_for:
                        self._count_missing(epoch)
                    self._missing.discard(report.node_id)
                    if not self._missing:
                        self._trigger.notify_all()

    def on_ack(self, node_id: str, ack: pb.Ack) -> None:
        for r in ack.rejected:
            reason = r.reason.split(":", 1)[0]
            self.metrics.directive_rejections.labels(reason).inc()
            log.warning(
                "agent %s refused cap for %s/%s/%d: %s",
                node_id,
                r.key.app,
                r.key.operator,
                r.key.instance,
                r.reason,
            )

    def _update_agent_gauge(self) -> None:
        self.metrics.agents_connected.set(
            sum(1 for a in self.cluster.agents.values() if a.connected)
        )

    # ------------------------------------------------------------ admin side
    def set_mode(self, mode: str) -> str:
        if mode not in MODE_TO_PB:
            raise ValueError(f"unknown mode {mode!r} (known: dry-run, enforce)")
        with self._lock:
            previous, self.mode = self.mode, mode
            self.store.put("mode", mode)
            self.metrics.dry_run.set(1 if mode == "dry-run" else 0)
        if previous != mode:
            log.info("mode %s -> %s", previous, mode)
            # Agents write nothing while the controller is in dry-run: a Welcome
            # in the middle of the stream tells each connected one at once.
            msg = pb.ControllerMessage(welcome=self._welcome())
            self.sessions.send_many({n: msg for n in self.sessions.nodes()})
        return previous

    def _welcome(self) -> pb.Welcome:
        return pb.Welcome(
            epoch=self.epoch, slot_seconds=self.config.slot_seconds, mode=MODE_TO_PB[self.mode]
        )

    def set_qos(self, app: str, qos_class: str) -> bool:
        """Assign a class; True when the app is known. ValueError for a bad class/name."""
        with self._lock:
            self.qos.set(app, qos_class, self.clock())
            known = app in self.cluster.topologies
        log.info("qos %s -> %s%s", app, qos_class, "" if known else " (held until it appears)")
        return known

    def list_qos(self):
        with self._lock:
            return self.qos.assignments(self.cluster.topologies)

    def explain(self, app: str, epochs: int) -> list[dict[str, Any]]:
        return self.store.decisions(max(1, epochs))

    def status(self) -> pb.StatusReply:
        # Without the controller's lock: an epoch holds it for up to a second at a
        # thousand nodes, and an operator's status call must not wait for that.
        # list() of a dict's values is one C call under the GIL, so each copy is a
        # consistent snapshot even while reports are ingested.
        # Counted once per change of the instances, not per call (operators and
        # dashboards poll this while a thousand agents report).
        per_node = self.cluster.instances_per_node()
        instances = len(self.cluster.histories)
        known_agents = list(self.cluster.agents.values())
        topologies = len(self.cluster.topologies)
        now = self.clock()
        connected = [a for a in sorted(known_agents, key=_node_id_of) if a.connected]
        # A row is copied from the agent's template (what its Hello said), then
        # gets what changes: several times faster than a row made field by field,
        # which at a thousand agents costs milliseconds a call.
        agents = list(map(self._agent_rows.template, connected))
        engines = [
            pb.EngineStatus(
                name=e.name,
                kind=e.kind,
                endpoint=e.endpoint,
                healthy=e.healthy,
                reason=e.reason,
                jobs=e.jobs,
                instances=e.instances,
                last_read_age_seconds=e.last_read_age_seconds,
            )
            for e in (self.engines.status() if self.engines is not None else [])
        ]
        reply = pb.StatusReply(
            engines=engines,
            mode=MODE_TO_PB[self.mode],
            epoch=self.epoch,
            agents=agents,
            applications=topologies,
            instances=instances,
            slot_seconds=self.config.slot_seconds,
            version=__version__,
            uptime_seconds=now - self.started_at,
        )
        for row, a in zip(reply.agents, connected, strict=True):
            row.instances = per_node.get(a.node_id, 0)
            row.last_report_age_seconds = (now - a.last_report_at) if a.last_report_at else -1
        return reply

    # ------------------------------------------------------------ the epoch
    def run_epoch(self) -> dict[str, Any]:
        """One epoch: evaluate, the pure pipeline, memory update, act, record."""
        t0 = time.perf_counter()
        cpu0 = time.thread_time()
        with self._lock:
            now = self.clock()
            self.epoch += 1
            cfg = self.config
            self.cluster.forget_vanished(now)
            self.models.refresh()
            self.models.apply(self.placement)
            # Instances without engine counters this slot: out of the views, caps held.
            unmeasured = dict(self.cluster.unmeasured)
            views = evaluate(self.cluster, cfg.phi, exclude=unmeasured, rows=self.memory.slot_rows)
            if self.history is not None:
                seed = self.history.seed(views)
                self.memory.apply_seed(seed.kappa, seed.source_rates)
            t_pipeline = time.perf_counter()
            cpu_pipeline = time.thread_time()
            inputs = EpochInputs(
                epoch=self.epoch,
                now=now,
                views=views,
                classes={
                    a: self.qos.class_of(a)
                    for a in sorted({k.app for k in views} | {k.app for k in unmeasured})
                },
                capacity=self.node_capacity(),
                unmeasured=unmeasured,
                memory_bandwidth=self.cluster.memory_bandwidth(),
            )
            result = run_epoch(
                inputs, self.memory.view(), cfg, self.allocator, defer_explanation=True
            )
            self.metrics.allocation_duration.observe(result.timing["allocate"])
            if result.alloc.dp is not None:
                self.metrics.dp_duration.observe(result.alloc.dp.seconds)
            t_act = time.perf_counter()
            cpu_compute = time.thread_time() - cpu0
            self.memory.commit_caps(result)
            # Caps are committed before any directive leaves: if the process dies
            # at any point after this, the store holds caps at least as new as
            # those any agent enforces, and a restart resumes (and re-sends)
            # them instead of deciding afresh from older ones. The other order
            # could leave agents enforcing caps the restarted controller never
            # heard of. The decision record can wait for the writer thread; a
            # crash loses at most the audit log's tail, never a cap in force.
            self.store.save_caps(self.epoch, self.memory.caps)
            enforce = self.mode == "enforce"
            actuator = self.cap_actuator if enforce else LogOnlyActuator()
            caps_by_node = result.caps_by_node()
            # Before anything is sent: an Ack may come back at once.
            self.acks.expect(self.epoch, caps_by_node if enforce else ())
            acted = actuator.push_caps(self.epoch, caps_by_node, f"epoch {self.epoch}")
            self.acks.only(acted.sent)
            # The rest of the epoch (learning, the record, placement) would share
            # the interpreter with the server's loop while it encodes and writes
            # the directives: they go first. Bounded, so a wedged loop cannot
            # stall the epoch.
            acted.wait_delivered(DELIVERY_WAIT_SECONDS)
            t_sent = time.perf_counter()
            # And it would take the CPU the agents need to receive and apply them
            # (on a small machine, the same cores): the Acks first, for at most
            # the round's target.
            self.acks.wait(ACK_WAIT_SLOTS * cfg.slot_seconds)
            t_acked = time.perf_counter()
            self._collection_pause.resume()
            # The latency estimates and peaks explain the caps just sent: after them.
            explain_wall, explain_cpu = time.perf_counter(), time.thread_time()
            result.explain()
            explain_wall = time.perf_counter() - explain_wall
            explain_cpu = time.thread_time() - explain_cpu
            self.memory.learn(result)
            if acted.sent:
                self.metrics.directives.inc(len(acted.sent))
            rejected = dict(self.cluster.rejected)
            new_rejections = {r: n - self._rejected_seen.get(r, 0) for r, n in rejected.items()}
            self._rejected_seen = rejected
            node_pool_action = self.node_pool.offer(result, enforce=enforce)
            # MBA where a performance model is loaded for the operator.
            self.parallelism.set_models(self.models.current())
            parallelism = self.parallelism.offer(result, enforce=enforce)
            t_record = time.perf_counter()
            cpu_record = time.thread_time()
            record = build_record(
                result,
                mode=self.mode,
                slot_seconds=cfg.slot_seconds,
                placement={
                    "strategy": cfg.placement,
                    "overflow_cores": dict(result.alloc.overflow),
                },
                actuator=actuator.name,
                acted=acted,
                rejected={r: n for r, n in new_rejections.items() if n},
                node_pool_action=node_pool_action,
            )
            record["parallelism"] = parallelism
            # What each node's other threads used (taken off capacity_cores with
            # other_cpu = "subtract"): the reason a node's capacity moved.
            record["other_cpu_cores"] = self.cluster.other_cpu()
            # The performance models in force (MBA, sam) and the last table refused.
            record["perf_models"] = self.models.status()
            record["placement"].update(self._offer_placement(result))
            for row in record["apps"]:
                if row["violation"]:
                    self.metrics.qos_violations.labels(row["app"], row["class"]).inc()
            self.last_record = record
            if self.history is not None:
                self.history.spool(
                    self.epoch, now, self.cluster, {"epoch": self.epoch, "apps": record["apps"]}
                )
            # Queued: encoded and written on the store's thread.
            self.store.record_decision(self.epoch, now, self.mode, record)
            rec = result.alloc.recommendation
            if rec is not None and rec.nodes_delta:
                self.store.record_recommendation(
                    self.epoch, now, rec.nodes_delta, rec.gain, rec.reason
                )
            self.metrics.epoch.set(self.epoch)
        t_end = time.perf_counter()
        cpu_end = time.thread_time()
        # Where an epoch's time goes (the controller-scale benchmark reads it).
        self.last_timing = {
            "evaluate": t_pipeline - t0,
            **result.timing,
            "act_and_memory": t_record - t_act - (t_acked - t_sent) - explain_wall,
            "record_and_store": t_end - t_record,
            "compute": t_act - t0,
            # From the epoch's start until its directives were on their way.
            "until_directives": t_sent - t0,
            # Then until the agents acknowledged them (or the wait's bound).
            "acks_wait": t_acked - t_sent,
            # CPU time on this thread: what the epoch costs on an idle core,
            # whatever else the machine is running.
            "evaluate_cpu": cpu_pipeline - cpu0,
            "act_and_memory_cpu": cpu_record - cpu0 - cpu_compute - explain_cpu,
            "record_and_store_cpu": cpu_end - cpu_record,
            "compute_cpu": cpu_compute,
            "epoch_cpu": cpu_end - cpu0,
        }
        self.metrics.epoch_duration.observe(t_end - t0)
        return record

    def node_capacity(self) -> dict[str, float]:
        """Cores dsched may hand out per node: the agent's report (less what the node's
        other threads use, with other_cpu = "subtract"), capped by config."""
        reported = self.cluster.node_capacity()
        if self.config.other_cpu == "subtract":
            other = self.cluster.other_cpu()
            reported = {n: max(0.0, c - other.get(n, 0.0)) for n, c in reported.items()}
        limits = self.config.node_capacity_cores
        return {n: min(c, limits.get(n, c)) for n, c in reported.items()}

    def _offer_placement(self, result: EpochResult) -> dict[str, Any]:
        """Step 7, off the fast loop (controller/placement/loop.py)."""
        if self.placement is None:
            return {"planned": False}

        def snapshot() -> PlacementOffer:
            current = current_from_histories(self.cluster.histories)
            demands = {
                k: PlacementDemand(
                    d.node,
                    result.placement_demands.get(k, d.cores - d.backlog_cores),
                    result.peaks.get(k),
                )
                for k, d in result.demands.items()
            }
            # A held instance still occupies its node: its held cap stands for its demand.
            for k, u in result.held.items():
                if k in result.caps and k.id in current:
                    demands[k] = PlacementDemand(u.node, result.caps[k][1])
            return PlacementOffer(
                epoch=result.epoch,
                mode=self.mode,
                demands=demands,
                capacity=dict(result.capacity),
                current=current,
                dags=dags_from_topologies(self.cluster.topologies),
                # Engines that place their instances themselves: recommend only.
                pinned={
                    k.id: places_itself(h.engine)
                    for k, h in self.cluster.histories.items()
                    if h.engine
                },
            )

        return self.placement.offer(
            result.epoch, lambda: {k.id: d.node for k, d in result.demands.items()}, snapshot
        )

    def wait_placement(self, timeout: float = 30.0) -> bool:
        """Block until the placement thread is idle (tests, shutdown)."""
        return True if self.placement is None else self.placement.wait(timeout)

    # ------------------------------------------------------------ lifecycle
    def start(self, serve_metrics: bool = True) -> None:
        if serve_metrics:
            self.metrics.serve(self.config.metrics)
        if self.engines is not None:
            self.engines.start()
        if self.history is not None:
            self.history.start_job()
        self._thread = threading.Thread(target=self._loop, name="dsched-epochs", daemon=True)
        self._collection_pause.enabled = True
        self._loop_started_at = time.monotonic()
        self._thread.start()

    def _loop(self) -> None:
        period = self.config.slot_seconds
        by_reports = self.config.epoch_trigger == "reports"
        started = time.monotonic()
        next_at = started + period
        while True:
            if by_reports:
                if not self._wait_for_reports(started, period):
                    return
                started = time.monotonic()
            else:
                if self._stop.wait(max(0.0, next_at - time.monotonic())):
                    return
                next_at += period
            try:
                self.run_epoch()
                self._last_epoch_done_at = time.monotonic()
            except Exception:
                # One bad epoch must not stop the controller; the next one retries.
                log.exception("epoch %d failed", self.epoch)
            finally:
                self._collection_pause.resume()

    def _count_missing(self, epoch: int) -> None:
        """The connected nodes without a report under ``epoch`` (caller holds ``_trigger``)."""
        self._missing_for = epoch
        self._missing = {n for n in self._connected if self._reported_in.get(n) != epoch}

    def _all_reported(self) -> bool:
        """Every connected agent has reported since the current epoch number began
        (caller holds ``_trigger``). No agent: nothing to wait for but the timer."""
        epoch = self.epoch
        if epoch != self._missing_for:
            self._count_missing(epoch)
        return bool(self._connected) and not self._missing

    def _wait_for_reports(self, previous: float, period: float) -> bool:
        """Block until the next epoch may start (epoch_trigger = "reports"): every
        connected agent reported, but no sooner than half a slot after the previous
        epoch began; at the latest one slot after it. False when stopping."""
        earliest, deadline = previous + period / 2, previous + period
        with self._trigger:
            while not self._stop.is_set():
                now = time.monotonic()
                if now >= deadline or (now >= earliest and self._all_reported()):
                    return True
                self._trigger.wait((earliest if now < earliest else deadline) - now)
        return False

    def health(self) -> tuple[bool, str]:
        """(serving, why not): the epoch loop runs and has completed an epoch within
        two slots. Lock-free, so it answers while an epoch holds the lock."""
        if self._stop.is_set():
            return False, "stopping"
        started = self._loop_started_at
        if started is None or self._thread is None or not self._thread.is_alive():
            return False, "starting"
        # The first epoch is due one slot after the start.
        last = self._last_epoch_done_at or started + self.config.slot_seconds
        stalled = time.monotonic() - last
        if stalled > 2 * self.config.slot_seconds:
            return False, f"no epoch completed for {stalled:.1f} s"
        return True, ""

    def stop(self) -> None:
        self._stop.set()
        self._collection_pause.enabled = False
        self._collection_pause.resume()
        with self._trigger:
            self._trigger.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self.engines is not None:
            self.engines.stop()
        if self.placement is not None:
            self.placement.stop()
        self.node_pool.close()
        self.parallelism.close()
        self.metrics.stop()
        if self.history is not None:
            self.history.stop()
        self.store.close()
