"""The upgrade path: a state directory written by dsched 0.1.0 (tests/data/state-0.1.0,
made by that release's own controller) opened by the current code.

The current Controller and the real ``dsched-controller`` resume its mode, epoch,
caps and QoS classes; its decision records are read by ``dschedctl explain``,
``plan`` and ``report``; the store is stamped with its schema version on the first
open and a second open writes nothing. A file stamped by a newer release, or one
SQLite cannot read, is refused with an error naming it and is left byte for byte
as it was.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from controller.config import ControllerConfig
from controller.core import Controller
from controller.ctl import main as ctl_main
from controller.edges import store as store_module
from controller.edges.server import serve
from controller.edges.store import (
    LAYOUT_V1,
    SCHEMA_VERSION,
    StateFileError,
    StateStore,
    StateVersionError,
)
from controller.model import InstanceKey
from controller.shadow_report import ShadowReportBuilder
from dsched.signals import STOPPED
from dsched_pb import dsched_pb2 as pb
from spark_stream import schema as S
from spark_stream.config import HistoryConfig
from spark_stream.spool import SpoolWriter, encode_slot
from testbed.live.cluster import write_toml

FIXTURE = Path(__file__).parent / "data" / "state-0.1.0"
BIN = Path(sys.executable).parent
# A generous bound for "eventually" in polling loops; no test asserts a duration.
PATIENCE_SECONDS = 60.0

# What tests/data/state-0.1.0/make_state.py left there (its README says the same).
T_LAST = 1_750_000_010.0  # the last epoch's clock
EPOCH = 10
QOS = {"gold-wc": "gold", "silver-wc": "silver"}
APPS = ("bronze-wc", "gold-wc", "silver-wc")
OPS = ("source", "split", "count")
NODE_OF = {"gold-wc": "n1", "bronze-wc": "n1", "silver-wc": "n2"}
MODES = ["dry-run"] * 4 + ["enforce"] * 6


def fixture_caps() -> dict[InstanceKey, tuple[str, float]]:
    """The caps as 0.1.0 stored them, read without writing to the fixture."""
    db = read_only(FIXTURE / "controller.sqlite")
    try:
        rows = db.execute("SELECT app, operator, instance, node, cap_cores FROM caps").fetchall()
    finally:
        db.close()
    return {InstanceKey(a, o, i): (n, c) for a, o, i, n, c in rows}


def state_copy(tmp_path: Path) -> Path:
    """The 0.1.0 state directory, rebuilt in ``tmp_path`` as the controller left it."""
    state = tmp_path / "state"
    (state / "history").mkdir(parents=True)
    shutil.copy2(FIXTURE / "controller.sqlite", state / "controller.sqlite")
    shutil.copytree(FIXTURE / "history-spool", state / "history" / "spool")
    return state


def read_only(path: Path) -> sqlite3.Connection:
    """A connection that writes nothing: immutable when no write-ahead log is beside
    the file (a read-only one would leave -wal and -shm files), else read-only."""
    wal = path.with_name(path.name + "-wal").exists()
    return sqlite3.connect(
        f"{path.resolve().as_uri()}?{'mode=ro' if wal else 'immutable=1'}", uri=True
    )


def user_version(path: Path) -> int:
    db = read_only(path)
    try:
        return db.execute("PRAGMA user_version").fetchone()[0]
    finally:
        db.close()


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def config(state: Path, **kw) -> ControllerConfig:
    base = dict(
        state_dir=state,
        slot_seconds=1.0,
        theta_cores=0.05,
        headroom_cores=0.1,
        history=HistoryConfig(enabled=False),
        admin_listen=f"unix:{state.parent}/admin.sock",
    )
    base.update(kw)
    cfg = ControllerConfig(**base)
    cfg.validate()
    return cfg


def n2_report(slot: int, now: float, totals: dict) -> pb.NodeReport:
    """Node n2's agent reporting silver-wc again (n1 stays silent)."""
    samples, arriving = [], 150.0
    for op, up, kappa, fanout in (
        ("source", (), 0.0002, 1),
        ("split", ("source",), 0.001, 5),
        ("count", ("split",), 0.0003, 0),
    ):
        t = totals.setdefault(op, {"n": 0, "cpu": 0.0})
        t["n"] += int(arriving)
        t["cpu"] += arriving * kappa
        samples.append(
            pb.InstanceSample(
                key=pb.InstanceKey(app="silver-wc", operator=op, instance=0),
                upstream=list(up),
                received_total=t["n"],
                executed_total=t["n"],
                emitted_total=t["n"] * fanout,
                cpu_seconds_total=t["cpu"],
                service_seconds_total=t["cpu"],
            )
        )
        arriving *= fanout or 1
    return pb.NodeReport(
        node_id="n2", slot=slot, timestamp=now, slot_seconds=1.0, instances=samples
    )


