"""The ``last_value`` predictor: the max rule never forecasts below what arrives now."""

from __future__ import annotations

import pytest

from controller.config import ConfigError, ControllerConfig
from controller.stages.forecast import forecast
from dsched.ids import OperatorKey
from tests.view_support import operator_view

SRC, SINK = OperatorKey("wc", "source"), OperatorKey("wc", "count")


def _views(arrivals):
    return {
        SRC: operator_view(SRC, arrivals),
        SINK: operator_view(SINK, [2 * a for a in arrivals], upstream=("source",)),
    }


def test_after_a_drop_the_trend_alone_forecasts_nothing_and_the_last_value_holds():
    # A step down from 300 to 40 tuples/s: the line through the last four slots
    # ends below zero, clipped to 0; 40/s are still arriving.
    views = _views([300, 300, 40, 40])
    trend_only = forecast(views, 4, predictors=("linear_trend", "dag")).forecasts
    assert trend_only[SRC].rate == 0.0
    assert trend_only[SINK].rate == 0.0
    with_last = forecast(views, 4, predictors=("linear_trend", "last_value", "dag")).forecasts
    assert with_last[SRC].rate == pytest.approx(40.0)
    assert with_last[SRC].predictor == "last_value"
    # Carried down the DAG: the sink gets its parent's 40/s times selectivity 1,
    # and its own last value, 80/s, is the larger.
    assert with_last[SINK].rate == pytest.approx(80.0)
    assert with_last[SINK].candidates["last_value"] == pytest.approx(80.0)


def test_on_a_rise_the_trend_still_wins():
    views = _views([100, 150, 200, 250])
    fcs = forecast(views, 4, predictors=("linear_trend", "last_value", "dag")).forecasts
    assert fcs[SRC].rate == pytest.approx(300.0)
    assert fcs[SRC].predictor == "linear_trend"


def test_an_unknown_predictor_is_refused_with_its_position():
    with pytest.raises(ConfigError, match=r"predictors\[1\]"):
        ControllerConfig(predictors=["linear_trend", "last_valu"]).validate()
