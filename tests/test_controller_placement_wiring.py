"""Placement as step 7 of the epoch: planned when a node overflows, recorded, moved
only by the configured actuator in enforce mode."""

from __future__ import annotations

import pytest

from controller.config import ControllerConfig
from controller.core import Controller
from dsched.config import ConfigError, from_dict
from tests.test_controller_epoch import SyntheticNode, config, run


@pytest.fixture
def clock():
    return [2_000_000.0]


def _overloaded(tmp_path, clock, **kw):
    c = Controller(
        config(tmp_path, node_capacity_cores={"n1": 0.5, "n2": 2.0}, **kw), clock=lambda: clock[0]
    )
    busy = SyntheticNode(c, "n1", cores=2.0)
    idle = SyntheticNode(c, "n2", cores=2.0)
    for _ in range(6):
        clock[0] += 1.0
        busy.report(clock[0], {"wc": 300})
        idle.report(clock[0], {})
        rec = c.run_epoch()
        # Planning runs on its own thread; its result shows in the next record.
        assert c.wait_placement(timeout=30)
    return c, rec


def test_an_overloaded_node_gets_a_plan_that_is_only_logged_in_dry_run(tmp_path, clock):
    c, rec = _overloaded(tmp_path, clock)
    p = rec["placement"]
    assert p["planned"] is True and p["strategy"] == "liu" and p["epoch"] < rec["epoch"]
    assert p["moves"] and all(m["from_node"] == "n1" and m["to_node"] == "n2" for m in p["moves"])
    assert p["affected_workers"] >= 1
    assert p["actuator"] == "log-only"  # dry-run never moves anything


def test_no_placement_when_configured_off(tmp_path, clock):
    _, rec = _overloaded(tmp_path, clock, placement="none")
    assert rec["placement"]["planned"] is False


def test_nothing_to_plan_on_a_node_with_room(tmp_path, clock):
    c = Controller(config(tmp_path, placement="liu"), clock=lambda: clock[0])
    node = SyntheticNode(c)
    for _ in range(5):
        rec = run(c, node, clock, 1, {"wc": 20})
        assert c.wait_placement(timeout=30)
        assert rec["placement"]["planned"] is False


@pytest.mark.parametrize(
    "data,key",
    [({"move_actuator": "teleport"}, "move_actuator"), ({"move_actuator": "testbed"}, "move_url")],
)
def test_move_actuator_config_is_checked(data, key):
    with pytest.raises(ConfigError) as e:
        from_dict(ControllerConfig, data)
    assert e.value.key == key
