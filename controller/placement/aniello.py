"""``aniello-online``: the traffic-based online scheduler of "Adaptive Online
Scheduling in Storm" (Aniello et al., §3.2).

The schedule is two allocations (§3.2.2): A1 executors -> workers, with each
topology on exactly ``min(E_i, W_i)`` workers (its equation (2)), and A2
workers -> nodes, with each node's load within its capacity (equation (1));
the objective is the least inter-node traffic (3). Load is CPU in Hz
(§3.2.1): an executor measured at ``c`` cores on a node whose cores run at
``f`` Hz loads any node with ``c * f`` Hz, and node k holds ``B_k`` = its
usable cores times its clock (:attr:`Node.clock_hz`; nodes without one run at
:data:`DEFAULT_CLOCK_HZ`, so equal speeds by default).

The text of the algorithm (§3.2.3) is not given beyond its opening: "two
consecutive phases", executors partitioned among the topology's workers,
then workers onto nodes, by a greedy heuristic that minimises inter-node
traffic and avoids load imbalance. Ours, phase by phase:

1. per topology, executors by decreasing traffic (then load) each join the
   worker that keeps most of their traffic inside it, among workers under
   ``ceil(E / w)`` executors and a load of ``max(1.25 * total / w, largest
   executor)``; when as many executors are left as workers are empty, the
   next goes to an empty one, so exactly ``w = min(E, W)`` workers are used;
2. workers by decreasing traffic each go to the node with room (Hz, and a
   free slot when ``slots_per_node`` is set) that keeps most of their
   traffic local, ties to the node with most room left (balance).

Rescheduling (§3.2.1): a node whose load stays at or above its capacity for
more than ``window_seconds`` (X_i; each plan or observation is one epoch of
``slot_seconds``) triggers the new schedule; otherwise it is applied only
when it cuts inter-node traffic by more than ``threshold_percent`` (R%).
Instances on vanished nodes are always placed again.
"""

from __future__ import annotations

import math
from collections import defaultdict

from controller.placement.baselines import _check_count, _check_number
from controller.placement.common import (
    Decision,
    GroupKey,
    PlacementStrategy,
    inter_node_traffic,
    keep_current,
    neighbours,
)
from controller.placement.model import EPSILON_CORES, Instance, PlacementInput

#: Clock of a node that does not give one: all such nodes run at the same speed.
DEFAULT_CLOCK_HZ = 1e9


def clock(state: PlacementInput, node: str) -> float:
    hz = state.node(node).clock_hz
    return DEFAULT_CLOCK_HZ if hz is None else hz


def load_hz(state: PlacementInput) -> dict[str, float]:
    """Each instance's load in Hz, from its demand on the node it runs on now
    (instances not placed: at the mean clock of the nodes)."""
    listed = set(state.node_ids)
    mean = (
        sum(clock(state, n) for n in state.node_ids) / len(state.node_ids)
        if state.node_ids
        else DEFAULT_CLOCK_HZ
    )
    return {
        i.id: i.demand_cores * (clock(state, i.node) if i.node in listed else mean)
        for i in state.instances
    }


def capacity_hz(state: PlacementInput, headroom_cores: float) -> dict[str, float]:
    """B_k: usable cores times clock."""
    return {n: state.capacity(n, headroom_cores) * clock(state, n) for n in state.node_ids}


def _slack(hz: float) -> float:
    # Capacity comparisons in Hz tolerate the same rounding as in cores.
    return EPSILON_CORES * max(1.0, hz)


