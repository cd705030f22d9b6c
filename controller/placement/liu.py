"""``liu``: the online scheme of Liu et al., "An Adaptive Online Scheme for
Scheduling and Resource Enforcement in Storm" (Algorithms 1-3), the default.

Each application has at most one stateful and one stateless worker per node, so
moving stateless instances never restarts stateful ones. Per epoch:

1. *Overload* (Alg. 1, step 1). For a node over capacity, disrupt its stateless
   workers if the stateful ones alone fit, else its stateful workers if the
   stateless ones alone fit, else both. With several applications on a node,
   the workers of the chosen kind are disrupted largest first until the rest
   fits, so as few workers restart as possible.
2. *Targets* (Alg. 2). The disrupted instances are placed one by one in
   breadth-first order of their DAG (Alg. 1, step 3) on the first node with
   room, trying in turn: nodes where no extra worker is disrupted (the app's
   worker of that kind is already disrupted or does not exist:
   FindZeroAffected), nodes where exactly one more worker is disrupted
   (FindOneAffected), then unused nodes (FindFreeNodes). The paper reserves
   capacity per tier before placing; deciding per instance reaches the same
   tiers in the same order but disrupts a further worker only when an
   instance actually needs it. An instance whose own worker was disrupted
   stays on its node while that node has room: the worker restarts either
   way, and staying saves a network hop.

   A stateful instance goes through the tiers first looking only at nodes
   whose stateful workers, it included, keep room for their peaks
   (:attr:`Instance.peak_cores`, the most each needed lately), and settles
   for room for its demand now only if no node has that. A stateful worker
   that outgrows its node must carry its state elsewhere; a stateless one
   only restarts, so stateless instances pack by their demand now.
3. *Scale in* (Alg. 3). Repeatedly empty a node by moving each of its
   workers, whole, to one other node (nodes with least remaining room first);
   a node is emptied only if every worker finds a target. Emptying a node that
   holds a stateful worker restarts that worker and carries its state, so
   scale in is careful where Alg. 3 is not:

   - nodes holding only stateless workers are emptied first (least loaded
     first); they disrupt no stateful worker. One is emptied once it has been
     emptiable for ``stateless_scale_in_patience`` consecutive plans (default
     1: at once, as Alg. 3 checks once a period): where decisions come every
     half second, a lull of one slot would empty a node that the next
     slot's rise refills, and every worker moved pauses;
   - a node holding a stateful worker is emptied only once it has been
     emptiable for ``scale_in_patience`` consecutive plans (least loaded
     first; default 30, five minutes at the default 10 s slot, as the
     Kubernetes HPA's downscale stabilization), so a dip in load does not
     cost a state migration;
   - a worker goes first where no further worker is disrupted (a node without
     a worker of its app and kind, or whose one is restarting anyway, as in
     Alg. 2), and is merged into an existing worker only otherwise; a
     stateful worker goes only where the stateful workers keep room for
     their peaks, so a node emptied in a lull is not needed at the next peak;
   - a node waiting to be emptied is a target of last resort: nothing from
     a node holding a stateful worker goes there (its state would move
     twice); the workers of a stateless-only node go there only when the other
     nodes have no room for them and the waiting node's stateful workers
     could still grow by ``stateful_growth`` (1.0: double) and fit. So a node
     holding only stateless workers still empties at once while the others
     wait, without crowding a node whose stateful workers a rise in load would
     push over capacity (Alg. 1 then restarts stateful workers until the
     whole node fits, so every stateless core there can cost one more).

   The strategy remembers, per node, how many consecutive plans it was
   emptiable; a controller that skips planning in an epoch calls
   :meth:`LiuStrategy.observe` instead, so the count stays consecutive.

If the heuristic leaves a node over capacity, a first-fit-decreasing repack
(still separating stateful from stateless) is tried: first around the stateful
workers, which stay where their nodes can hold them, so only stateless workers
restart; a full repack only when that does not fit. Either is used when it fits.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field

from controller.placement.common import (
    Decision,
    FreeTree,
    GroupKey,
    PlacementStrategy,
    bfs_instances,
    check_headroom,
    first_fit_decreasing,
    fits,
)
from controller.placement.model import Instance, PlacementInput

#: Consecutive plans a node holding a stateful worker must have been emptiable
#: before scale in empties it. Emptying it restarts the worker and carries its
#: state, worth it only once the low load has lasted: 30 plans are five minutes
#: at the controller's default 10 s slot, the wait of the Kubernetes HPA's
#: default downscale stabilization window (300 s); the cluster autoscaler waits
#: ten minutes (``scale-down-unneeded-time``). Nodes holding only stateless
#: workers do not wait: moving those restarts them and carries no state.
DEFAULT_SCALE_IN_PATIENCE = 30

#: Growth the stateful workers of a node waiting to be emptied must still have
#: room for when scale in puts stateless workers there (1.0: they could double
#: and still fit). Past that, a rise in load leaves the stateful workers alone
#: over capacity, and Alg. 1 then disrupts stateful workers, largest first,
#: until the whole node fits: every stateless core added there can cost one
#: more stateful restart.
DEFAULT_STATEFUL_GROWTH = 1.0

STATEFUL_LABEL = "sf"
STATELESS_LABEL = "sl"

# (app, stateful) identifies one of the two workers of an app on a node.
WorkerSlot = tuple[str, bool]


def _label(stateful: bool) -> str:
    return STATEFUL_LABEL if stateful else STATELESS_LABEL


@dataclass
class _Layout:
    """Mutable working copy: which instances sit in which (app, kind) worker of each node."""

    state: PlacementInput
    headroom_cores: float
    members: dict[str, dict[WorkerSlot, set[str]]] = field(default_factory=dict)
    usable: set[tuple[str, WorkerSlot]] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.demand = {i.id: i.demand_cores for i in self.state.instances}
        self.members = {n: defaultdict(set) for n in self.state.node_ids}
        # Loads are kept up to date on every add/take: placement asks for them
        # once per candidate node per instance, which must not cost O(instances).
        self._load = dict.fromkeys(self.state.node_ids, 0.0)
        self._worker_load: dict[tuple[str, WorkerSlot], float] = defaultdict(float)
        self._stateful_load = dict.fromkeys(self.state.node_ids, 0.0)
        self._stateful_peak = dict.fromkeys(self.state.node_ids, 0.0)
        self._worker_peak: dict[tuple[str, WorkerSlot], float] = defaultdict(float)
        self._capacity = {
            n: self.state.capacity(n, self.headroom_cores) for n in self.state.node_ids
        }
        # Free room by node position, kept with the loads: placement looks for
        # the first node with room for each displaced instance.
        self._pos = self.state.node_index
        self._rooms = FreeTree(self.free(n) for n in self.state.node_ids)

    def capacity(self, node: str) -> float:
        return self._capacity[node]

    def load(self, node: str) -> float:
        return self._load[node]

    def free(self, node: str) -> float:
        return self._capacity[node] - self._load[node]

    def stateful_load(self, node: str) -> float:
        return self._stateful_load[node]

    def stateful_peak_room(self, node: str) -> float:
        """Capacity left once the node's stateful workers reach their peaks."""
        return self._capacity[node] - self._stateful_peak[node]

    def worker_peak(self, node: str, slot: WorkerSlot) -> float:
        return self._worker_peak.get((node, slot), 0.0)

    def worker_demand(self, node: str, slot: WorkerSlot) -> float:
        return self._worker_load.get((node, slot), 0.0)

    def fitting(self, demand: float):
        """Nodes where ``demand`` fits now (:func:`fits` with :meth:`free`), in node order."""
        nodes, rooms = self.state.node_ids, self._rooms

        def ok(room: float) -> bool:
            return fits(room, demand)

        pos = rooms.first(ok)
        while pos is not None:
            yield nodes[pos]
            pos = rooms.first(ok, pos + 1)

    def _moved(self, node: str) -> None:
        self._rooms.set(self._pos[node], self.free(node))

    def slots(self, node: str) -> list[WorkerSlot]:
        return sorted(s for s, insts in self.members[node].items() if insts)

    def used(self, node: str) -> bool:
        return bool(self.slots(node))

    def add(self, node: str, inst: Instance) -> None:
        slot = (inst.app, inst.stateful)
        members = self.members[node][slot]
        if inst.id not in members:
            members.add(inst.id)
            d = self.demand[inst.id]
            self._load[node] += d
            self._worker_load[(node, slot)] += d
            if inst.stateful:
                self._stateful_load[node] += d
                self._stateful_peak[node] += inst.peak_cores
                self._worker_peak[(node, slot)] += inst.peak_cores
            self._moved(node)

    def take_worker(self, node: str, slot: WorkerSlot) -> set[str]:
        insts = self.members[node].pop(slot, set())
        demand = self._worker_load.pop((node, slot), 0.0)
        self._load[node] -= demand
        peak = self._worker_peak.pop((node, slot), 0.0)
        if slot[1]:
            self._stateful_load[node] -= demand
            self._stateful_peak[node] -= peak
        if not any(self.members[node].values()):
            self._load[node] = 0.0  # no float residue on an emptied node
        if not any(members for (_, sf), members in self.members[node].items() if sf):
            self._stateful_load[node] = 0.0
            self._stateful_peak[node] = 0.0
        self._moved(node)
        self.usable.add((node, slot))
        return insts

    def groups(self) -> dict[str, GroupKey]:
        out: dict[str, GroupKey] = {}
        for node, slots in self.members.items():
            for (_, stateful), insts in slots.items():
                for inst in insts:
                    out[inst] = GroupKey(node, _label(stateful), stateful)
        return out


