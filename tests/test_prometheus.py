"""A real Prometheus scrapes real dsched daemons; the rules and the dashboard run on it.

One `dsched-controller` (with its embedded Spark history, as the daemon runs by
default, so `dsched_history_lag_seconds` exists) and two `dsched-agent`
subprocesses, each agent with a live WordCount registering its threads, in
dry-run (no cgroup is touched). A Prometheus on loopback scrapes all three every
second with deploy/prometheus/dsched-rules.yml loaded, in the job layout of
deploy/prometheus/prometheus.yml. `promtool` checks the raw /metrics of both
daemons, the rules and the example configuration, and runs the rules' unit tests.
Every query of deploy/grafana/dsched.json must return at least one series.
"""

from __future__ import annotations

import json
import os
import time

import pytest

from dsched_pb import dsched_pb2 as pb
from testbed.live.cluster import LocalCluster, NodeSpec, scrape
from testbed.live.engine import LiveTopology
from testbed.live.wordcount import wordcount

from .prometheus_support import (
    DASHBOARD,
    EXAMPLE_CONFIG,
    RULE_TESTS,
    RULES,
    Prometheus,
    dashboard_variables,
    panel_targets,
    promtool,
    substitute,
    tool,
    wait_for,
)

SLOT = 1.0
NODES = ("n1", "n2")
# Gold's target is far below what a WordCount on a shared machine achieves, so
# gold violates and the violation series exist.
QOS = {
    "default_class": "bronze",
    "classes": {
        "gold": {"target_latency_ms": 1.0, "max_violation_ratio": 0.01, "weight": 8.0},
        "bronze": {"target_latency_ms": 5000.0, "max_violation_ratio": 0.5, "weight": 1.0},
    },
}
# The embedded history on one Spark core, batches every half second.
HISTORY = {"spark_master": "local[1]", "shuffle_partitions": 1, "trigger_seconds": 0.5}
TIMEOUT = 90.0
_CONTROLLER_CAPS = 'dsched_instance_cpu_cap_cores{job="dsched-controller"}'


# ------------------------------------------------------------ no daemons needed
def test_promtool_checks_the_rules_the_example_config_and_runs_the_rule_tests():
    checked = promtool("check", "rules", str(RULES))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    config = promtool("check", "config", str(EXAMPLE_CONFIG))
    assert config.returncode == 0, config.stdout + config.stderr
    assert RULE_TESTS, "no rule unit tests in deploy/prometheus/tests"
    tested = promtool("test", "rules", *map(str, RULE_TESTS))
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout


def test_every_alert_has_a_summary_and_a_runbook_and_a_unit_test():
    text = RULES.read_text()
    alerts = [line.split(":", 1)[1].strip() for line in text.splitlines() if "- alert:" in line]
    assert len(alerts) >= 7
    tests = "\n".join(p.read_text() for p in RULE_TESTS)
    for name in alerts:
        block = text.split(f"- alert: {name}\n", 1)[1].split("- alert:", 1)[0]
        assert "summary:" in block and "runbook:" in block, name
        assert f"alertname: {name}\n" in tests, f"{name} has no promtool unit test"


def test_dashboard_is_a_grafana_model_on_a_prometheus_datasource_variable():
    dash = json.loads(DASHBOARD.read_text())
    assert dash["uid"] and dash["title"] and isinstance(dash["schemaVersion"], int)
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dash["panels"]:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"], panel["title"]
        assert {"x", "y", "w", "h"} <= set(panel["gridPos"]), panel["title"]
    titles = " ".join(p["title"].lower() for p in dash["panels"])
    for words in (
        "cpu by qos class",
        "cap vs usage",
        "predicted",
        "latency estimate vs target",
        "violations",
        "epoch time",
        "history lag",
    ):
        assert words in titles, words


# ------------------------------------------------------------ the live stack
def live(test):
    """Daemons, a JVM for the history and Prometheus: seconds to minutes."""
    return pytest.mark.slow(pytest.mark.spark(test))


class Stack:
    def __init__(self, cluster: LocalCluster, prom: Prometheus):
        self.cluster = cluster
        self.prom = prom


