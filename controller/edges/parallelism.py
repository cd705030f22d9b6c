"""Where instance counts change: the parallelism stage's decisions carried out
(or only recorded) after the caps have gone out.

The decision is the pure stage's (:mod:`controller.stages.parallelism`); this
edge keeps its hysteresis state between epochs, hands changes to a
:class:`ParallelismActuator` chosen by name in ``[parallelism] actuator``, and
says what happened for the decision record's ``parallelism`` entry:

* ``recommend`` (default): decides and records, changes nothing. No engine
  dsched drives today can add or stop an instance of a running operator from
  outside without losing its state or its key ranges, so carrying a decision
  out is left to an actuator that knows how (docs/parallelism.md).

The simulator brings its own actuator (``testbed/sim/parallelism.py``) through
:meth:`ParallelismEdge.use`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol

from controller.stages.parallelism import (
    decide_parallelism,
    needs_with_one_fewer,
    sizing_inputs,
)
from dsched.ids import OperatorKey
from dsched.registry import Registry
from predict.perfmodel import PerformanceModel

if TYPE_CHECKING:
    from controller.config import ControllerConfig, ParallelismConfig
    from controller.epoch import EpochResult

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ParallelismChange:
    key: OperatorKey
    current: int
    decided: int
    reason: str


class ParallelismActuator(Protocol):
    """Changes instance counts; never raises for a change it cannot make."""

    name: str

    def apply(self, changes: list[ParallelismChange]) -> dict[OperatorKey, str | None]:
        """Per change: None when carried out, else why not (recorded as recommend-only)."""
        ...


class RecommendOnly:
    """Records the decisions; the engine's instance counts stay as they are."""

    name = "recommend"

    def apply(self, changes: list[ParallelismChange]) -> dict[OperatorKey, str | None]:
        why = "[parallelism] actuator is recommend (no engine actuator configured)"
        return {c.key: why for c in changes}


#: Actuators by name (config key ``parallelism.actuator``). The simulator's is
#: not here: it needs the simulation.
PARALLELISM_ACTUATORS: Registry[ParallelismActuator] = Registry(
    "parallelism actuator", "parallelism.actuator"
)
PARALLELISM_ACTUATORS.add("recommend", lambda cfg=None: RecommendOnly())


class ParallelismEdge:
    """Runs the stage once per epoch, acts through the actuator, reports."""

    def __init__(
        self,
        config: ParallelismConfig,
        *,
        max_instance_cores: float,
        settle_epochs: int = 6,
        models: Mapping[OperatorKey | str, PerformanceModel] | None = None,
        arrival_scv: float = 1.0,
        service_scv: float = 1.0,
    ):
        self.config = config
        self.max_instance_cores = max_instance_cores
        self.arrival_scv = arrival_scv
        self.service_scv = service_scv
        self.actuator: ParallelismActuator = PARALLELISM_ACTUATORS.create(config.actuator)
        self.models = models
        # An instance stopped by a scale-in keeps its slots in the views until it
        # is forgotten; till then the count set here is the truth, not the views'.
        self.settle_epochs = settle_epochs
        self._below: dict[OperatorKey, int] = {}
        self._set: dict[OperatorKey, tuple[int, int]] = {}  # key -> (count, epoch set)
        self.changes = 0

    @classmethod
    def from_config(
        cls,
        config: ControllerConfig,
        models: Mapping[OperatorKey | str, PerformanceModel] | None = None,
    ) -> ParallelismEdge:
        return cls(
            config.parallelism,
            max_instance_cores=config.max_instance_cores,
            settle_epochs=config.forget_after_slots + 1,
            models=models,
            arrival_scv=config.arrival_scv,
            service_scv=config.service_scv,
        )

    def use(self, actuator: ParallelismActuator) -> None:
        """Carry out decisions through ``actuator`` from now on (the simulator's own)."""
        self.actuator = actuator

    def set_models(self, models: Mapping[OperatorKey | str, PerformanceModel] | None) -> None:
        """Performance models by operator (MBA); None: one instance more or fewer for all."""
        self.models = models

    def offer(self, result: EpochResult, *, enforce: bool) -> dict[str, Any]:
        """Once per epoch after the caps are sent; the record's ``parallelism`` entry."""
        cfg = self.config
        row: dict[str, Any] = {
            "enabled": cfg.enabled,
            "actuator": self.actuator.name,
            "operators": [],
        }
        if not cfg.enabled:
            return row
        inputs = sizing_inputs(result.views, result.forecasts, result.demands)
        for key, s in list(inputs.items()):
            set_to = self._set.get(key)
            if set_to is None:
                continue
            count, at = set_to
            if s.current == count or result.epoch - at > self.settle_epochs:
                del self._set[key]
            else:
                inputs[key] = replace(s, current=count)
        quantiles = (
            {a: c.sojourn_quantile for a, c in result.classes.items()}
            if result.latency_criterion == "quantile"
            else None
        )
        # Measured per operator where the epoch measured them, else the configured.
        measured = getattr(result, "variability", None) or {}
        arrival_scv: float | dict = self.arrival_scv
        service_scv: float | dict = self.service_scv
        if measured:
            arrival_scv = {k: v.arrival_scv for k, v in measured.items()}
            service_scv = {k: v.service_scv for k, v in measured.items()}
        try:
            fewer = needs_with_one_fewer(
                inputs,
                result.budgets,
                arrival_scv=arrival_scv,
                service_scv=service_scv,
                model=result.latency_model,
                quantiles=quantiles,
            )
        except ValueError:
            # Without the M- latency check nothing is lowered on latency grounds
            # this epoch; the load rule still holds.
            log.warning("parallelism: latency with one instance fewer not solved", exc_info=True)
            fewer = {}
        for key, need in fewer.items():
            inputs[key] = replace(inputs[key], need_one_fewer=need)
        decisions, self._below = decide_parallelism(
            inputs,
            self._below,
            limits=lambda k: cfg.limits(k.app, k.operator),
            max_instance_cores=self.max_instance_cores,
            lower_utilization=cfg.lower_utilization,
            patience=cfg.lower_patience_epochs,
            models=self.models,
        )
        changes = [
            ParallelismChange(k, d.current, d.decided, d.reason)
            for k, d in decisions.items()
            if d.decided != d.current
        ]
        outcome: dict[OperatorKey, str | None] = {}
        if changes and not enforce:
            outcome = {c.key: "dry-run" for c in changes}
        elif changes:
            try:
                outcome = dict(self.actuator.apply(changes))
            except Exception as exc:  # noqa: BLE001 - a broken actuator must not stop epochs
                log.exception("parallelism actuator %s failed", self.actuator.name)
                outcome = {c.key: f"actuator failed: {type(exc).__name__}: {exc}" for c in changes}
        for key, d in sorted(decisions.items()):
            entry: dict[str, Any] = {
                "app": key.app,
                "operator": key.operator,
                "current": d.current,
                "decided": d.decided,
                "rule": d.rule,
                "reason": d.reason,
            }
            if d.decided == d.current:
                entry.update(carried_out=False, outcome="unchanged")
            else:
                why = outcome.get(key, "the actuator did not answer")
                if why is None:
                    entry.update(carried_out=True, outcome="done")
                    self._set[key] = (d.decided, result.epoch)
                    self.changes += 1
                else:
                    entry.update(carried_out=False, outcome=f"recommend-only: {why}")
            row["operators"].append(entry)
        row["changed"] = sum(1 for e in row["operators"] if e["outcome"] != "unchanged")
        return row
