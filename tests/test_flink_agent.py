"""The agent's Flink engine against a real Flink cluster (tests/flink_support.py).

One cluster and one running WordCount per module (source -> Calc -> GroupAggregate
-> sink, parallelism 2, every subtask its own thread), fed from a trace. The
tests run in file order on that one job: find every subtask (dry-run, nothing
written), cap in enforce mode and measure, fail over to a new TaskManager,
cancel. Skipped without Flink (``make flink``) or cgroups, failing instead under
DSCHED_REQUIRE_CGROUPS=1, like the other real-system tests.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.config import AgentConfig, EngineConfig
from agent.engines import make_engines
from agent.engines.discovery import EngineDiscovery
from agent.node import NodeAgent
from agent.registry import InstanceRecord
from dsched.engines.flink import parse_thread_name, safe_name
from dsched.ids import InstanceKey
from dsched_pb import dsched_pb2 as pb
from testbed.flink.cluster import FlinkCluster, JvmThread, jvm_threads
from tests.flink_support import running_job
from tests.test_agent_support import release_tree, unique_root

pytestmark = [pytest.mark.cgroups, pytest.mark.slow]

JOB = "wcagent"
PARALLELISM = 2
# Calc's cost per record: ROUNDS chained SHA-256 digests, ~3 ms a record here (the
# JDK's SHA intrinsics make a round ~75 ns). At RATE records/s over two subtasks each
# Calc subtask wants ~0.3 core, well above CAP: capped, it saturates.
ROUNDS = 40_000
RATE = 200.0
CAP = 0.1


@pytest.fixture(scope="module")
def job(flink_cluster: FlinkCluster, tmp_path_factory) -> Iterator[str]:
    with running_job(
        flink_cluster,
        tmp_path_factory.mktemp("wcagent"),
        rate=RATE,
        job_name=JOB,
        parallelism=PARALLELISM,
        rounds=ROUNDS,
    ) as running:
        yield running.job_id


def engine_config(cluster: FlinkCluster) -> EngineConfig:
    # Only this cluster's TaskManagers: other Flink clusters may run on this machine.
    config = EngineConfig(
        kind="flink",
        rest_url=cluster.rest_url,
        taskmanager_cmdline=rf"TaskManagerRunner --configDir {re.escape(str(cluster.conf_dir))}( |$)",
    )
    config.validate()
    return config


@pytest.fixture
def enforcing(cgroup_v1_cpu: Path) -> Iterator[NodeAgent]:
    root = unique_root()
    agent = NodeAgent(
        AgentConfig(cgroup_mode="v1", cgroup_mount=str(cgroup_v1_cpu), cgroup_root=root)
    )
    yield agent
    agent.close()
    release_tree(cgroup_v1_cpu, root)
    assert not (cgroup_v1_cpu / root).exists(), "test left its cgroup root behind"


def expected_keys(cluster: FlinkCluster, job_id: str) -> dict[InstanceKey, str]:
    """Every subtask of every vertex: key -> its task thread's name (attempt aside)."""
    out = {}
    for vertex in cluster.job_vertices(job_id):
        for index in range(vertex["parallelism"]):
            key = InstanceKey(safe_name(JOB), safe_name(vertex["name"]), index)
            out[key] = f"{vertex['name']} ({index + 1}/{vertex['parallelism']})"
    return out


def subtask_tids(threads: list[JvmThread], prefix: str) -> dict[int, str]:
    """Threads of one subtask among a jcmd listing (testbed's own parser): its name is
    '<prefix>#<attempt>' or ends with it after a space or a dash."""
    out = {}
    for t in threads:
        head, sep, attempt = t.name.rpartition("#")
        if (
            sep
            and attempt.isdigit()
            and (head == prefix or (head.endswith(prefix) and head[-len(prefix) - 1] in " -"))
        ):
            out[t.tid] = t.name
    return out


def live_tids(rec: InstanceRecord) -> set[int]:
    return {t for t in rec.tids if Path(f"/proc/{rec.pid}/task/{t}").exists()}


def cgroup_tasks(path: Path) -> set[int]:
    return {int(t) for t in (path / "tasks").read_text().split()}


def cap_directive(epoch: int, caps: dict[InstanceKey, float]) -> pb.CapDirective:
    return pb.CapDirective(
        epoch=epoch,
        caps=[
            pb.InstanceCap(
                key=pb.InstanceKey(app=k.app, operator=k.operator, instance=k.instance),
                cap_cores=c,
            )
            for k, c in caps.items()
        ],
    )


