"""gRPC transport for the controller: the agents' door and the admin door.

A thin edge around :class:`controller.core.Controller`, on ``grpc.aio`` in a
thread and event loop of its own, so a thousand idle agent streams cost a
coroutine each, not a thread each. The core is synchronous and an epoch holds
its lock for up to about a second; every core call therefore runs in a small
executor, never on the event loop, which keeps serving streams, admin calls
and health checks while an epoch runs:

* agent lifecycle and reports go through one worker, in arrival order (a
  stream's disconnect is handled before the same node's next Hello); a report
  is handed over without waiting for it to be taken in, unless the stream's
  previous report still waits (then the stream waits for it);
* admin calls have workers of their own, so they never queue behind reports.

Directives come from the epoch thread and reach a stream through
``loop.call_soon_threadsafe`` into a bounded per-stream queue where the newest
supersedes the oldest.

Two listeners (docs/controller.md, "The doors"):

* the agents' door (``listen``): AgentService and health. Off loopback it needs
  mutual TLS (checked by ControllerConfig.validate); with a client CA, an
  agent's Hello must name a node its certificate carries (CN or a subject
  alternative name).
* the admin door (``admin_listen``): AdminService and health, on a Unix
  socket guarded by its file mode, or on HOST:PORT with mutual TLS against the
  admin clients' CA. Admin RPCs are never served on the agents' port.

One session per node: a second stream for a connected node is refused
(ALREADY_EXISTS), unless it shows the same client certificate as the first
(the agent reconnected while its old stream is half dead: the new stream
replaces the old one), or the old stream ends within a short grace.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import math
import os
import socket
import stat
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from concurrent import futures
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer

from controller.config import ControllerConfig, socket_group_id, unix_socket_path
from controller.core import MODE_TO_PB, PB_TO_MODE, Controller
from controller.edges.cluster import HelloRefused
from controller.record import explain_lines, record_json
from controller.shadow_report import (
    DEFAULT_SINCE_SECONDS,
    MAX_REPORT_EPOCHS,
    MAX_SINCE_SECONDS,
    ShadowReportBuilder,
    report_json,
)
from dsched.config import is_loopback, parse_hostport
from dsched.names import InvalidName, check_name
from dsched.tls import TlsConfig
from dsched_pb import dsched_pb2 as pb
from dsched_pb import dsched_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

T = TypeVar("T")

# Directives are idempotent: when an agent stops reading, newer ones replace
# the backlog instead of growing it without bound. A constant, not a setting:
# only the newest directive matters, so a deeper queue would buy nothing.
OUTBOUND_QUEUE = 8
# An agent that opens a stream must say Hello within this time, or its slot is freed.
HELLO_TIMEOUT_SECONDS = 30.0
# A node's old stream that is ending (its agent reconnected) may take a moment
# to be noticed; a second session waits this long for it before being refused.
DUPLICATE_GRACE_SECONDS = 2.0
# How long a stream refused for the stream limit may take to send its Hello.
REFUSAL_READ_SECONDS = 5.0
# Explain reads at most this many decision records.
MAX_EXPLAIN_EPOCHS = 1000
DEFAULT_EXPLAIN_EPOCHS = 10
# The same refusal of the same node is logged at most once per this period
# (a refused agent retries every few hundred ms).
REFUSAL_LOG_SECONDS = 60.0

AGENT_SERVICE = "dsched.v1.AgentService"
ADMIN_SERVICE = "dsched.v1.AdminService"

_SERVER_OPTIONS = [
    # Agents keep their idle stream alive with pings every 10 s; on default
    # settings the server answers a few minutes of that with GOAWAY
    # "too_many_pings" and every agent loses its stream.
    ("grpc.http2.min_recv_ping_interval_without_data_ms", 5000),
    ("grpc.keepalive_permit_without_calls", 1),
    # The server pings too, so the stream of an agent that vanished (power
    # loss, partition) ends within ~40 s and its node can connect again.
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
]


@dataclass(frozen=True)
class PeerIdentity:
    """What a client certificate says (mutual TLS only)."""

    names: frozenset[str]  # CN and subject alternative names
    fingerprint: str  # SHA-256 of the certificate's PEM


def peer_identity(context: grpc.aio.ServicerContext) -> PeerIdentity | None:
    """The peer's client certificate identity, or None without one."""
    auth = context.auth_context() or {}
    pem = auth.get("x509_pem_cert") or []
    if not pem:
        return None
    names = {
        v.decode(errors="replace")
        for k in ("x509_common_name", "x509_subject_alternative_name")
        for v in auth.get(k, [])
    }
    return PeerIdentity(frozenset(names), hashlib.sha256(pem[0]).hexdigest())


