"""The node side of engines (agent/engines), without a Flink cluster.

Real parts: thread names from a real Flink 2.3.0 TaskManager (``jcmd`` output and
the JobManager's REST answers captured from a running job, tests/data/), a real
JVM whose threads carry subtask names (tests/data/FakeTaskManager.java) read with
the real ``jcmd``, a JobManager REST API served over loopback HTTP from the
captured answers, and real cgroup v1 caps (root). tests/test_flink_agent.py does
the same against a real Flink cluster.
"""

from __future__ import annotations

import copy
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import psutil
import pytest

from agent.config import AgentConfig, EngineConfig
from agent.engines import NODE_ENGINES, make_engines
from agent.engines.discovery import EngineDiscovery
from agent.engines.flink import FlinkNodeEngine, group_threads
from agent.jvm import jcmd_threads, parse_jcmd_threads
from agent.node import NodeAgent
from dsched.config import ConfigError, load_config
from dsched.engines import ENGINE_KINDS
from dsched.engines.flink import FlinkJob, FlinkRest, parse_thread_name
from dsched.ids import InstanceKey
from dsched.registry import UnknownPlugin
from dsched_pb import dsched_pb2 as pb
from tests.test_agent_support import WorkerThread, free_port, release_tree, unique_root, wait_for

DATA = Path(__file__).resolve().parent / "data"
CAPTURE = DATA / "flink-2.3.0-taskmanager-jcmd.txt"
REST_CAPTURE = DATA / "flink-2.3.0-rest-wc1"
CAPTURE_PID = 13061  # the TaskManager's pid when the capture was taken (its first line)
CAPTURE_JID = "aece065501eb6d0427f589e30a20e144"
JAVA = shutil.which("java")
JAVAC = shutil.which("javac")
JCMD = shutil.which("jcmd")
_tokens = itertools.count()


# ---------------------------------------------------------------- the captured cluster


def _captured(name: str) -> dict:
    return json.loads((REST_CAPTURE / name).read_text())


def captured_job(
    name: str = "wc1", jid: str = CAPTURE_JID, state: str = "RUNNING"
) -> tuple[dict, dict]:
    """(GET /jobs/<jid>, GET /jobs/<jid>/plan) as captured, renamed."""
    detail, plan = _captured("job.json"), _captured("plan.json")
    detail.update(jid=jid, name=name, state=state)
    plan["plan"].update(jid=jid, name=name)
    return detail, plan


def small_job(
    jid: str, name: str, vertices: list[tuple[str, str, int, list[str]]]
) -> tuple[dict, dict]:
    """A job's REST answers in the captured shape: vertices as (id, name, parallelism, inputs)."""
    detail, plan = captured_job(name, jid)
    template = detail["vertices"][0]
    detail["vertices"] = [
        {**copy.deepcopy(template), "id": vid, "name": vname, "parallelism": p}
        for vid, vname, p, _inputs in vertices
    ]
    plan["plan"]["nodes"] = [
        {"id": vid, "parallelism": p, "inputs": [{"id": i, "num": 0} for i in inputs]}
        for vid, _n, p, inputs in vertices
    ]
    return detail, plan


def parse_job(detail: dict, plan: dict) -> FlinkJob:
    """FlinkRest.job's own parsing, over answers given here instead of fetched."""
    rest = FlinkRest("http://127.0.0.1:9")
    answers = {f"/jobs/{detail['jid']}": detail, f"/jobs/{detail['jid']}/plan": plan}
    rest.get = lambda path, params=None: answers[path]  # type: ignore[method-assign]
    return rest.job(detail["jid"])


class FakeJobManager:
    """The JobManager REST calls the agent makes, over real loopback HTTP; counts requests."""

    def __init__(self) -> None:
        self.jobs: dict[str, tuple[dict, dict]] = {}
        self.requests: list[str] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                owner.requests.append(self.path)
                body = owner.answer(self.path)
                data = json.dumps(body if body is not None else {"errors": ["Not found."]})
                self.send_response(200 if body is not None else 404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data.encode())

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def add(self, detail: dict, plan: dict) -> str:
        self.jobs[detail["jid"]] = (detail, plan)
        return detail["jid"]

    def set_state(self, jid: str, state: str) -> None:
        self.jobs[jid][0]["state"] = state

    def overview_reads(self) -> int:
        return self.requests.count("/jobs/overview")

    def answer(self, path: str) -> object:
        if path == "/jobs/overview":
            template = _captured("jobs_overview.json")["jobs"][0]
            return {
                "jobs": [
                    {**template, "jid": jid, "name": d["name"], "state": d["state"]}
                    for jid, (d, _p) in self.jobs.items()
                ]
            }
        for jid, (detail, plan) in self.jobs.items():
            if path == f"/jobs/{jid}":
                return detail
            if path == f"/jobs/{jid}/plan":
                return plan
        return None

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# ---------------------------------------------------------------- a JVM with subtask threads


