"""The controller's gRPC doors over real sockets: hundreds of agent streams on the
asyncio server, the stream limit, the admin door (a Unix socket, never the agents'
port), one session per node, directives down and reports up, health."""

from __future__ import annotations

import asyncio
import os
import socket
import stat
import threading

import grpc
import pytest
from prometheus_client import generate_latest

from controller.edges.actuators import directive
from controller.edges.server import MAX_EXPLAIN_EPOCHS, serve
from controller.model import InstanceKey
from dsched_pb import dsched_pb2 as pb
from dsched_pb import dsched_pb2_grpc as pb_grpc
from tests.controller_server_support import (
    NOT_SERVING,
    SERVING,
    AioAgent,
    aio_channel,
    config,
    health,
    report,
    run_with_agent,
    sample,
    start,
    stop,
    wait_until,
)

STREAMS = 300


def metric(controller, name: str, **labels: str) -> float:
    value = controller.metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def test_hundreds_of_agent_streams_register_and_the_next_is_refused(tmp_path):
    c, server = start(config(tmp_path, max_agent_streams=STREAMS, slot_seconds=0.5))
    target = f"127.0.0.1:{server.port}"

    async def scenario() -> None:
        # Ten connections of thirty streams each: many agents, few sockets.
        channels = [aio_channel(target) for _ in range(10)]
        admin = grpc.aio.insecure_channel(server.admin_address)
        agents = [AioAgent(channels[i % 10], f"n{i:03d}") for i in range(STREAMS)]
        try:
            first = await asyncio.gather(*(a.open() for a in agents))
            assert all(m.HasField("welcome") for m in first)
            for i, a in enumerate(agents):
                a.send(report(a.node, 1, [sample(app=f"app{i % 7}", instance=i)]))
            status = await pb_grpc.AdminServiceStub(admin).Status(pb.StatusRequest(), timeout=60)
            assert {a.node_id for a in status.agents} == {a.node for a in agents}

            extra = AioAgent(channels[0], "n-extra")
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await extra.open()
            assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "max_agent_streams" in err.value.details()
            assert metric(c, "dsched_agent_refusals_total", reason="too_many_streams") == 1

            # Every agent's report is in before the admin door is asked again,
            # while all the streams stay open and epochs run.
            await asyncio.to_thread(
                wait_until,
                lambda: metric(c, "dsched_reports_total") == STREAMS,
                "all reports ingested",
            )
            status = await pb_grpc.AdminServiceStub(admin).Status(pb.StatusRequest(), timeout=60)
            assert len(status.agents) == STREAMS
            assert all(a.last_report_age_seconds >= 0 for a in status.agents)
            assert metric(c, "dsched_agent_streams") == STREAMS
        finally:
            for a in agents:
                await a.close()
            for ch in (*channels, admin):
                await ch.close()

    try:
        asyncio.run(scenario())
        wait_until(lambda: not c.status().agents, "every agent disconnected")
        assert metric(c, "dsched_agent_streams") == 0
    finally:
        stop(c, server)


def test_directives_reach_the_stream_and_acks_come_back(tmp_path):
    c, server = start(config(tmp_path), loop=False)

    async def scenario() -> None:
        channel = aio_channel(f"127.0.0.1:{server.port}")
        agent = AioAgent(channel, "n1")
        try:
            assert (await agent.open()).HasField("welcome")
            key = InstanceKey("wc", "split", 0)
            # From another thread, as the epoch pushes them.
            sent = await asyncio.to_thread(
                c.sessions.send, "n1", directive(7, {key: 0.5}, "epoch 7")
            )
            assert sent
            msg = await agent.read()
            assert msg.directive.epoch == 7 and msg.directive.caps[0].cap_cores == 0.5
            agent.send(
                pb.AgentMessage(
                    ack=pb.Ack(
                        epoch=7,
                        rejected=[pb.Rejection(key=msg.directive.caps[0].key, reason="unknown: x")],
                    )
                )
            )
            await asyncio.to_thread(
                wait_until,
                lambda: metric(c, "dsched_directive_rejections_total", reason="unknown") == 1,
                "the ack's refusal counted",
            )
        finally:
            await agent.close()
            await channel.close()

    try:
        asyncio.run(scenario())
    finally:
        stop(c, server)


