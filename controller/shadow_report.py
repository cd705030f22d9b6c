"""What enforce mode would have done, told from the decision log (`dschedctl report`).

Operators keep dsched in dry-run for days before they trust it. Every epoch
leaves a decision record (controller/record.py) whether or not it acted; this
module sums a window of them into a :class:`ShadowReport`. It is pure: records
in (one at a time, oldest first, so a long window never has to sit in memory),
dataclasses out, plus the text and JSON renderings `dschedctl report` prints.

Definitions (docs/operations.md, "Dry-run shadow report", says the same):

* **In force**, per instance and epoch: the cap the instance's cgroup held
  during the last slot as its agent reported it (``cap_in_force``: a cap left
  from an earlier enforce period, or a limit dsched's cgroup carries), else,
  for an uncapped instance, the CPU it used in that slot (``usage_cores``): an
  uncapped instance holds what it uses.
* **Freed** = in force - recommended cap (``cap_cores``) where positive;
  **added** = recommended cap - in force where positive; **net** = freed -
  added. Each instance-epoch counts for the record's ``slot_seconds``, so sums
  are core-seconds; mean cores = core-seconds / the seconds of the epochs in
  which the application (class, cluster) was decided. Held instances
  (unmeasured: their counters were missing) keep the cap they have in either
  mode and count for neither. **Over usage** = usage - recommended cap where
  positive: CPU the instance used that the recommended cap would not have
  allowed (what enforce mode would have throttled).
* **Missed**: an epoch whose predicted mean latency under the recommended caps
  (``latency_estimate_ms``, Allen-Cunneen) is above the class's target, or is
  unbounded (a queue the caps cannot drain: no estimate, predicted violation
  ratio 1). Shares are of the epochs that had an estimate; per class, of the
  application-epochs of that class.
* **Cap changes**: instance-epochs whose hysteresis step wrote a cap
  (``first``, ``raise``, ``lower``, ``fit-node``); ``hold`` and ``held`` write
  nothing.
* **Moves**: distinct (instance, from node, to node) moves in the placement
  plans of the window. In dry-run nothing moves, so every plan proposes the
  same moves again; enforce mode would have made each once.
  ``recommended`` moves are those of instances whose engine places them itself
  (dsched would only have recommended them).
* **Knows too little** (``insufficient``): decided in fewer than ``phi``
  epochs (its forecast window never filled), or at least
  :data:`MISSING_SHARE` of its instance-epochs held for missing counters, or
  of its decided epochs without a measured end-to-end latency (no sink latency
  counter) or without a latency estimate.
"""

from __future__ import annotations

import argparse
import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from rich import box
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

# Bounds of one report (the admin door enforces them).
DEFAULT_SINCE_SECONDS = 24 * 3600.0
MAX_SINCE_SECONDS = 7 * 24 * 3600.0
MAX_REPORT_EPOCHS = 100_000
# A counter missing in at least this share of an application's epochs marks it.
MISSING_SHARE = 0.1
# Hysteresis steps that write a cap.
CAP_WRITES = ("first", "raise", "lower", "fit-node")

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 7 * 86400.0}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")


def parse_duration(text: str) -> float:
    """``30m``, ``6h``, ``2d``, ``1h30m`` (units s, m, h, d, w) in seconds.

    ValueError for anything else, zero or negative."""
    s = text.strip().lower()
    if s.startswith("-"):
        raise ValueError(f"duration must be positive, got {text!r}")
    parts = _DURATION.findall(s)
    if not s or "".join(n + u for n, u in parts) != s:
        raise ValueError(f"not a duration: {text!r} (e.g. 30m, 6h, 2d)")
    seconds = sum(float(n) * _UNITS[u] for n, u in parts)
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"duration must be positive, got {text!r}")
    return seconds


def format_duration(seconds: float) -> str:
    """Seconds as ``2d 3h``, ``6h 5m``, ``12m 30s`` or ``40s``."""
    s = max(0, round(seconds))
    d, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    if d:
        return f"{d}d {h}h"
    if h:
        return f"{h}h {m}m"
    if m:
        return f"{m}m {s}s"
    return f"{s}s"


