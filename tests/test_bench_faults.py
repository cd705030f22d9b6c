"""`dsched bench faults`: the fault matrix against real daemons, real cgroups and
real network namespaces (root; DSCHED_REQUIRE_CGROUPS=1 turns skips into failures).

The quick matrix runs every fault kind once or twice and must count no QoS
setting lost, no cap out of bounds, no write outside the agents' roots, no
tuple lost or duplicated and no cgroup left; the checks below also make sure
each fault really happened (a fallback applied, a damaged file refused, fuzz
cases refused with reasons), so a matrix that injected nothing fails. Then
each bad argument is refused with exit status 2 before anything starts, and
the harness's own detectors are checked against real cgroups.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench import faults
from dsched import cli
from tests.conftest import require_cgroups

REPO = Path(__file__).resolve().parent.parent
CPU = Path("/sys/fs/cgroup/cpu")


def _prerequisites() -> None:
    require_cgroups()
    why = faults.prerequisites()
    if why is not None:
        if os.environ.get("DSCHED_REQUIRE_CGROUPS") == "1":
            pytest.fail(f"fault matrix cannot run but DSCHED_REQUIRE_CGROUPS=1: {why}")
        pytest.skip(f"fault matrix cannot run here: {why}")


@pytest.fixture(scope="module")
def quick(tmp_path_factory) -> dict:
    """One quick matrix for the whole module (its run takes about a minute)."""
    _prerequisites()
    out = tmp_path_factory.mktemp("faults") / "faults.json"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dsched.cli",
            "bench",
            "faults",
            "--quick",
            "--stall-leases",
            "1.5",
            "--json",
            str(out),
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        log, _ = proc.communicate(timeout=400)
    except subprocess.TimeoutExpired:
        proc.terminate()  # the harness's own cleanup runs on SIGTERM
        log, _ = proc.communicate(timeout=120)
        pytest.fail(f"the quick matrix did not finish:\n{log[-4000:]}")
    token = f"{proc.pid % 100000:05d}"
    return {"code": proc.returncode, "log": log, "doc": json.loads(out.read_text()), "token": token}


# The tests that read the matrix run alone (tests/conftest.py): its recoveries must
# fit in leases of a few seconds. The rest of this file runs with the other tests.
TOTALS = (
    "qos_settings_lost",
    "caps_out_of_bounds",
    "writes_outside_root",
    "tuples_lost",
    "tuples_duplicated",
    "cgroups_left",
)


@pytest.mark.serial
def test_the_quick_matrix_counts_nothing_lost_and_says_so_in_its_json(quick):
    doc = quick["doc"]
    assert quick["code"] == 0, quick["log"][-4000:]
    assert doc["benchmark"] == "faults"
    for key in TOTALS:
        assert doc["totals"][key] == 0, (key, doc["totals"], quick["log"][-3000:])
    assert doc["totals"]["crashes"] == 0
    assert doc["totals"]["not_steady"] == 0
    names = [f["name"] for f in doc["faults"]]
    assert names == list(faults.FAULTS)
    for f in doc["faults"]:
        assert {"name", "runs", "recovery_seconds_p95"} <= f.keys()
        assert f["runs"] > 0, f["name"]
        if f["name"] != "thread-exit":
            assert f["recovery_seconds_p95"] is not None and f["recovery_seconds_p95"] >= 0
    # The job ran through the whole matrix and finished every root it made.
    assert doc["tuples"]["roots"] > 0
    assert doc["tuples"]["completed"] == doc["tuples"]["roots"]
    assert doc["qos_checks"] >= 3


@pytest.mark.serial
def test_every_fault_kind_was_really_injected(quick):
    by = {f["name"]: f for f in quick["doc"]["faults"]}
    kills = by["controller-kill"]["details"]
    # Never behind the epoch the store had committed when the controller died.
    assert all(r["epoch_after_restart"] >= r["epoch_committed"] for r in kills)
    assert all(not r["epoch_went_back"] for r in kills)
    assert all(0 <= r["point_fraction"] <= 1 for r in kills)

    for r in by["agent-kill"]["details"]:
        assert r["caps_before"] == 3  # it had caps to keep
        assert r["caps_reset"] == 0
        assert r["instances_managed_after"] == 3

    (part,) = by["partition"]["details"]
    assert part["changed_within_lease"] == 0 and part["hold_node_changes"] == 0
    (stall,) = by["stall"]["details"]
    assert stall["fallback_due"]
    assert stall["fallbacks_applied"]["n2"] >= 1  # the release policy applied...
    assert stall["release_node_caps_left"] == 0  # ...and lifted every cap
    assert stall["hold_node_changes"] == 0  # while the hold node kept its caps
    for r in (part, stall):
        assert r["reports_dropped"] == 0  # the buffer held them all

    state = {r["variant"]: r for r in by["state-file"]["details"]}
    for variant in ("truncated-half", "truncated-empty"):
        assert state[variant]["start_exit"] == 2, state[variant]
        assert state[variant]["file_untouched"], state[variant]
    assert state["read-only"]["start_exit"] == 2
    full = state["disk-full"]
    assert full["controller_alive"] and full["controller_answers"]
    assert full["qos_set_exit"] != 0  # refused, not pretended

    (fuzz,) = by["fuzz"]["details"]
    assert fuzz["crashes"] == 0 and fuzz["refused_without_reason"] == 0
    for door in ("reports", "directives", "registration", "config"):
        d = fuzz["doors"][door]
        assert d["cases"] > 0 and d["crashes"] == 0
        assert d["refused_total"] > 0, door
    assert "cap_out_of_bounds" in fuzz["doors"]["directives"]["refused"]
    assert "bad_name" in fuzz["doors"]["registration"]["refused"]

    threads = by["thread-exit"]["details"]
    assert threads["crashes"] == 0 and threads["foreign_threads_capped"] == 0
    made = sum(threads["runs"].values())
    assert made >= 2  # at least the two kinds that need no pid reuse
    assert sum(v for k, v in threads["outcomes"].items() if k.endswith(":thread_gone")) == made


@pytest.mark.serial
def test_the_matrix_leaves_no_namespace_link_cgroup_or_mount(quick):
    token = quick["token"]
    from pyroute2 import IPRoute, netns

    assert not [n for n in netns.listnetns() if n.startswith(f"dsched-{token}-")]
    with IPRoute() as ip:
        links = [link.get_attr("IFLA_IFNAME") for link in ip.get_links()]
    assert not [n for n in links if n and token in n]
    assert not (CPU / f"dsched-faults-{token}").exists()
    # The controller's state tmpfs sits in the run's work directory (dsched-faults-*).
    mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
    assert not [m for m in mounts if "/dsched-faults-" in m and m.endswith("/state")]


# ------------------------------------------------------------ bad arguments
BAD = [
    (["--controller-kills", "-1"], "--controller-kills"),
    (["--agent-kills", "-3"], "--agent-kills"),
    (["--stalls", "-1"], "--stalls"),
    (["--fuzz-cases", "-5"], "--fuzz-cases"),
    (["--thread-runs", "-1"], "--thread-runs"),
    (["--partition-leases", "0"], "--partition-leases"),
    (["--partition-leases", "1,abc"], "--partition-leases"),
    (["--partition-leases", "inf"], "--partition-leases"),
    (["--partition-leases", ","], "--partition-leases"),
    (["--stall-leases", "1"], "--stall-leases"),
    (["--stall-leases", "nan"], "--stall-leases"),
    (["--slot-seconds", "0"], "--slot-seconds"),
    (["--slot-seconds", "0.1"], "--slot-seconds"),
    (["--slot-seconds", "nan"], "--slot-seconds"),
    (["--lease-epochs", "0"], "--lease-epochs"),
    (["--node-cores", "-1"], "--node-cores"),
    (["--node-cores", "100000"], "--node-cores"),
    (["--rate", "0"], "--rate"),
    (["--steady-slots", "0"], "--steady-slots"),
    (["--max-recovery-slots", "2", "--steady-slots", "3"], "--max-recovery-slots"),
    (["--faults", "controller-kill,nosuch"], "--faults"),
    (["--faults", ","], "--faults"),
    (["--controller-kills", "many"], "--controller-kills"),
]


@pytest.mark.parametrize(("argv", "flag"), BAD, ids=[" ".join(a) for a, _ in BAD])
def test_a_bad_argument_is_refused_with_status_2_before_anything_starts(
    argv, flag, tmp_path, capsys
):
    workdir = tmp_path / "work"
    before = set(os.listdir("/var/run/netns")) if os.path.isdir("/var/run/netns") else set()
    with pytest.raises(SystemExit) as exc:
        cli.main(["bench", "faults", "--workdir", str(workdir), *argv])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert flag in err, err
    assert not workdir.exists()  # nothing was started
    after = set(os.listdir("/var/run/netns")) if os.path.isdir("/var/run/netns") else set()
    assert not {n for n in after - before if n.startswith("dsched-")}


def test_help_names_every_fault_kind_and_the_run_length_options(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["bench", "faults", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for kind in faults.FAULTS:
        assert kind in out
    for flag in ("--controller-kills", "--fuzz-cases", "--quick", "--partition-leases", "--json"):
        assert flag in out


# ------------------------------------------------------------ the detectors
@pytest.fixture
def pod(cgroup_v1_cpu):
    """A pod cgroup with an agent-like root below it, removed afterwards."""
    from testbed.faults.daemons import _evacuate

    path = cgroup_v1_cpu / f"dsched-faults-test-{os.getpid()}"
    path.mkdir()
    yield path
    for d in sorted((p for p in path.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
        _evacuate(d, cgroup_v1_cpu)
        d.rmdir()
    path.rmdir()


def _write(path: Path, value: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def test_a_write_outside_the_root_is_found_and_one_inside_is_not(pod):
    from testbed.faults.audit import changed_outside, snapshot_outside

    root = pod / "agent-root"
    (root / "app" / "w").mkdir(parents=True)
    names = {"app", "agent-root", "escaped"}
    before = snapshot_outside(pod, [root], names)
    _write(root / "app" / "w" / "cpu.shares", "512")  # inside: the agent's own
    assert changed_outside(before, snapshot_outside(pod, [root], names)) == []
    _write(pod / "cpu.shares", "512")  # the anchor's setting
    (pod / "escaped").mkdir()  # a path that left the root
    changed = changed_outside(before, snapshot_outside(pod, [root], names))
    assert str(pod / "cpu.shares") in changed
    assert str(pod / "escaped") in changed


def test_the_audit_counts_a_cap_above_the_node_and_each_change(pod):
    from testbed.faults.audit import CapAudit

    root = pod / "agent-root"
    group = root / "app" / "w" / "op-0"
    group.mkdir(parents=True)
    _write(group / "cpu.cfs_period_us", "10000")
    _write(group / "cpu.cfs_quota_us", "5000")  # 0.5 cores
    audit = CapAudit({"n1": root}, capacity_cores=0.8)
    audit.look()
    assert audit.current("n1") == {"app/w/op-0": 0.5}
    assert audit.out_of_bounds == []
    t = time.monotonic()
    _write(group / "cpu.cfs_quota_us", "9000")  # 0.9 > 0.8 cores
    audit.look()
    assert [(o.cgroup, o.cap) for o in audit.out_of_bounds] == [("app/w/op-0", 0.9)]
    _write(group / "cpu.cfs_quota_us", "-1")  # no cap: never out of bounds
    audit.look()
    assert len(audit.out_of_bounds) == 1
    steps = [(c.before, c.after) for c in audit.changes_between(t, time.monotonic() + 1)]
    assert steps == [(0.5, 0.9), (0.9, None)]


# ------------------------------------------------------------ found by the matrix
def test_a_report_left_in_a_broken_stream_is_counted_as_sent_once():
    """The partitions compare reports sent with reports received: a report queued
    on a stream that broke goes back to the buffer and was counted as sent twice
    (once queued, once replayed). It counts when gRPC takes it, only then."""
    from agent.link import _Session
    from dsched_pb import dsched_pb2 as pb

    sent: list[int] = []
    session = _Session(lambda report: sent.append(report.slot))
    session.outbox.put(pb.AgentMessage(hello=pb.Hello(node_id="n1")))
    session.outbox.put(pb.AgentMessage(report=pb.NodeReport(node_id="n1", slot=1)))
    session.outbox.put(pb.AgentMessage(report=pb.NodeReport(node_id="n1", slot=2)))
    stream = session.messages()
    assert next(stream).WhichOneof("body") == "hello"
    assert sent == []
    assert next(stream).report.slot == 1
    assert sent == [1]
    # The stream breaks here: slot 2 never left and is not counted.
    (left,) = session.leftovers()
    assert left.report.slot == 2
    assert sent == [1]


def test_reports_lost_with_a_broken_stream_are_sent_again_on_the_next_one():
    """A partition loses the reports written to the connection before keepalive
    notices (the matrix counted 10 of them after every partition, gone without a
    trace). The agent now sends the last RESEND_WINDOW_SECONDS of reports again
    after a stream breaks; here the first controller "loses" what it received and
    dies, and the second gets every report, marked replayed."""
    import random

    from agent.config import AgentConfig
    from agent.link import ControllerLink
    from agent.node import NodeAgent
    from tests.test_agent_support import RecordingController, wait_for

    first = RecordingController()
    port = first.start()
    agent = NodeAgent(AgentConfig(dry_run=True, slot_seconds=1, sample_seconds=1))
    link = ControllerLink(
        agent,
        f"127.0.0.1:{port}",
        backoff_initial=0.05,
        backoff_max=0.3,
        connect_timeout=0.5,
        rng=random.Random(1),
    )
    second = RecordingController()
    link.start()
    try:
        assert link.connected.wait(10)
        for slot in (1, 2, 3):
            link.submit_report(pb_report(slot))
        assert wait_for(lambda: len(first.reports) == 3)
        first.reports.clear()  # what a dead connection does to them
        first.stop()
        second.start(port)
        assert wait_for(lambda: len(second.reports) >= 3, timeout=20)
        assert [r.slot for r in second.reports[:3]] == [1, 2, 3]
        assert all(r.replayed for r in second.reports[:3])
        resent = agent.metrics.registry.get_sample_value("dsched_agent_reports_resent_total")
        assert resent == 3
    finally:
        link.stop()
        first.stop()
        second.stop()
        agent.close()


def pb_report(slot: int):
    from dsched_pb import dsched_pb2 as pb

    return pb.NodeReport(node_id="n1", slot=slot, timestamp=1000.0 + slot, slot_seconds=1.0)


def test_the_agents_channel_retries_within_a_second_while_the_link_waits(monkeypatch):
    """After a controller restart the agents came back up to 2.6 s after it could
    take them (gRPC's reconnect backoff inside one wait of the link), past a short
    lease: the matrix counted a release fallback for it. The channel now retries
    after 0.25 s, at most 1 s apart, inside the link's own backoff."""
    import grpc

    from agent import link

    seen = {}

    def capture(target, options=None):
        seen.update(dict(options or []))
        return "channel"

    monkeypatch.setattr(grpc, "insecure_channel", capture)
    assert link.make_channel("127.0.0.1:1", link.TlsConfig()) == "channel"
    assert seen["grpc.initial_reconnect_backoff_ms"] <= 250
    assert seen["grpc.max_reconnect_backoff_ms"] <= 1000
    assert seen["grpc.keepalive_time_ms"] == 10_000
