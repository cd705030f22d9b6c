"""``mips-anytime``: an anytime simplification of two-stage placement by Monte
Carlo tree search (Huang et al., "MIPS: Instance Placement for Stream
Processing Systems based on Monte Carlo Tree Search"). The published scheme
is ``mips`` (:mod:`controller.placement.mips_paper`); this variant is kept
because it is cheap at scale: its budget is per plan, not per decision.

Stage 1 maps instances to containers (workers) of their application, stage 2
maps containers to nodes. Each stage is a sequence of decisions (the next item
in a fixed order goes to one of the feasible bins) searched with UCT:
selection by the lower confidence bound of mean cost, expansion that favours
bins already holding a neighbour of the item, and rollouts that put each
remaining item where it adds least cross-bin traffic (with a little
randomness). After each decision's share of samples the tree is re-rooted at
the best child, as in the paper's NEXT_ACTION.

The search is *anytime*: ``samples`` is the total number of rollouts for one
plan, split between the stages and over their decisions; when it runs out the
remaining decisions are completed greedily. The best complete assignment seen
in any rollout is kept, so a larger budget explores more without ever
discarding what a smaller one would have found first. ``seed`` makes a run
reproducible.

Costs (lower is better): stage 1 is cross-container traffic as a fraction of
all traffic plus ``container_weight`` times the containers used over their
lower bound; stage 2 is cross-node traffic as a fraction plus
``node_weight`` times the nodes used over their lower bound. A sequence that
finds no bin with room costs :data:`DEAD_END_COST` plus the items left.
"""

from __future__ import annotations

import math
import random
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from controller.placement.baselines import ReplanningStrategy, _check_number
from controller.placement.common import (
    GroupKey,
    bfs_instances,
    fits,
    least_loaded_fallback,
    neighbours,
)

DEAD_END_COST = 1000.0


@dataclass
class _Packing:
    """One stage as a sequential decision problem: ``items`` in order into bins."""

    items: list[str]
    demand: dict[str, float]
    talk: dict[str, dict[str, float]]
    # Bins an item may go to given the loads so far; the last entry may be a new bin.
    candidates: Callable[[str, dict[str, float]], list[str]]
    capacity: Callable[[str], float]
    bins_weight: float
    bins_lower_bound: int
    total_traffic: float

    def cost(self, assign: dict[str, str]) -> float:
        if len(assign) < len(self.items):
            return DEAD_END_COST + len(self.items) - len(assign)
        cross = 0.0
        for a, others in self.talk.items():
            for b, rate in others.items():
                if a < b and assign[a] != assign[b]:
                    cross += rate
        return cross / self.total_traffic + self.bins_weight * len(set(assign.values())) / max(
            1, self.bins_lower_bound
        )

    def actions(self, item: str, loads: dict[str, float]) -> list[str]:
        need = self.demand[item]
        return [
            b
            for b in self.candidates(item, loads)
            if fits(self.capacity(b) - loads.get(b, 0.0), need)
        ]

    def local_traffic(self, item: str, bin_id: str, assign: dict[str, str]) -> float:
        return sum(r for o, r in self.talk.get(item, {}).items() if assign.get(o) == bin_id)


@dataclass
class _TreeNode:
    assign: dict[str, str]
    loads: dict[str, float]
    depth: int
    untried: list[str]
    visits: int = 0
    total_cost: float = 0.0
    children: dict[str, _TreeNode] = field(default_factory=dict)

    def mean(self) -> float:
        return self.total_cost / self.visits if self.visits else math.inf


