"""`dsched bench flink`: dsched against static caps on a real Apache Flink cluster.

One Flink 2.3.0 session cluster (``testbed.flink``: one JobManager, one
TaskManager) runs the testbed's DschedWordCount (Source -> Calc, the CPU:
chained SHA-256 per record -> GroupAggregate, stateful -> latency sink;
parallelism 2, chaining off, so 8 subtasks, each its own task thread). The same
rate trace (``testbed.flink.load.scenario_rates``, written by a ``TraceFeeder``)
is run once per contender, one after another, on that one job:

- ``dsched``: the real ``dsched-controller`` and ``dsched-agent`` (enforce mode,
  ``[[engine]] kind = "flink"``) drive the caps;
- ``static-0.7``: the testbed's capacity spread evenly over all subtasks,
  written once through the agent's own code (an in-process ``NodeAgent`` with
  the Flink engine's discovery, and one ``CapDirective``);
- ``equal``: static caps whose per-operator totals equal dsched's mean
  allocation in the same run (so ``dsched`` runs first);
- ``uncapped``: every subtask in the tree with no cap of its own (each capped at
  the whole capacity, which the tree's root quota enforces anyway).

A short uncapped calibration phase at a known rate first measures each
operator's CPU per record, which sets the trace's peak (or ``--peak-rate``).

JSON: ``scenario``, ``trace``, ``calibration``, ``contenders.<name>`` (CPU
allocated and used, records processed and lost, latency, backpressure, per-slot
series), ``ratios`` (dsched against each) and ``targets``.
docs/engines/flink-benchmark.md describes the method.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import re
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from agent.cgroups import CgroupTree, CgroupV1
from agent.config import AgentConfig, EngineConfig
from agent.engines import make_engines
from agent.engines.discovery import EngineDiscovery
from agent.engines.flink import group_threads
from agent.jvm import jcmd_threads
from agent.node import NodeAgent
from bench.common import print_contenders, reference_seconds, write_result
from bench.live import PEAK_SHARE, cluster_workdir, controller_config, thread_cpu_seconds
from dsched import signals
from dsched.engines.flink import FlinkJob
from dsched.engines.flink import FlinkRest as EngineRest
from dsched.ids import InstanceKey
from dsched_pb import dsched_pb2 as pb
from testbed.flink import install
from testbed.flink import metrics as fm
from testbed.flink.cluster import FlinkCluster
from testbed.flink.job import DEFAULT_ROUNDS, submit_wordcount
from testbed.flink.load import SCENARIOS, TraceFeeder, scenario_rates
from testbed.live.cluster import CGROUP_V1_CPU, LocalCluster, NodeSpec
from testbed.live.static import Reservation, Scale, static_caps

log = logging.getLogger(__name__)

CONTENDERS = ("dsched", "static-0.7", "equal", "uncapped")
JOB_NAME = "dsched-bench"
PARALLELISM = 2
NODE = "local"
# The sink flushes its latency file about once a second (DschedWordCount.java).
SINK_FLUSH_SECONDS = 1.0
# Flink's per-subtask metrics this benchmark reads each slot.
SUBTASK_METRICS = ("numRecordsIn", "accumulateBackPressuredTimeMs")
# An operator needing less CPU per record than this never sets the peak.
MIN_CPU_PER_RECORD = 1e-7


class Interrupted(signals.Interrupted):
    """SIGINT / SIGTERM arrived; the run stops everything it started."""


# ---------------------------------------------------------------- the trace


def trace_rates(
    scenario: str, peak: float, duration: float, trace_slot: float, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Records/s per trace slot (``scenario_rates``) and the levels as fractions of the peak."""
    slots = max(2, round(duration / trace_slot))
    levels = scenario_rates(scenario, 1.0, slots, seed)
    return levels * peak, levels


def feeder_rates(rates: np.ndarray, warm_slots: int) -> np.ndarray:
    """What the feeder writes: the first level for ``warm_slots`` slots, then the trace."""
    return np.concatenate([np.full(warm_slots, float(rates[0])), rates])


def peak_rate_from_calibration(
    cpu_per_record: Mapping[str, float],
    parallelism: Mapping[str, int],
    capacity_cores: float,
    subtasks: int,
) -> tuple[float, str]:
    """Records/s at which the busiest operator needs PEAK_SHARE of its static-0.7 caps;
    and that operator. static-0.7 gives every subtask ``capacity / subtasks``."""
    core_07 = capacity_cores / subtasks
    by_op = {
        op: parallelism[op] * core_07 / c
        for op, c in cpu_per_record.items()
        if c > MIN_CPU_PER_RECORD
    }
    if not by_op:
        raise RuntimeError(f"calibration measured no CPU per record: {dict(cpu_per_record)}")
    busiest = min(by_op, key=by_op.__getitem__)
    return PEAK_SHARE * by_op[busiest], busiest


# ---------------------------------------------------------------- samples


Ref = tuple[str, int]  # (operator, subtask index)


@dataclass
class Sample:
    """One reading, ``t`` seconds after the phase's feeder started."""

    t: float
    cpu: dict[Ref, float]  # cumulative CPU seconds of the subtask's threads (this phase)
    caps: dict[Ref, float | None]  # cap read from the subtask's cgroup, None: no cap
    records_in: dict[Ref, float]  # Flink's numRecordsIn
    backpressured_ms: dict[Ref, float]  # Flink's accumulateBackPressuredTimeMs
    written: int  # records the feeder had written
    taskmanager_cpu: float = 0.0  # cumulative CPU seconds of the whole TaskManager JVM
    threads_in_cgroups: int = 0


@dataclass
class PhaseData:
    """Everything one contender's phase measured; :func:`summarize` turns it into figures."""

    samples: list[Sample] = field(default_factory=list)
    # (seconds after the feeder started at which they were read, latencies ms)
    latencies: list[tuple[float, np.ndarray]] = field(default_factory=list)
    written: int = 0
    processed: int = 0
    drain_seconds: float = 0.0
    decisions: list[dict[str, Any]] = field(default_factory=list)
    t0_wall: float = 0.0
    sample_errors: int = 0  # samples that failed (a REST call timed out...) and were skipped


@dataclass(frozen=True)
class Window:
    start: float  # seconds after the feeder started: end of the warm-up
    end: float  # end of the trace
    slot: float  # series step

    @property
    def seconds(self) -> float:
        return self.end - self.start


# ---------------------------------------------------------------- figures (pure)


def _percentile(values: np.ndarray, q: float) -> float | None:
    if values.size == 0:
        return None
    return float(np.percentile(values, q))


def _round(x: float | None, digits: int = 3) -> float | None:
    return None if x is None or not math.isfinite(x) else round(float(x), digits)


