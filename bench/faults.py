"""Fault matrix: real daemons, real cgroups, real network namespaces, bad input.

Starts `dsched-controller` and two `dsched-agent`s on this machine (each agent
in its own network namespace, joined to the controller by a veth pair), runs
the live WordCount across both nodes at a constant rate, sets QoS classes
through `dschedctl`, then injects, one kind after another:

  controller-kill  SIGKILL at seeded random points of the controller's epoch, restart
  agent-kill       SIGKILL an agent, restart it: caps must be re-adopted, not reset
  partition        both veths down for 1, 3 and 10 lease lengths (n1 holds, n2 releases)
  stall            SIGSTOP the controller for longer than the lease, then SIGCONT
  state-file       state file truncated (half, empty), made read-only, disk full
  fuzz             NodeReports, CapDirectives, registration lines, config files
  thread-exit      a thread exits / its pid or tid is reused between decision and write

and counts, per fault and in total: QoS settings lost, caps outside (0, node
cores], cgroup writes outside the agents' roots, tuples lost and duplicated,
seconds to steady caps, cgroups left at the end. Needs root, cgroup v1 `cpu`
and network namespaces. Exit status 0 when every count is 0, 1 otherwise,
2 for bad arguments. docs/reliability.md explains each fault and the figures.
"""

from __future__ import annotations

import argparse
import hashlib
import math
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import tempfile
import time
from contextlib import closing
from pathlib import Path
from typing import Any

from bench.common import write_result

FAULTS = (
    "controller-kill",
    "agent-kill",
    "partition",
    "stall",
    "state-file",
    "fuzz",
    "thread-exit",
)
APP = "faultwc"
# Two looks of the cap audit (every 0.1 s): a cap written just before a fault
# may be seen that much after it.
GRACE_SECONDS = 0.25
# Classes set through the admin door before the first fault: one for the
# running application, one held for an application that has not appeared.
QOS = {APP: "gold", "faultghost": "silver"}

FULL = {
    "controller_kills": 50,
    "agent_kills": 6,
    "partition_leases": "1,3,10",
    "stalls": 3,
    "fuzz_cases": 100_000,
    "thread_runs": 5,
    "slot_seconds": 1.0,
    # 6 s: a controller restart takes 2-3 s on a loaded 2-core machine, and a
    # lease shorter than that makes every restart a fallback.
    "lease_epochs": 6,
}
QUICK = {
    "controller_kills": 2,
    "agent_kills": 2,
    "partition_leases": "1",
    "stalls": 1,
    "fuzz_cases": 2000,
    "thread_runs": 1,
    "slot_seconds": 0.5,
    # The lease stays 3 s as in the full run: a controller restart (about a
    # second here) must fit in it, or the release policy lifts caps meanwhile.
    "lease_epochs": 6,
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", type=Path, help="write the figures as JSON to this path")
    p.add_argument(
        "--quick",
        action="store_true",
        help="a short matrix for tests: "
        + ", ".join(f"{k.replace('_', '-')} {v}" for k, v in QUICK.items())
        + " (flags given explicitly still win)",
    )
    p.add_argument(
        "--faults",
        default=",".join(FAULTS),
        help=f"comma-separated kinds to run, in this order (default all: {','.join(FAULTS)})",
    )
    p.add_argument("--seed", type=int, default=17, help="seed of kill points and fuzz (default 17)")
    p.add_argument(
        "--controller-kills",
        type=int,
        help=f"controller SIGKILLs (default {FULL['controller_kills']})",
    )
    p.add_argument(
        "--agent-kills",
        type=int,
        help=f"agent SIGKILLs, alternating nodes (default {FULL['agent_kills']})",
    )
    p.add_argument(
        "--partition-leases",
        help="partition lengths in lease lengths, comma-separated "
        f"(default {FULL['partition_leases']})",
    )
    p.add_argument("--stalls", type=int, help=f"controller SIGSTOPs (default {FULL['stalls']})")
    p.add_argument(
        "--stall-leases",
        type=float,
        default=2.0,
        help="length of each stall in lease lengths, > 1 (default 2)",
    )
    p.add_argument(
        "--fuzz-cases",
        type=int,
        help=f"fuzzed inputs over the four doors (default {FULL['fuzz_cases']})",
    )
    p.add_argument(
        "--thread-runs",
        type=int,
        help=f"runs of each thread-exit kind (default {FULL['thread_runs']})",
    )
    p.add_argument(
        "--slot-seconds",
        type=float,
        help=f"control slot of controller and agents (default {FULL['slot_seconds']:g})",
    )
    p.add_argument(
        "--lease-epochs",
        type=int,
        help=f"agents' lease in slots (default {FULL['lease_epochs']}; --quick {QUICK['lease_epochs']})",
    )
    p.add_argument(
        "--node-cores", type=float, default=0.8, help="each agent's capacity_cores (default 0.8)"
    )
    p.add_argument(
        "--rate", type=float, default=40.0, help="WordCount sentences per second (default 40)"
    )
    p.add_argument(
        "--steady-slots",
        type=int,
        default=3,
        help="caps count as steady after this many slots without a change (default 3)",
    )
    p.add_argument(
        "--max-recovery-slots",
        type=int,
        default=60,
        help="give up waiting for steady caps after this many slots (default 60)",
    )
    p.add_argument("--workdir", type=Path, help="logs, configs and state (default: a temp dir)")


def _resolve(args: argparse.Namespace) -> None:
    """Fill the run-length options from --quick or the full defaults."""
    base = QUICK if args.quick else FULL
    for k, v in base.items():
        if getattr(args, k, None) is None:
            setattr(args, k, v)


def _leases(text: str) -> list[float]:
    try:
        values = [float(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--partition-leases: not numbers: {text!r}") from None
    if not values or any(not (math.isfinite(v) and v > 0) for v in values):
        raise ValueError(f"--partition-leases: finite numbers > 0 expected, got {text!r}")
    return values


def check_arguments(args: argparse.Namespace) -> None:
    """Refuse what cannot run, naming the flag, before anything starts."""
    _resolve(args)

    def count(flag: str, value: int, low: int = 0) -> None:
        if value < low:
            raise ValueError(f"--{flag} must be >= {low}, got {value}")

    def positive(flag: str, value: float) -> None:
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"--{flag} must be a finite number > 0, got {value!r}")

    kinds = [k.strip() for k in args.faults.split(",") if k.strip()]
    unknown = [k for k in kinds if k not in FAULTS]
    if unknown or not kinds:
        raise ValueError(
            f"--faults: unknown {', '.join(unknown) or '(none given)'}; known: {', '.join(FAULTS)}"
        )
    args.fault_list = kinds
    count("controller-kills", args.controller_kills)
    count("agent-kills", args.agent_kills)
    count("stalls", args.stalls)
    count("fuzz-cases", args.fuzz_cases)
    count("thread-runs", args.thread_runs)
    count("lease-epochs", args.lease_epochs, 1)
    count("steady-slots", args.steady_slots, 1)
    count("max-recovery-slots", args.max_recovery_slots, 1)
    args.partition_list = _leases(args.partition_leases)
    positive("slot-seconds", args.slot_seconds)
    positive("node-cores", args.node_cores)
    positive("rate", args.rate)
    positive("stall-leases", args.stall_leases)
    if args.stall_leases <= 1:
        raise ValueError(
            f"--stall-leases must be > 1 (a stall longer than the lease), got {args.stall_leases!r}"
        )
    if args.slot_seconds < 0.2:
        raise ValueError(f"--slot-seconds must be >= 0.2, got {args.slot_seconds!r}")
    if args.node_cores > (os.cpu_count() or 1):
        raise ValueError(
            f"--node-cores must be at most this machine's {os.cpu_count()} cores, got {args.node_cores!r}"
        )
    if args.max_recovery_slots < args.steady_slots:
        raise ValueError("--max-recovery-slots must be >= --steady-slots")


def prerequisites() -> str | None:
    """None when this machine can run the matrix, else why not."""
    from testbed.faults.netlab import netns_available
    from testbed.live.cluster import CGROUP_V1_CPU, cgroups_writable

    if os.geteuid() != 0:
        return "the fault matrix needs root (cgroups, namespaces, tmpfs)"
    ok, why = cgroups_writable()
    if not ok or not (CGROUP_V1_CPU / "cpu.cfs_quota_us").exists():
        return f"needs a writable cgroup v1 cpu hierarchy: {why}"
    ok, why = netns_available()
    if not ok:
        return why
    if shutil.which("nsenter") is None:
        return "nsenter (util-linux) is not installed"
    return None


def p95(values: list[float]) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, math.ceil(0.95 * len(s)) - 1)]


