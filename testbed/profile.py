"""Profile a testbed operator on real threads under a real cap: its performance model.

Performance modelling as "Model-driven Scheduling for Distributed Stream
Processing Systems" (Shukla and Simmhan, §5, Alg. 1) builds it: for 1, 2, ...
threads of OPERATOR on one resource slot, trials at rising input rates; a trial
is stable when the least-squares slope of tuple latency over time after the
warm-up stays at or under ``--max-latency-slope``; the last stable rate is the
peak for that thread count, and the thread sweep stops once the slope of peak
rates over the trailing window of thread counts is flat or falling.
:func:`predict.perfmodel.profile_task` runs that sweep; this module runs the
trials.

One trial is the paper's three-task DAG on this machine: the pacer injects roots
at the offered rate; the operator's upstream operators (if any) run at no CPU
cost and out of the slot, so that they are not the bottleneck; the operator's
``threads`` instances do their real per-tuple work in CPU-worker processes
(:class:`testbed.live.engine.CpuWorker`) placed in one cgroup v1 tree whose quota
is the slot (``--slot-cores``); its children are dropped, so a root's tree ends
at the operator and the acker's complete latency is the operator's queueing and
service time. Measured per trial, between the warm-up and the end:

- CPU: on-CPU time of the worker processes (``/proc/<pid>/schedstat``) over the
  slot's cores, in % of the slot;
- memory: proportional set size of the worker processes (``smaps_rollup``; RSS
  where the kernel lacks it) over the slot's memory, the machine's memory per
  core unless ``--slot-memory-mb`` says otherwise;
- rate: tuples the operator executed per second (the offered rate is what the
  model records);
- latency: per root, from creation to the end of its tree.

``--json PATH`` writes the model table the controller loads (docs/perf-models.md):
``{"columns": [...], "models": {"app/operator": [[threads, peak_rate,
cpu_percent, memory_percent], ...]}}``, rows in increasing thread order as
:meth:`predict.perfmodel.PerformanceModel.from_table` takes them, plus every
trial's figures under ``profile``. Other operators' models already in PATH are
kept; the file is replaced atomically.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from agent.cgroups import CgroupV1
from agent.registry import InstanceKey
from agent.sampling import ThreadCpuReader
from predict.perfmodel import (
    PerformanceModel,
    TrialResult,
    latency_slope,
    profile_task,
)
from testbed.live import http_monitor, wordcount
from testbed.live.engine import LiveTopology
from testbed.live.static import StaticCaps, release_and_remove
from testbed.live.topology import TopologySpec

CGROUP_V1_CPU = Path("/sys/fs/cgroup/cpu")
TABLE_COLUMNS = ("threads", "peak_rate", "cpu_percent", "memory_percent")
TABLE_FORMAT = "dsched-perf-models/1"


@dataclass(frozen=True)
class Testbed:
    """A testbed topology whose operators can be profiled."""

    spec: TopologySpec
    fanout: dict[str, float]
    group_keys: dict[str, Any] = field(default_factory=dict)


def testbeds() -> dict[str, Testbed]:
    return {
        "wordcount": Testbed(wordcount.wordcount(parallelism=1), wordcount.FANOUT),
        "httpmon": Testbed(
            http_monitor.http_monitor(parallelism=1),
            http_monitor.FANOUT,
            http_monitor.GROUP_KEYS,
        ),
    }


def known_operators() -> list[str]:
    return [f"{name}/{o.name}" for name, tb in testbeds().items() for o in tb.spec.operators]


def _arrivals_per_root(spec: TopologySpec, fanout: dict[str, float]) -> dict[str, float]:
    """Tuples each operator receives per root tuple (operators are in topological order)."""
    arrivals = {o.name: 1.0 for o in spec.sources}
    for o in spec.operators:
        a = arrivals.get(o.name, 0.0)
        for c in spec.children(o.name):
            arrivals[c.name] = arrivals.get(c.name, 0.0) + a * fanout.get(o.name, 1.0)
    return arrivals


@dataclass(frozen=True)
class Target:
    """The operator being profiled, and its input per root tuple."""

    testbed: str
    operator: str
    bed: Testbed
    per_root: float
    cost_ms: float

    @property
    def key(self) -> str:
        return f"{self.testbed}/{self.operator}"

    def trial_spec(self, threads: int) -> TopologySpec:
        """The operator with ``threads`` instances behind its ancestors at no CPU cost;
        its children and every other branch are left out."""
        keep = {self.operator}
        for o in reversed(self.bed.spec.operators):
            if o.name in keep:
                keep.update(o.upstream)
        ops = []
        for o in self.bed.spec.operators:
            if o.name == self.operator:
                ops.append(replace(o, parallelism=threads, cost_ms=self.cost_ms))
            elif o.name in keep:
                ops.append(replace(o, parallelism=1, cost_ms=0.0))
        return TopologySpec(
            app=self.bed.spec.app, operators=tuple(ops), make_root=self.bed.spec.make_root
        )


def resolve(operator: str, cost_ms: float | None = None) -> Target:
    """``testbed/operator`` -> :class:`Target`; ValueError naming the known ones."""
    beds = testbeds()
    name, _, op = operator.partition("/")
    bed = beds.get(name)
    specs = {o.name: o for o in bed.spec.operators} if bed else {}
    if op not in specs:
        raise ValueError(f"unknown operator {operator!r} (known: {', '.join(known_operators())})")
    per_root = _arrivals_per_root(bed.spec, bed.fanout).get(op, 0.0)
    if per_root <= 0:
        raise ValueError(
            f"operator {operator!r} receives no steady input from its upstream operators "
            "(it emits only when a window closes), so a trial cannot offer it a rate"
        )
    cost = specs[op].cost_ms if cost_ms is None else cost_ms
    if not (math.isfinite(cost) and cost > 0):
        raise ValueError(f"--cost-ms must be a number > 0, got {cost!r}")
    return Target(name, op, bed, per_root, cost)


def slot_memory_mb_default() -> float:
    """The machine's memory per core: the paper's slot is a core and its share of memory."""
    pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return pages / (1024 * 1024) / (os.cpu_count() or 1)


def process_memory_mb(pid: int) -> float:
    """Proportional set size of a process in MB (RSS where smaps_rollup is missing)."""
    for path, label in ((f"/proc/{pid}/smaps_rollup", "Pss:"), (f"/proc/{pid}/status", "VmRSS:")):
        try:
            with open(path) as fh:
                for line in fh:
                    if line.startswith(label):
                        return int(line.split()[1]) / 1024
        except OSError:
            continue
    return 0.0


@dataclass
class Trial:
    """Figures of one trial (kept for the JSON report)."""

    threads: int
    rate: float
    stable: bool
    latency_slope: float | None
    cpu_percent: float
    memory_mb: float
    memory_percent: float
    measured_rate: float
    completed: int
    mean_latency_ms: float | None
    throttled_periods: int


class _CappedTopology(LiveTopology):
    """A LiveTopology that puts its instances under the slot's cap before any input."""

    def __init__(self, *args, before_input, **kwargs):
        super().__init__(*args, **kwargs)
        self._before_input = before_input

    def _start_input(self, *loops):
        self._before_input(self)
        super()._start_input(*loops)