def test_every_subtask_is_found_with_its_threads_and_dry_run_writes_nothing(
    flink_cluster,
    job,
    cgroup_v1_cpu,
):
    (tm,) = flink_cluster.taskmanager_pids()
    root = unique_root()
    agent = NodeAgent(AgentConfig(dry_run=True, cgroup_mount=str(cgroup_v1_cpu), cgroup_root=root))
    try:
        expected = expected_keys(flink_cluster, job)
        assert len(expected) == 4 * PARALLELISM
        before = jvm_threads(tm)
        discovery = EngineDiscovery(agent, make_engines([engine_config(flink_cluster)]))
        (applied,) = discovery.scan()
        after = jvm_threads(tm)
        records = {r.key: r for r in agent.registry.snapshot()}
        assert applied.registered == len(expected) and set(records) == set(expected)
        for key, name in expected.items():
            rec = records[key]
            was, now = subtask_tids(before, name), subtask_tids(after, name)
            # Fetcher threads come and go: the instance holds every thread jcmd showed
            # both before and after the scan, and none that jcmd showed neither time.
            assert set(was) & set(now) <= rec.tids <= set(was) | set(now), key
            task_thread = {t for t, n in now.items() if n.rpartition("#")[0] == name}
            assert len(task_thread) == 1 and task_thread <= rec.tids, key
            assert (rec.pid, rec.worker, rec.engine) == (tm, f"tm-{tm}", "flink")
        # Nothing else of the TaskManager is taken: its own threads, the JVM's.
        taken = set().union(*(r.tids for r in records.values()))
        own = {t.tid for t in before + after if parse_thread_name(t.name) is None}
        assert len(own) > 20 and not taken & own
        assert records[InstanceKey(JOB, "GroupAggregate_4", 0)].stateful
        assert records[InstanceKey(JOB, "Calc_2", 1)].upstream == ("Source:_src_1",)
        # Dry-run: a directive is remembered and reported as such, and no cgroup file
        # is created or written.
        calc = InstanceKey(JOB, "Calc_2", 0)
        assert agent.handle_directive(cap_directive(1, {calc: CAP})).applied == 1
        agent.sample()
        report = {(s.key.operator, s.key.instance): s for s in agent.report().instances}
        assert report[("Calc_2", 0)].engine == "flink" and not report[("Calc_2", 0)].HasField(
            "cap_cores"
        )
        assert not (cgroup_v1_cpu / root).exists()
        for tid in live_tids(records[calc]):
            assert root not in Path(f"/proc/{tm}/task/{tid}/cgroup").read_text()
    finally:
        agent.close()


def test_caps_are_enforced_and_a_saturated_subtask_runs_at_its_cap(
    flink_cluster,
    job,
    enforcing,
):
    agent = enforcing
    discovery = EngineDiscovery(agent, make_engines([engine_config(flink_cluster)]))
    discovery.scan()
    calcs = [InstanceKey(JOB, "Calc_2", i) for i in range(PARALLELISM)]
    ack = agent.handle_directive(cap_directive(1, dict.fromkeys(calcs, CAP)))
    assert (ack.applied, list(ack.rejected)) == (PARALLELISM, [])
    for key in calcs:
        path = agent.cgroups[key]
        assert int((path / "cpu.cfs_quota_us").read_text()) == round(CAP * 100_000)
        rec = agent.registry.get(key)
        assert live_tids(rec) <= cgroup_tasks(path) <= rec.tids
    # The machine is shared: the test root outweighs other work (cpu.shares; written
    # after the directive, which sets every weight), so the measurement shows what
    # the cap allows, not what the neighbours leave over.
    (agent.backend.root / "cpu.shares").write_text("262144")
    time.sleep(1.0)  # let the first throttled periods and the backlog settle
    agent.sample()
    start = {key: agent.sampler.cpu_seconds(key) for key in calcs}
    t0 = time.monotonic()
    time.sleep(4.0)
    agent.sample()
    elapsed = time.monotonic() - t0
    usage = {key: (agent.sampler.cpu_seconds(key) - start[key]) / elapsed for key in calcs}
    busiest = max(usage, key=usage.get)
    assert abs(usage[busiest] - CAP) <= 0.03, f"cap {CAP}, measured {usage}"
    throttling = agent.backend.throttling(agent.cgroups[busiest])
    assert throttling is not None and throttling.throttled_periods_total > 0


def test_failover_to_a_new_taskmanager_is_found_in_one_scan_and_keeps_its_caps(
    flink_cluster,
    job,
    enforcing,
):
    agent = enforcing
    (old,) = flink_cluster.taskmanager_pids()
    discovery = EngineDiscovery(agent, make_engines([engine_config(flink_cluster)]))
    discovery.scan()
    caps = {
        InstanceKey(JOB, "Calc_2", 0): 0.3,
        InstanceKey(JOB, "Calc_2", 1): 0.3,
        InstanceKey(JOB, "GroupAggregate_4", 0): 0.4,
    }
    assert agent.handle_directive(cap_directive(1, caps)).applied == len(caps)
    old_dirs = [agent.cgroups[k] for k in caps]

    new = flink_cluster.restart_taskmanager(old)
    flink_cluster.wait_running(job, timeout=90)
    (applied,) = discovery.scan()
    assert applied.unavailable is None
    records = {r.key: r for r in agent.registry.snapshot()}
    assert set(records) == set(expected_keys(flink_cluster, job))
    for rec in records.values():
        assert (rec.pid, rec.worker) == (new, f"tm-{new}"), rec.key
    for key, cap in caps.items():
        path = agent.cgroups[key]
        assert path.parent.name == f"tm-{new}"
        assert int((path / "cpu.cfs_quota_us").read_text()) == round(cap * 100_000)
        rec = agent.registry.get(key)
        assert live_tids(rec) <= cgroup_tasks(path) <= rec.tids
    for path in old_dirs:
        assert not path.exists(), path
    assert not (agent.backend.root / JOB / f"tm-{old}").exists()


def test_a_cancelled_job_leaves_no_cgroup(flink_cluster, job, enforcing):
    agent = enforcing
    discovery = EngineDiscovery(agent, make_engines([engine_config(flink_cluster)]))
    discovery.scan()
    keys = sorted(expected_keys(flink_cluster, job))
    assert agent.handle_directive(cap_directive(1, dict.fromkeys(keys, 0.5))).applied == len(keys)
    assert (agent.backend.root / JOB).is_dir()
    assert flink_cluster.cancel(job) == "CANCELED"
    (applied,) = discovery.scan()
    assert applied.unregistered == len(keys)
    assert len(agent.registry) == 0 and agent.cgroups == {}
    assert not (agent.backend.root / JOB).exists()
