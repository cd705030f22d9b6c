"""The controller's configuration (`/etc/dsched/controller.toml`).

Every key has a production default; `validate()` refuses impossible values at
startup with the key's name, so a typo never turns into a silent default.
"""

from __future__ import annotations

import dataclasses
import math
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from controller.qos import QosConfig
from controller.stages.flow import FLOW_BOUNDS
from controller.stages.hysteresis import CAP_ROUNDINGS
from dsched.config import ConfigError, is_loopback, parse_hostport, require
from dsched.names import InvalidName, check_name
from dsched.tls import TlsConfig, pem_certificates
from predict.cost import STRATEGIES as COST_STRATEGIES
from predict.queueing import DEFAULT_WAIT_MODEL, WAIT_MODELS
from spark_stream.config import HistoryConfig

MODES = ("dry-run", "enforce")
EPOCH_TRIGGERS = ("timer", "reports")
# What a node's CPU beyond its instances does to its capacity (Config.other_cpu).
OTHER_CPU_USES = ("ignore", "subtract")
# sun_path of a Unix socket address holds 108 bytes, the last a NUL.
MAX_UNIX_PATH = 107


@dataclass
class AdminTlsConfig(TlsConfig):
    """``[admin_tls]``: the admin door's TLS (PEM files)."""

    section: ClassVar[str] = "admin_tls"


def unix_socket_path(address: str) -> Path | None:
    """The socket path of a ``unix:PATH`` (or ``unix:///PATH``) address, else None."""
    if not address.startswith("unix:"):
        return None
    path = address.removeprefix("unix:")
    if path.startswith("//"):
        path = "/" + path.lstrip("/")
    return Path(path)


def socket_group_id(key: str, group: str) -> int | None:
    """The gid of ``group`` (a name or a number); None for empty. ConfigError naming ``key``."""
    import grp

    if not group:
        return None
    if group.isdigit():
        return int(group)
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        raise ConfigError(key, f"no such group {group!r}") from None


# How the DP values CPU given to an application (docs/controller.md).
DP_VALUES = ("covered", "latency")
# What meeting a latency target means (docs/controller.md, "Demand").
LATENCY_CRITERIA = ("quantile", "mean")
# How an operator's CPU follows its arrivals (docs/prediction.md, "Marginal cost").
COST_MODELS = ("proportional", "marginal")
# Longest window of per-instance demands the controller keeps (seconds).
MAX_DEMAND_WINDOW_SECONDS = 86400.0


@dataclass
class LiuOptions:
    """``[placement_options.liu]``: Liu et al.'s scheme (Alg. 1–3)."""

    # Empty the least-loaded node when its workers fit elsewhere.
    scale_in: bool = True
    # Room kept for a stateful worker's growth, as a multiple of its recent rise.
    stateful_growth: float = 1.0


@dataclass
class EvenOptions:
    """``[placement_options.even]``: Storm's round robin."""

    # Workers per application; 0: one per node.
    workers_per_app: int = 0


@dataclass
class RStormOptions:
    """``[placement_options.rstorm]``: R-Storm's distance-based best fit."""

    # Weight of CPU in the distance to a node.
    w_cpu: float = 1.0
    # Weight of network distance (traffic to already placed neighbours).
    w_net: float = 1.0
    # Weight of memory in the distance (only where nodes and instances state memory;
    # a node without the memory an instance states is never chosen).
    w_mem: float = 1.0


@dataclass
class SamOptions:
    """``[placement_options.sam]``: slot-aware mapping of full thread bundles."""

    # Cores of one slot (a bundle fills one).
    slot_cores: float = 1.0


@dataclass
class AnielloOfflineOptions:
    """``[placement_options.aniello-offline]``: topology-order scheduler."""

    # Share of nodes left free (alpha in the paper, 0..1).
    alpha: float = 0.0
    # Balance between filling and spreading workers (beta in the paper, 0..1).
    beta: float = 0.5
    # Workers per application; 0: one per node.
    workers_per_app: int = 0


@dataclass
class AnielloOnlineOptions:
    """``[placement_options.aniello-online]``: traffic-based scheduler."""

    # Reschedule only if inter-node traffic drops by more than this many percent.
    threshold_percent: float = 10.0
    # Workers per application (W in min(E, W)); 0: one per node slot.
    workers_per_app: int = 0
    # X_i: seconds a node must stay overloaded before it forces a reschedule.
    window_seconds: float = 0.0
    # Worker slots per node; 0: the strategy's default.
    slots_per_node: int = 0


@dataclass
class MipsOptions:
    """``[placement_options.mips]``: Monte Carlo tree search with UCT, two stages
    (instances -> containers -> nodes)."""

    # Simulations per decision (each placement of one instance or container).
    samples_per_decision: int = 64
    # Random seed (plans are reproducible for one seed).
    seed: int = 0
    # UCT exploration constant.
    exploration: float = 0.3
    # Probability of a random expansion instead of the refined one (0: the paper's).
    epsilon: float = 0.0
    # Weight of cross-container traffic against containers used, in [0, 1].
    alpha: float = 0.5
    # Cores of one container; 0: the largest instance demand.
    container_cores: float = 0.0
    # Containers per application request; 0: as many as its demand needs.
    containers_per_app: int = 0
    # Network between nodes for stage 2's hop costs: flat, fat-tree or jellyfish.
    topology: str = "flat"
    # Seed of a jellyfish topology's random links.
    topology_seed: int = 0
    # The paper's best-child prior (bad children start with visits and cost).
    prior: bool = True
    # The paper's expansion and simulation refinements.
    expansion: bool = True
    # Cost weight of each node used in stage 2.
    node_weight: float = 0.0


@dataclass
class PlacementOptions:
    """``[placement_options.<strategy>]``: typed options of each placement strategy."""

    liu: LiuOptions = field(default_factory=LiuOptions)
    even: EvenOptions = field(default_factory=EvenOptions)
    rstorm: RStormOptions = field(default_factory=RStormOptions)
    sam: SamOptions = field(default_factory=SamOptions)
    aniello_offline: AnielloOfflineOptions = field(default_factory=AnielloOfflineOptions)
    aniello_online: AnielloOnlineOptions = field(default_factory=AnielloOnlineOptions)
    mips: MipsOptions = field(default_factory=MipsOptions)

    def for_strategy(self, name: str) -> dict[str, object]:
        """The options of strategy ``name`` as its factory's keyword arguments."""
        table = getattr(self, name.replace("-", "_"), None)
        if table is None:
            return {}
        out = dataclasses.asdict(table)
        # 0 stands for "the strategy's own default" in these keys.
        for key in ("workers_per_app", "container_cores", "containers_per_app", "slots_per_node"):
            if out.get(key) == 0:
                out[key] = None
        return out


