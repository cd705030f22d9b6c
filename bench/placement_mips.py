"""The ``mips_paper`` section of ``dsched bench placement``: the two-stage setting
of "MIPS: Instance Placement for Stream Processing Systems based on Monte Carlo
Tree Search" (Huang et al., §IV).

Requests for several topologies arrive one after another on a cluster of
heterogeneous servers wired as a Fat-Tree (k = 4, 16 servers) or as a
Jellyfish (8 switches of 6 ports, 2 servers each), servers of 16, 24 or 32
cores. Each request: 3 to 8 components over a depth of 2 to 4, parallelism 1
to 6, instance demand 0.2 to 2 cores (the same for a component's instances),
stream rates 10 to 100 tuples/s spread evenly over the instance pairs (§II-C),
and containers of 4, 6 or 8 cores, as many as hold 1.5 times the request's
demand (§II-D). A used container reserves its whole capacity on its server.

Contenders (stage 1 / stage 2): ``mips`` (MIPS / MIPS), ``ffd-bestfit``,
``r-heron`` and ``t-heron`` (each / Nomad's best fit). Per contender and
network: cross-container traffic, containers used and cross-server traffic
times hops, summed over the requests of a run; ``combined_cost``, the mean
over requests of objective (8) at ``alpha`` plus objective (9) normalised by
the request's traffic and the network's diameter; and plan seconds, each
averaged over ``seeds`` runs. ``samples_curve`` is MIPS's combined cost on the
Fat-Tree against samples per decision; the comparison runs MIPS at the
smallest budget within 1% of the curve's best (``converged_samples_per_decision``)
unless told otherwise.
"""

from __future__ import annotations

import math
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

from controller.placement import topology as net
from controller.placement.twostage import (
    MctsOptions,
    Request,
    best_fit,
    ffd,
    mips_csmp,
    mips_icmp,
    place_sequence,
    r_heron,
    t_heron,
)

DEFAULT_BUDGETS = (8, 16, 32, 64, 128, 256, 512, 1024)
CONTENDERS = ("mips", "ffd-bestfit", "r-heron", "t-heron")
NETWORKS = ("fat-tree", "jellyfish")
#: A budget has converged when its mean combined cost is within this share of the best.
CONVERGED_WITHIN = 0.01


def paper_requests(seed: int, count: int) -> list[Request]:
    """``count`` requests drawn from ``seed`` (same seed, same requests)."""
    rng = random.Random(f"mips-paper:{seed}")
    out = []
    for r in range(count):
        ncomp = rng.randint(3, 8)
        depth = rng.randint(2, min(4, ncomp))
        # Every level 0..depth-1 holds a component; the rest fall anywhere below 0.
        level = list(range(depth)) + [rng.randint(1, depth - 1) for _ in range(ncomp - depth)]
        level.sort()
        comps = [f"c{k}" for k in range(ncomp)]
        edges = []
        for k in range(1, ncomp):
            ups = [j for j in range(ncomp) if level[j] == level[k] - 1]
            for j in rng.sample(ups, min(len(ups), rng.randint(1, 2))):
                edges.append((comps[j], comps[k]))
        par = {c: rng.randint(1, 6) for c in comps}
        dem = {c: round(rng.uniform(0.2, 2.0), 2) for c in comps}
        insts, demand, comp = [], [], []
        for c in comps:
            for k in range(par[c]):
                insts.append(f"{c}.{k}")
                demand.append(dem[c])
                comp.append(c)
        traffic = {}
        for a, b in edges:
            rate = rng.uniform(10.0, 100.0)
            for x in range(par[a]):
                for y in range(par[b]):
                    traffic[(f"{a}.{x}", f"{b}.{y}")] = rate / (par[a] * par[b])
        cap = max(rng.choice((4.0, 6.0, 8.0)), max(demand))
        count_c = max(2, math.ceil(1.5 * sum(demand) / cap))
        out.append(
            Request(
                f"r{r}",
                tuple(insts),
                tuple(demand),
                tuple(comp),
                traffic,
                count_c,
                cap,
                tuple(edges),
            )
        )
    return out


