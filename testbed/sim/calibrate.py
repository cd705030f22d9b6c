"""Calibration: one small chain run live (real threads, real cgroup v1 caps) and simulated.

Both halves get the same inputs (:func:`calibration_inputs`): the Poisson
arrival times and, per operator and message, the number of 64 KiB SHA-256
chunks the message costs.

Live (:func:`run_live`): every operator is one OS thread under its own CFS
quota in ``<cpu mount>/dsched-simcal/op<k>``, burning its messages' chunks
(testbed/sim/calworker.py). By default each thread is the only thread of its
own process (``isolation="process"``): threads of one Python process share the
GIL, and a thread that CFS throttles while it holds the GIL stalls every other
thread of the process until its next period -- a coupling of the harness, not
of the capped operators the simulator models (``isolation="thread"`` keeps it,
to measure it). Messages travel over pipes; the first operator gets each one
at its arrival time.

Simulated (:func:`run_sim`): the same chain in :class:`ClusterSim` with the
live run's arrivals (the instants the harness handed each message to the
first operator) and per-message chunks, plus the live effects a
:class:`SimModel` names, each measured by a function here: the CPU a message
really costs (:func:`measure_message_cost`), the wake-up at every hop
(:func:`measure_handoff_seconds`), and each group's CFS period phase and
tick-granular quota enforcement (:func:`measure_cfs_timing`). The two agree
when latency and CPU are within the tolerance (20 %).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
from array import array
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dsched.validate import positive
from testbed import traces
from testbed.live.engine import hash_seconds
from testbed.sim import calworker
from testbed.sim.engine import ClusterSim
from testbed.sim.run import weighted_quantile
from testbed.sim.scenario import AppSpec, ArrivalSpec, OperatorSpec, Scenario

CPU_MOUNT = Path("/sys/fs/cgroup/cpu")
PERIOD_US = 100_000
ISOLATIONS = ("process", "thread")
WORKER = Path(calworker.__file__)


@dataclass(frozen=True)
class CalibrationSetup:
    work_ms: tuple[float, ...] = (4.0, 6.0)
    caps: tuple[float, ...] = (0.5, 0.6)
    rate: float = 50.0  # messages/s
    seconds: float = 30.0
    seed: int = 3

    def __post_init__(self) -> None:
        if not self.work_ms or len(self.work_ms) != len(self.caps):
            raise ValueError("work_ms and caps must name the same, non-zero number of operators")
        for w in self.work_ms:
            positive(w, "work_ms")
        for c in self.caps:
            positive(c, "caps")
        positive(self.rate, "rate")
        positive(self.seconds, "seconds")


@dataclass(frozen=True)
class CalibrationInputs:
    """What both halves run: arrival times (seconds after the start) and, per operator,
    the 64 KiB chunks each message hashes (message i of every operator is arrival i)."""

    arrivals: np.ndarray
    chunks: tuple[np.ndarray, ...]
    chunk_seconds: float  # the nominal CPU per chunk the work was converted with


def calibration_inputs(
    setup: CalibrationSetup, chunk_seconds: float | None = None
) -> CalibrationInputs:
    """Poisson arrivals and exponential work per message (CV 1), in whole chunks;
    randomized rounding keeps each operator's mean work exact."""
    cs = positive(chunk_seconds, "chunk_seconds") if chunk_seconds else hash_seconds()
    arrivals = traces.poisson_arrivals(setup.rate, setup.seconds, seed=setup.seed)
    rng = np.random.default_rng(setup.seed + 1)
    chunks = []
    for work_ms in setup.work_ms:
        n = rng.exponential(work_ms / 1000.0, len(arrivals)) / cs
        chunks.append((np.floor(n) + (rng.random(len(n)) < n - np.floor(n))).astype(np.uint32))
    return CalibrationInputs(arrivals, tuple(chunks), cs)


@dataclass(frozen=True)
class MessageCost:
    """CPU one live message costs its thread: ``fixed_s + per_chunk_s * chunks``.

    ``fixed_s`` is what the harness spends around the hashing (pipe read and write,
    Python around them); ``per_chunk_s`` is the hashing's real cost, which is not
    exactly the nominal cost the work was converted with."""

    fixed_s: float
    per_chunk_s: float

    def seconds(self, chunks: np.ndarray) -> np.ndarray:
        return self.fixed_s + self.per_chunk_s * np.asarray(chunks, dtype=float)