@dataclass
class EngineConfig:
    """``[[engine]]``: an engine that is not instrumented, whose counters the controller
    reads from the engine's own API (once per job per poll, not once per node)."""

    # Name in status, metrics and logs; empty: the kind. Names must be unique.
    name: str = ""
    # Engine kind: `flink` (counters from the JobManager's REST API); required.
    kind: str = ""
    # The engine's REST endpoint, http(s)://host:port (a Flink JobManager's rest.port).
    rest_url: str = ""
    # Seconds between reads, 0: slot_seconds (keep Flink's metrics.fetcher.update-interval <= it).
    poll_seconds: float = 0.0
    # Timeout of one REST call, seconds.
    rest_timeout_seconds: float = 2.0
    # User counter of end-to-end latency summed, ms (matched as `<name>` or `<scope>.<name>`).
    latency_sum_metric: str = "dschedLatencySumMs"
    # User counter of the number of latencies summed (matched the same way).
    latency_count_metric: str = "dschedLatencyCount"
    # Operators (engine or dsched names) that keep state, whatever their kind says.
    stateful_operators: list[str] = field(default_factory=list)
    # Operators (engine or dsched names) that keep no state, whatever their kind says.
    stateless_operators: list[str] = field(default_factory=list)

    @property
    def engine_name(self) -> str:
        return self.name or self.kind

    def validate(self) -> None:
        from controller.edges.engines import COUNTER_SOURCES

        require(bool(self.kind), "kind", f"required (known: {', '.join(COUNTER_SOURCES)})")
        COUNTER_SOURCES.check(self.kind, "kind")
        if self.name:
            try:
                check_name("name", self.name)  # a metric label and a thread name
            except InvalidName as exc:
                raise ConfigError("name", str(exc)) from None
        check_rest_url("rest_url", self.rest_url)
        require(
            math.isfinite(self.poll_seconds) and self.poll_seconds >= 0,
            "poll_seconds",
            "must be a number >= 0 (0: the slot)",
        )
        require(
            math.isfinite(self.rest_timeout_seconds) and self.rest_timeout_seconds > 0,
            "rest_timeout_seconds",
            "must be a number > 0",
        )
        for key in ("latency_sum_metric", "latency_count_metric"):
            require(bool(getattr(self, key).strip()), key, "must not be empty")
        both = sorted(set(self.stateful_operators) & set(self.stateless_operators))
        require(not both, "stateless_operators", f"also listed as stateful: {', '.join(both)}")


@dataclass
class NodePoolCommandConfig:
    """``[node_pool.command]``: the commands that add or remove a node of a real
    cluster (docs/node-pool.md has their contract)."""

    # Program and arguments run to add a node (no shell), e.g. ["/usr/local/bin/add-node"].
    add: list[str] = field(default_factory=list)
    # Program and arguments run to remove the node named in $DSCHED_NODE.
    remove: list[str] = field(default_factory=list)
    # A command still running after this many seconds is killed (its whole process
    # group) and counts as failed.
    timeout_seconds: float = 120.0


@dataclass
class NodePoolTestbedConfig:
    """``[node_pool.testbed]``: extra agent nodes of the live testbed on this machine,
    started as `dsched demo --nodes 2` starts its second one."""

    # CPU capacity each added agent node reports (as `dsched demo --node-cores`).
    node_cores: float = 0.8
    # Added nodes are named <node_prefix>1, <node_prefix>2, ...
    node_prefix: str = "pool-n"
    # Each added node's agent caps its own cgroup root, <cgroup_root>-<node>.
    cgroup_root: str = "dsched-pool"
    # Start the added agents in dry-run (they measure and report but never write caps).
    agent_dry_run: bool = False


@dataclass
class NodePoolConfig:
    """``[node_pool]``: who carries out the DP's one-node-more or one-node-fewer
    recommendation. A node-epoch costs the top-level `node_cost` (value per node per
    epoch, the DP's unit); a change is recommended only when it gains more than that."""

    # `log` (record what would be done, change nothing), `command` (run
    # [node_pool.command]'s add or remove) or `testbed` (start or stop an agent node of
    # the live testbed on this machine). Dry-run always logs only.
    strategy: str = "log"
    # After a node was added or removed, no other change for this many seconds: the
    # new node has to start and take load before the next decision counts.
    cooldown_seconds: float = 300.0
    # After a failed or timed-out change, wait this long before trying again; the
    # wait doubles with every failure in a row.
    retry_backoff_seconds: float = 60.0
    # The longest wait after failures in a row.
    max_retry_backoff_seconds: float = 3600.0
    # Never remove a node below this many connected nodes.
    min_nodes: int = 1
    # Never add a node beyond this many connected nodes; 0: no upper limit.
    max_nodes: int = 0
    # Epochs in a row that must recommend one node fewer before a node is removed
    # (adding is at once, as with instance counts). 1: remove at the first.
    remove_patience_epochs: int = 6
    command: NodePoolCommandConfig = field(default_factory=NodePoolCommandConfig)
    testbed: NodePoolTestbedConfig = field(default_factory=NodePoolTestbedConfig)

    def validate(self) -> None:
        from controller.edges.nodepool import NODE_POOLS

        NODE_POOLS.check(self.strategy, "strategy")
        for key in ("cooldown_seconds", "retry_backoff_seconds"):
            value = getattr(self, key)
            require(math.isfinite(value) and value >= 0, key, "must be a number >= 0")
        require(
            math.isfinite(self.max_retry_backoff_seconds)
            and self.max_retry_backoff_seconds >= self.retry_backoff_seconds,
            "max_retry_backoff_seconds",
            f"must be a number >= retry_backoff_seconds ({self.retry_backoff_seconds:g})",
        )
        require(self.min_nodes >= 1, "min_nodes", "must be >= 1")
        require(
            isinstance(self.remove_patience_epochs, int)
            and not isinstance(self.remove_patience_epochs, bool)
            and self.remove_patience_epochs >= 1,
            "remove_patience_epochs",
            "must be an integer >= 1",
        )
        require(
            self.max_nodes == 0 or self.max_nodes >= self.min_nodes,
            "max_nodes",
            f"must be 0 (no limit) or >= min_nodes ({self.min_nodes})",
        )
        cmd = self.command
        require(
            math.isfinite(cmd.timeout_seconds) and cmd.timeout_seconds > 0,
            "command.timeout_seconds",
            "must be a number > 0",
        )
        if self.strategy == "command":
            for key in ("add", "remove"):
                argv = getattr(cmd, key)
                require(
                    bool(argv) and bool(argv[0].strip()),
                    f"command.{key}",
                    'the command strategy needs a program, e.g. ["/usr/local/bin/add-node"]',
                )
        tb = self.testbed
        require(
            math.isfinite(tb.node_cores) and tb.node_cores > 0,
            "testbed.node_cores",
            "must be a number > 0",
        )
        for key in ("node_prefix", "cgroup_root"):
            try:
                check_name(key, getattr(tb, key))
            except InvalidName as exc:
                raise ConfigError(f"testbed.{key}", str(exc)) from None