def _at(samples: Sequence[Sample], t: float) -> Sample:
    """The first sample taken at or after ``t`` (the last one if none is)."""
    for s in samples:
        if s.t >= t - 1e-6:
            return s
    return samples[-1]


def measured_latencies(
    latencies: Sequence[tuple[float, np.ndarray]],
    warm_records: int,
    read_lag: float,
) -> tuple[np.ndarray, np.ndarray]:
    """The latencies (ms) of records written after the warm-up, and each one's
    estimated write time (seconds after the feeder started).

    The sink's files hold no timestamps: a value read at ``r`` was written by the
    sink within the last flush and sample period, ``read_lag`` seconds before on
    average, so its record was written by the feeder at about
    ``r - read_lag - latency``. Records are ordered by that estimate and the first
    ``warm_records`` (the feeder's exact count before the window) are dropped: the
    count is exact, only which records sit on the boundary is estimated.
    """
    if not latencies:
        return np.empty(0), np.empty(0)
    values = np.concatenate([v for _r, v in latencies]).astype(float)
    reads = np.concatenate([np.full(len(v), r) for r, v in latencies])
    written_at = reads - read_lag - values / 1000.0
    order = np.argsort(written_at, kind="stable")
    keep = order[max(0, warm_records) :]
    return values[keep], written_at[keep]


def charged_cap(cap: float | None, capacity_cores: float, share: float) -> tuple[float, bool]:
    """The cores a subtask is charged with, and whether it has a cap of its own: a
    cap below the capacity, else (no cgroup, or capped at the whole capacity) an
    equal share of the capacity."""
    if cap is not None and cap < capacity_cores - 1e-9:
        return cap, True
    return share, False


