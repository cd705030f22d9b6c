"""epoch_trigger = "reports": an epoch starts once every connected agent has
reported since the previous one began (no sooner than half a slot after it), and
at the latest one slot after it. Real epoch loop thread, reports in process."""

from __future__ import annotations

import threading
import time

from controller.core import Controller
from dsched_pb import dsched_pb2 as pb
from tests.controller_server_support import config, wait_until

SLOT = 2.0


class Trace:
    """Each epoch's start (monotonic) and whether every agent had reported by then."""

    def __init__(self, controller: Controller):
        self.controller = controller
        self.starts: list[float] = []
        self.all_reported: list[bool] = []
        self.started = threading.Event()
        original = controller.run_epoch

        def traced():
            with controller._trigger:
                self.all_reported.append(controller._all_reported())
            self.starts.append(time.monotonic())
            self.started.set()
            return original()

        controller.run_epoch = traced  # type: ignore[method-assign]


def report(controller: Controller, node: str, slot: int) -> None:
    controller.on_report(
        pb.NodeReport(node_id=node, slot=slot, timestamp=time.time(), slot_seconds=SLOT)
    )


def hello(controller: Controller, node: str) -> None:
    controller.on_hello(pb.Hello(node_id=node, cpu_capacity_cores=2.0, slot_seconds=SLOT))


def test_reports_trigger_the_epoch_between_half_a_slot_and_a_slot(tmp_path):
    c = Controller(config(tmp_path, slot_seconds=SLOT, epoch_trigger="reports"))
    trace = Trace(c)
    hello(c, "n1")
    hello(c, "n2")
    c.start(serve_metrics=False)
    try:
        # Nobody reports: the timer is the deadline.
        wait_until(lambda: len(trace.starts) >= 1, "first epoch at the deadline")
        assert trace.all_reported[0] is False
        wait_until(lambda: c.epoch >= 1, "first epoch done")

        # Both report right after an epoch began: the next one starts on their
        # reports, but not before half a slot has passed since the last start.
        for slot in range(1, 3):
            n = len(trace.starts)
            report(c, "n1", slot)
            report(c, "n2", slot)
            wait_until(lambda n=n: len(trace.starts) > n, "epoch after both reports")
            assert trace.all_reported[n] is True
            # (the traced start lags the loop's own by a hair)
            assert trace.starts[n] - trace.starts[n - 1] >= SLOT / 2 - 0.05

        # One of two reports: the deadline again.
        n = len(trace.starts)
        report(c, "n1", 3)
        wait_until(lambda: len(trace.starts) > n, "epoch at the deadline")
        assert trace.all_reported[n] is False

        # An agent that disconnects is not waited for.
        c.on_disconnect("n2")
        n = len(trace.starts)
        report(c, "n1", 4)
        wait_until(lambda: len(trace.starts) > n, "epoch on the remaining agent's report")
        assert trace.all_reported[n] is True
    finally:
        c.stop()


def test_reports_taken_during_an_epoch_count_for_the_next(tmp_path):
    c = Controller(config(tmp_path, slot_seconds=SLOT, epoch_trigger="reports"))
    hello(c, "n1")
    report(c, "n1", 1)
    with c._trigger:
        assert c._all_reported()
    c.run_epoch()  # the report was taken before this epoch: it is consumed
    with c._trigger:
        assert not c._all_reported()
    report(c, "n1", 2)
    with c._trigger:
        assert c._all_reported()
    c.stop()


def test_the_timer_trigger_does_not_wait_for_reports(tmp_path):
    c = Controller(config(tmp_path, slot_seconds=SLOT / 4))
    trace = Trace(c)
    hello(c, "n1")  # connected, never reports
    c.start(serve_metrics=False)
    try:
        wait_until(lambda: len(trace.starts) >= 2, "two timer epochs")
        assert trace.all_reported[:2] == [False, False]
    finally:
        c.stop()
