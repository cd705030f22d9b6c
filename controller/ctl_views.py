"""What `dschedctl` prints: narrow layouts that fit the terminal, all columns with --wide.

Every view is a list of lines laid out for a width (the terminal's, else
``$COLUMNS``, else 80; ``None`` with ``--wide``: as wide as the content). Nothing
a reader needs is ever cut: a name that does not fit its column takes a line of
its own and the row continues below it; a reason is wrapped at word boundaries
onto lines of its own under its row. Numbers keep their columns.
"""

from __future__ import annotations

import os
import sys
import textwrap
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

from rich.text import Text

from dsched_pb import dsched_pb2 as pb

GAP = 2  # spaces between columns
NARROWEST = 40  # below this a layout stops trying to fit


def output_width(wide: bool, stream: IO[str] | None = None) -> int | None:
    """The width to lay views out for: ``None`` (no limit) with ``--wide``; else
    ``$COLUMNS`` when set, the terminal's width on a terminal, 80 when piped."""
    if wide:
        return None
    cols = os.environ.get("COLUMNS", "")
    if cols.isdigit() and int(cols) > 0:
        return max(NARROWEST, int(cols))
    stream = stream or sys.stdout
    try:
        if stream.isatty():
            return max(NARROWEST, os.get_terminal_size(stream.fileno()).columns)
    except (OSError, ValueError, AttributeError):
        pass
    return 80


# --- layout -------------------------------------------------------------------


@dataclass(frozen=True)
class Col:
    """A column: ``name`` columns (applications, operators, nodes) are never cut."""

    key: str
    header: str
    right: bool = True
    name: bool = False


@dataclass
class Row:
    cells: dict[str, str]
    # Wrapped onto lines of its own under the row (a reason, a list of counters).
    note: str = ""
    style: str = ""
    # Indent of the name cell, in steps of two spaces (an operator under its app).
    depth: int = 0


@dataclass
class Heading:
    """A line of its own between rows (an application above its operators)."""

    text: str
    style: str = "bold"
    depth: int = 0


@dataclass
class Layout:
    cols: Sequence[Col]
    items: list[Row | Heading] = field(default_factory=list)

    def add(self, item: Row | Heading) -> None:
        self.items.append(item)

    def lines(self, width: int | None) -> list[Text]:
        return layout(self.cols, self.items, width)


def wrap(text: str, width: int | None, indent: str = "", hanging: str = "") -> list[str]:
    """``text`` wrapped at spaces to ``width``; a word longer than the line stays whole."""
    if width is None:
        return [indent + text]
    return textwrap.wrap(
        text,
        width=max(width, len(indent) + 10, len(hanging) + 10),
        initial_indent=indent,
        subsequent_indent=hanging or indent,
        break_long_words=False,
        break_on_hyphens=False,
    ) or [indent]


def _name_cell(row: Row, col: Col) -> str:
    value = row.cells.get(col.key, "")
    return "  " * row.depth + value if value else ""


def layout(cols: Sequence[Col], items: Iterable[Row | Heading], width: int | None) -> list[Text]:
    """The lines of a table: a header, then each heading and row, laid out for ``width``."""
    items = list(items)
    rows = [r for r in items if isinstance(r, Row)]
    widths = {}
    for c in cols:
        cells = [_name_cell(r, c) if c.name else r.cells.get(c.key, "") for r in rows]
        widths[c.key] = max([len(c.header), *map(len, cells)])
    names = [c for c in cols if c.name]
    if width is not None and names:
        # The first name column gives way to the others; a longer name takes its own line.
        first = names[0]
        rest = sum(widths[c.key] for c in cols if c is not first) + GAP * (len(cols) - 1)
        widths[first.key] = max(len(first.header), min(widths[first.key], width - rest))

    def line(cells: dict[str, str]) -> str:
        parts = []
        for c in cols:
            v = cells.get(c.key, "")
            parts.append(v.rjust(widths[c.key]) if c.right else v.ljust(widths[c.key]))
        return (" " * GAP).join(parts).rstrip()

    out = [Text(line({c.key: c.header for c in cols}), style="bold")]
    for item in items:
        if isinstance(item, Heading):
            pad = "  " * item.depth
            out += [Text(s, style=item.style) for s in wrap(item.text, width, pad, pad + "    ")]
            continue
        cells = dict(item.cells)
        for c in names:
            cells[c.key] = _name_cell(item, c)
        if width is not None:
            for c in names:
                if len(cells[c.key]) > widths[c.key]:
                    # Never cut: the name alone, the row's numbers on the next line.
                    out.append(Text(cells[c.key], style=item.style or "bold"))
                    cells[c.key] = ""
        out.append(Text(line(cells), style=item.style))
        if item.note:
            pad = "  " * (item.depth + 2)
            out += [Text(s, style="dim") for s in wrap(item.note, width, pad)]
    return out