class LiuStrategy(PlacementStrategy):
    """Separated stateful/stateless workers, fewest affected workers, scale in when possible."""

    name = "liu"

    def __init__(
        self,
        scale_in: bool = True,
        scale_in_patience: int = DEFAULT_SCALE_IN_PATIENCE,
        stateful_growth: float = DEFAULT_STATEFUL_GROWTH,
        stateless_scale_in_patience: int = 1,
    ) -> None:
        if not isinstance(scale_in, bool):
            raise ValueError(f"scale_in must be a bool, got {scale_in!r}")
        for name, value, holds in (
            ("scale_in_patience", scale_in_patience, "holding a stateful worker"),
            (
                "stateless_scale_in_patience",
                stateless_scale_in_patience,
                "holding only stateless workers",
            ),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(
                    f"{name} (consecutive plans a node {holds} must stay emptiable "
                    f"before it is emptied) must be an int >= 1, got {value!r}"
                )
        if (
            isinstance(stateful_growth, bool)
            or not isinstance(stateful_growth, int | float)
            or not math.isfinite(stateful_growth)
            or stateful_growth < 0
        ):
            raise ValueError(
                "stateful_growth (growth the stateful workers of a node waiting to be "
                "emptied must have room for before stateless workers are moved there) "
                f"must be a finite number >= 0, got {stateful_growth!r}"
            )
        self.scale_in = scale_in
        self.scale_in_patience = scale_in_patience
        self.stateless_scale_in_patience = stateless_scale_in_patience
        self.stateful_growth = float(stateful_growth)
        # Node -> consecutive plans in which it could have been emptied.
        self._low_streak: dict[str, int] = {}

    def observe(self, state: PlacementInput, headroom_cores: float = 0.0) -> None:
        """An epoch passed without a plan: update what the strategy remembers of it."""
        headroom_cores = check_headroom(headroom_cores)
        layout = _Layout(state, headroom_cores)
        if self._load_current(state, layout, []):
            self._low_streak.clear()  # displaced instances: the next plan starts afresh
            return
        self._count_low(layout)

    def decide(self, state: PlacementInput, headroom_cores: float) -> Decision:
        reasons: list[str] = []
        layout = _Layout(state, headroom_cores)
        instances = state.instance_map()
        displaced = self._load_current(state, layout, reasons)
        home = {i.id: i.node for i in state.instances}

        displaced |= self._disrupt_overloaded(layout, reasons)
        unplaced = self._place(layout, [instances[i] for i in displaced], home, reasons)
        if unplaced:
            # A repack or a node over capacity is no low load anywhere.
            self._low_streak.clear()
            repack = self._repack(state, headroom_cores)
            if repack is not None:
                groups, how = repack
                reasons.append(
                    f"incremental placement could not fit {len(unplaced)} instance(s); "
                    f"a first-fit-decreasing repack ({how}, stateful and stateless "
                    "workers separated) fits"
                )
                return Decision(groups, tuple(reasons))
            # The node with most room, first in node order among equals
            # (max over the nodes by (free, -index)), from a tree of the rooms.
            nodes = state.node_ids
            rooms = FreeTree(layout.free(n) for n in nodes)
            for inst_id in unplaced:
                inst = instances[inst_id]
                pos = rooms.roomiest()
                node = nodes[pos]
                layout.add(node, inst)
                rooms.set(pos, layout.free(node))
                reasons.append(f"{inst_id} fits on no node; put on {node}, which has most room")
        elif self.scale_in:
            self._scale_in(layout, reasons)
        return Decision(layout.groups(), tuple(reasons))

    # -- current placement -----------------------------------------------------

    def _load_current(self, state: PlacementInput, layout: _Layout, reasons: list[str]) -> set[str]:
        """Fill ``layout`` from the state; return instances that must be placed again."""
        instances = state.instance_map()
        placed = state.current_assignment()
        displaced = {i.id for i in state.instances if i.id not in placed}
        vanished = sorted(
            {i.node for i in state.instances if i.id in displaced and i.node is not None}
            - set(state.node_ids)
        )
        for node in vanished:
            count = sum(1 for i in state.instances if i.node == node)
            reasons.append(f"node {node} is gone; its {count} instance(s) are displaced")
        by_worker: dict[str, list[str]] = defaultdict(list)
        for inst_id, (worker, _) in placed.items():
            by_worker[worker].append(inst_id)
        # One worker per (node, app, kind): the largest keeps the slot.
        seen: set[tuple[str, WorkerSlot]] = set()
        live = state.live_workers()
        for worker_id in sorted(by_worker, key=lambda w: (-len(by_worker[w]), w)):
            worker = live[worker_id]
            kinds = {instances[i].stateful for i in by_worker[worker_id]}
            if len(kinds) > 1:
                reasons.append(
                    f"worker {worker_id} mixes stateful and stateless instances; "
                    "its instances are separated"
                )
                displaced.update(by_worker[worker_id])
                continue
            key = (worker.node, (worker.app, kinds.pop()))
            if key in seen:
                reasons.append(
                    f"worker {worker_id} duplicates another {_label(key[1][1])} worker of "
                    f"{worker.app} on {worker.node}; its instances are merged"
                )
                displaced.update(by_worker[worker_id])
                continue
            seen.add(key)
            for inst_id in by_worker[worker_id]:
                layout.add(worker.node, instances[inst_id])
        return displaced

    # -- Algorithm 1, step 1 ----------------------------------------------------

    def _disrupt_overloaded(self, layout: _Layout, reasons: list[str]) -> set[str]:
        displaced: set[str] = set()
        for node in layout.state.node_ids:
            capacity = layout.capacity(node)
            if fits(capacity, layout.load(node)):
                continue
            slots = layout.slots(node)
            stateful = [s for s in slots if s[1]]
            stateless = [s for s in slots if not s[1]]
            sf_demand = sum(layout.worker_demand(node, s) for s in stateful)
            sl_demand = sum(layout.worker_demand(node, s) for s in stateless)
            if fits(capacity, sf_demand):
                victims, how = self._largest_until_fits(layout, node, stateless), "stateless"
            elif fits(capacity, sl_demand):
                victims, how = self._largest_until_fits(layout, node, stateful), "stateful"
            else:
                victims = stateless + self._largest_until_fits(
                    layout, node, stateful, already_removed=sl_demand
                )
                how = "stateless and stateful"
            for slot in victims:
                displaced |= layout.take_worker(node, slot)
            names = ", ".join(f"{app}:{_label(sf)}" for app, sf in victims)
            reasons.append(
                f"node {node} over capacity {capacity:.3g} cores; "
                f"disrupting {how} worker(s) {names}"
            )
        return displaced

    @staticmethod
    def _largest_until_fits(
        layout: _Layout, node: str, candidates: list[WorkerSlot], already_removed: float = 0.0
    ) -> list[WorkerSlot]:
        remaining = layout.load(node) - already_removed
        chosen: list[WorkerSlot] = []
        for slot in sorted(candidates, key=lambda s: (-layout.worker_demand(node, s), s)):
            if fits(layout.capacity(node), remaining):
                break
            chosen.append(slot)
            remaining -= layout.worker_demand(node, slot)
        return chosen

    # -- Algorithm 2 and Algorithm 1, step 3 ---------------------------------------

    def _place(
        self,
        layout: _Layout,
        displaced: list[Instance],
        home: dict[str, str | None],
        reasons: list[str],
    ) -> list[str]:
        """Place displaced instances in BFS order; return those that fit nowhere."""
        nodes = layout.state.node_ids
        used_before = {n for n in nodes if layout.used(n)} | {n for n, _ in layout.usable}
        unplaced: list[str] = []
        opened: list[str] = []
        extra: list[str] = []
        short_of_peak: list[str] = []
        for inst in bfs_instances(layout.state, displaced):
            slot = (inst.app, inst.stateful)
            # A stateful instance first looks for a node whose stateful workers
            # keep room for their peaks with it; only if none has that room
            # (even unused) does it settle for room for its demand now.
            for strict in (True, False) if inst.stateful else (False,):
                target, tier = self._target(
                    layout, inst, home.get(inst.id), used_before, opened, strict
                )
                if target is not None:
                    break
            if target is not None and inst.stateful and not strict:
                short_of_peak.append(inst.id)
            if tier == "one":
                extra.append(f"{inst.app}:{_label(inst.stateful)}@{target}")
            elif tier == "free":
                opened.append(target)
            if target is None:
                unplaced.append(inst.id)
                continue
            layout.usable.add((target, slot))
            layout.add(target, inst)
        if displaced:
            reasons.append(
                f"placed {len(displaced) - len(unplaced)} displaced instance(s) in BFS order"
            )
        if extra:
            reasons.append(
                "one more worker disrupted to make room: " + ", ".join(sorted(set(extra)))
            )
        if opened:
            reasons.append("scaled out to unused node(s): " + ", ".join(opened))
        if short_of_peak:
            reasons.append(
                "no node has room for the peak of stateful instance(s) "
                + ", ".join(short_of_peak)
                + "; placed where their demand now fits"
            )
        return unplaced

    @staticmethod
    def _target(
        layout: _Layout,
        inst: Instance,
        own: str | None,
        used_before: set[str],
        opened: list[str],
        strict: bool,
    ) -> tuple[str | None, str]:
        """The first node with room for ``inst`` by Alg. 2's tiers, and the tier.

        Tiers: its own node when its worker there is disrupted anyway, a node
        where no extra worker is disrupted, one where one more is, an unused
        node. ``strict``: room for the instance's peak among the node's
        stateful workers too.
        """
        slot = (inst.app, inst.stateful)

        def room(n: str) -> bool:
            return fits(layout.free(n), inst.demand_cores) and (
                not strict or fits(layout.stateful_peak_room(n), inst.peak_cores)
            )

        def in_use(n: str) -> bool:
            return n in used_before or n in opened

        def zero_affected(n: str) -> bool:
            return in_use(n) and ((n, slot) in layout.usable or not layout.members[n].get(slot))

        if own in layout.members and (own, slot) in layout.usable and room(own):
            return own, "own"
        tiers = (("zero", zero_affected), ("one", in_use), ("free", lambda n: not in_use(n)))
        for tier, eligible in tiers:
            # Only nodes with room for the demand now can qualify: the scan in
            # node order skips the others through the layout's tree of rooms.
            target = next(
                (n for n in layout.fitting(inst.demand_cores) if eligible(n) and room(n)), None
            )
            if target is not None:
                return target, tier
        return None, ""

    def _repack(
        self, state: PlacementInput, headroom_cores: float
    ) -> tuple[dict[str, GroupKey], str] | None:
        """A first-fit-decreasing repack that fits, and what it kept; None if none fits.

        First the stateful workers stay where they are (those that fit their
        node, largest disrupted first as in Alg. 1) and only the rest is
        repacked around them; a full repack only when that does not fit.
        """
        instances = state.instance_map()
        kept = self._stateful_kept(state, headroom_cores)
        tiers = [({}, "full repack")]
        if kept:
            workers = len({(instances[i].app, node) for i, node in kept.items()})
            tiers.insert(0, (kept, f"keeping {workers} stateful worker(s) in place"))
        for fixed, how in tiers:
            node_of, ok = first_fit_decreasing(state, headroom_cores, fixed)
            if ok:
                groups = {
                    i: GroupKey(n, _label(instances[i].stateful), instances[i].stateful)
                    for i, n in node_of.items()
                }
                return groups, how
        return None

    @staticmethod
    def _stateful_kept(state: PlacementInput, headroom_cores: float) -> dict[str, str]:
        """Stateful instance -> its node, for the stateful workers their nodes can hold."""
        by_slot: dict[str, dict[str, list[Instance]]] = defaultdict(lambda: defaultdict(list))
        placed = state.current_assignment()
        for inst in state.instances:
            if inst.stateful and inst.id in placed:
                by_slot[placed[inst.id][1]][inst.app].append(inst)
        kept: dict[str, str] = {}
        for node, slots in by_slot.items():
            load = {app: sum(i.demand_cores for i in insts) for app, insts in slots.items()}
            total = sum(load.values())
            for app in sorted(slots, key=lambda a: (-load[a], a)):
                if fits(state.capacity(node, headroom_cores), total):
                    kept.update((i.id, node) for i in slots[app])
                else:
                    total -= load[app]
        return kept

    # -- Algorithm 3 -------------------------------------------------------------

    @staticmethod
    def _holds_stateful(layout: _Layout, node: str) -> bool:
        return any(stateful for _, stateful in layout.slots(node))

    @staticmethod
    def _targets(layout: _Layout, victim: str, others: list[str]) -> dict[WorkerSlot, str] | None:
        """A node for each worker of ``victim`` among ``others``, or None if one fits nowhere.

        Tiers as in Alg. 2: first a node where the worker disrupts nobody else
        (the app has no worker of that kind there, or it restarts anyway), then
        a merge into an existing worker; within a tier, least room first.
        """
        by_room = sorted(others, key=lambda n: (layout.free(n), layout.state.node_index[n]))
        free = {n: layout.free(n) for n in others}
        peak_room = {n: layout.stateful_peak_room(n) for n in others}
        targets: dict[WorkerSlot, str] = {}
        for slot in sorted(
            layout.slots(victim), key=lambda s: (-layout.worker_demand(victim, s), s)
        ):
            need = layout.worker_demand(victim, slot)
            peak = layout.worker_peak(victim, slot)
            # A stateful worker goes only where stateful workers keep room for their peaks.
            roomy = [
                n
                for n in by_room
                if fits(free[n], need) and (not slot[1] or fits(peak_room[n], peak))
            ]
            target = next(
                (n for n in roomy if (n, slot) in layout.usable or not layout.members[n].get(slot)),
                roomy[0] if roomy else None,
            )
            if target is None:
                return None
            targets[slot] = target
            free[target] -= need
            peak_room[target] -= peak
        return targets

    def _patience(self, layout: _Layout, node: str) -> int:
        """Consecutive emptiable plans ``node`` must have had before it is emptied."""
        if self._holds_stateful(layout, node):
            return self.scale_in_patience
        return self.stateless_scale_in_patience

    def _stateful_room(self, layout: _Layout, node: str) -> bool:
        """Whether the stateful workers of ``node`` could grow by ``stateful_growth`` and fit."""
        return fits(
            layout.capacity(node), layout.stateful_load(node) * (1.0 + self.stateful_growth)
        )

    def _count_low(self, layout: _Layout) -> set[str]:
        """Nodes that could be emptied now; counts their consecutive low plans."""
        used = [n for n in layout.state.node_ids if layout.used(n)]
        low = set()
        if len(used) > 1:
            low = {
                n for n in used if self._targets(layout, n, [m for m in used if m != n]) is not None
            }
        self._low_streak = {n: self._low_streak.get(n, 0) + 1 for n in sorted(low)}
        return low

    def _scale_in(self, layout: _Layout, reasons: list[str]) -> None:
        nodes = layout.state.node_ids
        index = layout.state.node_index
        instances = layout.state.instance_map()
        low = self._count_low(layout)
        waiting = {n for n in low if self._low_streak[n] < self._patience(layout, n)}
        if waiting:
            reasons.append(
                "scale in: waiting before emptying "
                + ", ".join(
                    f"{n} ({'stateful' if self._holds_stateful(layout, n) else 'stateless'}; "
                    f"emptiable {self._low_streak[n]} of {self._patience(layout, n)} plans)"
                    for n in sorted(waiting, key=index.__getitem__)
                )
            )
        while True:
            used = [n for n in nodes if layout.used(n)]
            if len(used) <= 1:
                return
            by_load = sorted(used, key=lambda n: (layout.load(n), index[n]))
            ready = [n for n in by_load if self._low_streak.get(n, 0) >= self._patience(layout, n)]
            candidates = [n for n in ready if not self._holds_stateful(layout, n)] + [
                n for n in ready if self._holds_stateful(layout, n)
            ]
            # A node waiting to be emptied is a target of last resort, and only for
            # a node holding no stateful worker, so that such a node still empties
            # at once while the others wait: a stateless worker moved there would
            # at worst restart again when the wait ends, cheaper than keeping a
            # node through the whole wait; a stateful one would carry its state
            # twice. The waiting node must keep its stateful workers room to grow.
            roomy_waiting = {n for n in waiting if self._stateful_room(layout, n)}
            tries = [(v, False) for v in candidates]
            if roomy_waiting:
                tries += [(v, True) for v in candidates if not self._holds_stateful(layout, v)]
            for victim, onto_waiting in tries:
                barred = waiting - roomy_waiting if onto_waiting else waiting
                others = [n for n in used if n != victim and n not in barred]
                targets = self._targets(layout, victim, others)
                if targets is not None:
                    break
            else:
                return
            for slot, target in targets.items():
                for inst_id in layout.take_worker(victim, slot):
                    layout.add(target, instances[inst_id])
                layout.usable.add((target, slot))
            self._low_streak.pop(victim, None)
            merged = ", ".join(f"{a}:{_label(sf)}->{t}" for (a, sf), t in sorted(targets.items()))
            onto = sorted({t for t in targets.values() if t in waiting}, key=index.__getitem__)
            note = (
                f" (onto {', '.join(onto)}, waiting to be emptied: no other had room)"
                if onto
                else ""
            )
            reasons.append(f"scale in: emptied node {victim} by moving workers {merged}{note}")