@dataclass(eq=False)
class _AgentStream:
    """One agent's open stream: its identity and its bounded outbound queue."""

    node: str
    identity: PeerIdentity | None
    loop: asyncio.AbstractEventLoop
    outbound: deque = field(default_factory=lambda: deque(maxlen=OUTBOUND_QUEUE))
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    closed: asyncio.Event = field(default_factory=asyncio.Event)
    ending: bool = False

    def push(self, msg: pb.ControllerMessage) -> None:
        """On the loop: queue ``msg`` (a full queue drops its oldest: the newest supersedes)."""
        self.outbound.append(msg)
        self.wake.set()

    def end(self) -> None:
        """On the loop: finish the stream after what is queued."""
        self.ending = True
        self.wake.set()

    def send(self, msg: pb.ControllerMessage) -> None:
        """From any thread (the epoch's): hand ``msg`` to the loop. On the loop
        (a batch of directives delivered there): queue it now."""
        try:
            on_loop = asyncio.get_running_loop() is self.loop
        except RuntimeError:  # no loop runs in this thread
            on_loop = False
        if on_loop:
            self.push(msg)
            return
        try:
            self.loop.call_soon_threadsafe(self.push, msg)
        except RuntimeError:
            pass  # the loop is closed: the server stopped, the stream with it


class _Refused(Exception):
    def __init__(self, reason: str, code: grpc.StatusCode, message: str):
        super().__init__(message)
        self.reason, self.code, self.message = reason, code, message