class FakeTaskManager:
    """A real JVM (tests/data/FakeTaskManager.java) whose thread names the test chooses."""

    def __init__(self, classes: Path, group: str):
        self.proc = subprocess.Popen(
            [
                JAVA,
                "-Xmx64m",
                "-XX:TieredStopAtLevel=1",
                "-cp",
                str(classes),
                "FakeTaskManager",
                group,
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.pid = self.proc.pid

    def command(self, op: str, name: str = "") -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"{op} {name}\n")
        self.proc.stdin.flush()
        assert self.proc.stdout.readline().strip() == "ok"

    def start(self, *names: str) -> None:
        for name in names:
            self.command("start", name)

    def stop(self, *names: str) -> None:
        for name in names:
            self.command("stop", name)

    def threads(self) -> dict[int, str]:
        return jcmd_threads(self.pid)

    def tids(self, *names: str) -> set[int]:
        return {tid for tid, name in self.threads().items() if name in names}

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)


@pytest.fixture(scope="module")
def fake_tm_classes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if JAVA is None or JAVAC is None or JCMD is None:
        pytest.skip("needs java, javac and jcmd (a JDK 17)")
    out = tmp_path_factory.mktemp("faketm")
    subprocess.run(
        [JAVAC, "-d", str(out), str(DATA / "FakeTaskManager.java")], check=True, capture_output=True
    )
    return out


@pytest.fixture
def cluster(
    fake_tm_classes: Path,
) -> Iterator[tuple[FakeJobManager, Callable[[], FakeTaskManager], str]]:
    """(the fake JobManager with wc1, a factory of fake TaskManagers, their cmdline regex)."""
    group = f"dsched-test-{os.getpid()}-{next(_tokens)}"
    jm = FakeJobManager()
    jm.add(*captured_job())
    tms: list[FakeTaskManager] = []

    def new_tm() -> FakeTaskManager:
        tm = FakeTaskManager(fake_tm_classes, group)
        tms.append(tm)
        return tm

    yield jm, new_tm, f"FakeTaskManager {group}$"
    for tm in tms:
        tm.kill()
    jm.close()


def engine_config(jm: FakeJobManager, cmdline: str, **options) -> EngineConfig:
    config = EngineConfig(kind="flink", rest_url=jm.url, taskmanager_cmdline=cmdline, **options)
    config.validate()
    return config


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def dry_agent() -> Iterator[NodeAgent]:
    agent = NodeAgent(AgentConfig(dry_run=True, slot_seconds=1.0))
    yield agent
    agent.close()


@pytest.fixture
def v1_agent(cgroup_v1_cpu: Path) -> Iterator[NodeAgent]:
    root = unique_root()
    agent = NodeAgent(
        AgentConfig(cgroup_mode="v1", cgroup_mount=str(cgroup_v1_cpu), cgroup_root=root)
    )
    yield agent
    agent.close()
    release_tree(cgroup_v1_cpu, root)
    assert not (cgroup_v1_cpu / root).exists(), "test left its cgroup root behind"


def directive(epoch: int, key: InstanceKey, cap: float) -> pb.CapDirective:
    return pb.CapDirective(
        epoch=epoch,
        caps=[
            pb.InstanceCap(
                key=pb.InstanceKey(app=key.app, operator=key.operator, instance=key.instance),
                cap_cores=cap,
            )
        ],
    )


def metric(agent: NodeAgent, name: str, engine: str = "flink") -> float:
    return agent.metrics.registry.get_sample_value(name, {"engine": engine}) or 0.0


def cgroup_tasks(path: Path) -> set[int]:
    return {int(t) for t in (path / "tasks").read_text().split()}


CALC0 = InstanceKey("wc1", "Calc_2", 0)
CALC1 = InstanceKey("wc1", "Calc_2", 1)
AGG0 = InstanceKey("wc1", "GroupAggregate_4", 0)


# ---------------------------------------------------------------- grouping real thread names


def _capture_threads(extra: str = "") -> dict[int, dict[int, str]]:
    return {CAPTURE_PID: parse_jcmd_threads(CAPTURE.read_text() + extra)}


def _line(name: str, tid: int) -> str:
    return f'"{name}" #9999 daemon prio=5 os_prio=0 cpu=0.01ms elapsed=1.00s tid=0x0 nid=0x{tid:x} waiting\n'


def test_real_taskmanager_threads_group_into_every_subtask_with_its_helpers():
    job = parse_job(*captured_job())
    threads = _capture_threads()
    grouping = group_threads(threads, [job])
    # 7 vertices x parallelism 2, all in the one TaskManager (several slots of it).
    assert len(grouping.instances) == 14
    assert (grouping.unowned_threads, grouping.ambiguous_threads) == (0, 0)
    by_key = {i.key: i for i in grouping.instances}
    # Independently of the parser: a subtask's threads are those whose names end with
    # '<vertex> (<i>/2)#0' right after a word boundary.
    for vertex in job.vertices:
        for index in range(2):
            suffix = f"{vertex.name} ({index + 1}/2)#0"
            expected = {
                tid
                for tid, name in threads[CAPTURE_PID].items()
                if name == suffix or (name.endswith(suffix) and name[-len(suffix) - 1] in " -")
            }
            inst = by_key[InstanceKey("wc1", vertex.operator, index)]
            assert inst.tids == expected, vertex.name
            task_thread = next(t for t, n in threads[CAPTURE_PID].items() if n == suffix)
            assert task_thread in inst.tids
            assert (inst.pid, inst.worker) == (CAPTURE_PID, f"tm-{CAPTURE_PID}")
    calc0 = by_key[CALC0]
    assert {threads[CAPTURE_PID][t] for t in calc0.tids} == {
        "Calc[2] (1/2)#0",
        "OutputFlusher for Calc[2] (1/2)#0",
        "System Time Trigger for Calc[2] (1/2)#0",
    }
    assert calc0.upstream == ("Source:_src_1",) and not calc0.stateful
    assert by_key[AGG0].stateful and by_key[AGG0].upstream == ("Calc_2",)
    # The TaskManager's own threads are never part of an instance.
    captured = set().union(*(i.tids for i in grouping.instances))
    own = {t for t, n in threads[CAPTURE_PID].items() if parse_thread_name(n) is None}
    assert own and not (own & captured)
    assert {threads[CAPTURE_PID][t] for t in own} >= {
        "main",
        "flink-pekko.actor.default-dispatcher-5",
    }


