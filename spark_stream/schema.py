"""The spool file format (version 1) and the history table layout.

Shared by the writer (spark_stream/spool.py), the streaming job and the reader
(spark_stream/reader.py), and free of Spark imports so the controller's process can
use it without a JVM.

Spool file: JSON Lines, one flat record per line, published by atomic rename as
``slot-<slot, 12 digits>-<slot start in Unix milliseconds, 13 digits>.json``. The
name carries the slot's time so even a file whose content cannot be parsed is
placed on the controller's clock (the watermark never sees another clock).

Every line has ``v`` (the schema version, 1), ``kind``, ``slot``, ``timestamp``
(start of the slot, Unix seconds; the slot covers ``[timestamp, timestamp +
slot_seconds)``) and ``slot_seconds``; then, by kind:

* ``instance``: app, operator, instance, node, worker, stateful, arrivals,
  executed, emitted, cpu_seconds, queue_length, latency_sum_seconds,
  latency_count, service_seconds, cap_cores (null when uncapped);
* ``node``: node, cpu_capacity_cores, cpu_usage_cores,
  memory_bandwidth_bytes_per_second and llc_occupancy_bytes (null when the node
  cannot measure them);
* ``slot`` (one per file): decision (the decision record as a JSON string, or
  null), written_at;
* ``tick`` (one per file, last line): marks the end of the slot; its event time is
  ``timestamp + slot_seconds``, which lets the watermark close the slot's window
  as soon as the file is read instead of one slot later.

Flat lines rather than one nested document: Spark parses and splits line-delimited
JSON several times faster than multi-line documents.
"""

from __future__ import annotations

import re

import pyarrow as pa

SPOOL_SCHEMA_VERSION = 1
SPOOL_SUFFIX = ".json"
_SPOOL_NAME = re.compile(r"^slot-(\d{12})-(\d{13})\.json$")
SPOOL_NAME_PATTERN = r"^slot-(\d{12})-(\d{13})\.json$"

# (name, type) with type one of "string", "long", "double", "boolean".
INSTANCE_FIELDS: list[tuple[str, str]] = [
    ("app", "string"),
    ("operator", "string"),
    ("instance", "long"),
    ("node", "string"),
    ("worker", "string"),
    ("stateful", "boolean"),
    ("arrivals", "double"),
    ("executed", "double"),
    ("emitted", "double"),
    ("cpu_seconds", "double"),
    ("queue_length", "double"),
    ("latency_sum_seconds", "double"),
    ("latency_count", "double"),
    ("service_seconds", "double"),
    ("cap_cores", "double"),
]
NODE_FIELDS: list[tuple[str, str]] = [
    ("node", "string"),
    ("cpu_capacity_cores", "double"),
    ("cpu_usage_cores", "double"),
    ("memory_bandwidth_bytes_per_second", "double"),
    ("llc_occupancy_bytes", "double"),
]
# Counters are summed over instances and slots; gauges are summed over instances
# and averaged over the slots of the window.
OPERATOR_COUNTERS = [
    "arrivals",
    "executed",
    "emitted",
    "cpu_seconds",
    "latency_sum_seconds",
    "latency_count",
    "service_seconds",
]
OPERATOR_GAUGES = ["queue_length", "cap_cores"]
NODE_GAUGES = [
    "cpu_capacity_cores",
    "cpu_usage_cores",
    "memory_bandwidth_bytes_per_second",
    "llc_occupancy_bytes",
]

QUARANTINE_REASONS = ("bad_json", "schema_version", "missing_field")
LINE_KINDS = ("instance", "node", "slot", "tick")
# Fields every line has, then the per-kind ones (slot lines: decision, written_at).
COMMON_FIELDS: list[tuple[str, str]] = [
    ("v", "long"),
    ("kind", "string"),
    ("slot", "long"),
    ("timestamp", "double"),
    ("slot_seconds", "double"),
]
SLOT_FIELDS: list[tuple[str, str]] = [("decision", "string"), ("written_at", "double")]


def line_fields() -> list[tuple[str, str]]:
    """The union of all line fields, each once, in a fixed order (the Spark schema)."""
    seen: dict[str, str] = {}
    for name, typ in COMMON_FIELDS + INSTANCE_FIELDS + NODE_FIELDS + SLOT_FIELDS:
        seen.setdefault(name, typ)
    return list(seen.items())


def spool_file_name(slot: int, timestamp: float) -> str:
    if slot < 0 or slot >= 10**12:
        raise ValueError(f"slot must be within 0..10^12-1, got {slot}")
    millis = round(timestamp * 1000)
    if millis < 0 or millis >= 10**13:
        raise ValueError(f"timestamp must be within 0..10^10 s, got {timestamp}")
    return f"slot-{slot:012d}-{millis:013d}{SPOOL_SUFFIX}"


def slot_of_file_name(name: str) -> int | None:
    """The slot number of a spool file name, or None if it is not one."""
    m = _SPOOL_NAME.match(name)
    return int(m.group(1)) if m else None


_TS = pa.timestamp("us", tz="UTC")

OPERATOR_TABLE = pa.schema(
    [
        ("app", pa.string()),
        ("operator", pa.string()),
        ("window_start", _TS),
        ("window_end", _TS),
        ("slot_first", pa.int64()),
        ("slot_last", pa.int64()),
        ("slots", pa.int64()),
        ("samples", pa.int64()),
        ("instances", pa.float64()),
        ("stateful", pa.bool_()),
        *[(c, pa.float64()) for c in OPERATOR_COUNTERS],
        *[(c, pa.float64()) for c in OPERATOR_GAUGES],
        ("batch_id", pa.int64()),
    ]
)
NODE_TABLE = pa.schema(
    [
        ("node", pa.string()),
        ("window_start", _TS),
        ("window_end", _TS),
        ("samples", pa.int64()),
        *[(c, pa.float64()) for c in NODE_GAUGES],
        ("batch_id", pa.int64()),
    ]
)
DECISION_TABLE = pa.schema(
    [
        ("slot", pa.int64()),
        ("window_start", _TS),
        ("source_file", pa.string()),
        ("decision", pa.string()),
        ("batch_id", pa.int64()),
    ]
)
QUARANTINE_TABLE = pa.schema(
    [
        ("source_file", pa.string()),
        ("reason", pa.string()),
        ("lines", pa.int64()),
        ("batch_id", pa.int64()),
    ]
)
