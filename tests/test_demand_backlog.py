"""A backlog is drained only where it waits for CPU.

An instance whose queue stands while it leaves most of its cap idle is held up
by something else (on the HTTP monitor: a hot key behind a hop whose wall time
per tuple is twenty times its CPU); a drain term there buys nothing, and where a
node is divided it crowds out the neighbours that do need CPU.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from controller.config import ConfigError, ControllerConfig
from controller.core import Controller
from controller.model import OperatorKey
from controller.stages.demand import RateDemand, WithBacklogDrain, cpu_starved, instance_demands
from controller.stages.evaluate import evaluate
from controller.stages.forecast import OperatorForecast
from dsched_pb import dsched_pb2 as pb
from tests.test_controller_epoch import config
from tests.view_support import one_operator_cluster

OP = OperatorKey("app", "isp")
QUEUE = 300.0
KAPPA = 0.001


def _cluster(usage_and_cap: list[tuple[float, float | None]]) -> SimpleNamespace:
    """One operator; instance i used ``usage_and_cap[i][0]`` cores of its cap
    ``usage_and_cap[i][1]`` in every 1-s slot, with ``QUEUE`` tuples waiting."""
    return one_operator_cluster(
        [{"arrivals": 100.0, "cpu": u, "cap": c, "queue": QUEUE} for u, c in usage_and_cap]
    )


def _forecast() -> OperatorForecast:
    return OperatorForecast(OP, 300.0, "linear_trend", {"linear_trend": 300.0}, KAPPA, 0.0)


@pytest.mark.parametrize(
    ("usage", "cap", "min_usage", "starved"),
    [
        (0.19, 0.2, 0.5, True),
        (0.1, 0.2, 0.5, True),  # exactly half: waits for CPU
        (0.09, 0.2, 0.5, False),
        (0.0, 0.2, 0.5, False),
        (0.01, None, 0.5, True),  # uncapped: nothing says CPU is not short
        (None, 0.2, 0.5, True),  # not measured
        (0.0, 0.2, 0.0, True),  # 0: every queue
        (0.19, 0.2, 1.0, False),
    ],
)
def test_cpu_starved(usage, cap, min_usage, starved):
    assert cpu_starved(usage, cap, min_usage) is starved


def test_the_drain_skips_an_instance_that_leaves_its_cap_idle():
    # busy at 95 % of its cap, idle at 20 %, uncapped.
    view = evaluate(_cluster([(0.19, 0.2), (0.04, 0.2), (0.04, None)]), 4)[OP]
    fc = _forecast()
    drain = QUEUE * KAPPA / 2.0
    gated = WithBacklogDrain(RateDemand(), 2.0, min_usage=0.5).estimate(view, fc)
    assert [gated[k].backlog_cores for k in view.instances] == pytest.approx([drain, 0.0, drain])
    assert [gated[k].cores for k in view.instances] == pytest.approx(
        [0.1 + drain, 0.1, 0.1 + drain]
    )
    # The paper's rule (0) drains every queue.
    every = WithBacklogDrain(RateDemand(), 2.0).estimate(view, fc)
    assert [every[k].backlog_cores for k in view.instances] == pytest.approx([drain] * 3)
    # The vectorised composition gates the same instances.
    got = instance_demands({OP: view}, {OP: fc}, None, 1.0, 2.0, 0.01, drain_min_usage=0.5)
    assert [got[k].backlog_cores for k in view.instances] == pytest.approx([drain, 0.0, drain])


@pytest.mark.parametrize("value", [-0.1, 1.5, float("nan"), True, "0.5"])
def test_a_share_outside_0_1_is_refused_with_its_key(tmp_path, value):
    with pytest.raises(ConfigError, match="backlog_drain_min_usage"):
        ControllerConfig(state_dir=tmp_path, backlog_drain_min_usage=value).validate()


def _report(controller, now, slot, cpu_totals):
    """Two instances of one operator, each with 500 tuples queued under a cap of
    0.2 core: instance 0 used 0.02 core per slot, instance 1 0.19."""
    samples = []
    for i, use in enumerate((0.02, 0.19)):
        cpu_totals[i] += use
        samples.append(
            pb.InstanceSample(
                key=pb.InstanceKey(app="hot", operator="isp", instance=i),
                received_total=100 * slot,
                executed_total=100 * slot,
                emitted_total=0,
                cpu_seconds_total=cpu_totals[i],
                service_seconds_total=cpu_totals[i],
                queue_length=500,
                cap_cores=0.2,
            )
        )
    controller.on_report(
        pb.NodeReport(node_id="n1", slot=slot, timestamp=now, slot_seconds=1.0, instances=samples)
    )


@pytest.mark.parametrize("min_usage", [0.5, 0.0])
def test_the_controller_drains_only_queues_that_wait_for_cpu(tmp_path, min_usage):
    clock = [1_000_000.0]
    c = Controller(config(tmp_path, backlog_drain_min_usage=min_usage), clock=lambda: clock[0])
    c.on_hello(pb.Hello(node_id="n1", cpu_capacity_cores=1.0, slot_seconds=1.0))
    totals = [0.0, 0.0]
    rec = None
    for slot in range(1, 6):
        clock[0] += 1.0
        _report(c, clock[0], slot, totals)
        rec = c.run_epoch()
    c.stop()
    backlog = {i["instance"]: i["backlog_cores"] for i in rec["instances"]}
    assert backlog[1] > 0
    if min_usage:
        assert backlog[0] == 0
    else:
        assert backlog[0] == pytest.approx(backlog[1])
