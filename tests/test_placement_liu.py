"""Properties of the ``liu`` strategy over random clusters and DAGs, and the
cases of Liu et al. Algorithms 1-3 on hand-made clusters."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controller.placement import Instance, Node, PlacementInput, Worker, apply_plan, get_strategy
from controller.placement.common import current_fits, first_fit_decreasing


@st.composite
def clusters(draw) -> PlacementInput:
    """Random nodes, apps with random DAGs (edges only forward, so acyclic) and demands."""
    node_count = draw(st.integers(1, 5))
    nodes = [Node(f"n{k}", draw(st.floats(0.5, 4.0, allow_nan=False))) for k in range(node_count)]
    instances, dags, traffic = [], {}, {}
    for a in range(draw(st.integers(1, 3))):
        app = f"app{a}"
        ops = [f"op{j}" for j in range(draw(st.integers(1, 4)))]
        edges = tuple(
            (ops[i], ops[j])
            for i in range(len(ops))
            for j in range(i + 1, len(ops))
            if draw(st.booleans())
        )
        dags[app] = edges
        by_op = {}
        for op in ops:
            stateful = draw(st.booleans())
            by_op[op] = [
                Instance(
                    app,
                    op,
                    k,
                    draw(st.floats(0.0, 1.0, allow_nan=False)),
                    stateful,
                    # Some instances carry a peak, possibly below their demand.
                    peak_demand_cores=draw(st.none() | st.floats(0.0, 2.0, allow_nan=False)),
                )
                for k in range(draw(st.integers(1, 3)))
            ]
            instances += by_op[op]
        for up, down in edges:
            for s in by_op[up]:
                for r in by_op[down]:
                    traffic[(s.id, r.id)] = draw(st.floats(0.0, 100.0, allow_nan=False))
    return PlacementInput(tuple(nodes), tuple(instances), (), dags, traffic)


@st.composite
def running_clusters(draw) -> PlacementInput:
    """A cluster placed by ``liu`` whose demands then change (grow or shrink)."""
    initial = draw(clusters())
    placed = apply_plan(initial, get_strategy("liu").plan(initial))
    changed = tuple(
        replace(i, demand_cores=i.demand_cores * draw(st.floats(0.2, 2.5, allow_nan=False)))
        for i in placed.instances
    )
    return PlacementInput(placed.nodes, changed, placed.workers, placed.dags, placed.traffic)


def _kinds_per_worker(state: PlacementInput, plan) -> dict[str, set[tuple[str, bool]]]:
    instances = state.instance_map()
    out: dict[str, set[tuple[str, bool]]] = {}
    for inst, (worker, _) in plan.assignment.items():
        out.setdefault(worker, set()).add((instances[inst].app, instances[inst].stateful))
    return out


PROPERTY = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTY
@given(running_clusters())
def test_liu_never_mixes_stateful_and_stateless_in_one_worker(state):
    plan = get_strategy("liu").plan(state)
    assert plan.mixed_workers == 0
    for worker, kinds in _kinds_per_worker(state, plan).items():
        assert len(kinds) == 1, f"{worker} holds {kinds}"
    seen = set()
    for w in plan.workers:
        assert w.stateful is not None
        key = (w.app, w.node, w.stateful)
        assert key not in seen, f"second {key} worker"
        seen.add(key)


@PROPERTY
@given(running_clusters(), st.floats(0.0, 0.3, allow_nan=False))
def test_liu_leaves_no_node_over_capacity_when_a_packing_exists(state, headroom):
    _, packable = first_fit_decreasing(state, headroom)
    plan = get_strategy("liu").plan(state, headroom_cores=headroom)
    assert set(plan.assignment) == {i.id for i in state.instances}
    if packable:
        assert plan.feasible, plan.reasons
        loads = {}
        for inst in state.instances:
            node = plan.assignment[inst.id][1]
            loads[node] = loads.get(node, 0.0) + inst.demand_cores
        for node, load in loads.items():
            assert load <= state.capacity(node, headroom) + 1e-6


@PROPERTY
@given(running_clusters())
def test_liu_returns_no_move_when_none_is_needed(state):
    plan = get_strategy("liu", scale_in=False).plan(state)
    fits_now, _ = current_fits(state, 0.0)
    if fits_now:
        assert plan.moves == ()
        assert plan.affected_workers == ()
        assert "no move needed" in plan.reasons
    elif first_fit_decreasing(state, 0.0)[1]:
        assert plan.moves


@PROPERTY
@given(running_clusters())
def test_liu_scale_in_moves_only_to_empty_a_node(state):
    fits_now, _ = current_fits(state, 0.0)
    plan = get_strategy("liu").plan(state)
    if fits_now and plan.moves:
        used_before = {i.node for i in state.instances}
        assert plan.nodes_used < len(used_before)
        assert any(r.startswith("scale in") for r in plan.reasons)


@PROPERTY
@given(clusters())
def test_liu_initial_placement_places_every_instance_separated(state):
    plan = get_strategy("liu").plan(state)
    assert set(plan.assignment) == {i.id for i in state.instances}
    assert all(m.from_worker is None for m in plan.moves)
    assert len(plan.moves) == len(state.instances)
    assert plan.mixed_workers == 0


def _wordcount(demands: dict[str, float], capacity: float = 2.0, nodes: int = 3):
    """WordCount (spout -> split -> count, count stateful) running on n0 and n1."""
    node_list = tuple(Node(f"n{k}", capacity) for k in range(nodes))
    workers = (
        Worker("wc@n0:sl", "wc", "n0", False),
        Worker("wc@n0:sf", "wc", "n0", True),
        Worker("wc@n1:sl", "wc", "n1", False),
        Worker("wc@n1:sf", "wc", "n1", True),
    )
    instances = []
    for op, stateful in (("spout", False), ("split", False), ("count", True)):
        for k in range(2):
            node = f"n{k}"
            worker = f"wc@{node}:{'sf' if stateful else 'sl'}"
            instances.append(Instance("wc", op, k, demands[op], stateful, worker, node))
    dags = {"wc": (("spout", "split"), ("split", "count"))}
    return PlacementInput(node_list, tuple(instances), workers, dags, {})


def _cluster(nodes: tuple[Node, ...], insts: tuple[Instance, ...], dags=None) -> PlacementInput:
    """A cluster whose workers are the ones its instances name (each holds one kind)."""
    workers = {i.worker: Worker(i.worker, i.app, i.node, i.stateful) for i in insts}
    return PlacementInput(nodes, insts, tuple(workers.values()), dags or {})


def test_liu_moves_only_stateless_instances_when_that_suffices():
    state = _wordcount({"spout": 0.4, "split": 1.0, "count": 0.5})  # 1.9 per node: fits
    assert get_strategy("liu", scale_in=False).plan(state).moves == ()
    grown = _wordcount({"spout": 0.5, "split": 1.2, "count": 0.5})  # 2.2 per node: over
    plan = get_strategy("liu").plan(grown)
    assert plan.feasible
    assert plan.stateful_moves == 0
    assert plan.affected_stateful_workers == ()
    assert plan.restarted_stateful == 0
    assert {m.instance.split("/")[1] for m in plan.moves} <= {"spout", "split"}
    assert set(plan.affected_workers) <= {"wc@n0:sl", "wc@n1:sl"}
    assert any("disrupting stateless" in r for r in plan.reasons)


def test_liu_disrupts_the_stateful_worker_when_stateless_ones_alone_do_not_fit():
    # n0: two stateful count instances need 2.2 cores > 2.0; its stateless split fits alone.
    nodes = (Node("n0", 2.0), Node("n1", 2.0))
    workers = (Worker("wc@n0:sl", "wc", "n0", False), Worker("wc@n0:sf", "wc", "n0", True))
    insts = (
        Instance("wc", "split", 0, 0.1, False, "wc@n0:sl", "n0"),
        Instance("wc", "count", 0, 1.1, True, "wc@n0:sf", "n0"),
        Instance("wc", "count", 1, 1.1, True, "wc@n0:sf", "n0"),
    )
    state = PlacementInput(nodes, insts, workers, {"wc": (("split", "count"),)})
    plan = get_strategy("liu", scale_in=False).plan(state)
    assert plan.feasible
    assert plan.affected_workers == ("wc@n0:sf",)
    assert plan.stateful_moves == 1
    assert any("disrupting stateful" in r for r in plan.reasons)
    # The stateful instance that moved went into a new stateful worker on n1.
    (move,) = plan.moves
    assert move.to_node == "n1" and move.to_worker.endswith(":sf")


def _fragmented(x_sf: float, x_sl: float, y_sf: float, y_sl: float) -> PlacementInput:
    """Two nodes of 1 core: x's stateful and stateless workers on n0, y's on n1.

    x: b (stateless) -> s (stateful); y: u (stateless) -> t (stateful).
    """
    nodes = (Node("n0", 1.0), Node("n1", 1.0))
    insts = (
        Instance("x", "s", 0, x_sf, True, "x@n0:sf", "n0"),
        Instance("x", "b", 0, x_sl, False, "x@n0:sl", "n0"),
        Instance("y", "t", 0, y_sf, True, "y@n1:sf", "n1"),
        Instance("y", "u", 0, y_sl, False, "y@n1:sl", "n1"),
    )
    return _cluster(nodes, insts, {"x": (("b", "s"),), "y": (("u", "t"),)})


def test_liu_repack_keeps_stateful_workers_in_place_when_that_fits():
    # n0 is over (1.05): x's stateless b (0.55) is disrupted but fits back on
    # neither node (free 0.5 and 0.3). Swapping it with y's stateless u fits
    # around the stateful workers. A full first-fit-decreasing repack would
    # fit too, by putting b first and moving both stateful workers.
    state = _fragmented(x_sf=0.5, x_sl=0.55, y_sf=0.4, y_sl=0.3)
    plan = get_strategy("liu", scale_in=False).plan(state)
    assert plan.feasible, plan.reasons
    assert plan.affected_stateful_workers == ()
    assert plan.stateful_moves == 0
    assert {m.instance for m in plan.moves} == {"x/b/0", "y/u/0"}
    assert any("keeping 2 stateful worker(s) in place" in r for r in plan.reasons)
    full, full_fits = first_fit_decreasing(state, 0.0)
    assert full_fits and full["x/s/0"] != "n0"


def test_liu_repack_moves_stateful_workers_only_when_nothing_else_fits():
    # b (0.6) fits beside neither stateful worker (0.5 each): only putting both
    # stateful workers on one node makes room for it.
    state = _fragmented(x_sf=0.5, x_sl=0.6, y_sf=0.5, y_sl=0.4)
    plan = get_strategy("liu", scale_in=False).plan(state)
    assert plan.feasible, plan.reasons
    assert plan.affected_stateful_workers
    assert any("full repack" in r for r in plan.reasons)
    assert plan.mixed_workers == 0


def test_liu_prefers_a_node_where_no_extra_worker_is_disrupted():
    # n0 overloaded by stateless work; n1 has a stateless worker with room, n2 is unused.
    state = _wordcount({"spout": 0.5, "split": 1.2, "count": 0.3})
    plan = get_strategy("liu", scale_in=False).plan(state)
    # Zero-affected targets come first: n0's own (disrupted) worker, then a node without
    # a stateless worker of wc; n1's stateless worker is only disrupted if that fails.
    assert "wc@n1:sf" not in plan.affected_workers


def test_liu_scale_in_empties_the_least_loaded_node():
    state = _wordcount({"spout": 0.1, "split": 0.2, "count": 0.2})  # 0.5 per node
    plan = get_strategy("liu", scale_in_patience=1).plan(state)
    assert plan.nodes_used == 1
    assert plan.feasible
    assert plan.mixed_workers == 0
    emptied = {m.from_node for m in plan.moves}
    assert len(emptied) == 1
    assert any(r.startswith("scale in: emptied node") for r in plan.reasons)
    # One worker of each kind on the remaining node.
    assert len(plan.workers) == 2


def test_liu_empties_a_node_with_a_stateful_worker_only_after_patience():
    state = _wordcount({"spout": 0.1, "split": 0.2, "count": 0.2})
    liu = get_strategy("liu", scale_in_patience=3)
    for waited in (1, 2):
        plan = liu.plan(state)
        assert plan.moves == () and plan.affected_stateful_workers == ()
        assert any(f"emptiable {waited} of 3 plans" in r for r in plan.reasons), plan.reasons
    plan = liu.plan(state)
    assert plan.nodes_used == 1
    # The only place for n0's stateful worker is n1's: a merge, both restart.
    assert plan.affected_stateful_workers == ("wc@n0:sf", "wc@n1:sf")
    assert any(r.startswith("scale in: emptied node n0") for r in plan.reasons)


def test_liu_patience_counts_consecutive_plans_only():
    low = _wordcount({"spout": 0.1, "split": 0.2, "count": 0.2})
    busy = _wordcount({"spout": 0.3, "split": 0.5, "count": 0.5})  # 1.3 per node: no room
    liu = get_strategy("liu", scale_in_patience=2)
    assert liu.plan(low).moves == ()
    assert liu.plan(busy).moves == ()  # not emptiable: the count starts again
    assert liu.plan(low).moves == ()
    assert liu.plan(low).nodes_used == 1
    # An epoch the controller did not plan (nothing was needed) breaks the run too.
    liu = get_strategy("liu", scale_in_patience=2)
    assert liu.plan(low).moves == ()
    liu.observe(busy)
    assert liu.plan(low).moves == ()
    liu.observe(low)
    assert liu.plan(low).nodes_used == 1


def test_liu_empties_first_a_node_that_holds_no_stateful_worker():
    # n1 (0.15 cores, with a stateful worker) is less loaded than n2 (0.2 cores,
    # stateless only), but emptying n2 disrupts no stateful worker.
    nodes = tuple(Node(f"n{k}", 2.0) for k in range(3))
    insts = (
        Instance("a", "src", 0, 1.0, False, "a@n0:sl", "n0"),
        Instance("a", "agg", 0, 0.2, True, "a@n0:sf", "n0"),
        Instance("b", "src", 0, 0.1, False, "b@n1:sl", "n1"),
        Instance("b", "agg", 0, 0.05, True, "b@n1:sf", "n1"),
        Instance("a", "src", 1, 0.2, False, "a@n2:sl", "n2"),
    )
    state = _cluster(nodes, insts, {"a": (("src", "agg"),), "b": (("src", "agg"),)})
    plan = get_strategy("liu", scale_in_patience=1).plan(state)
    assert plan.reasons[0].startswith("scale in: emptied node n2"), plan.reasons
    assert plan.moves[0].from_node == "n2"


def test_liu_moves_a_worker_where_it_disrupts_no_other_worker():
    # n1's a:sl worker could merge into a@n0:sl (the fullest node with room), which
    # would restart that worker too; n2 has room and no a:sl worker, so it goes there.
    nodes = tuple(Node(f"n{k}", 2.0) for k in range(3))
    insts = (
        Instance("a", "src", 0, 1.2, False, "a@n0:sl", "n0"),
        Instance("c", "src", 0, 0.6, False, "c@n0:sl", "n0"),
        Instance("a", "src", 1, 0.1, False, "a@n1:sl", "n1"),
        Instance("c", "src", 1, 1.0, False, "c@n2:sl", "n2"),
    )
    plan = get_strategy("liu").plan(_cluster(nodes, insts))
    assert [(m.instance, m.to_node) for m in plan.moves] == [("a/src/1", "n2")]
    assert plan.affected_workers == ("a@n1:sl",)
    assert plan.nodes_used == 2


def test_liu_default_patience_is_five_minutes_of_default_slots():
    # 30 plans at the controller's default 10 s slot: the HPA's 300 s downscale window.
    assert get_strategy("liu").scale_in_patience == 30
    state = _wordcount({"spout": 0.1, "split": 0.2, "count": 0.2})
    liu = get_strategy("liu")
    for waited in range(1, 30):
        plan = liu.plan(state)
        assert plan.moves == () and plan.affected_stateful_workers == ()
        assert any(f"emptiable {waited} of 30 plans" in r for r in plan.reasons), plan.reasons
    plan = liu.plan(state)
    assert plan.nodes_used == 1
    assert any(r.startswith("scale in: emptied node n0") for r in plan.reasons)


def _waiting_cluster(stateful_on_n1: float) -> PlacementInput:
    """n0 full; n1 holds a stateful worker of b and is emptiable (n2 has room for
    it); n2 holds only a stateless worker, whose only possible target is n1."""
    nodes = tuple(Node(f"n{k}", 2.0) for k in range(3))
    insts = (
        Instance("a", "src", 0, 1.9, False, "a@n0:sl", "n0"),
        Instance("b", "src", 0, 0.1, False, "b@n1:sl", "n1"),
        Instance("b", "agg", 0, stateful_on_n1, True, "b@n1:sf", "n1"),
        Instance("c", "src", 0, 0.3, False, "c@n2:sl", "n2"),
    )
    return _cluster(nodes, insts, {"b": (("src", "agg"),)})


def test_liu_empties_a_stateless_node_onto_a_waiting_node_at_once():
    # n1's stateful worker (0.1 of 2.0 cores) has room to double: n2's stateless
    # worker goes there now instead of keeping n2 busy through n1's whole wait.
    plan = get_strategy("liu").plan(_waiting_cluster(0.1))
    assert [(m.instance, m.from_node, m.to_node) for m in plan.moves] == [("c/src/0", "n2", "n1")]
    assert plan.affected_workers == ("c@n2:sl",)
    assert plan.affected_stateful_workers == ()
    assert plan.nodes_used == 2
    assert any("waiting before emptying n1" in r for r in plan.reasons), plan.reasons
    assert any(
        r.startswith("scale in: emptied node n2") and "waiting to be emptied" in r
        for r in plan.reasons
    ), plan.reasons


def test_liu_keeps_stateless_workers_off_a_waiting_node_without_stateful_growth_room():
    # n1's stateful worker takes 1.1 of 2.0 cores: it could not double there, so
    # stateless workers added to n1 would only make a rise in load restart more of it.
    state = _waiting_cluster(1.1)
    assert get_strategy("liu").plan(state).moves == ()
    # With a smaller growth room the same node is a target.
    plan = get_strategy("liu", stateful_growth=0.5).plan(state)
    assert [(m.from_node, m.to_node) for m in plan.moves] == [("n2", "n1")]


def test_liu_never_moves_a_stateful_worker_onto_a_waiting_node():
    # n2 (stateful, emptiable for 2 plans) may be emptied, but its only target is
    # n1, emptiable for 1 plan and still waiting: the stateful worker would carry
    # its state twice, so it stays.
    nodes = (Node("n0", 2.0), Node("n1", 3.0), Node("n2", 2.0))
    workers = (
        Worker("a@n0:sl", "a", "n0", False),
        Worker("b@n1:sf", "b", "n1", True),
        Worker("c@n2:sf", "c", "n2", True),
    )

    def state(b_demand: float) -> PlacementInput:
        insts = (
            Instance("a", "src", 0, 1.9, False, "a@n0:sl", "n0"),
            Instance("b", "agg", 0, b_demand, True, "b@n1:sf", "n1"),
            Instance("c", "agg", 0, 0.2, True, "c@n2:sf", "n2"),
        )
        return PlacementInput(nodes, insts, workers)

    liu = get_strategy("liu", scale_in_patience=2)
    # n1 at 2.5 cores: n2's 0.2 fits on n1, so n2 is emptiable; n1 fits nowhere.
    plan = liu.plan(state(2.5))
    assert plan.moves == ()
    assert any("n2 (stateful; emptiable 1 of 2 plans)" in r for r in plan.reasons)
    assert not any("n1 (stateful" in r for r in plan.reasons)
    # n1 at 1.4 cores fits on n2: emptiable too, for the first time (and with room
    # for its stateful worker to double, so not barred for that). n2's wait is
    # over, but its only target with room is the waiting n1.
    plan = liu.plan(state(1.4))
    assert plan.moves == (), plan.reasons
    assert any("n1 (stateful; emptiable 1 of 2 plans)" in r for r in plan.reasons)
    assert not any("n2 (stateful" in r for r in plan.reasons)
    # Nothing waits any more: the less loaded n2 empties onto n1.
    plan = liu.plan(state(1.4))
    assert [(m.from_node, m.to_node) for m in plan.moves] == [("n2", "n1")]


def test_liu_moves_nothing_onto_a_node_waiting_to_be_emptied():
    # n2 (stateless only) could go to n1, but n1 holds a stateful worker that uses
    # more than half of it and is itself waiting to be emptied: n2's worker would
    # move twice. n0 has no room.
    state = _waiting_cluster(1.1)
    liu = get_strategy("liu", scale_in_patience=2)
    first = liu.plan(state)
    assert first.moves == ()
    assert any("waiting before emptying n1" in r for r in first.reasons)
    # Once n1's wait is over it is a target like any other; stateless-only n2 goes
    # first, and n1's stateful worker stays where it is.
    second = liu.plan(state)
    assert [(m.from_node, m.to_node) for m in second.moves] == [("n2", "n1")]
    assert second.affected_stateful_workers == ()
    assert second.nodes_used == 2


def test_liu_replaces_instances_of_a_vanished_node():
    state = _wordcount({"spout": 0.2, "split": 0.3, "count": 0.3})
    gone = PlacementInput(
        tuple(n for n in state.nodes if n.id != "n1"),
        state.instances,
        state.workers,
        state.dags,
        {},
    )
    plan = get_strategy("liu", scale_in=False).plan(gone)
    assert plan.feasible
    assert all(node != "n1" for _, node in plan.assignment.values())
    moved = {m.instance for m in plan.moves}
    assert moved == {i.id for i in state.instances if i.node == "n1"}
    assert all(m.from_node == "n1" for m in plan.moves)
    assert any("node n1 is gone" in r for r in plan.reasons)
    # Workers on the vanished node are dead already, not counted as restarted by the plan.
    assert not any("@n1" in w for w in plan.affected_workers)


def test_liu_separates_a_mixed_worker_it_finds():
    nodes = (Node("n0", 4.0),)
    worker = Worker("wc@n0", "wc", "n0", None)
    insts = (
        Instance("wc", "split", 0, 0.5, False, "wc@n0", "n0"),
        Instance("wc", "count", 0, 0.5, True, "wc@n0", "n0"),
    )
    plan = get_strategy("liu").plan(PlacementInput(nodes, insts, (worker,)))
    assert plan.mixed_workers == 0
    assert any("mixes stateful and stateless" in r for r in plan.reasons)


# -- peaks: stateful instances keep room for the most they needed lately ---------


def test_liu_places_a_displaced_stateful_instance_where_its_peak_fits():
    # b's stateful instance lost its node. n0 has room for its demand now (0.4)
    # but b's peak (1.2) would not fit beside a's stateful peak there; n1 keeps
    # that room, so it goes to n1 although n0 comes first.
    nodes = (Node("n0", 2.0), Node("n1", 2.0))
    insts = (
        Instance("a", "agg", 0, 0.5, True, "a@n0:sf", "n0", peak_demand_cores=1.5),
        Instance("a", "src", 0, 0.6, False, "a@n1:sl", "n1"),
        Instance("b", "agg", 0, 0.4, True, "b@gone:sf", "gone", peak_demand_cores=1.2),
    )
    plan = get_strategy("liu", scale_in=False).plan(_cluster(nodes, insts))
    assert [(m.instance, m.to_node) for m in plan.moves] == [("b/agg/0", "n1")]
    # Without peaks the first node with room now takes it.
    flat = tuple(replace(i, peak_demand_cores=None) for i in insts)
    plan = get_strategy("liu", scale_in=False).plan(_cluster(nodes, flat))
    assert [(m.instance, m.to_node) for m in plan.moves] == [("b/agg/0", "n0")]


def test_liu_settles_for_room_now_when_no_node_has_room_for_the_peak():
    nodes = (Node("n0", 2.0),)
    insts = (
        Instance("a", "agg", 0, 0.5, True, "a@n0:sf", "n0", peak_demand_cores=1.5),
        Instance("b", "agg", 0, 0.4, True, "b@gone:sf", "gone", peak_demand_cores=1.2),
    )
    plan = get_strategy("liu", scale_in=False).plan(_cluster(nodes, insts))
    assert plan.feasible
    assert [(m.instance, m.to_node) for m in plan.moves] == [("b/agg/0", "n0")]
    assert any(
        r.startswith("no node has room for the peak of stateful instance(s) b/agg/0")
        for r in plan.reasons
    ), plan.reasons


def test_liu_first_placement_keeps_room_for_stateful_peaks_and_packs_stateless():
    nodes = tuple(Node(f"n{k}", 2.0) for k in range(3))
    insts = (
        Instance("a", "agg", 0, 0.5, True, peak_demand_cores=1.5),
        Instance("a", "agg", 1, 0.5, True, peak_demand_cores=1.5),
        Instance("a", "src", 0, 0.3, False, peak_demand_cores=1.5),
        Instance("a", "src", 1, 0.3, False, peak_demand_cores=1.5),
    )
    plan = get_strategy("liu").plan(PlacementInput(nodes, insts, (), {"a": (("src", "agg"),)}))
    node = {i: n for i, (_, n) in plan.assignment.items()}
    assert node["a/agg/0"] != node["a/agg/1"]  # 3.0 cores of peaks: not on one node
    assert node["a/src/0"] == node["a/src/1"]  # stateless instances pack by demand
    assert plan.nodes_used == 2
    flat = PlacementInput(nodes, tuple(replace(i, peak_demand_cores=None) for i in insts), (), {})
    assert get_strategy("liu").plan(flat).nodes_used == 1


def test_liu_scale_in_keeps_stateful_workers_apart_when_their_peaks_do_not_fit_together():
    nodes = (Node("n0", 2.0), Node("n1", 2.0))
    insts = (
        Instance("a", "agg", 0, 0.3, True, "a@n0:sf", "n0", peak_demand_cores=1.5),
        Instance("a", "agg", 1, 0.3, True, "a@n1:sf", "n1", peak_demand_cores=1.5),
    )
    liu = get_strategy("liu", scale_in_patience=1)
    for _ in range(3):
        plan = liu.plan(_cluster(nodes, insts))
        assert plan.moves == () and plan.nodes_used == 2
    # Peaks that fit together: the node empties.
    low = tuple(replace(i, peak_demand_cores=0.9) for i in insts)
    assert get_strategy("liu", scale_in_patience=1).plan(_cluster(nodes, low)).nodes_used == 1


def _stateless_only_on_n1() -> PlacementInput:
    """n0 busy with a stateful worker; n1 holds only a small stateless worker that
    fits beside n0's."""
    nodes = (Node("n0", 2.0), Node("n1", 2.0))
    insts = (
        Instance("a", "src", 0, 0.8, False, "a@n0:sl", "n0"),
        Instance("a", "agg", 0, 0.6, True, "a@n0:sf", "n0"),
        Instance("a", "src", 1, 0.2, False, "a@n1:sl", "n1"),
    )
    return _cluster(nodes, insts, {"a": (("src", "agg"),)})


