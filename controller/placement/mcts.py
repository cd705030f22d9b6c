"""Monte Carlo tree search over one stage of two-stage placement, as in "MIPS:
Instance Placement for Stream Processing Systems based on Monte Carlo Tree
Search" (Huang et al., §III).

A stage is a sequential decision process: items (instances, or containers)
go one at a time into bins (containers, or servers) with room for them. A
tree node is a partial mapping; an action maps *any* unmapped item to a bin
with room (§III-B). Each decision (NEXT_ACTION, Alg. 2) runs
``samples_per_decision`` rounds of traversal, expansion, simulation and
back-propagation from the current root, then commits the child with the
lowest mean cost and re-roots the tree there, keeping its statistics.

The three refinements of §III-D:

1. expansion: an untried action that puts an item beside one of its
   neighbours (a bin already holding an item it exchanges traffic with)
   scores 1, the others 0, and expansion picks among the best-scored only;
2. best-child prior: when a node has such favoured actions, each of its
   other actions becomes a child that counts as visited once with a cost as
   bad as any complete mapping can be, so UCT need not try every one of them
   before it returns to the good ones (it still may, through exploration);
3. simulation: the unmapped items in random order, each to the bin that adds
   the least cross-bin cost (traffic times distance).

Choices of ours where the paper leaves them open: simulation ties go to a bin
this stage already uses, then to the one left with least room (best fit);
``epsilon`` (default 0) makes a simulation step pick a random bin instead;
empty bins that are interchangeable (same room, same distances to the rest)
and items that are interchangeable (same demand, same neighbours) are
offered once, which shrinks the tree without changing what it can reach; a
forced decision (a single action) spends no samples; and the search returns
the best complete mapping it sampled when that beats the committed sequence
(MCTS is anytime: more samples never lose a mapping already found).

Costs are minimised: UCT picks the child with the lowest
``mean - exploration * sqrt(ln N_parent / N_child)``.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from controller.placement.model import EPSILON_CORES


@dataclass(frozen=True)
class StageProblem:
    """One stage: ``demand[i]`` of item i, ``room[b]`` of bin b at the start,
    ``edges`` (i, j, rate) between items, ``distance[a][b]`` the cost of a
    unit of rate between bins a and b (0 on the diagonal).

    Cost of a complete mapping: ``traffic_weight * sum(rate * distance) +
    bin_weight * bins used``. A sequence that finds no bin with room for some
    item costs :attr:`dead_end_cost` plus the items left unmapped.
    """

    demand: tuple[float, ...]
    room: tuple[float, ...]
    edges: tuple[tuple[int, int, float], ...]
    distance: tuple[tuple[float, ...], ...]
    traffic_weight: float
    bin_weight: float
    neighbours: tuple[tuple[tuple[int, float], ...], ...] = field(init=False, repr=False)
    item_class: tuple[int, ...] = field(init=False, repr=False)
    bin_class: tuple[int, ...] = field(init=False, repr=False)
    worst_cost: float = field(init=False, repr=False)

    def __post_init__(self) -> None:
        n, m = len(self.demand), len(self.room)
        if len(self.distance) != m or any(len(row) != m for row in self.distance):
            raise ValueError(f"distance must be a {m}x{m} matrix of the bins")
        nbrs: list[dict[int, float]] = [{} for _ in range(n)]
        for i, j, rate in self.edges:
            if i != j:
                nbrs[i][j] = nbrs[i].get(j, 0.0) + rate
                nbrs[j][i] = nbrs[j].get(i, 0.0) + rate
        object.__setattr__(self, "neighbours", tuple(tuple(sorted(d.items())) for d in nbrs))
        # Interchangeable items: same demand and same neighbours with the same rates.
        keys: dict[tuple, int] = {}
        object.__setattr__(
            self,
            "item_class",
            tuple(
                keys.setdefault((self.demand[i], self.neighbours[i]), len(keys)) for i in range(n)
            ),
        )
        # Interchangeable bins: same room at the start and the same distance to
        # every other bin (servers under one edge switch; all containers).
        reps: list[int] = []
        cls: list[int] = []
        for a in range(m):
            for r in reps:
                if self.room[a] == self.room[r] and all(
                    self.distance[a][c] == self.distance[r][c] for c in range(m) if c not in (a, r)
                ):
                    cls.append(cls[r])
                    break
            else:
                cls.append(len(reps))
                reps.append(a)
        object.__setattr__(self, "bin_class", tuple(cls))
        far = max((max(row) for row in self.distance), default=0.0)
        total = sum(rate for _, _, rate in self.edges)
        object.__setattr__(
            self, "worst_cost", self.traffic_weight * total * far + self.bin_weight * m
        )

    @property
    def dead_end_cost(self) -> float:
        return 2.0 * self.worst_cost + 1.0

    def cost(self, assign: Sequence[int]) -> float:
        left = sum(1 for b in assign if b < 0)
        if left:
            return self.dead_end_cost + left
        dist = self.distance
        traffic = sum(rate * dist[assign[i]][assign[j]] for i, j, rate in self.edges)
        return self.traffic_weight * traffic + self.bin_weight * len(set(assign))


class _State:
    """A partial mapping: bin of each item (-1: unmapped), room left, items per bin."""

    __slots__ = ("assign", "room", "count", "left")

    def __init__(self, assign: list[int], room: list[float], count: list[int], left: int):
        self.assign, self.room, self.count, self.left = assign, room, count, left

    def copy(self) -> _State:
        return _State(list(self.assign), list(self.room), list(self.count), self.left)

    def apply(self, item: int, bin_: int, demand: float) -> None:
        self.assign[item] = bin_
        self.room[bin_] -= demand
        self.count[bin_] += 1
        self.left -= 1


class _Node:
    __slots__ = ("visits", "total", "children", "untried", "prior")

    def __init__(self, visits: int = 0, total: float = 0.0) -> None:
        self.visits = visits
        self.total = total
        self.children: dict[int, _Node] = {}
        self.untried: list[int] | None = None  # favoured actions not yet expanded
        self.prior: list[int] = []  # unfavoured actions, not yet children

    def mean(self) -> float:
        return self.total / self.visits if self.visits else math.inf


@dataclass
class SearchResult:
    """The mapping found (bin per item, -1 where none had room), its cost, and
    how the budget went."""

    assign: list[int]
    cost: float
    samples: int
    decisions: int
    from_best_sample: bool


class StageSearch:
    """UCT over one :class:`StageProblem`."""

    def __init__(
        self,
        problem: StageProblem,
        rng: random.Random,
        exploration: float = 0.3,
        epsilon: float = 0.0,
        prior: bool = True,
        expansion: bool = True,
    ) -> None:
        self.p = problem
        self.rng = rng
        self.exploration = exploration
        self.epsilon = epsilon
        self.use_prior = prior
        self.use_expansion = expansion
        self.m = len(problem.room)
        self.best_cost = math.inf
        self.best: list[int] = []
        self.samples = 0

    # -- actions ----------------------------------------------------------------

    def actions(self, s: _State) -> tuple[list[int], list[int]]:
        """(favoured, other) actions ``item * bins + bin`` from ``s``."""
        p, m = self.p, self.m
        good: list[int] = []
        other: list[int] = []
        seen_items: set[int] = set()
        for i, b_of in enumerate(s.assign):
            if b_of >= 0:
                continue
            if p.item_class[i] in seen_items:
                continue
            seen_items.add(p.item_class[i])
            need = p.demand[i] - EPSILON_CORES
            near = {s.assign[j] for j, _ in p.neighbours[i] if s.assign[j] >= 0}
            seen_empty: set[tuple[int, float]] = set()
            for b in range(m):
                if s.room[b] < need:
                    continue
                if s.count[b] == 0:
                    key = (p.bin_class[b], s.room[b])
                    if key in seen_empty:
                        continue
                    seen_empty.add(key)
                (good if b in near else other).append(i * m + b)
        if not self.use_expansion or not good:
            return good + other, []  # uniform expansion over every action
        # Expansion favours ``good``; the others wait as prior children (or,
        # without the prior, are expanded once ``good`` is exhausted).
        return good, other

    # -- one round --------------------------------------------------------------

    def _simulate(self, s: _State) -> list[int]:
        p, m, rng = self.p, self.m, self.rng
        assign, room, count = list(s.assign), list(s.room), list(s.count)
        todo = [i for i, b in enumerate(assign) if b < 0]
        rng.shuffle(todo)
        dist = p.distance
        for i in todo:
            need = p.demand[i] - EPSILON_CORES
            fit = [b for b in range(m) if room[b] >= need]
            if not fit:
                break
            if self.epsilon and rng.random() < self.epsilon:
                b = rng.choice(fit)
            else:
                placed = [(assign[j], r) for j, r in p.neighbours[i] if assign[j] >= 0]

                def key(b: int, placed=placed, need=need) -> tuple[float, int, float, int]:
                    inc = sum(r * dist[b][o] for o, r in placed)
                    return (inc, 0 if count[b] else 1, room[b] - need, b)

                b = min(fit, key=key)
            assign[i] = b
            room[b] -= p.demand[i]
            count[b] += 1
        return assign

    def _record(self, assign: list[int]) -> float:
        cost = self.p.cost(assign)
        if cost < self.best_cost:
            self.best_cost, self.best = cost, assign
        return cost

    def _lcb(self, child: _Node, log_n: float) -> float:
        return child.mean() - self.exploration * math.sqrt(log_n / max(child.visits, 1))

    def _sample(self, root: _Node, root_state: _State) -> None:
        p, m = self.p, self.m
        s = root_state.copy()
        node = root
        path = [root]
        while s.left:
            if node.untried is None:
                favoured, other = self.actions(s)
                node.untried, node.prior = favoured, other
            if not node.untried and node.prior and not self.use_prior:
                node.untried, node.prior = node.prior, []
            if node.untried:
                a = node.untried.pop(self.rng.randrange(len(node.untried)))
                child = node.children[a] = _Node()
                s.apply(a // m, a % m, p.demand[a // m])
                node = child
                path.append(node)
                break
            if not node.children and not node.prior:
                break  # dead end: no item has a bin with room
            log_n = math.log(max(node.visits, 1))
            best_a, best_v = -1, math.inf
            for a, c in node.children.items():
                v = self._lcb(c, log_n)
                if v < best_v or (v == best_v and a < best_a):
                    best_a, best_v = a, v
            if node.prior and (
                self.worst() - self.exploration * math.sqrt(log_n) < best_v or best_a < 0
            ):
                # Materialise one unfavoured child with its prior: visited once, badly.
                a = node.prior.pop(self.rng.randrange(len(node.prior)))
                child = node.children[a] = _Node(1, self.worst())
                s.apply(a // m, a % m, p.demand[a // m])
                node = child
                path.append(node)
                break
            node = node.children[best_a]
            s.apply(best_a // m, best_a % m, p.demand[best_a // m])
            path.append(node)
        cost = self._record(self._simulate(s))
        for visited in path:
            visited.visits += 1
            visited.total += cost
        self.samples += 1

    def worst(self) -> float:
        """The prior cost of an unfavoured child: as bad as a complete mapping gets."""
        return self.p.worst_cost if self.use_prior else 0.0

    # -- the decisions ------------------------------------------------------------

    def run(self, samples_per_decision: int) -> SearchResult:
        p, m = self.p, self.m
        n = len(p.demand)
        state = _State([-1] * n, list(p.room), [0] * m, n)
        root = _Node()
        decisions = 0
        while state.left:
            if root.untried is None:
                root.untried, root.prior = self.actions(state)
            choices = len(root.untried) + len(root.prior) + len(root.children)
            if choices == 0:
                break
            if choices == 1 and not root.children:
                # A forced decision: nothing to learn from sampling it.
                a = (root.untried or root.prior)[0]
                root.untried, root.prior = [x for x in root.untried if x != a], []
                root.children[a] = _Node()
            else:
                for _ in range(samples_per_decision):
                    self._sample(root, state)
            a, child = min(
                root.children.items(), key=lambda kv: (kv[1].mean(), -kv[1].visits, kv[0])
            )
            state.apply(a // m, a % m, p.demand[a // m])
            root = child
            decisions += 1
        committed = state.assign
        cost = p.cost(committed)
        if self.best and self.best_cost < cost:
            return SearchResult(list(self.best), self.best_cost, self.samples, decisions, True)
        return SearchResult(list(committed), cost, self.samples, decisions, False)


__all__ = ["SearchResult", "StageProblem", "StageSearch"]
