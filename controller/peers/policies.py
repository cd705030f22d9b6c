"""The peers as controller-side sizing policies: caps per instance from the views.

Each policy reads the same :class:`~controller.stages.evaluate.OperatorView`s
dsched's pipeline reads and returns what it wants per instance, with the
memory it keeps (:class:`PeerState`). The instance counts of a running
application are fixed here (the controller caps, it does not rescale), so the
two parallelism rules become CPU per instance: the operator's resource need,
spread evenly over its instances.

* ``ds2``: the operator's target input rate (its sources' observed arrivals,
  carried down the DAG through each operator's measured selectivity) over its
  true processing rate per core (tuples per CPU-second: on a capped thread,
  busy time is CPU time) gives the cores it needs.
* ``util-target``: the operator's busy cores over the window divided by the
  target 0.7, with the stabilisation window (``window_epochs``).
* ``vpa``: each instance's decaying histogram of its usage, one sample per
  epoch (the newest slot), 0.9 percentile times 1.15.
* ``err``: ERR's threads of the application's class (8 / 4 / 2), each worth
  one instance's full CPU (``max_instance_cores``), spread over the operator's
  instances; never adapted. In the simulator ERR's threads are uncapped: the
  same ceiling.

The rules themselves are in :mod:`controller.peers.rules`; what every policy's
wishes go through afterwards (bounds, node capacity) is in
:mod:`controller.peers.epoch`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import NamedTuple, Protocol

import numpy as np

import controller.peers.rules as rules
from controller.qos import QosClass
from controller.stages.evaluate import OperatorView
from dsched.ids import InstanceKey, OperatorKey


class PeerState(NamedTuple):
    """A peer's per-instance memory between epochs.

    It takes the place of dsched's :class:`~controller.stages.hysteresis.HysteresisState`
    in the controller's memory (a peer replaces hysteresis), so it starts with
    the same three fields: code that holds caps reads ``cap`` alike.
    """

    cap: float | None = None  # the cap in force after the last epoch
    demand: float | None = None  # what the policy wanted last epoch (before bounds)
    accumulated_decrease: float = 0.0  # unused by peers; kept for the shared layout
    last_change: int = -(10**9)  # util-target: epoch of the operator's last change
    below: int = 0  # util-target: consecutive epochs it wanted less
    histogram: np.ndarray | None = None  # vpa: decayed weights per bucket


def _peer(state: object) -> PeerState:
    """The peer memory in ``state``: a restart resumes plain caps, which start afresh."""
    if isinstance(state, PeerState):
        return state
    cap = getattr(state, "cap", None)
    return PeerState(cap=cap)


@dataclass(frozen=True)
class SizingInputs:
    """What a sizing policy decides from (all read-only)."""

    epoch: int
    views: Mapping[OperatorKey, OperatorView]
    classes: Mapping[str, QosClass]
    capacity: Mapping[str, float]  # node -> cores
    memory: Mapping[InstanceKey, object]  # instance -> its last state
    kappa: Mapping[OperatorKey, float]  # CPU-seconds per tuple remembered per operator
    max_instance_cores: float
    min_cap_cores: float

    def state(self, key: InstanceKey) -> PeerState:
        return _peer(self.memory.get(key))

    @cached_property
    def instances_per_node(self) -> dict[str, int]:
        return dict(Counter(n for v in self.views.values() for n in v.nodes.values()))

    def first_cap(self, view: OperatorView, key: InstanceKey) -> float:
        """Where an instance without a cap starts: its node's capacity shared
        equally by the node's instances in the views (how the testbed starts them)."""
        node = view.nodes[key]
        on_node = self.instances_per_node.get(node, 1)
        return min(self.max_instance_cores, self.capacity.get(node, 1.0) / max(1, on_node))


class Wish(NamedTuple):
    """What a policy wants for one instance, and its memory after this epoch
    (``cap`` in the state is set once the caps are final)."""

    cores: float
    state: PeerState


class SizingPolicy(Protocol):
    """One peer's rule: a wish per instance of the views."""

    name: str

    def size(self, inputs: SizingInputs) -> dict[InstanceKey, Wish]: ...


def _busy_cores(view: OperatorView) -> float:
    """Mean cores the operator's instances used over the window."""
    total = float(view.seconds.sum())
    return float(view.cpu_seconds.sum()) / total if total > 0 else 0.0


def _spread(view: OperatorView, cores: float, states: Mapping[InstanceKey, PeerState]):
    per = cores / max(1, len(view.instances))
    return {k: Wish(per, states[k]._replace(demand=per)) for k in view.instances}


