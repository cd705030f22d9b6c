"""SIGTERM stops every entry point as SIGINT does (docs/operations.md, "Stopping").

Each entry point runs as a real subprocess in a session of its own and gets
SIGTERM at a seeded random moment, either during its startup (after its
handler is in place: before that nothing has started) or in steady state. Then:
it exits with the documented status (0 for the daemons, 130 for the demo and
the benchmarks), no process of its tree is left (every descendant seen before
the signal, and anything still in its session or in a session one of them
made), the agent's cgroup root is gone (unique per test), and no socket file
is left in its work directory.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from testbed.live.cluster import CGROUP_V1_CPU, remove_cgroup_tree, write_toml

from .conftest import require_cgroups

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent
SEED = 20241124
INTERRUPTED, STOPPED = 130, 0


# ---------------------------------------------------------------- process trees


def _stat(pid: int) -> tuple[str, int, int, int, int] | None:
    """(state, ppid, pgid, sid, start ticks) of ``pid``, None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    f = text[text.rindex(")") + 2 :].split()
    return f[0], int(f[1]), int(f[2]), int(f[3]), int(f[19])


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _all_pids() -> list[int]:
    return [int(d) for d in os.listdir("/proc") if d.isdigit()]


class Tree:
    """Every process below ``root`` seen by :meth:`scan`, with the sessions they
    are in; what of it is still alive (zombies waiting for a reaper do not count)."""

    def __init__(self, root: int, marker: str):
        self.root = root
        self.marker = marker  # a path only this run's command lines name
        self.seen: dict[int, int] = {}  # pid -> start ticks
        self.cmds: dict[int, str] = {}  # pid -> its latest command line seen
        self.sessions: set[int] = {root}

    def scan(self) -> None:
        table = {pid: s for pid in _all_pids() if (s := _stat(pid)) is not None}
        todo = [self.root]
        while todo:
            parent = todo.pop()
            for pid, (_state, ppid, _pgid, sid, start) in table.items():
                if ppid == parent and self.seen.setdefault(pid, start) == start:
                    self.sessions.add(sid)
                    self.cmds[pid] = _cmdline(pid) or self.cmds.get(pid, "")
                    todo.append(pid)

    def cmdlines(self) -> list[str]:
        """Every command line seen in the tree (also of processes gone since)."""
        return list(self.cmds.values())

    def left(self) -> list[tuple[int, str]]:
        out = []
        for pid in _all_pids():
            s = _stat(pid)
            if s is None or s[0] == "Z" or pid == os.getpid():
                continue
            mine = self.seen.get(pid) == s[4] or s[3] in self.sessions
            if mine or self.marker in _cmdline(pid):
                out.append((pid, _cmdline(pid)))
        return out

    def kill_left(self) -> None:
        for pid, _ in self.left():
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


def _catches_sigterm(pid: int) -> bool:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("SigCgt:"):
                return bool(int(line.split()[1], 16) & (1 << (signal.SIGTERM - 1)))
    except OSError:
        pass
    return False


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _sockets(where: Path) -> list[str]:
    found = []
    for dirpath, _dirs, files in os.walk(where):
        for name in files:
            p = Path(dirpath) / name
            try:
                if stat.S_ISSOCK(p.lstat().st_mode):
                    found.append(str(p))
            except OSError:
                pass
    return found


def _until(what: str, check, proc: subprocess.Popen, tree: Tree, timeout: float, log: Path):
    """Scan the tree until ``check()`` is true (the process must still run)."""
    deadline = time.monotonic() + timeout
    while True:
        tree.scan()
        if check():
            return
        if proc.poll() is not None:
            pytest.fail(f"exited ({proc.returncode}) before {what}: {_tail(log)}")
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} after {timeout:.0f} s: {_tail(log)}")
        time.sleep(0.1)


def _tail(log: Path, n: int = 3000) -> str:
    try:
        return log.read_text(errors="replace")[-n:]
    except OSError:
        return ""