@dataclass
class ParallelismLimits:
    """``[parallelism.operators."APP/OPERATOR"]``: one operator's own instance limits."""

    # Fewest instances of this operator; 0: `[parallelism] min_instances`.
    min_instances: int = 0
    # Most instances of this operator; 0: `[parallelism] max_instances`.
    max_instances: int = 0


#: Instance counts beyond this are refused as a typo (an operator of 10,000 threads).
MAX_PARALLELISM = 1024
#: Slots a parallelism raise may look ahead along the arrivals' trend at most: a line
#: through a few slots says little about the load an hour later.
MAX_LOOKAHEAD_SLOTS = 60


@dataclass
class ParallelismConfig:
    """``[parallelism]``: instance counts per operator, decided each epoch
    (docs/parallelism.md): from the operator's performance model where one is
    loaded (Model-Based Allocation), else one instance more or fewer."""

    # Decide instance counts each epoch (and record them); false: counts are left alone.
    enabled: bool = True
    # Who carries the decisions out: `recommend` (decide and record only) or
    # `testbed` (the live testbed's rescale endpoint at `url`). The simulator
    # brings its own (testbed/sim/parallelism.py).
    actuator: str = "recommend"
    # The live testbed's endpoint (http(s)://host:port, the move endpoint's
    # address); required with `actuator = "testbed"`.
    url: str = ""
    # How long one request to the testbed may take before its changes are
    # recorded as recommend-only.
    timeout_seconds: float = 30.0
    # After a request that timed out or found no testbed, wait this long before
    # sending again (an epoch must not wait on a hung testbed every time).
    retry_after_seconds: float = 60.0
    # Fewest instances of any operator.
    min_instances: int = 1
    # Most instances of any operator.
    max_instances: int = 8
    # Epochs in a row an operator must be able to do with fewer instances before
    # it loses one (raising is at once).
    lower_patience_epochs: int = 6
    # One instance fewer only when each of the rest would need at most this share
    # of `max_instance_cores`, for the predicted load and for the latency target,
    # in (0, 1].
    lower_utilization: float = 0.6
    # When one operator of an application gains an instance, its other operators
    # (rule `step`) whose instances each carry more than `lower_utilization` of
    # `max_instance_cores` gain one in the same epoch: the application pauses once,
    # not once per operator (on Flink any rescale restarts the whole job).
    raise_together: bool = True
    # Raise where the application's offered load (its sources' arrivals, along
    # their least-squares line over the last phi slots, when the rise is beyond
    # chance for Poisson counts) takes an operator to the raise point (load or
    # latency target) within this many slots after the next one; 0: only on the
    # next slot's forecast. A rescale pauses the operator: on a rising load, the
    # earlier, the fewer tuples wait through it.
    raise_lookahead_slots: int = 2
    # Per-operator limits, keyed "APP/OPERATOR".
    operators: dict[str, ParallelismLimits] = field(default_factory=dict)

    def limits(self, app: str, operator: str) -> tuple[int, int]:
        """(min, max) instances of one operator, its own limits over the defaults."""
        own = self.operators.get(f"{app}/{operator}")
        lo = own.min_instances if own is not None and own.min_instances else self.min_instances
        hi = own.max_instances if own is not None and own.max_instances else self.max_instances
        return lo, hi

    def validate(self) -> None:
        from controller.edges.parallelism import PARALLELISM_ACTUATORS

        PARALLELISM_ACTUATORS.check(self.actuator, "actuator")
        if self.actuator == "testbed" or self.url:
            check_rest_url("url", self.url)
        require(
            math.isfinite(self.timeout_seconds) and self.timeout_seconds > 0,
            "timeout_seconds",
            "must be a number > 0",
        )
        require(
            math.isfinite(self.retry_after_seconds) and self.retry_after_seconds >= 0,
            "retry_after_seconds",
            "must be a number >= 0",
        )
        require(
            isinstance(self.min_instances, int) and 1 <= self.min_instances <= MAX_PARALLELISM,
            "min_instances",
            f"must be an integer in [1, {MAX_PARALLELISM}]",
        )
        require(
            isinstance(self.max_instances, int)
            and self.min_instances <= self.max_instances <= MAX_PARALLELISM,
            "max_instances",
            f"must be an integer in [min_instances ({self.min_instances}), {MAX_PARALLELISM}]",
        )
        require(
            isinstance(self.lower_patience_epochs, int) and self.lower_patience_epochs >= 0,
            "lower_patience_epochs",
            "must be an integer >= 0",
        )
        require(
            math.isfinite(self.lower_utilization) and 0 < self.lower_utilization <= 1,
            "lower_utilization",
            "must be a number in (0, 1]",
        )
        require(
            isinstance(self.raise_lookahead_slots, int)
            and not isinstance(self.raise_lookahead_slots, bool)
            and 0 <= self.raise_lookahead_slots <= MAX_LOOKAHEAD_SLOTS,
            "raise_lookahead_slots",
            f"must be an integer in [0, {MAX_LOOKAHEAD_SLOTS}]",
        )
        for name, own in self.operators.items():
            where = f'operators."{name}"'
            app, sep, op = name.partition("/")
            require(bool(sep and app and op), where, 'keys are "APP/OPERATOR"')
            for key in ("min_instances", "max_instances"):
                value = getattr(own, key)
                require(
                    isinstance(value, int) and 0 <= value <= MAX_PARALLELISM,
                    f"{where}.{key}",
                    f"must be an integer in [0, {MAX_PARALLELISM}] (0: the default)",
                )
            lo, hi = self.limits(app, op)
            require(
                lo <= hi,
                f"{where}.max_instances",
                f"the operator's limits are min {lo} > max {hi}",
            )


