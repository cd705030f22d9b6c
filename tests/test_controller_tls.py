"""Mutual TLS on the controller's doors with a real PKI (tests/tls_support.py):
agents authenticate with certificates that name their node, the admin door trusts
only admin certificates, one session per node, instances belong to one node, and
the config refuses what would open either door."""

from __future__ import annotations

import asyncio
import logging
import math

import grpc
import pytest

from controller.config import AdminTlsConfig, ControllerConfig
from controller.edges.cluster import HelloRefused, ObservedCluster
from controller.model import InstanceKey
from dsched.config import ConfigError, from_dict, is_loopback
from dsched.tls import TlsConfig
from dsched_pb import dsched_pb2 as pb
from dsched_pb import dsched_pb2_grpc as pb_grpc
from tests.controller_server_support import (
    AioAgent,
    aio_channel,
    config,
    report,
    sample,
    start,
    stop,
    wait_until,
)


def metric(controller, name: str, **labels: str) -> float:
    value = controller.metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def creds(pki, cert_key: tuple | None = None) -> grpc.ChannelCredentials:
    """Client credentials trusting the controller's CA, with a client certificate if given."""
    if cert_key is None:
        return grpc.ssl_channel_credentials(root_certificates=pki.ca.read_bytes())
    cert, key = cert_key
    return grpc.ssl_channel_credentials(
        root_certificates=pki.ca.read_bytes(),
        private_key=key.read_bytes(),
        certificate_chain=cert.read_bytes(),
    )


def mtls_config(tmp_path, pki, **kw):
    return config(
        tmp_path,
        tls=TlsConfig(cert=pki.server_cert, key=pki.server_key, ca=pki.ca),
        **kw,
    )


def run_agents(server, pki, body) -> None:
    """Run ``body(open_agent)`` where ``open_agent(node, cert_key)`` opens a stream."""

    async def scenario() -> None:
        opened: list[tuple[AioAgent, grpc.aio.Channel]] = []

        async def open_agent(node: str, cert_key=None, cores: float = 2.0):
            channel = aio_channel(f"127.0.0.1:{server.port}", creds(pki, cert_key))
            agent = AioAgent(channel, node, cores)
            opened.append((agent, channel))
            first = await agent.open()
            return agent, first

        try:
            await body(open_agent)
        finally:
            for agent, channel in opened:
                await agent.close()
                await channel.close()

    asyncio.run(scenario())


def test_an_agent_with_its_certificate_connects(tmp_path, pki):
    c, server = start(mtls_config(tmp_path, pki), loop=False)

    async def body(open_agent):
        _, first = await open_agent("n1", pki.agent("n1"))
        assert first.HasField("welcome")
        # A DNS subject alternative name is as good as the CN.
        _, first = await open_agent("n7", pki.issue("host-7", cn="host-7", dns=("n7",)))
        assert first.HasField("welcome")

    try:
        run_agents(server, pki, body)
        assert {"n1", "n7"} <= set(c.cluster.agents)
    finally:
        stop(c, server)


@pytest.mark.parametrize("who", ["no certificate", "another CA"])
def test_agents_without_a_trusted_certificate_are_refused_at_the_handshake(tmp_path, pki, who):
    c, server = start(mtls_config(tmp_path, pki), loop=False)
    cert_key = None if who == "no certificate" else pki.agent("n1", ca="other")

    async def body(open_agent):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await open_agent("n1", cert_key)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE

    try:
        run_agents(server, pki, body)
        assert "n1" not in c.cluster.agents
    finally:
        stop(c, server)


def test_a_node_id_its_certificate_does_not_carry_is_refused_and_counted(tmp_path, pki, caplog):
    c, server = start(mtls_config(tmp_path, pki), loop=False)

    async def body(open_agent):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await open_agent("n1", pki.agent("n2"))
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "'n1'" in err.value.details() and "n2" in err.value.details()

    try:
        with caplog.at_level(logging.WARNING, "controller.edges.server"):
            run_agents(server, pki, body)
        assert "n1" not in c.cluster.agents
        assert metric(c, "dsched_agent_refusals_total", reason="node_id_mismatch") == 1
        assert any("node_id_mismatch" in r.getMessage() for r in caplog.records)
    finally:
        stop(c, server)