def _scrape_configs(cluster: LocalCluster) -> list[dict]:
    """The job layout of deploy/prometheus/prometheus.yml, on this cluster's ports."""
    return [
        {"job_name": "dsched-controller", "static_configs": [{"targets": [cluster.metrics]}]},
        {
            "job_name": "dsched-agent",
            "static_configs": [
                {"targets": [cluster.agents[n].metrics], "labels": {"node": n}} for n in NODES
            ],
        },
    ]


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    tool("prometheus")
    tool("promtool")
    workdir = tmp_path_factory.mktemp("prometheus")
    cluster = LocalCluster(
        workdir / "cluster",
        mode="dry-run",
        slot_seconds=SLOT,
        agent_dry_run=True,
        controller_config={"qos": QOS, "history": HISTORY},
        nodes=[NodeSpec(n, cgroup_root=f"dsched-prom-{os.getpid()}-{n}") for n in NODES],
        history=True,
    )
    topologies = []
    with cluster:
        cluster.admin().SetQos(pb.SetQosRequest(app="gold-wc", qos_class="gold"), timeout=5)
        try:
            for i, (app, node) in enumerate((("gold-wc", "n1"), ("bronze-wc", "n2"))):
                topo = LiveTopology(
                    wordcount(app=app, parallelism=1),
                    lambda t: 20.0,
                    node=node,
                    agent_socket=str(cluster.agents[node].socket),
                    cpu="thread",
                    seed=i,
                )
                topo.start()
                topologies.append(topo)
            prom = Prometheus(workdir / "prometheus", _scrape_configs(cluster), rule_files=[RULES])
            with prom:
                yield Stack(cluster, prom)
        finally:
            for topo in topologies:
                topo.stop(drain_timeout=1.0)


@live
def test_promtool_check_metrics_passes_on_both_daemons(stack):
    endpoints = {"controller": stack.cluster.metrics}
    endpoints.update({f"agent {n}": stack.cluster.agents[n].metrics for n in NODES})
    for name, address in endpoints.items():
        text = scrape(address)
        assert "dsched_" in text, name
        result = promtool("check", "metrics", stdin=text)
        assert result.returncode == 0, f"{name}: {result.stdout}{result.stderr}"
        assert not (result.stdout + result.stderr).strip(), f"{name}: {result.stdout}"


@live
def test_prometheus_scrapes_the_daemons_and_sees_sane_values(stack):
    prom = stack.prom
    # Every target up, scraped at least twice.
    wait_for(
        lambda: (
            len(prom.values("count_over_time(up[1m]) >= 2")) == 1 + len(NODES)
            and prom.values("min(up)") == [1.0]
        ),
        TIMEOUT,
        "two scrapes of the controller and both agents",
    )
    wait_for(
        lambda: prom.values('dsched_agents_connected{job="dsched-controller"}') == [2.0],
        TIMEOUT,
        "dsched_agents_connected = 2",
    )
    agents = prom.query('dsched_agent_connected{job="dsched-agent"}')
    assert {r["metric"]["node"]: float(r["value"][1]) for r in agents} == dict.fromkeys(NODES, 1.0)

    # Caps decided for both nodes' instances, each within (0, the node's cores].
    def caps_on_both_nodes():
        rows = prom.query(_CONTROLLER_CAPS)
        return rows if {r["metric"]["node"] for r in rows} == set(NODES) else None

    caps = wait_for(caps_on_both_nodes, TIMEOUT, "caps decided on both nodes")
    plan = stack.cluster.plan()
    capacity = plan["capacity_cores"]
    for row in caps:
        node, value = row["metric"]["node"], float(row["value"][1])
        assert 0 < value <= capacity[node], row
        # The operator instance's number has its own label, beside the target's
        # `instance`, which Prometheus therefore did not have to rename.
        assert row["metric"]["instance_id"].isdigit(), row["metric"]
        assert "exported_instance" not in row["metric"], row["metric"]
    usage = prom.query('dsched_instance_cpu_usage_cores{job="dsched-agent"}')
    assert {r["metric"]["node"] for r in usage} == set(NODES)
    assert all(0 <= float(r["value"][1]) <= capacity[r["metric"]["node"]] for r in usage)
    assert all(r["metric"]["instance_id"].isdigit() for r in usage), usage
    assert not any("exported_instance" in r["metric"] for r in usage), usage
    # The controller's cap name is the controller's alone (an agent's enforced cap,
    # absent in dry-run, is dsched_agent_instance_cpu_cap_cores).
    assert prom.query('dsched_instance_cpu_cap_cores{job="dsched-agent"}') == []

    # What the controller exports of its configuration and its decision.
    def by_label(expr: str, label: str) -> dict[str, float]:
        return {r["metric"][label]: float(r["value"][1]) for r in prom.query(expr)}

    classes = QOS["classes"]
    assert by_label("dsched_qos_class_target_latency_seconds", "class") == {
        name: c["target_latency_ms"] / 1000.0 for name, c in classes.items()
    }
    assert by_label("dsched_qos_class_max_violation_ratio", "class") == {
        name: c["max_violation_ratio"] for name, c in classes.items()
    }
    assert by_label("dsched_qos_class_weight", "class") == {
        name: c["weight"] for name, c in classes.items()
    }
    assert prom.values('dsched_slot_seconds{job="dsched-controller"}') == [SLOT]
    assert by_label("dsched_node_capacity_cores", "node") == pytest.approx(capacity)
    assigned = {
        r["metric"]["app"]: r["metric"]["class"] for r in prom.query("dsched_app_qos_class")
    }
    assert assigned == {"gold-wc": "gold", "bronze-wc": "bronze"}

    # The epoch counter rises between two queries.
    first = prom.values('dsched_controller_epoch{job="dsched-controller"}')
    assert len(first) == 1 and first[0] >= 1
    wait_for(
        lambda: prom.values('dsched_controller_epoch{job="dsched-controller"}')[0] > first[0],
        TIMEOUT,
        "a higher epoch in Prometheus",
    )
    assert prom.values('dsched_dry_run{job="dsched-controller"}') == [1.0]


