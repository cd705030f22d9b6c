"""EngineDiscovery: each engine's ThreadMapping applied to the agent, on its own thread.

A mapping is the whole truth about one engine on this node at one moment, so
applying it is a reconciliation, not a list of events:

- an instance seen for the first time is registered (source ``engine``, its
  kind kept on the record so reports carry ``engine``) with all its threads;
- a known instance gets exactly the mapped threads: new helper threads join
  its cgroup under its current cap at once, exited ones leave it;
- a known instance now in another process (a TaskManager restarted, a
  failover) loses its old registration and cgroup; the new threads are
  registered and capped with the cap the old ones had;
- an instance that is no longer mapped is unregistered and its cgroup removed
  (a cancelled job). While its application still lives (restarting, failing
  over) its cap is held, and given back when it appears again;
- an ``unavailable`` mapping (jcmd missing, the engine's API unreachable)
  changes nothing: the reason is recorded, logged once and exported.

The agent itself keeps caps per registered instance only (``CapEnforcer.caps``;
a directive for an unknown instance is refused), and forgets them when the
sampler sees every thread of an instance exit. For engine instances that
happens at every failover, so the cap is taken at that moment (a listener on
the agent) and held here.

Scans run on a thread of their own, each engine every ``scan_seconds``
(default: the agent's slot), so a slow ``jcmd`` never delays sampling or a
report. Applying a mapping holds the agent's ``instances_lock`` and the
enforcer's lock, so the sampler's findings and directives see it whole.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from agent.cgroups import CgroupError, ThreadGone
from agent.engines.base import NodeEngine
from agent.node import NodeAgent
from agent.registry import InstanceRecord, RegistrationError
from agent.sampling import thread_alive
from dsched.engines import InstanceThreads, ThreadMapping
from dsched.ids import InstanceKey
from dsched.names import InvalidName

log = logging.getLogger(__name__)

# Records an engine may take over: its own kind's, and cgroups re-adopted after an
# agent restart (their instances come back through the engine's first scan).
_TAKEN_OVER = ("engine", "adopted")


@dataclass
class EngineState:
    """What the agent knows of one engine between scans."""

    engine: NodeEngine
    owned: set[InstanceKey] = field(default_factory=set)
    # Caps of instances that left this node while their application lives.
    held: dict[InstanceKey, float] = field(default_factory=dict)
    unavailable: str | None = None
    last_scan: float | None = None
    refreshes_seen: int = 0
    skipped: set[InstanceKey] = field(default_factory=set)


@dataclass(frozen=True)
class Applied:
    """What applying one mapping did (for tests and the log)."""

    registered: int = 0
    updated: int = 0
    moved: int = 0
    unregistered: int = 0
    capped: int = 0
    unavailable: str | None = None


class EngineDiscovery:
    """Applies the engines' mappings to ``agent``; ``start()`` scans on a thread of its own."""

    def __init__(self, agent: NodeAgent, engines: Sequence[NodeEngine]):
        self.agent = agent
        self.states = [EngineState(e) for e in engines]
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        agent.threads_gone_listeners.append(self._threads_gone)
        for state in self.states:
            agent.metrics.engine_unavailable.labels(state.engine.name).set(0)

    # ------------------------------------------------------------ scanning

    def period(self, engine: NodeEngine) -> float:
        return engine.scan_seconds or self.agent.config.slot_seconds

    def scan(self) -> list[Applied]:
        """Scan every engine once, now."""
        return [self.scan_engine(state) for state in self.states]

    def scan_engine(self, state: EngineState) -> Applied:
        engine = state.engine
        started = time.monotonic()
        try:
            mapping = engine.map_threads()
        except Exception as exc:  # an engine bug must not end discovery for good
            log.exception("%s: scan failed", engine.name)
            mapping = ThreadMapping(unavailable=f"scan failed: {type(exc).__name__}: {exc}")
        metrics = self.agent.metrics
        if engine.directory_refreshes > state.refreshes_seen:
            metrics.engine_directory_refreshes.labels(engine.name).inc(
                engine.directory_refreshes - state.refreshes_seen
            )
            state.refreshes_seen = engine.directory_refreshes
        try:
            applied = self.apply(state, mapping)
        except Exception:  # a bug here must not end discovery either; the next scan retries
            log.exception("%s: applying the mapping failed", engine.name)
            applied = Applied()
        state.last_scan = time.monotonic()
        metrics.engine_scan_duration.labels(engine.name).observe(state.last_scan - started)
        return applied

    def start(self) -> None:
        if self._thread is None and self.states:
            self._thread = threading.Thread(
                target=self._run, name="dsched-engine-discovery", daemon=True
            )
            self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def _run(self) -> None:
        due = {id(s): time.monotonic() for s in self.states}
        while not self._stop.is_set():
            now = time.monotonic()
            for state in self.states:
                if now >= due[id(state)]:
                    self.scan_engine(state)
                    # From the scan's end: a scan slower than its period does not pile up.
                    due[id(state)] = time.monotonic() + self.period(state.engine)
            wait = min(due.values()) - time.monotonic()
            if wait > 0:
                self._stop.wait(wait)

    # ------------------------------------------------------------ applying a mapping

    def apply(self, state: EngineState, mapping: ThreadMapping) -> Applied:
        engine, metrics = state.engine, self.agent.metrics
        if mapping.unavailable is not None:
            if state.unavailable != mapping.unavailable:
                log.warning(
                    "%s: cannot map threads, keeping %d instances as they are: %s",
                    engine.name,
                    len(state.owned),
                    mapping.unavailable,
                )
            state.unavailable = mapping.unavailable
            metrics.engine_unavailable.labels(engine.name).set(1)
            return Applied(unavailable=mapping.unavailable)
        if state.unavailable is not None:
            log.info("%s: threads can be mapped again", engine.name)
            state.unavailable = None
            metrics.engine_unavailable.labels(engine.name).set(0)
        if mapping.unowned_threads:
            metrics.engine_unowned_threads.labels(engine.name).inc(mapping.unowned_threads)
        if mapping.ambiguous_threads:
            metrics.engine_ambiguous_threads.labels(engine.name).inc(mapping.ambiguous_threads)

        counts = dict(registered=0, updated=0, moved=0, unregistered=0, capped=0)
        agent = self.agent
        with agent.instances_lock, agent.enforcer.lock:
            # After the lease's `release` fallback no cap may come back on its own.
            if agent.fallback_applied and agent.config.fallback == "release":
                state.held.clear()
            seen: set[InstanceKey] = set()
            for inst in mapping.instances:
                if self._apply_instance(state, inst, counts):
                    seen.add(inst.key)
            for key in sorted(state.owned - seen):
                rec = agent.registry.get(key)
                if rec is not None and rec.source == "engine":
                    _rec, cap = agent.forget(key, release=True)
                    counts["unregistered"] += 1
                    if cap is not None:
                        state.held[key] = cap
                    log.info("%s: %s is gone from this node", engine.name, key)
                state.owned.discard(key)
            live = engine.live_apps()
            if live is not None:
                for key in [k for k in state.held if k.app not in live]:
                    del state.held[key]
            engine.watched_apps = frozenset(k.app for k in state.held)
        agent.refresh_gauges()
        metrics.engine_instances.labels(engine.name).set(len(state.owned))
        if counts["registered"]:
            metrics.engine_instances_found.labels(engine.name).inc(counts["registered"])
        if any(counts.values()):
            log.info(
                "%s: %d instances (%s)",
                engine.name,
                len(state.owned),
                ", ".join(f"{k} {v}" for k, v in counts.items() if v),
            )
        return Applied(**counts)

    def _apply_instance(self, state: EngineState, inst: InstanceThreads, counts: dict) -> bool:
        """Register or update one mapped instance; False when it is not taken."""
        agent, engine = self.agent, state.engine
        key = inst.key
        current = agent.registry.get(key)
        if current is not None and (
            current.source not in _TAKEN_OVER
            or (current.source == "engine" and key not in state.owned)
        ):
            # Registered over the socket, by a rule or by another engine: not ours.
            if key not in state.skipped:
                state.skipped.add(key)
                log.warning(
                    "%s: %s is already registered (source %s); leaving it alone",
                    engine.name,
                    key,
                    current.source,
                )
            return False
        state.skipped.discard(key)
        proc_root = agent.config.proc_root
        # jcmd listed them a moment ago; a thread may have exited since.
        tids = {t for t in inst.tids if thread_alive(proc_root, inst.pid, t)}
        if not tids:
            return False
        cap: float | None = None
        if current is not None and (current.pid != inst.pid or current.worker != inst.worker):
            # A new process (TaskManager restart, failover): the old cgroup goes, the
            # cap follows the instance.
            _old, cap = agent.forget(key, release=True)
            current = None
            counts["moved"] += 1
            log.info("%s: %s moved to process %d (%s)", engine.name, key, inst.pid, inst.worker)
        if current is None:
            held = state.held.pop(key, None)
            cap = cap if cap is not None else held
        try:
            rec, changed = agent.registry.register_threads(
                key,
                inst.worker,
                inst.stateful,
                inst.pid,
                tids,
                source="engine",
                upstream=inst.upstream,
                engine=engine.kind,
            )
        except RegistrationError as exc:
            agent.metrics.rejected_messages.labels(exc.reason).inc()
            log.warning("%s: cannot register %s: %s", engine.name, key, exc)
            return False
        new_to_engine = key not in state.owned
        state.owned.add(key)
        if new_to_engine:
            # New here, back in a new process, or re-adopted after an agent restart.
            counts["registered"] += 1
        elif changed:
            counts["updated"] += 1
        if current is None:
            if cap is not None and not (
                agent.fallback_applied and agent.config.fallback == "release"
            ):
                if self._cap(state, rec, cap):
                    counts["capped"] += 1
        elif changed:
            try:
                agent.enforcer.attach_new_threads(rec)
            except (CgroupError, InvalidName) as exc:
                agent.metrics.cgroup_errors.inc()
                log.error("%s: new threads of %s not capped: %s", engine.name, key, exc)
        return True

    def _cap(self, state: EngineState, rec: InstanceRecord, cap: float) -> bool:
        if not self.agent.enforcing:
            # The controller is in dry-run: nothing changes; the cap waits for the
            # instance's next return (or the controller's next directive).
            state.held[rec.key] = cap
            return False
        try:
            self.agent.enforcer.apply_cap(rec, cap)
            return True
        except ThreadGone:
            state.held[rec.key] = cap
        except (CgroupError, InvalidName) as exc:
            self.agent.metrics.cgroup_errors.inc()
            log.error("%s: cap %.3f for %s failed: %s", state.engine.name, cap, rec.key, exc)
        return False

    def _threads_gone(self, rec: InstanceRecord, cap: float | None) -> None:
        """Every thread of ``rec`` exited (seen by the sampler): hold its cap for its return."""
        for state in self.states:
            if rec.key in state.owned:
                state.owned.discard(rec.key)
                if cap is not None:
                    state.held[rec.key] = cap
