"""Cap accuracy: a saturated thread capped at 0.1 ... 1.0 cores, measured usage per cap.

Each cap runs a hashlib thread (64 KiB buffers, releases the GIL) in its own
instance cgroup under a fresh root, measures the thread's CPU from
/proc/<pid>/task/<tid>/stat over ``--seconds``, and reports |usage - cap|.
The benchmark root gets a high ``cpu.shares`` so that, on a shared machine,
the figure shows what the cap allows rather than what the neighbours leave.
Needs a writable cgroup cpu controller (root).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

from agent.config import AgentConfig
from agent.node import NodeAgent
from agent.registry import InstanceKey
from agent.sampling import thread_cpu_seconds
from bench.common import write_result

RESULTS = Path(__file__).resolve().parent / "results"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seconds", type=float, default=3.0, help="measurement per cap")
    parser.add_argument("--caps", default="0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9,1.0")
    parser.add_argument("--cgroup-mode", default="auto", choices=("auto", "v1", "v2"))
    parser.add_argument("--json", default=str(RESULTS / "cap_accuracy.json"))
    parser.add_argument("--png", default=None, help="default: next to the JSON")


def _busy_thread():
    import hashlib
    import threading

    stop = threading.Event()
    ready = threading.Event()
    box: list[int] = []

    def run() -> None:
        box.append(threading.get_native_id())
        ready.set()
        buf = b"x" * 65536
        while not stop.is_set():
            hashlib.sha256(buf).digest()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    ready.wait(5)
    return t, stop, box[0]


def measure(agent: NodeAgent, cap: float, seconds: float, instance: int) -> float:
    thread, stop, tid = _busy_thread()
    try:
        agent.register("bench", "spin", instance, "w1", False, os.getpid(), tid)
        key = InstanceKey("bench", "spin", instance)
        agent.apply_cap(agent.registry.get(key), cap)
        shares = agent.backend.root / "cpu.shares"
        if shares.exists():
            shares.write_text("262144")
        time.sleep(0.3)
        c0, t0 = thread_cpu_seconds("/proc", os.getpid(), tid), time.monotonic()
        time.sleep(seconds)
        c1, t1 = thread_cpu_seconds("/proc", os.getpid(), tid), time.monotonic()
        return (c1 - c0) / (t1 - t0)
    finally:
        stop.set()
        thread.join()
        time.sleep(0.05)
        agent.sample()  # forgets the instance and removes its cgroup


def run(args: argparse.Namespace) -> int:
    caps = [float(c) for c in args.caps.split(",")]
    if args.seconds <= 0:
        raise SystemExit("--seconds must be > 0")
    root = f"dsched-bench-{os.getpid()}"
    agent = NodeAgent(AgentConfig(cgroup_mode=args.cgroup_mode, cgroup_root=root))
    if agent.backend.mode == "none":
        raise SystemExit("cap-accuracy needs a writable cgroup cpu controller (run as root)")
    rows = []
    try:
        for i, cap in enumerate(caps):
            usage = measure(agent, cap, args.seconds, i)
            rows.append(
                {
                    "cap_cores": cap,
                    "usage_cores": round(usage, 4),
                    "error_cores": round(usage - cap, 4),
                }
            )
            print(f"cap {cap:.2f} cores -> measured {usage:.3f} (error {usage - cap:+.3f})")
    finally:
        agent.backend.remove_root()
        agent.close()
    errors = [abs(r["error_cores"]) for r in rows]
    figures = {
        "cgroup_mode": agent.backend.mode,
        "seconds_per_cap": args.seconds,
        "caps": rows,
        "abs_error_cores_max": max(errors),
        "abs_error_cores_median": statistics.median(errors),
        "within_0_03_cores": all(e <= 0.03 for e in errors),
    }
    write_result(args.json, "cap-accuracy", figures)
    args.png = args.png or str(Path(args.json).with_suffix(".png"))
    if args.png:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(5, 4))
        ax.plot([0, 1.05], [0, 1.05], color="grey", lw=1, label="usage = cap")
        ax.plot(caps, [r["usage_cores"] for r in rows], "o-", label="measured")
        ax.set_xlabel("cap (cores)")
        ax.set_ylabel("measured usage (cores)")
        ax.set_title(f"cgroup {agent.backend.mode} cap accuracy, {args.seconds:g} s per cap")
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.png, dpi=100)
    print(f"max |error| {max(errors):.3f} cores; wrote {args.json}")
    return 0
