"""NodeAgent: one node's agent, wired from its units.

:class:`NodeAgent` holds no sockets itself and does little on its own. The
registration server, the controller link and the daemon loop call into it, and
it hands each call to the unit whose job it is:

- ``register / update / unregister`` from instances: checked, counted, kept in
  the :class:`~agent.registry.Registry`; engines (``agent.engines``) register
  whole thread sets through the registry and :meth:`NodeAgent.forget`;
- ``sample()`` every ``sample_seconds``: the :class:`~agent.cpu_sampler.CpuSampler`
  reads, then threads that exited leave the registry and the cgroups, and so do
  instances whose pid was given to another process (a different start time);
- ``report()`` every ``slot_seconds`` and ``hello()``: the
  :class:`~agent.reporter.Reporter`;
- ``handle_directive()``: :func:`agent.directives.handle_directive` over the
  :class:`~agent.enforcer.CapEnforcer`, the only unit that writes cgroups;
- ``on_contact() / check_lease()``: the :class:`~agent.lease.Lease`, and the
  controller's mode: a Welcome in dry-run makes the enforcer inactive (nothing
  on the node changes), a Welcome in enforce mode or any CapDirective
  activates it. Built with ``await_controller`` (the daemon), the agent changes
  nothing until then; built without (benchmarks, tests), it enforces at once.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from agent import directives
from agent.cgroups import CgroupTree, make_backend
from agent.config import AgentConfig
from agent.cpu_sampler import CpuSampler
from agent.enforcer import CapEnforcer
from agent.lease import Lease
from agent.metrics import AgentMetrics
from agent.registry import InstanceRecord, RegistrationError, Registry, make_key
from agent.reporter import Reporter
from agent.sampling import RootThreadsCpu, ThreadCpuReader, process_start_ticks, thread_alive
from dsched.ids import InstanceKey
from dsched_pb import dsched_pb2 as pb

log = logging.getLogger(__name__)


class NodeAgent:
    def __init__(
        self,
        config: AgentConfig,
        metrics: AgentMetrics | None = None,
        backend: CgroupTree | None = None,
        *,
        await_controller: bool = False,
    ):
        self.config = config
        self.metrics = metrics or AgentMetrics()
        if backend is None:
            backend, why = make_backend(
                config.cgroup_mode,
                config.cgroup_mount,
                config.cgroup_root,
                config.cpu_period_us,
                config.dry_run,
                config.proc_root,
            )
            log.info("enforcement: %s", why)
        # Every record keeps its process's start time, read under proc_root.
        self.registry = Registry(functools.partial(process_start_ticks, config.proc_root))
        self.sampler = CpuSampler(
            self.registry,
            config.proc_root,
            config.resctrl_mount,
            resctrl_writable=not config.dry_run and not await_controller,
            capacity_limit=config.capacity_cores,
            root_threads=(
                RootThreadsCpu(functools.partial(backend.tids, backend.root), config.proc_root)
                if config.node_cpu == "cgroup"
                else None
            ),
        )
        self.enforcer = CapEnforcer(
            backend,
            self.registry,
            self.metrics,
            self.sampler.capacity_cores,
            config.dry_run,
            config.proc_root,
            # Until the controller says it enforces, nothing on the node changes.
            active=not await_controller,
            root_limit_cores=self.sampler.capacity_cores if config.capacity_cores > 0 else None,
        )
        self.enforcer.limit_root()
        self.reporter = Reporter(config, self.registry, self.sampler, self.enforcer)
        self.lease = Lease(config.lease_epochs, config.slot_seconds, self.metrics)
        self.epochs = directives.DirectiveEpochs()
        self.metrics.instance_cpu_usage.source = self.sampler.usage_by_instance
        # Held while the sampler's findings are applied and while an engine's
        # mapping is applied (they run on different threads): each sees the
        # other's changes whole. Order: this lock, then the enforcer's.
        self.instances_lock = threading.RLock()
        # Called with (record, cap in force) when an instance is forgotten because
        # all its threads exited; engines keep the cap for the instance's return.
        self.threads_gone_listeners: list[Callable[[InstanceRecord, float | None], None]] = []
        self.adopt()

    # What bench/, testbed/ and the tests read of the agent.
    @property
    def backend(self) -> CgroupTree:
        return self.enforcer.backend

    @property
    def caps(self) -> dict[InstanceKey, float]:
        return self.enforcer.caps

    @property
    def cgroups(self) -> dict[InstanceKey, Path]:
        return self.enforcer.cgroups

    @property
    def capacity_cores(self) -> float:
        return self.sampler.capacity_cores

    @property
    def thread_cpu(self) -> ThreadCpuReader:
        return self.sampler.thread_cpu

    @property
    def last_contact(self) -> float:
        return self.lease.last_contact

    @property
    def fallback_applied(self) -> bool:
        return self.lease.fallback_applied

    # ------------------------------------------------------------ instances

    def adopt(self) -> int:
        """Take over the cgroups a previous agent left: caps stay, empty ones go."""
        adopted = self.enforcer.adopt(self.config.proc_root)
        self._refresh_gauges()
        return adopted

    def register(
        self,
        app: Any,
        operator: Any,
        instance: Any,
        worker: Any,
        stateful: Any,
        pid: Any,
        tid: Any,
        source: str = "registration",
        upstream: Any = (),
        start_time: int | None = None,
    ) -> InstanceRecord:
        """Register thread ``tid`` of process ``pid`` as the instance's.

        ``start_time``: when the caller found the process (clock ticks after boot,
        as :func:`~agent.sampling.process_start_ticks` reads it); the registration
        is refused if ``pid`` names another process by now. Either way the record
        keeps the start time of the process the thread belongs to.
        """
        try:
            key = make_key(app, operator, instance)
            if (
                not isinstance(pid, int)
                or not isinstance(tid, int)
                or not thread_alive(self.config.proc_root, pid, tid)
            ):
                raise RegistrationError(
                    "no_such_thread", f"thread {tid} of process {pid} does not exist"
                )
            started = process_start_ticks(self.config.proc_root, pid)
            if started is None or (start_time is not None and started != start_time):
                raise RegistrationError(
                    "no_such_thread", f"process {pid} exited (its pid may name another one now)"
                )
            self._forget_if_reused(key, pid, started)
            rec = self.registry.register(
                key, worker, stateful, pid, tid, source, upstream, start_time=started
            )
        except RegistrationError as exc:
            self._reject(exc)
            raise
        self._refresh_gauges()
        return rec

    def update(self, app: Any, operator: Any, instance: Any, counters: dict[str, Any]) -> None:
        """New cumulative counters; ``counters`` may be the whole wire message (extra keys
        are ignored)."""
        try:
            self.registry.update_named(app, operator, instance, counters)
        except RegistrationError as exc:
            self._reject(exc)
            raise

    def update_many(self, items: list[Any]) -> list[tuple[int, RegistrationError]]:
        """Apply a batch of updates, each a dict with ``app``, ``operator``, ``instance`` and
        the counters. A refused item is counted and reported by its index; the others
        still apply."""
        refused = self.registry.update_many(items)
        for _index, exc in refused:
            self._reject(exc)
        return refused

    def unregister(self, app: Any, operator: Any, instance: Any) -> None:
        try:
            key = make_key(app, operator, instance)
        except RegistrationError as exc:
            self._reject(exc)
            raise
        self._forget(key, release=True)

    def _forget_if_reused(self, key: InstanceKey, pid: int, started: int) -> None:
        """A record of ``key`` made for an earlier process with this pid is gone: forget it
        before a thread of the process now running under the pid registers."""
        process = self.registry.process(key)
        if process is None or process[0] != pid or process[1] in (None, started):
            return
        with self.instances_lock:
            current = self.registry.get(key)
            if (
                current is not None
                and current.pid == pid
                and current.start_time not in (None, started)
            ):
                self._forget_reused([current])

    def _reject(self, exc: RegistrationError) -> None:
        self.metrics.rejected_messages.labels(exc.reason).inc()
        log.warning("refused instance message (%s): %s", exc.reason, exc)

    def forget(self, key: InstanceKey, release: bool) -> tuple[InstanceRecord | None, float | None]:
        """Drop ``key`` from the registry, the enforcer (its cgroup goes) and the sampler.

        ``release`` lifts the cap first, for threads that live on. Returns the
        record and the cap that was in force.
        """
        rec = self.registry.unregister(key)
        cap = self.enforcer.forget(key, release)
        self.sampler.forget(key)
        self._refresh_gauges()
        return rec, cap

    def _forget(self, key: InstanceKey, release: bool) -> None:
        self.forget(key, release)

    def _threads_gone(self, key: InstanceKey) -> None:
        """The instance's process is gone: forget it, its cap not lifted (nothing of it
        runs), and tell the listeners."""
        rec, cap = self.forget(key, release=False)
        if rec is not None:
            for listener in self.threads_gone_listeners:
                listener(rec, cap)

    def _forget_reused(self, stale: Sequence[InstanceRecord]) -> None:
        """Forget instances whose pid names another process now, as if their threads had
        exited (they have); logged once per process, counted per instance."""
        by_process: dict[tuple[int, int | None], list[InstanceKey]] = {}
        for rec in stale:
            by_process.setdefault((rec.pid, rec.start_time), []).append(rec.key)
        for (pid, start), keys in by_process.items():
            shown = ", ".join(str(k) for k in keys[:5])
            more = f" and {len(keys) - 5} more" if len(keys) > 5 else ""
            log.warning(
                "process %d (started at tick %s) is gone and its pid names another process "
                "now; forgetting %s%s",
                pid,
                start,
                shown,
                more,
            )
            for key in keys:
                self.metrics.pid_reused.inc()
                self._threads_gone(key)

    def refresh_gauges(self) -> None:
        """Instances and threads managed, after a change made outside ``register``."""
        self._refresh_gauges()

    def _refresh_gauges(self) -> None:
        self.metrics.instances_managed.set(len(self.registry))
        self.metrics.threads_managed.set(self.registry.thread_count())

    # ------------------------------------------------------------ caps and lease

    def apply_cap(self, rec: InstanceRecord, cap: float | None) -> None:
        """Enforce ``cap`` cores on ``rec`` (None removes the cap). Raises ThreadGone/CgroupError."""
        self.enforcer.apply_cap(rec, cap)

    def handle_directive(self, directive: pb.CapDirective) -> pb.Ack:
        self.on_contact()
        # Only an enforcing controller sends directives.
        self.set_enforcing(True)
        return directives.handle_directive(self.enforcer, directive, self.epochs)

    def on_contact(self, welcome: pb.Welcome | None = None) -> None:
        self.lease.renew()
        if welcome is not None:
            self.epochs.follow(welcome.epoch)
            # A controller that does not say its mode leaves the agent as it is.
            if welcome.mode == pb.ENFORCE:
                self.set_enforcing(True)
            elif welcome.mode == pb.DRY_RUN:
                self.set_enforcing(False)

    def set_enforcing(self, enforcing: bool) -> None:
        """Follow the controller's mode: change the node (cgroups, resctrl groups) only
        while it enforces."""
        with self.instances_lock:
            self.sampler.resctrl.writable = enforcing and not self.config.dry_run
            if enforcing:
                self.enforcer.activate()
            else:
                self.enforcer.deactivate()

    @property
    def enforcing(self) -> bool:
        return self.enforcer.active

    def check_lease(self, now: float | None = None) -> bool:
        """Apply the fallback once when the controller has been silent too long; True if applied now."""
        return self.lease.check(self.enforcer, self.config.fallback, now)

    # ------------------------------------------------------------ sampling and reports

    def sample(self) -> None:
        """One pass of the sampler, then what it found: new threads into their cgroups,
        exited ones out of the registry, empty cgroups removed."""
        started = time.monotonic()
        found = self.sampler.sample(started)
        with self.instances_lock:
            for rec in found.rebuilt:
                self.enforcer.attach_new_threads(rec)
            reused: list[InstanceRecord] = []
            for lost in found.lost:
                # Only the threads that exited leave: an engine's discovery may have
                # changed the instance (new threads, a new process) since the pass.
                current = self.registry.get(lost.key)
                if current is None:
                    continue
                if lost.stale is not None:
                    # Still the record of the process that is gone: all of it goes. A
                    # record made since is another process's, and none of it was read.
                    if (current.pid, current.start_time) == lost.stale:
                        reused.append(current)
                    continue
                live = current.tids - lost.exited if lost.exited else set(lost.live)
                if live:
                    self.registry.set_tids(lost.key, live)
                    continue
                log.info("threads of %s are gone; forgetting it", lost.key)
                self._threads_gone(lost.key)
            if reused:
                self._forget_reused(reused)
            self.enforcer.remove_orphans()
        self._refresh_gauges()
        self.metrics.sample_duration.observe(time.monotonic() - started)

    def hello(self) -> pb.Hello:
        return self.reporter.hello()

    def report(self) -> pb.NodeReport:
        """The NodeReport for the slot that ends now; starts the next slot."""
        return self.reporter.report()

    def close(self) -> None:
        self.sampler.close()
