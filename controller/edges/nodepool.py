"""Where the cluster's size changes: the DP's one-node-more or one-node-fewer
recommendation carried out (or only recorded), with a cool-down and a back-off.

The recommendation is computed by the pure allocation stage
(:func:`controller.stages.allocation.node_recommendation`); this edge decides
whether it may act now and hands it to a :class:`NodePool`, chosen by name in
``[node_pool] strategy``:

* ``log`` (default): records what it would do, changes nothing;
* ``command``: runs the operator's add or remove program (a real cluster's
  autoscaling group, cloud CLI or ``kubectl``), killed after a timeout;
* ``testbed``: starts or stops an extra agent node of the live testbed on this
  machine, the way ``dsched demo --nodes 2`` starts its second one.

The simulator brings its own pool (``testbed/sim/nodepool.py``) through
:meth:`NodePoolEdge.use`. Pools that block (processes to start, commands to
wait for) run on a thread of their own, so a hanging command never holds an
epoch: its outcome is reported in the record of the first epoch after it
finished. docs/node-pool.md describes the strategies and the command's
contract.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import tempfile
import threading
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Protocol

from dsched.config import ConfigError
from dsched.registry import Registry

if TYPE_CHECKING:
    from controller.config import (
        ControllerConfig,
        NodePoolCommandConfig,
        NodePoolConfig,
        NodePoolTestbedConfig,
    )
    from controller.epoch import EpochResult

log = logging.getLogger(__name__)

ACTIONS = {1: "add", -1: "remove"}
# Outcomes after which the cool-down holds the next change.
SETTLED = ("done", "logged", "dry-run")
# Bytes of a command's stderr (and stdout) kept for the record.
TAIL_BYTES = 400
# A command killed at its timeout gets this long between SIGTERM and SIGKILL.
KILL_GRACE_SECONDS = 3.0
# How long a stopping controller waits for a change still running.
CLOSE_WAIT_SECONDS = 5.0
# Key of the edge's state in the controller's store (survives a restart).
STATE_KEY = "node_pool"


@dataclass(frozen=True)
class NodeChange:
    """One change handed to a pool."""

    action: str  # "add" or "remove"
    epoch: int
    nodes: tuple[str, ...]  # connected nodes now
    # remove: the node the controller would take away (the least loaded); None for add.
    node: str | None
    reason: str  # the DP's reason
    instances: Mapping[str, int] = field(default_factory=dict)  # node -> instances on it
    # app -> its QoS class weight. A pool that moves instances onto a new node (or off
    # a leaving one) moves the lightest classes first: a move pauses an instance,
    # and gold's violation bound is the one a pause breaks.
    weights: Mapping[str, float] = field(default_factory=dict)

    @property
    def target(self) -> int:
        return len(self.nodes) + (1 if self.action == "add" else -1)


@dataclass
class NodeChangeResult:
    """What a pool did: ``outcome`` is done, logged, failed or refused."""

    outcome: str
    reason: str
    node: str | None = None  # the node added or removed, when known


class NodePool(Protocol):
    """Adds or removes one node; never raises for a failed change (the result says)."""

    name: str
    # True: the change takes time (processes, commands) and runs off the epoch's thread.
    blocking: bool

    def add(self, change: NodeChange) -> NodeChangeResult: ...

    def remove(self, change: NodeChange) -> NodeChangeResult: ...

    def close(self) -> None: ...


class LogNodePool:
    """Records the change it would make; the cluster stays as it is."""

    name = "log"
    blocking = False

    def add(self, change: NodeChange) -> NodeChangeResult:
        return NodeChangeResult("logged", f"would add a node ({change.reason})")

    def remove(self, change: NodeChange) -> NodeChangeResult:
        return NodeChangeResult(
            "logged", f"would remove node {change.node} ({change.reason})", change.node
        )

    def close(self) -> None:
        pass


def _tail(fh: IO[bytes]) -> str:
    """The last bytes a command wrote, as one line of text."""
    fh.seek(0, os.SEEK_END)
    size = fh.tell()
    fh.seek(max(0, size - TAIL_BYTES))
    text = fh.read().decode("utf-8", errors="replace")
    return " | ".join(line.strip() for line in text.splitlines() if line.strip())


def _stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM to the command's process group, SIGKILL after a grace period: a
    script's children (a `sleep`, an `ssh`) go with it."""
    for sig, wait in ((signal.SIGTERM, KILL_GRACE_SECONDS), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(wait)
            if sig == signal.SIGKILL:
                return
        except subprocess.TimeoutExpired:
            continue
        # The leader exited on SIGTERM; anything it left in its group is killed.
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        return


def run_command(
    argv: list[str], env: Mapping[str, str], timeout: float
) -> tuple[NodeChangeResult, str]:
    """Run ``argv`` (no shell) with ``env`` added to the controller's environment;
    the result and the last line the command printed on stdout.

    Output goes to temporary files, not pipes: a killed script's children
    could keep a pipe open and hold the controller reading it.
    """
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                env={**os.environ, **env},
                start_new_session=True,
            )
        except OSError as exc:
            return NodeChangeResult("failed", f"cannot run {argv[0]}: {exc.strerror or exc}"), ""
        try:
            code = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            _stop_group(proc)
            said = _tail(err)
            return NodeChangeResult(
                "failed",
                f"timed out after {timeout:g} s, killed" + (f": {said}" if said else ""),
            ), ""
        if code != 0:
            said = _tail(err) or _tail(out)
            how = f"killed by signal {-code}" if code < 0 else f"exit {code}"
            return NodeChangeResult("failed", how + (f": {said}" if said else "")), ""
        last = _tail(out).rsplit(" | ", 1)[-1]
        return NodeChangeResult("done", f"{argv[0]} exit 0" + (f": {last}" if last else "")), last


