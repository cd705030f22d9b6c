"""The node pool: the DP's one-node-more or one-node-fewer carried out through a
strategy, with a cool-down, a back-off after failures and the outcome in the record.

The command strategy runs real programs (shell scripts in a temporary
directory): one that succeeds, one that exits 1, one that hangs past its
timeout and is killed with its children.
"""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest

from controller.config import (
    ControllerConfig,
    NodePoolCommandConfig,
    NodePoolConfig,
)
from controller.core import Controller
from controller.edges.nodepool import (
    CommandNodePool,
    LogNodePool,
    NodePoolEdge,
    run_command,
)
from controller.record import explain_lines
from controller.stages.allocation import NodeRecommendation
from dsched.config import ConfigError, load_config
from tests.test_controller_epoch import SyntheticNode, config, run

SLOT = 10.0


def script(tmp_path: Path, name: str, body: str) -> str:
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def result(epoch: int, delta: int, nodes=("n1", "n2"), demands=None):
    """The parts of an EpochResult the node pool reads."""
    rec = NodeRecommendation(delta, 1.0, 10.0, 12.0, 8.0, f"the DP says {delta:+d}")
    return SimpleNamespace(
        epoch=epoch,
        now=1_000.0 + SLOT * epoch,
        capacity={n: 4.0 for n in nodes},
        alloc=SimpleNamespace(recommendation=rec),
        demands=demands or {},
        held={},
        classes={},
    )


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


class MemoryStore:
    def __init__(self) -> None:
        self.values: dict[str, str] = {}

    def get(self, key, default=None):
        return self.values.get(key, default)

    def put(self, key, value):
        self.values[key] = value


def edge(pool, clock=None, store=None, **cfg) -> NodePoolEdge:
    settings = {
        "cooldown_seconds": 3 * SLOT,
        "retry_backoff_seconds": 2 * SLOT,
        "remove_patience_epochs": 1,
        **cfg,
    }
    return NodePoolEdge(
        pool, NodePoolConfig(**settings), node_cost=4.0, clock=clock or Clock(), store=store
    )


def offer(e: NodePoolEdge, epoch: int, delta: int, enforce: bool = True, **kw):
    res = result(epoch, delta, **kw)
    if isinstance(e.clock, Clock):
        e.clock.now = res.now
    return e.offer(res, enforce=enforce)


def command_pool(tmp_path: Path, add: str, remove: str | None = None, timeout=5.0):
    return CommandNodePool(
        NodePoolCommandConfig(add=[add], remove=[remove or add], timeout_seconds=timeout)
    )


# ------------------------------------------------------------ config
@pytest.mark.parametrize(
    "toml, key",
    [
        ('[node_pool]\nstrategy = "cloud"\n', "node_pool.strategy"),
        ("[node_pool]\nmin_nodes = 0\n", "node_pool.min_nodes"),
        ("[node_pool]\nmin_nodes = 3\nmax_nodes = 2\n", "node_pool.max_nodes"),
        ("[node_pool]\ncooldown_seconds = -1\n", "node_pool.cooldown_seconds"),
        ("[node_pool]\nremove_patience_epochs = 0\n", "node_pool.remove_patience_epochs"),
        ("[node_pool]\nremove_patience_epochs = 1.5\n", "node_pool.remove_patience_epochs"),
        ("[node_pool]\nretry_backoff_seconds = nan\n", "node_pool.retry_backoff_seconds"),
        (
            "[node_pool]\nretry_backoff_seconds = 60\nmax_retry_backoff_seconds = 30\n",
            "node_pool.max_retry_backoff_seconds",
        ),
        ('[node_pool]\nstrategy = "command"\n', "node_pool.command.add"),
        (
            '[node_pool]\nstrategy = "command"\n[node_pool.command]\nadd = ["/bin/true"]\n',
            "node_pool.command.remove",
        ),
        ("[node_pool.command]\ntimeout_seconds = 0\n", "node_pool.command.timeout_seconds"),
        ("[node_pool.testbed]\nnode_cores = -1\n", "node_pool.testbed.node_cores"),
        ('[node_pool.testbed]\nnode_prefix = "../x"\n', "node_pool.testbed.node_prefix"),
        ("[node_pool]\ncool_down = 3\n", "node_pool.cool_down"),
        (
            'listen = "0.0.0.0:7700"\nallow_plaintext_remote = true\n'
            '[node_pool]\nstrategy = "testbed"\n',
            "node_pool.strategy",
        ),
    ],
)
def test_bad_node_pool_config_names_the_key(tmp_path, toml, key):
    path = tmp_path / "controller.toml"
    path.write_text(toml)
    with pytest.raises(ConfigError) as err:
        load_config(ControllerConfig, path)
    assert err.value.key == key, str(err.value)


