"""Node and thread counters read from the kernel: /proc, PSI, netlink, resctrl.

Each reader returns None (or an empty map) when the kernel does not have the
counter, so the report can say "unavailable" instead of sending zero.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import psutil

log = logging.getLogger(__name__)

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


# Fields 14 and 15 (utime, stime) end well within the first 512 bytes: pid, a comm
# of at most 64 bytes, then 13 numbers of at most 20 digits.
STAT_READ_BYTES = 512
# schedstat is "<run ns> <wait ns> <timeslices>\n": three numbers of at most 20 digits.
SCHEDSTAT_READ_BYTES = 64


def stat_seconds(raw: bytes) -> float:
    """utime + stime in seconds from the text of a /proc/<pid>/task/<tid>/stat file;
    IndexError or ValueError when it is not one (an empty read: the thread exited)."""
    # comm may contain spaces and parentheses: split after the last ')'. Splitting
    # only 13 times leaves the other ~40 fields as one unparsed tail.
    fields = raw[raw.rfind(b")") + 2 :].split(b" ", 13)
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def schedstat_seconds(raw: bytes) -> float:
    """Time on a CPU in seconds from a /proc/<pid>/task/<tid>/schedstat file;
    ValueError when it is not one."""
    return int(raw.split(b" ", 1)[0]) / 1e9


def stat_cpu_seconds(raw: bytes) -> float | None:
    """utime + stime in seconds from the text of a stat file, or None."""
    try:
        return stat_seconds(raw)
    except (IndexError, ValueError):
        return None


def thread_cpu_seconds(proc_root: str | Path, pid: int, tid: int) -> float | None:
    """utime + stime of one thread in seconds, or None when it has exited."""
    try:
        with open(f"{proc_root}/{pid}/task/{tid}/stat", "rb") as fh:
            raw = fh.read(STAT_READ_BYTES)
    except OSError:
        return None
    return stat_cpu_seconds(raw)


class ThreadCpuReader:
    """Per-thread CPU time with the files kept open: at 1 s sampling over hundreds of
    threads, open/close costs more than the read, and a pread at offset 0 of a /proc file
    returns fresh values.

    It reads ``schedstat`` (nanoseconds, three numbers) where the kernel has it
    (CONFIG_SCHED_INFO) and ``stat`` otherwise. ``stat`` counts in clock ticks
    (10 ms at 100 Hz): over a quarter-second sample a 0.2-core thread is five
    ticks, a 20 % step; it is also a longer line to produce and parse.
    """

    def __init__(self, proc_root: str | Path = "/proc", source: str | None = None):
        self.proc_root = proc_root
        if source is None:
            source = "schedstat" if os.path.exists(f"{proc_root}/self/schedstat") else "stat"
        if source not in ("schedstat", "stat"):
            raise ValueError(f"source must be schedstat or stat, got {source!r}")
        self.source = source
        # What one read takes and how it becomes seconds (raises on a bad read).
        self.read_bytes = SCHEDSTAT_READ_BYTES if source == "schedstat" else STAT_READ_BYTES
        self.seconds_from = schedstat_seconds if source == "schedstat" else stat_seconds
        self._fds: dict[tuple[int, int], int] = {}

    def open(self, pid: int, tid: int) -> int:
        """The kept-open CPU-time file of a thread, or -1 when it has exited.

        The descriptor stays valid until :meth:`forget`, :meth:`retain` or
        :meth:`close`; a pread on it after the thread exited fails (ESRCH).
        """
        fd = self._fds.get((pid, tid))
        if fd is None:
            try:
                fd = os.open(f"{self.proc_root}/{pid}/task/{tid}/{self.source}", os.O_RDONLY)
            except OSError:
                return -1
            self._fds[(pid, tid)] = fd
        return fd

    def read(self, pid: int, tid: int) -> float | None:
        fd = self.open(pid, tid)
        try:
            return self.seconds_from(os.pread(fd, self.read_bytes, 0))
        except (OSError, IndexError, ValueError):
            # ESRCH or an empty read: the thread has exited.
            self.forget(pid, tid)
            return None

    def forget(self, pid: int, tid: int) -> None:
        fd = self._fds.pop((pid, tid), None)
        if fd is not None:
            os.close(fd)

    def forget_process(self, pid: int) -> None:
        """Close every file opened under ``pid`` (it may name another process now)."""
        for key in [k for k in self._fds if k[0] == pid]:
            self.forget(*key)

    def retain(self, wanted: set[tuple[int, int]]) -> None:
        """Close the files of every (pid, tid) not in ``wanted``."""
        for key in [k for k in self._fds if k not in wanted]:
            self.forget(*key)

    @property
    def open_files(self) -> int:
        return len(self._fds)

    def close(self) -> None:
        for key in list(self._fds):
            self.forget(*key)


# /proc/<pid>/stat is one line well under 1 KiB (52 fields of at most 20 digits and a
# comm of at most 64 bytes).
PROCESS_STAT_READ_BYTES = 1536


def stat_start_ticks(raw: bytes) -> int:
    """Field 22 (starttime: clock ticks after boot) of a /proc/<pid>/stat text;
    IndexError or ValueError when it is not one."""
    # After the comm's last ')' come field 3 (state) onwards: field 22 is the 20th.
    return int(raw[raw.rfind(b")") + 2 :].split(b" ", 20)[19])


def process_start_ticks(proc_root: str | Path, pid: int) -> int | None:
    """When process ``pid`` started, in clock ticks after boot; None when it is gone.

    A pid and its start time name one process for good: the kernel may give an
    exited process's pid to a new one, never with the same start time.
    """
    try:
        with open(f"{proc_root}/{pid}/stat", "rb") as fh:
            raw = fh.read(PROCESS_STAT_READ_BYTES)
    except OSError:
        return None
    try:
        return stat_start_ticks(raw)
    except (IndexError, ValueError):
        return None


def thread_alive(proc_root: str | Path, pid: int, tid: int) -> bool:
    return os.path.exists(f"{proc_root}/{pid}/task/{tid}")


def thread_group(proc_root: str | Path, tid: int) -> int | None:
    """The process (Tgid) a TID belongs to, or None when it has exited."""
    try:
        with open(f"{proc_root}/{tid}/status") as fh:
            for line in fh:
                if line.startswith("Tgid:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


@dataclass(frozen=True)
class Pressure:
    some_avg10: float
    some_avg60: float
    full_avg10: float
    full_avg60: float


def read_pressure(path: str | Path = "/proc/pressure/cpu") -> Pressure | None:
    """CPU pressure stall information; None when the kernel has no PSI."""
    try:
        text = Path(path).read_text()
    except OSError:
        return None
    values: dict[str, dict[str, float]] = {}
    for line in text.splitlines():
        kind, *pairs = line.split()
        values[kind] = {k: float(v) for k, v in (p.split("=") for p in pairs)}
    some = values.get("some", {})
    # Older kernels have no "full" line for cpu; that is "no full stalls".
    full = values.get("full", {})
    return Pressure(
        some.get("avg10", 0.0),
        some.get("avg60", 0.0),
        full.get("avg10", 0.0),
        full.get("avg60", 0.0),
    )


@dataclass(frozen=True)
class InterfaceCounters:
    name: str
    rx_bytes: int
    tx_bytes: int


class NetlinkInterfaces:
    """Per-interface byte counters through one long-lived pyroute2 socket."""

    def __init__(self) -> None:
        self._ipr = None
        try:
            from pyroute2 import IPRoute

            self._ipr = IPRoute()
        except Exception as exc:  # noqa: BLE001 - any netlink failure means "unavailable"
            log.info("per-interface bytes unavailable: %s", exc)

    @property
    def available(self) -> bool:
        return self._ipr is not None

    def read(self) -> list[InterfaceCounters] | None:
        if self._ipr is None:
            return None
        out = []
        try:
            for link in self._ipr.get_links():
                stats = link.get("IFLA_STATS64") or link.get("IFLA_STATS")
                if stats is None:
                    continue
                out.append(
                    InterfaceCounters(link.get("IFLA_IFNAME"), stats["rx_bytes"], stats["tx_bytes"])
                )
        except Exception as exc:  # noqa: BLE001
            log.warning("reading interfaces over netlink failed: %s", exc)
            return None
        return out

    def close(self) -> None:
        if self._ipr is not None:
            self._ipr.close()
            self._ipr = None


class NodeCpu:
    """Node capacity and mean usage since the previous call, in cores."""

    def __init__(self) -> None:
        self.capacity_cores = float(psutil.cpu_count(logical=True) or 1)
        self._last = (time.monotonic(), self._busy())

    @staticmethod
    def _busy() -> float:
        t = psutil.cpu_times()
        return sum(t) - t.idle - getattr(t, "iowait", 0.0)

    def usage_cores(self) -> float:
        now, busy = time.monotonic(), self._busy()
        last_t, last_busy = self._last
        self._last = (now, busy)
        dt = now - last_t
        return max(0.0, (busy - last_busy) / dt) if dt > 0 else 0.0


class RootThreadsCpu:
    """Mean CPU, in cores since the previous call, of the threads a cgroup holds directly.

    The agent's root holds every thread of the node that is not in an instance's
    cgroup only where the node's processes run inside that root (a container,
    one node of a testbed sharing a machine). There this is the node's CPU beyond
    its instances: an engine's dispatch, network and GC threads. A thread counts
    from the second time it is seen, so one that joins or leaves the root within
    a slot is counted for the time it was seen there, never twice.
    """

    def __init__(self, tids: Callable[[], Iterable[int]], proc_root: str | Path = "/proc"):
        self.tids = tids
        self.reader = ThreadCpuReader(proc_root)
        self._seconds: dict[int, float] = {}
        self._at = time.monotonic()

    def usage_cores(self) -> float:
        now = time.monotonic()
        seconds: dict[int, float] = {}
        used = 0.0
        for tid in set(self.tids()):
            # /proc/<tid>/task/<tid> names the thread whatever its process.
            s = self.reader.read(tid, tid)
            if s is None:
                continue
            seconds[tid] = s
            before = self._seconds.get(tid)
            if before is not None:
                used += max(0.0, s - before)
        self.reader.retain({(t, t) for t in seconds})
        dt, self._at, self._seconds = now - self._at, now, seconds
        return used / dt if dt > 0 else 0.0

    def close(self) -> None:
        self.reader.close()
        self._seconds = {}


@dataclass(frozen=True)
class ResctrlGroup:
    llc_occupancy_bytes: float
    mbm_total_bytes: int


class Resctrl:
    """resctrl monitoring groups, one per application (monitoring IDs are scarce).

    Group ``mon_groups/<app>`` sums ``llc_occupancy`` and ``mbm_total_bytes``
    over all ``mon_data/mon_L3_*`` domains. Without a mounted resctrl the node
    reports both counters unavailable.
    """

    def __init__(self, mount: str | Path = "/sys/fs/resctrl", writable: bool = True):
        self.mount = Path(mount)
        self.writable = writable
        self._last_mbm: dict[str, tuple[float, int]] = {}

    @property
    def available(self) -> bool:
        return (self.mount / "mon_groups").is_dir()

    def _domains(self, group: str) -> list[Path]:
        return sorted((self.mount / "mon_groups" / group / "mon_data").glob("mon_L3_*"))

    def _groups(self) -> list[str]:
        try:
            return sorted(p.name for p in (self.mount / "mon_groups").iterdir() if p.is_dir())
        except OSError:
            return []

    def assign(self, app: str, tids: list[int]) -> None:
        """Put an application's threads into its monitoring group (best effort)."""
        if not (self.available and self.writable):
            return
        group = self.mount / "mon_groups" / app
        try:
            group.mkdir(exist_ok=True)
            for tid in tids:
                with open(group / "tasks", "w") as fh:
                    fh.write(f"{tid}\n")
        except OSError as exc:
            log.debug("resctrl group %s: %s", app, exc)

    def read(self, apps: set[str]) -> tuple[dict[str, float], dict[str, float]] | None:
        """(LLC bytes per app, memory bandwidth bytes/s per app) or None if unavailable.

        Bandwidth needs two readings, so an app appears in the second map from
        its second reading on.
        """
        if not self.available:
            return None
        now = time.monotonic()
        llc: dict[str, float] = {}
        bandwidth: dict[str, float] = {}
        for app in sorted(apps & set(self._groups())):
            occupancy, mbm, seen = 0.0, 0, False
            for domain in self._domains(app):
                try:
                    occupancy += float((domain / "llc_occupancy").read_text())
                    mbm += int((domain / "mbm_total_bytes").read_text())
                    seen = True
                except (OSError, ValueError):
                    continue
            if not seen:
                continue
            llc[app] = occupancy
            last = self._last_mbm.get(app)
            if last is not None and now > last[0] and mbm >= last[1]:
                bandwidth[app] = (mbm - last[1]) / (now - last[0])
            self._last_mbm[app] = (now, mbm)
        return llc, bandwidth
