"""Which OS threads belong to which operator instance, and their reported counters.

Entries come from registrations over the local socket, from discovery rules,
from engines (``agent.engines``: whole thread sets per instance, found by the
agent itself) and from cgroups re-adopted after a restart. Everything an instance sends is
checked here before the agent believes it: names must be safe path components
(they become cgroup directories), counters must be finite, non-negative and
never go backwards. A refused update keeps the last good counters, so nothing
already known is lost.

Ownership: a record registered over the socket carries the uid that registered
it (``owner_uid``). A record the agent found itself (rules, engines, re-adopted
cgroups) has none and belongs to the uid of its process (see :func:`owner_of`).
Updates given a ``uid`` are applied only by the owner, under the same lock as
the update, so a key cannot change hands between the check and the write.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

# InstanceKey is also imported from here by bench/ and testbed/.
from dsched.ids import InstanceKey
from dsched.names import InvalidName, check_name

COUNTER_FIELDS = (
    "received",
    "executed",
    "emitted",
    "latency_count",
)
FLOAT_COUNTER_FIELDS = ("latency_sum_seconds", "service_seconds")
GAUGE_FIELDS = ("queue_length",)
WHOLE_FIELDS = frozenset(COUNTER_FIELDS + GAUGE_FIELDS)
ALL_COUNTER_FIELDS = COUNTER_FIELDS + FLOAT_COUNTER_FIELDS + GAUGE_FIELDS


class RegistrationError(ValueError):
    """An instance message the agent refuses; ``reason`` is the metric label."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


class NotOwner(RegistrationError):
    """A socket peer acted on an instance that belongs to another uid."""

    def __init__(self, op: str, key: InstanceKey, uid: int, owner: int | None):
        whose = "no live process" if owner is None else f"uid {owner}"
        super().__init__(
            "not_owner", f"instance {key} belongs to {whose}; uid {uid} may not {op} it"
        )
        self.op = op
        self.key = key
        self.uid = uid
        self.owner = owner


# pid -> the uid that owns that process, None when it is gone (agent.socket_server).
ProcessOwner = Callable[[int], "int | None"]
# pid -> when that process started (clock ticks after boot), None when it is gone.
StartTime = Callable[[int], "int | None"]


class Counters(NamedTuple):
    """Cumulative counters since the instance registered (queue_length is a gauge).

    A named tuple rather than a frozen dataclass: one is built for every counter
    update (hundreds a second), and a tuple is built several times faster.
    """

    received: int = 0
    executed: int = 0
    emitted: int = 0
    queue_length: int = 0
    latency_sum_seconds: float = 0.0
    latency_count: int = 0
    service_seconds: float = 0.0


@dataclass
class InstanceRecord:
    key: InstanceKey
    worker: str
    stateful: bool
    pid: int
    tids: set[int]
    source: str  # "registration", "rule", "engine" or "adopted"
    counters: Counters = field(default_factory=Counters)
    upstream: tuple[str, ...] = ()  # the operators feeding this one (the app's DAG)
    registered_at: float = field(default_factory=time.time)
    # The engine kind ("flink") for instances an engine found: the report says so, and
    # the controller takes their counters from that engine's adapter, not from here.
    engine: str = ""
    # The uid that registered it over the socket; None for the agent's own findings,
    # which belong to their process's uid instead (owner_of).
    owner_uid: int | None = None
    # When ``pid`` started (clock ticks after boot, /proc/<pid>/stat field 22), read when
    # the record was made: with the pid it names the process for good, so a pid the
    # kernel gave to another process is told apart. None: unknown, not checked.
    start_time: int | None = None


def owner_of(rec: InstanceRecord, process_owner: ProcessOwner | None) -> int | None:
    """The uid ``rec`` belongs to; None when nobody can be named (its process is gone)."""
    if rec.owner_uid is not None:
        return rec.owner_uid
    return None if process_owner is None else process_owner(rec.pid)


def check_owner(op: str, rec: InstanceRecord, uid: int, process_owner: ProcessOwner | None) -> None:
    """Raise :class:`NotOwner` unless ``uid`` owns ``rec``."""
    if rec.owner_uid == uid:
        return
    owner = owner_of(rec, process_owner)
    if owner != uid:
        raise NotOwner(op, rec.key, uid, owner)


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise RegistrationError("bad_field", f"{name} must be a positive integer, got {value!r}")
    return value