class CommandNodePool:
    """Runs the operator's program for each change (docs/node-pool.md, "command")."""

    name = "command"
    blocking = True

    def __init__(self, config: NodePoolCommandConfig):
        self.config = config

    def _env(self, change: NodeChange) -> dict[str, str]:
        env = {
            "DSCHED_NODE_POOL_ACTION": change.action,
            "DSCHED_NODES": str(len(change.nodes)),
            "DSCHED_NODES_TARGET": str(change.target),
            "DSCHED_EPOCH": str(change.epoch),
            "DSCHED_REASON": change.reason,
        }
        if change.node is not None:
            env["DSCHED_NODE"] = change.node
        return env

    def add(self, change: NodeChange) -> NodeChangeResult:
        res, last = run_command(self.config.add, self._env(change), self.config.timeout_seconds)
        # By contract, an add command may print the new node's id as its last line.
        res.node = last or None
        return res

    def remove(self, change: NodeChange) -> NodeChangeResult:
        res, _ = run_command(self.config.remove, self._env(change), self.config.timeout_seconds)
        res.node = change.node
        return res

    def close(self) -> None:
        pass


class TestbedNodePool:
    """Extra agent nodes of the live testbed on this machine.

    Started with the testbed's own :class:`testbed.live.cluster.LocalCluster`
    (the code `dsched demo --nodes 2` starts its agents with), pointed at this
    controller. Only nodes it started are ever stopped, and only when no
    instance runs on them: placement empties a node first.
    """

    name = "testbed"
    blocking = True
    __test__ = False  # not a pytest class, whatever its name

    def __init__(
        self,
        config: NodePoolTestbedConfig,
        *,
        listen: str,
        workdir: Path,
        slot_seconds: float,
    ):
        try:
            from testbed.live.cluster import LocalCluster
        except ImportError:
            raise ConfigError(
                "node_pool.strategy",
                "the testbed node pool needs the source tree's testbed package "
                "(it is not part of the installed daemons)",
            ) from None
        self.config = config
        self._cluster = LocalCluster(
            workdir, slot_seconds=slot_seconds, agent_dry_run=config.agent_dry_run
        )
        # The agents connect to the controller that runs this pool.
        self._cluster.listen = listen
        self.started: list[str] = []  # nodes this pool started, oldest first

    def add(self, change: NodeChange) -> NodeChangeResult:
        from testbed.live.cluster import NodeSpec

        taken = set(change.nodes) | set(self.started)
        k = 1
        while f"{self.config.node_prefix}{k}" in taken:
            k += 1
        node = f"{self.config.node_prefix}{k}"
        spec = NodeSpec(
            node,
            cgroup_root=f"{self.config.cgroup_root}-{node}",
            extra_config={"capacity_cores": self.config.node_cores},
        )
        self._cluster.workdir.mkdir(parents=True, exist_ok=True)
        try:
            agent = self._cluster.start_agent(spec)
        except (OSError, RuntimeError) as exc:
            self._cluster.agents.pop(node, None)
            return NodeChangeResult("failed", f"agent {node} did not start: {exc}"[:500], node)
        self.started.append(node)
        return NodeChangeResult(
            "done",
            f"started agent {node} ({self.config.node_cores:g} cores, pid {agent.proc.pid})",
            node,
        )

    def remove(self, change: NodeChange) -> NodeChangeResult:
        mine = [n for n in self.started if n in self._cluster.agents]
        if not mine:
            return NodeChangeResult("refused", "no node started by this pool is left to stop")
        node = change.node if change.node in mine else mine[-1]
        busy = change.instances.get(node, 0)
        if busy:
            return NodeChangeResult(
                "refused",
                f"node {node} still runs {busy} instance(s): placement empties it first",
                node,
            )
        self._cluster.stop_agent(node)
        self.started.remove(node)
        return NodeChangeResult("done", f"stopped agent {node}", node)

    def close(self) -> None:
        for node in list(self._cluster.agents):
            self._cluster.stop_agent(node)
        self.started.clear()


