"""dschedctl's views against a real controller on its admin socket: every view fits
80 columns with applications, operators, caps and reasons whole; --wide shows every
column; --json parses for every command, given before or after the subcommand."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from controller import ctl
from controller.ctl import main
from controller.ctl_views import operator_reasons
from dsched_pb import dsched_pb2 as pb
from tests.controller_server_support import config, start, stop

# A WordCount-like chain per application: (operator, upstream, CPU s/tuple, fan-out).
CHAIN = (
    ("ingest-kafka-source", (), 0.0002, 1),
    ("enrich-with-geo", ("ingest-kafka-source",), 0.001, 3),
    ("sessionize-by-user-id", ("enrich-with-geo",), 0.0003, 0),
)
# An application and an operator too long for a narrow row's name column.
LONG_APP = "clickstream-sessionizer-europe-west-marketing-analytics"
LONG_OP = "enrich-with-geo-and-device-fingerprint-lookups-v2"
APPS = {"clickstream-sessionizer": 300.0, "payments": 120.0, LONG_APP: 60.0}
EPOCHS = 6


class Agent:
    """One node's cumulative counters, reported as an agent reports them (a slot apart)."""

    def __init__(self, controller, node: str = "n1", cores: float = 2.0):
        self.controller, self.node, self.slot = controller, node, 0
        self.totals: dict[tuple, dict] = {}
        # Reports a slot apart, ending now: rates come out as tuples per second.
        self.t0 = time.time() - EPOCHS - 1
        controller.on_hello(pb.Hello(node_id=node, cpu_capacity_cores=cores, slot_seconds=1.0))

    def report(self) -> None:
        samples = []
        for app, rate in APPS.items():
            arriving = rate
            for op, up, kappa, fanout in CHAIN:
                if app == LONG_APP and op == "enrich-with-geo":
                    op = LONG_OP
                up = tuple(LONG_OP if app == LONG_APP and u == "enrich-with-geo" else u for u in up)
                for inst in range(2):
                    t = self.totals.setdefault((app, op, inst), {"n": 0, "cpu": 0.0, "lat": 0.0})
                    share = arriving / 2
                    t["n"] += int(share)
                    t["cpu"] += share * kappa
                    if not fanout:  # the sink completes root tuples
                        t["lat"] += 0.02 * int(share)
                    samples.append(
                        pb.InstanceSample(
                            key=pb.InstanceKey(app=app, operator=op, instance=inst),
                            upstream=list(up),
                            received_total=t["n"],
                            executed_total=t["n"],
                            emitted_total=t["n"] * fanout,
                            cpu_seconds_total=t["cpu"],
                            service_seconds_total=t["cpu"],
                            latency_sum_seconds_total=t["lat"] if not fanout else 0.0,
                            latency_count_total=t["n"] if not fanout else 0,
                        )
                    )
                arriving *= fanout or 1
        self.slot += 1
        self.controller.on_report(
            pb.NodeReport(
                node_id=self.node,
                slot=self.slot,
                timestamp=self.t0 + self.slot,
                slot_seconds=1.0,
                instances=samples,
            )
        )


def feed(controller, epochs: int = EPOCHS) -> None:
    """Reports and epochs until a plan with every application and operator exists."""
    agent = Agent(controller)
    for _ in range(epochs):
        agent.report()
        controller.run_epoch()


def plan_controller(path: Path):
    """A controller on a real admin socket with a plan: one node of 1 core for three
    applications, so the division cuts and every operator has a reason."""
    c, server = start(config(path, node_capacity_cores={"n1": 1.0}), loop=False)
    feed(c)
    return c, server


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    path = tmp_path_factory.mktemp("ctl-views")
    c, server = plan_controller(path)
    empty = path / "dschedctl.toml"
    empty.write_text("")
    yield c, server.admin_address, empty
    stop(c, server)


@pytest.fixture(autouse=True)
def no_user_config(monkeypatch, tmp_path):
    monkeypatch.delenv("DSCHEDCTL_CONFIG", raising=False)
    monkeypatch.setattr(ctl, "CONFIG_SEARCH", (tmp_path / "absent.toml",))


def run(capsys, monkeypatch, address: str, *argv: str, columns: int | None = 80):
    """dschedctl's exit status and output lines, piped, with $COLUMNS (or none)."""
    if columns is None:
        monkeypatch.delenv("COLUMNS", raising=False)
    else:
        monkeypatch.setenv("COLUMNS", str(columns))
    capsys.readouterr()
    code = main(["--address", address, *argv])
    out = capsys.readouterr()
    assert code == 0, out.err
    return out.out.splitlines()


