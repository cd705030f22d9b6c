"""The shipped unit files: they verify, they are hardened, and they keep what each
daemon needs.

`systemd-analyze verify` insists that ExecStart's binary exists, so each unit is
checked on a copy whose ExecStart points at this environment's console script
(the units themselves name the one in /opt/dsched, the documented install).
`systemd-analyze security --offline=true` rates a unit file's sandboxing from 0
(nothing exposed) to 10; each unit must stay within "OK" (below 5.0). systemd need
not be PID 1 for either (`make systemd-tools` installs systemd-analyze).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

SYSTEMD = Path(__file__).resolve().parent.parent / "systemd"
UNITS = sorted(SYSTEMD.glob("*.service"))
INSTALL_BIN = "/opt/dsched/bin"
# systemd-analyze security: exposure below 5.0 is OK (1.0-4.9), SAFE or PERFECT.
GOOD_LEVELS = {"OK", "SAFE", "PERFECT"}
MAX_EXPOSURE = 4.9


def _analyze() -> str:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed (make systemd-tools installs it)")
    return analyze


def _settings(unit: Path) -> dict[str, list[str]]:
    """Key -> every value it is given in the unit file, in order."""
    out: dict[str, list[str]] = {}
    for line in unit.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";", "[")):
            continue
        key, _, value = line.partition("=")
        out.setdefault(key.strip(), []).append(value.strip())
    return out


def _words(unit: Path, key: str) -> set[str]:
    return {w for value in _settings(unit).get(key, []) for w in value.split()}


def _runnable_copy(unit: Path, tmp_path: Path) -> Path:
    """The unit with ExecStart pointing at this environment's console script."""
    text = unit.read_text()
    m = re.search(r"^ExecStart=(\S+)", text, re.M)
    assert m, f"{unit.name} has no ExecStart"
    script = Path(sys.executable).parent / Path(m.group(1)).name
    assert script.exists(), f"{script} is not installed (pip install -e .)"
    copy = tmp_path / unit.name
    copy.write_text(text.replace(m.group(1), str(script), 1))
    return copy


def test_every_daemon_has_a_unit():
    names = {u.stem for u in UNITS}
    assert {"dsched-agent", "dsched-controller", "dsched-history"} <= names


@pytest.mark.parametrize("unit", UNITS, ids=lambda p: p.name)
def test_unit_runs_the_installed_console_script(unit: Path):
    scripts = tomllib.loads((SYSTEMD.parent / "pyproject.toml").read_text())["project"]["scripts"]
    (exec_start,) = _settings(unit)["ExecStart"]
    binary = exec_start.split()[0]
    assert Path(binary).parent == Path(INSTALL_BIN), binary
    assert Path(binary).name == unit.stem and unit.stem in scripts


@pytest.mark.parametrize("unit", UNITS, ids=lambda p: p.name)
def test_unit_verifies(unit: Path, tmp_path: Path):
    analyze = _analyze()
    copy = _runnable_copy(unit, tmp_path)
    r = subprocess.run([analyze, "verify", str(copy)], capture_output=True, text=True)
    # verify also complains about unrelated units on the host; only ours count.
    ours = [line for line in (r.stdout + r.stderr).splitlines() if unit.name in line]
    assert r.returncode == 0 and not ours, "\n".join(ours) or r.stderr


@pytest.mark.parametrize("unit", UNITS, ids=lambda p: p.name)
def test_unit_exposure_stays_ok(unit: Path, tmp_path: Path):
    analyze = _analyze()
    copy = _runnable_copy(unit, tmp_path)
    r = subprocess.run(
        [analyze, "security", "--offline=true", "--no-pager", str(copy)],
        capture_output=True,
        text=True,
    )
    out = r.stdout + r.stderr
    m = re.search(rf"Overall exposure level for {re.escape(unit.name)}: (\d+\.\d) (\w+)", out)
    assert m, out[-3000:]
    exposure, level = float(m.group(1)), m.group(2)
    failed = "\n".join(line for line in out.splitlines() if line.startswith("✗"))
    assert level in GOOD_LEVELS and exposure <= MAX_EXPOSURE, f"{exposure} {level}\n{failed}"


@pytest.mark.parametrize("unit", UNITS, ids=lambda p: p.name)
def test_unit_restarts_reads_etc_config_and_is_sandboxed(unit: Path):
    s = _settings(unit)
    assert s["Restart"] == ["on-failure"]
    assert "/etc/dsched/" in s["ExecStart"][0]
    for key, value in {
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "ProtectKernelTunables": "yes",
        "ProtectKernelModules": "yes",
        "PrivateDevices": "yes",
        "RestrictNamespaces": "yes",
        "SystemCallArchitectures": "native",
        "SystemCallErrorNumber": "EPERM",
    }.items():
        assert s.get(key) == [value], (key, s.get(key))
    assert s["SystemCallFilter"][0] == "@system-service"
    assert {"AF_UNIX", "AF_INET", "AF_INET6"} <= _words(unit, "RestrictAddressFamilies")
    # No unit owns /run/dsched (tmpfiles.d/dsched.conf does): a RuntimeDirectory=
    # would be chowned to whichever unit started last and removed with the first
    # one stopped, taking the other daemon's socket with it.
    assert "RuntimeDirectory" not in s
    # JVMs run in the agent (jcmd) and the controller and history (Spark).
    assert "MemoryDenyWriteExecute" not in s


