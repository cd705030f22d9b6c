"""`dsched-agent`: the node agent daemon.

Reads /etc/dsched/agent.toml (or --config), applies command-line overrides,
re-adopts its cgroup tree, serves the registration socket and /metrics, and
keeps one stream to the controller. SIGTERM / SIGINT stop it cleanly (exit
status 0): caps on running instances are left in place so a restarted agent (or
none at all) keeps enforcing them; cgroups no thread is left in, an empty root
and the registration socket are removed. A bad configuration prints one line
naming the key and exits with code 2; a failure to start exits with 1.
"""

from __future__ import annotations

import argparse
import gc
import logging
import sys
import threading
import time
from contextlib import ExitStack

from agent.config import DEFAULT_CONFIG_PATH, AgentConfig
from agent.discovery import RuleDiscovery
from agent.engines import make_engines
from agent.engines.discovery import EngineDiscovery
from agent.link import ControllerLink
from agent.node import NodeAgent
from agent.socket_server import RegistrationServer
from dsched.config import ConfigError, load_config, override
from dsched.signals import STOPPED, StopOnSignals

log = logging.getLogger("dsched.agent")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dsched-agent", description=__doc__.splitlines()[0])
    p.add_argument("--config", help=f"TOML file (default {DEFAULT_CONFIG_PATH} if it exists)")
    p.add_argument("--controller", help="controller HOST:PORT")
    p.add_argument("--node-id", help="this node's id (default: hostname)")
    p.add_argument("--cgroup-root", help="name of the agent's cgroup directory")
    p.add_argument("--metrics", help="HOST:PORT for /metrics")
    p.add_argument("--socket", help="registration socket path")
    p.add_argument("--slot-seconds", type=float, help="report period")
    p.add_argument("--dry-run", action="store_true", default=None, help="never write a cgroup file")
    p.add_argument("--log-level", default="INFO")
    return p


def load(args: argparse.Namespace) -> AgentConfig:
    path = args.config
    if path is None and DEFAULT_CONFIG_PATH.exists():
        path = DEFAULT_CONFIG_PATH
    config = load_config(AgentConfig, path)
    try:
        return override(
            config,
            controller=args.controller,
            node_id=args.node_id,
            cgroup_root=args.cgroup_root,
            metrics=args.metrics,
            socket=args.socket,
            slot_seconds=args.slot_seconds,
            dry_run=args.dry_run,
        )
    except ConfigError as exc:
        raise ConfigError("--" + exc.key.replace("_", "-"), str(exc).split(": ", 1)[1]) from None


def run(config: AgentConfig, stop: threading.Event) -> int:
    with ExitStack() as cleanup:
        return _run(config, stop, cleanup)


def _run(config: AgentConfig, stop: threading.Event, cleanup: ExitStack) -> int:
    """The agent until ``stop``; ``cleanup`` undoes each step in reverse, however
    far the start got: the registration socket is removed, cgroups left without
    threads and an empty root are removed, caps on running instances stay."""
    # Nothing on the node changes until the controller says it enforces.
    agent = NodeAgent(config, await_controller=True)
    cleanup.callback(agent.close)
    cleanup.callback(agent.enforcer.remove_empty)
    port = agent.metrics.serve(config.metrics)
    cleanup.callback(agent.metrics.close)
    server = RegistrationServer(config.socket, agent)
    server.start()
    cleanup.callback(server.stop)
    link = ControllerLink(agent, config.controller, config.tls, config.report_buffer)
    link.start()
    cleanup.callback(link.stop)
    discovery = RuleDiscovery(agent, config.discovery, config.proc_root)
    # Engines scan on their own thread: a slow jcmd must never delay sampling or reports.
    engines = EngineDiscovery(agent, make_engines(config.engine, config.proc_root))
    engines.start()
    cleanup.callback(engines.stop)
    cleanup.callback(log.info, "stopping; caps stay in place")
    log.info(
        "agent %s up: socket %s, metrics port %d, controller %s, mode %s",
        config.node_id,
        config.socket,
        port,
        config.controller,
        agent.backend.mode,
    )
    # Everything built so far (gRPC, protobuf, metrics, modules) lives as long as
    # the process: the cyclic collector need not walk it again on every full
    # collection, which would otherwise be the agent's largest steady cost.
    gc.freeze()
    next_slot = time.monotonic() + config.slot_seconds
    next_discovery = time.monotonic()
    while not stop.wait(config.sample_seconds):
        now = time.monotonic()
        if discovery.rules and now >= next_discovery:
            discovery.scan()
            next_discovery = now + config.discovery_seconds
        agent.sample()
        if now >= next_slot:
            link.submit_report(agent.report())
            agent.check_lease()
            while next_slot <= now:
                next_slot += config.slot_seconds
    return STOPPED


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        config = load(args)
    except ConfigError as exc:
        print(f"dsched-agent: {exc}", file=sys.stderr)
        return 2
    # SIGTERM and SIGINT end the main loop; the stop is the agent's normal end (0).
    with StopOnSignals() as stop:
        try:
            return run(config, stop.event)
        except OSError as exc:
            print(f"dsched-agent: {exc}", file=sys.stderr)
            return 1


if __name__ == "__main__":
    sys.exit(main())
