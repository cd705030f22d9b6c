"""What Flink itself counted, read through REST, and the latency sink's files.

Flink keeps per-subtask IO counters (``numRecordsIn``, ``numRecordsOut``) on every
task; the REST metric store refreshes them every ``metrics.fetcher.update-interval``
(1 s in :class:`~testbed.flink.cluster.FlinkCluster`'s config). They reset when a
subtask restarts, so totals are exact only for a job that has not failed over.

The benchmark's loss check: everything the feeder wrote reaches the aggregate, i.e.
:func:`drain` sees the aggregate's ``numRecordsIn`` total reach
``feeder.records_written``.

Latency files (``<latency dir>/<job>-<subtask>-<attempt>.lat``, one integer of
milliseconds per line, appended by the sink) are read whole with
:func:`read_latencies`, or incrementally with :class:`LatencyTail` (the values
appended since the previous call, i.e. those of one time window, to within the
sink's 1-s flush).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from testbed.flink.rest import FlinkRest

SOURCE_PREFIX = "Source:"
AGGREGATE_PREFIX = "GroupAggregate"
LATENCY_COUNT = "dschedLatencyCount"
LATENCY_SUM = "dschedLatencySumMs"


@dataclass(frozen=True)
class Vertex:
    id: str
    name: str
    parallelism: int
    status: str


@dataclass(frozen=True)
class SubtaskRecords:
    """One subtask's IO counters (0-based subtask index)."""

    subtask: int
    records_in: int
    records_out: int


@dataclass(frozen=True)
class LatencyStats:
    count: int
    mean_ms: float
    p99_ms: float
    max_ms: float

    @classmethod
    def of(cls, values: np.ndarray) -> LatencyStats:
        """Stats of an array of latencies (ms); NaN everywhere for an empty one."""
        if values.size == 0:
            return cls(0, float("nan"), float("nan"), float("nan"))
        return cls(
            int(values.size),
            float(values.mean()),
            float(np.percentile(values, 99)),
            float(values.max()),
        )


def _rest(rest: FlinkRest | str) -> FlinkRest:
    return rest if isinstance(rest, FlinkRest) else FlinkRest(rest)


def vertices(rest: FlinkRest | str, job_id: str) -> list[Vertex]:
    """The job's vertices in topological order."""
    detail = _rest(rest).get(f"/jobs/{job_id}")
    return [Vertex(v["id"], v["name"], v["parallelism"], v["status"]) for v in detail["vertices"]]


def find_vertex(vs: list[Vertex], prefix: str) -> Vertex:
    """The one vertex whose name starts with ``prefix``."""
    found = [v for v in vs if v.name.startswith(prefix)]
    if len(found) != 1:
        names = ", ".join(v.name for v in vs)
        raise LookupError(f"expected one vertex named {prefix}*, found {len(found)} in: {names}")
    return found[0]


def subtask_metrics(
    rest: FlinkRest | str, job_id: str, vertex: Vertex, names: list[str]
) -> list[dict[str, float]]:
    """``names`` for every subtask of ``vertex``; a metric not reported yet reads 0.

    Names are as Flink lists them without the subtask prefix: task metrics such as
    ``numRecordsIn``, or operator metrics such as ``lat[5]__Writer.dschedLatencyCount``
    (see :func:`metric_names`).
    """
    ids = [f"{i}.{n}" for i in range(vertex.parallelism) for n in names]
    out = [dict.fromkeys(names, 0.0) for _ in range(vertex.parallelism)]
    # Long names: ask in chunks to keep the URL well under servers' limits.
    for start in range(0, len(ids), 40):
        chunk = ",".join(ids[start : start + 40])
        got = _rest(rest).get(f"/jobs/{job_id}/vertices/{vertex.id}/metrics?get={chunk}")
        for m in got or []:
            idx, _, name = m["id"].partition(".")
            try:
                out[int(idx)][name] = float(m["value"])
            except (ValueError, KeyError):
                pass  # a gauge that is not a number
    return out


def metric_names(rest: FlinkRest | str, job_id: str, vertex: Vertex) -> list[str]:
    """Every metric id Flink lists for the vertex (``<subtask>.<name>``)."""
    got = _rest(rest).get(f"/jobs/{job_id}/vertices/{vertex.id}/metrics")
    return [m["id"] for m in got or []]


def records(rest: FlinkRest | str, job_id: str) -> dict[str, list[SubtaskRecords]]:
    """Vertex name -> per-subtask numRecordsIn / numRecordsOut."""
    result = {}
    for v in vertices(rest, job_id):
        per = subtask_metrics(rest, job_id, v, ["numRecordsIn", "numRecordsOut"])
        result[v.name] = [
            SubtaskRecords(i, int(m["numRecordsIn"]), int(m["numRecordsOut"]))
            for i, m in enumerate(per)
        ]
    return result


