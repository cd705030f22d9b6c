"""Agent overhead: CPU and RSS of a real `dsched-agent` managing 500 registered threads.

The agent runs as its own process (dry-run by default, ``--enforce`` caps
nothing but uses the node's cgroup backend) at 1 s sampling. A second process
starts ``--threads`` sleeping threads, registers each one through
:class:`agent.instance_client.AgentClient` and updates every instance's
counters each second. The agent's CPU (utime + stime) and peak RSS are
measured over ``--seconds``. Targets: < 1 % of one core, < 100 MB RSS.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil

from bench.common import write_result

RESULTS = Path(__file__).resolve().parent / "results"

REGISTRAR = r"""
import sys, threading, time
from agent.instance_client import AgentClient
sock, n = sys.argv[1], int(sys.argv[2])
client = AgentClient(sock)
stop = threading.Event()
def instance(i):
    client.register("bench", "op%d" % (i // 50), i % 50, "w1", False)
    stop.wait()
threads = [threading.Thread(target=instance, args=(i,), daemon=True) for i in range(n)]
for t in threads: t.start()
k = 0
while True:
    k += 1
    for i in range(n):
        client.update("bench", "op%d" % (i // 50), i % 50, received=k, executed=k, emitted=k,
                      queue_length=0, latency_sum_seconds=k * 0.001, latency_count=k,
                      service_seconds=k * 0.0001)
    time.sleep(1.0)
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--threads", type=int, default=500)
    parser.add_argument("--seconds", type=float, default=30.0, help="measurement window")
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument("--enforce", action="store_true", help="run without --dry-run")
    parser.add_argument("--json", default=str(RESULTS / "agent_overhead.json"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _metric(port: int, name: str) -> float | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
            for line in r.read().decode().splitlines():
                if line.startswith(name + " "):
                    return float(line.split()[1])
    except OSError:
        return None
    return None


def run(args: argparse.Namespace) -> int:
    if args.threads < 1 or args.seconds <= 0:
        raise SystemExit("--threads must be >= 1 and --seconds > 0")
    tmp = Path(tempfile.mkdtemp(prefix="dsched-overhead-"))
    sock = tmp / "agent.sock"
    metrics_port = _free_port()
    cmd = [
        sys.executable,
        "-m",
        "agent.daemon",
        "--socket",
        str(sock),
        "--metrics",
        f"127.0.0.1:{metrics_port}",
        "--controller",
        f"127.0.0.1:{_free_port()}",
        "--slot-seconds",
        "10",
        "--cgroup-root",
        f"dsched-bench-{os.getpid()}",
        "--log-level",
        "WARNING",
    ]
    if not args.enforce:
        cmd.append("--dry-run")
    agent = subprocess.Popen(cmd, stderr=subprocess.DEVNULL)
    registrar = None
    try:
        deadline = time.monotonic() + 30
        while not sock.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        registrar = subprocess.Popen(
            [sys.executable, "-c", REGISTRAR, str(sock), str(args.threads)]
        )
        deadline = time.monotonic() + 60
        while (_metric(metrics_port, "dsched_agent_threads_managed") or 0) < args.threads:
            if time.monotonic() > deadline:
                raise SystemExit("the agent never saw all threads registered")
            time.sleep(0.2)
        time.sleep(args.warmup)
        proc = psutil.Process(agent.pid)
        t0, c0 = time.monotonic(), sum(proc.cpu_times()[:2])
        rss_max = 0
        while time.monotonic() - t0 < args.seconds:
            rss_max = max(rss_max, proc.memory_info().rss)
            time.sleep(0.5)
        t1, c1 = time.monotonic(), sum(proc.cpu_times()[:2])
        managed = _metric(metrics_port, "dsched_agent_threads_managed")
        sample_sum = _metric(metrics_port, "dsched_agent_sample_duration_seconds_sum")
        sample_count = _metric(metrics_port, "dsched_agent_sample_duration_seconds_count")
    finally:
        if registrar is not None:
            registrar.kill()
            registrar.wait()
        agent.terminate()
        agent.wait(timeout=20)
    cpu = (c1 - c0) / (t1 - t0)
    figures = {
        "mode": "enforce" if args.enforce else "dry-run",
        "threads_registered": args.threads,
        "threads_managed": managed,
        "sample_seconds": 1.0,
        "window_seconds": round(t1 - t0, 2),
        "agent_cpu_fraction_of_one_core": round(cpu, 5),
        "agent_rss_bytes_max": rss_max,
        "mean_sample_pass_seconds": (sample_sum / sample_count) if sample_count else None,
        "target_cpu_fraction": 0.01,
        "target_rss_bytes": 100 * 1024 * 1024,
        "meets_cpu_target": cpu < 0.01,
        "meets_rss_target": rss_max < 100 * 1024 * 1024,
    }
    write_result(args.json, "agent-overhead", figures)
    print(
        json.dumps(
            {
                k: figures[k]
                for k in (
                    "agent_cpu_fraction_of_one_core",
                    "agent_rss_bytes_max",
                    "threads_managed",
                    "mean_sample_pass_seconds",
                )
            }
        )
    )
    return 0
