"""One control epoch as small stages (DESIGN §4): evaluate → forecast → demand
→ allocate → hysteresis. Each stage is a pure function or a small strategy
object over plain data; the Controller (controller/core.py) feeds it state and
hands the result to an actuator.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple, Protocol

import numpy as np

from controller import hysteresis
from controller.allocation import AppAllocation, QosAllocation
from controller.model import InstanceKey, OperatorKey
from controller.qos import QosClass
from controller.state import ClusterState
from predict.cost import cpu_per_tuple
from predict.load import Arima, LinearTrend, combine, propagate


# ---------------------------------------------------------------- 1 evaluate
@dataclass
class OperatorView:
    """An operator over the last phi slots, summed over its instances."""

    key: OperatorKey
    instances: list[InstanceKey]
    nodes: dict[InstanceKey, str]
    stateful: bool
    upstream: tuple[str, ...]
    seconds: np.ndarray  # slot lengths
    arrivals: np.ndarray  # tuples/s per slot
    executed: np.ndarray  # tuples/s per slot
    emitted: np.ndarray  # tuples/s per slot
    cpu_seconds: np.ndarray  # CPU-seconds per slot
    queue: np.ndarray  # tuples waiting at each slot's end
    queue_by_instance: dict[InstanceKey, float]
    usage_by_instance: dict[InstanceKey, float]
    cap_by_instance: dict[InstanceKey, float | None]  # the cap in force during the last slot
    throttled_by_instance: dict[InstanceKey, float | None]  # seconds throttled in the last slot
    latency_ms: float | None  # mean end-to-end latency of tuples finished here, last slot
    service_ms: float | None  # mean processing time per tuple, over the window
    last_timestamp: float = 0.0  # end of the newest slot

    @property
    def usage_cores(self) -> float:
        return float(sum(self.usage_by_instance.values()))

    @property
    def selectivity(self) -> float:
        """Tuples emitted per tuple executed (rho in DESIGN §4), over the window."""
        done = float(self.executed @ self.seconds)
        return float(self.emitted @ self.seconds) / done if done > 0 else 0.0

    @property
    def queue_change(self) -> float:
        """Mean change of the queue per second over the window (delta in DESIGN §4)."""
        if len(self.queue) < 2:
            return 0.0
        return float((self.queue[-1] - self.queue[0]) / max(self.seconds[1:].sum(), 1e-9))


def evaluate(state: ClusterState, phi: int) -> dict[OperatorKey, OperatorView]:
    by_op: dict[OperatorKey, list] = {}
    for h in state.histories.values():
        if h.slots:
            by_op.setdefault(h.key.operator_key, []).append(h)
    views: dict[OperatorKey, OperatorView] = {}
    for op, hists in sorted(by_op.items()):
        hists.sort(key=lambda h: h.key.instance)
        # Instances on different nodes report on their own clocks; align by
        # recency (the k-th newest slot of each) over the slots all of them have.
        n = min(phi, min(len(h.slots) for h in hists))
        rows = [list(h.slots)[-n:] for h in hists]
        secs = np.array([sum(r[i].seconds for r in rows) / len(rows) for i in range(n)])

        def per_second(attr: str, rows=rows, secs=secs, n=n) -> np.ndarray:
            return np.array([sum(getattr(r[i], attr) for r in rows) for i in range(n)]) / secs

        last = [r[-1] for r in rows]
        lat_count = sum(s.latency_count for s in last)
        svc_count = sum(s.executed for r in rows for s in r)
        views[op] = OperatorView(
            key=op,
            instances=[h.key for h in hists],
            nodes={h.key: h.node for h in hists},
            stateful=any(h.stateful for h in hists),
            upstream=hists[0].upstream,
            seconds=secs,
            arrivals=per_second("received"),
            executed=per_second("executed"),
            emitted=per_second("emitted"),
            cpu_seconds=np.array([sum(r[i].cpu_seconds for r in rows) for i in range(n)]),
            queue=np.array([sum(r[i].queue_length for r in rows) for i in range(n)]),
            queue_by_instance={h.key: r[-1].queue_length for h, r in zip(hists, rows, strict=True)},
            usage_by_instance={h.key: r[-1].usage_cores for h, r in zip(hists, rows, strict=True)},
            cap_by_instance={h.key: r[-1].cap_cores for h, r in zip(hists, rows, strict=True)},
            throttled_by_instance={
                h.key: r[-1].throttled_seconds for h, r in zip(hists, rows, strict=True)
            },
            latency_ms=(1000 * sum(s.latency_sum_seconds for s in last) / lat_count)
            if lat_count
            else None,
            service_ms=(1000 * sum(s.service_seconds for r in rows for s in r) / svc_count)
            if svc_count
            else None,
            last_timestamp=max(s.timestamp for s in last),
        )
    return views


# ---------------------------------------------------------------- 2 forecast
@dataclass
class OperatorForecast:
    key: OperatorKey
    rate: float  # predicted arrivals, tuples/s, next slot
    predictor: str  # which prediction won
    candidates: dict[str, float]
    kappa: float  # CPU-seconds per tuple


class SourceHistory:
    """Long arrival series of source operators with one cached ARIMA per series.

    The fast loop keeps only phi slots; sources get one point per new slot here,
    and their :class:`predict.load.Arima` keeps its fit between epochs, so an
    epoch only advances each filter by one observation.
    """

    def __init__(self, length: int = 300, fits_per_epoch: int = 8, **arima_options):
        self.length = length
        # First fits cost tens of milliseconds each; when many sources reach the
        # minimum history together, fitting all in one epoch would stall it, so
        # only this many first fits run per epoch (the rest use the trend meanwhile).
        self.fits_per_epoch = fits_per_epoch
        self._fits_left = fits_per_epoch
        self.arima_options = arima_options
        self.series: dict[OperatorKey, deque[float]] = {}
        self.models: dict[OperatorKey, Arima] = {}
        self._seen: dict[OperatorKey, float] = {}

    def observe(self, view: OperatorView) -> None:
        if not len(view.arrivals) or self._seen.get(view.key, -1.0) >= view.last_timestamp:
            return
        self._seen[view.key] = view.last_timestamp
        self.series.setdefault(view.key, deque(maxlen=self.length)).append(float(view.arrivals[-1]))

    def predict(self, key: OperatorKey) -> float | None:
        """ARIMA's next value, or None while the series is too short to fit."""
        series = self.series.get(key)
        model = self.models.get(key)
        if model is None:
            model = self.models[key] = Arima(**self.arima_options)
        if series is None or len(series) < model.min_history:
            return None
        if model.fitted_order is None:
            if self._fits_left <= 0:
                return None
            self._fits_left -= 1
        fc = model.predict(np.fromiter(series, float, len(series)))
        return float(fc.values[0]) if fc.method == "arima" else None

    def begin_epoch(self) -> None:
        self._fits_left = self.fits_per_epoch

    def prepend(self, key: OperatorKey, older: list[float]) -> None:
        """Put rates from before this controller's memory (the history table)
        ahead of what it has observed itself, so ARIMA can fit after a restart."""
        mine = list(self.series.get(key, ()))
        self.series[key] = deque([*older, *mine][-self.length :], maxlen=self.length)

    def forget_except(self, live: set[OperatorKey]) -> None:
        for store in (self.series, self.models, self._seen):
            for k in set(store) - live:
                del store[k]


