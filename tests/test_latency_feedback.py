"""Latency feedback: measured violations over the aim tighten an application's
sizing; under it the sizing returns to the model's, never past it."""

from __future__ import annotations

import math

import pytest

from controller.config import ControllerConfig
from controller.core import Controller
from controller.qos import QosClass
from controller.stages.feedback import (
    MIN_GAIN,
    FeedbackSettings,
    FeedbackState,
    error,
    learn,
    observe,
)
from dsched.config import ConfigError
from tests.test_controller_epoch import SyntheticNode, config, views_after


def test_the_gain_falls_while_slots_are_over_the_aim_and_returns_to_one_below_it():
    state = FeedbackState(window=20)
    gains = []
    for _ in range(200):
        observe(state, 3000.0, 2000.0, aim=0.25, slot_seconds=0.5)
        gains.append(state.gain)
    assert all(b <= a for a, b in zip(gains, gains[1:], strict=False))
    assert gains[0] < 1.0 and gains[-1] == MIN_GAIN
    for _ in range(400):
        observe(state, 1000.0, 2000.0, aim=0.25, slot_seconds=0.5)
        assert state.gain <= 1.0
    assert state.gain == 1.0 and state.share == 0.0


def test_at_the_aim_the_gain_holds():
    state = FeedbackState(window=4, violated=[True, False, False], gain=0.6)
    observe(state, 1000.0, 2000.0, aim=0.25, slot_seconds=0.5)  # 1 of 4 over
    assert state.share == 0.25 and state.gain == pytest.approx(0.6)


@pytest.mark.parametrize(
    "share,aim,want", [(0.0, 0.25, 1.0), (0.25, 0.25, 0.0), (1.0, 0.25, -1.0), (0.5, 1.0, 0.5)]
)
def test_error_is_scaled_to_plus_minus_one(share, aim, want):
    assert error(share, aim) == pytest.approx(want)


def test_learn_takes_each_slot_once_and_forgets_apps_without_a_class(tmp_path):
    c, views = views_after(tmp_path, 2, {"wc": 20})
    c.stop()
    classes = {"wc": QosClass("bronze", 10.0, 0.5, 1.0)}  # 10 ms: every slot over
    states = {"gone": FeedbackState(5)}
    settings = FeedbackSettings(window=5, aim=0.5, slot_seconds=1.0)
    learn(states, views, classes, settings)
    learn(states, views, classes, settings)  # the same slot: not taken twice
    assert list(states) == ["wc"]
    assert list(states["wc"].violated) == [True]
    assert states["wc"].gain == pytest.approx(math.exp(-0.04))


def _demands(tmp_path, feedback: str, latency_s: float, epochs: int = 40):
    clock = [1_000_000.0]
    c = Controller(
        config(tmp_path / feedback, latency_feedback=feedback, node_capacity_cores={"n1": 8.0}),
        clock=lambda: clock[0],
    )
    node = SyntheticNode(c)
    rec = None
    for _ in range(epochs):
        clock[0] += 1.0
        node.report(clock[0], {"wc": 50}, latency_s=latency_s)
        rec = c.run_epoch()
    c.stop()
    app = rec["apps"][0]
    return app["latency_gain"], app["demand_cores"], c


def test_an_app_over_its_target_gets_more_cpu_with_the_feedback_on(tmp_path):
    """Bronze (2 s, half the slots may be over) measured at 3 s in every slot:
    the model, which predicts well under 2 s, sizes it the same every epoch; the
    feedback tightens its target and drain span until its demand rises."""
    gain_off, demand_off, _ = _demands(tmp_path / "over", "off", latency_s=3.0, epochs=20)
    gain_on, demand_on, c = _demands(tmp_path / "over", "on", latency_s=3.0, epochs=20)
    assert gain_off is None
    # One step of exp(-0.04) per measured 1-s slot before this epoch.
    slots = len(c.memory.latency_feedback["wc"].violated) - 1
    assert slots >= 15
    assert gain_on == pytest.approx(math.exp(-0.04 * slots), rel=1e-9)
    assert demand_on > demand_off
    assert c.memory.latency_feedback["wc"].share == 1.0


def test_an_app_within_its_target_is_sized_by_the_model_alone(tmp_path):
    gain_off, demand_off, _ = _demands(tmp_path / "under", "off", latency_s=0.5)
    gain_on, demand_on, _ = _demands(tmp_path / "under", "on", latency_s=0.5)
    assert gain_on == 1.0
    assert demand_on == pytest.approx(demand_off)


@pytest.mark.parametrize(
    "key,value,match",
    [
        ("latency_feedback", "yes", "on, off"),
        ("latency_feedback_seconds", 0.0, "positive"),
        ("latency_feedback_aim", 0.0, r"\(0, 1\]"),
        ("latency_feedback_aim", 1.5, r"\(0, 1\]"),
    ],
)
def test_bad_feedback_settings_are_refused_by_name(key, value, match):
    cfg = ControllerConfig(slot_seconds=1.0, **{key: value})
    with pytest.raises(ConfigError, match=match) as info:
        cfg.validate()
    assert key in str(info.value)
