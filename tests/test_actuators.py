"""Directives as the agents receive them: the encoder that builds them from cached
key encodings equals the message built field by field, and an epoch can wait
until its directives are on their way, over a real gRPC stream."""

from __future__ import annotations

import asyncio
import math
import threading

from hypothesis import given, settings
from hypothesis import strategies as st

from controller.edges.actuators import (
    AgentActuator,
    AgentSessions,
    DirectiveEncoder,
    directive,
)
from dsched.ids import InstanceKey
from tests.controller_server_support import AioAgent, config, run_with_agent, start

names = st.text(min_size=1, max_size=40)
keys = st.builds(InstanceKey, names, names, st.integers(-(2**31), 2**31 - 1))
caps = st.dictionaries(
    keys,
    st.floats(min_value=0.0, max_value=1e6, allow_nan=False),
    max_size=30,
)
nodes = st.dictionaries(st.text(min_size=1, max_size=8), caps, max_size=6)


@settings(max_examples=200, derandomize=True, deadline=None)
@given(
    st.lists(nodes, min_size=1, max_size=3),
    st.integers(0, 2**64 - 1),
    st.text(max_size=30),
)
def test_encoder_equals_the_message_built_field_by_field(epochs, epoch, reason):
    # The same encoder over several epochs: cached key encodings are reused,
    # instances come and go.
    encoder = DirectiveEncoder()
    for caps_by_node in epochs:
        got = encoder.encode_all(epoch, caps_by_node, reason)
        assert sorted(got) == sorted(caps_by_node)
        for node, node_caps in caps_by_node.items():
            want = directive(epoch, node_caps, reason)
            assert got[node] == want
            assert got[node].SerializeToString() == want.SerializeToString()


def test_encoder_keeps_only_current_keys():
    encoder = DirectiveEncoder()
    a, b = InstanceKey("wc", "split", 0), InstanceKey("wc", "count", 1)
    encoder.encode_all(1, {"n1": {a: 0.5, b: 0.25}}, "epoch 1")
    encoder.encode_all(2, {"n1": {b: 0.3}}, "epoch 2")
    assert set(encoder._prefix) == {b}


def test_delivered_without_a_batch_transport_is_set_at_once():
    sessions = AgentSessions()
    got = []
    sessions.attach("n1", got.append)
    res = AgentActuator(sessions).push_caps(3, {"n1": {InstanceKey("a", "o", 0): 1.0}}, "e3")
    assert res.wait_delivered(0)
    assert res.sent == {"n1": 1} and len(got) == 1


def test_delivered_when_the_transport_has_stopped():
    sessions = AgentSessions()
    sessions.attach("n1", lambda msg: None)

    def stopped(fn):
        raise RuntimeError("Event loop is closed")

    sessions.run_batch = stopped
    done = threading.Event()
    assert sessions.send_many({"n1": directive(1, {}, "")}, done) == {"n1"}
    assert done.is_set()


def test_an_epoch_waits_until_its_directive_is_on_the_stream(tmp_path):
    c, server = start(config(tmp_path), loop=False)

    async def scenario(agent: AioAgent) -> None:
        assert (await agent.open()).HasField("welcome")
        key = InstanceKey("wc", "split", 0)
        res = await asyncio.to_thread(
            c.cap_actuator.push_caps, 9, {"n1": {key: 0.75}, "gone": {key: 1.0}}, "epoch 9"
        )
        assert res.delivered is not None
        assert await asyncio.to_thread(res.wait_delivered, 30)
        assert res.sent == {"n1": 1} and res.unreachable == ["gone"]
        msg = await agent.read()
        assert msg.directive.epoch == 9
        assert math.isclose(msg.directive.caps[0].cap_cores, 0.75)

    run_with_agent(c, server, "n1", scenario)
