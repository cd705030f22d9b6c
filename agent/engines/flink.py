"""Apache Flink on the node: the subtask threads of this node's TaskManager JVMs.

One pass (:meth:`FlinkNodeEngine.map_threads`):

1. TaskManagers: processes whose command line matches ``taskmanager_cmdline``
   and that are JVMs (``jcmd`` signals its target; see :mod:`agent.jvm`).
2. Their threads, by full name, from ``jcmd <pid> Thread.print``.
3. Names that end like a subtask's (``<vertex> (<i>/<n>)#<attempt>``) are
   resolved against the job directory (running managed jobs, their vertices
   and parallelism): the vertex whose name the thread's name is or ends with,
   with the same parallelism. The task thread and its helpers (``OutputFlusher
   for ...``, ``Time Trigger for ...``, ``Source Data Fetcher for ...``) all
   carry the subtask's name and all do its work, so all of them are the
   instance. Within a subtask only its highest attempt counts: threads of an
   older attempt are on their way out.
4. Everything else is left alone: the TaskManager's own threads never look like
   a subtask; a thread that looks like one but belongs to no running managed
   job is *unowned* (counted), one that fits two jobs is *ambiguous* (counted,
   because thread names carry no job id).

Worker. An instance's worker is ``tm-<pid>``: the cgroup layout puts
instances under ``<app>/<worker>``, and on cgroup v2 that directory is the
domain the worker *process* is moved into, so a worker must be exactly one
process. A TaskManager is one JVM; its pid is known here without asking
anyone, and a restarted TaskManager gets a new pid, hence a new worker: the
old process's cgroups are removed whole instead of mixing two processes.

The job directory. Thread names carry no job id, so the directory comes from
the JobManager's REST API, and every node would ask it. With 1,000
TaskManagers, asking every slot would be 1,000 calls (times 1 + 2 per job) per
slot on one JobManager that is also running the jobs. So the directory is
cached and read again only when (a) a thread's name does not resolve with it
(a new job, a rescaled vertex) and did not already fail to resolve right after
the last read, or (b) it is older than ``directory_refresh_seconds`` (default
30 s) while there is something to resolve. After a failed read the next try
waits ``directory_refresh_seconds`` too, so an overloaded JobManager is not
hammered; meanwhile a cached directory, however old, is used. Counters are
never read here: an adapter beside the controller reads them once per job per
slot.
"""

from __future__ import annotations

import logging
import os
import re
import time
import urllib.parse
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import psutil

from agent.engines.base import NODE_ENGINES, NodeEngine
from agent.jvm import JcmdError, find_jcmd, is_jvm, jcmd_threads
from dsched.config import ConfigError, require
from dsched.engines import InstanceThreads, ThreadMapping
from dsched.engines.flink import (
    FlinkJob,
    FlinkRest,
    FlinkRestError,
    FlinkVertex,
    SubtaskName,
    instance_key,
    parse_thread_name,
    safe_name,
    vertex_for_thread,
)

if TYPE_CHECKING:
    from agent.config import EngineConfig

log = logging.getLogger(__name__)

# Job states after which a job never runs again (its instances' caps may be forgotten).
# CANCELLING is on its way to CANCELED; FAILING may still become RESTARTING.
ENDED_STATES = frozenset({"FINISHED", "CANCELED", "CANCELLING", "FAILED", "SUSPENDED"})

# (vertex name head as in the thread name, parallelism): what a thread name says.
Signature = tuple[str, int]


@dataclass
class Directory:
    """The managed jobs as the JobManager described them at ``fetched_at`` (monotonic).

    ``jobs``: the RUNNING ones, whose subtask threads are instances. ``live_apps``:
    the apps of managed jobs that have not ended (running, restarting...).
    ``unresolved``: signatures that did not resolve right after this read; seeing
    them again is no reason to read again before the directory is stale.
    """

    jobs: tuple[FlinkJob, ...]
    live_apps: frozenset[str]
    fetched_at: float
    unresolved: set[Signature] = field(default_factory=set)


