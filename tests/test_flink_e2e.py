"""dsched steering a real Apache Flink cluster, end to end, as an operator runs it.

Real Flink 2.3 (JobManager + TaskManagers from the wheels), real
`dsched-controller` and `dsched-agent` processes with `[[engine]] kind =
"flink"`, real `dschedctl`, real cgroups:

- two jobs, gold and bronze, share a node too small for both; in dry-run the
  plan and `dschedctl explain` show every subtask's rate, prediction, CPU per
  record and recommended cap, and nothing is written to the cgroup tree;
  `dschedctl mode enforce` caps every subtask's threads, usage stays under the
  caps, the DP cuts bronze before gold, both jobs keep running; cancelling a job
  removes its cgroups;
- two TaskManagers as two nodes, one agent each: every subtask's cap goes to
  the node whose TaskManager runs it, and placement only recommends.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent.sampling import thread_cpu_seconds
from dsched_pb import dsched_pb2 as pb
from testbed.flink.cluster import TM_CLASS, FlinkCluster
from testbed.flink.job import submit_wordcount
from testbed.flink.load import TraceFeeder
from testbed.live.cluster import CGROUP_V1_CPU, LocalCluster, NodeSpec, remove_cgroup_tree

from .conftest import require_cgroups
from .flink_support import require_flink

pytestmark = pytest.mark.slow

SLOT = 1.0
VERTICES = ("Source:_src_1", "Calc_2", "GroupAggregate_4")  # and the sink
PARALLELISM = {"gold-wc": 2, "bronze-wc": 1}
QOS = {
    "default_class": "bronze",
    "classes": {
        "gold": {"target_latency_ms": 2000.0, "max_violation_ratio": 0.05, "weight": 8.0},
        "bronze": {"target_latency_ms": 20000.0, "max_violation_ratio": 0.5, "weight": 1.0},
    },
}


@pytest.fixture
def cgroup_root_name(tmp_path):
    require_cgroups()
    name = f"dsched-flink-{os.getpid()}-{tmp_path.name[-20:]}"
    yield name
    remove_cgroup_tree(CGROUP_V1_CPU / name)


def _engine(flink: FlinkCluster, resource_id: str | None = None) -> tuple[dict, dict]:
    tm = re.escape(TM_CLASS) + ".*" + re.escape(str(flink.conf_dir))
    if resource_id is not None:
        tm += r".*taskmanager\.resource-id=" + re.escape(resource_id) + r"\b"
    return (
        {"kind": "flink", "rest_url": flink.rest_url},
        {"kind": "flink", "rest_url": flink.rest_url, "taskmanager_cmdline": tm},
    )


def _ctl(cluster: LocalCluster, *args: str) -> str:
    done = subprocess.run(
        [str(Path(sys.executable).parent / "dschedctl"), "--address", cluster.admin_address, *args],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _wait(what: str, check, timeout: float = 60.0, every: float = 0.5):
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(every)


def _division_cut(rec: dict, app: str) -> float:
    """The cores the division (the QoS DP) cut from ``app`` in a record: the
    ``qos-dp`` part of each of its cut reasons."""
    return sum(
        float(m.group(1))
        for c in rec["cuts"]
        if c["app"] == app
        for m in [re.search(r"qos-dp ([0-9.]+)", c["reason"])]
        if m
    )


def _instance_cgroups(root: Path, app: str) -> dict[str, Path]:
    """``operator-index`` -> cgroup dir of ``app``'s instances under ``root``."""
    out = {}
    for d in (root / app).glob("*/*"):
        if d.is_dir():
            out[d.name] = d
    return out


def _quota_cores(d: Path) -> float | None:
    quota = int((d / "cpu.cfs_quota_us").read_text())
    period = int((d / "cpu.cfs_period_us").read_text())
    return None if quota < 0 else quota / period


def _cpu_seconds(d: Path) -> dict[int, float]:
    """CPU seconds of each thread in cgroup ``d`` (this machine's cpu hierarchy has
    no cpuacct files)."""
    out = {}
    for tid in map(int, (d / "tasks").read_text().split()):
        seconds = thread_cpu_seconds("/proc", tid, tid)
        if seconds is not None:
            out[tid] = seconds
    return out


