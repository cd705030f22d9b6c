"""Accuracy and cost of the predict/ models: load forecasts, Allen-Cunneen, timing.

* load: one-step MAPE and RMSE of last value, linear trend, ARIMA and the max rule on
  seeded traces from testbed.traces (triangle, random steps, compressed diurnal day,
  Poisson and Weibull arrivals with changing parameters); 10-second slots.
* queueing: Allen-Cunneen's G/G/M waiting time against a discrete-event simulation of
  the same FCFS queue (gamma-distributed inter-arrival and service times with the
  requested squared coefficients of variation) over utilization x servers x arrival_scv x Cs2.
* timing: one ARIMA forecast update per series, a full ARIMA fit (order selection) on
  300 points, the linear trend, and min_service_rate for one and for 5000 operators.
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import write_result
from predict.load import Arima, LastValue, LinearTrend, combine
from predict.queueing import (
    allen_cunneen_wait,
    min_service_rate,
    min_service_rate_many,
)
from testbed import traces

SLOT_SECONDS = 10.0
UTILIZATIONS = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95)
SERVERS = (1, 2, 4, 8)
SCVS = (0.25, 1.0, 2.0)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", type=Path, default=None, help="write the result JSON here")
    parser.add_argument(
        "--png", type=Path, default=None, help="figure path (default: JSON path with .png)"
    )
    parser.add_argument(
        "--customers", type=int, default=500_000, help="simulated customers per queueing cell"
    )
    parser.add_argument("--seed", type=int, default=1, help="seed of traces and simulations")
    parser.add_argument(
        "--quick", action="store_true", help="small grid and short traces (smoke run)"
    )


# ------------------------------------------------------------------------ load traces


def load_traces(seed: int, quick: bool = False) -> dict[str, np.ndarray]:
    """Observed arrivals per second in each 10 s slot, for every benchmark trace."""
    rng = np.random.default_rng(seed)
    n = 240 if quick else 720

    def observed(rate_per_s: np.ndarray) -> np.ndarray:
        # What an operator measures: Poisson counts in the slot around the true rate.
        return rng.poisson(rate_per_s * SLOT_SECONDS) / SLOT_SECONDS

    out = {
        # 5 minutes up, 5 minutes down with 10 s slots.
        "triangle": observed(traces.triangle(n, low=20.0, high=400.0, period=60)),
        # 1..25 producers of 10 tuples/s each, redrawn every slot.
        "random_steps": observed(10.0 * traces.random_steps(n, 1, 25, seed=seed)),
        "diurnal": traces.diurnal(n, base=40.0, peak=400.0, bursts=6, seed=seed, noise=0.05),
    }
    duration = n * SLOT_SECONDS
    segment = 60 * SLOT_SECONDS
    poisson, weibull = [], []
    for k, start in enumerate(np.arange(0.0, duration, segment)):
        length = min(segment, duration - start)
        rate = rng.uniform(0.2, 1.0) / 0.1  # 0.2..1 per 100 ms
        poisson.append(start + traces.poisson_arrivals(rate, length, seed=seed * 1000 + k))
        scale, shape = rng.uniform(1.1, 4.0) * 0.1, rng.uniform(2.0, 6.0)  # scale in 100 ms
        weibull.append(start + traces.weibull_arrivals(scale, shape, length, seed=seed * 2000 + k))
    out["poisson"] = (
        traces.counts_per_slot(np.concatenate(poisson), SLOT_SECONDS, duration) / SLOT_SECONDS
    )
    out["weibull"] = (
        traces.counts_per_slot(np.concatenate(weibull), SLOT_SECONDS, duration) / SLOT_SECONDS
    )
    return out


def one_step_errors(series: np.ndarray, warmup: int = 30) -> dict[str, dict[str, float]]:
    """Rolling one-step forecasts of every predictor from ``warmup`` on."""
    predictors = {"last_value": LastValue(), "linear_trend": LinearTrend(5), "arima": Arima()}
    preds: dict[str, list[float]] = {name: [] for name in [*predictors, "max_rule"]}
    fallbacks = 0
    for t in range(warmup, series.size):
        history = series[:t]
        step = {name: float(p.forecast(history)[0]) for name, p in predictors.items()}
        fallbacks += predictors["arima"].last.fallback_reason is not None
        for name, value in step.items():
            preds[name].append(value)
        preds["max_rule"].append(
            combine({"linear_trend": step["linear_trend"], "arima": step["arima"]}).value
        )
    actual = series[warmup:]
    nonzero = actual > 0
    result = {}
    for name, values in preds.items():
        err = np.asarray(values) - actual
        result[name] = {
            "mape": float(np.mean(np.abs(err[nonzero]) / actual[nonzero])),
            "rmse": float(np.sqrt(np.mean(err**2))),
        }
    result["arima"]["fits"] = predictors["arima"].fits
    result["arima"]["fallback_slots"] = fallbacks
    return result


# -------------------------------------------------------------------------- queueing


def simulate_ggm_wait(
    arrival_rate: float,
    service_rate: float,
    servers: int,
    arrival_scv: float,
    service_scv: float,
    customers: int,
    seed: int,
    warmup_fraction: float = 0.1,
    batches: int = 20,
) -> tuple[float, float]:
    """Mean waiting time in queue of a FCFS G/G/M queue and its batch-means std error.

    Inter-arrival and service times are gamma distributed with shape ``1 / scv``, so
    their means are ``1/lambda``, ``1/mu`` and their squared coefficients of variation
    exactly ``arrival_scv`` and ``service_scv``.
    """
    rng = np.random.default_rng(seed)
    gaps = rng.gamma(1.0 / arrival_scv, arrival_scv / arrival_rate, customers)
    service = rng.gamma(1.0 / service_scv, service_scv / service_rate, customers).tolist()
    arrivals = np.cumsum(gaps).tolist()
    free_at = [0.0] * servers  # min-heap of the times each server becomes free
    waits = [0.0] * customers
    for i, arrival in enumerate(arrivals):
        start = free_at[0] if free_at[0] > arrival else arrival
        waits[i] = start - arrival
        heapq.heapreplace(free_at, start + service[i])
    kept = np.asarray(waits[int(customers * warmup_fraction) :])
    batch_means = np.array([b.mean() for b in np.array_split(kept, batches)])
    return float(kept.mean()), float(batch_means.std(ddof=1) / np.sqrt(batches))


def queueing_table(customers: int, seed: int, quick: bool = False) -> list[dict[str, Any]]:
    utils = (0.5, 0.9) if quick else UTILIZATIONS
    servers_grid = (1, 4) if quick else SERVERS
    rows = []
    cells = itertools.product(utils, servers_grid, SCVS, SCVS)
    for k, (rho, m, arrival_scv, service_scv) in enumerate(cells):
        mu = 1.0
        lam = rho * m * mu
        sim, stderr = simulate_ggm_wait(lam, mu, m, arrival_scv, service_scv, customers, seed + k)
        ac = allen_cunneen_wait(lam, mu, m, arrival_scv, service_scv)
        rows.append(
            {
                "utilization": rho,
                "servers": m,
                "arrival_scv": arrival_scv,
                "service_scv": service_scv,
                "simulated_wait": sim,
                "simulated_wait_stderr": stderr,
                "allen_cunneen_wait": ac,
                "relative_error": (ac - sim) / sim if sim > 0 else None,
            }
        )
    return rows


def queueing_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    def median_abs(select) -> float | None:
        errs = [
            abs(r["relative_error"]) for r in rows if r["relative_error"] is not None and select(r)
        ]
        return float(statistics.median(errs)) if errs else None

    low_var = lambda r: r["arrival_scv"] <= 1 and r["service_scv"] <= 1  # noqa: E731
    summary = {
        "median_abs_relative_error_util_0.5_0.95_scv_le_1": median_abs(
            lambda r: 0.5 <= r["utilization"] <= 0.95 and low_var(r)
        ),
        "median_abs_relative_error_all": median_abs(lambda r: True),
        "by_utilization": {
            str(u): median_abs(lambda r, u=u: r["utilization"] == u)
            for u in sorted({r["utilization"] for r in rows})
        },
        "by_servers": {
            str(m): median_abs(lambda r, m=m: r["servers"] == m)
            for m in sorted({r["servers"] for r in rows})
        },
        "by_scv": {
            f"arrival_scv={a},service_scv={s}": median_abs(
                lambda r, a=a, s=s: r["arrival_scv"] == a and r["service_scv"] == s
            )
            for a in SCVS
            for s in SCVS
        },
        "cells_over_10pct": sum(
            1 for r in rows if r["relative_error"] is not None and abs(r["relative_error"]) > 0.10
        ),
        "cells": len(rows),
    }
    return summary


# ---------------------------------------------------------------------------- timing


def _median_time(fn, repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return float(statistics.median(samples))


def timing(seed: int, quick: bool = False) -> dict[str, float]:
    series = traces.diurnal(600, base=40.0, peak=400.0, bursts=6, seed=seed)
    fit_points = series[:300]
    arima_fit = _median_time(
        lambda: Arima(refit_every=10**9).predict(fit_points), 1 if quick else 3
    )
    fixed_fit = _median_time(
        lambda: Arima(order=(1, 0, 1), refit_every=10**9).predict(fit_points), 1 if quick else 3
    )

    # One object per series, as the controller holds it: fit once, then time updates.
    model = Arima(refit_every=10**9, error_growth=1e9)
    model.predict(series[:300])
    updates = []
    for t in range(301, 600):
        t0 = time.perf_counter()
        model.predict(series[:t])
        updates.append(time.perf_counter() - t0)
    # Amortized cost including the scheduled refits (default settings).
    amortized = Arima()
    amortized.predict(series[:300])
    t0 = time.perf_counter()
    for t in range(301, 600):
        amortized.predict(series[:t])
    amortized_mean = (time.perf_counter() - t0) / 299

    lt = LinearTrend(5)
    lam = np.linspace(10.0, 60.0, 5000)
    return {
        "forecast_update_seconds": float(np.median(updates)),
        "forecast_update_p95_seconds": float(np.percentile(updates, 95)),
        "forecast_update_amortized_with_refits_seconds": float(amortized_mean),
        "arima_refits_in_amortized_run": amortized.fits,
        "arima_fit_seconds": arima_fit,
        "arima_fit_fixed_order_seconds": fixed_fit,
        "linear_trend_forecast_seconds": _median_time(lambda: lt.forecast(series[:300]), 200),
        "min_service_rate_seconds": _median_time(
            lambda: min_service_rate(0.1, 25.0, 4, 1.0, 1.0), 500
        ),
        "min_service_rate_many_5000_seconds": _median_time(
            lambda: min_service_rate_many(0.1, lam, 4, 1.0, 1.0), 20
        ),
    }


# ----------------------------------------------------------------------------- figure


def plot(path: Path, series: np.ndarray, rows: list[dict[str, Any]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.5))
    warmup = 30
    arima, lt = Arima(), LinearTrend(5)
    idx = np.arange(warmup, series.size)
    ax1.plot(idx, series[warmup:], color="black", lw=1, label="observed")
    ax1.plot(idx, [arima.forecast(series[:t])[0] for t in idx], lw=1, label="ARIMA")
    ax1.plot(idx, [lt.forecast(series[:t])[0] for t in idx], lw=1, alpha=0.7, label="linear trend")
    ax1.set_xlabel("slot (10 s)")
    ax1.set_ylabel("arrivals / s")
    ax1.set_title("diurnal trace: one-step forecasts")
    ax1.legend()
    for m, marker in zip(sorted({r["servers"] for r in rows}), "osd^", strict=False):
        sel = [
            r for r in rows if r["servers"] == m and r["arrival_scv"] <= 1 and r["service_scv"] <= 1
        ]
        by_u: dict[float, list[float]] = {}
        for r in sel:
            by_u.setdefault(r["utilization"], []).append(r["relative_error"])
        us = sorted(by_u)
        ax2.plot(us, [100 * statistics.median(by_u[u]) for u in us], marker=marker, label=f"M={m}")
    # Symmetric log: errors span from a few percent to thousands at low load.
    ax2.set_yscale("symlog", linthresh=10)
    ax2.axhspan(-10, 10, color="green", alpha=0.1)
    ax2.axhline(0, color="black", lw=0.5)
    ax2.set_xlabel("utilization")
    ax2.set_ylabel("median relative error of W (%), symlog")
    ax2.set_title("Allen-Cunneen vs simulation (arrival_scv, Cs2 <= 1)")
    ax2.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(args: argparse.Namespace) -> int:
    if args.customers < 1000:
        raise SystemExit(f"--customers must be >= 1000, got {args.customers}")
    t0 = time.perf_counter()
    series = load_traces(args.seed, args.quick)
    load = {name: one_step_errors(values) for name, values in series.items()}
    rows = queueing_table(args.customers, args.seed, args.quick)
    figures = {
        "settings": {
            "slot_seconds": SLOT_SECONDS,
            "customers_per_cell": args.customers,
            "seed": args.seed,
            "quick": args.quick,
        },
        "load": load,
        "queueing": rows,
        "queueing_summary": queueing_summary(rows),
        "timing": timing(args.seed, args.quick),
    }
    figures["elapsed_seconds"] = time.perf_counter() - t0
    write_result(args.json, "predict", figures)
    png = args.png or (args.json.with_suffix(".png") if args.json else None)
    if png is not None:
        plot(png, series["diurnal"], rows)
    _print_table(figures)
    return 0


def _print_table(figures: dict[str, Any]) -> None:
    print(f"{'trace':<14}{'predictor':<14}{'MAPE':>8}{'RMSE':>10}")
    for trace, preds in figures["load"].items():
        for name, m in preds.items():
            print(f"{trace:<14}{name:<14}{100 * m['mape']:>7.1f}%{m['rmse']:>10.2f}")
    s = figures["queueing_summary"]
    print(
        "Allen-Cunneen median |rel err|, util 0.5-0.95, arrival_scv,Cs2<=1:",
        s["median_abs_relative_error_util_0.5_0.95_scv_le_1"],
    )
    for k, val in figures["timing"].items():
        print(f"{k}: {val}")