#: Node pools by name (config key ``node_pool.strategy``); each factory takes the
#: ControllerConfig. The simulator's pool is not here: it needs the simulation.
NODE_POOLS: Registry[NodePool] = Registry("node pool", "node_pool.strategy")
NODE_POOLS.add("log", lambda cfg=None: LogNodePool())
NODE_POOLS.add("command", lambda cfg: CommandNodePool(cfg.node_pool.command))
NODE_POOLS.add(
    "testbed",
    lambda cfg: TestbedNodePool(
        cfg.node_pool.testbed,
        listen=cfg.listen,
        workdir=Path(cfg.state_dir) / "node-pool",
        slot_seconds=cfg.slot_seconds,
    ),
)


def node_loads(result: EpochResult) -> tuple[dict[str, float], dict[str, int]]:
    """Per node: demanded cores and instances (held ones too: they occupy their node)."""
    cores: dict[str, float] = {}
    count: dict[str, int] = {}
    for d in result.demands.values():
        cores[d.node] = cores.get(d.node, 0.0) + d.cores
        count[d.node] = count.get(d.node, 0) + 1
    for u in result.held.values():
        count[u.node] = count.get(u.node, 0) + 1
    return cores, count


class NodePoolEdge:
    """Decides whether the recommendation may act now, acts through the pool, and
    says what happened (the record's ``node_pool_action``).

    Gates, in order: one change at a time; ``min_nodes`` / ``max_nodes``; the
    back-off after failures (doubling, bounded), so a broken command runs once
    per back-off, not once per epoch; the cool-down after a change. Dry-run
    only records. The cool-down and back-off survive a restart (the store).
    """

    def __init__(
        self,
        pool: NodePool,
        config: NodePoolConfig,
        *,
        node_cost: float,
        clock: Callable[[], float],
        store: Any = None,
    ):
        self.pool = pool
        self.config = config
        self.node_cost = node_cost
        self.clock = clock
        self.store = store
        self.node_epochs = 0
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._running: tuple[int, str] | None = None  # (epoch, action) in flight
        self._completed: dict[str, Any] | None = None  # finished, not yet reported
        self.cooldown_until = 0.0
        self.retry_at = 0.0
        self.failures = 0
        self.last: dict[str, Any] | None = None  # the last change issued
        # Epochs in a row that recommended one node fewer (a removal waits for
        # ``remove_patience_epochs`` of them; an add goes at once).
        self.remove_streak = 0
        self._load()

    @classmethod
    def from_config(
        cls, config: ControllerConfig, *, clock: Callable[[], float], store: Any = None
    ) -> NodePoolEdge:
        pool = NODE_POOLS.create(config.node_pool.strategy, config)
        return cls(pool, config.node_pool, node_cost=config.node_cost, clock=clock, store=store)

    def use(self, pool: NodePool) -> None:
        """Carry out changes through ``pool`` from now on (the simulator's own)."""
        self.pool.close()
        self.pool = pool

    # ------------------------------------------------------------ state
    def _load(self) -> None:
        raw = self.store.get(STATE_KEY) if self.store is not None else None
        if not raw:
            return
        try:
            state = json.loads(raw)
            self.cooldown_until = float(state.get("cooldown_until", 0.0))
            self.retry_at = float(state.get("retry_at", 0.0))
            self.failures = int(state.get("failures", 0))
            self.last = state.get("last")
        except (ValueError, TypeError, AttributeError):
            log.warning("node pool: unreadable saved state, starting afresh")

    def _save(self) -> None:
        if self.store is None:
            return
        state = {
            "cooldown_until": self.cooldown_until,
            "retry_at": self.retry_at,
            "failures": self.failures,
            "last": self.last,
        }
        try:
            self.store.put(STATE_KEY, json.dumps(state))
        except Exception:  # noqa: BLE001 - a change finishing after the store closed
            log.warning("node pool: state not saved", exc_info=True)

    # ------------------------------------------------------------ the epoch
    def offer(self, result: EpochResult, *, enforce: bool) -> dict[str, Any]:
        """Called once per epoch with its result; the record's ``node_pool_action``."""
        now = result.now
        nodes = tuple(sorted(result.capacity))
        self.node_epochs += len(nodes)
        rec = result.alloc.recommendation
        recommended = ACTIONS.get(rec.nodes_delta, "none") if rec is not None else "none"
        row: dict[str, Any] = {
            "strategy": self.pool.name,
            "recommended": recommended,
            "action": "none",
            "outcome": "none",
            "reason": rec.reason if rec is not None else "no recommendation this epoch",
            "node": None,
            "nodes": len(nodes),
            "node_epochs": self.node_epochs,
            "cost_per_node_epoch": self.node_cost,
        }
        with self._lock:
            completed, self._completed = self._completed, None
            running = self._running
        if completed is not None:
            row["completed"] = completed
        self.remove_streak = self.remove_streak + 1 if recommended == "remove" else 0
        if recommended == "none":
            return row
        held = self._held(recommended, len(nodes), now, running)
        if held is not None:
            row.update(outcome="held", reason=held)
            return row
        cores, count = node_loads(result)
        node = None
        if recommended == "remove":
            # The least loaded node; among equals the last by name (usually the newest).
            node = min(
                sorted(nodes, reverse=True), key=lambda n: (cores.get(n, 0.0), count.get(n, 0))
            )
        weights = {app: c.weight for app, c in result.classes.items()}
        change = NodeChange(recommended, result.epoch, nodes, node, rec.reason, count, weights)
        row.update(action=recommended, node=node)
        self.last = {"epoch": result.epoch, "action": recommended, "at": now}
        self.cooldown_until = now + self.config.cooldown_seconds
        if not enforce:
            row.update(
                outcome="dry-run", reason=f"dry-run: would {recommended} a node ({rec.reason})"
            )
            self._save()
            return row
        if self.pool.blocking:
            with self._lock:
                self._running = (result.epoch, recommended)
            self._thread = threading.Thread(
                target=self._run_async, args=(change,), name="dsched-node-pool", daemon=True
            )
            self._thread.start()
            row.update(
                outcome="started", reason=f"{self.pool.name} {recommended} started ({rec.reason})"
            )
            self._save()
            return row
        res = self._run(change)
        self._settle(change, res, now)
        row.update(outcome=res.outcome, reason=res.reason, node=res.node or node)
        return row

    def _held(self, action: str, n: int, now: float, running) -> str | None:
        """Why ``action`` may not run now (None: it may)."""
        cfg = self.config
        if running is not None:
            return f"the {running[1]} started in epoch {running[0]} is still running"
        if action == "add" and cfg.max_nodes and n >= cfg.max_nodes:
            return f"at node_pool.max_nodes ({cfg.max_nodes} nodes)"
        if action == "remove" and n <= cfg.min_nodes:
            return f"at node_pool.min_nodes ({cfg.min_nodes} nodes)"
        if now < self.retry_at:
            why = (self.last or {}).get("reason", "")
            return (
                f"back-off after {self.failures} failure(s) in a row: next try in "
                f"{self.retry_at - now:.0f} s" + (f" (last: {why})" if why else "")
            )
        if now < self.cooldown_until:
            last = self.last or {}
            return (
                f"cool-down: {self.cooldown_until - now:.0f} s left after the "
                f"{last.get('action', 'change')} of epoch {last.get('epoch', '?')}"
            )
        if action == "remove" and self.remove_streak < cfg.remove_patience_epochs:
            # Load that dips for an epoch or two comes back: a node removed then
            # re-added costs two rounds of moves and the node-epochs in between.
            return (
                f"removal held: {self.remove_streak} of {cfg.remove_patience_epochs} "
                "epochs in a row recommended one node fewer"
            )
        return None

    def _run(self, change: NodeChange) -> NodeChangeResult:
        try:
            act = self.pool.add if change.action == "add" else self.pool.remove
            return act(change)
        except Exception as exc:  # noqa: BLE001 - a broken pool must not stop the epochs
            log.exception("node pool %s: %s failed", self.pool.name, change.action)
            return NodeChangeResult("failed", f"{type(exc).__name__}: {exc}")

    def _run_async(self, change: NodeChange) -> None:
        res = self._run(change)
        finished = self.clock()
        with self._lock:
            self._settle(change, res, finished)
            self._completed = {"epoch": change.epoch, "action": change.action, **asdict(res)}
            self._running = None

    def _settle(self, change: NodeChange, res: NodeChangeResult, at: float) -> None:
        """Cool-down after a change; back-off (and no cool-down) after a failure."""
        level = logging.INFO if res.outcome in SETTLED else logging.WARNING
        log.log(
            level, "node pool %s: %s %s: %s", self.pool.name, change.action, res.outcome, res.reason
        )
        if self.last is not None:
            self.last.update(outcome=res.outcome, reason=res.reason)
        if res.outcome in SETTLED:
            self.failures = 0
            self.retry_at = 0.0
        else:
            self.failures += 1
            wait = min(
                self.config.retry_backoff_seconds * 2 ** (self.failures - 1),
                self.config.max_retry_backoff_seconds,
            )
            self.retry_at = at + wait
            self.cooldown_until = 0.0
        self._save()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until no change is in flight (True) or ``timeout`` seconds passed."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
            return not thread.is_alive()
        return True

    def close(self) -> None:
        # A stopping controller does not wait out a slow command: the command runs
        # in a session of its own and finishes (or times out) without us.
        self.wait(CLOSE_WAIT_SECONDS)
        self.pool.close()
