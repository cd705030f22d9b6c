"""Static contenders for the live benchmark.

**Static caps.** R-Storm gives every executor a fixed CPU share chosen before
the topology starts. :class:`StaticCaps` does the same on this machine: it
writes one cap per instance, once, through the same cgroup backend the agent
uses (:class:`agent.cgroups.CgroupV1`, same layout
``<mount>/<root>/<app>/<worker>/<operator>-<instance>``), directly and not
through an agent, so no controller or agent process runs for a static
contender. The tree's root gets the testbed's capacity as its quota, exactly as
the agent does with ``capacity_cores``, so every contender runs on the same
amount of CPU. Uncapped instances are still placed in the tree (quota ``-1``)
so that only the per-instance cap differs between contenders.

Cap strategies are chosen by name (:func:`static_caps`): ``static-0.7`` (the
testbed's capacity spread evenly over all executors, the paper's 0.7 core
scaled), ``static-0.3`` (3/7 of it), ``uncapped`` and ``equal`` (per-operator
caps whose total matches a measured allocation).

**CPU work outside the engine's threads.** The engine
(:class:`testbed.live.engine.LiveTopology`, ``cpu="process"``) burns each
instance's CPU in a single-threaded process whose thread is the one capped, so
a throttled instance never stalls the others through the GIL.

**The run's own CPU.** :class:`Reservation` gives a benchmark run a cgroup of
its own with a high ``cpu.shares`` (``testbed/`` for the instance tree,
``harness/`` for everything else the run starts), so that it gets its promised
capacity on a shared machine, and removes it all at the end.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from agent.cgroups import CgroupV1, ThreadGone
from agent.registry import InstanceKey
from testbed.live.engine import LiveTopology
from testbed.live.topology import OperatorSpec

# ---------------------------------------------------------------- cap strategies

STATIC_STRATEGIES = ("static-0.7", "static-0.3", "uncapped", "equal")


@dataclass(frozen=True)
class Scale:
    """The paper's proportions on this machine.

    The paper's cluster had room for ``executors`` executors at 0.7 core each;
    here 0.7 core becomes ``capacity_cores / executors``.
    """

    capacity_cores: float
    executors: int
    # The share of the capacity that ``executors`` x 0.7 core fills: 1 by default;
    # on the paper's two 6-core nodes, R-Storm(70)'s 8.4 cores fill 0.7 of them.
    share_07: float = 1.0

    def __post_init__(self) -> None:
        if not self.capacity_cores > 0:
            raise ValueError(f"capacity_cores must be > 0, got {self.capacity_cores!r}")
        if self.executors < 1:
            raise ValueError(f"executors must be >= 1, got {self.executors!r}")
        if not 0 < self.share_07 <= 1:
            raise ValueError(f"share_07 must be in (0, 1], got {self.share_07!r}")

    @property
    def core_07(self) -> float:
        return self.capacity_cores * self.share_07 / self.executors

    @property
    def factor(self) -> float:
        """Cores here per core of the paper's executors."""
        return self.core_07 / 0.7


def static_caps(
    name: str,
    operators: Iterable[OperatorSpec],
    scale: Scale,
    equal_total_by_operator: Mapping[str, float] | None = None,
) -> dict[str, float | None]:
    """Per-instance cap (cores, None = uncapped) for each operator under strategy ``name``.

    ``equal`` needs ``equal_total_by_operator``: the mean total cores a measured
    run allocated to each operator; each instance gets its operator's share.
    """
    ops = list(operators)
    if name == "static-0.7":
        return {o.name: scale.core_07 for o in ops}
    if name == "static-0.3":
        return {o.name: scale.core_07 * 3 / 7 for o in ops}
    if name == "uncapped":
        return {o.name: None for o in ops}
    if name == "equal":
        if equal_total_by_operator is None:
            raise ValueError("strategy 'equal' needs equal_total_by_operator (a measured run)")
        missing = [o.name for o in ops if o.name not in equal_total_by_operator]
        if missing:
            raise ValueError(f"equal_total_by_operator lacks operators {missing}")
        return {o.name: max(0.01, equal_total_by_operator[o.name] / o.parallelism) for o in ops}
    raise ValueError(f"unknown static strategy {name!r} (known: {', '.join(STATIC_STRATEGIES)})")


