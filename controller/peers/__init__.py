"""Peer sizing policies: the controllers dsched is compared with, run by dsched's own
controller over the same views and through the same agents.

The config key ``policy`` chooses who sizes the caps: ``dsched`` (the default:
forecast, demand, allocation and hysteresis, controller/epoch.py) or one peer,
whose published rule then replaces those four stages
(:func:`controller.peers.epoch.run_peer_epoch`). The pure rules live in
:mod:`controller.peers.rules`, shared with the simulator's baselines; the
per-instance policies over the views in :mod:`controller.peers.policies`.
docs/live-benchmark.md ("Peers") says how each peer maps onto per-instance caps.
"""

from __future__ import annotations

from controller.peers.policies import (
    Ds2Sizing,
    ErrSizing,
    SizingPolicy,
    UtilTargetSizing,
    VpaSizing,
)
from dsched.registry import Registry

#: The MPC pipeline's name: not a peer, the controller's own stages.
DSCHED = "dsched"

#: Sizing policies by name (config key ``policy``); ``dsched`` builds nothing.
POLICIES: Registry[SizingPolicy | None] = Registry("sizing policy", "policy")
POLICIES.add(DSCHED, lambda: None)
POLICIES.add("ds2", Ds2Sizing)
POLICIES.add("util-target", UtilTargetSizing)
POLICIES.add("vpa", VpaSizing)
POLICIES.add("err", ErrSizing)

#: The peers, in the order benchmarks list them.
PEERS: tuple[str, ...] = ("ds2", "util-target", "vpa", "err")

__all__ = ["DSCHED", "PEERS", "POLICIES", "SizingPolicy"]
