"""Stage 3 of the epoch: the CPU each instance needs.

Estimators are built by wrapping a small one, never by adding flags:
``RateDemand`` gives r_j = psi_j * kappa_j / T_j (Liu et al., "An Adaptive
Online Scheme for Scheduling and Resource Enforcement in Storm", demand per
instance); wrappers raise it for a latency target, a backlog to drain, a floor.

Latency-targeted demand ("QoS-aware CPU cap adjustment for timely data-flow",
G/G/M latency):

An application's latency target is split over its operators in proportion to
their CPU cost per tuple along the heaviest (critical) path through each
operator: ``budget_j = target * kappa_j / sum of kappa on the heaviest
source-to-sink path through j``. On the critical path itself the budgets add up
to the target exactly. :class:`WithLatencyTarget` then raises each instance's
demand to the smallest cap (service rate per instance ``mu = cap / kappa``) whose
waiting + service time meets the operator's budget under the configured queueing
model (``latency_model``, :data:`predict.queueing.WAIT_MODELS`): its ``1 -
max_violation_ratio`` quantile (the ``quantile`` criterion) or its mean (``mean``,
the seed paper's, with Allen–Cunneen there). Arrivals are the rate demand is sized
for, the class's forecast quantile (:func:`controller.stages.forecast.size_forecasts`).
The wrapped estimator's demand (the rate demand psi * kappa / T) stays the floor,
and the usual composition adds the backlog drain and the minimum cap around it:

    WithFloor(WithBacklogDrain(WithLatencyTarget(RateDemand(), needs), ...), ...)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from itertools import chain, repeat
from typing import NamedTuple, Protocol

import numpy as np

from controller.stages.columns import tuples, values_in_order
from controller.stages.evaluate import OperatorView
from controller.stages.forecast import OperatorForecast
from dsched.dag import topological_order
from dsched.ids import InstanceKey, OperatorKey
from predict.queueing import (
    min_service_rate_for_sojourn_many,
    min_service_rate_for_sojourn_quantile_many,
    sojourn_exceedance_many,
    wait_arrays,
)


class InstanceDemand(NamedTuple):
    """One instance's CPU demand (a NamedTuple: an epoch makes one per instance
    per estimator layer, and tuples are built several times faster)."""

    key: InstanceKey
    node: str
    cores: float
    reason: str  # the term that set it: "rate", "backlog", "floor", "latency", ...
    # The part of ``cores`` that drains the instance's queue (WithBacklogDrain).
    backlog_cores: float = 0.0


class DemandEstimator(Protocol):
    """Per-instance CPU demand. Build richer estimators by wrapping a small one."""

    def estimate(
        self, view: OperatorView, fc: OperatorForecast
    ) -> dict[InstanceKey, InstanceDemand]: ...


@dataclass
class RateDemand:
    """r_j = psi_j * kappa_j / T_j: the CPU to process the predicted arrivals,
    spread over the instances by their share of the operator's arrivals
    (:meth:`OperatorView.load_weight`; evenly when nothing arrived)."""

    def estimate(
        self, view: OperatorView, fc: OperatorForecast
    ) -> dict[InstanceKey, InstanceDemand]:
        per = fc.demand_rate * fc.kappa / max(1, len(view.instances))
        return {
            k: InstanceDemand(k, view.nodes[k], per * view.load_weight(k), "rate")
            for k in view.instances
        }


@dataclass
class WithBacklogDrain:
    """Add the CPU that empties an instance's queue within ``drain_seconds``."""

    inner: DemandEstimator
    drain_seconds: float

    def estimate(
        self, view: OperatorView, fc: OperatorForecast
    ) -> dict[InstanceKey, InstanceDemand]:
        base = self.inner.estimate(view, fc)
        out = {}
        for k, d in base.items():
            extra = view.queue_by_instance.get(k, 0.0) * fc.kappa / self.drain_seconds
            out[k] = InstanceDemand(
                k,
                d.node,
                d.cores + extra,
                "backlog" if extra > d.cores else d.reason,
                d.backlog_cores + extra,
            )
        return out


@dataclass
class WithFloor:
    """Never below ``floor_cores``: an idle instance must still be able to start."""

    inner: DemandEstimator
    floor_cores: float

    def estimate(
        self, view: OperatorView, fc: OperatorForecast
    ) -> dict[InstanceKey, InstanceDemand]:
        return {
            k: d
            if d.cores >= self.floor_cores
            else InstanceDemand(k, d.node, self.floor_cores, "floor", d.backlog_cores)
            for k, d in self.inner.estimate(view, fc).items()
        }


