"""Placement: which worker and node each operator instance runs on.

One interface, strategies chosen by name (``placement`` in the controller
config)::

    strategy = get_strategy("liu")
    plan = strategy.plan(state, headroom_cores=0.2)

``state`` is a :class:`ClusterState` (nodes, workers, instances with predicted
demand, DAGs, measured traffic); the :class:`Plan` lists the moves, the new
assignment and what they cost (affected workers, stateful moves, nodes used,
inter-node traffic before and after). The package is pure: no I/O; carrying a
plan out belongs to an actuator.
"""

from __future__ import annotations

from collections.abc import Callable

from controller.placement.baselines import (
    AnielloOfflineStrategy,
    AnielloOnlineStrategy,
    EvenStrategy,
    RStormStrategy,
    SamStrategy,
)
from controller.placement.common import PlacementStrategy, apply_plan
from controller.placement.liu import LiuStrategy
from controller.placement.mips import MipsStrategy
from controller.placement.model import (
    ClusterState,
    Instance,
    Move,
    Node,
    Plan,
    Worker,
    instance_id,
)

DEFAULT_STRATEGY = "liu"

STRATEGIES: dict[str, Callable[..., PlacementStrategy]] = {
    "liu": LiuStrategy,
    "even": EvenStrategy,
    "rstorm": RStormStrategy,
    "sam": SamStrategy,
    "aniello-offline": AnielloOfflineStrategy,
    "aniello-online": AnielloOnlineStrategy,
    "mips": MipsStrategy,
}


def get_strategy(name: str = DEFAULT_STRATEGY, **options: object) -> PlacementStrategy:
    """The strategy called ``name``, built with ``options``.

    Unknown names and unknown or out-of-range options raise ValueError.
    """
    if name not in STRATEGIES:
        raise ValueError(
            f"unknown placement strategy {name!r}; known: {', '.join(sorted(STRATEGIES))}"
        )
    try:
        return STRATEGIES[name](**options)
    except TypeError as exc:
        raise ValueError(f"bad option for placement strategy {name!r}: {exc}") from None


__all__ = [
    "DEFAULT_STRATEGY",
    "STRATEGIES",
    "ClusterState",
    "Instance",
    "Move",
    "Node",
    "Plan",
    "PlacementStrategy",
    "Worker",
    "apply_plan",
    "get_strategy",
    "instance_id",
]
