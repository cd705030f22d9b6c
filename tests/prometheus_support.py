"""A real Prometheus server for the tests: Debian's ``prometheus`` and ``promtool``.

`make prometheus` (a prerequisite of `make test`) installs them. The server runs
on loopback with a free port, a temporary storage directory and a generated
configuration (JSON, which Prometheus reads as YAML).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from testbed.live.cluster import free_port

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "deploy" / "prometheus" / "dsched-rules.yml"
RULE_TESTS = sorted((ROOT / "deploy" / "prometheus" / "tests").glob("*.yml"))
EXAMPLE_CONFIG = ROOT / "deploy" / "prometheus" / "prometheus.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "dsched.json"


def tool(name: str) -> str:
    """Path of ``prometheus`` or ``promtool``; skips with the fix when missing."""
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} not installed: run `make prometheus` (Debian's prometheus package)")
    return path


def promtool(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [tool("promtool"), *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )


class PrometheusError(RuntimeError):
    pass


class Prometheus:
    """``prometheus`` as a subprocess, queried through its HTTP API."""

    def __init__(
        self,
        workdir: Path,
        scrape_configs: list[dict[str, Any]],
        rule_files: list[Path] = (),
        interval: str = "1s",
    ):
        self.workdir = Path(workdir)
        self.address = f"127.0.0.1:{free_port()}"
        self.config = {
            "global": {"scrape_interval": interval, "evaluation_interval": interval},
            "rule_files": [str(p) for p in rule_files],
            "scrape_configs": scrape_configs,
        }
        self.proc: subprocess.Popen | None = None
        self.log = self.workdir / "prometheus.log"

    def start(self, timeout: float = 120.0) -> Prometheus:
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "prometheus.yml"
        config.write_text(json.dumps(self.config, indent=1))
        self.proc = subprocess.Popen(
            [
                tool("prometheus"),
                f"--config.file={config}",
                f"--storage.tsdb.path={self.workdir / 'data'}",
                f"--web.listen-address={self.address}",
                "--storage.tsdb.retention.time=1h",
            ],
            stdout=self.log.open("ab"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise PrometheusError(f"prometheus exited: {self.log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"http://{self.address}/-/ready", timeout=2) as r:
                    if r.status == 200:
                        return self
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                raise PrometheusError(f"prometheus not ready: {self.log.read_text()[-3000:]}")
            time.sleep(0.2)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def api(self, path: str, **params: str) -> Any:
        url = f"http://{self.address}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(url, timeout=30) as r:
                body = json.load(r)
        except urllib.error.HTTPError as e:
            raise PrometheusError(f"{path} {params}: {e.read().decode()}") from e
        if body.get("status") != "success":
            raise PrometheusError(f"{path} {params}: {body}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """Instant vector results of ``expr`` now: ``[{"metric": {...}, "value": [t, "v"]}]``."""
        data = self.api("query", query=expr)
        if data["resultType"] != "vector":
            raise PrometheusError(f"{expr}: a {data['resultType']}, not a vector")
        return data["result"]

    def values(self, expr: str) -> list[float]:
        return [float(r["value"][1]) for r in self.query(expr)]

    def __enter__(self) -> Prometheus:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def wait_for(pred, timeout: float, what: str, interval: float = 0.5):
    """Poll ``pred`` until it returns something truthy; fail naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def dashboard_variables(dashboard: dict[str, Any]) -> dict[str, str]:
    """What each dashboard variable stands for in a query: its current value
    (``All`` as the variable's allValue, several values as a regex alternation),
    plus Grafana's interval built-ins."""
    out = {"__rate_interval": "20s", "__interval": "5s", "__range": "5m"}
    for var in dashboard["templating"]["list"]:
        if var["type"] == "datasource":
            continue
        value = var.get("current", {}).get("value")
        values = value if isinstance(value, list) else [value]
        if "$__all" in values:
            out[var["name"]] = var.get("allValue") or ".*"
        else:
            out[var["name"]] = "|".join(str(v) for v in values)
    return out


def substitute(expr: str, variables: dict[str, str]) -> str:
    """``expr`` with ``$name`` and ``${name}`` replaced (longest names first)."""
    for name in sorted(variables, key=len, reverse=True):
        expr = expr.replace("${" + name + "}", variables[name]).replace("$" + name, variables[name])
    return expr


def panel_targets(dashboard: dict[str, Any]) -> list[tuple[str, str, str]]:
    """``(panel title, refId, expr)`` of every query in the dashboard (rows included)."""
    out = []

    def walk(panels):
        for p in panels:
            for t in p.get("targets", []):
                out.append((p["title"], t["refId"], t["expr"]))
            walk(p.get("panels", []))

    walk(dashboard["panels"])
    return out