# Reason codes of instance_demands, in the order the layers apply them.
_REASONS = ("rate", "latency", "latency-unreachable", "backlog", "floor")
_RATE, _LATENCY, _UNREACHABLE, _BACKLOG, _FLOOR = range(len(_REASONS))


def instance_demands(
    views: Mapping[OperatorKey, OperatorView],
    forecasts: Mapping[OperatorKey, OperatorForecast],
    needs: Mapping[OperatorKey, float] | None,
    max_instance_cores: float,
    drain_seconds: float,
    floor_cores: float,
    kappa_factor: Mapping[InstanceKey, float] | None = None,
    drain_scale: Mapping[str, float] | None = None,
) -> dict[InstanceKey, InstanceDemand]:
    """Every instance's demand from ``WithFloor(WithBacklogDrain(WithLatencyTarget(
    RateDemand(), needs, max_instance_cores), drain_seconds), floor_cores)`` (without
    the latency layer when ``needs`` is None), over all instances at once.

    Each layer's arithmetic and comparisons are the estimators' own, in the same
    order, on arrays instead of one instance at a time, so demands and reasons
    are the same to the bit (tests/test_epoch_vectorised.py checks it); the
    estimators stay the readable definition.

    ``kappa_factor`` (instance -> factor, 1 where missing) scales an instance's
    CPU per tuple, and so every layer's cores, from its operator's: the
    interference correction of an instance on a node whose memory bandwidth
    saturates (:mod:`controller.stages.interference`).

    ``drain_scale`` (app -> factor, 1 where missing) shortens an application's
    drain span: the latency feedback's gain (:mod:`controller.stages.feedback`).
    """
    ops = list(views.values())
    if not ops:
        return {}
    counts = np.fromiter((len(v.instances) for v in ops), int, len(ops))
    rate = np.fromiter((forecasts[v.key].demand_rate for v in ops), float, len(ops))
    kappa = np.fromiter((forecasts[v.key].kappa for v in ops), float, len(ops))
    keys = [k for v in ops for k in v.instances]
    nodes = [n for v in ops for n in map(v.nodes.__getitem__, v.instances)]
    queue = np.fromiter(
        chain.from_iterable(map(v.queue_by_instance.get, v.instances, repeat(0.0)) for v in ops),
        float,
        len(keys),
    )
    # RateDemand: psi * kappa / T, spread by each instance's share of the arrivals.
    load = np.fromiter(
        chain.from_iterable(map(v.load_weight, v.instances) for v in ops), float, len(keys)
    )
    cores = np.repeat(rate * kappa / np.maximum(1, counts), counts) * load
    factor = (
        np.fromiter(map(kappa_factor.get, keys, repeat(1.0)), float, len(keys))
        if kappa_factor
        else None
    )
    if factor is not None:
        cores = cores * factor
    reason = np.full(len(keys), _RATE)
    if needs is not None:
        has = np.repeat(np.fromiter((v.key in needs for v in ops), bool, len(ops)), counts)
        need = np.repeat(np.fromiter((needs.get(v.key, 0.0) for v in ops), float, len(ops)), counts)
        need = need * load
        if factor is not None:
            # The need is a service rate times kappa: each instance's own kappa.
            need = need * factor
        why = np.where(need > max_instance_cores, _UNREACHABLE, _LATENCY)
        need = np.where(need > max_instance_cores, max_instance_cores, need)
        raise_ = has & ~(cores >= need)
        cores = np.where(raise_, need, cores)
        reason = np.where(raise_, why, reason)
    inst_kappa = np.repeat(kappa, counts)
    if factor is not None:
        inst_kappa = inst_kappa * factor
    span = drain_seconds
    if drain_scale:
        scale = np.fromiter((drain_scale.get(v.key.app, 1.0) for v in ops), float, len(ops))
        span = drain_seconds * np.repeat(scale, counts)
    extra = queue * inst_kappa / span
    reason = np.where(extra > cores, _BACKLOG, reason)
    cores = cores + extra
    low = ~(cores >= floor_cores)
    cores = np.where(low, floor_cores, cores)
    reason = np.where(low, _FLOOR, reason)
    reasons = list(map(_REASONS.__getitem__, reason.tolist()))
    return dict(
        zip(
            keys,
            tuples(InstanceDemand, keys, nodes, cores.tolist(), reasons, extra.tolist()),
            strict=True,
        )
    )


