"""``dsched bench sim --scenario elastic``: a cluster too small for phase II.

Contenders, side by side on one scenario (testbed.sim.scenario.elastic):

* ``dsched`` -- the production controller with its node pool acting on the
  simulated cluster (testbed/sim/nodepool.py) and its parallelism decisions
  carried out (testbed/sim/parallelism.py);
* ``dsched-fixed`` -- the same controller with both only recorded (node pool
  ``log``, parallelism ``recommend``): caps on the cluster it was given;
* ``util-scaler`` -- a cluster autoscaler by utilisation target (add above
  80 % for 2 epochs, remove below 50 % for 5, 3 epochs of cool-down) with
  Flink-autoscaler-like instance counts (testbed.sim.policies.UtilScalerPolicy).

Under ``contenders.<name>``: ``gold_violation_ratio`` (whole run),
``gold_bound`` (gold's allowed violation ratio), ``node_epochs`` (nodes summed
over epochs), CPU allocated and used. ``targets`` says whether dsched keeps
gold within its bound where dsched-fixed does not, with node-epochs at most
1.1 times the util-scaler's.

``--runs N`` repeats the whole comparison on seeds seed, seed+1, ...: a node
added or an instance paused a few seconds earlier moves a run's gold violations
by several times, so one seed says little. The contenders' figures are then the
means over the seeds (``gold_violation_ratio_max`` the worst seed), each
seed's own rows under ``runs``, and the targets are judged on the means.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, field
from typing import Any

from controller.config import NodePoolConfig, ParallelismConfig
from testbed.sim import scenario as scen
from testbed.sim.engine import ClusterSim
from testbed.sim.nodepool import attach_node_pool
from testbed.sim.parallelism import attach_parallelism
from testbed.sim.policies import DschedPolicy, EpochObservation, Policy, UtilScalerPolicy
from testbed.sim.run import run_policy

CONTENDERS = ("dsched", "dsched-fixed", "util-scaler")
#: dsched may use at most this many node-epochs per util-scaler node-epoch.
NODE_EPOCH_RATIO = 1.1
#: Instances per operator at most, for every contender.
MAX_PARALLELISM = 8
#: Epochs of cool-down after a node change, for dsched's pool and the util-scaler alike.
COOLDOWN_EPOCHS = 3
#: Controller settings of both dsched contenders: the production latency
#: criterion (gold's bound is on the share of messages, a tail), and a node worth
#: running when it carries at least one core of gold-weighted demand.
CONTROLLER: dict[str, Any] = {"latency_criterion": "quantile", "node_cost": 1.0}


@dataclass
class ElasticDsched(DschedPolicy):
    """dsched with its node pool and parallelism acting on the simulation."""

    name: str = "dsched"
    max_parallelism: int = MAX_PARALLELISM
    node_pool: object = None
    parallelism: object = None

    def setup(self, sim: ClusterSim) -> None:
        super().setup(sim)
        self.node_pool = attach_node_pool(self.controller, sim, self.agents)
        self.parallelism = attach_parallelism(self.controller, sim, self.agents)


@dataclass
class NodeCount:
    """Counts the nodes of the cluster every epoch around another policy."""

    inner: Any
    nodes: list[int] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def max_parallelism(self) -> int:
        return self.inner.max_parallelism

    def setup(self, sim: ClusterSim) -> None:
        self.inner.setup(sim)

    def on_epoch(self, sim: ClusterSim, obs: EpochObservation) -> None:
        # The nodes that ran the epoch just simulated, before the policy changes them.
        self.nodes.append(len(sim.cores))
        self.inner.on_epoch(sim, obs)


def build(args: argparse.Namespace, seed: int | None = None) -> scen.Scenario:
    kw: dict[str, Any] = {}
    if args.step is not None:
        kw["step_seconds"] = args.step
    return scen.elastic(epochs=args.epochs or 60, seed=args.seed if seed is None else seed, **kw)


def make_contender(name: str, sc: scen.Scenario) -> Policy:
    cooldown = COOLDOWN_EPOCHS * sc.epoch_seconds
    if name == "util-scaler":
        return UtilScalerPolicy(cooldown_epochs=COOLDOWN_EPOCHS)
    if name == "dsched":
        return ElasticDsched(
            config_overrides={
                **CONTROLLER,
                "node_pool": NodePoolConfig(cooldown_seconds=cooldown),
                "parallelism": ParallelismConfig(max_instances=MAX_PARALLELISM),
            }
        )
    if name == "dsched-fixed":
        return DschedPolicy(
            name="dsched-fixed",
            max_parallelism=MAX_PARALLELISM,
            config_overrides={
                **CONTROLLER,
                "node_pool": NodePoolConfig(strategy="log", cooldown_seconds=cooldown),
                "parallelism": ParallelismConfig(max_instances=MAX_PARALLELISM),
            },
        )
    raise ValueError(f"unknown elastic contender {name!r} (known: {', '.join(CONTENDERS)})")


def targets(contenders: dict[str, dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"node_epoch_ratio_max": NODE_EPOCH_RATIO}
    d, f, u = (contenders.get(n) for n in CONTENDERS)
    if d is not None:
        out["dsched_gold_within_bound"] = d["gold_violation_ratio"] <= d["gold_bound"]
    if f is not None:
        out["fixed_gold_beyond_bound"] = f["gold_violation_ratio"] > f["gold_bound"]
    if d is not None and u is not None and u["node_epochs"]:
        ratio = d["node_epochs"] / u["node_epochs"]
        out["node_epochs_vs_util_scaler"] = ratio
        out["node_epochs_within_ratio"] = ratio <= NODE_EPOCH_RATIO
    checks = [v for k, v in out.items() if isinstance(v, bool)]
    out["met"] = bool(checks) and all(checks)
    return out


#: Figures averaged over the seeds of a multi-seed run.
AVERAGED = (
    "gold_violation_ratio",
    "gold_violation_ratio_phase2",
    "gold_latency_ms_mean",
    "node_epochs",
    "cpu_allocated_core_seconds",
    "cpu_used_core_seconds",
    "rescales_and_moves",
    "wall_seconds",
)


def over_seeds(rows: list[dict[str, Any]], seeds: list[int]) -> dict[str, Any]:
    """One contender's figures over its runs: means of AVERAGED, the worst gold
    ratio, the bound, and every run's own row."""
    out: dict[str, Any] = {
        k: sum(r[k] for r in rows) / len(rows) for k in AVERAGED if all(k in r for r in rows)
    }
    out["gold_violation_ratio_max"] = max(r["gold_violation_ratio"] for r in rows)
    out["gold_bound"] = rows[0]["gold_bound"]
    out["runs"] = [{"seed": s, **r} for s, r in zip(seeds, rows, strict=True)]
    return out