def fit(lines: Iterable[str], width: int | None) -> list[Text]:
    """Free text (explain's story) wrapped at spaces, continuation lines indented."""
    out = []
    for s in lines:
        lead = s[: len(s) - len(s.lstrip(" "))]
        out += [Text(x) for x in wrap(s.strip(" "), width, lead, lead + "    ")]
    return out


# --- formats ------------------------------------------------------------------


def cores(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def rate(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:.1f}" if abs(v) < 1000 else f"{v:.0f}"


def ms(v: float | None) -> str:
    if v is None or v < 0:
        return "-"
    return f"{v:.1f}" if v < 1000 else f"{v:.0f}"


def seconds(v: float) -> str:
    return "-" if v < 0 else f"{v:.1f}"


def mode_name(mode: int) -> str:
    return pb.Mode.Name(mode).lower().replace("_", "-")


# --- status -------------------------------------------------------------------


def engine_lines(engines, width: int | None = None) -> list[Text]:
    """Per engine counter edge: where it reads, whether it is healthy and why not.

    The first line (name, endpoint, health, jobs, instances) is never broken, like a
    name; the reason and the age of the last read follow on lines of their own when
    the whole does not fit."""
    out = []
    for e in engines:
        head = (
            f"engine {e.name} ({e.kind} at {e.endpoint}): "
            f"{'healthy' if e.healthy else 'UNHEALTHY'}, {e.jobs} job(s), {e.instances} instance(s)"
        )
        why = "" if e.healthy else f"why: {e.reason}"
        age = f"last read {seconds(e.last_read_age_seconds)} s ago"
        whole = f"{head}, {why + ', ' if why else ''}{age}"
        if width is None or len(whole) <= width:
            out.append(Text(whole, style="" if e.healthy else "red"))
            continue
        out.append(Text(head + ",", style="" if e.healthy else "red"))
        if why:
            out += [Text(s) for s in wrap(why, width, "  ", "    ")]
        out += [Text(s) for s in wrap(age, width, "  ")]
    return out


CGROUPS = {pb.CGROUP_V1: "v1", pb.CGROUP_V2: "v2", pb.CGROUP_NONE: "none"}


def status_lines(r: pb.StatusReply, width: int | None) -> list[Text]:
    summary = (
        f"mode {mode_name(r.mode)}, epoch {r.epoch}, {len(r.agents)} agent(s), "
        f"{r.applications} app(s), {r.instances} instance(s), slot {r.slot_seconds:g} s, "
        f"version {r.version}"
    )
    out = [Text(s, style="bold") for s in wrap(summary, width)]
    wide = width is None
    cols = [
        Col("node", "NODE", right=False, name=True),
        Col("cores", "CORES"),
        Col("cgroups", "CGROUPS", right=False),
        Col("inst", "INST"),
        Col("age", "REPORT AGE S"),
        Col("dry", "DRY-RUN", right=False),
    ]
    if wide:
        cols.append(Col("counters", "COUNTERS", right=False))
    t = Layout(cols)
    for a in r.agents:
        counters = ", ".join(a.counters_available) or "-"
        t.add(
            Row(
                {
                    "node": a.node_id,
                    "cores": f"{a.cpu_capacity_cores:g}",
                    "cgroups": CGROUPS.get(a.cgroup_mode, "-"),
                    "inst": str(a.instances),
                    "age": seconds(a.last_report_age_seconds),
                    "dry": "yes" if a.dry_run else "no",
                    "counters": counters,
                },
                note="" if wide else f"counters: {counters}",
            )
        )
    if r.agents:
        out += t.lines(width)
    else:
        out.append(Text("no agent connected"))
    out += engine_lines(r.engines, width)
    return out


# --- plan ---------------------------------------------------------------------


def _cuts_by_operator(rec: dict) -> dict[tuple[str, str], tuple[float, list[str]]]:
    cuts: dict[tuple[str, str], tuple[float, list[str]]] = {}
    for c in rec.get("cuts", []):
        key = (c["app"], c["operator"])
        total, why = cuts.get(key, (0.0, []))
        if c.get("reason") and c["reason"] not in why:
            why = [*why, c["reason"]]
        cuts[key] = (total + c["cut_cores"], why)
    return cuts


def _held_by_operator(rec: dict) -> dict[tuple[str, str], list[str]]:
    held: dict[tuple[str, str], list[str]] = {}
    for h in rec.get("held", []):
        why = held.setdefault((h["app"], h["operator"]), [])
        if h["reason"] not in why:
            why.append(h["reason"])
    return held


def operator_reasons(rec: dict) -> dict[tuple[str, str], str]:
    """Why each operator's cap is what it is: the demand's term, then cuts and holds."""
    cuts, held = _cuts_by_operator(rec), _held_by_operator(rec)
    out = {}
    keys = [(o["app"], o["operator"]) for o in rec.get("operators", [])]
    keys += [k for k in held if k not in keys]
    by_key = {(o["app"], o["operator"]): o for o in rec.get("operators", [])}
    for k in keys:
        parts = []
        o = by_key.get(k)
        if o is not None and o.get("reason"):
            parts.append(f"demand: {o['reason']}")
        if k in cuts:
            total, why = cuts[k]
            parts.append(f"cut {total:.2f} cores" + (f" ({'; '.join(why)})" if why else ""))
        for why in held.get(k, []):
            parts.append(f"held: {why}")
        out[k] = "; ".join(parts)
    return out


PLAN_COLS = [
    Col("operator", "APP / OPERATOR", right=False, name=True),
    Col("rate", "RATE/S"),
    Col("predicted", "PRED/S"),
    Col("demand", "DEMAND"),
    Col("cap", "CAP"),
    Col("usage", "USAGE"),
    Col("latency", "LAT MS"),
]
PLAN_WIDE_COLS = [
    Col("app", "APP", right=False, name=True),
    Col("operator", "OPERATOR", right=False, name=True),
    Col("inst", "INST"),
    Col("rate", "ARRIVAL/S"),
    Col("predicted", "PREDICTED/S"),
    Col("by", "BY", right=False),
    Col("kappa", "CPU S/TUPLE"),
    Col("demand", "DEMAND"),
    Col("cap", "CAP"),
    Col("usage", "USAGE"),
    Col("queue", "QUEUE"),
    Col("latency", "LATENCY MS"),
    Col("budget", "BUDGET MS"),
    Col("reason", "REASON", right=False),
]


def _operator_cells(o: dict) -> dict[str, str]:
    return {
        "app": o["app"],
        "operator": o["operator"],
        "inst": str(o["instances"]),
        "rate": rate(o["arrival_rate"]),
        "predicted": rate(o["predicted_rate"]),
        "by": o["predictor"],
        "kappa": f"{o['kappa']:.2g}" if o.get("kappa") is not None else "-",
        "demand": cores(o["demand_cores"]),
        "cap": cores(o["cap_cores"]),
        "usage": cores(o["usage_cores"]),
        "queue": f"{o['queue']:.0f}",
        "latency": ms(o["latency_ms"]),
        "budget": ms(o.get("latency_budget_ms")),
    }


def _instance_rows(rec: dict, app: str, operator: str, wide: bool) -> list[Row]:
    rows = []
    for i in rec.get("instances", []):
        if (i["app"], i["operator"]) != (app, operator):
            continue
        note = f"demand: {i['demand_reason']}; hysteresis {i['hysteresis']}"
        if i.get("cut_cores", 0) > 1e-9:
            note += f"; cut {i['cut_cores']:.2f} cores"
        cells = {
            "operator": f"#{i['instance']} on {i['node']}",
            "demand": cores(i["demand_cores"]),
            "cap": cores(i["cap_cores"]),
            "usage": cores(i["usage_cores"]),
            "queue": f"{i['queue']:.0f}",
        }
        if wide:
            cells["reason"] = note
        rows.append(Row(cells, note="" if wide else note, depth=1 if wide else 2))
    for h in rec.get("held", []):
        if (h["app"], h["operator"]) != (app, operator):
            continue
        note = f"held: {h['reason']}"
        cells = {"operator": f"#{h['instance']} on {h['node']}", "cap": cores(h["cap_cores"])}
        if wide:
            cells["reason"] = note
        rows.append(Row(cells, note="" if wide else note, depth=1 if wide else 2))
    return rows


def plan_lines(
    reply: pb.PlanReply, rec: dict, width: int | None, *, instances: bool = False
) -> list[Text]:
    """The last plan: one row per operator (instances folded unless asked), reasons,
    then one row per application, the notes and the node recommendation."""
    ops = rec.get("operators", [])
    n_inst = sum(o["instances"] for o in ops)
    title = (
        f"epoch {reply.epoch} ({mode_name(reply.mode)}): {len({o['app'] for o in ops})} "
        f"application(s), {len(ops)} operator(s), {n_inst} instance(s)"
    )
    out = [Text(s, style="bold") for s in wrap(title, width)]
    reasons = operator_reasons(rec)
    classes = {a["app"]: a["class"] for a in rec.get("apps", [])}
    wide = width is None
    if wide:
        t = Layout(PLAN_WIDE_COLS)
        for o in ops:
            cells = _operator_cells(o)
            cells["reason"] = reasons.get((o["app"], o["operator"]), "")
            t.add(Row(cells))
            if instances:
                for row in _instance_rows(rec, o["app"], o["operator"], True):
                    t.add(row)
    else:
        t = Layout(PLAN_COLS)
        app = None
        for o in ops:
            if o["app"] != app:
                app = o["app"]
                cls = classes.get(app)
                t.add(Heading(app + (f" ({cls})" if cls else "")))
            key = (o["app"], o["operator"])
            t.add(Row(_operator_cells(o), note=reasons.get(key, ""), depth=1))
            if instances:
                for row in _instance_rows(rec, o["app"], o["operator"], False):
                    t.add(row)
    out += t.lines(width)
    if rec.get("apps"):
        out.append(Text(""))
        out.append(Text("applications", style="bold"))
        out += apps_lines(rec, width)
    for note in rec.get("notes", []):
        out += [Text(s) for s in wrap(note, width, "- ", "  ")]
    node = rec.get("node_recommendation")
    if node:
        out += [
            Text(s)
            for s in wrap(f"nodes: {node['nodes_delta']:+d} ({node['reason']})", width, "- ", "  ")
        ]
    return out


def apps_lines(rec: dict, width: int | None) -> list[Text]:
    """Per application: class, latency against its target, caps and what was cut."""
    cols = [
        Col("app", "APP", right=False, name=True),
        Col("class", "CLASS", right=False),
        Col("target", "TARGET MS"),
        Col("latency", "LAT MS"),
        Col("estimate", "EST MS"),
        Col("caps", "CAPS"),
        Col("cut", "CUT"),
    ]
    if width is None:
        cols[2:2] = [Col("weight", "WEIGHT")]
        cols += [
            Col("demand", "DEMAND"),
            Col("floor", "FLOOR"),
            Col("allocated", "ALLOCATED"),
            Col("dp", "DP UNITS"),
            Col("violation", "PRED VIOLATION"),
        ]
    t = Layout(cols)
    for a in rec.get("apps", []):
        pv = a.get("predicted_violation_ratio")
        t.add(
            Row(
                {
                    "app": a["app"],
                    "class": a["class"],
                    "weight": f"{a['weight']:g}",
                    "target": ms(a["target_ms"]),
                    "latency": ms(a.get("latency_ms")),
                    "estimate": ms(a.get("latency_estimate_ms")),
                    "caps": cores(a["cap_cores"]),
                    "cut": cores(a["cut_cores"]),
                    "demand": cores(a["demand_cores"]),
                    "floor": cores(a.get("floor_cores")),
                    "allocated": cores(a["allocated_cores"]),
                    "dp": str(a.get("dp_units", "-")),
                    "violation": "-" if pv is None else f"{pv:.2f}",
                },
                style="red" if a.get("violation") else "",
            )
        )
    return t.lines(width)


# --- qos ----------------------------------------------------------------------


def qos_lines(r: pb.ListQosReply, width: int | None) -> list[Text]:
    out = [Text("classes", style="bold")]
    t = Layout(
        [
            Col("name", "CLASS", right=False, name=True),
            Col("target", "TARGET MS"),
            Col("violation", "MAX VIOLATION"),
            Col("weight", "WEIGHT"),
        ]
    )
    for c in r.classes:
        t.add(
            Row(
                {
                    "name": c.name,
                    "target": f"{c.target_latency_ms:g}",
                    "violation": f"{c.max_violation_ratio:g}",
                    "weight": f"{c.weight:g}",
                }
            )
        )
    out += t.lines(width)
    out += [Text(""), Text(f"assignments (default {r.default_class})", style="bold")]
    t = Layout(
        [
            Col("app", "APP", right=False, name=True),
            Col("class", "CLASS", right=False),
            Col("known", "KNOWN", right=False),
            Col("source", "SOURCE", right=False),
        ]
    )
    for a in r.assignments:
        t.add(
            Row(
                {
                    "app": a.app,
                    "class": a.qos_class,
                    "known": "yes" if a.app_known else "no",
                    "source": "default" if a.defaulted else "set",
                }
            )
        )
    if r.assignments:
        out += t.lines(width)
    else:
        out.append(Text("none"))
    return out


def json_text(value: Any) -> str:
    import json

    return json.dumps(value, indent=2, default=float)
