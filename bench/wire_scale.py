"""wire-scale: a real controller daemon under many agents' streams, end to end over gRPC.

Starts `dsched-controller` (enforce mode, a generated config in a temporary
directory) and K client processes (bench/wire_client.py) that hold one gRPC
channel and one AgentService stream per fake agent. Every slot, on a wall-clock
boundary shared by all clients, each agent sends a NodeReport of its share of
the synthetic cluster of bench/controller_scale.py and acknowledges the
CapDirective that comes back. A round is the wall time from the first report
of a slot to the last Ack of the epoch that used it. Meanwhile a thread calls
the admin Status and GetPlan about every 0.2 s on the admin door. Reports the
round's median and p95 against the target (a tenth of the slot), the
controller's CPU per epoch, its peak RSS and the admin calls' p99.
docs/wire-scale.md describes how to read it.
"""

from __future__ import annotations

import argparse
import math
import os
import queue
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import reference_seconds, write_result
from dsched import signals

ROOT = Path(__file__).resolve().parent.parent
TARGET_FRACTION = 0.1
STRETCH_FRACTION = 0.05


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--agents", type=int, default=1000, help="fake agents (nodes), default 1000")
    p.add_argument("--instances", type=int, default=20000, help="operator instances (20000)")
    p.add_argument("--apps", type=int, default=500, help="applications (500)")
    p.add_argument("--slot-seconds", type=float, default=10.0, help="the slot, T (default 10)")
    p.add_argument("--rounds", type=int, default=10, help="measured rounds (default 10)")
    p.add_argument(
        "--warmup",
        type=int,
        default=3,
        help="rounds discarded first (default 3; the first slot only sets counter baselines)",
    )
    p.add_argument(
        "--client-processes", type=int, default=4, help="processes holding the agents (4)"
    )
    p.add_argument("--cores", type=float, default=4.0, help="cores per fake node (4)")
    p.add_argument(
        "--placement",
        default="liu",
        help="the controller's placement strategy (default liu, the production default; "
        "`none` leaves placement out)",
    )
    p.add_argument(
        "--admin-interval",
        type=float,
        default=0.2,
        help="seconds between admin Status + GetPlan calls during the load (0: none)",
    )
    p.add_argument(
        "--reference-repeats",
        type=int,
        default=5,
        help="repeats of the reference workload, timed before and after the run (5)",
    )
    p.add_argument("--json", type=Path, default=Path("bench/results/wire_scale.json"))
    p.add_argument("--png", type=Path, help="default: next to the JSON")
    p.add_argument("--keep-dir", action="store_true", help="keep the temporary directory")


# ---------------------------------------------------------------- processes


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


try:
    import ctypes

    _LIBC = ctypes.CDLL(None, use_errno=True)
except OSError:
    _LIBC = None
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In a child before exec: SIGTERM when the benchmark itself dies, even by SIGKILL.
    (Children also get their own session, so a terminal's Ctrl-C reaches only the
    benchmark, which stops them in order.)"""
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def controller_keys() -> set[str]:
    """The config keys this checkout's controller accepts."""
    import dataclasses

    from controller.config import ControllerConfig

    return {f.name for f in dataclasses.fields(ControllerConfig)}


def controller_config(args, tmp: Path, port: int, metrics_port: int) -> tuple[str, dict]:
    """The controller's TOML and what it says (for the JSON)."""
    keys = controller_keys()
    cfg: dict[str, Any] = {
        "listen": f"127.0.0.1:{port}",
        "metrics": f"127.0.0.1:{metrics_port}",
        "state_dir": str(tmp / "state"),
        "mode": "enforce",
        "slot_seconds": args.slot_seconds,
        "placement": args.placement,
    }
    if "epoch_trigger" in keys:
        cfg["epoch_trigger"] = "reports"
    if "max_agent_streams" in keys:
        cfg["max_agent_streams"] = max(args.agents + 16, 64)
    if "admin_listen" in keys:
        cfg["admin_listen"] = f"unix:{tmp / 'admin.sock'}"
    lines = [f"{k} = {_toml(v)}" for k, v in cfg.items()]
    # The Spark history would start a JVM beside the controller; the fast loop never
    # waits for it, so the round is measured without it.
    lines += ["", "[history]", "enabled = false"]
    cfg["history.enabled"] = False
    return "\n".join(lines) + "\n", cfg


