"""A pid the kernel gave to another process is never taken for a registered instance.

The agent keeps each instance's process start time (field 22 of /proc/<pid>/stat)
and checks it before it samples or moves threads by number. A pid cannot be made
to be reused on demand, so these tests make the record's start time differ from
the one /proc shows for a real child process, which is exactly what a reused pid
looks like to the agent. Real processes, real cgroup v1 (root;
DSCHED_REQUIRE_CGROUPS=1 turns skips into failures).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import uuid
from pathlib import Path

import psutil
import pytest

from agent.config import AgentConfig, DiscoveryRule
from agent.discovery import RuleDiscovery
from agent.node import NodeAgent
from agent.registry import InstanceRecord, RegistrationError
from agent.sampling import process_start_ticks
from dsched.ids import InstanceKey
from dsched_pb import dsched_pb2 as pb
from tests.test_agent_support import release_tree, unique_root

pytestmark = pytest.mark.cgroups

KEY = InstanceKey("wc", "count", 0)
REUSED = "dsched_agent_pid_reused_total"

# A process with two threads; its comm has a ')' and spaces, as a comm may.
CHILD = r"""
import sys, threading
ready, stop, tids = threading.Event(), threading.Event(), []
def run():
    tids.append(threading.get_native_id())
    with open(f"/proc/self/task/{tids[0]}/comm", "w") as fh:
        fh.write("count-7")
    ready.set()
    stop.wait()
threading.Thread(target=run, daemon=True).start()
ready.wait()
with open("/proc/self/comm", "w") as fh:
    fh.write("x) y (z")