def forecast(
    views: dict[OperatorKey, OperatorView],
    phi: int,
    sources: SourceHistory | None = None,
    kappa_memory: dict[OperatorKey, float] | None = None,
) -> dict[OperatorKey, OperatorForecast]:
    """Predict every operator's arrivals: max of its own trend, its parents' output
    and (for sources with enough history) ARIMA.

    ``kappa_memory`` keeps each operator's last measured CPU per tuple across
    epochs; it is updated in place and used when an operator processed nothing
    in the window (see :func:`operator_cost`)."""
    kappa_memory = {} if kappa_memory is None else kappa_memory
    trend = LinearTrend(window=phi)
    if sources is not None:
        sources.begin_epoch()
    out: dict[OperatorKey, OperatorForecast] = {}
    by_app: dict[str, dict[str, OperatorView]] = {}
    for k, v in views.items():
        by_app.setdefault(k.app, {})[k.operator] = v
    for app in sorted(by_app):
        ops = by_app[app]
        trended = {
            op: max(0.0, float(trend.forecast(v.arrivals, horizon=1)[0])) for op, v in ops.items()
        }
        own = dict(trended)
        children = {op: [c for c, w in ops.items() if op in w.upstream] for op in ops}
        has_parents = {op for kids in children.values() for op in kids}
        arima: dict[str, float] = {}
        if sources is not None:
            for op, v in ops.items():
                if op not in has_parents:
                    sources.observe(v)
                    value = sources.predict(v.key)
                    if value is not None:
                        arima[op] = max(0.0, value)
                        own[op] = max(own[op], arima[op])
        # The max rule is applied along the DAG: a child sees the larger of its
        # own trend and what its parents are predicted to send it.
        from_parents = propagate(
            children,
            {op: own[op] for op in ops if op not in has_parents},
            {op: v.selectivity for op, v in ops.items()},
            {op: v.queue_change for op, v in ops.items()},
            combine_with={op: own[op] for op in has_parents},
        )
        for op, v in ops.items():
            candidates = {"linear_trend": trended[op]}
            if op in arima:
                candidates["arima"] = arima[op]
            if op in has_parents:
                candidates["dag"] = from_parents[op]
            best = combine(candidates)
            kappa = operator_cost(v, phi, kappa_memory)
            out[v.key] = OperatorForecast(
                v.key, best.value, best.winner, best.candidates, float(kappa)
            )
    return out


