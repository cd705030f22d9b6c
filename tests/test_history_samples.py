"""Known spool input for the history tests: deterministic samples with known sums.

Holds no tests itself; the history test modules import it.
"""

from __future__ import annotations

import pandas as pd

from spark_stream import job
from spark_stream import schema as S

T0 = 1_700_000_000.0
SLOT_SECONDS = 10.0
OPERATORS = [("wc", "split", 2), ("wc", "count", 3), ("http", "parse", 1)]
NODES = ["n1", "n2"]


def instance_sample(app: str, operator: str, instance: int, slot: int) -> dict:
    arrivals = 100.0 * (slot + 1) + 10 * instance
    return {
        "app": app,
        "operator": operator,
        "instance": instance,
        "node": NODES[instance % 2],
        "worker": f"{app}-w{instance % 2}",
        "stateful": operator == "count",
        "arrivals": arrivals,
        "executed": arrivals - 1,
        "emitted": 2 * (arrivals - 1),
        "cpu_seconds": 0.001 * (arrivals - 1),
        "queue_length": float(instance + 1),
        "latency_sum_seconds": 0.5,
        "latency_count": 10.0,
        "service_seconds": 0.01,
        "cap_cores": 0.5 if instance == 0 else None,
    }


def node_sample(node: str, slot: int) -> dict:
    return {
        "node": node,
        "cpu_capacity_cores": 2.0,
        "cpu_usage_cores": 0.1 * slot,
        "memory_bandwidth_bytes_per_second": 1e9 if node == "n1" else None,
        "llc_occupancy_bytes": None,
    }


def slot_samples(slot: int) -> tuple[list[dict], list[dict]]:
    instances = [
        instance_sample(app, op, i, slot) for app, op, count in OPERATORS for i in range(count)
    ]
    return instances, [node_sample(n, slot) for n in NODES]


def write_slots(writer, slots) -> None:
    for slot in slots:
        instances, nodes = slot_samples(slot)
        writer.write_slot(
            slot,
            T0 + SLOT_SECONDS * slot,
            SLOT_SECONDS,
            instances,
            nodes,
            {"slot": slot, "caps": {"wc/split/0": 0.5}},
        )


def expected_operator(app: str, operator: str, slot: int) -> dict:
    count = dict(((a, o), c) for a, o, c in OPERATORS)[(app, operator)]
    samples = [instance_sample(app, operator, i, slot) for i in range(count)]
    return {
        k: sum(s[k] for s in samples)
        for k in ("arrivals", "executed", "emitted", "cpu_seconds", "queue_length")
    }


def operator_window(
    app: str, operator: str, window: int, arrivals: float, threads: int = 1, kappa: float = 0.002
) -> dict:
    """One row of the operator table as the streaming job writes it: every arrival
    executed, two tuples emitted per tuple, ``kappa`` CPU-seconds per tuple."""
    start = pd.Timestamp(T0 + SLOT_SECONDS * window, unit="s", tz="UTC")
    return {
        "app": app,
        "operator": operator,
        "window_start": start,
        "window_end": start + pd.Timedelta(seconds=SLOT_SECONDS),
        "slot_first": window,
        "slot_last": window,
        "slots": 1,
        "samples": threads,
        "instances": float(threads),
        "stateful": False,
        "arrivals": arrivals,
        "executed": arrivals,
        "emitted": arrivals * 2,
        "cpu_seconds": arrivals * kappa,
        "latency_sum_seconds": 1.0,
        "latency_count": 10.0,
        "service_seconds": 0.01,
        "queue_length": 1.0,
        "cap_cores": None,
        "batch_id": window,
    }


def write_operator_table(config, rows: list[dict]) -> None:
    """Write operator windows into the history table, one batch file per window."""
    frame = pd.DataFrame(rows)
    for w, part in frame.groupby("batch_id"):
        job.write_partitioned(part, config.operators_dir, S.OPERATOR_TABLE, int(w))