def check_rest_url(key: str, url: str) -> None:
    """``url`` must be http(s)://host:port, nothing more (ConfigError naming ``key``)."""
    require(bool(url), key, "required: http(s)://host:port")
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise ConfigError(key, f"expected http(s)://host:port, got {url!r}: {exc}") from None
    require(
        parts.scheme in ("http", "https")
        and bool(parts.hostname)
        and port is not None
        and parts.path in ("", "/")
        and not parts.query
        and not parts.fragment
        and parts.username is None,
        key,
        f"expected http(s)://host:port, got {url!r}",
    )


@dataclass
class ControllerConfig:
    # gRPC address of the agents' door (HOST:PORT): the agents' stream and health
    # only. Off loopback it needs mutual TLS ([tls] cert, key and ca).
    listen: str = "127.0.0.1:7700"
    # The admin door (dschedctl: status, mode, QoS, plan, explain), never the agents'
    # port: `unix:PATH` (whoever may open the socket file may act) or HOST:PORT
    # (mutual TLS with [admin_tls] unless on loopback).
    admin_listen: str = "unix:/run/dsched/admin.sock"
    # File mode of the admin Unix socket (octal): who may connect to it.
    admin_socket_mode: str = "0660"
    # Group of the admin Unix socket (name or number); empty: the controller's own.
    admin_socket_group: str = ""
    # Agent streams served at once; one more is refused at once (RESOURCE_EXHAUSTED).
    max_agent_streams: int = 2000
    # Most cores an agent may report; a Hello claiming more is refused (per-node
    # `node_capacity_cores` limits only lower what dsched hands out).
    max_node_capacity_cores: float = 1024.0
    # Prometheus /metrics address (HOST:PORT).
    metrics: str = "127.0.0.1:9708"
    # SQLite state, history spool and tables live here.
    state_dir: Path = Path("/var/lib/dsched")
    # The mode on the very first start; afterwards the persisted mode wins, so a
    # restart never flips a cluster from dry-run to enforce or back.
    mode: str = "dry-run"
    # Epoch length: one slot of reports, one decision.
    slot_seconds: float = 10.0
    # When an epoch starts: `timer` (every slot) or `reports` (once every connected
    # agent has reported since the last epoch began, no sooner than half a slot
    # after it and at the latest one slot after it).
    epoch_trigger: str = "timer"
    # Slots of history the fast loop predicts from (phi).
    phi: int = 5
    # How the CPU and tuples of those phi slots become kappa, the CPU per tuple:
    # `ratio_of_sums` (their total CPU over their total tuples) or `mean_ratio`
    # (the mean of each slot's ratio, the paper's wording). A slot's CPU and its
    # tuple count are not read at the same instant, and the mean of ratios turns
    # that noise in the denominator into a cost biased upwards: a slot that counts
    # few tuples but a burst's CPU weighs as much as a full one, and every cap
    # carries the bias (docs/prediction.md, "Cost per tuple", has the measurement).
    # The ratio of sums weighs each slot by its tuples and is not biased so.
    kappa_estimator: str = "ratio_of_sums"
    # How an operator's CPU follows its arrivals: `proportional` (kappa times the
    # rate, the paper's) or `marginal` (the window's CPU plus the CPU per extra
    # tuple, a slope fitted over the last variability_slots slots, times the
    # change in rate: an affine cost whose fixed part a step up does not pay
    # again; docs/prediction.md, "Marginal cost"). Where the slots cannot tell
    # the slope (a steady load), the proportional cost stays.
    cost_model: str = "proportional"
    # `on`: no operator is granted more than its parents can send it: what their
    # grants let them process and what reaches them plus their queues, times
    # their selectivity. The CPU taken back is recorded as a cut with its reason
    # and given to nobody. `off`: grants are the division's (docs/controller.md,
    # "Flow bound").
    flow_bound: str = "on"
    # `on`: a class sized at forecast_quantile 0.5 gets the median of next slot's
    # arrivals, the point forecast plus the median of its own last one-step
    # errors (once it has 10). The point forecast is the max of the predictors,
    # which over-forecasts by design, so a class sized at it is given CPU for more
    # arrivals than come, the more so downstream in the DAG. `off` (default): the
    # point forecast itself. Off by default: where a cluster of several classes is
    # short of CPU, sizing by the median has cost gold part of its protection, for
    # reasons not yet established (docs/controller.md, "Forecast quantile", has
    # the measurements).
    forecast_median: str = "off"
    # Cap granularity in cores (theta of the hysteresis).
    theta_cores: float = 0.1
    # How a grant becomes a multiple of theta. `margin` (the paper's): up, with
    # theta/2 to spare, ceil((r + theta/2) / theta) * theta, theta above the
    # grant on average. `nearest`: the nearest multiple, at least theta; for a
    # theta fine next to the instances' demands, whose latency margin is already
    # in the demand (docs/controller.md, "Rounding").
    cap_rounding: str = "margin"
    # Dead band around each cap, as a share of it: a raise must take the cap up
    # by more than this share, a fall must have accumulated it (and theta/2).
    # On a node that stays full, the caps in force are kept while they fit and
    # no cap fitted to the node moves further than the band from its own.
    # 0: the paper's rule (raise at once, lower after theta/2). Where epochs are
    # short the demand of a steady load moves by more than theta every epoch.
    hysteresis_band: float = 0.0
    # A cap falls only once it has stood this many epochs (a raise never
    # waits): scale-down stabilisation. 0 or 1: the paper's rule. Where the
    # load's level changes every few epochs, a cap that falls right after each
    # rise is raised again at the next.
    lower_after_epochs: int = 0
    # A cap falls, band or not, once its demand has fallen this many epochs in a
    # row (by theta/2 in all): a falling trend, not noise. 0: off.
    lower_after_falls: int = 0
    # Per-node CPU kept free of caps (anti-saturation).
    headroom_cores: float = 0.1
    # No instance is capped below this, so a quiet instance can still wake up.
    min_cap_cores: float = 0.05
    # A queue built during a burst is drained within this many slots.
    backlog_drain_slots: float = 1.0
    # `on`: each application whose measured latency is over its target in more
    # than latency_feedback_aim x its class's max_violation_ratio of its recent
    # slots is sized for a tighter target and drains its queues sooner, by a gain
    # in [0.25, 1] that falls while the share is over the aim and returns to 1
    # below it (docs/controller.md, "Latency feedback"). `off`: the model alone.
    latency_feedback: str = "off"
    # The slots the measured share is taken over, in seconds (at least one slot).
    latency_feedback_seconds: float = 30.0
    # The share aimed at, as a part of the class's max_violation_ratio.
    latency_feedback_aim: float = 0.5
    # Strategy names (one interface per decision): `qos-dp` divides CPU by QoS
    # class with the dynamic program, `demand` grants demand and scales nodes down.
    allocator: str = "qos-dp"
    # Who sizes the caps: `dsched` (forecast, demand, the allocator above and
    # hysteresis) or a peer whose published rule replaces those stages, over the
    # same views and through the same agents: `ds2` (target rate over true
    # processing rate), `util-target` (busy time at 0.7 of the cap, Flink
    # autoscaler's stabilisation window), `vpa` (0.9 percentile of a decaying usage
    # histogram plus 15 %), `err` (fixed threads per QoS class). For comparisons;
    # docs/live-benchmark.md ("Peers") says how each maps onto caps.
    policy: str = "dsched"
    # Who carries out caps in enforce mode: `agents` (CapDirectives down the
    # agents' streams) or `log-only`. Dry-run always logs only.
    cap_actuator: str = "agents"
    # Placement strategy: liu, even, rstorm, sam, aniello-offline,
    # aniello-online, mips, or `none` (never plan moves).
    placement: str = "liu"
    # Per-strategy options, e.g. `[placement_options.mips] samples = 64`.
    placement_options: PlacementOptions = field(default_factory=PlacementOptions)
    # Who carries out planned moves in enforce mode: `log-only` (plan and record,
    # move nothing: for engines without an actuator) or `testbed` (the live
    # testbed's move endpoint at `move_url`). Dry-run always logs only.
    move_actuator: str = "log-only"
    # URL of the testbed's move endpoint (move_actuator = `testbed`).
    move_url: str = ""
    # How long the testbed move actuator waits for a plan's moves to finish.
    move_timeout_seconds: float = 120.0
    # How long a node holding a stateful worker must have been emptiable before
    # placement empties it (moving a stateful worker restarts it and carries its
    # state). 300 s is the Kubernetes HPA's downscale stabilization window. The
    # controller turns it into consecutive plans of its slot for strategies that
    # wait (``liu``'s scale_in_patience).
    scale_in_wait_seconds: float = 300.0
    # The same for a node holding only stateless workers. 0: emptied in the first
    # plan that can (the paper's rule, which checks once a 10-s period). Where
    # epochs are short, a lull of a few seconds would empty a node that the next
    # rise refills, each moved worker pausing twice.
    scale_in_wait_stateless_seconds: float = 0.0
    # Placement judges each instance by its demand averaged over this many seconds
    # (less the part that drains its queue). Caps follow a load within an epoch;
    # a move pauses the instance, so moves are made for load that lasts, and a
    # node over its room for less than this is fitted by the allocator's cuts.
    # 0: this epoch's demand (the paper's rule).
    placement_demand_seconds: float = 0.0
    # A rise is placed once a mean over this many seconds shows it: placement
    # judges each instance by the larger of its mean demand over
    # `placement_demand_seconds` and its mean over these seconds. A long mean
    # sees a ramp late, and until it catches up the caps on a full node are cut
    # while another node has room; a fall is still judged by the long mean, so a
    # node is not emptied the moment a level drops. 0: the long mean alone;
    # otherwise shorter than `placement_demand_seconds`.
    placement_rise_seconds: float = 0.0
    # A plan made for overload alone (no node to empty, no instance on a node
    # that is gone) moves instances only when it lowers the cores by which nodes
    # are over their room by more than this per instance it moves. A demand
    # measured under caps swings by a few hundredths of a core from epoch to
    # epoch; a move pauses its instance, and one made to relieve less than that
    # swing is often undone by the next plan, while the allocator's cuts fit the
    # node either way. 0: any relief.
    placement_min_relief_cores: float = 0.0
    # Stateful instances are placed where their workers keep room for the most
    # they needed over this window (moving one later costs a state migration);
    # stateless ones only by their demand now. 0: by their demand now too.
    stateful_peak_seconds: float = 300.0
    # QoS classes and the default class (`[qos]`, `[qos.classes.<name>]`).
    qos: QosConfig = field(default_factory=QosConfig)
    # Queueing model of an operator's waiting time (predict.queueing.WAIT_MODELS):
    # `ggm` (QNA's two-moment G/G/M formula with a correction fitted to simulation),
    # `allen-cunneen` (the seed paper's), `whitt`, `erlang-c` (M/M/M). `kingman` is
    # the one-server case and is refused: operators run several instances.
    # Default: `ggm` (predict.queueing.DEFAULT_WAIT_MODEL), the closest of them to
    # simulated G/G/M waits over the loads, instance counts and variabilities it
    # is fitted for (docs/latency-model.md, "Accuracy against simulation").
    latency_model: str = DEFAULT_WAIT_MODEL
    # What meeting a class's latency target means: `quantile` (the 1 -
    # max_violation_ratio quantile of each operator's waiting + service time stays
    # within its share of the target; the violation estimate is the model's tail) or
    # `mean` (the mean does, the seed paper's formulation; violation from an
    # exponential tail of the mean).
    latency_criterion: str = "quantile"
    # Squared coefficients of variation of inter-arrival and service times used by
    # the latency model (1.0 = Poisson-like) under `variability = "fixed"`, and
    # for an operator whose slots do not yet hold enough evidence to measure them.
    arrival_scv: float = 1.0
    # (the same for service times)
    service_scv: float = 1.0
    # `measured`: each operator's arrival and service C² measured from its slot
    # counters (second differences of per-slot counts and mean service times,
    # docs/latency-model.md, "Measured variability"); `fixed`: arrival_scv and
    # service_scv for every operator.
    variability: str = "measured"
    # Slots of each operator's counters the measurement looks back over.
    variability_slots: int = 60
    # Evidence needed before a measured C² replaces the fixed one: this many
    # triples of consecutive slots ...
    variability_min_slots: int = 10
    # ... each slot with at least this many tuples (arrived, or executed for service).
    variability_min_tuples: float = 10.0
    # Bounds of a measured C² (outside them a few transient slots would dominate,
    # or the queueing models leave their range of accuracy).
    scv_min: float = 0.05
    # (upper bound)
    scv_max: float = 4.0
    # `on`: correct each instance's CPU per tuple for its node's memory-bandwidth
    # saturation (resctrl counters; docs/controller.md, "Interference"); `off`.
    interference: str = "on"
    # Peak memory bandwidth of a node (bytes/s), what its utilisation is measured
    # against. 0: unknown, and no node is corrected (the record says so).
    memory_bandwidth_peak_bytes_per_second: float = 0.0
    # Slowdown of CPU work on a node at bandwidth utilisation u:
    # 1 + interference_slope * max(0, u - interference_threshold)
    # (predict.interference; fit them from history with fit_interference).
    interference_threshold: float = 0.6
    # (the slope of that hinge; 0: no slowdown)
    interference_slope: float = 1.0
    # What the DP maximises: `covered` demand weighted by class, or `latency`
    # (weighted fraction of tuples predicted to meet the target).
    dp_value: str = "covered"
    # DP granularity: cores per unit is the larger of theta_cores and
    # cluster capacity / dp_max_units, so the DP's size stays bounded.
    dp_max_units: int = 4000
    # Value (class weight x cores) a node must earn to be worth running: a node
    # is recommended only when the gain beats this cost.
    node_cost: float = 4.0
    # Cap what dsched may hand out on a node, overriding the capacity the agent
    # reports (node id -> cores), e.g. to leave the rest to other tenants.
    node_capacity_cores: dict[str, float] = field(default_factory=dict)
    # `subtract`: a node's capacity is what its agent reports less the CPU its
    # threads that are no instance's used (NodeSample.other_cpu_cores, the mean
    # over the last phi reports): an engine's dispatch, network and GC threads
    # share the node with the caps. `ignore`: the report as it is. Off by default
    # because where several agents share one machine with node_cpu = "host",
    # each would count the others' instances as its own node's load.
    other_cpu: str = "ignore"
    # Load predictors whose maximum is the forecast: `linear_trend` (every
    # operator), `last_value` (every operator: the last slot's arrivals, so a
    # trend never forecasts below what arrives now), `dag` (non-sources, from
    # their parents), `arima` (sources),
    # `seasonal` (sources: where the arrivals repeat with a period of at most
    # arima_history / 2 slots and the seasonal forecast has beaten the others
    # lately, it replaces their maximum).
    predictors: list[str] = field(default_factory=lambda: ["linear_trend", "dag", "arima"])
    # Past epochs of a source's arrivals ARIMA is fitted on.
    arima_history: int = 300
    # First ARIMA fits per epoch (tens of ms each); the rest wait a slot.
    arima_fits_per_epoch: int = 8
    # Most cores one instance can use (1 for single-threaded instances): a
    # latency target needing more is marked unreachable.
    max_instance_cores: float = 1.0
    # Reports stamped further than this in the future are refused.
    max_clock_skew_seconds: float = 30.0
    # Decision records kept in SQLite (8640 = one day at 10-s slots).
    decisions_kept: int = 8640
    # An instance that has not reported for this many slots is forgotten.
    forget_after_slots: int = 6
    # Serve the agents' door off loopback without mutual TLS (plaintext, or TLS
    # without client certificates): agents are then not authenticated. A warning at
    # every start.
    allow_plaintext_remote: bool = False
    # The agents' door TLS: cert + key of the controller and ca, the CA of the
    # agents' client certificates (an agent's node id must be its certificate's CN
    # or a subject alternative name).
    tls: TlsConfig = field(default_factory=TlsConfig)
    # TLS of a HOST:PORT admin door: cert + key of the controller and ca, the CA of
    # the admin clients' certificates (never the agents' CA). Required off loopback.
    admin_tls: AdminTlsConfig = field(default_factory=AdminTlsConfig)
    # The Spark history ([history] table). Its paths default under state_dir and
    # its slot is the controller's. With `enabled`, the controller spools every
    # slot and runs the streaming job itself; set it false when dsched-history
    # runs as its own service on the same spool.
    history: HistoryConfig = field(default_factory=HistoryConfig)
    # Task performance model table the controller loads at start and reloads when the
    # file changes: JSON from `dsched profile OPERATOR --json PATH` or Parquet from
    # `dsched-history fit` (by suffix). Unset: the fitted table,
    # `<history model_dir>/perf/current.parquet`. A bad table is refused and the models
    # loaded before stay (docs/perf-models.md).
    perf_model_table: Path | None = None
    # Engines whose counters come from their own API (`[[engine]]`; docs/controller.md).
    engine: list[EngineConfig] = field(default_factory=list)
    # Who adds or removes a node when the DP recommends it (`[node_pool]`;
    # docs/node-pool.md).
    node_pool: NodePoolConfig = field(default_factory=NodePoolConfig)
    # How many instances each operator runs (`[parallelism]`; docs/parallelism.md).
    parallelism: ParallelismConfig = field(default_factory=ParallelismConfig)

    def validate(self) -> None:
        for key in ("listen", "metrics"):
            parse_hostport(key, getattr(self, key))
        require(self.mode in MODES, "mode", f"must be one of {', '.join(MODES)}, got {self.mode!r}")
        require(self.slot_seconds > 0, "slot_seconds", "must be positive")
        require(self.phi >= 2, "phi", "must be at least 2 (a trend needs two points)")
        require(0 < self.theta_cores <= 1, "theta_cores", "must be in (0, 1]")
        require(
            not isinstance(self.hysteresis_band, bool)
            and isinstance(self.hysteresis_band, int | float)
            and 0 <= self.hysteresis_band < 1,
            "hysteresis_band",
            "must be a number in [0, 1)",
        )
        require(
            type(self.lower_after_epochs) is int and self.lower_after_epochs >= 0,
            "lower_after_epochs",
            "must be a whole number of epochs >= 0",
        )
        require(
            type(self.lower_after_falls) is int and self.lower_after_falls >= 0,
            "lower_after_falls",
            "must be a whole number of epochs >= 0",
        )
        require(self.headroom_cores >= 0, "headroom_cores", "must be >= 0")
        require(self.min_cap_cores > 0, "min_cap_cores", "must be positive")
        require(self.backlog_drain_slots > 0, "backlog_drain_slots", "must be positive")
        require(
            self.latency_feedback in ("on", "off"), "latency_feedback", "must be one of on, off"
        )
        require(self.latency_feedback_seconds > 0, "latency_feedback_seconds", "must be positive")
        require(
            0 < self.latency_feedback_aim <= 1,
            "latency_feedback_aim",
            "must be in (0, 1]",
        )
        require(
            self.cost_model in COST_MODELS,
            "cost_model",
            f"must be one of {', '.join(COST_MODELS)}",
        )
        require(self.forget_after_slots >= 1, "forget_after_slots", "must be >= 1")
        from controller.edges.actuators import CAP_ACTUATORS
        from controller.peers import POLICIES
        from controller.placement import STRATEGIES, get_strategy
        from controller.placement.migration import MOVE_ACTUATORS
        from controller.stages.allocation import ALLOCATORS
        from controller.stages.forecast import PREDICTORS

        ALLOCATORS.check(self.allocator)
        POLICIES.check(self.policy)
        CAP_ACTUATORS.check(self.cap_actuator)
        MOVE_ACTUATORS.check(self.move_actuator)
        require(
            self.other_cpu in OTHER_CPU_USES,
            "other_cpu",
            f"must be one of {', '.join(OTHER_CPU_USES)}",
        )
        require(
            self.flow_bound in FLOW_BOUNDS,
            "flow_bound",
            f"must be one of {', '.join(FLOW_BOUNDS)}",
        )
        require(
            self.cap_rounding in CAP_ROUNDINGS,
            "cap_rounding",
            f"must be one of {', '.join(CAP_ROUNDINGS)}",
        )
        require(
            self.forecast_median in ("on", "off"),
            "forecast_median",
            "must be one of on, off",
        )
        require(
            self.kappa_estimator in COST_STRATEGIES,
            "kappa_estimator",
            f"must be one of {', '.join(COST_STRATEGIES)}",
        )
        require(bool(self.predictors), "predictors", "at least one predictor is needed")
        for i, name in enumerate(self.predictors):
            PREDICTORS.check(name, f"predictors[{i}]")
        if self.placement != "none":
            STRATEGIES.check(self.placement)
        for name in STRATEGIES:
            try:
                get_strategy(name, **self.placement_options.for_strategy(name))
            except ValueError as exc:
                raise ConfigError(f"placement_options.{name}", str(exc)) from None
        require(
            self.move_actuator != "testbed" or self.move_url.startswith(("http://", "https://")),
            "move_url",
            "the testbed move actuator needs an http(s):// URL",
        )
        for key in (
            "scale_in_wait_seconds",
            "scale_in_wait_stateless_seconds",
            "placement_demand_seconds",
            "placement_rise_seconds",
            "placement_min_relief_cores",
            "stateful_peak_seconds",
        ):
            value = getattr(self, key)
            require(
                not isinstance(value, bool)
                and isinstance(value, int | float)
                and math.isfinite(value)
                and value >= 0,
                key,
                "must be a number >= 0",
            )
        # The controller keeps each instance's demands over these windows in memory.
        for key in ("placement_demand_seconds", "placement_rise_seconds", "stateful_peak_seconds"):
            require(
                getattr(self, key) <= MAX_DEMAND_WINDOW_SECONDS,
                key,
                f"must be at most {MAX_DEMAND_WINDOW_SECONDS:g} s (one day): every "
                "instance's demands over the window are kept in memory",
            )
        # A rise window as long as the mean's would judge the same mean.
        require(
            self.placement_rise_seconds == 0
            or self.placement_rise_seconds < self.placement_demand_seconds,
            "placement_rise_seconds",
            "must be 0 or shorter than placement_demand_seconds "
            f"({self.placement_demand_seconds:g} s): it is the shorter of two means, "
            "and without a longer one it changes nothing",
        )
        known_models = ", ".join(sorted(WAIT_MODELS))
        require(
            isinstance(self.latency_model, str) and self.latency_model in WAIT_MODELS,
            "latency_model",
            f"unknown queueing model {self.latency_model!r} (known: {known_models})",
        )
        require(
            self.latency_model != "kingman",
            "latency_model",
            "kingman is the one-server (G/G/1) case and operators run several instances; "
            "use a G/G/M model (allen-cunneen for the same formula at one server)",
        )
        require(
            self.latency_criterion in LATENCY_CRITERIA,
            "latency_criterion",
            f"must be one of {', '.join(LATENCY_CRITERIA)}, got {self.latency_criterion!r}",
        )
        require(self.arrival_scv >= 0, "arrival_scv", "must be >= 0")
        require(self.service_scv >= 0, "service_scv", "must be >= 0")
        require(
            self.variability in ("measured", "fixed"),
            "variability",
            f"must be measured or fixed, got {self.variability!r}",
        )
        require(self.variability_slots >= 3, "variability_slots", "must be >= 3")
        require(self.variability_min_slots >= 1, "variability_min_slots", "must be >= 1")
        require(
            self.variability_min_slots <= self.variability_slots - 2,
            "variability_min_slots",
            "must be <= variability_slots - 2 (a triple of slots per estimate)",
        )
        require(
            math.isfinite(self.variability_min_tuples) and self.variability_min_tuples >= 0,
            "variability_min_tuples",
            "must be a number >= 0",
        )
        require(
            math.isfinite(self.scv_min) and self.scv_min >= 0, "scv_min", "must be a number >= 0"
        )
        require(
            math.isfinite(self.scv_max) and self.scv_max >= self.scv_min,
            "scv_max",
            "must be a number >= scv_min",
        )
        require(
            self.interference in ("on", "off"),
            "interference",
            f"must be on or off, got {self.interference!r}",
        )
        require(
            math.isfinite(self.memory_bandwidth_peak_bytes_per_second)
            and self.memory_bandwidth_peak_bytes_per_second >= 0,
            "memory_bandwidth_peak_bytes_per_second",
            "must be a number >= 0",
        )
        require(
            math.isfinite(self.interference_threshold) and 0 <= self.interference_threshold <= 1,
            "interference_threshold",
            "must be in [0, 1]",
        )
        require(
            math.isfinite(self.interference_slope) and self.interference_slope >= 0,
            "interference_slope",
            "must be a number >= 0",
        )
        require(self.dp_value in DP_VALUES, "dp_value", f"must be one of {', '.join(DP_VALUES)}")
        require(self.dp_max_units >= 10, "dp_max_units", "must be >= 10")
        require(self.node_cost >= 0, "node_cost", "must be >= 0")
        for node, cores in self.node_capacity_cores.items():
            require(cores > 0, f"node_capacity_cores.{node}", "must be > 0")
        require(self.arima_history >= 20, "arima_history", "must be >= 20")
        require(self.arima_fits_per_epoch >= 0, "arima_fits_per_epoch", "must be >= 0")
        require(
            math.isfinite(self.max_instance_cores) and self.max_instance_cores > 0,
            "max_instance_cores",
            "must be a number > 0",
        )
        require(
            math.isfinite(self.max_clock_skew_seconds) and self.max_clock_skew_seconds >= 0,
            "max_clock_skew_seconds",
            "must be a number >= 0",
        )
        require(self.decisions_kept >= 1, "decisions_kept", "must be >= 1")
        from controller.edges.models import check_table_path

        check_table_path("perf_model_table", self.perf_model_table)
        require(
            math.isfinite(self.move_timeout_seconds) and self.move_timeout_seconds > 0,
            "move_timeout_seconds",
            "must be a number > 0",
        )
        try:
            self.qos.validate()
        except ConfigError as exc:
            if not exc.key.startswith("qos."):
                raise ConfigError(f"qos.{exc.key}", str(exc).split(": ", 1)[1]) from None
            raise
        require(
            self.epoch_trigger in EPOCH_TRIGGERS,
            "epoch_trigger",
            f"must be one of {', '.join(EPOCH_TRIGGERS)}, got {self.epoch_trigger!r}",
        )
        require(self.max_agent_streams >= 1, "max_agent_streams", "must be >= 1")
        require(
            math.isfinite(self.max_node_capacity_cores) and self.max_node_capacity_cores > 0,
            "max_node_capacity_cores",
            "must be a number > 0",
        )
        self._validate_doors()
        try:
            self.node_pool.validate()
        except ConfigError as exc:
            if not exc.key.startswith("node_pool."):
                raise ConfigError(f"node_pool.{exc.key}", str(exc).split(": ", 1)[1]) from None
            raise
        try:
            self.parallelism.validate()
        except ConfigError as exc:
            if not exc.key.startswith("parallelism."):
                raise ConfigError(f"parallelism.{exc.key}", str(exc).split(": ", 1)[1]) from None
            raise
        if self.node_pool.strategy == "testbed":
            require(
                is_loopback(parse_hostport("listen", self.listen)[0]),
                "node_pool.strategy",
                "the testbed node pool starts agents on this machine: `listen` must be loopback",
            )
        names: set[str] = set()
        for i, engine in enumerate(self.engine):
            try:
                engine.validate()
            except ConfigError as exc:
                if not exc.key.startswith("engine["):
                    raise ConfigError(
                        f"engine[{i}].{exc.key}", str(exc).split(": ", 1)[1]
                    ) from None
                raise
            require(
                engine.engine_name not in names,
                f"engine[{i}].name",
                f"two engines are named {engine.engine_name!r}",
            )
            names.add(engine.engine_name)

    def _validate_doors(self) -> None:
        """Off loopback the agents' door needs mutual TLS and the admin door its own."""
        host, _ = parse_hostport("listen", self.listen)
        self.tls.validate("server")
        missing = self.tls.missing()
        if not is_loopback(host) and missing and not self.allow_plaintext_remote:
            raise ConfigError(
                missing[0],
                f"required for the agents' door on non-loopback {host} (mutual TLS needs "
                "tls.cert, tls.key and tls.ca, the agents' client CA); or set "
                "allow_plaintext_remote = true to serve unauthenticated agents",
            )
        path = unix_socket_path(self.admin_listen)
        if path is not None:
            require(
                path.is_absolute() and path.name != "",
                "admin_listen",
                f"a Unix socket address is unix:/absolute/path, got {self.admin_listen!r}",
            )
            require(
                len(str(path).encode()) <= MAX_UNIX_PATH,
                "admin_listen",
                f"socket path longer than {MAX_UNIX_PATH} bytes: {path}",
            )
            require(
                not self.admin_tls.enabled,
                "admin_tls",
                "TLS is for a HOST:PORT admin door; a Unix socket is guarded by its file mode",
            )
        else:
            admin_host, admin_port = parse_hostport("admin_listen", self.admin_listen)
            self.admin_tls.validate("server")
            admin_missing = self.admin_tls.missing()
            require(
                is_loopback(admin_host) or not admin_missing,
                admin_missing[0] if admin_missing else "admin_tls",
                f"required for the admin door on non-loopback {admin_host} (mutual TLS "
                "needs admin_tls.cert, admin_tls.key and admin_tls.ca, the admin clients' CA)",
            )
            require(
                self.admin_tls.cert is None or self.admin_tls.ca is not None,
                "admin_tls.ca",
                "an admin door with TLS must check its clients: set the admin clients' CA",
            )
            require(
                admin_port == 0
                or (admin_host, admin_port) != (host, parse_hostport("listen", self.listen)[1]),
                "admin_listen",
                "must not be the agents' address (`listen`)",
            )
            if self.admin_tls.ca is not None and self.tls.ca is not None:
                shared = set(pem_certificates(self.admin_tls.ca)) & set(
                    pem_certificates(self.tls.ca)
                )
                require(
                    not shared,
                    "admin_tls.ca",
                    "is (or contains) the agents' client CA (tls.ca): an agent certificate "
                    "would open the admin door; use a CA of its own for admin clients",
                )
        try:
            mode = int(self.admin_socket_mode, 8)
        except ValueError:
            raise ConfigError(
                "admin_socket_mode",
                f'expected an octal mode like "0660", got {self.admin_socket_mode!r}',
            ) from None
        require(0 <= mode <= 0o777, "admin_socket_mode", "must be within 0000..0777")
        socket_group_id("admin_socket_group", self.admin_socket_group)

    @property
    def admin_socket_mode_bits(self) -> int:
        return int(self.admin_socket_mode, 8)
