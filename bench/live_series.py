"""`dsched bench live-series`: several runs of `dsched bench live` read together.

Live figures vary from run to run on a shared machine, so a comparison stated
from one run can flip in the next. This reads the JSON of each run of one
series (the same scenario, QoS class and contenders, each run made with
``dsched bench live``; it runs nothing itself) and writes:

- per contender, the spread over the runs (median, least and most) of CPU
  allocated, its ratio to dsched's in the same run, mean and p99 latency, the
  share of slots over the class's target, cap changes per instance-hour,
  moves and the workers and nodes used; and in how many runs it met the class,
  failed and lost tuples;
- per run, the peer targets judged on that run alone:

  * ``cpu``: dsched meets the class and allocates no more CPU than any peer
    that meets it;
  * ``violations``: dsched has fewer slots over the target than any peer that
    allocates less CPU (a peer with as few is named a tie: the target says
    fewer; shares are compared as the runs wrote them, to four decimals);
  * ``cap_changes``: dsched changes caps less often than ``util-target``;
  * ``lost``: dsched loses no tuple.

  Each names the peers that break it and by how much, and a run that lacks a
  peer another run of the series has says which (``peers_missing``): a target
  judged without it may hold only for that reason. The peers are the policies
  an operator could run instead (:data:`PEERS`); ``equal`` is left out because
  its caps are dsched's own mean allocation of the same run, and dsched's runs
  at other headrooms (``dsched-h*``) because they are dsched. ``targets_held``
  counts, per target, the runs where it held and the runs where it could be
  judged (cap changes need ``util-target``).

``--markdown`` also writes the tables the docs show.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.common import write_result
from controller.peers import PEERS as PEER_POLICIES

PEERS = (*PEER_POLICIES, "static-0.7", "static-0.3", "uncapped")
FIGURES = (
    "cpu_allocated_core_seconds",
    "latency_ms_mean",
    "latency_ms_p99",
    "violation_slot_share",
    "cap_changes_per_instance_hour",
    "moves",
    "workers_used_mean",
    "nodes_used_mean",
)
# Runs of one series must agree on these (else they are not one series).
SAME = ("scenario", "qos_class", "nodes", "duration_seconds")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("runs", nargs="+", type=Path, help="JSON of each run (dsched bench live --json)")
    p.add_argument("--json", type=Path, required=True, help="write the spread and targets here")
    p.add_argument("--markdown", type=Path, help="also write the tables as Markdown here")


def load_runs(paths: Sequence[Path]) -> list[dict[str, Any]]:
    """Each run's JSON; ValueError naming the file that is unreadable, lacks dsched,
    or belongs to another series than the first."""
    runs = []
    for path in paths:
        try:
            doc = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            raise ValueError(f"{path}: not a readable bench live result ({exc})") from None
        if not isinstance(doc, dict) or doc.get("benchmark") != "live":
            raise ValueError(f"{path}: not a `dsched bench live` result")
        if "dsched" not in doc.get("contenders", {}):
            raise ValueError(f"{path}: dsched did not run in it")
        if runs:
            for key in SAME:
                if doc.get(key) != runs[0].get(key):
                    raise ValueError(
                        f"{path}: {key} is {doc.get(key)!r}, the first run's is "
                        f"{runs[0].get(key)!r}: not one series"
                    )
        runs.append(doc)
    return runs


def _spread(values: Sequence[float | None]) -> dict[str, float | None]:
    known = [v for v in values if v is not None]
    if not known:
        return {"median": None, "min": None, "max": None}
    return {"median": statistics.median(known), "min": min(known), "max": max(known)}


def judge(
    contenders: Mapping[str, Mapping[str, Any]], expected: Sequence[str] = ()
) -> dict[str, Any]:
    """The peer targets on one run (see the module's docstring); ``expected``:
    the peers the series ran, so that the run names those it lacks."""
    d = contenders["dsched"]
    cpu, over = d["cpu_allocated_core_seconds"], d["violation_slot_share"]
    peers = {n: c for n, c in contenders.items() if n in PEERS}
    cheaper_meeting = {
        n: round(c["cpu_allocated_core_seconds"] / cpu, 3)
        for n, c in peers.items()
        if c.get("meets_target") and c["cpu_allocated_core_seconds"] < cpu
    }
    cheaper = {n: c for n, c in peers.items() if c["cpu_allocated_core_seconds"] < cpu}
    worse_or_tie = {
        n: c["violation_slot_share"]
        for n, c in cheaper.items()
        if c["violation_slot_share"] <= over
    }
    ties = sorted(n for n, v in worse_or_tie.items() if v == over)
    util = contenders.get("util-target")
    changes = d["cap_changes_per_instance_hour"]
    out: dict[str, Any] = {
        "peers_missing": sorted(set(expected) - set(contenders)),
        "cpu": {
            "holds": bool(d.get("meets_target")) and not cheaper_meeting,
            "dsched_meets": bool(d.get("meets_target")),
            "peers_meeting_with_less": cheaper_meeting,
        },
        "violations": {
            "holds": not worse_or_tie,
            "cheaper_peers_with_as_few": worse_or_tie,
            "ties": ties,
        },
        "cap_changes": {
            "holds": None if util is None else changes < util["cap_changes_per_instance_hour"],
            "dsched": changes,
            "util_target": None if util is None else util["cap_changes_per_instance_hour"],
        },
        "lost": {"holds": d["lost"] == 0, "lost": d["lost"], "failed": d["failed"]},
    }
    return out


def summarize(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The spread of every contender's figures and the targets of every run."""
    names = [n for n in runs[0]["contenders"] if all(n in r["contenders"] for r in runs)]
    contenders: dict[str, Any] = {}
    for name in names:
        rows = [r["contenders"][name] for r in runs]
        ratio = [
            row["cpu_allocated_core_seconds"]
            / r["contenders"]["dsched"]["cpu_allocated_core_seconds"]
            for row, r in zip(rows, runs, strict=True)
        ]
        contenders[name] = {
            **{f: _spread([row.get(f) for row in rows]) for f in FIGURES},
            "cpu_over_dsched": _spread(ratio),
            "met_target_runs": sum(bool(row.get("meets_target")) for row in rows),
            "failed": [row["failed"] for row in rows],
            "lost": [row["lost"] for row in rows],
        }
    ran = {n for r in runs for n in r["contenders"] if n in PEERS}
    targets = [judge(r["contenders"], sorted(ran)) for r in runs]
    first = runs[0]
    return {
        "scenario": first["scenario"],
        "qos_class": first.get("qos_class"),
        "nodes": first.get("nodes"),
        "duration_seconds": first.get("duration_seconds"),
        "runs": [{"revision": r.get("revision"), "created": r.get("created")} for r in runs],
        "contenders": contenders,
        "targets": targets,
        "targets_held": {
            t: {
                "held": sum(run[t]["holds"] is True for run in targets),
                "judged": sum(run[t]["holds"] is not None for run in targets),
            }
            for t in ("cpu", "violations", "cap_changes", "lost")
        },
    }


def _num(v: float | None, digits: int = 1) -> str:
    if v is None:
        return "–"
    return f"{v:,.{digits}f}"


def _range(s: Mapping[str, float | None], digits: int = 1) -> str:
    if s["median"] is None:
        return "–"
    return f"{_num(s['median'], digits)} ({_num(s['min'], digits)}–{_num(s['max'], digits)})"


def markdown(summary: Mapping[str, Any]) -> str:
    """The spread table and the targets table of one series."""
    n = len(summary["runs"])
    lines = [
        "| contender | CPU allocated (core-s) | / dsched's | latency mean (ms) | p99 (ms) "
        "| slots over target | met the class | cap changes per instance-hour "
        "| failed / lost (each run) | moves | workers / nodes |",
        "|---|---:|---:|---:|---:|---:|:-:|---:|---:|---:|---:|",
    ]
    for name, c in summary["contenders"].items():
        lines.append(
            f"| `{name}` | {_range(c['cpu_allocated_core_seconds'])} "
            f"| {_range(c['cpu_over_dsched'], 2)} | {_range(c['latency_ms_mean'], 0)} "
            f"| {_num(c['latency_ms_p99']['median'], 0)} | {_range(c['violation_slot_share'], 3)} "
            f"| {c['met_target_runs']} of {n} | {_range(c['cap_changes_per_instance_hour'], 0)} "
            f"| {', '.join(map(str, c['failed']))} / {', '.join(map(str, c['lost']))} "
            f"| {_num(c['moves']['median'], 0)} "
            f"| {_num(c['workers_used_mean']['median'], 2)} / "
            f"{_num(c['nodes_used_mean']['median'], 2)} |"
        )
    lines += ["", "| run | " + " | ".join(("cpu", "violations", "cap changes", "lost")) + " |"]
    lines.append("|---|---|---|---|---|")
    for i, t in enumerate(summary["targets"], 1):
        cpu = t["cpu"]
        cpu_s = (
            "holds"
            if cpu["holds"]
            else "missed: "
            + ", ".join(
                ([] if cpu["dsched_meets"] else ["dsched misses the class"])
                + [f"{p} {r:.2f}×" for p, r in cpu["peers_meeting_with_less"].items()]
            )
        )
        vio = t["violations"]
        vio_s = (
            "holds"
            if vio["holds"]
            else "missed: "
            + ", ".join(
                f"{p} {v:.3f}{' (tie)' if p in vio['ties'] else ''}"
                for p, v in vio["cheaper_peers_with_as_few"].items()
            )
        )
        cc = t["cap_changes"]
        cc_s = (
            "–"
            if cc["holds"] is None
            else f"{'holds' if cc['holds'] else 'missed'}: {cc['dsched']:,.0f} / {cc['util_target']:,.0f}"
        )
        lost = t["lost"]
        missing = f" (without {', '.join(t['peers_missing'])})" if t["peers_missing"] else ""
        lines.append(
            f"| {i}{missing} | {cpu_s} | {vio_s} | {cc_s} | "
            f"{'holds' if lost['holds'] else 'missed'} ({lost['lost']} lost, {lost['failed']} failed) |"
        )
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> int:
    try:
        runs = load_runs(args.runs)
    except ValueError as exc:
        raise SystemExit(f"dsched bench live-series: {exc}") from None
    summary = summarize(runs)
    write_result(args.json, "live-series", summary)
    text = markdown(summary)
    if args.markdown is not None:
        args.markdown.write_text(text)
    print(text, end="")
    return 0
