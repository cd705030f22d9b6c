"""`dsched demo --engine flink`: the main job against a real Apache Flink cluster.

A local Flink session cluster (JobManager + one TaskManager) starts from the
installed wheels (`make flink`), runs the testbed's streaming SQL WordCount
(files → Calc → GroupAggregate → latency sink, parallelism 2, chaining off)
fed on the same rising and falling rate as the testbed demo, and stops at the
end. `dsched-controller` reads the job's counters from the JobManager's REST
API; `dsched-agent` maps every subtask to its task threads with `jcmd` and caps
them. The per-epoch table and the summary are the testbed demo's.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console

from dsched.signals import INTERRUPTED, StopOnSignals, signal_name
from testbed.demo import Observer, _print_summary, cap_errors, triangle_rate, watch_epochs
from testbed.flink import install
from testbed.flink import metrics as flink_metrics
from testbed.flink.cluster import TM_CLASS, FlinkCluster
from testbed.flink.job import submit_wordcount
from testbed.flink.load import TraceFeeder
from testbed.live.cluster import CGROUP_V1_CPU, LocalCluster, NodeSpec, metric_value, scrape

JOB_NAME = "wordcount"
# Records per second: the testbed demo's sentences/s are ~10 words each.
RECORDS_PER_SENTENCE = 10


def engine_tables(rest_url: str, conf_dir: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The controller's and the agent's `[[engine]]` tables for this cluster.

    The agent's TaskManager pattern names this cluster's configuration directory,
    so a TaskManager of another Flink cluster on the machine is never taken."""
    controller = {"kind": "flink", "rest_url": rest_url}
    agent = {
        "kind": "flink",
        "rest_url": rest_url,
        "taskmanager_cmdline": re.escape(TM_CLASS) + ".*" + re.escape(str(conf_dir)),
    }
    return controller, agent


def run(args: argparse.Namespace, mode: str, console: Console) -> int:
    why = install.missing()
    if why is not None:
        console.print(f"[red]dsched demo --engine flink: {why}[/]")
        return 2
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="dsched-demo-flink-"))
    workdir.mkdir(parents=True, exist_ok=True)
    cgroup_roots = [CGROUP_V1_CPU / args.cgroup_root]
    low = args.low_rate * RECORDS_PER_SENTENCE
    high = args.peak_rate * RECORDS_PER_SENTENCE
    rate = triangle_rate(args.duration, low, high)
    console.print(
        f"dsched demo (Flink): mode [bold]{mode}[/], {args.duration:.0f} s, slot "
        f"{args.slot_seconds:g} s, WordCount SQL job, parallelism {args.parallelism}, "
        f"{low:.0f}→{high:.0f}→{low:.0f} records/s; logs in {workdir}"
    )
    # SIGTERM as Ctrl-C (docs/operations.md, "Stopping"): a stop while Flink or the
    # daemons start ends the start, a later one the run; everything is stopped.
    interrupted = threading.Event()
    stop = StopOnSignals(interrupted).install()
    records: list[dict[str, Any]] = []
    observer = Observer(cgroup_roots)
    flink = FlinkCluster(workdir / "flink")
    cluster: LocalCluster | None = None
    feeder: TraceFeeder | None = None
    job_id = None
    failed = True
    latency_dir = workdir / "latency"
    try:
        t = time.monotonic()
        flink.start(taskmanagers=1, slots=4)
        console.print(
            f"Flink {install.FLINK_VERSION} up in {time.monotonic() - t:.0f} s at {flink.rest_url}"
        )
        job_id = submit_wordcount(
            flink,
            workdir / "input",
            JOB_NAME,
            parallelism=args.parallelism,
            latency_dir=latency_dir,
        )
        flink.wait_running(job_id, timeout=120)
        ctrl_engine, agent_engine = engine_tables(flink.rest_url, flink.conf_dir)
        cluster = LocalCluster(
            workdir / "dsched",
            mode=mode,
            slot_seconds=args.slot_seconds,
            controller_config={
                "theta_cores": 0.02,
                "headroom_cores": 0.1,
                "min_cap_cores": 0.02,
                "engine": [ctrl_engine],
            },
            nodes=[
                NodeSpec(
                    "local",
                    cgroup_root=args.cgroup_root,
                    extra_config={"cpu_period_us": args.cpu_period_us, "engine": [agent_engine]},
                )
            ],
            agent_dry_run=(mode == "dry-run"),
            history=not args.no_history,
        )
        cluster.start()
        agent = next(iter(cluster.agents.values()))
        feeder = TraceFeeder(workdir / "input", rate).start()
        started = time.monotonic()
        records = watch_epochs(
            cluster, agent.metrics, observer, args, started, interrupted, console
        )
        observer.look(cluster.metrics, agent.metrics)
        written = feeder.stop()
        feeder = None
        # Stopped early: what is still in flight is waited for briefly, not for a minute.
        drain = 10 if interrupted.is_set() else 60
        processed = flink_metrics.drain(flink.rest, job_id, written, timeout=drain)
        caps_applied = metric_value(scrape(agent.metrics), "dsched_agent_cap_writes_total") or 0
        state = flink.job_state(job_id)
        flink.cancel(job_id)
        # The agent removes a cancelled job's cgroups within a scan or two.
        deadline = time.monotonic() + 6 * args.slot_seconds
        while observer.left_after() and time.monotonic() < deadline:
            time.sleep(0.25)
        failed = False
    finally:
        if feeder is not None:
            feeder.stop()
        if cluster is not None:
            cluster.stop()
        flink.stop(keep_logs=failed)
        stop.restore()

    lat = flink_metrics.read_latencies(latency_dir, JOB_NAME).astype(float)
    errors = cap_errors(records)
    summary = {
        "records_in": written,
        "records_done": processed,
        "lost": written - processed,
        "job_state_at_end": state,
        "caps_applied": int(caps_applied),
        "cap_error_cores_p50": statistics.median(errors) if errors else None,
        "cap_error_samples": len(errors),
        "latency_ms_mean": float(np.mean(lat)) if len(lat) else None,
        "latency_ms_p99": float(np.sort(lat)[min(len(lat) - 1, math.ceil(0.99 * len(lat)) - 1)])
        if len(lat)
        else None,
        "epochs": len(records),
        "interrupted": interrupted.is_set(),
        "cgroups_created": len(observer.cgroups),
        "cgroups_max_at_once": observer.max_cgroups,
        "cgroups_left_after": observer.left_after(),
    }
    doc = {
        "engine": "flink",
        "mode": mode,
        "duration_seconds": args.duration,
        "slot_seconds": args.slot_seconds,
        "observed_while_running": observer.report(),
        "epochs": [
            {
                "epoch": r["epoch"],
                "operators": [
                    {
                        k: o[k]
                        for k in (
                            "app",
                            "operator",
                            "arrival_rate",
                            "predicted_rate",
                            "cap_cores",
                            "usage_cores",
                            "queue",
                            "latency_ms",
                        )
                    }
                    for o in r["operators"]
                ],
            }
            for r in records
        ],
        "summary": summary,
    }
    _print_summary(console, summary, mode)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(doc, indent=2, default=float) + "\n")
        console.print(f"wrote {args.json}")
    if interrupted.is_set():
        console.print(
            f"[yellow]stopped by {signal_name(stop.signum)}: Flink cluster, controller and agent stopped[/]"
        )
        return INTERRUPTED
    return 0 if summary["lost"] == 0 and state == "RUNNING" else 1
