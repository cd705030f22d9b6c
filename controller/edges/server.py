"""gRPC transport for the controller: the agents' stream and the admin service.

A thin edge around :class:`controller.core.Controller`: it translates streams
into on_hello / on_report / on_ack calls and attaches a bounded outbound queue
per agent. Plaintext is allowed on loopback only unless the config says so
(checked in ControllerConfig.validate); with TLS and a CA, agents must show a
client certificate.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
from concurrent import futures

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from controller.core import MODE_TO_PB, PB_TO_MODE, Controller
from controller.record import explain_lines
from dsched.names import InvalidName, check_name
from dsched_pb import dsched_pb2 as pb
from dsched_pb import dsched_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

# Directives are idempotent: when an agent stops reading, newer ones replace
# the backlog instead of growing it without bound. A constant, not a setting:
# only the newest directive matters, so a deeper queue would buy nothing.
OUTBOUND_QUEUE = 8


class AgentServicer(pb_grpc.AgentServiceServicer):
    def __init__(self, controller: Controller):
        self.controller = controller

    def Connect(self, request_iterator, context):  # noqa: N802 (gRPC naming)
        try:
            first = next(request_iterator)
        except StopIteration:
            return
        if not first.HasField("hello"):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the first message must be a Hello")
        try:
            welcome = self.controller.on_hello(first.hello)
        except ValueError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"hello refused: {exc}")
        node = first.hello.node_id
        outbound: queue.Queue = queue.Queue(maxsize=OUTBOUND_QUEUE)
        closed = object()

        def send(msg: pb.ControllerMessage) -> None:
            while True:
                try:
                    outbound.put_nowait(msg)
                    return
                except queue.Full:
                    try:
                        outbound.get_nowait()  # drop the oldest; the newest supersedes it
                    except queue.Empty:
                        pass

        def read() -> None:
            try:
                for msg in request_iterator:
                    kind = msg.WhichOneof("body")
                    if kind == "report":
                        if msg.report.node_id != node:
                            log.warning(
                                "agent %s sent a report for node %s; ignored",
                                node,
                                msg.report.node_id,
                            )
                            continue
                        self.controller.on_report(msg.report)
                    elif kind == "ack":
                        self.controller.on_ack(node, msg.ack)
            except grpc.RpcError:
                pass
            except Exception:
                log.exception("agent %s: stream handler failed", node)
            finally:
                send(closed)

        self.controller.sessions.attach(node, send)
        context.add_callback(lambda: send(closed))
        reader = threading.Thread(target=read, name=f"agent-{node}", daemon=True)
        reader.start()
        try:
            yield pb.ControllerMessage(welcome=welcome)
            while True:
                item = outbound.get()
                if item is closed:
                    break
                yield item
        finally:
            self.controller.sessions.detach(node, send)
            self.controller.on_disconnect(node)


class AdminServicer(pb_grpc.AdminServiceServicer):
    def __init__(self, controller: Controller):
        self.controller = controller

    def Status(self, request, context):  # noqa: N802
        return self.controller.status()

    def SetMode(self, request, context):  # noqa: N802
        if request.mode not in PB_TO_MODE:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "mode must be DRY_RUN or ENFORCE")
        previous = self.controller.set_mode(PB_TO_MODE[request.mode])
        return pb.SetModeReply(mode=request.mode, previous=MODE_TO_PB[previous])

    def GetPlan(self, request, context):  # noqa: N802
        rec = self.controller.last_record
        if rec is None:
            return pb.PlanReply(mode=MODE_TO_PB[self.controller.mode])
        return plan_reply(rec)

    def SetQos(self, request, context):  # noqa: N802
        try:
            known = self.controller.set_qos(request.app, request.qos_class)
        except ValueError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        return pb.SetQosReply(app=request.app, qos_class=request.qos_class, app_known=known)

    def ListQos(self, request, context):  # noqa: N802
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

    def Explain(self, request, context):  # noqa: N802
        try:
            check_name("app", request.app)
        except InvalidName as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        records = self.controller.explain(request.app, request.epochs or 10)
        mine = [
            r
            for r in records
            if any(a["app"] == request.app for a in (*r.get("apps", []), *r.get("held", [])))
        ]
        return pb.ExplainReply(
            app=request.app,
            lines=explain_lines(request.app, records),
            records_json=json.dumps([_app_view(r, request.app) for r in mine], default=float),
        )


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
        record_json=json.dumps(rec, default=float),
    )


def serve(controller: Controller, address: str, max_workers: int = 64) -> grpc.Server:
    """Start the gRPC server (agent stream, admin, health) on ``address``."""
    # Each agent holds one worker thread for its stream's lifetime.
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="grpc"),
        # Agents keep their idle stream alive with pings every 10 s; on default
        # settings the server answers a few minutes of that with GOAWAY
        # "too_many_pings" and every agent loses its stream.
        options=[
            ("grpc.http2.min_recv_ping_interval_without_data_ms", 5000),
            ("grpc.keepalive_permit_without_calls", 1),
        ],
    )
    pb_grpc.add_AgentServiceServicer_to_server(AgentServicer(controller), server)
    pb_grpc.add_AdminServiceServicer_to_server(AdminServicer(controller), server)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    tls = controller.config.tls
    if tls.enabled:
        creds = grpc.ssl_server_credentials(
            [(tls.key.read_bytes(), tls.cert.read_bytes())],
            root_certificates=tls.ca.read_bytes() if tls.ca else None,
            require_client_auth=tls.ca is not None,
        )
        port = server.add_secure_port(address, creds)
    else:
        port = server.add_insecure_port(address)
    if port == 0:
        raise OSError(f"cannot listen on {address}")
    server.start()
    for svc in ("", "dsched.v1.AgentService", "dsched.v1.AdminService"):
        health_servicer.set(svc, health_pb2.HealthCheckResponse.SERVING)
    server.bound_port = port  # type: ignore[attr-defined]
    return server
