"""One epoch, end to end, in the order docs/architecture.md ("One epoch through
the files") tells it: a real thread's NodeReport to the CapDirective its agent
receives, and from there to the cgroup write. The files it passes, in order:

    agent/node.py, agent/reporter.py        the NodeReport of one slot
    controller/core.py                      on_report, run_epoch: the edges
    controller/epoch.py                     the pure epoch (stages/ behind it)
    controller/edges/actuators.py           the CapDirective per node
    agent/directives.py, agent/enforcer.py  directive -> checked cap -> cgroup

Real parts: a real thread, a real cgroup v1 tree, the real controller with a
real SQLite store; only the gRPC stream is left out (a sender stands in for it;
tests/test_controller_epoch.py runs the same over real gRPC).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from agent.config import AgentConfig
from agent.node import NodeAgent
from agent.registry import Counters
from controller.config import ControllerConfig
from controller.core import Controller
from dsched.ids import InstanceKey
from tests.test_agent_support import WorkerThread, release_tree, unique_root

pytestmark = pytest.mark.cgroups


def test_one_epoch_from_report_to_cgroup_write(tmp_path, cgroup_v1_cpu: Path):
    root = unique_root()
    agent = NodeAgent(
        AgentConfig(
            node_id="n1", cgroup_mode="v1", cgroup_mount=str(cgroup_v1_cpu), cgroup_root=root
        )
    )
    thread = WorkerThread(busy=True)
    controller = Controller(
        ControllerConfig(
            state_dir=tmp_path / "state",
            slot_seconds=1.0,
            mode="enforce",
            placement="none",
            predictors=["linear_trend", "dag"],
        )
    )
    controller.config.history.enabled = False
    try:
        # 1. The instance registers its thread and counts its tuples.
        key = InstanceKey("wc", "count", 0)
        agent.register("wc", "count", 0, "w1", True, os.getpid(), thread.tid)
        # 2. The agent says hello; the controller gives a sender for its directives.
        controller.on_hello(agent.hello())
        received = []
        controller.sessions.attach("n1", received.append)
        # 3. Two slots of reports: counters become per-slot deltas.
        for processed in (0, 500):
            counters = dict.fromkeys(Counters._fields, 0)
            counters.update(received=processed, executed=processed, emitted=processed)
            agent.update("wc", "count", 0, counters)
            agent.sample()
            time.sleep(0.2)
            agent.sample()
            report = agent.report()
            assert report.node_id == "n1" and len(report.instances) == 1
            controller.on_report(report)
        # 4. One epoch: the pure pipeline decides, the memory takes the result.
        record = controller.run_epoch()
        (row,) = record["instances"]
        cap = row["cap_cores"]
        assert (row["app"], row["operator"], row["instance"]) == key
        assert cap > 0 and controller.memory.caps[key] == ("n1", cap)
        # 5. In enforce mode the actuator sent one CapDirective to node n1.
        (message,) = received
        directive = message.directive
        assert directive.epoch == controller.epoch
        (entry,) = directive.caps
        assert (entry.key.app, entry.key.operator, entry.key.instance) == key
        assert entry.cap_cores == pytest.approx(cap)
        # 6. The agent checks it and writes the cgroup.
        ack = agent.handle_directive(directive)
        assert not ack.rejected
        path = agent.cgroups[key]
        period = int((path / "cpu.cfs_period_us").read_text())
        assert int((path / "cpu.cfs_quota_us").read_text()) == round(cap * period)
        assert str(thread.tid) in (path / "tasks").read_text().split()
        controller.on_ack("n1", ack)
    finally:
        controller.stop()
        thread.join()
        agent.close()
        release_tree(cgroup_v1_cpu, root)
