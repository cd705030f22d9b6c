"""The main job on embedded defaults: a controller, a local agent and the live
WordCount testbed (source → split → count, real threads doing real CPU work)
under a rising and falling input rate.

Runs in enforce mode when this machine's cgroups are writable (caps land under
/sys/fs/cgroup/cpu/<cgroup-root>/...), otherwise in dry-run with one line
saying why. Every epoch prints a table; the end prints a summary. With --json
the epochs and the summary are written for later analysis. While it runs, the
demo looks at both /metrics endpoints and at the cgroup tree every slot and
once more before the instances stop, as an operator would.

With --nodes 2 (or more) the machine stands for a small cluster: one agent per
"node", each capping its cgroup root (<cgroup-root>-n1, ...) at --node-cores;
WordCount runs in worker processes, one stateful and one stateless per node,
all starting on n1. As the rate rises n1 overloads and the controller's `liu`
placement moves instances to n2 through the testbed's move endpoint (pause,
drain, snapshot, restart, resume); as it falls a node holding only stateless
workers is emptied again. The summary and the JSON's `placement` say what moved
and which workers it affected; lost and duplicated tuples are counted by
tuple id.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from dsched.signals import INTERRUPTED, StopOnSignals, signal_name
from testbed.live.actuator import MoveEndpoint
from testbed.live.cluster import (
    CGROUP_V1_CPU,
    LocalCluster,
    NodeSpec,
    cgroups_writable,
    metric_value,
    scrape,
)
from testbed.live.distributed import DistributedTopology
from testbed.live.engine import LiveTopology
from testbed.live.topology import Topology
from testbed.live.wordcount import FANOUT, wordcount

CONTROLLER_METRICS = (
    "dsched_agents_connected",
    "dsched_dry_run",
    "dsched_controller_epoch_duration_seconds",
    "dsched_instance_cpu_cap_cores",
    "dsched_operator_predicted_rate_tuples_per_second",
)
AGENT_METRICS = (
    "dsched_agent_threads_managed",
    "dsched_instance_cpu_usage_cores",
    "dsched_agent_cap_writes_total",
    "dsched_agent_rejected_directives_total",
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--duration", type=float, default=120.0, help="seconds of input (default 120)")
    p.add_argument(
        "--mode",
        choices=["enforce", "dry-run"],
        help="default: enforce when cgroups are writable, else dry-run",
    )
    p.add_argument("--json", type=Path, help="write epochs and summary as JSON to this path")
    p.add_argument("--slot-seconds", type=float, default=2.0, help="control period (default 2)")
    p.add_argument("--peak-rate", type=float, default=300.0, help="peak sentences/s (default 300)")
    p.add_argument("--low-rate", type=float, default=40.0, help="lowest sentences/s (default 40)")
    p.add_argument("--parallelism", type=int, default=4, help="instances per operator (default 4)")
    p.add_argument(
        "--cgroup-root", default="dsched", help="agent's cgroup directory (default dsched)"
    )
    p.add_argument("--workdir", type=Path, help="state, sockets and logs (default: a temp dir)")
    p.add_argument(
        "--cpu-period-us",
        type=int,
        default=10_000,
        help="CFS period the agent uses (default 10000: short periods keep a throttled "
        "thread from stalling its process's other threads for long)",
    )
    p.add_argument(
        "--no-history",
        action="store_true",
        help="do not run the embedded Spark history (it starts a JVM)",
    )
    p.add_argument(
        "--nodes",
        type=int,
        default=1,
        help="agents standing for nodes on this machine (default 1; 2 or more: placement "
        "and live moves)",
    )
    p.add_argument(
        "--node-cores",
        type=float,
        default=0.8,
        help="CPU capacity of each node with --nodes 2 or more (default 0.8)",
    )
    p.add_argument("--quiet", action="store_true", help="no per-epoch tables")
    p.add_argument(
        "--engine",
        choices=["testbed", "flink"],
        default="testbed",
        help="testbed: the project's WordCount (default); flink: a local Apache Flink "
        "cluster started from the installed wheels (`make flink`) running a streaming "
        "SQL WordCount (rates are sentences/s x 10 records)",
    )


MAX_NODES = 8


def check_arguments(args: argparse.Namespace) -> None:
    """Refuse what cannot run, naming the flag, before anything starts."""

    def positive(value: float, flag: str) -> None:
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"{flag} must be a finite number > 0, got {value!r}")

    positive(args.duration, "--duration")
    positive(args.slot_seconds, "--slot-seconds")
    positive(args.peak_rate, "--peak-rate")
    if not (math.isfinite(args.low_rate) and 0 <= args.low_rate <= args.peak_rate):
        raise ValueError(
            f"--low-rate must be between 0 and --peak-rate ({args.peak_rate:g}), "
            f"got {args.low_rate!r}"
        )
    if args.parallelism < 1:
        raise ValueError(f"--parallelism must be >= 1, got {args.parallelism}")
    if not 1 <= args.nodes <= MAX_NODES:
        raise ValueError(f"--nodes must be between 1 and {MAX_NODES}, got {args.nodes}")
    if getattr(args, "engine", "testbed") == "flink" and args.nodes > 1:
        raise ValueError("--nodes: the Flink demo runs one node (Flink places its subtasks)")
    positive(args.node_cores, "--node-cores")


def triangle_rate(duration: float, low: float, high: float):
    """Rise from low to high over the first half of the run, fall over the second."""

    def rate(t: float) -> float:
        phase = min(max(t / duration, 0.0), 1.0)
        return low + (high - low) * (1.0 - abs(2.0 * phase - 1.0))

    return rate


def epoch_table(rec: dict[str, Any]) -> Table:
    apps = sorted({o["app"] for o in rec["operators"]})
    t = Table(title=f"epoch {rec['epoch']} ({rec['mode']}) {', '.join(apps)}", title_justify="left")
    for col in ("operator", "arrival/s", "predicted/s", "cap", "CPU", "queue", "latency ms"):
        t.add_column(col, justify="left" if col == "operator" else "right")
    for o in rec["operators"]:
        lat = o["latency_ms"]
        t.add_row(
            o["operator"] if len(apps) == 1 else f"{o['app']}/{o['operator']}",
            f"{o['arrival_rate']:.0f}",
            f"{o['predicted_rate']:.0f}",
            f"{o['cap_cores']:.2f}",
            f"{o['usage_cores']:.2f}",
            f"{o['queue']:.0f}",
            "-" if lat is None else f"{lat:.1f}",
        )
    return t


def cap_errors(records: list[dict[str, Any]], saturated_fraction: float = 0.5) -> list[float]:
    """|usage − cap| of saturated capped instances.

    An instance is saturated in a slot when it wanted more CPU than its cap for
    most of the slot. The kernel says so: a thread capped at c cores that is
    runnable all the time is throttled for (1 − c) of every period, so
    ``throttled_seconds / ((1 − c) · slot)`` is the part of the slot it spent
    held back. A brief burst also shows some throttling but says nothing about
    how well the cap holds, so only slots held back for at least
    ``saturated_fraction`` count, and only when the cap did not change during
    the slot (a cap changed mid-slot has no single target).
    """
    errors = []
    prev_caps: dict[tuple, float | None] = {}
    for rec in records:
        slot = rec["slot_seconds"]
        for i in rec["instances"]:
            key = (i["app"], i["operator"], i["instance"])
            cap = i.get("cap_in_force")
            throttled = i.get("throttled_seconds") or 0.0
            if cap and cap < 1 and prev_caps.get(key) == cap:
                if throttled >= saturated_fraction * (1 - cap) * slot:
                    errors.append(abs(i["usage_cores"] - cap))
            prev_caps[key] = cap
    return errors


def placement_figure(records: list[dict[str, Any]]) -> dict[str, Any]:
    """What placement did, from the controller's decision records.

    A plan is reported in ``record["placement"]`` of the first epoch after it
    finished (planning and moving run beside the epochs); each one is listed
    with the epoch it was planned in, its moves, the workers it affected and
    what the move actuator did, and the counts are summed.
    """
    plans = []
    for rec in records:
        p = rec.get("placement") or {}
        if not p.get("planned"):
            continue
        plans.append(
            {
                "planned_in_epoch": p.get("epoch"),
                "reported_in_epoch": rec.get("epoch"),
                "strategy": p.get("strategy"),
                "actuator": p.get("actuator"),
                "moves": p.get("moves", []),
                "affected_workers": p.get("affected_workers", 0),
                "affected_stateful_workers": p.get("affected_stateful_workers", 0),
                "stateful_moves": p.get("stateful_moves", 0),
                "reasons": p.get("reasons", []),
                "result": p.get("result"),
            }
        )
    return {
        "plans": plans,
        "moves": sum(len(p["moves"]) for p in plans),
        "affected_workers": sum(p["affected_workers"] for p in plans),
        "affected_stateful_workers": sum(p["affected_stateful_workers"] for p in plans),
        "stateful_moves": sum(p["stateful_moves"] for p in plans),
    }


def _cgroup_dirs(roots: list[Path]) -> set[str]:
    """The cgroups below ``roots``, as paths relative to their hierarchy."""
    found = set()
    for root in roots:
        try:
            found.update(str(p.relative_to(root.parent)) for p in root.rglob("*") if p.is_dir())
        except FileNotFoundError:
            pass  # no root (dry-run), or a cgroup removed while we walked the tree
    return found


class Observer:
    """What an operator would check while the demo runs: both /metrics endpoints and
    the cgroup tree.

    :meth:`look` is called every slot and once more before the instances stop,
    so that instance cgroups are seen whenever the first caps come, however late
    a loaded machine makes them; :meth:`report` gives every metric and every
    instance cgroup seen, and the most cgroups seen at one look.
    """

    def __init__(self, cgroup_roots: list[Path]):
        self.cgroup_roots = cgroup_roots
        self.before = _cgroup_dirs(cgroup_roots)  # not the demo's: left out of every count
        self.looks = 0
        self.metrics_unreachable = 0  # looks at which a /metrics endpoint did not answer
        self._ctrl: set[str] = set()
        self._agent: set[str] = set()
        self.cgroups: set[str] = set()
        self.max_cgroups = 0

    def look(self, controller_metrics: str, agent_metrics: str) -> None:
        """Scrape both /metrics addresses (host:port) and walk the cgroup tree."""
        self.looks += 1
        for address, names, seen in (
            (controller_metrics, CONTROLLER_METRICS, self._ctrl),
            (agent_metrics, AGENT_METRICS, self._agent),
        ):
            try:
                text = scrape(address)
            except OSError:
                self.metrics_unreachable += 1
                continue
            seen.update(m for m in names if m in text)
        now = _cgroup_dirs(self.cgroup_roots) - self.before
        self.cgroups |= now
        self.max_cgroups = max(self.max_cgroups, len(now))

    def left_after(self) -> list[str]:
        """Cgroups of the demo still there (after the instances stopped, the agent
        removes them)."""
        return sorted(_cgroup_dirs(self.cgroup_roots) - self.before)

    def report(self) -> dict[str, Any]:
        return {
            "looks": self.looks,
            "metrics_unreachable": self.metrics_unreachable,
            "controller_metrics": [m for m in CONTROLLER_METRICS if m in self._ctrl],
            "agent_metrics": [m for m in AGENT_METRICS if m in self._agent],
            "cgroups": sorted(self.cgroups),
            "max_cgroups_at_once": self.max_cgroups,
        }


def watch_epochs(
    cluster: LocalCluster,
    agent_metrics: str,
    observer: Observer,
    args: argparse.Namespace,
    started: float,
    interrupted: threading.Event,
    console: Console,
    on_epoch: Any = None,
) -> list[dict[str, Any]]:
    """Until ``args.duration`` has passed since ``started`` (or Ctrl-C): every new
    decision record with operators, printed as a table unless ``--quiet``; the
    observer looks once a slot."""
    records: list[dict[str, Any]] = []
    last_epoch, next_look = 0, time.monotonic()
    while time.monotonic() - started < args.duration and not interrupted.is_set():
        time.sleep(0.25)
        if time.monotonic() >= next_look:
            observer.look(cluster.metrics, agent_metrics)
            next_look = time.monotonic() + args.slot_seconds
        rec = cluster.plan()
        if rec and rec["epoch"] != last_epoch and rec["operators"]:
            last_epoch = rec["epoch"]
            records.append(rec)
            if on_epoch is not None:
                on_epoch(rec)
            if not args.quiet:
                console.print(epoch_table(rec))
    return records


def run(args: argparse.Namespace) -> int:
    check_arguments(args)
    console = Console()
    writable, why = cgroups_writable()
    mode = args.mode or ("enforce" if writable else "dry-run")
    if mode == "enforce" and not writable:
        console.print(f"[yellow]enforce requested but {why}; running in dry-run[/]")
        mode = "dry-run"
    elif args.mode is None and not writable:
        console.print(f"[yellow]dry-run: {why}[/]")
    if args.engine == "flink":
        from testbed import demo_flink  # starts JVMs: only loaded when asked for

        return demo_flink.run(args, mode, console)
    several = args.nodes > 1
    # One cgroup root per node: a node's agent caps its root at the node's capacity.
    roots = (
        {f"n{k}": f"{args.cgroup_root}-n{k}" for k in range(1, args.nodes + 1)}
        if several
        else {"local": args.cgroup_root}
    )
    cgroup_roots = [CGROUP_V1_CPU / r for r in roots.values()]

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="dsched-demo-"))
    controller_config: dict[str, Any] = {
        "theta_cores": 0.05,
        "headroom_cores": 0.1,
        "min_cap_cores": 0.05,
    }
    node_config: dict[str, Any] = {"cpu_period_us": args.cpu_period_us}
    endpoint = None
    # SIGTERM as Ctrl-C: from here on a stop only sets `interrupted`; a stop while
    # the daemons start ends the start (dsched.signals.check_stop), one later ends
    # the run after the current slot. Either way everything started is stopped.
    interrupted = threading.Event()
    stop = StopOnSignals(interrupted).install()
    if several:
        node_config["capacity_cores"] = args.node_cores
        controller_config["placement"] = "liu"
        if mode == "enforce":
            # Started before the controller, which is configured with its URL; the
            # topology is attached once the agents run.
            endpoint = MoveEndpoint().start()
            controller_config["move_actuator"] = "testbed"
            controller_config["move_url"] = endpoint.url
    cluster = LocalCluster(
        workdir,
        mode=mode,
        slot_seconds=args.slot_seconds,
        controller_config=controller_config,
        nodes=[
            NodeSpec(node, cgroup_root=root, extra_config=dict(node_config))
            for node, root in roots.items()
        ],
        agent_dry_run=(mode == "dry-run"),
        history=not args.no_history,
    )
    spec = wordcount(parallelism=args.parallelism)
    rate = triangle_rate(args.duration, args.low_rate, args.peak_rate)
    where = (
        f"{args.nodes} nodes of {args.node_cores:g} cores, all instances starting on n1"
        if several
        else "one node"
    )
    console.print(
        f"dsched demo: mode [bold]{mode}[/], {args.duration:.0f} s, slot {args.slot_seconds:g} s, "
        f"WordCount {args.parallelism}x3 instances, {args.low_rate:.0f}→{args.peak_rate:.0f}→"
        f"{args.low_rate:.0f} sentences/s (~{spec.cpu_per_root_ms(FANOUT) * args.peak_rate / 1000:.2f} "
        f"cores at peak), {where}; logs in {workdir}"
    )
    records: list[dict[str, Any]] = []
    history_lags: list[float] = []  # age of the newest readable history window, per epoch
    observer = Observer(cgroup_roots)
    started = time.monotonic()
    topo: Topology | None = None
    try:
        cluster.start()
        agent = next(iter(cluster.agents.values()))
        if several:
            topo = DistributedTopology(
                spec, rate, nodes={n: str(a.socket) for n, a in cluster.agents.items()}
            )
            topo.start()
            if endpoint is not None:
                endpoint.attach(topo)
        else:
            topo = LiveTopology(spec, rate, node="local", agent_socket=str(agent.socket))
            topo.start()

        def on_epoch(rec: dict[str, Any]) -> None:
            lag = metric_value(scrape(cluster.metrics), "dsched_history_lag_seconds")
            if lag is not None:
                history_lags.append(lag)

        records = watch_epochs(
            cluster, agent.metrics, observer, args, started, interrupted, console, on_epoch
        )
        observer.look(cluster.metrics, agent.metrics)  # the last, all instances still running
        stats = topo.stop()
        topo = None
        caps_applied = sum(
            metric_value(scrape(a.metrics), "dsched_agent_cap_writes_total") or 0.0
            for a in cluster.agents.values()
        )
    finally:
        if topo is not None:
            topo.stop(drain_timeout=10)
        if endpoint is not None:
            endpoint.stop()
        cluster.stop()
        stop.restore()

    errors = cap_errors(records)
    placement = placement_figure(records)
    lat = sorted(stats.latencies)
    summary = {
        "tuples_in": stats.roots,
        "tuples_done": stats.completed,
        "lost": stats.lost,
        "duplicated": stats.duplicated,
        "failed": stats.failed,
        "caps_applied": int(caps_applied),
        "cap_error_cores_p50": statistics.median(errors) if errors else None,
        "cap_error_samples": len(errors),
        "latency_ms_mean": 1000 * statistics.fmean(lat) if lat else None,
        "latency_ms_p99": 1000 * lat[min(len(lat) - 1, math.ceil(0.99 * len(lat)) - 1)]
        if lat
        else None,
        "epochs": len(records),
        # The newest window the controller can read, compared with the slot just
        # ended: lag ≤ one slot means the history keeps up.
        "history_lag_seconds_median": statistics.median(history_lags) if history_lags else None,
        "history_lag_slots_median": (
            statistics.median(history_lags) / args.slot_seconds if history_lags else None
        ),
        "placement_plans": len(placement["plans"]),
        "affected_workers": placement["affected_workers"],
        "interrupted": interrupted.is_set(),
        # Instance cgroups seen while it ran (none in dry-run), the most at one
        # look (every slot and at the end), and those still there after the
        # instances stopped (the agent removes them).
        "cgroups_created": len(observer.cgroups),
        "cgroups_max_at_once": observer.max_cgroups,
        "cgroups_left_after": observer.left_after(),
    }
    doc = {
        "mode": mode,
        "duration_seconds": args.duration,
        "slot_seconds": args.slot_seconds,
        "nodes": {node: (args.node_cores if several else None) for node in roots},
        "observed_while_running": observer.report(),
        "epochs": [
            {
                "epoch": r["epoch"],
                "operators": [
                    {
                        "app": o["app"],
                        "operator": o["operator"],
                        "arrival": o["arrival_rate"],
                        "predicted": o["predicted_rate"],
                        "cap_cores": o["cap_cores"],
                        "usage_cores": o["usage_cores"],
                        "queue": o["queue"],
                        "latency_ms": o["latency_ms"],
                    }
                    for o in r["operators"]
                ],
            }
            for r in records
        ],
        "placement": placement,
        "summary": summary,
    }
    _print_summary(console, summary, mode)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(doc, indent=2, default=float) + "\n")
        console.print(f"wrote {args.json}")
    if interrupted.is_set():
        console.print(
            f"[yellow]stopped by {signal_name(stop.signum)}: controller, agent and instances stopped[/]"
        )
        return INTERRUPTED
    return 0 if summary["lost"] == 0 else 1


def _print_summary(console: Console, s: dict[str, Any], mode: str) -> None:
    t = Table(title=f"summary ({mode})", title_justify="left", show_header=False)
    t.add_column("what")
    t.add_column("value", justify="right")
    for k, v in s.items():
        if isinstance(v, float):
            v = f"{v:.3f}"
        elif isinstance(v, list):
            v = f"{len(v)} dirs"
        t.add_row(k, str(v))
    console.print(t)