class Profiler:
    """Runs trials of one operator on real threads under a real cgroup v1 cap."""

    def __init__(
        self,
        target: Target,
        *,
        slot_cores: float = 1.0,
        slot_memory_mb: float | None = None,
        trial_seconds: float = 3.0,
        warmup_seconds: float = 1.0,
        mount: Path = CGROUP_V1_CPU,
        cgroup_root: str | None = None,
        period_us: int = 100_000,
    ):
        self.target = target
        self.slot_cores = slot_cores
        self.slot_memory_mb = slot_memory_mb or slot_memory_mb_default()
        self.trial_seconds = trial_seconds
        self.warmup_seconds = warmup_seconds
        self.mount = Path(mount)
        self.cgroup_root = cgroup_root or f"dsched-profile-{os.getpid()}"
        self.period_us = period_us
        self.trials: list[Trial] = []
        self._cpu = ThreadCpuReader()

    def _workers(self, topo: LiveTopology) -> list[int]:
        insts = topo.instances[self.target.operator]
        return [i.cpu_worker.pid for i in insts if i.cpu_worker is not None]

    def _cpu_seconds(self, pids: list[int]) -> float:
        return sum(self._cpu.read(p, p) or 0.0 for p in pids)

    def _executed(self, topo: LiveTopology) -> int:
        return sum(i.counters.executed for i in topo.instances[self.target.operator])

    def run_trial(self, threads: int, rate: float) -> TrialResult:
        """One trial of ``threads`` threads offered ``rate`` tuples/s of the operator's input."""
        caps = StaticCaps(self.mount, self.cgroup_root, self.period_us)
        root_rate = rate / self.target.per_root

        def cap(topo: LiveTopology) -> None:
            # Only the profiled operator's threads share the slot: its upstream
            # stands in for the paper's source on another VM.
            threads_of = [
                (InstanceKey(topo.spec.app, i.spec.name, i.index), i.worker, *i.cpu_pid_tid)
                for i in topo.instances[self.target.operator]
            ]
            caps.apply_threads(threads_of, {self.target.operator: None}, self.slot_cores)

        topo = _CappedTopology(
            self.target.trial_spec(threads),
            lambda _t: root_rate,
            cpu="process",
            group_keys={
                k: f for k, f in self.target.bed.group_keys.items() if k == self.target.operator
            },
            before_input=cap,
        )
        try:
            topo.start()
            pids = self._workers(topo)
            started = topo.started_at
            time.sleep(self.warmup_seconds)
            cpu0, done0 = self._cpu_seconds(pids), self._executed(topo)
            throttle0 = caps.backend.throttling(caps.root)
            t0 = time.monotonic()
            time.sleep(self.trial_seconds - self.warmup_seconds)
            span = time.monotonic() - t0
            cpu1, done1 = self._cpu_seconds(pids), self._executed(topo)
            throttle1 = caps.backend.throttling(caps.root)
            memory_mb = sum(process_memory_mb(p) for p in pids)
            in_flight = topo.acker.in_flight
            topo.abort()
        finally:
            if not topo.closing.is_set():
                topo.abort()
            caps.remove()
            for p in self._workers(topo):
                self._cpu.forget(p, p)
        completion = np.asarray(topo.acker.completion_times, dtype=float) - started
        latencies = np.asarray(topo.acker.latencies, dtype=float)
        measured = latencies[completion >= self.warmup_seconds]
        if measured.size < 2:
            # Nothing measurable finished after the warm-up: with roots still open the
            # operator fell behind what it was given (their age is the latency to come).
            grown = self.trial_seconds - self.warmup_seconds if in_flight else 0.0
            completion = np.array([self.warmup_seconds, self.trial_seconds])
            latencies = np.array([0.0, grown])
        slope = latency_slope(completion, latencies, self.warmup_seconds)
        cpu_percent = 100.0 * (cpu1 - cpu0) / span / self.slot_cores
        memory_percent = 100.0 * memory_mb / self.slot_memory_mb
        throttled = 0
        if throttle0 is not None and throttle1 is not None:
            throttled = throttle1.throttled_periods_total - throttle0.throttled_periods_total
        self.trials.append(
            Trial(
                threads=threads,
                rate=rate,
                stable=False,  # set by the caller, which applies the rule
                latency_slope=slope,
                cpu_percent=cpu_percent,
                memory_mb=memory_mb,
                memory_percent=memory_percent,
                measured_rate=(done1 - done0) / span,
                completed=len(topo.acker.completion_times),
                mean_latency_ms=float(np.mean(measured)) * 1000.0 if measured.size else None,
                throttled_periods=throttled,
            )
        )
        return TrialResult(cpu_percent, memory_percent, completion, latencies)


