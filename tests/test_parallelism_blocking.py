"""A blocking parallelism actuator (the live testbed's: a stateful rescale pauses
its operator for seconds) runs off the epoch's thread; its outcome reaches the
record of the first epoch after it finished, and changes decided meanwhile wait."""

from __future__ import annotations

import threading

from testbed.sim.engine import ClusterSim
from testbed.sim.parallelism import SimParallelism
from testbed.sim.policies import DschedPolicy
from tests.test_parallelism import overloaded, run_epochs


class HeldActuator:
    """The simulator's actuator behind a gate the test opens; blocking, as the testbed's."""

    name = "held"
    blocking = True

    def __init__(self, inner: SimParallelism):
        self.inner = inner
        self.release = threading.Event()
        self.threads: list[str] = []

    def apply(self, changes):
        self.threads.append(threading.current_thread().name)
        assert self.release.wait(30), "never released"
        return self.inner.apply(changes)


def test_a_blocking_actuator_runs_off_the_epoch_and_reports_when_done():
    sc = overloaded(epochs=8)
    policy = DschedPolicy(max_parallelism=4, config_overrides={"latency_criterion": "quantile"})
    sim = ClusterSim(sc, max_parallelism=4)
    policy.setup(sim)
    edge = policy.controller.parallelism
    held = HeldActuator(SimParallelism(sim, policy.agents))
    edge.use(held)
    try:
        records = []
        for _ in range(4):
            run_epochs(sc, sim, policy, 1)
            records.append(policy.controller.last_record["parallelism"])
            if any(r["outcome"] == "started" for r in records[-1]["operators"]):
                break
        started = [r for r in records[-1]["operators"] if r["outcome"] == "started"]
        assert started, records
        # The epoch went on: the counts are unchanged while the change is held.
        assert (sim.op_k == 1).all() and not held.release.is_set()
        run_epochs(sc, sim, policy, 1)
        waiting = policy.controller.last_record["parallelism"]["operators"]
        assert any("still being carried out" in r["outcome"] for r in waiting), waiting
        assert "completed" not in policy.controller.last_record["parallelism"]
        held.release.set()
        assert edge.wait(30)
        run_epochs(sc, sim, policy, 1)
        rec = policy.controller.last_record["parallelism"]
        done = {(r["app"], r["operator"]): r["outcome"] for r in rec["completed"]["operators"]}
        assert done and set(done.values()) == {"done"}, rec["completed"]
        assert {(r["app"], r["operator"]) for r in started} == set(done)
        assert (sim.op_k >= 1).all() and sim.op_k.max() >= 2
        assert held.threads and all(t.startswith("dsched-parallelism") for t in held.threads)
        assert edge.changes == len(done)
        assert not policy.failed_epochs
    finally:
        held.release.set()
        policy.close()
