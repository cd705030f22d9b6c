"""Simulated clusters: dsched's unmodified controller beside peers' policies.

Scenarios:

* ``seed004-poisson`` / ``seed004-weibull`` (scaled) -- the QoS cap experiment of
  "QoS-aware CPU cap adjustment for timely data-flow" (§5): ``--apps``
  applications of four operators on 4 nodes (16 cores), three QoS classes, a
  linear burst (x1.8 / x2.7 / x3.6) from epoch 40 to 51; the paper's arrival
  rates, service times scaled down to 0.4-6.5 ms per operator;
* ``seed004-paper-weibull`` / ``seed004-paper-poisson`` -- the same experiment
  in the paper's regime: its service times (100-3,400 ms per message, mean
  900 ms), arrival rates scaled so phase I offers half the cluster, ARIMA on,
  the latency model's C² measured on a warm-up of the scenario, ERR skipping
  over-utilised nodes;
* ``wordcount`` -- one WordCount-like chain (source, split, count, sink) on one 2-core node;
* ``scale`` -- ``--nodes`` nodes and ``--instances`` instances: the controller's
  epoch time and memory inside the simulation (dsched only);
* ``elastic`` -- a cluster too small for phase II: dsched with its node pool and
  parallelism acting, dsched with both off, and a utilisation autoscaler
  (bench/sim_elastic.py);
* ``interference`` -- gold beside a memory-streaming neighbour: dsched with and
  without the memory-bandwidth interference correction (bench/sim_interference.py);
* ``calibration`` -- a two-operator chain run live (real threads, real cgroup v1
  caps) and simulated with the same work, caps and arrivals; needs root.

Per policy and class: mean and p99 end-to-end latency, violation ratio (whole
run and phase II), CPU allocated, reconfigurations, nodes; ratios against ``err``.
``--dsched-headrooms`` runs dsched again at other ``headroom_cores`` (contenders
``dsched-h<H>``, as in ``dsched bench live``); ``pareto`` in the JSON and
``--pareto-png`` (or ``<plot stem>-pareto.png`` with ``--plot``) show CPU
allocated against the gold violation ratio, one point per contender, and which
are on the frontier.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import psutil

from bench.common import (
    HEADROOM_PREFIX,
    headroom_contenders,
    headroom_of,
    label_points,
    pareto_front,
    write_result,
)
from testbed.sim import scenario as scen
from testbed.sim.measure import measure_scv
from testbed.sim.policies import (
    POLICIES,
    DschedPolicy,
    ErrPolicy,
    Policy,
    controller_features,
    make_policy,
)
from testbed.sim.run import run_policy

SCENARIOS = (
    "seed004-poisson",
    "seed004-weibull",
    "seed004-paper-weibull",
    "seed004-paper-poisson",
    "wordcount",
    "scale",
    "calibration",
    "elastic",
    "interference",
)
PAPER_SCENARIOS = ("seed004-paper-weibull", "seed004-paper-poisson")
#: dsched run again at another headroom: dsched-h<cores> (as in ``dsched bench live``).
#: Load predictors of the paper-regime runs: the seed's ARIMA on the sources too.
PAPER_PREDICTORS = ["linear_trend", "dag", "arima"]
SCV_SOURCE = (
    "measured: C² of the inter-arrival gaps and per-message service works the "
    "simulator generated in a warm-up of the same scenario (its own seed), given "
    "to the controller as arrival_scv / service_scv: the values it keeps for an "
    "operator until its own slots hold enough evidence to measure C² "
    "(variability = measured; the record's sizing.operators say which)"
)
#: Live and simulated latency and CPU must agree within this (relative).
CALIBRATION_TOLERANCE = 0.20
#: The paper's claims against ERR for the gold class ("QoS-aware CPU cap
#: adjustment for timely data-flow", Table 1).
MUST_GOLD_VIOLATION_REDUCTION = 0.77
MUST_GOLD_LATENCY_REDUCTION = 0.188


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--scenario",
        choices=SCENARIOS,
        default="seed004-weibull",
        help="seed004-weibull / seed004-poisson: scaled service times; "
        "seed004-paper-*: the paper's service times, scaled arrival rates",
    )
    parser.add_argument(
        "--apps",
        type=int,
        default=None,
        help="applications (default: 200 seed004 scaled, 12 seed004-paper)",
    )
    parser.add_argument(
        "--epochs",
        type=int,
        default=None,
        help="epochs (default: 80 seed004, 20 wordcount, 4 scale; calibration: 6 of 5 s)",
    )
    parser.add_argument(
        "--warmup-epochs",
        type=int,
        default=20,
        help="seed004-paper: epochs of the warm-up on which C² is measured (default 20)",
    )
    parser.add_argument(
        "--gold-target-factor",
        type=float,
        default=None,
        help="seed004-paper: gold's latency target as a multiple of a chain's mean "
        "service time; silver and bronze keep the paper's ratios to it "
        f"(default {scen.PAPER_GOLD_TARGET_FACTOR:g})",
    )
    parser.add_argument(
        "--dsched-headrooms",
        default="",
        metavar="H,H,...",
        help="also run dsched with these headroom_cores values (contenders dsched-h<H>, "
        "after dsched): points of dsched's CPU / violation trade-off on the Pareto plot",
    )
    parser.add_argument(
        "--pareto-png",
        type=Path,
        default=None,
        help="write the Pareto plot (CPU allocated against gold violation ratio) here; "
        "with --plot alone it goes to <plot stem>-pareto.png",
    )
    parser.add_argument("--nodes", type=int, default=1000, help="nodes (scale)")
    parser.add_argument("--instances", type=int, default=20_000, help="instances (scale)")
    parser.add_argument("--policies", default=",".join(POLICIES), help="comma-separated policies")
    parser.add_argument("--step", type=float, default=None, help="simulation step in seconds")
    parser.add_argument("--seed", type=int, default=4)
    parser.add_argument(
        "--runs",
        type=int,
        default=1,
        help="calibration: live/simulated pairs; elastic: whole comparisons, averaged "
        "(seeds seed, seed+1, ...)",
    )
    parser.add_argument(
        "--isolation",
        choices=("process", "thread"),
        default="process",
        help="calibration: one process per operator thread, or all threads in one process (GIL)",
    )
    parser.add_argument("--json", type=Path, default=None, help="write the result JSON here")
    parser.add_argument(
        "--plot", type=Path, default=None, help="write the CPU-share plot here (PNG)"
    )


def gold_target_factor(args: argparse.Namespace) -> float:
    value = getattr(args, "gold_target_factor", None)
    return scen.PAPER_GOLD_TARGET_FACTOR if value is None else value


def build_scenario(args: argparse.Namespace) -> scen.Scenario:
    kw: dict[str, Any] = {}
    if args.step is not None:
        kw["step_seconds"] = args.step
    if args.scenario in PAPER_SCENARIOS:
        epochs = args.epochs or 80
        return scen.seed004_paper(
            apps=args.apps or 12,
            arrivals=args.scenario.rsplit("-", 1)[1],
            epochs=epochs,
            gold_target_factor=gold_target_factor(args),
            seed=args.seed,
            burst_start=min(40, epochs // 2),
            burst_end=min(51, epochs // 2 + 11),
            **kw,
        )
    if args.scenario.startswith("seed004"):
        epochs = args.epochs or 80
        return scen.seed004(
            apps=args.apps or 200,
            arrivals=args.scenario.split("-")[1],
            epochs=epochs,
            seed=args.seed,
            burst_start=min(40, epochs // 2),
            burst_end=min(51, epochs // 2 + 11),
            **kw,
        )
    if args.scenario == "wordcount":
        return scen.wordcount(epochs=args.epochs or 20, seed=args.seed, **kw)
    return scen.scale(
        nodes=args.nodes, instances=args.instances, epochs=args.epochs or 4, seed=args.seed, **kw
    )


def ratios(policies: dict[str, dict[str, Any]], key: str = "classes") -> dict[str, Any]:
    """Each policy's figures divided by err's, per class (1 - ratio = improvement)."""
    base = policies.get("err")
    if base is None:
        return {}
    out: dict[str, Any] = {}
    for name, res in policies.items():
        per = {}
        for cls, f in res[key].items():
            b = base[key][cls]
            per[cls] = {
                m: (f[m] / b[m] if b[m] else None)
                for m in ("latency_ms_mean", "latency_ms_p99", "violation_ratio")
            }
        out[name] = {
            "classes": per,
            "cpu_allocated": res["cpu_allocated_core_seconds"] / base["cpu_allocated_core_seconds"],
        }
    return out


def must_checks(policies: dict[str, dict[str, Any]]) -> dict[str, Any]:
    if "dsched" not in policies or "err" not in policies:
        return {}
    out = {}
    for key in ("classes", "classes_phase2"):
        d, e = policies["dsched"][key]["gold"], policies["err"][key]["gold"]
        viol_red = 1 - d["violation_ratio"] / e["violation_ratio"] if e["violation_ratio"] else None
        lat_red = 1 - d["latency_ms_mean"] / e["latency_ms_mean"] if e["latency_ms_mean"] else None
        out[key] = {
            "gold_violation_reduction": viol_red,
            "gold_latency_reduction": lat_red,
            "violation_holds": viol_red is not None and viol_red >= MUST_GOLD_VIOLATION_REDUCTION,
            "latency_holds": lat_red is not None and lat_red >= MUST_GOLD_LATENCY_REDUCTION,
        }
    return out


def plot(path: Path, sc: scen.Scenario, policies: dict[str, dict[str, Any]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [p for p in ("dsched", "err") if p in policies] or list(policies)[:1]
    fig, axes = plt.subplots(1, len(shown) + 1, figsize=(5 * (len(shown) + 1), 4))
    colors = {"gold": "#d4a017", "silver": "#8c8c8c", "bronze": "#a0522d"}
    for ax, name in zip(axes, shown, strict=False):
        series = policies[name]["per_epoch"]["cpu_allocated_cores"]
        total = [sum(v) for v in zip(*series.values(), strict=True)]
        for cls, vals in series.items():
            share = [v / t if t else 0 for v, t in zip(vals, total, strict=True)]
            ax.plot(range(1, len(vals) + 1), share, label=cls, color=colors.get(cls))
        ax.set_title(f"{name}: CPU share per class")
        ax.set_xlabel("epoch")
        ax.set_ylabel("share of CPU allocated")
        ax.set_ylim(0, 1.05)  # a class holding all the CPU stays visible above the frame
        ax.legend()
    ax = axes[-1]
    for name, res in policies.items():
        vals = res["per_epoch"]["latency_ms_mean"].get("gold", [])
        ax.plot(
            range(1, len(vals) + 1),
            [v if v is not None else float("nan") for v in vals],
            label=name,
        )
    target = next((c.target_latency_ms for c in sc.qos if c.name == "gold"), None)
    if target:
        ax.axhline(target, color="k", linestyle="--", linewidth=1, label="gold target")
    ax.set_yscale("log")
    ax.set_title("gold mean latency per epoch")
    ax.set_xlabel("epoch")
    ax.set_ylabel("ms")
    ax.legend(fontsize=7)
    fig.suptitle(f"{sc.name}, {len(sc.apps)} applications")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def markdown_table(doc: dict[str, Any], key: str = "classes") -> str:
    """The per-policy, per-class figures of a result document as a Markdown table."""
    rows = [
        "| policy | class | mean ms | p99 ms | violation | mean vs err | violation vs err |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    ratio_key = "ratios_vs_err" if key == "classes" else "ratios_vs_err_phase2"
    for name, res in doc["policies"].items():
        for cls, f in res[key].items():
            r = doc.get(ratio_key, {}).get(name, {}).get("classes", {}).get(cls, {})

            def fmt(x: float | None, spec: str) -> str:
                return "-" if x is None or x != x else format(x, spec)

            rows.append(
                f"| {name} | {cls} | {fmt(f['latency_ms_mean'], '.1f')} | {fmt(f['latency_ms_p99'], '.1f')} "
                f"| {fmt(f['violation_ratio'], '.3f')} | {fmt(r.get('latency_ms_mean'), '.2f')} "
                f"| {fmt(r.get('violation_ratio'), '.2f')} |"
            )
    return "\n".join(rows)


def markdown_totals(doc: dict[str, Any]) -> str:
    rows = [
        "| policy | CPU allocated (core-s) | vs err | reconfigurations | nodes | wall s |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, res in doc["policies"].items():
        r = doc.get("ratios_vs_err", {}).get(name, {}).get("cpu_allocated")
        rows.append(
            f"| {name} | {res['cpu_allocated_core_seconds']:.0f} | {'-' if r is None else format(r, '.2f')} "
            f"| {res['reconfigurations']} | {res['nodes_mean']:.1f} | {doc['wall_seconds'].get(name, 0):.0f} |"
        )
    return "\n".join(rows)


def _relative(sim: Any, live: Any) -> dict[str, float]:
    def rel(a: float, b: float) -> float:
        return abs(a - b) / b

    return {
        "latency_ms_mean": rel(sim.latency_ms_mean, live.latency_ms_mean),
        "latency_ms_p99": rel(sim.latency_ms_p99, live.latency_ms_p99),
        "cpu_cores": max(rel(s, v) for s, v in zip(sim.cpu_cores, live.cpu_cores, strict=True)),
    }


def run_calibration(args: argparse.Namespace) -> int:
    from testbed.sim.calibrate import (
        CalibrationSetup,
        SimModel,
        calibration_inputs,
        measure_handoff_seconds,
        measure_message_cost,
        run_live,
        run_sim,
    )

    if args.runs < 1:
        raise ValueError(f"--runs must be >= 1, got {args.runs}")
    seconds = float(args.epochs or 6) * 5.0
    # Measured once, before the runs, on the otherwise idle machine.
    cost = measure_message_cost()
    handoff = measure_handoff_seconds()
    runs = []
    for i in range(args.runs):
        setup = CalibrationSetup(seconds=seconds, seed=args.seed + i)
        inputs = calibration_inputs(setup)
        live = run_live(setup, inputs, isolation=args.isolation)
        model = SimModel.measured(cost, handoff, live)
        sim = run_sim(setup, inputs, model, live.arrivals_s)
        # What each modelled effect contributes: the same run with fewer of them.
        steps = {
            "nominal": SimModel(),
            "cost": SimModel(cost=cost),
            "cost+handoff": SimModel(cost=cost, handoff_s=handoff),
            "cost+handoff+period_phase": replace(model, cfs_tick_s=0.0, tick_phase_s=0.0),
        }
        ablation = {
            name: vars(run_sim(setup, inputs, m, live.arrivals_s)) for name, m in steps.items()
        }
        ablation["all (cost+handoff+period_phase+tick)"] = vars(sim)
        agreement = _relative(sim, live.figures)
        runs.append(
            {
                "setup": vars(setup),
                "chunk_seconds_nominal": inputs.chunk_seconds,
                "model": {
                    "fixed_s": cost.fixed_s,
                    "per_chunk_s": cost.per_chunk_s,
                    "handoff_s": model.handoff_s,
                    "cfs_tick_s": model.cfs_tick_s,
                    "tick_phase_s": model.tick_phase_s,
                    "period_phase_s": list(model.period_phase_s or ()),
                },
                "live": vars(live.figures),
                "sim": vars(sim),
                "relative_difference": agreement,
                "agree": {k: v <= CALIBRATION_TOLERANCE for k, v in agreement.items()},
                "sim_ablation": ablation,
                "relative_difference_ablation": {
                    name: _relative(type(sim)(**f), live.figures) for name, f in ablation.items()
                },
            }
        )
        print(
            f"run {i + 1}: live mean {live.figures.latency_ms_mean:.2f} ms p99 "
            f"{live.figures.latency_ms_p99:.1f} ms, sim mean {sim.latency_ms_mean:.2f} ms p99 "
            f"{sim.latency_ms_p99:.1f} ms; {json_line(agreement)}",
            flush=True,
        )
    worst = {
        k: max(r["relative_difference"][k] for r in runs) for k in runs[0]["relative_difference"]
    }
    figures = {
        "scenario": "calibration",
        "apps": 1,
        "isolation": args.isolation,
        "runs": runs,
        "relative_difference_max": worst,
        "tolerance": CALIBRATION_TOLERANCE,
        "agree": {k: v <= CALIBRATION_TOLERANCE for k, v in worst.items()},
    }
    write_result(args.json, "sim", figures)
    return 0


def json_line(d: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v:.3f}" for k, v in d.items())


def contender(name: str, overrides: dict[str, Any]) -> Policy:
    """The policy behind contender ``name``; dsched ones get the scenario's
    controller settings (and their own headroom)."""
    headroom = headroom_of(name)
    if name != "dsched" and headroom is None:
        return make_policy(name)
    extra = {} if headroom is None else {"headroom_cores": headroom}
    return DschedPolicy(name=name, config_overrides={**overrides, **extra})


def pareto(policies: dict[str, dict[str, Any]], key: str = "classes") -> dict[str, Any]:
    """CPU allocated against the gold violation ratio, per contender, and the frontier."""
    points = {
        name: (
            float(res["cpu_allocated_core_seconds"]),
            float(res[key].get("gold", {}).get("violation_ratio", math.nan)),
        )
        for name, res in policies.items()
    }
    front = pareto_front(points)
    return {
        "x": "cpu_allocated_core_seconds",
        "y": "gold violation_ratio",
        "window": "whole run" if key == "classes" else "phase II",
        "points": {
            name: {
                "cpu_allocated_core_seconds": x,
                "gold_violation_ratio": y,
                "on_frontier": name in front,
            }
            for name, (x, y) in points.items()
        },
        "frontier": front,
        "dsched_on_frontier": any(n == "dsched" or n.startswith(HEADROOM_PREFIX) for n in front),
    }


def plot_pareto(doc: dict[str, Any], path: Path) -> Path:
    """One point per contender (dsched at every headroom red, peers blue), the
    frontier joined, for the whole run and for phase II."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    gold = next((c for c in doc["qos"] if c["name"] == "gold"), None)
    fig, axes = plt.subplots(1, 2, figsize=(12, 5))
    for ax, key in zip(axes, ("pareto", "pareto_phase2"), strict=True):
        par = doc[key]
        pts = par["points"]
        labelled = []
        for name, p in pts.items():
            x, y = p["cpu_allocated_core_seconds"], p["gold_violation_ratio"]
            if math.isnan(y):
                continue
            mine = name == "dsched" or name.startswith(HEADROOM_PREFIX)
            colour = "tab:red" if mine else "tab:blue"
            ax.scatter([x], [y], color=colour, zorder=3)
            labelled.append((name, x, y, colour))
        label_points(ax, labelled)
        front = [pts[n] for n in par["frontier"]]
        if front:
            fx = [p["cpu_allocated_core_seconds"] for p in front]
            fy = [p["gold_violation_ratio"] for p in front]
            ax.step(fx, fy, where="post", color="black", linewidth=0.8)
            ax.scatter(
                fx, fy, s=140, facecolors="none", edgecolors="black", label="frontier", zorder=4
            )
        if gold:
            ax.axhline(
                gold["max_violation_ratio"],
                linestyle="--",
                color="tab:orange",
                label=f"gold: at most {gold['max_violation_ratio']:g} of messages",
            )
        ax.set_xlabel("CPU allocated, core-seconds (whole run)")
        target = f" > {gold['target_latency_ms']:.0f} ms" if gold else ""
        ax.set_ylabel(f"gold messages{target} ({par['window']})")
        ax.set_ylim(-0.03, 1.03)
        ax.set_title(par["window"])
        ax.legend(fontsize=8)
    fig.suptitle(f"{doc['scenario']}, {doc['apps']} applications: CPU against gold violations")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def paper_comparison(doc: dict[str, Any]) -> dict[str, Any]:
    """dsched against err beside the paper's headline (Table 1, phase II)."""
    must = doc.get("must", {})
    out: dict[str, Any] = {
        "paper_gold_violation_reduction": MUST_GOLD_VIOLATION_REDUCTION,
        "paper_gold_latency_reduction": MUST_GOLD_LATENCY_REDUCTION,
    }
    for key, label in (("classes", "whole_run"), ("classes_phase2", "phase2")):
        m = must.get(key, {})
        out[label] = {
            "gold_violation_reduction": m.get("gold_violation_reduction"),
            "gold_latency_reduction": m.get("gold_latency_reduction"),
        }
    r = doc.get("ratios_vs_err", {}).get("dsched")
    out["cpu_allocated_vs_err"] = r["cpu_allocated"] if r else None
    return out


