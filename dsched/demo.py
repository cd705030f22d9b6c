"""Run a controller, a local agent and the live WordCount testbed under a changing input rate."""


def add_arguments(parser):
    parser.add_argument("--duration", type=float, default=120.0)


def run(args) -> int:
    raise SystemExit("dsched demo: not built yet")
