"""The spool: one file per slot, published atomically.

Each slot the controller's samples reach :class:`SpoolWriter` (through
:class:`spark_stream.feed.HistoryFeed`, on a background thread), which writes a
JSON Lines file in the version-1 spool format (see :mod:`spark_stream.schema`) to a
hidden temporary file and renames it into place, so the streaming job never sees
half a file. The spool is bounded: when it would grow beyond ``max_spool_bytes``
(Spark down or far behind) the slot is dropped and counted instead of filling the
disk, and :meth:`SpoolWriter.prune` removes files the history has committed once
they are older than ``retention_seconds``.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any

from spark_stream import schema as S
from spark_stream.config import HistoryConfig

_INSTANCE_KEYS = [name for name, _ in S.INSTANCE_FIELDS]
_NODE_KEYS = [name for name, _ in S.NODE_FIELDS]
_OPTIONAL = {"cap_cores", "memory_bandwidth_bytes_per_second", "llc_occupancy_bytes"}


def _number(kind: str, key: str, value: Any, optional: bool) -> float | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{kind}.{key} must be a finite number, got {value!r}")
    return float(value)


def _clean(kind: str, sample: dict[str, Any], fields: list[tuple[str, str]]) -> dict[str, Any]:
    if not isinstance(sample, dict):
        raise ValueError(f"{kind} sample must be a dict, got {type(sample).__name__}")
    missing = [n for n, _ in fields if n not in sample and n not in _OPTIONAL]
    if missing:
        raise ValueError(f"{kind} sample lacks {', '.join(missing)}")
    out: dict[str, Any] = {}
    for name, typ in fields:
        value = sample.get(name)
        if typ == "double":
            out[name] = _number(kind, name, value, name in _OPTIONAL)
        elif typ == "long":
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{kind}.{name} must be an integer, got {value!r}")
            out[name] = value
        elif typ == "boolean":
            out[name] = bool(value)
        else:
            if not isinstance(value, str) or not value:
                raise ValueError(f"{kind}.{name} must be a non-empty string, got {value!r}")
            out[name] = value
    return out


def encode_slot(
    slot: int,
    timestamp: float,
    slot_seconds: float,
    instances: list[dict],
    nodes: list[dict],
    decision: dict | None,
    written_at: float | None = None,
) -> bytes:
    """The version-1 spool file (JSON Lines) for one slot; ValueError naming the bad parameter."""
    if isinstance(slot, bool) or not isinstance(slot, int) or slot < 0:
        raise ValueError(f"slot must be a non-negative integer, got {slot!r}")
    if not isinstance(timestamp, int | float) or not math.isfinite(timestamp) or timestamp < 0:
        raise ValueError(f"timestamp must be finite Unix seconds, got {timestamp!r}")
    if (
        not isinstance(slot_seconds, int | float)
        or not math.isfinite(slot_seconds)
        or slot_seconds <= 0
    ):
        raise ValueError(f"slot_seconds must be > 0, got {slot_seconds!r}")
    try:
        decision_text = None if decision is None else json.dumps(decision, sort_keys=True)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"decision is not JSON-able: {exc}") from None
    head = {
        "v": S.SPOOL_SCHEMA_VERSION,
        "slot": slot,
        "timestamp": float(timestamp),
        "slot_seconds": float(slot_seconds),
    }
    lines = [
        {**head, "kind": "instance", **_clean("instances", s, S.INSTANCE_FIELDS)} for s in instances
    ]
    lines += [{**head, "kind": "node", **_clean("nodes", s, S.NODE_FIELDS)} for s in nodes]
    lines.append(
        {
            **head,
            "kind": "slot",
            "decision": decision_text,
            "written_at": time.time() if written_at is None else written_at,
        }
    )
    lines.append({**head, "kind": "tick"})
    return "".join(json.dumps(line, separators=(",", ":")) + "\n" for line in lines).encode()


class SpoolWriter:
    """Writes slot files into ``config.spool_dir``; bounded by ``config.max_spool_bytes``."""

    def __init__(self, config: HistoryConfig):
        self.config = config
        self.spool_dir = Path(config.spool_dir)
        self.spool_dir.mkdir(parents=True, exist_ok=True)
        self.dropped_total = 0
        # True from a refused slot until the next slot is accepted.
        self.over_limit = False
        self.pruned_total = 0
        self._bytes, self._files = self._scan()

    def _scan(self) -> tuple[int, int]:
        total = count = 0
        for entry in os.scandir(self.spool_dir):
            if entry.is_file() and S.slot_of_file_name(entry.name) is not None:
                total += entry.stat().st_size
                count += 1
        return total, count

    @property
    def bytes(self) -> int:
        return self._bytes

    @property
    def files(self) -> int:
        return self._files

    def write_slot(
        self,
        slot: int,
        timestamp: float,
        slot_seconds: float,
        instances: list[dict],
        nodes: list[dict],
        decision: dict | None,
    ) -> Path | None:
        """Publish one slot; None (and ``dropped_total`` + 1) when the spool is full."""
        data = encode_slot(slot, timestamp, slot_seconds, instances, nodes, decision)
        if self._bytes + len(data) > self.config.max_spool_bytes:
            self.dropped_total += 1
            self.over_limit = True
            return None
        final = self.spool_dir / S.spool_file_name(slot, timestamp)
        # Hidden name: Spark's file source ignores files starting with '.'.
        tmp = self.spool_dir / f".{final.name}.tmp"
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        replaced = final.stat().st_size if final.exists() else None
        os.replace(tmp, final)
        self._bytes += len(data) - (replaced or 0)
        self._files += 0 if replaced is not None else 1
        self.over_limit = False
        return final

    def committed_slot(self) -> int | None:
        """The highest slot whose windows the history has written, from its progress file."""
        try:
            progress = json.loads(Path(self.config.progress_path).read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None
        value = progress.get("committed_slot")
        return int(value) if isinstance(value, int) else None

    def prune(self, now: float | None = None) -> int:
        """Remove committed files older than the retention; return how many were removed."""
        now = time.time() if now is None else now
        committed = self.committed_slot()
        removed = 0
        if committed is not None:
            for entry in os.scandir(self.spool_dir):
                slot = S.slot_of_file_name(entry.name)
                if slot is None or slot > committed:
                    continue
                try:
                    if now - entry.stat().st_mtime >= self.config.retention_seconds:
                        os.unlink(entry.path)
                        removed += 1
                except FileNotFoundError:
                    continue
        self.pruned_total += removed
        self._bytes, self._files = self._scan()
        return removed
