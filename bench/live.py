"""`dsched bench live`: the adaptive scheme's experiments on real threads and real caps.

Reproduces the WordCount (regular and random rate) and HTTP monitor experiments
of Liu et al., "An Adaptive Online Scheme for Scheduling and Resource
Enforcement in Storm" (section V), on this machine: the same topology and the
same time-compressed trace are run once per contender, one after another:

- ``dsched``: the real ``dsched-controller`` and ``dsched-agent`` (enforce mode)
  drive the caps;
- ``ds2``, ``util-target``, ``vpa``, ``err``: the same controller and agent with
  the config key ``policy`` set to that peer (controller/peers): the peer's
  published rule sizes the caps, which reach the threads as real cgroup writes
  through the same agent;
- ``static-0.7`` / ``static-0.3``: R-Storm's fixed 0.7 / 0.3 core per executor,
  scaled so that ``static-0.7`` adds up to the testbed's capacity (to 0.7 of it
  on the paper's nodes);
- ``equal``: static caps whose per-operator totals equal dsched's mean
  allocation in the same run (so ``dsched`` runs first);
- ``uncapped``: no per-instance cap.

Every contender gets the same CPU: the instance tree's quota is the testbed's
capacity (``--capacity-cores``), and the run lives in a cgroup of its own
with a high ``cpu.shares`` (:class:`testbed.live.static.Reservation`) so that
other work on a shared machine does not eat into it. Tuples that take longer
than ``--timeout`` (the paper's 30 s scaled by the slot compression) count as
failed; after the trace the run waits one timeout for the tuples in flight,
then drops what is left (counted as failed and lost).

``--profile`` names a set of settings: ``default`` (dsched's own: 2-s slots, a
decision every 0.5 s) or ``seed001`` (the paper's: 10-s slots decided once
each, phi = 5, theta = 0.2 paper core, two nodes of 6 paper cores, the
20-minute traces); flags given explicitly win. ``--nodes 2`` or more runs the
application in worker processes across that many agent nodes
(:class:`testbed.live.distributed.DistributedTopology`) with the controller's
placement and live moves for the controlled contenders, and the static caps
placed once, first fit.

JSON: ``scenario``, ``profile`` (its name and resolved settings), ``nodes``,
``scale``, ``trace``, ``qos_class``, ``contenders.<name>`` (metrics, among them
``violation_slot_share`` and ``meets_target`` against the class, the paper's
``workers_used_mean`` / ``nodes_used_mean`` and ``moves``, and per-slot /
per-operator series), ``ratios`` (dsched against the others) and, with
``seed001``, ``paper_comparison`` (the paper's table beside this run).
``--plot`` also writes ``<stem>-pareto.png``: CPU allocated against the share
of slots over the target, one point per contender.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import random
import shutil
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np

from agent.registry import InstanceKey
from bench.common import (
    HEADROOM_PREFIX,
    headroom_contenders,
    headroom_of,
    label_points,
    pareto_front,
    print_contenders,
    write_result,
)
from controller.config import ControllerConfig
from controller.peers import PEERS
from controller.qos import QosClass, QosConfig, default_qos_classes
from dsched import signals
from testbed import traces
from testbed.live import http_monitor as httpmon
from testbed.live import wordcount as wc
from testbed.live.actuator import MoveEndpoint
from testbed.live.cluster import CGROUP_V1_CPU, LocalCluster, NodeSpec
from testbed.live.distributed import DistributedTopology
from testbed.live.engine import (
    CPU_MODES,
    LiveTopology,
    TopologySpec,
    calibrate_hash_seconds,
    check_chunk_seconds,
    set_hash_seconds,
)
from testbed.live.static import (
    Reservation,
    Scale,
    StaticCaps,
    first_fit_placement,
    release_and_remove,
    static_caps,
)

SCENARIOS = ("wordcount-regular", "wordcount-random", "http")
CONTENDERS = ("dsched", *PEERS, "static-0.3", "static-0.7", "equal", "uncapped")
# Contenders whose caps come from the controller (and its agent), by sizing policy.
CONTROLLED = ("dsched", *PEERS)
# dsched run again at another headroom (``--dsched-headrooms``): dsched-h<cores>.
QOS_CLASSES = tuple(default_qos_classes())
PAPER_SLOT_SECONDS = 10.0
PAPER_TIMEOUT_SECONDS = 30.0
# The trace's peak needs this share of static-0.7's caps on the busiest operator.
PEAK_SHARE = 0.85
# Trace values above this many peaks are refused (a trace is a fraction of the peak).
MAX_TRACE_LEVEL = 1.5
# How far back dsched's linear trend looks (phi x epoch).
TREND_SECONDS = 2.0
# How long a node holding only stateless workers must have been emptiable before
# placement empties it: five of the default profile's 2-s load levels, so a lull
# of one level does not empty a node the next level refills. At the seed001
# profile's 10-s decisions it is one plan: the paper's rule.
STATELESS_SCALE_IN_WAIT_SECONDS = 10.0
# Placement judges each instance by its demand averaged over the same five levels:
# a node over its room for a level or two is fitted by the allocator's cuts, where
# a move would pause instances for a load that is gone by the time they resume.
# At seed001's 10-s decisions it is one epoch: the demand now, the paper's rule.
PLACEMENT_DEMAND_SECONDS = 10.0
# ...or over the last load level where that is more, so a rise is placed within
# a level: judged by the 10-s mean alone, a ramp out of a lull found every
# instance on one node and had its caps cut to that node's room for 10 s while
# the other node sat empty.
PLACEMENT_RISE_SECONDS = TREND_SECONDS
# A plan for overload alone must remove 0.02 core of it per instance it moves
# (3 % of a two-node run's node). Under caps an instance's demand swings by a few
# hundredths of a core from epoch to epoch: without a floor, the random trace's
# runs moved 52 instances each, over half of them back within 20 s, most for
# overflows under 0.1 core and one repack 6 instances for 0.003 core.
PLACEMENT_MIN_RELIEF_CORES = 0.02
MAX_NODES = 8


# The paper's rules for the controller keys a profile sets (``Profile.rules``):
# caps up to theta with theta/2 to spare, no dead band (so nothing to fall
# through), the point forecast, CPU per tuple proportional to the rate.
PAPER_RULES: Mapping[str, Any] = MappingProxyType(
    {
        "cap_rounding": "margin",
        "hysteresis_band": 0.0,
        "lower_after_falls": 0,
        "forecast_median": "off",
        "cost_model": "proportional",
    }
)
# dsched's own: to the nearest theta where theta is a small part of a cap; a dead
# band of 40 % of the cap, as four decisions per trace slot would otherwise move
# a cap every epoch and the random trace moves each level by more than a quarter
# every 2 s; a cap falls through that band once its demand has fallen three
# epochs in a row, as the regular trace's levels fall smoothly and a fall that
# must gather 40 % of the cap first holds CPU the trace no longer asks for;
# bronze sized for the median of next slot's arrivals, as the max
# rule's point forecast asks for more than a class that tolerates half its
# tuples late needs; CPU per tuple as an affine cost (a fixed part per slot plus
# a slope per tuple), as the testbed's instances spend part of their CPU per
# slot whatever their rate and the proportional cost overstates a rise.
OWN_RULES: Mapping[str, Any] = MappingProxyType(
    {
        "cap_rounding": "nearest",
        "hysteresis_band": 0.4,
        "lower_after_falls": 3,
        "forecast_median": "on",
        "cost_model": "marginal",
    }
)


@dataclass(frozen=True)
class Profile:
    """A named set of the run's settings; a flag given on the command line wins."""

    name: str
    about: str
    duration: float
    slot_seconds: float
    epoch_seconds: float
    warmup: float
    capacity_cores: float
    nodes: int
    # dsched's cap granularity in testbed cores; None: ``theta_paper_cores`` scaled
    # like static-0.7 (the paper's core becomes Scale.factor cores here).
    theta_cores: float | None
    # Slots of the linear trend; None: as many epochs as cover TREND_SECONDS.
    phi: int | None
    theta_paper_cores: float | None = None
    # The paper's node size: sets the share of the testbed static-0.7 fills.
    node_paper_cores: float | None = None
    # Controller keys of the dsched contender's rules (PAPER_RULES' keys).
    rules: Mapping[str, Any] = field(default_factory=lambda: OWN_RULES)


# Settings a profile fixes: argparse destinations, each also a Profile field.
PROFILE_KEYS = (
    "duration",
    "slot_seconds",
    "epoch_seconds",
    "warmup",
    "capacity_cores",
    "nodes",
    "theta_cores",
    "phi",
)
PROFILES = {
    "default": Profile(
        "default",
        "dsched's own settings: 2-s trace slots, a decision every 0.5 s, theta 0.005 core "
        "(caps to the nearest, a dead band of 40 % of the cap that a cap falls through "
        "after three falling epochs, an affine CPU cost), "
        "a trend over the last 2 s, one node of 1.6 cores",
        duration=80.0,
        slot_seconds=2.0,
        epoch_seconds=0.5,
        warmup=6.0,
        capacity_cores=1.6,
        nodes=1,
        theta_cores=0.005,
        phi=None,
    ),
    # Liu et al., "An Adaptive Online Scheme for Scheduling and Resource Enforcement
    # in Storm", section V: a decision every 10-s slot, phi = 5 slots (50 s),
    # theta = 20 % of a core, 6 cores per node given to Storm, R-Storm(70)'s
    # 12 x 0.7 = 8.4 cores filling two nodes; the WordCount traces rise for 5 min
    # and fall for 5, twice (20 min), or draw 1..25 producers every 10 s.
    "seed001": Profile(
        "seed001",
        "the paper's settings: 10-s slots with a decision every slot, phi 5 (50 s), theta "
        "0.2 paper core, two nodes of 6 paper cores, the 20-minute traces",
        duration=1200.0,
        slot_seconds=10.0,
        epoch_seconds=10.0,
        warmup=30.0,
        capacity_cores=1.6,
        nodes=2,
        theta_cores=None,
        phi=5,
        theta_paper_cores=0.2,
        node_paper_cores=6.0,
        rules=PAPER_RULES,
    ),
}