def summarize(
    data: PhaseData,
    window: Window,
    operators: Mapping[str, int],
    capacity_cores: float,
    read_lag: float = SINK_FLUSH_SECONDS / 2,
) -> dict[str, Any]:
    """A contender's figures over the measured window from its samples.

    ``operators``: operator -> parallelism. A subtask without a cap of its own (no
    cgroup, or a cap at the whole capacity) is charged an equal share of the
    capacity, as bench/live.py does; the total is never more than the capacity.
    """
    samples = data.samples
    refs = [(op, i) for op, n in operators.items() for i in range(n)]
    share = capacity_cores / len(refs)
    w0, w1 = window.start, window.end
    alloc_total = used_total = covered = 0.0
    alloc_by_op = dict.fromkeys(operators, 0.0)
    used_by_op = dict.fromkeys(operators, 0.0)
    threads = []
    capped_min: int | None = None
    for a, b in zip(samples, samples[1:], strict=False):
        lo, hi = max(a.t, w0), min(b.t, w1)
        if hi <= lo:
            continue
        dt = b.t - a.t
        part = hi - lo
        alloc_now = 0.0
        capped = 0
        for ref in refs:
            c, own = charged_cap(a.caps.get(ref), capacity_cores, share)
            capped += own
            alloc_now += c
            alloc_by_op[ref[0]] += c * part
            if ref in a.cpu and ref in b.cpu:
                use = max(0.0, b.cpu[ref] - a.cpu[ref]) / dt * part
                used_by_op[ref[0]] += use
                used_total += use
        alloc_total += min(alloc_now, capacity_cores) * part
        covered += part
        threads.append(a.threads_in_cgroups)
        capped_min = capped if capped_min is None else min(capped_min, capped)

    s0, s1 = _at(samples, w0), _at(samples, w1)
    agg_op = _aggregate_operator(operators)
    in_window = sum(
        s1.records_in.get((agg_op, i), 0.0) - s0.records_in.get((agg_op, i), 0.0)
        for i in range(operators[agg_op])
    )
    bp_by_op = {
        op: round(
            sum(
                max(
                    0.0,
                    s1.backpressured_ms.get((op, i), 0.0) - s0.backpressured_ms.get((op, i), 0.0),
                )
                for i in range(n)
            )
            / 1000.0,
            3,
        )
        for op, n in operators.items()
    }

    lat, written_at = measured_latencies(data.latencies, s0.written, read_lag)
    lost = max(0, data.written - data.processed)

    # Per-slot series, from the window's start.
    n_slots = max(1, math.ceil(window.seconds / window.slot - 1e-9))
    edges = w0 + window.slot * np.arange(n_slots + 1)
    slot_idx = np.clip(((written_at - w0) // window.slot).astype(int), 0, n_slots - 1)
    lat_sum = np.bincount(slot_idx, weights=lat, minlength=n_slots)
    lat_cnt = np.bincount(slot_idx, minlength=n_slots)
    series_ops: dict[str, dict[str, list]] = {
        op: {"cap_cores": [], "usage_cores": [], "demand_cores": []} for op in operators
    }
    rate, backpressure = [], []
    for k in range(n_slots):
        a, b = _at(samples, edges[k]), _at(samples, edges[k + 1])
        dt = b.t - a.t
        rate.append(round((b.written - a.written) / dt, 2) if dt > 0 else None)
        bp = sum(
            max(0.0, b.backpressured_ms.get(r, 0.0) - a.backpressured_ms.get(r, 0.0)) for r in refs
        )
        backpressure.append(round(bp / 1000.0 / dt, 3) if dt > 0 else None)
        for op, n in operators.items():
            charged = (charged_cap(a.caps.get((op, i)), capacity_cores, share)[0] for i in range(n))
            series_ops[op]["cap_cores"].append(round(sum(charged), 4))
            use = sum(max(0.0, b.cpu.get((op, i), 0.0) - a.cpu.get((op, i), 0.0)) for i in range(n))
            series_ops[op]["usage_cores"].append(round(use / dt, 4) if dt > 0 else None)
    for rec in data.decisions:
        t = rec.get("timestamp", 0.0) - data.t0_wall - w0
        if not 0 <= t <= window.seconds:
            continue
        for row in rec.get("operators", []):
            if row.get("operator") in series_ops:
                series_ops[row["operator"]]["demand_cores"].append(
                    [round(t, 2), round(float(row.get("demand_cores", 0.0)), 4)]
                )
    tm_cpu = s1.taskmanager_cpu - s0.taskmanager_cpu
    return {
        "cpu_allocated_core_seconds": round(alloc_total, 3),
        "cpu_used_core_seconds": round(used_total, 3),
        "cpu_window_seconds": round(covered, 3),
        "allocated_cores_mean_by_operator": {
            op: round(v / covered, 4) if covered else 0.0 for op, v in alloc_by_op.items()
        },
        "used_cores_mean_by_operator": {
            op: round(v / covered, 4) if covered else 0.0 for op, v in used_by_op.items()
        },
        # The whole TaskManager JVM: subtasks plus its own threads (GC, JIT, network),
        # which no contender caps.
        "taskmanager_cpu_core_seconds": round(tm_cpu, 3),
        "records_written": data.written,
        "records_processed": data.processed,
        "records_lost": lost,
        "records_duplicated": max(0, data.processed - data.written),
        "records_processed_in_window": int(in_window),
        "drain_seconds": round(data.drain_seconds, 2),
        "latency_ms_mean": _round(float(lat.mean()) if lat.size else None, 2),
        "latency_ms_p99": _round(_percentile(lat, 99), 2),
        "latency_ms_max": _round(float(lat.max()) if lat.size else None, 2),
        "latency_records": int(lat.size),
        "backpressured_seconds": round(sum(bp_by_op.values()), 3),
        "backpressured_seconds_by_operator": bp_by_op,
        "enforcement": {
            "subtasks_capped_min": capped_min or 0,
            "threads_in_cgroups_mean": round(float(np.mean(threads)), 2) if threads else 0.0,
        },
        "decisions": len(data.decisions),
        "sample_errors": data.sample_errors,
        "series": {
            "slot_seconds": window.slot,
            "time_s": [round(float(e - w0), 2) for e in edges[:-1]],
            "rate": rate,
            "latency_ms_mean": [
                round(float(s / c), 2) if c else None for s, c in zip(lat_sum, lat_cnt, strict=True)
            ],
            "backpressured_subtasks": backpressure,
            "operators": series_ops,
        },
    }


def _aggregate_operator(operators: Mapping[str, int]) -> str:
    """The stateful GROUP BY: where the loss check counts records (as testbed/flink does)."""
    for op in operators:
        if op.startswith(fm.AGGREGATE_PREFIX):
            return op
    raise LookupError(f"no {fm.AGGREGATE_PREFIX}* operator among {list(operators)}")


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return round(a / b, 4)


def ratios(contenders: Mapping[str, dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    """dsched / other for CPU allocated, throughput and latency (below 1: dsched's is lower)."""
    d = contenders.get("dsched")
    if d is None:
        return {}
    out = {}
    for name, c in contenders.items():
        if name == "dsched":
            continue
        out[name] = {
            "dsched_cpu_allocated_over_other": _ratio(
                d["cpu_allocated_core_seconds"], c["cpu_allocated_core_seconds"]
            ),
            "dsched_cpu_used_over_other": _ratio(
                d["cpu_used_core_seconds"], c["cpu_used_core_seconds"]
            ),
            "dsched_throughput_over_other": _ratio(d["records_processed"], c["records_processed"]),
            "dsched_throughput_in_window_over_other": _ratio(
                d["records_processed_in_window"], c["records_processed_in_window"]
            ),
            "dsched_latency_mean_over_other": _ratio(d["latency_ms_mean"], c["latency_ms_mean"]),
            "dsched_latency_p99_over_other": _ratio(d["latency_ms_p99"], c["latency_ms_p99"]),
        }
    return out


def targets(contenders: Mapping[str, dict[str, Any]]) -> dict[str, bool | None]:
    """The acceptance targets on this run; None when a contender they need did not run.

    Throughput must hold both over the whole run (records processed after the
    drain) and within the measured window (records the aggregate received in it).
    """
    d, s7, eq = (contenders.get(n) for n in ("dsched", "static-0.7", "equal"))
    out: dict[str, bool | None] = {
        "no_records_lost": (
            None if not contenders else all(c["records_lost"] == 0 for c in contenders.values())
        ),
        "dsched_throughput_at_least_0.97x_static_0.7": None,
        "dsched_cpu_at_most_0.6x_static_0.7": None,
        "dsched_latency_below_equal": None,
    }
    if d is not None and s7 is not None:
        out["dsched_throughput_at_least_0.97x_static_0.7"] = bool(
            d["records_processed"] >= 0.97 * s7["records_processed"]
            and d["records_processed_in_window"] >= 0.97 * s7["records_processed_in_window"]
        )
        out["dsched_cpu_at_most_0.6x_static_0.7"] = bool(
            d["cpu_allocated_core_seconds"] <= 0.6 * s7["cpu_allocated_core_seconds"]
        )
    if d is not None and eq is not None:
        if d["latency_ms_mean"] is not None and eq["latency_ms_mean"] is not None:
            out["dsched_latency_below_equal"] = bool(d["latency_ms_mean"] < eq["latency_ms_mean"])
    return out


# ---------------------------------------------------------------- the run's pieces


@dataclass
class Settings:
    scenario: str
    contenders: list[str]
    duration: float
    warmup: float  # rounded up to whole trace slots
    slot_seconds: float
    trace_slot_seconds: float
    capacity_cores: float
    cpu_period_us: int
    peak_rate: float | None
    calibration_rate: float
    calibration_seconds: float
    drain_timeout: float
    metrics_interval_ms: int
    controller_options: dict[str, Any]
    seed: int
    rounds: int
    workdir: Path
    keep_logs: bool
    interrupted: threading.Event

    @property
    def warm_slots(self) -> int:
        return round(self.warmup / self.trace_slot_seconds)


class Job:
    """The one running DschedWordCount: its vertices, subtasks and where their threads are."""

    def __init__(self, cluster: FlinkCluster, job_id: str, latency_dir: Path):
        self.cluster = cluster
        self.job_id = job_id
        self.rest = cluster.rest_url
        self.vertices = fm.vertices(self.rest, job_id)  # topological order
        self.flink_job: FlinkJob = EngineRest(self.rest, 10.0).job(job_id)
        by_id = {v.vid: v for v in self.flink_job.vertices}
        self.operator_of = {v.id: by_id[v.id].operator for v in self.vertices}
        self.operators = {by_id[v.id].operator: v.parallelism for v in self.vertices}
        self.vertex_names = {by_id[v.id].operator: v.name for v in self.vertices}
        self.app = self.flink_job.app
        self.latency = fm.LatencyTail(latency_dir, JOB_NAME)
        self.tm_pid = 0
        self.tids: dict[Ref, set[int]] = {}

    @property
    def subtasks(self) -> int:
        return sum(self.operators.values())

    def map_threads(self) -> None:
        """Subtask threads from one jcmd (the agent's own grouping); helpers that come
        later are picked up from the subtasks' cgroups by the sampler."""
        (self.tm_pid,) = self.cluster.taskmanager_pids()
        threads = jcmd_threads(self.tm_pid)
        grouping = group_threads({self.tm_pid: threads}, (self.flink_job,))
        self.tids = {(i.key.operator, i.key.instance): set(i.tids) for i in grouping.instances}
        missing = [r for r in self.refs() if r not in self.tids]
        if missing:
            raise RuntimeError(f"subtasks without threads in the TaskManager: {missing}")

    def refs(self) -> list[Ref]:
        return [(op, i) for op, n in self.operators.items() for i in range(n)]

    def key(self, ref: Ref) -> InstanceKey:
        return InstanceKey(self.app, ref[0], ref[1])

    @property
    def worker(self) -> str:
        return f"tm-{self.tm_pid}"

    def metrics(self) -> tuple[dict[Ref, float], dict[Ref, float]]:
        """numRecordsIn and accumulateBackPressuredTimeMs of every subtask."""
        rin: dict[Ref, float] = {}
        bp: dict[Ref, float] = {}
        for v in self.vertices:
            op = self.operator_of[v.id]
            per = fm.subtask_metrics(self.rest, self.job_id, v, list(SUBTASK_METRICS))
            for i, m in enumerate(per):
                rin[(op, i)] = m["numRecordsIn"]
                bp[(op, i)] = m["accumulateBackPressuredTimeMs"]
        return rin, bp

    def aggregate_in(self) -> int:
        return fm.aggregate_records_in(self.rest, self.job_id)


def _process_cpu_seconds(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return 0.0
    fields = stat[stat.rindex(b")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Sampler:
    """Once a slot: each subtask's CPU (its threads in /proc), its cap (its cgroup),
    Flink's counters (REST), the feeder's count and the sink's new latencies."""

    def __init__(
        self, job: Job, backend: CgroupTree, feeder: TraceFeeder, t0: float, period: float
    ):
        self.job, self.backend, self.feeder = job, backend, feeder
        self.t0, self.period = t0, period
        self.data = PhaseData()
        self._last_cpu: dict[int, float] = {}
        self._acc: dict[Ref, float] = dict.fromkeys(job.refs(), 0.0)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench.flink.sampler", daemon=True)

    def _cgroup_tids(self, ref: Ref, roots: list[Path]) -> tuple[set[int], float | None]:
        # Wherever the agent nested it (under the thread's own cgroup).
        path = self.backend.find_instance(self.job.key(ref), self.job.worker, roots)
        if path is None:
            return set(), None
        try:
            tids = set(self.backend.tids(path))
            cap = self.backend.read_cap(path)
        except (OSError, ValueError):
            return set(), None  # removed meanwhile
        return tids, cap

    def sample(self) -> None:
        with self._lock:
            self._sample()

    def _sample(self) -> None:
        job = self.job
        now = time.monotonic() - self.t0
        caps: dict[Ref, float | None] = {}
        in_cgroups = 0
        roots = self.backend.roots()
        for ref in job.refs():
            tids, cap = self._cgroup_tids(ref, roots)
            caps[ref] = cap
            in_cgroups += len(tids)
            # A helper thread counts from the first time it is seen.
            for tid in job.tids[ref] | tids:
                used = thread_cpu_seconds(job.tm_pid, tid)
                if used is None:
                    self._last_cpu.pop(tid, None)
                    continue
                before = self._last_cpu.get(tid)
                if before is not None:
                    self._acc[ref] += max(0.0, used - before)
                self._last_cpu[tid] = used
        rin, bp = job.metrics()
        new = job.latency.read()
        if new.size:
            self.data.latencies.append((now, new))
        self.data.samples.append(
            Sample(
                now,
                dict(self._acc),
                caps,
                rin,
                bp,
                self.feeder.records_written,
                _process_cpu_seconds(job.tm_pid),
                in_cgroups,
            )
        )

    def _run(self) -> None:
        k = 0
        while True:
            k += 1
            wait = self.t0 + k * self.period - time.monotonic()
            if self._stop.wait(max(0.0, wait)):
                return
            try:
                self.sample()
            except Exception:  # noqa: BLE001 - a REST hiccup: the next slot tries again
                log.warning("sample failed", exc_info=True)
                self.data.sample_errors += 1

    def start(self) -> Sampler:
        self.sample()
        self._thread.start()
        return self

    def stop(self) -> PhaseData:
        self._stop.set()
        self._thread.join(timeout=30)
        return self.data


def _wait(settings: Settings, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if settings.interrupted.wait(min(0.2, max(0.0, deadline - time.monotonic()))):
            raise Interrupted()


def release_to(backend: CgroupTree, destination: Path) -> None:
    """Move every thread of ``backend``'s tree into ``destination`` (the run's harness
    cgroup, where the TaskManager started) and remove the tree."""
    if not backend.root.is_dir():
        return
    for dirpath, _dirs, _files in os.walk(backend.root):
        for tid in backend.tids(Path(dirpath)):
            try:
                fd = os.open(destination / "tasks", os.O_WRONLY)
                try:
                    os.write(fd, f"{tid}\n".encode())
                finally:
                    os.close(fd)
            except OSError:
                pass  # exited meanwhile
    backend.remove_root()


def cap_directive(epoch: int, caps: Mapping[InstanceKey, float]) -> pb.CapDirective:
    return pb.CapDirective(
        epoch=epoch,
        caps=[
            pb.InstanceCap(
                key=pb.InstanceKey(app=k.app, operator=k.operator, instance=k.instance),
                cap_cores=c,
            )
            for k, c in caps.items()
        ],
    )


@dataclass(frozen=True)
class _Op:
    """What testbed.live.static.static_caps reads of an operator."""

    name: str
    parallelism: int


class InProcessAgent:
    """The agent's own enforcement path without a controller: a NodeAgent with the
    Flink engine's discovery (every slot, so helper threads that come and go join
    their subtask's cgroup) and one CapDirective."""

    def __init__(self, bench: FlinkBench, caps: Mapping[Ref, float]):
        s, job = bench.settings, bench.job
        shared = bench.agent_settings()
        self.config = AgentConfig(
            node_id=NODE,
            cgroup_root=Reservation.TESTBED,
            slot_seconds=s.slot_seconds,
            socket=str(s.workdir / "unused.sock"),
            **{k: v for k, v in shared.items() if k != "engine"},
            engine=[EngineConfig(**table) for table in shared["engine"]],
        )
        self.config.validate()
        self.agent = NodeAgent(self.config)
        self.discovery = EngineDiscovery(self.agent, make_engines(self.config.engine))
        self._stop = threading.Event()
        self._sampler = threading.Thread(target=self._sample, name="bench.flink.agent", daemon=True)
        try:
            self.discovery.scan()
            keys = {job.key(r): c for r, c in caps.items()}
            known = {r.key for r in self.agent.registry.snapshot()}
            if set(keys) - known:
                raise RuntimeError(
                    f"the agent did not find subtasks {sorted(set(keys) - known)} (found {sorted(known)})"
                )
            ack = self.agent.handle_directive(cap_directive(1, keys))
            if ack.applied != len(keys) or ack.rejected:
                raise RuntimeError(f"caps refused by the agent: {list(ack.rejected)}")
            self.discovery.start()
            self._sampler.start()
        except BaseException:
            self.close()
            raise

    def _sample(self) -> None:
        while not self._stop.wait(self.config.sample_seconds):
            self.agent.sample()

    def close(self) -> None:
        self._stop.set()
        self.discovery.stop()
        if self._sampler.is_alive():
            self._sampler.join(timeout=10)
        self.agent.close()


class FlinkBench:
    """The whole run: one Flink cluster and job, then every phase on it."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self.reservation = Reservation(CGROUP_V1_CPU, f"dsched-flink-{os.getpid()}")
        self.cluster: FlinkCluster | None = None
        self.job: Job | None = None
        self.phases = 0
        self.failed = False
        self._temp_dirs: list[Path] = []

    # -- paths and shared config

    @property
    def input_dir(self) -> Path:
        return self.settings.workdir / "input"

    @property
    def latency_dir(self) -> Path:
        return self.settings.workdir / "latency"

    def backend(self) -> CgroupV1:
        return self.reservation.backend(self.settings.cpu_period_us)

    def engine_table(self) -> dict[str, Any]:
        """The `[[engine]]` table of both agents: only this cluster's TaskManager and job
        (other Flink clusters may run on this machine)."""
        assert self.cluster is not None
        conf = re.escape(str(self.cluster.conf_dir))
        return {
            "kind": "flink",
            "rest_url": self.cluster.rest_url,
            "taskmanager_cmdline": rf"TaskManagerRunner --configDir {conf}( |$)",
            "jobs": re.escape(JOB_NAME),
        }

    def agent_settings(self) -> dict[str, Any]:
        """Agent config keys shared by dsched's agent daemon and the in-process agent."""
        s = self.settings
        return {
            "cgroup_mode": "v1",
            "cgroup_mount": str(self.reservation.top),
            "cpu_period_us": s.cpu_period_us,
            "capacity_cores": s.capacity_cores,
            "sample_seconds": s.slot_seconds / 2,
            "engine": [self.engine_table()],
        }

    def controller_settings(self) -> dict[str, Any]:
        s = self.settings
        assert self.job is not None and self.cluster is not None
        return {
            # Fine caps, a small floor, a trend over about 2 s (phi 2 at 1-s slots).
            **controller_config(Scale(s.capacity_cores, self.job.subtasks), s.slot_seconds),
            # One node, and Flink places subtasks itself: no placement to plan.
            "placement": "none",
            "engine": [
                {
                    "kind": "flink",
                    "rest_url": self.cluster.rest_url,
                    # Read as often as the metric store refreshes: an epoch then uses
                    # counters at most one refresh old, not up to a whole slot. Each
                    # read's age is noise on the slot's rate, which the trend doubles.
                    "poll_seconds": s.metrics_interval_ms / 1000,
                }
            ],
            **s.controller_options,
        }

    # -- lifecycle

    def start(self) -> None:
        s = self.settings
        self.reservation.enter()
        self.cluster = FlinkCluster(
            s.workdir / "flink",
            # A store refreshed once a slot aliases with the controller's once-a-slot
            # reads: some slots see no new values (a rate of 0, caps to the floor),
            # the next ones two refreshes' worth. Refreshed ten times a slot and read
            # as often, each slot's counters are at most 0.2 s off.
            extra_conf={"metrics.fetcher.update-interval": str(s.metrics_interval_ms)},
        )
        self.cluster.start(taskmanagers=1, slots=PARALLELISM)
        job_id = submit_wordcount(
            self.cluster,
            self.input_dir,
            JOB_NAME,
            parallelism=PARALLELISM,
            latency_dir=self.latency_dir,
            rounds=s.rounds,
        )
        self.cluster.wait_running(job_id, timeout=120)
        self.job = Job(self.cluster, job_id, self.latency_dir)
        self.job.map_threads()

    def close(self) -> list[str]:
        """Stop everything; the cgroups left behind (none, normally)."""
        if self.cluster is not None:
            if self.job is not None:
                try:
                    self.cluster.cancel(self.job.job_id)
                except Exception:  # noqa: BLE001 - the cluster is stopped next anyway
                    pass
            self.cluster.stop(keep_logs=self.failed or self.settings.keep_logs)
        release_to(self.backend(), self.reservation.harness)
        self.reservation.leave()
        for d in self._temp_dirs:
            shutil.rmtree(d, ignore_errors=True)
        return self.reservation.leftover()

    # -- one phase

    def run_phase(
        self,
        name: str,
        rates: np.ndarray,
        trace_slot: float,
        static: Mapping[Ref, float] | None,
    ) -> PhaseData:
        """Feed ``rates`` once under contender ``name`` (``static``: caps through the
        in-process agent; None: dsched), drain, and return what was measured."""
        s, job = self.settings, self.job
        assert job is not None
        self.phases += 1
        local: LocalCluster | None = None
        agent: InProcessAgent | None = None
        sampler: Sampler | None = None
        feeder: TraceFeeder | None = None
        try:
            base = job.aggregate_in()
            job.latency.read()  # whatever an earlier phase left is not this phase's
            job.map_threads()
            if static is None:
                local = self._start_dsched()
                # Until the agent's first cap moves them, the subtasks share the capacity.
                self.reservation.place(
                    (t for tids in job.tids.values() for t in tids),
                    s.cpu_period_us,
                    s.capacity_cores,
                )
            else:
                agent = InProcessAgent(self, static)
            feeder = TraceFeeder(
                self.input_dir, rates, slot_seconds=trace_slot, prefix=f"{self.phases:02d}-{name}"
            )
            t0_wall = time.time()
            t0 = time.monotonic()
            feeder.start()
            sampler = Sampler(job, self.backend(), feeder, t0, s.slot_seconds).start()
            _wait(s, len(rates) * trace_slot)
            while feeder.running:
                _wait(s, 0.1)
            feeder.join(0)
            written = feeder.records_written
            ended = time.monotonic()
            processed = self._drain(base, written)
            drain_seconds = time.monotonic() - ended
            # The sink flushes its file about once a second: wait for the last values.
            deadline = time.monotonic() + 3 * SINK_FLUSH_SECONDS + s.slot_seconds
            while time.monotonic() < deadline:
                sampler.sample()
                if sum(len(v) for _t, v in sampler.data.latencies) >= processed:
                    break
                _wait(s, 0.5)
            data = sampler.stop()
            sampler = None
            if local is not None:
                data.decisions = local.decisions()
            data.written, data.processed = written, processed
            data.drain_seconds, data.t0_wall = drain_seconds, t0_wall
            return data
        finally:
            if sampler is not None:
                sampler.stop()
            if feeder is not None:
                feeder.stop()
            if agent is not None:
                agent.close()
            if local is not None:
                local.stop()
            release_to(self.backend(), self.reservation.harness)

    def _start_dsched(self) -> LocalCluster:
        s = self.settings
        workdir = cluster_workdir(s.workdir / "dsched")
        if workdir != s.workdir / "dsched":
            self._temp_dirs.append(workdir)
        local = LocalCluster(
            workdir,
            mode="enforce",
            slot_seconds=s.slot_seconds,
            controller_config=self.controller_settings(),
            nodes=[
                NodeSpec(
                    NODE,
                    cgroup_root=Reservation.TESTBED,
                    extra_config=self.agent_settings(),
                )
            ],
        )
        try:
            local.start()
        except BaseException:
            local.stop()
            raise
        return local

    def _drain(self, base: int, written: int) -> int:
        """Wait until the aggregate has received every record written in this phase (or
        the drain timeout passes); the records it received."""
        s, job = self.settings, self.job
        assert job is not None
        deadline = time.monotonic() + s.drain_timeout
        seen = job.aggregate_in() - base
        while seen < written and time.monotonic() < deadline:
            _wait(s, 0.5)
            seen = job.aggregate_in() - base
        # One more read after the metric store's next refreshes, so that the count is
        # the final one even when the loop above ended on its timeout.
        _wait(s, 2 * s.metrics_interval_ms / 1000 + 0.2)
        return job.aggregate_in() - base


# ---------------------------------------------------------------- calibration


def calibrate(bench: FlinkBench) -> dict[str, Any]:
    """Uncapped subtasks (in the tree, each capped at the whole capacity) at a constant
    rate: each operator's CPU per record written, over the phase after its warm-up."""
    s, job = bench.settings, bench.job
    assert job is not None
    warm_slots = max(1, math.ceil(s.warmup / s.slot_seconds))
    slots = warm_slots + max(2, math.ceil(s.calibration_seconds / s.slot_seconds))
    rates = np.full(slots, s.calibration_rate)
    window = Window(warm_slots * s.slot_seconds, slots * s.slot_seconds, s.slot_seconds)
    caps = dict.fromkeys(job.refs(), s.capacity_cores)
    data = bench.run_phase("calibration", rates, s.slot_seconds, caps)
    a, b = _at(data.samples, window.start), _at(data.samples, window.end)
    records = b.written - a.written
    if records <= 0:
        raise RuntimeError("calibration: the feeder wrote nothing in the measured window")
    cpu_per_record = {
        op: sum(b.cpu[(op, i)] - a.cpu[(op, i)] for i in range(n)) / records
        for op, n in job.operators.items()
    }
    peak, busiest = peak_rate_from_calibration(
        cpu_per_record, job.operators, s.capacity_cores, job.subtasks
    )
    summary = summarize(data, window, job.operators, s.capacity_cores)
    return {
        "rate_records_per_second": s.calibration_rate,
        "measured_seconds": round(b.t - a.t, 2),
        "records_written_in_window": records,
        "cpu_us_per_record": {op: round(c * 1e6, 2) for op, c in cpu_per_record.items()},
        "busiest_operator": busiest,
        "peak_rate_records_per_second": round(peak, 2),
        "records_lost": summary["records_lost"],
        "latency_ms_mean": summary["latency_ms_mean"],
        "used_cores_mean_by_operator": summary["used_cores_mean_by_operator"],
    }


# ---------------------------------------------------------------- plot


def plot(doc: dict[str, Any], path: Path) -> Path:
    """Input rate; caps and usage per operator for dsched and static-0.7; latency per
    slot for every contender."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    contenders = doc["contenders"]
    ops = list(doc["job"]["operators"])
    fig, axes = plt.subplots(len(ops) + 2, 1, figsize=(10, 2.1 * (len(ops) + 2) + 1), sharex=True)
    first = next(iter(contenders.values()))["series"]
    x = np.asarray(first["time_s"])
    axes[0].step(x, first["rate"], where="post", color="black", label="written")
    axes[0].set_ylabel("records/s")
    axes[0].set_title(
        f"flink {doc['scenario']}: {doc['capacity_cores']:g} cores, slot {doc['slot_seconds']:g} s,"
        f" peak {doc['trace']['peak_rate_records_per_second']:.0f} records/s"
    )
    styles = {"dsched": ("tab:blue", "-"), "static-0.7": ("grey", "--")}
    for ax, op in zip(axes[1:-1], ops, strict=True):
        for name, (color, ls) in styles.items():
            if name not in contenders:
                continue
            so = contenders[name]["series"]["operators"][op]
            xs = np.asarray(contenders[name]["series"]["time_s"])
            ax.step(xs, so["cap_cores"], where="post", color=color, ls=ls, label=f"{name} cap")
            ax.plot(xs, so["usage_cores"], color=color, ls=ls, alpha=0.5, label=f"{name} usage")
            if so["demand_cores"]:
                px, py = zip(*so["demand_cores"], strict=True)
                ax.plot(px, py, color="tab:orange", lw=0.8, label=f"{name} demand")
        ax.set_ylabel(f"{op}\ncores", fontsize=8)
    axes[1].legend(fontsize=7, ncol=3)
    for name, c in contenders.items():
        lat = [np.nan if v is None else v for v in c["series"]["latency_ms_mean"]]
        axes[-1].plot(c["series"]["time_s"], lat, label=name)
    axes[-1].set_yscale("log")
    axes[-1].set_ylabel("latency ms\n(by write time)", fontsize=8)
    axes[-1].set_xlabel("seconds into the measured window")
    axes[-1].legend(fontsize=7, ncol=4)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


# ---------------------------------------------------------------- command


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--scenario", required=True, help=f"one of {', '.join(SCENARIOS)}")
    p.add_argument("--json", type=Path, required=True, help="write the results here")
    p.add_argument("--plot", type=Path, help="PNG: caps and usage per operator, latency per slot")
    p.add_argument(
        "--duration", type=float, default=120.0, help="trace seconds per contender (default 120)"
    )
    p.add_argument(
        "--warmup",
        type=float,
        default=12.0,
        help="seconds at the trace's first rate before measuring, rounded up to whole trace "
        "slots (default 12)",
    )
    p.add_argument(
        "--slot-seconds",
        type=float,
        default=1.0,
        help="dsched's control slot (controller and agent) and the series' step (default 1: "
        "Flink's REST metric store refreshes every second in the testbed cluster)",
    )
    p.add_argument(
        "--trace-slot-seconds",
        type=float,
        default=4.0,
        help="how long each level of the trace lasts (default 4)",
    )
    p.add_argument(
        "--capacity-cores",
        type=float,
        default=1.2,
        help="CPU the subtasks are given, the cgroup tree's root quota (default 1.2)",
    )
    p.add_argument(
        "--contenders",
        default=",".join(CONTENDERS),
        help=f"comma-separated, from {', '.join(CONTENDERS)} (default: all; dsched runs first)",
    )
    p.add_argument(
        "--peak-rate",
        type=float,
        help="the trace's peak in records/s (default: calibrated so that at the peak the "
        f"busiest operator needs {PEAK_SHARE} of its static-0.7 caps)",
    )
    p.add_argument(
        "--calibration-rate",
        type=float,
        default=500.0,
        help="records/s of the uncapped calibration phase (default 500)",
    )
    p.add_argument(
        "--calibration-seconds",
        type=float,
        default=12.0,
        help="measured seconds of the calibration phase, after --warmup (default 12)",
    )
    p.add_argument(
        "--drain-timeout",
        type=float,
        default=60.0,
        help="seconds to wait after the trace for every record to be processed (default 60)",
    )
    p.add_argument(
        "--metrics-interval-ms",
        type=int,
        default=100,
        help="Flink's metrics.fetcher.update-interval: how often the JobManager's REST "
        "metric store refreshes, and how often dsched's controller reads it (default 100)",
    )
    p.add_argument(
        "--cpu-period-us",
        type=int,
        default=100_000,
        help="CFS period of every cap (default 100000)",
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=DEFAULT_ROUNDS,
        help=f"SHA-256 rounds per record in Calc (default {DEFAULT_ROUNDS})",
    )
    p.add_argument(
        "--controller-option",
        action="append",
        default=[],
        metavar="KEY=JSON",
        help="override a dsched-controller config key for the dsched contender (repeatable)",
    )
    p.add_argument("--seed", type=int, default=1, help="seed of the random trace (default 1)")
    p.add_argument(
        "--workdir", type=Path, help="Flink cluster, input, logs (default: a temporary directory)"
    )
    p.add_argument(
        "--keep-logs",
        action="store_true",
        help="keep the Flink, controller and agent logs (they are always kept on failure)",
    )


def _positive(args: argparse.Namespace, key: str) -> float:
    value = getattr(args, key)
    if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
        raise ValueError(f"--{key.replace('_', '-')} must be a positive number, got {value!r}")
    return float(value)


def check_args(args: argparse.Namespace) -> list[str]:
    """Every bad input is refused here, before anything starts; the contenders in run order."""
    if args.scenario not in SCENARIOS:
        raise ValueError(
            f"--scenario: unknown scenario {args.scenario!r} (known: {', '.join(SCENARIOS)})"
        )
    names = [c.strip() for c in str(args.contenders).split(",") if c.strip()]
    unknown = [c for c in names if c not in CONTENDERS]
    if not names or unknown:
        raise ValueError(
            f"--contenders: unknown {unknown or names!r} (known: {', '.join(CONTENDERS)})"
        )
    if len(set(names)) != len(names):
        raise ValueError(f"--contenders: listed twice in {names}")
    if "equal" in names and "dsched" not in names:
        raise ValueError("--contenders: 'equal' copies dsched's allocation, so it needs 'dsched'")
    for key in (
        "duration",
        "slot_seconds",
        "trace_slot_seconds",
        "capacity_cores",
        "calibration_rate",
        "calibration_seconds",
        "drain_timeout",
    ):
        _positive(args, key)
    if args.peak_rate is not None:
        _positive(args, "peak_rate")
    if not (math.isfinite(args.warmup) and args.warmup >= 0):
        raise ValueError(f"--warmup must be a number >= 0, got {args.warmup!r}")
    if args.slot_seconds > args.trace_slot_seconds:
        raise ValueError(
            f"--slot-seconds {args.slot_seconds:g} is longer than a trace slot "
            f"(--trace-slot-seconds {args.trace_slot_seconds:g})"
        )
    if args.duration < 2 * args.trace_slot_seconds:
        raise ValueError(
            f"--duration must cover at least 2 trace slots ({2 * args.trace_slot_seconds:g} s), "
            f"got {args.duration:g}"
        )
    cpus = os.cpu_count() or 1
    if args.capacity_cores > cpus:
        raise ValueError(
            f"--capacity-cores {args.capacity_cores:g} exceeds this machine's {cpus} CPUs"
        )
    if not 1000 <= args.cpu_period_us <= 1_000_000:
        raise ValueError(f"--cpu-period-us must be in [1000, 1000000], got {args.cpu_period_us}")
    if not 50 <= args.metrics_interval_ms <= 60_000:
        raise ValueError(
            f"--metrics-interval-ms must be in [50, 60000], got {args.metrics_interval_ms}"
        )
    if args.metrics_interval_ms > 1000 * args.slot_seconds:
        raise ValueError(
            f"--metrics-interval-ms {args.metrics_interval_ms} is longer than a slot "
            f"(--slot-seconds {args.slot_seconds:g}): dsched would read the same counters twice"
        )
    for option in args.controller_option:
        key, sep, value = option.partition("=")
        try:
            if not sep or not key.strip():
                raise ValueError("expected KEY=JSON")
            json.loads(value)
        except ValueError as exc:
            raise ValueError(f"--controller-option {option!r}: {exc}") from None
    if args.rounds < 1:
        raise ValueError(f"--rounds must be >= 1, got {args.rounds}")
    if args.workdir is not None and any(c.isspace() for c in str(args.workdir.resolve())):
        raise ValueError(
            f"--workdir must not contain whitespace (Flink's scripts split it): {args.workdir}"
        )
    why = install.missing()
    if why is not None:
        raise ValueError(f"the Flink benchmark needs Flink and a JDK: {why}")
    if not (CGROUP_V1_CPU / "cpu.cfs_quota_us").exists() or not os.access(CGROUP_V1_CPU, os.W_OK):
        raise ValueError(
            f"the Flink benchmark needs a writable cgroup v1 cpu controller at {CGROUP_V1_CPU}"
        )
    return sorted(names, key=CONTENDERS.index)  # dsched first: equal copies it


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    console = Console()
    try:
        order = check_args(args)
    except ValueError as exc:
        print(f"dsched bench flink: error: {exc}", file=sys.stderr)
        return 2
    interrupted = threading.Event()
    stop = signals.StopOnSignals(interrupted).install()
    own_workdir = args.workdir is None
    workdir = Path(tempfile.mkdtemp(prefix="dsched-bench-flink-")) if own_workdir else args.workdir
    workdir = workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    settings = Settings(
        scenario=args.scenario,
        contenders=order,
        duration=args.duration,
        warmup=math.ceil(args.warmup / args.trace_slot_seconds - 1e-9) * args.trace_slot_seconds,
        slot_seconds=args.slot_seconds,
        trace_slot_seconds=args.trace_slot_seconds,
        capacity_cores=args.capacity_cores,
        cpu_period_us=args.cpu_period_us,
        peak_rate=args.peak_rate,
        calibration_rate=args.calibration_rate,
        calibration_seconds=args.calibration_seconds,
        drain_timeout=args.drain_timeout,
        metrics_interval_ms=args.metrics_interval_ms,
        controller_options={
            k.strip(): json.loads(v)
            for k, _, v in (o.partition("=") for o in args.controller_option)
        },
        seed=args.seed,
        rounds=args.rounds,
        workdir=workdir,
        keep_logs=args.keep_logs,
        interrupted=interrupted,
    )
    reference = reference_seconds()
    bench = FlinkBench(settings)
    results: dict[str, dict[str, Any]] = {}
    calibration: dict[str, Any] = {}
    code = 0
    try:
        console.print(
            f"bench flink: {args.scenario}, {settings.duration:g} s per contender after "
            f"{settings.warmup:g} s warm-up, capacity {settings.capacity_cores:g} cores; "
            f"contenders {', '.join(order)}; workdir {workdir}"
        )
        bench.start()
        if interrupted.is_set():
            raise Interrupted()
        job = bench.job
        assert job is not None
        console.print(
            f"  Flink cluster at {bench.cluster.rest_url}, job {job.job_id}: "
            + ", ".join(f"{job.vertex_names[op]} x{n}" for op, n in job.operators.items())
        )
        if settings.peak_rate is None:
            console.print(f"  calibrating at {settings.calibration_rate:g} records/s ...")
            calibration = calibrate(bench)
            peak = calibration["peak_rate_records_per_second"]
            console.print(
                f"  CPU per record (us): {calibration['cpu_us_per_record']}; peak {peak:.0f} records/s"
            )
        else:
            peak = settings.peak_rate
            calibration = {"skipped": "--peak-rate given", "peak_rate_records_per_second": peak}
        rates, levels = trace_rates(
            settings.scenario,
            peak,
            settings.duration,
            settings.trace_slot_seconds,
            settings.seed,
        )
        fed = feeder_rates(rates, settings.warm_slots)
        window = Window(
            settings.warm_slots * settings.trace_slot_seconds,
            len(fed) * settings.trace_slot_seconds,
            settings.slot_seconds,
        )
        scale = Scale(settings.capacity_cores, job.subtasks)
        ops = [_Op(op, n) for op, n in job.operators.items()]
        for name in order:
            console.print(f"  running {name} ...")
            static: dict[Ref, float] | None = None
            if name != "dsched":
                equal = (
                    results["dsched"]["allocated_cores_mean_by_operator"]
                    if name == "equal"
                    else None
                )
                per_op = static_caps(name, ops, scale, equal)
                static = {
                    r: settings.capacity_cores if per_op[r[0]] is None else per_op[r[0]]
                    for r in job.refs()
                }
            data = bench.run_phase(name, fed, settings.trace_slot_seconds, static)
            results[name] = summarize(data, window, job.operators, settings.capacity_cores)
            c = results[name]
            console.print(
                f"  {name}: CPU allocated {c['cpu_allocated_core_seconds']:.1f} used "
                f"{c['cpu_used_core_seconds']:.1f} core-s; processed {c['records_processed']} "
                f"(lost {c['records_lost']}); latency mean {c['latency_ms_mean']} ms p99 "
                f"{c['latency_ms_p99']} ms; backpressured {c['backpressured_seconds']} s"
            )
    except signals.Interrupted:
        bench.failed = True
        code = signals.INTERRUPTED
    except Exception as exc:
        bench.failed = True
        if interrupted.is_set():
            # Ctrl-C from a terminal also reaches the children in our process group
            # (the `flink run` client, jcmd): their failure is the interruption.
            code = signals.INTERRUPTED
        else:
            print(f"dsched bench flink: error: {exc}", file=sys.stderr)
            code = 1
    finally:
        leftover = bench.close()
        stop.restore()
        logs = bench.failed or settings.keep_logs
        if own_workdir and not logs:
            shutil.rmtree(workdir, ignore_errors=True)
        elif not logs:
            for sub in ("input", "latency", "flink", "dsched"):
                shutil.rmtree(workdir / sub, ignore_errors=True)
    if leftover:
        print(f"dsched bench flink: error: cgroups left behind: {leftover}", file=sys.stderr)
        return code or 1
    if code == signals.INTERRUPTED:
        console.print(
            f"[yellow]interrupted: Flink cluster, daemons and cgroups stopped; logs in {workdir}[/]"
        )
        return code
    if code:
        console.print(f"logs kept in {workdir}")
        return code
    job = bench.job
    assert job is not None
    figures = {
        "scenario": settings.scenario,
        "slot_seconds": settings.slot_seconds,
        "duration_seconds": settings.duration,
        "warmup_seconds": settings.warmup,
        "capacity_cores": settings.capacity_cores,
        "cpu_period_us": settings.cpu_period_us,
        "reference_seconds": round(reference, 4),
        "flink": {
            "version": install.FLINK_VERSION,
            "taskmanagers": 1,
            "metrics_fetcher_update_interval_ms": settings.metrics_interval_ms,
        },
        "job": {
            "name": JOB_NAME,
            "parallelism": PARALLELISM,
            "rounds": settings.rounds,
            "operators": dict(job.operators),
            "vertices": dict(job.vertex_names),
            "static_0.7_core_per_subtask": round(settings.capacity_cores / job.subtasks, 5),
        },
        "controller_config": bench.controller_settings(),
        "agent_config": bench.agent_settings(),
        "calibration": calibration,
        "trace": {
            "scenario": settings.scenario,
            "trace_slot_seconds": settings.trace_slot_seconds,
            "peak_rate_records_per_second": round(peak, 2),
            "peak_source": "calibration" if settings.peak_rate is None else "--peak-rate",
            "peak_share_of_static_0.7": PEAK_SHARE,
            "levels": [round(float(v), 4) for v in levels],
            "rates": [round(float(r), 2) for r in rates],
        },
        "contenders": results,
        "ratios": ratios(results),
        "targets": targets(results),
        "cgroups_left": leftover,
    }
    doc = write_result(args.json, "flink", figures)
    console.print(f"wrote {args.json}")
    if args.plot:
        console.print(f"wrote {plot(doc, args.plot)}")
    _print_table(console, doc)
    return 0


def _print_table(console, doc: dict[str, Any]) -> None:
    cols = (
        "cpu_allocated_core_seconds",
        "cpu_used_core_seconds",
        "records_processed",
        "records_lost",
        "latency_ms_mean",
        "latency_ms_p99",
        "backpressured_seconds",
    )
    print_contenders(console, f"flink {doc['scenario']}", doc, cols)
    console.print(f"ratios: {doc['ratios']}")
    console.print(f"targets: {doc['targets']}")
