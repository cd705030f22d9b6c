"""`dschedctl`: talk to a running controller (status, mode, plan, qos, explain, top,
report).

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
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from google.protobuf.json_format import MessageToDict
from rich.console import Console

from controller import ctl_top, ctl_views
from controller.shadow_report import (
    DEFAULT_SINCE_SECONDS,
    REPORT_TIMEOUT_SECONDS,
    print_report,
    since_arg,
)
from dsched.config import ConfigError, load_config, parse_hostport, require
from dsched.tls import TlsConfig
from dsched_pb import dsched_pb2 as pb
from dsched_pb import dsched_pb2_grpc as pb_grpc

MODES = {"dry-run": pb.DRY_RUN, "enforce": pb.ENFORCE}


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


def _view_flags(parser: argparse.ArgumentParser, top_level: bool) -> None:
    """--json and --wide, accepted before the subcommand and after it.

    A subcommand's copies default to SUPPRESS, so a flag given before the
    subcommand is not reset by the subcommand's parser."""
    default = False if top_level else argparse.SUPPRESS
    parser.add_argument(
        "--json", action="store_true", default=default, help="print JSON for scripts"
    )
    parser.add_argument(
        "--wide",
        action="store_true",
        default=default,
        help="every column, lines as long as they need (default: fit the terminal, 80 "
        "columns when piped, or $COLUMNS)",
    )


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
    _view_flags(p, top_level=True)
    sub = p.add_subparsers(dest="cmd", required=True)

    def command(name: str, parent=sub, **kw) -> argparse.ArgumentParser:
        s = parent.add_parser(name, **kw)
        _view_flags(s, top_level=False)
        return s

    # One parser per subcommand; its handler is in COMMANDS below.
    command("status", help="mode, epoch, connected agents, engines")
    m = command("mode", help="switch between dry-run and enforce")
    m.add_argument("mode", choices=sorted(MODES))
    pl = command("plan", help="the last plan: one row per operator, with reasons")
    pl.add_argument(
        "--instances", action="store_true", help="a row per instance under each operator"
    )
    q = command("qos", help="QoS classes of applications")
    qs = q.add_subparsers(dest="qos_cmd", required=True)
    qset = command("set", qs, help="assign APP to CLASS (held until APP appears)")
    qset.add_argument("app")
    qset.add_argument("qos_class", metavar="CLASS")
    command("list", qs, help="assignments and classes")
    e = command("explain", help="one application's story over the last epochs")
    e.add_argument("app")
    e.add_argument("--epochs", type=int, default=10)
    t = command(
        "top",
        help="a live view of the plan per application and operator (s: sort, q: quit)",
    )
    t.add_argument(
        "--sort",
        choices=ctl_top.SORTS,
        default="cap",
        help="largest first: cap, usage, rate, latency (estimate, else measured, as a "
        "share of the class target); or by app name (default cap)",
    )
    t.add_argument(
        "--interval",
        type=_positive_seconds,
        default=2.0,
        metavar="SECONDS",
        help="seconds between refreshes (default 2)",
    )
    t.add_argument(
        "--once", action="store_true", help="print one frame and exit (with --json: its data)"
    )
    r = command("report", help="what enforce mode would have done over a window (dry-run)")
    r.add_argument(
        "--since",
        type=since_arg,
        default=DEFAULT_SINCE_SECONDS,
        metavar="DURATION",
        help="the window: 30m, 6h, 2d, 1h30m (units s m h d w; default 1d, at most 1w)",
    )
    return p


