"""Two-stage placers behind the strategy interface: the comparators of "MIPS:
Instance Placement for Stream Processing Systems based on Monte Carlo Tree
Search" (Huang et al., §IV-A), each followed by Nomad's best fit as the paper
runs them: ``ffd-bestfit``, ``r-heron`` and ``t-heron``; and the base class
``mips`` (:mod:`controller.placement.mips_paper`) shares.

Each application is one request (§II-D), taken in name order on the room the
earlier ones left: a fixed number of containers of one capacity
(``containers_per_app`` and ``container_cores``; by default as large as the
smallest node's usable room, and as many as first fit decreasing needs plus
one, so stage 1 has a choice). A container becomes a worker on its node and
takes the load of its instances there (not its whole capacity: here a node's
room is CPU the instances use). Like the other replanners they keep the
placement while it fits and otherwise place everything again. An application
for which the placer finds no room (or that is larger than the cluster) is
placed instance by instance on the roomiest node, and the plan says so.
"""

from __future__ import annotations

import math
import random

from controller.placement.baselines import ReplanningStrategy, _check_count, _check_number
from controller.placement.common import GroupKey, bfs_instances, least_loaded_fallback
from controller.placement.model import EPSILON_CORES, PlacementInput
from controller.placement.topology import TOPOLOGIES, NetworkTopology, build
from controller.placement.twostage import (
    Request,
    Stage1,
    Stage2,
    best_fit,
    ffd,
    place_request,
    r_heron,
    t_heron,
)


def requests_of(
    state: PlacementInput,
    container_cores: float | None,
    containers_per_app: int | None,
    usable: dict[str, float],
) -> list[Request]:
    """One request per application (by name), instances in breadth-first order."""
    positive = [c for c in usable.values() if c > EPSILON_CORES]
    by_app: dict[str, list] = {}
    for inst in bfs_instances(state):
        by_app.setdefault(inst.app, []).append(inst)
    out = []
    for app in sorted(by_app):
        insts = by_app[app]
        ids = {i.id for i in insts}
        demand = tuple(i.demand_cores for i in insts)
        cap = container_cores or (min(positive) if positive else 1.0)
        cap = max(cap, max(demand), EPSILON_CORES)
        if containers_per_app is None:
            probe = Request(
                app, tuple(i.id for i in insts), demand, ("x",) * len(insts), {}, len(insts), cap
            )
            count = min(len(insts), len(set(ffd(probe))) + 1)
        else:
            count = max(containers_per_app, math.ceil(sum(demand) / cap - 1e-9))
        out.append(
            Request(
                app,
                tuple(i.id for i in insts),
                demand,
                tuple(i.operator for i in insts),
                {k: r for k, r in state.traffic.items() if k[0] in ids and k[1] in ids},
                count,
                cap,
                tuple(state.dags.get(app, ())),
            )
        )
    return out


class TwoStageStrategy(ReplanningStrategy):
    """Requests (one per application) through a stage-1 and a stage-2 placer."""

    stage_names = ("", "")

    def __init__(
        self,
        container_cores: float | None = None,
        containers_per_app: int | None = None,
        topology: str = "flat",
        topology_seed: int = 0,
        seed: int = 0,
    ) -> None:
        self.container_cores = (
            None
            if container_cores is None
            else _check_number("container_cores", container_cores, 1e-6)
        )
        self.containers_per_app = _check_count("containers_per_app", containers_per_app)
        if topology not in TOPOLOGIES:
            raise ValueError(f"topology must be one of {', '.join(TOPOLOGIES)}, got {topology!r}")
        self.topology = topology
        for name, value in (("topology_seed", topology_seed), ("seed", seed)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{name} must be an int, got {value!r}")
        self.topology_seed = topology_seed
        self.seed = seed

    def stages(self) -> tuple[Stage1, Stage2]:
        raise NotImplementedError

    def network(self, state: PlacementInput) -> NetworkTopology:
        return build(self.topology, state.node_ids, seed=self.topology_seed)

    def fresh(self, state, headroom_cores):
        usable = {n: state.capacity(n, headroom_cores) for n in state.node_ids}
        free = dict(usable)
        network = self.network(state)
        stage1, stage2 = self.stages()
        rng = random.Random(self.seed)
        groups: dict[str, GroupKey] = {}
        reasons = [f"{self.stage_names[0]} then {self.stage_names[1]}, one request per application"]
        for request in requests_of(state, self.container_cores, self.containers_per_app, usable):
            try:
                placed = place_request(
                    request, free, network, stage1, stage2, rng, reserve_full=False
                )
            except ValueError as exc:
                reasons.append(f"{exc}; its instances go to the roomiest nodes")
                for inst, need in zip(request.instances, request.demand, strict=True):
                    node = least_loaded_fallback(state, free, need)
                    free[node] -= need
                    groups[inst] = GroupKey(node, "fallback")
                continue
            for inst, c in zip(request.instances, placed.container_of, strict=True):
                groups[inst] = GroupKey(placed.server_of[c], f"c{c}")
        return groups, reasons


class FfdBestFitStrategy(TwoStageStrategy):
    """Heron's first fit decreasing into containers, then Nomad's best fit."""

    name = "ffd-bestfit"
    stage_names = ("first fit decreasing", "best fit")

    def stages(self):
        return ffd, best_fit


class RHeronStrategy(TwoStageStrategy):
    """R-Heron (resource distance in breadth-first order), then best fit."""

    name = "r-heron"
    stage_names = ("R-Heron", "best fit")

    def stages(self):
        return r_heron, best_fit


class THeronStrategy(TwoStageStrategy):
    """T-Heron (least added traffic, chattiest first), then best fit."""

    name = "t-heron"
    stage_names = ("T-Heron", "best fit")

    def stages(self):
        return t_heron, best_fit


__all__ = [
    "FfdBestFitStrategy",
    "RHeronStrategy",
    "THeronStrategy",
    "TwoStageStrategy",
    "requests_of",
]
