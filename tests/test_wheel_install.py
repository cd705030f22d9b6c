"""The wheel as a node gets it: built with `python -m build`, installed into a fresh
venv outside the checkout, its console scripts run from there.

The wheel is built once for this module from a copy of the checkout (nothing lands
in the source tree), with `--no-isolation` so that no index is needed. The venv is
created empty and the wheel installed into it with `--no-deps --no-index`; only then
does a `.pth` file put the project venv's site-packages (the dependencies: grpcio,
numpy, ...) behind its own. A line in a `.pth` file only extends `sys.path`: the
`.pth` files found in the directory it names are not read, so the editable install
of this checkout (a `.pth` naming the checkout's root) stays invisible, and the
test asserts that it does: `dsched` must import from the test venv, `testbed`
(source tree only) must not import at all.

A one-epoch smoke follows: `dsched-controller` and a dry-run `dsched-agent` from the
venv's `bin/` on loopback, the admin door on a Unix socket, `dschedctl status` until
an epoch has run with the agent connected, then SIGTERM to both: both exit 0 and
leave no process, no socket and no cgroup behind.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tarfile
import textwrap
import time
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DAEMON_PACKAGES = ("dsched", "dsched_pb", "agent", "controller", "predict", "spark_stream")
SCRIPTS = ("dsched-agent", "dsched-controller", "dschedctl", "dsched-history", "dsched")
SLOT = 1.0

pytestmark = pytest.mark.slow


def _source_files() -> set[str]:
    """Every file of the daemon packages in the checkout, as wheel paths."""
    out = set()
    for pkg in DAEMON_PACKAGES:
        for path in (ROOT / pkg).rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                out.add(path.relative_to(ROOT).as_posix())
    return out


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    src = tmp_path_factory.mktemp("wheel-src")
    for item in ROOT.iterdir():
        if item.is_dir() and (item / "__init__.py").exists():
            shutil.copytree(
                item, src / item.name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
            )
    shutil.copytree(ROOT / "proto", src / "proto")
    for name in ("pyproject.toml", "README.md", "MANIFEST.in"):
        shutil.copy2(ROOT / name, src / name)
    out = tmp_path_factory.mktemp("wheel-dist")
    # sdist first, then the wheel from the unpacked sdist: what `make wheel` does.
    r = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(src)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (whl,) = out.glob("dsched-*-py3-none-any.whl")
    (sdist,) = out.glob("dsched-*.tar.gz")
    with tarfile.open(sdist) as tar:
        tops = {Path(n).parts[1] for n in tar.getnames() if len(Path(n).parts) > 1}
    assert not tops & {"testbed", "bench", "tests"}, sorted(tops)
    assert set(DAEMON_PACKAGES) | {"proto"} <= tops
    return whl


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> Path:
    home = tmp_path_factory.mktemp("wheel-venv") / "venv"
    assert not home.resolve().is_relative_to(ROOT)
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(home)], check=True, timeout=120
    )
    python = home / "bin" / "python"
    # pip from this environment, installing into the new one. The venv sees no
    # other site-packages yet, so pip finds nothing of dsched already installed.
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "--quiet",
            "--no-deps",
            "--no-index",
            "--disable-pip-version-check",
            str(wheel),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    deps = {sysconfig.get_path("purelib"), sysconfig.get_path("platlib")}
    (site / "zz_project_deps.pth").write_text("".join(f"{d}\n" for d in sorted(deps)))
    return home


def _env(venv: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _wheel_modules(whl: Path) -> list[str]:
    with zipfile.ZipFile(whl) as z:
        names = [n for n in z.namelist() if n.endswith(".py") and ".dist-info/" not in n]
    mods = []
    for name in names:
        parts = name[: -len(".py")].split("/")
        if parts[-1] == "__main__":
            continue  # importing it would run it
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods.append(".".join(parts))
    return sorted(mods)


def test_wheel_carries_every_daemon_file_and_the_generated_stubs(wheel):
    with zipfile.ZipFile(wheel) as z:
        files = {n for n in z.namelist() if ".dist-info/" not in n}
        entry_points = z.read(
            next(n for n in z.namelist() if n.endswith(".dist-info/entry_points.txt"))
        ).decode()
    # Everything the daemons load at run time is a file of their packages: the
    # wheel must hold each one (modules, the protobuf stubs and their .pyi).
    missing = _source_files() - files
    assert not missing, f"in the checkout but not in the wheel: {sorted(missing)}"
    assert {
        "dsched_pb/__init__.py",
        "dsched_pb/dsched_pb2.py",
        "dsched_pb/dsched_pb2_grpc.py",
        "dsched_pb/dsched_pb2.pyi",
    } <= files
    assert not {f for f in files if f.split("/")[0] not in DAEMON_PACKAGES}
    for script in SCRIPTS:
        assert f"{script} = " in entry_points


def test_installed_wheel_imports_from_its_venv_not_the_checkout(wheel, venv, tmp_path):
    probe = textwrap.dedent(
        f"""
        import importlib, importlib.metadata, importlib.util, json, os, sys
        failed = {{}}
        for name in {_wheel_modules(wheel)!r}:
            try:
                importlib.import_module(name)
            except Exception as exc:  # noqa: BLE001
                failed[name] = repr(exc)
        import dsched, dsched_pb.dsched_pb2
        print(json.dumps({{
            "file": dsched.__file__,
            "stubs": dsched_pb.dsched_pb2.__file__,
            "dist": str(importlib.metadata.distribution("dsched").locate_file("")),
            "testbed": importlib.util.find_spec("testbed") is not None,
            "path": [os.path.realpath(p or os.getcwd()) for p in sys.path],
            "cwd": os.getcwd(),
            "failed": failed,
        }}))
        """
    )
    r = subprocess.run(
        [str(venv / "bin" / "python"), "-c", probe],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env=_env(venv),
    )
    assert r.returncode == 0, r.stderr[-3000:]
    seen = json.loads(r.stdout.strip().splitlines()[-1])
    assert seen["failed"] == {}
    venv_root = venv.resolve()
    for key in ("file", "stubs", "dist"):
        assert Path(seen[key]).resolve().is_relative_to(venv_root), (key, seen[key])
    assert "site-packages" in Path(seen["file"]).parts
    assert not seen["testbed"], "the source tree is importable from the wheel's venv"
    # The checkout holds the project venv; its site-packages (the dependencies) is
    # the only entry allowed inside the checkout.
    deps = {os.path.realpath(sysconfig.get_path(k)) for k in ("purelib", "platlib")}
    inside = [p for p in seen["path"] if Path(p).is_relative_to(ROOT) and p not in deps]
    assert not inside, seen["path"]
    assert not Path(seen["cwd"]).is_relative_to(ROOT)


@pytest.mark.parametrize(
    "script, expect",
    [
        ("dsched-agent", "--controller"),
        ("dsched-controller", "--admin-listen"),
        ("dschedctl", "status"),
    ],
)
def test_console_scripts_answer_help(venv, script, expect, tmp_path):
    exe = venv / "bin" / script
    assert exe.read_text().splitlines()[0] == f"#!{venv / 'bin' / 'python'}"
    r = subprocess.run(
        [str(exe), "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env=_env(venv),
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert expect in r.stdout


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def _cgroup_paths(name: str) -> list[Path]:
    base = Path("/sys/fs/cgroup")
    return [base / name, base / "cpu" / name, base / "cpu,cpuacct" / name, base / "unified" / name]


def test_one_dry_run_epoch_from_the_installed_scripts(venv, tmp_path):
    run = tmp_path
    admin = run / "admin.sock"
    agent_sock = run / "agent.sock"
    cgroup_root = f"dsched-wheel-{os.getpid()}"
    listen = f"127.0.0.1:{_free_port()}"
    (run / "controller.toml").write_text(
        textwrap.dedent(
            f"""\
            listen = "{listen}"
            admin_listen = "unix:{admin}"
            metrics = "127.0.0.1:{_free_port()}"
            state_dir = "{run / "state"}"
            mode = "dry-run"
            slot_seconds = {SLOT}

            [history]
            enabled = false
            """
        )
    )
    (run / "agent.toml").write_text(
        textwrap.dedent(
            f"""\
            controller = "{listen}"
            node_id = "wheel-smoke"
            cgroup_root = "{cgroup_root}"
            metrics = "127.0.0.1:{_free_port()}"
            socket = "{agent_sock}"
            slot_seconds = {SLOT}
            dry_run = true
            """
        )
    )
    env = _env(venv)
    bin_ = venv / "bin"
    procs: dict[str, subprocess.Popen] = {}

    def start(name: str, *args: str) -> None:
        procs[name] = subprocess.Popen(
            [str(bin_ / name), *args],
            stdout=(run / f"{name}.log").open("wb"),
            stderr=subprocess.STDOUT,
            cwd=run,
            env=env,
            start_new_session=True,
        )

    def logs() -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in run.glob("*.log")
        )

    def status() -> dict | None:
        r = subprocess.run(
            [str(bin_ / "dschedctl"), "--address", f"unix:{admin}", "--json", "status"],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=run,
            env=env,
        )
        return json.loads(r.stdout) if r.returncode == 0 else None

    try:
        start("dsched-controller", "--config", str(run / "controller.toml"))
        start("dsched-agent", "--config", str(run / "agent.toml"))
        # Poll the status until an epoch has started and finished after the agent's
        # first report reached the controller: epoch e is running or done when the
        # agent is first seen reporting, so e + 1 is whole once e + 2 shows.
        reported_at = None
        deadline = time.monotonic() + 45
        while True:
            for name, proc in procs.items():
                assert proc.poll() is None, f"{name} exited early\n{logs()}"
            st = status() or {}
            agents = st.get("agents", [])
            epoch = int(st.get("epoch", 0))
            if reported_at is None and any(
                a.get("nodeId") == "wheel-smoke" and a.get("lastReportAgeSeconds", 0) >= 0
                for a in agents
            ):
                reported_at = epoch
            if reported_at is not None and epoch >= reported_at + 2:
                break
            assert time.monotonic() < deadline, f"no epoch with the agent: {st}\n{logs()}"
            time.sleep(0.5)
        assert st.get("mode", "DRY_RUN") == "DRY_RUN"
        assert [a["nodeId"] for a in agents] == ["wheel-smoke"]
        assert agents[0].get("dryRun") is True
        assert admin.is_socket() and agent_sock.is_socket()
    finally:
        codes = {}
        for name in ("dsched-agent", "dsched-controller"):
            proc = procs.get(name)
            if proc is None:
                continue
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            try:
                codes[name] = proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                codes[name] = proc.wait()
    assert codes == {"dsched-agent": 0, "dsched-controller": 0}, logs()
    for name, proc in procs.items():
        assert not _group_alive(proc.pid), f"{name} left processes behind"
    assert not admin.exists(), "the admin socket outlived the controller"
    assert not agent_sock.exists(), "the registration socket outlived the agent"
    assert not [p for p in _cgroup_paths(cgroup_root) if p.exists()], "dry-run made a cgroup"
