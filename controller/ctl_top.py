"""`dschedctl top`: a live view of the plan, refreshed from the admin door.

Each refresh asks Status (mode, epoch, agents), GetPlan (the decision record)
and ListQos (each application's class and its latency target) and shows one row
per operator: rate, predicted rate, cap, usage and the reason, under a line per
application with its class and latency (estimated, else measured) against its
target. Keys on a terminal: ``s`` cycles the sort, ``q`` quits; Ctrl-C and SIGTERM
quit too, with the terminal restored. When the controller goes away the header
says so, the last rows stay, and every refresh tries again on a new channel.
"""

from __future__ import annotations

import contextlib
import json
import select
import signal
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc
from rich.console import Console, ConsoleOptions, RenderResult
from rich.live import Live
from rich.text import Text

from controller.ctl_views import (
    Col,
    Heading,
    Layout,
    Row,
    cores,
    mode_name,
    ms,
    operator_reasons,
    rate,
    wrap,
)
from dsched_pb import dsched_pb2 as pb
from dsched_pb import dsched_pb2_grpc as pb_grpc

SORTS = ("cap", "usage", "rate", "latency", "app")


def _latency_share(row: dict) -> float:
    lat = row["latency_estimate_ms"]
    if lat is None:
        lat = row["latency_ms"]
    if lat is None or not row["target_ms"]:
        return -1.0
    return lat / row["target_ms"]


def sort_rows(rows: list[dict], key: str) -> list[dict]:
    """Largest first (cap, usage, rate; latency as a share of the target), or by name."""
    name = [(r["app"], r["operator"]) for r in rows]
    order = sorted(range(len(rows)), key=lambda i: name[i])
    if key == "app":
        return [rows[i] for i in order]
    value: Callable[[dict], float] = {
        "cap": lambda r: r["cap_cores"],
        "usage": lambda r: r["usage_cores"],
        "rate": lambda r: r["rate"],
        "latency": _latency_share,
    }[key]
    return sorted((rows[i] for i in order), key=value, reverse=True)


def frame_data(status: pb.StatusReply, plan: pb.PlanReply, qos: pb.ListQosReply) -> dict:
    """One frame's data: the header's numbers and one row per operator."""
    rec = json.loads(plan.record_json) if plan.record_json else {}
    classes = {c.name: c for c in qos.classes}
    assigned = {a.app: a.qos_class for a in qos.assignments}
    apps = {a["app"]: a for a in rec.get("apps", [])}
    reasons = operator_reasons(rec)
    rows = []
    for o in rec.get("operators", []):
        a = apps.get(o["app"], {})
        cls = assigned.get(o["app"]) or a.get("class") or qos.default_class
        target = classes[cls].target_latency_ms if cls in classes else a.get("target_ms")
        rows.append(
            {
                "app": o["app"],
                "operator": o["operator"],
                "class": cls,
                "instances": o["instances"],
                "rate": o["arrival_rate"],
                "predicted_rate": o["predicted_rate"],
                "predictor": o["predictor"],
                "demand_cores": o["demand_cores"],
                "cap_cores": o["cap_cores"],
                "usage_cores": o["usage_cores"],
                "latency_ms": a.get("latency_ms"),
                "latency_estimate_ms": a.get("latency_estimate_ms"),
                "target_ms": target,
                "violation": bool(a.get("violation")),
                "reason": reasons.get((o["app"], o["operator"]), ""),
            }
        )
    return {
        "mode": mode_name(status.mode),
        "epoch": status.epoch,
        "plan_epoch": plan.epoch,
        "agents": len(status.agents),
        "applications": status.applications,
        "instances": status.instances,
        "capacity_cores": sum(rec.get("capacity_cores", {}).values()),
        "usable_cores": sum(rec.get("usable_cores", {}).values()),
        "cap_cores": sum(r["cap_cores"] for r in rows),
        "rows": rows,
    }


def fetch(stub: pb_grpc.AdminServiceStub, timeout: float) -> dict:
    status = stub.Status(pb.StatusRequest(), timeout=timeout)
    plan = stub.GetPlan(pb.GetPlanRequest(), timeout=timeout)
    qos = stub.ListQos(pb.ListQosRequest(), timeout=timeout)
    return frame_data(status, plan, qos)


