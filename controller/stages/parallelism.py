"""How many instances each operator should run: a pure stage, no I/O.

Two rules, chosen per operator:

* **Model-Based Allocation** where a task performance model is known for the
  operator ("Model-driven Scheduling for Distributed Stream Processing
  Systems", Alg. 3): full bundles at the model's best thread count, then the
  fewest threads that carry the remainder of the predicted rate. An instance
  is one thread here, so MBA's thread count is the instance count.
* **One instance more or fewer** otherwise, the M+/M- neighbourhood of "QoS-aware
  CPU cap adjustment for timely data-flow" (§4.2, at most one step per
  interval): one more when an instance's demand exceeds what one instance may
  use (``max_instance_cores``) or its latency target cannot be met with caps
  at that maximum; one fewer when the predicted load would still fit on one
  instance fewer, each at most ``lower_utilization`` of the maximum, and the
  latency budget would still be reachable there.

Both go through the same hysteresis as caps: raise at once, lower only after
``patience`` epochs in a row that all wanted fewer, and always within the
operator's limits. The stage returns decisions and the new hysteresis state;
the edge (controller/edges/parallelism.py) keeps the state and acts.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

import numpy as np

from controller.stages.demand import InstanceDemand, cores_for_budgets
from controller.stages.evaluate import OperatorView
from controller.stages.forecast import OperatorForecast
from dsched.ids import InstanceKey, OperatorKey
from predict.perfmodel import PerformanceModel, _mba_task

# Demand this close above the maximum is rounding, not a reason to grow.
_EPS = 1e-9
#: Slots of a source's arrivals before their trend may raise ahead of the load,
#: and the standard errors (Poisson counts) its slope must exceed.
TREND_MIN_SLOTS = 3
TREND_Z = 2.0


@dataclass(frozen=True)
class OperatorSizing:
    """What the stage reads of one operator this epoch."""

    current: int  # instances running now
    rate: float  # tuples/s demand is sized for
    kappa: float  # CPU-seconds per tuple
    unreachable: bool  # its latency target needs more than max_instance_cores per instance
    # Cores per instance its latency budget would need with one instance fewer
    # (None: no budget, or one instance already).
    need_one_fewer: float | None = None
    # Where the arrivals rise: the rate their trend reaches ``lookahead`` slots
    # after the next one (None: not rising, or no lookahead), and the cores per
    # instance the latency budget needs at that rate with the instances running.
    rate_ahead: float | None = None
    need_ahead: float | None = None
    lookahead: int = 0

    @property
    def load_cores(self) -> float:
        """CPU the predicted arrivals need in all, whatever the instance count."""
        return self.rate * self.kappa


@dataclass(frozen=True)
class ParallelismDecision:
    current: int
    decided: int
    rule: str  # "mba" or "step"
    reason: str
    wanted: int  # what the rule asked for before hysteresis and limits


def per_instance_needs(
    sizing: Mapping[OperatorKey, OperatorSizing],
    budgets: Mapping[OperatorKey, float],
    *,
    arrival_scv: float | Mapping[OperatorKey, float],
    service_scv: float | Mapping[OperatorKey, float],
    model: str,
    quantiles: Mapping[str, float] | None = None,
    fewer: int = 0,
) -> dict[OperatorKey, float]:
    """Per operator: the per-instance cores its latency budget needs with
    ``fewer`` instances fewer than ``current`` (1: the M- case of "QoS-aware CPU
    cap adjustment for timely data-flow" §4.2), as the demand stage solves it
    (``quantiles``: app -> sojourn quantile, else the mean). Operators without
    a budget, load, or ``fewer + 1`` instances are left out. The squared
    coefficients of variation are one value for all or one per operator
    (measured; an operator missing takes 1)."""
    keys = [
        k
        for k, s in sizing.items()
        if s.current > fewer
        and budgets.get(k, 0.0) > 0
        and s.rate > 0
        and s.kappa > 0
        and (quantiles is None or k.app in quantiles)
    ]
    if not keys:
        return {}
    return cores_for_budgets(
        keys,
        np.array([budgets[k] for k in keys]),
        np.array([sizing[k].rate for k in keys]),
        np.array([sizing[k].current - fewer for k in keys], dtype=float),
        np.array([sizing[k].kappa for k in keys]),
        arrival_scv,
        service_scv,
        model=model,
        quantiles=quantiles,
    )


def sizing_inputs(
    views: Mapping[OperatorKey, OperatorView],
    forecasts: Mapping[OperatorKey, OperatorForecast],
    demands: Mapping[InstanceKey, InstanceDemand],
    lookahead: int = 0,
) -> dict[OperatorKey, OperatorSizing]:
    """The stage's inputs from one epoch's views, forecasts and instance demands.

    ``lookahead`` > 0: where an application's offered load rises, every operator
    of it gets ``rate_ahead``, its sized rate grown by :func:`offered_growth`."""
    growth = offered_growth(views, lookahead) if lookahead > 0 else {}
    out = {}
    for key, view in views.items():
        fc = forecasts.get(key)
        if fc is None or not view.instances:
            continue
        rate = max(0.0, float(fc.demand_rate))
        g = growth.get(key.app)
        out[key] = OperatorSizing(
            current=len(view.instances),
            rate=rate,
            kappa=max(0.0, float(fc.kappa)),
            unreachable=any(
                demands[k].reason == "latency-unreachable" for k in view.instances if k in demands
            ),
            rate_ahead=rate * (1 + g) if g is not None else None,
            lookahead=lookahead,
        )
    return out


def offered_growth(views: Mapping[OperatorKey, OperatorView], lookahead: int) -> dict[str, float]:
    """Per application whose offered load rises: by what share its source
    operators' arrivals grow over ``lookahead`` slots after the next one, along
    their least-squares line through the view's slots.

    The sources' arrivals, not each operator's own: an operator downstream of one
    that drains a backlog sees a burst of arrivals that rises and falls with the
    backlog, and a raise for it would pause the operator for nothing. A rise
    counts only from ``TREND_MIN_SLOTS`` slots on and where the slope exceeds
    ``TREND_Z`` standard errors of a Poisson stream's counts at those rates:
    two or three slots of a steady stream tilt by chance."""
    # Sources grouped by their number of slots, each group one matrix (an epoch
    # at cluster size has hundreds of sources, nearly all with phi slots).
    groups: dict[int, list[OperatorView]] = {}
    for view in views.values():
        n = len(view.arrivals)
        if not view.upstream and n >= TREND_MIN_SLOTS:
            groups.setdefault(n, []).append(view)
    rise: dict[str, float] = {}
    level: dict[str, float] = {}
    for n, group in groups.items():
        x = np.arange(n, dtype=float)
        w = (x - x.mean()) / np.sum((x - x.mean()) ** 2)
        y = np.array([v.arrivals for v in group], dtype=float)
        seconds = np.maximum(np.array([v.seconds for v in group], dtype=float), 1e-9)
        slope = y @ w
        # Var(count / seconds) = rate / seconds for Poisson counts.
        se = np.sqrt((np.maximum(y, 0.0) / seconds) @ (w * w))
        next_slot = np.maximum(0.0, y.mean(axis=1) + slope * (n - x.mean()))
        up = np.where(slope > TREND_Z * se, slope * lookahead, 0.0)
        for view, r, lv in zip(group, up.tolist(), next_slot.tolist(), strict=True):
            app = view.key.app
            rise[app] = rise.get(app, 0.0) + r
            level[app] = level.get(app, 0.0) + lv
    return {app: r / level[app] for app, r in rise.items() if r > 0 and level[app] > 0}


def model_for(
    key: OperatorKey, models: Mapping[OperatorKey | str, PerformanceModel] | None
) -> PerformanceModel | None:
    """The operator's model, keyed by OperatorKey, "APP/OPERATOR" or the operator's name."""
    if not models:
        return None
    for k in (key, f"{key.app}/{key.operator}", key.operator):
        m = models.get(k)
        if m is not None:
            return m
    return None


def _step_want(s: OperatorSizing, max_cores: float, lower_util: float) -> tuple[int, str]:
    # The predicted arrivals, not a backlog: a queue left by a pause drains on its
    # own, and an instance added for it would pause the operator again.
    per = s.load_cores / s.current
    if per > max_cores * (1 + _EPS):
        return s.current + 1, (
            f"an instance needs {per:.2f} cores for the predicted load > "
            f"max_instance_cores {max_cores:g}"
        )
    if s.unreachable:
        return s.current + 1, f"latency target unreachable with caps at {max_cores:g} cores"
    # A rescale pauses the operator, and the tuples that arrive meanwhile wait
    # through the pause and the catch-up after it: on a rising load the same
    # step costs the fewer late tuples the earlier it is taken.
    if s.rate_ahead is not None:
        per_ahead = s.rate_ahead * s.kappa / s.current
        ahead = f"the arrivals' trend reaches {s.rate_ahead:.1f}/s within {s.lookahead} slot(s)"
        if per_ahead > max_cores * (1 + _EPS):
            return s.current + 1, (
                f"{ahead}: an instance would need {per_ahead:.2f} cores > "
                f"max_instance_cores {max_cores:g}"
            )
        if s.need_ahead is not None and s.need_ahead > max_cores * (1 + _EPS):
            return s.current + 1, (
                f"{ahead}: the latency target would need {s.need_ahead:.2f} cores per "
                f"instance > max_instance_cores {max_cores:g}"
            )
    if s.current > 1:
        fewer = s.load_cores / (s.current - 1)
        if fewer > lower_util * max_cores:
            return s.current, "load fits the instances running"
        # The same band for the latency need as for the load: an operator lowered
        # to just under the raise threshold is raised again by the next wobble,
        # and each change pauses it.
        if s.need_one_fewer is not None and s.need_one_fewer > lower_util * max_cores:
            return s.current, (
                f"with one instance fewer the latency target would need "
                f"{s.need_one_fewer:.2f} cores per instance > {lower_util:g} x {max_cores:g}"
            )
        return s.current - 1, (
            f"{s.current - 1} instance(s) would carry {s.load_cores:.2f} cores at "
            f"{fewer:.2f} each <= {lower_util:g} x {max_cores:g}"
        )
    return s.current, "load fits the instances running"


def _mba_want(s: OperatorSizing, model: PerformanceModel) -> tuple[int, str]:
    threads, cpu, _ = _mba_task(s.rate, model)
    bundle, peak = model.best
    return max(1, threads), (
        f"MBA: {threads} thread(s) carry {s.rate:.1f}/s (bundles of {bundle} at "
        f"{peak:.1f}/s, {cpu:.0f}% of a slot in all)"
    )


def decide_parallelism(
    inputs: Mapping[OperatorKey, OperatorSizing],
    below: Mapping[OperatorKey, int],
    *,
    limits: Callable[[OperatorKey], tuple[int, int]],
    max_instance_cores: float,
    lower_utilization: float,
    patience: int,
    models: Mapping[OperatorKey | str, PerformanceModel] | None = None,
    raise_together: bool = True,
) -> tuple[dict[OperatorKey, ParallelismDecision], dict[OperatorKey, int]]:
    """Decisions per operator and the new count of epochs in a row each wanted fewer.

    ``below`` is that count from the last epoch (operators missing start at 0).
    ``raise_together``: see :func:`_raise_with_application`.
    """
    if not (math.isfinite(max_instance_cores) and max_instance_cores > 0):
        raise ValueError(f"max_instance_cores must be > 0, got {max_instance_cores!r}")
    decisions: dict[OperatorKey, ParallelismDecision] = {}
    new_below: dict[OperatorKey, int] = {}
    for key, s in inputs.items():
        lo, hi = limits(key)
        model = model_for(key, models)
        if model is not None:
            rule = "mba"
            want, why = _mba_want(s, model)
        else:
            rule = "step"
            want, why = _step_want(s, max_instance_cores, lower_utilization)
        bounded = min(max(want, lo), hi)
        if bounded != want:
            why += f"; held to the operator's limits [{lo}, {hi}]"
        count = 0
        if s.current < lo or s.current > hi:
            decided = min(max(s.current, lo), hi)
            why = f"{s.current} instance(s) outside the operator's limits [{lo}, {hi}]"
        elif bounded > s.current:
            decided = bounded
        elif bounded < s.current:
            count = below.get(key, 0) + 1
            if count >= patience:
                decided, count = bounded, 0
            else:
                decided = s.current
                why += f"; lowering held ({count} of {patience} epochs)"
        else:
            decided = s.current
        decisions[key] = ParallelismDecision(s.current, decided, rule, why, want)
        if count:
            new_below[key] = count
    if raise_together:
        _raise_with_application(
            decisions, inputs, new_below, limits, max_instance_cores * lower_utilization
        )
    return decisions, new_below


def _raise_with_application(
    decisions: dict[OperatorKey, ParallelismDecision],
    inputs: Mapping[OperatorKey, OperatorSizing],
    below: dict[OperatorKey, int],
    limits: Callable[[OperatorKey], tuple[int, int]],
    busy_cores: float,
) -> None:
    """One more instance, in the same epoch, for every other operator of an
    application that gains one, where the operator's instances each carry more
    than ``busy_cores`` (rule ``step`` only: MBA's count is the model's).

    A rescale pauses what it touches (on Flink, the whole job), and on a rising
    load the busy operators of an application come due one after another:
    together they pause once. The threshold is the lowering band's, so an
    operator raised this way is not a candidate to lose the instance again."""
    raising: dict[str, OperatorKey] = {}
    for key, d in decisions.items():
        if d.decided > d.current:
            raising.setdefault(key.app, key)
    for key, d in list(decisions.items()):
        by = raising.get(key.app)
        if by is None or d.decided != d.current or d.rule != "step":
            continue
        s = inputs[key]
        lo, hi = limits(key)
        per = s.load_cores / s.current
        if not (lo <= s.current < hi) or per <= busy_cores:
            continue
        decisions[key] = replace(
            d,
            decided=s.current + 1,
            reason=(
                f"{d.reason}; one more with {by} (each instance carries {per:.2f} cores "
                f"> {busy_cores:.2g}, the lowering band)"
            ),
        )
        below.pop(key, None)