class AgentServicer(pb_grpc.AgentServiceServicer):
    def __init__(self, server: ControllerServer):
        self.server = server
        self.controller = server.controller
        self.streams: dict[str, _AgentStream] = {}
        self.open = 0
        self._logged: dict[tuple[str, str], float] = {}

    def _log_refusal(self, reason: str, node: str, peer: str, message: str) -> None:
        now = time.monotonic()
        key = (reason, node)
        if now - self._logged.get(key, -REFUSAL_LOG_SECONDS) >= REFUSAL_LOG_SECONDS:
            self._logged[key] = now
            if len(self._logged) > 10_000:  # bounded under a flood of made-up node ids
                self._logged.clear()
            log.warning("agent stream from %s refused (%s): %s", peer, reason, message)

    async def _refuse(
        self, context: grpc.aio.ServicerContext, node: str, refused: _Refused
    ) -> None:
        self.controller.metrics.agent_refusals.labels(refused.reason).inc()
        self._log_refusal(refused.reason, node, context.peer(), refused.message)
        await context.abort(refused.code, refused.message)

    async def Connect(  # noqa: N802 (gRPC naming)
        self, request_iterator: AsyncIterator[pb.AgentMessage], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ControllerMessage]:
        limit = self.server.config.max_agent_streams
        if self.open >= limit:
            # Take the Hello off the wire first (briefly, and outside the
            # limit): a status sent while the client is still writing it can
            # reach the client as a failed write (INTERNAL), not as the reason.
            node = ""
            try:
                first = await asyncio.wait_for(anext(request_iterator), REFUSAL_READ_SECONDS)
                node = first.hello.node_id
            except Exception:  # noqa: BLE001 - refused either way
                pass
            await self._refuse(
                context,
                node,
                _Refused(
                    "too_many_streams",
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"the controller serves at most {limit} agent streams "
                    "(max_agent_streams); this one is refused",
                ),
            )
        self.open += 1
        self.controller.metrics.agent_streams.set(self.open)
        try:
            async for msg in self._session(request_iterator, context):
                yield msg
        finally:
            self.open -= 1
            self.controller.metrics.agent_streams.set(self.open)

    async def _hello(
        self, request_iterator: AsyncIterator[pb.AgentMessage], context: grpc.aio.ServicerContext
    ) -> pb.Hello | None:
        try:
            first = await asyncio.wait_for(anext(request_iterator), HELLO_TIMEOUT_SECONDS)
        except StopAsyncIteration:
            return None
        except TimeoutError:
            raise _Refused(
                "no_hello",
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"no Hello within {HELLO_TIMEOUT_SECONDS:.0f} s",
            ) from None
        if not first.HasField("hello"):
            raise _Refused(
                "no_hello", grpc.StatusCode.INVALID_ARGUMENT, "the first message must be a Hello"
            )
        return first.hello

    async def _claim(self, node: str, identity: PeerIdentity | None) -> _AgentStream:
        """Reserve ``node``'s session for a new stream, or refuse (the rule in the module doc)."""
        deadline = time.monotonic() + DUPLICATE_GRACE_SECONDS
        while (old := self.streams.get(node)) is not None:
            if identity is not None and old.identity == identity:
                log.info(
                    "agent %s reconnected with the same certificate; old stream replaced", node
                )
                old.end()
                break
            left = deadline - time.monotonic()
            if left <= 0:
                raise _Refused(
                    "duplicate_session",
                    grpc.StatusCode.ALREADY_EXISTS,
                    f"node {node} already has a connected session"
                    + ("" if identity is None else " opened with another certificate"),
                )
            try:
                await asyncio.wait_for(old.closed.wait(), left)
            except TimeoutError:
                pass
        stream = _AgentStream(node, identity, asyncio.get_running_loop())
        self.streams[node] = stream
        return stream

    async def _session(
        self, request_iterator: AsyncIterator[pb.AgentMessage], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ControllerMessage]:
        node = ""
        try:
            hello = await self._hello(request_iterator, context)
            if hello is None:
                return
            try:
                # Checked before the name reaches logs or the session table.
                node = check_name("node_id", hello.node_id)
            except InvalidName as exc:
                raise _Refused("bad_hello", grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from None
            identity = peer_identity(context)
            if self.server.verifies_agents:
                if identity is None or node not in identity.names:
                    shown = ", ".join(sorted(identity.names)) if identity else "none"
                    raise _Refused(
                        "node_id_mismatch",
                        grpc.StatusCode.PERMISSION_DENIED,
                        f"node id {node!r} is not in the client certificate (names: {shown})",
                    )
            else:
                identity = None  # only a verified certificate may replace a session
            stream = await self._claim(node, identity)
        except _Refused as refused:
            await self._refuse(context, node, refused)
            return
        # From the moment the Hello goes to the core, the node's disconnect must
        # follow it, even when this stream is cancelled while the Hello waits.
        hello_sent = False
        reader: asyncio.Task | None = None
        # One bound method: sessions.detach compares senders by identity.
        sender = stream.send
        try:
            hello_sent = True
            try:
                welcome = await self.server.agent_call(self.controller.on_hello, hello)
            except HelloRefused as exc:
                hello_sent = False
                raise _Refused(
                    exc.reason, grpc.StatusCode.INVALID_ARGUMENT, f"hello refused: {exc}"
                ) from None
            except ValueError as exc:
                hello_sent = False
                raise _Refused(
                    "bad_hello", grpc.StatusCode.INVALID_ARGUMENT, f"hello refused: {exc}"
                ) from None
            self.controller.sessions.attach(node, sender)
            reader = asyncio.create_task(self._read(request_iterator, stream))
            yield pb.ControllerMessage(welcome=welcome)
            while True:
                while stream.outbound:
                    yield stream.outbound.popleft()
                if stream.ending:
                    break
                stream.wake.clear()
                await stream.wake.wait()
        except _Refused as refused:
            await self._refuse(context, node, refused)
        finally:
            if reader is not None:
                reader.cancel()
            self.controller.sessions.detach(node, sender)
            if self.streams.get(node) is stream:
                del self.streams[node]
                # Its Ack will not come (a stream that replaced this one answers itself).
                self.controller.acks.gone(node)
                if hello_sent:
                    # Queued behind this stream's reports; a later Hello of the
                    # same node is queued behind it.
                    self.server.agent_call_later(self.controller.on_disconnect, node)
            stream.closed.set()

    async def _read(
        self, request_iterator: AsyncIterator[pb.AgentMessage], stream: _AgentStream
    ) -> None:
        node = stream.node
        # The stream's last report handed to the core, not yet taken in.
        queued: futures.Future | None = None
        try:
            async for msg in request_iterator:
                kind = msg.WhichOneof("body")
                if kind == "report":
                    if msg.report.node_id != node:
                        # A stream speaks for the node its Hello (and certificate) named.
                        self.controller.metrics.rejected.labels("wrong_node").inc()
                        self._log_refusal(
                            "wrong_node",
                            node,
                            node,
                            f"report for node {msg.report.node_id} on {node}'s stream ignored",
                        )
                        continue
                    if queued is not None and not queued.done():
                        # An agent reports once a slot: a report still queued means
                        # this one sends faster than the core takes them in, and
                        # the stream waits (no queue grows without bound).
                        await asyncio.wrap_future(queued)
                    # Not awaited: a thousand reports in a burst would each cost
                    # the loop a wake-up from the worker thread when taken in.
                    queued = self.server.agent_submit(self.controller.on_report, msg.report)
                    if queued is None:
                        return  # the server is stopping
                elif kind == "ack":
                    # On the loop: a set operation under a lock of its own.
                    self.controller.acks.acked(node, msg.ack.epoch)
                    if msg.ack.rejected:
                        await self.server.agent_call(self.controller.on_ack, node, msg.ack)
                    # An ack that refused nothing has nothing for the core: a
                    # thousand of them per epoch are not worth a thread hop each.
        except asyncio.CancelledError:
            raise
        except grpc.RpcError:
            pass
        except Exception:
            log.exception("agent %s: stream handler failed", node)
        finally:
            stream.end()


class AdminServicer(pb_grpc.AdminServiceServicer):
    """The admin door's RPCs; each core call runs on the admin workers."""

    def __init__(self, server: ControllerServer):
        self.server = server
        self.controller = server.controller
        # The last decision record and its reply: at thousands of instances the
        # record's JSON takes a tenth of a second to encode, and a dashboard or
        # script polling the plan would otherwise pay that on every call.
        self._plan: tuple[dict | None, pb.PlanReply | None] = (None, None)

    def _plan_reply(self, rec: dict) -> pb.PlanReply:
        cached_rec, reply = self._plan
        if cached_rec is not rec or reply is None:
            reply = plan_reply(rec)
            self._plan = (rec, reply)
        return reply

    async def Status(self, request, context):  # noqa: N802
        return await self.server.admin_call(self.controller.status)

    async def SetMode(self, request, context):  # noqa: N802
        if request.mode not in PB_TO_MODE:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "mode must be DRY_RUN or ENFORCE")
        previous = await self.server.admin_call(self.controller.set_mode, PB_TO_MODE[request.mode])
        return pb.SetModeReply(mode=request.mode, previous=MODE_TO_PB[previous])

    async def GetPlan(self, request, context):  # noqa: N802
        rec = self.controller.last_record
        if rec is None:
            return pb.PlanReply(mode=MODE_TO_PB[self.controller.mode])
        return await self.server.admin_call(self._plan_reply, rec)

    async def SetQos(self, request, context):  # noqa: N802
        try:
            known = await self.server.admin_call(
                self.controller.set_qos, request.app, request.qos_class
            )
        except ValueError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        return pb.SetQosReply(app=request.app, qos_class=request.qos_class, app_known=known)

    async def ListQos(self, request, context):  # noqa: N802
        return await self.server.admin_call(self._list_qos)

    def _list_qos(self) -> pb.ListQosReply:
        qos = self.controller.qos
        return pb.ListQosReply(
            assignments=[
                pb.QosAssignment(
                    app=a.app, qos_class=a.qos_class, app_known=a.app_known, defaulted=a.defaulted
                )
                for a in self.controller.list_qos()
            ],
            classes=[
                pb.QosClass(
                    name=c.name,
                    target_latency_ms=c.target_latency_ms,
                    max_violation_ratio=c.max_violation_ratio,
                    weight=c.weight,
                )
                for c in qos.classes.values()
            ],
            default_class=qos.default_class,
        )

    async def Explain(self, request, context):  # noqa: N802
        try:
            check_name("app", request.app)
        except InvalidName as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        epochs = request.epochs or DEFAULT_EXPLAIN_EPOCHS
        if not 1 <= epochs <= MAX_EXPLAIN_EPOCHS:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"epochs must be within 1..{MAX_EXPLAIN_EPOCHS}, got {epochs}",
            )
        return await self.server.admin_call(self._explain, request.app, epochs)

    def _explain(self, app: str, epochs: int) -> pb.ExplainReply:
        records = self.controller.explain(app, epochs)
        mine = [
            r
            for r in records
            if any(a["app"] == app for a in (*r.get("apps", []), *r.get("held", [])))
        ]
        return pb.ExplainReply(
            app=app,
            lines=explain_lines(app, records),
            records_json=json.dumps([_app_view(r, app) for r in mine], default=float),
        )

    async def Report(self, request, context):  # noqa: N802
        since = request.since_seconds or DEFAULT_SINCE_SECONDS
        if not (math.isfinite(since) and 0 < since <= MAX_SINCE_SECONDS):
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"since_seconds must be within (0, {MAX_SINCE_SECONDS:.0f}], got {since}",
            )
        limit = request.max_epochs or MAX_REPORT_EPOCHS
        if not 1 <= limit <= MAX_REPORT_EPOCHS:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"max_epochs must be within 1..{MAX_REPORT_EPOCHS}, got {limit}",
            )
        return await self.server.admin_call(self._report, since, limit)

    def _report(self, since: float, limit: int) -> pb.ReportReply:
        """Streams the window through the report, one record decoded at a time."""
        store, start = self.controller.store, self.controller.clock() - since
        builder = ShadowReportBuilder(since, self.controller.config.phi)
        # More records in the window than one report reads: the oldest of one
        # more is not the oldest read.
        before = next(store.decisions_since(start, limit + 1), None)
        oldest = None
        for rec in store.decisions_since(start, limit):
            if oldest is None:
                oldest = rec["epoch"]
            builder.add(rec)
        truncated = before is not None and before["epoch"] != oldest
        return pb.ReportReply(report_json=report_json(builder.result(truncated)))