def test_names_no_running_job_owns_are_ignored_and_counted():
    job = parse_job(*captured_job())
    extra = _line("Mystery[9] (1/2)#0", 0x9001) + _line("Calc[2] (1/3)#0", 0x9002)
    extra += _line("OutputFlusher for MyCalc[2] (1/2)#0", 0x9003)
    grouping = group_threads(_capture_threads(extra), [job])
    assert grouping.unowned_threads == 3 and grouping.ambiguous_threads == 0
    assert len(grouping.instances) == 14
    assert not {0x9001, 0x9002, 0x9003} & set().union(*(i.tids for i in grouping.instances))
    assert grouping.unresolved == {
        ("Mystery[9]", 2),
        ("Calc[2]", 3),
        ("OutputFlusher for MyCalc[2]", 2),
    }


def test_names_that_fit_two_running_jobs_are_ambiguous_and_left_alone():
    wc1 = parse_job(*captured_job())
    twin = parse_job(*captured_job("wc2", "f" * 32))
    threads = _capture_threads()
    grouping = group_threads(threads, [wc1, twin])
    subtask_threads = sum(1 for n in threads[CAPTURE_PID].values() if parse_thread_name(n))
    assert grouping.instances == ()
    assert grouping.ambiguous_threads == subtask_threads > 28
    # Parallelism tells them apart when it differs, and a vertex only one job has is its own.
    other = small_job("e" * 32, "other", [("v1", "Other[1]", 1, []), ("v2", "Calc[2]", 3, ["v1"])])
    grouping = group_threads(
        _capture_threads(_line("Other[1] (1/1)#0", 0x9100)), [wc1, parse_job(*other)]
    )
    assert grouping.ambiguous_threads == 0 and len(grouping.instances) == 15
    assert InstanceKey("other", "Other_1", 0) in {i.key for i in grouping.instances}


def test_jobs_whose_names_collide_once_made_safe_are_ambiguous():
    one = parse_job(*small_job("a" * 32, "my job", [("v", "Calc[2]", 2, [])]))
    two = parse_job(*small_job("b" * 32, "my/job", [("w", "Calc[2]", 3, [])]))
    threads = {1: {10: "Calc[2] (1/2)#0", 11: "Calc[2] (1/3)#0"}}
    grouping = group_threads(threads, [one, two])
    assert grouping.instances == () and grouping.ambiguous_threads == 2


def test_only_the_highest_attempt_of_a_subtask_counts():
    job = parse_job(*captured_job())
    extra = _line("Calc[2] (1/2)#1", 0x9201) + _line("OutputFlusher for Calc[2] (1/2)#1", 0x9202)
    grouping = group_threads(_capture_threads(extra), [job])
    by_key = {i.key: i for i in grouping.instances}
    assert by_key[CALC0].tids == {0x9201, 0x9202}
    assert len(by_key[CALC1].tids) == 3  # its attempt #0 is the newest it has
    # Across processes too: the newest attempt on the node wins; a tie is ambiguous.
    threads = {
        1: {10: "Calc[2] (1/2)#0"},
        2: {20: "Calc[2] (1/2)#1", 21: "Calc[2] (2/2)#0"},
        3: {30: "Calc[2] (2/2)#0"},
    }
    grouping = group_threads(threads, [job])
    assert [(i.key, i.pid, i.tids) for i in grouping.instances] == [(CALC0, 2, frozenset({20}))]
    assert grouping.ambiguous_threads == 2


# ---------------------------------------------------------------- a real JVM, real jcmd


def test_every_known_kind_has_a_node_engine():
    assert NODE_ENGINES.names() == sorted(ENGINE_KINDS)


