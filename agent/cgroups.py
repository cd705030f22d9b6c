"""CPU caps through cgroups: one cgroup per operator instance, nested in the thread's own.

Layout (both versions)::

    <anchor>/<cgroup_root>/<app>/<worker>/<operator>-<instance>

The anchor is the cgroup the instance's threads are in when the instance is
first capped (``/proc/<pid>/task/<tid>/cgroup``): a container's, a pod's, a
systemd unit's, or the top of the hierarchy. Nesting keeps every limit above it
in force: a thread capped by dsched stays under its container's or unit's own
CPU limit and, on v2, its process never leaves its cgroup, so its memory and io
limits hold too. A thread already inside a dsched tree anchors where that
tree is anchored (an agent that restarted, a second instance of one thread).

Backends are chosen by the ``cgroup_mode`` key through :data:`BACKENDS`, a
:class:`dsched.registry.Registry`: ``v1``, ``v2``, or ``auto`` (the default),
which detects one; dry-run and a node without a writable controller get ``none``:

- ``v1``: the ``cpu`` hierarchy through cgroupspy; TIDs go into ``tasks``, the
  cap into ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``. The kernel refuses a
  quota above an ancestor's, so the quota written is the smaller of the cap and
  the tightest limit above it (v2 takes that minimum itself).
- ``v2``: a threaded subtree below the process's own cgroup, which becomes its
  threaded domain; the process stays where it is (nothing is written to any
  ``cgroup.procs``). Each dsched cgroup has ``cgroup.type = threaded``, each
  level ``+cpu`` in ``cgroup.subtree_control`` (the anchor's too: a threaded
  subtree needs it), TIDs in ``cgroup.threads`` and the cap in ``cpu.max``. An
  anchor whose ``cgroup.controllers`` lacks ``cpu`` is refused: dsched never
  enables a controller above the process's cgroup.
- ``none``: dry-run or no writable controller. Caps are remembered, never
  written, and no directory is created.

Every path is built from names checked by :func:`dsched.names.check_name`,
resolved, and refused unless it lies inside a dsched root (``<anchor>/<cgroup_root>``),
so nothing is written elsewhere, except a thread moved back into its anchor
(a released cap) and, on v2, the anchor's ``+cpu``. A thread that exits between
discovery and the write makes the kernel answer ESRCH: :class:`ThreadGone` lets
the caller skip it quietly.
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


def cgroup_mount_points(proc_root: str = "/proc") -> list[Path]:
    """Mount points of cgroup (v1) and cgroup2 file systems, from mountinfo."""
    try:
        text = (Path(proc_root) / "self" / "mountinfo").read_text()
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        # ID PARENT MAJ:MIN ROOT MOUNT_POINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER
        fields, sep, tail = line.partition(" - ")
        parts = fields.split()
        if sep and len(parts) >= 5 and tail.split(" ", 1)[0] in ("cgroup", "cgroup2"):
            # Octal escapes (\040 for a space) as the kernel writes them.
            out.append(Path(parts[4].encode().decode("unicode_escape")))
    return out


# Layout levels below a dsched root: <app>/<worker>/<operator>-<instance>.
LAYOUT_DEPTH = 3


class CgroupTree:
    """Path rules shared by every backend: anchor, build, check, walk, remove."""

    mode = "none"

    def __init__(
        self,
        mount: str | Path,
        root_name: str,
        period_us: int = 100_000,
        why: str = "",
        proc_root: str = "/proc",
    ):
        check_name("cgroup_root", root_name)
        self.mount = Path(mount)
        self.root_name = root_name
        # The dsched root of threads at the top of the hierarchy.
        self.root = self.mount / root_name
        self.period_us = period_us
        self.proc_root = proc_root
        # Quota of every dsched root (the node's configured capacity), None: unlimited.
        # Written when a root is made, and on the enforcer's start into those found.
        self.root_limit_cores: float | None = None
        self._top: Path | None = None  # where /proc's cgroup paths begin (_hierarchy_root)
        # One line for the log: why enforcement works the way it does on this node.
        self.why = why or f"cgroup {self.mode} at {self.mount}"

    # ---------------------------------------------------------------- paths

    def split(self, path: Path) -> tuple[Path, Path] | None:
        """(anchor, dsched root) of ``path`` when it lies in a dsched tree, else None.

        The first component named ``cgroup_root`` with at most the layout's
        depth below it is the root: an anchor may itself be named like the root.
        """
        resolved = path.resolve()
        mount = self.mount.resolve()
        if not resolved.is_relative_to(mount):
            return None
        parts = resolved.relative_to(mount).parts
        for i, part in enumerate(parts):
            if part == self.root_name and len(parts) - i - 1 <= LAYOUT_DEPTH:
                anchor = mount.joinpath(*parts[:i])
                return anchor, anchor / part
        return None

    def instance_path(self, key: InstanceKey, worker: str, anchor: Path | None = None) -> Path:
        for kind, value in (("app", key.app), ("worker", worker), ("operator", key.operator)):
            check_name(kind, value)
        base = self.mount if anchor is None else anchor
        return self._inside(
            base / self.root_name / key.app / worker / f"{key.operator}-{key.instance}"
        )

    def find_instance(
        self, key: InstanceKey, worker: str, roots: list[Path] | None = None
    ) -> Path | None:
        """The existing cgroup of an instance, whichever anchor it nests under
        (``roots``: :meth:`roots`, when the caller looks up many instances)."""
        for root in self.roots() if roots is None else roots:
            path = self.instance_path(key, worker, root.parent)
            if path.is_dir():
                return path
        return None

    def _inside_or_root(self, path: Path) -> Path:
        resolved = path.resolve()
        where = self.split(resolved)
        if where is not None and resolved == where[1]:
            return resolved
        return self._inside(path)

    def _inside(self, path: Path) -> Path:
        """``path`` resolved; InvalidName unless it lies strictly below a dsched root."""
        resolved = path.resolve()
        where = self.split(resolved)
        if where is None or resolved == where[1]:
            raise InvalidName(f"{path} is outside the agent's cgroups (no {self.root_name}/ above)")
        return resolved

    def anchor_of(self, pid: int, tid: int) -> Path:
        """The cgroup thread ``tid`` is in, outside dsched's trees (where its groups nest).

        ThreadGone when the thread exited; CgroupError when it is in no cgroup of
        this hierarchy under the mount.
        """
        where = Path(self.proc_root) / str(pid) / "task" / str(tid) / "cgroup"
        try:
            text = where.read_text()
        except (FileNotFoundError, ProcessLookupError) as exc:
            raise ThreadGone(f"thread {tid} of process {pid} exited") from exc
        except OSError as exc:
            raise CgroupError(f"cannot read {where}: {exc.strerror}") from exc
        relative = self._own_line(text)
        if relative is None:
            raise CgroupError(f"thread {tid} is in no {self.mode} cpu cgroup ({where})")
        path = (self._hierarchy_root() / relative.lstrip("/")).resolve()
        if not path.is_relative_to(self.mount.resolve()) or not path.is_dir():
            raise CgroupError(f"thread {tid}'s cgroup {relative} is not under {self.mount}")
        found = self.split(path)
        return path if found is None else found[0]

    def _hierarchy_root(self) -> Path:
        """Where the paths of /proc's cgroup files begin: the cgroup mount at or
        above the configured mount. An agent may be given a subtree of the
        hierarchy (a reservation such as ``/sys/fs/cgroup/cpu/team-a``) while
        the kernel names a thread's cgroup from the hierarchy's top. A tree on
        no cgroup mount (a copy of the kernel's layout) is its own top."""
        if self._top is None:
            # Once per backend: a hierarchy is not remounted under a running agent.
            mount = self.mount.resolve()
            above = [p for p in cgroup_mount_points(self.proc_root) if mount.is_relative_to(p)]
            self._top = max(above, key=lambda p: len(p.parts)) if above else mount
        return self._top

    def _own_line(self, text: str) -> str | None:
        """This hierarchy's path in a /proc cgroup file; backends override it."""
        return None

    # ---------------------------------------------------------------- trees

    def roots(self) -> list[Path]:
        """Every dsched root in the hierarchy (one per anchor), outermost first."""
        found: list[Path] = []
        mount = self.mount.resolve()
        if not mount.is_dir():
            return found
        for dirpath, dirnames, _files in os.walk(mount):
            here = Path(dirpath)
            if here.name == self.root_name and here != mount:
                found.append(here)
                dirnames.clear()  # a dsched tree holds no anchors
        return found

    def walk(self) -> list[tuple[InstanceKey, str, Path]]:
        """Instance cgroups present in every dsched tree (for re-adoption)."""
        found = []
        for root in self.roots():
            anchor = root.parent
            for app_dir in sorted(p for p in root.iterdir() if p.is_dir()):
                for worker_dir in sorted(p for p in app_dir.iterdir() if p.is_dir()):
                    for inst_dir in sorted(p for p in worker_dir.iterdir() if p.is_dir()):
                        operator, sep, number = inst_dir.name.rpartition("-")
                        if not sep or not number.isdigit():
                            continue
                        try:
                            key = InstanceKey(app_dir.name, operator, int(number))
                            path = self.instance_path(key, worker_dir.name, anchor)
                        except InvalidName:
                            continue
                        found.append((key, worker_dir.name, path))
        return found

    def remove(self, path: Path) -> bool:
        """Remove an (empty) instance cgroup and its empty parents below its dsched root."""
        path = self._inside(path)
        where = self.split(path)
        root = where[1] if where is not None else self.root.resolve()
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
        """Remove every dsched tree whose cgroups are all empty (agent stop, uninstall)."""
        for root in self.roots():
            for dirpath, _dirs, _files in sorted(os.walk(root), key=lambda t: -len(t[0])):
                try:
                    os.rmdir(dirpath)
                except OSError as exc:
                    log.debug("cannot remove %s: %s", dirpath, exc.strerror)

    def limit_roots(self) -> None:
        """Write ``root_limit_cores`` into every dsched root that exists."""
        if self.root_limit_cores is None:
            return
        for root in self.roots():
            self.limit_root(root)

    # Backends override these.
    def create(self, key: InstanceKey, worker: str, pid: int, anchor: Path | None = None) -> Path:
        raise NotImplementedError

    def attach(self, path: Path, pid: int, tid: int) -> None:
        raise NotImplementedError

    def detach(self, path: Path, tid: int) -> None:
        """Move ``tid`` from ``path`` back into the anchor it came from."""
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
        """Thread counts per instance cgroup → thread counts per directory up to its root."""
        out: dict[Path, int] = {}
        for path, n in threads.items():
            where = self.split(path)
            if where is None:
                continue
            for d in (path, *path.parents):
                out[d] = out.get(d, 0) + n
                if d == where[1]:
                    break
        return out

    def set_weight(self, path: Path, threads: int) -> None:
        """Give ``path`` the scheduling weight of ``threads`` threads."""

    def limit_root(self, root: Path) -> None:
        """Cap dsched root ``root`` at ``root_limit_cores`` (the node's configured capacity)."""

    def _anchor_of_path(self, path: Path) -> Path:
        where = self.split(path)
        if where is None:
            raise InvalidName(f"{path} is outside the agent's cgroups")
        return where[0]


def _ancestors(directory: Path, mount: Path) -> list[Path]:
    """``directory`` and every cgroup above it up to the mount."""
    out = [directory]
    for parent in directory.parents:
        if not parent.is_relative_to(mount):
            break
        out.append(parent)
    return out


class CgroupV1(CgroupTree):
    """cgroup v1 ``cpu`` hierarchy, through cgroupspy's CpuController."""

    mode = "v1"

    def _controller(self, path: Path) -> CpuController:
        return CpuController(Node(os.fsencode(path)))

    def _own_line(self, text: str) -> str | None:
        for line in text.splitlines():
            _id, _sep, rest = line.partition(":")
            controllers, _sep, path = rest.partition(":")
            if "cpu" in controllers.split(","):
                return path
        return None

    def _ceiling_us(self, directory: Path) -> int | None:
        """The tightest quota at or above ``directory``, in µs of our period; None: unlimited.

        The kernel refuses a v1 quota above any ancestor's (EINVAL), so no
        quota is written above this.
        """
        ceiling: int | None = None
        for d in _ancestors(directory.resolve(), self.mount.resolve()):
            quota = _read_ints(d / "cpu.cfs_quota_us")
            period = _read_ints(d / "cpu.cfs_period_us")
            if quota and period and quota[0] > 0 and period[0] > 0:
                here = quota[0] * self.period_us // period[0]
                ceiling = here if ceiling is None else min(ceiling, here)
        return ceiling

    def _quota_under(self, directory: Path, cap_cores: float) -> int:
        quota = quota_for(cap_cores, self.period_us)
        ceiling = self._ceiling_us(directory)
        return quota if ceiling is None else max(MIN_QUOTA_US, min(quota, ceiling))

    def create(self, key: InstanceKey, worker: str, pid: int, anchor: Path | None = None) -> Path:
        anchor = (self.mount if anchor is None else anchor).resolve()
        path = self.instance_path(key, worker, anchor)
        directory = anchor
        for part in path.relative_to(anchor).parts:
            directory = directory / part
            try:
                os.mkdir(directory)
            except FileExistsError:
                continue
            except OSError as exc:
                raise CgroupError(f"cannot create {directory}: {exc.strerror}") from exc
            if directory.parent == anchor:
                self.limit_root(directory)
        return path

    def attach(self, path: Path, pid: int, tid: int) -> None:
        _write(self._inside(path) / "tasks", f"{tid}\n")

    def detach(self, path: Path, tid: int) -> None:
        _write(self._anchor_of_path(self._inside(path)) / "tasks", f"{tid}\n")

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
            ctl.cfs_quota_us = self._quota_under(path.parent, cap_cores)
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

    def limit_root(self, root: Path) -> None:
        if self.root_limit_cores is None:
            return
        root = self._inside_or_root(root)
        quota = self._quota_under(root.parent, self.root_limit_cores)
        _write(root / "cpu.cfs_quota_us", "-1\n")
        _write(root / "cpu.cfs_period_us", f"{self.period_us}\n")
        _write(root / "cpu.cfs_quota_us", f"{quota}\n")

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
    """cgroup v2 threaded subtree below the process's own cgroup (``cgroup.threads``, ``cpu.max``)."""

    mode = "v2"

    def _own_line(self, text: str) -> str | None:
        for line in text.splitlines():
            if line.startswith("0::"):
                return line[3:]
        return None

    def _enable_cpu(self, directory: Path) -> None:
        control = directory / "cgroup.subtree_control"
        try:
            current = control.read_text().split()
        except OSError:
            current = []
        if "cpu" not in current:
            _write(control, "+cpu\n")

    def create(self, key: InstanceKey, worker: str, pid: int, anchor: Path | None = None) -> Path:
        anchor = (self.mount if anchor is None else anchor).resolve()
        try:
            controllers = (anchor / "cgroup.controllers").read_text().split()
        except OSError:
            controllers = []
        if "cpu" not in controllers:
            raise CgroupError(
                f"{anchor} has no cpu controller (its parent does not enable it); "
                "dsched enables none above a process's cgroup"
            )
        path = self.instance_path(key, worker, anchor)
        directory = anchor
        for part in path.relative_to(anchor).parts:
            child = directory / part
            try:
                child.mkdir()
            except FileExistsError:
                pass
            except OSError as exc:
                raise CgroupError(f"cannot create {child}: {exc.strerror}") from exc
            try:
                kind = (child / "cgroup.type").read_text().strip()
            except OSError:
                kind = ""
            if kind != "threaded":
                # The process stays in the anchor, which becomes the threaded domain.
                _write(child / "cgroup.type", "threaded\n")
            self._enable_cpu(directory)
            if directory == anchor:
                self.limit_root(child)
            directory = child
        return path

    def attach(self, path: Path, pid: int, tid: int) -> None:
        _write(self._inside(path) / "cgroup.threads", f"{tid}\n")

    def detach(self, path: Path, tid: int) -> None:
        _write(self._anchor_of_path(self._inside(path)) / "cgroup.threads", f"{tid}\n")

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

    def limit_root(self, root: Path) -> None:
        if self.root_limit_cores is None:
            return
        root = self._inside_or_root(root)
        quota = quota_for(self.root_limit_cores, self.period_us)
        _write(root / "cpu.max", f"{quota} {self.period_us}\n")

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
        proc_root: str = "/proc",
    ):
        super().__init__(mount, root_name, period_us, why, proc_root)
        self._caps: dict[Path, float | None] = {}

    def anchor_of(self, pid: int, tid: int) -> Path:
        return self.mount

    def create(self, key: InstanceKey, worker: str, pid: int, anchor: Path | None = None) -> Path:
        return self.root / key.app / worker / f"{key.operator}-{key.instance}"

    def attach(self, path: Path, pid: int, tid: int) -> None:
        return None

    def detach(self, path: Path, tid: int) -> None:
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

    def roots(self) -> list[Path]:
        return []

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
    """(mode, mount, why) for ``auto``: the v1 cpu hierarchy where one is found, else v2."""
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
    mode: str,
    mount: str,
    root_name: str,
    period_us: int,
    dry_run: bool,
    proc_root: str = "/proc",
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
    # Where the threads' own cgroups are read (the anchors of their groups).
    backend.proc_root = proc_root
    return backend, backend.why