def _app_view(rec: dict, app: str) -> dict:
    """The parts of a decision record that concern one application."""
    return {
        "epoch": rec["epoch"],
        "timestamp": rec["timestamp"],
        "mode": rec["mode"],
        "app": next((a for a in rec["apps"] if a["app"] == app), None),
        "operators": [o for o in rec["operators"] if o["app"] == app],
        "instances": [i for i in rec["instances"] if i["app"] == app],
        "cuts": [c for c in rec.get("cuts", []) if c["app"] == app],
        "held": [h for h in rec.get("held", []) if h["app"] == app],
        "dp": rec.get("dp"),
        "node_recommendation": rec.get("node_recommendation"),
    }


def plan_reply(rec: dict) -> pb.PlanReply:
    ops = [
        pb.OperatorPlan(
            app=o["app"],
            operator=o["operator"],
            instances=o["instances"],
            arrival_rate=o["arrival_rate"],
            predicted_rate=o["predicted_rate"],
            predictor=o["predictor"],
            cost_cpu_seconds_per_tuple=o["kappa"],
            demand_cores=o["demand_cores"],
            cap_cores=o["cap_cores"],
            usage_cores=o["usage_cores"],
            queue_length=int(o["queue"]),
            latency_ms=o["latency_ms"] if o["latency_ms"] is not None else -1.0,
            reason=o["reason"],
        )
        for o in rec.get("operators", [])
    ]
    caps = [
        pb.InstanceCap(
            key=pb.InstanceKey(app=i["app"], operator=i["operator"], instance=i["instance"]),
            cap_cores=i["cap_cores"],
        )
        for i in (*rec.get("instances", []), *rec.get("held", []))
        if i["cap_cores"] is not None
    ]
    return pb.PlanReply(
        epoch=rec["epoch"],
        mode=MODE_TO_PB[rec["mode"]],
        timestamp=rec["timestamp"],
        operators=ops,
        caps=caps,
        record_json=record_json(rec),
    )