def test_engine_maps_the_threads_jcmd_lists_and_nothing_else(cluster, dry_agent):
    jm, new_tm, cmdline = cluster
    tm = new_tm()
    names = [
        "Calc[2] (1/2)#0",
        "OutputFlusher for Calc[2] (1/2)#0",
        "Calc[2] (2/2)#0",
        "Source Data Fetcher for Source: src[1] (1/2)#0",
        "Source: src[1] (1/2)#0",
        "flink-pekko.actor.default-dispatcher-5",
        "Mystery[9] (1/2)#0",
    ]
    tm.start(*names)
    discovery = EngineDiscovery(dry_agent, make_engines([engine_config(jm, cmdline)]))
    (applied,) = discovery.scan()
    assert applied.registered == 3
    jcmd = tm.threads()
    tid_of = {name: tid for tid, name in jcmd.items()}
    records = {r.key: r for r in dry_agent.registry.snapshot()}
    assert records[CALC0].tids == {
        tid_of["Calc[2] (1/2)#0"],
        tid_of["OutputFlusher for Calc[2] (1/2)#0"],
    }
    assert records[CALC1].tids == {tid_of["Calc[2] (2/2)#0"]}
    src = records[InstanceKey("wc1", "Source:_src_1", 0)]
    assert src.tids == {
        tid_of["Source: src[1] (1/2)#0"],
        tid_of["Source Data Fetcher for Source: src[1] (1/2)#0"],
    }
    for rec in records.values():
        assert (rec.pid, rec.worker, rec.source, rec.engine) == (
            tm.pid,
            f"tm-{tm.pid}",
            "engine",
            "flink",
        )
    assert dry_agent.registry.thread_count() == 5
    assert metric(dry_agent, "dsched_agent_engine_unowned_threads_total") == 1
    assert metric(dry_agent, "dsched_agent_engine_instances") == 3
    assert metric(dry_agent, "dsched_agent_engine_instances_found_total") == 3
    assert metric(dry_agent, "dsched_agent_engine_unavailable") == 0
    # Reports say which engine an instance belongs to; registered ones say none.
    mine = WorkerThread()
    try:
        dry_agent.register("testbed", "count", 0, "w1", False, os.getpid(), mine.tid)
        dry_agent.sample()
        engines = {
            (s.key.app, s.key.operator, s.key.instance): s.engine
            for s in dry_agent.report().instances
        }
    finally:
        mine.join()
    assert engines[("wc1", "Calc_2", 0)] == "flink" and engines[("testbed", "count", 0)] == ""


def test_the_directory_is_read_only_when_a_thread_does_not_resolve_or_it_is_stale(
    cluster, dry_agent
):
    jm, new_tm, cmdline = cluster
    tm = new_tm()
    tm.start("Calc[2] (1/2)#0")
    clock = Clock()
    engine = FlinkNodeEngine(engine_config(jm, cmdline, directory_refresh_seconds=30), clock=clock)
    discovery = EngineDiscovery(dry_agent, [engine])
    for _ in range(3):
        discovery.scan()
        clock.now += 5
    assert jm.overview_reads() == 1
    # A name the cached directory cannot place: read again once, not at every scan.
    tm.start("Mystery[9] (1/2)#0")
    for _ in range(3):
        discovery.scan()
    assert jm.overview_reads() == 2
    # A new job's threads: read again, and its subtasks are found at once.
    jm.add(*small_job("c" * 32, "late", [("x", "Late[1]", 1, [])]))
    tm.start("Late[1] (1/1)#0")
    discovery.scan()
    assert jm.overview_reads() == 3
    assert dry_agent.registry.get(InstanceKey("late", "Late_1", 0)) is not None
    clock.now += 31
    discovery.scan()
    discovery.scan()
    assert jm.overview_reads() == 4
    assert metric(dry_agent, "dsched_agent_engine_directory_refreshes_total") == 4
    assert len(dry_agent.registry) == 2


def test_jcmd_absent_keeps_everything_and_says_why(cluster, dry_agent, monkeypatch, tmp_path):
    jm, new_tm, cmdline = cluster
    tm = new_tm()
    tm.start("Calc[2] (1/2)#0")
    discovery = EngineDiscovery(dry_agent, make_engines([engine_config(jm, cmdline)]))
    discovery.scan()
    assert len(dry_agent.registry) == 1
    monkeypatch.setenv("PATH", str(tmp_path))  # no jcmd there
    tm.stop("Calc[2] (1/2)#0")
    (applied,) = discovery.scan()
    assert applied.unavailable is not None and "jcmd not found" in applied.unavailable
    assert len(dry_agent.registry) == 1  # kept as it was, not taken for gone
    assert metric(dry_agent, "dsched_agent_engine_unavailable") == 1
    monkeypatch.undo()
    (applied,) = discovery.scan()
    assert applied.unavailable is None and applied.unregistered == 1
    assert metric(dry_agent, "dsched_agent_engine_unavailable") == 0


def test_jcmd_absent_at_the_first_scan_registers_nothing(cluster, dry_agent, monkeypatch, tmp_path):
    jm, new_tm, cmdline = cluster
    new_tm().start("Calc[2] (1/2)#0")
    monkeypatch.setenv("PATH", str(tmp_path))
    discovery = EngineDiscovery(dry_agent, make_engines([engine_config(jm, cmdline)]))
    (applied,) = discovery.scan()
    assert "jcmd not found on PATH" in applied.unavailable
    assert len(dry_agent.registry) == 0 and jm.requests == []