def test_node_pool_config_is_checked_when_built_in_code_too(tmp_path):
    cfg = ControllerConfig(state_dir=tmp_path, node_pool=NodePoolConfig(min_nodes=0))
    with pytest.raises(ConfigError) as err:
        cfg.validate()
    assert err.value.key == "node_pool.min_nodes"


def test_a_command_pool_config_loads(tmp_path):
    path = tmp_path / "controller.toml"
    path.write_text(
        '[node_pool]\nstrategy = "command"\ncooldown_seconds = 600\nmax_nodes = 10\n'
        '[node_pool.command]\nadd = ["/usr/local/bin/add-node", "--zone", "a"]\n'
        'remove = ["/usr/local/bin/remove-node"]\ntimeout_seconds = 30\n'
    )
    cfg = load_config(ControllerConfig, path)
    assert cfg.node_pool.strategy == "command" and cfg.node_pool.max_nodes == 10
    assert cfg.node_pool.command.add == ["/usr/local/bin/add-node", "--zone", "a"]
    assert ControllerConfig().node_pool.strategy == "log"  # the default only records


# ------------------------------------------------------------ log, cool-down, limits
def test_log_records_the_change_and_the_cool_down_holds_the_next():
    e = edge(LogNodePool())
    first = offer(e, 1, +1)
    assert (first["action"], first["outcome"], first["strategy"]) == ("add", "logged", "log")
    assert "would add a node" in first["reason"]
    assert first["cost_per_node_epoch"] == 4.0 and first["nodes"] == 2
    # Three slots of cool-down: epochs 2..3 are held, epoch 4 may act again.
    for epoch in (2, 3):
        held = offer(e, epoch, +1)
        assert (held["action"], held["outcome"]) == ("none", "held")
        assert held["reason"].startswith("cool-down") and "epoch 1" in held["reason"]
    again = offer(e, 4, -1)
    assert (again["action"], again["outcome"], again["node"]) == ("remove", "logged", "n2")
    quiet = offer(e, 5, 0)
    assert (quiet["recommended"], quiet["action"]) == ("none", "none")
    assert quiet["node_epochs"] == 10  # two nodes over five epochs


def test_a_removal_waits_for_its_patience_and_an_add_does_not():
    e = edge(LogNodePool(), cooldown_seconds=0, remove_patience_epochs=3)
    # Two epochs wanting one node fewer, then one that does not: the count restarts.
    for epoch in (1, 2):
        held = offer(e, epoch, -1)
        assert (held["action"], held["outcome"]) == ("none", "held")
        assert f"{epoch} of 3 epochs" in held["reason"]
    assert offer(e, 3, 0)["outcome"] == "none"
    assert offer(e, 4, -1)["reason"].startswith("removal held: 1 of 3")
    assert offer(e, 5, -1)["outcome"] == "held"
    gone = offer(e, 6, -1)
    assert (gone["action"], gone["outcome"]) == ("remove", "logged")
    # Adding is at once.
    assert offer(e, 7, +1)["action"] == "add"


def test_the_change_carries_the_class_weights():
    """A pool that moves instances is told each app's class weight (lightest first)."""
    seen = []

    class Recording(LogNodePool):
        def add(self, change):
            seen.append(change)
            return super().add(change)

    e = edge(Recording())
    res = result(1, +1)
    res.classes = {
        "a": SimpleNamespace(weight=8.0),
        "b": SimpleNamespace(weight=1.0),
    }
    e.clock.now = res.now
    assert e.offer(res, enforce=True)["action"] == "add"
    assert dict(seen[0].weights) == {"a": 8.0, "b": 1.0}


def test_min_and_max_nodes_hold_the_change():
    e = edge(LogNodePool(), min_nodes=2, max_nodes=2)
    assert "max_nodes" in offer(e, 1, +1)["reason"]
    assert "min_nodes" in offer(e, 2, -1)["reason"]
    assert offer(e, 3, -1, nodes=("n1", "n2", "n3"))["action"] == "remove"