def operator_cost(view: OperatorView, phi: int, memory: dict[OperatorKey, float]) -> float:
    """CPU-seconds per tuple of an operator, never an exception.

    An operator that processed nothing in the window has no cost estimate of its
    own. An idle one needs none, but one starved by too small a cap must get
    CPU back, or it would stay starved: it keeps its last measured cost, and one
    never measured is charged all the CPU it burnt in the window as if for a
    single tuple, a deliberate overestimate that lifts its cap.
    """
    processed = view.executed * view.seconds
    if float(processed[-phi:].sum()) > 0:
        kappa = float(cpu_per_tuple(view.cpu_seconds, processed, window=phi))
        memory[view.key] = kappa
        return kappa
    return memory.get(view.key, float(view.cpu_seconds[-phi:].sum()))


# ---------------------------------------------------------------- 3 demand
class InstanceDemand(NamedTuple):
    """One instance's CPU demand (a NamedTuple: an epoch makes one per instance
    per estimator layer, and tuples are built several times faster)."""

    key: InstanceKey
    node: str
    cores: float
    reason: str  # the term that set it: "rate", "backlog", "floor", "latency", ...


class DemandEstimator(Protocol):
    """Per-instance CPU demand. Build richer estimators by wrapping a small one."""

    def estimate(
        self, view: OperatorView, fc: OperatorForecast
    ) -> dict[InstanceKey, InstanceDemand]: ...


@dataclass
class RateDemand:
    """r_j = psi_j * kappa_j / T_j: the CPU to process the predicted arrivals."""

    def estimate(
        self, view: OperatorView, fc: OperatorForecast
    ) -> dict[InstanceKey, InstanceDemand]:
        per = fc.rate * fc.kappa / max(1, len(view.instances))
        return {k: InstanceDemand(k, view.nodes[k], per, "rate") for k in view.instances}


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
                k, d.node, d.cores + extra, "backlog" if extra > d.cores else d.reason
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
            else InstanceDemand(k, d.node, self.floor_cores, "floor")
            for k, d in self.inner.estimate(view, fc).items()
        }


# ---------------------------------------------------------------- 4 allocate
Allocation = QosAllocation


class Allocator(Protocol):
    """Divide CPU: per-instance grants (cores), cuts with reasons, per-app summary."""

    def allocate(
        self,
        demands: dict[InstanceKey, InstanceDemand],
        capacity: dict[str, float],
        classes: Mapping[str, QosClass],
        latency_models: Mapping | None = None,
    ) -> Allocation: ...


@dataclass
class DemandAllocator:
    """Give every instance its demand, then keep each node under capacity - headroom
    by scaling its instances down in proportion (anti-saturation, DESIGN §4 step 5)."""

    headroom_cores: float = 0.0

    def allocate(
        self,
        demands: dict[InstanceKey, InstanceDemand],
        capacity: dict[str, float],
        classes: Mapping[str, QosClass],
        latency_models: Mapping | None = None,
    ) -> Allocation:
        alloc = Allocation({k: d.cores for k, d in demands.items()})
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


# ---------------------------------------------------------------- 5 hysteresis
def apply_hysteresis(
    alloc: Allocation,
    memory: dict[InstanceKey, hysteresis.HysteresisState],
    theta: float,
    max_cap: dict[InstanceKey, float],
    forget: bool = True,
) -> dict[InstanceKey, hysteresis.HysteresisStep]:
    """Per instance: raise at once, lower after theta/2, quantize; never above the node.
    With ``forget``, the memory of instances without an allocation is dropped."""
    steps = {}
    for k, cores in alloc.cores.items():
        st = memory.setdefault(k, hysteresis.HysteresisState())
        s = hysteresis.step(st, cores, theta)
        limit = max_cap.get(k, math.inf)
        if s.cap > limit:
            # Quantizing up must not push a cap past what the node can give.
            st.cap = limit
            s = hysteresis.HysteresisStep(limit, s.changed, s.reason)
        steps[k] = s
    if forget:
        for gone in set(memory) - set(alloc.cores):
            del memory[gone]
    return steps


