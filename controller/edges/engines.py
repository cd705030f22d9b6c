"""Engine counter edges: counters of engines that are not instrumented, read beside
the controller.

Agents map an engine's OS threads to instances (``InstanceSample.engine`` set,
counters left at zero: only CPU, threads, stateful flag and upstream). The
counters come from the engine's own API, read here **once per job per poll**,
never once per node: a Flink JobManager cannot answer 1,000 agents each slot.

- :class:`CounterSource` is the interface (``read() -> CounterReading``);
  sources are built by kind from ``[[engine]]`` tables through
  :data:`COUNTER_SOURCES`. :class:`FlinkCounterSource` is the first.
- :class:`EngineEdge` runs each source's reads on its own thread every
  ``poll_seconds`` and keeps the latest reading, so a slow or dead JobManager
  never blocks the epoch or report ingest. Ingest
  (:class:`controller.edges.cluster.ObservedCluster`) asks it for one
  instance's counters with :meth:`EngineEdge.counters`.

What each Flink metric becomes, and what happens when counters are missing, is
in docs/controller.md ("Engine counter edges").
"""

from __future__ import annotations

import dataclasses
import http.client
import logging
import math
import re
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from dsched.engines import CounterReading, InstanceCounters
from dsched.engines.flink import (
    SLOT_METRICS,
    FlinkJob,
    FlinkRest,
    FlinkRestError,
    FlinkVertex,
    counters_from_metrics,
    instance_key,
    safe_name,
)
from dsched.ids import InstanceKey
from dsched.registry import Registry

if TYPE_CHECKING:
    from controller.config import EngineConfig

log = logging.getLogger(__name__)

DEFAULT_LATENCY_SUM_METRIC = "dschedLatencySumMs"
DEFAULT_LATENCY_COUNT_METRIC = "dschedLatencyCount"

# The JobManager's HTTP server refuses a request line above 4,096 bytes (it
# answers 404 "/bad-request"); the query of one metrics call stays below this.
MAX_QUERY_BYTES = 3500

# Flink job states after which a job never runs again.
TERMINAL_STATES = frozenset({"FINISHED", "CANCELED", "FAILED"})

# Why an engine's instances are recommend-only in placement plans, by kind.
PLACES_ITSELF = {"flink": "flink places subtasks itself"}


def places_itself(engine: str) -> str:
    """The reason placement only recommends moves of ``engine``'s instances."""
    return PLACES_ITSELF.get(engine, f"{engine} places its instances itself")


class CounterSource(Protocol):
    """One engine's counter side: every read returns the counters of all its instances."""

    name: str  # as in status, metrics and logs
    kind: str  # "flink"
    endpoint: str  # where it reads from (shown in `dschedctl status`)

    def read(self) -> CounterReading: ...


#: Counter sources by engine kind (``[[engine]] kind``); each factory takes the
#: engine's :class:`~controller.config.EngineConfig`.
COUNTER_SOURCES: Registry[CounterSource] = Registry("engine kind", "kind")


# -- why a read failed --------------------------------------------------------

ERROR_CLASSES = ("unreachable", "http_error", "bad_answer")
_HTTP_STATUS = re.compile(r": HTTP \d{3}\b")
_ERRNO = re.compile(r"\[Errno -?\d+\] ")


def error_class(reason: str) -> str | None:
    """The short class of a read error (a metric label), None for a reason that is
    not a read error (two jobs with one name, a subtask not published yet).

    Matches the messages :class:`~dsched.engines.flink.FlinkRest` raises:
    ``GET <path>: HTTP <code>``, ``... answer is not JSON``, ``...: unexpected
    answer``, ``GET <path>: <socket error>``; and this module's ``bad answer``.
    """
    if _HTTP_STATUS.search(reason):
        return "http_error"
    if "not JSON" in reason or "unexpected answer" in reason or "bad answer" in reason:
        return "bad_answer"
    if reason.startswith("GET "):
        return "unreachable"
    return None


def _tidy(message: str) -> str:
    """'[Errno 111] Connection refused' -> 'Connection refused' (the number says nothing more)."""
    return _ERRNO.sub("", message)


# -- monotonic counters ---------------------------------------------------------

_CUMULATIVE = tuple(
    f.name for f in dataclasses.fields(InstanceCounters) if f.name != "queue_length"
)
_ZERO = InstanceCounters(received=0, emitted=0)


