"""The shipped unit files pass `systemd-analyze verify` against the installed scripts.

verify insists that ExecStart's binary exists, so each unit is checked on a copy
whose ExecStart points at this environment's console script.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

UNITS = sorted((Path(__file__).resolve().parent.parent / "systemd").glob("*.service"))


def test_every_daemon_has_a_unit():
    names = {u.stem for u in UNITS}
    assert {"dsched-agent", "dsched-controller"} <= names


@pytest.mark.parametrize("unit", UNITS, ids=lambda p: p.name)
def test_unit_verifies(unit: Path, tmp_path: Path):
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed on this machine")
    text = unit.read_text()
    m = re.search(r"^ExecStart=(\S+)", text, re.M)
    assert m, f"{unit.name} has no ExecStart"
    script = Path(sys.executable).parent / Path(m.group(1)).name
    assert script.exists(), f"{script} is not installed (pip install -e .)"
    copy = tmp_path / unit.name
    copy.write_text(text.replace(m.group(1), str(script), 1))
    r = subprocess.run([analyze, "verify", str(copy)], capture_output=True, text=True)
    # verify also complains about unrelated units on the host; only ours count.
    ours = [line for line in (r.stdout + r.stderr).splitlines() if unit.name in line]
    assert r.returncode == 0 and not ours, "\n".join(ours) or r.stderr


@pytest.mark.parametrize("unit", UNITS, ids=lambda p: p.name)
def test_unit_restarts_and_reads_etc_config(unit: Path):
    text = unit.read_text()
    assert "Restart=on-failure" in text
    assert "/etc/dsched/" in text
    assert "NoNewPrivileges=yes" in text