class ControllerServer:
    """Both doors on one event loop in a thread of their own.

    ``port``: the agents' bound port. ``admin_address``: where dschedctl
    connects (``unix:PATH`` or ``HOST:PORT`` with the bound port).
    """

    def __init__(
        self,
        controller: Controller,
        listen: str | None = None,
        admin_listen: str | None = None,
    ):
        self.controller = controller
        self.config: ControllerConfig = controller.config
        self.listen = listen or self.config.listen
        self.admin_listen = admin_listen or self.config.admin_listen
        tls = self.config.tls
        # Hellos are checked against client certificates only when the door
        # demands them: cert, key and the agents' CA.
        self.verifies_agents = not tls.missing()
        self.port = 0
        self.admin_address = ""
        self.admin_port: int | None = None
        self._socket_path: Path | None = None
        self._socket_inode: tuple[int, int] | None = None
        # One worker: agent events reach the core in arrival order (see the module doc).
        self._agent_pool = ThreadPoolExecutor(1, thread_name_prefix="grpc-agents")
        self._admin_pool = ThreadPoolExecutor(2, thread_name_prefix="grpc-admin")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._stopping: asyncio.Event | None = None
        self._servers: list[grpc.aio.Server] = []
        self._health: list[HealthServicer] = []
        self.agents: AgentServicer | None = None
        self._serving: bool | None = None

    # ------------------------------------------------------------ core calls
    async def agent_call(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._agent_pool, fn, *args)

    def agent_submit(self, fn: Callable[..., Any], *args: Any) -> futures.Future | None:
        """Queue ``fn`` behind the agent events already queued (its exceptions are
        logged); its future, or None when the server is shutting down."""
        try:
            return self._agent_pool.submit(_logged(fn), *args)
        except RuntimeError:
            return None  # shutting down: the controller stops with the server

    def agent_call_later(self, fn: Callable[..., Any], *args: Any) -> None:
        """Queue ``fn`` behind the agent events already queued; nobody waits for it."""
        self.agent_submit(fn, *args)

    async def admin_call(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._admin_pool, fn, *args)

    # ------------------------------------------------------------ lifecycle
    def start(self) -> ControllerServer:
        self._thread = threading.Thread(target=self._run, name="dsched-grpc", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            self._thread.join()
            self._shutdown_pools()
            raise self._error
        return self

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        # The agents' senders run on this loop: an epoch's directives come in
        # one hand-over (AgentSessions.send_many), not one wake-up per agent.
        sessions = self.controller.sessions
        sessions.run_batch = loop.call_soon_threadsafe
        # The streams report each Ack: an epoch may wait for them (AckWait).
        self.controller.acks.enabled = True
        try:
            loop.run_until_complete(self._main())
        finally:
            self.controller.acks.enabled = False
            if sessions.run_batch == loop.call_soon_threadsafe:
                sessions.run_batch = None
            loop.close()

    async def _main(self) -> None:
        self._stopping = asyncio.Event()
        try:
            await self._open()
        except BaseException as exc:  # noqa: BLE001 - handed to start()'s caller
            self._error = exc
            for server in self._servers:
                await server.stop(None)
            self._remove_socket()
            self._ready.set()
            return
        self._ready.set()
        watcher = asyncio.create_task(self._watch_health())
        await self._stopping.wait()
        watcher.cancel()

    async def _open(self) -> None:
        cfg = self.config
        host, _ = parse_hostport("listen", self.listen)
        if not is_loopback(host) and cfg.tls.missing():
            log.warning(
                "the agents' door %s is off loopback without mutual TLS "
                "(allow_plaintext_remote): agents are not authenticated and any "
                "host that reaches it can report as any node",
                self.listen,
            )
        agents = grpc.aio.server(options=_SERVER_OPTIONS)
        self.agents = AgentServicer(self)
        pb_grpc.add_AgentServiceServicer_to_server(self.agents, agents)
        self._servers.append(agents)
        self.port = _add_port(agents, self.listen, _server_credentials(cfg.tls))
        self._health.append(_add_health(agents, AGENT_SERVICE))

        admin = grpc.aio.server(options=_SERVER_OPTIONS)
        _add_admin_service(AdminServicer(self), admin)
        self._servers.append(admin)
        self._health.append(_add_health(admin, ADMIN_SERVICE))
        path = unix_socket_path(self.admin_listen)
        if path is not None:
            _clear_stale_socket(path)
            self._socket_path = path
            _add_port(admin, self.admin_listen, None)
            # Right after bind, before serving: the socket is born with the
            # umask's mode, which lets at most the owner in.
            os.chmod(path, cfg.admin_socket_mode_bits)
            gid = socket_group_id("admin_socket_group", cfg.admin_socket_group)
            if gid is not None:
                os.chown(path, -1, gid)
            st = path.stat()
            self._socket_inode = (st.st_dev, st.st_ino)
            self.admin_address = f"unix:{path}"
        else:
            host, _ = parse_hostport("admin_listen", self.admin_listen)
            if not (is_loopback(host) or not cfg.admin_tls.missing()):
                raise OSError(f"admin door {self.admin_listen} off loopback needs [admin_tls]")
            creds = _server_credentials(cfg.admin_tls)
            self.admin_port = _add_port(admin, self.admin_listen, creds)
            self.admin_address = f"{host if ':' not in host else f'[{host}]'}:{self.admin_port}"
        await self._set_health(False, "starting")
        for server in self._servers:
            await server.start()

    async def _set_health(self, serving: bool, why: str) -> None:
        if serving == self._serving:
            return
        if self._serving is not None:
            log.log(
                logging.INFO if serving else logging.WARNING,
                "health: %s%s",
                "SERVING" if serving else "NOT_SERVING",
                f" ({why})" if why else "",
            )
        self._serving = serving
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if serving
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for servicer, service in zip(self._health, (AGENT_SERVICE, ADMIN_SERVICE), strict=True):
            for name in ("", service):
                await servicer.set(name, status)

    async def _watch_health(self) -> None:
        # Often enough to notice a stall within a fraction of the two slots that define it.
        period = min(1.0, self.config.slot_seconds / 4)
        while True:
            serving, why = self.controller.health()
            await self._set_health(serving, why)
            await asyncio.sleep(period)

    def stop(self, grace: float | None = 0) -> None:
        """Health goes NOT_SERVING, agent streams end, both doors close, the socket goes."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None or not thread.is_alive():
            self._shutdown_pools()
            return
        future = asyncio.run_coroutine_threadsafe(self._close(grace), loop)
        try:
            future.result(timeout=(grace or 0) + 30)
        finally:
            thread.join(timeout=30)
            self._shutdown_pools()

    async def _close(self, grace: float | None) -> None:
        for servicer in self._health:
            await servicer.enter_graceful_shutdown()
        if self.agents is not None:
            for stream in list(self.agents.streams.values()):
                stream.end()
        await asyncio.gather(*(server.stop(grace) for server in self._servers))
        self._remove_socket()
        assert self._stopping is not None
        self._stopping.set()

    def _shutdown_pools(self) -> None:
        self._agent_pool.shutdown(wait=True, cancel_futures=False)
        self._admin_pool.shutdown(wait=True, cancel_futures=True)

    def _remove_socket(self) -> None:
        path = self._socket_path
        if path is None:
            return
        try:
            st = path.lstat()
        except FileNotFoundError:
            return
        # Only our own socket: another controller may have taken the path since.
        if self._socket_inode in (None, (st.st_dev, st.st_ino)) and stat.S_ISSOCK(st.st_mode):
            path.unlink(missing_ok=True)

    # Tests and the old API
    @property
    def bound_port(self) -> int:
        return self.port

    def __enter__(self) -> ControllerServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class _EncodeOnce:
    """A reply serializer that encodes the same reply object once.

    GetPlan answers with the cached reply of the last decision record until
    the next epoch; at 20,000 instances it is over 10 MB, and encoding it on
    every call (a dashboard or a script polling it several times a second) would
    hold the interpreter for milliseconds each time, against the agents'
    streams. The reply is never changed once made, so its bytes are kept with it.
    """

    def __init__(self, encode: Callable[[Any], bytes]):
        self._encode = encode
        self._last: tuple[Any, bytes] = (None, b"")

    def __call__(self, reply: Any) -> bytes:
        last, data = self._last
        if reply is not last:
            data = self._encode(reply)
            self._last = (reply, data)
        return data


def _add_admin_service(servicer: AdminServicer, server: grpc.aio.Server) -> None:
    """``add_AdminServiceServicer_to_server``, with GetPlan's reply encoded once
    per plan (:class:`_EncodeOnce`): the generated function's handlers, one changed."""

    class _Handlers:
        service, handlers = "", {}

        def add_generic_rpc_handlers(self, generic_handlers: Any) -> None:
            pass  # made again below from the same handlers

        def add_registered_method_handlers(self, service: str, handlers: dict) -> None:
            self.service, self.handlers = service, handlers

    got = _Handlers()
    pb_grpc.add_AdminServiceServicer_to_server(servicer, got)
    plan = got.handlers["GetPlan"]
    handlers = {
        **got.handlers,
        "GetPlan": plan._replace(response_serializer=_EncodeOnce(plan.response_serializer)),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(got.service, handlers),))
    server.add_registered_method_handlers(got.service, handlers)


