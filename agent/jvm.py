"""Full thread names of a JVM, through ``jcmd <pid> Thread.print``.

Linux cuts a thread's ``comm`` at 15 characters, so the names Flink or Storm
give their task threads are only readable from inside the JVM. ``jcmd``
prints every Java thread with ``nid=0x..``, the OS thread id.

``jcmd`` attaches by creating ``.attach_pid<pid>`` and sending the target
SIGQUIT. A JVM answers that by opening its attach socket; any other process
dies of it (SIGQUIT's default action) or ignores it while jcmd waits ten
seconds. :func:`is_jvm` is therefore checked before every attach: nothing but
a process with ``libjvm.so`` mapped is ever signalled.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

# '"name" #12 daemon prio=5 ... nid=0x18d9 ...' (hex before Java 19, decimal after).
_JCMD_THREAD = re.compile(r'^"(?P<name>(?:[^"\\]|\\.)*)".*?\bnid=(?P<nid>0x[0-9a-fA-F]+|\d+)\b')


class JcmdError(RuntimeError):
    """``jcmd`` is missing, timed out, exited with an error, or printed no thread."""


def parse_jcmd_threads(text: str) -> dict[int, str]:
    """TID -> full thread name from ``jcmd <pid> Thread.print`` output."""
    out = {}
    for line in text.splitlines():
        m = _JCMD_THREAD.match(line)
        if m:
            nid = m.group("nid")
            out[int(nid, 16) if nid.startswith("0x") else int(nid)] = m.group("name")
    return out


def find_jcmd() -> str:
    """The ``jcmd`` on PATH, looked up at each call (PATH may change under a daemon's feet
    only in tests, but a JDK installed after the agent started is found too)."""
    path = shutil.which("jcmd")
    if path is None:
        raise JcmdError("jcmd not found on PATH (install a JDK on the node)")
    return path


def is_jvm(proc_root: str | Path, pid: int) -> bool:
    """Whether ``pid`` is a HotSpot JVM (``libjvm.so`` mapped): the only processes jcmd may signal."""
    try:
        with open(f"{proc_root}/{pid}/maps", "rb") as fh:
            for line in fh:
                if line.endswith(b"/libjvm.so\n"):
                    return True
    except OSError:
        return False
    return False


def jcmd_threads(pid: int, timeout: float = 10.0, jcmd: str | None = None) -> dict[int, str]:
    """TID -> full thread name of JVM ``pid``; JcmdError saying why when there is none.

    The caller must have checked :func:`is_jvm` (see the module docstring).
    """
    jcmd = jcmd or find_jcmd()
    try:
        done = subprocess.run(
            [jcmd, str(pid), "Thread.print"],
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        raise JcmdError(f"jcmd {pid} Thread.print took more than {timeout:g} s") from None
    except OSError as exc:
        raise JcmdError(f"cannot run {jcmd}: {exc.strerror or exc}") from None
    if done.returncode != 0:
        # jcmd prints its errors (an attach exception, "No such process") on stdout.
        why = (done.stdout.strip() or done.stderr.strip()).splitlines()
        raise JcmdError(f"jcmd {pid} exited {done.returncode}: {why[0] if why else 'no output'}")
    threads = parse_jcmd_threads(done.stdout)
    if not threads:
        raise JcmdError(f"jcmd {pid} Thread.print listed no thread")
    return threads
