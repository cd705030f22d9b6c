"""Bad input to placement: clear ValueErrors naming the field, and vanished nodes
handled as displaced instances by every strategy."""

from __future__ import annotations

import math

import pytest

from controller.placement import (
    STRATEGIES,
    Instance,
    Node,
    PlacementInput,
    Worker,
    get_strategy,
)
from controller.placement.stage import PlacementDemand, plan_placement
from dsched.ids import InstanceKey


def _state(**overrides) -> PlacementInput:
    fields = dict(
        nodes=(Node("n0", 2.0), Node("n1", 2.0)),
        instances=(
            Instance("wc", "split", 0, 0.5, False, "wc@n0:sl", "n0"),
            Instance("wc", "count", 0, 0.5, True, "wc@n1:sf", "n1"),
        ),
        workers=(Worker("wc@n0:sl", "wc", "n0", False), Worker("wc@n1:sf", "wc", "n1", True)),
        dags={"wc": (("split", "count"),)},
        traffic={("wc/split/0", "wc/count/0"): 50.0},
    )
    fields.update(overrides)
    return PlacementInput(**fields)


@pytest.mark.parametrize("value", [-0.1, math.nan, math.inf, "2"])
def test_bad_capacity_names_capacity_cores(value):
    with pytest.raises(ValueError, match="capacity_cores of node n0"):
        Node("n0", value)


@pytest.mark.parametrize("value", [-1.0, math.nan, None])
def test_bad_demand_names_demand_cores(value):
    with pytest.raises(ValueError, match="demand_cores of instance wc/split/0"):
        Instance("wc", "split", 0, value, False)


def test_negative_index_is_refused():
    with pytest.raises(ValueError, match="index of wc/split"):
        Instance("wc", "split", -1, 0.1, False)


def test_worker_without_node_is_refused():
    with pytest.raises(ValueError, match="worker and node of instance wc/split/0"):
        Instance("wc", "split", 0, 0.1, False, worker="w", node=None)


def test_names_that_could_escape_a_path_are_refused():
    with pytest.raises(ValueError, match="contains a path separator"):
        Node("../n0", 1.0)
    with pytest.raises(ValueError, match="app"):
        Instance("a/b", "split", 0, 0.1, False)


def test_duplicate_ids_are_refused():
    with pytest.raises(ValueError, match="nodes lists 'n0' twice"):
        _state(nodes=(Node("n0", 1.0), Node("n0", 2.0)))


def test_instance_on_another_apps_worker_is_refused():
    with pytest.raises(ValueError, match="belongs to app other"):
        _state(
            workers=(Worker("wc@n0:sl", "other", "n0", False), Worker("wc@n1:sf", "wc", "n1", True))
        )


def test_instance_node_disagreeing_with_its_worker_is_refused():
    with pytest.raises(ValueError, match="node of instance wc/split/0 is n0 but its worker"):
        _state(
            workers=(Worker("wc@n0:sl", "wc", "n1", False), Worker("wc@n1:sf", "wc", "n1", True))
        )


@pytest.mark.parametrize("rate", [-5.0, math.nan])
def test_bad_traffic_is_refused(rate):
    with pytest.raises(ValueError, match="traffic of wc/split/0 -> wc/count/0"):
        _state(traffic={("wc/split/0", "wc/count/0"): rate})


def test_traffic_to_an_unknown_instance_is_refused():
    with pytest.raises(ValueError, match="traffic names unknown instance 'wc/ghost/0'"):
        _state(traffic={("wc/split/0", "wc/ghost/0"): 1.0})


def test_cyclic_dag_is_refused():
    with pytest.raises(ValueError, match=r"dags\['wc'\] has a cycle"):
        _state(dags={"wc": (("split", "count"), ("count", "split"))})


def test_unknown_strategy_lists_the_known_ones():
    with pytest.raises(ValueError) as err:
        get_strategy("round-robin")
    for name in STRATEGIES:
        assert name in str(err.value)


@pytest.mark.parametrize(
    "name, options, field",
    [
        ("mips", {"samples": 0}, "samples"),
        ("mips", {"seed": "x"}, "seed"),
        ("mips", {"epsilon": 2.0}, "epsilon"),
        ("aniello-online", {"threshold_percent": -1}, "threshold_percent"),
        ("aniello-offline", {"alpha": 1.5}, "alpha"),
        ("sam", {"slot_cores": 0}, "slot_cores"),
        ("even", {"workers_per_app": 0}, "workers_per_app"),
        ("rstorm", {"w_net": -1}, "w_net"),
        ("liu", {"scale_in": "yes"}, "scale_in"),
        ("liu", {"scale_in_patience": 0}, "scale_in_patience"),
        ("liu", {"scale_in_patience": -2}, "scale_in_patience"),
        ("liu", {"scale_in_patience": 1.5}, "scale_in_patience"),
        ("liu", {"scale_in_patience": True}, "scale_in_patience"),
        ("liu", {"scale_in_patience": "3"}, "scale_in_patience"),
        ("liu", {"stateful_growth": -0.5}, "stateful_growth"),
        ("liu", {"stateful_growth": math.nan}, "stateful_growth"),
        ("liu", {"stateful_growth": math.inf}, "stateful_growth"),
        ("liu", {"stateful_growth": True}, "stateful_growth"),
        ("liu", {"stateful_growth": "1"}, "stateful_growth"),
        ("liu", {"no_such_option": 1}, "no_such_option"),
    ],
)
def test_bad_options_name_the_option(name, options, field):
    with pytest.raises(ValueError, match=field):
        get_strategy(name, **options)


@pytest.mark.parametrize("name", sorted(STRATEGIES))
@pytest.mark.parametrize("headroom", [-0.5, math.nan])
def test_bad_headroom_is_refused(name, headroom):
    with pytest.raises(ValueError, match="headroom_cores"):
        get_strategy(name).plan(_state(), headroom_cores=headroom)


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_every_strategy_replaces_instances_of_a_vanished_node(name):
    state = _state(nodes=(Node("n0", 2.0), Node("n2", 2.0)))  # n1 is gone
    plan = get_strategy(name).plan(state)
    assert set(plan.assignment) == {"wc/split/0", "wc/count/0"}
    assert {node for _, node in plan.assignment.values()} <= {"n0", "n2"}
    moved = {m.instance: m for m in plan.moves}
    assert moved["wc/count/0"].from_node == "n1"
    assert plan.feasible


def test_no_connected_node_plans_nothing():
    # Every agent left while instances still have demands: nothing to place on
    # (liu's repack used to index a node list that was empty).
    key = InstanceKey("wc", "split", 0)
    demands = {key: PlacementDemand("n1", 0.5)}
    current = {key.id: ("n1", False)}
    for strategy in sorted(STRATEGIES):
        assert plan_placement(demands, capacity={}, current=current, strategy=strategy) is None
