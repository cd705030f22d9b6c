"""The controller's configuration (`/etc/dsched/controller.toml`).

Every key has a production default; `validate()` refuses impossible values at
startup with the key's name, so a typo never turns into a silent default.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from dsched.config import ConfigError, is_loopback, parse_hostport, require

MODES = ("dry-run", "enforce")


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
    # Strategy names (one interface per decision).
    allocator: str = "demand"
    placement: str = "none"
    # An instance that has not reported for this many slots is forgotten.
    forget_after_slots: int = 6
    allow_plaintext_remote: bool = False
    tls: TlsConfig = field(default_factory=TlsConfig)

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
        host, _ = parse_hostport("listen", self.listen)
        if not (is_loopback(host) or self.tls.enabled or self.allow_plaintext_remote):
            raise ConfigError(
                "listen",
                f"plaintext gRPC on non-loopback {host}: configure [tls] or set "
                "allow_plaintext_remote = true",
            )
        self.tls.validate()
