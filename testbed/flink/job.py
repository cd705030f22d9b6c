"""The DschedWordCount job (``job/DschedWordCount.java``): compiled on demand, cached.

The jar is built with the distribution's own javac classpath (``lib/*``) into
``<cache>/<sha>/job.jar``, where ``<sha>`` covers the source, the connector's
service file and the Flink jars' names: editing the source or changing Flink
rebuilds it, everything else reuses it. Builds go through a temporary directory
and an atomic rename, so concurrent test processes never see half a jar.

Vertices of the running job (chaining off; parallelism from ``flink run -p``)::

    Source: src[1] -> Calc[2] -> GroupAggregate[4] -> lat[5]: Writer

See the Java source for what each does and how latency is measured.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from testbed.flink import install
from testbed.flink.cluster import FlinkCluster

SOURCE = Path(__file__).resolve().parent / "job" / "DschedWordCount.java"
MAIN_CLASS = "dsched.flink.DschedWordCount"
DEFAULT_CACHE = install.DEFAULT_TARGET / "jobs"
# The sink is a table connector; Flink's planner finds its factory through this file.
_SERVICE_PATH = "META-INF/services/org.apache.flink.table.factories.Factory"
_SERVICE_TEXT = f"{MAIN_CLASS}$LatencySinkFactory\n"
# Chained SHA-256 digests per record in the Calc when none is given: read from the
# Java source so there is one definition. 2500 digests are ~170 us of CPU per record
# on this machine (~70 ns each with SHA-NI): one Calc subtask fills a core at ~6k/s.
DEFAULT_ROUNDS = int(re.search(r"DEFAULT_ROUNDS = (\d+);", SOURCE.read_text()).group(1))
# Vertex-name prefixes, in pipeline order (the [n] suffixes are the planner's node ids).
SOURCE_VERTEX = "Source: src"
CALC_VERTEX = "Calc"
AGGREGATE_VERTEX = "GroupAggregate"
SINK_VERTEX = "lat"


class JobBuildError(RuntimeError):
    """javac or jar failed; the message holds the compiler's output."""


def build_job(home: Path | None = None, cache_dir: Path | None = None) -> Path:
    """The path of ``job.jar``, compiling it first if the cache has no current build."""
    home = install.require(home)
    cache_dir = Path(cache_dir) if cache_dir is not None else DEFAULT_CACHE
    libs = sorted((home / "lib").glob("*.jar"))
    digest = hashlib.sha256(SOURCE.read_bytes())
    digest.update(_SERVICE_TEXT.encode())
    digest.update("\n".join(p.name for p in libs).encode())
    out_dir = cache_dir / digest.hexdigest()[:16]
    jar = out_dir / "job.jar"
    if jar.is_file():
        return jar
    cache_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache_dir, prefix=".build-") as tmp:
        classes = Path(tmp) / "classes"
        classes.mkdir()
        _run(["javac", "-cp", f"{home / 'lib'}/*", "-d", str(classes), str(SOURCE)], "javac")
        service = classes / _SERVICE_PATH
        service.parent.mkdir(parents=True)
        service.write_text(_SERVICE_TEXT)
        staged = Path(tmp) / "out"
        staged.mkdir()
        _run(["jar", "cf", str(staged / "job.jar"), "-C", str(classes), "."], "jar")
        try:
            os.rename(staged, out_dir)
        except OSError:
            # Someone else finished the same build first; theirs is identical.
            if not jar.is_file():
                raise
    return jar


def job_args(
    input_dir: Path,
    job_name: str,
    latency_dir: Path | None = None,
    rounds: int | None = None,
) -> list[str]:
    """The job's program arguments (see the Java source's usage line)."""
    args = [str(input_dir), job_name, str(latency_dir) if latency_dir is not None else "-"]
    if rounds is not None:
        if rounds < 1:
            raise ValueError(f"rounds must be >= 1, got {rounds}")
        args.append(str(rounds))
    return args


def submit_wordcount(
    cluster: FlinkCluster,
    input_dir: Path,
    job_name: str,
    *,
    parallelism: int = 2,
    latency_dir: Path | None = None,
    rounds: int | None = None,
) -> str:
    """Build (if needed) and submit DschedWordCount reading ``input_dir``; the job id.

    ``input_dir`` and ``latency_dir`` are created if missing (the filesystem source
    needs its directory to exist when the job starts)."""
    Path(input_dir).mkdir(parents=True, exist_ok=True)
    if latency_dir is not None:
        Path(latency_dir).mkdir(parents=True, exist_ok=True)
    jar = build_job(cluster.home)
    lat = Path(latency_dir).resolve() if latency_dir is not None else None
    args = job_args(Path(input_dir).resolve(), job_name, lat, rounds)
    return cluster.submit(jar, MAIN_CLASS, args, parallelism=parallelism)


def _run(cmd: list[str], what: str) -> None:
    tool = shutil.which(cmd[0])
    if tool is None:
        raise JobBuildError(f"{cmd[0]} not found on PATH: {install.JDK_HINT}")
    result = subprocess.run([tool, *cmd[1:]], capture_output=True, text=True)
    if result.returncode != 0:
        raise JobBuildError(f"{what} failed (exit {result.returncode}):\n{result.stderr.strip()}")
