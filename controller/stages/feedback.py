"""Latency feedback: each application's measured violations tighten its sizing.

The demand stage sizes an application from a queueing model of its operators
(stages/demand.py). Where the model understates the waits -- a heavy-tailed
burst, a service time that throttling stretches -- the application misses its
class although every operator meets its modelled budget. The controller sees
what the model cannot: the end-to-end latency its sinks report every slot.

Each application keeps a gain ``g`` in (0, 1]. The epoch sizes it for the
latency target times ``g`` and drains its queues within the drain span times
``g``. After every slot with a measured latency the gain moves by

    g <- clip(g * exp(rate * slot_seconds * e), min_gain, 1)

with ``e`` the error of the violation share over the last ``window`` measured
slots against the aim (``aim`` times the class's max_violation_ratio): from 0
to +1 as the share falls from the aim to none, from 0 to -1 as it rises from
the aim to every slot. An application over its aim is sized tighter until its
share comes down; one under it relaxes back to the model's sizing, never past
it: the gain only ever adds CPU where the measurement shows the model short.

Pure functions over small dataclasses; the controller's memory holds the
states and calls :func:`observe` once per epoch.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

from controller.qos import QosClass
from controller.stages.evaluate import OperatorView
from dsched.ids import OperatorKey

#: Fastest relative change of the gain per second of slots (at an error of +-1):
#: about 4 %/s, so a gain halves in some 17 s of slots all over target, and a
#: window of 30 s sees the effect of a change before the next doubles it.
RATE_PER_SECOND = 0.04
#: The tightest sizing the feedback may ask for: a quarter of the target.
MIN_GAIN = 0.25


@dataclass(frozen=True)
class FeedbackSettings:
    """What the memory needs to move the gains: the window (measured slots), the
    aim (share of each class's max_violation_ratio) and the slot length."""

    window: int
    aim: float
    slot_seconds: float


@dataclass
class FeedbackState:
    """One application's recent slots (True: its latency was over the target)
    and its gain."""

    window: int
    violated: deque[bool] = field(default_factory=deque)
    gain: float = 1.0
    # End of the newest slot taken: an epoch without a new slot moves nothing.
    seen: float = -math.inf

    def __post_init__(self) -> None:
        self.violated = deque(self.violated, maxlen=self.window)

    @property
    def share(self) -> float | None:
        """Share of the window's measured slots over the target (None: none yet)."""
        return sum(self.violated) / len(self.violated) if self.violated else None


def app_latencies_ms(
    views: Mapping[OperatorKey, OperatorView],
) -> dict[str, tuple[float, float]]:
    """Each application's measured end-to-end latency in its last slot (ms), the
    largest over its sinks, where root tuples complete, and the end of that slot.
    Applications whose sinks completed nothing are left out."""
    out: dict[str, tuple[float, float]] = {}
    for key, view in views.items():
        if view.latency_ms is not None:
            lat, end = out.get(key.app, (0.0, -math.inf))
            out[key.app] = (max(lat, view.latency_ms), max(end, view.last_timestamp))
    return out


def learn(
    states: dict[str, FeedbackState],
    views: Mapping[OperatorKey, OperatorView],
    classes: Mapping[str, QosClass],
    settings: FeedbackSettings,
) -> None:
    """Every application's newest measured slot into its state (a state is made
    at its first); states of applications without a class are dropped."""
    for app in [a for a in states if a not in classes]:
        del states[app]
    for app, (latency, end) in app_latencies_ms(views).items():
        qos = classes.get(app)
        if qos is None:
            continue
        state = states.setdefault(app, FeedbackState(settings.window))
        if end <= state.seen:
            continue
        state.seen = end
        observe(
            state,
            latency,
            qos.target_latency_ms,
            settings.aim * qos.max_violation_ratio,
            settings.slot_seconds,
        )


def error(share: float, aim: float) -> float:
    """The violation share's error against the aim, scaled to [-1, 1]."""
    if share <= aim:
        return (aim - share) / aim if aim > 0 else 0.0
    return (aim - share) / (1.0 - aim) if aim < 1 else 0.0


def observe(
    state: FeedbackState,
    latency_ms: float,
    target_ms: float,
    aim: float,
    slot_seconds: float,
) -> None:
    """Take one slot's measured latency and move the gain (``aim``: the share of
    slots over target aimed at, the class's max_violation_ratio times the
    configured aim)."""
    state.violated.append(latency_ms > target_ms)
    e = error(state.share or 0.0, aim)
    step = math.exp(RATE_PER_SECOND * slot_seconds * e)
    state.gain = min(1.0, max(MIN_GAIN, state.gain * step))
