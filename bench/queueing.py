"""G/G/M waiting-time and sojourn-time models against discrete-event simulation.

``dsched bench queueing`` simulates the FCFS GI/G/M queue on a grid of utilization,
server count and squared coefficients of variation (SCV) of inter-arrival and service
times, and scores every model of :data:`predict.queueing.WAIT_MODELS` (mean wait) and
:func:`predict.queueing.sojourn_quantile` (p90 / p99 of waiting + service time).

Simulation (:func:`simulate_ggm`)
    Inter-arrival and service times are gamma distributed with shape ``1 / scv`` and
    scale ``scv / rate``: means ``1/lambda`` and ``1/mu``, SCVs exactly ``ca2``, ``cs2``.
    The queue is the Kiefer--Wolfowitz workload recursion (Kiefer and Wolfowitz, "On
    the theory of queues with many servers", Trans. AMS 1955): the sorted vector of
    the servers' remaining work seen by customer n gives its wait (the smallest entry);
    the customer's service is added to that entry, the next inter-arrival time is
    subtracted from all, negatives are clipped to 0 and the vector is re-sorted. One
    server is Lindley's recursion, solved in closed form per block with a running
    minimum. ``replications`` independent copies run side by side as numpy columns,
    each starting empty and discarding a warm-up of several relaxation times
    (``z / (1 - sqrt(rho))**2`` customers with ``z = (ca2 + cs2) / 2``). Runs grow in
    blocks until the 95 % confidence half-width of the mean wait (Student t over the
    replication means) is below ``target_halfwidth`` of the mean, or the customer
    budget is spent. Sojourn quantiles come from log-spaced histograms (0.05 % bins),
    one per group of replications, so they too get a confidence half-width.

Scoring (:func:`score_wait_models`)
    Relative error ``(model - simulated) / simulated`` of every wait model at every
    point where the simulated mean wait exceeds 1 % of the mean service time, and of
    every quantile model at every point. The committed grid lives in
    ``bench/results/queueing-grid.json``; :func:`load_points` reads it back so tests
    and later benchmarks never re-simulate it.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from bench.common import process_pool, write_result
from predict import queueing as q

#: The scoring grid (384 points), simulated with :data:`SCORE_SEED`.
SCORE_UTILIZATIONS = (0.3, 0.5, 0.7, 0.75, 0.85, 0.95)
SCORE_SERVERS = (1, 2, 4, 8)
SCORE_SCVS = (0.25, 0.5, 1.0, 2.0)
SCORE_SEED = 2

#: The grid the tail model's constants were fitted on: other utilizations, other SCVs,
#: another seed. It shares no point with the scoring grid.
FIT_UTILIZATIONS = (0.25, 0.35, 0.4, 0.6, 0.8, 0.9)
FIT_SERVERS = (1, 2, 3, 4, 6, 8)
FIT_SCVS = (0.35, 0.7, 1.4, 3.0)
FIT_SEED = 1

QUANTILES = (0.9, 0.99)
#: Points whose simulated mean wait is below this fraction of the mean service time are
#: not scored for the mean wait (relative error of a near-zero quantity).
MIN_SCORED_WAIT = 0.01

DEFAULT_RESULT = Path(__file__).resolve().parent / "results" / "queueing-grid.json"
DEFAULT_FIT = Path(__file__).resolve().parent / "results" / "queueing-fit-grid.json"

# Log-spaced histogram of sojourn times in units of the mean service time.
_HIST_LO = 1e-5
_HIST_RATIO = 1.0005
_HIST_BINS = int(math.ceil(math.log(1e9) / math.log(_HIST_RATIO))) + 1


@dataclass(frozen=True)
class SimPoint:
    """One simulated grid point (service rate 1: times are in mean service times)."""

    utilization: float
    servers: int
    ca2: float
    cs2: float
    seed: int
    replications: int
    customers: int  # kept (post warm-up) customers over all replications
    warmup: int  # customers discarded per replication
    mean_wait: float
    mean_wait_halfwidth: float  # 95 % confidence half-width, absolute
    wait_second_moment: float
    prob_wait: float  # fraction of customers who wait
    sojourn_mean: float
    sojourn_p90: float
    sojourn_p90_halfwidth: float
    sojourn_p99: float
    sojourn_p99_halfwidth: float

    @property
    def relative_halfwidth(self) -> float:
        return self.mean_wait_halfwidth / self.mean_wait if self.mean_wait > 0 else math.inf


def _gamma(rng: np.random.Generator, scv: float, mean: float, size) -> np.ndarray:
    if scv == 0:
        return np.full(size, mean)
    return rng.gamma(1.0 / scv, scv * mean, size)


def warmup_customers(utilization: float, ca2: float, cs2: float) -> int:
    """Customers discarded per replication: ten relaxation times, at least 2 000."""
    z = max((ca2 + cs2) / 2.0, 0.25)
    relax = z / (1.0 - math.sqrt(utilization)) ** 2
    return int(max(2000, 10 * relax))


def _kw_block(w: np.ndarray, gaps: np.ndarray, service: np.ndarray, waits: np.ndarray) -> None:
    """Kiefer--Wolfowitz recursion over one block; ``w`` (replications x servers, each
    row sorted) is updated in place, ``waits[i]`` receives the waits of customer i."""
    if w.shape[1] == 1:
        # Lindley: W_n = Z_n - min(-W_0, min_{k<=n} Z_k), Z_n = sum_{i<=n} (S_{i-1} - T_i).
        u = np.empty_like(gaps)
        u[0] = 0.0  # customer 0 of the block sees w as it is
        u[1:] = service[:-1] - gaps[1:]
        z = np.cumsum(u, axis=0)
        floor = np.minimum(np.minimum.accumulate(z, axis=0), -w[:, 0])
        waits[:] = z - floor
        w[:, 0] = waits[-1] + service[-1]
        return
    for i in range(gaps.shape[0]):
        if i:
            np.subtract(w, gaps[i][:, None], out=w)
            np.maximum(w, 0.0, out=w)
        waits[i] = w[:, 0]
        w[:, 0] += service[i]
        w.sort(axis=1)


def simulate_ggm(
    utilization: float,
    servers: int,
    ca2: float,
    cs2: float,
    *,
    seed: int,
    replications: int = 128,
    target_halfwidth: float = 0.025,
    max_customers: int = 40_000_000,
    min_customers: int = 400_000,
    block: int = 2048,
    groups: int = 16,
) -> SimPoint:
    """Simulate the FCFS GI/G/M queue (gamma inter-arrival and service times, service
    rate 1, arrival rate ``utilization * servers``) until the mean wait's 95 % half-width
    is below ``target_halfwidth`` relative (or ``max_customers`` are used)."""
    if not 0 < utilization < 1:
        raise ValueError(f"utilization must be in (0, 1), got {utilization}")
    if replications % groups:
        raise ValueError("replications must be a multiple of groups")
    rng = np.random.default_rng(
        [seed, servers, round(utilization * 1e4), round(ca2 * 1e4), round(cs2 * 1e4)]
    )
    lam = utilization * servers
    r, m = replications, servers
    warm = warmup_customers(utilization, ca2, cs2)
    w = np.zeros((r, m))
    # The inter-arrival time before a block's first customer is applied on entry.
    pending_gap = np.zeros(r)

    def run_block(n: int) -> tuple[np.ndarray, np.ndarray]:
        nonlocal pending_gap
        gaps = _gamma(rng, ca2, 1.0 / lam, (n + 1, r))
        service = _gamma(rng, cs2, 1.0, (n, r))
        # Bring the state from the previous block's last departure to this block's first arrival.
        w[:] = np.maximum(w - pending_gap[:, None], 0.0)
        if m > 1:
            w.sort(axis=1)
        pending_gap = gaps[n]
        waits = np.empty((n, r))
        g = gaps[:n].copy()
        g[0] = 0.0
        _kw_block(w, g, service, waits)
        return waits, service

    done = 0
    while done < warm:
        n = min(block * 4, warm - done)
        run_block(n)
        done += n

    sums = np.zeros(r)
    sums2 = np.zeros(r)
    positive = np.zeros(r)
    soj_sum = 0.0
    hist = np.zeros(groups * _HIST_BINS, dtype=np.int64)
    group_of = np.repeat(np.arange(groups), r // groups) * _HIST_BINS
    kept = 0
    log_ratio = math.log(_HIST_RATIO)
    tcrit = float(stats.t.ppf(0.975, r - 1))
    while True:
        waits, service = run_block(block)
        kept += block
        sums += waits.sum(axis=0)
        sums2 += (waits * waits).sum(axis=0)
        positive += (waits > 0).sum(axis=0)
        soj = waits + service
        soj_sum += float(soj.sum())
        idx = np.floor(np.log(np.maximum(soj, _HIST_LO) / _HIST_LO) / log_ratio).astype(np.int64)
        np.minimum(idx, _HIST_BINS - 1, out=idx)
        hist += np.bincount((idx + group_of[None, :]).ravel(), minlength=groups * _HIST_BINS)
        total = kept * r
        if total < min_customers:
            continue
        means = sums / kept
        mean = float(means.mean())
        hw = tcrit * float(means.std(ddof=1)) / math.sqrt(r)
        if total >= max_customers or (mean > 0 and hw <= target_halfwidth * mean):
            break
        if mean < 0.2 * MIN_SCORED_WAIT and total >= 4 * min_customers:
            break  # far below the scored range: a short run is enough
    h = hist.reshape(groups, _HIST_BINS)
    pooled = h.sum(axis=0)
    quant: dict[float, tuple[float, float]] = {}
    gcrit = float(stats.t.ppf(0.975, groups - 1))
    for p in QUANTILES:
        est = _hist_quantile(pooled, p)
        per_group = np.array([_hist_quantile(row, p) for row in h])
        quant[p] = (est, gcrit * float(per_group.std(ddof=1)) / math.sqrt(groups))
    total = kept * r
    return SimPoint(
        utilization=utilization,
        servers=servers,
        ca2=ca2,
        cs2=cs2,
        seed=seed,
        replications=r,
        customers=int(total),
        warmup=warm,
        mean_wait=mean,
        mean_wait_halfwidth=hw,
        wait_second_moment=float(sums2.sum() / total),
        prob_wait=float(positive.sum() / total),
        sojourn_mean=soj_sum / total,
        sojourn_p90=quant[0.9][0],
        sojourn_p90_halfwidth=quant[0.9][1],
        sojourn_p99=quant[0.99][0],
        sojourn_p99_halfwidth=quant[0.99][1],
    )


def _hist_quantile(counts: np.ndarray, p: float) -> float:
    """The p-quantile of a log-binned histogram (geometric interpolation inside the bin)."""
    cum = np.cumsum(counts)
    target = p * cum[-1]
    k = int(np.searchsorted(cum, target, side="left"))
    below = cum[k - 1] if k else 0
    frac = (target - below) / counts[k] if counts[k] else 0.5
    return _HIST_LO * _HIST_RATIO ** (k + frac)


# ------------------------------------------------------------------------------ grids


def grid(
    utilizations: Iterable[float], servers: Iterable[int], scvs: Sequence[float]
) -> list[tuple[float, int, float, float]]:
    """(utilization, servers, ca2, cs2) for every combination."""
    return [(u, m, a, s) for u, m, a, s in itertools.product(utilizations, servers, scvs, scvs)]


def score_grid() -> list[tuple[float, int, float, float]]:
    return grid(SCORE_UTILIZATIONS, SCORE_SERVERS, SCORE_SCVS)


def fit_grid() -> list[tuple[float, int, float, float]]:
    return grid(FIT_UTILIZATIONS, FIT_SERVERS, FIT_SCVS)


def _simulate_one(args: tuple[tuple[float, int, float, float], int, dict[str, Any]]) -> SimPoint:
    (u, m, a, s), seed, kwargs = args
    return simulate_ggm(u, m, a, s, seed=seed, **kwargs)


def simulate_grid(
    points: Sequence[tuple[float, int, float, float]],
    seed: int,
    *,
    workers: int = 1,
    progress: bool = False,
    **kwargs: Any,
) -> list[SimPoint]:
    """Simulate every (utilization, servers, ca2, cs2) point; ``kwargs`` go to
    :func:`simulate_ggm`. Points are independent, so ``workers`` processes may share them."""
    jobs = [(p, seed, kwargs) for p in points]
    out: list[SimPoint] = []
    if workers > 1:
        with process_pool(workers) as pool:
            for k, res in enumerate(pool.map(_simulate_one, jobs)):
                out.append(res)
                if progress:
                    _progress(k, len(jobs), res)
    else:
        for k, job in enumerate(jobs):
            out.append(_simulate_one(job))
            if progress:
                _progress(k, len(jobs), out[-1])
    return out


def _progress(k: int, n: int, p: SimPoint) -> None:
    print(
        f"[{k + 1}/{n}] rho={p.utilization} M={p.servers} ca2={p.ca2} cs2={p.cs2} "
        f"W={p.mean_wait:.4g} +-{100 * p.relative_halfwidth:.2f}% p99={p.sojourn_p99:.4g} "
        f"n={p.customers}",
        flush=True,
    )


def points_to_json(points: Sequence[SimPoint]) -> list[dict[str, Any]]:
    return [asdict(p) for p in points]


def points_from_json(rows: Iterable[dict[str, Any]]) -> list[SimPoint]:
    fields = SimPoint.__dataclass_fields__
    return [SimPoint(**{k: r[k] for k in fields}) for r in rows]


def load_points(path: str | Path = DEFAULT_RESULT) -> list[SimPoint]:
    """The simulated points stored in a result JSON (``points[*].simulation``) or a raw
    list written by ``--raw``."""
    doc = json.loads(Path(path).read_text())
    rows = doc["points"] if isinstance(doc, dict) else doc
    return points_from_json(r.get("simulation", r) for r in rows)


# ------------------------------------------------------------------------------ fitting


def fit_ggm(points: Sequence[SimPoint], min_wait: float = 0.005) -> tuple[np.ndarray, np.ndarray]:
    """Least-squares coefficients of :func:`predict.queueing.ggm_features` for the ``ggm``
    model: log(simulated / QNA) of the mean wait and logit(simulated) - logit(Erlang C) of
    the probability of waiting, over points whose simulated wait exceeds ``min_wait``."""
    rows = [p for p in points if p.mean_wait > min_wait and 0 < p.prob_wait < 1]
    rho = np.array([p.utilization for p in rows])
    m = np.array([float(p.servers) for p in rows])
    ca2 = np.array([p.ca2 for p in rows])
    cs2 = np.array([p.cs2 for p in rows])
    x = q.ggm_features(rho, m, ca2, cs2)
    erlang = q.erlang_c_many(rho * m, m)
    qna = (ca2 + cs2) / 2 * erlang / (m * (1 - rho))
    y_wait = np.log(np.array([p.mean_wait for p in rows]) / qna)
    prob = np.array([p.prob_wait for p in rows])
    y_delay = np.log(prob / (1 - prob)) - np.log(erlang / (1 - erlang))
    wait_coef = np.linalg.lstsq(x, y_wait, rcond=None)[0]
    delay_coef = np.linalg.lstsq(x, y_delay, rcond=None)[0]
    return wait_coef, delay_coef


# ------------------------------------------------------------------------------ scoring


def _rel(estimate: float | None, reference: float) -> float | None:
    if estimate is None or not math.isfinite(estimate) or reference <= 0:
        return None
    return estimate / reference - 1.0


def _model_wait(model: str, p: SimPoint) -> float | None:
    try:
        return q.waiting_time(model, p.utilization * p.servers, 1.0, p.servers, p.ca2, p.cs2)
    except ValueError:
        return None  # e.g. kingman with several servers


def _model_quantile(model: str, level: float, p: SimPoint) -> float | None:
    if model == "kingman" and p.servers != 1:
        return None
    return q.sojourn_quantile(model, level, p.utilization * p.servers, 1.0, p.servers, p.ca2, p.cs2)


def score_wait_models(
    points: Sequence[SimPoint], models: Sequence[str] | None = None
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Per point: the simulation, every model's mean wait, p90 and p99 of sojourn and their
    relative errors; and a summary per model (median / max absolute relative error of the
    mean wait over the scored points, median / max of the p90 and p99 errors over all)."""
    models = list(models or q.WAIT_MODELS)
    rows = []
    for p in points:
        scored = p.mean_wait > MIN_SCORED_WAIT
        est: dict[str, Any] = {}
        for name in models:
            w = _model_wait(name, p)
            entry: dict[str, Any] = {
                "wait": w,
                "wait_relative_error": _rel(w, p.mean_wait) if scored else None,
            }
            for level, ref in ((0.9, p.sojourn_p90), (0.99, p.sojourn_p99)):
                key = f"p{round(level * 100)}"
                qv = _model_quantile(name, level, p)
                entry[key] = qv
                entry[f"{key}_relative_error"] = _rel(qv, ref)
            est[name] = entry
        rows.append({"simulation": asdict(p), "scored": scored, "models": est})
    return rows, summarize(rows, models)


