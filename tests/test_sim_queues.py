"""The simulator's queues against closed forms: M/M/1 and M/M/c mean waits.

The exact discrete-event path (testbed.sim.des) is checked message by message
on long runs; the vectorized cluster (testbed.sim.engine) is checked on many
independent M/M/1 queues at once, and its CFS-like CPU sharing on small cases
whose answer is known exactly.
"""

from __future__ import annotations

import numpy as np
import pytest

from predict.queueing import erlang_c_wait
from testbed.sim.des import fcfs_queue, mmc
from testbed.sim.engine import ClusterSim, fair_level, waterfill
from testbed.sim.scenario import AppSpec, ArrivalSpec, OperatorSpec, Scenario


def test_des_mm1_mean_wait_matches_closed_form():
    lam, mu = 0.5, 1.0
    run = mmc(lam, mu, servers=1, customers=300_000, seed=11)
    expected = lam / (mu * (mu - lam))  # Wq of M/M/1
    assert run.waits.mean() == pytest.approx(expected, rel=0.05)
    assert run.sojourns.mean() == pytest.approx(1 / (mu - lam), rel=0.05)


@pytest.mark.parametrize(("servers", "utilization"), [(2, 0.6), (4, 0.7)])
def test_des_mmc_mean_wait_matches_erlang_c(servers, utilization):
    mu = 1.0
    lam = utilization * servers * mu
    run = mmc(lam, mu, servers=servers, customers=300_000, seed=5)
    assert run.waits.mean() == pytest.approx(erlang_c_wait(lam, mu, servers), rel=0.05)


def test_des_fcfs_small_case_by_hand():
    run = fcfs_queue(np.array([0.0, 0.0, 1.0]), np.array([2.0, 1.0, 1.0]), servers=2)
    assert run.starts.tolist() == [0.0, 0.0, 1.0]
    assert run.departures.tolist() == [2.0, 1.0, 2.0]


def test_des_rejects_bad_input():
    with pytest.raises(ValueError, match="servers"):
        fcfs_queue(np.array([0.0]), np.array([1.0]), servers=0)
    with pytest.raises(ValueError, match="sorted"):
        fcfs_queue(np.array([1.0, 0.0]), np.array([1.0, 1.0]), servers=1)
    with pytest.raises(ValueError, match="arrival_rate"):
        mmc(-1.0, 1.0, 1, 10)


def _independent_mm1(queues: int, lam: float, work: float, epochs: int, step: float) -> Scenario:
    apps = tuple(
        AppSpec(
            f"q{i:03d}", "gold", (OperatorSpec("op", work, 1.0),), ArrivalSpec("poisson", rate=lam)
        )
        for i in range(queues)
    )
    return Scenario(
        "mm1", queues, 1.0, apps, epochs=epochs, epoch_seconds=50.0, step_seconds=step, seed=2
    )


def test_engine_mm1_mean_sojourn_matches_closed_form():
    # 100 independent M/M/1 queues (one single-core node each), rho = 0.5.
    lam, work = 1.25, 0.4
    sc = _independent_mm1(100, lam, work, epochs=9, step=0.1)
    sim = ClusterSim(sc, max_parallelism=1)
    for op in range(sim.n_ops):
        sim.set_parallelism(op, 1, [op])
    sim.run_steps(sc.steps_per_epoch * sc.epochs)
    rec = sim.take_sinks()
    assert rec.count.sum() > 50_000
    mean = float((rec.latency_s * rec.count).sum() / rec.count.sum())
    assert mean == pytest.approx(1.0 / (1.0 / work - lam), rel=0.05)


def test_fair_level_is_max_min_fair():
    want = np.array([0.1, 1.0, 1.0, 0.3, 0.3])
    node = np.array([0, 0, 0, 1, 1])
    cores = np.array([1.0, 1.0])
    # Node 0 is over-committed: 0.1 is satisfied, the other two split 0.9.
    assert waterfill(want, node, cores) == pytest.approx([0.1, 0.45, 0.45, 0.3, 0.3])
    assert np.isinf(fair_level(want, node, cores)[1])


def test_engine_cfs_sharing_and_caps_on_one_core():
    # Two always-busy instances on one core: uncapped they split it; a cap binds.
    apps = tuple(
        AppSpec(f"a{i}", "gold", (OperatorSpec("op", 10.0, 0.0),), ArrivalSpec("poisson", rate=5.0))
        for i in range(2)
    )
    sc = Scenario("cfs", 1, 1.0, apps, epochs=1, epoch_seconds=10.0, step_seconds=0.05, seed=1)
    sim = ClusterSim(sc, max_parallelism=1)
    sim.set_parallelism(0, 1, [0])
    sim.set_parallelism(1, 1, [0])
    sim.run_steps(20)  # let both build a backlog
    before = sim.cpu_seconds.copy()
    sim.run_steps(100)
    assert (sim.cpu_seconds - before) == pytest.approx([2.5, 2.5], rel=0.02)
    sim.set_caps(np.array([0]), np.array([0.2]))
    before = sim.cpu_seconds.copy()
    sim.run_steps(100)
    assert (sim.cpu_seconds - before) == pytest.approx([1.0, 4.0], rel=0.02)
    assert sim.throttled_seconds[0] > 0 and sim.throttled_seconds[1] == 0