def _positive_seconds(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not v > 0 or v != v or v == float("inf"):
        raise argparse.ArgumentTypeError(f"must be > 0 seconds, got {text!r}")
    return v


@dataclass
class Ctx:
    """What a subcommand's handler gets: the settings, a stub on the admin door,
    and where and how wide to print."""

    cfg: CtlConfig
    stub: pb_grpc.AdminServiceStub
    console: Console
    # Width to lay views out for; None with --wide (no limit).
    width: int | None

    @property
    def timeout(self) -> float:
        return self.cfg.timeout

    def lines(self, lines) -> None:
        for line in lines:
            # Laid out already: printed as they are, never wrapped again or cut.
            self.console.print(line, soft_wrap=True)

    def json(self, value) -> None:
        text = value if isinstance(value, str) else ctl_views.json_text(value)
        print(text)


def _message_json(msg, defaults: bool = False) -> str:
    return json.dumps(MessageToDict(msg, always_print_fields_with_no_presence=defaults), indent=2)


def cmd_status(args, ctx: Ctx) -> int:
    r = ctx.stub.Status(pb.StatusRequest(), timeout=ctx.timeout)
    if args.json:
        ctx.json(_message_json(r))
        return 0
    ctx.lines(ctl_views.status_lines(r, ctx.width))
    return 0


def cmd_mode(args, ctx: Ctx) -> int:
    r = ctx.stub.SetMode(pb.SetModeRequest(mode=MODES[args.mode]), timeout=ctx.timeout)
    prev = ctl_views.mode_name(r.previous)
    if args.json:
        ctx.json({"mode": ctl_views.mode_name(r.mode), "previous": prev})
        return 0
    ctx.console.print(f"mode {prev} -> {args.mode}")
    return 0


def cmd_plan(args, ctx: Ctx) -> int:
    r = ctx.stub.GetPlan(pb.GetPlanRequest(), timeout=ctx.timeout)
    if args.json:
        ctx.json(r.record_json or "{}")
        return 0
    if not r.epoch:
        ctx.console.print("no plan yet: the controller has not finished an epoch with data")
        return 0
    rec = json.loads(r.record_json) if r.record_json else {}
    ctx.lines(ctl_views.plan_lines(r, rec, ctx.width, instances=args.instances))
    return 0


def cmd_qos(args, ctx: Ctx) -> int:
    if args.qos_cmd == "set":
        r = ctx.stub.SetQos(
            pb.SetQosRequest(app=args.app, qos_class=args.qos_class), timeout=ctx.timeout
        )
        if args.json:
            ctx.json(_message_json(r, defaults=True))
            return 0
        held = "" if r.app_known else " (held until the application appears)"
        ctx.lines(ctl_views.fit([f"{r.app}: {r.qos_class}{held}"], ctx.width))
        return 0
    r = ctx.stub.ListQos(pb.ListQosRequest(), timeout=ctx.timeout)
    if args.json:
        ctx.json(_message_json(r, defaults=True))
        return 0
    ctx.lines(ctl_views.qos_lines(r, ctx.width))
    return 0


def cmd_explain(args, ctx: Ctx) -> int:
    r = ctx.stub.Explain(pb.ExplainRequest(app=args.app, epochs=args.epochs), timeout=ctx.timeout)
    if args.json:
        ctx.json(r.records_json or "[]")
        return 0
    ctx.lines(ctl_views.fit(r.lines, ctx.width))
    return 0


def cmd_top(args, ctx: Ctx) -> int:
    state = ctl_top.TopState(ctx.cfg.address, args.interval, args.sort)
    if args.once:
        # Unreachable: the RpcError goes up and exits 3 like every other command.
        state.data, state.read_at = ctl_top.fetch(ctx.stub, ctx.timeout), time.time()
        if args.json:
            ctx.json(state.frame())
        else:
            ctx.lines(ctl_top.frame_lines(state, ctx.width))
        return 0
    if args.json:
        print("dschedctl: error: top --json needs --once", file=sys.stderr)
        return 2
    poller = ctl_top.Poller(state, lambda: admin_channel(ctx.cfg), ctx.timeout)
    # On a terminal the live view follows its size; piped, frames are laid out as
    # every other view is (80 columns, $COLUMNS, or unbounded with --wide).
    console = Console(highlight=False)
    if not console.is_terminal:
        console = ctx.console
    return ctl_top.run(poller, console, wide=args.wide)


def cmd_report(args, ctx: Ctx) -> int:
    r = ctx.stub.Report(
        pb.ReportRequest(since_seconds=args.since),
        timeout=max(ctx.timeout, REPORT_TIMEOUT_SECONDS),
    )
    print_report(r.report_json, args.json, ctx.console)
    return 0


# The subcommands: build_parser adds a parser per name, main calls its handler
# with the parsed arguments and a Ctx; a handler returns the exit status.
COMMANDS: dict[str, Callable[[argparse.Namespace, Ctx], int]] = {
    "status": cmd_status,
    "mode": cmd_mode,
    "plan": cmd_plan,
    "qos": cmd_qos,
    "explain": cmd_explain,
    "top": cmd_top,
    "report": cmd_report,
}


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    try:
        cfg = resolve_config(args)
    except ConfigError as exc:
        p.exit(2, f"dschedctl: error: {exc}\n")
    args.timeout = cfg.timeout

    width = ctl_views.output_width(args.wide)
    console = Console(highlight=False, width=width or 10_000)
    channel = admin_channel(cfg)
    ctx = Ctx(cfg, pb_grpc.AdminServiceStub(channel), console, width)
    try:
        return COMMANDS[args.cmd](args, ctx)
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


if __name__ == "__main__":
    sys.exit(main())