def first_fit_placement(
    operators: Iterable[OperatorSpec],
    caps: Mapping[str, float | None],
    nodes: Iterable[str],
    node_cores: float,
    uncapped_cores: float,
) -> dict[tuple[str, int], str]:
    """(operator, index) -> node for fixed caps: each instance, in topology order, on
    the first node its cap still fits in, else on the least filled node.

    R-Storm's resource-aware placement reduced to the one resource the testbed
    caps: a static contender uses as few nodes as its caps allow, as R-Storm
    would. An uncapped instance counts as ``uncapped_cores``.
    """
    load = dict.fromkeys(nodes, 0.0)
    if not load:
        raise ValueError("nodes must name at least one node")
    out: dict[tuple[str, int], str] = {}
    for o in operators:
        need = caps[o.name] if caps[o.name] is not None else uncapped_cores
        for i in range(o.parallelism):
            node = next(
                (n for n, used in load.items() if used + need <= node_cores + 1e-9),
                min(load, key=load.__getitem__),
            )
            load[node] += need
            out[(o.name, i)] = node
    return out


def _limit_root(backend: CgroupV1, capacity_cores: float) -> None:
    """Make the backend's top-level root and cap it at ``capacity_cores``."""
    backend.root_limit_cores = capacity_cores
    backend.root.mkdir(exist_ok=True)
    backend.limit_root(backend.root)


class StaticCaps:
    """Fixed per-instance caps written once with :class:`agent.cgroups.CgroupV1`."""

    def __init__(self, mount: str | Path, root_name: str, period_us: int = 100_000):
        self.backend = CgroupV1(mount, root_name, period_us)
        self.paths: dict[tuple[str, int], Path] = {}

    @property
    def root(self) -> Path:
        return self.backend.root

    def apply(
        self, topology: LiveTopology, caps: Mapping[str, float | None], capacity_cores: float
    ) -> None:
        """Limit the root to the testbed's capacity, then cap every instance thread."""
        self.apply_threads(
            (
                (InstanceKey(topology.spec.app, i.spec.name, i.index), i.worker, *i.cpu_pid_tid)
                for i in topology.all_instances()
            ),
            caps,
            capacity_cores,
        )

    def apply_threads(
        self,
        threads: Iterable[tuple[InstanceKey, str, int, int]],
        caps: Mapping[str, float | None],
        capacity_cores: float,
    ) -> None:
        """Like :meth:`apply`, for (key, worker, pid, tid) of threads in any process
        (the distributed testbed's workers, one tree per node)."""
        _limit_root(self.backend, capacity_cores)
        for key, worker, pid, tid in threads:
            path = self.backend.create(key, worker, pid)
            try:
                self.backend.attach(path, pid, tid)
            except ThreadGone:
                self.backend.remove(path)
                continue
            self.backend.set_cap(path, caps[key.operator])
            self.paths[(key.operator, key.instance)] = path

    def cap_of(self, operator: str, index: int) -> float | None:
        path = self.paths.get((operator, index))
        return None if path is None else self.backend.read_cap(path)

    def remove(self) -> None:
        """Move any thread still inside back to the mount's root cgroup, remove the tree."""
        release_and_remove(self.backend)


def hierarchy_root(path: Path) -> Path:
    """The top cgroup of the v1 hierarchy that ``path`` lies in."""
    path = path.resolve()
    while (path.parent / "cgroup.procs").exists() and path.parent != path:
        path = path.parent
    return path


def release_and_remove(backend: CgroupV1) -> None:
    """Empty ``backend``'s tree (threads back to the hierarchy's top) and remove it."""
    if not backend.root.is_dir():
        return
    top_tasks = hierarchy_root(backend.mount) / "tasks"
    for dirpath, _dirs, _files in os.walk(backend.root):
        for tid in backend.tids(Path(dirpath)):
            try:
                fd = os.open(top_tasks, os.O_WRONLY)
                try:
                    os.write(fd, f"{tid}\n".encode())
                finally:
                    os.close(fd)
            except OSError:
                pass  # the thread exited meanwhile
    backend.remove_root()