class AnielloOnlineStrategy(PlacementStrategy):
    """Executors -> min(E, W) workers -> nodes, in Hz; rescheduled after an
    overload that lasts X_i, or for an R% traffic cut."""

    name = "aniello-online"

    def __init__(
        self,
        threshold_percent: float = 10.0,
        workers_per_app: int | None = None,
        window_seconds: float = 0.0,
        slot_seconds: float = 10.0,
        slots_per_node: int | None = None,
    ) -> None:
        self.threshold_percent = _check_number("threshold_percent", threshold_percent, 0.0, 100.0)
        self.workers_per_app = _check_count("workers_per_app", workers_per_app)
        self.window_seconds = _check_number("window_seconds", window_seconds, 0.0)
        self.slot_seconds = _check_number("slot_seconds", slot_seconds, 1e-9)
        self.slots_per_node = _check_count("slots_per_node", slots_per_node)
        # Node -> seconds its load has stayed at or above its capacity.
        self.overloaded_for: dict[str, float] = {}

    # -- X_i ---------------------------------------------------------------------

    def _tick(self, state: PlacementInput, headroom_cores: float) -> list[str]:
        """Advance each node's overload clock by one epoch; nodes past X_i."""
        hz = load_hz(state)
        cap = capacity_hz(state, headroom_cores)
        load = dict.fromkeys(state.node_ids, 0.0)
        for iid, (_, node) in state.current_assignment().items():
            load[node] += hz[iid]
        clocks: dict[str, float] = {}
        for n in state.node_ids:
            # L_i >= B_i in the paper; beyond it by more than rounding here, so
            # that a node exactly full (which fits) starts no clock.
            if load[n] > cap[n] + _slack(cap[n]):
                clocks[n] = self.overloaded_for.get(n, 0.0) + self.slot_seconds
        self.overloaded_for = clocks
        return [n for n, s in clocks.items() if s > self.window_seconds]

    def observe(self, state: PlacementInput, headroom_cores: float = 0.0) -> None:
        self._tick(state, headroom_cores)

    # -- the two phases ----------------------------------------------------------

    def schedule(
        self, state: PlacementInput, headroom_cores: float
    ) -> tuple[dict[str, GroupKey], list[str]]:
        hz = load_hz(state)
        talk = neighbours(state)
        nodes = state.node_ids
        reasons: list[str] = []
        # Phase 1: executors -> workers, per topology.
        worker_of: dict[str, tuple[str, int]] = {}
        worker_load: dict[tuple[str, int], float] = {}
        by_app: dict[str, list[Instance]] = defaultdict(list)
        for inst in state.instances:
            by_app[inst.app].append(inst)
        for app in sorted(by_app):
            insts = by_app[app]
            w = min(len(insts), self.workers_per_app or len(nodes))
            total = sum(hz[i.id] for i in insts)
            per_count = math.ceil(len(insts) / w)
            per_load = max(1.25 * total / w, max(hz[i.id] for i in insts))
            count = [0] * w
            load = [0.0] * w
            order = sorted(
                insts, key=lambda i: (-sum(talk.get(i.id, {}).values()), -hz[i.id], i.id)
            )
            for left, inst in zip(range(len(order), 0, -1), order, strict=True):
                empty = [k for k in range(w) if count[k] == 0]
                if len(empty) >= left:
                    candidates = empty  # equation (2): every one of the w workers is used
                else:
                    candidates = [
                        k
                        for k in range(w)
                        if count[k] < per_count
                        and load[k] + hz[inst.id] <= per_load + _slack(per_load)
                    ] or [min(range(w), key=lambda k: (load[k], k))]

                def inside(k: int, inst: Instance = inst, app: str = app) -> float:
                    return sum(
                        r for o, r in talk.get(inst.id, {}).items() if worker_of.get(o) == (app, k)
                    )

                k = max(candidates, key=lambda k: (inside(k), -load[k], -k))
                worker_of[inst.id] = (app, k)
                count[k] += 1
                load[k] += hz[inst.id]
            for k in range(w):
                worker_load[(app, k)] = load[k]
        # Phase 2: workers -> nodes.
        w_talk: dict[tuple[str, int], dict[tuple[str, int], float]] = defaultdict(dict)
        for a, others in talk.items():
            for b, r in others.items():
                wa, wb = worker_of[a], worker_of[b]
                if wa != wb:
                    w_talk[wa][wb] = w_talk[wa].get(wb, 0.0) + r
        free = capacity_hz(state, headroom_cores)
        slots = dict.fromkeys(nodes, self.slots_per_node or math.inf)
        node_of_worker: dict[tuple[str, int], str] = {}
        for wk in sorted(worker_load, key=lambda k: (-sum(w_talk[k].values()), -worker_load[k], k)):
            need = worker_load[wk]
            room = [n for n in nodes if slots[n] >= 1 and free[n] + _slack(free[n]) >= need]
            if not room:
                target = max(nodes, key=lambda n: (free[n] - need, -state.node_index[n]))
                reasons.append(
                    f"worker {wk[0]}#{wk[1]} ({need / 1e9:.3g} GHz) fits on no node; put on {target}"
                )
            else:

                def local(n: str, wk=wk) -> float:
                    return sum(r for o, r in w_talk[wk].items() if node_of_worker.get(o) == n)

                target = max(room, key=lambda n: (local(n), free[n], -state.node_index[n]))
            node_of_worker[wk] = target
            free[target] -= need
            slots[target] -= 1
        groups = {i: GroupKey(node_of_worker[wk], f"w{wk[1]}") for i, wk in worker_of.items()}
        return groups, reasons

    # -- the decision ----------------------------------------------------------

    def decide(self, state, headroom_cores):
        past_window = self._tick(state, headroom_cores)
        groups, reasons = self.schedule(state, headroom_cores)
        displaced = state.displaced()
        if displaced:
            return Decision(
                groups,
                (
                    f"{len(displaced)} instance(s) unplaced or on a vanished node; scheduling all",
                    *reasons,
                ),
            )
        if past_window:
            spans = ", ".join(f"{n} for {self.overloaded_for[n]:g}s" for n in past_window)
            self.overloaded_for = {}
            return Decision(
                groups,
                (
                    f"node(s) over capacity longer than the {self.window_seconds:g}s window: "
                    f"{spans}; rescheduling",
                    *reasons,
                ),
            )
        now = inter_node_traffic(state, {i: n for i, (_, n) in state.current_assignment().items()})
        new = inter_node_traffic(state, {i: g.node for i, g in groups.items()})
        cut = 0.0 if now <= 0 else 100.0 * (now - new) / now
        waiting = [
            f"{n} over capacity for {s:g}s (window {self.window_seconds:g}s)"
            for n, s in sorted(self.overloaded_for.items())
        ]
        if cut > self.threshold_percent:
            return Decision(
                groups,
                (
                    f"inter-node traffic falls {cut:.1f}% ({now:.4g} -> {new:.4g} tuples/s), "
                    f"more than {self.threshold_percent:g}%",
                    *waiting,
                    *reasons,
                ),
            )
        return Decision(
            keep_current(state),
            (
                f"inter-node traffic would fall {cut:.1f}%, not more than "
                f"{self.threshold_percent:g}%; keeping the placement",
                *waiting,
            ),
        )


__all__ = ["DEFAULT_CLOCK_HZ", "AnielloOnlineStrategy", "capacity_hz", "clock", "load_hz"]