def test_agent_keeps_what_it_needs():
    unit = SYSTEMD / "dsched-agent.service"
    s = _settings(unit)
    assert s["User"] == ["root"]  # cgroup v1 `tasks` takes other users' threads from uid 0
    assert _words(unit, "CapabilityBoundingSet") == {
        "CAP_SYS_PTRACE",
        "CAP_KILL",
        "CAP_DAC_OVERRIDE",
    }
    rw = _words(unit, "ReadWritePaths")
    assert {"/sys/fs/cgroup", "/run/dsched", "/tmp"} <= rw
    assert "-/sys/fs/resctrl" in rw  # optional: absent on most machines
    assert "AF_NETLINK" in _words(unit, "RestrictAddressFamilies")  # pyroute2
    # Other users' /proc, the node's /proc/stat and /proc/pressure; jcmd's /tmp.
    for key in ("ProtectProc", "ProcSubset", "PrivateTmp", "PrivateUsers", "PrivateNetwork"):
        assert key not in s, key
    # Caps stay when the agent stops.
    assert s["KillMode"] == ["process"]
    # chown of the socket to socket_group (a group the agent is put in).
    assert s["SystemCallFilter"][-1] == "@chown"


@pytest.mark.parametrize("name", ["dsched-controller", "dsched-history"])
def test_controller_and_history_run_unprivileged_on_one_state_dir(name: str):
    unit = SYSTEMD / f"{name}.service"
    s = _settings(unit)
    assert s["User"] == ["dsched"] and s["Group"] == ["dsched"]
    assert "DynamicUser" not in s
    assert s["CapabilityBoundingSet"] == [""]
    assert s["StateDirectory"] == ["dsched"] and s["StateDirectoryMode"] == ["0750"]
    assert s["WorkingDirectory"] == ["/var/lib/dsched"]
    assert s["PrivateTmp"] == ["yes"] and s["ProtectControlGroups"] == ["yes"]
    assert s["ProtectProc"] == ["invisible"]


def test_controller_can_make_the_admin_socket():
    s = _settings(SYSTEMD / "dsched-controller.service")
    assert "/run/dsched" in _words(SYSTEMD / "dsched-controller.service", "ReadWritePaths")
    assert s["SystemCallFilter"][-1] == "@chown"  # admin_socket_group
    # Soft = hard: the daemon does not call setrlimit (blocked with @resources).
    assert re.fullmatch(r"\d+", s["LimitNOFILE"][0])


def test_sysusers_and_tmpfiles_make_the_user_and_the_shared_socket_directory(tmp_path: Path):
    sysusers, tmpfiles = shutil.which("systemd-sysusers"), shutil.which("systemd-tmpfiles")
    if sysusers is None or tmpfiles is None:
        pytest.skip("systemd-sysusers / systemd-tmpfiles are not installed (make systemd-tools)")
    if os.geteuid() != 0:
        pytest.skip("systemd-tmpfiles --create chowns /run/dsched: needs root")
    root = tmp_path / "root"
    for sub, conf in (("sysusers.d", "sysusers.d"), ("tmpfiles.d", "tmpfiles.d")):
        (root / "usr/lib" / sub).mkdir(parents=True)
        shutil.copy2(SYSTEMD / conf / "dsched.conf", root / "usr/lib" / sub / "dsched.conf")
    (root / "etc").mkdir()
    (root / "run").mkdir()
    r = subprocess.run([sysusers, f"--root={root}", "dsched.conf"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    passwd = (root / "etc/passwd").read_text()
    group = (root / "etc/group").read_text()
    (user,) = [line.split(":") for line in passwd.splitlines() if line.startswith("dsched:")]
    (gline,) = [line.split(":") for line in group.splitlines() if line.startswith("dsched:")]
    assert int(user[2]) < 1000 and user[5] == "/var/lib/dsched"  # a system user
    r = subprocess.run(
        [tmpfiles, f"--root={root}", "--create", "dsched.conf"], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    st = (root / "run/dsched").stat()
    # Root's and group dsched's to write, everyone's to enter, sticky.
    assert oct(st.st_mode & 0o7777) == oct(0o1775)
    assert st.st_uid == 0 and st.st_gid == int(gline[2])
