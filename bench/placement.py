"""Placement strategies side by side on the same seeded scenarios.

Each scenario is a cluster of nodes and applications whose predicted demand
changes over a few epochs (growing load, shrinking load, random load). Every
strategy places the cluster from scratch at epoch 0, then plans each later
epoch from its own previous placement; the plan is applied as if carried out.
Per strategy the figures are summed over the epochs after the first:
affected workers, affected stateful workers, stateful moves, moves, mixed
workers, node-epochs used, overloaded node-epochs, inter-node traffic
(tuples/s after each plan) and plan seconds.

``--seeds COUNT`` repeats every scenario with COUNT seeds and sums the figures.

Every instance also carries its peak: the most it needed over the last
``--peak-epochs`` epochs (default 30), so each scenario starts with that much
load behind it. ``liu`` places stateful instances by their peaks; the others
read only demand. ``liu_demand_only`` is liu on the same epochs without peaks,
so what peaks buy shows beside it.

``mips-anytime`` (one sample budget per plan) is also run alone over a range
of budgets on the first seed's scenarios (with several seeds), reporting its
quality against budget; a PNG shows it. ``mips`` (the published scheme, its
budget per decision) runs in the comparison with ``--mips-samples`` samples
per decision.

``mips_paper`` (:mod:`bench.placement_mips`) is the two-stage setting of the
MIPS paper: sequential requests on a Fat-Tree and a Jellyfish, MIPS against
FFD, R-Heron and T-Heron (each followed by best fit), and MIPS's quality
against samples per decision.

``seed000`` (:mod:`bench.placement_seed000`) is the micro-DAG experiment of
"Model-driven Scheduling for Distributed Stream Processing Systems": slots
allocated by LSA and MBA per DAG and rate, and the input rate the DSM, RSM and
SAM mappings sustain by the tasks' performance models.

``liu`` runs with its defaults unless ``--liu-option KEY=VALUE`` overrides one;
each ``--liu-variant KEY=VALUE[,KEY=VALUE...]`` runs it once more with other
options (by default ``scale_in_patience=3`` and ``stateful_growth=0``) and
records the figures under ``liu_variants``, so the trade-off of a default
shows beside it.
"""

from __future__ import annotations

import argparse
import random
import statistics
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from bench import placement_mips, placement_seed000
from bench.common import write_result
from controller.placement import (
    STRATEGIES,
    Instance,
    Node,
    PlacementInput,
    apply_plan,
    get_strategy,
)

SCENARIOS = ("growing", "shrinking", "random")
DEFAULT_BUDGETS = (4, 16, 64, 256, 1024)
#: mips samples per decision in the comparison (mips-anytime: per plan).
DEFAULT_MIPS_SAMPLES = 64
DEFAULT_LIU_VARIANTS = ("scale_in_patience=3", "stateful_growth=0")
#: Epochs over which an instance's peak demand is taken: 300 s at a 10-s slot,
#: as the controller's default ``stateful_peak_seconds``.
DEFAULT_PEAK_EPOCHS = 30


def parse_option(text: str, flag: str) -> tuple[str, Any]:
    """``KEY=VALUE`` -> (key, value); the value as an int, float or bool when it reads as one."""
    key, sep, raw = text.partition("=")
    key, raw = key.strip(), raw.strip()
    if not sep or not key or not raw:
        raise ValueError(f"{flag} must look like KEY=VALUE, got {text!r}")
    if raw.lower() in ("true", "false"):
        return key, raw.lower() == "true"
    for kind in (int, float):
        try:
            return key, kind(raw)
        except ValueError:
            pass
    return key, raw


def parse_options(items: list[str], flag: str) -> dict[str, Any]:
    options: dict[str, Any] = {}
    for item in items:
        key, value = parse_option(item, flag)
        if key in options:
            raise ValueError(f"{flag} sets {key} twice")
        options[key] = value
    return options


@dataclass(frozen=True)
class _Operator:
    name: str
    parallelism: int
    stateful: bool
    cost: float  # cores per unit of load per instance