# An instance that is one thread cannot use more than one core, so a cap above
# it buys no latency (config key ``max_instance_cores`` for instances that run
# several working threads).
MAX_INSTANCE_CORES = 1.0


def critical_path_weights(
    parents: Mapping[str, tuple[str, ...]], cost: Mapping[str, float]
) -> dict[str, float]:
    """Per operator: total cost of the heaviest source-to-sink path through it."""
    order = topological_order(parents)
    children: dict[str, list[str]] = {op: [] for op in order}
    for op in order:
        for p in parents.get(op, ()):
            if p in children:
                children[p].append(op)
    up: dict[str, float] = {}
    for op in order:
        ps = [p for p in parents.get(op, ()) if p in up]
        up[op] = cost[op] + max((up[p] for p in ps), default=0.0)
    down: dict[str, float] = {}
    for op in reversed(order):
        down[op] = cost[op] + max((down[c] for c in children[op]), default=0.0)
    return {op: up[op] + down[op] - cost[op] for op in order}


def latency_budgets(
    views: Mapping[OperatorKey, OperatorView],
    forecasts: Mapping[OperatorKey, OperatorForecast],
    targets_seconds: Mapping[str, float],
) -> dict[OperatorKey, float]:
    """Each operator's share (seconds) of its application's latency target."""
    out: dict[OperatorKey, float] = {}
    for app, keys in _keys_by_app(views).items():
        target = targets_seconds.get(app)
        if target is None:
            continue
        kappa = {k.operator: max(forecasts[k].kappa, 0.0) for k in keys}
        top = max(kappa.values(), default=0.0)
        # An operator with no measured cost still takes a sliver of the target.
        cost = {op: (max(c, 1e-3 * top) if top > 0 else 1.0) for op, c in kappa.items()}
        known = set(kappa)
        parents = {k.operator: tuple(p for p in views[k].upstream if p in known) for k in keys}
        through = critical_path_weights(parents, cost)
        for k in keys:
            out[k] = target * cost[k.operator] / through[k.operator]
    return out


#: Relative accuracy of the service rates solved for sojourn quantiles: caps are
#: quantized to theta_cores anyway, and the rate returned is the feasible end of the
#: search, so a coarse tolerance only overstates a need, by at most this share.
QUANTILE_RATE_RTOL = 1e-4


#: C² as the latency functions take it: one value for every operator, or each
#: operator's own (:func:`controller.stages.variability.measure_variability`).
Scv = float | Mapping[OperatorKey, float]


def scv_column(value: Scv, keys: list[OperatorKey]) -> float | np.ndarray:
    """``value`` for ``keys`` in order: the scalar itself (the vectorised paths
    broadcast it), or an array of each operator's value (1, the
    Poisson value, for an operator the mapping lacks)."""
    if isinstance(value, Mapping):
        return np.fromiter((value.get(k, 1.0) for k in keys), float, len(keys))
    return value


def latency_needs(
    views: Mapping[OperatorKey, OperatorView],
    forecasts: Mapping[OperatorKey, OperatorForecast],
    budgets: Mapping[OperatorKey, float],
    arrival_scv: Scv = 1.0,
    service_scv: Scv = 1.0,
    *,
    model: str = "allen-cunneen",
    quantiles: Mapping[str, float] | None = None,
) -> dict[OperatorKey, float]:
    """Per operator, the smallest per-instance cap meeting its latency budget,
    solved for all operators at once (vectorized bisection).

    With ``quantiles`` (app -> the sojourn quantile its class needs, 1 -
    max_violation_ratio) the budget bounds that quantile of waiting + service time
    under ``model`` (``min_service_rate_for_sojourn_quantile_many``); without, it
    bounds the mean (the seed paper's criterion). Arrivals are the rate demand is
    sized for (:attr:`OperatorForecast.demand_rate`)."""
    keys = [
        k
        for k in views
        if k in budgets
        and forecasts[k].kappa > 0
        and forecasts[k].demand_rate > 0
        and views[k].instances
        and (quantiles is None or k.app in quantiles)
    ]
    if not keys:
        return {}
    return cores_for_budgets(
        keys,
        np.array([budgets[k] for k in keys]),
        np.array([forecasts[k].demand_rate for k in keys]),
        np.array([len(views[k].instances) for k in keys], dtype=float),
        np.array([forecasts[k].kappa for k in keys]),
        arrival_scv,
        service_scv,
        model=model,
        quantiles=quantiles,
    )