def test_the_same_certificate_replaces_a_session_another_is_refused(tmp_path, pki):
    c, server = start(mtls_config(tmp_path, pki), loop=False)
    n1 = pki.agent("n1")
    n1_again = pki.issue("n1-reissued", cn="n1", dns=("n1",))

    async def body(open_agent):
        old, _ = await open_agent("n1", n1)
        # Another valid certificate for n1 while n1's session is up: refused.
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await open_agent("n1", n1_again)
        assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS
        # The same certificate (the agent reconnected; its old stream is half
        # dead): the new session replaces the old one, which ends.
        new, first = await open_agent("n1", n1)
        assert first.HasField("welcome")
        with pytest.raises(EOFError):
            while True:
                await old.read()
        assert c.cluster.agents["n1"].connected
        # The replaced stream's end did not disconnect the node; its reports flow.
        new.send(report("n1", 1, [sample()]))
        await asyncio.to_thread(
            wait_until, lambda: c.cluster.agents["n1"].last_report_at > 0, "n1's report"
        )
        assert c.cluster.agents["n1"].connected

    try:
        run_agents(server, pki, body)
        assert metric(c, "dsched_agent_refusals_total", reason="duplicate_session") == 1
    finally:
        stop(c, server)


def admin_tls_config(tmp_path, pki, **kw):
    return mtls_config(
        tmp_path,
        pki,
        admin_listen="127.0.0.1:0",
        admin_tls=AdminTlsConfig(cert=pki.server_cert, key=pki.server_key, ca=pki.admin_ca),
        **kw,
    )


def test_an_agent_certificate_never_opens_the_admin_door(tmp_path, pki):
    c, server = start(admin_tls_config(tmp_path, pki), loop=False)
    agent = pki.agent("n1")
    try:
        # Not on the agents' port, even with a valid agent certificate.
        with grpc.secure_channel(f"127.0.0.1:{server.port}", creds(pki, agent)) as channel:
            with pytest.raises(grpc.RpcError) as err:
                pb_grpc.AdminServiceStub(channel).SetMode(
                    pb.SetModeRequest(mode=pb.ENFORCE), timeout=10
                )
            assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
        # On the admin door, an agent certificate (or none) fails the handshake.
        for cert_key in (agent, None):
            with grpc.secure_channel(server.admin_address, creds(pki, cert_key)) as channel:
                with pytest.raises(grpc.RpcError) as err:
                    pb_grpc.AdminServiceStub(channel).SetMode(
                        pb.SetModeRequest(mode=pb.ENFORCE), timeout=10
                    )
                assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert c.mode == "dry-run"
        # An admin certificate does.
        admin = (pki.admin_cert, pki.admin_key)
        with grpc.secure_channel(server.admin_address, creds(pki, admin)) as channel:
            stub = pb_grpc.AdminServiceStub(channel)
            stub.SetMode(pb.SetModeRequest(mode=pb.ENFORCE), timeout=10)
            assert stub.Status(pb.StatusRequest(), timeout=10).mode == pb.ENFORCE
    finally:
        stop(c, server)


# ------------------------------------------------------------------ config