def profile(
    profiler: Profiler,
    *,
    max_threads: int,
    max_rate: float,
    rate_step: float,
    thread_step: int = 1,
    max_latency_slope: float,
    rate_slope_window: int,
    on_trial=None,
    refine: int = 0,
    on_refine=None,
) -> PerformanceModel:
    """Alg. 1 over real trials; every trial's figures stay in ``profiler.trials``.

    ``refine``: how many times the rate step (and the highest rate) may be halved
    when one thread cannot sustain even the first step, rather than giving up
    after the whole sweep; the paper leaves the step to "a function of the
    iteration or the prior performance". ``on_refine(step, max_rate)`` is told.
    """

    class TooCoarse(Exception):
        pass

    def run(threads: int, rate: float) -> TrialResult:
        result = profiler.run_trial(threads, rate)
        trial = profiler.trials[-1]
        trial.stable = trial.latency_slope <= max_latency_slope
        if on_trial is not None:
            on_trial(trial)
        if refine and threads == 1 and rate <= rate_step * (1 + 1e-9) and not trial.stable:
            raise TooCoarse
        return result

    while True:
        try:
            model = profile_task(
                run,
                max_threads=max_threads,
                max_rate=max_rate,
                rate_step=rate_step,
                thread_step=thread_step,
                warmup=profiler.warmup_seconds,
                max_latency_slope=max_latency_slope,
                rate_slope_window=rate_slope_window,
            )
        except TooCoarse:
            refine -= 1
            rate_step, max_rate = rate_step / 2, max_rate / 2
            if on_refine is not None:
                on_refine(rate_step, max_rate)
            continue
        return PerformanceModel(model.points, name=profiler.target.key)


