"""Apache Flink: subtasks as dsched instances.

Names. An application is a running job (its name), an operator is a job
vertex, an instance is a subtask (0-based index). Flink's names may hold
characters a cgroup path must not, so both are made safe with
:func:`safe_name` the same way on every node and beside the controller.

Threads. A subtask's task thread is named ``<vertex> (<i>/<n>)#<attempt>``
(``i`` from 1); its helper threads (``OutputFlusher for ...``, ``Time Trigger
for ...``, ``Source Data Fetcher for ...``, ``Legacy Source Thread - ...``)
end with the same text, and all of them do the subtask's work, so all are
capped together. Thread names carry no job id: a thread whose vertex name and
parallelism fit two running jobs is ambiguous and left alone.

REST. The JobManager serves the DAG (``/jobs/<id>``, ``/jobs/<id>/plan``) and
per-subtask metrics of a vertex in one call
(``/jobs/<id>/vertices/<vid>/metrics?get=0.numRecordsIn,1.numRecordsIn,...``).
Counters are read once per job per slot beside the controller; agents ask the
JobManager only for the job directory, and only when they see task threads
they cannot place (see docs/engines/flink.md).
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from dsched.engines import InstanceCounters
from dsched.ids import InstanceKey
from dsched.names import MAX_NAME_LENGTH

# '<vertex> (<i>/<n>)#<attempt>' at the end of a thread name.
_SUBTASK_SUFFIX = re.compile(r"^(?P<head>.*) \((?P<i>\d+)/(?P<n>\d+)\)#(?P<attempt>\d+)$")
_UNSAFE = re.compile(r"[^A-Za-z0-9._:@+=-]+")

# Operator kinds that keep keyed state. Matched against the vertex name's words
# (Flink SQL names vertices after their operator: GroupAggregate[4], Join[7]...).
STATEFUL_PATTERN = re.compile(
    r"(Aggregate|Join|Window|Deduplicate|Rank|Over|Match|KeyedProcess|CoProcess|Reduce|"
    r"ChangelogNormalize|Sort|Limit|keyed)",
    re.IGNORECASE,
)

# Per-subtask metrics read each slot, by the name Flink gives them.
SLOT_METRICS = (
    "numRecordsIn",
    "numRecordsOut",
    "accumulateBusyTimeMs",
    "accumulateBackPressuredTimeMs",
    "Shuffle.Netty.Input.Buffers.inputQueueLength",
)


class FlinkRestError(RuntimeError):
    """The JobManager could not be reached or answered something unusable."""


def safe_name(text: str) -> str:
    """``text`` as a dsched name: runs of other characters become one '_'.

    ``Source: src[1]`` -> ``Source:_src_1``. Deterministic, so every node and
    the controller agree without talking.
    """
    out = _UNSAFE.sub("_", text).strip("_.")
    out = re.sub(r"\.\.+", ".", out)
    if not out or not out[0].isalnum():
        out = "x" + out
    return out[:MAX_NAME_LENGTH]


def is_stateful(vertex_name: str, overrides: Mapping[str, bool] | None = None) -> bool:
    """Whether an operator keeps state: config override by operator name, else its kind."""
    if overrides:
        for name in (vertex_name, safe_name(vertex_name)):
            if name in overrides:
                return bool(overrides[name])
    return bool(STATEFUL_PATTERN.search(vertex_name))


@dataclass(frozen=True)
class SubtaskName:
    """What a thread name says: vertex (possibly with a helper prefix), subtask, attempt."""

    head: str
    index: int  # 0-based, as the REST API counts
    parallelism: int
    attempt: int


def parse_thread_name(name: str) -> SubtaskName | None:
    m = _SUBTASK_SUFFIX.match(name)
    if not m:
        return None
    i, n = int(m.group("i")), int(m.group("n"))
    if not 1 <= i <= n:
        return None
    return SubtaskName(m.group("head"), i - 1, n, int(m.group("attempt")))


@dataclass(frozen=True)
class FlinkVertex:
    vid: str
    name: str  # Flink's own
    parallelism: int
    upstream: tuple[str, ...]  # Flink names of the vertices feeding this one
    stateful: bool

    @property
    def operator(self) -> str:
        return safe_name(self.name)


@dataclass(frozen=True)
class FlinkJob:
    jid: str
    name: str
    state: str
    vertices: tuple[FlinkVertex, ...]

    @property
    def app(self) -> str:
        return safe_name(self.name)

    def vertex_named(self, name: str) -> FlinkVertex | None:
        for v in self.vertices:
            if v.name == name:
                return v
        return None

    def upstream_operators(self, vertex: FlinkVertex) -> tuple[str, ...]:
        return tuple(safe_name(u) for u in vertex.upstream)


def vertex_for_thread(head: str, vertices: Iterable[FlinkVertex]) -> FlinkVertex | None:
    """The vertex a thread's name head belongs to: the head is the vertex name, or ends
    with it after a helper prefix ('OutputFlusher for X', 'Legacy Source Thread - X').
    The longest matching name wins, so 'Calc[2]' does not claim 'MyCalc[2]'."""
    best = None
    for v in vertices:
        if head == v.name:
            return v
        if head.endswith(v.name) and head[-len(v.name) - 1] in " -":
            if best is None or len(v.name) > len(best.name):
                best = v
    return best


class FlinkRest:
    """The few JobManager REST calls dsched makes (stdlib only: the agent's base install)."""

    def __init__(self, base_url: str, timeout: float = 2.0):
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout

    def get(self, path: str, params: Mapping[str, str] | None = None) -> Any:
        return self.request("GET", path, params)

    def request(self, method: str, path: str, params: Mapping[str, str] | None = None) -> Any:
        """One call; its JSON answer (None for an empty body) or FlinkRestError."""
        url = self.base_url + "/" + path.lstrip("/")
        if params:
            url += "?" + urllib.parse.urlencode(params)
        req = urllib.request.Request(url, method=method, headers={"Accept": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                body = resp.read()
        except urllib.error.HTTPError as exc:
            raise FlinkRestError(f"{method} {path}: HTTP {exc.code}") from None
        except (urllib.error.URLError, OSError, TimeoutError) as exc:
            reason = getattr(exc, "reason", exc)
            raise FlinkRestError(f"{method} {path}: {reason}") from None
        if not body.strip():
            return None
        try:
            return json.loads(body)
        except ValueError:
            raise FlinkRestError(f"{method} {path}: answer is not JSON") from None

    def running_jobs(self) -> list[tuple[str, str]]:
        """(job id, job name) of every RUNNING job."""
        data = self.get("/jobs/overview")
        try:
            return [(j["jid"], j["name"]) for j in data["jobs"] if j.get("state") == "RUNNING"]
        except (KeyError, TypeError):
            raise FlinkRestError("/jobs/overview: unexpected answer") from None

    def job(self, jid: str, stateful_overrides: Mapping[str, bool] | None = None) -> FlinkJob:
        detail = self.get(f"/jobs/{jid}")
        plan = self.get(f"/jobs/{jid}/plan")
        try:
            names = {v["id"]: v["name"] for v in detail["vertices"]}
            inputs = {
                n["id"]: tuple(names[i["id"]] for i in n.get("inputs", ()) if i["id"] in names)
                for n in plan["plan"]["nodes"]
            }
            vertices = tuple(
                FlinkVertex(
                    vid=v["id"],
                    name=v["name"],
                    parallelism=int(v["parallelism"]),
                    upstream=inputs.get(v["id"], ()),
                    stateful=is_stateful(v["name"], stateful_overrides),
                )
                for v in detail["vertices"]
            )
            return FlinkJob(jid, detail["name"], detail["state"], vertices)
        except (KeyError, TypeError, ValueError):
            raise FlinkRestError(f"/jobs/{jid}: unexpected answer") from None

    def vertex_metrics(
        self,
        jid: str,
        vertex: FlinkVertex,
        names: Iterable[str],
        indices: Iterable[int] | None = None,
    ) -> dict[int, dict[str, float]]:
        """Per subtask index: metric name -> value, for one vertex in one call.

        ``indices`` (default: every subtask) lets a caller split a wide vertex
        over several calls: the JobManager answers a request line longer than
        4,096 bytes with 404, which with SLOT_METRICS is above ~25 subtasks."""
        names = list(names)
        subtasks = range(vertex.parallelism) if indices is None else indices
        wanted = [f"{i}.{n}" for i in subtasks for n in names]
        data = self.get(f"/jobs/{jid}/vertices/{vertex.vid}/metrics", {"get": ",".join(wanted)})
        out: dict[int, dict[str, float]] = {}
        try:
            for item in data:
                index, _, name = item["id"].partition(".")
                try:
                    out.setdefault(int(index), {})[name] = float(item["value"])
                except (TypeError, ValueError):
                    continue
        except (KeyError, TypeError):
            raise FlinkRestError(f"vertex {vertex.name} metrics: unexpected answer") from None
        return out

    def metric_names(self, jid: str, vertex: FlinkVertex) -> list[str]:
        data = self.get(f"/jobs/{jid}/vertices/{vertex.vid}/metrics")
        try:
            return [item["id"] for item in data]
        except (KeyError, TypeError):
            raise FlinkRestError(f"vertex {vertex.name} metric list: unexpected answer") from None


def counters_from_metrics(
    values: Mapping[str, float],
    latency_sum_ms: float | None = None,
    latency_count: float | None = None,
) -> InstanceCounters | None:
    """One subtask's counters from its slot metrics; None while Flink has not published
    the record counters yet (a subtask that just started)."""
    if "numRecordsIn" not in values or "numRecordsOut" not in values:
        return None
    return InstanceCounters(
        received=int(values["numRecordsIn"]),
        emitted=int(values["numRecordsOut"]),
        queue_length=int(values.get("Shuffle.Netty.Input.Buffers.inputQueueLength", 0)),
        busy_seconds=values.get("accumulateBusyTimeMs", 0.0) / 1000.0,
        backpressured_seconds=values.get("accumulateBackPressuredTimeMs", 0.0) / 1000.0,
        latency_sum_seconds=(latency_sum_ms or 0.0) / 1000.0,
        latency_count=int(latency_count or 0),
    )


def instance_key(job: FlinkJob, vertex: FlinkVertex, index: int) -> InstanceKey:
    return InstanceKey(job.app, vertex.operator, index)