def test_jcmd_failing_makes_the_scan_unavailable(cluster, dry_agent, monkeypatch, tmp_path):
    jm, new_tm, cmdline = cluster
    new_tm().start("Calc[2] (1/2)#0")
    shim = tmp_path / "jcmd"
    shim.write_text(
        "#!/bin/sh\necho 'com.sun.tools.attach.AttachNotSupportedException: nope'\nexit 1\n"
    )
    shim.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    discovery = EngineDiscovery(dry_agent, make_engines([engine_config(jm, cmdline)]))
    (applied,) = discovery.scan()
    assert (
        "exited 1" in applied.unavailable and "AttachNotSupportedException" in applied.unavailable
    )
    assert len(dry_agent.registry) == 0


def test_a_process_that_is_not_a_jvm_is_never_attached_to():
    # jcmd attaches with SIGQUIT, which kills a process that is not a JVM.
    token = f"dsched-not-a-jvm-{os.getpid()}-{next(_tokens)}"
    proc = subprocess.Popen(["/bin/sh", "-c", f"sleep 60; : {token}"])
    try:
        config = EngineConfig(
            kind="flink", rest_url=f"http://127.0.0.1:{free_port()}", taskmanager_cmdline=token
        )
        engine = FlinkNodeEngine(config)
        assert wait_for(lambda: token in " ".join(psutil.Process(proc.pid).cmdline()))
        assert engine.taskmanagers() == []
        mapping = engine.map_threads()
        assert mapping.unavailable is None and mapping.instances == ()
        assert proc.poll() is None, "the process was signalled"
    finally:
        proc.kill()
        proc.wait(10)


def test_rest_unreachable_without_a_cached_directory_is_unavailable(cluster, dry_agent):
    _jm, new_tm, cmdline = cluster
    new_tm().start("Calc[2] (1/2)#0")
    closed = f"http://127.0.0.1:{free_port()}"
    config = EngineConfig(kind="flink", rest_url=closed, taskmanager_cmdline=cmdline)
    discovery = EngineDiscovery(dry_agent, make_engines([config]))
    (applied,) = discovery.scan()
    assert applied.unavailable.startswith(f"JobManager REST at {closed} unreachable")
    assert len(dry_agent.registry) == 0


def test_rest_unreachable_with_a_cached_directory_maps_from_the_cache(cluster, dry_agent):
    jm, new_tm, cmdline = cluster
    tm = new_tm()
    tm.start("Calc[2] (1/2)#0")
    clock = Clock()
    engine = FlinkNodeEngine(engine_config(jm, cmdline, directory_refresh_seconds=30), clock=clock)
    discovery = EngineDiscovery(dry_agent, [engine])
    discovery.scan()
    jm.close()  # the JobManager is gone
    clock.now += 60  # and the directory is stale
    tm.start("Calc[2] (2/2)#0")
    (applied,) = discovery.scan()
    assert applied.unavailable is None and applied.registered == 1
    assert {r.key for r in dry_agent.registry.snapshot()} == {CALC0, CALC1}
    # The failed read is not retried at every scan.
    reads = engine.directory_refreshes
    discovery.scan()
    assert engine.directory_refreshes == reads


# ---------------------------------------------------------------- reconciliation on real cgroups


@pytest.mark.cgroups
def test_new_helper_threads_join_the_capped_cgroup_and_exited_ones_leave(cluster, v1_agent):
    jm, new_tm, cmdline = cluster
    tm = new_tm()
    tm.start("Calc[2] (1/2)#0", "OutputFlusher for Calc[2] (1/2)#0", "Calc[2] (2/2)#0")
    discovery = EngineDiscovery(v1_agent, make_engines([engine_config(jm, cmdline)]))
    discovery.scan()
    ack = v1_agent.handle_directive(directive(1, CALC0, 0.3))
    assert ack.applied == 1
    path = v1_agent.cgroups[CALC0]
    assert path == v1_agent.backend.root.resolve() / "wc1" / f"tm-{tm.pid}" / "Calc_2-0"
    assert int((path / "cpu.cfs_quota_us").read_text()) == 30_000
    assert cgroup_tasks(path) == tm.tids("Calc[2] (1/2)#0", "OutputFlusher for Calc[2] (1/2)#0")

    tm.start("Source Data Fetcher for Calc[2] (1/2)#0")
    (applied,) = discovery.scan()
    assert applied.updated == 1
    everything = tm.tids(
        "Calc[2] (1/2)#0",
        "OutputFlusher for Calc[2] (1/2)#0",
        "Source Data Fetcher for Calc[2] (1/2)#0",
    )
    assert v1_agent.registry.get(CALC0).tids == everything
    assert cgroup_tasks(path) == everything  # at once, with the cap in force
    assert int((path / "cpu.cfs_quota_us").read_text()) == 30_000

    tm.stop("Source Data Fetcher for Calc[2] (1/2)#0")
    discovery.scan()
    assert v1_agent.registry.get(CALC0).tids == tm.tids(
        "Calc[2] (1/2)#0", "OutputFlusher for Calc[2] (1/2)#0"
    )
    # Calc[2] (2/2) was never capped: it has no cgroup, and no thread of the JVM is in one.
    assert CALC1 not in v1_agent.cgroups
    all_tasks = set().union(*(cgroup_tasks(p) for p in v1_agent.backend.root.rglob("Calc_2-*")))
    assert all_tasks == tm.tids("Calc[2] (1/2)#0", "OutputFlusher for Calc[2] (1/2)#0")

    # The subtask's threads all end (it finished, or moved away): unregistered, cgroup gone.
    tm.stop("Calc[2] (1/2)#0", "OutputFlusher for Calc[2] (1/2)#0")
    (applied,) = discovery.scan()
    assert applied.unregistered == 1
    assert v1_agent.registry.get(CALC0) is None and not path.exists()


