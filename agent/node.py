"""The agent's state machine: instances, caps, samples, reports, directives, lease.

:class:`NodeAgent` holds no sockets itself. The registration server, the
controller link and the daemon loop call into it:

- ``register / update / unregister`` from instances (checked, counted);
- ``sample()`` every ``sample_seconds`` (per-thread CPU, dead threads, cgroups);
- ``report()`` every ``slot_seconds`` (one NodeReport);
- ``hello() / handle_directive() / on_contact()`` from the link;
- ``check_lease()`` every slot: after ``lease_epochs`` silent slots the
  fallback policy is applied once (``hold`` keeps caps, ``release`` removes them).
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent import __version__
from agent.cgroups import CgroupError, CgroupTree, ThreadGone, make_backend
from agent.config import AgentConfig
from agent.metrics import AgentMetrics
from agent.registry import InstanceKey, InstanceRecord, RegistrationError, Registry, make_key
from agent.sampling import (
    NetlinkInterfaces,
    NodeCpu,
    Resctrl,
    ThreadCpuReader,
    read_pressure,
    thread_alive,
    thread_group,
)
from dsched.names import InvalidName
from dsched_pb import dsched_pb2 as pb

log = logging.getLogger(__name__)

CGROUP_MODE_PB = {"v1": pb.CGROUP_V1, "v2": pb.CGROUP_V2, "none": pb.CGROUP_NONE}


@dataclass
class InstanceCpu:
    """Cumulative CPU of an instance's threads, kept monotonic when threads exit."""

    per_tid: dict[int, float] = field(default_factory=dict)
    exited_seconds: float = 0.0
    at_slot_start: float = 0.0
    slot_started: float = 0.0
    at_last_sample: float = 0.0
    usage_cores: float = 0.0
    # A flag, not at_last_sample != 0: a thread may well have used no CPU yet.
    sampled: bool = False

    @property
    def total(self) -> float:
        return self.exited_seconds + sum(self.per_tid.values())

    def keep_only(self, tids: set[int]) -> None:
        """Fold threads that left the instance into ``exited_seconds`` (stays monotonic)."""
        for tid in [t for t in self.per_tid if t not in tids]:
            self.exited_seconds += self.per_tid.pop(tid)


@dataclass(slots=True)
class SampledInstance:
    """What one sampling pass needs of an instance; rebuilt only when threads change."""

    key: InstanceKey
    pid: int
    threads: tuple[tuple[int, int], ...]  # (tid, kept-open stat fd; -1 if already gone)
    labels: tuple[str, str, str, str]
    cpu: InstanceCpu