@dataclass
class CalibrationFigures:
    latency_ms_mean: float
    latency_ms_p99: float
    cpu_cores: list[float]  # CPU-seconds per operator over ``seconds``
    messages: int
    # From the start until the last message finished (the arrivals' span plus the drain).
    seconds: float = 0.0
    # Mean time from a message's arrival until each operator has finished it.
    stage_latency_ms_mean: list[float] = field(default_factory=list)
    # Time each operator spent throttled with work waiting (cpu.stat throttled_time live).
    throttled_seconds: list[float] = field(default_factory=list)
    # Live only: mean wake-up of each operator for a message handed to it while it
    # was idle (from the hand-off to its read), measured in the run itself.
    handoff_ms_mean: list[float] = field(default_factory=list)
    # Live only: the same for hand-offs after which the sender went on with its next
    # message (None for the first operator, whose sender is the harness).
    handoff_busy_sender_ms_mean: list[float | None] = field(default_factory=list)
    # Live only: time each operator's thread waited on a run queue (schedstat
    # run_delay; throttled time is part of it): the rest is waiting for a CPU.
    run_delay_seconds: list[float] = field(default_factory=list)
    other_cpu_seconds: float | None = None
    steal_seconds: float | None = None
    # Live only: how late the harness handed messages to the first operator (ms);
    # latency counts from the hand-off, and the simulation gets the same instants.
    injection_lag_ms_mean: float | None = None


@dataclass
class LiveRun:
    figures: CalibrationFigures
    arrivals_s: np.ndarray  # when each message was handed to the first operator
    timing: list[CfsTiming]  # per operator's group, relative to the run's start


@dataclass(frozen=True)
class SimModel:
    """The live effects the simulated half models, each measured by a named function.

    * ``cost``: CPU per message from its chunks (:func:`measure_message_cost`);
      None: the nominal chunk cost, nothing around it;
    * ``handoff_s``: wake-up per hop (:func:`measure_handoff_seconds`);
    * ``cfs_tick_s`` / ``tick_phase_s``: quota enforced on scheduler ticks, overrun
      repaid next period (:func:`measure_cfs_timing`); 0: exact enforcement;
    * ``period_phase_s``: each operator's CFS period start (:func:`measure_cfs_timing`);
      None: all at 0.
    """

    cost: MessageCost | None = None
    handoff_s: float = 0.0
    cfs_tick_s: float = 0.0
    tick_phase_s: float = 0.0
    period_phase_s: tuple[float, ...] | None = None

    @classmethod
    def measured(cls, cost: MessageCost, handoff_s: float, live: LiveRun) -> SimModel:
        ticks = [t for t in live.timing if t.tick_s > 0]
        return cls(
            cost=cost,
            handoff_s=handoff_s,
            cfs_tick_s=ticks[0].tick_s if ticks else 0.0,
            tick_phase_s=ticks[0].tick_phase_s if ticks else 0.0,
            period_phase_s=tuple(float(np.nan_to_num(t.period_phase_s)) for t in live.timing),
        )


