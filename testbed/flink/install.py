"""Where the Flink distribution lives, whether this machine can run it, and installing it.

The distribution comes from the PyPI wheels ``apache-flink`` and
``apache-flink-libraries`` (same version), installed from ``lock/flink.txt``
(hashes checked) with ``--no-deps --target``:
their ``pyflink/`` directory holds ``bin/`` (jobmanager.sh, taskmanager.sh, flink)
and ``lib/*.jar``, i.e. a complete Flink. ``--no-deps`` matters: apache-flink's
Python dependencies pin an old grpcio that would break dsched, and the testbed
needs none of them (it drives Flink through its scripts and REST API only).

Lookup order: ``$DSCHED_FLINK_HOME`` (the directory holding ``bin/`` and ``lib/``),
else ``<repo>/.flink/pyflink`` (what ``make flink`` installs).

``python -m testbed.flink.install [--target DIR] [--force]`` installs with the
current interpreter's pip; it does nothing when the right version is already there.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

FLINK_VERSION = "2.3.0"
WHEELS = (f"apache-flink=={FLINK_VERSION}", f"apache-flink-libraries=={FLINK_VERSION}")
REPO_ROOT = Path(__file__).resolve().parents[2]
# WHEELS with their hashes (`make lock` writes it from lock/flink.in).
LOCK = REPO_ROOT / "lock" / "flink.txt"
DEFAULT_TARGET = REPO_ROOT / ".flink"
# Written last by both `make flink` and install(): its presence means "complete".
STAMP_NAME = ".installed"
HOME_ENV = "DSCHED_FLINK_HOME"
JAVA_TOOLS = ("java", "javac", "jar", "jcmd")
INSTALL_HINT = "run `make flink` (installs the Flink wheels into .flink/ and a JDK 17 if missing)"
JDK_HINT = "install a JDK 17: `apt-get install -y openjdk-17-jdk-headless` (or `make flink`)"


class FlinkUnavailable(RuntimeError):
    """Flink or the JDK tools it needs are missing; the message says what and how to fix it."""


def flink_home() -> Path:
    """The Flink distribution directory (holding ``bin/`` and ``lib/``); may not exist."""
    env = os.environ.get(HOME_ENV)
    if env:
        return Path(env).expanduser().resolve()
    return DEFAULT_TARGET / "pyflink"


def missing(home: Path | None = None) -> str | None:
    """None when Flink at ``home`` (default :func:`flink_home`) and java, javac, jar and
    jcmd are usable, else one message naming everything missing and how to install it."""
    home = flink_home() if home is None else Path(home)
    problems: list[str] = []
    wanted = ["bin/jobmanager.sh", "bin/taskmanager.sh", "bin/flink"]
    absent = [name for name in wanted if not (home / name).is_file()]
    if not any((home / "lib").glob("flink-dist-*.jar")):
        absent.append("lib/flink-dist-*.jar")
    if absent:
        where = f"${HOME_ENV}={home}" if os.environ.get(HOME_ENV) else str(home)
        problems.append(
            f"Flink not installed: {INSTALL_HINT} (nothing usable at {where}: "
            f"missing {', '.join(absent)})"
        )
    tools = [t for t in JAVA_TOOLS if shutil.which(t) is None]
    if tools:
        problems.append(f"{', '.join(tools)} not found on PATH: {JDK_HINT}")
    return "; ".join(problems) or None


def require(home: Path | None = None) -> Path:
    """The Flink home, or :class:`FlinkUnavailable` with what is missing and the fix."""
    why = missing(home)
    if why is not None:
        raise FlinkUnavailable(why)
    return flink_home() if home is None else Path(home)


def installed_version(target: Path = DEFAULT_TARGET) -> str | None:
    """The apache-flink version pip put into ``target`` (from its dist-info), if any."""
    found = sorted(target.glob("apache_flink-*.dist-info"))
    if not found:
        return None
    return found[-1].name.removeprefix("apache_flink-").removesuffix(".dist-info")


def install(target: Path = DEFAULT_TARGET, *, force: bool = False) -> Path:
    """Install the two wheels into ``target`` with this interpreter's pip; idempotent.

    Returns the Flink home (``target/pyflink``). The JDK is not installed here (that
    needs root and apt; ``make flink`` does it): a missing tool raises
    :class:`FlinkUnavailable` after the wheels are in place.
    """
    target = Path(target)
    home = target / "pyflink"
    stamp = target / STAMP_NAME
    complete = stamp.exists() and installed_version(target) == FLINK_VERSION
    if force or not complete:
        target.mkdir(parents=True, exist_ok=True)
        stamp.unlink(missing_ok=True)
        # --upgrade: replace a partial or older pyflink/ instead of skipping it.
        cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--upgrade"]
        cmd += ["--require-hashes", "--target", str(target), "-r", str(LOCK)]
        result = subprocess.run(cmd, capture_output=True, text=True)
        if result.returncode != 0:
            raise FlinkUnavailable(
                f"pip install of {' '.join(WHEELS)} into {target} failed "
                f"(exit {result.returncode}):\n{result.stderr.strip()[-2000:]}"
            )
        stamp.touch()
    return require(home)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m testbed.flink.install",
        description=f"Install Flink {FLINK_VERSION} from PyPI (no dependencies) for the testbed.",
    )
    parser.add_argument("--target", type=Path, default=DEFAULT_TARGET, help="default: %(default)s")
    parser.add_argument("--force", action="store_true", help="reinstall even if present")
    args = parser.parse_args(argv)
    try:
        home = install(args.target, force=args.force)
    except FlinkUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"Flink {FLINK_VERSION} ready at {home}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
