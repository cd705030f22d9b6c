"""The controller's lease on the caps: how long the agent trusts silence.

Every message from the controller renews the lease. When neither a Welcome nor
a directive has arrived for ``slots`` slots, the fallback policy applies once
and is logged once: ``hold`` keeps every cap (the last plan stays the best
guess), ``release`` removes them. The next message ends the fallback. While the
controller is in dry-run (the enforcer inactive) there is no fallback: nothing
is enforced on its behalf and nothing may change.
docs/agent.md, "Link and fallback policy".
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field

from agent.enforcer import CapEnforcer
from agent.metrics import AgentMetrics

log = logging.getLogger(__name__)

FALLBACK_POLICIES = ("hold", "release")


@dataclass
class Lease:
    """Renewed by the link's thread, checked by the daemon's loop once a slot."""

    slots: int
    slot_seconds: float
    metrics: AgentMetrics
    last_contact: float = field(default_factory=time.monotonic)
    fallback_applied: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    @property
    def seconds(self) -> float:
        return self.slots * self.slot_seconds

    def renew(self, now: float | None = None) -> None:
        with self._lock:
            self.last_contact = time.monotonic() if now is None else now
            if self.fallback_applied:
                log.info("controller is back; fallback ends")
            self.fallback_applied = False

    def check(self, enforcer: CapEnforcer, policy: str, now: float | None = None) -> bool:
        """Apply ``policy`` once when the controller has been silent too long; True if applied now."""
        if policy not in FALLBACK_POLICIES:
            raise ValueError(f"fallback must be one of {', '.join(FALLBACK_POLICIES)}: {policy!r}")
        now = time.monotonic() if now is None else now
        if not enforcer.active:
            return False
        with self._lock:
            silence = now - self.last_contact
            if self.fallback_applied or silence < self.seconds:
                return False
            self.fallback_applied = True
        log.warning(
            "no word from the controller for %.0f s (%d slots): fallback '%s' (%d caps)",
            silence,
            self.slots,
            policy,
            len(enforcer.caps),
        )
        self.metrics.fallbacks.labels(policy).inc()
        if policy == "release":
            enforcer.release_all()
        return True
