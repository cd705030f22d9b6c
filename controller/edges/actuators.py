"""Where decisions leave the controller: the only side effects of an epoch.

An actuator turns caps (and, with placement, moves) into actions. `agents`
pushes CapDirectives down the agents' streams; `log-only` is what dry-run uses:
it records what would have been sent and sends nothing.
"""

from __future__ import annotations

import logging
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import chain
from typing import Protocol

from dsched.ids import InstanceKey
from dsched.registry import Registry
from dsched_pb import dsched_pb2 as pb

log = logging.getLogger(__name__)

Sender = Callable[[pb.ControllerMessage], None]


class AgentSessions:
    """Open agent streams by node id; a transport registers a sender per stream.

    A transport whose senders belong to one thread (the gRPC server's event
    loop) sets ``run_batch``: :meth:`send_many` then hands all of an epoch's
    directives to that thread at once, one wake-up instead of one per agent,
    and the senders run there.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._senders: dict[str, Sender] = {}
        #: Runs a function on the senders' thread, soon; None: call senders here.
        self.run_batch: Callable[[Callable[[], None]], None] | None = None

    def attach(self, node_id: str, send: Sender) -> None:
        with self._lock:
            self._senders[node_id] = send

    def detach(self, node_id: str, send: Sender) -> None:
        with self._lock:
            if self._senders.get(node_id) is send:
                del self._senders[node_id]

    def nodes(self) -> list[str]:
        with self._lock:
            return sorted(self._senders)

    def send(self, node_id: str, msg: pb.ControllerMessage) -> bool:
        with self._lock:
            send = self._senders.get(node_id)
        if send is None:
            return False
        send(msg)
        return True

    def send_many(
        self, msgs: dict[str, pb.ControllerMessage], delivered: threading.Event | None = None
    ) -> set[str]:
        """Send each node its message; the nodes that had a session.

        ``delivered`` is set once the senders have run (on a batch transport,
        once the loop has also given each woken stream its turn, so the
        messages are encoded and on their way).
        """
        with self._lock:
            found = [(self._senders[n], m) for n, m in msgs.items() if n in self._senders]
            reached = {n for n in msgs if n in self._senders}
        run = self.run_batch
        if run is None or not found:
            for send, msg in found:
                send(msg)
            if delivered is not None:
                delivered.set()
            return reached

        def deliver() -> None:
            try:
                for send, msg in found:
                    send(msg)
            finally:
                if delivered is not None:
                    # Queued behind the wake-ups of the streams just fed.
                    run(delivered.set)

        try:
            run(deliver)
        except RuntimeError:
            # The transport stopped: its streams with it.
            if delivered is not None:
                delivered.set()
        return reached


@dataclass
class ActResult:
    sent: dict[str, int] = field(default_factory=dict)  # node → caps in the directive
    unreachable: list[str] = field(default_factory=list)
    #: Set once the directives are handed to the transport (None: nothing to wait for).
    delivered: threading.Event | None = None

    def wait_delivered(self, timeout: float) -> bool:
        """Block until the directives are on their way (or ``timeout`` seconds)."""
        return True if self.delivered is None else self.delivered.wait(timeout)


class Actuator(Protocol):
    name: str

    def push_caps(
        self, epoch: int, caps_by_node: dict[str, dict[InstanceKey, float]], reason: str
    ) -> ActResult: ...


def directive(epoch: int, caps: dict[InstanceKey, float], reason: str) -> pb.ControllerMessage:
    return pb.ControllerMessage(
        directive=pb.CapDirective(
            epoch=epoch,
            reason=reason,
            caps=[
                pb.InstanceCap(
                    key=pb.InstanceKey(app=k.app, operator=k.operator, instance=k.instance),
                    cap_cores=c,
                )
                for k, c in sorted(caps.items())
            ],
        )
    )


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _length_delimited(field_number: int, payload: bytes) -> bytes:
    return _varint(field_number << 3 | 2) + _varint(len(payload)) + payload


_pack_double = struct.Struct("<d").pack
# ControllerMessage.directive = 1; CapDirective: epoch = 1 (varint), caps = 2,
# reason = 3; InstanceCap: key = 1, cap_cores = 2 (fixed64).
_EPOCH_TAG = _varint(1 << 3 | 0)
_CAP_CORES_TAG = _varint(2 << 3 | 1)


class DirectiveEncoder:
    """Each node's directive, made from the wire encoding of its caps.

    Making 20,000 ``InstanceCap`` messages field by field costs about four
    times more than the rest of handing an epoch's caps to the agents, and it
    lies on the path from the last report to the first directive. An
    ``InstanceCap`` is its key's encoding (the same every epoch) followed by
    eight bytes of double, so the keys' encodings are kept from one epoch to
    the next and each directive is parsed from the joined bytes, which the
    protobuf library checks like any message off the wire. The result equals
    :func:`directive` (tests/test_actuators.py).
    """

    def __init__(self) -> None:
        # key -> the InstanceCap's bytes up to the cap's eight bytes.
        self._prefix: dict[InstanceKey, bytes] = {}

    def _cap_prefix(self, key: InstanceKey) -> bytes:
        encoded = pb.InstanceKey(
            app=key.app, operator=key.operator, instance=key.instance
        ).SerializeToString()
        cap_body_length = len(_length_delimited(1, encoded)) + len(_CAP_CORES_TAG) + 8
        return (
            _varint(2 << 3 | 2)
            + _varint(cap_body_length)
            + _length_delimited(1, encoded)
            + _CAP_CORES_TAG
        )

    def encode_all(
        self, epoch: int, caps_by_node: dict[str, dict[InstanceKey, float]], reason: str
    ) -> dict[str, pb.ControllerMessage]:
        old, new = self._prefix, {}
        head = _EPOCH_TAG + _varint(epoch) + _length_delimited(3, reason.encode())
        out = {}
        for node, caps in sorted(caps_by_node.items()):
            keys = sorted(caps)
            prefixes = [old.get(k) or self._cap_prefix(k) for k in keys]
            new.update(zip(keys, prefixes, strict=True))
            values = map(_pack_double, map(caps.__getitem__, keys))
            body = head + b"".join(chain.from_iterable(zip(prefixes, values, strict=True)))
            out[node] = pb.ControllerMessage.FromString(_length_delimited(1, body))
        # Keys of instances that are gone are dropped with the old table.
        self._prefix = new
        return out


class AgentActuator:
    """Enforce mode: every epoch each node gets the full set of its caps.

    Directives are idempotent (the agent writes only what differs), so a lost
    directive is repaired by the next one without any bookkeeping here.
    """

    name = "agents"

    def __init__(self, sessions: AgentSessions):
        self.sessions = sessions
        self.encoder = DirectiveEncoder()

    def push_caps(
        self, epoch: int, caps_by_node: dict[str, dict[InstanceKey, float]], reason: str
    ) -> ActResult:
        res = ActResult(delivered=threading.Event())
        msgs = self.encoder.encode_all(epoch, caps_by_node, reason)
        reached = self.sessions.send_many(msgs, res.delivered)
        for node, caps in sorted(caps_by_node.items()):
            if node in reached:
                res.sent[node] = len(caps)
            else:
                res.unreachable.append(node)
        return res


class LogOnlyActuator:
    """Dry-run: decide and record, change nothing."""

    name = "log-only"

    def push_caps(
        self, epoch: int, caps_by_node: dict[str, dict[InstanceKey, float]], reason: str
    ) -> ActResult:
        n = sum(len(c) for c in caps_by_node.values())
        log.debug("dry-run epoch %d: would push %d caps to %d nodes", epoch, n, len(caps_by_node))
        return ActResult()


#: Cap actuators by name (config key ``cap_actuator``: who carries out caps in
#: enforce mode); each factory takes the agent sessions. Dry-run always uses
#: ``log-only``.
CAP_ACTUATORS: Registry[Actuator] = Registry("cap actuator", "cap_actuator")
CAP_ACTUATORS.add("agents", AgentActuator)
CAP_ACTUATORS.add("log-only", lambda sessions=None: LogOnlyActuator())
