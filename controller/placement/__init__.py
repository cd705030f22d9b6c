"""Placement: which worker and node each operator instance runs on.

One interface, strategies chosen by name (``placement`` in the controller
config)::

    strategy = get_strategy("liu")
    plan = strategy.plan(state, headroom_cores=0.2)

``state`` is a :class:`PlacementInput` (nodes, workers, instances with predicted
demand, DAGs, measured traffic); the :class:`Plan` lists the moves, the new
assignment and what they cost (affected workers, stateful moves, nodes used,
inter-node traffic before and after). The package is pure: no I/O; carrying a
plan out belongs to an actuator.
"""

from __future__ import annotations

from controller.placement.aniello import AnielloOnlineStrategy
from controller.placement.baselines import (
    AnielloOfflineStrategy,
    EvenStrategy,
    RStormStrategy,
    SamStrategy,
)
from controller.placement.common import PlacementStrategy, apply_plan
from controller.placement.heron import FfdBestFitStrategy, RHeronStrategy, THeronStrategy
from controller.placement.liu import LiuStrategy
from controller.placement.mips import MipsAnytimeStrategy
from controller.placement.mips_paper import MipsStrategy
from controller.placement.model import (
    Instance,
    Move,
    Node,
    PlacementInput,
    Plan,
    Worker,
    instance_id,
)
from dsched.registry import Registry

DEFAULT_STRATEGY = "liu"

#: Placement strategies by name (config key ``placement``); each factory takes
#: the strategy's options (config table ``[placement_options.<name>]``).
STRATEGIES: Registry[PlacementStrategy] = Registry("placement strategy", "placement")
STRATEGIES.add("liu", LiuStrategy)
STRATEGIES.add("even", EvenStrategy)
STRATEGIES.add("rstorm", RStormStrategy)
STRATEGIES.add("sam", SamStrategy)
STRATEGIES.add("aniello-offline", AnielloOfflineStrategy)
STRATEGIES.add("aniello-online", AnielloOnlineStrategy)
STRATEGIES.add("mips", MipsStrategy)
STRATEGIES.add("mips-anytime", MipsAnytimeStrategy)
STRATEGIES.add("ffd-bestfit", FfdBestFitStrategy)
STRATEGIES.add("r-heron", RHeronStrategy)
STRATEGIES.add("t-heron", THeronStrategy)


def get_strategy(name: str = DEFAULT_STRATEGY, **options: object) -> PlacementStrategy:
    """The strategy called ``name``, built with ``options``.

    Unknown names (:class:`~dsched.registry.UnknownPlugin`, a ValueError) and
    unknown or out-of-range options raise ValueError.
    """
    factory = STRATEGIES.factory(name)
    try:
        return factory(**options)
    except TypeError as exc:
        raise ValueError(f"bad option for placement strategy {name!r}: {exc}") from None


__all__ = [
    "DEFAULT_STRATEGY",
    "STRATEGIES",
    "PlacementInput",
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
