"""The CPU sampler: what every instance's threads and the node used.

Every ``sample_seconds`` one pass reads each registered thread's CPU time with
one ``pread`` on a kept-open file and derives each instance's usage; once a
slot it closes the instance's slot for the report and takes the node's sample
(capacity, usage, memory, PSI, interface bytes, resctrl). The sampler writes
nothing: threads that exited are handed back to the caller, which updates the
registry and the cgroups. docs/agent.md, "Counters" and "Overhead", say what is
read and why it is read this way.

Files are opened by pid and tid number only when the list of threads is
rebuilt, and only after the process's start time was found to be the one its
record keeps: an instance whose pid now names another process is handed back
as gone, never read. A file once opened stays bound to its thread; after the
thread exits it fails to read, whatever the kernel does with the number.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field

import psutil

from agent.metrics import instance_labels
from agent.registry import InstanceRecord, Registry
from agent.sampling import (
    NetlinkInterfaces,
    NodeCpu,
    Resctrl,
    RootThreadsCpu,
    ThreadCpuReader,
    process_start_ticks,
    read_pressure,
)
from dsched.ids import InstanceKey
from dsched_pb import dsched_pb2 as pb

log = logging.getLogger(__name__)


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

    def end_slot(self, now: float, elapsed: float) -> tuple[float, float]:
        """(CPU seconds so far, mean cores over the slot that ends at ``now``); starts the next.

        An instance first seen mid-slot is measured from its first sample.
        """
        total = self.total
        span = min(elapsed, now - self.slot_started) if self.slot_started else elapsed
        usage = max(0.0, (total - self.at_slot_start) / span) if self.sampled and span > 0 else 0.0
        self.at_slot_start, self.slot_started = total, now
        return total, usage


@dataclass(slots=True)
class SampledInstance:
    """What one sampling pass needs of an instance; rebuilt only when threads change."""

    key: InstanceKey
    pid: int
    threads: tuple[tuple[int, int], ...]  # (tid, kept-open stat fd; -1 if already gone)
    labels: tuple[str, str, str, str]
    cpu: InstanceCpu


@dataclass(frozen=True)
class LostThreads:
    """Threads of an instance that exited during a pass; ``live`` empty: the instance is gone.

    ``exited`` names the threads themselves: by the time the caller acts, another
    unit (an engine's discovery) may have changed the instance's threads, and only
    these must leave it.

    ``stale``: (pid, start time) of a record whose pid names another process now
    (its start time differs): that process is gone, whatever threads the number
    shows. The caller forgets the instance if its record is still that one.
    """

    key: InstanceKey
    live: frozenset[int]
    exited: frozenset[int] = frozenset()
    stale: tuple[int, int] | None = None


@dataclass(frozen=True)
class SamplePass:
    """What a pass found that the caller must act on before the next pass.

    ``rebuilt``: the records the pass read, when the registry had changed since
    the previous one (their new threads belong in their cgroups); else empty.
    ``lost``: each must reach the registry (fewer threads, or the instance
    forgotten), which changes its generation, so the next pass rebuilds its
    view before a closed descriptor could be read again.
    """

    rebuilt: list[InstanceRecord]
    lost: list[LostThreads]


class CpuSampler:
    """Per-thread and per-instance CPU of the registry's instances, and the node's sample."""

    def __init__(
        self,
        registry: Registry,
        proc_root: str = "/proc",
        resctrl_mount: str = "/sys/fs/resctrl",
        resctrl_writable: bool = True,
        capacity_limit: float = 0.0,
        root_threads: RootThreadsCpu | None = None,
    ):
        self.registry = registry
        # node_cpu = "cgroup": the node's other CPU is its root's own threads';
        # None: the host's busy time less the instances'.
        self.root_threads = root_threads
        self.proc_root = proc_root
        self.thread_cpu = ThreadCpuReader(proc_root)
        self.node_cpu = NodeCpu()
        self.net = NetlinkInterfaces()
        self.resctrl = Resctrl(resctrl_mount, writable=resctrl_writable)
        self.capacity_cores = node_capacity(capacity_limit, self.node_cpu.capacity_cores)
        self._cpu: dict[InstanceKey, InstanceCpu] = {}
        self._plan: list[SampledInstance] = []
        self._plan_generation = -1
        self._last_sample = time.monotonic()

    def sample(self, started: float | None = None) -> SamplePass:
        """One pass: every thread's CPU time, each instance's usage since the last pass.

        Per pass this reads each thread's CPU-time file once and nothing else per
        thread: the list of threads is rebuilt only after the registry changed.
        """
        started = time.monotonic() if started is None else started
        dt = started - self._last_sample
        self._last_sample = started
        rebuilt, lost = self._rebuild_plan()
        # The innermost loop runs once per thread per sample: look-ups hoisted.
        pread, size, seconds_from = (
            os.pread,
            self.thread_cpu.read_bytes,
            self.thread_cpu.seconds_from,
        )
        lost_threads: list[tuple[SampledInstance, list[int]]] = []
        for inst in self._plan:
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
            live = frozenset(tid for tid, _fd in inst.threads).difference(exited)
            lost.append(LostThreads(inst.key, live, frozenset(exited)))
        return SamplePass(rebuilt, lost)

    def _rebuild_plan(self) -> tuple[list[InstanceRecord], list[LostThreads]]:
        """Rebuild the instances and threads to read if the registry changed.

        Returns the records read, and the instances whose pid names another
        process now (not read; handed back as gone).
        """
        if self.registry.generation == self._plan_generation:
            return [], []
        generation, records = self.registry.versioned_snapshot()
        # Each process's start time, read once per rebuild, before any of its files
        # is opened by number.
        started: dict[int, int | None] = {}
        stale: list[LostThreads] = []
        exited: set[InstanceKey] = set()
        for rec in records:
            if rec.start_time is None:
                continue
            if rec.pid not in started:
                started[rec.pid] = process_start_ticks(self.proc_root, rec.pid)
            now = started[rec.pid]
            if now is None:
                # Gone: nothing is opened under its pid, and its threads leave as exited.
                exited.add(rec.key)
            elif now != rec.start_time:
                stale.append(
                    LostThreads(
                        rec.key,
                        frozenset(),
                        frozenset(rec.tids),
                        stale=(rec.pid, rec.start_time),
                    )
                )
        if stale:
            gone = {lost.key for lost in stale}
            records = [rec for rec in records if rec.key not in gone]
            # Files kept open under such a pid may be the old process's (dead) ones.
            for pid in {lost.stale[0] for lost in stale if lost.stale is not None}:
                self.thread_cpu.forget_process(pid)
        plan = []
        for rec in records:
            cpu = self._cpu.get(rec.key)
            if cpu is None:
                cpu = self._cpu[rec.key] = InstanceCpu()
            cpu.keep_only(rec.tids)
            if rec.key in exited:
                threads = tuple((tid, -1) for tid in sorted(rec.tids))
            else:
                threads = tuple(
                    (tid, self.thread_cpu.open(rec.pid, tid)) for tid in sorted(rec.tids)
                )
            labels = instance_labels(rec.key, rec.worker)
            plan.append(SampledInstance(rec.key, rec.pid, threads, labels, cpu))
        # Stat files of threads no longer managed are closed here, on the sampling
        # thread that owns the reader, never while a pass might read them.
        self.thread_cpu.retain({(i.pid, tid) for i in plan for tid, _fd in i.threads})
        self._plan, self._plan_generation = plan, generation
        return records, stale

    def forget(self, key: InstanceKey) -> None:
        self._cpu.pop(key, None)

    def cpu_seconds(self, key: InstanceKey) -> float:
        """CPU seconds of the instance's threads so far, exited ones included (0 if unknown)."""
        cpu = self._cpu.get(key)
        return 0.0 if cpu is None else cpu.total

    def end_slot(self, key: InstanceKey, now: float, elapsed: float) -> tuple[float, float]:
        """(CPU seconds so far, mean cores over the slot) of one instance; see InstanceCpu."""
        cpu = self._cpu.get(key)
        return (0.0, 0.0) if cpu is None else cpu.end_slot(now, elapsed)

    def usage_by_instance(self) -> list[tuple[tuple[str, str, str, str], float]]:
        """(metric labels, cores over the last pass) per instance, read at scrape time."""
        # Instances forgotten since the plan was built are left out.
        return [
            (inst.labels, inst.cpu.usage_cores)
            for inst in self._plan
            if self._cpu.get(inst.key) is inst.cpu
        ]

    def counters_available(self) -> list[str]:
        """The node counters this kernel has (``Hello.counters_available``, cgroups aside)."""
        names = []
        if read_pressure() is not None:
            names.append("psi")
        if self.net.available:
            names.append("net_bytes")
        if self.resctrl.available:
            names += ["llc_occupancy", "memory_bandwidth"]
        return names

    def node_sample(
        self, records: list[InstanceRecord], instances_cores: float = 0.0
    ) -> pb.NodeSample:
        """The node's sample for the slot; ``instances_cores``: what its instances used."""
        if self.root_threads is None:
            usage = self.node_cpu.usage_cores()
            # The two windows end a few microseconds apart: never below zero.
            other = max(0.0, usage - instances_cores)
        else:
            other = self.root_threads.usage_cores()
            usage = instances_cores + other
        node = pb.NodeSample(
            cpu_capacity_cores=self.capacity_cores,
            cpu_usage_cores=usage,
            memory_used_bytes=float(psutil.virtual_memory().used),
            other_cpu_cores=other,
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
        if self.root_threads is not None:
            self.root_threads.close()


def node_capacity(configured: float, online: float) -> float:
    """The CPU the node offers: ``online`` CPUs, or ``configured`` (> 0) when smaller."""
    if configured <= 0:
        return online
    if configured > online:
        log.warning(
            "capacity_cores %.2f exceeds the node's %.0f CPUs; using %.0f",
            configured,
            online,
            online,
        )
    return min(configured, online)
