"""The controller's configuration (`/etc/dsched/controller.toml`).

Every key has a production default; `validate()` refuses impossible values at
startup with the key's name, so a typo never turns into a silent default.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from dsched.config import ConfigError, is_loopback, parse_hostport, require
from dsched.names import InvalidName, check_name
from spark_stream.config import HistoryConfig

MODES = ("dry-run", "enforce")
ALLOCATOR_NAMES = ("demand", "qos-dp")
# How the DP values CPU given to an application (docs/controller.md).
DP_VALUES = ("covered", "latency")


@dataclass
class TlsConfig:
    """Server-side TLS. With ``ca`` set, agents must present a client certificate."""

    cert: Path | None = None
    key: Path | None = None
    ca: Path | None = None

    @property
    def enabled(self) -> bool:
        return self.cert is not None

    def validate(self) -> None:
        require((self.cert is None) == (self.key is None), "tls.key", "cert and key go together")
        for name in ("cert", "key", "ca"):
            p = getattr(self, name)
            require(p is None or p.is_file(), f"tls.{name}", f"{p} is not a file")


@dataclass
class QosClassConfig:
    """One QoS class: mean latency target, tolerated violation ratio, importance."""

    target_latency_ms: float = 1000.0
    max_violation_ratio: float = 0.1
    weight: float = 1.0

    def validate(self) -> None:
        require(self.target_latency_ms > 0, "target_latency_ms", "must be > 0")
        require(
            0 < self.max_violation_ratio < 1,
            "max_violation_ratio",
            "must be between 0 and 1 (exclusive)",
        )
        require(self.weight > 0, "weight", "must be > 0")


def default_qos_classes() -> dict[str, QosClassConfig]:
    return {
        "gold": QosClassConfig(target_latency_ms=100.0, max_violation_ratio=0.01, weight=8.0),
        "silver": QosClassConfig(target_latency_ms=500.0, max_violation_ratio=0.10, weight=3.0),
        "bronze": QosClassConfig(target_latency_ms=2000.0, max_violation_ratio=0.50, weight=1.0),
    }


@dataclass
class QosConfig:
    """``[qos]``: the classes (``[qos.classes.<name>]``, replacing the defaults when
    given) and the class of applications nobody assigned."""

    default_class: str = "bronze"
    classes: dict[str, QosClassConfig] = field(default_factory=default_qos_classes)

    def validate(self) -> None:
        require(bool(self.classes), "classes", "at least one class is needed")
        for name, cls in self.classes.items():
            try:
                check_name("class", name)
            except InvalidName as exc:
                raise ConfigError(f"classes.{name}", str(exc)) from None
            try:
                cls.validate()
            except ConfigError as exc:
                raise ConfigError(f"classes.{name}.{exc.key}", str(exc).split(": ", 1)[1]) from None
        require(
            self.default_class in self.classes,
            "default_class",
            f"{self.default_class!r} is not a class (known: {', '.join(sorted(self.classes))})",
        )


@dataclass
class ControllerConfig:
    listen: str = "127.0.0.1:7700"
    metrics: str = "127.0.0.1:9708"
    state_dir: Path = Path("/var/lib/dsched")
    # The mode on the very first start; afterwards the persisted mode wins, so a
    # restart never flips a cluster from dry-run to enforce or back.
    mode: str = "dry-run"
    slot_seconds: float = 10.0
    # Slots of history the fast loop predicts from (phi in DESIGN §4).
    phi: int = 5
    # Cap granularity in cores (theta in DESIGN §4 step 6).
    theta_cores: float = 0.1
    # Per-node CPU kept free of caps (anti-saturation, DESIGN §4 step 5).
    headroom_cores: float = 0.1
    # No instance is capped below this, so a quiet instance can still wake up.
    min_cap_cores: float = 0.05
    # A queue built during a burst is drained within this many slots.
    backlog_drain_slots: float = 1.0
    # Strategy names (one interface per decision): `qos-dp` divides CPU by QoS
    # class with the dynamic program, `demand` grants demand and scales nodes down.
    allocator: str = "qos-dp"
    # A name from controller.placement.STRATEGIES, or `none` (never plan moves).
    placement: str = "liu"
    # Who carries out planned moves in enforce mode: `log-only` (plan and record,
    # move nothing: for engines without an actuator) or `testbed` (the live
    # testbed's move endpoint at `move_url`). Dry-run always logs only.
    move_actuator: str = "log-only"
    move_url: str = ""
    # How long a node holding a stateful worker must have been emptiable before
    # placement empties it (moving a stateful worker restarts it and carries its
    # state). 300 s is the Kubernetes HPA's downscale stabilization window. The
    # controller turns it into consecutive plans of its slot for strategies that
    # wait (``liu``'s scale_in_patience).
    scale_in_wait_seconds: float = 300.0
    # Stateful instances are placed where their workers keep room for the most
    # they needed over this window (moving one later costs a state migration);
    # stateless ones only by their demand now. 0: by their demand now too.
    stateful_peak_seconds: float = 300.0
    qos: QosConfig = field(default_factory=QosConfig)
    # Squared coefficients of variation of inter-arrival and service times used by
    # the Allen–Cunneen latency model (1.0 = Poisson-like).
    arrival_scv: float = 1.0
    service_scv: float = 1.0
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
    # Load prediction for sources also tries ARIMA on this many past epochs.
    arima: bool = True
    arima_history: int = 300
    # An instance that has not reported for this many slots is forgotten.
    forget_after_slots: int = 6
    allow_plaintext_remote: bool = False
    tls: TlsConfig = field(default_factory=TlsConfig)
    # The Spark history ([history] table). Its paths default under state_dir and
    # its slot is the controller's. With `enabled`, the controller spools every
    # slot and runs the streaming job itself; set it false when dsched-history
    # runs as its own service on the same spool.
    history: HistoryConfig = field(default_factory=HistoryConfig)

    def validate(self) -> None:
        for key in ("listen", "metrics"):
            parse_hostport(key, getattr(self, key))
        require(self.mode in MODES, "mode", f"must be one of {', '.join(MODES)}, got {self.mode!r}")
        require(self.slot_seconds > 0, "slot_seconds", "must be positive")
        require(self.phi >= 2, "phi", "must be at least 2 (a trend needs two points)")
        require(0 < self.theta_cores <= 1, "theta_cores", "must be in (0, 1]")
        require(self.headroom_cores >= 0, "headroom_cores", "must be >= 0")
        require(self.min_cap_cores > 0, "min_cap_cores", "must be positive")
        require(self.backlog_drain_slots > 0, "backlog_drain_slots", "must be positive")
        require(self.forget_after_slots >= 1, "forget_after_slots", "must be >= 1")
        require(
            self.allocator in ALLOCATOR_NAMES,
            "allocator",
            f"unknown allocator {self.allocator!r} (known: {', '.join(ALLOCATOR_NAMES)})",
        )
        from controller.placement import STRATEGIES

        placements = ("none", *sorted(STRATEGIES))
        require(
            self.placement in placements,
            "placement",
            f"unknown placement {self.placement!r} (known: {', '.join(placements)})",
        )
        from controller.migration import MOVE_ACTUATORS

        require(
            self.move_actuator in MOVE_ACTUATORS,
            "move_actuator",
            f"unknown move actuator {self.move_actuator!r} "
            f"(known: {', '.join(sorted(MOVE_ACTUATORS))})",
        )
        require(
            self.move_actuator != "testbed" or self.move_url.startswith(("http://", "https://")),
            "move_url",
            "the testbed move actuator needs an http(s):// URL",
        )
        require(
            math.isfinite(self.scale_in_wait_seconds) and self.scale_in_wait_seconds >= 0,
            "scale_in_wait_seconds",
            "must be a number >= 0",
        )
        require(
            math.isfinite(self.stateful_peak_seconds) and self.stateful_peak_seconds >= 0,
            "stateful_peak_seconds",
            "must be a number >= 0",
        )
        require(self.arrival_scv >= 0, "arrival_scv", "must be >= 0")
        require(self.service_scv >= 0, "service_scv", "must be >= 0")
        require(self.dp_value in DP_VALUES, "dp_value", f"must be one of {', '.join(DP_VALUES)}")
        require(self.dp_max_units >= 10, "dp_max_units", "must be >= 10")
        require(self.node_cost >= 0, "node_cost", "must be >= 0")
        for node, cores in self.node_capacity_cores.items():
            require(cores > 0, f"node_capacity_cores.{node}", "must be > 0")
        require(self.arima_history >= 20, "arima_history", "must be >= 20")
        try:
            self.qos.validate()
        except ConfigError as exc:
            if not exc.key.startswith("qos."):
                raise ConfigError(f"qos.{exc.key}", str(exc).split(": ", 1)[1]) from None
            raise
        host, _ = parse_hostport("listen", self.listen)
        if not (is_loopback(host) or self.tls.enabled or self.allow_plaintext_remote):
            raise ConfigError(
                "listen",
                f"plaintext gRPC on non-loopback {host}: configure [tls] or set "
                "allow_plaintext_remote = true",
            )
        self.tls.validate()