def _apps(rng: random.Random) -> dict[str, tuple[list[_Operator], tuple[tuple[str, str], ...]]]:
    """WordCount, the HTTP monitor of Liu et al. (Fig. 5) and a random DAG."""
    wordcount = (
        [
            _Operator("spout", 2, False, 0.15),
            _Operator("split", 3, False, 0.35),
            _Operator("count", 3, True, 0.25),
        ],
        (("spout", "split"), ("split", "count")),
    )
    monitor_ops = [
        _Operator("spout", 2, False, 0.1),
        _Operator("retrieve", 2, False, 0.25),
        _Operator("country", 2, False, 0.2),
        _Operator("isp", 2, False, 0.2),
        _Operator("prefix", 2, False, 0.2),
        _Operator("statctry", 1, True, 0.25),
        _Operator("statisp", 1, True, 0.25),
        _Operator("statpfx", 1, True, 0.25),
        _Operator("alarm", 1, False, 0.05),
    ]
    monitor_edges = (
        ("spout", "retrieve"),
        ("retrieve", "country"),
        ("retrieve", "isp"),
        ("retrieve", "prefix"),
        ("country", "statctry"),
        ("isp", "statisp"),
        ("prefix", "statpfx"),
        ("statctry", "alarm"),
        ("statisp", "alarm"),
        ("statpfx", "alarm"),
    )
    ops = [
        _Operator(f"op{j}", rng.randint(1, 3), rng.random() < 0.4, rng.uniform(0.1, 0.35))
        for j in range(5)
    ]
    edges = tuple(
        (ops[i].name, ops[j].name)
        for i in range(5)
        for j in range(i + 1, 5)
        if j == i + 1 or rng.random() < 0.25
    )
    return {"wc": wordcount, "monitor": (monitor_ops, monitor_edges), "rand": (ops, edges)}


def _load_curve(scenario: str, epochs: int, rng: random.Random) -> list[float]:
    if scenario == "growing":
        return [0.6 + 1.0 * e / (epochs - 1) for e in range(epochs)]
    if scenario == "shrinking":
        return [1.6 - 1.1 * e / (epochs - 1) for e in range(epochs)]
    return [rng.uniform(0.5, 1.6) for _ in range(epochs)]


def _history_curve(scenario: str, first: float, epochs: int, rng: random.Random) -> list[float]:
    """Load before epoch 0: random as the scenario, else steady at the first level."""
    if scenario == "random":
        return [rng.uniform(0.5, 1.6) for _ in range(epochs)]
    return [first] * epochs


def scenario_states(
    scenario: str, seed: int, epochs: int = 6, nodes: int = 6, peak_epochs: int = 1
) -> list[PlacementInput]:
    """The demands of each epoch as (unplaced) cluster states; same seed, same states.

    Each instance's peak is the most it needed over the last ``peak_epochs``
    epochs, now included, as the controller's ``DemandPeaks`` gives it; the
    scenario starts with ``peak_epochs - 1`` epochs of load behind it, drawn
    from their own stream so the epochs themselves do not change with it.
    """
    if peak_epochs < 1:
        raise ValueError(f"peak_epochs must be >= 1, got {peak_epochs}")
    rng = random.Random(f"{scenario}:{seed}")
    apps = _apps(rng)
    node_list = tuple(Node(f"n{k}", 2.5) for k in range(nodes))
    curve = _load_curve(scenario, epochs, rng)
    jitter = {
        (app, op.name, k): rng.uniform(0.8, 1.2)
        for app, (ops, _) in apps.items()
        for op in ops
        for k in range(op.parallelism)
    }
    past_rng = random.Random(f"{scenario}:{seed}:history")
    past = _history_curve(scenario, curve[0], peak_epochs - 1, past_rng)
    past_noise = [
        {
            key: value * past_rng.uniform(0.9, 1.1) if scenario == "random" else value
            for key, value in jitter.items()
        }
        for _ in past
    ]
    seen: list[dict[tuple, float]] = [
        {
            (app, op.name, k): round(op.cost * level * noise[(app, op.name, k)], 4)
            for app, (ops, _) in apps.items()
            for op in ops
            for k in range(op.parallelism)
        }
        for level, noise in zip(past, past_noise, strict=True)
    ]
    states = []
    for level in curve:
        instances, traffic = [], {}
        noise = {
            key: value * rng.uniform(0.9, 1.1) if scenario == "random" else value
            for key, value in jitter.items()
        }
        now = {
            (app, op.name, k): round(op.cost * level * noise[(app, op.name, k)], 4)
            for app, (ops, _) in apps.items()
            for op in ops
            for k in range(op.parallelism)
        }
        seen.append(now)
        window = seen[-peak_epochs:]
        for app, (ops, edges) in apps.items():
            by_op = {}
            for op in ops:
                by_op[op.name] = [
                    Instance(
                        app,
                        op.name,
                        k,
                        now[(app, op.name, k)],
                        op.stateful,
                        peak_demand_cores=max(w[(app, op.name, k)] for w in window),
                    )
                    for k in range(op.parallelism)
                ]
                instances += by_op[op.name]
            for up, down in edges:
                for s in by_op[up]:
                    for r in by_op[down]:
                        traffic[(s.id, r.id)] = round(1000.0 * level / len(by_op[down]), 3)
        states.append(
            PlacementInput(
                node_list, tuple(instances), (), {a: e for a, (_, e) in apps.items()}, traffic
            )
        )
    return states