def record(c) -> dict:
    return json.loads(json.dumps(c.last_record, default=float))


def words(lines: list[str]) -> str:
    """The text with line breaks and padding folded: a wrapped reason reads as one."""
    return " ".join(" ".join(lines).split())


def row_of(lines: list[str], name: str, start: int = 0) -> tuple[int, str]:
    """The row that starts with ``name`` (after indent); a name too long for its column
    stands alone on its line and the row goes on below it."""
    for i in range(start, len(lines)):
        if lines[i].strip().split("  ")[0] == name:
            if lines[i].strip() == name:
                return i, lines[i] + " " + lines[i + 1]
            return i, lines[i]
    raise AssertionError(f"no row for {name!r} in:\n" + "\n".join(lines))


def assert_fits(lines: list[str], width: int = 80) -> None:
    long = [line for line in lines if len(line) > width]
    assert not long, f"wider than {width}:\n" + "\n".join(long)
    assert not any("…" in line for line in lines), "\n".join(lines)


def test_plan_at_80_columns_keeps_names_caps_and_reasons_whole(served, capsys, monkeypatch):
    c, address, _ = served
    rec = record(c)
    lines = run(capsys, monkeypatch, address, "plan")
    assert_fits(lines)
    reasons = operator_reasons(rec)
    text = words(lines)
    apps = {o["app"] for o in rec["operators"]}
    assert apps == set(APPS)
    for app in apps:
        at, _ = row_of(
            lines, app + " " + f"({next(a['class'] for a in rec['apps'] if a['app'] == app)})"
        )
        for o in (o for o in rec["operators"] if o["app"] == app):
            _, row = row_of(lines, o["operator"], at)
            assert f"{o['cap_cores']:.2f}" in row.split(), row
            reason = reasons[(app, o["operator"])]
            assert reason and " ".join(reason.split()) in text
    # The long operator name is not cut: it stands on its own line, its numbers below.
    assert any(line.strip() == LONG_OP for line in lines)
    # Applications table: every app whole, with its caps.
    at = lines.index("applications")
    for a in rec["apps"]:
        _, row = row_of(lines, a["app"], at)
        assert f"{a['cap_cores']:.2f}" in row.split()
    # Cuts happened: the reasons say so.
    assert "cut" in text and "qos-dp" in text


def test_plan_instances_unfold(served, capsys, monkeypatch):
    c, address, _ = served
    folded = run(capsys, monkeypatch, address, "plan")
    unfolded = run(capsys, monkeypatch, address, "plan", "--instances")
    assert_fits(unfolded)
    n = sum(o["instances"] for o in record(c)["operators"])
    assert sum(bool(re.match(r"\s+#\d+ on n1\b", line)) for line in unfolded) == n
    assert not any(re.match(r"\s+#\d+ on ", line) for line in folded)


def test_every_view_fits_80_columns(served, capsys, monkeypatch):
    c, address, _ = served
    for argv in (
        ["status"],
        ["qos", "list"],
        ["explain", LONG_APP, "--epochs", "3"],
        ["explain", "clickstream-sessionizer"],
        ["top", "--once"],
        ["top", "--once", "--sort", "app"],
    ):
        lines = run(capsys, monkeypatch, address, *argv)
        assert_fits(lines)
        if argv[0] in ("qos", "top"):
            for app in APPS:
                assert any(app in line.split() for line in lines), (argv, lines)
        if argv[0] == "explain":
            assert any(argv[1] in line.split() for line in lines)
            assert "class bronze" in words(lines) or "class gold" in words(lines)
    status = run(capsys, monkeypatch, address, "status")
    assert status[0].startswith("mode dry-run, epoch")
    assert any(line.split()[:2] == ["n1", "2"] for line in status)


