"""The distributed testbed with each instance's CPU work in a process of its own.

Real worker processes, real CPU-worker processes, real agents' registration
sockets: the thread registered (and so capped) for an instance must be its CPU
worker, a child of the instance's worker process; a move must stop the old
one and register a new one on the target node; nothing is lost or duplicated,
and no CPU worker outlives the topology.
"""

from __future__ import annotations

import os
import time
from contextlib import ExitStack

import pytest

from dsched.ids import InstanceKey
from testbed.live.distributed import DistributedTopology
from testbed.live.wordcount import WORDS_PER_SENTENCE, wordcount
from tests.test_agent_support import node_agents, wait_for
from tests.test_live_placement_migration import _move, _plan

pytestmark = pytest.mark.slow

APP = "wc"
RATE = 80.0


def _parent(pid: int) -> int:
    # /proc/PID/stat: "pid (comm) state ppid ...", comm may hold spaces.
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def _alive(pid: int) -> bool:
    return os.path.exists(f"/proc/{pid}")


def test_cpu_workers_are_registered_move_with_their_instance_and_end_with_it(tmp_path):
    with ExitStack() as stack:
        agents = node_agents(stack, tmp_path)
        topo = DistributedTopology(
            wordcount(app=APP, parallelism=2, split_ms=0.5),
            lambda t: RATE,
            nodes={n: path for n, (_, path) in agents.items()},
            checkpoint_seconds=0.3,
            cpu="process",
        )
        topo.start()
        stopped = False
        try:
            time.sleep(0.8)
            view = topo.active()
            assert len(view) == 6
            pids = {}
            for (op, index), (worker, node, pid, tid) in view.items():
                handle = topo.workers[worker]
                # One single-threaded process per instance, started by its worker.
                assert pid == tid and pid != handle.pid
                assert _parent(pid) == handle.pid
                rec = agents[node][0].registry.get(InstanceKey(APP, op, index))
                assert rec is not None and rec.tids == {pid}
                pids[(op, index)] = pid
            assert len(set(pids.values())) == 6

            result = topo.migrate(
                _plan(_move(f"{APP}/split/0", "n1", "n2"), _move(f"{APP}/count/0", "n1", "n2"))
            )
            assert sorted(result.moved) == [f"{APP}/count/0", f"{APP}/split/0"]
            n1, n2 = agents["n1"][0], agents["n2"][0]
            for ref in (("split", 0), ("count", 0)):
                worker, node, pid, tid = topo.active()[ref]
                assert node == "n2" and pid == tid and pid != pids[ref]
                assert _parent(pid) == topo.workers[worker].pid
                assert wait_for(lambda ref=ref: not _alive(pids[ref]), timeout=10)
                key = InstanceKey(APP, *ref)
                assert wait_for(
                    lambda key=key, pid=pid: (
                        (rec := n2.registry.get(key)) is not None and rec.tids == {pid}
                    ),
                    timeout=10,
                )
                assert wait_for(lambda key=key: n1.registry.get(key) is None, timeout=10)
            time.sleep(0.8)  # tuples flow through the moved instances' CPU workers
            last = {ref: pid for ref, (_, _, pid, _) in topo.active().items()}
            stats = topo.stop(drain_timeout=30)
            stopped = True
            assert stats.roots > 0 and stats.drained
            assert stats.lost == 0 and stats.duplicated == 0
            assert stats.completed == stats.roots
            words = sum(sum(s.values()) for s in topo.final_states().values())
            assert words == WORDS_PER_SENTENCE * stats.roots
            assert wait_for(lambda: not any(map(_alive, last.values())), timeout=10)
        finally:
            if not stopped:
                topo.stop(drain_timeout=5)


def test_unknown_cpu_mode_is_refused_by_name():
    with pytest.raises(ValueError, match="cpu must be one of process, thread, got 'gpu'"):
        DistributedTopology(
            wordcount(app=APP, parallelism=1), lambda t: 1.0, nodes={"n1": None}, cpu="gpu"
        )