@dataclass(frozen=True)
class Grouping:
    """Threads grouped into instances, and what could not be placed."""

    instances: tuple[InstanceThreads, ...]
    unowned_threads: int
    ambiguous_threads: int
    unresolved: frozenset[Signature]


def owners(
    head: str, parallelism: int, jobs: Iterable[FlinkJob]
) -> list[tuple[FlinkJob, FlinkVertex]]:
    """Every job's vertex that a thread name head fits, keeping only the best fits.

    A job's best vertex is the longest name the head is or ends with
    (:func:`vertex_for_thread`), among vertices of the thread's parallelism.
    Across jobs the longest name wins too; two jobs tied for it make the thread
    ambiguous (the caller counts it and leaves it alone).
    """
    best: list[tuple[FlinkJob, FlinkVertex]] = []
    best_len = -1
    for job in jobs:
        vertex = vertex_for_thread(head, (v for v in job.vertices if v.parallelism == parallelism))
        if vertex is None:
            continue
        if len(vertex.name) > best_len:
            best, best_len = [(job, vertex)], len(vertex.name)
        elif len(vertex.name) == best_len:
            best.append((job, vertex))
    return best


def subtask_threads(
    threads_by_pid: Mapping[int, Mapping[int, str]],
) -> list[tuple[int, int, SubtaskName]]:
    """(pid, tid, parsed name) of every thread whose name looks like a subtask's."""
    out = []
    for pid, threads in threads_by_pid.items():
        for tid, name in threads.items():
            parsed = parse_thread_name(name)
            if parsed is not None:
                out.append((pid, tid, parsed))
    return out


def group_threads(
    threads_by_pid: Mapping[int, Mapping[int, str]], jobs: Sequence[FlinkJob]
) -> Grouping:
    """Instances of ``jobs`` among the threads of each TaskManager process (pid -> tid -> name).

    Pure: the same threads and directory always give the same grouping.
    """
    resolved: dict[Signature, list[tuple[FlinkJob, FlinkVertex]]] = {}
    # (job id, vertex id, subtask) -> pid -> attempt -> tids
    subtasks: dict[tuple[str, str, int], dict[int, dict[int, set[int]]]] = {}
    found: dict[tuple[str, str, int], tuple[FlinkJob, FlinkVertex]] = {}
    unowned = ambiguous = 0
    unresolved: set[Signature] = set()
    for pid, tid, name in subtask_threads(threads_by_pid):
        signature = (name.head, name.parallelism)
        fits = resolved.get(signature)
        if fits is None:
            fits = resolved[signature] = owners(name.head, name.parallelism, jobs)
        if not fits:
            unowned += 1
            unresolved.add(signature)
            continue
        if len(fits) > 1:
            ambiguous += 1
            continue
        job, vertex = fits[0]
        ident = (job.jid, vertex.vid, name.index)
        found[ident] = (job, vertex)
        by_attempt = subtasks.setdefault(ident, {}).setdefault(pid, {})
        by_attempt.setdefault(name.attempt, set()).add(tid)

    candidates: list[InstanceThreads] = []
    for ident, by_pid in subtasks.items():
        job, vertex = found[ident]
        # The newest attempt in each process, then the newest on the node: an older
        # attempt's threads are being cancelled (or belong to a TaskManager that lost it).
        latest = [(max(attempts), pid, attempts[max(attempts)]) for pid, attempts in by_pid.items()]
        top = max(attempt for attempt, _pid, _tids in latest)
        at_top = [(pid, tids) for attempt, pid, tids in latest if attempt == top]
        if len(at_top) > 1:
            ambiguous += sum(len(tids) for _pid, tids in at_top)
            continue
        pid, tids = at_top[0]
        candidates.append(
            InstanceThreads(
                key=instance_key(job, vertex, ident[2]),
                worker=f"tm-{pid}",
                pid=pid,
                tids=frozenset(tids),
                stateful=vertex.stateful,
                upstream=job.upstream_operators(vertex),
            )
        )
    # Two jobs whose names and vertex names are equal once made safe would give one
    # key to two subtasks: neither can be told apart, so neither is taken.
    keys: dict[object, int] = {}
    for inst in candidates:
        keys[inst.key] = keys.get(inst.key, 0) + 1
    instances = []
    for inst in candidates:
        if keys[inst.key] > 1:
            ambiguous += len(inst.tids)
        else:
            instances.append(inst)
    instances.sort(key=lambda i: i.key)
    return Grouping(tuple(instances), unowned, ambiguous, frozenset(unresolved))


