"""Queueing latency models for one operator served by M identical instances.

All rates are per second and all times are seconds. ``arrival_rate`` is the total
arrival rate of the operator, ``service_rate`` the rate of one instance (server),
``arrival_scv``/``service_scv`` the squared coefficients of variation of inter-arrival and service
times.

* :func:`allen_cunneen_wait` -- G/G/M mean waiting time in queue (service excluded):
  ``W = P_cb / (mu * M * (1 - rho)) * (arrival_scv + service_scv) / 2`` with ``rho = lambda / (M mu)``,
  ``P_cb = rho`` for M = 1, else ``(rho**M + rho) / 2`` if ``rho >= 0.7`` and
  ``rho**((M + 1) / 2)`` otherwise.
* :func:`kingman_wait` -- the G/G/1 special case (equal to Allen--Cunneen at M = 1).
* :func:`erlang_c_wait` -- exact M/M/c waiting time.
* :func:`min_service_rate` / :func:`min_service_rate_for_sojourn` -- the smallest
  per-server rate whose waiting (or waiting + service) time meets a target; the
  ``*_many`` variants solve thousands of operators at once with vectorised bisection.

Every model's waiting time falls as ``service_rate`` rises (for Allen--Cunneen this
holds across the jump of ``P_cb`` at ``rho = 0.7``, because ``(rho**M + rho) / 2 >=
rho**((M + 1) / 2)`` by the AM--GM inequality), which is what makes the minimal
rate well defined and a bracketing search exact.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from scipy.optimize import brentq

from dsched import validate as v

#: Relative accuracy of the minimal-rate searches.
RATE_RTOL = 1e-9


def _check(arrival_rate: float, service_rate: float, servers: int) -> tuple[float, float, int]:
    lam = v.non_negative(arrival_rate, "arrival_rate")
    mu = v.positive(service_rate, "service_rate")
    m = v.positive_int(servers, "servers")
    if lam >= m * mu:
        raise ValueError(
            f"unstable queue: arrival_rate={lam} >= servers*service_rate={m * mu} "
            f"(utilization {lam / (m * mu):.4g} >= 1)"
        )
    return lam, mu, m


def _scv(value: float, name: str) -> float:
    return v.non_negative(value, name)


def busy_probability(utilization: float, servers: int) -> float:
    """Allen--Cunneen's approximation of the probability that all servers are busy."""
    rho, m = utilization, servers
    if m == 1:
        return rho
    if rho >= 0.7:
        return (rho**m + rho) / 2.0
    return rho ** ((m + 1) / 2.0)


def allen_cunneen_wait(
    arrival_rate: float, service_rate: float, servers: int, arrival_scv: float, service_scv: float
) -> float:
    """Mean waiting time in queue of a G/G/M queue by Allen--Cunneen (seconds)."""
    lam, mu, m = _check(arrival_rate, service_rate, servers)
    arrival_scv, service_scv = _scv(arrival_scv, "arrival_scv"), _scv(service_scv, "service_scv")
    rho = lam / (m * mu)
    return busy_probability(rho, m) / (mu * m * (1.0 - rho)) * (arrival_scv + service_scv) / 2.0


def kingman_wait(
    arrival_rate: float, service_rate: float, arrival_scv: float, service_scv: float
) -> float:
    """Kingman's G/G/1 mean waiting time in queue (seconds)."""
    lam, mu, _ = _check(arrival_rate, service_rate, 1)
    arrival_scv, service_scv = _scv(arrival_scv, "arrival_scv"), _scv(service_scv, "service_scv")
    rho = lam / mu
    return rho / (1.0 - rho) * (arrival_scv + service_scv) / 2.0 / mu


def erlang_c(offered_load: float, servers: int) -> float:
    """Probability of waiting in M/M/c with offered load ``a = lambda / mu`` < c.

    Computed through the Erlang B recursion, which stays stable for large c.
    """
    b = 1.0
    for k in range(1, servers + 1):
        b = offered_load * b / (k + offered_load * b)
    rho = offered_load / servers
    return b / (1.0 - rho + rho * b)


def erlang_c_wait(arrival_rate: float, service_rate: float, servers: int) -> float:
    """Exact mean waiting time in queue of an M/M/c queue (seconds)."""
    lam, mu, m = _check(arrival_rate, service_rate, servers)
    if lam == 0:
        return 0.0
    return erlang_c(lam / mu, m) / (m * mu - lam)


WaitModel = Callable[[float, float, int, float, float], float]


#: Waiting-time models by name, all with the signature of :func:`allen_cunneen_wait`.
def _kingman_model(lam: float, mu: float, m: int, arrival_scv: float, service_scv: float) -> float:
    if m != 1:
        raise ValueError(f"servers must be 1 for the kingman model, got {m}")
    return kingman_wait(lam, mu, arrival_scv, service_scv)


def _erlang_c_model(lam: float, mu: float, m: int, arrival_scv: float, service_scv: float) -> float:
    return erlang_c_wait(lam, mu, m)


