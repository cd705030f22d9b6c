"""What `pip install .` puts on a node: the daemons and the agent's dependencies only.

The wheel is built from a copy of the checkout (so that no build directory lands
in the source tree) and read as pip would read it: its top-level packages and
its METADATA. The testbed and the benchmarks stay in the source tree, where an
editable install (`make install`) imports them from any directory.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

from dsched.cli import _missing_install

ROOT = Path(__file__).resolve().parents[1]
DAEMON_PACKAGES = {"dsched", "dsched_pb", "agent", "controller", "predict", "spark_stream"}
# What agent/ and the dsched, dsched_pb modules it uses import.
AGENT_REQUIREMENTS = {"grpcio", "protobuf", "prometheus-client", "psutil", "pyroute2", "cgroupspy"}
CONTROLLER_STACK = (
    "numpy",
    "scipy",
    "statsmodels",
    "pandas",
    "pyarrow",
    "pyspark",
    "rich",
    "orjson",
)


def _name(requirement: str) -> str:
    """The distribution name of a Requires-Dist value ('pyspark<5,>=4.0; extra == ...')."""
    head = requirement.split(";")[0].strip()
    for i, ch in enumerate(head):
        if not (ch.isalnum() or ch in "-_."):
            return head[:i].lower()
    return head.lower()


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    src = tmp_path_factory.mktemp("src")
    for item in ROOT.iterdir():
        if item.is_dir() and (item / "__init__.py").exists():
            shutil.copytree(
                item, src / item.name, ignore=shutil.ignore_patterns("__pycache__", "results")
            )
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    out = tmp_path_factory.mktemp("wheel")
    r = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(src)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (whl,) = out.glob("dsched-*.whl")
    return whl


def _metadata(whl: Path):
    with zipfile.ZipFile(whl) as z:
        (meta,) = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")]
        return Parser().parsestr(z.read(meta).decode())


def test_wheel_carries_the_daemons_and_not_the_testbed_or_the_benchmarks(wheel):
    with zipfile.ZipFile(wheel) as z:
        tops = {n.split("/")[0] for n in z.namelist() if ".dist-info/" not in n}
        scripts = z.read(
            next(n for n in z.namelist() if n.endswith(".dist-info/entry_points.txt"))
        ).decode()
    assert tops == DAEMON_PACKAGES
    assert "testbed" not in tops and "bench" not in tops
    for script in ("dsched-agent", "dsched-controller", "dsched-history", "dschedctl", "dsched"):
        assert f"{script} = " in scripts


def test_base_requirements_are_the_agents_and_the_rest_are_extras(wheel):
    requires = _metadata(wheel).get_all("Requires-Dist")
    base = {_name(r) for r in requires if "extra ==" not in r}
    assert base == AGENT_REQUIREMENTS
    for heavy in ("matplotlib", "pyspark", "statsmodels", *CONTROLLER_STACK):
        assert heavy not in base, heavy

    def extra(name: str) -> set[str]:
        return {_name(r) for r in requires if f'extra == "{name}"' in r}

    assert set(CONTROLLER_STACK) | {"grpcio-health-checking"} <= extra("controller")
    assert "matplotlib" in extra("bench")
    assert "dsched" in extra("testbed") and "dsched" in extra("bench")
    assert {"dsched", "pytest", "hypothesis", "grpcio-tools", "ruff"} <= extra("dev")
    assert set(_metadata(wheel).get_all("Provides-Extra")) == {
        "controller",
        "testbed",
        "bench",
        "dev",
    }


@pytest.mark.slow
def test_agent_installs_and_runs_without_the_controller_stack(wheel, tmp_path):
    venv = tmp_path / "agentvenv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    # As docs/operations.md installs a node: the agent's lock (hashes checked),
    # then the wheel alone. A dependency the lock lacks fails the second step.
    pip = [str(venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check"]
    lock = Path(__file__).resolve().parent.parent / "lock" / "agent.txt"
    for step in (["--require-hashes", "-r", str(lock)], ["--no-index", str(wheel)]):
        r = subprocess.run(pip + step, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    python = str(venv / "bin" / "python")
    probe = (
        "import importlib.util, sys, agent.daemon\n"
        f"heavy = {CONTROLLER_STACK + ('matplotlib',)!r}\n"
        "print(sorted(m for m in heavy if importlib.util.find_spec(m) or m in sys.modules))\n"
    )
    r = subprocess.run(
        [python, "-c", probe], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]", "installed or imported with the agent: " + r.stdout
    r = subprocess.run(
        [str(venv / "bin" / "dsched-agent"), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0 and "--controller" in r.stdout, r.stderr
    # The umbrella command says where the demo and the benchmarks are.
    r = subprocess.run(
        [str(venv / "bin" / "dsched"), "demo"], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 2
    assert "source checkout" in r.stderr and "pip install -e '.[testbed,bench]'" in r.stderr


def test_source_checkout_imports_testbed_and_bench_from_any_directory(tmp_path):
    # Worker processes (`python -m testbed.live.workers`) and the `dsched` script
    # start outside the checkout; the editable install must still find them.
    r = subprocess.run(
        [sys.executable, "-c", "import bench.live, testbed.demo; print(testbed.demo.__file__)"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    assert Path(r.stdout.strip()) == ROOT / "testbed" / "demo.py"


@pytest.mark.parametrize(
    "exc, missing",
    [
        (ModuleNotFoundError("No module named 'testbed'", name="testbed"), True),
        (ModuleNotFoundError("No module named 'bench'", name="bench"), True),
        (ModuleNotFoundError("No module named 'matplotlib'", name="matplotlib"), True),
        # Inside the project: a bug to show, not an installation to fix.
        (ModuleNotFoundError("No module named 'controller.x'", name="controller.x"), False),
        (ModuleNotFoundError("No module named 'testbed.nope'", name="testbed.nope"), False),
        (ImportError("cannot import name 'x' from 'testbed.live'"), False),
    ],
)
def test_only_a_missing_installation_is_reported_as_one(exc, missing):
    assert _missing_install(exc) is missing
