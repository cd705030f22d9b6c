"""Seeded bad input for four doors (hypothesis, generation only, no shrinking:
each case is run once and its outcome counted, never re-run).

* ``reports``: NodeReports on a real gRPC stream to the running controller, as
  a node of its own; refusals are the controller's
  ``dsched_report_samples_rejected_total{reason}``.
* ``directives``: CapDirectives through the agent's own directive handling
  (:class:`agent.node.NodeAgent`, real cgroups below the pod, real threads);
  refusals are the reasons in each Ack.
* ``registration``: JSON lines (and lines that are not JSON) on a running
  agent's registration socket; refusals are the reasons in the replies.
* ``config``: agent and controller config files, loaded as the daemons load
  them; a refusal is a ConfigError naming a key.

A *crash* is an exception the code under test lets out (or a daemon that
stops answering); each one is kept with its case's repr (cut short) so it can
be replayed.
"""

from __future__ import annotations

import json
import math
import queue
import socket
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

from dsched_pb import dsched_pb2 as pb
from dsched_pb import dsched_pb2_grpc as pb_grpc

# Names fed to the daemons: valid ones from a small set (the controller keeps a
# model per instance; thousands of random valid names would measure its
# memory, not its checks), and the bad kinds the design names.
GOOD_NAMES = ["fz", "fz2", "a", "b", "count", "split", "w-1", "x.y"]
BAD_NAMES = ["", "/", "..", "../..", "a/b", "a\x00b", "../../../../tmp", ".", "x" * 300, " ", "é"]
NAMES = st.one_of(st.sampled_from(GOOD_NAMES), st.sampled_from(BAD_NAMES), st.text(max_size=12))
FLOATS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, -1.0, 1e-9, 0.05, 0.5, 1.0, 1e300, math.nan, math.inf, -math.inf]),
)
U64 = st.one_of(st.integers(0, 2**64 - 1), st.integers(0, 1000))
I32 = st.one_of(st.integers(-(2**31), 2**31 - 1), st.integers(-2, 8))
I64 = st.integers(-(2**63), 2**63 - 1)


@dataclass
class FuzzResult:
    cases: int = 0
    crashes: int = 0
    accepted: int = 0
    received: int | None = None  # reports only: how many reached the controller
    refused: Counter = field(default_factory=Counter)
    crash_examples: list[str] = field(default_factory=list)

    def crash(self, case: Any, exc: BaseException | str) -> None:
        self.crashes += 1
        if len(self.crash_examples) < 10:
            self.crash_examples.append(f"{exc!r} on {case!r}"[:500])

    def to_dict(self) -> dict[str, Any]:
        return {
            "cases": self.cases,
            "crashes": self.crashes,
            "accepted": self.accepted,
            **({} if self.received is None else {"received": self.received}),
            "refused": dict(sorted(self.refused.items())),
            "refused_total": sum(self.refused.values()),
            "crash_examples": self.crash_examples,
        }


