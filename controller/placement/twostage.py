"""Two-stage placement as "MIPS: Instance Placement for Stream Processing
Systems based on Monte Carlo Tree Search" (Huang et al., §II) models it.

Requests arrive one after another. Each names its instances (with CPU
demand), the traffic between them, and a fixed number of containers of one
capacity (§II-D). Stage 1 (ICMP) maps instances to those containers; stage 2
(CSMP) maps the containers used to servers, on the room earlier requests left
(§II-E). The objectives (§II-F, §II-G), normalised so that they add up:

- ICMP (8): ``alpha * cross-container traffic / request traffic +
  (1 - alpha) * containers used / containers given``;
- CSMP (9): ``sum(rate * hops) / (request traffic * network diameter)``;
- combined: their sum, the figure the placement benchmark ranks by.

Stage-1 placers: ``mips`` (MCTS, :mod:`controller.placement.mcts`) and the
paper's comparators (§IV-A): ``ffd`` (Heron's first fit decreasing),
``r-heron`` and ``t-heron``. Stage-2 placers: ``mips`` and ``best-fit``
(Nomad's). Bad input is refused with a ValueError naming it: a request larger
than the cluster, a container larger than any server, an instance larger
than a container. A request that fits in total but for which a placer finds
no room raises :class:`NoRoom` (a ValueError too).
"""

from __future__ import annotations

import math
import random
import time
from collections import defaultdict, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from controller.placement.mcts import StageProblem, StageSearch
from controller.placement.model import EPSILON_CORES
from controller.placement.topology import NetworkTopology


class NoRoom(ValueError):
    """A placer found no container (or server) with room for an item."""


@dataclass(frozen=True)
class Request:
    """One application to deploy: ``instances`` (ids) with ``demand`` (cores),
    ``component`` of each, ``edges`` between components (for breadth-first
    orders), ``traffic`` between instances (tuples/s), and ``containers``
    containers of ``container_cores`` each."""

    name: str
    instances: tuple[str, ...]
    demand: tuple[float, ...]
    component: tuple[str, ...]
    traffic: Mapping[tuple[str, str], float]
    containers: int
    container_cores: float
    edges: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        n = len(self.instances)
        if n == 0:
            raise ValueError(f"request {self.name!r} has no instances")
        if len(self.demand) != n or len(self.component) != n:
            raise ValueError(f"request {self.name!r}: one demand and component per instance")
        if len(set(self.instances)) != n:
            raise ValueError(f"request {self.name!r} lists an instance twice")
        if isinstance(self.containers, bool) or not isinstance(self.containers, int):
            raise ValueError(f"request {self.name!r}: containers must be an int")
        if self.containers < 1:
            raise ValueError(f"request {self.name!r}: containers must be >= 1")
        if not (self.container_cores > 0 and math.isfinite(self.container_cores)):
            raise ValueError(f"request {self.name!r}: container_cores must be > 0")
        for i, d in zip(self.instances, self.demand, strict=True):
            if not (d >= 0 and math.isfinite(d)):
                raise ValueError(f"request {self.name!r}: demand of {i} must be >= 0")
            if d > self.container_cores + EPSILON_CORES:
                raise ValueError(
                    f"request {self.name!r}: instance {i} needs {d:g} cores, more than a "
                    f"container's {self.container_cores:g}"
                )
        known = set(self.instances)
        for (a, b), rate in self.traffic.items():
            if a not in known or b not in known:
                raise ValueError(f"request {self.name!r}: traffic names unknown instance")
            if not (rate >= 0 and math.isfinite(rate)):
                raise ValueError(f"request {self.name!r}: traffic {a} -> {b} must be >= 0")
        total = sum(self.demand)
        if total > self.containers * self.container_cores + EPSILON_CORES:
            raise ValueError(
                f"request {self.name!r} needs {total:g} cores, more than its {self.containers} "
                f"containers of {self.container_cores:g} hold"
            )

    @property
    def total_traffic(self) -> float:
        return sum(self.traffic.values())

    def index(self) -> dict[str, int]:
        return {i: k for k, i in enumerate(self.instances)}

    def pairs(self) -> list[tuple[int, int, float]]:
        """Traffic as (instance position, instance position, rate), self-loops dropped."""
        pos = self.index()
        return [(pos[a], pos[b], r) for (a, b), r in self.traffic.items() if a != b and r > 0]