WAIT_MODELS: dict[str, WaitModel] = {
    "allen-cunneen": allen_cunneen_wait,
    "kingman": _kingman_model,
    "erlang-c": _erlang_c_model,
}


def waiting_time(
    model: str,
    arrival_rate: float,
    service_rate: float,
    servers: int,
    arrival_scv=1.0,
    service_scv=1.0,
) -> float:
    """Mean waiting time in queue by the model named ``model`` (see :data:`WAIT_MODELS`)."""
    try:
        fn = WAIT_MODELS[model]
    except KeyError:
        raise ValueError(f"model must be one of {sorted(WAIT_MODELS)}, got {model!r}") from None
    return fn(arrival_rate, service_rate, servers, arrival_scv, service_scv)


# --------------------------------------------------------------------------- minimal rates


def _check_target_inputs(
    target: float,
    target_name: str,
    arrival_rate: float,
    servers: int,
    arrival_scv: float,
    service_scv: float,
) -> tuple[float, float, int, float]:
    t = v.positive(target, target_name)
    lam = v.non_negative(arrival_rate, "arrival_rate")
    m = v.positive_int(servers, "servers")
    variability = (_scv(arrival_scv, "arrival_scv") + _scv(service_scv, "service_scv")) / 2.0
    return t, lam, m, variability


#: Relative margin above lambda / M that keeps ``M * mu > lambda`` after rounding.
STABILITY_MARGIN = 1e-12


def _just_above_capacity(lam: float, m: int) -> float:
    return lam / m * (1.0 + STABILITY_MARGIN)


def _ac_wait_unchecked(lam: float, mu: float, m: int, variability: float) -> float:
    rho = lam / (m * mu)
    if rho >= 1.0:
        return math.inf
    return busy_probability(rho, m) / (mu * m * (1.0 - rho)) * variability


def _smallest_feasible(excess: Callable[[float], float], lo: float, hi: float) -> float:
    """Smallest x in (lo, hi] with excess(x) <= 0, for excess decreasing in x.

    ``hi`` should be feasible (it is widened if rounding made it not). The answer is returned from the feasible side of
    the bracket so that it always meets the target.
    """
    if excess(lo) <= 0:
        return lo
    while excess(hi) > 0:
        # Only reachable through rounding when hi is within an ulp of lo.
        hi = hi * 2.0 + 1e-300
    root = brentq(excess, lo, hi, xtol=hi * 1e-15, rtol=RATE_RTOL, maxiter=200)
    # brentq may land a hair on the infeasible side (or inside P_cb's jump).
    step = max(root * RATE_RTOL, 1e-300)
    while excess(root) > 0:
        root += step
        step *= 2.0
    return root


def min_service_rate(
    target_wait: float, arrival_rate: float, servers: int, arrival_scv: float, service_scv: float
) -> float:
    """Smallest per-server rate mu whose Allen--Cunneen waiting time is <= target_wait.

    M = 1 has the closed form ``mu = (lambda + sqrt(lambda^2 + 4 lambda v / t)) / 2``
    with ``v = (arrival_scv + service_scv) / 2``; otherwise the root is bracketed in closed form and
    found with Brent's method to :data:`RATE_RTOL`. Zero arrivals need no capacity: 0.
    """
    t, lam, m, var = _check_target_inputs(
        target_wait, "target_wait", arrival_rate, servers, arrival_scv, service_scv
    )
    if lam == 0.0:
        return 0.0
    if var == 0.0:
        # Deterministic arrivals and service never wait while stable.
        return _just_above_capacity(lam, m)
    if m == 1:
        return (lam + math.sqrt(lam * lam + 4.0 * lam * var / t)) / 2.0
    lo = lam / m
    # P_cb <= 1 gives W <= var / (M mu - lambda), which meets the target at hi.
    hi = (lam + var / t) / m
    return _smallest_feasible(lambda mu: _ac_wait_unchecked(lam, mu, m, var) - t, lo, hi)


def min_service_rate_for_sojourn(
    target_sojourn: float, arrival_rate: float, servers: int, arrival_scv: float, service_scv: float
) -> float:
    """Smallest per-server rate mu with ``W_AC(mu) + 1/mu <= target_sojourn``.

    With service rate ``mu = c / kappa`` (cap c in cores, kappa CPU-seconds per tuple)
    the smallest cap meeting a latency target on waiting + service is
    ``kappa * min_service_rate_for_sojourn(...)``.
    """
    t, lam, m, var = _check_target_inputs(
        target_sojourn, "target_sojourn", arrival_rate, servers, arrival_scv, service_scv
    )
    lo = max(lam / m, 1.0 / t)
    if lam == 0.0:
        return 1.0 / t
    if var == 0.0:
        # No queueing while stable: only the service time counts.
        return max(1.0 / t, _just_above_capacity(lam, m))
    # Each of the two terms is at most t/2 at hi.
    hi = max((lam + 2.0 * var / t) / m, 2.0 / t)
    return _smallest_feasible(lambda mu: _ac_wait_unchecked(lam, mu, m, var) + 1.0 / mu - t, lo, hi)


