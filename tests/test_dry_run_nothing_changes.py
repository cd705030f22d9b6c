"""Dry-run means nothing changes: a real controller in dry-run, two real `dsched-agent`
daemons in enforce (not dry-run), real threads, real cgroup v1; resctrl is a fake tree
laid out like the kernel's (this machine has none).

Everything an enforcing agent would touch is set up first: each agent's threads live
in a "container" cgroup with its own quota, the agents have `capacity_cores` (a root
quota), one agent finds a tree a previous agent left (a live capped group to re-adopt
and an empty one it would remove), and both find resctrl monitoring groups to move
threads into. The controller decides caps for every instance; afterwards not one
file under the cgroup mounts or the resctrl trees differs, the agents counted no
write, and each agent's Hello and reports claimed the same caps (the adopted one,
still in force).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.instance_client import AgentClient
from controller.core import Controller
from dsched.ids import InstanceKey
from dsched_pb import dsched_pb2 as pb
from testbed.live.cluster import metric_value, scrape
from tests.controller_server_support import config, start, stop, wait_until
from tests.test_agent_support import WorkerThread, empty_and_remove, free_port, write_control

pytestmark = [pytest.mark.cgroups, pytest.mark.slow]

CGROUPS = Path("/sys/fs/cgroup")
NODES = ("n1", "n2")
SPLIT = InstanceKey("wc", "split", 0)  # n1's adopted instance, capped at 0.3


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError as exc:  # some control files refuse reads (write-only or busy)
        return f"<{exc.strerror}>"


def _snapshot(names: tuple[str, ...], resctrl: list[Path]) -> dict[str, str]:
    """Every path under the cgroup mounts that carries one of the test's ``names`` (its
    containers and the agents' roots, wherever they are), with the contents of its
    writable files and thread lists; the writable settings at the top of each mount
    (the top's thread lists change with every process on the machine, so they are
    left out); and the whole of each resctrl tree."""
    out: dict[str, str] = {}
    for mount in sorted(p for p in CGROUPS.iterdir() if p.is_dir()):
        for dirpath, dirnames, files in os.walk(mount):
            here = Path(dirpath)
            ours = any(n in here.relative_to(mount).parts for n in names)
            if here != mount and not ours:
                # Only descend where one of our names may still appear below.
                continue
            for d in dirnames:
                if d in names:
                    out[str(here / d)] = "dir"
            for f in files:
                path = here / f
                if here == mount and _moves_by_itself(f):
                    continue
                try:
                    writable = path.stat().st_mode & 0o200
                except OSError:
                    continue
                if writable or f in ("tasks", "cgroup.procs"):
                    out[str(path)] = _read(path)
    for tree in resctrl:
        for path in sorted(tree.rglob("*")):
            out[str(path)] = "dir" if path.is_dir() else _read(path)
    return out


def _moves_by_itself(name: str) -> bool:
    """Files at a mount's top that every process on the machine changes: thread lists,
    usage and pressure figures (writable only to reset them or to set triggers)."""
    return name in ("tasks", "cgroup.procs", "cgroup.threads") or any(
        part in name for part in ("usage", "pressure", "stat")
    )


def _fake_resctrl(top: Path) -> Path:
    """resctrl as the kernel lays it out: monitoring groups an agent would move threads into."""
    mount = top
    (mount / "info" / "L3_MON").mkdir(parents=True)
    (mount / "mon_groups" / "wc" / "mon_data" / "mon_L3_00").mkdir(parents=True)
    (mount / "mon_groups" / "wc" / "tasks").write_text("")
    domain = mount / "mon_groups" / "wc" / "mon_data" / "mon_L3_00"
    (domain / "llc_occupancy").write_text("1000\n")
    (domain / "mbm_total_bytes").write_text("5000\n")
    (mount / "tasks").write_text("")
    return mount


@pytest.fixture
def containers(cgroup_v1_cpu: Path) -> Iterator[dict[str, Path]]:
    """One container cgroup per node, 0.9 core each, removed with whatever is inside."""
    made = {}
    try:
        for node in NODES:
            pod = cgroup_v1_cpu / f"dsched-dry-pod-{node}-{os.getpid()}"
            pod.mkdir()
            made[node] = pod
            write_control(pod / "cpu.cfs_period_us", "100000")
            write_control(pod / "cpu.cfs_quota_us", "90000")
        yield made
    finally:
        for pod in made.values():
            empty_and_remove(pod, cgroup_v1_cpu / "tasks")
    assert not any(p.exists() for p in made.values()), "test left a cgroup behind"


def _agent_config(tmp: Path, node: str, port: int, root: str, mount: Path) -> Path:
    path = tmp / f"agent-{node}.toml"
    path.write_text(
        f'controller = "127.0.0.1:{port}"\n'
        f'node_id = "{node}"\n'
        'cgroup_mode = "v1"\n'
        f'cgroup_mount = "{mount}"\n'
        f'cgroup_root = "{root}"\n'
        f'metrics = "127.0.0.1:{free_port()}"\n'
        f'socket = "{tmp / f"{node}.sock"}"\n'
        "slot_seconds = 1.0\n"
        "sample_seconds = 0.25\n"
        "capacity_cores = 1.5\n"
        'fallback = "release"\n'
        "lease_epochs = 1\n"
        f'resctrl_mount = "{tmp / f"resctrl-{node}"}"\n'
    )
    return path


def _recorded(controller: Controller) -> tuple[list[pb.Hello], list[pb.NodeReport]]:
    """Keep what reaches the controller's core (the controller itself is unchanged)."""
    hellos: list[pb.Hello] = []
    reports: list[pb.NodeReport] = []
    on_hello, on_report = controller.on_hello, controller.on_report

    def hello(msg: pb.Hello) -> pb.Welcome:
        hellos.append(msg)
        return on_hello(msg)

    def report(msg: pb.NodeReport) -> None:
        reports.append(msg)
        on_report(msg)

    controller.on_hello, controller.on_report = hello, report
    return hellos, reports