def paper_cluster(name: str, seed: int) -> tuple[net.NetworkTopology, dict[str, float]]:
    """The network ``name`` and each server's cores (same seed, same cluster)."""
    if name == "fat-tree":
        topology = net.fat_tree(4)
    elif name == "jellyfish":
        topology = net.jellyfish(8, 6, 2, seed=seed)
    else:
        raise ValueError(f"network must be one of {', '.join(NETWORKS)}, got {name!r}")
    rng = random.Random(f"mips-paper-servers:{seed}")
    return topology, {s: float(rng.choice((16, 24, 32))) for s in topology.servers}


def _stages(name: str, alpha: float, options: MctsOptions) -> tuple[Callable, Callable]:
    if name == "mips":
        return mips_icmp(alpha, options), mips_csmp(options)
    first = {"ffd-bestfit": ffd, "r-heron": r_heron, "t-heron": t_heron}[name]
    return first, best_fit


def run_once(
    name: str, network: str, seed: int, requests: int, alpha: float, samples: int
) -> dict[str, Any]:
    """One contender on one seed's requests and cluster: figures summed over requests."""
    topology, capacity = paper_cluster(network, seed)
    stage1, stage2 = _stages(name, alpha, MctsOptions(samples_per_decision=samples))
    started = time.perf_counter()
    placed = place_sequence(
        paper_requests(seed, requests), capacity, topology, stage1, stage2, seed, alpha=alpha
    )
    seconds = time.perf_counter() - started
    figs = [p.figures for p in placed]
    return {
        "cross_container_traffic": sum(f.cross_container_traffic for f in figs),
        "containers": sum(f.containers for f in figs),
        "cross_server_traffic_hops": sum(f.cross_server_traffic_hops for f in figs),
        "icmp_cost": statistics.fmean(f.icmp_cost for f in figs),
        "csmp_cost": statistics.fmean(f.csmp_cost for f in figs),
        "combined_cost": statistics.fmean(f.combined_cost for f in figs),
        "plan_seconds": seconds,
    }


def _mean(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in runs[0]:
        values = [r[key] for r in runs]
        out[key] = round(statistics.fmean(values), 6)
        if key == "combined_cost":
            out["combined_cost_stdev"] = round(statistics.pstdev(values), 6)
    return out


def samples_curve(
    budgets: list[int], seeds: list[int], requests: int, alpha: float, network: str = "fat-tree"
) -> list[dict[str, Any]]:
    rows = []
    for budget in budgets:
        runs = [run_once("mips", network, s, requests, alpha, budget) for s in seeds]
        rows.append({"samples_per_decision": budget, **_mean(runs)})
    return rows


def converged(curve: list[dict[str, Any]]) -> int:
    """The smallest budget whose mean combined cost is within 1% of the best."""
    best = min(r["combined_cost"] for r in curve)
    return next(
        r["samples_per_decision"]
        for r in curve
        if r["combined_cost"] <= best * (1 + CONVERGED_WITHIN) + 1e-12
    )


def flattening(curve: list[dict[str, Any]]) -> dict[str, Any]:
    """Cost gained over the first half of the budgets and over the second."""
    costs = [r["combined_cost"] for r in curve]
    mid = len(costs) // 2
    first = costs[0] - costs[mid] if len(costs) > 1 else 0.0
    second = costs[mid] - costs[-1] if len(costs) > 1 else 0.0
    return {
        "gain_first_half": round(first, 6),
        "gain_second_half": round(second, 6),
        # Flattens: more samples help at first, then help less (the second half
        # of the budgets gains less than the first).
        "flattens": len(costs) > 2 and first > 0 and second < first,
    }


def check(*, requests: int, alpha: float, budgets: list[int], samples: int | None) -> None:
    """ValueError naming the flag when an option of the section is out of range."""
    if not budgets or any(b < 1 for b in budgets):
        raise ValueError("--mips-paper-budgets must be ints >= 1")
    if requests < 1:
        raise ValueError(f"--mips-paper-requests must be >= 1, got {requests}")
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"--mips-paper-alpha must be in [0, 1], got {alpha}")
    if samples is not None and samples < 1:
        raise ValueError(f"--mips-paper-samples must be >= 1, got {samples}")