def _with_placement(demands: PlacementInput, placed: PlacementInput) -> PlacementInput:
    where = {i.id: (i.worker, i.node) for i in placed.instances}
    return PlacementInput(
        demands.nodes,
        tuple(replace(i, worker=where[i.id][0], node=where[i.id][1]) for i in demands.instances),
        placed.workers,
        demands.dags,
        demands.traffic,
    )


FIGURES = (
    "affected_workers",
    "affected_stateful_workers",
    "stateful_moves",
    "restarted_stateful",
    "moves",
    "mixed_workers",
    "nodes_used",
    "overloaded_nodes",
    "inter_node_traffic",
    "plan_seconds",
)


def run_strategy(
    name: str, states: list[PlacementInput], headroom: float, **options
) -> dict[str, Any]:
    strategy = get_strategy(name, **options)
    totals = dict.fromkeys(FIGURES, 0.0)
    plan = strategy.plan(states[0], headroom)
    current = apply_plan(states[0], plan)
    totals["initial_nodes_used"] = plan.nodes_used
    totals["initial_inter_node_traffic"] = plan.inter_node_traffic_after
    totals["initial_plan_seconds"] = plan.plan_seconds
    for demands in states[1:]:
        plan = strategy.plan(_with_placement(demands, current), headroom)
        totals["affected_workers"] += len(plan.affected_workers)
        totals["affected_stateful_workers"] += len(plan.affected_stateful_workers)
        totals["stateful_moves"] += plan.stateful_moves
        totals["restarted_stateful"] += plan.restarted_stateful
        totals["moves"] += len(plan.moves)
        totals["mixed_workers"] += plan.mixed_workers
        totals["nodes_used"] += plan.nodes_used
        totals["overloaded_nodes"] += len(plan.overloaded_nodes)
        totals["inter_node_traffic"] += plan.inter_node_traffic_after
        totals["plan_seconds"] += plan.plan_seconds
        current = apply_plan(current, plan)
    return totals


def run_over_seeds(
    name: str, states_per_seed: list[list[PlacementInput]], headroom: float, **options
) -> dict[str, Any]:
    """``run_strategy`` on each seed's epochs (a fresh strategy each), figures summed."""
    totals: dict[str, Any] = {}
    for states in states_per_seed:
        for key, value in run_strategy(name, states, headroom, **options).items():
            totals[key] = totals[key] + value if key in totals else value
    return totals


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", metavar="PATH", help="write the figures here")
    parser.add_argument(
        "--png", metavar="PATH", help="mips quality vs budget (default: beside --json)"
    )
    parser.add_argument("--seed", type=int, default=1, help="scenario seed (default 1)")
    parser.add_argument(
        "--seeds",
        type=int,
        default=1,
        metavar="COUNT",
        help="run each scenario with COUNT seeds from --seed on and sum the figures "
        "(default 1); the mips quality curve uses the first",
    )
    parser.add_argument("--epochs", type=int, default=6, help="epochs per scenario (default 6)")
    parser.add_argument(
        "--peak-epochs",
        type=int,
        default=DEFAULT_PEAK_EPOCHS,
        metavar="N",
        help="each instance's peak is its highest demand over the last N epochs, now "
        "included; every scenario starts with N-1 epochs of load behind it "
        f"(default {DEFAULT_PEAK_EPOCHS}: the controller's stateful_peak_seconds of 300 "
        "at its 10-s slot; 1: no peaks, demand only)",
    )
    parser.add_argument("--headroom", type=float, default=0.2, help="cores kept free per node")
    parser.add_argument(
        "--mips-samples",
        type=int,
        default=DEFAULT_MIPS_SAMPLES,
        help="mips samples per decision in the comparison (mips-anytime: samples per plan; "
        f"default {DEFAULT_MIPS_SAMPLES})",
    )
    parser.add_argument(
        "--budgets",
        type=int,
        nargs="+",
        default=list(DEFAULT_BUDGETS),
        help="mips-anytime sample budgets (per plan) for the quality curve",
    )
    parser.add_argument("--budget-seeds", type=int, default=3, help="mips-anytime seeds per budget")
    parser.add_argument(
        "--liu-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="liu option for the comparison, e.g. scale_in_patience=3 (repeatable)",
    )
    parser.add_argument(
        "--liu-variant",
        action="append",
        default=None,
        metavar="KEY=VALUE[,KEY=VALUE...]",
        help="also run liu with these options, recorded under liu_variants (repeatable; "
        f"default: {' and '.join(DEFAULT_LIU_VARIANTS)})",
    )
    placement_mips.add_arguments(parser)