@dataclass
class Figures:
    """What enforce mode would have done for a group (an app, a class, the cluster).

    ``epochs``/``seconds``: the records (and their slot seconds) in which the
    group was decided. ``estimated_epochs``/``missed_epochs``/``over_bound_epochs``
    count application-epochs."""

    epochs: int = 0
    seconds: float = 0.0
    in_force_core_seconds: float = 0.0
    cap_core_seconds: float = 0.0
    freed_core_seconds: float = 0.0
    added_core_seconds: float = 0.0
    over_usage_core_seconds: float = 0.0
    estimated_epochs: int = 0
    missed_epochs: int = 0
    over_bound_epochs: int = 0  # predicted violation ratio above the class's bound
    cap_changes: int = 0
    moves: int = 0
    stateful_moves: int = 0
    recommended_moves: int = 0

    @property
    def net_core_seconds(self) -> float:
        return self.freed_core_seconds - self.added_core_seconds

    def _mean(self, core_seconds: float) -> float:
        return core_seconds / self.seconds if self.seconds > 0 else 0.0

    @property
    def mean_freed_cores(self) -> float:
        return self._mean(self.freed_core_seconds)

    @property
    def mean_net_cores(self) -> float:
        return self._mean(self.net_core_seconds)

    @property
    def mean_in_force_cores(self) -> float:
        return self._mean(self.in_force_core_seconds)

    @property
    def mean_cap_cores(self) -> float:
        return self._mean(self.cap_core_seconds)

    @property
    def miss_share(self) -> float | None:
        return self.missed_epochs / self.estimated_epochs if self.estimated_epochs else None

    def to_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "net_core_seconds": self.net_core_seconds,
            "mean_in_force_cores": self.mean_in_force_cores,
            "mean_cap_cores": self.mean_cap_cores,
            "mean_freed_cores": self.mean_freed_cores,
            "mean_net_cores": self.mean_net_cores,
            "miss_share": self.miss_share,
        }


@dataclass
class AppShadow(Figures):
    """One application: the figures plus what the controller did not know about it."""

    app: str = ""
    qos_class: str = ""  # the class of its newest epoch in the window
    first_epoch: int = 0  # first record in the window that mentions it
    last_epoch: int = 0
    appeared_mid_window: bool = False
    warmup_epochs: int = 0  # decided before its forecast window filled (new apps only)
    instance_epochs: int = 0  # measured + held
    held_instance_epochs: int = 0
    held_reasons: dict[str, int] = field(default_factory=dict)
    held_only_epochs: int = 0  # epochs with no measured instance at all
    no_latency_epochs: int = 0  # decided without a measured end-to-end latency
    no_estimate_epochs: int = 0  # decided without a latency estimate
    measured_missed_epochs: int = 0  # measured latency above target (caps not in force)
    cap_changes_by_reason: dict[str, int] = field(default_factory=dict)
    insufficient: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        out["class"] = out.pop("qos_class")
        return out


@dataclass
class ClassShadow(Figures):
    qos_class: str = ""
    apps: int = 0

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        out["class"] = out.pop("qos_class")
        return out


@dataclass
class ShadowReport:
    since_seconds: float
    epochs: int = 0
    first_epoch: int | None = None
    last_epoch: int | None = None
    first_timestamp: float | None = None
    last_timestamp: float | None = None
    epochs_by_mode: dict[str, int] = field(default_factory=dict)
    truncated: bool = False  # more records in the window than one report reads
    phi: int = 0
    apps: list[AppShadow] = field(default_factory=list)
    classes: list[ClassShadow] = field(default_factory=list)
    total: Figures = field(default_factory=Figures)

    @property
    def covered_seconds(self) -> float:
        return self.total.seconds

    @property
    def insufficient(self) -> list[AppShadow]:
        return [a for a in self.apps if a.insufficient]

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ShadowReport:
        """The report back from :meth:`to_dict` (what the admin door sends)."""
        r = cls(**{k: d[k] for k in _SCALARS if k in d})
        r.total = _from_dict(Figures, d.get("total", {}))
        r.classes = [_from_dict(ClassShadow, c) for c in d.get("classes", [])]
        r.apps = [_from_dict(AppShadow, a) for a in d.get("apps", [])]
        return r

    def to_dict(self) -> dict[str, Any]:
        return {
            "since_seconds": self.since_seconds,
            "epochs": self.epochs,
            "first_epoch": self.first_epoch,
            "last_epoch": self.last_epoch,
            "first_timestamp": self.first_timestamp,
            "last_timestamp": self.last_timestamp,
            "epochs_by_mode": dict(self.epochs_by_mode),
            "truncated": self.truncated,
            "phi": self.phi,
            "total": self.total.to_dict(),
            "classes": [c.to_dict() for c in self.classes],
            "apps": [a.to_dict() for a in self.apps],
            "insufficient": {a.app: list(a.insufficient) for a in self.insufficient},
        }


