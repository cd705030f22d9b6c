"""Who sets the caps and thread counts: dsched's controller or a baseline policy.

Every policy sees the same per-epoch observation of the simulated cluster and
acts through the same knobs (caps, parallelism, placement). ``dsched`` goes
through the unmodified production controller via simulated agents; the
baselines are the policies users would otherwise pick:

* ``err`` -- enhanced round robin of "QoS-aware CPU cap adjustment for timely
  data-flow" (§5): fixed threads per class (8/4/2), placed round robin;
  threads on nodes marked over-utilised (CPU >= 90 % or memory-bandwidth
  interference in the last epoch) take no new messages; uncapped.
* ``static-equal`` -- one instance per operator, every node's cores split
  equally among its instances, never changed.
* ``rstorm-static`` -- R-Storm-like: each operator requests the CPU its
  profiled phase-I load needs at 70 % utilization; best-fit placement by
  request; caps = requests, never changed.
* ``ds2`` -- one-step rate-based parallelism: ceil(target rate / true
  processing rate per instance), from useful (busy) time; uncapped.
* ``util-target`` -- Flink-autoscaler-like: parallelism so that busy time is
  0.7, with a stabilization window of 3 epochs after a rescale and for
  scale-downs; uncapped.
* ``vpa`` -- Kubernetes-VPA-like caps: p90 of a decaying histogram of usage
  (half-life 6 epochs) plus a 15 % margin.

The rules themselves (true processing rate, stabilisation window, decaying
histogram, ERR's threads per class) are shared with the live controller's
sizing policies: controller/peers/rules.py.
"""

from __future__ import annotations

import gc
import resource
import tempfile
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Protocol

import numpy as np

from controller.peers import rules
from controller.peers.rules import ERR_THREADS
from testbed.sim.agents import CLOCK_BASE, NODE_PEAK_BANDWIDTH_BYTES_PER_SECOND, SimAgents
from testbed.sim.engine import UNCAPPED, ClusterSim
from testbed.sim.nodepool import spread_onto


@dataclass
class EpochObservation:
    """What every policy sees after an epoch (deltas over the epoch)."""

    epoch: int
    seconds: float
    usage_cores: np.ndarray  # per instance slot
    busy_ratio: np.ndarray
    executed: np.ndarray
    received: np.ndarray
    busy_seconds: np.ndarray
    queue: np.ndarray
    node_utilization: np.ndarray
    source_rate: np.ndarray  # per app, messages/s


class Policy(Protocol):
    name: str
    max_parallelism: int

    def setup(self, sim: ClusterSim) -> None: ...

    def on_epoch(self, sim: ClusterSim, obs: EpochObservation) -> None: ...


def round_robin_layout(
    sim: ClusterSim, parallelism: np.ndarray, skip: np.ndarray | None = None
) -> None:
    """Place instances over nodes in turn, skipping nodes marked in ``skip``."""
    nodes = [n for n in range(sim.sc.nodes) if skip is None or not skip[n]] or list(
        range(sim.sc.nodes)
    )
    turn = 0
    for op in range(sim.n_ops):
        k = int(parallelism[op])
        sim.set_parallelism(op, k, [nodes[(turn + r) % len(nodes)] for r in range(k)], pause=False)
        turn += k


def least_loaded_node(sim: ClusterSim, load: np.ndarray) -> int:
    return int(np.argmin(load / sim.cores))


def over_utilized_nodes(sim: ClusterSim, obs: EpochObservation, cpu_threshold: float) -> np.ndarray:
    """Nodes ERR marks over-utilised after an epoch: CPU use at or above
    ``cpu_threshold`` of the node's cores, or memory-bandwidth interference
    slowing its work down (the "interference-aware" part of ERR)."""
    n = len(sim.cores)
    util = np.zeros(n)
    util[: len(obs.node_utilization)] = obs.node_utilization[:n]
    return (util >= cpu_threshold) | (sim.node_slowdown[:n] > 1.0 + 1e-9)