def test_a_report_for_another_node_on_a_stream_is_ignored_and_counted(tmp_path):
    c, server = start(config(tmp_path), loop=False)

    async def scenario() -> None:
        channel = aio_channel(f"127.0.0.1:{server.port}")
        a, b = AioAgent(channel, "n1"), AioAgent(channel, "n2")
        try:
            await a.open()
            await b.open()
            a.send(report("n2", 1, [sample()]))
            a.send(report("n1", 1, [sample(instance=1)]))
            await asyncio.to_thread(
                wait_until, lambda: metric(c, "dsched_reports_total") == 1, "n1's own report"
            )
            assert metric(c, "dsched_report_samples_rejected_total", reason="wrong_node") == 1
            assert c.cluster.agents["n2"].last_report_at == 0.0
        finally:
            await a.close()
            await b.close()
            await channel.close()

    try:
        asyncio.run(scenario())
    finally:
        stop(c, server)


def test_a_second_session_for_a_connected_node_is_refused_until_the_first_is_gone(tmp_path):
    c, server = start(config(tmp_path), loop=False)

    async def scenario() -> None:
        channel = aio_channel(f"127.0.0.1:{server.port}")
        first, second = AioAgent(channel, "n1"), AioAgent(channel, "n1")
        try:
            await first.open()
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await second.open()
            assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS
            assert "n1" in err.value.details()
            assert metric(c, "dsched_agent_refusals_total", reason="duplicate_session") == 1
            # The refused one did not disturb the first: it is still connected.
            assert c.cluster.agents["n1"].connected
            await first.close()
            third = AioAgent(channel, "n1")
            assert (await third.open()).HasField("welcome")
            assert c.cluster.agents["n1"].connected
            await third.close()
        finally:
            await channel.close()

    try:
        asyncio.run(scenario())
        wait_until(lambda: not c.cluster.agents["n1"].connected, "n1 disconnected")
    finally:
        stop(c, server)


def test_hello_above_the_capacity_bound_is_refused_and_counted(tmp_path):
    c, server = start(config(tmp_path, max_node_capacity_cores=64.0), loop=False)

    async def scenario() -> None:
        channel = aio_channel(f"127.0.0.1:{server.port}")
        try:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await AioAgent(channel, "n1", cores=5000.0).open()
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "max_node_capacity_cores" in err.value.details()
            assert "n1" not in c.cluster.agents
            # Refused before it took the node's session: the node may connect.
            ok = AioAgent(channel, "n1", cores=64.0)
            assert (await ok.open()).HasField("welcome")
            await ok.close()
        finally:
            await channel.close()

    try:
        asyncio.run(scenario())
        assert metric(c, "dsched_agent_refusals_total", reason="capacity_too_large") == 1
        assert b"dsched_agent_refusals_total" in generate_latest(c.metrics.registry)
    finally:
        stop(c, server)


def test_admin_rpcs_are_not_served_on_the_agents_port(tmp_path):
    c, server = start(config(tmp_path), loop=False)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            with pytest.raises(grpc.RpcError) as err:
                pb_grpc.AdminServiceStub(channel).SetMode(
                    pb.SetModeRequest(mode=pb.ENFORCE), timeout=10
                )
            assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
        assert c.mode == "dry-run"
        with grpc.insecure_channel(server.admin_address) as channel:
            stub = pb_grpc.AdminServiceStub(channel)
            assert stub.SetMode(pb.SetModeRequest(mode=pb.ENFORCE), timeout=10).previous == (
                pb.DRY_RUN
            )
            assert c.mode == "enforce"
            # ... and the agents' service is not on the admin door.
            with pytest.raises(grpc.RpcError) as err:
                list(pb_grpc.AgentServiceStub(channel).Connect(iter([]), timeout=10))
            assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
    finally:
        stop(c, server)


