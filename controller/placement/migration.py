"""Where placement plans leave the controller: the move actuators (step 8 of the
epoch, for moves), and the move contract shared with the testbed.

One interface, :class:`MoveActuator`, with ``execute(plan) -> MoveResult``,
and implementations chosen by name (:func:`get_move_actuator`):

- ``log-only``: dry-run; records what would have moved and moves nothing;
- ``testbed``: posts the plan as JSON to the live testbed's move endpoint
  (``testbed/live/actuator.py``), which pauses, drains, snapshots, restarts
  and re-registers the instances and answers with what it did.

Engine actuators (Storm rebalance, Flink savepoint/restore) implement the same
protocol. Plans cross process boundaries as JSON through :func:`plan_to_dict`
and :func:`plan_from_dict`.
"""

from __future__ import annotations

import json
import logging
import math
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from controller.placement.model import Move, Plan, Recommendation, Worker
from dsched.registry import Registry

log = logging.getLogger(__name__)


@dataclass
class MoveResult:
    """What an actuator did with a plan; reasons keyed by instance id."""

    actuator: str
    executed: bool
    moved: list[str] = field(default_factory=list)
    restarted: list[str] = field(default_factory=list)
    rolled_back: dict[str, str] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)
    affected_workers: list[str] = field(default_factory=list)
    started_workers: list[str] = field(default_factory=list)
    stopped_workers: list[str] = field(default_factory=list)
    pause_seconds: float = 0.0
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, actuator: str, data: Mapping[str, Any]) -> MoveResult:
        known = {f for f in cls.__dataclass_fields__ if f not in ("actuator", "executed")}
        return cls(
            actuator=actuator,
            executed=bool(data.get("executed", True)),
            **{k: v for k, v in data.items() if k in known},
        )


class MoveActuator(Protocol):
    name: str

    def execute(self, plan: Plan) -> MoveResult: ...


def plan_to_dict(plan: Plan) -> dict[str, Any]:
    """A JSON-ready form of ``plan`` (tuples become lists, the assignment a dict of pairs)."""
    data = asdict(plan)
    data["assignment"] = {k: list(v) for k, v in plan.assignment.items()}
    return data


def _float(data: Mapping[str, Any], key: str) -> float:
    value = data.get(key, 0.0)
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        raise ValueError(f"plan field {key!r} must be a number, got {value!r}")
    return float(value)


def plan_from_dict(data: Any) -> Plan:
    """The :class:`Plan` in ``data``; ValueError naming the field when it is malformed."""
    if not isinstance(data, Mapping):
        raise ValueError(f"plan must be a JSON object, got {type(data).__name__}")
    moves_raw = data.get("moves")
    if not isinstance(moves_raw, list):
        raise ValueError("plan field 'moves' must be a list")
    moves = []
    for i, m in enumerate(moves_raw):
        if not isinstance(m, Mapping):
            raise ValueError(f"plan field 'moves[{i}]' must be an object")
        try:
            move = Move(**{k: m[k] for k in Move.__dataclass_fields__})
        except KeyError as exc:
            raise ValueError(f"plan field 'moves[{i}]' lacks {exc.args[0]!r}") from None
        for name in ("instance", "to_worker", "to_node"):
            if not isinstance(getattr(move, name), str) or not getattr(move, name):
                raise ValueError(f"plan field 'moves[{i}].{name}' must be a non-empty string")
        if not isinstance(move.stateful, bool):
            raise ValueError(f"plan field 'moves[{i}].stateful' must be true or false")
        moves.append(move)
    workers = tuple(Worker(**w) for w in data.get("workers", ()))
    recommended = []
    for i, r in enumerate(data.get("recommended", ())):
        try:
            move = Move(**{k: r["move"][k] for k in Move.__dataclass_fields__})
            recommended.append(Recommendation(move, str(r["reason"])))
        except (KeyError, TypeError) as exc:
            raise ValueError(f"plan field 'recommended[{i}]' lacks {exc}") from None
    return Plan(
        strategy=str(data.get("strategy", "")),
        moves=tuple(moves),
        assignment={k: tuple(v) for k, v in dict(data.get("assignment", {})).items()},
        workers=workers,
        affected_workers=tuple(data.get("affected_workers", ())),
        affected_stateful_workers=tuple(data.get("affected_stateful_workers", ())),
        new_workers=tuple(data.get("new_workers", ())),
        stateful_moves=int(data.get("stateful_moves", 0)),
        restarted_stateful=int(data.get("restarted_stateful", 0)),
        nodes_used=int(data.get("nodes_used", 0)),
        mixed_workers=int(data.get("mixed_workers", 0)),
        overloaded_nodes=tuple(data.get("overloaded_nodes", ())),
        inter_node_traffic_before=_float(data, "inter_node_traffic_before"),
        inter_node_traffic_after=_float(data, "inter_node_traffic_after"),
        plan_seconds=_float(data, "plan_seconds"),
        reasons=tuple(data.get("reasons", ())),
        recommended=tuple(recommended),
    )


#: Plans a log-only actuator keeps (the latest).
LOG_ONLY_PLANS_KEPT = 4


class LogOnlyMoveActuator:
    """Dry-run: logs and keeps the plans it was given; nothing moves."""

    name = "log-only"

    def __init__(self) -> None:
        self.plans: list[Plan] = []

    def execute(self, plan: Plan) -> MoveResult:
        self.plans.append(plan)
        # Only the latest few: a plan of a large cluster is megabytes.
        del self.plans[:-LOG_ONLY_PLANS_KEPT]
        for m in plan.moves:
            log.info(
                "dry-run: would move %s from %s/%s to %s/%s",
                m.instance,
                m.from_node,
                m.from_worker,
                m.to_node,
                m.to_worker,
            )
        return MoveResult(
            actuator=self.name,
            executed=False,
            affected_workers=list(plan.affected_workers),
        )


class TestbedMoveActuator:
    """Posts plans to the live testbed's move endpoint (``POST <url>/moves``)."""

    name = "testbed"
    __test__ = False  # not a pytest test class despite its name

    def __init__(self, url: str, timeout_seconds: float = 120.0):
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"url must start with http:// or https://, got {url!r}")
        if not timeout_seconds > 0:
            raise ValueError(f"timeout_seconds must be > 0, got {timeout_seconds!r}")
        self.url = url.rstrip("/")
        self.timeout_seconds = timeout_seconds

    def execute(self, plan: Plan) -> MoveResult:
        body = json.dumps(plan_to_dict(plan)).encode()
        request = urllib.request.Request(
            f"{self.url}/moves",
            data=body,
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_seconds) as reply:
                data = json.loads(reply.read())
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")
            return MoveResult(self.name, False, error=f"HTTP {exc.code}: {detail}")
        except (OSError, ValueError) as exc:
            # The testbed may be restarting; the next epoch plans again from what runs.
            return MoveResult(self.name, False, error=f"testbed unreachable: {exc}")
        return MoveResult.from_dict(self.name, data)


#: Move actuators by name (config key ``move_actuator``).
MOVE_ACTUATORS: Registry[MoveActuator] = Registry("move actuator", "move_actuator")
MOVE_ACTUATORS.add("log-only", LogOnlyMoveActuator)
MOVE_ACTUATORS.add("testbed", TestbedMoveActuator)


def get_move_actuator(name: str, **options: Any) -> MoveActuator:
    """The move actuator called ``name``; ValueError for unknown names or options."""
    factory = MOVE_ACTUATORS.factory(name)
    try:
        return factory(**options)
    except TypeError as exc:
        raise ValueError(f"bad option for move actuator {name!r}: {exc}") from None