@dataclass
class ErrPolicy:
    """ "QoS-aware CPU cap adjustment for timely data-flow" §5: fixed threads per
    class, and the enhanced version "averts sending extra load to a physical
    machine that is marked as over-utilized": after every epoch the threads on
    marked nodes take no new messages while their operator has a thread
    elsewhere (their queues still drain)."""

    name: str = "err"
    threads: dict[str, int] = field(default_factory=lambda: dict(ERR_THREADS))
    over_utilized: float = 0.9
    skip_over_utilized: bool = True
    # Epochs x nodes marked over-utilised, and epochs in which some thread was skipped.
    marked_node_epochs: int = 0
    skipping_epochs: int = 0

    @property
    def max_parallelism(self) -> int:
        return max(self.threads.values())

    def setup(self, sim: ClusterSim) -> None:
        par = np.array(
            [rules.err_threads(sim.sc.apps[a].qos_class, self.threads) for a in sim.op_app]
        )
        round_robin_layout(sim, par)

    def on_epoch(self, sim: ClusterSim, obs: EpochObservation) -> None:
        if not self.skip_over_utilized:
            return
        marked = over_utilized_nodes(sim, obs, self.over_utilized)
        self.marked_node_epochs += int(marked.sum())
        takes = ~marked[sim.node]
        if not takes[sim.active].all():
            self.skipping_epochs += 1
        sim.set_dispatch(takes)


@dataclass
class StaticEqualPolicy:
    name: str = "static-equal"
    max_parallelism: int = 1
    headroom_cores: float = 0.1

    def setup(self, sim: ClusterSim) -> None:
        round_robin_layout(sim, np.ones(sim.n_ops, dtype=int))
        inst = np.flatnonzero(sim.active)
        per_node = np.bincount(sim.node[inst], minlength=sim.sc.nodes)
        share = (sim.cores - self.headroom_cores) / np.maximum(per_node, 1)
        sim.set_caps(inst, share[sim.node[inst]])

    def on_epoch(self, sim: ClusterSim, obs: EpochObservation) -> None:
        return None


@dataclass
class RStormStaticPolicy:
    name: str = "rstorm-static"
    max_parallelism: int = 1
    target_utilization: float = 0.7
    headroom_cores: float = 0.1

    def setup(self, sim: ClusterSim) -> None:
        sc = sim.sc
        rates = np.array([a.arrivals.mean_rate() for a in sc.apps])
        request = rates[sim.op_app] * sim.op_work / self.target_utilization
        room = sim.cores - self.headroom_cores
        scale = min(1.0, room.sum() / request.sum())
        request = request * scale
        free = room.copy()
        node_of = np.zeros(sim.n_ops, dtype=int)
        for op in np.argsort(-request, kind="stable"):
            fits = np.flatnonzero(free >= request[op] - 1e-12)
            # Best fit: the node left with the least room that still fits.
            n = int(fits[np.argmin(free[fits])]) if len(fits) else int(np.argmax(free))
            node_of[op] = n
            free[n] -= request[op]
        for op in range(sim.n_ops):
            sim.set_parallelism(op, 1, [int(node_of[op])], pause=False)
        sim.set_caps(np.arange(sim.n_ops) * sim.max_par, np.maximum(request, 1e-3))

    def on_epoch(self, sim: ClusterSim, obs: EpochObservation) -> None:
        return None


@dataclass
class Ds2Policy:
    name: str = "ds2"
    max_parallelism: int = 8

    def setup(self, sim: ClusterSim) -> None:
        round_robin_layout(sim, np.ones(sim.n_ops, dtype=int))

    def on_epoch(self, sim: ClusterSim, obs: EpochObservation) -> None:
        P = sim.max_par
        busy = obs.busy_seconds.reshape(sim.n_ops, P).sum(axis=1)
        done = obs.executed.reshape(sim.n_ops, P).sum(axis=1)
        k = sim.op_k
        # True processing rate per instance: messages per second of useful time.
        true_rate = rules.true_processing_rate(done, busy)
        target = obs.source_rate[sim.op_app]
        want = np.clip(np.ceil(rules.ds2_ratio(target, true_rate, k)), 1, P).astype(int)
        rescale(sim, want, obs)


