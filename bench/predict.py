"""Accuracy and cost of the predict/ models: load forecasts, Allen-Cunneen, timing.

* load: one-step MAPE and RMSE of last value, linear trend, ARIMA and the max rule on
  seeded traces from testbed.traces (triangle, random steps, compressed diurnal day,
  Poisson and Weibull arrivals with changing parameters); 10-second slots.
* queueing: Allen-Cunneen's G/G/M waiting time against a discrete-event simulation of
  the same FCFS queue (gamma-distributed inter-arrival and service times with the
  requested squared coefficients of variation) over utilization x servers x arrival_scv x Cs2.
* timing: one ARIMA forecast update per series, a full ARIMA fit (order selection) on
  300 points, the linear trend, and min_service_rate for one and for 5000 operators.
* seasonal: the seasonal forecaster (predict.seasonal) on the same traces and on
  seeded traces none of the models was tuned on (several compressed days, periodic
  batch spikes, bursty Pareto on/off, a random walk), against last value and the
  default max rule;
* intervals: coverage of conformal upper 0.9 quantiles and central 90 % intervals
  (predict.intervals), plain split conformal and adaptive conformal inference, per
  forecaster per trace.
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import os
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import process_pool, write_result
from predict.intervals import ConformalBank, conformal_replay
from predict.load import Arima, LastValue, LinearTrend
from predict.queueing import (
    allen_cunneen_wait,
    min_service_rate,
    min_service_rate_many,
)
from predict.seasonal import MaxRule, Seasonal
from testbed import traces

SLOT_SECONDS = 10.0
UTILIZATIONS = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95)
SERVERS = (1, 2, 4, 8)
SCVS = (0.25, 1.0, 2.0)
PREDICTORS = ("last_value", "linear_trend", "arima", "max_rule", "seasonal")
WARMUP = 30
#: Conformal settings scored: the bank's defaults.
INTERVAL_WINDOW = 200
INTERVAL_GAMMA = 0.01
#: Slots after the first forecast before coverage is counted (the error record fills).
COVERAGE_BURN_IN = 20
PERIODIC = ("triangle", "multi_day", "multi_day_noisy", "batch_spikes")


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
        "--jobs",
        type=int,
        default=min(4, os.cpu_count() or 1),
        help="worker processes for traces and queueing cells (results do not depend on it)",
    )
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


def unseen_traces(seed: int, quick: bool = False) -> dict[str, np.ndarray]:
    """Seeded traces of kinds the forecasters were not designed on, observed through
    Poisson counting noise in 10 s slots.

    * ``multi_day``: 15 compressed days of 48 slots whose volume varies +-10 % from
      day to day, a peaked daily shape, 5 % multiplicative noise (as the diurnal trace);
    * ``multi_day_noisy``: the same days with 10 % noise;
    * ``batch_spikes``: 50 tuples/s with a batch every 36 slots (+200, decaying);
    * ``pareto_onoff``: bursty on/off source, Pareto(1.5) period lengths (1..60 slots),
      200-400 tuples/s on, 10-40 off;
    * ``random_walk``: a geometric random walk around 100 tuples/s.
    """
    rng = np.random.default_rng(seed + 100)
    n = 240 if quick else 720
    t = np.arange(n)

    def observed(rate_per_s: np.ndarray) -> np.ndarray:
        return rng.poisson(np.maximum(rate_per_s, 0.0) * SLOT_SECONDS) / SLOT_SECONDS

    def noise(sd: float) -> np.ndarray:
        return np.maximum(1.0 + sd * rng.standard_normal(n), 0.1)

    day = 48
    volume = 1.0 + 0.1 * rng.standard_normal(n // day + 1)
    shape = (0.5 * (1.0 - np.cos(2.0 * np.pi * (t % day) / day))) ** 1.5
    days = 40.0 + 260.0 * volume[t // day] * shape
    phase = t % 36
    spikes = 50.0 + 200.0 * np.where(phase < 6, np.exp(-phase / 2.0), 0.0)
    onoff = np.empty(n)
    k, on = 0, bool(rng.integers(2))
    while k < n:
        length = min(int(np.ceil(rng.pareto(1.5) + 1.0)), 60)
        onoff[k : k + length] = rng.uniform(200.0, 400.0) if on else rng.uniform(10.0, 40.0)
        k, on = k + length, not on
    return {
        "multi_day": observed(days * noise(0.05)),
        "multi_day_noisy": observed(days * noise(0.10)),
        "batch_spikes": observed(spikes * noise(0.05)),
        "pareto_onoff": observed(onoff),
        "random_walk": observed(100.0 * np.exp(np.cumsum(rng.normal(0.0, 0.05, n)))),
    }


def one_step_forecasts(
    series: np.ndarray, warmup: int = WARMUP
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Rolling one-step forecasts of every predictor from ``warmup`` on.

    The max rule and the seasonal forecaster's fallback hold the same linear trend and
    ARIMA objects as the single predictors, so ARIMA is fitted once per trace; what
    each object returns does not depend on how often it is asked (tested)."""
    lt, arima = LinearTrend(5), Arima()
    max_rule = MaxRule((lt, arima))
    predictors = {
        "last_value": LastValue(),
        "linear_trend": lt,
        "arima": arima,
        "max_rule": max_rule,
        "seasonal": Seasonal(fallback=max_rule),
    }
    preds: dict[str, list[float]] = {name: [] for name in predictors}
    fallbacks = seasonal_slots = 0
    first_period = None
    for t in range(warmup, series.size):
        history = series[:t]
        for name, p in predictors.items():
            preds[name].append(float(p.forecast(history)[0]))
        fallbacks += arima.last.fallback_reason is not None
        seasonal_slots += predictors["seasonal"].last.method.startswith("seasonal")
        if first_period is None and predictors["seasonal"].period is not None:
            first_period = t
    info = {
        "seasonal_first_period_slot": first_period,
        "arima_fits": arima.fits,
        "arima_fallback_slots": fallbacks,
        "seasonal_slots": seasonal_slots,
        "seasonal_period": predictors["seasonal"].period,
        "seasonal_kind": predictors["seasonal"].kind,
    }
    return {name: np.asarray(v) for name, v in preds.items()}, info