def shadow_report(records: list[dict], phi: int) -> dict:
    builder = ShadowReportBuilder(3600.0, phi)
    for rec in records:
        builder.add(rec)
    return json.loads(json.dumps(builder.result().to_dict()))


def ctl_json(capsys, address: str, *argv: str):
    assert ctl_main(["--address", address, "--json", *argv]) == 0, argv
    return json.loads(capsys.readouterr().out)


# ------------------------------------------------------------ the fixture
def test_the_fixture_is_0_1_0_state_with_no_schema_version():
    path = FIXTURE / "controller.sqlite"
    assert path.stat().st_size < 200_000
    assert not (FIXTURE / "controller.sqlite-wal").exists()
    assert user_version(path) == 0  # 0.1.0 stamped nothing
    db = read_only(path)
    try:
        tables = {
            name: tuple(c for (c,) in db.execute("SELECT name FROM pragma_table_info(?)", (name,)))
            for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type='table'")
        }
        modes = [m for (m,) in db.execute("SELECT mode FROM decisions ORDER BY epoch")]
        recommendations = db.execute("SELECT count(*) FROM recommendations").fetchone()[0]
    finally:
        db.close()
    # The layout the current code calls version 1 is 0.1.0's, table for table.
    assert tables == LAYOUT_V1
    assert modes == MODES and recommendations > 0
    assert {(k.app, k.operator, n) for k, (n, _) in fixture_caps().items()} == {
        (a, o, NODE_OF[a]) for a in APPS for o in OPS
    }


# ------------------------------------------------------------ the store
def test_first_open_stamps_the_version_and_a_second_open_writes_nothing(tmp_path):
    state = state_copy(tmp_path)
    path = state / "controller.sqlite"
    store = StateStore(state)
    assert store.found_version == 0
    assert user_version(path) == SCHEMA_VERSION == 1
    # Stamping is all version 1 asks of a 0.1.0 file: every row is where it was.
    assert store.get("mode") == "enforce" and store.get("epoch") == str(EPOCH)
    assert store.qos_assignments() == QOS
    assert store.load_caps() == fixture_caps()
    assert [r["epoch"] for r in store.decisions(100)] == list(range(1, EPOCH + 1))
    assert [r[0] for r in store.recommendations(100)] == list(range(2, EPOCH + 1))
    store.close()
    stamped = digest(path)
    again = StateStore(state)
    assert again.found_version == SCHEMA_VERSION
    assert again.load_caps() == fixture_caps()
    again.close()
    assert digest(path) == stamped
    assert sorted(p.name for p in state.iterdir()) == ["controller.sqlite", "history"]