def resolve_profile(args: argparse.Namespace) -> Profile:
    """Fill every profile setting the command line left unset (None) from
    ``--profile``; ValueError for an unknown profile."""
    name = getattr(args, "profile", None) or "default"
    if name not in PROFILES:
        raise ValueError(f"--profile: unknown profile {name!r} (known: {', '.join(PROFILES)})")
    profile = PROFILES[name]
    given = []
    for key in PROFILE_KEYS:
        if getattr(args, key, None) is None:
            setattr(args, key, getattr(profile, key))
        else:
            given.append("--" + key.replace("_", "-"))
    args.profile, args.profile_flags = name, given
    return profile


def share_07(profile: Profile, executors: int, nodes: int) -> float:
    """The share of the testbed's capacity static-0.7 fills: all of it, or as on the
    profile's nodes (0.7 core x executors over nodes x node size, at most all)."""
    if profile.node_paper_cores is None:
        return 1.0
    return min(1.0, 0.7 * executors / (profile.node_paper_cores * nodes))


def node_names(nodes: int) -> list[str]:
    """One node keeps the name (and cgroup root) of the single-node testbed."""
    return ["local"] if nodes == 1 else [f"n{k}" for k in range(1, nodes + 1)]


def node_root(nodes: int, node: str) -> str:
    """The node's instance tree inside the run's reservation."""
    return Reservation.TESTBED if nodes == 1 else f"{Reservation.TESTBED}-{node}"


class Interrupted(signals.Interrupted):
    """SIGINT / SIGTERM arrived; the run stopped everything it had started."""


def policy_of(name: str) -> str | None:
    """The controller's sizing policy behind contender ``name``; None: static caps."""
    if name in CONTROLLED:
        return name
    if name.startswith(HEADROOM_PREFIX):
        return "dsched"
    return None


# ---------------------------------------------------------------- topologies


def balanced_vocabulary(words: int = 20, instances: int = 4) -> tuple[str, ...]:
    """``words`` words that spread evenly over ``instances`` count instances.

    The stock vocabulary sends 40% of the words to one count instance; with
    equal per-executor caps (R-Storm) that instance would saturate first and
    the comparison would measure the skew, not the allocation.
    """
    per_bucket = math.ceil(words / instances)
    buckets: dict[int, list[str]] = {b: [] for b in range(instances)}
    for base in wc.WORDS * 8:
        for suffix in range(100):
            w = f"{base}{suffix}"
            b = zlib.crc32(w.encode()) % instances
            if len(buckets[b]) < per_bucket and w not in buckets[b]:
                buckets[b].append(w)
                break
        if all(len(v) >= per_bucket for v in buckets.values()):
            break
    return tuple(w for b in range(instances) for w in buckets[b])[:words]


def wordcount_spec(parallelism: int = 4) -> TopologySpec:
    """WordCount with equal CPU per root in each operator (1.5 ms: source, split, 5 x count)."""
    vocabulary = balanced_vocabulary(instances=parallelism)

    def sentence(n: int, rng: random.Random) -> tuple[str, str]:
        return str(n), " ".join(rng.choice(vocabulary) for _ in range(wc.WORDS_PER_SENTENCE))

    spec = wc.wordcount(parallelism=parallelism, source_ms=1.5, split_ms=1.5, count_ms=0.3)
    return dataclasses.replace(spec, make_root=sentence)


def operator_cpu_per_root_ms(spec: TopologySpec, fanout: Mapping[str, float]) -> dict[str, float]:
    """Mean CPU milliseconds each operator spends per root tuple."""
    arrivals = {o.name: 1.0 for o in spec.sources}
    out: dict[str, float] = {}
    for o in spec.operators:  # topological order
        a = arrivals.get(o.name, 0.0)
        out[o.name] = a * o.cost_ms
        for c in spec.children(o.name):
            arrivals[c.name] = arrivals.get(c.name, 0.0) + a * fanout.get(o.name, 1.0)
    return out


@dataclass(frozen=True)
class Scenario:
    name: str
    spec: TopologySpec
    fanout: Mapping[str, float]
    group_keys: Mapping[str, Callable[[Any], str]]
    levels: np.ndarray  # per slot, as a fraction of the peak rate
    slot_seconds: float
    scale: Scale

    @property
    def peak_rate(self) -> float:
        """Roots per second at which the busiest operator needs PEAK_SHARE of static-0.7."""
        per_op = operator_cpu_per_root_ms(self.spec, self.fanout)
        by_op = {
            o.name: o.parallelism * self.scale.core_07 / (per_op[o.name] / 1000.0)
            for o in self.spec.operators
            if per_op[o.name] > 0
        }
        return PEAK_SHARE * min(by_op.values())

    @property
    def rates(self) -> np.ndarray:
        return self.levels * self.peak_rate

    def rate_function(self, warmup: float = 0.0) -> Callable[[float], float]:
        """Roots per second at ``t`` seconds; the first slot's rate during the warm-up."""
        rates = [float(r) for r in self.rates]

        def rate(t: float) -> float:
            return rates[min(max(int((t - warmup) / self.slot_seconds), 0), len(rates) - 1)]

        return rate

    def peak_cores(self) -> float:
        return self.peak_rate * self.spec.cpu_per_root_ms(dict(self.fanout)) / 1000.0


def scenario_topology(name: str) -> tuple[TopologySpec, dict[str, float], dict]:
    if name.startswith("wordcount"):
        return wordcount_spec(), dict(wc.FANOUT), {}
    if name == "http":
        return httpmon.http_monitor(), dict(httpmon.FANOUT), dict(httpmon.GROUP_KEYS)
    raise ValueError(f"unknown scenario {name!r} (known: {', '.join(SCENARIOS)})")


