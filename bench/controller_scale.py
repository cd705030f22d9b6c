"""controller-scale: one control epoch's compute on a synthetic cluster, no network.

Builds a ObservedCluster directly from synthetic NodeReports (WordCount-shaped
chains, a quarter of the apps over-subscribed so the DP has to divide), warms
the cached ARIMA state of every source, then times whole epochs of
`Controller.run_epoch` with the decision record, and separately the division
(DP + shares + anti-saturation) and the DP alone. Reports how the epoch grows
with nodes and with apps.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import tempfile
import time
from collections import deque
from pathlib import Path

import numpy as np

from bench.common import reference_seconds, write_result
from controller.config import ControllerConfig
from controller.core import Controller, tune_gc
from controller.model import OperatorKey
from controller.stages.forecast import SourceHistory
from dsched_pb import dsched_pb2 as pb
from spark_stream.config import HistoryConfig

OPS = (
    ("source", (), 0.0002, 1),
    ("split", ("source",), 0.001, 5),
    ("count", ("split",), 0.0003, 0),
)
CLASSES = ("gold", "silver", "bronze")
# Where an epoch's CPU goes, in order (Controller.last_timing has each as
# "<stage>_cpu"): evaluate; the pure epoch's forecast, demand, allocate and
# hysteresis (with anti-saturation); the latency estimates and peaks (after the
# directives); the memory update, caps written to the store and directives; the
# decision record and queueing it for the store's writer thread.
STAGES = (
    "evaluate",
    "forecast",
    "demand",
    "allocate",
    "hysteresis",
    "estimate",
    "act_and_memory",
    "record_and_store",
)
# A fixed order keeps the one-off warm-up fits short; timed epochs never refit.
ARIMA_ORDER = (1, 0, 0)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--nodes", type=int, default=1000, help="nodes at the largest size (default 1000)"
    )
    p.add_argument("--instances", type=int, default=20000, help="instances at the largest size")
    p.add_argument("--apps", type=int, default=500, help="applications at the largest size")
    p.add_argument("--cores", type=float, default=4.0, help="cores per node (default 4)")
    p.add_argument("--epochs", type=int, default=5, help="timed epochs per size (default 5)")
    p.add_argument("--warmup", type=int, default=4, help="epochs before timing (default 4)")
    p.add_argument(
        "--history", type=int, default=40, help="past points per source series (default 40)"
    )
    p.add_argument("--json", type=Path, default=Path("bench/results/controller_scale.json"))
    p.add_argument("--png", type=Path, help="default: next to the JSON")
    p.add_argument("--quick", action="store_true", help="only the largest size")


class SyntheticCluster:
    """Cumulative counters for ``apps`` chains spread over ``nodes``, reported per node."""

    def __init__(
        self, controller: Controller, nodes: int, instances: int, apps: int, cores: float, seed=0
    ):
        self.c, self.rng = controller, np.random.default_rng(seed)
        per_op = max(1, instances // (apps * len(OPS)))
        self.nodes = [f"n{i}" for i in range(nodes)]
        for n in self.nodes:
            controller.on_hello(pb.Hello(node_id=n, cpu_capacity_cores=cores, slot_seconds=10.0))
        self.rows = []  # (node, app, op, instance, upstream, kappa, fanout, share of app rate)
        k = 0
        for a in range(apps):
            app = f"app{a}"
            for op, up, kappa, fanout in OPS:
                for i in range(per_op):
                    self.rows.append((self.nodes[k % nodes], app, op, i, up, kappa, fanout))
                    k += 1
        # Per app CPU per sentence ~2.7 ms; size rates so the cluster is ~1.3x over-subscribed.
        total_cores = nodes * cores
        base = total_cores * 1.3 / (apps * 0.0027)
        self.rate = {f"app{a}": base * self.rng.uniform(0.3, 1.7) for a in range(apps)}
        self.per_op = per_op
        self.totals = np.zeros((len(self.rows), 4))  # received, cpu, lat, done
        self.slot = 0
        for a in range(apps):
            controller.qos.set(f"app{a}", CLASSES[a % 3], 0.0)

    def report(self, now: float) -> None:
        self.slot += 1
        by_node: dict[str, list] = {}
        noise = self.rng.normal(1.0, 0.05, len(self.rows))
        for idx, (node, app, op, i, up, kappa, fanout) in enumerate(self.rows):
            mult = {"source": 1, "split": 1, "count": 5}[op]
            n = self.rate[app] * 10.0 * mult * noise[idx] / self.per_op
            t = self.totals[idx]
            t[0] += int(n)
            t[1] += n * kappa
            if not fanout:
                t[2] += 0.05 * n
                t[3] += int(n)
            by_node.setdefault(node, []).append(
                pb.InstanceSample(
                    key=pb.InstanceKey(app=app, operator=op, instance=i),
                    upstream=list(up),
                    received_total=int(t[0]),
                    executed_total=int(t[0]),
                    emitted_total=int(t[0]) * fanout,
                    cpu_seconds_total=t[1],
                    latency_sum_seconds_total=t[2],
                    latency_count_total=int(t[3]),
                    service_seconds_total=t[1],
                )
            )
        for node, samples in by_node.items():
            self.c.on_report(
                pb.NodeReport(
                    node_id=node,
                    slot=self.slot,
                    timestamp=now,
                    slot_seconds=10.0,
                    instances=samples,
                )
            )


def measure(nodes: int, instances: int, apps: int, args) -> dict:
    tune_gc()  # as dsched-controller does at startup
    with tempfile.TemporaryDirectory() as d:
        clock = [1_700_000_000.0]
        # Placement and the history spool run off the epoch's thread in the
        # controller; they are left out so the figure is the epoch itself.
        cfg = ControllerConfig(
            state_dir=Path(d),
            slot_seconds=10.0,
            forget_after_slots=1000,
            placement="none",
            history=HistoryConfig(enabled=False),
        )
        c = Controller(cfg, clock=lambda: clock[0])
        # The long source history comes pre-filled (as the history store would
        # supply it); the first warm-up epoch fits every source's ARIMA once,
        # the timed epochs only advance the cached filters.
        c.memory.sources = SourceHistory(cfg.arima_history, fits_per_epoch=10**9, order=ARIMA_ORDER)
        cluster = SyntheticCluster(c, nodes, instances, apps, args.cores)
        for _ in range(2):  # baselines, then the first slot: operators exist from here on
            clock[0] += 10.0
            cluster.report(clock[0])
            c.run_epoch()
        rng = np.random.default_rng(1)
        for app, rate in cluster.rate.items():
            past = rate * (1 + 0.1 * np.sin(np.arange(args.history) / 3))
            past *= rng.normal(1, 0.03, args.history)
            c.memory.sources.series[OperatorKey(app, "source")] = deque(
                past.tolist(), maxlen=cfg.arima_history
            )
        for _ in range(args.warmup):
            clock[0] += 10.0
            cluster.report(clock[0])
            c.run_epoch()
        epoch, alloc, dp, compute, stages = [], [], [], [], []
        for _ in range(args.epochs):
            clock[0] += 10.0
            cluster.report(clock[0])
            a0 = c.metrics.allocation_duration._sum.get()
            t0 = time.perf_counter()
            rec = c.run_epoch()
            epoch.append(time.perf_counter() - t0)
            alloc.append(c.metrics.allocation_duration._sum.get() - a0)
            dp.append(rec["dp"]["seconds"])
            compute.append(c.last_timing["compute"])
            stages.append(dict(c.last_timing))
        arima = sum(1 for o in rec["operators"] if "arima" in o["candidates"])
        c.stop()
    return {
        "nodes": nodes,
        "instances": len(rec["instances"]),
        "apps": apps,
        "epoch_seconds_median": statistics.median(epoch),
        "epoch_seconds_p95": float(np.percentile(epoch, 95)),
        "compute_seconds_median": statistics.median(compute),
        "compute_seconds_p95": float(np.percentile(compute, 95)),
        "compute_cpu_seconds_median": statistics.median(s["compute_cpu"] for s in stages),
        "epoch_cpu_seconds_median": statistics.median(s["epoch_cpu"] for s in stages),
        "allocation_seconds_median": statistics.median(alloc),
        "stage_seconds_median": {
            k: statistics.median(s[k] for s in stages) for k in stages[0] if not k.endswith("_cpu")
        },
        "stage_cpu_seconds_median": {
            k: statistics.median(s[f"{k}_cpu"] for s in stages) for k in STAGES
        },
        "dp_seconds_median": statistics.median(dp),
        "dp_capacity_units": rec["dp"]["capacity_units"],
        "dp_solved": rec["dp"]["solved"],
        "sources_with_arima": arima,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }


def run(args: argparse.Namespace) -> int:
    n, i, a = args.nodes, args.instances, args.apps
    sizes = [(n, i, a)]
    if not args.quick:
        # Growth with nodes (apps fixed) and with apps (nodes fixed), instances in proportion.
        sizes = sorted(
            {(n * f // 4, i * f // 4, a) for f in (1, 2, 4)}
            | {(n, i * f // 4, a * f // 4) for f in (1, 2, 4)}
        )
    reference_before = reference_seconds()
    runs = []
    for nodes, inst, apps in sizes:
        row = measure(nodes, inst, apps, args)
        runs.append(row)
        print(
            f"nodes {row['nodes']:5d} instances {row['instances']:6d} apps {row['apps']:4d}: "
            f"epoch median {row['epoch_seconds_median']:.3f} s p95 {row['epoch_seconds_p95']:.3f} s, "
            f"compute {row['compute_seconds_median']:.3f} s "
            f"(CPU {row['compute_cpu_seconds_median']:.3f} s), "
            f"allocation {row['allocation_seconds_median']:.3f} s, DP {row['dp_seconds_median']:.3f} s"
        )
        print(
            "  CPU by stage: "
            + ", ".join(f"{k} {v:.3f} s" for k, v in row["stage_cpu_seconds_median"].items())
        )
    print(f"reference workload {reference_before:.3f} s before the runs")
    largest = max(runs, key=lambda r: (r["nodes"], r["apps"]))
    reference_after = reference_seconds()
    reference = (reference_before + reference_after) / 2
    for row in runs:
        # Ratios to the reference workload compare runs on machines (or days)
        # of different speed; the seconds alone do not.
        row["stage_cpu_over_reference"] = {
            k: v / reference for k, v in row["stage_cpu_seconds_median"].items()
        }
        row["epoch_cpu_over_reference"] = row["epoch_cpu_seconds_median"] / reference
        row["compute_cpu_over_reference"] = row["compute_cpu_seconds_median"] / reference
    figures = {
        "reference_seconds": reference,
        "reference_seconds_before_after": [reference_before, reference_after],
        "largest_compute_over_reference": largest["compute_seconds_median"] / reference,
        "runs": runs,
        "target_epoch_seconds": 1.0,
        "arima_order": list(ARIMA_ORDER),
        "what_is_timed": "Controller.run_epoch after warm-up: evaluate, forecast (linear trend, "
        "DAG, cached ARIMA), latency-targeted demand, qos-dp division, anti-saturation, "
        "hysteresis, latency estimates, caps committed to SQLite, decision record (encoded "
        "and written by the store's writer thread, off the epoch's thread); no network; "
        "placement and the history spool (both on their own threads) are off. compute = "
        "evaluate + the pure epoch up to the caps (controller/epoch.py); the latency "
        "estimates and peaks (estimate) follow the directives",
        "largest_epoch_seconds_median": largest["epoch_seconds_median"],
        "largest_compute_seconds_median": largest["compute_seconds_median"],
        "compute_meets_target": largest["compute_seconds_median"] < 1.0,
        "largest_compute_cpu_seconds_median": largest["compute_cpu_seconds_median"],
        "largest_epoch_cpu_seconds_median": largest["epoch_cpu_seconds_median"],
        "largest_epoch_cpu_over_reference": largest["epoch_cpu_over_reference"],
        "largest_stage_cpu_seconds_median": largest["stage_cpu_seconds_median"],
        "largest_stage_cpu_over_reference": largest["stage_cpu_over_reference"],
        "epoch_meets_target": largest["epoch_seconds_median"] < 1.0,
        "load_average_1min": os.getloadavg()[0],
    }
    write_result(args.json, "controller-scale", figures)
    png = args.png or args.json.with_suffix(".png")
    _plot(runs, n, a, png)
    return 0


def _plot(runs, nodes_max, apps_max, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    by_nodes = sorted((r for r in runs if r["apps"] == apps_max), key=lambda r: r["nodes"])
    by_apps = sorted((r for r in runs if r["nodes"] == nodes_max), key=lambda r: r["apps"])
    for ax, rows, x, label in (
        (ax1, by_nodes, "nodes", f"apps = {apps_max}"),
        (ax2, by_apps, "apps", f"nodes = {nodes_max}"),
    ):
        xs = [r[x] for r in rows]
        ax.plot(xs, [r["epoch_seconds_median"] for r in rows], "o-", label="epoch (median)")
        ax.plot(xs, [r["compute_seconds_median"] for r in rows], "d-", label="compute (no record)")
        ax.plot(xs, [r["allocation_seconds_median"] for r in rows], "s-", label="division")
        ax.plot(xs, [r["dp_seconds_median"] for r in rows], "^-", label="DP")
        ax.axhline(1.0, color="grey", ls="--", lw=1)
        ax.set_xlabel(x)
        ax.set_ylabel("seconds")
        ax.set_title(label)
        ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
