"""A CapDirective in, an Ack out: what the agent does with the controller's caps.

Each entry is checked before anything is written: an instance this agent does
not hold is ``unknown_instance``, a cap outside (0, node cores] is
``cap_out_of_bounds`` (0 removes the cap), and the enforcer's failures become
``thread_gone`` or ``cgroup_error``. A directive older than the last one applied
is answered ``stale`` and changes nothing. docs/agent.md, "Link and fallback
policy", lists the reasons as the controller sees them.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

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
        for entry in directive.caps:
            reason = apply_entry(enforcer, entry)
            if reason is None:
                ack.applied += 1
                continue
            rejected.labels(reason).inc()
            ack.rejected.append(pb.Rejection(key=entry.key, reason=reason))
            log.warning(
                "refused cap %r for %s/%s/%d: %s",
                entry.cap_cores,
                entry.key.app,
                entry.key.operator,
                entry.key.instance,
                reason,
            )
        epochs.last_applied = directive.epoch
        enforcer.rebalance_weights()
    return ack


def apply_entry(enforcer: CapEnforcer, entry: pb.InstanceCap) -> str | None:
    """Apply one entry; None when applied, else the reason it was refused."""
    try:
        key = make_key(entry.key.app, entry.key.operator, entry.key.instance)
    except RegistrationError:
        return "unknown_instance"
    rec = enforcer.registry.get(key)
    if rec is None:
        return "unknown_instance"
    cap = entry.cap_cores
    if not math.isfinite(cap) or cap < 0 or cap > enforcer.capacity_cores:
        return "cap_out_of_bounds"
    try:
        enforcer.apply_cap(rec, None if cap == 0 else cap)
    except ThreadGone:
        return "thread_gone"
    except (CgroupError, InvalidName) as exc:
        enforcer.metrics.cgroup_errors.inc()
        log.error("cap for %s failed: %s", key, exc)
        return "cgroup_error"
    return None
