"""What every benchmark writes beside its figures: the machine and the revision."""

from __future__ import annotations

import json
import math
import os
import platform
import subprocess
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil


@contextmanager
def process_pool(workers: int) -> Iterator[ProcessPoolExecutor]:
    """A ProcessPoolExecutor that a stop (Ctrl-C, SIGTERM: a KeyboardInterrupt in
    this process) or any error ends at once: queued work is dropped and the
    workers are killed, where the executor's own exit would first run every
    queued item. The workers only compute, so nothing is lost by killing them."""
    pool = ProcessPoolExecutor(workers)
    try:
        yield pool
    except BaseException:
        workers_left = list((getattr(pool, "_processes", None) or {}).values())
        pool.shutdown(wait=False, cancel_futures=True)
        for proc in workers_left:
            proc.kill()
        for proc in workers_left:
            proc.join(5)
        raise
    else:
        pool.shutdown(wait=True)


def machine() -> dict[str, Any]:
    cpu_model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "hostname": platform.node(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_model": cpu_model,
        "cpu_count": os.cpu_count(),
        "memory_bytes": psutil.virtual_memory().total,
    }


def revision() -> str:
    root = Path(__file__).resolve().parent.parent
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
        return rev + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def write_result(
    path: str | Path | None, benchmark: str, figures: dict[str, Any]
) -> dict[str, Any]:
    """Write ``figures`` with machine and revision as JSON to ``path`` (if given); return it."""
    doc = {
        "benchmark": benchmark,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "revision": revision(),
        "machine": machine(),
        **figures,
    }
    if path is not None:
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_suffix(p.suffix + ".tmp")
        tmp.write_text(json.dumps(doc, indent=2, sort_keys=False, default=float) + "\n")
        tmp.replace(p)
    return doc


def reference_seconds(repeats: int = 5) -> float:
    """Median time of a fixed workload, timed in the calling process.

    The same code has measured 1.7x slower on one day than another on these
    shared machines; an absolute time is reported beside this, so a reader can
    tell a slower controller from a slower machine. The workload mixes what an
    epoch does: numpy over a few million floats and Python dict and tuple work.
    """
    import numpy as np

    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        values = np.random.default_rng(0).random(2_000_000)
        np.sort(values)
        table = {(i % 500, i): float(i) for i in range(200_000)}
        sum(v for k, v in table.items() if k[0] == 7)
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def print_contenders(
    console: Any, title: str, doc: dict[str, Any], columns: tuple[str, ...]
) -> None:
    """One row per contender of ``doc["contenders"]`` with ``columns`` (rich table)."""
    from rich.table import Table

    t = Table(title=title, title_justify="left")
    t.add_column("contender")
    for c in columns:
        t.add_column(c.replace("_", " "), justify="right")
    for name, c in doc["contenders"].items():
        t.add_row(name, *(str(c[k]) for k in columns))
    console.print(t)


def pareto_front(points: Mapping[str, tuple[float, float]]) -> list[str]:
    """The names whose (cost, violation) no other point beats in both (ties kept),
    by cost. Points with a NaN coordinate are never on the front."""
    ok = {n: p for n, p in points.items() if not any(math.isnan(v) for v in p)}
    front = [
        name
        for name, (x, y) in ok.items()
        if not any(
            ox <= x and oy <= y and (ox < x or oy < y)
            for other, (ox, oy) in ok.items()
            if other != name
        )
    ]
    return sorted(front, key=lambda n: ok[n])


# Label offsets in points, taken in turn by neighbouring points (by cost), so close
# points keep legible labels; a leader line ties each label to its point.
LABEL_OFFSETS = ((8, 14), (8, -14), (8, 30), (8, 46))


def label_points(ax: Any, labelled: list[tuple[str, float, float, str]]) -> None:
    """Name every (label, x, y, colour) point on a matplotlib axis in its point's
    colour, neighbours' labels staggered above and below, each joined to its
    point by a thin line."""
    for i, (text, x, y, colour) in enumerate(sorted(labelled, key=lambda t: (t[1], t[2]))):
        ax.annotate(
            text,
            (x, y),
            textcoords="offset points",
            xytext=LABEL_OFFSETS[i % len(LABEL_OFFSETS)],
            fontsize=8,
            color=colour,
            arrowprops={"arrowstyle": "-", "color": colour, "linewidth": 0.5},
        )


# dsched at another per-node headroom, as a contender of its own (live and sim).
HEADROOM_PREFIX = "dsched-h"


def headroom_contenders(text: str, node_cores: float) -> list[str]:
    """``--dsched-headrooms`` as contender names, each a number of cores in
    [0, cores per node): the controller's per-node ``headroom_cores``."""
    out: list[str] = []
    for part in (p.strip() for p in str(text).split(",")):
        if not part:
            continue
        try:
            value = float(part)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and 0 <= value < node_cores):
            raise ValueError(
                f"--dsched-headrooms: {part!r} must be a number of cores in [0, {node_cores:g})"
            )
        name = f"{HEADROOM_PREFIX}{value:g}"
        if name in out:
            raise ValueError(f"--dsched-headrooms: {part!r} listed twice")
        out.append(name)
    return out


def headroom_of(name: str) -> float | None:
    """The headroom a ``dsched-h<cores>`` contender runs with, else None."""
    return float(name.removeprefix(HEADROOM_PREFIX)) if name.startswith(HEADROOM_PREFIX) else None