@dataclass
class TopState:
    """What the view shows: the last frame read, and whether the controller answered."""

    address: str
    interval: float
    sort: str = "cap"
    keys: bool = False
    data: dict | None = None
    error: str = ""
    read_at: float = 0.0  # wall clock of the last answer

    def frame(self) -> dict[str, Any]:
        """The frame as JSON-able data (``top --once --json``)."""
        data = dict(self.data or {"rows": []})
        data["rows"] = sort_rows(data["rows"], self.sort)
        return {
            "reachable": not self.error,
            "error": self.error,
            "address": self.address,
            "sort": self.sort,
            **data,
        }


def _app_heading(r: dict) -> str:
    lat = ms(r["latency_ms"])
    est = ms(r["latency_estimate_ms"])
    target = ms(r["target_ms"])
    return f"{r['app']}  {r['class']}  lat {lat} ms, est {est} ms / target {target} ms"


NARROW_COLS = [
    Col("operator", "APP / OPERATOR", right=False, name=True),
    Col("rate", "RATE/S"),
    Col("predicted", "PRED/S"),
    Col("cap", "CAP"),
    Col("usage", "USAGE"),
]
WIDE_COLS = [
    Col("app", "APP", right=False, name=True),
    Col("operator", "OPERATOR", right=False, name=True),
    Col("class", "CLASS", right=False),
    Col("inst", "INST"),
    Col("rate", "RATE/S"),
    Col("predicted", "PRED/S"),
    Col("demand", "DEMAND"),
    Col("cap", "CAP"),
    Col("usage", "USAGE"),
    Col("latency", "LAT MS"),
    Col("estimate", "EST MS"),
    Col("target", "TARGET MS"),
    Col("reason", "REASON", right=False),
]


# The header keeps the rows in view: gRPC's details run to several lines (the
# whole error is in --json and `dschedctl status`).
BRIEF_ERROR_CHARS = 60


def _brief(error: str) -> str:
    """The first clause of an error, at most BRIEF_ERROR_CHARS characters."""
    first = error.split(";", 1)[0].strip()
    if len(first) <= BRIEF_ERROR_CHARS:
        return first
    return first[: BRIEF_ERROR_CHARS - 1].rstrip() + "…"


def frame_lines(state: TopState, width: int | None) -> list[Text]:
    f = state.frame()
    stamp = time.strftime("%H:%M:%S", time.localtime(state.read_at)) if state.read_at else "-"
    out: list[Text] = []
    if state.data is not None:
        head = (
            f"dsched top  epoch {f['epoch']}  mode {f['mode']}  {f['agents']} agent(s)  "
            f"{f['applications']} app(s)  {f['instances']} instance(s)"
        )
    else:
        head = "dsched top"
    out += [Text(s, style="bold") for s in wrap(head, width)]
    if state.error:
        why = f"controller not reachable at {state.address} ({_brief(state.error)}); retrying"
        out += [Text(s, style="bold red") for s in wrap(why, width)]
    caps = (
        f"caps {f['cap_cores']:.2f} of {f['usable_cores']:.2f} cores  "
        if state.data is not None
        else ""
    )
    keys = "  s: sort  q: quit" if state.keys else ""
    info = f"{caps}sort {state.sort}  every {state.interval:g} s  at {stamp}{keys}"
    out += [Text(s, style="dim") for s in wrap(info, width)]
    rows = f["rows"]
    if state.data is not None and not rows:
        out.append(Text("no plan yet: the controller has not finished an epoch with data"))
        return out
    if width is None:
        t = Layout(WIDE_COLS)
        for r in rows:
            t.add(Row(_cells(r) | {"reason": r["reason"]}, style="red" if r["violation"] else ""))
    else:
        t = Layout(NARROW_COLS)
        app = None
        for r in rows:
            if r["app"] != app:
                app = r["app"]
                t.add(Heading(_app_heading(r), style="bold red" if r["violation"] else "bold"))
            t.add(Row(_cells(r), note=r["reason"], depth=1))
    if rows:
        out += t.lines(width)
    return out


