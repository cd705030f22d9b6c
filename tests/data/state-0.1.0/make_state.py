"""Make the 0.1.0 controller state fixture with the dsched 0.1.0 code.

Run it with the 0.1.0 tree first on the import path (from a checkout, with its
venv)::

    mkdir /tmp/dsched-0.1.0 && git archive 6d1a4a2 | tar -x -C /tmp/dsched-0.1.0
    PYTHONPATH=/tmp/dsched-0.1.0 .venv/bin/python \\
        tests/data/state-0.1.0/make_state.py tests/data/state-0.1.0

It creates that release's Controller on a new state directory, feeds it node
reports (the NodeReport messages an agent sends: cumulative counters of two
nodes running three WordCount-shaped applications), assigns QoS classes, runs
epochs in dry-run and then in enforce mode, and stops it. The clock is fixed, so
the records' timestamps are the same on every run. Into OUT it copies the state
directory's SQLite file (``controller.sqlite``) and its history spool files
(``history-spool/``: the state directory's ``history/spool``, renamed because
the repository ignores directories named ``spool``).
tests/test_state_upgrade.py rebuilds the state directory from them and opens it
with the current code.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

import controller
import controller.edges.store as store_module
from controller.config import ControllerConfig
from controller.core import Controller
from dsched_pb import dsched_pb2 as pb

# The first epoch's wall clock (2025-06-15T14:13:20Z); one slot per second.
T0 = 1_750_000_000.0
DRY_RUN_EPOCHS = 4
ENFORCE_EPOCHS = 6

# Operator, upstream, CPU-seconds per tuple, tuples emitted per tuple executed.
OPS = (
    ("source", (), 0.0002, 1),
    ("split", ("source",), 0.001, 5),
    ("count", ("split",), 0.0003, 0),
)
# Node -> cores, applications on it with their source rates (tuples per second).
NODES = {
    "n1": (1.0, {"gold-wc": 220.0, "bronze-wc": 260.0}),
    "n2": (2.0, {"silver-wc": 150.0}),
}
QOS = {"gold-wc": "gold", "silver-wc": "silver"}  # bronze-wc keeps the default class


class Node:
    """One node's cumulative counters, reported as its agent would."""

    def __init__(self, c: Controller, node: str, cores: float, rates: dict[str, float]):
        self.c, self.node, self.rates, self.slot = c, node, rates, 0
        self.totals: dict[tuple[str, str], dict[str, float]] = {}
        c.on_hello(pb.Hello(node_id=node, cpu_capacity_cores=cores, slot_seconds=1.0))

    def report(self, now: float) -> None:
        samples = []
        for app, rate in self.rates.items():
            arriving = rate
            for op, upstream, kappa, fanout in OPS:
                t = self.totals.setdefault(
                    (app, op), {"n": 0, "cpu": 0.0, "lat": 0.0, "done": 0, "queue": 0}
                )
                t["n"] += int(arriving)
                t["cpu"] += arriving * kappa
                if not fanout:  # the sink completes root tuples
                    t["lat"] += 0.02 * rate
                    t["done"] += int(rate)
                samples.append(
                    pb.InstanceSample(
                        key=pb.InstanceKey(app=app, operator=op, instance=0),
                        upstream=list(upstream),
                        received_total=t["n"],
                        executed_total=t["n"],
                        emitted_total=t["n"] * fanout,
                        cpu_seconds_total=t["cpu"],
                        latency_sum_seconds_total=t["lat"],
                        latency_count_total=t["done"],
                        service_seconds_total=t["cpu"],
                    )
                )
                arriving *= fanout or 1
        self.slot += 1
        self.c.on_report(
            pb.NodeReport(
                node_id=self.node,
                slot=self.slot,
                timestamp=now,
                slot_seconds=1.0,
                instances=samples,
            )
        )


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    if hasattr(store_module, "SCHEMA_VERSION"):
        print(
            f"make_state.py: {controller.__file__} is not the 0.1.0 code "
            "(its store has a schema version): put the 0.1.0 tree first on PYTHONPATH",
            file=sys.stderr,
        )
        return 2
    out = Path(argv[0])
    if (out / "controller.sqlite").exists() or (out / "history-spool").exists():
        print(f"make_state.py: {out} already holds a fixture: remove it first", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="dsched-0.1.0-state-") as tmp:
        state = Path(tmp) / "state"
        c = run(state)
        out.mkdir(parents=True, exist_ok=True)
        shutil.copy2(state / "controller.sqlite", out / "controller.sqlite")
        shutil.copytree(state / "history" / "spool", out / "history-spool")
    print(f"{out}: epoch {c.epoch}, mode {c.mode}, made by {controller.__file__}")
    return 0


def run(state: Path) -> Controller:
    """The 0.1.0 controller's epochs on ``state``; stopped (its store closed) on return."""
    now = [T0]
    cfg = ControllerConfig(state_dir=state, slot_seconds=1.0, theta_cores=0.05, headroom_cores=0.1)
    cfg.validate()
    c = Controller(cfg, clock=lambda: now[0])
    for app, cls in QOS.items():
        c.set_qos(app, cls)
    nodes = [Node(c, name, cores, rates) for name, (cores, rates) in NODES.items()]
    for epoch in range(DRY_RUN_EPOCHS + ENFORCE_EPOCHS):
        if epoch == DRY_RUN_EPOCHS:
            c.set_mode("enforce")
        now[0] += 1.0
        for n in nodes:
            n.report(now[0])
        c.run_epoch()
    if c.history is not None:
        c.history.flush()
    c.stop()
    # Closed cleanly: the write-ahead log is checkpointed into the file and removed.
    assert not (state / "controller.sqlite-wal").exists()
    return c


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