@pytest.mark.cgroups
def test_a_new_taskmanager_process_gets_the_instance_and_its_cap(cluster, v1_agent):
    jm, new_tm, cmdline = cluster
    old = new_tm()
    old.start("Calc[2] (1/2)#0", "OutputFlusher for Calc[2] (1/2)#0", "GroupAggregate[4] (1/2)#0")
    discovery = EngineDiscovery(v1_agent, make_engines([engine_config(jm, cmdline)]))
    discovery.scan()
    v1_agent.handle_directive(directive(1, CALC0, 0.25))
    v1_agent.handle_directive(directive(2, AGG0, 0.5))
    old_calc, old_agg = v1_agent.cgroups[CALC0], v1_agent.cgroups[AGG0]

    # Failover while the old process still runs the old attempt: the newest attempt wins.
    new = new_tm()
    new.start("Calc[2] (1/2)#1", "OutputFlusher for Calc[2] (1/2)#1")
    (applied,) = discovery.scan()
    assert applied.moved == 1 and applied.capped == 1
    rec = v1_agent.registry.get(CALC0)
    assert (rec.pid, rec.worker) == (new.pid, f"tm-{new.pid}")
    path = v1_agent.cgroups[CALC0]
    assert path.parent.name == f"tm-{new.pid}"
    assert int((path / "cpu.cfs_quota_us").read_text()) == 25_000
    assert cgroup_tasks(path) == new.tids("Calc[2] (1/2)#1", "OutputFlusher for Calc[2] (1/2)#1")
    # The old attempt's threads, still running, went back to their own cgroup, and the
    # old cgroup with its cap is gone.
    assert not old_calc.exists()

    # The old TaskManager dies; the sampler sees the aggregate's threads gone (its cap is
    # held), then the new process starts that subtask too and gets the cap back.
    old.kill()
    v1_agent.sample()
    assert v1_agent.registry.get(AGG0) is None
    assert not old_calc.exists() and not old_agg.exists()
    new.start("GroupAggregate[4] (1/2)#1")
    (applied,) = discovery.scan()
    assert applied.registered == 1 and applied.capped == 1
    path = v1_agent.cgroups[AGG0]
    assert int((path / "cpu.cfs_quota_us").read_text()) == 50_000
    assert cgroup_tasks(path) == new.tids("GroupAggregate[4] (1/2)#1")
    assert not (v1_agent.backend.root / "wc1" / f"tm-{old.pid}").exists()


@pytest.mark.cgroups
def test_a_job_that_restarts_while_caps_are_written_ends_capped(cluster, v1_agent):
    """Directives keep arriving while the subtask's attempt #0 threads end and #1's
    start, and discovery scans meanwhile: no directive fails the agent, each is
    applied or refused with a reason, and the new attempt ends under the last cap."""
    jm, new_tm, cmdline = cluster
    tm = new_tm()
    tm.start("Calc[2] (1/2)#0", "OutputFlusher for Calc[2] (1/2)#0")
    discovery = EngineDiscovery(v1_agent, make_engines([engine_config(jm, cmdline)]))
    discovery.scan()
    assert v1_agent.handle_directive(directive(1, CALC0, 0.3)).applied == 1

    acks: list[pb.Ack] = []
    errors: list[BaseException] = []
    done = threading.Event()

    def write_caps() -> None:
        epoch = 2
        try:
            while not done.is_set():
                acks.append(
                    v1_agent.handle_directive(directive(epoch, CALC0, 0.2 + 0.01 * (epoch % 5)))
                )
                epoch += 1
                # Hundreds per restart still race it; a loop without a pause would
                # starve jcmd (the scans) of the CPU and the test of its time.
                time.sleep(0.002)
        except BaseException as exc:  # the test fails on any
            errors.append(exc)

    writer = threading.Thread(target=write_caps)
    writer.start()
    try:
        for _ in range(5):  # the restart, mid-stream of directives
            tm.stop("Calc[2] (1/2)#0", "OutputFlusher for Calc[2] (1/2)#0")
            v1_agent.sample()
            discovery.scan()
            tm.start("Calc[2] (1/2)#0", "OutputFlusher for Calc[2] (1/2)#0")
            discovery.scan()
    finally:
        done.set()
        writer.join(10)
    assert not errors, errors
    assert acks
    for ack in acks:
        assert ack.applied == 1 or all(r.reason for r in ack.rejected)
    last = max((a for a in acks if a.applied == 1), key=lambda a: a.epoch)
    expected_cap = 0.2 + 0.01 * (last.epoch % 5)
    discovery.scan()  # settles: the threads running now are the instance's
    rec = v1_agent.registry.get(CALC0)
    path = v1_agent.cgroups[CALC0]
    assert rec.tids == tm.tids("Calc[2] (1/2)#0", "OutputFlusher for Calc[2] (1/2)#0")
    assert cgroup_tasks(path) == rec.tids
    quota = int((path / "cpu.cfs_quota_us").read_text())
    period = int((path / "cpu.cfs_period_us").read_text())
    assert quota / period == pytest.approx(expected_cap, abs=1e-3)


