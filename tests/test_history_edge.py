"""The controller's history edge: cluster state to spool rows, history table to a seed.

No Controller and no Spark: the edge gets a cluster with the attributes it reads
and a history table written as the streaming job writes it.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from types import SimpleNamespace

import pytest

from controller.edges.history import HistoryEdge, HistorySeed, history_config
from controller.model import InstanceHistory, InstanceSlot
from dsched.ids import InstanceKey, OperatorKey
from dsched_pb import dsched_pb2 as pb
from spark_stream.config import HistoryConfig
from spark_stream.feed import SEED_PER_EPOCH, HistoryFeed
from tests import test_history_samples as H
from tests.test_history_feed import _table


def _slot(key: InstanceKey, timestamp: float, arrivals: float) -> InstanceSlot:
    return InstanceSlot(
        key=key,
        node="n1",
        worker="w1",
        stateful=key.operator == "count",
        slot=int(timestamp),
        timestamp=timestamp,
        seconds=1.0,
        arrivals=arrivals,
        executed=arrivals - 1,
        emitted=2 * arrivals,
        cpu_seconds=0.01,
        queue_length=3.0,
        latency_sum_seconds=0.5,
        latency_count=5.0,
        service_seconds=0.02,
        cap_cores=None if key.instance else 0.5,
        throttled_seconds=None,
    )


def _cluster(slots: list[InstanceSlot]) -> SimpleNamespace:
    histories = {}
    for s in slots:
        h = histories.get(s.key) or InstanceHistory.empty(s, depth=3)
        h.add(s)
        histories[s.key] = h
    sample = pb.NodeSample(
        cpu_usage_cores=0.7,
        memory_bandwidth_bytes_per_second={"wc": 1e9, "http": 5e8},
        memory_bandwidth_available=True,
    )
    agents = {
        "n1": SimpleNamespace(node_sample=sample, cpu_capacity_cores=2.0),
        "n2": SimpleNamespace(node_sample=None, cpu_capacity_cores=4.0),
    }
    return SimpleNamespace(histories=histories, agents=agents)


def _rows(edge: HistoryEdge, slot: int) -> list[dict]:
    assert edge.flush()
    (path,) = edge.config.spool_dir.glob(f"slot-{slot:012d}-*.json")
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_spool_writes_each_instance_slot_once_and_every_node_sample(tmp_path):
    edge = HistoryEdge(HistoryFeed(HistoryConfig.under(tmp_path, slot_seconds=1.0)))
    src, split = InstanceKey("wc", "source", 0), InstanceKey("wc", "split", 1)
    cluster = _cluster(
        [_slot(src, H.T0, 10.0), _slot(src, H.T0 + 1, 11.0), _slot(split, H.T0, 7.0)]
    )
    edge.spool(1, H.T0 + 1, cluster, {"epoch": 1})
    rows = _rows(edge, 1)
    inst = {(r["operator"], r["instance"]): r for r in rows if r["kind"] == "instance"}
    assert set(inst) == {("source", 0), ("split", 1)}
    # The newest slot of each instance, under the spool's field names.
    assert inst[("source", 0)]["arrivals"] == 11.0 and inst[("source", 0)]["executed"] == 10.0
    assert inst[("source", 0)]["cap_cores"] == 0.5 and inst[("split", 1)]["cap_cores"] is None
    assert inst[("split", 1)]["worker"] == "w1" and inst[("split", 1)]["app"] == "wc"
    (node,) = [r for r in rows if r["kind"] == "node"]
    assert node["node"] == "n1" and node["cpu_capacity_cores"] == 2.0
    assert node["memory_bandwidth_bytes_per_second"] == 1.5e9
    assert node["llc_occupancy_bytes"] is None  # not measured: missing, never zero
    assert json.loads(rows[-2]["decision"]) == {"epoch": 1}

    # Nothing new: no instance row again; the node is spooled every slot.
    edge.spool(2, H.T0 + 2, cluster, None)
    assert [r["kind"] for r in _rows(edge, 2)] == ["node", "slot", "tick"]
    # A vanished instance is forgotten: when it comes back, its slot is spooled again.
    edge.spool(3, H.T0 + 3, _cluster([_slot(src, H.T0 + 1, 11.0)]), None)
    edge.spool(4, H.T0 + 4, cluster, None)
    assert [(r["operator"], r["arrivals"]) for r in _rows(edge, 4) if r["kind"] == "instance"] == [
        ("split", 7.0)
    ]
    edge.stop()


def test_seed_returns_what_the_table_holds_and_mutates_nothing(tmp_path):
    config = HistoryConfig.under(tmp_path)
    _table(config)
    edge = HistoryEdge(HistoryFeed(config))
    views = {
        OperatorKey("wc", "source"): SimpleNamespace(upstream=()),
        OperatorKey("wc", "split"): SimpleNamespace(upstream=("source",)),
        OperatorKey("wc", "count"): SimpleNamespace(upstream=("split",)),
    }
    before = copy.deepcopy(views)
    files = sorted(p for p in config.table_dir.rglob("*"))
    seed = edge.seed(views)
    assert seed == HistorySeed(
        kappa={OperatorKey("wc", "source"): 0.002, OperatorKey("wc", "split"): 0.003},
        source_rates={OperatorKey("wc", "source"): tuple(float(r) for r in range(1, 13))},
    )
    assert all(type(k) is OperatorKey for k in [*seed.kappa, *seed.source_rates])
    assert views == before and sorted(p for p in config.table_dir.rglob("*")) == files
    with pytest.raises(dataclasses.FrozenInstanceError):
        seed.kappa = {}
    # Asked once: the next epoch's seed is empty.
    assert edge.seed(views) == HistorySeed(kappa={}, source_rates={})
    edge.stop()


def test_seed_spreads_a_restart_over_epochs(tmp_path):
    config = HistoryConfig.under(tmp_path)
    ops = [f"op{i:02d}" for i in range(SEED_PER_EPOCH + 1)]
    H.write_operator_table(config, [H.operator_window("wc", op, 0, 10.0) for op in ops])
    edge = HistoryEdge(HistoryFeed(config))
    views = {OperatorKey("wc", op): SimpleNamespace(upstream=()) for op in ops}
    assert len(edge.seed(views).source_rates) == SEED_PER_EPOCH
    assert edge.seed(views).source_rates == {OperatorKey("wc", ops[-1]): (1.0,)}
    edge.stop()


def test_open_rebases_the_history_under_the_controllers_state_and_slot(tmp_path):
    edge = HistoryEdge.open(HistoryConfig(), tmp_path / "state", 2.0)
    assert edge.config == history_config(HistoryConfig(), tmp_path / "state", 2.0)
    assert edge.config.spool_dir == tmp_path / "state/history/spool"
    assert edge.config.slot_seconds == 2.0
    assert edge.lag_seconds() is None and edge.status()["spool_bytes"] == 0
    edge.stop()
