"""The agent's one bidirectional gRPC stream to the controller (AgentService.Connect).

Per connection: Hello first, then every report buffered while disconnected
(marked ``replayed``), then live reports and one Ack per CapDirective. When the
stream breaks the link reconnects with exponential backoff and jitter; reports
produced meanwhile wait in a bounded buffer (oldest dropped and counted), behind
those sent in the last RESEND_WINDOW_SECONDS, which may have been lost with the
connection and are sent again.
"""

from __future__ import annotations

import logging
import queue
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator

import grpc

from agent.metrics import AgentMetrics
from agent.node import NodeAgent
from dsched.tls import TlsConfig
from dsched_pb import dsched_pb2 as pb
from dsched_pb import dsched_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

_END = object()


# The controller's answers to a Hello it will not take (controller/edges/server.py).
REFUSALS = frozenset(
    {
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.ALREADY_EXISTS,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    }
)
# Refusals that hold until someone changes a certificate or a config.
FINAL_REFUSALS = frozenset(
    {
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.INVALID_ARGUMENT,
    }
)


def backoff_delay(attempt: int, initial: float, maximum: float, rng: random.Random) -> float:
    """Exponential backoff with 'equal jitter': half fixed, half random."""
    ceiling = min(maximum, initial * (2 ** min(attempt, 30)))
    return ceiling / 2 + rng.uniform(0, ceiling / 2)


# Reports gRPC took within this many seconds before a stream broke are sent again
# on the next one. A link that dies silently is noticed only by keepalive (10 s
# ping, 5 s timeout), and whatever was written to the connection meanwhile dies
# with it: the stream has no acknowledgement per report. The controller refuses
# the copies it already has (`duplicate_report`: a report no newer than the
# node's last), so sending again costs a few refused reports, never a double.
RESEND_WINDOW_SECONDS = 20.0
# gRPC's own reconnect backoff of the channel (first, largest), see make_channel.
RECONNECT_BACKOFF_MS = (250, 1000)


def make_channel(target: str, tls: TlsConfig) -> grpc.Channel:
    options = [
        ("grpc.keepalive_time_ms", 10_000),
        ("grpc.keepalive_timeout_ms", 5_000),
        ("grpc.keepalive_permit_without_calls", 1),
        # The link's own backoff spaces the attempts; within one (a wait of up to
        # connect_timeout for the channel) gRPC's reconnect backoff, 1 s growing
        # by 1.6x, let a restarted controller wait up to 2.6 s for its agents,
        # past a short lease. 0.25 s, at most 1 s, keeps that under a second.
        ("grpc.initial_reconnect_backoff_ms", RECONNECT_BACKOFF_MS[0]),
        ("grpc.max_reconnect_backoff_ms", RECONNECT_BACKOFF_MS[1]),
    ]
    if not tls.enabled:
        return grpc.insecure_channel(target, options=options)
    cert, key, ca = tls.read()
    creds = grpc.ssl_channel_credentials(
        root_certificates=ca, private_key=key, certificate_chain=cert
    )
    return grpc.secure_channel(target, creds, options=options)


class _Session:
    """Outgoing messages of one stream; the generator gRPC consumes."""

    def __init__(
        self, on_report_sent: Callable[[pb.NodeReport], None] = lambda report: None
    ) -> None:
        self.outbox: queue.Queue = queue.Queue()
        self._on_report_sent = on_report_sent

    def messages(self) -> Iterator[pb.AgentMessage]:
        while True:
            item = self.outbox.get()
            if item is _END:
                return
            # Counted as sent when gRPC takes it, not when queued: a report still
            # queued when the stream breaks goes back to the buffer and is sent
            # (and counted) once, later.
            if item.WhichOneof("body") == "report":
                self._on_report_sent(item.report)
            yield item

    def leftovers(self) -> list[pb.AgentMessage]:
        out = []
        while True:
            try:
                item = self.outbox.get_nowait()
            except queue.Empty:
                return out
            if item is not _END:
                out.append(item)


