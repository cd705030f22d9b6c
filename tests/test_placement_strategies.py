"""Every placement strategy behind the one interface, on the same inputs."""

from __future__ import annotations

import pytest

from controller.placement import (
    STRATEGIES,
    Instance,
    Node,
    PlacementInput,
    apply_plan,
    get_strategy,
)


def _pipeline(demand: float = 0.25, nodes: int = 3, capacity: float = 2.0, rate: float = 100.0):
    """src -> mid -> sink (sink stateful), two instances each, unplaced."""
    edges = (("src", "mid"), ("mid", "sink"))
    insts = [
        Instance("p", op, k, demand, op == "sink")
        for op in ("src", "mid", "sink")
        for k in range(2)
    ]
    traffic = {
        (a.id, b.id): rate
        for a in insts
        for b in insts
        if (a.operator, b.operator) in edges and a.index == b.index
    }
    return PlacementInput(
        tuple(Node(f"n{k}", capacity) for k in range(nodes)),
        tuple(insts),
        (),
        {"p": edges},
        traffic,
    )


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_initial_placement_places_every_instance_once(name):
    state = _pipeline()
    plan = get_strategy(name).plan(state)
    assert set(plan.assignment) == {i.id for i in state.instances}
    assert len(plan.moves) == len(state.instances)
    assert all(m.from_worker is None for m in plan.moves)
    assert plan.affected_workers == ()
    assert plan.stateful_moves == 0
    assert plan.plan_seconds >= 0
    workers = {w.id: w for w in plan.workers}
    for _inst, (worker, node) in plan.assignment.items():
        assert workers[worker].node == node


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_a_placement_that_fits_is_kept(name):
    state = _pipeline()
    placed = apply_plan(state, get_strategy(name).plan(state))
    options = {"scale_in": False} if name == "liu" else {}
    if name == "aniello-online":
        options = {"threshold_percent": 100.0}
    again = get_strategy(name, **options).plan(placed)
    if not get_strategy(name).plan(state).feasible:
        pytest.skip(f"{name} found no placement within capacity for this input")
    assert again.moves == ()
    assert again.affected_workers == ()


def test_even_spreads_round_robin_over_all_nodes():
    plan = get_strategy("even").plan(_pipeline())
    assert plan.nodes_used == 3
    per_node = {}
    for _, node in plan.assignment.values():
        per_node[node] = per_node.get(node, 0) + 1
    assert sorted(per_node.values()) == [2, 2, 2]


def test_rstorm_packs_by_best_fit_without_overload():
    plan = get_strategy("rstorm").plan(_pipeline(demand=0.6))  # 3.6 cores on 2-core nodes
    assert plan.feasible
    assert plan.nodes_used == 2


def test_sam_gives_a_full_bundle_an_exclusive_slot():
    # 0.5-core instances, 1-core slots: each operator's two instances fill one slot.
    plan = get_strategy("sam").plan(_pipeline(demand=0.5))
    state = _pipeline(demand=0.5)
    ops_per_worker = {}
    for inst in state.instances:
        ops_per_worker.setdefault(plan.assignment[inst.id][0], set()).add(inst.operator)
    assert all(len(ops) == 1 for ops in ops_per_worker.values())
    assert len(ops_per_worker) == 3
    assert plan.mixed_workers == 0


def test_aniello_offline_joins_instances_with_their_upstream_worker():
    state = _pipeline()
    plan = get_strategy("aniello-offline", workers_per_app=2).plan(state)
    worker_of = {i: w for i, (w, _) in plan.assignment.items()}
    mid_workers = {worker_of[f"p/mid/{k}"] for k in range(2)}
    src_workers = {worker_of[f"p/src/{k}"] for k in range(2)}
    assert mid_workers <= src_workers


def _split_pipeline():
    """Pipeline placed so that every edge crosses nodes (each operator on its own node)."""
    state = _pipeline(demand=0.2)
    insts = tuple(
        Instance(
            i.app,
            i.operator,
            i.index,
            i.demand_cores,
            i.stateful,
            f"p@n{('src', 'mid', 'sink').index(i.operator)}",
            f"n{('src', 'mid', 'sink').index(i.operator)}",
        )
        for i in state.instances
    )
    from controller.placement import Worker

    workers = tuple(Worker(f"p@n{k}", "p", f"n{k}", None) for k in range(3))
    return PlacementInput(state.nodes, insts, workers, state.dags, state.traffic)


def test_aniello_online_reschedules_only_when_traffic_falls_more_than_threshold():
    state = _split_pipeline()
    assert get_strategy("aniello-online", threshold_percent=100.0).plan(state).moves == ()
    plan = get_strategy("aniello-online", threshold_percent=10.0).plan(state)
    assert plan.moves
    assert plan.inter_node_traffic_after < 0.9 * plan.inter_node_traffic_before
    assert any("more than 10%" in r for r in plan.reasons)


def test_mips_anytime_is_reproducible_for_a_seed_and_reports_its_samples():
    state = _pipeline(demand=0.6, nodes=4)
    a = get_strategy("mips-anytime", samples=64, seed=3).plan(state)
    b = get_strategy("mips-anytime", samples=64, seed=3).plan(state)
    assert a.assignment == b.assignment
    assert any("MCTS with 32+32 samples (seed 3)" in r for r in a.reasons)
    assert a.feasible


def test_mips_keeps_chatty_instances_together():
    # Everything fits one 2-core node: the best plan has no inter-node traffic.
    plan = get_strategy("mips", samples=128, seed=0).plan(_pipeline(demand=0.3, nodes=3))
    assert plan.inter_node_traffic_after == 0.0
    even = get_strategy("even").plan(_pipeline(demand=0.3, nodes=3))
    assert even.inter_node_traffic_after > 0.0


def test_liu_affects_fewer_stateful_workers_than_a_mixed_worker_placer():
    # Growth on a mixed placement vs a separated one: only liu keeps stateful workers untouched.
    state = _pipeline(demand=0.3, nodes=3, capacity=1.0)
    results = {}
    for name in ("liu", "rstorm"):
        placed = apply_plan(state, get_strategy(name).plan(state))
        grown = PlacementInput(
            placed.nodes,
            tuple(
                Instance(
                    i.app,
                    i.operator,
                    i.index,
                    0.45 if not i.stateful else i.demand_cores,
                    i.stateful,
                    i.worker,
                    i.node,
                )
                for i in placed.instances
            ),
            placed.workers,
            placed.dags,
            placed.traffic,
        )
        results[name] = get_strategy(name).plan(grown)
    assert results["liu"].feasible
    assert len(results["liu"].affected_stateful_workers) == 0
    assert len(results["rstorm"].affected_stateful_workers) >= 1