def print_comparison(doc: dict[str, Any]) -> None:
    def pct(x: float | None) -> str:
        return "n/a" if x is None or x != x else f"{-100 * x:+.1f} %"

    c = doc["paper_comparison"]
    print(
        f"dsched vs err ({doc['scenario']}, {doc['apps']} apps); paper: gold violations "
        f"{pct(c['paper_gold_violation_reduction'])}, gold mean latency "
        f"{pct(c['paper_gold_latency_reduction'])}"
    )
    for label in ("whole_run", "phase2"):
        w = c[label]
        print(
            f"  {label:9s} gold violations {pct(w['gold_violation_reduction']):>9s}, "
            f"gold mean latency {pct(w['gold_latency_reduction']):>9s}"
        )
    for name, res in doc["policies"].items():
        for cls, f in res["classes_phase2"].items():
            print(
                f"  phase II {name:14s} {cls:6s} mean {f['latency_ms_mean']:10.1f} ms  "
                f"violation {f['violation_ratio']:.3f}"
            )
    if c["cpu_allocated_vs_err"] is not None:
        print(f"  CPU allocated, dsched / err: {c['cpu_allocated_vs_err']:.2f}")
    print(f"  Pareto frontier (whole run): {', '.join(doc['pareto']['frontier'])}", flush=True)