def _usage_cores(dirs: dict[str, Path], seconds: float) -> dict[str, float]:
    """Cores used by each cgroup's threads over ``seconds`` (threads present at both ends)."""
    before = {k: _cpu_seconds(d) for k, d in dirs.items()}
    time.sleep(seconds)
    after = {k: _cpu_seconds(d) for k, d in dirs.items()}
    return {
        k: sum(after[k][t] - before[k][t] for t in after[k].keys() & before[k].keys()) / seconds
        for k in dirs
    }


def _vid(flink: FlinkCluster, jid: str, vertex_name: str) -> str:
    return next(
        v["id"] for v in flink.rest.get(f"/jobs/{jid}")["vertices"] if v["name"] == vertex_name
    )


def _operators(rec: dict, app: str) -> dict[str, dict]:
    return {o["operator"]: o for o in rec["operators"] if o["app"] == app}


def _measured(rec: dict | None, apps: tuple[str, ...]) -> bool:
    """Every vertex of ``apps`` in ``rec`` with arrivals and a forecast above 0.

    Flink's REST metric store refreshes once a second here, as often as a slot
    ends, so one slot can see a vertex's counters move by two refreshes and the
    next by none: the least-squares line through such slots falls steeply and
    its forecast is floored at 0 for that epoch. A record that shows the capability under test is one where the
    counters had arrived."""
    if not rec:
        return False
    for app in apps:
        ops = _operators(rec, app)
        if not all(
            v in ops and ops[v]["arrival_rate"] > 0 and ops[v]["predicted_rate"] > 0
            for v in VERTICES
        ):
            return False
    return True