def test_remove_names_the_least_loaded_node():
    demands = {
        i: SimpleNamespace(node=n, cores=c)
        for i, (n, c) in enumerate([("n1", 0.5), ("n2", 2.0), ("n3", 0.1), ("n3", 0.1)])
    }
    e = edge(LogNodePool())
    row = offer(e, 1, -1, nodes=("n1", "n2", "n3"), demands=demands)
    assert row["node"] == "n3" and "n3" in row["reason"]


def test_dry_run_runs_no_command(tmp_path):
    marker = tmp_path / "ran"
    add = script(tmp_path, "add.sh", f"touch {marker}\n")
    e = edge(command_pool(tmp_path, add))
    row = offer(e, 1, +1, enforce=False)
    assert (row["action"], row["outcome"]) == ("add", "dry-run")
    assert e.wait(5) and not marker.exists()
    assert offer(e, 2, +1, enforce=False)["reason"].startswith("cool-down")


# ------------------------------------------------------------ the command strategy
def test_command_gets_the_change_in_its_environment(tmp_path):
    seen = tmp_path / "env"
    body = (
        f'echo "$DSCHED_NODE_POOL_ACTION $DSCHED_NODES $DSCHED_NODES_TARGET '
        f'${{DSCHED_NODE:-none}} $DSCHED_EPOCH" >> {seen}\n'
        'echo "provisioning..."\necho "node-7"\n'
    )
    cmd = script(tmp_path, "node.sh", body)
    e = edge(command_pool(tmp_path, cmd), cooldown_seconds=0)
    row = offer(e, 1, +1)
    assert (row["action"], row["outcome"]) == ("add", "started")
    assert e.wait(10)
    done = offer(e, 2, 0)["completed"]
    assert (done["epoch"], done["action"], done["outcome"]) == (1, "add", "done")
    assert done["node"] == "node-7" and "exit 0" in done["reason"]
    offer(e, 3, -1, nodes=("n1", "n2", "n3"))
    assert e.wait(10)
    assert offer(e, 4, 0)["completed"]["node"] == "n3"
    assert seen.read_text().splitlines() == ["add 2 3 none 1", "remove 3 2 n3 3"]


def test_failing_command_backs_off_instead_of_retrying_every_epoch(tmp_path):
    calls = tmp_path / "calls"
    cmd = script(
        tmp_path, "fail.sh", f"echo x >> {calls}\necho 'quota exceeded in zone a' >&2\nexit 1\n"
    )
    store = MemoryStore()
    e = edge(command_pool(tmp_path, cmd), store=store)  # back-off 2 slots, doubling
    assert offer(e, 1, +1)["outcome"] == "started"
    assert e.wait(10)
    row = offer(e, 2, +1)
    failed = row["completed"]
    assert failed["outcome"] == "failed"
    assert failed["reason"] == "exit 1: quota exceeded in zone a"
    # Epoch 2 is 10 s after the failure: held with the reason, nothing run.
    assert row["outcome"] == "held" and "back-off after 1 failure" in row["reason"]
    assert "quota exceeded" in row["reason"]
    assert offer(e, 3, +1)["outcome"] == "started"  # 20 s: the back-off has passed
    assert e.wait(10)
    for epoch in (4, 5, 6):  # now 40 s
        assert offer(e, epoch, +1)["outcome"] == "held"
    assert calls.read_text().count("x") == 2
    # The back-off is kept for a restarted controller.
    again = edge(command_pool(tmp_path, cmd), store=store)
    assert again.failures == 2 and offer(again, 6, +1)["outcome"] == "held"
    assert calls.read_text().count("x") == 2


def test_hanging_command_is_killed_with_its_children_at_the_timeout(tmp_path):
    pidfile = tmp_path / "pid"
    cmd = script(
        tmp_path,
        "hang.sh",
        f"echo 'waiting for the API' >&2\nsleep 60 &\necho $! > {pidfile}\nwait\n",
    )
    e = edge(command_pool(tmp_path, cmd, timeout=0.5))
    t0 = time.monotonic()
    assert offer(e, 1, +1)["outcome"] == "started"
    # The epoch does not wait for the command: this one is held, not blocked.
    busy = offer(e, 2, +1)
    assert busy["outcome"] == "held" and "still running" in busy["reason"]
    assert time.monotonic() - t0 < 0.5
    assert e.wait(15)
    assert time.monotonic() - t0 < 10
    row = offer(e, 3, +1)
    failed = row["completed"]
    assert failed["outcome"] == "failed"
    assert failed["reason"] == "timed out after 0.5 s, killed: waiting for the API"
    assert row["outcome"] == "held" and "back-off" in row["reason"]
    # The script's child went with it (a signal is delivered, not waited for: poll).
    child = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(child)


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_command_that_cannot_start_fails_with_the_reason(tmp_path):
    res, _ = run_command([str(tmp_path / "missing")], {}, 5.0)
    assert res.outcome == "failed" and "cannot run" in res.reason


