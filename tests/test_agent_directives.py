"""handle_directive over a CapEnforcer: which entries apply, which are refused and why.

The enforcer writes through the ``none`` backend here (caps remembered, no file
touched); real cgroup writes under a directive are in test_agent_weights.py and
test_agent_link.py.
"""

from __future__ import annotations

import math

import pytest

from agent.cgroups import CgroupError, NoCgroups, ThreadGone
from agent.config import AgentConfig
from agent.directives import DirectiveEpochs, handle_directive
from agent.enforcer import CapEnforcer
from agent.metrics import AgentMetrics
from agent.node import NodeAgent
from agent.registry import Registry
from dsched.ids import InstanceKey
from dsched_pb import dsched_pb2 as pb

SPLIT = InstanceKey("wc", "split", 0)


def _enforcer(backend: NoCgroups | None = None, capacity: float = 2.0) -> CapEnforcer:
    registry = Registry()
    registry.register(SPLIT, "w1", False, pid=100, tid=101)
    return CapEnforcer(backend or NoCgroups(), registry, AgentMetrics(), capacity)


def _directive(epoch: int, *caps: tuple[str, str, int, float]) -> pb.CapDirective:
    return pb.CapDirective(
        epoch=epoch,
        caps=[
            pb.InstanceCap(key=pb.InstanceKey(app=a, operator=o, instance=i), cap_cores=c)
            for a, o, i, c in caps
        ],
    )


def _release(epoch: int, *keys: tuple[str, str, int]) -> pb.CapDirective:
    return pb.CapDirective(
        epoch=epoch,
        release=[pb.InstanceKey(app=a, operator=o, instance=i) for a, o, i in keys],
    )


def _rejected(enforcer: CapEnforcer, reason: str) -> float:
    value = enforcer.metrics.registry.get_sample_value(
        "dsched_agent_rejected_directives_total", {"reason": reason}
    )
    return value or 0.0


def test_directive_for_instances_the_agent_does_not_own_is_refused():
    enforcer = _enforcer()
    ack = handle_directive(
        enforcer,
        _directive(1, ("wc", "nosuch", 0, 0.5), ("wc", "split", 1, 0.5), ("../x", "split", 0, 0.5)),
        DirectiveEpochs(),
    )
    assert ack.epoch == 1 and ack.applied == 0 and not ack.stale
    assert [r.reason for r in ack.rejected] == ["unknown_instance"] * 3
    assert [(r.key.app, r.key.operator, r.key.instance) for r in ack.rejected] == [
        ("wc", "nosuch", 0),
        ("wc", "split", 1),
        ("../x", "split", 0),
    ]
    assert enforcer.caps == {} and enforcer.cgroups == {}
    assert _rejected(enforcer, "unknown_instance") == 3


@pytest.mark.parametrize("cap", [0.0, -0.0, -0.1, math.nan, math.inf, -math.inf, 2.0001])
def test_cap_outside_zero_to_node_cores_is_refused(cap):
    enforcer = _enforcer(capacity=2.0)
    ack = handle_directive(enforcer, _directive(1, ("wc", "split", 0, cap)), DirectiveEpochs())
    assert ack.applied == 0 and [r.reason for r in ack.rejected] == ["cap_out_of_bounds"]
    assert enforcer.caps == {} and enforcer.cgroups == {}
    assert _rejected(enforcer, "cap_out_of_bounds") == 1


def test_a_cap_of_zero_leaves_the_cap_in_force():
    enforcer = _enforcer(capacity=2.0)
    epochs = DirectiveEpochs()
    assert handle_directive(enforcer, _directive(1, ("wc", "split", 0, 0.5)), epochs).applied == 1
    ack = handle_directive(enforcer, _directive(2, ("wc", "split", 0, 0.0)), epochs)
    assert [r.reason for r in ack.rejected] == ["cap_out_of_bounds"]
    assert enforcer.caps == {SPLIT: 0.5}
    assert enforcer.backend.read_cap(enforcer.cgroups[SPLIT]) == 0.5


def test_cap_of_all_node_cores_applies_and_release_removes_it():
    enforcer = _enforcer(capacity=2.0)
    epochs = DirectiveEpochs()
    assert handle_directive(enforcer, _directive(1, ("wc", "split", 0, 2.0)), epochs).applied == 1
    assert enforcer.caps == {SPLIT: 2.0}
    path = enforcer.cgroups[SPLIT]
    assert enforcer.backend.read_cap(path) == 2.0
    ack = handle_directive(enforcer, _release(2, ("wc", "split", 0)), epochs)
    assert ack.applied == 1 and not ack.rejected
    assert enforcer.caps == {} and enforcer.cgroups == {}
    # Released again: nothing to do, still applied (directives are idempotent).
    assert handle_directive(enforcer, _release(3, ("wc", "split", 0)), epochs).applied == 1


