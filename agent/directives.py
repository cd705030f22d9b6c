"""A CapDirective in, an Ack out: what the agent does with the controller's caps.

Each entry is checked before anything is written: an instance this agent does
not hold is ``unknown_instance``, a cap outside (0, node cores] is
``cap_out_of_bounds`` (0, negatives, NaN and infinities included: a cap is
removed by naming the instance in ``release``, never by a value), an instance
both capped and released by one directive is ``conflicting_entries`` in both,
and the enforcer's failures become ``thread_gone`` or ``cgroup_error``. A
released instance gets its threads back in the cgroup they came from. A
directive older than the last one applied is answered ``stale`` and changes
nothing. docs/agent.md, "Link and fallback
policy", lists the reasons as the controller sees them.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

from prometheus_client import Counter

from agent.cgroups import CgroupError, ThreadGone
from agent.enforcer import CapEnforcer
from agent.registry import RegistrationError, make_key
from dsched.names import InvalidName
from dsched_pb import dsched_pb2 as pb

log = logging.getLogger(__name__)


@dataclass
class DirectiveEpochs:
    """The epoch of the last directive applied; directives and welcomes arrive on one stream."""

    last_applied: int | None = None

    def is_stale(self, epoch: int) -> bool:
        return self.last_applied is not None and epoch < self.last_applied

    def follow(self, controller_epoch: int) -> bool:
        """Take the controller's numbering when it restarted below ours; True if it did."""
        if self.last_applied is None or controller_epoch >= self.last_applied:
            return False
        # The controller lost its epoch counter: every later directive would be
        # refused as stale if the agent kept its own.
        log.warning(
            "controller restarted at epoch %d below our last applied %d; following it",
            controller_epoch,
            self.last_applied,
        )
        self.last_applied = controller_epoch
        return True


def handle_directive(
    enforcer: CapEnforcer, directive: pb.CapDirective, epochs: DirectiveEpochs
) -> pb.Ack:
    """Apply one CapDirective through ``enforcer``; every refused entry gets a reason in the Ack."""
    ack = pb.Ack(epoch=directive.epoch)
    rejected = enforcer.metrics.rejected_directives
    # One lock over the whole directive: a report or the fallback sees all of it or none.
    with enforcer.lock:
        if epochs.is_stale(directive.epoch):
            ack.stale = True
            rejected.labels("stale_epoch").inc()
            log.warning(
                "ignored directive of epoch %d: epoch %d was already applied",
                directive.epoch,
                epochs.last_applied,
            )
            return ack
        released = {_wire_key(k) for k in directive.release}
        capped = {_wire_key(e.key) for e in directive.caps}
        conflicting = released & capped
        for entry in directive.caps:
            if _wire_key(entry.key) in conflicting:
                reason: str | None = "conflicting_entries"
            else:
                reason = apply_entry(enforcer, entry)
            _count(ack, rejected, entry.key, reason, f"cap {entry.cap_cores!r}")
        for key in directive.release:
            if _wire_key(key) in conflicting:
                reason = "conflicting_entries"
            else:
                reason = release_entry(enforcer, key)
            _count(ack, rejected, key, reason, "release")
        epochs.last_applied = directive.epoch
        enforcer.rebalance_weights()
    return ack


def _wire_key(key: pb.InstanceKey) -> tuple[str, str, int]:
    return (key.app, key.operator, key.instance)


def _count(
    ack: pb.Ack, rejected: Counter, key: pb.InstanceKey, reason: str | None, what: str
) -> None:
    """Count one entry in the Ack: applied, or refused with its reason."""
    if reason is None:
        ack.applied += 1
        return
    rejected.labels(reason).inc()
    ack.rejected.append(pb.Rejection(key=key, reason=reason))
    log.warning("refused %s for %s/%s/%d: %s", what, key.app, key.operator, key.instance, reason)


def apply_entry(enforcer: CapEnforcer, entry: pb.InstanceCap) -> str | None:
    """Apply one cap; None when applied, else the reason it was refused."""
    try:
        key = make_key(entry.key.app, entry.key.operator, entry.key.instance)
    except RegistrationError:
        return "unknown_instance"
    rec = enforcer.registry.get(key)
    if rec is None:
        return "unknown_instance"
    cap = entry.cap_cores
    # `not (0 < cap <= ...)` is also true for NaN.
    if not math.isfinite(cap) or not 0 < cap <= enforcer.capacity_cores:
        return "cap_out_of_bounds"
    try:
        enforcer.apply_cap(rec, cap)
    except ThreadGone:
        return "thread_gone"
    except (CgroupError, InvalidName) as exc:
        enforcer.metrics.cgroup_errors.inc()
        log.error("cap for %s failed: %s", key, exc)
        return "cgroup_error"
    return None


def release_entry(enforcer: CapEnforcer, wire_key: pb.InstanceKey) -> str | None:
    """Remove one instance's cap; None when done (or it had none), else the reason refused."""
    try:
        key = make_key(wire_key.app, wire_key.operator, wire_key.instance)
    except RegistrationError:
        return "unknown_instance"
    if enforcer.registry.get(key) is None:
        return "unknown_instance"
    try:
        enforcer.release(key)
    except (CgroupError, InvalidName) as exc:
        enforcer.metrics.cgroup_errors.inc()
        log.error("releasing the cap of %s failed: %s", key, exc)
        return "cgroup_error"
    return None
