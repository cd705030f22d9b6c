"""Where instance counts change: the parallelism stage's decisions carried out
(or only recorded) after the caps have gone out.

The decision is the pure stage's (:mod:`controller.stages.parallelism`); this
edge keeps its hysteresis state between epochs, hands changes to a
:class:`ParallelismActuator` chosen by name in ``[parallelism] actuator``, and
says what happened for the decision record's ``parallelism`` entry:

* ``recommend`` (default): decides and records, changes nothing. Flink and
  Storm cannot add or stop an instance of a running operator from outside
  without a restart, so for them the decision is only recorded
  (docs/parallelism.md).
* ``testbed``: posts the changes to the live testbed's endpoint
  (``POST <url>/rescale``, ``testbed/live/actuator.py``), which starts or stops
  instances of a running ``DistributedTopology`` and hands stateful key ranges
  over with their state.

The rescale contract shared with the testbed (the request body and
:class:`RescaleResult`) is defined here, so both ends use one definition.

The simulator brings its own actuator (``testbed/sim/parallelism.py``) through
:meth:`ParallelismEdge.use`.
"""

from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol

from controller.stages.parallelism import (
    OperatorSizing,
    decide_parallelism,
    per_instance_needs,
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
    """Changes instance counts; never raises for a change it cannot make.

    An actuator with ``blocking = True`` (its changes take seconds: a stateful
    rescale pauses the operator) is run off the epoch's thread by the edge; its
    outcome reaches the record of the first epoch after it finished."""

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


@dataclass
class RescaleResult:
    """What the testbed did with one change of an operator's instance count.

    ``done`` False: nothing changed and ``reason`` says why. ``done`` True with
    ``notes``: the count changed, but something needs attention (an instance
    that could start on no node waits, its tuples held, for a plan).
    """

    app: str
    operator: str
    before: int
    after: int
    done: bool
    reason: str | None = None
    started: list[str] = field(default_factory=list)
    stopped: list[str] = field(default_factory=list)
    # Keys of a stateful operator whose owner changed (they moved with their state).
    moved_keys: int = 0
    # How long the operator's input was held (0 for a stateless operator).
    pause_seconds: float = 0.0
    started_workers: list[str] = field(default_factory=list)
    stopped_workers: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RescaleResult:
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in known})


def rescale_request(changes: list[ParallelismChange]) -> dict[str, Any]:
    """The JSON body of ``POST /rescale`` for ``changes``."""
    return {
        "changes": [
            {"app": c.key.app, "operator": c.key.operator, "count": c.decided} for c in changes
        ]
    }


def parse_rescale_request(data: Any) -> list[tuple[str, str, int]]:
    """(app, operator, count) of every change in a ``POST /rescale`` body.

    ValueError naming the field when it is malformed. The count's range is the
    testbed's to judge: a count of 0 is a refusal with a reason, not a bad request.
    """
    if not isinstance(data, Mapping):
        raise ValueError(f"request must be a JSON object, got {type(data).__name__}")
    raw = data.get("changes")
    if not isinstance(raw, list):
        raise ValueError("field 'changes' must be a list")
    out = []
    for i, c in enumerate(raw):
        if not isinstance(c, Mapping):
            raise ValueError(f"field 'changes[{i}]' must be an object")
        for name in ("app", "operator"):
            if not isinstance(c.get(name), str) or not c[name]:
                raise ValueError(f"field 'changes[{i}].{name}' must be a non-empty string")
        count = c.get("count")
        if isinstance(count, bool) or not isinstance(count, int):
            raise ValueError(f"field 'changes[{i}].count' must be an integer, got {count!r}")
        out.append((c["app"], c["operator"], count))
    return out