def check_fits(request: Request, free: Mapping[str, float], reserve_full: bool) -> None:
    """Refuse a request larger than the cluster's free room, naming it.

    With ``reserve_full`` a container takes its whole capacity on a server
    (as a resource manager reserves it), so one larger than every server's
    room is refused too.
    """
    room = sum(max(0.0, f) for f in free.values())
    need = sum(request.demand)
    if need > room + EPSILON_CORES:
        raise ValueError(
            f"request {request.name!r} is larger than the cluster: it needs {need:g} cores, "
            f"the servers have {room:g} free"
        )
    if reserve_full and request.container_cores > max(free.values(), default=0.0) + EPSILON_CORES:
        raise ValueError(
            f"request {request.name!r} is larger than the cluster: a container of "
            f"{request.container_cores:g} cores fits on no server"
        )


# -- objectives -------------------------------------------------------------


@dataclass(frozen=True)
class Figures:
    """What one request's placement costs (§II-F)."""

    cross_container_traffic: float
    containers: int
    cross_server_traffic_hops: float
    icmp_cost: float
    csmp_cost: float

    @property
    def combined_cost(self) -> float:
        return self.icmp_cost + self.csmp_cost


def icmp_cost(request: Request, container_of: Sequence[int], alpha: float) -> float:
    total = request.total_traffic or 1.0
    cross = sum(r for i, j, r in request.pairs() if container_of[i] != container_of[j])
    used = len(set(container_of))
    return alpha * cross / total + (1.0 - alpha) * used / request.containers


def figures(
    request: Request,
    container_of: Sequence[int],
    server_of: Mapping[int, str],
    topology: NetworkTopology,
    alpha: float,
) -> Figures:
    pairs = request.pairs()
    cross = sum(r for i, j, r in pairs if container_of[i] != container_of[j])
    hops = sum(
        r * topology.distance(server_of[container_of[i]], server_of[container_of[j]])
        for i, j, r in pairs
    )
    total = request.total_traffic or 1.0
    return Figures(
        cross_container_traffic=cross,
        containers=len(set(container_of)),
        cross_server_traffic_hops=hops,
        icmp_cost=icmp_cost(request, container_of, alpha),
        csmp_cost=hops / (total * topology.diameter),
    )


# -- stage 1: instances -> containers ------------------------------------------------

Stage1 = Callable[[Request, random.Random], list[int]]


def _neighbours(request: Request) -> list[dict[int, float]]:
    out: list[dict[int, float]] = [{} for _ in request.instances]
    for i, j, r in request.pairs():
        out[i][j] = out[i].get(j, 0.0) + r
        out[j][i] = out[j].get(i, 0.0) + r
    return out


def _no_room(request: Request, i: int) -> NoRoom:
    return NoRoom(
        f"request {request.name!r}: instance {request.instances[i]} fits in none of its "
        f"{request.containers} containers"
    )


def ffd(request: Request, rng: random.Random | None = None) -> list[int]:
    """Heron's first fit decreasing (§IV-A): instances by decreasing demand;
    each to the first active container, active ones sorted by most room
    first, with room for it; else a new container."""
    room = [request.container_cores] * request.containers
    active: list[int] = []
    out = [-1] * len(request.instances)
    order = sorted(range(len(out)), key=lambda i: (-request.demand[i], i))
    for i in order:
        need = request.demand[i] - EPSILON_CORES
        target = next(
            (c for c in sorted(active, key=lambda c: (-room[c], c)) if room[c] >= need), None
        )
        if target is None:
            if len(active) == request.containers:
                raise _no_room(request, i)
            target = len(active)
            active.append(target)
        out[i] = target
        room[target] -= request.demand[i]
    return out


def bfs_order(request: Request) -> list[int]:
    """Instances by a breadth-first traversal of the components from every
    source at once (a virtual root before the sources), then by position."""
    comps = list(dict.fromkeys(request.component))
    parents: dict[str, set[str]] = {c: set() for c in comps}
    children: dict[str, list[str]] = defaultdict(list)
    for a, b in request.edges:
        if a in parents and b in parents:
            parents[b].add(a)
            children[a].append(b)
    depth: dict[str, int] = {}
    queue = deque(c for c in comps if not parents[c])
    for c in queue:
        depth[c] = 0
    while queue:
        c = queue.popleft()
        for d in children[c]:
            if d not in depth:
                depth[d] = depth[c] + 1
                queue.append(d)
    rank = {c: (depth.get(c, len(comps)), k) for k, c in enumerate(comps)}
    return sorted(range(len(request.instances)), key=lambda i: (rank[request.component[i]], i))