@pytest.mark.cgroups
def test_a_cancelled_job_loses_every_cgroup_and_held_cap(cluster, v1_agent):
    jm, new_tm, cmdline = cluster
    tm = new_tm()
    names = ["Calc[2] (1/2)#0", "Calc[2] (2/2)#0", "GroupAggregate[4] (1/2)#0"]
    tm.start(*names)
    clock = Clock()
    engine = FlinkNodeEngine(engine_config(jm, cmdline), clock=clock)
    discovery = EngineDiscovery(v1_agent, [engine])
    discovery.scan()
    for epoch, key in enumerate((CALC0, CALC1, AGG0), start=1):
        assert v1_agent.handle_directive(directive(epoch, key, 0.2)).applied == 1
    instance_dirs = [p for p in (v1_agent.backend.root / "wc1").glob("tm-*/*") if p.is_dir()]
    assert len(instance_dirs) == 3

    jm.set_state(CAPTURE_JID, "CANCELED")
    tm.stop(*names)
    (applied,) = discovery.scan()
    assert applied.unregistered == 3
    assert len(v1_agent.registry) == 0
    assert not (v1_agent.backend.root / "wc1").exists()
    # Until the directory says the job ended, its caps are held for a restart...
    assert set(discovery.states[0].held) == {CALC0, CALC1, AGG0}
    clock.now += 31
    discovery.scan()
    # ...then forgotten: the same names later are a new job, capped by the controller anew.
    assert discovery.states[0].held == {}
    jm.set_state(CAPTURE_JID, "RUNNING")
    tm.start("Calc[2] (1/2)#0")
    discovery.scan()
    assert v1_agent.registry.get(CALC0) is not None and CALC0 not in v1_agent.caps


@pytest.mark.cgroups
def test_a_restarted_agent_takes_its_adopted_cgroups_back(cluster, cgroup_v1_cpu):
    jm, new_tm, cmdline = cluster
    tm = new_tm()
    tm.start("Calc[2] (1/2)#0", "OutputFlusher for Calc[2] (1/2)#0")
    root = unique_root()
    config = AgentConfig(cgroup_mode="v1", cgroup_mount=str(cgroup_v1_cpu), cgroup_root=root)
    first = NodeAgent(config)
    try:
        EngineDiscovery(first, make_engines([engine_config(jm, cmdline)])).scan()
        first.handle_directive(directive(1, CALC0, 0.4))
        first.close()
        second = NodeAgent(config)  # the agent restarts; caps stay in the tree
        try:
            assert second.registry.get(CALC0).source == "adopted"
            (applied,) = EngineDiscovery(second, make_engines([engine_config(jm, cmdline)])).scan()
            assert (applied.registered, applied.moved) == (1, 0)
            rec = second.registry.get(CALC0)
            assert (rec.source, rec.engine, rec.worker) == ("engine", "flink", f"tm-{tm.pid}")
            assert second.caps[CALC0] == pytest.approx(0.4)
            assert cgroup_tasks(second.cgroups[CALC0]) == rec.tids
        finally:
            second.close()
    finally:
        release_tree(cgroup_v1_cpu, root)


def test_an_instance_registered_over_the_socket_is_not_taken(cluster, dry_agent):
    jm, new_tm, cmdline = cluster
    new_tm().start("Calc[2] (1/2)#0")
    mine = WorkerThread()
    try:
        dry_agent.register("wc1", "Calc_2", 0, "w1", False, os.getpid(), mine.tid)
        (applied,) = EngineDiscovery(dry_agent, make_engines([engine_config(jm, cmdline)])).scan()
        assert applied.registered == 0
        rec = dry_agent.registry.get(CALC0)
        assert (rec.source, rec.tids) == ("registration", {mine.tid})
    finally:
        mine.join()


def test_discovery_runs_on_its_own_thread(cluster, dry_agent):
    jm, new_tm, cmdline = cluster
    tm = new_tm()
    tm.start("Calc[2] (1/2)#0")
    discovery = EngineDiscovery(
        dry_agent, make_engines([engine_config(jm, cmdline, scan_seconds=0.2)])
    )
    discovery.start()
    try:
        assert wait_for(lambda: dry_agent.registry.get(CALC0) is not None, timeout=20)
        tm.start("Calc[2] (2/2)#0")
        assert wait_for(lambda: dry_agent.registry.get(CALC1) is not None, timeout=20)
    finally:
        discovery.stop()
    assert discovery.period(discovery.states[0].engine) == 0.2
    default = make_engines([engine_config(jm, cmdline)])[0]
    assert discovery.period(default) == dry_agent.config.slot_seconds