def _cells(r: dict) -> dict[str, str]:
    return {
        "app": r["app"],
        "operator": r["operator"],
        "class": r["class"],
        "inst": str(r["instances"]),
        "rate": rate(r["rate"]),
        "predicted": rate(r["predicted_rate"]),
        "demand": cores(r["demand_cores"]),
        "cap": cores(r["cap_cores"]),
        "usage": cores(r["usage_cores"]),
        "latency": ms(r["latency_ms"]),
        "estimate": ms(r["latency_estimate_ms"]),
        "target": ms(r["target_ms"]),
    }


@dataclass
class TopView:
    """The live renderable: laid out again for the terminal's size at every refresh."""

    state: TopState
    wide: bool = False

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        lines = frame_lines(self.state, None if self.wide else options.max_width)
        height = options.height or console.height
        if len(lines) > height:
            hidden = len(lines) - height + 1
            lines = lines[: height - 1]
            lines.append(Text(f"... {hidden} more line(s) below", style="dim"))
        for line in lines:
            line.no_wrap = self.wide
            line.overflow = "crop" if self.wide else "fold"
            yield line


class _Terminated(Exception):
    """SIGTERM: leave like q does."""


@dataclass
class Poller:
    """Reads frames into ``state``; a failed read drops the channel and the next read
    opens a new one, so a restarted controller is found again."""

    state: TopState
    connect: Callable[[], grpc.Channel]
    timeout: float
    channel: grpc.Channel | None = field(default=None, repr=False)

    def poll(self) -> None:
        if self.channel is None:
            self.channel = self.connect()
        try:
            data = fetch(pb_grpc.AdminServiceStub(self.channel), self.timeout)
        except grpc.RpcError as exc:
            code = exc.code()
            name = code.name.lower() if code is not None else "error"
            self.state.error = f"{name}: {exc.details()}"
            self.close()
            return
        self.state.data, self.state.error, self.state.read_at = data, "", time.time()

    def close(self) -> None:
        if self.channel is not None:
            self.channel.close()
            self.channel = None


@contextlib.contextmanager
def _cbreak(stream) -> Iterator[bool]:
    """Keys one at a time without echo (Ctrl-C still interrupts); restored on the way out."""
    try:
        import termios
        import tty

        fd = stream.fileno()
        if not stream.isatty():
            raise OSError
        saved = termios.tcgetattr(fd)
    except (OSError, ValueError, ImportError, AttributeError):
        yield False
        return
    try:
        tty.setcbreak(fd)
        yield True
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def _key(stream, timeout: float) -> str:
    ready, _, _ = select.select([stream], [], [], max(0.0, timeout))
    if not ready:
        return ""
    import os

    return os.read(stream.fileno(), 32).decode(errors="replace")


def run(
    poller: Poller, console: Console, *, wide: bool = False, stdin=None, max_frames: int = 0
) -> int:
    """Refresh until q, Ctrl-C or SIGTERM; 0 in every case. Not on a terminal: a
    frame per interval, one after another (``max_frames`` > 0 stops after that many)."""
    state = poller.state
    stdin = stdin or sys.stdin

    def terminate(signum, frame):
        raise _Terminated()

    try:
        previous = signal.signal(signal.SIGTERM, terminate)
    except ValueError:  # not the main thread: SIGTERM keeps its handler
        previous = None
    frames = 0
    try:
        if not console.is_terminal:
            while True:
                poller.poll()
                for line in frame_lines(state, None if wide else console.width):
                    console.print(line, soft_wrap=True)
                frames += 1
                if max_frames and frames >= max_frames:
                    return 0
                console.print()
                time.sleep(state.interval)
        with _cbreak(stdin) as keys:
            state.keys = keys
            view = TopView(state, wide)
            with Live(
                view,
                console=console,
                screen=True,
                auto_refresh=False,
                redirect_stdout=False,
                redirect_stderr=False,
            ) as live:
                due = 0.0
                while True:
                    if time.monotonic() >= due:
                        poller.poll()
                        due = time.monotonic() + state.interval
                        live.refresh()
                    wait = due - time.monotonic()
                    if not keys:
                        time.sleep(max(0.0, wait))
                        continue
                    pressed = _key(stdin, wait)
                    if "q" in pressed or "Q" in pressed:
                        return 0
                    if "s" in pressed:
                        state.sort = SORTS[(SORTS.index(state.sort) + 1) % len(SORTS)]
                        live.refresh()
    except (KeyboardInterrupt, _Terminated):
        return 0
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        poller.close()
