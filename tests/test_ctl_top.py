"""`dschedctl top` in a real terminal: a tmux pane 80 columns wide runs it against a
real controller; the test reads the screen, presses keys, takes the controller
away and back, and checks the terminal is restored after q, Ctrl-C and SIGTERM."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from controller.ctl_top import TopState, frame_lines
from tests.controller_server_support import config, start, stop, wait_until
from tests.test_ctl_views import APPS, LONG_OP, feed, plan_controller

pytestmark = pytest.mark.skipif(
    shutil.which("tmux") is None, reason="tmux not installed (make tmux)"
)

DSCHEDCTL = Path(sys.executable).with_name("dschedctl")


class Pane:
    """One tmux server of our own (its own socket) with one 80x30 pane."""

    def __init__(self, tmp: Path, command: str):
        self.socket = tmp / "tmux.sock"
        # The shell reports how dschedctl ended and the terminal's modes after it,
        # then stays so the pane can be read. Its INT trap keeps it alive when Ctrl-C
        # reaches the whole foreground group (dschedctl gets the signal as usual).
        script = (
            f"trap true INT; {command}; echo exit=$?; "
            "stty -a | tr ';' '\\n' | grep -Eo -- '-?(icanon|echo)\\b' | tr '\\n' ' '; "
            "echo; echo done; sleep 3600"
        )
        self.tmux("new-session", "-d", "-x", "80", "-y", "30", "sh", "-c", script)

    def tmux(self, *args: str) -> str:
        env = {k: v for k, v in os.environ.items() if not k.startswith("TMUX")}
        env["TERM"] = env.get("TERM") or "xterm-256color"
        done = subprocess.run(
            ["tmux", "-S", str(self.socket), "-f", "/dev/null", *args],
            capture_output=True,
            text=True,
            env=env,
            check=True,
        )
        return done.stdout

    def screen(self) -> list[str]:
        return self.tmux("capture-pane", "-p").splitlines()

    def text(self) -> str:
        return "\n".join(self.screen())

    def show(self, key: str) -> str:
        return self.tmux("display-message", "-p", f"#{{{key}}}").strip()

    def keys(self, *keys: str) -> None:
        self.tmux("send-keys", *keys)

    def wait_for(self, what: str, cond) -> None:
        try:
            wait_until(lambda: cond(self.screen()), what)
        except AssertionError:
            raise AssertionError(f"{what}; the pane shows:\n{self.text()}") from None

    def child_pid(self) -> int:
        """dschedctl's pid: the pane's shell's child (sleep comes after it exits)."""
        shell = int(self.show("pane_pid"))
        children = Path(f"/proc/{shell}/task/{shell}/children").read_text().split()
        assert len(children) == 1, children
        return int(children[0])

    def kill(self) -> None:
        subprocess.run(
            ["tmux", "-S", str(self.socket), "kill-server"], capture_output=True, check=False
        )


def top_command(address: str, tmp: Path, *flags: str) -> str:
    empty = tmp / "dschedctl.toml"
    empty.write_text("")
    argv = [str(DSCHEDCTL), "--config", str(empty), "--address", address, "top", *flags]
    return shlex.join(argv)


def header(lines: list[str]) -> str:
    return lines[0] if lines else ""


def assert_restored(pane: Pane) -> None:
    pane.wait_for("dschedctl ended", lambda s: "done" in s)
    text = pane.text()
    assert "exit=0" in text, text
    modes = next(line for line in pane.screen() if "icanon" in line).split()
    assert sorted(modes) == ["echo", "icanon"], text  # not -icanon / -echo
    assert pane.show("alternate_on") == "0"  # the live view's screen is gone
    assert pane.show("cursor_flag") == "1"  # the cursor is shown again


@pytest.fixture
def pane_factory(tmp_path):
    panes: list[Pane] = []

    def make(command: str) -> Pane:
        pane = Pane(tmp_path, command)
        panes.append(pane)
        return pane

    yield make
    for pane in panes:
        pane.kill()


