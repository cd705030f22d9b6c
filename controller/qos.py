"""QoS classes and which application belongs to which.

Classes come from the controller's TOML (``[qos.classes.<name>]``); assignments
come from ``dschedctl qos set APP CLASS`` and live in SQLite, so they survive
a restart. An assignment for an application that has not reported yet is
accepted and held: it applies from the application's first epoch. An unknown
class is refused with a ValueError naming the known ones, and nothing changes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from controller.config import QosConfig
from controller.store import StateStore
from dsched.names import check_name


@dataclass(frozen=True)
class QosClass:
    name: str
    target_latency_ms: float
    max_violation_ratio: float
    weight: float

    @property
    def target_seconds(self) -> float:
        return self.target_latency_ms / 1000.0


@dataclass(frozen=True)
class QosAssignment:
    app: str
    qos_class: str
    app_known: bool
    defaulted: bool  # no assignment: the configured default applies


class QosRegistry:
    """Classes by name and persisted assignments by application."""

    def __init__(self, config: QosConfig, store: StateStore):
        self.classes = {
            name: QosClass(name, c.target_latency_ms, c.max_violation_ratio, c.weight)
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