_SCALARS = (
    "since_seconds",
    "epochs",
    "first_epoch",
    "last_epoch",
    "first_timestamp",
    "last_timestamp",
    "epochs_by_mode",
    "truncated",
    "phi",
)


def _from_dict(kind: type, d: Mapping[str, Any]) -> Any:
    d = dict(d)
    if "class" in d:
        d["qos_class"] = d.pop("class")
    names = {f.name for f in fields(kind)}
    return kind(**{k: v for k, v in d.items() if k in names})


class ShadowReportBuilder:
    """Adds decision records one at a time (oldest first); :meth:`result` sums them up."""

    def __init__(self, since_seconds: float, phi: int):
        self.report = ShadowReport(since_seconds=since_seconds, phi=phi)
        self._apps: dict[str, AppShadow] = {}
        self._classes: dict[str, ClassShadow] = {}
        self._class_apps: dict[str, set[str]] = {}
        self._moves: set[tuple[str, str, str]] = set()
        self._recommended: set[tuple[str, str, str]] = set()

    def _app(self, app: str, epoch: int) -> AppShadow:
        a = self._apps.get(app)
        if a is None:
            a = self._apps[app] = AppShadow(
                app=app,
                first_epoch=epoch,
                appeared_mid_window=self.report.epochs > 1,
            )
        a.last_epoch = epoch
        return a

    def _class(self, name: str, app: str) -> ClassShadow:
        c = self._classes.get(name)
        if c is None:
            c = self._classes[name] = ClassShadow(qos_class=name)
            self._class_apps[name] = set()
        self._class_apps[name].add(app)
        return c

    def add(self, rec: Mapping[str, Any]) -> None:
        """Take one decision record (newer than those added before)."""
        r = self.report
        epoch, ts = int(rec["epoch"]), float(rec["timestamp"])
        slot = float(rec.get("slot_seconds") or 0.0)
        r.epochs += 1
        if r.first_epoch is None:
            r.first_epoch, r.first_timestamp = epoch, ts
        r.last_epoch, r.last_timestamp = epoch, ts
        mode = str(rec.get("mode", ""))
        r.epochs_by_mode[mode] = r.epochs_by_mode.get(mode, 0) + 1

        rows = {row["app"]: row for row in rec.get("apps", [])}
        sums: dict[str, list[float]] = {}  # app -> in force, cap, freed, added, over, writes
        reasons: dict[str, dict[str, int]] = {}
        counts: dict[str, int] = {}
        for inst in rec.get("instances", []):
            app = inst["app"]
            cap = float(inst["cap_cores"])
            usage = float(inst.get("usage_cores") or 0.0)
            held_cap = inst.get("cap_in_force")
            in_force = usage if held_cap is None else float(held_cap)
            s = sums.get(app)
            if s is None:
                s = sums[app] = [0.0, 0.0, 0.0, 0.0, 0.0]
                reasons[app] = {}
                counts[app] = 0
            s[0] += in_force
            s[1] += cap
            if in_force > cap:
                s[2] += in_force - cap
            else:
                s[3] += cap - in_force
            if usage > cap:
                s[4] += usage - cap
            counts[app] += 1
            why = inst.get("hysteresis")
            if why in CAP_WRITES:
                reasons[app][why] = reasons[app].get(why, 0) + 1
        held: dict[str, dict[str, int]] = {}
        for h in rec.get("held", []):
            per = held.setdefault(h["app"], {})
            per[h.get("reason", "")] = per.get(h.get("reason", ""), 0) + 1

        classes_now: dict[str, str] = {}
        decided: set[str] = set()  # classes of the apps decided this epoch
        any_decided = False
        for app in sorted(set(rows) | set(sums) | set(held)):
            a = self._app(app, epoch)
            row = rows.get(app)
            if row is not None:
                a.qos_class = str(row["class"])
            # Only a decided app's row names its class (held-only apps have none).
            cls = a.qos_class
            classes_now[app] = cls
            c = self._class(cls, app) if cls else None
            n_held = sum(held.get(app, {}).values())
            a.instance_epochs += counts.get(app, 0) + n_held
            a.held_instance_epochs += n_held
            for why, n in held.get(app, {}).items():
                a.held_reasons[why] = a.held_reasons.get(why, 0) + n
            if row is None and app not in sums:
                a.held_only_epochs += 1
                continue
            # Decided this epoch.
            any_decided = True
            if cls:
                decided.add(cls)
            a.epochs += 1
            a.seconds += slot
            if a.appeared_mid_window and a.epochs < r.phi:
                a.warmup_epochs += 1
            s = sums.get(app, [0.0] * 5)
            writes = reasons.get(app, {})
            for why, n in writes.items():
                a.cap_changes_by_reason[why] = a.cap_changes_by_reason.get(why, 0) + n
            n_writes = sum(writes.values())
            missed = over_bound = estimated = False
            if row is not None:
                est = row.get("latency_estimate_ms")
                ratio = row.get("predicted_violation_ratio")
                target = float(row["target_ms"])
                if est is not None:
                    estimated, missed = True, float(est) > target
                elif ratio is not None:  # no finite estimate: the caps cannot drain the queue
                    estimated, missed = True, True
                if ratio is not None:
                    over_bound = float(ratio) > float(row["max_violation_ratio"])
                if row.get("latency_ms") is None:
                    a.no_latency_epochs += 1
                elif float(row["latency_ms"]) > target:
                    a.measured_missed_epochs += 1
            if not estimated:
                a.no_estimate_epochs += 1
            for fig in (a, c, r.total) if c is not None else (a, r.total):
                fig.in_force_core_seconds += s[0] * slot
                fig.cap_core_seconds += s[1] * slot
                fig.freed_core_seconds += s[2] * slot
                fig.added_core_seconds += s[3] * slot
                fig.over_usage_core_seconds += s[4] * slot
                fig.estimated_epochs += estimated
                fig.missed_epochs += missed
                fig.over_bound_epochs += over_bound
                fig.cap_changes += n_writes
        for cls in decided:
            c = self._classes[cls]
            c.epochs += 1
            c.seconds += slot
        if any_decided:
            r.total.epochs += 1
            r.total.seconds += slot
        self._add_moves(rec.get("placement") or {}, classes_now, epoch)

    def _add_moves(self, placement: Mapping[str, Any], classes_now: dict[str, str], epoch: int):
        if not placement.get("planned"):
            return
        for kind, seen in (("moves", self._moves), ("recommended", self._recommended)):
            for m in placement.get(kind) or []:
                key = (str(m["instance"]), str(m.get("from_node")), str(m.get("to_node")))
                if key in seen:
                    continue
                seen.add(key)
                app = key[0].split("/", 1)[0]
                a = self._app(app, epoch)
                cls = classes_now.get(app) or a.qos_class
                figs = (a, self.report.total) + ((self._class(cls, app),) if cls else ())
                for fig in figs:
                    if kind == "moves":
                        fig.moves += 1
                        fig.stateful_moves += bool(m.get("stateful"))
                    else:
                        fig.recommended_moves += 1

    def result(self, truncated: bool = False) -> ShadowReport:
        r = self.report
        r.truncated = truncated
        r.apps = sorted(self._apps.values(), key=lambda a: a.app)
        for a in r.apps:
            a.insufficient = _insufficient(a, r.phi)
        r.classes = sorted(self._classes.values(), key=lambda c: c.qos_class)
        for c in r.classes:
            c.apps = len(self._class_apps[c.qos_class])
        return r