@dataclass
class UtilTargetPolicy:
    name: str = "util-target"
    max_parallelism: int = 8
    target: float = 0.7
    window: int = 3
    _last_change: np.ndarray | None = None
    _below: np.ndarray | None = None

    def setup(self, sim: ClusterSim) -> None:
        round_robin_layout(sim, np.ones(sim.n_ops, dtype=int))
        self._last_change = np.full(sim.n_ops, -(10**9))
        self._below = np.zeros(sim.n_ops, dtype=int)

    def on_epoch(self, sim: ClusterSim, obs: EpochObservation) -> None:
        P = sim.max_par
        k = sim.op_k.copy()
        busy = obs.busy_ratio.reshape(sim.n_ops, P).sum(axis=1)  # busy instances' sum
        want = np.clip(np.ceil(rules.util_target_want(busy, self.target)), 1, P).astype(int)
        s = rules.stabilise(want, k, obs.epoch, self._last_change, self._below, self.window)
        self._last_change, self._below = s.last_change, s.below
        rescale(sim, s.value, obs)


def rescale(sim: ClusterSim, want: np.ndarray, obs: EpochObservation) -> None:
    """Apply new parallelism; new instances go to the least-loaded nodes."""
    load = obs.node_utilization * sim.cores
    for op in np.flatnonzero(want != sim.op_k):
        k_old, k_new = int(sim.op_k[op]), int(want[op])
        slots = sim.slots_of(op)
        nodes = [int(sim.node[s]) for s in slots[:k_old]]
        for _ in range(k_new - k_old):
            n = least_loaded_node(sim, load)
            nodes.append(n)
            load[n] += obs.usage_cores[slots[: max(k_old, 1)]].mean() if k_old else 0.0
        sim.set_parallelism(int(op), k_new, nodes)


@dataclass
class VpaPolicy:
    name: str = "vpa"
    max_parallelism: int = 1
    half_life_epochs: float = 6.0
    margin: float = 0.15
    percentile: float = 0.9
    floor_cores: float = 0.002
    buckets: np.ndarray = field(default_factory=lambda: np.geomspace(1e-4, 1.0, 80))
    _hist: np.ndarray | None = None

    def setup(self, sim: ClusterSim) -> None:
        round_robin_layout(sim, np.ones(sim.n_ops, dtype=int))
        self._hist = np.zeros((sim.n_inst, len(self.buckets)))

    def on_epoch(self, sim: ClusterSim, obs: EpochObservation) -> None:
        decay = rules.decay_per_epoch(self.half_life_epochs)
        self._hist = rules.histogram_add(self._hist, obs.usage_cores, self.buckets, decay)
        inst = np.flatnonzero(sim.active)
        rec = rules.vpa_recommendation(
            self._hist[inst], self.buckets, self.percentile, self.margin, self.floor_cores
        )
        sim.set_caps(inst, rec)


# ------------------------------------------------------------------ dsched


def controller_features() -> dict[str, object]:
    """What the controller in this tree offers the simulation (reported with results)."""
    from controller import core
    from controller.config import ControllerConfig
    from controller.stages.allocation import ALLOCATORS

    names = {f.name for f in fields(ControllerConfig)}
    return {
        "allocators": ALLOCATORS.names(),
        "qos_classes": "qos" in names,
        "set_qos": hasattr(core.Controller, "set_qos"),
    }


def simulation_controller_config(
    sim: ClusterSim,
    state_dir: Path,
    allocator: str | None = None,
    overrides: dict[str, object] | None = None,
):
    """A ControllerConfig for the simulated cluster, using what this controller has;
    ``overrides`` (a scenario's own settings) win over the defaults below."""
    from controller.config import ControllerConfig
    from controller.stages.allocation import ALLOCATORS

    sc = sim.sc
    names = {f.name for f in fields(ControllerConfig)}
    known = set(ALLOCATORS.names())
    chosen = allocator or ("qos-dp" if "qos-dp" in known else "demand")
    per_instance = sc.total_cores / max(1, sim.n_ops)
    theta = float(min(0.1, max(0.001, round(per_instance / 4, 3))))
    values: dict[str, object] = {
        "state_dir": state_dir,
        "mode": "enforce",
        "slot_seconds": sc.epoch_seconds,
        "phi": 3,  # the QoS cap experiment: a history window of 3 epochs
        "theta_cores": theta,
        "min_cap_cores": theta / 2,
        "headroom_cores": 0.1,
        "allocator": chosen,
        "placement": "none",
        "predictors": ["linear_trend", "dag"],
        "forget_after_slots": 6,
        # The seed's latency model and criterion (mean Allen–Cunneen latency within
        # the target), so simulated runs stay comparable with earlier results.
        "latency_model": "allen-cunneen",
        "latency_criterion": "mean",
        # The simulated agents report resctrl-like bandwidth against this peak; the
        # hinge is the scenario's own (what fit_interference would learn from it).
        "memory_bandwidth_peak_bytes_per_second": NODE_PEAK_BANDWIDTH_BYTES_PER_SECOND,
        "interference_threshold": sc.interference_threshold,
        "interference_slope": sc.interference_slope,
    }
    if "qos" in names and sc.qos:
        from controller.qos import QosClass, QosConfig

        values["qos"] = QosConfig(
            default_class=sc.qos[-1].name,
            classes={
                c.name: QosClass(c.name, c.target_latency_ms, c.max_violation_ratio, c.weight)
                for c in sc.qos
            },
        )
    unknown = sorted(set(overrides or {}) - names)
    if unknown:
        raise ValueError(f"controller overrides: unknown config keys {unknown}")
    values.update(overrides or {})
    cfg = ControllerConfig(**{k: v for k, v in values.items() if k in names})
    cfg.validate()
    return cfg