def accuracy(predicted: np.ndarray, actual: np.ndarray) -> dict[str, float]:
    err = predicted - actual
    nonzero = actual > 0
    return {
        "mape": float(np.mean(np.abs(err[nonzero]) / actual[nonzero])),
        "rmse": float(np.sqrt(np.mean(err**2))),
    }


def one_step_errors(series: np.ndarray, warmup: int = WARMUP) -> dict[str, dict[str, Any]]:
    """MAPE and RMSE of every predictor's rolling one-step forecasts from ``warmup`` on."""
    preds, info = one_step_forecasts(series, warmup)
    actual = series[warmup:]
    result: dict[str, dict[str, Any]] = {
        name: accuracy(values, actual) for name, values in preds.items()
    }
    result["arima"]["fits"] = info["arima_fits"]
    result["arima"]["fallback_slots"] = info["arima_fallback_slots"]
    seasonal = result["seasonal"]
    seasonal["slots_seasonal"] = info["seasonal_slots"]
    seasonal["period"] = info["seasonal_period"]
    seasonal["kind"] = info["seasonal_kind"]
    seasonal["first_period_slot"] = first = info["seasonal_first_period_slot"]
    if first is not None:
        # After the period was first found (the learning slots left out).
        after = slice(first - warmup, None)
        for name in ("last_value", "max_rule", "seasonal"):
            result[name]["rmse_after_period_found"] = accuracy(preds[name][after], actual[after])[
                "rmse"
            ]
    seasonal["rmse_vs_last_value"] = _ratio(seasonal["rmse"], result["last_value"]["rmse"])
    seasonal["rmse_vs_max_rule"] = _ratio(seasonal["rmse"], result["max_rule"]["rmse"])
    seasonal["mape_vs_last_value"] = _ratio(seasonal["mape"], result["last_value"]["mape"])
    seasonal["mape_vs_max_rule"] = _ratio(seasonal["mape"], result["max_rule"]["mape"])
    result["_forecasts"] = preds  # popped by run(); kept for the interval scoring
    return result


def _ratio(a: float, b: float) -> float | None:
    return a / b if b > 0 else None