class MonotonicCounters:
    """Cumulative counters that never go back, across attempts of a subtask.

    Flink restarts a subtask's counters from 0 when it gets a new attempt
    (failover) or its job is resubmitted under the same name. Each counter that
    went backwards gets the value it had reached added to an offset kept per
    instance, so the controller sees one series and never a reset. A restart
    whose new counter already passed the old value between two reads is not
    seen: that slot counts a little less, nothing worse.
    """

    def __init__(self) -> None:
        self._last: dict[InstanceKey, InstanceCounters] = {}
        self._offset: dict[InstanceKey, InstanceCounters] = {}

    def apply(self, key: InstanceKey, raw: InstanceCounters) -> InstanceCounters:
        last = self._last.get(key)
        offset = self._offset.get(key, _ZERO)
        if last is not None:
            went_back = {
                name: getattr(offset, name) + getattr(last, name)
                for name in _CUMULATIVE
                if getattr(raw, name) < getattr(last, name)
            }
            if went_back:
                offset = dataclasses.replace(offset, **went_back)
                self._offset[key] = offset
        self._last[key] = raw
        if offset is _ZERO:
            return raw
        return dataclasses.replace(
            raw, **{name: getattr(raw, name) + getattr(offset, name) for name in _CUMULATIVE}
        )

    def keep_only(self, apps: set[str]) -> None:
        """Forget instances of applications that are gone (finished, cancelled, failed
        for good); a job restarting keeps its offsets."""
        for key in [k for k in self._last if k.app not in apps]:
            self._last.pop(key, None)
            self._offset.pop(key, None)

    def offset(self, key: InstanceKey) -> InstanceCounters:
        return self._offset.get(key, _ZERO)


# -- Apache Flink -----------------------------------------------------------------


@dataclass
class _CachedJob:
    """A running job's topology and, per vertex, the ids of its latency metrics."""

    job: FlinkJob
    # vid -> (latency sum metric names, latency count metric names), without the
    # subtask prefix. A vertex whose metric list was still empty (the REST metric
    # store had not fetched it yet) is absent and asked again next read.
    latency: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = field(default_factory=dict)


def _matching(names: set[str], metric: str) -> tuple[str, ...]:
    """Metric names that are ``metric`` itself or an operator's ``<scope>.metric``."""
    return tuple(sorted(n for n in names if n == metric or n.endswith("." + metric)))


def _finite(values: Mapping[str, float]) -> dict[str, float]:
    """Drop values Flink publishes as NaN or negative (e.g. busy time of legacy sources)."""
    return {k: v for k, v in values.items() if math.isfinite(v) and v >= 0}