@live
def test_rules_evaluate_without_error_on_the_live_series(stack):
    prom = stack.prom
    for expr in (
        "class:dsched_app_allocated_cores:sum",
        "app_operator:dsched_instance_cpu_cap_cores:sum",
        "app_operator:dsched_instance_cpu_usage_cores:sum",
        'app:dsched_app_qos_violations:ratio5m{class="gold"}',
        "app:dsched_app_latency_target_seconds",
        "app:dsched_app_qos_max_violation_ratio",
        "job:dsched_node_capacity_cores:sum",
    ):
        wait_for(lambda e=expr: prom.query(e), TIMEOUT, f"recording rule {expr}")
    by_class = {
        r["metric"]["class"]: float(r["value"][1])
        for r in prom.query("class:dsched_app_allocated_cores:sum")
    }
    assert set(by_class) == {"gold", "bronze"} and all(v > 0 for v in by_class.values())
    # Each application's target is its class's, from the controller's own gauges.
    targets = {
        r["metric"]["app"]: float(r["value"][1])
        for r in prom.query("app:dsched_app_latency_target_seconds")
    }
    assert targets == {"gold-wc": 0.001, "bronze-wc": 5.0}
    # The dry-run alert is pending on the real dsched_dry_run (it fires after a day).
    wait_for(
        lambda: prom.query('ALERTS{alertname="DschedDryRunTooLong", alertstate="pending"}'),
        TIMEOUT,
        "DschedDryRunTooLong pending",
    )
    groups = prom.api("rules")["groups"]
    rules = [r for g in groups for r in g["rules"]]
    assert len(rules) >= 20
    bad = [(r["name"], r.get("lastError")) for r in rules if r["health"] == "err"]
    assert not bad, bad
    # The controller runs its epochs and both agents stay connected: none of
    # those alerts is even pending (gold's violations and a history still
    # catching up after Spark's start may well be).
    active = {r["metric"]["alertname"] for r in prom.query("ALERTS")}
    healthy = {
        "DschedControllerDown",
        "DschedEpochLoopStalled",
        "DschedAgentsMissing",
        "DschedAgentsNotConnected",
    }
    assert not active & healthy, active


@live
def test_every_dashboard_query_returns_series(stack):
    dash = json.loads(DASHBOARD.read_text())
    variables = dashboard_variables(dash)
    assert variables["job"] == "dsched-controller" and variables["agent_job"] == "dsched-agent"
    queries = {}
    for title, ref, expr in panel_targets(dash):
        query = substitute(expr, variables)
        assert "$" not in query, (title, query)
        queries[f"{title} [{ref}]"] = query
    assert len(queries) >= 10
    pending = dict(queries)
    # Every series is there within a few scrapes: the history lag too, counted from
    # the first slot spooled while Spark's first window (minutes on a loaded
    # machine) is still to come.
    deadline = time.monotonic() + TIMEOUT
    while pending and time.monotonic() < deadline:
        for name, query in list(pending.items()):
            if stack.prom.query(query):
                del pending[name]
        time.sleep(1.0)
    assert not pending, f"dashboard queries with no series: {pending}"
