"""Shared fixtures. Cgroup tests use the real kernel interface; they skip with a
reason when it is missing, and fail instead when DSCHED_REQUIRE_CGROUPS=1 (CI)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.flink_support import make_cluster_fixture

CGROUP_V1_CPU = Path("/sys/fs/cgroup/cpu")

# Files whose tests measure CPU against caps or latency under load, or compare the
# whole cgroup tree before and after: `make test` runs them on their own after the
# rest has run on two workers (pytest-xdist), where a neighbour would skew them.
# (Tests that check only their own cgroup root, counts or losses run with the rest.)
# Single tests that need it carry the mark themselves (test_bench_live.py's real runs).
SERIAL_FILES = frozenset(
    {
        "test_agent_cgroup_v1.py",  # a saturated thread measures its cap
        "test_agent_nesting.py",  # usage under a container's limit
        "test_bench_faults.py",  # real cgroups, namespaces and daemons, killed on purpose
        "test_bench_live_profile.py",  # a live run on two agent nodes
        "test_controller_live.py",  # gold's latency against bronze's
        # An overload must show on the node the test loads, not on a busy neighbour.
        "test_live_placement_cluster.py",
        "test_dry_run_nothing_changes.py",  # the whole cgroup tree before and after
        "test_flink_agent.py",  # a saturated subtask measures its cap
        "test_perf_profile.py",  # CPU and latency of trials under a slot's cap
        "test_sim_calibration.py",  # the simulator against measured CPU
    }
)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.name in SERIAL_FILES:
            item.add_marker(pytest.mark.serial)
        elif item.path.name.startswith("test_flink_"):
            # One worker for the tests that share the session's Flink cluster.
            item.add_marker(pytest.mark.xdist_group("flink"))


def _cgroup_v1_cpu_writable() -> str | None:
    """None when a v1 cpu hierarchy is mounted and writable, else why not."""
    if not (CGROUP_V1_CPU / "cpu.cfs_quota_us").exists():
        return f"no cgroup v1 cpu controller at {CGROUP_V1_CPU}"
    if not os.access(CGROUP_V1_CPU, os.W_OK):
        return f"{CGROUP_V1_CPU} is not writable (not root?)"
    return None


def require_cgroups() -> None:
    """Skip (or, under DSCHED_REQUIRE_CGROUPS=1, fail) when real cgroups are missing."""
    why = _cgroup_v1_cpu_writable()
    if why is None:
        return
    if os.environ.get("DSCHED_REQUIRE_CGROUPS") == "1":
        pytest.fail(f"cgroups unavailable but DSCHED_REQUIRE_CGROUPS=1: {why}")
    pytest.skip(f"cgroups unavailable: {why}")


@pytest.fixture
def cgroup_v1_cpu() -> Path:
    require_cgroups()
    return CGROUP_V1_CPU


# One real Flink cluster (1 TaskManager, 4 slots) for every test that asks for
# `flink_cluster`: starting one takes 10-40 s, and each test module cancels the
# jobs it submits (tests/flink_support.py).
flink_cluster = make_cluster_fixture(scope="session")


@pytest.fixture(scope="session")
def pki(tmp_path_factory):
    """CAs and certificates for the TLS tests (tests/tls_support.py)."""
    from tests.tls_support import make_pki

    return make_pki(tmp_path_factory.mktemp("pki"))