def interval_coverage(
    preds: dict[str, np.ndarray],
    actual: np.ndarray,
    *,
    window: int = INTERVAL_WINDOW,
    gamma: float = INTERVAL_GAMMA,
    burn_in: int = COVERAGE_BURN_IN,
) -> dict[str, dict[str, Any]]:
    """Per forecaster: share of outcomes at or below the online conformal 0.9 (and
    0.99) upper quantile and inside the central 90 % interval, plain split conformal
    and adaptive (ACI), counted after ``burn_in`` slots; and the mean upper margin
    over the point forecast relative to the mean outcome."""
    names = list(preds)
    points = np.stack([preds[n] for n in names])
    act = np.broadcast_to(actual, points.shape)
    kept = slice(burn_in, None)
    out: dict[str, dict[str, Any]] = {n: {} for n in names}
    for method, adaptive in (("conformal", False), ("aci", True)):

        def replay(q: float, adaptive=adaptive) -> np.ndarray:
            return conformal_replay(points, act, q, window, adaptive=adaptive, gamma=gamma)

        up90, up99 = replay(0.9), replay(0.99)
        lo05, up95 = replay(0.05), replay(0.95)
        inside = (act >= lo05) & (act <= up95)
        for i, n in enumerate(names):
            y = act[i, kept]
            out[n][method] = {
                "upper_0.9": float(np.mean(y <= up90[i, kept])),
                "upper_0.99": float(np.mean(y <= up99[i, kept])),
                "central_0.9": float(np.mean(inside[i, kept])),
                "upper_0.9_margin": float(
                    np.mean(up90[i, kept] - points[i, kept]) / max(np.mean(y), 1e-12)
                ),
            }
    return out


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


def _queueing_cell(cell: tuple[int, float, int, float, float, int, int]) -> dict[str, Any]:
    k, rho, m, arrival_scv, service_scv, customers, seed = cell
    mu = 1.0
    lam = rho * m * mu
    sim, stderr = simulate_ggm_wait(lam, mu, m, arrival_scv, service_scv, customers, seed + k)
    ac = allen_cunneen_wait(lam, mu, m, arrival_scv, service_scv)
    return {
        "utilization": rho,
        "servers": m,
        "arrival_scv": arrival_scv,
        "service_scv": service_scv,
        "simulated_wait": sim,
        "simulated_wait_stderr": stderr,
        "allen_cunneen_wait": ac,
        "relative_error": (ac - sim) / sim if sim > 0 else None,
    }


def queueing_table(
    customers: int, seed: int, quick: bool = False, jobs: int = 1
) -> list[dict[str, Any]]:
    """One row per grid cell; each cell has its own seed, so ``jobs`` does not change
    the result."""
    utils = (0.5, 0.9) if quick else UTILIZATIONS
    servers_grid = (1, 4) if quick else SERVERS
    cells = [
        (k, rho, m, a, c, customers, seed)
        for k, (rho, m, a, c) in enumerate(itertools.product(utils, servers_grid, SCVS, SCVS))
    ]
    return _map(_queueing_cell, cells, jobs)


