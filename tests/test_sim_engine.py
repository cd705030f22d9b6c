"""The vectorized cluster: conservation, determinism, pauses, interference, rescaling."""

from __future__ import annotations

import numpy as np
import pytest

from testbed.sim.arrivals import all_arrivals, app_arrivals
from testbed.sim.engine import ClusterSim
from testbed.sim.policies import make_policy
from testbed.sim.run import run_policy
from testbed.sim.scenario import AppSpec, ArrivalSpec, BurstSpec, OperatorSpec, Scenario, seed004


def _chain(
    selectivity: float = 1.0, rate: float = 40.0, nodes: int = 2, epochs: int = 4, **kw
) -> Scenario:
    ops = (
        OperatorSpec("a", 0.004, 0.7),
        OperatorSpec("b", 0.006, 0.7, selectivity=selectivity),
        OperatorSpec("c", 0.003, 0.7, stateful=True),
    )
    apps = tuple(
        AppSpec(f"app{i}", "gold", ops, ArrivalSpec("poisson", rate=rate)) for i in range(3)
    )
    return Scenario(
        "chain", nodes, 1.0, apps, epochs=epochs, epoch_seconds=2.0, step_seconds=0.02, seed=3, **kw
    )


def _layout(sim: ClusterSim, k: int = 2) -> None:
    for op in range(sim.n_ops):
        sim.set_parallelism(op, k, [(op + r) % sim.sc.nodes for r in range(k)])


def test_conservation_every_message_is_counted():
    sc = _chain()
    sim = ClusterSim(sc, max_parallelism=2)
    _layout(sim)
    finished = 0
    for _ in range(sc.epochs):
        sim.run_steps(sc.steps_per_epoch)
        finished += int(sim.take_sinks().count.sum())
        # Nothing appears or vanishes: arrived = finished + waiting, at every epoch.
        assert sim.source_arrivals.sum() == finished + sim.in_system()
    # And per operator: what an operator emitted is what the next one received.
    rec = sim.received.reshape(sim.n_ops, 2).sum(axis=1)
    emi = sim.emitted.reshape(sim.n_ops, 2).sum(axis=1)
    nxt = sim.op_next >= 0
    assert np.array_equal(rec[sim.op_next[nxt]], emi[nxt])
    exe = sim.executed.reshape(sim.n_ops, 2).sum(axis=1)
    assert np.array_equal(rec, exe + sim.queued.reshape(sim.n_ops, 2).sum(axis=1))
    assert finished > 0


def test_conservation_with_selectivity_counts_created_messages():
    sc = _chain(selectivity=2.5)
    sim = ClusterSim(sc, max_parallelism=2)
    _layout(sim)
    sim.run_steps(sc.steps_per_epoch * sc.epochs)
    finished = int(sim.take_sinks().count.sum())
    assert sim.created > 0
    assert sim.source_arrivals.sum() + sim.created == finished + sim.in_system()


def test_same_seed_same_run_and_other_seed_differs():
    def run(seed: int) -> tuple[np.ndarray, np.ndarray]:
        sc = seed004(apps=6, arrivals="poisson", epochs=3, burst_start=1, burst_end=2, seed=seed)
        sim = ClusterSim(sc, max_parallelism=1)
        _layout(sim, 1)
        sim.run_steps(sc.steps_per_epoch * sc.epochs)
        return sim.executed.copy(), sim.latency_sum.copy()

    a, b, c = run(9), run(9), run(10)
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
    assert not np.array_equal(a[0], c[0])


def test_policy_run_is_deterministic():
    sc = seed004(apps=6, arrivals="weibull", epochs=4, burst_start=2, burst_end=3, seed=2)
    r1 = run_policy(sc, make_policy("vpa")).to_json()
    r2 = run_policy(sc, make_policy("vpa")).to_json()
    assert r1 == r2


def test_migration_pauses_longer_for_stateful_instances():
    sc = _chain(migration_pause_s=0.4, stateful_migration_pause_s=1.2)
    sim = ClusterSim(sc, max_parallelism=1)
    _layout(sim, 1)
    sim.run_steps(50)
    stateless, stateful = 0, 2  # operators a and c of app0 (slots = op index here)
    sim.move(stateless, 1 - int(sim.node[stateless]))
    sim.move(stateful, 1 - int(sim.node[stateful]))
    assert sim.reconfigurations == 2
    before = sim.executed.copy()
    sim.run_steps(round(0.4 / sim.dt))  # both paused
    assert sim.executed[stateless] == before[stateless]
    assert sim.executed[stateful] == before[stateful]
    sim.run_steps(round(0.4 / sim.dt))  # only the stateful one still paused
    assert sim.executed[stateless] > before[stateless]
    assert sim.executed[stateful] == before[stateful]
    sim.run_steps(round(1.0 / sim.dt))
    assert sim.executed[stateful] > before[stateful]
    assert sim.queued[stateful] < 50  # it caught up, nothing was dropped