def _prior_in_group(group: np.ndarray, values: np.ndarray) -> np.ndarray:
    """For rows sorted by ``group``: sum of ``values`` of the earlier rows of the same group."""
    before = np.cumsum(values) - values
    _, first = np.unique(group, return_index=True)
    starts = np.zeros(len(group), dtype=int)
    starts[first] = first
    starts = np.maximum.accumulate(starts)
    return before - before[starts]


def fit_quantized_caps(
    steps: dict[InstanceKey, hysteresis.HysteresisStep],
    memory: dict[InstanceKey, hysteresis.HysteresisState],
    allocated: Mapping[InstanceKey, float],
    node_of: Mapping[InstanceKey, str],
    weight_of: Mapping[InstanceKey, float],
    room: Mapping[str, float],
    min_cap: float,
) -> dict[InstanceKey, hysteresis.HysteresisStep]:
    """Anti-saturation after quantization (DESIGN §4 steps 5–6).

    Rounding up with a theta/2 margin can push a node's caps past its room
    again. Where it does, first the rounding margins come off (down to the
    allocation; lightest class first, largest margin first), then caps go below
    their allocation, lightest class first and in proportion within a class,
    never below ``min_cap``. Caps lowered here need not be multiples of theta:
    the node's room wins over the granularity. Vectorized over all instances.
    """
    if not steps:
        return {}
    keys = list(steps)
    nodes = sorted({node_of[k] for k in keys})
    node_ix = {n: i for i, n in enumerate(nodes)}
    node = np.fromiter((node_ix[node_of[k]] for k in keys), int, len(keys))
    caps = np.fromiter((steps[k].cap for k in keys), float, len(keys))
    load = np.bincount(node, weights=caps, minlength=len(nodes))
    limit = np.array([room.get(n, math.inf) for n in nodes])
    over_node = load - limit
    hot = over_node[node] > 1e-9
    out = dict(steps)
    if not hot.any():
        return out
    idx = np.flatnonzero(hot)
    hkeys = [keys[i] for i in idx]
    hnode, hcap = node[idx], caps[idx]
    weight = np.fromiter((weight_of.get(k, 1.0) for k in hkeys), float, len(hkeys))
    floor = np.minimum(min_cap, hcap)
    alloc = np.fromiter((allocated.get(k, 0.0) for k in hkeys), float, len(hkeys))
    target = np.maximum(alloc, floor)
    # 1: rounding margins, lightest class first, largest margin first.
    margin = np.maximum(hcap - target, 0.0)
    order = np.lexsort((np.arange(len(idx)), -margin, weight, hnode))
    prior = _prior_in_group(hnode[order], margin[order])
    take = np.clip(over_node[hnode[order]] - prior, 0.0, margin[order])
    new = hcap.copy()
    new[order] -= take
    left = np.maximum(over_node - np.bincount(hnode, weights=hcap - new, minlength=len(nodes)), 0.0)
    # 2: below allocation, lightest class first, in proportion within a class.
    if (left > 1e-9).any():
        _, wrank = np.unique(weight, return_inverse=True)
        group = hnode * (wrank.max() + 1) + wrank
        uniq, ginv = np.unique(group, return_inverse=True)
        cuttable = np.maximum(new - floor, 0.0)
        gcut = np.bincount(ginv, weights=cuttable, minlength=len(uniq))
        gnode = uniq // (wrank.max() + 1)
        gprior = _prior_in_group(gnode, gcut)
        gtake = np.clip(left[gnode] - gprior, 0.0, gcut)
        with np.errstate(divide="ignore", invalid="ignore"):
            share = np.where(gcut > 0, gtake / gcut, 0.0)
        new -= cuttable * share[ginv]
    for j in np.flatnonzero(new < hcap - 1e-12):
        k = hkeys[j]
        c = round(float(new[j]), 9)
        memory[k].cap, memory[k].accumulated_decrease = c, 0.0
        out[k] = hysteresis.HysteresisStep(c, True, "fit-node")
    return out
