"""The ``dag`` prediction carries what a parent processes, not what it receives:
a parent whose queue grows sends its child less than its arrivals."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from controller.stages.forecast import forecast
from dsched.ids import OperatorKey
from tests.view_support import operator_view

SRC, SPLIT = OperatorKey("wc", "source"), OperatorKey("wc", "split")


def _views(source_queue):
    # 200 tuples/s arrive at the source every slot; the split's own arrivals are
    # low, so the dag prediction is the larger of its candidates.
    src = operator_view(SRC, [200, 200, 200, 200])
    src = replace(src, queue=np.asarray(source_queue, dtype=float))
    return {SRC: src, SPLIT: operator_view(SPLIT, [10, 10, 10, 10], upstream=("source",))}


def test_a_parent_falling_behind_sends_its_child_less_than_it_receives():
    # The source's queue grows by 30 tuples a second over the three seconds.
    fc = forecast(_views([0, 30, 60, 90]), 4, predictors=("linear_trend", "dag")).forecasts
    assert fc[SPLIT].candidates["dag"] == pytest.approx(200.0 - 30.0)


def test_a_parent_working_off_its_queue_sends_its_child_more():
    fc = forecast(_views([90, 60, 30, 0]), 4, predictors=("linear_trend", "dag")).forecasts
    assert fc[SPLIT].candidates["dag"] == pytest.approx(200.0 + 30.0)
    assert fc[SPLIT].predictor == "dag"