def _insufficient(a: AppShadow, phi: int) -> list[str]:
    out = []
    if not a.epochs:
        out.append("never measured in the window")
    elif a.epochs < phi:
        out.append(f"few slots: decided in {a.epochs} epoch(s), fewer than phi={phi}")
    if a.instance_epochs and a.held_instance_epochs >= MISSING_SHARE * a.instance_epochs:
        held = sorted(a.held_reasons.items())
        why = " | ".join(
            (k or "no reason given") + (f" x{n}" if len(held) > 1 else "") for k, n in held
        )
        out.append(
            f"counters missing: {a.held_instance_epochs} of {a.instance_epochs} "
            f"instance-epochs held ({why})"
        )
    if a.epochs and a.no_latency_epochs >= MISSING_SHARE * a.epochs:
        out.append(f"no measured latency in {a.no_latency_epochs} of {a.epochs} epoch(s)")
    if a.epochs and a.no_estimate_epochs >= MISSING_SHARE * a.epochs:
        out.append(f"no latency estimate in {a.no_estimate_epochs} of {a.epochs} epoch(s)")
    return out


def shadow_report(
    records: Iterable[Mapping[str, Any]],
    *,
    since_seconds: float,
    phi: int,
    truncated: bool = False,
) -> ShadowReport:
    """The report of ``records`` (decision records, oldest first)."""
    b = ShadowReportBuilder(since_seconds, phi)
    for rec in records:
        b.add(rec)
    return b.result(truncated)


