"""What the controller remembers between epochs, updated in one place.

The epoch (:func:`controller.epoch.run_epoch`) reads a :class:`MemoryView` and
returns an :class:`~controller.epoch.EpochResult`; :meth:`ControllerMemory.update`
is the only code that changes the memory, from that result. The history
table's seed after a restart comes in through :meth:`ControllerMemory.apply_seed`.

Held caps: an instance that stops reporting keeps its last cap (it may be
between two reports, or the controller has just restarted) for
``forget_after_slots`` epochs; after that it is dropped, and its cgroup goes
with its threads on the agent. An instance that reports without counters (its
engine's counters are missing) is held by the epoch itself, for as long as it
keeps reporting: its cap is in the result with reason "held", so ``update``
keeps it like any other.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Container, Mapping
from dataclasses import dataclass, field
from itertools import islice
from operator import attrgetter
from statistics import fmean
from types import MappingProxyType
from typing import TYPE_CHECKING, Protocol

from controller.stages.evaluate import SlotRows
from controller.stages.feedback import FeedbackState
from controller.stages.feedback import learn as learn_feedback
from controller.stages.forecast import SourceHistory
from controller.stages.hysteresis import HysteresisState
from controller.stages.variability import VariabilityMemory
from dsched.ids import InstanceKey, OperatorKey
from predict.intervals import ConformalBank

if TYPE_CHECKING:
    from controller.epoch import EpochResult


_state = attrgetter("state")  # of a HysteresisStep


class InstanceState(Protocol):
    """What the memory keeps per instance between epochs; every sizing policy's
    state has the cap it decided last (None: none yet)."""

    @property
    def cap(self) -> float | None: ...


def epochs_covering(seconds: float, slot_seconds: float) -> int:
    """How many epochs of ``slot_seconds`` cover ``seconds`` (at least one)."""
    return max(1, math.ceil(seconds / slot_seconds - 1e-9))


class DemandPeaks:
    """Each instance's recent demands: its highest over the last ``window``
    epochs, its mean over the last ``mean_window``, and (with a ``rise_window``)
    its mean over the last ``rise_window``.

    ``liu`` places stateful instances where their workers keep room for these
    peaks: a stateful worker that outgrows its node must carry its state
    elsewhere, a stateless one only restarts. Placement judges every instance
    by the mean (:meth:`means_with`): caps follow a load within an epoch, but a
    move pauses the instance, so moves are made for load that lasts (with a
    mean over one epoch, the demand now). The windows are runs of consecutive
    epochs, planned or not.

    A long mean sees a ramp late: until it catches up, the allocator cuts the
    caps on a full node while another node sits empty. With a shorter
    ``rise_window`` placement judges by the larger of the two means
    (:meth:`placement_with`): a rise is placed once the short mean shows it,
    while a fall is seen through the long one, so a node is not emptied the
    moment a level drops (as an autoscaler stabilises scale-down only). The
    short mean, not the lowest demand over the window, because a demand under
    caps swings from epoch to epoch: the lowest of a few epochs of a steep
    ramp lags it by the whole window.

    An instance that stops reporting is forgotten; one that comes back starts
    afresh. A demand that is not a finite number >= 0 does not enter the
    window, and the instance keeps the window it had.
    """

    def __init__(self, window: int, mean_window: int = 1, rise_window: int | None = None) -> None:
        windows = [("window", window), ("mean_window", mean_window)]
        if rise_window is not None:
            windows.append(("rise_window", rise_window))
        for name, value in windows:
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} (epochs) must be an int >= 1, got {value!r}")
        self.window = window
        self.mean_window = mean_window
        self.rise_window = rise_window
        self._demands: dict[InstanceKey, deque[float]] = {}

    @classmethod
    def for_slot(
        cls,
        peak_seconds: float,
        slot_seconds: float,
        mean_seconds: float = 0.0,
        rise_seconds: float = 0.0,
    ) -> DemandPeaks:
        """The windows covering ``peak_seconds``, ``mean_seconds`` and
        ``rise_seconds`` of epochs of ``slot_seconds`` (each at least one epoch;
        no rise window for ``rise_seconds`` 0)."""

        return cls(
            epochs_covering(peak_seconds, slot_seconds),
            epochs_covering(mean_seconds, slot_seconds),
            epochs_covering(rise_seconds, slot_seconds) if rise_seconds > 0 else None,
        )

    def _with(self, demands: Mapping[InstanceKey, float], span: int, reduce) -> dict:
        out: dict[InstanceKey, float] = {}
        keep = span - 1
        for key, demand in demands.items():
            if not _good(demand):
                continue
            seen = self._demands.get(key)
            # The newest ``keep`` (all of a window not yet full), without
            # copying the rest of a long window.
            past = list(islice(reversed(seen), keep)) if seen and keep else []
            out[key] = reduce([*past, float(demand)])
        return out

    def peaks_with(self, demands: Mapping[InstanceKey, float]) -> dict[InstanceKey, float]:
        """Each good demand's peak once this epoch is in the window (read only)."""
        return self._with(demands, self.window, max)

    def means_with(self, demands: Mapping[InstanceKey, float]) -> dict[InstanceKey, float]:
        """Each good demand's mean over ``mean_window`` epochs once this epoch is in
        it (read only; fewer epochs where fewer were seen)."""
        return self._with(demands, self.mean_window, fmean)

    def placement_with(self, demands: Mapping[InstanceKey, float]) -> dict[InstanceKey, float]:
        """Each good demand as placement judges it (read only): its mean over
        ``mean_window``, or with a ``rise_window`` the larger of that mean and its
        mean over the rise window (fewer epochs where fewer were seen)."""
        means = self.means_with(demands)
        if self.rise_window is None:
            return means
        rising = self._with(demands, self.rise_window, fmean)
        return {key: max(mean, rising[key]) for key, mean in means.items()}

    def observe(self, demands: Mapping[InstanceKey, float]) -> dict[InstanceKey, float]:
        """Put this epoch's demands in the window; instance -> its peak."""
        peaks = self.peaks_with(demands)
        self.advance(demands)
        return peaks

    def advance(
        self, demands: Mapping[InstanceKey, float], keep: Container[InstanceKey] = ()
    ) -> None:
        """Put this epoch's demands in the window (the epoch already read the peaks).

        Instances in ``keep`` (held: alive, but unmeasured this epoch) keep their
        window as it is."""
        span = max(self.window, self.mean_window, self.rise_window or 1)
        for key, demand in demands.items():
            if not _good(demand):
                continue
            seen = self._demands.get(key)
            if seen is None:
                seen = self._demands[key] = deque(maxlen=span)
            seen.append(float(demand))
        for key in set(self._demands) - set(demands):
            if key not in keep:
                del self._demands[key]