def test_off_loopback_the_agents_door_needs_all_of_cert_key_and_ca(tmp_path, pki):
    base = {"state_dir": str(tmp_path), "admin_listen": f"unix:{tmp_path}/a.sock"}
    with pytest.raises(ConfigError) as err:
        from_dict(
            ControllerConfig,
            {
                **base,
                "listen": "10.1.2.3:7700",
                "tls": {"cert": str(pki.server_cert), "key": str(pki.server_key)},
            },
        )
    assert err.value.key == "tls.ca"
    with pytest.raises(ConfigError) as err:
        from_dict(ControllerConfig, {**base, "listen": "0.0.0.0:7700"})
    assert err.value.key == "tls.cert"
    cfg = from_dict(
        ControllerConfig,
        {
            **base,
            "listen": "0.0.0.0:7700",
            "tls": {"cert": str(pki.server_cert), "key": str(pki.server_key), "ca": str(pki.ca)},
        },
    )
    assert cfg.tls.ca == pki.ca
    # The explicit opt-out still works.
    from_dict(ControllerConfig, {**base, "listen": "0.0.0.0:7700", "allow_plaintext_remote": True})


def test_plaintext_off_loopback_warns_at_every_start(tmp_path, caplog):
    cfg = config(tmp_path, listen="0.0.0.0:0", allow_plaintext_remote=True)
    for _ in range(2):
        caplog.clear()
        with caplog.at_level(logging.WARNING, "controller.edges.server"):
            from controller.core import Controller
            from controller.edges.server import serve

            c = Controller(cfg)
            server = serve(c, "0.0.0.0:0")
            stop(c, server)
        assert any("not authenticated" in r.getMessage() for r in caplog.records)


def test_the_admin_door_config(tmp_path, pki):
    base = {"state_dir": str(tmp_path)}
    admin = {"cert": str(pki.server_cert), "key": str(pki.server_key), "ca": str(pki.admin_ca)}
    agents = {"cert": str(pki.server_cert), "key": str(pki.server_key), "ca": str(pki.ca)}
    # Off loopback: admin TLS with a CA is required.
    with pytest.raises(ConfigError) as err:
        from_dict(ControllerConfig, {**base, "admin_listen": "10.0.0.1:7701"})
    assert err.value.key == "admin_tls.cert"
    with pytest.raises(ConfigError) as err:
        from_dict(
            ControllerConfig,
            {**base, "admin_listen": "10.0.0.1:7701", "admin_tls": {**admin, "ca": None}},
        )
    assert err.value.key == "admin_tls.ca"
    # The admin CA must not be the agents' CA.
    with pytest.raises(ConfigError) as err:
        from_dict(
            ControllerConfig,
            {
                **base,
                "tls": agents,
                "admin_listen": "10.0.0.1:7701",
                "admin_tls": {**admin, "ca": str(pki.ca)},
            },
        )
    assert err.value.key == "admin_tls.ca" and "agents" in str(err.value)
    cfg = from_dict(
        ControllerConfig,
        {**base, "tls": agents, "admin_listen": "10.0.0.1:7701", "admin_tls": admin},
    )
    assert cfg.admin_tls.ca == pki.admin_ca
    # Loopback TCP is allowed without TLS; a Unix socket never takes TLS.
    from_dict(ControllerConfig, {**base, "admin_listen": "127.0.0.1:7701"})
    with pytest.raises(ConfigError) as err:
        from_dict(
            ControllerConfig, {**base, "admin_listen": "unix:/run/x.sock", "admin_tls": admin}
        )
    assert err.value.key == "admin_tls"
    for bad, key in (
        ({"admin_listen": "unix:relative.sock"}, "admin_listen"),
        ({"admin_listen": "unix:/" + "x" * 200}, "admin_listen"),
        ({"admin_listen": "127.0.0.1:7700"}, "admin_listen"),  # the agents' port
        ({"admin_socket_mode": "rw"}, "admin_socket_mode"),
        ({"admin_socket_mode": "1777"}, "admin_socket_mode"),
        ({"admin_socket_group": "no-such-group-dsched"}, "admin_socket_group"),
        ({"max_agent_streams": 0}, "max_agent_streams"),
        ({"max_node_capacity_cores": 0}, "max_node_capacity_cores"),
        ({"epoch_trigger": "sometimes"}, "epoch_trigger"),
    ):
        with pytest.raises(ConfigError) as err:
            from_dict(ControllerConfig, {**base, **bad})
        assert err.value.key == key, bad


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.8.9.10", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("::ffff:127.0.0.1", True),
        ("127.example.com", False),
        ("0.0.0.0", False),
        ("::", False),
        ("10.0.0.1", False),
        ("controller.local", False),
        ("", False),
    ],
)
def test_is_loopback(host, loopback):
    assert is_loopback(host) is loopback