# ------------------------------------------------------------------ the model table


def table_rows(model: PerformanceModel) -> list[list[float]]:
    return [
        [p.threads, round(p.peak_rate, 6), round(p.cpu_percent, 4), round(p.memory_percent, 4)]
        for p in model.points
    ]


def read_table(path: Path) -> dict[str, Any]:
    """An existing table file to add to; ValueError when it is not one."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"--json: {path} exists but is not a model table: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("models"), dict):
        raise ValueError(f'--json: {path} exists but has no "models" table; not overwriting it')
    return doc


def write_table(path: Path, key: str, model: PerformanceModel, details: dict[str, Any]) -> None:
    """Add (or replace) ``key``'s model in the table at ``path``, atomically."""
    doc = read_table(path) if path.exists() else {}
    doc["format"] = TABLE_FORMAT
    doc["columns"] = list(TABLE_COLUMNS)
    doc.setdefault("models", {})[key] = table_rows(model)
    doc.setdefault("profile", {})[key] = details
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(tmp, path)


# ------------------------------------------------------------------ command line


def _thread_range(text: str) -> tuple[int, int]:
    lo, sep, hi = text.partition("-")
    try:
        first, last = int(lo), int(hi) if sep else int(lo)
    except ValueError:
        raise ValueError(f"--threads must be N or FIRST-LAST (e.g. 1-4), got {text!r}") from None
    if first != 1:
        raise ValueError(
            f"--threads must start at 1 (the model scales from one thread), got {text!r}"
        )
    if last < first or last > 64:
        raise ValueError(f"--threads: the last thread count must be in 1..64, got {text!r}")
    return first, last


def remove_stale_trees(mount: Path = CGROUP_V1_CPU) -> list[str]:
    """Remove the slot trees of profiler runs whose process is gone (killed mid-trial)."""
    removed = []
    for tree in mount.glob("dsched-profile-*"):
        pid = tree.name.rpartition("-")[2]
        if tree.is_dir() and pid.isdigit() and not Path(f"/proc/{pid}").exists():
            release_and_remove(CgroupV1(mount, tree.name))
            removed.append(tree.name)
    return removed