# ------------------------------------------------------------------ vectorised versions


def _broadcast(**arrays: np.ndarray | float) -> dict[str, np.ndarray]:
    out = {k: np.asarray(a, dtype=float) for k, a in arrays.items()}
    shapes = np.broadcast_shapes(*(a.shape for a in out.values()))
    out = {k: np.broadcast_to(a, shapes).astype(float) for k, a in out.items()}
    for name, arr in out.items():
        if not np.all(np.isfinite(arr)):
            raise ValueError(f"{name} contains a non-finite value")
    return out


def allen_cunneen_wait_many(
    arrival_rate, service_rate, servers, arrival_scv, service_scv
) -> np.ndarray:
    """Element-wise :func:`allen_cunneen_wait`; ``inf`` where the queue is unstable."""
    a = _broadcast(
        arrival_rate=arrival_rate,
        service_rate=service_rate,
        servers=servers,
        arrival_scv=arrival_scv,
        service_scv=service_scv,
    )
    _check_many(a)
    return _ac_wait_array(
        a["arrival_rate"],
        a["service_rate"],
        a["servers"],
        (a["arrival_scv"] + a["service_scv"]) / 2,
    )


def _check_many(a: dict[str, np.ndarray]) -> None:
    for name in ("arrival_rate", "arrival_scv", "service_scv"):
        if name in a and np.any(a[name] < 0):
            raise ValueError(f"{name} must be >= 0")
    if "service_rate" in a and np.any(a["service_rate"] <= 0):
        raise ValueError("service_rate must be > 0")
    m = a["servers"]
    if np.any(m < 1) or np.any(m != np.floor(m)):
        raise ValueError("servers must be integers >= 1")


def _ac_wait_array(lam, mu, m, var) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        rho = lam / (m * mu)
        pcb = np.where(m == 1, rho, np.where(rho >= 0.7, (rho**m + rho) / 2, rho ** ((m + 1) / 2)))
        w = pcb / (mu * m * (1 - rho)) * var
    return np.where(rho >= 1, np.inf, w)


def allen_cunneen_wait_array(arrival_rate, service_rate, servers, variability) -> np.ndarray:
    """Unchecked array form for inner loops: ``variability = (arrival_scv + service_scv) / 2``, inputs
    already validated by the caller; ``inf`` where the queue is unstable."""
    return _ac_wait_array(arrival_rate, service_rate, servers, variability)


def _bisect_many(excess, lo: np.ndarray, hi: np.ndarray, iterations: int = 200) -> np.ndarray:
    """Geometric bisection on arrays; returns the feasible end of each bracket."""
    lo, hi = lo.copy(), hi.copy()
    for _ in range(iterations):
        if np.all(hi - lo <= hi * RATE_RTOL):
            break
        mid = np.sqrt(lo * hi)
        # Arithmetic midpoint where lo is 0 (geometric mean would stall there).
        mid = np.where(lo > 0, mid, hi / 2)
        ok = excess(mid) <= 0
        hi = np.where(ok, mid, hi)
        lo = np.where(ok, lo, mid)
    return hi


def min_service_rate_many(
    target_wait, arrival_rate, servers, arrival_scv, service_scv
) -> np.ndarray:
    """Element-wise :func:`min_service_rate` for many operators at once."""
    a = _broadcast(
        target_wait=target_wait,
        arrival_rate=arrival_rate,
        servers=servers,
        arrival_scv=arrival_scv,
        service_scv=service_scv,
    )
    _check_many(a)
    if np.any(a["target_wait"] <= 0):
        raise ValueError("target_wait must be > 0")
    lam, m, t = a["arrival_rate"], a["servers"], a["target_wait"]
    var = (a["arrival_scv"] + a["service_scv"]) / 2
    lo = lam / m
    hi = np.maximum((lam + var / t) / m, lo * (1 + STABILITY_MARGIN))
    mu = _bisect_many(lambda x: _ac_wait_array(lam, x, m, var) - t, lo, hi)
    return np.where(lam == 0, 0.0, mu)


def min_service_rate_for_sojourn_many(
    target_sojourn, arrival_rate, servers, arrival_scv, service_scv
) -> np.ndarray:
    """Element-wise :func:`min_service_rate_for_sojourn` for many operators at once."""
    a = _broadcast(
        target_sojourn=target_sojourn,
        arrival_rate=arrival_rate,
        servers=servers,
        arrival_scv=arrival_scv,
        service_scv=service_scv,
    )
    _check_many(a)
    if np.any(a["target_sojourn"] <= 0):
        raise ValueError("target_sojourn must be > 0")
    lam, m, t = a["arrival_rate"], a["servers"], a["target_sojourn"]
    var = (a["arrival_scv"] + a["service_scv"]) / 2
    lo = np.maximum(lam / m, 1 / t)
    hi = np.maximum((lam + 2 * var / t) / m, 2 / t)
    with np.errstate(divide="ignore"):
        return _bisect_many(lambda x: _ac_wait_array(lam, x, m, var) + 1 / x - t, lo, hi)
