"""CPU caps through cgroups: one cgroup per operator instance under the agent's root.

Layout (both versions)::

    <mount>/<cgroup_root>/<app>/<worker>/<operator>-<instance>

Backends are chosen by the ``cgroup_mode`` key through :data:`BACKENDS`, a
:class:`dsched.registry.Registry`: ``v1``, ``v2``, or ``auto`` (the default),
which detects one; dry-run and a node without a writable controller get ``none``:

- ``v1``: the ``cpu`` hierarchy through cgroupspy; TIDs go into ``tasks``, the
  cap into ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``.
- ``v2``: a threaded subtree. ``<app>/<worker>`` is the threaded domain (the
  worker process is moved into its ``cgroup.procs``, because the kernel keeps
  all threads of a process inside one domain); each instance cgroup has
  ``cgroup.type = threaded``, its TIDs in ``cgroup.threads`` and the cap in
  ``cpu.max``.
- ``none``: dry-run or no writable controller. Caps are remembered, never
  written, and no directory is created.

Every path is built from names checked by :func:`dsched.names.check_name`,
resolved, and refused unless it lies inside the root, so nothing is ever
written elsewhere. A thread that exits between discovery and the write makes
the kernel answer ESRCH: :class:`ThreadGone` lets the caller skip it quietly.
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cgroupspy.controllers import CpuController
from cgroupspy.nodes import Node

from dsched.ids import InstanceKey
from dsched.names import InvalidName, check_name
from dsched.registry import Registry

log = logging.getLogger(__name__)

# The kernel refuses CFS quotas below 1 ms.
MIN_QUOTA_US = 1000

# Moving threads into a cgroup makes the whole group one scheduling entity with
# the default weight of ONE thread: 12 threads in our tree would compete with
# a single thread outside it. Each directory therefore gets the weight of the
# threads below it (v1 cpu.shares: 1024 a thread; v2 cpu.weight: 100 a thread),
# so managing a thread never changes its fair share against the rest of the node.
V1_SHARES_PER_THREAD, V1_SHARES_MAX = 1024, 262144
V2_WEIGHT_PER_THREAD, V2_WEIGHT_MAX = 100, 10000


class CgroupError(RuntimeError):
    """A cgroup operation that failed for a reason other than a vanished thread."""


class ThreadGone(CgroupError):
    """The thread exited before it could be moved (ESRCH)."""


@dataclass(frozen=True)
class Throttling:
    periods_total: int
    throttled_periods_total: int
    throttled_seconds_total: float


@dataclass(frozen=True)
class AdoptedCgroup:
    key: InstanceKey
    worker: str
    path: Path
    cap_cores: float | None
    tids: tuple[int, ...]


def quota_for(cap_cores: float, period_us: int) -> int:
    return max(MIN_QUOTA_US, round(cap_cores * period_us))


def _write(path: Path, value: str) -> None:
    """Write one value; raise ThreadGone on ESRCH, CgroupError on anything else.

    A buffered ``open().write()`` reports cgroup errors only at close, so the
    write goes through ``os.write`` on an unbuffered descriptor.
    """
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    except OSError as exc:
        raise CgroupError(f"cannot open {path}: {exc.strerror}") from exc
    try:
        os.write(fd, value.encode())
    except OSError as exc:
        if exc.errno == errno.ESRCH:
            raise ThreadGone(f"{path}: thread {value.strip()} exited") from exc
        raise CgroupError(f"writing {value!r} to {path}: {exc.strerror}") from exc
    finally:
        os.close(fd)


def _read_ints(path: Path) -> list[int]:
    try:
        return [int(x) for x in path.read_text().split()]
    except (OSError, ValueError):
        return []


class CgroupTree:
    """Path rules shared by every backend: build, check, walk, remove."""

    mode = "none"

    def __init__(self, mount: str | Path, root_name: str, period_us: int = 100_000, why: str = ""):
        check_name("cgroup_root", root_name)
        self.mount = Path(mount)
        self.root = self.mount / root_name
        self.period_us = period_us
        # One line for the log: why enforcement works the way it does on this node.
        self.why = why or f"cgroup {self.mode} at {self.mount}"

    def instance_path(self, key: InstanceKey, worker: str) -> Path:
        for kind, value in (("app", key.app), ("worker", worker), ("operator", key.operator)):
            check_name(kind, value)
        return self._inside(self.root / key.app / worker / f"{key.operator}-{key.instance}")

    def _inside_or_root(self, path: Path) -> Path:
        resolved = path.resolve()
        return resolved if resolved == self.root.resolve() else self._inside(path)

    def _inside(self, path: Path) -> Path:
        resolved = path.resolve()
        root = self.root.resolve()
        if resolved == root or not resolved.is_relative_to(root):
            raise InvalidName(f"{path} is outside the agent's cgroup root {root}")
        return resolved

    def walk(self) -> list[tuple[InstanceKey, str, Path]]:
        """Instance cgroups present under the root (for re-adoption)."""
        found = []
        if not self.root.is_dir():
            return found
        for app_dir in sorted(p for p in self.root.iterdir() if p.is_dir()):
            for worker_dir in sorted(p for p in app_dir.iterdir() if p.is_dir()):
                for inst_dir in sorted(p for p in worker_dir.iterdir() if p.is_dir()):
                    operator, sep, number = inst_dir.name.rpartition("-")
                    if not sep or not number.isdigit():
                        continue
                    try:
                        key = InstanceKey(app_dir.name, operator, int(number))
                        path = self.instance_path(key, worker_dir.name)
                    except InvalidName:
                        continue
                    found.append((key, worker_dir.name, path))
        return found

    def remove(self, path: Path) -> bool:
        """Remove an (empty) instance cgroup and its empty parents below the root."""
        path = self._inside(path)
        root = self.root.resolve()
        try:
            path.rmdir()
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.debug("cannot remove %s: %s", path, exc.strerror)
            return False
        for parent in path.parents:
            if parent == root:
                break
            try:
                parent.rmdir()
            except OSError:
                break
        return True

    def remove_root(self) -> None:
        """Remove the whole tree if every cgroup in it is empty (tests, uninstall)."""
        if not self.root.is_dir():
            return
        for dirpath, _dirs, _files in sorted(os.walk(self.root), key=lambda t: -len(t[0])):
            try:
                os.rmdir(dirpath)
            except OSError as exc:
                log.debug("cannot remove %s: %s", dirpath, exc.strerror)

    # Backends override these.
    def create(self, key: InstanceKey, worker: str, pid: int) -> Path:
        raise NotImplementedError

    def attach(self, path: Path, pid: int, tid: int) -> None:
        raise NotImplementedError

    def set_cap(self, path: Path, cap_cores: float | None) -> None:
        raise NotImplementedError

    def read_cap(self, path: Path) -> float | None:
        raise NotImplementedError

    def tids(self, path: Path) -> list[int]:
        raise NotImplementedError

    def throttling(self, path: Path) -> Throttling | None:
        raise NotImplementedError

    def adopt(self) -> list[AdoptedCgroup]:
        return [
            AdoptedCgroup(key, worker, path, self.read_cap(path), tuple(self.tids(path)))
            for key, worker, path in self.walk()
        ]

    def weights(self, threads: dict[Path, int]) -> dict[Path, int]:
        """Thread counts per instance cgroup → thread counts per directory up to the root."""
        root = self.root.resolve()
        out: dict[Path, int] = {}
        for path, n in threads.items():
            for d in (path, *path.parents):
                out[d] = out.get(d, 0) + n
                if d == root:
                    break
        return out

    def set_weight(self, path: Path, threads: int) -> None:
        """Give ``path`` the scheduling weight of ``threads`` threads."""

    def limit_root(self, cap_cores: float) -> None:
        """Cap the whole tree at ``cap_cores`` (the node's configured capacity)."""


class CgroupV1(CgroupTree):
    """cgroup v1 ``cpu`` hierarchy, through cgroupspy's CpuController."""

    mode = "v1"

    def _controller(self, path: Path) -> CpuController:
        return CpuController(Node(os.fsencode(path)))

    def create(self, key: InstanceKey, worker: str, pid: int) -> Path:
        path = self.instance_path(key, worker)
        node = Node(os.fsencode(self.mount))
        for part in path.relative_to(self.mount.resolve()).parts:
            child = Node(os.fsencode(part), parent=node)
            try:
                os.mkdir(child.full_path)
            except FileExistsError:
                pass
            except OSError as exc:
                raise CgroupError(f"cannot create {path}: {exc.strerror}") from exc
            node = child
        return path

    def attach(self, path: Path, pid: int, tid: int) -> None:
        _write(self._inside(path) / "tasks", f"{tid}\n")

    def set_cap(self, path: Path, cap_cores: float | None) -> None:
        path = self._inside(path)
        ctl = self._controller(path)
        try:
            if cap_cores is None:
                ctl.cfs_quota_us = None
                return
            # Keep the quota valid for the period in force at every step.
            if ctl.cfs_period_us != self.period_us:
                ctl.cfs_quota_us = None
                ctl.cfs_period_us = self.period_us
            ctl.cfs_quota_us = quota_for(cap_cores, self.period_us)
        except OSError as exc:
            raise CgroupError(f"setting cap {cap_cores} on {path}: {exc.strerror}") from exc

    def read_cap(self, path: Path) -> float | None:
        ctl = self._controller(self._inside(path))
        try:
            quota = ctl.cfs_quota_us
            period = ctl.cfs_period_us
        except (OSError, ValueError):
            return None
        return None if quota is None else quota / period

    def tids(self, path: Path) -> list[int]:
        return _read_ints(path / "tasks")

    def set_weight(self, path: Path, threads: int) -> None:
        shares = min(V1_SHARES_MAX, max(2, threads * V1_SHARES_PER_THREAD))
        _write(self._inside_or_root(path) / "cpu.shares", f"{shares}\n")

    def limit_root(self, cap_cores: float) -> None:
        self.root.mkdir(exist_ok=True)
        _write(self.root / "cpu.cfs_period_us", f"{self.period_us}\n")
        _write(self.root / "cpu.cfs_quota_us", f"{quota_for(cap_cores, self.period_us)}\n")

    def throttling(self, path: Path) -> Throttling | None:
        try:
            stat = self._controller(path).stat
        except (OSError, ValueError):
            return None
        return Throttling(
            periods_total=stat.get("nr_periods", 0),
            throttled_periods_total=stat.get("nr_throttled", 0),
            throttled_seconds_total=stat.get("throttled_time", 0) / 1e9,
        )


class CgroupV2(CgroupTree):
    """cgroup v2 threaded subtree (``cgroup.threads``, ``cpu.max``)."""

    mode = "v2"

    def _enable_cpu(self, directory: Path) -> None:
        control = directory / "cgroup.subtree_control"
        try:
            current = control.read_text().split()
        except OSError:
            current = []
        if "cpu" not in current:
            _write(control, "+cpu\n")

    def create(self, key: InstanceKey, worker: str, pid: int) -> Path:
        path = self.instance_path(key, worker)
        domain = path.parent
        directory = self.mount.resolve()
        for part in path.relative_to(directory).parts:
            self._enable_cpu(directory)
            directory = directory / part
            try:
                directory.mkdir()
            except FileExistsError:
                pass
            except OSError as exc:
                raise CgroupError(f"cannot create {directory}: {exc.strerror}") from exc
        if pid not in _read_ints(domain / "cgroup.procs"):
            _write(domain / "cgroup.procs", f"{pid}\n")
        try:
            kind = (path / "cgroup.type").read_text().strip()
        except OSError:
            kind = ""
        if kind != "threaded":
            _write(path / "cgroup.type", "threaded\n")
        return path

    def attach(self, path: Path, pid: int, tid: int) -> None:
        _write(self._inside(path) / "cgroup.threads", f"{tid}\n")

    def set_cap(self, path: Path, cap_cores: float | None) -> None:
        path = self._inside(path)
        value = "max" if cap_cores is None else str(quota_for(cap_cores, self.period_us))
        _write(path / "cpu.max", f"{value} {self.period_us}\n")

    def read_cap(self, path: Path) -> float | None:
        try:
            quota, period = (path / "cpu.max").read_text().split()
            return None if quota == "max" else int(quota) / int(period)
        except (OSError, ValueError):
            return None

    def tids(self, path: Path) -> list[int]:
        return _read_ints(path / "cgroup.threads")

    def set_weight(self, path: Path, threads: int) -> None:
        weight = min(V2_WEIGHT_MAX, max(1, threads * V2_WEIGHT_PER_THREAD))
        _write(self._inside_or_root(path) / "cpu.weight", f"{weight}\n")

    def limit_root(self, cap_cores: float) -> None:
        self._enable_cpu(self.mount.resolve())
        self.root.mkdir(exist_ok=True)
        _write(self.root / "cpu.max", f"{quota_for(cap_cores, self.period_us)} {self.period_us}\n")

    def throttling(self, path: Path) -> Throttling | None:
        try:
            stat = dict(line.split() for line in (path / "cpu.stat").read_text().splitlines())
            return Throttling(
                periods_total=int(stat.get("nr_periods", 0)),
                throttled_periods_total=int(stat.get("nr_throttled", 0)),
                throttled_seconds_total=int(stat.get("throttled_usec", 0)) / 1e6,
            )
        except (OSError, ValueError):
            return None


class NoCgroups(CgroupTree):
    """Dry-run and nodes without a writable cpu controller: nothing touches the filesystem."""

    mode = "none"

    def __init__(
        self,
        mount: str | Path = "/nonexistent",
        root_name: str = "dsched",
        period_us: int = 100_000,
        why: str = "no enforcement",
    ):
        super().__init__(mount, root_name, period_us, why)
        self._caps: dict[Path, float | None] = {}

    def create(self, key: InstanceKey, worker: str, pid: int) -> Path:
        return self.root / key.app / worker / f"{key.operator}-{key.instance}"

    def attach(self, path: Path, pid: int, tid: int) -> None:
        return None

    def set_cap(self, path: Path, cap_cores: float | None) -> None:
        self._caps[path] = cap_cores

    def read_cap(self, path: Path) -> float | None:
        return self._caps.get(path)

    def tids(self, path: Path) -> list[int]:
        return []

    def throttling(self, path: Path) -> Throttling | None:
        return None

    def remove(self, path: Path) -> bool:
        self._caps.pop(path, None)
        return True

    def remove_root(self) -> None:
        return None

    def adopt(self) -> list[AdoptedCgroup]:
        return []


DEFAULT_MOUNTS = {"v1": "/sys/fs/cgroup/cpu", "v2": "/sys/fs/cgroup"}

# cgroup_mode -> factory(mount, root_name, period_us); an empty mount means the
# kernel's usual place for that mode.
BACKENDS: Registry[CgroupTree] = Registry("cgroup backend", "cgroup_mode")


def _configured(cls: type[CgroupTree]) -> Callable[[str, str, int], CgroupTree]:
    def make(mount: str, root_name: str, period_us: int) -> CgroupTree:
        mount = mount or DEFAULT_MOUNTS[cls.mode]
        return cls(mount, root_name, period_us, why=f"cgroup {cls.mode} configured at {mount}")

    return make


BACKENDS.add("v1", _configured(CgroupV1))
BACKENDS.add("v2", _configured(CgroupV2))


def _is_v1_cpu(mount: Path) -> bool:
    return (mount / "cpu.cfs_quota_us").exists()


def _is_v2_cpu(mount: Path) -> bool:
    try:
        return "cpu" in (mount / "cgroup.controllers").read_text().split()
    except OSError:
        return False


def detect_mode(mount: str = "") -> tuple[str, str, str]:
    """(mode, mount, why) for ``auto``: v1 cpu first (as on this fleet), then v2."""
    candidates = (
        [(m, Path(mount)) for m in ("v1", "v2")]
        if mount
        else [(m, Path(DEFAULT_MOUNTS[m])) for m in ("v1", "v2")]
    )
    for mode, path in candidates:
        ok = _is_v1_cpu(path) if mode == "v1" else _is_v2_cpu(path)
        if ok:
            if not os.access(path, os.W_OK):
                return "none", str(path), f"{path} is not writable"
            return mode, str(path), f"cgroup {mode} cpu controller at {path}"
    where = mount or " or ".join(DEFAULT_MOUNTS.values())
    return "none", "", f"no cgroup cpu controller found at {where}"


@BACKENDS.register("auto")
def detect_backend(mount: str, root_name: str, period_us: int) -> CgroupTree:
    """The backend of the controller found at ``mount`` (or the usual places), else none."""
    mode, found, why = detect_mode(mount)
    if mode == "none":
        return NoCgroups(found or "/nonexistent", root_name, period_us, why=why)
    backend = BACKENDS.create(mode, found, root_name, period_us)
    backend.why = why
    return backend


def make_backend(
    mode: str, mount: str, root_name: str, period_us: int, dry_run: bool
) -> tuple[CgroupTree, str]:
    """The backend for config values; returns (backend, one line saying why).

    An unknown ``mode`` is a :class:`dsched.registry.UnknownPlugin` naming ``cgroup_mode``.
    """
    if dry_run:
        backend: CgroupTree = NoCgroups(
            mount or "/nonexistent", root_name, period_us, why="dry-run: no cgroup is written"
        )
    else:
        backend = BACKENDS.create(mode, mount, root_name, period_us)
    return backend, backend.why
