"""Where servers sit in the network, as hop counts between them.

"MIPS: Instance Placement for Stream Processing Systems based on Monte Carlo
Tree Search" (Huang et al., §II-B and §IV-A) charges each unit of traffic
between two servers the number of hops of the shortest path between them, in
clusters wired as a Fat-Tree or as a Jellyfish. A :class:`NetworkTopology`
holds those hop counts for a list of servers; three builders make one:

- :func:`flat`: one hop between any two servers (the 0/1 cross-server count
  of a placer that ignores the network);
- :func:`fat_tree`: the k-ary Fat-Tree of Al-Fares et al. (k pods of k/2 edge
  and k/2 aggregation switches, (k/2)^2 core switches, k^3/4 servers): 2 hops
  under one edge switch, 4 within a pod, 6 across pods;
- :func:`jellyfish`: Jellyfish (Singla et al.), a random regular graph of
  top-of-rack switches, each with the same number of servers.

:func:`from_links` builds one from any list of links and refuses a network
in which some server cannot reach another, naming the servers.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from dsched.names import check_name


@dataclass(frozen=True)
class NetworkTopology:
    """Hop counts between servers: ``hops[a][b]`` for positions in ``servers``.

    ``kind`` says which builder made it ("flat", "fat-tree", "jellyfish",
    "links"); ``diameter`` is the largest hop count (at least 1), by which
    the placement objectives are normalised.
    """

    kind: str
    servers: tuple[str, ...]
    hops: tuple[tuple[int, ...], ...]
    index: dict[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.servers:
            raise ValueError("a network topology needs at least one server")
        seen: set[str] = set()
        for s in self.servers:
            check_name("server", s)
            if s in seen:
                raise ValueError(f"network topology lists server {s!r} twice")
            seen.add(s)
        n = len(self.servers)
        if len(self.hops) != n or any(len(row) != n for row in self.hops):
            raise ValueError(f"hops must be a {n}x{n} matrix of the servers")
        for a in range(n):
            if self.hops[a][a] != 0:
                raise ValueError(f"hops from server {self.servers[a]!r} to itself must be 0")
            for b in range(n):
                h = self.hops[a][b]
                if a != b and (not isinstance(h, int) or h < 1):
                    raise ValueError(
                        f"hops between {self.servers[a]!r} and {self.servers[b]!r} must be "
                        f"an int >= 1, got {h!r}"
                    )
                if h != self.hops[b][a]:
                    raise ValueError("hops must be symmetric")
        object.__setattr__(self, "index", {s: i for i, s in enumerate(self.servers)})

    @property
    def diameter(self) -> int:
        return max(1, max(max(row) for row in self.hops))

    def distance(self, a: str, b: str) -> int:
        """Hops between servers ``a`` and ``b`` (0 for the same server)."""
        return self.hops[self.index[a]][self.index[b]]

    def restricted(self, servers: Sequence[str]) -> NetworkTopology:
        """The same network seen from ``servers`` only (in that order)."""
        pos = [self.index[s] for s in servers]
        return NetworkTopology(
            self.kind, tuple(servers), tuple(tuple(self.hops[a][b] for b in pos) for a in pos)
        )


def _names(count: int, names: Sequence[str] | None, prefix: str = "s") -> tuple[str, ...]:
    if names is None:
        return tuple(f"{prefix}{k}" for k in range(count))
    if len(names) != count:
        raise ValueError(f"expected {count} server names, got {len(names)}")
    return tuple(names)


def flat(servers: Sequence[str]) -> NetworkTopology:
    """Every pair of distinct servers one hop apart."""
    n = len(servers)
    return NetworkTopology(
        "flat", tuple(servers), tuple(tuple(0 if a == b else 1 for b in range(n)) for a in range(n))
    )


def from_links(
    servers: Sequence[str], links: Iterable[tuple[str, str]], kind: str = "links"
) -> NetworkTopology:
    """Hops between ``servers`` over ``links`` (pairs of server or switch names).

    Names in links that are not servers are switches. ValueError naming them
    when some servers cannot reach each other (a disconnected network).
    """
    servers = tuple(servers)
    graph: dict[str, set[str]] = {s: set() for s in servers}
    for a, b in links:
        if a == b:
            raise ValueError(f"link from {a!r} to itself")
        graph.setdefault(a, set()).add(b)
        graph.setdefault(b, set()).add(a)
    rows: list[tuple[int, ...]] = []
    for src in servers:
        dist = _bfs(graph, src)
        unreachable = [s for s in servers if s not in dist]
        if unreachable:
            shown = ", ".join(unreachable[:5]) + (" ..." if len(unreachable) > 5 else "")
            raise ValueError(
                f"network topology has unreachable servers: {len(unreachable)} server(s) "
                f"cannot be reached from {src!r} ({shown})"
            )
        rows.append(tuple(dist[s] for s in servers))
    return NetworkTopology(kind, servers, tuple(rows))


def _bfs(graph: dict[str, set[str]], src: str) -> dict[str, int]:
    dist = {src: 0}
    queue = deque([src])
    while queue:
        node = queue.popleft()
        for nxt in sorted(graph[node]):
            if nxt not in dist:
                dist[nxt] = dist[node] + 1
                queue.append(nxt)
    return dist


def fat_tree(k: int, servers: Sequence[str] | None = None) -> NetworkTopology:
    """The k-ary Fat-Tree (k even, >= 2) with its k^3/4 servers.

    Servers are numbered pod by pod, edge switch by edge switch, so nearby
    names are nearby in the network.
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 2 or k % 2:
        raise ValueError(f"fat-tree k must be an even int >= 2, got {k!r}")
    half = k // 2
    names = _names(k * half * half, servers)
    links: list[tuple[str, str]] = []
    host = 0
    for pod in range(k):
        for e in range(half):
            edge = f"~edge{pod}.{e}"
            for _ in range(half):
                links.append((names[host], edge))
                host += 1
            for a in range(half):
                links.append((edge, f"~agg{pod}.{a}"))
        for a in range(half):
            for c in range(half):
                links.append((f"~agg{pod}.{a}", f"~core{a}.{c}"))
    return from_links(names, links, "fat-tree")


