"""The locks under lock/ cover what pyproject.toml asks for, and the stubs follow them.

`make install` builds the development venv from lock/dev.txt with hashes checked;
nodes install lock/agent.txt or lock/controller.txt beside the wheel. A dependency
added to pyproject.toml without `make lock` would make pip refuse the install (or,
for the node locks, leave a node without it): these tests say which one is missing.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "lock"
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s\\;]+)")


def pins(path: Path) -> dict[str, Version]:
    """name -> pinned version, failing on a pin that carries no hash."""
    found: dict[str, Version] = {}
    lines = path.read_text().splitlines()
    for i, line in enumerate(lines):
        m = PIN.match(line)
        if not m:
            continue
        follow = " ".join(lines[i : i + 2])
        assert "--hash=sha256:" in follow, f"{path.name}: {m.group(1)} is pinned without a hash"
        found[canonicalize_name(m.group(1))] = Version(m.group(2))
    assert found, f"{path} pins nothing"
    return found


def project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def requirements(*extras: str) -> list[Requirement]:
    """The base dependencies and those of ``extras``, following the self-references
    (``dsched[controller]``) the extras are built from."""
    meta = project()
    wanted, seen, out = list(extras), set(), [Requirement(r) for r in meta["dependencies"]]
    while wanted:
        extra = wanted.pop()
        if extra in seen:
            continue
        seen.add(extra)
        for spec in meta["optional-dependencies"][extra]:
            req = Requirement(spec)
            if canonicalize_name(req.name) == "dsched":
                wanted.extend(req.extras)
            else:
                out.append(req)
    return out


def missing_or_outside(lock: dict[str, Version], reqs: list[Requirement]) -> list[str]:
    bad = []
    for req in reqs:
        version = lock.get(canonicalize_name(req.name))
        if version is None:
            bad.append(f"{req.name}: not in the lock")
        elif not req.specifier.contains(version, prereleases=True):
            bad.append(f"{req.name}: locked {version}, pyproject.toml asks {req.specifier}")
    return bad


def test_the_dev_lock_covers_every_dependency_and_every_extra():
    extras = list(project()["optional-dependencies"])
    assert {"controller", "testbed", "bench", "dev"} <= set(extras)
    bad = missing_or_outside(pins(LOCK / "dev.txt"), requirements(*extras))
    assert not bad, "lock/dev.txt is stale, run `make lock`: " + "; ".join(bad)


def test_the_dev_lock_holds_the_tools_that_build_the_venv():
    locked = pins(LOCK / "dev.txt")
    for line in (LOCK / "tools.in").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            req = Requirement(line)
            assert canonicalize_name(req.name) in locked, f"{req.name} (lock/tools.in) unlocked"


@pytest.mark.parametrize(
    ("name", "extras"), [("agent.txt", ()), ("controller.txt", ("controller",))]
)
def test_the_node_locks_cover_their_install_at_the_dev_locks_versions(name, extras):
    node, dev = pins(LOCK / name), pins(LOCK / "dev.txt")
    bad = missing_or_outside(node, requirements(*extras))
    assert not bad, f"lock/{name} is stale, run `make lock`: " + "; ".join(bad)
    differ = {k: (v, dev.get(k)) for k, v in node.items() if dev.get(k) != v}
    assert not differ, f"lock/{name} and lock/dev.txt disagree (name: node, dev): {differ}"


def test_the_agent_lock_holds_nothing_of_the_controller_stack():
    agent = pins(LOCK / "agent.txt")
    heavy = {"numpy", "scipy", "pandas", "pyspark", "statsmodels", "matplotlib"}
    assert not heavy & set(agent), sorted(heavy & set(agent))


def test_the_flink_lock_is_the_testbeds_flink_version():
    from testbed.flink import install

    locked = pins(install.LOCK)
    want = {
        canonicalize_name(Requirement(w).name): Version(install.FLINK_VERSION)
        for w in install.WHEELS
    }
    assert locked == want


def test_the_committed_stubs_come_from_the_locked_generator_and_run_on_the_floor_grpcio():
    text = (ROOT / "dsched_pb" / "dsched_pb2_grpc.py").read_text()
    generated = Version(re.search(r"GRPC_GENERATED_VERSION = '([^']+)'", text).group(1))
    assert pins(LOCK / "dev.txt")["grpcio-tools"] == generated, "run `make proto`"
    # The stubs refuse, at import, a grpcio older than their generator: the wheel's
    # floor must not admit one.
    grpcio = next(Requirement(r) for r in project()["dependencies"] if r.startswith("grpcio"))
    floor = min(Version(s.version) for s in grpcio.specifier if s.operator in (">=", "=="))
    assert floor >= generated, f"pyproject.toml admits grpcio {floor} < stubs' {generated}"


def test_make_install_takes_every_package_from_the_lock_with_hashes():
    make = (ROOT / "Makefile").read_text()
    installs = [ln for ln in make.splitlines() if "pip install" in ln and "$(PY)" in ln]
    assert installs, "no pip install in the Makefile"
    for line in installs:
        hashed = "--require-hashes" in line and "-r lock/" in line
        assert hashed or "--no-deps" in line, f"installs from outside the lock: {line.strip()}"