# ------------------------------------------------------------------ rendering
def report_json(report: ShadowReport) -> str:
    return json.dumps(report.to_dict(), indent=2, default=float)


def _pct(share: float | None) -> str:
    return "-" if share is None else f"{100 * share:.0f}%"


def _core_seconds(v: float) -> str:
    if abs(v) >= 1e6:
        return f"{v / 1e6:.1f}M"
    if abs(v) >= 1e4:
        return f"{v / 1e3:.0f}k"
    return f"{v:.0f}"


def _moves(f: Figures) -> str:
    return str(f.moves) + (f"+{f.recommended_moves}r" if f.recommended_moves else "")


def _table(title: str, first: str, second: str) -> Table:
    t = Table(
        title=title,
        box=box.SIMPLE_HEAD,
        padding=(0, 1, 0, 0),
        pad_edge=False,
        show_edge=False,
        title_justify="left",
    )
    t.add_column(first, overflow="fold", min_width=8)
    t.add_column(second, overflow="fold", min_width=6, max_width=10)
    for col in ("epochs", "freed\ncore-s", "freed\ncores", "net\ncores", "missed", "cap\nchanges"):
        t.add_column(col, justify="right", no_wrap=True)
    t.add_column("moves", justify="right", no_wrap=True)
    return t


def _row(t: Table, name: str, cls: str, f: Figures) -> None:
    t.add_row(
        name,
        cls,
        str(f.epochs),
        _core_seconds(f.freed_core_seconds),
        f"{f.mean_freed_cores:.2f}",
        f"{f.mean_net_cores:+.2f}",
        _pct(f.miss_share),
        str(f.cap_changes),
        _moves(f),
    )


def render(report: ShadowReport) -> Group:
    """The text report: a headline, per-app and per-class tables (80 columns), notes."""
    r = report
    if not r.epochs:
        return Group(
            Text(
                f"no decision records in the last {format_duration(r.since_seconds)}: "
                "the controller has not decided an epoch in that window"
            )
        )
    modes = ", ".join(f"{n} {m}" for m, n in sorted(r.epochs_by_mode.items()))
    span = (r.last_timestamp or 0.0) - (r.first_timestamp or 0.0)
    head = [
        Text(
            f"shadow report, last {format_duration(r.since_seconds)}: epochs "
            f"{r.first_epoch}-{r.last_epoch} ({modes}) over {format_duration(span)}"
        ),
        Text(
            f"enforce mode would have freed {r.total.mean_freed_cores:.2f} cores on average "
            f"(net {r.total.mean_net_cores:+.2f}; {_core_seconds(r.total.freed_core_seconds)} "
            f"core-s), made {r.total.cap_changes} cap change(s) and {r.total.moves} move(s); "
            f"predicted latency missed its target in {_pct(r.total.miss_share)} of "
            "app-epochs"
        ),
    ]
    if r.truncated:
        head.append(Text(f"(only the newest {r.epochs} records of the window were read)"))
    apps = _table("per application", "app", "class")
    for a in r.apps:
        _row(apps, a.app, a.qos_class or "-", a)
    classes = _table("per class", "class", "apps")
    for c in r.classes:
        _row(classes, c.qos_class, str(c.apps), c)
    parts: list[Any] = [*head, Text(), apps, Text(), classes]
    parts.append(Text())
    parts.append(
        Text(
            "freed/net: mean cores vs. the caps in force (usage where uncapped); "
            "missed: share of epochs whose predicted latency is over target; "
            "moves: distinct moves (+r: recommended only)",
            style="dim",
        )
    )
    if r.insufficient:
        parts.append(Text())
        parts.append(Text("knows too little about:"))
        for a in r.insufficient:
            parts.append(Text(f"- {a.app}: {'; '.join(a.insufficient)}"))
    return Group(*parts)


# ------------------------------------------------------------------ dschedctl
def since_arg(text: str) -> float:
    """``--since`` for argparse: a positive duration up to a week, in seconds."""
    try:
        seconds = parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if seconds > MAX_SINCE_SECONDS:
        raise argparse.ArgumentTypeError(
            f"at most {format_duration(MAX_SINCE_SECONDS)}, got {text!r}"
        )
    return seconds


# dschedctl waits at least this long for a report.
REPORT_TIMEOUT_SECONDS = 60.0


def print_report(text: str, as_json: bool, console: Console) -> None:
    """What `dschedctl report` prints from the admin door's JSON."""
    if as_json:
        print(text or "{}")
        return
    console.print(render(ShadowReport.from_dict(json.loads(text))))
