"""`dsched-agent`: the node agent daemon.

Reads /etc/dsched/agent.toml (or --config), applies command-line overrides,
re-adopts its cgroup tree, serves the registration socket and /metrics, and
keeps one stream to the controller. SIGTERM / SIGINT stop it cleanly; caps are
left in place so a restarted agent (or none at all) keeps enforcing them.
A bad configuration prints one line naming the key and exits with code 2.
"""

from __future__ import annotations

import argparse
import gc
import logging
import signal
import sys
import threading
import time

from agent.config import DEFAULT_CONFIG_PATH, AgentConfig
from agent.discovery import RuleDiscovery
from agent.engines import make_engines
from agent.engines.discovery import EngineDiscovery
from agent.link import ControllerLink
from agent.node import NodeAgent
from agent.socket_server import RegistrationServer
from dsched.config import ConfigError, load_config, override

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
    agent = NodeAgent(config)
    port = agent.metrics.serve(config.metrics)
    server = RegistrationServer(config.socket, agent)
    server.start()
    link = ControllerLink(agent, config.controller, config.tls, config.report_buffer)
    link.start()
    discovery = RuleDiscovery(agent, config.discovery, config.proc_root)
    # Engines scan on their own thread: a slow jcmd must never delay sampling or reports.
    engines = EngineDiscovery(agent, make_engines(config.engine, config.proc_root))
    engines.start()
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
    try:
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
    finally:
        log.info("stopping; caps stay in place")
        engines.stop()
        link.stop()
        server.stop()
        agent.metrics.close()
        agent.close()
    return 0


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
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        return run(config, stop)
    except OSError as exc:
        print(f"dsched-agent: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