class ControllerLink:
    def __init__(
        self,
        agent: NodeAgent,
        target: str,
        tls: TlsConfig | None = None,
        buffer_size: int = 360,
        metrics: AgentMetrics | None = None,
        backoff_initial: float = 0.5,
        backoff_max: float = 30.0,
        connect_timeout: float = 5.0,
        rng: random.Random | None = None,
    ):
        if buffer_size < 1:
            raise ValueError(f"buffer_size must be >= 1, got {buffer_size}")
        self.agent = agent
        self.target = target
        self.tls = tls or TlsConfig()
        self.metrics = metrics or agent.metrics
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self.connect_timeout = connect_timeout
        self.rng = rng or random.Random()
        self._buffer: deque[pb.NodeReport] = deque()
        self._buffer_size = buffer_size
        self._lock = threading.Lock()
        # Reports gRPC took in the last RESEND_WINDOW_SECONDS: (monotonic time, report).
        self._taken: deque[tuple[float, pb.NodeReport]] = deque()
        self._taken_lock = threading.Lock()
        self._session: _Session | None = None
        self._call = None
        self._channel: grpc.Channel | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="controller-link", daemon=True)
        self.connected = threading.Event()
        # Why the controller refused the last attempt, None if it did not.
        self.refusal: grpc.StatusCode | None = None

    # ---------------------------------------------------------------- API

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            if self._session is not None:
                self._session.outbox.put(_END)
            call = self._call
        if call is not None:
            call.cancel()
        self._thread.join(timeout=10)

    def submit_report(self, report: pb.NodeReport) -> None:
        """Send now if connected, else keep it (bounded) for replay."""
        with self._lock:
            if self._session is not None:
                self._session.outbox.put(pb.AgentMessage(report=report))
                return
            self._keep(report)

    @property
    def buffered(self) -> int:
        with self._lock:
            return len(self._buffer)

    # ---------------------------------------------------------------- internals

    def _keep(self, report: pb.NodeReport, front: bool = False) -> None:
        if len(self._buffer) >= self._buffer_size:
            if front:
                self.metrics.reports_dropped.inc()
                return
            self._buffer.popleft()
            self.metrics.reports_dropped.inc()
        if front:
            self._buffer.appendleft(report)
        else:
            self._buffer.append(report)
        self.metrics.reports_buffered.set(len(self._buffer))

    def _run(self) -> None:
        attempt = 0
        while not self._stop.is_set():
            if self._stream_once():
                attempt = 0
            if self._stop.is_set():
                break
            delay = self.retry_delay(attempt, self.refusal)
            attempt += 1
            log.info("controller %s: retrying in %.1f s", self.target, delay)
            self._stop.wait(delay)
        if self._channel is not None:
            self._channel.close()
            self._channel = None

    def retry_delay(self, attempt: int, refusal: grpc.StatusCode | None) -> float:
        """Seconds before the next attempt. A refusal that retrying cannot fix (a
        certificate that does not match the node, a capacity over the bound) waits
        the longest backoff at once instead of hammering the controller."""
        if refusal in FINAL_REFUSALS:
            attempt = 64
        return backoff_delay(attempt, self.backoff_initial, self.backoff_max, self.rng)

    def _report_taken(self, report: pb.NodeReport) -> None:
        """gRPC took ``report`` for the stream (its consumer thread calls this)."""
        now = time.monotonic()
        with self._taken_lock:
            self._taken.append((now, report))
            while self._taken[0][0] < now - RESEND_WINDOW_SECONDS:
                self._taken.popleft()
        self.metrics.reports_sent.inc()

    def _recently_taken(self) -> list[pb.NodeReport]:
        """The reports taken within the window, oldest first; the record is emptied."""
        horizon = time.monotonic() - RESEND_WINDOW_SECONDS
        with self._taken_lock:
            out = [r for t, r in self._taken if t >= horizon]
            self._taken.clear()
        return out

    def _wait_ready(self, channel: grpc.Channel) -> bool:
        future = grpc.channel_ready_future(channel)
        waited = 0.0
        while waited < self.connect_timeout and not self._stop.is_set():
            try:
                future.result(timeout=0.25)
                return True
            except grpc.FutureTimeoutError:
                waited += 0.25
        future.cancel()
        return False

    def _welcomed(self, session: _Session) -> None:
        """The controller accepted this node: replay the buffer, then go live."""
        with self._lock:
            while self._buffer:
                report = self._buffer.popleft()
                report.replayed = True
                session.outbox.put(pb.AgentMessage(report=report))
            self.metrics.reports_buffered.set(0)
            self._session = session
        self.connected.set()
        self.metrics.connected.set(1)
        self.metrics.reconnects.inc()
        log.info("connected to controller %s", self.target)

    def _stream_once(self) -> bool:
        """One connection; True if it was established."""
        # A channel that never connected is kept for the next attempt: building
        # and tearing one down every backoff period is the costliest part of
        # waiting for an absent controller. After a broken stream a new one is made.
        if self._channel is None:
            self._channel = make_channel(self.target, self.tls)
        channel = self._channel
        established = False
        self.refusal = None
        session = _Session(self._report_taken)
        try:
            if not self._wait_ready(channel):
                return False
            stub = pb_grpc.AgentServiceStub(channel)
            with self._lock:
                # Only the Hello until the controller welcomes this node: a refused
                # session must not swallow the buffered reports.
                session.outbox.put(pb.AgentMessage(hello=self.agent.hello()))
                self._call = stub.Connect(session.messages())
                call = self._call
            for msg in call:
                kind = msg.WhichOneof("body")
                if kind == "welcome":
                    if not established:
                        established = True
                        self._welcomed(session)
                    self.agent.on_contact(msg.welcome)
                elif kind == "directive":
                    ack = self.agent.handle_directive(msg.directive)
                    session.outbox.put(pb.AgentMessage(ack=ack))
            log.warning("controller %s closed the stream", self.target)
        except grpc.RpcError as exc:
            if not self._stop.is_set():
                if not established and exc.code() in REFUSALS:
                    self.refusal = exc.code()
                    self.metrics.refused.labels(exc.code().name.lower()).inc()
                    log.error(
                        "controller %s refused this agent (%s): %s",
                        self.target,
                        exc.code().name,
                        exc.details(),
                    )
                else:
                    log.warning("stream to controller %s broke: %s", self.target, exc.code())
        finally:
            with self._lock:
                self._session = None
                self._call = None
                # Reports that never left go back to the buffer, in order.
                for item in reversed(session.leftovers()):
                    if item.WhichOneof("body") == "report":
                        self._keep(item.report, front=True)
                if established and not self._stop.is_set():
                    # Before them, those that left lately: they may have died with
                    # the connection.
                    again = self._recently_taken()
                    for report in reversed(again):
                        self._keep(report, front=True)
                    if again:
                        self.metrics.reports_resent.inc(len(again))
                # Ends the request generator, whose reader thread would otherwise wait forever.
                session.outbox.put(_END)
            self.connected.clear()
            self.metrics.connected.set(0)
            if established or self._stop.is_set():
                channel.close()
                self._channel = None
        return established