def v1_unusable(mount: Path = CGROUP_V1_CPU) -> str:
    """Why the slot cannot be capped here, or "" when it can."""
    if not (mount / "cpu.cfs_quota_us").exists():
        return f"there is no cgroup v1 cpu controller at {mount}"
    if not os.access(mount, os.W_OK):
        return f"{mount} is not writable (run as root)"
    return ""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("operator", metavar="OPERATOR", help="testbed/operator, e.g. wordcount/split")
    p.add_argument("--json", type=Path, help="add the model to the model table at this path")
    p.add_argument("--name", help="key of the model in the table (default: OPERATOR)")
    p.add_argument(
        "--threads",
        default="1-4",
        help="thread counts to sweep, 1-N (default 1-4; the "
        "sweep stops earlier once more threads stop raising the peak rate)",
    )
    p.add_argument("--trial-seconds", type=float, default=3.0, help="length of a trial (default 3)")
    p.add_argument(
        "--warmup-seconds", type=float, default=1.0, help="start of a trial left out (default 1)"
    )
    p.add_argument("--slot-cores", type=float, default=1.0, help="cores of the slot (default 1)")
    p.add_argument(
        "--slot-memory-mb", type=float, help="memory of the slot (default: memory per core)"
    )
    p.add_argument(
        "--rate-step",
        type=float,
        help="input rate step, tuples/s (default: a fifth of what the slot could process "
        "at the operator's declared CPU cost, halved up to 3 times while one thread "
        "cannot sustain the first step)",
    )
    p.add_argument("--max-rate", type=float, help="highest rate tried (default: 8 rate steps)")
    p.add_argument(
        "--max-latency-slope",
        type=float,
        default=0.02,
        help="seconds of latency gained per second above which a trial is unstable "
        "(default 0.02; the paper's 0.001 suits its 12-minute trials, where noise "
        "averages out, and 0.02 still catches a 2%% overload)",
    )
    p.add_argument(
        "--rate-slope-window",
        type=int,
        default=3,
        help="thread counts in the trailing window of peak rates (default 3)",
    )
    p.add_argument("--cost-ms", type=float, help="CPU ms per tuple (default: the operator's)")
    p.add_argument(
        "--period-us",
        type=int,
        default=100_000,
        help="CFS period of the slot's cap (default 100000)",
    )


def _round2(x: float) -> float:
    """``x`` to two significant digits (a rate step people can read)."""
    if not (math.isfinite(x) and x > 0):
        return x
    return round(x, 1 - math.floor(math.log10(x)))


def _check(args: argparse.Namespace) -> tuple[Target, int, float, float]:
    target = resolve(args.operator, args.cost_ms)
    _, last = _thread_range(args.threads)
    for name in ("trial_seconds", "slot_cores"):
        value = getattr(args, name)
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"--{name.replace('_', '-')} must be a number > 0, got {value!r}")
    if not (0 <= args.warmup_seconds < args.trial_seconds):
        raise ValueError(
            f"--warmup-seconds must be >= 0 and shorter than --trial-seconds "
            f"({args.trial_seconds:g}), got {args.warmup_seconds!r}"
        )
    if args.slot_memory_mb is not None and not args.slot_memory_mb > 0:
        raise ValueError(f"--slot-memory-mb must be > 0, got {args.slot_memory_mb!r}")
    capacity = args.slot_cores * 1000.0 / target.cost_ms
    step = args.rate_step if args.rate_step is not None else _round2(capacity / 5)
    if not (math.isfinite(step) and step > 0):
        raise ValueError(f"--rate-step must be a number > 0, got {step!r}")
    max_rate = args.max_rate if args.max_rate is not None else 8 * step
    if not (math.isfinite(max_rate) and max_rate >= step):
        raise ValueError(
            f"--max-rate must be a number >= the rate step ({step:g}), got {max_rate!r}"
        )
    if not (math.isfinite(args.max_latency_slope) and args.max_latency_slope >= 0):
        raise ValueError(f"--max-latency-slope must be >= 0, got {args.max_latency_slope!r}")
    if args.rate_slope_window < 2:
        raise ValueError(f"--rate-slope-window must be >= 2, got {args.rate_slope_window!r}")
    if not 1000 <= args.period_us <= 1_000_000:
        raise ValueError(f"--period-us must be within 1000..1000000, got {args.period_us!r}")
    if args.json is not None:
        if not args.json.parent.is_dir():
            raise ValueError(f"--json: directory {args.json.parent} does not exist")
        if args.json.exists():
            read_table(args.json)
    return target, last, step, max_rate


