"""`dsched`: the umbrella command (`dsched demo`, `dsched bench NAME`)."""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

import bench

_NOT_BENCHMARKS = {"common", "plots"}


def _benchmarks() -> list[str]:
    names = [m.name for m in pkgutil.iter_modules(bench.__path__) if not m.name.startswith("_")]
    return sorted(n.replace("_", "-") for n in names if n not in _NOT_BENCHMARKS)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(
        prog="dsched",
        description="dsched umbrella command: run the demo or a benchmark.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    from dsched import demo

    demo_p = sub.add_parser(
        "demo",
        help="controller + agent + live WordCount on this machine",
        description=demo.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    demo.add_arguments(demo_p)

    bench_p = sub.add_parser("bench", help="run a benchmark (JSON, and PNG where useful)")
    bench_sub = bench_p.add_subparsers(dest="benchmark", required=True, metavar="NAME")
    modules = {}
    for name in _benchmarks():
        mod = importlib.import_module("bench." + name.replace("-", "_"))
        if not hasattr(mod, "run"):
            continue
        doc = (mod.__doc__ or "").strip()
        p = bench_sub.add_parser(
            name,
            help=doc.splitlines()[0] if doc else name,
            description=doc,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        mod.add_arguments(p)
        modules[name] = mod

    args = parser.parse_args(argv)
    try:
        if args.command == "demo":
            return demo.run(args)
        return int(modules[args.benchmark].run(args) or 0)
    except ValueError as exc:
        # Bad arguments are refused by the runs before anything starts.
        parser.exit(2, f"dsched: error: {exc}\n")


if __name__ == "__main__":
    sys.exit(main())
