"""Where decisions leave the controller: the only side effects of an epoch.

An actuator turns caps (and, with placement, moves) into actions. `agents`
pushes CapDirectives down the agents' streams; `log-only` is what dry-run uses:
it records what would have been sent and sends nothing.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
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

    def send_many(self, msgs: dict[str, pb.ControllerMessage]) -> set[str]:
        """Send each node its message; the nodes that had a session."""
        with self._lock:
            found = [(self._senders[n], m) for n, m in msgs.items() if n in self._senders]
            reached = {n for n in msgs if n in self._senders}
        run = self.run_batch
        if run is None or not found:
            for send, msg in found:
                send(msg)
            return reached

        def deliver() -> None:
            for send, msg in found:
                send(msg)

        try:
            run(deliver)
        except RuntimeError:
            pass  # the transport stopped: its streams with it
        return reached


@dataclass
class ActResult:
    sent: dict[str, int] = field(default_factory=dict)  # node → caps in the directive
    unreachable: list[str] = field(default_factory=list)


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


class AgentActuator:
    """Enforce mode: every epoch each node gets the full set of its caps.

    Directives are idempotent (the agent writes only what differs), so a lost
    directive is repaired by the next one without any bookkeeping here.
    """

    name = "agents"

    def __init__(self, sessions: AgentSessions):
        self.sessions = sessions

    def push_caps(
        self, epoch: int, caps_by_node: dict[str, dict[InstanceKey, float]], reason: str
    ) -> ActResult:
        res = ActResult()
        msgs = {node: directive(epoch, caps, reason) for node, caps in sorted(caps_by_node.items())}
        reached = self.sessions.send_many(msgs)
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
