"""One client process of `dsched bench wire-scale`: many fake agents on real gRPC streams.

Run by bench/wire_scale.py as ``python -m bench.wire_client --target ... --nodes A:B``;
not a benchmark of its own (it has no ``run``). Each fake agent holds one
``grpc.aio`` channel (its own TCP connection, as a real agent has) and one
``AgentService.Connect`` stream. It opens the stream with a Hello shaped like a
real agent's (agent/reporter.py), sends one NodeReport per slot from the
synthetic cluster of bench/controller_scale.py (the instances of this node
only) and answers every CapDirective with an Ack the way agent/directives.py
does: caps for instances it does not hold or outside (0, node cores] are
refused with the agent's reasons, the rest are counted as applied.

Protocol with the parent, one JSON object a line:

- stdout ``{"ready": ...}`` once every stream is open (its Welcome received);
- stdin ``{"start": B0, "slots": N}``: slot k's reports leave at wall-clock
  time B0 + k * slot, the same boundary in every client process;
- stdout ``{"done": ...}`` with the send times of every slot and, per epoch,
  when its directives arrived and when they were acknowledged;
- stdin ``{"stop": true}``, end of input, SIGTERM or SIGINT, at any point:
  close every stream and exit.

Reports are built and serialized before their boundary, so the client's own
work is off the measured path: at the boundary it only writes bytes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import signal
import sys
import threading
import time
from dataclasses import dataclass, field

import grpc

from dsched_pb import dsched_pb2 as pb

CONNECT_METHOD = "/dsched.v1.AgentService/Connect"
# Optional counters the reports carry (a real agent here also has throttling, which
# the synthetic cluster does not produce, so it is not claimed).
COUNTERS = ["psi", "net_bytes"]
# The synthetic cluster's operators that keep state.
STATEFUL_OPERATORS = frozenset({"count"})
CHANNEL_OPTIONS = [
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    # Every fake agent gets its own connection, as separate nodes would.
    ("grpc.use_local_subchannel_pool", 1),
]


def _serialize(msg: pb.AgentMessage | bytes) -> bytes:
    return msg if isinstance(msg, bytes) else msg.SerializeToString()


class Sink:
    """Stands in for the Controller the synthetic cluster feeds: keeps what it is given."""

    class _Qos:
        def __init__(self) -> None:
            self.classes: dict[str, str] = {}

        def set(self, app: str, qos_class: str, _now: float) -> None:
            self.classes[app] = qos_class

    def __init__(self) -> None:
        self.qos = self._Qos()
        self.reports: dict[str, pb.NodeReport] = {}

    def on_hello(self, hello: pb.Hello) -> pb.Welcome:
        return pb.Welcome()

    def on_report(self, report: pb.NodeReport) -> None:
        self.reports[report.node_id] = report


def synthetic_cluster(nodes: int, instances: int, apps: int, cores: float, slot: float, mine=None):
    """bench/controller_scale.py's synthetic cluster, fed into a :class:`Sink`.

    ``mine`` (node ids) keeps only those nodes' instances, so a client builds
    its own share of every slot. The generator writes 10-s slots; its rates are
    scaled so that the counters advance at the same per-second rates over ``slot``.
    """
    from bench.controller_scale import SyntheticCluster

    sink = Sink()
    cluster = SyntheticCluster(sink, nodes, instances, apps, cores)
    if mine is not None:
        import numpy as np

        cluster.rows = [r for r in cluster.rows if r[0] in mine]
        cluster.totals = np.zeros((len(cluster.rows), 4))
    cluster.rate = {a: r * slot / 10.0 for a, r in cluster.rate.items()}
    return cluster, sink


@dataclass
class Epoch:
    first_recv: float = math.inf
    last_recv: float = 0.0
    last_ack: float = 0.0
    agents: int = 0
    caps: int = 0
    applied: int = 0
    rejected: int = 0
    stale: int = 0


@dataclass
class FakeAgent:
    node: str
    cores: float
    keys: set = field(default_factory=set)  # (app, operator, instance) held here
    call: object = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    last_applied: int | None = None
    last_recv: float = 0.0
    broken: str = ""
    reader: asyncio.Task | None = None

    def hello(self) -> pb.AgentMessage:
        return pb.AgentMessage(
            hello=pb.Hello(
                node_id=self.node,
                cpu_capacity_cores=self.cores,
                cgroup_mode=pb.CGROUP_V1,
                counters_available=COUNTERS,
                agent_version="wire-scale",
                dry_run=False,
                slot_seconds=0.0,  # set by the client
            )
        )

    def ack(self, d: pb.CapDirective) -> pb.Ack:
        """What agent/directives.py answers, without touching cgroups."""
        ack = pb.Ack(epoch=d.epoch)
        if self.last_applied is not None and d.epoch < self.last_applied:
            ack.stale = True
            return ack
        for entry in d.caps:
            k = entry.key
            if (k.app, k.operator, k.instance) not in self.keys:
                reason = "unknown_instance"
            elif not math.isfinite(entry.cap_cores) or not 0 <= entry.cap_cores <= self.cores:
                reason = "cap_out_of_bounds"
            else:
                ack.applied += 1
                continue
            ack.rejected.append(pb.Rejection(key=entry.key, reason=reason))
        self.last_applied = d.epoch
        return ack

    async def write(self, msg) -> float:
        """Write one message; the wall time when it was handed to the transport."""
        async with self.lock:
            await self.call.write(msg)
        return time.time()


class Client:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.slot = args.slot_seconds
        lo, hi = (int(x) for x in args.nodes.split(":"))
        self.node_ids = [f"n{i}" for i in range(lo, hi)]
        mine = set(self.node_ids)
        self.cluster, self.sink = synthetic_cluster(
            args.total_nodes, args.instances, args.apps, args.cores, self.slot, mine
        )
        self.agents = {n: FakeAgent(n, args.cores) for n in self.node_ids}
        for node, app, op, i, *_ in self.cluster.rows:
            self.agents[node].keys.add((app, op, i))
        # Workers: one stateful (the counts keep state) and one stateless per app and node
        # (a worker lives on one node, so its name carries the node).
        self.stateful = STATEFUL_OPERATORS
        self.expected = [a for a in self.agents.values() if a.keys]
        self.epochs: dict[int, Epoch] = {}
        self.slots: list[dict] = []
        self.prev_cpu: dict[str, float] = {}
        self.channels: list[grpc.aio.Channel] = []

    # ------------------------------------------------------------ streams
    async def connect(self, agent: FakeAgent) -> None:
        channel = grpc.aio.insecure_channel(self.args.target, options=CHANNEL_OPTIONS)
        self.channels.append(channel)
        method = channel.stream_stream(
            CONNECT_METHOD,
            request_serializer=_serialize,
            response_deserializer=pb.ControllerMessage.FromString,
        )
        # The controller may still be starting: wait for it rather than fail.
        agent.call = method(wait_for_ready=True)
        hello = agent.hello()
        hello.hello.slot_seconds = self.slot
        await agent.call.write(hello)
        first = await agent.call.read()
        if first is grpc.aio.EOF or first.WhichOneof("body") != "welcome":
            raise RuntimeError(f"{agent.node}: no Welcome after the Hello")
        agent.last_applied = None
        agent.reader = asyncio.create_task(self.read(agent))

    async def read(self, agent: FakeAgent) -> None:
        try:
            while True:
                msg = await agent.call.read()
                if msg is grpc.aio.EOF:
                    agent.broken = "closed by the controller"
                    return
                if msg.WhichOneof("body") != "directive":
                    continue
                t_recv = time.time()
                d = msg.directive
                ack = agent.ack(d)
                t_ack = await agent.write(pb.AgentMessage(ack=ack))
                agent.last_recv = t_recv
                e = self.epochs.setdefault(d.epoch, Epoch())
                e.first_recv = min(e.first_recv, t_recv)
                e.last_recv = max(e.last_recv, t_recv)
                e.last_ack = max(e.last_ack, t_ack)
                e.agents += 1
                e.caps += len(d.caps)
                e.applied += ack.applied
                e.rejected += len(ack.rejected)
                e.stale += int(ack.stale)
        except asyncio.CancelledError:
            raise
        except grpc.aio.AioRpcError as exc:
            agent.broken = f"{exc.code().name}: {exc.details()}"
        except Exception as exc:  # a broken fake agent is reported, not fatal
            agent.broken = repr(exc)

    # ------------------------------------------------------------ reports
    def build(self, boundary: float) -> dict[str, bytes]:
        """Every agent's report for the slot ending at ``boundary``, serialized."""
        self.sink.reports.clear()
        self.cluster.report(boundary)
        out = {}
        for node, report in self.sink.reports.items():
            report.slot_seconds = self.slot
            cpu = 0.0
            for s in report.instances:
                s.stateful = s.key.operator in self.stateful
                s.worker = f"{s.key.app}-{node}-{'stateful' if s.stateful else 'stateless'}"
                cpu += s.cpu_seconds_total
            usage = (cpu - self.prev_cpu[node]) / self.slot if node in self.prev_cpu else 0.0
            self.prev_cpu[node] = cpu
            busy = min(usage, self.args.cores)
            report.node.CopyFrom(
                pb.NodeSample(
                    cpu_capacity_cores=self.args.cores,
                    cpu_usage_cores=busy,
                    cpu_pressure=pb.Pressure(
                        some_avg10=100.0 * busy / self.args.cores / 4,
                        some_avg60=100.0 * busy / self.args.cores / 4,
                    ),
                    interfaces=[
                        pb.InterfaceBytes(
                            name="eth0",
                            rx_bytes_total=int(self.cluster.slot * self.slot * 4e6),
                            tx_bytes_total=int(self.cluster.slot * self.slot * 3e6),
                        )
                    ],
                    memory_used_bytes=2e9,
                )
            )
            out[node] = pb.AgentMessage(report=report).SerializeToString()
        return out

    async def send_slot(self, k: int, boundary: float, msgs: dict[str, bytes]) -> None:
        delay = boundary - time.time()
        if delay > 0:
            await asyncio.sleep(delay)
        t_first = time.time()
        live = [a for a in self.expected if not a.broken and a.node in msgs]
        times = await asyncio.gather(*(a.write(msgs[a.node]) for a in live))
        self.slots.append(
            {
                "slot": k,
                "boundary": boundary,
                "first_send": t_first,
                "last_send": max(times, default=t_first),
                "reports": len(times),
            }
        )

    async def wait_directives(self, since: float, until: float) -> None:
        """Until every agent holding instances had a directive after ``since`` (or ``until``)."""
        while time.time() < until:
            if all(a.last_recv > since or a.broken for a in self.expected):
                return
            await asyncio.sleep(0.01)

    async def run(self, start: asyncio.Future) -> None:
        try:
            await asyncio.gather(*(self.connect(a) for a in self.agents.values()))
        except Exception as exc:
            emit({"error": f"connect failed: {exc!r}"})
            return
        emit({"ready": {"agents": len(self.agents), "with_instances": len(self.expected)}})
        b0, n = await start
        msgs = self.build(b0)
        for k in range(n):
            boundary = b0 + k * self.slot
            await self.send_slot(k, boundary, msgs)
            # The next slot's reports are built once this round is over (or late
            # in the slot), so building them never competes with the round.
            last = k == n - 1
            frac = 0.9 if last else self.args.build_at
            await self.wait_directives(self.slots[-1]["first_send"], boundary + frac * self.slot)
            if not last:
                msgs = self.build(boundary + self.slot)
        emit(
            {
                "done": {
                    "agents": len(self.agents),
                    "with_instances": len(self.expected),
                    "instances": sum(len(a.keys) for a in self.agents.values()),
                    "slots": self.slots,
                    "epochs": {str(e): vars(v) for e, v in sorted(self.epochs.items())},
                    "broken": {a.node: a.broken for a in self.agents.values() if a.broken},
                }
            }
        )

    async def close(self) -> None:
        for a in self.agents.values():
            if a.reader is not None:
                a.reader.cancel()
            if a.call is not None:
                a.call.cancel()
        await asyncio.gather(*(c.close() for c in self.channels), return_exceptions=True)