@pytest.mark.parametrize("key", [("wc", "nosuch", 0), ("wc", "split", 1), ("../x", "split", 0)])
def test_release_of_an_unknown_instance_is_refused(key):
    enforcer = _enforcer()
    epochs = DirectiveEpochs()
    handle_directive(enforcer, _directive(1, ("wc", "split", 0, 0.5)), epochs)
    ack = handle_directive(enforcer, _release(2, key), epochs)
    assert ack.applied == 0 and [r.reason for r in ack.rejected] == ["unknown_instance"]
    assert (ack.rejected[0].key.app, ack.rejected[0].key.operator) == key[:2]
    assert enforcer.caps == {SPLIT: 0.5}
    assert _rejected(enforcer, "unknown_instance") == 1


def test_an_instance_capped_and_released_by_one_directive_is_refused_in_both():
    enforcer = _enforcer()
    epochs = DirectiveEpochs()
    handle_directive(enforcer, _directive(1, ("wc", "split", 0, 0.5)), epochs)
    both = _directive(2, ("wc", "split", 0, 0.7))
    both.release.append(pb.InstanceKey(app="wc", operator="split", instance=0))
    ack = handle_directive(enforcer, both, epochs)
    assert ack.applied == 0
    assert [r.reason for r in ack.rejected] == ["conflicting_entries"] * 2
    assert enforcer.caps == {SPLIT: 0.5}
    assert _rejected(enforcer, "conflicting_entries") == 2


def test_stale_epoch_changes_nothing_and_the_same_epoch_again_applies():
    enforcer = _enforcer()
    epochs = DirectiveEpochs()
    handle_directive(enforcer, _directive(5, ("wc", "split", 0, 0.5)), epochs)
    assert epochs.last_applied == 5
    ack = handle_directive(enforcer, _directive(4, ("wc", "split", 0, 0.9)), epochs)
    assert ack.stale and ack.epoch == 4 and ack.applied == 0 and not ack.rejected
    assert enforcer.caps == {SPLIT: 0.5} and epochs.last_applied == 5
    assert _rejected(enforcer, "stale_epoch") == 1
    # A controller may resend its epoch (a reconnect): not stale.
    ack = handle_directive(enforcer, _directive(5, ("wc", "split", 0, 0.7)), epochs)
    assert not ack.stale and ack.applied == 1 and enforcer.caps == {SPLIT: 0.7}


def test_controller_restarted_below_our_epoch_is_followed():
    epochs = DirectiveEpochs()
    assert not epochs.follow(3) and epochs.last_applied is None
    epochs.last_applied = 9
    assert not epochs.follow(12) and epochs.last_applied == 9
    assert epochs.follow(2) and epochs.last_applied == 2
    assert not epochs.is_stale(2) and epochs.is_stale(1)


class _FailingBackend(NoCgroups):
    def __init__(self, error: CgroupError):
        super().__init__()
        self.error = error

    def set_cap(self, path, cap_cores):
        raise self.error


@pytest.mark.parametrize(
    "error,reason,errors_counted",
    [
        (ThreadGone("thread 101 exited"), "thread_gone", 0),
        (CgroupError("EINVAL"), "cgroup_error", 1),
    ],
)
def test_enforcer_failures_are_refusals_with_their_reason(error, reason, errors_counted):
    enforcer = _enforcer(_FailingBackend(error))
    epochs = DirectiveEpochs()
    ack = handle_directive(enforcer, _directive(1, ("wc", "split", 0, 0.5)), epochs)
    assert ack.applied == 0 and [r.reason for r in ack.rejected] == [reason]
    assert SPLIT not in enforcer.caps
    assert _rejected(enforcer, reason) == 1
    errors = enforcer.metrics.registry.get_sample_value("dsched_agent_cgroup_errors_total")
    assert errors == errors_counted
    # The directive still counts as applied: the next one with a lower epoch is stale.
    assert epochs.last_applied == 1


def test_a_directive_renews_the_lease():
    agent = NodeAgent(AgentConfig(dry_run=True, slot_seconds=1, sample_seconds=1, lease_epochs=1))
    try:
        assert agent.check_lease(agent.last_contact + 1.5)
        agent.handle_directive(_directive(1))
        assert not agent.fallback_applied
        assert not agent.check_lease(agent.last_contact + 0.5)
    finally:
        agent.close()
