"""The controller side of moves: when to plan, plans as JSON, move actuators, the HTTP endpoint."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from controller.placement.migration import (
    LogOnlyMoveActuator,
    TestbedMoveActuator,
    get_move_actuator,
    plan_from_dict,
    plan_to_dict,
)
from controller.placement.stage import (
    build_placement_input,
    current_from_histories,
    dags_from_topologies,
    demands_from_record,
    placement_summary,
    plan_placement,
)
from testbed.live.actuator import MoveEndpoint

APP = "wc"
DAG = {APP: [("source", "split"), ("split", "count")]}
LAYOUT = [
    ("source", 0, "n1"),
    ("source", 1, "n1"),
    ("split", 0, "n1"),
    ("split", 1, "n1"),
    ("count", 0, "n1"),
    ("count", 1, "n2"),
]


def _record(split_cores: float, count_cores: float = 0.1) -> dict:
    demand = {"source": 0.05, "split": split_cores, "count": count_cores}
    return {
        "instances": [
            {"app": APP, "operator": op, "instance": i, "node": node, "demand_cores": demand[op]}
            for op, i, node in LAYOUT
        ]
    }


def _demands(split_cores: float, count_cores: float = 0.1):
    return demands_from_record(_record(split_cores, count_cores))


def _current() -> dict[str, tuple[str, bool]]:
    return {
        f"{APP}/{op}/{i}": (
            f"{APP}-{'stateful' if op == 'count' else 'stateless'}-{node}",
            op == "count",
        )
        for op, i, node in LAYOUT
    }


CAPACITY = {"n1": 0.7, "n2": 0.7}


def _plan(demands, strategy="liu", **options):
    """plan_placement on CAPACITY with 0.1 core of headroom and the DAG."""
    return plan_placement(
        demands, CAPACITY, _current(), strategy, headroom_cores=0.1, dags=DAG, **options
    )


def test_no_plan_when_no_node_is_overloaded_and_none_can_be_emptied():
    # n1 carries 0.52 of 0.6 usable; n2's 0.1 does not fit in n1's 0.08 spare.
    assert (
        plan_placement(_demands(0.16), CAPACITY, _current(), "liu", headroom_cores=0.1, dags=DAG)
        is None
    )


def test_overloaded_node_moves_only_stateless_instances_when_that_suffices():
    plan = plan_placement(_demands(0.3), CAPACITY, _current(), "liu", headroom_cores=0.1, dags=DAG)
    assert plan is not None and plan.feasible
    assert plan.moves and all(not m.stateful for m in plan.moves)
    assert {m.from_node for m in plan.moves} == {"n1"}
    assert plan.affected_stateful_workers == ()
    assert plan.affected_workers == (f"{APP}-stateless-n1",)
    assert "node n1 over capacity" in plan.reasons[0]
    summary = placement_summary(plan)
    assert summary["affected_workers"] == 1 and summary["stateful_moves"] == 0
    json.dumps(summary)  # goes into the decision record as is


def test_no_moves_when_every_node_is_over_capacity_and_moving_relieves_nothing():
    from controller.placement import get_strategy
    from controller.placement.stage import overload_cores

    # n1 carries 1.9 cores and n2 0.8, each over its 0.6 usable: liu's own plan still
    # swaps the stateful count instances and moves a split, which relieves nothing.
    state = build_placement_input(_demands(0.5, 0.8), CAPACITY, _current(), dags=DAG)
    own = get_strategy("liu").plan(state, headroom_cores=0.1)
    assert any(m.stateful for m in own.moves)
    before = overload_cores(state, state.current_assignment(), 0.1)
    assert before == pytest.approx(1.5)
    assert overload_cores(state, own.assignment, 0.1) == pytest.approx(before)
    assert (
        plan_placement(
            _demands(0.5, 0.8), CAPACITY, _current(), "liu", headroom_cores=0.1, dags=DAG
        )
        is None
    )


def test_a_plan_that_relieves_part_of_the_overload_is_kept():
    # n1 is over by 0.55 cores; n2 has 0.5 spare: the plan cannot fit everything but
    # lowers the overload, so it stands.
    from controller.placement.stage import overload_cores

    demands = _demands(0.5, 0.1)
    state = build_placement_input(demands, CAPACITY, _current(), dags=DAG)
    plan = plan_placement(demands, CAPACITY, _current(), "liu", headroom_cores=0.1, dags=DAG)
    assert plan is not None and plan.moves
    assert overload_cores(state, plan.assignment, 0.1) < overload_cores(
        state, state.current_assignment(), 0.1
    )


@pytest.mark.parametrize(("split", "count", "moves"), [(0.22, 0.1, 1), (0.22, 0.3, 2)])
def test_a_plan_for_overload_alone_must_relieve_the_floor_per_instance_it_moves(
    split, count, moves
):
    from controller.placement.stage import overload_cores

    demands = _demands(split, count)
    state = build_placement_input(demands, CAPACITY, _current(), dags=DAG)

    def plan(min_relief_cores: float):
        return _plan(demands, min_relief_cores=min_relief_cores)

    free = plan(0.0)
    assert free is not None and len(free.moves) == moves
    relief = overload_cores(state, state.current_assignment(), 0.1) - overload_cores(
        state, free.assignment, 0.1
    )
    per_move = relief / moves
    assert per_move > 0.01
    # Just under what each move relieves: the same plan stands.
    kept = plan(0.9 * per_move)
    assert kept is not None and kept.moves == free.moves
    # Just over it: the node is fitted by the allocator's cuts and nothing moves.
    assert plan(1.1 * per_move) is None


def test_the_relief_floor_never_holds_back_a_node_that_can_be_emptied():
    from controller.placement import get_strategy

    done = _plan(_demands(0.05), get_strategy("liu", scale_in_patience=1), min_relief_cores=10.0)
    assert done is not None and done.moves
    assert any("can be emptied" in r for r in done.reasons)


@pytest.mark.parametrize("bad", [-0.01, float("nan"), float("inf"), True, "0.02", None])
def test_a_bad_relief_floor_is_refused_by_name(bad):
    with pytest.raises(ValueError, match="min_relief_cores"):
        plan_placement(
            _demands(0.3), CAPACITY, _current(), "liu", headroom_cores=0.1, min_relief_cores=bad
        )


def test_node_that_can_be_emptied_gets_a_scale_in_plan_once_low_load_persists():
    from controller.placement import get_strategy

    # n2 holds a stateful worker: emptying it waits for three consecutive low epochs.
    strategy = get_strategy("liu", scale_in_patience=3)

    def plan(split_cores: float):
        return plan_placement(
            _demands(split_cores), CAPACITY, _current(), strategy, headroom_cores=0.1, dags=DAG
        )

    assert plan(0.05) is None
    assert plan(0.05) is None
    # An epoch in which no node can be emptied needs no plan, and restarts the count.
    assert plan(0.16) is None
    assert plan(0.05) is None
    assert plan(0.05) is None
    done = plan(0.05)
    assert done is not None
    assert [m.instance for m in done.moves] == [f"{APP}/count/1"]
    assert done.nodes_used == 1


def test_scale_in_can_be_switched_off():
    from controller.placement import get_strategy

    strategy = get_strategy("liu", scale_in=False)
    assert _plan(_demands(0.05), strategy, scale_in=False) is None


def test_instances_on_a_vanished_node_are_placed_again():
    plan = plan_placement(
        _demands(0.05), {"n1": 1.0}, _current(), "liu", headroom_cores=0.1, dags=DAG
    )
    assert plan is not None
    assert [(m.instance, m.from_node, m.to_node) for m in plan.moves] == [
        (f"{APP}/count/1", "n2", "n1")
    ]


def test_strategies_are_chosen_by_name():
    plan = plan_placement(
        _demands(0.3), CAPACITY, _current(), "rstorm", headroom_cores=0.1, dags=DAG
    )
    assert plan is not None and plan.strategy == "rstorm"
    with pytest.raises(ValueError, match="unknown placement strategy"):
        plan_placement(_demands(0.3), CAPACITY, _current(), "nope")


def test_current_comes_from_the_controller_histories():
    from controller.model import InstanceKey

    class History:  # the two fields plan_placement reads from InstanceHistory
        def __init__(self, worker: str, stateful: bool):
            self.worker, self.stateful = worker, stateful

    histories = {InstanceKey(APP, "count", 1): History("wc-stateful-n2", True)}
    assert current_from_histories(histories) == {f"{APP}/count/1": ("wc-stateful-n2", True)}


def test_dags_come_from_the_learnt_topologies():
    from controller.model import AppTopology

    topo = AppTopology(APP, parents={"source": (), "split": ("source",), "count": ("split",)})
    assert dags_from_topologies({APP: topo}) == {APP: [("source", "split"), ("split", "count")]}


@pytest.mark.parametrize(
    ("record", "current", "headroom", "match"),
    [
        ({}, _current(), 0.0, r"record\['instances'\]"),
        ({"instances": [{"app": APP}]}, _current(), 0.0, r"record\['instances'\]\[0\] lacks"),
        (_record(0.3), {}, 0.0, "current has no worker for instance wc/source/0"),
        (_record(float("nan")), _current(), 0.0, "demand_cores"),
        (_record(0.3), _current(), -1.0, "headroom_cores"),
        (_record(0.3), _current(), float("nan"), "headroom_cores"),
    ],
)
def test_bad_input_names_the_parameter(record, current, headroom, match):
    with pytest.raises(ValueError, match=match):
        plan_placement(
            demands_from_record(record), CAPACITY, current, "liu", headroom_cores=headroom
        )


def test_bad_capacity_names_the_node():
    with pytest.raises(ValueError, match="capacity_cores of node n1"):
        build_placement_input(_demands(0.1), {"n1": -1.0, "n2": 1.0}, _current())


def test_plans_survive_json_and_malformed_plans_are_refused():
    plan = plan_placement(_demands(0.3), CAPACITY, _current(), "liu", headroom_cores=0.1, dags=DAG)
    again = plan_from_dict(json.loads(json.dumps(plan_to_dict(plan))))
    assert again == plan
    with pytest.raises(ValueError, match="'moves' must be a list"):
        plan_from_dict({"moves": "x"})
    with pytest.raises(ValueError, match=r"moves\[0\]' lacks 'to_node'"):
        plan_from_dict(
            {
                "moves": [
                    {
                        "instance": "a/b/0",
                        "from_worker": None,
                        "from_node": None,
                        "to_worker": "w",
                        "stateful": False,
                    }
                ]
            }
        )
    with pytest.raises(ValueError, match=r"moves\[0\].stateful"):
        plan_from_dict(
            {
                "moves": [
                    {
                        "instance": "a/b/0",
                        "from_worker": None,
                        "from_node": None,
                        "to_worker": "w",
                        "to_node": "n",
                        "stateful": "yes",
                    }
                ]
            }
        )
    with pytest.raises(ValueError, match="JSON object"):
        plan_from_dict([])


def test_log_only_actuator_moves_nothing_and_keeps_the_plan():
    plan = plan_placement(_demands(0.3), CAPACITY, _current(), "liu", headroom_cores=0.1, dags=DAG)
    actuator = get_move_actuator("log-only")
    assert isinstance(actuator, LogOnlyMoveActuator)
    result = actuator.execute(plan)
    assert not result.executed and result.moved == []
    assert result.affected_workers == list(plan.affected_workers)
    assert actuator.plans == [plan]


def test_move_actuator_names_and_options_are_checked():
    with pytest.raises(ValueError, match="unknown move actuator"):
        get_move_actuator("storm")
    with pytest.raises(ValueError, match="url"):
        TestbedMoveActuator("localhost:1234")
    with pytest.raises(ValueError, match="timeout_seconds"):
        TestbedMoveActuator("http://127.0.0.1:1", timeout_seconds=0)
    with pytest.raises(ValueError, match="bad option"):
        get_move_actuator("testbed", nope=1)


def test_endpoint_refuses_malformed_plans_and_unknown_applications():
    plan = plan_placement(_demands(0.3), CAPACITY, _current(), "liu", headroom_cores=0.1, dags=DAG)
    with MoveEndpoint({}) as endpoint:
        request = urllib.request.Request(
            f"{endpoint.url}/moves", data=b'{"moves": 3}', method="POST"
        )
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(request, timeout=10)
        assert err.value.code == 400
        assert "'moves' must be a list" in json.loads(err.value.read())["error"]
        result = TestbedMoveActuator(endpoint.url).execute(plan)
        assert result.executed and result.moved == []
        assert set(result.refused) == {m.instance for m in plan.moves}
        assert all("not running in this testbed" in r for r in result.refused.values())
        with urllib.request.urlopen(f"{endpoint.url}/placement", timeout=10) as reply:
            assert json.loads(reply.read()) == {}


def test_unreachable_testbed_is_reported_not_raised():
    plan = plan_placement(_demands(0.3), CAPACITY, _current(), "liu", headroom_cores=0.1, dags=DAG)
    with MoveEndpoint({}) as endpoint:
        url = endpoint.url
    result = TestbedMoveActuator(url, timeout_seconds=2).execute(plan)
    assert not result.executed
    assert "unreachable" in result.error
