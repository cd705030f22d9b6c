"""Every ``dsched`` command's ``--help`` renders: argparse formats help strings
with ``%``, so a help text that reads "40 % of" fails only when someone asks
for help."""

import pytest

from dsched import cli

_, _, BENCHMARKS = cli._load()
COMMANDS = [[], ["demo"], ["profile"], ["bench"], *(["bench", name] for name in BENCHMARKS)]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c) or "dsched")
def test_help_renders_and_exits_zero(command, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main([*command, "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: dsched"), out[:200]
    # Each option's help text is in it, expanded: no % placeholder left over.
    assert "%(" not in out


def test_live_help_names_every_profile_with_its_rules(capsys):
    from bench.live import PROFILES

    with pytest.raises(SystemExit):
        cli.main(["bench", "live", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    for name in PROFILES:
        assert f"{name}:" in out
    assert "a dead band of 40 % of the cap" in out