def test_migrations_run_in_order_in_the_transaction_that_stamps_them(tmp_path, monkeypatch):
    """The migration machinery with two versions beyond 1: a failing step leaves the
    file at the version it had; the steps run once each, in order."""
    state = state_copy(tmp_path)
    path = state / "controller.sqlite"
    ran: list[int] = []

    def step(n: int, fail: bool = False):
        def migrate(db: sqlite3.Connection) -> None:
            ran.append(n)
            db.execute(f"CREATE TABLE extra{n} (x INTEGER)")
            if fail:
                raise sqlite3.OperationalError(f"step {n} failed")

        return migrate

    layouts = {
        1: LAYOUT_V1,
        2: {**LAYOUT_V1, "extra1": ("x",)},
        3: {**LAYOUT_V1, "extra1": ("x",), "extra2": ("x",)},
    }
    monkeypatch.setattr(store_module, "SCHEMA_VERSION", 3)
    monkeypatch.setattr(store_module, "LAYOUTS", layouts)
    monkeypatch.setattr(store_module, "MIGRATIONS", {1: step(1), 2: step(2, fail=True)})
    with pytest.raises(StateFileError, match="migrating schema version 2 to 3 failed") as err:
        StateStore(state)
    assert "step 2 failed" in str(err.value) and str(path) in str(err.value)
    # Rolled back whole: step 1's table is gone too (running it again creates it).
    assert ran == [1, 2] and user_version(path) == 0
    monkeypatch.setattr(store_module, "MIGRATIONS", {1: step(1), 2: step(2)})
    ran.clear()
    store = StateStore(state)
    assert ran == [1, 2] and user_version(path) == 3 and store.get("epoch") == str(EPOCH)
    store.close()
    ran.clear()
    StateStore(state).close()
    assert ran == []


def test_a_file_from_a_newer_release_is_refused_and_left_alone(tmp_path):
    state = state_copy(tmp_path)
    path = state / "controller.sqlite"
    db = sqlite3.connect(path)
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    db.close()
    before = digest(path)
    with pytest.raises(StateVersionError) as err:
        Controller(config(state))
    message = str(err.value)
    assert str(path) in message
    assert f"schema version {SCHEMA_VERSION + 1}" in message
    assert f"(version {SCHEMA_VERSION})" in message
    assert (err.value.found, err.value.known) == (SCHEMA_VERSION + 1, SCHEMA_VERSION)
    assert digest(path) == before
    assert sorted(p.name for p in state.iterdir()) == ["controller.sqlite", "history"]


@pytest.mark.parametrize("damage", ["not-sqlite", "truncated", "foreign-tables"])
def test_an_unreadable_file_is_refused_and_left_alone(tmp_path, damage):
    state = state_copy(tmp_path)
    path = state / "controller.sqlite"
    if damage == "not-sqlite":
        path.write_bytes(b"this is not a database\n" * 64)
    elif damage == "truncated":
        path.write_bytes(path.read_bytes()[: 40 * 1024])
    else:  # another program's SQLite file where ours should be
        path.unlink()
        db = sqlite3.connect(path)
        db.execute("CREATE TABLE caps (id INTEGER PRIMARY KEY, what TEXT)")
        db.close()
    before = digest(path)
    with pytest.raises(StateFileError) as err:
        StateStore(state)
    assert str(path) in str(err.value)
    assert digest(path) == before
    assert sorted(p.name for p in state.iterdir()) == ["controller.sqlite", "history"]


