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
# Single tests that need it carry the mark themselves: test_bench_live.py's and
# test_bench_live_profile.py's real runs, test_bench_faults.py's fault matrix (real
# cgroups, namespaces and daemons, killed on purpose), test_controller_live.py's
# runs (gold's latency against bronze's) and test_demo.py's two-node placement;
# their files' other tests run with the rest.
SERIAL_FILES = frozenset(
    {
        "test_agent_cgroup_v1.py",  # a saturated thread measures its cap
        "test_agent_nesting.py",  # usage under a container's limit
        # An overload must show on the node the test loads, not on a busy neighbour.
        "test_live_placement_cluster.py",
        "test_dry_run_nothing_changes.py",  # the whole cgroup tree before and after
        "test_flink_agent.py",  # a saturated subtask measures its cap
        "test_perf_profile.py",  # CPU and latency of trials under a slot's cap
        "test_sim_calibration.py",  # the simulator against measured CPU
    }
)


# Files whose tests share an expensive module-scoped fixture. --dist loadgroup hands
# out ungrouped tests one by one, so both workers would build the fixture; a group
# per file keeps the file on one worker and builds it once.
MODULE_GROUP_FILES = frozenset(
    {
        "test_agent_engine.py",  # a fake TaskManager compiled with javac
        "test_ctl_views.py",  # a controller serving a plan
        "test_packaging.py",  # a wheel built with pip
        "test_prometheus.py",  # daemons, topologies, the history job and Prometheus
        "test_queueing_models.py",  # the committed grid scored again
        "test_security_doc.py",  # the documented PKI made with openssl
        "test_wheel_install.py",  # an sdist, its wheel and a venv with it installed
    }
)


# A wrapper, so the marks are set before any other plugin's hook runs: pytest-xdist's
# worker turns an xdist_group mark into the "@group" nodeid suffix that --dist
# loadgroup schedules by, in a hook of its own registered after this conftest (a
# plain hook here ran after it, and the mark came too late).
@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]):
    for item in items:
        if item.path.name in SERIAL_FILES:
            item.add_marker(pytest.mark.serial)
        elif item.path.name.startswith("test_flink_"):
            # One worker for the tests that share the session's Flink cluster.
            item.add_marker(pytest.mark.xdist_group("flink"))
        elif item.path.name in MODULE_GROUP_FILES:
            item.add_marker(pytest.mark.xdist_group(item.path.stem))
    return (yield)


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
