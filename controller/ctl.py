"""`dschedctl`: talk to a running controller (status, mode, plan, qos, explain).

It speaks only to the controller's admin door, never to the agents' port: by
default the Unix socket whose file mode decides who may act, or a HOST:PORT
door with mutual TLS and an admin certificate (docs/security.md). Settings come
from flags, else a small TOML file (``--config``, ``$DSCHEDCTL_CONFIG``,
``~/.config/dsched/dschedctl.toml``, ``/etc/dsched/dschedctl.toml``, first found).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from rich.console import Console
from rich.table import Table

from dsched.config import ConfigError, load_config, parse_hostport, require
from dsched.tls import TlsConfig
from dsched_pb import dsched_pb2 as pb
from dsched_pb import dsched_pb2_grpc as pb_grpc

MODES = {"dry-run": pb.DRY_RUN, "enforce": pb.ENFORCE}


def _fmt(v: float, digits: int = 2) -> str:
    return "-" if v < 0 else f"{v:.{digits}f}"


def plan_table(reply: pb.PlanReply, title: str | None = None) -> Table:
    t = Table(
        title=title or f"epoch {reply.epoch} ({pb.Mode.Name(reply.mode).lower().replace('_', '-')})"
    )
    for col in (
        "app",
        "operator",
        "inst",
        "arrival/s",
        "predicted/s",
        "by",
        "demand",
        "cap",
        "usage",
        "queue",
        "latency ms",
        "reason",
    ):
        t.add_column(col, justify="left" if col in ("app", "operator", "by", "reason") else "right")
    for o in reply.operators:
        t.add_row(
            o.app,
            o.operator,
            str(o.instances),
            f"{o.arrival_rate:.1f}",
            f"{o.predicted_rate:.1f}",
            o.predictor,
            f"{o.demand_cores:.2f}",
            f"{o.cap_cores:.2f}",
            f"{o.usage_cores:.2f}",
            str(o.queue_length),
            _fmt(o.latency_ms, 1),
            o.reason,
        )
    return t


def apps_table(rec: dict) -> Table:
    """Per application: class, demand, allocation, latency and the DP's units."""
    t = Table(title="applications")
    for col in (
        "app",
        "class",
        "weight",
        "target ms",
        "demand",
        "allocated",
        "caps",
        "cut",
        "latency ms",
        "estimate ms",
        "dp units",
    ):
        t.add_column(col, justify="left" if col in ("app", "class") else "right")
    for a in rec.get("apps", []):
        lat, est = a.get("latency_ms"), a.get("latency_estimate_ms")
        t.add_row(
            a["app"],
            a["class"],
            f"{a['weight']:g}",
            f"{a['target_ms']:g}",
            f"{a['demand_cores']:.2f}",
            f"{a['allocated_cores']:.2f}",
            f"{a['cap_cores']:.2f}",
            f"{a['cut_cores']:.2f}",
            "-" if lat is None else f"{lat:.1f}",
            "-" if est is None else f"{est:.1f}",
            str(a["dp_units"]),
        )
    return t


def engine_lines(engines) -> list[str]:
    """One line per engine counter edge: where it reads, whether it is healthy and why not."""
    lines = []
    for e in engines:
        health = "healthy" if e.healthy else f"UNHEALTHY ({e.reason})"
        lines.append(
            f"engine {e.name} ({e.kind} at {e.endpoint}): {health}, {e.jobs} job(s), "
            f"{e.instances} instance(s), last read {_fmt(e.last_read_age_seconds, 1)} s ago"
        )
    return lines


DEFAULT_ADMIN_ADDRESS = "unix:/run/dsched/admin.sock"
CONFIG_SEARCH = (
    Path("~/.config/dsched/dschedctl.toml"),
    Path("/etc/dsched/dschedctl.toml"),
)


@dataclass
class CtlConfig:
    """``dschedctl.toml``: where the admin door is and how to prove who you are."""

    # The controller's admin door (its `admin_listen`): `unix:PATH` (whoever may open
    # the socket file may act) or `HOST:PORT` (mutual TLS with an admin certificate
    # unless on loopback).
    address: str = DEFAULT_ADMIN_ADDRESS
    # Seconds to wait for the controller's answer.
    timeout: float = 5.0
    # The name the controller's certificate carries, when it is not the address's host
    # (TLS only).
    server_name: str = ""
    # `cert` + `key`: your admin certificate; `ca`: the CA that signed the controller's
    # server certificate. All empty: no TLS.
    tls: TlsConfig = field(default_factory=TlsConfig)

    @property
    def is_unix(self) -> bool:
        return self.address.startswith("unix:")

    def validate(self) -> None:
        require(self.timeout > 0, "timeout", "must be > 0 seconds")
        if self.is_unix:
            path = self.address.removeprefix("unix:")
            require(
                bool(path.lstrip("/")), "address", "a Unix socket address is unix:/path/to/socket"
            )
            require(
                not self.tls.enabled,
                "tls",
                "TLS is for a HOST:PORT admin door; a Unix socket is guarded by its file mode",
            )
        else:
            parse_hostport("address", self.address)
        require(
            not self.server_name or self.tls.enabled,
            "server_name",
            "only meaningful with TLS (set tls.ca, tls.cert, tls.key)",
        )
        self.tls.validate("client")