def test_explain_epochs_are_bounded(tmp_path):
    c, server = start(config(tmp_path), loop=False)
    try:
        with grpc.insecure_channel(server.admin_address) as channel:
            stub = pb_grpc.AdminServiceStub(channel)
            with pytest.raises(grpc.RpcError) as err:
                stub.Explain(pb.ExplainRequest(app="wc", epochs=MAX_EXPLAIN_EPOCHS + 1), timeout=10)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert str(MAX_EXPLAIN_EPOCHS) in err.value.details()
            assert stub.Explain(pb.ExplainRequest(app="wc"), timeout=10).app == "wc"
            stub.Explain(pb.ExplainRequest(app="wc", epochs=MAX_EXPLAIN_EPOCHS), timeout=10)
    finally:
        stop(c, server)


def test_admin_socket_mode_stale_file_and_removal(tmp_path):
    path = tmp_path / "run" / "admin.sock"  # its directory does not exist yet
    cfg = config(tmp_path, admin_listen=f"unix:{path}", admin_socket_mode="0600")
    c, server = start(cfg, loop=False)
    try:
        assert stat.S_ISSOCK(path.stat().st_mode)
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert server.admin_address == f"unix:{path}"
        # A second controller on the same socket is refused: the first is alive.
        with pytest.raises(OSError, match="in use"):
            serve(c, "127.0.0.1:0")
        assert path.exists()
    finally:
        stop(c, server)
    assert not path.exists()

    # A socket file left by a controller that died is removed at start.
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(path))
    dead.close()
    assert path.exists()
    c, server = start(cfg, loop=False)
    try:
        with grpc.insecure_channel(server.admin_address) as channel:
            pb_grpc.AdminServiceStub(channel).Status(pb.StatusRequest(), timeout=10)
    finally:
        stop(c, server)

    # Anything else at the path is never removed.
    path.write_text("not a socket")
    with pytest.raises(OSError, match="not a socket"):
        start(cfg, loop=False)
    assert path.read_text() == "not a socket"


def test_admin_socket_group(tmp_path):
    gid = os.getgid()
    path = tmp_path / "admin.sock"
    cfg = config(tmp_path, admin_listen=f"unix:{path}", admin_socket_group=str(gid))
    c, server = start(cfg, loop=False)
    try:
        assert path.stat().st_gid == gid
        assert stat.S_IMODE(path.stat().st_mode) == 0o660
    finally:
        stop(c, server)


def test_health_not_serving_while_starting_stalled_or_stopping(tmp_path):
    c, server = start(config(tmp_path, slot_seconds=0.3), loop=False)
    doors = (f"127.0.0.1:{server.port}", server.admin_address)
    try:
        # Doors open, epoch loop not started yet.
        assert [health(d) for d in doors] == [NOT_SERVING, NOT_SERVING]
        c.start(serve_metrics=False)
        wait_until(lambda: all(health(d) == SERVING for d in doors), "serving once started")

        # An epoch that cannot finish for more than two slots (the lock held,
        # as a hung epoch would) turns health off; it comes back after.
        released = threading.Event()

        def hold() -> None:
            with c._lock:
                released.wait()

        holder = threading.Thread(target=hold)
        holder.start()
        try:
            wait_until(lambda: all(health(d) == NOT_SERVING for d in doors), "stall noticed")
            # The doors answer admin calls that need no core lock meanwhile.
            with grpc.insecure_channel(server.admin_address) as channel:
                pb_grpc.AdminServiceStub(channel).GetPlan(pb.GetPlanRequest(), timeout=10)
                # Status too: an epoch holding the lock never keeps an operator waiting.
                pb_grpc.AdminServiceStub(channel).Status(pb.StatusRequest(), timeout=10)
        finally:
            released.set()
            holder.join()
        wait_until(lambda: all(health(d) == SERVING for d in doors), "serving after the stall")

        c.stop()
        wait_until(lambda: all(health(d) == NOT_SERVING for d in doors), "stopping")
    finally:
        stop(c, server)