def _stats(errors: list[float]) -> dict[str, Any]:
    if not errors:
        return {"points": 0}
    a = np.abs(errors)
    return {
        "points": len(errors),
        "median_abs_relative_error": float(np.median(a)),
        "max_abs_relative_error": float(a.max()),
        "median_relative_error": float(np.median(errors)),
        "points_over_10pct": int((a > 0.10).sum()),
        "points_over_25pct": int((a > 0.25).sum()),
    }


def summarize(rows: Sequence[dict[str, Any]], models: Sequence[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in models:

        def errs(key: str, name: str = name) -> list[float]:
            vals = (r["models"][name][key] for r in rows)
            return [e for e in vals if e is not None]

        scored = [r for r in rows if r["scored"]]
        p99_scored = (r["models"][name]["p99_relative_error"] for r in scored)
        out[name] = {
            "wait": _stats(errs("wait_relative_error")),
            "p90": _stats(errs("p90_relative_error")),
            "p99": _stats(errs("p99_relative_error")),
            "p99_where_wait_scored": _stats([e for e in p99_scored if e is not None]),
        }
    return out


def simulation_settings(points: Sequence[SimPoint]) -> dict[str, Any]:
    hw = [p.relative_halfwidth for p in points if p.mean_wait > MIN_SCORED_WAIT]
    return {
        "distributions": "gamma inter-arrival and service times, shape 1/scv, scale scv/rate",
        "service_rate": 1.0,
        "method": "Kiefer-Wolfowitz workload recursion, independent replications",
        "replications": sorted({p.replications for p in points}),
        "seeds": sorted({p.seed for p in points}),
        "warmup_rule": "max(2000, 10 * z / (1 - sqrt(rho))**2) customers per replication, "
        "z = max((ca2 + cs2) / 2, 0.25)",
        "stop_rule": "95 % half-width of the mean wait (Student t over replication means) "
        "below the target, or the customer budget",
        "customers_min": min(p.customers for p in points),
        "customers_max": max(p.customers for p in points),
        "customers_total": sum(p.customers for p in points),
        "max_relative_halfwidth_scored": max(hw) if hw else None,
        "median_relative_halfwidth_scored": float(np.median(hw)) if hw else None,
        "scored_points": len(hw),
        "min_scored_wait": MIN_SCORED_WAIT,
    }


# ------------------------------------------------------------------------------ figure


def plot(
    path: Path, rows: Sequence[dict[str, Any]], models: Sequence[str] = ("allen-cunneen", "ggm")
) -> None:
    """Heat map of the median signed relative error of the mean wait over utilization x
    Ca^2 (median over Cs^2), one panel per server count, one row per model."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import SymLogNorm

    utils = sorted({r["simulation"]["utilization"] for r in rows})
    servers = sorted({r["simulation"]["servers"] for r in rows})
    scvs = sorted({r["simulation"]["ca2"] for r in rows})
    fig, axes = plt.subplots(
        len(models), len(servers), figsize=(3.2 * len(servers), 3.0 * len(models)), squeeze=False
    )
    norm = SymLogNorm(linthresh=0.1, vmin=-3, vmax=3)
    image = None
    for i, name in enumerate(models):
        for j, m in enumerate(servers):
            grid_ = np.full((len(utils), len(scvs)), np.nan)
            for a, u in enumerate(utils):
                for b, c in enumerate(scvs):
                    e = [
                        r["models"][name]["wait_relative_error"]
                        for r in rows
                        if r["simulation"]["servers"] == m
                        and r["simulation"]["utilization"] == u
                        and r["simulation"]["ca2"] == c
                    ]
                    e = [x for x in e if x is not None]
                    if e:
                        grid_[a, b] = float(np.median(e))
            ax = axes[i][j]
            image = ax.imshow(grid_, cmap="RdBu_r", norm=norm, origin="lower", aspect="auto")
            for a in range(len(utils)):
                for b in range(len(scvs)):
                    if np.isfinite(grid_[a, b]):
                        ax.text(
                            b, a, f"{100 * grid_[a, b]:+.0f}", ha="center", va="center", fontsize=7
                        )
            ax.set_xticks(range(len(scvs)), [f"{c:g}" for c in scvs])
            ax.set_yticks(range(len(utils)), [f"{u:g}" for u in utils])
            ax.set_title(f"{name}, M = {m}", fontsize=9)
            if i == len(models) - 1:
                ax.set_xlabel("Ca²")
            if j == 0:
                ax.set_ylabel("utilization ρ")
    fig.colorbar(image, ax=axes, shrink=0.8, label="median relative error of mean wait (over Cs²)")
    fig.suptitle(
        "G/G/M mean wait vs simulation (%; blank: simulated wait < 1% of service time)", fontsize=10
    )
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --------------------------------------------------------------------------------- CLI


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", type=Path, default=None, help="write the result JSON here")
    parser.add_argument(
        "--png", type=Path, default=None, help="figure (default: JSON path with .png)"
    )
    parser.add_argument(
        "--simulate",
        action="store_true",
        help="simulate the scoring grid afresh (minutes) instead of rescoring the committed one",
    )
    parser.add_argument(
        "--points",
        type=Path,
        default=DEFAULT_RESULT,
        help="result JSON whose simulated points are rescored (without --simulate)",
    )
    parser.add_argument("--seed", type=int, default=SCORE_SEED, help="seed of the simulated grid")
    parser.add_argument("--fit-grid", action="store_true", help="simulate the fitting grid instead")
    parser.add_argument("--replications", type=int, default=256)
    parser.add_argument("--target-halfwidth", type=float, default=0.02)
    parser.add_argument("--max-customers", type=int, default=200_000_000)
    parser.add_argument("--workers", type=int, default=1)


def run(args: argparse.Namespace) -> int:
    start = time.perf_counter()
    if args.simulate or args.fit_grid:
        cells = fit_grid() if args.fit_grid else score_grid()
        seed = FIT_SEED if args.fit_grid and args.seed == SCORE_SEED else args.seed
        points = simulate_grid(
            cells,
            seed,
            workers=args.workers,
            progress=True,
            replications=args.replications,
            target_halfwidth=args.target_halfwidth,
            max_customers=args.max_customers,
            min_customers=1_000_000,
        )
    else:
        points = load_points(args.points)
    sim_seconds = time.perf_counter() - start
    if args.fit_grid:
        wait_coef, delay_coef = fit_ggm(points)
        figures = {
            "grid": "fit",
            "simulation_settings": simulation_settings(points),
            "ggm_wait_coef": wait_coef.tolist(),
            "ggm_delay_coef": delay_coef.tolist(),
            "points": points_to_json(points),
        }
        write_result(args.json, "queueing-fit", figures)
        print(f"fitted ggm on {len(points)} points; wait coef {np.round(wait_coef, 4).tolist()}")
        return 0
    rows, summary = score_wait_models(points)
    figures = {
        "grid": {
            "utilization": list(SCORE_UTILIZATIONS),
            "servers": list(SCORE_SERVERS),
            "scv": list(SCORE_SCVS),
        },
        "simulation_settings": simulation_settings(points),
        "wall_seconds": sim_seconds,
        "summary": summary,
        "points": rows,
    }
    write_result(args.json, "queueing", figures)
    if args.json is not None:
        plot(args.png or args.json.with_suffix(".png"), rows)
    _print_summary(summary)
    return 0


def _print_summary(summary: dict[str, Any]) -> None:
    print(
        f"{'model':<14} {'wait med':>9} {'wait max':>9} {'p90 med':>8} {'p99 med':>8} {'p99 max':>8}"
    )
    for name, s in summary.items():
        w, p90, p99 = s["wait"], s["p90"], s["p99"]
        if not w.get("points"):
            continue
        print(
            f"{name:<14} {100 * w['median_abs_relative_error']:8.1f}% "
            f"{100 * w['max_abs_relative_error']:8.1f}% "
            f"{100 * p90['median_abs_relative_error']:7.1f}% "
            f"{100 * p99['median_abs_relative_error']:7.1f}% "
            f"{100 * p99['max_abs_relative_error']:7.1f}%"
        )