# ------------------------------------------------------------------ live helpers
def _write(path: Path, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _spawn_worker(
    chunks: np.ndarray, tmp: Path, name: str, stdin: int, stdout: int
) -> tuple[subprocess.Popen, Path]:
    """A calworker process that has loaded its chunks; returns (process, records path)."""
    cpath, rpath = tmp / f"{name}.chunks", tmp / f"{name}.records"
    with open(cpath, "wb") as f:
        array("I", chunks.astype(np.uint32).tolist()).tofile(f)
    ready_r, ready_w = os.pipe()
    proc = subprocess.Popen(
        [sys.executable, str(WORKER), str(cpath), str(rpath), str(ready_w)],
        stdin=stdin,
        stdout=stdout,
        pass_fds=(ready_w,),
    )
    os.close(ready_w)
    if os.read(ready_r, 1) != b"r":
        proc.kill()
        raise RuntimeError(f"calibration worker {name} did not start")
    os.close(ready_r)
    return proc, rpath


def _records(raw: array) -> tuple[np.ndarray, float, float]:
    """Per-message rows (seq, read at, done at, CPU), the thread's CPU, its run-queue wait."""
    rec = np.frombuffer(raw, dtype=float).reshape(-1, calworker.RECORD_FIELDS)
    body, trailer = rec[rec[:, 0] >= 0], rec[rec[:, 0] < 0]
    if not len(trailer):
        raise RuntimeError("calibration worker records have no trailer")
    return body, float(trailer[0, 3]), float(trailer[0, 1])


def measure_message_cost(messages: int = 300, max_chunks: int = 400, seed: int = 0) -> MessageCost:
    """Fit the CPU a calibration message costs, uncapped, in a worker process like the
    live run's: least squares of per-message thread CPU on chunks, plus the thread's
    CPU outside the hashing spread over the messages."""
    if messages < 10:
        raise ValueError(f"messages must be >= 10, got {messages}")
    rng = np.random.default_rng(seed)
    chunks = rng.integers(0, max_chunks + 1, messages).astype(np.uint32)
    with tempfile.TemporaryDirectory(prefix="dsched-simcal-") as d:
        tmp = Path(d)
        r, w = os.pipe()
        devnull = os.open(os.devnull, os.O_WRONLY)
        proc, rpath = _spawn_worker(chunks, tmp, "cost", r, devnull)
        os.close(r)
        os.close(devnull)
        for seq in range(messages):
            os.write(w, calworker.MESSAGE.pack(seq, time.perf_counter()))
            # One at a time, as an unloaded operator sees them.
            time.sleep(chunks[seq] * 40e-6 + 0.002)
        os.close(w)
        proc.wait(timeout=120)
        body, total, _ = _records(array("d", rpath.read_bytes()))
    x = chunks[body[:, 0].astype(int)].astype(float)
    slope, intercept = np.polyfit(x, body[:, 3], 1)
    outside = (total - body[:, 3].sum()) / len(body)
    return MessageCost(fixed_s=max(0.0, float(intercept + outside)), per_chunk_s=float(slope))


_PROBE = r"""
import hashlib, random, sys, time
buf = memoryview(bytes(64 * 1024))
perf, end = time.perf_counter, time.perf_counter() + float(sys.argv[1])
rng = random.Random(int(sys.argv[2]))
last, gaps = perf(), []
while last < end:
    hashlib.sha256(buf).digest()
    t = perf()
    if t - last > 0.0015:
        gaps.append(f"{last!r},{t!r}")
        # Pause a random while after each refill, so that the quota runs out at a
        # different point of the period each time (ticks, not the period, show).
        time.sleep(rng.uniform(0.0, 0.02))
        t = perf()
    last = t
print(" ".join(gaps))
"""

#: Scheduler tick lengths of the usual kernel builds (CONFIG_HZ 100, 250, 300, 1000).
TICK_CANDIDATES_S = (0.010, 0.004, 1 / 300, 0.001)


@dataclass(frozen=True)
class CfsTiming:
    """When a group's CFS periods start and where the throttling ticks fall, as
    ``time.perf_counter`` (CLOCK_MONOTONIC) modulo the period and the tick."""

    period_phase_s: float
    tick_s: float  # 0 when the stops fell on no tick grid
    tick_phase_s: float


def _circular(values: np.ndarray, modulus: float) -> tuple[float, float]:
    """Mean and resultant length (1 = all equal) of ``values`` modulo ``modulus``."""
    z = np.exp(2j * np.pi * np.mod(values, modulus) / modulus).mean()
    return float(np.mod(np.angle(z) / (2 * np.pi) * modulus, modulus)), float(abs(z))


def measure_cfs_timing(group: Path, seconds: float = 1.0, seed: int = 0) -> CfsTiming:
    """Measure ``group``'s CFS period phase and quota enforcement tick with a probe.

    The kernel refills a group's quota from one period timer per group; the
    timer's phase differs between groups and keeps across idle periods. A busy
    probe in the group (quota below one core) is throttled once per period and
    resumes right after the refill: the resume times modulo the period give the
    phase. It is throttled when the kernel notices the spent quota, on a
    scheduler tick: the stop times fall on the tick grid, and the longest
    candidate tick whose grid they fit gives tick and tick phase (the probe
    pauses a random while after each refill, so its stops do not repeat with
    the period and only the tick's grid fits). nan when the probe was never
    throttled."""
    period = int(Path(group, "cpu.cfs_period_us").read_text()) / 1e6
    proc = subprocess.Popen(
        [sys.executable, "-c", _PROBE, str(seconds), str(seed)], stdout=subprocess.PIPE, text=True
    )
    _write(group / "cgroup.procs", f"{proc.pid}\n")
    out, _ = proc.communicate(timeout=60)
    gaps = np.array([[float(x) for x in g.split(",")] for g in out.split()]).reshape(-1, 2)
    if not len(gaps):
        return CfsTiming(float("nan"), 0.0, 0.0)
    phase, _ = _circular(gaps[:, 1], period)
    for tick in TICK_CANDIDATES_S:
        tick_phase, _ = _circular(gaps[:, 0], tick)
        off = np.mod(gaps[:, 0] - tick_phase + tick / 2, tick) - tick / 2
        # A stop delayed by something else (an interrupt, a neighbour) lies off the
        # grid; most must lie on it.
        if len(gaps) >= 5 and np.mean(np.abs(off) < 0.1 * tick) >= 0.8:
            return CfsTiming(phase, tick, tick_phase)
    return CfsTiming(phase, 0.0, 0.0)


def measure_handoff_seconds(messages: int = 300) -> float:
    """Mean time from writing a message to an idle calibration worker's pipe until the
    worker has read it: the wake-up every hop of the chain pays."""
    if messages < 10:
        raise ValueError(f"messages must be >= 10, got {messages}")
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory(prefix="dsched-simcal-") as d:
        r, w = os.pipe()
        devnull = os.open(os.devnull, os.O_WRONLY)
        proc, rpath = _spawn_worker(
            np.zeros(messages, dtype=np.uint32), Path(d), "handoff", r, devnull
        )
        os.close(r)
        os.close(devnull)
        sent = np.empty(messages)
        for seq in range(messages):
            # The worker is asleep in read() when the message comes, as in the chain.
            time.sleep(float(rng.uniform(0.002, 0.008)))
            sent[seq] = time.perf_counter()
            os.write(w, calworker.MESSAGE.pack(seq, sent[seq]))
        os.close(w)
        proc.wait(timeout=60)
        body, _, _ = _records(array("d", rpath.read_bytes()))
    return float((body[:, 1] - sent[body[:, 0].astype(int)]).mean())


def _cpu_times() -> tuple[float, float]:
    """(busy, steal) CPU-seconds of the whole machine since boot, from /proc/stat."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    tick = os.sysconf("SC_CLK_TCK")
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields[:8]
    return (user + nice + system + irq + softirq) / tick, steal / tick


def _throttled_seconds(group: Path) -> float:
    for line in (group / "cpu.stat").read_text().splitlines():
        key, _, value = line.partition(" ")
        if key == "throttled_time":
            return int(value) / 1e9
    return 0.0


def run_live(
    setup: CalibrationSetup,
    inputs: CalibrationInputs | None = None,
    mount: Path = CPU_MOUNT,
    isolation: str = "process",
) -> LiveRun:
    """Run the chain on real threads under real CFS quotas (root, cgroup v1)."""
    if isolation not in ISOLATIONS:
        raise ValueError(f"isolation must be one of {', '.join(ISOLATIONS)}, got {isolation!r}")
    inputs = inputs or calibration_inputs(setup)
    n_ops = len(setup.work_ms)
    top = mount / "dsched-simcal"
    top.mkdir(exist_ok=True)
    # Neighbours on a shared machine must not eat into the caps.
    _write(top / "cpu.shares", "65536\n")
    groups = []
    for k in range(n_ops):
        g = top / f"op{k}"
        g.mkdir(exist_ok=True)
        _write(g / "cpu.cfs_period_us", f"{PERIOD_US}\n")
        _write(g / "cpu.cfs_quota_us", f"{int(setup.caps[k] * PERIOD_US)}\n")
        groups.append(g)
    harness = top / "harness"
    harness.mkdir(exist_ok=True)
    try:
        timing = [measure_cfs_timing(g) for g in groups]
        throttled0 = [_throttled_seconds(g) for g in groups]
        busy0, steal0 = _cpu_times()
        with tempfile.TemporaryDirectory(prefix="dsched-simcal-") as d:
            chain = _run_chain(inputs, groups, harness, Path(d), isolation)
        busy1, steal1 = _cpu_times()
        throttled = [_throttled_seconds(g) - t0 for g, t0 in zip(groups, throttled0, strict=True)]
    finally:
        _write(mount / "tasks", f"{threading.get_native_id()}\n")
        for g in [*groups, harness]:
            _rmdir_when_empty(g)
        _rmdir_when_empty(top)
    start, sent, read_at, done_at, cpu, run_delay = chain
    period = PERIOD_US / 1e6
    lat = done_at[-1] - sent
    elapsed = float(done_at[-1].max() - start)
    handoff, handoff_busy = [], []
    for k in range(n_ops):
        handed = sent if k == 0 else done_at[k - 1]
        prev_done = np.concatenate([[-np.inf], done_at[k][:-1]])
        idle = prev_done < handed
        wake = read_at[k] - handed
        handoff.append(float(wake[idle].mean() * 1000))
        if k == 0:
            handoff_busy.append(None)
            continue
        # The sender already held its next message: it went on hashing after the hand-off.
        sender_busy = np.concatenate([done_at[k - 2][1:] if k >= 2 else sent[1:], [np.inf]])
        sel = idle & (sender_busy < handed)
        handoff_busy.append(float(wake[sel].mean() * 1000) if sel.any() else None)
    figures = CalibrationFigures(
        latency_ms_mean=float(lat.mean() * 1000),
        latency_ms_p99=float(np.quantile(lat, 0.99) * 1000),
        cpu_cores=[c / elapsed for c in cpu],
        messages=len(lat),
        seconds=elapsed,
        stage_latency_ms_mean=[float((d - sent).mean() * 1000) for d in done_at],
        throttled_seconds=throttled,
        handoff_ms_mean=handoff,
        handoff_busy_sender_ms_mean=handoff_busy,
        run_delay_seconds=run_delay,
        # Whether the machine was quiet: CPU others used during the run (the harness's
        # own is part of it) and time the hypervisor ran something else on our CPUs.
        other_cpu_seconds=busy1 - busy0 - sum(cpu),
        steal_seconds=steal1 - steal0,
        injection_lag_ms_mean=float((sent - start - inputs.arrivals).mean() * 1000),
    )
    relative = [
        CfsTiming(
            float(np.mod(t.period_phase_s - start, period)),
            t.tick_s,
            float(np.mod(t.tick_phase_s - start, t.tick_s)) if t.tick_s > 0 else 0.0,
        )
        for t in timing
    ]
    return LiveRun(figures, sent - start, relative)


def _rmdir_when_empty(group: Path) -> None:
    # A worker that has just exited can leave its group busy for a moment.
    for _ in range(50):
        try:
            group.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.02)
    group.rmdir()


def _run_chain(
    inputs: CalibrationInputs, groups: list[Path], harness: Path, tmp: Path, isolation: str
):
    """Wire the operators with pipes, hand each message to the first one at its arrival
    time, collect the records: (start, sent, read_at, done_at, cpu) as perf_counter times."""
    n_ops = len(groups)
    _write(harness / "tasks", f"{threading.get_native_id()}\n")
    pipes = [os.pipe() for _ in range(n_ops)]  # pipes[k] feeds operator k
    devnull = os.open(os.devnull, os.O_WRONLY)
    outs = [pipes[k + 1][1] if k + 1 < n_ops else devnull for k in range(n_ops)]
    results: list[array | None] = [None] * n_ops
    procs, threads, rpaths = [], [], []
    if isolation == "process":
        for k in range(n_ops):
            proc, rpath = _spawn_worker(inputs.chunks[k], tmp, f"op{k}", pipes[k][0], outs[k])
            _write(groups[k] / "cgroup.procs", f"{proc.pid}\n")
            procs.append(proc)
            rpaths.append(rpath)
        for k in range(n_ops):
            os.close(pipes[k][0])
            os.close(outs[k])
    else:
        started = threading.Barrier(n_ops + 1)

        def worker(k: int) -> None:
            _write(groups[k] / "tasks", f"{threading.get_native_id()}\n")
            ready_r, ready_w = os.pipe()
            chunks = array("I", inputs.chunks[k].astype(np.uint32).tolist())
            started.wait()
            results[k] = calworker.serve(pipes[k][0], outs[k], chunks, ready_w)
            for fd in (ready_r, ready_w, pipes[k][0], outs[k]):
                os.close(fd)

        threads = [threading.Thread(target=worker, args=(k,), daemon=True) for k in range(n_ops)]
        for t in threads:
            t.start()
        started.wait()
    feed = pipes[0][1]
    time.sleep(0.2)  # let the groups go idle after the timing probes
    n = len(inputs.arrivals)
    sent = np.empty(n)
    start = time.perf_counter()
    for seq, a in enumerate(inputs.arrivals.tolist()):
        delay = start + a - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        sent[seq] = time.perf_counter()
        os.write(feed, calworker.MESSAGE.pack(seq, sent[seq]))
    os.close(feed)
    for p in procs:
        p.wait(timeout=120)
    for t in threads:
        t.join(timeout=120)
    if isolation == "process":
        results = [array("d", p.read_bytes()) for p in rpaths]
    read_at, done_at, cpu, run_delay = [], [], [], []
    for k in range(n_ops):
        if results[k] is None:
            raise RuntimeError(f"calibration operator op{k} did not finish")
        body, total, delay = _records(results[k])
        if len(body) != n:
            raise RuntimeError(f"op{k} processed {len(body)} of {n} messages")
        r, d = np.empty(n), np.empty(n)
        seq = body[:, 0].astype(int)
        r[seq], d[seq] = body[:, 1], body[:, 2]
        read_at.append(r)
        done_at.append(d)
        cpu.append(total)
        run_delay.append(delay)
    return start, sent, read_at, done_at, cpu, run_delay


# ------------------------------------------------------------------ simulated half
def run_sim(
    setup: CalibrationSetup,
    inputs: CalibrationInputs | None = None,
    model: SimModel | None = None,
    arrivals_s: np.ndarray | None = None,
    step_seconds: float = 0.001,
) -> CalibrationFigures:
    """The chain in :class:`ClusterSim` with the live run's work per message.

    ``arrivals_s``: when the messages reach the first operator (default: the
    inputs' arrival times; give the live run's hand-off times to run exactly its
    arrivals). ``model``: the live effects to model (default: none)."""
    inputs = inputs or calibration_inputs(setup)
    model = model or SimModel()
    cost = model.cost or MessageCost(0.0, inputs.chunk_seconds)
    arrivals = inputs.arrivals if arrivals_s is None else np.asarray(arrivals_s, dtype=float)
    if len(arrivals) != len(inputs.arrivals):
        raise ValueError(f"arrivals_s must hold {len(inputs.arrivals)} times, got {len(arrivals)}")
    ops = tuple(OperatorSpec(f"op{k}", w / 1000.0, 1.0) for k, w in enumerate(setup.work_ms))
    app = AppSpec("cal", "gold", ops, ArrivalSpec("poisson", rate=setup.rate))
    sc = Scenario(
        "calibration",
        1,
        2.0,
        (app,),
        epochs=1,
        epoch_seconds=setup.seconds,
        step_seconds=step_seconds,
        seed=setup.seed,
        handoff_s=model.handoff_s,
        cfs_tick_s=model.cfs_tick_s,
    )
    sim = ClusterSim(sc, max_parallelism=1)
    sim.set_arrivals(arrivals, np.zeros(len(arrivals), dtype=np.int64))
    for op in range(sim.n_ops):
        sim.set_parallelism(op, 1, [0])
        sim.set_work_sequence(op, cost.seconds(inputs.chunks[op]))
    inst = np.arange(sim.n_ops) * sim.max_par
    sim.set_caps(inst, np.array(setup.caps))
    if model.period_phase_s is not None:
        sim.set_period_phase(inst, np.array(model.period_phase_s))
    sim.set_tick_phase(model.tick_phase_s)
    last = float(arrivals[-1]) if len(arrivals) else 0.0
    sim.run_steps(max(sc.steps_per_epoch, int(np.ceil(last / sim.dt)) + 1))
    # Let what is in flight finish, as the live run does.
    while sim.in_system() and sim.t < 3 * max(setup.seconds, last):
        sim.run_steps(10)
    rec = sim.take_sinks()
    # The last message finished within the step that ended at its record's time.
    elapsed = float(rec.time_s.max()) if len(rec.time_s) else sim.t
    return CalibrationFigures(
        latency_ms_mean=float((rec.latency_s * rec.count).sum() / rec.count.sum() * 1000),
        latency_ms_p99=weighted_quantile(rec.latency_s, rec.count.astype(float), 0.99) * 1000,
        cpu_cores=(sim.cpu_seconds[inst] / elapsed).tolist(),
        messages=int(rec.count.sum()),
        seconds=elapsed,
        stage_latency_ms_mean=(
            sim.latency_sum[inst] / np.maximum(sim.latency_count[inst], 1) * 1000
        ).tolist(),
        throttled_seconds=sim.throttled_seconds[inst].tolist(),
    )
