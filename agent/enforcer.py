"""The cap enforcer: the only part of the agent that writes cgroups.

A cap arrives as cores for one registered instance (from a directive, the
fallback policy, a benchmark). The instance's cgroup is created with its first
cap, the instance's threads are moved into it and the quota is written; every
directory's scheduling weight follows the threads below it; cgroups whose
threads are gone are removed, at once or, while threads linger, on every later
sample. docs/agent.md, "Cgroup layout", describes the tree.

Threads are moved by number, so before it moves any, the enforcer checks that
the instance's pid still names the process its record was made for (the same
start time); if not, nothing is moved and the sampler's next rebuild hands the
instance back as gone.

Writes happen only while ``active``: the agent's daemon starts the enforcer
inactive and activates it on the controller's word that it enforces (a Welcome
in enforce mode, or a CapDirective); a Welcome in dry-run makes it inactive
again. While inactive nothing on the node changes: no root quota, no cgroup
created, written, moved into or removed (an adopted cgroup whose threads are
gone, or one whose instance left, waits for activation), no fallback release;
caps already in force stay as they are. docs/agent.md, "Dry-run".

Every other unit reads what the enforcer holds (``caps``, ``cgroups``) under
``lock`` and never touches the backend itself.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path

from agent.cgroups import CgroupError, CgroupTree, ThreadGone, Throttling
from agent.metrics import AgentMetrics, instance_labels
from agent.registry import InstanceRecord, Registry
from agent.sampling import process_start_ticks, thread_group
from dsched.ids import InstanceKey
from dsched.names import InvalidName

log = logging.getLogger(__name__)


class NotEnforcing(CgroupError):
    """A write was asked for while the enforcer is inactive (the controller is in dry-run)."""


@dataclass(eq=False)
class CapEnforcer:
    """Caps per instance, written through ``backend``; ``capacity_cores`` bounds a cap."""

    backend: CgroupTree
    registry: Registry
    metrics: AgentMetrics
    capacity_cores: float
    dry_run: bool = False
    proc_root: str = "/proc"
    # False: change nothing on the node (see the module doc); set by activate().
    active: bool = True
    # Quota of each dsched root (the configured capacity); None: no root quota.
    root_limit_cores: float | None = None
    caps: dict[InstanceKey, float] = field(default_factory=dict, init=False)
    cgroups: dict[InstanceKey, Path] = field(default_factory=dict, init=False)
    # Re-entrant: a directive holds it across every entry it applies.
    lock: threading.RLock = field(default_factory=threading.RLock, init=False, repr=False)
    _attached: dict[InstanceKey, set[int]] = field(default_factory=dict, init=False, repr=False)
    # Cgroups of forgotten instances still to remove; True: move their threads back
    # to their own cgroups first (a released cap), False: wait until they left.
    _orphans: dict[Path, bool] = field(default_factory=dict, init=False, repr=False)
    _cap_labels: dict[InstanceKey, tuple[str, str, str, str]] = field(
        default_factory=dict, init=False, repr=False
    )
    _weights_written: dict[Path, int] = field(default_factory=dict, init=False, repr=False)
    # Instances whose threads were refused because their pid names another process
    # (logged once each, until forgotten).
    _refused: set[InstanceKey] = field(default_factory=set, init=False, repr=False)

    def __post_init__(self) -> None:
        self.backend.root_limit_cores = self.root_limit_cores

    def activate(self) -> None:
        """The controller enforces: do what waited (root quotas, removals, new threads)."""
        with self.lock:
            if self.active:
                return
            self.active = True
            log.info("the controller enforces: cgroup writes start")
            self.limit_root()
            self.remove_orphans()
            for key in list(self.caps):
                rec = self.registry.get(key)
                if rec is not None:
                    try:
                        self.attach_new_threads(rec)
                    except (CgroupError, InvalidName) as exc:
                        log.error("threads of %s not moved into its cgroup: %s", key, exc)
            self.rebalance_weights()

    def deactivate(self) -> None:
        """The controller is in dry-run: change nothing from now on; caps in force stay."""
        with self.lock:
            if self.active:
                log.info("the controller is in dry-run: no cgroup is written until it enforces")
            self.active = False

    def claims(self) -> bool:
        """Whether the caps held are in force (reported in Hello and NodeReport): not in dry-run."""
        return not self.dry_run

    def enforced_caps(self) -> list[tuple[InstanceKey, float]]:
        """The caps in force, the same for the Hello and every report."""
        return self.current_caps() if self.claims() else []

    def limit_root(self) -> None:
        """Cap each dsched root at ``root_limit_cores``, so the kernel grants what is planned with."""
        if not self.active or self.root_limit_cores is None:
            return
        try:
            self.backend.limit_roots()
        except (OSError, CgroupError, InvalidName) as exc:
            log.error("cannot cap the cgroup roots at %.2f cores: %s", self.root_limit_cores, exc)

    def adopt(self, proc_root: str) -> int:
        """Take over the cgroups a previous agent left: caps stay, empty ones go.

        Live threads are registered (source ``adopted``) so that the instance
        keeps its cap until it registers again or its threads exit.
        """
        adopted = 0
        for cg in self.backend.adopt():
            live = [t for t in cg.tids if thread_group(proc_root, t) is not None]
            pid = thread_group(proc_root, live[0]) if live else None
            if pid is None:
                # Removed now, or on activation while the controller is in dry-run.
                with self.lock:
                    self._orphans[cg.path] = False
                continue
            for tid in live:
                self.registry.register(cg.key, cg.worker, False, pid, tid, source="adopted")
            with self.lock:
                self.cgroups[cg.key] = cg.path
                self._attached[cg.key] = set(live)
                if cg.cap_cores is not None:
                    self.caps[cg.key] = cg.cap_cores
            adopted += 1
        if adopted:
            log.info("re-adopted %d instance cgroups under %s", adopted, self.backend.mount)
        if self.active:
            self.remove_orphans()
        return adopted

    def apply_cap(self, rec: InstanceRecord, cap: float | None) -> None:
        """Enforce ``cap`` cores on ``rec`` (None lifts the quota, threads stay in its cgroup).

        Raises ThreadGone/CgroupError, and NotEnforcing while inactive.
        """
        key = rec.key
        with self.lock:
            if not self.active:
                raise NotEnforcing(f"cap for {key} not written: the controller is in dry-run")
            path = self.cgroups.get(key)
            if cap is None:
                self.caps.pop(key, None)
                if path is not None:
                    self._write_cap(path, None)
                self._drop_labels(key)
                return
            checked = False
            if path is None:
                # The cgroup is made inside the threads' own: it must be the right process.
                if not self._same_process(rec):
                    raise ThreadGone(
                        f"process {rec.pid} of {key} exited or its pid names another "
                        "process now; nothing capped"
                    )
                checked = True
                anchor = self._anchor(rec)
                path = self.backend.create(key, rec.worker, rec.pid, anchor)
                self.cgroups[key] = path
            attached = self._attach(rec, path, checked)
            if not attached and self.backend.mode != "none":
                self.cgroups.pop(key, None)
                self._attached.pop(key, None)
                self._remove(path)
                raise ThreadGone(f"every thread of {key} exited before its cap was written")
            self._write_cap(path, cap)
            self.caps[key] = cap
            if not self.dry_run:
                labels = instance_labels(key, rec.worker)
                self.metrics.instance_cpu_cap.labels(*labels).set(cap)
                self._cap_labels[key] = labels

    def release(self, key: InstanceKey) -> bool:
        """Remove ``key``'s cap: its threads go back to the cgroup they came from and its
        cgroup is removed. False when it had no cgroup. Raises CgroupError, NotEnforcing."""
        with self.lock:
            if not self.active:
                raise NotEnforcing(f"cap of {key} not released: the controller is in dry-run")
            self.caps.pop(key, None)
            self._drop_labels(key)
            path = self.cgroups.pop(key, None)
            self._attached.pop(key, None)
            if path is None:
                return False
            if not self._empty_out(path):
                # A thread that could not be moved keeps the cgroup: no quota on it, and
                # the cgroup is retried with the other orphans.
                self._write_cap(path, None)
                self._orphans[path] = True
            return True

    def release_all(self) -> int:
        """Remove every cap (threads back to their own cgroups); returns how many were released."""
        released = 0
        with self.lock:
            if not self.active:
                return 0
            for key in list(self.caps):
                try:
                    self.release(key)
                    released += 1
                except CgroupError as exc:
                    self.metrics.cgroup_errors.inc()
                    log.error("releasing cap of %s failed: %s", key, exc)
        return released

    def forget(self, key: InstanceKey, release: bool) -> float | None:
        """Drop an instance that left; its cgroup goes now or once its threads have left it.

        ``release``: threads that live on go back to the cgroup they came from first.
        Returns the cap that was in force (engines re-apply it when the instance
        comes back in a new process).
        """
        with self.lock:
            path = self.cgroups.pop(key, None)
            cap = self.caps.pop(key, None)
            self._attached.pop(key, None)
            self._refused.discard(key)
            labels = self._cap_labels.pop(key, None)
        if labels is not None:
            self.metrics.forget_instance(labels)
        if path is None:
            return cap
        with self.lock:
            if not self.active:
                # Nothing changes while the controller is in dry-run: removed on activation.
                self._orphans[path] = release
                return cap
            if release:
                if not self._empty_out(path):
                    try:
                        self._write_cap(path, None)
                    except CgroupError as exc:
                        log.debug("releasing %s before removal: %s", path, exc)
                    self._orphans[path] = True
            elif not self._remove(path):
                self._orphans[path] = False
        return cap

    def remove_orphans(self) -> None:
        """Retry removing the cgroups of forgotten instances whose threads lingered; the
        threads of a released one go back to the cgroup they came from first."""
        with self.lock:
            if not self.active:
                return
            for path, release in list(self._orphans.items()):
                if path in self.cgroups.values():
                    del self._orphans[path]  # taken again by a new instance record
                elif self._empty_out(path) if release else self._remove(path):
                    del self._orphans[path]

    def remove_empty(self) -> None:
        """On the agent's stop: remove every cgroup of the tree no thread is left in,
        and the root itself once nothing is left in it. Cgroups that still hold
        threads keep them and their caps (caps stay in place when the agent stops)."""
        with self.lock:
            if self.dry_run or not self.active:
                return
            self.remove_orphans()
            self.backend.remove_root()

    def attach_new_threads(self, rec: InstanceRecord) -> None:
        """Threads that joined a capped instance go into its cgroup; departed ones are dropped."""
        with self.lock:
            path = self.cgroups.get(rec.key)
            if path is None or rec.key not in self.caps or not self.active:
                return
            attached = self._attached.get(rec.key, set()) & rec.tids
            self._attached[rec.key] = attached
            if rec.tids - attached:
                self._attach(rec, path)

    def rebalance_weights(self) -> None:
        """Keep each cgroup's scheduling weight equal to the threads inside it."""
        with self.lock:
            if not self.active:
                return
            threads = {path: len(self._attached.get(key, ())) for key, path in self.cgroups.items()}
        wanted = self.backend.weights(threads)
        for path, n in sorted(wanted.items(), key=lambda kv: len(kv[0].parts)):
            if self._weights_written.get(path) == n:
                continue
            try:
                self.backend.set_weight(path, n)
                self._weights_written[path] = n
            except (OSError, CgroupError, InvalidName) as exc:
                log.debug("weight of %s not set: %s", path, exc)
        for gone in set(self._weights_written) - set(wanted):
            del self._weights_written[gone]

    def current_caps(self) -> list[tuple[InstanceKey, float]]:
        with self.lock:
            return sorted(self.caps.items())

    def enforced(self, key: InstanceKey) -> tuple[float | None, Throttling | None]:
        """The cap on ``key`` and, when capped, its throttling counters (else None)."""
        with self.lock:
            cap = self.caps.get(key)
            path = self.cgroups.get(key)
        # An uncapped cgroup is never throttled: its cpu.stat is not worth a read.
        if cap is None or path is None or self.backend.mode == "none":
            return cap, None
        return cap, self.backend.throttling(path)

    def _write_cap(self, path: Path, cap: float | None) -> None:
        self.backend.set_cap(path, cap)
        # Counts writes to the kernel: a backend that writes nothing (dry-run) counts none.
        if self.backend.mode != "none":
            self.metrics.cap_writes.inc()

    def _drop_labels(self, key: InstanceKey) -> None:
        labels = self._cap_labels.pop(key, None)
        if labels is not None:
            self.metrics.forget_instance(labels)

    def _anchor(self, rec: InstanceRecord) -> Path:
        """Where ``rec``'s cgroup nests: the cgroup its first live thread is in."""
        last: CgroupError | None = None
        for tid in sorted(rec.tids):
            try:
                return self.backend.anchor_of(rec.pid, tid)
            except ThreadGone as exc:
                self.metrics.threads_vanished.inc()
                last = exc
        raise last or ThreadGone(f"{rec.key} has no thread")

    def _empty_out(self, path: Path) -> bool:
        """Move every thread in ``path`` back to its anchor, then remove it; True if removed."""
        for tid in self.backend.tids(path):
            try:
                self.backend.detach(path, tid)
            except ThreadGone:
                continue
            except (CgroupError, InvalidName) as exc:
                log.warning("thread %d not moved out of %s: %s", tid, path, exc)
        return self._remove(path)

    def _same_process(self, rec: InstanceRecord) -> bool:
        """True when ``rec.pid`` still names the process ``rec`` was made for (or when
        its start time is unknown); False when that process is gone, its pid free or
        given to another process."""
        if rec.start_time is None:
            return True
        now = process_start_ticks(self.proc_root, rec.pid)
        if now == rec.start_time:
            return True
        if now is None:
            log.debug("process %d of %s is gone; no thread moved", rec.pid, rec.key)
        elif rec.key not in self._refused:
            self._refused.add(rec.key)
            log.warning(
                "not moving threads of %s: pid %d names another process now "
                "(started at tick %d, not %d)",
                rec.key,
                rec.pid,
                now,
                rec.start_time,
            )
        return False

    def _attach(self, rec: InstanceRecord, path: Path, checked: bool = False) -> set[int]:
        """Move the instance's threads into its cgroup; vanished ones are skipped quietly.

        Nothing is moved unless ``rec.pid`` is still the process ``rec`` was made
        for (``checked``: the caller has just found it is).
        """
        attached = self._attached.setdefault(rec.key, set())
        todo = rec.tids - attached
        if todo and not checked and not self._same_process(rec):
            return attached
        anchor = self.backend.split(path) if self.backend.mode != "none" else None
        for tid in sorted(todo):
            try:
                if anchor is not None and self.backend.anchor_of(rec.pid, tid) != anchor[0]:
                    # Moving it would take it out of its own (container's) cgroup.
                    log.warning(
                        "thread %d of %s is not in %s; left where it is", tid, rec.key, anchor[0]
                    )
                    continue
                self.backend.attach(path, rec.pid, tid)
                attached.add(tid)
            except ThreadGone:
                self.metrics.threads_vanished.inc()
                log.debug("thread %d of %s exited before it was capped", tid, rec.key)
        return attached

    def _remove(self, path: Path) -> bool:
        removed = self.backend.remove(path)
        if removed and self.backend.mode != "none":
            self.metrics.cgroups_removed.inc()
        return removed