def find_config(given: str | None) -> Path | None:
    """The config file to read: --config, $DSCHEDCTL_CONFIG, then the usual places."""
    if given:
        return Path(given)
    if os.environ.get("DSCHEDCTL_CONFIG"):
        return Path(os.environ["DSCHEDCTL_CONFIG"])
    for candidate in CONFIG_SEARCH:
        path = candidate.expanduser()
        if path.is_file():
            return path
    return None


def admin_channel(cfg: CtlConfig) -> grpc.Channel:
    """A channel to the admin door: plaintext on a Unix socket, TLS where configured."""
    if not cfg.tls.enabled:
        return grpc.insecure_channel(cfg.address)
    cert, key, ca = cfg.tls.read()
    options = [("grpc.ssl_target_name_override", cfg.server_name)] if cfg.server_name else []
    return grpc.secure_channel(
        cfg.address,
        grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert),
        options=options,
    )


def resolve_config(args: argparse.Namespace) -> CtlConfig:
    """The file's settings, overridden by the flags that were given."""
    cfg = load_config(CtlConfig, find_config(args.config))
    given = (("cert", args.cert), ("key", args.key), ("ca", args.ca))
    tls_flags = {k: Path(v) for k, v in given if v is not None}
    changes = {"address": args.address, "timeout": args.timeout, "server_name": args.server_name}
    changes = {k: v for k, v in changes.items() if v is not None}
    if tls_flags:
        changes["tls"] = dataclasses.replace(cfg.tls, **tls_flags)
    # Validated as a whole: the TLS files as a client's (a CA to check the controller).
    cfg = dataclasses.replace(cfg, **changes)
    cfg.validate()
    return cfg


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="dschedctl",
        description="Control a running dsched controller through its admin door.",
        epilog=(
            "Settings not given as flags come from --config, $DSCHEDCTL_CONFIG, "
            "~/.config/dsched/dschedctl.toml or /etc/dsched/dschedctl.toml (first found): "
            "keys address, timeout, server_name and a [tls] table with cert, key, ca. "
            "Exit status: 0 done, 1 refused by the controller, 2 bad arguments or "
            "settings, 3 controller not reachable."
        ),
    )
    p.add_argument("--config", metavar="PATH", help="dschedctl.toml to read settings from")
    p.add_argument(
        "--address",
        help=f"the controller's admin door: unix:PATH or HOST:PORT "
        f"(default {DEFAULT_ADMIN_ADDRESS})",
    )
    p.add_argument("--timeout", type=float, help="seconds to wait for the controller (default 5)")
    p.add_argument("--ca", metavar="PEM", help="CA of the controller's server certificate (TLS)")
    p.add_argument("--cert", metavar="PEM", help="your admin client certificate (TLS)")
    p.add_argument("--key", metavar="PEM", help="the key of --cert (TLS)")
    p.add_argument(
        "--server-name",
        metavar="NAME",
        help="name in the controller's certificate, when not the address's host (TLS)",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("status", help="mode, epoch, connected agents, engines")
    m = sub.add_parser("mode", help="switch between dry-run and enforce")
    m.add_argument("mode", choices=sorted(MODES))
    sub.add_parser("plan", help="the last plan with reasons")
    q = sub.add_parser("qos", help="QoS classes of applications")
    qs = q.add_subparsers(dest="qos_cmd", required=True)
    qset = qs.add_parser("set", help="assign APP to CLASS (held until APP appears)")
    qset.add_argument("app")
    qset.add_argument("qos_class", metavar="CLASS")
    qs.add_parser("list", help="assignments and classes")
    e = sub.add_parser("explain", help="one application's story over the last epochs")
    e.add_argument("app")
    e.add_argument("--epochs", type=int, default=10)
    return p


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    try:
        cfg = resolve_config(args)
    except ConfigError as exc:
        p.exit(2, f"dschedctl: error: {exc}\n")
    args.timeout = cfg.timeout

    console = Console()
    channel = admin_channel(cfg)
    stub = pb_grpc.AdminServiceStub(channel)
    try:
        return _run(args, stub, console)
    except grpc.RpcError as exc:
        code = exc.code()
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            # The details say why: no socket, permission denied, a refused handshake.
            print(
                f"dschedctl: controller at {cfg.address} is not reachable "
                f"({code.name.lower()}: {exc.details()})",
                file=sys.stderr,
            )
            return 3
        if code == grpc.StatusCode.UNIMPLEMENTED:
            print(
                f"dschedctl: {cfg.address} is not an admin door (an agents' port?): "
                f"{exc.details()}",
                file=sys.stderr,
            )
            return 1
        print(f"dschedctl: {exc.details()}", file=sys.stderr)
        return 1
    finally:
        channel.close()


def _run(args, stub, console: Console) -> int:
    t = args.timeout
    if args.cmd == "status":
        r = stub.Status(pb.StatusRequest(), timeout=t)
        if args.json:
            from google.protobuf.json_format import MessageToDict

            print(json.dumps(MessageToDict(r), indent=2))
            return 0
        console.print(
            f"mode [bold]{pb.Mode.Name(r.mode).lower().replace('_', '-')}[/], epoch {r.epoch}, "
            f"{len(r.agents)} agent(s), {r.applications} app(s), {r.instances} instance(s), "
            f"slot {r.slot_seconds:g} s, version {r.version}"
        )
        tab = Table("node", "cores", "cgroups", "instances", "report age s", "counters", "dry-run")
        for a in r.agents:
            tab.add_row(
                a.node_id,
                f"{a.cpu_capacity_cores:g}",
                pb.CgroupMode.Name(a.cgroup_mode),
                str(a.instances),
                _fmt(a.last_report_age_seconds, 1),
                ",".join(a.counters_available),
                "yes" if a.dry_run else "no",
            )
        console.print(tab)
        for line in engine_lines(r.engines):
            # soft_wrap: a URL or a reason is never broken inside.
            console.print(line, soft_wrap=True, markup=False)
    elif args.cmd == "mode":
        r = stub.SetMode(pb.SetModeRequest(mode=MODES[args.mode]), timeout=t)
        prev = pb.Mode.Name(r.previous).lower().replace("_", "-")
        console.print(f"mode {prev} -> {args.mode}")
    elif args.cmd == "plan":
        r = stub.GetPlan(pb.GetPlanRequest(), timeout=t)
        if args.json:
            print(r.record_json or "{}")
            return 0
        if not r.epoch:
            console.print("no plan yet: the controller has not finished an epoch with data")
            return 0
        console.print(plan_table(r))
        rec = json.loads(r.record_json) if r.record_json else {}
        if rec.get("apps"):
            console.print(apps_table(rec))
        for note in rec.get("notes", []):
            console.print(f"- {note}")
        node = rec.get("node_recommendation")
        if node:
            console.print(f"- nodes: {node['nodes_delta']:+d} ({node['reason']})")
    elif args.cmd == "qos":
        if args.qos_cmd == "set":
            r = stub.SetQos(pb.SetQosRequest(app=args.app, qos_class=args.qos_class), timeout=t)
            held = "" if r.app_known else " (held until the application appears)"
            console.print(f"{r.app}: {r.qos_class}{held}")
        else:
            r = stub.ListQos(pb.ListQosRequest(), timeout=t)
            if args.json:
                from google.protobuf.json_format import MessageToDict

                print(
                    json.dumps(
                        MessageToDict(r, always_print_fields_with_no_presence=True), indent=2
                    )
                )
                return 0
            tab = Table("class", "target ms", "max violation", "weight", title="classes")
            for c in r.classes:
                tab.add_row(
                    c.name,
                    f"{c.target_latency_ms:g}",
                    f"{c.max_violation_ratio:g}",
                    f"{c.weight:g}",
                )
            console.print(tab)
            tab = Table(
                "app", "class", "known", "source", title=f"assignments (default {r.default_class})"
            )
            for a in r.assignments:
                tab.add_row(
                    a.app,
                    a.qos_class,
                    "yes" if a.app_known else "no",
                    "default" if a.defaulted else "set",
                )
            console.print(tab)
    elif args.cmd == "explain":
        r = stub.Explain(pb.ExplainRequest(app=args.app, epochs=args.epochs), timeout=t)
        if args.json:
            print(r.records_json or "[]")
            return 0
        for line in r.lines:
            console.print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
