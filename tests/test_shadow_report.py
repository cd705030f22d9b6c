"""`dschedctl report`: what enforce mode would have done, from the decision log.

The pure function on hand-made records (controller/shadow_report.py), the
admin door's bounds, and a real controller in dry-run fed by agent streams over
gRPC, whose report is checked against figures recomputed here from the
records read straight from its store."""

from __future__ import annotations

import asyncio
import io
import json
import time

import grpc
import pytest
from rich.console import Console

from controller.qos import QosClass, QosConfig
from controller.shadow_report import (
    MAX_REPORT_EPOCHS,
    ShadowReport,
    parse_duration,
    render,
    shadow_report,
)
from dsched_pb import dsched_pb2 as pb
from dsched_pb import dsched_pb2_grpc as pb_grpc
from tests.controller_server_support import (
    AioAgent,
    aio_channel,
    config,
    start,
    stop,
    wait_until,
)

SLOT = 10.0


def ctl_main(argv: list[str]) -> int:
    from controller.ctl import main

    return main(argv)


# ------------------------------------------------------------ hand-made records
def inst(app, op, i, cap, usage, *, in_force=None, hysteresis="hold", node="n1"):
    return {
        "app": app,
        "operator": op,
        "instance": i,
        "node": node,
        "cap_cores": cap,
        "usage_cores": usage,
        "cap_in_force": in_force,
        "hysteresis": hysteresis,
    }


def app_row(app, cls="gold", *, target=100.0, est=50.0, ratio=0.1, bound=0.5, latency=40.0):
    return {
        "app": app,
        "class": cls,
        "target_ms": target,
        "max_violation_ratio": bound,
        "latency_ms": latency,
        "latency_estimate_ms": est,
        "predicted_violation_ratio": ratio,
    }


def record(epoch, apps=(), instances=(), held=(), placement=None, mode="dry-run", slot=SLOT):
    return {
        "epoch": epoch,
        "timestamp": 1000.0 + epoch * slot,
        "mode": mode,
        "slot_seconds": slot,
        "apps": list(apps),
        "instances": list(instances),
        "held": list(held),
        "placement": placement or {"planned": False},
    }


def test_empty_window():
    r = shadow_report([], since_seconds=3600, phi=5)
    assert r.epochs == 0 and r.apps == [] and r.classes == []
    assert r.total.mean_freed_cores == 0 and r.total.miss_share is None
    out = _text(r)
    assert "no decision records in the last 1h 0m" in out
    assert ShadowReport.from_dict(json.loads(json.dumps(r.to_dict()))).to_dict() == r.to_dict()


def test_freed_cpu_against_caps_and_usage_in_force():
    recs = [
        record(
            e,
            [app_row("a")],
            [
                inst("a", "x", 0, 0.6, 1.0),  # uncapped: usage 1.0 in force, 0.4 freed
                inst("a", "x", 1, 0.5, 0.3, in_force=2.0),  # capped at 2: 1.5 freed
                inst("a", "y", 0, 1.2, 0.3),  # cap above usage: 0.9 added
            ],
        )
        for e in (1, 2)
    ]
    r = shadow_report(recs, since_seconds=3600, phi=2)
    (a,) = r.apps
    assert a.epochs == 2 and a.seconds == 2 * SLOT
    assert a.freed_core_seconds == pytest.approx((0.4 + 1.5) * 2 * SLOT)
    assert a.added_core_seconds == pytest.approx(0.9 * 2 * SLOT)
    assert a.mean_freed_cores == pytest.approx(1.9)
    assert a.mean_net_cores == pytest.approx(1.0)
    assert a.in_force_core_seconds == pytest.approx((1.0 + 2.0 + 0.3) * 2 * SLOT)
    assert a.over_usage_core_seconds == pytest.approx(0.4 * 2 * SLOT)
    assert r.total.freed_core_seconds == pytest.approx(a.freed_core_seconds)
    assert r.total.mean_freed_cores == pytest.approx(1.9)
    assert not a.insufficient


