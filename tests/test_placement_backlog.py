"""Placement judges an instance by its demand less the part that drains its
queue: a move pauses the instance, so moving for a backlog only adds to it.
Real controller (its epoch and its placement thread), synthetic reports."""

from __future__ import annotations

import pytest

from controller.core import Controller
from controller.placement.stage import demands_from_record
from dsched.ids import InstanceKey
from tests.test_controller_epoch import SyntheticNode, config


@pytest.fixture
def clock():
    return [2_000_000.0]


class QueuedNode(SyntheticNode):
    """SyntheticNode whose every instance also reports ``queue`` tuples waiting."""

    queue = 0

    def report(self, now, rates, latency_s=0.02):
        sent = []
        real = self.controller.on_report

        def keep(report):
            sent.append(report)

        self.controller.on_report = keep
        try:
            super().report(now, rates, latency_s)
        finally:
            self.controller.on_report = real
        for report in sent:
            for sample in report.instances:
                sample.queue_length = self.queue
            real(report)


def _run(tmp_path, clock, queue):
    # n1 has 0.6 cores: 120 roots/s need about 0.3 of them, and a queue of
    # 3,000 tuples per instance drained within one 1-s slot asks for several more.
    c = Controller(
        config(tmp_path, node_capacity_cores={"n1": 0.6, "n2": 2.0}, placement="liu"),
        clock=lambda: clock[0],
    )
    busy = QueuedNode(c, "n1", cores=2.0)
    busy.queue = queue
    idle = SyntheticNode(c, "n2", cores=2.0)
    records = []
    for _ in range(6):
        clock[0] += 1.0
        busy.report(clock[0], {"wc": 120})
        idle.report(clock[0], {})
        records.append(c.run_epoch())
        assert c.wait_placement(timeout=30)
    c.stop()
    # A plan shows in the record after it was made only: every record counts.
    return records


def test_a_backlog_alone_moves_nothing(tmp_path, clock):
    records = _run(tmp_path, clock, queue=3000)
    rows = records[-1]["instances"]
    # The backlog is in the demand, and over the node's room...
    assert all(r["backlog_cores"] > 0 for r in rows)
    assert sum(r["demand_cores"] for r in rows if r["node"] == "n1") > 0.6
    # ...but what placement judges fits, so nothing is planned.
    assert sum(r["demand_cores"] - r["backlog_cores"] for r in rows) < 0.5
    assert not any(r["placement"].get("planned") for r in records)


def test_without_the_backlog_term_the_same_node_is_not_over(tmp_path, clock):
    records = _run(tmp_path, clock, queue=0)
    assert all(r["backlog_cores"] == 0 for r in records[-1]["instances"])
    assert not any(r["placement"].get("planned") for r in records)


def test_a_replay_leaves_the_backlog_out_as_the_controller_does():
    row = {
        "app": "wc",
        "operator": "split",
        "instance": 0,
        "node": "n1",
        "demand_cores": 0.9,
        "backlog_cores": 0.6,
        "cap_cores": 0.5,
    }
    key = InstanceKey("wc", "split", 0)
    assert demands_from_record({"instances": [row]})[key].cores == pytest.approx(0.3)
    # Another field is taken as it is; a record from before the field, whole.
    assert demands_from_record({"instances": [row]}, "cap_cores")[key].cores == 0.5
    del row["backlog_cores"]
    assert demands_from_record({"instances": [row]})[key].cores == 0.9