def scenario_levels(name: str, slots: int, seed: int) -> np.ndarray:
    """The rate schedule as fractions of the peak, one value per slot."""
    if name == "wordcount-regular":
        # The paper rises for 5 minutes and falls for 5, twice: two periods.
        return traces.triangle(slots, 0.1, 1.0, period=max(2, slots // 2))
    if name == "wordcount-random":
        # A fresh level 1..25 every slot (the paper's number of Kafka producers).
        return traces.random_steps(slots, 1, 25, seed=seed) / 25.0
    if name == "http":
        day = traces.diurnal(
            slots, 0.15, 0.7, bursts=max(1, slots // 15), seed=seed, burst_height=0.4
        )
        return np.minimum(day, 1.0)
    raise ValueError(f"unknown scenario {name!r} (known: {', '.join(SCENARIOS)})")


def parse_trace_file(path: Path) -> np.ndarray:
    """A trace file: a JSON list of numbers, or one number per line (``#`` comments).

    Values are fractions of the scenario's peak rate, one per slot.
    """
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ValueError(f"--trace {path}: cannot read: {exc.strerror}") from None
    stripped = text.strip()
    try:
        if stripped.startswith("["):
            values = json.loads(stripped)
            if not isinstance(values, list):
                raise ValueError("not a list")
            levels = [float(v) if not isinstance(v, bool) else float("nan") for v in values]
        else:
            levels = [
                float(line.split("#", 1)[0])
                for line in text.splitlines()
                if line.split("#", 1)[0].strip()
            ]
    except (ValueError, TypeError) as exc:
        raise ValueError(f"--trace {path}: does not parse as numbers: {exc}") from None
    if not levels:
        raise ValueError(f"--trace {path}: no values")
    bad = [v for v in levels if not math.isfinite(v) or v < 0 or v > MAX_TRACE_LEVEL]
    if bad:
        raise ValueError(
            f"--trace {path}: values must be finite fractions of the peak in [0, {MAX_TRACE_LEVEL}], "
            f"got {bad[0]!r}"
        )
    return np.asarray(levels, dtype=float)


# ---------------------------------------------------------------- measuring


def thread_cpu_seconds(pid: int, tid: int) -> float | None:
    """CPU seconds (user + system) of one thread, from procfs."""
    try:
        with open(f"/proc/{pid}/task/{tid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rindex(b")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Samples:
    """Once a second: per instance CPU seconds and cap, and the roots in flight."""

    times: list[float] = field(default_factory=list)
    cpu: list[dict[tuple[str, int], float]] = field(default_factory=list)
    caps: list[dict[tuple[str, int], float | None]] = field(default_factory=list)
    in_flight: list[int] = field(default_factory=list)
    plans: dict[int, tuple[float, dict[str, Any]]] = field(default_factory=dict)
    # Per sample: (operator, index) -> (worker, node) of every instance hosted then.
    placement: list[dict[tuple[str, int], tuple[str, str]]] = field(default_factory=list)


def instance_view(
    topo: LiveTopology | DistributedTopology,
) -> dict[tuple[str, int], tuple[str, str, int, int | None]]:
    """(operator, index) -> (worker, node, pid, tid of the thread doing its CPU work;
    None before it runs) for every instance hosted now."""
    if isinstance(topo, DistributedTopology):
        return topo.active()
    return {
        (i.spec.name, i.index): (
            i.worker,
            "local",
            *(i.cpu_pid_tid if i.native_id is not None else (0, None)),
        )
        for i in topo.all_instances()
    }


class Sampler:
    """Reads the instances' CPU from procfs, their caps from the cgroup files and
    where they run from the topology."""

    def __init__(
        self,
        topo: LiveTopology | DistributedTopology,
        backends: Mapping[str, Any],
        t0: float,
        cluster: LocalCluster | None,
    ):
        """``backends``: node -> the cgroup backend of that node's instance tree."""
        self.topo, self.backends, self.t0, self.cluster = topo, dict(backends), t0, cluster
        self.samples = Samples()
        self._threads: dict[tuple[str, int], tuple[int, int]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench.sampler", daemon=True)

    def sample(self) -> None:
        with self._lock:
            self._sample()

    def _sample(self) -> None:
        s = self.samples
        now = time.monotonic() - self.t0
        cpu, caps, placement = {}, {}, {}
        roots = {node: b.roots() for node, b in self.backends.items()}
        for ref, (worker, node, pid, tid) in instance_view(self.topo).items():
            placement[ref] = (worker, node)
            if tid is not None:
                # A moved instance is a new thread: its counter starts again, so the
                # interval across the move has no usage rather than a wrong one.
                if self._threads.setdefault(ref, (pid, tid)) == (pid, tid):
                    used = thread_cpu_seconds(pid, tid)
                    if used is not None:
                        cpu[ref] = used
                self._threads[ref] = (pid, tid)
            backend = self.backends.get(node)
            # Wherever the agent nested it (under the thread's own cgroup).
            key = InstanceKey(self.topo.spec.app, *ref)
            path = None if backend is None else backend.find_instance(key, worker, roots[node])
            caps[ref] = backend.read_cap(path) if path is not None else None
        s.times.append(now)
        s.cpu.append(cpu)
        s.caps.append(caps)
        s.placement.append(placement)
        s.in_flight.append(self.topo.acker.in_flight)
        if self.cluster is not None:
            try:
                rec = self.cluster.plan()
            except Exception:  # noqa: BLE001 - a slow admin call must not stop sampling
                rec = None
            if rec and rec.get("operators") and rec["epoch"] not in s.plans:
                s.plans[rec["epoch"]] = (now, rec)

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            self.sample()

    def start(self) -> Sampler:
        self.sample()
        self._thread.start()
        return self

    def stop(self) -> Samples:
        self._stop.set()
        self._thread.join(timeout=10)
        return self.samples


# ---------------------------------------------------------------- one contender


@dataclass
class RunSettings:
    duration: float
    warmup: float
    slot_seconds: float
    epoch_seconds: float
    timeout: float
    capacity_cores: float
    cpu_period_us: int
    seed: int
    cpu: str
    controller_options: dict[str, Any]
    workdir: Path
    reservation: Reservation
    interrupted: threading.Event
    # The application's class: its latency target judges every contender.
    qos: QosClass = field(default_factory=lambda: default_qos_classes()["bronze"])
    nodes: int = 1
    theta_cores: float = 0.005
    phi: int | None = None
    rules: Mapping[str, Any] = field(default_factory=lambda: OWN_RULES)
    # The CPU seconds of one hashed chunk, the same for every contender's workers.
    chunk_seconds: float | None = None

    @property
    def node_cores(self) -> float:
        return self.capacity_cores / self.nodes

    def dsched_config(self, scale: Scale) -> dict[str, Any]:
        """The dsched contender's controller settings at these run settings
        (before ``controller_options``)."""
        return controller_config(
            scale,
            self.epoch_seconds,
            theta_cores=self.theta_cores,
            phi=self.phi,
            nodes=self.nodes,
            rules=self.rules,
        )


def controller_config(
    scale: Scale,
    epoch_seconds: float,
    *,
    theta_cores: float = 0.005,
    phi: int | None = None,
    nodes: int = 1,
    rules: Mapping[str, Any] = PAPER_RULES,
) -> dict[str, Any]:
    """The dsched contender's controller settings.

    Fine cap granularity by default: with a dozen executors sharing two cores,
    theta = 0.1 core would round each cap up by more than its whole demand.
    ``rules`` (rounding, dead band, bronze's forecast, cost model) default to the paper's
    (:data:`PAPER_RULES`); the default profile passes :data:`OWN_RULES`: at theta
    = 0.005 the margin would hold about 0.06 core above a dozen grants.
    With several nodes the testbed's capacity is split evenly between them and
    the ``liu`` placement moves instances off a node that overloads."""
    trend_epochs = round(TREND_SECONDS / epoch_seconds)
    out = {
        "theta_cores": theta_cores,
        **rules,
        "min_cap_cores": 0.01,
        "headroom_cores": 0.05,
        # By default the trend looks back about one trace slot: long enough to see
        # a ramp, short enough to forget the level before the last change. ARIMA
        # needs a longer history than a benchmark run has.
        "phi": phi if phi is not None else max(2, trend_epochs),
        # A queue left by a burst (or by a move's pause) is drained over the same
        # span: within one 0.5-s epoch it would ask for several times the node, and
        # placement would move instances to find room that no node has.
        "backlog_drain_slots": max(1, trend_epochs),
        "predictors": ["linear_trend", "dag"],
        "node_capacity_cores": {n: scale.capacity_cores / nodes for n in node_names(nodes)},
    }
    if nodes > 1:
        # A node's worker processes dispatch every tuple on threads of their own,
        # inside the node's quota: the caps share the node with them.
        out["other_cpu"] = "subtract"
        out["placement"] = "liu"
        out["scale_in_wait_stateless_seconds"] = STATELESS_SCALE_IN_WAIT_SECONDS
        out["placement_demand_seconds"] = PLACEMENT_DEMAND_SECONDS
        out["placement_rise_seconds"] = PLACEMENT_RISE_SECONDS
        out["placement_min_relief_cores"] = PLACEMENT_MIN_RELIEF_CORES
    return out


def cpu_mode(args: argparse.Namespace) -> str:
    """``--cpu``, else its default: a process per instance's CPU work, on one node
    or several (the worker threads' own CPU is counted against their node)."""
    return args.cpu if args.cpu is not None else "process"


def controller_options(args: argparse.Namespace) -> dict[str, Any]:
    """``--controller-option`` overrides, with ``--forecast-quantile`` set on every
    default class and ``--qos-class`` as the default class (the benchmark's
    application runs in the default class)."""
    options = {k: json.loads(v) for k, _, v in (o.partition("=") for o in args.controller_option)}
    qos_class = getattr(args, "qos_class", None)
    if qos_class is not None and qos_class != QosConfig().default_class:
        options.setdefault("qos", {})["default_class"] = qos_class
    if args.forecast_quantile is not None:
        options.setdefault("qos", {})["classes"] = {
            name: {
                "target_latency_ms": c.target_latency_ms,
                "max_violation_ratio": c.max_violation_ratio,
                "weight": c.weight,
                "forecast_quantile": args.forecast_quantile,
            }
            for name, c in default_qos_classes().items()
        }
    return options


def sizing(options: Mapping[str, Any]) -> dict[str, Any]:
    """The latency model, criterion and forecast quantile the dsched contender ran
    with: the controller's defaults unless overridden."""
    defaults = ControllerConfig()
    qos = QosConfig()
    quantile = qos.classes[qos.default_class].forecast_quantile
    chosen = options.get("qos", {}).get("default_class", qos.default_class)
    if chosen in qos.classes:
        quantile = qos.classes[chosen].forecast_quantile
    classes = options.get("qos", {}).get("classes", {})
    quantile = classes.get(chosen, {}).get("forecast_quantile", quantile)
    return {
        "latency_model": options.get("latency_model", defaults.latency_model),
        "latency_criterion": options.get("latency_criterion", defaults.latency_criterion),
        "forecast_quantile": quantile,
    }


# sun_path holds 108 bytes; the agent's socket lives in the cluster's workdir.
MAX_SOCKET_DIR = 80


def cluster_workdir(wanted: Path) -> Path:
    """``wanted``, or a short directory under the temp dir when its socket path would
    not fit in a Unix socket address (:func:`settle_workdir` moves its files to
    ``wanted`` once the cluster has stopped)."""
    if len(str(wanted.resolve())) <= MAX_SOCKET_DIR:
        return wanted
    return Path(tempfile.mkdtemp(prefix=f"dsl-{wanted.name[:20]}-"))


def fresh_contender_dir(workdir: Path, scenario: str, contender: str) -> Path:
    """``workdir/<scenario>-<contender>``, emptied: a controller that found an
    earlier run's state there would resume it (its caps, hysteresis and costs)
    and the run would not start where every other contender does."""
    path = workdir / f"{scenario}-{contender}"
    shutil.rmtree(path, ignore_errors=True)
    return path


def settle_workdir(used: Path, wanted: Path) -> None:
    """Once the cluster has stopped: the logs, configs and state of a short stand-in
    directory go to ``wanted`` (sockets stay behind), and the stand-in is removed."""
    if used == wanted:
        return
    try:
        shutil.copytree(used, wanted, ignore=shutil.ignore_patterns("*.sock"), dirs_exist_ok=True)
    except (OSError, shutil.Error) as exc:
        # Runs in a finally: never hide the contender's own outcome behind this.
        print(f"dsched bench live: logs left in {used}: {exc}", file=sys.stderr)
        return
    shutil.rmtree(used, ignore_errors=True)


def _wait(settings: RunSettings, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if settings.interrupted.wait(min(0.2, max(0.0, deadline - time.monotonic()))):
            raise Interrupted()


def run_contender(
    name: str, scn: Scenario, settings: RunSettings, equal_by_operator: Mapping[str, float] | None
) -> dict[str, Any]:
    """Run the whole trace once under contender ``name``; everything started is stopped."""
    period = settings.cpu_period_us
    res = settings.reservation
    nodes = node_names(settings.nodes)
    several = len(nodes) > 1
    roots = {n: node_root(settings.nodes, n) for n in nodes}
    backends = {n: res.backend(period, roots[n]) for n in nodes}
    cluster: LocalCluster | None = None
    wanted = fresh_contender_dir(settings.workdir, scn.name, name)
    workdir = wanted
    endpoint: MoveEndpoint | None = None
    topo: LiveTopology | DistributedTopology | None = None
    sampler: Sampler | None = None
    try:
        sockets: dict[str, str | None] = dict.fromkeys(nodes)
        policy = policy_of(name)
        headroom = headroom_of(name)
        if policy is not None:
            ccfg = settings.dsched_config(scn.scale)
            if several:
                # Bound before the controller starts (its config names the URL); the
                # topology is attached once it runs.
                endpoint = MoveEndpoint().start()
                ccfg.update(move_actuator="testbed", move_url=endpoint.url)
            workdir = cluster_workdir(wanted)
            cluster = LocalCluster(
                workdir,
                mode="enforce",
                slot_seconds=settings.epoch_seconds,
                controller_config={
                    **ccfg,
                    **settings.controller_options,
                    # Who sizes the caps: dsched's pipeline or a peer's rule.
                    "policy": policy,
                    **({} if headroom is None else {"headroom_cores": headroom}),
                },
                nodes=[
                    NodeSpec(
                        n,
                        cgroup_root=roots[n],
                        extra_config={
                            "cgroup_mode": "v1",
                            "cgroup_mount": str(res.top),
                            "cpu_period_us": period,
                            "capacity_cores": settings.node_cores,
                            # The node's processes run inside its root (one machine
                            # holds every node): its other CPU is its root's threads'.
                            "node_cpu": "cgroup",
                            "sample_seconds": min(1.0, settings.epoch_seconds / 2),
                        },
                    )
                    for n in nodes
                ],
            )
            cluster.start()
            sockets = {n: str(cluster.agents[n].socket) for n in nodes}
        caps = (
            None
            if policy is not None
            else static_caps(name, scn.spec.operators, scn.scale, equal_by_operator)
        )
        if several:
            # A node's capacity covers its worker processes whole, as on a real node.
            for n in nodes:
                res.place((), period, settings.node_cores, roots[n])
            # The controlled contenders start on the first node and leave it as
            # placement decides; static caps are placed once, as few nodes as they fit.
            start_on = (
                {}
                if caps is None
                else first_fit_placement(
                    scn.spec.operators, caps, nodes, settings.node_cores, scn.scale.core_07
                )
            )
            topo = DistributedTopology(
                scn.spec,
                scn.rate_function(settings.warmup),
                nodes=sockets,
                placement={f"{scn.spec.app}/{op}/{i}": n for (op, i), n in start_on.items()},
                timeout_seconds=settings.timeout,
                seed=settings.seed,
                group_keys=scn.group_keys,
                on_worker_start=lambda node, pid: res.place_process(pid, roots[node]),
                # Several pushes per epoch, so each epoch's counts are whole.
                counters_seconds=settings.epoch_seconds / 4,
                cpu=settings.cpu,
                chunk_seconds=settings.chunk_seconds,
            )
        else:
            topo = LiveTopology(
                scn.spec,
                scn.rate_function(settings.warmup),
                node="local",
                agent_socket=sockets["local"],
                timeout_seconds=settings.timeout,
                seed=settings.seed,
                group_keys=scn.group_keys,
                cpu=settings.cpu,
                # Several pushes per epoch, so each epoch's counts are whole.
                report_seconds=settings.epoch_seconds / 4,
            )
        topo.start()
        if endpoint is not None:
            endpoint.attach(topo)
        t0 = topo._t0
        view = instance_view(topo)
        for n in nodes:
            threads = [(ref, w, pid, tid) for ref, (w, node, pid, tid) in view.items() if node == n]
            if caps is None:
                # Until the agent's first cap moves them, the instances share their node.
                res.place(
                    (tid for *_, tid in threads if tid is not None),
                    period,
                    settings.node_cores,
                    roots[n],
                )
            else:
                StaticCaps(res.top, roots[n], period).apply_threads(
                    (
                        (InstanceKey(scn.spec.app, *ref), w, pid, tid)
                        for ref, w, pid, tid in threads
                        if tid is not None
                    ),
                    caps,
                    settings.node_cores,
                )
        sampler = Sampler(topo, backends, t0, cluster).start()
        _wait(settings, settings.warmup + settings.duration - (time.monotonic() - t0))
        sampler.sample()  # close the measured window at its end, not up to a second before
        topo.stop_input()
        deadline = time.monotonic() + settings.timeout + 1.0
        while topo.acker.in_flight and time.monotonic() < deadline:
            _wait(settings, 0.1)
        drained_at = time.monotonic() - t0
        samples = sampler.stop()
        sampler = None
        # No plan may move instances while the topology stops.
        if endpoint is not None:
            endpoint.stop()
            endpoint = None
        unfinished = topo.abort()
        moves = [
            (round(when - t0 - settings.warmup, 2), iid, src, dst)
            for when, iid, src, dst in getattr(topo, "moves_done", [])
        ]
        return summarize(name, scn, settings, topo, samples, unfinished, drained_at, moves)
    finally:
        if sampler is not None:
            sampler.stop()
        if endpoint is not None:
            endpoint.stop()
        if topo is not None:
            topo.abort()
        if cluster is not None:
            cluster.stop()
            settle_workdir(workdir, wanted)
        for backend in backends.values():
            release_and_remove(backend)


# ---------------------------------------------------------------- figures


def cap_changes_per_instance_hour(
    times: list[float], caps: list[Mapping[Any, float | None]], w0: float, w1: float
) -> float:
    """Cap writes seen per instance and hour inside the window [w0, w1]: a change is
    an instance whose cap (read once a second) differs from the previous reading.

    Readings a second apart miss a change undone within the second; the count is
    a lower bound, the same for every contender."""
    t = np.asarray(times, dtype=float)
    refs = {r for c in caps for r in c}
    hours = max(0.0, min(w1, float(t[-1])) - w0) / 3600 if len(t) else 0.0
    if not refs or hours <= 0:
        return 0.0
    changes = 0
    for k in range(1, len(t)):
        if not w0 < t[k] <= w1 + 1e-9:
            continue
        before, after = caps[k - 1], caps[k]
        for r in refs:
            a, b = before.get(r), after.get(r)
            if (a is None) != (b is None) or (a is not None and abs(a - b) > 1e-6):
                changes += 1
    return changes / len(refs) / hours


def slot_violations(
    latency_ms: list[float | None], done: list[int], trace_slots: int, target_ms: float
) -> list[bool]:
    """Per slot judged, whether it violated the class's target: its mean latency is
    over the target, or it is one of the trace's slots (input arrived all along)
    and no measured root completed in it. Slots after the trace count only when
    something completed in them (the drain)."""
    out = []
    for i, (lat, n) in enumerate(zip(latency_ms, done, strict=True)):
        if n:
            out.append(lat is not None and lat > target_ms)
        elif i < trace_slots:
            out.append(True)
    return out


def used_per_slot(
    times: list[float],
    placements: list[Mapping[Any, tuple[str, str]]],
    w0: float,
    w1: float,
    slot_seconds: float,
) -> tuple[list[int], list[int]]:
    """Per slot of the window [w0, w1], the distinct workers and nodes that hosted at
    least one instance at some reading inside it (the paper's "workers and worker
    nodes the topology used in past 10 seconds"); slots without a reading are left out."""
    n = max(1, round((w1 - w0) / slot_seconds))
    workers: list[set[str]] = [set() for _ in range(n)]
    nodes: list[set[str]] = [set() for _ in range(n)]
    for t, placement in zip(times, placements, strict=True):
        if not w0 <= t <= w1 + 1e-9:
            continue
        i = min(int((t - w0) // slot_seconds), n - 1)
        for worker, node in placement.values():
            workers[i].add(worker)
            nodes[i].add(node)
    return [len(w) for w in workers if w], [len(x) for x in nodes if x]


def _mean(values: list[int]) -> float | None:
    return round(sum(values) / len(values), 3) if values else None


def _percentile(sorted_values: list[float], q: float) -> float | None:
    if not sorted_values:
        return None
    return sorted_values[min(len(sorted_values) - 1, max(0, math.ceil(q * len(sorted_values)) - 1))]


def summarize(
    name: str,
    scn: Scenario,
    settings: RunSettings,
    topo: LiveTopology,
    samples: Samples,
    unfinished: int,
    drained_at: float,
    moves: list[tuple[float, str, str, str]] | None = None,
) -> dict[str, Any]:
    """The contender's figures; ``moves``: (seconds since the trace started,
    instance, from node, to node) of every migration carried out."""
    a = topo.acker
    w0, w1 = settings.warmup, settings.warmup + settings.duration
    latencies_all = np.asarray(a.latencies, dtype=float)
    done_all = np.asarray(a.completion_times, dtype=float) - topo.started_at
    # Roots created during the warm-up are not measured.
    measured = (done_all - latencies_all) >= w0
    latencies, done_at = latencies_all[measured], done_all[measured] - w0
    lat_sorted = sorted(latencies.tolist())
    on_time = int(np.sum(latencies <= settings.timeout))
    late = int(np.sum(latencies > settings.timeout))

    ops = [o.name for o in scn.spec.operators]
    n_inst = sum(o.parallelism for o in scn.spec.operators)
    t = np.asarray(samples.times)
    alloc_total = used_total = 0.0
    series_ops: dict[str, dict[str, list]] = {
        o: {"time_s": [], "cap_cores": [], "usage_cores": [], "predicted_demand_cores": []}
        for o in ops
    }
    alloc_by_op = dict.fromkeys(ops, 0.0)
    window = 0.0
    # Sample intervals clipped to the measured window [warm-up, warm-up + duration].
    for k in range(1, len(t)):
        lo, hi = max(t[k - 1], w0), min(t[k], w1)
        if hi <= lo:
            continue
        dt = t[k] - t[k - 1]
        caps_now = samples.caps[k - 1]
        # An instance without a cap of its own shares its node's capacity with the
        # instances there; a node is charged at most its capacity.
        where = {ref: node for ref, (_w, node) in samples.placement[k - 1].items()}
        hosted = {n: sum(1 for x in where.values() if x == n) for n in set(where.values())}
        by_node: dict[str | None, float] = {}
        for o in ops:
            cap_o = use_o = 0.0
            for ref, cap in caps_now.items():
                if ref[0] != o:
                    continue
                node = where.get(ref)
                if cap is None:
                    cap = (
                        settings.node_cores / hosted[node]
                        if node in hosted
                        else settings.capacity_cores / n_inst
                    )
                cap = min(cap, settings.node_cores)
                by_node[node] = by_node.get(node, 0.0) + cap
                cap_o += cap
                before, after = samples.cpu[k - 1].get(ref), samples.cpu[k].get(ref)
                if before is not None and after is not None:
                    use_o += (after - before) / dt
            alloc_by_op[o] += cap_o * (hi - lo)
            used_total += use_o * (hi - lo)
            s = series_ops[o]
            s["time_s"].append(round(float(t[k] - w0), 2))
            s["cap_cores"].append(round(cap_o, 4))
            s["usage_cores"].append(round(use_o, 4))
        alloc_now = sum(min(v, settings.node_cores) for v in by_node.values())
        alloc_total += min(alloc_now, settings.capacity_cores) * (hi - lo)
        window += hi - lo
    # The controller's predicted demand per operator, at the time each decision was read.
    for _epoch, (when, rec) in sorted(samples.plans.items()):
        if when < w0:
            continue
        for row in rec.get("operators", []):
            if row.get("operator") in series_ops:
                series_ops[row["operator"]]["predicted_demand_cores"].append(
                    [round(when - w0, 2), round(float(row.get("demand_cores", 0.0)), 4)]
                )
    moves = list(moves or [])
    workers_used, nodes_used = used_per_slot(
        samples.times, samples.placement, w0, w1, settings.slot_seconds
    )
    # Who made the decisions read: a peer's records carry its name as the predictor.
    predictors = sorted(
        {row.get("predictor", "") for _w, rec in samples.plans.values() for row in rec["operators"]}
    )

    # Per-slot series by completion time, from the start of the trace.
    slot = settings.slot_seconds
    n_slots = max(1, math.ceil(max(drained_at - w0, settings.duration) / slot))
    idx = np.minimum((np.maximum(done_at, 0) // slot).astype(int), n_slots - 1)
    per_slot_done = np.bincount(idx, minlength=n_slots)
    per_slot_late = np.bincount(idx, weights=(latencies > settings.timeout), minlength=n_slots)
    lat_sum = np.bincount(idx, weights=latencies, minlength=n_slots)
    per_slot_lat = [
        round(1000 * float(s / c), 2) if c else None
        for s, c in zip(lat_sum, per_slot_done, strict=True)
    ]
    qos = settings.qos
    judged = slot_violations(
        per_slot_lat,
        per_slot_done.tolist(),
        max(1, round(settings.duration / slot)),
        qos.target_latency_ms,
    )
    violation_share = sum(judged) / len(judged) if judged else 0.0
    return {
        "latency_ms_mean": round(1000 * float(np.mean(latencies)), 3) if len(latencies) else None,
        "latency_ms_p99": round(1000 * _percentile(lat_sorted, 0.99), 3) if lat_sorted else None,
        "throughput_tuples": on_time,
        "failed": late + unfinished,
        "lost": unfinished,
        "roots": int(len(latencies)) + unfinished,
        "completed": int(len(latencies)),
        "duplicated": int(a.duplicated),
        "cpu_allocated_core_seconds": round(alloc_total, 3),
        "cpu_used_core_seconds": round(used_total, 3),
        "cpu_window_seconds": round(window, 3),
        "cap_changes_per_instance_hour": round(
            cap_changes_per_instance_hour(samples.times, samples.caps, w0, w1), 2
        ),
        # Slots whose mean latency is over the class's target, and whether that
        # share is within the violations the class tolerates.
        "violation_slot_share": round(violation_share, 4),
        "meets_target": bool(violation_share <= qos.max_violation_ratio),
        "policy": policy_of(name),
        "allocated_cores_mean_by_operator": {
            o: round(v / window, 4) if window else 0.0 for o, v in alloc_by_op.items()
        },
        # The paper's counts: per slot, the workers and nodes hosting an instance.
        "workers_used_mean": _mean(workers_used),
        "nodes_used_mean": _mean(nodes_used),
        "moves": len(moves),
        "move_log": [
            {"time_s": t, "instance": iid, "from": src, "to": dst} for t, iid, src, dst in moves
        ],
        "decisions": len(samples.plans),
        "decision_predictors": predictors,
        "series": {
            "slot_seconds": slot,
            "throughput_tuples": [int(x) for x in per_slot_done - per_slot_late],
            "failed": [int(x) for x in per_slot_late],
            "latency_ms_mean": per_slot_lat,
            "workers_used": workers_used,
            "nodes_used": nodes_used,
            "in_flight": {
                "time_s": [round(float(x - w0), 2) for x in t],
                "roots": samples.in_flight,
            },
        },
        "operators": series_ops,
    }


def ratios(contenders: Mapping[str, dict[str, Any]]) -> dict[str, Any]:
    """dsched against each other contender (other / dsched, and dsched / other)."""
    d = contenders.get("dsched")
    if d is None:
        return {}
    out: dict[str, Any] = {}
    for name, c in contenders.items():
        if name == "dsched":
            continue
        out[name] = {
            "dsched_cpu_allocated_over_other": _ratio(
                d["cpu_allocated_core_seconds"], c["cpu_allocated_core_seconds"]
            ),
            "dsched_throughput_over_other": _ratio(d["throughput_tuples"], c["throughput_tuples"]),
            "other_latency_mean_over_dsched": _ratio(c["latency_ms_mean"], d["latency_ms_mean"]),
        }
    return out


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return round(a / b, 4)


def done_means(contenders: Mapping[str, dict[str, Any]]) -> dict[str, bool | None]:
    """The acceptance targets set for WordCount, evaluated on this run.

    dsched loses and fails nothing, allocates at most 0.6x static-0.7's CPU with at
    least 0.97x its throughput, and has a lower mean latency than static-0.3 and
    equal. None: a contender needed for the target did not run.
    """
    d, s7 = contenders.get("dsched"), contenders.get("static-0.7")
    s3, eq = contenders.get("static-0.3"), contenders.get("equal")
    out: dict[str, bool | None] = {}
    out["dsched_no_lost_no_failed"] = None if d is None else (d["lost"] == 0 and d["failed"] == 0)
    if d and s7:
        out["dsched_cpu_at_most_0.6x_static_0.7"] = bool(
            d["cpu_allocated_core_seconds"] <= 0.6 * s7["cpu_allocated_core_seconds"]
        )
        out["dsched_throughput_at_least_0.97x_static_0.7"] = (
            d["throughput_tuples"] >= 0.97 * s7["throughput_tuples"]
        )
    for label, other in (("static_0.3", s3), ("equal", eq)):
        if d and other and d["latency_ms_mean"] is not None:
            out[f"dsched_latency_below_{label}"] = (
                other["latency_ms_mean"] is None or d["latency_ms_mean"] < other["latency_ms_mean"]
            )
    return {k: None if v is None else bool(v) for k, v in out.items()}


# ---------------------------------------------------------------- plots


def plot(doc: dict[str, Any], path: Path) -> list[Path]:
    """Latency / throughput / failed per slot per contender, and dsched's allocation."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    contenders = doc["contenders"]
    fig, axes = plt.subplots(4, 1, figsize=(9, 11), sharex=True)
    slot = doc["slot_seconds"]
    rates = doc["trace"]["rates"]
    axes[0].step(np.arange(len(rates)) * slot, rates, where="post", color="black")
    axes[0].set_ylabel("input roots/s")
    axes[0].set_title(
        f"{doc['scenario']}: {doc['scale']['capacity_cores']:g} cores, slot {slot:g} s"
    )
    for name, c in contenders.items():
        s = c["series"]
        x = np.arange(len(s["throughput_tuples"])) * slot
        lat = [np.nan if v is None else v for v in s["latency_ms_mean"]]
        axes[1].plot(x, lat, label=name)
        axes[2].plot(x, np.asarray(s["throughput_tuples"]) / slot, label=name)
        axes[3].plot(x, s["failed"], label=name)
    axes[1].set_yscale("log")
    axes[1].set_ylabel("mean complete latency ms")
    axes[2].set_ylabel("acked roots/s")
    axes[3].set_ylabel("failed per slot")
    axes[3].set_xlabel("seconds")
    axes[1].legend(fontsize=8, ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    written.append(path)

    d = contenders.get("dsched")
    if d is not None:
        ops = list(d["operators"])
        fig, axes = plt.subplots(
            len(ops), 1, figsize=(9, 2.2 * len(ops) + 1), sharex=True, squeeze=False
        )
        for ax, op in zip(axes[:, 0], ops, strict=True):
            s = d["operators"][op]
            ax.plot(s["time_s"], s["cap_cores"], label="cap (dsched)", drawstyle="steps-post")
            ax.plot(s["time_s"], s["usage_cores"], label="usage")
            if s["predicted_demand_cores"]:
                px, py = zip(*s["predicted_demand_cores"], strict=True)
                ax.plot(px, py, label="predicted demand", linestyle="--")
            for other in ("static-0.7", "equal"):
                if other in contenders:
                    ax.axhline(
                        contenders[other]["allocated_cores_mean_by_operator"][op],
                        linestyle=":",
                        color="grey" if other == "static-0.7" else "brown",
                        label=other,
                    )
            ax.set_ylabel(f"{op} cores")
        axes[0, 0].legend(fontsize=8, ncol=3)
        axes[-1, 0].set_xlabel("seconds")
        fig.suptitle(f"{doc['scenario']}: dsched per-operator demand, cap and usage")
        fig.tight_layout()
        alloc = path.with_name(path.stem + "-allocation" + path.suffix)
        fig.savefig(alloc, dpi=90)
        plt.close(fig)
        written.append(alloc)
    written.append(plot_pareto(doc, path.with_name(path.stem + "-pareto" + path.suffix)))
    return written


def plot_pareto(doc: dict[str, Any], path: Path) -> Path:
    """CPU allocated against the share of slots over the class's target, one point
    per contender, the non-dominated ones joined: is dsched on the frontier?"""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = {
        name: (float(c["cpu_allocated_core_seconds"]), float(c["violation_slot_share"]))
        for name, c in doc["contenders"].items()
    }
    front = pareto_front(points)
    qos = doc["qos_class"]
    fig, ax = plt.subplots(figsize=(7, 5))
    colours = {}
    for name, (x, y) in points.items():
        policy = doc["contenders"][name].get("policy")
        # dsched (at any headroom) red, the peers blue, static caps grey.
        colours[name] = {None: "tab:grey", "dsched": "tab:red"}.get(policy, "tab:blue")
        ax.scatter([x], [y], marker="s" if policy is None else "o", color=colours[name], zorder=3)
    # Contenders on the same point (static caps of the same size) share one label.
    labels: dict[tuple[float, float], list[str]] = {}
    for name, (x, y) in points.items():
        labels.setdefault((round(x, 1), round(y, 3)), []).append(name)
    label_points(ax, [(", ".join(n), x, y, colours[n[0]]) for (x, y), n in labels.items()])
    if front:
        fx, fy = zip(*(points[n] for n in front), strict=True)
        ax.step(fx, fy, where="post", color="black", linewidth=0.8)
        ax.scatter(fx, fy, s=140, facecolors="none", edgecolors="black", label="frontier", zorder=4)
    ax.axhline(
        qos["max_violation_ratio"],
        linestyle="--",
        color="tab:orange",
        label=f"{qos['name']}: at most {qos['max_violation_ratio']:g} of slots",
    )
    ax.set_xlabel("CPU allocated, core-seconds")
    ax.set_ylabel(f"share of slots with mean latency > {qos['target_latency_ms']:g} ms")
    ax.set_ylim(-0.03, 1.03)
    # Room on the right for the labels of the costliest points.
    ax.margins(x=0.16)
    ax.set_title(f"{doc['scenario']}: CPU against violations ({qos['name']} class)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


# ---------------------------------------------------------------- command


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--scenario", required=True, help=f"one of {', '.join(SCENARIOS)}")
    p.add_argument(
        "--profile",
        default="default",
        metavar="NAME",
        help="named settings: "
        # argparse expands % in help strings: a profile's "40 % of" is literal.
        + "; ".join(f"{n}: {prof.about}" for n, prof in PROFILES.items()).replace("%", "%%")
        + ". Sets --duration, --slot-seconds, --epoch-seconds, --warmup, --capacity-cores, "
        "--nodes, --theta-cores and --phi; any of these flags given explicitly overrides "
        "the profile's value (default: default)",
    )
    p.add_argument(
        "--duration",
        type=float,
        help="trace seconds each contender runs (profile default 80, seed001 1200)",
    )
    p.add_argument(
        "--contenders",
        default=",".join(CONTENDERS),
        help=f"comma-separated, from {', '.join(CONTENDERS)} (default: all; dsched runs first)",
    )
    p.add_argument("--json", type=Path, required=True, help="write the results here")
    p.add_argument(
        "--plot", type=Path, help="PNG of the per-slot series (and <stem>-allocation.png)"
    )
    p.add_argument(
        "--trace",
        type=Path,
        help="rate per slot as fractions of the peak (JSON list or one per line)",
    )
    p.add_argument(
        "--slot-seconds",
        type=float,
        help="slot length (profile default 2, seed001 10: the paper's)",
    )
    p.add_argument(
        "--epoch-seconds",
        type=float,
        help="the controller's epoch (controller and agent slot; profile default 0.5, seed001 "
        "10: a decision every slot, as the paper). Shorter than the trace's slot by default: "
        "a controller that decides once per rate change is always one change behind",
    )
    p.add_argument(
        "--capacity-cores",
        type=float,
        help="CPU the testbed is given, split evenly between the nodes (default 1.6)",
    )
    p.add_argument(
        "--nodes",
        type=int,
        help=f"agent nodes (1..{MAX_NODES}; profile default 1, seed001 2). With 2 or more the "
        "WordCount runs in worker processes across the nodes with the controller's `liu` "
        "placement on and live moves; static contenders are placed once, first fit",
    )
    p.add_argument(
        "--theta-cores",
        type=float,
        help="dsched's cap granularity theta in cores (profile default 0.005; seed001: the "
        "paper's 0.2 core scaled like static-0.7)",
    )
    p.add_argument(
        "--phi",
        type=int,
        help="slots in dsched's linear trend (profile default: the epochs in 2 s; seed001 5)",
    )
    p.add_argument(
        "--cpu-period-us",
        type=int,
        default=100_000,
        help="CFS period of every cap (default 100000)",
    )
    p.add_argument(
        "--shares",
        type=int,
        default=65536,
        help="cpu.shares of the run's own cgroup (default 65536)",
    )
    p.add_argument(
        "--warmup",
        type=float,
        help="seconds at the trace's first rate before measuring (profile default 6, three "
        "slots; seed001 30, also three slots: dsched's first caps exist when the trace starts)",
    )
    p.add_argument(
        "--cpu",
        choices=CPU_MODES,
        default=None,
        help="where an instance's per-tuple CPU work runs: its own process (default) or "
        "its engine thread (threads of one process capped by CFS stall each other through "
        "the GIL; the multi-node series before revision de23490 ran so)",
    )
    p.add_argument(
        "--chunk-seconds",
        type=float,
        metavar="S",
        help="CPU seconds of one hashed 64 KiB chunk, the unit of every tuple's work "
        "(default: timed once at the start, median of five rounds, and used by every "
        "contender's processes, so that all of them do the same work per tuple)",
    )
    p.add_argument(
        "--controller-option",
        action="append",
        default=[],
        metavar="KEY=JSON",
        help="override a dsched-controller config key for the contenders the controller "
        "drives, dsched and the peers (repeatable; `policy` is each contender's own)",
    )
    p.add_argument(
        "--forecast-quantile",
        type=float,
        metavar="Q",
        help="size dsched's demand at this quantile of next slot's arrivals (0.5 <= Q < 1; "
        "the application's class, bronze, otherwise keeps its default 0.5: the point forecast)",
    )
    p.add_argument(
        "--qos-class",
        choices=QOS_CLASSES,
        default=QosConfig().default_class,
        help="the application's QoS class: every contender is judged against its latency "
        "target and violation bound, and the controlled contenders size for it "
        "(default bronze, the controller's default class)",
    )
    p.add_argument(
        "--dsched-headrooms",
        default="",
        metavar="H,H,...",
        help="also run dsched with these headroom_cores values (contenders dsched-h<H>, "
        "after dsched): points of dsched's CPU / violation trade-off on the Pareto plot",
    )
    p.add_argument("--seed", type=int, default=1, help="trace and data seed")
    p.add_argument(
        "--workdir",
        type=Path,
        help="where the controller's and agents' state and logs are kept, one directory "
        "per contender (<scenario>-<contender>, emptied when that contender starts, so no "
        "run resumes an earlier one's state; default: a temp dir, removed when the run ends)",
    )


def _check(args: argparse.Namespace) -> tuple[list[str], np.ndarray | None]:
    """Every bad input is refused here, before anything starts."""
    resolve_profile(args)
    if args.scenario not in SCENARIOS:
        raise ValueError(
            f"--scenario: unknown scenario {args.scenario!r} (known: {', '.join(SCENARIOS)})"
        )
    names = [c.strip() for c in str(args.contenders).split(",") if c.strip()]
    unknown = [c for c in names if c not in CONTENDERS]
    if not names or unknown:
        raise ValueError(
            f"--contenders: unknown {unknown or names!r} (known: {', '.join(CONTENDERS)})"
        )
    if len(set(names)) != len(names):
        raise ValueError(f"--contenders: listed twice in {names}")
    if "equal" in names and "dsched" not in names:
        raise ValueError(
            "--contenders: 'equal' copies dsched's allocation, so it needs 'dsched' too"
        )
    for key in ("duration", "slot_seconds", "epoch_seconds", "capacity_cores"):
        value = getattr(args, key)
        if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
            raise ValueError(f"--{key.replace('_', '-')} must be a positive number, got {value!r}")
    if not 1 <= args.nodes <= MAX_NODES:
        raise ValueError(f"--nodes must be between 1 and {MAX_NODES}, got {args.nodes}")
    if args.theta_cores is not None and not (
        math.isfinite(args.theta_cores) and 0 < args.theta_cores <= args.capacity_cores
    ):
        raise ValueError(
            f"--theta-cores must be in (0, --capacity-cores {args.capacity_cores:g}], "
            f"got {args.theta_cores!r}"
        )
    if args.phi is not None and args.phi < 2:
        raise ValueError(f"--phi must be >= 2 (a trend needs two slots), got {args.phi}")
    if not (math.isfinite(args.warmup) and args.warmup >= 0):
        raise ValueError(f"--warmup must be a number >= 0, got {args.warmup!r}")
    if args.duration < 2 * args.slot_seconds:
        raise ValueError(
            f"--duration must cover at least 2 slots ({2 * args.slot_seconds:g} s), got {args.duration:g}"
        )
    if args.epoch_seconds > args.slot_seconds:
        raise ValueError(
            f"--epoch-seconds {args.epoch_seconds:g} is longer than a slot ({args.slot_seconds:g} s)"
        )
    if args.capacity_cores > (os.cpu_count() or 1):
        raise ValueError(
            f"--capacity-cores {args.capacity_cores:g} exceeds this machine's {os.cpu_count()} CPUs"
        )
    if not 1000 <= args.cpu_period_us <= 1_000_000:
        raise ValueError(f"--cpu-period-us must be in [1000, 1000000], got {args.cpu_period_us}")
    if not 2 <= args.shares <= 262144:
        raise ValueError(f"--shares must be in [2, 262144], got {args.shares}")
    if args.chunk_seconds is not None:
        check_chunk_seconds(args.chunk_seconds, "--chunk-seconds")
    q = args.forecast_quantile
    if q is not None and not (math.isfinite(q) and 0.5 <= q < 1):
        raise ValueError(f"--forecast-quantile must be in [0.5, 1), got {q!r}")
    for option in args.controller_option:
        key, sep, value = option.partition("=")
        try:
            if not sep or not key.strip():
                raise ValueError("expected KEY=JSON")
            json.loads(value)
        except ValueError as exc:
            raise ValueError(f"--controller-option {option!r}: {exc}") from None
    levels = parse_trace_file(args.trace) if args.trace is not None else None
    if not (CGROUP_V1_CPU / "cpu.cfs_quota_us").exists() or not os.access(CGROUP_V1_CPU, os.W_OK):
        raise ValueError(
            f"the live benchmark needs a writable cgroup v1 cpu controller at {CGROUP_V1_CPU}"
        )
    order = sorted(names, key=CONTENDERS.index)  # dsched first: equal copies it
    variants = headroom_contenders(args.dsched_headrooms, args.capacity_cores)
    at = order.index("dsched") + 1 if "dsched" in order else 0
    return order[:at] + variants + order[at:], levels


def build_scenario(args: argparse.Namespace, levels: np.ndarray | None) -> Scenario:
    spec, fanout, group_keys = scenario_topology(args.scenario)
    slots = max(2, round(args.duration / args.slot_seconds))
    if levels is None:
        levels = scenario_levels(args.scenario, slots, args.seed)
    executors = sum(o.parallelism for o in spec.operators)
    return Scenario(
        args.scenario,
        spec,
        fanout,
        group_keys,
        levels,
        args.slot_seconds,
        Scale(
            args.capacity_cores,
            executors,
            share_07(PROFILES[args.profile], executors, args.nodes),
        ),
    )


def theta_of(args: argparse.Namespace, scale: Scale) -> float:
    """``--theta-cores``, else the profile's theta in paper cores scaled like static-0.7."""
    if args.theta_cores is not None:
        return float(args.theta_cores)
    return PROFILES[args.profile].theta_paper_cores * scale.factor


def profile_record(args: argparse.Namespace, scn: Scenario, theta: float) -> dict[str, Any]:
    """The profile and every setting it resolved to (after the flags given)."""
    prof = PROFILES[args.profile]
    phi = args.phi if args.phi is not None else max(2, round(TREND_SECONDS / args.epoch_seconds))
    return {
        "name": prof.name,
        "about": prof.about,
        "overridden_by_flags": list(getattr(args, "profile_flags", [])),
        "settings": {
            "slot_seconds": args.slot_seconds,
            "epoch_seconds": args.epoch_seconds,
            "decisions_per_slot": round(args.slot_seconds / args.epoch_seconds, 3),
            "duration_seconds": args.duration,
            "warmup_seconds": args.warmup,
            "capacity_cores": args.capacity_cores,
            "nodes": args.nodes,
            "node_cores": round(args.capacity_cores / args.nodes, 5),
            # The node size in the paper's cores (6 for the paper's nodes).
            "node_paper_cores": round(args.capacity_cores / args.nodes / scn.scale.factor, 3),
            "theta_cores": round(theta, 6),
            **prof.rules,
            "theta_paper_cores": round(theta / scn.scale.factor, 4),
            "phi": phi,
            "trend_seconds": round(phi * args.epoch_seconds, 3),
            "static_0.7_share_of_capacity": round(scn.scale.share_07, 4),
            "trace_slots": len(scn.levels),
        },
    }


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    console = Console()
    try:
        order, levels = _check(args)
        scn = build_scenario(args, levels)
    except ValueError as exc:
        print(f"dsched bench live: error: {exc}", file=sys.stderr)
        return 2
    duration = len(scn.levels) * args.slot_seconds if args.trace is not None else args.duration
    timeout = PAPER_TIMEOUT_SECONDS * args.slot_seconds / PAPER_SLOT_SECONDS
    # Without --workdir, state and logs live in a temp dir removed at the end.
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="dsched-bench-live-"))
    interrupted = threading.Event()
    stop = signals.StopOnSignals(interrupted).install()
    reservation = Reservation(CGROUP_V1_CPU, f"dsched-live-{os.getpid()}", args.shares)
    settings = RunSettings(
        duration,
        args.warmup,
        args.slot_seconds,
        args.epoch_seconds,
        timeout,
        args.capacity_cores,
        args.cpu_period_us,
        args.seed,
        cpu_mode(args),
        controller_options(args),
        workdir,
        reservation,
        interrupted,
        default_qos_classes()[args.qos_class],
        nodes=args.nodes,
        theta_cores=theta_of(args, scn.scale),
        phi=args.phi,
        rules=PROFILES[args.profile].rules,
        chunk_seconds=args.chunk_seconds or calibrate_hash_seconds(samples=100, rounds=5),
    )
    # The in-process engine (one node) burns with this process's figure.
    set_hash_seconds(settings.chunk_seconds)
    console.print(
        f"bench live ({args.profile} profile): {scn.name}, {duration:g} s per contender, slot "
        f"{args.slot_seconds:g} s, epoch {args.epoch_seconds:g} s, theta "
        f"{settings.theta_cores:.4g} core, timeout {timeout:g} s, capacity "
        f"{args.capacity_cores:g} cores on {args.nodes} node(s) over {scn.scale.executors} executors "
        f"(static-0.7 = {scn.scale.core_07:.4f} core each, scale {scn.scale.factor:.4f}), peak "
        f"{scn.peak_rate:.0f} roots/s (~{scn.peak_cores():.2f} cores); contenders {', '.join(order)}"
    )
    results: dict[str, dict[str, Any]] = {}
    try:
        reservation.enter()
        for name in order:
            equal = (
                results["dsched"]["allocated_cores_mean_by_operator"] if name == "equal" else None
            )
            console.print(f"  running {name} ...")
            results[name] = run_contender(name, scn, settings, equal)
            c = results[name]
            console.print(
                f"  {name}: latency mean {c['latency_ms_mean']} ms p99 {c['latency_ms_p99']} ms, "
                f"acked {c['throughput_tuples']}, failed {c['failed']}, lost {c['lost']}, "
                f"CPU allocated {c['cpu_allocated_core_seconds']:.1f} used {c['cpu_used_core_seconds']:.1f} core-s, "
                f"slots over target {c['violation_slot_share']:.2f}, workers {c['workers_used_mean']} "
                f"nodes {c['nodes_used_mean']} moves {c['moves']}"
            )
    except signals.Interrupted:
        console.print("[yellow]interrupted: every worker stopped, cgroups removed[/]")
        return signals.INTERRUPTED
    except RuntimeError as exc:
        print(f"dsched bench live: error: {exc}", file=sys.stderr)
        return 1
    finally:
        reservation.leave()
        stop.restore()
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    figures = {
        "scenario": scn.name,
        "slot_seconds": args.slot_seconds,
        "epoch_seconds": args.epoch_seconds,
        "duration_seconds": duration,
        "warmup_seconds": args.warmup,
        "timeout_seconds": timeout,
        "cpu_period_us": args.cpu_period_us,
        "chunk_seconds": settings.chunk_seconds,
        # Several nodes run the distributed testbed, whose instances are threads of
        # its worker processes: "worker-thread" where they burn their CPU themselves.
        "cpu_work_in": (
            "worker-thread" if args.nodes > 1 and settings.cpu == "thread" else settings.cpu
        ),
        "profile": profile_record(args, scn, settings.theta_cores),
        "nodes": {n: round(settings.node_cores, 5) for n in node_names(args.nodes)},
        "controller_config": {
            **settings.dsched_config(scn.scale),
            **settings.controller_options,
        },
        "sizing": sizing(settings.controller_options),
        "qos_class": dataclasses.asdict(settings.qos),
        "scale": {
            "capacity_cores": args.capacity_cores,
            "executors": scn.scale.executors,
            "static_0.7_core_per_executor": round(scn.scale.core_07, 5),
            "static_0.3_core_per_executor": round(scn.scale.core_07 * 3 / 7, 5),
            "factor": round(scn.scale.factor, 5),
            "static_0.7_share_of_capacity": round(scn.scale.share_07, 4),
            "peak_share_of_static_0.7": PEAK_SHARE,
            "time_compression": PAPER_SLOT_SECONDS / args.slot_seconds,
        },
        "trace": {
            "source": str(args.trace) if args.trace else "generated",
            "peak_rate_roots_per_second": round(scn.peak_rate, 3),
            "peak_cores": round(scn.peak_cores(), 4),
            "rates": [round(float(r), 3) for r in scn.rates],
        },
        "contenders": results,
        "ratios": ratios(results),
        "done_means": done_means(results),
    }
    if args.profile == "seed001":
        figures["paper_comparison"] = paper_comparison(scn.name, results)
    doc = write_result(args.json, "live", figures)
    console.print(f"wrote {args.json}")
    if args.plot:
        for p in plot(doc, args.plot):
            console.print(f"wrote {p}")
    _print_table(console, doc)
    if "paper_comparison" in doc:
        print_paper_comparison(console, doc["paper_comparison"])
    return 0


# Liu et al., "An Adaptive Online Scheme for Scheduling and Resource Enforcement in
# Storm", section V: Table II (WordCount, regular fluctuations) and Table III (random
# fluctuations), averages over the run; the mean workers and worker nodes of their
# scheduler are given in the text of sections V.B and V.C, and R-Storm(70)'s
# 12 x 0.7 = 8.4 cores "means two worker nodes are always demanded" (V.B). The
# paper gives no worker count for R-Storm, and its HTTP experiment (Table IV) has
# no R-Storm(70) row.
PAPER_TABLES: dict[str, dict[str, Any]] = {
    "wordcount-regular": {
        "table": "Table II (WordCount, regular)",
        "dsched": {
            "latency_ms_mean": 7.6,
            "throughput_tuples": 140995,
            "failed": 699,
            "workers_used_mean": 2.6,
            "nodes_used_mean": 1.6,
        },
        "static-0.7": {
            "latency_ms_mean": 23.9,
            "throughput_tuples": 142710,
            "failed": 0,
            "workers_used_mean": None,
            "nodes_used_mean": 2.0,
        },
    },
    "wordcount-random": {
        "table": "Table III (WordCount, random)",
        "dsched": {
            "latency_ms_mean": 66.5,
            "throughput_tuples": 97474,
            "failed": 1225,
            "workers_used_mean": 2.3,
            "nodes_used_mean": 1.3,
        },
        "static-0.7": {
            "latency_ms_mean": 4.8,
            "throughput_tuples": 107120,
            "failed": 0,
            "workers_used_mean": None,
            "nodes_used_mean": 2.0,
        },
    },
    "http": {
        "table": "Table IV (HTTP monitor; no R-Storm(70) row)",
        "dsched": {
            "latency_ms_mean": 499.0,
            "throughput_tuples": 545530,
            "failed": 1881,
            "workers_used_mean": None,
            "nodes_used_mean": None,
        },
        "static-0.7": None,
    },
}
PAPER_METRICS = (
    "latency_ms_mean",
    "throughput_tuples",
    "failed",
    "workers_used_mean",
    "nodes_used_mean",
)


def paper_comparison(scenario: str, contenders: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The paper's table for ``scenario`` beside this run: their scheduler against
    our ``dsched``, R-Storm(70) against ``static-0.7`` (its analogue here), per metric,
    and the latency ratio scheduler / R-Storm(70) on both sides. Counts of tuples
    depend on each run's rates and length, so failed tuples are also given as a
    share of the tuples completed."""
    paper = PAPER_TABLES[scenario]
    rows: dict[str, dict[str, Any]] = {}
    for metric in PAPER_METRICS:
        row: dict[str, Any] = {}
        for side in ("dsched", "static-0.7"):
            label = "r_storm_70" if side == "static-0.7" else "scheduler"
            row[f"paper_{label}"] = (paper.get(side) or {}).get(metric)
            row[f"ours_{side}"] = (contenders.get(side) or {}).get(metric)
        rows[metric] = row

    def failed_share(c: Mapping[str, Any] | None, done_key: str) -> float | None:
        if not c or c.get("failed") is None or not c.get(done_key):
            return None
        return round(c["failed"] / (c["failed"] + c[done_key]), 5)

    rows["failed_share"] = {
        "paper_scheduler": failed_share(paper.get("dsched"), "throughput_tuples"),
        "ours_dsched": failed_share(contenders.get("dsched"), "completed"),
        "paper_r_storm_70": failed_share(paper.get("static-0.7"), "throughput_tuples"),
        "ours_static-0.7": failed_share(contenders.get("static-0.7"), "completed"),
    }
    lat = rows["latency_ms_mean"]
    return {
        "source": f'Liu et al., "An Adaptive Online Scheme for Scheduling and Resource '
        f'Enforcement in Storm", section V, {paper["table"]}',
        "r_storm_70_analogue": "static-0.7",
        "metrics": rows,
        "latency_over_r_storm_70": {
            "paper": _ratio(lat["paper_scheduler"], lat["paper_r_storm_70"]),
            "ours": _ratio(lat["ours_dsched"], lat["ours_static-0.7"]),
        },
    }


def print_paper_comparison(console, comparison: Mapping[str, Any]) -> None:
    """The paper's numbers beside this run's, one row per metric."""
    from rich.table import Table

    table = Table(title=f"paper vs this run: {comparison['source']}")
    cols = ("paper_scheduler", "ours_dsched", "paper_r_storm_70", "ours_static-0.7")
    table.add_column("metric")
    for c in cols:
        table.add_column(c.replace("_", " "), justify="right")
    for metric, row in comparison["metrics"].items():
        table.add_row(metric, *("-" if row.get(c) is None else f"{row[c]:g}" for c in cols))
    ratio = comparison["latency_over_r_storm_70"]
    table.add_row(
        "latency / R-Storm(70)",
        "-" if ratio["paper"] is None else f"{ratio['paper']:g}",
        "-" if ratio["ours"] is None else f"{ratio['ours']:g}",
        "",
        "",
    )
    console.print(table)


def _print_table(console, doc: dict[str, Any]) -> None:
    cols = (
        "latency_ms_mean",
        "latency_ms_p99",
        "throughput_tuples",
        "failed",
        "lost",
        "cpu_allocated_core_seconds",
        "cpu_used_core_seconds",
        "cap_changes_per_instance_hour",
        "violation_slot_share",
        "meets_target",
        "workers_used_mean",
        "nodes_used_mean",
        "moves",
    )
    print_contenders(console, f"live {doc['scenario']}", doc, cols)
    console.print(f"done means: {doc['done_means']}")
