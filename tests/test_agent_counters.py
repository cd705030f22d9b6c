"""cgroup v2 and resctrl against directories laid out like the kernel's (this VM has neither
a v2 cpu controller nor resctrl), plus PSI, /proc thread stat and jcmd parsing on real data."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path

import pytest

from agent.cgroups import BACKENDS, CgroupV2, detect_mode, make_backend
from agent.config import AgentConfig, DiscoveryRule
from agent.discovery import match_threads, parse_jcmd_threads, proc_threads
from agent.node import NodeAgent
from agent.sampling import (
    CLOCK_TICKS,
    Resctrl,
    ThreadCpuReader,
    read_pressure,
    thread_cpu_seconds,
)
from dsched.ids import InstanceKey
from dsched.registry import UnknownPlugin
from tests.test_agent_support import WorkerThread


def _fake_v2_layout(tmp: Path) -> Path:
    mount = tmp / "cgroup2"
    mount.mkdir()
    (mount / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (mount / "cgroup.subtree_control").write_text("")
    (mount / "cgroup.procs").write_text("1\n")
    (mount / "cgroup.threads").write_text("1\n")
    return mount


def _fake_v2_unit(tmp: Path) -> tuple[Path, Path, Path]:
    """A v2 tree as systemd lays it out (fake: no v2 cpu controller here): process 4242
    (threads 4242, 4243) in ``system.slice/flink.service`` with its own 0.5-core limit,
    and a /proc that says so. Returns (mount, unit cgroup, proc root)."""
    mount = _fake_v2_layout(tmp)
    (mount / "cgroup.subtree_control").write_text("cpu memory\n")
    unit = mount / "system.slice" / "flink.service"
    for level, enabled in ((mount / "system.slice", "cpu memory"), (unit, "")):
        level.mkdir()
        (level / "cgroup.controllers").write_text("cpu memory\n")
        (level / "cgroup.subtree_control").write_text(f"{enabled}\n" if enabled else "")
        (level / "cgroup.type").write_text("domain\n")
    (unit / "cgroup.procs").write_text("4242\n")
    (unit / "cgroup.threads").write_text("4242\n4243\n")
    (unit / "cpu.max").write_text("50000 100000\n")
    proc = tmp / "proc"
    for tid in (4242, 4243):
        (proc / "4242" / "task" / str(tid)).mkdir(parents=True)
        (proc / "4242" / "task" / str(tid) / "cgroup").write_text(
            "0::/system.slice/flink.service\n"
        )
    return mount, unit, proc


def _files(top: Path, skip: str = "dsched") -> dict[str, str]:
    return {
        str(f.relative_to(top)): f.read_text()
        for f in sorted(top.rglob("*"))
        if f.is_file() and skip not in f.relative_to(top).parts
    }


def test_v2_groups_nest_in_the_process_cgroup_which_keeps_the_process_fake_v2_layout(tmp_path):
    mount, unit, proc = _fake_v2_unit(tmp_path)
    assert detect_mode(str(mount))[0] == "v2"
    backend, _ = make_backend("auto", str(mount), "dsched", 100_000, False, proc_root=str(proc))
    assert isinstance(backend, CgroupV2)
    before = _files(mount)
    key = InstanceKey("wc", "count", 2)
    anchor = backend.anchor_of(4242, 4243)
    assert anchor == unit.resolve()
    path = backend.create(key, "w1", pid=4242, anchor=anchor)
    assert path == (unit / "dsched" / "wc" / "w1" / "count-2").resolve()
    # A threaded subtree below the unit: the unit becomes its threaded domain.
    for level in (unit, unit / "dsched", unit / "dsched" / "wc", unit / "dsched" / "wc" / "w1"):
        assert "+cpu" in (level / "cgroup.subtree_control").read_text()
    for level in (unit / "dsched", unit / "dsched" / "wc", unit / "dsched" / "wc" / "w1", path):
        assert (level / "cgroup.type").read_text().strip() == "threaded"
        assert not (level / "cgroup.procs").exists()
    backend.attach(path, 4242, 4243)
    assert backend.tids(path) == [4243]
    backend.set_cap(path, 0.35)
    assert (path / "cpu.max").read_text().split() == ["35000", "100000"]
    assert backend.read_cap(path) == pytest.approx(0.35)
    # A thread inside a dsched group anchors where that group is anchored.
    (proc / "4242" / "task" / "4243" / "cgroup").write_text(
        "0::/system.slice/flink.service/dsched/wc/w1/count-2\n"
    )
    assert backend.anchor_of(4242, 4243) == unit.resolve()
    adopted = backend.adopt()
    assert [(a.key, a.worker, a.cap_cores, a.tids) for a in adopted] == [(key, "w1", 0.35, (4243,))]
    # Released: the thread goes back to the unit's cgroup, never to another one.
    backend.detach(path, 4243)
    assert (unit / "cgroup.threads").read_text() == "4243\n"
    # Outside dsched's groups only the unit's +cpu and its thread list changed: the
    # process is still in the unit, every limit above it is as it was.
    after = _files(mount)
    changed = {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}
    assert changed == {
        "system.slice/flink.service/cgroup.subtree_control",
        "system.slice/flink.service/cgroup.threads",
    }
    assert after["system.slice/flink.service/cgroup.procs"] == "4242\n"
    (th_path := path / "cpu.stat").write_text(
        "usage_usec 900\nuser_usec 800\nsystem_usec 100\nnr_periods 40\nnr_throttled 7\nthrottled_usec 250000\n"
    )
    th = backend.throttling(th_path.parent)
    assert (th.periods_total, th.throttled_periods_total, th.throttled_seconds_total) == (
        40,
        7,
        0.25,
    )


def test_v2_enforcer_caps_and_releases_inside_the_unit_fake_v2_layout(tmp_path):
    from agent.directives import DirectiveEpochs, handle_directive
    from agent.enforcer import CapEnforcer
    from agent.metrics import AgentMetrics
    from agent.registry import Registry
    from dsched_pb import dsched_pb2 as pb

    mount, unit, proc = _fake_v2_unit(tmp_path)
    backend = CgroupV2(mount, "dsched", proc_root=str(proc))
    registry = Registry()
    key = InstanceKey("wc", "count", 2)
    registry.register(key, "w1", True, pid=4242, tid=4243)
    enforcer = CapEnforcer(backend, registry, AgentMetrics(), 2.0, root_limit_cores=1.0)
    wire = pb.InstanceKey(app="wc", operator="count", instance=2)
    ack = handle_directive(
        enforcer,
        pb.CapDirective(epoch=1, caps=[pb.InstanceCap(key=wire, cap_cores=0.8)]),
        DirectiveEpochs(),
    )
    assert ack.applied == 1, ack
    path = enforcer.cgroups[key]
    assert path == (unit / "dsched" / "wc" / "w1" / "count-2").resolve()
    # The unit's own 0.5-core cpu.max stays above dsched's 0.8 (v2 takes the minimum).
    assert (unit / "cpu.max").read_text() == "50000 100000\n"
    assert (path / "cpu.max").read_text().split() == ["80000", "100000"]
    assert (unit / "dsched" / "cpu.max").read_text().split() == ["100000", "100000"]
    assert (path / "cgroup.threads").read_text().split() == ["4243"]
    ack = handle_directive(enforcer, pb.CapDirective(epoch=2, release=[wire]), DirectiveEpochs())
    assert ack.applied == 1 and enforcer.caps == {} and key not in enforcer.cgroups
    assert (unit / "cgroup.threads").read_text().split() == ["4243"]


def test_v2_anchor_without_a_cpu_controller_is_refused_fake_v2_layout(tmp_path):
    from agent.cgroups import CgroupError

    mount, unit, proc = _fake_v2_unit(tmp_path)
    (unit / "cgroup.controllers").write_text("memory\n")
    backend = CgroupV2(mount, "dsched", proc_root=str(proc))
    before = _files(mount, skip="\0")
    with pytest.raises(CgroupError):
        backend.create(InstanceKey("wc", "count", 2), "w1", 4242, backend.anchor_of(4242, 4243))
    assert _files(mount, skip="\0") == before and not (unit / "dsched").exists()


def test_v2_backend_refuses_escaping_names_fake_v2_layout(tmp_path):
    mount = _fake_v2_layout(tmp_path)
    backend = CgroupV2(mount, "dsched")
    with pytest.raises(ValueError):
        backend.create(InstanceKey("..", "x", 0), "w", 1)
    with pytest.raises(ValueError):
        backend.set_cap(mount / "cgroup.procs", 1.0)
    assert not (mount / "dsched").exists()


def test_no_cpu_controller_means_no_enforcement(tmp_path):
    empty = tmp_path / "nothing"
    empty.mkdir()
    backend, why = make_backend("auto", str(empty), "dsched", 100_000, dry_run=False)
    assert backend.mode == "none" and "no cgroup cpu controller" in why


def test_cgroup_backends_are_chosen_by_name_auto_by_default(tmp_path):
    assert BACKENDS.names() == ["auto", "v1", "v2"]
    assert AgentConfig().cgroup_mode == "auto"
    mount = _fake_v2_layout(tmp_path)
    backend = BACKENDS.create("v2", str(mount), "dsched", 100_000)
    assert isinstance(backend, CgroupV2) and backend.why == f"cgroup v2 configured at {mount}"
    assert BACKENDS.create("v1", "", "dsched", 100_000).mount == Path("/sys/fs/cgroup/cpu")
    with pytest.raises(UnknownPlugin) as info:
        make_backend("v3", "", "dsched", 100_000, dry_run=False)
    assert info.value.key == "cgroup_mode" and info.value.known == ["auto", "v1", "v2"]
    dry, why = make_backend("v1", str(mount), "dsched", 100_000, dry_run=True)
    assert dry.mode == "none" and why == "dry-run: no cgroup is written"
    assert not (mount / "dsched").exists()


def _fake_resctrl_layout(tmp: Path, groups: dict[str, list[tuple[int, int]]]) -> Path:
    mount = tmp / "resctrl"
    (mount / "info" / "L3_MON").mkdir(parents=True)
    (mount / "mon_groups").mkdir()
    for group, domains in groups.items():
        for i, (llc, mbm) in enumerate(domains):
            d = mount / "mon_groups" / group / "mon_data" / f"mon_L3_{i:02d}"
            d.mkdir(parents=True)
            (d / "llc_occupancy").write_text(f"{llc}\n")
            (d / "mbm_total_bytes").write_text(f"{mbm}\n")
        (mount / "mon_groups" / group / "tasks").write_text("")
    return mount


def test_resctrl_sums_domains_per_app_and_derives_bandwidth_fake_resctrl_layout(tmp_path):
    mount = _fake_resctrl_layout(
        tmp_path, {"wc": [(1000, 10_000), (500, 5_000)], "other": [(9, 9)]}
    )
    r = Resctrl(mount)
    assert r.available
    llc, bw = r.read({"wc"})
    assert llc == {"wc": 1500.0} and bw == {}
    time.sleep(0.05)
    for i, mbm in enumerate((20_000, 15_000)):
        (
            mount / "mon_groups" / "wc" / "mon_data" / f"mon_L3_{i:02d}" / "mbm_total_bytes"
        ).write_text(str(mbm))
    _llc, bw = r.read({"wc"})
    assert bw["wc"] > 0
    r.assign("wc", [123, 456])
    assert (mount / "mon_groups" / "wc" / "tasks").read_text().split() == ["456"]


def test_missing_resctrl_is_reported_unavailable_not_zero(tmp_path):
    agent = NodeAgent(AgentConfig(dry_run=True, resctrl_mount=str(tmp_path / "absent")))
    t = WorkerThread()
    try:
        agent.register("wc", "count", 0, "w1", True, os.getpid(), t.tid)
        node = agent.report().node
        assert not node.llc_available and not node.memory_bandwidth_available
        assert dict(node.llc_occupancy_bytes) == {}
        assert "llc_occupancy" not in agent.hello().counters_available
    finally:
        t.join()
        agent.close()


def test_report_carries_resctrl_figures_fake_resctrl_layout(tmp_path):
    mount = _fake_resctrl_layout(tmp_path, {"wc": [(2048, 1)]})
    agent = NodeAgent(AgentConfig(dry_run=True, resctrl_mount=str(mount)))
    t = WorkerThread()
    try:
        agent.register("wc", "count", 0, "w1", True, os.getpid(), t.tid)
        node = agent.report().node
        assert node.llc_available and dict(node.llc_occupancy_bytes) == {"wc": 2048.0}
        assert {"llc_occupancy", "memory_bandwidth"} <= set(agent.hello().counters_available)
    finally:
        t.join()
        agent.close()


def test_pressure_parsed_and_missing_file_is_none(tmp_path):
    psi = tmp_path / "cpu"
    psi.write_text(
        "some avg10=1.50 avg60=0.75 avg300=0.10 total=123\nfull avg10=0.20 avg60=0.10 avg300=0.00 total=4\n"
    )
    p = read_pressure(psi)
    assert (p.some_avg10, p.some_avg60, p.full_avg10, p.full_avg60) == (1.5, 0.75, 0.2, 0.1)
    assert read_pressure(tmp_path / "absent") is None
    if Path("/proc/pressure/cpu").exists():
        assert read_pressure() is not None


def test_thread_cpu_seconds_grows_for_a_busy_thread_and_is_none_after_exit():
    t = WorkerThread(busy=True)
    first = thread_cpu_seconds("/proc", os.getpid(), t.tid)
    time.sleep(0.3)
    second = thread_cpu_seconds("/proc", os.getpid(), t.tid)
    t.join()
    time.sleep(0.05)
    assert first is not None and second > first
    assert thread_cpu_seconds("/proc", os.getpid(), t.tid) is None


def test_thread_cpu_reader_reads_schedstat_to_the_nanosecond_and_none_after_exit():
    """The agent's reader agrees with the thread's own CPU clock far below one clock
    tick, which the tick-counted stat file cannot."""
    assert Path("/proc/self/schedstat").exists(), "this kernel has schedstat"
    burnt, done, release = [], threading.Event(), threading.Event()

    def burn() -> None:
        end = time.thread_time() + 0.123
        while time.thread_time() < end:
            pass
        burnt.append(time.thread_time())
        done.set()
        release.wait()

    t = threading.Thread(target=burn)
    t.start()
    reader = ThreadCpuReader("/proc")
    assert reader.source == "schedstat"
    assert done.wait(10)
    # Read once the thread sleeps in release.wait(), between two readings of its
    # own CPU clock: the few microseconds it spends after its last thread_time()
    # grow to a fraction of a millisecond when the machine is busy.
    state = Path(f"/proc/self/task/{t.native_id}/stat")
    deadline = time.monotonic() + 10
    while state.read_text().rsplit(")", 1)[1].split()[0] != "S":
        assert time.monotonic() < deadline, "the thread never went to sleep"
        time.sleep(0.001)
    clock = time.pthread_getcpuclockid(t.ident)
    before = time.clock_gettime(clock)
    seconds = reader.read(os.getpid(), t.native_id)
    after = time.clock_gettime(clock)
    # 123 ms of CPU and then some: the stat file would say 120 ms (12 ticks of 10 ms).
    assert before - 1e-6 <= seconds <= after + 1e-6
    assert seconds >= burnt[0] - 1e-6
    assert reader.open_files == 1
    release.set()
    t.join()
    time.sleep(0.05)
    assert reader.read(os.getpid(), t.native_id) is None
    assert reader.open_files == 0
    with pytest.raises(ValueError, match="source"):
        ThreadCpuReader("/proc", source="status")


def test_thread_cpu_reader_falls_back_to_stat_without_schedstat(tmp_path):
    """A kernel without CONFIG_SCHED_INFO: a proc tree laid out like the kernel's, with a
    stat file copied from this one and no schedstat."""
    pid, tid = os.getpid(), threading.get_native_id()
    task = tmp_path / str(pid) / "task" / str(tid)
    task.mkdir(parents=True)
    (tmp_path / "self").mkdir()
    real = Path(f"/proc/{pid}/task/{tid}/stat").read_bytes()
    (task / "stat").write_bytes(real)
    reader = ThreadCpuReader(tmp_path)
    assert reader.source == "stat"
    fields = real[real.rfind(b")") + 2 :].split()
    assert reader.read(pid, tid) == (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    (task / "stat").write_bytes(b"")
    assert reader.read(pid, tid) is None  # an empty read: the thread has gone


# Captured on this machine: `jcmd <pid> Thread.print` of a Java 17 program (abridged).
JCMD_OUTPUT = """Full thread dump OpenJDK 64-Bit Server VM (17.0.15+6-Debian-1deb12u1 mixed mode, sharing):