class FlinkCounterSource:
    """Counters of every subtask of every running job of one Flink cluster.

    A read lists running jobs (``/jobs/overview``), fetches the topology of a
    job it has not seen (``/jobs/<jid>``, ``/jobs/<jid>/plan`` and, to find
    the latency counters, each vertex's metric list: once per job id), then
    makes one metrics call per vertex for all its subtasks (more only for
    vertices whose request would exceed the JobManager's 4-kB request line).
    """

    kind = "flink"

    def __init__(
        self,
        rest_url: str,
        *,
        name: str = "flink",
        timeout_seconds: float = 2.0,
        latency_sum_metric: str = DEFAULT_LATENCY_SUM_METRIC,
        latency_count_metric: str = DEFAULT_LATENCY_COUNT_METRIC,
        stateful_overrides: Mapping[str, bool] | None = None,
        rest: FlinkRest | None = None,
        clock: Callable[[], float] = time.time,
        max_query_bytes: int = MAX_QUERY_BYTES,
    ):
        self.name = name
        self.endpoint = rest_url
        self.rest = rest or FlinkRest(rest_url, timeout=timeout_seconds)
        self.latency_sum_metric = latency_sum_metric
        self.latency_count_metric = latency_count_metric
        self.stateful_overrides = dict(stateful_overrides or {})
        self.clock = clock
        self.max_query_bytes = max_query_bytes
        self._jobs: dict[str, _CachedJob] = {}
        self._apps: set[str] = set()  # apps of the last successful job listing
        self._monotonic = MonotonicCounters()

    @classmethod
    def from_config(cls, config: EngineConfig) -> FlinkCounterSource:
        overrides = dict.fromkeys(config.stateful_operators, True)
        overrides.update(dict.fromkeys(config.stateless_operators, False))
        return cls(
            config.rest_url,
            name=config.engine_name,
            timeout_seconds=config.rest_timeout_seconds,
            latency_sum_metric=config.latency_sum_metric,
            latency_count_metric=config.latency_count_metric,
            stateful_overrides=overrides,
        )

    def offset(self, key: InstanceKey) -> InstanceCounters:
        """What earlier attempts of ``key`` counted, added to its raw counters."""
        return self._monotonic.offset(key)

    @property
    def jobs(self) -> dict[str, FlinkJob]:
        """Topologies of the jobs running at the last read, by job id."""
        return {jid: c.job for jid, c in self._jobs.items()}

    def read(self) -> CounterReading:
        try:
            listed = self._job_list()
        except FlinkRestError as exc:
            return self._failed(_tidy(str(exc)))
        except (http.client.HTTPException, ValueError) as exc:
            # What FlinkRest does not wrap: a broken HTTP answer.
            return self._failed(f"GET /jobs/overview: bad answer: {type(exc).__name__}: {exc}")
        # Jobs between two states (RESTARTING during a failover...) are still
        # known: their caches and counter offsets stay, their instances are missing.
        live = [(jid, name, state) for jid, name, state in listed if state not in TERMINAL_STATES]
        for jid in set(self._jobs) - {jid for jid, _, _ in live}:
            del self._jobs[jid]
        by_app: dict[str, list[tuple[str, str]]] = {}
        for jid, job_name, state in live:
            by_app.setdefault(safe_name(job_name), []).append((jid, state))
        self._apps = set(by_app)
        self._monotonic.keep_only(self._apps)
        counters: dict[InstanceKey, InstanceCounters] = {}
        missing: dict[str, str] = {}
        for app, jobs in sorted(by_app.items()):
            running = [jid for jid, state in jobs if state == "RUNNING"]
            if len(running) > 1:
                # Their subtasks would share instance keys: neither can be told apart.
                missing[app] = f"{len(running)} running jobs are named {app}"
                continue
            if not running:
                missing[app] = f"job {app} is {jobs[0][1]}"
                continue
            try:
                counters.update(self._job_counters(self._cached(running[0])))
            except FlinkRestError as exc:
                missing[app] = _tidy(str(exc))
            except (http.client.HTTPException, ValueError) as exc:
                missing[app] = f"job {running[0]}: bad answer: {type(exc).__name__}: {exc}"
        return CounterReading(timestamp=self.clock(), counters=counters, missing=missing)

    def _job_list(self) -> list[tuple[str, str, str]]:
        """(job id, name, state) of every job the JobManager lists."""
        data = self.rest.get("/jobs/overview")
        try:
            return [(j["jid"], j["name"], j["state"]) for j in data["jobs"]]
        except (KeyError, TypeError):
            raise FlinkRestError("GET /jobs/overview: unexpected answer") from None

    def _failed(self, reason: str) -> CounterReading:
        """Nothing could be read: every application known from the last listing is missing."""
        return CounterReading(
            timestamp=self.clock(), missing=dict.fromkeys(sorted(self._apps), reason), error=reason
        )

    def _cached(self, jid: str) -> _CachedJob:
        cached = self._jobs.get(jid)
        if cached is None:
            cached = _CachedJob(self.rest.job(jid, self.stateful_overrides))
            self._jobs[jid] = cached
        for vertex in cached.job.vertices:
            if vertex.vid not in cached.latency:
                self._discover_latency(cached, vertex)
        return cached

    def _discover_latency(self, cached: _CachedJob, vertex: FlinkVertex) -> None:
        ids = self.rest.metric_names(cached.job.jid, vertex)
        if not ids:
            return  # the REST metric store has not fetched this vertex yet: ask next read
        names = {i.partition(".")[2] for i in ids}
        cached.latency[vertex.vid] = (
            _matching(names, self.latency_sum_metric),
            _matching(names, self.latency_count_metric),
        )

    def _job_counters(self, cached: _CachedJob) -> dict[InstanceKey, InstanceCounters]:
        job = cached.job
        out: dict[InstanceKey, InstanceCounters] = {}
        for vertex in job.vertices:
            sums, counts = cached.latency.get(vertex.vid, ((), ()))
            names = [*SLOT_METRICS, *sums, *counts]
            values: dict[int, dict[str, float]] = {}
            for chunk in self._chunks(job.jid, vertex, names):
                values.update(self.rest.vertex_metrics(job.jid, vertex, names, chunk))
            for index in range(vertex.parallelism):
                got = _finite(values.get(index, {}))
                raw = counters_from_metrics(
                    got,
                    sum(got[n] for n in sums if n in got) if sums else None,
                    sum(got[n] for n in counts if n in got) if counts else None,
                )
                if raw is None:
                    continue  # not published yet: the instance is unmeasured, not idle
                key = instance_key(job, vertex, index)
                out[key] = self._monotonic.apply(key, raw)
        return out

    def _chunks(self, jid: str, vertex: FlinkVertex, names: Sequence[str]) -> Iterator[list[int]]:
        """Subtask indices in groups whose metrics query fits one request line."""
        path = len(f"GET /jobs/{jid}/vertices/{vertex.vid}/metrics?get= HTTP/1.1")
        budget = max(self.max_query_bytes - path, 1)
        chunk: list[int] = []
        used = 0
        for index in range(vertex.parallelism):
            size = sum(len(urllib.parse.quote(f"{index}.{n}", safe="")) + 3 for n in names)
            if chunk and used + size > budget:
                yield chunk
                chunk, used = [], 0
            chunk.append(index)
            used += size
        if chunk:
            yield chunk