class TestbedParallelism:
    """Posts instance-count changes to the live testbed (``POST <url>/rescale``).

    One request per epoch carries every change. A testbed that does not answer
    within ``timeout_seconds`` (or cannot be reached) is not asked again for
    ``retry_after_seconds``: a rescale that is slow rather than lost may still
    finish, and an epoch must not wait on a hung testbed every time.
    """

    name = "testbed"
    blocking = True
    __test__ = False  # not a pytest test class despite its name

    def __init__(
        self,
        url: str,
        timeout_seconds: float = 30.0,
        retry_after_seconds: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"url must start with http:// or https://, got {url!r}")
        if not timeout_seconds > 0:
            raise ValueError(f"timeout_seconds must be > 0, got {timeout_seconds!r}")
        if not retry_after_seconds >= 0:
            raise ValueError(f"retry_after_seconds must be >= 0, got {retry_after_seconds!r}")
        self.url = url.rstrip("/")
        self.timeout_seconds = timeout_seconds
        self.retry_after_seconds = retry_after_seconds
        self.clock = clock
        self.requests = 0
        self._failed_at: float | None = None
        self._failure = ""

    def apply(self, changes: list[ParallelismChange]) -> dict[OperatorKey, str | None]:
        if not changes:
            return {}
        try:
            return self._apply(changes)
        except Exception as exc:  # noqa: BLE001 - an odd reply must not stop the epoch
            log.exception("parallelism actuator testbed: unexpected failure")
            return {c.key: f"testbed actuator failed: {type(exc).__name__}: {exc}" for c in changes}

    def _apply(self, changes: list[ParallelismChange]) -> dict[OperatorKey, str | None]:
        now = self.clock()
        if self._failed_at is not None:
            waited = now - self._failed_at
            if waited < self.retry_after_seconds:
                why = (
                    f"not sent: the testbed failed {waited:.0f} s ago ({self._failure}); "
                    f"next try in {self.retry_after_seconds - waited:.0f} s"
                )
                return {c.key: why for c in changes}
        request = urllib.request.Request(
            f"{self.url}/rescale",
            data=json.dumps(rescale_request(changes)).encode(),
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        self.requests += 1
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_seconds) as reply:
                data = json.loads(reply.read())
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")
            self._failed_at = None
            return {
                c.key: f"testbed refused the request: HTTP {exc.code}: {detail}" for c in changes
            }
        except (OSError, ValueError) as exc:
            # Includes the timeout: the testbed may still carry the change out, and
            # the views will show it; asking again at once would only queue more work.
            self._failed_at, self._failure = self.clock(), f"{type(exc).__name__}: {exc}"
            why = f"testbed did not answer ({self._failure}); outcome unknown"
            return {c.key: why for c in changes}
        self._failed_at = None
        results: dict[OperatorKey, RescaleResult] = {}
        for item in data.get("results", ()) if isinstance(data, Mapping) else ():
            r = RescaleResult.from_dict(item)
            results[OperatorKey(r.app, r.operator)] = r
        out: dict[OperatorKey, str | None] = {}
        for c in changes:
            r = results.get(c.key)
            if r is None:
                out[c.key] = "the testbed did not report on this operator"
            elif r.done:
                out[c.key] = None
                for note in r.notes:
                    log.warning("rescale of %s: %s", c.key, note)
            else:
                out[c.key] = r.reason or "the testbed did not say why"
        return out


def _testbed(cfg: ParallelismConfig) -> TestbedParallelism:
    return TestbedParallelism(
        cfg.url, timeout_seconds=cfg.timeout_seconds, retry_after_seconds=cfg.retry_after_seconds
    )