def test_the_daemon_serves_the_admin_socket_and_removes_it_at_stop(tmp_path):
    from testbed.live.cluster import LocalCluster

    cluster = LocalCluster(tmp_path / "c", nodes=[])
    sock = tmp_path / "c" / "admin.sock"
    try:
        cluster.start_controller()  # waits for Status on the admin door
        assert cluster.admin_address == f"unix:{sock.resolve()}"
        assert stat.S_IMODE(sock.stat().st_mode) == 0o660
        assert health(cluster.admin_address) in (SERVING, NOT_SERVING)
    finally:
        cluster.stop()
    log = (tmp_path / "c" / "controller.log").read_text()
    assert cluster.controller.returncode == 0, log[-3000:]
    assert not sock.exists()


def test_the_plan_follows_every_epoch(tmp_path):
    """GetPlan answers from the last record, never from an older one it encoded before."""
    c, server = start(config(tmp_path), loop=False)
    try:
        with grpc.insecure_channel(server.admin_address) as channel:
            stub = pb_grpc.AdminServiceStub(channel)
            for _ in range(3):
                c.run_epoch()
                first = stub.GetPlan(pb.GetPlanRequest(), timeout=10)
                again = stub.GetPlan(pb.GetPlanRequest(), timeout=10)
                assert first.epoch == again.epoch == c.epoch
                assert first.record_json == again.record_json
    finally:
        stop(c, server)


def test_welcome_carries_the_mode_and_a_mode_change_reaches_connected_agents(tmp_path):
    c, server = start(config(tmp_path, mode="dry-run"), loop=False)

    async def scenario(agent: AioAgent) -> None:
        first = await agent.open()
        assert first.welcome.mode == pb.DRY_RUN
        await asyncio.to_thread(c.set_mode, "enforce")
        again = await agent.read()
        assert again.HasField("welcome") and again.welcome.mode == pb.ENFORCE
        # The same mode again changes nothing and sends nothing.
        await asyncio.to_thread(c.set_mode, "enforce")
        await asyncio.to_thread(c.set_mode, "dry-run")
        last = await agent.read()
        assert last.welcome.mode == pb.DRY_RUN

    run_with_agent(c, server, "n1", scenario)


def test_a_stream_that_outpaces_the_core_waits_and_loses_no_report(tmp_path):
    # The core is busy (an epoch holds its lock): reports are handed over without
    # waiting, but a stream whose previous report is still queued waits for it,
    # so no queue grows, and every report is taken in once the core is free.
    c, server = start(config(tmp_path), loop=False)

    async def scenario(agent: AioAgent) -> None:
        assert (await agent.open()).HasField("welcome")
        held, free = threading.Event(), threading.Event()

        def busy_core() -> None:
            with c._lock:
                held.set()
                free.wait(60)

        holder = threading.Thread(target=busy_core)
        holder.start()
        await asyncio.to_thread(held.wait, 60)
        try:
            for slot in range(1, 6):
                agent.send(report("n1", slot, [sample(n=slot * 10)]))
            deepest = 0
            for _ in range(50):
                deepest = max(deepest, server._agent_pool._work_queue.qsize())
                await asyncio.sleep(0.02)
            assert deepest <= 1, deepest
            assert metric(c, "dsched_reports_total") == 0
        finally:
            free.set()
            await asyncio.to_thread(holder.join, 60)
        await asyncio.to_thread(
            wait_until, lambda: metric(c, "dsched_reports_total") == 5, "all five taken in"
        )

    run_with_agent(c, server, "n1", scenario)
