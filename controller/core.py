"""The Controller: state in, one epoch of decisions out, every decision recorded.

Transport-agnostic: the gRPC server (controller/server.py) and the simulator's
in-process transport both call ``on_hello`` / ``on_report`` / ``on_ack`` and
attach a sender per agent to ``sessions``; ``run_epoch`` is the whole control
loop of DESIGN §4 and can be called by a timer thread (``start``) or directly.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from controller import pipeline
from controller.actuators import AgentActuator, AgentSessions, LogOnlyActuator
from controller.allocation import QosDpAllocator, violation_ratio
from controller.config import ControllerConfig
from controller.demand import (
    WithLatencyTarget,
    app_latency_models,
    estimate_latency_seconds,
    latency_budgets,
    latency_needs,
)
from controller.explain import build_record
from controller.history_feed import HistoryFeed, history_config
from controller.hysteresis import HysteresisState
from controller.metrics import ControllerMetrics
from controller.migration import LogOnlyMoveActuator, get_move_actuator
from controller.model import InstanceKey, OperatorKey
from controller.placement_stage import (
    DemandPeaks,
    build_strategy,
    current_from_histories,
    dags_from_topologies,
    placement_summary,
    plan_placement,
)
from controller.qos import QosRegistry
from controller.state import ClusterState
from controller.store import StateStore
from dsched import __version__
from dsched_pb import dsched_pb2 as pb

log = logging.getLogger(__name__)


def tune_gc() -> None:
    """Collect the young generation less often in a controller process.

    A controller holds on the order of a million long-lived objects (instance
    histories, caps, records). CPython's default threshold starts a collection
    every 700 net allocations, and an epoch allocates hundreds of thousands, so
    collections, not decisions, took a third of a 1,000-node epoch. Garbage here
    is short-lived and acyclic; a higher threshold changes when it is freed, not
    whether.
    """
    gc.set_threshold(100_000, 50, 100)


MODE_TO_PB = {"dry-run": pb.DRY_RUN, "enforce": pb.ENFORCE}
PB_TO_MODE = {v: k for k, v in MODE_TO_PB.items()}


def build_estimator(
    config: ControllerConfig, needs: dict[OperatorKey, float] | None = None
) -> pipeline.DemandEstimator:
    """Rate demand, raised to meet latency budgets (``needs``, when given), plus
    backlog drain, never below the minimum cap."""
    inner: pipeline.DemandEstimator = pipeline.RateDemand()
    if needs is not None:
        inner = WithLatencyTarget(inner, needs)
    return pipeline.WithFloor(
        pipeline.WithBacklogDrain(
            inner, drain_seconds=config.backlog_drain_slots * config.slot_seconds
        ),
        floor_cores=config.min_cap_cores,
    )


ALLOCATORS = {
    "demand": lambda cfg: pipeline.DemandAllocator(headroom_cores=cfg.headroom_cores),
    "qos-dp": lambda cfg: QosDpAllocator(
        headroom_cores=cfg.headroom_cores,
        floor_cores=cfg.min_cap_cores,
        theta_cores=cfg.theta_cores,
        max_units=cfg.dp_max_units,
        node_cost=cfg.node_cost,
        value=cfg.dp_value,
    ),
}


def build_allocator(config: ControllerConfig) -> pipeline.Allocator:
    try:
        return ALLOCATORS[config.allocator](config)
    except KeyError:
        from dsched.config import ConfigError

        raise ConfigError(
            "allocator",
            f"unknown allocator {config.allocator!r} (known: {', '.join(sorted(ALLOCATORS))})",
        ) from None


class Controller:
    def __init__(
        self,
        config: ControllerConfig,
        store: StateStore | None = None,
        clock=time.time,
    ):
        self.config = config
        self.clock = clock
        self.store = store or StateStore(config.state_dir)
        self.state = ClusterState(
            depth=config.phi,
            forget_after_seconds=config.forget_after_slots * config.slot_seconds,
        )
        self.sessions = AgentSessions()
        self.metrics = ControllerMetrics(lambda: self.last_record)
        self.allocator = build_allocator(config)
        self.history: HistoryFeed | None = None
        if config.history.enabled:
            self.history = HistoryFeed(
                history_config(config.history, config.state_dir, config.slot_seconds),
                self.metrics.registry,
            )
        self._placer = (
            None
            if config.placement == "none"
            else build_strategy(config.placement, config.slot_seconds, config.scale_in_wait_seconds)
        )
        self._peaks = DemandPeaks.for_slot(config.stateful_peak_seconds, config.slot_seconds)
        self._placement_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dsched-place")
        self._placement_job: Future | None = None
        self._placement_done: dict[str, Any] | None = None
        # Instances the last plan moved -> their new node, and the epoch it was
        # planned in: until the agents report them there, the record still shows
        # the old placement, and a plan made from it would repeat the moves.
        self._settling: dict[str, str] = {}
        self._settling_since = 0
        self._mover = get_move_actuator(
            config.move_actuator,
            **({"url": config.move_url} if config.move_actuator == "testbed" else {}),
        )
        self.qos = QosRegistry(config.qos, self.store)
        self.sources = pipeline.SourceHistory(config.arima_history) if config.arima else None
        # Last measured CPU per tuple of each operator (for operators idle this window).
        self._kappa: dict = {}
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.started_at = clock()
        self.mode = self.store.get("mode") or config.mode
        self.store.put("mode", self.mode)
        self.epoch = int(self.store.get("epoch", "0") or 0)
        # Resume from the persisted caps: the first epochs after a restart hold
        # them unless the inputs say otherwise (no thrash after a crash).
        self._caps: dict[InstanceKey, tuple[str, float]] = self.store.load_caps()
        self._hysteresis = {k: HysteresisState(cap=c) for k, (_, c) in self._caps.items()}
        # Persisted caps of instances not reporting yet (e.g. after a restart) are
        # held for forget_after_slots epochs instead of being dropped.
        self._held: dict[InstanceKey, int] = {k: self.epoch for k in self._caps}
        records = self.store.decisions(1)
        self.last_record: dict[str, Any] | None = records[0] if records else None
        self.metrics.dry_run.set(1 if self.mode == "dry-run" else 0)
        self.metrics.epoch.set(self.epoch)
        self._rejected_seen: dict[str, int] = {}
        self.last_timing: dict[str, float] = {}

    # ------------------------------------------------------------ agent side
    def on_hello(self, hello: pb.Hello) -> pb.Welcome:
        with self._lock:
            info = self.state.agent_connected(hello, self.clock())
            log.info(
                "agent %s connected: %.2f cores, cgroup mode %s, counters %s%s",
                info.node_id,
                info.cpu_capacity_cores,
                pb.CgroupMode.Name(info.cgroup_mode),
                ",".join(info.counters_available) or "-",
                " (dry-run)" if info.dry_run else "",
            )
            self._update_agent_gauge()
            return pb.Welcome(epoch=self.epoch, slot_seconds=self.config.slot_seconds)

    def on_disconnect(self, node_id: str) -> None:
        with self._lock:
            self.state.agent_disconnected(node_id)
            self._update_agent_gauge()
            log.info("agent %s disconnected", node_id)

    def on_report(self, report: pb.NodeReport) -> None:
        with self._lock:
            self.metrics.reports.inc()
            res = self.state.ingest(report, self.clock())
            for reason, n in res.rejected.items():
                self.metrics.rejected.labels(reason).inc(n)

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
        self.metrics.agents_connected.set(sum(1 for a in self.state.agents.values() if a.connected))

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
        return previous

    def set_qos(self, app: str, qos_class: str) -> bool:
        """Assign a class; True when the app is known. ValueError for a bad class/name."""
        with self._lock:
            self.qos.set(app, qos_class, self.clock())
            known = app in self.state.topologies
        log.info("qos %s -> %s%s", app, qos_class, "" if known else " (held until it appears)")
        return known

    def list_qos(self):
        with self._lock:
            return self.qos.assignments(self.state.topologies)

    def explain(self, app: str, epochs: int) -> list[dict[str, Any]]:
        return self.store.decisions(max(1, epochs))

    def status(self) -> pb.StatusReply:
        with self._lock:
            now = self.clock()
            agents = [
                pb.AgentStatus(
                    node_id=a.node_id,
                    cpu_capacity_cores=a.cpu_capacity_cores,
                    cgroup_mode=a.cgroup_mode,
                    instances=sum(1 for h in self.state.histories.values() if h.node == a.node_id),
                    last_report_age_seconds=(now - a.last_report_at) if a.last_report_at else -1,
                    counters_available=list(a.counters_available),
                    dry_run=a.dry_run,
                )
                for a in sorted(self.state.agents.values(), key=lambda a: a.node_id)
                if a.connected
            ]
            return pb.StatusReply(
                mode=MODE_TO_PB[self.mode],
                epoch=self.epoch,
                agents=agents,
                applications=len(self.state.topologies),
                instances=len(self.state.histories),
                slot_seconds=self.config.slot_seconds,
                version=__version__,
                uptime_seconds=now - self.started_at,
            )

    # ------------------------------------------------------------ the epoch
    def run_epoch(self) -> dict[str, Any]:
        """One pass of DESIGN §4 steps 1–8; returns the decision record."""
        t0 = time.perf_counter()
        cpu0 = time.thread_time()
        with self._lock:
            now = self.clock()
            self.epoch += 1
            cfg = self.config
            self.state.forget_vanished(now)
            views = pipeline.evaluate(self.state, cfg.phi)
            if self.history is not None:
                self.history.seed(views, self.sources, self._kappa)
            t_forecast = time.perf_counter()
            forecasts = pipeline.forecast(views, cfg.phi, self.sources, self._kappa)
            t_demand = time.perf_counter()
            if self.sources is not None:
                self.sources.forget_except(set(views))
            apps = sorted({k.app for k in views})
            classes = {a: self.qos.class_of(a) for a in apps}
            budgets = latency_budgets(
                views, forecasts, {a: c.target_seconds for a, c in classes.items()}
            )
            needs = latency_needs(views, forecasts, budgets, cfg.arrival_scv, cfg.service_scv)
            estimator = build_estimator(cfg, needs)
            demands: dict[InstanceKey, pipeline.InstanceDemand] = {}
            for op, view in views.items():
                demands.update(estimator.estimate(view, forecasts[op]))
            capacity = self.node_capacity()
            models = (
                app_latency_models(
                    views, forecasts, demands, cfg.min_cap_cores, cfg.arrival_scv, cfg.service_scv
                )
                if cfg.dp_value == "latency"
                else None
            )
            t_alloc = time.perf_counter()
            alloc = self.allocator.allocate(demands, capacity, classes, models)
            self.metrics.allocation_duration.observe(time.perf_counter() - t_alloc)
            if alloc.dp is not None:
                self.metrics.dp_duration.observe(alloc.dp.seconds)
            max_cap = {k: capacity.get(d.node, float("inf")) for k, d in demands.items()}
            t_hyst = time.perf_counter()
            steps = pipeline.apply_hysteresis(
                alloc, self._hysteresis, cfg.theta_cores, max_cap, forget=False
            )
            self._unhold(steps)
            room = {n: max(0.0, c - cfg.headroom_cores) for n, c in capacity.items()}
            steps = pipeline.fit_quantized_caps(
                steps,
                self._hysteresis,
                alloc.cores,
                {k: d.node for k, d in demands.items()},
                {k: classes[k.app].weight for k in steps},
                room,
                cfg.min_cap_cores,
            )
            caps = {k: (demands[k].node, s.cap) for k, s in steps.items()}
            t_act = time.perf_counter()
            cpu_compute = time.thread_time() - cpu0
            caps_by_node: dict[str, dict[InstanceKey, float]] = {}
            for k, (node, c) in caps.items():
                caps_by_node.setdefault(node, {})[k] = c
            actuator = AgentActuator(self.sessions) if self.mode == "enforce" else LogOnlyActuator()
            acted = actuator.push_caps(self.epoch, caps_by_node, f"epoch {self.epoch}")
            if acted.sent:
                self.metrics.directives.inc(len(acted.sent))
            estimates = estimate_latency_seconds(
                views,
                forecasts,
                {k: c for k, (_, c) in caps.items()},
                cfg.arrival_scv,
                cfg.service_scv,
            )
            predicted_violation = {
                a: float(violation_ratio([estimates[a]], classes[a].target_seconds)[0])
                for a in apps
            }
            self._caps = {**self._still_held(caps), **caps}
            for gone in set(self._hysteresis) - set(self._caps):
                del self._hysteresis[gone]
            rejected = dict(self.state.rejected)
            new_rejections = {r: n - self._rejected_seen.get(r, 0) for r, n in rejected.items()}
            self._rejected_seen = rejected
            t_record = time.perf_counter()
            record = build_record(
                epoch=self.epoch,
                now=now,
                mode=self.mode,
                slot_seconds=cfg.slot_seconds,
                views=views,
                forecasts=forecasts,
                demands=demands,
                alloc=alloc,
                steps=steps,
                classes=classes,
                budgets=budgets,
                estimates=estimates,
                predicted_violation=predicted_violation,
                capacity=capacity,
                room=room,
                placement={"strategy": cfg.placement, "overflow_cores": dict(alloc.overflow)},
                actuator=actuator.name,
                acted=acted,
                rejected={r: n for r, n in new_rejections.items() if n},
            )
            record["placement"].update(self._place(record, capacity))
            for row in record["apps"]:
                if row["violation"]:
                    self.metrics.qos_violations.labels(row["app"], row["class"]).inc()
            self.last_record = record
            if self.history is not None:
                self.history.spool(
                    self.epoch, now, self.state, {"epoch": self.epoch, "apps": record["apps"]}
                )
            self.store.save_caps(self.epoch, self._caps)
            self.store.record_decision(self.epoch, now, self.mode, record)
            rec = alloc.recommendation
            if rec is not None and rec.nodes_delta:
                self.store.record_recommendation(
                    self.epoch, now, rec.nodes_delta, rec.gain, rec.reason
                )
            self.metrics.epoch.set(self.epoch)
        t_end = time.perf_counter()
        # Where an epoch's time goes (the controller-scale benchmark reads it).
        self.last_timing = {
            "evaluate": t_forecast - t0,
            "forecast": t_demand - t_forecast,
            "demand": t_alloc - t_demand,
            "allocate": t_hyst - t_alloc,
            "hysteresis": t_act - t_hyst,
            "act_and_estimate": t_record - t_act,
            "record_and_store": t_end - t_record,
            "compute": t_act - t0,
            # CPU time of the compute on this thread: what the epoch costs on an
            # idle core, whatever else the machine is running.
            "compute_cpu": cpu_compute,
            "epoch_cpu": time.thread_time() - cpu0,
        }
        self.metrics.epoch_duration.observe(t_end - t0)
        return record

    def node_capacity(self) -> dict[str, float]:
        """Cores dsched may hand out per node: the agent's report, capped by config."""
        reported = self.state.node_capacity()
        limits = self.config.node_capacity_cores
        return {n: min(c, limits.get(n, c)) for n, c in reported.items()}

    def _place(self, record: dict[str, Any], capacity: dict[str, float]) -> dict[str, Any]:
        """DESIGN §4 step 7, off the fast loop. Planning at cluster size and moving
        instances take longer than a slot, so the epoch only hands a snapshot to
        the placement thread (when it is idle) and reports the last plan that
        finished. Until instances have moved, the overflow stays cut by weight."""
        if self._placer is None:
            return {"planned": False}
        # Every epoch, planned or not, so a peak covers consecutive epochs.
        self._peaks.annotate(record["instances"])
        done, self._placement_done = self._placement_done, None
        busy = self._placement_job is not None and not self._placement_job.done()
        settling = [] if busy else self._still_settling(record)
        if not busy and not settling:
            snapshot = (
                record,
                capacity,
                current_from_histories(self.state.histories),
                dags_from_topologies(self.state.topologies),
                self.mode,
                self.epoch,
            )
            self._placement_job = self._placement_pool.submit(self._plan_and_move, *snapshot)
        out: dict[str, Any] = {"planned": False, "in_progress": busy}
        if settling:
            out["awaiting_moved"] = settling
        if done is not None:
            out.update(done)
        return out

    def _still_settling(self, record: dict[str, Any]) -> list[str]:
        """Moved instances not yet reported on their new node (none after
        ``forget_after_slots`` epochs: by then a missing report is news too)."""
        if not self._settling:
            return []
        if self.epoch - self._settling_since > self.config.forget_after_slots:
            log.warning(
                "moved instances not reported on their new node after %d epochs: %s",
                self.config.forget_after_slots,
                ", ".join(sorted(self._settling)),
            )
            self._settling = {}
            return []
        where = {
            f"{i['app']}/{i['operator']}/{i['instance']}": i["node"] for i in record["instances"]
        }
        pending = sorted(i for i, node in self._settling.items() if where.get(i) != node)
        if not pending:
            self._settling = {}
        return pending

    def _plan_and_move(self, record, capacity, current, dags, mode, epoch) -> None:
        try:
            plan = plan_placement(
                record,
                capacity=capacity,
                current=current,
                strategy=self._placer,
                headroom_cores=self.config.headroom_cores,
                dags=dags,
            )
        except ValueError as exc:
            log.error("epoch %d: no placement plan: %s", epoch, exc)
            self._placement_done = {"planned": False, "error": str(exc), "epoch": epoch}
            return
        if plan is None:
            return
        mover = self._mover if mode == "enforce" else LogOnlyMoveActuator()
        try:
            result = mover.execute(plan).to_dict()
        except (OSError, ValueError, RuntimeError) as exc:
            # A failed move leaves every instance where it was (the actuator
            # rolls back); the next plan starts from what is measured then.
            log.error("moves planned in epoch %d failed: %s", epoch, exc)
            result = {"error": str(exc)}
        done = set(result.get("moved", ())) | set(result.get("restarted", ()))
        # Set before _placement_done: the epoch reads it only once this job is over.
        self._settling = {m.instance: m.to_node for m in plan.moves if m.instance in done}
        self._settling_since = epoch
        self._placement_done = {
            "planned": True,
            "epoch": epoch,
            **placement_summary(plan),
            "actuator": mover.name,
            "result": result,
        }

    def wait_placement(self, timeout: float = 30.0) -> bool:
        """Block until the placement thread is idle (tests, shutdown)."""
        job = self._placement_job
        if job is None:
            return True
        try:
            job.result(timeout=timeout)
        except TimeoutError:
            return False
        return True

    def _unhold(self, steps) -> None:
        if not self._held:
            return
        for k in steps:
            self._held.pop(k, None)

    def _still_held(
        self, current: dict[InstanceKey, tuple[str, float]]
    ) -> dict[InstanceKey, tuple[str, float]]:
        keep = {}
        for k, value in self._caps.items():
            if k in current:
                continue
            since = self._held.setdefault(k, self.epoch)
            if self.epoch - since < self.config.forget_after_slots:
                keep[k] = value
            else:
                self._held.pop(k, None)
        return keep

    # ------------------------------------------------------------ lifecycle
    def start(self, serve_metrics: bool = True) -> None:
        if serve_metrics:
            self.metrics.serve(self.config.metrics)
        if self.history is not None:
            self.history.start_job()
        self._thread = threading.Thread(target=self._loop, name="dsched-epochs", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        period = self.config.slot_seconds
        next_at = time.monotonic() + period
        while not self._stop.wait(max(0.0, next_at - time.monotonic())):
            next_at += period
            try:
                self.run_epoch()
            except Exception:
                # One bad epoch must not stop the controller; the next one retries.
                log.exception("epoch %d failed", self.epoch)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.wait_placement()
        self._placement_pool.shutdown(wait=True)
        self.metrics.stop()
        if self.history is not None:
            self.history.stop()
        self.store.close()