def _toml(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'


def controller_command(config: Path) -> list[str]:
    script = Path(sys.executable).with_name("dsched-controller")
    head = [str(script)] if script.exists() else [sys.executable, "-m", "controller.daemon"]
    return [*head, "--config", str(config), "--log-level", "WARNING"]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


class ClientProcess:
    """One bench/wire_client.py process and the JSON lines it prints."""

    def __init__(self, cmd: list[str], log: Path):
        self.log = log
        self._log_file = open(log, "wb")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(
            cmd,
            cwd=ROOT,
            env=_env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log_file,
            text=True,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        self.lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        import json

        for line in self.proc.stdout:
            try:
                self.lines.put(json.loads(line))
            except ValueError:
                pass
        self.lines.put(None)

    def send(self, obj: dict) -> None:
        import json

        try:
            self.proc.stdin.write(json.dumps(obj) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            pass

    def expect(self, key: str, deadline: float) -> dict:
        while True:
            left = deadline - time.time()
            if left <= 0:
                raise RuntimeError(f"a client process sent no {key!r} in time{self.tail()}")
            try:
                msg = self.lines.get(timeout=min(left, 1.0))
            except queue.Empty:
                continue
            if msg is None:
                code = self.proc.wait(timeout=10)
                raise RuntimeError(
                    f"a client process exited (code {code}) before {key!r}{self.tail()}"
                )
            if "error" in msg:
                raise RuntimeError(f"a client process failed: {msg['error']}{self.tail()}")
            if key in msg:
                return msg[key]

    def tail(self) -> str:
        try:
            text = self.log.read_text(errors="replace").strip().splitlines()[-15:]
        except OSError:
            return ""
        return ("\n  " + "\n  ".join(text)) if text else ""

    def ask_to_stop(self) -> None:
        self.send({"stop": True})
        try:
            self.proc.stdin.close()
        except OSError:
            pass

    def stop(self) -> None:
        self.ask_to_stop()
        _stop_process(self.proc, first=None, wait=10)
        self._log_file.close()


def _stop_process(proc: subprocess.Popen, first: int | None, wait: float) -> None:
    """Ask (``first`` signal, or nothing if it is already asked), then SIGTERM, then SIGKILL."""
    steps = ([first] if first else []) + [None, signal.SIGTERM, signal.SIGKILL]
    for sig in steps:
        if proc.poll() is not None:
            return
        if sig is not None:
            try:
                proc.send_signal(sig)
            except ProcessLookupError:
                return
        try:
            proc.wait(timeout=wait if sig != signal.SIGKILL else 5)
            return
        except subprocess.TimeoutExpired:
            continue


# ---------------------------------------------------------------- controller probes


def proc_cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads), /proc/<pid>/stat."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def descendants_cpu_seconds(pid: int) -> dict[int, float]:
    """utime + stime of each live descendant of ``pid`` (the controller's
    planner process), by pid: a scan of /proc for parent links."""
    parent: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        parent[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    out: dict[int, float] = {}
    for child in parent:
        p, seen = parent.get(child), 0
        while p is not None and p != pid and p > 1 and seen < 64:
            p, seen = parent.get(p), seen + 1
        if p == pid:
            try:
                out[child] = proc_cpu_seconds(child)
            except (OSError, IndexError, ValueError):
                pass
    return out


def proc_status_bytes(pid: int, key: str) -> int | None:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    return None


def scrape(metrics: str) -> dict[str, float]:
    """Un-labelled samples of the controller's epoch metrics (name -> value)."""
    out: dict[str, float] = {}
    try:
        with urllib.request.urlopen(f"http://{metrics}/metrics", timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return out
    for line in text.splitlines():
        if line.startswith("#") or "epoch" not in line or "{" in line.split(" ", 1)[0]:
            continue
        name, _, value = line.partition(" ")
        try:
            out[name] = float(value)
        except ValueError:
            pass
    return out


class Admin:
    """Admin calls on the admin door, and the probe thread timing them."""

    def __init__(self, target: str):
        import grpc

        from dsched_pb import dsched_pb2_grpc as pb_grpc

        self.target = target
        # A plan at 20,000 instances carries its decision record: well over 4 MB.
        self.channel = grpc.insecure_channel(
            target, options=[("grpc.max_receive_message_length", -1)]
        )
        self.stub = pb_grpc.AdminServiceStub(self.channel)
        self.calls: dict[str, list[float]] = {"Status": [], "GetPlan": []}
        self.errors: dict[str, int] = {"Status": 0, "GetPlan": 0}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False

    def status(self, timeout: float = 10.0):
        from dsched_pb import dsched_pb2 as pb

        return self.stub.Status(pb.StatusRequest(), timeout=timeout)

    def set_qos(self, app: str, qos_class: str) -> None:
        from dsched_pb import dsched_pb2 as pb

        self.stub.SetQos(pb.SetQosRequest(app=app, qos_class=qos_class), timeout=10)

    def start_probe(self, interval: float) -> None:
        if interval <= 0:
            return
        self._thread = threading.Thread(
            target=self._probe, args=(interval,), name="admin-probe", daemon=True
        )
        self._thread.start()

    def _probe(self, interval: float) -> None:
        import grpc

        from dsched_pb import dsched_pb2 as pb

        calls = (("Status", self.stub.Status, pb.StatusRequest()),)
        calls += (("GetPlan", self.stub.GetPlan, pb.GetPlanRequest()),)
        next_at = time.monotonic()
        while not self._stop.is_set():
            for name, method, req in calls:
                t0 = time.perf_counter()
                try:
                    method(req, timeout=30)
                    self.calls[name].append(time.perf_counter() - t0)
                except grpc.RpcError:
                    self.errors[name] += 1
            next_at = max(next_at + interval, time.monotonic())
            self._stop.wait(next_at - time.monotonic())

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=35)
        if not self._closed:
            self._closed = True
            self.channel.close()


def wait_ready(proc: subprocess.Popen, listen: str, admin_sock: Path | None, log: Path) -> str:
    """Wait for the controller's agents' door; return the admin door's target."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    deadline = time.time() + 60
    with grpc.insecure_channel(listen) as ch:
        health = health_pb2_grpc.HealthStub(ch)
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"dsched-controller exited with {proc.returncode}{_tail(log)}")
            try:
                health.Check(health_pb2.HealthCheckRequest(), timeout=1)
                break
            except grpc.RpcError:
                if time.time() > deadline:
                    raise RuntimeError(f"dsched-controller did not start{_tail(log)}") from None
                time.sleep(0.2)
    if admin_sock is None:
        return listen
    # The socket is bound with the agents' door; a little slack all the same.
    for _ in range(50):
        if admin_sock.exists():
            return f"unix:{admin_sock}"
        time.sleep(0.1)
    return listen  # a controller that still serves admin on the agents' door


def _tail(log: Path) -> str:
    try:
        lines = log.read_text(errors="replace").strip().splitlines()[-20:]
    except OSError:
        return ""
    return ("\n  " + "\n  ".join(lines)) if lines else ""


# ---------------------------------------------------------------- analysis


def merge(dones: list[dict]) -> tuple[dict[int, dict], dict[int, dict]]:
    """Slots and epochs over every client process (first/last times, sums)."""
    slots: dict[int, dict] = {}
    epochs: dict[int, dict] = {}
    for d in dones:
        for s in d["slots"]:
            m = slots.setdefault(
                s["slot"], {"first_send": math.inf, "last_send": 0.0, "reports": 0}
            )
            m["first_send"] = min(m["first_send"], s["first_send"])
            m["last_send"] = max(m["last_send"], s["last_send"])
            m["reports"] += s["reports"]
        for e, v in d["epochs"].items():
            m = epochs.setdefault(
                int(e),
                {"first_recv": math.inf, "last_recv": 0.0, "last_ack": 0.0}
                | {k: 0 for k in ("agents", "caps", "applied", "rejected", "stale")},
            )
            m["first_recv"] = min(m["first_recv"], v["first_recv"] or math.inf)
            m["last_recv"] = max(m["last_recv"], v["last_recv"])
            m["last_ack"] = max(m["last_ack"], v["last_ack"])
            for k in ("agents", "caps", "applied", "rejected", "stale"):
                m[k] += v[k]
    return slots, epochs


def rounds(slots: dict[int, dict], epochs: dict[int, dict], expected: int) -> list[dict]:
    """Per slot: the epoch that used its reports (the first whose directives arrived after
    the slot's first report and before the next slot's) and the round's parts."""
    out = []
    for k in sorted(slots):
        s = slots[k]
        nxt = slots[k + 1]["first_send"] if k + 1 in slots else math.inf
        used = [e for e, v in epochs.items() if s["first_send"] <= v["first_recv"] < nxt]
        row: dict[str, Any] = {"slot": k, "reports": s["reports"], "epoch": None}
        if used:
            e = min(used)
            v = epochs[e]
            row |= {
                "epoch": e,
                "round_seconds": v["last_ack"] - s["first_send"],
                "reports_seconds": s["last_send"] - s["first_send"],
                "epoch_seconds": max(0.0, v["first_recv"] - s["last_send"]),
                "directives_seconds": v["last_ack"] - v["first_recv"],
                "directives_acked": v["agents"],
                "caps": v["caps"],
                "applied": v["applied"],
                "rejected": v["rejected"],
                "stale": v["stale"],
                "all_acked": v["agents"] == expected,
            }
        out.append(row)
    return out


def _pct(xs: list[float], q: float) -> float | None:
    return float(np.percentile(xs, q)) if xs else None


# ---------------------------------------------------------------- the run


def run(args: argparse.Namespace) -> int:
    for name in ("agents", "instances", "apps", "rounds", "client_processes", "reference_repeats"):
        if getattr(args, name) < 1:
            print(
                f"dsched bench wire-scale: --{name.replace('_', '-')} must be >= 1", file=sys.stderr
            )
            return 2
    if args.warmup < 1:
        print(
            "dsched bench wire-scale: --warmup must be >= 1 (slot 0 only sets baselines)",
            file=sys.stderr,
        )
        return 2
    if not args.slot_seconds > 0:
        print("dsched bench wire-scale: --slot-seconds must be > 0", file=sys.stderr)
        return 2

    tmp: Path | None = None
    controller: subprocess.Popen | None = None
    clients: list[ClientProcess] = []
    admin: Admin | None = None
    # SIGTERM stops the run as Ctrl-C does (docs/operations.md, "Stopping").
    old_term = signal.signal(signal.SIGTERM, signals.raise_interrupt)
    try:
        tmp = Path(tempfile.mkdtemp(prefix="dsched-wire-"))
        reference_before = reference_seconds(args.reference_repeats)
        port, metrics_port = free_port(), free_port()
        text, cfg = controller_config(args, tmp, port, metrics_port)
        (tmp / "controller.toml").write_text(text)
        log = tmp / "controller.log"
        with open(log, "wb") as log_file:
            controller = subprocess.Popen(
                controller_command(tmp / "controller.toml"),
                cwd=ROOT,
                env=_env(),
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        # Every child is started before this process makes its first gRPC call: a
        # fork after gRPC has started its pollers can crash the child before exec.
        k = min(args.client_processes, args.agents)
        bounds = [args.agents * i // k for i in range(k + 1)]
        for i in range(k):
            cmd = [sys.executable, "-m", "bench.wire_client", "--target", cfg["listen"]]
            cmd += ["--nodes", f"{bounds[i]}:{bounds[i + 1]}"]
            cmd += ["--total-nodes", str(args.agents), "--instances", str(args.instances)]
            cmd += ["--apps", str(args.apps), "--cores", str(args.cores)]
            cmd += ["--slot-seconds", str(args.slot_seconds)]
            clients.append(ClientProcess(cmd, tmp / f"client{i}.log"))

        sock = tmp / "admin.sock" if "admin_listen" in cfg else None
        admin_target = wait_ready(controller, cfg["listen"], sock, log)
        admin = Admin(admin_target)
        # QoS classes as the synthetic cluster assigns them, set as an operator would
        # (before the first report; the agents' streams may already be open).
        from bench.wire_client import synthetic_cluster

        cluster, sink = synthetic_cluster(
            args.agents, args.instances, args.apps, args.cores, args.slot_seconds
        )
        instances = len(cluster.rows)
        for app, qos_class in sink.qos.classes.items():
            admin.set_qos(app, qos_class)
        del cluster, sink

        deadline = time.time() + 60 + 0.1 * args.agents
        ready = [c.expect("ready", deadline) for c in clients]
        expected = sum(r["with_instances"] for r in ready)
        status = admin.status()
        agents_connected = len(status.agents)
        print(
            f"controller pid {controller.pid}: {agents_connected} agents connected "
            f"({k} client processes, one channel per agent), {instances} instances, "
            f"{args.apps} apps, admin door {admin_target}",
            flush=True,
        )

        slot = args.slot_seconds
        total = args.warmup + args.rounds
        lead = max(2.0, 0.3 * slot)
        b0 = math.ceil((time.time() + lead) / slot) * slot
        for c in clients:
            c.send({"start": b0, "slots": total})
        admin.start_probe(args.admin_interval)
        # The measured window opens just before the first measured slot's reports.
        window_open = b0 + args.warmup * slot - 0.05 * slot
        time.sleep(max(0.0, window_open - time.time()))
        cpu0, epoch0 = proc_cpu_seconds(controller.pid), admin.status().epoch
        children0 = descendants_cpu_seconds(controller.pid)
        metrics0 = scrape(cfg["metrics"])
        deadline = b0 + (total + 1) * slot + 60 + 0.05 * args.agents
        dones = [c.expect("done", deadline) for c in clients]
        cpu1, epoch1 = proc_cpu_seconds(controller.pid), admin.status().epoch
        children1 = descendants_cpu_seconds(controller.pid)
        metrics1 = scrape(cfg["metrics"])
        peak_rss = proc_status_bytes(controller.pid, "VmHWM")
        admin.stop()
        reference_after = reference_seconds(args.reference_repeats)
    except KeyboardInterrupt:
        print(
            "dsched bench wire-scale: interrupted; controller and clients stopped",
            file=sys.stderr,
        )
        return signals.INTERRUPTED
    except RuntimeError as exc:
        print(f"dsched bench wire-scale: {exc}", file=sys.stderr)
        return 1
    finally:
        # Ctrl-C and SIGTERM are held off while everything is stopped in order.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        old_int = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            if admin is not None:
                admin.stop()
            for c in clients:
                c.ask_to_stop()
            for c in clients:
                c.stop()
            if controller is not None:
                _stop_process(controller, first=signal.SIGTERM, wait=20)
            if tmp is not None and not args.keep_dir:
                shutil.rmtree(tmp, ignore_errors=True)
        finally:
            signal.signal(signal.SIGINT, old_int)
            signal.signal(signal.SIGTERM, old_term)

    slots, epochs = merge(dones)
    rows = rounds(slots, epochs, expected)
    measured = [r for r in rows if r["slot"] >= args.warmup]
    times = [r["round_seconds"] for r in measured if r.get("round_seconds") is not None]
    epochs_run = epoch1 - epoch0
    cpu = cpu1 - cpu0
    # A child that started within the window counts from zero; one that ended
    # within it is lost (the planner lives as long as the controller).
    children_cpu = sum(v - children0.get(p, 0.0) for p, v in children1.items())
    reference = (reference_before + reference_after) / 2
    median, p95 = (statistics.median(times), _pct(times, 95)) if times else (None, None)

    def delta(name: str) -> float | None:
        if name in metrics0 and name in metrics1:
            return metrics1[name] - metrics0[name]
        return None

    dur_sum = delta("dsched_controller_epoch_duration_seconds_sum")
    dur_count = delta("dsched_controller_epoch_duration_seconds_count")
    # Per-epoch CPU, where this controller's metrics expose it.
    cpu_metric = {
        n: (metrics1[n] - metrics0.get(n, 0.0))
        for n in metrics1
        if "cpu" in n and n.endswith(("_sum", "_total"))
    }
    cpu_counts = {
        n[: -len("_sum")] + "_count": delta(n[: -len("_sum")] + "_count") for n in cpu_metric
    }
    epoch_cpu_metric = {
        n: v / cpu_counts[n[: -len("_sum")] + "_count"]
        for n, v in cpu_metric.items()
        if n.endswith("_sum") and cpu_counts.get(n[: -len("_sum")] + "_count")
    }
    all_calls = [x for v in admin.calls.values() for x in v]
    broken = {n: why for d in dones for n, why in d["broken"].items()}
    figures = {
        "config": {
            "agents": args.agents,
            "instances": instances,
            "apps": args.apps,
            "slot_seconds": slot,
            "cores_per_node": args.cores,
            "client_processes": k,
            "channels": "one gRPC channel (own TCP connection) and one stream per agent",
            "admin_door": admin_target.split(":", 1)[0]
            if admin_target.startswith("unix:")
            else "agents' port",
            "admin_interval_seconds": args.admin_interval,
            "controller": cfg,
            "controller_toml": text,
        },
        "agents_connected": agents_connected,
        "agents_with_instances": expected,
        "warmup_rounds_discarded": args.warmup,
        "rounds_measured": len(times),
        "rounds_requested": args.rounds,
        "all_directives_acknowledged": bool(measured) and all(r.get("all_acked") for r in measured),
        "round_seconds_median": median,
        "round_seconds_p95": p95,
        "round_seconds_max": max(times) if times else None,
        "round_fraction_of_slot_median": median / slot if median is not None else None,
        "round_fraction_of_slot_p95": p95 / slot if p95 is not None else None,
        "target_round_seconds": TARGET_FRACTION * slot,
        "stretch_round_seconds": STRETCH_FRACTION * slot,
        "target_met_median": median is not None and median <= TARGET_FRACTION * slot,
        "target_met_p95": p95 is not None and p95 <= TARGET_FRACTION * slot,
        "stretch_met_p95": p95 is not None and p95 <= STRETCH_FRACTION * slot,
        "split_seconds_median": {
            part: statistics.median(r[part] for r in measured if part in r) if times else None
            for part in ("reports_seconds", "epoch_seconds", "directives_seconds")
        },
        "epochs_in_window": epochs_run,
        "controller_cpu_seconds_in_window": cpu,
        "controller_cpu_seconds_per_epoch": cpu / epochs_run if epochs_run else None,
        "controller_children_cpu_seconds_per_epoch": (
            children_cpu / epochs_run if epochs_run else None
        ),
        "controller_epoch_seconds_mean": dur_sum / dur_count if dur_count else None,
        "controller_epoch_cpu_seconds_mean_from_metrics": epoch_cpu_metric or None,
        "peak_rss_bytes": peak_rss,
        "admin_calls": {n: len(v) for n, v in admin.calls.items()},
        "admin_errors": admin.errors,
        "admin_call_seconds_p99": _pct(all_calls, 99),
        "admin_call_seconds_by_method": {
            n: {"p50": _pct(v, 50), "p99": _pct(v, 99), "max": max(v) if v else None}
            for n, v in admin.calls.items()
        },
        "reference_seconds": reference,
        "reference_seconds_before_after": [reference_before, reference_after],
        "round_median_over_reference": median / reference if median is not None else None,
        "cpu_per_epoch_over_reference": (cpu / epochs_run / reference) if epochs_run else None,
        "broken_streams": broken,
        "load_average_1min": os.getloadavg()[0],
        "rounds": rows,
        "what_is_timed": "round = first NodeReport of a slot written by any client to the "
        "last Ack written for the epoch that used the slot (client wall clocks, same "
        "machine); reports = first to last report written; epoch = last report written to "
        "first directive received (waiting for the trigger, ingest, the epoch); directives "
        "= first directive received to last Ack written. CPU = controller utime+stime "
        "(/proc) over the measured window / epochs run in it, admin calls included; "
        "children = the same for its child processes (the placement planner, at a lower "
        "CPU priority)",
    }
    write_result(args.json, "wire-scale", figures)
    png = args.png or args.json.with_suffix(".png")
    _plot(measured, slot, png)
    _print(figures)
    return 0


def _fmt(x: float | None, unit: str = " s") -> str:
    return "-" if x is None else f"{x:.3f}{unit}"


def _print(f: dict) -> None:
    slot = f["config"]["slot_seconds"]
    split = f["split_seconds_median"]
    print(
        f"rounds measured {f['rounds_measured']} (warm-up {f['warmup_rounds_discarded']} "
        f"discarded), all directives acknowledged: {f['all_directives_acknowledged']}"
    )
    print(
        f"round median {_fmt(f['round_seconds_median'])} p95 {_fmt(f['round_seconds_p95'])} "
        f"max {_fmt(f['round_seconds_max'])}  (reports {_fmt(split['reports_seconds'])}, "
        f"epoch {_fmt(split['epoch_seconds'])}, directives {_fmt(split['directives_seconds'])})"
    )
    print(
        f"target: round <= {TARGET_FRACTION} of the slot = {TARGET_FRACTION * slot:.3f} s: "
        f"median {'met' if f['target_met_median'] else 'NOT met'}, "
        f"p95 {'met' if f['target_met_p95'] else 'NOT met'}; stretch "
        f"{STRETCH_FRACTION * slot:.3f} s: p95 {'met' if f['stretch_met_p95'] else 'NOT met'}"
    )
    rss = f["peak_rss_bytes"]
    print(
        f"controller CPU {_fmt(f['controller_cpu_seconds_per_epoch'])} per epoch "
        f"({f['epochs_in_window']} epochs; its child processes "
        f"{_fmt(f['controller_children_cpu_seconds_per_epoch'])}), epoch wall mean "
        f"{_fmt(f['controller_epoch_seconds_mean'])} (its metrics), peak RSS "
        f"{rss / 2**20:.0f} MiB" + ("" if rss else " -")
    )
    print(
        f"admin calls p99 {_fmt(f['admin_call_seconds_p99'])} "
        f"({sum(f['admin_calls'].values())} calls, errors {f['admin_errors']})"
    )
    print(
        f"reference workload {f['reference_seconds']:.3f} s; round median / reference "
        f"{_fmt(f['round_median_over_reference'], '')}, CPU per epoch / reference "
        f"{_fmt(f['cpu_per_epoch_over_reference'], '')}"
    )
    if f["broken_streams"]:
        print(f"broken streams: {len(f['broken_streams'])}")


def _plot(measured: list[dict], slot: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in measured if r.get("round_seconds") is not None]
    fig, ax = plt.subplots(figsize=(8, 4))
    xs = [r["slot"] for r in rows]
    bottom = np.zeros(len(rows))
    for part, label in (
        ("reports_seconds", "reports out"),
        ("epoch_seconds", "trigger + epoch"),
        ("directives_seconds", "directives out, acked"),
    ):
        ys = np.array([r[part] for r in rows])
        ax.bar(xs, ys, bottom=bottom, label=label)
        bottom += ys
    ax.plot(xs, [r["round_seconds"] for r in rows], "k.", label="round")
    ax.axhline(TARGET_FRACTION * slot, color="red", ls="--", lw=1, label="target (0.1 slot)")
    ax.axhline(STRETCH_FRACTION * slot, color="grey", ls=":", lw=1, label="stretch (0.05 slot)")
    ax.set_xlabel("slot")
    ax.set_ylabel("seconds")
    ax.set_title(f"wire-scale: round per slot (slot {slot:g} s)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