def test_interference_raises_cpu_per_message():
    def cpu_per_message(mbw: float) -> float:
        ops = (OperatorSpec("x", 0.01, 0.5, mbw_per_core=mbw),)
        apps = tuple(
            AppSpec(f"a{i}", "gold", ops, ArrivalSpec("poisson", rate=60.0)) for i in range(2)
        )
        sc = Scenario(
            "mbw",
            1,
            2.0,
            apps,
            epochs=1,
            epoch_seconds=10.0,
            step_seconds=0.02,
            seed=4,
            interference_threshold=0.2,
            interference_slope=2.0,
        )
        sim = ClusterSim(sc, max_parallelism=1)
        _layout(sim, 1)
        sim.run_steps(sc.steps_per_epoch)
        return float(sim.cpu_seconds.sum() / sim.executed.sum())

    quiet, noisy = cpu_per_message(0.0), cpu_per_message(0.9)
    assert quiet == pytest.approx(0.01, rel=0.1)
    assert noisy > 1.3 * quiet


def test_rescale_moves_load_to_new_instances_and_counts_a_reconfiguration():
    sc = _chain()
    sim = ClusterSim(sc, max_parallelism=4)
    _layout(sim, 1)
    sim.run_steps(50)
    sim.set_parallelism(0, 3, [0, 1, 0])
    assert sim.reconfigurations == 1
    before = sim.received.copy()
    sim.run_steps(100)
    got = sim.received[:3] - before[:3]
    assert np.all(got > 0) and got.max() - got.min() <= 2  # even split
    with pytest.raises(ValueError, match="parallelism"):
        sim.set_parallelism(0, 5, [0] * 5)


def test_burst_multiplies_the_arrival_rate():
    app = AppSpec(
        "a",
        "gold",
        (OperatorSpec("x", 0.01),),
        ArrivalSpec("poisson", rate=20.0),
        BurstSpec(10, 20, 3.0),
    )
    t = app_arrivals(app, duration=300.0, epoch_seconds=10.0, seed=1)
    before = np.sum(t < 100) / 100
    after = np.sum(t >= 200) / 100
    assert before == pytest.approx(20.0, rel=0.1)
    assert after == pytest.approx(60.0, rel=0.1)


def test_weibull_and_trace_arrivals_keep_their_mean_rate():
    w = AppSpec(
        "w", "gold", (OperatorSpec("x", 0.01),), ArrivalSpec("weibull", rate=15.0, shape=3.0)
    )
    tr = AppSpec(
        "t", "gold", (OperatorSpec("x", 0.01),), ArrivalSpec("trace", rate=0.0, trace=(5.0, 25.0))
    )
    tw = app_arrivals(w, 200.0, 10.0, seed=2)
    assert len(tw) / 200.0 == pytest.approx(15.0, rel=0.05)
    gaps = np.diff(tw)
    assert gaps.std() / gaps.mean() < 0.5  # shape 3 is more regular than Poisson
    tt = app_arrivals(tr, 40.0, 10.0, seed=3)
    assert np.sum(tt < 10) == pytest.approx(50, abs=25)
    assert np.sum(tt >= 10) == pytest.approx(750, rel=0.15)  # last value held
    sc = Scenario("x", 1, 1.0, (w, tr), epochs=2, epoch_seconds=10.0)
    times, apps = all_arrivals(sc)
    assert np.all(np.diff(times) >= 0) and set(apps.tolist()) == {0, 1}


def test_a_slow_instance_with_merged_backlog_still_finishes_messages_every_epoch():
    # A tight cap and a backlog far beyond the ring: cohorts merge, and the
    # merged cohort must still finish messages steadily rather than all at once.
    sc = _chain(epochs=8)
    sim = ClusterSim(sc, max_parallelism=1)
    _layout(sim, 1)
    sim.set_caps(np.array([0]), np.array([0.01]))  # ~2.5 messages/s against 40/s
    done = []
    for _ in range(sc.epochs):
        before = int(sim.executed[0])
        sim.run_steps(sc.steps_per_epoch)
        done.append(int(sim.executed[0]) - before)
    assert sim.size[0] == 32 and sim.queued[0] > 200  # the ring is full, cohorts merged
    assert min(done[1:]) >= 2 and max(done) <= 15  # about 5 per 2-s epoch


# ------------------------------------------------------------------ live-calibration knobs
def _one_chain(works: tuple[float, ...], **kw) -> ClusterSim:
    ops = tuple(OperatorSpec(f"op{k}", w, 1.0) for k, w in enumerate(works))
    app = AppSpec("cal", "gold", ops, ArrivalSpec("poisson", rate=1.0))
    sc = Scenario("one", 1, 2.0, (app,), epochs=1, epoch_seconds=20.0, step_seconds=0.001, **kw)
    sim = ClusterSim(sc, max_parallelism=1)
    for op in range(sim.n_ops):
        sim.set_parallelism(op, 1, [0])
    return sim