@dataclass(frozen=True)
class Ds2Sizing:
    name: str = "ds2"

    def target_rates(self, views: Mapping[OperatorKey, OperatorView]) -> dict[OperatorKey, float]:
        """Each operator's target input rate: sources at their observed arrivals,
        the rest the sum of their parents' targets times the parents' selectivity
        (DS2's dataflow traversal)."""
        out: dict[OperatorKey, float] = {}

        def rate(key: OperatorKey, seen: frozenset) -> float:
            if key in out:
                return out[key]
            view = views[key]
            parents = [OperatorKey(key.app, p) for p in view.upstream]
            parents = [p for p in parents if p in views and p not in seen]
            if not parents:
                value = view.window_mean(view.arrivals)
            else:
                value = sum(rate(p, seen | {key}) * views[p].selectivity for p in parents)
            out[key] = value
            return value

        for key in views:
            rate(key, frozenset())
        return out

    def size(self, inputs: SizingInputs) -> dict[InstanceKey, Wish]:
        views = inputs.views
        targets = self.target_rates(views)
        wishes: dict[InstanceKey, Wish] = {}
        for key, view in views.items():
            states = {k: inputs.state(k) for k in view.instances}
            busy = float(view.cpu_seconds.sum())
            done = float(view.executed @ view.seconds)
            true_rate = rules.true_processing_rate(np.array([done]), np.array([busy]))
            if not np.isfinite(true_rate[0]) and key in inputs.kappa and inputs.kappa[key] > 0:
                # Idle over the window: the last measured cost stands for the rate.
                true_rate = np.array([1.0 / inputs.kappa[key]])
            caps = [s.cap for s in states.values() if s.cap is not None]
            held = sum(caps) if caps else sum(inputs.first_cap(view, k) for k in view.instances)
            cores = float(rules.ds2_ratio(np.array([targets[key]]), true_rate, np.array([held]))[0])
            wishes.update(_spread(view, cores, states))
        return wishes


@dataclass(frozen=True)
class UtilTargetSizing:
    name: str = "util-target"
    target: float = 0.7
    window_epochs: int = 3

    def size(self, inputs: SizingInputs) -> dict[InstanceKey, Wish]:
        wishes: dict[InstanceKey, Wish] = {}
        for view in inputs.views.values():
            states = {k: inputs.state(k) for k in view.instances}
            n = max(1, len(view.instances))
            want = float(rules.util_target_want(np.array([_busy_cores(view)]), self.target)[0]) / n
            first = states[view.instances[0]]
            caps = [s.cap for s in states.values()]
            if any(c is None for c in caps):
                # Nothing in force yet: the first size is taken as it is.
                new, last, below = want, inputs.epoch, 0
            else:
                current = sum(caps) / n  # type: ignore[arg-type]
                s = rules.stabilise(
                    np.array([want]),
                    np.array([current]),
                    inputs.epoch,
                    np.array([first.last_change]),
                    np.array([first.below]),
                    self.window_epochs,
                )
                changed = bool(s.value[0] != current)
                new = float(s.value[0])
                last, below = int(s.last_change[0]), int(s.below[0])
                if not changed:
                    # Held: each instance keeps its own cap (after a node fit they differ).
                    for k, st in states.items():
                        wishes[k] = Wish(
                            float(st.cap),  # type: ignore[arg-type]
                            st._replace(demand=want, last_change=last, below=below),
                        )
                    continue
            for k, st in states.items():
                wishes[k] = Wish(new, st._replace(demand=want, last_change=last, below=below))
        return wishes


@dataclass(frozen=True)
class VpaSizing:
    name: str = "vpa"
    half_life_epochs: float = 6.0
    percentile: float = 0.9
    margin: float = 0.15
    # The VPA's CPU histogram starts at 0.01 core and grows by 5 %; instances
    # here use hundredths of a core, so it starts lower.
    first_bucket_cores: float = 0.001
    bucket_ratio: float = 1.05
    floor_cores: float = 0.0

    def buckets(self, top: float) -> np.ndarray:
        return rules.vpa_buckets(self.first_bucket_cores, self.bucket_ratio, top)

    def size(self, inputs: SizingInputs) -> dict[InstanceKey, Wish]:
        keys: list[InstanceKey] = []
        usage: list[float] = []
        for view in inputs.views.values():
            for k in view.instances:
                keys.append(k)
                usage.append(float(view.usage_by_instance.get(k, 0.0)))
        if not keys:
            return {}
        buckets = self.buckets(inputs.max_instance_cores)
        states = [inputs.state(k) for k in keys]
        hist = np.zeros((len(keys), len(buckets)))
        for i, s in enumerate(states):
            if s.histogram is not None and len(s.histogram) == len(buckets):
                hist[i] = s.histogram
        hist = rules.histogram_add(
            hist, np.asarray(usage), buckets, rules.decay_per_epoch(self.half_life_epochs)
        )
        rec = rules.vpa_recommendation(
            hist, buckets, self.percentile, self.margin, self.floor_cores
        ).tolist()
        return {
            k: Wish(r, s._replace(demand=r, histogram=h))
            for k, s, r, h in zip(keys, states, rec, hist, strict=True)
        }


@dataclass(frozen=True)
class ErrSizing:
    name: str = "err"
    threads: Mapping[str, int] = field(default_factory=lambda: dict(rules.ERR_THREADS))

    def size(self, inputs: SizingInputs) -> dict[InstanceKey, Wish]:
        wishes: dict[InstanceKey, Wish] = {}
        for key, view in inputs.views.items():
            cls = inputs.classes.get(key.app)
            threads = rules.err_threads(cls.name if cls is not None else "", self.threads)
            cores = threads * inputs.max_instance_cores
            states = {k: inputs.state(k) for k in view.instances}
            wishes.update(_spread(view, cores, states))
        return wishes
