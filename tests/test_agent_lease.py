"""The lease: silence from the controller, then the fallback policy, once.

Real cgroup files under each policy are in test_agent_link.py
(test_lease_expiry_applies_fallback_once); here the enforcer's ``none`` backend
keeps the caps in memory.
"""

from __future__ import annotations

import pytest

from agent.cgroups import NoCgroups
from agent.enforcer import CapEnforcer
from agent.lease import Lease
from agent.metrics import AgentMetrics
from agent.registry import Registry
from dsched.ids import InstanceKey

KEYS = [InstanceKey("wc", "count", 0), InstanceKey("wc", "split", 0)]


@pytest.fixture
def enforcer() -> CapEnforcer:
    registry = Registry()
    enforcer = CapEnforcer(NoCgroups(), registry, AgentMetrics(), capacity_cores=4.0)
    for n, key in enumerate(KEYS):
        registry.register(key, "w1", False, pid=100, tid=101 + n)
        enforcer.apply_cap(registry.get(key), 0.5)
    return enforcer


def _fallbacks(lease: Lease, policy: str) -> float:
    value = lease.metrics.registry.get_sample_value(
        "dsched_agent_fallbacks_total", {"policy": policy}
    )
    return value or 0.0


def test_fallback_applies_once_after_the_silent_slots_and_contact_ends_it(enforcer):
    lease = Lease(slots=3, slot_seconds=2.0, metrics=enforcer.metrics, last_contact=100.0)
    assert lease.seconds == 6.0
    assert not lease.check(enforcer, "hold", now=105.9)
    assert lease.check(enforcer, "hold", now=106.0)
    assert lease.fallback_applied
    assert not lease.check(enforcer, "hold", now=500.0)
    assert _fallbacks(lease, "hold") == 1
    lease.renew(now=600.0)
    assert not lease.fallback_applied and lease.last_contact == 600.0
    assert not lease.check(enforcer, "hold", now=605.0)
    assert lease.check(enforcer, "hold", now=606.0)
    assert _fallbacks(lease, "hold") == 2


def test_hold_keeps_every_cap(enforcer):
    lease = Lease(slots=1, slot_seconds=1.0, metrics=enforcer.metrics, last_contact=0.0)
    assert lease.check(enforcer, "hold", now=1.0)
    assert enforcer.caps == dict.fromkeys(KEYS, 0.5)


def test_release_removes_every_cap_down_to_the_files(enforcer):
    paths = [enforcer.cgroups[k] for k in KEYS]
    lease = Lease(slots=1, slot_seconds=1.0, metrics=enforcer.metrics, last_contact=0.0)
    assert lease.check(enforcer, "release", now=1.0)
    assert enforcer.caps == {}
    assert [enforcer.backend.read_cap(p) for p in paths] == [None, None]
    assert _fallbacks(lease, "release") == 1


def test_unknown_policy_is_an_error_not_a_silent_hold(enforcer):
    lease = Lease(slots=1, slot_seconds=1.0, metrics=enforcer.metrics, last_contact=0.0)
    with pytest.raises(ValueError, match="fallback"):
        lease.check(enforcer, "panic", now=1.0)
    assert not lease.fallback_applied