def make_key(app: Any, operator: Any, instance: Any) -> InstanceKey:
    """Validated key; raises RegistrationError('bad_name' | 'bad_field')."""
    try:
        check_name("app", app)
        check_name("operator", operator)
    except InvalidName as exc:
        raise RegistrationError("bad_name", str(exc)) from None
    if isinstance(instance, bool) or not isinstance(instance, int) or instance < 0:
        raise RegistrationError("bad_field", f"instance must be an integer >= 0, got {instance!r}")
    return InstanceKey(app, operator, instance)


def _checked_value(name: str, value: Any, previous: Counters) -> int | float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise RegistrationError("bad_field", f"counter {name} must be a number, got {value!r}")
    if not math.isfinite(value):
        raise RegistrationError("non_finite", f"counter {name} is {value!r}")
    if value < 0:
        raise RegistrationError("negative", f"counter {name} is negative ({value!r})")
    if name in WHOLE_FIELDS:
        if value != int(value):
            raise RegistrationError("bad_field", f"counter {name} must be whole, got {value!r}")
        value = int(value)
    if name not in GAUGE_FIELDS and value < getattr(previous, name):
        raise RegistrationError(
            "counter_backwards",
            f"counter {name} went backwards ({getattr(previous, name)} -> {value})",
        )
    return value


# (name, must be whole, is a gauge) in Counters' field order.
_FIELD_RULES = tuple(
    (name, name in WHOLE_FIELDS, name in GAUGE_FIELDS) for name in Counters._fields
)
_INF = math.inf


def check_counters(values: dict[str, Any], previous: Counters) -> Counters:
    """New counters from an update, or RegistrationError naming why they are refused.

    ``values`` may carry other keys (a whole wire message); only the counter
    fields are read. A field equal to the previous value, and of the same type,
    was already checked when it arrived; a plain non-negative int, or a finite
    float for a float field, that does not go backwards is taken as it is.
    Everything else takes the full check, which names the reason.
    """
    out = []
    unchanged = True
    for (name, whole, gauge), old in zip(_FIELD_RULES, previous, strict=True):
        try:
            value = values[name]
        except KeyError:
            raise RegistrationError("bad_field", f"update lacks counter {name!r}") from None
        kind = type(value)
        # NaN never equals (or compares with) anything, so it always takes the full check.
        if value == old and kind is type(old):
            out.append(old)
            continue
        unchanged = False
        if (
            (kind is int or (kind is float and not whole and value < _INF))
            and (value >= old if not gauge else value >= 0)
            and value >= 0
        ):
            out.append(value)
        else:
            out.append(_checked_value(name, value, previous))
    return previous if unchanged else Counters(*out)


def _copy(rec: InstanceRecord) -> InstanceRecord:
    # A shallow copy by hand: several times cheaper than copy.copy (which goes
    # through __reduce_ex__) or dataclasses.replace, and reports copy every record.
    out = object.__new__(InstanceRecord)
    out.__dict__.update(rec.__dict__)
    out.tids = set(rec.tids)
    return out


