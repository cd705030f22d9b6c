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
* :func:`whitt_wait` -- Whitt's GI/G/m interpolation (Whitt, "Approximations for the GI/G/m
  queue", Production and Operations Management 2(2), 1993): ``phi * (ca2 + cs2) / 2 * W(M/M/m)``.
* :func:`ggm_wait` (``"ggm"``, :data:`DEFAULT_WAIT_MODEL`) -- the two-moment formula of
  QNA (Whitt, "The Queueing Network Analyzer", Bell System Technical Journal 62(9), 1983)
  ``(ca2 + cs2) / 2 * W(M/M/m)``, times a correction fitted to simulation whose basis
  extends Kraemer and Langenbach-Belz's light-traffic factor (``(1 - rho) / rho *
  (1 - ca2)^2 / (ca2 + cs2)``) to several servers. Exact for M/M/m and M/G/1; within 8.2 %
  of simulation (median 0.9 %) over rho 0.3--0.95, M 1--8, SCVs 0.25--2 with gamma
  inter-arrival and service times (bench/queueing.py, docs/latency-model.md).
* :func:`sojourn_quantile` / :func:`sojourn_tail` -- quantiles and tail of waiting +
  service: the wait is an atom at 0 plus an exponential fitted to the model's mean and
  probability of waiting (:func:`delay_probability`), convolved in closed form with a
  gamma service time.
* :func:`wait_arrays` / :func:`sojourn_exceedance_many` -- unchecked array forms of the
  mean wait and the sojourn tail for inner loops (the controller's epoch).
* :func:`min_service_rate` / :func:`min_service_rate_for_sojourn` -- the smallest
  per-server rate whose waiting (or waiting + service) time meets a target; the
  ``*_many`` variants solve thousands of operators at once with vectorised bisection;
  both take ``model=`` (default Allen--Cunneen, unchanged).
  :func:`min_service_rate_for_sojourn_quantile` (and ``_many``) do the same for a
  quantile of the sojourn time.

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
from scipy.special import gammainc, gammaincc, gammainccinv, gammaln, hyp1f1

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
    target_wait: float,
    arrival_rate: float,
    servers: int,
    arrival_scv: float,
    service_scv: float,
    *,
    model: str = "allen-cunneen",
) -> float:
    """Smallest per-server rate mu whose Allen--Cunneen waiting time is <= target_wait.

    M = 1 has the closed form ``mu = (lambda + sqrt(lambda^2 + 4 lambda v / t)) / 2``
    with ``v = (arrival_scv + service_scv) / 2``; otherwise the root is bracketed in closed form and
    found with Brent's method to :data:`RATE_RTOL`. Zero arrivals need no capacity: 0.
    Another ``model`` of :data:`WAIT_MODELS` (e.g. :data:`DEFAULT_WAIT_MODEL`) is solved by
    bracketing and Brent's method.
    """
    t, lam, m, var = _check_target_inputs(
        target_wait, "target_wait", arrival_rate, servers, arrival_scv, service_scv
    )
    if model != "allen-cunneen":
        return _min_rate_other_model(model, t, lam, m, arrival_scv, service_scv, sojourn=False)
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
    target_sojourn: float,
    arrival_rate: float,
    servers: int,
    arrival_scv: float,
    service_scv: float,
    *,
    model: str = "allen-cunneen",
) -> float:
    """Smallest per-server rate mu with ``W_AC(mu) + 1/mu <= target_sojourn``.

    With service rate ``mu = c / kappa`` (cap c in cores, kappa CPU-seconds per tuple)
    the smallest cap meeting a latency target on waiting + service is
    ``kappa * min_service_rate_for_sojourn(...)``.
    """
    t, lam, m, var = _check_target_inputs(
        target_sojourn, "target_sojourn", arrival_rate, servers, arrival_scv, service_scv
    )
    if model != "allen-cunneen":
        return _min_rate_other_model(model, t, lam, m, arrival_scv, service_scv, sojourn=True)
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


def _bisect_many(
    excess, lo: np.ndarray, hi: np.ndarray, iterations: int = 200, rtol: float = RATE_RTOL
) -> np.ndarray:
    """Geometric bisection on arrays; returns the feasible end of each bracket."""
    lo, hi = lo.copy(), hi.copy()
    for _ in range(iterations):
        if np.all(hi - lo <= hi * rtol):
            break
        mid = np.sqrt(lo * hi)
        # Arithmetic midpoint where lo is 0 (geometric mean would stall there).
        mid = np.where(lo > 0, mid, hi / 2)
        ok = excess(mid) <= 0
        hi = np.where(ok, mid, hi)
        lo = np.where(ok, lo, mid)
    return hi