class Interrupted(Exception):
    pass


class Matrix:
    """One run of the matrix; :meth:`run` returns the JSON document's figures."""

    def __init__(self, args: argparse.Namespace, workdir: Path):
        from testbed.faults.audit import CapAudit
        from testbed.faults.daemons import FaultCluster, Pod
        from testbed.faults.netlab import NetLab
        from testbed.live.cluster import CGROUP_V1_CPU

        self.args = args
        self.rng = random.Random(args.seed)
        self.slot = args.slot_seconds
        self.lease = args.lease_epochs * self.slot
        self.theta = 0.05
        token = f"{os.getpid() % 100000:05d}"
        self.pod = Pod(f"dsched-faults-{token}")
        self.roots = {n: f"dsched-f{token}-{n}" for n in ("n1", "n2")}
        self.fuzz_root = f"dsched-f{token}-fuzz"
        self.thread_root = f"dsched-f{token}-thr"
        # A subnet of its own per run: two runs' bridges must not share addresses.
        self.lab = NetLab(token, ["n1", "n2"], subnet=f"10.213.{int(token) % 250}.0/24")
        self.cluster = FaultCluster(
            workdir=workdir,
            lab=self.lab,
            slot_seconds=self.slot,
            lease_epochs=args.lease_epochs,
            capacity_cores=args.node_cores,
            fallback={"n1": "hold", "n2": "release"},
            cgroup_root=self.roots,
            controller_options={
                "theta_cores": self.theta,
                "headroom_cores": 0.1,
                "min_cap_cores": 0.05,
                "placement": "liu",
                "move_actuator": "log-only",
            },
        )
        self.audit = CapAudit(
            {n: CGROUP_V1_CPU / self.pod.path.name / r for n, r in self.roots.items()},
            capacity_cores=args.node_cores,
        )
        self.topology = None
        self.expected_qos = dict(QOS)
        self.qos_lost = 0
        self.qos_checks = 0
        self.held_cap_violations = 0
        self.faults: dict[str, dict[str, Any]] = {}
        self.local_agents: list[Any] = []
        self.fuzz_child = None
        self.names: set[str] = set()

    # ------------------------------------------------------------ helpers
    def log(self, msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)

    def all_connected(self) -> bool:
        return {"n1", "n2"} <= self.cluster.connected()

    def recover(self, t0: float) -> tuple[float | None, int]:
        return self.audit.wait_steady(
            t0,
            quiet_seconds=self.args.steady_slots * self.slot,
            max_seconds=self.args.max_recovery_slots * self.slot,
            min_step=self.theta / 2,
            ready=self.all_connected,
        )

    def change_list(self, t0: float, limit: int = 12) -> list[list[Any]]:
        """The cap changes since ``t0``: [seconds after t0, node, cgroup, before, after]."""
        return [
            [round(c.at - t0, 2), c.node, c.cgroup, c.before, c.after]
            for c in self.audit.changes_between(t0, time.monotonic())[:limit]
        ]

    def check_qos(self) -> int:
        """QoS assignments the controller lost (read through its admin door)."""
        got = self.cluster.qos()
        lost = sum(1 for app, cls in self.expected_qos.items() if got.get(app) != cls)
        self.qos_lost += lost
        self.qos_checks += 1
        return lost

    def check_held_caps(self) -> int:
        """Caps the agents say they hold, each in (0, node cores]."""
        from prometheus_client.parser import text_string_to_metric_families

        bad = 0
        for node in ("n1", "n2"):
            text = self.cluster.agent_metrics(node)
            if text is None:
                continue
            for fam in text_string_to_metric_families(text):
                for s in fam.samples:
                    if s.name == "dsched_agent_instance_cpu_cap_cores" and not (
                        0 < s.value <= self.args.node_cores + 1e-9
                    ):
                        bad += 1
        self.held_cap_violations += bad
        return bad

    def agent_counter(self, node: str, name: str, labels: dict[str, str] | None = None) -> float:
        from testbed.live.cluster import metric_value

        text = self.cluster.agent_metrics(node)
        return (metric_value(text, name, labels) or 0.0) if text else math.nan

    def restart_controller(self) -> None:
        self.cluster.reset_admin()
        self.cluster.start_controller()

    # ------------------------------------------------------------ setup
    def setup(self) -> None:
        from testbed.faults.audit import snapshot_outside
        from testbed.faults.fuzz import BAD_NAMES, GOOD_NAMES
        from testbed.live.distributed import DistributedTopology
        from testbed.live.wordcount import wordcount

        self.log(
            f"network lab: bridge {self.lab.bridge} {self.lab.bridge_address}, namespaces n1, n2"
        )
        self.lab.start()
        self.cluster.start()
        self.log(
            f"controller on {self.cluster.listen}, agents in their namespaces; logs in {self.cluster.workdir}"
        )
        # The harness (and every worker it starts) lives in the pod: the agents' anchor.
        self.pod.enter()
        spec = wordcount(app=APP, parallelism=2)
        self.names = {APP, "fz7", "w7", *GOOD_NAMES}
        self.names |= {
            n for n in BAD_NAMES if n and "/" not in n and "\x00" not in n and n not in (".", "..")
        }
        self.names |= {
            f"{APP}-{kind}-{n}" for kind in ("stateful", "stateless") for n in ("n1", "n2")
        }
        self.names |= set(self.roots.values()) | {self.fuzz_root, self.thread_root}
        roots = [self.audit.roots[n] for n in self.audit.roots] + [
            self.pod.path / self.fuzz_root,
            self.pod.path / self.thread_root,
        ]
        self.outside_before = snapshot_outside(self.pod.path, roots, self.names)
        self.outside_roots = roots
        nodes = {n: str(a.socket) for n, a in self.cluster.agents.items()}
        placement = {f"{APP}/{op}/1": "n2" for op in ("source", "split", "count")}
        rate = self.args.rate
        self.topology = DistributedTopology(spec, lambda t: rate, nodes=nodes, placement=placement)
        self.topology.start()
        for app, cls in QOS.items():
            r = self.cluster.dschedctl("qos", "set", app, cls)
            if r.returncode != 0:
                raise RuntimeError(f"dschedctl qos set {app} {cls}: {r.stderr.strip()}")
        self.audit.start()
        t0 = time.monotonic()
        # Warm-up: every instance capped, and the caps steady.
        deadline = t0 + 120
        while sum(1 for n in ("n1", "n2") for c in self.audit.current(n).values() if c) < 6:
            if time.monotonic() > deadline:
                raise RuntimeError("the controller did not cap the six instances within 120 s")
            time.sleep(0.2)
        self.recover(time.monotonic())
        self.log(f"warm-up: six instances capped, steady after {time.monotonic() - t0:.1f} s")

    # ------------------------------------------------------------ faults
    def controller_kill(self) -> dict[str, Any]:
        runs = []
        for k in range(self.args.controller_kills):
            epoch0 = self.cluster.status().epoch
            start = time.monotonic()
            while self.cluster.status().epoch == epoch0:
                if time.monotonic() - start > 10 * self.slot + 10:
                    raise RuntimeError("the controller ran no epoch")
                time.sleep(0.01)
            boundary = time.monotonic()
            point = self.rng.uniform(0, self.slot)
            time.sleep(max(0.0, boundary + point - time.monotonic()))
            epoch_before = self.cluster.status().epoch
            caps_before = {n: self.audit.current(n) for n in ("n1", "n2")}
            self.cluster.kill_controller()
            t0 = time.monotonic()
            committed = self._committed_epoch()
            self.restart_controller()
            lost = self.check_qos()
            epoch_after = self.cluster.status().epoch
            seconds, changes = self.recover(t0)
            self.check_held_caps()
            changed = sum(
                1
                for n in ("n1", "n2")
                for cg, cap in caps_before[n].items()
                if self.audit.current(n).get(cg) != cap
            )
            runs.append(
                {
                    "point_seconds": round(point, 4),
                    "point_fraction": round(point / self.slot, 4),
                    "qos_lost": lost,
                    # Status counts an epoch from its start; the store has it
                    # once its caps are committed, before any directive leaves.
                    # A kill in between loses an epoch no agent heard of.
                    "epoch_before": epoch_before,
                    "epoch_committed": committed,
                    "epoch_after_restart": epoch_after,
                    "epoch_went_back": epoch_after < committed,
                    "recovery_seconds": seconds,
                    "cap_changes": changes,
                    "changes": self.change_list(t0),
                    "caps_different_after": changed,
                }
            )
            self.log(
                f"controller-kill {k + 1}/{self.args.controller_kills} at {point:.2f} s of the epoch: "
                f"steady after {seconds if seconds is None else round(seconds, 2)} s, "
                f"{changes} cap changes, QoS lost {lost}"
            )
        return self._summary("controller-kill", runs)

    def _committed_epoch(self) -> int:
        """The epoch counter in the state file (read-only; the controller is dead)."""
        uri = f"file:{self.cluster.state_file}?mode=ro"
        with closing(sqlite3.connect(uri, uri=True)) as db:
            row = db.execute("SELECT value FROM meta WHERE key = 'epoch'").fetchone()
        return int(row[0]) if row else 0

    def agent_kill(self) -> dict[str, Any]:
        runs = []
        for k in range(self.args.agent_kills):
            node = ("n1", "n2")[k % 2]
            before = self.audit.current(node)
            self.cluster.kill_agent(node)
            t0 = time.monotonic()
            self.cluster.start_agent(node)
            up = self.cluster.wait_connected({node}, 60)
            t_up = time.monotonic()
            # Until one slot after the agent is back, nothing should have gone:
            # a cap lost (cgroup gone or quota lifted) there is a reset.
            time.sleep(self.slot)
            resets = [
                c
                for c in self.audit.changes_between(t0, time.monotonic(), node)
                if c.before is not None and c.after is None
            ]
            adopted = self.agent_counter(node, "dsched_agent_instances_managed")
            seconds, changes = self.recover(t0)
            self.check_held_caps()
            runs.append(
                {
                    "node": node,
                    "caps_before": len([c for c in before.values() if c]),
                    "caps_reset": len(resets),
                    "reconnect_seconds": None if up is None else round(t_up - t0, 3),
                    "changes": self.change_list(t0),
                    "instances_managed_after": adopted,
                    "recovery_seconds": seconds,
                    "cap_changes": changes,
                }
            )
            self.log(
                f"agent-kill {k + 1}/{self.args.agent_kills} ({node}): {len(resets)} caps reset, "
                f"steady after {seconds if seconds is None else round(seconds, 2)} s"
            )
        return self._summary(
            "agent-kill", runs, extra={"caps_reset": sum(r["caps_reset"] for r in runs)}
        )

    def _reports(self) -> dict[str, float]:
        """Reports sent by each agent and received by the controller, read so that
        they agree: the agents' counts are read before and after the controller's,
        again until no agent sent one in between."""
        names = (
            ("sent", "dsched_agent_reports_sent_total"),
            ("resent", "dsched_agent_reports_resent_total"),
            ("dropped", "dsched_agent_reports_dropped_total"),
            ("buffered", "dsched_agent_reports_buffered"),
        )

        def agents() -> dict[str, float]:
            return {
                f"{node}_{short}": self.agent_counter(node, name)
                for node in ("n1", "n2")
                for short, name in names
            }

        for _ in range(50):
            first = agents()
            time.sleep(0.05)  # a report written just before is read by now
            received = self.cluster.controller_metric("dsched_reports_total") or 0.0
            duplicates = (
                self.cluster.controller_metric(
                    "dsched_report_samples_rejected_total", {"reason": "duplicate_report"}
                )
                or 0.0
            )
            second = agents()
            controller = {"controller_received": received, "controller_duplicates": duplicates}
            if first == second:
                return {**controller, **first, "consistent": 1.0}
        return {**controller, **second, "consistent": 0.0}

    def _silence(self, name: str, length: float, begin, end) -> dict[str, Any]:
        """The controller unreachable for ``length`` seconds (``begin`` / ``end``
        make and end it): caps held for the lease, then each agent's fallback."""
        # The fault starts from steady caps, so a change seen during it is its own.
        self.recover(time.monotonic())
        rep0 = self._reports()
        fallbacks0 = {
            n: self.agent_counter(n, "dsched_agent_fallbacks_total") for n in ("n1", "n2")
        }
        before = {n: self.audit.current(n) for n in ("n1", "n2")}
        t_down = time.monotonic()
        begin()
        try:
            time.sleep(length)
        finally:
            end()
        t_up = time.monotonic()
        # The lease runs from the agent's last word from the controller, at most
        # one slot before the fault: nothing may change before lease - 1 slot.
        # A cap written just before the fault (a directive already delivered) is
        # seen by the audit up to GRACE later: not the agent's doing.
        early = self.audit.changes_between(
            t_down + GRACE_SECONDS, t_down + max(0.0, self.lease - self.slot)
        )
        held_violations = len(early)
        hold_changed = len(self.audit.changes_between(t_down + GRACE_SECONDS, t_up, "n1"))
        fallback_due = length >= self.lease + 2 * self.slot
        released_left = None
        if fallback_due:
            # n2 releases: by the end of the silence its caps are lifted.
            released_left = len([c for c in self.audit.current("n2").values() if c])
        seconds, changes = self.recover(t_up)
        time.sleep(self.slot)
        rep1 = self._reports()
        fallbacks = {
            n: self.agent_counter(n, "dsched_agent_fallbacks_total") - fallbacks0[n]
            for n in ("n1", "n2")
        }

        def delta(key: str) -> float:
            return sum(rep1[f"{n}_{key}"] - rep0[f"{n}_{key}"] for n in ("n1", "n2"))

        # Each report once: a report sent again after a broken stream counts in
        # `sent` twice and in `resent` once; the controller counts every copy it
        # gets and refuses those it had (duplicate_report).
        sent = delta("sent") - delta("resent")
        received = rep1["controller_received"] - rep0["controller_received"]
        accepted = received - (rep1["controller_duplicates"] - rep0["controller_duplicates"])
        self.check_held_caps()
        run = {
            "seconds": round(length, 3),
            "leases": round(length / self.lease, 3),
            "caps_before": {n: len([c for c in before[n].values() if c]) for n in before},
            "changed_within_lease": held_violations,
            "hold_node_changes": hold_changed,
            "fallback_due": fallback_due,
            "fallbacks_applied": fallbacks,
            "release_node_caps_left": released_left,
            "reports_made_by_agents": sent,
            "reports_resent": delta("resent"),
            "reports_received_by_controller": received,
            "reports_accepted_by_controller": accepted,
            "reports_dropped": delta("dropped"),
            # Approximate: a report in flight at either reading counts here.
            "reports_unaccounted": sent - accepted,
            "changes": self.change_list(t_down - 1.0),
            "reports_read_consistently": bool(rep0["consistent"] and rep1["consistent"]),
            "instances_managed": {
                n: self.agent_counter(n, "dsched_agent_instances_managed") for n in ("n1", "n2")
            },
            "recovery_seconds": seconds,
            "cap_changes": changes,
        }
        self.log(
            f"{name} {length:.1f} s: within lease {held_violations} changes, hold node {hold_changed}, "
            f"fallbacks {fallbacks}, release node caps left {released_left}, reports made {sent:.0f} "
            f"accepted {accepted:.0f} (resent {delta('resent'):.0f}); "
            f"steady after {seconds if seconds is None else round(seconds, 2)} s"
        )
        return run

    @staticmethod
    def _silence_failures(runs: list[dict[str, Any]]) -> int:
        bad = 0
        for r in runs:
            bad += r["changed_within_lease"] + r["hold_node_changes"]
            if r["fallback_due"]:
                bad += int(r["release_node_caps_left"] != 0)
                bad += int(r["fallbacks_applied"]["n2"] < 1)
        return bad

    def partition(self) -> dict[str, Any]:
        runs = []
        for leases in self.args.partition_list:

            def down() -> None:
                for n in ("n1", "n2"):
                    self.lab.set_link(n, up=False)

            def up() -> None:
                for n in ("n1", "n2"):
                    self.lab.set_link(n, up=True)

            runs.append(self._silence("partition", leases * self.lease, down, up))
        return self._silence_summary("partition", runs)

    def stall(self) -> dict[str, Any]:
        runs = []
        for _ in range(self.args.stalls):
            runs.append(
                self._silence(
                    "stall",
                    self.args.stall_leases * self.lease,
                    lambda: self.cluster.signal_controller(signal.SIGSTOP),
                    lambda: self.cluster.signal_controller(signal.SIGCONT),
                )
            )
        return self._silence_summary("stall", runs)

    def _silence_summary(self, name: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
        """A partition's or a stall's entry: the agents heard nothing for a while."""
        return self._summary(
            name,
            runs,
            extra={
                "policy_violations": self._silence_failures(runs),
                "reports_unaccounted": sum(r["reports_unaccounted"] for r in runs),
            },
        )

    def state_file(self) -> dict[str, Any]:
        runs = self._truncated(("truncated-half", "truncated-empty"))
        for variant in ("read-only", "disk-full"):
            runs.append(self._unwritable(variant))
        accepted = sum(1 for r in runs if "start_refused" in r and not r["start_refused"])
        return self._summary("state-file", runs, extra={"damaged_file_accepted": accepted})

    def _backup(self, to: Path) -> None:
        """A copy through SQLite's backup API (consistent while the controller writes)."""
        to.unlink(missing_ok=True)
        with closing(sqlite3.connect(f"file:{self.cluster.state_file}?mode=ro", uri=True)) as src:
            with closing(sqlite3.connect(to)) as dst:
                src.backup(dst)

    def _truncated(self, variants: tuple[str, ...]) -> list[dict[str, Any]]:
        """With the controller stopped, the state file truncated (to half, to
        nothing) and the controller started on it, once per variant; then the
        backup restored (the operator's remedy) and the controller started again.
        The recovery is measured once, on the last variant's record."""
        state = self.cluster.state_file
        backup = self.cluster.workdir / "backup.sqlite"
        self._backup(backup)
        code = self.cluster.stop_controller()
        t0 = time.monotonic()
        runs = []
        for variant in variants:
            shutil.copyfile(backup, state)
            size = state.stat().st_size
            with state.open("r+b") as fh:
                fh.truncate(size // 2 if variant == "truncated-half" else 0)
            digest = hashlib.sha256(state.read_bytes()).hexdigest()
            proc = self.cluster.spawn_controller()
            try:
                exit_code = proc.wait(60)
            except subprocess.TimeoutExpired:
                exit_code = None
            lost = 0
            if exit_code is None:
                # It started on the damaged file: what it serves is what an operator gets.
                self.cluster.wait_ready()
                lost = self.check_qos()
                self.cluster.stop_controller()
            untouched = hashlib.sha256(state.read_bytes()).hexdigest() == digest
            for suffix in ("-wal", "-shm"):
                state.with_name(state.name + suffix).unlink(missing_ok=True)
            runs.append(
                {
                    "variant": variant,
                    "clean_stop_exit": code,
                    "start_exit": exit_code,
                    "start_refused": exit_code == 2,
                    "file_untouched": untouched,
                    "qos_lost": lost,
                }
            )
            self.log(
                f"state-file {variant}: controller exit {exit_code} "
                f"({'refused' if exit_code == 2 else 'STARTED'}), file untouched {untouched}"
            )
        # What the operator does next (docs/operations.md): restore the backup.
        shutil.copyfile(backup, state)
        self.restart_controller()
        lost = self.check_qos()
        seconds, changes = self.recover(t0)
        self.check_held_caps()
        runs[-1].update(
            {"qos_lost_after_restore": lost, "recovery_seconds": seconds, "cap_changes": changes}
        )
        self.log(
            f"state-file: backup restored, QoS lost {lost}, "
            f"steady after {seconds if seconds is None else round(seconds, 2)} s"
        )
        return runs

    def _unwritable(self, variant: str) -> dict[str, Any]:
        """``read-only``: the state's filesystem remounted read-only while the
        controller is stopped (a mount with a database open for writing cannot be
        made read-only), then the controller started on it. ``disk-full``: the
        tmpfs filled while the controller runs."""
        filler = self.cluster.state.path / "filler"
        t_fault = time.monotonic()
        start_exit: int | None = None
        if variant == "read-only":
            self.cluster.stop_controller()
            self.cluster.state.remount(read_only=True)
            proc = self.cluster.spawn_controller()
            try:
                start_exit = proc.wait(20)
            except subprocess.TimeoutExpired:
                start_exit = None
        else:
            self._fill(filler)
        qos_set_exit = None
        answers = alive = False
        lost_during = 0
        try:
            if start_exit is None:
                # Longer than the lease: the controller must keep going meanwhile.
                time.sleep(self.lease + 2 * self.slot)
                r = self.cluster.dschedctl("qos", "set", f"fault-{variant}", "bronze")
                qos_set_exit = r.returncode
                if qos_set_exit == 0:
                    # It said yes: it must keep it.
                    self.expected_qos[f"fault-{variant}"] = "bronze"
                alive = self.cluster.controller.poll() is None
                try:
                    self.cluster.status(timeout=5)
                    answers = True
                except Exception:
                    answers = False
                if answers:
                    lost_during = self.check_qos()
        finally:
            if variant == "read-only":
                self.cluster.stop_controller()
                self.cluster.state.remount(read_only=False)
            else:
                filler.unlink(missing_ok=True)
        t0 = time.monotonic()
        if variant == "read-only":
            # Started again on the writable file: what it serves is what it read.
            self.restart_controller()
            lost = self.check_qos() + lost_during
            seconds, changes = self.recover(t0)
        else:
            # Steady again: a controller that kept running must get going by
            # itself once it can write, without a restart.
            seconds, changes = self.recover(t0)
            # A restart reads what reached the disk.
            self.cluster.stop_controller()
            self.restart_controller()
            lost = self.check_qos() + lost_during
            self.recover(time.monotonic())
        self.check_held_caps()
        self.log(
            f"state-file {variant}: start exit {start_exit}, controller alive {alive}, "
            f"answering {answers}, `qos set` exit {qos_set_exit}; QoS lost {lost}; "
            f"steady after {seconds if seconds is None else round(seconds, 2)} s"
        )
        return {
            "variant": variant,
            "seconds_unwritable": round(t0 - t_fault, 2),
            "start_exit": start_exit,
            "controller_alive": alive,
            "controller_answers": answers,
            "qos_set_exit": qos_set_exit,
            "qos_lost": lost,
            "recovery_seconds": seconds,
            "cap_changes": changes,
        }

    @staticmethod
    def _fill(filler: Path) -> None:
        """Write zeros until the filesystem says ENOSPC."""
        block = b"\0" * (1 << 20)
        with filler.open("wb", buffering=0) as fh:
            for size in (len(block), 4096, 512):
                try:
                    while True:
                        fh.write(block[:size])
                except OSError:
                    continue

    def _local_agent(self, root: str):
        """An agent in this process on real cgroups (its own root in the pod); its
        log goes to a file, not to the bench's output."""
        import logging

        from agent.config import AgentConfig
        from agent.node import NodeAgent
        from testbed.live.cluster import CGROUP_V1_CPU

        logger = logging.getLogger("agent")
        if not logger.handlers:
            handler = logging.FileHandler(self.cluster.workdir / "local-agent.log")
            handler.setFormatter(
                logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
            )
            logger.addHandler(handler)
            logger.setLevel(logging.INFO)
            logger.propagate = False
        config = AgentConfig(
            cgroup_mode="v1",
            cgroup_mount=str(CGROUP_V1_CPU),
            cgroup_root=root,
            capacity_cores=self.args.node_cores,
            cpu_period_us=10_000,
            resctrl_mount=str(self.cluster.workdir / "no-resctrl"),
        )
        agent = NodeAgent(config)
        self.local_agents.append(agent)
        return agent

    def fuzz(self) -> dict[str, Any]:
        from testbed.faults.fuzz import (
            fuzz_config,
            fuzz_directives,
            fuzz_registration,
            fuzz_reports,
            split_cases,
        )
        from testbed.faults.threads import Child

        n = split_cases(self.args.fuzz_cases, ["reports", "directives", "registration", "config"])
        seed = self.args.seed
        results: dict[str, Any] = {}
        t_start = time.monotonic()

        def rejections() -> dict[str, float]:
            from prometheus_client.parser import text_string_to_metric_families

            from testbed.live.cluster import scrape

            out: dict[str, float] = {}
            for fam in text_string_to_metric_families(scrape(self.cluster.metrics)):
                for s in fam.samples:
                    if s.name == "dsched_report_samples_rejected_total":
                        out[s.labels["reason"]] = s.value
                    elif s.name == "dsched_reports_total":
                        out["_received"] = s.value
            return out

        def controller_alive() -> bool:
            try:
                self.cluster.status(timeout=5)
                return self.cluster.controller.poll() is None
            except Exception:
                return False

        t = time.monotonic()
        results["reports"] = fuzz_reports(
            self.cluster.listen, n["reports"], seed, controller_alive, rejections
        ).to_dict()
        self.log(f"fuzz reports: {n['reports']} in {time.monotonic() - t:.0f} s")

        t = time.monotonic()
        from testbed.faults.threads import Child as _Child

        agent = self._local_agent(self.fuzz_root)
        child = self.fuzz_child = _Child()
        keys = [("fz", "a", 0), ("fz", "b", 1)]
        agent.register("fz", "a", 0, "w-1", False, child.pid, child.pid)
        agent.register("fz", "b", 1, "w-1", True, child.pid, child.tid)
        results["directives"] = fuzz_directives(agent, keys, n["directives"], seed + 1).to_dict()
        self.log(f"fuzz directives: {n['directives']} in {time.monotonic() - t:.0f} s")

        t = time.monotonic()
        target = Child()
        try:

            def alive() -> bool:
                proc = self.cluster.agents["n1"].proc
                return proc.poll() is None and self.cluster.agent_metrics("n1") is not None

            results["registration"] = fuzz_registration(
                self.cluster.agents["n1"].socket,
                n["registration"],
                seed + 2,
                [target.pid, target.tid],
                APP,
                alive,
            ).to_dict()
        finally:
            target.stop()
        self.log(f"fuzz registration: {n['registration']} in {time.monotonic() - t:.0f} s")

        t = time.monotonic()
        cfg_dir = self.cluster.workdir / "fuzz-config"
        cfg_dir.mkdir(exist_ok=True)
        half = split_cases(n["config"], ["agent", "controller"])
        a = fuzz_config("agent", cfg_dir, half["agent"], seed + 3)
        c = fuzz_config("controller", cfg_dir, half["controller"], seed + 4)
        merged = a.to_dict()
        cd = c.to_dict()
        merged["cases"] += cd["cases"]
        merged["crashes"] += cd["crashes"]
        merged["accepted"] += cd["accepted"]
        for r, v in cd["refused"].items():
            merged["refused"][r] = merged["refused"].get(r, 0) + v
        merged["refused_total"] += cd["refused_total"]
        merged["crash_examples"] += cd["crash_examples"]
        results["config"] = merged
        self.log(f"fuzz config: {n['config']} in {time.monotonic() - t:.0f} s")

        seconds, changes = self.recover(time.monotonic())
        self.check_held_caps()
        crashes = sum(r["crashes"] for r in results.values())
        cases = sum(r["cases"] for r in results.values())
        unreasoned = sum(r["refused"].get("no_reason", 0) for r in results.values())
        run = {
            "doors": results,
            "cases": cases,
            "crashes": crashes,
            "refused_without_reason": unreasoned,
            "seconds": round(time.monotonic() - t_start, 1),
            "recovery_seconds": seconds,
            "cap_changes": changes,
        }
        return self._summary(
            "fuzz",
            [run],
            count=cases,
            extra={"crashes": crashes, "refused_without_reason": unreasoned},
        )

    def thread_exit(self) -> dict[str, Any]:
        from testbed.faults.threads import run_thread_faults

        agent = self._local_agent(self.thread_root)
        out = run_thread_faults(agent, self.thread_root, self.args.thread_runs).to_dict()
        self.log(f"thread-exit: {out}")
        return {
            "name": "thread-exit",
            "runs": sum(out["runs"].values()),
            # Nothing of the cluster's caps moves: the fault is the agent's alone.
            "recovery_seconds_p95": None,
            "details": out,
            "crashes": out["crashes"],
        }

    @staticmethod
    def _summary(
        name: str,
        runs: list[dict[str, Any]],
        count: int | None = None,
        extra: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        rec = [r["recovery_seconds"] for r in runs if r.get("recovery_seconds") is not None]
        # A run without the key shares the next one's recovery (see _truncated).
        not_steady = sum(
            1 for r in runs if "recovery_seconds" in r and r["recovery_seconds"] is None
        )
        return {
            "name": name,
            "runs": len(runs) if count is None else count,
            "recovery_seconds_p95": p95(rec),
            "recovery_seconds_max": max(rec) if rec else None,
            "not_steady": not_steady,
            "cap_changes": sum(r.get("cap_changes", 0) for r in runs),
            **(extra or {}),
            "details": runs,
        }

    # ------------------------------------------------------------ teardown
    def finish(self) -> dict[str, Any]:
        """Stop the job, then the agents (they remove the cgroups of the instances
        that left, then their roots); count what the whole run left behind."""
        from testbed.faults.audit import changed_outside, snapshot_outside

        stats = self.topology.stop(drain_timeout=60)
        self.topology = None
        if self.fuzz_child is not None:
            self.fuzz_child.stop()
        for agent in self.local_agents:
            agent.sample()
            agent.sample()
        # The agents notice the instances left at their next sample.
        time.sleep(3 * self.slot)
        self.audit.stop()
        codes = self.cluster.stop()
        while self.local_agents:
            # As the daemon does at its stop: empty cgroups and the root go.
            agent = self.local_agents.pop()
            agent.enforcer.remove_empty()
            agent.close()
        left = sorted(
            str(p.relative_to(self.pod.path)) for p in self.pod.path.rglob("*") if p.is_dir()
        )
        outside = changed_outside(
            self.outside_before, snapshot_outside(self.pod.path, self.outside_roots, self.names)
        )
        return {
            "tuples": {
                "roots": stats.roots,
                "completed": stats.completed,
                "lost": stats.lost,
                "duplicated": stats.duplicated,
                "failed": stats.failed,
            },
            "exit_codes": codes,
            "cgroups_left": left,
            "writes_outside_root": outside,
        }

    def cleanup(self) -> list[str]:
        problems = []
        if self.topology is not None:
            try:
                self.topology.stop(drain_timeout=10)
            except Exception as exc:
                problems.append(f"topology: {exc}")
        self.audit.stop()
        if self.fuzz_child is not None:
            self.fuzz_child.stop()
        while self.local_agents:
            agent = self.local_agents.pop()
            try:
                agent.enforcer.remove_empty()
                agent.close()
            except Exception as exc:
                problems.append(f"local agent: {exc}")
        try:
            if self.cluster.state.mounted:
                try:
                    self.cluster.state.remount(read_only=False)
                except subprocess.CalledProcessError:
                    pass
            self.cluster.close()
        except Exception as exc:
            problems.append(f"daemons: {exc}")
        try:
            if not self.pod.leave():
                problems.append(f"{self.pod.path} could not be removed")
        except Exception as exc:
            problems.append(f"pod: {exc}")
        try:
            self.lab.close()
        except Exception as exc:
            problems.append(f"network: {exc}")
        return problems


def run(args: argparse.Namespace) -> int:
    check_arguments(args)
    why = prerequisites()
    if why is not None:
        print(f"dsched bench faults: cannot run here: {why}")
        return 1
    own_workdir = args.workdir is None
    workdir = Path(tempfile.mkdtemp(prefix="dsched-faults-")) if own_workdir else args.workdir
    matrix = Matrix(args, workdir)
    started = time.monotonic()

    main_pid = os.getpid()

    def on_term(signum, _frame):
        if os.getpid() != main_pid:
            # A child forked from this process (pyroute2 forks to enter a
            # namespace) must die as SIGTERM's default would, not run the
            # harness's cleanup as well.
            os._exit(128 + signum)
        raise KeyboardInterrupt(f"signal {signum}")

    old_term = signal.signal(signal.SIGTERM, on_term)
    interrupted = False
    end: dict[str, Any] = {}
    try:
        matrix.setup()
        for kind in args.fault_list:
            matrix.faults[kind] = getattr(matrix, kind.replace("-", "_"))()
        end = matrix.finish()
    except KeyboardInterrupt:
        interrupted = True
        matrix.log("interrupted: stopping everything started")
    finally:
        problems = matrix.cleanup()
        signal.signal(signal.SIGTERM, old_term)
        for p in problems:
            matrix.log(f"cleanup: {p}")
    if interrupted:
        return 130
    wall = time.monotonic() - started
    faults = [matrix.faults[k] for k in args.fault_list]
    fuzz = matrix.faults.get("fuzz", {})
    threads = matrix.faults.get("thread-exit", {})
    thread_details = threads.get("details", {})
    totals = {
        "qos_settings_lost": matrix.qos_lost,
        "caps_out_of_bounds": len(matrix.audit.out_of_bounds) + matrix.held_cap_violations,
        "writes_outside_root": len(end["writes_outside_root"])
        + thread_details.get("foreign_threads_capped", 0),
        "tuples_lost": end["tuples"]["lost"],
        "tuples_duplicated": end["tuples"]["duplicated"],
        "cgroups_left": len(end["cgroups_left"]) + thread_details.get("cgroups_left", 0),
        "crashes": fuzz.get("crashes", 0) + threads.get("crashes", 0),
        "refused_without_reason": fuzz.get("refused_without_reason", 0),
        "caps_reset_on_agent_restart": matrix.faults.get("agent-kill", {}).get("caps_reset", 0),
        "fallback_policy_violations": sum(
            matrix.faults.get(k, {}).get("policy_violations", 0) for k in ("partition", "stall")
        ),
        "damaged_state_file_accepted": matrix.faults.get("state-file", {}).get(
            "damaged_file_accepted", 0
        ),
        "not_steady": sum(f.get("not_steady", 0) for f in faults),
    }
    figures = {
        "totals": totals,
        "faults": faults,
        "wall_seconds": round(wall, 1),
        "tuples": end["tuples"],
        "cgroups_left": end["cgroups_left"],
        "writes_outside_root_paths": end["writes_outside_root"],
        "caps_out_of_bounds_seen": [vars(o) for o in matrix.audit.out_of_bounds[:20]],
        "qos_checks": matrix.qos_checks,
        "exit_codes": end["exit_codes"],
        "settings": {
            "seed": args.seed,
            "quick": args.quick,
            "slot_seconds": args.slot_seconds,
            "lease_epochs": args.lease_epochs,
            "lease_seconds": matrix.lease,
            "node_cores": args.node_cores,
            "rate_sentences_per_second": args.rate,
            "steady_slots": args.steady_slots,
            "max_recovery_slots": args.max_recovery_slots,
            "theta_cores": matrix.theta,
            "fallback": {"n1": "hold", "n2": "release"},
            "controller_kills": args.controller_kills,
            "agent_kills": args.agent_kills,
            "partition_leases": args.partition_list,
            "stalls": args.stalls,
            "stall_leases": args.stall_leases,
            "fuzz_cases": args.fuzz_cases,
            "thread_runs": args.thread_runs,
        },
    }
    write_result(args.json, "faults", figures)
    _print(totals, faults, wall)
    if own_workdir:
        shutil.rmtree(workdir, ignore_errors=True)
    bad = {k: v for k, v in totals.items() if v}
    return 0 if not bad else 1


def _print(totals: dict[str, Any], faults: list[dict[str, Any]], wall: float) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    t = Table(title=f"fault matrix ({wall:.0f} s)", title_justify="left")
    for col in ("fault", "runs", "recovery p95 s", "not steady"):
        t.add_column(col, justify="left" if col == "fault" else "right")
    for f in faults:
        r = f["recovery_seconds_p95"]
        t.add_row(
            f["name"], str(f["runs"]), "-" if r is None else f"{r:.2f}", str(f.get("not_steady", 0))
        )
    console.print(t)
    s = Table(title="totals", title_justify="left", show_header=False)
    s.add_column("what")
    s.add_column("count", justify="right")
    for k, v in totals.items():
        s.add_row(k, str(v))
    console.print(s)