class NodeAgent:
    def __init__(
        self,
        config: AgentConfig,
        metrics: AgentMetrics | None = None,
        backend: CgroupTree | None = None,
    ):
        self.config = config
        self.metrics = metrics or AgentMetrics()
        if backend is None:
            backend, why = make_backend(
                config.cgroup_mode,
                config.cgroup_mount,
                config.cgroup_root,
                config.cpu_period_us,
                config.dry_run,
            )
            log.info("enforcement: %s", why)
        self.backend = backend
        self.registry = Registry()
        self.node_cpu = NodeCpu()
        self.capacity_cores = self.node_cpu.capacity_cores
        if config.capacity_cores > 0:
            if config.capacity_cores > self.capacity_cores:
                log.warning(
                    "capacity_cores %.2f exceeds the node's %.0f CPUs; using %.0f",
                    config.capacity_cores,
                    self.capacity_cores,
                    self.capacity_cores,
                )
            self.capacity_cores = min(config.capacity_cores, self.capacity_cores)
            try:
                self.backend.limit_root(self.capacity_cores)
            except (OSError, CgroupError) as exc:
                log.error("cannot cap the cgroup root at %.2f cores: %s", self.capacity_cores, exc)
        self._weights_written: dict[Path, int] = {}
        self.net = NetlinkInterfaces()
        self.thread_cpu = ThreadCpuReader(config.proc_root)
        self.resctrl = Resctrl(config.resctrl_mount, writable=not config.dry_run)
        self._lock = threading.RLock()
        self.caps: dict[InstanceKey, float] = {}
        self.cgroups: dict[InstanceKey, Path] = {}
        self._attached: dict[InstanceKey, set[int]] = {}
        self._cpu: dict[InstanceKey, InstanceCpu] = {}
        self._orphans: set[Path] = set()
        self._cap_labels: dict[InstanceKey, tuple[str, str, str, str]] = {}
        self._plan: list[SampledInstance] = []
        self._plan_generation = -1
        self.metrics.instance_cpu_usage.source = self._usage_by_instance
        self.last_applied_epoch: int | None = None
        self.last_contact = time.monotonic()
        self.fallback_applied = False
        self.slot = 0
        self._slot_started = time.monotonic()
        self._last_sample = self._slot_started
        self.adopt()

    # ------------------------------------------------------------ instances

    def adopt(self) -> int:
        """Take over the cgroups a previous agent left: caps stay, empty ones go."""
        adopted = 0
        for cg in self.backend.adopt():
            live = [t for t in cg.tids if thread_group(self.config.proc_root, t) is not None]
            pid = thread_group(self.config.proc_root, live[0]) if live else None
            if pid is None:
                if self.backend.remove(cg.path):
                    self.metrics.cgroups_removed.inc()
                continue
            for tid in live:
                self.registry.register(cg.key, cg.worker, False, pid, tid, source="adopted")
            with self._lock:
                self.cgroups[cg.key] = cg.path
                self._attached[cg.key] = set(live)
                if cg.cap_cores is not None:
                    self.caps[cg.key] = cg.cap_cores
            adopted += 1
        if adopted:
            log.info("re-adopted %d instance cgroups under %s", adopted, self.backend.root)
        self._refresh_gauges()
        return adopted

    def _reject(self, exc: RegistrationError) -> None:
        self.metrics.rejected_messages.labels(exc.reason).inc()
        log.warning("refused instance message (%s): %s", exc.reason, exc)

    def register(
        self,
        app: Any,
        operator: Any,
        instance: Any,
        worker: Any,
        stateful: Any,
        pid: Any,
        tid: Any,
        source: str = "registration",
        upstream: Any = (),
    ) -> InstanceRecord:
        try:
            key = make_key(app, operator, instance)
            if (
                not isinstance(pid, int)
                or not isinstance(tid, int)
                or not thread_alive(self.config.proc_root, pid, tid)
            ):
                raise RegistrationError(
                    "no_such_thread", f"thread {tid} of process {pid} does not exist"
                )
            rec = self.registry.register(key, worker, stateful, pid, tid, source, upstream)
        except RegistrationError as exc:
            self._reject(exc)
            raise
        self._refresh_gauges()
        return rec

    def update(self, app: Any, operator: Any, instance: Any, counters: dict[str, Any]) -> None:
        """New cumulative counters; ``counters`` may be the whole wire message (extra keys
        are ignored)."""
        try:
            self.registry.update_named(app, operator, instance, counters)
        except RegistrationError as exc:
            self._reject(exc)
            raise

    def update_many(self, items: list[Any]) -> list[tuple[int, RegistrationError]]:
        """Apply a batch of updates, each a dict with ``app``, ``operator``, ``instance`` and
        the counters. A refused item is counted and reported by its index; the others
        still apply."""
        refused = self.registry.update_many(items)
        for _index, exc in refused:
            self._reject(exc)
        return refused

    def unregister(self, app: Any, operator: Any, instance: Any) -> None:
        try:
            key = make_key(app, operator, instance)
        except RegistrationError as exc:
            self._reject(exc)
            raise
        self._forget(key, release=True)

    def _forget(self, key: InstanceKey, release: bool) -> None:
        rec = self.registry.unregister(key)
        with self._lock:
            path = self.cgroups.pop(key, None)
            self.caps.pop(key, None)
            self._attached.pop(key, None)
            self._cpu.pop(key, None)
            self._cap_labels.pop(key, None)
        if path is not None:
            if release:
                self._write_cap(path, None)
            if self.backend.remove(path):
                self.metrics.cgroups_removed.inc()
            else:
                # Threads still inside: retried every sample until they exit.
                self._orphans.add(path)
        if rec is not None:
            self.metrics.forget_instance((key.app, key.operator, str(key.instance), rec.worker))
        self._refresh_gauges()

    def _refresh_gauges(self) -> None:
        self.metrics.instances_managed.set(len(self.registry))
        self.metrics.threads_managed.set(self.registry.thread_count())

    # ------------------------------------------------------------ caps

    def _write_cap(self, path: Path, cap: float | None) -> None:
        self.backend.set_cap(path, cap)
        self.metrics.cap_writes.inc()

    def _attach(self, rec: InstanceRecord, path: Path) -> set[int]:
        """Move the instance's threads into its cgroup; vanished ones are skipped quietly."""
        attached = self._attached.setdefault(rec.key, set())
        for tid in sorted(rec.tids - attached):
            try:
                self.backend.attach(path, rec.pid, tid)
                attached.add(tid)
            except ThreadGone:
                self.metrics.threads_vanished.inc()
                log.debug("thread %d of %s exited before it was capped", tid, rec.key)
        return attached

    def apply_cap(self, rec: InstanceRecord, cap: float | None) -> None:
        """Enforce ``cap`` cores on ``rec`` (None removes the cap). Raises ThreadGone/CgroupError."""
        key = rec.key
        with self._lock:
            path = self.cgroups.get(key)
            if cap is None:
                self.caps.pop(key, None)
                if path is not None:
                    self._write_cap(path, None)
                if self._cap_labels.pop(key, None) is not None:
                    self.metrics.instance_cpu_cap.remove(*self._labels(rec))
                return
            if path is None:
                path = self.backend.create(key, rec.worker, rec.pid)
                self.cgroups[key] = path
            attached = self._attach(rec, path)
            if not attached and self.backend.mode != "none":
                self.cgroups.pop(key, None)
                self._attached.pop(key, None)
                if self.backend.remove(path):
                    self.metrics.cgroups_removed.inc()
                raise ThreadGone(f"every thread of {key} exited before its cap was written")
            self._write_cap(path, cap)
            self.caps[key] = cap
            if not self.config.dry_run:
                self.metrics.instance_cpu_cap.labels(*self._labels(rec)).set(cap)
                self._cap_labels[key] = self._labels(rec)

    @staticmethod
    def _labels(rec: InstanceRecord) -> tuple[str, str, str, str]:
        return (rec.key.app, rec.key.operator, str(rec.key.instance), rec.worker)

    def handle_directive(self, directive: pb.CapDirective) -> pb.Ack:
        """Apply one CapDirective; every refused entry gets a reason in the Ack."""
        self.on_contact()
        ack = pb.Ack(epoch=directive.epoch)
        with self._lock:
            if self.last_applied_epoch is not None and directive.epoch < self.last_applied_epoch:
                ack.stale = True
                self.metrics.rejected_directives.labels("stale_epoch").inc()
                log.warning(
                    "ignored directive of epoch %d: epoch %d was already applied",
                    directive.epoch,
                    self.last_applied_epoch,
                )
                return ack
            for entry in directive.caps:
                reason = self._apply_entry(entry)
                if reason is None:
                    ack.applied += 1
                else:
                    self.metrics.rejected_directives.labels(reason).inc()
                    ack.rejected.append(pb.Rejection(key=entry.key, reason=reason))
                    log.warning(
                        "refused cap %r for %s/%s/%d: %s",
                        entry.cap_cores,
                        entry.key.app,
                        entry.key.operator,
                        entry.key.instance,
                        reason,
                    )
            self.last_applied_epoch = directive.epoch
            self._rebalance_weights()
        return ack

    def _rebalance_weights(self) -> None:
        """Keep each cgroup's scheduling weight equal to the threads inside it."""
        threads = {path: len(self._attached.get(key, ())) for key, path in self.cgroups.items()}
        wanted = self.backend.weights(threads)
        for path, n in sorted(wanted.items(), key=lambda kv: len(kv[0].parts)):
            if self._weights_written.get(path) == n:
                continue
            try:
                self.backend.set_weight(path, n)
                self._weights_written[path] = n
            except (OSError, CgroupError, InvalidName) as exc:
                log.debug("weight of %s not set: %s", path, exc)
        for gone in set(self._weights_written) - set(wanted):
            del self._weights_written[gone]

    def _apply_entry(self, entry: pb.InstanceCap) -> str | None:
        try:
            key = make_key(entry.key.app, entry.key.operator, entry.key.instance)
        except RegistrationError:
            return "unknown_instance"
        rec = self.registry.get(key)
        if rec is None:
            return "unknown_instance"
        cap = entry.cap_cores
        if not math.isfinite(cap) or cap < 0 or cap > self.capacity_cores:
            return "cap_out_of_bounds"
        try:
            self.apply_cap(rec, None if cap == 0 else cap)
        except ThreadGone:
            return "thread_gone"
        except (CgroupError, InvalidName) as exc:
            self.metrics.cgroup_errors.inc()
            log.error("cap for %s failed: %s", key, exc)
            return "cgroup_error"
        return None

    # ------------------------------------------------------------ lease

    def on_contact(self, welcome: pb.Welcome | None = None) -> None:
        with self._lock:
            self.last_contact = time.monotonic()
            if self.fallback_applied:
                log.info("controller is back; fallback ends")
            self.fallback_applied = False
            if welcome is not None and self.last_applied_epoch is not None:
                if welcome.epoch < self.last_applied_epoch:
                    # The controller lost its epoch counter: follow its numbering
                    # instead of refusing every directive from now on.
                    log.warning(
                        "controller restarted at epoch %d below our last applied %d; following it",
                        welcome.epoch,
                        self.last_applied_epoch,
                    )
                    self.last_applied_epoch = welcome.epoch

    def check_lease(self, now: float | None = None) -> bool:
        """Apply the fallback once when the controller has been silent too long; True if applied now."""
        now = time.monotonic() if now is None else now
        lease = self.config.lease_epochs * self.config.slot_seconds
        with self._lock:
            if self.fallback_applied or now - self.last_contact < lease:
                return False
            self.fallback_applied = True
            policy = self.config.fallback
            log.warning(
                "no word from the controller for %.0f s (%d slots): fallback '%s' (%d caps)",
                now - self.last_contact,
                self.config.lease_epochs,
                policy,
                len(self.caps),
            )
            self.metrics.fallbacks.labels(policy).inc()
            if policy == "release":
                for key in list(self.caps):
                    rec = self.registry.get(key)
                    if rec is None:
                        continue
                    try:
                        self.apply_cap(rec, None)
                    except CgroupError as exc:
                        self.metrics.cgroup_errors.inc()
                        log.error("releasing cap of %s failed: %s", key, exc)
            return True

    # ------------------------------------------------------------ sampling

    def sample(self) -> None:
        """One pass: per-thread CPU, dead threads and empty cgroups, new threads into cgroups.

        Per pass this reads each thread's stat once and nothing else per thread:
        the list of threads is rebuilt only after the registry changed.
        """
        started = time.monotonic()
        dt = started - self._last_sample
        self._last_sample = started
        # The innermost loop runs once per thread per sample: look-ups hoisted.
        pread, size, seconds_from = (
            os.pread,
            self.thread_cpu.read_bytes,
            self.thread_cpu.seconds_from,
        )
        lost_threads: list[tuple[SampledInstance, list[int]]] = []
        for inst in self._sampling_plan():
            cpu = inst.cpu
            per_tid = cpu.per_tid
            total = cpu.exited_seconds
            exited: list[int] | None = None
            for tid, fd in inst.threads:
                try:
                    seconds = seconds_from(pread(fd, size, 0))
                except (OSError, IndexError, ValueError):
                    # ESRCH (or fd -1, or nothing read): the thread has exited.
                    if exited is None:
                        exited = []
                    exited.append(tid)
                    continue
                per_tid[tid] = seconds
                total += seconds
            if exited is not None:
                for tid in exited:
                    last = per_tid.pop(tid, 0.0)
                    cpu.exited_seconds += last
                    total += last
                lost_threads.append((inst, exited))
            if cpu.sampled:
                if dt > 0:
                    cpu.usage_cores = max(0.0, (total - cpu.at_last_sample) / dt)
            else:
                cpu.at_slot_start, cpu.slot_started, cpu.sampled = total, started, True
            cpu.at_last_sample = total
        for inst, exited in lost_threads:
            for tid in exited:
                self.thread_cpu.forget(inst.pid, tid)
            live = {tid for tid, _fd in inst.threads}.difference(exited)
            # Either branch changes the registry's generation, so the next pass
            # rebuilds the plan before any closed descriptor could be read again.
            if live:
                self.registry.set_tids(inst.key, live)
            else:
                log.info("threads of %s are gone; forgetting it", inst.key)
                self._forget(inst.key, release=False)
        for path in list(self._orphans):
            if self.backend.remove(path):
                self._orphans.discard(path)
                self.metrics.cgroups_removed.inc()
        self._refresh_gauges()
        self.metrics.sample_duration.observe(time.monotonic() - started)

    def _sampling_plan(self) -> list[SampledInstance]:
        """The instances and threads to read, rebuilt only when the registry changed."""
        if self.registry.generation == self._plan_generation:
            return self._plan
        generation, records = self.registry.versioned_snapshot()
        plan = []
        for rec in records:
            cpu = self._cpu.get(rec.key)
            if cpu is None:
                cpu = self._cpu[rec.key] = InstanceCpu()
            cpu.keep_only(rec.tids)
            threads = tuple((tid, self.thread_cpu.open(rec.pid, tid)) for tid in sorted(rec.tids))
            plan.append(SampledInstance(rec.key, rec.pid, threads, self._labels(rec), cpu))
            self._attach_new_threads(rec)
        # Stat files of threads no longer managed are closed here, on the sampling
        # thread that owns the reader, never while a pass might read them.
        self.thread_cpu.retain({(i.pid, tid) for i in plan for tid, _fd in i.threads})
        self._plan, self._plan_generation = plan, generation
        return plan

    def _attach_new_threads(self, rec: InstanceRecord) -> None:
        """Threads that joined a capped instance go into its cgroup; departed ones are dropped."""
        with self._lock:
            path = self.cgroups.get(rec.key)
            if path is None or rec.key not in self.caps:
                return
            attached = self._attached.get(rec.key, set()) & rec.tids
            self._attached[rec.key] = attached
            if rec.tids - attached:
                self._attach(rec, path)

    def _usage_by_instance(self) -> list[tuple[tuple[str, str, str, str], float]]:
        # Instances forgotten since the plan was built are left out.
        return [
            (inst.labels, inst.cpu.usage_cores)
            for inst in self._plan
            if self._cpu.get(inst.key) is inst.cpu
        ]

    # ------------------------------------------------------------ reports

    def counters_available(self) -> list[str]:
        names = []
        if read_pressure() is not None:
            names.append("psi")
        if self.net.available:
            names.append("net_bytes")
        if self.resctrl.available:
            names += ["llc_occupancy", "memory_bandwidth"]
        if self.backend.mode != "none":
            names.append("throttling")
        return names

    def hello(self) -> pb.Hello:
        with self._lock:
            current = []
            for key, cap in sorted(self.caps.items()):
                current.append(
                    pb.InstanceCap(
                        key=pb.InstanceKey(
                            app=key.app, operator=key.operator, instance=key.instance
                        ),
                        cap_cores=cap,
                    )
                )
        return pb.Hello(
            node_id=self.config.node_id,
            cpu_capacity_cores=self.capacity_cores,
            cgroup_mode=CGROUP_MODE_PB[self.backend.mode],
            counters_available=self.counters_available(),
            agent_version=__version__,
            dry_run=self.config.dry_run,
            current_caps=current,
            slot_seconds=self.config.slot_seconds,
        )

    def report(self) -> pb.NodeReport:
        """The NodeReport for the slot that ends now; starts the next slot."""
        now = time.monotonic()
        elapsed = max(now - self._slot_started, 1e-9)
        self._slot_started = now
        self.slot += 1
        out = pb.NodeReport(
            node_id=self.config.node_id,
            slot=self.slot,
            timestamp=time.time(),
            slot_seconds=self.config.slot_seconds,
        )
        records = sorted(self.registry.snapshot(), key=lambda r: r.key)
        for rec in records:
            cpu = self._cpu.get(rec.key) or InstanceCpu()
            total = cpu.total
            # An instance first seen mid-slot is measured from its first sample.
            span = min(elapsed, now - cpu.slot_started) if cpu.slot_started else elapsed
            usage = (
                max(0.0, (total - cpu.at_slot_start) / span) if cpu.sampled and span > 0 else 0.0
            )
            cpu.at_slot_start, cpu.slot_started = total, now
            c = rec.counters
            # add() builds the sample in place; append() would copy it.
            sample = out.instances.add(
                key=pb.InstanceKey(
                    app=rec.key.app, operator=rec.key.operator, instance=rec.key.instance
                ),
                worker=rec.worker,
                stateful=rec.stateful,
                tids=sorted(rec.tids),
                pid=rec.pid,
                cpu_seconds_total=total,
                cpu_usage_cores=usage,
                received_total=c.received,
                executed_total=c.executed,
                emitted_total=c.emitted,
                queue_length=c.queue_length,
                latency_sum_seconds_total=c.latency_sum_seconds,
                latency_count_total=c.latency_count,
                service_seconds_total=c.service_seconds,
                upstream=list(rec.upstream),
            )
            with self._lock:
                cap = self.caps.get(rec.key)
                path = self.cgroups.get(rec.key)
            if cap is not None and not self.config.dry_run:
                sample.cap_cores = cap
            # Uncapped instances are not throttled: their cpu.stat is not read.
            if path is not None and cap is not None and self.backend.mode != "none":
                throttling = self.backend.throttling(path)
                if throttling is not None:
                    sample.periods_total = throttling.periods_total
                    sample.throttled_periods_total = throttling.throttled_periods_total
                    sample.throttled_seconds_total = throttling.throttled_seconds_total
        out.node.CopyFrom(self._node_sample(records))
        return out

    def _node_sample(self, records: list[InstanceRecord]) -> pb.NodeSample:
        import psutil

        node = pb.NodeSample(
            cpu_capacity_cores=self.capacity_cores,
            cpu_usage_cores=self.node_cpu.usage_cores(),
            memory_used_bytes=float(psutil.virtual_memory().used),
        )
        pressure = read_pressure()
        if pressure is not None:
            node.cpu_pressure.CopyFrom(
                pb.Pressure(
                    some_avg10=pressure.some_avg10,
                    some_avg60=pressure.some_avg60,
                    full_avg10=pressure.full_avg10,
                    full_avg60=pressure.full_avg60,
                )
            )
        for iface in self.net.read() or []:
            node.interfaces.append(
                pb.InterfaceBytes(
                    name=iface.name, rx_bytes_total=iface.rx_bytes, tx_bytes_total=iface.tx_bytes
                )
            )
        if self.resctrl.available:
            tids_by_app: dict[str, list[int]] = {}
            for rec in records:
                tids_by_app.setdefault(rec.key.app, []).extend(rec.tids)
            for app, tids in tids_by_app.items():
                self.resctrl.assign(app, tids)
            reading = self.resctrl.read(set(tids_by_app))
            if reading is not None:
                llc, bandwidth = reading
                node.llc_available = True
                node.memory_bandwidth_available = True
                node.llc_occupancy_bytes.update(llc)
                node.memory_bandwidth_bytes_per_second.update(bandwidth)
        return node

    def close(self) -> None:
        self.net.close()
        self.thread_cpu.close()
