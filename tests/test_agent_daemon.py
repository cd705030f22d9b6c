"""Agent configuration and the `dsched-agent` daemon as a real subprocess."""

from __future__ import annotations

import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from agent.config import AgentConfig
from dsched.config import ConfigError, load_config
from dsched.tls import TlsConfig
from tests.test_agent_support import free_port, wait_for

AGENT = [sys.executable, "-m", "agent.daemon"]


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "agent.toml"
    p.write_text(text)
    return p


def test_defaults_are_valid():
    c = load_config(AgentConfig, None)
    assert (c.controller, c.cgroup_root, c.fallback, c.slot_seconds) == (
        "127.0.0.1:7700",
        "dsched",
        "hold",
        10.0,
    )


@pytest.mark.parametrize(
    "text,key",
    [
        ('fallback = "panic"', "fallback"),
        ('cgroup_mode = "v3"', "cgroup_mode"),
        ("slot_seconds = 0", "slot_seconds"),
        ("lease_epochs = 0", "lease_epochs"),
        ("report_buffer = -1", "report_buffer"),
        ("cpu_period_us = 10", "cpu_period_us"),
        ('cgroup_root = "../etc"', "cgroup_root"),
        ('controller = "10.1.2.3:7700"', "controller"),
        ('controller = "nohost"', "controller"),
        ("colour = 1", "colour"),
        ('[tls]\nca = "/nonexistent/ca.pem"', "tls.ca"),
        (
            '[[discovery]]\ncmdline = "java"\nthread_name = "(?P<operator>x)"',
            "discovery[0].thread_name",
        ),
    ],
)
def test_bad_config_names_the_key(tmp_path, text, key):
    with pytest.raises(ConfigError) as info:
        load_config(AgentConfig, _write(tmp_path, text))
    assert info.value.key == key


def test_tls_table_is_checked_as_a_client_and_holds_paths(tmp_path):
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    # An agent may verify the controller without a certificate of its own.
    c = load_config(
        AgentConfig, _write(tmp_path, f'controller = "10.1.2.3:7700"\n[tls]\nca = "{ca}"')
    )
    assert isinstance(c.tls, TlsConfig) and c.tls.enabled
    assert (c.tls.ca, c.tls.cert, c.tls.key) == (ca, None, None)
    for text, key in (
        (f'[tls]\ncert = "{ca}"', "tls.cert"),
        (f'[tls]\ncert = "{ca}"\nkey = "{ca}"', "tls.ca"),
    ):
        with pytest.raises(ConfigError) as info:
            load_config(AgentConfig, _write(tmp_path, text))
        assert info.value.key == key
    # Built in code from the shared type, the same checks apply.
    with pytest.raises(ConfigError) as info:
        AgentConfig(tls=TlsConfig(cert=ca, key=ca)).validate()
    assert info.value.key == "tls.ca"


def test_plaintext_remote_controller_allowed_only_when_asked(tmp_path):
    c = load_config(
        AgentConfig, _write(tmp_path, 'controller = "10.1.2.3:7700"\nallow_plaintext_remote = true')
    )
    assert c.controller == "10.1.2.3:7700"


def test_daemon_bad_config_prints_one_line_and_exits_2(tmp_path):
    done = subprocess.run(
        AGENT + ["--config", str(_write(tmp_path, 'fallback = "panic"'))],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "'fallback'" in lines[0]
    done = subprocess.run(
        AGENT + ["--controller", "nohost"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2 and "--controller" in done.stderr


def test_daemon_serves_metrics_and_stops_cleanly_on_sigterm(tmp_path):
    port = free_port()
    sock = tmp_path / "agent.sock"
    proc = subprocess.Popen(
        AGENT
        + [
            "--dry-run",
            "--metrics",
            f"127.0.0.1:{port}",
            "--socket",
            str(sock),
            "--controller",
            f"127.0.0.1:{free_port()}",
            "--slot-seconds",
            "1",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:

        def scrape() -> str:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1) as r:
                    return r.read().decode()
            except OSError:
                return ""

        assert wait_for(lambda: "dsched_agent_threads_managed" in scrape(), timeout=30)
        text = scrape()
        for name in (
            "dsched_agent_cap_writes_total",
            "dsched_agent_reports_dropped_total",
            "dsched_agent_connected 0.0",
        ):
            assert name in text
        assert sock.is_socket()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
        assert not sock.exists()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