def test_a_command_killed_by_a_signal_says_so(tmp_path):
    cmd = script(tmp_path, "die.sh", "kill -9 $$\n")
    res, _ = run_command([cmd], {}, 5.0)
    assert (res.outcome, res.reason) == ("failed", "killed by signal 9")


def test_a_pool_that_raises_counts_as_failed():
    class Broken(LogNodePool):
        def add(self, change):
            raise RuntimeError("no credentials")

    e = edge(Broken())
    row = offer(e, 1, +1)
    assert (row["outcome"], row["reason"]) == ("failed", "RuntimeError: no credentials")
    assert offer(e, 2, +1)["reason"].startswith("back-off")


# ------------------------------------------------------------ in the controller's epoch
@pytest.fixture
def clock():
    return [1_000_000.0]


def test_the_epoch_hands_the_recommendation_to_the_node_pool(tmp_path, clock):
    calls = tmp_path / "calls"
    remove = script(tmp_path, "remove.sh", f'echo "$DSCHED_NODE" >> {calls}\n')
    cfg = config(
        tmp_path,
        node_capacity_cores={},
        node_cost=0.5,
        mode="enforce",
        node_pool=NodePoolConfig(
            strategy="command",
            cooldown_seconds=100.0,
            command=NodePoolCommandConfig(add=[remove], remove=[remove], timeout_seconds=5.0),
        ),
    )
    c = Controller(cfg, clock=lambda: clock[0])
    try:
        SyntheticNode(c, "n2", cores=8.0)
        node = SyntheticNode(c, "n1", cores=8.0)
        for _ in range(10):
            acted = run(c, node, clock, 1, {"a": 50.0})["node_pool_action"]
            if acted["action"] != "none":
                break
        assert (acted["action"], acted["outcome"], acted["node"]) == (
            "remove",
            "started",
            "n2",  # no instance runs there
        )
        assert c.node_pool.wait(10)
        rec = run(c, node, clock, 1, {"a": 50.0})
        pool = rec["node_pool_action"]
        assert pool["completed"]["outcome"] == "done"
        assert pool["outcome"] == "held" and pool["reason"].startswith("cool-down")
        assert calls.read_text() == "n2\n"
        stored = c.store.decisions(1)[0]
        assert stored["node_pool_action"]["completed"]["outcome"] == "done"
        assert any(
            "node pool (command): held: cool-down" in line for line in explain_lines("a", [rec])
        )
    finally:
        c.stop()


def test_dry_run_controller_only_records(tmp_path, clock):
    c = Controller(config(tmp_path, node_capacity_cores={}, node_cost=0.5), clock=lambda: clock[0])
    try:
        SyntheticNode(c, "n2", cores=8.0)
        node = SyntheticNode(c, "n1", cores=8.0)
        rec = run(c, node, clock, 5, {"a": 50.0})
        assert c.mode == "dry-run"
        pool = rec["node_pool_action"]
        assert pool["strategy"] == "log" and pool["recommended"] == "remove"
        assert pool["outcome"] in ("dry-run", "held")
    finally:
        c.stop()


def test_environment_is_the_controllers_plus_the_change(tmp_path, monkeypatch):
    monkeypatch.setenv("CLOUD_PROFILE", "prod")
    out = tmp_path / "env"
    cmd = script(tmp_path, "env.sh", f'echo "$CLOUD_PROFILE $DSCHED_NODE_POOL_ACTION" > {out}\n')
    res, _ = run_command([cmd], {"DSCHED_NODE_POOL_ACTION": "add"}, 5.0)
    assert res.outcome == "done" and out.read_text() == "prod add\n"
    assert os.environ.get("DSCHED_NODE_POOL_ACTION") is None
