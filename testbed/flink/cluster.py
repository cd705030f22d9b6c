"""A Flink session cluster on loopback: one JobManager and N TaskManagers, each a JVM.

Every cluster lives in its own work directory::

    <work_dir>/conf/         config.yaml + log4j*.properties (FLINK_CONF_DIR)
    <work_dir>/log/          the daemons' and the CLI's logs (FLINK_LOG_DIR)
    <work_dir>/pid/          flink-daemon.sh's pid files (env.pid.dir)
    <work_dir>/tmp/          io.tmp.dirs, java.io.tmpdir, blobs, web uploads
    <work_dir>/checkpoints/  checkpoint storage

Ports are picked free at start, so several clusters (tests, a benchmark, someone
else's cluster under /tmp) coexist. A process belongs to this cluster when its
command line names this conf dir (``--configDir <conf>`` or
``file:<conf>/log4j*.properties``): that is how TaskManager pids are found and how
:meth:`FlinkCluster.stop` kills stragglers without touching anything else.

Example::

    with FlinkCluster(Path("/tmp/x")).start(taskmanagers=1, slots=4) as cluster:
        job_id = cluster.submit(jar, "Main", ["arg"], parallelism=2)
        cluster.wait_running(job_id)
"""

from __future__ import annotations

import itertools
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from dsched.signals import check_stop
from testbed.flink import install
from testbed.flink.rest import FlinkRest, FlinkRestError

TM_CLASS = "org.apache.flink.runtime.taskexecutor.TaskManagerRunner"
JM_CLASS = "org.apache.flink.runtime.entrypoint.StandaloneSessionClusterEntrypoint"
# How long a daemon may be absent from the process table during startup before it
# counts as exited (see _wait_registered).
DAEMON_GRACE_SECONDS = 10.0
# Starts of a cluster whose JobManager found a chosen port taken before it bound it.
PORT_ATTEMPTS = 3

log = logging.getLogger(__name__)
TERMINAL_STATES = frozenset({"FINISHED", "CANCELED", "FAILED"})
_JOB_ID = re.compile(r"JobID ([0-9a-f]{32})")
_RESOURCE_ID = re.compile(r"taskmanager\.resource-id=(\S+)")
# Used only when the distribution's config.yaml has no env.java.opts.all line: Flink on
# Java 17 needs these or `flink run` fails with InaccessibleObjectException.
_FALLBACK_JAVA_OPTS = (
    "--add-exports=java.rmi/sun.rmi.registry=ALL-UNNAMED "
    "--add-exports=java.security.jgss/sun.security.krb5=ALL-UNNAMED "
    "--add-opens=java.base/java.lang=ALL-UNNAMED --add-opens=java.base/java.net=ALL-UNNAMED "
    "--add-opens=java.base/java.io=ALL-UNNAMED --add-opens=java.base/java.nio=ALL-UNNAMED "
    "--add-opens=java.base/sun.nio.ch=ALL-UNNAMED "
    "--add-opens=java.base/java.lang.reflect=ALL-UNNAMED "
    "--add-opens=java.base/java.text=ALL-UNNAMED --add-opens=java.base/java.time=ALL-UNNAMED "
    "--add-opens=java.base/java.util=ALL-UNNAMED "
    "--add-opens=java.base/java.util.concurrent=ALL-UNNAMED "
    "--add-opens=java.base/java.util.concurrent.atomic=ALL-UNNAMED "
    "--add-opens=java.base/java.util.concurrent.locks=ALL-UNNAMED"
)


class FlinkClusterError(RuntimeError):
    """The cluster did not start, a job could not be submitted, or it failed."""


@dataclass(frozen=True)
class JvmThread:
    """One Java thread of a JVM: its name and its Linux thread id (what cgroups take)."""

    name: str
    tid: int


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def jvm_threads(pid: int, timeout: float = 30.0) -> list[JvmThread]:
    """The threads of JVM ``pid`` from ``jcmd <pid> Thread.print``.

    Flink names a task's main thread ``<vertex name> (<i>/<n>)#<attempt>`` (1-based
    subtask index); ``nid`` is the native thread id, printed in hex by Java 17.
    """
    result = subprocess.run(
        ["jcmd", str(pid), "Thread.print"], capture_output=True, text=True, timeout=timeout
    )
    if result.returncode != 0:
        raise FlinkClusterError(f"jcmd {pid} Thread.print failed: {result.stdout}{result.stderr}")
    threads = []
    for m in re.finditer(r'^"(.*)" #\d+ .*?\bnid=(0x[0-9a-fA-F]+|\d+)', result.stdout, re.M):
        threads.append(JvmThread(m.group(1), int(m.group(2), 0)))
    return threads


