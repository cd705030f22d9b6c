"""QoS classes and which application belongs to which.

Classes come from the controller's TOML (``[qos.classes.<name>]``); assignments
come from ``dschedctl qos set APP CLASS`` and live in SQLite, so they survive
a restart. An assignment for an application that has not reported yet is
accepted and held: it applies from the application's first epoch. An unknown
class is refused with a ValueError naming the known ones, and nothing changes.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Protocol

from dsched.config import ConfigError, require
from dsched.names import InvalidName, check_name


@dataclass(frozen=True)
class QosClass:
    """One QoS class: latency target, tolerated violation ratio, importance, and the
    forecast quantile its demand is sized for.

    In the config a class is the table ``[qos.classes.<name>]``; its ``name``
    comes from the table's key.
    """

    # The class's name (its table's key in the config).
    name: str = ""
    # Target end-to-end latency: its (1 - max_violation_ratio) quantile, or its mean
    # with latency_criterion = "mean".
    target_latency_ms: float = 1000.0
    # Share of tuples allowed over the target (0..1).
    max_violation_ratio: float = 0.1
    # Importance in the DP when CPU is short.
    weight: float = 1.0
    # Quantile of next slot's arrivals demand is sized for (0.5: the point forecast, or
    # with forecast_median on the median, the point corrected by its own recent errors;
    # higher: the forecast plus a conformal margin from those errors).
    forecast_quantile: float = 0.5

    @property
    def target_seconds(self) -> float:
        return self.target_latency_ms / 1000.0

    def validate(self) -> None:
        require(self.target_latency_ms > 0, "target_latency_ms", "must be > 0")
        require(
            0 < self.max_violation_ratio < 1,
            "max_violation_ratio",
            "must be between 0 and 1 (exclusive)",
        )
        require(self.weight > 0, "weight", "must be > 0")
        require(
            math.isfinite(self.forecast_quantile) and 0.5 <= self.forecast_quantile < 1,
            "forecast_quantile",
            "must be in [0.5, 1) (0.5: the point forecast)",
        )

    @property
    def sojourn_quantile(self) -> float:
        """The quantile of waiting + service time that must meet the target."""
        return 1.0 - self.max_violation_ratio


def default_qos_classes() -> dict[str, QosClass]:
    return {
        # Demand is sized above the point forecast where violations cost most: the
        # forecast's 0.9 quantile for gold, 0.75 for silver, the point (the median with
        # forecast_median on) for bronze.
        "gold": QosClass("gold", 100.0, 0.01, 8.0, forecast_quantile=0.9),
        "silver": QosClass("silver", 500.0, 0.10, 3.0, forecast_quantile=0.75),
        "bronze": QosClass("bronze", 2000.0, 0.50, 1.0),
    }


@dataclass
class QosConfig:
    """``[qos]``: the classes (``[qos.classes.<name>]``, replacing the defaults when
    given) and the class of applications nobody assigned."""

    # The class of applications nobody assigned.
    default_class: str = "bronze"
    # The classes; a `[qos.classes.<name>]` table replaces the defaults.
    classes: dict[str, QosClass] = field(default_factory=default_qos_classes)

    def validate(self) -> None:
        require(bool(self.classes), "classes", "at least one class is needed")
        # A class's name is its table's key.
        self.classes = {
            name: c if c.name == name else replace(c, name=name) for name, c in self.classes.items()
        }
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


class AssignmentStore(Protocol):
    """Where assignments persist (the controller's SQLite store)."""

    def set_qos(self, app: str, qos_class: str, at: float) -> None: ...

    def qos_assignments(self) -> dict[str, str]: ...


@dataclass(frozen=True)
class QosAssignment:
    app: str
    qos_class: str
    app_known: bool
    defaulted: bool  # no assignment: the configured default applies


class QosRegistry:
    """Classes by name and persisted assignments by application."""

    def __init__(self, config: QosConfig, store: AssignmentStore):
        self.classes = {
            name: c if c.name == name else replace(c, name=name)
            for name, c in sorted(config.classes.items())
        }
        self.default_class = config.default_class
        self.store = store
        self._assigned = store.qos_assignments()

    def set(self, app: str, qos_class: str, at: float) -> None:
        """Assign ``app`` to ``qos_class``; ValueError (and no change) when either is bad."""
        check_name("app", app)
        if qos_class not in self.classes:
            raise ValueError(f"unknown QoS class {qos_class!r} (known: {', '.join(self.classes)})")
        self.store.set_qos(app, qos_class, at)
        self._assigned[app] = qos_class

    def class_name_of(self, app: str) -> str:
        name = self._assigned.get(app, self.default_class)
        # A class removed from the config since the assignment falls back to
        # the default rather than stopping the loop.
        return name if name in self.classes else self.default_class

    def class_of(self, app: str) -> QosClass:
        return self.classes[self.class_name_of(app)]

    def assignments(self, known_apps: Iterable[str]) -> list[QosAssignment]:
        known = set(known_apps)
        apps = sorted(known | set(self._assigned))
        return [
            QosAssignment(app, self.class_name_of(app), app in known, app not in self._assigned)
            for app in apps
        ]