def mips_quality(states_by_scenario, budgets, seeds: int, headroom: float) -> list[dict[str, Any]]:
    rows = []
    for budget in budgets:
        per_seed = []
        for seed in range(seeds):
            totals = dict.fromkeys(
                (
                    "initial_inter_node_traffic",
                    "initial_nodes_used",
                    "affected_workers",
                    "inter_node_traffic",
                    "plan_seconds",
                ),
                0.0,
            )
            for states in states_by_scenario.values():
                r = run_strategy("mips-anytime", states, headroom, samples=budget, seed=seed)
                for key in totals:
                    totals[key] += r[key]
            per_seed.append(totals)
        row = {"samples": budget}
        for key in per_seed[0]:
            values = [s[key] for s in per_seed]
            row[key] = statistics.fmean(values)
            row[key + "_stdev"] = statistics.pstdev(values)
        rows.append(row)
    return rows


def _plot(path: Path, rows: list[dict[str, Any]], reference: dict[str, dict[str, Any]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    budgets = [r["samples"] for r in rows]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    panels = (
        ("initial_inter_node_traffic", "inter-node traffic after initial placement (tuples/s)"),
        ("affected_workers", "affected workers, summed over epochs"),
    )
    for ax, (key, title) in zip(axes, panels, strict=True):
        ax.errorbar(
            budgets,
            [r[key] for r in rows],
            yerr=[r[key + "_stdev"] for r in rows],
            marker="o",
            label="mips-anytime",
            capsize=3,
        )
        others = [n for n in sorted(reference) if n != "mips-anytime"]
        for k, name in enumerate(others):
            ax.axhline(
                reference[name][key], linestyle="--", linewidth=1.0, color=f"C{k + 1}", label=name
            )
        ax.set_xscale("log", base=2)
        ax.set_xlabel("mips-anytime samples per plan")
        ax.set_title(title, fontsize=9)
    axes[1].legend(fontsize=7, loc="best")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(args: argparse.Namespace) -> int:
    if args.epochs < 2:
        raise ValueError(f"--epochs must be >= 2, got {args.epochs}")
    if args.headroom < 0:
        raise ValueError(f"--headroom must be >= 0, got {args.headroom}")
    if args.seeds < 1:
        raise ValueError(f"--seeds must be >= 1, got {args.seeds}")
    if args.peak_epochs < 1:
        raise ValueError(f"--peak-epochs must be >= 1, got {args.peak_epochs}")
    if args.mips_samples < 1 or any(b < 1 for b in args.budgets):
        raise ValueError("--mips-samples and --budgets must be >= 1")
    if args.mips_paper_seeds < 1:
        raise ValueError(f"--mips-paper-seeds must be >= 1, got {args.mips_paper_seeds}")
    placement_mips.check(
        requests=args.mips_paper_requests,
        alpha=args.mips_paper_alpha,
        budgets=args.mips_paper_budgets,
        samples=args.mips_paper_samples,
    )
    liu_options = parse_options(args.liu_option, "--liu-option")
    variant_specs = DEFAULT_LIU_VARIANTS if args.liu_variant is None else args.liu_variant
    variants = [
        parse_options([o for o in spec.split(",") if o.strip()], "--liu-variant")
        for spec in variant_specs
    ]
    for options in (liu_options, *variants):
        get_strategy("liu", **options)  # bad options fail here, before any run
    seeds = list(range(args.seed, args.seed + args.seeds))
    states = {
        s: [scenario_states(s, seed, args.epochs, peak_epochs=args.peak_epochs) for seed in seeds]
        for s in SCENARIOS
    }
    per_scenario: dict[str, dict[str, dict[str, Any]]] = {}
    summed: dict[str, dict[str, float]] = {}
    # Options each strategy runs with (the rest are its defaults), recorded in the JSON.
    strategy_options: dict[str, dict[str, Any]] = {
        "liu": _liu_options(liu_options),
        "mips": {"samples_per_decision": args.mips_samples, "seed": args.seed},
        "mips-anytime": {"samples": args.mips_samples, "seed": args.seed},
    }
    run_options: dict[str, dict[str, Any]] = {
        "liu": liu_options,
        "mips": {"samples_per_decision": args.mips_samples, "seed": args.seed},
        "mips-anytime": {"samples": args.mips_samples, "seed": args.seed},
    }
    for scenario, epoch_states in states.items():
        per_scenario[scenario] = {}
        for name in STRATEGIES:
            figs = run_over_seeds(name, epoch_states, args.headroom, **run_options.get(name, {}))
            per_scenario[scenario][name] = figs
            acc = summed.setdefault(name, dict.fromkeys(figs, 0.0))
            for key, value in figs.items():
                acc[key] += value
    for figs in summed.values():
        figs["inter_node_traffic"] = round(figs["inter_node_traffic"], 3)
    liu_variants = [_liu_variant(options, states, args.headroom) for options in variants]
    demand_only = _liu_variant(
        liu_options,
        {s: [_without_peaks(epochs) for epochs in per_seed] for s, per_seed in states.items()},
        args.headroom,
    )
    first_seed = {s: per_seed[0] for s, per_seed in states.items()}
    quality = mips_quality(first_seed, args.budgets, args.budget_seeds, args.headroom)
    mips_paper = placement_mips.run_section(
        seeds=list(range(args.seed, args.seed + args.mips_paper_seeds)),
        requests=args.mips_paper_requests,
        alpha=args.mips_paper_alpha,
        budgets=args.mips_paper_budgets,
        samples=args.mips_paper_samples,
    )
    seed000 = placement_seed000.run_section()
    stateful = {n: f["affected_stateful_workers"] for n, f in summed.items()}
    fewest = min(stateful.values())
    feasible = [n for n, f in summed.items() if f["overloaded_nodes"] == 0]
    figures = {
        "scenarios": [
            {
                "name": s,
                "epochs": args.epochs,
                "peak_epochs": args.peak_epochs,
                "seeds": seeds,
                "nodes": len(states[s][0][0].nodes),
                "instances": len(states[s][0][0].instances),
            }
            for s in SCENARIOS
        ],
        "headroom_cores": args.headroom,
        "mips_samples": args.mips_samples,
        "strategy_options": strategy_options,
        "strategies": summed,
        "per_scenario": per_scenario,
        "liu_fewest_affected_stateful_workers": stateful["liu"] == fewest,
        # How many more stateful workers liu affects than the strategy affecting fewest.
        "liu_affected_stateful_workers_above_fewest": stateful["liu"] - fewest,
        # Strategies that left no node over capacity in any epoch: the ones that did
        # their job, against which moving fewer stateful workers means something.
        "liu_fewest_affected_stateful_workers_among_feasible": stateful["liu"]
        == min(stateful[n] for n in feasible),
        # Node-epochs: liu against every other strategy that left no node over capacity.
        "liu_fewest_nodes_used_among_feasible": all(
            summed["liu"]["nodes_used"] < summed[n]["nodes_used"] for n in feasible if n != "liu"
        ),
        "liu_fewest_affected_stateful_workers_per_scenario": {
            s: figs["liu"]["affected_stateful_workers"]
            == min(f["affected_stateful_workers"] for f in figs.values())
            for s, figs in per_scenario.items()
        },
        "affected_stateful_workers_vs_liu": {
            n: (v / stateful["liu"] if stateful["liu"] else None) for n, v in stateful.items()
        },
        "liu_variants": liu_variants,
        "liu_demand_only": demand_only,
        "mips_quality_vs_budget": quality,
        "mips_paper": mips_paper,
        "seed000": seed000,
    }
    png = (
        Path(args.png) if args.png else (Path(args.json).with_suffix(".png") if args.json else None)
    )
    if png is not None:
        reference = {
            n: {
                "initial_inter_node_traffic": f["initial_inter_node_traffic"],
                "affected_workers": f["affected_workers"],
            }
            for n, f in summed.items()
        }
        _plot(png, quality, reference)
        figures["png"] = str(png)
        seed000_png = png.with_name(png.stem + "_seed000.png")
        placement_seed000.plot(seed000_png, seed000)
        seed000["png"] = str(seed000_png)
    doc = write_result(args.json, "placement", figures)
    _print_table(doc)
    return 0


def _without_peaks(states: list[PlacementInput]) -> list[PlacementInput]:
    return [
        replace(
            state,
            instances=tuple(replace(i, peak_demand_cores=None) for i in state.instances),
        )
        for state in states
    ]


def _liu_options(overrides: dict[str, Any]) -> dict[str, Any]:
    """Every tunable option liu runs with: its defaults, then ``overrides``."""
    liu = get_strategy("liu", **overrides)
    return {
        "scale_in": liu.scale_in,
        "scale_in_patience": liu.scale_in_patience,
        "stateful_growth": liu.stateful_growth,
    }


def _liu_variant(
    options: dict[str, Any], states: dict[str, list[list[PlacementInput]]], headroom: float
) -> dict[str, Any]:
    per = {
        s: run_over_seeds("liu", per_seed, headroom, **options) for s, per_seed in states.items()
    }
    summed = {key: sum(figs[key] for figs in per.values()) for key in next(iter(per.values()))}
    summed["inter_node_traffic"] = round(summed["inter_node_traffic"], 3)
    return {
        "options": _liu_options(options),
        "overrides": options,
        "figures": summed,
        "per_scenario": per,
    }


def _print_table(doc: dict[str, Any]) -> None:
    cols = (
        "affected_workers",
        "affected_stateful_workers",
        "stateful_moves",
        "mixed_workers",
        "nodes_used",
        "overloaded_nodes",
        "inter_node_traffic",
        "plan_seconds",
    )
    print("strategy".ljust(16) + "".join(c[:14].rjust(15) for c in cols))
    for name, figs in doc["strategies"].items():
        print(name.ljust(16) + "".join(f"{figs[c]:15.4g}" for c in cols))
    per = ("affected_stateful_workers", "affected_workers", "nodes_used", "overloaded_nodes")
    print("per scenario: " + ", ".join(per))
    for scenario, figs_by_name in doc["per_scenario"].items():
        print(f"  {scenario}")
        for name, figs in figs_by_name.items():
            print("    " + name.ljust(16) + "".join(f"{figs[c]:8.4g}" for c in per))
    for variant in (
        *doc["liu_variants"],
        {**doc["liu_demand_only"], "overrides": {"peaks": "none"}},
    ):
        over = ", ".join(f"{k}={v}" for k, v in variant["overrides"].items()) or "defaults"
        per_sf = " / ".join(
            f"{figs['affected_stateful_workers']:g}" for figs in variant["per_scenario"].values()
        )
        figs = variant["figures"]
        print(
            f"liu with {over}: affected stateful workers {per_sf} = "
            f"{figs['affected_stateful_workers']:g}, affected workers {figs['affected_workers']:g}, "
            f"nodes used {figs['nodes_used']:g}, overloaded nodes {figs['overloaded_nodes']:g}"
        )
    print("mips-anytime samples -> initial inter-node traffic, affected workers, plan seconds")
    for row in doc["mips_quality_vs_budget"]:
        print(
            f"  {row['samples']:6d}  {row['initial_inter_node_traffic']:12.1f}"
            f"  {row['affected_workers']:8.1f}  {row['plan_seconds']:8.3f}"
        )
    placement_mips.print_section(doc["mips_paper"])
    placement_seed000.print_section(doc["seed000"])
