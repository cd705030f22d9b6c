"""dschedctl's way in: settings from flags and its TOML file, and bad settings refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from controller import ctl
from controller.ctl import CtlConfig, main, resolve_config


def _args(argv: list[str]):
    return ctl.build_parser().parse_args(argv)


@pytest.fixture(autouse=True)
def no_user_config(monkeypatch, tmp_path):
    """Keep the user's own dschedctl.toml out of these tests."""
    monkeypatch.delenv("DSCHEDCTL_CONFIG", raising=False)
    monkeypatch.setattr(ctl, "CONFIG_SEARCH", (tmp_path / "absent.toml",))


def test_default_is_the_unix_admin_socket():
    cfg = resolve_config(_args(["status"]))
    assert cfg.address == ctl.DEFAULT_ADMIN_ADDRESS
    assert cfg.address.startswith("unix:")
    assert not cfg.tls.enabled


def test_file_then_flags(tmp_path, pki, monkeypatch):
    conf = tmp_path / "dschedctl.toml"
    conf.write_text(
        f'address = "controller.example:7701"\ntimeout = 9.0\n'
        f'server_name = "dsched-controller"\n'
        f'[tls]\nca = "{pki.ca}"\ncert = "{pki.admin_cert}"\nkey = "{pki.admin_key}"\n'
    )
    cfg = resolve_config(_args(["--config", str(conf), "status"]))
    assert (cfg.address, cfg.timeout, cfg.server_name) == (
        "controller.example:7701",
        9.0,
        "dsched-controller",
    )
    assert cfg.tls.ca == pki.ca and cfg.tls.cert == pki.admin_cert
    # $DSCHEDCTL_CONFIG is read when --config is absent; flags win over the file.
    monkeypatch.setenv("DSCHEDCTL_CONFIG", str(conf))
    cfg = resolve_config(_args(["--address", "127.0.0.1:7801", "--timeout", "2", "status"]))
    assert (cfg.address, cfg.timeout) == ("127.0.0.1:7801", 2.0)
    assert cfg.tls.key == pki.admin_key


@pytest.mark.parametrize(
    "argv, key",
    [
        (["--address", "unix:/run/x.sock", "--ca", "{ca}", "status"], "'tls'"),
        (["--address", "no-port", "status"], "'address'"),
        (["--address", "unix:", "status"], "'address'"),
        (["--address", "h:1", "--ca", "/nonexistent/ca.pem", "status"], "'tls.ca'"),
        (["--address", "h:1", "--cert", "{cert}", "status"], "'tls.cert'"),
        (["--address", "h:1", "--server-name", "x", "status"], "'server_name'"),
        (["--timeout", "0", "status"], "'timeout'"),
    ],
)
def test_bad_settings_exit_2_naming_the_key(argv, key, pki, capsys):
    argv = [a.format(ca=pki.ca, cert=pki.admin_cert) for a in argv]
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert key in capsys.readouterr().err


def test_bad_config_file_exit_2(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text('address = "h:1"\ncolour = "blue"\n')
    with pytest.raises(SystemExit) as exc:
        main(["--config", str(bad), "status"])
    assert exc.value.code == 2
    assert "colour" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["--config", str(tmp_path / "missing.toml"), "status"])
    assert exc.value.code == 2


def test_unreachable_door_exit_3_with_the_reason(tmp_path, capsys):
    assert main(["--address", f"unix:{tmp_path / 'none.sock'}", "--timeout", "2", "status"]) == 3
    err = capsys.readouterr().err
    assert "not reachable" in err and "No such file" in err


def test_ctl_config_defaults_validate():
    CtlConfig().validate()
    assert Path(ctl.DEFAULT_ADMIN_ADDRESS.removeprefix("unix:")).is_absolute()