def jellyfish(
    switches: int,
    switch_ports: int,
    servers_per_switch: int,
    seed: int = 0,
    servers: Sequence[str] | None = None,
) -> NetworkTopology:
    """Jellyfish: ``switches`` top-of-rack switches, each with
    ``servers_per_switch`` servers and its other ports joined at random to
    other switches (the paper's incremental construction: join random pairs
    with free ports; when none is left, break a link to place a switch that
    still has two free ports). The same seed gives the same network; a seed
    whose network comes out disconnected is refused by :func:`from_links`.
    """
    for name, value, low in (
        ("switches", switches, 2),
        ("switch_ports", switch_ports, 2),
        ("servers_per_switch", servers_per_switch, 1),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"jellyfish {name} must be an int >= {low}, got {value!r}")
    degree = switch_ports - servers_per_switch
    if degree < 1:
        raise ValueError(
            f"jellyfish switch_ports ({switch_ports}) must exceed servers_per_switch "
            f"({servers_per_switch}) to leave ports for other switches"
        )
    rng = random.Random(seed)
    names = _names(switches * servers_per_switch, servers)
    free = dict.fromkeys(range(switches), degree)
    edges: set[tuple[int, int]] = set()

    def joinable() -> list[tuple[int, int]]:
        open_ = [s for s, f in free.items() if f > 0]
        return [(a, b) for i, a in enumerate(open_) for b in open_[i + 1 :] if (a, b) not in edges]

    while True:
        pairs = joinable()
        if pairs:
            a, b = rng.choice(pairs)
            edges.add((a, b))
            free[a] -= 1
            free[b] -= 1
            continue
        # A switch with two or more free ports left: break a random link (x, y)
        # not touching it and join both ends to it (Jellyfish's expansion step).
        lonely = [s for s, f in free.items() if f >= 2]
        candidates = [e for e in sorted(edges) if lonely and lonely[0] not in e]
        if not lonely or not candidates:
            break
        s = lonely[0]
        x, y = rng.choice(candidates)
        if (min(s, x), max(s, x)) in edges or (min(s, y), max(s, y)) in edges:
            break
        edges.remove((x, y))
        edges.add((min(s, x), max(s, x)))
        edges.add((min(s, y), max(s, y)))
        free[s] -= 2
    links = [(f"~tor{a}", f"~tor{b}") for a, b in sorted(edges)]
    for k, name in enumerate(names):
        links.append((name, f"~tor{k // servers_per_switch}"))
    return from_links(names, links, "jellyfish")


TOPOLOGIES = ("flat", "fat-tree", "jellyfish")


def build(
    kind: str,
    servers: Sequence[str],
    *,
    k: int | None = None,
    switch_ports: int | None = None,
    servers_per_switch: int | None = None,
    seed: int = 0,
) -> NetworkTopology:
    """A topology of ``kind`` over ``servers`` (in order), for a strategy's options.

    ``fat-tree``: the smallest even k whose k^3/4 servers cover ``servers``
    (or ``k``); the servers take its first positions. ``jellyfish``: enough
    switches of ``switch_ports`` ports (default 6) with ``servers_per_switch``
    servers each (default 2).
    """
    servers = tuple(servers)
    if kind == "flat":
        return flat(servers)
    if kind == "fat-tree":
        if k is None:
            k = 2
            while k**3 // 4 < len(servers):
                k += 2
        full = fat_tree(k)
        if len(full.servers) < len(servers):
            raise ValueError(
                f"a fat-tree with k={k} has {len(full.servers)} servers, fewer than the "
                f"{len(servers)} to place"
            )
        part = full.restricted(full.servers[: len(servers)])
        return NetworkTopology("fat-tree", servers, part.hops)
    if kind == "jellyfish":
        per = servers_per_switch or 2
        ports = switch_ports or 6
        count = max(2, -(-len(servers) // per))
        full = jellyfish(count, ports, per, seed)
        part = full.restricted(full.servers[: len(servers)])
        return NetworkTopology("jellyfish", servers, part.hops)
    raise ValueError(f"network topology must be one of {', '.join(TOPOLOGIES)}, got {kind!r}")


__all__ = [
    "TOPOLOGIES",
    "NetworkTopology",
    "build",
    "fat_tree",
    "flat",
    "from_links",
    "jellyfish",
]