def test_top_once_rows_and_sort(served, capsys, monkeypatch):
    c, address, _ = served
    rec = record(c)
    reasons = operator_reasons(rec)
    lines = run(capsys, monkeypatch, address, "top", "--once", "--sort", "app")
    assert_fits(lines)
    head = lines[0]
    assert f"epoch {rec['epoch']}" in head and "mode dry-run" in head
    text = words(lines)
    for o in rec["operators"]:
        app_at, _ = row_of(lines, o["app"])
        _, row = row_of(lines, o["operator"], app_at)
        assert f"{o['cap_cores']:.2f}" in row.split()
        assert " ".join(reasons[(o["app"], o["operator"])].split()) in text
    # The frame as data, sorted as asked.
    for key in ("cap", "usage", "rate"):
        lines = run(capsys, monkeypatch, address, "top", "--once", "--json", "--sort", key)
        frame = json.loads("\n".join(lines))
        values = [
            r[{"cap": "cap_cores", "usage": "usage_cores", "rate": "rate"}[key]]
            for r in frame["rows"]
        ]
        assert values == sorted(values, reverse=True)
        assert frame["sort"] == key and frame["reachable"] and frame["mode"] == "dry-run"
        assert len(frame["rows"]) == len(rec["operators"])
        row = frame["rows"][0]
        assert {"app", "operator", "class", "rate", "predicted_rate", "cap_cores"} <= set(row)
        assert {"usage_cores", "latency_estimate_ms", "target_ms", "reason"} <= set(row)
        assert row["target_ms"] in (100.0, 2000.0)


def test_wide_has_every_column_on_one_line_per_operator(served, capsys, monkeypatch):
    c, address, _ = served
    rec = record(c)
    narrow = run(capsys, monkeypatch, address, "plan")
    wide = run(capsys, monkeypatch, address, "plan", "--wide")
    header = next(line for line in wide if line.startswith("APP "))
    for col in ("OPERATOR", "INST", "ARRIVAL/S", "PREDICTED/S", "BY", "QUEUE", "REASON"):
        assert col in header.split()
    assert len(header.split()) > len(narrow[1].split())
    reasons = operator_reasons(rec)
    for o in rec["operators"]:
        row = next(line for line in wide if line.split()[:2] == [o["app"], o["operator"]])
        assert row.rstrip().endswith(reasons[(o["app"], o["operator"])])
    assert max(map(len, wide)) > 80
    # The flag after the subcommand or before it: the same view.
    assert run(capsys, monkeypatch, address, "--wide", "plan") == wide
    top = run(capsys, monkeypatch, address, "top", "--once", "--wide")
    assert {"CLASS", "DEMAND", "TARGET", "REASON"} <= set(top[2].split())


def test_piped_output_is_laid_out_for_80_columns_or_columns(served, capsys, monkeypatch):
    c, address, _ = served
    piped = run(capsys, monkeypatch, address, "plan", columns=None)
    assert_fits(piped)
    assert not any(line.strip() == LONG_APP for line in piped[: piped.index("applications")])
    wider = run(capsys, monkeypatch, address, "plan", columns=140)
    assert_fits(wider, 140)
    # At 140 columns the long operator's row is one line again.
    assert any(line.split()[:1] == [LONG_OP] and len(line.split()) > 3 for line in wider)


@pytest.mark.parametrize("where", ["before", "after"])
def test_json_for_every_command(served, capsys, monkeypatch, where):
    c, address, _ = served

    def as_json(*argv: str):
        argv = ("--json", *argv) if where == "before" else (*argv, "--json")
        return json.loads("\n".join(run(capsys, monkeypatch, address, *argv)))

    status = as_json("status")
    assert status["mode"] == "DRY_RUN" and status["agents"][0]["nodeId"] == "n1"
    assert as_json("mode", "dry-run") == {"mode": "dry-run", "previous": "dry-run"}
    plan = as_json("plan")
    assert plan["epoch"] == c.epoch and {o["app"] for o in plan["operators"]} == set(APPS)
    assert as_json("qos", "set", "payments", "gold") == {
        "app": "payments",
        "qosClass": "gold",
        "appKnown": True,
    }
    listed = as_json("qos", "list")
    assert {a["app"]: a["qosClass"] for a in listed["assignments"]}["payments"] == "gold"
    explained = as_json("explain", "payments", "--epochs", "2")
    assert [r["epoch"] for r in explained] == [c.epoch - 1, c.epoch]
    frame = as_json("top", "--once")
    assert frame["epoch"] == c.epoch and frame["reachable"]
    assert {r["class"] for r in frame["rows"] if r["app"] == "payments"} == {"gold"}


def test_top_once_unreachable_exits_3(tmp_path, capsys):
    code = main(["--address", f"unix:{tmp_path / 'none.sock'}", "top", "--once", "--json"])
    assert code == 3
    assert "not reachable" in capsys.readouterr().err


def test_top_json_needs_once(tmp_path, capsys):
    code = main(["--address", f"unix:{tmp_path / 'none.sock'}", "top", "--json"])
    assert code == 2
    assert "--once" in capsys.readouterr().err
