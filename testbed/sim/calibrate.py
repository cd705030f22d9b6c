"""Calibration: one small chain run live (real threads, real cgroup v1 caps) and simulated.

Live: one OS thread per operator in this process burns each message's CPU work
with hashlib (which releases the GIL, testbed/live/engine.py's ``burn``), under a
per-thread CFS quota in ``<cpu mount>/dsched-simcal/<operator>``; the run's
parent cgroup gets a high ``cpu.shares`` so neighbours on a shared machine do not
eat into the caps. Messages arrive as a Poisson process. Measured: mean and p99
end-to-end latency, and CPU per operator (thread CPU time).

Simulated: the same chain, work, caps and arrivals in :class:`ClusterSim`.
The two agree when latency and CPU are within the tolerance (20 %).
"""

from __future__ import annotations

import os
import queue
import random
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from testbed import traces
from testbed.live.engine import burn
from testbed.sim.engine import ClusterSim
from testbed.sim.scenario import AppSpec, ArrivalSpec, OperatorSpec, Scenario

CPU_MOUNT = Path("/sys/fs/cgroup/cpu")
PERIOD_US = 100_000


@dataclass(frozen=True)
class CalibrationSetup:
    work_ms: tuple[float, ...] = (4.0, 6.0)
    caps: tuple[float, ...] = (0.5, 0.6)
    rate: float = 50.0  # messages/s
    seconds: float = 30.0
    seed: int = 3


@dataclass
class CalibrationFigures:
    latency_ms_mean: float
    latency_ms_p99: float
    cpu_cores: list[float]
    messages: int


def _write(path: Path, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def run_live(setup: CalibrationSetup, mount: Path = CPU_MOUNT) -> CalibrationFigures:
    top = mount / "dsched-simcal"
    top.mkdir(exist_ok=True)
    _write(top / "cpu.shares", "65536\n")
    harness = top / "harness"
    harness.mkdir(exist_ok=True)
    arrivals = traces.poisson_arrivals(setup.rate, setup.seconds, seed=setup.seed)
    queues = [queue.SimpleQueue() for _ in setup.work_ms]
    done: list[float] = []
    cpu = [0.0] * len(setup.work_ms)
    ready = threading.Barrier(len(setup.work_ms) + 1)

    def worker(k: int) -> None:
        group = top / f"op{k}"
        group.mkdir(exist_ok=True)
        _write(group / "cpu.cfs_period_us", f"{PERIOD_US}\n")
        _write(group / "cpu.cfs_quota_us", f"{int(setup.caps[k] * PERIOD_US)}\n")
        _write(group / "tasks", f"{threading.get_native_id()}\n")
        ready.wait()
        wrng = random.Random(setup.seed * 100 + k)
        t0 = time.thread_time()
        while (item := queues[k].get()) is not None:
            # Exponential-ish spread like the simulation's gamma with CV 1.
            burn(wrng.expovariate(1.0 / (setup.work_ms[k] / 1000.0)), wrng)
            if k + 1 < len(queues):
                queues[k + 1].put(item)
            else:
                done.append(time.perf_counter() - item)
        cpu[k] = time.thread_time() - t0
        if k + 1 < len(queues):
            queues[k + 1].put(None)

    _write(harness / "tasks", f"{threading.get_native_id()}\n")
    threads = [threading.Thread(target=worker, args=(k,), daemon=True) for k in range(len(queues))]
    for t in threads:
        t.start()
    ready.wait()
    start = time.perf_counter()
    for a in arrivals:
        delay = start + a - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        queues[0].put(start + a)
    queues[0].put(None)
    for t in threads:
        t.join(timeout=120)
    elapsed = time.perf_counter() - start
    _write(mount / "tasks", f"{threading.get_native_id()}\n")
    for k in range(len(queues)):
        os.rmdir(top / f"op{k}")
    os.rmdir(harness)
    os.rmdir(top)
    lat = np.array(done)
    return CalibrationFigures(
        float(lat.mean() * 1000),
        float(np.quantile(lat, 0.99) * 1000),
        [c / elapsed for c in cpu],
        len(lat),
    )


def run_sim(setup: CalibrationSetup, step_seconds: float = 0.005) -> CalibrationFigures:
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
    )
    sim = ClusterSim(sc, max_parallelism=1)
    for op in range(sim.n_ops):
        sim.set_parallelism(op, 1, [0])
    sim.set_caps(np.arange(sim.n_ops), np.array(setup.caps))
    sim.run_steps(sc.steps_per_epoch)
    # Let what is in flight finish, as the live run does.
    while sim.in_system() and sim.t < 3 * setup.seconds:
        sim.run_steps(100)
    rec = sim.take_sinks()
    order = np.argsort(rec.latency_s)
    cw = np.cumsum(rec.count[order])
    p99 = rec.latency_s[order][np.searchsorted(cw, 0.99 * cw[-1])]
    return CalibrationFigures(
        float((rec.latency_s * rec.count).sum() / rec.count.sum() * 1000),
        float(p99 * 1000),
        (sim.cpu_seconds[: sim.n_ops] / setup.seconds).tolist(),
        int(rec.count.sum()),
    )