class _Search:
    """UCT over one :class:`_Packing`; call :meth:`run` with a sample budget."""

    def __init__(self, problem: _Packing, rng: random.Random, exploration: float, epsilon: float):
        self.problem = problem
        self.rng = rng
        self.exploration = exploration
        self.epsilon = epsilon
        self.best_cost = math.inf
        self.best: dict[str, str] = {}
        self.samples_used = 0

    def _node(self, assign: dict[str, str], loads: dict[str, float], depth: int) -> _TreeNode:
        untried: list[str] = []
        if depth < len(self.problem.items):
            untried = self.problem.actions(self.problem.items[depth], loads)
        return _TreeNode(assign, loads, depth, untried)

    def _child(self, node: _TreeNode, action: str) -> _TreeNode:
        item = self.problem.items[node.depth]
        assign = dict(node.assign)
        assign[item] = action
        loads = dict(node.loads)
        loads[action] = loads.get(action, 0.0) + self.problem.demand[item]
        child = self._node(assign, loads, node.depth + 1)
        node.children[action] = child
        return child

    def _expand(self, node: _TreeNode) -> _TreeNode:
        item = self.problem.items[node.depth]
        favoured = [a for a in node.untried if self.problem.local_traffic(item, a, node.assign) > 0]
        action = self.rng.choice(favoured or node.untried)
        node.untried.remove(action)
        return self._child(node, action)

    def _select(self, node: _TreeNode) -> _TreeNode:
        log_n = math.log(max(node.visits, 1))
        return min(
            node.children.values(),
            key=lambda c: c.mean() - self.exploration * math.sqrt(log_n / max(c.visits, 1)),
        )

    def _rollout(self, node: _TreeNode, epsilon: float) -> dict[str, str]:
        assign, loads = dict(node.assign), dict(node.loads)
        for item in self.problem.items[node.depth :]:
            options = self.problem.actions(item, loads)
            if not options:
                break
            if self.rng.random() < epsilon:
                choice = self.rng.choice(options)
            else:
                # Most traffic kept local; then the fullest bin (packing); stable order.
                choice = max(
                    options,
                    key=lambda b: (
                        self.problem.local_traffic(item, b, assign),
                        loads.get(b, 0.0),
                        -options.index(b),
                    ),
                )
            assign[item] = choice
            loads[choice] = loads.get(choice, 0.0) + self.problem.demand[item]
        return assign

    def _record(self, assign: dict[str, str]) -> float:
        cost = self.problem.cost(assign)
        if cost < self.best_cost:
            self.best_cost, self.best = cost, assign
        return cost

    def _sample(self, root: _TreeNode) -> None:
        path = [root]
        node = root
        while node.depth < len(self.problem.items):
            if node.untried:
                node = self._expand(node)
                path.append(node)
                break
            if not node.children:
                break
            node = self._select(node)
            path.append(node)
        cost = self._record(self._rollout(node, self.epsilon))
        for visited in path:
            visited.visits += 1
            visited.total_cost += cost
        self.samples_used += 1

    def run(self, budget: int) -> dict[str, str]:
        node = self._node({}, {}, 0)
        remaining = budget
        while node.depth < len(self.problem.items):
            left = len(self.problem.items) - node.depth
            if remaining <= 0:
                break
            share = max(1, remaining // left)
            for _ in range(min(share, remaining)):
                self._sample(node)
            remaining -= min(share, remaining)
            if not node.children:
                break
            node = min(node.children.values(), key=lambda c: (c.mean(), -c.visits))
        self._record(self._rollout(node, 0.0))
        return self.best


class MipsAnytimeStrategy(ReplanningStrategy):
    """Monte Carlo tree search with UCT over instance->worker, then worker->node,
    items in a fixed order, one sample budget for the whole plan."""

    name = "mips-anytime"

    def __init__(
        self,
        samples: int = 256,
        seed: int = 0,
        exploration: float = 0.5,
        epsilon: float = 0.2,
        container_cores: float | None = None,
        container_weight: float = 0.1,
        node_weight: float = 0.1,
    ) -> None:
        if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
            raise ValueError(f"samples must be an int >= 1, got {samples!r}")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"seed must be an int, got {seed!r}")
        self.samples = samples
        self.seed = seed
        self.exploration = _check_number("exploration", exploration, 0.0)
        self.epsilon = _check_number("epsilon", epsilon, 0.0, 1.0)
        self.container_cores = (
            None
            if container_cores is None
            else _check_number("container_cores", container_cores, 1e-6)
        )
        self.container_weight = _check_number("container_weight", container_weight, 0.0)
        self.node_weight = _check_number("node_weight", node_weight, 0.0)
        self.last_costs: tuple[float, float] = (math.inf, math.inf)

    def fresh(self, state, headroom_cores):
        rng = random.Random(self.seed)
        nodes = state.node_ids
        caps = {n: state.capacity(n, headroom_cores) for n in nodes}
        positive = [c for c in caps.values() if c > 0]
        container_cap = self.container_cores or (min(positive) if positive else 1.0)
        talk = neighbours(state)
        total = sum(state.traffic.values()) or 1.0
        instances = state.instance_map()
        demand = {i.id: i.demand_cores for i in state.instances}
        budget1 = max(1, self.samples // 2)
        budget2 = max(1, self.samples - budget1)

        # Stage 1: instance -> container of its app; one fresh container offered at a time.
        def container_candidates(item: str, loads: dict[str, float]) -> list[str]:
            app = instances[item].app
            opened = sorted((b for b in loads if b.rsplit("#", 1)[0] == app), key=_bin_index)
            return [*opened, f"{app}#{len(opened)}"]

        def container_capacity(bin_id: str) -> float:
            return max(container_cap, max(demand.values(), default=0.0))

        stage1 = _Packing(
            items=[i.id for i in bfs_instances(state)],
            demand=demand,
            talk=talk,
            candidates=container_candidates,
            capacity=container_capacity,
            bins_weight=self.container_weight,
            bins_lower_bound=sum(
                math.ceil(sum(demand[i.id] for i in state.instances if i.app == a) / container_cap)
                for a in state.apps()
            ),
            total_traffic=total,
        )
        search1 = _Search(stage1, rng, self.exploration, self.epsilon)
        container_of = search1.run(budget1)

        # Stage 2: container -> node.
        members: dict[str, list[str]] = defaultdict(list)
        for inst, c in container_of.items():
            members[c].append(inst)
        c_demand = {c: sum(demand[i] for i in insts) for c, insts in members.items()}
        c_talk: dict[str, dict[str, float]] = defaultdict(dict)
        for a, others in talk.items():
            for b, rate in others.items():
                ca, cb = container_of[a], container_of[b]
                if ca != cb:
                    c_talk[ca][cb] = c_talk[ca].get(cb, 0.0) + rate

        def node_candidates(item: str, loads: dict[str, float]) -> list[str]:
            seen_empty: set[float] = set()
            out = []
            for n in nodes:
                if loads.get(n, 0.0) == 0.0:
                    # Empty nodes of equal capacity are interchangeable: offer one.
                    if caps[n] in seen_empty:
                        continue
                    seen_empty.add(caps[n])
                out.append(n)
            return out

        stage2 = _Packing(
            items=sorted(c_demand, key=lambda c: (-c_demand[c], c)),
            demand=c_demand,
            talk=c_talk,
            candidates=node_candidates,
            capacity=lambda n: caps[n],
            bins_weight=self.node_weight,
            bins_lower_bound=_nodes_lower_bound(sum(c_demand.values()), caps),
            total_traffic=total,
        )
        search2 = _Search(stage2, rng, self.exploration, self.epsilon)
        node_of_container = search2.run(budget2)
        self.last_costs = (search1.best_cost, search2.best_cost)

        reasons = [
            f"MCTS with {search1.samples_used}+{search2.samples_used} samples "
            f"(seed {self.seed}): stage costs {search1.best_cost:.4g}, {search2.best_cost:.4g}"
        ]
        free = dict(caps)
        for c, n in node_of_container.items():
            free[n] -= c_demand[c]
        groups: dict[str, GroupKey] = {}
        for c in stage2.items:
            node = node_of_container.get(c)
            if node is None:
                node = least_loaded_fallback(state, free, c_demand[c])
                free[node] -= c_demand[c]
                reasons.append(f"container {c} fits on no node; put on {node}")
            for inst in members[c]:
                groups[inst] = GroupKey(node, f"c{_bin_index(c)}")
        return groups, reasons


def _bin_index(bin_id: str) -> int:
    return int(bin_id.rsplit("#", 1)[1])


def _nodes_lower_bound(total: float, caps: dict[str, float]) -> int:
    used, count = 0.0, 0
    for cap in sorted(caps.values(), reverse=True):
        if used >= total - 1e-9:
            break
        used += cap
        count += 1
    return max(1, count)