"main" #1 prio=5 os_prio=0 cpu=526.72ms elapsed=6.25s tid=0x00007fac90018040 nid=0x18aa waiting on condition  [0x00007fac945fe000]
   java.lang.Thread.State: TIMED_WAITING (sleeping)
\tat java.lang.Thread.sleep(java.base@17.0.15/Native Method)

"wordcount-split-instance-0" #12 daemon prio=5 os_prio=0 cpu=0.09ms elapsed=4.99s tid=0x00007fac903fe0a0 nid=0x18d9 waiting on condition  [0x00007fac0ecfc000]
   java.lang.Thread.State: TIMED_WAITING (sleeping)

"wordcount-split-instance-1" #13 daemon prio=5 os_prio=0 cpu=0.10ms elapsed=4.99s tid=0x00007fac90400b20 nid=0x18da waiting on condition  [0x00007fac0ebfc000]
   java.lang.Thread.State: TIMED_WAITING (sleeping)

"GC Thread#1" os_prio=0 cpu=5.61ms elapsed=5.01s tid=0x00007fac08004990 nid=0x18d8 runnable
"""


def test_jcmd_thread_dump_parsed_to_tids_and_rule_matches():
    threads = parse_jcmd_threads(JCMD_OUTPUT)
    assert threads[0x18D9] == "wordcount-split-instance-0"
    assert threads[0x18AA] == "main" and threads[0x18D8] == "GC Thread#1"
    rule = DiscoveryRule(
        cmdline="java",
        thread_name=r"(?P<app>\w+)-(?P<operator>\w+)-instance-(?P<instance>\d+)",
        jvm=True,
    )
    rule.validate()
    found = match_threads(rule, 77, threads)
    assert [(m.app, m.operator, m.instance, m.tid) for m in found] == [
        ("wordcount", "split", 0, 0x18D9),
        ("wordcount", "split", 1, 0x18DA),
    ]


def test_rule_finds_named_threads_of_a_real_process_in_proc():
    code = (
        "import threading, time, ctypes\n"
        "def run(n):\n"
        "    ctypes.CDLL(None).prctl(15, f'op-count-{n}'.encode(), 0, 0, 0)\n"
        "    time.sleep(30)\n"
        "for n in range(2): threading.Thread(target=run, args=(n,), daemon=True).start()\n"
        "print('ready', flush=True); time.sleep(30)\n"
    )
    proc = subprocess.Popen(["python3", "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(0.1)
        rule = DiscoveryRule(
            cmdline="op-count", thread_name=r"op-(?P<operator>\w+)-(?P<instance>\d+)", app="wc"
        )
        found = match_threads(rule, proc.pid, proc_threads("/proc", proc.pid))
        assert sorted((m.operator, m.instance) for m in found) == [("count", 0), ("count", 1)]
    finally:
        proc.kill()
        proc.wait()
