"""`dsched`: the umbrella command (`dsched demo`, `dsched bench NAME`,
`dsched profile OPERATOR`).

The subcommands run code that the installed package does not carry: the demo
and the profiler live in ``testbed/`` and the benchmarks in ``bench/``, which stay in the
source tree so that agent nodes install only the daemons. They are imported
when the command runs; without them (a wheel install) it says how to get them
and exits with code 2.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import signal
import sys
from types import ModuleType

from dsched import signals

_NOT_BENCHMARKS = {"common", "plots"}
# Packages of this project; an import error inside them is a bug, not a missing install.
_OURS = {"dsched", "dsched_pb", "agent", "controller", "predict", "spark_stream"}
_SOURCE_ONLY = {"testbed", "bench"}

MISSING = (
    "dsched: error: `dsched demo`, `dsched bench` and `dsched profile` need the testbed and the "
    "benchmarks with their dependencies, and this installation lacks them ({why}). "
    "Run them from a source checkout of dsched after "
    "`pip install -e '.[testbed,bench]'` (or `make install`)."
)


def _benchmarks(bench: ModuleType) -> list[str]:
    names = [m.name for m in pkgutil.iter_modules(bench.__path__) if not m.name.startswith("_")]
    return sorted(n.replace("_", "-") for n in names if n not in _NOT_BENCHMARKS)


def _load() -> tuple[ModuleType, ModuleType, dict[str, ModuleType]]:
    """The demo and profiler modules and the benchmark modules (name -> module)."""
    demo = importlib.import_module("testbed.demo")
    profile = importlib.import_module("testbed.profile")
    bench = importlib.import_module("bench")
    modules = {}
    for name in _benchmarks(bench):
        mod = importlib.import_module("bench." + name.replace("-", "_"))
        if hasattr(mod, "run"):
            modules[name] = mod
    return demo, profile, modules


def _missing_install(exc: ImportError) -> bool:
    """Whether ``exc`` means testbed, bench or one of their dependencies is not installed."""
    if not isinstance(exc, ModuleNotFoundError) or not exc.name:
        return False
    top = exc.name.split(".")[0]
    return exc.name in _SOURCE_ONLY or top not in _OURS | _SOURCE_ONLY


def main(argv: list[str] | None = None) -> int:
    # SIGTERM (systemctl stop, timeout, CI) stops a run as Ctrl-C does, from the
    # first import on: everything a run started is stopped on the way out, then
    # the exit status is 130 (docs/operations.md, "Stopping").
    with signals.sigterm_as_interrupt():
        try:
            return _main(list(sys.argv[1:] if argv is None else argv))
        except KeyboardInterrupt as exc:
            name = signals.signal_name(getattr(exc, "signum", None) or signal.SIGINT)
            print(f"dsched: stopped by {name}", file=sys.stderr)
            return signals.INTERRUPTED


def _main(argv: list[str]) -> int:
    try:
        demo, profile, benchmarks = _load()
    except ImportError as exc:
        if not _missing_install(exc):
            raise
        print(MISSING.format(why=f"no module named {exc.name!r}"), file=sys.stderr)
        return 2
    parser = argparse.ArgumentParser(
        prog="dsched",
        description="dsched umbrella command: run the demo, a benchmark or the profiler.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    demo_p = sub.add_parser(
        "demo",
        help="controller + agent + live WordCount on this machine",
        description=demo.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    demo.add_arguments(demo_p)

    profile_p = sub.add_parser(
        "profile",
        help="performance model of a testbed operator from real runs under a cap",
        description=profile.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    profile.add_arguments(profile_p)

    bench_p = sub.add_parser("bench", help="run a benchmark (JSON, and PNG where useful)")
    bench_sub = bench_p.add_subparsers(dest="benchmark", required=True, metavar="NAME")
    for name, mod in benchmarks.items():
        doc = (mod.__doc__ or "").strip()
        p = bench_sub.add_parser(
            name,
            help=doc.splitlines()[0] if doc else name,
            description=doc,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        mod.add_arguments(p)

    args = parser.parse_args(argv)
    try:
        if args.command == "demo":
            return demo.run(args)
        if args.command == "profile":
            return profile.run(args)
        return int(benchmarks[args.benchmark].run(args) or 0)
    except ValueError as exc:
        # Bad arguments are refused by the runs before anything starts.
        parser.exit(2, f"dsched: error: {exc}\n")
    except RuntimeError as exc:
        if args.command != "profile":
            raise
        # The machine cannot run it (no writable cgroup v1 cpu controller).
        parser.exit(1, f"dsched profile: {exc}\n")


if __name__ == "__main__":
    sys.exit(main())