def test_misses_per_app_and_class():
    recs = [
        record(1, [app_row("a", est=150.0), app_row("b", "bronze", target=2000, est=10.0)]),
        record(2, [app_row("a", est=None, ratio=1.0), app_row("b", "bronze", target=2000)]),
        record(3, [app_row("a", est=None, ratio=None), app_row("c", est=90.0, ratio=0.6)]),
        record(4, [app_row("a", est=20.0), app_row("c", est=101.0)]),
    ]
    r = shadow_report(recs, since_seconds=3600, phi=1)
    a, b, c = r.apps
    # a: missed (over target), missed (unbounded), no estimate, met.
    assert (a.estimated_epochs, a.missed_epochs, a.no_estimate_epochs) == (3, 2, 1)
    assert a.miss_share == pytest.approx(2 / 3)
    assert b.miss_share == 0.0
    assert (c.missed_epochs, c.over_bound_epochs) == (1, 1)
    bronze, gold = r.classes
    assert (gold.qos_class, gold.apps, gold.estimated_epochs, gold.missed_epochs) == (
        "gold",
        2,
        5,
        3,
    )
    assert gold.epochs == 4  # records in which a gold app was decided
    assert bronze.miss_share == 0.0
    assert r.total.missed_epochs == 3 and r.total.estimated_epochs == 7
    assert "no latency estimate in 1 of 4" in "; ".join(a.insufficient)


def test_cap_changes_and_distinct_moves():
    move = {"instance": "a/x/0", "from_node": "n1", "to_node": "n2", "stateful": False}
    pinned = {"instance": "b/y/0", "from_node": "n1", "to_node": "n3", "reason": "flink"}
    plan = {"planned": True, "moves": [move], "recommended": [pinned]}
    recs = [
        record(1, [app_row("a")], [inst("a", "x", 0, 0.5, 0.4, hysteresis="first")]),
        record(
            2, [app_row("a")], [inst("a", "x", 0, 0.6, 0.5, hysteresis="raise")], placement=plan
        ),
        record(3, [app_row("a")], [inst("a", "x", 0, 0.6, 0.5, hysteresis="hold")], placement=plan),
        record(
            4,
            [app_row("a")],
            [inst("a", "x", 0, 0.5, 0.2, hysteresis="lower")],
            placement={
                "planned": True,
                "moves": [move, {**move, "to_node": "n3", "stateful": True}],
            },
        ),
    ]
    r = shadow_report(recs, since_seconds=3600, phi=2)
    a, b = r.apps
    assert a.cap_changes == 3
    assert a.cap_changes_by_reason == {"first": 1, "raise": 1, "lower": 1}
    # The repeated dry-run plan counts its move once; a new destination is a new move.
    assert (a.moves, a.stateful_moves, a.recommended_moves) == (2, 1, 0)
    assert (b.app, b.moves, b.recommended_moves, b.epochs) == ("b", 0, 1, 0)
    assert (r.total.moves, r.total.recommended_moves, r.total.cap_changes) == (2, 1, 3)


def test_an_app_appearing_mid_window_is_warming_up():
    recs = [
        record(e, [app_row("old")] + ([app_row("new", "bronze")] if e >= 7 else []))
        for e in range(1, 10)
    ]
    r = shadow_report(recs, since_seconds=3600, phi=5)
    new, old = r.apps
    assert (new.app, new.first_epoch, new.epochs, new.appeared_mid_window) == ("new", 7, 3, True)
    assert new.warmup_epochs == 3
    assert new.insufficient == ["few slots: decided in 3 epoch(s), fewer than phi=5"]
    assert (old.appeared_mid_window, old.warmup_epochs, old.insufficient) == (False, 0, [])
    bronze = next(c for c in r.classes if c.qos_class == "bronze")
    assert bronze.epochs == 3 and bronze.seconds == 3 * SLOT


def test_missing_counters_held_and_no_latency():
    held = {"app": "f", "operator": "map", "instance": 0, "cap_cores": 0.5, "reason": "no flink"}
    recs = [
        record(
            e,
            [app_row("f", latency=None)] if e > 2 else [],
            [inst("f", "src", 0, 0.5, 0.5)] if e > 2 else [],
            held=[held, {**held, "instance": 1, "cap_cores": None}],
        )
        for e in range(1, 7)
    ]
    r = shadow_report(recs, since_seconds=3600, phi=3)
    (f,) = r.apps
    assert (f.epochs, f.held_only_epochs) == (4, 2)
    assert (f.instance_epochs, f.held_instance_epochs) == (16, 12)
    assert f.held_reasons == {"no flink": 12}
    assert f.no_latency_epochs == 4
    text = "; ".join(f.insufficient)
    assert "12 of 16 instance-epochs held (no flink)" in text
    assert "no measured latency in 4 of 4" in text
    # Held instances free nothing: they keep their caps in either mode.
    assert f.freed_core_seconds == f.added_core_seconds == 0
    assert f.first_epoch == 1 and not f.appeared_mid_window