class Run:
    """One entry point as a subprocess in its own session, stopped by SIGTERM."""

    def __init__(self, cmd: list[str], tmp_path: Path, env: dict[str, str] | None = None):
        self.log = tmp_path / "out.log"
        self.proc = subprocess.Popen(
            cmd,
            stdout=self.log.open("wb"),
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env=env,
            cwd=tmp_path,
        )
        self.tree = Tree(self.proc.pid, str(tmp_path))

    def until(self, what: str, check, timeout: float = 120.0) -> None:
        _until(what, check, self.proc, self.tree, timeout, self.log)

    def handler_installed(self) -> None:
        self.until("SIGTERM handler", lambda: _catches_sigterm(self.proc.pid), 60)

    def sleep(self, seconds: float) -> None:
        """Sleep, scanning the tree (children start meanwhile)."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.tree.scan()
            if self.proc.poll() is not None:
                pytest.fail(f"exited ({self.proc.returncode}) too early: {_tail(self.log)}")
            time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))

    def terminate(self, expected: int, timeout: float = 180.0) -> str:
        """SIGTERM, wait, check the status and that no process of the tree is left."""
        self.tree.scan()
        self.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None:
            self.tree.scan()
            if time.monotonic() > deadline:
                self.proc.kill()
                pytest.fail(f"still running {timeout:.0f} s after SIGTERM: {_tail(self.log)}")
            time.sleep(0.1)
        text = _tail(self.log, 6000)
        assert self.proc.returncode == expected, text
        deadline = time.monotonic() + 30  # a JVM notices its parent is gone
        while self.tree.left() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not self.tree.left(), f"left running: {self.tree.left()}\n{text}"
        return text

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.tree.kill_left()


@pytest.fixture
def cgroup_root(request):
    """A cgroup root name of this test only; whatever is left of it is removed after."""
    require_cgroups()
    name = f"dsched-sigterm-{os.getpid()}-{request.node.name}"
    name = "".join(c if c.isalnum() or c in "-_" else "-" for c in name)[:120]
    yield name
    remove_cgroup_tree(CGROUP_V1_CPU / name)


def _rng(name: str, phase: str) -> random.Random:
    return random.Random(f"{SEED}-{name}-{phase}")


def _started(run: Run, what: str) -> bool:
    return any(what in c for c in run.tree.cmdlines())


def _has_instance_cgroups(root: Path) -> bool:
    return any(p.is_dir() for p in root.glob("*/*/*"))


# ---------------------------------------------------------------- dsched demo


@pytest.mark.parametrize("phase", ["startup", "steady"])
def test_demo_stops_cleanly_on_sigterm(tmp_path, cgroup_root, phase):
    rng = _rng("demo", phase)
    work = tmp_path / "work"
    run = Run(
        [
            str(BIN / "dsched"),
            *("demo", "--mode", "enforce", "--duration", "120", "--slot-seconds", "1"),
            *("--parallelism", "2", "--peak-rate", "80", "--no-history", "--quiet"),
            *("--cgroup-root", cgroup_root, "--workdir", str(work)),
        ],
        tmp_path,
    )
    root = CGROUP_V1_CPU / cgroup_root
    try:
        run.handler_installed()
        if phase == "startup":
            # The controller, then the agent and the topology starting.
            run.until("the controller", lambda: _started(run, "dsched-controller"))
            run.sleep(rng.uniform(0.0, 2.0))
        else:
            run.until("capped instances", lambda: _has_instance_cgroups(root))
            run.sleep(rng.uniform(0.5, 3.0))
        text = run.terminate(INTERRUPTED)
        assert "stopped by SIGTERM" in text
        if phase == "steady":
            assert _started(run, "dsched-agent")
        assert not root.exists(), sorted(str(p) for p in root.rglob("*") if p.is_dir())
        assert not _sockets(tmp_path)
    finally:
        run.close()


def test_flink_demo_stops_cleanly_on_sigterm_while_flink_starts(tmp_path, cgroup_root):
    """One case only: a Flink cluster takes 10-40 s to start. SIGTERM while it
    starts, the hardest moment (daemons half up, scripts still forking)."""
    from testbed.flink import install

    why = install.missing()
    if why is not None:
        pytest.skip(f"Flink is not installed: {why}")
    rng = _rng("demo-flink", "startup")
    work = tmp_path / "work"
    run = Run(
        [
            str(BIN / "dsched"),
            *("demo", "--engine", "flink", "--mode", "enforce", "--duration", "120"),
            *("--slot-seconds", "1", "--parallelism", "1", "--no-history", "--quiet"),
            *("--cgroup-root", cgroup_root, "--workdir", str(work)),
        ],
        tmp_path,
    )
    try:
        run.until("a Flink JVM", lambda: any("flink" in c for c in run.tree.cmdlines()))
        run.sleep(rng.uniform(0.5, 4.0))
        text = run.terminate(INTERRUPTED)
        assert "stopped by SIGTERM" in text
        assert not (CGROUP_V1_CPU / cgroup_root).exists()
        assert not _sockets(tmp_path)
    finally:
        run.close()


# ---------------------------------------------------------------- benchmarks


@pytest.mark.parametrize("phase", ["startup", "steady"])
def test_bench_live_stops_cleanly_on_sigterm(tmp_path, phase):
    require_cgroups()
    rng = _rng("bench-live", phase)
    run = Run(
        [
            str(BIN / "dsched"),
            *("bench", "live", "--scenario", "wordcount-regular", "--duration", "60"),
            *("--contenders", "dsched", "--slot-seconds", "1", "--warmup", "1"),
            *("--json", str(tmp_path / "r.json"), "--workdir", str(tmp_path / "w")),
        ],
        tmp_path,
    )
    # The run's own cgroup tree (the agent's root is `testbed` inside it).
    top = CGROUP_V1_CPU / f"dsched-live-{run.proc.pid}"
    try:
        run.handler_installed()
        if phase == "startup":
            run.until("the controller", lambda: _started(run, "dsched-controller"))
            run.sleep(rng.uniform(0.0, 2.0))
        else:
            run.until("capped instances", lambda: _has_instance_cgroups(top / "testbed"))
            run.sleep(rng.uniform(0.5, 2.0))
        run.terminate(INTERRUPTED)
        assert not top.exists(), sorted(str(p) for p in top.rglob("*") if p.is_dir())
        assert not (tmp_path / "r.json").exists()
        assert not _sockets(tmp_path)
    finally:
        run.close()
        remove_cgroup_tree(top)


@pytest.mark.parametrize("phase", ["startup", "steady"])
def test_bench_wire_scale_stops_cleanly_on_sigterm(tmp_path, phase):
    rng = _rng("bench-wire-scale", phase)
    run = Run(
        [
            str(BIN / "dsched"),
            *("bench", "wire-scale", "--agents", "4", "--instances", "24", "--apps", "2"),
            *("--slot-seconds", "1", "--rounds", "60", "--client-processes", "2"),
            *("--reference-repeats", "1", "--json", str(tmp_path / "w.json")),
        ],
        tmp_path,
        env=dict(os.environ, TMPDIR=str(tmp_path)),  # where its temporary directory goes
    )
    try:
        run.handler_installed()
        if phase == "startup":
            # The controller and the client processes starting.
            run.until("the controller", lambda: _started(run, "dsched-controller"))
            run.sleep(rng.uniform(0.0, 1.5))
        else:
            run.until(
                "two client processes",
                lambda: sum("bench.wire_client" in c for c in run.tree.cmdlines()) == 2,
            )
            run.sleep(rng.uniform(1.0, 3.0))
        run.terminate(INTERRUPTED)
        assert not list(tmp_path.glob("dsched-wire-*")), "temporary directory left behind"
        assert not (tmp_path / "w.json").exists()
    finally:
        run.close()


# ---------------------------------------------------------------- daemons


def _sleeper() -> subprocess.Popen:
    return subprocess.Popen(["sleep", "600"], stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("phase", ["startup", "steady"])
def test_agent_stops_cleanly_on_sigterm_and_keeps_caps_of_running_instances(
    tmp_path, cgroup_root, phase
):
    """A previous agent left two capped instances; one of them exits while this
    agent runs. No controller answers, so the agent never learns whether it may
    change anything: on SIGTERM it exits 0, removes its socket, and leaves the
    cgroups as it found them (the running instance capped, the gone one's empty
    group for an enforcing controller's agent to remove)."""
    rng = _rng("agent", phase)
    root = CGROUP_V1_CPU / cgroup_root
    gone, running = root / "app" / "w1" / "op-0", root / "app" / "w1" / "op-1"
    sleepers = [_sleeper(), _sleeper()]
    run = None
    try:
        for path, proc in zip((gone, running), sleepers, strict=True):
            path.mkdir(parents=True)
            (path / "cpu.cfs_quota_us").write_text("20000\n")  # 0.2 cores of 100 ms
            (path / "tasks").write_text(f"{proc.pid}\n")
        sock = tmp_path / "agent.sock"
        config = write_toml(
            tmp_path / "agent.toml",
            {
                "controller": f"127.0.0.1:{_free_port()}",  # nobody: caps are held
                "node_id": "n1",
                "cgroup_root": cgroup_root,
                "socket": str(sock),
                "metrics": f"127.0.0.1:{_free_port()}",
                "slot_seconds": 1.0,
                "fallback": "hold",
            },
        )
        run = Run([str(BIN / "dsched-agent"), "--config", str(config)], tmp_path)
        run.handler_installed()
        if phase == "startup":
            run.sleep(rng.uniform(0.0, 0.5))
        else:
            run.until("the registration socket", sock.exists, 60)
            run.sleep(rng.uniform(0.5, 2.5))
        sleepers[0].kill()
        sleepers[0].wait()
        run.terminate(STOPPED, timeout=60)
        assert not sock.exists() and not _sockets(tmp_path)
        assert gone.exists() and not (gone / "tasks").read_text().split()
        assert (running / "tasks").read_text().split() == [str(sleepers[1].pid)]
        assert (running / "cpu.cfs_quota_us").read_text().strip() == "20000"
        assert (gone / "cpu.cfs_quota_us").read_text().strip() == "20000"
    finally:
        for s in sleepers:
            s.kill()
            s.wait()
        if run is not None:
            run.close()


@pytest.mark.parametrize("phase", ["startup", "steady"])
def test_controller_stops_cleanly_on_sigterm(tmp_path, phase):
    rng = _rng("controller", phase)
    admin = tmp_path / "admin.sock"
    config = write_toml(
        tmp_path / "controller.toml",
        {
            "listen": f"127.0.0.1:{_free_port()}",
            "admin_listen": f"unix:{admin}",
            "metrics": f"127.0.0.1:{_free_port()}",
            "state_dir": str(tmp_path / "state"),
            "slot_seconds": 1.0,
            "history": {"enabled": False},
        },
    )
    run = Run([str(BIN / "dsched-controller"), "--config", str(config)], tmp_path)
    try:
        run.handler_installed()  # installed before the doors open
        if phase == "startup":
            run.sleep(rng.uniform(0.0, 1.0))
        else:
            run.until("the admin socket", admin.exists, 60)
            run.sleep(rng.uniform(0.5, 2.5))
        run.terminate(STOPPED, timeout=60)
        assert not admin.exists() and not _sockets(tmp_path)
    finally:
        run.close()


@pytest.mark.parametrize("phase", ["startup", "steady"])
def test_history_daemon_stops_spark_on_sigterm(tmp_path, phase):
    """``dsched-history run``: Spark (a JVM child) stops with it, also while it starts."""
    rng = _rng("history", phase)
    run = Run(
        [
            str(BIN / "dsched-history"),
            *("run", "--state-dir", str(tmp_path / "state"), "--master", "local[1]"),
        ],
        tmp_path,
    )
    try:
        run.handler_installed()
        if phase == "startup":
            # The JVM starting, the session, the query.
            run.until("a JVM", lambda: any("java" in c for c in run.tree.cmdlines()), 60)
            run.sleep(rng.uniform(0.0, 3.0))
        else:
            run.until("the running job", lambda: "history job running" in _tail(run.log), 180)
            run.sleep(rng.uniform(0.5, 2.0))
        run.terminate(STOPPED, timeout=120)
        assert any("java" in c for c in run.tree.cmdlines())
        assert not _sockets(tmp_path)
    finally:
        run.close()