def cores_for_budgets(
    keys: list[OperatorKey],
    target: np.ndarray,
    lam: np.ndarray,
    servers: np.ndarray,
    kappa: np.ndarray,
    arrival_scv: Scv,
    service_scv: Scv,
    *,
    model: str,
    quantiles: Mapping[str, float] | None,
) -> dict[OperatorKey, float]:
    """Per operator: the cores per instance at which ``servers`` instances keep the
    sojourn time within ``target`` at arrival rate ``lam`` (its mean, or with
    ``quantiles`` the app's sojourn quantile), ``kappa`` CPU-seconds a tuple."""
    arrival_scv, service_scv = scv_column(arrival_scv, keys), scv_column(service_scv, keys)
    if quantiles is None:
        mu = min_service_rate_for_sojourn_many(
            target, lam, servers, arrival_scv, service_scv, model=model
        )
    else:
        mu = min_service_rate_for_sojourn_quantile_many(
            np.array([quantiles[k.app] for k in keys]),
            target,
            lam,
            servers,
            arrival_scv,
            service_scv,
            model=model,
            rtol=QUANTILE_RATE_RTOL,
        )
    return dict(zip(keys, (mu * kappa).tolist(), strict=True))


@dataclass
class WithLatencyTarget:
    """Raise demand to the smallest cap that meets the operator's latency budget
    (``needs`` from :func:`latency_needs`, per-instance cores by operator, for an
    even share of the arrivals), times the instance's arrivals over an even
    share's (:meth:`OperatorView.load_weight`)."""

    inner: DemandEstimator
    needs: Mapping[OperatorKey, float]
    max_instance_cores: float = MAX_INSTANCE_CORES

    def estimate(
        self, view: OperatorView, fc: OperatorForecast
    ) -> dict[InstanceKey, InstanceDemand]:
        base = self.inner.estimate(view, fc)
        need = self.needs.get(view.key)
        if need is None:
            return base
        out = {}
        for k, d in base.items():
            # An instance with more than an even share of the arrivals needs
            # that much more, at the same utilisation as the even split.
            mine, reason = need * view.load_weight(k), "latency"
            if mine > self.max_instance_cores:
                mine, reason = self.max_instance_cores, "latency-unreachable"
            out[k] = d if d.cores >= mine else InstanceDemand(k, d.node, mine, reason)
        return out


def _keys_by_app(views: Mapping[OperatorKey, OperatorView]) -> dict[str, list[OperatorKey]]:
    by_app: dict[str, list[OperatorKey]] = {}
    for key in views:
        by_app.setdefault(key.app, []).append(key)
    return by_app


def _operators_by_app(views: Mapping[OperatorKey, OperatorView]) -> dict[str, list[OperatorKey]]:
    """Each application's operators in topological order."""
    out = {}
    for app, keys in _keys_by_app(views).items():
        names = topological_order({k.operator: views[k].upstream for k in keys})
        out[app] = [OperatorKey(app, n) for n in names]
    return out


def _latency_model(
    views: Mapping[OperatorKey, OperatorView],
    forecasts: Mapping[OperatorKey, OperatorForecast],
    ordered: list[OperatorKey],
    share: np.ndarray,
    floor_cores: np.ndarray,
    arrival_scv: Scv,
    service_scv: Scv,
    model: str = "allen-cunneen",
    budgets: Mapping[OperatorKey, float] | None = None,
    sized: bool = False,
):
    from controller.stages.allocation import AppLatencyModel

    index = {k.operator: i for i, k in enumerate(ordered)}
    rate = (lambda k: forecasts[k].demand_rate) if sized else (lambda k: forecasts[k].rate)
    return AppLatencyModel(
        arrival_rate=np.array([rate(k) for k in ordered]),
        instances=np.array([len(views[k].instances) for k in ordered], dtype=float),
        kappa=np.array([forecasts[k].kappa for k in ordered]),
        share=share,
        parents=tuple(tuple(index[p] for p in views[k].upstream if p in index) for k in ordered),
        floor_cores=floor_cores,
        arrival_scv=scv_column(arrival_scv, ordered),
        service_scv=scv_column(service_scv, ordered),
        model=model,
        budgets=None
        if budgets is None
        else np.array([budgets.get(k, np.inf) for k in ordered], dtype=float),
    )


