"""Placement's cost at cluster size: the same plans, found faster, off the fast loop.

The tree of free rooms (controller/placement/common.py ``FreeTree``) must pick
the node a scan in node order picks; plans made in the planner process must
equal plans made on the placement thread, and carry the strategy's memory back.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from controller.placement import get_strategy
from controller.placement.common import FreeTree, first_fit_decreasing, fits
from controller.placement.loop import PlacementLoop, PlacementOffer
from controller.placement.migration import LogOnlyMoveActuator
from controller.placement.model import Instance, Node, PlacementInput
from controller.placement.stage import PlacementDemand, plan_placement
from dsched.ids import InstanceKey

rooms = st.lists(
    st.one_of(
        st.floats(-2.0, 8.0, allow_nan=False),
        st.sampled_from([0.0, 1.0, 1.0 + 1e-12, 0.5, -0.0, 4.0]),
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(
    rooms,
    st.lists(st.tuples(st.integers(0, 39), st.floats(-2.0, 8.0, allow_nan=False)), max_size=20),
    st.floats(0.0, 6.0, allow_nan=False),
    st.integers(0, 45),
)
def test_free_tree_finds_what_a_scan_finds(free, updates, demand, start):
    tree = FreeTree(free)
    free = list(free)
    for pos, value in updates:
        if pos < len(free):
            free[pos] = value
            tree.set(pos, value)
    scan = next((i for i in range(start, len(free)) if fits(free[i], demand)), None)
    assert tree.first(lambda room: fits(room, demand), start) == scan
    assert tree.first_fit(demand) == next(
        (i for i in range(len(free)) if fits(free[i], demand)), None
    )
    roomiest = max(range(len(free)), key=lambda i: (free[i] - demand, -i))
    assert tree.roomiest(demand) == roomiest
    assert tree.roomiest() == max(range(len(free)), key=lambda i: (free[i], -i))


def _first_fit_decreasing_by_scan(state, headroom_cores, fixed=None):
    """The first-fit-decreasing of before the tree: a scan of every node per instance."""
    fixed = dict(fixed or {})
    free = {n: state.capacity(n, headroom_cores) for n in state.node_ids}
    demand = {i.id: i.demand_cores for i in state.instances}
    for inst_id, node in fixed.items():
        free[node] -= demand[inst_id]
    ok = all(fits(room, 0.0) for room in free.values())
    node_of = dict(fixed)
    for inst in sorted(state.instances, key=lambda i: (-i.demand_cores, i.id)):
        if inst.id in fixed:
            continue
        target = next((n for n in state.node_ids if fits(free[n], inst.demand_cores)), None)
        if target is None:
            ok = False
            target = max(
                state.node_ids, key=lambda n: (free[n] - inst.demand_cores, -state.node_index[n])
            )
        node_of[inst.id] = target
        free[target] -= inst.demand_cores
    return node_of, ok


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.sampled_from([1.0, 2.0, 2.5, 4.0]), min_size=1, max_size=8),
    st.lists(st.sampled_from([0.1, 0.3, 0.5, 0.7, 1.0, 1.5, 0.30000000000000004]), max_size=30),
    st.sampled_from([0.0, 0.1]),
)
def test_first_fit_decreasing_equals_the_scan(capacities, demands, headroom):
    nodes = [Node(f"n{i}", c) for i, c in enumerate(capacities)]
    instances = [Instance("a", "op", i, d, i % 2 == 0) for i, d in enumerate(demands)]
    state = PlacementInput(nodes, instances)
    assert first_fit_decreasing(state, headroom) == _first_fit_decreasing_by_scan(state, headroom)


def _overloaded_offer(epoch: int) -> PlacementOffer:
    # n0 holds more than it can; n1 and n2 have room; n3 is nearly empty.
    demands, current = {}, {}
    for app in ("a", "b"):
        for op, stateful in (("split", False), ("count", True)):
            for i in range(3):
                node = "n0" if i < 2 else "n3"
                kind = "stateful" if stateful else "stateless"
                demands[InstanceKey(app, op, i)] = PlacementDemand(
                    node, 0.4, 0.5 if stateful else None
                )
                current[f"{app}/{op}/{i}"] = (f"{app}-{kind}-{node}", stateful)
    capacity = {"n0": 2.0, "n1": 2.0, "n2": 2.0, "n3": 2.0}
    dags = {"a": [("split", "count")], "b": [("split", "count")]}
    return PlacementOffer(epoch, "enforce", demands, capacity, current, dags)


def test_a_plan_made_in_the_planner_process_equals_one_made_here():
    offer = _overloaded_offer(1)
    expected = plan_placement(
        offer.demands,
        capacity=offer.capacity,
        current=offer.current,
        strategy=get_strategy("liu"),
        headroom_cores=0.1,
        dags=offer.dags,
    )
    assert expected is not None and expected.moves
    summaries = []
    for limit in (None, 0):  # on the thread, then in the planner process
        loop = PlacementLoop(get_strategy("liu"), LogOnlyMoveActuator(), 0.1, 3, limit)
        try:
            loop.offer(1, dict, lambda: offer)
            assert loop.wait(60)
            summary = loop.offer(2, dict, lambda: offer)
            assert loop.wait(60)
            assert summary["planned"] is True
            summaries.append(summary)
            # The mover ran here, with the plan the child made.
            assert [p.moves for p in loop.mover.plans[:1]] == [expected.moves]
            assert (loop._planner is not None) == (limit == 0)
        finally:
            loop.stop()
    assert summaries[0] == summaries[1]


def test_the_strategy_memory_comes_back_from_the_planner_process():
    # A cluster with a node that could be emptied: liu counts its patience.
    demands = {
        InstanceKey("a", "count", 0): PlacementDemand("n0", 0.5, 0.5),
        InstanceKey("a", "count", 1): PlacementDemand("n1", 0.5, 0.5),
    }
    current = {"a/count/0": ("a-stateful-n0", True), "a/count/1": ("a-stateful-n1", True)}
    offer = PlacementOffer(1, "dry-run", demands, {"n0": 4.0, "n1": 4.0}, current, {})
    streaks = []
    for limit in (None, 0):
        strategy = get_strategy("liu", scale_in_patience=5)
        loop = PlacementLoop(strategy, LogOnlyMoveActuator(), 0.0, 3, limit)
        try:
            for epoch in range(1, 4):
                loop.offer(epoch, dict, lambda: offer)
                assert loop.wait(60)
            streaks.append(dict(loop.strategy._low_streak))
        finally:
            loop.stop()
    assert streaks[0] == streaks[1]
    assert streaks[0] and max(streaks[0].values()) == 3


def test_plans_stay_on_the_thread_after_the_planner_process_dies_again_and_again(monkeypatch):
    from concurrent.futures.process import BrokenProcessPool

    import controller.placement.loop as loop_module

    class Dead:
        def __init__(self, *args, **kwargs):
            pass

        def submit(self, *args, **kwargs):
            raise BrokenProcessPool("gone")

        def shutdown(self, *args, **kwargs):
            pass

    monkeypatch.setattr(loop_module, "ProcessPoolExecutor", Dead)
    offer = _overloaded_offer(1)
    loop = PlacementLoop(get_strategy("liu"), LogOnlyMoveActuator(), 0.1, 3, 0)
    try:
        for epoch in range(1, 6):
            summary = loop.offer(epoch, dict, lambda: offer)
            assert loop.wait(60)
            if epoch > 1:
                assert summary["planned"] is True  # made on the thread
        assert loop._planner_deaths == loop_module.PLANNER_DEATHS_TOLERATED
    finally:
        loop.stop()
