"""Helpers for the controller server tests: a controller on real gRPC doors and
agents speaking the real stream from grpc.aio clients in the test process."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from controller.config import ControllerConfig
from controller.core import Controller
from controller.edges.server import ControllerServer, serve
from controller.qos import QosClass, QosConfig
from dsched_pb import dsched_pb2 as pb
from dsched_pb import dsched_pb2_grpc as pb_grpc
from spark_stream.config import HistoryConfig

# A generous bound for "eventually" in polling loops; no test asserts a duration.
PATIENCE_SECONDS = 60.0


def config(tmp_path: Path, **kw) -> ControllerConfig:
    base = dict(
        state_dir=tmp_path / "state",
        slot_seconds=1.0,
        theta_cores=0.05,
        predictors=["linear_trend", "dag"],
        placement="none",
        history=HistoryConfig(enabled=False),
        admin_listen=f"unix:{tmp_path}/admin.sock",
        qos=QosConfig(
            default_class="bronze",
            classes={
                "gold": QosClass("gold", 100.0, 0.01, 8.0),
                "bronze": QosClass("bronze", 2000.0, 0.5, 1.0),
            },
        ),
    )
    base.update(kw)
    cfg = ControllerConfig(**base)
    cfg.validate()
    return cfg


def start(cfg: ControllerConfig, *, loop: bool = True) -> tuple[Controller, ControllerServer]:
    """A controller serving both doors; with ``loop``, its epoch loop runs too."""
    controller = Controller(cfg)
    server = serve(controller, "127.0.0.1:0")
    if loop:
        controller.start(serve_metrics=False)
    return controller, server


def stop(controller: Controller, server: ControllerServer) -> None:
    server.stop(0)
    controller.stop()


def wait_until(cond: Callable[[], bool], what: str, timeout: float = PATIENCE_SECONDS) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"never happened: {what}")
        time.sleep(0.05)


def health(target: str, credentials: grpc.ChannelCredentials | None = None) -> int:
    """The status the health service at ``target`` gives for the whole server."""
    channel = (
        grpc.secure_channel(target, credentials)
        if credentials is not None
        else grpc.insecure_channel(target)
    )
    with channel:
        stub = health_pb2_grpc.HealthStub(channel)
        return stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=10).status


SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def hello(node: str, cores: float = 2.0) -> pb.AgentMessage:
    return pb.AgentMessage(hello=pb.Hello(node_id=node, cpu_capacity_cores=cores, slot_seconds=1.0))


def report(node: str, slot: int, samples: list[pb.InstanceSample] | None = None) -> pb.AgentMessage:
    return pb.AgentMessage(
        report=pb.NodeReport(
            node_id=node,
            slot=slot,
            timestamp=time.time(),
            slot_seconds=1.0,
            instances=samples or [],
        )
    )


def sample(app: str = "wc", operator: str = "split", instance: int = 0, n: int = 0):
    return pb.InstanceSample(
        key=pb.InstanceKey(app=app, operator=operator, instance=instance),
        received_total=n,
        executed_total=n,
        cpu_seconds_total=n * 0.001,
        service_seconds_total=n * 0.001,
    )


class AioAgent:
    """One agent stream from a grpc.aio channel: Hello first, then what the test sends."""

    def __init__(self, channel: grpc.aio.Channel, node: str, cores: float = 2.0):
        self.channel, self.node, self.cores = channel, node, cores
        self.outbox: asyncio.Queue = asyncio.Queue()
        self.call = None

    async def _messages(self):
        yield hello(self.node, self.cores)
        while True:
            msg = await self.outbox.get()
            if msg is None:
                return
            yield msg

    async def open(self) -> pb.ControllerMessage:
        """Open the stream; the controller's first message (a Welcome), or AioRpcError."""
        self.call = pb_grpc.AgentServiceStub(self.channel).Connect(self._messages())
        msg = await self.call.read()
        if msg is grpc.aio.EOF:
            raise AssertionError(f"{self.node}: stream ended at once: {await self.call.code()}")
        return msg

    async def read(self) -> pb.ControllerMessage:
        msg = await self.call.read()
        if msg is grpc.aio.EOF:
            raise EOFError(f"{self.node}: stream ended: {await self.call.code()}")
        return msg

    def send(self, msg: pb.AgentMessage) -> None:
        self.outbox.put_nowait(msg)

    async def close(self) -> None:
        self.outbox.put_nowait(None)
        if self.call is not None:
            self.call.cancel()


def aio_channel(target: str, credentials: grpc.ChannelCredentials | None = None):
    # A channel of its own (not shared by target), as separate agents would have.
    options = [("grpc.use_local_subchannel_pool", 1)]
    if credentials is None:
        return grpc.aio.insecure_channel(target, options=options)
    return grpc.aio.secure_channel(target, credentials, options=options)


def run_with_agent(controller: Controller, server: ControllerServer, node: str, scenario) -> None:
    """Run ``await scenario(agent)`` with one agent stream to ``server`` (not yet
    opened); the stream closes and the controller and server stop after it."""

    async def main() -> None:
        agent = AioAgent(aio_channel(f"127.0.0.1:{server.port}"), node)
        try:
            await scenario(agent)
        finally:
            await agent.close()

    try:
        asyncio.run(main())
    finally:
        stop(controller, server)