def app_latency_models(
    views: Mapping[OperatorKey, OperatorView],
    forecasts: Mapping[OperatorKey, OperatorForecast],
    demands: Mapping[InstanceKey, InstanceDemand],
    floor_cores: float,
    arrival_scv: Scv = 1.0,
    service_scv: Scv = 1.0,
    *,
    model: str = "allen-cunneen",
    budgets: Mapping[OperatorKey, float] | None = None,
):
    """Per application, the model that predicts its latency from the CPU it gets
    beyond the floors (shared between operators in proportion to their demand), at
    the arrivals demand was sized for. With ``budgets`` its violation estimate is
    the queueing model's tail at each operator's budget (the quantile criterion),
    else an exponential tail of the mean."""
    models = {}
    for app, ordered in _operators_by_app(views).items():
        extra = np.array(
            [
                sum(max(demands[i].cores - floor_cores, 0.0) for i in views[k].instances)
                for k in ordered
            ]
        )
        floors = np.array(
            [sum(min(demands[i].cores, floor_cores) for i in views[k].instances) for k in ordered]
        )
        total = extra.sum()
        share = extra / total if total > 0 else np.full(len(ordered), 1.0 / len(ordered))
        models[app] = _latency_model(
            views,
            forecasts,
            ordered,
            share,
            floors,
            arrival_scv,
            service_scv,
            model,
            budgets,
            sized=True,
        )
    return models


@dataclass
class _ServiceColumns:
    """Per operator, apps in order and operators in topological order within each:
    arrivals (point forecast), instances, CPU per tuple and the service rate of one
    instance under the caps."""

    apps: list[str]
    ops: list[OperatorKey]
    sizes: list[int]
    starts: np.ndarray
    lam: np.ndarray
    m: np.ndarray
    kappa_raw: np.ndarray
    mu: np.ndarray
    ordered_by_app: dict[str, list[OperatorKey]]


def _service_columns(
    views: Mapping[OperatorKey, OperatorView],
    forecasts: Mapping[OperatorKey, OperatorForecast],
    caps: Mapping[InstanceKey, float],
    max_instance_cores: float,
) -> _ServiceColumns | None:
    ordered_by_app = _operators_by_app(views)
    if not ordered_by_app:
        return None
    # Each operator's floors: the sum over its instances, in instance order.
    view_ops = list(views)
    counts = [len(views[k].instances) for k in view_ops]
    inst = [i for k in view_ops for i in views[k].instances]
    capped = np.minimum(
        np.array(values_in_order(caps, inst, max_instance_cores), dtype=float),
        max_instance_cores,
    )
    op_floor = np.bincount(
        np.repeat(np.arange(len(view_ops)), counts), weights=capped, minlength=len(view_ops)
    )
    floor_of = dict(zip(view_ops, op_floor.tolist(), strict=True))
    apps = list(ordered_by_app)
    ops = [k for app in apps for k in ordered_by_app[app]]
    sizes = [len(ordered_by_app[app]) for app in apps]
    starts = np.concatenate(([0], np.cumsum(sizes)[:-1])).astype(int)
    lam = np.array([forecasts[k].rate for k in ops])
    m = np.array([len(views[k].instances) for k in ops], dtype=float)
    kappa_raw = np.array([forecasts[k].kappa for k in ops])
    floor = np.array([floor_of[k] for k in ops])
    # AppLatencyModel.latency_seconds with share = 0 and extra = 0.
    op_cores = floor + 0.0 * 0.0
    kappa = np.maximum(kappa_raw, 1e-12)
    mu = np.maximum(op_cores / m, 1e-12) / kappa
    return _ServiceColumns(apps, ops, sizes, starts, lam, m, kappa_raw, mu, ordered_by_app)


