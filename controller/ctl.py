"""`dschedctl`: talk to a running controller (status, mode, plan, qos, explain)."""

from __future__ import annotations

import argparse
import json
import sys

import grpc
from rich.console import Console
from rich.table import Table

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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="dschedctl", description="Control a running dsched controller."
    )
    p.add_argument("--address", default="127.0.0.1:7700", help="controller gRPC HOST:PORT")
    p.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for the controller")
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
    args = p.parse_args(argv)

    console = Console()
    channel = grpc.insecure_channel(args.address)
    stub = pb_grpc.AdminServiceStub(channel)
    try:
        return _run(args, stub, console)
    except grpc.RpcError as exc:
        code = exc.code()
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            print(
                f"dschedctl: controller at {args.address} is not reachable ({code.name.lower()})",
                file=sys.stderr,
            )
            return 3
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