def _resolves(signature: Signature, jobs: Sequence[FlinkJob]) -> bool:
    return bool(owners(signature[0], signature[1], jobs))


@NODE_ENGINES.register("flink")
class FlinkNodeEngine(NodeEngine):
    """Subtasks of the Flink cluster at ``rest_url`` running in this node's TaskManagers."""

    kind = "flink"

    def __init__(
        self,
        config: EngineConfig,
        proc_root: str | Path = "/proc",
        clock: Callable[[], float] = time.monotonic,
    ):
        super().__init__(config.scan_seconds)
        self.config = config
        self.proc_root = str(proc_root)
        self.rest = FlinkRest(config.rest_url, config.rest_timeout_seconds)
        self._cmdline = re.compile(config.taskmanager_cmdline)
        self._jobs = re.compile(config.jobs)
        self._overrides = config.stateful_overrides()
        self._clock = clock
        self._directory: Directory | None = None
        self._failed_at: float | None = None
        self._rest_error: str | None = None
        self._skipped_not_jvm: set[int] = set()

    @classmethod
    def check_config(cls, config: EngineConfig) -> None:
        require(bool(config.rest_url), "rest_url", "required for kind flink (http://HOST:PORT)")
        url = urllib.parse.urlsplit(config.rest_url)
        try:
            port = url.port
        except ValueError:
            port = None
        if url.scheme not in ("http", "https") or not url.hostname or port is None:
            raise ConfigError("rest_url", f"expected http://HOST:PORT, got {config.rest_url!r}")

    # ------------------------------------------------------------ one pass

    def map_threads(self) -> ThreadMapping:
        threads_by_pid, why = self.read_threads()
        if why is not None:
            return ThreadMapping(unavailable=why)
        signatures = {(n.head, n.parallelism) for _p, _t, n in subtask_threads(threads_by_pid)}
        if not signatures and not self.watched_apps:
            # No subtask runs here and no cap waits for one: no reason to ask anyone.
            return ThreadMapping()
        directory, why = self._current_directory(signatures)
        if directory is None:
            return ThreadMapping(unavailable=why)
        grouping = group_threads(threads_by_pid, directory.jobs)
        return ThreadMapping(
            instances=grouping.instances,
            unowned_threads=grouping.unowned_threads,
            ambiguous_threads=grouping.ambiguous_threads,
        )

    def live_apps(self) -> frozenset[str] | None:
        return None if self._directory is None else self._directory.live_apps

    def taskmanagers(self) -> list[int]:
        """Pids of this node's TaskManager JVMs (command line matches, libjvm mapped)."""
        pids = []
        me = os.getpid()
        skipped: set[int] = set()
        for proc in psutil.process_iter():
            if proc.pid == me:
                continue
            try:
                cmdline = " ".join(proc.cmdline())
            except (psutil.Error, OSError):
                continue
            if not cmdline or not self._cmdline.search(cmdline):
                continue
            if not is_jvm(self.proc_root, proc.pid):
                # A wrapper (`timeout ... java ...TaskManagerRunner`, a shell) matches too;
                # jcmd would SIGQUIT it. Said once per process.
                skipped.add(proc.pid)
                if proc.pid not in self._skipped_not_jvm:
                    log.info(
                        "%s: process %d matches taskmanager_cmdline but is not a JVM; skipped",
                        self.name,
                        proc.pid,
                    )
                continue
            pids.append(proc.pid)
        self._skipped_not_jvm = skipped
        return sorted(pids)

    def read_threads(self) -> tuple[dict[int, dict[int, str]], str | None]:
        """pid -> tid -> name for every TaskManager here, or (empty, why not)."""
        pids = self.taskmanagers()
        if not pids:
            return {}, None
        try:
            jcmd = find_jcmd()
        except JcmdError as exc:
            return {}, str(exc)
        out: dict[int, dict[int, str]] = {}
        for pid in pids:
            try:
                out[pid] = jcmd_threads(pid, self.config.jcmd_timeout_seconds, jcmd)
            except JcmdError as exc:
                if not psutil.pid_exists(pid) or _zombie(pid):
                    # It exited since it was listed: it has no threads to map.
                    continue
                # A live TaskManager whose threads cannot be read: mapping the others
                # would take its instances for gone.
                return {}, str(exc)
        return out, None

    # ------------------------------------------------------------ the job directory

    def _current_directory(self, signatures: set[Signature]) -> tuple[Directory | None, str]:
        """The directory to resolve ``signatures`` with, read again only when needed."""
        now = self._clock()
        cached = self._directory
        if not self._needs_refresh(cached, signatures, now):
            return cached, ""
        if (
            self._failed_at is not None
            and now - self._failed_at < self.config.directory_refresh_seconds
        ):
            # Tried and failed recently: do not hammer a JobManager in trouble.
            return cached, self._unreachable()
        try:
            directory = self.read_directory(now)
        except FlinkRestError as exc:
            self._failed_at = now
            if self._rest_error != str(exc):
                log.warning(
                    "%s: job directory from %s failed (%s)%s",
                    self.name,
                    self.config.rest_url,
                    exc,
                    "; using the cached one" if cached is not None else "",
                )
            self._rest_error = str(exc)
            return cached, self._unreachable()
        self._failed_at, self._rest_error = None, None
        directory.unresolved = {s for s in signatures if not _resolves(s, directory.jobs)}
        self._directory = directory
        return directory, ""

    def _unreachable(self) -> str:
        return f"JobManager REST at {self.config.rest_url} unreachable: {self._rest_error}"

    def _needs_refresh(
        self, cached: Directory | None, signatures: set[Signature], now: float
    ) -> bool:
        if cached is None:
            return True
        if now - cached.fetched_at >= self.config.directory_refresh_seconds:
            return True
        return any(s not in cached.unresolved and not _resolves(s, cached.jobs) for s in signatures)

    def read_directory(self, now: float | None = None) -> Directory:
        """The managed jobs from the JobManager: 1 call, plus 2 per running managed job."""
        self.directory_refreshes += 1
        overview = self.rest.get("/jobs/overview")
        try:
            listed = [(j["jid"], j["name"], j["state"]) for j in overview["jobs"]]
        except (KeyError, TypeError):
            raise FlinkRestError("/jobs/overview: unexpected answer") from None
        managed = [(jid, name, state) for jid, name, state in listed if self._jobs.fullmatch(name)]
        jobs = []
        for jid, _name, state in managed:
            if state != "RUNNING":
                continue
            try:
                job = self.rest.job(jid, self._overrides)
            except FlinkRestError as exc:
                # A job that ended between the two calls is simply not running.
                if "HTTP 404" in str(exc):
                    continue
                raise
            if job.state == "RUNNING":
                jobs.append(job)
        live = frozenset(
            safe_name(name) for _jid, name, state in managed if state not in ENDED_STATES
        )
        return Directory(tuple(jobs), live, self._clock() if now is None else now)


def _zombie(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True