def _map(fn, items: list, jobs: int) -> list:
    """``[fn(x) for x in items]``, in worker processes when ``jobs > 1`` (same order)."""
    if jobs <= 1 or len(items) <= 1:
        return [fn(x) for x in items]
    with process_pool(min(jobs, len(items))) as pool:
        return list(pool.map(fn, items, chunksize=max(1, len(items) // (4 * jobs))))


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

    # Seasonal forecaster per call on a 300-slot periodic history (the controller's
    # source history), its own part only (last value as the fallback).
    periodic = 100.0 + 50.0 * np.sin(2.0 * np.pi * np.arange(600) / 48.0)
    seasonal = Seasonal(fallback=LastValue())
    seasonal_calls = []
    for t in range(300, 400):
        t0 = time.perf_counter()
        seasonal.forecast(periodic[t - 300 : t])
        seasonal_calls.append(time.perf_counter() - t0)

    # One epoch of interval bookkeeping for 5000 operators: score, then bound.
    rng = np.random.default_rng(seed)
    keys = list(range(5000))
    bank = ConformalBank(window=200, levels=(0.5, 0.9, 0.99))
    for _ in range(200):
        bank.update(keys, rng.gamma(4.0, 10.0, 5000), rng.gamma(4.0, 10.0, 5000))
    points, actual = rng.gamma(4.0, 10.0, 5000), rng.gamma(4.0, 10.0, 5000)
    quantiles = rng.choice([0.5, 0.9, 0.99], 5000)

    return {
        "seasonal_forecast_seconds": float(np.median(seasonal_calls)),
        "conformal_bank_update_5000_seconds": _median_time(
            lambda: bank.update(keys, actual, points), 1 if quick else 5
        ),
        "conformal_bank_upper_5000_seconds": _median_time(
            lambda: bank.upper(keys, points, quantiles), 1 if quick else 5
        ),
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


def plot(
    path: Path,
    rows: list[dict[str, Any]],
    load: dict[str, dict[str, Any]],
    coverage: dict[str, dict[str, Any]],
    example: tuple[str, np.ndarray, dict[str, np.ndarray]],
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(14, 9))
    (ax1, ax2), (ax3, ax4) = axes

    # (a) a periodic trace: seasonal and max-rule forecasts, the seasonal ACI bound.
    name, series, preds = example
    actual = series[WARMUP:]
    upper = conformal_replay(preds["seasonal"], actual, 0.9, INTERVAL_WINDOW, gamma=INTERVAL_GAMMA)
    idx = np.arange(WARMUP, series.size)
    show = idx >= max(WARMUP, series.size - 144)
    ax1.plot(idx[show], actual[show], color="black", lw=1, label="observed")
    ax1.plot(idx[show], preds["max_rule"][show], lw=1, label="max rule (default)")
    ax1.plot(idx[show], preds["seasonal"][show], lw=1, label="seasonal")
    ax1.fill_between(
        idx[show],
        preds["seasonal"][show],
        upper[show],
        color="C1",
        alpha=0.2,
        label="seasonal, ACI upper 0.9",
    )
    ax1.set_xlabel("slot (10 s)")
    ax1.set_ylabel("arrivals / s")
    ax1.set_title(f"{name}: one-step forecasts (last 144 slots)")
    ax1.legend(fontsize=8)

    # (b) Allen-Cunneen against simulation.
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

    # (c) coverage of the 0.9 upper quantile per trace and forecaster.
    traces_ = list(coverage)
    x = np.arange(len(traces_))
    for j, pred in enumerate(PREDICTORS):
        off = (j - (len(PREDICTORS) - 1) / 2) * 0.14
        plain = [100 * coverage[t][pred]["conformal"]["upper_0.9"] for t in traces_]
        aci = [100 * coverage[t][pred]["aci"]["upper_0.9"] for t in traces_]
        ax3.scatter(x + off, plain, marker="o", facecolors="none", edgecolors=f"C{j}", s=22)
        ax3.scatter(x + off, aci, marker="o", color=f"C{j}", s=22, label=pred)
    ax3.axhspan(88, 92, color="green", alpha=0.12)
    ax3.axhline(90, color="black", lw=0.5)
    ax3.set_xticks(x, traces_, rotation=30, ha="right", fontsize=8)
    ax3.set_ylabel("outcomes <= upper 0.9 quantile (%)")
    ax3.set_title("coverage per trace: ACI (filled), plain conformal (open); band 88-92 %")
    ax3.legend(fontsize=7, ncol=2)

    # (d) RMSE relative to last value.
    width = 0.38
    seas = [load[t]["seasonal"]["rmse"] / load[t]["last_value"]["rmse"] for t in traces_]
    maxr = [load[t]["max_rule"]["rmse"] / load[t]["last_value"]["rmse"] for t in traces_]
    ax4.bar(x - width / 2, maxr, width, label="max rule (default)")
    ax4.bar(x + width / 2, seas, width, label="seasonal")
    ax4.axhline(1.0, color="black", lw=0.8)
    ax4.axhline(0.8, color="green", lw=0.8, ls="--", label="20 % better than last value")
    ax4.set_xticks(
        x,
        [f"{t}{' *' if t in PERIODIC else ''}" for t in traces_],
        rotation=30,
        ha="right",
        fontsize=8,
    )
    ax4.set_ylabel("RMSE / RMSE of last value")
    ax4.set_title("one-step RMSE relative to last value (* periodic)")
    ax4.legend(fontsize=8)

    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def single_thread_blas() -> int:
    """Set every OpenBLAS loaded in this process to one thread; return how many were set.

    The forecasts fit many small ARIMA models: more BLAS threads do not help them, and
    on a shared 2-core machine OpenBLAS's spinning threads made the run about three
    times slower (user time 44 s against 14 s for ``--quick``). numpy is already loaded
    when a benchmark module is, so OPENBLAS_NUM_THREADS would come too late; the
    library's own setter is called instead (forked workers inherit the setting).
    """
    import ctypes

    try:
        with open("/proc/self/maps") as maps:
            libs = sorted({ln.split()[-1] for ln in maps if "openblas" in ln.lower()})
    except OSError:
        return 0
    done = 0
    for path in libs:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for symbol in (
            "scipy_openblas_set_num_threads64_",
            "scipy_openblas_set_num_threads",
            "openblas_set_num_threads64_",
            "openblas_set_num_threads",
        ):
            setter = getattr(lib, symbol, None)
            if setter is not None:
                setter(1)
                done += 1
                break
    return done


def run(args: argparse.Namespace) -> int:
    if args.customers < 1000:
        raise SystemExit(f"--customers must be >= 1000, got {args.customers}")
    blas_set = single_thread_blas()
    t0 = time.perf_counter()
    series = load_traces(args.seed, args.quick)
    unseen = unseen_traces(args.seed, args.quick)
    every = {**series, **unseen}
    scored = _map(_score_trace, list(every.values()), args.jobs)
    load, coverage, forecasts = {}, {}, {}
    for name, (scores, cov, preds) in zip(every, scored, strict=True):
        load[name], coverage[name], forecasts[name] = scores, cov, preds
    rows = queueing_table(args.customers, args.seed, args.quick, args.jobs)
    figures = {
        "settings": {
            "slot_seconds": SLOT_SECONDS,
            "customers_per_cell": args.customers,
            "seed": args.seed,
            "quick": args.quick,
            "jobs": args.jobs,
            "blas_libraries_set_to_one_thread": blas_set,
            "warmup_slots": WARMUP,
            "interval_window": INTERVAL_WINDOW,
            "interval_gamma": INTERVAL_GAMMA,
            "coverage_burn_in_slots": COVERAGE_BURN_IN,
            "unseen_traces": sorted(unseen),
            "periodic_traces": list(PERIODIC),
        },
        "load": load,
        "coverage": coverage,
        "seasonal_summary": seasonal_summary(load),
        "queueing": rows,
        "queueing_summary": queueing_summary(rows),
        "timing": timing(args.seed, args.quick),
    }
    figures["elapsed_seconds"] = time.perf_counter() - t0
    write_result(args.json, "predict", figures)
    png = args.png or (args.json.with_suffix(".png") if args.json else None)
    if png is not None:
        example = "multi_day"
        plot(png, rows, load, coverage, (example, every[example], forecasts[example]))
    _print_table(figures)
    return 0


def _score_trace(values: np.ndarray) -> tuple[dict, dict, dict[str, np.ndarray]]:
    scores = one_step_errors(values)
    preds = scores.pop("_forecasts")
    return scores, interval_coverage(preds, values[WARMUP:]), preds


def seasonal_summary(load: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """RMSE of the seasonal forecaster against last value (periodic traces) and
    against the max rule (traces without a period)."""
    periodic = {t: load[t]["seasonal"]["rmse_vs_last_value"] for t in load if t in PERIODIC}
    other = {t: load[t]["seasonal"]["rmse_vs_max_rule"] for t in load if t not in PERIODIC}
    return {
        "periodic_rmse_vs_last_value": periodic,
        "aperiodic_rmse_vs_max_rule": other,
        "periodic_min_gain_vs_last_value": 1.0 - max(periodic.values()) if periodic else None,
        "aperiodic_worst_vs_max_rule": max(other.values()) if other else None,
    }


def _print_table(figures: dict[str, Any]) -> None:
    print(f"{'trace':<16}{'predictor':<14}{'MAPE':>8}{'RMSE':>10}{'cov90':>8}{'ACI90':>8}")
    for trace, preds in figures["load"].items():
        for name, m in preds.items():
            cov = figures["coverage"][trace][name]
            print(
                f"{trace:<16}{name:<14}{100 * m['mape']:>7.1f}%{m['rmse']:>10.2f}"
                f"{100 * cov['conformal']['upper_0.9']:>7.1f}%{100 * cov['aci']['upper_0.9']:>7.1f}%"
            )
    print("seasonal:", figures["seasonal_summary"])
    s = figures["queueing_summary"]
    print(
        "Allen-Cunneen median |rel err|, util 0.5-0.95, arrival_scv,Cs2<=1:",
        s["median_abs_relative_error_util_0.5_0.95_scv_le_1"],
    )
    for k, val in figures["timing"].items():
        print(f"{k}: {val}")