def _caps(entries) -> dict[tuple[str, str, int], float]:
    """Caps claimed by a Hello's InstanceCaps or a report's samples (unset: uncapped)."""
    return {
        (e.key.app, e.key.operator, e.key.instance): e.cap_cores
        for e in entries
        if isinstance(e, pb.InstanceCap) or e.HasField("cap_cores")
    }


def test_agents_in_enforce_change_nothing_while_the_controller_is_in_dry_run(
    tmp_path, cgroup_v1_cpu, containers
):
    roots = {node: f"dsched-dry-{node}-{os.getpid()}" for node in NODES}
    busy = {node: WorkerThread(busy=True) for node in NODES}
    adopted = WorkerThread()
    procs: dict[str, subprocess.Popen] = {}
    clients: list[AgentClient] = []
    controller, server = start(config(tmp_path, mode="dry-run", theta_cores=0.01))
    hellos, reports = _recorded(controller)
    try:
        for node in NODES:
            write_control(containers[node] / "tasks", str(busy[node].tid))
        # What a previous agent of n1 left: a live capped group and an empty one.
        tree = containers["n1"] / roots["n1"] / "wc" / "w1"
        for group, quota in (("split-0", "30000"), ("count-9", "20000")):
            (tree / group).mkdir(parents=True)
            write_control(tree / group / "cpu.cfs_period_us", "100000")
            write_control(tree / group / "cpu.cfs_quota_us", quota)
        write_control(containers["n1"] / "tasks", str(adopted.tid))
        write_control(tree / "split-0" / "tasks", str(adopted.tid))
        resctrl = [_fake_resctrl(tmp_path / f"resctrl-{node}") for node in NODES]
        names = tuple(roots.values()) + tuple(p.name for p in containers.values())
        before = _snapshot(names, resctrl)

        metrics = {}
        for node in NODES:
            path = _agent_config(tmp_path, node, server.port, roots[node], cgroup_v1_cpu)
            metrics[node] = path.read_text().split('metrics = "')[1].split('"')[0]
            log = (tmp_path / f"agent-{node}.log").open("ab")
            procs[node] = subprocess.Popen(
                [sys.executable, "-m", "agent.daemon", "--config", str(path)],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        wait_until(lambda: all((tmp_path / f"{n}.sock").exists() for n in NODES), "sockets")
        for i, node in enumerate(NODES):
            client = AgentClient(str(tmp_path / f"{node}.sock"), flush_seconds=0.2)
            clients.append(client)
            client.register("wc", "count", i, f"w{i + 1}", True, tid=busy[node].tid)

        def feed_and_check() -> bool:
            n = int(time.monotonic() * 100)
            for i, client in enumerate(clients):
                client.update(
                    "wc",
                    "count",
                    i,
                    received=n,
                    executed=n,
                    emitted=n,
                    queue_length=5,
                    latency_sum_seconds=n * 0.001,
                    latency_count=n,
                    service_seconds=n * 0.0005,
                )
            rec = controller.last_record or {}
            decided = {
                (r["app"], r["operator"], r["instance"]): r["cap_cores"]
                for r in rec.get("instances", [])
            }
            wanted = [decided.get(("wc", "count", i), 0) for i in range(len(NODES))]
            return len(reports) >= 8 and all(cap > 0 for cap in wanted)

        # The controller decides caps (it would cap these instances) and records them.
        wait_until(feed_and_check, "dry-run decisions with caps for the instances")
        assert controller.mode == "dry-run"
        for node in NODES:
            text = scrape(metrics[node])
            assert metric_value(text, "dsched_agent_cap_writes_total") == 0, node
            assert metric_value(text, "dsched_agent_cgroups_removed_total") == 0, node
            assert metric_value(text, "dsched_agent_threads_managed") >= 1, node
        for node in NODES:
            procs[node].send_signal(signal.SIGTERM)
        assert {node: procs[node].wait(30) for node in NODES} == dict.fromkeys(NODES, 0)

        after = _snapshot(names, resctrl)
        changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
        assert not changed, f"dry-run changed {changed}"

        # The Hello and every report claim the same caps: the adopted one, in force.
        in_force = {"n1": {("wc", "split", 0): pytest.approx(0.3)}, "n2": {}}
        assert {h.node_id for h in hellos} == set(NODES)
        for hello in hellos:
            assert not hello.dry_run
            assert _caps(hello.current_caps) == in_force[hello.node_id]
        for report in reports:
            assert _caps(report.instances) == in_force[report.node_id], report.node_id
    finally:
        for client in clients:
            client.close()
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        stop(controller, server)
        for t in (*busy.values(), adopted):
            t.join()
