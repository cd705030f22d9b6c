"""The two-stage placers of the MIPS paper (MIPS, FFD, R-Heron, T-Heron), the
network topologies they are charged on, and ``aniello-online`` with both phases."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controller.placement import Instance, Node, PlacementInput, apply_plan, get_strategy
from controller.placement import topology as net
from controller.placement.mcts import StageProblem, StageSearch
from controller.placement.model import EPSILON_CORES
from controller.placement.twostage import (
    MctsOptions,
    NoRoom,
    Request,
    best_fit,
    ffd,
    mips_csmp,
    mips_icmp,
    place_request,
    place_sequence,
    r_heron,
    t_heron,
)

PROPERTY = settings(
    max_examples=12,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)

# -- topologies -------------------------------------------------------------------


def test_fat_tree_hops_are_two_four_and_six():
    ft = net.fat_tree(4)
    assert len(ft.servers) == 16 and ft.diameter == 6
    # s0, s1 share an edge switch; s2 is in the same pod; s4 is in the next pod.
    assert [ft.distance("s0", s) for s in ("s0", "s1", "s2", "s4")] == [0, 2, 4, 6]


def test_jellyfish_is_connected_regular_and_reproducible():
    a = net.jellyfish(8, 6, 2, seed=5)
    b = net.jellyfish(8, 6, 2, seed=5)
    assert a == b and len(a.servers) == 16
    assert a.distance("s0", "s1") == 2  # one top-of-rack switch
    assert all(h >= 3 for h in a.hops[0][2:])  # other racks: at least one switch hop


def test_flat_is_one_hop_everywhere():
    f = net.flat(["a", "b", "c"])
    assert f.hops == ((0, 1, 1), (1, 0, 1), (1, 1, 0)) and f.diameter == 1


def test_a_network_with_unreachable_servers_is_refused_naming_them():
    with pytest.raises(ValueError, match=r"unreachable servers.*\(c, d\)"):
        net.from_links(["a", "b", "c", "d"], [("a", "sw"), ("b", "sw"), ("c", "sw2"), ("d", "sw2")])


def test_unknown_network_kind_is_refused():
    with pytest.raises(ValueError, match="network topology must be one of"):
        net.build("torus", ["a", "b"])
    with pytest.raises(ValueError, match="topology must be one of"):
        get_strategy("mips", topology="torus")


# -- requests and their refusals ------------------------------------------------------


def _chain(name: str = "r", par: int = 2, demand: float = 1.0, containers: int = 3, cap=4.0):
    comps = ("a", "b", "c")
    insts = tuple(f"{c}.{k}" for c in comps for k in range(par))
    traffic = {
        (f"{x}.{i}", f"{y}.{j}"): 60.0 / (par * par)
        for x, y in (("a", "b"), ("b", "c"))
        for i in range(par)
        for j in range(par)
    }
    return Request(
        name,
        insts,
        (demand,) * len(insts),
        tuple(i.split(".")[0] for i in insts),
        traffic,
        containers,
        cap,
        (("a", "b"), ("b", "c")),
    )


def test_a_request_larger_than_the_cluster_is_refused_naming_it():
    request = _chain("big", par=4, demand=1.0, containers=4, cap=4.0)  # 12 cores
    topo = net.flat(["s0", "s1"])
    with pytest.raises(ValueError, match="request 'big' is larger than the cluster"):
        place_request(request, {"s0": 5.0, "s1": 5.0}, topo, ffd, best_fit, random.Random(0))
    # A container that fits on no server is the same refusal.
    small = _chain("big", par=1, demand=1.0, containers=1, cap=4.0)
    with pytest.raises(ValueError, match="request 'big' is larger than the cluster.*container"):
        place_request(small, {"s0": 3.0, "s1": 3.0}, topo, ffd, best_fit, random.Random(0))


def test_a_request_whose_containers_cannot_hold_it_is_refused():
    with pytest.raises(ValueError, match="more than its 1 containers"):
        _chain("tight", par=2, demand=1.0, containers=1, cap=4.0)


def test_zero_samples_per_decision_is_refused_naming_it():
    with pytest.raises(ValueError, match="samples_per_decision must be an int >= 1, got 0"):
        MctsOptions(samples_per_decision=0)
    with pytest.raises(ValueError, match="samples_per_decision must be an int >= 1, got 0"):
        get_strategy("mips", samples_per_decision=0)
    with pytest.raises(ValueError, match="samples_per_decision"):
        get_strategy("mips", samples=0)


def test_mips_takes_the_configurations_option_names():
    s = get_strategy("mips", samples=7, container_weight=1.0, node_weight=0.1, epsilon=0.2)
    assert (s.samples_per_decision, s.samples, s.alpha) == (7, 7, 0.5)
    assert get_strategy("mips", container_weight=0.0).alpha == 1.0
    with pytest.raises(ValueError, match="not both"):
        get_strategy("mips", alpha=0.5, container_weight=1.0)
    with pytest.raises(ValueError, match="same budget"):
        get_strategy("mips", samples=4, samples_per_decision=8)


def test_ffd_has_no_room_when_its_containers_fragment():
    # 3 x 0.6 in 2 containers of 1.0 is 1.8 <= 2.0 cores, yet no two share a container.
    r = Request("frag", ("x", "y", "z"), (0.6, 0.6, 0.6), ("a", "a", "a"), {}, 2, 1.0)
    with pytest.raises(NoRoom, match="instance z fits in none of its 2 containers"):
        ffd(r)


# -- the search -----------------------------------------------------------------


def test_mcts_finds_the_mapping_without_cross_container_traffic():
    # Two chatty pairs, two containers each holding one pair: the optimum is zero traffic.
    request = Request(
        "pairs",
        ("a0", "b0", "a1", "b1"),
        (1.0, 1.0, 1.0, 1.0),
        ("a", "b", "a", "b"),
        {("a0", "b0"): 50.0, ("a1", "b1"): 50.0, ("a0", "b1"): 1.0},
        2,
        2.0,
        (("a", "b"),),
    )
    place = mips_icmp(1.0, MctsOptions(samples_per_decision=16))
    c = place(request, random.Random(0))
    assert c[0] == c[1] and c[2] == c[3] and c[0] != c[2]


def test_mcts_stage_two_keeps_talking_containers_close():
    # Two containers that talk, four servers: the same server (0 hops) beats any other.
    problem = StageProblem(
        demand=(4.0, 4.0),
        room=(8.0, 8.0, 8.0, 8.0),
        edges=((0, 1, 10.0),),
        distance=tuple(
            tuple(float(h) for h in row)
            for row in net.fat_tree(4).restricted(["s0", "s2", "s4", "s8"]).hops
        ),
        traffic_weight=0.1,
        bin_weight=0.0,
    )
    result = StageSearch(problem, random.Random(1)).run(8)
    assert result.assign[0] == result.assign[1] and result.cost == 0.0


def test_every_refinement_can_be_switched_off_and_still_places():
    request = _chain(par=3, demand=0.5, containers=3, cap=2.0)
    for prior in (True, False):
        for expansion in (True, False):
            opts = MctsOptions(samples_per_decision=8, prior=prior, expansion=expansion)
            c = mips_icmp(0.5, opts)(request, random.Random(2))
            assert all(0 <= x < 3 for x in c)


# -- stage placers as properties ----------------------------------------------------------


@st.composite
def requests(draw):
    comps = draw(st.integers(2, 4))
    par = [draw(st.integers(1, 3)) for _ in range(comps)]
    dem = [draw(st.sampled_from([0.25, 0.5, 1.0])) for _ in range(comps)]
    insts, demand, comp = [], [], []
    for c in range(comps):
        for k in range(par[c]):
            insts.append(f"c{c}.{k}")
            demand.append(dem[c])
            comp.append(f"c{c}")
    traffic = {
        (f"c{c}.{i}", f"c{c + 1}.{j}"): 10.0
        for c in range(comps - 1)
        for i in range(par[c])
        for j in range(par[c + 1])
    }
    cap = 2.0
    count = draw(st.integers(2, 4)) + int(sum(demand) // cap)
    edges = tuple((f"c{c}", f"c{c + 1}") for c in range(comps - 1))
    return Request("q", tuple(insts), tuple(demand), tuple(comp), traffic, count, cap, edges)


STAGE1 = {
    "ffd": ffd,
    "r-heron": r_heron,
    "t-heron": t_heron,
    "mips": mips_icmp(0.5, MctsOptions(samples_per_decision=8)),
}


@PROPERTY
@given(requests(), st.integers(0, 3))
def test_stage_one_places_every_instance_within_container_capacity(request, seed):
    for name, place in STAGE1.items():
        try:
            c = place(request, random.Random(seed))
        except NoRoom:
            # Greedy placers may fragment; MIPS searches and must find room.
            assert name != "mips", "mips found no room"
            continue
        assert len(c) == len(request.instances) and all(0 <= x < request.containers for x in c)
        load = [0.0] * request.containers
        for i, x in enumerate(c):
            load[x] += request.demand[i]
        assert max(load) <= request.container_cores + EPSILON_CORES, name
        assert place(request, random.Random(seed)) == c, f"{name} is not deterministic"


@PROPERTY
@given(st.lists(requests(), min_size=1, max_size=3), st.sampled_from(["fat-tree", "jellyfish"]))
def test_mips_two_stages_respect_server_capacity_in_sequence(reqs, kind):
    reqs = [
        Request(
            f"q{k}",
            r.instances,
            r.demand,
            r.component,
            r.traffic,
            r.containers,
            r.container_cores,
            r.edges,
        )
        for k, r in enumerate(reqs)
    ]
    topo = net.fat_tree(4) if kind == "fat-tree" else net.jellyfish(8, 6, 2, seed=3)
    caps = {s: 8.0 for s in topo.servers}
    opts = MctsOptions(samples_per_decision=4)
    runs = [
        place_sequence(reqs, caps, topo, mips_icmp(0.5, opts), mips_csmp(opts), seed=1)
        for _ in range(2)
    ]
    used = dict.fromkeys(topo.servers, 0.0)
    for placed in runs[0]:
        for c, s in placed.server_of.items():
            used[s] += placed.size[c]
        assert set(placed.server_of) == set(placed.container_of)
    assert all(used[s] <= caps[s] + EPSILON_CORES for s in used)
    assert [p.container_of for p in runs[0]] == [p.container_of for p in runs[1]]
    assert [p.server_of for p in runs[0]] == [p.server_of for p in runs[1]]


# -- the strategies as properties ----------------------------------------------------------


@st.composite
def clusters(draw):
    """An unplaced cluster at most 40% full, every instance under a quarter of a node."""
    nodes = draw(st.integers(2, 4))
    apps = draw(st.integers(1, 2))
    insts, traffic, dags = [], {}, {}
    budget = 0.4 * nodes * 2.0
    for a in range(apps):
        ops = draw(st.integers(1, 3))
        by_op = []
        for o in range(ops):
            count = draw(st.integers(1, 3))
            d = draw(st.sampled_from([0.1, 0.2, 0.3, 0.5]))
            row = [Instance(f"app{a}", f"op{o}", k, d, o == ops - 1) for k in range(count)]
            by_op.append(row)
            insts += row
        dags[f"app{a}"] = tuple((f"op{o}", f"op{o + 1}") for o in range(ops - 1))
        for o in range(ops - 1):
            for x in by_op[o]:
                for y in by_op[o + 1]:
                    traffic[(x.id, y.id)] = draw(st.sampled_from([5.0, 50.0]))
    total = sum(i.demand_cores for i in insts)
    if total > budget:
        scale = budget / total
        insts = [
            Instance(i.app, i.operator, i.index, round(i.demand_cores * scale, 4), i.stateful)
            for i in insts
        ]
    return PlacementInput(
        tuple(Node(f"n{k}", 2.0) for k in range(nodes)), tuple(insts), (), dags, traffic
    )


CHANGED = {
    "mips": {"samples_per_decision": 4, "seed": 2},
    "mips-fat-tree": {"samples_per_decision": 4, "seed": 2, "topology": "fat-tree"},
    "ffd-bestfit": {},
    "r-heron": {},
    "t-heron": {},
    "aniello-online": {},
}


@PROPERTY
@given(clusters())
def test_changed_strategies_place_everything_within_capacity_deterministically(state):
    for label, options in CHANGED.items():
        name = "mips" if label.startswith("mips") else label
        a = get_strategy(name, **options).plan(state)
        b = get_strategy(name, **options).plan(state)
        assert set(a.assignment) == {i.id for i in state.instances}, label
        assert a.feasible, (label, a.overloaded_nodes, a.reasons)
        assert a.assignment == b.assignment, f"{label} is not deterministic"


# -- aniello-online ----------------------------------------------------------------------


def _app(instances: int, demand: float, nodes: int = 3, clocks=None) -> PlacementInput:
    insts = [Instance("t", f"op{k % 3}", k // 3, demand, False) for k in range(instances)]
    traffic = {(insts[k].id, insts[k + 1].id): 10.0 * (k + 1) for k in range(instances - 1)}
    node_list = tuple(
        Node(f"n{k}", 2.0, None if clocks is None else clocks[k]) for k in range(nodes)
    )
    return PlacementInput(node_list, tuple(insts), (), {}, traffic)


@pytest.mark.parametrize("instances, workers, expected", [(7, 3, 3), (7, None, 3), (2, 5, 2)])
def test_aniello_online_uses_exactly_min_executors_workers(instances, workers, expected):
    state = _app(instances, 0.1)
    plan = get_strategy("aniello-online", workers_per_app=workers).plan(state)
    assert len({w for w, _ in plan.assignment.values()}) == expected


def test_aniello_online_waits_out_the_overload_window():
    state = _app(6, 0.3)
    strategy = get_strategy("aniello-online", window_seconds=15.0, slot_seconds=10.0)
    placed = apply_plan(state, strategy.plan(state))
    # Everything onto n0 (1.8 > 1.5 usable): overloaded, and kept for one slot.
    n0 = next(w for w in placed.workers if w.node == "n0")
    crowded = PlacementInput(
        placed.nodes,
        tuple(replace(i, worker=n0.id, node="n0") for i in placed.instances),
        placed.workers,
        placed.dags,
        placed.traffic,
    )
    first = strategy.plan(crowded, headroom_cores=0.5)
    assert first.moves == () and any("window 15s" in r for r in first.reasons)
    second = strategy.plan(crowded, headroom_cores=0.5)
    assert second.moves and any("longer than the 15s window" in r for r in second.reasons)


def test_aniello_online_measures_load_in_hertz():
    # Six 0.5-core instances measured on a 1 GHz node; n1 runs at 2 GHz, so each
    # needs only 0.25 of its cores: all six fit n1 (1.5 cores) but not n0 (3 cores).
    base = _app(6, 0.5, nodes=2, clocks=[1e9, 2e9])
    from controller.placement.aniello import capacity_hz, load_hz

    assert capacity_hz(base, 0.0) == {"n0": 2e9, "n1": 4e9}
    assert set(load_hz(base).values()) == {0.5 * 1.5e9}  # unplaced: the mean clock
    plan = get_strategy("aniello-online", workers_per_app=1).plan(base)
    # One worker of 4.5 GHz: only the 2 GHz node (4 GHz) comes close; n0 holds 2 GHz.
    assert {n for _, n in plan.assignment.values()} == {"n1"}
    assert any("fits on no node" in r for r in plan.reasons)


def test_a_node_clock_must_be_positive():
    with pytest.raises(ValueError, match="clock_hz of node n0 must be > 0"):
        Node("n0", 2.0, 0.0)


def test_the_controller_counts_the_window_in_its_own_slots():
    from controller.placement.stage import build_strategy

    assert build_strategy("aniello-online", 5.0, 300.0).slot_seconds == 5.0
