"""Stage 4 of the epoch: division of CPU between applications by QoS class, and
anti-saturation per node ("QoS-aware CPU cap adjustment for timely data-flow",
the QoS-weighted dynamic program).

* :func:`solve_qos_dp` -- the exact Bellman recursion over applications on
  discrete cap units, vectorized with numpy.
* :func:`covered_values` / :func:`latency_values` -- the contribution of giving an
  application k units: covered demand weighted by class, or the weighted share
  of its demand whose latency is predicted to stay within the class's bounds
  (the configured queueing model's sojourn tail, :meth:`AppLatencyModel.violation`).
  Neither rewards CPU beyond demand: the value arrays stop at the demand.
* :func:`node_recommendation` -- compare the optimum at today's capacity, one
  node more and one node fewer; recommend a change only when it beats the
  configured node cost.
* :class:`QosDpAllocator` -- the allocator named ``qos-dp``: floors first, the DP
  over what remains, units to instances in proportion to demand, then
  anti-saturation per node (:func:`fit_nodes`) cutting the lowest class first,
  and a node's room that is left to its instances' unmet demand
  (:func:`fill_nodes`), the heaviest class first.

The tie rule of the DP: among allocations with the optimal value (within a
relative 1e-9), the one that is lexicographically greatest in the order the
applications are given wins, i.e. an earlier application takes as many units as
it can without lowering the optimum. The allocator orders applications by
class weight (heaviest first), then by name, so a tie favours the more important
class and is reproducible. With the ``covered`` values every split between apps
of equal weight is a tie; the allocator then shares that class's units in
proportion to demand, which has the same value and starves nobody.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from operator import attrgetter, itemgetter
from typing import TYPE_CHECKING, Protocol

import numpy as np

from controller.qos import QosClass
from dsched.ids import InstanceKey
from dsched.registry import Registry
from predict.queueing import sojourn_exceedance_many, wait_arrays

if TYPE_CHECKING:
    from controller.stages.demand import InstanceDemand

# Relative tolerance within which two DP values count as equal.
TIE_RTOL = 1e-9


# ------------------------------------------------------------------ the DP
def _check_values(values: Sequence[Sequence[float]], capacity_units: int) -> list[np.ndarray]:
    if isinstance(capacity_units, bool) or not isinstance(capacity_units, int | np.integer):
        raise ValueError(f"capacity_units must be an integer, got {capacity_units!r}")
    if capacity_units < 0:
        raise ValueError(f"capacity_units must be >= 0, got {capacity_units}")
    arrays = []
    for a, row in enumerate(values):
        arr = np.asarray(row, dtype=float)
        if arr.ndim != 1 or arr.size == 0:
            raise ValueError(f"values[{a}] must be a non-empty 1-D sequence")
        if not np.all(np.isfinite(arr)):
            raise ValueError(f"values[{a}] contains a non-finite value")
        arrays.append(arr)
    return arrays


def _suffix_tables(arrays: list[np.ndarray], capacity_units: int) -> np.ndarray:
    """V[i][R]: best value of apps i.. with at most R units (V[n] = 0)."""
    n, c = len(arrays), capacity_units
    tables = np.zeros((n + 1, c + 1))
    for i in range(n - 1, -1, -1):
        nxt, vals = tables[i + 1], arrays[i]
        cur = np.full(c + 1, -np.inf)
        for k in range(min(vals.size - 1, c) + 1):
            # Giving k units to app i leaves R - k for the rest.
            np.maximum(cur[k:], vals[k] + nxt[: c + 1 - k], out=cur[k:])
        tables[i] = cur
    return tables


def _backtrack(arrays: list[np.ndarray], tables: np.ndarray, capacity_units: int) -> list[int]:
    units, remaining = [], capacity_units
    for i, vals in enumerate(arrays):
        best = tables[i][remaining]
        kmax = min(vals.size - 1, remaining)
        ks = np.arange(kmax + 1)
        cand = vals[: kmax + 1] + tables[i + 1][remaining - ks]
        tol = TIE_RTOL * max(1.0, abs(best))
        k = int(ks[cand >= best - tol].max())  # tie rule: the largest share for the earlier app
        units.append(k)
        remaining -= k
    return units


def solve_qos_dp(values: Sequence[Sequence[float]], capacity_units: int) -> tuple[list[int], float]:
    """Maximize sum_a values[a][k_a] subject to sum_a k_a <= capacity_units.

    ``values[a][k]`` is the contribution of giving application a k units
    (k = 0 .. len(values[a]) - 1). Returns the units per application and the
    optimal value. Exact (Bellman recursion over applications); ties are broken
    as the module docstring says. Bad input is a ValueError naming the argument.
    """
    arrays = _check_values(values, capacity_units)
    if not arrays:
        return [], 0.0
    tables = _suffix_tables(arrays, capacity_units)
    units = _backtrack(arrays, tables, capacity_units)
    return units, float(tables[0][capacity_units])


def best_values_by_capacity(values: Sequence[Sequence[float]], max_units: int) -> np.ndarray:
    """The optimal value for every capacity 0..max_units from one recursion."""
    arrays = _check_values(values, max_units)
    if not arrays:
        return np.zeros(max_units + 1)
    return _suffix_tables(arrays, max_units)[0]


# ------------------------------------------------------------------ contributions
def demand_units(demand_cores: float, unit_cores: float) -> int:
    return max(0, math.ceil(demand_cores / unit_cores - 1e-9))


def covered_values(demand_cores: float, weight: float, unit_cores: float) -> np.ndarray:
    """weight x covered demand for k = 0 .. units needed to cover the demand."""
    n = demand_units(demand_cores, unit_cores)
    return weight * np.minimum(np.arange(n + 1) * unit_cores, demand_cores)


@dataclass(frozen=True)
class AppLatencyModel:
    """What predicts an application's latency from the CPU it gets.

    Per operator (in topological order): predicted arrivals (tuples/s), instances,
    CPU-seconds per tuple, its share of the app's demand beyond the floors, and
    the indices of its parents in this list.
    """

    arrival_rate: np.ndarray
    instances: np.ndarray
    kappa: np.ndarray
    share: np.ndarray
    parents: tuple[tuple[int, ...], ...]
    floor_cores: np.ndarray  # per operator: the floors of its instances, summed
    # C² of arrivals and service: one for all operators, or an array, one per operator.
    arrival_scv: float | np.ndarray = 1.0
    service_scv: float | np.ndarray = 1.0
    # Queueing model of the waits (predict.queueing.WAIT_MODELS).
    model: str = "allen-cunneen"
    # Per operator: its share of the target (seconds). Given, the violation estimate
    # is the model's sojourn tail at these budgets (the quantile criterion); None:
    # an exponential tail of the mean critical-path latency (the mean criterion).
    budgets: np.ndarray | None = None

    def _service_rates(self, extra_cores) -> tuple[np.ndarray, np.ndarray]:
        """(extra grants as a row, service rate per instance: operators x grants)."""
        extra = np.asarray(extra_cores, dtype=float)[None, :]
        op_cores = self.floor_cores[:, None] + self.share[:, None] * extra
        kappa = np.maximum(self.kappa[:, None], 1e-12)
        return extra, np.maximum(op_cores / self.instances[:, None], 1e-12) / kappa

    def latency_seconds(self, extra_cores: np.ndarray) -> np.ndarray:
        """Critical-path latency (waiting + service) for each app-level grant."""
        extra, mu = self._service_rates(extra_cores)
        m = self.instances[:, None]
        lam = self.arrival_rate[:, None]
        ca2, cs2 = _per_operator(self.arrival_scv), _per_operator(self.service_scv)
        wait = wait_arrays(self.model, lam, mu, m, ca2, cs2)[0]
        sojourn = np.where(lam > 0, wait + 1 / mu, np.where(self.kappa[:, None] > 0, 1 / mu, 0.0))
        path = np.zeros_like(sojourn)
        for j, ps in enumerate(self.parents):
            before = np.max(path[list(ps)], axis=0) if ps else 0.0
            path[j] = before + sojourn[j]
        return path.max(axis=0) if len(path) else np.zeros(extra.shape[1])

    def violation(self, extra_cores: np.ndarray, target_seconds: float) -> np.ndarray:
        """Predicted violation ratio for each app-level grant: with ``budgets``, the
        largest over operators of P(waiting + service > budget) by the model's tail
        (see :func:`controller.stages.demand.estimate_violation`); else
        :func:`violation_ratio` of the mean critical-path latency."""
        if self.budgets is None:
            return violation_ratio(self.latency_seconds(extra_cores), target_seconds)
        extra, mu = self._service_rates(extra_cores)
        has = np.isfinite(self.budgets) & (self.kappa > 0)
        if not has.any():
            return np.zeros(extra.shape[1])
        tail = sojourn_exceedance_many(
            self.model,
            self.budgets[has, None],
            self.arrival_rate[has, None],
            mu[has],
            self.instances[has, None],
            _per_operator(self.arrival_scv, has),
            _per_operator(self.service_scv, has),
        )
        return tail.max(axis=0)


def _per_operator(scv: float | np.ndarray, rows: np.ndarray | None = None):
    """A C² as a column against (operators x grants), or the scalar as it is."""
    if np.ndim(scv) == 0:
        return scv
    col = np.asarray(scv, dtype=float)
    return (col if rows is None else col[rows])[:, None]


def violation_ratio(latency_seconds: np.ndarray, target_seconds: float) -> np.ndarray:
    """Share of tuples over the target if sojourn times were exponential with this mean."""
    lat = np.asarray(latency_seconds, dtype=float)
    with np.errstate(divide="ignore", over="ignore"):
        v = np.where(lat > 0, np.exp(-target_seconds / np.where(lat > 0, lat, 1.0)), 0.0)
    return np.where(np.isfinite(lat), v, 1.0)


def latency_values(
    model: AppLatencyModel, demand_cores: float, qos: QosClass, unit_cores: float
) -> np.ndarray:
    """weight x demand x the share of tuples within bounds, for k = 0 .. demand units.

    A predicted violation ratio at or under the class's bound counts as fully
    met; above it, the value falls linearly to 0 at ratio 1.
    """
    n = demand_units(demand_cores, unit_cores)
    cores = np.minimum(np.arange(n + 1) * unit_cores, demand_cores)
    v = model.violation(cores, qos.target_seconds)
    excess = np.clip((v - qos.max_violation_ratio) / (1 - qos.max_violation_ratio), 0.0, 1.0)
    vals = qos.weight * demand_cores * (1.0 - excess)
    # More CPU never makes latency worse; keep the array monotone against float noise.
    return np.maximum.accumulate(vals)


# ------------------------------------------------------------------ node recommendation
@dataclass(frozen=True)
class NodeRecommendation:
    nodes_delta: int  # -1 remove one node, 0 keep, +1 add one
    gain: float  # value gained net of node cost (0 when keeping)
    value_now: float
    value_one_more: float
    value_one_fewer: float | None
    reason: str


def node_recommendation(
    best_by_units: np.ndarray,
    units_now: int,
    units_node: int,
    node_count: int,
    node_cost: float,
) -> NodeRecommendation:
    """At most one node change, and only when its gain beats ``node_cost``."""
    top = len(best_by_units) - 1
    now = float(best_by_units[min(units_now, top)])
    more = float(best_by_units[min(units_now + units_node, top)])
    fewer = float(best_by_units[max(units_now - units_node, 0)]) if node_count > 1 else None
    gain_more = more - now - node_cost
    gain_fewer = (fewer - now + node_cost) if fewer is not None else -math.inf
    if gain_more > 0 and gain_more >= gain_fewer:
        return NodeRecommendation(
            1,
            gain_more,
            now,
            more,
            fewer,
            f"one node more adds {more - now:.2f} value > node cost {node_cost:.2f}",
        )
    if gain_fewer > 0:
        return NodeRecommendation(
            -1,
            gain_fewer,
            now,
            more,
            fewer,
            f"one node fewer loses {now - fewer:.2f} value < node cost {node_cost:.2f}",
        )
    return NodeRecommendation(0, 0.0, now, more, fewer, "no node change beats the node cost")


# ------------------------------------------------------------------ the allocator
@dataclass
class AppAllocation:
    app: str
    qos_class: str
    weight: float
    demand_cores: float
    floor_cores: float
    dp_units: int
    allocated_cores: float  # after anti-saturation
    cut_cores: float


@dataclass
class DpSummary:
    unit_cores: float
    capacity_units: int
    value: float
    seconds: float
    solved: bool  # False when every demand fitted and the DP was not needed


@dataclass
class QosAllocation:
    cores: dict[InstanceKey, float]
    notes: list[str] = field(default_factory=list)
    cut: dict[InstanceKey, float] = field(default_factory=dict)
    cut_reason: dict[InstanceKey, str] = field(default_factory=dict)
    apps: dict[str, AppAllocation] = field(default_factory=dict)
    dp: DpSummary | None = None
    recommendation: NodeRecommendation | None = None
    # Per node: cores over capacity that placement should move away; until
    # then they are cut by class weight (the placement hook reads this).
    overflow: dict[str, float] = field(default_factory=dict)


_first = itemgetter(0)  # InstanceKey.app
_node = attrgetter("node")  # of a demand
_cores = attrgetter("cores")


@dataclass
class InstanceTable:
    """Instances as parallel numpy arrays (the allocator's working form)."""

    keys: list[InstanceKey]
    node: np.ndarray  # node index
    app: np.ndarray  # app index
    demand: np.ndarray
    floor: np.ndarray
    nodes: list[str]
    apps: list[str]

    @classmethod
    def build(cls, demands: Mapping[InstanceKey, object], floor_cores: float) -> InstanceTable:
        # Columns through C-level maps: per-instance Python loops dominate at scale.
        keys = list(demands)
        n = len(keys)
        app_of = list(map(_first, keys))
        node_of = list(map(_node, demands.values()))
        apps = sorted(set(app_of))
        nodes = sorted(set(node_of))
        node_ix = {n: i for i, n in enumerate(nodes)}
        app_ix = {a: i for i, a in enumerate(apps)}
        demand = np.fromiter(map(_cores, demands.values()), float, n)
        return cls(
            keys,
            np.fromiter(map(node_ix.__getitem__, node_of), int, n),
            np.fromiter(map(app_ix.__getitem__, app_of), int, n),
            demand,
            np.minimum(demand, floor_cores),
            nodes,
            apps,
        )


def fit_nodes(
    alloc: np.ndarray,
    node: np.ndarray,
    weight: np.ndarray,
    floor: np.ndarray,
    room: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Anti-saturation: per node, cut the lowest weight first (down to its floor,
    in proportion within a weight) until the node's caps fit its room; if floors
    alone do not fit, scale the floors. Returns (new allocation, overflow per node)."""
    out = alloc.copy()
    load = np.bincount(node, weights=out, minlength=len(room))
    overflow = np.maximum(load - room, 0.0)
    # Each node's instances in index order, found once rather than by a scan per node.
    by_node = np.argsort(node, kind="stable")
    bounds = np.searchsorted(node[by_node], np.arange(len(room) + 1))
    for n in np.flatnonzero(overflow > 1e-12):
        excess = overflow[n]
        on = by_node[bounds[n] : bounds[n + 1]]
        for w in np.unique(weight[on]):  # ascending: lightest class first
            grp = on[weight[on] == w]
            cuttable = np.maximum(out[grp] - floor[grp], 0.0)
            total = cuttable.sum()
            if total <= 0:
                continue
            take = min(excess, total)
            out[grp] -= cuttable * (take / total)
            excess -= take
            if excess <= 1e-12:
                break
        if excess > 1e-12:
            total = out[on].sum()
            out[on] *= max(room[n], 0.0) / total if total > 0 else 0.0
    return out, overflow


def fill_nodes(
    alloc: np.ndarray,
    demand: np.ndarray,
    node: np.ndarray,
    weight: np.ndarray,
    room: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Give each node's room left after :func:`fit_nodes` to its instances' unmet
    demand, the heaviest class first (in proportion to what each still wants
    within a class). Returns (new allocation, cores given per node).

    The division shares the cluster's CPU out in one ratio per class; a node
    whose instances then exceed its room is cut, and that CPU would stand idle
    on a node whose instances were cut by the same ratio but still fit."""
    out = alloc.copy()
    spare = room - np.bincount(node, weights=out, minlength=len(room))
    given = np.zeros(len(room))
    want = np.maximum(demand - out, 0.0)
    # The instances that want more, by node, found once (most epochs: none).
    needy = np.flatnonzero(want > 1e-12)
    needy = needy[np.argsort(node[needy], kind="stable")]
    bounds = np.searchsorted(node[needy], np.arange(len(room) + 1))
    for n in np.flatnonzero((spare > 1e-12) & (bounds[1:] > bounds[:-1])):
        on = needy[bounds[n] : bounds[n + 1]]
        left = spare[n]
        for w in np.unique(weight[on])[::-1]:  # heaviest class first
            grp = on[weight[on] == w]
            total = want[grp].sum()
            take = min(left, total)
            out[grp] += want[grp] * (take / total)
            left -= take
            if left <= 1e-12:
                break
        given[n] = spare[n] - left
    return out, given


@dataclass
class QosDpAllocator:
    """``qos-dp``: floors, the QoS-weighted DP, proportional shares, anti-saturation."""

    headroom_cores: float = 0.0
    floor_cores: float = 0.05
    theta_cores: float = 0.1
    max_units: int = 4000
    node_cost: float = 4.0
    value: str = "covered"  # or "latency"

    def allocate(
        self,
        demands: Mapping[InstanceKey, object],
        capacity: Mapping[str, float],
        classes: Mapping[str, QosClass],
        latency_models: Mapping[str, AppLatencyModel] | None = None,
    ) -> QosAllocation:
        if not demands:
            return QosAllocation({})
        t = InstanceTable.build(demands, self.floor_cores)
        room_by_node = {n: max(0.0, c - self.headroom_cores) for n, c in capacity.items()}
        room = np.array([room_by_node.get(n, 0.0) for n in t.nodes])
        n_apps = len(t.apps)
        app_weight = np.array([classes[a].weight for a in t.apps])
        app_demand = np.bincount(t.app, weights=t.demand, minlength=n_apps)
        app_floor = np.bincount(t.app, weights=t.floor, minlength=n_apps)
        extra = t.demand - t.floor
        app_extra = app_demand - app_floor
        usable = float(sum(room_by_node.values()))
        spare = max(0.0, usable - float(t.floor.sum()))
        unit = max(self.theta_cores, usable / self.max_units)
        cap_units = int(math.floor(spare / unit + 1e-9))
        # The typical node decides what "one node more / fewer" is worth.
        node_units = int(round(float(np.median(list(room_by_node.values()) or [0.0])) / unit))

        order = sorted(range(n_apps), key=lambda a: (-app_weight[a], t.apps[a]))
        vals = [
            self._values(t.apps[a], app_extra[a], classes[t.apps[a]], unit, latency_models)
            for a in order
        ]
        t0 = time.perf_counter()
        top_units = cap_units + node_units
        tables = _suffix_tables(_check_values(vals, top_units), top_units)
        fits = app_extra.sum() <= spare + 1e-9
        if fits:
            granted = app_extra.copy()
            units = [demand_units(app_extra[a], unit) for a in order]
        else:
            units = _backtrack(vals, tables, cap_units)  # V[i][R] for R <= top is the same
            granted = np.zeros(n_apps)
            for a, k in zip(order, units, strict=True):
                granted[a] = min(k * unit, app_extra[a])
            if self.value == "covered":
                granted = _share_within_weight(granted, app_extra, app_weight)
        dp_seconds = time.perf_counter() - t0
        rec = node_recommendation(
            tables[0], cap_units, node_units, len(room_by_node), self.node_cost
        )

        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(app_extra > 0, granted / app_extra, 1.0)
        alloc = t.floor + extra * ratio[t.app]
        inst_weight = app_weight[t.app]
        fitted, overflow = fit_nodes(alloc, t.node, inst_weight, t.floor, room)
        fitted, refilled = fill_nodes(fitted, t.demand, t.node, inst_weight, room)

        result = QosAllocation(
            cores=dict(zip(t.keys, fitted.tolist(), strict=True)),
            dp=DpSummary(
                unit, cap_units, float(tables[0][min(cap_units, top_units)]), dp_seconds, not fits
            ),
            recommendation=rec,
            overflow={t.nodes[n]: float(o) for n, o in enumerate(overflow) if o > 1e-9},
        )
        short = t.demand - fitted
        cut = np.flatnonzero(short > 1e-9)
        cut_keys = [t.keys[i] for i in cut.tolist()]
        result.cut = dict(zip(cut_keys, short[cut].tolist(), strict=True))
        # What the division kept back and what the node took (less any refill).
        short_dp = np.maximum(t.demand - np.maximum(alloc, fitted), 0.0)
        short_node = np.maximum(alloc - fitted, 0.0)
        result.cut_reason = dict(
            zip(
                cut_keys,
                map(
                    _cut_reason,
                    short_dp[cut].tolist(),
                    short_node[cut].tolist(),
                    map(t.nodes.__getitem__, t.node[cut].tolist()),
                ),
                strict=True,
            )
        )
        app_alloc = np.bincount(t.app, weights=fitted, minlength=n_apps)
        for pos, a in enumerate(order):
            name = t.apps[a]
            result.apps[name] = AppAllocation(
                name,
                classes[name].name,
                float(app_weight[a]),
                float(app_demand[a]),
                float(app_floor[a]),
                int(units[pos]),
                float(app_alloc[a]),
                float(max(0.0, app_demand[a] - app_alloc[a])),
            )
        if not fits:
            result.notes.append(
                f"demand {app_demand.sum():.2f} cores > {usable:.2f} usable: divided by qos-dp "
                f"({cap_units} units of {unit:.3f} cores beyond floors)"
            )
        for n, o in result.overflow.items():
            result.notes.append(f"node {n}: {o:.2f} cores over capacity - headroom; cut by class")
        for n in np.flatnonzero(refilled > 1e-9).tolist():
            result.notes.append(
                f"node {t.nodes[n]}: {refilled[n]:.2f} cores of room left by the division "
                "given to its instances' unmet demand"
            )
        return result

    def _values(self, app, extra, qos, unit, latency_models) -> np.ndarray:
        if self.value == "latency" and latency_models and app in latency_models:
            return latency_values(latency_models[app], extra, qos, unit)
        return covered_values(extra, qos.weight, unit)


def _cut_reason(short_dp: float, short_node: float, node: str) -> str:
    why = []
    if short_dp > 1e-9:
        why.append(f"qos-dp {short_dp:.3f}")
    if short_node > 1e-9:
        why.append(f"node {node} full {short_node:.3f}")
    return ", ".join(why)


def _share_within_weight(granted: np.ndarray, extra: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """Share each weight's granted total between its apps in proportion to demand."""
    out = granted.copy()
    for w in np.unique(weight):
        grp = weight == w
        total, want = granted[grp].sum(), extra[grp].sum()
        if want > 0:
            out[grp] = extra[grp] * min(1.0, total / want)
    return out


class Allocator(Protocol):
    """Divide CPU: per-instance grants (cores), cuts with reasons, per-app summary."""

    def allocate(
        self,
        demands: dict[InstanceKey, InstanceDemand],
        capacity: dict[str, float],
        classes: Mapping[str, QosClass],
        latency_models: Mapping | None = None,
    ) -> QosAllocation: ...


@dataclass
class DemandAllocator:
    """Give every instance its demand, then keep each node under capacity - headroom
    by scaling its instances down in proportion (anti-saturation)."""

    headroom_cores: float = 0.0

    def allocate(
        self,
        demands: dict[InstanceKey, InstanceDemand],
        capacity: dict[str, float],
        classes: Mapping[str, QosClass],
        latency_models: Mapping | None = None,
    ) -> QosAllocation:
        alloc = QosAllocation({k: d.cores for k, d in demands.items()})
        for node, cap in sorted(capacity.items()):
            keys = [k for k, d in demands.items() if d.node == node]
            total = sum(alloc.cores[k] for k in keys)
            room = max(0.0, cap - self.headroom_cores)
            if total > room > 0:
                scale = room / total
                for k in keys:
                    granted = alloc.cores[k] * scale
                    alloc.cut[k] = alloc.cores[k] - granted
                    alloc.cores[k] = granted
                alloc.notes.append(
                    f"node {node}: demand {total:.2f} cores > {room:.2f} usable; scaled by {scale:.2f}"
                )
                alloc.overflow[node] = total - room
                for k in keys:
                    alloc.cut_reason[k] = f"node {node} full, scaled by {scale:.2f}"
        for app in sorted({k.app for k in demands}):
            keys = [k for k in demands if k.app == app]
            want = sum(demands[k].cores for k in keys)
            got = sum(alloc.cores[k] for k in keys)
            qos = classes[app]
            alloc.apps[app] = AppAllocation(
                app, qos.name, qos.weight, want, 0.0, 0, got, want - got
            )
        return alloc


#: Allocators by name (config key ``allocator``). Each factory takes the
#: ControllerConfig.
ALLOCATORS: Registry[Allocator] = Registry("allocator", "allocator")
ALLOCATORS.add("demand", lambda cfg: DemandAllocator(headroom_cores=cfg.headroom_cores))
ALLOCATORS.add(
    "qos-dp",
    lambda cfg: QosDpAllocator(
        headroom_cores=cfg.headroom_cores,
        floor_cores=cfg.min_cap_cores,
        theta_cores=cfg.theta_cores,
        max_units=cfg.dp_max_units,
        node_cost=cfg.node_cost,
        value=cfg.dp_value,
    ),
)
