"""The epoch's array code equals the per-instance code it replaced, on random inputs.

Each stage that now works on arrays (evaluate, the trend and cost of
forecast, instance demands, hysteresis and quantization, latency estimates,
the decision record) is checked against the per-instance semantics: either the
scalar function that still exists (``LinearTrend``, ``cpu_per_tuple``,
``step``, ``quantize``, the demand estimators) or, where the loop itself was
replaced, that loop kept here as the reference. Equality is exact: the array
code performs the same floating-point operations in the same order.

The store's writer thread is checked too: what a reader asks for after a write
is there, and the caps committed by ``save_caps`` are what a new process finds.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Container, Mapping
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controller.edges.store import StateStore
from controller.epoch import EpochResult, build_estimator
from controller.model import InstanceHistory, InstanceSlot
from controller.record import _ms
from controller.stages.columns import KeyedColumn, values_in_order
from controller.stages.demand import (
    MAX_INSTANCE_CORES,
    _latency_model,
    _operators_by_app,
    estimate_latency_seconds,
    instance_demands,
)
from controller.stages.evaluate import Observed, OperatorView, SlotRows, evaluate
from controller.stages.forecast import OperatorForecast, operator_columns, operator_cost
from controller.stages.hysteresis import (
    CAP_ROUNDINGS,
    HysteresisState,
    HysteresisStep,
    apply_hysteresis,
    quantize,
    quantize_many,
    step,
)
from dsched.ids import InstanceKey, OperatorKey
from predict.cost import STRATEGIES as COST_STRATEGIES
from predict.cost import cpu_per_tuple, cpu_per_tuple_many
from predict.load import LinearTrend, linear_trend_many

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# ------------------------------------------------------------ random clusters
DAGS = {
    "chain": {"source": (), "split": ("source",), "count": ("split",)},
    "diamond": {"src": (), "left": ("src",), "right": ("src",), "join": ("left", "right")},
    "single": {"only": ()},
}


@st.composite
def clusters(draw) -> SimpleNamespace:
    """Instance histories of a few apps, with uneven slot counts, idle slots,
    missing caps and throttling, integer counts and float seconds."""
    histories: dict[InstanceKey, InstanceHistory] = {}
    napps = draw(st.integers(1, 3))
    count = st.integers(0, 5000)
    secs = st.floats(0.5, 12.0)
    cpu = st.floats(0.0, 20.0)
    for a in range(napps):
        dag = DAGS[draw(st.sampled_from(sorted(DAGS)))]
        for op, up in dag.items():
            for i in range(draw(st.integers(1, 4))):
                key = InstanceKey(f"app{a}", op, i)
                node = f"n{draw(st.integers(0, 3))}"
                h = InstanceHistory(key, node, "w", False, up, deque(maxlen=6))
                t = 1000.0 + draw(st.floats(0, 5))
                for s in range(draw(st.integers(1, 6))):
                    sec = draw(secs)
                    t += sec
                    executed = draw(count)
                    h.add(
                        InstanceSlot(
                            key=key,
                            node=node,
                            worker="w",
                            stateful=draw(st.booleans()),
                            slot=s,
                            timestamp=t,
                            seconds=sec,
                            arrivals=draw(count),
                            executed=executed,
                            emitted=draw(count),
                            cpu_seconds=draw(cpu),
                            queue_length=float(draw(count)),
                            latency_sum_seconds=draw(st.floats(0, 50)),
                            latency_count=draw(st.integers(0, 3)),
                            service_seconds=draw(cpu),
                            cap_cores=draw(st.none() | st.floats(0.05, 4)),
                            throttled_seconds=draw(st.none() | st.floats(0, 2)),
                            upstream=up,
                        )
                    )
                histories[key] = h
    return SimpleNamespace(histories=histories)


def assert_views_equal(got: dict, want: dict) -> None:
    assert list(got) == list(want)
    for k, w in want.items():
        g = got[k]
        for f in ("seconds", "arrivals", "executed", "emitted", "cpu_seconds", "queue"):
            assert np.array_equal(getattr(g, f), getattr(w, f)), (k, f)
        for f in (
            "key",
            "instances",
            "nodes",
            "stateful",
            "upstream",
            "queue_by_instance",
            "usage_by_instance",
            "cap_by_instance",
            "throttled_by_instance",
            "latency_ms",
            "service_ms",
            "last_timestamp",
            "share_by_instance",
        ):
            assert getattr(g, f) == getattr(w, f), (k, f)


def forecasts_for(views, data) -> dict[OperatorKey, OperatorForecast]:
    rate = st.floats(0, 5000)
    kappa = st.floats(0, 0.01) | st.just(0.0)
    return {
        k: OperatorForecast(k, data.draw(rate), "linear_trend", {}, data.draw(kappa)) for k in views
    }


# ------------------------------------------------------------ scalar references
# The per-instance loops the array code replaced, as they were.


def evaluate_scalar(
    cluster: Observed, phi: int, exclude: Container[InstanceKey] = ()
) -> dict[OperatorKey, OperatorView]:
    """evaluate as it was: one operator, one instance, one slot at a time."""
    by_op: dict[OperatorKey, list] = {}
    for h in cluster.histories.values():
        if h.slots and h.key not in exclude:
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
        arrived = [sum(s.arrivals for s in r) for r in rows]
        total = sum(arrived)
        svc_count = sum(s.executed for r in rows for s in r)
        views[op] = OperatorView(
            key=op,
            instances=[h.key for h in hists],
            nodes={h.key: h.node for h in hists},
            stateful=any(h.stateful for h in hists),
            upstream=hists[0].upstream,
            seconds=secs,
            arrivals=per_second("arrivals"),
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
            share_by_instance={h.key: a / total for h, a in zip(hists, arrived, strict=True)}
            if total > 0
            else {},
        )
    return views


def estimate_latency_seconds_scalar(
    views: Mapping[OperatorKey, OperatorView],
    forecasts: Mapping[OperatorKey, OperatorForecast],
    caps: Mapping[InstanceKey, float],
    arrival_scv: float = 1.0,
    service_scv: float = 1.0,
    max_instance_cores: float = MAX_INSTANCE_CORES,
) -> dict[str, float]:
    """Allen–Cunneen critical-path latency of each application under ``caps``
    (inf when an operator's caps cannot keep up with its predicted arrivals)."""
    out = {}
    for app, ordered in _operators_by_app(views).items():
        # Every core is a floor here: the model's extra CPU is zero.
        floors = np.array(
            [
                sum(
                    min(caps.get(i, max_instance_cores), max_instance_cores)
                    for i in views[k].instances
                )
                for k in ordered
            ]
        )
        model = _latency_model(
            views, forecasts, ordered, np.zeros(len(ordered)), floors, arrival_scv, service_scv
        )
        out[app] = float(model.latency_seconds(np.zeros(1))[0])
    return out


def build_record_scalar(
    result: EpochResult,
    *,
    mode: str,
    slot_seconds: float,
    placement: dict[str, Any],
    actuator: str,
    acted: Any,
    rejected: dict[str, int],
) -> dict[str, Any]:
    """The record of ``result`` with what the edges did with it."""
    epoch, now = result.epoch, result.now
    views, forecasts, demands = result.views, result.forecasts, result.demands
    alloc, steps, classes, budgets = result.alloc, result.steps, result.classes, result.budgets
    estimates, predicted_violation = result.estimates, result.predicted_violation
    capacity, room, peaks = result.capacity, result.room, result.peaks
    operators = []
    measured: dict[str, float] = {}
    for op, v in views.items():
        fc = forecasts[op]
        if v.latency_ms is not None:
            # End-to-end latency is reported where root tuples complete (sinks).
            measured[op.app] = max(measured.get(op.app, 0.0), v.latency_ms)
        operators.append(
            {
                "app": op.app,
                "operator": op.operator,
                "instances": len(v.instances),
                "arrival_rate": float(v.arrivals[-1]) if len(v.arrivals) else 0.0,
                "predicted_rate": fc.rate,
                "predictor": fc.predictor,
                "candidates": fc.candidates,
                "kappa": fc.kappa,
                "selectivity": v.selectivity,
                "demand_cores": sum(demands[k].cores for k in v.instances),
                "cap_cores": sum(steps[k].cap for k in v.instances),
                "usage_cores": v.usage_cores,
                "queue": float(v.queue[-1]) if len(v.queue) else 0.0,
                "latency_ms": v.latency_ms,
                "service_ms": v.service_ms,
                "latency_budget_ms": _ms(budgets.get(op)),
                "reason": ", ".join(sorted({demands[k].reason for k in v.instances})),
            }
        )
    instances = []
    cuts = []
    # Views are in key order and so are their instances: no sort, no lookups by view.
    for view in views.values():
        for k in view.instances:
            s = steps[k]
            d = demands[k]
            cut = alloc.cut.get(k, 0.0)
            instances.append(
                {
                    "app": k.app,
                    "operator": k.operator,
                    "instance": k.instance,
                    "node": d.node,
                    "demand_cores": d.cores,
                    "demand_reason": d.reason,
                    "backlog_cores": d.backlog_cores,
                    "allocated_cores": alloc.cores[k],
                    "cut_cores": cut,
                    "cap_cores": s.cap,
                    "hysteresis": s.reason,
                    "usage_cores": view.usage_by_instance.get(k, 0.0),
                    "cap_in_force": view.cap_by_instance.get(k),
                    "throttled_seconds": view.throttled_by_instance.get(k),
                    "queue": view.queue_by_instance.get(k, 0.0),
                    "arrival_share": view.share_by_instance.get(k),
                }
            )
            if k in peaks:
                instances[-1]["peak_demand_cores"] = peaks[k]
            if k in result.placement_demands:
                instances[-1]["placement_demand_cores"] = result.placement_demands[k]
            if cut > 1e-9:
                cuts.append(
                    {
                        "app": k.app,
                        "operator": k.operator,
                        "instance": k.instance,
                        "node": d.node,
                        "cut_cores": cut,
                        "reason": alloc.cut_reason.get(k, ""),
                    }
                )
    held = []
    for k, u in sorted(result.held.items()):
        step = steps.get(k)
        held.append(
            {
                "app": k.app,
                "operator": k.operator,
                "instance": k.instance,
                "node": u.node,
                "engine": u.engine,
                "cap_cores": step.cap if step is not None else None,  # None: uncapped
                "hysteresis": "held",
                "reason": u.reason,
            }
        )
    held_notes = [
        f"held {n} instance(s) at their caps: {why}"
        for why, n in sorted(Counter(row["reason"] for row in held).items())
    ]
    caps_by_app: dict[str, float] = {}
    for row in instances:
        caps_by_app[row["app"]] = caps_by_app.get(row["app"], 0.0) + row["cap_cores"]
    apps = []
    for app, a in sorted(alloc.apps.items()):
        qos = classes[app]
        lat = measured.get(app)
        apps.append(
            {
                "app": app,
                "class": qos.name,
                "weight": qos.weight,
                "target_ms": qos.target_latency_ms,
                "max_violation_ratio": qos.max_violation_ratio,
                "demand_cores": a.demand_cores,
                "floor_cores": a.floor_cores,
                "allocated_cores": a.allocated_cores,
                "cap_cores": caps_by_app.get(app, 0.0),
                "cut_cores": a.cut_cores,
                "dp_units": a.dp_units,
                "latency_ms": lat,
                "latency_estimate_ms": _ms(estimates.get(app)),
                "predicted_violation_ratio": predicted_violation.get(app),
                "violation": lat is not None and lat > qos.target_latency_ms,
                "latency_gain": result.latency_gains.get(app),
            }
        )
    dp = alloc.dp
    rec = alloc.recommendation
    return {
        "epoch": epoch,
        "timestamp": now,
        "mode": mode,
        "slot_seconds": slot_seconds,
        "capacity_cores": dict(capacity),
        "usable_cores": dict(room),
        "operators": operators,
        "instances": instances,
        "apps": apps,
        "cuts": cuts,
        "dp": None
        if dp is None
        else {
            "unit_cores": dp.unit_cores,
            "capacity_units": dp.capacity_units,
            "value": dp.value,
            "seconds": dp.seconds,
            "solved": dp.solved,
        },
        "node_recommendation": None
        if rec is None
        else {
            "nodes_delta": rec.nodes_delta,
            "gain": rec.gain,
            "value_now": rec.value_now,
            "value_one_more": rec.value_one_more,
            "value_one_fewer": rec.value_one_fewer,
            "reason": rec.reason,
        },
        "held": held,
        "placement": placement,
        "notes": [*alloc.notes, *held_notes],
        "actuator": actuator,
        "sent": acted.sent,
        "unreachable": acted.unreachable,
        "rejected": rejected,
    }


def apply_hysteresis_scalar(
    allocated, memory, theta, max_cap, band=0.0, lower_after=0, rounding="margin", falls=0
):
    steps = {}
    for k, cores in allocated.items():
        state = memory.get(k, HysteresisState())
        s = step(state, cores, theta, band, lower_after, rounding, falls)
        limit = max_cap.get(k, math.inf)
        if s.cap > limit:
            s = HysteresisStep(limit, s.changed, s.reason, s.state._replace(cap=limit))
        steps[k] = s
    return steps


# ------------------------------------------------------------ tests
@SETTINGS
@given(clusters(), st.integers(1, 7), st.data())
def test_evaluate_equals_the_per_instance_loop(cluster, phi, data):
    keys = sorted(cluster.histories)
    exclude = set(data.draw(st.lists(st.sampled_from(keys), max_size=2)))
    want = evaluate_scalar(cluster, phi, exclude)
    assert_views_equal(evaluate(cluster, phi, exclude), want)
    # With the slot cache: a first call fills it, a new slot per instance
    # later, the views still equal a fresh read.
    rows = SlotRows()
    assert_views_equal(evaluate(cluster, phi, exclude, rows=rows), want)
    for h in list(cluster.histories.values())[::2]:
        last = h.slots[-1]
        h.add(last._replace(timestamp=last.timestamp + 1, arrivals=7))
    assert_views_equal(
        evaluate(cluster, phi, exclude, rows=rows), evaluate_scalar(cluster, phi, exclude)
    )
    # Unchanged, then a new instance (the cache no longer lines up), then a
    # slot for every instance.
    assert_views_equal(
        evaluate(cluster, phi, exclude, rows=rows), evaluate_scalar(cluster, phi, exclude)
    )
    some = next(iter(cluster.histories.values()))
    key = InstanceKey(some.key.app, some.key.operator, 99)
    late = InstanceHistory(key, "n9", "w", False, some.upstream, deque(maxlen=6))
    late.add(some.slots[-1]._replace(key=key))
    cluster.histories[key] = late
    for _ in range(2):
        assert_views_equal(
            evaluate(cluster, phi, exclude, rows=rows), evaluate_scalar(cluster, phi, exclude)
        )
        for h in cluster.histories.values():
            last = h.slots[-1]
            h.add(last._replace(timestamp=last.timestamp + 1))


@SETTINGS
@given(
    st.integers(1, 9),
    st.integers(1, 8),
    st.lists(st.floats(0, 1e6), min_size=9 * 40, max_size=9 * 40),
)
def test_linear_trend_many_equals_linear_trend(n, window, values):
    rows = np.array(values[: 40 * n]).reshape(40, n)
    got = linear_trend_many(rows, window)
    want = [LinearTrend(window=window).forecast(r, horizon=1)[0] for r in rows]
    assert got.tolist() == want


@SETTINGS
@given(
    st.integers(1, 9),
    st.integers(1, 8),
    st.lists(st.floats(0, 30), min_size=9 * 30, max_size=9 * 30),
    st.lists(st.sampled_from([0, 0, 1, 3, 250, 10_000]), min_size=9 * 30, max_size=9 * 30),
    st.sampled_from(COST_STRATEGIES),
)
def test_cpu_per_tuple_many_equals_cpu_per_tuple(n, window, cpu, tuples, strategy):
    c = np.array(cpu[: 30 * n]).reshape(30, n)
    t = np.array(tuples[: 30 * n], dtype=float).reshape(30, n)
    got = cpu_per_tuple_many(c, t, window, strategy=strategy)
    for i in range(30):
        if (t[i, -window:] > 0).any():
            assert got[i] == cpu_per_tuple(c[i], t[i], window, strategy=strategy)
        else:
            assert math.isnan(got[i])


def test_cpu_per_tuple_many_refuses_what_cpu_per_tuple_refuses():
    with pytest.raises(ValueError, match="cpu_seconds must be >= 0"):
        cpu_per_tuple_many(np.array([[1.0, -1.0]]), np.array([[1.0, 1.0]]))
    with pytest.raises(ValueError, match="strategy must be one of"):
        cpu_per_tuple_many(np.array([[1.0]]), np.array([[1.0]]), strategy="median")
    with pytest.raises(ValueError, match="non-finite"):
        linear_trend_many(np.array([[1.0, np.nan]]))


@SETTINGS
@given(clusters(), st.integers(1, 7), st.sampled_from(COST_STRATEGIES), st.data())
def test_operator_columns_equal_the_per_view_code(cluster, phi, strategy, data):
    views = evaluate(cluster, phi)
    memory = {k: data.draw(st.floats(0, 1)) for k in views if data.draw(st.booleans())}
    cols = operator_columns(views, phi, kappa_estimator=strategy)
    for k, v in views.items():
        assert cols.trend[k] == LinearTrend(window=phi).forecast(v.arrivals, horizon=1)[0]
        assert cols.selectivity[k] == v.selectivity
        assert cols.queue_change[k] == v.queue_change
        kappa, measured = operator_cost(v, phi, memory, strategy)
        assert (k in cols.kappa) == measured
        got = cols.kappa[k] if measured else memory.get(k, cols.cpu_window[k])
        assert got == kappa


@SETTINGS
@given(clusters(), st.data())
def test_instance_demands_equal_the_estimators(cluster, data):
    views = evaluate(cluster, 5)
    forecasts = forecasts_for(views, data)
    needs = (
        None
        if data.draw(st.booleans())
        else {k: data.draw(st.floats(0, 2)) for k in views if data.draw(st.booleans())}
    )
    cfg = SimpleNamespace(
        max_instance_cores=data.draw(st.sampled_from([0.5, 1.0, 2.0])),
        backlog_drain_slots=data.draw(st.sampled_from([0.5, 1.0, 3.0])),
        slot_seconds=10.0,
        min_cap_cores=data.draw(st.sampled_from([0.01, 0.05, 0.3])),
    )
    estimator = build_estimator(cfg, needs)
    want = {}
    for op, view in views.items():
        want.update(estimator.estimate(view, forecasts[op]))
    got = instance_demands(
        views,
        forecasts,
        needs,
        cfg.max_instance_cores,
        cfg.backlog_drain_slots * cfg.slot_seconds,
        cfg.min_cap_cores,
    )
    assert list(got) == list(want) and got == want


@SETTINGS
@given(
    st.lists(
        st.tuples(
            st.floats(0, 8) | st.sampled_from([0.0, 0.05, 0.15, 0.25, 0.35, 1.05]),
            st.sampled_from(["fresh", "resumed", "full"]),
            st.floats(0.05, 8),
            st.floats(0, 8),
            st.floats(0, 0.3),
            st.none() | st.floats(0.1, 8),
            st.integers(0, 5),
            st.integers(0, 4),
        ),
        min_size=1,
        max_size=60,
    ),
    st.sampled_from([0.05, 0.1, 0.2, 0.25]),
    st.sampled_from([0.0, 0.1, 0.25, 0.4]),
    st.sampled_from([0, 1, 4]),
    st.sampled_from(CAP_ROUNDINGS),
    st.sampled_from([0, 1, 3]),
)
def test_apply_hysteresis_equals_step_per_instance(
    rows, theta, band, lower_after, rounding, lower_after_falls
):
    allocated, memory, max_cap = {}, {}, {}
    for i, (demand, kind, cap, prev, acc, limit, stood, falls) in enumerate(rows):
        k = InstanceKey("a", "op", i)
        allocated[k] = demand
        if kind == "resumed":
            memory[k] = HysteresisState(cap=cap)
        elif kind == "full":
            memory[k] = HysteresisState(cap, prev, acc, stood, falls)
        if limit is not None:
            max_cap[k] = limit
    args = (band, lower_after, rounding, lower_after_falls)
    want = apply_hysteresis_scalar(allocated, memory, theta, max_cap, *args)
    assert apply_hysteresis(allocated, memory, theta, max_cap, *args) == want
    # The epoch passes columns; the answer is the same.
    keys = list(allocated)
    column = KeyedColumn(keys, [max_cap.get(k, math.inf) for k in keys])
    assert apply_hysteresis(allocated, memory, theta, column, *args) == want


@SETTINGS
@given(
    st.lists(
        st.floats(0, 64)
        | st.integers(0, 1280).map(lambda k: k * 0.05)
        | st.integers(0, 1280).map(lambda k: k * 0.05 + 1e-10),
        min_size=1,
        max_size=50,
    ),
    st.sampled_from([0.05, 0.1, 0.2, 0.25, 0.3]),
    st.sampled_from(CAP_ROUNDINGS),
)
def test_quantize_many_equals_quantize(demands, theta, rounding):
    want = [quantize(d, theta, rounding) for d in demands]
    assert quantize_many(np.array(demands), theta, rounding).tolist() == want


def test_quantize_many_refuses_what_quantize_refuses():
    with pytest.raises(ValueError, match="finite and >= 0"):
        quantize_many(np.array([0.1, -0.5]), 0.1)
    with pytest.raises(ValueError, match="theta"):
        quantize_many(np.array([0.1]), 0.0)
    with pytest.raises(ValueError, match="rounding must be one of margin, nearest"):
        quantize_many(np.array([0.1]), 0.1, "down")


@SETTINGS
@given(clusters(), st.data())
def test_estimate_latency_equals_the_per_app_models(cluster, data):
    views = evaluate(cluster, 5)
    forecasts = forecasts_for(views, data)
    keys = [k for v in views.values() for k in v.instances]
    caps = {k: data.draw(st.floats(0.01, 3)) for k in keys if data.draw(st.booleans())}
    want = estimate_latency_seconds_scalar(views, forecasts, caps, 1.0, 1.3, 1.0)
    got = estimate_latency_seconds(views, forecasts, caps, 1.0, 1.3, 1.0)
    assert list(got) == list(want)
    for app, w in want.items():
        assert got[app] == w or (math.isnan(got[app]) and math.isnan(w))


def test_the_decision_record_equals_the_per_instance_loop(tmp_path):
    """A whole controller epoch, its record rebuilt by the old loop from the same result."""
    from controller.core import Controller
    from controller.epoch import EpochInputs, run_epoch
    from controller.record import build_record
    from tests.test_controller_epoch import SyntheticNode, config

    clock = [1_000_000.0]
    c = Controller(config(tmp_path, placement="liu"), clock=lambda: clock[0])
    c.set_qos("gold-wc", "gold")
    node = SyntheticNode(c)
    for _ in range(6):
        clock[0] += 1.0
        node.report(clock[0], {"gold-wc": 250.0, "bronze-wc": 250.0})
        c.run_epoch()
    views = evaluate(c.cluster, c.config.phi)
    inputs = EpochInputs(
        c.epoch + 1,
        clock[0],
        views,
        {a: c.qos.class_of(a) for a in ("bronze-wc", "gold-wc")},
        c.node_capacity(),
    )
    result = run_epoch(inputs, c.memory.view(), c.config, c.allocator)
    acted = SimpleNamespace(sent=[], unreachable=[])
    kw: dict[str, Any] = dict(
        mode="dry-run",
        slot_seconds=1.0,
        placement={"strategy": "liu"},
        actuator="log",
        acted=acted,
        rejected={},
    )
    got, want = build_record(result, **kw), build_record_scalar(result, **kw)
    for part in want:
        assert got[part] == want[part], part
    assert got["cuts"], "the bronze app should be cut"
    assert any("peak_demand_cores" in i for i in got["instances"])
    assert any("placement_demand_cores" in i for i in got["instances"])
    c.stop()


# ------------------------------------------------------------ columns
def test_values_in_order_reads_aligned_mappings_and_looks_up_the_rest():
    keys = [InstanceKey("a", "op", i) for i in range(4)]
    d = {k: i for i, k in enumerate(keys)}
    assert values_in_order(d, keys) == [0, 1, 2, 3]
    assert values_in_order(d, keys[:2]) == [0, 1]  # a prefix of the mapping
    assert values_in_order(d, keys[::-1]) == [3, 2, 1, 0]
    assert values_in_order(d, [*keys, InstanceKey("b", "op", 0)], -1) == [0, 1, 2, 3, -1]
    col = KeyedColumn(keys, ["w", "x", "y", "z"])
    assert col[keys[2]] == "y" and col.get("nope", 5) == 5 and len(col) == 4
    assert dict(col) == dict(zip(keys, "wxyz", strict=True)) == col
    assert list(col.values()) == list("wxyz") and list(col.items())[0] == (keys[0], "w")


# ------------------------------------------------------------ the store
def test_decisions_written_off_the_epoch_thread_are_there_for_a_reader(tmp_path):
    store = StateStore(tmp_path)
    for e in range(1, 13):  # more than the writer's queue holds
        store.record_decision(e, float(e), "dry-run", {"epoch": e, "x": np.float64(0.5)})
        store.record_recommendation(e, float(e), 1, 2.0, "why")
    assert [r["epoch"] for r in store.decisions(20)] == list(range(1, 13))
    assert store.decisions(1)[0]["x"] == 0.5
    assert len(store.recommendations(20)) == 12
    store.record_decision(13, 13.0, "dry-run", {"epoch": 13})
    store.close()  # writes what is queued
    again = StateStore(tmp_path)
    assert again.decisions(1)[0]["epoch"] == 13
    again.close()


@settings(max_examples=25, deadline=None)
@given(
    st.lists(
        st.dictionaries(
            st.integers(0, 12).map(lambda i: InstanceKey("a", "op", i)),
            st.tuples(st.sampled_from(["n1", "n2"]), st.sampled_from([0.1, 0.2, 0.35])),
        ),
        min_size=1,
        max_size=6,
    )
)
def test_saved_caps_are_what_a_new_process_finds(tmp_path_factory, epochs):
    """Each save commits before it returns: a second connection (a restarted
    process) reads exactly the last caps saved, whatever changed in between."""
    d = tmp_path_factory.mktemp("caps")
    store = StateStore(d)
    for e, caps in enumerate(epochs, start=1):
        # The same instances in the same order, with some caps changed (the usual case).
        store.save_caps(e, caps)
        store.save_caps(e, {k: (n, c + 0.05) for k, (n, c) in caps.items()})
        reader = StateStore(d)  # the store is not closed: as after a crash
        assert reader.load_caps() == {k: (n, c + 0.05) for k, (n, c) in caps.items()}
        assert reader.get("epoch") == str(e)
        reader.close()
    store.close()