# ------------------------------------------------------------ the controller
def test_the_current_controller_resumes_0_1_0_state(tmp_path, capsys):
    state = state_copy(tmp_path)
    caps = fixture_caps()
    clock = [T_LAST + 30.0]
    c = Controller(config(state), clock=lambda: clock[0])
    server = None
    try:
        assert user_version(state / "controller.sqlite") == SCHEMA_VERSION
        assert (c.mode, c.epoch) == ("enforce", EPOCH)
        assert {a: c.qos.class_name_of(a) for a in APPS} == {**QOS, "bronze-wc": "bronze"}
        assert c.memory.caps == caps
        assert c.last_record["epoch"] == EPOCH and c.last_record["mode"] == "enforce"

        server = serve(c, "127.0.0.1:0")
        admin = server.admin_address
        status = ctl_json(capsys, admin, "status")
        assert (status["mode"], int(status["epoch"])) == ("ENFORCE", EPOCH)
        listed = ctl_json(capsys, admin, "qos", "list")["assignments"]
        assert {a["app"]: a["qosClass"] for a in listed} == QOS
        explained = ctl_json(capsys, admin, "explain", "gold-wc", "--epochs", "3")
        assert [e["epoch"] for e in explained] == [EPOCH - 2, EPOCH - 1, EPOCH]
        assert {e["app"]["class"] for e in explained} == {"gold"}
        assert all(e["instances"] for e in explained)
        plan = ctl_json(capsys, admin, "plan")
        assert (plan["epoch"], plan["mode"]) == (EPOCH, "enforce")
        assert len(plan["instances"]) == len(caps)
        # The shadow report over every 0.1.0 record (the controller's clock is 30 s
        # after the last one), the first of which decided nothing.
        report = ctl_json(capsys, admin, "report", "--since", "1h")
        assert (report["epochs"], report["first_epoch"], report["last_epoch"]) == (EPOCH, 1, EPOCH)
        assert report["epochs_by_mode"] == {"dry-run": 4, "enforce": 6}
        assert report["total"]["epochs"] == EPOCH - 1
        assert {a["app"]: a["class"] for a in report["apps"]} == {**QOS, "bronze-wc": "bronze"}
        assert report == shadow_report(c.store.decisions(100), c.config.phi)
        assert ctl_main(["--address", admin, "report", "--since", "1h"]) == 0
        assert "gold-wc" in capsys.readouterr().out

        # No agent has reported: the first epochs hold every resumed cap.
        clock[0] += 1.0
        rec = c.run_epoch()
        assert rec["epoch"] == EPOCH + 1 and not rec["instances"]
        assert c.store.load_caps() == caps
        # n2's agent comes back; n1's instances keep their caps until n1 reports.
        totals: dict = {}
        c.on_hello(pb.Hello(node_id="n2", cpu_capacity_cores=2.0, slot_seconds=1.0))
        for slot in range(1, 4):
            clock[0] += 1.0
            c.on_report(n2_report(slot, clock[0], totals))
            rec = c.run_epoch()
        assert {i["app"] for i in rec["instances"]} == {"silver-wc"}
        saved = c.store.load_caps()
        assert {k: v for k, v in saved.items() if v[0] == "n1"} == {
            k: v for k, v in caps.items() if v[0] == "n1"
        }
        assert set(saved) == set(caps)
    finally:
        if server is not None:
            server.stop(0)
        c.stop()


# ------------------------------------------------------------ the history spool
def test_the_0_1_0_spool_is_the_current_spool_format(tmp_path):
    """The spool's format marker (``v`` on every line) is the one the current job
    reads, and the current writer makes the same bytes from the same samples: the
    streaming job reads a 0.1.0 spool left behind by an upgrade instead of
    quarantining it."""
    state = state_copy(tmp_path)
    spool = state / "history" / "spool"
    files = sorted(spool.iterdir())
    assert len(files) == EPOCH
    head = {name for name, _ in S.COMMON_FIELDS}
    for path in files:
        assert S.slot_of_file_name(path.name) is not None, path.name
        lines = [json.loads(line) for line in path.read_text().splitlines()]
        assert {line["v"] for line in lines} == {S.SPOOL_SCHEMA_VERSION}
        by_kind: dict[str, list[dict]] = {k: [] for k in S.LINE_KINDS}
        for line in lines:
            by_kind[line["kind"]].append({k: v for k, v in line.items() if k not in head})
        (slot_line,) = by_kind["slot"]
        first = lines[0]
        again = encode_slot(
            first["slot"],
            first["timestamp"],
            first["slot_seconds"],
            by_kind["instance"],
            by_kind["node"],
            None if slot_line["decision"] is None else json.loads(slot_line["decision"]),
            written_at=slot_line["written_at"],
        )
        assert again == path.read_bytes(), path.name
    cfg = HistoryConfig().rebase(state)
    assert cfg.spool_dir == spool
    writer = SpoolWriter(cfg)
    assert (writer.files, writer.bytes) == (EPOCH, sum(f.stat().st_size for f in files))