def run_section(
    *,
    seeds: list[int],
    requests: int,
    alpha: float,
    budgets: list[int],
    samples: int | None,
) -> dict[str, Any]:
    check(requests=requests, alpha=alpha, budgets=budgets, samples=samples)
    curve = samples_curve(sorted(budgets), seeds, requests, alpha)
    at = converged(curve)
    spd = samples if samples is not None else at
    topologies: dict[str, Any] = {}
    for network in NETWORKS:
        contenders = {
            name: _mean([run_once(name, network, s, requests, alpha, spd) for s in seeds])
            for name in CONTENDERS
        }
        best_other = min(contenders[n]["combined_cost"] for n in CONTENDERS if n != "mips")
        mips = contenders["mips"]["combined_cost"]
        topology, _ = paper_cluster(network, seeds[0])
        topologies[network] = {
            "servers": len(topology.servers),
            "diameter_hops": topology.diameter,
            "contenders": contenders,
            "mips_lowest_combined_cost": mips < best_other,
            # Positive: how far below the best other contender MIPS is (a share of it).
            "mips_margin_vs_best_other": round((best_other - mips) / best_other, 6),
        }
    return {
        "setting": {
            "requests_per_run": requests,
            "seeds": seeds,
            "alpha": alpha,
            "networks": {"fat-tree": "k=4", "jellyfish": "8 switches, 6 ports, 2 servers each"},
            "server_cores": [16, 24, 32],
        },
        "samples_per_decision": spd,
        "converged_samples_per_decision": at,
        "topologies": topologies,
        "samples_curve": curve,
        "samples_curve_shape": flattening(curve),
    }


def add_arguments(parser) -> None:
    parser.add_argument(
        "--mips-paper-requests", type=int, default=8, help="requests per run (default 8)"
    )
    parser.add_argument("--mips-paper-seeds", type=int, default=3, help="runs averaged (default 3)")
    parser.add_argument("--mips-paper-alpha", type=float, default=0.5, help="alpha of (8)")
    parser.add_argument(
        "--mips-paper-budgets",
        type=int,
        nargs="+",
        default=list(DEFAULT_BUDGETS),
        help="samples per decision for the curve (default 8 ... 1024)",
    )
    parser.add_argument(
        "--mips-paper-samples",
        type=int,
        default=None,
        help="MIPS's samples per decision in the comparison (default: the converged budget)",
    )


def print_section(section: dict[str, Any]) -> None:
    print(
        f"mips_paper (samples per decision {section['samples_per_decision']}, "
        f"converged at {section['converged_samples_per_decision']})"
    )
    cols = (
        "cross_container_traffic",
        "containers",
        "cross_server_traffic_hops",
        "combined_cost",
        "plan_seconds",
    )
    for network, block in section["topologies"].items():
        print(f"  {network}: " + "".join(c[:16].rjust(17) for c in cols))
        for name, figs in block["contenders"].items():
            print("    " + name.ljust(12) + "".join(f"{figs[c]:17.5g}" for c in cols))
    print("  samples per decision -> combined cost (stdev), plan seconds")
    for row in section["samples_curve"]:
        print(
            f"    {row['samples_per_decision']:6d}  {row['combined_cost']:.4f} "
            f"({row['combined_cost_stdev']:.4f})  {row['plan_seconds']:.2f}"
        )


__all__ = [
    "CONTENDERS",
    "DEFAULT_BUDGETS",
    "NETWORKS",
    "add_arguments",
    "check",
    "converged",
    "paper_cluster",
    "paper_requests",
    "print_section",
    "run_once",
    "run_section",
    "samples_curve",
]