# ---------------------------------------------------------------- the run's own CPU


def _write_file(path: Path, value: str) -> None:
    # Unbuffered, so the kernel's answer to each write is seen.
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


#: How long :meth:`Reservation.leave` keeps trying, and how often.
LEAVE_SECONDS = 3.0
LEAVE_RETRY_SECONDS = 0.02


class Reservation:
    """The CPU a benchmark run is given on a shared machine, as one cgroup of its own.

    ``<mount>/<name>`` gets a high ``cpu.shares`` so that the run receives the
    CPU it is promised even while other work runs on the machine; inside it,
    ``testbed/`` is the instance tree (the agent's or :class:`StaticCaps`'
    root, whose quota is the testbed's capacity) and ``harness/`` holds this
    process's other threads and the processes it starts (controller, agent),
    which must not be starved either. Nothing is capped outside ``testbed/``.
    """

    TESTBED = "testbed"
    HARNESS = "harness"

    def __init__(self, mount: str | Path, name: str, shares: int = 65536):
        if not 2 <= shares <= 262144:
            raise ValueError(f"shares must be in [2, 262144], got {shares!r}")
        self.mount = Path(mount)
        self.top = self.mount / name
        self.shares = shares

    @property
    def harness(self) -> Path:
        return self.top / self.HARNESS

    def backend(self, period_us: int, root: str | None = None) -> CgroupV1:
        """The cgroup backend of the instance tree (same as the agent's with this mount);
        ``root``: another tree beside ``testbed/`` (one per node of a multi-node run)."""
        return CgroupV1(self.top, root or self.TESTBED, period_us)

    def enter(self) -> None:
        """Create the cgroups and move this whole process into ``harness/``."""
        self.top.mkdir(exist_ok=True)
        _write_file(self.top / "cpu.shares", f"{self.shares}\n")
        self.harness.mkdir(exist_ok=True)
        _write_file(self.harness / "cgroup.procs", f"{os.getpid()}\n")

    def place(
        self, tids: Iterable[int], period_us: int, capacity_cores: float, root: str | None = None
    ) -> None:
        """Limit ``testbed/`` (or ``root``) to the capacity and put ``tids`` in it (not
        in an instance cgroup)."""
        backend = self.backend(period_us, root)
        _limit_root(backend, capacity_cores)
        for tid in tids:
            try:
                _write_file(backend.root / "tasks", f"{tid}\n")
            except ProcessLookupError:
                pass  # the thread exited meanwhile

    def place_process(self, pid: int, root: str) -> None:
        """Move every thread of process ``pid`` into tree ``root`` (made and limited by
        :meth:`place`); its later threads start there too."""
        try:
            _write_file(self.top / root / "cgroup.procs", f"{pid}\n")
        except ProcessLookupError:
            pass  # the process exited meanwhile

    def leave(self, seconds: float = LEAVE_SECONDS) -> None:
        """Move every thread back to the top cgroup and remove the whole reservation.

        A process of the run that is still stopping can start a thread between
        the listing of a cgroup's tasks and its rmdir; the new thread keeps the
        cgroup busy. So the whole pass repeats for up to ``seconds`` until the
        reservation is gone (what is left then, :meth:`leftover` lists)."""
        deadline = time.monotonic() + seconds
        while self.top.is_dir():
            # Every tree inside: ``testbed/``, ``harness/`` and any per-node root.
            for child in sorted(p.name for p in self.top.iterdir() if p.is_dir()):
                release_and_remove(CgroupV1(self.top, child))
            try:
                self.top.rmdir()
            except FileNotFoundError:
                return
            except OSError:
                if time.monotonic() >= deadline:
                    return
                time.sleep(LEAVE_RETRY_SECONDS)

    def leftover(self) -> list[str]:
        """Cgroup directories of this reservation still present (empty after ``leave``)."""
        if not self.top.exists():
            return []
        return sorted(str(p) for p in [self.top, *self.top.rglob("*")] if p.is_dir())