def test_dry_run_then_enforce_two_classes_then_cancel(flink_cluster, tmp_path, cgroup_root_name):
    flink = flink_cluster
    root = CGROUP_V1_CPU / cgroup_root_name
    ctrl_engine, agent_engine = _engine(flink)
    jobs, feeders = {}, []
    cluster = LocalCluster(
        tmp_path / "dsched",
        mode="dry-run",
        slot_seconds=SLOT,
        controller_config={
            "theta_cores": 0.01,
            "headroom_cores": 0.05,
            "min_cap_cores": 0.02,
            "predictors": ["linear_trend", "dag"],
            # Too small for both jobs: the DP has to choose.
            "node_capacity_cores": {"local": 0.45},
            "qos": QOS,
            "engine": [ctrl_engine],
        },
        nodes=[
            NodeSpec(
                "local",
                cgroup_root=cgroup_root_name,
                extra_config={"cpu_period_us": 10_000, "engine": [agent_engine]},
            )
        ],
    )
    try:
        # Thread names carry no job id: two jobs of the same SQL on one TaskManager
        # are told apart by their parallelism, which the names do carry.
        for app, parallelism in PARALLELISM.items():
            jobs[app] = submit_wordcount(
                flink, tmp_path / f"{app}-in", app, parallelism=parallelism
            )
        for app, jid in jobs.items():
            flink.wait_running(jid, timeout=120)
            feeders.append(TraceFeeder(tmp_path / f"{app}-in", 1500.0).start())
        cluster.start()
        cluster.admin().SetQos(pb.SetQosRequest(app="gold-wc", qos_class="gold"), timeout=5)

        # Dry-run: every subtask measured and planned, the cgroup tree untouched.
        rec = _wait(
            "a plan with both jobs measured",
            lambda: (r := cluster.plan()) and _measured(r, tuple(jobs)) and r,
            90,
        )
        assert rec["mode"] == "dry-run"
        for app in jobs:
            ops = _operators(rec, app)
            for v in VERTICES:
                assert ops[v]["instances"] == PARALLELISM[app]
                assert ops[v]["predicted_rate"] > 0
                assert ops[v]["cap_cores"] > 0
        keys = {(i["app"], i["operator"], i["instance"]) for i in rec["instances"]}
        assert {("gold-wc", "Calc_2", 0), ("gold-wc", "Calc_2", 1)} <= keys
        # dschedctl reads the newest record, which can be one where a slot's Flink
        # counters were late (its subtasks held, out of the operator rows).
        plan = _wait(
            "dschedctl plan with both jobs measured",
            lambda: (
                (p := json.loads(_ctl(cluster, "--json", "plan")))
                and _measured(p, tuple(jobs))
                and p
            ),
            60,
        )
        rows = {(o["app"], o["operator"]): o for o in plan["operators"]}
        calc = rows[("gold-wc", "Calc_2")]
        # Rate, prediction, CPU per record (kappa), recommended cap and why.
        assert calc["arrival_rate"] > 0 and calc["predicted_rate"] > 0
        assert calc["kappa"] > 0 and calc["cap_cores"] > 0 and calc["reason"]
        per_subtask = [i for i in plan["instances"] if i["app"] == "gold-wc"]
        assert len(per_subtask) == 4 * PARALLELISM["gold-wc"]
        assert all(i["cap_cores"] > 0 and i["demand_reason"] for i in per_subtask)
        story = json.loads(_ctl(cluster, "--json", "explain", "gold-wc"))
        assert story and "gold" in json.dumps(story)
        assert not root.exists(), "dry-run wrote to the cgroup tree"

        # Enforce: caps on every subtask's threads; the DP cuts bronze first.
        _ctl(cluster, "mode", "enforce")

        def all_capped():
            found = {app: _instance_cgroups(root, app) for app in jobs}
            if not all(len(v) >= 4 * PARALLELISM[app] for app, v in found.items()):
                return None
            caps = {app: {k: _quota_cores(d) for k, d in v.items()} for app, v in found.items()}
            return found if all(c is not None for v in caps.values() for c in v.values()) else None

        found = _wait("caps on all 12 subtasks", all_capped, 60)
        gold = found["gold-wc"]
        assert set(gold) >= {f"{v}-{i}" for v in VERTICES for i in (0, 1)}
        # Each instance cgroup holds that subtask's threads.
        for d in gold.values():
            assert (d / "tasks").read_text().split()
        usage = _usage_cores(gold, 3.0)
        for k, d in gold.items():
            cap = _quota_cores(d)
            if cap is not None:  # a cap may be released between the two reads
                assert usage[k] <= cap + 0.05, f"{k}: {usage[k]:.3f} cores under a {cap:.3f} cap"
        time.sleep(4 * SLOT)
        records = cluster.decisions(last=8)
        (tmp_path / "records.json").write_text(json.dumps(records))
        enforce = [r for r in records if r["mode"] == "enforce" and r.get("apps")]
        assert enforce, "no enforce epoch recorded"
        by_app = [{a["app"]: a for a in r["apps"]} for r in enforce]
        short = [
            (a, r)
            for a, r in zip(by_app, enforce, strict=True)
            if a["bronze-wc"]["cut_cores"] + a["gold-wc"]["cut_cores"] > 0
        ]
        assert short, "the node was never short"
        for a, r in short:
            # Bronze gives first (cut, or already at its floors with nothing to give);
            # gold loses CPU to the division only once bronze is down to its floors.
            # (A flow cut, CPU gold's parents could not use, is no part of the division.)
            bronze_at_floors = (
                a["bronze-wc"]["allocated_cores"] <= a["bronze-wc"]["floor_cores"] + 1e-6
            )
            assert a["bronze-wc"]["cut_cores"] > 0 or bronze_at_floors
            if _division_cut(r, "gold-wc") > 0.005:
                assert a["bronze-wc"]["allocated_cores"] <= a["bronze-wc"]["floor_cores"] + 1e-6
        for jid in jobs.values():
            assert flink.job_state(jid) == "RUNNING"

        # Cancelling a job removes every cgroup of it, and only of it.
        flink.cancel(jobs.pop("bronze-wc"))
        _wait("bronze's cgroups removed", lambda: not _instance_cgroups(root, "bronze-wc"), 30)
        assert _instance_cgroups(root, "gold-wc")
    finally:
        for f in feeders:
            f.stop()
        for jid in jobs.values():
            try:
                flink.cancel(jid)
            except Exception:
                pass
        cluster.stop()


@pytest.fixture(scope="module")
def flink_two_tms(tmp_path_factory):
    home = require_flink()
    # One slot each: a job of parallelism 2 runs one subtask of every vertex on each.
    cluster = FlinkCluster(tmp_path_factory.mktemp("flink2"), home=home)
    cluster.start(taskmanagers=2, slots=1)
    try:
        yield cluster
    finally:
        cluster.stop()


