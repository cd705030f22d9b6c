"""`dsched-controller`: the central control loop as a daemon."""

from __future__ import annotations

import argparse
import faulthandler
import logging
import resource
import sys
from pathlib import Path

from controller.config import ControllerConfig
from dsched.config import ConfigError, load_config, override
from dsched.signals import STOPPED, StopOnSignals

DEFAULT_CONFIG = Path("/etc/dsched/controller.toml")
#: A stop that has not finished after this long prints every thread's stack to
#: stderr (the journal), so a hang names where it waits; the stop goes on.
STOP_STACKS_AFTER_SECONDS = 20.0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="dsched-controller",
        description=(
            "Central dsched controller: receives agents' reports, predicts load, decides "
            "per-instance CPU caps every slot and (in enforce mode) pushes them to the agents. "
            "Starts in dry-run unless the config or a persisted `dschedctl mode` says otherwise."
        ),
    )
    p.add_argument(
        "--config", type=Path, help=f"TOML config (default {DEFAULT_CONFIG} if it exists)"
    )
    p.add_argument("--listen", help="the agents' gRPC HOST:PORT (default 127.0.0.1:7700)")
    p.add_argument(
        "--admin-listen",
        help="the admin door for dschedctl: unix:PATH or HOST:PORT "
        "(default unix:/run/dsched/admin.sock)",
    )
    p.add_argument(
        "--state-dir", type=Path, help="SQLite state directory (default /var/lib/dsched)"
    )
    p.add_argument("--metrics", help="Prometheus HOST:PORT (default 127.0.0.1:9708)")
    p.add_argument("--slot-seconds", type=float, help="control period T (default 10)")
    p.add_argument("--mode", choices=["dry-run", "enforce"], help="mode on first start")
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    return p.parse_args(argv)


def load(args: argparse.Namespace) -> ControllerConfig:
    path = args.config
    if path is None and DEFAULT_CONFIG.exists():
        path = DEFAULT_CONFIG
    cfg = load_config(ControllerConfig, path)
    return override(
        cfg,
        listen=args.listen,
        admin_listen=args.admin_listen,
        state_dir=args.state_dir,
        metrics=args.metrics,
        slot_seconds=args.slot_seconds,
        mode=args.mode,
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        cfg = load(args)
    except ConfigError as exc:
        print(f"dsched-controller: {exc}", file=sys.stderr)
        return 2
    from controller.core import Controller, tune_gc
    from controller.edges.server import serve
    from controller.edges.store import StateFileError

    tune_gc()

    raise_open_files_limit()
    # Before the doors open: a stop asked for during startup is then a clean stop
    # (SIGTERM or SIGINT: exit status 0; docs/operations.md, "Stopping").
    stop = StopOnSignals().install()
    try:
        controller = Controller(cfg)
    except StateFileError as exc:
        # A state file from a newer release or one SQLite cannot read: left as
        # it is, nothing started, and a restart would not help (docs/operations.md,
        # "Upgrading").
        print(f"dsched-controller: cannot start: {exc}", file=sys.stderr)
        return 2
    server = None
    try:
        server = serve(controller)
        controller.start()
    except (OSError, RuntimeError, ConfigError) as exc:
        print(f"dsched-controller: cannot start: {exc}", file=sys.stderr)
        if server is not None:
            server.stop()
        controller.stop()
        return 1
    logging.getLogger("dsched.controller").info(
        "agents on %s, admin on %s (mode %s, slot %.1f s, metrics %s, state %s)",
        cfg.listen,
        server.admin_address,
        controller.mode,
        cfg.slot_seconds,
        cfg.metrics,
        cfg.state_dir,
    )
    stop.block()
    faulthandler.dump_traceback_later(STOP_STACKS_AFTER_SECONDS, exit=False)
    try:
        server.stop(grace=2)
        controller.stop()
    finally:
        faulthandler.cancel_dump_traceback_later()
    return STOPPED


def raise_open_files_limit() -> None:
    """Every agent stream is a socket: lift the soft descriptor limit to the hard one
    (a default soft limit of 1024 would refuse the thousandth agent)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError) as exc:
            logging.getLogger("dsched.controller").warning(
                "cannot raise the open files limit from %d: %s", soft, exc
            )


if __name__ == "__main__":
    sys.exit(main())
