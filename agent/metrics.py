"""Prometheus metrics of one agent, in its own registry (served on ``metrics``)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily

from dsched.config import parse_hostport
from dsched.ids import InstanceKey

# ``instance_id``, not ``instance``: Prometheus keeps ``instance`` for the scrape
# target and would store ours as ``exported_instance``.
INSTANCE_LABELS = ("app", "operator", "instance_id", "worker")


def instance_labels(key: InstanceKey, worker: str) -> tuple[str, str, str, str]:
    """Label values of an instance's series, in :data:`INSTANCE_LABELS` order."""
    return (key.app, key.operator, str(key.instance), worker)


UsageSource = Callable[[], Iterable[tuple[tuple[str, str, str, str], float]]]


class InstanceUsageCollector:
    """``dsched_instance_cpu_usage_cores``, read from the sampler's state at scrape time.

    Setting one labelled gauge per instance every sample would cost a lock and a
    lookup per instance each second; a scrape every 15 s or more reads the same
    numbers once.
    """

    name = "dsched_instance_cpu_usage_cores"
    documentation = "Mean CPU of the instance's threads over the last sample, cores"

    def __init__(self) -> None:
        self.source: UsageSource = tuple

    def describe(self) -> list[GaugeMetricFamily]:
        return [GaugeMetricFamily(self.name, self.documentation, labels=INSTANCE_LABELS)]

    def collect(self) -> Iterable[GaugeMetricFamily]:
        family = GaugeMetricFamily(self.name, self.documentation, labels=INSTANCE_LABELS)
        for labels, value in self.source():
            family.add_metric(labels, value)
        yield family


class AgentMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.threads_managed = Gauge(
            "dsched_agent_threads_managed",
            "OS threads the agent knows as instance threads",
            registry=r,
        )
        self.instances_managed = Gauge(
            "dsched_agent_instances_managed", "Operator instances the agent knows", registry=r
        )
        self.instance_cpu_usage = InstanceUsageCollector()
        r.register(self.instance_cpu_usage)
        self.instance_cpu_cap = Gauge(
            "dsched_agent_instance_cpu_cap_cores",
            "CPU cap the agent enforces on the instance, cores (absent when uncapped)",
            INSTANCE_LABELS,
            registry=r,
        )
        self.cap_writes = Counter(
            "dsched_agent_cap_writes", "Cap values written to cgroups", registry=r
        )
        self.cgroup_errors = Counter(
            "dsched_agent_cgroup_errors", "Cgroup writes that failed (not ESRCH)", registry=r
        )
        self.threads_vanished = Counter(
            "dsched_agent_threads_vanished",
            "Threads that exited between discovery and a cgroup write (ESRCH), skipped",
            registry=r,
        )
        self.cgroups_removed = Counter(
            "dsched_agent_cgroups_removed",
            "Instance cgroups removed because their threads were gone",
            registry=r,
        )
        self.pid_reused = Counter(
            "dsched_agent_pid_reused",
            "Instances forgotten because their process was gone and its pid named another "
            "process (a different start time); none of that process's threads were moved",
            registry=r,
        )
        self.rejected_directives = Counter(
            "dsched_agent_rejected_directives",
            "Directive entries refused, by reason",
            ("reason",),
            registry=r,
        )
        self.rejected_messages = Counter(
            "dsched_agent_rejected_instance_messages",
            "Registrations and counter updates from instances that were refused, by reason",
            ("reason",),
            registry=r,
        )
        self.registration_refused = Counter(
            "dsched_agent_registration_refused",
            "Socket operations refused because the peer's uid does not own the instance "
            "(not_owner) or the process it named (foreign_process), by op and reason",
            ("op", "reason"),
            registry=r,
        )
        self.instance_messages = Counter(
            "dsched_agent_instance_messages",
            "Messages read from the registration socket, by op (a batch counts once)",
            ("op",),
            registry=r,
        )
        self.reports_sent = Counter("dsched_agent_reports_sent", "NodeReports sent", registry=r)
        self.reports_dropped = Counter(
            "dsched_agent_reports_dropped",
            "Reports dropped because the disconnected buffer was full (oldest first)",
            registry=r,
        )
        self.reports_resent = Counter(
            "dsched_agent_reports_resent",
            "Reports sent again after their stream broke (the controller refuses copies it has)",
            registry=r,
        )
        self.reports_buffered = Gauge(
            "dsched_agent_reports_buffered", "Reports waiting to be resent", registry=r
        )
        self.connected = Gauge(
            "dsched_agent_connected", "1 while the stream to the controller is up", registry=r
        )
        self.reconnects = Counter(
            "dsched_agent_reconnects", "Stream (re)connections established", registry=r
        )
        self.refused = Counter(
            "dsched_agent_controller_refusals",
            "Hellos the controller refused, by gRPC status (a certificate that does not "
            "match node_id, a second session, capacity over the bound, stream limit)",
            ("code",),
            registry=r,
        )
        self.fallbacks = Counter(
            "dsched_agent_fallbacks",
            "Times the lease expired and the fallback policy was applied",
            ("policy",),
            registry=r,
        )
        self.sample_duration = Histogram(
            "dsched_agent_sample_duration_seconds",
            "Time one sampling pass takes",
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
            registry=r,
        )
        # Engines (agent/engines): labelled by the engine's name (its kind, made unique).
        self.engine_instances = Gauge(
            "dsched_agent_engine_instances",
            "Instances the engine's last available scan found on this node",
            ("engine",),
            registry=r,
        )
        self.engine_instances_found = Counter(
            "dsched_agent_engine_instances_found",
            "Instances an engine's scan registered (new, or back in a new process)",
            ("engine",),
            registry=r,
        )
        self.engine_unowned_threads = Counter(
            "dsched_agent_engine_unowned_threads",
            "Threads named like a subtask that no running managed job owns, summed over scans",
            ("engine",),
            registry=r,
        )
        self.engine_ambiguous_threads = Counter(
            "dsched_agent_engine_ambiguous_threads",
            "Threads whose names fit more than one job (left alone), summed over scans",
            ("engine",),
            registry=r,
        )
        self.engine_unavailable = Gauge(
            "dsched_agent_engine_unavailable",
            "1 while the engine's last scan could not map threads (instances kept as they were)",
            ("engine",),
            registry=r,
        )
        self.engine_directory_refreshes = Counter(
            "dsched_agent_engine_directory_refreshes",
            "Times the engine read its job directory from the cluster (e.g. Flink's REST API)",
            ("engine",),
            registry=r,
        )
        self.engine_scan_duration = Histogram(
            "dsched_agent_engine_scan_duration_seconds",
            "Time one engine scan takes (jcmd, the directory when read, applying the mapping)",
            ("engine",),
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
            registry=r,
        )
        self._server = None

    def forget_instance(self, labels: tuple[str, str, str, str]) -> None:
        try:
            self.instance_cpu_cap.remove(*labels)
        except KeyError:
            pass

    def serve(self, address: str) -> int:
        """Start /metrics on HOST:PORT (port 0 picks one); returns the bound port."""
        host, port = parse_hostport("metrics", address)
        server, _thread = start_http_server(port, host, registry=self.registry)
        self._server = server
        return server.server_port

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
