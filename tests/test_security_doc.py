"""docs/security.md's certificate commands, run as written, give a PKI dsched accepts."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parent.parent / "docs" / "security.md"


def pki_commands() -> str:
    text = DOC.read_text()
    match = re.search(r"<!-- pki-commands:[^>]*-->\s*```sh\n(.*?)```", text, re.S)
    assert match, "docs/security.md lost its pki-commands block"
    return match.group(1)


@pytest.fixture(scope="module")
def doc_pki(tmp_path_factory) -> Path:
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed (Debian package openssl)")
    directory = tmp_path_factory.mktemp("doc-pki")
    subprocess.run(
        ["bash", "-euo", "pipefail", "-c", pki_commands()],
        cwd=directory,
        env={"PATH": "/usr/bin:/bin", "NODES": "node-a node-b", "CONTROLLER": "localhost"},
        check=True,
        capture_output=True,
    )
    return directory


def _openssl(*args: str) -> str:
    return subprocess.run(["openssl", *args], check=True, capture_output=True, text=True).stdout


def test_the_commands_make_every_file(doc_pki):
    for name in ("agents-ca", "admin-ca", "controller", "node-a", "node-b", "admin"):
        assert (doc_pki / f"{name}.pem").is_file(), name
        assert (doc_pki / f"{name}.key").is_file(), name
    for name in ("controller", "node-a", "node-b", "admin"):
        assert (doc_pki / f"{name}.key").stat().st_mode & 0o077 == 0, f"{name}.key is readable"


def test_chains_and_names(doc_pki):
    out = _openssl(
        "verify", "-CAfile", str(doc_pki / "agents-ca.pem"),
        *(str(doc_pki / f"{n}.pem") for n in ("controller", "node-a", "node-b")),
    )  # fmt: skip
    assert out.count(": OK") == 3
    assert ": OK" in _openssl(
        "verify", "-CAfile", str(doc_pki / "admin-ca.pem"), str(doc_pki / "admin.pem")
    )
    # The admin certificate must not pass as an agent's, nor an agent's as the admin's.
    wrong = subprocess.run(
        [
            "openssl",
            "verify",
            "-CAfile",
            str(doc_pki / "agents-ca.pem"),
            str(doc_pki / "admin.pem"),
        ],
        capture_output=True,
        text=True,
    )
    assert wrong.returncode != 0
    node = _openssl(
        "x509", "-in", str(doc_pki / "node-a.pem"), "-noout", "-subject", "-ext", "subjectAltName"
    )
    assert "CN = node-a" in node and "DNS:node-a" in node
    server = _openssl(
        "x509", "-in", str(doc_pki / "controller.pem"), "-noout", "-ext", "subjectAltName"
    )
    assert "DNS:localhost" in server and "IP Address:127.0.0.1" in server


def test_a_cluster_on_the_documented_certificates(doc_pki, tmp_path, capsys):
    """A real agent link and dschedctl, both on the doc's certificates, against the
    real controller: the node's own certificate connects, the admin certificate
    opens the admin door, an agent's certificate does not."""
    import random

    from agent.config import AgentConfig
    from agent.link import ControllerLink
    from agent.node import NodeAgent
    from controller.config import AdminTlsConfig
    from controller.ctl import main as ctl_main
    from dsched.tls import TlsConfig
    from tests.controller_server_support import config, start, stop, wait_until

    pem = doc_pki.joinpath
    cfg = config(
        tmp_path,
        tls=TlsConfig(
            cert=pem("controller.pem"), key=pem("controller.key"), ca=pem("agents-ca.pem")
        ),
        admin_listen="127.0.0.1:0",
        admin_tls=AdminTlsConfig(
            cert=pem("controller.pem"), key=pem("controller.key"), ca=pem("admin-ca.pem")
        ),
    )
    controller, server = start(cfg, loop=False)
    agent = NodeAgent(AgentConfig(node_id="node-a", dry_run=True, slot_seconds=1))
    link = ControllerLink(
        agent,
        f"localhost:{server.port}",
        tls=TlsConfig(cert=pem("node-a.pem"), key=pem("node-a.key"), ca=pem("agents-ca.pem")),
        rng=random.Random(1),
    )
    link.start()
    try:
        wait_until(lambda: "node-a" in controller.cluster.agents, "node-a connected")
        admin_port = server.admin_address.rsplit(":", 1)[1]
        door = ["--address", f"localhost:{admin_port}", "--ca", str(pem("agents-ca.pem"))]
        as_admin = [*door, "--cert", str(pem("admin.pem")), "--key", str(pem("admin.key"))]
        as_agent = [*door, "--cert", str(pem("node-a.pem")), "--key", str(pem("node-a.key"))]
        capsys.readouterr()
        assert ctl_main([*as_agent, "mode", "enforce"]) == 3
        assert controller.mode == "dry-run"
        assert ctl_main([*as_admin, "mode", "enforce"]) == 0
        assert controller.mode == "enforce"
        assert ctl_main([*as_admin, "--json", "status"]) == 0
        assert '"node-a"' in capsys.readouterr().out
    finally:
        link.stop()
        stop(controller, server)


def test_dschedctl_over_the_admin_unix_socket(tmp_path, capsys):
    from controller.ctl import main as ctl_main
    from tests.controller_server_support import config, start, stop

    controller, server = start(config(tmp_path), loop=False)
    try:
        assert server.admin_address == f"unix:{tmp_path}/admin.sock"
        assert (tmp_path / "admin.sock").stat().st_mode & 0o777 == 0o660
        assert ctl_main(["--address", server.admin_address, "mode", "enforce"]) == 0
        assert controller.mode == "enforce"
        # The agents' port is not an admin door.
        assert ctl_main(["--address", f"127.0.0.1:{server.port}", "status"]) == 1
        assert "not an admin door" in capsys.readouterr().err
    finally:
        stop(controller, server)
    assert not (tmp_path / "admin.sock").exists()
