"""The controller's Prometheus metrics (`/metrics`, default 127.0.0.1:9708).

Per-instance and per-operator gauges are built at scrape time from the last
decision, so an instance that disappears also disappears from /metrics
instead of lingering with its last value.

An operator instance's number is the label ``instance_id``: ``instance`` is
Prometheus's own label for the scrape target, and a series' own ``instance``
would be stored as ``exported_instance``.

The QoS classes (target, violation bound, weight), the slot length, each
application's class and each node's capacity are exported too, so recording
rules and dashboards compare against the controller's own values instead of
copies of its configuration.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from controller.edges.engines import error_class
from dsched.config import parse_hostport
from dsched.engines import CounterReading

if TYPE_CHECKING:
    from controller.qos import QosConfig

INSTANCE_LABELS = ["app", "operator", "instance_id", "node"]


def _per_node(name: str, documentation: str, cores: dict[str, float]) -> GaugeMetricFamily:
    """A gauge family with one sample per node, in node order."""
    family = GaugeMetricFamily(name, documentation, labels=["node"])
    for node, value in sorted(cores.items()):
        family.add_metric([node], value)
    return family


class _DecisionCollector(Collector):
    def __init__(self, last_record: Callable[[], dict[str, Any] | None]):
        self._last_record = last_record

    def collect(self) -> Iterable[GaugeMetricFamily]:
        rec = self._last_record() or {}
        caps = GaugeMetricFamily(
            "dsched_instance_cpu_cap_cores",
            "CPU cap decided for an operator instance, cores",
            labels=INSTANCE_LABELS,
        )
        demand = GaugeMetricFamily(
            "dsched_instance_cpu_demand_cores",
            "CPU demand estimated for an operator instance, cores",
            labels=INSTANCE_LABELS,
        )
        for row in rec.get("instances", []):
            labels = [row["app"], row["operator"], str(row["instance"]), row["node"]]
            caps.add_metric(labels, row["cap_cores"])
            demand.add_metric(labels, row["demand_cores"])
        held = GaugeMetricFamily(
            "dsched_engine_instances_held",
            "Instances whose cap was held in the last epoch because their engine's "
            "counters were missing",
            labels=["engine"],
        )
        held_by_engine: dict[str, int] = {}
        for row in rec.get("held", []):
            held_by_engine[row["engine"]] = held_by_engine.get(row["engine"], 0) + 1
            if row["cap_cores"] is not None:
                labels = [row["app"], row["operator"], str(row["instance"]), row["node"]]
                caps.add_metric(labels, row["cap_cores"])
        for engine, n in sorted(held_by_engine.items()):
            held.add_metric([engine], n)
        rate = GaugeMetricFamily(
            "dsched_operator_predicted_rate_tuples_per_second",
            "Arrival rate predicted for the next slot",
            labels=["app", "operator"],
        )
        arrival = GaugeMetricFamily(
            "dsched_operator_arrival_rate_tuples_per_second",
            "Arrival rate measured over the last slot",
            labels=["app", "operator"],
        )
        for row in rec.get("operators", []):
            rate.add_metric([row["app"], row["operator"]], row["predicted_rate"])
            arrival.add_metric([row["app"], row["operator"]], row["arrival_rate"])
        app_demand = GaugeMetricFamily(
            "dsched_app_demand_cores",
            "CPU demand of an application, cores",
            labels=["app", "class"],
        )
        app_alloc = GaugeMetricFamily(
            "dsched_app_allocated_cores",
            "CPU allocated to an application after division and anti-saturation, cores",
            labels=["app", "class"],
        )
        app_latency = GaugeMetricFamily(
            "dsched_app_latency_estimate_seconds",
            "Allen-Cunneen critical-path latency of an application under its caps",
            labels=["app"],
        )
        for row in rec.get("apps", []):
            app_demand.add_metric([row["app"], row["class"]], row["demand_cores"])
            app_alloc.add_metric([row["app"], row["class"]], row["allocated_cores"])
            est = row.get("latency_estimate_ms")
            app_latency.add_metric([row["app"]], est / 1000.0 if est is not None else float("inf"))
        nodes = GaugeMetricFamily(
            "dsched_cluster_node_recommendation",
            "Recommended change of the node count: -1 remove one, 0 keep, +1 add one",
        )
        node_rec = rec.get("node_recommendation")
        nodes.add_metric([], node_rec["nodes_delta"] if node_rec else 0)
        app_class = GaugeMetricFamily(
            "dsched_app_qos_class",
            "1 for an application's QoS class in the last decision",
            labels=["app", "class"],
        )
        for row in rec.get("apps", []):
            app_class.add_metric([row["app"], row["class"]], 1)
        capacity = _per_node(
            "dsched_node_capacity_cores",
            "CPU capacity of a node in the last decision, cores",
            rec.get("capacity_cores", {}),
        )
        other = _per_node(
            "dsched_node_other_cpu_cores",
            "CPU a node's threads that are no instance's used (mean of its last phi reports), cores",
            rec.get("other_cpu_cores", {}),
        )
        yield from (caps, demand, held, rate, arrival, app_demand, app_alloc, app_latency, nodes)
        yield from (app_class, capacity, other)


class _SettingsCollector(Collector):
    """The QoS classes and the slot length: configuration, exported so that rules
    and dashboards need no copy of it.

    Without a configuration (a ControllerMetrics built bare), the classes and the
    slot come from the last decision: only the classes of its applications.
    """

    def __init__(
        self,
        last_record: Callable[[], dict[str, Any] | None],
        qos: QosConfig | None,
        slot_seconds: float | None,
    ):
        self._last_record = last_record
        self._qos = qos
        self._slot_seconds = slot_seconds

    def _classes(self) -> list[tuple[str, float, float, float]]:
        """``(name, target seconds, max violation ratio, weight)`` by name."""
        if self._qos is not None:
            return [
                (name, c.target_latency_ms / 1000.0, c.max_violation_ratio, c.weight)
                for name, c in sorted(self._qos.classes.items())
            ]
        rows = (self._last_record() or {}).get("apps", [])
        seen = {
            r["class"]: (r["class"], r["target_ms"] / 1000.0, r["max_violation_ratio"], r["weight"])
            for r in rows
        }
        return [seen[name] for name in sorted(seen)]

    def collect(self) -> Iterable[GaugeMetricFamily]:
        target = GaugeMetricFamily(
            "dsched_qos_class_target_latency_seconds",
            "Target mean end-to-end latency of a QoS class",
            labels=["class"],
        )
        bound = GaugeMetricFamily(
            "dsched_qos_class_max_violation_ratio",
            "Share of epochs a QoS class may spend over its latency target",
            labels=["class"],
        )
        weight = GaugeMetricFamily(
            "dsched_qos_class_weight",
            "Importance of a QoS class in the division of CPU when CPU is short",
            labels=["class"],
        )
        for name, target_s, ratio, w in self._classes():
            target.add_metric([name], target_s)
            bound.add_metric([name], ratio)
            weight.add_metric([name], w)
        yield from (target, bound, weight)
        slot = self._slot_seconds
        if slot is None:
            slot = (self._last_record() or {}).get("slot_seconds")
        if slot is not None:
            yield GaugeMetricFamily(
                "dsched_slot_seconds", "Length of a control slot (one epoch per slot)", value=slot
            )


class ControllerMetrics:
    def __init__(
        self,
        last_record: Callable[[], dict[str, Any] | None],
        qos: QosConfig | None = None,
        slot_seconds: float | None = None,
    ):
        self.registry = CollectorRegistry()
        r = self.registry
        self.agents_connected = Gauge(
            "dsched_agents_connected", "Agents with an open stream", registry=r
        )
        self.dry_run = Gauge(
            "dsched_dry_run", "1 while the controller only records decisions", registry=r
        )
        self.epoch = Gauge("dsched_controller_epoch", "Last control epoch", registry=r)
        self.epoch_duration = Histogram(
            "dsched_controller_epoch_duration_seconds",
            "Wall time of one control epoch's computation",
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=r,
        )
        self.dp_duration = Histogram(
            "dsched_controller_dp_duration_seconds",
            "Wall time of the QoS-weighted dynamic program in one epoch",
            buckets=(0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
            registry=r,
        )
        self.allocation_duration = Histogram(
            "dsched_controller_allocation_duration_seconds",
            "Wall time of the division of CPU (DP, shares, anti-saturation) in one epoch",
            buckets=(0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
            registry=r,
        )
        self.qos_violations = Counter(
            "dsched_app_qos_violations",
            "Epochs in which an application's measured latency exceeded its class target",
            ["app", "class"],
            registry=r,
        )
        self.agent_streams = Gauge(
            "dsched_agent_streams", "Agent streams open on the agents' door", registry=r
        )
        self.agent_refusals = Counter(
            "dsched_agent_refusals_total",
            "Agent streams refused, by reason: too_many_streams, no_hello, bad_hello, "
            "node_id_mismatch, duplicate_session, capacity_too_large",
            ["reason"],
            registry=r,
        )
        self.reports = Counter("dsched_reports_total", "NodeReports received", registry=r)
        self.rejected = Counter(
            "dsched_report_samples_rejected_total",
            "Report parts refused at ingest, by reason",
            ["reason"],
            registry=r,
        )
        self.directives = Counter("dsched_directives_sent_total", "CapDirectives sent", registry=r)
        self.directive_rejections = Counter(
            "dsched_directive_rejections_total",
            "Caps refused by agents, by reason",
            ["reason"],
            registry=r,
        )
        self.engine_up = Gauge(
            "dsched_engine_up",
            "1 when the engine's last counter read succeeded, 0 when it failed",
            ["engine"],
            registry=r,
        )
        self.engine_read_errors = Counter(
            "dsched_engine_read_errors_total",
            "Failed engine counter reads (whole reads and single jobs), by class: "
            "unreachable, http_error, bad_answer",
            ["engine", "reason"],
            registry=r,
        )
        self.engine_read_seconds = Histogram(
            "dsched_engine_read_seconds",
            "Wall time of one read of an engine's counters (every job, every vertex)",
            ["engine"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=r,
        )
        r.register(_DecisionCollector(last_record))
        r.register(_SettingsCollector(last_record, qos, slot_seconds))
        self._server = None

    def observe_engine_read(self, engine: str, reading: CounterReading, seconds: float) -> None:
        """One engine read finished (called on the engine's thread)."""
        self.engine_up.labels(engine).set(0 if reading.error else 1)
        self.engine_read_seconds.labels(engine).observe(seconds)
        reasons = [reading.error] if reading.error else list(reading.missing.values())
        for reason in reasons:
            kind = error_class(reason)
            if kind is not None:
                self.engine_read_errors.labels(engine, kind).inc()

    def serve(self, address: str) -> None:
        host, port = parse_hostport("metrics", address)
        self._server, _thread = start_http_server(port, addr=host, registry=self.registry)

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server = None