def _run(strategy: st.SearchStrategy, n: int, rng_seed: int, case) -> None:
    """Draw ``n`` examples of ``strategy`` (seeded) and call ``case`` on each."""

    @seed(rng_seed)
    @settings(
        max_examples=n,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(strategy)
    def each(example: Any) -> None:
        case(example)

    each()


# ------------------------------------------------------------ reports
def _samples() -> st.SearchStrategy:
    key = st.builds(pb.InstanceKey, app=NAMES, operator=NAMES, instance=I32)
    return st.builds(
        pb.InstanceSample,
        key=key,
        worker=NAMES,
        stateful=st.booleans(),
        pid=I32,
        cpu_seconds_total=FLOATS,
        cpu_usage_cores=FLOATS,
        received_total=U64,
        executed_total=U64,
        emitted_total=U64,
        queue_length=I64,
        latency_sum_seconds_total=FLOATS,
        latency_count_total=U64,
        cap_cores=FLOATS,
        service_seconds_total=FLOATS,
        upstream=st.lists(NAMES, max_size=2),
    )


def report_strategy(node: str) -> st.SearchStrategy:
    now = time.time()
    return st.builds(
        pb.NodeReport,
        # Mostly the stream's own node: a report naming another is refused whole.
        node_id=st.one_of(st.just(node), st.just(node), st.just(node), NAMES),
        slot=U64,
        timestamp=st.one_of(FLOATS, st.floats(now - 100, now + 100)),
        slot_seconds=FLOATS,
        instances=st.lists(_samples(), max_size=3),
        node=st.builds(
            pb.NodeSample,
            cpu_capacity_cores=FLOATS,
            cpu_usage_cores=FLOATS,
            other_cpu_cores=FLOATS,
        ),
        replayed=st.booleans(),
    )


class _Stream:
    """One agent stream to the controller, as node ``node``."""

    def __init__(self, target: str, node: str):
        self.channel = grpc.insecure_channel(target)
        self.out: queue.Queue[pb.AgentMessage | None] = queue.Queue(maxsize=256)
        self.out.put(
            pb.AgentMessage(
                hello=pb.Hello(
                    node_id=node,
                    cpu_capacity_cores=1.0,
                    cgroup_mode=pb.CGROUP_V1,
                    agent_version="fuzz",
                    slot_seconds=1.0,
                )
            )
        )
        self.error: grpc.RpcError | None = None
        self.welcomed = threading.Event()
        stub = pb_grpc.AgentServiceStub(self.channel)
        self.responses = stub.Connect(iter(self.out.get, None))
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        try:
            for msg in self.responses:
                if msg.HasField("welcome"):
                    self.welcomed.set()
                # Directives for the fuzz node's instances are read and dropped.
        except grpc.RpcError as exc:
            self.error = exc
        self.welcomed.set()

    def send(self, report: pb.NodeReport) -> bool:
        if self.error is not None:
            return False
        self.out.put(pb.AgentMessage(report=report), timeout=30)
        return True

    def close(self) -> None:
        self.out.put(None)
        self.reader.join(10)
        self.channel.close()


def fuzz_reports(
    target: str,
    n: int,
    rng_seed: int,
    controller_alive,
    controller_rejections,
    node: str = "fuzz-node",
) -> FuzzResult:
    """``controller_rejections()``: the controller's refusal counters by reason
    (read before and after); ``controller_alive()``: it still answers."""
    result = FuzzResult()
    before = controller_rejections()
    stream = _Stream(target, node)
    stream.welcomed.wait(30)
    streams_broken: Counter = Counter()

    def case(report: pb.NodeReport) -> None:
        nonlocal stream
        result.cases += 1
        if not stream.send(report):
            code = stream.error.code().name.lower() if stream.error else "unknown"
            streams_broken[code] += 1
            stream.close()
            stream = _Stream(target, node)
            stream.welcomed.wait(30)
            stream.send(report)

    try:
        _run(report_strategy(node), n, rng_seed, case)
    finally:
        # Everything sent is read before the counters are: a last report with
        # a fresh slot, then a short wait for the controller to ingest it.
        time.sleep(1.0)
        stream.close()
    if not controller_alive():
        result.crash("controller", "the controller stopped answering")
    after = controller_rejections()
    # Reports that reached the controller; its refusals count report parts
    # (a sample, or a whole report), so they need not add up to the cases.
    result.received = int(after.pop("_received", 0) - before.pop("_received", 0))
    for reason, v in after.items():
        d = v - before.get(reason, 0)
        if d > 0:
            result.refused[reason] += int(d)
    for code, k in streams_broken.items():
        result.refused[f"stream_closed_{code}"] += k
    return result


# ------------------------------------------------------------ directives
def directive_strategy(keys: list[tuple[str, str, int]]) -> st.SearchStrategy:
    known = st.sampled_from(keys).map(
        lambda k: pb.InstanceKey(app=k[0], operator=k[1], instance=k[2])
    )
    anykey = st.one_of(known, st.builds(pb.InstanceKey, app=NAMES, operator=NAMES, instance=I32))
    cap = st.builds(pb.InstanceCap, key=anykey, cap_cores=FLOATS)
    # The epoch is drawn apart (see fuzz_directives): "next" or a fraction of it.
    epoch = st.one_of(st.just(-1.0), st.just(-1.0), st.just(-1.0), st.floats(0, 1))
    return st.tuples(
        epoch,
        st.builds(
            pb.CapDirective,
            caps=st.lists(cap, max_size=4),
            reason=st.text(max_size=8),
            release=st.lists(anykey, max_size=2),
        ),
    )


def fuzz_directives(
    node_agent, keys: list[tuple[str, str, int]], n: int, rng_seed: int
) -> FuzzResult:
    """Fuzzed directives through ``node_agent.handle_directive``; after each one,
    every cap the agent holds must be in (0, its node cores] (else counted as a
    crash: a cap out of bounds got through)."""
    result = FuzzResult()
    capacity = node_agent.capacity_cores
    # Epochs move forward as a controller's do, with old ones (stale) and repeats
    # mixed in; an epoch drawn from all of uint64 would make every later
    # directive stale after the first large one and test nothing else. The
    # largest epoch comes once, at the end.
    last = [0]

    def case(drawn: tuple[float, pb.CapDirective]) -> None:
        fraction, d = drawn
        if fraction < 0:
            last[0] += 1
            d.epoch = last[0]
        else:
            d.epoch = int(last[0] * fraction)
        result.cases += 1
        try:
            ack = node_agent.handle_directive(d)
        except Exception as exc:
            result.crash(d, exc)
            return
        if ack.stale:
            result.refused["stale_epoch"] += 1
        for r in ack.rejected:
            result.refused[r.reason.split(":", 1)[0]] += 1
        result.accepted += ack.applied
        for key, cap in node_agent.caps.items():
            if cap is not None and not 0 < cap <= capacity:
                result.crash(d, f"cap {cap!r} of {key} out of bounds")

    _run(directive_strategy(keys), max(0, n - 1), rng_seed, case)
    if n > 0:
        last[0] = 2**64 - 2
        case(
            (
                -1.0,
                pb.CapDirective(
                    caps=[
                        pb.InstanceCap(
                            key=pb.InstanceKey(
                                app=keys[0][0], operator=keys[0][1], instance=keys[0][2]
                            ),
                            cap_cores=0.5,
                        )
                    ]
                ),
            )
        )
    return result


# ------------------------------------------------------------ registration socket
def registration_strategy(pids: list[int], avoid_app: str) -> st.SearchStrategy:
    pid = st.one_of(
        st.sampled_from(pids),
        st.sampled_from([0, -1, 2**22 + 5, 2**40]),
        st.text(max_size=3),
        st.none(),
        st.floats(),
        st.booleans(),
    )
    scalar = st.one_of(
        st.none(), st.booleans(), st.integers(), FLOATS.filter(math.isfinite), st.text(max_size=10)
    )
    counter = st.one_of(
        st.integers(-5, 10**6), FLOATS.filter(math.isfinite), st.text(max_size=3), st.none()
    )
    counters = st.dictionaries(
        st.sampled_from(
            [
                "received",
                "executed",
                "emitted",
                "queue_length",
                "latency_sum_seconds",
                "latency_count",
                "service_seconds",
                "bogus",
            ]
        ),
        counter,
        max_size=4,
    )
    name = NAMES.filter(lambda x: x != avoid_app)
    body = st.fixed_dictionaries(
        {"app": name, "operator": name, "instance": st.one_of(I32, scalar)},
        optional={
            "worker": name,
            "stateful": scalar,
            "pid": pid,
            "tid": pid,
        },
    )
    op = st.sampled_from(["register", "update", "unregister", "updates", "hello", "", None, 3])

    def message(parts: tuple) -> Any:
        o, b, c, items = parts
        msg = {"op": o, **b, **c}
        if o == "updates":
            msg = {"op": "updates", "items": items}
        return msg

    items = st.one_of(
        st.lists(st.builds(lambda b, c: {**b, **c}, body, counters), max_size=3),
        scalar,
    )
    msgs = st.tuples(op, body, counters, items).map(message)
    raw = st.one_of(
        msgs.map(lambda m: json.dumps(m).encode()),
        st.binary(max_size=64).filter(lambda b: b"\n" not in b),
        st.recursive(
            scalar,
            lambda x: st.lists(x, max_size=3) | st.dictionaries(st.text(max_size=4), x, max_size=3),
            max_leaves=6,
        ).map(lambda v: json.dumps(v).encode()),
        st.just(b"x" * (70 * 1024)),
    )
    return raw


class _Line:
    def __init__(self, path: Path):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(10)
        self.sock.connect(str(path))
        self.file = self.sock.makefile("rb")

    def ask(self, line: bytes) -> dict | None:
        self.sock.sendall(line + b"\n")
        reply = self.file.readline()
        return json.loads(reply) if reply else None

    def close(self) -> None:
        self.file.close()
        self.sock.close()


def fuzz_registration(
    socket_path: Path, n: int, rng_seed: int, pids: list[int], avoid_app: str, agent_alive
) -> FuzzResult:
    """Lines on a running agent's socket; each reply's reason is counted (an
    ``updates`` batch: each refused item's reason)."""
    result = FuzzResult()
    conn = _Line(socket_path)

    def case(line: bytes) -> None:
        nonlocal conn
        result.cases += 1
        try:
            reply = conn.ask(line)
        except OSError:
            # The agent closed this connection after its last reply (a line over
            # its limit ends the connection): a new one, and the line again.
            conn.close()
            conn = _Line(socket_path)
            try:
                reply = conn.ask(line)
            except (OSError, ValueError) as exc:
                result.crash(line[:200], exc)
                reply = None
        except ValueError as exc:
            result.crash(line[:200], exc)
            reply = None
        if reply is None:
            # The agent closed the connection (a line over its limit does that).
            result.refused["connection_closed"] += 1
            conn.close()
            conn = _Line(socket_path)
            return
        if reply.get("ok"):
            result.accepted += 1
            return
        rejected = reply.get("rejected")
        if isinstance(rejected, list) and rejected:
            for r in rejected:
                result.refused[r.get("reason", "no_reason")] += 1
        else:
            result.refused[reply.get("reason") or "no_reason"] += 1

    try:
        _run(registration_strategy(pids, avoid_app), n, rng_seed, case)
    finally:
        conn.close()
    if not agent_alive():
        result.crash("agent", "the agent stopped answering")
    return result


# ------------------------------------------------------------ config files
def _toml(v: Any) -> str:
    from testbed.live.cluster import _toml_value

    return _toml_value(v)


def config_strategy(keys: list[str]) -> st.SearchStrategy:
    value = st.one_of(
        st.booleans(),
        st.integers(-(2**63), 2**63 - 1),
        FLOATS,
        st.text(max_size=20),
        st.sampled_from(
            [
                "",
                "auto",
                "v1",
                "hold",
                "release",
                "enforce",
                "dry-run",
                "127.0.0.1:7700",
                "0.0.0.0:1",
                "[::1]:0",
                "x:y",
                "0777",
                "0660",
                "/",
            ]
        ),
        st.lists(st.text(max_size=5), max_size=3),
        st.dictionaries(
            st.text("abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=5),
            st.integers(),
            max_size=2,
        ),
    )
    structured = st.dictionaries(st.sampled_from(keys + ["bogus_key"]), value, max_size=5).map(
        lambda d: "\n".join(f"{json.dumps(k)} = {_toml(v)}" for k, v in d.items()) + "\n"
    )
    garbage = st.one_of(
        st.text(max_size=60), st.binary(max_size=60).map(lambda b: b.decode("latin-1"))
    )
    return st.one_of(structured, structured, garbage)


def fuzz_config(kind: str, directory: Path, n: int, rng_seed: int) -> FuzzResult:
    """``kind``: "agent" or "controller"; each case is a file loaded with the
    daemon's own ``load`` (a ConfigError is the daemon's exit 2)."""
    import dataclasses

    from dsched.config import ConfigError

    if kind == "agent":
        from agent import daemon as mod
        from agent.config import AgentConfig as cls
    else:
        from controller import daemon as mod
        from controller.config import ControllerConfig as cls
    keys = [f.name for f in dataclasses.fields(cls)]
    parse = mod.build_parser().parse_args if kind == "agent" else mod.parse_args
    result = FuzzResult()
    path = directory / f"fuzz-{kind}.toml"

    def case(text: str) -> None:
        result.cases += 1
        try:
            path.write_text(text, encoding="utf-8", errors="surrogateescape")
        except (UnicodeError, ValueError):
            path.write_bytes(text.encode("utf-8", "replace"))
        args = parse(["--config", str(path)])
        try:
            mod.load(args)
        except ConfigError as exc:
            result.refused[f"config_error:{exc.key.split('.')[0].split('[')[0]}"] += 1
        except Exception as exc:
            result.crash(text, exc)
        else:
            result.accepted += 1

    _run(config_strategy(keys), n, rng_seed, case)
    path.unlink(missing_ok=True)
    return result


def split_cases(total: int, parts: list[str]) -> dict[str, int]:
    base, extra = divmod(total, len(parts))
    return {p: base + (1 if k < extra else 0) for k, p in enumerate(parts)}