COUNTER_SOURCES.add("flink", FlinkCounterSource.from_config)


# -- the edge ------------------------------------------------------------------------


@dataclass(frozen=True)
class EngineLookup:
    """One instance's counters from the latest reading, or why there are none.

    ``stamp`` numbers the reading (increasing over the edge's life, 0 for
    none): a reading whose stamp did not advance since the one an instance's
    previous slot used is stale.
    """

    counters: InstanceCounters | None
    stamp: int = 0
    reason: str | None = None


class EngineCounters(Protocol):
    """What report ingest asks of the engine edge."""

    def counters(self, engine: str, key: InstanceKey) -> EngineLookup: ...


@dataclass(frozen=True)
class EngineState:
    """One engine as `dschedctl status` shows it."""

    name: str
    kind: str
    endpoint: str
    healthy: bool
    reason: str  # why counters are missing; "" when healthy
    jobs: int
    instances: int
    last_read_age_seconds: float  # -1: never read


@dataclass
class _Engine:
    source: CounterSource
    poll_seconds: float
    reading: CounterReading | None = None
    stamp: int = 0
    thread: threading.Thread | None = None
    # One read of a source at a time (its thread, or poll() from a test or a tool):
    # a source keeps caches and counter offsets that two reads would race on.
    read_lock: threading.Lock = field(default_factory=threading.Lock)


ReadObserver = Callable[[str, CounterReading, float], None]


def _reading_reason(reading: CounterReading) -> str:
    if reading.error:
        return reading.error
    return "; ".join(f"{app}: {why}" for app, why in sorted(reading.missing.items()))