def min_service_rate_many(
    target_wait, arrival_rate, servers, arrival_scv, service_scv, *, model: str = "allen-cunneen"
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
    if model != "allen-cunneen":
        return _min_rate_many_other_model(
            model, t, lam, m, a["arrival_scv"], a["service_scv"], sojourn=False
        )
    var = (a["arrival_scv"] + a["service_scv"]) / 2
    lo = lam / m
    hi = np.maximum((lam + var / t) / m, lo * (1 + STABILITY_MARGIN))
    mu = _bisect_many(lambda x: _ac_wait_array(lam, x, m, var) - t, lo, hi)
    return np.where(lam == 0, 0.0, mu)


def min_service_rate_for_sojourn_many(
    target_sojourn, arrival_rate, servers, arrival_scv, service_scv, *, model: str = "allen-cunneen"
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
    if model != "allen-cunneen":
        return _min_rate_many_other_model(
            model, t, lam, m, a["arrival_scv"], a["service_scv"], sojourn=True
        )
    var = (a["arrival_scv"] + a["service_scv"]) / 2
    lo = np.maximum(lam / m, 1 / t)
    hi = np.maximum((lam + 2 * var / t) / m, 2 / t)
    with np.errstate(divide="ignore"):
        return _bisect_many(lambda x: _ac_wait_array(lam, x, m, var) + 1 / x - t, lo, hi)


# ---------------------------------------------------------------- G/G/M: QNA with a fitted correction
#
# All the array helpers below take already validated float arrays (lam >= 0, mu > 0,
# integral m >= 1, scv >= 0) that broadcast together, and return ``inf`` waits where the
# queue is unstable.


def erlang_c_many(offered_load, servers) -> np.ndarray:
    """Element-wise :func:`erlang_c` (probability of waiting in M/M/c); 1 where unstable."""
    a, m = np.broadcast_arrays(np.asarray(offered_load, float), np.asarray(servers, float))
    b = np.ones(a.shape)
    top = int(np.max(m, initial=1))
    for k in range(1, top + 1):
        b = np.where(k <= m, a * b / (k + a * b), b)
    with np.errstate(divide="ignore", invalid="ignore"):
        rho = a / m
        c = b / (1.0 - rho + rho * b)
    return np.where(rho >= 1.0, 1.0, np.where(a > 0, c, 0.0))


def _mmm_wait(lam, mu, m) -> tuple[np.ndarray, np.ndarray]:
    """Exact M/M/m mean wait and probability of waiting (``inf`` / 1 where unstable)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        c = erlang_c_many(lam / mu, m)
    with np.errstate(divide="ignore", invalid="ignore"):
        w = c / (m * mu - lam)
    return np.where(lam >= m * mu, np.inf, w), c


def _whitt_phi(rho, m, ca2, cs2) -> np.ndarray:
    """Whitt's interpolation factor phi(rho, ca2, cs2, m) for GI/G/m (Whitt, "Approximations
    for the GI/G/m queue", Production and Operations Management 1993): between the
    M/D/m (Cosmetatos) and D/M/m corrections of the M/M/m wait, by ca2 and cs2."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        gamma = np.minimum(0.24, (1 - rho) * (m - 1) * (np.sqrt(4 + 5 * m) - 2) / (16 * m * rho))
        phi1 = 1 + gamma
        phi3 = (1 - 4 * gamma) * np.exp(-2 * (1 - rho) / (3 * rho))
        phi4 = np.minimum(1.0, (phi1 + phi3) / 2)
        half = (ca2 + cs2) / 2
        psi = np.where(half >= 1, 1.0, phi4 ** (2 * np.maximum(1 - half, 0.0)))
        above = (4 * (ca2 - cs2) * phi1 + cs2 * psi) / (4 * ca2 - 3 * cs2)
        below = ((cs2 - ca2) * phi3 + (cs2 + 3 * ca2) * psi) / (2 * (ca2 + cs2))
    phi = np.where(ca2 == cs2, psi, np.where(ca2 > cs2, above, below))
    return np.where(rho > 0, phi, 1.0)


def _whitt_arrays(lam, mu, m, ca2, cs2) -> tuple[np.ndarray, np.ndarray]:
    w, c = _mmm_wait(lam, mu, m)
    with np.errstate(invalid="ignore"):
        w = _whitt_phi(lam / (m * mu), m, ca2, cs2) * (ca2 + cs2) / 2 * w
    return w, c


# Correction of the QNA two-moment formula, fitted by least squares on log(simulated /
# QNA) (mean wait) and on logit(simulated) - logit(Erlang C) (probability of waiting) over
# the grid of bench/queueing.py (``FIT_*``, seed 1). Every basis term carries a factor
# that vanishes for Poisson arrivals (ca2 = 1) or for a single server with exponential
# service, so the model stays exact for M/M/m (Erlang C) and M/G/1 (Pollaczek--Khinchine).
# Inputs are clamped to the fitted range before the correction is evaluated.
GGM_FIT_UTILIZATION = (0.25, 1.0)
GGM_FIT_MAX_SERVERS = 8
GGM_FIT_SCV = (0.25, 3.0)

_SCV_TERMS = ("klb", "bursty", "u", "uv", "uu")
_LOAD_TERMS = ("r", "k", "rL", "kL", "kL2", "r2")
_MG_LOAD_TERMS = ("r", "k", "rL", "kL", "kL2")


def ggm_features(rho, m, ca2, cs2) -> np.ndarray:
    """Basis of the fitted correction, shape ``broadcast(...) + (n_terms,)``.

    With ``u = (ca2 - 1) / (ca2 + 1)``, ``v = (cs2 - 1) / (cs2 + 1)``, ``r = 1 - rho``,
    ``k = (1 - rho) / rho`` (the light-traffic variable of Kraemer and Langenbach-Belz)
    and ``L = ln M``: the products of the arrival terms ``(1 - ca2)^2 / (ca2 + cs2)``
    (smooth arrivals only), ``(ca2 - 1) / (ca2 + cs2)`` (bursty arrivals only), ``u``,
    ``u v``, ``u^2`` with the load terms ``r, k, r L, k L, k L^2, r^2``, and the M/G/m
    terms ``v (1 - 1/M)`` times ``r, k, r L, k L, k L^2``.
    """
    lo, hi = GGM_FIT_UTILIZATION
    rho = np.clip(np.asarray(rho, float), lo, hi)
    m = np.minimum(np.asarray(m, float), GGM_FIT_MAX_SERVERS)
    ca2 = np.clip(np.asarray(ca2, float), *GGM_FIT_SCV)
    cs2 = np.clip(np.asarray(cs2, float), *GGM_FIT_SCV)
    u = (ca2 - 1) / (ca2 + 1)
    v = (cs2 - 1) / (cs2 + 1)
    r = 1 - rho
    k = r / rho
    big_l = np.log(m)
    scv = {
        "klb": np.where(ca2 < 1, (1 - ca2) ** 2 / (ca2 + cs2), 0.0),
        "bursty": np.where(ca2 > 1, (ca2 - 1) / (ca2 + cs2), 0.0),
        "u": u,
        "uv": u * v,
        "uu": u * u,
    }
    load = {"r": r, "k": k, "rL": r * big_l, "kL": k * big_l, "kL2": k * big_l**2, "r2": r * r}
    cols = [scv[s] * load[t] for s in _SCV_TERMS for t in _LOAD_TERMS]
    cols += [v * (1 - 1 / m) * load[t] for t in _MG_LOAD_TERMS]
    return np.stack(np.broadcast_arrays(*cols), axis=-1)


#: Least-squares coefficients of :func:`ggm_features` for log(mean wait / QNA) and for
#: logit(P(wait > 0)) - logit(Erlang C); reproduced by ``bench.queueing.fit_ggm``.
GGM_WAIT_COEF = np.array(
    [
        -0.9914610079149454,
        -0.3449832176683009,
        2.1211920809833633,
        -0.29854972622716724,
        -0.6035383077752886,
        1.4484894737080976,
        1.04107159314911,
        0.03616999114487259,
        -1.9478329516013793,
        0.13635420379425703,
        0.5348044704464093,
        -1.71065493570062,
        -0.48296629214646625,
        0.02921445459556849,
        1.4700482300680697,
        0.07954857574272617,
        -0.16249027485737264,
        2.244769327964236,
        0.6422199116509614,
        0.046209990791608535,
        -1.5883587260067935,
        -0.013652997037839752,
        0.31156278288734945,
        -1.816721923640108,
        -0.32965592541035105,
        -0.13062139178490886,
        0.982566870086421,
        -0.19231084516984837,
        -0.07309024451891746,
        1.6603461146609566,
        -0.2287679284170098,
        0.00929473531603948,
        0.045281482480032595,
        0.06015983503384186,
        -0.07792898068640806,
    ]
)
GGM_DELAY_COEF = np.array(
    [
        -2.760053644543333,
        -1.2517104512117778,
        2.826389458931744,
        -0.7598335057330743,
        -0.473583906065751,
        8.145133702171544,
        0.8922132022797146,
        0.11960066908927153,
        -1.736965687539094,
        0.12590053598860768,
        0.479803153146542,
        -1.814472552549812,
        5.320364523692235,
        0.6822938113795087,
        0.3985170930019462,
        0.12889588017713277,
        -0.06457731970298733,
        -7.277424603837194,
        -1.697751387902385,
        -0.25353531132689594,
        -1.4313360049658332,
        0.018906720954680076,
        0.27753851225652826,
        2.551689762531339,
        3.7860774866185167,
        0.5924699943466244,
        0.44779042150321563,
        -0.051602027491426096,
        -0.11292800310150014,
        -6.466964589476262,
        -0.20069947889263953,
        0.06008765837539644,
        0.43632735241245835,
        0.008030030464752785,
        -0.0744492707638895,
    ]
)


def _logit(p):
    with np.errstate(divide="ignore"):
        return np.log(p) - np.log1p(-p)


def _ggm_arrays(lam, mu, m, ca2, cs2) -> tuple[np.ndarray, np.ndarray]:
    """Mean wait and probability of waiting of the ``ggm`` model."""
    w_mmm, c = _mmm_wait(lam, mu, m)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        rho = lam / (m * mu)
        x = ggm_features(np.where(rho > 0, rho, 1.0), m, ca2, cs2)
        w = (ca2 + cs2) / 2 * w_mmm * np.exp(x @ GGM_WAIT_COEF)
        z = _logit(c) + x @ GGM_DELAY_COEF
        p = np.where(c > 0, 1.0 / (1.0 + np.exp(-z)), 0.0)
    stable = rho < 1
    w = np.where(stable, np.where(lam > 0, w, 0.0), np.inf)
    return w, np.where(stable, np.where(lam > 0, p, 0.0), 1.0)


def _ac_arrays(lam, mu, m, ca2, cs2) -> tuple[np.ndarray, np.ndarray]:
    w = _ac_wait_array(lam, mu, m, (ca2 + cs2) / 2)
    with np.errstate(divide="ignore", invalid="ignore"):
        rho = np.minimum(lam / (m * mu), 1.0)
    pcb = np.where(m == 1, rho, np.where(rho >= 0.7, (rho**m + rho) / 2, rho ** ((m + 1) / 2)))
    return w, pcb


def _kingman_arrays(lam, mu, m, ca2, cs2) -> tuple[np.ndarray, np.ndarray]:
    if np.any(m != 1):
        raise ValueError("servers must be 1 for the kingman model")
    return _ac_arrays(lam, mu, m, ca2, cs2)


def _erlang_c_arrays(lam, mu, m, ca2, cs2) -> tuple[np.ndarray, np.ndarray]:
    return _mmm_wait(lam, mu, m)


#: Per model: (mean wait, probability of waiting) on validated arrays.
_MODEL_ARRAYS: dict[str, Callable[..., tuple[np.ndarray, np.ndarray]]] = {
    "allen-cunneen": _ac_arrays,
    "kingman": _kingman_arrays,
    "erlang-c": _erlang_c_arrays,
    "whitt": _whitt_arrays,
    "ggm": _ggm_arrays,
}


# ------------------------------------------------------------------------ models by name

WaitModel = Callable[[float, float, int, float, float], float]


def _check_stable_or_inf(
    arrival_rate: float, service_rate: float, servers: int, arrival_scv: float, service_scv: float
) -> tuple[float, float, int, float, float]:
    lam = v.non_negative(arrival_rate, "arrival_rate")
    mu = v.positive(service_rate, "service_rate")
    m = v.positive_int(servers, "servers")
    return lam, mu, m, _scv(arrival_scv, "arrival_scv"), _scv(service_scv, "service_scv")


def _scalar(fn, *args) -> tuple[float, float]:
    w, p = fn(*(np.asarray(float(a)) for a in args))
    return float(w), float(p)


def whitt_wait(
    arrival_rate: float, service_rate: float, servers: int, arrival_scv: float, service_scv: float
) -> float:
    """Mean waiting time in queue of GI/G/M by Whitt (1993): ``phi * (ca2 + cs2) / 2 *
    W(M/M/M)`` (seconds); ``inf`` when the queue is unstable."""
    return _scalar(
        _whitt_arrays,
        *_check_stable_or_inf(arrival_rate, service_rate, servers, arrival_scv, service_scv),
    )[0]


def ggm_wait(
    arrival_rate: float, service_rate: float, servers: int, arrival_scv: float, service_scv: float
) -> float:
    """Mean waiting time in queue of GI/G/M by the ``ggm`` model (seconds): the QNA
    two-moment formula ``(ca2 + cs2) / 2 * W(M/M/M)`` times the fitted correction
    ``exp(ggm_features . GGM_WAIT_COEF)``; ``inf`` when the queue is unstable."""
    return _scalar(
        _ggm_arrays,
        *_check_stable_or_inf(arrival_rate, service_rate, servers, arrival_scv, service_scv),
    )[0]


def _kingman_model(lam: float, mu: float, m: int, arrival_scv: float, service_scv: float) -> float:
    if m != 1:
        raise ValueError(f"servers must be 1 for the kingman model, got {m}")
    return kingman_wait(lam, mu, arrival_scv, service_scv)


def _erlang_c_model(lam: float, mu: float, m: int, arrival_scv: float, service_scv: float) -> float:
    return erlang_c_wait(lam, mu, m)


#: Waiting-time models by name, all with the signature of :func:`allen_cunneen_wait`.
WAIT_MODELS: dict[str, WaitModel] = {
    "allen-cunneen": allen_cunneen_wait,
    "kingman": _kingman_model,
    "erlang-c": _erlang_c_model,
    "whitt": whitt_wait,
    "ggm": ggm_wait,
}

#: The model the controller uses unless configured otherwise.
DEFAULT_WAIT_MODEL = "ggm"


def _model_arrays(model: str) -> Callable[..., tuple[np.ndarray, np.ndarray]]:
    try:
        return _MODEL_ARRAYS[model]
    except (KeyError, TypeError):
        raise ValueError(
            f"unknown queueing model {model!r}; known models: {', '.join(sorted(WAIT_MODELS))}"
        ) from None


def waiting_time(
    model: str,
    arrival_rate: float,
    service_rate: float,
    servers: int,
    arrival_scv=1.0,
    service_scv=1.0,
) -> float:
    """Mean waiting time in queue by the model named ``model`` (see :data:`WAIT_MODELS`)."""
    _model_arrays(model)
    return WAIT_MODELS[model](arrival_rate, service_rate, servers, arrival_scv, service_scv)


def _checked_arrays(**arrays) -> dict[str, np.ndarray]:
    a = _broadcast(**arrays)
    _check_many(a)
    return a


def waiting_time_many(
    model: str, arrival_rate, service_rate, servers, arrival_scv=1.0, service_scv=1.0
) -> np.ndarray:
    """Element-wise :func:`waiting_time` on broadcast arrays; ``inf`` where unstable."""
    fn = _model_arrays(model)
    a = _checked_arrays(
        arrival_rate=arrival_rate,
        service_rate=service_rate,
        servers=servers,
        arrival_scv=arrival_scv,
        service_scv=service_scv,
    )
    return fn(*a.values())[0]


def ggm_wait_many(arrival_rate, service_rate, servers, arrival_scv, service_scv) -> np.ndarray:
    """Element-wise :func:`ggm_wait`; ``inf`` where the queue is unstable."""
    return waiting_time_many("ggm", arrival_rate, service_rate, servers, arrival_scv, service_scv)


def delay_probability(
    model: str, arrival_rate, service_rate, servers, arrival_scv=1.0, service_scv=1.0
) -> np.ndarray | float:
    """Probability that an arrival waits, P(W > 0), as the model named ``model`` sees it:
    Allen--Cunneen's P_cb (``rho`` for Kingman), Erlang C for ``erlang-c`` and ``whitt``,
    the fitted logit correction of Erlang C for ``ggm``. Scalars in, float out."""
    fn = _model_arrays(model)
    a = _checked_arrays(
        arrival_rate=arrival_rate,
        service_rate=service_rate,
        servers=servers,
        arrival_scv=arrival_scv,
        service_scv=service_scv,
    )
    p = fn(*a.values())[1]
    return float(p) if p.ndim == 0 else p


# ------------------------------------------------------------------- sojourn-time tails
#
# Sojourn T = W + S. W is 0 with probability 1 - p and otherwise exponential with mean
# d = E[W] / p (exact for GI/M/m, and the heavy-traffic limit of GI/G/m; the exponential
# conditional delay is QNA's convention, Whitt, "The Queueing Network Analyzer", Bell
# System Technical Journal 1983); S is gamma with mean 1/mu, SCV cs2 (shape k = 1/cs2,
# scale s = cs2/mu), independent of W. Then
#     P(T > t) = (1 - p) Gbar(t) + p [Gbar(t) + exp(-t/d) E[exp(S/d); S <= t]],
# and with c = 1/d - 1/s the truncated moment generating function has closed forms:
#     c < 0:  exp(-t/d) (1 - s/d)^-k P(k, -c t)      (P: regularized lower incomplete gamma)
#     c >= 0: exp(-t/s) (t/s)^k / Gamma(k + 1) 1F1(1; k + 1; -c t)   (Kummer's function)
# the second from int_0^1 v^(k-1) exp(-a (1 - v)) dv = 1F1(1; k + 1; -a) / k.

#: Service SCVs below this are treated as deterministic service.
_DETERMINISTIC_SCV = 1e-9


def _service_tail(x, cs2) -> np.ndarray:
    """P(S > x / mu) for S gamma with mean 1/mu and SCV cs2 (x in units of 1/mu)."""
    det = cs2 < _DETERMINISTIC_SCV
    k = 1.0 / np.where(det, 1.0, cs2)
    g = gammaincc(k, np.maximum(x, 0.0) * k)
    return np.where(det, (x < 1.0).astype(float), g)


def _service_isf(y, cs2) -> np.ndarray:
    """x with P(S > x / mu) = y (x in units of 1/mu)."""
    det = cs2 < _DETERMINISTIC_SCV
    c = np.where(det, 1.0, cs2)
    return np.where(det, 1.0, gammainccinv(1.0 / c, y) * c)


def _sojourn_tail_units(x, p, d, cs2) -> np.ndarray:
    """P(T > x / mu); x, d (mean delay given a wait) in units of 1/mu."""
    x, p, d, cs2 = np.broadcast_arrays(*(np.asarray(a, float) for a in (x, p, d, cs2)))
    g = _service_tail(x, cs2)
    det = cs2 < _DETERMINISTIC_SCV
    s = np.where(det, 1.0, cs2)
    k = 1.0 / s
    xp = np.maximum(x, 0.0)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore", under="ignore"):
        dd = np.where(d > 0, d, 1.0)
        c = 1.0 / dd - 1.0 / s
        slow = np.exp(-xp / dd - k * np.log1p(-s / dd)) * gammainc(k, -c * xp)
        log_front = -xp / s + k * np.log(xp / s) - gammaln(k + 1.0)
        fast = np.where(xp > 0, np.exp(log_front) * hyp1f1(1.0, k + 1.0, -c * xp), 0.0)
        extra = np.where(c < 0, slow, fast)
        deterministic = np.minimum(1.0, np.exp(-(xp - 1.0) / dd))
    # With nearly deterministic service (a huge gamma shape) the closed forms can
    # overflow into inf * 0; the deterministic-service tail is their limit there.
    near_det = det | ~np.isfinite(extra)
    delayed = np.where(near_det, deterministic, np.minimum(1.0, g + extra))
    delayed = np.where(d > 0, delayed, g)
    # Where nobody waits the delayed branch is unused (and may be NaN for nearly
    # deterministic service, whose gamma shape overflows the closed forms).
    return (1.0 - p) * g + np.where(p > 0, p * delayed, 0.0)


def _wait_units(fn, lam, mu, m, ca2, cs2) -> tuple[np.ndarray, np.ndarray]:
    """(p, d): probability of waiting and mean delay given a wait, d in units of 1/mu."""
    w, p = fn(lam, mu, m, ca2, cs2)
    with np.errstate(divide="ignore", invalid="ignore"):
        d = np.where((p > 0) & (w > 0), w * mu / p, 0.0)
    p = np.where(d > 0, p, 0.0)
    return p, d


def _check_quantile(q) -> np.ndarray:
    arr = np.asarray(q, dtype=float)
    if not np.all((arr > 0) & (arr < 1)):
        raise ValueError(f"q must be in the open interval (0, 1), got {q!r}")
    return arr


def sojourn_tail(
    model: str,
    t,
    arrival_rate,
    service_rate,
    servers,
    arrival_scv=1.0,
    service_scv=1.0,
) -> np.ndarray | float:
    """P(waiting + service > t) under the model named ``model`` (see the comment above
    :func:`sojourn_quantile`); 1 where the queue is unstable. Broadcasts over arrays."""
    fn = _model_arrays(model)
    a = _checked_arrays(
        t=t,
        arrival_rate=arrival_rate,
        service_rate=service_rate,
        servers=servers,
        arrival_scv=arrival_scv,
        service_scv=service_scv,
    )
    if np.any(a["t"] < 0):
        raise ValueError("t must be >= 0")
    lam, mu, m, ca2, cs2 = (
        a[k] for k in ("arrival_rate", "service_rate", "servers", "arrival_scv", "service_scv")
    )
    p, d = _wait_units(fn, lam, mu, m, ca2, cs2)
    out = np.where(np.isinf(d), 1.0, _sojourn_tail_units(a["t"] * mu, p, d, cs2))
    return float(out) if out.ndim == 0 else out


def wait_arrays(model: str, lam, mu, m, ca2, cs2) -> tuple[np.ndarray, np.ndarray]:
    """Unchecked array form for inner loops: (mean wait, probability of waiting) by the
    model named ``model`` on float arrays the caller has validated (``lam >= 0``,
    ``mu > 0``, integral ``m >= 1``, SCVs ``>= 0``); ``inf`` / 1 where unstable."""
    return _model_arrays(model)(lam, mu, m, ca2, cs2)


def sojourn_exceedance_many(model: str, t, lam, mu, m, ca2, cs2) -> np.ndarray:
    """Unchecked array form of :func:`sojourn_tail` for inner loops: P(waiting +
    service > t) per element, on validated float arrays that broadcast together
    (``t >= 0``; the rest as :func:`wait_arrays`); 1 where the queue is unstable."""
    p, d = _wait_units(_model_arrays(model), lam, mu, m, ca2, cs2)
    unstable = np.isinf(d)
    tail = _sojourn_tail_units(t * mu, p, np.where(unstable, 0.0, d), cs2)
    return np.where(unstable, 1.0, tail)


def _quantile_bracket(q, p, d, cs2) -> tuple[np.ndarray, np.ndarray]:
    """x bracketing the q-quantile of T (units of 1/mu): T >= S, and
    P(S + D > a + b) <= P(S > a) + P(D > b)."""
    tail = 1.0 - q
    lo = _service_isf(tail, cs2)
    with np.errstate(divide="ignore"):
        hi = _service_isf(tail / 2.0, cs2) + d * np.log(2.0 / tail)
    return lo, np.maximum(hi, lo)


def sojourn_quantile(
    model: str,
    q: float,
    arrival_rate: float,
    service_rate: float,
    servers: int,
    arrival_scv: float = 1.0,
    service_scv: float = 1.0,
) -> float:
    """The q-quantile of the sojourn time (waiting + service, seconds) of GI/G/M.

    The wait is an atom at 0 of mass ``1 - p`` plus an exponential of mean ``E[W] / p``
    with ``E[W]`` and ``p = P(W > 0)`` from the model named ``model``
    (:func:`delay_probability`); service is gamma with the given SCV, independent of the
    wait. ``inf`` when the queue is unstable.
    """
    fn = _model_arrays(model)
    q = v.finite(q, "q")
    _check_quantile(q)
    lam, mu, m, ca2, cs2 = _check_stable_or_inf(
        arrival_rate, service_rate, servers, arrival_scv, service_scv
    )
    p, d = _wait_units(fn, *(np.asarray(float(x)) for x in (lam, mu, m, ca2, cs2)))
    if not math.isfinite(float(d)):
        return math.inf
    lo, hi = (float(x) for x in _quantile_bracket(q, p, d, cs2))

    def excess(x: float) -> float:
        return float(_sojourn_tail_units(x, p, d, cs2)) - (1.0 - q)

    if hi <= lo or excess(lo) <= 0:
        return lo / mu
    while excess(hi) > 0:  # only through quadrature rounding
        hi *= 1.0 + 1e-6
    return brentq(excess, lo, hi, xtol=1e-14 * hi, rtol=1e-12, maxiter=200) / mu


def sojourn_quantile_many(
    model: str, q, arrival_rate, service_rate, servers, arrival_scv=1.0, service_scv=1.0
) -> np.ndarray:
    """Element-wise :func:`sojourn_quantile` by vectorised bisection; ``inf`` where unstable."""
    fn = _model_arrays(model)
    a = _checked_arrays(
        q=q,
        arrival_rate=arrival_rate,
        service_rate=service_rate,
        servers=servers,
        arrival_scv=arrival_scv,
        service_scv=service_scv,
    )
    qq = _check_quantile(a["q"])
    lam, mu, m, ca2, cs2 = (
        a[k] for k in ("arrival_rate", "service_rate", "servers", "arrival_scv", "service_scv")
    )
    p, d = _wait_units(fn, lam, mu, m, ca2, cs2)
    unstable = np.isinf(d)
    d = np.where(unstable, 0.0, d)
    lo, hi = _quantile_bracket(qq, p, d, cs2)
    for _ in range(200):
        if np.all(hi - lo <= 1e-12 * hi):
            break
        mid = (lo + hi) / 2.0
        ok = _sojourn_tail_units(mid, p, d, cs2) <= 1.0 - qq
        hi = np.where(ok, mid, hi)
        lo = np.where(ok, lo, mid)
    return np.where(unstable, np.inf, hi / mu)


# -------------------------------------------------------- minimal rates for any model


def _generic_min_rate(excess_of_mu, lo: float, hi: float) -> float:
    """Smallest mu in [lo, ...) with excess <= 0 for an excess decreasing in mu."""
    if excess_of_mu(lo) <= 0:
        return lo
    for _ in range(2000):
        if excess_of_mu(hi) <= 0:
            break
        lo, hi = hi, hi * 2.0
    return _smallest_feasible(excess_of_mu, lo, hi)


def min_service_rate_for_sojourn_quantile(
    q: float,
    target_sojourn: float,
    arrival_rate: float,
    servers: int,
    arrival_scv: float = 1.0,
    service_scv: float = 1.0,
    *,
    model: str = DEFAULT_WAIT_MODEL,
) -> float:
    """Smallest per-server rate mu whose q-quantile of sojourn (waiting + service) is <=
    ``target_sojourn`` under ``model``: the root of ``P(T > target) = 1 - q`` in mu."""
    fn = _model_arrays(model)
    q = v.finite(q, "q")
    _check_quantile(q)
    t, lam, m, _ = _check_target_inputs(
        target_sojourn, "target_sojourn", arrival_rate, servers, arrival_scv, service_scv
    )
    ca2, cs2 = float(arrival_scv), float(service_scv)
    floor = float(_service_isf(1.0 - q, np.asarray(cs2))) / t  # T >= S

    def excess(mu: float) -> float:
        args = (np.asarray(x) for x in (lam, mu, float(m), ca2, cs2))
        p, d = _wait_units(fn, *args)
        if not math.isfinite(float(d)):
            return math.inf
        return float(_sojourn_tail_units(t * mu, p, d, cs2)) - (1.0 - q)

    lo = max(floor, _just_above_capacity(lam, m)) if lam > 0 else floor
    return _generic_min_rate(excess, lo, 2.0 * lo + 1.0 / t)


def min_service_rate_for_sojourn_quantile_many(
    q,
    target_sojourn,
    arrival_rate,
    servers,
    arrival_scv=1.0,
    service_scv=1.0,
    *,
    model: str = DEFAULT_WAIT_MODEL,
    rtol: float = RATE_RTOL,
) -> np.ndarray:
    """Element-wise :func:`min_service_rate_for_sojourn_quantile` (vectorised bisection).

    ``rtol`` is the relative width at which the search stops; the rate returned is
    always the feasible end of the bracket, so a coarser ``rtol`` (fewer tail
    evaluations) can only overstate the minimal rate, by at most that share."""
    fn = _model_arrays(model)
    a = _checked_arrays(
        q=q,
        target_sojourn=target_sojourn,
        arrival_rate=arrival_rate,
        servers=servers,
        arrival_scv=arrival_scv,
        service_scv=service_scv,
    )
    qq = _check_quantile(a["q"])
    if np.any(a["target_sojourn"] <= 0):
        raise ValueError("target_sojourn must be > 0")
    lam, m, t = a["arrival_rate"], a["servers"], a["target_sojourn"]
    ca2, cs2 = a["arrival_scv"], a["service_scv"]

    def excess(mu: np.ndarray) -> np.ndarray:
        p, d = _wait_units(fn, lam, mu, m, ca2, cs2)
        finite = np.isfinite(d)
        tail = _sojourn_tail_units(t * mu, p, np.where(finite, d, 0.0), cs2)
        return np.where(finite, tail - (1.0 - qq), np.inf)

    if not 0 < rtol < 1:
        raise ValueError(f"rtol must be in (0, 1), got {rtol!r}")
    return _min_rate_many(excess, _service_isf(1.0 - qq, cs2) / t, lam, m, t, rtol)


def _min_rate_many(excess, floor: np.ndarray, lam, m, t, rtol: float = RATE_RTOL) -> np.ndarray:
    lo = np.where(lam > 0, np.maximum(floor, lam / m * (1 + STABILITY_MARGIN)), floor)
    lo = np.maximum(lo, 1e-300)
    done = excess(lo) <= 0
    hi = 2.0 * lo + 1.0 / t
    for _ in range(2000):
        bad = ~done & (excess(hi) > 0)
        if not np.any(bad):
            break
        lo = np.where(bad, hi, lo)
        hi = np.where(bad, hi * 2.0, hi)
    mu = _bisect_many(excess, lo, hi, rtol=rtol)
    return np.where(done, lo, mu)


def _model_scalar_wait(fn, lam: float, mu: float, m: int, ca2: float, cs2: float) -> float:
    return float(fn(*(np.asarray(float(x)) for x in (lam, mu, m, ca2, cs2)))[0])


def _min_rate_other_model(
    model: str, target: float, lam: float, m: int, ca2: float, cs2: float, sojourn: bool
) -> float:
    fn = _model_arrays(model)
    service = 1.0 if sojourn else 0.0

    def excess(mu: float) -> float:
        return _model_scalar_wait(fn, lam, mu, m, ca2, cs2) + service / mu - target

    floor = service / target
    if lam == 0.0:
        return floor
    lo = max(floor, _just_above_capacity(lam, m))
    return _generic_min_rate(excess, lo, 2.0 * lo + 1.0 / target)


def _min_rate_many_other_model(model: str, t, lam, m, ca2, cs2, sojourn: bool) -> np.ndarray:
    fn = _model_arrays(model)
    service = 1.0 if sojourn else 0.0

    def excess(mu: np.ndarray) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            return fn(lam, mu, m, ca2, cs2)[0] + service / mu - t

    floor = np.full(np.shape(t), service) / t
    mu = _min_rate_many(excess, floor, lam, m, t)
    return np.where(lam == 0, floor, mu)