# ------------------------------------------------------------------ ownership

NOW = 1_000_000.0


def hello(node: str, cores: float = 4.0) -> pb.Hello:
    return pb.Hello(node_id=node, cpu_capacity_cores=cores, slot_seconds=1.0)


def node_report(node: str, slot: int, now: float, *keys: InstanceKey) -> pb.NodeReport:
    return pb.NodeReport(
        node_id=node,
        slot=slot,
        timestamp=now,
        slot_seconds=1.0,
        instances=[sample(k.app, k.operator, k.instance, n=slot * 10) for k in keys],
    )


def test_an_instance_another_node_reports_is_refused_until_it_moves():
    cluster = ObservedCluster(forget_after_seconds=6.0)
    cluster.agent_connected(hello("a"), NOW)
    cluster.agent_connected(hello("b"), NOW)
    k, other = InstanceKey("wc", "split", 0), InstanceKey("wc", "split", 1)
    cluster.ingest(node_report("a", 1, NOW, k), NOW)
    cluster.ingest(node_report("a", 2, NOW + 1, k), NOW + 1)
    res = cluster.ingest(node_report("b", 1, NOW + 1, k, other), NOW + 1)
    assert res.rejected["owned_by_other_node"] == 1
    assert cluster.rejected["owned_by_other_node"] == 1
    assert cluster.histories[k].node == "a"
    # a keeps reporting it: still a's.
    cluster.ingest(node_report("a", 3, NOW + 2, k), NOW + 2)
    assert cluster.ingest(node_report("b", 2, NOW + 2, k), NOW + 2).rejected["owned_by_other_node"]
    # The instance migrates: a's next report no longer lists it, and b's is taken.
    cluster.ingest(node_report("a", 4, NOW + 3), NOW + 3)
    res = cluster.ingest(node_report("b", 3, NOW + 3, k), NOW + 3)
    assert not res.rejected
    cluster.ingest(node_report("b", 4, NOW + 4, k), NOW + 4)
    assert cluster.histories[k].node == "b"
    # Now a may not report it back while b holds it.
    assert cluster.ingest(node_report("a", 5, NOW + 5, k), NOW + 5).rejected["owned_by_other_node"]


def test_an_owner_that_disconnects_or_falls_silent_releases_its_instances():
    cluster = ObservedCluster(forget_after_seconds=6.0)
    for node in ("a", "b", "c"):
        cluster.agent_connected(hello(node), NOW)
    k = InstanceKey("wc", "count", 0)
    cluster.ingest(node_report("a", 1, NOW, k), NOW)
    cluster.agent_disconnected("a")  # the node died; the engine restarted k on b
    assert not cluster.ingest(node_report("b", 1, NOW + 1, k), NOW + 1).rejected
    # b is still connected but silent for longer than the forget window.
    later = NOW + 1 + 7.0
    assert not cluster.ingest(node_report("c", 1, later, k), later).rejected


def test_capacity_above_the_bound_is_refused():
    cluster = ObservedCluster(max_capacity_cores=128.0)
    cluster.agent_connected(hello("a", 128.0), NOW)
    for cores, reason in ((129.0, "capacity_too_large"), (math.inf, "bad_hello")):
        with pytest.raises(HelloRefused) as err:
            cluster.agent_connected(hello("b", cores), NOW)
        assert err.value.reason == reason
    assert "max_node_capacity_cores 128" in str(
        pytest.raises(HelloRefused, cluster.agent_connected, hello("b", 1000.0), NOW).value
    )