def r_heron(request: Request, rng: random.Random | None = None) -> list[int]:
    """R-Heron (§IV-A): instances in breadth-first order of the components;
    each to the container with room at the least distance, the distance being
    the traffic it would exchange with other containers (as a share of the
    request's traffic) plus the gap between its demand and the container's
    room (as a share of a container: the one-resource Euclidean distance)."""
    talk = _neighbours(request)
    total = request.total_traffic or 1.0
    room = [request.container_cores] * request.containers
    out = [-1] * len(request.instances)
    for i in bfs_order(request):
        need = request.demand[i]
        best, best_d = -1, math.inf
        for c in range(request.containers):
            if room[c] < need - EPSILON_CORES:
                continue
            away = sum(r for j, r in talk[i].items() if out[j] >= 0 and out[j] != c)
            d = away / total + abs(room[c] - need) / request.container_cores
            if d < best_d - 1e-12:
                best, best_d = c, d
        if best < 0:
            raise _no_room(request, i)
        out[i] = best
        room[best] -= need
    return out


def t_heron(request: Request, rng: random.Random | None = None) -> list[int]:
    """T-Heron (§IV-A): instances by decreasing traffic (in and out); each to
    the container with room that adds the least cross-container traffic
    (ties: a container already in use, then the lowest)."""
    talk = _neighbours(request)
    room = [request.container_cores] * request.containers
    used = [False] * request.containers
    out = [-1] * len(request.instances)
    order = sorted(range(len(out)), key=lambda i: (-sum(talk[i].values()), i))
    for i in order:
        need = request.demand[i]
        fit = [c for c in range(request.containers) if room[c] >= need - EPSILON_CORES]
        if not fit:
            raise _no_room(request, i)

        def added(c: int, i: int = i) -> tuple[float, bool, int]:
            away = sum(r for j, r in talk[i].items() if out[j] >= 0 and out[j] != c)
            return (away, not used[c], c)

        best = min(fit, key=added)
        out[i] = best
        room[best] -= need
        used[best] = True
    return out


@dataclass(frozen=True)
class MctsOptions:
    """How MIPS searches: ``samples_per_decision`` rounds per decision, the UCT
    ``exploration`` constant, ``epsilon`` random simulation steps, and the
    refinements (``prior``, ``expansion``) on or off."""

    samples_per_decision: int = 64
    exploration: float = 0.3
    epsilon: float = 0.0
    prior: bool = True
    expansion: bool = True

    def __post_init__(self) -> None:
        spd = self.samples_per_decision
        if isinstance(spd, bool) or not isinstance(spd, int) or spd < 1:
            raise ValueError(f"samples_per_decision must be an int >= 1, got {spd!r}")


def mips_icmp(alpha: float, options: MctsOptions, stats: dict | None = None) -> Stage1:
    """MIPS for stage 1 with objective (8) at ``alpha``."""

    def place(request: Request, rng: random.Random) -> list[int]:
        total = request.total_traffic or 1.0
        k = request.containers
        problem = StageProblem(
            demand=tuple(request.demand),
            room=(request.container_cores,) * k,
            edges=tuple(request.pairs()),
            distance=tuple(tuple(0.0 if a == b else 1.0 for b in range(k)) for a in range(k)),
            traffic_weight=alpha / total,
            bin_weight=(1.0 - alpha) / k,
        )
        result = _search(problem, rng, options)
        if stats is not None:
            stats["samples"] = stats.get("samples", 0) + result.samples
        if any(b < 0 for b in result.assign):
            raise _no_room(request, result.assign.index(-1))
        return result.assign

    return place


def _search(problem: StageProblem, rng: random.Random, options: MctsOptions):
    search = StageSearch(
        problem,
        rng,
        exploration=options.exploration,
        epsilon=options.epsilon,
        prior=options.prior,
        expansion=options.expansion,
    )
    return search.run(options.samples_per_decision)


# -- stage 2: containers -> servers --------------------------------------------------

#: (request, container of each instance, the containers' loads, free room per
#: server, topology, rng) -> server of each used container.
Stage2 = Callable[
    [
        Request,
        Sequence[int],
        Mapping[int, float],
        Mapping[str, float],
        NetworkTopology,
        random.Random,
    ],
    dict[int, str],
]