def emit(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj, default=_finite) + "\n")
    sys.stdout.flush()


def _finite(x):
    return None if isinstance(x, float) and not math.isfinite(x) else float(x)


def _stdin_commands(
    loop: asyncio.AbstractEventLoop, start: asyncio.Future, stop: asyncio.Event
) -> None:
    """``start`` gets (B0, slots); ``stop`` is set by a stop command or the end of input."""

    def started(b0: float, n: int) -> None:
        if not start.done():
            start.set_result((b0, n))

    for line in sys.stdin:
        try:
            cmd = json.loads(line)
        except ValueError:
            continue
        if isinstance(cmd, dict) and "start" in cmd:
            loop.call_soon_threadsafe(started, float(cmd["start"]), int(cmd["slots"]))
        elif isinstance(cmd, dict) and cmd.get("stop"):
            break
    else:
        print("wire client: end of input, stopping", file=sys.stderr, flush=True)
    try:
        loop.call_soon_threadsafe(stop.set)  # asked to stop, or the parent is gone
    except RuntimeError:
        pass


def _stop_on_signal(sig: int, stop: asyncio.Event) -> None:
    print(f"wire client: {signal.Signals(sig).name}, stopping", file=sys.stderr, flush=True)
    stop.set()


async def amain(args: argparse.Namespace) -> int:
    loop = asyncio.get_running_loop()
    start: asyncio.Future = loop.create_future()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, _stop_on_signal, sig, stop)
    threading.Thread(target=_stdin_commands, args=(loop, start, stop), daemon=True).start()
    client = Client(args)
    run = asyncio.create_task(client.run(start))
    stopped = asyncio.create_task(stop.wait())
    try:
        # After its run the client holds its streams until the parent says stop.
        await asyncio.wait({run, stopped}, return_when=asyncio.FIRST_COMPLETED)
        if run.done():
            run.result()
            await stopped
    finally:
        for task in (run, stopped):
            task.cancel()
        await asyncio.gather(run, stopped, return_exceptions=True)
        await client.close()
    return 0


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.wire_client")
    p.add_argument("--target", required=True, help="the controller's agent door HOST:PORT")
    p.add_argument("--nodes", required=True, help="node indices A:B this process holds")
    p.add_argument("--total-nodes", type=int, required=True)
    p.add_argument("--instances", type=int, required=True)
    p.add_argument("--apps", type=int, required=True)
    p.add_argument("--cores", type=float, default=4.0)
    p.add_argument("--slot-seconds", type=float, required=True)
    p.add_argument(
        "--build-at",
        type=float,
        default=0.6,
        help="latest point of a slot (fraction) to build the next reports",
    )
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    # The parent stops this process through stdin; SIGTERM or SIGINT close its
    # streams the same way.
    return asyncio.run(amain(args))


if __name__ == "__main__":
    sys.exit(main())
