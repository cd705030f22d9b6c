"""Agent overhead: CPU and RSS of a real `dsched-agent` managing 500 registered threads.

The agent runs as its own process (dry-run by default, ``--enforce`` caps
nothing but uses the node's cgroup backend) at 1 s sampling. By default it is
connected, as in production, to a controller endpoint in the benchmark process
(a real gRPC ``AgentService`` that welcomes it and takes its reports);
``--no-controller`` points it at a closed port instead, which measures a
disconnected agent retrying with backoff. A second process
starts ``--threads`` sleeping threads, registers each one through
:class:`agent.instance_client.AgentClient` and updates every instance's
counters each second. The agent's CPU (utime + stime) and peak RSS are
measured over ``--seconds``. Targets: < 1 % of one core, < 100 MB RSS.

The window is also cut into ``--windows`` equal parts. On a shared machine
other work inflates a process's CPU time (cold caches, more switches), so the
least loaded part is reported beside the mean, together with the 1-minute load
average before and after. ``dsched_agent_instance_messages_total`` shows how
many socket messages carried the counters (batched: a few a second, not one
per instance).
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

import grpc
import psutil

from bench.common import write_result
from dsched_pb import dsched_pb2 as pb
from dsched_pb import dsched_pb2_grpc as pb_grpc

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


class ReportSink(pb_grpc.AgentServiceServicer):
    """The controller side of AgentService.Connect, reduced to welcoming and counting."""

    def __init__(self) -> None:
        self.reports = 0

    def Connect(self, request_iterator, context):  # noqa: N802 - gRPC method name
        yield pb.ControllerMessage(welcome=pb.Welcome(epoch=0, slot_seconds=10))
        for msg in request_iterator:
            if msg.WhichOneof("body") == "report":
                self.reports += 1


def _start_sink() -> tuple[grpc.Server, ReportSink, int]:
    from concurrent import futures

    sink = ReportSink()
    # The agent pings every 10 s to notice a dead controller; allow that.
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=2),
        options=[
            ("grpc.http2.min_recv_ping_interval_without_data_ms", 5_000),
            ("grpc.keepalive_permit_without_calls", 1),
        ],
    )
    pb_grpc.add_AgentServiceServicer_to_server(sink, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, sink, port


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--threads", type=int, default=500)
    parser.add_argument("--seconds", type=float, default=30.0, help="measurement window")
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument("--windows", type=int, default=3, help="parts the window is cut into")
    parser.add_argument("--enforce", action="store_true", help="run without --dry-run")
    parser.add_argument(
        "--no-controller",
        action="store_true",
        help="leave the agent without a controller (it keeps retrying)",
    )
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


def _messages(port: int) -> float:
    return sum(
        _metric(port, f'dsched_agent_instance_messages_total{{op="{op}"}}') or 0.0
        for op in ("update", "updates")
    )


def run(args: argparse.Namespace) -> int:
    if args.threads < 1 or args.seconds <= 0:
        raise SystemExit("--threads must be >= 1 and --seconds > 0")
    if args.windows < 1:
        raise SystemExit("--windows must be >= 1")
    tmp = Path(tempfile.mkdtemp(prefix="dsched-overhead-"))
    sock = tmp / "agent.sock"
    metrics_port = _free_port()
    sink_server, sink, controller_port = (None, None, _free_port())
    if not args.no_controller:
        sink_server, sink, controller_port = _start_sink()
    cmd = [
        sys.executable,
        "-m",
        "agent.daemon",
        "--socket",
        str(sock),
        "--metrics",
        f"127.0.0.1:{metrics_port}",
        "--controller",
        f"127.0.0.1:{controller_port}",
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
        load_before = os.getloadavg()[0]
        messages0 = _messages(metrics_port)
        t0, c0 = time.monotonic(), sum(proc.cpu_times()[:2])
        rss_max = 0
        marks = [(t0, c0)]
        part = args.seconds / args.windows
        while time.monotonic() - t0 < args.seconds:
            rss_max = max(rss_max, proc.memory_info().rss)
            time.sleep(0.5)
            if time.monotonic() - marks[-1][0] >= part:
                marks.append((time.monotonic(), sum(proc.cpu_times()[:2])))
        t1, c1 = time.monotonic(), sum(proc.cpu_times()[:2])
        messages = _messages(metrics_port) - messages0
        load_after = os.getloadavg()[0]
        managed = _metric(metrics_port, "dsched_agent_threads_managed")
        sample_sum = _metric(metrics_port, "dsched_agent_sample_duration_seconds_sum")
        sample_count = _metric(metrics_port, "dsched_agent_sample_duration_seconds_count")
    finally:
        if registrar is not None:
            registrar.kill()
            registrar.wait()
        agent.terminate()
        agent.wait(timeout=20)
        if sink_server is not None:
            sink_server.stop(grace=0)
    cpu = (c1 - c0) / (t1 - t0)
    if marks[-1][0] < t1 - 0.25:
        marks.append((t1, c1))
    parts = [(cb - ca) / (tb - ta) for (ta, ca), (tb, cb) in zip(marks, marks[1:], strict=False)]
    figures = {
        "mode": "enforce" if args.enforce else "dry-run",
        "controller": "none reachable" if args.no_controller else "connected",
        "reports_received_by_controller": None if sink is None else sink.reports,
        "threads_registered": args.threads,
        "threads_managed": managed,
        "sample_seconds": 1.0,
        "window_seconds": round(t1 - t0, 2),
        "agent_cpu_fraction_of_one_core": round(cpu, 5),
        "agent_cpu_fraction_per_window": [round(p, 5) for p in parts],
        "agent_cpu_fraction_least_loaded_window": round(min(parts), 5),
        "load_average_1m_before_after": [round(load_before, 2), round(load_after, 2)],
        "instance_messages_per_second": round(messages / (t1 - t0), 2),
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
                    "agent_cpu_fraction_least_loaded_window",
                    "load_average_1m_before_after",
                    "instance_messages_per_second",
                    "agent_rss_bytes_max",
                    "threads_managed",
                    "mean_sample_pass_seconds",
                )
            }
        )
    )
    return 0
