"""Framing shared by both ends of the registration socket (JSON lines).

Kept free of agent imports so that an instance linking in the client does not
load the agent's dependencies.
"""

from __future__ import annotations

import json
from typing import Any

# The agent refuses longer lines (and closes the connection), so a batch must fit.
MAX_LINE_BYTES = 64 * 1024
# Room left for the envelope around the items.
_ENVELOPE = b'{"op":"updates","items":[]}\n'


def encode(message: dict[str, Any]) -> bytes:
    """One message as one line."""
    return json.dumps(message, separators=(",", ":")).encode() + b"\n"


def encode_update_batches(
    items: list[dict[str, Any]], max_line_bytes: int = MAX_LINE_BYTES
) -> tuple[list[tuple[bytes, list[dict[str, Any]]]], list[dict[str, Any]]]:
    """Pack counter updates into ``updates`` lines no longer than ``max_line_bytes``.

    Returns ``(batches, oversized)``: each batch is (line, the items it carries,
    in order, so a reply's ``index`` finds its item); ``oversized`` are items
    that alone would exceed the limit and are not sent at all.
    """
    budget = max_line_bytes - len(_ENVELOPE)
    batches: list[tuple[bytes, list[dict[str, Any]]]] = []
    oversized: list[dict[str, Any]] = []
    parts: list[bytes] = []
    carried: list[dict[str, Any]] = []
    size = 0

    def close_batch() -> None:
        batches.append((b'{"op":"updates","items":[' + b",".join(parts) + b"]}\n", carried))

    for item in items:
        part = json.dumps(item, separators=(",", ":")).encode()
        if len(part) > budget:
            oversized.append(item)
            continue
        # +1 for the comma joining it to the previous item.
        if parts and size + 1 + len(part) > budget:
            close_batch()
            parts, carried, size = [], [], 0
        size += len(part) + (1 if parts else 0)
        parts.append(part)
        carried.append(item)
    if parts:
        close_batch()
    return batches, oversized