def _total(rest: FlinkRest | str, job_id: str, prefix: str, metric: str) -> int:
    v = find_vertex(vertices(rest, job_id), prefix)
    return int(sum(m[metric] for m in subtask_metrics(rest, job_id, v, [metric])))


def source_records_out(rest: FlinkRest | str, job_id: str) -> int:
    """Records the source emitted, summed over its subtasks."""
    return _total(rest, job_id, SOURCE_PREFIX, "numRecordsOut")


def aggregate_records_in(rest: FlinkRest | str, job_id: str) -> int:
    """Records the GROUP BY aggregate received, summed over its subtasks."""
    return _total(rest, job_id, AGGREGATE_PREFIX, "numRecordsIn")


def latency_counters(rest: FlinkRest | str, job_id: str) -> tuple[int, int]:
    """(dschedLatencyCount, dschedLatencySumMs) summed over the sink's subtasks."""
    count = total = 0
    for v in vertices(rest, job_id):
        names = metric_names(rest, job_id, v)
        wanted = sorted(
            {n.partition(".")[2] for n in names if n.endswith((LATENCY_COUNT, LATENCY_SUM))}
        )
        if not wanted:
            continue
        for m in subtask_metrics(rest, job_id, v, wanted):
            for name, value in m.items():
                if name.endswith(LATENCY_COUNT):
                    count += int(value)
                else:
                    total += int(value)
    return count, total


def drain(rest: FlinkRest | str, job_id: str, expected: int, timeout: float = 60.0) -> int:
    """Wait until the aggregate's numRecordsIn total reaches ``expected`` (e.g. the
    feeder's ``records_written``) or ``timeout`` passes; the last total seen.

    The caller compares: ``drain(...) == expected`` means nothing was lost (more
    would mean duplicates, e.g. a file re-read after a restart)."""
    deadline = time.monotonic() + timeout
    seen = aggregate_records_in(rest, job_id)
    while seen < expected and time.monotonic() < deadline:
        time.sleep(0.5)
        seen = aggregate_records_in(rest, job_id)
    return seen


def latency_files(latency_dir: Path, job_name: str | None = None) -> list[Path]:
    """The sink's ``.lat`` files, of one job or all."""
    pattern = f"{job_name}-*.lat" if job_name else "*.lat"
    return sorted(Path(latency_dir).glob(pattern))


def read_latencies(latency_dir: Path, job_name: str | None = None) -> np.ndarray:
    """Every latency value (ms) written so far, all subtasks and attempts together."""
    chunks = [_parse(p.read_bytes()) for p in latency_files(latency_dir, job_name)]
    return np.concatenate(chunks) if chunks else np.empty(0, dtype=np.int64)


class LatencyTail:
    """Reads the values appended to the ``.lat`` files since the previous :meth:`read`.

    Call it once per window (e.g. per control epoch): each call returns that
    window's latencies. Only whole lines are consumed; a line the sink is still
    writing is picked up by the next call. New files (a restarted subtask's
    attempt) are found on every call.
    """

    def __init__(self, latency_dir: Path, job_name: str | None = None) -> None:
        self.latency_dir = Path(latency_dir)
        self.job_name = job_name
        self._offsets: dict[Path, int] = {}

    def read(self) -> np.ndarray:
        chunks = []
        for path in latency_files(self.latency_dir, self.job_name):
            offset = self._offsets.get(path, 0)
            with path.open("rb") as f:
                f.seek(offset)
                data = f.read()
            end = data.rfind(b"\n") + 1
            if end:
                chunks.append(_parse(data[:end]))
                self._offsets[path] = offset + end
        return np.concatenate(chunks) if chunks else np.empty(0, dtype=np.int64)

    def stats(self) -> LatencyStats:
        return LatencyStats.of(self.read())


def _parse(data: bytes) -> np.ndarray:
    end = data.rfind(b"\n") + 1  # drop a torn last line
    if not end:
        return np.empty(0, dtype=np.int64)
    return np.array(data[:end].split(), dtype=np.int64)


def job_summary(rest: FlinkRest | str, job_id: str) -> dict[str, Any]:
    """A JSON-able snapshot: state, per-vertex records, latency counters."""
    r = _rest(rest)
    count, total = latency_counters(r, job_id)
    return {
        "state": r.get(f"/jobs/{job_id}")["state"],
        "records": {
            name: [{"in": s.records_in, "out": s.records_out} for s in subs]
            for name, subs in records(r, job_id).items()
        },
        "latency_count": count,
        "latency_mean_ms": total / count if count else None,
    }
