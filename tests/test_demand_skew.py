"""Demand follows each instance's share of its operator's arrivals.

Fields grouping sends all of a key's tuples to one instance, so an operator's
load over its instances is as uneven as its keys hash: the HTTP monitor's 10
ISPs land 4, 4, 2 and 0 on four instances. Splitting the operator's demand
evenly would starve the busiest instance and give CPU to one no key reaches.
"""

from __future__ import annotations

from collections import deque
from types import SimpleNamespace

import pytest

from controller.model import InstanceHistory, InstanceKey, InstanceSlot, OperatorKey
from controller.stages.demand import RateDemand, WithLatencyTarget, instance_demands
from controller.stages.evaluate import evaluate
from controller.stages.forecast import OperatorForecast

OP = OperatorKey("app", "isp")


def _cluster(arrivals_per_instance: list[float], slots: int = 4) -> SimpleNamespace:
    """One operator whose instance i receives ``arrivals_per_instance[i]`` tuples per 1-s slot."""
    histories = {}
    for i, arrivals in enumerate(arrivals_per_instance):
        key = InstanceKey("app", "isp", i)
        h = InstanceHistory(key, "n1", "w", True, (), deque(maxlen=8))
        for s in range(slots):
            h.add(
                InstanceSlot(
                    key=key,
                    node="n1",
                    worker="w",
                    stateful=True,
                    slot=s,
                    timestamp=1000.0 + s,
                    seconds=1.0,
                    arrivals=arrivals,
                    executed=arrivals,
                    emitted=0.0,
                    cpu_seconds=arrivals * 0.001,
                    queue_length=0.0,
                    latency_sum_seconds=0.0,
                    latency_count=0,
                    service_seconds=arrivals * 0.001,
                    cap_cores=0.5,
                    throttled_seconds=0.0,
                )
            )
        histories[key] = h
    return SimpleNamespace(histories=histories)


def _forecast(rate: float) -> OperatorForecast:
    return OperatorForecast(OP, rate, "linear_trend", {"linear_trend": rate}, 0.001, 0.0)


def test_evaluate_measures_each_instances_share_of_the_arrivals():
    view = evaluate(_cluster([400.0, 400.0, 200.0, 0.0]), 4)[OP]
    assert view.share_by_instance == pytest.approx(
        {InstanceKey("app", "isp", i): s for i, s in enumerate([0.4, 0.4, 0.2, 0.0])}
    )
    assert [view.load_weight(k) for k in view.instances] == pytest.approx([1.6, 1.6, 0.8, 0.0])


def test_an_operator_with_no_arrivals_is_split_evenly():
    view = evaluate(_cluster([0.0, 0.0]), 4)[OP]
    assert view.share_by_instance == {}
    assert [view.load_weight(k) for k in view.instances] == [1.0, 1.0]


def test_rate_and_latency_demand_follow_the_share_and_keep_the_operators_total():
    view = evaluate(_cluster([400.0, 400.0, 200.0, 0.0]), 4)[OP]
    fc = _forecast(1000.0)
    rate = RateDemand().estimate(view, fc)
    cores = [rate[k].cores for k in view.instances]
    # 1,000 tuples/s at 1 ms each is one core: 0.4, 0.4, 0.2 and nothing.
    assert cores == pytest.approx([0.4, 0.4, 0.2, 0.0])
    assert sum(cores) == pytest.approx(1.0)
    # The latency need (per instance for an even split) scales the same way:
    # every instance at the utilisation the even split would have had.
    need = {OP: 0.3}
    latency = WithLatencyTarget(RateDemand(), need, max_instance_cores=1.0).estimate(view, fc)
    assert [latency[k].cores for k in view.instances] == pytest.approx([0.48, 0.48, 0.24, 0.0])
    assert [latency[k].reason for k in view.instances][:3] == ["latency"] * 3
    # The vectorised composition gives the same demands (plus the floor).
    got = instance_demands({OP: view}, {OP: fc}, need, 1.0, 2.0, 0.01)
    assert [got[k].cores for k in view.instances] == pytest.approx([0.48, 0.48, 0.24, 0.01])
    assert got[view.instances[3]].reason == "floor"


def test_a_hot_instance_is_clipped_at_one_instances_most():
    view = evaluate(_cluster([900.0, 100.0]), 4)[OP]
    d = WithLatencyTarget(RateDemand(), {OP: 0.7}, max_instance_cores=1.0).estimate(
        view, _forecast(1000.0)
    )
    hot, cold = (d[k] for k in view.instances)
    assert (hot.cores, hot.reason) == (1.0, "latency-unreachable")
    assert cold.cores == pytest.approx(0.14)