def run(args: argparse.Namespace) -> int:
    target, max_threads, step, max_rate = _check(args)
    why = v1_unusable()
    if why:
        raise RuntimeError(f"profiling caps the operator's slot with cgroup v1, but {why}")
    for name in remove_stale_trees():
        print(f"removed {name}, left by a profiler run that was killed", flush=True)
    key = args.name or target.key
    profiler = Profiler(
        target,
        slot_cores=args.slot_cores,
        slot_memory_mb=args.slot_memory_mb,
        trial_seconds=args.trial_seconds,
        warmup_seconds=args.warmup_seconds,
        period_us=args.period_us,
    )

    def show(t: Trial) -> None:
        print(
            f"threads {t.threads} rate {t.rate:9.1f}/s  {'stable  ' if t.stable else 'UNSTABLE'}"
            f" slope {t.latency_slope:+.4f}  measured {t.measured_rate:8.1f}/s"
            f"  cpu {t.cpu_percent:5.1f}%  mem {t.memory_mb:6.1f} MB"
            f"  throttled {t.throttled_periods}",
            flush=True,
        )

    print(
        f"profiling {target.key} ({target.cost_ms:g} ms CPU per tuple) on a "
        f"{args.slot_cores:g}-core slot, threads 1-{max_threads}, rates {step:g}..{max_rate:g}/s "
        f"in steps of {step:g}, {args.trial_seconds:g} s trials",
        flush=True,
    )
    grid = {"rate_step": step, "max_rate": max_rate}

    def refined(new_step: float, new_max: float) -> None:
        grid.update(rate_step=new_step, max_rate=new_max)
        print(
            "one thread cannot sustain the first step: "
            f"rates {new_step:g}..{new_max:g}/s in steps of {new_step:g}",
            flush=True,
        )

    started = time.monotonic()
    model = profile(
        profiler,
        max_threads=max_threads,
        max_rate=max_rate,
        rate_step=step,
        max_latency_slope=args.max_latency_slope,
        rate_slope_window=args.rate_slope_window,
        on_trial=show,
        # Only a step the user did not choose is refined.
        refine=0 if args.rate_step is not None else 3,
        on_refine=refined,
    )
    elapsed = time.monotonic() - started
    print(f"model of {key} ({len(profiler.trials)} trials, {elapsed:.0f} s):")
    print("  threads  peak_rate  cpu%   memory%")
    for p in model.points:
        print(
            f"  {p.threads:7d}  {p.peak_rate:9.1f}  {p.cpu_percent:5.1f}  {p.memory_percent:7.2f}"
        )
    best_threads, best_rate = model.best
    print(f"  best: {best_threads} thread(s) at {best_rate:g} tuples/s")
    if args.json is not None:
        details = {
            "operator": target.key,
            "cost_ms": target.cost_ms,
            "slot_cores": args.slot_cores,
            "slot_memory_mb": round(profiler.slot_memory_mb, 1),
            "trial_seconds": args.trial_seconds,
            "warmup_seconds": args.warmup_seconds,
            **grid,
            "max_latency_slope": args.max_latency_slope,
            "rate_slope_window": args.rate_slope_window,
            "profiled_at": time.time(),
            "trials": [t.__dict__ for t in profiler.trials],
        }
        write_table(args.json, key, model, details)
        print(f"wrote {args.json}")
    return 0