print(threading.get_native_id(), tids[0], flush=True)
sys.stdin.read()
"""


class Child:
    """A real child process: ``pid`` (its main thread's tid) and a second thread ``tid``."""

    def __init__(self) -> None:
        self.token = f"dsched-pid-reuse-{uuid.uuid4().hex}"
        self.proc = subprocess.Popen(
            [sys.executable, "-c", CHILD, self.token],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        main, self.tid = (int(x) for x in self.proc.stdout.readline().split())
        self.pid = self.proc.pid
        assert main == self.pid

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
        self.proc.stdin.close()
        self.proc.stdout.close()


@pytest.fixture
def agent(cgroup_v1_cpu: Path):
    root = unique_root()
    config = AgentConfig(cgroup_mode="v1", cgroup_mount=str(cgroup_v1_cpu), cgroup_root=root)
    node = NodeAgent(config)
    yield node
    node.close()
    release_tree(cgroup_v1_cpu, root)
    assert not (cgroup_v1_cpu / root).exists(), "test left its cgroup root behind"


@pytest.fixture
def child():
    c = Child()
    yield c
    c.stop()


def pretend_pid_reused(node: NodeAgent, key: InstanceKey) -> None:
    """Make the record's start time one the process under its pid does not have: the
    record now names a process that has exited, and its pid another one."""
    with node.registry._lock:
        node.registry._records[key].start_time -= 1


def tasks(path: Path) -> set[int]:
    return {int(t) for t in (path / "tasks").read_text().split()}


def cpu_cgroup(pid: int, tid: int) -> str:
    """The v1 cpu cgroup a thread is in."""
    for line in Path(f"/proc/{pid}/task/{tid}/cgroup").read_text().splitlines():
        _num, controllers, path = line.split(":", 2)
        if "cpu" in controllers.split(","):
            return path
    raise AssertionError(f"thread {tid} has no cpu cgroup")


def sampled(node: NodeAgent) -> set[InstanceKey]:
    """The instances the sampler reads."""
    return {
        InstanceKey(app, op, int(i)) for (app, op, i, _w), _ in node.sampler.usage_by_instance()
    }


def gone_listener(node: NodeAgent) -> list[InstanceRecord]:
    seen: list[InstanceRecord] = []
    node.threads_gone_listeners.append(lambda rec, _cap: seen.append(rec))
    return seen


def test_the_start_time_is_field_22_of_the_process_stat(child):
    assert Path(f"/proc/{child.pid}/comm").read_text() == "x) y (z\n"
    ticks = process_start_ticks("/proc", child.pid)
    assert ticks is not None
    # psutil computes create_time as boot time + starttime / clock ticks.
    created = psutil.boot_time() + ticks / os.sysconf("SC_CLK_TCK")
    assert abs(created - psutil.Process(child.pid).create_time()) < 0.05
    assert process_start_ticks("/proc", 2**22 + 1) is None  # above pid_max: no process


def test_a_registered_instance_keeps_its_process_start_time(agent, child):
    rec = agent.register("wc", "count", 0, "w1", True, child.pid, child.pid)
    assert rec.start_time == process_start_ticks("/proc", child.pid)
    # Another thread joins the record; the start time is the process's, unchanged.
    rec = agent.register("wc", "count", 0, "w1", True, child.pid, child.tid)
    assert rec.tids == {child.pid, child.tid}
    assert rec.start_time == process_start_ticks("/proc", child.pid)


def test_a_rule_registers_the_start_time_of_the_process_it_matched(agent, child):
    rule = DiscoveryRule(
        cmdline=child.token, thread_name=r"(?P<operator>count)-(?P<instance>\d+)", app="wc"
    )
    (match,) = RuleDiscovery(agent, [rule]).scan()
    assert (match.pid, match.tid, match.instance) == (child.pid, child.tid, 7)
    rec = agent.registry.get(InstanceKey("wc", "count", 7))
    assert rec is not None and rec.source == "rule"
    assert rec.start_time == process_start_ticks("/proc", child.pid)


def test_a_registration_for_a_process_that_is_not_the_one_found_is_refused(agent, child):
    started = process_start_ticks("/proc", child.pid)
    with pytest.raises(RegistrationError) as exc:
        agent.register(
            "wc",
            "count",
            0,
            "w1",
            True,
            child.pid,
            child.pid,
            source="rule",
            start_time=started - 1,
        )
    assert exc.value.reason == "no_such_thread"
    assert agent.registry.get(KEY) is None
    assert agent.metrics.registry.get_sample_value(REUSED) == 0


def test_the_sampling_pass_neither_moves_nor_keeps_an_instance_whose_pid_was_reused(
    agent, child, caplog
):
    gone = gone_listener(agent)
    agent.register("wc", "count", 0, "w1", True, child.pid, child.pid)
    agent.apply_cap(agent.registry.get(KEY), 0.5)
    path = agent.cgroups[KEY]
    assert tasks(path) == {child.pid}
    agent.sample()

    pretend_pid_reused(agent, KEY)
    # Another thread under the pid is found for the instance (as an engine's scan
    # would): the next pass would move it into the instance's cgroup.
    agent.registry.register_threads(
        KEY, "w1", True, child.pid, {child.pid, child.tid}, source="engine"
    )
    with caplog.at_level(logging.WARNING, logger="agent"):
        agent.sample()
        agent.sample()

    assert child.tid not in tasks(path)
    assert not cpu_cgroup(child.pid, child.tid).startswith(f"/{agent.backend.root.name}")
    assert agent.registry.get(KEY) is None
    assert KEY not in agent.cgroups and KEY not in agent.caps
    assert agent.metrics.registry.get_sample_value(REUSED) == 1
    assert agent.metrics.registry.get_sample_value("dsched_agent_instances_managed") == 0
    assert [rec.key for rec in gone] == [KEY]
    assert KEY not in sampled(agent)
    warnings = [r for r in caplog.records if "forgetting" in r.getMessage()]
    assert len(warnings) == 1, [r.getMessage() for r in caplog.records]

    # The cgroup goes as for any exited instance once its threads have left it
    # (here the test's own thread, which really did not exit, is still inside).
    child.stop()
    agent.sample()
    assert not path.exists()


def test_a_cap_is_not_applied_to_a_reused_pid_and_the_next_pass_forgets_the_instance(agent, child):
    gone = gone_listener(agent)
    agent.register("wc", "count", 0, "w1", True, child.pid, child.pid)
    agent.register("wc", "count", 0, "w1", True, child.pid, child.tid)
    pretend_pid_reused(agent, KEY)

    directive = pb.CapDirective(
        epoch=1,
        caps=[
            pb.InstanceCap(
                key=pb.InstanceKey(app="wc", operator="count", instance=0), cap_cores=0.5
            )
        ],
    )
    ack = agent.handle_directive(directive)
    assert ack.applied == 0
    assert [r.reason for r in ack.rejected] == ["thread_gone"]
    assert KEY not in agent.cgroups and KEY not in agent.caps
    assert not (agent.backend.root / "wc" / "w1" / "count-0").exists()
    for tid in (child.pid, child.tid):
        assert not cpu_cgroup(child.pid, tid).startswith(f"/{agent.backend.root.name}")

    agent.sample()
    assert agent.registry.get(KEY) is None
    assert agent.metrics.registry.get_sample_value(REUSED) == 1
    assert [rec.key for rec in gone] == [KEY]


def test_new_threads_of_a_capped_instance_are_not_moved_once_its_pid_was_reused(agent, child):
    agent.register("wc", "count", 0, "w1", True, child.pid, child.pid)
    agent.apply_cap(agent.registry.get(KEY), 0.5)
    path = agent.cgroups[KEY]
    pretend_pid_reused(agent, KEY)
    rec, changed = agent.registry.register_threads(
        KEY, "w1", True, child.pid, {child.pid, child.tid}, source="engine"
    )
    assert changed
    agent.enforcer.attach_new_threads(rec)
    assert child.tid not in tasks(path)
    # A cap change writes the quota but moves nothing either.
    agent.apply_cap(agent.registry.get(KEY), 0.3)
    assert int((path / "cpu.cfs_quota_us").read_text()) == 30_000
    assert child.tid not in tasks(path)


def test_the_process_now_under_the_pid_registers_afresh(agent, child):
    gone = gone_listener(agent)
    agent.register("wc", "count", 0, "w1", True, child.pid, child.pid)
    agent.apply_cap(agent.registry.get(KEY), 0.5)
    old_path = agent.cgroups[KEY]
    pretend_pid_reused(agent, KEY)

    # A thread of the process that has the pid now registers the same instance: the
    # old record's process is gone (forgotten as exited), and this one starts anew.
    rec = agent.register("wc", "count", 0, "w1", True, child.pid, child.tid)
    assert rec.tids == {child.tid}
    assert rec.start_time == process_start_ticks("/proc", child.pid)
    assert [r.key for r in gone] == [KEY]
    assert agent.metrics.registry.get_sample_value(REUSED) == 1
    assert KEY not in agent.caps and KEY not in agent.cgroups
    agent.sample()
    assert child.tid not in tasks(old_path)
    assert agent.registry.get(KEY) is not None
    assert agent.metrics.registry.get_sample_value(REUSED) == 1


def test_an_instance_whose_start_time_matches_is_sampled_and_capped_as_before(agent, child):
    gone = gone_listener(agent)
    agent.register("wc", "count", 0, "w1", True, child.pid, child.pid)
    agent.apply_cap(agent.registry.get(KEY), 0.5)
    path = agent.cgroups[KEY]
    agent.sample()
    # A new thread registers: the next pass moves it into the instance's cgroup.
    agent.register("wc", "count", 0, "w1", True, child.pid, child.tid)
    agent.sample()
    agent.sample()

    assert tasks(path) == {child.pid, child.tid}
    rec = agent.registry.get(KEY)
    assert rec is not None and rec.tids == {child.pid, child.tid}
    assert agent.caps[KEY] == 0.5
    assert agent.metrics.registry.get_sample_value(REUSED) == 0
    assert gone == []
    assert KEY in sampled(agent)