def run_elastic(args: argparse.Namespace) -> dict[str, Any]:
    runs = max(1, int(getattr(args, "runs", 1) or 1))
    seeds = [args.seed + i for i in range(runs)]
    by_seed = [run_seed(args, seed) for seed in seeds]
    figures = by_seed[0]
    if runs > 1:
        figures["seeds"] = seeds
        figures["contenders"] = {
            name: over_seeds([f["contenders"][name] for f in by_seed], seeds)
            for name in figures["contenders"]
        }
        figures["targets"] = targets(figures["contenders"])
        for name, row in figures["contenders"].items():
            print(
                f"{name:13s} over seeds {seeds}: gold viol mean {row['gold_violation_ratio']:.4f}"
                f" (worst {row['gold_violation_ratio_max']:.4f}, bound {row['gold_bound']:g})  "
                f"node-epochs mean {row['node_epochs']:.1f}",
                flush=True,
            )
        print(f"targets over the seeds: {figures['targets']}", flush=True)
    return figures


def run_seed(args: argparse.Namespace, seed: int) -> dict[str, Any]:
    sc = build(args, seed)
    names = [n.strip() for n in args.policies.split(",") if n.strip()]
    if not names or set(names) - set(CONTENDERS):
        names = list(CONTENDERS)
    gold = sc.qos_by_name()["gold"]
    contenders: dict[str, dict[str, Any]] = {}
    for name in names:
        policy = NodeCount(make_contender(name, sc))
        t0 = time.perf_counter()
        result = run_policy(sc, policy)
        wall = time.perf_counter() - t0
        res = result.to_json()
        inner = policy.inner
        row: dict[str, Any] = {
            "gold_violation_ratio": res["classes"]["gold"]["violation_ratio"],
            "gold_violation_ratio_phase2": res["classes_phase2"]["gold"]["violation_ratio"],
            "gold_bound": gold.max_violation_ratio,
            "gold_latency_ms_mean": res["classes"]["gold"]["latency_ms_mean"],
            "node_epochs": sum(policy.nodes),
            "nodes_per_epoch": policy.nodes,
            "cpu_allocated_core_seconds": res["cpu_allocated_core_seconds"],
            "cpu_used_core_seconds": res["cpu_used_core_seconds"],
            "classes": res["classes"],
            "classes_phase2": res["classes_phase2"],
            "rescales_and_moves": res["rescales_and_moves"],
            "wall_seconds": wall,
        }
        if isinstance(inner, DschedPolicy):
            row["controller_failed_epochs"] = inner.failed_epochs
            edge = inner.controller.parallelism
            row["parallelism_changes"] = edge.changes
            if isinstance(inner, ElasticDsched):
                row["nodes_added"] = inner.node_pool.added
                row["nodes_removed"] = inner.node_pool.removed
                row["instances_raised"] = inner.parallelism.raised
                row["instances_lowered"] = inner.parallelism.lowered
            inner.close()
        if isinstance(inner, UtilScalerPolicy):
            row["nodes_added"] = inner.added
            row["nodes_removed"] = inner.removed
        contenders[name] = row
        print(
            f"seed {seed} {name:13s} {wall:6.1f}s  gold viol {row['gold_violation_ratio']:.4f} "
            f"(bound {row['gold_bound']:g})  node-epochs {row['node_epochs']}  "
            f"CPU used {row['cpu_used_core_seconds']:.0f} core-s",
            flush=True,
        )
    burst = sc.apps[0].burst
    figures = {
        "scenario": sc.name,
        "apps": len(sc.apps),
        "nodes": sc.nodes,
        "cores_per_node": sc.cores_per_node,
        "epochs": sc.epochs,
        "epoch_seconds": sc.epoch_seconds,
        "step_seconds": sc.step_seconds,
        "seed": sc.seed,
        "burst": None if burst is None else vars(burst),
        "offered_cores": {
            "phase1": sum(
                a.arrivals.rate * sum(o.work_mean_s for o in a.operators) for a in sc.apps
            ),
            "phase2": sum(
                a.arrivals.rate
                * (a.burst.factor if a.burst else 1.0)
                * sum(o.work_mean_s for o in a.operators)
                for a in sc.apps
            ),
        },
        "qos": [vars(c) for c in sc.qos],
        "cooldown_epochs": COOLDOWN_EPOCHS,
        "contenders": contenders,
        "targets": targets(contenders),
    }
    t = figures["targets"]
    print(f"seed {seed} targets: {t}", flush=True)
    return figures