@dataclass
class FlinkCluster:
    """One Flink session cluster under ``work_dir`` (created if needed).

    ``extra_conf`` entries override or extend the generated config.yaml (flat keys).
    """

    work_dir: Path
    home: Path | None = None
    jobmanager_memory: str = "1200m"
    taskmanager_memory: str = "1400m"
    # Checkpoints let a job restarted after a TaskManager loss resume where it was
    # instead of re-reading every input file; None turns them off.
    checkpoint_interval: str | None = "10s"
    extra_conf: dict[str, str] = field(default_factory=dict)
    start_timeout: float = 90.0

    rest_port: int = field(init=False, default=0)
    rpc_port: int = field(init=False, default=0)
    slots: int = field(init=False, default=0)
    _tm_ids: itertools.count = field(init=False, repr=False, default_factory=itertools.count)
    _started: bool = field(init=False, repr=False, default=False)

    def __post_init__(self) -> None:
        self.work_dir = Path(self.work_dir).resolve()
        if any(c.isspace() for c in str(self.work_dir)):
            # flink-daemon.sh word-splits the JVM options that name these directories.
            raise ValueError(f"work_dir must not contain whitespace: {self.work_dir!r}")
        self.home = install.require(self.home)

    # -- layout ---------------------------------------------------------------------

    @property
    def conf_dir(self) -> Path:
        return self.work_dir / "conf"

    @property
    def log_dir(self) -> Path:
        return self.work_dir / "log"

    @property
    def pid_dir(self) -> Path:
        return self.work_dir / "pid"

    @property
    def tmp_dir(self) -> Path:
        return self.work_dir / "tmp"

    @property
    def checkpoint_dir(self) -> Path:
        return self.work_dir / "checkpoints"

    @property
    def rest_url(self) -> str:
        return f"http://127.0.0.1:{self.rest_port}"

    @property
    def rest(self) -> FlinkRest:
        return FlinkRest(self.rest_url)

    @property
    def started(self) -> bool:
        """True between :meth:`start` and :meth:`stop`."""
        return self._started

    # -- lifecycle ------------------------------------------------------------------

    def start(self, taskmanagers: int = 1, slots: int = 4) -> FlinkCluster:
        """Write the conf, start the JobManager and ``taskmanagers`` TaskManagers (in
        parallel: each script spends a second or two in its own JVMs before the daemon
        starts), and wait until REST answers and all of them are registered."""
        if self._started:
            raise FlinkClusterError(f"cluster in {self.work_dir} is already started")
        if taskmanagers < 0 or slots < 1:
            raise ValueError(f"need taskmanagers >= 0 and slots >= 1, got {taskmanagers}, {slots}")
        self.slots = slots
        attempt = 1
        while True:
            self.rest_port, self.rpc_port = free_port(), free_port()
            while self.rpc_port == self.rest_port:
                self.rpc_port = free_port()
            self._write_conf()
            self._started = True
            try:
                scripts = [self._launch("jobmanager.sh", "start")]
                ids = [self._next_tm_id() for _ in range(taskmanagers)]
                scripts += [self._launch_tm(tm_id) for tm_id in ids]
                self._finish_launch(scripts)
                self._wait_registered(ids, self.start_timeout)
                return self
            except FlinkClusterError:
                # A port free when chosen can be taken before the JobManager binds
                # it (another process on a busy machine): try again with new ones.
                taken = self._jobmanager_port_taken()
                self.stop(keep_logs=True)
                if not taken or attempt >= PORT_ATTEMPTS:
                    raise
                # Kept, under names the next start neither appends to nor reads.
                for path in self.log_dir.glob("*"):
                    if path.suffix in (".log", ".out"):
                        path.rename(path.with_name(f"{path.name}.attempt{attempt}"))
                attempt += 1
                log.warning(
                    "Flink in %s: a port was taken before the JobManager bound it; "
                    "starting again on new ports (attempt %d of %d)",
                    self.work_dir,
                    attempt,
                    PORT_ATTEMPTS,
                )
            except BaseException:
                self.stop(keep_logs=True)
                raise

    def stop(self, keep_logs: bool = False, timeout: float = 15.0) -> None:
        """Stop every process of this cluster (SIGTERM, then SIGKILL after ``timeout``)
        and remove its directories; ``keep_logs`` leaves ``log_dir``. Idempotent.

        Also what a script was still starting (a shell about to exec a JVM, the
        ``flink run`` client): every process whose environment names this conf dir.
        Stopped while the cluster starts (a stop signal), a second pass catches a
        daemon that appeared meanwhile."""
        for _ in range(3):
            procs = self._launched_processes()
            if not procs:
                break
            # TaskManagers first: a JobManager that goes first makes them log reconnect noise.
            procs.sort(key=lambda p: 0 if _is_tm(p) else 1)
            for p in procs:
                try:
                    p.send_signal(signal.SIGTERM)
                except psutil.NoSuchProcess:
                    pass
            _, alive = psutil.wait_procs(procs, timeout=timeout)
            for p in alive:
                try:
                    p.kill()
                except psutil.NoSuchProcess:
                    pass
            psutil.wait_procs(alive, timeout=5)
            time.sleep(0.5)
        dirs = [self.conf_dir, self.pid_dir, self.tmp_dir, self.checkpoint_dir]
        if not keep_logs:
            dirs.append(self.log_dir)
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)
        self._started = False

    def __enter__(self) -> FlinkCluster:
        if not self._started:
            self.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.stop(keep_logs=exc_type is not None)

    # -- TaskManagers ---------------------------------------------------------------

    def taskmanager_pids(self) -> list[int]:
        """Pids of this cluster's TaskManagerRunner JVMs, oldest first."""
        return list(self.taskmanagers().values())

    def taskmanagers(self) -> dict[str, int]:
        """Resource id (``tm-<n>``, as in ``GET /taskmanagers``) -> pid, oldest first."""
        found = []
        for p in self._own_processes():
            cmd = _cmdline(p)
            if TM_CLASS not in cmd:
                continue
            m = _RESOURCE_ID.search(" ".join(cmd))
            found.append((_create_time(p), m.group(1) if m else f"pid-{p.pid}", p.pid))
        return {rid: pid for _, rid, pid in sorted(found)}

    def jobmanager_pid(self) -> int | None:
        for p in self._own_processes():
            if JM_CLASS in _cmdline(p):
                return p.pid
        return None

    def registered_taskmanagers(self) -> list[dict[str, Any]]:
        """``GET /taskmanagers``: the TaskManagers the JobManager knows (a killed one
        stays listed until its heartbeat times out)."""
        return self.rest.get("/taskmanagers")["taskmanagers"]

    def add_taskmanager(self, timeout: float = 60.0) -> int:
        """Start one more TaskManager, wait until it is registered; its pid."""
        self._require_started()
        tm_id = self._next_tm_id()
        self._finish_launch([self._launch_tm(tm_id)])
        self._wait_registered([tm_id], timeout)
        return self.taskmanagers()[tm_id]

    def kill_taskmanager(self, pid: int) -> None:
        """SIGKILL one of this cluster's TaskManagers (a crash, not a shutdown)."""
        if pid not in self.taskmanager_pids():
            raise ValueError(f"pid {pid} is not a TaskManager of the cluster in {self.work_dir}")
        try:
            proc = psutil.Process(pid)
            proc.kill()
            proc.wait(timeout=10)
        except psutil.NoSuchProcess:
            pass

    def restart_taskmanager(self, pid: int | None = None, timeout: float = 60.0) -> int:
        """Replace a TaskManager: SIGKILL ``pid`` if given (and still alive), then start
        a fresh one (new resource id) and wait until it is registered; its pid."""
        if pid is not None and pid in self.taskmanager_pids():
            self.kill_taskmanager(pid)
        return self.add_taskmanager(timeout)

    # -- jobs -----------------------------------------------------------------------

    def submit(
        self,
        jar: Path,
        main_class: str,
        args: Sequence[str] = (),
        parallelism: int = 2,
        timeout: float = 180.0,
    ) -> str:
        """``flink run -d`` the jar; the job id. The job may still be deploying."""
        self._require_started()
        cmd = [str(self.home / "bin" / "flink"), "run", "-d", "-p", str(parallelism)]
        cmd += ["-c", main_class, str(jar), *map(str, args)]
        try:
            result = subprocess.run(
                cmd, env=self._env(), capture_output=True, text=True, timeout=timeout
            )
        except subprocess.TimeoutExpired as exc:
            raise FlinkClusterError(
                f"flink run did not return within {timeout:.0f}s{self._log_tail()}"
            ) from exc
        m = _JOB_ID.search(result.stdout)
        if result.returncode != 0 or m is None:
            out = (result.stdout + result.stderr).strip()[-4000:]
            raise FlinkClusterError(
                f"flink run {main_class} failed (exit {result.returncode}):\n{out}"
                f"\n(logs in {self.log_dir})"
            )
        return m.group(1)

    def job_state(self, job_id: str) -> str:
        """RUNNING, CANCELED, FAILED, ... as the JobManager reports it."""
        return self.rest.get(f"/jobs/{job_id}")["state"]

    def job_vertices(self, job_id: str) -> list[dict[str, Any]]:
        """The job's vertices from ``GET /jobs/<id>`` (id, name, parallelism, status,
        tasks: subtask counts by state), in topological order."""
        return self.rest.get(f"/jobs/{job_id}")["vertices"]

    def wait_running(self, job_id: str, timeout: float = 60.0) -> list[dict[str, Any]]:
        """Wait until every subtask of every vertex is RUNNING; the vertices.

        A job that ends first raises with Flink's root exception."""
        deadline = time.monotonic() + timeout
        state, vertices = "?", []
        while time.monotonic() < deadline:
            detail = self.rest.get(f"/jobs/{job_id}")
            state, vertices = detail["state"], detail["vertices"]
            if state in TERMINAL_STATES:
                raise FlinkClusterError(
                    f"job {job_id} ended {state} before running: {self._root_exception(job_id)}"
                )
            if (
                state == "RUNNING"
                and vertices
                and all(v["tasks"].get("RUNNING", 0) == v["parallelism"] for v in vertices)
            ):
                return vertices
            check_stop()
            time.sleep(0.25)
        summary = ", ".join(f"{v['name']}: {v['status']}" for v in vertices)
        raise FlinkClusterError(
            f"job {job_id} not fully RUNNING after {timeout:.0f}s (job {state}; {summary})"
            f"{self._log_tail()}"
        )

    def cancel(self, job_id: str, timeout: float = 30.0) -> str:
        """Cancel the job and wait until it reaches a terminal state; that state."""
        if self.job_state(job_id) not in TERMINAL_STATES:
            self.rest.patch(f"/jobs/{job_id}?mode=cancel")
        return self.wait_terminal(job_id, timeout)

    def wait_terminal(self, job_id: str, timeout: float = 30.0) -> str:
        deadline = time.monotonic() + timeout
        while True:
            state = self.job_state(job_id)
            if state in TERMINAL_STATES:
                return state
            if time.monotonic() >= deadline:
                raise FlinkClusterError(f"job {job_id} still {state} after {timeout:.0f}s")
            time.sleep(0.2)

    # -- internals ------------------------------------------------------------------

    def _require_started(self) -> None:
        if not self._started:
            raise FlinkClusterError(f"cluster in {self.work_dir} is not started")

    def _next_tm_id(self) -> str:
        return f"tm-{next(self._tm_ids)}"

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            FLINK_CONF_DIR=str(self.conf_dir),
            FLINK_LOG_DIR=str(self.log_dir),
            FLINK_PID_DIR=str(self.pid_dir),
            FLINK_IDENT_STRING="dsched",
        )
        # An inherited FLINK_HOME or PYFLINK setting would point the scripts elsewhere.
        for key in ("FLINK_HOME", "FLINK_LIB_DIR", "FLINK_OPT_DIR", "FLINK_PLUGINS_DIR"):
            env.pop(key, None)
        return env

    def _conf(self) -> dict[str, str]:
        java_opts = f"{_dist_java_opts(self.home)} -Djava.io.tmpdir={self.tmp_dir}"
        conf = {
            "jobmanager.rpc.address": "127.0.0.1",
            "jobmanager.rpc.port": str(self.rpc_port),
            "jobmanager.bind-host": "127.0.0.1",
            "jobmanager.memory.process.size": self.jobmanager_memory,
            "taskmanager.bind-host": "127.0.0.1",
            "taskmanager.host": "127.0.0.1",
            "taskmanager.rpc.port": "0",
            "taskmanager.data.port": "0",
            "taskmanager.memory.process.size": self.taskmanager_memory,
            "taskmanager.numberOfTaskSlots": str(self.slots),
            "parallelism.default": "1",
            "rest.address": "127.0.0.1",
            "rest.bind-address": "127.0.0.1",
            "rest.port": str(self.rest_port),
            "blob.server.port": "0",
            # One vertex per operator: each operator instance is its own task thread,
            # which is the unit dsched measures and caps.
            "pipeline.operator-chaining.enabled": "false",
            "metrics.latency.interval": "1000",
            # The REST metric store otherwise refreshes only every 10 s.
            "metrics.fetcher.update-interval": "1000",
            # A SIGKILLed TaskManager is declared lost within seconds, not 50 s.
            "heartbeat.interval": "2000",
            "heartbeat.timeout": "10000",
            "restart-strategy.type": "fixed-delay",
            "restart-strategy.fixed-delay.attempts": "1000",
            "restart-strategy.fixed-delay.delay": "2 s",
            "env.java.opts.all": java_opts,
            # The `flink run` client is a short-lived JVM that spends its life planning
            # one query: C1 alone gets it there ~40 % sooner than tiered C2 here.
            "env.java.opts.client": "-XX:TieredStopAtLevel=1",
            "env.pid.dir": str(self.pid_dir),
            "env.log.dir": str(self.log_dir),
            "io.tmp.dirs": str(self.tmp_dir),
            "blob.storage.directory": str(self.tmp_dir / "blob"),
            "web.tmpdir": str(self.tmp_dir / "web"),
            "web.upload.dir": str(self.tmp_dir / "upload"),
            "execution.checkpointing.dir": self.checkpoint_dir.as_uri(),
        }
        if self.checkpoint_interval is not None:
            conf["execution.checkpointing.interval"] = self.checkpoint_interval
        conf.update(self.extra_conf)
        return conf

    def _write_conf(self) -> None:
        for d in (self.conf_dir, self.log_dir, self.pid_dir, self.tmp_dir, self.checkpoint_dir):
            d.mkdir(parents=True, exist_ok=True)
        for src in (self.home / "conf").glob("log4j*.properties"):
            shutil.copy(src, self.conf_dir / src.name)
        # Flat keys, each value a JSON string (valid YAML; Flink parses the text).
        lines = [f"{key}: {_yaml_str(value)}" for key, value in self._conf().items()]
        (self.conf_dir / "config.yaml").write_text("\n".join(lines) + "\n")

    def _launch(self, script: str, *args: str) -> tuple[str, subprocess.Popen]:
        cmd = [str(self.home / "bin" / script), *args]
        proc = subprocess.Popen(
            cmd,
            env=self._env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
        )
        return " ".join([script, *args]), proc

    def _launch_tm(self, tm_id: str) -> tuple[str, subprocess.Popen]:
        # The resource id names the TaskManager in REST and in its command line, so a
        # pid and a registration can be matched.
        return self._launch("taskmanager.sh", "start", "-D", f"taskmanager.resource-id={tm_id}")

    def _finish_launch(self, launched: list[tuple[str, subprocess.Popen]]) -> None:
        for what, proc in launched:
            try:
                out, _ = proc.communicate(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, _ = proc.communicate()
                raise FlinkClusterError(f"{what} did not return within 120s: {out}") from None
            if proc.returncode != 0:
                raise FlinkClusterError(
                    f"{what} failed (exit {proc.returncode}): {out.strip()}{self._log_tail()}"
                )

    def _wait_registered(self, tm_ids: Sequence[str], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last_error = "no answer yet"
        # A daemon is only missing once it stays missing: flink-daemon.sh forks a
        # shell that execs the JVM, and on a loaded machine the process table can
        # show the shell, not yet the JVM's command line, for a while.
        missing_since: float | None = None
        while time.monotonic() < deadline:
            running = self.taskmanagers()
            dead = [t for t in tm_ids if t not in running]
            if self.jobmanager_pid() is None or dead:
                missing_since = missing_since or time.monotonic()
                if time.monotonic() - missing_since > DAEMON_GRACE_SECONDS:
                    what = (
                        "the JobManager"
                        if self.jobmanager_pid() is None
                        else (f"TaskManager {', '.join(dead)}")
                    )
                    raise FlinkClusterError(f"{what} exited during startup{self._log_tail()}")
                check_stop()
                time.sleep(0.25)
                continue
            missing_since = None
            try:
                registered = {tm["id"] for tm in self.registered_taskmanagers()}
            except FlinkRestError as exc:
                last_error = str(exc)
            else:
                if set(tm_ids) <= registered:
                    return
                last_error = f"registered: {sorted(registered)}"
            check_stop()
            time.sleep(0.25)
        raise FlinkClusterError(
            f"Flink cluster in {self.work_dir} not ready after {timeout:.0f}s: waiting for "
            f"TaskManagers {list(tm_ids)} at {self.rest_url} ({last_error}){self._log_tail()}"
        )

    def _root_exception(self, job_id: str) -> str:
        try:
            exc = self.rest.get(f"/jobs/{job_id}/exceptions")
        except FlinkRestError as err:
            return f"(exceptions unavailable: {err})"
        root = (exc.get("exceptionHistory") or {}).get("entries") or []
        text = root[0].get("stacktrace", "") if root else exc.get("root-exception", "")
        return (text or "no exception recorded")[:3000]

    def _jobmanager_port_taken(self) -> bool:
        """Whether the JobManager's log says it could not bind a port (a retried
        start's logs are renamed, so this is the latest start's)."""
        for path in self.log_dir.glob("*standalonesession*.log"):
            if "java.net.BindException" in path.read_text(errors="replace"):
                return True
        return False

    def _log_tail(self, lines: int = 25) -> str:
        """The end of every log in ``log_dir``, for error messages (which keep the logs)."""
        parts = [f"\n(logs kept in {self.log_dir})"]
        for path in sorted(self.log_dir.glob("*")):
            if path.suffix not in (".log", ".out") or not path.is_file():
                continue
            text = path.read_text(errors="replace").splitlines()[-lines:]
            if text:
                parts.append(f"--- {path.name} (last {len(text)} lines)\n" + "\n".join(text))
        return "\n".join(parts)

    def processes(self) -> list[psutil.Process]:
        """Every live process of this cluster: daemons and any ``flink`` CLI running."""
        return self._own_processes()

    def _launched_processes(self) -> list[psutil.Process]:
        """:meth:`_own_processes` and every process started with this cluster's
        environment (``FLINK_CONF_DIR``), whatever it runs now."""
        conf = str(self.conf_dir)
        own = {p.pid: p for p in self._own_processes()}
        me = os.getpid()
        for p in psutil.process_iter():
            if p.pid in own or p.pid == me:
                continue
            try:
                if p.environ().get("FLINK_CONF_DIR") == conf:
                    own[p.pid] = p
            except (psutil.Error, OSError):
                pass
        return list(own.values())

    def _own_processes(self) -> list[psutil.Process]:
        conf = str(self.conf_dir)
        own = []
        for p in psutil.process_iter():
            cmd = _cmdline(p)
            if any(a == conf or f"{conf}/" in a for a in cmd):
                own.append(p)
        return own


def _is_tm(p: psutil.Process) -> bool:
    return TM_CLASS in _cmdline(p)


def _cmdline(p: psutil.Process) -> list[str]:
    try:
        return p.cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return []


def _create_time(p: psutil.Process) -> float:
    try:
        return p.create_time()
    except psutil.Error:
        return 0.0


def _yaml_str(value: str) -> str:
    # JSON's string escaping is a subset of YAML's double-quoted style.
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _dist_java_opts(home: Path) -> str:
    """env.java.opts.all of the distribution's own config.yaml (nested YAML, no parser
    needed: the value is one line of --add-exports/--add-opens flags)."""
    try:
        text = (home / "conf" / "config.yaml").read_text()
    except OSError:
        return _FALLBACK_JAVA_OPTS
    m = re.search(r"^\s*(?:env\.java\.opts\.)?all:\s*(--add-\S.*?)\s*$", text, re.M)
    return m.group(1) if m else _FALLBACK_JAVA_OPTS
