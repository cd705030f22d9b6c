"""Peer sizing policies (controller/peers): the pure rules, the policies over views,
the epoch that turns their wishes into caps, the config key that picks one, and
the simulator's baselines calling the same rules."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.config import ControllerConfig
from controller.core import Controller
from controller.daemon import main as controller_main
from controller.memory import ControllerMemory
from controller.peers import PEERS, POLICIES, rules
from controller.peers.epoch import bound_and_fit, run_peer_epoch
from controller.peers.policies import (
    Ds2Sizing,
    ErrSizing,
    PeerState,
    SizingInputs,
    UtilTargetSizing,
    VpaSizing,
    Wish,
)
from controller.qos import default_qos_classes
from controller.stages.evaluate import OperatorView
from dsched.config import ConfigError, load_config
from dsched.ids import InstanceKey, OperatorKey
from tests.test_controller_epoch import SyntheticNode, config, run

# ------------------------------------------------------------------ the rules


def test_true_processing_rate_is_unknown_without_useful_time():
    rate = rules.true_processing_rate(np.array([100.0, 0.0, 50.0]), np.array([0.5, 0.0, 0.0]))
    assert rate[0] == pytest.approx(200.0) and math.isinf(rate[1]) and math.isinf(rate[2])
    # Unknown rate: the fallback; known: target over rate.
    ratio = rules.ds2_ratio(np.array([300.0, 300.0]), rate[:2], np.array([7.0, 7.0]))
    assert ratio.tolist() == pytest.approx([1.5, 7.0])


def test_err_threads_by_class_and_the_lowest_for_an_unknown_class():
    assert [rules.err_threads(c) for c in ("gold", "silver", "bronze")] == [8, 4, 2]
    assert rules.err_threads("platinum") == 2


def test_vpa_buckets_grow_by_the_ratio_and_reach_the_top():
    b = rules.vpa_buckets(0.01, 1.05, 1.0)
    assert b[0] == pytest.approx(0.01) and b[-1] >= 1.0 > b[-2]
    assert np.allclose(b[1:] / b[:-1], 1.05)
    with pytest.raises(ValueError):
        rules.vpa_buckets(0.0, 1.05, 1.0)


def test_decaying_histogram_forgets_with_its_half_life():
    buckets = rules.vpa_buckets(0.001, 1.05, 1.0)
    decay = rules.decay_per_epoch(2.0)
    hist = rules.histogram_add(np.zeros((1, len(buckets))), np.array([0.5]), buckets, decay)
    for _ in range(2):
        hist = rules.histogram_add(hist, np.array([0.1]), buckets, decay)
    # The 0.5 sample is two epochs (one half-life) old: weight 0.5.
    assert hist[0, np.searchsorted(buckets, 0.5)] == pytest.approx(0.5)
    rec = rules.vpa_recommendation(hist, buckets, 0.9, 0.15, 0.0)[0]
    assert rec == pytest.approx(buckets[np.searchsorted(buckets, 0.5)] * 1.15)


usages = st.lists(st.floats(0.0, 1.0, allow_nan=False), min_size=1, max_size=30)


@given(usages, st.data())
@settings(max_examples=60, deadline=None)
def test_vpa_percentile_is_monotone_in_the_history(history, data):
    """A history whose every sample is at least as high never recommends less."""
    higher = [
        min(1.0, u + data.draw(st.floats(0.0, 0.5, allow_nan=False), label="rise")) for u in history
    ]
    buckets = rules.vpa_buckets(0.001, 1.05, 1.0)
    decay = rules.decay_per_epoch(6.0)
    a = b = np.zeros((1, len(buckets)))
    for lo, hi in zip(history, higher, strict=True):
        a = rules.histogram_add(a, np.array([lo]), buckets, decay)
        b = rules.histogram_add(b, np.array([hi]), buckets, decay)
    for q in (0.5, 0.9, 0.99):
        assert (
            rules.histogram_percentile(a, buckets, q)[0]
            <= rules.histogram_percentile(b, buckets, q)[0]
        )


@given(
    st.integers(1, 6),
    st.lists(st.floats(0.01, 0.99, allow_nan=False), min_size=1, max_size=20),
)
@settings(max_examples=60, deadline=None)
def test_util_target_does_not_scale_down_before_its_window(window, fractions):
    """Wanting less every epoch, the size stays until the window has passed since
    the last change and the fall has been wanted for a whole window."""
    current, last, below = 1.0, 0, 0
    for epoch, f in enumerate(fractions, start=1):
        s = rules.stabilise(
            np.array([f * current]),
            np.array([current]),
            epoch,
            np.array([last]),
            np.array([below]),
            window,
        )
        new = float(s.value[0])
        if epoch - last < window or int(s.below[0]) < window:
            assert new == current
        else:
            assert new == pytest.approx(f * current)
        if new != current:
            assert int(s.last_change[0]) == epoch
        current, last, below = new, int(s.last_change[0]), int(s.below[0])


def test_util_target_rises_once_the_window_after_a_change_has_passed():
    s = rules.stabilise(np.array([2.0]), np.array([1.0]), 5, np.array([4]), np.array([0]), 3)
    assert s.value[0] == 1.0  # one epoch after the last change
    s = rules.stabilise(np.array([2.0]), np.array([1.0]), 7, np.array([4]), np.array([0]), 3)
    assert s.value[0] == 2.0 and s.last_change[0] == 7
    with pytest.raises(ValueError):
        rules.util_target_want(np.array([0.5]), 0.0)


# ------------------------------------------------------------------ policies over views


def _view(
    op: str,
    upstream: tuple[str, ...],
    instances: int,
    *,
    rate: float,
    kappa: float,
    selectivity: float = 1.0,
    usage: list[float] | None = None,
    node: str = "n1",
    slots: int = 3,
) -> OperatorView:
    keys = [InstanceKey("wc", op, i) for i in range(instances)]
    per = rate * kappa / instances
    use = usage or [per] * instances
    ones = np.ones(slots)
    return OperatorView(
        key=OperatorKey("wc", op),
        instances=keys,
        nodes=dict.fromkeys(keys, node),
        stateful=False,
        upstream=upstream,
        seconds=ones.copy(),
        arrivals=ones * rate,
        executed=ones * rate,
        emitted=ones * rate * selectivity,
        cpu_seconds=ones * sum(use),
        queue=np.zeros(slots),
        queue_by_instance=dict.fromkeys(keys, 0.0),
        usage_by_instance=dict(zip(keys, use, strict=True)),
        cap_by_instance=dict.fromkeys(keys),
        throttled_by_instance=dict.fromkeys(keys),
        latency_ms=None,
        service_ms=None,
        last_timestamp=float(slots),
    )


def _wordcount(rate: float = 100.0) -> dict[OperatorKey, OperatorView]:
    views = [
        _view("source", (), 2, rate=rate, kappa=0.001, selectivity=1.0),
        _view("split", ("source",), 2, rate=rate, kappa=0.002, selectivity=5.0),
        _view("count", ("split",), 4, rate=5 * rate, kappa=0.0003, selectivity=0.0),
    ]
    return {v.key: v for v in views}


def _inputs(views, memory=None, epoch=1, cls="bronze", capacity=4.0) -> SizingInputs:
    return SizingInputs(
        epoch=epoch,
        views=views,
        classes={"wc": default_qos_classes()[cls]},
        capacity={"n1": capacity},
        memory=memory or {},
        kappa={},
        max_instance_cores=1.0,
        min_cap_cores=0.01,
    )


def test_ds2_carries_the_source_rate_down_through_selectivity():
    views = _wordcount(rate=100.0)
    targets = Ds2Sizing().target_rates(views)
    assert targets[OperatorKey("wc", "split")] == pytest.approx(100.0)
    assert targets[OperatorKey("wc", "count")] == pytest.approx(500.0)
    wishes = Ds2Sizing().size(_inputs(views))
    # Cores = target rate x CPU per tuple, spread over the instances.
    assert wishes[InstanceKey("wc", "split", 0)].cores == pytest.approx(100 * 0.002 / 2)
    assert wishes[InstanceKey("wc", "count", 3)].cores == pytest.approx(500 * 0.0003 / 4)


def test_ds2_sizes_for_the_source_rate_not_for_a_throttled_child():
    # split ran at half the source's rate (throttled): DS2 sizes it for the full rate.
    views = _wordcount(rate=100.0)
    k = OperatorKey("wc", "split")
    views[k] = _view("split", ("source",), 2, rate=50.0, kappa=0.002, selectivity=5.0)
    wishes = Ds2Sizing().size(_inputs(views))
    assert wishes[InstanceKey("wc", "split", 1)].cores == pytest.approx(100 * 0.002 / 2)


def test_util_target_sizes_busy_time_at_07_and_holds_within_the_window():
    views = _wordcount(rate=100.0)
    first = UtilTargetSizing().size(_inputs(views, epoch=1))
    key = InstanceKey("wc", "split", 0)
    assert first[key].cores == pytest.approx(100 * 0.002 / 2 / 0.7)
    memory = {k: w.state._replace(cap=w.cores) for k, w in first.items()}
    # Load falls by half: nothing moves until three epochs after the change
    # and three epochs of wanting less.
    low = _wordcount(rate=50.0)
    caps = []
    for epoch in range(2, 8):
        wishes = UtilTargetSizing().size(_inputs(low, memory, epoch=epoch))
        caps.append(wishes[key].cores)
        memory = {k: w.state._replace(cap=w.cores) for k, w in wishes.items()}
    assert caps[:2] == pytest.approx([first[key].cores] * 2)
    assert caps[-1] == pytest.approx(50 * 0.002 / 2 / 0.7)


def test_vpa_keeps_a_histogram_per_instance_between_epochs():
    views = _wordcount()
    skewed = _view("count", ("split",), 4, rate=500, kappa=0.0003, usage=[0.3, 0.01, 0.01, 0.01])
    views[skewed.key] = skewed
    wishes = VpaSizing().size(_inputs(views))
    hot, cold = InstanceKey("wc", "count", 0), InstanceKey("wc", "count", 1)
    assert wishes[hot].cores > 10 * wishes[cold].cores
    assert wishes[hot].cores == pytest.approx(0.3 * 1.15, rel=0.06)
    assert wishes[hot].state.histogram.sum() == pytest.approx(1.0)
    memory = {k: w.state for k, w in wishes.items()}
    again = VpaSizing().size(_inputs(views, memory, epoch=2))
    assert again[hot].state.histogram.sum() == pytest.approx(1.0 + 0.5 ** (1 / 6))


@pytest.mark.parametrize(("cls", "threads"), [("gold", 8), ("silver", 4), ("bronze", 2)])
def test_err_gives_each_operator_its_class_threads(cls, threads):
    wishes = ErrSizing().size(_inputs(_wordcount(), cls=cls))
    assert wishes[InstanceKey("wc", "count", 0)].cores == pytest.approx(threads / 4)
    assert wishes[InstanceKey("wc", "source", 0)].cores == pytest.approx(threads / 2)


def test_bound_and_fit_scales_a_full_node_and_respects_the_bounds():
    keys = [InstanceKey("a", "o", i) for i in range(3)]
    wishes = {k: Wish(c, PeerState()) for k, c in zip(keys, [0.0, 1.5, float("nan")], strict=True)}
    caps, cut = bound_and_fit(
        wishes,
        dict.fromkeys(keys, "n1"),
        {"n1": 1.2},
        {"n1": 0.2},
        0.05,
        1.0,
        dict.fromkeys(keys, 0.4),
    )
    # 0 -> the floor, 1.5 -> one instance's most, NaN -> the cap in force; then
    # the node's 1.0 left by the held caps.
    assert sum(caps.values()) == pytest.approx(1.0)
    assert caps[keys[1]] / caps[keys[2]] == pytest.approx(1.0 / 0.4)
    # The floor stays whole; the others give up what the node lacks.
    assert caps[keys[0]] == 0.05 and cut[keys[0]] == 0
    assert cut[keys[1]] > 0 and cut[keys[2]] > 0


def _memory_view(states=None):
    memory = ControllerMemory(forget_after_slots=6)
    memory.hysteresis = dict(states or {})
    return memory.view()


@pytest.mark.parametrize("policy", PEERS)
@given(
    rate=st.floats(0.0, 5000.0, allow_nan=False),
    capacity=st.floats(0.1, 8.0, allow_nan=False),
    usage=st.lists(st.floats(0.0, 4.0, allow_nan=False), min_size=4, max_size=4),
)
@settings(max_examples=25, deadline=None)
def test_every_peer_cap_lies_in_zero_to_node_cores(policy, rate, capacity, usage):
    from controller.epoch import EpochInputs

    views = _wordcount(rate)
    count = _view("count", ("split",), 4, rate=5 * rate, kappa=0.0003, usage=usage)
    views[count.key] = count
    cfg = ControllerConfig(policy=policy, min_cap_cores=0.01)
    states: dict = {}
    for epoch in range(1, 4):
        inputs = EpochInputs(
            epoch=epoch,
            now=float(epoch),
            views=views,
            classes={"wc": default_qos_classes()["gold"]},
            capacity={"n1": capacity},
        )
        result = run_peer_epoch(inputs, _memory_view(states), cfg)
        caps = [c for _, c in result.caps.values()]
        assert len(caps) == 8
        assert all(0 < c <= min(capacity, cfg.max_instance_cores) + 1e-9 for c in caps)
        # The node's caps fit in it (the floor aside).
        assert sum(caps) <= max(capacity, 8 * cfg.min_cap_cores) + 1e-9
        states = {k: s.state for k, s in result.steps.items()}


# ------------------------------------------------------------------ config and controller


def test_unknown_policy_is_refused_naming_the_key_and_the_known_names(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('policy = "ds3"\n')
    with pytest.raises(ConfigError) as err:
        load_config(ControllerConfig, path)
    assert err.value.key == "policy"
    for name in ("dsched", *PEERS):
        assert name in str(err.value)
    assert POLICIES.names() == sorted(["dsched", *PEERS])


def test_unknown_policy_fails_the_daemon_at_startup(tmp_path, capsys):
    path = tmp_path / "c.toml"
    path.write_text(f'state_dir = "{tmp_path}"\npolicy = "kubernetes"\n')
    assert controller_main(["--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert "policy" in err and "kubernetes" in err and "util-target" in err


@pytest.mark.parametrize("policy", PEERS)
def test_a_peer_drives_the_controllers_caps_and_records(tmp_path, policy):
    """The whole controller under a peer: reports in, the peer's caps committed and
    recorded with its name, its memory carried from epoch to epoch."""
    clock = [1_000_000.0]
    cfg = config(tmp_path, policy=policy, mode="enforce", node_capacity_cores={"n1": 2.0})
    c = Controller(cfg, clock=lambda: clock[0])
    try:
        node = SyntheticNode(c)
        rec = run(c, node, clock, 5, {"wc": 100.0})
        rec = run(c, node, clock, 6, {"wc": 300.0})
        assert rec["instances"] and {i["demand_reason"] for i in rec["instances"]} == {policy}
        assert {o["predictor"] for o in rec["operators"]} == {policy}
        assert all(0 < i["cap_cores"] <= 1.0 for i in rec["instances"])
        assert sum(i["cap_cores"] for i in rec["instances"]) <= 2.0 + 1e-9
        assert any(policy in n for n in rec["notes"])
        # The peer's state is in the controller's memory, and the caps in force too.
        states = list(c.memory.hysteresis.values())
        assert states and all(isinstance(s, PeerState) for s in states)
        assert {k.id: cap for k, (_, cap) in c.memory.caps.items()} == {
            f"{i['app']}/{i['operator']}/{i['instance']}": i["cap_cores"] for i in rec["instances"]
        }
        if policy == "vpa":
            assert all(s.histogram is not None and s.histogram.sum() > 1 for s in states)
        if policy in ("ds2", "util-target", "vpa"):
            split = next(i for i in rec["instances"] if i["operator"] == "split")
            # More load, a larger cap than the 100/s epochs' (split: 1 ms per tuple).
            assert split["cap_cores"] > 0.1
    finally:
        c.stop()


def test_dsched_policy_is_the_default_and_keeps_its_pipeline(tmp_path):
    clock = [1_000_000.0]
    cfg = config(tmp_path)
    assert cfg.policy == "dsched"
    c = Controller(cfg, clock=lambda: clock[0])
    try:
        rec = run(c, SyntheticNode(c), clock, 4, {"wc": 100.0})
        assert {o["predictor"] for o in rec["operators"]} <= {"linear_trend", "dag"}
        assert not any(isinstance(s, PeerState) for s in c.memory.hysteresis.values())
    finally:
        c.stop()


def test_a_restart_under_a_peer_resumes_its_caps_and_starts_its_memory_afresh(tmp_path):
    from dsched_pb import dsched_pb2 as pb

    clock = [1_000_000.0]
    cfg = config(tmp_path, policy="vpa", mode="enforce", node_capacity_cores={"n1": 2.0})
    c = Controller(cfg, clock=lambda: clock[0])
    node = SyntheticNode(c)
    before = run(c, node, clock, 4, {"wc": 200.0})
    c.stop()
    c = Controller(cfg, clock=lambda: clock[0])
    try:
        node.controller = c
        c.on_hello(pb.Hello(node_id="n1", cpu_capacity_cores=2.0, slot_seconds=1.0))
        # The persisted caps are in force before any report (plain caps, no histogram).
        assert {k.id: cap for k, (_, cap) in c.memory.caps.items()} == {
            f"{i['app']}/{i['operator']}/{i['instance']}": i["cap_cores"]
            for i in before["instances"]
        }
        after = run(c, node, clock, 3, {"wc": 200.0})
        assert after["instances"] and {i["demand_reason"] for i in after["instances"]} == {"vpa"}
        assert all(isinstance(s, PeerState) for s in c.memory.hysteresis.values())
    finally:
        c.stop()


# ------------------------------------------------------------------ the simulator


@pytest.mark.parametrize(
    ("policy", "rule"),
    [
        ("ds2", "ds2_ratio"),
        ("util-target", "stabilise"),
        ("vpa", "histogram_add"),
        ("vpa", "vpa_recommendation"),
        ("err", "err_threads"),
    ],
)
def test_the_simulators_baselines_call_the_shared_rules(monkeypatch, policy, rule):
    from testbed.sim.policies import make_policy
    from testbed.sim.run import run_policy
    from testbed.sim.scenario import seed004

    calls = []
    real = getattr(rules, rule)

    def spy(*args, **kw):
        calls.append(args)
        return real(*args, **kw)

    monkeypatch.setattr(rules, rule, spy)
    sc = seed004(apps=2, arrivals="poisson", epochs=2, burst_start=1, burst_end=2, seed=1)
    run_policy(sc, make_policy(policy))
    assert calls, f"the simulated {policy} did not call rules.{rule}"