# ------------------------------------------------------------ the daemon
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def daemon_config(tmp_path: Path, state: Path) -> Path:
    return write_toml(
        tmp_path / "controller.toml",
        {
            "listen": f"127.0.0.1:{free_port()}",
            "admin_listen": f"unix:{tmp_path / 'admin.sock'}",
            "metrics": f"127.0.0.1:{free_port()}",
            "state_dir": str(state),
            # No epoch runs while the test looks (and no agent reports to trigger one).
            "slot_seconds": 3600.0,
            "history": {"enabled": False},
        },
    )


def start_daemon(tmp_path: Path, state: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [str(BIN / "dsched-controller"), "--config", str(daemon_config(tmp_path, state))],
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "controller.err").open("wb"),
        stdin=subprocess.DEVNULL,
        cwd=tmp_path,
    )


def test_dsched_controller_runs_on_0_1_0_state(tmp_path, capsys):
    state = state_copy(tmp_path)
    caps = fixture_caps()
    admin = tmp_path / "admin.sock"
    proc = start_daemon(tmp_path, state)
    try:
        deadline = time.monotonic() + PATIENCE_SECONDS
        while not admin.exists():
            err = (tmp_path / "controller.err").read_text()
            assert proc.poll() is None, f"exited ({proc.returncode}): {err[-2000:]}"
            assert time.monotonic() < deadline, f"no admin socket: {err[-2000:]}"
            time.sleep(0.1)
        address = f"unix:{admin}"
        out = subprocess.run(
            [str(BIN / "dschedctl"), "--address", address, "--json", "status"],
            capture_output=True,
            text=True,
            timeout=PATIENCE_SECONDS,
            check=True,
        ).stdout
        status = json.loads(out)
        assert (status["mode"], int(status["epoch"])) == ("ENFORCE", EPOCH)
        listed = ctl_json(capsys, address, "qos", "list")["assignments"]
        assert {a["app"]: a["qosClass"] for a in listed} == QOS
        explained = ctl_json(capsys, address, "explain", "silver-wc", "--epochs", "2")
        assert [(e["epoch"], e["mode"]) for e in explained] == [
            (EPOCH - 1, "enforce"),
            (EPOCH, "enforce"),
        ]
        plan = ctl_json(capsys, address, "plan")
        assert plan["epoch"] == EPOCH and len(plan["instances"]) == len(caps)
        # The daemon's clock is today's: the 0.1.0 records are older than the
        # longest report window, and the report says it covers nothing.
        report = ctl_json(capsys, address, "report", "--since", "7d")
        assert report["epochs"] == 0 and report["apps"] == []
        assert user_version(state / "controller.sqlite") == SCHEMA_VERSION
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=PATIENCE_SECONDS) == STOPPED
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    store = StateStore(state)
    try:
        assert store.found_version == SCHEMA_VERSION
        assert (store.get("mode"), store.get("epoch")) == ("enforce", str(EPOCH))
        assert store.load_caps() == caps and store.qos_assignments() == QOS
    finally:
        store.close()


@pytest.mark.parametrize("damage", ["newer", "corrupt"])
def test_dsched_controller_refuses_state_it_cannot_use(tmp_path, damage):
    state = state_copy(tmp_path)
    path = state / "controller.sqlite"
    if damage == "newer":
        db = sqlite3.connect(path)
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
        db.close()
    else:
        data = bytearray(path.read_bytes())
        data[:16] = b"not a database!!"
        path.write_bytes(bytes(data))
    before = digest(path)
    proc = start_daemon(tmp_path, state)
    try:
        # Exit 2: nothing was started, and a restart would not help.
        assert proc.wait(timeout=PATIENCE_SECONDS) == 2
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = (tmp_path / "controller.err").read_text()
    assert f"dsched-controller: cannot start: state file {path}" in err
    if damage == "newer":
        assert f"schema version {SCHEMA_VERSION + 1} is newer" in err
        assert f"(version {SCHEMA_VERSION})" in err
    assert "Traceback" not in err
    assert digest(path) == before
    assert sorted(p.name for p in state.iterdir()) == ["controller.sqlite", "history"]
    assert not (tmp_path / "admin.sock").exists()