def _logged(fn: Callable[..., Any]) -> Callable[..., None]:
    def run(*args: Any) -> None:
        try:
            fn(*args)
        except Exception:
            log.exception("%s failed", getattr(fn, "__name__", fn))

    return run


def _server_credentials(tls: TlsConfig) -> grpc.ServerCredentials | None:
    if tls.cert is None:
        return None
    cert, key, ca = tls.read()
    return grpc.ssl_server_credentials(
        [(key, cert)], root_certificates=ca, require_client_auth=ca is not None
    )


def _add_port(server: grpc.aio.Server, address: str, creds: grpc.ServerCredentials | None) -> int:
    try:
        port = (
            server.add_secure_port(address, creds)
            if creds is not None
            else server.add_insecure_port(address)
        )
    except RuntimeError as exc:
        raise OSError(f"cannot listen on {address}: {exc}") from None
    if port == 0:
        raise OSError(f"cannot listen on {address}")
    return port


def _add_health(server: grpc.aio.Server, service: str) -> HealthServicer:
    servicer = HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    return servicer


def _clear_stale_socket(path: Path) -> None:
    """Make room for the admin socket: create its directory, remove a dead socket
    left by a crash; refuse a live one (another controller) or a non-socket."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        st = path.lstat()
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise OSError(f"admin socket path {path} exists and is not a socket")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(str(path))
    except (ConnectionRefusedError, FileNotFoundError):
        path.unlink(missing_ok=True)  # nobody listens: left by a controller that died
        return
    except OSError:
        pass  # could not tell: leave it, binding will say
    else:
        raise OSError(f"admin socket {path} is in use (another controller runs?)")
    finally:
        probe.close()


def serve(
    controller: Controller, address: str | None = None, admin_address: str | None = None
) -> ControllerServer:
    """Start both doors: agents on ``address`` (default ``listen``), admin on
    ``admin_address`` (default ``admin_listen``)."""
    return ControllerServer(controller, address, admin_address).start()