def test_text_fits_80_columns_and_json_round_trips():
    recs = [
        record(
            e,
            [app_row("payments-ingest"), app_row("etl", "bronze", target=2000)],
            [
                inst("payments-ingest", "x", 0, 0.5, 1.25, hysteresis="raise"),
                inst("etl", "y", 0, 0.5, 0.25, in_force=4.0),
            ],
        )
        for e in range(1, 2000)
    ]
    r = shadow_report(recs, since_seconds=6 * 3600, phi=5)
    back = ShadowReport.from_dict(json.loads(json.dumps(r.to_dict())))
    assert back.to_dict() == r.to_dict()
    out = _text(back)
    lines = out.splitlines()
    assert max(map(len, lines)) <= 80
    assert "…" not in out  # nothing cut short
    assert "payments-ingest" in out
    assert "etl" in out and "70k" in out  # 3.5 cores x 1999 epochs x 10 s


def _text(report: ShadowReport) -> str:
    buf = io.StringIO()
    Console(file=buf, width=80, color_system=None).print(render(report))
    return buf.getvalue()


@pytest.mark.parametrize(
    "text, seconds", [("30m", 1800), ("6h", 21600), ("2d", 172800), ("1h30m", 5400), ("45s", 45)]
)
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    "argv",
    [
        ["--since", "abc"],
        ["--since=-5m"],
        ["--since", "-5m"],
        ["--since", "0m"],
        ["--since", "8d"],
        ["--since", "5"],
    ],
)
def test_bad_since_exits_2_naming_the_flag(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        ctl_main(["--address", "unix:/nonexistent/admin.sock", "report", *argv])
    assert exc.value.code == 2
    assert "--since" in capsys.readouterr().err


# ------------------------------------------------------------ a real controller
def test_admin_door_bounds_the_window(tmp_path):
    c, server = start(config(tmp_path), loop=False)
    try:
        for _ in range(3):
            c.run_epoch()
        with grpc.insecure_channel(server.admin_address) as channel:
            stub = pb_grpc.AdminServiceStub(channel)
            for req in (
                pb.ReportRequest(since_seconds=8 * 86400),
                pb.ReportRequest(since_seconds=-60),
                pb.ReportRequest(since_seconds=float("nan")),
                pb.ReportRequest(max_epochs=MAX_REPORT_EPOCHS + 1),
            ):
                with pytest.raises(grpc.RpcError) as err:
                    stub.Report(req, timeout=10)
                assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            whole = json.loads(stub.Report(pb.ReportRequest(), timeout=10).report_json)
            assert (whole["epochs"], whole["truncated"], whole["since_seconds"]) == (
                3,
                False,
                86400,
            )
            two = json.loads(stub.Report(pb.ReportRequest(max_epochs=2), timeout=10).report_json)
            assert (two["first_epoch"], two["last_epoch"], two["truncated"]) == (2, 3, True)
    finally:
        stop(c, server)


LOAD = (1.0, 1.25, 1.5)  # the load's cycle over slots


def sample(app, op, i, k, *, rate, cpu, upstream=(), latency_ms=None, cap=None, engine=""):
    """Slot ``k``'s cumulative counters of an instance processing ``rate`` x the
    load tuples/s on ``cpu`` x the load cores (1 s slots)."""
    done = sum(LOAD[j % 3] for j in range(1, k + 1))  # load-seconds up to slot k
    s = pb.InstanceSample(
        key=pb.InstanceKey(app=app, operator=op, instance=i),
        received_total=int(done * rate),
        executed_total=int(done * rate),
        emitted_total=int(done * rate),
        cpu_seconds_total=done * cpu,
        service_seconds_total=done * cpu,
        upstream=list(upstream),
        engine=engine,
    )
    if latency_ms is not None:
        s.latency_count_total = int(done * rate)
        s.latency_sum_seconds_total = int(done * rate) * latency_ms / 1000.0
    if cap is not None:
        s.cap_cores = cap
    return s


def node_report(node, k, base, samples):
    return pb.AgentMessage(
        report=pb.NodeReport(
            node_id=node, slot=k, timestamp=base + k, slot_seconds=1.0, instances=samples
        )
    )


def reports(k, base):
    """Slot ``k`` of two nodes: `wc` (gold) throughout, `etl` from slot 5, and a
    Flink instance whose counters never come (no engine adapter configured)."""
    n1 = [sample("wc", "spout", 0, k, rate=800, cpu=0.5)]
    if k >= 5:
        n1.append(sample("etl", "parse", 0, k - 4, rate=300, cpu=0.4, cap=2.0))
    n2 = [
        sample(
            "wc",
            "count",
            i,
            k,
            rate=400,
            cpu=0.3,
            upstream=["spout"],
            latency_ms=80.0,
            cap=1.5 if i else None,
        )
        for i in range(2)
    ]
    n2.append(sample("fl", "map", 0, k, rate=0, cpu=0, cap=0.5, engine="flink"))
    return node_report("n1", k, base, n1), node_report("n2", k, base, n2)


def test_report_of_a_dry_run_controller_matches_its_decision_log(tmp_path, capsys):
    # A class no allocation can meet, so that some epochs miss.
    qos = QosConfig(
        default_class="bronze",
        classes={
            "gold": QosClass("gold", 100.0, 0.01, 8.0),
            "bronze": QosClass("bronze", 2000.0, 0.5, 1.0),
            "tight": QosClass("tight", 0.5, 0.01, 2.0),
        },
    )
    # Slot stamps are in the recent past, one second apart: forget nothing.
    c, server = start(config(tmp_path, phi=3, forget_after_slots=1000, qos=qos), loop=False)
    c.set_qos("wc", "gold")
    c.set_qos("etl", "tight")
    epochs = 10
    base = time.time() - 2.0 * epochs  # slot stamps in the recent past

    async def feed() -> None:
        channel = aio_channel(f"127.0.0.1:{server.port}")
        agents = [AioAgent(channel, "n1", cores=2.0), AioAgent(channel, "n2", cores=4.0)]
        try:
            for a in agents:
                assert (await a.open()).HasField("welcome")
            for k in range(1, epochs + 1):
                for a, msg in zip(agents, reports(k, base), strict=True):
                    a.send(msg)
                await asyncio.to_thread(
                    wait_until,
                    lambda k=k: all(c.cluster.agents[n].last_slot == k for n in ("n1", "n2")),
                    f"slot {k} ingested",
                )
                await asyncio.to_thread(c.run_epoch)
        finally:
            for a in agents:
                await a.close()
            await channel.close()

    try:
        asyncio.run(feed())
        assert c.mode == "dry-run"
        argv = ["--address", server.admin_address, "report", "--since", "1h", "--json"]
        assert ctl_main(argv) == 0
        got = json.loads(capsys.readouterr().out)
        records = c.store.decisions(100)
        assert ctl_main(["--address", server.admin_address, "--json", "report"]) == 0
        assert json.loads(capsys.readouterr().out)["epochs"] == epochs
        assert ctl_main(["--address", server.admin_address, "report", "--since", "2d"]) == 0
        text = capsys.readouterr().out
    finally:
        stop(c, server)

    assert len(records) == epochs and {r["mode"] for r in records} == {"dry-run"}
    assert (got["epochs"], got["first_epoch"], got["last_epoch"]) == (epochs, 1, epochs)
    assert got["epochs_by_mode"] == {"dry-run": epochs}
    want = recompute(records)
    apps = {a["app"]: a for a in got["apps"]}
    assert set(apps) == set(want) == {"wc", "etl", "fl"}
    for app, w in want.items():
        a = apps[app]
        assert a["epochs"] == w["epochs"], app
        assert a["freed_core_seconds"] == pytest.approx(w["freed"], abs=1e-9), app
        assert a["added_core_seconds"] == pytest.approx(w["added"], abs=1e-9), app
        seconds = w["epochs"] * 1.0
        if seconds:
            assert a["mean_freed_cores"] == pytest.approx(w["freed"] / seconds), app
        assert (a["estimated_epochs"], a["missed_epochs"]) == (w["estimated"], w["missed"]), app
        assert a["cap_changes"] == w["changes"], app
        assert a["moves"] == w["moves"], app
        assert a["held_instance_epochs"] == w["held"], app
    # What the scenario makes sure of, beyond agreeing with the log:
    assert apps["wc"]["class"] == "gold" and apps["etl"]["class"] == "tight"
    assert apps["etl"]["missed_epochs"] == apps["etl"]["epochs"] > 0
    assert apps["wc"]["missed_epochs"] < apps["wc"]["epochs"]
    assert apps["wc"]["freed_core_seconds"] > 0  # the capped sink's 1.5 cores
    assert apps["wc"]["cap_changes"] >= 3  # a first cap for each instance at least
    # Its first report (slot 5) is the counters' baseline: decided from epoch 6.
    assert apps["etl"]["appeared_mid_window"] and apps["etl"]["first_epoch"] == 6
    assert any("no measured latency" in why for why in got["insufficient"]["etl"])
    assert any("counters missing" in why for why in got["insufficient"]["fl"])
    assert apps["fl"]["epochs"] == 0 and apps["fl"]["held_only_epochs"] == epochs
    assert "never measured in the window" in got["insufficient"]["fl"]
    assert apps["fl"]["class"] == ""  # no decided epoch names its class
    assert "wc" not in got["insufficient"]
    classes = {c["class"]: c for c in got["classes"]}
    assert set(classes) == {"gold", "tight"}
    for cls in ("gold", "tight"):
        mine = [w for app, w in want.items() if apps[app]["class"] == cls]
        assert classes[cls]["missed_epochs"] == sum(w["missed"] for w in mine)
        assert classes[cls]["estimated_epochs"] == sum(w["estimated"] for w in mine)
        assert classes[cls]["freed_core_seconds"] == pytest.approx(sum(w["freed"] for w in mine))
    assert got["total"]["cap_changes"] == sum(w["changes"] for w in want.values())
    # The text report.
    assert "shadow report, last 2d 0h" in text and "wc" in text and "gold" in text
    assert "knows too little about:" in text and "- fl:" in text


def recompute(records: list[dict]) -> dict[str, dict]:
    """The report's figures, straight from the records, one loop per definition."""
    out: dict[str, dict] = {}

    def of(app):
        return out.setdefault(
            app,
            dict(epochs=0, freed=0.0, added=0.0, estimated=0, missed=0, changes=0, moves=0, held=0),
        )

    moves = set()
    for rec in records:
        slot = rec["slot_seconds"]
        for i in rec["instances"]:
            base = i["cap_in_force"] if i["cap_in_force"] is not None else i["usage_cores"]
            d = of(i["app"])
            d["freed"] += max(0.0, base - i["cap_cores"]) * slot
            d["added"] += max(0.0, i["cap_cores"] - base) * slot
            d["changes"] += i["hysteresis"] in ("first", "raise", "lower", "fit-node")
        for h in rec["held"]:
            of(h["app"])["held"] += 1
        for row in rec["apps"]:
            d = of(row["app"])
            d["epochs"] += 1
            est, ratio = row["latency_estimate_ms"], row["predicted_violation_ratio"]
            if est is not None or ratio is not None:
                d["estimated"] += 1
                d["missed"] += est is None or est > row["target_ms"]
        place = rec.get("placement") or {}
        for m in place.get("moves", []) if place.get("planned") else []:
            key = (m["instance"], m["from_node"], m["to_node"])
            if key not in moves:
                moves.add(key)
                of(m["instance"].split("/")[0])["moves"] += 1
    return out


def test_the_store_streams_the_newest_records_of_a_window_in_batches(tmp_path):
    from controller.edges.store import StateStore

    store = StateStore(tmp_path / "state")
    try:
        for e in range(1, 11):
            store.record_decision(e, 100.0 + e, "dry-run", {"epoch": e})
        got = store.decisions_since(104.0, limit=100, batch=3)
        assert [r["epoch"] for r in got] == [4, 5, 6, 7, 8, 9, 10]
        assert [r["epoch"] for r in store.decisions_since(104.0, limit=5, batch=2)] == [
            6,
            7,
            8,
            9,
            10,
        ]
        assert list(store.decisions_since(111.0, limit=5)) == []
        # A record written while the window is read is not part of it.
        reading = store.decisions_since(109.0, limit=5, batch=1)
        assert next(reading)["epoch"] == 9
        store.record_decision(11, 111.0, "dry-run", {"epoch": 11})
        store.flush()
        assert [r["epoch"] for r in reading] == [10]
    finally:
        store.close()
