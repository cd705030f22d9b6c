"""Known spool input for the history tests: deterministic samples with known sums.

Holds no tests itself; the history test modules import it.
"""

from __future__ import annotations

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