def _good(value: object) -> bool:
    return (
        not isinstance(value, bool)
        and isinstance(value, int | float)
        and math.isfinite(value)
        and value >= 0
    )


@dataclass(frozen=True)
class MemoryView:
    """The memory as the epoch sees it: read-only mappings and the two models it asks.

    ``sources`` and ``peaks`` are read through their query methods only
    (``series_with``/``predict``, ``peaks_with``).
    """

    hysteresis: Mapping[InstanceKey, InstanceState]
    kappa: Mapping[OperatorKey, float]
    sources: SourceHistory | None
    peaks: DemandPeaks | None
    #: Each operator's recent one-step forecast errors (read with ``upper`` only).
    forecast_bank: ConformalBank | None = None
    #: Each operator's recent slot totals (read with ``window`` only).
    variability: VariabilityMemory | None = None
    #: Each application's latency-feedback gain (stages/feedback.py; 1 where absent).
    latency_gain: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))


@dataclass
class ControllerMemory:
    """Hysteresis, held caps, CPU-per-tuple memory, source history, demand peaks,
    forecast errors."""

    forget_after_slots: int
    sources: SourceHistory | None = None
    peaks: DemandPeaks | None = None
    #: Each instance's state from the last epoch: dsched's HysteresisState, or the
    #: peer's own under a peer policy (controller/peers); both start with ``cap``.
    hysteresis: dict[InstanceKey, InstanceState] = field(default_factory=dict)
    #: The caps in force: instance -> (node, cores); held ones included.
    caps: dict[InstanceKey, tuple[str, float]] = field(default_factory=dict)
    #: Instances whose cap is held without a report -> the epoch the hold began.
    held_since: dict[InstanceKey, int] = field(default_factory=dict)
    # The caps the last commit_caps held (its learn keeps their hysteresis state).
    _held_now: dict[InstanceKey, tuple[str, float]] = field(default_factory=dict, repr=False)
    #: Last measured CPU per tuple of each operator (for operators idle this window).
    kappa: dict[OperatorKey, float] = field(default_factory=dict)
    #: Recent one-step errors of each operator's point forecast (conformal scores),
    #: created by the first update with the tracked quantiles of the classes.
    forecast_bank: ConformalBank | None = None
    #: Each operator's last point forecast and the end of the slot it was made
    #: after: the next newer slot scores it.
    last_forecast: dict[OperatorKey, tuple[float, float]] = field(default_factory=dict)
    #: What evaluate read from the slots last epoch: a cache of values that
    #: cannot change (slots are frozen), not a memory the decisions depend on.
    slot_rows: SlotRows = field(default_factory=SlotRows, compare=False, repr=False)
    #: Each operator's last slot totals, for measuring its arrival and service C².
    variability: VariabilityMemory = field(default_factory=VariabilityMemory)
    #: Each application's measured violations and latency-feedback gain.
    latency_feedback: dict[str, FeedbackState] = field(default_factory=dict)

    @classmethod
    def resumed(
        cls,
        caps: Mapping[InstanceKey, tuple[str, float]],
        epoch: int,
        forget_after_slots: int,
        sources: SourceHistory | None = None,
        peaks: DemandPeaks | None = None,
    ) -> ControllerMemory:
        """After a restart: the persisted caps, held until their instances report.

        The first epochs hold those caps unless the inputs say otherwise, so a
        crash does not make caps thrash."""
        return cls(
            forget_after_slots=forget_after_slots,
            sources=sources,
            peaks=peaks,
            hysteresis={k: HysteresisState(cap=c) for k, (_, c) in caps.items()},
            caps=dict(caps),
            held_since=dict.fromkeys(caps, epoch),
        )

    def view(self) -> MemoryView:
        return MemoryView(
            MappingProxyType(self.hysteresis),
            MappingProxyType(self.kappa),
            self.sources,
            self.peaks,
            self.forecast_bank,
            self.variability,
            MappingProxyType({app: s.gain for app, s in self.latency_feedback.items()}),
        )

    def apply_seed(
        self,
        kappa: Mapping[OperatorKey, float],
        source_rates: Mapping[OperatorKey, tuple[float, ...]],
    ) -> None:
        """Fill what the fast loop lacks from the history table: CPU per tuple of
        operators never measured here, arrivals of sources from before the
        controller's own memory."""
        for key, value in kappa.items():
            self.kappa.setdefault(key, value)
        if self.sources is not None:
            for key, rates in source_rates.items():
                if rates:
                    self.sources.prepend(key, rates)

    def update(self, result: EpochResult) -> None:
        """Take in one epoch's result; the only writer of this memory."""
        self.commit_caps(result)
        self.learn(result)

    def commit_caps(self, result: EpochResult) -> None:
        """The caps in force after the epoch: its own, and those it held. The
        first half of :meth:`update`, all a directive needs; the epoch sends its
        directives before it calls :meth:`learn`."""
        epoch = result.epoch
        # Set operations between dicts reuse the hashes the dicts store; a loop
        # over 20,000 instance keys would hash each again.
        for key in [k for k in self.held_since if k in result.caps]:
            del self.held_since[key]
        missing = set(self.caps)
        missing.difference_update(result.caps)
        held: dict[InstanceKey, tuple[str, float]] = {}
        for key in [k for k in self.caps if k in missing] if missing else ():
            since = self.held_since.setdefault(key, epoch)
            if epoch - since < self.forget_after_slots:
                held[key] = self.caps[key]
            else:
                self.held_since.pop(key, None)
        self.caps = {**held, **result.caps}
        self._held_now = held

    def learn(self, result: EpochResult) -> None:
        """What the next epochs start from: CPU per tuple, source series, demand
        peaks, forecast scores and hysteresis state (after :meth:`commit_caps`)."""
        self.kappa.update(result.kappa_measured)
        if self.sources is not None:
            for key, (timestamp, value) in result.source_points.items():
                self.sources.observe(key, timestamp, value)
            # A source whose instances are all held keeps its series for when
            # its counters return.
            self.sources.forget_except(set(result.views) | {k.operator_key for k in result.held})
        if self.peaks is not None:
            self.peaks.advance(
                {k: d.cores - d.backlog_cores for k, d in result.demands.items()}, keep=result.held
            )
        self._score_forecasts(result)
        if result.variability_slots:
            self.variability.observe(result.views, result.variability_slots)
        if result.feedback is not None:
            learn_feedback(self.latency_feedback, result.views, result.classes, result.feedback)
        held = self._held_now
        hysteresis = {k: s for k, s in self.hysteresis.items() if k in held} if held else {}
        hysteresis.update(zip(result.steps, map(_state, result.steps.values()), strict=True))
        self.hysteresis = hysteresis

    def _score_forecasts(self, result: EpochResult) -> None:
        """Score last epoch's point forecasts against the slot they predicted, keep
        this epoch's, and forget operators that are gone (their instances neither
        reported nor are held)."""
        levels = tuple(result.forecast_levels)
        if self.forecast_bank is None or tuple(self.forecast_bank.levels.tolist()) != levels:
            self.forecast_bank = ConformalBank(levels=levels)
        keys, actual, predicted = [], [], []
        for key, view in result.views.items():
            last = self.last_forecast.get(key)
            if last is not None and len(view.arrivals) and view.last_timestamp > last[1]:
                keys.append(key)
                actual.append(float(view.arrivals[-1]))
                predicted.append(last[0])
        if keys:
            self.forecast_bank.update(keys, actual, predicted)
        live = set(result.views) | {k.operator_key for k in result.held}
        fresh = {
            k: (fc.rate, result.views[k].last_timestamp)
            for k, fc in result.forecasts.items()
            if k in result.views and math.isfinite(fc.rate)
        }
        # A held operator keeps its last forecast for when its counters return.
        self.last_forecast = {
            **{k: v for k, v in self.last_forecast.items() if k in live and k not in fresh},
            **fresh,
        }
        self.forecast_bank.forget_except(live)