def test_top_live_sort_reconnect_and_q(tmp_path, pane_factory):
    c, server = plan_controller(tmp_path)
    address = server.admin_address
    try:
        pane = pane_factory(top_command(address, tmp_path, "--interval", "0.5"))
        epoch = c.epoch
        pane.wait_for(
            "the first frame",
            lambda s: f"epoch {epoch}" in header(s) and any(LONG_OP in line for line in s),
        )
        lines = pane.screen()
        assert "mode dry-run" in header(lines) and "3 app(s)" in header(lines)
        assert "sort cap" in lines[1] and "s: sort" in lines[1]
        for app in APPS:
            assert any(line.split()[:1] == [app] for line in lines), lines
        assert any(line.strip().startswith("demand:") for line in lines)
        assert all(len(line) <= 80 for line in lines)
        # s cycles the sort.
        pane.keys("s")
        pane.wait_for("sorted by usage", lambda s: len(s) > 1 and "sort usage" in s[1])
        # A new epoch shows up at the next refresh.
        c.run_epoch()
        pane.wait_for("the next epoch", lambda s: f"epoch {epoch + 1}" in header(s))
    finally:
        stop(c, server)
    # The controller goes away: the header says so, the last rows stay.
    # One screen with both: a second capture could land in the middle of a redraw.
    pane.wait_for(
        "not reachable, the last rows kept",
        lambda s: (
            any("controller not reachable" in line for line in s[:3])
            and any(LONG_OP in line for line in s)
        ),
    )
    # ... and comes back on the same socket (its state resumed from SQLite).
    c, server = start(config(tmp_path, node_capacity_cores={"n1": 1.0}), loop=False)
    try:
        feed(c, epochs=2)
        pane.wait_for(
            "reachable again",
            lambda s: (
                f"epoch {c.epoch}" in header(s) and not any("not reachable" in line for line in s)
            ),
        )
        pane.keys("q")
        assert_restored(pane)
    finally:
        stop(c, server)


@pytest.mark.parametrize("how", ["ctrl-c", "sigterm"])
def test_top_leaves_cleanly_on_ctrl_c_and_sigterm(tmp_path, pane_factory, how):
    c, server = plan_controller(tmp_path)
    try:
        pane = pane_factory(top_command(server.admin_address, tmp_path))
        pane.wait_for("the first frame", lambda s: f"epoch {c.epoch}" in header(s))
        if how == "ctrl-c":
            pane.keys("C-c")
        else:
            os.kill(pane.child_pid(), signal.SIGTERM)
        assert_restored(pane)
    finally:
        stop(c, server)


def test_top_starts_without_a_controller_and_finds_it(tmp_path, pane_factory):
    address = f"unix:{tmp_path}/admin.sock"
    pane = pane_factory(top_command(address, tmp_path, "--interval", "0.5"))
    pane.wait_for(
        "not reachable at start",
        lambda s: any("controller not reachable" in line for line in s[:3]),
    )
    c, server = plan_controller(tmp_path)
    try:
        pane.wait_for("the first frame", lambda s: f"epoch {c.epoch}" in header(s))
        pane.keys("q")
        assert_restored(pane)
    finally:
        stop(c, server)


def test_an_unreachable_controller_takes_two_lines_of_the_header_at_most():
    # gRPC's details run to several clauses; the header keeps their first.
    error = (
        "unavailable: failed to connect to all addresses; last error: UNKNOWN: "
        "unix:/run/dsched/admin.sock: connect failed: No such file or directory"
    )
    state = TopState(address="unix:/run/dsched/admin.sock", interval=1.0, error=error)
    lines = [t.plain for t in frame_lines(state, 80)]
    why = [line for line in lines if "not reachable" in line or "retrying" in line]
    assert "failed to connect to all addresses" in " ".join(lines)
    assert "No such file" not in " ".join(lines)
    assert 1 <= len(why) <= 2, lines
    # The whole error stays in the JSON frame.
    assert state.frame()["error"] == error