def test_two_taskmanagers_two_nodes_caps_go_to_the_right_node(
    flink_two_tms, tmp_path, cgroup_root_name
):
    flink = flink_two_tms
    tms = flink.taskmanagers()  # resource id -> pid
    assert len(tms) == 2
    nodes = {}
    for k, rid in enumerate(sorted(tms), start=1):
        ctrl_engine, agent_engine = _engine(flink, rid)
        nodes[f"n{k}"] = (rid, f"{cgroup_root_name}-n{k}", agent_engine)
    cluster = LocalCluster(
        tmp_path / "dsched",
        mode="enforce",
        slot_seconds=SLOT,
        controller_config={
            "theta_cores": 0.01,
            "min_cap_cores": 0.02,
            "engine": [ctrl_engine],
            "placement": "liu",
            # n1 is too small for its subtasks: placement would move some to n2.
            "node_capacity_cores": {"n1": 0.12, "n2": 1.5},
        },
        nodes=[
            NodeSpec(
                node, cgroup_root=croot, extra_config={"cpu_period_us": 10_000, "engine": [eng]}
            )
            for node, (_rid, croot, eng) in nodes.items()
        ],
    )
    jid = submit_wordcount(flink, tmp_path / "in", "wc2", parallelism=2)
    feeder = None
    try:
        flink.wait_running(jid, timeout=120)
        feeder = TraceFeeder(tmp_path / "in", 800.0).start()
        cluster.start()

        # Where Flink runs each subtask, by its own account (a subtask reads
        # "(unassigned)" for a moment after the job turns RUNNING).
        def placed():
            where = {}
            detail = flink.rest.get(f"/jobs/{jid}")
            for v in detail["vertices"]:
                sub = flink.rest.get(f"/jobs/{jid}/vertices/{v['id']}")
                for s in sub["subtasks"]:
                    where[(v["name"], s["subtask"])] = s["taskmanager-id"]
            return where if "(unassigned)" not in where.values() else None

        where = _wait("every subtask on a taskmanager", placed, 60)
        rid_node = {rid: node for node, (rid, _c, _e) in nodes.items()}

        def capped_everywhere():
            return all(
                len(_instance_cgroups(CGROUP_V1_CPU / croot, "wc2")) >= 4
                for _rid, croot, _e in nodes.values()
            )

        _wait("caps on both nodes", capped_everywhere, 90)
        rec = cluster.plan()
        from dsched.engines.flink import safe_name

        expected = {(safe_name(v), i): rid_node[tm] for (v, i), tm in where.items()}
        for inst in rec["instances"]:
            node = expected[(inst["operator"], inst["instance"])]
            assert inst["node"] == node
            croot = CGROUP_V1_CPU / nodes[node][1]
            other = CGROUP_V1_CPU / nodes["n2" if node == "n1" else "n1"][1]
            name = f"{inst['operator']}-{inst['instance']}"
            assert name in _instance_cgroups(croot, "wc2")
            assert name not in _instance_cgroups(other, "wc2")

        # Placement never moves a Flink subtask: it recommends, saying why.
        def placement_plans():
            return [
                r["placement"]
                for r in cluster.decisions(last=50)
                if (r.get("placement") or {}).get("planned")
            ]

        plans = _wait("a placement plan", placement_plans, 60)
        assert any(p["recommended"] for p in plans)
        for p in plans:
            assert p["moves"] == []
            assert all("flink places subtasks itself" in m["reason"] for m in p["recommended"])
            assert not (p.get("result") or {}).get("moved")
        for (v, i), tm in where.items():  # still where Flink put them
            sub = flink.rest.get(f"/jobs/{jid}/vertices/{_vid(flink, jid, v)}")
            assert sub["subtasks"][i]["taskmanager-id"] == tm
    finally:
        if feeder is not None:
            feeder.stop()
        try:
            flink.cancel(jid)
        except Exception:
            pass
        cluster.stop()
        for _rid, croot, _e in nodes.values():
            remove_cgroup_tree(CGROUP_V1_CPU / croot)