def assign_classes(controller, sim: ClusterSim) -> str:
    """Tell the controller each application's class, by whatever means it has."""
    if hasattr(controller, "set_qos"):
        for app in sim.sc.apps:
            controller.set_qos(app.name, app.qos_class)
        return "set_qos"
    return "unavailable"


@dataclass
class DschedPolicy:
    """The production controller, in enforce mode, fed by simulated agents."""

    name: str = "dsched"
    max_parallelism: int = 1
    allocator: str | None = None
    # Controller settings of the scenario or the run (e.g. predictors, headroom_cores).
    config_overrides: dict[str, object] = field(default_factory=dict)
    # Instances per operator at the start, placed round robin (empty: one each);
    # max_parallelism must allow them.
    initial_parallelism: tuple[int, ...] = ()
    epoch_seconds: list[float] = field(default_factory=list)
    peak_rss_bytes: int = 0
    class_assignment: str = ""
    config_used: dict[str, object] = field(default_factory=dict)
    failed_epochs: list[str] = field(default_factory=list)
    epoch_cpu_seconds: list[float] = field(default_factory=list)
    gc_threshold: tuple[int, ...] = ()
    _tmp: tempfile.TemporaryDirectory | None = None
    controller: object = None
    agents: SimAgents | None = None

    def setup(self, sim: ClusterSim) -> None:
        from controller.core import Controller, tune_gc

        # The controller runs in this process, configured as dsched-controller
        # configures its own at startup.
        tune_gc()
        self.gc_threshold = gc.get_threshold()
        layout = (
            np.asarray(self.initial_parallelism, dtype=int)
            if self.initial_parallelism
            else np.ones(sim.n_ops, dtype=int)
        )
        round_robin_layout(sim, layout)
        self._tmp = tempfile.TemporaryDirectory(prefix="dsched-sim-")
        cfg = simulation_controller_config(
            sim, Path(self._tmp.name), self.allocator, self.config_overrides
        )
        self.config_used = {
            "allocator": cfg.allocator,
            "phi": cfg.phi,
            "theta_cores": cfg.theta_cores,
            "min_cap_cores": cfg.min_cap_cores,
            "slot_seconds": cfg.slot_seconds,
            "headroom_cores": cfg.headroom_cores,
            "predictors": list(cfg.predictors),
            "latency_model": cfg.latency_model,
            "latency_criterion": cfg.latency_criterion,
            "arrival_scv": cfg.arrival_scv,
            "service_scv": cfg.service_scv,
        }
        self.controller = Controller(cfg, clock=lambda: CLOCK_BASE + sim.t)
        self.agents = SimAgents(sim, self.controller, clock_base=CLOCK_BASE)
        self.controller.set_mode("enforce")
        self.class_assignment = assign_classes(self.controller, sim)

    def on_epoch(self, sim: ClusterSim, obs: EpochObservation) -> None:
        assert self.agents is not None
        self.agents.send_reports()
        t0, c0 = time.perf_counter(), time.process_time()
        try:
            self.controller.run_epoch()
        except Exception as exc:  # noqa: BLE001 - the production loop does the same
            # controller.core.Controller._loop logs a failed epoch and goes on;
            # the simulation does too, and reports how often it happened.
            self.failed_epochs.append(f"epoch {obs.epoch}: {type(exc).__name__}: {exc}")
        self.epoch_seconds.append(time.perf_counter() - t0)
        # CPU time too: on a shared machine wall time also measures the neighbours.
        self.epoch_cpu_seconds.append(time.process_time() - c0)
        self.peak_rss_bytes = max(
            self.peak_rss_bytes, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        )
        self.agents.apply_directives()

    def arima_fitted_sources(self) -> int | None:
        """Sources whose ARIMA model has been fitted (None: ARIMA is off)."""
        sources = getattr(getattr(self.controller, "memory", None), "sources", None)
        if sources is None:
            return None
        return sum(1 for m in sources.models.values() if m.fitted_order is not None)

    def close(self) -> None:
        if self.controller is not None:
            # All of it, the history's spool writer too: its directory goes next.
            self.controller.stop()
        if self._tmp is not None:
            self._tmp.cleanup()


