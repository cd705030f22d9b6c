"""HTTP monitor: source → retrieve → {country, isp, prefix} → alarm.

The shape of the paper's HTTP monitor and analyzer (Liu et al., section V-D)
on the live testbed. The source emits raw access-log lines; ``retrieve`` parses
one into a request record; ``country``, ``isp`` and ``prefix`` are per-key
windowed counters, each grouped by its own field of the record (so all
requests of one country reach one instance), that keep the count of the
current window and a "normal value" (the mean of the last
:data:`NORMAL_WINDOWS` closed windows); a key whose current count exceeds
:data:`ALARM_FACTOR` times its normal value (and at least
:data:`ALARM_MIN_COUNT`) sends one alarm per window to ``alarm``, which keeps
the alarms. Per-tuple CPU is set per operator (``costs_ms``).

Each counter is fields-grouped on a different field, which the stock engine's
"fields by tuple key" cannot express; :data:`GROUP_KEYS` names the field per
operator for :class:`testbed.live.engine.LiveTopology` (``group_keys=``).
"""

from __future__ import annotations

import random
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from testbed.live.topology import OperatorSpec, TopologySpec, Tuple

COUNTRIES = ("DE", "FR", "US", "CN", "BR", "IN", "JP", "GB", "IT", "ES", "NL", "SE")
ISPS = tuple(f"as{n}" for n in (3320, 3215, 7922, 4134, 28573, 9829, 2516, 5089, 3269, 12479))
PATHS = ("/", "/login", "/search", "/api/v1/items", "/static/app.js", "/cart", "/help")

WINDOW_SECONDS = 2.0
NORMAL_WINDOWS = 10
ALARM_FACTOR = 3.0
ALARM_MIN_COUNT = 20

DEFAULT_COSTS_MS: dict[str, float] = {
    "source": 0.6,
    "retrieve": 0.6,
    "country": 0.6,
    "isp": 0.6,
    "prefix": 0.6,
    "alarm": 0.3,
}

# Which field of a request record each fields-grouped operator is keyed on.
GROUP_KEYS: dict[str, Callable[[Any], str]] = {
    "country": lambda rec: rec["country"],
    "isp": lambda rec: rec["isp"],
    "prefix": lambda rec: rec["prefix"],
    "alarm": lambda alarm: alarm[0],
}


def _log_line(n: int, rng: random.Random) -> tuple[str, str]:
    ip = f"{rng.randint(1, 223)}.{rng.randint(0, 255)}.{rng.randint(0, 255)}.{rng.randint(1, 254)}"
    country = rng.choice(COUNTRIES)
    isp = rng.choice(ISPS)
    status = rng.choices((200, 301, 404, 500), weights=(90, 4, 5, 1))[0]
    return str(n), f"{ip} {country} {isp} GET {rng.choice(PATHS)} {status}"


def _emit_line(t: Tuple, state: dict) -> list[tuple[str, Any]]:
    return [(t.key, t.value)]


def parse_line(line: str) -> dict[str, Any]:
    """One access-log line → a request record (ValueError if it is not one)."""
    parts = line.split()
    if len(parts) != 6:
        raise ValueError(f"not an access-log line: {line!r}")
    ip, country, isp, method, path, status = parts
    octets = ip.split(".")
    if len(octets) != 4:
        raise ValueError(f"not an IPv4 address: {ip!r}")
    return {
        "ip": ip,
        "prefix": ".".join(octets[:2]) + ".0.0/16",
        "country": country,
        "isp": isp,
        "method": method,
        "path": path,
        "status": int(status),
    }


def _retrieve(t: Tuple, state: dict) -> list[tuple[str, Any]]:
    return [(t.key, parse_line(t.value))]


@dataclass(frozen=True)
class WindowedCounter:
    """A stateful counter of ``field``: the current window's count per key and a
    normal value, the mean of the last :data:`NORMAL_WINDOWS` closed windows.

    When a key's window closes, its count and the normal value before it go to
    ``alarm`` if the count reached ``report_min_count`` (prefixes are many and
    mostly rare, so only busy ones are reported). A class, not a closure, so the
    operator pickles into the worker processes of a multi-node run.
    """

    field: str
    report_min_count: int = 0
    clock: Callable[[], float] = time.monotonic

    def __call__(self, t: Tuple, state: dict) -> list[tuple[str, Any]]:
        key = t.value[self.field]
        window = int(self.clock() // WINDOW_SECONDS)
        entry = state.get(key)
        if entry is None:
            entry = state[key] = {
                "window": window,
                "count": 0,
                "history": deque(maxlen=NORMAL_WINDOWS),
            }
        out: list[tuple[str, Any]] = []
        if entry["window"] != window:
            history = entry["history"]
            normal = sum(history) / len(history) if history else None
            if entry["count"] >= self.report_min_count:
                out.append((key, (f"{self.field}:{key}", entry["window"], entry["count"], normal)))
            # Closed windows (including empty ones in between) feed the normal value.
            history.append(entry["count"])
            for _ in range(min(window - entry["window"] - 1, NORMAL_WINDOWS)):
                history.append(0)
            entry["window"], entry["count"] = window, 0
        entry["count"] += 1
        return out


def windowed_counter(
    field: str, report_min_count: int = 0, clock: Callable[[], float] = time.monotonic
) -> WindowedCounter:
    """The counter operator of ``field`` (:class:`WindowedCounter`)."""
    return WindowedCounter(field, report_min_count, clock)


def is_anomaly(count: int, normal: float | None) -> bool:
    """A window is anomalous when it is busy and well above the key's normal value."""
    return normal is not None and count >= ALARM_MIN_COUNT and count > ALARM_FACTOR * normal


def _alarm(t: Tuple, state: dict) -> list:
    name, window, count, normal = t.value
    state["reports"] = state.get("reports", 0) + 1
    if is_anomaly(count, normal):
        state.setdefault("alarms", []).append(t.value)
    return []


def http_monitor(
    app: str = "httpmon", parallelism: int = 4, costs_ms: Mapping[str, float] | None = None
) -> TopologySpec:
    """The topology; ``costs_ms`` overrides :data:`DEFAULT_COSTS_MS` per operator."""
    costs = dict(DEFAULT_COSTS_MS)
    for name, value in (costs_ms or {}).items():
        if name not in costs:
            raise ValueError(
                f"costs_ms names unknown operator {name!r} (known: {', '.join(costs)})"
            )
        costs[name] = value
    counters = tuple(
        OperatorSpec(
            field,
            parallelism,
            costs[field],
            windowed_counter(field),
            upstream=("retrieve",),
            stateful=True,
            grouping="fields",
        )
        for field in ("country", "isp", "prefix")
    )
    return TopologySpec(
        app=app,
        operators=(
            OperatorSpec("source", parallelism, costs["source"], _emit_line),
            OperatorSpec(
                "retrieve", parallelism, costs["retrieve"], _retrieve, upstream=("source",)
            ),
            *counters,
            OperatorSpec(
                "alarm",
                parallelism,
                costs["alarm"],
                _alarm,
                upstream=("country", "isp", "prefix"),
                stateful=True,
                grouping="fields",
            ),
        ),
        make_root=_log_line,
    )


# Mean tuples emitted per input, per operator (closed-window reports are few).
FANOUT = {"source": 1.0, "retrieve": 1.0, "country": 0.0, "isp": 0.0, "prefix": 0.0}