def run(args: argparse.Namespace) -> int:
    if args.scenario == "calibration":
        return run_calibration(args)
    if args.scenario == "elastic":
        # Its own contenders and figures (node-epochs, gold against its bound).
        from bench.sim_elastic import run_elastic

        write_result(args.json, "sim", run_elastic(args))
        return 0
    if args.scenario == "interference":
        # dsched with and without the interference correction (bench/sim_interference.py).
        from bench.sim_interference import run_interference

        write_result(args.json, "sim", run_interference(args))
        return 0
    for key in ("apps", "epochs"):
        value = getattr(args, key)
        if value is not None and value < 1:
            raise ValueError(f"--{key} must be >= 1, got {value}")
    if args.warmup_epochs < 1:
        raise ValueError(f"--warmup-epochs must be >= 1, got {args.warmup_epochs}")
    sc = build_scenario(args)
    names = [n.strip() for n in args.policies.split(",") if n.strip()]
    for n in names:
        make_policy(n)  # unknown names fail before any work
    variants = headroom_contenders(args.dsched_headrooms, sc.cores_per_node)
    if args.scenario == "scale":
        names = ["dsched"]
        variants = []
    at = names.index("dsched") + 1 if "dsched" in names else len(names)
    names = names[:at] + variants + names[at:]
    overrides: dict[str, Any] = {}
    measured = None
    if args.scenario in PAPER_SCENARIOS:
        measured = measure_scv(sc, warmup_epochs=args.warmup_epochs)
        overrides = {
            "predictors": list(PAPER_PREDICTORS),
            "arrival_scv": measured.arrival_scv,
            "service_scv": measured.service_scv,
        }
    policies: dict[str, dict[str, Any]] = {}
    wall: dict[str, float] = {}
    extra: dict[str, Any] = {}
    for name in names:
        policy = contender(name, overrides)
        rss0 = psutil.Process().memory_info().rss
        t0 = time.perf_counter()
        result = run_policy(sc, policy)
        wall[name] = time.perf_counter() - t0
        policies[name] = result.to_json()
        if isinstance(policy, DschedPolicy):
            times = policy.epoch_seconds
            extra = {
                "controller_epoch_seconds": list(times),
                "controller_epoch_seconds_median": statistics.median(times) if times else None,
                "controller_epoch_seconds_max": max(times) if times else None,
                "controller_epoch_cpu_seconds_median": (
                    statistics.median(policy.epoch_cpu_seconds)
                    if policy.epoch_cpu_seconds
                    else None
                ),
                "controller_peak_rss_bytes": policy.peak_rss_bytes,
                "controller_rss_growth_bytes": policy.peak_rss_bytes - rss0,
                "controller_config": policy.config_used,
                "class_assignment": policy.class_assignment,
                "controller_failed_epochs": policy.failed_epochs,
                "controller_gc_threshold": list(policy.gc_threshold),
                "controller_arima_fitted_sources": policy.arima_fitted_sources(),
                "directives": vars(policy.agents.log) if policy.agents else {},
            }
            policies[name].update({k: v for k, v in extra.items() if k != "directives"})
            policy.close()
        if isinstance(policy, ErrPolicy):
            policies[name]["over_utilized_node_epochs"] = policy.marked_node_epochs
            policies[name]["epochs_skipping_a_node"] = policy.skipping_epochs
        g = policies[name]["classes"].get("gold", {})
        print(
            f"{name:14s} {wall[name]:7.1f}s  gold mean {g.get('latency_ms_mean', float('nan')):9.1f} ms"
            f"  viol {g.get('violation_ratio', float('nan')):.3f}",
            flush=True,
        )
    figures: dict[str, Any] = {
        "scenario": sc.name,
        "regime": (
            "paper"
            if args.scenario in PAPER_SCENARIOS
            else "scaled"
            if args.scenario.startswith("seed004")
            else None
        ),
        "apps": len(sc.apps),
        "nodes": sc.nodes,
        "cores": sc.total_cores,
        "instances_dsched": sum(len(a.operators) for a in sc.apps),
        "epochs": sc.epochs,
        "epoch_seconds": sc.epoch_seconds,
        "step_seconds": sc.step_seconds,
        "seed": sc.seed,
        "qos": [vars(c) for c in sc.qos],
        "controller_features": controller_features(),
        "policies": policies,
        "ratios_vs_err": ratios(policies),
        "ratios_vs_err_phase2": ratios(policies, "classes_phase2"),
        "must": must_checks(policies),
        "pareto": pareto(policies),
        "pareto_phase2": pareto(policies, "classes_phase2"),
        "wall_seconds": wall,
        "wall_seconds_total": sum(wall.values()),
    }
    if args.scenario in PAPER_SCENARIOS:
        assert measured is not None
        figures["settings"] = {
            "apps": len(sc.apps),
            "epochs": sc.epochs,
            "epoch_seconds": sc.epoch_seconds,
            "step_seconds": sc.step_seconds,
            "warmup_epochs": args.warmup_epochs,
            "qos_targets_ms": {c.name: c.target_latency_ms for c in sc.qos},
            "gold_target_factor": gold_target_factor(args),
            "phase1_offered_cores": sum(
                a.arrivals.rate * sum(o.work_mean_s for o in a.operators) for a in sc.apps
            ),
            "service_mean_s": scen.PAPER_SERVICE_MEAN_S,
            "service_cv": scen.PAPER_SERVICE_CV,
            "controller_overrides": {k: v for k, v in overrides.items()},
            "dsched_headrooms": [headroom_of(v) for v in variants],
        }
        figures["scv"] = {**measured.to_json(), "scv_source": SCV_SOURCE}
        figures["scv_source"] = SCV_SOURCE
    if "dsched" in policies and "err" in policies:
        figures["paper_comparison"] = paper_comparison(figures)
    if args.scenario == "scale":
        figures.update(
            {
                k: extra.get(k)
                for k in (
                    "controller_epoch_seconds",
                    "controller_epoch_seconds_median",
                    "controller_epoch_seconds_max",
                    "controller_epoch_cpu_seconds_median",
                    "controller_peak_rss_bytes",
                    "controller_rss_growth_bytes",
                    "controller_failed_epochs",
                    "controller_gc_threshold",
                )
            }
        )
    write_result(args.json, "sim", figures)
    if "paper_comparison" in figures:
        print_comparison(figures)
    if args.plot is not None and args.scenario != "scale":
        plot(args.plot, sc, policies)
    pareto_path = args.pareto_png
    if pareto_path is None and args.plot is not None:
        pareto_path = args.plot.with_name(args.plot.stem + "-pareto" + args.plot.suffix)
    if pareto_path is not None and args.scenario != "scale":
        plot_pareto(figures, pareto_path)
    return 0