class Registry:
    """Thread-safe map InstanceKey -> InstanceRecord.

    ``generation`` changes whenever the set of instances or of their threads
    changes (never for counter updates), so the sampler rebuilds its view of
    the threads only after a change instead of copying every record each pass.

    ``start_time`` reads when a process started (``agent.sampling.process_start_ticks``);
    a new record takes its process's start time from it unless the caller gives
    one. A record keeps that start time while threads join it: a later check
    (sampler, enforcer) finds out when its pid has come to name another process.
    """

    def __init__(self, start_time: StartTime | None = None) -> None:
        self._start_time = start_time
        self._lock = threading.Lock()
        # Only keys that passed make_key get in. A key is a tuple, so names as they
        # arrive on the wire find their record directly: an exact-type hit needs
        # no name check again.
        self._records: dict[InstanceKey, InstanceRecord] = {}
        self._threads = 0
        self._generation = 0

    @property
    def generation(self) -> int:
        return self._generation

    def update_named(
        self,
        app: Any,
        operator: Any,
        instance: Any,
        values: dict[str, Any],
        uid: int | None = None,
        process_owner: ProcessOwner | None = None,
    ) -> Counters:
        """:meth:`update` for names as they arrive from an instance, checked only when
        they do not name a registered instance exactly.

        Exact types matter: ``True == 1`` and ``1.0 == 1`` would otherwise reach
        instance 1 with values make_key refuses.
        """
        if type(app) is str and type(operator) is str and type(instance) is int:
            with self._lock:
                rec = self._records.get((app, operator, instance))
                if rec is not None:
                    if uid is not None and rec.owner_uid != uid:
                        check_owner("update", rec, uid, process_owner)
                    rec.counters = check_counters(values, rec.counters)
                    return rec.counters
        return self.update(make_key(app, operator, instance), values, uid, process_owner)

    def update_many(
        self,
        items: list[Any],
        uid: int | None = None,
        process_owner: ProcessOwner | None = None,
    ) -> list[tuple[int, RegistrationError]]:
        """Apply a batch of updates under one lock; each item is a dict with ``app``,
        ``operator``, ``instance`` and the counters. Returns the refused items as
        (index, error); the others are applied. With ``uid``, an item for an instance
        another uid owns is refused (:class:`NotOwner`)."""
        refused: list[tuple[int, RegistrationError]] = []
        records = self._records
        with self._lock:
            for index, item in enumerate(items):
                try:
                    if type(item) is not dict:
                        raise RegistrationError("bad_message", "batch item must be a JSON object")
                    app, operator, instance = (
                        item.get("app"),
                        item.get("operator"),
                        item.get("instance"),
                    )
                    rec = None
                    if type(app) is str and type(operator) is str and type(instance) is int:
                        rec = records.get((app, operator, instance))
                    if rec is None:
                        key = make_key(app, operator, instance)
                        rec = records.get(key)
                        if rec is None:
                            raise RegistrationError(
                                "unknown_instance", f"update for unregistered instance {key}"
                            )
                    if uid is not None and rec.owner_uid != uid:
                        check_owner("update", rec, uid, process_owner)
                    rec.counters = check_counters(item, rec.counters)
                except RegistrationError as exc:
                    refused.append((index, exc))
        return refused

    def register(
        self,
        key: InstanceKey,
        worker: Any,
        stateful: Any,
        pid: Any,
        tid: Any,
        source: str = "registration",
        upstream: Any = (),
        start_time: int | None = None,
    ) -> InstanceRecord:
        if not isinstance(upstream, list | tuple):
            raise RegistrationError("bad_field", "upstream must be a list of operator names")
        try:
            check_name("worker", worker)
            upstream = tuple(check_name("upstream", u) for u in upstream)
        except InvalidName as exc:
            raise RegistrationError("bad_name", str(exc)) from None
        if not isinstance(stateful, bool):
            raise RegistrationError(
                "bad_field", f"stateful must be true or false, got {stateful!r}"
            )
        pid = _positive_int("pid", pid)
        tid = _positive_int("tid", tid)
        with self._lock:
            rec = self._records.get(key)
            if rec is not None and rec.pid == pid and rec.worker == worker:
                # One instance may run on several threads: each registers its own TID.
                if tid not in rec.tids:
                    rec.tids.add(tid)
                    self._threads += 1
                    self._generation += 1
                rec.stateful = stateful
                rec.upstream = upstream or rec.upstream
                if rec.source == "adopted":
                    rec.source = source
                return _copy(rec)
            if rec is not None:
                self._threads -= len(rec.tids)
            rec = InstanceRecord(
                key,
                worker,
                stateful,
                pid,
                {tid},
                source,
                upstream=upstream,
                start_time=self._started(pid, start_time),
            )
            self._records[key] = rec
            self._threads += 1
            self._generation += 1
            return _copy(rec)

    def register_threads(
        self,
        key: InstanceKey,
        worker: str,
        stateful: bool,
        pid: int,
        tids: set[int] | frozenset[int],
        source: str,
        upstream: tuple[str, ...] = (),
        engine: str = "",
        start_time: int | None = None,
    ) -> tuple[InstanceRecord, bool]:
        """Register ``key`` with exactly ``tids``, or make a known record's threads ``tids``.

        For the agent's own finders (engines), which see an instance's whole thread
        set at once: one lock and one generation step instead of one per thread.
        A record of another process or worker is replaced (the caller has removed
        its cgroup first). Returns (a copy of the record, whether its threads or
        process changed).
        """
        try:
            check_name("worker", worker)
            upstream = tuple(check_name("upstream", u) for u in upstream)
        except InvalidName as exc:
            raise RegistrationError("bad_name", str(exc)) from None
        pid = _positive_int("pid", pid)
        for tid in tids:
            _positive_int("tid", tid)
        if not tids:
            raise RegistrationError("bad_field", f"{key} has no thread")
        with self._lock:
            rec = self._records.get(key)
            if rec is not None and rec.pid == pid and rec.worker == worker:
                changed = rec.tids != tids
                if changed:
                    self._threads += len(tids) - len(rec.tids)
                    rec.tids = set(tids)
                    self._generation += 1
                rec.stateful, rec.upstream = bool(stateful), upstream
                rec.source, rec.engine = source, engine
                return _copy(rec), changed
            if rec is not None:
                self._threads -= len(rec.tids)
            rec = InstanceRecord(
                key,
                worker,
                bool(stateful),
                pid,
                set(tids),
                source,
                upstream=upstream,
                engine=engine,
                start_time=self._started(pid, start_time),
            )
            self._records[key] = rec
            self._threads += len(tids)
            self._generation += 1
            return _copy(rec), True

    def _started(self, pid: int, given: int | None) -> int | None:
        """The start time a new record of ``pid`` keeps: ``given``, else read now."""
        if given is not None or self._start_time is None:
            return given
        return self._start_time(pid)

    def update(
        self,
        key: InstanceKey,
        values: dict[str, Any],
        uid: int | None = None,
        process_owner: ProcessOwner | None = None,
    ) -> Counters:
        with self._lock:
            rec = self._records.get(key)
            if rec is None:
                raise RegistrationError(
                    "unknown_instance", f"update for unregistered instance {key}"
                )
            if uid is not None and rec.owner_uid != uid:
                check_owner("update", rec, uid, process_owner)
            rec.counters = check_counters(values, rec.counters)
            return rec.counters

    def claim(self, key: InstanceKey, uid: int, pid: int) -> bool:
        """Make ``uid`` the owner of ``key`` if its record is of process ``pid`` (the one
        just registered); False when the record is gone or another process's."""
        with self._lock:
            rec = self._records.get(key)
            if rec is None or rec.pid != pid:
                return False
            rec.owner_uid = uid
            return True

    def unregister(self, key: InstanceKey) -> InstanceRecord | None:
        with self._lock:
            rec = self._records.pop(key, None)
            if rec is not None:
                self._threads -= len(rec.tids)
                self._generation += 1
            return rec

    def set_tids(self, key: InstanceKey, tids: set[int]) -> None:
        with self._lock:
            rec = self._records.get(key)
            if rec is not None and rec.tids != tids:
                self._threads += len(tids) - len(rec.tids)
                rec.tids = set(tids)
                self._generation += 1

    def get(self, key: InstanceKey) -> InstanceRecord | None:
        with self._lock:
            rec = self._records.get(key)
            return None if rec is None else _copy(rec)

    def process(self, key: InstanceKey) -> tuple[int, int | None] | None:
        """(pid, start time) of ``key``'s record, without copying it; None if unknown."""
        with self._lock:
            rec = self._records.get(key)
            return None if rec is None else (rec.pid, rec.start_time)

    def snapshot(self) -> list[InstanceRecord]:
        return self.versioned_snapshot()[1]

    def versioned_snapshot(self) -> tuple[int, list[InstanceRecord]]:
        """(generation, copies of every record), taken under one lock."""
        with self._lock:
            return self._generation, [_copy(r) for r in self._records.values()]

    def __len__(self) -> int:
        return len(self._records)

    def thread_count(self) -> int:
        return self._threads