def test_liu_empties_a_stateless_node_only_after_its_own_patience():
    state = _stateless_only_on_n1()
    # The default: at once, as the paper's Alg. 3.
    assert get_strategy("liu").plan(state).nodes_used == 1
    liu = get_strategy("liu", stateless_scale_in_patience=3)
    for waited in (1, 2):
        plan = liu.plan(state)
        assert plan.moves == (), plan.reasons
        assert any(f"n1 (stateless; emptiable {waited} of 3 plans)" in r for r in plan.reasons)
    plan = liu.plan(state)
    assert [(m.instance, m.from_node, m.to_node) for m in plan.moves] == [("a/src/1", "n1", "n0")]
    assert plan.nodes_used == 1


def test_liu_stateless_patience_counts_consecutive_plans_only():
    low = _stateless_only_on_n1()
    busy = _cluster(
        low.nodes,
        tuple(replace(i, demand_cores=1.5) if i.node == "n1" else i for i in low.instances),
        low.dags,
    )
    liu = get_strategy("liu", stateless_scale_in_patience=2)
    assert liu.plan(low).moves == ()
    liu.observe(busy)  # not emptiable in this epoch: the count starts again
    assert liu.plan(low).moves == ()
    assert liu.plan(low).nodes_used == 1


def test_liu_refuses_a_bad_stateless_patience():
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="stateless_scale_in_patience"):
            get_strategy("liu", stateless_scale_in_patience=bad)