def test_the_daemon_runs_engine_discovery_beside_its_loop(cluster, tmp_path):
    jm, new_tm, cmdline = cluster
    new_tm().start("Calc[2] (1/2)#0", "OutputFlusher for Calc[2] (1/2)#0")
    port = free_port()
    config = tmp_path / "agent.toml"
    config.write_text(
        f'dry_run = true\nmetrics = "127.0.0.1:{port}"\nsocket = "{tmp_path / "agent.sock"}"\n'
        f'controller = "127.0.0.1:{free_port()}"\nslot_seconds = 1\n\n'
        f'[[engine]]\nkind = "flink"\nrest_url = "{jm.url}"\n'
        f"taskmanager_cmdline = '{cmdline}'\nscan_seconds = 0.5\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "agent.daemon", "--config", str(config)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )

    def scrape() -> str:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1) as r:
                return r.read().decode()
        except OSError:
            return ""

    try:
        assert wait_for(
            lambda: 'dsched_agent_engine_instances{engine="flink"} 1.0' in scrape(), timeout=30
        )
        text = scrape()
        assert "dsched_agent_threads_managed 2.0" in text
        assert 'dsched_agent_engine_unavailable{engine="flink"} 0.0' in text
        assert 'dsched_agent_engine_scan_duration_seconds_count{engine="flink"}' in text
    finally:
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err


# ---------------------------------------------------------------- configuration


def _load(tmp_path: Path, text: str) -> AgentConfig:
    path = tmp_path / "agent.toml"
    path.write_text(text)
    return load_config(AgentConfig, path)


def test_engine_tables_load(tmp_path):
    config = _load(
        tmp_path,
        '[[engine]]\nkind = "flink"\nrest_url = "http://jm:8081"\njobs = "wc.*"\n'
        'stateful_operators = ["Calc[2]"]\nstateless_operators = ["GroupAggregate[4]"]\n'
        'scan_seconds = 5\n\n[[engine]]\nkind = "flink"\nrest_url = "http://jm2:8081"\n',
    )
    first, second = config.engine
    assert (first.kind, first.rest_url, first.scan_seconds, first.directory_refresh_seconds) == (
        "flink",
        "http://jm:8081",
        5.0,
        30.0,
    )
    assert first.stateful_overrides() == {"Calc[2]": True, "GroupAggregate[4]": False}
    assert (
        second.taskmanager_cmdline
        == r"org\.apache\.flink\.runtime\.taskexecutor\.TaskManagerRunner"
    )
    assert [e.name for e in make_engines(config.engine)] == ["flink", "flink-2"]
    named = _load(tmp_path, '[[engine]]\nkind = "flink"\nrest_url = "http://jm:1"\nname = "prod"\n')
    assert [e.name for e in make_engines(named.engine)] == ["prod"]


@pytest.mark.parametrize(
    "table,key,words",
    [
        ('kind = "storm"', "engine[0].kind", "known: flink"),
        ('kind = "flink"', "engine[0].rest_url", "required"),
        ('kind = "flink"\nrest_url = "jm:8081"', "engine[0].rest_url", "http://HOST:PORT"),
        ('kind = "flink"\nrest_url = "http://jm"', "engine[0].rest_url", "http://HOST:PORT"),
        ('kind = "flink"\nrest_url = "http://jm:1"\njobs = "("', "engine[0].jobs", "invalid regex"),
        (
            'kind = "flink"\nrest_url = "http://jm:1"\ntaskmanager_cmdline = "["',
            "engine[0].taskmanager_cmdline",
            "invalid regex",
        ),
        (
            'kind = "flink"\nrest_url = "http://jm:1"\nstateful_operators = ["a"]\nstateless_operators = ["a"]',
            "engine[0].stateless_operators",
            "also listed as stateful: a",
        ),
        (
            'kind = "flink"\nrest_url = "http://jm:1"\nscan_seconds = -1',
            "engine[0].scan_seconds",
            ">= 0",
        ),
        (
            'kind = "flink"\nrest_url = "http://jm:1"\ndirectory_refresh_seconds = 0',
            "engine[0].directory_refresh_seconds",
            "> 0",
        ),
        (
            'kind = "flink"\nrest_url = "http://jm:1"\nrest_timeout_seconds = 0',
            "engine[0].rest_timeout_seconds",
            "> 0",
        ),
        ('kind = "flink"\nrest_url = "http://jm:1"\nport = 3', "engine[0].port", "unknown key"),
        ('kind = "flink"\nrest_url = "http://jm:1"\nname = "a/b"', "engine[0].name", "name"),
    ],
)
def test_bad_engine_tables_name_the_key(tmp_path, table, key, words):
    with pytest.raises(ConfigError) as info:
        _load(tmp_path, "[[engine]]\n" + table + "\n")
    assert info.value.key == key and words in str(info.value)


def test_two_engine_tables_may_not_share_a_name(tmp_path):
    table = '[[engine]]\nkind = "flink"\nrest_url = "http://jm:1"\nname = "prod"\n'
    with pytest.raises(ConfigError) as info:
        _load(tmp_path, table + table)
    assert info.value.key == "engine[0].name"


def test_an_unknown_kind_lists_the_known_ones():
    with pytest.raises(UnknownPlugin) as info:
        EngineConfig(kind="storm", rest_url="http://jm:1").validate()
    assert (info.value.key, info.value.known) == ("kind", ["flink"])


def test_jcmd_helpers_still_import_from_rule_discovery():
    from agent.discovery import jvm_threads
    from agent.discovery import parse_jcmd_threads as from_discovery

    assert from_discovery is parse_jcmd_threads and callable(jvm_threads)