def best_fit(
    request: Request,
    container_of: Sequence[int],
    size: Mapping[int, float],
    free: Mapping[str, float],
    topology: NetworkTopology,
    rng: random.Random | None = None,
) -> dict[int, str]:
    """Nomad's best fit: containers by decreasing size, each to the server
    whose free room best matches it (least left over), ties by server order."""
    room = dict(free)
    out: dict[int, str] = {}
    for c in sorted(size, key=lambda c: (-size[c], c)):
        fit = [s for s in topology.servers if room[s] >= size[c] - EPSILON_CORES]
        if not fit:
            raise NoRoom(f"request {request.name!r}: container {c} fits on no server")
        s = min(fit, key=lambda s: (room[s] - size[c], topology.index[s]))
        out[c] = s
        room[s] -= size[c]
    return out


def mips_csmp(
    options: MctsOptions, server_weight: float = 0.0, stats: dict | None = None
) -> Stage2:
    """MIPS for stage 2 with objective (9): traffic times hops, normalised."""

    def place(request, container_of, size, free, topology, rng):
        used = sorted(size)
        pos = {c: k for k, c in enumerate(used)}
        between: dict[tuple[int, int], float] = defaultdict(float)
        for i, j, r in request.pairs():
            a, b = container_of[i], container_of[j]
            if a != b:
                between[(min(pos[a], pos[b]), max(pos[a], pos[b]))] += r
        total = request.total_traffic or 1.0
        servers = topology.servers
        problem = StageProblem(
            demand=tuple(size[c] for c in used),
            room=tuple(free[s] for s in servers),
            edges=tuple((a, b, r) for (a, b), r in sorted(between.items())),
            distance=tuple(tuple(float(h) for h in row) for row in topology.hops),
            traffic_weight=1.0 / (total * topology.diameter),
            bin_weight=server_weight / max(1, len(used)),
        )
        result = _search(problem, rng, options)
        if stats is not None:
            stats["samples"] = stats.get("samples", 0) + result.samples
        if any(b < 0 for b in result.assign):
            c = used[result.assign.index(-1)]
            raise NoRoom(f"request {request.name!r}: container {c} fits on no server")
        return {c: servers[result.assign[k]] for k, c in enumerate(used)}

    return place


# -- requests in sequence ------------------------------------------------------------


@dataclass
class Placed:
    """One request placed: container of each instance, server of each used
    container, its figures and the seconds each stage took."""

    request: Request
    container_of: list[int]
    server_of: dict[int, str]
    figures: Figures
    seconds: float
    size: dict[int, float] = field(default_factory=dict)


def place_request(
    request: Request,
    free: dict[str, float],
    topology: NetworkTopology,
    stage1: Stage1,
    stage2: Stage2,
    rng: random.Random,
    *,
    alpha: float = 0.5,
    reserve_full: bool = True,
) -> Placed:
    """Place one request on ``free`` (server -> free cores), which is updated.

    ``reserve_full``: a used container takes its whole capacity on its server
    (the paper's model); otherwise only the load of its instances.
    """
    missing = [s for s in free if s not in topology.index]
    if missing:
        raise ValueError(f"servers {missing[:5]} are not in the network topology")
    check_fits(request, free, reserve_full)
    started = time.perf_counter()
    container_of = stage1(request, rng)
    load: dict[int, float] = defaultdict(float)
    for i, c in enumerate(container_of):
        load[c] += request.demand[i]
    size = {c: (request.container_cores if reserve_full else load[c]) for c in load}
    server_of = stage2(request, container_of, size, free, topology, rng)
    seconds = time.perf_counter() - started
    for c, s in server_of.items():
        free[s] -= size[c]
    return Placed(
        request,
        container_of,
        server_of,
        figures(request, container_of, server_of, topology, alpha),
        seconds,
        dict(size),
    )


def place_sequence(
    requests: Sequence[Request],
    capacity: Mapping[str, float],
    topology: NetworkTopology,
    stage1: Stage1,
    stage2: Stage2,
    seed: int = 0,
    *,
    alpha: float = 0.5,
    reserve_full: bool = True,
) -> list[Placed]:
    """Requests in arrival order on an empty cluster (server -> cores)."""
    rng = random.Random(seed)
    free = dict(capacity)
    return [
        place_request(
            r, free, topology, stage1, stage2, rng, alpha=alpha, reserve_full=reserve_full
        )
        for r in requests
    ]


STAGE1: dict[str, Stage1] = {"ffd": ffd, "r-heron": r_heron, "t-heron": t_heron}

__all__ = [
    "STAGE1",
    "Figures",
    "MctsOptions",
    "NoRoom",
    "Placed",
    "Request",
    "best_fit",
    "bfs_order",
    "check_fits",
    "ffd",
    "figures",
    "icmp_cost",
    "mips_csmp",
    "mips_icmp",
    "place_request",
    "place_sequence",
    "r_heron",
    "t_heron",
]
