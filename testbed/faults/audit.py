"""What the agents actually wrote, read back from the kernel.

:class:`CapAudit` walks each agent's root below the pod a few times a second
and keeps, per instance cgroup, the cap in force (``cpu.cfs_quota_us`` /
``cpu.cfs_period_us``; quota -1 is "no cap") and every change of it. A cap
outside (0, node cores] is counted the moment it is seen. Recovery ("steady
caps") is read from the same change log.

:func:`snapshot_outside` / :func:`changed_outside` compare everything an agent
must not touch: the pod's own settings and every cgroup below it that is not
an agent's root, the writable settings at the top of every cgroup mount, and
any directory anywhere in the hierarchy named like something the harness fed
to an agent (a path that escaped a root would be named so).
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

CGROUPS = Path("/sys/fs/cgroup")
# Levels below an agent's root: <app>/<worker>/<operator>-<instance>.
INSTANCE_DEPTH = 3


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


@dataclass
class Change:
    at: float  # time.monotonic()
    node: str
    cgroup: str  # relative to the node's root
    before: float | None  # cores; None: no cap or no cgroup
    after: float | None


@dataclass
class OutOfBounds:
    at: float
    node: str
    cgroup: str
    cap: float


@dataclass
class CapAudit:
    roots: dict[str, Path]  # node -> the agent's root below the pod
    capacity_cores: float
    interval: float = 0.1
    caps: dict[str, dict[str, float | None]] = field(default_factory=dict)
    changes: list[Change] = field(default_factory=list)
    out_of_bounds: list[OutOfBounds] = field(default_factory=list)
    looks: int = 0

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.caps = {node: {} for node in self.roots}

    def read(self, node: str) -> dict[str, float | None]:
        """Instance cgroup (relative path) -> cap in cores (None: quota -1)."""
        root = self.roots[node]
        found: dict[str, float | None] = {}
        for dirpath, dirnames, _files in os.walk(root):
            here = Path(dirpath)
            depth = len(here.relative_to(root).parts)
            if depth < INSTANCE_DEPTH:
                continue
            dirnames.clear()
            quota, period = _read(here / "cpu.cfs_quota_us"), _read(here / "cpu.cfs_period_us")
            if quota is None or period is None:
                continue  # removed while walked
            q, p = int(quota), int(period)
            found[str(here.relative_to(root))] = None if q < 0 else q / p
        return found

    def look(self) -> None:
        now = time.monotonic()
        for node in self.roots:
            seen = self.read(node)
            with self._lock:
                old = self.caps[node]
                for cg in old.keys() | seen.keys():
                    before, after = old.get(cg), seen.get(cg)
                    if before != after:
                        self.changes.append(Change(now, node, cg, before, after))
                        if after is not None and not 0 < after <= self.capacity_cores + 1e-9:
                            self.out_of_bounds.append(OutOfBounds(now, node, cg, after))
                self.caps[node] = seen
            self.looks += 1

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.look()
            except OSError:
                continue  # a cgroup went away mid-read: the next look sees the rest

    def start(self) -> CapAudit:
        self.look()
        self._thread = threading.Thread(target=self._run, name="cap-audit", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

    def current(self, node: str) -> dict[str, float | None]:
        with self._lock:
            return dict(self.caps[node])

    def changes_between(
        self, t0: float, t1: float, node: str | None = None, min_step: float = 0.0
    ) -> list[Change]:
        with self._lock:
            return [
                c
                for c in self.changes
                if t0 <= c.at < t1 and (node is None or c.node == node) and _step(c) > min_step
            ]

    def last_change_since(self, t0: float, min_step: float) -> float | None:
        with self._lock:
            times = [c.at for c in self.changes if c.at >= t0 and _step(c) > min_step]
        return max(times) if times else None

    def wait_steady(
        self,
        t0: float,
        quiet_seconds: float,
        max_seconds: float,
        min_step: float,
        ready: callable = lambda: True,
    ) -> tuple[float | None, int]:
        """Seconds from ``t0`` to steady caps, and the cap changes in between.

        Steady: ``ready()`` holds (e.g. every agent connected) and no instance's
        cap changed by more than ``min_step`` cores (a cgroup made or removed
        counts as a change) for ``quiet_seconds``. The time reported is that of
        the last change before the quiet stretch, or of ``ready()`` first
        holding if later; None when not steady within ``max_seconds``."""
        ready_at: float | None = None
        while True:
            now = time.monotonic()
            if ready_at is None and ready():
                ready_at = now
            last = self.last_change_since(t0, min_step)
            if ready_at is not None:
                settled = max(ready_at, last if last is not None else t0)
                if now - settled >= quiet_seconds:
                    return settled - t0, len(
                        self.changes_between(t0, settled + 1e-6, None, min_step)
                    )
            if now - t0 > max_seconds:
                return None, len(self.changes_between(t0, now, None, min_step))
            time.sleep(0.05)


def _step(c: Change) -> float:
    """How far a change moved a cap; a cap appearing or going counts as infinite."""
    if c.before is None or c.after is None:
        return float("inf")
    return abs(c.after - c.before)


# ------------------------------------------------------------ outside the roots
def _moves_by_itself(name: str) -> bool:
    """Files that every process on the machine changes: thread lists, usage and
    pressure figures (writable only to reset them or to set triggers)."""
    return name in ("tasks", "cgroup.procs", "cgroup.threads") or any(
        part in name for part in ("usage", "pressure", "stat")
    )


def _settings(directory: Path, skip_moving: bool) -> dict[str, str]:
    out = {}
    try:
        names = os.listdir(directory)
    except OSError:
        return out
    for f in names:
        path = directory / f
        if skip_moving and _moves_by_itself(f):
            continue
        try:
            st = path.stat()
        except OSError:
            continue
        if path.is_dir() or not st.st_mode & 0o200:
            continue
        try:
            out[str(path)] = path.read_text()
        except OSError as exc:  # some control files refuse reads
            out[str(path)] = f"<{exc.strerror}>"
    return out


def snapshot_outside(pod: Path, roots: list[Path], names: set[str]) -> dict[str, str]:
    """Everything an agent rooted at ``roots`` (below ``pod``) must leave alone."""
    out: dict[str, str] = {}
    for mount in sorted(p for p in CGROUPS.iterdir() if p.is_dir()):
        out.update(_settings(mount, skip_moving=True))
        for dirpath, dirnames, _files in os.walk(mount):
            here = Path(dirpath)
            keep = []
            for d in dirnames:
                path = here / d
                if path in roots:
                    continue  # the agents' own trees
                if d in names:
                    out[str(path)] = "dir"
                keep.append(d)
            # Descend everywhere (a name fed to an agent may turn up at any depth)
            # but read settings only in the pod.
            dirnames[:] = keep
            if pod in here.parents or here == pod:
                # The pod's thread lists change as the harness's threads come and
                # go and as agents move threads back into their anchor: their
                # contents are not compared, only the pod's settings.
                out.update(_settings(here, skip_moving=here == pod))
                if here != pod:
                    out[str(here)] = "dir"
    return out


def changed_outside(before: dict[str, str], after: dict[str, str]) -> list[str]:
    return sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
