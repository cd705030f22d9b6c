"""Operator DAGs: the one topological order every part of dsched uses."""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Iterable, Mapping
from functools import lru_cache
from typing import TypeVar

N = TypeVar("N", bound=Hashable)


def topological_order(
    parents: Mapping[N, Iterable[N]], *, include_parents: bool = False
) -> list[N]:
    """Operators parents first, breadth-first from the sources, ties by name.

    ``parents`` maps each operator to its upstream operators. A parent that is
    not itself a key is ignored (an instance may report before its upstream
    does) unless ``include_parents``, which adds it as an operator. A cycle
    or a self-loop raises ValueError: stream DAGs are acyclic by definition, and
    a cycle would make load propagation diverge.
    """
    if not isinstance(parents, Mapping):
        raise ValueError(
            f"parents must map each operator to its parents, got {type(parents).__name__}"
        )
    # Every epoch orders each application's DAG several times (1,500 orders at
    # 500 apps) and the DAGs seldom change: an order is kept per DAG. Parents
    # given as lists (unhashable) are ordered afresh each time.
    try:
        return list(_cached_order(tuple(parents.items()), include_parents))
    except TypeError:
        return _order(parents, include_parents)


@lru_cache(maxsize=8192)
def _cached_order(items: tuple, include_parents: bool) -> tuple:
    return tuple(_order(dict(items), include_parents))


def _order(parents: Mapping[N, Iterable[N]], include_parents: bool) -> list[N]:
    nodes: set[N] = set(parents)
    if include_parents:
        for ps in parents.values():
            nodes.update(ps)
    indegree = dict.fromkeys(nodes, 0)
    children: dict[N, list[N]] = {n: [] for n in nodes}
    for op, ps in parents.items():
        for p in set(ps):
            if p == op:
                raise ValueError(f"operator {op!r} lists itself as upstream")
            if p in nodes:
                indegree[op] += 1
                children[p].append(op)
    queue = deque(sorted((n for n, d in indegree.items() if d == 0), key=repr))
    order: list[N] = []
    while queue:
        n = queue.popleft()
        order.append(n)
        for child in sorted(children[n], key=repr):
            indegree[child] -= 1
            if indegree[child] == 0:
                queue.append(child)
    if len(order) != len(nodes):
        stuck = sorted((repr(n) for n, d in indegree.items() if d > 0))
        raise ValueError(f"the operator graph has a cycle through {', '.join(stuck)}")
    return order