#: Actuators by name (config key ``parallelism.actuator``); each factory gets the
#: ``[parallelism]`` config. The simulator's is not here: it needs the simulation.
PARALLELISM_ACTUATORS: Registry[ParallelismActuator] = Registry(
    "parallelism actuator", "parallelism.actuator"
)
PARALLELISM_ACTUATORS.add("recommend", lambda cfg=None: RecommendOnly())
PARALLELISM_ACTUATORS.add("testbed", _testbed)


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
        self.actuator: ParallelismActuator = PARALLELISM_ACTUATORS.create(config.actuator, config)
        self.models = models
        # An instance stopped by a scale-in keeps its slots in the views until it
        # is forgotten; till then the count set here is the truth, not the views'.
        self.settle_epochs = settle_epochs
        self._below: dict[OperatorKey, int] = {}
        self._set: dict[OperatorKey, tuple[int, int]] = {}  # key -> (count, epoch set)
        self.changes = 0
        # A blocking actuator's changes in flight: (epoch sent, changes, future).
        self._pool: ThreadPoolExecutor | None = None
        self._running: tuple[int, list[ParallelismChange], Future] | None = None

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

    def _apply(self, changes: list[ParallelismChange]) -> dict[OperatorKey, str | None]:
        try:
            return dict(self.actuator.apply(changes))
        except Exception as exc:  # noqa: BLE001 - a broken actuator must not stop epochs
            log.exception("parallelism actuator %s failed", self.actuator.name)
            return {c.key: f"actuator failed: {type(exc).__name__}: {exc}" for c in changes}

    def _completed(self, epoch: int) -> dict[str, Any] | None:
        """The outcome of the blocking changes in flight, once they finished (the
        counts they set hold from this epoch, as the views catch up)."""
        if self._running is None or not self._running[2].done():
            return None
        sent, changes, future = self._running
        self._running = None
        outcome = future.result()  # _apply never raises
        done = []
        for c in changes:
            why = outcome.get(c.key, "the actuator did not answer")
            if why is None:
                self._set[c.key] = (c.decided, epoch)
                self.changes += 1
            done.append(
                {
                    "app": c.key.app,
                    "operator": c.key.operator,
                    "current": c.current,
                    "decided": c.decided,
                    "outcome": "done" if why is None else f"recommend-only: {why}",
                }
            )
        return {"epoch": sent, "operators": done}

    def wait(self, timeout: float | None = None) -> bool:
        """Block until no change is in flight (True) or ``timeout`` passed (tests, stop)."""
        running = self._running
        if running is None:
            return True
        try:
            running[2].result(timeout)
        except TimeoutError:
            return False
        return True

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

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
        inputs = sizing_inputs(
            result.views, result.forecasts, result.demands, cfg.raise_lookahead_slots
        )
        # Operators whose views still show another count than the one set here.
        in_flight: set[OperatorKey] = set()
        for key, s in list(inputs.items()):
            set_to = self._set.get(key)
            if set_to is None:
                continue
            count, at = set_to
            if s.current == count or result.epoch - at > self.settle_epochs:
                del self._set[key]
            else:
                # Reachability is judged again below for the count set.
                inputs[key] = replace(s, current=count, unreachable=False)
                in_flight.add(key)
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

        def needs(sizing: dict[OperatorKey, OperatorSizing], fewer: int) -> dict:
            return per_instance_needs(
                sizing,
                result.budgets,
                arrival_scv=arrival_scv,
                service_scv=service_scv,
                model=result.latency_model,
                quantiles=quantiles,
                fewer=fewer,
            )

        try:
            # The demand stage judged reachability for the instances the views
            # show; where a change is in flight, judge it for the count set
            # (a new instance reports a slot late, and its operator's old
            # instances alone would look short of the target again).
            if in_flight:
                now = needs({k: inputs[k] for k in in_flight}, 0)
                for key, need in now.items():
                    if need > self.max_instance_cores:
                        inputs[key] = replace(inputs[key], unreachable=True)
            for key, need in needs(inputs, 1).items():
                inputs[key] = replace(inputs[key], need_one_fewer=need)
            rising = {
                k: replace(s, rate=s.rate_ahead)
                for k, s in inputs.items()
                if s.rate_ahead is not None
            }
            for key, need in needs(rising, 0).items():
                inputs[key] = replace(inputs[key], need_ahead=need)
        except ValueError:
            # Without the latency checks nothing is lowered on latency grounds
            # this epoch; the load rule still holds.
            log.warning("parallelism: latency needs per instance not solved", exc_info=True)
        decisions, self._below = decide_parallelism(
            inputs,
            self._below,
            limits=lambda k: cfg.limits(k.app, k.operator),
            max_instance_cores=self.max_instance_cores,
            lower_utilization=cfg.lower_utilization,
            patience=cfg.lower_patience_epochs,
            models=self.models,
            raise_together=cfg.raise_together,
        )
        changes = [
            ParallelismChange(k, d.current, d.decided, d.reason)
            for k, d in decisions.items()
            if d.decided != d.current
        ]
        outcome: dict[OperatorKey, str | None] = {}
        started: set[OperatorKey] = set()
        completed = self._completed(result.epoch)
        if completed is not None:
            row["completed"] = completed
        if changes and not enforce:
            outcome = {c.key: "dry-run" for c in changes}
        elif changes and self._running is not None:
            why = f"the changes sent in epoch {self._running[0]} are still being carried out"
            outcome = {c.key: why for c in changes}
        elif changes and getattr(self.actuator, "blocking", False):
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="dsched-parallelism")
            future = self._pool.submit(self._apply, changes)
            self._running = (result.epoch, changes, future)
            started = {c.key for c in changes}
        elif changes:
            outcome = self._apply(changes)
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
            elif key in started:
                entry.update(carried_out=False, outcome="started")
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