def test_given_arrivals_and_work_sequence_are_served_exactly():
    sim = _one_chain((0.01,))
    sim.set_arrivals(np.array([0.0105, 0.5]), np.array([0, 0]))
    sim.set_work_sequence(0, np.array([0.003, 0.007]))
    sim.run_steps(1000)
    rec = sim.take_sinks()
    assert rec.count.tolist() == [1, 1]
    assert rec.latency_s == pytest.approx([0.003, 0.007], abs=1e-9)
    assert sim.cpu_seconds[0] == pytest.approx(0.010, abs=1e-12)
    sim.run_steps(10)
    with pytest.raises(ValueError, match="before the first step"):
        sim.set_arrivals(np.array([1.0]), np.array([0]))


def test_an_exhausted_work_sequence_is_an_error_not_a_silent_draw():
    sim = _one_chain((0.01,))
    sim.set_arrivals(np.array([0.01, 0.02]), np.array([0, 0]))
    sim.set_work_sequence(0, np.array([0.001]))
    with pytest.raises(RuntimeError, match="work sequence of 1 messages exhausted"):
        sim.run_steps(30)


def test_handoff_delays_every_hop_source_included():
    sim = _one_chain((0.01, 0.01), handoff_s=0.002)
    sim.set_arrivals(np.array([0.0104]), np.array([0]))
    sim.set_work_sequence(0, np.array([0.003]))
    sim.set_work_sequence(1, np.array([0.005]))
    sim.run_steps(100)
    rec = sim.take_sinks()
    assert rec.latency_s == pytest.approx([0.003 + 0.005 + 2 * 0.002], abs=1e-9)


def _saturated(cap: float, **kw) -> ClusterSim:
    """One instance with far more work than its cap lets it do."""
    sim = _one_chain((1.0,), **kw)
    sim.set_arrivals(np.array([0.0]), np.array([0]))
    sim.set_work_sequence(0, np.array([100.0]))
    sim.set_caps(np.array([0]), np.array([cap]))
    return sim


def _cpu_at(sim: ClusterSim, t: float) -> float:
    sim.run_steps(round((t - sim.t) / sim.dt))
    return float(sim.cpu_seconds[0])


def test_period_phase_moves_the_quota_refill():
    aligned, shifted = _saturated(0.2), _saturated(0.2)
    shifted.set_period_phase(np.array([0]), np.array([0.05]))
    # Both spend 20 ms of quota first; the shifted group gets its next 20 ms at 50 ms.
    assert _cpu_at(aligned, 0.07) == pytest.approx(0.02, abs=1e-9)
    assert _cpu_at(shifted, 0.07) == pytest.approx(0.04, abs=1e-9)
    assert _cpu_at(aligned, 0.12) == pytest.approx(0.04, abs=1e-9)


def test_tick_enforcement_overruns_to_the_next_tick_and_repays_it():
    exact = _saturated(0.5)
    ticked = _saturated(0.5, cfs_tick_s=0.004)
    ticked.set_tick_phase(0.001)
    # The quota runs out at 50 ms; the next tick is at 53 ms.
    assert _cpu_at(exact, 0.1) == pytest.approx(0.050, abs=1e-9)
    assert _cpu_at(ticked, 0.1) == pytest.approx(0.053, abs=1e-9)
    assert ticked.throttle_at[0] == pytest.approx(0.053)
    # The 3 ms overrun comes out of the next period: 47 ms of quota, run to the tick at 149 ms.
    assert _cpu_at(ticked, 0.2) == pytest.approx(0.053 + 0.049, abs=1e-9)
    # In the long run the cap holds.
    assert _cpu_at(ticked, 10.0) / 10.0 == pytest.approx(0.5, rel=0.01)


def test_a_thread_that_slept_after_its_quota_ran_out_waits_for_the_next_period():
    sim = _one_chain((0.01,), cfs_tick_s=0.004)
    sim.set_arrivals(np.array([0.0, 0.006]), np.array([0, 0]))
    sim.set_work_sequence(0, np.array([0.0055, 0.001]))
    sim.set_caps(np.array([0]), np.array([0.05]))
    sim.run_steps(200)
    rec = sim.take_sinks()
    # The first message overruns the 5 ms quota up to its own end (before the tick at
    # 8 ms); the second wakes the thread at 6 ms, is throttled at once and runs at 100 ms.
    assert rec.latency_s == pytest.approx([0.0055, 0.101 - 0.006], abs=1e-9)


def test_work_sequence_and_phase_arguments_are_checked():
    sim = _one_chain((0.01,))
    with pytest.raises(ValueError, match="work_s"):
        sim.set_work_sequence(0, np.array([0.1, -0.1]))
    with pytest.raises(ValueError, match="op must be"):
        sim.set_work_sequence(5, np.array([0.1]))
    with pytest.raises(ValueError, match="sorted"):
        sim.set_arrivals(np.array([0.2, 0.1]), np.array([0, 0]))
    with pytest.raises(ValueError, match="arrival app"):
        sim.set_arrivals(np.array([0.1]), np.array([3]))
    with pytest.raises(ValueError, match="phase_s"):
        sim.set_period_phase(np.array([0]), np.array([np.nan]))