def estimate_latency_seconds(
    views: Mapping[OperatorKey, OperatorView],
    forecasts: Mapping[OperatorKey, OperatorForecast],
    caps: Mapping[InstanceKey, float],
    arrival_scv: Scv = 1.0,
    service_scv: Scv = 1.0,
    max_instance_cores: float = MAX_INSTANCE_CORES,
    model: str = "allen-cunneen",
) -> dict[str, float]:
    """Mean critical-path latency of each application under ``caps`` by the
    queueing ``model`` at the point forecasts (inf when an operator's caps cannot
    keep up with its predicted arrivals).

    Every application's :meth:`AppLatencyModel.latency_seconds` at no extra CPU
    (every core is a floor), computed for all operators of all applications at
    once: the per-operator arithmetic is element-wise, and the critical path is
    taken one topological position at a time across applications, so each
    value is the one the per-application model gives."""
    cols = _service_columns(views, forecasts, caps, max_instance_cores)
    if cols is None:
        return {}
    apps, ops, sizes, starts = cols.apps, cols.ops, cols.sizes, cols.starts
    lam, m, kappa_raw, mu = cols.lam, cols.m, cols.kappa_raw, cols.mu
    ca2, cs2 = scv_column(arrival_scv, ops), scv_column(service_scv, ops)
    wait = wait_arrays(model, lam, mu, m, ca2, cs2)[0]
    sojourn = np.where(lam > 0, wait + 1 / mu, np.where(kappa_raw > 0, 1 / mu, 0.0))
    ordered_by_app = cols.ordered_by_app
    # Parents as flat indices, and each operator's position in its app's order.
    position = np.concatenate([np.arange(n) for n in sizes])
    child, parent = [], []
    for app, first in zip(apps, starts.tolist(), strict=True):
        index = {k.operator: first + i for i, k in enumerate(ordered_by_app[app])}
        for i, k in enumerate(ordered_by_app[app]):
            for p in views[k].upstream:
                if p in index:
                    child.append(first + i)
                    parent.append(index[p])
    child_a, parent_a = np.array(child, dtype=int), np.array(parent, dtype=int)
    has_parent = np.zeros(len(ops), dtype=bool)
    has_parent[child_a] = True
    path = np.zeros(len(ops))
    for pos in range(max(sizes)):
        at = np.flatnonzero(position == pos)
        before = np.full(len(ops), -np.inf)
        edges = np.flatnonzero(position[child_a] == pos)
        np.maximum.at(before, child_a[edges], path[parent_a[edges]])
        path[at] = np.where(has_parent[at], before[at], 0.0) + sojourn[at]
    worst = np.maximum.reduceat(path, starts).tolist()
    return dict(zip(apps, worst, strict=True))


def estimate_violation(
    views: Mapping[OperatorKey, OperatorView],
    forecasts: Mapping[OperatorKey, OperatorForecast],
    caps: Mapping[InstanceKey, float],
    budgets: Mapping[OperatorKey, float],
    arrival_scv: Scv = 1.0,
    service_scv: Scv = 1.0,
    max_instance_cores: float = MAX_INSTANCE_CORES,
    model: str = "allen-cunneen",
) -> dict[str, float]:
    """Each application's predicted violation ratio under ``caps``: the largest,
    over its operators, probability that an operator's waiting + service time
    exceeds its share of the target (``budgets``), from the queueing ``model``'s
    sojourn tail at the point forecasts (1 where a queue is unstable, 0 for an
    operator without cost or budget).

    The counterpart of the demand's quantile criterion (an operator meets it when
    this probability is at most max_violation_ratio), and exact for a
    one-operator application. For a path it is the path's violation when the
    operators' sojourn times move together (a burst slows the whole pipeline), and
    at most the sum over the path when they are independent."""
    cols = _service_columns(views, forecasts, caps, max_instance_cores)
    if cols is None:
        return {}
    budget = np.array([budgets.get(k, np.inf) for k in cols.ops], dtype=float)
    has = np.isfinite(budget) & (cols.kappa_raw > 0)
    out = np.zeros(len(cols.ops))
    if has.any():
        ca2 = np.broadcast_to(scv_column(arrival_scv, cols.ops), budget.shape)
        cs2 = np.broadcast_to(scv_column(service_scv, cols.ops), budget.shape)
        out[has] = sojourn_exceedance_many(
            model,
            budget[has],
            cols.lam[has],
            cols.mu[has],
            cols.m[has],
            ca2[has],
            cs2[has],
        )
    worst = np.maximum.reduceat(out, cols.starts).tolist()
    return dict(zip(cols.apps, worst, strict=True))