def drain_last_node(sim: ClusterSim) -> int:
    """Move every instance off the newest node to the least loaded others, then
    take the node away; the instances moved."""
    last = len(sim.cores) - 1
    demand = np.where(sim.alive, sim.work_rate, 0.0)
    load = np.bincount(sim.node, demand, minlength=len(sim.cores))[:last]
    leaving = np.flatnonzero(sim.alive & (sim.node == last)).tolist()
    for i in leaving:
        dest = int(np.argmin(load / sim.cores[:last]))
        sim.move(i, dest)
        load[dest] += demand[i]
    sim.remove_last_node()
    return len(leaving)


@dataclass
class UtilScalerPolicy:
    """A cluster autoscaler by utilisation target, the rule of a cloud autoscaling
    group: one node more after ``add_epochs`` epochs in a row with the cluster's
    CPU use above ``add_above``, one fewer after ``remove_epochs`` below
    ``remove_below``, nothing for ``cooldown_epochs`` after a change. Instances
    follow ``util-target``'s rule (parallelism for 0.7 busy time), uncapped, so
    an added node has instances to take."""

    name: str = "util-scaler"
    max_parallelism: int = 8
    add_above: float = 0.8
    add_epochs: int = 2
    remove_below: float = 0.5
    remove_epochs: int = 5
    cooldown_epochs: int = 3
    min_nodes: int = 1
    max_nodes: int = 0  # 0: no limit
    added: int = 0
    removed: int = 0
    _instances: UtilTargetPolicy = field(default_factory=UtilTargetPolicy)
    _above: int = 0
    _below: int = 0
    _last_change: int = -(10**9)

    def setup(self, sim: ClusterSim) -> None:
        self._instances.max_parallelism = self.max_parallelism
        self._instances.setup(sim)

    def on_epoch(self, sim: ClusterSim, obs: EpochObservation) -> None:
        self._instances.on_epoch(sim, obs)
        util = float(obs.usage_cores.sum() / sim.cores.sum())
        self._above = self._above + 1 if util > self.add_above else 0
        self._below = self._below + 1 if util < self.remove_below else 0
        if obs.epoch - self._last_change < self.cooldown_epochs:
            return
        n = len(sim.cores)
        if self._above >= self.add_epochs and (not self.max_nodes or n < self.max_nodes):
            spread_onto(sim, sim.add_node(float(sim.sc.cores_per_node)))
            self.added += 1
        elif self._below >= self.remove_epochs and n > self.min_nodes:
            drain_last_node(sim)
            self.removed += 1
        else:
            return
        self._last_change = obs.epoch
        self._above = self._below = 0


POLICIES = {
    "dsched": DschedPolicy,
    "err": ErrPolicy,
    "static-equal": StaticEqualPolicy,
    "rstorm-static": RStormStaticPolicy,
    "ds2": Ds2Policy,
    "util-target": UtilTargetPolicy,
    "vpa": VpaPolicy,
}


def make_policy(name: str) -> Policy:
    try:
        return POLICIES[name]()
    except KeyError:
        raise ValueError(f"unknown policy {name!r} (known: {', '.join(POLICIES)})") from None


def uncapped(sim: ClusterSim) -> np.ndarray:
    return ~np.isfinite(sim.cap) | (sim.cap == UNCAPPED)