class EngineEdge:
    """Reads every configured engine on its own thread and keeps the latest reading.

    ``observe(engine, reading, seconds)`` is called after each read (the
    controller's metrics). Readers never wait on a read in progress: they get
    the latest finished reading.
    """

    def __init__(
        self,
        sources: Sequence[tuple[CounterSource, float]],
        observe: ReadObserver | None = None,
        clock: Callable[[], float] = time.time,
    ):
        names = [s.name for s, _ in sources]
        if len(set(names)) != len(names):
            raise ValueError(f"engine names must be unique, got {names}")
        for source, poll in sources:
            if not poll > 0:
                raise ValueError(f"poll_seconds of engine {source.name} must be > 0, got {poll}")
        self._engines = {s.name: _Engine(s, poll) for s, poll in sources}
        self._observe = observe
        self._clock = clock
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._stamps = 0

    @classmethod
    def from_config(
        cls,
        engines: Sequence[EngineConfig],
        slot_seconds: float,
        observe: ReadObserver | None = None,
    ) -> EngineEdge:
        return cls(
            [(COUNTER_SOURCES.create(e.kind, e), e.poll_seconds or slot_seconds) for e in engines],
            observe,
        )

    @property
    def names(self) -> list[str]:
        return list(self._engines)

    def source(self, name: str) -> CounterSource:
        return self._engines[name].source

    def poll_seconds(self, name: str) -> float:
        return self._engines[name].poll_seconds

    # -- reading ------------------------------------------------------------------
    def poll(self, name: str | None = None) -> None:
        """Read ``name`` (default: every engine) now, on this thread."""
        for engine in [self._engines[name]] if name else list(self._engines.values()):
            self._read(engine)

    def _read(self, engine: _Engine) -> None:
        with engine.read_lock:
            self._read_locked(engine)

    def _read_locked(self, engine: _Engine) -> None:
        t0 = time.perf_counter()
        try:
            reading = engine.source.read()
        except Exception as exc:  # a source bug must not kill its thread or keep old counters
            log.exception("engine %s: read failed", engine.source.name)
            reason = f"bad answer: read failed: {type(exc).__name__}: {exc}"
            with self._lock:
                known = engine.reading
            apps = {k.app for k in known.counters} | set(known.missing) if known else set()
            reading = CounterReading(
                timestamp=self._clock(), missing=dict.fromkeys(sorted(apps), reason), error=reason
            )
        seconds = time.perf_counter() - t0
        with self._lock:
            previous = engine.reading
            self._stamps += 1
            engine.reading, engine.stamp = reading, self._stamps
        if reading.error and (previous is None or previous.error != reading.error):
            log.warning("engine %s: counters unavailable: %s", engine.source.name, reading.error)
        elif not reading.error and previous is not None and previous.error:
            log.info("engine %s: counters back", engine.source.name)
        if self._observe is not None:
            self._observe(engine.source.name, reading, seconds)

    def start(self) -> None:
        for engine in self._engines.values():
            if engine.thread is None:
                engine.thread = threading.Thread(
                    target=self._loop,
                    args=(engine,),
                    name=f"dsched-engine-{engine.source.name}",
                    daemon=True,
                )
                engine.thread.start()

    def _loop(self, engine: _Engine) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            self._read(engine)
            next_at += engine.poll_seconds
            # A read slower than the poll starts the next one at once, never a burst.
            next_at = max(next_at, time.monotonic())
            self._stop.wait(next_at - time.monotonic())

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        for engine in self._engines.values():
            if engine.thread is not None:
                engine.thread.join(timeout)
                engine.thread = None

    # -- asking -------------------------------------------------------------------
    def latest(self, name: str) -> CounterReading | None:
        with self._lock:
            return self._engines[name].reading

    def counters(self, engine: str, key: InstanceKey) -> EngineLookup:
        """``key``'s counters from the engines of kind (or name) ``engine``: a
        sample names the kind ("flink"), and with two Flink clusters either may run
        the instance's job."""
        with self._lock:
            # Agents name the kind ("flink"): every engine of it may hold the instance.
            matched = [
                e for e in self._engines.values() if engine in (e.source.name, e.source.kind)
            ]
            found = [(e.reading, e.stamp, e.source.name) for e in matched]
        if not found:
            return EngineLookup(None, reason=f"no [[engine]] of kind {engine!r} is configured")
        reasons = []
        for reading, stamp, name in found:
            if reading is None:
                why = "not read yet"
            elif key in reading.counters:
                return EngineLookup(reading.counters[key], stamp)
            elif reading.error:
                why = reading.error
            elif key.app in reading.missing:
                why = reading.missing[key.app]
            else:
                why = f"no counters for {key} in the reading"
            reasons.append(why if len(found) == 1 else f"{name}: {why}")
        return EngineLookup(None, reason="; ".join(reasons))

    def status(self) -> list[EngineState]:
        now = self._clock()
        with self._lock:
            engines = [(e.source, e.reading) for e in self._engines.values()]
        out = []
        for source, reading in engines:
            if reading is None:
                out.append(
                    EngineState(
                        source.name, source.kind, source.endpoint, False, "not read yet", 0, 0, -1.0
                    )
                )
                continue
            reason = _reading_reason(reading)
            out.append(
                EngineState(
                    name=source.name,
                    kind=source.kind,
                    endpoint=source.endpoint,
                    healthy=not reason,
                    reason=reason,
                    jobs=len({k.app for k in reading.counters} | set(reading.missing)),
                    instances=len(reading.counters),
                    last_read_age_seconds=max(0.0, now - reading.timestamp),
                )
            )
        return out
