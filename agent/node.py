"""NodeAgent: one node's agent, wired from its units.

:class:`NodeAgent` holds no sockets itself and does little on its own. The
registration server, the controller link and the daemon loop call into it, and
it hands each call to the unit whose job it is:

- ``register / update / unregister`` from instances: checked, counted, kept in
  the :class:`~agent.registry.Registry`; engines (``agent.engines``) register
  whole thread sets through the registry and :meth:`NodeAgent.forget`;
- ``sample()`` every ``sample_seconds``: the :class:`~agent.cpu_sampler.CpuSampler`
  reads, then threads that exited leave the registry and the cgroups;
- ``report()`` every ``slot_seconds`` and ``hello()``: the
  :class:`~agent.reporter.Reporter`;
- ``handle_directive()``: :func:`agent.directives.handle_directive` over the
  :class:`~agent.enforcer.CapEnforcer`, the only unit that writes cgroups;
- ``on_contact() / check_lease()``: the :class:`~agent.lease.Lease`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
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
from agent.sampling import ThreadCpuReader, thread_alive
from dsched.ids import InstanceKey
from dsched_pb import dsched_pb2 as pb

log = logging.getLogger(__name__)


class NodeAgent:
    def __init__(
        self,
        config: AgentConfig,
        metrics: AgentMetrics | None = None,
        backend: CgroupTree | None = None,
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
            )
            log.info("enforcement: %s", why)
        self.registry = Registry()
        self.sampler = CpuSampler(
            self.registry,
            config.proc_root,
            config.resctrl_mount,
            resctrl_writable=not config.dry_run,
            capacity_limit=config.capacity_cores,
        )
        self.enforcer = CapEnforcer(
            backend, self.registry, self.metrics, self.sampler.capacity_cores, config.dry_run
        )
        if config.capacity_cores > 0:
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
    ) -> InstanceRecord:
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
            rec = self.registry.register(key, worker, stateful, pid, tid, source, upstream)
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
        return directives.handle_directive(self.enforcer, directive, self.epochs)

    def on_contact(self, welcome: pb.Welcome | None = None) -> None:
        self.lease.renew()
        if welcome is not None:
            self.epochs.follow(welcome.epoch)

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
            for lost in found.lost:
                # Only the threads that exited leave: an engine's discovery may have
                # changed the instance (new threads, a new process) since the pass.
                current = self.registry.get(lost.key)
                if current is None:
                    continue
                live = current.tids - lost.exited if lost.exited else set(lost.live)
                if live:
                    self.registry.set_tids(lost.key, live)
                    continue
                log.info("threads of %s are gone; forgetting it", lost.key)
                rec, cap = self.forget(lost.key, release=False)
                if rec is not None:
                    for listener in self.threads_gone_listeners:
                        listener(rec, cap)
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
